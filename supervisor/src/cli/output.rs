//! What the client commands print: fields, events as lines, launch progress, timelines.

use super::{
    Deserialize, Duration, EventKind, Exit, Failure, Instant, LaunchStep, Serialize, SessionEvent,
    SessionState, Write,
};
use protocol::api::PromptOrigin;

/// Prints `value` as pretty JSON.
pub(super) fn print_json<T: Serialize>(value: &T) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|err| Failure { code: Exit::Error, line: format!("error: {err}") })?;
    println!("{text}");
    Ok(())
}

/// Sessions as JSON, each with `session_id` beside its `id` (what `status`, events and
/// the other results call it); `id` stays for the scripts that read it.
pub(super) fn sessions_json(
    sessions: &[protocol::api::SessionSummary],
) -> Result<serde_json::Value, Failure> {
    let mut listed = Vec::with_capacity(sessions.len());
    for session in sessions {
        let value = serde_json::to_value(session)
            .map_err(|err| Failure { code: Exit::Error, line: format!("error: {err}") })?;
        let mut fields = serde_json::Map::new();
        for (key, value) in value.as_object().into_iter().flatten() {
            fields.insert(key.clone(), value.clone());
            if key == "id" {
                fields.insert("session_id".into(), value.clone());
            }
        }
        listed.push(serde_json::Value::Object(fields));
    }
    Ok(serde_json::Value::Array(listed))
}

pub(super) fn or_dash(value: Option<&str>) -> &str {
    value.unwrap_or("-")
}

/// Prints a struct's members as `key: value` lines.
pub(super) fn print_fields<T: Serialize>(value: &T) -> Result<(), Failure> {
    let value = serde_json::to_value(value)
        .map_err(|err| Failure { code: Exit::Error, line: format!("error: {err}") })?;
    // Usage, the queue and the sandbox have lines of their own (`usage_line`,
    // `queue_line`, `confinement_line`).
    let own_line = |key: &str| matches!(key, "usage" | "queue" | "sandbox" | "checkpoint");
    for (key, value) in value.as_object().into_iter().flatten().filter(|(key, _)| !own_line(key)) {
        let shown = match value {
            serde_json::Value::String(text) => text.clone(),
            serde_json::Value::Null => "-".into(),
            other => other.to_string(),
        };
        println!("{key}: {shown}");
    }
    Ok(())
}

/// A session's newest checkpoint, in words: `checkpoint: 4 (turn 3), 12 files, 2 min ago`.
pub(super) fn checkpoint_line(checkpoint: Option<&protocol::api::Checkpoint>) -> String {
    let Some(checkpoint) = checkpoint else { return "checkpoint: none yet".into() };
    let what = match checkpoint.turn {
        Some(turn) => format!("turn {turn}"),
        None => checkpoint.trigger.as_str().to_owned(),
    };
    format!(
        "checkpoint: {} ({what}), {} file(s), {}, {}",
        checkpoint.seq,
        checkpoint.files,
        bytes(checkpoint.bytes),
        ago(checkpoint.taken_at)
    )
}

/// How an agent is confined, in words: `sandbox: …` (`unconfined` for `None`).
pub(super) fn confinement_line(sandbox: Option<&protocol::api::Confinement>) -> String {
    let Some(sandbox) = sandbox else { return "sandbox: none (unconfined)".into() };
    let by = sandbox.by.as_deref().unwrap_or("nothing on this runtime");
    let mut line = format!("sandbox ({by}): filesystem {}", sandbox.filesystem);
    for (what, paths) in [("readable", &sandbox.readable), ("writable", &sandbox.writable)] {
        if !paths.is_empty() {
            line.push_str(&format!(" (+{what} {})", paths.join(", ")));
        }
    }
    line.push_str(&format!("; network {}", sandbox.network));
    if sandbox.network == "allowlist" {
        let entries: Vec<String> = sandbox
            .allow
            .iter()
            .map(|entry| match sandbox.endpoints.contains(entry) {
                true => format!("{entry} (model endpoint)"),
                false => entry.clone(),
            })
            .collect();
        let entries = if entries.is_empty() { "nothing".into() } else { entries.join(", ") };
        line.push_str(&format!(": {entries}"));
    }
    line
}

/// What a launch step is doing, in words.
pub(super) fn step_name(step: LaunchStep) -> &'static str {
    match step {
        LaunchStep::Launching => "launching the agent",
        LaunchStep::Initializing => "the agent is starting (initialize)",
        LaunchStep::Authenticating => "authenticating",
        LaunchStep::Restoring => "restoring the agent's session",
        LaunchStep::Opening => "opening an agent session",
        LaunchStep::Settings => "setting the chosen model and mode again",
    }
}

/// A progress event's line.
pub(super) fn progress_line(step: LaunchStep, detail: Option<&str>) -> String {
    match detail {
        Some(detail) => format!("{}: {detail}", step_name(step)),
        None => step_name(step).to_owned(),
    }
}

