//! The planner, pattern by pattern, against rows kept in memory: each step's session is
//! simulated (started, completed with a chosen output, interrupted, failed to launch) and
//! the plan's writes are applied as the store applies them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::*;
use crate::workflow::spec::parse;

struct Sim {
    spec: Spec,
    workflow: WorkflowRow,
    steps: Vec<StepRow>,
    sessions: BTreeMap<crate::ids::SessionId, SessionFacts>,
    now: i64,
    /// Every prompt sent, by row: (step, prompt).
    sent: Vec<(String, String)>,
    /// The task's budget is used up: why.
    over_budget: Option<String>,
}

fn row(step_id: &str, position: i64) -> StepRow {
    StepRow {
        step_id: step_id.into(),
        position,
        state: StepState::Pending,
        iteration: 0,
        runs: 0,
        resends: 0,
        launch_failures: 0,
        approved: false,
        applied: false,
        session_id: None,
        prompt: None,
        output: None,
        error: None,
        started_at: None,
        ended_at: None,
        usage: None,
    }
}

fn running_session() -> SessionFacts {
    SessionFacts {
        state: SessionState::Running,
        live: true,
        turn_running: true,
        last_turn: None,
        prompt_delivered: true,
        error: None,
        prompt_refused: None,
    }
}

/// A session brought up that refused its first prompt (it waits, agent running).
fn refused_session(reason: &str, lasting: bool) -> SessionFacts {
    SessionFacts {
        state: SessionState::WaitingForInput,
        live: true,
        turn_running: false,
        last_turn: None,
        prompt_delivered: false,
        error: None,
        prompt_refused: Some(PromptRefusal { reason: reason.into(), lasting }),
    }
}

impl Sim {
    fn new(text: &str) -> Sim {
        let spec =
            parse(text, Path::new("/w/f.toml"), &BTreeMap::new(), &|_| true, &|_| Ok(())).unwrap();
        let steps = spec.steps.iter().enumerate().map(|(i, s)| row(&s.id, i as i64)).collect();
        let workflow = WorkflowRow {
            id: "w".into(),
            task_id: "t".into(),
            name: spec.name.clone(),
            spec_file: None,
            spec_text: text.into(),
            spec_sha256: String::new(),
            vars: BTreeMap::new(),
            workspace: None,
            state: WorkflowState::Running,
            error: None,
            resumes: 0,
            event_seq: 0,
            created_at: 0,
            updated_at: 0,
        };
        Sim {
            spec,
            workflow,
            steps,
            sessions: BTreeMap::new(),
            now: 1000,
            sent: Vec::new(),
            over_budget: None,
        }
    }

    fn plan(&self) -> Plan {
        plan(&Input {
            spec: &self.spec,
            workflow: &self.workflow,
            steps: &self.steps,
            sessions: &self.sessions,
            busy: &BTreeSet::new(),
            task: ("Title", "Description"),
            over_budget: self.over_budget.as_deref(),
            now: self.now,
        })
    }

    fn row(&mut self, id: &str) -> &mut StepRow {
        self.steps.iter_mut().find(|row| row.step_id == id).unwrap()
    }

    fn state(&self, id: &str) -> StepState {
        self.steps.iter().find(|row| row.step_id == id).unwrap().state
    }

