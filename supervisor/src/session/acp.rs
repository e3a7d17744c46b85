//! What the actor's ACP client (`actor.rs`, its section on the agent's events, answers and
//! handshake) reads agents' messages with, apart from the actor: JSON-RPC errors, plans,
//! replayed kinds, the bounds of coalescing and of a load's replay; the pure readers
//! (`parse.rs`), the requests built from the schema's types (`requests.rs`) and what is
//! said when an agent cannot go on (`explain.rs`).
//!
//! Results are parsed with the pinned ACP schema crate (`protocol::acp::schema`),
//! tolerantly: a result that does not fit the schema (a newer agent) is kept raw and read
//! for the one field needed, never a reason to fail the session.

pub(super) mod explain;
pub(super) mod parse;
pub(super) mod requests;

pub(super) use parse::KnownConversation;

use serde::Deserialize;
use serde_json::Value;

/// The longest a message is coalesced in memory, in bytes of text and in agentctl events,
/// before what it has so far is written as one history entry (the rest follows in the next).
pub(super) const MAX_COALESCED_BYTES: usize = 256 * 1024;
pub(super) const MAX_COALESCED_EVENTS: u64 = 4096;

/// How much of the history's end a load's trailing replay is matched against.
pub(super) const REPLAY_WINDOW_BYTES: u64 = 256 * 1024;

/// A JSON-RPC error object, tolerantly.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RpcErrorBody {
    pub(super) code: Option<i64>,
    pub(super) message: Option<String>,
    pub(super) data: Option<Value>,
}

impl RpcErrorBody {
    /// One line; `-32603` with `data.details` shows the details.
    pub(super) fn text(&self) -> String {
        let message = self.message.as_deref().unwrap_or("error");
        match self.data.as_ref().and_then(|data| data.get("details")).and_then(Value::as_str) {
            Some(details) => format!("{message}: {details}"),
            None => message.to_owned(),
        }
    }
}

/// A `plan` update's entries; what is not an object with a text `content` is left out, a
/// missing `status` is `pending`.
pub(super) fn plan_entries(update: &Value) -> Vec<protocol::api::PlanEntry> {
    let entries = update.get("entries").and_then(Value::as_array).map(Vec::as_slice);
    let entry = |entry: &Value| {
        Some(protocol::api::PlanEntry {
            content: entry.get("content")?.as_str()?.to_owned(),
            status: entry.get("status").and_then(Value::as_str).unwrap_or("pending").to_owned(),
            priority: entry.get("priority").and_then(Value::as_str).map(str::to_owned),
        })
    };
    entries.unwrap_or_default().iter().filter_map(entry).collect()
}

/// `session/update` kinds that a `session/load` replays to restore the conversation: they
/// are in our records already. Everything else that arrives during a load (available
/// commands, a session title, a mode) is news, and is forwarded.
pub(super) fn is_replayed_kind(kind: &str) -> bool {
    matches!(
        kind,
        "user_message_chunk"
            | "agent_message_chunk"
            | "agent_thought_chunk"
            | "tool_call"
            | "tool_call_update"
            | "plan"
    )
}
