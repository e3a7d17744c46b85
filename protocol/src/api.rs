//! The frontend API: one definition of Tether's JSON-RPC surface over WebSocket — the
//! `Api` trait (jsonrpsee generates [`ApiServer`], which the daemon implements, and the client
//! side [`ApiClient`] the CLI and the tests call) and the wire types of its params, results and events.
//!
//! Wire types are API types: the daemon converts its store rows and log records into them,
//! so a column can change without the API changing, and internal bookkeeping (profile
//! snapshots, agentctl marks) never leaks. Params are objects by name; [`params`] holds
//! their checked shapes, which the server applies before a method runs so that a bad
//! field gets an `invalid_params` error naming it. [`openrpc`] describes the whole surface
//! as an OpenRPC document (served by `rpc.discover`, checked in as `docs/openrpc.json`).

pub mod openrpc;
pub mod params;

use jsonrpsee::core::{RpcResult, SubscriptionResult};
use jsonrpsee::proc_macros::rpc;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::errors::{ErrorData, ErrorKind};

/// `as_str`, `ALL`, `FromStr` and `Display` by the wire names of a fieldless enum.
macro_rules! wire_names {
    ($name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The wire name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;

            fn from_str(text: &str) -> Result<$name, String> {
                $name::ALL.iter().copied().find(|value| value.as_str() == text).ok_or_else(|| {
                    let names: Vec<&str> = $name::ALL.iter().map(|value| value.as_str()).collect();
                    format!("{text:?} is not one of {}", names.join(", "))
                })
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

mod batch;
pub use batch::EventBatch;
mod history;

mod snapshots;
pub use snapshots::*;
mod workflows;
pub use workflows::*;
mod lists;
pub use lists::*;
mod usage;
pub use usage::*;
mod changes;
pub use changes::*;
mod checkpoints;
pub use checkpoints::*;
mod engines;
pub use engines::*;

/// Session states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SessionState {
    /// Recorded, never launched.
    Created,
    /// Its agent is being brought up.
    Starting,
    /// A turn is running.
    Running,
    /// Idle, waiting for a prompt.
    WaitingForInput,
    /// Ended by `task.session.stop`: for good.
    Completed,
    /// Its last launch failed (the reason is in the status's `error`). Not terminal: a
    /// resume (or a prompt) launches it again; `stop` ends it for good.
    Failed,
    /// Cancelled for good.
    Cancelled,
    /// Paused at a turn boundary (`task.session.pause`): its agent and sidecar are stopped,
    /// and it is resumed like any session whose agent is not running.
    Paused,
}

impl SessionState {
    /// `COMPLETED`, `CANCELLED`: ended for good, no more prompts, no resume, no more events.
    pub fn is_terminal(self) -> bool {
        matches!(self, SessionState::Completed | SessionState::Cancelled)
    }

    /// Terminal, or `FAILED`: nothing happens until someone resumes it (what a follower
    /// waits for).
    pub fn is_at_rest(self) -> bool {
        self.is_terminal() || self == SessionState::Failed
    }

    /// `STARTING`, `RUNNING`, `WAITING_FOR_INPUT`: an agent is (being) brought up for it.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            SessionState::Starting | SessionState::Running | SessionState::WaitingForInput
        )
    }
}

wire_names!(SessionState {
    Created => "CREATED",
    Starting => "STARTING",
    Running => "RUNNING",
    WaitingForInput => "WAITING_FOR_INPUT",
    Completed => "COMPLETED",
    Failed => "FAILED",
    Cancelled => "CANCELLED",
    Paused => "PAUSED",
});

/// A turn's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TurnState {
    /// Its prompt went out; no answer yet.
    Running,
    /// The agent answered (any stop reason, `cancelled` included).
    Completed,
    /// It failed (an error, the agent exited, a cancel the agent did not confirm).
    Failed,
    /// Its agent died while the supervisor was away.
    Interrupted,
}

wire_names!(TurnState {
    Running => "running",
    Completed => "completed",
    Failed => "failed",
    Interrupted => "interrupted",
});

/// Who sent a turn's prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PromptOrigin {
    /// A person or a client (`task.session.prompt`, a workflow step, an editor).
    #[default]
    User,
    /// Tether, asking the agent for its summary before a pause (`summarize_on_pause`).
    PauseSummary,
}

impl PromptOrigin {
    /// Whether a person or a client sent it.
    pub fn is_user(&self) -> bool {
        *self == PromptOrigin::User
    }
}

/// How a resume restored a session, or that none was needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResumeOutcome {
    /// ACP `session/resume` of the stored token.
    NativeResume,
    /// ACP `session/load` of the stored token (the agent replays; the replay is dropped).
    NativeLoad,
    /// The agent relaunched with the profile's `resume_command`.
    ResumeCommand,
    /// A fresh agent session; the recorded history goes into the next prompt.
    HistoryInjection,
    /// A fresh agent session primed with a context compiled from the latest snapshot (the
    /// session was paused because its agent's context was nearly full).
    ContextHandoff,
    /// ACP `session/fork` of the session a fork was made from (its first start).
    NativeFork,
    /// A fresh agent session, nothing restored.
    Fresh,
    /// The agent was running already.
    AlreadyRunning,
}

