//! The events a session publishes to API subscribers, spooled per session under
//! `sessions/<id>/events/` (agentctl's spool, which is generic over its entries) so that a
//! client reconnecting with `after_seq` misses nothing.

use serde::{Deserialize, Serialize};

/// How much of a session's event log is kept: it is cut in segments of `segment_bytes`, and
/// once it holds more than `retain_bytes` its oldest segments are dropped — so at least the
/// newest `retain_bytes − segment_bytes` stay. `task.session.subscribe` delivers every event
/// after `after_seq` when the log still holds it, and refuses an `after_seq` before what it
/// holds (`invalid_params`, field `after_seq`, naming the oldest seq kept); the
/// conversation itself stays whole in the history.
#[derive(Debug, Clone, Copy)]
pub struct LogLimits {
    /// Keep at least the newest this many bytes.
    pub retain_bytes: u64,
    /// Segment size.
    pub segment_bytes: u64,
}

/// The default of [`LogLimits::retain_bytes`]: 64 MiB, about 600,000 chunk events.
pub const DEFAULT_RETAIN_BYTES: u64 = 64 << 20;

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
    /// In a batch written at once: the seq of its last event. The batch's events share one
    /// `agent_seq`, so a batch a kill left half-written is cut whole when the log is
    /// reopened (its mark would claim the events that are missing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_last: Option<u64>,
    /// What happened.
    #[serde(flatten)]
    pub kind: SessionEventKind,
}

impl agentctl::spool::Entry for SessionEvent {
    fn seq(&self) -> u64 {
        self.seq
    }

    fn batch_last(&self) -> Option<u64> {
        self.batch_last
    }

    fn set_batch_last(&mut self, last: u64) {
        self.batch_last = Some(last);
    }
}

/// What a session event says: the API's event kinds. The log exists to replay exactly what
/// subscribers are sent, so it stores the wire payload; only the marks around it
/// (`agent_seq`, `generation`, `batch_last`) are the log's own and never leave the daemon.
pub use protocol::api::{EventKind as SessionEventKind, LaunchStep};

impl SessionEvent {
    /// The event as subscribers get it.
    pub fn to_wire(&self) -> protocol::api::SessionEvent {
        protocol::api::SessionEvent { seq: self.seq, at: self.at, kind: self.kind.clone() }
    }
}
