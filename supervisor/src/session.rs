//! One actor task per live session. The session actor owns the session's execution — its
//! agentctl connection, the ACP conversation, the history writer — and serialises every
//! command; the [`SessionHandle`] sends it commands and reads a cheap mirror of its state
//! from a watch channel (no mailbox round trip, no polling).
//!
//! Files, by concern:
//! - this file: the handle, the view, the commands and how an actor begins;
//! - `actor.rs`: the actor's loop and its one `impl`, every transition in sections (turns,
//!   executions, pauses, the stall, settings, the ACP client); `actor/`: where it is
//!   (`stage.rs`), what it tells itself (`messages.rs`) and the components it owns —
//!   `Recorder` (`records.rs`), `Sidecar` (`sidecar.rs`), `Waits` (`waits.rs`);
//! - `conversation.rs`, `meter.rs`, `choices.rs`: the ACP conversation's state, the usage
//!   meter and the settings' choices, components that decide without effects;
//! - `launch.rs`: launching, re-attaching and retiring executions, and the fence;
//! - `leftovers.rs`: a gone sidecar's spool, read past what was handled;
//! - `crate::sidecar` (below this module): the agentctl connection (its calls and its
//!   event stream);
//! - `acp.rs` (and `acp/`): what the ACP client reads agents with, apart from the actor;
//! - `durability.rs`: what may be acknowledged to agentctl, and when;
//! - `outbox.rs`: the one task that makes control calls, so the actor never waits on one;
//! - `record.rs`: the session's event log and open-work rows, with or without an actor.
//!
//! Theory of operation:
//! - The actor never awaits the sidecar. Launching and re-attaching run as tasks that
//!   report back; messages to the agent and acknowledgements go through the outbox task.
//!   The actor awaits only its own disk and store, so cancel, stop and status answer at
//!   once whatever the agent or sidecar does.
//! - **Ack ≤ durable**: agentctl's acknowledged prefix never passes what is durable in the
//!   history, the event log and the store. A message still coalescing counts as not
//!   durable; `acked_seq` is stored before `events.ack` is sent.
//! - **One live execution per session**: every launch first fences the previous execution
//!   (kills it, for certain); an execution that is dropped (lost, refused, failed) is fenced
//!   at once, so no sidecar runs unowned.
//! - **Every state has an exit**: the ACP handshake has a deadline, a cancelled turn that
//!   the agent does not end is ended after a grace period, control calls time out.

mod acp;
mod actor;
mod choices;
mod conversation;
mod durability;
mod launch;
mod leftovers;
mod meter;
mod outbox;
mod queue;
pub mod record;
pub mod relocate;
mod steer;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentctl::spool::Spool;
use agents::profile::Profile;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};

use crate::events::SessionEvent;
use crate::history::History;
use crate::runtime::Runtime;
use crate::settings::{SessionSettings, Setting};
use crate::store::{ExecutionRow, ResumeOutcome, SessionRow, SessionState, Store, StoreError};

