//! The actor's state machine against in-memory fakes: a runtime that records fences, and a
//! sidecar whose scripted agent answers `initialize`, `session/new` and prompts. Real
//! SQLite and real files; no processes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agentctl::client::ClientError;
use agentctl::spool::Spool;
use protocol::control::{Event, EventKind, ExitInfo};
use serde_json::json;

use super::{Phase, SessionContext, SessionHandle, Start, start_session};
use crate::runtime::Runtime;
use crate::sidecar::Connector;
use crate::sidecar::fake::{FakeConnector, FakeRuntime, FakeSidecar, Mode};
use crate::store::{ExecutionRow, SessionRow, SessionState, Store};

struct Setup {
    handle: SessionHandle,
    runtime: Arc<FakeRuntime>,
    connector: Arc<FakeConnector>,
    /// The daemon's launches, retires and fences in flight (a shutdown closes it).
    teardowns: tokio_util::task::TaskTracker,
    dir: tempfile::TempDir,
}

async fn start(mode: Mode) -> Setup {
    start_with(mode, SessionState::Created, |_, _| async { Start::Fresh { initial_prompt: None } })
        .await
}

/// A session in `state`, its actor begun as `begin` says (given the store and the row, it
/// may record what the start needs first).
async fn start_with<F>(
    mode: Mode,
    state: SessionState,
    begin: impl FnOnce(Store, SessionRow) -> F,
) -> Setup
where
    F: std::future::Future<Output = Start>,
{
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("state.db")).unwrap();
    let profile = agents::registry::Registry::builtin_only().get("mock").unwrap();
    let snapshot = serde_json::to_value(&*profile).unwrap();
    let row = store.test_session(state, dir.path(), snapshot).await;
    let session_dir = dir.path().join("sessions").join(&row.id);
    std::fs::create_dir_all(&session_dir).unwrap();
    let runtime = Arc::new(FakeRuntime::default());
    let connector = Arc::new(FakeConnector::new(mode));
    let context = SessionContext {
        store,
        runtime: Arc::clone(&runtime) as Arc<dyn Runtime>,
        dir: session_dir.clone(),
        resolve: Arc::new(|name| Some(vec![name.into()])),
        agent_home: dir.path().to_owned(),
        ready_timeout: Duration::from_secs(5),
        agent_state_root: dir.path().join("agent-state"),
        connector: Arc::clone(&connector) as Arc<dyn Connector>,
        event_log_retain_bytes: crate::events::DEFAULT_RETAIN_BYTES,
        idle_timeout: None,
        default_sandbox: None,
        pool: None,
        teardowns: tokio_util::task::TaskTracker::new(),
        checkpoints: Arc::default(),
    };
    let events = Arc::new(Spool::open(&session_dir.join("events"), 1 << 22).unwrap());
    let how = begin(context.store.clone(), row.clone()).await;
    let teardowns = context.teardowns.clone();
    let handle = start_session(context, row, profile, events, how).unwrap();
    Setup { handle, runtime, connector, teardowns, dir }
}

async fn until(handle: &SessionHandle, what: impl Fn(&super::SessionView) -> bool) {
    let mut view = handle.watch();
    tokio::time::timeout(Duration::from_secs(10), view.wait_for(|view| what(view)))
        .await
        .expect("the session got there in time")
        .expect("the actor is alive");
}

#[tokio::test]
async fn nothing_of_a_coalescing_message_is_acknowledged_before_it_is_written() {
    let setup = start(Mode::Streams(1000)).await;
    until(&setup.handle, |view| view.phase == Phase::Open).await;
    setup.handle.prompt("hi".into()).await.unwrap();
    until(&setup.handle, |view| {
        view.turn_id.is_none() && view.state == SessionState::WaitingForInput
    })
    .await;
    let sidecar = setup.connector.sidecar.lock().unwrap().clone().unwrap();
    let first = sidecar.first_chunk.load(Ordering::SeqCst);
    let last = sidecar.seq.load(Ordering::SeqCst);
    // The turn's end acknowledges everything; the outbox sends it after the view changed.
    let mut acked = sidecar.acks.subscribe();
    let acks = tokio::time::timeout(
        Duration::from_secs(10),
        acked.wait_for(|acks| acks.last() == Some(&last)),
    )
    .await
    .expect("the end of the turn acknowledges everything")
    .unwrap()
    .clone();
    // 1000 chunks passed several ack points; none may reach into the message.
    for ack in &acks[..acks.len() - 1] {
        assert!(*ack < first, "ack {ack} reaches into the message starting at {first}: {acks:?}");
    }
    let history = crate::history::read(
        &setup.dir.path().join("sessions").join(setup.handle_id()).join("history.jsonl"),
        0,
        10,
    )
    .unwrap()
    .entries;
    let text: String = (1..=1000).map(|n| format!("<{n}>")).collect();
    assert_eq!(history.last().unwrap().content, text);
}