/// One line for an event, as `follow` prints it.
pub(super) fn describe(kind: &EventKind) -> String {
    match kind {
        EventKind::State { state, error } => match error {
            Some(error) => format!("state {}: {error}", state.as_str()),
            None => format!("state {}", state.as_str()),
        },
        EventKind::TurnStarted { turn_id, prompt, origin, .. } => match origin {
            PromptOrigin::User => format!("turn {turn_id} started: {prompt}"),
            PromptOrigin::PauseSummary => {
                format!(
                    "turn {turn_id} started: Tether asks the agent for its summary before pausing"
                )
            }
        },
        EventKind::AgentMessageChunk { text, .. } => format!("agent: {text}"),
        EventKind::AgentThoughtChunk { text, .. } => format!("thought: {text}"),
        EventKind::ToolCall { update } => {
            format!("tool: {}", AcpUpdate::of(update).title.as_deref().unwrap_or("tool"))
        }
        EventKind::ToolCallUpdate { update } => {
            let AcpUpdate { title, status, .. } = AcpUpdate::of(update);
            let status = status.as_deref().unwrap_or("-");
            match title {
                // The agent names it anew (its first title may be a placeholder).
                Some(title) => format!("tool update: {title}: {status}"),
                None => format!("tool update: {status}"),
            }
        }
        EventKind::SessionUpdate { update } => {
            format!("update: {}", AcpUpdate::of(update).kind.as_deref().unwrap_or("-"))
        }
        EventKind::PermissionRequest { request_id, params } => {
            format!("permission requested: {request_id}: {}", permission_lines(params).join("; "))
        }
        EventKind::ElicitationRequest { request_id, params } => format!(
            "elicitation requested: {request_id}: {}",
            super::questions::elicitation_lines(params).join("; ")
        ),
        EventKind::PermissionResolved { request_id, .. } => {
            format!("question resolved: {request_id}")
        }
        EventKind::TurnEnded { turn_id, state, stop_reason, error } => format!(
            "turn {turn_id} {}: {}",
            state.as_str(),
            stop_reason.as_deref().or(error.as_deref()).unwrap_or("-")
        ),
        EventKind::Notice { message } => format!("notice: {message}"),
        EventKind::Progress { step, detail } => progress_line(*step, detail.as_deref()),
        EventKind::ResumeOutcome { outcome } => format!("resumed: {}", outcome.as_str()),
        EventKind::BudgetWarning { budget } => format!("budget warning: {}", budget.describe()),
        EventKind::ContextWarning { used, size, percent, threshold } => format!(
            "context warning: {percent}% full ({used} of {size} tokens); at {threshold}% the session pauses and hands over to a fresh agent session"
        ),
        EventKind::PauseRequested { reason, force_after_ms } => format!(
            "pause requested{}: the running turn may take {} s more",
            reason.as_deref().map(|reason| format!(" ({reason})")).unwrap_or_default(),
            force_after_ms / 1000
        ),
        EventKind::Paused { reason, forced, trigger } => format!(
            "paused by {}{}{}",
            trigger.map_or("pause", |trigger| trigger.as_str()),
            reason.as_deref().map(|reason| format!(": {reason}")).unwrap_or_default(),
            if *forced { " (the running turn was cancelled)" } else { "" }
        ),
        EventKind::SnapshotTaken { snapshot_id, trigger } => {
            format!("snapshot {snapshot_id} taken ({})", trigger.as_str())
        }
        EventKind::Resumed { outcome } => format!("resumed: {}", outcome.as_str()),
        EventKind::Queue { queue } => queue_line(queue),
        EventKind::Steered { turn_id, prompt, mode, .. } => {
            let how = match mode {
                protocol::api::SteerMode::Native => "into the turn",
                protocol::api::SteerMode::Fallback => "the turn cancelled, the message next",
                protocol::api::SteerMode::Prompt => "as a prompt",
            };
            format!("steered turn {turn_id} ({how}): {prompt}")
        }
        EventKind::Rewound { turn_id, rewound, saved_ref } => format!(
            "rewound to turn {turn_id}: {} turn(s) left the conversation{}",
            rewound.len(),
            saved_ref
                .as_deref()
                .map(|r| format!("; the workspace's files before are on {r}"))
                .unwrap_or_default()
        ),
        EventKind::ChangeReviewed { path, action, saved_ref } => match action {
            protocol::api::ReviewAction::Kept => format!("review: {path} kept"),
            protocol::api::ReviewAction::Unkept => format!("review: {path}'s keep taken back"),
            protocol::api::ReviewAction::Reverted => format!(
                "review: {path} reverted (what the workspace held is on {})",
                saved_ref.as_deref().unwrap_or("a ref")
            ),
        },
        EventKind::EgressRefused { target, reason } => {
            format!("egress refused: the agent asked for {target} ({reason})")
        }
        EventKind::Other => "an event of a kind this client does not know (a newer daemon)".into(),
        _ => "an event of a kind this client does not know".to_owned(),
    }
}

/// "1 turn", "2 turns".
pub(super) fn plural(count: usize, what: &str) -> String {
    format!("{count} {what}{}", if count == 1 { "" } else { "s" })
}

/// When `at` (Unix ms) was, as a person reads it: "12 s ago", "5 min ago", "3 h ago",
/// "2 d ago".
pub(super) fn ago(at: i64) -> String {
    format!("{} ago", span((crate::store::now_ms() - at).max(0)))
}