/// Errors a command can meet.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The session cannot do this now (e.g. a prompt while a turn runs).
    #[error("{0}")]
    InvalidState(String),
    /// The request cannot be carried out as given (e.g. a prompt over the line limit).
    #[error("{message}")]
    InvalidParams {
        /// The field.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
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
    /// A rewind was not made.
    #[error(transparent)]
    Rewind(#[from] crate::rewind::RewindError),
    /// `task.session.retry_turn` of a turn that was re-sent already.
    #[error("turn {turn_id} was re-sent already, as turn {retry}")]
    AlreadyRetried {
        /// The turn.
        turn_id: crate::ids::TurnId,
        /// The turn that re-sent it.
        retry: crate::ids::TurnId,
    },
    /// The agent's execution is not there (it exited, or its sidecar vanished). Nothing was
    /// recorded: the request may be retried once the session is resumed.
    #[error("the agent is not running: {0}")]
    AgentGone(String),
    /// A prompt's turn was recorded, but its delivery to agentctl failed (the sidecar went
    /// away meanwhile). The turn ends failed; retrying would record, and perhaps send, the
    /// same prompt twice, so it is not retried for the caller.
    #[error("the prompt was recorded but could not be delivered (the turn fails): {0}")]
    Undelivered(String),
    /// A chosen setting could not be set again after the agent restarted (the reason).
    #[error("{0}")]
    SettingsNotRestored(String),
    /// The agent refused a setting (what it answered).
    #[error("the agent refused: {0}")]
    AgentRefused(String),
    /// The session's runtime cannot do what was asked now (why).
    #[error("{0}")]
    RuntimeUnavailable(String),
}

/// Where a session's actor is in its life. Transitions:
///
/// ```text
///   Idle ──launch──▶ Launching ──agentctl up──▶ Opening ──session open──▶ Open
///    ▲                   │ failed                  │ failed/timeout         │ agent exit,
///    │                   ▼                         ▼                        │ sidecar lost
///    │                 Ended (FAILED)            Ended (FAILED)             │
///    └──────────────────────────────────────────────────────────────────────┘
///   Reattaching (restart) ──connected──▶ Open;  ──failed──▶ Idle (fenced)
///   any ──stop──▶ Ended (COMPLETED)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// No execution: not launched yet, or its agent is gone (a resume launches one).
    Idle,
    /// A new execution is being launched: fence, runtime, agentctl, agent.
    Launching,
    /// Re-attaching to a live sidecar found at startup.
    Reattaching,
    /// The ACP handshake: `initialize`, then `session/new`, `/load` or `/resume`.
    Opening,
    /// The ACP session is open: prompts are taken, or a turn runs.
    Open,
    /// The session ended; the actor takes no more commands.
    Ended,
}

/// The cheap, always-current view of a session.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionView {
    /// The state.
    pub state: SessionState,
    /// Where the actor is.
    pub phase: Phase,
    /// The agent process is alive and attached.
    pub agent_running: bool,
    /// The ACP session id.
    pub acp_session_id: Option<String>,
    /// The last error.
    pub error: Option<String>,
    /// The running turn.
    pub turn_id: Option<crate::ids::TurnId>,
    /// How the last resume went.
    pub resume_outcome: Option<ResumeOutcome>,
    /// A pause waits for the running turn to end.
    pub pause_requested: bool,
    /// The agent's context use as it last reported: `(used, size)` in tokens.
    pub context: Option<(u64, u64)>,
    /// Why prompts are refused: a chosen setting could not be set again.
    pub settings_blocked: Option<String>,
}

impl SessionView {
    /// The agent is running and its ACP session is open: prompts can go out.
    pub fn is_ready(&self) -> bool {
        self.agent_running && self.phase == Phase::Open
    }

    /// An execution is being launched or opened.
    pub fn is_starting(&self) -> bool {
        matches!(self.phase, Phase::Launching | Phase::Opening)
    }
}

type Reply<T> = oneshot::Sender<Result<T, SessionError>>;

/// How a prompt was taken: a turn started, or it waits in the queue — behind the running
/// turn, or for the agent to come back (durable before this answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompted {
    /// The turn started with it.
    Started(crate::ids::TurnId),
    /// It waits in the queue, at this place (from 1).
    Queued {
        /// The queued prompt.
        prompt_id: crate::ids::PromptId,
        /// Its place.
        position: usize,
        /// No agent was open to take it (the session is starting, paused, parked or
        /// failed): its caller brings the agent back (a resume), and it runs then.
        waking: bool,
    },
}

/// What a steer of the running turn did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Steer {
    /// The agent took it into the running turn (recorded in the history).
    Native(crate::ids::TurnId),
    /// The running turn was cancelled for it; it waits first in the queue.
    Fallback {
        /// The turn cancelled.
        turn_id: crate::ids::TurnId,
        /// The queued prompt that runs it.
        prompt_id: crate::ids::PromptId,
    },
    /// No turn runs: nothing was done with it (it is a prompt).
    NoTurn,
}

/// A change to a session's prompt queue, asked through the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueChange {
    /// A queued prompt's text, its place (from 1), or both.
    Edit {
        /// The queued prompt.
        prompt_id: crate::ids::PromptId,
        /// Its new text.
        prompt: Option<String>,
        /// Its new place.
        position: Option<usize>,
    },
    /// Removes a queued prompt (`None`: all of them).
    Remove(Option<crate::ids::PromptId>),
    /// Lets a halted queue run again.
    Resume,
}

