//! Durable workflows, end to end: real daemons, real mock agents, real SQLite.
//!
//! The kill matrix: for each pattern, the daemon is SIGKILLed at each named fault point
//! (the step boundaries: planned, recorded, started, a turn's end, a decision written, a
//! finished step's session being stopped) and in the middle of a step's turn, then started
//! again. Every step's prompt must have reached its agent exactly once — counted from the
//! agents' side (`mock-agent --turn-log`), not from Tether's records — outputs must have
//! flowed into the prompts after them, and the workflow must complete.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use jsonrpsee::core::client::Subscription;
use protocol::api::{
    ApiClient, StepState, WorkflowEvent, WorkflowEventKind, WorkflowState, WorkflowStatus,
};
use tether_tests::daemon::{Api, Daemon, call};
use tether_tests::within;

/// A profile whose agent logs each prompt it starts to answer to `log`.
pub(crate) fn profile(log: &Path) -> String {
    format!(
        "id = \"flow\"\ncommand = [\"mock-agent\", \"--turn-log\", \"{}\"]\nprotocol = \"acp\"\n",
        log.display()
    )
}

/// The prompts the agents started to answer, with how many times each.
pub(crate) fn turns(log: &Path) -> BTreeMap<String, usize> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        let entry: serde_json::Value = serde_json::from_str(line).expect("a turn-log line");
        *counts.entry(entry["prompt"].as_str().unwrap().to_owned()).or_insert(0) += 1;
    }
    counts
}

/// A daemon with the `flow` profile, its agents logging to `root/turns.jsonl`, and a
/// workspace; armed with `fault` (`TETHER_FAULT`) when given.
pub(crate) async fn daemon(fault: Option<&str>) -> (Daemon, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap().keep();
    let log = dir.join("turns.jsonl");
    let env: Vec<(&str, &str)> = fault.map(|f| ("TETHER_FAULT", f)).into_iter().collect();
    let daemon = Daemon::start_with_env(&[], &[("flow.toml", &profile(&log))], &env).await;
    let workspace = daemon.workspace("ws");
    (daemon, log, workspace)
}

pub(crate) async fn subscribe(api: &Api, id: &str, after: u64) -> Subscription<WorkflowEvent> {
    call("workflow.subscribe", api.typed().workflow_subscribe(id.to_owned(), Some(after)))
        .await
        .expect("workflow.subscribe")
}

/// Follows a workflow's events until it is over; its last state.
pub(crate) async fn until_over(
    events: &mut Subscription<WorkflowEvent>,
) -> (WorkflowState, Vec<WorkflowEvent>) {
    let mut seen = Vec::new();
    loop {
        let event = within("a workflow event", events.next())
            .await
            .expect("the stream stays open")
            .expect("a workflow event");
        seen.push(event.clone());
        if let WorkflowEventKind::WorkflowState { state, .. } = event.kind
            && state.is_over()
        {
            return (state, seen);
        }
    }
}

pub(crate) async fn status(api: &Api, id: &str) -> WorkflowStatus {
    call("workflow.status", api.typed().workflow_status(id.to_owned())).await.expect("status")
}

/// Follows a workflow to its end; `None` when the daemon went away first.
async fn follow_or_gone(api: &Api, id: &str) -> Option<(WorkflowState, Vec<WorkflowEvent>)> {
    let mut events = api.typed().workflow_subscribe(id.to_owned(), Some(0)).await.ok()?;
    let mut seen = Vec::new();
    while let Some(Ok(event)) = events.next().await {
        seen.push(event.clone());
        if let WorkflowEventKind::WorkflowState { state, .. } = event.kind
            && state.is_over()
        {
            return Some((state, seen));
        }
    }
    None
}

