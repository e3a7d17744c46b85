//! Session snapshots: a structured account of a session at one moment, taken
//! at a pause, a completed turn, a context exhaustion, a forced pause and a crash — and the
//! handoff context compiled from one, which primes a fresh agent session when the old
//! one's context is full.
//!
//! A snapshot is built from what the daemon already keeps: the session and task rows, the
//! turns, the timeline, the newest part of the history file (at most
//! [`HISTORY_TAIL_BYTES`], so its cost does not grow with the session), the workspace's
//! git state, and the usage the agent last reported.

pub mod git;
mod heuristics;
pub mod summary;

use crate::ids::SessionId;
use std::path::{Path, PathBuf};

use protocol::api::{
    GitState, Snapshot, SnapshotError, SnapshotTask, SnapshotToolCall, SnapshotTrigger,
    SnapshotTurn, SnapshotUsage, TimelineEvent, TurnState,
};

use crate::history::{self, EntryType, HistoryEntry, excerpt};
use crate::store::{Store, StoreError, now_ms};
use heuristics::Outcome;

/// The most of the history file's end a snapshot reads.
pub const HISTORY_TAIL_BYTES: u64 = 512 * 1024;
/// The most turns in a snapshot.
pub const MAX_TURNS: usize = 20;
/// The most errors in a snapshot.
pub const MAX_ERRORS: usize = 20;
/// The most characters of a prompt, a reply or an error in a snapshot.
pub const TEXT_CHARS: usize = 1000;
/// The newest timeline rows a snapshot reads for errors and what followed them.
const TIMELINE_ROWS: usize = 500;

/// What to snapshot.
#[derive(Debug, Clone)]
pub struct Request {
    /// The session.
    pub session_id: SessionId,
    /// What takes it.
    pub trigger: SnapshotTrigger,
    /// Why, when something said.
    pub reason: Option<String>,
    /// The session's history file.
    pub history: PathBuf,
    /// The current execution.
    pub execution_id: Option<crate::ids::ExecutionId>,
    /// Context and cost as the agent last reported them (the actor keeps them); `None`
    /// takes them from the previous snapshot.
    pub usage: Option<SnapshotUsage>,
    /// A pause's summary turn: what became of it (`None` for a snapshot that is not a
    /// pause's).
    pub summary: Option<protocol::api::PauseSummary>,
    /// When it is of, Unix ms, when not now: a turn's snapshot, built in the background,
    /// is of its turn's end (a pause that followed is newer).
    pub taken_at: Option<i64>,
}

/// Takes a snapshot and stores it (with its timeline row).
pub async fn take(store: &Store, request: Request) -> Result<Snapshot, StoreError> {
    let snapshot = build(store, request).await?;
    store.insert_snapshot(snapshot.clone()).await?;
    Ok(snapshot)
}

