//! A fixture for the reaper's test (`tests/it/reaping.rs`): a process that starts a daemon
//! through the test harness, opens a session (its sidecar and agent running), names the
//! daemon's root and aborts, as a test that crashes does: no `Drop` runs.

use tether_tests::daemon::Daemon;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    api.ready_session("mock", &daemon.workspace("orphan")).await;
    println!("ROOT {}", daemon.root.path().display());
    std::process::abort();
}
