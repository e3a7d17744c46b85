//! Session continuity as designed — the agent's plan recorded and carried into
//! snapshots, every resume context and a client's `session/load`.

use protocol::api::{
    ApiClient, EntryType, PlanEntry, ResumeOutcome, SessionState, SnapshotTrigger,
};
use serde_json::json;
use tether_tests::daemon::{Daemon, ok};
use tether_tests::face::RawFace;

fn step(content: &str, status: &str) -> PlanEntry {
    PlanEntry { content: content.into(), status: status.into(), priority: Some("medium".into()) }
}

/// A plan given early is the newest plan still after later turns: in the history (as
/// entries and as lines), in the pause's snapshot, in the context injected on a resume,
/// and replayed to a client's `session/load` as a `plan` update.
#[tokio::test]
async fn a_plan_is_recorded_and_carried_into_snapshots_resumes_and_loads() {
    let inject = "id = \"inject\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{home}/.mock-agent\"]\nprotocol = \"acp\"\n[session]\nnative_resume = false\nhistory_injection = true\n";
    let daemon = Daemon::start_with_profiles(&[], &[("inject.toml", inject)]).await;
    let api = daemon.api().await;
    let workspace = daemon.workspace("plan");
    let session = api.ready_session("inject", &workspace).await;
    api.ask(&session, "/plan find the bug; fix it; run the tests").await;
    api.ask(&session, "a later question").await;
    let plan = vec![
        step("find the bug", "completed"),
        step("fix it", "in_progress"),
        step("run the tests", "pending"),
    ];
    let lines = "[done] find the bug\n[in progress] fix it\n[next] run the tests";

    let history = api.history(&session).await;
    let recorded: Vec<_> = history.iter().filter(|entry| entry.kind == EntryType::Plan).collect();
    assert_eq!(recorded.len(), 1, "{history:?}");
    assert_eq!(recorded[0].plan.as_deref(), Some(plan.as_slice()));
    assert_eq!(recorded[0].content, lines);
    assert_eq!(recorded[0].role, "assistant");

    let paused = api.typed().session_pause(session.clone(), Some("plan check".into()), None);
    let paused = ok("pause", paused).await;
    assert_eq!(paused.state, SessionState::Paused);
    let id = paused.snapshot_id.expect("the pause's snapshot");
    let snapshot = ok("snapshot.get", api.typed().snapshot_get(id)).await;
    assert_eq!(snapshot.plan, plan, "{snapshot:?}");
    assert_eq!(snapshot.plan_at, Some(recorded[0].at));
    // The profile asks for no summary turn: the snapshot says so.
    let summary = snapshot.summary.expect("a pause's snapshot says what became of its summary");
    assert_eq!(summary.state, protocol::api::SummaryState::Off, "{summary:?}");
    // The timeline says how far the plan was.
    let timeline = ok("timeline", api.typed().session_timeline(session.clone(), None)).await;
    let plans: Vec<_> = timeline
        .entries
        .iter()
        .filter(|entry| matches!(entry.event, protocol::api::TimelineEvent::Plan { .. }))
        .map(|entry| entry.event.clone())
        .collect();
    let expected = protocol::api::TimelineEvent::Plan {
        total: 3,
        done: 1,
        in_progress: 1,
        current: Some("fix it".into()),
    };
    assert_eq!(plans, [expected]);

    let resumed = api.resume(&session).await.expect("resume");
    assert_eq!(resumed.outcome, ResumeOutcome::HistoryInjection, "{resumed:?}");
    let first = api.ask(&session, "go on").await;
    assert!(first.contains("you said: RESUME CONTEXT FOR CONTINUING TASK"), "{first}");
    let section = format!("=== PLAN (as the agent last gave it) ===\n{lines}\n");
    assert!(first.contains(&section), "{first}");
    // Compiled from the pause's snapshot around the history: the task, why it stopped.
    assert!(first.contains("\n=== ORIGINAL TASK ===\n"), "{first}");
    assert!(
        first.contains("\n=== WHY THE SESSION STOPPED ===\nIt was paused: plan check\n"),
        "{first}"
    );
    assert!(first.contains("\n=== WORKSPACE ===\n"), "{first}");
    assert!(first.contains("=== CURRENT REQUEST ===\ngo on"), "{first}");

    // A client loading the session sees the plan where it was given.
    let mut face = RawFace::spawn(None, &daemon.url, &["--agent", "inject"]);
    face.initialize().await;
    let load = json!({"sessionId": session, "cwd": workspace, "mcpServers": []});
    face.send(json!({"jsonrpc": "2.0", "id": 2, "method": "session/load", "params": load})).await;
    let mut updates = Vec::new();
    loop {
        let message = face.next().await;
        if message["id"] == 2 {
            assert!(message.get("result").is_some(), "{message}");
            break;
        }
        updates.push(message["params"]["update"].clone());
    }
    let plans: Vec<_> = updates.iter().filter(|update| update["sessionUpdate"] == "plan").collect();
    assert_eq!(plans.len(), 1, "{updates:?}");
    assert_eq!(plans[0]["entries"], serde_json::to_value(&plan).unwrap());
    let kinds: Vec<_> = updates.iter().map(|update| update["sessionUpdate"].clone()).collect();
    let at = kinds.iter().position(|kind| kind == "plan").unwrap();
    assert_eq!(kinds[at - 1], "user_message_chunk", "replayed after its prompt: {kinds:?}");
    face.close().await;
}

