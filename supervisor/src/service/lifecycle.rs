//! A session's life while it lasts: created (and its first prompt), its status, prompts,
//! resumes, cancel, pause and permission answers.

use super::{
    DEFAULT_PAUSE_WAIT_MS, Duration, Mark, NewSession, Path, PauseResult, Phase, ResumeResult,
    ServiceError, SessionError, SessionHandle, SessionRow, SessionState, SessionStatus,
    SessionView, SnapshotTrigger, Start, Supervisor, check_id, ensure_workspace, home, json_diff,
    resume_wait, runtime_kind, session, worktree,
};
use crate::ids::SessionId;

impl Supervisor {
    /// Refuses a directory the agent would be given (`field`) that is Tether's data
    /// directory, inside it, or around it: the agent would reach the store, the histories
    /// and the sidecars' tokens. `..` and symlinks are resolved first. One of the worktrees
    /// Tether made (a workflow's steps share one) is a project, not Tether's records.
    fn refuse_data_dir(&self, field: &'static str, dir: &Path) -> Result<(), ServiceError> {
        let home = self.config.home.root();
        let home = std::fs::canonicalize(home).unwrap_or_else(|_| home.to_owned());
        let Ok(dir) = std::fs::canonicalize(dir) else { return Ok(()) };
        let one_worktree = dir
            .strip_prefix(home.join("worktrees"))
            .is_ok_and(|rest| rest.components().next().is_some());
        let why = if home.starts_with(&dir) {
            "contains Tether's data directory"
        } else if dir.starts_with(&home) && !one_worktree {
            "lies in Tether's data directory"
        } else {
            return Ok(());
        };
        Err(ServiceError::InvalidParams {
            field,
            message: format!(
                "{field} {} {why} {}; the agent would reach the store, histories and tokens: point it at a project, or keep Tether's data elsewhere (TETHER_HOME)",
                dir.display(),
                home.display()
            ),
        })
    }

    /// Checks a new session's directories (absolute, existing, outside the data
    /// directory), its MCP servers (ACP's shape) and its workspace path.
    fn check_session_paths(
        &self,
        additional_directories: &[String],
        mcp_servers: &[serde_json::Value],
        workspace_path: Option<&str>,
    ) -> Result<(), ServiceError> {
        for directory in additional_directories {
            if !Path::new(directory).is_absolute() || !Path::new(directory).is_dir() {
                return Err(ServiceError::InvalidParams {
                    field: "additional_directories",
                    message: format!("{directory} is not an absolute path to a directory"),
                });
            }
            self.refuse_data_dir("additional_directories", Path::new(directory))?;
        }
        for (n, server) in mcp_servers.iter().enumerate() {
            if let Err(err) =
                serde_json::from_value::<protocol::acp::schema::McpServer>(server.clone())
            {
                return Err(ServiceError::InvalidParams {
                    field: "mcp_servers",
                    message: format!("mcp_servers[{n}] is not an ACP MCP server: {err}"),
                });
            }
        }
        if let Some(path) = workspace_path {
            let workspace = Path::new(path);
            if !workspace.is_absolute() {
                return Err(ServiceError::InvalidParams {
                    field: "workspace_path",
                    message: format!("workspace_path {path:?} must be absolute"),
                });
            }
            if !workspace.is_dir() {
                return Err(ServiceError::InvalidParams {
                    field: "workspace_path",
                    message: format!("workspace_path {path} is not a directory"),
                });
            }
            self.refuse_data_dir("workspace_path", workspace)?;
        }
        Ok(())
    }

    /// Makes a new session's worktree of the repository (`workspace_path`, else the
    /// profile's `workspace.repo`) on a branch of its own, from `base` (else the profile's,
    /// else `HEAD`).
    async fn make_worktree(
        &self,
        profile: &agents::profile::Profile,
        id: &crate::ids::SessionId,
        task_title: &str,
        workspace_path: Option<String>,
        base: Option<String>,
    ) -> Result<worktree::Worktree, ServiceError> {
        let agent_profile_id = &profile.id;
        let settings = profile.workspace.clone().unwrap_or_default();
        let repo = workspace_path.or(settings.repo).ok_or_else(|| {
            ServiceError::InvalidParams {
                field: "workspace_path",
                message: format!(
                    "a worktree session needs workspace_path (the repository): profile {agent_profile_id} names no workspace.repo"
                ),
            }
        })?;
        let repo = worktree::toplevel(Path::new(&repo)).await.map_err(|err| {
            ServiceError::InvalidParams { field: "workspace_path", message: err.to_string() }
        })?;
        let made = worktree::Worktree {
            repo,
            path: self.config.home.root().join("worktrees").join(id),
            branch: worktree::branch_name(task_title, id),
        };
        let base = base.or(settings.base).unwrap_or_else(|| "HEAD".to_owned());
        home::create_private_dir(&self.config.home.root().join("worktrees"))
            .map_err(|err| ServiceError::Storage(format!("the worktrees directory: {err}")))?;
        worktree::create(&made, &base).await.map_err(|err| match err {
            worktree::WorktreeError::BadBase { .. } => {
                ServiceError::InvalidParams { field: "base", message: err.to_string() }
            }
            other => ServiceError::InvalidState(other.to_string()),
        })?;
        tracing::info!(session = %id, branch = %made.branch, path = %made.path.display(), "made a worktree");
        // Killed here, the worktree has no session: recovery removes it.
        agentctl::fault::point("create.worktree_made");
        Ok(made)
    }

