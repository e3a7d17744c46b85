//! Workflows: started, read, cancelled, approved and resumed, and the engine that drives
//! each running one.
//!
//! The engine is one task per running workflow (a "driver"). Each pass it reads the
//! workflow's rows and its running steps' sessions, asks [`plan`] what to do, carries the
//! actions out, then waits — for the store to announce a change of this workflow (a step's
//! session ended a turn or changed state, a row moved), for an action of its own to land,
//! or for a step's timeout. Nothing is polled. A restart starts a driver for every
//! running workflow once recovery re-attached the sessions; since every decision is made
//! from what is stored, the driver after a kill decides what the one before would have.

use std::collections::{BTreeMap, BTreeSet};

use protocol::api::{
    StepState, StepStatus, TurnState, WorkflowEvent, WorkflowEventKind, WorkflowStarted,
    WorkflowState, WorkflowStatus, WorkflowSummary,
};
use tokio::sync::mpsc;

use super::{
    Arc, Duration, NewSession, Path, PathBuf, ServiceError, SessionHandle, SessionState,
    Supervisor, check_id,
};
use crate::ids::{StepId, WorkflowId};
use crate::store::{StepPatch, StepRow, WorkflowRow};
use crate::workflow::plan::{self, Action, Input, SessionFacts, TurnFacts};
use crate::workflow::spec::{self, Spec, WorktreeChoice};

/// What `workflow.start` asks for.
#[derive(Debug, Clone, Default)]
pub struct NewWorkflow {
    /// The workflow file's text.
    pub spec: String,
    /// The file it was read from (errors name it; `workflow.resume` reads it again to see
    /// whether it changed).
    pub spec_file: Option<String>,
    /// `--var NAME=VALUE` overrides.
    pub vars: BTreeMap<String, String>,
    /// The task to run it for (else a task is made, titled with the workflow's name).
    pub task_id: Option<String>,
    /// Where its steps work (else the file's `workspace`).
    pub workspace: Option<String>,
}

/// SHA-256 of a text, hex.
pub(crate) fn sha256(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref().iter().map(|byte| format!("{byte:02x}")).collect()
}

/// How many times a cancel reads the workflow again when the driver moved a step while
/// it was being cancelled (each move is a step starting or ending: a few at most).
const CANCEL_ATTEMPTS: usize = 8;

impl Supervisor {
    /// Parses and checks a workflow file; agents are checked against the profiles when
    /// `check_agents` (a stored spec is read whatever became of its profiles).
    fn workflow_spec(
        &self,
        text: &str,
        file: Option<&str>,
        vars: &BTreeMap<String, String>,
        check_agents: bool,
    ) -> Result<Spec, ServiceError> {
        let file = Path::new(file.unwrap_or("workflow.toml"));
        let known = |agent: &str| !check_agents || self.config.registry.get(agent).is_some();
        let runtime = |name: &str| match self.runtime(name) {
            Ok(_) => Ok(()),
            Err(_) if !check_agents => Ok(()),
            Err(_) => Err(format!("this daemon has {}", self.config.runtimes.names().join(", "))),
        };
        spec::parse(text, file, vars, &known, &runtime)
            .map_err(|err| ServiceError::InvalidParams { field: "spec", message: err.to_string() })
    }

    /// Refuses `workspace` to a workflow (`except`, when it is being resumed) while another
    /// holds it: a session not ended that is not one of its steps (`PAUSED` and `FAILED`
    /// are resumable: they hold it too), or another running workflow whose steps work in it.
    /// The start lock is held.
    async fn refuse_held_workspace(
        &self,
        workspace: &str,
        except: Option<&str>,
    ) -> Result<(), ServiceError> {
        let paths = workspace_paths(workspace);
        let store = &self.config.store;
        let beside = "run it beside them by giving its steps worktrees (worktree = \"workflow\" or \"step\" in the file)";
        if let Some(other) = self.workflow_in(&paths, except).await? {
            return Err(ServiceError::Conflict(format!(
                "workspace {workspace} is held by running workflow {} ({}), whose steps work in it; wait for it or cancel it (workflow cancel), or {beside}",
                other.id, other.name
            )));
        }
        let sessions = store.workspace_sessions(paths).await?;
        let holder = sessions
            .into_iter()
            .find(|(_, _, workflow)| workflow.is_none() || workflow.as_deref() != except);
        if let Some((session, state, workflow)) = holder {
            let of = workflow.map(|w| format!(" of workflow {w}")).unwrap_or_default();
            return Err(ServiceError::Conflict(format!(
                "workspace {workspace} is held by live session {session}{of} ({}); end that session (stop), or {beside}",
                state.as_str()
            )));
        }
        Ok(())
    }

    /// The running workflow (not `except`) whose steps work in one of `paths` itself.
    async fn workflow_in(
        &self,
        paths: &[String],
        except: Option<&str>,
    ) -> Result<Option<WorkflowRow>, ServiceError> {
        let rows = self.config.store.running_workflows_in(paths.to_vec()).await?;
        for row in rows {
            if Some(row.id.as_str()) == except {
                continue;
            }
            let spec =
                self.workflow_spec(&row.spec_text, row.spec_file.as_deref(), &row.vars, false)?;
            if works_in_place(&spec) {
                return Ok(Some(row));
            }
        }
        Ok(None)
    }

    /// Refuses a session (created without `shared`) the workspace of a running workflow
    /// whose steps work in it. The start lock is held.
    pub(super) async fn refuse_workflow_workspace(
        &self,
        workspace: &str,
    ) -> Result<(), ServiceError> {
        match self.workflow_in(&workspace_paths(workspace), None).await? {
            Some(workflow) => Err(ServiceError::Conflict(format!(
                "workspace {workspace} is held by running workflow {} ({}), whose steps work in it; pass shared: true (CLI --shared) to share it, or cancel the workflow (workflow cancel)",
                workflow.id, workflow.name
            ))),
            None => Ok(()),
        }
    }

