//! What the actor writes: session events (with their marks), history entries, state
//! changes and the durable half of acknowledgements to agentctl; a failed write starts a
//! stall (retried by the actor: its section on a stall). Events first, then rows: the ordering rule
//! of [`SessionRecord`] has its one caller here.

use super::{
    Arc, Durability, EntryType, History, Recorded, SessionError, SessionEventKind, SessionRow,
    SessionState, SessionView, Stall, watch,
};
use crate::session::record::{Mark, RecordError, SessionRecord};
use crate::store::Store;

/// What the actor writes — session events (first) and history entries, with the marks of
/// the execution they came from — and a write that failed.
pub(in crate::session) struct Recorder {
    pub(in crate::session) record: SessionRecord,
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
    /// How much of the event log is kept (older segments go).
    retain_bytes: u64,
}

impl Recorder {
    /// The generation of the execution whose events are being handled (0 before any).
    pub(in crate::session) fn generation(&self) -> i64 {
        self.generation.unwrap_or_default()
    }

    /// Publishes a step of bringing the agent up.
    pub(in crate::session) fn progress(
        &mut self,
        step: crate::events::LaunchStep,
        detail: Option<String>,
    ) {
        self.emit(crate::events::SessionEventKind::Progress { step, detail });
    }

    /// The last `window` bytes of the history, read off the actor's thread.
    pub(in crate::session) async fn history_tail(
        &self,
        window: u64,
    ) -> Vec<crate::history::HistoryEntry> {
        let path = self.history.path().to_owned();
        tokio::task::spawn_blocking(move || crate::history::read_tail(&path, window))
            .await
            .unwrap_or_default()
    }

    pub(super) fn new(record: SessionRecord, history: History, retain_bytes: u64) -> Recorder {
        Recorder {
            record,
            history,
            unflushed_events: Vec::new(),
            recorded: Recorded::default(),
            durability: Durability::default(),
            generation: None,
            stall: None,
            retain_bytes,
        }
    }

    fn session(&self) -> &crate::ids::SessionId {
        self.record.session_id()
    }

    /// A durable write failed: nothing more is acknowledged, and after this handling the
    /// actor stops taking agentctl's events (they wait in agentctl's spool) until a retry
    /// succeeds. Nothing acknowledged is lost; nothing unacknowledged is dropped.
    pub(in crate::session) fn write_failed(&mut self, what: &str, err: &dyn std::fmt::Display) {
        tracing::error!(session = %self.session(), %err, "cannot write {what}");
        if self.stall.is_none() {
            let reason = format!(
                "cannot write {what}: {err}; the agent's output is held (nothing is lost) until it can"
            );
            self.stall = Some(Stall { reason, ..Stall::default() });
        }
    }

    /// Makes what was handled durable up to the seq due for acknowledgement and stores it
    /// as the execution's `acked_seq`: the seq the actor may now acknowledge to agentctl,
    /// or none (nothing due, a stall, or a write that failed and starts one).
    pub(in crate::session) async fn ack(
        &mut self,
        force: bool,
        store: &Store,
        execution_id: Option<crate::ids::ExecutionId>,
    ) -> Option<u64> {
        if self.stall.is_some() {
            return None;
        }
        // Nothing due: the session events stay buffered until the actor's loop writes
        // them (once per burst of agent events).
        let seq = self.durability.due(self.history.unflushed_since(), force)?;
        // What the handled events published must be in the log before it is synced.
        self.flush_events();
        if self.stall.is_some() {
            return None;
        }
        let execution_id = execution_id?;
        let synced = self
            .history
            .sync()
            .and_then(|()| self.record.log().sync().map_err(std::io::Error::other));
        if let Err(err) = synced {
            self.write_failed("the history and event log (sync)", &err);
            return None;
        }
        match store.set_acked_seq(self.session().clone(), execution_id, seq).await {
            Ok(true) => {}
            Ok(false) => return None,
            Err(err) => {
                self.write_failed("acked_seq", &err);
                return None;
            }
        }
        agentctl::fault::point("ack.stored");
        let metrics = crate::metrics::get();
        metrics.acks.inc();
        metrics.ack_lag.observe(self.durability.handled.saturating_sub(seq) as f64);
        self.durability.acked(seq);
        Some(seq)
    }

    /// The agent's open questions are void: each is resolved `cancelled`, published
    /// before its row goes (a replay finds no row to publish again).
    pub(in crate::session) async fn void_questions(&mut self) {
        // After what this actor published so far.
        self.flush_events();
        match self.record.void_questions(self.mark()).await {
            Ok(_) => {}
            Err(err @ RecordError::Log(_)) => self.write_failed("the session's event log", &err),
            // The rows stay; the next end of this execution's work tries again.
            Err(err) => {
                tracing::warn!(session = %self.session(), %err, "cannot void open questions")
            }
        }
    }

    pub(in crate::session) fn record_history(
        &mut self,
        kind: EntryType,
        content: String,
        tool: Option<(String, String, String)>,
    ) {
        if self.recorded.history {
            return;
        }
        if let Err(err) = self.history.append(kind, content, tool) {
            self.write_failed("the history", &err);
        }
    }

