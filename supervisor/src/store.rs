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

mod journal;
mod schema;

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

pub use journal::{LogRow, TURN_SNAPSHOTS_KEPT};
pub use schema::MIGRATIONS;

use journal::log;
pub use protocol::api::{ResumeOutcome, SessionState, TurnState};
use protocol::api::{SnapshotTrigger, TimelineEvent};

/// Errors from the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// SQLite failed.
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// Opening the database file failed.
    #[error("cannot open the database {path}: {source}")]
    Open {
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

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// Handle to the database thread. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    jobs: std::sync::mpsc::Sender<Job>,
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
        let mut conn = Connection::open(path)
            .map_err(|source| StoreError::Open { path: path.to_owned(), source })?;
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
        }
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        schema::migrate(&mut conn)?;
        let (jobs, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("store".into())
            .spawn(move || {
                for job in rx {
                    job(&mut conn);
                }
            })
            .map_err(|_| StoreError::Closed)?;
        Ok(Store { jobs })
    }

    /// Runs `f` on the database thread and returns its result.
    pub async fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let (reply, result) = oneshot::channel();
        let queued = std::time::Instant::now();
        self.jobs
            .send(Box::new(move |conn| {
                let _ = reply.send(f(conn));
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
    ExecutorStatus, "execution status" {
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
impl Default for ExecutorStatus {
    fn default() -> ExecutorStatus {
        ExecutorStatus::Launching
    }
}

impl ExecutorStatus {
    /// The execution is over: nothing to re-attach to.
    pub fn is_over(self) -> bool {
        matches!(
            self,
            ExecutorStatus::Exited
                | ExecutorStatus::Lost
                | ExecutorStatus::Dead
                | ExecutorStatus::Stopped
        )
    }
}

/// A turn still running, as re-adoption needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenTurn {
    /// The turn.
    pub turn_id: String,
    /// The JSON-RPC id of its `session/prompt`.
    pub request_id: String,
    /// Its prompt reached agentctl.
    pub delivered: bool,
}

/// A turn row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnRow {
    /// The turn.
    pub id: String,
    /// The execution that ran it.
    pub execution_id: String,
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
    /// `pause`, or `exhaustion` (the agent's context was nearly full).
    pub trigger: SnapshotTrigger,
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
    pub executor: ExecutorRow,
}

/// A session row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRow {
    /// Id (UUID v7).
    pub id: String,
    /// Its task.
    pub task_id: String,
    /// The profile it was started with.
    pub agent_profile_id: String,
    /// The profile snapshot (JSON of `agents::profile::Profile`).
    pub profile_snapshot: serde_json::Value,
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
}

/// The runtime record of a session's current execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ExecutorRow {
    /// The session.
    pub session_id: String,
    /// This execution's id; CAS key.
    pub execution_id: String,
    /// Increases with each execution.
    pub generation: i64,
    /// `standalone` or `docker`.
    pub runtime: String,
    /// Where the execution is.
    pub status: ExecutorStatus,
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
    /// recovery connects there as stored (issue 17) instead of rebuilding an address.
    pub agentctl_url: Option<String>,
    /// The certificate (PEM) its control channel serves over TLS, pinned by the client;
    /// `None`: plain WebSocket.
    pub agentctl_cert: Option<String>,
}

impl ExecutorRow {
    /// agentctl's control-channel address: the stored endpoint, else (a row written before
    /// endpoints were stored, or one that does not parse) loopback and the recorded port —
    /// what every runtime returned until then.
    pub fn endpoint(&self) -> std::net::SocketAddr {
        self.agentctl_url.as_deref().and_then(|url| url.parse().ok()).unwrap_or_else(|| {
            std::net::SocketAddr::from((
                [127, 0, 0, 1],
                u16::try_from(self.agentctl_port.unwrap_or(0)).unwrap_or(0),
            ))
        })
    }
}

fn session_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<(SessionRow, String, String)> {
    Ok((
        SessionRow {
            id: row.get(0)?,
            task_id: row.get(1)?,
            agent_profile_id: row.get(2)?,
            profile_snapshot: serde_json::Value::Null,
            runtime: row.get(4)?,
            state: SessionState::Created,
            workspace_path: row.get(6)?,
            error_message: row.get(7)?,
            created_at: row.get(8)?,
            updated_at: row.get(9)?,
            initial_prompt: row.get(10)?,
            worktree_repo: row.get(11)?,
            worktree_branch: row.get(12)?,
            runtime_labels: row
                .get::<_, Option<String>>(13)?
                .and_then(|text| serde_json::from_str(&text).ok())
                .unwrap_or_default(),
        },
        row.get::<_, String>(3)?,
        row.get::<_, String>(5)?,
    ))
}

const SESSION_COLUMNS: &str = "id, task_id, agent_profile_id, profile_snapshot, runtime, state, workspace_path, error_message, created_at, updated_at, initial_prompt, worktree_repo, worktree_branch, runtime_labels";

fn finish_session(
    (mut row, snapshot, state): (SessionRow, String, String),
) -> Result<SessionRow, StoreError> {
    row.profile_snapshot = serde_json::from_str(&snapshot)
        .map_err(|err| StoreError::Corrupt { what: "profile snapshot", detail: err.to_string() })?;
    row.state = session_state(&state)?;
    Ok(row)
}