wire_names!(ResumeOutcome {
    NativeResume => "native_resume",
    NativeLoad => "native_load",
    ResumeCommand => "resume_command",
    HistoryInjection => "history_injection",
    ContextHandoff => "context_handoff",
    NativeFork => "native_fork",
    Fresh => "fresh",
    AlreadyRunning => "already_running",
});

/// The steps of bringing an agent up, in order (`authenticating` and `restoring` only when
/// they happen).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LaunchStep {
    /// The runtime starts the sidecar and the agent.
    Launching,
    /// The agent runs; ACP `initialize` is sent.
    Initializing,
    /// The agent asked for credentials; `authenticate` is sent.
    Authenticating,
    /// A native restore is sent (`session/resume` or `session/load`).
    Restoring,
    /// A new ACP session is asked for (`session/new`).
    Opening,
    /// The settings chosen for the session (a model, a mode) are set again
    /// (`session/set_config_option`, `session/set_mode`).
    Settings,
}

wire_names!(LaunchStep {
    Launching => "launching",
    Initializing => "initializing",
    Authenticating => "authenticating",
    Restoring => "restoring",
    Opening => "opening",
    Settings => "settings",
});

/// The ACP method of a native restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RestoreMethod {
    /// `session/resume`: the agent restores its context without replaying it.
    Resume,
    /// `session/load`: the agent restores its context and replays the conversation.
    Load,
}

/// Where a session's agent runs: the name a runtime is registered under in the daemon
/// (`standalone`, a local process through its agentctl sidecar; `docker`, a container
/// with agentctl inside). An open set: a daemon with another runtime names it here.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct RuntimeKind(pub std::borrow::Cow<'static, str>);

impl RuntimeKind {
    /// A local process.
    pub const STANDALONE: RuntimeKind = RuntimeKind(std::borrow::Cow::Borrowed("standalone"));
    /// A Docker container.
    pub const DOCKER: RuntimeKind = RuntimeKind(std::borrow::Cow::Borrowed("docker"));

    /// A runtime by name.
    pub fn named(name: impl Into<String>) -> RuntimeKind {
        RuntimeKind(std::borrow::Cow::Owned(name.into()))
    }

    /// The wire name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for RuntimeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// How an agent is confined (its profile's `[sandbox]`), as `agents.list` and
/// `task.session.status` show it; absent where it runs unconfined.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Confinement {
    /// What of the file system it sees: `workspace` or `host`.
    pub filesystem: String,
    /// What of the network it reaches: `allowlist`, `none` or `host`.
    pub network: String,
    /// With `allowlist`: every `host:port` it may reach, the profile's then `endpoints`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// The model endpoints its settings name (`ANTHROPIC_BASE_URL`, …), allowlisted by
    /// themselves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<String>,
    /// With `workspace`: more paths it may read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readable: Vec<String>,
    /// With `workspace`: more paths it may write.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writable: Vec<String>,
    /// What confines it on its runtime (`bubblewrap`), or `None` where it cannot be (the
    /// profile is unavailable then, and says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// One agent profile as `agents.list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AgentInfo {
    /// Profile id.
    pub id: String,
    /// Display name.
    pub display_name: String,
    /// Whether it can be launched here.
    pub available: bool,
    /// Why not, when not.
    pub reasons: Vec<String>,
    /// Native restore: `null` as the agent advertises at `initialize`, `false` never,
    /// `true` always tried (the profile's override).
    pub native_resume: Option<bool>,
    /// The ACP method a native restore is pinned to, if any.
    pub restore_method: Option<RestoreMethod>,
    /// A resume relaunches the agent with the profile's `resume_command`.
    pub resume_command: bool,
    /// Gets the history injected when nothing was restored natively.
    pub history_injection: bool,
    /// A user profile file that does not load: `id` is its file name, `reasons` holds the
    /// error with `file:line:col`.
    pub invalid: bool,
    /// Where it comes from: `builtin:NAME.toml` or the user file's path.
    #[serde(default)]
    pub source: String,
    /// A user profile that `extends` a built-in: the built-in's id (every key not in
    /// `own_keys` is the built-in's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extends: Option<String>,
    /// With `extends`: the keys the user's file sets itself (dotted, `process.init_timeout_ms`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub own_keys: Vec<String>,
    /// How its agent is confined (`[sandbox]`); absent: unconfined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Confinement>,
}

/// A task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Task {
    /// Id (UUID v7).
    pub id: String,
    /// Title.
    pub title: String,
    /// Description (the initial prompt of a fresh start).
    pub description: String,
    /// `TODO`, `IN_PROGRESS`, `REVIEW`, `COMPLETED`, `FAILED` or `CANCELLED`.
    pub state: String,
    /// Created, Unix ms.
    pub created_at: i64,
    /// Updated, Unix ms.
    pub updated_at: i64,
}

