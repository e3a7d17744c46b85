//! Tests for the store against real SQLite files.

use super::executions::recovery_candidates_sql;
use super::*;
use crate::ids::SessionId;

pub(crate) fn open() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("state.db")).unwrap();
    (dir, store)
}

pub(crate) fn session(task_id: &str) -> SessionRow {
    SessionRow {
        id: uuid::Uuid::now_v7().to_string().into(),
        task_id: task_id.into(),
        agent_profile_id: "mock".into(),
        pinned_profile: serde_json::json!({"id": "mock"}),
        runtime: "standalone".into(),
        state: SessionState::Created,
        workspace_path: "/w".into(),
        error_message: None,
        created_at: 1,
        updated_at: 1,
        initial_prompt: None,
        worktree_repo: None,
        worktree_branch: None,
        runtime_labels: Default::default(),
        mcp_servers: Vec::new(),
        title: None,
        additional_directories: Vec::new(),
    }
}

#[tokio::test]
async fn migrations_are_recorded_and_reopening_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    drop(Store::open(&path).unwrap());
    let store = Store::open(&path).unwrap();
    let versions: Vec<i64> = store
        .call(|conn| {
            let mut stmt =
                conn.prepare("SELECT version FROM schema_migrations ORDER BY version")?;
            Ok(stmt.query_map([], |r| r.get(0))?.collect::<Result<Vec<_>, _>>()?)
        })
        .await
        .unwrap();
    assert_eq!(versions, (1..=MIGRATIONS.len() as i64).collect::<Vec<_>>());
    let mode: String = store
        .call(|conn| Ok(conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?))
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    let fk: i64 = store
        .call(|conn| Ok(conn.query_row("PRAGMA foreign_keys", [], |r| r.get(0))?))
        .await
        .unwrap();
    assert_eq!(fk, 1);
}

#[test]
fn a_failing_migration_stops_with_its_number() {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = Connection::open(dir.path().join("x.db")).unwrap();
    conn.execute_batch("CREATE TABLE tasks (id TEXT)").unwrap();
    match schema::migrate(&mut conn) {
        Err(StoreError::Migration { version: 1, .. }) => {}
        other => panic!("expected migration 1 to fail, got {other:?}"),
    }
    let recorded: i64 =
        conn.query_row("SELECT COUNT(*) FROM schema_migrations", [], |r| r.get(0)).unwrap();
    assert_eq!(recorded, 0, "a failed migration is not recorded");
}

#[tokio::test]
async fn tasks_and_sessions_round_trip() {
    let (_dir, store) = open();
    let task = store.create_task("fix it".into(), "please".into()).await.unwrap();
    assert_eq!(store.get_task(task.id.clone()).await.unwrap(), task);
    let row = store.create_session(session(&task.id)).await.unwrap();
    assert_eq!(store.get_session(row.id.clone()).await.unwrap(), row);
    store
        .set_session_state(
            row.id.clone(),
            SessionState::WaitingForInput,
            Some("note".into()),
            Some(task_state::REVIEW),
            7,
        )
        .await
        .unwrap();
    // The event seq mark never goes down.
    store
        .set_session_state(
            row.id.clone(),
            SessionState::WaitingForInput,
            Some("note".into()),
            None,
            3,
        )
        .await
        .unwrap();
    assert_eq!(store.event_seq_high(row.id.clone()).await.unwrap(), 7);
    assert_eq!(store.event_seq_high("nope".into()).await.unwrap(), 0);
    let back = store.get_session(row.id.clone()).await.unwrap();
    assert_eq!(
        (back.state, back.error_message.as_deref()),
        (SessionState::WaitingForInput, Some("note"))
    );
    assert_eq!(store.get_task(task.id.clone()).await.unwrap().state, "REVIEW");
    assert_eq!(store.list_sessions(Some(task.id.clone())).await.unwrap().len(), 1);
    assert!(matches!(
        store.create_session(session("no-such-task")).await,
        Err(StoreError::NotFound { what: "task", .. })
    ));
    assert!(matches!(
        store.get_session("nope".into()).await,
        Err(StoreError::NotFound { what: "session", .. })
    ));
}

#[tokio::test]
async fn writes_for_a_stale_execution_change_nothing() {
    let (_dir, store) = open();
    let task = store.create_task("t".into(), String::new()).await.unwrap();
    let row = store.create_session(session(&task.id)).await.unwrap();
    let first = store
        .put_execution(ExecutionRow {
            runtime: "standalone".into(),
            status: ExecutionStatus::Running,
            ..ExecutionRow::new(row.id.clone(), "e1".into())
        })
        .await
        .unwrap();
    assert_eq!(first.generation, 1);
    assert!(
        store.set_resume_token(row.id.clone(), "e1".into(), Some("tok-1".into())).await.unwrap()
    );
    let second = store
        .put_execution(ExecutionRow {
            runtime: "standalone".into(),
            status: ExecutionStatus::Running,
            ..ExecutionRow::new(row.id.clone(), "e2".into())
        })
        .await
        .unwrap();
    assert_eq!(second.generation, 2);
    // A late write from the first execution is refused.
    assert!(
        !store.set_resume_token(row.id.clone(), "e1".into(), Some("stale".into())).await.unwrap()
    );
    assert!(
        store.set_resume_token(row.id.clone(), "e2".into(), Some("tok-2".into())).await.unwrap()
    );
    assert!(store.set_acked_seq(row.id.clone(), "e2".into(), 10).await.unwrap());
    assert!(store.set_acked_seq(row.id.clone(), "e2".into(), 5).await.unwrap());
    let current = store.get_execution(row.id.clone()).await.unwrap().unwrap();
    assert_eq!(
        (current.resume_token.as_deref(), current.acked_seq),
        (Some("tok-2"), 10),
        "acks never move back"
    );
}

