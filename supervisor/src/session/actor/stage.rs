//! Where the actor is (`Stage`) and the state bound to a stage or a step of one: a launch,
//! its handshake, the execution, a resume, a pause waiting for its turn, a stall, the
//! catch-up after a re-attach, a retire.

use std::collections::HashMap;
use std::sync::Arc;

use protocol::api::SnapshotTrigger;
use protocol::control::Event;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::Internal;
use crate::session::launch::Connected;
use crate::session::outbox::{self, Outgoing};
use crate::session::{Phase, Reply, SessionError};
use crate::sidecar::Control;
use crate::store::{ExecutionRow, SessionState};
use serde_json::Value;

/// A pause asked for while a turn ran.
#[derive(Debug, Clone)]
pub(in crate::session) struct PendingPause {
    pub(in crate::session) reason: Option<String>,
    /// When the running turn is cancelled (`None` once that time has passed).
    pub(in crate::session) force_at: Option<Instant>,
    /// The turn was cancelled for it.
    pub(in crate::session) forced: bool,
    /// `Pause`, or `Exhaustion` (the agent's context reached the profile's threshold).
    pub(in crate::session) trigger: SnapshotTrigger,
    /// How long it waits for a turn (the running one, then the summary turn).
    pub(in crate::session) wait: std::time::Duration,
    /// Where its summary turn (`summarize_on_pause`) stands.
    pub(in crate::session) summary: SummaryStep,
}

/// Where a pause's summary turn stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::session) enum SummaryStep {
    /// Not asked (yet).
    NotAsked,
    /// Asked at this Unix ms: the summary turn is the session's first turn since.
    Asked(i64),
    /// Settled without an answer to read (the prompt could not be sent).
    Settled(protocol::api::PauseSummary),
}

/// The live connection to one execution.
pub(in crate::session) struct Execution {
    pub(in crate::session) id: crate::ids::ExecutionId,
    pub(in crate::session) record: ExecutionRow,
    pub(in crate::session) calls: Arc<dyn Control>,
    pub(in crate::session) outbox: mpsc::UnboundedSender<Box<Outgoing>>,
    pub(in crate::session) events_rx: crate::sidecar::EventsRx,
    pub(in crate::session) agent_running: bool,
    /// Its sidecar is gone: these are the events its spool held (see `leftovers.rs`).
    pub(in crate::session) gone: bool,
    /// A warm agent's priming ACP session (see `pool.rs`): its updates are dropped. It
    /// lives as long as the execution: a later one's agent has none.
    pub(in crate::session) primed_session: Option<String>,
}

