//! The session's prompt queue as the actor holds it: how many prompts wait and whether the
//! queue is halted. It decides, without effects, whether a new prompt is queued, whether
//! the queue's head is due, and whether a turn's end halts the queue; the prompts
//! themselves are in the store, which takes the head into its turn in one transaction.

use protocol::api::{PromptQueue, TurnState};

/// What the actor knows of its session's queue (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Queue {
    waiting: usize,
    halted: Option<String>,
    /// The head is a steer's text (a turn was cancelled for it): it runs whatever halts
    /// the queue, and the cancel it follows halts nothing.
    steer_first: bool,
}

impl Queue {
    /// Takes the stored queue's shape (after a change, or at the actor's start).
    pub(super) fn observe(&mut self, queue: &PromptQueue) {
        self.waiting = queue.prompts.len();
        self.halted = queue.halted.clone();
        self.steer_first = queue.prompts.first().is_some_and(|head| head.steer_of.is_some());
    }

    /// Whether a new prompt waits in the queue rather than starting a turn: a turn runs,
    /// or prompts queued before it are about to run (a halted queue does not hold a person's
    /// prompt back).
    pub(super) fn queues(&self, turn_running: bool) -> bool {
        turn_running || (self.waiting > 0 && self.halted.is_none())
    }

    /// Whether the queue is halted (nothing in it runs by itself).
    pub(super) fn is_halted(&self) -> bool {
        self.halted.is_some()
    }

    /// Whether the queue's head starts now, the session being `idle` (open, no turn, no
    /// pause waiting, nothing catching up or stalled). A steer's runs even when the queue
    /// is halted (the person asked for it while watching).
    pub(super) fn head_due(&self, idle: bool) -> bool {
        idle && self.waiting > 0 && (self.halted.is_none() || self.steer_first)
    }

    /// Whether a launch that failed (or whose agent will not take the session's settings
    /// again) halts the queue: prompts wait (sent to bring the agent back, or queued before
    /// it went) and would otherwise run at some later launch, or wait on a choice, with
    /// nobody having said to go on after the failure.
    pub(super) fn halts_after_failed_launch(&self) -> bool {
        self.waiting > 0 && self.halted.is_none()
    }

    /// Whether a turn that ended so halts the queue: it failed, was interrupted or
    /// cancelled (`cancelled`), and prompts wait that were written for it to succeed —
    /// unless a steer waits first (the turn was cancelled for it, and the prompts behind
    /// it were written to follow it).
    pub(super) fn halts_after(&self, state: TurnState, cancelled: bool) -> bool {
        let failed = matches!(state, TurnState::Failed | TurnState::Interrupted) || cancelled;
        failed && self.waiting > 0 && self.halted.is_none() && !self.steer_first
    }
}

#[cfg(test)]
mod tests;