    /// Applies a plan as the engine would; the sessions started are running their turn.
    fn apply(&mut self, plan: Plan) -> Vec<Action> {
        for action in &plan.actions {
            match action {
                Action::Start { step_id, prompt } => {
                    let session = format!("s-{step_id}-{}", self.sent.len());
                    let now = self.now;
                    let row = self.row(step_id.as_str());
                    assert_eq!(row.state, StepState::Pending);
                    row.state = StepState::Running;
                    row.runs += 1;
                    row.session_id = Some(session.clone().into());
                    row.prompt = Some(prompt.clone());
                    row.output = None;
                    row.started_at = Some(now);
                    self.sessions.insert(session.into(), running_session());
                    self.sent.push((step_id.to_string(), prompt.clone()));
                }
                Action::Write { patches, state } => {
                    for patch in patches {
                        self.patch(patch);
                    }
                    if let Some((state, error)) = state {
                        self.workflow.state = *state;
                        self.workflow.error = error.clone();
                    }
                }
                Action::Continue { step_id, session_id, resend, patch } => {
                    if let Some(patch) = patch {
                        self.patch(patch);
                    }
                    let facts = self.sessions.get_mut(session_id).unwrap();
                    facts.live = true;
                    facts.state = SessionState::Running;
                    facts.turn_running = true;
                    facts.prompt_delivered = true;
                    if let Some(prompt) = resend {
                        self.sent.push((step_id.to_string(), prompt.clone()));
                    } else {
                        let prompt = self.row(step_id.as_str()).prompt.clone().unwrap();
                        self.sent.push((step_id.to_string(), prompt));
                    }
                }
                Action::CancelTurn { session_id } | Action::Stop { session_id, .. } => {
                    let facts = self.sessions.get_mut(session_id).unwrap();
                    facts.turn_running = false;
                    facts.live = false;
                    if matches!(action, Action::Stop { .. }) {
                        facts.state = SessionState::Completed;
                    }
                }
            }
        }
        plan.actions
    }

    fn patch(&mut self, patch: &StepPatch) {
        assert!(!patch.step_id.as_str().is_empty(), "a patch names its step: {patch:?}");
        if patch.remove {
            let row = self.row(patch.step_id.as_str());
            assert_eq!(Some(row.state), patch.expect, "{}", patch.step_id);
            self.steps.retain(|row| row.step_id != patch.step_id);
            return;
        }
        if let Some(position) = patch.insert_at {
            let mut new = row(patch.step_id.as_str(), position);
            new.iteration = patch.iteration.unwrap_or(0);
            self.steps.push(new);
            self.steps.sort_by(|a, b| (a.position, &a.step_id).cmp(&(b.position, &b.step_id)));
            return;
        }
        let row = self.row(patch.step_id.as_str());
        if let Some(expected) = patch.expect {
            assert_eq!(row.state, expected, "{}", patch.step_id);
        }
        if let Some(state) = patch.state {
            row.state = state;
        }
        if let Some(iteration) = patch.iteration {
            row.iteration = iteration;
        }
        if let Some(approved) = patch.approved {
            row.approved = approved;
        }
        if let Some(applied) = patch.applied {
            row.applied = applied;
        }
        if let Some(error) = &patch.error {
            row.error = error.clone();
        }
        if let Some(output) = &patch.output {
            row.output = Some(output.clone());
        }
        row.resends += u32::from(patch.resent);
        row.launch_failures += u32::from(patch.launch_failed);
        if patch.clear_run {
            row.applied = false;
        }
    }

    /// The step's turn completes with `output` (the store does this with the turn's end).
    fn complete(&mut self, id: &str, output: &str) {
        let row = self.row(id);
        assert_eq!(row.state, StepState::Running, "{id}");
        row.state = StepState::Completed;
        row.output = Some(output.into());
        row.applied = false;
        let session = row.session_id.clone().unwrap();
        let facts = self.sessions.get_mut(&session).unwrap();
        facts.turn_running = false;
        facts.state = SessionState::WaitingForInput;
        facts.last_turn = Some(TurnFacts {
            state: TurnState::Completed,
            stop_reason: Some("end_turn".into()),
            error: None,
            delivered: true,
            execution_over: false,
        });
    }

    /// Plans and applies until nothing is left to do.
    fn settle(&mut self) {
        for _ in 0..50 {
            let plan = self.plan();
            if self.apply(plan).is_empty() {
                return;
            }
        }
        panic!("the plan never settles: {:?}", self.steps);
    }

    fn running(&self) -> Vec<String> {
        let ids = self.steps.iter().filter(|row| row.state == StepState::Running);
        ids.filter(|row| row.session_id.is_some()).map(|row| row.step_id.to_string()).collect()
    }
}

