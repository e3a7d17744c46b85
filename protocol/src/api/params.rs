//! The checked shape of each method's params: objects by name, no unknown fields, each
//! string within its limit. The server runs [`check`] before a method, so a bad request
//! gets an `invalid_params` error whose `data.field` names the field (and `data.limit` the
//! bound it broke) instead of reaching the method. These structs mirror the `Api`
//! trait's arguments one for one; `tests` in this module hold the two together.

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{RuntimeKind, SessionState, method};
use crate::errors::{ErrorData, ErrorKind};

/// The longest id (task, session, profile, permission request, option), in bytes.
pub const MAX_ID: usize = 256;
/// The longest task title, in bytes.
pub const MAX_TITLE: usize = 1024;
/// The longest task description, in bytes.
pub const MAX_DESCRIPTION: usize = 1024 * 1024;
/// The longest prompt, in bytes (its JSON-RPC line to the agent has a limit of its own).
pub const MAX_PROMPT: usize = 8 * 1024 * 1024;
/// The longest workspace path, in bytes (Linux's `PATH_MAX`).
pub const MAX_PATH: usize = 4096;
/// The most history entries one call returns.
pub const MAX_HISTORY_LIMIT: usize = 100_000;

/// Why params were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ParamError {
    /// The field at fault, when one is.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
    /// The limit broken, for a size.
    pub limit: Option<u64>,
}

impl ParamError {
    /// The error object the server answers with.
    pub fn into_error(self) -> jsonrpsee::types::ErrorObjectOwned {
        ErrorData { kind: ErrorKind::InvalidParams, field: self.field, limit: self.limit }
            .into_error(self.message)
    }
}

fn within(field: &str, value: &str, limit: usize) -> Result<(), ParamError> {
    if value.len() <= limit {
        return Ok(());
    }
    Err(ParamError {
        field: Some(field.to_owned()),
        message: format!("{field} is {} bytes, over its limit of {limit} bytes", value.len()),
        limit: Some(limit as u64),
    })
}

fn within_opt(field: &str, value: &Option<String>, limit: usize) -> Result<(), ParamError> {
    value.as_deref().map_or(Ok(()), |value| within(field, value, limit))
}

/// A method's params: their shape (serde) and their limits.
pub trait Checked: DeserializeOwned + JsonSchema {
    /// The limits beyond the shape.
    fn limits(&self) -> Result<(), ParamError> {
        Ok(())
    }
}

/// No params (absent, `{}` or `[]`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}
impl Checked for NoParams {}

/// `task.create`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskCreate {
    /// The title (at most 1024 bytes).
    pub title: String,
    /// The description (at most 1 MiB); empty when absent.
    #[serde(default)]
    pub description: Option<String>,
}
impl Checked for TaskCreate {
    fn limits(&self) -> Result<(), ParamError> {
        within("title", &self.title, MAX_TITLE)?;
        within_opt("description", &self.description, MAX_DESCRIPTION)
    }
}

/// `task.get`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskGet {
    /// The task.
    pub task_id: String,
}
impl Checked for TaskGet {
    fn limits(&self) -> Result<(), ParamError> {
        within("task_id", &self.task_id, MAX_ID)
    }
}

/// `task.delete`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskDelete {
    /// The task.
    pub task_id: String,
    /// Remove its sessions' worktrees even with uncommitted work in them.
    #[serde(default)]
    pub force: Option<bool>,
    /// Delete its sessions' worktree branches too (kept by default).
    #[serde(default)]
    pub delete_branch: Option<bool>,
}
impl Checked for TaskDelete {
    fn limits(&self) -> Result<(), ParamError> {
        within("task_id", &self.task_id, MAX_ID)
    }
}

/// `task.session.create`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionCreate {
    /// The task.
    pub task_id: String,
    /// The agent profile.
    pub agent_profile_id: String,
    /// The workspace, an absolute path to a directory (at most 4096 bytes). For a worktree
    /// session, the repository (optional when the profile names `workspace.repo`).
    #[serde(default)]
    pub workspace_path: Option<String>,
    /// The first prompt; the task's description when absent.
    #[serde(default)]
    pub prompt: Option<String>,
    /// Where the agent runs; the profile's default when absent.
    #[serde(default)]
    pub runtime: Option<RuntimeKind>,
    /// Share the workspace with the live sessions already in it (default: a workspace is
    /// held by one live session, and a second gets `conflict` naming the holder).
    #[serde(default)]
    pub shared: Option<bool>,
    /// Work in a git worktree of its own on a new branch (default: whether the profile
    /// has a `[workspace]` section).
    #[serde(default)]
    pub worktree: Option<bool>,
    /// The branch or commit the worktree's branch starts from (default: the profile's
    /// `workspace.base`, else the repository's `HEAD`; at most 256 bytes).
    #[serde(default)]
    pub base: Option<String>,
    /// Placement labels: the runtime runs the session only where every one is carried (a
    /// Docker engine's `labels`); at most 32, each key and value at most 256 bytes.
    #[serde(default)]
    pub labels: Option<std::collections::BTreeMap<String, String>>,
    /// MCP servers for its agent, ACP `McpServer` objects (stdio, http or sse), given at
    /// every `session/new`, `session/load` and `session/resume`; at most 32.
    #[serde(default)]
    pub mcp_servers: Option<Vec<serde_json::Value>>,
    /// The session's id, a UUID the caller chose (a create retried after a lost answer, an
    /// ACP client's `sessionId` decided before the agent is chosen); refused with
    /// `conflict` when a session has it already. Default: a new UUID v7.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Directories besides the workspace the agent may work in (absolute; ACP
    /// `additionalDirectories`, given to agents that advertise them); at most 32.
    #[serde(default)]
    pub additional_directories: Option<Vec<String>>,
}