const EXECUTOR_COLUMNS: &str = "session_id, execution_id, generation, runtime, status, resume_token, agentctl_port, \
     agentctl_pid, agentctl_start_time, boot_id, agentctl_token, acked_seq, resume_context_pending, acp_session_id, \
     resume_outcome, runtime_handle, agentctl_url, agentctl_cert";

fn executor_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ExecutorRow> {
    executor_from_row_at(row, 0)
}

/// [`Store::recovery_candidates`]' query. Parameters: the standalone runtime's name, the
/// statuses of executions not over, the live sidecars' pids and the sessions whose state dir
/// a live sidecar serves (the last three JSON arrays).
fn recovery_candidates_sql() -> String {
    let exec_columns: Vec<String> =
        EXECUTOR_COLUMNS.split(", ").map(|c| format!("e.{c}")).collect();
    // Each arm of `wanted` is an index search; `<` or `>` rather than `<>`, so
    // that the runtime index serves it.
    format!(
        "WITH wanted(id) AS ( \
           SELECT id FROM task_sessions WHERE state IN ('STARTING', 'RUNNING') \
           UNION SELECT id FROM task_sessions WHERE state = 'WAITING_FOR_INPUT' AND (runtime < ?1 OR runtime > ?1) \
           UNION SELECT session_id FROM executors_running WHERE status IN (SELECT value FROM json_each(?2)) \
           UNION SELECT session_id FROM executors_running WHERE runtime < ?1 OR runtime > ?1 \
           UNION SELECT session_id FROM executors_running WHERE agentctl_pid IN (SELECT value FROM json_each(?3)) \
           UNION SELECT session_id FROM turns WHERE state = 'running' \
           UNION SELECT session_id FROM pending_requests \
           UNION SELECT value FROM json_each(?4)) \
         SELECT s.state, s.runtime, \
         EXISTS(SELECT 1 FROM turns t WHERE t.session_id = s.id AND t.state = 'running') \
         OR EXISTS(SELECT 1 FROM pending_requests p WHERE p.session_id = s.id), {} \
         FROM wanted w JOIN task_sessions s ON s.id = w.id JOIN executors_running e ON e.session_id = s.id \
         WHERE s.state IN ('STARTING', 'RUNNING', 'WAITING_FOR_INPUT') ORDER BY s.id",
        exec_columns.join(", ")
    )
}

/// An executor row from `EXECUTOR_COLUMNS`, starting at column `base`.
fn executor_from_row_at(row: &rusqlite::Row<'_>, base: usize) -> rusqlite::Result<ExecutorRow> {
    Ok(ExecutorRow {
        session_id: row.get(base)?,
        execution_id: row.get(base + 1)?,
        generation: row.get(base + 2)?,
        runtime: row.get(base + 3)?,
        status: row.get(base + 4)?,
        resume_token: row.get(base + 5)?,
        agentctl_port: row.get(base + 6)?,
        agentctl_pid: row.get(base + 7)?,
        agentctl_start_time: row.get(base + 8)?,
        boot_id: row.get(base + 9)?,
        agentctl_token: row.get(base + 10)?,
        acked_seq: row.get(base + 11)?,
        resume_context_pending: row.get(base + 12)?,
        acp_session_id: row.get(base + 13)?,
        resume_outcome: row.get::<_, Option<Named<ResumeOutcome>>>(base + 14)?.map(|named| named.0),
        runtime_handle: row
            .get::<_, Option<String>>(base + 15)?
            .and_then(|text| serde_json::from_str(&text).ok()),
        agentctl_url: row.get(base + 16)?,
        agentctl_cert: row.get(base + 17)?,
    })
}

fn task_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Task> {
    Ok(Task {
        id: row.get(0)?,
        title: row.get(1)?,
        description: row.get(2)?,
        state: row.get(3)?,
        created_at: row.get(4)?,
        updated_at: row.get(5)?,
    })
}

/// Queries and commands, each one call on the database thread.
impl Store {
    /// Creates a task in `TODO`.
    pub async fn create_task(
        &self,
        title: String,
        description: String,
    ) -> Result<Task, StoreError> {
        self.call(move |conn| {
            let now = now_ms();
            let task = Task {
                id: uuid::Uuid::now_v7().to_string(),
                title,
                description,
                state: task_state::TODO.into(),
                created_at: now,
                updated_at: now,
            };
            conn.execute(
                "INSERT INTO tasks (id, title, description, state, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![task.id, task.title, task.description, task.state, task.created_at, task.updated_at],
            )?;
            Ok(task)
        })
        .await
    }

    /// A task by id.
    pub async fn get_task(&self, id: String) -> Result<Task, StoreError> {
        self.call(move |conn| {
            conn.query_row(
                "SELECT id, title, description, state, created_at, updated_at FROM tasks WHERE id = ?1",
                [&id],
                task_from_row,
            )
            .optional()?
            .ok_or(StoreError::NotFound { what: "task", id })
        })
        .await
    }