/// Runs `spec` on a daemon armed with `fault`: if the daemon dies there it is started
/// again, disarmed, and the workflow followed to its end. Returns the final status, the
/// agents' turn log and whether the daemon was killed.
async fn run_through(
    spec: &str,
    fault: Option<&str>,
) -> (WorkflowStatus, BTreeMap<String, usize>, bool) {
    let (mut daemon, log, workspace) = daemon(fault).await;
    let api = daemon.api().await;
    // The start is acknowledged once stored; the daemon may die before or after it answers.
    let started = api
        .typed()
        .workflow_start(
            spec.to_owned(),
            Some("/flows/test.toml".into()),
            None,
            None,
            Some(workspace.display().to_string()),
        )
        .await
        .ok()
        .map(|started| started.workflow_id);
    let finished = match &started {
        Some(id) => tokio::select! {
            finished = follow_or_gone(&api, id) => finished,
            _ = daemon.wait_exit() => None,
        },
        None => None,
    };
    drop(api);
    let died = match finished {
        Some((state, seen)) => {
            assert_eq!(state, WorkflowState::Completed, "{fault:?}: {seen:#?}");
            // Still armed, the daemon may reach its point after the completion it just
            // published (the workflow's end is a decision written before its point): it is
            // restarted disarmed before it is asked anything more.
            let died = daemon.has_exited();
            if fault.is_some() {
                daemon.kill().await;
                daemon.restart_with_env(&[]).await;
            }
            died
        }
        None => {
            within("the daemon to die at its fault point", daemon.wait_exit()).await;
            daemon.restart_with_env(&[]).await;
            true
        }
    };
    let api = daemon.api().await;
    let id = match started {
        Some(id) => id,
        None => {
            let list = call("workflow.list", api.typed().workflow_list()).await.expect("list");
            assert_eq!(list.len(), 1, "{fault:?}: the workflow was stored before the kill");
            list[0].workflow_id.clone()
        }
    };
    let api = daemon.api().await;
    let (state, seen) = api.workflow_end(&id).await;
    let status = status(&api, &id).await;
    assert_eq!(state, WorkflowState::Completed, "{fault:?}: {:?}\n{seen:#?}", status.error);
    // Every finished step's session is stopped (its agent is not left running).
    for step in &status.steps {
        if let Some(session) = &step.session_id {
            let mut session_events = api.subscribe(session, 0).await;
            let stopped = tether_tests::daemon::until(&mut session_events, |event| {
                tether_tests::daemon::is_state(event, protocol::api::SessionState::Completed)
            });
            within("a finished step's session to be stopped", stopped).await;
        }
    }
    (status, turns(&log), died)
}

/// Waits until the `nth` step of workflow `id` to start is in the middle of its turn (its
/// tool call seen: its prompt must carry `/tool`); its session.
pub(crate) async fn mid_turn(api: &Api, id: &str, nth: usize) -> String {
    let mut events = subscribe(api, id, 0).await;
    let starts = std::cell::Cell::new(0);
    let seen = until_event(&mut events, |kind| {
        if matches!(kind, WorkflowEventKind::StepStarted { .. }) {
            starts.set(starts.get() + 1);
        }
        starts.get() == nth
    })
    .await;
    let session = seen
        .iter()
        .rev()
        .find_map(|event| match &event.kind {
            WorkflowEventKind::StepStarted { session_id, .. } => Some(session_id.clone()),
            _ => None,
        })
        .expect("a step started");
    let mut turn = api.subscribe(&session, 0).await;
    tether_tests::daemon::until(&mut turn, |event| {
        matches!(event.kind, protocol::api::EventKind::ToolCall { .. })
    })
    .await;
    session
}

/// Runs `spec` with every step slowed (a tool call, then 100 ms before its answer) and
/// SIGKILLs the daemon while the `nth` step to start is mid-turn (its tool call seen), then
/// starts it again and follows the workflow to its end.
async fn killed_mid_step(spec: &str, nth: usize) -> (WorkflowStatus, BTreeMap<String, usize>) {
    let slow = spec.replace("\\n/say ", "\\n/tool\\n/sleep 100\\n/say ");
    assert_ne!(slow, spec, "every step answers with /say");
    let (mut daemon, log, workspace) = daemon(None).await;
    let api = daemon.api().await;
    let started = api.start_workflow(slow, &workspace).await;
    let id = started.workflow_id;
    mid_turn(&api, &id, nth).await;
    drop(api);
    daemon.kill().await;
    daemon.restart().await;
    let api = daemon.api().await;
    let (state, seen) = api.workflow_end(&id).await;
    assert_eq!(state, WorkflowState::Completed, "killed in step start {nth}: {seen:#?}");
    (status(&api, &id).await, turns(&log))
}

