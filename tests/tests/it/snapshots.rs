//! Snapshots, capacity handoff and the timeline: a snapshot per trigger (pause,
//! turn_complete, exhaustion, timeout, crash) with the workspace's git state, the turns,
//! errors and usage; a session whose agent reports its context nearly full pauses and is
//! handed over to a fresh agent session primed from its snapshot; the timeline lists what
//! happened in order.

use protocol::api::{
    ApiClient, EventKind, ResumeOutcome, SessionEvent, SessionState, SnapshotTrigger,
    TimelineEvent, TurnState,
};
use protocol::errors::ErrorKind;
use tether_tests::daemon::{
    Api, Daemon, ok, refused, settled, turn_ended, until, until_permission_request,
};
use tether_tests::git;

fn snapshot_taken(event: &SessionEvent, wanted: SnapshotTrigger) -> bool {
    matches!(event.kind, EventKind::SnapshotTaken { trigger, .. } if trigger == wanted)
}

fn snapshot_id(events: &[SessionEvent], wanted: SnapshotTrigger) -> String {
    events
        .iter()
        .find_map(|event| match &event.kind {
            EventKind::SnapshotTaken { snapshot_id, trigger } if *trigger == wanted => {
                Some(snapshot_id.clone())
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no {wanted} snapshot in {events:?}"))
}

async fn timeline(api: &Api, session: &str, after: Option<i64>) -> Vec<(i64, TimelineEvent)> {
    let timeline = api.typed().session_timeline(session.to_owned(), after);
    ok("task.session.timeline", timeline)
        .await
        .entries
        .into_iter()
        .map(|entry| (entry.seq, entry.event))
        .collect()
}

/// The agent reports its context 90 % full (the default threshold is 85 %) during a
/// turn: the turn finishes, the session pauses with trigger `exhaustion`, and its resume
/// opens a fresh agent session (not a native restore) whose first prompt — only the first
/// — carries the context compiled from the snapshot.
#[tokio::test]
async fn exhaustion_pauses_and_hands_over_to_a_fresh_session_primed_once() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("x")).await;
    // Below the threshold: nothing happens (the session settles waiting for input; its
    // `state` event follows the turn's end, and its row that event).
    let mut events = api.subscribe_at_end(&session).await;
    api.ask(&session, "/usage 50 100\nread the code").await;
    assert_eq!(settled(&mut events).await.0, SessionState::WaitingForInput);
    // The agent reports, then waits for a permission answer: the turn is still running.
    api.prompt(&session, "/usage 90 100 0.42\n/permission\nwrite the parser").await.unwrap();
    let (seen, request_id, _) = until_permission_request(&mut events).await;
    let requested = |e: &SessionEvent| matches!(e.kind, EventKind::PauseRequested { .. });
    // (The report and the request may reach the supervisor together or apart.)
    if !seen.iter().any(requested) {
        until(&mut events, requested).await;
    }
    assert!(api.status(&session).await.pause_requested);
    let answer = api.typed().permission_respond(session.clone(), request_id, Some("allow".into()));
    ok("permission.respond", answer).await;
    let seen = until(&mut events, |e| matches!(e.kind, EventKind::Paused { .. })).await;
    let ended = seen.iter().position(turn_ended).expect("the turn ended");
    let paused = seen.iter().position(|e| matches!(e.kind, EventKind::Paused { .. })).unwrap();
    assert!(ended < paused, "the turn was let finish: {seen:?}");
    let exhausted = snapshot_id(&seen, SnapshotTrigger::Exhaustion);
    let status = api.status(&session).await;
    assert_eq!(status.state, SessionState::Paused);
    assert!(status.needs_resume && !status.is_agent_running, "{status:?}");

    let snapshot = ok("snapshot.get", api.typed().snapshot_get(exhausted.clone())).await;
    assert_eq!(snapshot.trigger, SnapshotTrigger::Exhaustion);
    assert!(snapshot.reason.as_deref().unwrap().contains("90% full"), "{snapshot:?}");
    assert_eq!((snapshot.usage.context_used, snapshot.usage.context_size), (Some(90), Some(100)));
    assert_eq!(snapshot.usage.cost, Some(0.42));
    assert_eq!(snapshot.usage.turns, 2);
    assert_eq!(snapshot.usage.tool_calls, 1);
    assert_eq!(snapshot.turns.len(), 2);
    let last = &snapshot.turns[1];
    assert_eq!(last.state, TurnState::Completed);
    assert!(last.prompt.as_deref().unwrap().contains("write the parser"), "{last:?}");
    assert_eq!(last.tool_calls.len(), 1, "{last:?}");
    assert_eq!(last.tool_calls[0].status, "completed");
    assert!(!snapshot.git.repository, "the workspace is not a repository");

    // The resume is a handoff: a new agent session, primed once.
    let resumed = api.resume(&session).await.unwrap();
    assert_eq!(resumed.outcome, ResumeOutcome::ContextHandoff, "{resumed:?}");
    let first = api.ask(&session, "go on").await;
    assert!(first.contains("remembered 0 earlier messages"), "a fresh agent session: {first}");
    assert!(first.contains("you said: RESUME CONTEXT FOR CONTINUING TASK"), "{first}");
    assert!(first.contains(&format!("compiled from snapshot {exhausted}")), "{first}");
    assert!(first.contains("=== ORIGINAL TASK ===\nmock test"), "{first}");
    assert!(first.contains("Turn 2 (completed, end_turn)"), "{first}");
    assert!(first.contains("Tools: mock tool: list files (completed)"), "{first}");
    assert!(first.contains("=== CURRENT REQUEST ===\ngo on"), "{first}");
    let second = api.ask(&session, "and then").await;
    assert!(
        second.contains("you said: and then") && !second.contains("RESUME CONTEXT"),
        "{second}"
    );
    // The next resume after a handoff is an ordinary one again.
    assert_eq!(api.status(&session).await.state, SessionState::WaitingForInput);
    let entries = timeline(&api, &session, None).await;
    let outcomes: Vec<ResumeOutcome> = entries
        .iter()
        .filter_map(|(_, event)| match event {
            TimelineEvent::Resumed { outcome, .. } => Some(*outcome),
            _ => None,
        })
        .collect();
    assert_eq!(outcomes, [ResumeOutcome::ContextHandoff]);
    assert!(entries.iter().any(|(_, event)| matches!(
        event,
        TimelineEvent::PauseRequested { trigger: SnapshotTrigger::Exhaustion, .. }
    )));
}

/// A snapshot of a session in a git workspace reports its branch, the commit at the
/// session's start and now, the commits since, the files modified since the start,
/// the staged ones, and the dirty flag.
#[tokio::test]
async fn a_snapshot_of_a_git_workspace_reports_branch_commits_and_files() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let repo = daemon.workspace("repo");
    git(&repo, &["init", "-q", "-b", "feature/parser"]).await;
    std::fs::write(repo.join("lexer.rs"), "fn lex() {}\n").unwrap();
    std::fs::write(repo.join("README.md"), "parser\n").unwrap();
    git(&repo, &["add", "."]).await;
    git(&repo, &["commit", "-q", "-m", "start"]).await;
    let start = git(&repo, &["rev-parse", "HEAD"]).await;
    let session = api.ready_session("mock", &repo).await;
    // Work done during the session: a commit, an edit, a staged new file, a new file.
    std::fs::write(repo.join("lexer.rs"), "fn lex() { todo!() }\n").unwrap();
    git(&repo, &["commit", "-q", "-am", "lexer: stub"]).await;
    let head = git(&repo, &["rev-parse", "HEAD"]).await;
    std::fs::write(repo.join("README.md"), "parser, ported\n").unwrap();
    std::fs::write(repo.join("parser.rs"), "fn parse() {}\n").unwrap();
    git(&repo, &["add", "parser.rs"]).await;
    std::fs::write(repo.join("notes.txt"), "todo\n").unwrap();
    let mut events = api.subscribe_at_end(&session).await;
    let paused = api.typed().session_pause(session.clone(), Some("review".into()), None);
    ok("pause", paused).await;
    let seen = until(&mut events, |e| snapshot_taken(e, SnapshotTrigger::Pause)).await;
    let snapshot =
        ok("snapshot.get", api.typed().snapshot_get(snapshot_id(&seen, SnapshotTrigger::Pause)))
            .await;
    assert_eq!(snapshot.reason.as_deref(), Some("review"));
    let git_state = &snapshot.git;
    assert!(git_state.repository && git_state.dirty, "{git_state:?}");
    assert_eq!(git_state.branch.as_deref(), Some("feature/parser"));
    assert_eq!(git_state.start_commit.as_deref(), Some(start.as_str()));
    assert_eq!(git_state.head_commit.as_deref(), Some(head.as_str()));
    assert_eq!(git_state.commits_since_start.len(), 1, "{git_state:?}");
    assert!(git_state.commits_since_start[0].ends_with(" lexer: stub"), "{git_state:?}");
    assert_eq!(git_state.modified_files, ["README.md", "lexer.rs", "notes.txt", "parser.rs"]);
    assert_eq!(git_state.staged_files, ["parser.rs"]);
    assert!(git_state.diffstat.as_deref().unwrap().starts_with("3 files changed"), "{git_state:?}");
    // The list shows it, with the columns it is indexed by.
    let list = ok("snapshot.list", api.typed().snapshot_list(session.clone())).await;
    let listed = list.iter().find(|s| s.snapshot_id == snapshot.snapshot_id).unwrap();
    assert_eq!(listed.git_branch.as_deref(), Some("feature/parser"));
    assert_eq!((listed.git_head.as_deref(), listed.git_dirty), (Some(head.as_str()), Some(true)));
    // And the CLI.
    let (code, out, err) = daemon.cli(&["snapshots", "list", &session]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&snapshot.snapshot_id) && out.contains("\tpause\t"), "{out}");
    let (code, out, err) = daemon.cli(&["snapshots", "get", &snapshot.snapshot_id]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"branch\": \"feature/parser\""), "{out}");
}

