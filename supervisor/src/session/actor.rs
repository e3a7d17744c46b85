//! The session actor: its state, its loop, and the commands it serves.
//!
//! The loop is a biased `select!` over, in order: commands (a cancel or stop never waits
//! behind a stream of chunks), reports from its own tasks (launch, re-attach, the outbox),
//! the deadlines (ACP handshake, cancel grace), and agentctl events. Nothing in it awaits
//! the sidecar.
//!
//! Files: this one holds the actor's state, its loop and the dispatch of commands and
//! reports; `turns.rs` prompts and turns; `executions.rs` launching, re-attaching,
//! retiring and losing sidecars; `pause.rs` pauses and snapshots; `records.rs` what the
//! actor writes (events, history, state, acknowledgements) and the stall after a failed
//! write.

mod executions;
mod pause;
mod records;
mod settings;
mod stall;
mod turns;
mod waits;

use turns::TurnKind;

use std::collections::HashMap;
use std::sync::Arc;

use agents::profile::Profile;
use protocol::api::SnapshotTrigger;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

pub(super) use super::conversation::{Replay, Turn};
use super::durability::Durability;
use super::launch::{self, Connected, LaunchFailure, LaunchPlan};
use super::leftovers;
use super::outbox::{self, Outgoing};
use super::{
    CANCEL_GRACE, Command, MAX_PROMPT_LINE, Phase, ReattachPlan, Reply, SessionContext,
    SessionError, SessionView, Start,
};
use crate::events::{LaunchStep, SessionEventKind};
use crate::history::{self, EntryType, History};
use crate::sidecar::Control;
use crate::store::{
    ExecutionRow, ExecutionStatus, ResumeOutcome, RetryCandidate, SessionRow, SessionState,
    TurnState, task_state,
};
use protocol::control::{Event, EventKind};

/// Reports from the actor's own tasks.
pub(super) enum Internal {
    /// A launch finished. (Boxed, like the re-attach: this channel's buffer is allocated
    /// per session in slots of the largest message, and these two are rare.)
    Launched(Box<Result<Connected, LaunchFailure>>),
    /// A re-attach finished.
    Reattached(Box<Result<Connected, String>>),
    /// A control call of the outbox failed: the execution is lost.
    ControlFailed { execution_id: crate::ids::ExecutionId, error: String },
    /// A permission answer reached agentctl.
    AnswerSent { execution_id: crate::ids::ExecutionId, request_id: String },
    /// A snapshot taken in the background was stored.
    SnapshotTaken { snapshot_id: String, trigger: SnapshotTrigger },
    /// A stop's or detach's retire is done: the sidecar is gone, and these are the events
    /// its spool held past what was handled (see [`SessionActor::retire_open`]).
    Retired(Box<Retired>),
}

/// What an outstanding request of ours was for.
#[derive(Debug)]
pub(super) enum Pending {
    Initialize,
    NewSession,
    /// `session/resume` (`load: false`) or `session/load` (`load: true`) of a token.
    Restore {
        load: bool,
        token: String,
    },
    Prompt {
        turn_id: crate::ids::TurnId,
        injected: bool,
    },
    /// `authenticate` with `method`, after which the refused step is sent again.
    Authenticate {
        method: String,
        then: AfterAuth,
    },
    /// `session/set_config_option` or `session/set_mode`: for a caller (`reply`), or to
    /// set a choice again after the session opened.
    Setting {
        setting: crate::settings::Setting,
        reply: Option<Reply<crate::settings::SessionSettings>>,
    },
}

/// The handshake step an agent refused until `authenticate`.
#[derive(Debug)]
pub(super) enum AfterAuth {
    NewSession,
    Restore { load: bool, token: String },
}