impl Execution {
    /// The execution a launch or re-attach connected to, with its outbox started.
    pub(in crate::session) fn new(
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
    pub(in crate::session) fn is_primed(&self, params: &Value) -> bool {
        (self.primed_session.as_deref())
            .is_some_and(|primed| crate::session::acp::parse::about_session(params, primed))
    }
}

/// A resume in progress.
#[derive(Debug)]
pub(in crate::session) struct ResumeState {
    /// The token being restored, if any.
    pub(in crate::session) token: Option<String>,
    /// The agent was relaunched with the profile's `resume_command`.
    pub(in crate::session) relaunched: bool,
    /// A native restore was tried and rejected.
    pub(in crate::session) native_failed: bool,
    /// A capacity handoff: a fresh agent session primed from the latest snapshot.
    pub(in crate::session) handoff: bool,
    /// It wakes a session parked for being idle (the wake-up metrics).
    pub(in crate::session) wake: bool,
    /// The first start of a fork (see `store/forks.rs`): the original's agent session to
    /// `session/fork`, when the fork is to be native; either way the fork's history is
    /// injected unless the agent forked it.
    pub(in crate::session) fork: Option<Option<String>>,
    /// A rewind waits (see `crate::rewind`): the agent opens a fresh session, the turns
    /// kept injected, whatever the profile says.
    pub(in crate::session) rewind: bool,
}

/// Where the actor is, with what only makes sense there; the view shows its [`Phase`].
#[derive(Debug)]
pub(in crate::session) enum Stage {
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
    pub(in crate::session) fn phase(&self) -> Phase {
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
    pub(in crate::session) fn handshake(&self) -> Option<(&'static str, Instant)> {
        match self {
            Stage::Opening(opening) => opening.step,
            _ => None,
        }
    }

    /// The handshake under way.
    /// The launch step the agent is waited for in, while it starts (the step of the
    /// handshake request it has not answered yet).
    pub(in crate::session) fn launch_step(&self) -> Option<crate::events::LaunchStep> {
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
    pub(in crate::session) fn opening_ref(&self) -> Option<&Opening> {
        match self {
            Stage::Opening(opening) => Some(opening),
            _ => None,
        }
    }

    /// Whether the agent being opened advertised `session/load` at `initialize`.
    pub(in crate::session) fn load_offered(&self) -> bool {
        self.opening_ref().is_some_and(|opening| opening.load_offered)
    }

    pub(in crate::session) fn opening(&mut self) -> Option<&mut Opening> {
        match self {
            Stage::Opening(opening) => Some(opening),
            _ => None,
        }
    }
}

/// A launch, from its start until its ACP session is open.
#[derive(Debug)]
pub(in crate::session) struct Launch {
    /// When it started (the launch and resume latency metrics).
    pub(in crate::session) started: std::time::Instant,
    /// The resume it is for, if it is one.
    pub(in crate::session) resume: Option<ResumeState>,
    /// The prompt sent once the ACP session is open.
    pub(in crate::session) initial_prompt: Option<String>,
    /// The session's first: it also records the workspace's commit at the start (read
    /// while the agent starts, written once the launch is reported).
    pub(in crate::session) first: bool,
}

impl Launch {
    pub(in crate::session) fn new(
        resume: Option<ResumeState>,
        initial_prompt: Option<String>,
    ) -> Launch {
        Launch { started: std::time::Instant::now(), resume, initial_prompt, first: false }
    }
}

/// The ACP handshake of a launched agent.
#[derive(Debug)]
pub(in crate::session) struct Opening {
    pub(in crate::session) launch: Launch,
    /// The step awaited and its deadline.
    pub(in crate::session) step: Option<(&'static str, Instant)>,
    /// The `authenticate` methods the agent offered at `initialize` (never a `terminal`
    /// one: there is no terminal here).
    pub(in crate::session) auth_offered: Vec<String>,
    /// The `terminal` login methods it offered: each one's name and the arguments its own
    /// program takes to log in (shown as what to run once, by hand).
    pub(in crate::session) auth_terminal: Vec<(String, Vec<String>)>,
    /// This execution authenticated (once is all it tries).
    pub(in crate::session) authenticated: bool,
    /// The agent advertised `session/load` at `initialize`.
    pub(in crate::session) load_offered: bool,
    /// A warm agent's replacement, started when the opening ends (see
    /// [`crate::pool::Refill`]): held, never read.
    pub(in crate::session) _refill: Option<crate::pool::Refill>,
}

/// What the resume context put before the next prompt is compiled from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::session) enum ResumeContext {
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
    pub(in crate::session) fn rebuilds_context(self) -> bool {
        !matches!(self, ResumeContext::Drift)
    }
}

/// Why intake stopped after a failed write, when it is tried again, and what the try must
/// write that no replay brings back.
#[derive(Debug, Default)]
pub(in crate::session) struct Stall {
    pub(in crate::session) reason: String,
    /// When the next try is due, and the delay after that one (none before the first is
    /// scheduled).
    pub(in crate::session) retry: Option<(Instant, std::time::Duration)>,
    /// A state change the store did not take, written at the next try.
    pub(in crate::session) unwritten_state: Option<UnwrittenState>,
    /// User messages (with their turn ids) whose history entry could not be written: no
    /// agentctl replay brings them back, so the next try writes them first.
    pub(in crate::session) unwritten_prompts: Vec<(String, crate::ids::TurnId)>,
    /// A loss (its sidecar fenced) whose end waits for the next try: why its agent went.
    /// Meanwhile nothing launches (a resume waits for it).
    pub(in crate::session) deferred_loss: Option<String>,
}

/// A session state the actor changed to and the store did not take (a full disk): the
/// arguments of [`super::SessionActor::set_state`], kept to be written again.
#[derive(Debug, Clone)]
pub(in crate::session) struct UnwrittenState {
    pub(in crate::session) state: SessionState,
    pub(in crate::session) error: Option<String>,
    pub(in crate::session) task: Option<&'static str>,
}

/// A recorded turn's prompt to send again under its own request id.
pub(in crate::session) struct Resend<'a> {
    pub(in crate::session) request_id: &'a str,
    pub(in crate::session) turn_id: &'a crate::ids::TurnId,
    /// The queued prompt it runs, if it came from the queue (its `turn_started` names it).
    pub(in crate::session) prompt_id: Option<crate::ids::PromptId>,
}

/// After a re-attach, until agentctl's replay passed what it held when we connected.
#[derive(Default)]
pub(in crate::session) struct CatchUp {
    /// The agentctl seq the replay must reach before `undelivered` is settled.
    pub(in crate::session) until: Option<u64>,
    /// Re-attached turns whose prompt was not known to be delivered: request id → turn id.
    pub(in crate::session) undelivered: HashMap<String, crate::ids::TurnId>,
    /// Of those, the ones that ran a queued prompt: request id → the queued prompt and its
    /// text, sent again when undelivered (nobody else would).
    pub(in crate::session) queued: HashMap<String, (crate::ids::PromptId, String)>,
    /// Prompts that arrived while the replay ran.
    pub(in crate::session) deferred: Vec<(String, Reply<crate::session::Prompted>)>,
    /// The agent's output is held at agentctl (asked for by a stall) until the re-attach
    /// after it catches up.
    pub(in crate::session) holding: bool,
}

/// What of a replayed event was recorded before a restart: those records are skipped.
#[derive(Debug, Default, Clone, Copy)]
pub(in crate::session) struct Recorded {
    pub(in crate::session) history: bool,
    pub(in crate::session) events: bool,
}

/// A retired execution and what its spool held past what was handled.
pub(in crate::session) struct Retired {
    pub(super) id: crate::ids::ExecutionId,
    pub(super) record: ExecutionRow,
    pub(super) result: Result<(), SessionError>,
    pub(super) leftovers: Vec<Event>,
}

/// A stop or detach whose sidecar is being retired.
pub(in crate::session) struct Teardown {
    /// Answered once the sidecar is gone and its leftovers are recorded.
    pub(super) reply: Option<Reply<()>>,
    /// How the turn ends, if the leftovers did not end it.
    pub(super) turn_error: &'static str,
}

/// What to do with a launch still in flight when it lands.
#[derive(Default)]
pub(in crate::session) enum AfterLaunch {
    #[default]
    Keep,
    /// The session was stopped or detached meanwhile: retire it, then answer the stop and
    /// detach callers waiting for that.
    Retire(Vec<Reply<()>>),
}
