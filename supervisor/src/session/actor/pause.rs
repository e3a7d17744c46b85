//! Pausing at a turn boundary — asked, forced by the context filling up, or by a limit
//! reached at a turn's end (budgets, `max_turns`, `max_duration`) — and snapshots.

use agents::profile::UsageReporting;
use protocol::api::{PauseSummary, SummaryState};

use super::{
    Instant, Internal, PendingPause, Phase, ResumeContext, SessionActor, SessionError,
    SessionEventKind, SessionState, SnapshotTrigger, Stage, SummaryStep, TurnKind,
};
use crate::session::PauseTaken;
use crate::session::meter::BudgetNews;
use crate::snapshot::summary;

/// Whether a pause of this trigger may spend a summary turn: not an idle park (parking is
/// to cost nothing), a budget's pause (no more spending) or a forced one.
fn summarizes(trigger: SnapshotTrigger) -> bool {
    matches!(
        trigger,
        SnapshotTrigger::Pause
            | SnapshotTrigger::Exhaustion
            | SnapshotTrigger::MaxTurns
            | SnapshotTrigger::MaxDuration
    )
}

impl SessionActor {
    /// The tokens the store recorded for the turn that just ended (a cumulative agent's
    /// report taken apart), counted in the metrics; the turn's usage as reported else.
    async fn recorded_tokens(&self, reported: &crate::store::TurnUsage) -> crate::store::TurnUsage {
        if self.profile.session.usage_totals == UsageReporting::PerTurn {
            return reported.clone();
        }
        match self.context.store.newest_turn_tokens(self.row.id.clone()).await {
            Ok(Some(recorded)) => {
                crate::session::meter::count_tokens(&self.row.agent_profile_id, &recorded);
                crate::store::TurnUsage { cost: reported.cost.clone(), ..recorded }
            }
            Ok(None) => reported.clone(),
            Err(err) => {
                tracing::warn!(session = %self.row.id, %err, "cannot read the turn's tokens");
                reported.clone()
            }
        }
    }

    /// After a turn's end: a budget passing 80 % is announced (`budget_warning`); a budget
    /// used up, `max_turns` turns or `max_duration_secs` since the session was created
    /// pause the session once the turn's end is handled. A token limit whose turns never
    /// reported tokens cannot be checked: a notice says so at the first such turn.
    pub(in crate::session) async fn check_limits(&mut self, reported: &crate::store::TurnUsage) {
        let turn = &self.recorded_tokens(reported).await;
        if self.row.state.is_terminal() {
            return;
        }
        // A pause already waits (its summary turn runs): warnings only.
        let pausing = self.waits.pause.is_some();
        let store = self.context.store.clone();
        match store.budget_uses(self.row.id.clone()).await {
            Ok(uses) => {
                for news in self.meter.judge_budgets(uses, turn, pausing) {
                    self.recorder.emit(match news {
                        BudgetNews::Unchecked(message) => SessionEventKind::Notice { message },
                        BudgetNews::Warning(budget) => SessionEventKind::BudgetWarning { budget },
                    });
                }
            }
            Err(err) => tracing::warn!(session = %self.row.id, %err, "cannot read the budgets"),
        }
        if pausing {
            return;
        }
        if let Some(max) = self.profile.session.max_turns {
            let filter = crate::store::UsageFilter {
                session_id: Some(self.row.id.clone()),
                ..Default::default()
            };
            match store.usage(filter, None).await {
                Ok(report) => self.meter.judge_turns(report.total.turns, max),
                Err(err) => tracing::warn!(session = %self.row.id, %err, "cannot count the turns"),
            }
        }
        if let Some(secs) = self.profile.session.max_duration_secs {
            let age = crate::store::now_ms().saturating_sub(self.row.created_at);
            self.meter.judge_age(age, secs);
        }
    }

