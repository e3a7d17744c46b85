//! The supervisor's operations, independent of the wire: tasks, sessions and their actors,
//! agents. The API module maps these to JSON-RPC; tests and the CLI reach them through it.
//!
//! Files, by operation: this file holds the supervisor's state, its errors and the reads
//! (tasks, history, subscriptions, timelines, snapshots); `lifecycle.rs` a session's life
//! (create, status, prompt, resume, cancel, pause, permissions); `ending.rs` how sessions
//! end (stop, stop-all, delete, cleanup); `recovery.rs` what a restart finds.

mod changes;
mod checkpoints;
mod ending;
mod engines;
mod failover;
mod fork;
mod lifecycle;
mod limits;
mod recovery;
mod relocation;
mod rewind;
mod settings;
mod workflows;

use crate::ids::SessionId;
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentctl::spool::{Spool, SpoolReader};
use agents::profile::Profile;
use agents::registry::{Environment, Registry};
use serde::Serialize;

use crate::events::SessionEvent;
use crate::events::SessionEventKind;
use crate::history::{self, HistoryEntry};
use crate::home::{self, Home};
use crate::runtime::{FenceTarget, Liveness, Runtime, Runtimes};
use crate::session::record::{Mark, RecordError, SessionRecord};
use crate::session::{
    self, Phase, ReattachPlan, SessionContext, SessionError, SessionHandle, SessionView, Start,
};
use crate::store::{ExecutionStatus, SessionRow, SessionState, Store, StoreError, Task};
use crate::wire::runtime_kind;
use crate::worktree;
use protocol::api::{
    AgentInfo, CleanedSession, CleanupResult, ErrorKind, ExecutionInfo, KeptSession, PauseResult,
    ResumeResult, SessionStatus, Snapshot, SnapshotSummary, SnapshotTrigger, TaskDetail, Timeline,
    TimelineEntry, TurnInfo,
};

pub use workflows::NewWorkflow;

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
    /// The workflow step it runs, `(workflow, step)`: the step starts in the write that
    /// stores the session, and only if it is still pending.
    pub workflow_step: Option<(crate::ids::WorkflowId, crate::ids::StepId)>,
    /// The MCP servers its agent is given (ACP `McpServer` objects).
    pub mcp_servers: Vec<serde_json::Value>,
    /// The id asked for (else a new UUID v7).
    pub session_id: Option<SessionId>,
    /// Directories besides the workspace for its agent (absolute).
    pub additional_directories: Vec<String>,
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
    /// The database or a session's files cannot be read or written (the message names the
    /// file and the cause).
    #[error("{0}")]
    Storage(String),
    /// A budget of the session or its task is used up.
    #[error("{0}")]
    BudgetExceeded(String),
    /// A chosen setting could not be set again: prompts are refused until it is chosen anew.
    #[error("{0}")]
    SettingsNotRestored(String),
    /// The agent refused the request.
    #[error("{0}")]
    AgentRefused(String),
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
            ServiceError::Storage(m) => ServiceError::Storage(m + hint),
            ServiceError::BudgetExceeded(m) => ServiceError::BudgetExceeded(m + hint),
            ServiceError::SettingsNotRestored(m) => ServiceError::SettingsNotRestored(m + hint),
            ServiceError::AgentRefused(m) => ServiceError::AgentRefused(m + hint),
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
            ServiceError::Storage(_) => ErrorKind::Storage,
            ServiceError::BudgetExceeded(_) => ErrorKind::BudgetExceeded,
            ServiceError::SettingsNotRestored(_) => ErrorKind::SettingsNotRestored,
            ServiceError::AgentRefused(_) => ErrorKind::AgentRefused,
            ServiceError::Internal(_) => ErrorKind::Internal,
        }
    }
}

impl From<StoreError> for ServiceError {
    fn from(err: StoreError) -> ServiceError {
        match err {
            StoreError::NotFound { .. } => ServiceError::NotFound(err.to_string()),
            other => ServiceError::Storage(other.to_string()),
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
            SessionError::Terminal(_) | SessionError::AlreadyRetried { .. } => {
                ServiceError::Conflict(err.to_string())
            }
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
            SessionError::SettingsNotRestored(_) => {
                ServiceError::SettingsNotRestored(err.to_string())
            }
            SessionError::AgentRefused(_) => ServiceError::AgentRefused(err.to_string()),
            SessionError::RuntimeUnavailable(why) => ServiceError::RuntimeUnavailable(why),
            SessionError::Rewind(rewind) => rewind.into(),
        }
    }
}