/// A span of `ms` milliseconds, as a person reads it: "40 ms", "12 s", "5 min", "3 h",
/// "2 d".
pub(super) fn span(ms: i64) -> String {
    let secs = ms / 1000;
    match secs {
        _ if ms < 1000 => format!("{ms} ms"),
        0..=119 => format!("{secs} s"),
        120..=7199 => format!("{} min", secs / 60),
        7200..=172_799 => format!("{} h", secs / 3600),
        _ => format!("{} d", secs / 86_400),
    }
}

/// A paused session's summary, as `resume` prints it first: why and when it paused, and
/// what its newest snapshot holds (turns, errors, the plan, the workspace).
pub(super) fn pause_summary(
    status: &protocol::api::SessionStatus,
    snapshot: Option<&protocol::api::Snapshot>,
) -> Vec<String> {
    let by = status.paused_by.map_or("pause", |trigger| trigger.as_str());
    let why =
        status.pause_reason.as_deref().map(|reason| format!(": {reason}")).unwrap_or_default();
    let ago = status.paused_at.map(|at| format!(" {}", ago(at))).unwrap_or_default();
    let mut lines = vec![format!("paused{ago} by {by}{why}")];
    let Some(snapshot) = snapshot else {
        lines.push("no snapshot of it".into());
        return lines;
    };
    let turns = snapshot.usage.turns;
    lines.push(format!(
        "snapshot {} ({}): {turns} turn{}, {} error{}",
        snapshot.snapshot_id,
        snapshot.trigger.as_str(),
        if turns == 1 { "" } else { "s" },
        snapshot.errors.len(),
        if snapshot.errors.len() == 1 { "" } else { "s" }
    ));
    if let Some(last) = snapshot.turns.last() {
        let prompt = last.prompt.as_deref().unwrap_or("-");
        lines.push(format!(
            "  last turn ({}): {}",
            last.state.as_str(),
            crate::history::excerpt(prompt, 120)
        ));
    }
    if !snapshot.plan.is_empty() {
        let progress = protocol::api::PlanEntry::progress(&snapshot.plan);
        lines.push(format!(
            "  plan: {} done, {} in progress, {} next{}",
            progress.done,
            progress.in_progress,
            progress.pending,
            progress
                .current
                .map(|step| format!(" — now: {}", crate::history::excerpt(step, 120)))
                .unwrap_or_default()
        ));
    }
    if snapshot.git.repository {
        let head: String =
            snapshot.git.head_commit.as_deref().unwrap_or("no commit").chars().take(12).collect();
        let dirty = if snapshot.git.dirty { ", uncommitted changes" } else { "" };
        let branch = snapshot.git.branch.as_deref().unwrap_or("(detached)");
        lines.push(format!("  workspace: {branch} at {head}{dirty}"));
    }
    if let Some(line) = snapshot.summary.as_ref().and_then(summary_line) {
        lines.push(line);
    }
    lines
}

/// A pause's summary turn in one line: what the agent summarised, or why nothing (no line
/// when the profile does not ask for one).
pub(super) fn summary_line(summary: &protocol::api::PauseSummary) -> Option<String> {
    use protocol::api::SummaryState;
    let note = summary.note.as_deref().unwrap_or("");
    Some(match (summary.state, &summary.summary) {
        (SummaryState::Off, _) => return None,
        (SummaryState::Stored, Some(stored)) => {
            let next = stored
                .next_steps
                .first()
                .map(|step| format!("; next: {}", crate::history::excerpt(step, 120)))
                .unwrap_or_default();
            format!(
                "  agent's summary: {}, {}{next}",
                plural(stored.decisions.len(), "decision"),
                plural(stored.open_problems.len(), "open problem")
            )
        }
        (SummaryState::Invalid, _) => format!("  agent's summary refused: {note}"),
        (SummaryState::Skipped, _) => format!("  no agent's summary: {note}"),
        (_, _) => format!("  agent's summary not given: {note}"),
    })
}

/// What the CLI reads of an ACP update it relays (tool calls, other session updates).
#[derive(Debug, Default, Deserialize)]
pub(super) struct AcpUpdate {
    pub(super) title: Option<String>,
    pub(super) status: Option<String>,
    #[serde(rename = "sessionUpdate")]
    pub(super) kind: Option<String>,
}

impl AcpUpdate {
    pub(super) fn of(update: &serde_json::Value) -> AcpUpdate {
        AcpUpdate::deserialize(update).unwrap_or_default()
    }
}

/// Shows, on stderr, what a session does while the user waits: the steps of bringing its
/// agent up (with the time since the command started, and how long the current step has
/// waited: see [`StepWait`]), notices, a resume's outcome and reconnects. Nothing with
/// `--quiet`.
pub(super) struct Shown {
    quiet: bool,
    started: Instant,
    /// The launch step waited in. The feed and the command's loop both hold the `Shown`
    /// (shared); a std mutex, held for no await.
    step: std::sync::Mutex<StepWait>,
}