#[tokio::test]
async fn deleting_a_session_removes_its_records() {
    let (_dir, store) = open();
    let task = store.create_task("t".into(), String::new()).await.unwrap();
    let row = store.create_session(session(&task.id)).await.unwrap();
    store
        .put_execution(ExecutionRow {
            runtime: "standalone".into(),
            status: ExecutionStatus::Running,
            ..ExecutionRow::new(row.id.clone(), "e".into())
        })
        .await
        .unwrap();
    store
        .insert_turn("t1".into(), row.id.clone(), "e".into(), "5".into(), ("p".into(), None, None))
        .await
        .unwrap();
    store
        .insert_pending(
            row.id.clone(),
            "e".into(),
            "7".into(),
            "session/request_permission".into(),
            serde_json::json!({}),
        )
        .await
        .unwrap();
    store.delete_session(row.id.clone()).await.unwrap();
    assert!(store.get_execution(row.id.clone()).await.unwrap().is_none());
    assert!(store.list_pending(row.id.clone()).await.unwrap().is_empty());
    assert!(matches!(store.get_turn("t1".into()).await, Err(StoreError::NotFound { .. })));
    assert!(matches!(store.delete_session(row.id).await, Err(StoreError::NotFound { .. })));
}

/// Recovery's orphan check reads ids only: a snapshot that does not parse (which
/// `list_sessions` reports as corrupt) does not stop it.
#[tokio::test]
async fn existing_sessions_do_not_parse_snapshots() {
    let (_dir, store) = open();
    let task = store.create_task("t".into(), String::new()).await.unwrap();
    let a = store.create_session(session(&task.id)).await.unwrap();
    let b = store.create_session(session(&task.id)).await.unwrap();
    let b_id = b.id.clone();
    store
        .call(move |conn| {
            conn.execute("UPDATE task_sessions SET profile_snapshot = '{' WHERE id = ?1", [&b_id])?;
            Ok(())
        })
        .await
        .unwrap();
    assert!(store.list_sessions(None).await.is_err(), "the snapshot is corrupt");
    let asked = vec![a.id.clone(), b.id.clone(), "01a20a40-0000-7000-8000-000000000000".into()];
    let ids = store.existing_sessions(asked).await.unwrap();
    assert_eq!(ids, [a.id, b.id].into_iter().collect(), "the two stored ones, not the unknown one");
    assert!(store.existing_sessions(Vec::new()).await.unwrap().is_empty());
}

