//! A session's prompt queue: prompts sent while a turn runs, in order, each taken into the
//! turn it becomes in the transaction that records that turn (so it runs once), and
//! whether the queue is halted (a turn failed).

use protocol::api::{PromptQueue, QueuedPrompt};

use super::{OptionalExtension, Store, StoreError, TransactionBehavior, now_ms, params};
use crate::ids::{PromptId, SessionId, TurnId};

/// Reads a session's queue within a connection or transaction.
fn read_queue(
    conn: &rusqlite::Connection,
    session_id: &SessionId,
) -> Result<PromptQueue, StoreError> {
    let mut stmt = conn.prepare(
        "SELECT id, prompt, position, queued_at, steer_of FROM prompt_queue WHERE session_id = ?1 ORDER BY position",
    )?;
    let prompts = stmt
        .query_map([session_id], |r| {
            Ok(QueuedPrompt {
                prompt_id: r.get(0)?,
                prompt: r.get(1)?,
                position: r.get::<_, i64>(2)? as usize,
                queued_at: r.get(3)?,
                steer_of: r.get(4)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let halted = conn
        .query_row("SELECT queue_halted FROM task_sessions WHERE id = ?1", [session_id], |r| {
            r.get::<_, Option<String>>(0)
        })
        .optional()?
        .flatten();
    Ok(PromptQueue { prompts, halted })
}

/// Numbers a session's queued prompts 1, 2, … in their order.
fn renumber(tx: &rusqlite::Transaction<'_>, session_id: &SessionId) -> Result<(), StoreError> {
    let ids: Vec<String> = {
        let mut stmt = tx.prepare(
            "SELECT id FROM prompt_queue WHERE session_id = ?1 ORDER BY position, queued_at",
        )?;
        stmt.query_map([session_id], |r| r.get(0))?.collect::<Result<_, _>>()?
    };
    for (index, id) in ids.iter().enumerate() {
        tx.execute(
            "UPDATE prompt_queue SET position = ?2 WHERE id = ?1",
            params![id, index as i64 + 1],
        )?;
    }
    Ok(())
}

/// Takes a queued prompt out of the queue (in the transaction that records its turn);
/// `NotFound` when it was removed meanwhile.
pub(super) fn take_queued(
    tx: &rusqlite::Transaction<'_>,
    session_id: &SessionId,
    prompt_id: &PromptId,
) -> Result<(), StoreError> {
    let taken = tx.execute(
        "DELETE FROM prompt_queue WHERE id = ?1 AND session_id = ?2",
        params![prompt_id, session_id],
    )?;
    if taken == 0 {
        return Err(StoreError::NotFound { what: "queued prompt", id: prompt_id.to_string() });
    }
    renumber(tx, session_id)
}

impl Store {
    /// A session's queue, in order, and why it is halted.
    pub async fn prompt_queue(&self, session_id: SessionId) -> Result<PromptQueue, StoreError> {
        self.call(move |conn| read_queue(conn, &session_id)).await
    }

    /// Queues a prompt at the end; returns its place (from 1). Durable when this returns.
    pub async fn enqueue_prompt(
        &self,
        session_id: SessionId,
        prompt_id: PromptId,
        prompt: String,
    ) -> Result<usize, StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let last: i64 = tx.query_row(
                "SELECT COALESCE(MAX(position), 0) FROM prompt_queue WHERE session_id = ?1",
                [&session_id],
                |r| r.get(0),
            )?;
            tx.execute(
                "INSERT INTO prompt_queue (id, session_id, position, prompt, queued_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![prompt_id, session_id, last + 1, prompt, now_ms()],
            )?;
            tx.commit()?;
            Ok(last as usize + 1)
        })
        .await
    }

    /// Queues a steer's text first, ahead of every queued prompt (behind steers queued
    /// before it), with the turn cancelled for it. Durable when this returns.
    pub async fn enqueue_steer(
        &self,
        session_id: SessionId,
        prompt_id: PromptId,
        prompt: String,
        steer_of: TurnId,
    ) -> Result<PromptQueue, StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let steers: i64 = tx.query_row(
                "SELECT COUNT(*) FROM prompt_queue WHERE session_id = ?1 AND steer_of IS NOT NULL",
                [&session_id],
                |r| r.get(0),
            )?;
            tx.execute(
                "UPDATE prompt_queue SET position = position + 1 WHERE session_id = ?1 AND position > ?2",
                params![session_id, steers],
            )?;
            tx.execute(
                "INSERT INTO prompt_queue (id, session_id, position, prompt, queued_at, steer_of) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![prompt_id, session_id, steers + 1, prompt, now_ms(), steer_of],
            )?;
            renumber(&tx, &session_id)?;
            let queue = read_queue(&tx, &session_id)?;
            tx.commit()?;
            Ok(queue)
        })
        .await
    }

    /// Changes a queued prompt: its text, its place (from 1; past the end is the end), or
    /// both. Fails with `NotFound` when it is not queued (any more).
    pub async fn change_queued(
        &self,
        session_id: SessionId,
        prompt_id: PromptId,
        prompt: Option<String>,
        position: Option<usize>,
    ) -> Result<PromptQueue, StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let found = tx.execute(
                "UPDATE prompt_queue SET prompt = COALESCE(?3, prompt) WHERE id = ?1 AND session_id = ?2",
                params![prompt_id, session_id, prompt],
            )?;
            if found == 0 {
                return Err(StoreError::NotFound { what: "queued prompt", id: prompt_id.into_string() });
            }
            if let Some(position) = position {
                // Put before the one now at that place (ties keep the older first).
                tx.execute(
                    "UPDATE prompt_queue SET position = position + 1 WHERE session_id = ?1 AND position >= ?2",
                    params![session_id, position as i64],
                )?;
                tx.execute(
                    "UPDATE prompt_queue SET position = ?2 WHERE id = ?1",
                    params![prompt_id, position.max(1) as i64],
                )?;
                renumber(&tx, &session_id)?;
            }
            let queue = read_queue(&tx, &session_id)?;
            tx.commit()?;
            Ok(queue)
        })
        .await
    }

    /// Removes a queued prompt (`None`: all of them); returns the queue after.
    pub async fn remove_queued(
        &self,
        session_id: SessionId,
        prompt_id: Option<PromptId>,
    ) -> Result<PromptQueue, StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            match prompt_id {
                Some(prompt_id) => {
                    let removed = tx.execute(
                        "DELETE FROM prompt_queue WHERE id = ?1 AND session_id = ?2",
                        params![prompt_id, session_id],
                    )?;
                    if removed == 0 {
                        return Err(StoreError::NotFound {
                            what: "queued prompt",
                            id: prompt_id.into_string(),
                        });
                    }
                    renumber(&tx, &session_id)?;
                }
                None => {
                    tx.execute("DELETE FROM prompt_queue WHERE session_id = ?1", [&session_id])?;
                }
            }
            let queue = read_queue(&tx, &session_id)?;
            tx.commit()?;
            Ok(queue)
        })
        .await
    }

    /// Sessions waiting for input whose queue holds prompts and is not halted: their
    /// prompts were taken to run (a restart found them so, their agent not up). The
    /// query reads the queue's rows, not the sessions.
    pub async fn sessions_with_queued_prompts(&self) -> Result<Vec<SessionId>, StoreError> {
        self.call(|conn| {
            let mut stmt = conn.prepare(
                "SELECT DISTINCT q.session_id FROM prompt_queue q JOIN task_sessions s ON s.id = q.session_id WHERE s.queue_halted IS NULL AND s.state = 'WAITING_FOR_INPUT'",
            )?;
            let ids = stmt.query_map([], |r| r.get::<_, String>(0))?;
            Ok(ids.map(|id| id.map(SessionId::new)).collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Halts a session's queue, saying why (`Some`), or lets it run again (`None`).
    pub async fn halt_queue(
        &self,
        session_id: SessionId,
        reason: Option<String>,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            conn.execute(
                "UPDATE task_sessions SET queue_halted = ?2 WHERE id = ?1",
                params![session_id, reason],
            )?;
            Ok(())
        })
        .await
    }
}