/// Builds a snapshot without storing it.
pub async fn build(store: &Store, request: Request) -> Result<Snapshot, StoreError> {
    let Request { session_id, trigger, reason, history, execution_id, usage, summary, taken_at } =
        request;
    let row = store.get_session(session_id.clone()).await?;
    let task = store.get_task(row.task_id.clone()).await?;
    let start = store.start_commit(session_id.clone()).await?.flatten();
    let recorded = store.get_execution(session_id.clone()).await?;
    let generation = recorded.as_ref().and_then(|e| u64::try_from(e.generation).ok());
    let execution_id = execution_id.or_else(|| recorded.map(|e| e.execution_id));
    let dirty_at_start = store.start_dirty(session_id.clone()).await?;
    let mut git =
        git::state(Path::new(&row.workspace_path), start.as_deref(), &dirty_at_start).await;
    let turns = store.session_turns(session_id.clone()).await?;
    let checkpoint = store.latest_checkpoint(session_id.clone()).await?;
    // A turn's uncommitted files, kept (in the workspace's repository) for a rewind that
    // returns the workspace to them — unless the session's own checkpoint of the turn
    // holds them already, which a rewind uses first.
    let newest_turn = turns.last().map(|turn| turn.id.to_string());
    let held = checkpoint.as_ref().is_some_and(|c| c.turn_id.is_some() && c.turn_id == newest_turn);
    if trigger == SnapshotTrigger::TurnComplete && git.repository && git.dirty && !held {
        match crate::rewind::git::checkpoint(Path::new(&row.workspace_path), session_id.as_str())
            .await
        {
            Ok(commit) => git.checkpoint = Some(commit),
            Err(err) => {
                tracing::warn!(session = %session_id, %err, "no checkpoint of the turn's files")
            }
        }
    }
    let mut timeline = store.recent_timeline(session_id.clone(), TIMELINE_ROWS).await?;
    timeline.reverse();
    let (entries, plan) = tokio::task::spawn_blocking(move || {
        let entries = history::read_tail(&history, HISTORY_TAIL_BYTES);
        // The newest plan is usually in the tail just read; else it is looked for further.
        let in_tail = entries.iter().rev().find(|entry| entry.kind == EntryType::Plan);
        let plan = match in_tail {
            Some(entry) => Some((entry.at, entry.wire.plan.clone().unwrap_or_default())),
            None => history::last_plan(&history),
        };
        (entries, plan)
    })
    .await
    .unwrap_or_default();
    let (plan_at, plan) = match plan {
        Some((at, plan)) => (Some(at), plan),
        None => (None, Vec::new()),
    };
    let reported = match usage {
        Some(usage) => usage,
        None => store
            .latest_snapshot(session_id.clone())
            .await?
            .map(|snapshot| snapshot.usage)
            .unwrap_or_default(),
    };
    let now = now_ms();
    let timeline: Vec<(i64, TimelineEvent)> = timeline
        .into_iter()
        .filter_map(|(_, at, json)| serde_json::from_str(&json).ok().map(|event| (at, event)))
        .collect();
    let usage = SnapshotUsage {
        turns: turns.len(),
        tool_calls: entries.iter().filter(|e| e.kind == EntryType::ToolCall).count(),
        wall_ms: now.saturating_sub(row.created_at),
        turn_ms: turns.iter().map(|t| t.ended_at.unwrap_or(now).saturating_sub(t.started_at)).sum(),
        ..reported
    };
    let turns_omitted = turns.len().saturating_sub(MAX_TURNS);
    let recent = &turns[turns_omitted..];
    let snapshot_turns = recent
        .iter()
        .enumerate()
        .map(|(idx, turn)| {
            let until = recent.get(idx + 1).map_or(i64::MAX, |next| next.started_at);
            let mine = entries.iter().filter(|e| e.at >= turn.started_at && e.at < until);
            summarize_turn(turn, mine)
        })
        .collect();
    Ok(Snapshot {
        snapshot_id: uuid::Uuid::now_v7().to_string(),
        session_id: session_id.into_string(),
        trigger,
        reason,
        taken_at: taken_at.unwrap_or(now),
        execution_id: execution_id.map(String::from),
        generation,
        task: SnapshotTask { task_id: task.id, title: task.title, description: task.description },
        git,
        turns: snapshot_turns,
        turns_omitted,
        // A pause's snapshot is taken before its pause is recorded: it counts as what
        // followed every error.
        errors: errors(
            &entries,
            &timeline,
            !matches!(trigger, SnapshotTrigger::TurnComplete | SnapshotTrigger::Crash),
        ),
        usage,
        plan,
        plan_at,
        tests: heuristics::last_test_run(&entries),
        summary,
        checkpoint,
    })
}

fn summarize_turn<'a>(
    turn: &crate::store::TurnRow,
    entries: impl Iterator<Item = &'a HistoryEntry>,
) -> SnapshotTurn {
    let mut prompt = None;
    let mut reply = None;
    let mut tool_calls: Vec<SnapshotToolCall> = Vec::new();
    for entry in entries {
        match entry.kind {
            EntryType::UserMessage if prompt.is_none() => {
                prompt = Some(excerpt(&entry.content, TEXT_CHARS));
            }
            EntryType::UserMessage => {}
            EntryType::AgentMessage => reply = Some(excerpt(&entry.content, TEXT_CHARS)),
            // The newest plan is the snapshot's own member.
            EntryType::Plan => {}
            EntryType::ToolCall | EntryType::ToolResult => {
                let id = entry.tool_call_id.clone().unwrap_or_default();
                let status = entry.tool_status.clone().unwrap_or_default();
                match tool_calls.iter_mut().find(|call| call.tool_call_id == id) {
                    Some(call) => call.status = status,
                    None => tool_calls.push(SnapshotToolCall {
                        tool_call_id: id,
                        title: entry.tool_name.clone().unwrap_or_else(|| "tool".into()),
                        status,
                    }),
                }
            }
        }
    }
    SnapshotTurn {
        turn_id: turn.id.to_string(),
        prompt,
        state: turn.state,
        stop_reason: turn.stop_reason.clone(),
        error: turn.error.clone(),
        reply,
        tool_calls,
        started_at: turn.started_at,
        ended_at: turn.ended_at,
    }
}

