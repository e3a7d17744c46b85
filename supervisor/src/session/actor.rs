//! The session actor: its state, its loop, and the commands it serves.
//!
//! The loop is a biased `select!` over, in order: commands (a cancel or stop never waits
//! behind a stream of chunks), reports from its own tasks (launch, re-attach, the outbox),
//! the deadlines (ACP handshake, cancel grace), and agentctl events. Nothing in it awaits
//! the sidecar.
//!
//! The actor is implemented here, in one `impl` (a tidy test holds it so): its methods are
//! the transitions, each composed once, in sections — commands and reports, what the
//! recorder writes, settings, a stall after a failed write, prompts and turns, pauses,
//! executions, and the ACP client. The state lives in components that own it, each in its
//! own file: `actor/stage.rs` (where the actor is, and what is bound to that),
//! `actor/records.rs` (what it writes), `actor/sidecar.rs` (the execution and its
//! retires), `actor/waits.rs` (who waits for a boundary), `conversation.rs`, `meter.rs` and
//! `choices.rs`; what needs no actor is in `launch.rs`, `acp.rs` and `acp/`.

mod messages;
mod records;
mod sidecar;
mod stage;
mod waits;

use std::sync::Arc;

use agents::profile::{Advertised, Profile, RestoreMethod, UsageReporting};
use protocol::acp::{Parsed, schema};
use protocol::api::{CheckpointTrigger, PauseSummary, PromptOrigin, SnapshotTrigger, SummaryState};
use protocol::control::{Event, EventKind};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::acp::parse::{failed_tool_text, tool_diffs, tool_name, tool_text, tool_title};
use super::acp::{
    KnownConversation, MAX_COALESCED_BYTES, MAX_COALESCED_EVENTS, REPLAY_WINDOW_BYTES,
    RpcErrorBody, explain, is_replayed_kind, parse, plan_entries,
};
use super::durability::Durability;
use super::launch::{self, Connected, LaunchFailure, LaunchPlan};
use super::meter::{ContextReport, ContextWarning};
use super::outbox::{self, Outgoing};
use super::{
    CANCEL_GRACE, Command, MAX_PROMPT_LINE, Phase, ReattachPlan, Reply, SessionContext,
    SessionError, SessionView, Start, leftovers,
};
use crate::events::{LaunchStep, SessionEventKind};
use crate::history::{self, EntryType, History};
use crate::session::PauseTaken;
use crate::session::acp::requests;
use crate::session::choices::RestoreStep;
use crate::session::meter::BudgetNews;
use crate::session::record::TurnEnd;
use crate::settings::{SessionSettings, Setting};
use crate::sidecar::Control;
use crate::snapshot::summary;
use crate::store::{
    ExecutionRow, ExecutionStatus, ResumeOutcome, RetryCandidate, SessionRow, SessionState,
    TurnState, task_state,
};

pub(super) use super::conversation::{Replay, Turn};
pub(super) use messages::{AfterAuth, Internal, Pending, TurnKind};
pub(super) use stage::{
    AfterLaunch, CatchUp, Execution, Launch, Opening, PendingPause, Recorded, Resend,
    ResumeContext, ResumeState, Retired, Stage, Stall, SummaryStep, Teardown, UnwrittenState,
};

pub(super) struct SessionActor {
    pub(super) context: SessionContext,
    pub(super) row: SessionRow,
    pub(super) profile: Arc<Profile>,
    pub(super) view_tx: watch::Sender<SessionView>,
    /// Where the actor is, with what only makes sense there.
    pub(super) stage: Stage,
    /// Reports of the actor's background work (launches, retires, the outbox) to itself.
    pub(super) internal_tx: mpsc::UnboundedSender<Internal>,
    /// The ACP conversation with the agent (see `conversation.rs`).
    pub(super) conversation: super::conversation::Conversation,
    /// What the actor writes, and a write that failed (see `actor/records.rs`).
    pub(super) recorder: records::Recorder,
    /// The agent's sidecar: the execution, and launches, retires and re-attaches of it
    /// (see `actor/sidecar.rs`).
    pub(super) sidecar: sidecar::Sidecar,
    /// Who and what waits for a boundary: resumes, a pause, the idle park (see
    /// `actor/waits.rs`).
    pub(super) waits: waits::Waits,
    /// Context use, cost and the limits they reach (see `meter.rs`).
    pub(super) meter: super::meter::Meter,
    /// The agent's settings, those chosen and their restore (see `choices.rs`).
    pub(super) choices: super::choices::Choices,
}

/// The most agent events handled in a row before the session events are written and
/// commands are looked at again.
const AGENT_EVENT_BURST: usize = 256;

/// The longest wait between two tries after a failed write.
const STALL_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// How much of each stderr line shown while the agent is quiet is shown.
const QUIET_STDERR_CHARS: usize = 300;
/// How much of the history's end (bytes) is read for what a turn cancelled for a steer had
/// done.
const STEER_TAIL: u64 = 512 * 1024;

/// Why a lost execution's work ended, when nothing better was kept: its agent went while
/// nothing could be written.
const LOST_WHILE_STALLED: &str =
    "the agent went away while its output could not be recorded (a failed write)";

impl SessionActor {
    /// The actor, and the receiver of its reports to itself (for [`SessionActor::run`]).
    pub(super) fn new(
        context: SessionContext,
        row: SessionRow,
        profile: Arc<Profile>,
        record: super::record::SessionRecord,
        history: History,
        view_tx: watch::Sender<SessionView>,
    ) -> (SessionActor, mpsc::UnboundedReceiver<Internal>) {
        let (internal_tx, internal_rx) = mpsc::unbounded_channel();
        let retain_bytes = context.event_log_retain_bytes;
        let stage = match view_tx.borrow().phase {
            Phase::Launching => Stage::Launching(Box::new(Launch::new(None, None))),
            Phase::Reattaching => Stage::Reattaching { primed_session: None },
            _ => Stage::Idle,
        };
        let actor = SessionActor {
            context,
            row,
            profile,
            view_tx,
            stage,
            internal_tx,
            conversation: super::conversation::Conversation::new(),
            recorder: records::Recorder::new(record, history, retain_bytes),
            sidecar: sidecar::Sidecar::default(),
            waits: waits::Waits::default(),
            meter: Default::default(),
            choices: Default::default(),
        };
        (actor, internal_rx)
    }

