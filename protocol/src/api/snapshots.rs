//! Snapshots on the wire: what a session was asked, did and cost at one moment.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::TurnState;

/// What took a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotTrigger {
    /// `task.session.pause`.
    Pause,
    /// A turn completed.
    TurnComplete,
    /// The agent's context reached the profile's threshold; the session paused for a
    /// handoff to a fresh agent session.
    Exhaustion,
    /// A pause's wait ran out and the running turn was cancelled.
    Timeout,
    /// The agent died, or a turn was found interrupted at recovery.
    Crash,
    /// The agent was idle for its `session.idle_timeout_secs`: the session is parked (agent
    /// and sidecar stopped) until the next prompt or resume.
    Idle,
    /// The session's or its task's token or cost budget was used up; it stays paused
    /// until the budget is raised.
    Budget,
    /// The session ran its `max_turns` turns.
    MaxTurns,
    /// The session ran for its `max_duration_secs`.
    MaxDuration,
}

wire_names!(SnapshotTrigger {
    Pause => "pause",
    TurnComplete => "turn_complete",
    Exhaustion => "exhaustion",
    Timeout => "timeout",
    Crash => "crash",
    Idle => "idle",
    Budget => "budget",
    MaxTurns => "max_turns",
    MaxDuration => "max_duration",
});

/// A step of an agent's plan (ACP `PlanEntry`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PlanEntry {
    /// What the step is.
    pub content: String,
    /// `pending`, `in_progress` or `completed` (as the agent said; anything else is kept).
    pub status: String,
    /// `high`, `medium` or `low`, when the agent said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
}

/// How far a plan is: its steps by status, and the first not completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanProgress<'a> {
    /// Steps.
    pub total: usize,
    /// Completed.
    pub done: usize,
    /// In progress.
    pub in_progress: usize,
    /// Pending.
    pub pending: usize,
    /// The first step not completed.
    pub current: Option<&'a str>,
}

impl PlanEntry {
    /// How far `plan` is.
    pub fn progress(plan: &[PlanEntry]) -> PlanProgress<'_> {
        let count = |status: &str| plan.iter().filter(|step| step.status == status).count();
        PlanProgress {
            total: plan.len(),
            done: count("completed"),
            in_progress: count("in_progress"),
            pending: count("pending"),
            current: plan
                .iter()
                .find(|step| step.status != "completed")
                .map(|step| step.content.as_str()),
        }
    }

    /// The plan as lines of text, one step each: `[done]`, `[in progress]` or `[next]`
    /// before its content (what a history entry's `content` and a resume context say).
    pub fn lines(plan: &[PlanEntry]) -> String {
        let line = |entry: &PlanEntry| {
            let status = match entry.status.as_str() {
                "completed" => "done",
                "in_progress" => "in progress",
                "pending" => "next",
                other => other,
            };
            format!("[{status}] {}", entry.content)
        };
        plan.iter().map(line).collect::<Vec<_>>().join("\n")
    }
}

/// One snapshot in `task.session.snapshot.list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotSummary {
    /// The snapshot.
    pub snapshot_id: String,
    /// Its session.
    pub session_id: String,
    /// What took it.
    pub trigger: SnapshotTrigger,
    /// Why, when something said.
    pub reason: Option<String>,
    /// When, Unix ms.
    pub taken_at: i64,
    /// The workspace's branch then.
    pub git_branch: Option<String>,
    /// The workspace's commit then.
    pub git_head: Option<String>,
    /// The workspace had uncommitted changes.
    pub git_dirty: Option<bool>,
    /// Tokens in the agent's context, as it last said.
    pub context_used: Option<u64>,
    /// The agent's context window, as it last said.
    pub context_size: Option<u64>,
}

