//! What a workflow does next, decided from what is stored: its spec, its rows, and what
//! each running step's session is doing. Pure — no I/O — so every pattern (chain, DAG,
//! fan-out, loop, route, workers) and every failure is decided the same way on the first
//! pass and after a restart, and is tested without processes.
//!
//! The engine (`service::workflows`) reads, plans, carries the actions out, and plans again
//! when the store announces a change. Every decision is a conditional write (a
//! [`StepPatch`] expects the step's state), so a decision made on a stale read changes
//! nothing.

use crate::ids::SessionId;
use std::collections::{BTreeMap, BTreeSet};

use protocol::api::{SessionState, StepState, TurnState, WorkflowEventKind, WorkflowState};

use super::spec::{MAX_PROMPT, MAX_WORKERS, Spec, Step, Values};
use crate::ids::StepId;
use crate::session::MAX_PROMPT_LINE;
use crate::store::{PromptRefusal, StepPatch, StepRow, WorkflowRow};

/// The most times a step's prompt is sent again after its turns were interrupted (its
/// agent died mid-turn), before the step fails: an agent that dies on every prompt must
/// not be fed it forever.
pub const MAX_RESENDS: u32 = 3;

/// What a running step's session is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionFacts {
    /// Its stored state.
    pub state: SessionState,
    /// An actor runs it and its agent runs or is being brought up.
    pub live: bool,
    /// A turn of it is running.
    pub turn_running: bool,
    /// Its newest turn, once one ended and none runs.
    pub last_turn: Option<TurnFacts>,
    /// Some prompt of it reached the agent (else its first prompt, the step's, is still
    /// to be sent by the session itself).
    pub prompt_delivered: bool,
    /// Its error (a failed launch says why).
    pub error: Option<String>,
    /// Its first prompt (the step's) was refused before it reached the agent: the session
    /// will not send it, so the step ends (or runs again in a new session).
    pub prompt_refused: Option<PromptRefusal>,
}

impl SessionFacts {
    /// Why its first prompt was refused, while no prompt of it went out since.
    fn refused(&self) -> Option<&PromptRefusal> {
        self.prompt_refused.as_ref().filter(|_| !self.prompt_delivered && !self.turn_running)
    }
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnFacts {
    /// Its state.
    pub state: TurnState,
    /// The agent's stop reason.
    pub stop_reason: Option<String>,
    /// Its error.
    pub error: Option<String>,
    /// Its prompt reached the agent.
    pub delivered: bool,
    /// The execution it ran on is over (its agent or sidecar died, or was stopped).
    pub execution_over: bool,
}

/// One thing to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create the step's session with this prompt (it starts the step in the same write).
    Start {
        /// The row (`ID` or a worker's `ID[N]`).
        step_id: StepId,
        /// Its prompt, rendered.
        prompt: String,
    },
    /// Conditional writes, then (if given) the workflow's state.
    Write {
        /// The step changes.
        patches: Vec<StepPatch>,
        /// The workflow's new state.
        state: Option<(WorkflowState, Option<String>)>,
    },
    /// Bring the step's session on: resume it (it sends its first prompt itself) or, when
    /// `resend` is given, send that prompt again (resuming first when needed). `patch`
    /// (counting the resend or the failed launch), when there is one, is written first.
    Continue {
        /// The row.
        step_id: StepId,
        /// Its session.
        session_id: SessionId,
        /// The prompt to send again.
        resend: Option<String>,
        /// Written before.
        patch: Option<StepPatch>,
    },
    /// Cancel the running turn (a timeout).
    CancelTurn {
        /// The session.
        session_id: SessionId,
    },
    /// End a step's session (its step is over; its agent is not needed any more).
    Stop {
        /// The row.
        step_id: StepId,
        /// The session.
        session_id: SessionId,
    },
}

/// What the planner sees.
pub struct Input<'a> {
    /// The spec the workflow runs.
    pub spec: &'a Spec,
    /// The workflow.
    pub workflow: &'a WorkflowRow,
    /// Its steps.
    pub steps: &'a [StepRow],
    /// The sessions of its steps, by session id.
    pub sessions: &'a BTreeMap<crate::ids::SessionId, SessionFacts>,
    /// Steps with an action still in flight (left alone this pass).
    pub busy: &'a BTreeSet<StepId>,
    /// The task's title and description.
    pub task: (&'a str, &'a str),
    /// Why the task may spend no more, when its budget is used up (what `budget_exceeded`
    /// says): no step starts and no step's prompt is sent (again); such a step fails with
    /// it, and the workflow with the step, resumable once the budget is raised.
    pub over_budget: Option<&'a str>,
    /// Unix ms.
    pub now: i64,
}