impl Shown {
    pub(super) fn new(quiet: bool) -> Shown {
        use std::io::IsTerminal;
        let started = Instant::now();
        let terminal = std::io::stderr().is_terminal();
        Shown { quiet, started, step: std::sync::Mutex::new(StepWait::new(terminal, started)) }
    }

    pub(super) fn line(&self, line: &str) {
        if self.quiet {
            return;
        }
        let shows = self.step().interrupted();
        show(shows);
        eprintln!("[{:5.1}s] {line}", self.started.elapsed().as_secs_f64());
    }

    pub(super) fn progress(&self, event: &SessionEvent) {
        if self.quiet {
            return;
        }
        let line = match &event.kind {
            EventKind::Progress { step, detail } => {
                let shows = self.step().progress(Instant::now(), *step, detail.clone());
                return show(shows);
            }
            EventKind::Notice { message } => format!("notice: {message}"),
            EventKind::ResumeOutcome { outcome } => format!("resumed: {}", outcome.as_str()),
            EventKind::State { state: SessionState::Starting, .. } => return,
            // Anything else: the agent is up (or gone); its step is over.
            _ => return show(self.step().ended()),
        };
        self.line(&line);
    }

    /// How long until [`Shown::tick`] has something to show (`None`: no step waits).
    pub(super) fn until_tick(&self) -> Option<Duration> {
        match self.quiet {
            true => None,
            false => self.step().until_tick(Instant::now()),
        }
    }

    fn step(&self) -> std::sync::MutexGuard<'_, StepWait> {
        // A panic while it was held left nothing half-done that matters for a display.
        self.step.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Shows how long the current step has waited, with the agent's latest line.
    pub(super) fn tick(&self) {
        if !self.quiet {
            show(self.step().tick(Instant::now()));
        }
    }
}

impl Drop for Shown {
    fn drop(&mut self) {
        // An error or a result printed after: on a line of its own.
        show(self.step().ended());
    }
}

/// Writes what a [`StepWait`] decided on stderr.
fn show(shows: Vec<Shows>) {
    let mut stderr = std::io::stderr().lock();
    for shown in shows {
        let _ = match shown {
            Shows::Line(line) => writeln!(stderr, "{line}"),
            // Back to the start of the line, erased, and drawn again.
            Shows::Redraw(line) => write!(stderr, "\r\x1b[K{line}"),
            Shows::EndLine => writeln!(stderr),
        };
    }
    let _ = stderr.flush();
}

/// What [`StepWait`] writes on stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Shows {
    /// A line of its own.
    Line(String),
    /// The line being drawn, drawn again (a terminal's).
    Redraw(String),
    /// The line being drawn ends (the next goes below it).
    EndLine,
}

/// How long a launch step waits in silence off a terminal before a line says it still
/// waits (and what the agent last printed).
pub(super) const STILL_WAITING: Duration = Duration::from_secs(10);

/// The launch step a command waits in, shown as it goes (decided here from the times
/// given, written by [`Shown`]). Each step starts a line. On a terminal that line is
/// drawn again every second with how long the step has waited and its latest detail (the
/// agent's newest stderr line); elsewhere (a log, a pipe) a line says so at most every
/// [`STILL_WAITING`].
pub(super) struct StepWait {
    terminal: bool,
    /// When the command started (the lines' times count from it).
    started: Instant,
    current: Option<Waited>,
}

/// The step waited in.
struct Waited {
    step: LaunchStep,
    detail: Option<String>,
    /// When it began.
    began: Instant,
    /// When a line of it was last written (off a terminal).
    written: Instant,
    /// A terminal's line of it is drawn and not ended.
    drawn: bool,
}

impl StepWait {
    pub(super) fn new(terminal: bool, started: Instant) -> StepWait {
        StepWait { terminal, started, current: None }
    }

    /// A `progress` event: a new step starts a line; the same step's new detail updates
    /// it (drawn at once on a terminal, else with the next line due).
    pub(super) fn progress(
        &mut self,
        now: Instant,
        step: LaunchStep,
        detail: Option<String>,
    ) -> Vec<Shows> {
        if let Some(waited) = self.current.as_mut().filter(|waited| waited.step == step) {
            waited.detail = detail;
            return self.tick(now);
        }
        let mut shows = self.ended();
        let line = format!("{} {}", self.stamp(now), progress_line(step, detail.as_deref()));
        shows.push(match self.terminal {
            true => Shows::Redraw(line),
            false => Shows::Line(line),
        });
        self.current =
            Some(Waited { step, detail, began: now, written: now, drawn: self.terminal });
        shows
    }

    /// A second passed: on a terminal the line says how long its step has waited; off
    /// one, a line says it still waits once [`STILL_WAITING`] passed since the last.
    pub(super) fn tick(&mut self, now: Instant) -> Vec<Shows> {
        let stamp = self.stamp(now);
        let terminal = self.terminal;
        let Some(waited) = self.current.as_mut() else { return Vec::new() };
        let waiting = now.saturating_duration_since(waited.began).as_secs();
        let what = progress_line(waited.step, waited.detail.as_deref());
        if terminal {
            let began = waited.began.saturating_duration_since(self.started).as_secs_f64();
            let line = match waiting {
                0 => format!("[{began:5.1}s] {what}"),
                _ => format!("[{began:5.1}s] {what} ({waiting} s)"),
            };
            waited.drawn = true;
            return vec![Shows::Redraw(line)];
        }
        if now.saturating_duration_since(waited.written) < STILL_WAITING {
            return Vec::new();
        }
        waited.written = now;
        vec![Shows::Line(format!("{stamp} {what} (still waiting, {waiting} s)"))]
    }

