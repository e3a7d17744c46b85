//! A test process that dies without cleaning up (an abort: no `Drop` runs) leaves its
//! daemon, the session's sidecar and its agent running; `reap-orphans`, which
//! `scripts/test.sh` runs before and after the tests, finds them by the harness's mark on
//! the daemon's root, kills them and removes the root.

use tether_tests::daemon::Daemon;
use tether_tests::{reap, within, workspace_bin};
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::test]
async fn a_test_that_dies_leaves_nothing_running_after_the_reaper() {
    // A process of the harness that aborts holding a daemon with a live session.
    let mut child = tokio::process::Command::new(workspace_bin("die-holding-a-session"))
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the fixture runs");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let root = loop {
        match within("the dying process's root", lines.next_line()).await.unwrap() {
            Some(line) if line.starts_with("ROOT ") => break std::path::PathBuf::from(&line[5..]),
            Some(_) => continue,
            None => panic!("the dying process ended before it named its root"),
        }
    };
    let status = within("the dying process to die", child.wait()).await.unwrap();
    assert!(!status.success(), "it aborted: {status:?}");

    let left = Daemon::processes_mentioning(&root);
    assert!(left.len() >= 3, "the daemon, the sidecar and the agent outlived it: {left:?}");
    assert!(reap::orphaned(&std::env::temp_dir()).contains(&root), "its root is orphaned");

    let reaper = tokio::process::Command::new(workspace_bin("reap-orphans")).output();
    let out = within("reap-orphans", reaper).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let said = format!("died without cleaning up {}: ", root.display());
    assert!(stdout.contains(&said), "{stdout}");
    assert_eq!(Daemon::processes_mentioning(&root), Vec::<u32>::new());
    assert!(!root.exists(), "the root is removed");
}
