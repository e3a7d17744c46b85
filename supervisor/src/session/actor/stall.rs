//! The stall after a failed durable write (a full disk): nothing more is acknowledged,
//! intake stops (the agent's output waits in agentctl's spool), and the writes are tried
//! again with a growing delay — by re-attaching to the sidecar after the acknowledged seq,
//! or, when the agent went meanwhile, by writing again what ends its work.

use super::{
    History, Instant, Outgoing, Pending, Phase, ReattachPlan, STALL_RETRY_MAX, SessionActor,
    SessionState, Stall, UnwrittenState, mpsc,
};

/// Why a lost execution's work ended, when nothing better was kept: its agent went while
/// nothing could be written.
const LOST_WHILE_STALLED: &str =
    "the agent went away while its output could not be recorded (a failed write)";

impl SessionActor {
    /// Changes the session's state; when the store does not take it, the change is kept
    /// and written at the next try of the stall this starts (a loss's end must not be
    /// left unwritten: the store would say `RUNNING` for an agent that is gone).
    pub(in crate::session) async fn set_state_or_stall(
        &mut self,
        state: SessionState,
        error: Option<String>,
        task: Option<&'static str>,
    ) {
        if let Err(err) = self.set_state(state, error.clone(), task).await {
            self.recorder.write_failed("the session's state", &err);
            if let Some(stall) = self.recorder.stall.as_mut() {
                stall.unwritten_state = Some(UnwrittenState { state, error, task });
            }
        }
    }

    /// Stops intake and shows why; schedules the first retry.
    pub(in crate::session) fn stall(&mut self) {
        let reason =
            self.recorder.stall.as_ref().map(|stall| stall.reason.clone()).unwrap_or_default();
        self.update_view(|view| view.error = Some(reason.clone()));
        // Said after the status shows it, so whoever reads the log line finds it there.
        tracing::error!(session = %self.row.id, %reason, "intake stops until it can");
        // The stream is dropped: what it still had comes again from agentctl on retry.
        // And the agent's output is held at agentctl meanwhile: the room freed later goes
        // to recording what is spooled, not to more output (released once caught up).
        if let Some(execution) = self.sidecar.execution.as_mut() {
            let (_, closed) = mpsc::channel(1);
            execution.events_rx = closed;
            if !execution.gone {
                self.sidecar.catch_up.holding = true;
                self.send(Outgoing::Hold(true));
            }
        }
        let delay = std::time::Duration::from_millis(200);
        if let Some(stall) = self.recorder.stall.as_mut() {
            stall.retry = Some((Instant::now() + delay, delay));
        }
    }

    /// Tries again after a failed write: the history is reopened (a torn tail cut, its mark
    /// read back), the open turns are read back from the store, and the actor re-attaches to
    /// its own sidecar after the acknowledged seq — the replay path of a restart, so each
    /// event is recorded once. With no sidecar left, what ends the lost execution's work is
    /// written instead ([`SessionActor::finish_loss`]). A failure here waits longer and
    /// tries again.
    pub(in crate::session) async fn retry_after_stall(&mut self, delay: std::time::Duration) {
        let Some(mut stall) = self.recorder.stall.take() else { return };
        let again = |actor: &mut SessionActor, why: String, mut stall: Stall| {
            let next = (delay * 2).min(STALL_RETRY_MAX);
            stall.reason = why;
            stall.retry = Some((Instant::now() + next, next));
            actor.recorder.stall = Some(stall);
        };
        let history = match self.reopen_history(&mut stall.unwritten_prompts) {
            Ok(history) => history,
            Err(why) => return again(self, why, stall),
        };
        let Some(execution) = self.sidecar.execution.as_ref() else {
            self.recorder.history = history;
            if let Some(generation) = self.recorder.generation {
                self.recorder.history.set_generation(generation);
            }
            if let Err(why) = self.finish_loss(&stall).await {
                return again(self, why, stall);
            }
            let error = self.row.error_message.clone();
            self.update_view(|view| view.error = error);
            // Anyone who asked for a resume meanwhile gets one now.
            if self.waits.anyone_waits_for_open() {
                self.begin_resume().await;
            }
            return;
        };
        let open_turns =
            match self.context.store.open_turns(self.row.id.clone(), execution.id.clone()).await {
                Ok(turns) => turns,
                Err(err) => {
                    return again(self, format!("cannot read the open turns: {err}"), stall);
                }
            };
        let Some(execution) = self.sidecar.execution.take() else { return };
        let mut record = execution.record.clone();
        record.acked_seq = self.recorder.durability.acked as i64;
        record.acp_session_id = self.view_tx.borrow().acp_session_id.clone();
        let addr = record.endpoint();
        let gone = execution.gone;
        let primed_session = execution.primed_session.clone();
        drop(execution);
        self.recorder.history = history;
        self.recorder.unflushed_events.clear();
        self.conversation.pending.retain(|_, pending| !matches!(pending, Pending::Prompt { .. }));
        self.conversation.turn = None;
        let error = self.row.error_message.clone();
        self.update_view(|view| view.error = error);
        tracing::info!(session = %self.row.id, "re-attaching after a failed write");
        self.start_reattach(
            ReattachPlan { execution: record, addr, open_turns, gone },
            primed_session,
        );
    }

