//! A session's record: its event log and the rows of its open work. The only writer of the
//! event log, used by the session's actor and, for a session without one, by recovery —
//! so what an event carries (its marks) and in which order events and rows change are
//! decided in one place.
//!
//! The order rule: events are published **before** the store rows they speak of change.
//! A kill in between leaves the rows as they were, so the next start publishes again
//! (rather than never); a subscriber may see an end twice, never not at all.

use crate::ids::SessionId;
use std::sync::Arc;

use agentctl::spool::{Spool, SpoolError};

use crate::events::{SessionEvent, SessionEventKind};
use crate::history;
use protocol::api::SnapshotTrigger;

use crate::store::{PausedRecord, SessionState, Store, StoreError, TurnState};

/// What can fail while recording.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The event log could not be written.
    #[error("the session's event log: {0}")]
    Log(#[from] SpoolError),
    /// The store could not be read or written.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The marks published events carry: how far into which execution's agentctl events the
/// session's records had got when they were written (see `durability.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mark {
    /// The agentctl seq handled (`None`: no agent event caused these events).
    pub agent_seq: Option<u64>,
    /// The execution whose seqs `agent_seq` counts.
    pub generation: Option<i64>,
}

/// A turn's end: how it ended, and the session's state it leads to when that changes
/// (`then`: the state, its error, the task's state).
#[derive(Debug, Clone)]
pub struct TurnEnd {
    /// The turn.
    pub turn_id: crate::ids::TurnId,
    /// How it ended.
    pub state: TurnState,
    /// The agent's stop reason, when it answered.
    pub stop_reason: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
    /// The session's state after it, its error and the task's state, when that changes.
    pub then: Option<(SessionState, Option<String>, Option<&'static str>)>,
}

impl TurnEnd {
    /// The events that say it, in their order: the turn's end, then the state it leads to.
    pub fn events(&self) -> Vec<SessionEventKind> {
        let ended = SessionEventKind::TurnEnded {
            turn_id: self.turn_id.to_string(),
            state: self.state,
            stop_reason: self.stop_reason.clone(),
            error: self.error.clone(),
        };
        let then = self.then.as_ref().map(|(state, error, _)| SessionEventKind::State {
            state: *state,
            error: error.clone(),
        });
        std::iter::once(ended).chain(then).collect()
    }
}

/// One session's event log and open-work rows.
#[derive(Clone)]
pub struct SessionRecord {
    session_id: SessionId,
    store: Store,
    events: Arc<Spool<SessionEvent>>,
}

impl SessionRecord {
    pub fn new(
        session_id: SessionId,
        store: Store,
        events: Arc<Spool<SessionEvent>>,
    ) -> SessionRecord {
        SessionRecord { session_id, store, events }
    }

    /// The session whose record this is.
    pub fn session_id(&self) -> &SessionId {
        &self.session_id
    }

    /// The event log, for its readers and its upkeep (sync, release, retention).
    pub fn log(&self) -> &Arc<Spool<SessionEvent>> {
        &self.events
    }

    /// Appends `kinds` to the event log in one write (a batch a kill leaves unfinished is
    /// cut whole when the log is reopened), each carrying `mark`.
    pub fn publish(&self, kinds: Vec<SessionEventKind>, mark: Mark) -> Result<(), SpoolError> {
        if kinds.is_empty() {
            return Ok(());
        }
        let Mark { agent_seq, generation } = mark;
        self.events.append_all(kinds, |seq, at, kind| SessionEvent {
            seq,
            at,
            agent_seq,
            generation,
            batch_last: None,
            kind,
        })?;
        Ok(())
    }

    /// The newest agentctl seq of execution `generation` whose events the log holds
    /// (0: none of it, or the log cannot be read).
    pub fn events_mark(&self, generation: i64) -> u64 {
        self.events
            .last_entry()
            .ok()
            .flatten()
            .filter(|event| history::same_execution(event.generation, generation))
            .and_then(|event| event.agent_seq)
            .unwrap_or(0)
    }

    /// Changes the session's state: `state` published, then the row (and the task's state
    /// with it, when given). `between` names a fault point reached in between (tests kill
    /// the supervisor there). A failed publish still writes the row, and is returned after
    /// it (the state is the store's either way; the caller says the log failed).
    pub async fn set_state(
        &self,
        state: SessionState,
        error: Option<String>,
        task: Option<&'static str>,
        mark: Mark,
        between: Option<&'static str>,
    ) -> Result<(), RecordError> {
        let published =
            self.publish(vec![SessionEventKind::State { state, error: error.clone() }], mark);
        if let Some(point) = between {
            agentctl::fault::point(point);
        }
        let high = self.events.last_seq();
        self.store.set_session_state(self.session_id.clone(), state, error, task, high).await?;
        Ok(published?)
    }

