//! The control channel between the supervisor and agentctl: the `Control` trait (one
//! definition: jsonrpsee generates agentctl's server side and the supervisor's client side)
//! and its params, results and event stream. The transport (JSON-RPC over WebSocket) lives
//! in the `agentctl` crate; this module only fixes what both sides agree on. Errors carry
//! `data.kind` from [`crate::errors::ErrorKind`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use jsonrpsee::core::{RpcResult, SubscriptionResult};
use jsonrpsee::proc_macros::rpc;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::Done;

/// The environment variable that carries agentctl's bearer token.
pub const TOKEN_ENV: &str = "AGENTCTL_TOKEN";

/// The descriptor a confined agent's command gets its egress proxy's socket on (opened
/// `O_PATH` by agentctl): `/proc/self/fd/3` reaches the proxy from any sandbox and as any
/// user, without the socket's path (in the daemon's private data dir) being reachable.
pub const EGRESS_FD: i32 = 3;

/// That descriptor as a path to connect to.
pub const EGRESS_SOCKET_INSIDE: &str = "/proc/self/fd/3";

/// The daemon's own variables, which never reach a sidecar or an agent: the daemon's API
/// token and the CLI's (an agent that prints its environment would hand them to its
/// model), and where the daemon keeps its data (an agent has no business there). agentctl's
/// own token is removed from the agent's environment separately.
pub const DAEMON_ONLY_ENV: &[&str] = &["TETHER_AUTH_TOKEN", "TETHER_TOKEN", "TETHER_HOME"];

/// What agentctl prints as its one ready line and writes to `ready.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadyInfo {
    /// agentctl's pid.
    pub pid: u32,
    /// The port the control channel listens on (0 when it is a Unix socket).
    pub port: u16,
    /// The Unix socket the control channel listens on, when it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<PathBuf>,
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
    /// Who the agent runs as (a profile's `process.user`: a name, a uid, or `uid:gid`);
    /// `None`: as agentctl's user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Directories given to `user` (recursively) before the agent starts: its state
    /// directories in a container, mounted there as root's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owned_dirs: Vec<PathBuf>,
    /// The agent's egress proxy, run by agentctl for as long as it lives (`None`: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Egress>,
    /// Start the agent in a network namespace of its own, with nothing but loopback, and
    /// without the capabilities that made it (a container's agentctl: its own namespace
    /// keeps the container's network, for the control channel and the egress proxy).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub isolate_network: bool,
}

/// An egress proxy for a confined agent (`[sandbox] network = "allowlist"`): agentctl
/// listens on `socket` and lets through only the `allow` pairs; each refusal is an
/// [`EventKind::EgressRefused`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Egress {
    /// Where it listens (a Unix socket the agent's sandbox binds in).
    pub socket: PathBuf,
    /// The `host:port` pairs it lets through (see [`crate::allowlist`]).
    pub allow: Vec<String>,
}

/// `agent.start` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentStarted {
    /// The agent's pid (also its process group id).
    pub pid: u32,
    /// The event's sequence number.
    pub seq: u64,
}