/// How many placement labels a session may ask for.
pub const MAX_LABELS: usize = 32;

/// How many MCP servers a session may be given.
pub const MAX_MCP_SERVERS: usize = 32;

impl Checked for SessionCreate {
    fn limits(&self) -> Result<(), ParamError> {
        if self.mcp_servers.as_ref().is_some_and(|servers| servers.len() > MAX_MCP_SERVERS) {
            return Err(ParamError {
                field: Some("mcp_servers".into()),
                message: format!("at most {MAX_MCP_SERVERS} MCP servers"),
                limit: Some(MAX_MCP_SERVERS as u64),
            });
        }
        labels_within(self.labels.as_ref())?;
        within("task_id", &self.task_id, MAX_ID)?;
        within_opt("session_id", &self.session_id, MAX_ID)?;
        let directories = self.additional_directories.iter().flatten();
        if directories.clone().count() > MAX_MCP_SERVERS {
            return Err(ParamError {
                field: Some("additional_directories".into()),
                message: format!("at most {MAX_MCP_SERVERS} additional directories"),
                limit: Some(MAX_MCP_SERVERS as u64),
            });
        }
        for directory in directories {
            within("additional_directories", directory, MAX_PATH)?;
        }
        within("agent_profile_id", &self.agent_profile_id, MAX_ID)?;
        within_opt("workspace_path", &self.workspace_path, MAX_PATH)?;
        within_opt("base", &self.base, MAX_ID)?;
        within_opt("prompt", &self.prompt, MAX_PROMPT)
    }
}

/// `task.session.delete`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionDelete {
    /// The session.
    pub session_id: String,
    /// Remove its worktree even with uncommitted work in it.
    #[serde(default)]
    pub force: Option<bool>,
    /// Delete its worktree's branch too (kept by default).
    #[serde(default)]
    pub delete_branch: Option<bool>,
}
impl Checked for SessionDelete {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)
    }
}

/// `sessions.cleanup`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Cleanup {
    /// Sessions whose last change is older than this many days (0: any age).
    pub max_age_days: u32,
    /// Only sessions in these states (default: any state at rest).
    #[serde(default)]
    pub states: Option<Vec<SessionState>>,
    /// Spare `COMPLETED` sessions.
    #[serde(default)]
    pub keep_completed: Option<bool>,
    /// Report what would be removed; remove nothing.
    #[serde(default)]
    pub dry_run: Option<bool>,
    /// Remove worktrees with uncommitted work too.
    #[serde(default)]
    pub force: Option<bool>,
}
impl Checked for Cleanup {
    fn limits(&self) -> Result<(), ParamError> {
        Ok(())
    }
}

/// `task.session.list`
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionList {
    /// Only this task's sessions.
    #[serde(default)]
    pub task_id: Option<String>,
    /// Only sessions in this state.
    #[serde(default)]
    pub state: Option<SessionState>,
    /// Only sessions of this profile.
    #[serde(default)]
    pub agent_profile_id: Option<String>,
}
impl Checked for SessionList {
    fn limits(&self) -> Result<(), ParamError> {
        within_opt("task_id", &self.task_id, MAX_ID)?;
        within_opt("agent_profile_id", &self.agent_profile_id, MAX_ID)
    }
}

/// Methods that take just a session: `task.session.status`, `cancel`, `stop`,
/// `snapshot.list`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionId {
    /// The session.
    pub session_id: String,
}
impl Checked for SessionId {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)
    }
}

/// `task.session.resume`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionResume {
    /// The session.
    pub session_id: String,
    /// Adopt the profile as it is now instead of the one the session pinned when it started
    /// (refused while its agent runs).
    #[serde(default)]
    pub refresh_profile: Option<bool>,
}
impl Checked for SessionResume {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)
    }
}

/// `task.session.timeline`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionTimeline {
    /// The session.
    pub session_id: String,
    /// Only entries after this `seq` (default: all).
    #[serde(default)]
    pub after: Option<i64>,
}
impl Checked for SessionTimeline {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)
    }
}

/// `task.session.snapshot.get`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotGet {
    /// The snapshot.
    pub snapshot_id: String,
}
impl Checked for SnapshotGet {
    fn limits(&self) -> Result<(), ParamError> {
        within("snapshot_id", &self.snapshot_id, MAX_ID)
    }
}

/// `task.session.prompt`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionPrompt {
    /// The session.
    pub session_id: String,
    /// The prompt (at most 8 MiB).
    pub prompt: String,
}
impl Checked for SessionPrompt {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)?;
        within("prompt", &self.prompt, MAX_PROMPT)
    }
}

