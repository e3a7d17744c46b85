//! `supervisor workflow …`: run a workflow file, follow it, read its state, resume, cancel
//! or delete it, and approve its steps.

use protocol::api::{StepState, WorkflowEvent, WorkflowEventKind, WorkflowState, WorkflowStatus};

use super::{
    ApiClient, Arc, Client, Exit, Failure, JsonFlag, PathBuf, Shown, Subcommand, Subscription,
    call_failure, parse_label, print_json,
};

#[derive(Subcommand, Debug)]
pub(super) enum WorkflowCommand {
    /// Start a workflow file (see docs/workflows.md); its steps work in --workspace (default:
    /// the current directory, unless the file says `workspace`).
    Run {
        /// The workflow file (TOML).
        file: PathBuf,
        /// Replace a variable of the file's [vars] (repeatable).
        #[arg(long = "var", value_name = "NAME=VALUE", value_parser = parse_label)]
        vars: Vec<(String, String)>,
        /// Run it for this task (default: a new task named after the workflow).
        #[arg(long)]
        task: Option<String>,
        /// Where the steps work (default: the file's `workspace`, else the current directory).
        #[arg(long)]
        workspace: Option<PathBuf>,
        /// Follow its steps until it ends (exit 1 if it fails).
        #[arg(long)]
        follow: bool,
        /// Print `{"workflow_id": …, "task_id": …}` (then, with --follow, each event as a
        /// JSON line).
        #[arg(long)]
        json: bool,
    },
    /// A workflow's state and each step's.
    Status {
        /// The workflow.
        workflow: String,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// List workflows, oldest first.
    List(JsonFlag),
    /// Follow a workflow's events until it ends (exit 1 if it fails).
    Follow {
        /// The workflow.
        workflow: String,
        /// Replay from the start instead of from now.
        #[arg(long)]
        all: bool,
        /// Each event as a JSON line.
        #[arg(long)]
        json: bool,
    },
    /// Go on with a failed or cancelled workflow from its steps not completed. A changed
    /// workflow file is refused, saying what changed, unless --accept-spec-change.
    Resume {
        /// The workflow.
        workflow: String,
        /// Run the changed file: its changed steps, and those after them, run again.
        #[arg(long)]
        accept_spec_change: bool,
        /// Follow it until it ends.
        #[arg(long)]
        follow: bool,
    },
    /// Cancel a running workflow (its running steps' sessions are stopped). Resumable.
    Cancel {
        /// The workflow.
        workflow: String,
    },
    /// Let a step that waits for approval start.
    Approve {
        /// The workflow.
        workflow: String,
        /// The step.
        step: String,
    },
    /// Delete a workflow that is over (completed, failed or cancelled): its record, steps
    /// and events. Its steps' sessions stay, as sessions of its task.
    Delete {
        /// The workflow.
        workflow: String,
    },
}

impl Client {
    pub(super) async fn workflow(&self, command: WorkflowCommand) -> Result<(), Failure> {
        let api = &*self.client;
        match command {
            WorkflowCommand::Run { file, vars, task, workspace, follow, json } => {
                // At most the 1 MiB the daemon takes: `/dev/zero` is refused, not read.
                let spec = crate::workflow::spec::read_file(&file)
                    .map_err(|err| Failure { code: Exit::Error, line: format!("error: {err}") })?;
                let spec_file = std::fs::canonicalize(&file).unwrap_or(file);
                let here = std::env::current_dir().ok();
                // The file's own `workspace` wins over the current directory (a file that
                // does not parse is sent as it is: the daemon says where it is wrong).
                let names_workspace = crate::workflow::spec::parse(
                    &spec,
                    &spec_file,
                    &Default::default(),
                    &|_| true,
                    &|_| Ok(()),
                )
                .is_ok_and(|parsed| parsed.workspace.is_some());
                let workspace = workspace
                    .map(|path| std::path::absolute(&path).unwrap_or(path))
                    .or(if names_workspace { None } else { here });
                let started = api
                    .workflow_start(
                        spec,
                        Some(spec_file.display().to_string()),
                        Some(vars.into_iter().collect()),
                        task,
                        workspace.map(|path| path.display().to_string()),
                    )
                    .await
                    .map_err(|e| self.failure(e))?;
                if json {
                    let line = serde_json::to_string(&started).map_err(|err| Failure {
                        code: Exit::Error,
                        line: format!("error: {err}"),
                    })?;
                    println!("{line}");
                } else {
                    println!("workflow {} started (task {})", started.workflow_id, started.task_id);
                }
                if follow {
                    return self.follow_workflow(&started.workflow_id, 0, 1, json).await;
                }
                Ok(())
            }
            WorkflowCommand::Status { workflow, json: JsonFlag { json } } => {
                let status = api.workflow_status(workflow).await.map_err(|e| self.failure(e))?;
                if json {
                    return print_json(&status);
                }
                print_workflow(&status);
                Ok(())
            }
            WorkflowCommand::List(JsonFlag { json }) => {
                let list = api.workflow_list().await.map_err(|e| self.failure(e))?;
                if json {
                    return print_json(&list);
                }
                for workflow in list {
                    println!(
                        "{}\t{}\t{}/{} steps\t{}",
                        workflow.workflow_id,
                        workflow.state,
                        workflow.steps_done,
                        workflow.steps,
                        workflow.name
                    );
                }
                Ok(())
            }
            WorkflowCommand::Follow { workflow, all, json } => {
                let status =
                    api.workflow_status(workflow.clone()).await.map_err(|e| self.failure(e))?;
                if all {
                    // From the start: the runs before the current one (each resume begins
                    // one with `workflow running`) end in old failures, not this one's.
                    let runs = status.resumes + 1;
                    return self.follow_workflow(&workflow, 0, runs, json).await;
                }
                if status.state.is_over() {
                    print_workflow(&status);
                    return outcome(status.state, status.error.as_deref());
                }
                self.follow_workflow(&workflow, status.last_event_seq, 0, json).await
            }
            WorkflowCommand::Resume { workflow, accept_spec_change, follow } => {
                let status = api
                    .workflow_resume(workflow.clone(), None, Some(accept_spec_change))
                    .await
                    .map_err(|e| self.failure(e))?;
                println!("workflow {workflow} resumed ({} times in all)", status.resumes);
                if follow {
                    let after = status.last_event_seq;
                    return self.follow_workflow(&workflow, after, 0, false).await;
                }
                Ok(())
            }
            WorkflowCommand::Cancel { workflow } => {
                api.workflow_cancel(workflow.clone()).await.map_err(|e| self.failure(e))?;
                println!("workflow {workflow} cancelled (workflow resume goes on with it)");
                Ok(())
            }
            WorkflowCommand::Approve { workflow, step } => {
                api.workflow_approve(workflow.clone(), step.clone())
                    .await
                    .map_err(|e| self.failure(e))?;
                println!("step {step} of workflow {workflow} approved");
                Ok(())
            }
            WorkflowCommand::Delete { workflow } => {
                api.workflow_delete(workflow.clone()).await.map_err(|e| self.failure(e))?;
                println!("workflow {workflow} deleted (its steps' sessions stay with its task)");
                Ok(())
            }
        }
    }

