//! The session record against a real SQLite file and a real event log: what it publishes,
//! with which marks, and that events go out before the rows change — with no actor.

use crate::ids::SessionId;
use std::sync::Arc;

use agentctl::spool::Spool;
use protocol::api::{SessionState, SnapshotTrigger, TurnState};
use serde_json::json;

use super::{Mark, RecordError, SessionRecord, TurnEnd};
use crate::events::{SessionEvent, SessionEventKind};
use crate::store::Store;

struct Setup {
    dir: tempfile::TempDir,
    store: Store,
    session_id: SessionId,
    record: SessionRecord,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("state.db")).unwrap();
    let session_id = store.test_session(SessionState::Running, dir.path(), json!({})).await.id;
    let log = Arc::new(Spool::open(&dir.path().join("events"), 1 << 20).unwrap());
    let record = SessionRecord::new(session_id.clone(), store.clone(), log);
    Setup { dir, store, session_id, record }
}

/// Every event in the log, in order.
async fn logged(record: &SessionRecord) -> Vec<SessionEvent> {
    let log = record.log();
    let mut reader = log.reader(0).unwrap();
    let mut events = Vec::new();
    for _ in 0..log.last_seq() {
        events.push(reader.next().await.unwrap());
    }
    events
}

fn notice(text: &str) -> SessionEventKind {
    SessionEventKind::Notice { message: text.into() }
}

#[tokio::test]
async fn published_events_carry_their_marks_and_the_newest_mark_reads_back_per_execution() {
    let s = setup().await;
    s.record.publish(vec![notice("a"), notice("b")], Mark::default()).unwrap();
    assert_eq!(s.record.events_mark(1), 0, "no agent event caused these");
    let mark = Mark { agent_seq: Some(40), generation: Some(2) };
    s.record.publish(vec![notice("c"), notice("d")], mark).unwrap();
    assert_eq!(s.record.events_mark(2), 40);
    assert_eq!(s.record.events_mark(3), 0, "a mark counts only for its own execution");
    let events = logged(&s.record).await;
    let marks: Vec<_> =
        events.iter().map(|e| (e.seq, e.agent_seq, e.generation, e.batch_last)).collect();
    assert_eq!(
        marks,
        [
            (1, None, None, Some(2)),
            (2, None, None, Some(2)),
            (3, Some(40), Some(2), Some(4)),
            (4, Some(40), Some(2), Some(4)),
        ]
    );
    // Nothing to publish writes nothing.
    s.record.publish(Vec::new(), mark).unwrap();
    assert_eq!(s.record.log().last_seq(), 4);
}