/// The plan: actions, and when to look again at the latest (a timeout).
#[derive(Debug, Default)]
pub struct Plan {
    /// What to do, in order.
    pub actions: Vec<Action>,
    /// Unix ms of the next timeout, if a step has one.
    pub deadline: Option<i64>,
}

/// The template a row runs, read from the text of its id: `work[2]` runs `work`.
pub fn base_id(text: &str) -> &str {
    text.split_once('[').map_or(text, |(base, _)| base)
}

/// A worker's index, read from the text of its id: `work[2]` → 2.
fn worker_index(text: &str) -> Option<usize> {
    text.split_once('[')?.1.strip_suffix(']')?.parse().ok()
}

/// The items of a `for_each` source's output: a JSON list, alone or among other text
/// (from its first `[` to its last `]`). A string item is itself; another is its JSON.
pub fn items(output: &str) -> Result<Vec<String>, String> {
    let list = serde_json::from_str::<Vec<serde_json::Value>>(output.trim()).or_else(|_| {
        let (start, end) = (output.find('['), output.rfind(']'));
        match (start, end) {
            (Some(start), Some(end)) if start < end => {
                serde_json::from_str::<Vec<serde_json::Value>>(&output[start..=end])
            }
            _ => serde_json::from_str::<Vec<serde_json::Value>>("not a list"),
        }
    });
    let list = list.map_err(|err| format!("its output is not a JSON list ({err})"))?;
    Ok(list
        .into_iter()
        .map(|item| match item {
            serde_json::Value::String(text) => text,
            other => other.to_string(),
        })
        .collect())
}

struct Rendering<'a> {
    task: (&'a str, &'a str),
    outputs: BTreeMap<&'a str, &'a str>,
    item: Option<String>,
}

impl Values for Rendering<'_> {
    fn task_title(&self) -> &str {
        self.task.0
    }
    fn task_description(&self) -> &str {
        self.task.1
    }
    fn step_output(&self, step: &str) -> Option<&str> {
        self.outputs.get(step).copied()
    }
    fn item(&self) -> Option<&str> {
        self.item.as_deref()
    }
}

/// The step's session is to be brought on (`Continue`), unless the task's budget is used
/// up: then the step fails, saying so.
fn bring_on(input: &Input<'_>, step_id: &StepId, action: Action) -> Action {
    match input.over_budget {
        Some(reason) => fail_step(step_id, format!("its prompt cannot be sent: {reason}")),
        None => action,
    }
}

/// A step fails with `error`, and the workflow with it.
pub fn fail_step(step_id: &StepId, error: String) -> Action {
    fail_with(StepPatch::new(step_id.clone()), error)
}

/// `patch`'s step fails with `error` (with whatever else `patch` writes), and the
/// workflow with it.
pub fn fail_with(patch: StepPatch, error: String) -> Action {
    let step_id = patch.step_id.clone();
    let failed = StepPatch {
        state: Some(StepState::Failed),
        error: Some(Some(error.clone())),
        ended: true,
        event: Some(WorkflowEventKind::StepFailed {
            step_id: step_id.to_string(),
            error: error.clone(),
        }),
        ..patch
    };
    let workflow = (WorkflowState::Failed, Some(format!("step {step_id}: {error}")));
    Action::Write { patches: vec![failed], state: Some(workflow) }
}

