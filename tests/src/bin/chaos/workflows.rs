//! The workflow rounds: a workflow — two steps at once, then one reading both —
//! started on a supervisor armed at a workflow fault point (a step boundary), killed
//! there, restarted. After the restart the workflow completes within the settle bound
//! (stuck otherwise); each step's prompt reached its agent exactly once, counted from the
//! agents' side (`mock-agent --turn-log`: lost or duplicated otherwise), the reducing
//! step's prompt carries both outputs, and no step's sidecar or agent runs on (orphans).

use protocol::api::{WorkflowEventKind, WorkflowState};

use super::{Api, ApiClient, Daemon, GO_AWAY, SETTLE, Tally, lossy, went_away};

/// The points a workflow round arms (each at its first, second or third hit).
pub(super) const WORKFLOW_POINTS: &[&str] = &[
    "workflow.planned",
    "workflow.step_started",
    "workflow.advanced",
    "workflow.stopping",
    "create.recorded",
    "prompt.recorded",
    "turn.recorded",
];

/// The profile of the workflow rounds' agents: `mock`, logging each prompt it answers.
pub(super) fn flow_profile(log: &std::path::Path) -> String {
    format!(
        "id = \"mock-flow\"\ncommand = [\"mock-agent\", \"--turn-log\", \"{}\"]\nprotocol = \"acp\"\n",
        log.display()
    )
}

fn spec(tag: &str) -> String {
    format!(
        r#"name = "chaos"
[[steps]]
id = "left"
agent = "mock-flow"
prompt = "{tag} left\n/sleep 30\n/say L"
[[steps]]
id = "right"
agent = "mock-flow"
prompt = "{tag} right\n/sleep 30\n/say R"
[[steps]]
id = "join"
agent = "mock-flow"
depends_on = ["left", "right"]
prompt = "{tag} join {{{{steps.left.output}}}}{{{{steps.right.output}}}}\n/stream 20"
"#
    )
}

/// One workflow round on a supervisor armed at `point`.
pub(super) async fn workflow_round(
    daemon: &mut Daemon,
    api: &mut Api,
    log: &std::path::Path,
    round: u64,
    point: &str,
    tally: &mut Tally,
) {
    let tag = format!("chaos workflow round {round}");
    let workspace = daemon.workspace(&format!("flow-r{round}"));
    let started = lossy(api.typed().workflow_start(
        spec(&tag),
        None,
        None,
        None,
        Some(workspace.display().to_string()),
    ))
    .await
    .ok()
    .map(|started| started.workflow_id);
    // Until the workflow ends or the daemon dies at its point.
    let finished = match &started {
        Some(id) => tokio::select! {
            finished = ended(api, id) => finished,
            _ = daemon.wait_exit() => None,
        },
        None => None,
    };
    if finished.is_none() {
        if tokio::time::timeout(GO_AWAY, daemon.wait_exit()).await.is_ok() {
            *tally.kills.entry(format!("supervisor at {point} (workflow)")).or_default() += 1;
        } else {
            tally.problem(format!("round {round}: the workflow neither ended nor reached {point}"));
            daemon.terminate().await;
        }
        daemon.restart_with_env(&[]).await;
        *api = daemon.api().await;
    } else {
        // Not reached (a later hit than the workflow has): disarmed for the next round.
        daemon.terminate().await;
        daemon.restart_with_env(&[]).await;
        *api = daemon.api().await;
    }
    let id = match started {
        Some(id) => id,
        // The answer was lost: the newest workflow is this round's (workflows are only
        // started here, one per round, and stored before any workflow point fires).
        None => match lossy(api.typed().workflow_list()).await {
            Ok(list) => match list.last() {
                Some(last) => last.workflow_id.clone(),
                None => {
                    tally.lost += 1;
                    tally.problem(format!(
                        "round {round}: the workflow started at {point} is not stored"
                    ));
                    return;
                }
            },
            Err(err) => {
                tally.problem(format!("round {round}: workflow.list: {err}"));
                return;
            }
        },
    };
    match tokio::time::timeout(SETTLE, ended(api, &id)).await {
        Ok(Some(WorkflowState::Completed)) => {}
        Ok(other) => {
            tally.lost += 1;
            let status = lossy(api.typed().workflow_status(id.clone())).await;
            tally.problem(format!(
                "round {round}: the workflow killed at {point} ended {other:?}: {:?}",
                status.map(|s| s.error)
            ));
        }
        Err(_) => {
            tally.stuck += 1;
            let status = lossy(api.typed().workflow_status(id.clone())).await;
            tally.problem(format!(
                "round {round}: the workflow killed at {point} did not end within {SETTLE:?}: {status:?}"
            ));
        }
    }
    // Counted from the agents' side.
    let text = std::fs::read_to_string(log).unwrap_or_default();
    for (step, wanted) in [
        ("left", format!("{tag} left")),
        ("right", format!("{tag} right")),
        ("join", format!("{tag} join LR")),
    ] {
        let count = text
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|entry| entry["prompt"].as_str() == Some(wanted.as_str()))
            .count();
        match count {
            1 => {}
            0 => {
                tally.lost += 1;
                tally.problem(format!(
                    "round {round}: step {step}'s prompt never reached its agent ({point})"
                ));
            }
            n => {
                tally.duplicated += (n - 1) as u64;
                tally.problem(format!(
                    "round {round}: step {step}'s prompt reached its agent {n} times ({point})"
                ));
            }
        }
    }
    // Every step's session was stopped: nothing of it runs on.
    if let Ok(status) = lossy(api.typed().workflow_status(id.clone())).await {
        for step in status.steps {
            let Some(session) = step.session_id else { continue };
            for pid in daemon.sidecars(&session) {
                if !went_away(pid).await {
                    tally.orphans += 1;
                    tally.problem(format!(
                        "round {round}: the sidecar {pid} of step {} outlived it",
                        step.id
                    ));
                }
            }
        }
    }
}

/// Follows a workflow until it is over; `None` when the daemon went away first.
async fn ended(api: &Api, id: &str) -> Option<WorkflowState> {
    let mut events = api.typed().workflow_subscribe(id.to_owned(), Some(0)).await.ok()?;
    while let Some(Ok(event)) = events.next().await {
        if let WorkflowEventKind::WorkflowState { state, .. } = event.kind
            && state.is_over()
        {
            return Some(state);
        }
    }
    None
}