enum Command {
    Prompt {
        text: String,
        reply: Reply<Prompted>,
    },
    /// Steers the running turn with `text`.
    Steer {
        text: String,
        reply: Reply<Steer>,
    },
    /// Changes the prompt queue; answered with the queue after the change.
    Queue {
        change: QueueChange,
        reply: Reply<protocol::api::PromptQueue>,
    },
    Cancel {
        reply: Reply<()>,
    },
    /// Answers a question of the agent with this JSON-RPC `result`.
    Permission {
        request_id: String,
        /// The question's ACP method (an answer of one kind to the other is refused).
        method: &'static str,
        result: Value,
        reply: Reply<()>,
    },
    Stop {
        end: SessionState,
        reply: Reply<()>,
    },
    /// `refresh`: the profile to adopt first (refused while the agent runs).
    Resume {
        refresh: Option<Arc<Profile>>,
        reply: Reply<ResumeOutcome>,
    },
    Detach {
        reply: Reply<()>,
    },
    Pause {
        reason: Option<String>,
        force_after: Duration,
        reply: Reply<PauseTaken>,
    },
    /// Rewinds the conversation to `turn_id` (its agent stopped first, if it runs).
    Rewind {
        turn_id: crate::ids::TurnId,
        restore_workspace: bool,
        reply: Reply<protocol::api::RewindResult>,
    },
    /// Re-sends `turn_id`'s prompt as a new turn.
    Retry {
        turn_id: crate::ids::TurnId,
        text: String,
        reply: Reply<Prompted>,
    },
    /// Chooses a setting (`forget`: drops the choice instead).
    Setting {
        setting: Setting,
        forget: bool,
        reply: Reply<SessionSettings>,
    },
    /// Moves the session to another runtime (refused while an agent of it runs).
    Relocate {
        to: relocate::Destination,
        reply: Reply<relocate::Relocated>,
    },
    /// Publishes what the service changed of the session beside its actor (a review).
    Announce {
        kind: crate::events::SessionEventKind,
        reply: Reply<()>,
    },
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Command::Prompt { .. } => "Prompt",
            Command::Steer { .. } => "Steer",
            Command::Queue { .. } => "Queue",
            Command::Cancel { .. } => "Cancel",
            Command::Permission { .. } => "Permission",
            Command::Stop { .. } => "Stop",
            Command::Resume { .. } => "Resume",
            Command::Detach { .. } => "Detach",
            Command::Pause { .. } => "Pause",
            Command::Rewind { .. } => "Rewind",
            Command::Retry { .. } => "Retry",
            Command::Setting { .. } => "Setting",
            Command::Relocate { .. } => "Relocate",
            Command::Announce { .. } => "Announce",
        })
    }
}

/// Handle to a session's actor. Cloning shares the actor.
#[derive(Debug, Clone)]
pub struct SessionHandle {
    /// Commands are boxed: a channel's buffer is allocated in slots of its item's size, for
    /// as long as the session lives.
    commands: mpsc::Sender<Box<Command>>,
    view: watch::Receiver<SessionView>,
    events: Arc<Spool<SessionEvent>>,
}

impl SessionHandle {
    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, SessionError> {
        let (reply, result) = oneshot::channel();
        self.commands.send(Box::new(make(reply))).await.map_err(|_| SessionError::Gone)?;
        result.await.map_err(|_| SessionError::Gone)?
    }

    /// Starts a turn, or queues the prompt while a turn runs.
    pub async fn prompt(&self, text: String) -> Result<Prompted, SessionError> {
        self.ask(|reply| Command::Prompt { text, reply }).await
    }

    /// Steers the running turn (see [`Steer`]).
    pub async fn steer(&self, text: String) -> Result<Steer, SessionError> {
        self.ask(|reply| Command::Steer { text, reply }).await
    }

    /// Publishes `kind` on the session's stream, after what the actor published so far.
    pub async fn announce(
        &self,
        kind: crate::events::SessionEventKind,
    ) -> Result<(), SessionError> {
        self.ask(|reply| Command::Announce { kind, reply }).await
    }

    /// Rewinds the conversation to `turn_id` (see [`crate::rewind`]).
    pub async fn rewind(
        &self,
        turn_id: crate::ids::TurnId,
        restore_workspace: bool,
    ) -> Result<protocol::api::RewindResult, SessionError> {
        self.ask(|reply| Command::Rewind { turn_id, restore_workspace, reply }).await
    }