/// The timeline of a session whose agent crashed, which was resumed and then paused
/// lists those in order; `after` returns only what came later; `sessions show` prints it.
/// Snapshots were taken for the completed turn, the crash and the pause.
#[tokio::test]
async fn the_timeline_lists_a_crash_a_resume_and_a_pause_in_order() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("t")).await;
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, "hello").await.unwrap();
    until(&mut events, |e| snapshot_taken(e, SnapshotTrigger::TurnComplete)).await;
    api.prompt(&session, "/crash 7").await.unwrap();
    let seen = until(&mut events, |e| snapshot_taken(e, SnapshotTrigger::Crash)).await;
    assert!(seen.iter().any(turn_ended), "{seen:?}");
    let resumed = api.resume(&session).await.unwrap();
    assert_eq!(resumed.outcome, ResumeOutcome::NativeLoad);
    ok("pause", api.typed().session_pause(session.clone(), None, None)).await;

    let entries = timeline(&api, &session, None).await;
    let position = |what: &str, found: &dyn Fn(&TimelineEvent) -> bool| {
        entries
            .iter()
            .position(|(_, event)| found(event))
            .unwrap_or_else(|| panic!("no {what} in {entries:#?}"))
    };
    let first_execution = position("execution 1", &|e| {
        matches!(e, TimelineEvent::ExecutionStarted { generation: 1, .. })
    });
    let completed = position("the completed turn", &|e| {
        matches!(e, TimelineEvent::TurnEnded { state: TurnState::Completed, .. })
    });
    let failed = position("the failed turn", &|e| {
        matches!(e, TimelineEvent::TurnEnded { state: TurnState::Failed, .. })
    });
    let crashed = position(
        "the crash",
        &|e| matches!(e, TimelineEvent::Error { message } if message.contains("exit code 7")),
    );
    let crash_snapshot = position("the crash snapshot", &|e| {
        matches!(e, TimelineEvent::SnapshotTaken { trigger: SnapshotTrigger::Crash, .. })
    });
    let second_execution = position("execution 2", &|e| {
        matches!(e, TimelineEvent::ExecutionStarted { generation: 2, .. })
    });
    let resumed = position("the resume", &|e| {
        matches!(e, TimelineEvent::Resumed { outcome: ResumeOutcome::NativeLoad, .. })
    });
    let paused = position("the pause", &|e| {
        matches!(e, TimelineEvent::Paused { trigger: SnapshotTrigger::Pause, forced: false, .. })
    });
    let order = [
        first_execution,
        completed,
        failed,
        crashed,
        crash_snapshot,
        second_execution,
        resumed,
        paused,
    ];
    assert!(order.windows(2).all(|pair| pair[0] < pair[1]), "{order:?} in {entries:#?}");
    assert!(entries.windows(2).all(|pair| pair[0].0 < pair[1].0), "seqs increase");
    // `after`: only what came later.
    let resumed_seq = entries[resumed].0;
    let later = timeline(&api, &session, Some(resumed_seq)).await;
    assert_eq!(later.len(), entries.len() - resumed - 1);
    assert!(later.iter().all(|(seq, _)| *seq > resumed_seq));
    // Each trigger left its snapshot; the crash's names the error and what followed it.
    let list = ok("snapshot.list", api.typed().snapshot_list(session.clone())).await;
    let triggers: Vec<SnapshotTrigger> = list.iter().map(|s| s.trigger).collect();
    for wanted in [SnapshotTrigger::TurnComplete, SnapshotTrigger::Crash, SnapshotTrigger::Pause] {
        assert!(triggers.contains(&wanted), "{triggers:?}");
    }
    let pause = list.iter().rfind(|s| s.trigger == SnapshotTrigger::Pause).unwrap();
    let pause = ok("snapshot.get", api.typed().snapshot_get(pause.snapshot_id.clone())).await;
    let crash = pause
        .errors
        .iter()
        .find(|e| e.source == "session" && e.message.contains("exit code 7"))
        .unwrap_or_else(|| panic!("{:#?}", pause.errors));
    assert!(crash.followed_by.is_some(), "{crash:?}");
    // The CLI prints the timeline.
    let (code, out, err) = daemon.cli(&["sessions", "show", &session]).await;
    assert_eq!(code, 0, "{err}");
    let printed = out.split("timeline:").nth(1).unwrap_or_else(|| panic!("{out}"));
    let error_at = printed.find("\terror\t").unwrap_or_else(|| panic!("{printed}"));
    let resumed_at = printed.find("resumed (native_load)").unwrap_or_else(|| panic!("{printed}"));
    let paused_at = printed.find("paused (pause)").unwrap_or_else(|| panic!("{printed}"));
    assert!(error_at < resumed_at && resumed_at < paused_at, "{printed}");
}

