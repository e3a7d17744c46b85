//! A test process that dies without cleaning up (an abort: no `Drop` runs) leaves its
//! daemon, the session's sidecar and its agent (or its container) running; `reap-orphans`,
//! which `scripts/test.sh` runs before and after the tests, finds them by the harness's
//! mark on the daemon's root, kills them, removes the container and the root.

use std::collections::HashMap;
use std::path::PathBuf;

use bollard::query_parameters::ListContainersOptions;
use tether_tests::daemon::Daemon;
use tether_tests::docker::{Cleanup, engine};
use tether_tests::{reap, within, workspace_bin};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Runs the fixture that aborts holding a daemon with a live session (`args`: `docker` for
/// one in a container); its lines, and the daemon's root once it has died.
async fn die_holding_a_session(args: &[&str]) -> (Vec<String>, PathBuf) {
    let mut child = tokio::process::Command::new(workspace_bin("die-holding-a-session"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the fixture runs");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut said = Vec::new();
    let root = loop {
        match within("the dying process's root", lines.next_line()).await.unwrap() {
            Some(line) if line.starts_with("ROOT ") => break PathBuf::from(&line[5..]),
            Some(line) => said.push(line),
            None => panic!("the dying process ended before it named its root: {said:?}"),
        }
    };
    let status = within("the dying process to die", child.wait()).await.unwrap();
    assert!(!status.success(), "it aborted: {status:?}");
    assert!(reap::orphaned(&std::env::temp_dir()).contains(&root), "its root is orphaned");
    (said, root)
}

/// Runs `reap-orphans` on `root` (a concurrent test's orphan is that test's to reap); what
/// it printed about it.
async fn reap_orphans(root: &std::path::Path) -> String {
    let reaper = tokio::process::Command::new(workspace_bin("reap-orphans")).arg(root).output();
    let out = within("reap-orphans", reaper).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let said = format!("died without cleaning up {}: ", root.display());
    let line = stdout.lines().find(|line| line.contains(&said));
    line.unwrap_or_else(|| panic!("{stdout}")).to_owned()
}

#[tokio::test]
async fn a_test_that_dies_leaves_nothing_running_after_the_reaper() {
    let (_, root) = die_holding_a_session(&[]).await;
    let left = Daemon::processes_mentioning(&root);
    assert!(left.len() >= 3, "the daemon, the sidecar and the agent outlived it: {left:?}");

    let line = reap_orphans(&root).await;
    assert!(line.ends_with(&format!("{} process(es) killed, 0 container(s) removed", left.len())));
    assert_eq!(Daemon::processes_mentioning(&root), Vec::<u32>::new());
    assert!(!root.exists(), "the root is removed");
}

#[tokio::test]
async fn a_test_that_dies_leaves_no_container_after_the_reaper() {
    let Some(docker) = engine().await else { return };
    let (said, root) = die_holding_a_session(&["docker"]).await;
    let install_id = std::fs::read_to_string(root.join("tether/install_id")).unwrap();
    let label = format!("tether.install_id={}", install_id.trim());
    let image = said.iter().find_map(|line| line.strip_prefix("IMAGE ")).map(str::to_owned);
    // The test image goes when this test ends (whatever the reaper did).
    let _cleanup = Cleanup { label: label.clone(), image };
    let containers = || {
        let filters = HashMap::from([("label".to_owned(), vec![label.clone()])]);
        let options =
            ListContainersOptions { all: true, filters: Some(filters), ..Default::default() };
        docker.list_containers(Some(options))
    };
    assert_eq!(containers().await.unwrap().len(), 1, "the session's container outlived it");
    assert!(!Daemon::processes_mentioning(&root).is_empty(), "and the daemon");

    let line = reap_orphans(&root).await;
    assert!(line.ends_with(" 1 container(s) removed"), "{line}");
    assert_eq!(containers().await.unwrap().len(), 0);
    assert_eq!(Daemon::processes_mentioning(&root), Vec::<u32>::new());
    assert!(!root.exists(), "the root is removed");
}