    /// The history opened again (a torn tail cut, its mark read back), with the user
    /// messages that could not be written appended first, in their order (their agent's
    /// answer, not acknowledged, follows from the replay).
    fn reopen_history(
        &self,
        prompts: &mut Vec<(String, crate::ids::TurnId)>,
    ) -> Result<History, String> {
        let mut history = History::open(self.recorder.history.path())
            .map_err(|err| format!("cannot reopen the history: {err}"))?;
        while let Some((prompt, turn_id)) = prompts.first().cloned() {
            history
                .append_prompt(prompt, turn_id.into_string())
                .map_err(|err| format!("cannot write a prompt to the history: {err}"))?;
            prompts.remove(0);
        }
        Ok(history)
    }

    /// After a failed write with no execution left. When the stall holds a loss (its
    /// agent went while nothing could be written: `deferred_loss`, or a state the store did
    /// not take), what ends it is written once no launch or retire is in flight: the rest of
    /// its spool (from where the records left off: a message being coalesced was published
    /// and not yet in the history), with the turns the store holds open awaited as a
    /// re-attach does; then its open turns and questions void; then the state it left,
    /// unless the session was paused or ended meanwhile. Each step can be tried again; the
    /// first that fails says why. A stall that holds no loss just ends.
    async fn finish_loss(&mut self, stall: &Stall) -> Result<(), String> {
        if stall.deferred_loss.is_none() && stall.unwritten_state.is_none() {
            return Ok(());
        }
        match self.phase() {
            Phase::Ended => return Ok(()),
            Phase::Idle if self.sidecar.teardown.is_none() => {}
            _ => return Err(format!("{} (and a launch or retire is in flight)", stall.reason)),
        }
        let store = self.context.store.clone();
        let record = store
            .get_execution(self.row.id.clone())
            .await
            .map_err(|err| format!("cannot read the lost execution: {err}"))?;
        if let Some(record) = record {
            let open_turns = store
                .open_turns(self.row.id.clone(), record.execution_id.clone())
                .await
                .map_err(|err| format!("cannot read the open turns: {err}"))?;
            self.expect_open_turns(open_turns);
            self.record_spool_of_gone(record).await;
            self.conversation.pending.clear();
            self.conversation.turn = None;
            self.update_view(|view| view.turn_id = None);
            if let Some(stall) = self.recorder.stall.take() {
                return Err(stall.reason);
            }
        }
        let unwritten = stall.unwritten_state.clone();
        let reason = stall.deferred_loss.clone();
        let reason = reason.or_else(|| unwritten.as_ref().and_then(|state| state.error.clone()));
        let reason = reason.unwrap_or_else(|| LOST_WHILE_STALLED.to_owned());
        self.conversation.answering.clear();
        self.recorder
            .record
            .void_open_work(&reason, Vec::new(), self.recorder.mark())
            .await
            .map_err(|err| format!("cannot write interrupted turns: {err}"))?;
        let settled = self.row.state.is_terminal() || self.row.state == SessionState::Paused;
        if let (Some(UnwrittenState { state, error, task }), false) = (unwritten, settled) {
            self.set_state(state, error, task)
                .await
                .map_err(|err| format!("cannot write the session's state: {err}"))?;
        }
        match self.recorder.stall.take() {
            Some(stall) => Err(stall.reason),
            None => Ok(()),
        }
    }
}
