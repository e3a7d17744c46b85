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
    /// The agent's execution is not there (it exited, or its sidecar vanished).
    #[error("the agent is not running: {0}")]
    AgentGone(String),
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
    /// An execution is being launched (or a resume is deciding how to restore).
    pub launching: bool,
    /// Re-attaching to a live sidecar after a supervisor restart.
    pub adopting: bool,
    /// How the last resume went.
    pub resume_outcome: Option<String>,
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
    Resume {
        reply: oneshot::Sender<Result<String, SessionError>>,
    },
    Detach {
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
            Command::Resume { .. } => "Resume",
            Command::Detach { .. } => "Detach",
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

    /// Resumes the session if its agent is not running (once, however many ask at the same
    /// time); returns the outcome (`native_resume`, `native_load`, `resume_command`,
    /// `history_injection`, `fresh`, or `already_running`).
    pub async fn resume(&self) -> Result<String, SessionError> {
        self.ask(|reply| Command::Resume { reply }).await
    }

    /// Stops the agent and its sidecar but keeps the session active (it needs a resume).
    pub async fn detach(&self) -> Result<(), SessionError> {
        self.ask(|reply| Command::Detach { reply }).await
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

/// Resolves a program name to the argv prefix that runs it.
pub type Resolver = Arc<dyn Fn(&str) -> Option<Vec<OsString>> + Send + Sync>;

/// What a session actor needs from the supervisor.
#[derive(Clone)]
pub struct SessionContext {
    /// The store.
    pub store: Store,
    /// Where agentctl runs.
    pub runtime: Arc<dyn Runtime>,
    /// The session's directory (`sessions/<id>/`).
    pub dir: PathBuf,
    /// Resolves a program name to the argv prefix that runs it (a path, or an applet).
    pub resolve: Resolver,
    /// The agent's home, for `{home}` in the profile.
    pub agent_home: PathBuf,
    /// How long agentctl may take to be ready.
    pub ready_timeout: Duration,
    /// Where the agent's own state dirs live on the host (`agent-state/<session-id>/`).
    pub agent_state_root: PathBuf,
}

/// How an actor begins.
#[derive(Debug)]
pub enum Start {
    /// A new session: launch, `session/new`, then the initial prompt if any.
    Fresh {
        /// Sent once the ACP session is open.
        initial_prompt: Option<String>,
    },
    /// A session with no live agent: launch a new execution and restore what can be.
    Resume,
    /// A live sidecar found at startup: reconnect, replay from the acknowledged point.
    Adopt(Box<AdoptPlan>),
}

/// What re-adoption needs.
#[derive(Debug)]
pub struct AdoptPlan {
    /// The runtime record.
    pub executor: ExecutorRow,
    /// Where the sidecar listens.
    pub addr: std::net::SocketAddr,
    /// Turns still running: `(turn_id, request_id)`.
    pub open_turns: Vec<(String, String)>,
}

/// Starts the actor for a session.
pub fn start_session(
    context: SessionContext,
    row: SessionRow,
    profile: Arc<Profile>,
    events: Arc<Spool<SessionEvent>>,
    start: Start,
) -> Result<SessionHandle, SessionError> {
    let history = History::open(&context.dir.join("history.jsonl"))
        .map_err(|err| SessionError::InvalidState(format!("cannot open the history: {err}")))?;
    let events_mark =
        events.last_entry().ok().flatten().and_then(|event| event.agent_seq).unwrap_or(0);
    let history_mark = history.watermark().unwrap_or(0);
    let (commands_tx, commands_rx) = mpsc::channel(256);
    let view = SessionView {
        state: row.state,
        agent_running: false,
        acp_session_id: None,
        error: row.error_message.clone(),
        turn_id: None,
        launching: !matches!(start, Start::Adopt(_)),
        adopting: matches!(start, Start::Adopt(_)),
        resume_outcome: None,
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
        // Ids unique across supervisor restarts, so a replayed response never meets a new
        // request of the same id.
        next_request_id: crate::store::now_ms() * 1000,
        pending: HashMap::new(),
        turn: None,
        unacked: 0,
        last_agent_seq: 0,
        done: false,
        init_deadline: None,
        initial_prompt: None,
        recent_stderr: String::new(),
        resume: None,
        resume_context_pending: false,
        loading: false,
        history_mark,
        events_mark,
        suppress_history: false,
        suppress_events: false,
    };
    tokio::spawn(actor.run(commands_rx, start));
    Ok(SessionHandle { commands: commands_tx, view: view_rx, events })
}

/// What an outstanding request of ours was for.
#[derive(Debug)]
enum Pending {
    Initialize,
    NewSession,
    /// `session/resume` (`load: false`) or `session/load` (`load: true`) of a token.
    Restore {
        load: bool,
        token: String,
    },
    Prompt {
        turn_id: String,
        injected: bool,
    },
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

/// A resume in progress.
struct ResumeState {
    /// The token being restored, if any.
    token: Option<String>,
    /// The agent was relaunched with the profile's `resume_command`.
    relaunched: bool,
    /// A native restore was tried and rejected.
    native_failed: bool,
    /// Everyone waiting for the outcome.
    waiters: Vec<oneshot::Sender<Result<String, SessionError>>>,
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
    resume: Option<ResumeState>,
    /// The next prompt carries the resume context (mirrors the stored flag).
    resume_context_pending: bool,
    /// A `session/load` is replaying: its updates restore the agent, not our records.
    loading: bool,
    /// agentctl seqs at or below these were recorded before a restart.
    history_mark: u64,
    events_mark: u64,
    suppress_history: bool,
    suppress_events: bool,
}

/// How many handled events may wait before an ack.
const ACK_EVERY: u64 = 256;

/// The most stderr put into a turn's error.
const STDERR_IN_ERROR: usize = 2000;

impl SessionActor {
    async fn run(mut self, mut commands: mpsc::Receiver<Command>, start: Start) {
        match start {
            Start::Fresh { initial_prompt } => {
                if let Err(err) = self.launch(None, initial_prompt).await {
                    self.fail(format!("launch failed: {err}")).await;
                }
            }
            Start::Resume => self.begin_resume(None).await,
            Start::Adopt(plan) => self.adopt(*plan).await,
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

    /// Launches a new execution: agentctl, then the agent (with `resume_token`, through
    /// the profile's `resume_command`), then `initialize`. The rest is event-driven.
    async fn launch(
        &mut self,
        resume_token: Option<&str>,
        initial_prompt: Option<String>,
    ) -> Result<(), SessionError> {
        self.update_view(|view| view.launching = true);
        self.set_state(SessionState::Starting, None, Some(task_state::IN_PROGRESS)).await?;
        // In a container the agent's home and programs are the container's.
        let in_container = self.context.runtime.agent_home();
        let home = in_container.clone().unwrap_or_else(|| self.context.agent_home.clone());
        let argv = match resume_token {
            Some(token) => self
                .profile
                .resume_argv(&home, token)
                .unwrap_or_else(|| self.profile.launch_argv(&home)),
            None => self.profile.launch_argv(&home),
        };
        let mut resolved = match in_container {
            Some(_) => vec![OsString::from(&argv[0])],
            None => (self.context.resolve)(&argv[0]).ok_or_else(|| {
                SessionError::InvalidState(format!(
                    "the agent program {} is not available",
                    argv[0]
                ))
            })?,
        };
        resolved.extend(argv[1..].iter().map(OsString::from));
        let execution_id = uuid::Uuid::now_v7().to_string();
        let token = agentctl::client::new_token();
        let spec = LaunchSpec {
            session_id: self.row.id.clone(),
            task_id: self.row.task_id.clone(),
            execution_id: execution_id.clone(),
            state_dir: self.context.dir.join("agentctl"),
            token: token.clone(),
            ready_timeout: self.context.ready_timeout,
            workspace: PathBuf::from(&self.row.workspace_path),
            docker: self.profile.docker.clone(),
            agent_state_dirs: self.profile.session.agent_state_dirs.clone(),
            agent_state_root: self.context.agent_state_root.clone(),
        };
        let endpoint = self.context.runtime.launch(spec).await.map_err(|err| {
            SessionError::InvalidState(format!("runtime {}: {err}", self.context.runtime.name()))
        })?;
        let previous = self.context.store.get_executor(self.row.id.clone()).await?;
        self.context
            .store
            .put_executor(ExecutorRow {
                session_id: self.row.id.clone(),
                execution_id: execution_id.clone(),
                runtime: self.context.runtime.name().into(),
                status: "starting".into(),
                resume_token: previous.as_ref().and_then(|previous| previous.resume_token.clone()),
                agentctl_port: Some(endpoint.addr.port().into()),
                agentctl_pid: Some(endpoint.ready.pid.into()),
                agentctl_start_time: Some(endpoint.ready.start_time as i64),
                boot_id: Some(endpoint.ready.boot_id.clone()),
                agentctl_token: Some(token.clone()),
                container_id: endpoint.container_id.clone(),
                ..Default::default()
            })
            .await?;
        self.resume_context_pending = false;
        let calls = ControlClient::connect(endpoint.addr, &token).await?;
        let stream = ControlClient::connect(endpoint.addr, &token).await?.events(0);
        let (events_tx, events_rx) = mpsc::channel(1024);
        tokio::spawn(forward_events(stream, events_tx));
        let (program, args) =
            resolved.split_first().expect("UNWRAP: a resolved argv is never empty");
        let start = StartAgent {
            command: program.to_string_lossy().into_owned(),
            args: args.iter().map(|arg| arg.to_string_lossy().into_owned()).collect(),
            env: self.profile.launch_env(&home).into_iter().collect(),
            cwd: PathBuf::from(&self.row.workspace_path),
            extra_roots: Vec::new(),
        };
        calls.start_agent(&start).await?;
        // A new execution starts a new agentctl sequence: nothing of it was recorded yet.
        self.history_mark = 0;
        self.events_mark = 0;
        self.last_agent_seq = 0;
        self.unacked = 0;
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
        self.initial_prompt = initial_prompt;
        Ok(())
    }

    /// Starts a resume (DESIGN §6.2): A, a token → native restore (or `resume_command`), no
    /// prompt; B, no token and the session was waiting → boot idle; C, otherwise → the
    /// task's description as the initial prompt.
    async fn begin_resume(
        &mut self,
        waiter: Option<oneshot::Sender<Result<String, SessionError>>>,
    ) {
        let executor = self.context.store.get_executor(self.row.id.clone()).await.ok().flatten();
        let mut token = executor.as_ref().and_then(|executor| executor.resume_token.clone());
        if token.is_some() && !self.profile.keeps_resume_token() {
            // The profile has no restore path (any more): the token is useless.
            if let Some(executor) = &executor {
                let _ = self
                    .context
                    .store
                    .set_resume_token(self.row.id.clone(), executor.execution_id.clone(), None)
                    .await;
            }
            token = None;
        }
        let relaunch = token.is_some()
            && !self.profile.session.native_resume
            && self.profile.session.resume_command.is_some();
        let initial_prompt = match (&token, self.row.state) {
            (Some(_), _) | (None, SessionState::WaitingForInput) => None,
            (None, _) => match self.context.store.get_task(self.row.task_id.clone()).await {
                Ok(task) if !task.description.trim().is_empty() => Some(task.description),
                _ => None,
            },
        };
        self.resume = Some(ResumeState {
            token: token.clone(),
            relaunched: relaunch,
            native_failed: false,
            waiters: waiter.into_iter().collect(),
        });
        let relaunch_token = if relaunch { token.as_deref() } else { None };
        if let Err(err) = self.launch(relaunch_token, initial_prompt).await {
            self.fail(format!("resume failed: {err}")).await;
        }
    }

    /// Re-attaches to a live sidecar after a supervisor restart and replays its events
    /// from the acknowledged point.
    async fn adopt(&mut self, plan: AdoptPlan) {
        let executor = plan.executor;
        let token = executor.agentctl_token.clone().unwrap_or_default();
        let connected = async {
            let calls = ControlClient::connect(plan.addr, &token).await?;
            let status = calls.status().await?;
            let stream = ControlClient::connect(plan.addr, &token)
                .await?
                .events(executor.acked_seq.max(0) as u64);
            Ok::<_, agentctl::client::ClientError>((calls, status, stream))
        };
        let (calls, status, stream) = match connected.await {
            Ok(connected) => connected,
            Err(err) => {
                // The sidecar died between the liveness check and now: recover as dead.
                tracing::warn!(session = %self.row.id, %err, "cannot re-attach to agentctl");
                let store = &self.context.store;
                let _ = store.interrupt_turns(self.row.id.clone()).await;
                let _ = store.clear_pending(self.row.id.clone()).await;
                let _ = store
                    .set_executor_status(self.row.id.clone(), executor.execution_id.clone(), "dead")
                    .await;
                if self.row.state == SessionState::Starting {
                    let _ = self.set_state(SessionState::WaitingForInput, None, None).await;
                }
                self.update_view(|view| {
                    view.adopting = false;
                    view.launching = false;
                });
                return;
            }
        };
        let (events_tx, events_rx) = mpsc::channel(1024);
        tokio::spawn(forward_events(stream, events_tx));
        let running = status.agent_state == protocol::control::AgentState::Running;
        self.last_agent_seq = executor.acked_seq.max(0) as u64;
        self.resume_context_pending = executor.resume_context_pending;
        for (turn_id, request_id) in plan.open_turns {
            self.pending
                .insert(request_id, Pending::Prompt { turn_id: turn_id.clone(), injected: false });
            self.turn = Some(Turn { id: turn_id });
        }
        self.execution = Some(Execution {
            id: executor.execution_id.clone(),
            calls,
            events_rx,
            agent_running: running,
        });
        let turn_id = self.turn.as_ref().map(|turn| turn.id.clone());
        self.update_view(|view| {
            view.agent_running = running;
            view.acp_session_id = executor.acp_session_id.clone();
            view.turn_id = turn_id;
            view.adopting = false;
            view.launching = false;
            view.resume_outcome = executor.resume_outcome.clone();
        });
        // People may still answer what the agent asked before the restart.
        if let Ok(pending) = self.context.store.list_pending(self.row.id.clone()).await {
            for (request_id, _, params) in pending {
                self.emit(SessionEventKind::PermissionRequest { request_id, params });
            }
        }
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
            Command::Resume { reply } => {
                if let Some(resume) = self.resume.as_mut() {
                    // One resume at a time; everyone gets its outcome.
                    resume.waiters.push(reply);
                } else if self.execution.as_ref().is_some_and(|execution| execution.agent_running) {
                    let _ = reply.send(Ok("already_running".into()));
                } else {
                    self.begin_resume(Some(reply)).await;
                }
            }
            Command::Detach { reply } => {
                let result = self.detach().await;
                let _ = reply.send(result);
            }
        }
    }

    /// Stops the agent and agentctl; the session stays active and needs a resume.
    async fn detach(&mut self) -> Result<(), SessionError> {
        if let Some(execution) = self.execution.take() {
            let grace = Duration::from_millis(self.profile.process.stop_grace_ms);
            let _ = execution.calls.stop_agent(grace).await;
            let _ = execution.calls.shutdown().await;
            let _ = self
                .context
                .store
                .set_executor_status(self.row.id.clone(), execution.id, "stopped")
                .await;
        }
        if self.turn.is_some() {
            self.end_turn("failed", None, Some("the agent was stopped".into())).await;
        }
        self.update_view(|view| view.agent_running = false);
        Ok(())
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
            return Err(SessionError::AgentGone("no execution".into()));
        };
        let execution_id = execution.id.clone();
        let Some(acp_session) = self.view_tx.borrow().acp_session_id.clone() else {
            return Err(SessionError::InvalidState("the ACP session is not open yet".into()));
        };
        let injected = self.resume_context_pending;
        let sent_text = if injected { self.resume_context(&text).await? } else { text.clone() };
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
        let params =
            json!({"sessionId": acp_session, "prompt": [{"type": "text", "text": sent_text}]});
        if let Err(err) = self
            .request(
                protocol::acp::method::SESSION_PROMPT,
                params,
                Pending::Prompt { turn_id: turn_id.clone(), injected },
            )
            .await
        {
            self.end_turn("failed", None, Some(err.to_string())).await;
            return Err(match err {
                SessionError::Agentctl(err) => SessionError::AgentGone(err.to_string()),
                other => other,
            });
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

    /// The resume context around `prompt`, from the history on disk.
    async fn resume_context(&self, prompt: &str) -> Result<String, SessionError> {
        let path = self.history.path().to_owned();
        let prompt = prompt.to_owned();
        let budget = self.profile.session.resume_context_budget;
        let built = tokio::task::spawn_blocking(move || {
            let mut file = std::fs::File::open(&path)?;
            crate::resume_context::build(&mut file, &prompt, budget)
        })
        .await
        .map_err(|err| SessionError::InvalidState(format!("building the resume context: {err}")))?
        .map_err(|err| SessionError::InvalidState(format!("reading the history: {err}")))?;
        Ok(built.text)
    }

    async fn handle_agent_event(&mut self, event: Event) {
        self.last_agent_seq = event.seq;
        // After a restart, replayed events that were already recorded are not recorded
        // again (their effects on the store are idempotent).
        self.suppress_history = event.seq <= self.history_mark;
        self.suppress_events = event.seq <= self.events_mark;
        if !self.suppress_history {
            self.history.set_watermark(event.seq);
        }
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
        self.suppress_history = false;
        self.suppress_events = false;
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
        if self.suppress_events {
            // Handled before the restart (recorded, and possibly answered since).
            return;
        }
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
        if self.loading {
            // `session/load` replays the conversation into the agent; we have it already.
            return;
        }
        let update = params.get("update").cloned().unwrap_or(Value::Null);
        let kind =
            update.get("sessionUpdate").and_then(Value::as_str).unwrap_or_default().to_owned();
        let text = || update["content"]["text"].as_str().map(str::to_owned);
        match kind.as_str() {
            "agent_message_chunk" => {
                if let Some(text) = text() {
                    if !self.suppress_history {
                        self.history.agent_chunk(&text);
                    }
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
                    Ok(result) => self.initialized(&result).await,
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
            Pending::Restore { load, token } => {
                self.loading = false;
                match result {
                    Ok(_) => {
                        let outcome = if load { "native_load" } else { "native_resume" };
                        self.session_opened(token, Some(outcome)).await;
                    }
                    Err(_) => {
                        let code = message["error"]["code"].as_i64();
                        let reason = rpc_error_text(&message["error"]);
                        if matches!(code, Some(-32601) | Some(-32002)) {
                            self.restore_rejected(format!(
                                "the agent rejected the stored session: {reason}"
                            ))
                            .await;
                        } else {
                            self.fail(format!("restoring the session failed: {reason}")).await;
                        }
                    }
                }
                false
            }
            Pending::NewSession => {
                match result.map(|result| {
                    result.get("sessionId").and_then(Value::as_str).map(str::to_owned)
                }) {
                    Ok(Some(acp_session)) => self.session_opened(acp_session, None).await,
                    Ok(None) => self.fail("session/new returned no sessionId".into()).await,
                    Err(error) => {
                        self.fail(format!("the agent refused session/new: {error}")).await
                    }
                }
                false
            }
            Pending::Prompt { turn_id, injected } => {
                if self.turn.as_ref().is_some_and(|turn| turn.id == turn_id) {
                    match result {
                        Ok(result) => {
                            if injected {
                                self.clear_resume_context_pending().await;
                            }
                            self.store_token_again().await;
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

    /// `initialize` answered: restore natively when a resume has a token and the agent
    /// can, else open a new ACP session.
    async fn initialized(&mut self, result: &Value) {
        let native = self
            .resume
            .as_ref()
            .filter(|resume| !resume.relaunched && self.profile.session.native_resume)
            .and_then(|resume| resume.token.clone());
        let Some(token) = native else { return self.new_acp_session().await };
        let capabilities = &result["agentCapabilities"];
        let params = json!({"sessionId": token, "cwd": self.row.workspace_path, "mcpServers": []});
        let sent = if capabilities["sessionCapabilities"]["resume"].is_object() {
            self.request(
                protocol::acp::method::SESSION_RESUME,
                params,
                Pending::Restore { load: false, token },
            )
            .await
        } else if capabilities["loadSession"] == true {
            self.loading = true;
            self.request(
                protocol::acp::method::SESSION_LOAD,
                params,
                Pending::Restore { load: true, token },
            )
            .await
        } else {
            return self
                .restore_rejected("the agent offers neither session/resume nor session/load".into())
                .await;
        };
        if let Err(err) = sent {
            self.fail(format!("the restore request could not be sent: {err}")).await;
        }
    }

    async fn new_acp_session(&mut self) {
        let params = json!({"cwd": self.row.workspace_path, "mcpServers": []});
        if let Err(err) =
            self.request(protocol::acp::method::SESSION_NEW, params, Pending::NewSession).await
        {
            self.fail(format!("session/new could not be sent: {err}")).await;
        }
    }

    /// A native restore was refused: the token is cleared, a notice says so, and a fresh
    /// ACP session takes its place (not a failure).
    async fn restore_rejected(&mut self, reason: String) {
        self.emit(SessionEventKind::Notice {
            message: format!("{reason}; starting a fresh agent session"),
        });
        if let Some(execution) = &self.execution {
            let _ = self
                .context
                .store
                .set_resume_token(self.row.id.clone(), execution.id.clone(), None)
                .await;
        }
        if let Some(resume) = self.resume.as_mut() {
            resume.native_failed = true;
            resume.token = None;
        }
        self.new_acp_session().await;
    }

    /// The ACP session is open (new or restored): record it, settle a resume's outcome,
    /// and send the initial prompt if there is one.
    async fn session_opened(&mut self, acp_session: String, restored: Option<&'static str>) {
        let execution_id =
            self.execution.as_ref().map(|execution| execution.id.clone()).unwrap_or_default();
        let token = self.profile.keeps_resume_token().then(|| acp_session.clone());
        let store = &self.context.store;
        if let Err(err) =
            store.set_resume_token(self.row.id.clone(), execution_id.clone(), token).await
        {
            tracing::error!(session = %self.row.id, %err, "cannot store the resume token");
        }
        let _ = store
            .set_acp_session(self.row.id.clone(), execution_id.clone(), acp_session.clone())
            .await;
        let _ =
            store.set_executor_status(self.row.id.clone(), execution_id.clone(), "running").await;
        let outcome = match self.resume.take() {
            None => None,
            Some(resume) => {
                let outcome = match restored {
                    Some(outcome) => outcome,
                    None if resume.relaunched => "resume_command",
                    None if !self.history.is_empty()
                        && (self.profile.session.history_injection || resume.native_failed) =>
                    {
                        self.resume_context_pending = true;
                        let _ = store
                            .set_resume_context_pending(
                                self.row.id.clone(),
                                execution_id.clone(),
                                true,
                            )
                            .await;
                        "history_injection"
                    }
                    None => "fresh",
                };
                let _ = store
                    .set_resume_outcome(self.row.id.clone(), execution_id.clone(), outcome)
                    .await;
                Some((outcome, resume.waiters))
            }
        };
        self.update_view(|view| view.acp_session_id = Some(acp_session));
        if let Err(err) =
            self.set_state(SessionState::WaitingForInput, None, Some(task_state::REVIEW)).await
        {
            tracing::error!(session = %self.row.id, %err, "cannot record the session state");
        }
        if let Some((outcome, waiters)) = outcome {
            self.emit(SessionEventKind::ResumeOutcome { outcome: outcome.into() });
            self.update_view(|view| view.resume_outcome = Some(outcome.into()));
            for waiter in waiters {
                let _ = waiter.send(Ok(outcome.into()));
            }
        }
        self.update_view(|view| view.launching = false);
        if let Some(prompt) = self.initial_prompt.take().filter(|prompt| !prompt.trim().is_empty())
            && let Err(err) = self.start_turn(prompt).await
        {
            self.emit(SessionEventKind::Notice {
                message: format!("the initial prompt could not be sent: {err}"),
            });
        }
    }

    async fn clear_resume_context_pending(&mut self) {
        self.resume_context_pending = false;
        if let Some(execution) = &self.execution {
            let _ = self
                .context
                .store
                .set_resume_context_pending(self.row.id.clone(), execution.id.clone(), false)
                .await;
        }
    }

    /// The token is stored again when a turn completes (compare-and-set on the execution).
    async fn store_token_again(&self) {
        let acp_session = self.view_tx.borrow().acp_session_id.clone();
        if let (Some(execution), Some(acp_session)) = (&self.execution, acp_session)
            && self.profile.keeps_resume_token()
        {
            let _ = self
                .context
                .store
                .set_resume_token(self.row.id.clone(), execution.id.clone(), Some(acp_session))
                .await;
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
        let mut reason = reason;
        if let Some(mut execution) = self.execution.take() {
            execution.agent_running = false;
            if let Ok(Some(executor)) = self.context.store.get_executor(self.row.id.clone()).await
                && let Some(why) = self.context.runtime.exit_reason(&executor).await
            {
                reason = format!("{reason}: {why}");
            }
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
        self.update_view(|view| {
            view.agent_running = false;
            view.launching = false;
        });
        let _ = self
            .set_state(SessionState::Failed, Some(reason.clone()), Some(task_state::FAILED))
            .await;
        if let Some(resume) = self.resume.take() {
            for waiter in resume.waiters {
                let _ = waiter.send(Err(SessionError::InvalidState(reason.clone())));
            }
        }
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
        if self.suppress_history {
            return;
        }
        if let Err(err) = self.history.append(kind, content, tool) {
            tracing::error!(session = %self.row.id, %err, "cannot write the history");
        }
    }

    fn emit(&self, kind: SessionEventKind) {
        if self.suppress_events {
            return;
        }
        let agent_seq = (self.last_agent_seq > 0).then_some(self.last_agent_seq);
        if let Err(err) =
            self.events.append_with(|seq, at| SessionEvent { seq, at, agent_seq, kind })
        {
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
        Command::Resume { reply } => drop(reply.send(Err(error()))),
        Command::Cancel { reply }
        | Command::Stop { reply }
        | Command::Detach { reply }
        | Command::Permission { reply, .. } => drop(reply.send(Err(error()))),
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