    /// How long until [`StepWait::tick`] shows something (`None`: no step waits).
    pub(super) fn until_tick(&self, now: Instant) -> Option<Duration> {
        let waited = self.current.as_ref()?;
        Some(match self.terminal {
            true => Duration::from_secs(1),
            false => (waited.written + STILL_WAITING).saturating_duration_since(now),
        })
    }

    /// Another line is about to be written: a drawn line ends first (its step goes on,
    /// drawn again below at the next tick).
    pub(super) fn interrupted(&mut self) -> Vec<Shows> {
        match self.current.as_mut() {
            Some(waited) if waited.drawn => {
                waited.drawn = false;
                vec![Shows::EndLine]
            }
            _ => Vec::new(),
        }
    }

    /// The step is over (the agent is up, or gone): its drawn line ends.
    pub(super) fn ended(&mut self) -> Vec<Shows> {
        let shows = self.interrupted();
        self.current = None;
        shows
    }

    /// `[ 12.3s]`: the time since the command started.
    fn stamp(&self, now: Instant) -> String {
        format!("[{:5.1}s]", now.saturating_duration_since(self.started).as_secs_f64())
    }
}

/// A size in bytes, in the largest binary unit under which it is at least 1.
pub(super) fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A session's executions, turns and timeline, as `sessions show` prints them after its
/// status: each execution with its generation (from its start in the timeline when the
/// daemon gives it only for the current one), each turn with its tokens (`turn_usage`, by
/// turn id), times as a person reads them.
pub(super) fn timeline_lines(
    timeline: &protocol::api::Timeline,
    turn_usage: &[protocol::api::UsageGroup],
) -> Vec<String> {
    use protocol::api::TimelineEvent;
    let mut lines = vec!["executions:".to_owned()];
    for execution in &timeline.executions {
        let started = timeline.entries.iter().find_map(|entry| match &entry.event {
            TimelineEvent::ExecutionStarted { execution_id, generation }
                if *execution_id == execution.execution_id =>
            {
                Some(*generation)
            }
            _ => None,
        });
        let mut about = Vec::new();
        if let Some(generation) = execution.generation.or(started) {
            about.push(format!("generation {generation}"));
        }
        match (execution.current, execution.status.as_deref()) {
            (true, Some(status)) => about.push(status.to_owned()),
            (true, None) => {}
            (false, _) => about.push("over".into()),
        }
        if let Some(outcome) = execution.resume_outcome {
            about.push(format!("resumed ({})", outcome.as_str()));
        }
        about.push(plural(execution.turns, "turn"));
        if let Some(at) = execution.first_turn_at {
            about.push(format!("first turn {}", ago(at)));
        }
        lines.push(format!(
            "  {}{}\t{}",
            execution.execution_id,
            if execution.current { " (current)" } else { "" },
            about.join(", ")
        ));
    }
    lines.push("turns:".into());
    for turn in &timeline.turns {
        let when = match turn.ended_at {
            Some(ended) => {
                format!("started {}, took {}", ago(turn.started_at), span(ended - turn.started_at))
            }
            None => format!("started {}, not ended", ago(turn.started_at)),
        };
        let usage = turn_usage.iter().find(|group| group.key == turn.turn_id);
        lines.push(format!(
            "  {}\t{}\t{}\texecution {}\t{when}{}",
            turn.turn_id,
            turn.state.as_str(),
            or_dash(turn.stop_reason.as_deref().or(turn.error.as_deref())),
            turn.execution_id,
            turn_tokens(usage.map(|group| &group.totals)),
        ));
    }
    lines.push("timeline:".into());
    for entry in &timeline.entries {
        lines.push(format!(
            "  {}\t{}\t{}",
            entry.seq,
            ago(entry.at),
            describe_timeline(&entry.event, entry.at)
        ));
    }
    lines
}

/// A wait shown on stderr while a command waits for a session: on a terminal one line
/// that counts the seconds (erased when the wait ends, however it ends), else one line.
pub(super) struct Waiting {
    what: &'static str,
    started: Instant,
    terminal: bool,
}

impl Waiting {
    pub(super) fn start(what: &'static str) -> Waiting {
        use std::io::IsTerminal;
        let terminal = std::io::stderr().is_terminal();
        if !terminal {
            eprintln!("{what}…");
        }
        Waiting { what, started: Instant::now(), terminal }
    }

    /// Whether [`Waiting::tick`] shows anything (the line counts only on a terminal).
    pub(super) fn counts(&self) -> bool {
        self.terminal
    }

