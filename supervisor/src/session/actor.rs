//! The session actor: its state, its loop, and the commands it serves.
//!
//! The loop is a biased `select!` over, in order: commands (a cancel or stop never waits
//! behind a stream of chunks), reports from its own tasks (launch, re-attach, the outbox),
//! the deadlines (ACP handshake, cancel grace), and agentctl events. Nothing in it awaits
//! the sidecar.

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::Arc;

use agents::profile::Profile;
use protocol::api::{SnapshotTrigger, SnapshotUsage};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::control::Control;
use super::durability::Durability;
use super::launch::{self, Connected, LaunchFailure, LaunchPlan};
use super::leftovers;
use super::outbox::{self, Outgoing};
use super::{
    AdoptPlan, CANCEL_GRACE, Command, MAX_PROMPT_LINE, Phase, Reply, SessionContext, SessionError,
    SessionView, Start,
};
use crate::events::{LaunchStep, SessionEventKind};
use crate::history::{self, EntryType, History};
use crate::store::{
    ExecutorRow, ExecutorStatus, ResumeOutcome, SessionRow, SessionState, TurnState, task_state,
};
use protocol::control::{Event, EventKind};

/// Reports from the actor's own tasks.
pub(super) enum Internal {
    /// A launch finished. (Boxed, like the re-attach: this channel's buffer is allocated
    /// per session in slots of the largest message, and these two are rare.)
    Launched(Box<Result<Connected, LaunchFailure>>),
    /// A re-attach finished.
    Adopted(Box<Result<Connected, String>>),
    /// A control call of the outbox failed: the execution is lost.
    ControlFailed { execution_id: String, error: String },
    /// A permission answer reached agentctl.
    AnswerSent { execution_id: String, request_id: String },
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
        turn_id: String,
        injected: bool,
    },
    /// `authenticate` with `method`, after which the refused step is sent again.
    Authenticate {
        method: String,
        then: AfterAuth,
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
}

/// The live connection to one execution.
pub(super) struct Execution {
    pub(super) id: String,
    pub(super) record: ExecutorRow,
    pub(super) calls: Arc<dyn Control>,
    pub(super) outbox: mpsc::UnboundedSender<Box<Outgoing>>,
    pub(super) events_rx: super::control::EventsRx,
    pub(super) agent_running: bool,
    /// Its sidecar is gone: these are the events its spool held (see `leftovers.rs`).
    pub(super) gone: bool,
}

/// A resume in progress.
pub(super) struct ResumeState {
    /// The token being restored, if any.
    pub(super) token: Option<String>,
    /// The agent was relaunched with the profile's `resume_command`.
    pub(super) relaunched: bool,
    /// A native restore was tried and rejected.
    pub(super) native_failed: bool,
    /// A capacity handoff: a fresh agent session primed from the latest snapshot.
    pub(super) handoff: bool,
}

/// A retired execution and what its spool held past what was handled.
pub(super) struct Retired {
    id: String,
    record: ExecutorRow,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterLaunch {
    Keep,
    /// The session was stopped meanwhile: retire it.
    Retire,
}

pub(super) struct SessionActor {
    pub(super) context: SessionContext,
    pub(super) row: SessionRow,
    pub(super) profile: Arc<Profile>,
    pub(super) record: super::record::SessionRecord,
    pub(super) history: History,
    pub(super) view_tx: watch::Sender<SessionView>,
    pub(super) phase: Phase,
    pub(super) execution: Option<Execution>,
    pub(super) internal_tx: mpsc::UnboundedSender<Internal>,
    internal_rx: Option<mpsc::UnboundedReceiver<Internal>>,
    pub(super) next_request_id: i64,
    pub(super) pending: HashMap<String, Pending>,
    /// The running turn.
    pub(super) turn: Option<String>,
    /// The handshake step awaited and its deadline.
    pub(super) handshake: Option<(&'static str, Instant)>,
    /// When a cancelled turn is ended by us if the agent has not ended it.
    pub(super) cancel_deadline: Option<Instant>,
    /// When the running turn is cancelled (the profile's `process.turn_timeout_ms`).
    turn_deadline: Option<Instant>,
    /// A pause waiting for the running turn (or the launch in flight) to end.
    pub(super) pause: Option<PendingPause>,
    /// The prompt to send once the ACP session is open.
    pub(super) initial_prompt: Option<String>,
    /// The agent's recent stderr, for error messages.
    pub(super) recent_stderr: String,
    /// Open tool calls' latest titles, kinds and diffs (an agent's first title may be a
    /// placeholder, and its final update may no longer show the change).
    pub(super) tool_titles: HashMap<String, (String, String, String)>,
    pub(super) resume: Option<ResumeState>,
    /// Everyone waiting for the session to open (resumes, and resumes of a session that was
    /// starting anyway).
    pub(super) waiters: Vec<Reply<ResumeOutcome>>,
    /// The next prompt carries the resume context (mirrors the stored flag).
    pub(super) resume_context_pending: bool,
    /// That context is a handoff's, compiled from the latest snapshot (else the history's).
    pub(super) handoff_pending: bool,
    /// Context use and cost as the agent last reported them (`usage_update`).
    pub(super) usage: Option<Box<SnapshotUsage>>,
    /// A usage report reached the profile's threshold: a pause for a handoff is asked for
    /// once the report is handled (the reason).
    pub(super) exhausted: Option<String>,
    /// A `session/load` is replaying: its conversation updates restore the agent, not our
    /// records. It lasts until the next prompt reached agentctl (its `Delivered` event),
    /// not until the load's answer: gemini-cli's replay trails its answer, and agentctl
    /// logs `Delivered` before the agent can read the prompt, so all output before it is
    /// the replay's.
    pub(super) loading: bool,
    /// After a load: the conversation its replay repeats, to drop a replay that trails the
    /// next prompt's delivery (see [`super::acp::KnownConversation`]).
    pub(super) replay_known: Option<Box<super::acp::KnownConversation>>,
    /// Acknowledge once the burst of events in flight is through (nothing queued behind
    /// it): replayed updates dropped after a load's answer, or agentctl's backlog at its
    /// bound (see [`SessionActor::handle_agent_event`]).
    pub(super) replay_unacked: bool,
    /// The `authenticate` methods the agent offered at `initialize` (never a `terminal`
    /// one: there is no terminal here), and whether this execution authenticated.
    pub(super) auth_offered: Vec<String>,
    pub(super) authenticated: bool,
    pub(super) durability: Durability,
    /// Suppress recording of the event being handled (it was recorded before a restart).
    pub(super) suppress_history: bool,
    pub(super) suppress_events: bool,
    /// Permission answers queued and not yet sent, with their outcomes: their rows stay
    /// until they are.
    pub(super) answering: HashMap<String, Value>,
    after_launch: AfterLaunch,
    /// Stop and detach callers waiting for a launch in flight to be retired.
    retire_waiters: Vec<Reply<()>>,
    /// A stop's or detach's retire in flight, whose leftovers are recorded when it is done.
    teardown: Option<Teardown>,
    /// The agent's output is held at agentctl until a re-attach after a stall catches up.
    holding: bool,
    /// Why a durable write failed (a full disk): intake is stopped, nothing more is
    /// acknowledged, and the actor re-attaches to its own sidecar after `stall_retry`.
    pub(super) stalled: Option<String>,
    /// When to try again after a failed write, and the delay after that.
    stall_retry: Option<(Instant, std::time::Duration)>,
    /// Re-attached turns whose prompt was not known to be delivered: request id → turn id.
    pub(super) undelivered: HashMap<String, String>,
    /// After a re-attach: the agentctl seq the replay must reach before `undelivered` is
    /// settled.
    pub(super) replay_until: Option<u64>,
    /// Prompts that arrived while a re-attach was still replaying.
    deferred_prompts: Vec<(String, Reply<String>)>,
    /// The generation of the execution whose events are being handled (written into every
    /// session event and history entry, so marks from another execution are not trusted).
    generation: Option<i64>,
    /// Background retires and fences not finished yet (a launch waits for them).
    retiring: Vec<tokio::task::JoinHandle<()>>,
    /// When the launch in flight started (for the launch and resume latency metrics).
    pub(super) launch_started: Option<std::time::Instant>,
    /// The first launch also records the workspace's commit at the start (see
    /// [`record_start_commit`]).
    record_start: bool,
    /// Session events not yet in the event log. They are written together (one write per
    /// handled event or command) and before any store write that would make a replay skip
    /// them, so a kill leaves all of them or none, and a replay that finds them written
    /// suppresses all of them (see `flush_events`).
    unflushed_events: Vec<SessionEventKind>,
}

/// The longest wait between two tries after a failed write.
/// The most agent events handled in a row before the session events are written and
/// commands are looked at again.
const AGENT_EVENT_BURST: usize = 256;

const STALL_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// The most stderr put into a turn's error.
pub(super) const STDERR_IN_ERROR: usize = 2000;

impl SessionActor {
    pub(super) fn new(
        context: SessionContext,
        row: SessionRow,
        profile: Arc<Profile>,
        record: super::record::SessionRecord,
        history: History,
        view_tx: watch::Sender<SessionView>,
    ) -> SessionActor {
        let (internal_tx, internal_rx) = mpsc::unbounded_channel();
        let phase = view_tx.borrow().phase;
        SessionActor {
            context,
            row,
            profile,
            record,
            history,
            view_tx,
            phase,
            execution: None,
            internal_tx,
            internal_rx: Some(internal_rx),
            // Ids unique across supervisor restarts, so a replayed response never meets a
            // new request of the same id.
            next_request_id: crate::store::now_ms() * 1000,
            pending: HashMap::new(),
            turn: None,
            handshake: None,
            cancel_deadline: None,
            turn_deadline: None,
            pause: None,
            initial_prompt: None,
            recent_stderr: String::new(),
            tool_titles: HashMap::new(),
            resume: None,
            waiters: Vec::new(),
            resume_context_pending: false,
            handoff_pending: false,
            usage: None,
            exhausted: None,
            record_start: false,
            launch_started: None,
            loading: false,
            replay_known: None,
            replay_unacked: false,
            auth_offered: Vec::new(),
            authenticated: false,
            durability: Durability::default(),
            generation: None,
            suppress_history: false,
            suppress_events: false,
            answering: HashMap::new(),
            after_launch: AfterLaunch::Keep,
            retire_waiters: Vec::new(),
            teardown: None,
            unflushed_events: Vec::new(),
            retiring: Vec::new(),
            stalled: None,
            stall_retry: None,
            holding: false,
            undelivered: HashMap::new(),
            replay_until: None,
            deferred_prompts: Vec::new(),
        }
    }

