//! The places sessions run on, on the wire (`engines.list`, `engines.drain`,
//! `engines.undrain`): each Docker engine's state and its sessions, and why a session
//! moved from one to another (`task.session.move` too).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What an engine does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EngineState {
    /// It takes new sessions.
    Serving,
    /// It takes none, and its sessions are moving off it.
    Draining,
    /// It takes none and holds none (`engines.undrain` returns it to service).
    Drained,
    /// It does not answer.
    Unreachable,
}

impl EngineState {
    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineState::Serving => "serving",
            EngineState::Draining => "draining",
            EngineState::Drained => "drained",
            EngineState::Unreachable => "unreachable",
        }
    }
}

/// One engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EngineInfo {
    /// Its name (`[[docker.engines]] name`).
    pub name: String,
    /// What it does now (`unreachable` wins over `serving`; a drained or draining engine
    /// that does not answer says so in `reason`).
    pub state: EngineState,
    /// Why it does not answer, when it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The sessions not ended whose newest execution ran there.
    pub sessions: Vec<String>,
    /// Since when it is draining or drained, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<i64>,
}

/// `engines.list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EngineList {
    /// Every configured engine of the Docker runtime, in config order.
    pub engines: Vec<EngineInfo>,
}

/// Why a session moved from one place to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MoveReason {
    /// Its engine was drained.
    Drain,
    /// Its engine stopped answering for `failover_after_secs`.
    Failover,
    /// Someone asked (`task.session.move`).
    Requested,
}

impl MoveReason {
    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            MoveReason::Drain => "drain",
            MoveReason::Failover => "failover",
            MoveReason::Requested => "requested",
        }
    }
}

/// `task.session.move`: where the session runs now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionMoved {
    /// The session.
    pub session_id: String,
    /// Where it ran: the runtime, and on Docker the engine (`docker/<engine>`).
    pub from: String,
    /// Where it runs now: the runtime, and on Docker the engine once its agent runs there.
    pub to: String,
    /// Its runtime from now on.
    pub runtime: super::RuntimeKind,
    /// Whether its agent was running, and so was resumed on the new runtime (else its next
    /// resume starts it there).
    pub resumed: bool,
    /// Whether its agent's own session was kept for a native resume there (its state dirs
    /// are the session's own on both sides); else its history is injected.
    pub native: bool,
}
