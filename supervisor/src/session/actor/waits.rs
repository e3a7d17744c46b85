//! Who and what waits for a boundary of the session: resumes waiting for it to open, a
//! pause waiting for the running turn to end, and the idle park's deadline. It keeps them
//! and answers them; when a boundary comes is the actor's to say.

use std::time::Duration;

use tokio::time::Instant;

use super::{PendingPause, Reply, ResumeOutcome, SessionError};

/// Who and what waits for a boundary.
#[derive(Default)]
pub(in crate::session) struct Waits {
    /// A pause waiting for the running turn (or the launch in flight) to end.
    pub(in crate::session) pause: Option<PendingPause>,
    /// Everyone waiting for the session to open (resumes, and resumes of a session that was
    /// starting anyway).
    waiters: Vec<Reply<ResumeOutcome>>,
    /// When the session is parked if its agent stays idle until then.
    idle_at: Option<Instant>,
}

impl Waits {
    /// Someone waits for the session to open.
    pub(in crate::session) fn wait_for_open(&mut self, reply: Reply<ResumeOutcome>) {
        self.waiters.push(reply);
    }

    /// Whether anyone waits for the session to open (a resume is due).
    pub(in crate::session) fn anyone_waits_for_open(&self) -> bool {
        !self.waiters.is_empty()
    }

    /// The session opened, or will not: everyone waiting gets `answer`.
    pub(in crate::session) fn opened(
        &mut self,
        answer: impl Fn() -> Result<ResumeOutcome, SessionError>,
    ) {
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send(answer());
        }
    }

    /// The idle deadline after a command, report or event: armed `timeout` from `now` when
    /// the agent just became `idle`, kept while it stays idle, disarmed when it is not.
    pub(in crate::session) fn arm_idle(
        &mut self,
        idle: bool,
        timeout: Option<Duration>,
        now: Instant,
    ) {
        if !idle {
            self.idle_at = None;
        } else if self.idle_at.is_none() {
            self.idle_at = timeout.map(|timeout| now + timeout);
        }
    }

    /// Whether the idle deadline has passed at `now`; it is disarmed then.
    pub(in crate::session) fn idle_due(&mut self, now: Instant) -> bool {
        let due = self.idle_at.is_some_and(|at| at <= now);
        if due {
            self.idle_at = None;
        }
        due
    }

    /// The park is looked at again `timeout` from `now` (a question waits for a person, or
    /// the store could not say).
    pub(in crate::session) fn idle_again(&mut self, now: Instant, timeout: Duration) {
        self.idle_at = Some(now + timeout);
    }

    /// The nearest deadline of what waits: a pause's force, or the idle park.
    pub(in crate::session) fn next_deadline(&self) -> Option<Instant> {
        let force = self.pause.as_ref().and_then(|pause| pause.force_at);
        force.into_iter().chain(self.idle_at).min()
    }
}

#[cfg(test)]
mod tests;