#[tokio::test]
async fn voiding_open_work_publishes_every_end_before_the_rows_change() {
    let s = setup().await;
    let id = s.session_id.clone();
    for turn in ["t1", "t2"] {
        s.store
            .insert_turn(
                turn.into(),
                id.clone(),
                "e1".into(),
                turn.into(),
                ("p".into(), None, None),
            )
            .await
            .unwrap();
    }
    let params = json!({"toolCall": {"title": "ls"}});
    for request in ["1.7", "1.8"] {
        let method = "session/request_permission".to_owned();
        s.store
            .insert_pending(id.clone(), "e1".into(), request.into(), method, params.clone())
            .await
            .unwrap();
    }
    let then = vec![notice("after")];
    let (turns, questions) = s.record.void_open_work("gone", then, Mark::default()).await.unwrap();
    assert_eq!((turns, questions), (2, 2));
    let kinds: Vec<String> = logged(&s.record)
        .await
        .into_iter()
        .map(|event| match event.kind {
            SessionEventKind::PermissionResolved { request_id, outcome } => {
                format!("{request_id} {}", outcome["outcome"].as_str().unwrap())
            }
            SessionEventKind::TurnEnded { turn_id, state, error, .. } => {
                format!("{turn_id} {state} {}", error.unwrap_or_default())
            }
            SessionEventKind::Notice { message } => message,
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        ["1.7 cancelled", "1.8 cancelled", "t1 interrupted gone", "t2 interrupted gone", "after"]
    );
    assert!(s.store.running_turns(id.clone()).await.unwrap().is_empty());
    assert!(s.store.list_pending(id.clone()).await.unwrap().is_empty());
    let states: Vec<TurnState> =
        s.store.session_turns(id.clone()).await.unwrap().iter().map(|t| t.state).collect();
    assert_eq!(states, [TurnState::Interrupted, TurnState::Interrupted]);
    // Nothing open: nothing more to say, and nothing fails.
    assert_eq!(
        s.record.void_open_work("again", Vec::new(), Mark::default()).await.unwrap(),
        (0, 0)
    );
    assert_eq!(s.record.void_questions(Mark::default()).await.unwrap(), 0);
    assert_eq!(s.record.log().last_seq(), 5);
}

#[tokio::test]
async fn a_state_change_is_published_then_stored_and_a_failed_publish_still_stores_it() {
    let s = setup().await;
    let id = s.session_id.clone();
    let error = Some("why".to_owned());
    s.record
        .set_state(SessionState::WaitingForInput, error.clone(), None, Mark::default(), None)
        .await
        .unwrap();
    let row = s.store.get_session(id.clone()).await.unwrap();
    assert_eq!((row.state, row.error_message), (SessionState::WaitingForInput, error.clone()));
    let events = logged(&s.record).await;
    assert!(matches!(
        &events[0].kind,
        SessionEventKind::State { state: SessionState::WaitingForInput, error: e } if *e == error
    ));
    // The log cannot be written (its directory is gone and a file stands in its place).
    let events_dir = s.dir.path().join("events");
    std::fs::remove_dir_all(&events_dir).unwrap();
    std::fs::write(&events_dir, "not a directory").unwrap();
    s.record.log().release();
    let failed =
        s.record.set_state(SessionState::Completed, None, None, Mark::default(), None).await;
    assert!(matches!(failed, Err(RecordError::Log(_))), "{failed:?}");
    assert_eq!(s.store.get_session(id).await.unwrap().state, SessionState::Completed);
}

#[tokio::test]
async fn a_pause_without_an_actor_snapshots_publishes_and_records_it() {
    let s = setup().await;
    let id = s.session_id.clone();
    let history = s.dir.path().join("history.jsonl");
    let request = crate::snapshot::Request {
        session_id: id.clone(),
        trigger: SnapshotTrigger::Exhaustion,
        reason: Some("full".into()),
        history,
        execution_id: None,
        usage: None,
        summary: None,
        taken_at: None,
    };
    let reason = Some("full".to_owned());
    s.record
        .pause(request, reason.clone(), SnapshotTrigger::Exhaustion, true, Mark::default())
        .await
        .unwrap();
    let events = logged(&s.record).await;
    let snapshot_id = match &events[0].kind {
        SessionEventKind::SnapshotTaken { snapshot_id, trigger } => {
            assert_eq!(*trigger, SnapshotTrigger::Exhaustion);
            snapshot_id.clone()
        }
        other => panic!("a snapshot first, not {other:?}"),
    };
    assert!(matches!(events[1].kind, SessionEventKind::State { state: SessionState::Paused, .. }));
    assert!(matches!(
        &events[2].kind,
        SessionEventKind::Paused { reason: r, forced: true, .. } if *r == reason
    ));
    let row = s.store.get_session(id.clone()).await.unwrap();
    assert_eq!(row.state, SessionState::Paused);
    // An exhaustion's snapshot primes the next resume's fresh agent session.
    assert_eq!(s.store.handoff(id).await.unwrap(), Some(snapshot_id));
}

#[tokio::test]
async fn a_turns_end_says_the_turn_then_the_state_and_stores_both_in_one_write() {
    let s = setup().await;
    let id = s.session_id.clone();
    s.store
        .insert_turn("t1".into(), id.clone(), "e1".into(), "7".into(), ("p".into(), None, None))
        .await
        .unwrap();
    let end = TurnEnd {
        turn_id: "t1".into(),
        state: TurnState::Completed,
        stop_reason: Some("end_turn".into()),
        error: None,
        then: Some((SessionState::WaitingForInput, None, None)),
    };
    let events = end.events();
    assert!(matches!(&events[0], SessionEventKind::TurnEnded { turn_id, .. } if turn_id == "t1"));
    assert!(matches!(
        events[1],
        SessionEventKind::State { state: SessionState::WaitingForInput, error: None }
    ));
    assert_eq!(events.len(), 2);
    s.record.publish(events, Mark::default()).unwrap();
    s.record.end_turn(end, None, Default::default()).await.unwrap();
    let row = s.store.get_session(id.clone()).await.unwrap();
    assert_eq!(row.state, SessionState::WaitingForInput);
    let turns = s.store.session_turns(id.clone()).await.unwrap();
    assert_eq!(turns[0].state, TurnState::Completed);
    // The row holds the log's height it was written at: a replay publishes nothing twice.
    assert_eq!(s.store.event_seq_high(id.clone()).await.unwrap(), 2);

    // A turn that leaves the state as it is says only its end.
    let unchanged = TurnEnd { then: None, state: TurnState::Failed, ..endless("t2") };
    assert_eq!(unchanged.events().len(), 1);
}

fn endless(turn_id: &str) -> TurnEnd {
    TurnEnd {
        turn_id: turn_id.into(),
        state: TurnState::Completed,
        stop_reason: None,
        error: None,
        then: None,
    }
}
