//! In-memory fakes of what lies below the session actor, for tests without processes: a
//! runtime that launches nothing and records every fence, and a sidecar whose scripted
//! agent answers `initialize`, `session/new`, `session/load` and prompts.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentctl::client::ClientError;
use protocol::control::{
    AgentStarted, AgentState, Event, EventKind, ExitInfo, ReadyInfo, StartAgent, Status, StopStage,
    Stopped,
};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

use crate::runtime::{
    BoxFuture, Endpoint, FenceTarget, LaunchSpec, Liveness, Runtime, RuntimeError,
};
use crate::sidecar::{Connection, Connector, Control};
use crate::store::ExecutionRow;

/// A runtime that launches nothing and records every fence. Its sidecars are alive for a
/// restart's recovery while `alive` is set (and, once fenced, no longer).
#[derive(Default)]
pub(crate) struct FakeRuntime {
    pub(crate) fenced: Mutex<Vec<FenceTarget>>,
    pub(crate) fence_called: Notify,
    pub(crate) alive: AtomicBool,
    /// Its name, when not `standalone` (a second runtime beside it).
    pub(crate) named: Option<&'static str>,
    /// The sessions whose launches it was asked for, in order.
    pub(crate) launched: Mutex<Vec<LaunchSpec>>,
}

impl Runtime for FakeRuntime {
    fn name(&self) -> &str {
        self.named.unwrap_or("standalone")
    }

    fn check(&self) -> BoxFuture<'_, Result<(), RuntimeError>> {
        Box::pin(async { Ok(()) })
    }

    fn launch(&self, spec: LaunchSpec) -> BoxFuture<'_, Result<Endpoint, RuntimeError>> {
        self.launched.lock().unwrap().push(spec);
        Box::pin(async {
            Ok(Endpoint {
                agent_user: None,
                addr: SocketAddr::from(([127, 0, 0, 1], 9)).into(),
                ready: ReadyInfo {
                    socket: None,
                    pid: 4_000_000,
                    port: 9,
                    start_time: 1,
                    boot_id: "fake".into(),
                    version: "0".into(),
                },
                handle: serde_json::Value::Null,
                tls_cert: None,
                owned_dirs: Vec::new(),
            })
        })
    }

    fn liveness<'a>(
        &'a self,
        executions: &'a [ExecutionRow],
        _: &'a str,
    ) -> BoxFuture<'a, std::collections::HashMap<crate::ids::SessionId, Liveness>> {
        let alive = self.alive.load(Ordering::SeqCst);
        let found = executions.iter().map(|execution| {
            let liveness = if alive { Liveness::Alive } else { Liveness::Dead };
            (execution.session_id.clone(), liveness)
        });
        let found = found.collect();
        Box::pin(async move { found })
    }

    fn fence<'a>(&'a self, target: &'a FenceTarget) -> BoxFuture<'a, Result<(), RuntimeError>> {
        self.fenced.lock().unwrap().push(target.clone());
        self.alive.store(false, Ordering::SeqCst);
        self.fence_called.notify_waiters();
        Box::pin(async { Ok(()) })
    }
}

/// How the fake sidecar behaves.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Answers everything; a prompt streams this many chunks, then ends the turn.
    Streams(u64),
    /// Like `Streams`, but once the session is open every call hangs for a while and then
    /// fails as a real client's timeout would.
    HangsAfterOpen(u64),
    /// Refuses to be connected to.
    Unreachable,
    /// Answers the handshake, but a prompt gets no answer: its turn runs until something
    /// else ends it.
    Holds,
    /// A prompt asks for permission; the answer ends the turn at once, but agentctl's
    /// reply to the call that carried it comes only when the test releases it (the
    /// agent's reaction overtakes the reply, as it can with a real sidecar).
    AsksThenLags,
    /// A prompt asks for permission, and the turn ends without an answer once the test
    /// releases it (an agent that gives up on its question).
    AsksThenEnds,
}

/// A sidecar with a scripted agent behind it.
pub(crate) struct FakeSidecar {
    pub(crate) mode: Mode,
    /// What publishes its events; `None` once the stream was ended.
    events_tx: Mutex<Option<mpsc::Sender<crate::sidecar::EventItem>>>,
    pub(crate) seq: AtomicU64,
    pub(crate) open: std::sync::atomic::AtomicBool,
    /// Every `events.ack` seq, in order.
    pub(crate) acks: tokio::sync::watch::Sender<Vec<u64>>,
    pub(crate) first_chunk: AtomicU64,
    /// `AsksThenLags` and `Holds`: the prompt's id; what releases the reply to the answer.
    pub(crate) prompt_id: Mutex<Value>,
    pub(crate) release: tokio::sync::Notify,
}