    pub(super) async fn run(mut self, mut commands: mpsc::Receiver<Box<Command>>, start: Start) {
        let mut internal = self.internal_rx.take().expect("UNWRAP: taken once, here");
        match start {
            Start::Fresh { initial_prompt } => {
                self.initial_prompt = initial_prompt;
                self.record_start = true;
                Box::pin(self.start_launch(None)).await;
            }
            Start::Resume => Box::pin(self.begin_resume()).await,
            Start::Adopt(plan) => self.start_adopt(*plan),
        }
        // The actor lives while it may own an execution: after the session ends, until a
        // launch in flight has landed (and been retired).
        while self.phase != Phase::Ended
            || self.after_launch == AfterLaunch::Retire
            || self.teardown.is_some()
        {
            let next_deadline = [
                self.handshake.map(|(_, at)| at),
                self.cancel_deadline,
                self.turn_deadline,
                self.stall_retry.map(|(at, _)| at),
                self.pause.as_ref().and_then(|pause| pause.force_at),
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
            let intake = self.stalled.is_none();
            let agent_event = async {
                match self.execution.as_mut() {
                    Some(execution) if intake => execution.events_rx.recv().await,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                // The rare arms are boxed: the task's size is its largest await, and it
                // lives as long as the session.
                command = commands.recv(), if self.phase != Phase::Ended => match command {
                    Some(command) => Box::pin(self.handle_command(*command)).await,
                    None => break,
                },
                Some(report) = internal.recv() => Box::pin(self.handle_internal(report)).await,
                () = deadline => Box::pin(self.deadline_passed()).await,
                // Boxed once per burst (not per event): handling an event is the largest
                // await of this task, which lives as long as the session.
                event = agent_event => Box::pin(self.agent_burst(event)).await,
            }
            self.flush_events();
            if matches!(self.phase, Phase::Idle | Phase::Ended) {
                // No execution: the log is written rarely, so it holds no descriptor
                // meanwhile (the next write reopens it).
                self.record.log().release();
            }
            if self.stalled.is_some() && self.stall_retry.is_none() {
                self.stall();
            }
            if let Some(reason) = self.exhausted.take() {
                Box::pin(self.exhaustion(reason)).await;
                self.flush_events();
            }
            // A pause takes effect at the turn boundary (or once a launch in flight landed).
            // (After a re-attach, not before the replay caught up: a turn may still end there.)
            if self.pause.is_some()
                && self.turn.is_none()
                && self.replay_until.is_none()
                && matches!(self.phase, Phase::Open | Phase::Idle)
            {
                Box::pin(self.pause_now()).await;
            }
        }
        self.flush_events();
        self.record.log().release();
        // Answer whatever is still queued, so no caller waits forever.
        commands.close();
        while let Some(command) = commands.recv().await {
            let state = self.row.state;
            reject(*command, || SessionError::Terminal(state));
        }
    }

    /// Handles an agent event and the events already queued behind it, before the session
    /// events are written: one append per burst, not one per event.
    async fn agent_burst(&mut self, first: Option<super::control::EventItem>) {
        self.agent_event(first).await;
        for _ in 1..AGENT_EVENT_BURST {
            let queued = match self.execution.as_mut() {
                Some(execution) if self.stalled.is_none() && self.phase != Phase::Ended => {
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

    async fn agent_event(&mut self, event: Option<super::control::EventItem>) {
        match event {
            Some(Ok(event)) => self.handle_agent_event(*event).await,
            Some(Err(err)) => self.lost(format!("lost the connection to agentctl: {err}")).await,
            None => self.lost("agentctl's event stream ended".into()).await,
        }
    }

    // ---- commands ------------------------------------------------------------------------

    async fn handle_command(&mut self, command: Command) {
        if self.row.state.is_terminal() {
            let state = self.row.state;
            return reject(command, || SessionError::Terminal(state));
        }
        match command {
            Command::Prompt { text, reply } => {
                if self.replay_until.is_some() {
                    // After a re-attach the event log is ahead of the store until the
                    // replay catches up (a turn may have ended there already): a prompt
                    // waits for it rather than being refused as `RUNNING`.
                    self.deferred_prompts.push((text, reply));
                } else if let Err(err) = self.start_turn(text, Some(reply)).await {
                    tracing::debug!(session = %self.row.id, %err, "prompt refused");
                }
            }
            Command::Cancel { reply } => {
                let result = self.cancel().await;
                let _ = reply.send(result);
            }
            Command::Permission { request_id, outcome, reply } => {
                let result = self.answer_permission(&request_id, outcome).await;
                let _ = reply.send(result);
            }
            Command::Stop { end, reply } => self.stop(end, reply).await,
            Command::Pause { reason, force_after, reply } => {
                let result = self.pause(reason, force_after).await;
                let _ = reply.send(result);
            }
            // A retire in flight: its leftovers are recorded before anything launches.
            Command::Resume { reply, .. } if self.teardown.is_some() => self.waiters.push(reply),
            Command::Resume { refresh: Some(profile), reply } => {
                let busy =
                    matches!(self.phase, Phase::Launching | Phase::Opening | Phase::Adopting)
                        || self.execution.as_ref().is_some_and(|e| e.agent_running);
                if busy {
                    let _ = reply.send(Err(SessionError::InvalidState(
                        "the agent is running with the session's profile; pause the session (or stop-all) first, then resume with refresh_profile".into(),
                    )));
                } else {
                    self.profile = profile;
                    self.waiters.push(reply);
                    self.begin_resume().await;
                }
            }
            Command::Resume { refresh: None, reply } => match self.phase {
                // One launch at a time; everyone gets its outcome.
                Phase::Launching | Phase::Opening | Phase::Adopting => self.waiters.push(reply),
                Phase::Open if self.execution.as_ref().is_some_and(|e| e.agent_running) => {
                    let _ = reply.send(Ok(ResumeOutcome::AlreadyRunning));
                }
                _ => {
                    self.waiters.push(reply);
                    self.begin_resume().await;
                }
            },
            Command::Detach { reply } => self.detach(reply).await,
        }
    }

    /// Starts a turn and queues its prompt; `reply` (if any) gets the turn id once the
    /// prompt reached agentctl, or the error. Returns the error too, for the caller's log.
    pub(super) async fn start_turn(
        &mut self,
        text: String,
        reply: Option<Reply<String>>,
    ) -> Result<(), String> {
        match self.prepare_turn(text).await {
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
    async fn prepare_turn(&mut self, text: String) -> Result<(String, Value), SessionError> {
        match self.row.state {
            SessionState::WaitingForInput => {}
            other => {
                return Err(SessionError::InvalidState(format!(
                    "the session is {}; prompts are taken in WAITING_FOR_INPUT",
                    other.as_str()
                )));
            }
        }
        let Some(execution) = self.execution.as_ref().filter(|execution| execution.agent_running)
        else {
            return Err(SessionError::AgentGone("no execution".into()));
        };
        let execution_id = execution.id.clone();
        let Some(acp_session) = self.view_tx.borrow().acp_session_id.clone() else {
            return Err(SessionError::InvalidState("the ACP session is not open yet".into()));
        };
        let injected = self.resume_context_pending;
        let sent_text = if injected { self.resume_context(&text).await? } else { text.clone() };
        let request_id = self.next_request_id;
        let message = json!({
            "jsonrpc": "2.0",
            "id": request_id,
            "method": protocol::acp::method::SESSION_PROMPT,
            "params": {"sessionId": acp_session, "prompt": [{"type": "text", "text": sent_text}]},
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
        let turn_id = uuid::Uuid::now_v7().to_string();
        // The turn and its request id are durable before the request leaves.
        self.context
            .store
            .insert_turn(turn_id.clone(), self.row.id.clone(), execution_id, request_id.to_string())
            .await?;
        agentctl::fault::point("prompt.recorded");
        self.next_request_id += 1;
        self.record_history(EntryType::UserMessage, text.clone(), None);
        self.emit(SessionEventKind::TurnStarted { turn_id: turn_id.clone(), prompt: text });
        self.turn = Some(turn_id.clone());
        self.turn_deadline = self
            .profile
            .process
            .turn_timeout_ms
            .map(|ms| Instant::now() + std::time::Duration::from_millis(ms));
        self.set_state(SessionState::Running, None, Some(task_state::IN_PROGRESS)).await?;
        self.update_view(|view| view.turn_id = Some(turn_id.clone()));
        self.pending
            .insert(request_id.to_string(), Pending::Prompt { turn_id: turn_id.clone(), injected });
        Ok((turn_id, message))
    }

    async fn cancel(&mut self) -> Result<(), SessionError> {
        if self.turn.is_none() {
            return Err(SessionError::InvalidState("no turn is running".into()));
        }
        let acp_session = self.view_tx.borrow().acp_session_id.clone();
        self.send(Outgoing::Acp(json!({
            "jsonrpc": "2.0",
            "method": protocol::acp::method::SESSION_CANCEL,
            "params": {"sessionId": acp_session},
        })));
        self.cancel_pending_permissions().await;
        // The agent ends the turn with `cancelled`; if it does not, we do.
        self.cancel_deadline.get_or_insert(Instant::now() + CANCEL_GRACE);
        Ok(())
    }

    pub(super) async fn cancel_pending_permissions(&mut self) {
        let pending =
            self.context.store.list_pending(self.row.id.clone()).await.unwrap_or_default();
        for (request_id, _, _) in pending {
            if self.answering.contains_key(&request_id) {
                continue;
            }
            if let Err(err) =
                self.answer_permission(&request_id, json!({"outcome": "cancelled"})).await
            {
                tracing::warn!(session = %self.row.id, %err, "cannot cancel a permission request");
            }
        }
    }

    /// Queues the answer; its row is deleted (and `permission_resolved` published) only once
    /// it reached agentctl, so an answer cut off by a kill is asked again after a restart.
    async fn answer_permission(
        &mut self,
        request_id: &str,
        outcome: Value,
    ) -> Result<(), SessionError> {
        let known = self
            .context
            .store
            .list_pending(self.row.id.clone())
            .await?
            .iter()
            .any(|(id, _, _)| id == request_id);
        // Asked by this execution's agent (its generation leads the id), or not at all.
        let current = super::permission_request_generation(request_id)
            .is_none_or(|generation| generation == self.generation());
        if !known || !current || self.answering.contains_key(request_id) {
            return Err(SessionError::NoSuchRequest(request_id.to_owned()));
        }
        if self.execution.as_ref().is_none_or(|execution| !execution.agent_running) {
            return Err(SessionError::AgentGone("the agent that asked is not running".into()));
        }
        let id = super::agent_request_id(request_id);
        agentctl::fault::point("permission.queued");
        self.send(Outgoing::Answer {
            request_id: request_id.to_owned(),
            message: json!({"jsonrpc": "2.0", "id": id, "result": {"outcome": outcome.clone()}}),
        });
        self.answering.insert(request_id.to_owned(), outcome);
        Ok(())
    }

    async fn stop(&mut self, end: SessionState, reply: Reply<()>) {
        // The end is recorded first: a kill from here on leaves a stopped session whose
        // sidecar recovery kills, never a live session without its stop.
        let recorded = self.set_state(end, None, None).await;
        agentctl::fault::point("stop.recorded");
        if matches!(self.phase, Phase::Launching | Phase::Adopting) {
            // Its task reports later; what it brings is retired then.
            self.after_launch = AfterLaunch::Retire;
        }
        if let Some(execution) = self.execution.take() {
            self.retire_open(execution, None, "the session was stopped").await;
        }
        if self.turn.is_some() && self.teardown.is_none() {
            self.end_turn(TurnState::Failed, None, Some("the session was stopped".into())).await;
        }
        self.handshake = None;
        self.update_view(|view| view.agent_running = false);
        self.pause = None;
        self.fail_waiters("the session was stopped");
        self.enter(Phase::Ended);
        let _ = reply.send(recorded);
    }

    /// `task.session.pause`: at once when no turn runs (the agent and sidecar stopped, then
    /// `PAUSED`); else it waits for the turn (or the launch in flight) to end, cancelling
    /// the turn after `force_after`. Returns whether it waits.
    async fn pause(
        &mut self,
        reason: Option<String>,
        force_after: std::time::Duration,
    ) -> Result<bool, SessionError> {
        self.request_pause(reason, force_after, SnapshotTrigger::Pause).await
    }

    /// The agent's context reached the profile's threshold: the session pauses at the turn
    /// boundary for a handoff (unless a pause is asked for already, or it cannot pause).
    async fn exhaustion(&mut self, reason: String) {
        if self.pause.is_some() || self.row.state.is_terminal() {
            return;
        }
        tracing::info!(session = %self.row.id, %reason, "the agent's context is nearly full; pausing for a handoff");
        let wait = std::time::Duration::from_millis(super::DEFAULT_PAUSE_WAIT_MS);
        if let Err(err) = self.request_pause(Some(reason), wait, SnapshotTrigger::Exhaustion).await
        {
            tracing::warn!(session = %self.row.id, %err, "cannot pause for a handoff");
        }
    }

    /// A pause of either kind; see [`SessionActor::pause`].
    async fn request_pause(
        &mut self,
        reason: Option<String>,
        force_after: std::time::Duration,
        trigger: SnapshotTrigger,
    ) -> Result<bool, SessionError> {
        match self.row.state {
            state if state.is_terminal() => return Err(SessionError::Terminal(state)),
            SessionState::Paused => {
                return Err(SessionError::InvalidState("the session is already PAUSED".into()));
            }
            _ => {}
        }
        if self.pause.is_some() {
            return Err(SessionError::InvalidState(
                "a pause is already requested; it waits for the running turn to end".into(),
            ));
        }
        let busy = self.turn.is_some()
            || matches!(self.phase, Phase::Launching | Phase::Opening | Phase::Adopting);
        self.pause = Some(PendingPause {
            reason: reason.clone(),
            force_at: Some(Instant::now() + force_after),
            forced: false,
            trigger,
        });
        if !busy {
            self.pause_now().await;
            return Ok(false);
        }
        // Kept before it is announced, so a restart still pauses.
        let force_at = crate::store::now_ms()
            .saturating_add(i64::try_from(force_after.as_millis()).unwrap_or(i64::MAX));
        let request = crate::store::PauseRequest { reason: reason.clone(), force_at, trigger };
        if let Err(err) = self.context.store.put_pause(self.row.id.clone(), request).await {
            self.pause = None;
            return Err(err.into());
        }
        self.emit(SessionEventKind::PauseRequested {
            reason,
            force_after_ms: u64::try_from(force_after.as_millis()).unwrap_or(u64::MAX),
        });
        self.update_view(|view| view.pause_requested = true);
        Ok(true)
    }

    /// Pauses now: the agent and sidecar are stopped (and awaited), then the session is
    /// `PAUSED` — its events first, then the store (a replay re-applies the store write).
    pub(super) async fn pause_now(&mut self) {
        let Some(pause) = self.pause.take() else { return };
        if let Some(execution) = self.execution.take()
            && let Err(err) = self.retire_and_record(execution).await
        {
            tracing::warn!(session = %self.row.id, %err, "stopping the agent for a pause");
        }
        self.update_view(|view| view.agent_running = false);
        self.handshake = None;
        // The snapshot sees the workspace as the stopped agent left it.
        let trigger = match pause.trigger {
            SnapshotTrigger::Exhaustion => SnapshotTrigger::Exhaustion,
            _ if pause.forced => SnapshotTrigger::Timeout,
            other => other,
        };
        let request = self.snapshot_request(trigger, pause.reason.clone());
        // After what this actor published so far.
        self.flush_events();
        let (reason, forced) = (pause.reason, pause.forced);
        match self.record.pause(request, reason, pause.trigger, forced, self.mark()).await {
            Ok(()) => {}
            Err(err @ super::record::RecordError::Log(_)) => {
                self.write_failed("the session's event log", &err)
            }
            Err(err) => self.write_failed("the paused state", &err),
        }
        self.row.state = SessionState::Paused;
        self.row.error_message = None;
        self.update_view(|view| {
            view.state = SessionState::Paused;
            view.error = None;
            view.agent_running = false;
            view.pause_requested = false;
        });
        self.enter(Phase::Idle);
    }

    /// Stops the agent and agentctl; the session stays active and needs a resume. The
    /// caller is answered once the sidecar is gone for certain.
    async fn detach(&mut self, reply: Reply<()>) {
        let in_flight = matches!(self.phase, Phase::Launching | Phase::Adopting);
        if in_flight {
            self.after_launch = AfterLaunch::Retire;
            self.retire_waiters.push(reply);
        } else if let Some(execution) = self.execution.take() {
            self.retire_open(execution, Some(reply), "the agent was stopped").await;
        } else {
            let _ = reply.send(Ok(()));
        }
        if self.turn.is_some() && self.teardown.is_none() {
            self.end_turn(TurnState::Failed, None, Some("the agent was stopped".into())).await;
        }
        self.handshake = None;
        self.update_view(|view| view.agent_running = false);
        self.fail_waiters("the agent was stopped");
        if !in_flight {
            self.enter(Phase::Idle);
            if self.row.state == SessionState::Starting {
                let _ = self.set_state(SessionState::WaitingForInput, None, None).await;
            }
        }
    }

    /// Stops an execution in the background: politely, then the fence. `reply` (if any)
    /// is answered when it is gone.
    pub(super) fn retire(&mut self, execution: Execution, reply: Option<Reply<()>>) {
        let context = self.context.clone();
        let grace = std::time::Duration::from_millis(self.profile.process.stop_grace_ms);
        let Execution { id, record, calls, .. } = execution;
        let store = self.context.store.clone();
        let session_id = self.row.id.clone();
        let retiring = self.context.teardowns.spawn(async move {
            let result = launch::retire(context, calls, record, grace).await;
            let _ = store.set_executor_status(session_id, id, ExecutorStatus::Stopped).await;
            if let Some(reply) = reply {
                let _ = reply.send(result.map_err(SessionError::InvalidState));
            }
        });
        self.keep_retiring(retiring);
    }

    /// Remembers a background retire or fence: the next launch waits for it, so a fence
    /// that runs late can never hit the execution launched after it.
    fn keep_retiring(&mut self, task: tokio::task::JoinHandle<()>) {
        self.retiring.retain(|task| !task.is_finished());
        self.retiring.push(task);
    }

    /// Fences an execution that is being dropped (lost, refused), in the background.
    pub(super) fn fence_now(&mut self, record: ExecutorRow) {
        let context = self.context.clone();
        let fencing = self.context.teardowns.spawn(async move {
            if let Err(err) = launch::fence(&context, record, std::time::Duration::ZERO).await {
                tracing::error!(%err, "cannot fence a lost execution");
            }
        });
        self.keep_retiring(fencing);
    }

    // ---- launching ----------------------------------------------------------------------

    /// Starts a resume (DESIGN §6.2): A, a token → native restore (or `resume_command`), no
    /// prompt; B, no token and the session was waiting → boot idle; C, otherwise → the
    /// task's description as the initial prompt.
    pub(super) async fn begin_resume(&mut self) {
        let executor = self.context.store.get_executor(self.row.id.clone()).await.ok().flatten();
        let mut token = executor.as_ref().and_then(|executor| executor.resume_token.clone());
        if token.is_some() && !self.profile.keeps_resume_token() {
            // The profile has no restore path (any more): the token is useless.
            if let Some(executor) = &executor {
                let _ = self
                    .context
                    .store
                    .set_resume_token(self.row.id.clone(), executor.execution_id.clone(), None)
                    .await;
            }
            token = None;
        }
        // A session paused for exhaustion is handed over to a fresh agent session: a native
        // restore would bring the full context back.
        let handoff = matches!(self.context.store.handoff(self.row.id.clone()).await, Ok(Some(_)));
        if handoff {
            token = None;
        }
        let relaunch = token.is_some() && self.profile.relaunches_to_resume();
        self.initial_prompt = match (self.unsent_initial_prompt().await, &token, self.row.state) {
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
        self.resume = Some(ResumeState {
            token: token.clone(),
            relaunched: relaunch,
            native_failed: false,
            handoff,
        });
        if handoff {
            // The fresh agent session starts with an empty context: the old figures (which
            // caused the handoff) no longer hold until the new agent reports its own.
            self.usage = Some(Box::default());
        }
        let relaunch_token = if relaunch { token } else { None };
        self.start_launch(relaunch_token.as_deref()).await;
    }

    /// Decides the argv and starts the launch task (fence, runtime, agentctl, agent).
    pub(super) async fn start_launch(&mut self, resume_token: Option<&str>) {
        // An execution still held (an adopted one whose agent died, not yet replayed) is
        // let go first; the launch fences it anyway, and its end must not look like a loss.
        if let Some(execution) = self.execution.take() {
            self.retire(execution, None);
        }
        self.enter(Phase::Launching);
        self.launch_started = Some(std::time::Instant::now());
        // A new agent: an earlier one's stderr explains nothing of its failures.
        self.recent_stderr.clear();
        if let Err(err) =
            self.set_state(SessionState::Starting, None, Some(task_state::IN_PROGRESS)).await
        {
            return self.fail(format!("launch failed: {err}")).await;
        }
        agentctl::fault::point("launch.started");
        // In a container the agent's home and programs are the container's.
        let in_container = self.context.runtime.agent_home();
        let home = in_container.clone().unwrap_or_else(|| self.context.agent_home.clone());
        let argv = match resume_token {
            Some(token) => self
                .profile
                .resume_argv(&home, token)
                .unwrap_or_else(|| self.profile.launch_argv(&home)),
            None => self.profile.launch_argv(&home),
        };
        let mut resolved = match in_container {
            Some(_) => vec![OsString::from(&argv[0])],
            None => match (self.context.resolve)(&argv[0]) {
                Some(resolved) => resolved,
                None => {
                    return self
                        .fail(format!(
                            "launch failed: the agent program {} is not available",
                            argv[0]
                        ))
                        .await;
                }
            },
        };
        resolved.extend(argv[1..].iter().map(OsString::from));
        let runtime = self.context.runtime.name();
        self.progress(LaunchStep::Launching, Some(format!("{} ({runtime})", argv[0])));
        let previous = self.context.store.get_executor(self.row.id.clone()).await.ok().flatten();
        let execution_id = uuid::Uuid::now_v7().to_string();
        let spec = launch::spec(
            &self.context,
            &self.row,
            &self.profile,
            // The store gives the execution the same generation when it records it.
            (execution_id, previous.as_ref().map_or(1, |previous| previous.generation + 1)),
            agentctl::client::new_token(),
            previous.as_ref().and_then(|previous| previous.runtime_handle.clone()),
        );
        let plan = LaunchPlan {
            spec,
            argv: resolved,
            env: {
                let mut env = self.profile.launch_env(&home);
                if in_container.is_some() {
                    // A container is the sandbox such an agent asks for when run as root.
                    for (name, value) in &self.profile.process.root_env {
                        env.entry(name.clone()).or_insert_with(|| value.clone());
                    }
                }
                env.into_iter().collect()
            },
            previous,
        };
        self.resume_context_pending = false;
        self.handoff_pending = false;
        self.replay_known = None;
        let context = self.context.clone();
        let internal_tx = self.internal_tx.clone();
        let retiring = std::mem::take(&mut self.retiring);
        let start = std::mem::take(&mut self.record_start)
            .then(|| (self.row.id.clone(), std::path::PathBuf::from(&self.row.workspace_path)));
        self.context.teardowns.spawn(async move {
            for task in retiring {
                let _ = task.await;
            }
            let (launched, ()) = tokio::join!(launch::launch(context.clone(), plan), async {
                if let Some((session_id, workspace)) = start {
                    record_start_commit(&context.store, session_id, &workspace).await;
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
        });
    }

    fn start_adopt(&mut self, plan: AdoptPlan) {
        self.enter(Phase::Adopting);
        let internal_tx = self.internal_tx.clone();
        let context = self.context.clone();
        self.context.teardowns.spawn(async move {
            let adopted = Box::new(if plan.gone {
                Ok(launch::adopt_gone(&context, plan.executor))
            } else {
                launch::adopt(context.clone(), plan.addr, plan.executor).await
            });
            if let Err(mpsc::error::SendError(Internal::Adopted(adopted))) =
                internal_tx.send(Internal::Adopted(adopted))
                && let Ok(connected) = *adopted
            {
                // The actor is gone: nobody owns this execution.
                if let Err(err) =
                    launch::fence(&context, connected.record, std::time::Duration::ZERO).await
                {
                    tracing::error!(%err, "cannot fence an unowned execution");
                }
            }
        });
        for open in plan.open_turns {
            let turn_id = open.turn_id;
            if !open.delivered {
                self.undelivered.insert(open.request_id.clone(), turn_id.clone());
            }
            self.pending.insert(
                open.request_id,
                Pending::Prompt { turn_id: turn_id.clone(), injected: false },
            );
            self.turn = Some(turn_id);
        }
    }

    /// After a re-attach, once the replay has passed what agentctl held when we connected:
    /// a turn whose prompt was never delivered will never end, so it fails now, saying so.
    pub(super) async fn settle_undelivered(&mut self) {
        self.replay_until = None;
        if std::mem::take(&mut self.holding) {
            // Caught up after a stall: the agent's output is taken in again.
            self.send(Outgoing::Hold(false));
        }
        let deferred = std::mem::take(&mut self.deferred_prompts);
        let undelivered: Vec<(String, String)> = self.undelivered.drain().collect();
        let first_prompt = self.unsent_initial_prompt().await;
        for (request_id, turn_id) in undelivered {
            // The create's prompt was acknowledged: sent again under the same request, so it
            // runs once and is recorded once. Any other prompt's caller had no answer yet.
            if let Some(prompt) = &first_prompt
                && self.turn.as_deref() == Some(turn_id.as_str())
                && self.resend_prompt(&request_id, &turn_id, prompt)
            {
                continue;
            }
            self.pending.remove(&request_id);
            let error =
                "the supervisor stopped before this prompt reached the agent; send it again";
            if self.turn.as_deref() == Some(turn_id.as_str()) {
                self.end_turn(TurnState::Failed, None, Some(error.into())).await;
            } else if let Err(err) = self
                .context
                .store
                .end_turn(turn_id, TurnState::Failed, None, Some(error.into()))
                .await
            {
                self.write_failed("the end of a turn", &err);
            }
        }
        self.send_unsent_initial_prompt().await;
        for (text, reply) in deferred {
            if let Err(err) = self.start_turn(text, Some(reply)).await {
                tracing::debug!(session = %self.row.id, %err, "prompt refused");
            }
        }
    }

    /// Sends a recorded turn's prompt that never reached the agent again, under its own
    /// request id; false when it cannot be (no agent, no ACP session, a resume context).
    fn resend_prompt(&mut self, request_id: &str, turn_id: &str, prompt: &str) -> bool {
        let running = self.execution.as_ref().is_some_and(|execution| execution.agent_running);
        let acp_session = self.view_tx.borrow().acp_session_id.clone();
        let injected =
            matches!(self.pending.get(request_id), Some(Pending::Prompt { injected: true, .. }));
        let (Some(acp_session), Ok(id), true, false) =
            (acp_session, request_id.parse::<i64>(), running, injected)
        else {
            return false;
        };
        let message = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": protocol::acp::method::SESSION_PROMPT,
            "params": {"sessionId": acp_session, "prompt": [{"type": "text", "text": prompt}]},
        });
        tracing::info!(session = %self.row.id, turn = %turn_id, "sending the first prompt again: it never reached the agent");
        if self.history.is_empty() {
            // Killed before the turn's start was written (see `prepare_turn`).
            self.record_history(EntryType::UserMessage, prompt.to_owned(), None);
            self.emit(SessionEventKind::TurnStarted {
                turn_id: turn_id.to_owned(),
                prompt: prompt.to_owned(),
            });
        }
        self.send(Outgoing::Prompt { message, turn_id: turn_id.to_owned(), reply: None });
        true
    }

    /// The generation of the execution whose events are being handled (0 before any).
    pub(super) fn generation(&self) -> i64 {
        self.generation.unwrap_or_default()
    }

    /// The prompt the session was created with (its task's description when it was
    /// created without one), while no prompt of it ever reached an agent: an acknowledged
    /// create runs it exactly once, across kills and failed launches.
    pub(super) async fn unsent_initial_prompt(&self) -> Option<String> {
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
    async fn send_unsent_initial_prompt(&mut self) {
        let ready = self.execution.as_ref().is_some_and(|execution| execution.agent_running)
            && self.phase == Phase::Open
            && self.turn.is_none()
            && self.replay_until.is_none()
            && self.row.state == SessionState::WaitingForInput;
        if !ready {
            return;
        }
        if let Some(prompt) = self.unsent_initial_prompt().await
            && let Err(err) = self.start_turn(prompt, None).await
        {
            self.emit(SessionEventKind::Notice {
                message: format!("the initial prompt could not be sent: {err}"),
            });
        }
    }

    async fn handle_internal(&mut self, report: Internal) {
        match report {
            Internal::SnapshotTaken { snapshot_id, trigger } => {
                self.emit(SessionEventKind::SnapshotTaken { snapshot_id, trigger });
            }
            Internal::Retired(retired) => self.retired(*retired).await,
            Internal::Launched(launched) => self.launched(*launched).await,
            Internal::Adopted(adopted) => self.adopted(*adopted).await,
            Internal::ControlFailed { execution_id, error } => {
                if self.execution.as_ref().is_some_and(|execution| execution.id == execution_id) {
                    self.lost(format!("agentctl stopped answering: {error}")).await;
                }
            }
            Internal::AnswerSent { execution_id, request_id } => {
                let outcome = self.answering.remove(&request_id).unwrap_or(Value::Null);
                let current =
                    self.execution.as_ref().is_some_and(|execution| execution.id == execution_id);
                if current {
                    // Published before the row goes.
                    self.emit(SessionEventKind::PermissionResolved {
                        request_id: request_id.clone(),
                        outcome,
                    });
                    self.flush_events();
                    if let Err(err) =
                        self.context.store.delete_pending(self.row.id.clone(), request_id).await
                    {
                        self.write_failed("an answered permission request", &err);
                    }
                }
            }
        }
    }

    /// A stop or detach came while launching or re-attaching: clears the request and
    /// returns the reply to give once the retire is done (other callers are answered now).
    fn stop_after_launch(&mut self) -> Option<Reply<()>> {
        self.after_launch = AfterLaunch::Keep;
        let mut waiters = std::mem::take(&mut self.retire_waiters);
        let reply = waiters.pop();
        for other in waiters {
            let _ = other.send(Ok(()));
        }
        reply
    }

    async fn launched(&mut self, launched: Result<Connected, LaunchFailure>) {
        let connected = match launched {
            Ok(connected) => connected,
            Err(failure) => {
                if self.after_launch == AfterLaunch::Retire {
                    if let Some(reply) = self.stop_after_launch() {
                        let _ = reply.send(Ok(()));
                    }
                    if self.phase != Phase::Ended {
                        self.enter(Phase::Idle);
                        let _ = self.set_state(SessionState::WaitingForInput, None, None).await;
                    }
                    return;
                }
                return self.fail(format!("launch failed: {}", failure.reason)).await;
            }
        };
        let execution = self.connect(connected, true);
        if self.after_launch == AfterLaunch::Retire {
            // Stopped or detached while launching.
            let reply = self.stop_after_launch();
            self.retire(execution, reply);
            if self.phase != Phase::Ended {
                self.enter(Phase::Idle);
                let _ = self.set_state(SessionState::WaitingForInput, None, None).await;
            }
            return;
        }
        // A new execution starts a new agentctl sequence: nothing of it was recorded yet
        // (and nothing of it is held).
        self.durability = Default::default();
        self.holding = false;
        self.loading = false;
        self.generation = Some(execution.record.generation);
        self.history.set_generation(execution.record.generation);
        self.execution = Some(execution);
        self.update_view(|view| view.agent_running = true);
        self.enter(Phase::Opening);
        let params = json!({
            "protocolVersion": protocol::acp::PROTOCOL_VERSION,
            "clientCapabilities": {"fs": {"readTextFile": true, "writeTextFile": true}, "terminal": false},
            "clientInfo": {"name": "tether", "title": "Tether", "version": env!("CARGO_PKG_VERSION")},
        });
        self.progress(LaunchStep::Initializing, None);
        self.request(protocol::acp::method::INITIALIZE, params, Pending::Initialize);
    }

    /// A native restore (`session/load`, `session/resume`) awaits the agent's answer.
    pub(super) fn restoring(&self) -> bool {
        self.pending.values().any(|pending| matches!(pending, Pending::Restore { .. }))
    }

    /// Publishes a step of bringing the agent up.
    pub(super) fn progress(&mut self, step: LaunchStep, detail: Option<String>) {
        self.emit(SessionEventKind::Progress { step, detail });
    }

    async fn adopted(&mut self, adopted: Result<Connected, String>) {
        if self.after_launch == AfterLaunch::Retire {
            // Stopped or detached while re-attaching: what was found is retired (or fenced).
            let reply = self.stop_after_launch();
            match adopted {
                Ok(connected) => {
                    let execution = self.connect(connected, false);
                    self.retire(execution, reply);
                }
                Err(_) => {
                    if let Ok(Some(record)) =
                        self.context.store.get_executor(self.row.id.clone()).await
                    {
                        self.fence_now(record);
                    }
                    if let Some(reply) = reply {
                        let _ = reply.send(Ok(()));
                    }
                }
            }
            if self.phase != Phase::Ended {
                self.pending.clear();
                self.turn = None;
                self.enter(Phase::Idle);
            }
            return;
        }
        let connected = match adopted {
            Ok(connected) => connected,
            Err(err) => {
                // The sidecar died, hangs, or refused us: fence it, recover as dead.
                tracing::warn!(session = %self.row.id, %err, "cannot re-attach to agentctl");
                let record =
                    self.context.store.get_executor(self.row.id.clone()).await.ok().flatten();
                if let Some(record) = record {
                    self.fence_now(record.clone());
                    let _ = self
                        .context
                        .store
                        .set_executor_status(
                            self.row.id.clone(),
                            record.execution_id,
                            ExecutorStatus::Dead,
                        )
                        .await;
                }
                let reason = format!("could not re-attach to the agent after a restart: {err}");
                self.pending.clear();
                self.turn = None;
                self.update_view(|view| view.turn_id = None);
                // Its turns interrupted and its questions void, as recovery ends a dead
                // execution's work (after what this actor published so far).
                self.flush_events();
                self.answering.clear();
                if let Err(err) = self.record.void_open_work(&reason, Vec::new(), self.mark()).await
                {
                    self.write_failed("interrupted turns", &err);
                }
                self.enter(Phase::Idle);
                self.execution_gone(&reason, TurnState::Failed).await;
                // Anyone who asked for a resume meanwhile gets one now.
                if !self.waiters.is_empty() {
                    self.begin_resume().await;
                }
                return;
            }
        };
        let status = connected.status.clone();
        let record = connected.record.clone();
        let execution = self.connect(connected, false);
        let running = status
            .as_ref()
            .is_some_and(|s| s.agent_state == protocol::control::AgentState::Running);
        let acked = record.acked_seq.max(0) as u64;
        // Marks count only for the execution they were written for.
        let events_mark = self.record.events_mark(record.generation);
        let history_mark = self.history.mark_for(record.generation);
        tracing::debug!(
            session = %self.row.id,
            generation = record.generation,
            acked,
            history_mark,
            events_mark,
            last_seq = ?status.as_ref().map(|status| status.last_seq),
            "re-attached to agentctl"
        );
        self.durability = Durability::resuming_at(acked, history_mark, events_mark);
        self.generation = Some(record.generation);
        self.history.set_generation(record.generation);
        self.resume_context_pending = record.resume_context_pending;
        self.handoff_pending = record.resume_context_pending
            && record.resume_outcome == Some(ResumeOutcome::ContextHandoff);
        self.execution = Some(Execution { agent_running: running, ..execution });
        let turn_id = self.turn.clone();
        self.update_view(|view| {
            view.agent_running = running;
            view.acp_session_id = record.acp_session_id.clone();
            view.turn_id = turn_id;
            view.resume_outcome = record.resume_outcome;
        });
        if !self.holding && running {
            // A hold a stalled predecessor (killed since) asked for ends here.
            self.send(Outgoing::Hold(false));
        }
        match status.as_ref().map(|status| status.last_seq) {
            Some(until) if until > acked => self.replay_until = Some(until),
            _ => self.settle_undelivered().await,
        }
        self.enter(Phase::Open);
        // A pause asked for before the restart still holds (its turn may still run).
        if let Ok(Some(request)) = self.context.store.get_pause(self.row.id.clone()).await {
            let left = request.force_at.saturating_sub(crate::store::now_ms()).max(0);
            self.pause = Some(PendingPause {
                reason: request.reason,
                force_at: Some(Instant::now() + std::time::Duration::from_millis(left as u64)),
                forced: false,
                trigger: request.trigger,
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
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send(Ok(ResumeOutcome::AlreadyRunning));
        }
        // People may still answer what the agent asked before the restart.
        if let Ok(pending) = self.context.store.list_pending(self.row.id.clone()).await {
            for (request_id, _, params) in pending {
                self.emit(SessionEventKind::PermissionRequest { request_id, params });
            }
        }
        self.send_unsent_initial_prompt().await;
    }

    fn connect(&self, connected: Connected, agent_running: bool) -> Execution {
        let Connected { record, calls, events_rx, gone, .. } = connected;
        let outbox = outbox::start_outbox(
            record.execution_id.clone(),
            Arc::clone(&calls),
            self.internal_tx.clone(),
        );
        Execution {
            id: record.execution_id.clone(),
            record,
            calls,
            outbox,
            events_rx,
            agent_running,
            gone,
        }
    }

    async fn deadline_passed(&mut self) {
        let now = Instant::now();
        if let Some((at, delay)) = self.stall_retry
            && at <= now
        {
            return self.retry_after_stall(delay).await;
        }
        if let Some((step, at)) = self.handshake
            && at <= now
        {
            self.handshake = None;
            if self.restoring() {
                // A restore that never answers is a failed restore, not the session's end:
                // forget it (a late answer is ignored) and fall back to a fresh session.
                self.pending.retain(|_, pending| !matches!(pending, Pending::Restore { .. }));
                let reason = format!(
                    "the agent did not answer {step} within {} ms",
                    self.profile.process.init_timeout_ms
                );
                return self.restore_rejected(reason).await;
            }
            let tail = self.stderr_tail();
            return self
                .fail(format!(
                    "the agent did not answer {step} within {} ms{tail}",
                    self.profile.process.init_timeout_ms
                ))
                .await;
        }
        if let Some(pause) = self.pause.as_mut()
            && pause.force_at.is_some_and(|at| at <= now)
        {
            // Once: a launch in flight (no turn) just lands, and then the pause applies.
            pause.force_at = None;
            if self.turn.is_some() {
                pause.forced = true;
                let message =
                    "the pause waited long enough: the running turn is cancelled".to_owned();
                tracing::warn!(session = %self.row.id, "{message}");
                self.emit(SessionEventKind::Notice { message });
                if let Err(err) = self.cancel().await {
                    tracing::debug!(session = %self.row.id, %err, "cancel for a pause");
                }
            }
        }
        if let Some(at) = self.turn_deadline
            && at <= now
        {
            self.turn_deadline = None;
            if self.turn.is_some() {
                let message = format!(
                    "the turn ran longer than the profile's process.turn_timeout_ms ({} ms): it is cancelled",
                    self.profile.process.turn_timeout_ms.unwrap_or_default()
                );
                tracing::warn!(session = %self.row.id, "{message}");
                self.emit(SessionEventKind::Notice { message });
                if let Err(err) = self.cancel().await {
                    tracing::debug!(session = %self.row.id, %err, "cancel for the turn timeout");
                }
            }
        }
        if let Some(at) = self.cancel_deadline
            && at <= now
        {
            self.cancel_deadline = None;
            if let Some(turn_id) = self.turn.clone() {
                // The agent never confirmed the cancel: end the turn ourselves and forget
                // its request (a late answer is ignored).
                self.pending.retain(
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
    }

    // ---- shared -------------------------------------------------------------------------

    /// Sends an ACP request and remembers what it was for. Returns its id.
    pub(super) fn request(
        &mut self,
        method: &'static str,
        params: Value,
        purpose: Pending,
    ) -> String {
        let id = self.next_request_id;
        self.next_request_id += 1;
        let key = id.to_string();
        if !matches!(purpose, Pending::Prompt { .. }) {
            self.handshake = Some((
                method,
                Instant::now()
                    + std::time::Duration::from_millis(self.profile.process.init_timeout_ms),
            ));
        }
        self.pending.insert(key.clone(), purpose);
        self.send(Outgoing::Acp(
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        ));
        key
    }

    /// Queues a control call (a failure is reported back as [`Internal::ControlFailed`]).
    pub(super) fn send(&self, outgoing: Outgoing) {
        if let Some(execution) = &self.execution {
            let _ = execution.outbox.send(Box::new(outgoing));
        }
    }

    /// The resume context around `prompt`, from the history on disk.
    async fn resume_context(&self, prompt: &str) -> Result<String, SessionError> {
        if self.handoff_pending {
            match self.context.store.latest_snapshot(self.row.id.clone()).await {
                Ok(Some(snapshot)) => {
                    let budget = self.profile.session.resume_context_budget;
                    return Ok(crate::snapshot::handoff_context(&snapshot, prompt, budget));
                }
                // No snapshot to compile from: the history it would summarise instead.
                Ok(None) => {}
                Err(err) => return Err(err.into()),
            }
        }
        let path = self.history.path().to_owned();
        let prompt = prompt.to_owned();
        let budget = self.profile.session.resume_context_budget;
        let built = tokio::task::spawn_blocking(move || {
            let mut file = std::fs::File::open(&path)?;
            crate::resume_context::build(&mut file, &prompt, budget)
        })
        .await
        .map_err(|err| SessionError::InvalidState(format!("building the resume context: {err}")))?
        .map_err(|err| SessionError::InvalidState(format!("reading the history: {err}")))?;
        Ok(built.text)
    }

    /// Syncs what was written and stores `acked_seq`, then acknowledges through the
    /// outbox — nothing before it is durable (see `durability.rs`).
    pub(super) async fn ack(&mut self, force: bool) {
        if self.stalled.is_some() {
            return;
        }
        let Some(seq) = self.durability.due(self.history.unflushed_since(), force) else {
            // Nothing to acknowledge: the session events stay buffered until the actor's
            // loop writes them (once per burst of agent events).
            return;
        };
        // What the handled events published must be in the log before it is synced.
        self.flush_events();
        if self.stalled.is_some() {
            return;
        }
        let Some(execution_id) = self.execution.as_ref().map(|execution| execution.id.clone())
        else {
            return;
        };
        if let Err(err) = self
            .history
            .sync()
            .and_then(|()| self.record.log().sync().map_err(std::io::Error::other))
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
        metrics.ack_lag.observe(self.durability.handled.saturating_sub(seq) as f64);
        self.durability.acked(seq);
    }

    pub(super) async fn end_turn(
        &mut self,
        state: TurnState,
        stop_reason: Option<String>,
        error: Option<String>,
    ) {
        let Some(turn_id) = self.turn.take() else { return };
        self.cancel_deadline = None;
        self.turn_deadline = None;
        self.tool_titles.clear();
        self.replay_known = None;
        if let Err(err) = self.history.flush_agent() {
            self.write_failed("the history", &err);
        }
        // Events first (the turn's end, then the state it leads to), then one store write
        // for both: once the row says the turn ended, a replay no longer ends it, so
        // everything it publishes must be out first.
        self.emit(SessionEventKind::TurnEnded {
            turn_id: turn_id.clone(),
            state,
            stop_reason: stop_reason.clone(),
            error: error.clone(),
        });
        self.update_view(|view| view.turn_id = None);
        let waiting = SessionState::WaitingForInput;
        let then = (!self.row.state.is_terminal()
            && (self.row.state != waiting || self.row.error_message != error))
            .then(|| (waiting, error.clone(), Some(task_state::REVIEW)));
        if let Some((state, error, _)) = &then {
            self.emit(SessionEventKind::State { state: (*state), error: error.clone() });
        }
        self.flush_events();
        let written = self
            .context
            .store
            .end_turn_then(turn_id, (state, stop_reason, error), then.clone())
            .await;
        match written {
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
            Err(err) => self.write_failed("the end of a turn", &err),
        }
        agentctl::fault::point("turn.recorded");
        if state == TurnState::Completed {
            self.snapshot_in_background(SnapshotTrigger::TurnComplete, None);
        }
    }

    /// The execution is gone (its agent exited, its sidecar was lost or refused us): the
    /// agent's questions are void, a running turn fails, and the session waits for input
    /// with the reason, recoverable.
    pub(super) async fn execution_gone(&mut self, reason: &str, turn_ends: TurnState) {
        self.handshake = None;
        self.drop_replay(reason);
        self.update_view(|view| view.agent_running = false);
        self.void_pending().await;
        if self.turn.is_some() {
            self.end_turn(turn_ends, None, Some(reason.to_owned())).await;
        }
        if self.row.state.is_terminal() {
            // The end of a stopped session's teardown: it stays as it was ended.
            return;
        }
        let _ = self
            .set_state(
                SessionState::WaitingForInput,
                Some(reason.to_owned()),
                Some(task_state::REVIEW),
            )
            .await;
        let _ = self.context.store.log_error(self.row.id.clone(), reason.to_owned()).await;
        self.snapshot_in_background(SnapshotTrigger::Crash, Some(reason.to_owned()));
    }

    /// The agent's open questions are void (it is gone): each is resolved `cancelled`,
    /// published before its row goes (a replay finds no row to publish again).
    async fn void_pending(&mut self) {
        self.answering.clear();
        // After what this actor published so far.
        self.flush_events();
        match self.record.void_questions(self.mark()).await {
            Ok(_) => {}
            Err(err @ super::record::RecordError::Log(_)) => {
                self.write_failed("the session's event log", &err)
            }
            // The rows stay; the next end of this execution's work tries again.
            Err(err) => tracing::warn!(session = %self.row.id, %err, "cannot void open questions"),
        }
    }

    /// What a snapshot of this session now is taken from.
    fn snapshot_request(
        &self,
        trigger: SnapshotTrigger,
        reason: Option<String>,
    ) -> crate::snapshot::Request {
        crate::snapshot::Request {
            session_id: self.row.id.clone(),
            trigger,
            reason,
            history: self.history.path().to_owned(),
            execution_id: self.execution.as_ref().map(|execution| execution.id.clone()),
            usage: self.usage.as_deref().cloned(),
        }
    }

    /// Takes a snapshot without holding the actor up; its event follows when it is stored.
    pub(super) fn snapshot_in_background(&self, trigger: SnapshotTrigger, reason: Option<String>) {
        let request = self.snapshot_request(trigger, reason);
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

    /// agentctl itself went away, stopped answering, or refused our subscription. It is
    /// fenced (nothing may run unowned), then what its spool holds beyond what was handled
    /// is recorded, then the execution's open work is void.
    pub(super) async fn lost(&mut self, reason: String) {
        let mut reason = reason;
        let Some(execution) = self.execution.take() else { return };
        if let Some(why) = self.context.runtime.exit_reason(&execution.record).await {
            reason = format!("{reason}: {why}");
        }
        let _ = self
            .context
            .store
            .set_executor_status(self.row.id.clone(), execution.id.clone(), ExecutorStatus::Lost)
            .await;
        if matches!(self.phase, Phase::Opening | Phase::Launching) {
            self.fence_now(execution.record.clone());
            drop(execution);
            return self.fail(reason).await;
        }
        // Its turn was cut by the supervisor's own downtime (its spool replayed at
        // recovery), or by the sidecar's loss now.
        let mut turn_ends = TurnState::Failed;
        if execution.gone {
            // A stop cut short by a kill, finished at recovery, or a loss while down.
            reason = if self.row.state.is_terminal() {
                "the session was stopped".into()
            } else {
                super::STOPPED_WHILE_DOWN.into()
            };
            turn_ends = TurnState::Interrupted;
        } else {
            // Its spool is read once nothing writes it any more.
            let Execution { id, record, .. } = execution;
            match launch::fence(&self.context, record.clone(), std::time::Duration::ZERO).await {
                Ok(()) => {
                    let dir = leftovers::spool_dir(&self.context.agentctl_dir());
                    let events = leftovers::read(dir, self.durability.handled);
                    if let Some(exit) = self.record_leftovers(id, record, events).await {
                        reason = exit;
                    }
                }
                Err(err) => {
                    tracing::error!(session = %self.row.id, %err, "cannot fence a lost execution")
                }
            }
        }
        self.enter(Phase::Idle);
        self.execution_gone(&reason, turn_ends).await;
        if self.row.state.is_terminal() {
            // A stopped session's teardown, finished: nothing more to own.
            return self.enter(Phase::Ended);
        }
        // Anyone who asked for a resume meanwhile gets one now.
        if !self.waiters.is_empty() {
            self.begin_resume().await;
        }
    }

    /// Records what the spool of an execution whose sidecar is gone (fenced or retired)
    /// holds beyond the last event handled, through the same handling as live events, and
    /// acknowledges it. Returns why the agent exited, when the spool says so (its exit is
    /// the caller's to handle: a stop ends the turn its own way).
    pub(super) async fn record_leftovers(
        &mut self,
        id: String,
        record: ExecutorRow,
        events_rx: super::control::EventsRx,
    ) -> Option<String> {
        let calls: Arc<dyn Control> = Arc::new(leftovers::DeadSidecar);
        let outbox = outbox::start_outbox(id.clone(), Arc::clone(&calls), self.internal_tx.clone());
        self.execution = Some(Execution {
            id,
            record,
            calls,
            outbox,
            events_rx,
            agent_running: false,
            gone: true,
        });
        let mut exit = None;
        let mut in_burst = 0;
        while let Some(execution) = self.execution.as_mut() {
            if self.stalled.is_some() {
                // Not acknowledged: read again at the next try (the spool stays).
                break;
            }
            let Some(Ok(event)) = execution.events_rx.recv().await else { break };
            // The agent's end is the caller's to handle (a stop ends the turn its own way).
            match event.kind {
                EventKind::AgentExited { status, stderr_tail } => {
                    self.durability.handled = event.seq;
                    exit = Some(self.exit_reason(status, &stderr_tail));
                }
                EventKind::StdoutClosed => self.durability.handled = event.seq,
                _ => self.handle_agent_event(*event).await,
            }
            in_burst += 1;
            if in_burst == AGENT_EVENT_BURST {
                in_burst = 0;
                self.flush_events();
            }
        }
        self.ack(true).await;
        self.flush_events();
        self.execution = None;
        exit
    }

    /// Retires an execution on a stop or detach: an open one is stopped in the background
    /// and what its spool still held is recorded when that is done (see
    /// [`Internal::Retired`]), then its turn ends with `turn_error`; one still shaking
    /// hands has nothing to record. `reply` is answered once it is gone.
    async fn retire_open(
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
        if self.phase != Phase::Open {
            return self.retire(execution, reply);
        }
        let after = self.durability.handled;
        let dir = leftovers::spool_dir(&self.context.agentctl_dir());
        let (id, record) = (execution.id.clone(), execution.record.clone());
        let (gone_tx, gone) = tokio::sync::oneshot::channel();
        self.retire(execution, Some(gone_tx));
        self.teardown = Some(Teardown { reply, turn_error });
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
    async fn retired(&mut self, retired: Retired) {
        let Retired { id, record, result, leftovers } = retired;
        let Some(teardown) = self.teardown.take() else { return };
        let (tx, events) = mpsc::channel(leftovers.len().max(1));
        for event in leftovers {
            let _ = tx.try_send(Ok(Box::new(event)));
        }
        drop(tx);
        self.record_leftovers(id, record, events).await;
        // The agent that asked is gone: its questions are void.
        self.void_pending().await;
        if self.turn.is_some() {
            self.end_turn(TurnState::Failed, None, Some(teardown.turn_error.into())).await;
        }
        if let Some(reply) = teardown.reply {
            let _ = reply.send(result);
        }
        // Anyone who asked for a resume meanwhile gets one now.
        if self.phase != Phase::Ended && !self.waiters.is_empty() {
            self.begin_resume().await;
        }
    }

    /// Retires an execution and waits until its sidecar is gone, then records what its
    /// spool still held: what the agent emitted until it exited is kept, whatever ended it.
    async fn retire_and_record(&mut self, execution: Execution) -> Result<(), SessionError> {
        let (id, record) = (execution.id.clone(), execution.record.clone());
        let (gone_tx, gone) = tokio::sync::oneshot::channel();
        self.retire(execution, Some(gone_tx));
        let retired = gone.await.unwrap_or(Ok(()));
        let events = leftovers::read(
            leftovers::spool_dir(&self.context.agentctl_dir()),
            self.durability.handled,
        );
        self.record_leftovers(id, record, events).await;
        retired
    }

    /// A launch failure: session and task `FAILED` with the reason; the execution is
    /// retired (and fenced).
    pub(super) async fn fail(&mut self, reason: String) {
        tracing::warn!(session = %self.row.id, %reason, "session failed");
        let _ = self.context.store.log_error(self.row.id.clone(), reason.clone()).await;
        self.handshake = None;
        if let Some(execution) = self.execution.take() {
            self.retire(execution, None);
        }
        self.update_view(|view| view.agent_running = false);
        if self.turn.is_some() {
            self.end_turn(TurnState::Failed, None, Some(reason.clone())).await;
        }
        let _ = self
            .set_state(SessionState::Failed, Some(reason.clone()), Some(task_state::FAILED))
            .await;
        self.fail_waiters(&reason);
        self.enter(Phase::Ended);
    }

    /// A durable write failed: nothing more is acknowledged, and after this handling the
    /// actor stops taking agentctl's events (they wait in agentctl's spool) until a retry
    /// succeeds. Nothing acknowledged is lost; nothing unacknowledged is dropped.
    pub(super) fn write_failed(&mut self, what: &str, err: &dyn std::fmt::Display) {
        tracing::error!(session = %self.row.id, %err, "cannot write {what}");
        if self.stalled.is_none() {
            self.stalled = Some(format!(
                "cannot write {what}: {err}; the agent's output is held (nothing is lost) until it can"
            ));
        }
    }

    /// Stops intake and shows why; schedules the first retry.
    fn stall(&mut self) {
        let reason = self.stalled.clone().unwrap_or_default();
        self.update_view(|view| view.error = Some(reason.clone()));
        // Said after the status shows it, so whoever reads the log line finds it there.
        tracing::error!(session = %self.row.id, %reason, "intake stops until it can");
        // The stream is dropped: what it still had comes again from agentctl on retry.
        // And the agent's output is held at agentctl meanwhile: the room freed later goes
        // to recording what is spooled, not to more output (released once caught up).
        if let Some(execution) = self.execution.as_mut() {
            let (_, closed) = mpsc::channel(1);
            execution.events_rx = closed;
            if !execution.gone {
                self.holding = true;
                self.send(Outgoing::Hold(true));
            }
        }
        let delay = std::time::Duration::from_millis(200);
        self.stall_retry = Some((Instant::now() + delay, delay));
    }

    /// Tries again after a failed write: the history is reopened (a torn tail cut, its mark
    /// read back), the open turns are read back from the store, and the actor re-attaches to
    /// its own sidecar after the acknowledged seq — the replay path of a restart, so each
    /// event is recorded once. A failure here waits longer and tries again.
    async fn retry_after_stall(&mut self, delay: std::time::Duration) {
        let again = |actor: &mut SessionActor, why: String| {
            let next = (delay * 2).min(STALL_RETRY_MAX);
            actor.stalled = Some(why);
            actor.stall_retry = Some((Instant::now() + next, next));
        };
        let Some(execution) = self.execution.as_ref() else {
            // Nothing to re-attach to (the agent is gone meanwhile): just go on.
            self.stalled = None;
            self.stall_retry = None;
            return;
        };
        let history = match History::open(self.history.path()) {
            Ok(history) => history,
            Err(err) => return again(self, format!("cannot reopen the history: {err}")),
        };
        let open_turns =
            match self.context.store.open_turns(self.row.id.clone(), execution.id.clone()).await {
                Ok(turns) => turns,
                Err(err) => return again(self, format!("cannot read the open turns: {err}")),
            };
        let Some(execution) = self.execution.take() else { return };
        let mut record = execution.record.clone();
        record.acked_seq = self.durability.acked as i64;
        record.acp_session_id = self.view_tx.borrow().acp_session_id.clone();
        let addr = record.endpoint();
        let gone = execution.gone;
        drop(execution);
        self.history = history;
        self.unflushed_events.clear();
        self.pending.retain(|_, pending| !matches!(pending, Pending::Prompt { .. }));
        self.turn = None;
        self.stalled = None;
        self.stall_retry = None;
        let error = self.row.error_message.clone();
        self.update_view(|view| view.error = error);
        tracing::info!(session = %self.row.id, "re-attaching after a failed write");
        self.start_adopt(AdoptPlan { executor: record, addr, open_turns, gone });
    }

    /// A re-attach's replay will not finish (the execution is gone): prompts that waited for
    /// it are answered (the caller resumes and retries), and nothing is left to settle.
    fn drop_replay(&mut self, reason: &str) {
        self.replay_until = None;
        self.undelivered.clear();
        for (_, reply) in self.deferred_prompts.drain(..) {
            let _ = reply.send(Err(SessionError::AgentGone(reason.to_owned())));
        }
    }

    fn fail_waiters(&mut self, reason: &str) {
        self.drop_replay(reason);
        self.resume = None;
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send(Err(SessionError::InvalidState(reason.to_owned())));
        }
    }

    /// `"; stderr: …"` with the agent's recent stderr, or nothing.
    pub(super) fn stderr_tail(&self) -> String {
        let tail = history::excerpt_tail(self.recent_stderr.trim_end(), STDERR_IN_ERROR);
        if tail.is_empty() { String::new() } else { format!("; stderr: {tail}") }
    }

    pub(super) fn record_history(
        &mut self,
        kind: EntryType,
        content: String,
        tool: Option<(String, String, String)>,
    ) {
        if self.suppress_history {
            return;
        }
        if let Err(err) = self.history.append(kind, content, tool) {
            self.write_failed("the history", &err);
        }
    }

    /// Publishes a session event (buffered until [`SessionActor::flush_events`]). During
    /// a replay of events recorded before a restart it does nothing.
    pub(super) fn emit(&mut self, kind: SessionEventKind) {
        if self.suppress_events {
            return;
        }
        self.unflushed_events.push(kind);
    }

    /// The marks of what is published now: the agentctl seq being handled, never below
    /// what the log already holds for this execution (events re-published while a replay
    /// catches up must not lower the mark a restart reads back).
    pub(super) fn mark(&self) -> super::record::Mark {
        let mark = self.durability.handled.max(self.durability.events_mark);
        super::record::Mark { agent_seq: (mark > 0).then_some(mark), generation: self.generation }
    }

    /// Writes the buffered session events in one append, each carrying the agentctl seq
    /// being handled: after a restart, events of an agentctl event at or below the newest
    /// mark in the log are all known to be written, so none is written twice and none is
    /// lost.
    pub(super) fn flush_events(&mut self) {
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
        if log.disk_bytes() > self.context.event_log_retain_bytes
            && let Err(err) = log.retain(self.context.event_log_retain_bytes)
        {
            tracing::warn!(session = %self.row.id, %err, "cannot drop old event log segments");
        }
    }

    /// Records and publishes a state change; publishing the same state and error again is
    /// skipped, so a subscriber sees each change once.
    pub(super) async fn set_state(
        &mut self,
        state: SessionState,
        error: Option<String>,
        task: Option<&'static str>,
    ) -> Result<(), SessionError> {
        if state == self.row.state && error == self.row.error_message {
            return Ok(());
        }
        // The event first: a replay re-applies the store write, but would skip the event.
        self.emit(SessionEventKind::State { state, error: error.clone() });
        self.flush_events();
        if self.row.state == SessionState::Starting && state == SessionState::WaitingForInput {
            agentctl::fault::point("state.opened_published");
        }
        self.context
            .store
            .set_session_state(self.row.id.clone(), state, error.clone(), task)
            .await?;
        self.row.state = state;
        self.row.error_message = error.clone();
        self.update_view(|view| {
            view.state = state;
            view.error = error;
        });
        Ok(())
    }

    pub(super) fn enter(&mut self, phase: Phase) {
        self.phase = phase;
        self.update_view(|view| view.phase = phase);
    }

    pub(super) fn update_view(&self, change: impl FnOnce(&mut SessionView)) {
        self.view_tx.send_modify(change);
    }
}

/// Keeps the workspace's commit as a session starts, for its snapshots to compare with. It
/// runs beside the first launch (no added latency) and is stored before the launch is
/// reported, so before the agent could commit anything.
async fn record_start_commit(
    store: &crate::store::Store,
    session_id: String,
    workspace: &std::path::Path,
) {
    let commit = crate::snapshot::git::head(workspace).await;
    if let Err(err) = store.set_start_commit(session_id, commit).await {
        tracing::debug!(%err, "cannot record the start commit");
    }
}

fn reject(command: Command, error: impl Fn() -> SessionError) {
    match command {
        Command::Prompt { reply, .. } => drop(reply.send(Err(error()))),
        Command::Resume { reply, .. } => drop(reply.send(Err(error()))),
        Command::Cancel { reply }
        | Command::Stop { reply, .. }
        | Command::Detach { reply }
        | Command::Permission { reply, .. } => drop(reply.send(Err(error()))),
        Command::Pause { reply, .. } => drop(reply.send(Err(error()))),
    }
}