/// A session as lists show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionSummary {
    /// Id (UUID v7).
    pub id: String,
    /// Its task.
    pub task_id: String,
    /// The profile it was started with.
    pub agent_profile_id: String,
    /// Where its agent runs.
    pub runtime: RuntimeKind,
    /// Its state.
    pub state: SessionState,
    /// The workspace directory.
    pub workspace_path: String,
    /// The last error, if any.
    pub error_message: Option<String>,
    /// Created, Unix ms.
    pub created_at: i64,
    /// Updated, Unix ms.
    pub updated_at: i64,
    /// The branch of the worktree Tether made for it (`workspace_path` is that worktree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree_branch: Option<String>,
    /// The title its agent gave it (ACP `session_info_update`), for lists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Its agent asked a person for permission and waits for the answer
    /// (`task.session.permission.respond`): a "needs you" signal for lists.
    #[serde(default)]
    pub awaiting_permission: bool,
}

/// `task.get`: a task and its sessions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TaskDetail {
    /// The task.
    #[serde(flatten)]
    pub task: Task,
    /// Its sessions.
    pub sessions: Vec<SessionSummary>,
}

/// `task.session.config_options` (and the answer of `set_config_option`, `set_mode`): the
/// agent's settings as it last reported them, and those chosen through Tether, which are
/// set again whenever the agent's session opens (agents start a loaded or resumed session
/// with their defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionConfig {
    /// The agent's ACP session config options (`SessionConfigOption`: `id`, `name`,
    /// `category` — `model` for its model —, and `type` `select` with `currentValue` and
    /// `options`, or `boolean` with `currentValue`), as it last reported them; empty
    /// before it ever opened or when it has none.
    pub config_options: Vec<Value>,
    /// Its ACP session modes (`currentModeId`, `availableModes`), when it has any.
    pub modes: Option<Value>,
    /// The values chosen through Tether, by option id.
    pub chosen: std::collections::BTreeMap<String, Value>,
    /// The mode chosen through Tether.
    pub chosen_mode: Option<String>,
    /// Why prompts are refused now: a choice the agent did not take again after it
    /// restarted (choose anew, or forget it with `null`).
    pub blocked: Option<String>,
}

/// `task.session.status`: what a frontend needs to decide on a resume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionStatus {
    /// The session.
    pub session_id: String,
    /// Its task.
    pub task_id: String,
    /// Its state.
    pub state: SessionState,
    /// The profile.
    pub agent_profile_id: String,
    /// The agent is live and attached.
    pub is_agent_running: bool,
    /// A resume is possible.
    pub is_resumable: bool,
    /// The frontend should resume it (`task.session.resume`) before using it.
    pub needs_resume: bool,
    /// Why, in words.
    pub resume_reason: String,
    /// The ACP session id.
    pub acp_session_id: Option<String>,
    /// Where its agent runs.
    pub runtime: RuntimeKind,
    /// The workspace.
    pub worktree_path: Option<String>,
    /// The branch, for worktrees Tether made.
    pub worktree_branch: Option<String>,
    /// The last error.
    pub error: Option<String>,
    /// The seq of the newest session event (subscribe after it to see only new ones).
    pub last_event_seq: u64,
    /// The session's event log keeps the events after this seq (older ones were dropped,
    /// see `--event-log-retain-bytes`; 0: it keeps them all): subscribe from here or later,
    /// and read what came before with `task.session.history`.
    #[serde(default)]
    pub kept_after_seq: u64,
    /// A pause waits for the running turn to end.
    #[serde(default)]
    pub pause_requested: bool,
    /// How many executions (runs of its agent) the session has had.
    #[serde(default)]
    pub generation: u64,
    /// Where the session's pinned profile differs from the profile as it is now (dotted
    /// field names, e.g. `session.native_resume`; `profile` when it no longer exists). A
    /// session keeps the profile it started with until `task.session.resume` is asked to
    /// `refresh_profile`.
    #[serde(default)]
    pub profile_drift: Vec<String>,
    /// Where its agent runs or last ran within its runtime: the Docker engine's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    /// Its newest workspace checkpoint (`task.session.checkpoint.list` lists them all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Checkpoint>,
    /// The agent's questions (permission and elicitation requests) that wait for a
    /// person's answer, oldest first — what a client showing only the newest events must
    /// still offer.
    #[serde(default)]
    pub open_questions: Vec<OpenQuestion>,
    /// A `PAUSED` session: when it paused (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_at: Option<i64>,
    /// A `PAUSED` session: what paused it — `pause` (asked for), `idle` (parked: its agent
    /// was idle for `session.idle_timeout_secs`; the next prompt or resume brings it back),
    /// `budget` (raise it with `task.session.set_budget` first), `max_turns`,
    /// `max_duration`, `exhaustion` or `timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_by: Option<SnapshotTrigger>,
    /// A `PAUSED` session: why, as its pause was asked for (`task.session.pause`'s
    /// `reason`) or in a limit's own words (idle, budget, `max_turns`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_reason: Option<String>,
    /// Tokens and cost of its turns, its agent's context use, and its budgets.
    #[serde(default)]
    pub usage: SessionUsage,
    /// Its prompt queue: prompts sent while a turn ran, in the order they run, and why it
    /// is halted (a failed or cancelled turn; `task.session.queue.resume` lets it run).
    #[serde(default)]
    pub queue: PromptQueue,
    /// The session this one is a fork of, and at which of its turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkLink>,
    /// How its agent is confined (its profile's `[sandbox]`); absent: unconfined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Confinement>,
}