/// A pause asked for while a turn ran.
#[derive(Debug, Clone)]
pub(super) struct PendingPause {
    pub(super) reason: Option<String>,
    /// When the running turn is cancelled (`None` once that time has passed).
    pub(super) force_at: Option<Instant>,
    /// The turn was cancelled for it.
    pub(super) forced: bool,
    /// `Pause`, or `Exhaustion` (the agent's context reached the profile's threshold).
    pub(super) trigger: SnapshotTrigger,
    /// How long it waits for a turn (the running one, then the summary turn).
    pub(super) wait: std::time::Duration,
    /// Where its summary turn (`summarize_on_pause`) stands.
    pub(super) summary: SummaryStep,
}

/// Where a pause's summary turn stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum SummaryStep {
    /// Not asked (yet).
    NotAsked,
    /// Asked at this Unix ms: the summary turn is the session's first turn since.
    Asked(i64),
    /// Settled without an answer to read (the prompt could not be sent).
    Settled(protocol::api::PauseSummary),
}

/// The live connection to one execution.
pub(super) struct Execution {
    pub(super) id: crate::ids::ExecutionId,
    pub(super) record: ExecutionRow,
    pub(super) calls: Arc<dyn Control>,
    pub(super) outbox: mpsc::UnboundedSender<Box<Outgoing>>,
    pub(super) events_rx: crate::sidecar::EventsRx,
    pub(super) agent_running: bool,
    /// Its sidecar is gone: these are the events its spool held (see `leftovers.rs`).
    pub(super) gone: bool,
    /// A warm agent's priming ACP session (see `pool.rs`): its updates are dropped. It
    /// lives as long as the execution: a later one's agent has none.
    pub(super) primed_session: Option<String>,
}

impl Execution {
    /// The execution a launch or re-attach connected to, with its outbox started.
    pub(super) fn new(
        connected: Connected,
        agent_running: bool,
        internal_tx: &mpsc::UnboundedSender<Internal>,
    ) -> Execution {
        let Connected { record, calls, events_rx, gone, .. } = connected;
        let outbox = outbox::start_outbox(
            record.execution_id.clone(),
            Arc::clone(&calls),
            internal_tx.clone(),
        );
        Execution {
            id: record.execution_id.clone(),
            record,
            calls,
            outbox,
            events_rx,
            agent_running,
            gone,
            primed_session: None,
        }
    }
}

impl Execution {
    /// Whether `params` (a notification's) are about the warm agent's priming session.
    pub(super) fn is_primed(&self, params: &Value) -> bool {
        (self.primed_session.as_deref())
            .is_some_and(|primed| super::acp::parse::about_session(params, primed))
    }
}

/// A resume in progress.
#[derive(Debug)]
pub(super) struct ResumeState {
    /// The token being restored, if any.
    pub(super) token: Option<String>,
    /// The agent was relaunched with the profile's `resume_command`.
    pub(super) relaunched: bool,
    /// A native restore was tried and rejected.
    pub(super) native_failed: bool,
    /// A capacity handoff: a fresh agent session primed from the latest snapshot.
    pub(super) handoff: bool,
    /// It wakes a session parked for being idle (the wake-up metrics).
    pub(super) wake: bool,
}

/// Where the actor is, with what only makes sense there; the view shows its [`Phase`].
#[derive(Debug)]
pub(super) enum Stage {
    Idle,
    Launching(Box<Launch>),
    /// Connecting again to a sidecar; a warm agent's priming session, when the execution
    /// had one (a stall's retry re-attaches to the same execution).
    Reattaching {
        primed_session: Option<String>,
    },
    Opening(Box<Opening>),
    Open,
    Ended,
}

impl Stage {
    pub(super) fn phase(&self) -> Phase {
        match self {
            Stage::Idle => Phase::Idle,
            Stage::Launching(_) => Phase::Launching,
            Stage::Reattaching { .. } => Phase::Reattaching,
            Stage::Opening(_) => Phase::Opening,
            Stage::Open => Phase::Open,
            Stage::Ended => Phase::Ended,
        }
    }

    /// The handshake step awaited and its deadline.
    pub(super) fn handshake(&self) -> Option<(&'static str, Instant)> {
        match self {
            Stage::Opening(opening) => opening.step,
            _ => None,
        }
    }

