//! Kills what tests left running when their own process died without cleaning up (see
//! `tether_tests::reap`), and says so: run by `scripts/test.sh` before and after the tests.
//! Exits 1 when a process would not die.

use tether_tests::reap;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let tmp = std::env::temp_dir();
    let mut stuck = false;
    for dir in reap::orphaned(&tmp) {
        let reaped = reap::reap(&dir).await;
        println!(
            "reap-orphans: a test process died without cleaning up {}: {} process(es) killed",
            dir.display(),
            reaped.killed.len()
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