    /// `workflow.start`: checks the file, stores the workflow (and its task) and starts
    /// driving it.
    pub async fn workflow_start(
        self: &Arc<Self>,
        new: NewWorkflow,
    ) -> Result<WorkflowStarted, ServiceError> {
        let spec = self.workflow_spec(&new.spec, new.spec_file.as_deref(), &new.vars, true)?;
        // The file's workspace is relative to the file.
        let from_file = spec.workspace.as_ref().map(|path| {
            let dir = new.spec_file.as_deref().and_then(|file| Path::new(file).parent());
            dir.map_or_else(|| PathBuf::from(path), |dir| dir.join(path))
        });
        let workspace = new.workspace.clone().map(PathBuf::from).or(from_file);
        let Some(workspace) = workspace else {
            return Err(ServiceError::InvalidParams {
                field: "workspace",
                message: "a workflow needs a workspace: pass workspace (the CLI passes its current directory) or set `workspace` in the file".into(),
            });
        };
        let workspace =
            std::fs::canonicalize(&workspace).map_err(|err| ServiceError::InvalidParams {
                field: "workspace",
                message: format!("workspace {}: {err}", workspace.display()),
            })?;
        if !workspace.is_dir() {
            return Err(ServiceError::InvalidParams {
                field: "workspace",
                message: format!("workspace {} is not a directory", workspace.display()),
            });
        }
        // Under the start lock: no session is created in the workspace meanwhile (a
        // create checks the running workflows under it too).
        let guard = self.start_lock.lock().await;
        if works_in_place(&spec) {
            self.refuse_held_workspace(&workspace.display().to_string(), None).await?;
        }
        let task = match &new.task_id {
            Some(task_id) => {
                check_id("task_id", task_id)?;
                let task = self.config.store.get_task(task_id.clone()).await?;
                // Its first steps would spend what is not there: nothing is stored.
                self.task_within_budget(task_id).await?;
                task
            }
            None => self.create_task(spec.name.clone(), String::new()).await?,
        };
        let now = crate::store::now_ms();
        let row = WorkflowRow {
            id: uuid::Uuid::now_v7().to_string().into(),
            task_id: task.id.clone(),
            name: spec.name.clone(),
            spec_file: new.spec_file.clone(),
            spec_sha256: sha256(&new.spec),
            spec_text: new.spec,
            vars: new.vars,
            workspace: Some(workspace.display().to_string()),
            state: WorkflowState::Running,
            error: None,
            resumes: 0,
            event_seq: 0,
            created_at: now,
            updated_at: now,
        };
        let steps = spec.steps.iter().map(|step| step.id.clone()).collect();
        let row = self.config.store.create_workflow(row, steps).await?;
        drop(guard);
        tracing::info!(workflow = %row.id, name = %row.name, "workflow started");
        self.drive(&row.id);
        Ok(WorkflowStarted { workflow_id: row.id.into_string(), task_id: task.id })
    }

    async fn workflow_row(
        &self,
        id: &WorkflowId,
    ) -> Result<(WorkflowRow, Vec<StepRow>), ServiceError> {
        check_id("workflow_id", id.as_str())?;
        Ok(self.config.store.workflow(id.clone()).await?)
    }

    /// `workflow.status`.
    pub async fn workflow_status(&self, id: WorkflowId) -> Result<WorkflowStatus, ServiceError> {
        let (row, steps) = self.workflow_row(&id).await?;
        let spec =
            self.workflow_spec(&row.spec_text, row.spec_file.as_deref(), &row.vars, false)?;
        let steps = steps
            .into_iter()
            .map(|step| {
                let spec_step =
                    spec.steps.iter().find(|s| s.id == plan::base_id(step.step_id.as_str()));
                StepStatus {
                    agent: spec_step.map(|s| s.agent.clone()).unwrap_or_default(),
                    depends_on: spec_step.map(|s| s.depends_on.clone()).unwrap_or_default(),
                    approval: spec_step.is_some_and(|s| s.approval),
                    id: step.step_id.into_string(),
                    state: step.state,
                    session_id: step.session_id.map(String::from),
                    runs: step.runs,
                    resends: step.resends,
                    iteration: step.iteration,
                    output: step.output,
                    error: step.error,
                    prompt: step.prompt,
                    usage: step.usage.as_deref().and_then(|usage| serde_json::from_str(usage).ok()),
                    started_at: step.started_at,
                    ended_at: step.ended_at,
                }
            })
            .collect();
        Ok(WorkflowStatus {
            workflow_id: row.id.into_string(),
            task_id: row.task_id,
            name: row.name,
            state: row.state,
            error: row.error,
            spec_file: row.spec_file,
            spec_sha256: row.spec_sha256,
            workspace: row.workspace,
            resumes: row.resumes,
            last_event_seq: row.event_seq,
            created_at: row.created_at,
            updated_at: row.updated_at,
            steps,
        })
    }

    /// `workflow.list`.
    pub async fn workflow_list(&self) -> Result<Vec<WorkflowSummary>, ServiceError> {
        Ok(self.config.store.list_workflows().await?)
    }

    /// A workflow as `workflow.list` shows it now; `None` once it is deleted.
    pub async fn workflow_summary(
        &self,
        id: &WorkflowId,
    ) -> Result<Option<WorkflowSummary>, ServiceError> {
        Ok(self.config.store.workflow_summary(id.clone()).await?)
    }

