//! One actor task per live session. The [`SessionActor`] owns the session's execution —
//! its agentctl connection, the ACP conversation, the history writer — and serialises
//! every command; the [`SessionHandle`] sends it commands and reads a cheap mirror of its
//! state from a watch channel (no mailbox round trip, no polling).
//!
//! Event flow: agentctl events arrive on one channel, commands on another; the loop takes
//! commands first (a cancel must not wait behind a stream of chunks). Each agentctl event is
//! handled — recorded in the history, the store and the session's event spool — and only
//! then counted towards the next `events.ack`, after the files are synced: nothing is
//! acknowledged before it is durable.
//!
//! ACP: the actor is the client. Requests go out through `acp.send` with ids from a
//! per-execution counter; their responses come back as events and are matched against the
//! `pending` map, so the actor never blocks waiting for the agent.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentctl::client::{ControlClient, EventStream};
use agentctl::spool::Spool;
use agents::profile::Profile;
use protocol::control::{Event, EventKind, StartAgent};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};

use crate::events::{SessionEvent, SessionEventKind};
use crate::history::{self, EntryType, History};
use crate::runtime::{LaunchSpec, Runtime};
use crate::store::{ExecutorRow, SessionRow, SessionState, Store, StoreError, task_state};

/// Errors a command can meet.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The session cannot do this now (e.g. a prompt while a turn runs).
    #[error("{0}")]
    InvalidState(String),
    /// The session has ended.
    #[error("the session is {0:?}; it takes no more commands")]
    Terminal(SessionState),
    /// A permission request id that is not pending.
    #[error("no pending request {0}")]
    NoSuchRequest(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// agentctl failed.
    #[error("agentctl: {0}")]
    Agentctl(#[from] agentctl::client::ClientError),
    /// The actor is gone.
    #[error("the session actor stopped")]
    Gone,
}

/// The cheap, always-current view of a session.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionView {
    /// The state.
    pub state: SessionState,
    /// The agent process is alive and attached.
    pub agent_running: bool,
    /// The ACP session id.
    pub acp_session_id: Option<String>,
    /// The last error.
    pub error: Option<String>,
    /// The running turn.
    pub turn_id: Option<String>,
}

enum Command {
    Prompt {
        text: String,
        reply: oneshot::Sender<Result<String, SessionError>>,
    },
    Cancel {
        reply: oneshot::Sender<Result<(), SessionError>>,
    },
    Permission {
        request_id: String,
        outcome: Value,
        reply: oneshot::Sender<Result<(), SessionError>>,
    },
    Stop {
        reply: oneshot::Sender<Result<(), SessionError>>,
    },
}

/// Handle to a session's actor. Cloning shares the actor.
#[derive(Debug, Clone)]
pub struct SessionHandle {
    commands: mpsc::Sender<Command>,
    view: watch::Receiver<SessionView>,
    events: Arc<Spool<SessionEvent>>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Command::Prompt { .. } => "Prompt",
            Command::Cancel { .. } => "Cancel",
            Command::Permission { .. } => "Permission",
            Command::Stop { .. } => "Stop",
        })
    }
}

impl SessionHandle {
    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, SessionError>>) -> Command,
    ) -> Result<T, SessionError> {
        let (reply, result) = oneshot::channel();
        self.commands.send(make(reply)).await.map_err(|_| SessionError::Gone)?;
        result.await.map_err(|_| SessionError::Gone)?
    }

    /// Starts a turn; returns its id.
    pub async fn prompt(&self, text: String) -> Result<String, SessionError> {
        self.ask(|reply| Command::Prompt { text, reply }).await
    }

    /// Cancels the running turn.
    pub async fn cancel(&self) -> Result<(), SessionError> {
        self.ask(|reply| Command::Cancel { reply }).await
    }

    /// Answers a permission request with an ACP outcome.
    pub async fn respond_permission(
        &self,
        request_id: String,
        outcome: Value,
    ) -> Result<(), SessionError> {
        self.ask(|reply| Command::Permission { request_id, outcome, reply }).await
    }

    /// Stops the agent and ends the session (`COMPLETED`).
    pub async fn stop(&self) -> Result<(), SessionError> {
        self.ask(|reply| Command::Stop { reply }).await
    }

    /// The current view.
    pub fn view(&self) -> SessionView {
        self.view.borrow().clone()
    }

    /// A receiver of view changes.
    pub fn watch(&self) -> watch::Receiver<SessionView> {
        self.view.clone()
    }

    /// The session's event spool.
    pub fn events(&self) -> &Arc<Spool<SessionEvent>> {
        &self.events
    }

    /// Whether the actor still runs.
    pub fn is_live(&self) -> bool {
        !self.commands.is_closed()
    }
}

