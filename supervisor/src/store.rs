//! The store: SQLite (WAL, `synchronous=FULL`, foreign keys) owned by one thread.
//!
//! Every read and write is a closure sent to the database thread, which owns the only
//! connection, so writes are serialised without locks and a slow query never blocks a tokio
//! worker. Read-modify-write sequences run in `BEGIN IMMEDIATE` transactions; writes that
//! depend on "which execution is current" are compare-and-set on
//! `(session_id, execution_id)`, so a late event from a dead execution changes nothing.
//!
//! Schema changes are numbered migrations recorded in `schema_migrations`; a failed
//! migration stops startup with [`StoreError::Migration`].

mod checkpoints;
mod engines;
pub use engines::{EngineRow, MoveRow, Relocation};
mod executions;
mod forks;
mod journal;
mod keeps;
mod queue;
mod rewinds;
mod schema;
mod sessions;
mod settings;
mod turns;
mod usage;
mod workflows;

use crate::ids::SessionId;
use sessions::{finish_session, session_from_row, sessions_matching};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

pub use forks::ForkRow;
pub use journal::{LogRow, TURN_SNAPSHOTS_KEPT};
pub use rewinds::RewindRow;
pub use schema::MIGRATIONS;
pub use turns::{PromptRefusal, TurnPrompt};
pub use usage::{RetryCandidate, TurnUsage, UsageFilter, budget_use};
pub use workflows::{StepPatch, StepRow, StepSession, StepTurn, TurnOutput, WorkflowRow};

use journal::log;
pub use protocol::api::{ResumeOutcome, SessionState, TurnState};
use protocol::api::{SnapshotTrigger, TimelineEvent};

/// Errors from the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// SQLite failed (on the database thread, before the file is named: [`Store::call`]
    /// turns it into [`StoreError::Database`]).
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// SQLite failed on the database at `path` (locked, a full disk, read-only, damaged).
    #[error("the database {path}: {source}")]
    Database {
        /// The file.
        path: PathBuf,
        /// Why.
        source: rusqlite::Error,
    },
    /// Opening the database file failed.
    #[error("cannot open the database {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        source: rusqlite::Error,
    },
    /// The database at `path` cannot be used (a migration failed).
    #[error("the database {path}: {source}")]
    Unusable {
        /// The file.
        path: PathBuf,
        /// Why.
        source: Box<StoreError>,
    },
    /// The database cannot be written (read-only, locked by another process).
    #[error("cannot write the database {path}: {source}")]
    Unwritable {
        /// The file.
        path: PathBuf,
        /// Why.
        source: rusqlite::Error,
    },
    /// A migration failed; the database is left at the previous version.
    #[error("migration {version} failed: {source}")]
    Migration {
        /// The migration's number.
        version: usize,
        /// Why.
        source: rusqlite::Error,
    },
    /// A row does not exist.
    #[error("{what} {id} not found")]
    NotFound {
        /// `task`, `session`…
        what: &'static str,
        /// Its id.
        id: String,
    },
    /// A stored value did not parse.
    #[error("corrupt {what} in the database: {detail}")]
    Corrupt {
        /// What.
        what: &'static str,
        /// Detail.
        detail: String,
    },
    /// The database thread is gone.
    #[error("the database thread stopped")]
    Closed,
}

impl StoreError {
    /// A bare SQLite error, named with the database file it came from.
    fn at(self, path: &Path) -> StoreError {
        match self {
            StoreError::Sqlite(source) => StoreError::Database { path: path.to_owned(), source },
            other => other,
        }
    }
}