const CHAIN: &str = r#"name = "chain"
[[steps]]
id = "plan"
agent = "mock"
prompt = "Plan {{task.title}}"
[[steps]]
id = "build"
agent = "mock"
depends_on = ["plan"]
prompt = "Build: {{steps.plan.output}}"
[[steps]]
id = "review"
agent = "mock"
depends_on = ["build"]
prompt = "Review: {{steps.build.output}}"
"#;

#[test]
fn a_chain_runs_step_by_step_each_prompt_carrying_the_output_before() {
    let mut sim = Sim::new(CHAIN);
    sim.settle();
    assert_eq!(sim.running(), ["plan"]);
    sim.complete("plan", "P1");
    sim.settle();
    assert_eq!(sim.running(), ["build"]);
    // The completed step's session is stopped.
    assert_eq!(sim.sessions["s-plan-0"].state, SessionState::Completed);
    sim.complete("build", "B1");
    sim.settle();
    sim.complete("review", "ok");
    sim.settle();
    assert_eq!(sim.workflow.state, WorkflowState::Completed);
    let prompts: Vec<&str> = sim.sent.iter().map(|(_, p)| p.as_str()).collect();
    assert_eq!(prompts, ["Plan Title", "Build: P1", "Review: B1"]);
}

#[test]
fn a_dag_runs_ready_steps_together_within_max_parallel_then_reduces() {
    let text = r#"name = "fan"
max_parallel = 2
[[steps]]
id = "a"
agent = "mock"
prompt = "a"
[[steps]]
id = "b"
agent = "mock"
prompt = "b"
[[steps]]
id = "c"
agent = "mock"
prompt = "c"
[[steps]]
id = "reduce"
agent = "mock"
depends_on = ["a", "b", "c"]
prompt = "{{steps.a.output}}+{{steps.b.output}}+{{steps.c.output}}"
"#;
    let mut sim = Sim::new(text);
    sim.settle();
    assert_eq!(sim.running(), ["a", "b"]);
    sim.complete("b", "B");
    sim.settle();
    assert_eq!(sim.running(), ["a", "c"]);
    sim.complete("a", "A");
    sim.complete("c", "C");
    sim.settle();
    assert_eq!(sim.running(), ["reduce"]);
    assert_eq!(sim.sent.last().unwrap().1, "A+B+C");
}

#[test]
fn a_loop_goes_back_until_the_marker_then_goes_on() {
    let text = r#"name = "loop"
[[steps]]
id = "build"
agent = "mock"
prompt = "Build. Feedback: {{steps.review.output}}"
[[steps]]
id = "review"
agent = "mock"
depends_on = ["build"]
prompt = "Review {{steps.build.output}}"
loop = { back_to = "build", until = "APPROVED", max_iterations = 3 }
[[steps]]
id = "ship"
agent = "mock"
depends_on = ["review"]
prompt = "Ship"
"#;
    let mut sim = Sim::new(text);
    sim.settle();
    sim.complete("build", "v1");
    sim.settle();
    sim.complete("review", "fix the tests");
    sim.settle();
    // Back to build, pass 2, with the review's words.
    assert_eq!(sim.running(), ["build"]);
    assert_eq!(sim.steps[0].iteration, 1);
    assert_eq!(sim.sent.last().unwrap().1, "Build. Feedback: fix the tests");
    sim.complete("build", "v2");
    sim.settle();
    assert_eq!(sim.sent.last().unwrap().1, "Review v2");
    sim.complete("review", "APPROVED");
    sim.settle();
    assert_eq!(sim.running(), ["ship"]);
    assert_eq!(sim.steps[0].runs, 2);
    assert_eq!(sim.steps[1].runs, 2);
}

