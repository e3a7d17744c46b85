//! A session's workspace checkpoints on the wire (`task.session.checkpoint.list`,
//! `task.session.checkpoint.restore`): the workspace's files as git objects, one commit at
//! every turn's end (and at a pause, a park, a stop, before a move), in a repository the
//! supervisor keeps for the session.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What took a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointTrigger {
    /// A turn ended (any way: completed, cancelled, failed).
    Turn,
    /// The session was paused.
    Pause,
    /// The idle agent was parked.
    Park,
    /// The session was stopped.
    Stop,
    /// The workspace was about to be restored from another checkpoint (what it held is
    /// kept here, so a restore loses nothing).
    Restore,
}

impl CheckpointTrigger {
    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckpointTrigger::Turn => "turn",
            CheckpointTrigger::Pause => "pause",
            CheckpointTrigger::Park => "park",
            CheckpointTrigger::Stop => "stop",
            CheckpointTrigger::Restore => "restore",
        }
    }
}

/// A file a checkpoint left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LeftOut {
    /// Its path in the workspace.
    pub path: String,
    /// Its size, bytes (over the per-file limit).
    pub bytes: u64,
}

/// One checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Checkpoint {
    /// Its number in the session, from 1.
    pub seq: u64,
    /// What took it.
    pub trigger: CheckpointTrigger,
    /// The turn it ends, for a turn's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// That turn's number in the session, from 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u64>,
    /// The commit (in the session's checkpoint repository).
    pub commit: String,
    /// The ref that names it (`refs/tether/sessions/<session>/turns/<n>` for a turn's).
    #[serde(rename = "ref")]
    pub git_ref: String,
    /// The files it holds.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// The bytes it added to the repository (what changed since the one before,
    /// compressed).
    pub added_bytes: u64,
    /// Files over the per-file limit, left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<LeftOut>,
    /// When it was taken, Unix ms.
    pub taken_at: i64,
}

/// `task.session.checkpoint.list`: a session's checkpoints, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CheckpointList {
    /// The session.
    pub session_id: String,
    /// Its checkpoints, oldest first.
    pub checkpoints: Vec<Checkpoint>,
}

/// `task.session.checkpoint.restore`: what was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CheckpointRestored {
    /// The checkpoint restored.
    pub checkpoint: Checkpoint,
    /// The directory it was written into.
    pub into: String,
    /// The files written.
    pub files: u64,
}