/// Refuses a database file (or its directory) that is read-only: its owner's write bit is
/// off, or the file system or the caller cannot write it. Opening would otherwise make it
/// writable again behind the operator's back (`0600` is set at open; root writes any mode).
fn refuse_read_only(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::PermissionsExt;
    let unwritable = |why: String| StoreError::Unwritable {
        path: path.to_owned(),
        source: rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_READONLY),
            Some(why),
        ),
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    for (what, file) in [("the file", path), ("its directory", dir)] {
        let Ok(meta) = std::fs::metadata(file) else { continue };
        let mode = meta.permissions().mode();
        if mode & 0o200 == 0 {
            return Err(unwritable(format!(
                "{what} is read-only (mode {:o}); make it writable (chmod u+w) to start",
                mode & 0o7777
            )));
        }
        if let Err(errno) = nix::unistd::access(file, nix::unistd::AccessFlags::W_OK) {
            return Err(unwritable(format!("{what} cannot be written: {}", errno.desc())));
        }
    }
    Ok(())
}

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// Handle to the database thread. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    jobs: std::sync::mpsc::Sender<Job>,
    /// The database file, named by every error SQLite gives.
    path: Arc<Path>,
    /// Workflows whose records changed (a step's session ended a turn or changed state, a
    /// step or the workflow moved), announced after the change committed.
    changes: tokio::sync::broadcast::Sender<crate::ids::WorkflowId>,
    /// Sessions created, changed in state, or deleted, by id, announced after the change
    /// committed (what a list of sessions follows).
    session_changes: tokio::sync::broadcast::Sender<crate::ids::SessionId>,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Store {
    /// Opens (creating, mode 0600) and migrates the database, then starts its thread.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let at = |source| StoreError::Open { path: path.to_owned(), source };
        refuse_read_only(path)?;
        let mut conn = Connection::open(path).map_err(at)?;
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
        }
        // (SQLite reads the file lazily: a file that is not a database fails here.)
        conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(at)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(at)?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(at)?;
        conn.pragma_update(None, "foreign_keys", "ON").map_err(at)?;
        schema::migrate(&mut conn)
            .map_err(|err| StoreError::Unusable { path: path.to_owned(), source: Box::new(err) })?;
        // Written now, not at the first prompt: a read-only or locked database stops the
        // start, saying which and why.
        conn.execute_batch("BEGIN IMMEDIATE; COMMIT;")
            .map_err(|source| StoreError::Unwritable { path: path.to_owned(), source })?;
        let (jobs, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("store".into())
            .spawn(move || {
                for job in rx {
                    job(&mut conn);
                }
            })
            .map_err(|_| StoreError::Closed)?;
        let (changes, _) = tokio::sync::broadcast::channel(256);
        let (session_changes, _) = tokio::sync::broadcast::channel(1024);
        Ok(Store { jobs, path: Arc::from(path), changes, session_changes })
    }

    /// Runs `f` on the database thread and returns its result.
    pub async fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let (reply, result) = oneshot::channel();
        let queued = std::time::Instant::now();
        let path = Arc::clone(&self.path);
        self.jobs
            .send(Box::new(move |conn| {
                let _ = reply.send(f(conn).map_err(|err| err.at(&path)));
                crate::metrics::observe(&crate::metrics::get().store_seconds, queued.elapsed());
            }))
            .map_err(|_| StoreError::Closed)?;
        result.await.map_err(|_| StoreError::Closed)?
    }
}

/// A task's state.
pub mod task_state {
    /// Not started.
    pub const TODO: &str = "TODO";
    /// An agent is working on it.
    pub const IN_PROGRESS: &str = "IN_PROGRESS";
    /// Waiting for a person.
    pub const REVIEW: &str = "REVIEW";
    /// Done.
    pub const COMPLETED: &str = "COMPLETED";
    /// Failed.
    pub const FAILED: &str = "FAILED";
}

/// An API enum in a SQL column, by its wire name (one definition of the enum and its
/// names, in `protocol::api`): a name this build does not know reads as a corrupt row.
pub(crate) struct Named<T>(pub T);

impl<T: std::str::FromStr<Err = String>> rusqlite::types::FromSql for Named<T> {
    fn column_result(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        let text = value.as_str()?;
        let what = std::any::type_name::<T>().rsplit("::").next().unwrap_or("value");
        text.parse().map(Named).map_err(|_| {
            rusqlite::types::FromSqlError::Other(Box::new(StoreError::Corrupt {
                what,
                detail: text.to_owned(),
            }))
        })
    }
}

impl<T: std::fmt::Display> rusqlite::types::ToSql for Named<T> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(rusqlite::types::ToSqlOutput::from(self.0.to_string()))
    }
}

/// A stored session state.
fn session_state(text: &str) -> Result<SessionState, StoreError> {
    text.parse().map_err(|_| StoreError::Corrupt { what: "session state", detail: text.to_owned() })
}

