//! Workflows (`workflows`), their steps (`workflow_steps`) and their event streams
//! (`workflow_events`).
//!
//! Every change is one transaction with the events it publishes, so the stream never says
//! what the rows do not, nor misses what they do. A step starts in the transaction that
//! inserts its session; it completes in the transaction that ends its session's turn
//! ([`step_turn_ended`], called by `end_turn_then`). After each commit the workflow's id
//! is announced on [`Store::workflow_changes`], which is what the workflow engine awaits.

use crate::ids::SessionId;
use std::collections::BTreeMap;

use protocol::api::{StepState, WorkflowEvent, WorkflowEventKind, WorkflowState, WorkflowSummary};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::sessions::insert_session;
use super::{Named, PromptRefusal, SessionRow, Store, StoreError, now_ms};
use crate::ids::{StepId, WorkflowId};

/// A stored workflow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowRow {
    /// Its id.
    pub id: WorkflowId,
    /// Its task.
    pub task_id: String,
    /// The file's `name`.
    pub name: String,
    /// The file it was started from.
    pub spec_file: Option<String>,
    /// The file's text, as started (or as accepted at a resume).
    pub spec_text: String,
    /// SHA-256 of `spec_text`, hex.
    pub spec_sha256: String,
    /// The `--var` overrides.
    pub vars: BTreeMap<String, String>,
    /// Where its steps work.
    pub workspace: Option<String>,
    /// Where it is.
    pub state: WorkflowState,
    /// Why it failed.
    pub error: Option<String>,
    /// Times resumed.
    pub resumes: u32,
    /// The newest event's seq.
    pub event_seq: u64,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms.
    pub updated_at: i64,
}

/// A stored step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRow {
    /// The step (a `for_each` worker is `ID[N]`).
    pub step_id: StepId,
    /// Its place in the file.
    pub position: i64,
    /// Where it is.
    pub state: StepState,
    /// Its loop pass.
    pub iteration: u32,
    /// Times started.
    pub runs: u32,
    /// Times its prompt was sent again after its turn was interrupted.
    pub resends: u32,
    /// Launches of its session that failed.
    pub launch_failures: u32,
    /// `workflow.approve` was given for its current pass.
    pub approved: bool,
    /// What its completion leads to (a loop, a route, workers) has been applied.
    pub applied: bool,
    /// Its session.
    pub session_id: Option<SessionId>,
    /// The prompt its session was created with.
    pub prompt: Option<String>,
    /// Its final agent message.
    pub output: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
    /// Unix ms.
    pub started_at: Option<i64>,
    /// Unix ms.
    pub ended_at: Option<i64>,
    /// Its usage as its agent reported it (JSON of `StepUsage`).
    pub usage: Option<String>,
}

/// What a turn that completed leaves for its step: the final agent message and the usage
/// its agent reported (JSON of `StepUsage`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TurnOutput {
    /// The final agent message.
    pub text: String,
    /// The usage, when reported.
    pub usage: Option<String>,
}

impl StepPatch {
    /// A patch of `step_id` that changes nothing yet (its fields say what it changes).
    pub fn new(step_id: StepId) -> StepPatch {
        StepPatch {
            step_id,
            expect: None,
            state: None,
            iteration: None,
            resent: false,
            launch_failed: false,
            approved: None,
            applied: None,
            error: None,
            output: None,
            clear_run: false,
            ended: false,
            remove: false,
            insert_at: None,
            event: None,
        }
    }
}

/// A change to one step, applied only while the step is in `expect` (else the whole
/// update is dropped: the caller decided on a stale read).
#[derive(Debug, Clone, PartialEq)]
pub struct StepPatch {
    /// The step.
    pub step_id: StepId,
    /// The state it must be in.
    pub expect: Option<StepState>,
    /// Its new state.
    pub state: Option<StepState>,
    /// Its new loop pass.
    pub iteration: Option<u32>,
    /// Count a resend.
    pub resent: bool,
    /// Count a failed launch.
    pub launch_failed: bool,
    /// Set `approved`.
    pub approved: Option<bool>,
    /// Set `applied`.
    pub applied: Option<bool>,
    /// Set (or, with `Some(None)`, clear) the error.
    pub error: Option<Option<String>>,
    /// Set the output (a `for_each` template's, its workers' outputs).
    pub output: Option<String>,
    /// Forget the run's times (the step runs again). Its session stays recorded until the
    /// next run replaces it: a session not ended of a step not running is stopped by the
    /// planner, so this write records that stop too, and a kill right after it orphans
    /// nothing.
    pub clear_run: bool,
    /// Set `ended_at` to now.
    pub ended: bool,
    /// Delete the row (a step the file no longer has, once its session is stopped).
    pub remove: bool,
    /// Insert the row (a `for_each` worker) at this position instead of updating one.
    pub insert_at: Option<i64>,
    /// The event it publishes.
    pub event: Option<WorkflowEventKind>,
}

