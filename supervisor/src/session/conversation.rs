//! The ACP conversation with the agent, as the actor holds it: our requests and their ids,
//! the running turn, open tool calls, the plan, the title, the agent's stderr, a load's
//! replay, the resume context the next prompt carries, and permission answers on their way.

use std::collections::HashMap;

use serde_json::Value;
use tokio::time::Instant;

use super::actor::Pending;
use super::actor::ResumeContext;

/// The conversation's state (see the module doc).
pub(super) struct Conversation {
    pub(super) next_request_id: i64,
    pub(super) pending: HashMap<String, Pending>,
    /// The running turn.
    pub(super) turn: Option<Turn>,
    /// The agent's recent stderr, for error messages.
    pub(super) recent_stderr: String,
    /// Open tool calls' latest titles, kinds and diffs (an agent's first title may be a
    /// placeholder, and its final update may no longer show the change).
    pub(super) tool_titles: HashMap<String, (String, String, String)>,
    /// The agent's newest plan, not yet on the timeline; the last plan row written.
    pub(super) plan_row:
        (Option<Vec<protocol::api::PlanEntry>>, Option<protocol::api::TimelineEvent>),
    /// What a `session/load` (or a replaying `session/resume`) still repeats.
    pub(super) replay: Replay,
    /// Acknowledge once the burst of events in flight is through (nothing queued behind
    /// it): replayed updates dropped after a load's answer, or agentctl's backlog at its
    /// bound (see [`SessionActor::handle_agent_event`]).
    pub(super) replay_unacked: bool,
    /// Stderr lines shown as notices since the agent last went quiet (a launch or a turn
    /// began); bounded by `MAX_QUIET_STDERR`.
    pub(super) stderr_shown: u32,
    /// A title the agent gave the session (`session_info_update`), written after the
    /// update is handled (`Some(None)`: it took its title back).
    pub(super) new_title: Option<Option<String>>,
    /// The resume context the next prompt carries, if any (mirrors the stored flag).
    pub(super) resume_context: Option<ResumeContext>,
    /// Permission answers queued and not yet sent, with their outcomes: their rows stay
    /// until they are.
    pub(super) answering: HashMap<String, Value>,
    /// During a `session/load`: the user's and the agent's messages its replay carried,
    /// joined (to check against the history when it is answered).
    pub(super) replayed_messages: Option<String>,
    /// The prompts waiting for the running turn to end (see `queue.rs`).
    pub(super) queue: super::queue::Queue,
}

/// The most stderr lines shown as notices while the agent is quiet: per turn, and per
/// execution while it starts.
pub(super) const MAX_QUIET_STDERR: u32 = 20;
/// `stderr_shown` counts a start's lines (not a turn's): the execution's generation is
/// in bits 16–30, the count below.
const LAUNCH_COUNT: u32 = 1 << 31;
/// The most stderr put into a turn's error.
pub(super) const STDERR_IN_ERROR: usize = 2000;

impl Conversation {
    /// A native restore (`session/load`, `session/resume`) awaits the agent's answer.
    pub(in crate::session) fn restoring(&self) -> bool {
        self.pending.values().any(|pending| matches!(pending, Pending::Restore { .. }))
    }

    /// `"; stderr: …"` with the agent's recent stderr, or nothing.
    pub(in crate::session) fn stderr_tail(&self) -> String {
        let tail = crate::history::excerpt_tail(self.recent_stderr.trim_end(), STDERR_IN_ERROR);
        if tail.is_empty() { String::new() } else { format!("; stderr: {tail}") }
    }

    /// The running turn's id.
    pub(in crate::session) fn turn_id(&self) -> Option<&str> {
        self.turn.as_ref().map(|turn| turn.id.as_str())
    }

    pub(super) fn new() -> Conversation {
        Conversation {
            // Ids unique across supervisor restarts, so a replayed response never meets a
            // new request of the same id.
            next_request_id: crate::store::now_ms() * 1000,
            pending: HashMap::new(),
            turn: None,
            recent_stderr: String::new(),
            tool_titles: HashMap::new(),
            plan_row: (None, None),
            replay: Replay::Off,
            replay_unacked: false,
            stderr_shown: 0,
            new_title: None,
            resume_context: None,
            answering: HashMap::new(),
            replayed_messages: None,
            queue: super::queue::Queue::default(),
        }
    }
}

