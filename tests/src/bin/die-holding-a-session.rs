//! A fixture for the reaper's test (`tests/it/reaping.rs`): a process that starts a daemon
//! through the test harness, opens a session (its sidecar and agent running; with `docker`,
//! in a container, whose image it names), names the daemon's root and aborts, as a test
//! that crashes does: no `Drop` runs.
// The test crate is exempt from the length rule: a scenario reads top to bottom.
#![allow(clippy::too_many_lines)]

use tether_tests::daemon::Daemon;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (daemon, profile) = if std::env::args().nth(1).as_deref() == Some("docker") {
        let (_, daemon, cleanup) = tether_tests::docker::setup().await.expect("a Docker engine");
        println!("IMAGE {}", cleanup.image.clone().unwrap_or_default());
        // Not dropped: the abort below leaves the container to the reaper.
        std::mem::forget(cleanup);
        (daemon, "mock-docker")
    } else {
        (Daemon::start(&[]).await, "mock")
    };
    let api = daemon.api().await;
    api.ready_session(profile, &daemon.workspace("orphan")).await;
    println!("ROOT {}", daemon.root.path().display());
    std::process::abort();
}