/// An enum stored as text: its names on the wire and in SQL are the same, and a stored name
/// this build does not know is reported as a corrupt row, not guessed.
macro_rules! text_enum {
    ($(#[$meta:meta])* $name:ident, $what:literal { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant,)+
        }

        impl $name {
            /// Every value.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The stored name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// Parses a stored name.
            pub fn parse(text: &str) -> Result<$name, StoreError> {
                match text {
                    $($text => Ok($name::$variant),)+
                    other => Err(StoreError::Corrupt { what: $what, detail: other.to_owned() }),
                }
            }
        }

        impl rusqlite::types::FromSql for $name {
            fn column_result(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<$name> {
                let text = value.as_str()?;
                $name::parse(text).map_err(|err| rusqlite::types::FromSqlError::Other(Box::new(err)))
            }
        }

        impl rusqlite::types::ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
                Ok(rusqlite::types::ToSqlOutput::from(self.as_str()))
            }
        }
    };
}

text_enum! {
    /// Where an execution is (`executors_running.status`).
    ExecutionStatus, "execution status" {
        /// Recorded before the runtime starts it, so a restart knows to fence.
        Launching = "launching",
        /// agentctl is up; the ACP session is being opened.
        Starting = "starting",
        /// The ACP session is open.
        Running = "running",
        /// The agent exited.
        Exited = "exited",
        /// agentctl stopped answering or refused us; it was fenced.
        Lost = "lost",
        /// Found dead (or fenced) at restart.
        Dead = "dead",
        /// Stopped on purpose (stop, stop-all).
        Stopped = "stopped",
    }
}

// The enum comes from `text_enum!`, whose derive list is shared by every enum it makes.
#[allow(clippy::derivable_impls)]
impl Default for ExecutionStatus {
    fn default() -> ExecutionStatus {
        ExecutionStatus::Launching
    }
}

impl ExecutionStatus {
    /// The execution is over: nothing to re-attach to.
    pub fn is_over(self) -> bool {
        matches!(
            self,
            ExecutionStatus::Exited
                | ExecutionStatus::Lost
                | ExecutionStatus::Dead
                | ExecutionStatus::Stopped
        )
    }
}

/// A turn still running, as a re-attach needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenTurn {
    /// The turn.
    pub turn_id: crate::ids::TurnId,
    /// The JSON-RPC id of its `session/prompt`.
    pub request_id: String,
    /// Its prompt reached agentctl.
    pub delivered: bool,
    /// The queued prompt it runs and the prompt's text, when it came from the queue (no
    /// caller waits to send it again).
    pub queued: Option<(crate::ids::PromptId, String)>,
}

/// A turn row.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnRow {
    /// The turn.
    pub id: crate::ids::TurnId,
    /// The execution that ran it.
    pub execution_id: crate::ids::ExecutionId,
    /// Its state.
    pub state: TurnState,
    /// The agent's stop reason.
    pub stop_reason: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
    /// Started, Unix ms.
    pub started_at: i64,
    /// Ended, Unix ms.
    pub ended_at: Option<i64>,
    /// Tokens its agent reported (`total_tokens`).
    pub total_tokens: u64,
    /// The cost it added, and its currency.
    pub cost: Option<(f64, String)>,
    /// The turn whose prompt it re-sent.
    pub retry_of: Option<String>,
    /// The rewind that took it out of the conversation.
    pub rewound_by: Option<crate::ids::RewindId>,
    /// Its prompt, as the person sent it.
    pub prompt: Option<String>,
    /// The seq of its `turn_started` event in the session's event log (`None`: started
    /// before that was recorded, or its start could not be written at once).
    pub event_seq: Option<u64>,
}

/// A task row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// Id (UUID v7).
    pub id: String,
    /// Title.
    pub title: String,
    /// Description (the initial prompt of a fresh start).
    pub description: String,
    /// State.
    pub state: String,
    /// Created, Unix ms.
    pub created_at: i64,
    /// Updated, Unix ms.
    pub updated_at: i64,
}