#[tokio::test]
async fn cancel_and_stop_answer_at_once_while_the_sidecar_hangs_and_stop_fences_it() {
    let setup = start(Mode::HangsAfterOpen(3)).await;
    until(&setup.handle, |view| view.phase == Phase::Open).await;
    let fenced_before = setup.runtime.fenced.lock().unwrap().len();
    let handle = setup.handle.clone();
    // The prompt's delivery hangs; its caller waits, the actor does not.
    let prompt = tokio::spawn(async move { handle.prompt("slow".into()).await });
    until(&setup.handle, |view| view.turn_id.is_some()).await;
    let quick = Duration::from_millis(100);
    tokio::time::timeout(quick, setup.handle.cancel()).await.expect("cancel at once").unwrap();
    let fence = setup.runtime.fence_called.notified();
    tokio::time::timeout(quick, setup.handle.stop()).await.expect("stop at once").unwrap();
    assert_eq!(setup.handle.view().state, SessionState::Completed);
    tokio::time::timeout(Duration::from_secs(10), fence).await.expect("the sidecar is fenced");
    assert!(setup.runtime.fenced.lock().unwrap().len() > fenced_before);
    // The turn was recorded, so the caller is told it was not delivered (and the service
    // does not retry it: that would record, and perhaps send, the prompt twice).
    let answer = prompt.await.unwrap();
    assert!(matches!(answer, Err(super::SessionError::Undelivered(_))), "{answer:?}");
}

#[tokio::test]
async fn a_launch_that_cannot_connect_fences_what_the_runtime_started() {
    let setup = start(Mode::Unreachable).await;
    tokio::time::timeout(Duration::from_secs(10), setup.handle.ended()).await.unwrap();
    assert_eq!(setup.handle.view().state, SessionState::Failed);
    let fenced = setup.runtime.fenced.lock().unwrap().clone();
    // Once before the launch (nothing recorded yet), once for the sidecar it started.
    assert_eq!(fenced.len(), 2, "{fenced:?}");
    assert!(fenced[0].execution.is_none());
    let started = fenced[1].execution.as_ref().expect("the new execution's record");
    assert_eq!(started.agentctl_pid, Some(4_000_000));
}