/// One thing that happened, for finding what followed an error.
struct Happening {
    at: i64,
    what: String,
    /// `(source, message)` when it is an error.
    error: Option<(&'static str, String)>,
    /// What it was, for what became of an error before it.
    outcome: heuristics::Outcome,
    /// Its place among things of the same millisecond: what starts (a turn, an execution,
    /// a resume) before the history's entries, what ends (a turn, a pause, an error, a
    /// state) after them.
    rank: u8,
}

/// Errors (failed tool calls, failed or interrupted turns, session errors) with what
/// followed each: the next thing that happened after it. `pausing`: the snapshot is a
/// pause's, which follows them all.
fn errors(
    entries: &[HistoryEntry],
    timeline: &[(i64, TimelineEvent)],
    pausing: bool,
) -> Vec<SnapshotError> {
    let mut happenings: Vec<Happening> = Vec::new();
    for (at, event) in timeline {
        let (what, error) = match event {
            TimelineEvent::Error { message } => {
                (format!("error: {message}"), Some(("session", message.clone())))
            }
            TimelineEvent::TurnEnded { state, error, stop_reason, .. } => match state {
                TurnState::Failed | TurnState::Interrupted => {
                    let message = error.clone().unwrap_or_else(|| format!("the turn {state}"));
                    (format!("the turn {state}"), Some(("turn", message)))
                }
                _ => (
                    format!("the turn ended ({})", stop_reason.as_deref().unwrap_or("completed")),
                    None,
                ),
            },
            TimelineEvent::Resumed { outcome, .. } => {
                (format!("the session resumed ({outcome})"), None)
            }
            TimelineEvent::ExecutionStarted { generation, .. } => {
                (format!("the agent was started (execution {generation})"), None)
            }
            TimelineEvent::Paused { trigger, .. } => {
                (format!("the session paused ({trigger})"), None)
            }
            TimelineEvent::State { state, .. } => (format!("the session became {state}"), None),
            TimelineEvent::Moved { from, to, reason } => {
                let to = to.as_deref().map(|to| format!(" to {to}")).unwrap_or_default();
                (format!("the session moved from engine {from}{to} ({})", reason.as_str()), None)
            }
            TimelineEvent::TurnStarted { .. }
            | TimelineEvent::PauseRequested { .. }
            | TimelineEvent::SnapshotTaken { .. }
            | TimelineEvent::CheckpointTaken { .. }
            | TimelineEvent::Plan { .. } => continue,
        };
        let outcome = match event {
            TimelineEvent::TurnEnded { state: TurnState::Completed, .. } => Outcome::TurnDone,
            TimelineEvent::Paused { .. } => Outcome::Paused,
            _ => Outcome::Other,
        };
        let rank = match event {
            TimelineEvent::TurnStarted { .. }
            | TimelineEvent::ExecutionStarted { .. }
            | TimelineEvent::Resumed { .. } => 0,
            _ => 2,
        };
        happenings.push(Happening { at: *at, what, error, outcome, rank });
    }
    for entry in entries {
        let name = entry.tool_name.as_deref().unwrap_or("tool");
        let (what, error) = match entry.kind {
            EntryType::UserMessage => {
                (format!("the user asked: {}", excerpt(&entry.content, 200)), None)
            }
            EntryType::AgentMessage => {
                (format!("the agent said: {}", excerpt(&entry.content, 200)), None)
            }
            EntryType::ToolCall => (format!("the agent called {name}"), None),
            EntryType::ToolResult if entry.tool_status.as_deref() == Some("failed") => {
                let message = format!("{name} failed: {}", excerpt(&entry.content, TEXT_CHARS));
                (format!("{name} failed"), Some(("tool", message)))
            }
            EntryType::ToolResult => (format!("{name} completed"), None),
            EntryType::Plan => ("the agent gave its plan".to_owned(), None),
        };
        let outcome = match (entry.kind, entry.tool_status.as_deref()) {
            (EntryType::ToolResult, Some("failed")) => Outcome::ToolFailed(name.to_owned()),
            (EntryType::ToolResult, _) => Outcome::ToolDone(name.to_owned()),
            _ => Outcome::Other,
        };
        happenings.push(Happening { at: entry.at, what, error, outcome, rank: 1 });
    }
    happenings.sort_by_key(|happening| (happening.at, happening.rank));
    let mut found: Vec<SnapshotError> = Vec::new();
    for (idx, happening) in happenings.iter().enumerate() {
        let Some((source, message)) = &happening.error else { continue };
        let followed_by = happenings[idx + 1..]
            .iter()
            .find(|next| next.what != happening.what)
            .map(|next| next.what.clone());
        let tool = match &happening.outcome {
            Outcome::ToolFailed(name) => Some(name.as_str()),
            _ => None,
        };
        let mut after: Vec<Outcome> =
            happenings[idx + 1..].iter().map(|next| next.outcome.clone()).collect();
        if pausing {
            after.push(Outcome::Paused);
        }
        found.push(SnapshotError {
            at: happening.at,
            source: (*source).to_owned(),
            message: excerpt(message, TEXT_CHARS),
            followed_by,
            resolution: Some(heuristics::resolution(source, tool, &after)),
        });
    }
    let skip = found.len().saturating_sub(MAX_ERRORS);
    found.split_off(skip)
}

/// The resume context of a capacity handoff: the session's state compiled from `snapshot`
/// around the user's `prompt`, within `budget` characters (the prompt itself is always
/// whole, as with history injection). ARCHITECTURE.md's "Pause, snapshots and the capacity
/// handoff" lists its parts.
pub fn handoff_context(
    snapshot: &Snapshot,
    prompt: &str,
    budget: usize,
    drift: Option<&protocol::api::GitDrift>,
) -> String {
    let mut head = String::from("RESUME CONTEXT FOR CONTINUING TASK\n");
    head.push_str(&format!(
        "(handed over from an agent session whose context was full; compiled from snapshot {})\n",
        snapshot.snapshot_id
    ));
    head.push_str(&task_section(snapshot));
    let tail = state_sections(snapshot, &plan_section(&snapshot.plan), drift);
    let end = format!(
        "\n=== CURRENT REQUEST ===\n{prompt}\n\n=== INSTRUCTIONS ===\nYou are continuing work on the above task in a fresh agent session: the previous one ran out of context.\n\
         The sections above summarise what was asked, what was done and what failed. Check the workspace before changing it,\n\
         do not repeat work that was already completed, and go on with the current request.\n"
    );
    // The turns fill what the budget leaves, newest first.
    let fixed = head.chars().count() + tail.chars().count() + 40;
    let mut room = budget.saturating_sub(fixed);
    let mut rendered: Vec<String> = Vec::new();
    let first = snapshot.turns_omitted;
    // Tether's own summary turn is no work of the session's: its answer is the summary.
    let asked = snapshot.summary.as_ref().and_then(|summary| summary.turn_id.as_deref());
    let worked: Vec<&SnapshotTurn> =
        snapshot.turns.iter().filter(|turn| Some(turn.turn_id.as_str()) != asked).collect();
    for (idx, turn) in worked.iter().enumerate().rev() {
        let text = describe_turn(first + idx + 1, turn);
        let cost = text.chars().count();
        if cost > room {
            break;
        }
        room -= cost;
        rendered.push(text);
    }
    let omitted = snapshot.turns_omitted + worked.len() - rendered.len();
    let mut text = head;
    text.push_str("\n=== WORK SO FAR ===\n");
    if omitted > 0 {
        text.push_str(&format!("[{omitted} earlier turns omitted]\n"));
    }
    if rendered.is_empty() && omitted == 0 {
        text.push_str("(no turns yet)\n");
    }
    for turn in rendered.iter().rev() {
        text.push_str(turn);
    }
    text.push_str(&tail);
    text.push_str(&end);
    text
}

/// The compiled parts of the context a history injection wraps around the history, from
/// the snapshot a resume compiles from (see `Store::latest_snapshot`): `(head, tail)` —
/// the task and why the session stopped before the history; the agent's summary, errors,
/// tests, plan, workspace and its changes after it. Together at most half of `budget`
/// (the history gets the rest). `plan` is the history's newest (it may be newer than the
/// snapshot's). Without a snapshot: the plan and the changes only.
pub fn injected_sections(
    snapshot: Option<&Snapshot>,
    plan: &[protocol::api::PlanEntry],
    drift: Option<&protocol::api::GitDrift>,
    budget: usize,
) -> (String, String) {
    let plan = plan_section(plan);
    let Some(snapshot) = snapshot else {
        return (String::new(), excerpt(&(plan + &drift_section(drift)), budget / 2));
    };
    let mut head = task_section(snapshot);
    if snapshot.trigger != SnapshotTrigger::TurnComplete {
        head.push_str(&format!("\n=== WHY THE SESSION STOPPED ===\n{}", stop_cause(snapshot)));
    }
    let head = excerpt(&head, budget / 4);
    let room = (budget / 2).saturating_sub(head.chars().count());
    (head, excerpt(&state_sections(snapshot, &plan, drift), room))
}

/// Why a snapshot's session stopped, in a resume context's words.
fn stop_cause(snapshot: &Snapshot) -> String {
    let what = match snapshot.trigger {
        SnapshotTrigger::Pause => "It was paused",
        SnapshotTrigger::Exhaustion => "It paused because the agent's context was nearly full",
        SnapshotTrigger::Timeout => "It was paused, cutting a turn that ran too long",
        SnapshotTrigger::Crash => "Its agent stopped unexpectedly",
        SnapshotTrigger::Idle => "It was parked after a while without a turn",
        SnapshotTrigger::Budget => "It paused at its spending budget",
        SnapshotTrigger::MaxTurns => "It paused at its most turns",
        SnapshotTrigger::MaxDuration => "It paused at its longest run time",
        SnapshotTrigger::TurnComplete => "A turn completed",
    };
    match &snapshot.reason {
        Some(reason) if !reason.trim().is_empty() => format!("{what}: {}\n", excerpt(reason, 500)),
        _ => format!("{what}.\n"),
    }
}

/// The task of a snapshot as a resume context's section.
fn task_section(snapshot: &Snapshot) -> String {
    let mut text = String::from("\n=== ORIGINAL TASK ===\n");
    text.push_str(&excerpt(&snapshot.task.title, 200));
    if !snapshot.task.description.trim().is_empty() {
        text.push('\n');
        text.push_str(&excerpt(&snapshot.task.description, 2000));
    }
    text.push('\n');
    text
}

/// What a snapshot says of the session's state as a resume context's sections: the
/// agent's summary, errors, tests, `plan` (a rendered section), the workspace and its
/// changes since (`drift`).
fn state_sections(
    snapshot: &Snapshot,
    plan: &str,
    drift: Option<&protocol::api::GitDrift>,
) -> String {
    let mut tail = summary::sections(snapshot.summary.as_ref());
    if !snapshot.errors.is_empty() {
        tail.push_str("\n=== ERRORS AND WHAT FOLLOWED ===\n");
        for error in snapshot.errors.iter().rev().take(10).rev() {
            let resolution = match error.resolution {
                Some(resolution) => format!(", {}", resolution_name(resolution)),
                None => String::new(),
            };
            let message = excerpt(&error.message, 300);
            tail.push_str(&format!("- [{}{resolution}] {message}", error.source));
            if let Some(next) = &error.followed_by {
                tail.push_str(&format!(" -> then: {}", excerpt(next, 200)));
            }
            tail.push('\n');
        }
    }
    if let Some(tests) = &snapshot.tests {
        let how = if tests.passed { "passed" } else { "failed" };
        tail.push_str(&format!("\n=== TESTS ===\nThe last test run, `{}`, {how}", tests.command));
        if !tests.failing.is_empty() {
            tail.push_str(&format!("; failing: {}", excerpt(&tests.failing.join(", "), 500)));
        }
        tail.push('\n');
    }
    tail.push_str(plan);
    tail.push_str("\n=== WORKSPACE ===\n");
    tail.push_str(&describe_git(&snapshot.git));
    tail.push_str(&drift_section(drift));
    tail
}

/// An error's resolution in a resume context's words.
fn resolution_name(resolution: protocol::api::ErrorResolution) -> &'static str {
    match resolution {
        protocol::api::ErrorResolution::Fixed => "fixed",
        protocol::api::ErrorResolution::WorkedAround => "worked around",
        protocol::api::ErrorResolution::Deferred => "deferred",
        protocol::api::ErrorResolution::Unresolved => "unresolved",
    }
}