/// Decides what to do next.
pub fn plan(input: &Input<'_>) -> Plan {
    let mut plan = Plan::default();
    let Input { workflow, steps, busy, .. } = *input;
    let running_workflow = workflow.state == WorkflowState::Running;
    let by_id: BTreeMap<&str, &StepRow> =
        steps.iter().map(|row| (row.step_id.as_str(), row)).collect();

    stop_finished(input, &mut plan.actions);
    drop_removed_rows(input, &mut plan.actions);

    // Running steps: each session watched until its turn ends.
    for row in steps.iter().filter(|row| row.state == StepState::Running) {
        if busy.contains(&row.step_id) {
            continue;
        }
        watch_running(input, row, running_workflow, &mut plan);
    }
    if !running_workflow {
        return plan;
    }

    // What a completed step leads to: a loop back, a route, workers.
    if let Some(action) = next_effect(input, &by_id) {
        plan.actions.push(action);
        // One decision per pass: the next is made on what this one wrote.
        return plan;
    }

    // Workers done: their template completes with their outputs, as a JSON list.
    if let Some(action) = workers_done(steps) {
        plan.actions.push(action);
        return plan;
    }

    start_ready(input, &by_id, &mut plan.actions);
    if plan.actions.is_empty() && !steps.is_empty() && steps.iter().all(|row| row.state.is_done()) {
        plan.actions.push(Action::Write {
            patches: Vec::new(),
            state: Some((WorkflowState::Completed, None)),
        });
    }
    plan
}

/// The spec's step a row runs (a worker's row runs its template).
fn spec_step<'a>(spec: &'a Spec, row: &StepRow) -> Option<&'a Step> {
    spec.steps.iter().find(|step| step.id == base_id(row.step_id.as_str()))
}

/// Stops the sessions whose step is over: their agents are not needed.
fn stop_finished(input: &Input<'_>, actions: &mut Vec<Action>) {
    for row in input.steps {
        if row.state == StepState::Running || input.busy.contains(&row.step_id) {
            continue;
        }
        if let Some(session) = &row.session_id
            && input.sessions.get(session).is_some_and(|facts| !facts.state.is_terminal())
        {
            actions
                .push(Action::Stop { step_id: row.step_id.clone(), session_id: session.clone() });
        }
    }
}

/// Drops the rows of steps the file no longer has (a resume accepted their removal), once
/// their sessions are stopped.
fn drop_removed_rows(input: &Input<'_>, actions: &mut Vec<Action>) {
    let removed = input.steps.iter().filter(|row| spec_step(input.spec, row).is_none());
    for row in removed.filter(|row| !input.busy.contains(&row.step_id)) {
        if let Some(action) = drop_removed(row, input.sessions) {
            actions.push(action);
        }
    }
}

/// Watches a running step's session until its turn ends: times the step out, fails it,
/// or brings its session on.
fn watch_running(input: &Input<'_>, row: &StepRow, running_workflow: bool, plan: &mut Plan) {
    let Some(session_id) = &row.session_id else { return };
    let Some(facts) = input.sessions.get(session_id) else { return };
    let step = spec_step(input.spec, row);
    if let (Some(timeout), Some(started)) = (step.and_then(|s| s.timeout_ms), row.started_at) {
        let deadline = started.saturating_add(timeout as i64);
        if input.now >= deadline {
            if facts.turn_running {
                plan.actions.push(Action::CancelTurn { session_id: session_id.clone() });
            }
            plan.actions.push(fail_step(&row.step_id, format!("timed out after {timeout} ms")));
            return;
        }
        plan.deadline = Some(plan.deadline.map_or(deadline, |d| d.min(deadline)));
    }
    if facts.state.is_terminal() {
        let error = format!(
            "its session {session_id} was ended ({}) before the step completed",
            facts.state.as_str()
        );
        plan.actions.push(fail_step(&row.step_id, error));
        return;
    }
    let refused = facts.refused();
    if refused.is_none()
        && (facts.turn_running || (facts.live && facts.state != SessionState::Failed))
    {
        // A turn runs, or the session is being brought up (it sends the first prompt).
        if facts.turn_running || !facts.prompt_delivered || facts.last_turn.is_none() {
            return;
        }
    }
    if !running_workflow {
        // The workflow failed or was cancelled: nothing more is started for it.
        plan.actions.push(workflow_stopped(row));
        return;
    }
    let retries = step.map_or(0, |step| step.retries);
    if let Some(refusal) = refused {
        plan.actions.push(after_refusal(row, refusal, retries));
        return;
    }
    if facts.state == SessionState::Failed && !facts.live {
        // Its last launch failed.
        plan.actions.push(after_failed_launch(input, row, session_id, facts, retries));
        return;
    }
    if !facts.prompt_delivered {
        if !facts.live {
            // Never launched, or its launch was cut short: a resume launches it and
            // the session sends its first prompt, once.
            let action = Action::Continue {
                step_id: row.step_id.clone(),
                session_id: session_id.clone(),
                resend: None,
                patch: None,
            };
            plan.actions.push(bring_on(input, &row.step_id, action));
        }
        return;
    }
    let Some(turn) = &facts.last_turn else { return };
    if let Some(action) = after_turn(input, row, session_id, turn) {
        plan.actions.push(action);
    }
}

