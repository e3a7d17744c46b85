//! The supervisor's operations, independent of the wire: tasks, sessions and their actors,
//! agents. The API module maps these to JSON-RPC; tests and the CLI reach them through it.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentctl::spool::{Spool, SpoolReader};
use agents::profile::Profile;
use agents::registry::{Environment, Registry};
use serde::Serialize;
use serde_json::Value;

use crate::events::SessionEvent;
use crate::events::SessionEventKind;
use crate::history::{self, HistoryEntry};
use crate::home::{self, Home};
use crate::runtime::{FenceTarget, Liveness, Runtime, Runtimes};
use crate::session::record::{Mark, RecordError, SessionRecord};
use crate::session::{
    self, AdoptPlan, Phase, SessionContext, SessionError, SessionHandle, SessionView, Start,
};
use crate::store::{ExecutorStatus, SessionRow, SessionState, Store, StoreError, Task};
use crate::wire::runtime_kind;
use crate::worktree;
use protocol::api::{
    AgentInfo, CleanedSession, CleanupResult, ErrorKind, ExecutionInfo, KeptSession, PauseResult,
    ResumeResult, SessionStatus, Snapshot, SnapshotSummary, SnapshotTrigger, TaskDetail, Timeline,
    TimelineEntry, TurnInfo,
};

/// Which sessions `sessions.cleanup` removes (also the daemon's automatic policy).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupPolicy {
    /// Sessions whose last change is older than this many days (0: any age).
    pub max_age_days: u32,
    /// Only these states (else any state at rest).
    pub states: Option<Vec<SessionState>>,
    /// Spare `COMPLETED` sessions.
    pub keep_completed: bool,
    /// Remove nothing; report what would go.
    pub dry_run: bool,
    /// Remove worktrees with uncommitted work too.
    pub force: bool,
}

/// What `task.session.create` asks for.
#[derive(Debug, Clone, Default)]
pub struct NewSession {
    /// The task.
    pub task_id: String,
    /// The agent profile.
    pub agent_profile_id: String,
    /// The workspace; for a worktree session, the repository (else the profile's).
    pub workspace_path: Option<String>,
    /// The first prompt (else the task's description).
    pub prompt: Option<String>,
    /// A registered runtime's name (else the profile's).
    pub runtime: Option<String>,
    /// Share a workspace held by a live session.
    pub shared: bool,
    /// A worktree of its own (else: whether the profile has `[workspace]`).
    pub worktree: Option<bool>,
    /// The worktree's base branch or commit (else the profile's, else `HEAD`).
    pub base: Option<String>,
    /// Placement labels asked for (the profile's `[docker] labels` are added at launch).
    pub labels: std::collections::BTreeMap<String, String>,
}

/// Errors of the operations, each with the `data.kind` the API reports.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// No such task, session or request.
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with the session's state (e.g. it has ended).
    #[error("{0}")]
    Conflict(String),
    /// A param is invalid; `field` names it.
    #[error("{message}")]
    InvalidParams {
        /// The field.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// Not possible in the current state (e.g. a prompt during a turn).
    #[error("{0}")]
    InvalidState(String),
    /// The agent cannot be launched here.
    #[error("{0}")]
    AgentUnavailable(String),
    /// The runtime cannot launch anything.
    #[error("{0}")]
    RuntimeUnavailable(String),
    /// Anything else.
    #[error("{0}")]
    Internal(String),
}

impl ServiceError {
    /// The same error (same kind), its message followed by `hint`.
    pub fn with_hint(self, hint: &str) -> ServiceError {
        match self {
            ServiceError::NotFound(m) => ServiceError::NotFound(m + hint),
            ServiceError::Conflict(m) => ServiceError::Conflict(m + hint),
            ServiceError::InvalidParams { field, message } => {
                ServiceError::InvalidParams { field, message: message + hint }
            }
            ServiceError::InvalidState(m) => ServiceError::InvalidState(m + hint),
            ServiceError::AgentUnavailable(m) => ServiceError::AgentUnavailable(m + hint),
            ServiceError::RuntimeUnavailable(m) => ServiceError::RuntimeUnavailable(m + hint),
            ServiceError::Internal(m) => ServiceError::Internal(m + hint),
        }
    }

    /// The `data.kind` of the error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ServiceError::NotFound(_) => ErrorKind::NotFound,
            ServiceError::Conflict(_) => ErrorKind::Conflict,
            ServiceError::InvalidParams { .. } => ErrorKind::InvalidParams,
            ServiceError::InvalidState(_) => ErrorKind::InvalidState,
            ServiceError::AgentUnavailable(_) => ErrorKind::AgentUnavailable,
            ServiceError::RuntimeUnavailable(_) => ErrorKind::RuntimeUnavailable,
            ServiceError::Internal(_) => ErrorKind::Internal,
        }
    }
}

impl From<StoreError> for ServiceError {
    fn from(err: StoreError) -> ServiceError {
        match err {
            StoreError::NotFound { .. } => ServiceError::NotFound(err.to_string()),
            other => ServiceError::Internal(other.to_string()),
        }
    }
}

impl From<RecordError> for ServiceError {
    fn from(err: RecordError) -> ServiceError {
        match err {
            RecordError::Store(err) => err.into(),
            other => ServiceError::Internal(other.to_string()),
        }
    }
}

impl From<SessionError> for ServiceError {
    fn from(err: SessionError) -> ServiceError {
        match err {
            SessionError::Terminal(_) => ServiceError::Conflict(err.to_string()),
            SessionError::InvalidState(_) | SessionError::Gone | SessionError::AgentGone(_) => {
                ServiceError::InvalidState(err.to_string())
            }
            SessionError::InvalidParams { field, .. } => {
                ServiceError::InvalidParams { field, message: err.to_string() }
            }
            SessionError::NoSuchRequest(_) => ServiceError::NotFound(err.to_string()),
            SessionError::Store(store) => store.into(),
            SessionError::Agentctl(_) | SessionError::Undelivered(_) => {
                ServiceError::RuntimeUnavailable(err.to_string())
            }
        }
    }
}

/// Settings for [`Supervisor::new`].
pub struct SupervisorConfig {
    /// The data directory.
    pub home: Home,
    /// The store.
    pub store: Store,
    /// The profiles.
    pub registry: Registry,
    /// Where programs are found.
    pub environment: Environment,
    /// The runtimes, by name.
    pub runtimes: Runtimes,
    /// Applets embedded in this binary (`mock-agent` → `[exe, "mock-agent"]`), used when
    /// no program of that name is installed.
    pub applets: HashMap<String, Vec<OsString>>,
    /// How much of each session's event log is kept.
    pub event_log: crate::events::LogLimits,
}

/// The supervisor's state: shared by every API connection.
pub struct Supervisor {
    config: SupervisorConfig,
    /// Live (and ended, until deleted) sessions. A std mutex: map lookups only.
    sessions: Mutex<HashMap<String, SessionHandle>>,
    /// Each session's event log, opened once per process and shared with its actor (two
    /// writers on one spool would corrupt it).
    event_logs: Mutex<HashMap<String, Arc<Spool<SessionEvent>>>>,
    /// Launches, retires and fences in flight (see [`Supervisor::shutdown`]).
    teardowns: tokio_util::task::TaskTracker,
    /// Serialises "is there a live actor, else start one", so one session gets one actor
    /// and one launch however many resumes and prompts race.
    start_lock: tokio::sync::Mutex<()>,
    /// Resolves program names; one shared by every session.
    resolver: session::Resolver,
}