/// Runs `spec` through every fault point (each at its first few hits) and a kill in the
/// middle of its first and its third step to start, and checks each run with `check`.
async fn matrix(
    spec: &str,
    points: &[&str],
    check: impl Fn(&WorkflowStatus, &BTreeMap<String, usize>),
) {
    let (status, log, _) = run_through(spec, None).await;
    check(&status, &log);
    for nth in [1, 3] {
        let (status, log) = killed_mid_step(spec, nth).await;
        check(&status, &log);
    }
    let mut died = 0;
    for point in points {
        let (status, log, killed) = run_through(spec, Some(point)).await;
        died += usize::from(killed);
        check(&status, &log);
    }
    // The points are reached: most runs were killed somewhere.
    assert!(died * 2 > points.len(), "only {died} of {} runs were killed", points.len());
}

const POINTS: &[&str] = &[
    "workflow.planned@1",
    "workflow.planned@2",
    "workflow.planned@4",
    "create.recorded@1",
    "create.recorded@2",
    "workflow.step_started@1",
    "workflow.step_started@2",
    "prompt.recorded@2",
    "turn.recorded@1",
    "turn.recorded@2",
    "workflow.advanced@1",
    "workflow.advanced@2",
    "workflow.stopping@1",
];

pub(crate) fn once(log: &BTreeMap<String, usize>, wanted: &[&str]) {
    let expected: BTreeMap<String, usize> = wanted.iter().map(|p| ((*p).to_owned(), 1)).collect();
    assert_eq!(log, &expected, "each step's prompt reached its agent exactly once");
}

pub(crate) fn output<'a>(status: &'a WorkflowStatus, step: &str) -> &'a str {
    let step = status.steps.iter().find(|s| s.id == step).expect("the step");
    assert_eq!(step.state, StepState::Completed, "{}", step.id);
    step.output.as_deref().unwrap_or("")
}

pub(crate) const CHAIN: &str = r#"name = "chain"
[vars]
goal = "commas"

[[steps]]
id = "plan"
agent = "flow"
prompt = "plan {{vars.goal}}\n/say P-{{vars.goal}}"

[[steps]]
id = "build"
agent = "flow"
depends_on = ["plan"]
prompt = "build {{steps.plan.output}}\n/say B-{{steps.plan.output}}"

[[steps]]
id = "review"
agent = "flow"
depends_on = ["build"]
prompt = "review {{steps.build.output}}\n/say R-{{steps.build.output}}"
"#;

#[tokio::test]
async fn a_chain_survives_a_kill_at_every_step_boundary() {
    matrix(CHAIN, POINTS, |status, log| {
        once(log, &["plan commas", "build P-commas", "review B-P-commas"]);
        assert_eq!(output(status, "review"), "R-B-P-commas");
        assert!(status.steps.iter().all(|step| step.runs == 1), "{:?}", status.steps);
    })
    .await;
}

const DAG: &str = r#"name = "fan-out"
max_parallel = 2

[[steps]]
id = "a"
agent = "flow"
prompt = "a\n/say A"

[[steps]]
id = "b"
agent = "flow"
prompt = "b\n/say B"

[[steps]]
id = "c"
agent = "flow"
prompt = "c\n/say C"

[[steps]]
id = "reduce"
agent = "flow"
depends_on = ["a", "b", "c"]
prompt = "reduce {{steps.a.output}}{{steps.b.output}}{{steps.c.output}}\n/say ABC"
"#;

#[tokio::test]
async fn fan_out_and_reduce_survive_a_kill_at_every_step_boundary() {
    matrix(DAG, POINTS, |status, log| {
        once(log, &["a", "b", "c", "reduce ABC"]);
        assert_eq!(output(status, "reduce"), "ABC");
    })
    .await;
}

/// The review passes on its second pass: its first output is `verdict built[]`, the build
/// then gets it as feedback, and the second review's output holds `[verdict`.
const LOOP: &str = r#"name = "loop"

[[steps]]
id = "build"
agent = "flow"
prompt = "build {{steps.review.output}}\n/say built[{{steps.review.output}}]"

