//! The line a steer's turn starts with, from history entries alone.

use protocol::api::EntryType;

use super::{interrupted, prompt};
use crate::history::HistoryEntry;
use crate::ids::TurnId;

fn entry(
    kind: EntryType,
    content: &str,
    tool: Option<(&str, &str)>,
    message_id: Option<&str>,
) -> HistoryEntry {
    HistoryEntry {
        wire: protocol::api::HistoryEntry {
            seq: 0,
            at: 0,
            kind,
            role: String::new(),
            content: content.into(),
            tool_name: tool.map(|_| content.into()),
            tool_call_id: tool.map(|(id, _)| id.into()),
            tool_status: tool.map(|(_, status)| status.into()),
            message_id: message_id.map(str::to_owned),
            plan: None,
            rewound: false,
        },
        agent_seq: None,
        generation: None,
    }
}

fn user(turn: &str) -> HistoryEntry {
    entry(EntryType::UserMessage, "do it", None, Some(turn))
}

#[test]
fn the_line_names_the_cancelled_turns_tool_calls_by_their_last_status_and_its_last_words() {
    let entries = [
        user("t0"),
        entry(EntryType::AgentMessage, "an earlier turn's answer", None, None),
        user("t1"),
        entry(EntryType::AgentMessage, "Looking at the tests.", None, None),
        entry(EntryType::ToolCall, "Read src/lib.rs", Some(("c1", "pending")), None),
        entry(EntryType::ToolResult, "Read src/lib.rs", Some(("c1", "completed")), None),
        entry(EntryType::ToolCall, "Run cargo test", Some(("c2", "in_progress")), None),
        entry(EntryType::AgentMessage, "Now fixing the parser", None, None),
    ];
    let line = interrupted(&entries, &TurnId::new("t1"));
    assert!(
        line.contains(
            "it ran 2 tool calls (Read src/lib.rs: completed; Run cargo test: in_progress)"
        ),
        "{line}"
    );
    assert!(line.contains("\"Looking at the tests.\nNow fixing the parser\""), "{line}");
    assert!(!line.contains("earlier turn"), "only the cancelled turn's work: {line}");
    let sent = prompt(&entries, &TurnId::new("t1"), "use the other parser");
    assert!(sent.starts_with(&line) && sent.ends_with("\n\nuse the other parser"), "{sent}");
}

#[test]
fn a_turn_that_did_nothing_or_is_not_in_the_tail_is_said_so() {
    let nothing = interrupted(&[user("t1")], &TurnId::new("t1"));
    assert!(nothing.contains("before it had run any tool or written anything"), "{nothing}");
    // A later prompt's entries are not the turn's.
    let later = [user("t1"), user("t2"), entry(EntryType::AgentMessage, "t2's", None, None)];
    assert!(interrupted(&later, &TurnId::new("t1")).contains("before it had run any tool"));
    let unknown = interrupted(&[user("t0")], &TurnId::new("t1"));
    assert!(unknown.contains("what that turn had done is not known"), "{unknown}");
}

#[test]
fn many_calls_are_counted_and_long_text_is_cut_to_its_end() {
    let mut entries = vec![user("t1")];
    for n in 0..11 {
        entries.push(entry(
            EntryType::ToolCall,
            &format!("call {n}"),
            Some((&format!("c{n}"), "completed")),
            None,
        ));
    }
    let long = format!("{}THE END", "x".repeat(2_000));
    entries.push(entry(EntryType::AgentMessage, &long, None, None));
    let line = interrupted(&entries, &TurnId::new("t1"));
    assert!(line.contains("it ran 11 tool calls (call 0: completed;"), "{line}");
    assert!(line.contains("call 7: completed and 3 more)"), "{line}");
    assert!(line.contains("\"…") && line.contains("THE END\""), "{line}");
    assert!(line.chars().count() < 1_200, "bounded: {}", line.chars().count());
}