const WORKFLOW_COLUMNS: &str = "id, task_id, name, spec_file, spec_text, spec_sha256, vars, \
     workspace, state, error, resumes, event_seq, created_at, updated_at";

const STEP_COLUMNS: &str = "step_id, position, state, iteration, runs, resends, \
     launch_failures, approved, applied, session_id, prompt, output, error, started_at, ended_at, usage";

fn workflow_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<WorkflowRow> {
    let vars: String = r.get(6)?;
    Ok(WorkflowRow {
        id: r.get(0)?,
        task_id: r.get(1)?,
        name: r.get(2)?,
        spec_file: r.get(3)?,
        spec_text: r.get(4)?,
        spec_sha256: r.get(5)?,
        vars: serde_json::from_str(&vars).map_err(|err| {
            rusqlite::Error::FromSqlConversionFailure(6, rusqlite::types::Type::Text, err.into())
        })?,
        workspace: r.get(7)?,
        state: r.get::<_, Named<WorkflowState>>(8)?.0,
        error: r.get(9)?,
        resumes: r.get(10)?,
        event_seq: r.get::<_, i64>(11)? as u64,
        created_at: r.get(12)?,
        updated_at: r.get(13)?,
    })
}

fn step_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<StepRow> {
    Ok(StepRow {
        step_id: r.get(0)?,
        position: r.get(1)?,
        state: r.get::<_, Named<StepState>>(2)?.0,
        iteration: r.get(3)?,
        runs: r.get(4)?,
        resends: r.get(5)?,
        launch_failures: r.get(6)?,
        approved: r.get(7)?,
        applied: r.get(8)?,
        session_id: r.get(9)?,
        prompt: r.get(10)?,
        output: r.get(11)?,
        error: r.get(12)?,
        started_at: r.get(13)?,
        ended_at: r.get(14)?,
        usage: r.get(15)?,
    })
}

/// A workflow and its steps (in file order).
fn read_workflow(
    conn: &Connection,
    id: &WorkflowId,
) -> Result<(WorkflowRow, Vec<StepRow>), StoreError> {
    let row = conn
        .query_row(
            &format!("SELECT {WORKFLOW_COLUMNS} FROM workflows WHERE id = ?1"),
            [id],
            workflow_row,
        )
        .optional()?
        .ok_or_else(|| StoreError::NotFound { what: "workflow", id: id.to_string() })?;
    let mut statement = conn.prepare_cached(&format!(
        "SELECT {STEP_COLUMNS} FROM workflow_steps WHERE workflow_id = ?1 ORDER BY position, step_id"
    ))?;
    let steps = statement.query_map([id], step_row)?.collect::<Result<Vec<_>, _>>()?;
    Ok((row, steps))
}

/// The workflows as the list shows them (`only` one, or all), oldest first: a summary's
/// columns only, not the spec's text.
fn summaries(conn: &Connection, only: Option<&str>) -> Result<Vec<WorkflowSummary>, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT w.id, w.task_id, w.name, w.state, w.event_seq, w.created_at, w.updated_at, \
         (SELECT COUNT(*) FROM workflow_steps s WHERE s.workflow_id = w.id), \
         (SELECT COUNT(*) FROM workflow_steps s WHERE s.workflow_id = w.id AND s.state IN ('completed', 'skipped')), \
         (SELECT json_group_array(s.step_id ORDER BY s.position, s.step_id) FROM workflow_steps s \
          WHERE s.workflow_id = w.id AND s.state = 'waiting_approval') \
         FROM workflows w WHERE ?1 IS NULL OR w.id = ?1 ORDER BY w.created_at, w.id",
    )?;
    let rows = statement.query_map([only], |r| {
        let waiting: String = r.get(9)?;
        Ok((
            WorkflowSummary {
                workflow_id: r.get(0)?,
                task_id: r.get(1)?,
                name: r.get(2)?,
                state: r.get::<_, Named<WorkflowState>>(3)?.0,
                last_event_seq: r.get::<_, i64>(4)? as u64,
                created_at: r.get(5)?,
                updated_at: r.get(6)?,
                steps: r.get(7)?,
                steps_done: r.get(8)?,
                waiting_approval: Vec::new(),
            },
            waiting,
        ))
    })?;
    rows.map(|row| {
        let (summary, waiting) = row?;
        let waiting_approval = serde_json::from_str(&waiting).map_err(|err| {
            StoreError::Corrupt { what: "waiting steps", detail: format!("{err}: {waiting}") }
        })?;
        Ok(WorkflowSummary { waiting_approval, ..summary })
    })
    .collect()
}

