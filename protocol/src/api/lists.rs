//! The session list on the wire: what `sessions.subscribe` tells a client that shows it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::SessionSummary;

/// One event of `sessions.subscribe` (`sessions.event` notifications).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum SessionsEvent {
    /// A session was created, or its state changed: the session as it is now.
    Changed {
        /// The session.
        session: SessionSummary,
    },
    /// A session was deleted.
    Deleted {
        /// The session.
        session_id: String,
    },
    /// Changes were missed (the client fell behind): list the sessions again.
    Resync,
    /// A kind this build does not know (a newer daemon's).
    #[serde(other)]
    Other,
}
