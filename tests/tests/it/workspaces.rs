//! Issue 16 (part), workspaces: a workspace directory is held by at most one live session
//! unless the caller says `shared: true`; the second gets `conflict` naming the holder.

use protocol::api::ApiClient;
use protocol::errors::ErrorKind;
use tether_tests::daemon::{Api, ApiError, Daemon, call, ok};

async fn create(
    api: &Api,
    task: &str,
    workspace: &std::path::Path,
    shared: Option<bool>,
) -> Result<String, ApiError> {
    let create = api.typed().session_create(
        task.to_owned(),
        "mock".into(),
        Some(workspace.to_str().unwrap().to_owned()),
        None,
        None,
        shared,
        None,
        None,
    );
    call("task.session.create", create).await.map(|row| row.id)
}

#[tokio::test]
async fn a_held_workspace_is_refused_naming_its_holder_unless_shared() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let task = ok("task.create", api.typed().task_create("w".into(), None)).await.id;
    let workspace = daemon.workspace("held");
    let holder = create(&api, &task, &workspace, None).await.unwrap();
    let second = create(&api, &task, &workspace, None).await.unwrap_err();
    assert_eq!(second.kind, ErrorKind::Conflict, "{second:?}");
    assert!(second.message.contains(&holder), "names the holder: {}", second.message);
    // The same directory by another spelling is the same workspace.
    let dotted = workspace.join(".");
    let again = create(&api, &task, &dotted, Some(false)).await.unwrap_err();
    assert_eq!(again.kind, ErrorKind::Conflict, "{again:?}");
    // Said to share, it may.
    let sharing = create(&api, &task, &workspace, Some(true)).await.unwrap();
    assert_ne!(sharing, holder);
    // A paused holder still holds it; an ended one does not.
    ok("pause", api.typed().session_pause(holder.clone(), None, None)).await;
    let paused = create(&api, &task, &workspace, None).await.unwrap_err();
    assert_eq!(paused.kind, ErrorKind::Conflict);
    ok("stop", api.typed().session_stop(holder)).await;
    ok("stop", api.typed().session_stop(sharing)).await;
    create(&api, &task, &workspace, None).await.expect("free once its sessions ended");
}

/// Two creates at once for one workspace: exactly one wins.
#[tokio::test]
async fn concurrent_creates_of_one_workspace_let_one_through() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let task = ok("task.create", api.typed().task_create("w".into(), None)).await.id;
    let workspace = daemon.workspace("race");
    let attempts: Vec<_> = (0..6).map(|_| create(&api, &task, &workspace, None)).collect();
    let results = futures_util::future::join_all(attempts).await;
    let won = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(won, 1, "{results:?}");
    for refusal in results.into_iter().filter_map(Result::err) {
        assert_eq!(refusal.kind, ErrorKind::Conflict);
    }
}

