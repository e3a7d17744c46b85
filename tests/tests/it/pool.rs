//! A profile's `[pool] warm = N` keeps N agents started and past
//! `initialize`; a create (and a resume) takes one and only opens its ACP session, in its
//! own workspace; the pool refills, drains on a profile change and at shutdown, and a kill
//! with a full pool leaks nothing (the next start removes what was left, then refills).

use std::path::Path;

use protocol::api::{EventKind, SessionState};
use tether_tests::daemon::{Api, Daemon, await_log, progress_steps, until};
use tether_tests::within;

use crate::metrics::{scrape, value};

/// The built-in mock profile with a pool of `warm`, and `env` lines.
fn warm_profile(warm: u32, env: &str) -> String {
    format!(
        "id = \"warm\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{{home}}/.mock-agent\"]\nprotocol = \"acp\"\n\
         [env]\n{env}\n[session]\nagent_state_dirs = [\".mock-agent\"]\n[pool]\nwarm = {warm}\n"
    )
}

const LOG: (&str, &str) = ("TETHER_LOG", "warn,supervisor::pool=info");

async fn pooled_daemon(warm: u32) -> (Daemon, tokio::sync::broadcast::Receiver<String>) {
    let profile = warm_profile(warm, "");
    let daemon = Daemon::start_with_env(&[], &[("warm.toml", &profile)], &[LOG]).await;
    let lines = daemon.log_from_start();
    (daemon, lines)
}

/// Waits for every pid in `pids` to be gone.
async fn all_gone(pids: &[u32]) {
    for pid in pids {
        if let Ok(pidfd) = agentctl::process::PidFd::open(*pid) {
            within("a warm sidecar to exit", pidfd.exited()).await.unwrap();
        }
    }
}

/// The launch steps a session's creation went through.
async fn steps(api: &Api, session: &str) -> Vec<String> {
    let mut events = api.subscribe(session, 0).await;
    let seen = until(&mut events, |e| {
        matches!(e.kind, EventKind::State { state: SessionState::WaitingForInput, .. })
    })
    .await;
    progress_steps(&seen)
}

/// A create takes a warm agent: no `initialize` of its own, the agent's files land in the
/// session's workspace (its `fs/*` roots were bound to it), not in the pool's directory;
/// the pool refills; a resume after the agent died takes the next warm one and the agent
/// remembers (its state is the user's, not the pool's).
#[tokio::test]
async fn a_create_takes_a_warm_agent_and_the_pool_refills() {
    let (daemon, mut lines) = pooled_daemon(2).await;
    await_log(&mut lines, "is ready (2 of 2)").await;
    let warm = daemon.pool_sidecars();
    assert_eq!(warm.len(), 2, "{warm:?}");
    let before = scrape(&daemon, &[]).await;
    assert_eq!(value(&before, "tether_pool_ready{profile=\"warm\"}"), 2.0);
    let api = daemon.api().await;
    let workspace = daemon.workspace("w");
    let session = api.ready_session("warm", &workspace).await;
    let steps = steps(&api, &session).await;
    assert!(steps.iter().any(|s| s.contains("warm: the agent was started ahead")), "{steps:?}");
    let sidecar = daemon.agentctl_pid(&session);
    assert!(warm.contains(&sidecar), "the session runs in a warm sidecar: {sidecar} of {warm:?}");
    let file = workspace.join("out.txt");
    let reply = api.ask(&session, &format!("/write {} written", file.display())).await;
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "written", "{reply}");
    let pool_dir = daemon.claimed_pool_dirs(&session)[0].parent().unwrap().join("work");
    let outside = api.ask(&session, &format!("/write {} no", pool_dir.join("x").display())).await;
    assert!(!pool_dir.join("x").exists(), "the pool's directory is not the session's: {outside}");
    // Refilled: two ready again, one claimed.
    await_log(&mut lines, "is ready (2 of 2)").await;
    let after = scrape(&daemon, &[]).await;
    assert_eq!(value(&after, "tether_pool_takes_total{outcome=\"claimed\"}"), 1.0);
    // The agent dies; the resume takes a warm agent too, restoring natively.
    tether_tests::daemon::kill_sidecar(&daemon, &api, &session).await;
    let resumed = api.resume(&session).await.unwrap();
    assert_eq!(resumed.outcome, protocol::api::ResumeOutcome::NativeLoad, "{resumed:?}");
    let reply = api.ask(&session, "still there?").await;
    assert!(reply.contains("remembered 4 earlier messages"), "{reply}");
    let scraped = scrape(&daemon, &[]).await;
    assert_eq!(value(&scraped, "tether_pool_takes_total{outcome=\"claimed\"}"), 2.0);
    assert_eq!(daemon.sidecars(&session).len(), 1, "one sidecar for the session");
}