/// An immediate pause answers with its snapshot, and a paused session's status says when,
/// by what and why — also a pause of a session with no agent running (after a daemon
/// restart, before anything brought it back).
#[tokio::test]
async fn a_pause_answers_with_its_snapshot_and_status_says_why() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("why")).await;
    api.ask(&session, "hello").await;
    let paused =
        ok("pause", api.typed().session_pause(session.clone(), Some("lunch".into()), None)).await;
    assert!(!paused.pause_requested && paused.state == SessionState::Paused, "{paused:?}");
    let snapshot_id = paused.snapshot_id.expect("the pause's snapshot");
    let snapshot = ok("snapshot.get", api.typed().snapshot_get(snapshot_id.clone())).await;
    assert_eq!(
        (snapshot.trigger, snapshot.reason.as_deref()),
        (SnapshotTrigger::Pause, Some("lunch"))
    );
    assert_eq!(snapshot.generation, Some(1), "the first execution's: {snapshot:?}");
    let status = api.status(&session).await;
    assert_eq!(status.pause_reason.as_deref(), Some("lunch"), "{status:?}");
    assert_eq!(status.paused_by, Some(SnapshotTrigger::Pause));
    assert!(status.paused_at.is_some_and(|at| at >= snapshot.taken_at - 5_000), "{status:?}");
    // Back, its sidecar lost, the daemon restarted: paused with no agent (and no actor),
    // the same answer.
    api.resume(&session).await.expect("resume");
    tether_tests::daemon::kill_sidecar(&daemon, &api, &session).await;
    drop(api);
    daemon.kill().await;
    daemon.restart().await;
    let api = daemon.api().await;
    assert!(!api.status(&session).await.is_agent_running);
    let paused = ok("pause", api.typed().session_pause(session.clone(), None, None)).await;
    let again = paused.snapshot_id.expect("a snapshot without an agent too");
    assert_ne!(again, snapshot_id);
    let snapshot = ok("snapshot.get", api.typed().snapshot_get(again)).await;
    assert_eq!(snapshot.generation, Some(2), "the resume's execution: {snapshot:?}");
    assert!(snapshot.execution_id.is_some(), "{snapshot:?}");
    let status = api.status(&session).await;
    assert_eq!(
        (status.state, status.pause_reason),
        (SessionState::Paused, None),
        "no reason given"
    );
}