/// A running step of a workflow that stopped (failed or cancelled) fails: nothing more is
/// started for it.
fn workflow_stopped(row: &StepRow) -> Action {
    let error = "the workflow stopped before this step's turn completed".to_owned();
    Action::Write {
        patches: vec![StepPatch {
            expect: Some(StepState::Running),
            state: Some(StepState::Failed),
            error: Some(Some(error.clone())),
            ended: true,
            event: Some(WorkflowEventKind::StepFailed { step_id: row.step_id.to_string(), error }),
            ..StepPatch::new(row.step_id.clone())
        }],
        state: None,
    }
}

/// A running step whose session's last launch failed: it is launched again while its
/// `retries` allow, else it fails.
fn after_failed_launch(
    input: &Input<'_>,
    row: &StepRow,
    session_id: &SessionId,
    facts: &SessionFacts,
    retries: u32,
) -> Action {
    let error = facts.error.clone().unwrap_or_else(|| "its launch failed".into());
    if row.launch_failures >= retries {
        return fail_step(&row.step_id, format!("its session could not launch: {error}"));
    }
    let resend = facts.prompt_delivered.then(|| row.prompt.clone()).flatten();
    let action = Action::Continue {
        step_id: row.step_id.clone(),
        session_id: session_id.clone(),
        resend,
        patch: Some(StepPatch {
            expect: Some(StepState::Running),
            launch_failed: true,
            ..StepPatch::new(row.step_id.clone())
        }),
    };
    bring_on(input, &row.step_id, action)
}

/// What follows a running step's ended turn: its prompt sent again (an interrupted turn),
/// the step failed, or nothing (the turn completed it, or it still runs).
fn after_turn(
    input: &Input<'_>,
    row: &StepRow,
    session_id: &SessionId,
    turn: &TurnFacts,
) -> Option<Action> {
    let again = match turn.state {
        // Its agent died mid-turn: the prompt goes again, once per interruption.
        TurnState::Interrupted => true,
        // Never reached the agent: sending it again is sending it once. Or cut by its
        // agent's death (not answered with an error): as interrupted.
        TurnState::Failed if !turn.delivered || turn.execution_over => true,
        TurnState::Failed => {
            let error = turn.error.clone().unwrap_or_else(|| "the agent failed the turn".into());
            return Some(fail_step(&row.step_id, format!("its turn failed: {error}")));
        }
        // Completed: the same write completed the step (a read of both at once
        // cannot see one without the other).
        TurnState::Completed if turn.stop_reason.as_deref().is_none_or(|r| r == "end_turn") => {
            return None;
        }
        TurnState::Completed => {
            let reason = turn.stop_reason.clone().unwrap_or_default();
            return Some(fail_step(
                &row.step_id,
                format!("its turn ended with stop reason {reason}"),
            ));
        }
        TurnState::Running => false,
    };
    if !again {
        return None;
    }
    if row.resends >= MAX_RESENDS {
        return Some(fail_step(
            &row.step_id,
            format!("its turn was interrupted {} times", row.resends + 1),
        ));
    }
    let action = Action::Continue {
        step_id: row.step_id.clone(),
        session_id: session_id.clone(),
        resend: row.prompt.clone(),
        patch: Some(StepPatch {
            expect: Some(StepState::Running),
            resent: true,
            ..StepPatch::new(row.step_id.clone())
        }),
    };
    Some(bring_on(input, &row.step_id, action))
}

/// What the first completed step not yet applied leads to (a loop back, a route,
/// workers), if anything.
fn next_effect(input: &Input<'_>, by_id: &BTreeMap<&str, &StepRow>) -> Option<Action> {
    input.steps.iter().filter(|row| row.state == StepState::Completed && !row.applied).find_map(
        |row| {
            let step = spec_step(input.spec, row)?;
            effects(input.spec, step, row, by_id)
        },
    )
}