#[test]
fn a_loop_that_never_passes_fails_after_max_iterations() {
    let text = r#"name = "loop"
[[steps]]
id = "score"
agent = "mock"
prompt = "Rate it"
loop = { back_to = "score", until_score = 8, max_iterations = 2 }
"#;
    let mut sim = Sim::new(text);
    sim.settle();
    sim.complete("score", "5/10");
    sim.settle();
    assert_eq!(sim.running(), ["score"]);
    sim.complete("score", "6/10");
    sim.settle();
    assert_eq!(sim.workflow.state, WorkflowState::Failed);
    assert_eq!(sim.state("score"), StepState::Failed);
    assert!(
        sim.workflow.error.as_deref().unwrap().contains("after 2 passes"),
        "{:?}",
        sim.workflow.error
    );
}

#[test]
fn a_route_runs_the_chosen_step_and_skips_the_others_and_what_only_they_lead_to() {
    let text = r#"name = "route"
[[steps]]
id = "triage"
agent = "mock"
prompt = "bug or feature?"
routes = { bug = "fix", feature = "design" }
[[steps]]
id = "fix"
agent = "mock"
depends_on = ["triage"]
prompt = "fix"
[[steps]]
id = "design"
agent = "mock"
depends_on = ["triage"]
prompt = "design"
[[steps]]
id = "spec"
agent = "mock"
depends_on = ["design"]
prompt = "spec"
[[steps]]
id = "summary"
agent = "mock"
depends_on = ["fix", "spec"]
prompt = "summary: {{steps.fix.output}}{{steps.spec.output}}"
"#;
    let mut sim = Sim::new(text);
    sim.settle();
    sim.complete("triage", "It is a BUG.");
    sim.settle();
    assert_eq!(sim.running(), ["fix"]);
    assert_eq!(sim.state("design"), StepState::Skipped);
    assert_eq!(sim.state("spec"), StepState::Skipped);
    sim.complete("fix", "fixed");
    sim.settle();
    assert_eq!(sim.sent.last().unwrap().1, "summary: fixed");
    sim.complete("summary", "done");
    sim.settle();
    assert_eq!(sim.workflow.state, WorkflowState::Completed);

    let mut sim = Sim::new(text);
    sim.settle();
    sim.complete("triage", "no idea");
    sim.settle();
    assert_eq!(sim.workflow.state, WorkflowState::Failed);
    assert!(sim.workflow.error.as_deref().unwrap().contains("none of its routes (bug, feature)"));
}

const WORKERS: &str = r#"name = "workers"
[[steps]]
id = "split"
agent = "mock"
prompt = "split"
[[steps]]
id = "work"
agent = "mock"
for_each = "split"
prompt = "do {{item}}"
[[steps]]
id = "merge"
agent = "mock"
depends_on = ["work"]
prompt = "merge {{steps.work.output}}"
"#;