/// A pause asked for while a turn ran (`session_pauses`): it takes effect when the turn
/// ends, or cancels the turn at `force_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PauseRequest {
    /// Why, as the caller said.
    pub reason: Option<String>,
    /// When the running turn is cancelled, Unix ms.
    pub force_at: i64,
    /// When it was asked for, Unix ms (`force_at` less this: the wait asked for).
    pub requested_at: i64,
    /// `pause`, or `exhaustion` (the agent's context was nearly full).
    pub trigger: SnapshotTrigger,
    /// When the agent was asked for its summary (`summarize_on_pause`), Unix ms: the
    /// summary turn is the session's first turn started since.
    pub summary_asked_at: Option<i64>,
}

/// How a session paused, as [`Store::set_paused`] records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PausedRecord {
    /// Why.
    pub reason: Option<String>,
    /// What paused it.
    pub trigger: SnapshotTrigger,
    /// A running turn was cancelled for it.
    pub forced: bool,
    /// For an exhaustion: the snapshot the next resume's fresh agent session is primed from.
    pub handoff: Option<String>,
}

/// A session's last pause, as [`Store::last_pause`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastPause {
    /// When, Unix ms.
    pub at: i64,
    /// What paused it.
    pub trigger: SnapshotTrigger,
    /// Why, as it was said.
    pub reason: Option<String>,
}

/// What [`Store::record_opened`] records of an execution whose ACP session opened.
#[derive(Debug, Clone, Default)]
pub struct Opened {
    /// The resume token to keep (none when the profile keeps none).
    pub resume_token: Option<String>,
    /// The ACP session id.
    pub acp_session_id: String,
    /// How a resume restored the session (none for a fresh start).
    pub outcome: Option<ResumeOutcome>,
    /// The history is to be injected into the next prompt.
    pub inject_history: bool,
}

/// An active session with a runtime record, as [`Store::recovery_candidates`] reads it.
#[derive(Debug, Clone)]
pub struct RecoveryCandidate {
    /// The session's state.
    pub state: SessionState,
    /// The session's runtime.
    pub runtime: String,
    /// A turn is running or a request is pending.
    pub open_work: bool,
    /// Its current execution.
    pub execution: ExecutionRow,
}

/// A session row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRow {
    /// Id (UUID v7).
    pub id: SessionId,
    /// Its task.
    pub task_id: String,
    /// The profile it was started with.
    pub agent_profile_id: String,
    /// The pinned profile (JSON of `agents::profile::Profile`).
    pub pinned_profile: serde_json::Value,
    /// The runtime's registered name (`standalone`, `docker`…).
    pub runtime: String,
    /// State.
    pub state: SessionState,
    /// The workspace directory.
    pub workspace_path: String,
    /// The last error, if any.
    pub error_message: Option<String>,
    /// Created, Unix ms.
    pub created_at: i64,
    /// Updated, Unix ms.
    pub updated_at: i64,
    /// The prompt it was created with (explicit or the task's description): sent by the
    /// first launch, and by the resume of a session whose launch failed before any turn.
    pub initial_prompt: Option<String>,
    /// The repository whose worktree `workspace_path` is, when Tether made one for it.
    pub worktree_repo: Option<String>,
    /// That worktree's branch.
    pub worktree_branch: Option<String>,
    /// Labels the place it runs on must carry, as asked at create (placement).
    #[serde(default)]
    pub runtime_labels: std::collections::BTreeMap<String, String>,
    /// The MCP servers its agent is given (ACP `McpServer` objects), as asked at create.
    #[serde(default)]
    pub mcp_servers: Vec<serde_json::Value>,
    /// The title its agent gave it (ACP `session_info_update`), if any.
    #[serde(default)]
    pub title: Option<String>,
    /// Directories besides the workspace its agent is given (ACP `additionalDirectories`,
    /// to agents that advertise them), as asked at create.
    #[serde(default)]
    pub additional_directories: Vec<String>,
}

#[cfg(test)]
impl Store {
    /// Tests: a task and a session of the `mock` profile in `state`, working in
    /// `workspace`, recorded; its row.
    pub async fn test_session(
        &self,
        state: SessionState,
        workspace: &Path,
        pinned_profile: serde_json::Value,
    ) -> SessionRow {
        let task = self.create_task("t".into(), String::new()).await.unwrap();
        let now = now_ms();
        let row = SessionRow {
            id: uuid::Uuid::now_v7().to_string().into(),
            task_id: task.id,
            agent_profile_id: "mock".into(),
            pinned_profile,
            runtime: "standalone".into(),
            state,
            workspace_path: workspace.to_string_lossy().into_owned(),
            error_message: None,
            created_at: now,
            updated_at: now,
            initial_prompt: None,
            worktree_repo: None,
            worktree_branch: None,
            runtime_labels: Default::default(),
            mcp_servers: Vec::new(),
            title: None,
            additional_directories: Vec::new(),
        };
        self.create_session(row).await.unwrap()
    }
}

