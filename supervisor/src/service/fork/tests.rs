//! What a fork keeps of the original's history and which turn it keeps last.

use protocol::api::{EntryType, TurnState};

use super::{history_through, pick_turn};
use crate::history::HistoryEntry;
use crate::ids::TurnId;
use crate::store::TurnRow;

fn entry(seq: u64, kind: EntryType, content: &str, message_id: Option<&str>) -> HistoryEntry {
    HistoryEntry {
        wire: protocol::api::HistoryEntry {
            seq,
            at: 0,
            kind,
            role: String::new(),
            content: content.into(),
            tool_name: None,
            tool_call_id: None,
            tool_status: None,
            message_id: message_id.map(str::to_owned),
            plan: None,
            rewound: false,
        },
        agent_seq: Some(seq * 10),
        generation: Some(3),
    }
}

#[test]
fn a_fork_keeps_the_history_through_its_turn_and_its_steers_renumbered_without_marks() {
    let entries = [
        entry(1, EntryType::UserMessage, "first", Some("t1")),
        entry(2, EntryType::AgentMessage, "answer one", None),
        entry(3, EntryType::UserMessage, "second", Some("t2")),
        entry(4, EntryType::ToolCall, "Edit a.rs", None),
        entry(5, EntryType::UserMessage, "a steer", Some("t2#steer-x")),
        entry(6, EntryType::AgentMessage, "answer two", None),
        entry(7, EntryType::UserMessage, "third", Some("t3")),
        entry(8, EntryType::AgentMessage, "answer three", None),
    ];
    let kept = history_through(&entries, &TurnId::new("t2")).expect("t2 is there");
    let contents: Vec<&str> = kept.iter().map(|entry| entry.content.as_str()).collect();
    assert_eq!(contents, ["first", "answer one", "second", "Edit a.rs", "a steer", "answer two"]);
    assert!(kept.iter().zip(1..).all(|(entry, seq)| entry.seq == seq));
    assert!(kept.iter().all(|entry| entry.agent_seq.is_none() && entry.generation.is_none()));
    let all = history_through(&entries, &TurnId::new("t3")).expect("t3 is there");
    assert_eq!(all.len(), entries.len());
    assert!(history_through(&entries, &TurnId::new("t9")).is_none());
}

fn turn(id: &str, ended: bool) -> TurnRow {
    TurnRow {
        id: TurnId::new(id),
        execution_id: "e".into(),
        state: if ended { TurnState::Completed } else { TurnState::Running },
        stop_reason: None,
        error: None,
        started_at: 1,
        ended_at: ended.then_some(2),
        total_tokens: 0,
        cost: None,
        retry_of: None,
        rewound_by: None,
        prompt: None,
        event_seq: None,
    }
}

#[test]
fn the_newest_turn_is_forked_unless_one_is_named_and_a_running_one_never() {
    let turns = [turn("t1", true), turn("t2", true)];
    assert_eq!(pick_turn(&turns, None).unwrap().id.as_str(), "t2");
    assert_eq!(pick_turn(&turns, Some(&TurnId::new("t1"))).unwrap().id.as_str(), "t1");
    assert!(matches!(
        pick_turn(&turns, Some(&TurnId::new("t9"))),
        Err(super::ServiceError::NotFound(_))
    ));
    assert!(matches!(pick_turn(&[], None), Err(super::ServiceError::InvalidState(_))));
    let running = [turn("t1", true), turn("t2", false)];
    assert!(matches!(pick_turn(&running, None), Err(super::ServiceError::InvalidState(_))));
    assert!(pick_turn(&running, Some(&TurnId::new("t1"))).is_ok());
}
