//! What the actor writes: session events (with their marks), history entries, state
//! changes and acknowledgements to agentctl (a failed write stalls: `stall.rs`).

use super::{
    Arc, Durability, EntryType, History, Outgoing, Recorded, SessionActor, SessionError,
    SessionEventKind, SessionState, Stall, history,
};
use crate::session::record::RecordError;

/// What the actor writes — session events (first) and history entries, with the marks of
/// the execution they came from — and a write that failed.
pub(in crate::session) struct Recorder {
    pub(in crate::session) record: crate::session::record::SessionRecord,
    pub(in crate::session) history: History,
    /// Session events not yet in the event log. They are written together (one write per
    /// handled event or command) and before any store write that would make a replay skip
    /// them, so a kill leaves all of them or none, and a replay that finds them written
    /// suppresses all of them (see `flush_events`).
    pub(in crate::session) unflushed_events: Vec<SessionEventKind>,
    /// What of the event being handled was recorded before a restart (and is not again).
    pub(in crate::session) recorded: Recorded,
    pub(in crate::session) durability: Durability,
    /// The generation of the execution whose events are being handled (written into every
    /// session event and history entry, so marks from another execution are not trusted).
    pub(in crate::session) generation: Option<i64>,
    /// A durable write failed (a full disk): intake is stopped, nothing more is
    /// acknowledged, and the actor re-attaches to its own sidecar when its retry is due.
    pub(in crate::session) stall: Option<Stall>,
}

impl Recorder {
    pub(super) fn new(record: crate::session::record::SessionRecord, history: History) -> Recorder {
        Recorder {
            record,
            history,
            unflushed_events: Vec::new(),
            recorded: Recorded::default(),
            durability: Durability::default(),
            generation: None,
            stall: None,
        }
    }
}