/// `task.session.snapshot.get`: a structured account of a session at one moment — what
/// it was asked, what it did, what failed and what followed, where the workspace stands,
/// and what it cost. A handoff's resume context is compiled from the latest one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Snapshot {
    /// The snapshot.
    pub snapshot_id: String,
    /// Its session.
    pub session_id: String,
    /// What took it.
    pub trigger: SnapshotTrigger,
    /// Why, when something said.
    pub reason: Option<String>,
    /// When, Unix ms.
    pub taken_at: i64,
    /// The session's current execution then.
    pub execution_id: Option<String>,
    /// That execution's generation: how many runs of its agent the session had then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// The original task.
    pub task: SnapshotTask,
    /// The workspace's git state.
    pub git: GitState,
    /// The newest turns (at most 20), oldest first.
    pub turns: Vec<SnapshotTurn>,
    /// Older turns left out.
    pub turns_omitted: usize,
    /// Errors (failed turns and tool calls, agent exits, failed restores) with what
    /// followed each, oldest first (at most 20, the newest).
    pub errors: Vec<SnapshotError>,
    /// What the session used.
    pub usage: SnapshotUsage,
    /// The agent's plan as it last gave it (empty: it gave none), with when.
    #[serde(default)]
    pub plan: Vec<PlanEntry>,
    /// When the agent gave that plan, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_at: Option<i64>,
    /// The newest test run in the history read, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tests: Option<SnapshotTests>,
    /// A pause's summary turn (`[session] summarize_on_pause`): the agent's decisions,
    /// open problems and next steps, or why there are none. `None` on a snapshot that is
    /// not a pause's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<PauseSummary>,
    /// The session's newest workspace checkpoint when it was taken (a turn's snapshot
    /// waits for that turn's checkpoint): what `task.session.checkpoint.restore` writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<super::Checkpoint>,
}

/// What became of a pause's summary turn, in its [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PauseSummary {
    /// Whether the agent was asked and what its answer was worth.
    pub state: SummaryState,
    /// Why it is not `stored` (what did not validate, how the turn ended, why it was not
    /// asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The summary, when `stored`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<AgentSummary>,
    /// The summary turn, when one ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
}

/// The state of a [`PauseSummary`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SummaryState {
    /// The profile does not ask for one (`summarize_on_pause` is off).
    Off,
    /// Not asked for this pause: no agent was running, the pause was forced, or it was an
    /// idle park or a budget's pause (which must not spend more).
    Skipped,
    /// The answer validated; it is in `summary`.
    Stored,
    /// The agent answered, but not with the JSON asked for: refused (`note` says why);
    /// the pause and the snapshot's other parts stand.
    Invalid,
    /// The summary turn did not complete (it failed, was cancelled after the pause's
    /// wait, or its agent went away).
    Failed,
}

/// The agent's own account of its session, asked for at a pause.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AgentSummary {
    /// Decisions it made, each with why and what else it considered.
    pub decisions: Vec<Decision>,
    /// Problems still open.
    pub open_problems: Vec<String>,
    /// What it would do next.
    pub next_steps: Vec<String>,
}

/// One decision in a [`AgentSummary`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Decision {
    /// What was decided.
    pub decision: String,
    /// Why.
    pub rationale: String,
    /// What else was considered.
    pub alternatives: Vec<String>,
}

/// The task of a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotTask {
    /// The task.
    pub task_id: String,
    /// Its title.
    pub title: String,
    /// Its description.
    pub description: String,
}

/// A workspace's git state in a [`Snapshot`]. A workspace that is not in a repository
/// (or where git cannot run) has `repository: false` and nothing else.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GitState {
    /// The workspace is in a git repository.
    pub repository: bool,
    /// The checked-out branch (`None` when detached).
    pub branch: Option<String>,
    /// The commit when the session started.
    pub start_commit: Option<String>,
    /// The commit now.
    pub head_commit: Option<String>,
    /// Commits made since the start, newest first, `<short hash> <subject>` (at most 20).
    pub commits_since_start: Vec<String>,
    /// Files changed since the start (committed or not) and new untracked files.
    pub modified_files: Vec<String>,
    /// Files staged in the index.
    pub staged_files: Vec<String>,
    /// There are uncommitted changes (tracked or untracked).
    pub dirty: bool,
    /// `git diff --shortstat` against the start commit.
    pub diffstat: Option<String>,
    /// The uncommitted files' contents then (`git hash-object`; `-` for a deleted file), at
    /// most 200: what a resume compares the workspace with to say what changed since.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub dirty_hashes: std::collections::BTreeMap<String, String>,
    /// Why part of the state could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A commit of the workspace's files as they were (tracked and untracked, ignored ones
    /// left out; its first parent is `head_commit`), taken at a turn's end when it had
    /// uncommitted changes: what a rewind restores them from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
}

/// How a workspace changed since a session's last snapshot (a pause's, usually): what
/// `task.session.resume` says, and what the context injected into its next prompt says.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GitDrift {
    /// The snapshot compared with.
    pub snapshot_id: String,
    /// The commit checked out then.
    pub head_before: Option<String>,
    /// The commit checked out now.
    pub head_now: Option<String>,
    /// The branch then and now, when it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch_change: Option<(Option<String>, Option<String>)>,
    /// Commits made since, newest first, `<short hash> <subject>` (at most 20); empty
    /// when HEAD moved elsewhere (see `head_rewound`).
    pub commits: Vec<String>,
    /// HEAD moved to a commit that does not descend from the one then (a reset, a
    /// rebase, another branch).
    pub head_rewound: bool,
    /// Files whose content is not what it was then (committed since or not; at most
    /// 200), sorted.
    pub changed_files: Vec<String>,
}