    /// A limit was reached at a turn's end: the session pauses (its snapshot says why).
    pub(in crate::session) async fn limit_pause(
        &mut self,
        reason: String,
        trigger: SnapshotTrigger,
    ) {
        if self.waits.pause.is_some()
            || self.row.state.is_terminal()
            || self.row.state == SessionState::Paused
        {
            return;
        }
        tracing::info!(session = %self.row.id, %reason, "a limit was reached; pausing");
        let wait = std::time::Duration::from_millis(crate::session::DEFAULT_PAUSE_WAIT_MS);
        if let Err(err) = self.request_pause(Some(reason), wait, trigger).await {
            tracing::warn!(session = %self.row.id, %err, "cannot pause at a limit");
        }
    }

    /// `task.session.pause`: at once when no turn runs (the agent and sidecar stopped, then
    /// `PAUSED`); else it waits for the turn (or the launch in flight) to end, cancelling
    /// the turn after `force_after`. Returns whether it waits.
    pub(in crate::session) async fn pause(
        &mut self,
        reason: Option<String>,
        force_after: std::time::Duration,
    ) -> Result<PauseTaken, SessionError> {
        self.request_pause(reason, force_after, SnapshotTrigger::Pause).await
    }

    /// The agent's context reached the profile's threshold: the session pauses at the turn
    /// boundary for a handoff (unless a pause is asked for already, or it cannot pause).
    pub(in crate::session) async fn exhaustion(&mut self, reason: String) {
        if self.waits.pause.is_some() || self.row.state.is_terminal() {
            return;
        }
        tracing::info!(session = %self.row.id, %reason, "the agent's context is nearly full; pausing for a handoff");
        let wait = std::time::Duration::from_millis(crate::session::DEFAULT_PAUSE_WAIT_MS);
        if let Err(err) = self.request_pause(Some(reason), wait, SnapshotTrigger::Exhaustion).await
        {
            tracing::warn!(session = %self.row.id, %err, "cannot pause for a handoff");
        }
    }

    /// A pause of either kind; see [`SessionActor::pause`].
    pub(in crate::session) async fn request_pause(
        &mut self,
        reason: Option<String>,
        force_after: std::time::Duration,
        trigger: SnapshotTrigger,
    ) -> Result<PauseTaken, SessionError> {
        match self.row.state {
            state if state.is_terminal() => return Err(SessionError::Terminal(state)),
            SessionState::Paused => {
                return Err(SessionError::InvalidState("the session is already PAUSED".into()));
            }
            _ => {}
        }
        if self.waits.pause.is_some() {
            return Err(SessionError::InvalidState(
                "a pause is already requested; it waits for the running turn to end".into(),
            ));
        }
        let busy = self.conversation.turn.is_some()
            || matches!(self.phase(), Phase::Launching | Phase::Opening | Phase::Reattaching);
        self.waits.pause = Some(PendingPause {
            reason: reason.clone(),
            force_at: Some(Instant::now() + force_after),
            forced: false,
            trigger,
            wait: force_after,
            summary: SummaryStep::NotAsked,
        });
        // With a summary to ask for, it waits for the summary turn (asked at the boundary,
        // right after this command).
        if !busy {
            self.no_summary_over_budget().await;
        }
        if !busy && !self.summary_due() {
            let snapshot_id = self.pause_now().await;
            return Ok(PauseTaken::Paused { snapshot_id });
        }
        // Kept before it is announced, so a restart still pauses.
        let force_at = crate::store::now_ms()
            .saturating_add(i64::try_from(force_after.as_millis()).unwrap_or(i64::MAX));
        let request = crate::store::PauseRequest {
            reason: reason.clone(),
            force_at,
            requested_at: crate::store::now_ms(),
            trigger,
            summary_asked_at: None,
        };
        if let Err(err) = self.context.store.put_pause(self.row.id.clone(), request).await {
            self.waits.pause = None;
            return Err(err.into());
        }
        self.recorder.emit(SessionEventKind::PauseRequested {
            reason,
            force_after_ms: u64::try_from(force_after.as_millis()).unwrap_or(u64::MAX),
        });
        self.update_view(|view| view.pause_requested = true);
        Ok(PauseTaken::Waits)
    }