/// `events.ack` result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acked {
    /// The acknowledged seq now (never lower than before).
    pub acked_seq: u64,
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
///
/// Read in one pass (a hand-written `Deserialize`): the derived form of a flattened,
/// internally tagged enum buffers the whole event — the agent's message included — in an
/// intermediate tree and parses it twice, which was a good share of the relay's cost.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Strictly increasing from 1, without gaps.
    pub seq: u64,
    /// When it happened, in milliseconds since the Unix epoch.
    pub at: u64,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Event, D::Error> {
        use serde::de::Error;
        /// Every member any kind has; each kind takes its own (unknown members are
        /// ignored, as the derived form did).
        #[derive(Deserialize)]
        struct Flat {
            seq: u64,
            at: u64,
            kind: String,
            #[serde(default)]
            message: Option<Box<serde_json::value::RawValue>>,
            #[serde(default)]
            answered: Option<Value>,
            #[serde(default)]
            line: Option<String>,
            #[serde(default)]
            reason: Option<String>,
            #[serde(default)]
            pid: Option<u32>,
            #[serde(default)]
            command: Option<String>,
            #[serde(default)]
            args: Option<Vec<String>>,
            #[serde(default)]
            status: Option<ExitInfo>,
            #[serde(default)]
            stderr_tail: Option<String>,
            #[serde(default)]
            id: Option<Value>,
            #[serde(default)]
            target: Option<String>,
        }
        fn need<T, E: Error>(value: Option<T>, field: &'static str) -> Result<T, E> {
            value.ok_or_else(|| E::missing_field(field))
        }
        let flat = Flat::deserialize(deserializer)?;
        let kind = match flat.kind.as_str() {
            "acp" => {
                EventKind::Acp { message: need(flat.message, "message")?, answered: flat.answered }
            }
            "stderr" => EventKind::Stderr { line: need(flat.line, "line")? },
            "stdout_noise" => EventKind::StdoutNoise {
                line: need(flat.line, "line")?,
                reason: need(flat.reason, "reason")?,
            },
            "agent_started" => EventKind::AgentStarted {
                pid: need(flat.pid, "pid")?,
                command: need(flat.command, "command")?,
                args: need(flat.args, "args")?,
            },
            "agent_exited" => EventKind::AgentExited {
                status: need(flat.status, "status")?,
                stderr_tail: need(flat.stderr_tail, "stderr_tail")?,
            },
            "error" => match serde_json::from_str(need(flat.message, "message")?.get()) {
                Ok(message) => EventKind::Error { message },
                Err(_) => {
                    return Err(D::Error::custom("an error event's message must be a string"));
                }
            },
            // A null id reads as null, as the derived form read it.
            "delivered" => EventKind::Delivered { id: flat.id.unwrap_or(Value::Null) },
            "intake_stalled" => EventKind::IntakeStalled { reason: flat.reason },
            "stdout_closed" => EventKind::StdoutClosed,
            "backlog_full" => EventKind::BacklogFull,
            "egress_refused" => EventKind::EgressRefused {
                target: need(flat.target, "target")?,
                reason: need(flat.reason, "reason")?,
            },
            other => {
                return Err(D::Error::unknown_variant(
                    other,
                    &[
                        "acp",
                        "stderr",
                        "stdout_noise",
                        "agent_started",
                        "agent_exited",
                        "error",
                        "delivered",
                        "intake_stalled",
                        "stdout_closed",
                        "backlog_full",
                        "egress_refused",
                    ],
                ));
            }
        };
        Ok(Event { seq: flat.seq, at: flat.at, kind })
    }
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
        /// The message, as the agent wrote it (raw JSON: carried from agentctl's spool to
        /// the supervisor without being parsed into a tree and written out again on the
        /// way; read it with [`EventKind::acp_value`]).
        message: Box<serde_json::value::RawValue>,
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
    /// The agent closed its stdout and is still running some time later: it can answer
    /// nothing more (an agent that exits after closing it gets only `agent_exited`).
    StdoutClosed,
    /// The spool holds its bound of unacknowledged events and the agent's output waits:
    /// whatever is durable should be acknowledged now. Not spooled; sent to live
    /// subscribers with seq 0, outside the sequence.
    BacklogFull,
    /// The agent's egress proxy refused a connection.
    EgressRefused {
        /// The target asked for (`host:port`).
        target: String,
        /// Why.
        reason: String,
    },
}

/// The control channel's params, checked before a method runs (types only: unknown fields
/// pass, so sidecars and supervisors of neighbouring versions still understand each other).
pub mod params {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use schemars::JsonSchema;
    use serde::Deserialize;
    use serde_json::Value;
    use serde_json::value::RawValue;

    use crate::api::params::{Checked, ParamError, parse};

    /// `agent.start`
    #[derive(Deserialize, JsonSchema)]
    pub struct AgentStart {
        /// The program.
        pub command: String,
        /// Its arguments.
        #[serde(default)]
        pub args: Option<Vec<String>>,
        /// Extra environment variables.
        #[serde(default)]
        pub env: Option<BTreeMap<String, String>>,
        /// The working directory.
        pub cwd: PathBuf,
        /// More roots.
        #[serde(default)]
        pub extra_roots: Option<Vec<PathBuf>>,
    }
    impl Checked for AgentStart {}

    /// `acp.send`
    #[derive(Deserialize, JsonSchema)]
    pub struct AcpSend {
        /// The message.
        pub message: Value,
    }
    impl Checked for AcpSend {}

    /// `events.ack`
    #[derive(Deserialize, JsonSchema)]
    pub struct EventsAck {
        /// The seq.
        pub seq: u64,
    }
    impl Checked for EventsAck {}

    /// `agent.stop`
    #[derive(Deserialize, JsonSchema)]
    pub struct AgentStop {
        /// The grace period, ms.
        pub grace_ms: u64,
    }
    impl Checked for AgentStop {}

    /// `intake.hold`
    #[derive(Deserialize, JsonSchema)]
    pub struct IntakeHold {
        /// Hold (true) or take in again (false).
        pub hold: bool,
    }
    impl Checked for IntakeHold {}