/// What a native restore still replays of the conversation we have recorded.
#[derive(Debug, Default)]
pub(super) enum Replay {
    #[default]
    Off,
    /// A `session/load` (or a `session/resume` that replays) is under way: its
    /// conversation updates restore the agent, not our records. It lasts until the next
    /// prompt reached agentctl (its `Delivered` event), not until the load's answer:
    /// gemini-cli's replay trails its answer, and agentctl logs `Delivered` before the
    /// agent can read the prompt, so all output before it is the replay's. From the load's
    /// answer on, it holds the conversation the replay repeats.
    Loading(Option<Box<super::acp::KnownConversation>>),
    /// After the next prompt's delivery: the conversation the replay repeats, to drop a
    /// replay that trails even that (see [`super::acp::KnownConversation`]). It ends with
    /// the first update that is not a repeat, or the turn.
    Trailing(Box<super::acp::KnownConversation>),
}

/// The running turn, with the deadlines only it has.
pub(super) struct Turn {
    pub(super) id: crate::ids::TurnId,
    /// When its cancel is ended by us if the agent has not ended it.
    pub(super) cancel_at: Option<Instant>,
    /// When it is cancelled (the profile's `process.turn_timeout_ms`).
    pub(super) deadline: Option<Instant>,
    /// What its agent reported of tokens and cost so far.
    pub(super) usage: crate::store::TurnUsage,
    /// Its agent said something (an update) already: its stderr is no longer news.
    pub(super) heard: bool,
}

impl Conversation {
    /// A new id for a request of ours.
    pub(super) fn take_request_id(&mut self) -> i64 {
        let id = self.next_request_id;
        self.next_request_id += 1;
        id
    }

    /// The turn heard from its agent.
    pub(super) fn heard(&mut self) {
        if let Some(turn) = self.turn.as_mut() {
            turn.heard = true;
        }
    }

    /// A line of the agent's stderr: the recent ones explain a failure (about the last
    /// [`STDERR_IN_ERROR`] bytes are kept).
    pub(super) fn stderr_line(&mut self, line: &str) {
        self.recent_stderr.push_str(line);
        self.recent_stderr.push('\n');
        if self.recent_stderr.len() > 2 * STDERR_IN_ERROR {
            self.recent_stderr = crate::history::excerpt_tail(&self.recent_stderr, STDERR_IN_ERROR);
        }
    }

    /// A new agent, or a turn: what its stderr said before explains nothing now.
    pub(super) fn quiet_again(&mut self, new_agent: bool) {
        self.stderr_shown = 0;
        if new_agent {
            self.recent_stderr.clear();
        }
    }

    /// Whether a line of stderr is shown while the execution of `generation` starts: at
    /// most [`MAX_QUIET_STDERR`] per execution.
    pub(super) fn show_starting_stderr(&mut self, generation: i64) -> bool {
        let key = LAUNCH_COUNT | (((generation as u32) & 0x7fff) << 16);
        if self.stderr_shown & !0xffff != key {
            self.stderr_shown = key;
        }
        let shown = self.stderr_shown & 0xffff < MAX_QUIET_STDERR;
        self.stderr_shown += u32::from(shown);
        shown
    }

    /// Whether a line of stderr is shown as a notice: while the agent starts, or while the
    /// running turn has heard nothing from it; at most [`MAX_QUIET_STDERR`] per turn.
    pub(super) fn show_quiet_stderr(&mut self, starting: bool) -> bool {
        let waiting = self.turn.as_ref().is_some_and(|turn| !turn.heard);
        if !(starting || waiting) || self.stderr_shown >= MAX_QUIET_STDERR {
            return false;
        }
        self.stderr_shown += 1;
        true
    }

    /// The running turn ends: its tool calls are closed, and a replay that trailed it does
    /// not trail its end.
    pub(super) fn end_turn(&mut self) -> Option<Turn> {
        let turn = self.turn.take()?;
        self.tool_titles.clear();
        self.replay = match std::mem::take(&mut self.replay) {
            Replay::Loading(_) => Replay::Loading(None),
            Replay::Off | Replay::Trailing(_) => Replay::Off,
        };
        Some(turn)
    }

    /// The agent's newest plan: to go on the timeline after the burst it came in.
    pub(super) fn plan_reported(&mut self, plan: Vec<protocol::api::PlanEntry>) {
        self.plan_row.0 = Some(plan);
    }

    /// The plan to put on the timeline, if one came since.
    pub(super) fn take_plan(&mut self) -> Option<Vec<protocol::api::PlanEntry>> {
        self.plan_row.0.take()
    }

    /// Whether the timeline's last plan row says the same (agents send their plan again
    /// as they go).
    pub(super) fn plan_is_news(&self, row: &protocol::api::TimelineEvent) -> bool {
        self.plan_row.1.as_ref() != Some(row)
    }

    /// The plan row went on the timeline.
    pub(super) fn plan_written(&mut self, row: protocol::api::TimelineEvent) {
        self.plan_row.1 = Some(row);
    }
}

#[cfg(test)]
mod tests;