/// The longest a pause may wait for the running turn: a day.
pub const MAX_PAUSE_WAIT_MS: u64 = 24 * 60 * 60 * 1000;

/// `task.session.set_config_option`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionSetConfigOption {
    /// The session.
    pub session_id: String,
    /// The option's id (as `task.session.config_options` lists it; `model` for most
    /// agents' model).
    pub config_id: String,
    /// A value id (a string) for a `select` option, `true`/`false` for a `boolean` one;
    /// `null` forgets the choice (the agent's own value stands).
    pub value: serde_json::Value,
}
impl Checked for SessionSetConfigOption {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)?;
        within("config_id", &self.config_id, MAX_ID)?;
        match &self.value {
            serde_json::Value::String(value) => within("value", value, MAX_ID),
            serde_json::Value::Bool(_) | serde_json::Value::Null => Ok(()),
            _ => Err(ParamError {
                field: Some("value".into()),
                limit: None,
                message: "value must be a string (a select option's value id), a boolean, or null"
                    .into(),
            }),
        }
    }
}

/// `task.session.set_mode`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionSetMode {
    /// The session.
    pub session_id: String,
    /// The mode's id (as `task.session.config_options` lists the agent's modes); `null`
    /// forgets the choice.
    pub mode_id: Option<String>,
}
impl Checked for SessionSetMode {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)?;
        within_opt("mode_id", &self.mode_id, MAX_ID)
    }
}

/// `task.session.pause`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionPause {
    /// The session.
    pub session_id: String,
    /// Why (at most 1 KiB), kept with the pause.
    #[serde(default)]
    pub reason: Option<String>,
    /// How long a running turn may still take before it is cancelled (default 300,000: 5
    /// minutes; at most a day).
    #[serde(default)]
    pub force_after_ms: Option<u64>,
}
impl Checked for SessionPause {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)?;
        within_opt("reason", &self.reason, MAX_TITLE)?;
        force_after_within(self.force_after_ms)
    }
}

/// `task.session.permission.respond`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PermissionRespond {
    /// The session.
    pub session_id: String,
    /// The request (from its `permission_request` event).
    pub request_id: String,
    /// The chosen option; absent means "cancelled".
    #[serde(default)]
    pub option_id: Option<String>,
}
impl Checked for PermissionRespond {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)?;
        within("request_id", &self.request_id, MAX_ID)?;
        within_opt("option_id", &self.option_id, MAX_ID)
    }
}

/// `task.session.elicitation.respond`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ElicitationRespond {
    /// The session.
    pub session_id: String,
    /// The request (from its `elicitation_request` event).
    pub request_id: String,
    /// `accept` (with `content` for a form), `decline`, or `cancel`.
    pub action: ElicitationAnswer,
    /// For `accept` of a form: the values, an object by the requested schema's property
    /// names (strings, numbers, booleans, arrays of strings); at most 64 KiB as JSON.
    #[serde(default)]
    pub content: Option<serde_json::Map<String, serde_json::Value>>,
}

/// How a person answered an elicitation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ElicitationAnswer {
    /// Gave what was asked (`content` holds it, for a form).
    Accept,
    /// Said no.
    Decline,
    /// Dismissed it.
    Cancel,
}

/// The most bytes an elicitation's content may take as JSON.
pub const MAX_ELICITATION_CONTENT: usize = 64 * 1024;

impl Checked for ElicitationRespond {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)?;
        within("request_id", &self.request_id, MAX_ID)?;
        let size = self.content.as_ref().map_or(0, |content| {
            serde_json::to_string(content).map_or(usize::MAX, |text| text.len())
        });
        if size > MAX_ELICITATION_CONTENT {
            return Err(ParamError {
                field: Some("content".into()),
                message: format!("content is {size} bytes as JSON, over {MAX_ELICITATION_CONTENT}"),
                limit: Some(MAX_ELICITATION_CONTENT as u64),
            });
        }
        if self.content.is_some() && self.action != ElicitationAnswer::Accept {
            return Err(ParamError {
                field: Some("content".into()),
                message: "content goes with accept only".into(),
                limit: None,
            });
        }
        Ok(())
    }
}

/// `task.session.history`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionHistory {
    /// The session.
    pub session_id: String,
    /// Entries after this seq (default 0).
    #[serde(default)]
    pub after_seq: Option<u64>,
    /// At most this many entries (default 1000, at most 100000).
    #[serde(default)]
    pub limit: Option<usize>,
}
impl Checked for SessionHistory {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)?;
        match self.limit {
            Some(limit) if limit > MAX_HISTORY_LIMIT => Err(ParamError {
                field: Some("limit".into()),
                message: format!("limit is {limit}, over its maximum of {MAX_HISTORY_LIMIT}"),
                limit: Some(MAX_HISTORY_LIMIT as u64),
            }),
            _ => Ok(()),
        }
    }
}