    /// `workspace.bind`
    #[derive(Deserialize, JsonSchema)]
    pub struct WorkspaceBind {
        /// The session's workspace (absolute).
        pub cwd: PathBuf,
        /// More directories besides it.
        #[serde(default)]
        pub extra_roots: Option<Vec<PathBuf>>,
    }
    impl Checked for WorkspaceBind {}

    /// `events.subscribe`
    #[derive(Deserialize, JsonSchema)]
    pub struct EventsSubscribe {
        /// After this seq.
        pub after_seq: u64,
    }
    impl Checked for EventsSubscribe {}

    /// Checks the params of a control method (unknown methods pass: the router answers
    /// them).
    pub fn check(method: &str, raw: Option<&RawValue>) -> Result<(), ParamError> {
        match method {
            // These take nothing and ignore what they are given.
            "status" | "shutdown" => Ok(()),
            "agent.start" => parse::<AgentStart>(raw).map(drop),
            "acp.send" => parse::<AcpSend>(raw).map(drop),
            "events.ack" => parse::<EventsAck>(raw).map(drop),
            "agent.stop" => parse::<AgentStop>(raw).map(drop),
            "intake.hold" => parse::<IntakeHold>(raw).map(drop),
            "workspace.bind" => parse::<WorkspaceBind>(raw).map(drop),
            "events.subscribe" | "events.subscribe_batch" => {
                parse::<EventsSubscribe>(raw).map(drop)
            }
            _ => Ok(()),
        }
    }
}

pub use control_rpc::*;

/// The control channel's trait, apart so that the lint allowance covers the code the macro
/// writes: `agent.start` takes one param per field of [`StartAgent`].
#[allow(clippy::too_many_arguments)]
mod control_rpc {
    use super::{
        Acked, AgentStarted, BTreeMap, Done, Egress, Event, PathBuf, RpcResult, Status, Stopped,
        SubscriptionResult, Value, rpc,
    };

    /// agentctl's control channel. Params are objects by name (`agent.start` has one per field
    /// of [`StartAgent`], hence the allowance).
    #[rpc(server, client)]
    pub trait Control {
        /// agentctl's and its agent's state.
        #[method(name = "status")]
        async fn status(&self) -> RpcResult<Status>;

        /// Starts the agent (once per agentctl). See [`StartAgent`](super::StartAgent) for the params.
        #[method(name = "agent.start", param_kind = map)]
        async fn agent_start(
            &self,
            command: String,
            args: Option<Vec<String>>,
            env: Option<BTreeMap<String, String>>,
            cwd: PathBuf,
            extra_roots: Option<Vec<PathBuf>>,
            user: Option<String>,
            owned_dirs: Option<Vec<PathBuf>>,
            egress: Option<Egress>,
            isolate_network: Option<bool>,
        ) -> RpcResult<AgentStarted>;

        /// Writes one JSON-RPC message to the agent's stdin as one line.
        #[method(name = "acp.send", param_kind = map)]
        async fn acp_send(&self, message: Value) -> RpcResult<Done>;

        /// Everything up to and including `seq` is durably handled and may be dropped.
        #[method(name = "events.ack", param_kind = map)]
        async fn events_ack(&self, seq: u64) -> RpcResult<Acked>;

        /// Stops the agent: stdin closed, then SIGTERM, then SIGKILL, `grace_ms` apart.
        #[method(name = "agent.stop", param_kind = map)]
        async fn agent_stop(&self, grace_ms: u64) -> RpcResult<Stopped>;

        /// Holds the agent's output (`hold`: its stdout is not read, so the agent waits on
        /// it) or takes it in again. The supervisor holds it while it cannot record (a full
        /// disk), so that the room freed goes to recording what is spooled first.
        #[method(name = "intake.hold", param_kind = map)]
        async fn intake_hold(&self, hold: bool) -> RpcResult<Done>;

        /// Confines the agent's `fs/*` requests to `cwd` and `extra_roots` from now on: a
        /// warm agent, started before its session was known, is given its session's
        /// workspace.
        #[method(name = "workspace.bind", param_kind = map)]
        async fn workspace_bind(
            &self,
            cwd: PathBuf,
            extra_roots: Option<Vec<PathBuf>>,
        ) -> RpcResult<Done>;

        /// Stops the agent and exits.
        #[method(name = "shutdown")]
        async fn shutdown(&self) -> RpcResult<Done>;

