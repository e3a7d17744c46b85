//! Reading what agents send, without the actor: the agent's text straight from its raw
//! notification; a tool's name, title, diffs and output text as agents send them
//! (claude's placeholder titles, opencode's tool names); and what a load's replay repeats
//! of the recorded conversation, or lacks of it.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;

use crate::history::{self, EntryType, HistoryEntry};

/// `{"method": "session/update", "params": {"update": {"sessionUpdate": …, "content":
/// {"text": …}, "messageId": …}}}`, other members ignored.
#[derive(Deserialize)]
struct Notification<'a> {
    #[serde(borrow)]
    method: Cow<'a, str>,
    /// Present: a request, not this.
    #[serde(default)]
    id: Option<serde::de::IgnoredAny>,
    #[serde(borrow)]
    params: Params<'a>,
}

#[derive(Deserialize)]
struct Params<'a> {
    #[serde(borrow)]
    update: Update<'a>,
}

#[derive(Deserialize)]
struct Update<'a> {
    #[serde(borrow, rename = "sessionUpdate")]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    content: Content<'a>,
    #[serde(borrow, default, rename = "messageId")]
    message_id: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Content<'a> {
    #[serde(borrow)]
    text: Cow<'a, str>,
}

/// The text and message id of an `agent_message_chunk` notification, read straight into
/// the few fields it carries without building its JSON tree (the bulk of what agents
/// send); `None` for anything else.
pub(in crate::session) fn agent_text(raw: &str) -> Option<(String, Option<String>)> {
    let chunk = serde_json::from_str::<Notification<'_>>(raw).ok()?;
    let update = chunk.params.update;
    if chunk.id.is_some()
        || chunk.method != protocol::acp::method::SESSION_UPDATE
        || update.kind != "agent_message_chunk"
    {
        return None;
    }
    Some((update.content.text.into_owned(), update.message_id.map(Cow::into_owned)))
}

/// Whether a notification's `params` are about ACP session `session` (its `sessionId`).
pub(in crate::session) fn about_session(params: &Value, session: &str) -> bool {
    params.get("sessionId").and_then(Value::as_str) == Some(session)
}

/// What a tool's result is recorded as: its title, with its kind before a title that is
/// only a path (opencode titles an edit with the file: `edit src/main.rs`).
pub(in crate::session) fn tool_name(title: String, kind: String) -> String {
    let bare_path =
        !title.contains(char::is_whitespace) && (title.contains('/') || title.contains('.'));
    match (title.is_empty(), kind.is_empty()) {
        (true, true) => "tool".to_owned(),
        (true, false) => kind,
        (false, false) if bare_path && title != kind => format!("{kind} {title}"),
        _ => title,
    }
}

/// A tool call's title, when it has a non-empty one.
pub(in crate::session) fn tool_title(update: &Value) -> Option<&str> {
    update["title"].as_str().map(str::trim).filter(|title| !title.is_empty())
}

/// A diff content block as recorded: the file and its new text.
pub(in crate::session) fn diff_text(item: &Value) -> String {
    format!(
        "diff {}:\n{}",
        item["path"].as_str().unwrap_or("?"),
        item["newText"].as_str().unwrap_or_default()
    )
}

/// The diffs a tool call update shows, as recorded.
pub(in crate::session) fn tool_diffs(update: &Value) -> String {
    let content = update.get("content").and_then(Value::as_array);
    let diffs: Vec<String> = content
        .into_iter()
        .flatten()
        .filter(|item| item["type"] == "diff")
        .map(diff_text)
        .collect();
    diffs.join("\n")
}

/// What a failed (or denied) tool call's final update says: its text, without the diffs
/// it proposed (nothing was changed), and a line saying that a change was not made.
pub(in crate::session) fn failed_tool_text(update: &Value, proposed: bool) -> String {
    let proposed = proposed || !tool_diffs(update).is_empty();
    let mut text = content_text(update, false);
    if proposed {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str("[the change it proposed was not made]");
    }
    text
}

/// What a tool call's final update says it did: its content blocks (text, and each diff as
/// the file and its new text), else its raw output.
pub(in crate::session) fn tool_text(update: &Value) -> String {
    content_text(update, true)
}

fn content_text(update: &Value, with_diffs: bool) -> String {
    let blocks: Vec<String> = update
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|item| with_diffs || item["type"] != "diff")
        .filter_map(|item| match item["type"].as_str() {
            Some("diff") => Some(diff_text(item)),
            Some("terminal") => {
                Some(format!("terminal {}", item["terminalId"].as_str().unwrap_or("?")))
            }
            _ => item["content"]["text"].as_str().map(str::to_owned),
        })
        .collect();
    if !blocks.is_empty() {
        return blocks.join("\n");
    }
    match update.get("rawOutput") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

/// The recorded conversation a `session/load` replays. After the next prompt reached the
/// agent, updates that repeat it — a user message, an agent message recorded whole, a
/// known tool call — are still the replay's; the first update that does not is the turn's
/// own, and ends the matching.
#[derive(Debug, Default)]
pub(in crate::session) struct KnownConversation {
    pub(super) texts: std::collections::HashSet<String>,
    pub(super) tool_calls: std::collections::HashSet<String>,
}

impl KnownConversation {
    /// The recorded conversation's messages and tool call ids (the history's newest
    /// entries): what a `session/load` may replay.
    pub(in crate::session) fn of(entries: Vec<HistoryEntry>) -> KnownConversation {
        let mut known = KnownConversation::default();
        for entry in entries {
            match entry.kind {
                EntryType::UserMessage | EntryType::AgentMessage => {
                    // As the agent has it: without Tether's note on a cut-off reply.
                    let text = history::without_cut_off_notes(&entry.content);
                    known.texts.insert(text.trim().to_owned());
                }
                EntryType::ToolCall | EntryType::ToolResult => {
                    known.tool_calls.extend(entry.wire.tool_call_id);
                }
                // A replayed plan is dropped as a replay by its kind alone.
                EntryType::Plan => {}
            }
        }
        known
    }

