//! Retention: `sessions.cleanup` (CLI `sessions cleanup`) removes exactly the
//! sessions its filters select — rows, history, event logs, spools, worktrees (containers:
//! `docker_runtime.rs`) — never a live one and never uncommitted work without force; the
//! daemon's config file carries an automatic policy, and a bad config file is refused with
//! a located error.

use std::path::PathBuf;

use protocol::api::{ApiClient, CleanupResult, SessionState};
use protocol::errors::ErrorKind;
use tether_tests::daemon::{Api, Daemon, ok, settled};
use tether_tests::{git, git_repository};

const DAY_MS: i64 = 86_400_000;

/// Makes sessions look untouched for `days` (their last change moved back), through the
/// database file the daemon uses, as an operator's clock would.
fn age(daemon: &Daemon, sessions: &[&str], days: i64) {
    let db = rusqlite::Connection::open(daemon.root.path().join("tether/state.db")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
            as i64;
    for session in sessions {
        let changed = db
            .execute(
                "UPDATE task_sessions SET updated_at = ?1 WHERE id = ?2",
                rusqlite::params![now - days * DAY_MS, session],
            )
            .unwrap();
        assert_eq!(changed, 1);
    }
}

async fn cleanup(
    api: &Api,
    max_age_days: u32,
    states: Option<Vec<SessionState>>,
    keep_completed: bool,
    dry_run: bool,
    force: bool,
) -> CleanupResult {
    let call =
        api.typed().cleanup(max_age_days, states, Some(keep_completed), Some(dry_run), Some(force));
    ok("sessions.cleanup", call).await
}

fn removed(result: &CleanupResult) -> Vec<String> {
    let mut ids: Vec<String> = result.removed.iter().map(|s| s.session_id.clone()).collect();
    ids.sort();
    ids
}

fn sorted(ids: &[&str]) -> Vec<String> {
    let mut ids: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
    ids.sort();
    ids
}

async fn exists(api: &Api, session: &str) -> bool {
    match tether_tests::daemon::call(
        "task.session.status",
        api.typed().session_status(session.to_owned()),
    )
    .await
    {
        Ok(_) => true,
        Err(err) if err.kind == ErrorKind::NotFound => false,
        Err(err) => panic!("{err:?}"),
    }
}

/// Each filter removes exactly what it says, with the session's files; a dry run removes
/// nothing; live sessions and uncommitted work are kept, saying why.
#[tokio::test]
async fn cleanup_with_each_filter_removes_exactly_what_it_says() {
    let flag = tempfile::NamedTempFile::new().unwrap();
    let flaky = tether_tests::daemon::fail_while_profile("flaky", flag.path());
    let daemon = Daemon::start_with_profiles(&[], &[("flaky.toml", &flaky)]).await;
    let api = daemon.api().await;
    let ready = |name: &str| {
        let workspace = daemon.workspace(name);
        let api = &api;
        async move {
            let session = api.ready_session("mock", &workspace).await;
            api.ask(&session, "leave something in the history").await;
            session
        }
    };
    let completed_old = ready("completed-old").await;
    let completed_new = ready("completed-new").await;
    let cancelled_old = ready("cancelled-old").await;
    let paused_old = ready("paused-old").await;
    let live_old = ready("live-old").await;
    for session in [&completed_old, &completed_new] {
        ok("stop", api.typed().session_stop(session.clone())).await;
    }
    for session in [&cancelled_old, &paused_old] {
        ok("pause", api.typed().session_pause(session.clone(), None, None)).await;
    }
    ok("cancel", api.typed().session_cancel(cancelled_old.clone())).await;
    let failed_old = api.create_session("flaky", &daemon.workspace("failed-old")).await.unwrap();
    let (state, _) = settled(&mut api.subscribe(&failed_old, 0).await).await;
    assert_eq!(state, SessionState::Failed);
    // A worktree session with uncommitted work, ended.
    let repo = daemon.workspace("repo");
    git_repository(&repo).await;
    let task = ok("task.create", api.typed().task_create("dirty".into(), None)).await.id;
    let dirty_old = api.create_worktree(&task, "mock", &repo, None).await.unwrap().id;
    settled(&mut api.subscribe(&dirty_old, 0).await).await;
    let dirty_tree = PathBuf::from(api.status(&dirty_old).await.worktree_path.unwrap());
    std::fs::write(dirty_tree.join("draft.txt"), "unsaved").unwrap();
    ok("stop", api.typed().session_stop(dirty_old.clone())).await;
    let old = [&completed_old, &cancelled_old, &paused_old, &live_old, &failed_old, &dirty_old];
    age(&daemon, &old.map(String::as_str), 10);
    assert_eq!(api.status(&cancelled_old).await.state, SessionState::Cancelled);
    assert_eq!(api.status(&paused_old).await.state, SessionState::Paused);

    // A dry run names what would go, and removes nothing.
    let dry = cleanup(&api, 5, None, false, true, false).await;
    assert!(dry.dry_run);
    assert_eq!(
        removed(&dry),
        sorted(&[&completed_old, &cancelled_old, &paused_old, &failed_old]),
        "{dry:?}"
    );
    let kept: Vec<(&str, &str)> =
        dry.kept.iter().map(|k| (k.session_id.as_str(), k.reason.as_str())).collect();
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert!(kept.iter().any(|(id, why)| *id == live_old && why.starts_with("live")), "{kept:?}");
    assert!(
        kept.iter().any(|(id, why)| *id == dirty_old && why.contains("uncommitted")),
        "{kept:?}"
    );
    let completed = dry.removed.iter().find(|s| s.session_id == completed_old).unwrap();
    assert!(completed.resources.contains(&"history".to_owned()), "{completed:?}");
    for session in old {
        assert!(exists(&api, session).await, "a dry run removes nothing");
        assert!(daemon.session_dir(session).exists());
    }

    // Only FAILED.
    let failed = cleanup(&api, 5, Some(vec![SessionState::Failed]), false, false, false).await;
    assert_eq!(removed(&failed), sorted(&[&failed_old]));
    assert!(!exists(&api, &failed_old).await && !daemon.session_dir(&failed_old).exists());

    // Sparing COMPLETED: the cancelled and the paused go.
    let spared = cleanup(&api, 5, None, true, false, false).await;
    assert_eq!(removed(&spared), sorted(&[&cancelled_old, &paused_old]), "{spared:?}");
    for session in [&cancelled_old, &paused_old] {
        assert!(!exists(&api, session).await && !daemon.session_dir(session).exists());
    }

    // By age alone: the old completed one; the young one, the live one and the worktree
    // with uncommitted work stay.
    let aged = cleanup(&api, 5, None, false, false, false).await;
    assert_eq!(removed(&aged), sorted(&[&completed_old]), "{aged:?}");
    assert!(!exists(&api, &completed_old).await);
    assert!(!daemon.session_dir(&completed_old).exists(), "history, events and spool went");
    assert!(exists(&api, &completed_new).await && exists(&api, &dirty_old).await);
    assert!(dirty_tree.join("draft.txt").exists(), "uncommitted work is never removed");
    assert!(api.ask(&live_old, "still here?").await.contains("still here?"), "live untouched");

    // Forced: the worktree with uncommitted work goes too (its branch stays).
    let forced = cleanup(&api, 5, None, false, false, true).await;
    assert_eq!(removed(&forced), sorted(&[&dirty_old]), "{forced:?}");
    assert!(forced.removed[0].resources.contains(&"worktree".to_owned()), "{forced:?}");
    assert!(!dirty_tree.exists());
    assert_eq!(git(&repo, &["branch", "--list", "tether/*"]).await.lines().count(), 1);

    // Any age, one state: the young completed session.
    let young = cleanup(&api, 0, Some(vec![SessionState::Completed]), false, false, false).await;
    assert_eq!(removed(&young), sorted(&[&completed_new]));
    assert!(exists(&api, &live_old).await);
}

/// The CLI prints what went and what was kept, and why.
#[tokio::test]
async fn the_cli_reports_what_cleanup_removed_and_kept() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let done = api.ready_session("mock", &daemon.workspace("done")).await;
    let live = api.ready_session("mock", &daemon.workspace("live")).await;
    ok("stop", api.typed().session_stop(done.clone())).await;
    let (code, out, err) =
        daemon.cli(&["sessions", "cleanup", "--max-age-days", "0", "--dry-run"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("would remove {done} COMPLETED")), "{out}");
    assert!(out.contains(&format!("kept {live} WAITING_FOR_INPUT: live")), "{out}");
    assert!(exists(&api, &done).await);
    let (code, out, _) =
        daemon.cli(&["sessions", "cleanup", "--max-age-days", "0", "--state", "COMPLETED"]).await;
    assert_eq!(code, 0);
    assert!(out.contains(&format!("removed {done} COMPLETED (with its")), "{out}");
    assert!(out.trim_end().ends_with("removed 1 session(s), kept 0"), "{out}");
    assert!(!exists(&api, &done).await && exists(&api, &live).await);
    let (code, _, err) =
        daemon.cli(&["sessions", "cleanup", "--max-age-days", "0", "--state", "DONE"]).await;
    assert_eq!(code, 2, "a bad state is a usage error: {err}");
}