/// The first template whose workers all completed completes, with their outputs as a
/// JSON list.
fn workers_done(steps: &[StepRow]) -> Option<Action> {
    for row in
        steps.iter().filter(|row| row.state == StepState::Running && row.session_id.is_none())
    {
        let prefix = format!("{}[", row.step_id);
        let mut workers: Vec<&StepRow> =
            steps.iter().filter(|w| w.step_id.as_str().starts_with(&prefix)).collect();
        workers.sort_by_key(|w| worker_index(w.step_id.as_str()));
        if workers.iter().all(|w| w.state == StepState::Completed) {
            let outputs: Vec<&str> =
                workers.iter().map(|w| w.output.as_deref().unwrap_or("")).collect();
            let output = serde_json::to_string(&outputs).unwrap_or_else(|_| "[]".into());
            return Some(Action::Write {
                patches: vec![StepPatch {
                    expect: Some(StepState::Running),
                    state: Some(StepState::Completed),
                    output: Some(output.clone()),
                    applied: Some(true),
                    ended: true,
                    event: Some(WorkflowEventKind::StepCompleted {
                        step_id: row.step_id.to_string(),
                        output,
                    }),
                    ..StepPatch::new(row.step_id.clone())
                }],
                state: None,
            });
        }
    }
    None
}

/// Starts the steps whose dependencies are done (or has them wait for their approval),
/// within `max_parallel`; a step whose every dependency was skipped is skipped.
fn start_ready(input: &Input<'_>, by_id: &BTreeMap<&str, &StepRow>, actions: &mut Vec<Action>) {
    let Input { spec, steps, sessions, .. } = *input;
    let mut running = steps
        .iter()
        .filter(|row| row.state == StepState::Running && row.session_id.is_some())
        .count();
    let mut writes = Vec::new();
    for row in steps.iter().filter(|row| row.state == StepState::Pending) {
        let Some(step) = spec_step(spec, row) else { continue };
        let worker = row.step_id.as_str().contains('[');
        if step.for_each.is_some() && !worker {
            // Its workers are made when its source completes.
            continue;
        }
        let dependencies: Vec<Option<&&StepRow>> =
            step.depends_on.iter().map(|dep| by_id.get(dep.as_str())).collect();
        if !dependencies.iter().all(|dep| dep.is_some_and(|dep| dep.state.is_done())) {
            continue;
        }
        if !dependencies.is_empty()
            && dependencies.iter().all(|dep| dep.is_some_and(|dep| dep.state == StepState::Skipped))
        {
            writes.push(skip(&row.step_id, "every step it depends on was skipped".into()));
            continue;
        }
        if step.approval && !row.approved {
            writes.push(StepPatch {
                expect: Some(StepState::Pending),
                state: Some(StepState::WaitingApproval),
                event: Some(WorkflowEventKind::StepWaitingApproval {
                    step_id: row.step_id.to_string(),
                }),
                ..StepPatch::new(row.step_id.clone())
            });
            continue;
        }
        if running >= spec.max_parallel {
            continue;
        }
        if row.session_id.as_ref().is_some_and(|session| {
            sessions.get(session).is_some_and(|facts| !facts.state.is_terminal())
        }) {
            // Its previous run's session (a loop pass, a resumed step) is stopped first:
            // the start replaces the record of it.
            continue;
        }
        if let Some(reason) = input.over_budget {
            // Nothing more is spent: the step fails unstarted (the workflow with it; the
            // other steps ready to start stay pending).
            actions.push(not_started(&row.step_id, reason));
            break;
        }
        match render(input, step, row, by_id) {
            Ok(prompt) => {
                running += 1;
                actions.push(Action::Start { step_id: row.step_id.clone(), prompt });
            }
            Err(reason) => {
                // A prompt that cannot be sent: the step fails rather than wait for it.
                actions.push(not_started(&row.step_id, &reason));
                break;
            }
        }
    }
    if !writes.is_empty() {
        actions.push(Action::Write { patches: writes, state: None });
    }
}

/// A running step whose session refused its first prompt: it runs again, in a new session
/// (the planner stops this one first), while its `retries` allow and the refusal is about
/// the session, not the prompt; else it fails, saying why.
fn after_refusal(row: &StepRow, refusal: &PromptRefusal, retries: u32) -> Action {
    let error = format!("its prompt was refused: {}", refusal.reason);
    if refusal.lasting || row.launch_failures >= retries {
        return fail_step(&row.step_id, error);
    }
    let reason = format!(
        "{error}; it runs again in a new session (retry {} of {retries})",
        row.launch_failures + 1
    );
    Action::Write {
        patches: vec![StepPatch {
            expect: Some(StepState::Running),
            state: Some(StepState::Pending),
            launch_failed: true,
            clear_run: true,
            event: Some(WorkflowEventKind::StepReset {
                step_id: row.step_id.to_string(),
                state: StepState::Pending,
                reason,
            }),
            ..StepPatch::new(row.step_id.clone())
        }],
        state: None,
    }
}

