//! The workflow section: a step's checkpoint, a restart with a 100-step workflow
//! stored, and what a chain of steps costs over the same turns run by hand.

use super::{
    Api, ApiClient, Create, Daemon, Duration, EventKind, Instant, RUNS, Row, SessionState,
    fast_profile, json, min_median, ms, ok, percentile, turn_ended, until,
};
use protocol::api::{WorkflowEventKind, WorkflowState};
use supervisor::store::{SessionRow, Store, WorkflowRow};

/// A chain of `n` steps of `agent`, each prompt carrying the output before.
fn chain(n: usize, agent: &str) -> String {
    let mut spec = String::from("name = \"bench\"\n");
    for i in 0..n {
        spec.push_str(&format!("[[steps]]\nid = \"s{i}\"\nagent = \"{agent}\"\n"));
        if i == 0 {
            spec.push_str("prompt = \"step 0\"\n");
        } else {
            let before = i - 1;
            spec.push_str(&format!(
                "depends_on = [\"s{before}\"]\nprompt = \"step {i} after {{{{steps.s{before}.output}}}}\"\n"
            ));
        }
    }
    spec
}

/// Starts a workflow and waits for its end; the time from the call to the end.
async fn run_workflow(api: &Api, spec: &str, workspace: &std::path::Path) -> (String, Duration) {
    let started = Instant::now();
    let id = ok(
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
    .workflow_id;
    let mut events =
        ok("workflow.subscribe", api.typed().workflow_subscribe(id.clone(), Some(0))).await;
    loop {
        let event = tether_tests::within("a workflow event", events.next()).await.unwrap().unwrap();
        if let WorkflowEventKind::WorkflowState { state, .. } = event.kind
            && state.is_over()
        {
            assert_eq!(state, WorkflowState::Completed);
            return (id, started.elapsed());
        }
    }
}

/// The same prompts as sessions made by hand, one after the other: each created with its
/// prompt, its turn awaited, then stopped.
async fn run_by_hand(api: &Api, n: usize, workspace: &std::path::Path) -> Duration {
    let task = ok("task.create", api.typed().task_create("by hand".into(), None)).await;
    let started = Instant::now();
    let mut output = String::new();
    for i in 0..n {
        let prompt = if i == 0 { "step 0".to_owned() } else { format!("step {i} after {output}") };
        let row = ok(
            "task.session.create",
            Create {
                shared: Some(true),
                prompt: Some(prompt),
                ..Create::new(&task.id, "fast", Some(workspace))
            }
            .send(api.typed()),
        )
        .await;
        let mut events = api.subscribe(&row.id, 0).await;
        let seen = until(&mut events, turn_ended).await;
        output = seen
            .iter()
            .filter_map(|event| match &event.kind {
                EventKind::AgentMessageChunk { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        ok("task.session.stop", api.typed().session_stop(row.id)).await;
    }
    started.elapsed()
}

/// The step-end write (a turn's end with its step's completion and event) against the
/// same write for a session that runs no step, on one store; p50 of 200 each.
async fn checkpoint() -> (f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("state.db")).unwrap();
    let task = store.create_task("bench".into(), String::new()).await.unwrap();
    const STEPS: usize = 200;
    let workflow = WorkflowRow {
        id: uuid::Uuid::now_v7().to_string().into(),
        task_id: task.id.clone(),
        name: "bench".into(),
        spec_file: None,
        spec_text: String::new(),
        spec_sha256: String::new(),
        vars: Default::default(),
        workspace: None,
        state: WorkflowState::Running,
        error: None,
        resumes: 0,
        event_seq: 0,
        created_at: 0,
        updated_at: 0,
    };
    let steps = (0..STEPS).map(|i| format!("s{i}")).collect();
    let workflow = store.create_workflow(workflow, steps).await.unwrap();
    let session = |id: supervisor::ids::SessionId| SessionRow {
        id,
        task_id: task.id.clone(),
        agent_profile_id: "mock".into(),
        pinned_profile: json!({}),
        runtime: "standalone".into(),
        state: SessionState::Running,
        workspace_path: "/w".into(),
        error_message: None,
        created_at: 0,
        updated_at: 0,
        initial_prompt: Some("p".into()),
        worktree_repo: None,
        worktree_branch: None,
        runtime_labels: Default::default(),
        mcp_servers: Vec::new(),
        title: None,
        additional_directories: Vec::new(),
    };
    let (mut with_step, mut without) = (Vec::new(), Vec::new());
    for i in 0..STEPS {
        for stepped in [true, false] {
            let id = supervisor::ids::SessionId::new(uuid::Uuid::now_v7().to_string());
            if stepped {
                let started = store
                    .start_step(session(id.clone()), workflow.id.clone(), format!("s{i}").into())
                    .await
                    .unwrap();
                assert!(started);
            } else {
                store.create_session(session(id.clone())).await.unwrap();
            }
            let turn = supervisor::ids::TurnId::new(uuid::Uuid::now_v7().to_string());
            store
                .insert_turn(turn.clone(), id, "e".into(), "1".into(), ("p".into(), None, None))
                .await
                .unwrap();
            let began = Instant::now();
            store
                .end_turn_then(
                    turn,
                    (protocol::api::TurnState::Completed, Some("end_turn".into()), None),
                    Some((SessionState::WaitingForInput, None, Some("REVIEW"))),
                    10,
                    Some(supervisor::store::TurnOutput {
                        text: "the step's final message".into(),
                        usage: None,
                    }),
                    None,
                )
                .await
                .unwrap();
            let took = began.elapsed();
            if stepped { with_step.push(took) } else { without.push(took) }
        }
    }
    let (_, steps) = store.workflow(workflow.id).await.unwrap();
    assert!(steps.iter().all(|step| step.state == protocol::api::StepState::Completed));
    (ms(percentile(&mut with_step, 0.5)), ms(percentile(&mut without, 0.5)))
}

pub(super) async fn workflows(rows: &mut Vec<Row>) {
    // The checkpoint.
    let (mut stepped, mut plain) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let (with_step, without) = checkpoint().await;
        stepped.push(with_step);
        plain.push(without);
    }
    let ((min, med), (base_min, base_med)) = (min_median(&mut stepped), min_median(&mut plain));
    rows.push(Row {
        measure: "a step's checkpoint: its turn's end, its step completed and its event, one transaction (p50 of 200; min / median)",
        target: "≤ 5 ms p50",
        result: format!(
            "{min:.2} / {med:.2} ms (the same turn end without a step: {base_min:.2} / {base_med:.2} ms)"
        ),
        value: json!({"p50_ms": [min, med], "baseline_p50_ms": [base_min, base_med]}),
    });

    // A 10-step chain on fast-agent against the same ten prompts by hand.
    let mut daemon = Daemon::start_with_profiles(&[], &[("fast.toml", &fast_profile())]).await;
    let api = daemon.api().await;
    let workspace = daemon.workspace("chain");
    let (mut flows, mut hands) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        hands.push(ms(run_by_hand(&api, 10, &workspace).await));
        flows.push(ms(run_workflow(&api, &chain(10, "fast"), &workspace).await.1));
    }
    let ((flow_min, flow_med), (hand_min, hand_med)) =
        (min_median(&mut flows), min_median(&mut hands));
    let per_step = |flow: f64, hand: f64| (flow - hand) / 10.0;
    rows.push(Row {
        measure: "a 10-step chain on fast-agent: added per step over the same 10 sessions run by hand, one after the other (min / median)",
        target: "≤ 20 ms a step",
        result: format!(
            "{:.1} / {:.1} ms a step (chain {flow_min:.0} / {flow_med:.0} ms; by hand {hand_min:.0} / {hand_med:.0} ms)",
            per_step(flow_min, hand_min),
            per_step(flow_med, hand_med)
        ),
        value: json!({"per_step_ms": [per_step(flow_min, hand_min), per_step(flow_med, hand_med)], "chain_ms": [flow_min, flow_med], "by_hand_ms": [hand_min, hand_med]}),
    });

    // A restart with a 100-step workflow stored: serving, and its state served.
    let (id, _) = run_workflow(&api, &chain(100, "fast"), &workspace).await;
    drop(api);
    let (mut served, mut status_only) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        daemon.terminate().await;
        let started = Instant::now();
        daemon.restart().await;
        let api = daemon.api().await;
        let asked = Instant::now();
        let status = ok("workflow.status", api.typed().workflow_status(id.clone())).await;
        status_only.push(ms(asked.elapsed()));
        served.push(ms(started.elapsed()));
        assert_eq!(status.steps.len(), 100);
    }
    let ((min, med), (status_min, status_med)) =
        (min_median(&mut served), min_median(&mut status_only));
    rows.push(Row {
        measure: "restart → a 100-step workflow's state served: the daemon started, connected, workflow.status answered (min / median)",
        target: "≤ 50 ms",
        result: format!("{min:.0} / {med:.0} ms (of which workflow.status {status_min:.1} / {status_med:.1} ms)"),
        value: json!({"ms": [min, med], "status_ms": [status_min, status_med]}),
    });
}