/// A permission request of an agent that waits for an answer
/// (`task.session.permission.respond`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OpenQuestion {
    /// The id to answer with.
    pub request_id: String,
    /// The ACP params, as in its `permission_request` or `elicitation_request` event.
    pub params: Value,
    /// What it asks: `session/request_permission` (answer with
    /// `task.session.permission.respond`) or `elicitation/create`
    /// (`task.session.elicitation.respond`).
    #[serde(default = "permission_method")]
    pub method: String,
}

fn permission_method() -> String {
    "session/request_permission".into()
}

/// `task.session.pause`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PauseResult {
    /// The session.
    pub session_id: String,
    /// Its state now: `PAUSED`, or (a turn running) the state it pauses from.
    pub state: SessionState,
    /// The pause waits for the running turn to end (or for `force_after_ms`).
    pub pause_requested: bool,
    /// A pause taken at once: its snapshot (`task.session.snapshot.get`), unless none
    /// could be taken. A waiting pause's comes with its `snapshot_taken` event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
}

/// `task.session.prompt`: the turn that started, or the prompt queued — behind the running
/// turn, or while the session's agent is brought back (durable before this answer; it runs
/// once, in order, when the turns before it ended).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PromptStarted {
    /// The turn; its `turn_ended` event carries the same id. `null` when queued: the turn
    /// it becomes is announced by `turn_started` with `prompt_id`.
    pub turn_id: Option<String>,
    /// The prompt was queued behind the running turn.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub queued: bool,
    /// The queued prompt (to edit or remove it), when queued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_id: Option<String>,
    /// Its place in the queue, from 1, when queued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<usize>,
    /// Queued because no agent was up to take it (the session was starting, paused or
    /// parked): the agent is being brought back, and the prompt runs once it is. A launch
    /// that fails halts the queue, saying why (`queue` event, status `queue.halted`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub waking: bool,
}

impl PromptStarted {
    /// The answer for a turn that started.
    pub fn started(turn_id: String) -> PromptStarted {
        PromptStarted {
            turn_id: Some(turn_id),
            queued: false,
            prompt_id: None,
            position: None,
            waking: false,
        }
    }
}

/// A prompt waiting in a session's queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct QueuedPrompt {
    /// The queued prompt.
    pub prompt_id: String,
    /// Its text.
    pub prompt: String,
    /// Its place, from 1: the first runs when the running turn ends.
    pub position: usize,
    /// When it was queued (ms since the epoch).
    pub queued_at: i64,
    /// A steer's: the turn that was cancelled for it (it runs first, whatever the queue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steer_of: Option<String>,
}

/// What a review did to a changed file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReviewAction {
    /// Kept at the content the reviewer saw.
    Kept,
    /// Its keep taken back.
    Unkept,
    /// Put back as the base has it (the agent is told with its next prompt).
    Reverted,
}

/// How `task.session.steer` reached the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SteerMode {
    /// Into the running turn: the agent takes a message mid-turn (`_session/steering`).
    Native,
    /// The running turn was cancelled; the steering text runs next, ahead of the queue,
    /// told what the cancelled turn had done.
    Fallback,
    /// No turn was running: it was taken as `task.session.prompt` takes a prompt.
    Prompt,
}

/// `task.session.fork`'s answer: the new session, at rest until it is prompted or resumed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ForkResult {
    /// The new session.
    pub session_id: String,
    /// The session forked.
    pub forked_from: String,
    /// The last turn of the original the fork's conversation holds.
    pub turn_id: String,
    /// How its agent gets the conversation when it starts: `native` (ACP `session/fork` of
    /// the original's agent session, which the agent advertises) or `history` (a fresh
    /// agent session, the history up to the turn injected before its first prompt).
    pub context: ForkContext,
    /// Where the fork works.
    pub workspace_path: String,
    /// Its worktree's branch, when the original has a worktree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The commit the branch was made from: the workspace's at that turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_commit: Option<String>,
    /// What the fork could not carry over, said plainly (the workspace's state at that
    /// turn unknown, uncommitted changes then, a shared workspace).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// `task.session.rewind`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RewindResult {
    /// The session.
    pub session_id: String,
    /// The rewind (names its saved ref).
    pub rewind_id: String,
    /// The turn that is now the conversation's last.
    pub turn_id: String,
    /// The turns rewound (kept in the history and the timeline, marked `rewound`), oldest
    /// first; empty when the turn was the last already.
    pub rewound: Vec<String>,
    /// The workspace's restore, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceRestore>,
    /// What the next prompt's agent gets, and anything else worth knowing, said plainly.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// How a rewind returned the workspace to an earlier state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WorkspaceRestore {
    /// The commit checked out (the workspace's HEAD at that turn); outside git, the
    /// turn's checkpoint.
    pub commit: String,
    /// The files put back over it: the turn's workspace checkpoint (in the session's
    /// checkpoint repository), or for a turn from before checkpoints the commit its
    /// snapshot took of its uncommitted changes, when it had any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// The ref holding what the workspace had before the restore (a commit of its files,
    /// tracked and untracked, whose first parent is the HEAD it had; outside git, a
    /// checkpoint's ref in the session's checkpoint repository).
    pub saved_ref: String,
    /// The commit `saved_ref` points at.
    pub saved_commit: String,
}