/// The row of a step the file no longer has goes once its session (if any) has ended;
/// `None` while it has not (it is being stopped).
fn drop_removed(
    row: &StepRow,
    sessions: &BTreeMap<crate::ids::SessionId, SessionFacts>,
) -> Option<Action> {
    let session = row.session_id.as_ref();
    let ended =
        |id: &crate::ids::SessionId| sessions.get(id).is_none_or(|facts| facts.state.is_terminal());
    if !session.is_none_or(ended) {
        return None;
    }
    let reason = match session {
        Some(session) => {
            format!("removed from the workflow file; its session {session} was stopped")
        }
        None => "removed from the workflow file".to_owned(),
    };
    Some(Action::Write {
        patches: vec![StepPatch {
            expect: Some(row.state),
            remove: true,
            event: Some(WorkflowEventKind::StepReset {
                step_id: row.step_id.to_string(),
                state: StepState::Cancelled,
                reason,
            }),
            ..StepPatch::new(row.step_id.clone())
        }],
        state: None,
    })
}

/// A pending step fails before it starts (`reason`: why it may not).
pub fn not_started(step_id: &StepId, reason: &str) -> Action {
    let error = format!("not started: {reason}");
    Action::Write {
        patches: vec![StepPatch {
            expect: Some(StepState::Pending),
            state: Some(StepState::Failed),
            error: Some(Some(error.clone())),
            ended: true,
            event: Some(WorkflowEventKind::StepFailed {
                step_id: step_id.to_string(),
                error: error.clone(),
            }),
            ..StepPatch::new(step_id.clone())
        }],
        state: Some((WorkflowState::Failed, Some(format!("step {step_id}: {error}")))),
    }
}

fn skip(step_id: &StepId, reason: String) -> StepPatch {
    StepPatch {
        expect: Some(StepState::Pending),
        state: Some(StepState::Skipped),
        ended: true,
        event: Some(WorkflowEventKind::StepReset {
            step_id: step_id.to_string(),
            state: StepState::Skipped,
            reason,
        }),
        ..StepPatch::new(step_id.clone())
    }
}

/// Room for what goes around a prompt in its `session/prompt` line (request and session
/// ids, the JSON around the text).
const PROMPT_LINE_OVERHEAD: usize = 4096;

/// A row's prompt, its references filled from the rows; or why it cannot be sent: longer
/// than a prompt may be, or than the agent's line once escaped as JSON (the session would
/// be refused its first prompt and the step never end).
fn render(
    input: &Input<'_>,
    step: &Step,
    row: &StepRow,
    by_id: &BTreeMap<&str, &StepRow>,
) -> Result<String, String> {
    let outputs = by_id
        .iter()
        .filter_map(|(id, row)| row.output.as_deref().map(|output| (*id, output)))
        .collect();
    let item = match (&step.for_each, worker_index(row.step_id.as_str())) {
        (Some(source), Some(index)) => by_id
            .get(source.as_str())
            .and_then(|source| source.output.as_deref())
            .and_then(|output| items(output).ok())
            .and_then(|items| items.get(index).cloned()),
        _ => None,
    };
    let values = Rendering { task: input.task, outputs, item };
    let len = step.prompt.filled_len(&input.spec.vars, &values);
    if len > MAX_PROMPT {
        return Err(format!(
            "its prompt is {len} bytes once filled in, over the {MAX_PROMPT} bytes (8 MiB) a prompt may be"
        ));
    }
    let prompt = step.prompt.render(&input.spec.vars, &values);
    let line = serde_json::to_string(&prompt)
        .map_or(usize::MAX, |escaped| escaped.len().saturating_add(PROMPT_LINE_OVERHEAD));
    if line > MAX_PROMPT_LINE {
        return Err(format!(
            "its prompt is {line} bytes as a JSON-RPC line, over the agent's {MAX_PROMPT_LINE}-byte line limit"
        ));
    }
    Ok(prompt)
}

