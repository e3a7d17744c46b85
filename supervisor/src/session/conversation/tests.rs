//! The conversation alone: request ids, the agent's stderr, a turn's end, the plan.

use protocol::api::{PlanEntry, TimelineEvent};

use super::{Conversation, MAX_QUIET_STDERR, Replay, STDERR_IN_ERROR, Turn};

fn turn() -> Turn {
    Turn {
        id: "t1".into(),
        cancel_at: None,
        deadline: None,
        usage: crate::store::TurnUsage::default(),
        heard: false,
    }
}

#[test]
fn request_ids_are_new_each_time_and_ahead_of_a_restarts_earlier_ones() {
    let mut conversation = Conversation::new();
    let first = conversation.take_request_id();
    assert_eq!(conversation.take_request_id(), first + 1);
    assert!(first >= crate::store::now_ms() * 1000 - 1_000_000, "millisecond-based: {first}");
}

#[test]
fn the_agents_recent_stderr_is_bounded_and_a_new_agent_forgets_it() {
    let mut conversation = Conversation::new();
    let line = "x".repeat(100);
    for _ in 0..100 {
        conversation.stderr_line(&line);
    }
    let kept = conversation.recent_stderr.len();
    assert!((STDERR_IN_ERROR..=2 * STDERR_IN_ERROR).contains(&kept), "{kept} bytes kept");
    conversation.quiet_again(false);
    assert!(!conversation.recent_stderr.is_empty(), "a turn keeps it");
    conversation.quiet_again(true);
    assert!(conversation.recent_stderr.is_empty(), "a new agent does not");
}

#[test]
fn stderr_is_shown_while_the_agent_is_quiet_at_most_so_often() {
    let mut conversation = Conversation::new();
    assert!(!conversation.show_quiet_stderr(false), "no turn, not starting");
    conversation.turn = Some(turn());
    let shown = (0..30).filter(|_| conversation.show_quiet_stderr(false)).count();
    assert_eq!(shown, MAX_QUIET_STDERR as usize, "per turn");
    conversation.quiet_again(false);
    conversation.turn.as_mut().expect("a turn").heard = true;
    assert!(!conversation.show_quiet_stderr(false), "the turn heard from its agent");
    assert!(conversation.show_quiet_stderr(true), "starting: shown");
}

#[test]
fn a_starting_agents_stderr_is_counted_per_execution() {
    let mut conversation = Conversation::new();
    let shown = |c: &mut Conversation, generation| {
        (0..30).filter(|_| c.show_starting_stderr(generation)).count()
    };
    assert_eq!(shown(&mut conversation, 1), MAX_QUIET_STDERR as usize);
    assert_eq!(shown(&mut conversation, 1), 0, "the same execution's count stands");
    assert_eq!(shown(&mut conversation, 2), MAX_QUIET_STDERR as usize, "another's begins anew");
}

#[test]
fn a_turns_end_closes_its_tool_calls_and_a_trailing_replay() {
    let mut conversation = Conversation::new();
    assert!(conversation.end_turn().is_none(), "no turn: nothing ends");
    conversation.turn = Some(turn());
    conversation.tool_titles.insert("call".into(), Default::default());
    conversation.replay = Replay::Trailing(Box::default());
    assert_eq!(conversation.end_turn().map(|turn| turn.id), Some("t1".into()));
    assert!(conversation.tool_titles.is_empty());
    assert!(matches!(conversation.replay, Replay::Off));

    conversation.turn = Some(turn());
    conversation.replay = Replay::Loading(Some(Box::default()));
    conversation.end_turn();
    assert!(matches!(conversation.replay, Replay::Loading(None)), "a load lasts to its prompt");
}

#[test]
fn a_plan_goes_on_the_timeline_once_per_change() {
    let mut conversation = Conversation::new();
    assert!(conversation.take_plan().is_none());
    conversation.plan_reported(Vec::<PlanEntry>::new());
    assert!(conversation.take_plan().is_some());
    assert!(conversation.take_plan().is_none(), "taken");
    let row = TimelineEvent::Plan { total: 2, done: 1, in_progress: 1, current: None };
    assert!(conversation.plan_is_news(&row));
    conversation.plan_written(row.clone());
    assert!(!conversation.plan_is_news(&row), "the same again is no news");
    let next = TimelineEvent::Plan { total: 2, done: 2, in_progress: 0, current: None };
    assert!(conversation.plan_is_news(&next));
}