/// One end of a fork: the other session and the turn the fork was made at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ForkLink {
    /// The other session (the original, or the fork).
    pub session_id: String,
    /// The original's turn the fork was made at (its last turn the fork holds).
    pub turn_id: String,
    /// When the fork was made (Unix ms).
    pub at: i64,
}

/// How a fork's agent gets the conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ForkContext {
    /// ACP `session/fork` of the original's agent session.
    Native,
    /// The history up to the turn, injected before the first prompt.
    History,
}

/// `task.session.steer`'s answer (durable before it is sent: a native steer is in the
/// history, a fallback's text in the queue).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Steered {
    /// How it was delivered.
    pub mode: SteerMode,
    /// `native`: the turn it joined; `fallback`: the turn it cancelled; `prompt`: the turn
    /// it started (`null` when it was queued).
    pub turn_id: Option<String>,
    /// `fallback` (or a queued `prompt`): the queued prompt that runs the text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_id: Option<String>,
    /// Its place in the queue (a fallback's is 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<usize>,
}

/// A session's prompt queue.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct PromptQueue {
    /// The prompts, in the order they run.
    pub prompts: Vec<QueuedPrompt>,
    /// Why the queue does not run (a turn failed), until `task.session.queue.resume`;
    /// `null` while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted: Option<String>,
}

/// `task.session.resume`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ResumeResult {
    /// The session.
    pub session_id: String,
    /// How it was restored, or `already_running`.
    pub outcome: ResumeOutcome,
    /// Its state now.
    pub state: SessionState,
    /// Whether the agent runs.
    pub is_agent_running: bool,
    /// The ACP session id.
    pub acp_session_id: Option<String>,
    /// The session's error message, if any (a rejected token leaves a notice, not an error).
    pub error: Option<String>,
    /// Where the session's pinned profile differs from the profile as it is now (dotted
    /// field names); after `refresh_profile`, the fields just adopted.
    #[serde(default)]
    pub profile_drift: Vec<String>,
    /// The current profile was adopted (`refresh_profile: true`).
    #[serde(default)]
    pub profile_refreshed: bool,
    /// How the workspace changed since the session's last snapshot (its pause's), when it
    /// did: someone worked in it meanwhile. Absent when nothing changed, the workspace is
    /// not a repository, or there is no snapshot (or the agent was running already).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_drift: Option<GitDrift>,
}

/// `sessions.cleanup`'s answer: what was removed, and what matched but was kept and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CleanupResult {
    /// Nothing was removed: `removed` lists what would be.
    pub dry_run: bool,
    /// The sessions removed (or that would be), oldest first.
    pub removed: Vec<CleanedSession>,
    /// Sessions the filters matched that were kept, with the reason.
    pub kept: Vec<KeptSession>,
}

/// A session `sessions.cleanup` removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CleanedSession {
    /// The session.
    pub session_id: String,
    /// Its state.
    pub state: SessionState,
    /// Its last change, Unix ms.
    pub updated_at: i64,
    /// What went with it besides its rows: `history`, `events`, `spool`, `container`,
    /// `worktree` (each present only when there was one).
    pub resources: Vec<String>,
}

/// A session `sessions.cleanup` matched and kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct KeptSession {
    /// The session.
    pub session_id: String,
    /// Its state.
    pub state: SessionState,
    /// Why it was kept.
    pub reason: String,
}

/// `sessions.stop_all`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StopAllResult {
    /// How many agents were stopped.
    pub stopped: usize,
}

/// The answer of a method that has nothing to say but "done": `{}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Done {}

pub use history::{EntryType, HistoryEntry};