impl SessionActor {
    /// Syncs what was written and stores `acked_seq`, then acknowledges through the
    /// outbox — nothing before it is durable (see `durability.rs`).
    pub(in crate::session) async fn ack(&mut self, force: bool) {
        if self.recorder.stall.is_some() {
            return;
        }
        let Some(seq) =
            self.recorder.durability.due(self.recorder.history.unflushed_since(), force)
        else {
            // Nothing to acknowledge: the session events stay buffered until the actor's
            // loop writes them (once per burst of agent events).
            return;
        };
        // What the handled events published must be in the log before it is synced.
        self.flush_events();
        if self.recorder.stall.is_some() {
            return;
        }
        let Some(execution_id) =
            self.sidecar.execution.as_ref().map(|execution| execution.id.clone())
        else {
            return;
        };
        if let Err(err) = self
            .recorder
            .history
            .sync()
            .and_then(|()| self.recorder.record.log().sync().map_err(std::io::Error::other))
        {
            self.write_failed("the history and event log (sync)", &err);
            return;
        }
        match self.context.store.set_acked_seq(self.row.id.clone(), execution_id, seq).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(err) => {
                self.write_failed("acked_seq", &err);
                return;
            }
        }
        agentctl::fault::point("ack.stored");
        self.send(Outgoing::Ack(seq));
        let metrics = crate::metrics::get();
        metrics.acks.inc();
        metrics.ack_lag.observe(self.recorder.durability.handled.saturating_sub(seq) as f64);
        self.recorder.durability.acked(seq);
    }

    /// The agent's open questions are void (it is gone): each is resolved `cancelled`,
    /// published before its row goes (a replay finds no row to publish again).
    pub(in crate::session) async fn void_pending(&mut self) {
        self.conversation.answering.clear();
        // After what this actor published so far.
        self.flush_events();
        match self.recorder.record.void_questions(self.mark()).await {
            Ok(_) => {}
            Err(err @ crate::session::record::RecordError::Log(_)) => {
                self.write_failed("the session's event log", &err)
            }
            // The rows stay; the next end of this execution's work tries again.
            Err(err) => tracing::warn!(session = %self.row.id, %err, "cannot void open questions"),
        }
    }

    pub(in crate::session) fn record_history(
        &mut self,
        kind: EntryType,
        content: String,
        tool: Option<(String, String, String)>,
    ) {
        if self.recorder.recorded.history {
            return;
        }
        if let Err(err) = self.recorder.history.append(kind, content, tool) {
            self.write_failed("the history", &err);
        }
    }

    /// Writes the agent's plan into the history (each plan replaces the last).
    pub(in crate::session) fn record_plan(&mut self, plan: Vec<protocol::api::PlanEntry>) {
        if self.recorder.recorded.history {
            return;
        }
        // On the timeline too, after the burst it came in (the newest of the burst).
        self.conversation.plan_reported(plan.clone());
        if let Err(err) = self.recorder.history.append_plan(plan) {
            self.write_failed("the history", &err);
        }
    }

    /// Puts how far the agent's plan is on the timeline, unless the last row said the same
    /// (agents send their plan again as they go).
    pub(in crate::session) async fn log_plan(&mut self, plan: Vec<protocol::api::PlanEntry>) {
        let progress = protocol::api::PlanEntry::progress(&plan);
        let event = protocol::api::TimelineEvent::Plan {
            total: progress.total,
            done: progress.done,
            in_progress: progress.in_progress,
            current: progress.current.map(|step| history::excerpt(step, 300)),
        };
        if !self.conversation.plan_is_news(&event) {
            return;
        }
        match self.context.store.log_event(self.row.id.clone(), event.clone()).await {
            Ok(()) => self.conversation.plan_written(event),
            Err(err) => {
                tracing::warn!(session = %self.row.id, %err, "cannot put the agent's plan on the timeline");
            }
        }
    }

    /// Writes a prompt into the history as the user's message, with its turn's id.
    pub(in crate::session) fn record_prompt(&mut self, prompt: String, turn_id: String) {
        if self.recorder.recorded.history {
            return;
        }
        if let Err(err) = self.recorder.history.append_prompt(prompt.clone(), turn_id.clone()) {
            // A user message is the actor's own: no replay writes it again (an agent's
            // entries are rebuilt from agentctl's replay after the stall).
            self.write_failed("the history", &err);
            if let Some(stall) = self.recorder.stall.as_mut() {
                stall.unwritten_prompts.push((prompt, turn_id));
            }
        }
    }

    /// Publishes a session event (buffered until [`SessionActor::flush_events`]). During
    /// a replay of events recorded before a restart it does nothing.
    pub(in crate::session) fn emit(&mut self, kind: SessionEventKind) {
        if self.recorder.recorded.events {
            return;
        }
        self.recorder.unflushed_events.push(kind);
    }

    /// The marks of what is published now: the agentctl seq being handled, never below
    /// what the log already holds for this execution (events re-published while a replay
    /// catches up must not lower the mark a restart reads back).
    pub(in crate::session) fn mark(&self) -> crate::session::record::Mark {
        let mark = self.recorder.durability.handled.max(self.recorder.durability.events_mark);
        crate::session::record::Mark {
            agent_seq: (mark > 0).then_some(mark),
            generation: self.recorder.generation,
        }
    }

    /// Writes the buffered session events in one append, each carrying the agentctl seq
    /// being handled: after a restart, events of an agentctl event at or below the newest
    /// mark in the log are all known to be written, so none is written twice and none is
    /// lost.
    pub(in crate::session) fn flush_events(&mut self) {
        if self.recorder.unflushed_events.is_empty() {
            return;
        }
        let kinds = std::mem::take(&mut self.recorder.unflushed_events);
        let metrics = crate::metrics::get();
        metrics.published_events.inc_by(kinds.len() as u64);
        let log = Arc::clone(self.recorder.record.log());
        let before = log.disk_bytes();
        if let Err(err) = self.recorder.record.publish(kinds, self.mark()) {
            self.write_failed("the session's event log", &err);
        }
        metrics.published_bytes.inc_by(log.disk_bytes().saturating_sub(before));
        // Retention: the oldest segments go once the log passes its limit. (A restart
        // reads its marks from the newest events, which are always kept.)
        if log.disk_bytes() > self.context.event_log_retain_bytes
            && let Err(err) = log.retain(self.context.event_log_retain_bytes)
        {
            tracing::warn!(session = %self.row.id, %err, "cannot drop old event log segments");
        }
    }

    /// Records and publishes a state change; publishing the same state and error again is
    /// skipped, so a subscriber sees each change once.
    pub(in crate::session) async fn set_state(
        &mut self,
        state: SessionState,
        error: Option<String>,
        task: Option<&'static str>,
    ) -> Result<(), SessionError> {
        if state == self.row.state && error == self.row.error_message {
            return Ok(());
        }
        // The event first: a replay re-applies the store write, but would skip the event.
        // (After what this actor published so far.)
        self.flush_events();
        let opened =
            self.row.state == SessionState::Starting && state == SessionState::WaitingForInput;
        let between = opened.then_some("state.opened_published");
        let mark = self.mark();
        match self.recorder.record.set_state(state, error.clone(), task, mark, between).await {
            Ok(()) => {}
            Err(RecordError::Log(err)) => self.write_failed("the session's event log", &err),
            Err(RecordError::Store(err)) => return Err(err.into()),
        }
        self.row.state = state;
        self.row.error_message = error.clone();
        self.update_view(|view| {
            view.state = state;
            view.error = error;
        });
        Ok(())
    }
}
