//! Durable workflows (issue 30), end to end: real daemons, real mock agents, real SQLite.
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
use protocol::errors::ErrorKind;
use tether_tests::daemon::{Api, Daemon, call};
use tether_tests::within;

/// A profile whose agent logs each prompt it starts to answer to `log`.
fn profile(log: &Path) -> String {
    format!(
        "id = \"flow\"\ncommand = [\"mock-agent\", \"--turn-log\", \"{}\"]\nprotocol = \"acp\"\n",
        log.display()
    )
}

/// The prompts the agents started to answer, with how many times each.
fn turns(log: &Path) -> BTreeMap<String, usize> {
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
async fn daemon(fault: Option<&str>) -> (Daemon, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap().keep();
    let log = dir.join("turns.jsonl");
    let env: Vec<(&str, &str)> = fault.map(|f| ("TETHER_FAULT", f)).into_iter().collect();
    let daemon = Daemon::start_with_env(&[], &[("flow.toml", &profile(&log))], &env).await;
    let workspace = daemon.workspace("ws");
    (daemon, log, workspace)
}

async fn subscribe(api: &Api, id: &str, after: u64) -> Subscription<WorkflowEvent> {
    call("workflow.subscribe", api.typed().workflow_subscribe(id.to_owned(), Some(after)))
        .await
        .expect("workflow.subscribe")
}

/// Follows a workflow's events until it is over; its last state.
async fn until_over(
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

async fn status(api: &Api, id: &str) -> WorkflowStatus {
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
            false
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
    let mut events = subscribe(&api, &id, 0).await;
    let (state, seen) = until_over(&mut events).await;
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

/// Runs `spec` with every step slowed (a tool call, then 100 ms before its answer) and
/// SIGKILLs the daemon while the `nth` step to start is mid-turn (its tool call seen), then
/// starts it again and follows the workflow to its end.
async fn killed_mid_step(spec: &str, nth: usize) -> (WorkflowStatus, BTreeMap<String, usize>) {
    let slow = spec.replace("\\n/say ", "\\n/tool\\n/sleep 100\\n/say ");
    assert_ne!(slow, spec, "every step answers with /say");
    let (mut daemon, log, workspace) = daemon(None).await;
    let api = daemon.api().await;
    let started = call(
        "workflow.start",
        api.typed().workflow_start(slow, None, None, None, Some(workspace.display().to_string())),
    )
    .await
    .unwrap();
    let id = started.workflow_id;
    let mut events = subscribe(&api, &id, 0).await;
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
    drop((events, turn, api));
    daemon.kill().await;
    daemon.restart().await;
    let api = daemon.api().await;
    let (state, seen) = until_over(&mut subscribe(&api, &id, 0).await).await;
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

fn once(log: &BTreeMap<String, usize>, wanted: &[&str]) {
    let expected: BTreeMap<String, usize> = wanted.iter().map(|p| ((*p).to_owned(), 1)).collect();
    assert_eq!(log, &expected, "each step's prompt reached its agent exactly once");
}

fn output<'a>(status: &'a WorkflowStatus, step: &str) -> &'a str {
    let step = status.steps.iter().find(|s| s.id == step).expect("the step");
    assert_eq!(step.state, StepState::Completed, "{}", step.id);
    step.output.as_deref().unwrap_or("")
}

const CHAIN: &str = r#"name = "chain"
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
async fn until_event(
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

fn started_session(seen: &[WorkflowEvent], step: &str) -> String {
    seen.iter()
        .find_map(|event| match &event.kind {
            WorkflowEventKind::StepStarted { step_id, session_id, .. } if step_id == step => {
                Some(session_id.clone())
            }
            _ => None,
        })
        .expect("the step started")
}

const SLOW: &str = r#"name = "slow"

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
/// re-adopts the step's session, and the turn's end completes the step: its prompt went
/// once, and the next step got its output.
#[tokio::test]
async fn a_kill_in_the_middle_of_a_step_loses_and_repeats_nothing() {
    let (mut daemon, log, workspace) = daemon(None).await;
    let api = daemon.api().await;
    let started = call(
        "workflow.start",
        api.typed().workflow_start(
            SLOW.into(),
            None,
            None,
            None,
            Some(workspace.display().to_string()),
        ),
    )
    .await
    .unwrap();
    let id = started.workflow_id;
    let mut events = subscribe(&api, &id, 0).await;
    let seen =
        until_event(&mut events, |kind| matches!(kind, WorkflowEventKind::StepStarted { .. }))
            .await;
    let session = started_session(&seen, "a");
    let mut turn = api.subscribe(&session, 0).await;
    tether_tests::daemon::until(&mut turn, |event| {
        matches!(event.kind, protocol::api::EventKind::ToolCall { .. })
    })
    .await;
    drop((events, turn, api));
    daemon.kill().await;
    daemon.restart().await;
    let api = daemon.api().await;
    let (state, seen) = until_over(&mut subscribe(&api, &id, 0).await).await;
    assert_eq!(state, WorkflowState::Completed, "{seen:#?}");
    once(&turns(&log), &["a", "b A"]);
    let status = status(&api, &id).await;
    assert_eq!(output(&status, "b"), "B");
    assert!(status.steps.iter().all(|step| step.runs == 1));
}

/// A step's agent dies mid-turn (its sidecar is killed; the daemon lives): the session is
/// resumed and the step's prompt sent again — once — and the workflow goes on.
#[tokio::test]
async fn a_step_whose_agent_died_mid_turn_gets_its_prompt_again_once() {
    let dir = tempfile::tempdir().unwrap().keep();
    let log = dir.join("turns.jsonl");
    let profile = format!(
        "id = \"flow\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{{home}}/.mock-agent\", \"--turn-log\", \"{}\"]\nprotocol = \"acp\"\n[session]\nnative_resume = true\n",
        log.display()
    );
    let daemon = Daemon::start_with_profiles(&[], &[("flow.toml", &profile)]).await;
    let workspace = daemon.workspace("ws");
    let api = daemon.api().await;
    let started = call(
        "workflow.start",
        api.typed().workflow_start(
            SLOW.into(),
            None,
            None,
            None,
            Some(workspace.display().to_string()),
        ),
    )
    .await
    .unwrap();
    let id = started.workflow_id;
    let mut events = subscribe(&api, &id, 0).await;
    let seen =
        until_event(&mut events, |kind| matches!(kind, WorkflowEventKind::StepStarted { .. }))
            .await;
    let session = started_session(&seen, "a");
    let mut turn = api.subscribe(&session, 0).await;
    tether_tests::daemon::until(&mut turn, |event| {
        matches!(event.kind, protocol::api::EventKind::ToolCall { .. })
    })
    .await;
    tether_tests::daemon::kill_sidecar(&daemon, &api, &session).await;
    let (state, seen) = until_over(&mut events).await;
    assert_eq!(state, WorkflowState::Completed, "{seen:#?}");
    // Started twice by the agent (the first answer was cut off), never a third time.
    let log = turns(&log);
    assert_eq!(log.get("a"), Some(&2), "{log:?}");
    assert_eq!(log.get("b A"), Some(&1), "{log:?}");
    let status = status(&api, &id).await;
    let a = status.steps.iter().find(|s| s.id == "a").unwrap();
    assert_eq!((a.runs, a.session_id.as_deref()), (1, Some(session.as_str())), "the same session");
}

/// A step that waits for approval keeps waiting across a restart, and starts once
/// approved (by the CLI).
#[tokio::test]
async fn an_approval_survives_a_restart_while_it_waits() {
    let spec = CHAIN.replace("id = \"build\"\n", "id = \"build\"\napproval = true\n");
    let (mut daemon, log, workspace) = daemon(None).await;
    let api = daemon.api().await;
    let started = call(
        "workflow.start",
        api.typed().workflow_start(spec, None, None, None, Some(workspace.display().to_string())),
    )
    .await
    .unwrap();
    let id = started.workflow_id;
    let mut events = subscribe(&api, &id, 0).await;
    until_event(&mut events, |kind| matches!(kind, WorkflowEventKind::StepWaitingApproval { .. }))
        .await;
    drop((events, api));
    daemon.kill().await;
    daemon.restart().await;
    let api = daemon.api().await;
    let waiting = status(&api, &id).await;
    assert_eq!(waiting.state, WorkflowState::Running);
    let build = waiting.steps.iter().find(|s| s.id == "build").unwrap();
    assert_eq!((build.state, build.runs, build.approval), (StepState::WaitingApproval, 0, true));
    // Only a step not started is approved; an unknown one is not found.
    let done = daemon.cli(&["workflow", "approve", &id, "plan"]).await;
    assert_eq!(done.0, 1, "{done:?}");
    assert!(done.2.contains("step plan is completed"), "{done:?}");
    let unknown =
        call("workflow.approve", api.typed().workflow_approve(id.clone(), "nope".into())).await;
    assert_eq!(unknown.unwrap_err().kind, ErrorKind::NotFound);
    let (code, out, err) = daemon.cli(&["workflow", "approve", &id, "build"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("step build of workflow"), "{out}");
    let (state, _) = until_over(&mut subscribe(&api, &id, 0).await).await;
    assert_eq!(state, WorkflowState::Completed);
    once(&turns(&log), &["plan commas", "build P-commas", "review B-P-commas"]);
}

const TRIAGE: &str = r#"name = "triage"

[[steps]]
id = "triage"
agent = "flow"
prompt = "triage\n/say neither"
routes = { bug = "fix" }

[[steps]]
id = "fix"
agent = "flow"
depends_on = ["triage"]
prompt = "fix {{steps.triage.output}}\n/say fixed"
"#;

/// A failed workflow resumes from its first step not completed; a changed file is
/// refused, saying what changed, then run with --accept-spec-change. Driven by the CLI,
/// whose JSON has the shapes the issue names.
#[tokio::test]
async fn resume_refuses_a_changed_file_unless_the_change_is_accepted() {
    let (daemon, log, workspace) = daemon(None).await;
    let file = workspace.join("triage.toml");
    std::fs::write(&file, TRIAGE).unwrap();
    let file = file.display().to_string();
    let ws = workspace.display().to_string();
    let (code, out, err) =
        daemon.cli(&["workflow", "run", &file, "--workspace", &ws, "--json", "--follow"]).await;
    assert_eq!(code, 1, "the workflow failed: {out}{err}");
    let first: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    let id = first["workflow_id"].as_str().expect("workflow_id").to_owned();
    assert!(first["task_id"].is_string(), "{first}");
    assert!(err.contains("its output names none of its routes (bug)"), "{err}");
    let (_, status_json, _) = daemon.cli(&["workflow", "status", &id, "--json"]).await;
    let json: serde_json::Value = serde_json::from_str(&status_json).unwrap();
    assert_eq!(json["state"], "failed");
    assert_eq!(json["steps"][0]["id"], "triage");
    assert_eq!(json["steps"][0]["state"], "failed");
    assert_eq!(json["steps"][0]["runs"], 1);
    assert_eq!(json["steps"][0]["output"], "neither");
    assert!(json["steps"][0]["session_id"].is_string());
    assert_eq!(json["steps"][1]["state"], "pending");

    // The file changes: refused, saying what changed; nothing runs.
    std::fs::write(&file, TRIAGE.replace("/say neither", "/say a bug")).unwrap();
    let (code, out, err) = daemon.cli(&["workflow", "resume", &id]).await;
    assert_eq!(code, 5, "a conflict: {out}{err}");
    assert!(
        err.contains("the workflow file changed") && err.contains("step triage: prompt changed"),
        "{err}"
    );
    assert!(err.contains("--accept-spec-change"), "{err}");
    let api = daemon.api().await;
    assert_eq!(status(&api, &id).await.state, WorkflowState::Failed);

    let (code, out, err) =
        daemon.cli(&["workflow", "resume", &id, "--accept-spec-change", "--follow"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let done = status(&api, &id).await;
    assert_eq!(done.state, WorkflowState::Completed);
    assert_eq!(done.resumes, 1);
    assert_eq!(output(&done, "fix"), "fixed");
    let triage = done.steps.iter().find(|s| s.id == "triage").unwrap();
    assert_eq!(triage.runs, 2, "the changed step ran again");
    // `triage` was answered twice: once per version of the file.
    let answered = turns(&log);
    assert_eq!(answered, [("fix a bug".to_owned(), 1), ("triage".to_owned(), 2)].into());
    // The metrics count the resume, the steps by state and every completed turn of a step
    // (triage's first, which its route then failed, too).
    let addr = daemon.url.trim_start_matches("ws://").to_owned();
    let (code, _, metrics) = tether_tests::browser::http(&addr, "GET", "/metrics", &[], None).await;
    assert_eq!(code, 200);
    assert!(metrics.contains("tether_workflow_resumes_total 1"), "{metrics}");
    assert!(metrics.contains("tether_workflow_steps{state=\"completed\"} 2"), "{metrics}");
    assert!(metrics.contains("tether_workflow_step_seconds_count 3"), "{metrics}");
    let (_, listed, _) = daemon.cli(&["workflow", "list"]).await;
    assert!(
        listed.contains(&id) && listed.contains("completed") && listed.contains("2/2 steps"),
        "{listed}"
    );
}

/// Cancel stops a running workflow's steps (their sessions end) and resume goes on.
#[tokio::test]
async fn cancel_stops_the_running_steps_and_resume_goes_on() {
    let (daemon, _log, workspace) = daemon(None).await;
    let api = daemon.api().await;
    let spec = SLOW.replace("/sleep 300", "/sleep 60000");
    let started = call(
        "workflow.start",
        api.typed().workflow_start(
            spec.clone(),
            None,
            None,
            None,
            Some(workspace.display().to_string()),
        ),
    )
    .await
    .unwrap();
    let id = started.workflow_id;
    let mut events = subscribe(&api, &id, 0).await;
    let seen =
        until_event(&mut events, |kind| matches!(kind, WorkflowEventKind::StepStarted { .. }))
            .await;
    let session = started_session(&seen, "a");
    call("workflow.cancel", api.typed().workflow_cancel(id.clone())).await.unwrap();
    let cancelled = status(&api, &id).await;
    assert_eq!(cancelled.state, WorkflowState::Cancelled);
    assert!(
        cancelled.steps.iter().all(|s| s.state == StepState::Cancelled),
        "{:?}",
        cancelled.steps
    );
    assert!(api.status(&session).await.state.is_terminal(), "its session was stopped");
    let again = call("workflow.cancel", api.typed().workflow_cancel(id.clone())).await;
    assert_eq!(again.unwrap_err().kind, ErrorKind::InvalidState);
    // Resumed with a quicker file: the cancelled steps run again from the start.
    let resumed = call(
        "workflow.resume",
        api.typed().workflow_resume(id.clone(), Some(SLOW.into()), Some(true)),
    )
    .await
    .unwrap();
    assert_eq!(resumed.state, WorkflowState::Running);
    let (state, _) = until_over(&mut subscribe(&api, &id, resumed.last_event_seq).await).await;
    assert_eq!(state, WorkflowState::Completed);
}

/// Bad workflow files are refused where they are wrong, before anything is stored; so
/// are a missing workspace and an unknown agent profile.
#[tokio::test]
async fn bad_workflow_files_are_refused_with_their_location() {
    let (daemon, _log, workspace) = daemon(None).await;
    let api = daemon.api().await;
    let ws = workspace.display().to_string();
    let refuse = |spec: String| {
        let ws = ws.clone();
        let api = &api;
        async move {
            let result = call(
                "workflow.start",
                api.typed().workflow_start(
                    spec,
                    Some("/flows/bad.toml".into()),
                    None,
                    None,
                    Some(ws),
                ),
            )
            .await;
            result.unwrap_err()
        }
    };
    let cases = [
        (
            CHAIN.replace("depends_on = [\"plan\"]", "depends_on = [\"review\"]"),
            "/flows/bad.toml:11:",
            "a cycle",
        ),
        (
            CHAIN.replace("depends_on = [\"plan\"]", "depends_on = [\"nope\"]"),
            "/flows/bad.toml:13:",
            "no step \"nope\"",
        ),
        (
            CHAIN.replace("agent = \"flow\"\ndepends_on", "agent = \"nobody\"\ndepends_on"),
            "/flows/bad.toml:12:",
            "no agent profile \"nobody\"",
        ),
        (
            CHAIN.replace("{{vars.goal}}\\n", "{{vars.gaol}}\\n"),
            "/flows/bad.toml:8:",
            "no variable \"gaol\"",
        ),
    ];
    for (spec, at, reason) in cases {
        let err = refuse(spec).await;
        assert_eq!(
            (err.kind, err.field.as_deref()),
            (ErrorKind::InvalidParams, Some("spec")),
            "{err:?}"
        );
        assert!(
            err.message.starts_with(at) && err.message.contains(reason),
            "{at} {reason}: {}",
            err.message
        );
    }
    let no_workspace =
        call("workflow.start", api.typed().workflow_start(CHAIN.into(), None, None, None, None))
            .await;
    assert_eq!(no_workspace.unwrap_err().field.as_deref(), Some("workspace"));
    let listed = call("workflow.list", api.typed().workflow_list()).await.unwrap();
    assert!(listed.is_empty(), "nothing stored: {listed:?}");
    // The CLI prints the located error and exits 1.
    let file = workspace.join("bad.toml");
    std::fs::write(&file, CHAIN.replace("depends_on = [\"plan\"]", "depends_on = [\"nope\"]"))
        .unwrap();
    let (code, _, err) =
        daemon.cli(&["workflow", "run", file.to_str().unwrap(), "--workspace", &ws]).await;
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!("{}:13:", file.display())) && err.contains("no step \"nope\""),
        "{err}"
    );
}

const SHARED: &str = r#"name = "shared"

[[steps]]
id = "a"
agent = "flow"
prompt = "a\n/say A"
worktree = "workflow"

[[steps]]
id = "b"
agent = "flow"
depends_on = ["a"]
prompt = "b\n/peek mark.txt"
worktree = "workflow"
approval = true

[[steps]]
id = "c"
agent = "flow"
depends_on = ["a"]
prompt = "c\n/peek mark.txt"
worktree = "step"
"#;

/// Where a session works.
async fn workspace_of(api: &Api, session: &str) -> String {
    let sessions =
        call("task.session.list", api.typed().session_list(None, None, None)).await.unwrap();
    sessions.into_iter().find(|s| s.id == session).expect("the session").workspace_path
}

/// Two workflows on one repository: each has its own shared worktree (its steps with
/// `worktree = "workflow"` work in it, one after the other), a `worktree = "step"` step
/// gets its own, and nothing of one shows in the other.
#[tokio::test]
async fn two_workflows_on_one_repository_keep_their_worktrees_apart() {
    let (daemon, _log, _) = daemon(None).await;
    let api = daemon.api().await;
    let repo = daemon.workspace("repo");
    tether_tests::git(&repo, &["init", "-q", "-b", "main"]).await;
    std::fs::write(repo.join("README"), "the project\n").unwrap();
    tether_tests::git(&repo, &["add", "."]).await;
    tether_tests::git(&repo, &["commit", "-q", "-m", "start"]).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let started = call(
            "workflow.start",
            api.typed().workflow_start(
                SHARED.into(),
                None,
                None,
                None,
                Some(repo.display().to_string()),
            ),
        )
        .await
        .unwrap();
        ids.push(started.workflow_id);
    }
    let mut shared = Vec::new();
    for (id, mark) in ids.iter().zip(["one", "second"]) {
        let mut events = subscribe(&api, id, 0).await;
        until_event(&mut events, |kind| {
            matches!(kind, WorkflowEventKind::StepWaitingApproval { .. })
        })
        .await;
        let a = status(&api, id).await.steps[0].session_id.clone().unwrap();
        let path = std::path::PathBuf::from(workspace_of(&api, &a).await);
        assert!(path.starts_with(daemon.home().join("tether/worktrees")), "{path:?}");
        std::fs::write(path.join("mark.txt"), mark).unwrap();
        shared.push(path);
    }
    assert_ne!(shared[0], shared[1], "each workflow has its own worktree");
    for id in &ids {
        call("workflow.approve", api.typed().workflow_approve(id.clone(), "b".into()))
            .await
            .unwrap();
    }
    for ((id, path), size) in ids.iter().zip(&shared).zip([3, 6]) {
        let (state, seen) = until_over(&mut subscribe(&api, id, 0).await).await;
        assert_eq!(state, WorkflowState::Completed, "{seen:#?}");
        let status = status(&api, id).await;
        // b worked where a did, and saw its own workflow's mark only.
        let b = status.steps.iter().find(|s| s.id == "b").unwrap();
        assert_eq!(
            workspace_of(&api, b.session_id.as_ref().unwrap()).await,
            path.display().to_string()
        );
        assert!(
            output(&status, "b").contains(&format!("peek mark.txt: {size} bytes")),
            "{:?}",
            b.output
        );
        // c worked in a worktree of its own, from the repository's HEAD: no mark there.
        let c = status.steps.iter().find(|s| s.id == "c").unwrap();
        let c_path = workspace_of(&api, c.session_id.as_ref().unwrap()).await;
        assert_ne!(&c_path, &path.display().to_string());
        assert!(output(&status, "c").contains("peek mark.txt failed"), "{:?}", c.output);
    }
    assert_eq!(
        tether_tests::git(&repo, &["status", "--porcelain"]).await,
        "",
        "the repository is untouched"
    );
}

/// Every example in `examples/workflows/` runs to completion with the `mock` agent, as
/// docs/workflows.md and the README say (`workflow run FILE --follow`).
#[tokio::test]
async fn the_examples_run_to_completion() {
    let daemon = Daemon::start(&[]).await;
    let workspace = daemon.workspace("ws");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/workflows");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "{files:?}");
    for file in files {
        let (code, out, err) = daemon
            .cli(&[
                "workflow",
                "run",
                file.to_str().unwrap(),
                "--workspace",
                workspace.to_str().unwrap(),
                "--follow",
            ])
            .await;
        assert_eq!(code, 0, "{}: {out}{err}", file.display());
        assert!(out.lines().last().unwrap().ends_with("workflow completed"), "{out}");
    }
}

/// A step keeps what its agent reported of its context and cost, with its output.
#[tokio::test]
async fn a_step_keeps_its_usage() {
    let (daemon, _log, workspace) = daemon(None).await;
    let api = daemon.api().await;
    let spec = "name = \"usage\"\n[[steps]]\nid = \"a\"\nagent = \"flow\"\nprompt = \"a\\n/usage 40 100 0.25\\n/say A\"\n";
    let started = call(
        "workflow.start",
        api.typed().workflow_start(
            spec.into(),
            None,
            None,
            None,
            Some(workspace.display().to_string()),
        ),
    )
    .await
    .unwrap();
    let (state, _) = until_over(&mut subscribe(&api, &started.workflow_id, 0).await).await;
    assert_eq!(state, WorkflowState::Completed);
    let status = status(&api, &started.workflow_id).await;
    let usage = status.steps[0].usage.clone().expect("the step's usage");
    assert_eq!(
        (usage.context_used, usage.context_size, usage.cost),
        (Some(40), Some(100), Some(0.25))
    );
    assert_eq!(usage.cost_currency.as_deref(), Some("USD"));
    assert!(status.steps[0].started_at <= status.steps[0].ended_at);
}

/// A step over its `timeout_ms` is cancelled and fails the workflow; its session is
/// stopped, and nothing waits on it.
#[tokio::test]
async fn a_step_over_its_timeout_is_cancelled_and_fails() {
    let (daemon, _log, workspace) = daemon(None).await;
    let api = daemon.api().await;
    let spec = "name = \"slow\"\n[[steps]]\nid = \"a\"\nagent = \"flow\"\ntimeout_ms = 300\nprompt = \"a\\n/sleep 60000\\n/say A\"\n";
    let started = call(
        "workflow.start",
        api.typed().workflow_start(
            spec.into(),
            None,
            None,
            None,
            Some(workspace.display().to_string()),
        ),
    )
    .await
    .unwrap();
    let id = started.workflow_id;
    let (state, seen) = until_over(&mut subscribe(&api, &id, 0).await).await;
    assert_eq!(state, WorkflowState::Failed, "{seen:#?}");
    let status = status(&api, &id).await;
    assert_eq!(status.error.as_deref(), Some("step a: timed out after 300 ms"));
    let session = status.steps[0].session_id.clone().unwrap();
    let mut events = api.subscribe(&session, 0).await;
    tether_tests::daemon::until(&mut events, |event| {
        tether_tests::daemon::is_state(event, protocol::api::SessionState::Completed)
    })
    .await;
    let turns = call("timeline", api.typed().session_timeline(session, None)).await.unwrap().turns;
    assert_eq!(turns.len(), 1);
    assert_ne!(turns[0].state, protocol::api::TurnState::Running, "{turns:?}");
}