/// `task.session.event_window`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionEventWindow {
    /// The session.
    pub session_id: String,
    /// Events before this seq (default: up to the newest).
    #[serde(default)]
    pub before_seq: Option<u64>,
    /// At most this many (default 500, at most 5000; at least 1).
    #[serde(default)]
    pub limit: Option<usize>,
}
impl Checked for SessionEventWindow {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)?;
        match self.limit {
            Some(limit) if limit == 0 || limit > super::MAX_EVENT_WINDOW => Err(ParamError {
                field: Some("limit".into()),
                message: format!(
                    "limit is {limit}; it must be from 1 to {}",
                    super::MAX_EVENT_WINDOW
                ),
                limit: Some(super::MAX_EVENT_WINDOW as u64),
            }),
            _ => Ok(()),
        }
    }
}

/// `task.session.subscribe` and `task.session.subscribe_batch`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionSubscribe {
    /// The session.
    pub session_id: String,
    /// Events after this seq (default 0); not past the session's newest event.
    #[serde(default)]
    pub after_seq: Option<u64>,
}
impl Checked for SessionSubscribe {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)
    }
}

/// The longest workflow file, in bytes.
pub const MAX_SPEC: usize = 1024 * 1024;
/// The most `vars` of `workflow.start`.
pub const MAX_VARS: usize = 256;

/// `workflow.start`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkflowStart {
    /// The workflow file's text (TOML; see docs/workflows.md).
    pub spec: String,
    /// The file it was read from: errors name it, and `workflow.resume` reads it again to
    /// see whether it changed.
    #[serde(default)]
    pub spec_file: Option<String>,
    /// Values replacing the file's `[vars]` (each must be one of them).
    #[serde(default)]
    pub vars: Option<std::collections::BTreeMap<String, String>>,
    /// The task to run it for (default: a new task named after the workflow).
    #[serde(default)]
    pub task_id: Option<String>,
    /// Where its steps work, absolute (default: the file's `workspace`).
    #[serde(default)]
    pub workspace: Option<String>,
}
impl Checked for WorkflowStart {
    fn limits(&self) -> Result<(), ParamError> {
        within("spec", &self.spec, MAX_SPEC)?;
        within_opt("spec_file", &self.spec_file, MAX_PATH)?;
        within_opt("task_id", &self.task_id, MAX_ID)?;
        within_opt("workspace", &self.workspace, MAX_PATH)?;
        let vars = self.vars.as_ref().map_or(0, |vars| vars.len());
        if vars > MAX_VARS {
            return Err(ParamError {
                field: Some("vars".into()),
                message: format!("vars has {vars} entries, over its limit of {MAX_VARS}"),
                limit: Some(MAX_VARS as u64),
            });
        }
        for (name, value) in self.vars.iter().flatten() {
            within("vars", name, MAX_ID)?;
            within(&format!("vars.{name}"), value, MAX_DESCRIPTION)?;
        }
        Ok(())
    }
}

/// `workflow.status`, `workflow.cancel`, `workflow.delete`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkflowId {
    /// The workflow.
    pub workflow_id: String,
}
impl Checked for WorkflowId {
    fn limits(&self) -> Result<(), ParamError> {
        within("workflow_id", &self.workflow_id, MAX_ID)
    }
}

/// `workflow.resume`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkflowResume {
    /// The workflow.
    pub workflow_id: String,
    /// The workflow file's text now (default: its file read again, else the stored text).
    #[serde(default)]
    pub spec: Option<String>,
    /// Run the changed file (changed steps, and those after them, run again) instead of
    /// refusing.
    #[serde(default)]
    pub accept_spec_change: Option<bool>,
}
impl Checked for WorkflowResume {
    fn limits(&self) -> Result<(), ParamError> {
        within("workflow_id", &self.workflow_id, MAX_ID)?;
        within_opt("spec", &self.spec, MAX_SPEC)
    }
}

/// `workflow.approve`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkflowApprove {
    /// The workflow.
    pub workflow_id: String,
    /// The step.
    pub step_id: String,
}
impl Checked for WorkflowApprove {
    fn limits(&self) -> Result<(), ParamError> {
        within("workflow_id", &self.workflow_id, MAX_ID)?;
        within("step_id", &self.step_id, MAX_ID)
    }
}

/// `task.session.retry_turn`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRetryTurn {
    /// The session.
    pub session_id: String,
    /// The interrupted turn (default: the session's newest).
    #[serde(default)]
    pub turn_id: Option<String>,
}
impl Checked for SessionRetryTurn {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)?;
        within_opt("turn_id", &self.turn_id, MAX_ID)
    }
}

/// `task.session.fork`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionFork {
    /// The session to fork.
    pub session_id: String,
    /// The last turn the fork keeps (default: the session's newest).
    #[serde(default)]
    pub turn_id: Option<String>,
}
impl Checked for SessionFork {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)?;
        within_opt("turn_id", &self.turn_id, MAX_ID)
    }
}

/// `task.session.rewind`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRewind {
    /// The session.
    pub session_id: String,
    /// The turn that becomes the conversation's last.
    pub turn_id: String,
    /// Also return the workspace to its git state at that turn (what it holds now is first
    /// saved on a ref, `refs/tether/rewound/...`); default false.
    #[serde(default)]
    pub restore_workspace: Option<bool>,
}
impl Checked for SessionRewind {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)?;
        within("turn_id", &self.turn_id, MAX_ID)
    }
}