    /// Changes the prompt queue; returns it after the change.
    pub async fn change_queue(
        &self,
        change: QueueChange,
    ) -> Result<protocol::api::PromptQueue, SessionError> {
        self.ask(|reply| Command::Queue { change, reply }).await
    }

    /// Re-sends `turn_id`'s prompt (`text`) as a new turn, unless a turn re-sent it already;
    /// returns the new turn's id.
    pub async fn retry(
        &self,
        turn_id: crate::ids::TurnId,
        text: String,
    ) -> Result<crate::ids::TurnId, SessionError> {
        match self.ask(|reply| Command::Retry { turn_id, text, reply }).await? {
            Prompted::Started(turn_id) => Ok(turn_id),
            // A retry is never queued: it is refused while a turn runs.
            Prompted::Queued { .. } => {
                Err(SessionError::InvalidState("the retry was queued, not started".into()))
            }
        }
    }

    /// Cancels the running turn. Answers at once; a turn the agent does not end within
    /// [`CANCEL_GRACE`] is ended by the supervisor.
    pub async fn cancel(&self) -> Result<(), SessionError> {
        self.ask(|reply| Command::Cancel { reply }).await
    }

    /// Answers a permission request with an ACP outcome.
    pub async fn respond_permission(
        &self,
        request_id: String,
        outcome: Value,
    ) -> Result<(), SessionError> {
        let result = serde_json::json!({"outcome": outcome});
        let method = protocol::acp::method::SESSION_REQUEST_PERMISSION;
        self.ask(|reply| Command::Permission { request_id, method, result, reply }).await
    }

    /// Answers an elicitation request with an ACP `CreateElicitationResponse`.
    pub async fn respond_elicitation(
        &self,
        request_id: String,
        result: Value,
    ) -> Result<(), SessionError> {
        let method = protocol::acp::method::ELICITATION_CREATE;
        self.ask(|reply| Command::Permission { request_id, method, result, reply }).await
    }

    /// Ends the session (`COMPLETED`). Answers at once; the agent and its sidecar are
    /// stopped in the background, and killed if they do not stop.
    pub async fn stop(&self) -> Result<(), SessionError> {
        self.ask(|reply| Command::Stop { end: SessionState::Completed, reply }).await
    }

    /// Ends a paused session as `CANCELLED` (any other session: like [`Self::stop`]).
    pub async fn cancel_session(&self) -> Result<(), SessionError> {
        self.ask(|reply| Command::Stop { end: SessionState::Cancelled, reply }).await
    }

    /// Pauses the session at the next turn boundary: it waits for the running turn
    /// (cancelled after `force_after`), or it is `PAUSED` now.
    pub async fn pause(
        &self,
        reason: Option<String>,
        force_after: Duration,
    ) -> Result<PauseTaken, SessionError> {
        self.ask(|reply| Command::Pause { reason, force_after, reply }).await
    }

    /// Resumes the session if its agent is not running (once, however many ask at the same
    /// time); returns the outcome (`native_resume`, `native_load`, `resume_command`,
    /// `history_injection`, `fresh`, or `already_running`).
    pub async fn resume(&self) -> Result<ResumeOutcome, SessionError> {
        self.ask(|reply| Command::Resume { refresh: None, reply }).await
    }

    /// Moves the session to another runtime while no agent of it runs (see
    /// [`relocate`]).
    pub async fn relocate(
        &self,
        to: relocate::Destination,
    ) -> Result<relocate::Relocated, SessionError> {
        self.ask(|reply| Command::Relocate { to, reply }).await
    }

    /// Adopts `profile` (refused while the agent runs), then resumes.
    pub async fn resume_with(&self, profile: Arc<Profile>) -> Result<ResumeOutcome, SessionError> {
        self.ask(|reply| Command::Resume { refresh: Some(profile), reply }).await
    }

    /// Chooses a setting: set at once when the agent's session is open (the agent's answer
    /// is awaited), else recorded and set when it opens; then set again at every open.
    /// `forget` drops the choice (the agent's own value stands).
    pub async fn set_setting(
        &self,
        setting: Setting,
        forget: bool,
    ) -> Result<SessionSettings, SessionError> {
        self.ask(|reply| Command::Setting { setting, forget, reply }).await
    }