/// `supervisor serve` on the daemon's data directory (the test's daemon stopped), with
/// `args`; killed if the test drops it.
fn serve(daemon: &Daemon, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(tether_tests::workspace_bin("supervisor"));
    command
        .arg("serve")
        .args(args)
        .arg("--home")
        .arg(daemon.root.path().join("tether"))
        .env("HOME", daemon.root.path())
        .env("TETHER_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    command
}

/// `[retention]` in `$TETHER_HOME/config.toml` runs when the daemon starts (before it
/// serves) and then on its interval; a config file that does not validate stops `serve`
/// with the file, line, column and field.
#[tokio::test]
async fn the_config_files_retention_policy_applies_and_a_bad_file_is_located() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let done = api.ready_session("mock", &daemon.workspace("done")).await;
    let failed_like = api.ready_session("mock", &daemon.workspace("paused")).await;
    ok("stop", api.typed().session_stop(done.clone())).await;
    ok("pause", api.typed().session_pause(failed_like.clone(), None, None)).await;
    drop(api);
    daemon.terminate().await;
    let config = daemon.root.path().join("tether/config.toml");
    std::fs::write(&config, "[retention]\nmax_age_days = 0\nstates = [\"COMPLETED\"]\n").unwrap();
    daemon.restart().await;
    let api = daemon.api().await;
    assert!(!exists(&api, &done).await, "removed before the daemon served");
    assert!(!daemon.session_dir(&done).exists());
    assert!(exists(&api, &failed_like).await, "another state is kept");
    drop(api);
    daemon.terminate().await;

    std::fs::write(&config, "# the policy\n[retention]\nmax_age_days = \"ten\"\n").unwrap();
    let output = serve(&daemon, &["--listen", "127.0.0.1:0"]).output().await.unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let located = format!("{}:3:16: retention.max_age_days:", config.display());
    assert!(stderr.contains(&located), "{stderr}");
    std::fs::write(&config, "listen = \"127.0.0.1:0\"\nunknown_knob = 1\n").unwrap();
    let output = serve(&daemon, &[]).output().await.unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(":2:1: unknown_knob: unknown field"), "{stderr}");
    // Fixed, the file's settings apply where no flag overrides them: its listen address.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    std::fs::write(&config, format!("listen = \"127.0.0.1:{port}\"\n")).unwrap();
    let mut serve = serve(&daemon, &[]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let stdout = serve.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let line = tether_tests::within("the serving line", lines.next_line()).await.unwrap().unwrap();
    assert!(line.starts_with(&format!("tether serving on ws://127.0.0.1:{port} ")), "{line}");
    let api =
        tether_tests::daemon::Api::connect(&format!("ws://127.0.0.1:{port}"), &[]).await.unwrap();
    assert!(exists(&api, &failed_like).await);
    drop(api);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(serve.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(serve.wait().await.unwrap().success());
}