        /// Every event with `seq > after_seq`, then live ones.
        #[subscription(
            name = "events.subscribe" => "events.event",
            unsubscribe = "events.unsubscribe",
            item = Event,
            param_kind = map
        )]
        async fn events_subscribe(&self, after_seq: u64) -> SubscriptionResult;

        /// Like `events.subscribe`, but each notification is an array of the events that were
        /// ready at once, oldest first: a burst costs one frame, not one per event. Nothing is
        /// held back to fill a batch. (An agentctl without it answers "method not found", and
        /// the client falls back to `events.subscribe`.)
        #[subscription(
            name = "events.subscribe_batch" => "events.batch",
            unsubscribe = "events.unsubscribe_batch",
            item = Vec<Event>,
            param_kind = map
        )]
        async fn events_subscribe_batch(&self, after_seq: u64) -> SubscriptionResult;
    }
}

/// The most events in one `events.batch` notification.
pub const MAX_BATCH_EVENTS: usize = 1024;

/// A batch is closed once its JSON passes this many bytes (one event may pass it alone).
pub const MAX_BATCH_BYTES: usize = 256 * 1024;

impl EventKind {
    /// The message of an `acp` event, parsed (`None` for other kinds, or a message that
    /// is not JSON a tree can hold — nested deeper than serde_json's limit).
    pub fn acp_value(&self) -> Option<Value> {
        match self {
            EventKind::Acp { message, .. } => serde_json::from_str(message.get()).ok(),
            _ => None,
        }
    }

    /// An `acp` event of `message` (as tests and fakes make them).
    pub fn acp(message: &Value) -> EventKind {
        EventKind::Acp { message: raw_json(message), answered: None }
    }
}

/// `value` as raw JSON text.
pub fn raw_json(value: &Value) -> Box<serde_json::value::RawValue> {
    serde_json::value::to_raw_value(value).expect("UNWRAP: a Value always serialises")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(value: Value) -> Box<serde_json::value::RawValue> {
        raw_json(&value)
    }

    /// The hand-written reader reads back what the derived writer writes, for every kind,
    /// and refuses what the derived reader refused.
    #[test]
    fn every_kind_reads_back_as_written() {
        let kinds = [
            EventKind::Acp {
                message: raw(
                    serde_json::json!({"jsonrpc": "2.0", "method": "m", "params": {"z": 1, "a": [1, {"b": null}]}}),
                ),
                answered: None,
            },
            EventKind::Acp {
                message: raw(
                    serde_json::json!({"jsonrpc": "2.0", "id": 4, "method": "fs/read_text_file"}),
                ),
                answered: Some(serde_json::json!({"jsonrpc": "2.0", "id": 4, "result": {}})),
            },
            EventKind::Stderr { line: "a line".into() },
            EventKind::StdoutNoise { line: "noise".into(), reason: "not JSON".into() },
            EventKind::AgentStarted { pid: 7, command: "agent".into(), args: vec!["-x".into()] },
            EventKind::AgentExited {
                status: ExitInfo { code: Some(1), signal: None },
                stderr_tail: "tail".into(),
            },
            EventKind::Error { message: "oops".into() },
            EventKind::Delivered { id: serde_json::json!("req-1") },
            EventKind::IntakeStalled { reason: Some("disk full".into()) },
            EventKind::IntakeStalled { reason: None },
            EventKind::StdoutClosed,
            EventKind::BacklogFull,
            EventKind::EgressRefused {
                target: "example.org:443".into(),
                reason: "not on the list".into(),
            },
        ];
        for (n, kind) in kinds.into_iter().enumerate() {
            let event = Event { seq: n as u64 + 1, at: 99, kind };
            let text = serde_json::to_string(&event).unwrap();
            let back: Event = serde_json::from_str(&text).unwrap();
            assert_eq!(serde_json::to_string(&back).unwrap(), text);
        }
        for bad in [
            r#"{"seq":1,"at":1,"kind":"nonsense"}"#,
            r#"{"seq":1,"at":1,"kind":"stderr"}"#,
            r#"{"seq":1,"at":1,"kind":"error","message":{"not":"a string"}}"#,
            r#"{"at":1,"kind":"stderr","line":"x"}"#,
        ] {
            assert!(serde_json::from_str::<Event>(bad).is_err(), "{bad}");
        }
        // Members of newer kinds or versions are ignored.
        let newer: Event =
            serde_json::from_str(r#"{"seq":1,"at":1,"kind":"stderr","line":"x","extra":true}"#)
                .unwrap();
        assert!(matches!(newer.kind, EventKind::Stderr { .. }));
    }

    #[test]
    fn events_are_flat_json_objects() {
        let event = Event {
            seq: 7,
            at: 1,
            kind: EventKind::Acp {
                message: raw(serde_json::json!({"jsonrpc": "2.0", "method": "x"})),
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