impl Setup {
    fn handle_id(&self) -> crate::ids::SessionId {
        std::fs::read_dir(self.dir.path().join("sessions"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .file_name()
            .to_string_lossy()
            .into_owned()
            .into()
    }
}

#[test]
fn permission_request_ids_carry_the_generation_and_give_back_the_agents_id() {
    use super::{agent_request_id, permission_request_id};
    assert_eq!(permission_request_id(2, &serde_json::json!(0)), "2.0");
    assert_eq!(permission_request_id(3, &serde_json::json!("a.b")), "3.\"a.b\"");
    assert_ne!(
        permission_request_id(1, &serde_json::json!(0)),
        permission_request_id(2, &serde_json::json!(0))
    );
    assert_eq!(agent_request_id("2.0"), serde_json::json!(0));
    assert_eq!(agent_request_id("3.\"a.b\""), serde_json::json!("a.b"));
    // Stored before generations were part of it: the agent's id itself.
    assert_eq!(agent_request_id("7"), serde_json::json!(7));
    assert_eq!(agent_request_id("\"x.y\""), serde_json::json!("x.y"));
}

impl Setup {
    fn sidecar(&self) -> Arc<FakeSidecar> {
        self.connector.sidecar.lock().unwrap().clone().expect("a sidecar was connected")
    }

    /// Every event of the session's log, in order.
    async fn logged(&self) -> Vec<crate::events::SessionEvent> {
        let log = self.handle.events();
        let mut reader = log.reader(0).unwrap();
        let mut events = Vec::new();
        for _ in 0..log.last_seq() {
            events.push(reader.next().await.unwrap());
        }
        events
    }

    fn store(&self) -> Store {
        Store::open(&self.dir.path().join("state.db")).unwrap()
    }
}

/// Whether an event is a state change to `state`.
fn is_state(event: &crate::events::SessionEvent, state: SessionState) -> bool {
    matches!(event.kind, crate::events::SessionEventKind::State { state: s, .. } if s == state)
}

/// Each turn's row says where its `turn_started` event is in the log, and its prompt: a
/// page opens a long session at its newest prompt from there.
#[tokio::test]
async fn each_turn_records_the_seq_of_its_start_in_the_event_log() {
    use crate::events::SessionEventKind as K;
    let setup = start(Mode::Streams(3)).await;
    until(&setup.handle, |view| view.phase == Phase::Open).await;
    let mut turns = Vec::new();
    for prompt in ["first", "second"] {
        turns.push(started(setup.handle.prompt(prompt.into()).await.unwrap()));
        until(&setup.handle, |view| {
            view.turn_id.is_none() && view.state == SessionState::WaitingForInput
        })
        .await;
    }
    let events = setup.logged().await;
    let rows = setup.store().session_turns(setup.handle_id()).await.unwrap();
    assert_eq!(rows.len(), 2);
    for (row, prompt) in rows.iter().zip(["first", "second"]) {
        let seq = row.event_seq.expect("the start's seq is recorded");
        let event = events.iter().find(|event| event.seq == seq).expect("an event at that seq");
        assert!(
            matches!(&event.kind, K::TurnStarted { turn_id, .. } if turn_id == row.id.as_str()),
            "{event:?}"
        );
        assert_eq!(row.prompt.as_deref(), Some(prompt));
    }
    assert_eq!(rows.iter().map(|row| row.id.clone()).collect::<Vec<_>>(), turns);
}

#[tokio::test]
async fn a_prompt_streams_its_chunks_and_its_turn_completes() {
    use crate::events::SessionEventKind as K;
    let setup = start(Mode::Streams(5)).await;
    until(&setup.handle, |view| view.phase == Phase::Open).await;
    let turn = started(setup.handle.prompt("hi".into()).await.unwrap());
    until(&setup.handle, |view| {
        view.turn_id.is_none() && view.state == SessionState::WaitingForInput
    })
    .await;
    let events = setup.logged().await;
    let started = events.iter().position(
        |e| matches!(&e.kind, K::TurnStarted { turn_id, .. } if turn == turn_id.as_str()),
    );
    let ended = events.iter().position(|e| matches!(&e.kind, K::TurnEnded { turn_id, state, .. } if turn == turn_id.as_str() && *state == protocol::api::TurnState::Completed));
    let (started, ended) = (started.expect("turn_started"), ended.expect("turn_ended completed"));
    let chunks: Vec<&str> = events[started..ended]
        .iter()
        .filter_map(|e| match &e.kind {
            K::AgentMessageChunk { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(chunks, ["<1>", "<2>", "<3>", "<4>", "<5>"]);
    assert!(events[ended..].iter().any(|e| is_state(e, SessionState::WaitingForInput)));
    let store = setup.store();
    let (state, _, _) = store.get_turn(turn.clone()).await.unwrap();
    assert_eq!(state, "completed");
}

/// The turn a prompt started (it was not queued).
fn started(prompted: super::Prompted) -> crate::ids::TurnId {
    match prompted {
        super::Prompted::Started(turn_id) => turn_id,
        queued => panic!("the prompt was queued: {queued:?}"),
    }
}

#[tokio::test]
async fn a_prompt_while_a_turn_runs_is_queued_durably_and_runs_once_after_it() {
    let setup = start(Mode::Holds).await;
    until(&setup.handle, |view| view.phase == Phase::Open).await;
    let first = started(setup.handle.prompt("one".into()).await.unwrap());
    let second = setup.handle.prompt("two".into()).await.unwrap();
    let super::Prompted::Queued { prompt_id, position: 1, waking: false } = second else {
        panic!("the second prompt is queued first in line: {second:?}");
    };
    // Durable before the answer; the first turn runs on.
    let queue = setup.store().prompt_queue(setup.handle_id()).await.unwrap();
    assert_eq!(queue.prompts.len(), 1);
    assert_eq!(
        (queue.prompts[0].prompt_id.as_str(), queue.prompts[0].prompt.as_str()),
        (prompt_id.as_str(), "two")
    );
    assert_eq!(setup.handle.view().turn_id, Some(first.clone()));
    setup.sidecar().end_held_turn().await;
    until(&setup.handle, |view| view.turn_id.as_ref().is_some_and(|turn| *turn != first)).await;
    let history = setup.store().session_turns(setup.handle_id()).await.unwrap();
    assert_eq!(history.len(), 2, "each prompt ran once: {history:?}");
    let events = setup.logged().await;
    let prompts: Vec<_> = events
        .iter()
        .filter_map(|event| match &event.kind {
            crate::events::SessionEventKind::TurnStarted { prompt, .. } => Some(prompt.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(prompts, ["one", "two"], "in order");
    let queue = setup.store().prompt_queue(setup.handle_id()).await.unwrap();
    assert!(queue.prompts.is_empty(), "taken with its turn: {queue:?}");
    let from_queue = events.iter().any(|event| {
        matches!(&event.kind, crate::events::SessionEventKind::TurnStarted { prompt_id: Some(id), .. } if *id == prompt_id.as_str())
    });
    assert!(from_queue, "its turn_started names the queued prompt");
}

#[tokio::test]
async fn a_cancelled_turn_halts_the_queue_until_it_is_resumed() {
    let setup = start(Mode::Holds).await;
    until(&setup.handle, |view| view.phase == Phase::Open).await;
    let first = started(setup.handle.prompt("one".into()).await.unwrap());
    setup.handle.prompt("two".into()).await.unwrap();
    setup.handle.cancel().await.unwrap();
    let sidecar = setup.sidecar();
    // The agent confirms the cancel.
    let prompt = sidecar.prompt_id.lock().unwrap().clone();
    sidecar
        .emit(json!({"jsonrpc": "2.0", "id": prompt, "result": {"stopReason": "cancelled"}}))
        .await;
    until(&setup.handle, |view| view.turn_id.is_none()).await;
    let queue = setup.store().prompt_queue(setup.handle_id()).await.unwrap();
    assert_eq!(queue.prompts.len(), 1, "the queued prompt waits: {queue:?}");
    let halted = queue.halted.expect("the queue halts");
    assert!(halted.contains(first.as_str()) && halted.contains("cancelled"), "{halted}");
    // Go on: the queued prompt runs.
    let queue = setup.handle.change_queue(super::QueueChange::Resume).await.unwrap();
    assert_eq!(queue.halted, None);
    until(&setup.handle, |view| view.turn_id.as_ref().is_some_and(|turn| *turn != first)).await;
    let queue = setup.store().prompt_queue(setup.handle_id()).await.unwrap();
    assert!(queue.prompts.is_empty(), "{queue:?}");
}

#[tokio::test]
async fn stop_ends_an_open_session_completed_publishes_it_and_fences_its_sidecar() {
    let setup = start(Mode::Streams(1)).await;
    until(&setup.handle, |view| view.phase == Phase::Open).await;
    let fenced_before = setup.runtime.fenced.lock().unwrap().len();
    setup.handle.stop().await.unwrap();
    until(&setup.handle, |view| view.phase == Phase::Ended).await;
    assert_eq!(setup.handle.view().state, SessionState::Completed);
    assert!(setup.runtime.fenced.lock().unwrap().len() > fenced_before, "the sidecar is fenced");
    let events = setup.logged().await;
    assert!(events.iter().any(|e| is_state(e, SessionState::Completed)));
    // Ended for good: a prompt is refused as terminal.
    let refused = setup.handle.prompt("more".into()).await;
    assert!(
        matches!(refused, Err(super::SessionError::Terminal(_) | super::SessionError::Gone)),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_detached_session_keeps_its_state_and_a_resume_launches_a_new_execution() {
    let setup = start(Mode::Streams(1)).await;
    until(&setup.handle, |view| view.phase == Phase::Open).await;
    let first = setup.sidecar();
    setup.handle.detach().await.unwrap();
    let view = setup.handle.view();
    assert_eq!((view.state, view.agent_running), (SessionState::WaitingForInput, false));
    let outcome = setup.handle.resume().await.unwrap();
    assert_eq!(outcome, crate::store::ResumeOutcome::NativeLoad, "the agent can load its session");
    until(&setup.handle, |view| view.phase == Phase::Open && view.agent_running).await;
    assert!(!Arc::ptr_eq(&first, &setup.sidecar()), "a new sidecar");
    let execution = setup.store().get_execution(setup.handle_id()).await.unwrap().unwrap();
    assert_eq!(execution.generation, 2, "the new execution is the session's second");
}

#[tokio::test]
async fn a_lost_sidecar_fails_the_running_turn_with_the_reason_and_fences_it() {
    let setup = start(Mode::Holds).await;
    until(&setup.handle, |view| view.phase == Phase::Open).await;
    let turn = started(setup.handle.prompt("one".into()).await.unwrap());
    let fenced_before = setup.runtime.fenced.lock().unwrap().len();
    // The control channel breaks.
    let broken = ClientError::Timeout {
        addr: SocketAddr::from(([127, 0, 0, 1], 9)).into(),
        method: "events".into(),
        after: Duration::ZERO,
    };
    setup.sidecar().events().unwrap().send(Err(Box::new(broken))).await.unwrap();
    until(&setup.handle, |view| {
        view.turn_id.is_none() && !view.agent_running && view.state == SessionState::WaitingForInput
    })
    .await;
    let view = setup.handle.view();
    assert_eq!(view.state, SessionState::WaitingForInput);
    assert!(view.error.as_deref().is_some_and(|e| e.contains("lost the connection")), "{view:?}");
    assert!(
        setup.runtime.fenced.lock().unwrap().len() > fenced_before,
        "the lost sidecar is fenced"
    );
    let (state, _, error) = setup.store().get_turn(turn).await.unwrap();
    assert_eq!(state, "failed", "{error:?}");
}

#[tokio::test]
async fn a_stream_ended_by_the_daemons_shutdown_is_no_loss_and_its_sidecar_runs_on() {
    for how_it_ends in ["torn down", "broken"] {
        let setup = start(Mode::Holds).await;
        until(&setup.handle, |view| view.phase == Phase::Open).await;
        let turn = started(setup.handle.prompt("one".into()).await.unwrap());
        let fenced_before = setup.runtime.fenced.lock().unwrap().len();
        // The daemon shuts down: its teardowns close, then its runtime drops the clients.
        setup.teardowns.close();
        let sidecar = setup.sidecar();
        if how_it_ends == "torn down" {
            sidecar.end_events();
        } else {
            let broken = ClientError::Timeout {
                addr: SocketAddr::from(([127, 0, 0, 1], 9)).into(),
                method: "events".into(),
                after: Duration::ZERO,
            };
            sidecar.events().unwrap().send(Err(Box::new(broken))).await.unwrap();
        }
        until(&setup.handle, |view| view.phase == Phase::Ended).await;
        // Nothing was fenced, recorded or published: the next start re-attaches to it.
        let fenced = setup.runtime.fenced.lock().unwrap().len();
        assert_eq!(fenced, fenced_before, "{how_it_ends}: the sidecar is not fenced");
        let logged = setup.logged().await;
        let started = logged
            .iter()
            .position(|event| {
                matches!(event.kind, crate::events::SessionEventKind::TurnStarted { .. })
            })
            .expect("turn_started");
        let ends = |event: &crate::events::SessionEvent| {
            matches!(event.kind, crate::events::SessionEventKind::TurnEnded { .. })
                || is_state(event, SessionState::WaitingForInput)
        };
        let ended = logged[started..].iter().any(ends);
        assert!(!ended, "{how_it_ends}: nothing published: {logged:?}");
        let store = setup.store();
        let (state, _, _) = store.get_turn(turn).await.unwrap();
        assert_eq!(state, "running", "{how_it_ends}: the turn is the next start's to settle");
        let execution = store.get_execution(setup.handle_id()).await.unwrap().unwrap();
        assert_eq!(execution.status, crate::store::ExecutionStatus::Running, "{how_it_ends}");
        assert_eq!(
            store.get_session(setup.handle_id()).await.unwrap().state,
            SessionState::Running
        );
    }
}

#[tokio::test]
async fn pausing_an_idle_session_stops_its_agent_snapshots_and_publishes_it() {
    use crate::events::SessionEventKind as K;
    let setup = start(Mode::Streams(1)).await;
    until(&setup.handle, |view| view.phase == Phase::Open).await;
    let taken = setup.handle.pause(Some("lunch".into()), Duration::from_secs(60)).await.unwrap();
    let crate::session::PauseTaken::Paused { snapshot_id: Some(snapshot_id) } = taken else {
        panic!("no turn to wait for, a snapshot taken: {taken:?}");
    };
    until(&setup.handle, |view| view.state == SessionState::Paused).await;
    assert!(!setup.handle.view().agent_running);
    let events = setup.logged().await;
    let tail: Vec<&K> = events.iter().rev().take(3).map(|e| &e.kind).collect();
    assert!(
        matches!(tail[0], K::Paused { reason: Some(r), forced: false, .. } if r == "lunch"),
        "{tail:?}"
    );
    assert!(matches!(tail[1], K::State { state: SessionState::Paused, .. }), "{tail:?}");
    assert!(
        matches!(tail[2], K::SnapshotTaken { snapshot_id: taken, .. } if *taken == snapshot_id),
        "the snapshot the pause answered with: {tail:?}"
    );
    assert_eq!(
        setup.store().get_session(setup.handle_id()).await.unwrap().state,
        SessionState::Paused
    );
}

/// The execution a restart finds recorded for `row` (`e1`, generation 1, agentctl pid 4242
/// started at tick 77, its ACP session open), with turn `t1` running in it.
async fn recorded_execution(store: &Store, row: &SessionRow) -> ExecutionRow {
    let execution = ExecutionRow {
        generation: 1,
        runtime: "standalone".into(),
        agentctl_port: Some(9),
        agentctl_pid: Some(4_242),
        agentctl_start_time: Some(77),
        acp_session_id: Some("fake-session".into()),
        ..ExecutionRow::new(row.id.clone(), "e1".into())
    };
    store.put_execution(execution.clone()).await.unwrap();
    store
        .insert_turn("t1".into(), row.id.clone(), "e1".into(), "5".into(), ("p".into(), None, None))
        .await
        .unwrap();
    execution
}

#[tokio::test]
async fn a_failed_reattach_voids_the_open_work_fences_and_leaves_the_session_resumable() {
    use crate::events::SessionEventKind as K;
    let setup = start_with(Mode::Unreachable, SessionState::Running, |store, row| async move {
        let execution = recorded_execution(&store, &row).await;
        let method = "session/request_permission".to_owned();
        let params = json!({"toolCall": {"title": "ls"}});
        store
            .insert_pending(row.id.clone(), "e1".into(), "1.3".into(), method, params)
            .await
            .unwrap();
        let open_turns = store.open_turns(row.id.clone(), "e1".into()).await.unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], 9));
        Start::Reattach(Box::new(super::ReattachPlan {
            execution,
            addr: addr.into(),
            open_turns,
            gone: false,
        }))
    })
    .await;
    until(&setup.handle, |view| {
        view.phase == Phase::Idle && view.state == SessionState::WaitingForInput
    })
    .await;
    let view = setup.handle.view();
    assert!(!view.agent_running);
    assert!(view.error.as_deref().is_some_and(|e| e.contains("could not re-attach")), "{view:?}");
    let fenced = setup.runtime.fenced.lock().unwrap().clone();
    assert!(
        fenced
            .iter()
            .any(|target| target.execution.as_ref().is_some_and(|e| e.execution_id == "e1"))
    );
    // The stream says each end before the rows change: the question void, the turn
    // interrupted, then the state.
    let events = setup.logged().await;
    let question = events.iter().position(
        |e| matches!(&e.kind, K::PermissionResolved { request_id, .. } if request_id == "1.3"),
    );
    let turn = events.iter().position(|e| matches!(&e.kind, K::TurnEnded { turn_id, state, .. } if turn_id == "t1" && *state == protocol::api::TurnState::Interrupted));
    let state = events.iter().position(|e| is_state(e, SessionState::WaitingForInput));
    let (question, turn, state) = (question.unwrap(), turn.unwrap(), state.unwrap());
    assert!(question < turn && turn < state, "{events:?}");
    let store = setup.store();
    assert!(store.running_turns(setup.handle_id()).await.unwrap().is_empty());
    assert!(store.list_pending(setup.handle_id()).await.unwrap().is_empty());
    let (turn_state, _, _) = store.get_turn("t1".into()).await.unwrap();
    assert_eq!(turn_state, "interrupted");
}

#[tokio::test]
async fn a_dead_sidecars_spool_is_recorded_at_recovery_and_its_turn_ends_as_the_agent_did() {
    use crate::events::SessionEventKind as K;
    let setup = start_with(Mode::Unreachable, SessionState::Running, |store, row| async move {
        let execution = recorded_execution(&store, &row).await;
        store.mark_delivered("t1".into()).await.unwrap();
        // The dead sidecar's state dir: `ready.json` naming it, and its spool — two chunks
        // of the turn nobody recorded, then the agent's exit.
        let agentctl =
            std::path::PathBuf::from(&row.workspace_path).join("sessions").join(&row.id).join("agentctl");
        std::fs::create_dir_all(agentctl.join("spool")).unwrap();
        let ready = protocol::control::ReadyInfo {
            socket: None,
            pid: 4_242,
            port: 9,
            start_time: 77,
            boot_id: "fake".into(),
            version: "0".into(),
        };
        std::fs::write(agentctl.join("ready.json"), serde_json::to_vec(&ready).unwrap()).unwrap();
        let chunk = |text: &str| EventKind::acp(&json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "fake-session", "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}}}));
        let exited = EventKind::AgentExited {
            status: ExitInfo { code: None, signal: Some(9) },
            stderr_tail: String::new(),
        };
        let mut lines = String::new();
        for (seq, kind) in [chunk("<a>"), chunk("<b>"), exited].into_iter().enumerate() {
            let event = Event { seq: seq as u64 + 1, at: 0, kind };
            lines.push_str(&serde_json::to_string(&event).unwrap());
            lines.push('\n');
        }
        std::fs::write(agentctl.join("spool").join(format!("events-{:020}.jsonl", 1)), lines)
            .unwrap();
        let open_turns = store.open_turns(row.id.clone(), "e1".into()).await.unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], 9));
        Start::Reattach(Box::new(super::ReattachPlan { execution, addr: addr.into(), open_turns, gone: true }))
    })
    .await;
    until(&setup.handle, |view| {
        view.phase == Phase::Idle && view.state == SessionState::WaitingForInput
    })
    .await;
    let events = setup.logged().await;
    let chunks: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.kind {
            K::AgentMessageChunk { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(chunks, ["<a>", "<b>"], "what the dead sidecar spooled is published once");
    // The spool says the agent exited: the turn ends with why, after what it said.
    let ended = events.iter().position(|e| matches!(&e.kind, K::TurnEnded { turn_id, state, error: Some(error), .. } if turn_id == "t1" && *state == protocol::api::TurnState::Failed && error.contains("signal 9")));
    let ended = ended.unwrap_or_else(|| panic!("{events:?}"));
    assert!(
        events[..ended].iter().filter(|e| matches!(e.kind, K::AgentMessageChunk { .. })).count()
            == 2
    );
    let history = crate::history::read(
        &setup.dir.path().join("sessions").join(setup.handle_id()).join("history.jsonl"),
        0,
        10,
    )
    .unwrap()
    .entries;
    // The reply, marked as cut off by the failed turn.
    let reply = history.iter().find(|entry| entry.content.starts_with("<a><b>\n"));
    let reply = reply.unwrap_or_else(|| panic!("{history:?}"));
    assert!(reply.content.contains("[the reply was cut off here: the agent exited (signal 9"));
    let (turn_state, _, _) = setup.store().get_turn("t1".into()).await.unwrap();
    assert_eq!(turn_state, "failed");
    assert!(setup.handle.view().error.as_deref().is_some_and(|e| e.contains("signal 9")));
}

/// A prompt whose user message cannot be written to the history (a full disk) stalls the
/// session, which says why; once the disk takes writes again the retry writes the message
/// (no agentctl replay brings it back) and re-attaches, and the session goes on.
#[tokio::test]
async fn a_prompt_whose_history_write_fails_is_recorded_once_the_disk_takes_it() {
    let setup = start(Mode::Holds).await;
    until(&setup.handle, |view| view.phase == Phase::Open).await;
    let path = setup.dir.path().join("sessions").join(setup.handle_id()).join("history.jsonl");
    // The history cannot be appended to: a directory stands where its file was.
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    setup.handle.prompt("remember me".into()).await.unwrap();
    until(&setup.handle, |view| view.error.as_deref().is_some_and(|e| e.contains("history"))).await;
    std::fs::remove_dir(&path).unwrap();
    // Re-attached, the stall over. (The fake sidecar never says a prompt was delivered, so
    // the turn then ends as undelivered; a real agentctl says it.)
    until(&setup.handle, |view| {
        view.phase == Phase::Open && !view.error.as_deref().is_some_and(|e| e.contains("history"))
    })
    .await;
    let history = crate::history::read(&path, 0, 10).unwrap().entries;
    let prompts: Vec<&str> = history
        .iter()
        .filter(|entry| entry.kind == crate::history::EntryType::UserMessage)
        .map(|entry| entry.content.as_str())
        .collect();
    assert_eq!(prompts, ["remember me"], "{history:?}");
}

/// The next event of a session's log (within 10 s).
async fn next_logged(
    log: &mut agentctl::spool::SpoolReader<crate::events::SessionEvent>,
) -> crate::events::SessionEvent {
    tokio::time::timeout(Duration::from_secs(10), log.next())
        .await
        .expect("the session publishes on")
        .unwrap()
}

/// Prompts the open session; the permission request its agent asks, and its log read on
/// from there.
async fn asked(
    setup: &Setup,
) -> (agentctl::spool::SpoolReader<crate::events::SessionEvent>, String) {
    setup.handle.prompt("ask".into()).await.unwrap();
    let mut log = setup.handle.events().reader(0).unwrap();
    loop {
        if let crate::events::SessionEventKind::PermissionRequest { request_id, .. } =
            next_logged(&mut log).await.kind
        {
            return (log, request_id);
        }
    }
}

/// An answer whose send agentctl confirms only after the agent's reaction ended the turn
/// and a waiting pause stopped the execution: the question is still resolved as answered
/// (published, its row gone) — it was left open for good, a "needs you" that never went.
#[tokio::test]
async fn an_answer_confirmed_after_a_pause_stopped_its_execution_still_resolves_the_question() {
    use crate::events::SessionEventKind as K;
    let setup = start(Mode::AsksThenLags).await;
    until(&setup.handle, |view| view.phase == Phase::Open).await;
    let store = setup.store();
    let id = setup.handle_id();
    let (mut log, request) = asked(&setup).await;
    let mut next = async || next_logged(&mut log).await;
    let taken = setup.handle.pause(Some("later".into()), Duration::from_secs(60)).await.unwrap();
    assert_eq!(taken, crate::session::PauseTaken::Waits);
    let outcome = json!({"outcome": "selected", "optionId": "allow"});
    setup.handle.respond_permission(request.clone(), outcome).await.unwrap();
    until(&setup.handle, |view| view.state == SessionState::Paused).await;
    // Now agentctl's reply to the answer's call arrives.
    let sidecar = setup.connector.sidecar.lock().unwrap().clone().unwrap();
    sidecar.release.notify_one();
    let resolved = |events: &[crate::events::SessionEvent]| {
        events.iter().any(|e| {
            matches!(&e.kind, K::PermissionResolved { request_id, outcome }
            if *request_id == request && outcome["optionId"] == "allow")
        })
    };
    let mut seen = Vec::new();
    while !resolved(&seen) {
        seen.push(next().await);
    }
    // The actor takes this after it handled the confirmation: answered, it is asked no more.
    let again = setup.handle.respond_permission(request, json!({"outcome": "cancelled"})).await;
    assert!(matches!(again, Err(super::SessionError::NoSuchRequest(_))), "{again:?}");
    assert!(store.list_pending(id).await.unwrap().is_empty(), "the question's row is gone");
}

/// A turn that ends with its question unanswered, a pause waiting for it: the pause voids
/// the question (published `cancelled`, its row gone) — it stayed open for good.
#[tokio::test]
async fn a_pause_voids_a_question_its_agent_left_unanswered() {
    use crate::events::SessionEventKind as K;
    let setup = start(Mode::AsksThenEnds).await;
    until(&setup.handle, |view| view.phase == Phase::Open).await;
    let (mut log, request) = asked(&setup).await;
    let mut next = async || next_logged(&mut log).await;
    let taken = setup.handle.pause(None, Duration::from_secs(60)).await.unwrap();
    assert_eq!(taken, crate::session::PauseTaken::Waits);
    let sidecar = setup.connector.sidecar.lock().unwrap().clone().unwrap();
    sidecar.release.notify_one();
    loop {
        if let K::PermissionResolved { request_id, outcome } = next().await.kind {
            assert_eq!(request_id, request);
            assert_eq!(outcome["outcome"], "cancelled");
            break;
        }
    }
    until(&setup.handle, |view| view.state == SessionState::Paused).await;
    assert!(setup.store().list_pending(setup.handle_id()).await.unwrap().is_empty());
}

/// A launch that fails leaves its starting phase before its failure is stored: whoever is
/// told the session failed (the workflow driver, reading the store on the announcement)
/// never sees it still starting, and so never waits for a launch that is over. Here a
/// prompt waits in the queue, so the failure also halts it (a write after the state's).
#[tokio::test]
async fn a_failed_launch_is_no_longer_starting_once_its_failure_is_published() {
    let setup = start_with(Mode::Unreachable, SessionState::Created, |store, row| async move {
        store.enqueue_prompt(row.id.clone(), "q1".into(), "later".into()).await.unwrap();
        Start::Fresh { initial_prompt: None }
    })
    .await;
    let mut view = setup.handle.watch();
    let seen = tokio::time::timeout(
        Duration::from_secs(10),
        view.wait_for(|view| view.state == SessionState::Failed),
    )
    .await
    .expect("the launch fails in time")
    .expect("the actor is alive")
    .clone();
    assert!(!seen.is_starting() && !seen.agent_running, "failed, yet still starting: {seen:?}");
}

/// A sidecar lost while its agent's message is still being coalesced, and the history
/// cannot take that message when the loss ends the turn (a full disk): the message was
/// published (subscribers saw it), and the stall's retry writes it once the disk takes
/// writes again — nothing replays a gone sidecar's output, so it is written from memory.
#[tokio::test]
async fn a_message_published_before_a_loss_is_in_the_history_once_a_failed_write_succeeds() {
    use crate::events::SessionEventKind as K;
    let setup = start(Mode::Holds).await;
    until(&setup.handle, |view| view.phase == Phase::Open).await;
    started(setup.handle.prompt("one".into()).await.unwrap());
    let sidecar = setup.sidecar();
    for text in ["<a>", "<b>"] {
        sidecar.emit(json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "fake-session", "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}}})).await;
    }
    let mut log = setup.handle.events().reader(0).unwrap();
    let mut published = String::new();
    // (`Holds` says `<held>` first.)
    while published != "<held><a><b>" {
        if let K::AgentMessageChunk { text, .. } = next_logged(&mut log).await.kind {
            published.push_str(&text);
        }
    }
    // The history cannot be appended to: a directory stands where its file was (put
    // back once the failure is seen).
    let path = setup.dir.path().join("sessions").join(setup.handle_id()).join("history.jsonl");
    let aside = path.with_extension("aside");
    std::fs::rename(&path, &aside).unwrap();
    std::fs::create_dir(&path).unwrap();
    sidecar.end_events();
    until(&setup.handle, |view| view.error.as_deref().is_some_and(|e| e.contains("history"))).await;
    std::fs::remove_dir(&path).unwrap();
    std::fs::rename(&aside, &path).unwrap();
    until(&setup.handle, |view| !view.error.as_deref().is_some_and(|e| e.contains("history")))
        .await;
    let history = crate::history::read(&path, 0, 10).unwrap().entries;
    let said: Vec<(crate::history::EntryType, &str)> =
        history.iter().map(|entry| (entry.kind, entry.content.as_str())).collect();
    assert!(
        matches!(said.as_slice(), [(crate::history::EntryType::UserMessage, "one"), (crate::history::EntryType::AgentMessage, reply)] if reply.starts_with("<held><a><b>")),
        "what was published is in the history, once: {said:?}"
    );
}