    pub(super) async fn run(
        mut self,
        mut internal: mpsc::UnboundedReceiver<Internal>,
        mut commands: mpsc::Receiver<Box<Command>>,
        start: Start,
    ) {
        match start {
            Start::Fresh { initial_prompt } => {
                let launch = Launch { first: true, ..Launch::new(None, initial_prompt) };
                Box::pin(self.start_launch(None, launch)).await;
            }
            Start::Resume => Box::pin(self.begin_resume()).await,
            Start::Reattach(plan) => self.start_reattach(*plan, None),
        }
        // Read while the launch runs (off its path), before any agent event is handled.
        match self.context.store.cost_mark(self.row.id.clone()).await {
            Ok(mark) => self.meter.load_cost_mark(mark),
            Err(err) => tracing::warn!(session = %self.row.id, %err, "cannot read the cost mark"),
        }
        self.load_settings().await;
        self.load_queue().await;
        // The actor lives while it may own an execution: after the session ends, until a
        // launch in flight has landed (and been retired).
        while self.phase() != Phase::Ended
            || matches!(self.sidecar.after_launch, AfterLaunch::Retire(_))
            || self.sidecar.teardown.is_some()
        {
            let next_deadline = [
                self.stage.handshake().map(|(_, at)| at),
                self.conversation.turn.as_ref().and_then(|turn| turn.cancel_at),
                self.conversation.turn.as_ref().and_then(|turn| turn.deadline),
                self.recorder.stall.as_ref().and_then(|stall| stall.retry).map(|(at, _)| at),
                self.waits.next_deadline(),
            ]
            .into_iter()
            .flatten()
            .min();
            let deadline = async move {
                match next_deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let intake = self.recorder.stall.is_none();
            let agent_event = async {
                match self.sidecar.execution.as_mut() {
                    Some(execution) if intake => execution.events_rx.recv().await,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                // The rare arms are boxed: the task's size is its largest await, and it
                // lives as long as the session.
                command = commands.recv(), if !matches!(self.stage, Stage::Ended) => match command {
                    Some(command) => Box::pin(self.handle_command(*command)).await,
                    None => break,
                },
                Some(report) = internal.recv() => Box::pin(self.handle_internal(report)).await,
                () = deadline => Box::pin(self.deadline_passed()).await,
                // Boxed once per burst (not per event): handling an event is the largest
                // await of this task, which lives as long as the session.
                event = agent_event => Box::pin(self.agent_burst(event)).await,
            }
            self.recorder.flush_events();
            if matches!(self.phase(), Phase::Idle | Phase::Ended) {
                // No execution: the log is written rarely, so it holds no descriptor
                // meanwhile (the next write reopens it).
                self.recorder.record.log().release();
            }
            if self.recorder.stall.as_ref().is_some_and(|stall| stall.retry.is_none()) {
                self.stall();
            }
            let due = self.meter.take_due();
            if let Some((added, mark)) = due.cost_between_turns {
                let store = &self.context.store;
                if let Err(err) =
                    store.add_cost_between_turns(self.row.id.clone(), added, mark).await
                {
                    tracing::warn!(session = %self.row.id, %err, "cannot record cost reported between turns");
                }
            }
            if let Some(plan) = self.conversation.take_plan() {
                Box::pin(self.log_plan(plan)).await;
            }
            if let Some((reason, trigger)) = due.limit {
                Box::pin(self.limit_pause(reason, trigger)).await;
                self.recorder.flush_events();
            }
            if let Some(reason) = self.meter.take_handoff() {
                Box::pin(self.exhaustion(reason)).await;
                self.recorder.flush_events();
            }
            // A pause takes effect at the turn boundary (or once a launch in flight landed).
            // (After a re-attach, not before the replay caught up: a turn may still end there.)
            if self.waits.pause.is_some()
                && self.conversation.turn.is_none()
                && self.sidecar.catch_up.until.is_none()
                && matches!(self.phase(), Phase::Open | Phase::Idle)
            {
                Box::pin(self.pause_at_boundary()).await;
            }
            if self.conversation.queue.head_due(self.takes_a_turn_now()) {
                Box::pin(self.run_queue_head()).await;
                self.recorder.flush_events();
            }
            self.arm_idle();
        }
        self.recorder.flush_events();
        self.recorder.record.log().release();
        // Answer whatever is still queued, so no caller waits forever.
        commands.close();
        while let Some(command) = commands.recv().await {
            let state = self.row.state;
            reject(*command, || SessionError::Terminal(state));
        }
    }

    /// Handles an agent event and the events already queued behind it, before the session
    /// events are written: one append per burst, not one per event.
    async fn agent_burst(&mut self, first: Option<crate::sidecar::EventItem>) {
        self.agent_event(first).await;
        for _ in 1..AGENT_EVENT_BURST {
            let queued = match self.sidecar.execution.as_mut() {
                Some(execution)
                    if self.recorder.stall.is_none() && !matches!(self.stage, Stage::Ended) =>
                {
                    match execution.events_rx.try_recv() {
                        Ok(event) => Some(event),
                        Err(mpsc::error::TryRecvError::Empty) => break,
                        Err(mpsc::error::TryRecvError::Disconnected) => None,
                    }
                }
                _ => break,
            };
            self.agent_event(queued).await;
        }
    }

    async fn agent_event(&mut self, event: Option<crate::sidecar::EventItem>) {
        match event {
            Some(Ok(event)) => self.handle_agent_event(*event).await,
            // The daemon is going down (its teardowns closed) and its runtime tears the
            // clients down under the actor: no loss, the sidecar runs on for the next start.
            Some(Err(_)) | None if self.context.teardowns.is_closed() => self.left_running(),
            Some(Err(err)) => self.lost(format!("lost the connection to agentctl: {err}")).await,
            None => self.lost("agentctl's event stream ended".into()).await,
        }
    }

    /// The daemon shuts down: the execution is let go as it is (nothing fenced, recorded
    /// or published; the next start re-attaches to it) and the actor ends.
    fn left_running(&mut self) {
        if self.sidecar.execution.take().is_some() {
            tracing::info!(session = %self.row.id, "shutdown: agentctl keeps running");
        }
        // A retire in flight keeps the loop going until it lands: no turn timeout may end
        // (and record) a turn the next start settles.
        if let Some(turn) = self.conversation.turn.as_mut() {
            (turn.deadline, turn.cancel_at) = (None, None);
        }
        self.enter(Stage::Ended);
    }

    // ---- commands -----------------------------------------------------------------------

    async fn handle_command(&mut self, command: Command) {
        // (An announcement of the service's is published whatever the state: a review of
        // an ended session's changes too.)
        if self.row.state.is_terminal() && !matches!(command, Command::Announce { .. }) {
            let state = self.row.state;
            return reject(command, || SessionError::Terminal(state));
        }
        match command {
            Command::Prompt { text, reply } => {
                let running =
                    self.conversation.turn.is_some() || self.row.state == SessionState::Running;
                if self.conversation.queue.queues(running) {
                    self.enqueue(text, false, reply).await;
                } else if self.sidecar.catch_up.until.is_some() {
                    // After a re-attach the event log is ahead of the store until the
                    // replay catches up (a turn may have ended there already): a prompt
                    // waits for it rather than being refused as `RUNNING`.
                    self.sidecar.catch_up.deferred.push((text, reply));
                } else if !self.agent_open() {
                    self.prompt_without_agent(text, reply).await;
                } else if let Err(err) = self.start_turn(text, Some(reply)).await {
                    tracing::debug!(session = %self.row.id, %err, "prompt refused");
                }
            }
            Command::Retry { turn_id, text, reply } => {
                // One at a time (the actor serialises them): a second retry of the same
                // turn finds the first's row and is refused.
                let store = self.context.store.clone();
                let retried = store.turn_to_retry(self.row.id.clone(), Some(turn_id.clone())).await;
                match retried {
                    Ok(Some(RetryCandidate { retried_by: None, .. })) => {
                        if self.sidecar.catch_up.until.is_some() {
                            let _ = reply.send(Err(SessionError::InvalidState(
                                "the session is catching up after a restart; retry in a moment"
                                    .into(),
                            )));
                        } else if let Err(err) =
                            self.start_turn_as(text, TurnKind::RetryOf(turn_id), Some(reply)).await
                        {
                            tracing::debug!(session = %self.row.id, %err, "retry refused");
                        }
                    }
                    Ok(Some(RetryCandidate { retried_by: Some(retry), .. })) => {
                        let _ = reply.send(Err(SessionError::AlreadyRetried { turn_id, retry }));
                    }
                    Ok(None) => {
                        let _ = reply
                            .send(Err(SessionError::InvalidState(format!("no turn {turn_id}"))));
                    }
                    Err(err) => {
                        let _ = reply.send(Err(err.into()));
                    }
                }
            }
            Command::Cancel { reply } => {
                let result = self.cancel().await;
                let _ = reply.send(result);
            }
            Command::Permission { request_id, method, result, reply } => {
                let answered = self.answer_permission(&request_id, method, result).await;
                let _ = reply.send(answered);
            }
            Command::Stop { end, reply } => self.stop(end, reply).await,
            Command::Relocate { to, reply } => {
                let _ = reply.send(self.relocate(to).await);
            }
            Command::Pause { reason, force_after, reply } => {
                let result = self.pause(reason, force_after).await;
                let _ = reply.send(result);
            }
            // A retire in flight, or a loss whose end waits for a stall's next try: what is
            // left of it is recorded before anything launches.
            Command::Resume { reply, .. }
                if self.sidecar.teardown.is_some()
                    || self
                        .recorder
                        .stall
                        .as_ref()
                        .is_some_and(|stall| stall.deferred_loss.is_some()) =>
            {
                self.waits.wait_for_open(reply)
            }
            Command::Resume { refresh: Some(profile), reply } => {
                let busy =
                    matches!(self.phase(), Phase::Launching | Phase::Opening | Phase::Reattaching)
                        || self.sidecar.execution.as_ref().is_some_and(|e| e.agent_running);
                if busy {
                    let _ = reply.send(Err(SessionError::InvalidState(
                        "the agent is running with the session's profile; pause the session (or stop-all) first, then resume with refresh_profile".into(),
                    )));
                } else {
                    self.profile = profile;
                    self.waits.wait_for_open(reply);
                    self.begin_resume().await;
                }
            }
            Command::Resume { refresh: None, reply } => match self.phase() {
                // One launch at a time; everyone gets its outcome.
                Phase::Launching | Phase::Opening | Phase::Reattaching => {
                    self.waits.wait_for_open(reply)
                }
                Phase::Open if self.sidecar.execution.as_ref().is_some_and(|e| e.agent_running) => {
                    let _ = reply.send(Ok(ResumeOutcome::AlreadyRunning));
                }
                _ => {
                    self.waits.wait_for_open(reply);
                    self.begin_resume().await;
                }
            },
            Command::Detach { reply } => self.detach(reply).await,
            Command::Steer { text, reply } => self.steer(text, reply).await,
            Command::Rewind { turn_id, restore_workspace, reply } => {
                let _ = reply.send(self.rewind(turn_id, restore_workspace).await);
            }
            Command::Queue { change, reply } => {
                let changed = self.change_queue(change).await;
                let _ = reply.send(changed);
            }
            Command::Setting { setting, forget, reply } => {
                self.choose_setting(setting, forget, reply).await
            }
            Command::Announce { kind, reply } => {
                self.recorder.emit(kind);
                self.recorder.flush_events();
                let _ = reply.send(Ok(()));
            }
        }
    }

    async fn handle_internal(&mut self, report: Internal) {
        match report {
            Internal::CheckpointTaken(checkpoint) => {
                self.recorder.emit(SessionEventKind::CheckpointTaken { checkpoint });
                self.recorder.flush_events();
            }
            Internal::SnapshotTaken { snapshot_id, trigger } => {
                self.recorder.emit(SessionEventKind::SnapshotTaken { snapshot_id, trigger });
            }
            Internal::Retired(retired) => self.retired(*retired).await,
            Internal::Launched(launched) => self.launched(*launched).await,
            Internal::Reattached(reattached) => self.reattached(*reattached).await,
            Internal::ControlFailed { execution_id, error } => {
                if self
                    .sidecar
                    .execution
                    .as_ref()
                    .is_some_and(|execution| execution.id == execution_id)
                {
                    self.lost(format!("agentctl stopped answering: {error}")).await;
                }
            }
            Internal::AnswerSent { execution_id, request_id } => {
                // agentctl took the answer for the agent that asked: the question is
                // answered — also when that agent's execution ended meanwhile (its reply
                // can come after the turn's end and a pause that followed it). One still
                // open is resolved once: a question voided meanwhile has no row.
                // A permission's resolution shows its outcome, an elicitation's the response.
                let Some(result) = self.conversation.answering.remove(&request_id) else { return };
                let outcome = result.get("outcome").cloned().unwrap_or(result);
                let open = match self.context.store.list_pending(self.row.id.clone()).await {
                    Ok(pending) => pending.iter().any(|(id, _, _)| *id == request_id),
                    Err(err) => {
                        tracing::warn!(session = %self.row.id, execution = %execution_id, %err, "cannot read the open questions");
                        return;
                    }
                };
                if open {
                    // Published before the row goes.
                    self.recorder.emit(SessionEventKind::PermissionResolved {
                        request_id: request_id.clone(),
                        outcome,
                    });
                    self.recorder.flush_events();
                    if let Err(err) =
                        self.context.store.delete_pending(self.row.id.clone(), request_id).await
                    {
                        self.recorder.write_failed("an answered permission request", &err);
                    }
                }
            }
        }
    }

    async fn deadline_passed(&mut self) {
        let now = Instant::now();
        if self.waits.idle_due(now) {
            return self.park().await;
        }
        if let Some((at, delay)) = self.recorder.stall.as_ref().and_then(|stall| stall.retry)
            && at <= now
        {
            return self.retry_after_stall(delay).await;
        }
        if let Some((step, at)) = self.stage.handshake()
            && at <= now
        {
            if let Stage::Opening(opening) = &mut self.stage {
                opening.step = None;
            }
            if self.conversation.restoring() {
                // A restore that never answers is a failed restore, not the session's end:
                // forget it (a late answer is ignored) and fall back to a fresh session.
                self.conversation
                    .pending
                    .retain(|_, pending| !matches!(pending, Pending::Restore { .. }));
                let reason = format!(
                    "the agent did not answer {step} within {} ms",
                    self.profile.process.init_timeout_ms
                );
                return self.restore_rejected(reason).await;
            }
            let tail = self.conversation.stderr_tail();
            return self
                .fail(format!(
                    "the agent did not answer {step} within {} ms{tail}",
                    self.profile.process.init_timeout_ms
                ))
                .await;
        }
        if let Some(pause) = self.waits.pause.as_mut()
            && pause.force_at.is_some_and(|at| at <= now)
        {
            // Once: a launch in flight (no turn) just lands, and then the pause applies.
            pause.force_at = None;
            if self.conversation.turn.is_some() {
                // The summary turn's end is waited for as long; cut, the pause goes on
                // without a summary (it is not a forced pause).
                let summarizing = matches!(pause.summary, SummaryStep::Asked(_));
                pause.forced = !summarizing;
                let message = if summarizing {
                    "the agent did not give its summary in time: its turn is cancelled and the session pauses without it"
                } else {
                    "the pause waited long enough: the running turn is cancelled"
                }
                .to_owned();
                tracing::warn!(session = %self.row.id, "{message}");
                self.recorder.emit(SessionEventKind::Notice { message });
                if let Err(err) = self.cancel().await {
                    tracing::debug!(session = %self.row.id, %err, "cancel for a pause");
                }
            }
        }
        if let Some(turn) = self.conversation.turn.as_mut()
            && turn.deadline.is_some_and(|at| at <= now)
        {
            turn.deadline = None;
            let message = format!(
                "the turn ran longer than the profile's process.turn_timeout_ms ({} ms): it is cancelled",
                self.profile.process.turn_timeout_ms.unwrap_or_default()
            );
            tracing::warn!(session = %self.row.id, "{message}");
            self.recorder.emit(SessionEventKind::Notice { message });
            if let Err(err) = self.cancel().await {
                tracing::debug!(session = %self.row.id, %err, "cancel for the turn timeout");
            }
        }
        if let Some(turn) = self.conversation.turn.as_mut()
            && turn.cancel_at.is_some_and(|at| at <= now)
        {
            turn.cancel_at = None;
            let turn_id = turn.id.clone();
            // The agent never confirmed the cancel: end the turn ourselves and forget
            // its request (a late answer is ignored).
            self.conversation.pending.retain(
                |_, pending| !matches!(pending, Pending::Prompt { turn_id: id, .. } if *id == turn_id),
            );
            self.end_turn(
                TurnState::Failed,
                Some("cancelled".into()),
                Some(format!(
                    "cancelled; the agent did not end the turn within {} s",
                    CANCEL_GRACE.as_secs()
                )),
            )
            .await;
        }
    }

    // ---- shared -------------------------------------------------------------------------

    /// Sends an ACP request and remembers what it was for. Returns its id.
    pub(super) fn request(
        &mut self,
        method: &'static str,
        params: Value,
        purpose: Pending,
    ) -> String {
        let id = self.conversation.take_request_id();
        let key = id.to_string();
        if !matches!(purpose, Pending::Prompt { .. }) {
            let at = Instant::now()
                + std::time::Duration::from_millis(self.profile.process.init_timeout_ms);
            match &mut self.stage {
                Stage::Opening(opening) => opening.step = Some((method, at)),
                // A setting chosen while the session is open: its caller bounds the wait.
                _ if matches!(purpose, Pending::Setting { .. } | Pending::Steer { .. }) => {}
                // Only the handshake sends requests other than prompts and settings.
                other => debug_assert!(false, "{method} sent while {:?}", other.phase()),
            }
        }
        self.conversation.pending.insert(key.clone(), purpose);
        self.send(Outgoing::Acp(
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        ));
        key
    }

    // ---- what the recorder writes, with what the actor holds ----------------------------

    /// Makes what was handled durable and acknowledges it to agentctl through the outbox:
    /// nothing before it is durable (see `durability.rs`).
    pub(super) async fn ack(&mut self, force: bool) {
        let execution_id = self.sidecar.execution.as_ref().map(|execution| execution.id.clone());
        let store = &self.context.store;
        if let Some(seq) = self.recorder.ack(force, store, execution_id).await {
            self.send(Outgoing::Ack(seq));
        }
    }

    /// Records and publishes a state change (see [`records::Recorder::set_state`]).
    pub(super) async fn set_state(
        &mut self,
        state: SessionState,
        error: Option<String>,
        task: Option<&'static str>,
    ) -> Result<(), SessionError> {
        let change = (state, error, task);
        self.recorder.set_state(&mut self.row, &self.view_tx, change).await
    }

    /// The agent's open questions are void (it is gone): none is being answered, each is
    /// resolved `cancelled`.
    pub(super) async fn void_pending(&mut self) {
        self.conversation.answering.clear();
        self.recorder.void_questions().await;
    }

    /// The agent's plan, into the history and (once its burst is handled) the timeline.
    pub(super) fn record_plan(&mut self, plan: Vec<protocol::api::PlanEntry>) {
        if self.recorder.recorded.history {
            return;
        }
        // On the timeline too, after the burst it came in (the newest of the burst).
        self.conversation.plan_reported(plan.clone());
        self.recorder.record_plan(plan);
    }

    /// Puts how far the agent's plan is on the timeline, unless the last row said the same
    /// (agents send their plan again as they go).
    async fn log_plan(&mut self, plan: Vec<protocol::api::PlanEntry>) {
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

    /// Queues a control call (a failure is reported back as [`Internal::ControlFailed`]).
    pub(super) fn send(&self, outgoing: Outgoing) {
        if let Some(execution) = &self.sidecar.execution {
            let _ = execution.outbox.send(Box::new(outgoing));
        }
    }

    /// Where the actor is.
    pub(super) fn phase(&self) -> Phase {
        self.stage.phase()
    }

    pub(super) fn enter(&mut self, stage: Stage) {
        let phase = stage.phase();
        self.stage = stage;
        self.update_view(|view| view.phase = phase);
    }

    /// Leaves the handshake for the open session: what the launch carried until now.
    pub(super) fn enter_open(&mut self) -> Option<Launch> {
        let launch = match std::mem::replace(&mut self.stage, Stage::Open) {
            Stage::Opening(opening) => Some(opening.launch),
            _ => None,
        };
        self.update_view(|view| view.phase = Phase::Open);
        launch
    }

    pub(super) fn update_view(&self, change: impl FnOnce(&mut SessionView)) {
        self.view_tx.send_modify(change);
    }

    // ---- the prompt queue ---------------------------------------------------------------
    // Prompts sent while a turn runs wait in the store's queue, in order; the head starts a
    // turn once the session is idle again, taken from the queue in the transaction that
    // records its turn (so it runs once, across any kill). A failed or cancelled turn halts
    // the queue until `queue.resume`. The decisions are `queue.rs`'s; these perform them.

    /// Reads the queue's shape before any command is handled. An unreadable queue is said
    /// and treated as halted (nothing runs by itself that the store may not hold).
    async fn load_queue(&mut self) {
        match self.context.store.prompt_queue(self.row.id.clone()).await {
            Ok(queue) => self.conversation.queue.observe(&queue),
            Err(err) => {
                tracing::warn!(session = %self.row.id, %err, "cannot read the prompt queue");
                let halted = format!("the prompt queue cannot be read ({err})");
                let queue =
                    protocol::api::PromptQueue { prompts: Vec::new(), halted: Some(halted) };
                self.conversation.queue.observe(&queue);
            }
        }
    }

    /// Whether an agent is up with its ACP session open (a turn may start on it).
    fn agent_open(&self) -> bool {
        self.phase() == Phase::Open
            && self.sidecar.execution.as_ref().is_some_and(|execution| execution.agent_running)
    }

    /// A prompt while no agent is up (the session is starting, paused, parked or failed):
    /// it waits in the queue and its caller brings the agent back, whose opening runs it.
    /// A halted queue would hold it back (a person's prompt goes around a halt): then it
    /// is refused as `AgentGone`, and its caller brings the agent back first and prompts
    /// again.
    async fn prompt_without_agent(&mut self, text: String, reply: Reply<crate::session::Prompted>) {
        if self.conversation.queue.is_halted() {
            let gone =
                SessionError::AgentGone("no agent is up and the prompt queue is halted".into());
            let _ = reply.send(Err(gone));
            return;
        }
        self.enqueue(text, true, reply).await;
    }

    /// Queues a prompt (behind the running turn, or for the agent `waking`): durable
    /// before its caller hears so.
    async fn enqueue(
        &mut self,
        text: String,
        waking: bool,
        reply: Reply<crate::session::Prompted>,
    ) {
        if text.trim().is_empty() {
            let message = "prompt must not be empty".to_owned();
            let _ = reply.send(Err(SessionError::InvalidParams { field: "prompt", message }));
            return;
        }
        let prompt_id = crate::ids::PromptId::new(uuid::Uuid::now_v7().to_string());
        let store = self.context.store.clone();
        match store.enqueue_prompt(self.row.id.clone(), prompt_id.clone(), text).await {
            Ok(position) => {
                self.queue_changed().await;
                let queued = crate::session::Prompted::Queued { prompt_id, position, waking };
                let _ = reply.send(Ok(queued));
            }
            Err(err) => {
                let _ = reply.send(Err(err.into()));
            }
        }
    }

    /// Whether a turn may start now: the session is open and waits for input, with its
    /// agent running, no turn, no pause waiting, no catch-up and no stall.
    fn takes_a_turn_now(&self) -> bool {
        self.phase() == Phase::Open
            && self.row.state == SessionState::WaitingForInput
            && self.conversation.turn.is_none()
            && self.waits.pause.is_none()
            && self.sidecar.catch_up.until.is_none()
            && self.recorder.stall.is_none()
            && self.view_tx.borrow().settings_blocked.is_none()
            && self.sidecar.execution.as_ref().is_some_and(|execution| execution.agent_running)
    }

    /// Starts the queue's head as a turn. One that cannot start (too long for the agent's
    /// line, say) halts the queue, saying why, rather than being tried again and again.
    async fn run_queue_head(&mut self) {
        let queue = match self.context.store.prompt_queue(self.row.id.clone()).await {
            Ok(queue) => queue,
            Err(err) => {
                return self.halt_queue(format!("the prompt queue cannot be read ({err})")).await;
            }
        };
        let Some(head) = queue.prompts.first().cloned() else {
            return self.conversation.queue.observe(&queue);
        };
        let prompt_id = crate::ids::PromptId::new(head.prompt_id);
        let kind = match head.steer_of {
            Some(steer_of) => TurnKind::Steer {
                prompt_id: prompt_id.clone(),
                steer_of: crate::ids::TurnId::new(steer_of),
            },
            None => TurnKind::Queued(prompt_id.clone()),
        };
        match self.start_turn_as(head.prompt, kind, None).await {
            Ok(()) => drop(self.queue_changed().await),
            Err(why) => {
                self.halt_queue(format!("the queued prompt {prompt_id} could not start: {why}"))
                    .await
            }
        }
    }

    /// Puts a queued prompt whose turn never reached the agent, and cannot be sent again as
    /// it was, back at the queue's head as a new queued prompt (its failed turn keeps the
    /// old one, which runs once).
    async fn requeue(&mut self, was: &crate::ids::PromptId, prompt: String) {
        let store = self.context.store.clone();
        let id = crate::ids::PromptId::new(uuid::Uuid::now_v7().to_string());
        let queued = match store.enqueue_prompt(self.row.id.clone(), id.clone(), prompt).await {
            Ok(_) => store.change_queued(self.row.id.clone(), id.clone(), None, Some(1)).await,
            Err(err) => Err(err),
        };
        let message = match queued {
            Ok(_) => format!(
                "the queued prompt {was} never reached the agent and cannot be sent as it was: it is queued again, first, as {id}"
            ),
            Err(err) => format!(
                "the queued prompt {was} never reached the agent, and it cannot be queued again ({err}): send it again"
            ),
        };
        tracing::warn!(session = %self.row.id, "{message}");
        self.recorder.emit(SessionEventKind::Notice { message });
        self.queue_changed().await;
    }

    /// Halts the queue, saying why (in status, on the timeline and as a notice).
    async fn halt_queue(&mut self, reason: String) {
        tracing::info!(session = %self.row.id, %reason, "the prompt queue halts");
        let store = self.context.store.clone();
        if let Err(err) = store.halt_queue(self.row.id.clone(), Some(reason.clone())).await {
            tracing::warn!(session = %self.row.id, %err, "cannot record that the queue halts");
        }
        self.recorder.emit(SessionEventKind::Notice {
            message: format!("the prompt queue halts: {reason}; resume it with task.session.queue.resume (CLI: queue resume)"),
        });
        self.queue_changed().await;
    }

    /// A change asked through the API, answered with the queue after it.
    async fn change_queue(
        &mut self,
        change: crate::session::QueueChange,
    ) -> Result<protocol::api::PromptQueue, SessionError> {
        use crate::session::QueueChange;
        let store = self.context.store.clone();
        let id = self.row.id.clone();
        // An edit or removal answers with the queue after it (read in its transaction).
        let queue = match change {
            QueueChange::Edit { prompt_id, prompt, position } => {
                store.change_queued(id, prompt_id, prompt, position).await?
            }
            QueueChange::Remove(prompt_id) => store.remove_queued(id, prompt_id).await?,
            QueueChange::Resume => {
                store.halt_queue(id, None).await?;
                return Ok(self.queue_changed().await);
            }
        };
        self.publish_queue(&queue);
        Ok(queue)
    }

    /// Reads the queue after a change, takes its shape and publishes it.
    async fn queue_changed(&mut self) -> protocol::api::PromptQueue {
        let queue = match self.context.store.prompt_queue(self.row.id.clone()).await {
            Ok(queue) => queue,
            Err(err) => {
                tracing::warn!(session = %self.row.id, %err, "cannot read the prompt queue");
                return protocol::api::PromptQueue::default();
            }
        };
        self.publish_queue(&queue);
        queue
    }

    /// Takes the queue's shape and publishes it (the `queue` event).
    fn publish_queue(&mut self, queue: &protocol::api::PromptQueue) {
        self.conversation.queue.observe(queue);
        self.recorder.emit(SessionEventKind::Queue { queue: queue.clone() });
    }

    // ---- steering -----------------------------------------------------------------------
    // A steer joins the running turn where the agent takes a message mid-turn
    // (`_session/steering`); else the turn is cancelled at once and the steering text waits
    // first in the queue, to run as the next turn with a line on what the cancelled one had
    // done (`steer.rs`). Either way it is recorded before its caller hears.

    /// Steers the running turn with `text` (see the section's header).
    async fn steer(&mut self, text: String, reply: Reply<crate::session::Steer>) {
        if text.trim().is_empty() {
            let message = "the steering text must not be empty".to_owned();
            let _ = reply.send(Err(SessionError::InvalidParams { field: "prompt", message }));
            return;
        }
        let Some(turn) = self.conversation.turn.as_ref() else {
            let _ = reply.send(Ok(crate::session::Steer::NoTurn));
            return;
        };
        let turn_id = turn.id.clone();
        // A turn being cancelled already takes nothing more.
        let native = self.choices.settings().steering_supported && turn.cancel_at.is_none();
        let acp_session = self.view_tx.borrow().acp_session_id.clone();
        match acp_session.filter(|_| native) {
            Some(acp_session) => {
                let params = requests::steer(&acp_session, &text);
                let pending = Pending::Steer { turn_id, text, reply };
                self.request(protocol::acp::method::SESSION_STEERING, params, pending);
            }
            None => self.steer_by_cancel(turn_id, text, reply).await,
        }
    }

    /// The fallback: the steering text is queued first (durably), then the turn is
    /// cancelled; the queue runs it when the turn ends, and halts for nothing meanwhile.
    async fn steer_by_cancel(
        &mut self,
        turn_id: crate::ids::TurnId,
        text: String,
        reply: Reply<crate::session::Steer>,
    ) {
        let prompt_id = crate::ids::PromptId::new(uuid::Uuid::now_v7().to_string());
        let store = self.context.store.clone();
        let queued = store.enqueue_steer(
            self.row.id.clone(),
            prompt_id.clone(),
            text.clone(),
            turn_id.clone(),
        );
        match queued.await {
            Ok(queue) => {
                agentctl::fault::point("steer.queued");
                self.publish_queue(&queue);
                self.recorder.emit(SessionEventKind::Steered {
                    turn_id: turn_id.to_string(),
                    prompt: text,
                    mode: protocol::api::SteerMode::Fallback,
                    prompt_id: Some(prompt_id.to_string()),
                });
                if let Err(err) = self.cancel().await {
                    // The turn ended meanwhile: the queue runs the text next all the same.
                    tracing::debug!(session = %self.row.id, %err, "the steered turn ended first");
                }
                let _ = reply.send(Ok(crate::session::Steer::Fallback { turn_id, prompt_id }));
            }
            Err(err) => {
                let _ = reply.send(Err(err.into()));
            }
        }
    }

    /// After a re-attach: a steer that waits for the running turn to end had that turn
    /// cancelled, but the cancel may not have reached the agent before the restart: it is
    /// sent again (a second `session/cancel` of a turn changes nothing).
    async fn cancel_for_waiting_steer(&mut self) {
        let Some(turn_id) = self.conversation.turn_id().map(str::to_owned) else { return };
        let Ok(queue) = self.context.store.prompt_queue(self.row.id.clone()).await else {
            return;
        };
        if queue.prompts.iter().any(|prompt| prompt.steer_of.as_deref() == Some(&turn_id)) {
            tracing::info!(session = %self.row.id, turn = %turn_id, "cancelling a steered turn again after a restart");
            let _ = self.cancel().await;
        }
    }

    /// The agent answered `_session/steering`: `injected` is recorded as the person's
    /// message within the turn; anything else falls back to a cancel (or, the turn having
    /// ended, leaves the text to be sent as a prompt).
    async fn steer_answered(
        &mut self,
        turn_id: crate::ids::TurnId,
        text: String,
        reply: Reply<crate::session::Steer>,
        result: Result<Value, RpcErrorBody>,
    ) {
        let outcome = match &result {
            Ok(answer) => answer.get("outcome").and_then(Value::as_str).unwrap_or("").to_owned(),
            Err(error) => error.text(),
        };
        if outcome == "injected" {
            self.recorder.record_steer(text.clone(), &turn_id);
            self.recorder.emit(SessionEventKind::Steered {
                turn_id: turn_id.to_string(),
                prompt: text,
                mode: protocol::api::SteerMode::Native,
                prompt_id: None,
            });
            let _ = reply.send(Ok(crate::session::Steer::Native(turn_id)));
        } else if self.conversation.turn_id() == Some(turn_id.as_str()) {
            self.recorder.emit(SessionEventKind::Notice {
                message: format!(
                    "the agent did not take the steer into its turn ({outcome}): the turn is cancelled and the steer runs next"
                ),
            });
            self.steer_by_cancel(turn_id, text, reply).await;
        } else {
            let _ = reply.send(Ok(crate::session::Steer::NoTurn));
        }
    }

    // ---- rewinding ----------------------------------------------------------------------
    // `task.session.rewind` on a session whose actor runs (see `crate::rewind`): refused
    // while a turn runs or the agent starts; an agent that runs is parked first (its own
    // session holds the turns the rewind takes out, and nothing may change the workspace
    // while it is restored), then the rewind is made and announced.

    pub(in crate::session) async fn rewind(
        &mut self,
        turn: crate::ids::TurnId,
        restore_workspace: bool,
    ) -> Result<protocol::api::RewindResult, SessionError> {
        self.may_rewind()?;
        if restore_workspace {
            // Refused before the agent is parked for it.
            let workspace = std::path::Path::new(&self.row.workspace_path);
            let (store, runtime) = (&self.context.store, &*self.context.runtime);
            crate::rewind::workspace_here(store, &self.row.id, runtime, workspace).await?;
        }
        let agent_runs = self
            .sidecar
            .execution
            .as_ref()
            .is_some_and(|execution| execution.agent_running && !execution.gone);
        if agent_runs && self.row.state != SessionState::Paused {
            let reason = format!("rewound to turn {turn}: the next prompt starts the agent afresh");
            self.request_pause(Some(reason), std::time::Duration::ZERO, SnapshotTrigger::Idle)
                .await?;
        }
        let target = crate::rewind::Target {
            store: &self.context.store,
            session: &self.row.id,
            workspace: std::path::Path::new(&self.row.workspace_path),
            history: self.recorder.history.path(),
            checkpoints: (&self.context.checkpoints, &self.context.dir),
            runtime: &*self.context.runtime,
        };
        let (result, row) = crate::rewind::apply(&target, &turn, restore_workspace).await?;
        // What a restored agent lacked is moot: the next session opens afresh.
        self.conversation.resume_context = None;
        self.recorder.emit(SessionEventKind::Rewound {
            turn_id: result.turn_id.clone(),
            rewound: result.rewound.clone(),
            saved_ref: row.saved_ref,
        });
        tracing::info!(session = %self.row.id, %turn, rewound = result.rewound.len(), "rewound");
        Ok(result)
    }

    /// A prompt with the notes left for the agent (see [`crate::changes::with_notes`]),
    /// and those notes with their ids (tied to the turn by its record, gone once it is
    /// delivered); `resent`: the notes of that turn, whose prompt goes again. Unreadable
    /// notes are said and left for a later prompt.
    async fn with_agent_notes(
        &self,
        prompt: String,
        resent: Option<&crate::ids::TurnId>,
    ) -> (Vec<(i64, String)>, String) {
        match self.context.store.agent_notes(self.row.id.clone(), resent.cloned()).await {
            Ok(notes) if notes.is_empty() => (notes, prompt),
            Ok(notes) => {
                let texts: Vec<String> = notes.iter().map(|(_, note)| note.clone()).collect();
                let prompt = crate::changes::with_notes(&texts, &prompt);
                (notes, prompt)
            }
            Err(err) => {
                tracing::warn!(session = %self.row.id, %err, "cannot read the notes for the agent");
                (Vec::new(), prompt)
            }
        }
    }

    /// Refused while a turn runs, the agent starts or catches up, or a pause waits.
    fn may_rewind(&self) -> Result<(), crate::rewind::RewindError> {
        let refuse = |why: &str| Err(crate::rewind::RewindError::Refused(why.to_owned()));
        if self.conversation.turn.is_some() || self.row.state == SessionState::Running {
            return refuse("a turn is running: cancel it (or wait for its end) before rewinding");
        }
        if matches!(self.phase(), Phase::Launching | Phase::Opening | Phase::Reattaching)
            || self.sidecar.catch_up.until.is_some()
        {
            return refuse("the session's agent is starting: rewind once it is ready");
        }
        if self.waits.pause.is_some() {
            return refuse("a pause waits to be taken: rewind once the session is paused");
        }
        Ok(())
    }

    // ---- settings -----------------------------------------------------------------------
    // The agent's settings (`crate::settings`): reported when the ACP session opens and by
    // the agent's updates, chosen through the API, and set again — one at a time, before
    // the session counts as open — whenever the ACP session opens. A choice the agent will
    // not take again blocks prompts (`settings_blocked` in the view) until it is chosen
    // anew or forgotten: a prompt to the wrong model is worse than none.

    /// Loaded before any agent event is handled. Unreadable settings are said and
    /// replaced by none (the agent's own values stand).
    pub(super) async fn load_settings(&mut self) {
        match self.context.store.session_settings(self.row.id.clone()).await {
            Ok(settings) => self.choices.load(settings),
            Err(err) => {
                tracing::warn!(session = %self.row.id, %err, "cannot read the session's settings");
                self.recorder.emit(SessionEventKind::Notice {
                    message: format!(
                        "the session's chosen settings cannot be read ({err}); the agent's own stand"
                    ),
                });
            }
        }
    }

    async fn save_settings(&mut self) {
        let settings = self.choices.take_for_writing();
        let saved = self.context.store.set_session_settings(self.row.id.clone(), settings).await;
        if let Err(err) = saved {
            tracing::error!(session = %self.row.id, %err, "cannot record the session's settings");
        }
    }

    /// After an agent update was handled: the settings it changed, and the title it gave,
    /// are written.
    pub(in crate::session) async fn settings_updated(&mut self) {
        if self.choices.dirty() {
            self.save_settings().await;
        }
        if let Some(title) = self.conversation.new_title.take()
            && title != self.row.title
        {
            let store = &self.context.store;
            match store.set_session_title(self.row.id.clone(), title.clone()).await {
                Ok(()) => self.row.title = title,
                Err(err) => tracing::warn!(session = %self.row.id, %err, "cannot record the title"),
            }
        }
    }

    /// A `config_option_update` or `current_mode_update`; a change the agent made itself
    /// once the session is open also replaces what was chosen.
    pub(in crate::session) fn agent_setting_update(&mut self, update: &Value) {
        let open = self.phase() == Phase::Open;
        self.choices.agent_update(update, open);
    }

    /// The ACP session answered open (`answer`: that of `session/new`, `load` or
    /// `resume`): its settings are recorded, and the choices it lacks are set again before
    /// the session counts as open.
    pub(in crate::session) async fn opened_with(
        &mut self,
        acp_session: String,
        restored: Option<ResumeOutcome>,
        answer: &Value,
    ) {
        self.choices.opened(acp_session, restored, answer);
        self.save_settings().await;
        self.update_view(|view| view.settings_blocked = None);
        self.next_restore().await;
    }

    async fn next_restore(&mut self) {
        match self.choices.next_restore() {
            Some(RestoreStep::Send { setting, acp_session }) => {
                self.recorder.progress(LaunchStep::Settings, Some(setting.to_string()));
                let params = setting.params(&acp_session);
                self.request(setting.method(), params, Pending::Setting { setting, reply: None });
            }
            Some(RestoreStep::Done { acp_session, restored, failed }) => {
                self.settings_restored(acp_session, restored, failed).await;
            }
            None => {}
        }
    }

    async fn settings_restored(
        &mut self,
        acp_session: String,
        restored: Option<ResumeOutcome>,
        failed: Vec<String>,
    ) {
        if !failed.is_empty() {
            let reason = format!(
                "the agent did not take the session's settings again ({}); no prompt is sent until they are chosen anew (task.session.set_config_option or set_mode, CLI: settings)",
                failed.join("; ")
            );
            let _ = self.context.store.log_error(self.row.id.clone(), reason.clone()).await;
            self.recorder.emit(SessionEventKind::Notice { message: reason.clone() });
            // Queued prompts would wait on a choice nobody is asked for: they halt.
            if self.conversation.queue.halts_after_failed_launch() {
                self.halt_queue(reason.clone()).await;
            }
            self.update_view(|view| view.settings_blocked = Some(reason));
        }
        self.session_opened(acp_session, restored).await;
    }

    /// The agent answered a `session/set_config_option` or `session/set_mode` of ours.
    pub(in crate::session) async fn setting_answered(
        &mut self,
        setting: Setting,
        reply: Option<Reply<SessionSettings>>,
        result: Result<Value, String>,
    ) {
        let restoring = self.choices.answered(&setting, reply.is_some(), &result);
        if result.is_ok() {
            self.save_settings().await;
            self.announce_settings(&setting);
        }
        if let Some(reply) = reply {
            if result.is_ok() {
                self.unblock_if_restored();
            }
            let answer =
                result.map(|_| self.choices.settings().clone()).map_err(SessionError::AgentRefused);
            let _ = reply.send(answer);
        } else if restoring {
            self.next_restore().await;
        }
    }

    /// Viewers learn a change as the agent would have said it.
    fn announce_settings(&mut self, setting: &Setting) {
        let update = match setting {
            Setting::Option { .. } => json!({"sessionUpdate": "config_option_update",
                "configOptions": self.choices.settings().options}),
            Setting::Mode(mode) => json!({"sessionUpdate": "current_mode_update",
                "currentModeId": mode}),
        };
        self.recorder.emit(SessionEventKind::SessionUpdate { update });
    }

    fn unblock_if_restored(&mut self) {
        let blocked = self.view_tx.borrow().settings_blocked.is_some();
        if blocked && self.choices.all_restored() {
            self.update_view(|view| view.settings_blocked = None);
            self.recorder.emit(SessionEventKind::Notice {
                message: "the session's settings are as chosen again; prompts are taken".into(),
            });
        }
    }

    /// `task.session.set_config_option` / `set_mode`: checked against what the agent
    /// offers; sent at once when the ACP session is open, else recorded for the next open.
    pub(in crate::session) async fn choose_setting(
        &mut self,
        setting: Setting,
        forget: bool,
        reply: Reply<SessionSettings>,
    ) {
        if forget {
            self.choices.forget(&setting);
            self.save_settings().await;
            self.unblock_if_restored();
            let _ = reply.send(Ok(self.choices.settings().clone()));
            return;
        }
        if let Err(err) = self.choices.settings().check(&setting) {
            let field = setting.field();
            let _ =
                reply.send(Err(SessionError::InvalidParams { field, message: err.to_string() }));
            return;
        }
        let acp_session = self.view_tx.borrow().acp_session_id.clone();
        let open = self.phase() == Phase::Open
            && self.sidecar.execution.as_ref().is_some_and(|execution| execution.agent_running);
        match acp_session.filter(|_| open) {
            Some(acp_session) => {
                let params = setting.params(&acp_session);
                self.request(
                    setting.method(),
                    params,
                    Pending::Setting { setting, reply: Some(reply) },
                );
            }
            None => {
                self.choices.choose(&setting);
                self.save_settings().await;
                let _ = reply.send(Ok(self.choices.settings().clone()));
            }
        }
    }

    // ---- a stall after a failed write ---------------------------------------------------
    // The stall after a failed durable write (a full disk): nothing more is acknowledged,
    // intake stops (the agent's output waits in agentctl's spool), and the writes are tried
    // again with a growing delay — by re-attaching to the sidecar after the acknowledged
    // seq, or, when the agent went meanwhile, by writing again what ends its work.

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
        // What the history holds only in memory of an execution no replay brings back (a
        // gone one's last message, published: none is left, or a resume started another)
        // is written from there, unless a loss to finish reads its spool from the marks.
        let current = self.sidecar.execution.as_ref().map(|execution| execution.record.generation);
        let from_memory = stall.deferred_loss.is_none()
            && stall.unwritten_state.is_none()
            && (current.is_none() || self.recorder.history.holds_unwritten_beside(current));
        let history = match self.reopen_history(&mut stall.unwritten_prompts, from_memory) {
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
            // What the stall held is durable now (the state included): said for operators,
            // and for whoever waits on the store rather than on the stream, which may have
            // shown the loss's end before it could be written (see `record.rs`).
            tracing::warn!(session = %self.row.id, "writes succeed again; the stall is over");
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
    /// answer, not acknowledged, follows from the replay). `from_memory`: what the history
    /// held only in memory is written first (it came before those messages).
    fn reopen_history(
        &mut self,
        prompts: &mut Vec<(String, crate::ids::TurnId)>,
        from_memory: bool,
    ) -> Result<History, String> {
        let mut history = History::open(self.recorder.history.path())
            .map_err(|err| format!("cannot reopen the history: {err}"))?;
        if from_memory {
            history.take_unwritten(&mut self.recorder.history);
            if let Err(err) = history.flush_agent() {
                // Kept for the next try.
                self.recorder.history.take_unwritten(&mut history);
                return Err(format!("cannot write the agent's message to the history: {err}"));
            }
        }
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

    // ---- prompts and turns --------------------------------------------------------------
    // Turns: a prompt's start and end, cancel, permission answers, and the prompts a
    // restart found undelivered.

    /// Starts a turn and queues its prompt; `reply` (if any) gets the turn id once the
    /// prompt reached agentctl, or the error. Returns the error too, for the caller's log.
    pub(in crate::session) async fn start_turn(
        &mut self,
        text: String,
        reply: Option<Reply<crate::session::Prompted>>,
    ) -> Result<(), String> {
        self.start_turn_as(text, TurnKind::Prompt, reply).await
    }

    /// [`Self::start_turn`], for a turn of the given kind.
    pub(in crate::session) async fn start_turn_as(
        &mut self,
        text: String,
        kind: TurnKind,
        reply: Option<Reply<crate::session::Prompted>>,
    ) -> Result<(), String> {
        match self.prepare_turn(text, kind).await {
            Ok((turn_id, message)) => {
                self.send(Outgoing::Prompt { message, turn_id, reply });
                Ok(())
            }
            Err(err) => {
                let text = err.to_string();
                if let Some(reply) = reply {
                    let _ = reply.send(Err(err));
                }
                Err(text)
            }
        }
    }

    /// Records a turn (row, history, events, state) and builds its `session/prompt`.
    pub(in crate::session) async fn prepare_turn(
        &mut self,
        text: String,
        kind: TurnKind,
    ) -> Result<(crate::ids::TurnId, Value), SessionError> {
        let (retry_of, origin, queued, steer_of) = match kind {
            TurnKind::Prompt => (None, PromptOrigin::User, None, None),
            TurnKind::RetryOf(turn_id) => (Some(turn_id), PromptOrigin::User, None, None),
            TurnKind::PauseSummary => (None, PromptOrigin::PauseSummary, None, None),
            TurnKind::Queued(prompt_id) => (None, PromptOrigin::User, Some(prompt_id), None),
            TurnKind::Steer { prompt_id, steer_of } => {
                (None, PromptOrigin::User, Some(prompt_id), Some(steer_of))
            }
        };
        match self.row.state {
            SessionState::WaitingForInput => {}
            other => {
                return Err(SessionError::InvalidState(format!(
                    "the session is {}; prompts are taken in WAITING_FOR_INPUT",
                    other.as_str()
                )));
            }
        }
        if let Some(reason) = self.view_tx.borrow().settings_blocked.clone() {
            return Err(SessionError::SettingsNotRestored(reason));
        }
        let Some(execution) =
            self.sidecar.execution.as_ref().filter(|execution| execution.agent_running)
        else {
            return Err(SessionError::AgentGone("no execution".into()));
        };
        let execution_id = execution.id.clone();
        let Some(acp_session) = self.view_tx.borrow().acp_session_id.clone() else {
            return Err(SessionError::InvalidState("the ACP session is not open yet".into()));
        };
        // The workspace as the last turn left it is checkpointed before this one changes it.
        if !self.context.checkpoints.settle(&self.row.id).await {
            tracing::warn!(session = %self.row.id, "a turn starts before the last checkpoint is done");
        }
        let injected = self.conversation.resume_context.is_some();
        // A steer's text goes with what the turn cancelled for it had done.
        let agent_text = match &steer_of {
            Some(steer_of) => {
                let tail = self.recorder.history_tail(STEER_TAIL).await;
                super::steer::prompt(&tail, steer_of, &text)
            }
            None => text.clone(),
        };
        // Tether's own summary turn carries none: the agent that goes on after it is told.
        let (told, agent_text) = match origin {
            PromptOrigin::PauseSummary => (Vec::new(), agent_text),
            _ => self.with_agent_notes(agent_text, None).await,
        };
        let sent_text = if injected { self.resume_context(&agent_text).await? } else { agent_text };
        let request_id = self.conversation.take_request_id();
        let message = json!({
            "jsonrpc": "2.0",
            "id": request_id,
            "method": protocol::acp::method::SESSION_PROMPT,
            "params": requests::prompt(&acp_session, sent_text),
        });
        // The agent's framing drops a line over its limit: the turn would never end.
        let size = serde_json::to_vec(&message).map_or(usize::MAX, |line| line.len() + 1);
        if size > MAX_PROMPT_LINE {
            return Err(SessionError::InvalidParams {
                field: "prompt",
                message: format!(
                    "the prompt is {size} bytes as a JSON-RPC line, over the agent's {MAX_PROMPT_LINE}-byte line limit"
                ),
            });
        }
        let turn_id = crate::ids::TurnId::new(uuid::Uuid::now_v7().to_string());
        // The turn and its request id are durable before the request leaves.
        let ids = (turn_id.clone(), self.row.id.clone(), execution_id, request_id.to_string());
        let prompt = (text.clone(), retry_of, queued.clone());
        let told_ids = told.iter().map(|(id, _)| *id).collect();
        self.context.store.insert_turn_telling(ids, prompt, told_ids).await?;
        agentctl::fault::point("prompt.recorded");
        for (_, note) in told {
            self.recorder
                .emit(SessionEventKind::Notice { message: format!("told the agent: {note}") });
        }
        self.recorder.record_prompt(text.clone(), turn_id.clone());
        self.recorder.emit(SessionEventKind::TurnStarted {
            turn_id: turn_id.to_string(),
            prompt: text,
            origin,
            prompt_id: queued.as_ref().map(ToString::to_string),
            steer_of: steer_of.map(|turn| turn.to_string()),
        });
        let event_seq = self.recorder.flush_turn_start();
        self.conversation.turn = Some(Turn {
            id: turn_id.clone(),
            cancel_at: None,
            deadline: self
                .profile
                .process
                .turn_timeout_ms
                .map(|ms| Instant::now() + std::time::Duration::from_millis(ms)),
            usage: crate::store::TurnUsage::default(),
            heard: false,
        });
        self.conversation.quiet_again(false);
        self.set_state(SessionState::Running, None, Some(task_state::IN_PROGRESS)).await?;
        if let Some(seq) = event_seq
            && let Err(err) = self.context.store.set_turn_event_seq(turn_id.clone(), seq).await
        {
            // Only a page's way into the turn is missing: it opens the session as before.
            tracing::warn!(session = %self.row.id, %err, "cannot note where a turn starts");
        }
        self.update_view(|view| view.turn_id = Some(turn_id.clone()));
        self.conversation
            .pending
            .insert(request_id.to_string(), Pending::Prompt { turn_id: turn_id.clone(), injected });
        Ok((turn_id, message))
    }

    /// A line the agent wrote on stderr while it is quiet, cut to `QUIET_STDERR_CHARS`.
    /// While it starts, the line is the detail of the launch step it waits in (a
    /// `progress` event of that step, "the agent says: …", which clients show as that
    /// step's one line, updated: claude-agent-acp prints a dozen debug lines at every
    /// resume), at most `MAX_QUIET_STDERR` per execution. While a turn has produced
    /// nothing yet (an agent retrying a refused request says nothing else for minutes), it
    /// is a notice, at most `MAX_QUIET_STDERR` per turn.
    pub(in crate::session) fn stderr_while_quiet(&mut self, line: &str) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        let said =
            || format!("the agent says: {}", crate::history::excerpt(line, QUIET_STDERR_CHARS));
        if let Some(step) = self.stage.launch_step() {
            // Counted per execution: its generation keys the count (a turn's start, or
            // another execution's first line, begins a new one).
            if self.conversation.show_starting_stderr(self.recorder.generation()) {
                self.recorder.progress(step, Some(said()));
            }
            return;
        }
        let starting = matches!(self.phase(), Phase::Launching | Phase::Opening);
        if !self.conversation.show_quiet_stderr(starting) {
            return;
        }
        self.recorder.emit(SessionEventKind::Notice { message: said() });
    }

    pub(in crate::session) async fn cancel(&mut self) -> Result<(), SessionError> {
        let Some(turn) = self.conversation.turn.as_mut() else {
            return Err(SessionError::InvalidState("no turn is running".into()));
        };
        // The agent ends the turn with `cancelled`; if it does not, we do.
        turn.cancel_at.get_or_insert(Instant::now() + CANCEL_GRACE);
        // (A turn runs only on an open ACP session.)
        if let Some(acp_session) = self.view_tx.borrow().acp_session_id.clone() {
            self.send(Outgoing::Acp(json!({
                "jsonrpc": "2.0",
                "method": protocol::acp::method::SESSION_CANCEL,
                "params": requests::cancel(&acp_session),
            })));
        }
        self.cancel_pending_permissions().await;
        Ok(())
    }

    pub(in crate::session) async fn cancel_pending_permissions(&mut self) {
        let pending =
            self.context.store.list_pending(self.row.id.clone()).await.unwrap_or_default();
        for (request_id, method, _) in pending {
            if self.conversation.answering.contains_key(&request_id) {
                continue;
            }
            if let Err(err) = self
                .answer_permission(&request_id, &method, crate::session::cancelled_answer(&method))
                .await
            {
                tracing::warn!(session = %self.row.id, %err, "cannot cancel a permission request");
            }
        }
    }

    /// The agent withdrew a question of its own (`$/cancel_request` of its request): it
    /// resolves as cancelled, and nothing is sent back (the agent wants no answer).
    pub(in crate::session) async fn question_withdrawn(&mut self, agent_id: &Value) {
        let request_id =
            crate::session::permission_request_id(self.recorder.generation(), agent_id);
        let pending = self.context.store.list_pending(self.row.id.clone()).await;
        let Some((_, method, _)) =
            pending.unwrap_or_default().into_iter().find(|(id, _, _)| *id == request_id)
        else {
            return;
        };
        let answer = crate::session::cancelled_answer(&method);
        let outcome = answer.get("outcome").cloned().unwrap_or(answer);
        self.conversation.answering.remove(&request_id);
        self.recorder
            .emit(SessionEventKind::PermissionResolved { request_id: request_id.clone(), outcome });
        self.recorder.flush_events();
        if let Err(err) = self.context.store.delete_pending(self.row.id.clone(), request_id).await {
            self.recorder.write_failed("a withdrawn question", &err);
        }
    }

    /// Queues the answer (`result`, the JSON-RPC result) to a question of the agent (a
    /// permission or an elicitation); its row is deleted (and `permission_resolved`
    /// published) only once it reached agentctl, so an answer cut off by a kill is asked
    /// again after a restart.
    pub(in crate::session) async fn answer_permission(
        &mut self,
        request_id: &str,
        method: &str,
        result: Value,
    ) -> Result<(), SessionError> {
        let pending = self.context.store.list_pending(self.row.id.clone()).await?;
        let Some((_, asked, _)) = pending.iter().find(|(id, _, _)| id == request_id) else {
            return Err(SessionError::NoSuchRequest(request_id.to_owned()));
        };
        if asked != method {
            return Err(SessionError::InvalidParams {
                field: "request_id",
                message: format!("request {request_id} is a {asked} request, not a {method} one"),
            });
        }
        // Asked by this execution's agent (its generation leads the id), or not at all.
        let current = crate::session::permission_request_generation(request_id)
            .is_none_or(|generation| generation == self.recorder.generation());
        if !current || self.conversation.answering.contains_key(request_id) {
            return Err(SessionError::NoSuchRequest(request_id.to_owned()));
        }
        if self.sidecar.execution.as_ref().is_none_or(|execution| !execution.agent_running) {
            return Err(SessionError::AgentGone("the agent that asked is not running".into()));
        }
        let id = crate::session::agent_request_id(request_id);
        agentctl::fault::point("permission.queued");
        self.send(Outgoing::Answer {
            request_id: request_id.to_owned(),
            message: json!({"jsonrpc": "2.0", "id": id, "result": result.clone()}),
        });
        self.conversation.answering.insert(request_id.to_owned(), result);
        Ok(())
    }

    pub(in crate::session) async fn end_turn(
        &mut self,
        state: TurnState,
        stop_reason: Option<String>,
        error: Option<String>,
    ) {
        let Some(Turn { id: turn_id, mut usage, .. }) = self.conversation.end_turn() else {
            return;
        };
        let cancelled = stop_reason.as_deref() == Some("cancelled");
        if self.conversation.queue.halts_after(state, cancelled) {
            let how = match (state, &error) {
                (TurnState::Completed, _) => "was cancelled".to_owned(),
                (_, Some(error)) => format!("failed: {error}"),
                (_, None) => "failed".to_owned(),
            };
            self.halt_queue(format!("turn {turn_id} {how}")).await;
        }
        if usage.context.is_none() {
            usage.context = self.meter.context();
        }
        if state == TurnState::Failed {
            self.recorder.history.mark_cut(error.as_deref().unwrap_or("the turn failed"));
        }
        if let Err(err) = self.recorder.history.flush_agent() {
            self.recorder.write_failed("the history", &err);
        }
        // Events first (the turn's end, then the state it leads to), then one store write
        // for both (see `SessionRecord::end_turn`).
        let waiting = SessionState::WaitingForInput;
        let then = (!self.row.state.is_terminal()
            && (self.row.state != waiting || self.row.error_message != error))
            .then(|| (waiting, error.clone(), Some(task_state::REVIEW)));
        let end =
            TurnEnd { turn_id: turn_id.clone(), state, stop_reason, error, then: then.clone() };
        for kind in end.events() {
            self.recorder.emit(kind);
        }
        self.update_view(|view| view.turn_id = None);
        self.recorder.flush_events();
        let output = (state == TurnState::Completed).then(|| crate::store::TurnOutput {
            text: self.recorder.history.final_message(),
            usage: self.meter.usage().and_then(|usage| {
                let step = protocol::api::StepUsage {
                    context_used: usage.context_used,
                    context_size: usage.context_size,
                    cost: usage.cost,
                    cost_currency: usage.cost_currency.clone(),
                };
                serde_json::to_string(&step).ok()
            }),
        });
        match self.recorder.record.end_turn(end, output, usage.clone()).await {
            Ok(()) => {
                if let Some((state, error, _)) = then {
                    self.row.state = state;
                    self.row.error_message = error.clone();
                    self.update_view(|view| {
                        view.state = state;
                        view.error = error;
                    });
                }
            }
            Err(err) => self.recorder.write_failed("the end of a turn", &err),
        }
        agentctl::fault::point("turn.recorded");
        let per_turn = self.profile.session.usage_totals == UsageReporting::PerTurn;
        crate::session::meter::count_turn(&self.row.agent_profile_id, per_turn, &usage);
        self.check_limits(&usage).await;
        self.checkpoint_in_background(CheckpointTrigger::Turn, Some(turn_id));
        if state == TurnState::Completed {
            self.snapshot_in_background(SnapshotTrigger::TurnComplete, None);
        }
    }

    /// After a re-attach, once the replay has passed what agentctl held when we connected:
    /// a turn whose prompt was never delivered will never end, so it fails now, saying so.
    pub(in crate::session) async fn settle_undelivered(&mut self) {
        self.sidecar.catch_up.until = None;
        if std::mem::take(&mut self.sidecar.catch_up.holding) {
            // Caught up after a stall: the agent's output is taken in again.
            self.send(Outgoing::Hold(false));
        }
        let deferred = std::mem::take(&mut self.sidecar.catch_up.deferred);
        let undelivered: Vec<(String, crate::ids::TurnId)> =
            self.sidecar.catch_up.undelivered.drain().collect();
        let first_prompt = self.unsent_initial_prompt().await;
        let mut queued = std::mem::take(&mut self.sidecar.catch_up.queued);
        for (request_id, turn_id) in undelivered {
            let running = self.conversation.turn_id() == Some(turn_id.as_str());
            // The create's prompt was acknowledged, and a queued prompt's caller was answered
            // `queued`: sent again under the same request, so it runs once and is recorded
            // once. Any other prompt's caller had no answer yet.
            let (prompt, prompt_id) = match queued.remove(&request_id) {
                Some((prompt_id, prompt)) => (Some(prompt), Some(prompt_id)),
                None => (first_prompt.clone(), None),
            };
            if let Some(prompt) = &prompt
                && running
            {
                let resend = Resend {
                    request_id: &request_id,
                    turn_id: &turn_id,
                    prompt_id: prompt_id.clone(),
                };
                if self.resend_prompt(resend, prompt).await {
                    continue;
                }
            }
            if let Some(prompt_id) = &prompt_id {
                // It cannot be sent as it was (a resume context wraps the next prompt): it
                // goes back to the queue's head, as a new queued prompt, and this turn fails.
                self.requeue(prompt_id, prompt.clone().unwrap_or_default()).await;
            }
            self.conversation.pending.remove(&request_id);
            let error =
                "the supervisor stopped before this prompt reached the agent; send it again";
            if self.conversation.turn_id() == Some(turn_id.as_str()) {
                self.end_turn(TurnState::Failed, None, Some(error.into())).await;
            } else if let Err(err) = self
                .context
                .store
                .end_turn(turn_id, TurnState::Failed, None, Some(error.into()))
                .await
            {
                self.recorder.write_failed("the end of a turn", &err);
            }
        }
        self.send_unsent_initial_prompt().await;
        self.cancel_for_waiting_steer().await;
        for (text, reply) in deferred {
            if let Err(err) = self.start_turn(text, Some(reply)).await {
                tracing::debug!(session = %self.row.id, %err, "prompt refused");
            }
        }
    }

    /// Sends a recorded turn's prompt that never reached the agent again, under its own
    /// request id; false when it cannot be (no agent, no ACP session, a resume context).
    /// Its start is written first when a kill came before it was (see `prepare_turn`).
    pub(in crate::session) async fn resend_prompt(
        &mut self,
        Resend { request_id, turn_id, prompt_id }: Resend<'_>,
        prompt: &str,
    ) -> bool {
        let running =
            self.sidecar.execution.as_ref().is_some_and(|execution| execution.agent_running);
        let acp_session = self.view_tx.borrow().acp_session_id.clone();
        let injected = matches!(
            self.conversation.pending.get(request_id),
            Some(Pending::Prompt { injected: true, .. })
        );
        let (Some(acp_session), Ok(id), true, false) =
            (acp_session, request_id.parse::<i64>(), running, injected)
        else {
            return false;
        };
        // With the notes its record tied to it.
        let (_, sent) = self.with_agent_notes(prompt.to_owned(), Some(turn_id)).await;
        let message = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": protocol::acp::method::SESSION_PROMPT,
            "params": requests::prompt(&acp_session, sent),
        });
        tracing::info!(session = %self.row.id, turn = %turn_id, "sending a prompt again: it never reached the agent");
        let recorded = self.recorder.history_tail(REPLAY_WINDOW_BYTES).await.iter().any(|entry| {
            entry.kind == EntryType::UserMessage
                && entry.message_id.as_deref() == Some(turn_id.as_str())
        });
        if !recorded {
            // Killed before the turn's start was written (see `prepare_turn`).
            self.recorder.record_prompt(prompt.to_owned(), turn_id.clone());
            self.recorder.emit(SessionEventKind::TurnStarted {
                turn_id: turn_id.to_string(),
                prompt: prompt.to_owned(),
                origin: PromptOrigin::User,
                prompt_id: prompt_id.map(|id| id.to_string()),
                // (A steer's turn sent again goes without the line on the turn it
                // cancelled: the turn's record keeps only the person's text.)
                steer_of: None,
            });
        }
        self.send(Outgoing::Prompt { message, turn_id: turn_id.to_owned(), reply: None });
        true
    }

    /// The prompt the session was created with (its task's description when it was
    /// created without one), while no prompt of it ever reached an agent: an acknowledged
    /// create runs it exactly once, across kills and failed launches.
    pub(in crate::session) async fn unsent_initial_prompt(&self) -> Option<String> {
        let prompt = self.row.initial_prompt.clone().filter(|prompt| !prompt.trim().is_empty())?;
        match self.context.store.prompt_delivered(self.row.id.clone()).await {
            Ok(false) => Some(prompt),
            Ok(true) => None,
            Err(err) => {
                tracing::error!(session = %self.row.id, %err, "cannot tell whether the initial prompt ran");
                None
            }
        }
    }

    /// After a re-attach settled: a create cut short between the agent's start and its
    /// first prompt's delivery has its prompt sent now (once the replay caught up).
    pub(in crate::session) async fn send_unsent_initial_prompt(&mut self) {
        let ready =
            self.sidecar.execution.as_ref().is_some_and(|execution| execution.agent_running)
                && self.phase() == Phase::Open
                && self.conversation.turn.is_none()
                && self.sidecar.catch_up.until.is_none()
                && self.row.state == SessionState::WaitingForInput;
        if !ready {
            return;
        }
        if let Some(prompt) = self.unsent_initial_prompt().await {
            self.send_initial_prompt(prompt).await;
        }
    }

    /// Sends the prompt a launch sends by itself. Refused, it is said, and recorded: what
    /// waits for it (a workflow step) learns that it will not come, and why.
    pub(in crate::session) async fn send_initial_prompt(&mut self, prompt: String) {
        let err = match self.prepare_turn(prompt, TurnKind::Prompt).await {
            Ok((turn_id, message)) => {
                self.send(Outgoing::Prompt { message, turn_id, reply: None });
                return;
            }
            Err(err) => err,
        };
        self.recorder.emit(SessionEventKind::Notice {
            message: format!("the initial prompt could not be sent: {err}"),
        });
        // Too long for the agent's line: so it would be anywhere. Anything else is about
        // this session (its settings, its agent, its state).
        let lasting = matches!(err, SessionError::InvalidParams { .. });
        let refusal = crate::store::PromptRefusal { reason: err.to_string(), lasting };
        if let Err(err) = self.context.store.refuse_prompt(self.row.id.clone(), refusal).await {
            tracing::error!(session = %self.row.id, %err, "cannot record a refused first prompt");
        }
    }

    pub(in crate::session) fn fail_waiters(&mut self, reason: &str) {
        self.sidecar.drop_replay(reason);
        self.waits.opened(|| Err(SessionError::InvalidState(reason.to_owned())));
    }

    // ---- pauses, the idle park and snapshots --------------------------------------------
    // Pausing at a turn boundary — asked, forced by the context filling up, or by a limit
    // reached at a turn's end (budgets, `max_turns`, `max_duration`) — and snapshots.

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

    /// Moves the session to another runtime (see [`crate::session::relocate`]): only while
    /// no agent of it runs, starts or stops; the runtime is this actor's from then on.
    async fn relocate(
        &mut self,
        to: crate::session::relocate::Destination,
    ) -> Result<crate::session::relocate::Relocated, SessionError> {
        if self.phase() != Phase::Idle
            || self.sidecar.execution.is_some()
            || self.sidecar.teardown.is_some()
        {
            return Err(SessionError::InvalidState(format!(
                "session {}'s agent is running (or starting, or stopping): pause it first, then move it",
                self.row.id
            )));
        }
        let sandbox = self.profile.sandbox_or(self.context.default_sandbox.as_ref());
        let relocated = crate::session::relocate::relocate(
            (&self.context.store, &self.context.checkpoints),
            &self.context.runtime,
            &to,
            &self.row,
            (&self.profile, &sandbox),
            &self.context.dir,
        )
        .await?;
        self.row.runtime = to.runtime.name().to_owned();
        self.row.runtime_labels = to.labels;
        self.context.runtime = to.runtime;
        Ok(relocated)
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
        let trigger = match pause.trigger {
            SnapshotTrigger::Idle => CheckpointTrigger::Park,
            _ => CheckpointTrigger::Pause,
        };
        self.checkpoint_in_background(trigger, None);
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
        let checkpoints = self.context.checkpoints.clone();
        tokio::spawn(async move {
            // After the checkpoint asked for before it (the turn's), which it lists.
            checkpoints.settle(&request.session_id).await;
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

    /// Checkpoints the workspace without holding the actor up (see `checkpoint.rs`); the
    /// next turn waits for it, at most `[checkpoints] wait_ms`.
    pub(in crate::session) fn checkpoint_in_background(
        &self,
        trigger: CheckpointTrigger,
        turn_id: Option<crate::ids::TurnId>,
    ) {
        let request = crate::checkpoint::Request {
            session_id: self.row.id.clone(),
            session_dir: self.context.dir.clone(),
            workspace: std::path::PathBuf::from(&self.row.workspace_path),
            trigger,
            turn_id,
            runtime: Some(Arc::clone(&self.context.runtime)),
        };
        let taken = self.context.checkpoints.spawn(self.context.store.clone(), request);
        let report = self.internal_tx.clone();
        tokio::spawn(async move {
            if let Ok(Some(checkpoint)) = taken.await {
                let _ = report.send(Internal::CheckpointTaken(checkpoint));
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

    // ---- executions: launching, re-attaching, retiring, losing --------------------------
    // Executions: launching, re-attaching, retiring, stopping and losing an agent's
    // sidecar, and recording what a gone sidecar's spool still held.

    pub(in crate::session) async fn stop(&mut self, end: SessionState, reply: Reply<()>) {
        // The end is recorded first: a kill from here on leaves a stopped session whose
        // sidecar recovery kills, never a live session without its stop.
        let recorded = self.set_state(end, None, None).await;
        agentctl::fault::point("stop.recorded");
        if matches!(self.phase(), Phase::Launching | Phase::Reattaching) {
            // Its task reports later; what it brings is retired then.
            self.sidecar.retire_on_landing(None);
        }
        if let Some(execution) = self.sidecar.execution.take() {
            self.retire_open(execution, None, "the session was stopped").await;
        }
        if self.conversation.turn.is_some() && self.sidecar.teardown.is_none() {
            self.end_turn(TurnState::Failed, None, Some("the session was stopped".into())).await;
        }
        self.checkpoint_in_background(CheckpointTrigger::Stop, None);
        self.update_view(|view| view.agent_running = false);
        self.waits.pause = None;
        self.fail_waiters("the session was stopped");
        self.enter(Stage::Ended);
        let _ = reply.send(recorded);
    }

    /// Stops the agent and agentctl; the session stays active and needs a resume. The
    /// caller is answered once the sidecar is gone for certain.
    pub(in crate::session) async fn detach(&mut self, reply: Reply<()>) {
        let in_flight = matches!(self.phase(), Phase::Launching | Phase::Reattaching);
        if in_flight {
            self.sidecar.retire_on_landing(Some(reply));
        } else if let Some(execution) = self.sidecar.execution.take() {
            self.retire_open(execution, Some(reply), "the agent was stopped").await;
        } else {
            let _ = reply.send(Ok(()));
        }
        if self.conversation.turn.is_some() && self.sidecar.teardown.is_none() {
            self.end_turn(TurnState::Failed, None, Some("the agent was stopped".into())).await;
        }
        self.update_view(|view| view.agent_running = false);
        self.fail_waiters("the agent was stopped");
        if !in_flight {
            self.enter(Stage::Idle);
            if self.row.state == SessionState::Starting {
                let _ = self.set_state(SessionState::WaitingForInput, None, None).await;
            }
        }
    }

    /// Stops an execution in the background: politely, then the fence. `reply` (if any)
    /// is answered when it is gone.
    pub(in crate::session) fn retire(&mut self, execution: Execution, reply: Option<Reply<()>>) {
        let context = self.context.clone();
        let grace = std::time::Duration::from_millis(self.profile.process.stop_grace_ms);
        let farewell = self.farewell();
        let Execution { id, record, calls, .. } = execution;
        let store = self.context.store.clone();
        let session_id = self.row.id.clone();
        let retiring = self.context.teardowns.spawn(async move {
            let result = launch::retire(context, calls, record, grace, farewell).await;
            let _ = store.set_execution_status(session_id, id, ExecutionStatus::Stopped).await;
            if let Some(reply) = reply {
                let _ = reply.send(result.map_err(SessionError::InvalidState));
            }
        });
        self.sidecar.keep_retiring(retiring);
    }

    /// The `session/close` an open ACP session of an agent that advertises it gets before
    /// its agent stops (a stop, a pause, a park: it may let go of what it holds). Not
    /// awaited: the agent's input ends right after it, and its answer is of no use.
    fn farewell(&mut self) -> Option<serde_json::Value> {
        let acp_session = self.view_tx.borrow().acp_session_id.clone()?;
        if self.phase() != Phase::Open || !self.choices.settings().close_supported {
            return None;
        }
        let id = self.conversation.take_request_id();
        Some(serde_json::json!({"jsonrpc": "2.0", "id": id,
            "method": protocol::acp::method::SESSION_CLOSE, "params": {"sessionId": acp_session}}))
    }

    /// Fences an execution that is being dropped (lost, refused), in the background.
    pub(in crate::session) fn fence_now(&mut self, record: ExecutionRow) {
        let context = self.context.clone();
        let fencing = self.context.teardowns.spawn(async move {
            if let Err(err) = launch::fence(&context, record, std::time::Duration::ZERO).await {
                tracing::error!(%err, "cannot fence a lost execution");
            }
        });
        self.sidecar.keep_retiring(fencing);
    }

    // ---- launching ----------------------------------------------------------------------

    /// Starts a resume (DESIGN §6.2): A, a token → native restore (or `resume_command`), no
    /// prompt; B, no token and the session was waiting → boot idle; C, otherwise → the
    /// task's description as the initial prompt.
    pub(in crate::session) async fn begin_resume(&mut self) {
        let recorded = self.context.store.get_execution(self.row.id.clone()).await.ok().flatten();
        let mut token = recorded.as_ref().and_then(|recorded| recorded.resume_token.clone());
        if token.is_some() && !self.profile.keeps_resume_token() {
            // The profile has no restore path (any more): the token is useless.
            if let Some(recorded) = &recorded {
                let _ = self
                    .context
                    .store
                    .set_resume_token(self.row.id.clone(), recorded.execution_id.clone(), None)
                    .await;
            }
            token = None;
        }
        // A session paused for exhaustion is handed over to a fresh agent session: a native
        // restore would bring the full context back.
        let rewind =
            self.context.store.rewind_pending(self.row.id.clone()).await.unwrap_or_else(|err| {
                tracing::warn!(session = %self.row.id, %err, "cannot read whether a rewind waits");
                false
            });
        let handoff =
            !rewind && matches!(self.context.store.handoff(self.row.id.clone()).await, Ok(Some(_)));
        if handoff || rewind {
            token = None;
        }
        let relaunch = token.is_some() && self.profile.relaunches_to_resume();
        let initial_prompt = match (self.unsent_initial_prompt().await, &token, self.row.state) {
            // The prompt the session was created with never reached an agent (a launch that
            // failed, a create cut short by a kill): it goes out now, whatever else holds.
            (Some(prompt), _, _) => Some(prompt),
            (None, Some(_), _)
            | (None, None, SessionState::WaitingForInput | SessionState::Paused)
            | (None, None, SessionState::Failed) => None,
            (None, None, _) => match self.context.store.get_task(self.row.task_id.clone()).await {
                Ok(task) if !task.description.trim().is_empty() => Some(task.description),
                _ => None,
            },
        };
        // A fork never opened: its first start forks the original's agent session, or
        // injects the history it was given.
        let fork = match (&token, recorded.is_none()) {
            (None, true) => match self.context.store.fork_of(self.row.id.clone()).await {
                Ok(fork) => fork.map(|fork| fork.native_token),
                Err(err) => {
                    tracing::warn!(session = %self.row.id, %err, "cannot read whether it is a fork");
                    None
                }
            },
            _ => None,
        };
        let resume = ResumeState {
            token: token.clone(),
            relaunched: relaunch,
            native_failed: false,
            fork,
            rewind,
            handoff,
            wake: self.row.state == SessionState::Paused
                && matches!(
                    self.context.store.last_pause(self.row.id.clone()).await,
                    Ok(Some(crate::store::LastPause { trigger: SnapshotTrigger::Idle, .. }))
                ),
        };
        if handoff {
            self.meter.forget_context();
        }
        let relaunch_token = if relaunch { token } else { None };
        self.start_launch(relaunch_token.as_deref(), Launch::new(Some(resume), initial_prompt))
            .await;
    }

    /// Decides the argv and starts the launch task (fence, runtime, agentctl, agent).
    pub(in crate::session) async fn start_launch(
        &mut self,
        resume_token: Option<&str>,
        launch: Launch,
    ) {
        // A new agent: an earlier one's stderr explains nothing of its failures.
        self.conversation.quiet_again(true);
        // An execution still held (an reattached one whose agent died, not yet replayed) is
        // let go first; the launch fences it anyway, and its end must not look like a loss.
        if let Some(execution) = self.sidecar.execution.take() {
            self.retire(execution, None);
        }
        self.enter(Stage::Launching(Box::new(launch)));
        // The previous execution (the one to fence) is read beside the state's write.
        let (store, id) = (self.context.store.clone(), self.row.id.clone());
        let (starting, previous) = tokio::join!(
            self.set_state(SessionState::Starting, None, Some(task_state::IN_PROGRESS)),
            store.get_execution(id)
        );
        if let Err(err) = starting {
            return self.fail(format!("launch failed: {err}")).await;
        }
        agentctl::fault::point("launch.started");
        // In a container the agent's home and programs are the container's.
        let in_container = self.context.runtime.agent_home();
        let home = in_container.clone().unwrap_or_else(|| self.context.agent_home.clone());
        let (argv, resolved) = match launch::agent_argv(
            &self.profile,
            &self.context.resolve,
            resume_token,
            &home,
            in_container.is_some(),
        ) {
            Ok(argvs) => argvs,
            Err(message) => return self.fail(message).await,
        };
        let runtime = self.context.runtime.name();
        self.recorder.progress(LaunchStep::Launching, Some(format!("{} ({runtime})", argv[0])));
        if in_container.is_none()
            && let Some(message) = launch::npx_download_notice(&self.profile, &argv, &home)
        {
            self.recorder.emit(SessionEventKind::Notice { message });
        }
        let previous = previous.ok().flatten();
        let execution_id = uuid::Uuid::now_v7().to_string();
        let seed = launch::seed(&self.context, &self.row, previous.as_ref()).await;
        let spec = launch::spec(
            &self.context,
            &self.row,
            &self.profile,
            // The store gives the execution the same generation when it records it.
            (execution_id.into(), previous.as_ref().map_or(1, |previous| previous.generation + 1)),
            agentctl::client::new_token(),
            launch::ran_here(&self.context, previous.as_ref())
                .and_then(|previous| previous.runtime_handle),
        );
        let spec = crate::runtime::LaunchSpec { seed: Some(seed), ..spec };
        let plan = LaunchPlan {
            spec,
            argv: resolved,
            env: launch::agent_env(&self.profile, &home, in_container.is_some()),
            user: self.profile.process.user.clone(),
            previous,
        };
        // A warm agent launched the same way, if the pool has one (a relaunch with a
        // resume token, and a container, never fit).
        // Nor a confined agent: a warm one was started unconfined.
        let confined = !plan.spec.sandbox.is_host();
        let warm = match (&self.context.pool, &in_container, resume_token) {
            (Some(pool), None, None) if !confined => {
                let user = plan.user.as_deref();
                pool.take(&self.profile.id, &crate::pool::fingerprint(&plan.argv, &plan.env, user))
            }
            _ => None,
        };
        self.conversation.resume_context = None;
        self.conversation.replay = Replay::Off;
        let context = self.context.clone();
        let internal_tx = self.internal_tx.clone();
        let retiring = std::mem::take(&mut self.sidecar.retiring);
        let first = matches!(&self.stage, Stage::Launching(launch) if launch.first);
        let start = first
            .then(|| (self.row.id.clone(), std::path::PathBuf::from(&self.row.workspace_path)));
        self.context.teardowns.spawn(async move {
            for task in retiring {
                let _ = task.await;
            }
            let launching = async {
                match warm {
                    Some(warm) => launch::claim(context.clone(), plan, warm).await,
                    None => launch::launch(context.clone(), plan).await,
                }
            };
            // The workspace's commit is read while the agent starts (before it can change
            // anything: no prompt reaches it until it is open) and written once the launch
            // is reported, off the way to ready.
            let (launched, commit) = tokio::join!(launching, async {
                match &start {
                    Some((_, workspace)) => Some((
                        crate::snapshot::git::head(workspace).await,
                        crate::snapshot::git::dirty(workspace).await,
                    )),
                    None => None,
                }
            });
            let launched = Box::new(launched);
            if let Err(mpsc::error::SendError(Internal::Launched(launched))) =
                internal_tx.send(Internal::Launched(launched))
                && let Ok(connected) = *launched
            {
                // The actor is gone: nobody owns this execution.
                if let Err(err) =
                    launch::fence(&context, connected.record, std::time::Duration::ZERO).await
                {
                    tracing::error!(%err, "cannot fence an unowned execution");
                }
            }
            if let (Some((session_id, _)), Some((commit, dirty))) = (start, commit)
                && let Err(err) = context.store.set_start_commit(session_id, commit, dirty).await
            {
                tracing::debug!(%err, "cannot record the start commit");
            }
        });
    }

    pub(in crate::session) fn start_reattach(
        &mut self,
        plan: ReattachPlan,
        primed_session: Option<String>,
    ) {
        self.enter(Stage::Reattaching { primed_session });
        let internal_tx = self.internal_tx.clone();
        let context = self.context.clone();
        self.context.teardowns.spawn(async move {
            let reattached = Box::new(if plan.gone {
                Ok(launch::reattach_gone(&context, plan.execution))
            } else {
                launch::reattach(context.clone(), plan.addr, plan.execution).await
            });
            if let Err(mpsc::error::SendError(Internal::Reattached(reattached))) =
                internal_tx.send(Internal::Reattached(reattached))
                && let Ok(connected) = *reattached
            {
                // The actor is gone: nobody owns this execution.
                if let Err(err) =
                    launch::fence(&context, connected.record, std::time::Duration::ZERO).await
                {
                    tracing::error!(%err, "cannot fence an unowned execution");
                }
            }
        });
        self.expect_open_turns(plan.open_turns);
    }

    /// The turns the store holds open for an execution being re-attached to (or whose dead
    /// spool is read): their answers are awaited under their request ids.
    pub(in crate::session) fn expect_open_turns(
        &mut self,
        open_turns: Vec<crate::store::OpenTurn>,
    ) {
        for open in open_turns {
            let turn_id = open.turn_id;
            if !open.delivered {
                self.sidecar.catch_up.undelivered.insert(open.request_id.clone(), turn_id.clone());
                if let Some(queued) = open.queued {
                    self.sidecar.catch_up.queued.insert(open.request_id.clone(), queued);
                }
            }
            self.conversation.pending.insert(
                open.request_id,
                Pending::Prompt { turn_id: turn_id.clone(), injected: false },
            );
            self.conversation.turn = Some(Turn {
                id: turn_id,
                cancel_at: None,
                deadline: None,
                usage: crate::store::TurnUsage::default(),
                heard: true,
            });
        }
    }

    pub(in crate::session) async fn launched(
        &mut self,
        launched: Result<Connected, LaunchFailure>,
    ) {
        let connected = match launched {
            Ok(connected) => connected,
            Err(failure) => {
                if matches!(self.sidecar.after_launch, AfterLaunch::Retire(_)) {
                    if let Some(reply) = self.sidecar.stop_after_launch() {
                        let _ = reply.send(Ok(()));
                    }
                    if self.phase() != Phase::Ended {
                        self.enter(Stage::Idle);
                        let _ = self.set_state(SessionState::WaitingForInput, None, None).await;
                    }
                    return;
                }
                return self.fail(format!("launch failed: {}", failure.reason)).await;
            }
        };
        let mut connected = connected;
        let warm = connected.warm.take();
        let mut execution = Execution::new(connected, true, &self.internal_tx);
        execution.primed_session = warm.as_ref().and_then(|warm| warm.primed.clone());
        if matches!(self.sidecar.after_launch, AfterLaunch::Retire(_)) {
            // Stopped or detached while launching.
            let reply = self.sidecar.stop_after_launch();
            self.retire(execution, reply);
            if self.phase() != Phase::Ended {
                self.enter(Stage::Idle);
                let _ = self.set_state(SessionState::WaitingForInput, None, None).await;
            }
            return;
        }
        // A new execution starts a new agentctl sequence: nothing of it was recorded yet
        // (and nothing of it is held); a warm agent's starts after its `initialize`.
        self.recorder.durability = match &warm {
            Some(warm) => Durability::resuming_at(warm.acked, 0, 0),
            None => Default::default(),
        };
        self.sidecar.catch_up.holding = false;
        self.conversation.replay = Replay::Off;
        self.recorder.generation = Some(execution.record.generation);
        self.recorder.history.set_generation(execution.record.generation);
        self.sidecar.execution = Some(execution);
        self.update_view(|view| view.agent_running = true);
        let launch = match std::mem::replace(&mut self.stage, Stage::Idle) {
            Stage::Launching(launch) => *launch,
            // (Only a launch lands here.)
            _ => Launch::new(None, None),
        };
        let (warm, refill) = match warm {
            Some(warm) => (Some(warm.init), warm.refill),
            None => (None, None),
        };
        self.enter(Stage::Opening(Box::new(Opening {
            launch,
            step: None,
            auth_offered: Vec::new(),
            auth_terminal: Vec::new(),
            load_offered: false,
            authenticated: false,
            _refill: refill,
        })));
        match warm {
            // Initialized before the session asked: on to the ACP session.
            Some(init) => {
                let detail = Some("warm: the agent was started ahead".to_owned());
                self.recorder.progress(LaunchStep::Initializing, detail);
                self.initialized(init).await;
            }
            None => {
                self.recorder.progress(LaunchStep::Initializing, None);
                let params = crate::sidecar::initialize_params(&self.profile);
                self.request(protocol::acp::method::INITIALIZE, params, Pending::Initialize);
            }
        }
    }

    pub(in crate::session) async fn reattached(&mut self, reattached: Result<Connected, String>) {
        if matches!(self.sidecar.after_launch, AfterLaunch::Retire(_)) {
            // Stopped or detached while re-attaching: what was found is retired (or fenced).
            let reply = self.sidecar.stop_after_launch();
            match reattached {
                Ok(connected) => {
                    let execution = Execution::new(connected, false, &self.internal_tx);
                    self.retire(execution, reply);
                }
                Err(_) => {
                    if let Ok(Some(record)) =
                        self.context.store.get_execution(self.row.id.clone()).await
                    {
                        self.fence_now(record);
                    }
                    if let Some(reply) = reply {
                        let _ = reply.send(Ok(()));
                    }
                }
            }
            if self.phase() != Phase::Ended {
                self.conversation.pending.clear();
                self.conversation.turn = None;
                self.enter(Stage::Idle);
            }
            return;
        }
        let connected = match reattached {
            Ok(connected) => connected,
            Err(err) => return self.reattach_failed(err).await,
        };
        let status = connected.status.clone();
        let record = connected.record.clone();
        let mut execution = Execution::new(connected, false, &self.internal_tx);
        if let Stage::Reattaching { primed_session } = &mut self.stage {
            execution.primed_session = primed_session.take();
        }
        let running = status
            .as_ref()
            .is_some_and(|s| s.agent_state == protocol::control::AgentState::Running);
        let acked = record.acked_seq.max(0) as u64;
        // Marks count only for the execution they were written for.
        let events_mark = self.recorder.record.events_mark(record.generation);
        let history_mark = self.recorder.history.mark_for(record.generation);
        tracing::debug!(
            session = %self.row.id,
            generation = record.generation,
            acked,
            history_mark,
            events_mark,
            last_seq = ?status.as_ref().map(|status| status.last_seq),
            "re-attached to agentctl"
        );
        self.recorder.durability = Durability::resuming_at(acked, history_mark, events_mark);
        self.recorder.generation = Some(record.generation);
        self.recorder.history.set_generation(record.generation);
        self.conversation.resume_context =
            record.resume_context_pending.then_some(match record.resume_outcome {
                Some(ResumeOutcome::ContextHandoff) => ResumeContext::Handoff,
                Some(ResumeOutcome::NativeLoad | ResumeOutcome::NativeResume) => {
                    ResumeContext::Drift
                }
                _ => ResumeContext::History,
            });
        self.sidecar.execution = Some(Execution { agent_running: running, ..execution });
        let turn_id = self.conversation.turn_id().map(str::to_owned);
        self.update_view(|view| {
            view.agent_running = running;
            view.acp_session_id = record.acp_session_id.clone();
            view.turn_id = turn_id.map(Into::into);
            view.resume_outcome = record.resume_outcome;
        });
        if !self.sidecar.catch_up.holding && running {
            // A hold a stalled predecessor (killed since) asked for ends here.
            self.send(Outgoing::Hold(false));
        }
        match status.as_ref().map(|status| status.last_seq) {
            Some(until) if until > acked => self.sidecar.catch_up.until = Some(until),
            _ => self.settle_undelivered().await,
        }
        self.enter(Stage::Open);
        // A pause asked for before the restart still holds (its turn may still run).
        if let Ok(Some(request)) = self.context.store.get_pause(self.row.id.clone()).await {
            let left = request.force_at.saturating_sub(crate::store::now_ms()).max(0);
            // A summary not yet asked for waits as long as the pause was asked to.
            let asked = request.force_at.saturating_sub(request.requested_at).max(0);
            self.waits.pause = Some(PendingPause {
                reason: request.reason,
                force_at: Some(Instant::now() + std::time::Duration::from_millis(left as u64)),
                forced: false,
                trigger: request.trigger,
                wait: std::time::Duration::from_millis(asked as u64),
                summary: match request.summary_asked_at {
                    Some(at) => SummaryStep::Asked(at),
                    None => SummaryStep::NotAsked,
                },
            });
            self.update_view(|view| view.pause_requested = true);
        }
        // Killed after the ACP session opened and before the store said so: the state is
        // completed now (published again if it was already; the same state twice is
        // harmless, never is not).
        if self.row.state == SessionState::Starting
            && let Err(err) =
                self.set_state(SessionState::WaitingForInput, None, Some(task_state::REVIEW)).await
        {
            tracing::error!(session = %self.row.id, %err, "cannot record the session state");
        }
        self.waits.opened(|| Ok(ResumeOutcome::AlreadyRunning));
        // People may still answer what the agent asked before the restart.
        if let Ok(pending) = self.context.store.list_pending(self.row.id.clone()).await {
            for (request_id, method, params) in pending {
                self.recorder.emit(crate::session::question_event(&method, request_id, params));
            }
        }
        self.send_unsent_initial_prompt().await;
    }

    /// The resume context around `prompt`, from the history on disk.
    pub(in crate::session) async fn resume_context(
        &self,
        prompt: &str,
    ) -> Result<String, SessionError> {
        let mut latest = self.context.store.latest_snapshot(self.row.id.clone()).await?;
        let rewinds = self.context.store.rewinds(self.row.id.clone()).await?;
        let rewound = crate::rewind::Injected::of(&rewinds, latest.as_ref().map(|s| s.taken_at));
        if rewound.stale_snapshot {
            // Taken before the newest rewind: it tells of turns no longer in the conversation.
            latest = None;
        }
        let workspace = std::path::Path::new(&self.row.workspace_path);
        let drift = match &latest {
            Some(snapshot) => {
                crate::snapshot::git::drift(workspace, &snapshot.git, &snapshot.snapshot_id).await
            }
            None => None,
        };
        if self.conversation.resume_context == Some(ResumeContext::Drift) {
            return Ok(match drift {
                Some(drift) => format!(
                    "{}\n\n=== CURRENT REQUEST ===\n{prompt}",
                    crate::snapshot::drift_section(Some(&drift)).trim_start()
                ),
                None => prompt.to_owned(),
            });
        }
        // A handoff without a snapshot to compile from: the history it would summarise.
        if self.conversation.resume_context == Some(ResumeContext::Handoff)
            && let Some(snapshot) = latest
        {
            let budget = self.profile.session.resume_context_budget;
            return Ok(crate::snapshot::handoff_context(&snapshot, prompt, budget, drift.as_ref()));
        }
        let path = self.recorder.history.path().to_owned();
        let prompt = prompt.to_owned();
        let budget = self.profile.session.resume_context_budget;
        let after = match self.conversation.resume_context {
            Some(ResumeContext::Missing { after }) => Some(after),
            _ => None,
        };
        let built = tokio::task::spawn_blocking(move || {
            let plan = match rewound.stale_snapshot {
                true => Vec::new(),
                false => crate::history::last_plan(&path).map(|(_, plan)| plan).unwrap_or_default(),
            };
            let (head, tail) =
                crate::snapshot::injected_sections(latest.as_ref(), &plan, drift.as_ref(), budget);
            let head = format!("{}{head}", rewound.note);
            let mut file = std::fs::File::open(&path)?;
            let window = (after, rewound.skip.as_slice());
            crate::resume_context::build_after(&mut file, &prompt, budget, window, (&head, &tail))
        })
        .await
        .map_err(|err| SessionError::InvalidState(format!("building the resume context: {err}")))?
        .map_err(|err| SessionError::InvalidState(format!("reading the history: {err}")))?;
        Ok(built.text)
    }

    /// The execution is gone (its agent exited, its sidecar was lost or refused us): the
    /// agent's questions are void, a running turn fails, and the session waits for input
    /// with the reason, recoverable.
    pub(in crate::session) async fn execution_gone(&mut self, reason: &str, turn_ends: TurnState) {
        self.sidecar.drop_replay(reason);
        self.update_view(|view| view.agent_running = false);
        self.void_pending().await;
        if self.conversation.turn.is_some() {
            self.end_turn(turn_ends, None, Some(reason.to_owned())).await;
        }
        if self.row.state.is_terminal() {
            // The end of a stopped session's teardown: it stays as it was ended.
            return;
        }
        self.set_state_or_stall(
            SessionState::WaitingForInput,
            Some(reason.to_owned()),
            Some(task_state::REVIEW),
        )
        .await;
        let _ = self.context.store.log_error(self.row.id.clone(), reason.to_owned()).await;
        self.snapshot_in_background(SnapshotTrigger::Crash, Some(reason.to_owned()));
    }

    /// agentctl itself went away, stopped answering, or refused our subscription. It is
    /// fenced (nothing may run unowned), then what its spool holds beyond what was handled
    /// is recorded, then the execution's open work is void.
    pub(in crate::session) async fn lost(&mut self, reason: String) {
        let mut reason = reason;
        let Some(execution) = self.sidecar.execution.take() else { return };
        if !execution.gone {
            // (A dead sidecar's replay ends this way too: that loss was said at recovery.)
            tracing::warn!(session = %self.row.id, %reason, "agentctl is lost");
        }
        if let Some(why) = self.context.runtime.exit_reason(&execution.record).await {
            reason = format!("{reason}: {why}");
        }
        let _ = self
            .context
            .store
            .set_execution_status(self.row.id.clone(), execution.id.clone(), ExecutionStatus::Lost)
            .await;
        if matches!(self.phase(), Phase::Opening | Phase::Launching) {
            self.fence_now(execution.record.clone());
            drop(execution);
            return self.fail(reason).await;
        }
        if self.recorder.stall.is_some() && !execution.gone && !self.row.state.is_terminal() {
            // Nothing handled since the stall is durable: the sidecar is fenced now, the
            // rest (its spool from what was acknowledged, its open work, the state) is
            // written at the stall's next try.
            if let Err(err) =
                launch::fence(&self.context, execution.record, std::time::Duration::ZERO).await
            {
                tracing::error!(session = %self.row.id, %err, "cannot fence a lost execution");
            }
            return self.defer_loss(reason);
        }
        // Its turn was cut by the supervisor's own downtime (its spool replayed at
        // recovery), or by the sidecar's loss now.
        let mut turn_ends = TurnState::Failed;
        if execution.gone {
            // A stop cut short by a kill, finished at recovery, or a loss while down.
            reason = if self.row.state.is_terminal() {
                "the session was stopped".into()
            } else {
                crate::session::STOPPED_WHILE_DOWN.into()
            };
            turn_ends = TurnState::Interrupted;
        } else {
            // Its spool is read once nothing writes it any more.
            let Execution { id, record, .. } = execution;
            match launch::fence(&self.context, record.clone(), std::time::Duration::ZERO).await {
                Ok(()) => {
                    let dir = leftovers::spool_dir(&self.context.state_dir_of(&record));
                    let events = leftovers::read(dir, self.recorder.durability.handled);
                    if let Some(exit) = self.record_leftovers(id, record, events).await {
                        reason = exit;
                    }
                }
                Err(err) => {
                    tracing::error!(session = %self.row.id, %err, "cannot fence a lost execution")
                }
            }
            if self.recorder.stall.is_some() && !self.row.state.is_terminal() {
                // Its spool could not all be recorded: the rest first, at the next try.
                return self.defer_loss(reason);
            }
        }
        self.enter(Stage::Idle);
        self.execution_gone(&reason, turn_ends).await;
        if self.row.state.is_terminal() {
            // A stopped session's teardown, finished: nothing more to own.
            return self.enter(Stage::Ended);
        }
        // Anyone who asked for a resume meanwhile gets one now.
        if self.waits.anyone_waits_for_open() {
            self.begin_resume().await;
        }
    }

    /// A re-attach failed: the sidecar died, hangs, or refused us. It is fenced, then what
    /// its spool holds beyond what was acknowledged is recorded (as for a sidecar lost while
    /// attached), then its open work is void and the session waits, resumable.
    async fn reattach_failed(&mut self, err: String) {
        tracing::warn!(session = %self.row.id, %err, "cannot re-attach to agentctl");
        let mut reason = format!("could not re-attach to the agent: {err}");
        let record = self.context.store.get_execution(self.row.id.clone()).await.ok().flatten();
        if let Some(record) = record {
            match launch::fence(&self.context, record.clone(), std::time::Duration::ZERO).await {
                Ok(()) => {
                    if let Some(exit) = self.record_spool_of_gone(record.clone()).await {
                        reason = format!("{reason}; {exit}");
                    }
                }
                Err(err) => {
                    tracing::error!(session = %self.row.id, %err, "cannot fence an execution it could not re-attach to")
                }
            }
            let _ = self
                .context
                .store
                .set_execution_status(
                    self.row.id.clone(),
                    record.execution_id,
                    ExecutionStatus::Dead,
                )
                .await;
        }
        self.conversation.pending.clear();
        self.conversation.turn = None;
        self.update_view(|view| view.turn_id = None);
        if self.recorder.stall.is_some() && !self.row.state.is_terminal() {
            return self.defer_loss(reason);
        }
        // Its turns interrupted and its questions void, as recovery ends a dead execution's
        // work (after what this actor published so far).
        self.recorder.flush_events();
        self.conversation.answering.clear();
        if let Err(err) =
            self.recorder.record.void_open_work(&reason, Vec::new(), self.recorder.mark()).await
        {
            self.recorder.write_failed("interrupted turns", &err);
        }
        self.enter(Stage::Idle);
        self.execution_gone(&reason, TurnState::Failed).await;
        // Anyone who asked for a resume meanwhile gets one now.
        if self.waits.anyone_waits_for_open() {
            self.begin_resume().await;
        }
    }

    /// Ends a loss (its sidecar fenced) while writes fail: nothing more can be written now,
    /// so the rest of its spool, its open work's end and the state it leaves follow, in
    /// that order, at the stall's next try (`finish_loss`). Until then the session is idle,
    /// its agent gone, the stall's reason shown.
    fn defer_loss(&mut self, reason: String) {
        self.sidecar.drop_replay(&reason);
        self.conversation.pending.clear();
        self.conversation.turn = None;
        self.conversation.answering.clear();
        self.enter(Stage::Idle);
        self.update_view(|view| {
            view.turn_id = None;
            view.agent_running = false;
        });
        if let Some(stall) = self.recorder.stall.as_mut() {
            stall.unwritten_state = Some(UnwrittenState {
                state: SessionState::WaitingForInput,
                error: Some(reason.clone()),
                task: Some(task_state::REVIEW),
            });
            stall.deferred_loss = Some(reason);
        }
    }

    /// Records what the spool of an execution whose sidecar is gone (fenced) holds beyond
    /// what was acknowledged, from where the history and the event log left off (their
    /// marks: nothing is recorded twice). Returns why the agent exited, when the spool says.
    pub(in crate::session) async fn record_spool_of_gone(
        &mut self,
        record: ExecutionRow,
    ) -> Option<String> {
        let state_dir = self.context.state_dir_of(&record);
        if !leftovers::spool_is_of(&state_dir, &record) {
            return None;
        }
        let acked = record.acked_seq.max(0) as u64;
        let history_mark = self.recorder.history.mark_for(record.generation);
        let events_mark = self.recorder.record.events_mark(record.generation);
        self.recorder.durability = Durability::resuming_at(acked, history_mark, events_mark);
        self.recorder.generation = Some(record.generation);
        self.recorder.history.set_generation(record.generation);
        let events = leftovers::read(leftovers::spool_dir(&state_dir), acked);
        let exit = self.record_leftovers(record.execution_id.clone(), record, events).await;
        // No answer ends its turn: the message being coalesced is the last of it. (Not
        // acknowledged: the marks keep a later read of this spool from recording it again.)
        if self.recorder.stall.is_none()
            && let Err(err) = self.recorder.history.flush_agent()
        {
            self.recorder.write_failed("the history", &err);
        }
        exit
    }

    /// Records what the spool of an execution whose sidecar is gone (fenced or retired)
    /// holds beyond the last event handled, through the same handling as live events, and
    /// acknowledges it. Returns why the agent exited, when the spool says so (its exit is
    /// the caller's to handle: a stop ends the turn its own way).
    pub(in crate::session) async fn record_leftovers(
        &mut self,
        id: crate::ids::ExecutionId,
        record: ExecutionRow,
        events_rx: crate::sidecar::EventsRx,
    ) -> Option<String> {
        let calls: Arc<dyn Control> = Arc::new(leftovers::DeadSidecar);
        let outbox = outbox::start_outbox(id.clone(), Arc::clone(&calls), self.internal_tx.clone());
        self.sidecar.execution = Some(Execution {
            id,
            record,
            calls,
            outbox,
            events_rx,
            agent_running: false,
            gone: true,
            primed_session: None,
        });
        let mut exit = None;
        let mut in_burst = 0;
        while let Some(execution) = self.sidecar.execution.as_mut() {
            if self.recorder.stall.is_some() {
                // Not acknowledged: read again at the next try (the spool stays).
                break;
            }
            let Some(Ok(event)) = execution.events_rx.recv().await else { break };
            // The agent's end is the caller's to handle (a stop ends the turn its own way).
            match event.kind {
                EventKind::AgentExited { status, stderr_tail } => {
                    self.recorder.durability.handled = event.seq;
                    exit = Some(crate::session::acp::explain::exit_reason(
                        status,
                        &stderr_tail,
                        &self.profile,
                        self.context.runtime.agent_home().is_some(),
                    ));
                }
                EventKind::StdoutClosed => self.recorder.durability.handled = event.seq,
                _ => self.handle_agent_event(*event).await,
            }
            in_burst += 1;
            if in_burst == AGENT_EVENT_BURST {
                in_burst = 0;
                self.recorder.flush_events();
            }
        }
        self.ack(true).await;
        self.recorder.flush_events();
        self.sidecar.execution = None;
        exit
    }

    /// Retires an execution on a stop or detach: an open one is stopped in the background
    /// and what its spool still held is recorded when that is done (see
    /// [`Internal::Retired`]), then its turn ends with `turn_error`; one still shaking
    /// hands has nothing to record. `reply` is answered once it is gone.
    pub(in crate::session) async fn retire_open(
        &mut self,
        execution: Execution,
        reply: Option<Reply<()>>,
        turn_error: &'static str,
    ) {
        if execution.gone {
            // A dead sidecar's spool being replayed: the rest of it is recorded first.
            let Execution { id, record, events_rx, .. } = execution;
            self.record_leftovers(id, record, events_rx).await;
            if let Some(reply) = reply {
                let _ = reply.send(Ok(()));
            }
            return;
        }
        if self.phase() != Phase::Open {
            return self.retire(execution, reply);
        }
        let after = self.recorder.durability.handled;
        let dir = leftovers::spool_dir(&self.context.state_dir_of(&execution.record));
        let (id, record) = (execution.id.clone(), execution.record.clone());
        let (gone_tx, gone) = tokio::sync::oneshot::channel();
        self.retire(execution, Some(gone_tx));
        self.sidecar.teardown = Some(Teardown { reply, turn_error });
        let report = self.internal_tx.clone();
        self.context.teardowns.spawn(async move {
            let result = gone.await.unwrap_or(Ok(()));
            // Read before anything else may start a sidecar (and its fresh spool) there:
            // a launch waits for the retire, and the actor for this report.
            let leftovers = tokio::task::spawn_blocking(move || leftovers::read_all(&dir, after))
                .await
                .unwrap_or_default();
            let retired = Retired { id, record, result, leftovers };
            let _ = report.send(Internal::Retired(Box::new(retired)));
        });
    }

    /// A retire of [`SessionActor::retire_open`] is done: what the spool held is recorded,
    /// the turn ends, and the stop or detach is answered.
    pub(in crate::session) async fn retired(&mut self, retired: Retired) {
        let Retired { id, record, result, leftovers } = retired;
        let Some(teardown) = self.sidecar.teardown.take() else { return };
        let (tx, events) = mpsc::channel(leftovers.len().max(1));
        for event in leftovers {
            let _ = tx.try_send(Ok(Box::new(event)));
        }
        drop(tx);
        self.record_leftovers(id, record, events).await;
        // The agent that asked is gone: its questions are void.
        self.void_pending().await;
        if self.conversation.turn.is_some() {
            self.end_turn(TurnState::Failed, None, Some(teardown.turn_error.into())).await;
        }
        if let Some(reply) = teardown.reply {
            let _ = reply.send(result);
        }
        // Anyone who asked for a resume meanwhile gets one now.
        if self.phase() != Phase::Ended && self.waits.anyone_waits_for_open() {
            self.begin_resume().await;
        }
    }

    /// Retires an execution and waits until its sidecar is gone, then records what its
    /// spool still held: what the agent emitted until it exited is kept, whatever ended it.
    pub(in crate::session) async fn retire_and_record(
        &mut self,
        execution: Execution,
    ) -> Result<(), SessionError> {
        let (id, record) = (execution.id.clone(), execution.record.clone());
        let (gone_tx, gone) = tokio::sync::oneshot::channel();
        self.retire(execution, Some(gone_tx));
        let retired = gone.await.unwrap_or(Ok(()));
        let events = leftovers::read(
            leftovers::spool_dir(&self.context.state_dir_of(&record)),
            self.recorder.durability.handled,
        );
        self.record_leftovers(id, record, events).await;
        retired
    }

    /// A launch failure: session and task `FAILED` with the reason; the execution is
    /// retired (and fenced). The session leaves its starting phase first: whoever is told
    /// of the stored failure (the workflow driver reads the view on that announcement)
    /// never sees a launch that is over as still going.
    pub(in crate::session) async fn fail(&mut self, reason: String) {
        tracing::warn!(session = %self.row.id, %reason, "session failed");
        if let Some(execution) = self.sidecar.execution.take() {
            self.retire(execution, None);
        }
        self.update_view(|view| view.agent_running = false);
        self.enter(Stage::Ended);
        let _ = self.context.store.log_error(self.row.id.clone(), reason.clone()).await;
        if self.conversation.turn.is_some() {
            self.end_turn(TurnState::Failed, None, Some(reason.clone())).await;
        }
        let _ = self
            .set_state(SessionState::Failed, Some(reason.clone()), Some(task_state::FAILED))
            .await;
        if self.conversation.queue.halts_after_failed_launch() {
            self.halt_queue(format!("the agent did not start ({reason})")).await;
        }
        self.fail_waiters(&reason);
    }

    // ---- the ACP client: the agent's events, answers and handshake ----------------------
    // The ACP client side of the actor: agentctl events in, history and session events out;
    // responses matched to our requests; the resume ladder after `initialize`. Results are
    // parsed with the pinned ACP schema crate (`protocol::acp::schema`), tolerantly: a
    // result that does not fit the schema (a newer agent) is kept raw and read for the one
    // field needed, never a reason to fail the session.

    pub(super) async fn handle_agent_event(&mut self, event: Event) {
        if let EventKind::IntakeStalled { reason } = event.kind {
            // Outside the sequence: nothing to record or acknowledge, only to say.
            return self.agentctl_stalled(reason);
        }
        if let EventKind::BacklogFull = event.kind {
            // agentctl's spool is at its bound and the agent waits: what is handled is
            // made durable and acknowledged now (a message being coalesced included).
            if let Err(err) = self.recorder.history.flush_agent() {
                self.recorder.write_failed("the history", &err);
            }
            // Again once what is still in flight is handled (the notice may overtake it).
            self.conversation.replay_unacked = true;
            return self.ack(true).await;
        }
        if event.seq == 0 {
            // Outside the sequence too (a damaged spool line, said where it was).
            if let EventKind::Error { message } = event.kind {
                self.recorder.emit(SessionEventKind::Notice { message });
            }
            return;
        }
        let seq = event.seq;
        crate::metrics::get().relayed_events.inc();
        self.recorder.durability.handled = event.seq;
        self.recorder.durability.unacked += 1;
        // After a restart, replayed events that were already recorded are not recorded
        // again (their effects on the store are idempotent).
        self.recorder.recorded = Recorded {
            history: self.recorder.durability.in_history(event.seq),
            events: self.recorder.durability.in_events(event.seq),
        };
        if !self.recorder.recorded.history {
            self.recorder.history.set_watermark(event.seq);
        }
        let force_ack = match event.kind {
            EventKind::Acp { message, answered: None }
                if self.agent_text_fast(message.get()).await =>
            {
                false
            }
            EventKind::Acp { message, answered } => match serde_json::from_str(message.get()) {
                Ok(message) => self.handle_acp(message, answered.is_some()).await,
                // Valid JSON nested past what a tree holds: no message of ACP's.
                Err(err) => {
                    let message = format!("the agent sent a message that cannot be read: {err}");
                    self.recorder.emit(SessionEventKind::Notice { message });
                    false
                }
            },
            EventKind::AgentExited { status, stderr_tail } => {
                let reason = explain::exit_reason(
                    status,
                    &stderr_tail,
                    &self.profile,
                    self.context.runtime.agent_home().is_some(),
                );
                self.agent_gone(reason).await;
                true
            }
            EventKind::StdoutClosed => {
                let reason =
                    "the agent closed its stdout and can answer nothing more; it was stopped";
                self.agent_gone(reason.into()).await;
                true
            }
            EventKind::StdoutNoise { line, reason } => {
                self.recorder.emit(SessionEventKind::Notice {
                    message: format!("agent output that is not ACP ({reason}): {line}"),
                });
                false
            }
            EventKind::Error { message } => {
                self.recorder.emit(SessionEventKind::Notice { message });
                false
            }
            EventKind::Stderr { line } => {
                self.stderr_while_quiet(&line);
                self.conversation.stderr_line(&line);
                false
            }
            EventKind::Delivered { id } => {
                self.delivered(&id).await;
                false
            }
            EventKind::EgressRefused { target, reason } => {
                crate::metrics::get().egress_refused.inc();
                self.recorder.emit(SessionEventKind::EgressRefused { target, reason });
                false
            }
            EventKind::AgentStarted { .. } => false,
            _ => false,
        };
        self.recorder.recorded = Recorded::default();
        if self.sidecar.catch_up.until.is_some_and(|until| seq >= until) {
            self.settle_undelivered().await;
        }
        // A trailing replay is acknowledged once its burst is through (nothing queued
        // behind it), not one fsync per dropped chunk.
        let replay_done = self.conversation.replay_unacked
            && self
                .sidecar
                .execution
                .as_ref()
                .is_some_and(|execution| execution.events_rx.is_empty());
        if replay_done {
            self.conversation.replay_unacked = false;
        }
        self.ack(force_ack || replay_done).await;
    }

    /// A request of ours reached agentctl: for a prompt, the turn's row says so.
    async fn delivered(&mut self, id: &Value) {
        let key = match id {
            Value::Number(n) => n.to_string(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        self.sidecar.catch_up.undelivered.remove(&key);
        if let Some(Pending::Prompt { turn_id, .. }) = self.conversation.pending.get(&key) {
            // Whatever a load still replays was logged before this prompt.
            if let Replay::Loading(known) = std::mem::take(&mut self.conversation.replay) {
                self.conversation.replay = known.map_or(Replay::Off, Replay::Trailing);
            }
            let turn_id = turn_id.clone();
            if let Err(err) = self.context.store.mark_delivered(turn_id).await {
                self.recorder.write_failed("a delivered prompt", &err);
            }
        }
    }

    /// agentctl cannot write its spool (a full disk): the agent's output is held there, and
    /// status says so until it can again.
    fn agentctl_stalled(&mut self, reason: Option<String>) {
        let held = reason.is_some();
        let error = match reason {
            Some(reason) => Some(format!(
                "agentctl cannot write its spool ({reason}); the agent's output is held, nothing is lost"
            )),
            None => self.row.error_message.clone(),
        };
        self.update_view(|view| view.error = error);
        // Said after the status shows it, so whoever reads the log line finds it there.
        if held {
            tracing::warn!(session = %self.row.id, "agentctl cannot write its spool; the agent's output is held");
        } else {
            tracing::info!(session = %self.row.id, "agentctl writes its spool again");
        }
    }

    /// Handles one ACP message from the agent. Returns whether a turn ended.
    async fn handle_acp(&mut self, message: Value, answered_by_agentctl: bool) -> bool {
        let method = message.get("method").and_then(Value::as_str).map(str::to_owned);
        let id = message.get("id").cloned();
        // The params are moved out of the message, not copied (a chunk's whole tree).
        let params = |mut message: Value| match message.get_mut("params") {
            Some(params) => params.take(),
            None => Value::Null,
        };
        match (method, id) {
            (Some(method), Some(id)) => {
                if !answered_by_agentctl {
                    self.agent_request(method, id, params(message)).await;
                }
                false
            }
            (Some(method), None) => {
                let params = params(message);
                let foreign = (self.sidecar.execution.as_ref())
                    .is_some_and(|execution| execution.is_primed(&params));
                if method == protocol::acp::method::SESSION_UPDATE && !foreign {
                    self.session_update(params);
                    self.settings_updated().await;
                } else if method == protocol::acp::method::CANCEL_REQUEST
                    && !self.recorder.recorded.events
                {
                    self.question_withdrawn(&params["requestId"]).await;
                }
                false
            }
            (None, Some(id)) => self.response(id, message).await,
            (None, None) => false,
        }
    }

    async fn agent_request(&mut self, method: String, id: Value, params: Value) {
        if self.recorder.recorded.events {
            // Handled before the restart (recorded, and possibly answered since).
            return;
        }
        if method == protocol::acp::method::SESSION_REQUEST_PERMISSION
            || method == protocol::acp::method::ELICITATION_CREATE
        {
            self.tool_announced(&params["toolCall"]);
            // Unique for the session's whole life: the agent's id within its execution.
            let request_id = super::permission_request_id(self.recorder.generation(), &id);
            let Some(execution_id) =
                self.sidecar.execution.as_ref().map(|execution| execution.id.clone())
            else {
                return;
            };
            if let Err(err) = self
                .context
                .store
                .insert_pending(
                    self.row.id.clone(),
                    execution_id,
                    request_id.clone(),
                    method.clone(),
                    params.clone(),
                )
                .await
            {
                self.recorder.write_failed("a question of the agent", &err);
            }
            self.recorder.emit(super::question_event(&method, request_id, params));
            return;
        }
        self.send(Outgoing::Acp(json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": -32601, "message": format!("method not found: {method}")},
        })));
    }

    /// A tool call in a permission request: one first heard of here (some agents announce
    /// it no other way) is recorded as a tool call, as a `tool_call` update would be; one
    /// held is named by it (what the agent asks to run is no placeholder).
    fn tool_announced(&mut self, tool_call: &Value) {
        let Some(id) = tool_call["toolCallId"].as_str().filter(|id| !id.is_empty()) else {
            return;
        };
        if let Some(known) = self.conversation.tool_titles.get_mut(id) {
            if let Some(title) = tool_title(tool_call) {
                title.clone_into(&mut known.0);
            }
            return self.tool_call_named(id);
        }
        let title = tool_title(tool_call).unwrap_or("tool").to_owned();
        let status = tool_call["status"].as_str().unwrap_or("pending").to_owned();
        let kind = tool_call["kind"].as_str().unwrap_or_default().to_owned();
        self.conversation
            .tool_titles
            .insert(id.to_owned(), (title.clone(), kind, tool_diffs(tool_call)));
        self.recorder.record_history(
            EntryType::ToolCall,
            title.clone(),
            Some((title, id.to_owned(), status)),
        );
    }

    fn session_update(&mut self, mut params: Value) {
        let update = params.get_mut("update").map(Value::take).unwrap_or(Value::Null);
        let kind =
            update.get("sessionUpdate").and_then(Value::as_str).unwrap_or_default().to_owned();
        if let Replay::Trailing(known) = &self.conversation.replay {
            if known.is_replay(&kind, &update) {
                // The tail of a replay that trails even the next prompt's delivery (gemini
                // under load): it repeats what is recorded, and is dropped like the rest.
                return;
            }
            self.conversation.replay = Replay::Off;
        }
        if matches!(self.conversation.replay, Replay::Loading(_)) && is_replayed_kind(&kind) {
            if let (Some(replayed), "user_message_chunk" | "agent_message_chunk", Some(text)) = (
                self.conversation.replayed_messages.as_mut(),
                kind.as_str(),
                update["content"]["text"].as_str(),
            ) {
                replayed.push_str(text);
            }
            // `session/load` replays the conversation into the agent; we have it already.
            // After the load's answer the session is open and nothing else acknowledges
            // these events soon: were the supervisor killed now, a new actor would not know
            // they are a replay. They hold nothing to write, so they are acknowledged.
            self.conversation.replay_unacked |= !self.conversation.restoring();
            return;
        }
        self.conversation.heard();
        let text = || update["content"]["text"].as_str().map(str::to_owned);
        let message_id = update["messageId"].as_str().map(str::to_owned);
        match kind.as_str() {
            "agent_message_chunk" => {
                if let Some(text) = text() {
                    self.agent_message_chunk(text, message_id);
                }
            }
            "agent_thought_chunk" => {
                if let Some(text) = text() {
                    self.recorder.emit(SessionEventKind::AgentThoughtChunk { text, message_id });
                }
            }
            "tool_call" => self.tool_call(update),
            "tool_call_update" => self.tool_call_update(update),
            "plan" => {
                self.record_plan(plan_entries(&update));
                self.recorder.emit(SessionEventKind::SessionUpdate { update });
            }
            "usage_update" => {
                self.usage_reported(&update);
                self.recorder.emit(SessionEventKind::SessionUpdate { update });
            }
            "session_info_update" => {
                // A title (`null` takes it back); other fields are only shown.
                if let Some(title) = update.get("title") {
                    self.conversation.new_title = Some(title.as_str().map(str::to_owned));
                }
                self.recorder.emit(SessionEventKind::SessionUpdate { update });
            }
            "config_option_update" | "current_mode_update" => {
                self.agent_setting_update(&update);
                self.recorder.emit(SessionEventKind::SessionUpdate { update });
            }
            _ => self.recorder.emit(SessionEventKind::SessionUpdate { update }),
        }
    }

    /// A tool call announced. One announced `pending` (its input still streaming: claude's
    /// first title is a placeholder such as "Preparing file…") is held in memory until the
    /// agent names or starts it, so that its entry says what the agent called it.
    fn tool_call(&mut self, update: Value) {
        let title = tool_title(&update).unwrap_or("tool").to_owned();
        let id = update["toolCallId"].as_str().unwrap_or_default().to_owned();
        let status = update["status"].as_str().unwrap_or("pending").to_owned();
        let kind = update["kind"].as_str().unwrap_or_default().to_owned();
        let diffs = tool_diffs(&update);
        self.conversation.tool_titles.insert(id.clone(), (title.clone(), kind, diffs));
        if status != "pending" {
            self.recorder.record_history(
                EntryType::ToolCall,
                title.clone(),
                Some((title, id, status)),
            );
        } else if !self.recorder.recorded.history {
            if let Err(err) = self.recorder.history.hold_tool_call(title, id, status) {
                self.recorder.write_failed("the history", &err);
            }
            self.bound_coalescing();
        }
        self.recorder.emit(SessionEventKind::ToolCall { update });
    }

    /// The agent named tool call `id` (or started it): a held entry is written now, under
    /// the newest title the agent gave.
    fn tool_call_named(&mut self, id: &str) {
        let Some(title) = self.conversation.tool_titles.get(id).map(|known| known.0.clone()) else {
            return;
        };
        if !self.recorder.recorded.history
            && let Err(err) = self.recorder.history.name_tool_call(id, &title)
        {
            self.recorder.write_failed("the history", &err);
        }
    }

    fn tool_call_update(&mut self, update: Value) {
        let status = update["status"].as_str().unwrap_or_default().to_owned();
        let id = update["toolCallId"].as_str().unwrap_or_default().to_owned();
        // Later updates name the tool better than its first placeholder did.
        let known = self.conversation.tool_titles.entry(id.clone()).or_default();
        let title = tool_title(&update);
        if let Some(title) = title {
            title.clone_into(&mut known.0);
        }
        if let Some(kind) = update["kind"].as_str() {
            known.1 = kind.to_owned();
        }
        let diffs = tool_diffs(&update);
        if !diffs.is_empty() {
            known.2 = diffs;
        }
        if title.is_some() || !matches!(status.as_str(), "" | "pending") {
            self.tool_call_named(&id);
        }
        if matches!(status.as_str(), "completed" | "failed") {
            self.tool_result(id, status, &update);
        }
        if !self.recorder.recorded.history {
            self.bound_coalescing();
        }
        self.recorder.emit(SessionEventKind::ToolCallUpdate { update });
    }

    /// A tool call's final update (`status` `completed` or `failed`): its result entry.
    fn tool_result(&mut self, id: String, status: String, update: &Value) {
        let (title, kind, diffs) = self.conversation.tool_titles.remove(&id).unwrap_or_default();
        // A failed (or denied) edit changed nothing: the diff it proposed is not recorded
        // as made.
        let mut content = match status.as_str() {
            "failed" => failed_tool_text(update, !diffs.is_empty()),
            _ => tool_text(update),
        };
        if status == "completed" && !diffs.is_empty() && !content.contains(&diffs) {
            // The change was shown by an earlier update (claude's), the final one says
            // only that it was made.
            content = if content.is_empty() { diffs } else { format!("{diffs}\n{content}") };
        }
        let excerpt = history::excerpt(&content, history::TOOL_RESULT_EXCERPT_CHARS);
        let name = tool_name(title, kind);
        self.recorder.record_history(EntryType::ToolResult, excerpt, Some((name, id, status)));
    }

    /// A message being coalesced in memory holds the ack point back (it is on no disk
    /// yet), as a held tool call does, and agentctl bounds what it keeps unacknowledged: a
    /// very long message is written in parts (a held call written as it is), so
    /// acknowledgements go on and the agent never waits on itself.
    fn bound_coalescing(&mut self) {
        let since =
            self.recorder.history.unflushed_since().unwrap_or(self.recorder.durability.handled);
        let long = self.recorder.history.coalesced_bytes() >= MAX_COALESCED_BYTES
            || self.recorder.durability.handled.saturating_sub(since) >= MAX_COALESCED_EVENTS;
        if long && let Err(err) = self.recorder.history.flush_agent() {
            self.recorder.write_failed("the history", &err);
        }
    }

    /// A response to one of our requests. Returns whether a turn ended.
    async fn response(&mut self, id: Value, message: Value) -> bool {
        let key = match &id {
            Value::Number(n) => n.to_string(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let Some(purpose) = self.conversation.pending.remove(&key) else { return false };
        if !matches!(purpose, Pending::Prompt { .. })
            && let Some(opening) = self.stage.opening()
        {
            opening.step = None;
        }
        let result = match message.get("error") {
            Some(error) => {
                Err(serde_json::from_value::<RpcErrorBody>(error.clone()).unwrap_or_default())
            }
            None => Ok(message.get("result").cloned().unwrap_or(Value::Null)),
        };
        match purpose {
            Pending::Initialize => {
                match result {
                    Ok(result) => self.initialized(result).await,
                    Err(error) => {
                        let tail = self.conversation.stderr_tail();
                        self.fail(format!("the agent refused initialize: {}{tail}", error.text()))
                            .await
                    }
                }
                false
            }
            Pending::Restore { load, token } => {
                self.restored(load, token, result).await;
                false
            }
            Pending::Authenticate { method, then } => {
                match result {
                    Ok(_) => {
                        if let Some(opening) = self.stage.opening() {
                            opening.authenticated = true;
                        }
                        match then {
                            AfterAuth::NewSession => self.new_acp_session(),
                            AfterAuth::Restore { load, token } => self.restore(load, token),
                        }
                    }
                    Err(error) => {
                        self.fail(format!(
                            "needs credentials: the agent refused authenticate with {method}: {}",
                            error.text()
                        ))
                        .await
                    }
                }
                false
            }
            Pending::NewSession => {
                self.new_session_answered(result).await;
                false
            }
            Pending::Setting { setting, reply } => {
                self.setting_answered(setting, reply, result.map_err(|error| error.text())).await;
                false
            }
            Pending::Fork => {
                self.fork_answered(result).await;
                false
            }
            Pending::Steer { turn_id, text, reply } => {
                self.steer_answered(turn_id, text, reply, result).await;
                false
            }
            Pending::Prompt { turn_id, injected } => {
                if self.conversation.turn_id() == Some(turn_id.as_str()) {
                    self.prompt_answered(injected, result).await;
                }
                true
            }
        }
    }

    /// `session/new` answered: the ACP session opens (its settings restored first), or
    /// the launch fails — unless credentials can still be offered.
    async fn new_session_answered(&mut self, result: Result<Value, RpcErrorBody>) {
        let session_id = result.as_ref().map(|result| {
            match protocol::acp::parse::<schema::NewSessionResponse>(result) {
                Parsed::Known(response) => Some(response.session_id.0.to_string()),
                Parsed::Unknown(raw) => {
                    raw.get("sessionId").and_then(Value::as_str).map(str::to_owned)
                }
            }
        });
        let answer = result.as_ref().ok().cloned().unwrap_or_default();
        match session_id {
            Ok(Some(acp_session)) => self.opened_with(acp_session, None, &answer).await,
            Ok(None) => self.fail("session/new returned no sessionId".into()).await,
            Err(error) if self.try_authenticate(error, AfterAuth::NewSession) => {}
            Err(error) if error.code == Some(protocol::ErrorCode::AuthRequired.code()) => {
                let reason = explain::credentials_needed(
                    self.stage.opening_ref(),
                    &self.profile,
                    &self.context.agent_home,
                    &error.text(),
                );
                self.fail(reason).await
            }
            Err(error) => {
                self.fail(format!("the agent refused session/new: {}", error.text())).await
            }
        }
    }

    /// The running turn's `session/prompt` answered (`injected`: it carried the resume
    /// context): the turn ends with the agent's stop reason, or as failed. A cancel the
    /// user asked for is recorded as cancelled whatever the agent answered.
    async fn prompt_answered(&mut self, injected: bool, result: Result<Value, RpcErrorBody>) {
        match result {
            Ok(result) => {
                if injected {
                    self.clear_resume_context_pending().await;
                }
                self.store_token_again().await;
                let stop_reason = match protocol::acp::parse::<schema::PromptResponse>(&result) {
                    Parsed::Known(response) => serde_json::to_value(response.stop_reason)
                        .ok()
                        .and_then(|reason| reason.as_str().map(str::to_owned)),
                    // A stop reason newer than the schema is kept as said.
                    Parsed::Unknown(raw) => {
                        raw.get("stopReason").and_then(Value::as_str).map(str::to_owned)
                    }
                }
                .unwrap_or_else(|| "end_turn".into());
                // Some agents (opencode) answer a prompt the user cancelled
                // with end_turn; what the user did is what is recorded.
                let stop_reason =
                    if self.conversation.turn.as_ref().is_some_and(|turn| turn.cancel_at.is_some())
                        && stop_reason == "end_turn"
                    {
                        "cancelled".to_owned()
                    } else {
                        stop_reason
                    };
                if let Some(turn) = self.conversation.turn.as_mut() {
                    super::meter::prompt_usage(&result, &mut turn.usage);
                }
                self.end_turn(TurnState::Completed, Some(stop_reason), None).await;
            }
            Err(error)
                if self.conversation.turn.as_ref().is_some_and(|turn| turn.cancel_at.is_some()) =>
            {
                // Others (qwen-code) answer it with the error of their aborted
                // model request: still the cancel the user asked for.
                self.recorder.emit(SessionEventKind::Notice {
                    message: format!(
                        "the agent answered the cancel with an error ({}); the turn is recorded as cancelled",
                        error.text()
                    ),
                });
                self.end_turn(TurnState::Completed, Some("cancelled".into()), None).await
            }
            Err(error) => self.end_turn(TurnState::Failed, None, Some(error.text())).await,
        }
    }

    /// `initialize` answered: restore natively when a resume has a token and the agent
    /// can, else open a new ACP session.
    pub(in crate::session) async fn initialized(&mut self, result: Value) {
        let Some(opening) = self.stage.opening() else { return };
        opening.authenticated = false;
        opening.auth_offered = result["authMethods"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|method| method["type"].as_str() != Some("terminal"))
            .filter_map(|method| method["id"].as_str().map(str::to_owned))
            .collect();
        opening.auth_terminal = result["authMethods"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|method| method["type"].as_str() == Some("terminal"))
            .map(|method| {
                let name = method["name"].as_str().or(method["id"].as_str()).unwrap_or("login");
                let args = method["args"].as_array().into_iter().flatten();
                (name.to_owned(), args.filter_map(|arg| arg.as_str().map(str::to_owned)).collect())
            })
            .collect();
        let token = opening
            .launch
            .resume
            .as_ref()
            .filter(|resume| !resume.relaunched)
            .and_then(|resume| resume.token.clone());
        // An answer that does not fit the schema is read for its capabilities alone.
        let capabilities = match protocol::acp::parse::<schema::InitializeResponse>(&result) {
            Parsed::Known(response) => response.agent_capabilities,
            // Its capabilities may still parse on their own (their fields default on error).
            Parsed::Unknown(raw) => raw
                .get("agentCapabilities")
                .and_then(|caps| serde_json::from_value(caps.clone()).ok())
                .unwrap_or_default(),
        };
        let sessions = &capabilities.session_capabilities;
        self.choices.settings_mut().close_supported = sessions.close.is_some();
        self.choices.settings_mut().directories_supported =
            sessions.additional_directories.is_some();
        self.choices.settings_mut().steering_supported = requests::steering_advertised(&result);
        self.choices.settings_mut().fork_supported = result
            .pointer("/agentCapabilities/sessionCapabilities/fork")
            .is_some_and(Value::is_object);
        let Some(token) = token else {
            return self.fork_or_new_session();
        };
        let advertised = Advertised {
            resume: capabilities.session_capabilities.resume.is_some(),
            load: capabilities.load_session,
        };
        if let Some(opening) = self.stage.opening() {
            opening.load_offered = advertised.load;
        }
        match self.profile.restore_method(advertised) {
            Some(RestoreMethod::Resume) => self.restore(false, token),
            Some(RestoreMethod::Load) => self.restore(true, token),
            // Nothing to restore with: a fresh session (with the history, when the
            // profile injects it); the token is of no use to this agent.
            None => {
                self.forget_token().await;
                self.new_acp_session();
            }
        }
    }

    /// The agent refused a step with ACP's "authentication required" (`-32000`): sends
    /// `authenticate` with the profile's choice among the offered methods, once per
    /// execution, and the step again after it. False when there is nothing to try.
    fn try_authenticate(&mut self, error: &RpcErrorBody, then: AfterAuth) -> bool {
        if error.code != Some(protocol::ErrorCode::AuthRequired.code()) {
            return false;
        }
        let Stage::Opening(opening) = &self.stage else { return false };
        if opening.authenticated {
            return false;
        }
        let inherited = |name: &str| std::env::var_os(name).is_some_and(|value| !value.is_empty());
        let Some(method) = self.profile.auth_method(&opening.auth_offered, inherited) else {
            return false;
        };
        let method = method.to_owned();
        tracing::info!(session = %self.row.id, %method, "the agent asks for authentication");
        self.recorder.progress(LaunchStep::Authenticating, Some(method.clone()));
        self.request(
            protocol::acp::method::AUTHENTICATE,
            requests::authenticate(&method),
            Pending::Authenticate { method, then },
        );
        true
    }

    /// A session without a token to restore: a fork's first start asks its agent to
    /// `session/fork` the original's agent session when it can; anything else opens a new
    /// ACP session.
    fn fork_or_new_session(&mut self) {
        let fork = self
            .stage
            .opening()
            .and_then(|opening| opening.launch.resume.as_ref())
            .and_then(|resume| resume.fork.clone().flatten());
        match fork {
            Some(source) if self.choices.settings().fork_supported => {
                self.recorder.progress(LaunchStep::Restoring, Some("session/fork".into()));
                let mut params = json!({"sessionId": source, "cwd": self.row.workspace_path,
                    "mcpServers": self.row.mcp_servers});
                self.add_directories(&mut params);
                self.request(protocol::acp::method::SESSION_FORK, params, Pending::Fork);
            }
            Some(_) => {
                self.recorder.emit(SessionEventKind::Notice {
                    message: "this agent does not advertise session/fork (any more): the fork's history goes with its first prompt".into(),
                });
                self.new_acp_session();
            }
            None => self.new_acp_session(),
        }
    }

    /// `session/fork` answered: the fork opens on its own agent session, else (refused) on a
    /// new one, its history injected.
    async fn fork_answered(&mut self, result: Result<Value, RpcErrorBody>) {
        let forked =
            result.as_ref().ok().and_then(|answer| answer["sessionId"].as_str().map(str::to_owned));
        match (forked, result) {
            (Some(acp_session), Ok(answer)) => {
                self.opened_with(acp_session, Some(ResumeOutcome::NativeFork), &answer).await;
            }
            (_, result) => {
                let why = match result {
                    Ok(_) => "it answered without a sessionId".to_owned(),
                    Err(error) => error.text(),
                };
                self.recorder.emit(SessionEventKind::Notice {
                    message: format!("the agent did not fork the original's session ({why}): the fork's history goes with its first prompt"),
                });
                self.new_acp_session();
            }
        }
    }

    fn new_acp_session(&mut self) {
        self.recorder.progress(LaunchStep::Opening, None);
        let mut params =
            json!({"cwd": self.row.workspace_path, "mcpServers": self.row.mcp_servers});
        self.add_directories(&mut params);
        self.request(protocol::acp::method::SESSION_NEW, params, Pending::NewSession);
    }

    /// The session's additional directories, to an agent that takes them; to one that does
    /// not, a notice (once per open) that it works in the workspace alone.
    fn add_directories(&mut self, params: &mut Value) {
        if self.row.additional_directories.is_empty() {
            return;
        }
        if self.choices.settings().directories_supported {
            params["additionalDirectories"] = json!(self.row.additional_directories);
        } else {
            self.recorder.emit(SessionEventKind::Notice {
                message: format!(
                    "the agent does not take additional directories; it is given the workspace alone, not {}",
                    self.row.additional_directories.join(", ")
                ),
            });
        }
    }

    /// A native restore was refused: the token is cleared, a notice says so, and a fresh
    /// ACP session takes its place (not a failure).
    pub(super) async fn restore_rejected(&mut self, reason: String) {
        let _ = self.context.store.log_error(self.row.id.clone(), reason.clone()).await;
        self.recorder.emit(SessionEventKind::Notice {
            message: format!("{reason}; starting a fresh agent session"),
        });
        self.forget_token().await;
        if let Some(resume) = self.stage.opening().and_then(|o| o.launch.resume.as_mut()) {
            resume.native_failed = true;
        }
        self.new_acp_session();
    }

    /// The stored token cannot restore anything for this agent: it is cleared.
    async fn forget_token(&mut self) {
        if let Some(execution) = &self.sidecar.execution {
            let _ = self
                .context
                .store
                .set_resume_token(self.row.id.clone(), execution.id.clone(), None)
                .await;
        }
        if let Some(resume) = self.stage.opening().and_then(|o| o.launch.resume.as_mut()) {
            resume.token = None;
        }
    }

    /// The ACP session is open (new or restored): record it, settle a resume's outcome,
    /// and send the initial prompt if there is one.
    pub(in crate::session) async fn session_opened(
        &mut self,
        acp_session: String,
        restored: Option<ResumeOutcome>,
    ) {
        let execution_id = self.sidecar.execution.as_ref().map(|execution| execution.id.clone());
        let resume = self.stage.opening().and_then(|opening| opening.launch.resume.take());
        let wake = resume.as_ref().is_some_and(|resume| resume.wake);
        if resume.as_ref().is_some_and(|resume| resume.fork.is_some())
            && let Err(err) = self.context.store.fork_opened(self.row.id.clone()).await
        {
            // A later start would fork again: the fork's own token is restored first.
            tracing::warn!(session = %self.row.id, %err, "cannot record that the fork opened");
        }
        if resume.as_ref().is_some_and(|resume| resume.rewind)
            && let Err(err) = self.context.store.rewind_opened(self.row.id.clone()).await
        {
            // A later start opens afresh again (and injects the same turns): nothing lost.
            tracing::warn!(session = %self.row.id, %err, "cannot record that the rewind is done");
        }
        let outcome = match resume {
            None => None,
            Some(resume) => Some(match restored {
                Some(outcome) => {
                    // Restored natively: the agent is told what changed meanwhile.
                    self.conversation.resume_context.get_or_insert(ResumeContext::Drift);
                    outcome
                }
                None if resume.handoff => {
                    self.conversation.resume_context = Some(ResumeContext::Handoff);
                    ResumeOutcome::ContextHandoff
                }
                None if resume.relaunched => ResumeOutcome::ResumeCommand,
                // (A fork's history is its whole context, a rewind's what the agent must
                // be left with: injected whatever the profile says.)
                None if !self.recorder.history.is_empty()
                    && (self.profile.injects_history(resume.native_failed)
                        || resume.fork.is_some()
                        || resume.rewind) =>
                {
                    self.conversation.resume_context = Some(ResumeContext::History);
                    ResumeOutcome::HistoryInjection
                }
                None => ResumeOutcome::Fresh,
            }),
        };
        // One write: the token, the ACP session, `running`, and a resume's outcome.
        let opened = crate::store::Opened {
            resume_token: self.profile.keeps_resume_token().then(|| acp_session.clone()),
            acp_session_id: acp_session.clone(),
            outcome,
            inject_history: self.conversation.resume_context.is_some(),
        };
        // (Only an execution opens a session: there is always one here.)
        if let Some(execution_id) = execution_id
            && let Err(err) =
                self.context.store.record_opened(self.row.id.clone(), execution_id, opened).await
        {
            tracing::error!(session = %self.row.id, %err, "cannot record the opened session");
        }
        self.update_view(|view| view.acp_session_id = Some(acp_session));
        if let Err(err) =
            self.set_state(SessionState::WaitingForInput, None, Some(task_state::REVIEW)).await
        {
            tracing::error!(session = %self.row.id, %err, "cannot record the session state");
        }
        let launch = self.enter_open();
        let metrics = crate::metrics::get();
        if let Some(started) = launch.as_ref().map(|launch| launch.started) {
            let histogram =
                if outcome.is_some() { &metrics.resume_seconds } else { &metrics.launch_seconds };
            crate::metrics::observe(histogram, started.elapsed());
        }
        if let Some(launch) = launch.as_ref().filter(|_| wake) {
            metrics.wakeups.inc();
            crate::metrics::observe(&metrics.wake_seconds, launch.started.elapsed());
        }
        if let Some(outcome) = outcome {
            metrics
                .resumes
                .get_or_create(&crate::metrics::label("outcome", outcome.as_str()))
                .inc();
        }
        let answer = match outcome {
            Some(outcome) => {
                self.recorder.emit(SessionEventKind::ResumeOutcome { outcome });
                self.recorder.emit(SessionEventKind::Resumed { outcome });
                self.update_view(|view| view.resume_outcome = Some(outcome));
                outcome
            }
            None => ResumeOutcome::AlreadyRunning,
        };
        self.waits.opened(|| Ok(answer));
        if let Some(prompt) = launch
            .and_then(|launch| launch.initial_prompt)
            .filter(|prompt| !prompt.trim().is_empty())
        {
            self.send_initial_prompt(prompt).await;
        }
    }

    async fn clear_resume_context_pending(&mut self) {
        self.conversation.resume_context = None;
        if let Some(execution) = &self.sidecar.execution {
            let _ = self
                .context
                .store
                .set_resume_context_pending(self.row.id.clone(), execution.id.clone(), false)
                .await;
        }
    }

    /// The token is stored again when a turn completes (compare-and-set on the execution).
    async fn store_token_again(&self) {
        let acp_session = self.view_tx.borrow().acp_session_id.clone();
        if let (Some(execution), Some(acp_session)) = (&self.sidecar.execution, acp_session)
            && self.profile.keeps_resume_token()
        {
            let _ = self
                .context
                .store
                .set_resume_token(self.row.id.clone(), execution.id.clone(), Some(acp_session))
                .await;
        }
    }

    /// The agent can do nothing more (it exited, or closed its stdout): a launch fails; an
    /// open session's turn and questions end with `reason`, and the execution is retired.
    async fn agent_gone(&mut self, reason: String) {
        if let Some(execution) = self.sidecar.execution.as_mut() {
            execution.agent_running = false;
            let _ = self
                .context
                .store
                .set_execution_status(
                    self.row.id.clone(),
                    execution.id.clone(),
                    ExecutionStatus::Exited,
                )
                .await;
        }
        if matches!(self.phase(), Phase::Opening | Phase::Launching)
            || self.row.state == SessionState::Starting
        {
            return self.fail(format!("launch failed: {reason}")).await;
        }
        self.enter(Stage::Idle);
        self.execution_gone(&reason, TurnState::Failed).await;
        self.recorder.emit(SessionEventKind::Notice { message: reason });
        // What was handled is acknowledged before agentctl is let go.
        self.ack(true).await;
        if let Some(execution) = self.sidecar.execution.take() {
            self.retire(execution, None);
        }
        if self.row.state.is_terminal() {
            // A stopped session's teardown (replayed at recovery) ended with its agent.
            self.enter(Stage::Ended);
        }
    }

    /// ACP `usage_update`: the meter keeps it for snapshots and says what follows (a
    /// warning now; a handoff once the report is handled).
    fn usage_reported(&mut self, update: &Value) {
        let Some(report) = ContextReport::parse(update) else { return };
        let threshold = u64::from(self.profile.session.context_handoff_percent);
        let turn = self.conversation.turn.as_mut().map(|turn| &mut turn.usage);
        let warning = self.meter.on_report(&report, threshold, turn);
        let (used, size) = (report.used, report.size);
        self.update_view(|view| view.context = Some((used, size)));
        if let Some(ContextWarning { used, size, percent, threshold }) = warning {
            tracing::info!(session = %self.row.id, percent, threshold, "the agent's context nears the handoff threshold");
            self.recorder.emit(SessionEventKind::ContextWarning { used, size, percent, threshold });
        }
    }

    // ---- the agent's text ----------------------------------------------------------------

    /// Handles `raw` if it is a chunk of the agent's reply that needs nothing but its text
    /// (no replay being dropped, no primed session to tell apart); false if it is anything
    /// else, left to the general path ([`SessionActor::handle_acp`]).
    async fn agent_text_fast(&mut self, raw: &str) -> bool {
        if !matches!(self.conversation.replay, Replay::Off)
            || self.sidecar.execution.as_ref().is_some_and(|e| e.primed_session.is_some())
        {
            return false;
        }
        let Some((text, message_id)) = parse::agent_text(raw) else { return false };
        self.conversation.heard();
        self.agent_message_chunk(text, message_id);
        self.settings_updated().await;
        true
    }

    /// A chunk of the agent's reply: into the message being coalesced, and published.
    fn agent_message_chunk(&mut self, text: String, message_id: Option<String>) {
        if !self.recorder.recorded.history {
            if self.recorder.history.is_new_message(message_id.as_deref())
                && let Err(err) = self.recorder.history.flush_agent()
            {
                self.recorder.write_failed("the history", &err);
            }
            self.recorder.history.agent_chunk(&text, message_id.as_deref());
            self.bound_coalescing();
        }
        self.recorder.emit(SessionEventKind::AgentMessageChunk { text, message_id });
    }

    // ---- a native restore and its replay -------------------------------------------------

    /// Sends `session/load` (`load`) or `session/resume` for the stored `token`.
    fn restore(&mut self, load: bool, token: String) {
        let method = if load { "session/load" } else { "session/resume" };
        self.recorder.progress(LaunchStep::Restoring, Some(method.to_owned()));
        let mut params = json!({
            "sessionId": token,
            "cwd": self.row.workspace_path,
            "mcpServers": self.row.mcp_servers,
        });
        self.add_directories(&mut params);
        // Either may replay the conversation (a load must; some agents' resume does too,
        // fast-agent's as one message holding all of it): it is in our records already.
        self.conversation.replay = Replay::Loading(None);
        self.conversation.replayed_messages = load.then(String::new);
        if load {
            self.request(
                protocol::acp::method::SESSION_LOAD,
                params,
                Pending::Restore { load: true, token },
            );
            agentctl::fault::point("load.sent");
        } else {
            self.request(
                protocol::acp::method::SESSION_RESUME,
                params,
                Pending::Restore { load: false, token },
            );
        }
    }

    /// A `session/load` (`load`) or `session/resume` of `token` was answered.
    async fn restored(&mut self, load: bool, token: String, result: Result<Value, RpcErrorBody>) {
        // A load that worked keeps dropping its replay until the next prompt.
        if matches!(self.conversation.replay, Replay::Loading(_)) {
            self.conversation.replay = match result {
                Ok(_) => Replay::Loading(Some(Box::new(KnownConversation::of(
                    self.recorder.history_tail(REPLAY_WINDOW_BYTES).await,
                )))),
                Err(_) => Replay::Off,
            };
        }
        match result {
            Ok(answer) => {
                let outcome =
                    if load { ResumeOutcome::NativeLoad } else { ResumeOutcome::NativeResume };
                // A load's replay must never be replayed to us again after a restart
                // (a new actor would not know it was a replay and would record it):
                // everything up to its answer is acknowledged before the session is
                // recorded as open. A kill in between leaves it STARTING, and a
                // session caught starting is fenced and resumed, not re-attached.
                self.ack(true).await;
                if load {
                    self.check_replay().await;
                }
                self.opened_with(token, Some(outcome), &answer).await;
                agentctl::fault::point("load.opened");
            }
            Err(error)
                if self.try_authenticate(
                    &error,
                    AfterAuth::Restore { load, token: token.clone() },
                ) => {}
            // An agent that advertises `session/resume` without answering it (qwen-code
            // 0.15.10: "Method not found") is asked for a load, when it offers that.
            Err(error) if !load && error.code == Some(-32601) && self.stage.load_offered() => {
                self.recorder.emit(SessionEventKind::Notice {
                message: format!(
                    "the agent advertises session/resume but does not take it ({}); loading the session instead",
                    error.text()
                ),
            });
                self.restore(true, token);
            }
            Err(error) if matches!(error.code, Some(-32601) | Some(-32002)) => {
                self.restore_rejected(format!(
                    "the agent rejected the stored session: {}",
                    error.text()
                ))
                .await;
            }
            // Any other failure (gemini answers a load it cannot do with -32000)
            // is not the session's end either: a fresh session with the history.
            Err(error) => {
                self.restore_rejected(format!(
                    "restoring the stored session failed: {}",
                    error.text()
                ))
                .await
            }
        }
    }

    /// A load was answered: what its replay carried is held against the history. When the
    /// agent replayed messages but not the newest ones Tether recorded (an agent killed
    /// right after a turn may come back without it, or without its last answer: qwen-code
    /// writes that after the turn's end), what it lacks goes with the next prompt. A load
    /// that replayed no message (or replays after its answer, as gemini-cli does) cannot
    /// be checked, nor can a resume (it replays nothing).
    async fn check_replay(&mut self) {
        let Some(replayed) =
            self.conversation.replayed_messages.take().filter(|text| !text.trim().is_empty())
        else {
            return;
        };
        let entries = self.recorder.history_tail(REPLAY_WINDOW_BYTES).await;
        let Some((first_missing, lacking)) = parse::lacking(&entries, &replayed) else { return };
        self.conversation.resume_context =
            Some(ResumeContext::Missing { after: first_missing - 1 });
        self.recorder.emit(SessionEventKind::Notice {
            message: format!(
                "the agent's restored conversation lacks the last {lacking} message(s) Tether recorded; they go with the next prompt"
            ),
        });
    }
}

fn reject(command: Command, error: impl Fn() -> SessionError) {
    match command {
        Command::Prompt { reply, .. } | Command::Retry { reply, .. } => {
            drop(reply.send(Err(error())))
        }
        Command::Resume { reply, .. } => drop(reply.send(Err(error()))),
        Command::Cancel { reply }
        | Command::Stop { reply, .. }
        | Command::Detach { reply }
        | Command::Permission { reply, .. } => drop(reply.send(Err(error()))),
        Command::Pause { reply, .. } => drop(reply.send(Err(error()))),
        Command::Setting { reply, .. } => drop(reply.send(Err(error()))),
        Command::Queue { reply, .. } => drop(reply.send(Err(error()))),
        Command::Steer { reply, .. } => drop(reply.send(Err(error()))),
        Command::Rewind { reply, .. } => drop(reply.send(Err(error()))),
        Command::Relocate { reply, .. } => drop(reply.send(Err(error()))),
        Command::Announce { reply, .. } => drop(reply.send(Err(error()))),
    }
}

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