/// What a completed step leads to, if anything is left to do.
fn effects(
    spec: &Spec,
    step: &Step,
    row: &StepRow,
    by_id: &BTreeMap<&str, &StepRow>,
) -> Option<Action> {
    let output = row.output.as_deref().unwrap_or("");
    let mut patches = Vec::new();
    let applied = StepPatch {
        expect: Some(StepState::Completed),
        applied: Some(true),
        ..StepPatch::new(row.step_id.clone())
    };
    if let Some(repeat) = &step.repeat
        && !repeat.passes(output)
    {
        let wanted = match (&repeat.until, repeat.until_score) {
            (Some(marker), _) => format!("{marker:?} is not in its output"),
            (None, Some(score)) => format!("its output scores under {score}"),
            (None, None) => "its output did not pass".into(),
        };
        let pass = row.iteration + 1;
        if pass >= repeat.max_iterations {
            let error = format!(
                "{wanted} after {} passes of its loop (max_iterations)",
                repeat.max_iterations
            );
            return Some(fail_step(&row.step_id, error));
        }
        let body = super::spec::loop_body(&spec.steps, &repeat.back_to, &step.id);
        for id in body {
            let Some(member) = by_id.get(id) else { continue };
            patches.push(StepPatch {
                expect: Some(member.state),
                state: Some(StepState::Pending),
                iteration: Some(pass),
                approved: Some(false),
                clear_run: true,
                event: Some(WorkflowEventKind::StepReset {
                    step_id: member.step_id.to_string(),
                    state: StepState::Pending,
                    reason: format!(
                        "loop pass {} of {}: {} {wanted}",
                        pass + 1,
                        repeat.max_iterations,
                        step.id
                    ),
                }),
                ..StepPatch::new(member.step_id.clone())
            });
        }
        return Some(Action::Write { patches, state: None });
    }
    if !step.routes.is_empty() {
        let Some((marker, chosen)) = step.route(output) else {
            let markers: Vec<&str> =
                step.routes.iter().map(|(marker, _)| marker.as_str()).collect();
            return Some(fail_step(
                &row.step_id,
                format!("its output names none of its routes ({})", markers.join(", ")),
            ));
        };
        for (_, target) in &step.routes {
            if target != chosen
                && by_id.get(target.as_str()).is_some_and(|t| t.state == StepState::Pending)
            {
                patches.push(skip(
                    &target.as_str().into(),
                    format!("{} chose route {marker:?} ({chosen})", step.id),
                ));
            }
        }
    }
    for worker in spec.steps.iter().filter(|other| other.for_each.as_deref() == Some(&step.id)) {
        let list = match items(output) {
            Ok(list) if list.len() > MAX_WORKERS => {
                return Some(fail_step(
                    &row.step_id,
                    format!(
                        "its output lists {} items; step {} runs at most {MAX_WORKERS} workers",
                        list.len(),
                        worker.id
                    ),
                ));
            }
            Ok(list) => list,
            Err(err) => {
                return Some(fail_step(
                    &row.step_id,
                    format!("{err}; step {} needs one", worker.id),
                ));
            }
        };
        let Some(template) = by_id.get(worker.id.as_str()) else { continue };
        for index in 0..list.len() {
            patches.push(StepPatch {
                insert_at: Some(template.position),
                iteration: Some(template.iteration),
                ..StepPatch::new(format!("{}[{index}]", worker.id).into())
            });
        }
        let empty = list.is_empty();
        patches.push(StepPatch {
            expect: Some(StepState::Pending),
            state: Some(if empty { StepState::Completed } else { StepState::Running }),
            output: empty.then(|| "[]".to_owned()),
            applied: Some(true),
            event: Some(if empty {
                WorkflowEventKind::StepCompleted { step_id: worker.id.clone(), output: "[]".into() }
            } else {
                WorkflowEventKind::StepReset {
                    step_id: worker.id.clone(),
                    state: StepState::Running,
                    reason: format!("{} workers from {}'s list", list.len(), step.id),
                }
            }),
            ..StepPatch::new(worker.id.as_str().into())
        });
    }
    if patches.is_empty() {
        // Nothing follows from it (a plain step, a loop that passed, a route already
        // taken): nothing to write.
        return None;
    }
    patches.push(applied);
    Some(Action::Write { patches, state: None })
}

#[cfg(test)]
mod tests;