/// A profile change drains the pool (its warm agents were launched the old way) and
/// refills it the new way; a profile without a pool never takes a warm agent.
#[tokio::test]
async fn a_profile_change_drains_the_pool_and_other_profiles_do_not_take_from_it() {
    let (daemon, mut lines) = pooled_daemon(1).await;
    await_log(&mut lines, "is ready (1 of 1)").await;
    let old = daemon.pool_sidecars();
    let api = daemon.api().await;
    let other = api.ready_session("mock", &daemon.workspace("other")).await;
    assert!(daemon.claimed_pool_dirs(&other).is_empty(), "a profile without a pool");
    assert_eq!(daemon.pool_sidecars(), old, "the warm agent is still there");
    let profiles = daemon.root.path().join("tether/profiles");
    std::fs::write(profiles.join("warm.toml"), warm_profile(1, "CHANGED = \"1\"")).unwrap();
    all_gone(&old).await;
    await_log(&mut lines, "is ready (1 of 1)").await;
    let new = daemon.pool_sidecars();
    assert_eq!(new.len(), 1);
    assert!(!old.contains(&new[0]), "{old:?} {new:?}");
    let session = api.ready_session("warm", &daemon.workspace("w")).await;
    assert_eq!(daemon.agentctl_pid(&session), new[0], "the new warm agent is taken");
    // Pooling off: the pool empties.
    std::fs::write(profiles.join("warm.toml"), warm_profile(0, "")).unwrap();
    let left: Vec<u32> = daemon.pool_sidecars().into_iter().filter(|pid| *pid != new[0]).collect();
    all_gone(&left).await;
}

/// SIGTERM stops every warm agent; after a SIGKILL with a full pool, the next start kills
/// what was left and removes its directories before refilling — nothing leaks.
#[tokio::test]
async fn warm_agents_stop_at_shutdown_and_a_kill_leaks_none() {
    let (mut daemon, mut lines) = pooled_daemon(2).await;
    await_log(&mut lines, "is ready (2 of 2)").await;
    let warm = daemon.pool_sidecars();
    daemon.terminate().await;
    all_gone(&warm).await;
    assert!(
        entries(&daemon.root.path().join("tether/pool")).is_empty(),
        "the pool's directories went"
    );
    daemon.restart().await;
    await_log(&mut lines, "is ready (2 of 2)").await;
    let left = daemon.pool_sidecars();
    assert_eq!(left.len(), 2);
    daemon.kill().await;
    assert_eq!(daemon.pool_sidecars(), left, "a kill leaves them running");
    daemon.restart().await;
    all_gone(&left).await;
    await_log(&mut lines, "is ready (2 of 2)").await;
    assert_eq!(entries(&daemon.root.path().join("tether/pool")).len(), 2, "only the new ones");
    let api = daemon.api().await;
    let session = api.ready_session("warm", &daemon.workspace("w")).await;
    assert!(api.ask(&session, "hello").await.contains("hello"));
}

fn entries(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default()
}

/// A warm agent that never answers `initialize` is said in the daemon's log with what it
/// printed (its stderr), as a session's launch is — not just that it timed out.
#[tokio::test]
async fn a_warm_agent_that_never_starts_is_logged_with_what_it_printed() {
    let profile = "id = \"warm\"\ncommand = [\"mock-agent\", \"--stderr-at-start\", \"3\", \"--hang-on\", \"initialize\"]\nprotocol = \"acp\"\n[process]\ninit_timeout_ms = 1500\n[pool]\nwarm = 1\n";
    let daemon = Daemon::start_with_env(&[], &[("warm.toml", profile)], &[LOG]).await;
    let mut lines = daemon.log_from_start();
    let line = await_log(&mut lines, "cannot start a warm agent").await;
    assert!(line.contains("did not answer initialize within 1500 ms"), "{line}");
    assert!(line.contains("not answering initialize as configured"), "the agent's stderr: {line}");
}