impl Supervisor {
    /// A supervisor over an opened store and home.
    pub fn new(config: SupervisorConfig) -> Supervisor {
        let resolver = Supervisor::resolver(&config);
        Supervisor {
            config,
            sessions: Mutex::new(HashMap::new()),
            event_logs: Mutex::new(HashMap::new()),
            teardowns: tokio_util::task::TaskTracker::new(),
            start_lock: tokio::sync::Mutex::new(()),
            resolver,
        }
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, SessionHandle>> {
        self.sessions.lock().expect("UNWRAP: never poisoned")
    }

    /// Resolves a program name to the argv prefix that runs it: an installed program, or
    /// an applet of this binary.
    fn resolver(config: &SupervisorConfig) -> session::Resolver {
        let environment = config.environment.clone();
        let applets = config.applets.clone();
        Arc::new(move |name| {
            environment
                .find_program(name)
                .map(|path| vec![path.into_os_string()])
                .or_else(|| applets.get(name).cloned())
        })
    }

    /// Why `profile` cannot be launched here, on `runtime` (empty when it can).
    fn unavailable(&self, profile: &Profile, runtime: &str) -> Vec<String> {
        let availability = if self.sandboxed(runtime) && self.config.environment.root {
            // In a container the agent is sandboxed: its root_env is set there.
            let environment = Environment { root: false, ..self.config.environment.clone() };
            agents::registry::availability(profile, &environment)
        } else {
            agents::registry::availability(profile, &self.config.environment)
        };
        let applet =
            availability.program.is_none() && self.config.applets.contains_key(&profile.command[0]);
        // The program reason comes first; an applet stands in for a missing program.
        availability.reasons.into_iter().skip(usize::from(applet)).collect()
    }

    /// A session's agent needs, run as root on this host, variables that are not set (its
    /// profile's `root_env`): it would exit at once, so it is not launched.
    fn check_root_env(&self, row: &SessionRow) -> Result<(), ServiceError> {
        if self.sandboxed(&row.runtime) {
            // The agent's environment is the container's.
            return Ok(());
        }
        let profile = Supervisor::snapshot(row)?;
        match agents::registry::root_env_lacking(&profile, &self.config.environment) {
            None => Ok(()),
            Some(reason) => Err(ServiceError::AgentUnavailable(format!(
                "agent {} cannot start here: {reason}",
                row.agent_profile_id
            ))),
        }
    }

    /// Whether the runtime of that name runs agents in a sandbox of their own (a home
    /// that is not the supervisor's).
    fn sandboxed(&self, runtime: &str) -> bool {
        self.runtime(runtime).is_ok_and(|runtime| runtime.agent_home().is_some())
    }

    /// The runtime of that name.
    fn runtime(&self, name: &str) -> Result<Arc<dyn Runtime>, ServiceError> {
        self.config.runtimes.get(name).ok_or_else(|| ServiceError::InvalidParams {
            field: "runtime",
            message: format!(
                "unknown runtime {name:?} (this daemon has {})",
                self.config.runtimes.names().join(", ")
            ),
        })
    }

    async fn check_runtime(&self, name: &str) -> Result<Arc<dyn Runtime>, ServiceError> {
        let runtime = self.runtime(name)?;
        runtime.check().await.map_err(|err| ServiceError::RuntimeUnavailable(err.to_string()))?;
        Ok(runtime)
    }

    /// Whether a session can be launched where it must run: on the place its last
    /// execution ran when the runtime keeps it there (a Docker engine), else anywhere the
    /// runtime can launch. Checked before an actor starts, so a session whose engine is
    /// down stays as it is and the caller gets `runtime_unavailable`.
    async fn check_session_runtime(&self, row: &SessionRow) -> Result<(), ServiceError> {
        let runtime = self.runtime(&row.runtime)?;
        let executor = self.config.store.get_executor(row.id.clone()).await?;
        let handle = executor.and_then(|executor| executor.runtime_handle);
        runtime
            .reachable(handle.as_ref())
            .await
            .map_err(|err| ServiceError::RuntimeUnavailable(err.to_string()))
    }

    fn context(&self, row: &SessionRow) -> Result<SessionContext, ServiceError> {
        let session_id = row.id.as_str();
        let dir = self
            .config
            .home
            .session_dir(session_id)
            .map_err(|err| ServiceError::Internal(err.to_string()))?;
        Ok(SessionContext {
            store: self.config.store.clone(),
            runtime: self.runtime(&row.runtime)?,
            dir,
            resolve: Arc::clone(&self.resolver),
            agent_home: self.agent_home(),
            ready_timeout: Duration::from_secs(30),
            agent_state_root: self.config.home.agent_state(session_id),
            connector: Arc::new(session::control::WsConnector),
            event_log_retain_bytes: self.config.event_log.retain_bytes,
            teardowns: self.teardowns.clone(),
        })
    }

    /// Waits, at most `bound`, for the launches, retires and fences in flight (a shutdown
    /// must not abandon a sidecar half started or half stopped); how many were waited for.
    pub async fn shutdown(&self, bound: Duration) -> usize {
        let pending = self.teardowns.len();
        self.teardowns.close();
        if tokio::time::timeout(bound, self.teardowns.wait()).await.is_err() {
            tracing::warn!(
                pending = self.teardowns.len(),
                "shutdown: teardowns still in flight after {bound:?}"
            );
        }
        pending
    }

    /// The session's event log (opened, or reopened after a restart).
    fn event_log(&self, session_id: &str) -> Result<Arc<Spool<SessionEvent>>, ServiceError> {
        let mut logs = self.event_logs.lock().expect("UNWRAP: never poisoned");
        if let Some(log) = logs.get(session_id) {
            return Ok(Arc::clone(log));
        }
        let dir = self.config.home.session(session_id).events();
        let log =
            Arc::new(Spool::open(&dir, self.config.event_log.segment_bytes).map_err(|err| {
                ServiceError::Internal(format!("the event log of {session_id}: {err}"))
            })?);
        logs.insert(session_id.to_owned(), Arc::clone(&log));
        Ok(log)
    }

    /// The profile a session started with (its snapshot), not today's.
    fn snapshot(row: &SessionRow) -> Result<Arc<Profile>, ServiceError> {
        serde_json::from_value(row.profile_snapshot.clone()).map(Arc::new).map_err(|err| {
            ServiceError::Internal(format!("the profile snapshot of {}: {err}", row.id))
        })
    }

    fn agent_home(&self) -> PathBuf {
        std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| self.config.home.root().to_owned())
    }