/// A step's session as the engine reads it (`None`: it was deleted).
fn step_session(
    conn: &Connection,
    session_id: &SessionId,
) -> Result<Option<StepSession>, StoreError> {
    let row: Option<(String, Option<String>, Option<String>)> = conn
        .query_row(
            "SELECT state, error_message, prompt_refused FROM task_sessions WHERE id = ?1",
            [session_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    let Some((state, error, refused)) = row else { return Ok(None) };
    let prompt_refused = match refused {
        Some(text) => Some(serde_json::from_str::<PromptRefusal>(&text).map_err(|err| {
            StoreError::Corrupt { what: "prompt refusal", detail: format!("{err}: {text}") }
        })?),
        None => None,
    };
    // The newest turn, and whether the execution it ran on is over (the session moved on
    // to another, or its own is no longer running): a turn cut by its agent's end.
    let last_turn = conn
        .query_row(
            "SELECT t.state, t.stop_reason, t.error, t.delivered, \
             (e.execution_id IS NULL OR e.execution_id != t.execution_id \
              OR e.status IN ('exited', 'lost', 'dead', 'stopped')) \
             FROM turns t LEFT JOIN executors_running e ON e.session_id = t.session_id \
             WHERE t.session_id = ?1 ORDER BY t.started_at DESC, t.id DESC LIMIT 1",
            [session_id],
            |r| {
                Ok(StepTurn {
                    state: r.get::<_, Named<protocol::api::TurnState>>(0)?.0,
                    stop_reason: r.get(1)?,
                    error: r.get(2)?,
                    delivered: r.get(3)?,
                    execution_over: r.get(4)?,
                })
            },
        )
        .optional()?;
    let prompt_delivered: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM turns WHERE session_id = ?1 AND delivered = 1)",
        [session_id],
        |r| r.get(0),
    )?;
    Ok(Some(StepSession {
        state: super::session_state(&state)?,
        error,
        last_turn,
        prompt_delivered,
        prompt_refused,
    }))
}

/// Appends an event to a workflow's stream (inside the caller's transaction).
fn push_event(
    conn: &Connection,
    workflow_id: &WorkflowId,
    kind: &WorkflowEventKind,
) -> rusqlite::Result<u64> {
    let now = now_ms();
    conn.execute(
        "UPDATE workflows SET event_seq = event_seq + 1, updated_at = ?2 WHERE id = ?1",
        params![workflow_id, now],
    )?;
    let seq: i64 =
        conn.query_row("SELECT event_seq FROM workflows WHERE id = ?1", [workflow_id], |r| {
            r.get(0)
        })?;
    let event = serde_json::to_string(kind)
        .map_err(|err| rusqlite::Error::ToSqlConversionFailure(Box::new(err)))?;
    conn.execute(
        "INSERT INTO workflow_events (workflow_id, seq, at, event) VALUES (?1, ?2, ?3, ?4)",
        params![workflow_id, seq, now, event],
    )?;
    Ok(seq as u64)
}

/// The workflow a session runs a step of, if any.
pub(super) fn workflow_of(
    conn: &Connection,
    session_id: &SessionId,
) -> rusqlite::Result<Option<WorkflowId>> {
    conn.query_row(
        "SELECT workflow_id FROM workflow_steps WHERE session_id = ?1 LIMIT 1",
        [session_id],
        |r| r.get(0),
    )
    .optional()
}