/// One event of a session's stream (`task.session.event` notifications).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionEvent {
    /// From 1, without gaps, per session: resubscribe with the last one seen as
    /// `after_seq` and nothing is missed.
    pub seq: u64,
    /// Unix ms.
    pub at: u64,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// The kinds of [`SessionEvent`] (its `type` member).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// The session's state changed.
    State {
        /// The new state.
        state: SessionState,
        /// Why, when it is an error.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A turn started with this prompt.
    TurnStarted {
        /// The turn; also the id of the prompt's message (its history entry's
        /// `message_id`, a load's `messageId`).
        turn_id: String,
        /// The prompt.
        prompt: String,
        /// Who sent it: omitted for a person's (or a client's) prompt.
        #[serde(default, skip_serializing_if = "PromptOrigin::is_user")]
        origin: PromptOrigin,
        /// The queued prompt it runs, when it waited in the queue.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompt_id: Option<String>,
        /// A steer's turn: the turn that was cancelled for it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        steer_of: Option<String>,
    },
    /// The running turn was steered with `prompt`: into the turn (`native`), or by
    /// cancelling it and queueing `prompt` first (`fallback`, its `prompt_id`).
    Steered {
        /// The turn steered.
        turn_id: String,
        /// The steering text.
        prompt: String,
        /// How.
        mode: SteerMode,
        /// The fallback's queued prompt.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompt_id: Option<String>,
    },
    /// The session was rewound to `turn_id`: the turns in `rewound` left the conversation
    /// (read the history again: their entries are marked `rewound`).
    Rewound {
        /// The turn now last.
        turn_id: String,
        /// The turns rewound.
        rewound: Vec<String>,
        /// The ref holding the workspace's state before a restore, when it was restored.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        saved_ref: Option<String>,
    },
    /// A changed file of the session was reviewed (`task.session.changes.keep`,
    /// `task.session.changes.revert`), here or by another client: read the changes again.
    ChangeReviewed {
        /// The file, from the top of the repository.
        path: String,
        /// What was done.
        action: ReviewAction,
        /// A revert's ref holding the workspace's files before it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        saved_ref: Option<String>,
    },
    /// The session's prompt queue changed (a prompt queued, taken into its turn, edited,
    /// moved or removed; the queue halted or let run): the whole queue after the change.
    Queue {
        /// The queue.
        queue: PromptQueue,
    },
    /// A chunk of the agent's reply.
    AgentMessageChunk {
        /// The text.
        text: String,
        /// The agent's id of the message it belongs to (ACP `messageId`), when it gave
        /// one: every chunk of a message has the same, a new one starts a new message.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message_id: Option<String>,
    },
    /// A chunk of the agent's reasoning.
    AgentThoughtChunk {
        /// The text.
        text: String,
        /// The agent's id of the message it belongs to (ACP `messageId`), when it gave one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message_id: Option<String>,
    },
    /// A tool call started (the raw ACP update).
    ToolCall {
        /// The ACP `update` object.
        update: Value,
    },
    /// A tool call progressed (the raw ACP update).
    ToolCallUpdate {
        /// The ACP `update` object.
        update: Value,
    },
    /// Any other ACP `session/update` (plans, modes, …), raw.
    SessionUpdate {
        /// The ACP `update` object.
        update: Value,
    },
    /// The agent asks a person for permission; answer with
    /// `task.session.permission.respond`.
    PermissionRequest {
        /// The id to answer with.
        request_id: String,
        /// The ACP params (tool call, options).
        params: Value,
    },
    /// The agent asks a person for input (ACP `elicitation/create`: a form to fill, or a
    /// URL to visit); answer with `task.session.elicitation.respond`.
    ElicitationRequest {
        /// The id to answer with.
        request_id: String,
        /// The ACP params (`mode` `form` with `message` and `requestedSchema`, or `url`).
        params: Value,
    },
    /// A question (a permission or elicitation request) was answered, or cancelled.
    PermissionResolved {
        /// The request.
        request_id: String,
        /// What was sent to the agent: a permission's ACP outcome, an elicitation's
        /// response (`{"action": …}`).
        outcome: Value,
    },
    /// A turn ended.
    TurnEnded {
        /// The turn.
        turn_id: String,
        /// How.
        state: TurnState,
        /// The agent's stop reason, when it answered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stop_reason: Option<String>,
        /// Why it failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A budget of the session or its task is 80 % used (once per budget as it passes
    /// that mark); at 100 % the session pauses at its turn's end.
    BudgetWarning {
        /// The budget and what was used of it.
        budget: BudgetUse,
    },
    /// The agent's context passed 10 points below the profile's handoff threshold
    /// (`session.context_handoff_percent`): at the threshold the session pauses for a
    /// handoff to a fresh agent session. Once as it passes that mark.
    ContextWarning {
        /// Tokens in the context, as the agent said (`usage_update.used`).
        used: u64,
        /// Its window (`usage_update.size`).
        size: u64,
        /// `used` in percent of `size` (rounded down).
        percent: u64,
        /// The threshold, in percent.
        threshold: u64,
    },
    /// Something a person should know (agent noise, a fallback taken, a rejected token).
    Notice {
        /// The message.
        message: String,
    },
    /// A confined agent asked to connect to something not on its egress allowlist
    /// (`[sandbox] network = "allowlist"`), and its proxy refused.
    EgressRefused {
        /// What it asked for (`host:port`).
        target: String,
        /// Why it was refused.
        reason: String,
    },
    /// A step of bringing the agent up, for a "starting…" / "resuming…" indicator.
    Progress {
        /// The step.
        step: LaunchStep,
        /// What it is about: the program launched, the method used.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// How a resume restored the session.
    ResumeOutcome {
        /// The outcome.
        outcome: ResumeOutcome,
    },
    /// A pause was asked for while a turn runs: the session pauses when the turn ends, or
    /// cancels the turn after `force_after_ms`.
    PauseRequested {
        /// Why, as the caller said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// How long the running turn may still take before it is cancelled.
        force_after_ms: u64,
    },
    /// The session is paused: its agent and sidecar are stopped (a `state` event `PAUSED`
    /// comes with it).
    Paused {
        /// Why, as the caller said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// The running turn was cancelled to pause (the timeout passed).
        forced: bool,
        /// What paused it: `pause` (asked for), `idle` (parked), `budget`, `max_turns`,
        /// `max_duration` or `exhaustion` (absent from older daemons).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trigger: Option<SnapshotTrigger>,
    },
    /// A snapshot of the session was taken (`task.session.snapshot.get` reads it).
    SnapshotTaken {
        /// The snapshot.
        snapshot_id: String,
        /// What took it.
        trigger: SnapshotTrigger,
    },
    /// A checkpoint of the workspace's files was stored
    /// (`task.session.checkpoint.list` lists it).
    CheckpointTaken {
        /// The checkpoint.
        checkpoint: Checkpoint,
    },
    /// A resume brought the session's agent back (a `resume_outcome` event, kept for older
    /// clients, says the same).
    Resumed {
        /// How it was restored.
        outcome: ResumeOutcome,
    },
    /// An event type this build does not know (a newer daemon): skip it, and count its seq.
    #[serde(other)]
    #[schemars(skip)]
    Other,
}

/// `task.session.timeline`: a session's executions and turns, and everything that happened
/// to it in order (`entries`), oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Timeline {
    /// The session.
    pub session_id: String,
    /// Each execution (one run of its agent) that ran a turn, and the current one.
    pub executions: Vec<ExecutionInfo>,
    /// Every turn.
    pub turns: Vec<TurnInfo>,
    /// The session this one is a fork of, and at which of its turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkLink>,
    /// The forks made of this session, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forks: Vec<ForkLink>,
    /// What happened, in order: executions started, state changes, turns, pauses, resumes
    /// and their outcome, snapshots, errors. Only those after the `after` asked for (at
    /// most [`MAX_TIMELINE_ENTRIES`]); page on with the last `seq`.
    #[serde(default)]
    pub entries: Vec<TimelineEntry>,
}

/// `task.session.event_window`: some of a session's events, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EventWindow {
    /// The events, oldest first (a seq is missing only where the log lost it: a damaged
    /// line, a log cut while the daemon was down); empty when none is kept before
    /// `before_seq`.
    pub events: Vec<SessionEvent>,
    /// Where the session's event log starts: events up to this seq are no longer kept
    /// (read the conversation with `task.session.history`). The window reached the start
    /// when its first event is `kept_after_seq + 1`.
    pub kept_after_seq: u64,
    /// The session's newest event: subscribe after it (or after the window's last) to
    /// follow on.
    pub last_seq: u64,
}

