//! Tasks and session rows: created, read, listed, their state, and deleted.

use super::{
    Connection, OptionalExtension, SESSION_COLUMNS, SessionRow, SessionState, Store, StoreError,
    Task, TimelineEvent, TransactionBehavior, log, now_ms, params, session_state, task_state,
};
use crate::ids::SessionId;

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

    /// Deletes a task row (its sessions' rows go with it).
    pub async fn delete_task(&self, id: String) -> Result<(), StoreError> {
        self.call(move |conn| {
            if conn.execute("DELETE FROM tasks WHERE id = ?1", [&id])? == 0 {
                return Err(StoreError::NotFound { what: "task", id });
            }
            Ok(())
        })
        .await
    }

    /// Records that a branch Tether made is to be deleted (before it is).
    pub async fn add_branch_deletion(
        &self,
        repo: String,
        branch: String,
        session_id: SessionId,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            conn.execute(
                "INSERT OR REPLACE INTO branch_deletions (repo, branch, session_id) VALUES (?1, ?2, ?3)",
                params![repo, branch, session_id],
            )?;
            Ok(())
        })
        .await
    }

    /// The branch is gone: its deletion is done.
    pub async fn remove_branch_deletion(
        &self,
        repo: String,
        branch: String,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            conn.execute(
                "DELETE FROM branch_deletions WHERE repo = ?1 AND branch = ?2",
                [&repo, &branch],
            )?;
            Ok(())
        })
        .await
    }

    /// Branch deletions not known to be done, with whether another stored session (not the
    /// one being deleted) still works on the branch (`repo`, `branch`, `in use`).
    pub async fn branch_deletions(&self) -> Result<Vec<(String, String, bool)>, StoreError> {
        self.call(|conn| {
            let mut stmt = conn.prepare(
                "SELECT b.repo, b.branch, EXISTS (SELECT 1 FROM task_sessions s \
                 WHERE s.worktree_repo = b.repo AND s.worktree_branch = b.branch \
                 AND s.id != b.session_id AND s.state NOT IN ('COMPLETED', 'CANCELLED')) \
                 FROM branch_deletions b ORDER BY b.repo, b.branch",
            )?;
            let rows = stmt
                .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
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
        let row = self
            .call(move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                insert_session(&tx, &row)?;
                tx.commit()?;
                Ok(row)
            })
            .await?;
        self.announce_session(&row.id);
        Ok(row)
    }

    /// A session by id.
    pub async fn get_session(&self, id: SessionId) -> Result<SessionRow, StoreError> {
        self.call(move |conn| {
            let row = conn
                .query_row(
                    &format!("SELECT {SESSION_COLUMNS} FROM task_sessions WHERE id = ?1"),
                    [&id],
                    session_from_row,
                )
                .optional()?
                .ok_or(StoreError::NotFound { what: "session", id: id.into_string() })?;
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
            let sql = format!(
                "SELECT {SESSION_COLUMNS} FROM task_sessions WHERE ?1 IS NULL OR task_id = ?1 ORDER BY id"
            );
            sessions_matching(conn, &sql, [&task_id])
        })
        .await
    }

    /// Which of `ids` are stored sessions: what recovery needs to tell an orphaned container
    /// (no snapshot is parsed, and only the sessions asked about are read).
    pub async fn existing_sessions(
        &self,
        ids: Vec<SessionId>,
    ) -> Result<std::collections::HashSet<SessionId>, StoreError> {
        if ids.is_empty() {
            return Ok(Default::default());
        }
        let ids = serde_json::to_string(&ids)
            .map_err(|err| StoreError::Corrupt { what: "session ids", detail: err.to_string() })?;
        self.call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT id FROM task_sessions WHERE id IN (SELECT value FROM json_each(?1))",
            )?;
            let ids = stmt.query_map([ids], |row| row.get(0))?.collect::<Result<_, _>>()?;
            Ok(ids)
        })
        .await
    }

    /// The highest event seq a session's state changes recorded (0: none, or no such
    /// session).
    pub async fn event_seq_high(&self, id: SessionId) -> Result<u64, StoreError> {
        self.call(move |conn| {
            let high: Option<i64> = conn
                .query_row("SELECT event_seq_high FROM task_sessions WHERE id = ?1", [id], |row| {
                    row.get(0)
                })
                .optional()?;
            Ok(high.map_or(0, |high| u64::try_from(high).unwrap_or(0)))
        })
        .await
    }

    /// Sets a session's state and error message, and its task's state with it, and records
    /// `event_seq_high`, the highest event seq its log has issued (it never goes down).
    pub async fn set_session_state(
        &self,
        id: SessionId,
        state: SessionState,
        error: Option<String>,
        task_state: Option<&'static str>,
        event_seq_high: u64,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ms();
            let changed = tx.execute(
                "UPDATE task_sessions SET state = ?2, error_message = ?3, updated_at = ?4, \
                 event_seq_high = MAX(event_seq_high, ?5) WHERE id = ?1",
                params![id, state.as_str(), error, now, event_seq_high as i64],
            )?;
            if changed == 0 {
                return Err(StoreError::NotFound { what: "session", id: id.into_string() });
            }
            log(&tx, &id, &TimelineEvent::State { state, error })?;
            if let Some(task_state) = task_state {
                tx.execute(
                    "UPDATE tasks SET state = ?2, updated_at = ?3 WHERE id = (SELECT task_id FROM task_sessions WHERE id = ?1)",
                    params![id, task_state, now],
                )?;
            }
            let workflow = super::workflows::workflow_of(&tx, &id)?;
            tx.commit()?;
            Ok((workflow, id))
        })
        .await
        .map(|(workflow, id)| {
            self.announce(workflow);
            self.announce_session(&id);
        })
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

    /// How many sessions are parked: `PAUSED` because their agent was idle.
    pub async fn parked_count(&self) -> Result<i64, StoreError> {
        self.call(|conn| {
            Ok(conn.query_row(
                "SELECT count(*) FROM task_sessions WHERE state = 'PAUSED' AND pause_kind = 'idle'",
                [],
                |r| r.get(0),
            )?)
        })
        .await
    }

    /// Replaces a session's pinned profile (`resume {refresh_profile: true}`).
    pub async fn set_pinned_profile(
        &self,
        id: SessionId,
        snapshot: serde_json::Value,
    ) -> Result<(), StoreError> {
        let json = snapshot.to_string();
        self.call(move |conn| {
            let changed = conn.execute(
                "UPDATE task_sessions SET profile_snapshot = ?2, updated_at = ?3 WHERE id = ?1",
                params![id, json, now_ms()],
            )?;
            if changed == 0 {
                return Err(StoreError::NotFound { what: "session", id: id.into_string() });
            }
            Ok(())
        })
        .await
    }

    /// Deletes a session and everything that hangs off it.
    pub async fn delete_session(&self, id: SessionId) -> Result<(), StoreError> {
        let announce = id.clone();
        self.call(move |conn| {
            let changed = conn.execute("DELETE FROM task_sessions WHERE id = ?1", [&id])?;
            if changed == 0 {
                return Err(StoreError::NotFound { what: "session", id: id.into_string() });
            }
            Ok(())
        })
        .await?;
        self.announce_session(&announce);
        Ok(())
    }
}

