//! Kills what tests left running when their own process died without cleaning up (see
//! `tether_tests::reap`), and says so: run by `scripts/test.sh` before and after the tests.
//! With directories as arguments, only those. Exits 1 when a process would not die.
// The test crate is exempt from the length rule: a scenario reads top to bottom.
#![allow(clippy::too_many_lines)]

use tether_tests::reap;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // Given directories: only those (a test reaps its own, not a concurrent test's).
    let only: Vec<std::path::PathBuf> = std::env::args_os().skip(1).map(Into::into).collect();
    let mut stuck = false;
    let orphans = reap::orphaned(&std::env::temp_dir());
    for dir in orphans.into_iter().filter(|dir| only.is_empty() || only.contains(dir)) {
        let reaped = reap::reap(&dir).await;
        println!(
            "reap-orphans: a test process died without cleaning up {}: {} process(es) killed, {} container(s) removed",
            dir.display(),
            reaped.killed.len(),
            reaped.containers
        );
        if !reaped.survivors.is_empty() {
            eprintln!("reap-orphans: still running after SIGKILL: {:?}", reaped.survivors);
            stuck = true;
        }
    }
    if stuck {
        std::process::exit(1);
    }
}