/// A forced pause leaves a `timeout` snapshot; an agent that died with the daemon leaves
/// a `crash` snapshot, taken at recovery, whose turn was interrupted.
#[tokio::test]
async fn a_forced_pause_and_a_crash_found_at_recovery_leave_their_snapshots() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let forced = api.ready_session("mock", &daemon.workspace("f")).await;
    let mut events = api.subscribe_at_end(&forced).await;
    api.prompt(&forced, "/sleep 600000").await.unwrap();
    until(&mut events, |e| {
        matches!(&e.kind, EventKind::State { state: SessionState::Running, .. })
    })
    .await;
    ok("pause", api.typed().session_pause(forced.clone(), Some("late".into()), Some(200))).await;
    let seen = until(&mut events, |e| snapshot_taken(e, SnapshotTrigger::Timeout)).await;
    let timeout =
        ok("snapshot.get", api.typed().snapshot_get(snapshot_id(&seen, SnapshotTrigger::Timeout)))
            .await;
    assert_eq!(timeout.reason.as_deref(), Some("late"));
    assert_eq!(timeout.turns.last().unwrap().stop_reason.as_deref(), Some("cancelled"));

    let lost = api.ready_session("mock", &daemon.workspace("l")).await;
    let mut events = api.subscribe_at_end(&lost).await;
    api.prompt(&lost, "/sleep 600000\nlong work").await.unwrap();
    until(&mut events, |e| {
        matches!(&e.kind, EventKind::State { state: SessionState::Running, .. })
    })
    .await;
    drop(events);
    drop(api);
    let sidecar = daemon.agentctl_pid(&lost);
    daemon.kill().await;
    tether_tests::daemon::sigkill(sidecar).await;
    daemon.restart().await;
    let api = daemon.api().await;
    // Recovery replays the dead sidecar's spool in the background (the daemon serves
    // meanwhile); the crash's snapshot is taken once that is through.
    let mut events = api.subscribe(&lost, 0).await;
    until(&mut events, |e| snapshot_taken(e, SnapshotTrigger::Crash)).await;
    let list = ok("snapshot.list", api.typed().snapshot_list(lost.clone())).await;
    let crash =
        list.iter().find(|s| s.trigger == SnapshotTrigger::Crash).expect("a crash snapshot");
    let crash = ok("snapshot.get", api.typed().snapshot_get(crash.snapshot_id.clone())).await;
    let turn = crash.turns.last().unwrap();
    assert_eq!(turn.state, TurnState::Interrupted, "{turn:?}");
    assert!(turn.prompt.as_deref().unwrap().contains("long work"), "{turn:?}");
}

/// Bad input gets clear errors: an unknown snapshot, the snapshots of an unknown session,
/// an unknown field.
#[tokio::test]
async fn snapshots_refuse_what_does_not_exist() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let unknown = "01a20a40-0000-7000-8000-000000000000".to_owned();
    let missing = refused("snapshot.get", api.typed().snapshot_get(unknown.clone())).await;
    assert_eq!(missing.kind, ErrorKind::NotFound, "{missing:?}");
    assert!(missing.message.contains(&unknown), "{missing:?}");
    let no_session = refused("snapshot.list", api.typed().snapshot_list(unknown.clone())).await;
    assert_eq!(no_session.kind, ErrorKind::NotFound, "{no_session:?}");
    let no_timeline = refused("timeline", api.typed().session_timeline(unknown, Some(3))).await;
    assert_eq!(no_timeline.kind, ErrorKind::NotFound, "{no_timeline:?}");
    let raw = api
        .call_raw("task.session.snapshot.get", serde_json::json!({"snapshot": "x"}))
        .await
        .unwrap_err();
    assert_eq!((raw.kind, raw.field.as_deref()), (ErrorKind::InvalidParams, Some("snapshot")));
}