    pub(in crate::session) fn is_replay(&self, kind: &str, update: &Value) -> bool {
        let text = update["content"]["text"].as_str().map(str::trim);
        match kind {
            // A live turn never streams the user's own message back.
            "user_message_chunk" => true,
            "agent_message_chunk" => text.is_some_and(|text| self.texts.contains(text)),
            "tool_call" | "tool_call_update" => {
                update["toolCallId"].as_str().is_some_and(|id| self.tool_calls.contains(id))
            }
            _ => false,
        }
    }
}

/// What a load's replay (the messages' text, `replayed`) lacks of the newest messages
/// recorded (`entries`, the history's tail): the seq of the first it lacks and how many,
/// when it had an older one and not those after it. A replay that holds none of the
/// recent ones cannot be told by.
pub(in crate::session) fn lacking(
    entries: &[HistoryEntry],
    replayed: &str,
) -> Option<(u64, usize)> {
    // Held as the agent has them: a cut-off reply without Tether's note on it.
    let messages: Vec<(u64, String)> = entries
        .iter()
        .filter(|entry| matches!(entry.kind, EntryType::UserMessage | EntryType::AgentMessage))
        .map(|entry| (entry.seq, history::without_cut_off_notes(&entry.content)))
        .filter(|(_, text)| !text.trim().is_empty())
        .collect();
    let last_had = messages.iter().rposition(|(_, text)| replayed.contains(text.trim()))?;
    let &(first_missing, _) = messages.get(last_had + 1)?;
    Some((first_missing, messages.len() - last_had - 1))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A denied write was recorded as the diff it proposed, as if it had been made.
    #[test]
    fn a_failed_edit_records_no_diff_and_says_its_change_was_not_made() {
        let update = json!({"status": "failed", "content": [
            {"type": "diff", "path": "/w/a.txt", "oldText": "a", "newText": "b"},
            {"type": "content", "content": {"type": "text", "text": "permission denied"}},
        ]});
        let text = failed_tool_text(&update, false);
        assert_eq!(text, "permission denied\n[the change it proposed was not made]");
        assert!(tool_text(&update).contains("diff /w/a.txt:\nb"), "a completed one keeps it");
        // The diff came in an earlier update; the failed one says nothing else.
        let bare = json!({"status": "failed"});
        assert_eq!(failed_tool_text(&bare, true), "[the change it proposed was not made]");
        assert_eq!(failed_tool_text(&bare, false), "");
    }

    fn entry(seq: u64, kind: &str, content: &str, tool_call_id: Option<&str>) -> HistoryEntry {
        serde_json::from_value(json!({"seq": seq, "at": 0, "type": kind, "role": "user",
            "content": content, "tool_call_id": tool_call_id}))
        .unwrap()
    }

    #[test]
    fn only_an_agent_message_chunk_notification_is_read_as_the_agents_text() {
        let chunk = |kind: &str| {
            json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s",
                "update": {"sessionUpdate": kind, "content": {"type": "text", "text": "hé\n"},
                "messageId": "m1"}}})
            .to_string()
        };
        let text = agent_text(&chunk("agent_message_chunk"));
        assert_eq!(text, Some(("hé\n".to_owned(), Some("m1".to_owned()))));
        assert_eq!(agent_text(&chunk("agent_thought_chunk")), None);
        let request = json!({"jsonrpc": "2.0", "id": 1, "method": "session/update", "params":
            {"update": {"sessionUpdate": "agent_message_chunk", "content": {"text": "x"}}}});
        assert_eq!(agent_text(&request.to_string()), None, "a request is not a notification");
        let no_text = json!({"jsonrpc": "2.0", "method": "session/update", "params": {"update":
            {"sessionUpdate": "agent_message_chunk", "content": {"type": "image"}}}});
        assert_eq!(agent_text(&no_text.to_string()), None, "left to the general path");
        assert_eq!(agent_text("{\"method\": "), None);
    }

    #[test]
    fn a_notification_is_about_the_session_it_names() {
        let update = json!({"sessionId": "primed", "update": {"sessionUpdate": "plan"}});
        assert!(about_session(&update, "primed"));
        assert!(!about_session(&update, "s1"), "another session's");
        assert!(!about_session(&json!({"update": {}}), "primed"), "one naming none");
    }

    #[test]
    fn a_replay_is_known_by_its_messages_and_tool_calls_and_told_what_it_lacks() {
        let entries = vec![
            entry(1, "user_message", "fix the bug", None),
            entry(2, "tool_call", "edit", Some("call-1")),
            entry(3, "agent_message", "done", None),
            entry(4, "user_message", "and the test", None),
            entry(5, "agent_message", "added", None),
        ];
        let known = KnownConversation::of(entries.clone());
        assert!(known.is_replay("agent_message_chunk", &json!({"content": {"text": " done "}})));
        assert!(!known.is_replay("agent_message_chunk", &json!({"content": {"text": "new"}})));
        assert!(known.is_replay("tool_call", &json!({"toolCallId": "call-1"})));
        // The agent came back without the last exchange: it lacks two, from seq 4.
        assert_eq!(lacking(&entries, "fix the bug done"), Some((4, 2)));
        assert_eq!(lacking(&entries, "fix the bug done and the test added"), None, "all of it");
        assert_eq!(lacking(&entries, "something else"), None, "nothing to tell it by");
    }
}