    /// Stops the agent and its sidecar but keeps the session active (it needs a resume).
    /// Answers once the sidecar is gone for certain.
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

    /// Resolves once the actor has ended (after what it was retiring landed and was
    /// recorded).
    pub async fn ended(&self) {
        self.commands.closed().await;
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
    /// Resolves a program name to the argv prefix that runs it (a path, or an applet).
    pub resolve: crate::sidecar::Resolver,
    /// The agent's home, for `{home}` in the profile.
    pub agent_home: PathBuf,
    /// How long agentctl may take to be ready.
    pub ready_timeout: Duration,
    /// Where the agent's own state dirs live on the host (`agent-state/<session-id>/`).
    pub agent_state_root: PathBuf,
    /// Reaches sidecars ([`crate::sidecar::WsConnector`] in the daemon).
    pub connector: Arc<dyn crate::sidecar::Connector>,
    /// The event log keeps at least its newest this many bytes
    /// ([`crate::events::LogLimits`]).
    pub event_log_retain_bytes: u64,
    /// Parks the session after its agent was idle this long, unless the profile's
    /// `session.idle_timeout_secs` says (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// `config.toml`'s `[sandbox]`: how the agents of profiles without one are confined.
    pub default_sandbox: Option<agents::profile::SandboxSettings>,
    /// Warm agents a launch may take (see `pool.rs`).
    pub pool: Option<Arc<crate::pool::Pool>>,
    /// Launches, retires and fences in flight, the daemon's as a whole: a shutdown waits
    /// for them, so it never abandons a sidecar half started or half stopped.
    pub teardowns: tokio_util::task::TaskTracker,
    /// The daemon's workspace checkpoints (see `checkpoint.rs`).
    pub checkpoints: Arc<crate::checkpoint::Checkpoints>,
}

impl SessionContext {
    /// The session's files.
    pub fn paths(&self) -> crate::home::SessionPaths {
        crate::home::SessionPaths::new(self.dir.clone())
    }

    /// How long the agent may be idle before the session is parked: the profile's, else
    /// the daemon's (`None`: never).
    pub fn idle_timeout(&self, profile: &Profile) -> Option<Duration> {
        match profile.session.idle_timeout_secs {
            Some(0) => None,
            Some(secs) => Some(Duration::from_secs(secs)),
            None => self.idle_timeout,
        }
    }

    /// The state dir of an execution's sidecar: a warm agent's own, else the session's.
    pub fn state_dir_of(&self, execution: &ExecutionRow) -> PathBuf {
        crate::runtime::execution_state_dir(execution, self.agentctl_dir())
    }