/// Work done in a paused session's workspace by someone else — a commit, an edit, a new
/// file — is reported by the resume (what changed since the pause's snapshot, and not
/// what was already uncommitted then) and told to the agent with the next prompt.
#[tokio::test]
async fn work_done_in_the_workspace_while_paused_is_reported_on_resume() {
    use tether_tests::git;
    let inject = "id = \"inject\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{home}/.mock-agent\"]\nprotocol = \"acp\"\n[session]\nnative_resume = false\nhistory_injection = true\n";
    let daemon = Daemon::start_with_profiles(&[], &[("inject.toml", inject)]).await;
    let api = daemon.api().await;
    let workspace = daemon.workspace("drift");
    let dir = std::path::Path::new(&workspace);
    git(dir, &["init", "-q", "-b", "main"]).await;
    for file in ["a.txt", "b.txt", "c.txt"] {
        std::fs::write(dir.join(file), format!("{file} 1\n")).unwrap();
    }
    git(dir, &["add", "."]).await;
    git(dir, &["commit", "-q", "-m", "start"]).await;
    let session = api.ready_session("inject", &workspace).await;
    api.ask(&session, "hello").await;
    // Uncommitted when the session pauses: not news when the session resumes (a file over
    // 16 MiB is told by its size and time, not read).
    std::fs::write(dir.join("c.txt"), "c.txt 2, before the pause\n").unwrap();
    std::fs::write(dir.join("big.bin"), vec![7u8; 17 << 20]).unwrap();
    let paused = ok("pause", api.typed().session_pause(session.clone(), None, None)).await;
    let snapshot_id = paused.snapshot_id.expect("a snapshot");
    // Meanwhile: a commit, an edit and a new file.
    std::fs::write(dir.join("a.txt"), "a.txt 2\n").unwrap();
    git(dir, &["commit", "-q", "-am", "fix a"]).await;
    std::fs::write(dir.join("b.txt"), "b.txt 2, while paused\n").unwrap();
    std::fs::write(dir.join("d.txt"), "new\n").unwrap();
    let commit = git(dir, &["log", "-1", "--format=%h fix a"]).await;

    let resumed = api.resume(&session).await.expect("resume");
    let drift = resumed.git_drift.expect("the workspace changed");
    assert_eq!(drift.snapshot_id, snapshot_id);
    assert!(drift.head_before.is_some() && drift.head_before != drift.head_now, "{drift:?}");
    assert!(!drift.head_rewound && drift.branch_change.is_none(), "{drift:?}");
    assert_eq!(drift.commits, std::slice::from_ref(&commit));
    assert_eq!(drift.changed_files, ["a.txt", "b.txt", "d.txt"], "c.txt was changed before");
    let first = api.ask(&session, "go on").await;
    let section = "=== WORKSPACE CHANGES SINCE THE LAST SNAPSHOT (not made by you) ===\n";
    assert!(first.contains(section), "{first}");
    assert!(first.contains(&format!("Commits since: {commit}")), "{first}");
    assert!(first.contains("Files changed since: a.txt, b.txt, d.txt"), "{first}");

    // Nothing changed since: a resume says nothing. The CLI says why it was paused and
    // what its snapshot holds first.
    let (code, out, err) = daemon.cli(&["pause", &session, "--reason", "coffee"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let snapshot = out.split("(snapshot ").nth(1).and_then(|rest| rest.split(')').next());
    let snapshot = snapshot.unwrap_or_else(|| panic!("the pause names its snapshot: {out}"));
    let (code, out, err) = daemon.cli(&["resume", "--quiet", &session]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains("paused"), "--quiet: no summary: {out}");
    ok("pause", api.typed().session_pause(session.clone(), Some("tea".into()), None)).await;
    let (code, out, err) = daemon.cli(&["resume", &session]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(" by pause: tea\n"), "{out}");
    assert!(out.contains("turns, 0 errors") && !out.contains(snapshot), "the newest: {out}");
    assert!(out.contains("  workspace: main at "), "{out}");
    assert!(!out.contains("the workspace changed"), "{out}");
    let resumed_again = api.status(&session).await;
    assert!(resumed_again.is_agent_running, "{resumed_again:?}");
    // A reset to the start is a rewind.
    let start = git(dir, &["rev-list", "--max-parents=0", "HEAD"]).await;
    ok("pause", api.typed().session_pause(session.clone(), None, None)).await;
    git(dir, &["reset", "-q", "--hard", &start]).await;
    let mut big = std::fs::OpenOptions::new().append(true).open(dir.join("big.bin")).unwrap();
    std::io::Write::write_all(&mut big, b"more").unwrap();
    let resumed = api.resume(&session).await.expect("resume");
    let drift = resumed.git_drift.expect("a rewind");
    assert!(drift.head_rewound && drift.commits.is_empty(), "{drift:?}");
    assert!(drift.changed_files.contains(&"a.txt".to_owned()), "{drift:?}");
    assert!(drift.changed_files.contains(&"big.bin".to_owned()), "grown: {drift:?}");
}

/// After a native resume (`native_load`) the agent was not told of the work done in its
/// workspace while it was paused, though the CLI and the page said it would be: the next
/// prompt now carries a short WORKSPACE CHANGES preface (the history keeps the prompt as
/// typed), and only when something changed; files that were uncommitted before the
/// session started are not the session's changes.
#[tokio::test]
async fn a_natively_resumed_agent_is_told_what_changed_in_its_workspace() {
    use tether_tests::git;
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let workspace = daemon.workspace("native-drift");
    let dir = std::path::Path::new(&workspace);
    git(dir, &["init", "-q", "-b", "main"]).await;
    std::fs::write(dir.join("a.txt"), "a 1\n").unwrap();
    std::fs::write(dir.join("mine.txt"), "committed\n").unwrap();
    git(dir, &["add", "."]).await;
    git(dir, &["commit", "-q", "-m", "start"]).await;
    // The person's work in progress before the session starts.
    std::fs::write(dir.join("mine.txt"), "the person's draft\n").unwrap();
    let session = api.ready_session("mock", &workspace).await;
    api.ask(&session, "hello").await;
    let paused = ok("pause", api.typed().session_pause(session.clone(), None, None)).await;
    let snapshot = ok("get", api.typed().snapshot_get(paused.snapshot_id.unwrap())).await;
    assert!(
        !snapshot.git.modified_files.contains(&"mine.txt".to_owned()),
        "uncommitted before the start: not the session's change: {:?}",
        snapshot.git
    );
    std::fs::write(dir.join("a.txt"), "a 2\n").unwrap();
    git(dir, &["commit", "-q", "-am", "fix a"]).await;
    let resumed = api.resume(&session).await.expect("resume");
    assert_eq!(resumed.outcome, protocol::api::ResumeOutcome::NativeLoad, "{resumed:?}");
    assert!(resumed.git_drift.is_some(), "{resumed:?}");
    let first = api.ask(&session, "go on").await;
    let section = "=== WORKSPACE CHANGES SINCE THE LAST SNAPSHOT (not made by you) ===\n";
    assert!(first.contains(section), "told: {first}");
    assert!(first.contains("fix a") && first.contains("go on"), "{first}");
    assert!(!first.contains("EXECUTION HISTORY"), "a native resume gets no history: {first}");
    let history = api.history(&session).await;
    let typed = history.iter().rev().find(|e| e.kind == protocol::api::EntryType::UserMessage);
    assert_eq!(typed.map(|e| e.content.as_str()), Some("go on"), "recorded as typed");
    // Told once: the prompt after it goes as typed.
    let second = api.ask(&session, "and then").await;
    assert!(!second.contains("WORKSPACE CHANGES"), "{second}");
    // Nothing changed during the next pause: nothing is said.
    ok("pause", api.typed().session_pause(session.clone(), None, None)).await;
    api.resume(&session).await.expect("resume");
    let quiet = api.ask(&session, "still there?").await;
    assert!(!quiet.contains("WORKSPACE CHANGES"), "{quiet}");
}

/// The agent's context passing 10 points below the handoff threshold (85 % by default) is
/// said once, before the pause at the threshold; a report below the mark arms it again.
#[tokio::test]
async fn a_context_warning_comes_before_the_handoff_threshold() {
    use protocol::api::EventKind;
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("warn")).await;
    let warnings = |events: &[protocol::api::SessionEvent]| -> Vec<(u64, u64)> {
        let warning = |event: &protocol::api::SessionEvent| match event.kind {
            EventKind::ContextWarning { percent, threshold, .. } => Some((percent, threshold)),
            _ => None,
        };
        events.iter().filter_map(warning).collect()
    };
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, "/usage 74 100\nbelow the mark").await.unwrap();
    let seen = tether_tests::daemon::until(&mut events, tether_tests::daemon::turn_ended).await;
    assert_eq!(warnings(&seen), []);
    api.prompt(&session, "/usage 75 100\n/usage 80 100\nat the mark, twice").await.unwrap();
    let seen = tether_tests::daemon::until(&mut events, tether_tests::daemon::turn_ended).await;
    assert_eq!(warnings(&seen), [(75, 85)], "once: {seen:?}");
    api.prompt(&session, "/usage 10 100\n/usage 84 100\nbelow, then past it again").await.unwrap();
    let seen = tether_tests::daemon::until(&mut events, tether_tests::daemon::turn_ended).await;
    assert_eq!(warnings(&seen), [(84, 85)], "armed again: {seen:?}");
    let status = api.status(&session).await;
    assert_eq!(status.state, SessionState::WaitingForInput, "no pause below the threshold");
}