/// A turn of `session_id` ended (inside the transaction that records it): if the session
/// runs a step and the turn completed (stop reason `end_turn`), the step completes with
/// `output`. Returns the step's workflow, to announce.
pub(super) fn step_turn_ended(
    conn: &Connection,
    session_id: &SessionId,
    completed: bool,
    output: Option<&TurnOutput>,
) -> rusqlite::Result<Option<WorkflowId>> {
    let Some(workflow_id) = workflow_of(conn, session_id)? else { return Ok(None) };
    if completed {
        let step: Option<(StepId, Option<i64>)> = conn
            .query_row(
                "SELECT step_id, started_at FROM workflow_steps WHERE session_id = ?1 AND state = 'running'",
                [session_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        if let Some((step_id, started_at)) = step {
            let (output, usage) =
                output.map_or(("", None), |output| (output.text.as_str(), output.usage.as_deref()));
            if let Some(started) = started_at {
                let took = (now_ms() - started).max(0) as u64;
                crate::metrics::observe(
                    &crate::metrics::get().step_seconds,
                    std::time::Duration::from_millis(took),
                );
            }
            conn.execute(
                "UPDATE workflow_steps SET state = 'completed', output = ?3, error = NULL, \
                 ended_at = ?4, applied = 0, usage = ?5 WHERE workflow_id = ?1 AND step_id = ?2",
                params![workflow_id, step_id, output, now_ms(), usage],
            )?;
            let event = WorkflowEventKind::StepCompleted {
                step_id: step_id.into_string(),
                output: output.to_owned(),
            };
            push_event(conn, &workflow_id, &event)?;
        }
    }
    Ok(Some(workflow_id))
}

/// A step session's newest turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepTurn {
    /// Its state.
    pub state: protocol::api::TurnState,
    /// The agent's stop reason.
    pub stop_reason: Option<String>,
    /// Its error.
    pub error: Option<String>,
    /// Its prompt reached agentctl.
    pub delivered: bool,
    /// The execution it ran on is over.
    pub execution_over: bool,
}

/// What the engine reads of a step's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepSession {
    /// Its state.
    pub state: protocol::api::SessionState,
    /// Its error.
    pub error: Option<String>,
    /// Its newest turn.
    pub last_turn: Option<StepTurn>,
    /// Some prompt of it reached the agent.
    pub prompt_delivered: bool,
    /// Its first prompt was refused (and no turn was recorded since): why.
    pub prompt_refused: Option<PromptRefusal>,
}

impl Store {
    /// A workflow, its steps and their sessions, read at one moment (one call on the
    /// store's thread: no write falls between the reads, so a step and its session's turn
    /// always agree).
    #[allow(clippy::type_complexity)]
    pub async fn workflow_snapshot(
        &self,
        id: WorkflowId,
    ) -> Result<(WorkflowRow, Vec<StepRow>, BTreeMap<SessionId, Option<StepSession>>), StoreError>
    {
        self.call(move |conn| {
            let (row, steps) = read_workflow(conn, &id)?;
            let mut sessions = BTreeMap::new();
            for step in &steps {
                if let Some(session) = &step.session_id {
                    sessions.insert(session.clone(), step_session(conn, session)?);
                }
            }
            Ok((row, steps, sessions))
        })
        .await
    }

    /// Workflows whose records changed, by id, announced after each commit. A receiver
    /// that lags is told so (`Lagged`) and must read everything again.
    pub fn workflow_changes(&self) -> tokio::sync::broadcast::Receiver<WorkflowId> {
        self.changes.subscribe()
    }

    /// Sessions created, changed in state or deleted, by id, announced after each commit. A
    /// receiver that lags is told so (`Lagged`) and must read the list again.
    pub fn session_changes(&self) -> tokio::sync::broadcast::Receiver<SessionId> {
        self.session_changes.subscribe()
    }

    /// Announces that a session was created, changed state or was deleted.
    pub(super) fn announce_session(&self, session_id: &SessionId) {
        // No receiver: no list is followed.
        let _ = self.session_changes.send(session_id.clone());
    }

    /// Announces that a workflow's records changed.
    pub(super) fn announce(&self, workflow_id: Option<WorkflowId>) {
        if let Some(id) = workflow_id {
            // No receiver: nobody is waiting (no engine runs in this process).
            let _ = self.changes.send(id);
        }
    }