/// The most events one `task.session.event_window` call returns.
pub const MAX_EVENT_WINDOW: usize = 5000;
/// The events `task.session.event_window` returns when no `limit` is given.
pub const DEFAULT_EVENT_WINDOW: usize = 500;

/// The most entries one `task.session.timeline` call returns.
pub const MAX_TIMELINE_ENTRIES: usize = 1000;

/// One entry of a [`Timeline`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TimelineEntry {
    /// Increasing (not per session and not without gaps): pass the last one seen as
    /// `after` to get only newer entries.
    pub seq: i64,
    /// Unix ms.
    pub at: i64,
    /// What happened.
    #[serde(flatten)]
    pub event: TimelineEvent,
}

/// What a [`TimelineEntry`] records (its `kind` member).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TimelineEvent {
    /// An execution (a run of the agent and its sidecar) was started.
    ExecutionStarted {
        /// The execution.
        execution_id: String,
        /// Its number, from 1.
        generation: i64,
    },
    /// The session's state changed.
    State {
        /// The new state.
        state: SessionState,
        /// Why, when it is an error.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A turn started.
    TurnStarted {
        /// The turn.
        turn_id: String,
        /// The execution that runs it.
        execution_id: String,
    },
    /// A turn ended.
    TurnEnded {
        /// The turn.
        turn_id: String,
        /// How.
        state: TurnState,
        /// The agent's stop reason.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stop_reason: Option<String>,
        /// Why it failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A pause was asked for while a turn ran.
    PauseRequested {
        /// Why.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// `pause`, or `exhaustion` when the agent's context was nearly full.
        trigger: SnapshotTrigger,
        /// When the running turn is cancelled if it has not ended, Unix ms.
        force_at: i64,
    },
    /// The session was paused.
    Paused {
        /// Why.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// What paused it.
        trigger: SnapshotTrigger,
        /// A running turn was cancelled for it.
        forced: bool,
    },
    /// A resume opened an agent session.
    Resumed {
        /// The execution it started.
        execution_id: String,
        /// How it restored the session.
        outcome: ResumeOutcome,
    },
    /// A snapshot was taken.
    SnapshotTaken {
        /// The snapshot.
        snapshot_id: String,
        /// What took it.
        trigger: SnapshotTrigger,
    },
    /// The session moved off an engine, or to another runtime (its agent stopped there at
    /// a turn's end, its container and state there removed); `to` is where it runs now,
    /// when it was running.
    Moved {
        /// The engine it left (for a move between runtimes, the runtime, and on Docker its
        /// engine: `docker/<engine>`).
        from: String,
        /// The engine (or runtime) it runs on now (absent: it was at rest, and its next
        /// resume places it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        to: Option<String>,
        /// Why.
        reason: MoveReason,
    },
    /// A checkpoint of the workspace's files was taken (`task.session.checkpoint.list`
    /// lists them).
    CheckpointTaken {
        /// Its number in the session (its `seq` in `task.session.checkpoint.list`).
        checkpoint: u64,
        /// What took it.
        trigger: CheckpointTrigger,
        /// The turn it ends, by number, for a turn's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        turn: Option<u64>,
        /// The commit.
        commit: String,
        /// The files it holds.
        files: u64,
        /// The bytes it added to the repository.
        added_bytes: u64,
    },
    /// Something went wrong: the agent exited, a restore failed, a launch failed.
    Error {
        /// What.
        message: String,
    },
    /// The agent gave its plan (ACP `plan`; its steps are in the history): how far it is.
    Plan {
        /// Its steps.
        total: usize,
        /// Those completed.
        done: usize,
        /// Those in progress.
        in_progress: usize,
        /// The first step not completed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        current: Option<String>,
    },
}

/// A session's status and timeline together, as `supervisor sessions show --json` prints
/// them (two calls: `task.session.status` and `task.session.timeline`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionDetail {
    /// `task.session.status`.
    pub status: SessionStatus,
    /// `task.session.timeline`.
    pub timeline: Timeline,
}