/// `task.session.changes.revert`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionChangesRevert {
    /// The session.
    pub session_id: String,
    /// The changed file to revert (a path `task.session.changes` lists).
    pub path: String,
}
impl Checked for SessionChangesRevert {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)?;
        within("path", &self.path, MAX_PATH)
    }
}

/// `engines.drain`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnginesDrain {
    /// The engine.
    pub name: String,
    /// How long a running turn may take to end before it is cancelled for the move
    /// (default 30000).
    #[serde(default)]
    pub force_after_ms: Option<u64>,
}
impl Checked for EnginesDrain {
    fn limits(&self) -> Result<(), ParamError> {
        within("name", &self.name, MAX_ID)
    }
}

/// A `force_after_ms` within a day.
fn force_after_within(force_after_ms: Option<u64>) -> Result<(), ParamError> {
    match force_after_ms {
        Some(ms) if ms > MAX_PAUSE_WAIT_MS => Err(ParamError {
            field: Some("force_after_ms".into()),
            limit: Some(MAX_PAUSE_WAIT_MS),
            message: format!("force_after_ms must be at most {MAX_PAUSE_WAIT_MS} (a day)"),
        }),
        _ => Ok(()),
    }
}

/// Placement labels within their limits: at most [`MAX_LABELS`], no empty key.
fn labels_within(
    labels: Option<&std::collections::BTreeMap<String, String>>,
) -> Result<(), ParamError> {
    let labels = labels.into_iter().flatten();
    if labels.clone().count() > MAX_LABELS {
        return Err(ParamError {
            field: Some("labels".into()),
            message: format!("at most {MAX_LABELS} labels"),
            limit: Some(MAX_LABELS as u64),
        });
    }
    for (key, value) in labels {
        if key.is_empty() {
            return Err(ParamError {
                field: Some("labels".into()),
                message: "a label's key is empty".into(),
                limit: None,
            });
        }
        within("labels", key, MAX_ID)?;
        within("labels", value, MAX_ID)?;
    }
    Ok(())
}

/// `task.session.move`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionMove {
    /// The session.
    pub session_id: String,
    /// The runtime to run it on from now on (a registered runtime's name: `standalone`,
    /// `docker`).
    pub runtime: RuntimeKind,
    /// Its placement labels there (replacing the ones it had; absent: none); only for a
    /// runtime that places by labels (Docker).
    #[serde(default)]
    pub labels: Option<std::collections::BTreeMap<String, String>>,
    /// How long a running turn may take to end before it is cancelled for the move
    /// (default 30000; at most a day).
    #[serde(default)]
    pub force_after_ms: Option<u64>,
}
impl Checked for SessionMove {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)?;
        within("runtime", self.runtime.as_str(), MAX_ID)?;
        labels_within(self.labels.as_ref())?;
        force_after_within(self.force_after_ms)
    }
}

/// `engines.undrain`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EngineName {
    /// The engine.
    pub name: String,
}
impl Checked for EngineName {
    fn limits(&self) -> Result<(), ParamError> {
        within("name", &self.name, MAX_ID)
    }
}

/// `task.session.checkpoint.restore`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionCheckpointRestore {
    /// The session.
    pub session_id: String,
    /// The checkpoint, by its number (`task.session.checkpoint.list`); absent: `turn`'s.
    #[serde(default)]
    pub seq: Option<u64>,
    /// The turn whose checkpoint, by its number from 1; absent (with `seq`): the newest.
    #[serde(default)]
    pub turn: Option<u64>,
    /// The directory to write it into: an absolute path, absent or empty.
    pub into: String,
}
impl Checked for SessionCheckpointRestore {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)?;
        within("into", &self.into, MAX_PATH)
    }
}

/// `task.session.changes.keep`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionChangesKeep {
    /// The session.
    pub session_id: String,
    /// The changed file (a path `task.session.changes` lists).
    pub path: String,
    /// The content kept: the `content` `task.session.changes` gave for it (what the
    /// reviewer saw; a file changed since is not kept).
    pub content: String,
    /// Keep (default) or take a keep back.
    #[serde(default)]
    pub kept: Option<bool>,
}
impl Checked for SessionChangesKeep {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)?;
        within("path", &self.path, MAX_PATH)?;
        within("content", &self.content, MAX_ID)
    }
}

/// `task.session.queue.edit`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionQueueEdit {
    /// The session.
    pub session_id: String,
    /// The queued prompt.
    pub prompt_id: String,
    /// Its new text (at most 8 MiB; unchanged when absent).
    #[serde(default)]
    pub prompt: Option<String>,
    /// Its new place, from 1 (past the end is the end; unchanged when absent).
    #[serde(default)]
    pub position: Option<usize>,
}
impl Checked for SessionQueueEdit {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)?;
        within("prompt_id", &self.prompt_id, MAX_ID)?;
        within_opt("prompt", &self.prompt, MAX_PROMPT)
    }
}