    /// Shows the seconds waited so far.
    pub(super) fn tick(&self) {
        if self.terminal {
            eprint!("\r{}… {} s", self.what, self.started.elapsed().as_secs());
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.terminal {
            // Back to the start of the line, and erase it.
            eprint!("\r\x1b[K");
        }
    }
}

/// A session's prompt queue in one line: how many wait, the next, and why it is halted.
pub(super) fn queue_line(queue: &protocol::api::PromptQueue) -> String {
    let waiting = match queue.prompts.first() {
        None => "queue empty".to_owned(),
        Some(next) => format!(
            "queue: {} waiting, next {}: {}",
            queue.prompts.len(),
            next.prompt_id,
            crate::history::excerpt(&next.prompt, 60)
        ),
    };
    match &queue.halted {
        Some(why) => format!("{waiting} (halted: {why})"),
        None => waiting,
    }
}

/// One timeline entry (of `at`, Unix ms), as `sessions show` prints it.
pub(super) fn describe_timeline(event: &protocol::api::TimelineEvent, at: i64) -> String {
    use protocol::api::TimelineEvent as E;
    match event {
        E::ExecutionStarted { execution_id, generation } => {
            format!("execution started\t{execution_id} (generation {generation})")
        }
        E::State { state, error } => match error {
            Some(error) => format!("state {state}\t{error}"),
            None => format!("state {state}"),
        },
        E::TurnStarted { turn_id, .. } => format!("turn started\t{turn_id}"),
        E::TurnEnded { turn_id, state, stop_reason, error } => format!(
            "turn {state}\t{turn_id}\t{}",
            or_dash(error.as_deref().or(stop_reason.as_deref()))
        ),
        E::PauseRequested { reason, trigger, force_at } => format!(
            "pause requested ({trigger})\t{}\ta running turn cancelled after {}",
            or_dash(reason.as_deref()),
            span(force_at - at)
        ),
        E::Paused { reason, trigger, forced } => format!(
            "paused ({trigger}{})\t{}",
            if *forced { ", forced" } else { "" },
            or_dash(reason.as_deref())
        ),
        E::Resumed { outcome, execution_id } => format!("resumed ({outcome})\t{execution_id}"),
        E::SnapshotTaken { snapshot_id, trigger } => format!("snapshot ({trigger})\t{snapshot_id}"),
        E::Moved { from, to, reason } => format!(
            "moved ({})\tfrom engine {from} to {}",
            reason.as_str(),
            to.as_deref().unwrap_or("the next resume's placement")
        ),
        E::CheckpointTaken { checkpoint: seq, trigger, turn, commit, files, added_bytes } => {
            let turn = turn.map(|n| format!(", turn {n}")).unwrap_or_default();
            format!(
                "checkpoint {seq} ({}{turn})\t{}, {}, {} added",
                trigger.as_str(),
                commit.get(..12).unwrap_or(commit),
                plural(usize::try_from(*files).unwrap_or(usize::MAX), "file"),
                bytes(*added_bytes)
            )
        }
        E::Error { message } => format!("error\t{message}"),
        E::Plan { total, done, in_progress, current } => format!(
            "plan {done}/{total} done, {in_progress} in progress\t{}",
            or_dash(current.as_deref())
        ),
    }
}

/// "1200 tokens (in 1000, out 200, cached 0), 0.42 USD, 3 turn(s)"; "tokens not reported"
/// when no turn's agent reported any, and how many turns did not when some did.
pub(super) fn usage_line(totals: &protocol::api::UsageTotals) -> String {
    let cost: Vec<String> =
        totals.cost.iter().map(|cost| format!("{:.4} {}", cost.amount, cost.currency)).collect();
    let without = match totals.turns_without_tokens {
        Some(without) if without > 0 && !totals.tokens_unknown() => {
            format!(" ({without} without a token report)")
        }
        _ => String::new(),
    };
    format!(
        "{}, {}, {} turn(s){without}",
        tokens_text(totals),
        if cost.is_empty() { "no cost reported".to_owned() } else { cost.join(" + ") },
        totals.turns
    )
}

/// "1200 tokens (in 1000, out 200, cached 0)", or "tokens not reported".
fn tokens_text(totals: &protocol::api::UsageTotals) -> String {
    if totals.tokens_unknown() {
        return "tokens not reported".into();
    }
    format!(
        "{} tokens (in {}, out {}, cached {})",
        totals.total_tokens,
        totals.input_tokens,
        totals.output_tokens,
        totals.cached_read_tokens + totals.cached_write_tokens,
    )
}

/// One turn's tokens in `sessions show`: "185 tokens", "tokens not reported" (ended
/// without a report), nothing while it runs or from a daemon that does not say.
fn turn_tokens(totals: Option<&protocol::api::UsageTotals>) -> String {
    match totals {
        Some(totals) if totals.turns_with_tokens.unwrap_or(0) > 0 => {
            format!("\t{} tokens", totals.total_tokens)
        }
        Some(totals) if totals.tokens_unknown() => "\ttokens not reported".into(),
        _ => String::new(),
    }
}

/// A session's usage line: its totals, its context use and its budgets.
pub(super) fn session_usage_line(usage: &protocol::api::SessionUsage) -> String {
    let mut line = usage_line(&usage.totals);
    if let (Some(used), Some(size)) = (usage.context_used, usage.context_size) {
        line.push_str(&format!(
            "; context {used}/{size} ({}%)",
            usage.context_percent.unwrap_or_default()
        ));
    }
    for budget in &usage.budgets {
        line.push_str(&format!("; {}", budget.describe()));
    }
    line
}

/// A duration like `30m`, `24h`, `7d` or `90s`, in ms.
pub(super) fn since_ms(text: &str) -> Result<i64, Failure> {
    let split = text.len().saturating_sub(1);
    let (number, unit) = text.split_at(split);
    let scale = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => 0,
    };
    match number.parse::<i64>() {
        Ok(n) if scale > 0 && n >= 0 => Ok(n.saturating_mul(scale)),
        _ => Err(Failure {
            code: Exit::Usage,
            line: format!("error: --since {text:?}: expected a duration like 90s, 30m, 24h or 7d"),
        }),
    }
}