    /// The handshake under way.
    /// The launch step the agent is waited for in, while it starts (the step of the
    /// handshake request it has not answered yet).
    pub(super) fn launch_step(&self) -> Option<crate::events::LaunchStep> {
        use protocol::acp::method;
        let Stage::Opening(opening) = self else { return None };
        Some(match opening.step?.0 {
            method::INITIALIZE => crate::events::LaunchStep::Initializing,
            method::AUTHENTICATE => crate::events::LaunchStep::Authenticating,
            method::SESSION_LOAD | method::SESSION_RESUME => crate::events::LaunchStep::Restoring,
            method::SESSION_NEW => crate::events::LaunchStep::Opening,
            method::SESSION_SET_CONFIG_OPTION | method::SESSION_SET_MODE => {
                crate::events::LaunchStep::Settings
            }
            _ => return None,
        })
    }

    /// The handshake's state, while opening.
    pub(super) fn opening_ref(&self) -> Option<&Opening> {
        match self {
            Stage::Opening(opening) => Some(opening),
            _ => None,
        }
    }

    /// Whether the agent being opened advertised `session/load` at `initialize`.
    pub(super) fn load_offered(&self) -> bool {
        self.opening_ref().is_some_and(|opening| opening.load_offered)
    }

    pub(super) fn opening(&mut self) -> Option<&mut Opening> {
        match self {
            Stage::Opening(opening) => Some(opening),
            _ => None,
        }
    }
}

/// A launch, from its start until its ACP session is open.
#[derive(Debug)]
pub(super) struct Launch {
    /// When it started (the launch and resume latency metrics).
    pub(super) started: std::time::Instant,
    /// The resume it is for, if it is one.
    pub(super) resume: Option<ResumeState>,
    /// The prompt sent once the ACP session is open.
    pub(super) initial_prompt: Option<String>,
    /// The session's first: it also records the workspace's commit at the start (read
    /// while the agent starts, written once the launch is reported).
    pub(super) first: bool,
}

impl Launch {
    pub(super) fn new(resume: Option<ResumeState>, initial_prompt: Option<String>) -> Launch {
        Launch { started: std::time::Instant::now(), resume, initial_prompt, first: false }
    }
}

/// The ACP handshake of a launched agent.
#[derive(Debug)]
pub(super) struct Opening {
    pub(super) launch: Launch,
    /// The step awaited and its deadline.
    pub(super) step: Option<(&'static str, Instant)>,
    /// The `authenticate` methods the agent offered at `initialize` (never a `terminal`
    /// one: there is no terminal here).
    pub(super) auth_offered: Vec<String>,
    /// The `terminal` login methods it offered: each one's name and the arguments its own
    /// program takes to log in (shown as what to run once, by hand).
    pub(super) auth_terminal: Vec<(String, Vec<String>)>,
    /// This execution authenticated (once is all it tries).
    pub(super) authenticated: bool,
    /// The agent advertised `session/load` at `initialize`.
    pub(super) load_offered: bool,
    /// A warm agent's replacement, started when the opening ends (see
    /// [`crate::pool::Refill`]): held, never read.
    pub(super) _refill: Option<crate::pool::Refill>,
}

/// What the resume context put before the next prompt is compiled from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ResumeContext {
    /// The history (an injection).
    History,
    /// The history after this seq: what a load's replay showed the agent lacks.
    Missing { after: u64 },
    /// The latest snapshot (a capacity handoff), else the history.
    Handoff,
    /// After a native restore the agent has its own context: only how the workspace
    /// changed since the last snapshot (not by the agent), when it did.
    Drift,
}

impl ResumeContext {
    /// Whether it stands in for the agent's context (an injection or a handoff), rather
    /// than telling a restored agent what changed.
    pub(super) fn rebuilds_context(self) -> bool {
        !matches!(self, ResumeContext::Drift)
    }
}