    /// Stores a new workflow, its steps `pending` (in this order), and its first event.
    pub async fn create_workflow(
        &self,
        row: WorkflowRow,
        steps: Vec<String>,
    ) -> Result<WorkflowRow, StoreError> {
        let stored = self
            .call(move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let exists: bool = tx.query_row(
                    "SELECT EXISTS(SELECT 1 FROM tasks WHERE id = ?1)",
                    [&row.task_id],
                    |r| r.get(0),
                )?;
                if !exists {
                    return Err(StoreError::NotFound { what: "task", id: row.task_id });
                }
                let vars = serde_json::to_string(&row.vars).unwrap_or_else(|_| "{}".into());
                tx.execute(
                    &format!(
                        "INSERT INTO workflows ({WORKFLOW_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 0, ?12, ?12)"
                    ),
                    params![
                        row.id,
                        row.task_id,
                        row.name,
                        row.spec_file,
                        row.spec_text,
                        row.spec_sha256,
                        vars,
                        row.workspace,
                        Named(row.state),
                        row.error,
                        row.resumes,
                        row.created_at,
                    ],
                )?;
                for (position, step) in steps.iter().enumerate() {
                    tx.execute(
                        "INSERT INTO workflow_steps (workflow_id, step_id, position, state) VALUES (?1, ?2, ?3, 'pending')",
                        params![row.id, step, position as i64],
                    )?;
                }
                let event = WorkflowEventKind::WorkflowState { state: row.state, error: None };
                let seq = push_event(&tx, &row.id, &event)?;
                tx.commit()?;
                Ok(WorkflowRow { event_seq: seq, ..row })
            })
            .await?;
        self.announce(Some(stored.id.clone()));
        Ok(stored)
    }

    /// A workflow and its steps (in file order).
    pub async fn workflow(
        &self,
        id: WorkflowId,
    ) -> Result<(WorkflowRow, Vec<StepRow>), StoreError> {
        self.call(move |conn| read_workflow(conn, &id)).await
    }

    /// Every workflow as the list shows it, oldest first.
    pub async fn list_workflows(&self) -> Result<Vec<WorkflowSummary>, StoreError> {
        self.call(move |conn| summaries(conn, None)).await
    }

    /// One workflow as the list shows it; `None` when there is no such workflow.
    pub async fn workflow_summary(
        &self,
        id: WorkflowId,
    ) -> Result<Option<WorkflowSummary>, StoreError> {
        self.call(move |conn| Ok(summaries(conn, Some(id.as_str()))?.pop())).await
    }

    /// How many steps are in each state.
    pub async fn step_counts(&self) -> Result<Vec<(String, i64)>, StoreError> {
        self.call(move |conn| {
            let mut statement =
                conn.prepare("SELECT state, COUNT(*) FROM workflow_steps GROUP BY state")?;
            let rows = statement
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// The workflows the engine drives after a restart: those `running`, and those over
    /// with a step's session not ended (a stop a kill cut short, recorded by the write
    /// that ended its step or sent its loop back: the driver carries it out).
    pub async fn workflows_to_drive(&self) -> Result<Vec<WorkflowId>, StoreError> {
        self.call(move |conn| {
            let mut statement = conn.prepare(
                "SELECT w.id FROM workflows w WHERE w.state = 'running' OR EXISTS ( \
                 SELECT 1 FROM workflow_steps s JOIN task_sessions t ON t.id = s.session_id \
                 WHERE s.workflow_id = w.id AND t.state NOT IN ('COMPLETED', 'CANCELLED')) \
                 ORDER BY w.created_at",
            )?;
            let ids = statement.query_map([], |r| r.get(0))?.collect::<Result<Vec<_>, _>>()?;
            Ok(ids)
        })
        .await
    }

    /// The running workflows of a task, oldest first.
    pub async fn running_workflows_of(
        &self,
        task_id: String,
    ) -> Result<Vec<WorkflowRow>, StoreError> {
        self.call(move |conn| {
            let mut statement = conn.prepare(&format!(
                "SELECT {WORKFLOW_COLUMNS} FROM workflows WHERE state = 'running' AND task_id = ?1 \
                 ORDER BY created_at, id"
            ))?;
            let rows = statement.query_map([task_id], workflow_row)?.collect::<Result<_, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// Deletes a workflow that is not running, with its steps and events, in one
    /// transaction; `Ok(false)`, changing nothing, when it runs.
    pub async fn delete_workflow(&self, id: WorkflowId) -> Result<bool, StoreError> {
        let announce = id.clone();
        let deleted = self
            .call(move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let state: Option<Named<WorkflowState>> = tx
                    .query_row("SELECT state FROM workflows WHERE id = ?1", [&id], |r| r.get(0))
                    .optional()?;
                match state {
                    None => {
                        return Err(StoreError::NotFound {
                            what: "workflow",
                            id: id.into_string(),
                        });
                    }
                    Some(Named(WorkflowState::Running)) => return Ok(false),
                    Some(_) => {}
                }
                tx.execute("DELETE FROM workflow_events WHERE workflow_id = ?1", [&id])?;
                tx.execute("DELETE FROM workflow_steps WHERE workflow_id = ?1", [&id])?;
                tx.execute("DELETE FROM workflows WHERE id = ?1", [&id])?;
                tx.commit()?;
                Ok(true)
            })
            .await?;
        if deleted {
            // Its driver, if one still watches it, reads it gone and ends.
            self.announce(Some(announce));
        }
        Ok(deleted)
    }

    /// The running workflows whose workspace is one of `paths`, oldest first.
    pub async fn running_workflows_in(
        &self,
        paths: Vec<String>,
    ) -> Result<Vec<WorkflowRow>, StoreError> {
        let paths = serde_json::Value::from(paths).to_string();
        self.call(move |conn| {
            let mut statement = conn.prepare(&format!(
                "SELECT {WORKFLOW_COLUMNS} FROM workflows WHERE state = 'running' \
                 AND workspace IN (SELECT value FROM json_each(?1)) ORDER BY created_at, id"
            ))?;
            let rows = statement.query_map([paths], workflow_row)?.collect::<Result<_, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// The sessions not ended (`PAUSED` and `FAILED` too: resumable) whose workspace is one
    /// of `paths`, oldest first: `(id, state, the workflow it runs a step of)`.
    pub async fn workspace_sessions(
        &self,
        paths: Vec<String>,
    ) -> Result<Vec<(String, protocol::api::SessionState, Option<String>)>, StoreError> {
        let paths = serde_json::Value::from(paths).to_string();
        self.call(move |conn| {
            let mut statement = conn.prepare(
                "SELECT s.id, s.state, (SELECT w.workflow_id FROM workflow_steps w WHERE w.session_id = s.id LIMIT 1) \
                 FROM task_sessions s WHERE s.workspace_path IN (SELECT value FROM json_each(?1)) \
                 AND s.state NOT IN ('COMPLETED', 'CANCELLED') ORDER BY s.created_at, s.id",
            )?;
            let rows: Vec<(String, String, Option<String>)> = statement
                .query_map([paths], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<Result<_, _>>()?;
            rows.into_iter()
                .map(|(id, state, workflow)| Ok((id, super::session_state(&state)?, workflow)))
                .collect()
        })
        .await
    }

    /// A workflow's events after `after_seq`, oldest first, at most `limit`.
    pub async fn workflow_events(
        &self,
        id: WorkflowId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<WorkflowEvent>, StoreError> {
        self.call(move |conn| {
            let mut statement = conn.prepare(
                "SELECT seq, at, event FROM workflow_events WHERE workflow_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
            )?;
            let rows = statement
                .query_map(params![id, after_seq as i64, limit as i64], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter()
                .map(|(seq, at, event)| {
                    let kind = serde_json::from_str(&event).map_err(|err| StoreError::Corrupt {
                        what: "workflow event",
                        detail: format!("{err}: {event}"),
                    })?;
                    Ok(WorkflowEvent { seq: seq as u64, at, kind })
                })
                .collect()
        })
        .await
    }

    /// Stores a step's session and starts the step, in one transaction: the step must be
    /// `pending` and its workflow `running`, else nothing is stored (`Ok(false)`). Killed
    /// after this, the step has its session, whose first prompt is its prompt: the session
    /// sends it exactly once.
    pub async fn start_step(
        &self,
        session: SessionRow,
        workflow_id: WorkflowId,
        step_id: StepId,
    ) -> Result<bool, StoreError> {
        let announce = workflow_id.clone();
        let session_id = session.id.clone();
        let started = self
            .call(move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let running: bool = tx.query_row(
                    "SELECT EXISTS(SELECT 1 FROM workflows WHERE id = ?1 AND state = 'running')",
                    [&workflow_id],
                    |r| r.get(0),
                )?;
                let (run, iteration): (u32, u32) = match tx
                    .query_row(
                        "SELECT runs, iteration FROM workflow_steps WHERE workflow_id = ?1 AND step_id = ?2 AND state = 'pending'",
                        params![workflow_id, step_id],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()?
                {
                    Some(found) if running => found,
                    _ => return Ok(false),
                };
                insert_session(&tx, &session)?;
                tx.execute(
                    "UPDATE workflow_steps SET state = 'running', session_id = ?3, prompt = ?4, runs = runs + 1, \
                     resends = 0, output = NULL, error = NULL, started_at = ?5, ended_at = NULL \
                     WHERE workflow_id = ?1 AND step_id = ?2",
                    params![workflow_id, step_id, session.id, session.initial_prompt, now_ms()],
                )?;
                let event = WorkflowEventKind::StepStarted {
                    step_id: step_id.to_string(),
                    session_id: session.id.to_string(),
                    run: run + 1,
                    iteration,
                };
                push_event(&tx, &workflow_id, &event)?;
                tx.commit()?;
                Ok(true)
            })
            .await?;
        if started {
            self.announce(Some(announce));
            self.announce_session(&session_id);
        }
        Ok(started)
    }

    /// Applies step patches and (then) a workflow state, with their events, in one
    /// transaction; `Ok(false)`, changing nothing, when a step is not in the state its
    /// patch expects (or a state is set on a workflow that is not `expect_workflow`).
    pub async fn update_workflow(
        &self,
        workflow_id: WorkflowId,
        expect_workflow: Option<WorkflowState>,
        patches: Vec<StepPatch>,
        state: Option<(WorkflowState, Option<String>)>,
    ) -> Result<bool, StoreError> {
        let announce = workflow_id.clone();
        let applied = self
            .call(move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let current: Option<Named<WorkflowState>> = tx
                    .query_row("SELECT state FROM workflows WHERE id = ?1", [&workflow_id], |r| {
                        r.get(0)
                    })
                    .optional()?;
                let Some(Named(current)) = current else {
                    return Err(StoreError::NotFound { what: "workflow", id: workflow_id.into_string() });
                };
                if expect_workflow.is_some_and(|expected| expected != current) {
                    return Ok(false);
                }
                for patch in &patches {
                    if !apply_patch(&tx, &workflow_id, patch)? {
                        return Ok(false);
                    }
                }
                if let Some((state, error)) = state {
                    tx.execute(
                        "UPDATE workflows SET state = ?2, error = ?3, updated_at = ?4, \
                         resumes = resumes + (CASE WHEN state != 'running' AND ?2 = 'running' THEN 1 ELSE 0 END) \
                         WHERE id = ?1",
                        params![workflow_id, Named(state), error, now_ms()],
                    )?;
                    push_event(&tx, &workflow_id, &WorkflowEventKind::WorkflowState { state, error })?;
                }
                tx.commit()?;
                Ok(true)
            })
            .await?;
        if applied {
            self.announce(Some(announce));
        }
        Ok(applied)
    }

    /// Replaces a workflow's spec (a resume that accepted a changed file): its text, hash
    /// and steps — those in `steps` stay as they are, `reset` are set `pending` again (their
    /// sessions stay recorded, to be stopped before they run again), new ones are added, and
    /// the others go (`drop_step`: at once, or once their sessions are stopped), each with
    /// an event saying so.
    pub async fn replace_workflow_spec(
        &self,
        workflow_id: WorkflowId,
        spec_text: String,
        spec_sha256: String,
        steps: Vec<String>,
        reset: Vec<String>,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "UPDATE workflows SET spec_text = ?2, spec_sha256 = ?3, updated_at = ?4 WHERE id = ?1",
                params![workflow_id, spec_text, spec_sha256, now_ms()],
            )?;
            let existing: Vec<StepId> = {
                let mut statement =
                    tx.prepare("SELECT step_id FROM workflow_steps WHERE workflow_id = ?1")?;
                statement.query_map([&workflow_id], |r| r.get(0))?.collect::<Result<_, _>>()?
            };
            for old in &existing {
                let base = crate::workflow::plan::base_id(old.as_str());
                if !steps.iter().any(|step| step == base) {
                    drop_step(&tx, &workflow_id, old)?;
                }
            }
            for (position, step) in steps.iter().enumerate() {
                tx.execute(
                    "INSERT INTO workflow_steps (workflow_id, step_id, position, state) VALUES (?1, ?2, ?3, 'pending') \
                     ON CONFLICT (workflow_id, step_id) DO UPDATE SET position = ?3",
                    params![workflow_id, step, position as i64],
                )?;
            }
            for step in &reset {
                tx.execute(
                    "UPDATE workflow_steps SET state = 'pending', output = NULL, error = NULL, \
                     iteration = 0, approved = 0, applied = 0, started_at = NULL, ended_at = NULL \
                     WHERE workflow_id = ?1 AND (step_id = ?2 OR step_id LIKE ?2 || '[%')",
                    params![workflow_id, step],
                )?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }
}

/// A step the accepted file no longer has (inside the resume's transaction): its row goes,
/// with an event saying so — unless its session has not ended. Then the row stays,
/// `cancelled`, still naming the session: the planner stops a session not ended of a step
/// not running, and drops the row once it is stopped. So this write records the stop, as
/// a loop going back does, and a kill right after it orphans nothing.
fn drop_step(
    conn: &Connection,
    workflow_id: &WorkflowId,
    step_id: &StepId,
) -> rusqlite::Result<()> {
    let live: Option<String> = conn
        .query_row(
            "SELECT s.session_id FROM workflow_steps s JOIN task_sessions t ON t.id = s.session_id \
             WHERE s.workflow_id = ?1 AND s.step_id = ?2 AND t.state NOT IN ('COMPLETED', 'CANCELLED')",
            params![workflow_id, step_id],
            |r| r.get(0),
        )
        .optional()?;
    let reason = match live {
        Some(session) => {
            conn.execute(
                "UPDATE workflow_steps SET state = 'cancelled', ended_at = COALESCE(ended_at, ?3) \
                 WHERE workflow_id = ?1 AND step_id = ?2",
                params![workflow_id, step_id, now_ms()],
            )?;
            format!("removed from the workflow file; its session {session} is to be stopped")
        }
        None => {
            conn.execute(
                "DELETE FROM workflow_steps WHERE workflow_id = ?1 AND step_id = ?2",
                params![workflow_id, step_id],
            )?;
            "removed from the workflow file".to_owned()
        }
    };
    let event = WorkflowEventKind::StepReset {
        step_id: step_id.to_string(),
        state: StepState::Cancelled,
        reason,
    };
    push_event(conn, workflow_id, &event)?;
    Ok(())
}

/// Applies one patch inside the caller's transaction; false when its step is not in the
/// state it expects.
fn apply_patch(
    conn: &Connection,
    workflow_id: &WorkflowId,
    patch: &StepPatch,
) -> rusqlite::Result<bool> {
    if let Some(position) = patch.insert_at {
        let state = patch.state.unwrap_or(StepState::Pending);
        let inserted = conn.execute(
            "INSERT OR IGNORE INTO workflow_steps (workflow_id, step_id, position, state, iteration) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![workflow_id, patch.step_id, position, Named(state), patch.iteration.unwrap_or(0)],
        )?;
        if inserted == 0 {
            return Ok(false);
        }
    } else {
        let state: Option<Named<StepState>> = conn
            .query_row(
                "SELECT state FROM workflow_steps WHERE workflow_id = ?1 AND step_id = ?2",
                params![workflow_id, patch.step_id],
                |r| r.get(0),
            )
            .optional()?;
        let Some(Named(state)) = state else { return Ok(false) };
        if patch.expect.is_some_and(|expected| expected != state) {
            return Ok(false);
        }
        if patch.remove {
            conn.execute(
                "DELETE FROM workflow_steps WHERE workflow_id = ?1 AND step_id = ?2",
                params![workflow_id, patch.step_id],
            )?;
            return push_patch_event(conn, workflow_id, patch);
        }
        let mut sets: Vec<String> = Vec::new();
        let mut values: Vec<Box<dyn rusqlite::ToSql>> =
            vec![Box::new(workflow_id.to_owned()), Box::new(patch.step_id.clone())];
        let mut set = |column: &str, value: Box<dyn rusqlite::ToSql>| {
            values.push(value);
            sets.push(format!("{column} = ?{}", values.len()));
        };
        if let Some(state) = patch.state {
            set("state", Box::new(Named(state)));
        }
        if let Some(iteration) = patch.iteration {
            set("iteration", Box::new(iteration));
        }
        if let Some(approved) = patch.approved {
            set("approved", Box::new(approved));
        }
        if let Some(applied) = patch.applied {
            set("applied", Box::new(applied));
        }
        if let Some(error) = &patch.error {
            set("error", Box::new(error.clone()));
        }
        if let Some(output) = &patch.output {
            set("output", Box::new(output.clone()));
        }
        if patch.ended {
            set("ended_at", Box::new(now_ms()));
        }
        if patch.resent {
            sets.push("resends = resends + 1".into());
        }
        if patch.launch_failed {
            sets.push("launch_failures = launch_failures + 1".into());
        }
        if patch.clear_run {
            sets.push("started_at = NULL, ended_at = NULL, applied = 0".into());
        }
        if !sets.is_empty() {
            conn.execute(
                &format!(
                    "UPDATE workflow_steps SET {} WHERE workflow_id = ?1 AND step_id = ?2",
                    sets.join(", ")
                ),
                rusqlite::params_from_iter(values.iter().map(|value| value.as_ref())),
            )?;
        }
    }
    push_patch_event(conn, workflow_id, patch)
}

/// Publishes a patch's event, if it has one (inside the caller's transaction); true.
fn push_patch_event(
    conn: &Connection,
    workflow_id: &WorkflowId,
    patch: &StepPatch,
) -> rusqlite::Result<bool> {
    if let Some(event) = &patch.event {
        push_event(conn, workflow_id, event)?;
    }
    Ok(true)
}