    /// The pending pause at a turn boundary: its agent is asked for a summary first (when
    /// the profile says so and it was not asked yet), else the session pauses now.
    pub(in crate::session) async fn pause_at_boundary(&mut self) {
        self.no_summary_over_budget().await;
        if self.summary_due() {
            match self.ask_summary().await {
                Ok(()) => return,
                Err(note) => {
                    tracing::warn!(session = %self.row.id, %note, "cannot ask the agent for its summary; pausing without it");
                    if let Some(pause) = self.waits.pause.as_mut() {
                        let failed = summary::without(SummaryState::Failed, note);
                        pause.summary = SummaryStep::Settled(failed);
                    }
                }
            }
        }
        self.pause_now().await;
    }

    /// A summary that would be asked for now is not when a budget of the session is used
    /// up (the summary turn would spend over it): the pause goes on without.
    async fn no_summary_over_budget(&mut self) {
        if !self.summary_due() {
            return;
        }
        let used_up = match self.context.store.budget_uses(self.row.id.clone()).await {
            Ok(uses) => {
                uses.into_iter().find(|used| used.percent >= 100).map(|used| used.describe())
            }
            Err(err) => Some(format!("the budgets cannot be read ({err})")),
        };
        if let (Some(used_up), Some(pause)) = (used_up, self.waits.pause.as_mut()) {
            let note = format!("{used_up}: no more spending");
            pause.summary = SummaryStep::Settled(summary::without(SummaryState::Skipped, note));
        }
    }

    /// Whether the pending pause asks its agent for a summary now: the profile asks for
    /// one, this pause was not forced, may wait and may spend a turn (not an idle park or a
    /// budget's pause), the agent has worked at all and since a resume wrapped in a context
    /// (else it would summarise that context), and it waits for a prompt.
    fn summary_due(&self) -> bool {
        let Some(pause) = self.waits.pause.as_ref() else { return false };
        pause.summary == SummaryStep::NotAsked
            && self.profile.session.summarize_on_pause
            && !pause.forced
            && !pause.wait.is_zero()
            && !self.conversation.resume_context.is_some_and(ResumeContext::rebuilds_context)
            && !self.recorder.history.is_empty()
            && summarizes(pause.trigger)
            && self.phase() == Phase::Open
            && self.conversation.turn.is_none()
            && self.sidecar.catch_up.until.is_none()
            && self.row.state == SessionState::WaitingForInput
            && self
                .sidecar
                .execution
                .as_ref()
                .is_some_and(|execution| execution.agent_running && !execution.gone)
    }

