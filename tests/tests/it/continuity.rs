//! Issue 34: session continuity as designed — the agent's plan recorded and carried into
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
async fn r34_a_plan_is_recorded_and_carried_into_snapshots_resumes_and_loads() {
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
    assert_eq!(ok("pause", paused).await.state, SessionState::Paused);
    let snapshots = ok("snapshot.list", api.typed().snapshot_list(session.clone())).await;
    let newest = snapshots.last().expect("the pause's snapshot");
    let snapshot = ok("snapshot.get", api.typed().snapshot_get(newest.snapshot_id.clone())).await;
    assert_eq!(snapshot.plan, plan, "{snapshot:?}");
    assert_eq!(snapshot.plan_at, Some(recorded[0].at));

    let resumed = api.resume(&session).await.expect("resume");
    assert_eq!(resumed.outcome, ResumeOutcome::HistoryInjection, "{resumed:?}");
    let first = api.ask(&session, "go on").await;
    assert!(first.contains("you said: RESUME CONTEXT FOR CONTINUING TASK"), "{first}");
    let section = format!("=== PLAN (as the agent last gave it) ===\n{lines}\n");
    assert!(first.contains(&section), "{first}");
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
async fn r34_a_pause_answers_with_its_snapshot_and_status_says_why() {
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
    let status = api.status(&session).await;
    assert_eq!(
        (status.state, status.pause_reason),
        (SessionState::Paused, None),
        "no reason given"
    );
}