/// `task.session.queue.remove`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionQueueRemove {
    /// The session.
    pub session_id: String,
    /// The queued prompt.
    pub prompt_id: String,
}
impl Checked for SessionQueueRemove {
    fn limits(&self) -> Result<(), ParamError> {
        within("session_id", &self.session_id, MAX_ID)?;
        within("prompt_id", &self.prompt_id, MAX_ID)
    }
}

/// `budget.set`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetSet {
    /// The session whose budget this is (or `task_id`).
    #[serde(default)]
    pub session_id: Option<String>,
    /// The task whose budget this is (or `session_id`).
    #[serde(default)]
    pub task_id: Option<String>,
    /// The most tokens.
    #[serde(default)]
    pub tokens: Option<u64>,
    /// The most cost, in `currency`.
    #[serde(default)]
    pub cost: Option<f64>,
    /// The currency of `cost` (default `USD`; at most 16 bytes).
    #[serde(default)]
    pub currency: Option<String>,
}
impl Checked for BudgetSet {
    fn limits(&self) -> Result<(), ParamError> {
        if self.session_id.is_some() == self.task_id.is_some() {
            return Err(ParamError {
                field: Some("session_id".into()),
                message: "give one of session_id and task_id".into(),
                limit: None,
            });
        }
        within_opt("session_id", &self.session_id, MAX_ID)?;
        within_opt("task_id", &self.task_id, MAX_ID)?;
        within_opt("currency", &self.currency, 16)?;
        match self.cost {
            Some(cost) if !cost.is_finite() || cost < 0.0 => Err(ParamError {
                field: Some("cost".into()),
                message: format!("cost is {cost}; it must be a number of at least 0"),
                limit: None,
            }),
            _ => Ok(()),
        }
    }
}

/// `usage.query`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    /// One session's turns.
    #[serde(default)]
    pub session_id: Option<String>,
    /// One task's.
    #[serde(default)]
    pub task_id: Option<String>,
    /// One agent profile's.
    #[serde(default)]
    pub profile: Option<String>,
    /// One workflow's.
    #[serde(default)]
    pub workflow_id: Option<String>,
    /// Turns that ended at or after this time (Unix ms).
    #[serde(default)]
    pub since_ms: Option<i64>,
    /// Turns that ended before this time (Unix ms).
    #[serde(default)]
    pub until_ms: Option<i64>,
    /// Totals per group as well.
    #[serde(default)]
    pub group_by: Option<super::UsageGroupBy>,
}
impl Checked for UsageQuery {
    fn limits(&self) -> Result<(), ParamError> {
        within_opt("session_id", &self.session_id, MAX_ID)?;
        within_opt("task_id", &self.task_id, MAX_ID)?;
        within_opt("profile", &self.profile, MAX_ID)?;
        within_opt("workflow_id", &self.workflow_id, MAX_ID)
    }
}

/// `workflow.subscribe`
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkflowSubscribe {
    /// The workflow.
    pub workflow_id: String,
    /// Events after this seq (default 0); not past the workflow's newest event.
    #[serde(default)]
    pub after_seq: Option<u64>,
}
impl Checked for WorkflowSubscribe {
    fn limits(&self) -> Result<(), ParamError> {
        within("workflow_id", &self.workflow_id, MAX_ID)
    }
}

/// Parses `raw` as `T` and applies its limits. Params must be an object by name (or
/// absent).
pub fn parse<T: Checked>(raw: Option<&RawValue>) -> Result<T, ParamError> {
    let text = match raw.map(RawValue::get) {
        None => "{}",
        Some(text) if text.trim() == "[]" => "{}",
        Some(text) if text.trim_start().starts_with('[') => {
            return Err(ParamError {
                field: None,
                message: "params must be an object by name, not an array".into(),
                limit: None,
            });
        }
        Some(text) => text,
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed: T = serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let message = inner.to_string();
        // serde names a missing or unknown field in its message, not in the path.
        let field = match path.as_str() {
            "." | "" => named_field(&message),
            path => Some(path.to_owned()),
        };
        let message = match &field {
            Some(field) if !message.contains(&format!("`{field}`")) => {
                format!("{field}: {}", strip_position(&message))
            }
            _ => strip_position(&message),
        };
        ParamError { field, message, limit: None }
    })?;
    parsed.limits()?;
    Ok(parsed)
}

/// The field a serde message names (`missing field `x``, `unknown field `x``).
fn named_field(message: &str) -> Option<String> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(message[start..start + len].to_owned())
}

/// Drops serde_json's " at line 1 column 42": the caller sent an object, not a file.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(idx) => message[..idx].to_owned(),
        None => message.to_owned(),
    }
}