[[steps]]
id = "review"
agent = "flow"
depends_on = ["build"]
prompt = "review {{steps.build.output}}\n/say verdict {{steps.build.output}}"
loop = { back_to = "build", until = "[verdict", max_iterations = 3 }

[[steps]]
id = "ship"
agent = "flow"
depends_on = ["review"]
prompt = "ship\n/say shipped"
"#;

#[tokio::test]
async fn a_loop_survives_a_kill_at_every_step_boundary() {
    matrix(LOOP, POINTS, |status, log| {
        once(
            log,
            &[
                "build ",
                "review built[]",
                "build verdict built[]",
                "review built[verdict built[]]",
                "ship",
            ],
        );
        assert_eq!(output(status, "review"), "verdict built[verdict built[]]");
        let review = status.steps.iter().find(|s| s.id == "review").unwrap();
        assert_eq!((review.runs, review.iteration), (2, 1));
    })
    .await;
}

const ROUTE: &str = r#"name = "route"

[[steps]]
id = "triage"
agent = "flow"
prompt = "triage\n/say this is a bug"
routes = { bug = "fix", feature = "design" }

[[steps]]
id = "fix"
agent = "flow"
depends_on = ["triage"]
prompt = "fix\n/say fixed"

[[steps]]
id = "design"
agent = "flow"
depends_on = ["triage"]
prompt = "design\n/say designed"

[[steps]]
id = "summary"
agent = "flow"
depends_on = ["fix", "design"]
prompt = "summary {{steps.fix.output}}{{steps.design.output}}\n/say done"
"#;

#[tokio::test]
async fn a_route_survives_a_kill_at_every_step_boundary() {
    matrix(ROUTE, POINTS, |status, log| {
        once(log, &["triage", "fix", "summary fixed"]);
        let design = status.steps.iter().find(|s| s.id == "design").unwrap();
        assert_eq!((design.state, design.runs), (StepState::Skipped, 0));
    })
    .await;
}

const WORKERS: &str = r#"name = "workers"

[[steps]]
id = "split"
agent = "flow"
prompt = "split\n/say [\"x\", \"y\", \"z\"]"

[[steps]]
id = "work"
agent = "flow"
for_each = "split"
prompt = "work {{item}}\n/say done-{{item}}"

[[steps]]
id = "merge"
agent = "flow"
depends_on = ["work"]
prompt = "merge {{steps.work.output}}\n/say merged"
"#;

#[tokio::test]
async fn orchestrator_workers_survive_a_kill_at_every_step_boundary() {
    matrix(WORKERS, POINTS, |status, log| {
        once(
            log,
            &["split", "work x", "work y", "work z", r#"merge ["done-x","done-y","done-z"]"#],
        );
        let ids: Vec<&str> = status.steps.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["split", "work", "work[0]", "work[1]", "work[2]", "merge"]);
    })
    .await;
}

/// Waits for the first workflow event `pred` accepts; the events up to it.
pub(crate) async fn until_event(
    events: &mut Subscription<WorkflowEvent>,
    pred: impl Fn(&WorkflowEventKind) -> bool,
) -> Vec<WorkflowEvent> {
    let mut seen = Vec::new();
    loop {
        let event = within("a workflow event", events.next())
            .await
            .expect("the stream stays open")
            .expect("a workflow event");
        let done = pred(&event.kind);
        seen.push(event);
        if done {
            return seen;
        }
    }
}

pub(crate) fn started_session(seen: &[WorkflowEvent], step: &str) -> String {
    seen.iter()
        .find_map(|event| match &event.kind {
            WorkflowEventKind::StepStarted { step_id, session_id, .. } if step_id == step => {
                Some(session_id.clone())
            }
            _ => None,
        })
        .expect("the step started")
}

pub(crate) const SLOW: &str = r#"name = "slow"

[[steps]]
id = "a"
agent = "flow"
prompt = "a\n/tool\n/sleep 300\n/say A"

[[steps]]
id = "b"
agent = "flow"
depends_on = ["a"]
prompt = "b {{steps.a.output}}\n/say B"
"#;