/// `pause` and `resume` without a session take the one whose workspace is the current
/// directory, and refuse — listing them — when several are there, or say none is.
#[tokio::test]
async fn the_cli_finds_the_session_of_the_current_directory() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let here = daemon.workspace("here");
    let session = api.ready_session("mock", &here).await;
    let (code, out, err) = daemon.cli_in(&here, &["pause", "--reason", "from here"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with(&format!("session {session} paused (snapshot ")), "{out}");
    assert_eq!(api.status(&session).await.pause_reason.as_deref(), Some("from here"));
    let (code, out, err) = daemon.cli_in(&here, &["resume"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("session {session} resumed")), "{out}");
    // A second session in the same workspace: which one is not guessed.
    let task = ok("task", api.typed().task_create("two here".into(), None)).await;
    let create = tether_tests::daemon::Create {
        shared: Some(true),
        ..tether_tests::daemon::Create::new(&task.id, "mock", Some(&here))
    };
    let other = ok("create", create.send(api.typed())).await.id;
    let (code, out, err) = daemon.cli_in(&here, &["pause"]).await;
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("2 sessions work in") && err.contains(&session) && err.contains(&other),
        "{err}"
    );
    let elsewhere = daemon.workspace("elsewhere");
    let (code, _, err) = daemon.cli_in(&elsewhere, &["resume"]).await;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("no session works in"), "{err}");
}