    /// Sends the summary prompt as a turn of its own, with the pause's wait; the moment it
    /// is asked is durable first (a restart then waits for that turn, and does not ask
    /// again). The error says why it could not be sent.
    async fn ask_summary(&mut self) -> Result<(), String> {
        let wait = self.waits.pause.as_ref().map_or(std::time::Duration::ZERO, |pause| pause.wait);
        let at = crate::store::now_ms();
        let force_at = at.saturating_add(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX));
        match self.context.store.pause_summary_asked(self.row.id.clone(), at, force_at).await {
            Ok(true) => {}
            Ok(false) => return Err("the pause request is no longer stored".into()),
            Err(err) => return Err(format!("cannot record the summary request: {err}")),
        }
        agentctl::fault::point("pause.summary_asked");
        tracing::info!(session = %self.row.id, "asking the agent for its summary before pausing");
        self.recorder.emit(SessionEventKind::Notice {
            message: "asking the agent for a summary of its decisions, open problems and next steps before pausing".into(),
        });
        self.start_turn_as(summary::PROMPT.to_owned(), TurnKind::PauseSummary, None).await?;
        if let Some(pause) = self.waits.pause.as_mut() {
            pause.summary = SummaryStep::Asked(at);
            pause.force_at = Some(Instant::now() + wait);
        }
        Ok(())
    }

    /// What the pause's snapshot says of its summary.
    async fn settle_summary(&self, pause: &PendingPause) -> PauseSummary {
        let at = match &pause.summary {
            SummaryStep::Settled(settled) => return settled.clone(),
            SummaryStep::Asked(at) => *at,
            SummaryStep::NotAsked if !self.profile.session.summarize_on_pause => {
                return summary::not_asked(false, "");
            }
            SummaryStep::NotAsked
                if self
                    .conversation
                    .resume_context
                    .is_some_and(ResumeContext::rebuilds_context) =>
            {
                return self.carried_summary().await;
            }
            SummaryStep::NotAsked => {
                let why = match pause.trigger {
                    _ if pause.forced => "the pause was forced: its turn was cancelled",
                    _ if pause.wait.is_zero() => "the pause was asked to be immediate",
                    SnapshotTrigger::Idle => "an idle park does not ask for one",
                    SnapshotTrigger::Budget => "a budget's pause does not spend more",
                    _ if self.recorder.history.is_empty() => {
                        "no turn ran: there is nothing to summarise"
                    }
                    _ => "no agent was waiting for a prompt",
                };
                return summary::not_asked(true, why);
            }
        };
        let history = self.recorder.history.path().to_owned();
        summary::answer_of(&self.context.store, self.row.id.clone(), history, at).await
    }

    /// A pause before the agent worked since its resume: the summary of the snapshot that
    /// resume compiled from still holds (it is not asked again: the agent would summarise
    /// the context it was given).
    async fn carried_summary(&self) -> PauseSummary {
        const IDLE: &str = "the agent has not worked since it was resumed";
        let previous = self.context.store.latest_snapshot(self.row.id.clone()).await;
        match previous.ok().flatten() {
            Some(snapshot) => match snapshot.summary {
                Some(summary) if summary.state == SummaryState::Stored => PauseSummary {
                    note: Some(format!(
                        "carried over from snapshot {}: {IDLE}",
                        snapshot.snapshot_id
                    )),
                    ..summary
                },
                _ => summary::without(SummaryState::Skipped, IDLE),
            },
            None => summary::without(SummaryState::Skipped, IDLE),
        }
    }

    /// Pauses now: the agent and sidecar are stopped (and awaited), then the session is
    /// `PAUSED` — its events first, then the store (a replay re-applies the store write).
    /// Returns the pause's snapshot, when one was taken.
    pub(in crate::session) async fn pause_now(&mut self) -> Option<String> {
        let pause = self.waits.pause.take()?;
        // Read before the agent stops: its last messages may still be coalescing.
        if let Err(err) = self.recorder.history.flush_agent() {
            self.recorder.write_failed("the history", &err);
        }
        let summary = self.settle_summary(&pause).await;
        if let Some(execution) = self.sidecar.execution.take()
            && let Err(err) = self.retire_and_record(execution).await
        {
            tracing::warn!(session = %self.row.id, %err, "stopping the agent for a pause");
        }
        // A kill here leaves an agentless session not yet `PAUSED`: recovery sets it
        // waiting for input, and its next prompt resumes it as a wake-up would.
        agentctl::fault::point("pause.retired");
        self.update_view(|view| view.agent_running = false);
        // The agent that asked is stopped: its questions are void, but for those whose
        // answers it took (agentctl's confirmation, which may come later, resolves those).
        self.recorder.flush_events();
        let answered = self.conversation.answering.keys().cloned().collect();
        if let Err(err) =
            self.recorder.record.void_questions_but(&answered, self.recorder.mark()).await
        {
            tracing::warn!(session = %self.row.id, %err, "cannot void open questions at a pause");
        }
        // The snapshot sees the workspace as the stopped agent left it.
        let trigger = match pause.trigger {
            SnapshotTrigger::Exhaustion => SnapshotTrigger::Exhaustion,
            _ if pause.forced => SnapshotTrigger::Timeout,
            other => other,
        };
        let request = crate::snapshot::Request {
            summary: Some(summary),
            ..self.snapshot_request(trigger, pause.reason.clone())
        };
        // After what this actor published so far.
        self.recorder.flush_events();
        let (reason, forced) = (pause.reason, pause.forced);
        let snapshot_id = match self
            .recorder
            .record
            .pause(request, reason, pause.trigger, forced, self.recorder.mark())
            .await
        {
            Ok(snapshot_id) => snapshot_id,
            Err(err @ crate::session::record::RecordError::Log(_)) => {
                self.recorder.write_failed("the session's event log", &err);
                None
            }
            Err(err) => {
                self.recorder.write_failed("the paused state", &err);
                None
            }
        };
        self.row.state = SessionState::Paused;
        self.row.error_message = None;
        self.update_view(|view| {
            view.state = SessionState::Paused;
            view.error = None;
            view.agent_running = false;
            view.pause_requested = false;
        });
        self.enter(Stage::Idle);
        snapshot_id
    }

    /// What a snapshot of this session now is taken from.
    pub(in crate::session) fn snapshot_request(
        &self,
        trigger: SnapshotTrigger,
        reason: Option<String>,
    ) -> crate::snapshot::Request {
        crate::snapshot::Request {
            session_id: self.row.id.clone(),
            trigger,
            reason,
            history: self.recorder.history.path().to_owned(),
            execution_id: self.sidecar.execution.as_ref().map(|execution| execution.id.clone()),
            usage: self.meter.usage().cloned(),
            summary: None,
            taken_at: None,
        }
    }

    /// Takes a snapshot without holding the actor up; its event follows when it is stored.
    pub(in crate::session) fn snapshot_in_background(
        &self,
        trigger: SnapshotTrigger,
        reason: Option<String>,
    ) {
        let request = crate::snapshot::Request {
            taken_at: Some(crate::store::now_ms()),
            ..self.snapshot_request(trigger, reason)
        };
        let store = self.context.store.clone();
        let report = self.internal_tx.clone();
        tokio::spawn(async move {
            match crate::snapshot::take(&store, request).await {
                Ok(snapshot) => {
                    let _ = report.send(Internal::SnapshotTaken {
                        snapshot_id: snapshot.snapshot_id,
                        trigger,
                    });
                }
                // A session deleted meanwhile has nothing to snapshot.
                Err(err) => tracing::debug!(%err, "cannot take a snapshot"),
            }
        });
    }

    /// Whether the agent is idle: open, attached, no turn, no pause, launch, teardown,
    /// catch-up, stall or answer in flight.
    fn is_idle(&self) -> bool {
        self.phase() == Phase::Open
            && !self.row.state.is_terminal()
            && self.conversation.turn.is_none()
            && self.waits.pause.is_none()
            && self.recorder.stall.is_none()
            && self.sidecar.teardown.is_none()
            && self.sidecar.catch_up.until.is_none()
            && self.conversation.answering.is_empty()
            && self
                .sidecar
                .execution
                .as_ref()
                .is_some_and(|execution| execution.agent_running && !execution.gone)
    }

    /// Arms the idle deadline when the agent just became idle, and disarms it when it is
    /// not (a prompt, a pause, a lost agent): after every command, report and event.
    pub(in crate::session) fn arm_idle(&mut self) {
        let idle = self.is_idle();
        let timeout = self.context.idle_timeout(&self.profile);
        self.waits.arm_idle(idle, timeout, Instant::now());
    }

    /// The idle deadline passed: the session is parked — agent and sidecar stopped, a
    /// snapshot, `PAUSED` with trigger `idle` — unless a question of the agent waits for a
    /// person (then it is looked at again after another timeout).
    pub(in crate::session) async fn park(&mut self) {
        if !self.is_idle() {
            return;
        }
        let Some(timeout) = self.context.idle_timeout(&self.profile) else { return };
        match self.context.store.list_pending(self.row.id.clone()).await {
            Ok(open) if open.is_empty() => {}
            Ok(_) => {
                self.waits.idle_again(Instant::now(), timeout);
                return;
            }
            Err(err) => {
                tracing::warn!(session = %self.row.id, %err, "cannot read the open questions; not parking");
                self.waits.idle_again(Instant::now(), timeout);
                return;
            }
        }
        let reason = format!("parked after {} s without a turn", timeout.as_secs());
        tracing::info!(session = %self.row.id, "{reason}");
        crate::metrics::get().evictions.inc();
        if let Err(err) = self.request_pause(Some(reason), timeout, SnapshotTrigger::Idle).await {
            tracing::warn!(session = %self.row.id, %err, "cannot park the idle session");
        }
    }
}