/// What a session actor needs from the supervisor.
#[derive(Clone)]
pub struct SessionContext {
    /// The store.
    pub store: Store,
    /// Where agentctl runs.
    pub runtime: Arc<dyn Runtime>,
    /// The session's directory (`sessions/<id>/`).
    pub dir: PathBuf,
    /// The agent's launch argv, resolved (program first).
    pub agent_argv: Vec<OsString>,
    /// The agent's home, for `{home}` in the profile.
    pub agent_home: PathBuf,
    /// How long agentctl may take to be ready.
    pub ready_timeout: Duration,
}

/// Starts the actor for a session row that was just created (state `CREATED`). The actor
/// launches the execution, then serves commands until the session ends.
pub fn start_session(
    context: SessionContext,
    row: SessionRow,
    profile: Arc<Profile>,
    initial_prompt: Option<String>,
) -> Result<SessionHandle, SessionError> {
    let events = Arc::new(
        Spool::create(&context.dir.join("events"), agentctl::spool::DEFAULT_SEGMENT_BYTES)
            .map_err(|err| {
                SessionError::InvalidState(format!("cannot create the event log: {err}"))
            })?,
    );
    let history = History::open(&context.dir.join("history.jsonl"))
        .map_err(|err| SessionError::InvalidState(format!("cannot open the history: {err}")))?;
    let (commands_tx, commands_rx) = mpsc::channel(64);
    let view = SessionView {
        state: row.state,
        agent_running: false,
        acp_session_id: None,
        error: None,
        turn_id: None,
    };
    let (view_tx, view_rx) = watch::channel(view);
    let actor = SessionActor {
        context,
        row,
        profile,
        events: Arc::clone(&events),
        history,
        view_tx,
        execution: None,
        next_request_id: 1,
        pending: HashMap::new(),
        turn: None,
        unacked: 0,
        last_agent_seq: 0,
        done: false,
        init_deadline: None,
        initial_prompt: None,
        recent_stderr: String::new(),
    };
    tokio::spawn(actor.run(commands_rx, initial_prompt));
    Ok(SessionHandle { commands: commands_tx, view: view_rx, events })
}

/// What an outstanding request of ours was for.
#[derive(Debug)]
enum Pending {
    Initialize,
    NewSession { initial_prompt: Option<String> },
    Prompt { turn_id: String },
}

/// The live connection to one execution.
struct Execution {
    id: String,
    calls: ControlClient,
    events_rx: mpsc::Receiver<Result<Event, agentctl::client::ClientError>>,
    agent_running: bool,
}

struct Turn {
    id: String,
}

struct SessionActor {
    context: SessionContext,
    row: SessionRow,
    profile: Arc<Profile>,
    events: Arc<Spool<SessionEvent>>,
    history: History,
    view_tx: watch::Sender<SessionView>,
    execution: Option<Execution>,
    next_request_id: i64,
    pending: HashMap<String, Pending>,
    turn: Option<Turn>,
    /// agentctl events handled since the last ack.
    unacked: u64,
    last_agent_seq: u64,
    done: bool,
    init_deadline: Option<tokio::time::Instant>,
    /// The prompt to send once the ACP session is open.
    initial_prompt: Option<String>,
    /// The agent's recent stderr, for error messages.
    recent_stderr: String,
}

/// How many handled events may wait before an ack.
const ACK_EVERY: u64 = 256;

/// The most stderr put into a turn's error.
const STDERR_IN_ERROR: usize = 2000;