/// Why intake stopped after a failed write, when it is tried again, and what the try must
/// write that no replay brings back.
#[derive(Debug, Default)]
pub(super) struct Stall {
    pub(super) reason: String,
    /// When the next try is due, and the delay after that one (none before the first is
    /// scheduled).
    pub(super) retry: Option<(Instant, std::time::Duration)>,
    /// A state change the store did not take, written at the next try.
    pub(super) unwritten_state: Option<UnwrittenState>,
    /// User messages (with their turn ids) whose history entry could not be written: no
    /// agentctl replay brings them back, so the next try writes them first.
    pub(super) unwritten_prompts: Vec<(String, crate::ids::TurnId)>,
    /// A loss (its sidecar fenced) whose end waits for the next try: why its agent went.
    /// Meanwhile nothing launches (a resume waits for it).
    pub(super) deferred_loss: Option<String>,
}

/// A session state the actor changed to and the store did not take (a full disk): the
/// arguments of [`SessionActor::set_state`], kept to be written again.
#[derive(Debug, Clone)]
pub(super) struct UnwrittenState {
    pub(super) state: SessionState,
    pub(super) error: Option<String>,
    pub(super) task: Option<&'static str>,
}

/// After a re-attach, until agentctl's replay passed what it held when we connected.
#[derive(Default)]
pub(super) struct CatchUp {
    /// The agentctl seq the replay must reach before `undelivered` is settled.
    pub(super) until: Option<u64>,
    /// Re-attached turns whose prompt was not known to be delivered: request id → turn id.
    pub(super) undelivered: HashMap<String, crate::ids::TurnId>,
    /// Prompts that arrived while the replay ran.
    pub(super) deferred: Vec<(String, Reply<crate::ids::TurnId>)>,
    /// The agent's output is held at agentctl (asked for by a stall) until the re-attach
    /// after it catches up.
    pub(super) holding: bool,
}

/// What of a replayed event was recorded before a restart: those records are skipped.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Recorded {
    pub(super) history: bool,
    pub(super) events: bool,
}

/// A retired execution and what its spool held past what was handled.
pub(super) struct Retired {
    id: crate::ids::ExecutionId,
    record: ExecutionRow,
    result: Result<(), SessionError>,
    leftovers: Vec<Event>,
}

/// A stop or detach whose sidecar is being retired.
struct Teardown {
    /// Answered once the sidecar is gone and its leftovers are recorded.
    reply: Option<Reply<()>>,
    /// How the turn ends, if the leftovers did not end it.
    turn_error: &'static str,
}

/// What to do with a launch still in flight when it lands.
#[derive(Default)]
enum AfterLaunch {
    #[default]
    Keep,
    /// The session was stopped or detached meanwhile: retire it, then answer the stop and
    /// detach callers waiting for that.
    Retire(Vec<Reply<()>>),
}

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
    /// What the actor writes, and a write that failed (see `records.rs`).
    pub(super) recorder: records::Recorder,
    /// The agent's sidecar: the execution, and launches, retires and re-attaches of it
    /// (see `executions.rs`).
    pub(super) sidecar: executions::Sidecar,
    /// Who and what waits for a boundary: resumes, a pause, the idle park (see
    /// `pause.rs`).
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
            sidecar: executions::Sidecar::default(),
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

    // ---- commands ------------------------------------------------------------------------

    async fn handle_command(&mut self, command: Command) {
        if self.row.state.is_terminal() {
            let state = self.row.state;
            return reject(command, || SessionError::Terminal(state));
        }
        match command {
            Command::Prompt { text, reply } => {
                if self.sidecar.catch_up.until.is_some() {
                    // After a re-attach the event log is ahead of the store until the
                    // replay catches up (a turn may have ended there already): a prompt
                    // waits for it rather than being refused as `RUNNING`.
                    self.sidecar.catch_up.deferred.push((text, reply));
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
            Command::Setting { setting, forget, reply } => {
                self.choose_setting(setting, forget, reply).await
            }
        }
    }

    async fn handle_internal(&mut self, report: Internal) {
        match report {
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
                _ if matches!(purpose, Pending::Setting { .. }) => {}
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

    // ---- what the recorder writes, with what the actor holds -----------------------------

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
    }
}