impl FakeSidecar {
    pub(crate) async fn emit(&self, message: Value) {
        self.emit_kind(EventKind::acp(&message)).await;
    }

    /// Waits until everything it published was acknowledged (all of it is durable with
    /// the supervisor).
    pub(crate) async fn all_acked(&self) {
        let last = self.seq.load(Ordering::SeqCst);
        let mut acks = self.acks.subscribe();
        let _ = acks.wait_for(|acks| acks.last().is_some_and(|acked| *acked >= last)).await;
    }

    /// Spools and publishes an event, as agentctl does.
    async fn emit_kind(&self, kind: EventKind) {
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let event = Event { seq, at: 0, kind };
        if let Some(events) = self.events() {
            let _ = events.send(Ok(Box::new(event))).await;
        }
    }

    /// What publishes its events, while the stream lasts.
    pub(crate) fn events(&self) -> Option<mpsc::Sender<crate::sidecar::EventItem>> {
        self.events_tx.lock().unwrap().clone()
    }

    /// `Holds`: ends the turn held last, as its agent would (`end_turn`).
    pub(crate) async fn end_held_turn(&self) {
        let prompt = self.prompt_id.lock().unwrap().clone();
        self.emit(json!({"jsonrpc": "2.0", "id": prompt, "result": {"stopReason": "end_turn"}}))
            .await;
    }

    /// Ends its event stream, as a client torn down under the actor would.
    pub(crate) fn end_events(&self) {
        self.events_tx.lock().unwrap().take();
    }

    async fn hang(&self) -> ClientError {
        tokio::time::sleep(Duration::from_millis(300)).await;
        ClientError::Timeout {
            addr: SocketAddr::from(([127, 0, 0, 1], 9)).into(),
            method: "fake".into(),
            after: Duration::from_millis(300),
        }
    }

    fn hanging(&self) -> bool {
        matches!(self.mode, Mode::HangsAfterOpen(_)) && self.open.load(Ordering::SeqCst)
    }

    async fn answer(&self, message: &Value) {
        let id = message["id"].clone();
        match message["method"].as_str() {
            Some("initialize") => {
                self.emit(json!({"jsonrpc": "2.0", "id": id, "result": {"protocolVersion": 1, "agentCapabilities": {"loadSession": true}}})).await
            }
            Some("session/new") => {
                self.open.store(true, Ordering::SeqCst);
                self.emit(json!({"jsonrpc": "2.0", "id": id, "result": {"sessionId": "fake-session"}})).await
            }
            Some("session/load") => {
                self.open.store(true, Ordering::SeqCst);
                self.emit(json!({"jsonrpc": "2.0", "id": id, "result": null})).await
            }
            Some("session/prompt")
                if matches!(self.mode, Mode::AsksThenLags | Mode::AsksThenEnds) =>
            {
                *self.prompt_id.lock().unwrap() = id.clone();
                self.emit(json!({"jsonrpc": "2.0", "id": 0, "method": "session/request_permission", "params": {"sessionId": "fake-session", "toolCall": {"toolCallId": "c1", "title": "ls"}, "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"}]}})).await;
                if self.mode == Mode::AsksThenEnds {
                    self.release.notified().await;
                    self.emit(json!({"jsonrpc": "2.0", "id": id, "result": {"stopReason": "end_turn"}})).await;
                }
            }
            None if self.mode == Mode::AsksThenLags && message.get("result").is_some() => {
                // The answer: the tool runs and the turn ends.
                let prompt = self.prompt_id.lock().unwrap().clone();
                self.emit(json!({"jsonrpc": "2.0", "id": prompt, "result": {"stopReason": "end_turn"}})).await;
            }
            Some("session/prompt") => {
                let (Mode::Streams(chunks) | Mode::HangsAfterOpen(chunks)) = self.mode else {
                    // (`Holds`: one chunk, then nothing.)
                    if self.mode == Mode::Holds {
                        *self.prompt_id.lock().unwrap() = id.clone();
                        self.emit(json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "fake-session", "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "<held>"}}}})).await;
                    }
                    return;
                };
                self.first_chunk.store(self.seq.load(Ordering::SeqCst) + 1, Ordering::SeqCst);
                for n in 1..=chunks {
                    self.emit(json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "fake-session", "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": format!("<{n}>")}}}})).await;
                }
                self.emit(json!({"jsonrpc": "2.0", "id": id, "result": {"stopReason": "end_turn"}}))
                    .await
            }
            _ => {}
        }
    }
}