    /// A workflow's events after `after_seq`, at most `limit`; `after_seq` past the newest
    /// is refused.
    pub async fn workflow_events(
        &self,
        id: WorkflowId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<WorkflowEvent>, ServiceError> {
        let (row, _) = self.workflow_row(&id).await?;
        if after_seq > row.event_seq {
            return Err(ServiceError::InvalidParams {
                field: "after_seq",
                message: format!(
                    "after_seq {after_seq} is past the newest event of workflow {id} ({})",
                    row.event_seq
                ),
            });
        }
        Ok(self.config.store.workflow_events(id, after_seq, limit).await?)
    }

    /// Announcements of changed workflows (what a stream of a workflow's events, or of the
    /// workflow list, awaits): the store makes them after each commit that changed one, so
    /// every change has one announcer, the write that made it.
    pub fn workflow_changes(&self) -> tokio::sync::broadcast::Receiver<WorkflowId> {
        self.config.store.workflow_changes()
    }

    /// `workflow.cancel`: steps not done are cancelled and the sessions of running ones
    /// stopped (awaited); the workflow is `cancelled`, resumable. The cancel is one write
    /// that expects each step as it was read: when the driver moved one meanwhile (a step
    /// started, a step ended), the workflow is read again and the cancel tried again.
    pub async fn workflow_cancel(self: &Arc<Self>, id: WorkflowId) -> Result<(), ServiceError> {
        for _ in 0..CANCEL_ATTEMPTS {
            let (row, steps) = self.workflow_row(&id).await?;
            if row.state != WorkflowState::Running {
                return Err(ServiceError::InvalidState(format!(
                    "workflow {id} is {}; only a running workflow is cancelled",
                    row.state
                )));
            }
            if !self.cancel_as_read(&id, &steps).await? {
                continue;
            }
            for step in steps.iter().filter(|step| step.state == StepState::Running) {
                if let Some(session) = &step.session_id
                    && let Err(err) = self.stop(session.clone()).await
                    && !matches!(err, ServiceError::Conflict(_) | ServiceError::NotFound(_))
                {
                    tracing::warn!(workflow = %id, step = %step.step_id, %err, "cannot stop a cancelled step's session");
                }
            }
            tracing::info!(workflow = %id, "workflow cancelled");
            self.drive(&id);
            return Ok(());
        }
        Err(ServiceError::Conflict(format!(
            "workflow {id} kept changing while it was being cancelled ({CANCEL_ATTEMPTS} tries); try again"
        )))
    }

    /// Cancels the open steps of a running workflow as they were read, in one write;
    /// whether it went through (not if a step or the workflow changed since).
    async fn cancel_as_read(
        &self,
        id: &WorkflowId,
        steps: &[StepRow],
    ) -> Result<bool, ServiceError> {
        let open = |state: StepState| {
            matches!(state, StepState::Pending | StepState::WaitingApproval | StepState::Running)
        };
        let patches = steps
            .iter()
            .filter(|step| open(step.state))
            .map(|step| StepPatch {
                expect: Some(step.state),
                state: Some(StepState::Cancelled),
                ended: step.state == StepState::Running,
                event: Some(WorkflowEventKind::StepReset {
                    step_id: step.step_id.to_string(),
                    state: StepState::Cancelled,
                    reason: "the workflow was cancelled".into(),
                }),
                ..StepPatch::new(step.step_id.clone())
            })
            .collect();
        let state = Some((WorkflowState::Cancelled, None));
        let running = Some(WorkflowState::Running);
        Ok(self.config.store.update_workflow(id.clone(), running, patches, state).await?)
    }

    /// `workflow.delete`: a workflow that is over goes, with its steps and events; the
    /// sessions of its steps are stopped first (none is left running for it) and stay, as
    /// sessions of its task.
    pub async fn workflow_delete(self: &Arc<Self>, id: WorkflowId) -> Result<(), ServiceError> {
        let (row, steps) = self.workflow_row(&id).await?;
        if row.state == WorkflowState::Running {
            return Err(ServiceError::InvalidState(format!(
                "workflow {id} is running; cancel it first (workflow cancel), then delete it"
            )));
        }
        for session in steps.iter().filter_map(|step| step.session_id.clone()) {
            match self.stop(session.clone()).await {
                Ok(()) | Err(ServiceError::Conflict(_) | ServiceError::NotFound(_)) => {}
                Err(err) => {
                    tracing::warn!(workflow = %id, %session, %err, "cannot stop a deleted workflow's step session");
                }
            }
        }
        // Under the start lock: a resume cannot make it run meanwhile.
        let _guard = self.start_lock.lock().await;
        if !self.config.store.delete_workflow(id.clone()).await? {
            return Err(ServiceError::InvalidState(format!(
                "workflow {id} was resumed while it was being deleted; cancel it first"
            )));
        }
        tracing::info!(workflow = %id, "workflow deleted");
        Ok(())
    }

    /// Refuses to delete a task while a workflow of it runs (it would start steps in a task
    /// that is gone). The start lock is held.
    pub(super) async fn refuse_running_workflows(&self, task_id: &str) -> Result<(), ServiceError> {
        let running = self.config.store.running_workflows_of(task_id.to_owned()).await?;
        if running.is_empty() {
            return Ok(());
        }
        let names: Vec<String> =
            running.iter().map(|row| format!("{} ({})", row.id, row.name)).collect();
        Err(ServiceError::InvalidState(format!(
            "task {task_id} has running workflows: {}; cancel them first (workflow cancel)",
            names.join(", ")
        )))
    }

    /// `workflow.approve`: a step waiting for approval (or still pending: approved ahead)
    /// may start.
    pub async fn workflow_approve(
        self: &Arc<Self>,
        id: WorkflowId,
        step_id: StepId,
    ) -> Result<(), ServiceError> {
        let (row, steps) = self.workflow_row(&id).await?;
        let Some(step) = steps.iter().find(|step| step.step_id == step_id) else {
            return Err(ServiceError::NotFound(format!("workflow {id} has no step {step_id:?}")));
        };
        if !matches!(step.state, StepState::WaitingApproval | StepState::Pending) {
            return Err(ServiceError::InvalidState(format!(
                "step {step_id} is {}; only a step not started yet is approved",
                step.state
            )));
        }
        let patch = StepPatch {
            expect: Some(step.state),
            state: Some(StepState::Pending),
            approved: Some(true),
            event: Some(WorkflowEventKind::StepReset {
                step_id: step_id.to_string(),
                state: StepState::Pending,
                reason: "approved".into(),
            }),
            ..StepPatch::new(step_id.clone())
        };
        if !self.config.store.update_workflow(id.clone(), None, vec![patch], None).await? {
            return Err(ServiceError::Conflict(format!(
                "step {step_id} changed while it was being approved; try again"
            )));
        }
        tracing::info!(workflow = %id, step = %step_id, "step approved");
        if row.state == WorkflowState::Running {
            self.drive(&id);
        }
        Ok(())
    }

    /// The workflow file a resume compares with, read again: `None` when there is none, or
    /// it cannot be read (the stored text is resumed); an error when it no longer parses
    /// as a file (say, it is not UTF-8).
    fn reread_spec_file(id: &str, file: Option<&str>) -> Result<Option<String>, ServiceError> {
        let Some(file) = file else { return Ok(None) };
        match spec::read_file(Path::new(file)) {
            Ok(text) => Ok(Some(text)),
            Err(err @ spec::ReadError::Unreadable { .. }) => {
                tracing::warn!(workflow = %id, file, %err, "cannot read the workflow file again; resuming with the stored text");
                Ok(None)
            }
            Err(err) => Err(ServiceError::InvalidParams {
                field: "spec",
                message: format!("{err}; resume with its text (spec) instead"),
            }),
        }
    }

    /// `workflow.resume`: a failed or cancelled workflow goes on from the steps not
    /// completed. The file it was started from (or `spec`, when given) is compared with
    /// the workflow it runs, as read (comments and layout are no change): a change is
    /// refused, saying what changed, unless `accept_spec_change` (then changed steps, and
    /// the steps after them, run again).
    pub async fn workflow_resume(
        self: &Arc<Self>,
        id: WorkflowId,
        spec_text: Option<String>,
        accept_spec_change: bool,
    ) -> Result<WorkflowStatus, ServiceError> {
        let (row, _) = self.workflow_row(&id).await?;
        if row.state == WorkflowState::Running || row.state == WorkflowState::Completed {
            return Err(ServiceError::InvalidState(format!(
                "workflow {id} is {}; only a failed or cancelled workflow is resumed",
                row.state
            )));
        }
        // A workflow stopped by its task's budget goes on once the budget is raised.
        self.task_within_budget(&row.task_id).await?;
        let current = match spec_text {
            Some(text) => Some(text),
            None => Self::reread_spec_file(id.as_str(), row.spec_file.as_deref())?,
        };
        // Under the start lock until it runs again: no session takes its workspace meanwhile.
        let _guard = self.start_lock.lock().await;
        let stored =
            self.workflow_spec(&row.spec_text, row.spec_file.as_deref(), &row.vars, false)?;
        let changed_text = current.filter(|text| sha256(text) != row.spec_sha256);
        let changed_spec = match &changed_text {
            Some(text) => {
                Some(self.workflow_spec(text, row.spec_file.as_deref(), &row.vars, true)?)
            }
            None => None,
        };
        // Compared as read, not as text: comments and layout are no change (the new text
        // is kept below all the same, so the file compares equal next time).
        if let Some(new) = &changed_spec
            && *new != stored
            && !accept_spec_change
        {
            let (changes, _) = spec_changes(&stored, new);
            return Err(ServiceError::Conflict(format!(
                "the workflow file changed since workflow {id} started: {}; resume with accept_spec_change (CLI: --accept-spec-change) to run the new one",
                changes.join("; ")
            )));
        }
        // The spec it will run holds its workspace, as a start does.
        if works_in_place(changed_spec.as_ref().unwrap_or(&stored))
            && let Some(workspace) = &row.workspace
        {
            self.refuse_held_workspace(workspace, Some(id.as_str())).await?;
        }
        // The steps it runs from now on; the others' rows are on their way out.
        let kept: BTreeSet<String> = changed_spec
            .as_ref()
            .unwrap_or(&stored)
            .steps
            .iter()
            .map(|step| step.id.clone())
            .collect();
        if let (Some(text), Some(new)) = (changed_text, changed_spec) {
            let (changes, changed) = spec_changes(&stored, &new);
            // A changed step runs again, and so does every step after it.
            let mut reset: BTreeSet<String> = changed.clone();
            for step in &new.steps {
                let before = spec::ancestors(&new.steps, &step.id);
                if changed.iter().any(|c| before.contains(c.as_str())) {
                    reset.insert(step.id.clone());
                }
            }
            tracing::info!(workflow = %id, changes = ?changes, "resuming with a changed workflow file");
            let ids = new.steps.iter().map(|step| step.id.clone()).collect();
            self.config
                .store
                .replace_workflow_spec(
                    id.clone(),
                    text.clone(),
                    sha256(&text),
                    ids,
                    reset.into_iter().collect(),
                )
                .await?;
        }
        let (_, steps_now) = self.workflow_row(&id).await?;
        let patches = steps_now
            .iter()
            .filter(|step| matches!(step.state, StepState::Failed | StepState::Cancelled))
            .filter(|step| kept.contains(plan::base_id(step.step_id.as_str())))
            .map(|step| StepPatch {
                expect: Some(step.state),
                state: Some(StepState::Pending),
                error: Some(None),
                clear_run: true,
                event: Some(WorkflowEventKind::StepReset {
                    step_id: step.step_id.to_string(),
                    state: StepState::Pending,
                    reason: "the workflow was resumed".into(),
                }),
                ..StepPatch::new(step.step_id.clone())
            })
            .collect();
        let resumed = self
            .config
            .store
            .update_workflow(
                id.clone(),
                Some(row.state),
                patches,
                Some((WorkflowState::Running, None)),
            )
            .await?;
        if !resumed {
            return Err(ServiceError::Conflict(format!(
                "workflow {id} changed while it was being resumed; try again"
            )));
        }
        crate::metrics::get().workflow_resumes.inc();
        tracing::info!(workflow = %id, "workflow resumed");
        self.drive(&id);
        self.workflow_status(id).await
    }

    /// After recovery: a driver for every running workflow, and for every workflow over
    /// with a step's session not ended (a stop its last writes recorded and a kill cut
    /// short: the driver carries it out).
    pub async fn drive_workflows(self: &Arc<Self>) -> Result<usize, ServiceError> {
        let ids = self.config.store.workflows_to_drive().await?;
        for id in &ids {
            self.drive(id);
        }
        if !ids.is_empty() {
            tracing::info!(workflows = ids.len(), "driving the running workflows again");
        }
        Ok(ids.len())
    }

    /// Starts the workflow's driver, or tells the running one to look again before it ends.
    fn drive(self: &Arc<Self>, id: &WorkflowId) {
        let mut drivers = self.drivers.lock().expect("UNWRAP: never poisoned");
        if let Some(poked) = drivers.get_mut(id) {
            *poked = true;
            return;
        }
        drivers.insert(id.clone(), false);
        let supervisor = Arc::clone(self);
        let id = id.clone();
        tokio::spawn(async move { supervisor.run_driver(id).await });
    }

    /// The driver of one workflow: plans and acts until nothing is left to watch.
    async fn run_driver(self: Arc<Self>, id: WorkflowId) {
        let mut changes = self.config.store.workflow_changes();
        let (landed_tx, mut landed) = mpsc::unbounded_channel::<(StepId, Option<NotBroughtOn>)>();
        let mut busy: BTreeSet<StepId> = BTreeSet::new();
        loop {
            let (plan, watching) = match self.plan_workflow(&id, &busy).await {
                Ok(planned) => planned,
                Err(ServiceError::NotFound(_)) if busy.is_empty() => {
                    // Deleted (workflow.delete, or with its task): nothing to drive.
                    self.drivers.lock().expect("UNWRAP: never poisoned").remove(&id);
                    tracing::debug!(workflow = %id, "the workflow is gone");
                    return;
                }
                Err(err) => {
                    tracing::error!(workflow = %id, %err, "cannot read the workflow; waiting for a change");
                    (plan::Plan::default(), true)
                }
            };
            if plan.actions.is_empty() && busy.is_empty() && !watching {
                let mut drivers = self.drivers.lock().expect("UNWRAP: never poisoned");
                if drivers.get(&id).is_some_and(|poked| *poked) {
                    drivers.insert(id.clone(), false);
                    continue;
                }
                drivers.remove(&id);
                tracing::debug!(workflow = %id, "nothing left to drive");
                return;
            }
            if !plan.actions.is_empty() {
                agentctl::fault::point("workflow.planned");
            }
            for action in plan.actions {
                self.act(&id, action, &mut busy, &landed_tx).await;
            }
            let deadline = plan.deadline.map(|at| {
                let wait = (at - crate::store::now_ms()).max(0) as u64;
                tokio::time::Instant::now() + Duration::from_millis(wait)
            });
            tokio::select! {
                _ = changed(&mut changes, &id) => {}
                Some((step, error)) = landed.recv() => {
                    busy.remove(&step);
                    if let Some(error) = error {
                        self.continue_failed(&id, &step, error).await;
                    }
                }
                () = async {
                    match deadline {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
    }

    /// Reads the workflow and plans; also whether it still has something to watch (it
    /// runs, or a step of it does).
    async fn plan_workflow(
        &self,
        id: &WorkflowId,
        busy: &BTreeSet<StepId>,
    ) -> Result<(plan::Plan, bool), ServiceError> {
        let (row, steps, stored) = self.config.store.workflow_snapshot(id.clone()).await?;
        let spec =
            self.workflow_spec(&row.spec_text, row.spec_file.as_deref(), &row.vars, false)?;
        let task = self.config.store.get_task(row.task_id.clone()).await?;
        let mut sessions = BTreeMap::new();
        for (session_id, stored) in stored {
            let facts = match stored {
                Some(stored) => {
                    let handle = self.handle(&session_id).filter(SessionHandle::is_live);
                    let live = handle.is_some_and(|handle| live(&handle.view(), stored.state));
                    let turn_running = stored
                        .last_turn
                        .as_ref()
                        .is_some_and(|turn| turn.state == TurnState::Running);
                    SessionFacts {
                        state: stored.state,
                        live,
                        turn_running,
                        last_turn: stored.last_turn.filter(|_| !turn_running).map(|turn| {
                            TurnFacts {
                                state: turn.state,
                                stop_reason: turn.stop_reason,
                                error: turn.error,
                                delivered: turn.delivered,
                                execution_over: turn.execution_over,
                            }
                        }),
                        prompt_delivered: stored.prompt_delivered,
                        error: stored.error,
                        prompt_refused: stored.prompt_refused,
                    }
                }
                // Deleted under it: the step cannot go on.
                None => SessionFacts {
                    state: SessionState::Cancelled,
                    live: false,
                    turn_running: false,
                    last_turn: None,
                    prompt_delivered: false,
                    error: Some("its session was deleted".into()),
                    prompt_refused: None,
                },
            };
            sessions.insert(session_id, facts);
        }
        let over_budget = match self.task_within_budget(&row.task_id).await {
            Ok(()) => None,
            Err(ServiceError::BudgetExceeded(reason)) => {
                Some(format!("{reason}, then resume the workflow"))
            }
            Err(err) => return Err(err),
        };
        let input = Input {
            spec: &spec,
            workflow: &row,
            steps: &steps,
            sessions: &sessions,
            busy,
            task: (&task.title, &task.description),
            over_budget: over_budget.as_deref(),
            now: crate::store::now_ms(),
        };
        let planned = plan::plan(&input);
        let watching = row.state == WorkflowState::Running
            || steps.iter().any(|step| {
                step.session_id.as_ref().is_some_and(|session| {
                    sessions.get(session).is_some_and(|facts| !facts.state.is_terminal())
                })
            });
        Ok((planned, watching))
    }

    /// Carries one action out.
    async fn act(
        self: &Arc<Self>,
        id: &WorkflowId,
        action: Action,
        busy: &mut BTreeSet<StepId>,
        landed: &mpsc::UnboundedSender<(StepId, Option<NotBroughtOn>)>,
    ) {
        match action {
            Action::Start { step_id, prompt } => self.start_step(id, &step_id, prompt).await,
            Action::Write { patches, state } => {
                let expect = state.as_ref().map(|_| WorkflowState::Running);
                let ended = state.as_ref().map(|(state, _)| *state);
                match self.config.store.update_workflow(id.clone(), expect, patches, state).await {
                    Ok(true) => {
                        agentctl::fault::point("workflow.advanced");
                        if let Some(state) = ended {
                            tracing::info!(workflow = %id, %state, "workflow state");
                        }
                    }
                    Ok(false) => {
                        tracing::debug!(workflow = %id, "a decision on a stale read was dropped")
                    }
                    Err(err) => {
                        tracing::error!(workflow = %id, %err, "cannot record a workflow decision")
                    }
                }
            }
            Action::Continue { step_id, session_id, resend, patch } => {
                if let Some(patch) = patch {
                    match self
                        .config
                        .store
                        .update_workflow(id.clone(), None, vec![patch], None)
                        .await
                    {
                        Ok(true) => {}
                        Ok(false) => return,
                        Err(err) => {
                            tracing::error!(workflow = %id, %err, "cannot record a step's resend");
                            return;
                        }
                    }
                }
                busy.insert(step_id.clone());
                let supervisor = Arc::clone(self);
                let landed = landed.clone();
                tokio::spawn(async move {
                    let outcome = match resend {
                        Some(prompt) => {
                            tracing::info!(step = %step_id, session = %session_id, "sending the step's prompt again: its turn was cut short");
                            let sent = supervisor.prompt_step(session_id, prompt).await;
                            sent.map(drop).map_err(NotBroughtOn::Prompt)
                        }
                        None => {
                            let resumed = supervisor.resume(session_id, false).await;
                            resumed.map(drop).map_err(NotBroughtOn::Launch)
                        }
                    };
                    let _ = landed.send((step_id, outcome.err()));
                });
            }
            Action::CancelTurn { session_id } => {
                if let Err(err) = self.cancel(session_id).await {
                    tracing::debug!(workflow = %id, %err, "cannot cancel a timed-out step's turn");
                }
            }
            Action::Stop { step_id, session_id } => {
                busy.insert(step_id.clone());
                let supervisor = Arc::clone(self);
                let landed = landed.clone();
                tokio::spawn(async move {
                    agentctl::fault::point("workflow.stopping");
                    if let Err(err) = supervisor.stop(session_id.clone()).await {
                        tracing::debug!(session = %session_id, %err, "cannot stop a finished step's session");
                    }
                    let _ = landed.send((step_id, None));
                });
            }
        }
    }

    /// Creates a step's session (the step starts in the same write).
    async fn start_step(self: &Arc<Self>, id: &WorkflowId, step_id: &StepId, prompt: String) {
        let started = async {
            // Read again, not taken from the plan's read: a step started earlier in this
            // pass may have made the workflow's shared worktree, which this one must use.
            let (row, steps) = self.config.store.workflow(id.clone()).await?;
            let spec =
                self.workflow_spec(&row.spec_text, row.spec_file.as_deref(), &row.vars, false)?;
            let step = spec
                .steps
                .iter()
                .find(|step| step.id == plan::base_id(step_id.as_str()))
                .ok_or_else(|| ServiceError::Internal(format!("no step {step_id} in the spec")))?;
            let (workspace_path, worktree) = match step.worktree {
                WorktreeChoice::None => (row.workspace.clone(), Some(false)),
                WorktreeChoice::Step => (row.workspace.clone(), Some(true)),
                WorktreeChoice::Workflow => {
                    // The worktree the workflow's steps share: made by the first of them.
                    let mut shared = None;
                    for other in &steps {
                        let sharing = spec.steps.iter().any(|s| {
                            s.id == plan::base_id(other.step_id.as_str())
                                && s.worktree == WorktreeChoice::Workflow
                        });
                        if let (true, Some(session)) = (sharing, &other.session_id)
                            && let Ok(session) =
                                self.config.store.get_session(session.clone()).await
                            && session.worktree_branch.is_some()
                        {
                            shared = Some(session.workspace_path);
                            break;
                        }
                    }
                    match shared {
                        Some(path) => (Some(path), Some(false)),
                        None => (row.workspace.clone(), Some(true)),
                    }
                }
            };
            let new = NewSession {
                task_id: row.task_id.clone(),
                agent_profile_id: step.agent.clone(),
                workspace_path,
                prompt: Some(prompt),
                runtime: step.runtime.clone(),
                shared: true,
                worktree,
                base: None,
                labels: Default::default(),
                workflow_step: Some((id.clone(), step_id.clone())),
                mcp_servers: Vec::new(),
                session_id: None,
                additional_directories: Vec::new(),
            };
            self.create_session(new).await
        };
        match started.await {
            Ok(session) => {
                tracing::info!(workflow = %id, step = %step_id, session = %session.id, "step started");
                agentctl::fault::point("workflow.step_started");
            }
            Err(ServiceError::Conflict(message)) => {
                tracing::debug!(workflow = %id, step = %step_id, %message, "step not started");
            }
            Err(err) => {
                self.launch_failed(id, step_id, StepState::Pending, NotBroughtOn::Launch(err)).await
            }
        }
    }

    /// A resume or resend of a step's session failed: counted as a failed launch.
    async fn continue_failed(
        self: &Arc<Self>,
        id: &WorkflowId,
        step_id: &StepId,
        failure: NotBroughtOn,
    ) {
        self.launch_failed(id, step_id, StepState::Running, failure).await;
    }

    /// A step's session could not be created or brought on, or its prompt sent again was
    /// refused: see [`after_failure`]. Decided on the step as it is now (still in `state`,
    /// its workflow running), else dropped.
    async fn launch_failed(
        &self,
        id: &WorkflowId,
        step_id: &StepId,
        state: StepState,
        failure: NotBroughtOn,
    ) {
        let read = async {
            let (row, steps) = self.config.store.workflow(id.clone()).await?;
            let spec =
                self.workflow_spec(&row.spec_text, row.spec_file.as_deref(), &row.vars, false)?;
            Ok::<_, ServiceError>((row, steps, spec))
        };
        let (row, steps, spec) = match read.await {
            Ok(read) => read,
            Err(err) => {
                tracing::error!(workflow = %id, %err, "cannot read the workflow");
                return;
            }
        };
        let Some(step) = steps.iter().find(|step| step.step_id == *step_id) else { return };
        if step.state != state || row.state != WorkflowState::Running {
            return;
        }
        let retries = spec
            .steps
            .iter()
            .find(|s| s.id == plan::base_id(step_id.as_str()))
            .map_or(0, |s| s.retries);
        let error = failure.error();
        tracing::warn!(workflow = %id, step = %step_id, %error, failures = step.launch_failures + 1, retries, "a step's session did not launch or refused its prompt");
        let Action::Write { patches, state: ended } = after_failure(step, state, retries, &failure)
        else {
            return;
        };
        let expect = ended.as_ref().map(|_| WorkflowState::Running);
        if let Err(err) =
            self.config.store.update_workflow(id.clone(), expect, patches, ended).await
        {
            tracing::error!(workflow = %id, %err, "cannot record a failed launch");
        }
    }
}

/// Why a step's session was not brought on.
#[derive(Debug)]
enum NotBroughtOn {
    /// Creating or resuming it failed.
    Launch(ServiceError),
    /// Sending the step's prompt again failed (its session could not be resumed for it,
    /// or refused it).
    Prompt(ServiceError),
}

impl NotBroughtOn {
    fn error(&self) -> &ServiceError {
        match self {
            NotBroughtOn::Launch(error) | NotBroughtOn::Prompt(error) => error,
        }
    }

    /// What the step's error says first.
    fn what(&self) -> &'static str {
        match self {
            NotBroughtOn::Launch(_) => "its session could not launch",
            NotBroughtOn::Prompt(_) => "its prompt could not be sent again",
        }
    }

    /// Trying again in the same session is refused again: the request as given (a prompt
    /// too long, a workspace that is not there), or settings its agent will not take again
    /// (until they are chosen anew; a resume of the workflow then gives the step a new
    /// session).
    fn lasting(&self) -> bool {
        matches!(
            self.error(),
            ServiceError::InvalidParams { .. } | ServiceError::SettingsNotRestored(_)
        )
    }
}

/// What a step (in `state`) whose session could not be created or brought on leads to: it
/// is tried again while its `retries` allow, else it fails, and the workflow with it,
/// saying why. The task's budget used up fails it at once (trying again spends nothing
/// but time; a resume goes on once the budget is raised), and so does a failure no retry
/// outlives.
fn after_failure(step: &StepRow, state: StepState, retries: u32, failure: &NotBroughtOn) -> Action {
    let step_id = &step.step_id;
    let error = failure.error();
    if let ServiceError::BudgetExceeded(_) = error {
        let reason = format!("{error}, then resume the workflow");
        return match state {
            StepState::Pending => plan::not_started(step_id, &reason),
            _ => plan::fail_step(step_id, format!("its prompt cannot be sent: {reason}")),
        };
    }
    let counted =
        StepPatch { expect: Some(state), launch_failed: true, ..StepPatch::new(step_id.clone()) };
    if step.launch_failures < retries && !failure.lasting() {
        return Action::Write { patches: vec![counted], state: None };
    }
    plan::fail_with(counted, format!("{}: {error}", failure.what()))
}

/// Whether a step's session is being brought up or its agent runs, as its actor's view
/// and its stored state (read first) say: its agent runs, it launches or opens, or its
/// launch just failed — the actor left its starting phase, and the failure it stores next
/// (`FAILED`, announced) is what the driver waits for, not a launch to start again.
fn live(view: &crate::session::SessionView, stored: SessionState) -> bool {
    view.agent_running
        || view.is_starting()
        || (view.phase == crate::session::Phase::Ended && stored == SessionState::Starting)
}

/// Whether some step of the workflow works in its workspace itself (no worktree): then
/// the workflow holds the workspace while it runs, as a live session does.
fn works_in_place(spec: &Spec) -> bool {
    spec.steps.iter().any(|step| step.worktree == WorktreeChoice::None)
}

/// The names a workspace goes by: as given, and canonical.
fn workspace_paths(workspace: &str) -> Vec<String> {
    let canonical = std::fs::canonicalize(workspace)
        .map_or_else(|_| workspace.to_owned(), |path| path.display().to_string());
    vec![workspace.to_owned(), canonical]
}

/// Waits until the store announces a change of workflow `id` (or announcements were
/// lost: then everything is read again anyway).
async fn changed(changes: &mut tokio::sync::broadcast::Receiver<WorkflowId>, id: &WorkflowId) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match changes.recv().await {
            Ok(changed) if changed == *id => return,
            Ok(_) => {}
            Err(RecvError::Lagged(_)) => return,
            Err(RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

/// What differs between two versions of a workflow file, said step by step, and the
/// steps that changed (or are new).
fn spec_changes(old: &Spec, new: &Spec) -> (Vec<String>, BTreeSet<String>) {
    let mut said = Vec::new();
    let mut changed = BTreeSet::new();
    if old.name != new.name {
        said.push(format!("name {:?} → {:?}", old.name, new.name));
    }
    for (name, value) in &new.vars {
        match old.vars.get(name) {
            None => said.push(format!("variable {name} added")),
            Some(before) if before != value => said.push(format!("variable {name} changed")),
            Some(_) => {}
        }
    }
    for step in &new.steps {
        match old.steps.iter().find(|s| s.id == step.id) {
            None => {
                said.push(format!("step {} added", step.id));
                changed.insert(step.id.clone());
            }
            Some(before) => {
                let mut fields = Vec::new();
                if before.agent != step.agent {
                    fields.push("agent");
                }
                if before.prompt != step.prompt {
                    fields.push("prompt");
                }
                if before.depends_on != step.depends_on {
                    fields.push("depends_on");
                }
                if fields.is_empty() && before != step {
                    fields.push("settings");
                }
                if !fields.is_empty() {
                    said.push(format!("step {}: {} changed", step.id, fields.join(", ")));
                    changed.insert(step.id.clone());
                }
            }
        }
    }
    for step in &old.steps {
        if !new.steps.iter().any(|s| s.id == step.id) {
            said.push(format!("step {} removed", step.id));
        }
    }
    // A changed variable changes every step that reads it: they all run again.
    let vars_changed: BTreeSet<&String> = new
        .vars
        .iter()
        .filter(|(name, value)| old.vars.get(*name) != Some(value))
        .map(|(name, _)| name)
        .collect();
    if !vars_changed.is_empty() {
        for step in &new.steps {
            if vars_changed.iter().any(|name| step.prompt.uses_var(name)) {
                changed.insert(step.id.clone());
            }
        }
    }
    if said.is_empty() {
        said.push("only its formatting or comments".into());
    }
    (said, changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(launch_failures: u32) -> StepRow {
        StepRow {
            step_id: "a".into(),
            position: 0,
            state: StepState::Running,
            iteration: 0,
            runs: 1,
            resends: 0,
            launch_failures,
            approved: false,
            applied: false,
            session_id: Some("s".into()),
            prompt: Some("a".into()),
            output: None,
            error: None,
            started_at: Some(1),
            ended_at: None,
            usage: None,
        }
    }

    /// The step's error when it fails, `None` when it is tried again.
    fn failed_with(launch_failures: u32, failure: &NotBroughtOn) -> Option<String> {
        match after_failure(&running(launch_failures), StepState::Running, 2, failure) {
            Action::Write { patches, state: None } => {
                assert!(patches[0].launch_failed && patches[0].state.is_none(), "{patches:?}");
                None
            }
            Action::Write { patches, state: Some((WorkflowState::Failed, _)) } => {
                patches[0].error.clone().flatten()
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_prompt_sent_again_is_tried_again_unless_no_retry_would_outlive_its_refusal() {
        let gone = || NotBroughtOn::Prompt(ServiceError::InvalidState("the agent is gone".into()));
        assert_eq!(failed_with(0, &gone()), None);
        assert_eq!(failed_with(1, &gone()), None);
        assert_eq!(
            failed_with(2, &gone()).as_deref(),
            Some("its prompt could not be sent again: the agent is gone")
        );
        // Refused again in the same session whatever the retries: it fails at once.
        let settings = NotBroughtOn::Prompt(ServiceError::SettingsNotRestored("model".into()));
        let too_long = NotBroughtOn::Prompt(ServiceError::InvalidParams {
            field: "prompt",
            message: "too long".into(),
        });
        for (failure, error) in [
            (settings, "its prompt could not be sent again: model"),
            (too_long, "its prompt could not be sent again: too long"),
        ] {
            assert_eq!(failed_with(0, &failure).as_deref(), Some(error));
        }
        let launch = NotBroughtOn::Launch(ServiceError::RuntimeUnavailable("no engine".into()));
        assert_eq!(
            failed_with(2, &launch).as_deref(),
            Some("its session could not launch: no engine")
        );
    }

    /// A failing launch's actor leaves its starting phase before it stores the failure:
    /// in between, the stored `STARTING` with an ended actor is not a launch to start again
    /// (that would count one failure twice); once `FAILED` is stored, it is not live.
    #[test]
    fn a_launch_that_is_failing_is_live_until_its_failure_is_stored() {
        use crate::session::{Phase, SessionView};
        let view = |phase: Phase, agent_running: bool| SessionView {
            state: SessionState::Starting,
            phase,
            agent_running,
            acp_session_id: None,
            error: None,
            turn_id: None,
            resume_outcome: None,
            pause_requested: false,
            context: None,
            settings_blocked: None,
        };
        assert!(live(&view(Phase::Launching, false), SessionState::Starting));
        assert!(live(&view(Phase::Launching, false), SessionState::Failed), "a resume starting");
        assert!(live(&view(Phase::Open, true), SessionState::WaitingForInput));
        assert!(live(&view(Phase::Ended, false), SessionState::Starting), "failing, not stored");
        assert!(!live(&view(Phase::Ended, false), SessionState::Failed));
        assert!(!live(&view(Phase::Idle, false), SessionState::WaitingForInput));
        assert!(!live(&view(Phase::Ended, false), SessionState::Completed));
    }
}