impl SessionActor {
    async fn run(mut self, mut commands: mpsc::Receiver<Command>, initial_prompt: Option<String>) {
        if let Err(err) = self.launch(initial_prompt).await {
            self.fail(format!("launch failed: {err}")).await;
        }
        while !self.done {
            let deadline = self.init_deadline;
            let init_timeout = async move {
                match deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            let agent_event = async {
                match self.execution.as_mut() {
                    Some(execution) => execution.events_rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                command = commands.recv() => match command {
                    Some(command) => self.handle_command(command).await,
                    None => break,
                },
                () = init_timeout => {
                    let tail = self.stderr_tail();
                    self.fail(format!(
                        "the agent did not answer initialize within {} ms{tail}",
                        self.profile.process.init_timeout_ms
                    ))
                    .await;
                }
                event = agent_event => match event {
                    Some(Ok(event)) => self.handle_agent_event(event).await,
                    Some(Err(err)) => self.lost(format!("lost the connection to agentctl: {err}")).await,
                    None => self.lost("agentctl's event stream ended".into()).await,
                },
            }
        }
        // Answer whatever is still queued, so no caller waits forever.
        commands.close();
        while let Some(command) = commands.recv().await {
            let state = self.row.state;
            reject(command, || SessionError::Terminal(state));
        }
    }

    async fn launch(&mut self, initial_prompt: Option<String>) -> Result<(), SessionError> {
        self.set_state(SessionState::Starting, None, Some(task_state::IN_PROGRESS)).await?;
        let execution_id = uuid::Uuid::now_v7().to_string();
        let token = agentctl::client::new_token();
        let spec = LaunchSpec {
            session_id: self.row.id.clone(),
            state_dir: self.context.dir.join("agentctl"),
            token: token.clone(),
            ready_timeout: self.context.ready_timeout,
        };
        let endpoint = self.context.runtime.launch(spec).await.map_err(|err| {
            SessionError::InvalidState(format!("runtime {}: {err}", self.context.runtime.name()))
        })?;
        self.context
            .store
            .put_executor(ExecutorRow {
                session_id: self.row.id.clone(),
                execution_id: execution_id.clone(),
                runtime: self.context.runtime.name().into(),
                status: "starting".into(),
                agentctl_port: Some(endpoint.addr.port().into()),
                agentctl_pid: Some(endpoint.ready.pid.into()),
                agentctl_start_time: Some(endpoint.ready.start_time as i64),
                boot_id: Some(endpoint.ready.boot_id.clone()),
                agentctl_token: Some(token.clone()),
                ..Default::default()
            })
            .await?;
        let calls = ControlClient::connect(endpoint.addr, &token).await?;
        let stream = ControlClient::connect(endpoint.addr, &token).await?.events(0);
        let (events_tx, events_rx) = mpsc::channel(1024);
        tokio::spawn(forward_events(stream, events_tx));
        let (program, args) = self
            .context
            .agent_argv
            .split_first()
            .expect("UNWRAP: a profile command is never empty");
        let start = StartAgent {
            command: program.to_string_lossy().into_owned(),
            args: args.iter().map(|arg| arg.to_string_lossy().into_owned()).collect(),
            env: self.profile.launch_env(&self.context.agent_home).into_iter().collect(),
            cwd: PathBuf::from(&self.row.workspace_path),
            extra_roots: Vec::new(),
        };
        calls.start_agent(&start).await?;
        self.execution =
            Some(Execution { id: execution_id, calls, events_rx, agent_running: true });
        self.update_view(|view| view.agent_running = true);
        let params = json!({
            "protocolVersion": protocol::acp::PROTOCOL_VERSION,
            "clientCapabilities": {"fs": {"readTextFile": true, "writeTextFile": true}, "terminal": false},
            "clientInfo": {"name": "tether", "title": "Tether", "version": env!("CARGO_PKG_VERSION")},
        });
        self.init_deadline = Some(
            tokio::time::Instant::now()
                + Duration::from_millis(self.profile.process.init_timeout_ms),
        );
        self.request(protocol::acp::method::INITIALIZE, params, Pending::Initialize).await?;
        // Sent once the ACP session is open.
        self.initial_prompt = initial_prompt;
        Ok(())
    }

    /// Sends an ACP request and remembers what it was for. Returns its id.
    async fn request(
        &mut self,
        method: &str,
        params: Value,
        purpose: Pending,
    ) -> Result<String, SessionError> {
        let id = self.next_request_id;
        self.next_request_id += 1;
        let key = id.to_string();
        self.pending.insert(key.clone(), purpose);
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await?;
        Ok(key)
    }

    async fn send(&self, message: Value) -> Result<(), SessionError> {
        let execution = self
            .execution
            .as_ref()
            .ok_or_else(|| SessionError::InvalidState("no agent is running".into()))?;
        execution.calls.send_acp(&message).await?;
        Ok(())
    }

    async fn handle_command(&mut self, command: Command) {
        if self.row.state.is_terminal() {
            let state = self.row.state;
            return reject(command, || SessionError::Terminal(state));
        }
        match command {
            Command::Prompt { text, reply } => {
                let result = self.start_turn(text).await;
                let _ = reply.send(result);
            }
            Command::Cancel { reply } => {
                let result = self.cancel().await;
                let _ = reply.send(result);
            }
            Command::Permission { request_id, outcome, reply } => {
                let result = self.answer_permission(&request_id, outcome).await;
                let _ = reply.send(result);
            }
            Command::Stop { reply } => {
                let result = self.stop().await;
                let _ = reply.send(result);
            }
        }
    }

    async fn start_turn(&mut self, text: String) -> Result<String, SessionError> {
        match self.row.state {
            SessionState::WaitingForInput => {}
            other => {
                return Err(SessionError::InvalidState(format!(
                    "the session is {}; prompts are taken in WAITING_FOR_INPUT",
                    other.as_str()
                )));
            }
        }
        let Some(execution) = self.execution.as_ref().filter(|execution| execution.agent_running)
        else {
            return Err(SessionError::InvalidState("the agent is not running".into()));
        };
        let execution_id = execution.id.clone();
        let Some(acp_session) = self.view_tx.borrow().acp_session_id.clone() else {
            return Err(SessionError::InvalidState("the ACP session is not open yet".into()));
        };
        let turn_id = uuid::Uuid::now_v7().to_string();
        let request_id = self.next_request_id;
        // The turn and its request id are durable before the request leaves.
        self.context
            .store
            .insert_turn(turn_id.clone(), self.row.id.clone(), execution_id, request_id.to_string())
            .await?;
        self.record_history(EntryType::UserMessage, text.clone(), None);
        self.emit(SessionEventKind::TurnStarted { turn_id: turn_id.clone(), prompt: text.clone() });
        self.turn = Some(Turn { id: turn_id.clone() });
        self.set_state(SessionState::Running, None, Some(task_state::IN_PROGRESS)).await?;
        self.update_view(|view| view.turn_id = Some(turn_id.clone()));
        let params = json!({"sessionId": acp_session, "prompt": [{"type": "text", "text": text}]});
        if let Err(err) = self
            .request(
                protocol::acp::method::SESSION_PROMPT,
                params,
                Pending::Prompt { turn_id: turn_id.clone() },
            )
            .await
        {
            self.end_turn("failed", None, Some(err.to_string())).await;
            return Err(err);
        }
        Ok(turn_id)
    }

    async fn cancel(&mut self) -> Result<(), SessionError> {
        if self.turn.is_none() {
            return Err(SessionError::InvalidState("no turn is running".into()));
        }
        let acp_session = self.view_tx.borrow().acp_session_id.clone();
        self.send(json!({"jsonrpc": "2.0", "method": protocol::acp::method::SESSION_CANCEL, "params": {"sessionId": acp_session}}))
            .await?;
        self.cancel_pending_permissions().await;
        Ok(())
    }

    async fn cancel_pending_permissions(&mut self) {
        let pending =
            self.context.store.list_pending(self.row.id.clone()).await.unwrap_or_default();
        for (request_id, _, _) in pending {
            if let Err(err) =
                self.answer_permission(&request_id, json!({"outcome": "cancelled"})).await
            {
                tracing::warn!(session = %self.row.id, %err, "cannot cancel a permission request");
            }
        }
    }

    async fn answer_permission(
        &mut self,
        request_id: &str,
        outcome: Value,
    ) -> Result<(), SessionError> {
        if !self.context.store.delete_pending(self.row.id.clone(), request_id.to_owned()).await? {
            return Err(SessionError::NoSuchRequest(request_id.to_owned()));
        }
        let id: Value =
            serde_json::from_str(request_id).unwrap_or(Value::String(request_id.to_owned()));
        let sent =
            self.send(json!({"jsonrpc": "2.0", "id": id, "result": {"outcome": outcome}})).await;
        self.emit(SessionEventKind::PermissionResolved {
            request_id: request_id.to_owned(),
            outcome,
        });
        sent
    }

    async fn stop(&mut self) -> Result<(), SessionError> {
        if let Some(execution) = self.execution.take() {
            let grace = Duration::from_millis(self.profile.process.stop_grace_ms);
            if let Err(err) = execution.calls.stop_agent(grace).await {
                tracing::warn!(session = %self.row.id, %err, "stopping the agent");
            }
            let _ = execution.calls.shutdown().await;
        }
        if self.turn.is_some() {
            self.end_turn("failed", None, Some("the session was stopped".into())).await;
        }
        self.update_view(|view| view.agent_running = false);
        self.set_state(SessionState::Completed, None, None).await?;
        self.done = true;
        Ok(())
    }

    async fn handle_agent_event(&mut self, event: Event) {
        self.last_agent_seq = event.seq;
        let turn_ended = match event.kind {
            EventKind::Acp { message, answered } => {
                self.handle_acp(message, answered.is_some()).await
            }
            EventKind::AgentExited { status, stderr_tail } => {
                self.agent_exited(status, stderr_tail).await;
                true
            }
            EventKind::StdoutNoise { line, reason } => {
                self.emit(SessionEventKind::Notice {
                    message: format!("agent output that is not ACP ({reason}): {line}"),
                });
                false
            }
            EventKind::Error { message } => {
                self.emit(SessionEventKind::Notice { message });
                false
            }
            EventKind::Stderr { line } => {
                self.recent_stderr.push_str(&line);
                self.recent_stderr.push('\n');
                if self.recent_stderr.len() > 2 * STDERR_IN_ERROR {
                    let keep = history::excerpt_tail(&self.recent_stderr, STDERR_IN_ERROR);
                    self.recent_stderr = keep;
                }
                false
            }
            EventKind::AgentStarted { .. } => false,
            _ => false,
        };
        self.unacked += 1;
        if turn_ended || self.unacked >= ACK_EVERY {
            self.ack().await;
        }
    }

    /// Syncs what was written, then acknowledges every handled agentctl event.
    async fn ack(&mut self) {
        if self.unacked == 0 {
            return;
        }
        if let Err(err) =
            self.history.sync().and_then(|()| self.events.sync().map_err(std::io::Error::other))
        {
            tracing::error!(session = %self.row.id, %err, "cannot sync; not acknowledging");
            return;
        }
        let Some(execution) = self.execution.as_ref() else { return };
        let seq = self.last_agent_seq;
        match execution.calls.ack(seq).await {
            Ok(_) => {
                self.unacked = 0;
                let _ = self
                    .context
                    .store
                    .set_acked_seq(self.row.id.clone(), execution.id.clone(), seq)
                    .await;
            }
            Err(err) => tracing::warn!(session = %self.row.id, %err, "ack failed"),
        }
    }

    /// Handles one ACP message from the agent. Returns whether a turn ended.
    async fn handle_acp(&mut self, message: Value, answered_by_agentctl: bool) -> bool {
        let method = message.get("method").and_then(Value::as_str).map(str::to_owned);
        let id = message.get("id").cloned();
        match (method, id) {
            (Some(method), Some(id)) => {
                if !answered_by_agentctl {
                    self.agent_request(
                        method,
                        id,
                        message.get("params").cloned().unwrap_or(Value::Null),
                    )
                    .await;
                }
                false
            }
            (Some(method), None) => {
                if method == protocol::acp::method::SESSION_UPDATE {
                    self.session_update(message.get("params").cloned().unwrap_or(Value::Null));
                }
                false
            }
            (None, Some(id)) => self.response(id, message).await,
            (None, None) => false,
        }
    }

    async fn agent_request(&mut self, method: String, id: Value, params: Value) {
        if method == protocol::acp::method::SESSION_REQUEST_PERMISSION {
            let request_id = id.to_string();
            let Some(execution_id) = self.execution.as_ref().map(|execution| execution.id.clone())
            else {
                return;
            };
            if let Err(err) = self
                .context
                .store
                .insert_pending(
                    self.row.id.clone(),
                    execution_id,
                    request_id.clone(),
                    method,
                    params.clone(),
                )
                .await
            {
                tracing::error!(session = %self.row.id, %err, "cannot record a permission request");
            }
            self.emit(SessionEventKind::PermissionRequest { request_id, params });
            return;
        }
        let error = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": format!("method not found: {method}")}});
        if let Err(err) = self.send(error).await {
            tracing::warn!(session = %self.row.id, %err, "cannot refuse an agent request");
        }
    }

    fn session_update(&mut self, params: Value) {
        let update = params.get("update").cloned().unwrap_or(Value::Null);
        let kind =
            update.get("sessionUpdate").and_then(Value::as_str).unwrap_or_default().to_owned();
        let text = || update["content"]["text"].as_str().map(str::to_owned);
        match kind.as_str() {
            "agent_message_chunk" => {
                if let Some(text) = text() {
                    self.history.agent_chunk(&text);
                    self.emit(SessionEventKind::AgentMessageChunk { text });
                }
            }
            "agent_thought_chunk" => {
                if let Some(text) = text() {
                    self.emit(SessionEventKind::AgentThoughtChunk { text });
                }
            }
            "tool_call" => {
                let title = update["title"].as_str().unwrap_or("tool").to_owned();
                let id = update["toolCallId"].as_str().unwrap_or_default().to_owned();
                let status = update["status"].as_str().unwrap_or("pending").to_owned();
                self.record_history(EntryType::ToolCall, title.clone(), Some((title, id, status)));
                self.emit(SessionEventKind::ToolCall { update });
            }
            "tool_call_update" => {
                let status = update["status"].as_str().unwrap_or_default().to_owned();
                if matches!(status.as_str(), "completed" | "failed") {
                    let id = update["toolCallId"].as_str().unwrap_or_default().to_owned();
                    let content = tool_text(&update);
                    let excerpt = history::excerpt(&content, history::TOOL_RESULT_EXCERPT_CHARS);
                    let name = update["title"].as_str().unwrap_or("tool").to_owned();
                    self.record_history(EntryType::ToolResult, excerpt, Some((name, id, status)));
                }
                self.emit(SessionEventKind::ToolCallUpdate { update });
            }
            _ => self.emit(SessionEventKind::SessionUpdate { update }),
        }
    }

    /// A response to one of our requests. Returns whether a turn ended.
    async fn response(&mut self, id: Value, message: Value) -> bool {
        let key = match &id {
            Value::Number(n) => n.to_string(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let Some(purpose) = self.pending.remove(&key) else { return false };
        let result = match message.get("error") {
            Some(error) => Err(rpc_error_text(error)),
            None => Ok(message.get("result").cloned().unwrap_or(Value::Null)),
        };
        match purpose {
            Pending::Initialize => {
                self.init_deadline = None;
                match result {
                    Ok(_) => {
                        let initial_prompt = self.initial_prompt.take();
                        let params = json!({"cwd": self.row.workspace_path, "mcpServers": []});
                        if let Err(err) = self
                            .request(
                                protocol::acp::method::SESSION_NEW,
                                params,
                                Pending::NewSession { initial_prompt },
                            )
                            .await
                        {
                            self.fail(format!("session/new could not be sent: {err}")).await;
                        }
                    }
                    Err(error) => {
                        self.fail(format!(
                            "the agent refused initialize: {error}{}",
                            self.stderr_tail()
                        ))
                        .await
                    }
                }
                false
            }
            Pending::NewSession { initial_prompt } => {
                match result.map(|result| {
                    result.get("sessionId").and_then(Value::as_str).map(str::to_owned)
                }) {
                    Ok(Some(acp_session)) => self.session_opened(acp_session, initial_prompt).await,
                    Ok(None) => self.fail("session/new returned no sessionId".into()).await,
                    Err(error) => {
                        self.fail(format!("the agent refused session/new: {error}")).await
                    }
                }
                false
            }
            Pending::Prompt { turn_id } => {
                if self.turn.as_ref().is_some_and(|turn| turn.id == turn_id) {
                    match result {
                        Ok(result) => {
                            let stop_reason = result
                                .get("stopReason")
                                .and_then(Value::as_str)
                                .unwrap_or("end_turn")
                                .to_owned();
                            self.end_turn("completed", Some(stop_reason), None).await;
                        }
                        Err(error) => self.end_turn("failed", None, Some(error)).await,
                    }
                }
                true
            }
        }
    }

    async fn session_opened(&mut self, acp_session: String, initial_prompt: Option<String>) {
        let execution_id =
            self.execution.as_ref().map(|execution| execution.id.clone()).unwrap_or_default();
        let token = self.profile.keeps_resume_token().then(|| acp_session.clone());
        if let Err(err) = self
            .context
            .store
            .set_resume_token(self.row.id.clone(), execution_id.clone(), token)
            .await
        {
            tracing::error!(session = %self.row.id, %err, "cannot store the resume token");
        }
        let _ = self
            .context
            .store
            .set_executor_status(self.row.id.clone(), execution_id, "running")
            .await;
        self.update_view(|view| view.acp_session_id = Some(acp_session));
        if let Err(err) =
            self.set_state(SessionState::WaitingForInput, None, Some(task_state::REVIEW)).await
        {
            tracing::error!(session = %self.row.id, %err, "cannot record the session state");
        }
        if let Some(prompt) = initial_prompt.filter(|prompt| !prompt.trim().is_empty())
            && let Err(err) = self.start_turn(prompt).await
        {
            self.emit(SessionEventKind::Notice {
                message: format!("the initial prompt could not be sent: {err}"),
            });
        }
    }

    async fn end_turn(
        &mut self,
        state: &'static str,
        stop_reason: Option<String>,
        error: Option<String>,
    ) {
        let Some(turn) = self.turn.take() else { return };
        if let Err(err) = self.history.flush_agent() {
            tracing::error!(session = %self.row.id, %err, "cannot write the agent's message to the history");
        }
        if let Err(err) = self
            .context
            .store
            .end_turn(turn.id.clone(), state, stop_reason.clone(), error.clone())
            .await
        {
            tracing::error!(session = %self.row.id, %err, "cannot record the end of a turn");
        }
        self.emit(SessionEventKind::TurnEnded {
            turn_id: turn.id,
            state: state.into(),
            stop_reason,
            error: error.clone(),
        });
        self.update_view(|view| view.turn_id = None);
        if !self.row.state.is_terminal() {
            let _ = self
                .set_state(SessionState::WaitingForInput, error, Some(task_state::REVIEW))
                .await;
        }
    }

    async fn agent_exited(&mut self, status: protocol::control::ExitInfo, stderr_tail: String) {
        let how = match (status.code, status.signal) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(signal)) => format!("signal {signal}"),
            (None, None) => "unknown status".into(),
        };
        let tail = history::excerpt_tail(stderr_tail.trim_end(), STDERR_IN_ERROR);
        let reason = if tail.is_empty() {
            format!("the agent exited ({how})")
        } else {
            format!("the agent exited ({how}): {tail}")
        };
        if let Some(execution) = self.execution.as_mut() {
            execution.agent_running = false;
            let _ = self
                .context
                .store
                .set_executor_status(self.row.id.clone(), execution.id.clone(), "exited")
                .await;
        }
        self.update_view(|view| view.agent_running = false);
        // Nobody can answer the agent's questions any more.
        if let Ok(pending) = self.context.store.list_pending(self.row.id.clone()).await {
            for (request_id, _, _) in pending {
                let _ = self
                    .context
                    .store
                    .delete_pending(self.row.id.clone(), request_id.clone())
                    .await;
                self.emit(SessionEventKind::PermissionResolved {
                    request_id,
                    outcome: json!({"outcome": "cancelled"}),
                });
            }
        }
        if self.init_deadline.take().is_some() || self.row.state == SessionState::Starting {
            return self.fail(format!("launch failed: {reason}")).await;
        }
        if self.turn.is_some() {
            self.end_turn("failed", None, Some(reason.clone())).await;
        }
        // The session stays recoverable: waiting for input, with the reason.
        let _ = self
            .set_state(
                SessionState::WaitingForInput,
                Some(reason.clone()),
                Some(task_state::REVIEW),
            )
            .await;
        self.emit(SessionEventKind::Notice { message: reason });
        self.ack().await;
        if let Some(execution) = self.execution.take() {
            let _ = execution.calls.shutdown().await;
        }
    }

    /// agentctl itself went away.
    async fn lost(&mut self, reason: String) {
        if let Some(mut execution) = self.execution.take() {
            execution.agent_running = false;
        }
        self.update_view(|view| view.agent_running = false);
        if self.row.state == SessionState::Starting {
            return self.fail(reason).await;
        }
        if self.turn.is_some() {
            self.end_turn("failed", None, Some(reason.clone())).await;
        }
        let _ = self
            .set_state(SessionState::WaitingForInput, Some(reason), Some(task_state::REVIEW))
            .await;
    }

    /// A launch failure: session and task `FAILED` with the reason; the execution is shut
    /// down.
    async fn fail(&mut self, reason: String) {
        tracing::warn!(session = %self.row.id, %reason, "session failed");
        self.init_deadline = None;
        if let Some(execution) = self.execution.take() {
            let _ = execution.calls.stop_agent(Duration::from_millis(500)).await;
            let _ = execution.calls.shutdown().await;
        }
        self.update_view(|view| view.agent_running = false);
        let _ = self.set_state(SessionState::Failed, Some(reason), Some(task_state::FAILED)).await;
        self.done = true;
    }

    /// `"; stderr: …"` with the agent's recent stderr, or nothing.
    fn stderr_tail(&self) -> String {
        let tail = history::excerpt_tail(self.recent_stderr.trim_end(), STDERR_IN_ERROR);
        if tail.is_empty() { String::new() } else { format!("; stderr: {tail}") }
    }

    fn record_history(
        &mut self,
        kind: EntryType,
        content: String,
        tool: Option<(String, String, String)>,
    ) {
        if let Err(err) = self.history.append(kind, content, tool) {
            tracing::error!(session = %self.row.id, %err, "cannot write the history");
        }
    }

    fn emit(&self, kind: SessionEventKind) {
        if let Err(err) = self.events.append_with(|seq, at| SessionEvent { seq, at, kind }) {
            tracing::error!(session = %self.row.id, %err, "cannot spool a session event");
        }
    }

    async fn set_state(
        &mut self,
        state: SessionState,
        error: Option<String>,
        task: Option<&'static str>,
    ) -> Result<(), SessionError> {
        self.context
            .store
            .set_session_state(self.row.id.clone(), state, error.clone(), task)
            .await?;
        self.row.state = state;
        self.row.error_message = error.clone();
        self.emit(SessionEventKind::State { state, error: error.clone() });
        self.update_view(|view| {
            view.state = state;
            view.error = error;
        });
        Ok(())
    }

    fn update_view(&self, change: impl FnOnce(&mut SessionView)) {
        self.view_tx.send_modify(change);
    }
}

fn reject(command: Command, error: impl Fn() -> SessionError) {
    match command {
        Command::Prompt { reply, .. } => drop(reply.send(Err(error()))),
        Command::Cancel { reply } | Command::Stop { reply } | Command::Permission { reply, .. } => {
            drop(reply.send(Err(error())))
        }
    }
}

/// Feeds agentctl events into the actor's channel until either side goes away.
async fn forward_events(
    mut stream: EventStream,
    events_tx: mpsc::Sender<Result<Event, agentctl::client::ClientError>>,
) {
    loop {
        let next = tokio::select! {
            next = stream.next() => next,
            () = events_tx.closed() => return,
        };
        let failed = next.is_err();
        if events_tx.send(next).await.is_err() || failed {
            return;
        }
    }
}

/// The text of a tool call update's content blocks.
fn tool_text(update: &Value) -> String {
    let Some(content) = update.get("content").and_then(Value::as_array) else {
        return String::new();
    };
    content
        .iter()
        .filter_map(|item| {
            item.get("content").and_then(|inner| inner.get("text")).and_then(Value::as_str)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A JSON-RPC error as one line; `-32603` with `data.details` shows the details.
fn rpc_error_text(error: &Value) -> String {
    let message = error.get("message").and_then(Value::as_str).unwrap_or("error");
    match error.get("data").and_then(|data| data.get("details")).and_then(Value::as_str) {
        Some(details) => format!("{message}: {details}"),
        None => message.to_owned(),
    }
}
