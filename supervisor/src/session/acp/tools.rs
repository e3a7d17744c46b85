//! Reading ACP tool-call updates for the history: a tool's name, title, diffs and output
//! text, as agents send them (claude's placeholder titles, opencode's tool names); and
//! what a load's replay repeats of the recorded conversation.

use serde_json::Value;

/// What a tool's result is recorded as: its title, with its kind before a title that is
/// only a path (opencode titles an edit with the file: `edit src/main.rs`).
pub(super) fn tool_name(title: String, kind: String) -> String {
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
pub(super) fn tool_title(update: &Value) -> Option<&str> {
    update["title"].as_str().map(str::trim).filter(|title| !title.is_empty())
}

/// A diff content block as recorded: the file and its new text.
pub(super) fn diff_text(item: &Value) -> String {
    format!(
        "diff {}:\n{}",
        item["path"].as_str().unwrap_or("?"),
        item["newText"].as_str().unwrap_or_default()
    )
}

/// The diffs a tool call update shows, as recorded.
pub(super) fn tool_diffs(update: &Value) -> String {
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
pub(super) fn failed_tool_text(update: &Value, proposed: bool) -> String {
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
pub(super) fn tool_text(update: &Value) -> String {
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
    pub(super) fn is_replay(&self, kind: &str, update: &Value) -> bool {
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
}