/// Killed in the middle of a step's turn (its agent is working), the daemon comes back,
/// re-attaches the step's session, and the turn's end completes the step: its prompt went
/// once, and the next step got its output.
#[tokio::test]
async fn a_kill_in_the_middle_of_a_step_loses_and_repeats_nothing() {
    let (mut daemon, log, workspace) = daemon(None).await;
    let api = daemon.api().await;
    let started = api.start_workflow(SLOW, &workspace).await;
    let id = started.workflow_id;
    mid_turn(&api, &id, 1).await;
    drop(api);
    daemon.kill().await;
    daemon.restart().await;
    let api = daemon.api().await;
    let (state, seen) = api.workflow_end(&id).await;
    assert_eq!(state, WorkflowState::Completed, "{seen:#?}");
    once(&turns(&log), &["a", "b A"]);
    let status = status(&api, &id).await;
    assert_eq!(output(&status, "b"), "B");
    assert!(status.steps.iter().all(|step| step.runs == 1));
}

/// Killed right after a loop goes back (its write recorded, the stop of the previous
/// pass's review session not yet carried out), the daemon comes back and stops that
/// session before the review runs again: its agentctl (and agent) is gone, not left
/// holding the workspace until it is parked.
#[tokio::test]
async fn a_kill_right_after_a_loop_goes_back_leaves_no_session_of_the_previous_pass() {
    let (mut daemon, log, workspace) = daemon(Some("workflow.advanced@1")).await;
    let api = daemon.api().await;
    let started = api.start_workflow(LOOP, &workspace).await;
    drop(api);
    within("the daemon to die at its fault point", daemon.wait_exit()).await;
    daemon.restart_with_env(&[]).await;
    let api = daemon.api().await;
    let (state, seen) = api.workflow_end(&started.workflow_id).await;
    assert_eq!(state, WorkflowState::Completed, "{seen:#?}");
    once(
        &turns(&log),
        &[
            "build ",
            "review built[]",
            "build verdict built[]",
            "review built[verdict built[]]",
            "ship",
        ],
    );
    let first_review = started_session(&seen, "review");
    let status = status(&api, &started.workflow_id).await;
    let review = status.steps.iter().find(|s| s.id == "review").unwrap();
    assert_ne!(
        review.session_id.as_deref(),
        Some(first_review.as_str()),
        "a new pass, a new session"
    );
    let previous = api.status(&first_review).await;
    assert_eq!(previous.state, protocol::api::SessionState::Completed, "{previous:?}");
    for pid in daemon.sidecars(&first_review) {
        if let Ok(pidfd) = agentctl::process::PidFd::open(pid) {
            within("the previous pass's agentctl to exit", pidfd.exited()).await.expect("pidfd");
        }
    }
}

/// Killed right after the write that fails a workflow (the stop of its failed step's
/// session not yet carried out), the daemon comes back and stops that session although
/// the workflow no longer runs: nothing is left running for a workflow that is over.
#[tokio::test]
async fn a_kill_as_a_workflow_fails_leaves_no_step_session_running() {
    let spec = "name = \"fails\"\n[[steps]]\nid = \"triage\"\nagent = \"flow\"\nprompt = \"triage\\n/say neither\"\nroutes = { bug = \"fix\" }\n[[steps]]\nid = \"fix\"\nagent = \"flow\"\ndepends_on = [\"triage\"]\nprompt = \"fix\\n/say fixed\"\n";
    let (mut daemon, _log, workspace) = daemon(Some("workflow.advanced@1")).await;
    let api = daemon.api().await;
    let started = api.start_workflow(spec, &workspace).await;
    drop(api);
    within("the daemon to die at its fault point", daemon.wait_exit()).await;
    daemon.restart_with_env(&[]).await;
    let api = daemon.api().await;
    let (state, seen) = api.workflow_end(&started.workflow_id).await;
    assert_eq!(state, WorkflowState::Failed, "{seen:#?}");
    let session = started_session(&seen, "triage");
    let mut events = api.subscribe(&session, 0).await;
    let stopped = tether_tests::daemon::until(&mut events, |event| {
        tether_tests::daemon::is_state(event, protocol::api::SessionState::Completed)
    });
    within("the failed step's session to be stopped", stopped).await;
}