    /// Every task, oldest first.
    pub async fn list_tasks(&self) -> Result<Vec<Task>, StoreError> {
        self.call(|conn| {
            let mut stmt =
                conn.prepare("SELECT id, title, description, state, created_at, updated_at FROM tasks ORDER BY id")?;
            let tasks = stmt.query_map([], task_from_row)?.collect::<Result<Vec<_>, _>>()?;
            Ok(tasks)
        })
        .await
    }

    /// Sets a task's state.
    pub async fn set_task_state(&self, id: String, state: &'static str) -> Result<(), StoreError> {
        self.call(move |conn| {
            conn.execute(
                "UPDATE tasks SET state = ?2, updated_at = ?3 WHERE id = ?1",
                params![id, state, now_ms()],
            )?;
            Ok(())
        })
        .await
    }

    /// Inserts a session row (the task must exist).
    pub async fn create_session(&self, row: SessionRow) -> Result<SessionRow, StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let exists: bool = tx.query_row("SELECT EXISTS(SELECT 1 FROM tasks WHERE id = ?1)", [&row.task_id], |r| r.get(0))?;
            if !exists {
                return Err(StoreError::NotFound { what: "task", id: row.task_id });
            }
            tx.execute(
                &format!("INSERT INTO task_sessions ({SESSION_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"),
                params![
                    row.id,
                    row.task_id,
                    row.agent_profile_id,
                    row.profile_snapshot.to_string(),
                    row.runtime,
                    row.state.as_str(),
                    row.workspace_path,
                    row.error_message,
                    row.created_at,
                    row.updated_at,
                    row.initial_prompt,
                    row.worktree_repo,
                    row.worktree_branch,
                    (!row.runtime_labels.is_empty())
                        .then(|| serde_json::to_string(&row.runtime_labels).unwrap_or_default())
                ],
            )?;
            tx.commit()?;
            Ok(row)
        })
        .await
    }

    /// A session by id.
    pub async fn get_session(&self, id: String) -> Result<SessionRow, StoreError> {
        self.call(move |conn| {
            let row = conn
                .query_row(
                    &format!("SELECT {SESSION_COLUMNS} FROM task_sessions WHERE id = ?1"),
                    [&id],
                    session_from_row,
                )
                .optional()?
                .ok_or(StoreError::NotFound { what: "session", id })?;
            finish_session(row)
        })
        .await
    }

    /// Sessions, of one task or of all, oldest first.
    pub async fn list_sessions(
        &self,
        task_id: Option<String>,
    ) -> Result<Vec<SessionRow>, StoreError> {
        self.call(move |conn| {
            let mut stmt = conn.prepare(&format!(
                "SELECT {SESSION_COLUMNS} FROM task_sessions WHERE ?1 IS NULL OR task_id = ?1 ORDER BY id"
            ))?;
            let rows = stmt.query_map([&task_id], session_from_row)?.collect::<Result<Vec<_>, _>>()?;
            rows.into_iter().map(finish_session).collect()
        })
        .await
    }

    /// Which of `ids` are stored sessions: what recovery needs to tell an orphaned container
    /// (no snapshot is parsed, and only the sessions asked about are read).
    pub async fn existing_sessions(
        &self,
        ids: Vec<String>,
    ) -> Result<std::collections::HashSet<String>, StoreError> {
        if ids.is_empty() {
            return Ok(Default::default());
        }
        let ids = serde_json::Value::from(ids).to_string();
        self.call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT id FROM task_sessions WHERE id IN (SELECT value FROM json_each(?1))",
            )?;
            let ids = stmt.query_map([ids], |row| row.get(0))?.collect::<Result<_, _>>()?;
            Ok(ids)
        })
        .await
    }

    /// Sets a session's state and error message, and its task's state with it.
    pub async fn set_session_state(
        &self,
        id: String,
        state: SessionState,
        error: Option<String>,
        task_state: Option<&'static str>,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ms();
            let changed = tx.execute(
                "UPDATE task_sessions SET state = ?2, error_message = ?3, updated_at = ?4 WHERE id = ?1",
                params![id, state.as_str(), error, now],
            )?;
            if changed == 0 {
                return Err(StoreError::NotFound { what: "session", id });
            }
            log(&tx, &id, &TimelineEvent::State { state, error })?;
            if let Some(task_state) = task_state {
                tx.execute(
                    "UPDATE tasks SET state = ?2, updated_at = ?3 WHERE id = (SELECT task_id FROM task_sessions WHERE id = ?1)",
                    params![id, task_state, now],
                )?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// A live session (not ended) whose workspace is one of `paths`: `(id, state)`.
    pub async fn workspace_holder(
        &self,
        paths: Vec<String>,
    ) -> Result<Option<(String, SessionState)>, StoreError> {
        let paths = serde_json::Value::from(paths).to_string();
        self.call(move |conn| {
            let row: Option<(String, String)> = conn
                .query_row(
                    "SELECT id, state FROM task_sessions WHERE workspace_path IN (SELECT value FROM json_each(?1)) \
                     AND state NOT IN ('COMPLETED', 'CANCELLED') ORDER BY created_at LIMIT 1",
                    [paths],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            row.map(|(id, state)| Ok((id, session_state(&state)?))).transpose()
        })
        .await
    }

    /// How many sessions there are per `(state, runtime)` (from the index, not the rows).
    pub async fn session_counts(&self) -> Result<Vec<(SessionState, String, i64)>, StoreError> {
        self.call(|conn| {
            let mut stmt = conn.prepare(
                "SELECT state, runtime, count(*) FROM task_sessions GROUP BY state, runtime",
            )?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter()
                .map(|(state, runtime, count)| Ok((session_state(&state)?, runtime, count)))
                .collect()
        })
        .await
    }

    /// Replaces a session's profile snapshot (`resume {refresh_profile: true}`).
    pub async fn set_profile_snapshot(
        &self,
        id: String,
        snapshot: serde_json::Value,
    ) -> Result<(), StoreError> {
        let json = snapshot.to_string();
        self.call(move |conn| {
            let changed = conn.execute(
                "UPDATE task_sessions SET profile_snapshot = ?2, updated_at = ?3 WHERE id = ?1",
                params![id, json, now_ms()],
            )?;
            if changed == 0 {
                return Err(StoreError::NotFound { what: "session", id });
            }
            Ok(())
        })
        .await
    }

    /// Deletes a session and everything that hangs off it.
    pub async fn delete_session(&self, id: String) -> Result<(), StoreError> {
        self.call(move |conn| {
            let changed = conn.execute("DELETE FROM task_sessions WHERE id = ?1", [&id])?;
            if changed == 0 {
                return Err(StoreError::NotFound { what: "session", id });
            }
            Ok(())
        })
        .await
    }

    /// Records an execution, replacing the previous one: a new execution gets the next
    /// generation; writing the same execution again keeps its own. Returns the row stored.
    pub async fn put_executor(&self, row: ExecutorRow) -> Result<ExecutorRow, StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let previous: Option<(i64, String)> = tx
                .query_row(
                    "SELECT generation, execution_id FROM executors_running WHERE session_id = ?1",
                    [&row.session_id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let mut row = row;
            let same = previous.as_ref().is_some_and(|(_, id)| *id == row.execution_id);
            row.generation = match previous {
                Some((generation, _)) if same => generation,
                Some((generation, _)) => generation + 1,
                None => 1,
            };
            if !same {
                let started = TimelineEvent::ExecutionStarted {
                    execution_id: row.execution_id.clone(),
                    generation: row.generation,
                };
                log(&tx, &row.session_id, &started)?;
            }
            let now = now_ms();
            tx.execute(
                "INSERT OR REPLACE INTO executors_running (session_id, execution_id, generation, runtime, status, resume_token, \
                 agentctl_port, agentctl_pid, agentctl_start_time, boot_id, agentctl_token, acked_seq, resume_context_pending, \
                 acp_session_id, resume_outcome, runtime_handle, agentctl_url, agentctl_cert, last_seen_at, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?15, ?16, ?17, ?18, ?19, ?14, ?14, ?14)",
                params![
                    row.session_id,
                    row.execution_id,
                    row.generation,
                    row.runtime,
                    row.status,
                    row.resume_token,
                    row.agentctl_port,
                    row.agentctl_pid,
                    row.agentctl_start_time,
                    row.boot_id,
                    row.agentctl_token,
                    row.acked_seq,
                    row.resume_context_pending,
                    now,
                    row.acp_session_id,
                    row.resume_outcome.map(Named),
                    row.runtime_handle.as_ref().map(|handle| handle.to_string()),
                    row.agentctl_url,
                    row.agentctl_cert
                ],
            )?;
            tx.commit()?;
            Ok(row)
        })
        .await
    }

    /// The current execution of a session, if any.
    pub async fn get_executor(
        &self,
        session_id: String,
    ) -> Result<Option<ExecutorRow>, StoreError> {
        self.call(move |conn| {
            Ok(conn
                .query_row(
                    &format!(
                        "SELECT {EXECUTOR_COLUMNS} FROM executors_running WHERE session_id = ?1"
                    ),
                    [&session_id],
                    executor_from_row,
                )
                .optional()?)
        })
        .await
    }

    /// Sessions caught `STARTING` or `RUNNING` with no runtime record at all (the supervisor
    /// died before the first launch recorded anything): recovery must not leave them so.
    pub async fn stranded_sessions(&self) -> Result<Vec<SessionRow>, StoreError> {
        self.call(|conn| {
            let columns: Vec<String> = SESSION_COLUMNS.split(", ").map(|c| format!("s.{c}")).collect();
            let sql = format!(
                "SELECT {} FROM task_sessions s LEFT JOIN executors_running e ON e.session_id = s.id \
                 WHERE s.state IN ('CREATED', 'STARTING', 'RUNNING') AND e.session_id IS NULL ORDER BY s.id",
                columns.join(", ")
            );
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query_map([], session_from_row)?.collect::<Result<Vec<_>, _>>()?;
            rows.into_iter().map(finish_session).collect()
        })
        .await
    }

    /// What restart recovery looks at: every active session that has a runtime record and
    /// may need recovering, with its state, runtime and record, and whether it left work open
    /// (a running turn or a pending request); and how many sessions are active in all.
    ///
    /// Sessions certainly at rest are left out without reading their rows: runtime
    /// `standalone` (both the session's and the record's), waiting for input, the execution
    /// over, no work open, no live sidecar with the recorded pid (`live_pids`) and none
    /// serving the session's state dir (`live_sessions`). Everything else comes back, found
    /// through indexes, so a restart does not grow with the sessions at rest. No profile
    /// snapshot is parsed. See [`Store::active_executions`] for the whole rows.
    pub async fn recovery_candidates(
        &self,
        standalone: &str,
        live_pids: &std::collections::HashSet<u32>,
        live_sessions: Vec<String>,
    ) -> Result<(Vec<RecoveryCandidate>, usize), StoreError> {
        let standalone = standalone.to_owned();
        // Lists go in as JSON arrays (read with `json_each`).
        let live_pids =
            serde_json::Value::from(live_pids.iter().copied().collect::<Vec<_>>()).to_string();
        let live_sessions = serde_json::Value::from(live_sessions).to_string();
        let not_over: Vec<&str> = ExecutorStatus::ALL
            .iter()
            .filter(|status| !status.is_over())
            .map(|status| status.as_str())
            .collect();
        let not_over = serde_json::Value::from(not_over).to_string();
        self.call(move |conn| {
            let sql = recovery_candidates_sql();
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt
                .query_map(params![standalone, not_over, live_pids, live_sessions], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, bool>(2)?,
                        executor_from_row_at(r, 3)?,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let candidates = rows
                .into_iter()
                .map(|(state, runtime, open_work, executor)| {
                    Ok(RecoveryCandidate {
                        state: session_state(&state)?,
                        runtime,
                        open_work,
                        executor,
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            let active: i64 = conn.query_row(
                "SELECT count(*) FROM task_sessions WHERE state IN ('STARTING', 'RUNNING', 'WAITING_FOR_INPUT')",
                [],
                |r| r.get(0),
            )?;
            Ok((candidates, usize::try_from(active).unwrap_or(0)))
        })
        .await
    }

    /// Sessions ended (stopped or cancelled) with work still open: a running turn or a
    /// pending request. A stop records the end first and the turn's end after its
    /// sidecar is retired; a kill in between leaves this, for recovery to finish.
    pub async fn ended_with_open_work(&self) -> Result<Vec<SessionRow>, StoreError> {
        self.call(|conn| {
            let sql = format!(
                "SELECT {SESSION_COLUMNS} FROM task_sessions s WHERE s.state IN ('COMPLETED', 'CANCELLED') \
                 AND (EXISTS (SELECT 1 FROM turns t WHERE t.session_id = s.id AND t.state = 'running') \
                 OR EXISTS (SELECT 1 FROM pending_requests p WHERE p.session_id = s.id)) ORDER BY s.id"
            );
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query_map([], session_from_row)?.collect::<Result<Vec<_>, _>>()?;
            rows.into_iter().map(finish_session).collect()
        })
        .await
    }

    /// Executions not known to be over whose session is not active (stopped, paused,
    /// failed, cancelled): a teardown cut short by a kill left them, and their sidecars
    /// must go.
    pub async fn unfinished_executions_at_rest(
        &self,
    ) -> Result<Vec<(SessionRow, ExecutorRow)>, StoreError> {
        self.executions_where(
            "s.state NOT IN ('CREATED', 'STARTING', 'RUNNING', 'WAITING_FOR_INPUT') \
             AND e.status NOT IN ('exited', 'lost', 'dead', 'stopped')",
        )
        .await
    }

    /// Every active session that has a runtime record: the candidates for re-adoption.
    pub async fn active_executions(&self) -> Result<Vec<(SessionRow, ExecutorRow)>, StoreError> {
        self.executions_where("s.state IN ('STARTING', 'RUNNING', 'WAITING_FOR_INPUT')").await
    }

    /// Sessions and their runtime records, where `condition` (over `s` and `e`) holds.
    async fn executions_where(
        &self,
        condition: &'static str,
    ) -> Result<Vec<(SessionRow, ExecutorRow)>, StoreError> {
        self.call(move |conn| {
            let columns: Vec<String> = SESSION_COLUMNS.split(", ").map(|c| format!("s.{c}")).collect();
            let exec_columns: Vec<String> = EXECUTOR_COLUMNS.split(", ").map(|c| format!("e.{c}")).collect();
            let sql = format!(
                "SELECT {}, {} FROM task_sessions s JOIN executors_running e ON e.session_id = s.id \
                 WHERE {condition} ORDER BY s.id",
                columns.join(", "),
                exec_columns.join(", ")
            );
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt
                .query_map([], |r| {
                    let session = session_from_row(r)?;
                    let executor = executor_from_row_at(r, SESSION_COLUMNS.split(", ").count())?;
                    Ok((session, executor))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter().map(|(session, executor)| Ok((finish_session(session)?, executor))).collect()
        })
        .await
    }

    /// The running turns of an execution: `(turn_id, request_id)`.
    pub async fn open_turns(
        &self,
        session_id: String,
        execution_id: String,
    ) -> Result<Vec<OpenTurn>, StoreError> {
        self.call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT id, request_id, delivered FROM turns WHERE session_id = ?1 AND execution_id = ?2 AND state = 'running' ORDER BY id",
            )?;
            let rows = stmt
                .query_map(params![session_id, execution_id], |r| {
                    Ok(OpenTurn { turn_id: r.get(0)?, request_id: r.get(1)?, delivered: r.get(2)? })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// The running turns of a session, oldest first.
    pub async fn running_turns(&self, session_id: String) -> Result<Vec<String>, StoreError> {
        self.call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT id FROM turns WHERE session_id = ?1 AND state = 'running' ORDER BY id",
            )?;
            let ids =
                stmt.query_map([&session_id], |r| r.get(0))?.collect::<Result<Vec<_>, _>>()?;
            Ok(ids)
        })
        .await
    }

    /// Marks every running turn of a session `interrupted` (its execution died while the
    /// supervisor was away); returns their ids.
    pub async fn interrupt_turns(
        &self,
        session_id: String,
        error: String,
    ) -> Result<Vec<String>, StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let ids = {
                let mut stmt = tx.prepare(
                    "SELECT id FROM turns WHERE session_id = ?1 AND state = 'running' ORDER BY id",
                )?;
                stmt.query_map([&session_id], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?
            };
            // The same error its `turn_ended` event carries.
            tx.execute(
                "UPDATE turns SET state = 'interrupted', error = ?3, \
                 ended_at = ?2 WHERE session_id = ?1 AND state = 'running'",
                params![session_id, now_ms(), error],
            )?;
            for turn_id in &ids {
                let ended = TimelineEvent::TurnEnded {
                    turn_id: turn_id.clone(),
                    state: protocol::api::TurnState::Interrupted,
                    stop_reason: None,
                    error: Some(error.clone()),
                };
                log(&tx, &session_id, &ended)?;
            }
            tx.commit()?;
            Ok(ids)
        })
        .await
    }

    /// Keeps a pause request (replacing an earlier one).
    pub async fn put_pause(
        &self,
        session_id: String,
        pause: PauseRequest,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "INSERT OR REPLACE INTO session_pauses (session_id, reason, force_at, requested_at, kind) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![session_id, pause.reason, pause.force_at, now_ms(), pause.trigger.as_str()],
            )?;
            let requested = TimelineEvent::PauseRequested {
                reason: pause.reason,
                trigger: pause.trigger,
                force_at: pause.force_at,
            };
            log(&tx, &session_id, &requested)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// Every pause request that waits: `(session id, request)`.
    pub async fn pauses(&self) -> Result<Vec<(String, PauseRequest)>, StoreError> {
        self.call(|conn| {
            let mut stmt =
                conn.prepare("SELECT session_id, reason, force_at, kind FROM session_pauses")?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?, r.get::<_, String>(3)?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter()
                .map(|(session_id, reason, force_at, kind)| {
                    let trigger = journal::parse_trigger(&kind)?;
                    Ok((session_id, PauseRequest { reason, force_at, trigger }))
                })
                .collect()
        })
        .await
    }

    /// The session's pause request, if one waits.
    pub async fn get_pause(&self, session_id: String) -> Result<Option<PauseRequest>, StoreError> {
        self.call(move |conn| {
            let row: Option<(Option<String>, i64, String)> = conn
                .query_row(
                    "SELECT reason, force_at, kind FROM session_pauses WHERE session_id = ?1",
                    [&session_id],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()?;
            row.map(|(reason, force_at, kind)| {
                Ok(PauseRequest { reason, force_at, trigger: journal::parse_trigger(&kind)? })
            })
            .transpose()
        })
        .await
    }

    /// Sets the session `PAUSED` and drops its pause request, in one transaction with its
    /// timeline rows and, for an exhaustion, the pending handoff.
    pub async fn set_paused(
        &self,
        session_id: String,
        paused: PausedRecord,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let changed = tx.execute(
                "UPDATE task_sessions SET state = 'PAUSED', error_message = NULL, updated_at = ?2 WHERE id = ?1",
                params![session_id, now_ms()],
            )?;
            if changed == 0 {
                return Err(StoreError::NotFound { what: "session", id: session_id });
            }
            tx.execute("DELETE FROM session_pauses WHERE session_id = ?1", [&session_id])?;
            log(&tx, &session_id, &TimelineEvent::State {
                state: protocol::api::SessionState::Paused,
                error: None,
            })?;
            log(&tx, &session_id, &TimelineEvent::Paused {
                reason: paused.reason,
                trigger: paused.trigger,
                forced: paused.forced,
            })?;
            if let Some(snapshot_id) = paused.handoff {
                tx.execute(
                    "INSERT OR REPLACE INTO session_handoffs (session_id, snapshot_id, created_at) VALUES (?1, ?2, ?3)",
                    params![session_id, snapshot_id, now_ms()],
                )?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// Removes every pending request of a session; returns how many.
    pub async fn clear_pending(&self, session_id: String) -> Result<usize, StoreError> {
        self.call(move |conn| {
            Ok(conn.execute("DELETE FROM pending_requests WHERE session_id = ?1", [&session_id])?)
        })
        .await
    }

    /// The ACP session of an execution opened: its resume token (or none), its ACP session
    /// id, status `running`, and for a resume its outcome and whether the history is to be
    /// injected — one write, if the execution is still current. (`running` is what tells
    /// restart recovery that the handshake finished.) Returns whether it applied.
    pub async fn record_opened(
        &self,
        session_id: String,
        execution_id: String,
        opened: Opened,
    ) -> Result<bool, StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let changed = tx.execute(
                "UPDATE executors_running SET resume_token = ?3, acp_session_id = ?4, status = ?5, \
                 resume_outcome = COALESCE(?6, resume_outcome), \
                 resume_context_pending = COALESCE(?7, resume_context_pending), \
                 updated_at = ?8, last_seen_at = ?8 WHERE session_id = ?1 AND execution_id = ?2",
                params![
                    session_id,
                    execution_id,
                    opened.resume_token,
                    opened.acp_session_id,
                    ExecutorStatus::Running,
                    opened.outcome.map(Named),
                    opened.inject_history.then_some(true),
                    now_ms()
                ],
            )?;
            if changed == 1
                && let Some(outcome) = opened.outcome
                && outcome != ResumeOutcome::AlreadyRunning
            {
                log(
                    &tx,
                    &session_id,
                    &TimelineEvent::Resumed { execution_id: execution_id.clone(), outcome },
                )?;
                if outcome == ResumeOutcome::ContextHandoff {
                    tx.execute(
                        "DELETE FROM session_handoffs WHERE session_id = ?1",
                        [&session_id],
                    )?;
                }
            }
            tx.commit()?;
            Ok(changed == 1)
        })
        .await
    }

    /// Sets or clears the "inject the history into the next prompt" flag, if the execution
    /// is still current.
    pub async fn set_resume_context_pending(
        &self,
        session_id: String,
        execution_id: String,
        pending: bool,
    ) -> Result<bool, StoreError> {
        self.cas_executor(
            session_id,
            execution_id,
            "resume_context_pending = ?3",
            rusqlite::types::Value::Integer(pending.into()),
        )
        .await
    }

    /// Compare-and-set on the current execution: runs `sql` (with `?1` = session id,
    /// `?2` = execution id, `?3` = the value) only if `execution_id` is still current.
    /// Returns whether it applied.
    async fn cas_executor(
        &self,
        session_id: String,
        execution_id: String,
        set: &'static str,
        value: rusqlite::types::Value,
    ) -> Result<bool, StoreError> {
        self.call(move |conn| {
            let sql = format!(
                "UPDATE executors_running SET {set}, updated_at = ?4, last_seen_at = ?4 WHERE session_id = ?1 AND execution_id = ?2"
            );
            let changed = conn.execute(&sql, params![session_id, execution_id, value, now_ms()])?;
            Ok(changed == 1)
        })
        .await
    }

    /// Stores the resume token, if the execution is still current.
    pub async fn set_resume_token(
        &self,
        session_id: String,
        execution_id: String,
        token: Option<String>,
    ) -> Result<bool, StoreError> {
        let value = token.map_or(rusqlite::types::Value::Null, rusqlite::types::Value::Text);
        self.cas_executor(session_id, execution_id, "resume_token = ?3", value).await
    }

    /// Stores the execution's status, if it is still current.
    pub async fn set_executor_status(
        &self,
        session_id: String,
        execution_id: String,
        status: ExecutorStatus,
    ) -> Result<bool, StoreError> {
        self.cas_executor(
            session_id,
            execution_id,
            "status = ?3",
            rusqlite::types::Value::Text(status.as_str().into()),
        )
        .await
    }

    /// Stores the acknowledged agentctl seq, if the execution is still current.
    pub async fn set_acked_seq(
        &self,
        session_id: String,
        execution_id: String,
        seq: u64,
    ) -> Result<bool, StoreError> {
        self.cas_executor(
            session_id,
            execution_id,
            "acked_seq = MAX(acked_seq, ?3)",
            rusqlite::types::Value::Integer(seq as i64),
        )
        .await
    }

    /// Records a turn before its prompt is sent.
    pub async fn insert_turn(
        &self,
        turn_id: String,
        session_id: String,
        execution_id: String,
        request_id: String,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "INSERT INTO turns (id, session_id, execution_id, request_id, state, started_at, delivered) VALUES (?1, ?2, ?3, ?4, 'running', ?5, 0)",
                params![turn_id, session_id, execution_id, request_id, now_ms()],
            )?;
            log(&tx, &session_id, &TimelineEvent::TurnStarted { turn_id, execution_id })?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// Records that a turn's prompt reached agentctl.
    pub async fn mark_delivered(&self, turn_id: String) -> Result<(), StoreError> {
        self.call(move |conn| {
            conn.execute("UPDATE turns SET delivered = 1 WHERE id = ?1", [&turn_id])?;
            Ok(())
        })
        .await
    }

    /// Ends a turn.
    pub async fn end_turn(
        &self,
        turn_id: String,
        state: TurnState,
        stop_reason: Option<String>,
        error: Option<String>,
    ) -> Result<(), StoreError> {
        self.end_turn_then(turn_id, (state, stop_reason, error), None).await
    }

    /// Ends a turn and, in the same transaction, sets its session's state (`then`: state,
    /// error, task state): one write, and the timeline lists the turn's end before the
    /// state it led to.
    pub async fn end_turn_then(
        &self,
        turn_id: String,
        (state, stop_reason, error): (TurnState, Option<String>, Option<String>),
        then: Option<(SessionState, Option<String>, Option<&'static str>)>,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ms();
            tx.execute(
                "UPDATE turns SET state = ?2, stop_reason = ?3, error = ?4, ended_at = ?5 WHERE id = ?1",
                params![turn_id, Named(state), stop_reason, error, now],
            )?;
            let session_id: Option<String> = tx
                .query_row("SELECT session_id FROM turns WHERE id = ?1", [&turn_id], |r| r.get(0))
                .optional()?;
            if let Some(session_id) = session_id {
                let ended =
                    TimelineEvent::TurnEnded { turn_id, state, stop_reason, error };
                log(&tx, &session_id, &ended)?;
                if let Some((session_state, error, task_state)) = then {
                    tx.execute(
                        "UPDATE task_sessions SET state = ?2, error_message = ?3, updated_at = ?4 WHERE id = ?1",
                        params![session_id, session_state.as_str(), error, now],
                    )?;
                    log(&tx, &session_id, &TimelineEvent::State { state: session_state, error })?;
                    if let Some(task_state) = task_state {
                        tx.execute(
                            "UPDATE tasks SET state = ?2, updated_at = ?3 WHERE id = (SELECT task_id FROM task_sessions WHERE id = ?1)",
                            params![session_id, task_state, now],
                        )?;
                    }
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// A turn's `(state, stop_reason, error)`.
    pub async fn get_turn(
        &self,
        turn_id: String,
    ) -> Result<(String, Option<String>, Option<String>), StoreError> {
        self.call(move |conn| {
            conn.query_row(
                "SELECT state, stop_reason, error FROM turns WHERE id = ?1",
                [&turn_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?
            .ok_or(StoreError::NotFound { what: "turn", id: turn_id })
        })
        .await
    }

    /// Whether a prompt of the session ever reached its agent (a turn marked delivered):
    /// until one did, the prompt the session was created with has not run.
    pub async fn prompt_delivered(&self, session_id: String) -> Result<bool, StoreError> {
        self.call(move |conn| {
            Ok(conn.query_row(
                "SELECT EXISTS (SELECT 1 FROM turns WHERE session_id = ?1 AND delivered = 1)",
                [&session_id],
                |row| row.get(0),
            )?)
        })
        .await
    }

    /// Every turn of a session, oldest first.
    pub async fn session_turns(&self, session_id: String) -> Result<Vec<TurnRow>, StoreError> {
        self.call(move |conn| {
            let mut statement = conn.prepare(
                "SELECT id, execution_id, state, stop_reason, error, started_at, ended_at \
                 FROM turns WHERE session_id = ?1 ORDER BY started_at, id",
            )?;
            let rows = statement.query_map([&session_id], |r| {
                Ok(TurnRow {
                    id: r.get(0)?,
                    execution_id: r.get(1)?,
                    state: r.get::<_, Named<TurnState>>(2)?.0,
                    stop_reason: r.get(3)?,
                    error: r.get(4)?,
                    started_at: r.get(5)?,
                    ended_at: r.get(6)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Records an agent request waiting for a person.
    pub async fn insert_pending(
        &self,
        session_id: String,
        execution_id: String,
        request_id: String,
        method: String,
        params: serde_json::Value,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            conn.execute(
                "INSERT OR REPLACE INTO pending_requests (session_id, execution_id, request_id, method, params, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![session_id, execution_id, request_id, method, params.to_string(), now_ms()],
            )?;
            Ok(())
        })
        .await
    }

    /// Removes a pending request; returns whether it existed.
    pub async fn delete_pending(
        &self,
        session_id: String,
        request_id: String,
    ) -> Result<bool, StoreError> {
        self.call(move |conn| {
            Ok(conn.execute(
                "DELETE FROM pending_requests WHERE session_id = ?1 AND request_id = ?2",
                params![session_id, request_id],
            )? == 1)
        })
        .await
    }

    /// The pending requests of a session: `(request_id, method, params)`.
    pub async fn list_pending(
        &self,
        session_id: String,
    ) -> Result<Vec<(String, String, serde_json::Value)>, StoreError> {
        self.call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT request_id, method, params FROM pending_requests WHERE session_id = ?1 ORDER BY created_at",
            )?;
            let rows = stmt
                .query_map([&session_id], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter()
                .map(|(id, method, params)| {
                    let params = serde_json::from_str(&params)
                        .map_err(|err| StoreError::Corrupt { what: "pending request", detail: err.to_string() })?;
                    Ok((id, method, params))
                })
                .collect()
        })
        .await
    }
}

#[cfg(test)]
mod tests;