/// The runtime record of a session's current execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionRow {
    /// The session.
    pub session_id: SessionId,
    /// This execution's id; CAS key.
    pub execution_id: crate::ids::ExecutionId,
    /// Increases with each execution.
    pub generation: i64,
    /// `standalone` or `docker`.
    pub runtime: String,
    /// Where the execution is.
    pub status: ExecutionStatus,
    /// The ACP session id, when one is worth keeping.
    pub resume_token: Option<String>,
    /// agentctl's port.
    pub agentctl_port: Option<i64>,
    /// agentctl's pid.
    pub agentctl_pid: Option<i64>,
    /// agentctl's start time (clock ticks since boot).
    pub agentctl_start_time: Option<i64>,
    /// The boot id agentctl started under.
    pub boot_id: Option<String>,
    /// agentctl's bearer token.
    pub agentctl_token: Option<String>,
    /// The last agentctl event handled durably.
    pub acked_seq: i64,
    /// The next prompt must carry the resume context.
    pub resume_context_pending: bool,
    /// The ACP session id of this execution.
    pub acp_session_id: Option<String>,
    /// How the last resume went.
    pub resume_outcome: Option<ResumeOutcome>,
    /// What the runtime returned to find this execution again (for Docker, the engine and
    /// the container), read only by that runtime.
    pub runtime_handle: Option<serde_json::Value>,
    /// Where agentctl's control channel listens (`host:port`), as the runtime returned it:
    /// recovery connects there as stored instead of rebuilding an address.
    pub agentctl_url: Option<String>,
    /// The certificate (PEM) its control channel serves over TLS, pinned by the client;
    /// `None`: plain WebSocket.
    pub agentctl_cert: Option<String>,
}

impl ExecutionRow {
    /// The record of `execution_id` of `session_id`, launching, with nothing else known yet.
    pub fn new(session_id: SessionId, execution_id: crate::ids::ExecutionId) -> ExecutionRow {
        ExecutionRow {
            session_id,
            execution_id,
            generation: 0,
            runtime: String::new(),
            status: ExecutionStatus::default(),
            resume_token: None,
            agentctl_port: None,
            agentctl_pid: None,
            agentctl_start_time: None,
            boot_id: None,
            agentctl_token: None,
            acked_seq: 0,
            resume_context_pending: false,
            acp_session_id: None,
            resume_outcome: None,
            runtime_handle: None,
            agentctl_url: None,
            agentctl_cert: None,
        }
    }

    /// agentctl's control-channel address: the stored endpoint, else (a row written before
    /// endpoints were stored, or one that does not parse) loopback and the recorded port —
    /// what every runtime returned until then.
    pub fn endpoint(&self) -> agentctl::client::ControlAddr {
        self.agentctl_url.as_deref().and_then(|url| url.parse().ok()).unwrap_or_else(|| {
            agentctl::client::ControlAddr::Tcp(std::net::SocketAddr::from((
                [127, 0, 0, 1],
                u16::try_from(self.agentctl_port.unwrap_or(0)).unwrap_or(0),
            )))
        })
    }
}

const SESSION_COLUMNS: &str = "id, task_id, agent_profile_id, profile_snapshot, runtime, state, workspace_path, error_message, created_at, updated_at, initial_prompt, worktree_repo, worktree_branch, runtime_labels, mcp_servers, title, additional_directories";

const EXECUTOR_COLUMNS: &str = "session_id, execution_id, generation, runtime, status, resume_token, agentctl_port, \
     agentctl_pid, agentctl_start_time, boot_id, agentctl_token, acked_seq, resume_context_pending, acp_session_id, \
     resume_outcome, runtime_handle, agentctl_url, agentctl_cert";

#[cfg(test)]
pub(crate) mod tests;
