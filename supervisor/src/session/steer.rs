//! What a steer's turn tells an agent that could not take the steer mid-turn: the turn
//! cancelled for it is gone from the agent's point of view as a finished piece of work, so
//! the steering text goes with a line saying what that turn had done (its tool calls and
//! the end of what it wrote), read from the session's history. Pure: entries in, text out.

use protocol::api::EntryType;

use crate::history::{HistoryEntry, excerpt, excerpt_tail};
use crate::ids::TurnId;

/// How many of the cancelled turn's tool calls are named (the rest are counted).
const NAMED_CALLS: usize = 8;
/// How much of the end of what it wrote is quoted, in characters.
const QUOTED_CHARS: usize = 400;
/// How long a tool call's title may be in the line, in characters.
const TITLE_CHARS: usize = 80;

/// The prompt sent for a steer of `steer_of`: the line about that turn, then `text`.
/// `entries` is the history's tail (the turn's user message among them, or its work is
/// said to be unknown).
pub(super) fn prompt(entries: &[HistoryEntry], steer_of: &TurnId, text: &str) -> String {
    format!("{}\n\n{text}", interrupted(entries, steer_of))
}

/// The line about the turn `turn_id`, cancelled for a steer.
pub(super) fn interrupted(entries: &[HistoryEntry], turn_id: &TurnId) -> String {
    let turn_id = turn_id.as_str();
    const HEAD: &str = "[Tether: the user interrupted your previous turn to steer you";
    let Some(start) = entries.iter().position(|entry| {
        entry.kind == EntryType::UserMessage && entry.message_id.as_deref() == Some(turn_id)
    }) else {
        return format!("{HEAD}; what that turn had done is not known here. Their message:]");
    };
    // The turn's entries: up to the next prompt of the session (its own steers, `TURN#…`,
    // are within it).
    let turn: Vec<&HistoryEntry> = entries[start + 1..]
        .iter()
        .take_while(|entry| {
            entry.kind != EntryType::UserMessage
                || entry.message_id.as_deref().is_some_and(|id| id.starts_with(turn_id))
        })
        .collect();
    let calls = tool_calls(&turn);
    let wrote: String = turn
        .iter()
        .filter(|entry| entry.kind == EntryType::AgentMessage)
        .map(|entry| entry.content.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let mut done = Vec::new();
    if !calls.is_empty() {
        let named: Vec<String> = calls.iter().take(NAMED_CALLS).map(ToString::to_string).collect();
        let more = calls.len().saturating_sub(NAMED_CALLS);
        let more = if more > 0 { format!(" and {more} more") } else { String::new() };
        let plural = if calls.len() == 1 { "" } else { "s" };
        done.push(format!("it ran {} tool call{plural} ({}{more})", calls.len(), named.join("; ")));
    }
    if !wrote.trim().is_empty() {
        let quoted = excerpt_tail(wrote.trim(), QUOTED_CHARS);
        let cut = if quoted.len() < wrote.trim().len() { "…" } else { "" };
        done.push(format!("it had written, ending: \"{cut}{quoted}\""));
    }
    if done.is_empty() {
        return format!("{HEAD} before it had run any tool or written anything. Their message:]");
    }
    format!("{HEAD}. Before it was cancelled, {}. Their message:]", done.join("; "))
}

/// One tool call of the turn, by its last known status.
struct Call<'a> {
    title: &'a str,
    status: Option<&'a str>,
}

impl std::fmt::Display for Call<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let title = excerpt(self.title, TITLE_CHARS);
        match self.status {
            Some(status) => write!(f, "{title}: {status}"),
            None => f.write_str(&title),
        }
    }
}

/// The turn's tool calls in the order they started, each with the newest status its
/// entries give (a result's over the call's own).
fn tool_calls<'a>(turn: &[&'a HistoryEntry]) -> Vec<Call<'a>> {
    let mut calls: Vec<(Option<&str>, Call<'a>)> = Vec::new();
    for entry in turn {
        let status = entry.tool_status.as_deref();
        match entry.kind {
            EntryType::ToolCall => {
                let title = entry.tool_name.as_deref().unwrap_or(entry.content.as_str());
                calls.push((entry.tool_call_id.as_deref(), Call { title, status }));
            }
            EntryType::ToolResult => {
                let id = entry.tool_call_id.as_deref();
                if let Some((_, call)) =
                    calls.iter_mut().rev().find(|(of, _)| id.is_some() && *of == id)
                {
                    call.status = status.or(call.status);
                }
            }
            _ => {}
        }
    }
    calls.into_iter().map(|(_, call)| call).collect()
}

#[cfg(test)]
mod tests;