/// Recovery's query leaves out exactly the sessions certainly at rest, and counts every
/// active session: each way a session can need recovering brings it back.
#[tokio::test]
async fn recovery_candidates_leave_out_only_sessions_at_rest() {
    let (_dir, store) = open();
    let task = store.create_task("t".into(), String::new()).await.unwrap();
    // One session per case: (name, session state, session runtime, record runtime, status, pid).
    let cases = [
        (
            "at rest",
            SessionState::WaitingForInput,
            "standalone",
            "standalone",
            ExecutionStatus::Stopped,
            Some(10),
        ),
        (
            "at rest, exited",
            SessionState::WaitingForInput,
            "standalone",
            "standalone",
            ExecutionStatus::Exited,
            None,
        ),
        (
            "running record",
            SessionState::WaitingForInput,
            "standalone",
            "standalone",
            ExecutionStatus::Running,
            None,
        ),
        (
            "launching record",
            SessionState::WaitingForInput,
            "standalone",
            "standalone",
            ExecutionStatus::Launching,
            None,
        ),
        (
            "session running",
            SessionState::Running,
            "standalone",
            "standalone",
            ExecutionStatus::Stopped,
            None,
        ),
        (
            "session starting",
            SessionState::Starting,
            "standalone",
            "standalone",
            ExecutionStatus::Dead,
            None,
        ),
        (
            "docker session",
            SessionState::WaitingForInput,
            "docker",
            "docker",
            ExecutionStatus::Stopped,
            None,
        ),
        (
            "docker record",
            SessionState::WaitingForInput,
            "standalone",
            "docker",
            ExecutionStatus::Lost,
            None,
        ),
        (
            "open turn",
            SessionState::WaitingForInput,
            "standalone",
            "standalone",
            ExecutionStatus::Stopped,
            None,
        ),
        (
            "pending request",
            SessionState::WaitingForInput,
            "standalone",
            "standalone",
            ExecutionStatus::Stopped,
            None,
        ),
        (
            "live pid",
            SessionState::WaitingForInput,
            "standalone",
            "standalone",
            ExecutionStatus::Stopped,
            Some(4242),
        ),
        (
            "live state dir",
            SessionState::WaitingForInput,
            "standalone",
            "standalone",
            ExecutionStatus::Stopped,
            None,
        ),
        (
            "ended",
            SessionState::Completed,
            "standalone",
            "standalone",
            ExecutionStatus::Running,
            None,
        ),
    ];
    let mut ids = std::collections::HashMap::new();
    for (name, state, runtime, record_runtime, status, pid) in cases {
        let mut row = session(&task.id);
        row.runtime = runtime.into();
        let row = store.create_session(row).await.unwrap();
        store.set_session_state(row.id.clone(), state, None, None, 0).await.unwrap();
        store
            .put_execution(ExecutionRow {
                runtime: record_runtime.into(),
                status,
                agentctl_pid: pid,
                ..ExecutionRow::new(row.id.clone(), format!("e-{name}").into())
            })
            .await
            .unwrap();
        ids.insert(name, row.id);
    }
    let (open_turn, pending) = (ids["open turn"].clone(), ids["pending request"].clone());
    store
        .insert_turn(
            "t1".into(),
            open_turn,
            "e-open turn".into(),
            "r1".into(),
            ("p".into(), None, None),
        )
        .await
        .unwrap();
    let execution = "e-pending request".to_owned();
    let params = serde_json::json!({});
    store.insert_pending(pending, execution.into(), "7".into(), "x".into(), params).await.unwrap();
    // A session with no runtime record yet is active but no candidate.
    let unlaunched = store.create_session(session(&task.id)).await.unwrap();
    store
        .set_session_state(unlaunched.id, SessionState::WaitingForInput, None, None, 0)
        .await
        .unwrap();

    let live_pids = [4242].into_iter().collect();
    let live_sessions = vec![ids["live state dir"].clone()];
    let (candidates, active) =
        store.recovery_candidates("standalone", &live_pids, live_sessions).await.unwrap();
    let found: std::collections::HashSet<&str> = candidates
        .iter()
        .map(|c| *ids.iter().find(|(_, id)| **id == c.execution.session_id).unwrap().0)
        .collect();
    let expected: std::collections::HashSet<&str> = [
        "running record",
        "launching record",
        "session running",
        "session starting",
        "docker session",
        "docker record",
        "open turn",
        "pending request",
        "live pid",
        "live state dir",
    ]
    .into_iter()
    .collect();
    assert_eq!(found, expected);
    assert_eq!(active, 13, "12 active with a record, and the one without");
    let work = |name: &str| {
        candidates.iter().find(|c| c.execution.session_id == ids[name]).unwrap().open_work
    };
    assert!(work("open turn") && work("pending request") && !work("live pid"));
    // Nothing live: the two kept only for their sidecar are at rest.
    let (candidates, _) =
        store.recovery_candidates("standalone", &Default::default(), Vec::new()).await.unwrap();
    assert_eq!(candidates.len(), expected.len() - 2);
}