    /// Ends a turn in the store — its row, output and usage, and the session's state — in
    /// one write, once [`TurnEnd::events`] are in the log (the caller publishes them with
    /// whatever else it has unwritten): once the row says the turn ended, a replay no
    /// longer ends it, so everything it publishes must be out first.
    pub async fn end_turn(
        &self,
        end: TurnEnd,
        output: Option<crate::store::TurnOutput>,
        usage: crate::store::TurnUsage,
    ) -> Result<(), StoreError> {
        let TurnEnd { turn_id, state, stop_reason, error, then } = end;
        let high = self.events.last_seq();
        let ended = (state, stop_reason, error);
        self.store.end_turn_then(turn_id, ended, then, high, output, Some(usage)).await
    }

    /// The agent that asked is gone: each open question of the session is resolved
    /// `cancelled`, published before its row goes. Returns how many there were.
    pub async fn void_questions(&self, mark: Mark) -> Result<usize, RecordError> {
        let kinds = self.question_ends().await?;
        self.publish(kinds, mark)?;
        Ok(self.store.clear_pending(self.session_id.clone()).await?)
    }

    /// Like [`Self::void_questions`], but the questions in `answered` stay: their answers
    /// went to the agent, and agentctl's confirmation resolves them. Returns how many were
    /// voided.
    pub async fn void_questions_but(
        &self,
        answered: &std::collections::HashSet<String>,
        mark: Mark,
    ) -> Result<usize, RecordError> {
        let kinds: Vec<SessionEventKind> = self
            .question_ends()
            .await?
            .into_iter()
            .filter(|kind| {
                !matches!(kind, SessionEventKind::PermissionResolved { request_id, .. }
                    if answered.contains(request_id))
            })
            .collect();
        self.publish(kinds.clone(), mark)?;
        for kind in &kinds {
            if let SessionEventKind::PermissionResolved { request_id, .. } = kind {
                self.store.delete_pending(self.session_id.clone(), request_id.clone()).await?;
            }
        }
        Ok(kinds.len())
    }

    /// Ends the open work of a session whose agent is gone: each question void, each
    /// running turn `interrupted` with `reason`, published (with `then` after them) before
    /// the rows change. Returns how many turns and questions there were.
    pub async fn void_open_work(
        &self,
        reason: &str,
        then: Vec<SessionEventKind>,
        mark: Mark,
    ) -> Result<(usize, usize), RecordError> {
        let mut kinds = self.question_ends().await?;
        for turn_id in self.store.running_turns(self.session_id.clone()).await? {
            kinds.push(SessionEventKind::TurnEnded {
                turn_id,
                state: TurnState::Interrupted,
                stop_reason: None,
                error: Some(reason.into()),
            });
        }
        kinds.extend(then);
        self.publish(kinds, mark)?;
        let interrupted =
            self.store.interrupt_turns(self.session_id.clone(), reason.into()).await?.len();
        let cancelled = self.store.clear_pending(self.session_id.clone()).await?;
        Ok((interrupted, cancelled))
    }

    /// Pauses the session, its agent gone: a snapshot of the workspace as the agent left
    /// it (`snapshot`; none, and said, when it cannot be taken), then `snapshot_taken`,
    /// `state` `PAUSED` and `paused` published, then the row. `trigger` is what paused it
    /// (the snapshot's own trigger says whether a running turn was cut).
    pub async fn pause(
        &self,
        snapshot: crate::snapshot::Request,
        reason: Option<String>,
        trigger: SnapshotTrigger,
        forced: bool,
        mark: Mark,
    ) -> Result<Option<String>, RecordError> {
        let snapshot_trigger = snapshot.trigger;
        let snapshot = match crate::snapshot::take(&self.store, snapshot).await {
            Ok(snapshot) => Some(snapshot.snapshot_id),
            Err(err) => {
                tracing::warn!(session = %self.session_id, %err, "cannot take the pause's snapshot");
                None
            }
        };
        let mut kinds = Vec::new();
        if let Some(snapshot_id) = &snapshot {
            kinds.push(SessionEventKind::SnapshotTaken {
                snapshot_id: snapshot_id.clone(),
                trigger: snapshot_trigger,
            });
        }
        kinds.push(SessionEventKind::State { state: SessionState::Paused, error: None });
        kinds.push(SessionEventKind::Paused {
            reason: reason.clone(),
            forced,
            trigger: Some(trigger),
        });
        self.publish(kinds, mark)?;
        // An exhaustion's snapshot primes the next resume's fresh agent session.
        let handoff = snapshot.clone().filter(|_| snapshot_trigger == SnapshotTrigger::Exhaustion);
        tracing::info!(session = %self.session_id, %trigger, reason = reason.as_deref().unwrap_or(""), snapshot = snapshot.as_deref().unwrap_or("none"), "paused");
        let paused = PausedRecord { reason, trigger, forced, handoff };
        self.store.set_paused(self.session_id.clone(), paused, self.events.last_seq()).await?;
        Ok(snapshot)
    }

    /// A `cancelled` resolution for each open question.
    async fn question_ends(&self) -> Result<Vec<SessionEventKind>, StoreError> {
        Ok(self
            .store
            .list_pending(self.session_id.clone())
            .await?
            .into_iter()
            .map(|(request_id, method, _)| {
                let answer = crate::session::cancelled_answer(&method);
                let outcome = answer.get("outcome").cloned().unwrap_or(answer);
                SessionEventKind::PermissionResolved { request_id, outcome }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests;