impl From<crate::rewind::RewindError> for ServiceError {
    fn from(err: crate::rewind::RewindError) -> ServiceError {
        use crate::rewind::RewindError;
        match err {
            RewindError::NoSuchTurn(_) => ServiceError::NotFound(err.to_string()),
            RewindError::Refused(_) | RewindError::WorkspaceUnknown(_) => {
                ServiceError::InvalidState(err.to_string())
            }
            RewindError::Git(_) => ServiceError::Storage(err.to_string()),
            RewindError::Store(store) => store.into(),
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
    /// Reaches sidecars: the WebSocket one in the daemon, a fake in tests.
    pub connector: Arc<dyn crate::sidecar::Connector>,
    /// Applets embedded in this binary (`mock-agent` → `[exe, "mock-agent"]`), used when
    /// no program of that name is installed.
    pub applets: HashMap<String, Vec<OsString>>,
    /// How much of each session's event log is kept.
    pub event_log: crate::events::LogLimits,
    /// Parks a session whose agent is idle this long, unless its profile says (`None`:
    /// never).
    pub idle_timeout: Option<Duration>,
    /// `config.toml`'s `[sandbox]`: how the agents of profiles without one are confined.
    pub default_sandbox: Option<agents::profile::SandboxSettings>,
    /// Whether the API asks every connection for a token. Without one, anyone on this host
    /// drives the daemon, so agents do not run as another user (`[process] user`): that
    /// user would get the daemon's own through the API.
    pub api_token: bool,
    /// The workspace checkpoints every session takes (`config.toml`'s `[checkpoints]`).
    pub checkpoints: Arc<crate::checkpoint::Checkpoints>,
    /// An engine that does not answer this long has its sessions moved to the others
    /// (`[docker] failover_after_secs`; `None`: never).
    pub failover_after: Option<Duration>,
}

/// The supervisor's state: shared by every API connection.
pub struct Supervisor {
    config: SupervisorConfig,
    /// Live (and ended, until deleted) sessions. A std mutex: map lookups only.
    sessions: Mutex<HashMap<crate::ids::SessionId, SessionHandle>>,
    /// Each session's event log, opened once per process and shared with its actor (two
    /// writers on one spool would corrupt it).
    event_logs: Mutex<HashMap<crate::ids::SessionId, Arc<Spool<SessionEvent>>>>,
    /// Launches, retires and fences in flight (see [`Supervisor::shutdown`]).
    teardowns: tokio_util::task::TaskTracker,
    /// Serialises "is there a live actor, else start one", so one session gets one actor
    /// and one launch however many resumes and prompts race.
    start_lock: tokio::sync::Mutex<()>,
    /// Resolves program names; one shared by every session.
    resolver: crate::sidecar::Resolver,
    /// Damaged history lines already put in a session's timeline (session, line).
    damage_reported: Mutex<std::collections::HashSet<(String, usize)>>,
    /// The workflows being driven: whether one was poked again while its driver ran (it
    /// then looks once more before it ends).
    drivers: Mutex<HashMap<crate::ids::WorkflowId, bool>>,
    /// Warm agents of pooled profiles (on the local runtime).
    pool: Option<Arc<crate::pool::Pool>>,
}

impl Supervisor {
    /// A supervisor over an opened store and home.
    pub fn new(config: SupervisorConfig) -> Supervisor {
        let resolver = Supervisor::resolver(&config);
        let pool = config.runtimes.local().map(|runtime| {
            Arc::new(crate::pool::Pool::new(
                config.home.clone(),
                Arc::clone(runtime),
                Arc::clone(&config.connector),
                Arc::clone(&resolver),
                agent_home(&config.home),
            ))
        });
        Supervisor {
            pool,
            config,
            sessions: Mutex::new(HashMap::new()),
            event_logs: Mutex::new(HashMap::new()),
            teardowns: tokio_util::task::TaskTracker::new(),
            start_lock: tokio::sync::Mutex::new(()),
            resolver,
            damage_reported: Mutex::new(std::collections::HashSet::new()),
            drivers: Mutex::new(HashMap::new()),
        }
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<crate::ids::SessionId, SessionHandle>> {
        self.sessions.lock().expect("UNWRAP: never poisoned")
    }

    /// Resolves a program name to the argv prefix that runs it: an installed program, or
    /// an applet of this binary.
    fn resolver(config: &SupervisorConfig) -> crate::sidecar::Resolver {
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
        // The program reason comes first; an applet stands in for a missing program, and
        // in a container the program is the image's, not this host's PATH.
        let elsewhere = availability.program.is_none() && self.sandboxed(runtime);
        let mut reasons: Vec<String> =
            availability.reasons.into_iter().skip(usize::from(applet || elsewhere)).collect();
        let sandbox = self.sandbox_of(profile);
        if let Err(err) = crate::sandbox::check(&sandbox, runtime, &self.resolver) {
            reasons.push(err.to_string());
        }
        if let Some(user) = &profile.process.user
            && !self.sandboxed(runtime)
            && !self.config.environment.root
        {
            reasons.push(format!(
                "process.user = {user:?}: agents run as another user only when the daemon runs as root"
            ));
        }
        if let Some(user) = &profile.process.user
            && !self.sandboxed(runtime)
            && !self.config.api_token
        {
            reasons.push(format!(
                "process.user = {user:?}: an agent confined to another user could still drive the daemon through its API, which asks for no token; start the daemon with one (--auth-token-file FILE, mode 0600)"
            ));
        }
        reasons
    }

    /// A session's agent needs, run as root on this host, variables that are not set (its
    /// profile's `root_env`): it would exit at once, so it is not launched.
    fn check_root_env(&self, row: &SessionRow) -> Result<(), ServiceError> {
        if self.sandboxed(&row.runtime) {
            // The agent's environment is the container's.
            return Ok(());
        }
        let profile = Supervisor::pinned_profile(row)?;
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
        let recorded = self.config.store.get_execution(row.id.clone()).await?;
        let handle = recorded.and_then(|recorded| recorded.runtime_handle);
        runtime
            .reachable(handle.as_ref())
            .await
            .map_err(|err| ServiceError::RuntimeUnavailable(err.to_string()))
    }

    fn context(&self, row: &SessionRow) -> Result<SessionContext, ServiceError> {
        let session_id = &row.id;
        let dir = self
            .config
            .home
            .session_dir(session_id)
            .map_err(|err| ServiceError::Storage(format!("the session's directory: {err}")))?;
        Ok(SessionContext {
            store: self.config.store.clone(),
            runtime: self.runtime(&row.runtime)?,
            dir,
            resolve: Arc::clone(&self.resolver),
            agent_home: self.agent_home(),
            ready_timeout: Duration::from_secs(30),
            agent_state_root: self.config.home.agent_state(session_id),
            connector: Arc::clone(&self.config.connector),
            event_log_retain_bytes: self.config.event_log.retain_bytes,
            idle_timeout: self.config.idle_timeout,
            default_sandbox: self.config.default_sandbox.clone(),
            pool: self.pool.clone(),
            teardowns: self.teardowns.clone(),
            checkpoints: Arc::clone(&self.config.checkpoints),
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
    async fn event_log(
        &self,
        session_id: &SessionId,
    ) -> Result<Arc<Spool<SessionEvent>>, ServiceError> {
        self.event_log_above(session_id, None).await
    }

    /// [`Self::event_log`], its floor (the highest seq issued) given when known: a session
    /// just created has issued none.
    async fn event_log_above(
        &self,
        session_id: &SessionId,
        floor: Option<u64>,
    ) -> Result<Arc<Spool<SessionEvent>>, ServiceError> {
        if let Some(log) = self.event_logs.lock().expect("UNWRAP: never poisoned").get(session_id) {
            return Ok(Arc::clone(log));
        }
        let floor = match floor {
            Some(floor) => floor,
            None => self.config.store.event_seq_high(session_id.clone()).await?,
        };
        let paths = self.config.home.session(session_id);
        let (dir, mark) = (paths.events(), paths.events_mark());
        let (log, lost) = {
            let mut logs = self.event_logs.lock().expect("UNWRAP: never poisoned");
            if let Some(log) = logs.get(session_id) {
                return Ok(Arc::clone(log));
            }
            let (log, lost) =
                Spool::open_marked(&dir, self.config.event_log.segment_bytes, &mark, floor)
                    .map_err(|err| {
                        ServiceError::Storage(format!("the event log {}: {err}", dir.display()))
                    })?;
            let log = Arc::new(log);
            logs.insert(session_id.clone(), Arc::clone(&log));
            (log, lost)
        };
        if let Some(lost) = lost {
            self.report_lost_events(session_id, &dir, &log, lost).await;
        }
        Ok(log)
    }

    /// The profile a session pinned when it started (or at its last refresh), not
    /// today's.
    fn pinned_profile(row: &SessionRow) -> Result<Arc<Profile>, ServiceError> {
        serde_json::from_value(row.pinned_profile.clone()).map(Arc::new).map_err(|err| {
            ServiceError::Internal(format!("the pinned profile of {}: {err}", row.id))
        })
    }

    fn agent_home(&self) -> PathBuf {
        agent_home(&self.config.home)
    }

    /// The warm agents, when there is a local runtime.
    pub fn pool(&self) -> Option<&Arc<crate::pool::Pool>> {
        self.pool.as_ref()
    }

    /// Keeps the pool in step with the profiles until the daemon stops (see
    /// [`crate::pool::Pool::keep_in_step`]).
    pub async fn run_pool(self: Arc<Self>) {
        if let Some(pool) = self.pool.clone() {
            pool.keep_in_step(&self.config.store, &self.config.registry).await;
        }
    }

    /// How `profile`'s agent is confined: its `[sandbox]`, else the daemon's default.
    pub(crate) fn sandbox_of(&self, profile: &Profile) -> agents::profile::SandboxSettings {
        profile.sandbox_or(self.config.default_sandbox.as_ref())
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
                source: profile.source.to_string(),
                extends: profile.extends.as_ref().map(|extended| extended.base.clone()),
                own_keys: profile.extends.as_ref().map(|e| e.own.clone()).unwrap_or_default(),
                sandbox: crate::sandbox::describe(
                    &self.sandbox_of(profile),
                    &profile.env,
                    &profile.runtime,
                    profile.docker.runtime.as_deref(),
                ),
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
                source: error.file.to_string(),
                extends: None,
                own_keys: Vec::new(),
                sandbox: None,
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
        Ok(TaskDetail { task: task.into(), sessions: self.summaries(sessions).await? })
    }

    /// Sessions as lists show them: with whether each waits for a permission answer.
    async fn summaries(
        &self,
        rows: Vec<SessionRow>,
    ) -> Result<Vec<protocol::api::SessionSummary>, ServiceError> {
        let only = match rows.as_slice() {
            [row] => Some(row.id.clone()),
            _ => None,
        };
        let awaiting = self.config.store.awaiting_permission(only).await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                let waits = awaiting.contains(&row.id);
                protocol::api::SessionSummary { awaiting_permission: waits, ..row.into() }
            })
            .collect())
    }

    fn handle(&self, session_id: &SessionId) -> Option<SessionHandle> {
        self.sessions().get(session_id).cloned()
    }

    async fn session_row(&self, session_id: &SessionId) -> Result<SessionRow, ServiceError> {
        check_id("session_id", session_id.as_str())?;
        Ok(self.config.store.get_session(session_id.clone()).await?)
    }

    /// A live actor for a session that is not terminal.
    async fn live(&self, session_id: &SessionId) -> Result<SessionHandle, ServiceError> {
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

    /// `task.session.history`.
    pub async fn history(
        &self,
        session_id: SessionId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<HistoryEntry>, ServiceError> {
        self.session_row(&session_id).await?;
        let path = self.config.home.session(&session_id).history();
        let read = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || history::read(&path, after_seq, limit))
        };
        let read =
            read.await.map_err(|err| ServiceError::Internal(err.to_string()))?.map_err(|err| {
                ServiceError::Storage(format!("the history {}: {err}", path.display()))
            })?;
        for damaged in read.damaged {
            self.report_damaged_history(&session_id, &path, damaged).await;
        }
        let rewinds = self.config.store.rewinds(session_id).await?;
        let mut entries = read.entries;
        for entry in &mut entries {
            entry.wire.rewound = crate::rewind::is_rewound(&rewinds, entry.seq);
        }
        Ok(entries)
    }

    /// A damaged history line, skipped: a log line each time it is read, and once per line
    /// (per daemon run) a row in the session's timeline, where its owner looks.
    async fn report_damaged_history(
        &self,
        session_id: &SessionId,
        path: &std::path::Path,
        damaged: history::DamagedLine,
    ) {
        let message = format!(
            "{}:{}: a damaged history line was skipped ({}); the rest of the history is kept",
            path.display(),
            damaged.line,
            damaged.reason
        );
        tracing::warn!(session = %session_id, "{message}");
        let first = self
            .damage_reported
            .lock()
            .expect("UNWRAP: never poisoned")
            .insert((session_id.to_string(), damaged.line));
        if first && let Err(err) = self.config.store.log_error(session_id.clone(), message).await {
            tracing::warn!(session = %session_id, %err, "cannot record a damaged history line");
        }
    }

    /// `task.session.event_window`: at most `limit` of a session's events before
    /// `before_seq` (default: through the newest), oldest first, never before where its
    /// log starts. Read from the log's files: a window costs the segment it starts in,
    /// however long the session.
    pub async fn event_window(
        &self,
        session_id: SessionId,
        before_seq: Option<u64>,
        limit: Option<usize>,
    ) -> Result<protocol::api::EventWindow, ServiceError> {
        self.session_row(&session_id).await?;
        let log = self.event_log(&session_id).await?;
        let last_seq = log.last_seq();
        let limit = limit.unwrap_or(protocol::api::DEFAULT_EVENT_WINDOW) as u64;
        let through = before_seq.map_or(last_seq, |before| before.saturating_sub(1).min(last_seq));
        // A trim may move the start while the window is read: read again from the new one.
        loop {
            let kept_after_seq = log.acked_seq();
            let after = through.saturating_sub(limit).max(kept_after_seq);
            if after >= through {
                return Ok(protocol::api::EventWindow {
                    events: Vec::new(),
                    kept_after_seq,
                    last_seq,
                });
            }
            let mut reader = match log.reader(after) {
                Ok(reader) => reader,
                Err(agentctl::spool::SpoolError::Pruned { .. }) => continue,
                Err(other) => return Err(ServiceError::Internal(other.to_string())),
            };
            let mut events = Vec::with_capacity((through - after) as usize);
            // Where a seq is missing (a damaged line skipped, events lost), the next one
            // read may lie past the window: it ends there.
            let read = async {
                while reader.cursor() < through {
                    let event = reader.next().await?;
                    if event.seq > through {
                        break;
                    }
                    events.push(event.to_wire());
                }
                Ok::<_, agentctl::spool::SpoolError>(())
            };
            match read.await {
                Ok(()) => {
                    return Ok(protocol::api::EventWindow { events, kept_after_seq, last_seq });
                }
                Err(agentctl::spool::SpoolError::Pruned { .. }) => continue,
                Err(other) => return Err(ServiceError::Internal(other.to_string())),
            }
        }
    }

    /// `task.session.subscribe`: a reader of the session's events after `after_seq`.
    pub async fn subscribe(
        &self,
        session_id: SessionId,
        after_seq: u64,
    ) -> Result<SpoolReader<SessionEvent>, ServiceError> {
        self.session_row(&session_id).await?;
        let log = self.event_log(&session_id).await?;
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
        session_id: SessionId,
        after: Option<i64>,
    ) -> Result<Timeline, ServiceError> {
        self.session_row(&session_id).await?;
        let turns = self.config.store.session_turns(session_id.clone()).await?;
        let current = self.config.store.get_execution(session_id.clone()).await?;
        let mut executions: Vec<ExecutionInfo> = Vec::new();
        for turn in &turns {
            match executions.iter_mut().find(|e| e.execution_id == turn.execution_id.as_str()) {
                Some(execution) => execution.turns += 1,
                None => executions.push(ExecutionInfo {
                    execution_id: turn.execution_id.to_string(),
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
            let index = match executions
                .iter()
                .position(|e| e.execution_id == current.execution_id.as_str())
            {
                Some(index) => index,
                None => {
                    executions.push(ExecutionInfo {
                        execution_id: current.execution_id.to_string(),
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
                turn_id: turn.id.into_string(),
                execution_id: turn.execution_id.into_string(),
                state: turn.state,
                stop_reason: turn.stop_reason,
                error: turn.error,
                started_at: turn.started_at,
                ended_at: turn.ended_at,
                total_tokens: turn.total_tokens,
                cost: turn
                    .cost
                    .map(|(amount, currency)| protocol::api::CostTotal { currency, amount }),
                retry_of: turn.retry_of,
                rewound: turn.rewound_by.is_some(),
                prompt: turn.prompt.map(|prompt| {
                    crate::history::excerpt(&prompt, protocol::api::TURN_PROMPT_EXCERPT)
                }),
                event_seq: turn.event_seq,
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
        let forked_from =
            self.config.store.fork_of(session_id.clone()).await?.map(|fork| fork.from);
        let forks = self.config.store.forks_from(session_id.clone()).await?;
        Ok(Timeline {
            session_id: session_id.into_string(),
            executions,
            turns,
            forked_from,
            forks,
            entries,
        })
    }

    /// The metrics text, with the gauges of what exists now read first: sessions by state
    /// and runtime (one indexed query), and executions whose agent runs.
    pub async fn metrics(&self) -> Result<String, ServiceError> {
        let counts = self.config.store.session_counts().await?;
        let steps = self.config.store.step_counts().await?;
        let metrics = crate::metrics::get();
        metrics.workflow_steps.clear();
        for (state, count) in steps {
            metrics.workflow_steps.get_or_create(&crate::metrics::label("state", state)).set(count);
        }
        metrics.sessions.clear();
        for (state, runtime, count) in counts {
            let labels = vec![("state", state.as_str().to_owned()), ("runtime", runtime)];
            metrics.sessions.get_or_create(&labels).set(count);
        }
        metrics.parked.set(self.config.store.parked_count().await?);
        // The engines' states (`engines` sets the gauge; an engine is asked at most for
        // its answer bound, once while it does not answer).
        if self.config.runtimes.get("docker").is_some() {
            self.engines().await?;
        }
        metrics.pool_ready.clear();
        for (profile, ready) in self.pool.as_ref().map(|pool| pool.ready()).unwrap_or_default() {
            let labels = crate::metrics::label("profile", profile);
            metrics.pool_ready.get_or_create(&labels).set(ready as i64);
        }
        let live = self.sessions().values().filter(|handle| handle.view().agent_running).count();
        metrics.live_executions.set(live as i64);
        Ok(crate::metrics::render())
    }

    /// `task.session.snapshot.list`: a session's snapshots, oldest first.
    pub async fn snapshot_list(
        &self,
        session_id: SessionId,
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
    ) -> Result<Vec<protocol::api::SessionSummary>, ServiceError> {
        let mut rows = self.config.store.list_sessions(task_id).await?;
        rows.retain(|row| {
            state.is_none_or(|state| row.state == state)
                && profile.as_ref().is_none_or(|profile| &row.agent_profile_id == profile)
        });
        self.summaries(rows).await
    }

    /// Announcements of sessions created, changed in state or deleted (what a list follows).
    pub fn session_changes(&self) -> tokio::sync::broadcast::Receiver<crate::ids::SessionId> {
        self.config.store.session_changes()
    }

    /// A session as lists show it, or `None` when it is gone.
    pub async fn session_summary(
        &self,
        session_id: &SessionId,
    ) -> Result<Option<protocol::api::SessionSummary>, ServiceError> {
        match self.config.store.get_session(session_id.clone()).await {
            Ok(row) => Ok(self.summaries(vec![row]).await?.pop()),
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(err) => Err(err.into()),
        }
    }
}

/// How long a resume (or a prompt that waits for one) may take at least.
pub const RESUME_WAIT: Duration = Duration::from_secs(90);

/// How long a caller waits for a session of `profile` to come up: past every bound the
/// launch has of its own — each handshake step (`initialize`, a restore that fails, the
/// fresh session after it) bounded by the profile's `init_timeout_ms` — so that the
/// launch's own failure, with what the agent printed, is what the caller hears; never
/// less than [`RESUME_WAIT`].
pub fn resume_wait(profile: &Profile) -> Duration {
    let step = Duration::from_millis(profile.process.init_timeout_ms);
    (step * 3 + Duration::from_secs(30)).max(RESUME_WAIT)
}

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

/// The agents' home: the user's `HOME`, else the data directory.
fn agent_home(home: &Home) -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| home.root().to_owned())
}

#[cfg(test)]
mod tests;
