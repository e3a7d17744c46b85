//! The queue's decisions alone — tables, no actor.

use protocol::api::{PromptQueue, QueuedPrompt, TurnState};

use super::Queue;

fn queue(waiting: usize, halted: Option<&str>) -> Queue {
    let prompts = (1..=waiting)
        .map(|position| QueuedPrompt {
            prompt_id: format!("p{position}"),
            prompt: format!("prompt {position}"),
            position,
            queued_at: 0,
            steer_of: None,
        })
        .collect();
    let mut queue = Queue::default();
    queue.observe(&PromptQueue { prompts, halted: halted.map(str::to_owned) });
    queue
}

#[test]
fn a_prompt_is_queued_while_a_turn_runs_or_behind_prompts_about_to_run() {
    // (waiting, halted, turn running) → queued
    let table = [
        (0, None, false, false),
        (0, None, true, true),
        (2, None, false, true),
        (2, None, true, true),
        (2, Some("turn t failed"), false, false),
        (2, Some("turn t failed"), true, true),
    ];
    for (waiting, halted, running, queued) in table {
        let queue = queue(waiting, halted);
        assert_eq!(
            queue.queues(running),
            queued,
            "{waiting} waiting, {halted:?}, running {running}"
        );
    }
}

#[test]
fn the_head_is_due_only_when_idle_with_prompts_waiting_and_not_halted() {
    let table = [
        (0, None, true, false),
        (1, None, true, true),
        (1, None, false, false),
        (1, Some("turn t failed"), true, false),
    ];
    for (waiting, halted, idle, due) in table {
        assert_eq!(queue(waiting, halted).head_due(idle), due, "{waiting} {halted:?} {idle}");
    }
}

#[test]
fn a_failed_interrupted_or_cancelled_turn_halts_a_queue_with_prompts_once() {
    let table = [
        (TurnState::Completed, false, 1, None, false),
        (TurnState::Completed, true, 1, None, true),
        (TurnState::Failed, false, 1, None, true),
        (TurnState::Interrupted, false, 1, None, true),
        (TurnState::Failed, false, 0, None, false),
        (TurnState::Failed, false, 1, Some("already"), false),
    ];
    for (state, cancelled, waiting, halted, halts) in table {
        let queue = queue(waiting, halted);
        assert_eq!(
            queue.halts_after(state, cancelled),
            halts,
            "{state:?} cancelled {cancelled}, {waiting} waiting, {halted:?}"
        );
    }
}

/// A queue whose head is a steer's text (the turn `t` was cancelled for it).
fn steered(waiting: usize, halted: Option<&str>) -> Queue {
    let mut prompts = vec![QueuedPrompt {
        prompt_id: "s".into(),
        prompt: "steer".into(),
        position: 1,
        queued_at: 0,
        steer_of: Some("t".into()),
    }];
    prompts.extend((2..=waiting).map(|position| QueuedPrompt {
        prompt_id: format!("p{position}"),
        prompt: format!("prompt {position}"),
        position,
        queued_at: 0,
        steer_of: None,
    }));
    let mut queue = Queue::default();
    queue.observe(&PromptQueue { prompts, halted: halted.map(str::to_owned) });
    queue
}

#[test]
fn a_steer_first_runs_through_a_halt_and_its_cancel_halts_nothing() {
    // (waiting with the steer, halted) → due when idle
    for (waiting, halted, due) in
        [(1, None, true), (3, None, true), (3, Some("turn t failed"), true)]
    {
        assert_eq!(steered(waiting, halted).head_due(true), due, "{waiting} {halted:?}");
        assert!(!steered(waiting, halted).head_due(false), "never while busy");
    }
    // The turn cancelled for it (or failing meanwhile) leaves the prompts behind it to run.
    for (state, cancelled) in
        [(TurnState::Completed, true), (TurnState::Failed, false), (TurnState::Interrupted, false)]
    {
        assert!(!steered(3, None).halts_after(state, cancelled), "{state:?} {cancelled}");
    }
    // Once it ran, what is behind it is an ordinary queue again.
    assert!(queue(2, None).halts_after(TurnState::Completed, true));
}

#[test]
fn a_failed_launch_halts_a_queue_with_prompts_that_is_not_halted_already() {
    // (waiting, halted) → halts
    let table =
        [(0, None, false), (1, None, true), (3, None, true), (1, Some("turn t failed"), false)];
    for (waiting, halted, halts) in table {
        let queue = queue(waiting, halted);
        assert_eq!(queue.halts_after_failed_launch(), halts, "{waiting} waiting, {halted:?}");
        assert_eq!(queue.is_halted(), halted.is_some());
    }
}