/// A snapshot says what became of each error — worked around, deferred by a pause, fixed
/// later — and what the newest test run was; a handoff's context says so too.
#[tokio::test]
async fn a_snapshot_says_what_became_of_errors_and_the_last_test_run() {
    use protocol::api::{ErrorResolution, Snapshot};
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("errors")).await;
    let pause_and_read = || async {
        let paused = ok("pause", api.typed().session_pause(session.clone(), None, None)).await;
        let id = paused.snapshot_id.expect("a snapshot");
        let snapshot: Snapshot = ok("snapshot.get", api.typed().snapshot_get(id)).await;
        api.resume(&session).await.expect("resume");
        snapshot
    };
    let resolutions = |snapshot: &Snapshot| -> Vec<(String, Option<ErrorResolution>)> {
        snapshot.errors.iter().map(|error| (error.source.clone(), error.resolution)).collect()
    };
    api.ask(&session, "/exec cargo test --workspace\nrun the tests").await;
    let first = pause_and_read().await;
    assert_eq!(resolutions(&first), [("tool".into(), Some(ErrorResolution::WorkedAround))]);
    let tests = first.tests.as_ref().expect("the test run");
    assert_eq!((tests.command.as_str(), tests.passed), ("cargo test --workspace", false));
    assert!(tests.output.contains("exit code 1"), "{tests:?}");

    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, "/crash 3").await.unwrap();
    tether_tests::daemon::until(&mut events, tether_tests::daemon::turn_ended).await;
    let second = pause_and_read().await;
    let newest: Vec<_> = resolutions(&second).into_iter().skip(1).collect();
    assert!(!newest.is_empty(), "{second:?}");
    assert!(
        newest.iter().all(|(_, resolution)| *resolution == Some(ErrorResolution::Deferred)),
        "the crash, then a pause: {newest:?}"
    );
    api.ask(&session, "hello again").await;
    let third = pause_and_read().await;
    let newest: Vec<_> = resolutions(&third).into_iter().skip(1).collect();
    assert!(
        newest.iter().all(|(_, resolution)| *resolution == Some(ErrorResolution::Fixed)),
        "a turn completed since: {newest:?}"
    );
    assert_eq!(
        third.tests.as_ref().map(|tests| tests.command.as_str()),
        Some("cargo test --workspace")
    );
}