pub(super) fn session_from_row(
    row: &rusqlite::Row<'_>,
) -> rusqlite::Result<(SessionRow, String, String)> {
    Ok((
        SessionRow {
            id: row.get(0)?,
            task_id: row.get(1)?,
            agent_profile_id: row.get(2)?,
            pinned_profile: serde_json::Value::Null,
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
            mcp_servers: row
                .get::<_, Option<String>>(14)?
                .and_then(|text| serde_json::from_str(&text).ok())
                .unwrap_or_default(),
            title: row.get(15)?,
            additional_directories: row
                .get::<_, Option<String>>(16)?
                .and_then(|text| serde_json::from_str(&text).ok())
                .unwrap_or_default(),
        },
        row.get::<_, String>(3)?,
        row.get::<_, String>(5)?,
    ))
}

/// The session rows `sql` selects (its columns those of [`SESSION_COLUMNS`], in order).
pub(super) fn sessions_matching(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<SessionRow>, StoreError> {
    let mut stmt = conn.prepare(sql)?;
    let rows = stmt.query_map(params, session_from_row)?.collect::<Result<Vec<_>, _>>()?;
    rows.into_iter().map(finish_session).collect()
}

pub(super) fn finish_session(
    (mut row, snapshot, state): (SessionRow, String, String),
) -> Result<SessionRow, StoreError> {
    row.pinned_profile = serde_json::from_str(&snapshot)
        .map_err(|err| StoreError::Corrupt { what: "pinned profile", detail: err.to_string() })?;
    row.state = session_state(&state)?;
    Ok(row)
}

pub(super) fn task_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Task> {
    Ok(Task {
        id: row.get(0)?,
        title: row.get(1)?,
        description: row.get(2)?,
        state: row.get(3)?,
        created_at: row.get(4)?,
        updated_at: row.get(5)?,
    })
}

/// Inserts a session row inside the caller's transaction (the task must exist).
pub(super) fn insert_session(
    tx: &rusqlite::Connection,
    row: &SessionRow,
) -> Result<(), StoreError> {
    let exists: bool =
        tx.query_row("SELECT EXISTS(SELECT 1 FROM tasks WHERE id = ?1)", [&row.task_id], |r| {
            r.get(0)
        })?;
    if !exists {
        return Err(StoreError::NotFound { what: "task", id: row.task_id.clone() });
    }
    tx.execute(
        &format!("INSERT INTO task_sessions ({SESSION_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"),
        params![
            row.id,
            row.task_id,
            row.agent_profile_id,
            row.pinned_profile.to_string(),
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
                .then(|| serde_json::to_string(&row.runtime_labels).unwrap_or_default()),
            (!row.mcp_servers.is_empty())
                .then(|| serde_json::to_string(&row.mcp_servers).unwrap_or_default()),
            row.title,
            (!row.additional_directories.is_empty())
                .then(|| serde_json::to_string(&row.additional_directories).unwrap_or_default()),
        ],
    )?;
    Ok(())
}