    /// Writes the agent's plan into the history (each plan replaces the last).
    pub(in crate::session) fn record_plan(&mut self, plan: Vec<protocol::api::PlanEntry>) {
        if self.recorded.history {
            return;
        }
        if let Err(err) = self.history.append_plan(plan) {
            self.write_failed("the history", &err);
        }
    }

    /// Writes a prompt into the history as the user's message, with its turn's id.
    pub(in crate::session) fn record_prompt(
        &mut self,
        prompt: String,
        turn_id: crate::ids::TurnId,
    ) {
        if self.recorded.history {
            return;
        }
        if let Err(err) = self.history.append_prompt(prompt.clone(), turn_id.to_string()) {
            // A user message is the actor's own: no replay writes it again (an agent's
            // entries are rebuilt from agentctl's replay after the stall).
            self.write_failed("the history", &err);
            if let Some(stall) = self.stall.as_mut() {
                stall.unwritten_prompts.push((prompt, turn_id));
            }
        }
    }

    /// Writes a steer the agent took into its running turn `turn_id` as the user's message
    /// (its id `TURN#steer-…`), synced to disk: it is acknowledged once this returns.
    pub(in crate::session) fn record_steer(&mut self, text: String, turn_id: &crate::ids::TurnId) {
        if self.recorded.history {
            return;
        }
        let message_id = format!("{turn_id}#steer-{}", uuid::Uuid::now_v7());
        let written =
            self.history.append_prompt(text, message_id).and_then(|_| self.history.sync());
        if let Err(err) = written {
            self.write_failed("the history", &err);
        }
    }

    /// Publishes a session event (buffered until [`Recorder::flush_events`]). During a
    /// replay of events recorded before a restart it does nothing.
    pub(in crate::session) fn emit(&mut self, kind: SessionEventKind) {
        if self.recorded.events {
            return;
        }
        self.unflushed_events.push(kind);
    }

    /// The marks of what is published now: the agentctl seq being handled, never below
    /// what the log already holds for this execution (events re-published while a replay
    /// catches up must not lower the mark a restart reads back).
    pub(in crate::session) fn mark(&self) -> Mark {
        let mark = self.durability.handled.max(self.durability.events_mark);
        Mark { agent_seq: (mark > 0).then_some(mark), generation: self.generation }
    }

    /// Writes the buffered session events in one append, each carrying the agentctl seq
    /// being handled: after a restart, events of an agentctl event at or below the newest
    /// mark in the log are all known to be written, so none is written twice and none is
    /// lost.
    pub(in crate::session) fn flush_events(&mut self) {
        if self.unflushed_events.is_empty() {
            return;
        }
        let kinds = std::mem::take(&mut self.unflushed_events);
        let metrics = crate::metrics::get();
        metrics.published_events.inc_by(kinds.len() as u64);
        let log = Arc::clone(self.record.log());
        let before = log.disk_bytes();
        if let Err(err) = self.record.publish(kinds, self.mark()) {
            self.write_failed("the session's event log", &err);
        }
        metrics.published_bytes.inc_by(log.disk_bytes().saturating_sub(before));
        // Retention: the oldest segments go once the log passes its limit. (A restart
        // reads its marks from the newest events, which are always kept.)
        if log.disk_bytes() > self.retain_bytes
            && let Err(err) = log.retain(self.retain_bytes)
        {
            tracing::warn!(session = %self.session(), %err, "cannot drop old event log segments");
        }
    }

    /// Writes the buffered session events, a turn's `turn_started` last among them; returns
    /// that event's seq (`None` when the write failed: a stall publishes it later).
    pub(in crate::session) fn flush_turn_start(&mut self) -> Option<u64> {
        if self.recorded.events || self.unflushed_events.is_empty() {
            return None;
        }
        self.flush_events();
        self.stall.is_none().then(|| self.record.log().last_seq())
    }

    /// Records and publishes a state change (the event first: a replay re-applies the
    /// store write, but would skip the event), then shows it in `row` and `view`;
    /// publishing the same state and error again is skipped, so a subscriber sees each
    /// change once.
    pub(in crate::session) async fn set_state(
        &mut self,
        row: &mut SessionRow,
        view: &watch::Sender<SessionView>,
        (state, error, task): (SessionState, Option<String>, Option<&'static str>),
    ) -> Result<(), SessionError> {
        if state == row.state && error == row.error_message {
            return Ok(());
        }
        // After what this actor published so far.
        self.flush_events();
        let opened = row.state == SessionState::Starting && state == SessionState::WaitingForInput;
        let between = opened.then_some("state.opened_published");
        let mark = self.mark();
        match self.record.set_state(state, error.clone(), task, mark, between).await {
            Ok(()) => {}
            Err(RecordError::Log(err)) => self.write_failed("the session's event log", &err),
            Err(RecordError::Store(err)) => return Err(err.into()),
        }
        row.state = state;
        row.error_message = error.clone();
        view.send_modify(|view| {
            view.state = state;
            view.error = error;
        });
        Ok(())
    }
}