/// How the workspace changed since the snapshot a resume compares with, as a resume
/// context's section (empty without a change).
pub fn drift_section(drift: Option<&protocol::api::GitDrift>) -> String {
    match drift {
        Some(drift) => format!(
            "\n=== WORKSPACE CHANGES SINCE THE LAST SNAPSHOT (not made by you) ===\n{}",
            excerpt(&drift.describe(), 3000)
        ),
        None => String::new(),
    }
}

/// The agent's newest plan as a resume context's section: each step done, in progress or
/// next (empty without a plan). History injection says it too.
pub fn plan_section(plan: &[protocol::api::PlanEntry]) -> String {
    if plan.is_empty() {
        return String::new();
    }
    let lines = excerpt(&protocol::api::PlanEntry::lines(plan), 3000);
    format!("\n=== PLAN (as the agent last gave it) ===\n{lines}\n")
}

fn describe_turn(number: usize, turn: &SnapshotTurn) -> String {
    let how = match (&turn.stop_reason, &turn.error) {
        (_, Some(error)) => format!("{}: {}", turn.state, excerpt(error, 200)),
        (Some(reason), None) => format!("{}, {reason}", turn.state),
        (None, None) => turn.state.to_string(),
    };
    // Continuation lines are indented, so each turn's text stays inside its entry.
    let indented = |text: &str| excerpt(text, 500).replace('\n', "\n    ");
    let mut text = format!(
        "Turn {number} ({how}): {}\n",
        indented(turn.prompt.as_deref().unwrap_or("(prompt not in the history read)"))
    );
    if !turn.tool_calls.is_empty() {
        let tools: Vec<String> = turn
            .tool_calls
            .iter()
            .map(|call| format!("{} ({})", call.title, call.status))
            .collect();
        text.push_str(&format!("  Tools: {}\n", excerpt(&tools.join("; "), 500)));
    }
    if let Some(reply) = &turn.reply {
        text.push_str(&format!("  Result: {}\n", indented(reply)));
    }
    text
}