/// A session keeps the profile it started with: an edit of the profile is reported as
/// drift (which fields) by status and resume, and adopted only by a resume that asks —
/// refused while the agent runs with the old one.
#[tokio::test]
async fn a_profile_edit_is_reported_as_drift_and_adopted_only_on_request() {
    let before = "id = \"drifty\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{home}/.mock-agent\"]\nprotocol = \"acp\"\n";
    let mut daemon = Daemon::start_with_profiles(&[], &[("drifty.toml", before)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("drifty", &daemon.workspace("d")).await;
    assert_eq!(api.status(&session).await.profile_drift, Vec::<String>::new());
    // The profile is edited; a restart reads it (the daemon's watcher would too, later).
    let after = format!("{before}[env]\nDRIFT_MARK = \"adopted\"\n");
    std::fs::write(daemon.root.path().join("tether/profiles/drifty.toml"), after).unwrap();
    drop(api);
    daemon.terminate().await;
    daemon.restart().await;
    let api = daemon.api().await;
    assert_eq!(api.status(&session).await.profile_drift, ["env.DRIFT_MARK"]);
    // Not adopted by an ordinary resume, nor while the agent runs.
    let joined = api.resume(&session).await.unwrap();
    assert_eq!(
        (joined.profile_drift.as_slice(), joined.profile_refreshed),
        (&["env.DRIFT_MARK".to_owned()][..], false)
    );
    let busy = api.typed().session_resume(session.clone(), Some(true));
    let busy = tether_tests::daemon::refused("refresh while running", busy).await;
    assert_eq!(busy.kind, ErrorKind::InvalidState, "{busy:?}");
    let agents = || Daemon::processes_mentioning(&daemon.root.path().join(".mock-agent"));
    let environ = |pid: u32| std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    assert!(
        agents()
            .into_iter()
            .all(|pid| !String::from_utf8_lossy(&environ(pid)).contains("DRIFT_MARK"))
    );
    // Paused, then resumed with the refresh: the new agent runs with the edited profile,
    // and the session remembers (a native restore, as before).
    ok("pause", api.typed().session_pause(session.clone(), None, None)).await;
    let refreshed = ok("resume", api.typed().session_resume(session.clone(), Some(true))).await;
    assert!(refreshed.profile_refreshed, "{refreshed:?}");
    assert_eq!(refreshed.profile_drift, ["env.DRIFT_MARK"]);
    assert_eq!(refreshed.outcome, protocol::api::ResumeOutcome::NativeLoad);
    assert!(api.status(&session).await.profile_drift.is_empty(), "adopted");
    let marked = agents()
        .into_iter()
        .any(|pid| String::from_utf8_lossy(&environ(pid)).contains("DRIFT_MARK=adopted"));
    assert!(marked, "the agent runs with the edited profile");
    // Kept across a restart: it is the session's snapshot now.
    drop(api);
    daemon.terminate().await;
    daemon.restart().await;
    let api = daemon.api().await;
    assert!(api.status(&session).await.profile_drift.is_empty());
}

/// A launch that fails for a reason a later attempt can outlive (here the agent exits at
/// start while a file exists) leaves the session `FAILED` but resumable, the reason shown;
/// a resume once the cause is gone launches it and delivers the prompt it was created with.
/// A failed session can still be ended for good; a pause is refused, saying why.
#[tokio::test]
async fn a_crash_at_launch_leaves_the_session_resumable_and_a_resume_fixes_it() {
    let root = tempfile::tempdir().unwrap();
    let flag = root.path().join("broken");
    std::fs::write(&flag, "").unwrap();
    let profile = format!(
        "id = \"flaky\"\ncommand = [\"mock-agent\", \"--fail-while\", \"{}\"]\nprotocol = \"acp\"\n",
        flag.display()
    );
    let daemon = Daemon::start_with_profiles(&[], &[("flaky.toml", &profile)]).await;
    let api = daemon.api().await;
    let task = ok("task.create", api.typed().task_create("flaky".into(), None)).await.id;
    let workspace = daemon.workspace("f");
    let create = api.typed().session_create(
        task.clone(),
        "flaky".into(),
        Some(workspace.to_str().unwrap().to_owned()),
        Some("the first words".into()),
        None,
        None,
        None,
        None,
    );
    let session = ok("task.session.create", create).await.id;
    let mut events = api.subscribe(&session, 0).await;
    let (state, error) = tether_tests::daemon::settled(&mut events).await;
    assert_eq!(state, protocol::api::SessionState::Failed);
    assert!(error.contains("--fail-while"), "the agent's stderr is in the reason: {error}");
    let status = api.status(&session).await;
    assert_eq!(
        (status.is_resumable, status.needs_resume, status.resume_reason.as_str()),
        (true, true, "failed"),
        "{status:?}"
    );
    assert!(status.error.as_deref().is_some_and(|e| e.contains("--fail-while")), "{status:?}");
    let pause = api.typed().session_pause(session.clone(), None, None);
    let pause = tether_tests::daemon::refused("pause a failed session", pause).await;
    assert_eq!(pause.kind, ErrorKind::InvalidState, "{pause:?}");
    assert!(pause.message.contains("FAILED"), "{pause:?}");
    // Still failing: the resume says why, and the session stays resumable.
    let again = api.resume(&session).await.unwrap_err();
    assert!(again.message.contains("--fail-while"), "{again:?}");
    assert!(api.status(&session).await.is_resumable);
    // The cause is gone: a resume launches it, and the prompt it was created with goes out.
    std::fs::remove_file(&flag).unwrap();
    let mut events = api.subscribe_at_end(&session).await;
    let resumed = api.resume(&session).await.unwrap();
    assert_eq!(resumed.outcome, protocol::api::ResumeOutcome::Fresh, "{resumed:?}");
    tether_tests::daemon::until(&mut events, tether_tests::daemon::turn_ended).await;
    let history = api.history(&session).await;
    let prompts: Vec<_> = history.iter().filter(|entry| entry.role == "user").collect();
    assert_eq!(prompts.len(), 1, "{history:?}");
    assert_eq!(prompts[0].content, "the first words");
    assert!(
        history.iter().any(|entry| entry.role == "assistant"
            && entry.content.contains("you said: the first words")),
        "{history:?}"
    );
    let status = api.status(&session).await;
    assert_eq!(
        (status.state, status.is_agent_running, status.error),
        (protocol::api::SessionState::WaitingForInput, true, None)
    );
    let task = ok("task.get", api.typed().task_get(task)).await;
    assert_ne!(task.task.state, "FAILED", "{task:?}");
    // Ended for good on request, failed or not.
    ok("stop", api.typed().session_stop(session.clone())).await;
    assert_eq!(api.status(&session).await.state, protocol::api::SessionState::Completed);
}