    /// Prints a workflow's events after `after` until it ends, reconnecting across a daemon
    /// restart; a workflow that failed or was cancelled exits 1. The end is the first
    /// state that is over once `runs` runs began (`workflow running` events: its start and
    /// each resume) — from the start of a resumed workflow, not its first run's failure.
    async fn follow_workflow(
        &self,
        id: &str,
        mut after: u64,
        mut runs: u32,
        json: bool,
    ) -> Result<(), Failure> {
        let shown = Shown::new(json);
        let mut client = Arc::clone(&self.client);
        loop {
            let mut events: Subscription<WorkflowEvent> = client
                .workflow_subscribe(id.to_owned(), Some(after))
                .await
                .map_err(|err| call_failure(&self.target, &client, err))?;
            while let Some(event) = events.next().await {
                let event = event
                    .map_err(|err| Failure { code: Exit::Error, line: format!("error: {err}") })?;
                after = event.seq;
                if json {
                    let line = serde_json::to_string(&event).map_err(|err| Failure {
                        code: Exit::Error,
                        line: format!("error: {err}"),
                    })?;
                    println!("{line}");
                } else {
                    println!("[{}] {}", event.seq, describe_workflow_event(&event.kind, id));
                }
                match &event.kind {
                    WorkflowEventKind::WorkflowState { state: WorkflowState::Running, .. } => {
                        runs = runs.saturating_sub(1);
                    }
                    WorkflowEventKind::WorkflowState { state, error }
                        if state.is_over() && runs == 0 =>
                    {
                        return outcome(*state, error.as_deref());
                    }
                    _ => {}
                }
            }
            client = Arc::new(self.target.reopen(&shown).await?);
        }
    }
}

fn outcome(state: WorkflowState, error: Option<&str>) -> Result<(), Failure> {
    match state {
        WorkflowState::Completed | WorkflowState::Running => Ok(()),
        other => Err(Failure {
            code: Exit::Error,
            line: format!(
                "workflow {other}{}",
                error.map(|e| format!(": {e}")).unwrap_or_default()
            ),
        }),
    }
}

/// The first line of a text, at most 100 characters.
fn first_line(text: &str) -> String {
    let line = text.lines().find(|line| !line.trim().is_empty()).unwrap_or("");
    let mut short: String = line.chars().take(100).collect();
    if short.len() < line.len() || text.lines().filter(|l| !l.trim().is_empty()).count() > 1 {
        short.push('…');
    }
    short
}

fn describe_workflow_event(kind: &WorkflowEventKind, id: &str) -> String {
    match kind {
        WorkflowEventKind::WorkflowState { state, error } => match error {
            Some(error) => format!("workflow {state}: {error}"),
            None => format!("workflow {state}"),
        },
        WorkflowEventKind::StepStarted { step_id, session_id, run, iteration } => {
            let pass = if *iteration > 0 {
                format!(", loop pass {}", iteration + 1)
            } else {
                String::new()
            };
            format!("step {step_id} started (session {session_id}, run {run}{pass})")
        }
        WorkflowEventKind::StepCompleted { step_id, output } => {
            format!("step {step_id} completed: {}", first_line(output))
        }
        WorkflowEventKind::StepFailed { step_id, error } => {
            format!("step {step_id} failed: {error}")
        }
        WorkflowEventKind::StepWaitingApproval { step_id } => {
            format!("step {step_id} waits for approval: supervisor workflow approve {id} {step_id}")
        }
        WorkflowEventKind::StepReset { step_id, state, reason } => {
            format!("step {step_id} {state}: {reason}")
        }
        _ => "(an event this client does not know)".into(),
    }
}

fn print_workflow(status: &WorkflowStatus) {
    println!("workflow {} ({}): {}", status.workflow_id, status.name, status.state);
    if let Some(error) = &status.error {
        println!("  error: {error}");
    }
    let width = status.steps.iter().map(|step| step.id.len()).max().unwrap_or(0);
    for step in &status.steps {
        let mut line = format!("  {:width$}  {:16}", step.id, step.state.as_str());
        if step.runs > 0 {
            line.push_str(&format!("  runs {}", step.runs));
        }
        if step.resends > 0 {
            line.push_str(&format!("  prompt sent again {}×", step.resends));
        }
        if let Some(session) = &step.session_id {
            line.push_str(&format!("  session {session}"));
        }
        match (step.state, &step.output, &step.error) {
            (StepState::Failed, _, Some(error)) => line.push_str(&format!("  error: {error}")),
            (StepState::Completed, Some(output), _) => {
                line.push_str(&format!("  → {}", first_line(output)))
            }
            _ => {}
        }
        println!("{line}");
    }
}
