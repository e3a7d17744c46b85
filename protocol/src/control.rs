//! The control channel between the supervisor and agentctl: method names, params, results
//! and the event stream, as plain serde types. The transport (JSON-RPC over WebSocket)
//! lives in the `agentctl` crate; this module only fixes the shapes both sides agree on.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Method names.
pub mod method {
    /// `status` → [`super::Status`].
    pub const STATUS: &str = "status";
    /// `agent.start` [`super::StartAgent`] → [`super::AgentStarted`].
    pub const AGENT_START: &str = "agent.start";
    /// `acp.send {message}`: one JSON-RPC message to the agent's stdin.
    pub const ACP_SEND: &str = "acp.send";
    /// Subscription: `events.subscribe {after_seq}` → a stream of [`super::Event`].
    pub const EVENTS_SUBSCRIBE: &str = "events.subscribe";
    /// The notification name of the event subscription.
    pub const EVENTS_NOTIFICATION: &str = "events.event";
    /// Unsubscribe from events.
    pub const EVENTS_UNSUBSCRIBE: &str = "events.unsubscribe";
    /// `events.ack {seq}`: everything up to `seq` is durably handled.
    pub const EVENTS_ACK: &str = "events.ack";
    /// `agent.stop {grace_ms}` → [`super::Stopped`].
    pub const AGENT_STOP: &str = "agent.stop";
    /// `shutdown`: stop the agent and exit.
    pub const SHUTDOWN: &str = "shutdown";
}

/// The environment variable that carries agentctl's bearer token.
pub const TOKEN_ENV: &str = "AGENTCTL_TOKEN";

/// What agentctl prints as its one ready line and writes to `ready.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadyInfo {
    /// agentctl's pid.
    pub pid: u32,
    /// The port the control channel listens on.
    pub port: u16,
    /// agentctl's start time in clock ticks since boot (`/proc/<pid>/stat` field 22), which
    /// with `boot_id` tells a live sidecar from a recycled pid.
    pub start_time: u64,
    /// The kernel's boot id (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: String,
    /// agentctl's version.
    pub version: String,
}

/// `agent.start` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartAgent {
    /// The program.
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The working directory (absolute). It is also the first workspace root.
    pub cwd: PathBuf,
    /// More directories the agent's `fs/*` requests may touch, besides `cwd`.
    #[serde(default)]
    pub extra_roots: Vec<PathBuf>,
}

/// `agent.start` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentStarted {
    /// The agent's pid (also its process group id).
    pub pid: u32,
    /// The event's sequence number.
    pub seq: u64,
}

/// `acp.send` params.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AcpSend {
    /// One JSON-RPC message, written to the agent's stdin as one line.
    pub message: Value,
}

/// `events.subscribe` params.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscribe {
    /// Deliver events with `seq > after_seq`, then live ones.
    pub after_seq: u64,
}

/// `events.ack` params.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// Everything up to and including this seq may be dropped.
    pub seq: u64,
}

/// `agent.stop` params.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stop {
    /// The grace period of each step: after closing stdin, and after SIGTERM.
    pub grace_ms: u64,
}

/// How a stop ended the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopStage {
    /// It exited after stdin closed.
    Eof,
    /// It needed SIGTERM.
    Sigterm,
    /// It needed SIGKILL.
    Sigkill,
    /// It had already exited.
    AlreadyExited,
}

/// `agent.stop` result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stopped {
    /// The step that ended it.
    pub stage: StopStage,
    /// Its exit status.
    pub status: ExitInfo,
}

/// An exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    /// The exit code, when it exited normally.
    pub code: Option<i32>,
    /// The signal that killed it, otherwise.
    pub signal: Option<i32>,
}

/// The agent's state as agentctl sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentState {
    /// `agent.start` has not been called.
    NotStarted,
    /// Running.
    Running,
    /// Exited (see `exit`).
    Exited,
}

/// `status` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// agentctl's version.
    pub version: String,
    /// The agent's state.
    pub agent_state: AgentState,
    /// The agent's pid, once started.
    pub agent_pid: Option<u32>,
    /// Its exit status, once exited.
    pub exit: Option<ExitInfo>,
    /// The newest event's seq (0 before any).
    pub last_seq: u64,
    /// The highest acknowledged seq.
    pub acked_seq: u64,
    /// Why the agent's output is not being taken in, while the spool cannot be written
    /// (e.g. the disk is full); nothing is dropped meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intake_stalled: Option<String>,
}

/// One event from agentctl. Every event is in the spool before it is delivered.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    /// Strictly increasing from 1, without gaps.
    pub seq: u64,
    /// When it happened, in milliseconds since the Unix epoch.
    pub at: u64,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// The kinds of [`Event`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// One agent→client JSON-RPC message, every member kept (key order too). When agentctl answered it itself
    /// (`fs/*` requests), `answered` holds the response it sent, and the supervisor must
    /// not answer again.
    Acp {
        /// The message.
        message: Value,
        /// agentctl's own response, for requests it served.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answered: Option<Value>,
    },
    /// One line the agent wrote on stderr.
    Stderr {
        /// The line (lossy UTF-8).
        line: String,
    },
    /// A stdout line that is not a JSON-RPC message.
    StdoutNoise {
        /// At most 4 KiB of the line (lossy UTF-8).
        line: String,
        /// Why it was not a message.
        reason: String,
    },
    /// The agent process started.
    AgentStarted {
        /// Its pid.
        pid: u32,
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
    },
    /// The agent process exited.
    AgentExited {
        /// How.
        status: ExitInfo,
        /// The last 64 KiB of its stderr.
        stderr_tail: String,
    },
    /// Something went wrong that is worth recording (an oversized line, a failed write).
    Error {
        /// What.
        message: String,
    },
    /// A request of the supervisor's (a message with a method and an id, through
    /// `acp.send`) was queued for the agent's stdin. Spooled, so that after a restart the
    /// supervisor knows which of its requests got through (a prompt that did not is failed,
    /// not waited for forever).
    Delivered {
        /// The request's id.
        id: Value,
    },
    /// agentctl started (`reason` set) or stopped (`None`) holding the agent's output
    /// because its spool cannot be written (a full disk). Not spooled — it could not be —
    /// but sent to live subscribers with seq 0, outside the sequence.
    IntakeStalled {
        /// Why, while it lasts.
        reason: Option<String>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_flat_json_objects() {
        let event = Event {
            seq: 7,
            at: 1,
            kind: EventKind::Acp {
                message: serde_json::json!({"jsonrpc": "2.0", "method": "x"}),
                answered: None,
            },
        };
        let json = serde_json::to_string(&event).unwrap();
        assert_eq!(
            json,
            r#"{"seq":7,"at":1,"kind":"acp","message":{"jsonrpc":"2.0","method":"x"}}"#
        );
        let back: Event = serde_json::from_str(&json).unwrap();
        assert_eq!(back.seq, 7);
        let exited: Event = serde_json::from_str(
            r#"{"seq":2,"at":3,"kind":"agent_exited","status":{"code":null,"signal":9},"stderr_tail":"boom"}"#,
        )
        .unwrap();
        assert!(matches!(
            exited.kind,
            EventKind::AgentExited { status: ExitInfo { signal: Some(9), .. }, .. }
        ));
    }
}