    /// A created session whose start was refused: nothing of it is left behind (no row
    /// stuck `CREATED`, no worktree, no files).
    async fn undo_create(&self, id: &crate::ids::SessionId, made: Option<&worktree::Worktree>) {
        self.event_logs.lock().expect("UNWRAP: never poisoned").remove(id);
        if let Err(undo) = self.config.store.delete_session(id.clone()).await {
            tracing::error!(session = %id, %undo, "cannot remove a session whose start failed");
        }
        if let Some(made) = made
            && let Err(undo) = worktree::remove(made, true, true).await
        {
            tracing::warn!(%undo, "cannot remove the worktree of a session not created");
        }
        let _ = std::fs::remove_dir_all(self.config.home.session_path(id));
    }

    /// `task.session.create`: records the session (and makes its worktree, when it has one)
    /// and starts its launch in the background.
    pub async fn create_session(&self, new: NewSession) -> Result<SessionRow, ServiceError> {
        let NewSession {
            task_id,
            agent_profile_id,
            workspace_path,
            prompt,
            runtime,
            shared,
            worktree,
            base,
            labels,
            workflow_step,
            mcp_servers,
            session_id,
            additional_directories,
        } = new;
        check_id("task_id", &task_id)?;
        if let Some(id) = &session_id {
            check_id("session_id", id.as_str())?;
            if self.config.store.get_session(id.clone()).await.is_ok() {
                return Err(ServiceError::Conflict(format!("a session {id} exists already")));
            }
        }
        self.check_session_paths(&additional_directories, &mcp_servers, workspace_path.as_deref())?;
        let profile = self.config.registry.get(&agent_profile_id).ok_or_else(|| {
            ServiceError::NotFound(format!("agent profile {agent_profile_id} not found"))
        })?;
        let reasons = self.unavailable(&profile, runtime.as_deref().unwrap_or(&profile.runtime));
        if !reasons.is_empty() {
            return Err(ServiceError::AgentUnavailable(format!(
                "agent {agent_profile_id} is not available: {}",
                reasons.join("; ")
            )));
        }
        let runtime = self.check_runtime(runtime.as_deref().unwrap_or(&profile.runtime)).await?;
        if !labels.is_empty() && !runtime.places_by_labels() {
            return Err(ServiceError::InvalidParams {
                field: "labels",
                message: format!(
                    "runtime {} does not place sessions by labels (docker does)",
                    runtime.name()
                ),
            });
        }
        let task = self.config.store.get_task(task_id.clone()).await?;
        let initial_prompt = prompt
            .or_else(|| (!task.description.trim().is_empty()).then(|| task.description.clone()));
        if initial_prompt.is_some() {
            // Its first prompt spends the task's budget, as any prompt does.
            self.task_within_budget(&task_id).await?;
        }
        let now = crate::store::now_ms();
        let id = session_id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string().into());
        // A worktree of its own: asked for, or the profile's default.
        let made = if worktree.unwrap_or(profile.workspace.is_some()) {
            Some(
                self.make_worktree(&profile, &id, &task.title, workspace_path.clone(), base)
                    .await?,
            )
        } else {
            None
        };
        let Some(workspace_path) =
            made.as_ref().map(|made| made.path.display().to_string()).or(workspace_path)
        else {
            return Err(ServiceError::InvalidParams {
                field: "workspace_path",
                message: "workspace_path is required (an absolute directory)".into(),
            });
        };
        let row = SessionRow {
            id,
            task_id,
            agent_profile_id,
            pinned_profile: serde_json::to_value(&*profile)
                .map_err(|err| ServiceError::Internal(err.to_string()))?,
            runtime: runtime.name().into(),
            state: SessionState::Created,
            workspace_path,
            error_message: None,
            created_at: now,
            updated_at: now,
            initial_prompt: initial_prompt.clone(),
            worktree_repo: made.as_ref().map(|made| made.repo.display().to_string()),
            worktree_branch: made.as_ref().map(|made| made.branch.clone()),
            runtime_labels: labels,
            mcp_servers,
            additional_directories,
            title: None,
        };
        // The start lock is held until the actor is in the table: a stop arriving as soon as
        // the row is stored (a workflow's step is visible from then) finds the actor.
        let guard = self.start_lock.lock().await;
        let created = self.record_session(row, shared, workflow_step).await;
        if created.is_err()
            && let Some(made) = &made
            && let Err(err) = worktree::remove(made, true, true).await
        {
            tracing::warn!(%err, "cannot remove the worktree of a session not created");
        }
        let row = created?;
        // Killed here, the session is stored `CREATED` and nothing of it started.
        agentctl::fault::point("create.recorded");
        let started = match self.event_log_above(&row.id, Some(0)).await {
            Ok(events) => self.context(&row).and_then(|context| {
                let start = Start::Fresh { initial_prompt };
                Ok(session::start_session(context, row.clone(), profile, events, start)?)
            }),
            Err(err) => Err(err),
        };
        match started {
            Ok(handle) => {
                self.sessions().insert(row.id.clone(), handle);
                drop(guard);
                Ok(row)
            }
            Err(err) => {
                self.undo_create(&row.id, made.as_ref()).await;
                Err(err)
            }
        }
    }

    /// Stores a new session, its workspace's occupancy checked; the caller holds the start
    /// lock (so two creates cannot both pass).
    pub(super) async fn record_session(
        &self,
        row: SessionRow,
        shared: bool,
        workflow_step: Option<(crate::ids::WorkflowId, crate::ids::StepId)>,
    ) -> Result<SessionRow, ServiceError> {
        if !shared {
            let canonical = std::fs::canonicalize(&row.workspace_path)
                .map_or_else(|_| row.workspace_path.clone(), |path| path.display().to_string());
            let paths = vec![row.workspace_path.clone(), canonical];
            if let Some((holder, state)) = self.config.store.workspace_holder(paths).await? {
                return Err(ServiceError::Conflict(format!(
                    "workspace {} is held by live session {holder} ({}); pass shared: true (CLI --shared) to share it, or end that session (stop)",
                    row.workspace_path,
                    state.as_str()
                )));
            }
            self.refuse_workflow_workspace(&row.workspace_path).await?;
        }
        match workflow_step {
            None => Ok(self.config.store.create_session(row).await?),
            Some((workflow, step)) => {
                if self.config.store.start_step(row.clone(), workflow.clone(), step.clone()).await?
                {
                    Ok(row)
                } else {
                    Err(ServiceError::Conflict(format!(
                        "step {step} of workflow {workflow} is no longer pending"
                    )))
                }
            }
        }
    }

    /// How the session's agent is confined, as its pinned profile says.
    fn confinement_of(&self, row: &SessionRow) -> Option<protocol::api::Confinement> {
        let profile = Supervisor::pinned_profile(row).ok()?;
        let container = profile.docker.runtime.as_deref();
        crate::sandbox::describe(&self.sandbox_of(&profile), &profile.env, &row.runtime, container)
    }

    /// `task.session.status`.
    pub async fn status(&self, session_id: SessionId) -> Result<SessionStatus, ServiceError> {
        let row = self.session_row(&session_id).await?;
        let (last_event_seq, kept_after_seq) = self
            .event_log(&session_id)
            .await
            .map_or((0, 0), |log| (log.last_seq(), log.acked_seq()));
        let execution = self.config.store.get_execution(session_id.clone()).await?;
        let generation = execution.as_ref().map_or(0, |e| u64::try_from(e.generation).unwrap_or(0));
        let handle = self.handle(&session_id);
        let view = handle.as_ref().map(SessionHandle::view);
        let running = view.as_ref().is_some_and(|view| view.agent_running);
        let phase = view.as_ref().map(|view| view.phase);
        let profile_drift = self.profile_drift(&row);
        let sandbox = self.confinement_of(&row);
        let open_questions = self
            .config
            .store
            .list_pending(session_id.clone())
            .await?
            .into_iter()
            .map(|(request_id, method, params)| protocol::api::OpenQuestion {
                request_id,
                params,
                method,
            })
            .collect();
        let paused = match row.state {
            SessionState::Paused => self.config.store.last_pause(session_id.clone()).await?,
            _ => None,
        };
        let usage = self.session_usage(&session_id, view.as_ref()).await?;
        let runtime = self.runtime(&row.runtime).ok();
        let runtime_handle = execution.as_ref().and_then(|e| e.runtime_handle.clone());
        let placement =
            runtime.as_ref().and_then(|runtime| runtime.placement(runtime_handle.as_ref()));
        let (mut is_resumable, needs_resume, mut reason) = if row.state.is_terminal() {
            (false, false, "terminal")
        } else if running {
            (true, false, "agent_running")
        } else if phase == Some(Phase::Reattaching) {
            (true, false, "reattaching")
        } else if row.state == SessionState::Failed {
            // Its last launch failed (the reason is in `error`): a resume tries again. (The
            // stored state decides: the actor's phase leaves the launch just after it.)
            (true, true, "failed")
        } else if view.as_ref().is_some_and(SessionView::is_starting)
            || row.state == SessionState::Starting
        {
            // Launching or opening: a resume now would only join it.
            (true, false, "starting")
        } else if row.state == SessionState::Created && handle.is_some() {
            (true, false, "not_started")
        } else if row.state == SessionState::Paused {
            // Why it paused, where that is more than asked for: `idle` (parked), `budget`,
            // `max_turns`, `max_duration`.
            let reason = match paused.as_ref().map(|paused| paused.trigger) {
                Some(
                    trigger @ (protocol::api::SnapshotTrigger::Idle
                    | protocol::api::SnapshotTrigger::Budget
                    | protocol::api::SnapshotTrigger::MaxTurns
                    | protocol::api::SnapshotTrigger::MaxDuration),
                ) => trigger.as_str(),
                _ => "paused",
            };
            (true, true, reason)
        } else if execution.as_ref().is_some_and(|e| e.resume_token.is_some()) {
            (true, true, "agent_not_running")
        } else if execution.is_some() {
            (true, true, "agent_not_running_fresh_start")
        } else {
            // Never launched (or cut short before its launch recorded anything): a resume
            // starts it, with the prompt it was created with.
            (true, true, "not_started")
        };
        let queue = self.config.store.prompt_queue(session_id.clone()).await?;
        let forked_from =
            self.config.store.fork_of(session_id.clone()).await?.map(|fork| fork.from);
        // A resume now would fail where it must run (its Docker engine is down): it is
        // `runtime_unavailable` until that place is back.
        let mut unreachable = None;
        if needs_resume
            && let Some(runtime) = &runtime
            && let Err(err) = runtime.reachable(runtime_handle.as_ref()).await
        {
            (is_resumable, reason) = (false, "runtime_unavailable");
            unreachable = Some(err.to_string());
        }
        let checkpoint = self.config.store.latest_checkpoint(session_id.clone()).await?;
        Ok(SessionStatus {
            session_id: session_id.into_string(),
            task_id: row.task_id,
            state: row.state,
            agent_profile_id: row.agent_profile_id,
            is_agent_running: running,
            is_resumable,
            needs_resume,
            resume_reason: reason.into(),
            acp_session_id: view
                .as_ref()
                .and_then(|view| view.acp_session_id.clone())
                .or(execution.and_then(|e| e.resume_token)),
            runtime: runtime_kind(&row.runtime),
            worktree_path: Some(row.workspace_path),
            worktree_branch: row.worktree_branch,
            // The actor's view is newer than the row when the store cannot be written.
            pause_requested: view.as_ref().is_some_and(|view| view.pause_requested),
            error: unreachable.or(view.and_then(|view| view.error)).or(row.error_message),
            last_event_seq,
            kept_after_seq,
            generation,
            profile_drift,
            placement,
            open_questions,
            paused_at: paused.as_ref().map(|paused| paused.at),
            paused_by: paused.as_ref().map(|paused| paused.trigger),
            pause_reason: paused.and_then(|paused| paused.reason),
            usage,
            queue,
            forked_from,
            sandbox,
            checkpoint,
        })
    }

    /// A session's usage: its turns' totals, its agent's context (live, else as of its
    /// newest turn) and its budgets.
    async fn session_usage(
        &self,
        session_id: &SessionId,
        view: Option<&SessionView>,
    ) -> Result<protocol::api::SessionUsage, ServiceError> {
        let store = &self.config.store;
        let filter = crate::store::UsageFilter {
            session_id: Some(session_id.clone()),
            ..Default::default()
        };
        let totals = store.usage(filter, None).await?.total;
        let context = match view.and_then(|view| view.context) {
            Some(context) => Some(context),
            None => store.last_context(session_id.clone()).await?,
        };
        Ok(protocol::api::SessionUsage {
            totals,
            context_used: context.map(|(used, _)| used),
            context_size: context.map(|(_, size)| size),
            context_percent: context
                .filter(|(_, size)| *size > 0)
                .map(|(used, size)| (used.saturating_mul(100) / size).min(100) as u8),
            budgets: store.budget_uses(session_id.clone()).await?,
        })
    }

    /// Refuses work for a session whose budget (or its task's) is used up.
    pub(crate) async fn within_budget(&self, session_id: &SessionId) -> Result<(), ServiceError> {
        let uses = self.config.store.budget_uses(session_id.clone()).await?;
        match uses.iter().find(|used| used.percent >= 100) {
            Some(used) => {
                let flag = match used.scope {
                    protocol::api::BudgetScope::Session => "session",
                    protocol::api::BudgetScope::Task => "task",
                };
                Err(ServiceError::BudgetExceeded(format!(
                    "{}; raise it with budget.set first (CLI: supervisor budget --{flag} {} \
                     --tokens N or --cost N)",
                    used.describe(),
                    used.id
                )))
            }
            None => Ok(()),
        }
    }

    /// `task.session.prompt`: starts a turn, or queues the prompt — behind the running
    /// turn, or while the session's agent is brought back for it (a lazy resume, not
    /// waited for: a launch that fails halts the queue, saying why). What can be known
    /// before a launch (the workspace, the runtime, the environment) is refused here.
    pub async fn prompt(
        &self,
        session_id: SessionId,
        prompt: String,
    ) -> Result<crate::session::Prompted, ServiceError> {
        let row = self.promptable_row(&session_id, &prompt).await?;
        let handle = match self.handle(&row.id).filter(SessionHandle::is_live) {
            Some(handle) if handle.view().is_ready() => handle,
            _ => {
                self.check_launchable(&row).await?;
                self.actor(&row).await?
            }
        };
        match handle.prompt(prompt.clone()).await {
            // No agent up, and a halted queue that would hold the prompt back: the agent
            // is brought back first, as a lazy resume always did.
            Err(SessionError::AgentGone(_)) => self.prompt_when_running(&row, prompt).await,
            Ok(prompted) => Ok(self.woken_for(&row, &handle, prompted)),
            Err(err) => Err(err.into()),
        }
    }

    /// [`Self::prompt`] for a workflow's step, whose driver learns a failed launch from
    /// the call: a session without an agent is resumed first, and waited for.
    pub(crate) async fn prompt_step(
        &self,
        session_id: SessionId,
        prompt: String,
    ) -> Result<crate::session::Prompted, ServiceError> {
        let row = self.promptable_row(&session_id, &prompt).await?;
        self.prompt_when_running(&row, prompt).await
    }

    /// The row of a session that takes `prompt`: not blank, not ended, within budget.
    async fn promptable_row(
        &self,
        session_id: &SessionId,
        prompt: &str,
    ) -> Result<SessionRow, ServiceError> {
        not_blank(prompt)?;
        let row = self.unended_row(session_id).await?;
        self.within_budget(session_id).await?;
        Ok(row)
    }

    /// Starts a turn (or queues the prompt behind the running one) once the session's
    /// agent runs: a session without one is resumed first, and waited for (workflow steps
    /// and prompts around a halted queue).
    async fn prompt_when_running(
        &self,
        row: &SessionRow,
        prompt: String,
    ) -> Result<crate::session::Prompted, ServiceError> {
        let handle = self.ensure_running(row).await?;
        let prompted = match handle.prompt(prompt.clone()).await {
            Err(SessionError::AgentGone(_)) => {
                // The execution vanished under us: resume once, retry once.
                let handle = self.ensure_running(row).await?;
                handle.prompt(prompt).await?
            }
            other => other?,
        };
        Ok(self.woken_for(row, &handle, prompted))
    }

    /// A prompt queued for an agent that is not up (`waking`) brings it back: a resume
    /// of the session's actor, in the background (the actor runs the queue once its
    /// agent is open, and halts it if the launch fails).
    fn woken_for(
        &self,
        row: &SessionRow,
        handle: &SessionHandle,
        prompted: crate::session::Prompted,
    ) -> crate::session::Prompted {
        if let crate::session::Prompted::Queued { waking: true, .. } = &prompted {
            let (handle, session) = (handle.clone(), row.id.clone());
            // Its outcome is the actor's to tell (events, status); the launch has its own
            // deadlines.
            tokio::spawn(async move {
                match handle.resume().await {
                    Ok(outcome) => tracing::debug!(%session, ?outcome, "woken for a queued prompt"),
                    Err(err) => tracing::info!(%session, %err, "not woken for a queued prompt"),
                }
            });
        }
        prompted
    }

    /// `task.session.steer`: the running turn is steered by its actor (see
    /// [`crate::session::Steer`]); with no turn running the text is a prompt.
    pub async fn steer(
        &self,
        session_id: SessionId,
        prompt: String,
    ) -> Result<protocol::api::Steered, ServiceError> {
        use protocol::api::{SteerMode, Steered};
        not_blank(&prompt)?;
        let row = self.unended_row(&session_id).await?;
        if let Some(handle) = self.handle(&row.id).filter(SessionHandle::is_live) {
            let steered = match handle.steer(prompt.clone()).await? {
                crate::session::Steer::Native(turn_id) => Some((SteerMode::Native, turn_id, None)),
                crate::session::Steer::Fallback { turn_id, prompt_id } => {
                    Some((SteerMode::Fallback, turn_id, Some(prompt_id)))
                }
                crate::session::Steer::NoTurn => None,
            };
            if let Some((mode, turn_id, prompt_id)) = steered {
                let position = prompt_id.is_some().then_some(1);
                let prompt_id = prompt_id.map(crate::ids::PromptId::into_string);
                return Ok(Steered {
                    mode,
                    turn_id: Some(turn_id.into_string()),
                    prompt_id,
                    position,
                });
            }
        }
        Ok(match self.prompt(session_id, prompt).await? {
            crate::session::Prompted::Started(turn_id) => Steered {
                mode: SteerMode::Prompt,
                turn_id: Some(turn_id.into_string()),
                prompt_id: None,
                position: None,
            },
            crate::session::Prompted::Queued { prompt_id, position, .. } => Steered {
                mode: SteerMode::Prompt,
                turn_id: None,
                prompt_id: Some(prompt_id.into_string()),
                position: Some(position),
            },
        })
    }

    /// The session's row; refused (`conflict`) once the session ended.
    pub(super) async fn unended_row(
        &self,
        session_id: &SessionId,
    ) -> Result<SessionRow, ServiceError> {
        let row = self.session_row(session_id).await?;
        if row.state.is_terminal() {
            return Err(ServiceError::Conflict(format!(
                "session {session_id} is {}",
                row.state.as_str()
            )));
        }
        Ok(row)
    }

    /// `task.session.queue.list`: the session's prompt queue (also of an ended session).
    pub async fn queue(
        &self,
        session_id: SessionId,
    ) -> Result<protocol::api::PromptQueue, ServiceError> {
        self.session_row(&session_id).await?;
        Ok(self.config.store.prompt_queue(session_id).await?)
    }

    /// `task.session.queue.edit`, `.remove`, `.clear` and `.resume`: made by the session's
    /// actor, the queue's one owner (started idle when none is live). Resuming a halted
    /// queue with prompts waiting brings the agent back when it is not running.
    pub async fn change_queue(
        &self,
        session_id: SessionId,
        change: crate::session::QueueChange,
    ) -> Result<protocol::api::PromptQueue, ServiceError> {
        if let crate::session::QueueChange::Edit { prompt: Some(prompt), .. } = &change {
            not_blank(prompt)?;
        }
        let row = self.unended_row(&session_id).await?;
        let resume = matches!(change, crate::session::QueueChange::Resume);
        let queue = self.actor(&row).await?.change_queue(change).await?;
        if resume && !queue.prompts.is_empty() && queue.halted.is_none() {
            self.within_budget(&session_id).await?;
            self.ensure_running(&row).await?;
        }
        Ok(queue)
    }

    /// A live actor whose agent runs: resumes the session if needed and waits for it.
    pub(super) async fn ensure_running(
        &self,
        row: &SessionRow,
    ) -> Result<SessionHandle, ServiceError> {
        // Checked before an actor is started: a new one begins its launch at once.
        let live = self.handle(&row.id).filter(SessionHandle::is_live);
        if live.is_none_or(|handle| !handle.view().is_ready()) {
            self.check_launchable(row).await?;
        }
        let handle = self.actor(row).await?;
        if handle.view().is_ready() {
            return Ok(handle);
        }
        let wait = resume_wait(&*Supervisor::pinned_profile(row)?);
        let outcome = tokio::time::timeout(wait, handle.resume()).await.map_err(|_| {
            ServiceError::RuntimeUnavailable(format!(
                "session {} did not become ready in time",
                row.id
            ))
        })?;
        outcome?;
        Ok(handle)
    }

    /// What a launch needs that can be known before it: the workspace, the environment a
    /// root daemon's agent needs, the session's runtime.
    pub(super) async fn check_launchable(&self, row: &SessionRow) -> Result<(), ServiceError> {
        ensure_workspace(row).await?;
        self.check_root_env(row)?;
        self.check_session_runtime(row).await
    }

    /// The session's actor, starting one (idle, ready to resume) if none is live.
    pub(super) async fn actor(&self, row: &SessionRow) -> Result<SessionHandle, ServiceError> {
        self.actor_started(row).await.map(|(handle, _)| handle)
    }

    /// The session's live actor, or a new one that begins a resume at once (with the
    /// profile pinned now); whether it is new.
    pub(super) async fn actor_started(
        &self,
        row: &SessionRow,
    ) -> Result<(SessionHandle, bool), ServiceError> {
        let _guard = self.start_lock.lock().await;
        if let Some(handle) = self.handle(&row.id).filter(SessionHandle::is_live) {
            return Ok((handle, false));
        }
        // Read again under the lock: a cleanup or delete may have removed it, or a stop
        // ended it, since the caller read it.
        let row = &self.session_row(&row.id).await?;
        if row.state.is_terminal() {
            return Err(ServiceError::Conflict(format!(
                "session {} is {}",
                row.id,
                row.state.as_str()
            )));
        }
        let profile = Supervisor::pinned_profile(row)?;
        let handle = session::start_session(
            self.context(row)?,
            row.clone(),
            profile,
            self.event_log(&row.id).await?,
            Start::Resume,
        )?;
        self.sessions().insert(row.id.clone(), handle.clone());
        Ok((handle, true))
    }

    /// `task.session.resume`: one launch per session however many callers; every caller
    /// gets its outcome.
    pub async fn resume(
        &self,
        session_id: SessionId,
        refresh_profile: bool,
    ) -> Result<ResumeResult, ServiceError> {
        let mut row = self.session_row(&session_id).await?;
        if row.state.is_terminal() {
            return Err(ServiceError::Conflict(format!(
                "session {session_id} is {} and cannot be resumed",
                row.state.as_str()
            )));
        }
        if row.state == SessionState::Paused {
            // A session paused by its budget stays paused until the budget is raised.
            self.within_budget(&session_id).await?;
        }
        let profile_drift = self.profile_drift(&row);
        // Read before the agent is back (it may change the workspace at once).
        let git_drift = self.git_drift(&row).await;
        // Adopting today's profile: refused while the agent runs (it runs with the old
        // one); otherwise stored first, so a restart launches with it too.
        let refresh = if refresh_profile && !profile_drift.is_empty() {
            let current = self.config.registry.get(&row.agent_profile_id).ok_or_else(|| {
                ServiceError::InvalidState(format!(
                    "agent profile {} no longer exists; the session keeps the profile it pinned",
                    row.agent_profile_id
                ))
            })?;
            let running = self.handle(&row.id).is_some_and(|handle| {
                let view = handle.view();
                handle.is_live() && (view.agent_running || view.is_starting())
            });
            if running {
                return Err(ServiceError::InvalidState(format!(
                    "session {session_id}'s agent is running with its pinned profile; pause the session (or stop-all) first, then resume with refresh_profile"
                )));
            }
            let pinned = serde_json::to_value(&*current)
                .map_err(|err| ServiceError::Internal(err.to_string()))?;
            self.config.store.set_pinned_profile(row.id.clone(), pinned.clone()).await?;
            row.pinned_profile = pinned;
            tracing::info!(session = %session_id, fields = ?profile_drift, "adopting the current profile");
            Some(current)
        } else {
            None
        };
        // Checked before an actor is started: a new one begins its launch at once.
        let live = self.handle(&row.id).filter(SessionHandle::is_live);
        if live.is_none_or(|handle| !handle.view().agent_running) {
            ensure_workspace(&row).await?;
            self.check_root_env(&row)?;
            self.check_session_runtime(&row).await?;
        }
        let (handle, started) = self.actor_started(&row).await?;
        let profile_refreshed = refresh.is_some();
        let wait = match &refresh {
            Some(profile) => resume_wait(profile),
            None => resume_wait(&*Supervisor::pinned_profile(&row)?),
        };
        let resumed = async {
            match refresh {
                // A new actor resumes with the profile just pinned: it is joined, not
                // asked again (it is launching, and would refuse a refresh).
                Some(profile) if !started => handle.resume_with(profile).await,
                _ => handle.resume().await,
            }
        };
        let outcome = tokio::time::timeout(wait, resumed)
            .await
            .map_err(|_| {
                ServiceError::RuntimeUnavailable(format!(
                    "session {session_id} did not become ready in time"
                ))
            })?
            .map_err(ServiceError::from)
            .map_err(|err| {
                // A launch that failed with a stale pinned profile: say how to adopt the profile.
                if profile_refreshed || profile_drift.is_empty() {
                    return err;
                }
                err.with_hint(&format!(
                    "; the session runs its pinned profile, which differs from profile {} as it is now ({}): resume with refresh_profile (CLI: resume --refresh-profile) to adopt it",
                    row.agent_profile_id,
                    profile_drift.join(", ")
                ))
            })?;
        let view = handle.view();
        Ok(ResumeResult {
            session_id: session_id.into_string(),
            outcome,
            state: view.state,
            is_agent_running: view.agent_running,
            acp_session_id: view.acp_session_id,
            error: view.error,
            profile_drift,
            profile_refreshed,
            git_drift,
        })
    }

    /// How the workspace of a session whose agent is not running changed since its last
    /// snapshot, when it did (logged: someone worked in it meanwhile).
    async fn git_drift(&self, row: &SessionRow) -> Option<protocol::api::GitDrift> {
        let running = self.handle(&row.id).is_some_and(|handle| handle.view().agent_running);
        if running {
            return None;
        }
        let snapshot = self.config.store.latest_snapshot(row.id.clone()).await.ok()??;
        let dir = std::path::Path::new(&row.workspace_path);
        let drift = crate::snapshot::git::drift(dir, &snapshot.git, &snapshot.snapshot_id).await?;
        tracing::info!(session = %row.id, snapshot = %snapshot.snapshot_id, files = drift.changed_files.len(), head_moved = drift.head_before != drift.head_now, "the workspace changed since the session's last snapshot");
        Some(drift)
    }

    /// Where a session's pinned profile differs from the profile as it is now: dotted
    /// field names (`profile` when it no longer exists). Both sides go through the profile
    /// type, so a field added since the profile was pinned (with its default) is no drift.
    pub(super) fn profile_drift(&self, row: &SessionRow) -> Vec<String> {
        let Some(current) = self.config.registry.get(&row.agent_profile_id) else {
            return vec!["profile".into()];
        };
        let (Ok(then), Ok(now)) = (
            Supervisor::pinned_profile(row).and_then(|profile| {
                serde_json::to_value(&*profile)
                    .map_err(|err| ServiceError::Internal(err.to_string()))
            }),
            serde_json::to_value(&*current),
        ) else {
            return Vec::new();
        };
        let mut fields = Vec::new();
        json_diff("", &then, &now, &mut fields);
        // Where it was loaded from is not part of what it does.
        fields.retain(|field| field != "source" && !field.starts_with("source."));
        fields
    }

    /// `task.session.cancel`: cancels the running turn; a `PAUSED` session (no turn) is
    /// ended `CANCELLED`.
    pub async fn cancel(&self, session_id: SessionId) -> Result<(), ServiceError> {
        let row = self.session_row(&session_id).await?;
        if row.state == SessionState::Paused {
            return self.end(row, SessionState::Cancelled).await;
        }
        Ok(self.live(&session_id).await?.cancel().await?)
    }

    /// `task.session.pause`: at the next turn boundary (see [`SessionHandle::pause`]).
    pub async fn pause(
        &self,
        session_id: SessionId,
        reason: Option<String>,
        force_after_ms: Option<u64>,
    ) -> Result<PauseResult, ServiceError> {
        let row = self.session_row(&session_id).await?;
        if row.state.is_terminal() {
            return Err(ServiceError::Conflict(format!(
                "session {session_id} is {} and cannot be paused",
                row.state.as_str()
            )));
        }
        if row.state == SessionState::Failed {
            return Err(ServiceError::InvalidState(format!(
                "session {session_id} is FAILED: no agent runs to pause (resume it, or stop it)"
            )));
        }
        if row.state == SessionState::Paused {
            return Err(ServiceError::InvalidState(format!(
                "session {session_id} is already PAUSED"
            )));
        }
        let force_after = Duration::from_millis(force_after_ms.unwrap_or(DEFAULT_PAUSE_WAIT_MS));
        let handle = {
            let _guard = self.start_lock.lock().await;
            match self.handle(&session_id).filter(SessionHandle::is_live) {
                Some(handle) => handle,
                None => {
                    // No actor, so no agent: nothing to stop or wait for.
                    let snapshot_id = self
                        .pause_without_agent(
                            &row,
                            reason.clone(),
                            false,
                            SnapshotTrigger::Pause,
                            None,
                        )
                        .await?;
                    let state = SessionState::Paused;
                    return Ok(PauseResult {
                        session_id: session_id.into_string(),
                        state,
                        pause_requested: false,
                        snapshot_id,
                    });
                }
            }
        };
        let (pause_requested, snapshot_id) = match handle.pause(reason, force_after).await? {
            crate::session::PauseTaken::Waits => (true, None),
            crate::session::PauseTaken::Paused { snapshot_id } => (false, snapshot_id),
        };
        let state = handle.view().state;
        Ok(PauseResult {
            session_id: session_id.into_string(),
            state,
            pause_requested,
            snapshot_id,
        })
    }

    /// Pauses a session that has no actor (its agent is not running): the events are
    /// published, then the store says `PAUSED` (and forgets the pause request). Returns
    /// the pause's snapshot, when one was taken.
    pub(super) async fn pause_without_agent(
        &self,
        row: &SessionRow,
        reason: Option<String>,
        forced: bool,
        trigger: SnapshotTrigger,
        summary_asked_at: Option<i64>,
    ) -> Result<Option<String>, ServiceError> {
        use crate::snapshot::summary;
        let history = self.config.home.session(&row.id).history();
        let summary = match summary_asked_at {
            Some(at) => summary::answer_of(&self.config.store, row.id.clone(), history, at).await,
            None => {
                let wanted =
                    Supervisor::pinned_profile(row).is_ok_and(|p| p.session.summarize_on_pause);
                summary::not_asked(wanted, "no agent was running")
            }
        };
        let request = crate::snapshot::Request {
            summary: Some(summary),
            ..self.snapshot_request(&row.id, trigger, reason.clone())
        };
        let record = self.record(&row.id).await?;
        Ok(record.pause(request, reason, trigger, forced, Mark::default()).await?)
    }

    /// What a snapshot of a session that has no live agent is taken from.
    pub(super) fn snapshot_request(
        &self,
        session_id: &SessionId,
        trigger: SnapshotTrigger,
        reason: Option<String>,
    ) -> crate::snapshot::Request {
        crate::snapshot::Request {
            session_id: session_id.clone(),
            trigger,
            reason,
            history: self.config.home.session(session_id).history(),
            execution_id: None,
            usage: None,
            summary: None,
            taken_at: None,
        }
    }

    /// Takes a snapshot of a session that has no live agent; its id, or `None` (logged)
    /// when it could not be taken.
    pub(super) async fn snapshot_now(
        &self,
        session_id: &SessionId,
        trigger: SnapshotTrigger,
        reason: Option<String>,
    ) -> Option<String> {
        let request = self.snapshot_request(session_id, trigger, reason);
        match crate::snapshot::take(&self.config.store, request).await {
            Ok(snapshot) => Some(snapshot.snapshot_id),
            Err(err) => {
                tracing::warn!(session = %session_id, %err, "cannot take a snapshot");
                None
            }
        }
    }

    /// `task.session.elicitation.respond`: the agent gets an ACP `CreateElicitationResponse`.
    pub async fn respond_elicitation(
        &self,
        session_id: SessionId,
        request_id: String,
        action: protocol::api::params::ElicitationAnswer,
        content: Option<serde_json::Map<String, serde_json::Value>>,
    ) -> Result<(), ServiceError> {
        use protocol::api::params::ElicitationAnswer;
        let result = match action {
            ElicitationAnswer::Accept => match content {
                Some(content) => serde_json::json!({"action": "accept", "content": content}),
                None => serde_json::json!({"action": "accept"}),
            },
            ElicitationAnswer::Decline => serde_json::json!({"action": "decline"}),
            ElicitationAnswer::Cancel => serde_json::json!({"action": "cancel"}),
        };
        Ok(self.live(&session_id).await?.respond_elicitation(request_id, result).await?)
    }

    /// `task.session.permission.respond`: `option_id` selects an option; `None` cancels.
    pub async fn respond_permission(
        &self,
        session_id: SessionId,
        request_id: String,
        option_id: Option<String>,
    ) -> Result<(), ServiceError> {
        let outcome = match option_id {
            Some(option_id) => serde_json::json!({"outcome": "selected", "optionId": option_id}),
            None => serde_json::json!({"outcome": "cancelled"}),
        };
        Ok(self.live(&session_id).await?.respond_permission(request_id, outcome).await?)
    }
}

/// Refuses a blank prompt (`invalid_params`).
fn not_blank(prompt: &str) -> Result<(), ServiceError> {
    if prompt.trim().is_empty() {
        return Err(ServiceError::InvalidParams {
            field: "prompt",
            message: "prompt must not be empty".into(),
        });
    }
    Ok(())
}