/// The query never reads every session or every runtime record: each table is searched
/// through an index (a scan of `turns` reads only the running ones, through its partial
/// index; `pending_requests` holds only requests waiting for a person).
#[tokio::test]
async fn recovery_candidates_search_indexes_instead_of_scanning_tables() {
    let (_dir, store) = open();
    let plan: Vec<String> = store
        .call(|conn| {
            let mut stmt =
                conn.prepare(&format!("EXPLAIN QUERY PLAN {}", recovery_candidates_sql()))?;
            let rows =
                stmt.query_map(params!["standalone", "[]", "[]", "[]"], |r| r.get::<_, String>(3))?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
        .unwrap();
    for step in &plan {
        let full_scan = ["task_sessions", "executors_running"]
            .iter()
            .any(|table| step.starts_with(&format!("SCAN {table}")))
            || (step.starts_with("SCAN turns") && !step.contains("turns_running"));
        assert!(!full_scan, "a full scan in the recovery query: {step}\n{plan:#?}");
    }
    assert!(plan.iter().any(|step| step.contains("task_sessions_by_state_runtime")), "{plan:#?}");
}

/// The opened session is recorded in one write, only for the current execution; a fresh
/// start keeps what a resume recorded before (outcome, injection flag) untouched.
#[tokio::test]
async fn an_opened_session_is_recorded_at_once_for_the_current_execution_only() {
    let (_dir, store) = open();
    let task = store.create_task("t".into(), String::new()).await.unwrap();
    let row = store.create_session(session(&task.id)).await.unwrap();
    let record = |execution: &str| ExecutionRow {
        runtime: "standalone".into(),
        status: ExecutionStatus::Starting,
        ..ExecutionRow::new(row.id.clone(), execution.into())
    };
    store.put_execution(record("e1")).await.unwrap();
    let resumed = Opened {
        resume_token: Some("tok".into()),
        acp_session_id: "acp-1".into(),
        outcome: Some(ResumeOutcome::HistoryInjection),
        inject_history: true,
    };
    assert!(store.record_opened(row.id.clone(), "e1".into(), resumed).await.unwrap());
    let now = store.get_execution(row.id.clone()).await.unwrap().unwrap();
    assert_eq!(now.status, ExecutionStatus::Running);
    assert_eq!(now.resume_token.as_deref(), Some("tok"));
    assert_eq!(now.acp_session_id.as_deref(), Some("acp-1"));
    assert_eq!(now.resume_outcome, Some(ResumeOutcome::HistoryInjection));
    assert!(now.resume_context_pending);
    // A stale execution changes nothing.
    let stale = Opened { acp_session_id: "stale".into(), ..Default::default() };
    assert!(!store.record_opened(row.id.clone(), "e0".into(), stale).await.unwrap());
    let same = store.get_execution(row.id.clone()).await.unwrap().unwrap();
    assert_eq!(same.acp_session_id.as_deref(), Some("acp-1"));
    // No resume: the token is what the profile keeps (none here); the rest stays.
    let fresh = Opened { acp_session_id: "acp-2".into(), ..Default::default() };
    assert!(store.record_opened(row.id.clone(), "e1".into(), fresh).await.unwrap());
    let now = store.get_execution(row.id.clone()).await.unwrap().unwrap();
    assert_eq!((now.resume_token, now.acp_session_id.as_deref()), (None, Some("acp-2")));
    assert_eq!(now.resume_outcome, Some(ResumeOutcome::HistoryInjection));
    assert!(now.resume_context_pending);
}

/// Migration 5 rebuilds `task_sessions` (for `PAUSED`): a database of version 4 keeps every
/// row, its references and its cascades, and takes the new state.
#[tokio::test]
async fn migration_5_keeps_sessions_and_their_references() {
    let (_dir, path) = database_at(
        4,
        "INSERT INTO tasks VALUES ('t', 'T', '', 'TODO', 0, 0);
         INSERT INTO task_sessions VALUES ('s', 't', 'mock', '{}', 'standalone', 'WAITING_FOR_INPUT', '/w', NULL, 0, 0);
         INSERT INTO executors_running (session_id, execution_id, generation, runtime, status, created_at, updated_at)
             VALUES ('s', 'e', 1, 'standalone', 'stopped', 0, 0);
         INSERT INTO turns (id, session_id, execution_id, request_id, state, started_at) VALUES ('u', 's', 'e', '1', 'completed', 0);",
    );
    let store = Store::open(&path).unwrap();
    let row = store.get_session("s".into()).await.unwrap();
    assert_eq!(row.state, SessionState::WaitingForInput);
    assert!(store.get_execution("s".into()).await.unwrap().is_some());
    store.set_paused("s".into(), paused(None), 0).await.unwrap();
    assert_eq!(store.get_session("s".into()).await.unwrap().state, SessionState::Paused);
    let fk: i64 = store
        .call(|conn| Ok(conn.query_row("PRAGMA foreign_keys", [], |r| r.get(0))?))
        .await
        .unwrap();
    assert_eq!(fk, 1, "foreign keys are on again after the migrations");
    // The references still point at the rebuilt table: deleting cascades.
    store.delete_session("s".into()).await.unwrap();
    let left: i64 = store
        .call(|conn| {
            Ok(conn.query_row(
                "SELECT (SELECT count(*) FROM executors_running) + (SELECT count(*) FROM turns)",
                [],
                |r| r.get(0),
            )?)
        })
        .await
        .unwrap();
    assert_eq!(left, 0, "the session's rows went with it");
}

/// A pause request is kept, listed and dropped when the session is paused.
#[tokio::test]
async fn a_pause_request_is_kept_until_the_session_is_paused() {
    let (_dir, store) = open();
    let task = store.create_task("t".into(), String::new()).await.unwrap();
    let row = store.create_session(session(&task.id)).await.unwrap();
    assert_eq!(store.get_pause(row.id.clone()).await.unwrap(), None);
    let request = PauseRequest {
        reason: Some("why".into()),
        force_at: 42,
        requested_at: 40,
        trigger: SnapshotTrigger::Pause,
        summary_asked_at: None,
    };
    store.put_pause(row.id.clone(), request.clone()).await.unwrap();
    assert_eq!(store.get_pause(row.id.clone()).await.unwrap(), Some(request.clone()));
    assert_eq!(store.pauses().await.unwrap(), vec![(row.id.clone(), request.clone())]);
    // Asking the agent for a summary is kept with the request, with the turn's own wait.
    assert!(store.pause_summary_asked(row.id.clone(), 7, 99).await.unwrap());
    let asked = PauseRequest { summary_asked_at: Some(7), force_at: 99, ..request };
    assert_eq!(store.get_pause(row.id.clone()).await.unwrap(), Some(asked.clone()));
    assert_eq!(store.pauses().await.unwrap(), vec![(row.id.clone(), asked)]);
    store.set_paused(row.id.clone(), paused(None), 0).await.unwrap();
    assert!(!store.pause_summary_asked(row.id.clone(), 8, 99).await.unwrap());
    assert_eq!(store.get_session(row.id.clone()).await.unwrap().state, SessionState::Paused);
    assert!(store.pauses().await.unwrap().is_empty());
    let unknown = store.set_paused("nope".into(), paused(None), 0).await.unwrap_err();
    assert!(matches!(unknown, StoreError::NotFound { .. }), "{unknown:?}");
}

fn paused(handoff: Option<&str>) -> PausedRecord {
    PausedRecord {
        reason: Some("why".into()),
        trigger: if handoff.is_some() {
            SnapshotTrigger::Exhaustion
        } else {
            SnapshotTrigger::Pause
        },
        forced: false,
        handoff: handoff.map(str::to_owned),
    }
}

fn kinds(rows: &[LogRow]) -> Vec<String> {
    rows.iter()
        .map(|(_, _, json)| {
            let value: serde_json::Value = serde_json::from_str(json).unwrap();
            value["kind"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// Each change that the timeline records writes its row with it, in order; `after` pages.
#[tokio::test]
async fn the_timeline_records_each_change_in_order() {
    let (_dir, store) = open();
    let task = store.create_task("t".into(), String::new()).await.unwrap();
    let row = store.create_session(session(&task.id)).await.unwrap();
    let id = row.id.clone();
    store.put_execution(execution_row(&id, "e1")).await.unwrap();
    store.put_execution(execution_row(&id, "e1")).await.unwrap();
    store
        .set_session_state(id.clone(), SessionState::WaitingForInput, None, None, 0)
        .await
        .unwrap();
    store
        .insert_turn("u1".into(), id.clone(), "e1".into(), "1".into(), ("p".into(), None, None))
        .await
        .unwrap();
    store.end_turn("u1".into(), TurnState::Failed, None, Some("boom".into())).await.unwrap();
    store.log_error(id.clone(), "the agent exited".into()).await.unwrap();
    store.put_execution(execution_row(&id, "e2")).await.unwrap();
    let resumed = Opened {
        acp_session_id: "a".into(),
        outcome: Some(ResumeOutcome::NativeLoad),
        ..Default::default()
    };
    store.record_opened(id.clone(), "e2".into(), resumed).await.unwrap();
    let pause = PauseRequest {
        reason: None,
        force_at: 9,
        requested_at: 1,
        trigger: SnapshotTrigger::Pause,
        summary_asked_at: None,
    };
    store.put_pause(id.clone(), pause).await.unwrap();
    store.set_paused(id.clone(), paused(None), 0).await.unwrap();
    let rows = store.timeline(id.clone(), 0, 100).await.unwrap();
    assert_eq!(
        kinds(&rows),
        [
            "execution_started",
            "state",
            "turn_started",
            "turn_ended",
            "error",
            "execution_started",
            "resumed",
            "pause_requested",
            "state",
            "paused"
        ]
    );
    // Writing the same execution again is not a new one.
    assert!(rows[5].2.contains("\"generation\":2"), "{}", rows[5].2);
    let after = store.timeline(id.clone(), rows[6].0, 2).await.unwrap();
    assert_eq!(kinds(&after), ["pause_requested", "state"]);
    // The rows go with the session.
    store.delete_session(id.clone()).await.unwrap();
    assert!(store.timeline(id, 0, 100).await.unwrap().is_empty());
}

/// Snapshots are stored, listed and read back; a session keeps its newest turn snapshots
/// only; an exhaustion's handoff stays until a handoff's resume opens.
#[tokio::test]
async fn snapshots_and_handoffs_are_kept_as_documented() {
    let (_dir, store) = open();
    let task = store.create_task("t".into(), String::new()).await.unwrap();
    let row = store.create_session(session(&task.id)).await.unwrap();
    let id = row.id.clone();
    let snapshot = |n: usize, trigger| protocol::api::Snapshot {
        snapshot_id: format!("snap-{n:03}"),
        session_id: id.to_string(),
        trigger,
        reason: None,
        taken_at: n as i64,
        execution_id: None,
        generation: None,
        task: protocol::api::SnapshotTask {
            task_id: task.id.clone(),
            title: "t".into(),
            description: String::new(),
        },
        git: Default::default(),
        turns: vec![],
        turns_omitted: 0,
        errors: vec![],
        usage: protocol::api::SnapshotUsage { context_used: Some(n as u64), ..Default::default() },
        plan: vec![],
        plan_at: None,
        tests: None,
        summary: None,
        checkpoint: None,
    };
    store.insert_snapshot(snapshot(0, SnapshotTrigger::Crash)).await.unwrap();
    for n in 1..=TURN_SNAPSHOTS_KEPT + 5 {
        store.insert_snapshot(snapshot(n, SnapshotTrigger::TurnComplete)).await.unwrap();
    }
    let last = TURN_SNAPSHOTS_KEPT + 6;
    store.insert_snapshot(snapshot(last, SnapshotTrigger::Exhaustion)).await.unwrap();
    let list = store.snapshots(id.clone()).await.unwrap();
    assert_eq!(list.len(), TURN_SNAPSHOTS_KEPT + 2);
    assert_eq!(list[0].trigger, SnapshotTrigger::Crash);
    assert_eq!(list[1].snapshot_id, "snap-006", "the oldest turn snapshots went");
    assert_eq!(list.last().unwrap().context_used, Some(last as u64));
    let latest = store.latest_snapshot(id.clone()).await.unwrap().unwrap();
    assert_eq!(latest, snapshot(last, SnapshotTrigger::Exhaustion));
    // A resume compiles from the newest; of one millisecond, a pause's before a turn's.
    let same_ms = protocol::api::Snapshot {
        snapshot_id: "snap-zzz".into(),
        ..snapshot(last, SnapshotTrigger::TurnComplete)
    };
    store.insert_snapshot(same_ms).await.unwrap();
    assert_eq!(store.latest_snapshot(id.clone()).await.unwrap(), Some(latest.clone()));
    let later = snapshot(last + 1, SnapshotTrigger::TurnComplete);
    store.insert_snapshot(later.clone()).await.unwrap();
    assert_eq!(store.latest_snapshot(id.clone()).await.unwrap(), Some(later));
    assert_eq!(store.snapshot("snap-003".into()).await.unwrap(), None);
    assert_eq!(store.snapshot("nope".into()).await.unwrap(), None);
    // The handoff.
    store.set_paused(id.clone(), paused(Some(&latest.snapshot_id)), 0).await.unwrap();
    assert_eq!(store.handoff(id.clone()).await.unwrap(), Some(latest.snapshot_id.clone()));
    store.put_execution(execution_row(&id, "e1")).await.unwrap();
    let injected = Opened {
        acp_session_id: "a".into(),
        outcome: Some(ResumeOutcome::HistoryInjection),
        inject_history: true,
        ..Default::default()
    };
    store.record_opened(id.clone(), "e1".into(), injected).await.unwrap();
    assert!(store.handoff(id.clone()).await.unwrap().is_some(), "only a handoff clears it");
    let handed = Opened {
        acp_session_id: "b".into(),
        outcome: Some(ResumeOutcome::ContextHandoff),
        inject_history: true,
        ..Default::default()
    };
    store.record_opened(id.clone(), "e1".into(), handed).await.unwrap();
    assert_eq!(store.handoff(id.clone()).await.unwrap(), None);
    // The start commit: the first recorded stays.
    assert_eq!(store.start_commit(id.clone()).await.unwrap(), None);
    store.set_start_commit(id.clone(), Some("c1".into()), Default::default()).await.unwrap();
    store.set_start_commit(id.clone(), Some("c2".into()), Default::default()).await.unwrap();
    assert_eq!(store.start_commit(id.clone()).await.unwrap(), Some(Some("c1".into())));
}

/// Migration 6 keeps a waiting pause request of version 5 (as a plain pause).
#[tokio::test]
async fn migration_6_keeps_pause_requests() {
    let (_dir, path) = database_at(
        5,
        "INSERT INTO tasks VALUES ('t', 'T', '', 'TODO', 0, 0);
         INSERT INTO task_sessions VALUES ('s', 't', 'mock', '{}', 'standalone', 'RUNNING', '/w', NULL, 0, 0);
         INSERT INTO session_pauses VALUES ('s', 'why', 42, 1);",
    );
    let store = Store::open(&path).unwrap();
    let expected = PauseRequest {
        reason: Some("why".into()),
        force_at: 42,
        requested_at: 1,
        trigger: SnapshotTrigger::Pause,
        summary_asked_at: None,
    };
    assert_eq!(store.get_pause("s".into()).await.unwrap(), Some(expected));
}

fn execution_row(session_id: &SessionId, execution_id: &str) -> ExecutionRow {
    ExecutionRow {
        runtime: "standalone".into(),
        ..ExecutionRow::new(session_id.clone(), execution_id.into())
    }
}

/// A database file migrated to `version` only (as an older build left it), holding `rows`.
fn database_at(version: usize, rows: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
    )
    .unwrap();
    for (idx, sql) in MIGRATIONS.iter().take(version).enumerate() {
        conn.execute_batch(sql).unwrap();
        conn.execute("INSERT INTO schema_migrations VALUES (?1, 0)", [idx + 1]).unwrap();
    }
    conn.execute_batch(rows).unwrap();
    (dir, path)
}

/// The rows recovery and `stop_all` read whole carry every session column, the ones added
/// by migration 8 included, and the execution after them (a join read by position once put
/// the execution where the new columns now are).
#[tokio::test]
async fn joined_reads_carry_the_new_session_columns_and_the_executor() {
    let (_dir, store) = open();
    let task = store.create_task("t".into(), String::new()).await.unwrap();
    let row = SessionRow {
        initial_prompt: Some("first words".into()),
        worktree_repo: Some("/src/project".into()),
        worktree_branch: Some("tether/t-0a1b2c3d".into()),
        ..session(&task.id)
    };
    let row = store.create_session(row).await.unwrap();
    assert_eq!(store.get_session(row.id.clone()).await.unwrap(), row);
    store.put_execution(execution_row(&row.id, "e1")).await.unwrap();
    store
        .set_session_state(row.id.clone(), SessionState::WaitingForInput, None, None, 0)
        .await
        .unwrap();
    let executions = store.active_executions().await.unwrap();
    assert_eq!(executions.len(), 1);
    let (session, execution) = &executions[0];
    assert_eq!(
        (session.initial_prompt.as_deref(), session.worktree_branch.as_deref()),
        (Some("first words"), Some("tether/t-0a1b2c3d"))
    );
    assert_eq!((execution.execution_id.as_str(), execution.runtime.as_str()), ("e1", "standalone"));
}

/// The control channel's endpoint is stored as the runtime returned it and read back as
/// is; a row from before endpoints were stored falls back to loopback and its port.
#[tokio::test]
async fn the_agentctl_endpoint_is_kept_as_the_runtime_returned_it() {
    let (_dir, store) = open();
    let task = store.create_task("t".into(), String::new()).await.unwrap();
    let row = store.create_session(session(&task.id)).await.unwrap();
    let stored = ExecutionRow {
        agentctl_port: Some(40123),
        agentctl_url: Some("10.1.2.3:40123".into()),
        ..execution_row(&row.id, "e1")
    };
    store.put_execution(stored).await.unwrap();
    let back = store.get_execution(row.id.clone()).await.unwrap().unwrap();
    assert_eq!(back.endpoint(), "10.1.2.3:40123".parse().unwrap());
    let older = ExecutionRow { agentctl_url: None, ..back.clone() };
    assert_eq!(older.endpoint(), "127.0.0.1:40123".parse().unwrap());
    let garbled = ExecutionRow { agentctl_url: Some("not an address".into()), ..back };
    assert_eq!(garbled.endpoint(), "127.0.0.1:40123".parse().unwrap());
}

#[tokio::test]
async fn a_queued_prompt_keeps_its_place_moves_and_leaves_with_its_turn_once() {
    let (_dir, store, id) = running_session().await;
    for (n, text) in ["a", "b", "c"].into_iter().enumerate() {
        let place = store.enqueue_prompt(id.clone(), text.into(), text.into()).await.unwrap();
        assert_eq!(place, n + 1);
    }
    let order = |queue: &protocol::api::PromptQueue| -> Vec<(String, usize)> {
        queue.prompts.iter().map(|p| (p.prompt.clone(), p.position)).collect()
    };
    // c to the front, a's text changed, b removed: places stay 1, 2, ….
    let queue = store.change_queued(id.clone(), "c".into(), None, Some(1)).await.unwrap();
    assert_eq!(order(&queue), [("c".into(), 1), ("a".into(), 2), ("b".into(), 3)]);
    let queue = store.change_queued(id.clone(), "a".into(), Some("a2".into()), None).await.unwrap();
    assert_eq!(order(&queue), [("c".into(), 1), ("a2".into(), 2), ("b".into(), 3)]);
    let queue = store.remove_queued(id.clone(), Some("b".into())).await.unwrap();
    assert_eq!(order(&queue), [("c".into(), 1), ("a2".into(), 2)]);
    let gone = store.remove_queued(id.clone(), Some("b".into())).await;
    assert!(matches!(gone, Err(StoreError::NotFound { .. })), "{gone:?}");
    // The head leaves with its turn; taken again, nothing is recorded.
    let turn = |turn: &str| (turn.into(), id.clone(), "e".into(), turn.into());
    let (t, s, e, r) = turn("t1");
    store.insert_turn(t, s, e, r, ("c".into(), None, Some("c".into()))).await.unwrap();
    let (t, s, e, r) = turn("t2");
    let twice = store.insert_turn(t, s, e, r, ("c".into(), None, Some("c".into()))).await;
    assert!(matches!(twice, Err(StoreError::NotFound { .. })), "{twice:?}");
    assert!(matches!(store.get_turn("t2".into()).await, Err(StoreError::NotFound { .. })));
    let queue = store.prompt_queue(id.clone()).await.unwrap();
    assert_eq!(order(&queue), [("a2".into(), 1)]);
    // Halted and let run again; cleared.
    store.halt_queue(id.clone(), Some("turn t1 failed".into())).await.unwrap();
    assert_eq!(
        store.prompt_queue(id.clone()).await.unwrap().halted.as_deref(),
        Some("turn t1 failed")
    );
    store.halt_queue(id.clone(), None).await.unwrap();
    let queue = store.remove_queued(id.clone(), None).await.unwrap();
    assert!(queue.prompts.is_empty() && queue.halted.is_none(), "{queue:?}");
}

#[tokio::test]
async fn a_steer_queues_ahead_of_prompts_and_behind_earlier_steers() {
    let (_dir, store) = open();
    let task = store.create_task("t".into(), String::new()).await.unwrap();
    let id = store.create_session(session(&task.id)).await.unwrap().id;
    for text in ["a", "b"] {
        store.enqueue_prompt(id.clone(), text.into(), text.into()).await.unwrap();
    }
    let steer = |prompt: &str, of: &str| {
        store.enqueue_steer(id.clone(), prompt.into(), prompt.into(), of.into())
    };
    let queue = steer("s1", "t1").await.unwrap();
    let order = |queue: &protocol::api::PromptQueue| -> Vec<(String, usize, Option<String>)> {
        queue.prompts.iter().map(|p| (p.prompt.clone(), p.position, p.steer_of.clone())).collect()
    };
    assert_eq!(
        order(&queue),
        [("s1".into(), 1, Some("t1".into())), ("a".into(), 2, None), ("b".into(), 3, None)]
    );
    let queue = steer("s2", "t2").await.unwrap();
    assert_eq!(
        order(&queue).into_iter().map(|(p, n, _)| (p, n)).collect::<Vec<_>>(),
        [("s1".into(), 1), ("s2".into(), 2), ("a".into(), 3), ("b".into(), 4)]
    );
    // What the store holds is what it answered.
    assert_eq!(store.prompt_queue(id.clone()).await.unwrap(), queue);
}

/// A note for the agent goes with the next prompt, tied to its turn, and is gone once that
/// prompt reached the agent; a turn that ended before reaching it leaves the note to the
/// next prompt, and a prompt sent again carries its turn's.
#[tokio::test]
async fn a_note_for_the_agent_goes_once_a_prompt_carrying_it_was_delivered() {
    let (_dir, store, id) = running_session().await;
    store.reverted(id.clone(), "a.txt".into(), "a was reverted".into()).await.unwrap();
    let notes = store.agent_notes(id.clone(), None).await.unwrap();
    let ids: Vec<i64> = notes.iter().map(|(id, _)| *id).collect();
    assert_eq!(notes.iter().map(|(_, n)| n.as_str()).collect::<Vec<_>>(), ["a was reverted"]);
    let turn = |t: &str, r: &str| (t.into(), id.clone(), "e".into(), r.to_owned());
    store
        .insert_turn_telling(turn("t1", "1"), ("p".into(), None, None), ids.clone())
        .await
        .unwrap();
    // Carried by a turn not yet delivered: not the next prompt's, but t1's if sent again.
    assert!(store.agent_notes(id.clone(), None).await.unwrap().is_empty());
    assert_eq!(store.agent_notes(id.clone(), Some("t1".into())).await.unwrap(), notes);
    // t1 ended before reaching the agent: the next prompt carries the note.
    store.end_turn("t1".into(), TurnState::Failed, None, Some("lost".into())).await.unwrap();
    assert_eq!(store.agent_notes(id.clone(), None).await.unwrap(), notes);
    store.insert_turn_telling(turn("t2", "2"), ("q".into(), None, None), ids).await.unwrap();
    store.mark_delivered("t2".into()).await.unwrap();
    assert!(store.agent_notes(id.clone(), None).await.unwrap().is_empty());
    assert!(store.agent_notes(id.clone(), Some("t2".into())).await.unwrap().is_empty());
    // A rewind that restores the workspace drops what is still to be told (untrue now);
    // one that does not keeps it.
    store.reverted(id.clone(), "b.txt".into(), "b was reverted".into()).await.unwrap();
    let rewind = |n: &str, restored: bool| crate::store::RewindRow {
        id: n.into(),
        session_id: id.clone(),
        turn_id: "t2".into(),
        seqs: (1, 0),
        workspace_restored: restored,
        saved_ref: None,
        created_at: 1,
    };
    store.record_rewind(rewind("r1", false), Vec::new()).await.unwrap();
    assert_eq!(store.agent_notes(id.clone(), None).await.unwrap().len(), 1);
    store.record_rewind(rewind("r2", true), Vec::new()).await.unwrap();
    assert!(store.agent_notes(id, None).await.unwrap().is_empty());
}

/// A store with a session whose execution `e` runs (a local process).
async fn running_session() -> (tempfile::TempDir, Store, SessionId) {
    let (dir, store) = open();
    let task = store.create_task("t".into(), String::new()).await.unwrap();
    let id = store.create_session(session(&task.id)).await.unwrap().id;
    store
        .put_execution(ExecutionRow {
            runtime: "standalone".into(),
            status: ExecutionStatus::Running,
            ..ExecutionRow::new(id.clone(), "e".into())
        })
        .await
        .unwrap();
    (dir, store, id)
}