impl GitDrift {
    /// The drift in a few lines of text (a resume context's section, the CLI's output).
    pub fn describe(&self) -> String {
        let short = |commit: &Option<String>| {
            commit
                .as_deref()
                .map_or_else(|| "no commit".to_owned(), |c| c.chars().take(12).collect())
        };
        let mut text = String::new();
        if let Some((before, now)) = &self.branch_change {
            let name =
                |branch: &Option<String>| branch.clone().unwrap_or_else(|| "(detached)".into());
            text.push_str(&format!("The branch changed from {} to {}.\n", name(before), name(now)));
        }
        if self.head_before != self.head_now {
            text.push_str(&format!(
                "HEAD moved from {} to {}{}.\n",
                short(&self.head_before),
                short(&self.head_now),
                if self.head_rewound {
                    " (not a descendant: a reset, rebase or checkout)"
                } else {
                    ""
                }
            ));
        }
        if !self.commits.is_empty() {
            text.push_str(&format!("Commits since: {}\n", self.commits.join("; ")));
        }
        if !self.changed_files.is_empty() {
            text.push_str(&format!("Files changed since: {}\n", self.changed_files.join(", ")));
        }
        text
    }
}

/// A turn in a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotTurn {
    /// The turn.
    pub turn_id: String,
    /// The user's prompt (at most 1,000 characters).
    pub prompt: Option<String>,
    /// How it ended.
    pub state: TurnState,
    /// The agent's stop reason.
    pub stop_reason: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
    /// The agent's last message in it (at most 1,000 characters).
    pub reply: Option<String>,
    /// Its tool calls and how each ended.
    pub tool_calls: Vec<SnapshotToolCall>,
    /// Started, Unix ms.
    pub started_at: i64,
    /// Ended, Unix ms.
    pub ended_at: Option<i64>,
}

/// A tool call in a [`SnapshotTurn`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotToolCall {
    /// The ACP tool call id.
    pub tool_call_id: String,
    /// Its title.
    pub title: String,
    /// Its last status (`pending`, `in_progress`, `completed`, `failed`).
    pub status: String,
}

/// An error in a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotError {
    /// When, Unix ms.
    pub at: i64,
    /// `tool`, `turn` or `session` (agent exits, failed restores and launches).
    pub source: String,
    /// What went wrong.
    pub message: String,
    /// What happened next, when anything did.
    pub followed_by: Option<String>,
    /// What became of it, as far as the session shows (absent from older snapshots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<ErrorResolution>,
}

/// What became of an error in a [`Snapshot`], guessed from what followed it (the rules:
/// `docs/api.md`, "Snapshot").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorResolution {
    /// The same thing succeeded later: a failed tool completed when run again, or a turn
    /// completed after a failed turn or an agent's exit.
    Fixed,
    /// Something else succeeded after it (another tool, the turn's end), the failed
    /// tool never did.
    WorkedAround,
    /// Nothing resolved it before the session paused.
    Deferred,
    /// Nothing resolved it (yet).
    Unresolved,
}

/// The newest test run a [`Snapshot`] found in the history: a tool call whose command runs
/// a test suite (`cargo test`, `pytest`, `npm test`, `go test`, …).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotTests {
    /// The command, as the tool call's title gave it.
    pub command: String,
    /// It completed (`true`) or failed (`false`), as its tool call ended.
    pub passed: bool,
    /// When it ended, Unix ms.
    pub at: i64,
    /// The failing tests its output names (at most 20; the runners' usual formats).
    pub failing: Vec<String>,
    /// The end of its output (at most 500 characters).
    pub output: String,
}

/// Usage in a [`Snapshot`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotUsage {
    /// Tokens in the agent's context (ACP `usage_update.used`), as it last said.
    pub context_used: Option<u64>,
    /// Its context window (`usage_update.size`).
    pub context_size: Option<u64>,
    /// The session's cumulative cost (`usage_update.cost.amount`), when said.
    pub cost: Option<f64>,
    /// Its unit (`usage_update.cost.currency`).
    pub cost_currency: Option<String>,
    /// Turns run.
    pub turns: usize,
    /// Tool calls seen (in the history read).
    pub tool_calls: usize,
    /// Time since the session was created, ms.
    pub wall_ms: i64,
    /// Time spent in turns, ms.
    pub turn_ms: i64,
}