fn describe_git(git: &GitState) -> String {
    if !git.repository {
        return "The workspace is not a git repository.\n".into();
    }
    let short = |commit: &Option<String>| {
        commit.as_deref().map_or_else(|| "no commit".to_owned(), |c| c.chars().take(12).collect())
    };
    let mut text = format!(
        "Branch {} at {} (the session started at {}).\n",
        git.branch.as_deref().unwrap_or("(detached)"),
        short(&git.head_commit),
        short(&git.start_commit),
    );
    if !git.commits_since_start.is_empty() {
        text.push_str(&format!(
            "Commits since the start: {}\n",
            git.commits_since_start.join("; ")
        ));
    }
    let list = |files: &[String]| excerpt(&files.join(", "), 600);
    if !git.modified_files.is_empty() {
        text.push_str(&format!("Files changed since the start: {}\n", list(&git.modified_files)));
    }
    if !git.staged_files.is_empty() {
        text.push_str(&format!("Staged: {}\n", list(&git.staged_files)));
    }
    text.push_str(if git.dirty {
        "There are uncommitted changes.\n"
    } else {
        "Nothing uncommitted.\n"
    });
    if let Some(diffstat) = &git.diffstat {
        text.push_str(diffstat);
        text.push('\n');
    }
    text
}

#[cfg(test)]
pub(crate) mod tests;