/// What an agent's `session/request_permission` asks, as lines: the tool (title and kind),
/// what it touches (the files of its diffs and locations, its command or input), and each
/// option (`id` — name, kind).
pub(super) fn permission_lines(params: &serde_json::Value) -> Vec<String> {
    let tool = &params["toolCall"];
    let mut lines = Vec::new();
    let title = tool["title"].as_str().unwrap_or("a tool");
    lines.push(match tool["kind"].as_str() {
        Some(kind) => format!("{title} ({kind})"),
        None => title.to_owned(),
    });
    for item in tool["content"].as_array().into_iter().flatten() {
        if item["type"] == "diff" {
            let count = |field: &str| item[field].as_str().map_or(0, |text| text.lines().count());
            lines.push(format!(
                "edits {} (+{} −{} lines)",
                item["path"].as_str().unwrap_or("?"),
                count("newText"),
                count("oldText")
            ));
        }
    }
    for location in tool["locations"].as_array().into_iter().flatten() {
        if let Some(path) = location["path"].as_str() {
            lines.push(format!("at {path}"));
        }
    }
    if let Some(input) = tool.get("rawInput").filter(|input| !input.is_null()) {
        let mut text = input.to_string();
        if text.len() > 200 {
            let cut = (0..=200).rev().find(|&at| text.is_char_boundary(at)).unwrap_or(0);
            text.truncate(cut);
            text.push('…');
        }
        lines.push(format!("input {text}"));
    }
    let options: Vec<String> = params["options"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|option| {
            format!(
                "{} — {} ({})",
                option["optionId"].as_str().unwrap_or("?"),
                option["name"].as_str().unwrap_or(""),
                option["kind"].as_str().unwrap_or("?")
            )
        })
        .collect();
    if !options.is_empty() {
        lines.push(format!("options: {}", options.join(", ")));
    }
    lines
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_confinement_is_one_line_naming_the_model_endpoints() {
        assert_eq!(confinement_line(None), "sandbox: none (unconfined)");
        let sandbox = protocol::api::Confinement {
            filesystem: "workspace".into(),
            network: "allowlist".into(),
            allow: vec!["registry.npmjs.org:443".into(), "127.0.0.1:8080".into()],
            endpoints: vec!["127.0.0.1:8080".into()],
            readable: vec!["~/.claude".into()],
            writable: Vec::new(),
            by: Some("bubblewrap".into()),
        };
        assert_eq!(
            confinement_line(Some(&sandbox)),
            "sandbox (bubblewrap): filesystem workspace (+readable ~/.claude); network allowlist: registry.npmjs.org:443, 127.0.0.1:8080 (model endpoint)"
        );
        let none = protocol::api::Confinement {
            network: "none".into(),
            allow: Vec::new(),
            endpoints: Vec::new(),
            readable: Vec::new(),
            ..sandbox
        };
        assert_eq!(
            confinement_line(Some(&none)),
            "sandbox (bubblewrap): filesystem workspace; network none"
        );
        let said = line(
            json!({"type": "egress_refused", "target": "evil.example:443", "reason": "not on the list"}),
        );
        assert_eq!(said, "egress refused: the agent asked for evil.example:443 (not on the list)");
    }

    fn line(event: serde_json::Value) -> String {
        let mut event = event;
        event["seq"] = json!(1);
        event["at"] = json!(0);
        describe(&serde_json::from_value::<SessionEvent>(event).expect("an event").kind)
    }

    /// Off a terminal a step's line comes when it starts, then at most one every ten
    /// seconds saying it still waits with the agent's latest line (not a line per stderr
    /// line); on a terminal one line is drawn again every second with the time waited; a
    /// new step, or the agent up, ends it.
    #[test]
    fn a_waiting_step_updates_one_line_on_a_terminal_and_every_ten_seconds_elsewhere() {
        let started = Instant::now();
        let at = |secs: f64| started + Duration::from_secs_f64(secs);
        let says = |line: &str| Some(format!("the agent says: {line}"));
        let mut log = StepWait::new(false, started);
        assert_eq!(
            log.progress(at(0.1), LaunchStep::Initializing, None),
            [Shows::Line("[  0.1s] the agent is starting (initialize)".into())]
        );
        assert_eq!(log.until_tick(at(0.1)), Some(STILL_WAITING));
        for n in 1..=12 {
            let line = format!("debug line {n}");
            assert_eq!(log.progress(at(0.2), LaunchStep::Initializing, says(&line)), []);
        }
        assert_eq!(log.tick(at(5.0)), []);
        assert_eq!(
            log.tick(at(10.1)),
            [Shows::Line(
                "[ 10.1s] the agent is starting (initialize): the agent says: debug line 12 (still waiting, 10 s)"
                    .into()
            )]
        );
        assert_eq!(log.tick(at(15.0)), []);
        assert_eq!(
            log.progress(at(16.0), LaunchStep::Opening, None),
            [Shows::Line("[ 16.0s] opening an agent session".into())]
        );
        assert_eq!(log.ended(), []);
        assert_eq!((log.tick(at(40.0)), log.until_tick(at(40.0))), (vec![], None));

        let mut terminal = StepWait::new(true, started);
        let drawn = |line: &str| Shows::Redraw(line.to_owned());
        assert_eq!(
            terminal.progress(at(0.1), LaunchStep::Initializing, None),
            [drawn("[  0.1s] the agent is starting (initialize)")]
        );
        assert_eq!(terminal.until_tick(at(0.1)), Some(Duration::from_secs(1)));
        assert_eq!(
            terminal.progress(at(2.5), LaunchStep::Initializing, says("loading")),
            [drawn("[  0.1s] the agent is starting (initialize): the agent says: loading (2 s)")]
        );
        assert_eq!(
            terminal.tick(at(3.2)),
            [drawn("[  0.1s] the agent is starting (initialize): the agent says: loading (3 s)")]
        );
        // A notice goes on a line of its own: the step's line ends, drawn again below.
        assert_eq!(terminal.interrupted(), [Shows::EndLine]);
        assert_eq!(terminal.interrupted(), []);
        assert_eq!(
            terminal.progress(at(4.0), LaunchStep::Restoring, Some("session/load".into())),
            [drawn("[  4.0s] restoring the agent's session: session/load")]
        );
        assert_eq!(terminal.ended(), [Shows::EndLine]);
        assert_eq!(terminal.tick(at(9.0)), []);
    }

    /// `follow` names a steer and a rewind: what happened to the turn, and where a
    /// restored workspace's files went.
    #[test]
    fn follow_names_steers_and_rewinds() {
        let steered =
            json!({"type": "steered", "turn_id": "t1", "prompt": "left", "mode": "fallback"});
        assert_eq!(line(steered), "steered turn t1 (the turn cancelled, the message next): left");
        let rewound = json!({"type": "rewound", "turn_id": "t1", "rewound": ["t2", "t3"],
            "saved_ref": "refs/tether/rewound/s/r"});
        assert_eq!(
            line(rewound),
            "rewound to turn t1: 2 turn(s) left the conversation; the workspace's files before are on refs/tether/rewound/s/r"
        );
    }

    /// `follow` names the pause's and snapshot's events (they were a bare
    /// "event"), and says so of a kind it does not know.
    #[test]
    fn follow_names_pauses_snapshots_resumes_and_budget_warnings() {
        let requested =
            json!({"type": "pause_requested", "reason": "lunch", "force_after_ms": 300_000});
        assert_eq!(
            line(requested),
            "pause requested (lunch): the running turn may take 300 s more"
        );
        let paused =
            json!({"type": "paused", "reason": "lunch", "forced": true, "trigger": "timeout"});
        assert_eq!(line(paused), "paused by timeout: lunch (the running turn was cancelled)");
        assert_eq!(line(json!({"type": "paused", "forced": false})), "paused by pause");
        let taken = json!({"type": "snapshot_taken", "snapshot_id": "s-1", "trigger": "pause"});
        assert_eq!(line(taken), "snapshot s-1 taken (pause)");
        assert_eq!(
            line(json!({"type": "resumed", "outcome": "native_load"})),
            "resumed: native_load"
        );
        let budget = json!({"type": "budget_warning", "budget": {"scope": "session", "id": "s",
            "budget": {"tokens": 1000}, "used_tokens": 800, "used_cost": 0.0, "percent": 80}});
        assert!(line(budget).starts_with("budget warning: the session's budget"), "budget");
        let mine = json!({"type": "turn_started", "turn_id": "t-1", "prompt": "fix it"});
        assert_eq!(line(mine), "turn t-1 started: fix it");
        let asked = json!({"type": "turn_started", "turn_id": "t-2", "prompt": "The session is being paused.",
            "origin": "pause_summary"});
        assert_eq!(
            line(asked),
            "turn t-2 started: Tether asks the agent for its summary before pausing"
        );
        let newer = line(json!({"type": "something_new", "x": 1}));
        assert!(newer.contains("does not know"), "{newer}");
    }

    /// `follow` showed a tool call only under its first title, often a placeholder: an
    /// update that names it says the new name.
    #[test]
    fn follow_shows_the_name_a_tool_update_gives() {
        let update = |update| json!({"type": "tool_call_update", "update": update});
        let named = update(json!({"toolCallId": "c", "title": "Edit a.txt", "status": "pending"}));
        assert_eq!(line(named), "tool update: Edit a.txt: pending");
        assert_eq!(line(update(json!({"toolCallId": "c"}))), "tool update: -");
    }
}