pub(crate) struct FakeControl(pub(crate) Arc<FakeSidecar>);

impl Control for FakeControl {
    fn send_acp<'a>(&'a self, message: &'a Value) -> BoxFuture<'a, Result<(), ClientError>> {
        Box::pin(async move {
            if self.0.hanging() {
                return Err(self.0.hang().await);
            }
            // agentctl says a request reached the agent before the agent can answer it.
            if let (Some(id), Some(_)) = (message.get("id"), message.get("method")) {
                self.0.emit_kind(EventKind::Delivered { id: id.clone() }).await;
            }
            let sidecar = Arc::clone(&self.0);
            let answer = message.get("result").is_some() && message.get("method").is_none();
            let message = message.clone();
            // The agent answers in its own time, as a real one does.
            tokio::spawn(async move { sidecar.answer(&message).await });
            if answer && self.0.mode == Mode::AsksThenLags {
                self.0.release.notified().await;
            }
            Ok(())
        })
    }

    fn ack(&self, seq: u64) -> BoxFuture<'_, Result<u64, ClientError>> {
        Box::pin(async move {
            if self.0.hanging() {
                return Err(self.0.hang().await);
            }
            self.0.acks.send_modify(|acks| acks.push(seq));
            Ok(seq)
        })
    }

    fn start_agent<'a>(
        &'a self,
        _: &'a StartAgent,
    ) -> BoxFuture<'a, Result<AgentStarted, ClientError>> {
        Box::pin(async { Ok(AgentStarted { pid: 4_000_001, seq: 0 }) })
    }

    fn stop_agent(&self, _: Duration) -> BoxFuture<'_, Result<Stopped, ClientError>> {
        Box::pin(async move {
            if self.0.hanging() {
                return Err(self.0.hang().await);
            }
            let status = ExitInfo { code: Some(0), signal: None };
            Ok(Stopped { stage: StopStage::Eof, status })
        })
    }

    fn shutdown(&self) -> BoxFuture<'_, Result<(), ClientError>> {
        Box::pin(async { Ok(()) })
    }

    fn status(&self) -> BoxFuture<'_, Result<Status, ClientError>> {
        let last_seq = self.0.seq.load(Ordering::SeqCst);
        Box::pin(async move {
            Ok(Status {
                version: "0".into(),
                agent_state: AgentState::Running,
                agent_pid: Some(4_000_001),
                exit: None,
                last_seq,
                acked_seq: last_seq,
                intake_stalled: None,
            })
        })
    }
}

pub(crate) struct FakeConnector {
    pub(crate) mode: Mode,
    pub(crate) sidecar: Mutex<Option<Arc<FakeSidecar>>>,
}

impl Connector for FakeConnector {
    fn connect<'a>(
        &'a self,
        addr: agentctl::client::ControlAddr,
        _token: &'a str,
        _cert: Option<&'a str>,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Connection, ClientError>> {
        Box::pin(async move {
            if self.mode == Mode::Unreachable {
                return Err(ClientError::Timeout {
                    addr,
                    method: "connect".into(),
                    after: Duration::ZERO,
                });
            }
            let (events_tx, events_rx) = mpsc::channel(1 << 16);
            let sidecar = Arc::new(FakeSidecar {
                mode: self.mode,
                events_tx: Mutex::new(Some(events_tx)),
                // It goes on from what the caller has (a sidecar re-attached to after a
                // restart spooled nothing since).
                seq: AtomicU64::new(after_seq),
                open: AtomicBool::default(),
                acks: tokio::sync::watch::channel(Vec::new()).0,
                first_chunk: AtomicU64::new(0),
                prompt_id: Mutex::new(Value::Null),
                release: tokio::sync::Notify::new(),
            });
            *self.sidecar.lock().unwrap() = Some(Arc::clone(&sidecar));
            Ok((Arc::new(FakeControl(sidecar)) as Arc<dyn Control>, events_rx))
        })
    }
}

impl FakeConnector {
    /// A connector whose sidecars behave as `mode` says.
    pub(crate) fn new(mode: Mode) -> FakeConnector {
        FakeConnector { mode, sidecar: Mutex::new(None) }
    }

    /// The sidecar last connected to.
    pub(crate) fn sidecar(&self) -> Option<Arc<FakeSidecar>> {
        self.sidecar.lock().unwrap().clone()
    }
}