    /// agentctl's state dir for this session.
    pub fn agentctl_dir(&self) -> PathBuf {
        self.paths().agentctl()
    }
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
    Reattach(Box<ReattachPlan>),
}

/// What a re-attach needs.
#[derive(Debug)]
pub struct ReattachPlan {
    /// The runtime record.
    pub execution: ExecutionRow,
    /// Where the sidecar listens.
    pub addr: agentctl::client::ControlAddr,
    /// Turns still running.
    pub open_turns: Vec<crate::store::OpenTurn>,
    /// The sidecar is dead and its spool holds events not recorded yet: they are read from
    /// the spool and handled as a re-attach's replay, then the execution is lost.
    pub gone: bool,
}

/// The id a permission request is published and answered under: the execution's
/// generation, a dot, and the agent's JSON-RPC id in JSON form (`3.7`, `3."abc"`). The
/// agent's ids repeat across executions; these never do within a session, so a late answer
/// to an old request cannot reach a new one.
pub fn permission_request_id(generation: i64, agent_id: &Value) -> String {
    format!("{generation}.{agent_id}")
}

/// The generation a permission request id names (`None` for an id stored before
/// generations were part of it).
pub fn permission_request_generation(request_id: &str) -> Option<i64> {
    request_id.split_once('.').and_then(|(generation, _)| generation.parse().ok())
}

/// The agent's JSON-RPC id in a permission request id (see [`permission_request_id`]); an
/// id stored before generations were part of it is the agent's id itself.
pub fn agent_request_id(request_id: &str) -> Value {
    let agent_part = match request_id.split_once('.') {
        Some((generation, rest)) if generation.parse::<i64>().is_ok() => rest,
        _ => request_id,
    };
    serde_json::from_str(agent_part).unwrap_or_else(|_| Value::String(agent_part.to_owned()))
}

/// The event that asks a person a question of the agent: an elicitation, or a permission.
pub fn question_event(
    method: &str,
    request_id: String,
    params: Value,
) -> crate::events::SessionEventKind {
    use crate::events::SessionEventKind;
    if method == protocol::acp::method::ELICITATION_CREATE {
        SessionEventKind::ElicitationRequest { request_id, params }
    } else {
        SessionEventKind::PermissionRequest { request_id, params }
    }
}

/// The answer that withdraws a question of the agent (`method`): an elicitation is
/// `cancel`led, a permission `cancelled`.
pub fn cancelled_answer(method: &str) -> Value {
    if method == protocol::acp::method::ELICITATION_CREATE {
        serde_json::json!({"action": "cancel"})
    } else {
        serde_json::json!({"outcome": {"outcome": "cancelled"}})
    }
}

/// Why a session whose agent died while the supervisor was down waits for input.
pub const STOPPED_WHILE_DOWN: &str =
    "the agent stopped while the supervisor was down; resume the session to go on";

/// The newest seq the spool in a session's agentctl state dir holds for `execution` (0
/// when there is none, or when the spool is not that execution's: the state dir is reused,
/// and a launch killed before its agentctl started leaves the previous one's spool).
pub fn leftover_seq(agentctl_dir: &std::path::Path, execution: &ExecutionRow) -> u64 {
    if !leftovers::spool_is_of(agentctl_dir, execution) {
        return 0;
    }
    leftovers::last_seq(&leftovers::spool_dir(agentctl_dir))
}

/// How long a cancelled turn may take to end before the supervisor ends it.
pub const CANCEL_GRACE: Duration = Duration::from_secs(10);

/// How long a pause waits for the running turn before it cancels it, unless told: 5 minutes.
pub const DEFAULT_PAUSE_WAIT_MS: u64 = 5 * 60 * 1000;

/// What `task.session.pause` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PauseTaken {
    /// It waits for the running turn (or the launch in flight) to end.
    Waits,
    /// The session is `PAUSED`, with the pause's snapshot (none when it could not be taken).
    Paused { snapshot_id: Option<String> },
}

/// The largest prompt, in bytes of its JSON-RPC line: the agent's framing drops a longer
/// line, and the turn would never end.
pub const MAX_PROMPT_LINE: usize = protocol::frame::DEFAULT_MAX_LINE;

/// Starts the actor for a session.
pub fn start_session(
    context: SessionContext,
    row: SessionRow,
    profile: Arc<Profile>,
    events: Arc<Spool<SessionEvent>>,
    start: Start,
) -> Result<SessionHandle, SessionError> {
    let history = History::open(&context.paths().history())
        .map_err(|err| SessionError::InvalidState(format!("cannot open the history: {err}")))?;
    let (commands_tx, commands_rx) = mpsc::channel(256);
    let phase = match start {
        Start::Reattach(_) => Phase::Reattaching,
        Start::Fresh { .. } | Start::Resume => Phase::Launching,
    };
    let view = SessionView {
        state: row.state,
        phase,
        agent_running: false,
        acp_session_id: None,
        error: row.error_message.clone(),
        turn_id: None,
        resume_outcome: None,
        pause_requested: false,
        context: None,
        settings_blocked: None,
    };
    let (view_tx, view_rx) = watch::channel(view);
    // The actor works from the parsed profile: the snapshot's JSON tree would only take
    // memory for as long as the session lives.
    let row = SessionRow { pinned_profile: Value::Null, ..row };
    let record =
        record::SessionRecord::new(row.id.clone(), context.store.clone(), Arc::clone(&events));
    let (actor, internal) =
        actor::SessionActor::new(context, row, profile, record, history, view_tx);
    tokio::spawn(actor.run(internal, commands_rx, start));
    Ok(SessionHandle { commands: commands_tx, view: view_rx, events })
}

#[cfg(test)]
mod tests;