/// One execution in a [`Timeline`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ExecutionInfo {
    /// The execution's id.
    pub execution_id: String,
    /// It is the session's current (newest) execution.
    pub current: bool,
    /// Its number (from 1), for the current execution.
    pub generation: Option<i64>,
    /// Where it is (`running`, `exited`, `stopped`, …), for the current execution.
    pub status: Option<String>,
    /// How the resume that started it restored the session, for the current execution.
    pub resume_outcome: Option<ResumeOutcome>,
    /// Its first turn's start, Unix ms.
    pub first_turn_at: Option<i64>,
    /// How many turns it ran.
    pub turns: usize,
}

/// One turn in a [`Timeline`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TurnInfo {
    /// The turn.
    pub turn_id: String,
    /// The execution that ran it.
    pub execution_id: String,
    /// How it went.
    pub state: TurnState,
    /// The agent's stop reason.
    pub stop_reason: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
    /// Started, Unix ms.
    pub started_at: i64,
    /// Ended, Unix ms.
    pub ended_at: Option<i64>,
    /// Tokens its agent reported.
    #[serde(default)]
    pub total_tokens: u64,
    /// The cost it added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostTotal>,
    /// The interrupted turn whose prompt it re-sent (`task.session.retry_turn`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_of: Option<String>,
    /// Rewound (`task.session.rewind` to an earlier turn): kept, but no longer part of the
    /// conversation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rewound: bool,
    /// The start of its prompt (cut to at most [`TURN_PROMPT_EXCERPT`] characters):
    /// what a turn list shows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Where it starts in the session's events: the seq of its `turn_started` event (read
    /// the turn with `task.session.event_window` from there). Absent for a turn started
    /// before this was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_seq: Option<u64>,
}

/// The most characters of a prompt a [`TurnInfo`] carries.
pub const TURN_PROMPT_EXCERPT: usize = 200;

#[cfg(test)]
mod tests;

/// Method names, for servers that check params before a method runs and for docs.
pub mod method;

/// The most events in one `task.session.events` notification.
pub const MAX_BATCH_EVENTS: usize = 512;

/// Tether's frontend API. Every method takes its params as an object by name (see
/// [`params`] for each one's checked shape and limits) and fails with an error whose
/// `data` is an [`ErrorData`].
/// The API trait and what `jsonrpsee`'s macro makes of it (`ApiServer`, `ApiClient`), in a
/// module of their own so the allowance below covers only the generated functions.
// The params are by name (`param_kind = map`): a method with many optional ones is one
// JSON object on the wire, however many arguments the generated functions have.
#[allow(clippy::too_many_arguments)]
mod rpc_api;
pub use rpc_api::{ApiClient, ApiServer};