/// Checks the params of `method` (a method of the frontend API). Methods it does not know
/// pass: the router answers them.
pub fn check(method_name: &str, raw: Option<&RawValue>) -> Result<(), ParamError> {
    use method::{
        AGENTS_LIST, BUDGET_SET, CLEANUP, DISCOVER, ELICITATION_RESPOND, ENGINES_DRAIN,
        ENGINES_LIST, ENGINES_UNDRAIN, PERMISSION_RESPOND, SESSION_CANCEL, SESSION_CHANGES,
        SESSION_CHANGES_KEEP, SESSION_CHANGES_REVERT, SESSION_CHECKPOINT_LIST,
        SESSION_CHECKPOINT_RESTORE, SESSION_CONFIG_OPTIONS, SESSION_CREATE, SESSION_DELETE,
        SESSION_EVENT_WINDOW, SESSION_FORK, SESSION_HISTORY, SESSION_LIST, SESSION_MOVE,
        SESSION_PAUSE, SESSION_PROMPT, SESSION_QUEUE_CLEAR, SESSION_QUEUE_EDIT, SESSION_QUEUE_LIST,
        SESSION_QUEUE_REMOVE, SESSION_QUEUE_RESUME, SESSION_RESUME, SESSION_RETRY_TURN,
        SESSION_REWIND, SESSION_SET_CONFIG_OPTION, SESSION_SET_MODE, SESSION_STATUS, SESSION_STEER,
        SESSION_STOP, SESSION_SUBSCRIBE, SESSION_SUBSCRIBE_BATCH, SESSION_TIMELINE,
        SESSIONS_SUBSCRIBE, SNAPSHOT_GET, SNAPSHOT_LIST, STOP_ALL, TASK_CREATE, TASK_DELETE,
        TASK_GET, TASK_LIST, USAGE_QUERY, WORKFLOW_APPROVE, WORKFLOW_CANCEL, WORKFLOW_DELETE,
        WORKFLOW_LIST, WORKFLOW_RESUME, WORKFLOW_START, WORKFLOW_STATUS, WORKFLOW_SUBSCRIBE,
        WORKFLOWS_SUBSCRIBE,
    };
    match method_name {
        AGENTS_LIST | TASK_LIST | STOP_ALL | DISCOVER | WORKFLOW_LIST | SESSIONS_SUBSCRIBE
        | WORKFLOWS_SUBSCRIBE | ENGINES_LIST => parse::<NoParams>(raw).map(drop),
        WORKFLOW_START => parse::<WorkflowStart>(raw).map(drop),
        WORKFLOW_STATUS | WORKFLOW_CANCEL | WORKFLOW_DELETE => parse::<WorkflowId>(raw).map(drop),
        WORKFLOW_RESUME => parse::<WorkflowResume>(raw).map(drop),
        WORKFLOW_APPROVE => parse::<WorkflowApprove>(raw).map(drop),
        SESSION_RETRY_TURN => parse::<SessionRetryTurn>(raw).map(drop),
        SESSION_FORK => parse::<SessionFork>(raw).map(drop),
        SESSION_REWIND => parse::<SessionRewind>(raw).map(drop),
        SESSION_CHANGES_REVERT => parse::<SessionChangesRevert>(raw).map(drop),
        SESSION_CHANGES_KEEP => parse::<SessionChangesKeep>(raw).map(drop),
        SESSION_CHECKPOINT_RESTORE => parse::<SessionCheckpointRestore>(raw).map(drop),
        ENGINES_DRAIN => parse::<EnginesDrain>(raw).map(drop),
        ENGINES_UNDRAIN => parse::<EngineName>(raw).map(drop),
        SESSION_MOVE => parse::<SessionMove>(raw).map(drop),
        BUDGET_SET => parse::<BudgetSet>(raw).map(drop),
        USAGE_QUERY => parse::<UsageQuery>(raw).map(drop),
        WORKFLOW_SUBSCRIBE => parse::<WorkflowSubscribe>(raw).map(drop),
        TASK_CREATE => parse::<TaskCreate>(raw).map(drop),
        TASK_GET => parse::<TaskGet>(raw).map(drop),
        TASK_DELETE => parse::<TaskDelete>(raw).map(drop),
        SESSION_CREATE => parse::<SessionCreate>(raw).map(drop),
        SESSION_LIST => parse::<SessionList>(raw).map(drop),
        SESSION_SET_CONFIG_OPTION => parse::<SessionSetConfigOption>(raw).map(drop),
        SESSION_SET_MODE => parse::<SessionSetMode>(raw).map(drop),
        SESSION_STATUS
        | SESSION_CHANGES
        | SESSION_CHECKPOINT_LIST
        | SESSION_CANCEL
        | SESSION_STOP
        | SNAPSHOT_LIST
        | SESSION_CONFIG_OPTIONS
        | SESSION_QUEUE_LIST
        | SESSION_QUEUE_CLEAR
        | SESSION_QUEUE_RESUME => parse::<SessionId>(raw).map(drop),
        SESSION_QUEUE_EDIT => parse::<SessionQueueEdit>(raw).map(drop),
        SESSION_QUEUE_REMOVE => parse::<SessionQueueRemove>(raw).map(drop),
        SESSION_DELETE => parse::<SessionDelete>(raw).map(drop),
        CLEANUP => parse::<Cleanup>(raw).map(drop),
        SESSION_RESUME => parse::<SessionResume>(raw).map(drop),
        SESSION_TIMELINE => parse::<SessionTimeline>(raw).map(drop),
        SESSION_EVENT_WINDOW => parse::<SessionEventWindow>(raw).map(drop),
        SNAPSHOT_GET => parse::<SnapshotGet>(raw).map(drop),
        SESSION_PROMPT | SESSION_STEER => parse::<SessionPrompt>(raw).map(drop),
        SESSION_PAUSE => parse::<SessionPause>(raw).map(drop),
        PERMISSION_RESPOND => parse::<PermissionRespond>(raw).map(drop),
        ELICITATION_RESPOND => parse::<ElicitationRespond>(raw).map(drop),
        SESSION_HISTORY => parse::<SessionHistory>(raw).map(drop),
        SESSION_SUBSCRIBE | SESSION_SUBSCRIBE_BATCH => parse::<SessionSubscribe>(raw).map(drop),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    fn refused(method_name: &str, text: &str) -> ParamError {
        check(method_name, Some(&raw(text))).expect_err(text)
    }

    #[test]
    fn every_refusal_names_its_field() {
        let missing = refused(method::TASK_CREATE, r#"{"description":"d"}"#);
        assert_eq!(missing.field.as_deref(), Some("title"));
        let unknown = refused(method::TASK_CREATE, r#"{"title":"t","titel":"x"}"#);
        assert_eq!(unknown.field.as_deref(), Some("titel"));
        let mistyped = refused(method::SESSION_HISTORY, r#"{"session_id":"s","limit":"ten"}"#);
        assert_eq!(mistyped.field.as_deref(), Some("limit"));
        assert!(mistyped.message.starts_with("limit: "), "{}", mistyped.message);
        let bad_enum = refused(method::SESSION_LIST, r#"{"state":"FAILD"}"#);
        assert_eq!(bad_enum.field.as_deref(), Some("state"));
        // Runtimes are an open set (the daemon refuses a name it has not registered), but
        // a runtime is a name.
        let bad_runtime = refused(
            method::SESSION_CREATE,
            r#"{"task_id":"t","agent_profile_id":"a","workspace_path":"/w","runtime":7}"#,
        );
        assert_eq!(bad_runtime.field.as_deref(), Some("runtime"));
        let bad_labels = refused(
            method::SESSION_CREATE,
            r#"{"task_id":"t","agent_profile_id":"a","labels":{"zone":1}}"#,
        );
        assert_eq!(bad_labels.field.as_deref(), Some("labels.zone"));
        let empty_key = refused(
            method::SESSION_CREATE,
            r#"{"task_id":"t","agent_profile_id":"a","labels":{"":"x"}}"#,
        );
        assert_eq!(empty_key.field.as_deref(), Some("labels"));
        let many: Vec<String> = (0..=MAX_LABELS).map(|i| format!(r#""k{i}":"v""#)).collect();
        let too_many = refused(
            method::SESSION_CREATE,
            &format!(r#"{{"task_id":"t","agent_profile_id":"a","labels":{{{}}}}}"#, many.join(",")),
        );
        assert_eq!((too_many.field.as_deref(), too_many.limit), (Some("labels"), Some(32)));
        assert!(refused(method::SESSION_STATUS, r#"["s"]"#).message.contains("object"));
        assert!(check(method::SESSION_LIST, None).is_ok());
        assert!(check(method::TASK_LIST, Some(&raw("[]"))).is_ok());
    }

    /// A typed client sends an absent optional flag as `null`: taken as its default.
    #[test]
    fn a_rewind_takes_restore_workspace_absent_null_or_a_boolean() {
        for flag in ["", r#","restore_workspace":null"#, r#","restore_workspace":true"#] {
            let raw = format!(r#"{{"session_id":"s","turn_id":"t"{flag}}}"#);
            let raw = serde_json::value::RawValue::from_string(raw).unwrap();
            assert!(check(method::SESSION_REWIND, Some(&raw)).is_ok(), "{raw}");
        }
        let wrong = refused(
            method::SESSION_REWIND,
            r#"{"session_id":"s","turn_id":"t","restore_workspace":"yes"}"#,
        );
        assert_eq!(wrong.field.as_deref(), Some("restore_workspace"));
    }

    #[test]
    fn sizes_are_bounded_and_the_refusal_says_which_limit() {
        let title = "t".repeat(MAX_TITLE + 1);
        let err = refused(method::TASK_CREATE, &format!(r#"{{"title":"{title}"}}"#));
        assert_eq!(err.field.as_deref(), Some("title"));
        assert_eq!(err.limit, Some(MAX_TITLE as u64));
        assert!(err.message.contains("1024"), "{}", err.message);
        let ok = "t".repeat(MAX_TITLE);
        assert!(check(method::TASK_CREATE, Some(&raw(&format!(r#"{{"title":"{ok}"}}"#)))).is_ok());
        let err = refused(method::SESSION_HISTORY, r#"{"session_id":"s","limit":100001}"#);
        assert_eq!((err.field.as_deref(), err.limit), (Some("limit"), Some(100_000)));
        let long_id = "s".repeat(MAX_ID + 1);
        let err = refused(method::SESSION_STOP, &format!(r#"{{"session_id":"{long_id}"}}"#));
        assert_eq!(err.field.as_deref(), Some("session_id"));
        let data = ErrorData::of(&err.into_error()).unwrap();
        assert_eq!(data.kind, ErrorKind::InvalidParams);
        assert_eq!(data.field.as_deref(), Some("session_id"));
    }
}
