//! The events a session publishes to API subscribers, spooled per session under
//! `sessions/<id>/events/` (agentctl's spool, which is generic over its entries) so that a
//! client reconnecting with `after_seq` misses nothing.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::store::{ResumeOutcome, SessionState, TurnState};

/// One session event.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionEvent {
    /// From 1, without gaps, per session.
    pub seq: u64,
    /// Unix ms.
    pub at: u64,
    /// The newest agentctl event seq handled when this was emitted; after a restart, events
    /// at or below it are not emitted again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_seq: Option<u64>,
    /// The execution (its generation) whose events `agent_seq` counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// What happened.
    #[serde(flatten)]
    pub kind: SessionEventKind,
}

impl agentctl::spool::Entry for SessionEvent {
    fn seq(&self) -> u64 {
        self.seq
    }
}

/// The kinds of [`SessionEvent`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum SessionEventKind {
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
        /// The turn.
        turn_id: String,
        /// The user's prompt.
        prompt: String,
    },
    /// A chunk of the agent's reply.
    AgentMessageChunk {
        /// The text.
        text: String,
    },
    /// A chunk of the agent's reasoning.
    AgentThoughtChunk {
        /// The text.
        text: String,
    },
    /// A tool call started (the raw ACP update).
    ToolCall {
        /// The `update` object.
        update: Value,
    },
    /// A tool call progressed (the raw ACP update).
    ToolCallUpdate {
        /// The `update` object.
        update: Value,
    },
    /// Any other `session/update` (plans, modes, …), raw.
    SessionUpdate {
        /// The `update` object.
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
    /// A permission request was answered (or cancelled).
    PermissionResolved {
        /// The request.
        request_id: String,
        /// The ACP outcome sent to the agent.
        outcome: Value,
    },
    /// A turn ended.
    TurnEnded {
        /// The turn.
        turn_id: String,
        /// `completed`, `failed` or `interrupted`.
        state: TurnState,
        /// The agent's stop reason, when it answered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stop_reason: Option<String>,
        /// Why it failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// Something a person should know (agent noise, a fallback taken).
    Notice {
        /// The message.
        message: String,
    },
    /// A step of bringing the agent up, for a "starting…" / "resuming…" indicator (an agent
    /// may take seconds per step).
    Progress {
        /// The step.
        step: LaunchStep,
        /// What it is about: the program launched, the method used.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// How a resume restored the session: `native_resume`, `native_load`,
    /// `resume_command`, `history_injection` or `fresh`.
    ResumeOutcome {
        /// The outcome.
        outcome: ResumeOutcome,
    },
}

/// The steps of bringing an agent up, in order (`authenticating` and `restoring` only when
/// they happen).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
}