#[test]
fn an_orchestrator_s_list_becomes_workers_then_a_reduce() {
    let mut sim = Sim::new(WORKERS);
    sim.settle();
    sim.complete("split", "Here:\n```json\n[\"lexer\", \"parser\", {\"x\": 1}]\n```");
    sim.settle();
    assert_eq!(sim.running(), ["work[0]", "work[1]", "work[2]"]);
    assert_eq!(sim.state("work"), StepState::Running);
    let prompts: Vec<&str> = sim.sent[1..].iter().map(|(_, p)| p.as_str()).collect();
    assert_eq!(prompts, ["do lexer", "do parser", "do {\"x\":1}"]);
    sim.complete("work[1]", "P");
    sim.complete("work[0]", "L");
    sim.settle();
    assert!(sim.running().is_empty() || sim.running() == ["work[2]"]);
    sim.complete("work[2]", "X");
    sim.settle();
    assert_eq!(sim.state("work"), StepState::Completed);
    assert_eq!(sim.sent.last().unwrap().1, r#"merge ["L","P","X"]"#);

    let mut sim = Sim::new(WORKERS);
    sim.settle();
    sim.complete("split", "[]");
    sim.settle();
    assert_eq!(sim.running(), ["merge"]);

    let mut sim = Sim::new(WORKERS);
    sim.settle();
    sim.complete("split", "lexer, parser");
    sim.settle();
    assert_eq!(sim.workflow.state, WorkflowState::Failed);
    assert!(sim.workflow.error.as_deref().unwrap().contains("not a JSON list"));
}

#[test]
fn an_approval_step_waits_until_approved() {
    let text = CHAIN.replace("id = \"build\"\n", "id = \"build\"\napproval = true\n");
    let mut sim = Sim::new(&text);
    sim.settle();
    sim.complete("plan", "P");
    sim.settle();
    assert_eq!(sim.state("build"), StepState::WaitingApproval);
    assert!(sim.running().is_empty());
    // Approving (what workflow.approve writes).
    let build = sim.row("build");
    build.state = StepState::Pending;
    build.approved = true;
    sim.settle();
    assert_eq!(sim.running(), ["build"]);
}

#[test]
fn an_interrupted_turn_is_sent_again_once_and_a_turn_never_delivered_too() {
    let mut sim = Sim::new(CHAIN);
    sim.settle();
    let interrupted = TurnFacts {
        state: TurnState::Interrupted,
        stop_reason: None,
        error: Some("the agent died".into()),
        delivered: true,
        execution_over: true,
    };
    let facts = sim.sessions.get_mut("s-plan-0").unwrap();
    facts.turn_running = false;
    facts.live = false;
    facts.state = SessionState::WaitingForInput;
    facts.last_turn = Some(interrupted.clone());
    // One action: the resend (the engine marks the step busy until it lands).
    let plan = sim.plan();
    assert_eq!(plan.actions.len(), 1);
    sim.apply(plan);
    assert_eq!(sim.sent.len(), 2);
    assert_eq!(sim.steps[0].resends, 1);
    // The resend's turn runs: nothing more is sent.
    sim.settle();
    assert_eq!(sim.sent.len(), 2);
    // Interrupted again and again: the step fails after MAX_RESENDS.
    for _ in 0..MAX_RESENDS {
        let facts = sim.sessions.get_mut("s-plan-0").unwrap();
        facts.turn_running = false;
        facts.last_turn = Some(interrupted.clone());
        sim.settle();
    }
    assert_eq!(sim.state("plan"), StepState::Failed);
    assert_eq!(sim.workflow.state, WorkflowState::Failed);

    // A turn whose prompt never reached the agent is sent again, and so is one cut by its
    // agent's death; one the agent answered with an error is not.
    for (delivered, execution_over, resent) in
        [(false, false, true), (true, true, true), (true, false, false)]
    {
        let mut sim = Sim::new(CHAIN);
        sim.settle();
        let facts = sim.sessions.get_mut("s-plan-0").unwrap();
        facts.turn_running = false;
        facts.last_turn = Some(TurnFacts {
            state: TurnState::Failed,
            stop_reason: None,
            error: None,
            delivered,
            execution_over,
        });
        sim.settle();
        assert_eq!(sim.sent.len() == 2, resent);
        assert_eq!(sim.state("plan") == StepState::Failed, !resent);
    }
}

#[test]
fn a_failed_launch_is_retried_as_many_times_as_the_step_says() {
    let text =
        CHAIN.replacen("prompt = \"Plan {{task.title}}\"", "prompt = \"Plan\"\nretries = 1", 1);
    let mut sim = Sim::new(&text);
    sim.settle();
    let failed = |sim: &mut Sim| {
        let facts = sim.sessions.get_mut("s-plan-0").unwrap();
        *facts = SessionFacts {
            state: SessionState::Failed,
            live: false,
            turn_running: false,
            last_turn: None,
            prompt_delivered: false,
            error: Some("exited at once".into()),
            prompt_refused: None,
        };
    };
    failed(&mut sim);
    sim.settle();
    assert_eq!(sim.steps[0].launch_failures, 1);
    assert_eq!(sim.state("plan"), StepState::Running);
    failed(&mut sim);
    sim.settle();
    assert_eq!(sim.state("plan"), StepState::Failed);
    assert!(sim.workflow.error.as_deref().unwrap().contains("could not launch: exited at once"));
}

#[test]
fn a_step_over_its_timeout_is_cancelled_and_fails() {
    let text = CHAIN.replacen(
        "prompt = \"Plan {{task.title}}\"",
        "prompt = \"Plan\"\ntimeout_ms = 500",
        1,
    );
    let mut sim = Sim::new(&text);
    sim.settle();
    assert_eq!(sim.plan().deadline, Some(1500));
    sim.now = 1500;
    let actions = sim.apply(sim.plan());
    assert!(matches!(actions[0], Action::CancelTurn { .. }), "{actions:?}");
    assert_eq!(sim.state("plan"), StepState::Failed);
    assert!(sim.workflow.error.as_deref().unwrap().contains("timed out after 500 ms"));
}

#[test]
fn a_step_whose_session_was_stopped_fails_and_a_failed_workflow_starts_nothing() {
    let mut sim = Sim::new(CHAIN);
    sim.settle();
    sim.sessions.get_mut("s-plan-0").unwrap().state = SessionState::Completed;
    sim.settle();
    assert_eq!(sim.state("plan"), StepState::Failed);
    assert_eq!(sim.state("build"), StepState::Pending);
    assert_eq!(sim.workflow.state, WorkflowState::Failed);
}

#[test]
fn no_step_starts_or_is_prompted_again_over_the_task_budget() {
    let mut sim = Sim::new(CHAIN);
    sim.settle();
    sim.complete("plan", "P");
    sim.over_budget = Some("its task's budget is 120% used".into());
    sim.settle();
    // build does not start: it fails, saying why, and the workflow with it.
    assert_eq!(sim.sent.len(), 1);
    assert_eq!((sim.state("build"), sim.row("build").runs), (StepState::Failed, 0));
    assert_eq!(
        sim.workflow.error.as_deref(),
        Some("step build: not started: its task's budget is 120% used")
    );
    assert_eq!(sim.state("review"), StepState::Pending);

    // A running step whose turn was cut is not sent its prompt again.
    let mut sim = Sim::new(CHAIN);
    sim.settle();
    let facts = sim.sessions.get_mut("s-plan-0").unwrap();
    facts.turn_running = false;
    facts.live = false;
    facts.last_turn = Some(TurnFacts {
        state: TurnState::Interrupted,
        stop_reason: None,
        error: None,
        delivered: true,
        execution_over: true,
    });
    sim.over_budget = Some("over".into());
    sim.settle();
    assert_eq!(sim.sent.len(), 1);
    assert_eq!(sim.state("plan"), StepState::Failed);
    assert_eq!(sim.workflow.error.as_deref(), Some("step plan: its prompt cannot be sent: over"));
}

#[test]
fn a_loop_going_back_keeps_the_previous_pass_s_session_until_it_is_stopped() {
    let text = r#"name = "loop"
[[steps]]
id = "build"
agent = "mock"
prompt = "Build"
[[steps]]
id = "review"
agent = "mock"
depends_on = ["build"]
prompt = "Review {{steps.build.output}}"
loop = { back_to = "review", until = "APPROVED", max_iterations = 3 }
"#;
    let mut sim = Sim::new(text);
    sim.settle();
    sim.complete("build", "v1");
    sim.settle();
    sim.complete("review", "fix it");
    // The pass that goes back also stops the finished session; killed after its write,
    // the stop was never carried out.
    let plan = sim.plan();
    assert!(plan.actions.iter().any(|a| matches!(a, Action::Stop { .. })), "{:?}", plan.actions);
    let written: Vec<Action> =
        plan.actions.into_iter().filter(|a| matches!(a, Action::Write { .. })).collect();
    sim.apply(Plan { actions: written, deadline: None });
    assert_eq!(sim.state("review"), StepState::Pending);
    // The write kept the session recorded: the next driver stops it before the step runs
    // again, and starts it only once it is stopped.
    assert_eq!(sim.row("review").session_id.as_deref(), Some("s-review-1"));
    let next = sim.plan();
    assert!(
        matches!(&next.actions[..], [Action::Stop { session_id, .. }] if session_id == "s-review-1"),
        "{:?}",
        next.actions
    );
    sim.apply(next);
    assert_eq!(sim.sessions["s-review-1"].state, SessionState::Completed);
    sim.settle();
    assert_eq!(sim.running(), ["review"]);
    assert_eq!(sim.row("review").session_id.as_deref(), Some("s-review-2"));
}

#[test]
fn a_step_whose_prompt_would_be_too_long_to_send_fails_unstarted() {
    // Longer than a prompt may be, once the output before it is filled in (three times).
    let text = CHAIN.replace(
        "prompt = \"Build: {{steps.plan.output}}\"",
        "prompt = \"{{steps.plan.output}}{{steps.plan.output}}{{steps.plan.output}}\"",
    );
    let mut sim = Sim::new(&text);
    sim.settle();
    sim.complete("plan", &"p".repeat(3 << 20));
    sim.settle();
    assert_eq!(sim.sent.len(), 1);
    assert_eq!((sim.state("build"), sim.row("build").runs), (StepState::Failed, 0));
    let error = sim.workflow.error.clone().unwrap_or_default();
    assert!(error.starts_with("step build: not started: its prompt is 9437184 bytes"), "{error}");

    // Short enough as text, too long once escaped as JSON for the agent's line.
    let mut sim = Sim::new(CHAIN);
    sim.settle();
    sim.complete("plan", &"\u{1}".repeat(3 << 20));
    sim.settle();
    assert_eq!(sim.state("build"), StepState::Failed);
    let error = sim.workflow.error.clone().unwrap_or_default();
    assert!(error.contains("as a JSON-RPC line, over the agent's"), "{error}");
}

#[test]
fn a_list_longer_than_the_workers_a_step_may_have_fails_its_source() {
    let mut sim = Sim::new(WORKERS);
    sim.settle();
    let list: Vec<String> =
        (0..=crate::workflow::spec::MAX_WORKERS).map(|n| format!("{n}")).collect();
    sim.complete("split", &serde_json::to_string(&list).unwrap());
    sim.settle();
    assert!(sim.running().is_empty(), "no worker starts: {:?}", sim.running());
    assert_eq!(sim.workflow.state, WorkflowState::Failed);
    let error = sim.workflow.error.clone().unwrap_or_default();
    assert!(error.contains("lists 101 items; step work runs at most 100 workers"), "{error}");

    // As many as it may have: all of them, max_parallel at a time.
    let mut sim = Sim::new(WORKERS);
    sim.settle();
    let list: Vec<String> =
        (0..crate::workflow::spec::MAX_WORKERS).map(|n| format!("{n}")).collect();
    sim.complete("split", &serde_json::to_string(&list).unwrap());
    sim.settle();
    assert_eq!(sim.running().len(), crate::workflow::spec::DEFAULT_MAX_PARALLEL);
}

/// The events a plan's writes publish.
fn events(plan: &Plan) -> Vec<WorkflowEventKind> {
    let patches = plan.actions.iter().flat_map(|action| match action {
        Action::Write { patches, .. } => patches.clone(),
        _ => Vec::new(),
    });
    patches.filter_map(|patch| patch.event).collect()
}

#[test]
fn a_step_a_resume_dropped_goes_once_its_session_is_stopped() {
    let text = r#"name = "two"
[[steps]]
id = "build"
agent = "mock"
prompt = "Build"
[[steps]]
id = "lint"
agent = "mock"
prompt = "Lint"
"#;
    let paused = SessionFacts {
        state: SessionState::Paused,
        live: false,
        turn_running: false,
        ..running_session()
    };
    for lint_session in [running_session(), paused] {
        let mut sim = Sim::new(text);
        sim.settle();
        sim.complete("build", "B");
        sim.settle();
        // The workflow failed while lint's session was live (its turn running, or paused),
        // and was resumed with a file without lint: the resume's write kept lint's row,
        // cancelled and still naming that session.
        sim.spec = parse(
            &text[..text.find("[[steps]]\nid = \"lint\"").unwrap()],
            Path::new("/w/f.toml"),
            &BTreeMap::new(),
            &|_| true,
            &|_| Ok(()),
        )
        .unwrap();
        sim.row("lint").state = StepState::Cancelled;
        *sim.sessions.get_mut("s-lint-1").unwrap() = lint_session;
        // Its session is stopped; the row stays (the workflow is not over) until it is.
        let plan = sim.plan();
        assert!(
            matches!(&plan.actions[..], [Action::Stop { step_id, session_id }]
                if step_id == "lint" && session_id == "s-lint-1"),
            "{:?}",
            plan.actions
        );
        sim.apply(plan);
        assert_eq!(sim.sessions["s-lint-1"].state, SessionState::Completed);
        // Stopped: the row goes, saying so, and the workflow completes.
        let plan = sim.plan();
        assert_eq!(
            events(&plan),
            [WorkflowEventKind::StepReset {
                step_id: "lint".into(),
                state: StepState::Cancelled,
                reason: "removed from the workflow file; its session s-lint-1 was stopped".into(),
            }]
        );
        sim.apply(plan);
        sim.settle();
        let ids: Vec<&str> = sim.steps.iter().map(|row| row.step_id.as_str()).collect();
        assert_eq!(ids, ["build"]);
        assert_eq!(sim.workflow.state, WorkflowState::Completed);
    }
}

#[test]
fn a_step_whose_session_refused_its_prompt_runs_again_then_fails() {
    let text =
        CHAIN.replacen("prompt = \"Plan {{task.title}}\"", "prompt = \"Plan\"\nretries = 1", 1);
    let settings = "the agent did not take the session's settings again (model = big)";
    let mut sim = Sim::new(&text);
    sim.settle();
    *sim.sessions.get_mut("s-plan-0").unwrap() = refused_session(settings, false);
    // A retry is left: the step runs again in a new session, once the refusing one is
    // stopped; the new session has none of the old one's settings.
    let plan = sim.plan();
    assert_eq!(
        events(&plan),
        [WorkflowEventKind::StepReset {
            step_id: "plan".into(),
            state: StepState::Pending,
            reason: format!(
                "its prompt was refused: {settings}; it runs again in a new session (retry 1 of 1)"
            ),
        }]
    );
    sim.settle();
    assert_eq!(sim.sessions["s-plan-0"].state, SessionState::Completed);
    assert_eq!(sim.running(), ["plan"]);
    let plan_row = sim.row("plan").clone();
    assert_eq!(plan_row.session_id.as_deref(), Some("s-plan-1"));
    assert_eq!((plan_row.runs, plan_row.launch_failures), (2, 1));
    // Refused again, with no retry left: the step fails, saying why, and the workflow
    // with it; its session is stopped.
    *sim.sessions.get_mut("s-plan-1").unwrap() = refused_session(settings, false);
    sim.settle();
    assert_eq!(sim.state("plan"), StepState::Failed);
    assert_eq!(sim.sessions["s-plan-1"].state, SessionState::Completed);
    assert_eq!(
        sim.workflow.error.as_deref(),
        Some(format!("step plan: its prompt was refused: {settings}").as_str())
    );
    assert_eq!(sim.sent.len(), 2);

    // A prompt too long for the agent's line is refused anywhere: no retry is spent on it.
    let mut sim = Sim::new(&text);
    sim.settle();
    *sim.sessions.get_mut("s-plan-0").unwrap() = refused_session("too long", true);
    sim.settle();
    assert_eq!((sim.state("plan"), sim.row("plan").runs), (StepState::Failed, 1));

    // A refusal a turn came after (the prompt went out after all) is history.
    let mut sim = Sim::new(&text);
    sim.settle();
    sim.sessions.get_mut("s-plan-0").unwrap().prompt_refused =
        Some(PromptRefusal { reason: settings.into(), lasting: false });
    assert!(sim.plan().actions.is_empty());
}