    /// `agents.list`: every profile, then every user profile file that does not load.
    pub fn agents(&self) -> Vec<AgentInfo> {
        let catalog = self.config.registry.catalog();
        let valid = catalog.profiles().map(|profile| {
            let reasons = self.unavailable(profile, &profile.runtime);
            AgentInfo {
                id: profile.id.clone(),
                display_name: profile.display_name.clone(),
                available: reasons.is_empty(),
                reasons,
                native_resume: profile.session.native_resume,
                restore_method: profile.session.restore_method.map(crate::wire::restore_method),
                resume_command: profile.relaunches_to_resume(),
                history_injection: profile.injects_history(false),
                invalid: false,
            }
        });
        let invalid = catalog.errors().iter().map(|error| {
            let name = match &error.file {
                agents::profile::ProfileSource::File(path) => path
                    .file_name()
                    .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into()),
                source => source.to_string(),
            };
            AgentInfo {
                id: name.clone(),
                display_name: name,
                available: false,
                reasons: vec![error.to_string()],
                native_resume: None,
                restore_method: None,
                resume_command: false,
                history_injection: false,
                invalid: true,
            }
        });
        valid.chain(invalid).collect()
    }

    /// `task.create`.
    pub async fn create_task(
        &self,
        title: String,
        description: String,
    ) -> Result<Task, ServiceError> {
        if title.trim().is_empty() {
            return Err(ServiceError::InvalidParams {
                field: "title",
                message: "title must not be empty".into(),
            });
        }
        Ok(self.config.store.create_task(title, description).await?)
    }

    /// `task.list`.
    pub async fn list_tasks(&self) -> Result<Vec<Task>, ServiceError> {
        Ok(self.config.store.list_tasks().await?)
    }

    /// `task.get`.
    pub async fn get_task(&self, task_id: String) -> Result<TaskDetail, ServiceError> {
        check_id("task_id", &task_id)?;
        let task = self.config.store.get_task(task_id.clone()).await?;
        let sessions = self.config.store.list_sessions(Some(task_id)).await?;
        Ok(TaskDetail {
            task: task.into(),
            sessions: sessions.into_iter().map(Into::into).collect(),
        })
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
        } = new;
        check_id("task_id", &task_id)?;
        if let Some(path) = &workspace_path {
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
        }
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
        let now = crate::store::now_ms();
        let id = uuid::Uuid::now_v7().to_string();
        // A worktree of its own: asked for, or the profile's default.
        let made = if worktree.unwrap_or(profile.workspace.is_some()) {
            let settings = profile.workspace.clone().unwrap_or_default();
            let repo = workspace_path.clone().or(settings.repo).ok_or_else(|| {
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
                path: self.config.home.root().join("worktrees").join(&id),
                branch: worktree::branch_name(&task.title, &id),
            };
            let base = base.or(settings.base).unwrap_or_else(|| "HEAD".to_owned());
            home::create_private_dir(&self.config.home.root().join("worktrees"))
                .map_err(|err| ServiceError::Internal(format!("worktrees dir: {err}")))?;
            worktree::create(&made, &base).await.map_err(|err| match err {
                worktree::WorktreeError::BadBase { .. } => {
                    ServiceError::InvalidParams { field: "base", message: err.to_string() }
                }
                other => ServiceError::InvalidState(other.to_string()),
            })?;
            tracing::info!(session = %id, branch = %made.branch, path = %made.path.display(), "made a worktree");
            // Killed here, the worktree has no session: recovery removes it.
            agentctl::fault::point("create.worktree_made");
            Some(made)
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
            profile_snapshot: serde_json::to_value(&*profile)
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
        };
        let created = self.record_session(row, shared).await;
        if created.is_err()
            && let Some(made) = &made
            && let Err(err) = worktree::remove(made, true, true).await
        {
            tracing::warn!(%err, "cannot remove the worktree of a session not created");
        }
        let row = created?;
        // Killed here, the session is stored `CREATED` and nothing of it started.
        agentctl::fault::point("create.recorded");
        let started = self.context(&row).and_then(|context| {
            let events = self.event_log(&row.id)?;
            let start = Start::Fresh { initial_prompt };
            Ok(session::start_session(context, row.clone(), profile, events, start)?)
        });
        match started {
            Ok(handle) => {
                self.sessions().insert(row.id.clone(), handle);
                Ok(row)
            }
            Err(err) => {
                // Refused: nothing of it is left behind (no row stuck `CREATED`).
                self.event_logs.lock().expect("UNWRAP: never poisoned").remove(&row.id);
                if let Err(undo) = self.config.store.delete_session(row.id.clone()).await {
                    tracing::error!(session = %row.id, %undo, "cannot remove a session whose start failed");
                }
                if let Some(made) = &made
                    && let Err(undo) = worktree::remove(made, true, true).await
                {
                    tracing::warn!(%undo, "cannot remove the worktree of a session not created");
                }
                let _ = std::fs::remove_dir_all(self.config.home.session_path(&row.id));
                Err(err)
            }
        }
    }

    /// Stores a new session, its workspace's occupancy checked and taken under the start
    /// lock (so two creates cannot both pass).
    async fn record_session(
        &self,
        row: SessionRow,
        shared: bool,
    ) -> Result<SessionRow, ServiceError> {
        let _guard = self.start_lock.lock().await;
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
        }
        Ok(self.config.store.create_session(row).await?)
    }

    fn handle(&self, session_id: &str) -> Option<SessionHandle> {
        self.sessions().get(session_id).cloned()
    }

    async fn session_row(&self, session_id: &str) -> Result<SessionRow, ServiceError> {
        check_id("session_id", session_id)?;
        Ok(self.config.store.get_session(session_id.to_owned()).await?)
    }

    /// A live actor for a session that is not terminal.
    async fn live(&self, session_id: &str) -> Result<SessionHandle, ServiceError> {
        let row = self.session_row(session_id).await?;
        if row.state.is_terminal() {
            return Err(ServiceError::Conflict(format!(
                "session {session_id} is {}",
                row.state.as_str()
            )));
        }
        self.handle(session_id).filter(SessionHandle::is_live).ok_or_else(|| {
            ServiceError::InvalidState(format!(
                "session {session_id} has no live agent (resume it first)"
            ))
        })
    }

    /// `task.session.status`.
    pub async fn status(&self, session_id: String) -> Result<SessionStatus, ServiceError> {
        let row = self.session_row(&session_id).await?;
        let last_event_seq = self.event_log(&session_id).map_or(0, |log| log.last_seq());
        let executor = self.config.store.get_executor(session_id.clone()).await?;
        let generation = executor.as_ref().map_or(0, |e| u64::try_from(e.generation).unwrap_or(0));
        let handle = self.handle(&session_id);
        let view = handle.as_ref().map(SessionHandle::view);
        let running = view.as_ref().is_some_and(|view| view.agent_running);
        let phase = view.as_ref().map(|view| view.phase);
        let profile_drift = self.profile_drift(&row);
        let runtime = self.runtime(&row.runtime).ok();
        let runtime_handle = executor.as_ref().and_then(|e| e.runtime_handle.clone());
        let placement =
            runtime.as_ref().and_then(|runtime| runtime.placement(runtime_handle.as_ref()));
        let (mut is_resumable, needs_resume, mut reason) = if row.state.is_terminal() {
            (false, false, "terminal")
        } else if running {
            (true, false, "agent_running")
        } else if phase == Some(Phase::Adopting) {
            (true, false, "reattaching")
        } else if view.as_ref().is_some_and(SessionView::is_starting)
            || row.state == SessionState::Starting
        {
            // Launching or opening: a resume now would only join it.
            (true, false, "starting")
        } else if row.state == SessionState::Created && handle.is_some() {
            (true, false, "not_started")
        } else if row.state == SessionState::Paused {
            (true, true, "paused")
        } else if row.state == SessionState::Failed {
            // Its last launch failed (the reason is in `error`): a resume tries again.
            (true, true, "failed")
        } else if executor.as_ref().is_some_and(|e| e.resume_token.is_some()) {
            (true, true, "agent_not_running")
        } else if executor.is_some() {
            (true, true, "agent_not_running_fresh_start")
        } else {
            // Never launched (or cut short before its launch recorded anything): a resume
            // starts it, with the prompt it was created with.
            (true, true, "not_started")
        };
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
        Ok(SessionStatus {
            session_id,
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
                .or(executor.and_then(|e| e.resume_token)),
            runtime: runtime_kind(&row.runtime),
            worktree_path: Some(row.workspace_path),
            worktree_branch: row.worktree_branch,
            // The actor's view is newer than the row when the store cannot be written.
            pause_requested: view.as_ref().is_some_and(|view| view.pause_requested),
            error: unreachable.or(view.and_then(|view| view.error)).or(row.error_message),
            last_event_seq,
            generation,
            profile_drift,
            placement,
        })
    }

    /// `task.session.prompt`: starts a turn; returns its id.
    pub async fn prompt(&self, session_id: String, prompt: String) -> Result<String, ServiceError> {
        if prompt.trim().is_empty() {
            return Err(ServiceError::InvalidParams {
                field: "prompt",
                message: "prompt must not be empty".into(),
            });
        }
        let row = self.session_row(&session_id).await?;
        if row.state.is_terminal() {
            return Err(ServiceError::Conflict(format!(
                "session {session_id} is {}",
                row.state.as_str()
            )));
        }
        // Lazily: a session without a live agent is resumed first (and waited for).
        let handle = self.ensure_running(&row).await?;
        match handle.prompt(prompt.clone()).await {
            Err(SessionError::AgentGone(_)) => {
                // The execution vanished under us: resume once, retry once.
                let handle = self.ensure_running(&row).await?;
                Ok(handle.prompt(prompt).await?)
            }
            other => Ok(other?),
        }
    }

    /// A live actor whose agent runs: resumes the session if needed and waits for it.
    async fn ensure_running(&self, row: &SessionRow) -> Result<SessionHandle, ServiceError> {
        // Checked before an actor is started: a new one begins its launch at once.
        let live = self.handle(&row.id).filter(SessionHandle::is_live);
        if live.is_none_or(|handle| !handle.view().is_ready()) {
            ensure_workspace(row).await?;
            self.check_root_env(row)?;
            self.check_session_runtime(row).await?;
        }
        let handle = self.actor(row).await?;
        if handle.view().is_ready() {
            return Ok(handle);
        }
        let outcome = tokio::time::timeout(RESUME_WAIT, handle.resume()).await.map_err(|_| {
            ServiceError::RuntimeUnavailable(format!(
                "session {} did not become ready in time",
                row.id
            ))
        })?;
        outcome?;
        Ok(handle)
    }

    /// The session's actor, starting one (idle, ready to resume) if none is live.
    async fn actor(&self, row: &SessionRow) -> Result<SessionHandle, ServiceError> {
        self.actor_started(row).await.map(|(handle, _)| handle)
    }

    /// The session's live actor, or a new one that begins a resume at once (with the
    /// snapshot stored now); whether it is new.
    async fn actor_started(&self, row: &SessionRow) -> Result<(SessionHandle, bool), ServiceError> {
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
        let profile = Supervisor::snapshot(row)?;
        let handle = session::start_session(
            self.context(row)?,
            row.clone(),
            profile,
            self.event_log(&row.id)?,
            Start::Resume,
        )?;
        self.sessions().insert(row.id.clone(), handle.clone());
        Ok((handle, true))
    }

    /// `task.session.resume`: one launch per session however many callers; every caller
    /// gets its outcome.
    pub async fn resume(
        &self,
        session_id: String,
        refresh_profile: bool,
    ) -> Result<ResumeResult, ServiceError> {
        let mut row = self.session_row(&session_id).await?;
        if row.state.is_terminal() {
            return Err(ServiceError::Conflict(format!(
                "session {session_id} is {} and cannot be resumed",
                row.state.as_str()
            )));
        }
        let profile_drift = self.profile_drift(&row);
        // Adopting today's profile: refused while the agent runs (it runs with the old
        // one); otherwise stored first, so a restart launches with it too.
        let refresh = if refresh_profile && !profile_drift.is_empty() {
            let current = self.config.registry.get(&row.agent_profile_id).ok_or_else(|| {
                ServiceError::InvalidState(format!(
                    "agent profile {} no longer exists; the session keeps its snapshot",
                    row.agent_profile_id
                ))
            })?;
            let running = self.handle(&row.id).is_some_and(|handle| {
                let view = handle.view();
                handle.is_live() && (view.agent_running || view.is_starting())
            });
            if running {
                return Err(ServiceError::InvalidState(format!(
                    "session {session_id}'s agent is running with its profile snapshot; pause the session (or stop-all) first, then resume with refresh_profile"
                )));
            }
            let snapshot = serde_json::to_value(&*current)
                .map_err(|err| ServiceError::Internal(err.to_string()))?;
            self.config.store.set_profile_snapshot(row.id.clone(), snapshot.clone()).await?;
            row.profile_snapshot = snapshot;
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
        let resumed = async {
            match refresh {
                // A new actor resumes with the snapshot just stored: it is joined, not
                // asked again (it is launching, and would refuse a refresh).
                Some(profile) if !started => handle.resume_with(profile).await,
                _ => handle.resume().await,
            }
        };
        let outcome = tokio::time::timeout(RESUME_WAIT, resumed)
            .await
            .map_err(|_| {
                ServiceError::RuntimeUnavailable(format!(
                    "session {session_id} did not become ready in time"
                ))
            })?
            .map_err(ServiceError::from)
            .map_err(|err| {
                // A launch that failed with a stale snapshot: say how to adopt the profile.
                if profile_refreshed || profile_drift.is_empty() {
                    return err;
                }
                err.with_hint(&format!(
                    "; the session runs its profile snapshot, which differs from profile {} as it is now ({}): resume with refresh_profile (CLI: resume --refresh-profile) to adopt it",
                    row.agent_profile_id,
                    profile_drift.join(", ")
                ))
            })?;
        let view = handle.view();
        Ok(ResumeResult {
            session_id,
            outcome,
            state: view.state,
            is_agent_running: view.agent_running,
            acp_session_id: view.acp_session_id,
            error: view.error,
            profile_drift,
            profile_refreshed,
        })
    }

    /// Where a session's profile snapshot differs from the profile as it is now: dotted
    /// field names (`profile` when it no longer exists). Both sides go through the profile
    /// type, so a field added since the snapshot was taken (with its default) is no drift.
    fn profile_drift(&self, row: &SessionRow) -> Vec<String> {
        let Some(current) = self.config.registry.get(&row.agent_profile_id) else {
            return vec!["profile".into()];
        };
        let (Ok(then), Ok(now)) = (
            Supervisor::snapshot(row).and_then(|profile| {
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

    /// Stops every live agent and its sidecar; the sessions stay resumable. Then every
    /// recorded execution of an active session is fenced, so a sidecar that no actor owns
    /// (whatever happened to it) is gone too. Returns how many agents were stopped.
    pub async fn stop_all(&self) -> usize {
        let handles: Vec<SessionHandle> =
            self.sessions().values().filter(|handle| handle.is_live()).cloned().collect();
        let mut stopped = 0;
        for handle in handles {
            let running = handle.view().agent_running;
            if handle.detach().await.is_ok() && running {
                stopped += 1;
            }
        }
        match self.config.store.active_executions().await {
            Ok(executions) => {
                for (row, executor) in executions {
                    if let Err(err) = self.fence(&row, Some(executor)).await {
                        tracing::error!(session = %row.id, %err, "cannot fence a sidecar");
                    }
                }
            }
            Err(err) => tracing::error!(%err, "cannot list executions to fence"),
        }
        // And whatever a teardown cut short left behind.
        self.sweep_leaked_sidecars().await;
        stopped
    }

    /// Kills whatever sidecar of the session still lives (see [`crate::runtime::Runtime::fence`]).
    async fn fence(
        &self,
        row: &SessionRow,
        executor: Option<crate::store::ExecutorRow>,
    ) -> Result<(), ServiceError> {
        let runtime = self.runtime(&row.runtime)?;
        let state_dir = self
            .config
            .home
            .session_dir(&row.id)
            .map(|dir| crate::home::SessionPaths::new(dir).agentctl())
            .map_err(|err| ServiceError::Internal(err.to_string()))?;
        let target = FenceTarget {
            session_id: row.id.clone(),
            state_dir,
            executor,
            grace: std::time::Duration::ZERO,
        };
        runtime
            .fence(&target)
            .await
            .map_err(|err| ServiceError::RuntimeUnavailable(err.to_string()))
    }

    /// Restart recovery (DESIGN §7). Serves at once: live sidecars are re-attached in the
    /// background (status says `reattaching` meanwhile), and a summary is logged when every
    /// re-attach has settled. Dead sidecars are fenced (a stray one is killed) and what
    /// they leave behind is marked and published. One bad row is reported and skipped; it
    /// never stops the daemon. No agent is launched.
    pub async fn recover(&self) -> Result<RecoverySummary, ServiceError> {
        let mut summary = RecoverySummary::default();
        let mut adopting = Vec::new();
        let boot_id = agentctl::ready::boot_id().unwrap_or_default();
        // Sessions at rest — stopped, nothing open, no sidecar of theirs alive — need
        // nothing: one scan of the processes and one indexed query leave them out unread,
        // so a restart does not grow with the number of stored sessions.
        let (sidecar_pids, sidecar_dirs) = crate::runtime::live_sidecars();
        let live_sessions: Vec<String> = sidecar_dirs
            .iter()
            .filter_map(|dir| self.config.home.session_of_agentctl(dir))
            .collect();
        // The runtime whose sidecars the process scan finds (the standalone one).
        let local = self.config.runtimes.local().map_or("", |runtime| runtime.name());
        let (candidates, active) =
            self.config.store.recovery_candidates(local, &sidecar_pids, live_sessions).await?;
        let examined = candidates.len();
        let mut to_recover = Vec::new();
        for candidate in candidates {
            if self.at_rest(&candidate, &sidecar_pids, &sidecar_dirs) {
                summary.at_rest += 1;
            } else {
                to_recover.push(candidate);
            }
        }
        // Liveness, asked of each runtime once for all its executions (one call per Docker
        // engine, not an inspect per container).
        let mut by_runtime: HashMap<String, Vec<crate::store::ExecutorRow>> = HashMap::new();
        for candidate in &to_recover {
            let executor = &candidate.executor;
            by_runtime.entry(executor.runtime.clone()).or_default().push(executor.clone());
        }
        let mut liveness: HashMap<String, Liveness> = HashMap::new();
        for (name, executors) in &by_runtime {
            if let Some(runtime) = self.config.runtimes.get(name) {
                liveness.extend(runtime.liveness(executors, &boot_id).await);
            }
        }
        for candidate in to_recover {
            let executor = candidate.executor;
            let row = match self.config.store.get_session(executor.session_id.clone()).await {
                Ok(row) => row,
                Err(err) => {
                    summary.skipped += 1;
                    tracing::error!(session = %executor.session_id, %err, "cannot read this session for recovery; skipped");
                    continue;
                }
            };
            let session_id = row.id.clone();
            let (kept_row, kept_executor) = (row.clone(), executor.clone());
            let found = liveness.remove(&session_id).unwrap_or(Liveness::Dead);
            match self.recover_one(row, executor, found, &mut summary).await {
                Ok(Some(view)) => adopting.push(view),
                Ok(None) => {}
                Err(err) => {
                    // Whatever it was, no sidecar of it may run on unowned.
                    if let Err(fence) = self.fence(&kept_row, Some(kept_executor)).await {
                        tracing::error!(session = %session_id, %fence, "cannot fence a skipped session's sidecar");
                    }
                    summary.skipped += 1;
                    tracing::error!(session = %session_id, %err, "cannot recover this session; skipped");
                    let message = format!("recovery skipped this session: {err}");
                    let _ = self
                        .config
                        .store
                        .set_session_state(
                            session_id,
                            SessionState::WaitingForInput,
                            Some(message),
                            None,
                        )
                        .await;
                }
            }
        }
        // A session caught before its first launch recorded anything: whatever its runtime
        // may have started is fenced (found through its state dir or container name), and it
        // waits for input instead of reading `STARTING` forever.
        // A pause asked for before the restart, whose session has no agent any more (it was
        // found dead): nothing is left to wait for.
        for (session_id, request) in self.config.store.pauses().await? {
            let adopting_it = self.handle(&session_id).is_some_and(|handle| handle.is_live());
            if adopting_it {
                continue;
            }
            match self.config.store.get_session(session_id.clone()).await {
                Ok(row) if row.state.is_active() => {
                    if let Err(err) =
                        self.pause_without_agent(&row, request.reason, false, request.trigger).await
                    {
                        tracing::error!(session = %session_id, %err, "cannot pause a session at recovery");
                    }
                }
                _ => {}
            }
        }
        let stranded = self.config.store.stranded_sessions().await?;
        // Those the query left out are at rest too.
        summary.at_rest += active.saturating_sub(examined + stranded.len());
        for row in stranded {
            if let Err(err) = self.fence(&row, None).await {
                tracing::error!(session = %row.id, %err, "cannot fence a stranded session's sidecar");
            }
            let reason = "the supervisor stopped while this session was starting; prompt or resume it to go on";
            let state = SessionEventKind::State {
                state: SessionState::WaitingForInput,
                error: Some(reason.into()),
            };
            if let Err(err) = self.publish_recovery(&row.id, vec![state]) {
                tracing::error!(session = %row.id, %err, "cannot publish a stranded session's state");
            }
            self.config
                .store
                .set_session_state(
                    row.id.clone(),
                    SessionState::WaitingForInput,
                    Some(reason.into()),
                    None,
                )
                .await?;
            summary.dead += 1;
        }
        // Sidecars a teardown cut short left running (a stop, delete or failed launch
        // killed halfway), whatever their session's state, go.
        summary.orphans_removed += self.sweep_leaked_sidecars().await;
        // And the rest of such a teardown: what the sidecar spooled is recorded, the turn
        // ends.
        for row in self.config.store.ended_with_open_work().await? {
            match self.finish_teardown(row.clone()).await {
                Ok(Some(view)) => adopting.push(view),
                Ok(None) => summary.interrupted += 1,
                Err(err) => {
                    summary.skipped += 1;
                    tracing::error!(session = %row.id, %err, "cannot finish a stopped session's teardown");
                }
            }
        }
        // Worktrees made for a session that was never stored (killed mid-create) go.
        summary.orphans_removed += self.remove_orphaned_worktrees().await;
        // Containers of ours whose session is gone are removed (on every engine there).
        summary.orphans_removed += self.remove_orphaned_runtime_resources().await;
        let counted = [
            ("reattaching", adopting.len()),
            ("at_rest", summary.at_rest),
            ("dead", summary.dead),
            ("interrupted", summary.interrupted),
            ("approvals_restored", summary.approvals_restored),
            ("approvals_cancelled", summary.approvals_cancelled),
            ("orphans_removed", summary.orphans_removed),
            ("skipped", summary.skipped),
        ];
        for (outcome, count) in counted {
            let family = &crate::metrics::get().recovery;
            family.get_or_create(&crate::metrics::label("outcome", outcome)).inc_by(count as u64);
        }
        tracing::info!(
            reattaching = adopting.len(),
            at_rest = summary.at_rest,
            dead = summary.dead,
            interrupted = summary.interrupted,
            approvals_restored = summary.approvals_restored,
            approvals_cancelled = summary.approvals_cancelled,
            orphans_removed = summary.orphans_removed,
            skipped = summary.skipped,
            "recovery: serving; re-attaching in the background"
        );
        // The summary of the re-attaches, counted once each has settled (connected or not).
        tokio::spawn(async move {
            let (mut readopted, mut failed) = (0, 0);
            for mut view in adopting {
                let settled = view.wait_for(|view| view.phase != Phase::Adopting).await;
                match settled {
                    Ok(view) if view.agent_running || view.phase == Phase::Open => readopted += 1,
                    _ => failed += 1,
                }
            }
            tracing::info!(readopted, failed, "recovery: re-attaching done");
        });
        Ok(summary)
    }

    /// Kills every sidecar no actor owns that a cut-short teardown left running: those of
    /// executions not marked over whose session is at rest (stopped, paused, failed,
    /// cancelled), on any runtime, and every local agentctl serving a session dir under
    /// this home whose session has no live actor (or is not stored at all). Returns how
    /// many were found.
    async fn sweep_leaked_sidecars(&self) -> usize {
        let mut swept = 0;
        let owned =
            |session_id: &str| self.handle(session_id).is_some_and(|handle| handle.is_live());
        match self.config.store.unfinished_executions_at_rest().await {
            Ok(executions) => {
                for (row, executor) in executions {
                    if owned(&row.id) {
                        continue;
                    }
                    let execution_id = executor.execution_id.clone();
                    match self.fence(&row, Some(executor)).await {
                        Ok(()) => {
                            let dead = ExecutorStatus::Dead;
                            let _ = self
                                .config
                                .store
                                .set_executor_status(row.id.clone(), execution_id, dead)
                                .await;
                            swept += 1;
                        }
                        Err(err) => {
                            tracing::warn!(session = %row.id, %err, "cannot fence a sidecar left by a teardown")
                        }
                    }
                }
            }
            Err(err) => tracing::warn!(%err, "cannot list the executions left by teardowns"),
        }
        for (pid, dir) in crate::runtime::local_sidecars() {
            let Some(session_id) = self.config.home.session_of_agentctl(&dir) else { continue };
            if owned(&session_id) {
                continue;
            }
            tracing::warn!(session = %session_id, pid, "killing a sidecar that no session owns");
            match crate::runtime::kill_local_sidecar(pid, &dir).await {
                Ok(()) => swept += 1,
                Err(err) => {
                    tracing::warn!(session = %session_id, pid, %err, "cannot kill a sidecar no session owns")
                }
            }
        }
        swept
    }

    /// Removes our containers (stopped ones too) whose session is not stored; how many.
    /// Only the sessions the containers name are looked up.
    /// Worktrees under `$TETHER_HOME/worktrees/` whose session is not stored: made by a
    /// create that was killed before it stored the session. One with uncommitted work is
    /// kept (and said); its branch is kept either way.
    async fn remove_orphaned_worktrees(&self) -> usize {
        let dir = self.config.home.root().join("worktrees");
        let Ok(entries) = std::fs::read_dir(&dir) else { return 0 };
        let ids: Vec<String> = entries
            .flatten()
            .filter_map(|entry| entry.file_name().to_str().map(str::to_owned))
            .filter(|name| home::is_valid_id(name))
            .collect();
        let known = match self.config.store.existing_sessions(ids.clone()).await {
            Ok(known) => known,
            Err(err) => {
                tracing::warn!(%err, "cannot check the worktrees for orphans");
                return 0;
            }
        };
        let mut removed = 0;
        for id in ids.into_iter().filter(|id| !known.contains(id)) {
            let path = dir.join(&id);
            match worktree::orphan(&path).await {
                Ok(made) => match worktree::remove(&made, false, false).await {
                    Ok(()) => {
                        tracing::info!(path = %path.display(), branch = %made.branch, "removed a worktree whose session was never stored");
                        removed += 1;
                    }
                    Err(err) => {
                        tracing::warn!(path = %path.display(), %err, "an orphaned worktree is kept")
                    }
                },
                Err(err) => {
                    tracing::warn!(path = %path.display(), %err, "an orphaned worktree is kept")
                }
            }
        }
        removed
    }

    /// Removes what each runtime runs for this installation whose session is not stored
    /// (on every engine that answers); how many. Only the sessions named are looked up.
    async fn remove_orphaned_runtime_resources(&self) -> usize {
        let mut removed = 0;
        for runtime in self.config.runtimes.all() {
            let scan = runtime.orphans().await;
            for place in &scan.unreachable {
                tracing::warn!(runtime = runtime.name(), %place, "not searched for orphans");
            }
            let named = scan.found.iter().map(|orphan| orphan.session_id.clone()).collect();
            let known = match self.config.store.existing_sessions(named).await {
                Ok(known) => known,
                Err(err) => {
                    tracing::warn!(%err, "cannot check for orphans");
                    continue;
                }
            };
            for orphan in scan.found.iter().filter(|orphan| !known.contains(&orphan.session_id)) {
                match runtime.remove_orphan(orphan).await {
                    Ok(()) => removed += 1,
                    Err(err) => {
                        tracing::warn!(location = %orphan.location, %err, "cannot remove an orphan")
                    }
                }
            }
        }
        removed
    }

    /// A session recovery can leave as it is: standalone, waiting for input, its execution
    /// over, no turn running or request pending, and no live agentctl that is its recorded
    /// one or serves its state dir.
    fn at_rest(
        &self,
        candidate: &crate::store::RecoveryCandidate,
        sidecar_pids: &std::collections::HashSet<u32>,
        sidecar_dirs: &std::collections::HashSet<std::path::PathBuf>,
    ) -> bool {
        let executor = &candidate.executor;
        let recorded_alive = executor
            .agentctl_pid
            .and_then(|pid| u32::try_from(pid).ok())
            .is_some_and(|pid| sidecar_pids.contains(&pid));
        let local = self.config.runtimes.local().map(|runtime| runtime.name());
        local == Some(candidate.runtime.as_str())
            && local == Some(executor.runtime.as_str())
            && candidate.state == SessionState::WaitingForInput
            && executor.status.is_over()
            && !candidate.open_work
            && !recorded_alive
            && (sidecar_dirs.is_empty()
                || !sidecar_dirs
                    .contains(&self.config.home.session(&executor.session_id).agentctl()))
    }

    /// Starts an actor that re-attaches (to a live sidecar, or to a dead one's spool) at
    /// recovery; returns a watch on its view.
    fn start_adopting(
        &self,
        row: &SessionRow,
        profile: Arc<Profile>,
        plan: AdoptPlan,
    ) -> Result<tokio::sync::watch::Receiver<SessionView>, ServiceError> {
        let handle = session::start_session(
            self.context(row)?,
            row.clone(),
            profile,
            self.event_log(&row.id)?,
            Start::Adopt(Box::new(plan)),
        )?;
        let view = handle.watch();
        self.sessions().insert(row.id.clone(), handle);
        Ok(view)
    }

    /// Finishes the teardown of a session stopped (or cancelled) by a stop that a kill cut
    /// short: when its sidecar's spool holds what was never recorded, an actor replays it
    /// (its turn ends there; returns its view); else its open turns and questions end now.
    async fn finish_teardown(
        &self,
        row: SessionRow,
    ) -> Result<Option<tokio::sync::watch::Receiver<SessionView>>, ServiceError> {
        let store = &self.config.store;
        let reason = "the session was stopped";
        let executor = store.get_executor(row.id.clone()).await?;
        if let Some(executor) = executor.filter(|executor| self.unrecorded_leftovers(executor)) {
            let open_turns =
                store.open_turns(row.id.clone(), executor.execution_id.clone()).await?;
            let addr = executor.endpoint();
            let plan = AdoptPlan { executor, addr, open_turns, gone: true };
            return self.start_adopting(&row, Supervisor::snapshot(&row)?, plan).map(Some);
        }
        self.void_open_work(&row.id, reason, Vec::new()).await?;
        Ok(None)
    }

    /// Ends what a session without an agent left open, as recovery finds it: each running
    /// turn `interrupted` with `reason`, each question void, published (with `then` after
    /// them) before the store changes. Returns how many turns and questions there were.
    async fn void_open_work(
        &self,
        session_id: &str,
        reason: &str,
        then: Vec<SessionEventKind>,
    ) -> Result<(usize, usize), ServiceError> {
        let record = self.record(session_id)?;
        record.void_open_work(reason, then, Mark::default()).await.map_err(ServiceError::from)
    }

    /// Whether a dead execution's spool holds events that are not in the session's
    /// history or event log (past what each had recorded of that execution, and past
    /// what was acknowledged).
    fn unrecorded_leftovers(&self, executor: &crate::store::ExecutorRow) -> bool {
        // Before its ACP session opened an execution holds nothing of the conversation
        // (a load's replay is acknowledged before the open is recorded): nothing to record.
        if executor.acp_session_id.is_none() {
            return false;
        }
        let paths = self.config.home.session(&executor.session_id);
        let last = session::leftover_seq(&paths.agentctl(), executor);
        if last <= executor.acked_seq.max(0) as u64 {
            return false;
        }
        let generation = executor.generation;
        let history_mark = crate::history::History::open(&paths.history())
            .map_or(0, |history| history.mark_for(generation));
        let events_mark =
            self.record(&executor.session_id).map_or(0, |record| record.events_mark(generation));
        last > history_mark.min(events_mark)
    }

    /// Publishes what recovery found on a session's stream, in one append. The events
    /// carry no agentctl mark: no agent event caused them.
    fn publish_recovery(
        &self,
        session_id: &str,
        kinds: Vec<SessionEventKind>,
    ) -> Result<(), ServiceError> {
        self.record(session_id)?
            .publish(kinds, Mark::default())
            .map_err(|err| ServiceError::Internal(format!("publishing recovery events: {err}")))
    }

    /// The record of a session (its event log and open-work rows), for recovery and the
    /// paths that change a session without its actor.
    fn record(&self, session_id: &str) -> Result<SessionRecord, ServiceError> {
        let log = self.event_log(session_id)?;
        Ok(SessionRecord::new(session_id.to_owned(), self.config.store.clone(), log))
    }

    /// Recovers one session: returns a watch on its view when it is being re-attached.
    async fn recover_one(
        &self,
        row: SessionRow,
        executor: crate::store::ExecutorRow,
        liveness: Liveness,
        summary: &mut RecoverySummary,
    ) -> Result<Option<tokio::sync::watch::Receiver<SessionView>>, ServiceError> {
        // A runtime this daemon does not have: reported, and the session skipped.
        self.runtime(&executor.runtime)?;
        let recorded_live = !executor.status.is_over();
        // A session caught mid-launch or mid-handshake cannot pick up where it was (the
        // handshake's requests are gone with the old process): it is fenced and resumed
        // later like a dead one. An execution recorded `running` finished its handshake
        // (that is recorded when the ACP session opens, before the session's state): caught
        // between the two, it is re-attached and its state completed, not killed — its
        // `WAITING_FOR_INPUT` may already have been published.
        let handshake_done = executor.status == ExecutorStatus::Running;
        let mut unreachable = None;
        let alive = recorded_live
            && (row.state != SessionState::Starting || handshake_done)
            && match &liveness {
                Liveness::Alive => true,
                Liveness::Dead => false,
                Liveness::Stale(why) => {
                    // Fenced below like a dead one; the session resumes afresh.
                    tracing::warn!(session = %row.id, %why, "a container of a stale generation is not re-adopted");
                    false
                }
                Liveness::Unreachable(why) => {
                    unreachable = Some(why.clone());
                    false
                }
            };
        // Dead (or not to be trusted): make sure. Where it ran cannot be reached (an engine
        // is down): it cannot be fenced now — the next launch fences it on that engine
        // before anything starts — and the session waits, `runtime_unavailable`, until the
        // engine is back.
        if !alive && unreachable.is_none() {
            self.fence(&row, Some(executor.clone())).await?;
        }
        // A dead sidecar whose spool holds what was never recorded (the supervisor died
        // with it, or while reading it): the spool is replayed like a live re-attach's,
        // then the execution is lost — whatever reached a spool is recorded once.
        let gone = !alive && unreachable.is_none() && self.unrecorded_leftovers(&executor);
        if alive || gone {
            // Where the runtime said agentctl listens, as stored (issue 17).
            let addr = executor.endpoint();
            let open_turns =
                self.config.store.open_turns(row.id.clone(), executor.execution_id.clone()).await?;
            summary.approvals_restored +=
                self.config.store.list_pending(row.id.clone()).await?.len();
            let profile = Supervisor::snapshot(&row)?;
            let plan = AdoptPlan { executor, addr, open_turns, gone };
            return self.start_adopting(&row, profile, plan).map(Some);
        }
        // Then what it left behind is marked.
        let store = &self.config.store;
        // Subscribers that only listen learn it from the stream: each interrupted turn ends,
        // each question is void, and the session waits for input with the reason. Published
        // before the store changes (a kill in between publishes again at the next start,
        // rather than never).
        let unreachable_reason = unreachable
            .map(|why| format!("{why}; the session resumes when its runtime is reachable again"));
        let reason = unreachable_reason.as_deref().unwrap_or(session::STOPPED_WHILE_DOWN);
        let unstuck = matches!(row.state, SessionState::Starting | SessionState::Running);
        let mut then = Vec::new();
        if unstuck {
            then.push(SessionEventKind::State {
                state: SessionState::WaitingForInput,
                error: Some(reason.into()),
            });
        }
        let (interrupted, cancelled) = self.void_open_work(&row.id, reason, then).await?;
        summary.interrupted += interrupted;
        summary.approvals_cancelled += cancelled;
        let _ = store
            .set_executor_status(row.id.clone(), executor.execution_id, ExecutorStatus::Dead)
            .await;
        summary.dead += 1;
        if unstuck {
            store
                .set_session_state(
                    row.id.clone(),
                    SessionState::WaitingForInput,
                    Some(reason.into()),
                    None,
                )
                .await?;
        }
        // A crash found at recovery: the error, and a snapshot (taken before serving, while
        // no actor writes this session's event log).
        store.log_error(row.id.clone(), reason.into()).await?;
        let trigger = SnapshotTrigger::Crash;
        if let Some(snapshot_id) = self.snapshot_now(&row.id, trigger, Some(reason.into())).await {
            self.publish_recovery(
                &row.id,
                vec![SessionEventKind::SnapshotTaken { snapshot_id, trigger }],
            )?;
        }
        Ok(None)
    }

    /// `task.session.cancel`: cancels the running turn; a `PAUSED` session (no turn) is
    /// ended `CANCELLED`.
    pub async fn cancel(&self, session_id: String) -> Result<(), ServiceError> {
        let row = self.session_row(&session_id).await?;
        if row.state == SessionState::Paused {
            return self.end(row, SessionState::Cancelled).await;
        }
        Ok(self.live(&session_id).await?.cancel().await?)
    }

    /// `task.session.pause`: at the next turn boundary (see [`SessionHandle::pause`]).
    pub async fn pause(
        &self,
        session_id: String,
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
        let live = {
            let _guard = self.start_lock.lock().await;
            match self.handle(&session_id).filter(SessionHandle::is_live) {
                Some(handle) => Some(handle),
                None => {
                    // No actor, so no agent: nothing to stop or wait for.
                    self.pause_without_agent(&row, reason.clone(), false, SnapshotTrigger::Pause)
                        .await?;
                    None
                }
            }
        };
        let Some(handle) = live else {
            return Ok(PauseResult {
                session_id,
                state: SessionState::Paused,
                pause_requested: false,
            });
        };
        let waits = handle.pause(reason, force_after).await?;
        let view = handle.view();
        Ok(PauseResult { session_id, state: view.state, pause_requested: waits })
    }

    /// Pauses a session that has no actor (its agent is not running): the events are
    /// published, then the store says `PAUSED` (and forgets the pause request).
    async fn pause_without_agent(
        &self,
        row: &SessionRow,
        reason: Option<String>,
        forced: bool,
        trigger: SnapshotTrigger,
    ) -> Result<(), ServiceError> {
        let request = self.snapshot_request(&row.id, trigger, reason.clone());
        let record = self.record(&row.id)?;
        Ok(record.pause(request, reason, trigger, forced, Mark::default()).await?)
    }

    /// What a snapshot of a session that has no live agent is taken from.
    fn snapshot_request(
        &self,
        session_id: &str,
        trigger: SnapshotTrigger,
        reason: Option<String>,
    ) -> crate::snapshot::Request {
        crate::snapshot::Request {
            session_id: session_id.to_owned(),
            trigger,
            reason,
            history: self.config.home.session(session_id).history(),
            execution_id: None,
            usage: None,
        }
    }

    /// Takes a snapshot of a session that has no live agent; its id, or `None` (logged)
    /// when it could not be taken.
    async fn snapshot_now(
        &self,
        session_id: &str,
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

    /// `task.session.permission.respond`: `option_id` selects an option; `None` cancels.
    pub async fn respond_permission(
        &self,
        session_id: String,
        request_id: String,
        option_id: Option<String>,
    ) -> Result<(), ServiceError> {
        let outcome = match option_id {
            Some(option_id) => serde_json::json!({"outcome": "selected", "optionId": option_id}),
            None => serde_json::json!({"outcome": "cancelled"}),
        };
        Ok(self.live(&session_id).await?.respond_permission(request_id, outcome).await?)
    }

    /// `task.session.stop`: the agent is stopped and the session ends (`COMPLETED`).
    pub async fn stop(&self, session_id: String) -> Result<(), ServiceError> {
        let row = self.session_row(&session_id).await?;
        self.end(row, SessionState::Completed).await
    }

    /// Ends a session for good as `end` (`COMPLETED` or `CANCELLED`).
    async fn end(&self, row: SessionRow, end: SessionState) -> Result<(), ServiceError> {
        let session_id = row.id.clone();
        if row.state.is_terminal() {
            return Err(ServiceError::Conflict(format!(
                "session {session_id} is already {}",
                row.state.as_str()
            )));
        }
        match self.handle(&session_id).filter(SessionHandle::is_live) {
            Some(handle) if end == SessionState::Cancelled => Ok(handle.cancel_session().await?),
            Some(handle) => Ok(handle.stop().await?),
            None => {
                // No actor: whatever sidecar its record names must not outlive the session.
                let executor = self.config.store.get_executor(session_id.clone()).await?;
                if let Err(err) = self.fence(&row, executor).await {
                    tracing::warn!(session = %session_id, %err, "cannot fence a stopped session's sidecar");
                }
                self.config.store.set_session_state(session_id, end, None, None).await?;
                Ok(())
            }
        }
    }

    /// `task.session.delete`: stops it if live, then removes its records and files, and its
    /// worktree (refused while that holds uncommitted work, unless `force`; the branch is
    /// kept unless `delete_branch`).
    pub async fn delete(
        &self,
        session_id: String,
        force: bool,
        delete_branch: bool,
    ) -> Result<(), ServiceError> {
        let row = self.session_row(&session_id).await?;
        if let Some(made) = session_worktree(&row)
            && !force
        {
            // Checked before anything stops: a refusal changes nothing.
            let changed = worktree::uncommitted(&made)
                .await
                .map_err(|err| ServiceError::Internal(err.to_string()))?;
            if !changed.is_empty() {
                let err = worktree::WorktreeError::Uncommitted {
                    path: made.path.display().to_string(),
                    files: changed.into_iter().take(20).collect(),
                };
                return Err(ServiceError::Conflict(format!("session {session_id}: {err}")));
            }
        }
        self.remove_session(&row, force, delete_branch).await.map(|_| ())
    }

    /// Removes a session whatever it is doing (its agent stopped first): its worktree, its
    /// container, its rows, its history, event log and spool. Returns what went besides the
    /// rows (see `CleanedSession::resources`).
    async fn remove_session(
        &self,
        row: &SessionRow,
        force: bool,
        delete_branch: bool,
    ) -> Result<Vec<String>, ServiceError> {
        let session_id = row.id.clone();
        let mut removed = Vec::new();
        if let Some(handle) = self.handle(&session_id).filter(SessionHandle::is_live)
            && !row.state.is_terminal()
        {
            let _ = handle.stop().await;
        }
        // Whatever sidecar of it still runs (a stop cut short by a kill left one) goes first.
        let executor = self.config.store.get_executor(session_id.clone()).await.ok().flatten();
        if let Err(err) = self.fence(row, executor).await {
            tracing::warn!(session = %session_id, %err, "cannot fence a deleted session's sidecar");
        }
        if let Some(made) = session_worktree(row) {
            let existed = made.path.is_dir();
            worktree::remove(&made, force, delete_branch).await.map_err(|err| match err {
                worktree::WorktreeError::Uncommitted { .. } => {
                    ServiceError::Conflict(format!("session {session_id}: {err}"))
                }
                other => ServiceError::Internal(format!("session {session_id}: {other}")),
            })?;
            if existed {
                removed.push("worktree".to_owned());
            }
        }
        if let Ok(runtime) = self.runtime(&row.runtime) {
            let handle = match self.config.store.get_executor(session_id.clone()).await {
                Ok(executor) => executor.and_then(|executor| executor.runtime_handle),
                Err(_) => None,
            };
            match runtime.remove(&session_id, handle.as_ref()).await {
                Ok(true) => removed.push(runtime.resource_kind().unwrap_or("runtime").to_owned()),
                Ok(false) => {}
                Err(err) => {
                    tracing::warn!(session = %session_id, %err, "cannot remove the session's runtime resources");
                }
            }
        }
        self.config.store.delete_session(session_id.clone()).await?;
        self.sessions().remove(&session_id);
        self.event_logs.lock().expect("UNWRAP: never poisoned").remove(&session_id);
        let agent_state = self.config.home.agent_state(&session_id);
        if agent_state.exists() {
            let _ = std::fs::remove_dir_all(&agent_state);
        }
        let paths = self.config.home.session(&session_id);
        for (path, name) in paths.kept() {
            if path.exists() {
                removed.push(name.to_owned());
            }
        }
        let dir = paths.dir();
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|err| {
                ServiceError::Internal(format!("removing {}: {err}", dir.display()))
            })?;
        }
        Ok(removed)
    }

    /// `sessions.cleanup`: removes the sessions at rest whose last change is older than the
    /// policy's age and that its filters select; never a live one (an agent running, a
    /// launch or re-attach under way, `STARTING` or `RUNNING`). A worktree with uncommitted
    /// work keeps its session unless `force`.
    pub async fn cleanup(&self, policy: &CleanupPolicy) -> Result<CleanupResult, ServiceError> {
        let cutoff = crate::store::now_ms()
            .saturating_sub(i64::from(policy.max_age_days).saturating_mul(86_400_000));
        let mut removed = Vec::new();
        let mut kept = Vec::new();
        for row in self.config.store.list_sessions(None).await? {
            if row.updated_at > cutoff
                || policy.states.as_ref().is_some_and(|states| !states.contains(&row.state))
                || (policy.keep_completed && row.state == SessionState::Completed)
            {
                continue;
            }
            let keep = |reason: String| KeptSession {
                session_id: row.id.clone(),
                state: row.state,
                reason,
            };
            // Checked and removed under the start lock: no resume or prompt can bring the
            // session's agent up in between (they start actors under it, and read the row
            // again there).
            let _guard = self.start_lock.lock().await;
            let live = self.handle(&row.id).filter(SessionHandle::is_live).is_some_and(|handle| {
                let view = handle.view();
                view.agent_running || view.is_starting() || view.phase == Phase::Adopting
            });
            if live || matches!(row.state, SessionState::Starting | SessionState::Running) {
                kept.push(keep("live: its agent runs (or is being brought up)".into()));
                continue;
            }
            if let Some(made) = session_worktree(&row)
                && !policy.force
            {
                match worktree::uncommitted(&made).await {
                    Ok(changed) if !changed.is_empty() => {
                        kept.push(keep(format!(
                            "its worktree {} has uncommitted changes ({} paths); --force removes them",
                            made.path.display(),
                            changed.len()
                        )));
                        continue;
                    }
                    Ok(_) => {}
                    Err(err) => {
                        kept.push(keep(format!("its worktree cannot be read: {err}")));
                        continue;
                    }
                }
            }
            let resources = if policy.dry_run {
                self.resources_of(&row)
            } else {
                match self.remove_session(&row, policy.force, false).await {
                    Ok(resources) => resources,
                    Err(err) => {
                        kept.push(keep(format!("cannot remove it: {err}")));
                        continue;
                    }
                }
            };
            tracing::info!(session = %row.id, state = %row.state.as_str(), dry_run = policy.dry_run, ?resources, "cleanup");
            removed.push(CleanedSession {
                session_id: row.id.clone(),
                state: row.state,
                updated_at: row.updated_at,
                resources,
            });
        }
        removed.sort_by_key(|session| session.updated_at);
        Ok(CleanupResult { dry_run: policy.dry_run, removed, kept })
    }

    /// What removing a session would take besides its rows (for a dry run).
    fn resources_of(&self, row: &SessionRow) -> Vec<String> {
        let mut resources = Vec::new();
        if session_worktree(row).is_some_and(|made| made.path.is_dir()) {
            resources.push("worktree".to_owned());
        }
        if let Some(kind) = self.runtime(&row.runtime).ok().and_then(|r| r.resource_kind()) {
            resources.push(kind.to_owned());
        }
        for (path, name) in self.config.home.session(&row.id).kept() {
            if path.exists() {
                resources.push(name.to_owned());
            }
        }
        resources
    }

    /// `task.session.history`.
    pub async fn history(
        &self,
        session_id: String,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<HistoryEntry>, ServiceError> {
        self.session_row(&session_id).await?;
        let path = self.config.home.session(&session_id).history();
        tokio::task::spawn_blocking(move || history::read(&path, after_seq, limit))
            .await
            .map_err(|err| ServiceError::Internal(err.to_string()))?
            .map_err(|err| ServiceError::Internal(err.to_string()))
    }

    /// `task.session.subscribe`: a reader of the session's events after `after_seq`.
    pub async fn subscribe(
        &self,
        session_id: String,
        after_seq: u64,
    ) -> Result<SpoolReader<SessionEvent>, ServiceError> {
        self.session_row(&session_id).await?;
        let log = self.event_log(&session_id)?;
        let last = log.last_seq();
        if after_seq > last {
            return Err(ServiceError::InvalidParams {
                field: "after_seq",
                message: format!(
                    "after_seq {after_seq} is past session {session_id}'s newest event ({last}); \
                     subscribe from at most {last}"
                ),
            });
        }
        log.reader(after_seq).map_err(|err| match err {
            agentctl::spool::SpoolError::Pruned { acked_seq, .. } => ServiceError::InvalidParams {
                field: "after_seq",
                message: format!(
                    "events up to {acked_seq} of session {session_id} are no longer kept (the event \
                     log keeps its newest {} MiB); subscribe from {acked_seq} or later, and read the \
                     conversation with task.session.history",
                    self.config.event_log.retain_bytes >> 20
                ),
            },
            other => ServiceError::Internal(other.to_string()),
        })
    }

    /// `task.session.timeline`: the session's turns and the executions that ran them (and
    /// the current one).
    pub async fn timeline(
        &self,
        session_id: String,
        after: Option<i64>,
    ) -> Result<Timeline, ServiceError> {
        self.session_row(&session_id).await?;
        let turns = self.config.store.session_turns(session_id.clone()).await?;
        let current = self.config.store.get_executor(session_id.clone()).await?;
        let mut executions: Vec<ExecutionInfo> = Vec::new();
        for turn in &turns {
            match executions.iter_mut().find(|e| e.execution_id == turn.execution_id) {
                Some(execution) => execution.turns += 1,
                None => executions.push(ExecutionInfo {
                    execution_id: turn.execution_id.clone(),
                    current: false,
                    generation: None,
                    status: None,
                    resume_outcome: None,
                    first_turn_at: Some(turn.started_at),
                    turns: 1,
                }),
            }
        }
        if let Some(current) = current {
            let index = match executions.iter().position(|e| e.execution_id == current.execution_id)
            {
                Some(index) => index,
                None => {
                    executions.push(ExecutionInfo {
                        execution_id: current.execution_id.clone(),
                        current: false,
                        generation: None,
                        status: None,
                        resume_outcome: None,
                        first_turn_at: None,
                        turns: 0,
                    });
                    executions.len() - 1
                }
            };
            let execution = &mut executions[index];
            execution.current = true;
            execution.generation = Some(current.generation);
            execution.status = Some(current.status.as_str().to_owned());
            execution.resume_outcome = current.resume_outcome;
        }
        let turns = turns
            .into_iter()
            .map(|turn| TurnInfo {
                turn_id: turn.id,
                execution_id: turn.execution_id,
                state: turn.state,
                stop_reason: turn.stop_reason,
                error: turn.error,
                started_at: turn.started_at,
                ended_at: turn.ended_at,
            })
            .collect();
        let rows = self
            .config
            .store
            .timeline(session_id.clone(), after.unwrap_or(0), protocol::api::MAX_TIMELINE_ENTRIES)
            .await?;
        let mut entries = Vec::with_capacity(rows.len());
        for (seq, at, json) in rows {
            match serde_json::from_str(&json) {
                Ok(event) => entries.push(TimelineEntry { seq, at, event }),
                // Written by a newer build, or damaged: left out, not fatal.
                Err(err) => {
                    tracing::warn!(session = %session_id, seq, %err, "unreadable timeline entry")
                }
            }
        }
        Ok(Timeline { session_id, executions, turns, entries })
    }

    /// The metrics text, with the gauges of what exists now read first: sessions by state
    /// and runtime (one indexed query), and executions whose agent runs.
    pub async fn metrics(&self) -> Result<String, ServiceError> {
        let counts = self.config.store.session_counts().await?;
        let metrics = crate::metrics::get();
        metrics.sessions.clear();
        for (state, runtime, count) in counts {
            let labels = vec![("state", state.as_str().to_owned()), ("runtime", runtime)];
            metrics.sessions.get_or_create(&labels).set(count);
        }
        let live = self.sessions().values().filter(|handle| handle.view().agent_running).count();
        metrics.live_executions.set(live as i64);
        Ok(crate::metrics::render())
    }

    /// `task.session.snapshot.list`: a session's snapshots, oldest first.
    pub async fn snapshot_list(
        &self,
        session_id: String,
    ) -> Result<Vec<SnapshotSummary>, ServiceError> {
        self.session_row(&session_id).await?;
        Ok(self.config.store.snapshots(session_id).await?)
    }

    /// `task.session.snapshot.get`: one snapshot.
    pub async fn snapshot_get(&self, snapshot_id: String) -> Result<Snapshot, ServiceError> {
        self.config.store.snapshot(snapshot_id.clone()).await?.ok_or_else(|| {
            ServiceError::from(StoreError::NotFound { what: "snapshot", id: snapshot_id })
        })
    }

    /// Every session, or a task's; only those in `state` and of `profile` when given.
    pub async fn list_sessions(
        &self,
        task_id: Option<String>,
        state: Option<SessionState>,
        profile: Option<String>,
    ) -> Result<Vec<SessionRow>, ServiceError> {
        let mut rows = self.config.store.list_sessions(task_id).await?;
        rows.retain(|row| {
            state.is_none_or(|state| row.state == state)
                && profile.as_ref().is_none_or(|profile| &row.agent_profile_id == profile)
        });
        Ok(rows)
    }

    /// The profiles' JSON, for diagnostics.
    pub fn profile_snapshot(&self, id: &str) -> Option<Value> {
        self.config.registry.get(id).and_then(|profile| serde_json::to_value(&*profile).ok())
    }
}

/// How long a resume (or a prompt that waits for one) may take.
pub const RESUME_WAIT: Duration = Duration::from_secs(90);

pub use crate::session::DEFAULT_PAUSE_WAIT_MS;

/// What restart recovery did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RecoverySummary {
    /// Sessions left as they were: stopped, nothing open, no sidecar alive.
    pub at_rest: usize,
    /// Sessions whose sidecar was dead.
    pub dead: usize,
    /// Turns marked interrupted.
    pub interrupted: usize,
    /// Pending permission requests re-emitted.
    pub approvals_restored: usize,
    /// Pending permission requests dropped with their dead agent.
    pub approvals_cancelled: usize,
    /// Containers removed because their session no longer exists.
    pub orphans_removed: usize,
    /// Sessions recovery could not handle (reported, marked with the reason, skipped).
    pub skipped: usize,
}

/// The session's worktree, when Tether made one.
fn session_worktree(row: &SessionRow) -> Option<worktree::Worktree> {
    Some(worktree::Worktree {
        repo: PathBuf::from(row.worktree_repo.as_ref()?),
        path: PathBuf::from(&row.workspace_path),
        branch: row.worktree_branch.clone()?,
    })
}

/// The workspace must be there before anything launches: a worktree Tether made that went
/// away is rebuilt from its branch; any other missing workspace is refused.
async fn ensure_workspace(row: &SessionRow) -> Result<(), ServiceError> {
    if Path::new(&row.workspace_path).is_dir() {
        return Ok(());
    }
    if let Some(made) = session_worktree(row) {
        worktree::restore(&made)
            .await
            .map_err(|err| ServiceError::InvalidState(format!("session {}: {err}", row.id)))?;
        tracing::info!(session = %row.id, branch = %made.branch, "rebuilt the worktree from its branch");
        return Ok(());
    }
    Err(ServiceError::InvalidState(format!(
        "the workspace {} of session {} no longer exists; recreate it (or delete the session)",
        row.workspace_path, row.id
    )))
}

fn check_id(field: &'static str, id: &str) -> Result<(), ServiceError> {
    if home::is_valid_id(id) {
        Ok(())
    } else {
        Err(ServiceError::InvalidParams {
            field,
            message: format!("{field} {id:?} is not a valid id"),
        })
    }
}

/// The dotted paths where two JSON values differ (objects are compared member by member;
/// anything else whole).
fn json_diff(path: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    if a == b {
        return;
    }
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort_unstable();
            keys.dedup();
            for key in keys {
                let child = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                json_diff(
                    &child,
                    a.get(key).unwrap_or(&Value::Null),
                    b.get(key).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        _ => out.push(if path.is_empty() { "profile".into() } else { path.to_owned() }),
    }
}
