//! Executions (`executors_running`): one row per session for its newest execution — what
//! a restart re-attaches to or fences, its resume token and acknowledged seq.

use super::{
    EXECUTOR_COLUMNS, ExecutionRow, ExecutionStatus, Named, Opened, OptionalExtension,
    RecoveryCandidate, ResumeOutcome, SESSION_COLUMNS, SessionRow, Store, StoreError,
    TimelineEvent, TransactionBehavior, finish_session, log, now_ms, params, session_from_row,
    session_state, sessions_matching,
};
use crate::ids::SessionId;

impl Store {
    /// Records an execution, replacing the previous one: a new execution gets the next
    /// generation; writing the same execution again keeps its own. Returns the row stored.
    pub async fn put_execution(&self, row: ExecutionRow) -> Result<ExecutionRow, StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let previous: Option<(i64, crate::ids::ExecutionId)> = tx
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
                    execution_id: row.execution_id.to_string(),
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
    pub async fn get_execution(
        &self,
        session_id: SessionId,
    ) -> Result<Option<ExecutionRow>, StoreError> {
        self.call(move |conn| {
            Ok(conn
                .query_row(
                    &format!(
                        "SELECT {EXECUTOR_COLUMNS} FROM executors_running WHERE session_id = ?1"
                    ),
                    [&session_id],
                    execution_from_row,
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
            sessions_matching(conn, &sql, [])
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
        live_sessions: Vec<SessionId>,
    ) -> Result<(Vec<RecoveryCandidate>, usize), StoreError> {
        let standalone = standalone.to_owned();
        // Lists go in as JSON arrays (read with `json_each`).
        let live_pids =
            serde_json::Value::from(live_pids.iter().copied().collect::<Vec<_>>()).to_string();
        let live_sessions = serde_json::to_string(&live_sessions).unwrap_or_else(|_| "[]".into());
        let not_over: Vec<&str> = ExecutionStatus::ALL
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
                        execution_from_row_at(r, 3)?,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let candidates = rows
                .into_iter()
                .map(|(state, runtime, open_work, execution)| {
                    Ok(RecoveryCandidate {
                        state: session_state(&state)?,
                        runtime,
                        open_work,
                        execution,
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
            sessions_matching(conn, &sql, [])
        })
        .await
    }

    /// Executions not known to be over whose session is not active (stopped, paused,
    /// failed, cancelled): a teardown cut short by a kill left them, and their sidecars
    /// must go.
    pub async fn unfinished_executions_at_rest(
        &self,
    ) -> Result<Vec<(SessionRow, ExecutionRow)>, StoreError> {
        self.executions_where(
            "s.state NOT IN ('CREATED', 'STARTING', 'RUNNING', 'WAITING_FOR_INPUT') \
             AND e.status NOT IN ('exited', 'lost', 'dead', 'stopped')",
        )
        .await
    }

    /// Every active session that has a runtime record: the candidates for a re-attach.
    pub async fn active_executions(&self) -> Result<Vec<(SessionRow, ExecutionRow)>, StoreError> {
        self.executions_where("s.state IN ('STARTING', 'RUNNING', 'WAITING_FOR_INPUT')").await
    }

    /// Sessions and their runtime records, where `condition` (over `s` and `e`) holds.
    pub(super) async fn executions_where(
        &self,
        condition: &'static str,
    ) -> Result<Vec<(SessionRow, ExecutionRow)>, StoreError> {
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
                    let execution = execution_from_row_at(r, SESSION_COLUMNS.split(", ").count())?;
                    Ok((session, execution))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter().map(|(session, execution)| Ok((finish_session(session)?, execution))).collect()
        })
        .await
    }

    /// The ACP session of an execution opened: its resume token (or none), its ACP session
    /// id, status `running`, and for a resume its outcome and whether the history is to be
    /// injected — one write, if the execution is still current. (`running` is what tells
    /// restart recovery that the handshake finished.) Returns whether it applied.
    pub async fn record_opened(
        &self,
        session_id: SessionId,
        execution_id: crate::ids::ExecutionId,
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
                    ExecutionStatus::Running,
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
                    &TimelineEvent::Resumed { execution_id: execution_id.to_string(), outcome },
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
        session_id: SessionId,
        execution_id: crate::ids::ExecutionId,
        pending: bool,
    ) -> Result<bool, StoreError> {
        self.cas_execution(
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
    pub(super) async fn cas_execution(
        &self,
        session_id: SessionId,
        execution_id: crate::ids::ExecutionId,
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
        session_id: SessionId,
        execution_id: crate::ids::ExecutionId,
        token: Option<String>,
    ) -> Result<bool, StoreError> {
        let value = token.map_or(rusqlite::types::Value::Null, rusqlite::types::Value::Text);
        self.cas_execution(session_id, execution_id, "resume_token = ?3", value).await
    }

    /// Stores the execution's status, if it is still current.
    pub async fn set_execution_status(
        &self,
        session_id: SessionId,
        execution_id: crate::ids::ExecutionId,
        status: ExecutionStatus,
    ) -> Result<bool, StoreError> {
        self.cas_execution(
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
        session_id: SessionId,
        execution_id: crate::ids::ExecutionId,
        seq: u64,
    ) -> Result<bool, StoreError> {
        self.cas_execution(
            session_id,
            execution_id,
            "acked_seq = MAX(acked_seq, ?3)",
            rusqlite::types::Value::Integer(seq as i64),
        )
        .await
    }
}

pub(super) fn execution_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ExecutionRow> {
    execution_from_row_at(row, 0)
}

/// [`Store::recovery_candidates`]' query. Parameters: the standalone runtime's name, the
/// statuses of executions not over, the live sidecars' pids and the sessions whose state dir
/// a live sidecar serves (the last three JSON arrays).
pub(super) fn recovery_candidates_sql() -> String {
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

/// An execution row from `EXECUTOR_COLUMNS`, starting at column `base`.
pub(super) fn execution_from_row_at(
    row: &rusqlite::Row<'_>,
    base: usize,
) -> rusqlite::Result<ExecutionRow> {
    Ok(ExecutionRow {
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
