//! Turns, open permission requests and pauses: the open work of a session.

use super::{
    Deserialize, LastPause, Named, OpenTurn, OptionalExtension, PauseRequest, PausedRecord,
    Serialize, SessionState, Store, StoreError, TimelineEvent, TransactionBehavior, TurnRow,
    TurnState, journal, log, now_ms, params,
};
use crate::ids::SessionId;

/// A turn's prompt, the turn it retries, and the queued prompt it runs (taken from the queue
/// in the turn's transaction).
pub type TurnPrompt = (String, Option<crate::ids::TurnId>, Option<crate::ids::PromptId>);

/// A `session_pauses` row: reason, force_at, kind, summary_asked_at, requested_at.
type PauseRow = (Option<String>, i64, String, Option<i64>, i64);

/// Why the prompt a session's launch sends by itself (the one it was created with) was
/// refused before a turn of it was recorded. Kept until a turn is, so that what waits for
/// that prompt — a workflow step — learns that it will not come.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptRefusal {
    /// Why, as the session said it.
    pub reason: String,
    /// The refusal is about the prompt itself (too long for the agent's line): sent again,
    /// anywhere, it is refused again. Otherwise it is about the session (its settings could
    /// not be set again, its agent is gone, its state), which a new session does not share.
    pub lasting: bool,
}

impl Store {
    /// The running turns of an execution: `(turn_id, request_id)`.
    pub async fn open_turns(
        &self,
        session_id: SessionId,
        execution_id: crate::ids::ExecutionId,
    ) -> Result<Vec<OpenTurn>, StoreError> {
        self.call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT id, request_id, delivered, queued_prompt, prompt FROM turns WHERE session_id = ?1 AND execution_id = ?2 AND state = 'running' ORDER BY id",
            )?;
            let rows = stmt
                .query_map(params![session_id, execution_id], |r| {
                    let queued: Option<crate::ids::PromptId> = r.get(3)?;
                    let prompt: Option<String> = r.get(4)?;
                    Ok(OpenTurn {
                        turn_id: r.get(0)?,
                        request_id: r.get(1)?,
                        delivered: r.get(2)?,
                        queued: queued.map(|id| (id, prompt.unwrap_or_default())),
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// The running turns of a session, oldest first.
    pub async fn running_turns(&self, session_id: SessionId) -> Result<Vec<String>, StoreError> {
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
        session_id: SessionId,
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
            let workflow = super::workflows::workflow_of(&tx, &session_id)?;
            tx.commit()?;
            Ok((ids, workflow))
        })
        .await
        .map(|(ids, workflow)| {
            self.announce(workflow);
            ids
        })
    }

    /// Keeps a pause request (replacing an earlier one).
    pub async fn put_pause(
        &self,
        session_id: SessionId,
        pause: PauseRequest,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "INSERT OR REPLACE INTO session_pauses (session_id, reason, force_at, requested_at, kind, summary_asked_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    session_id,
                    pause.reason,
                    pause.force_at,
                    pause.requested_at,
                    pause.trigger.as_str(),
                    pause.summary_asked_at
                ],
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

    /// The waiting pause of the session asks its agent for a summary now (`at`, Unix ms),
    /// with a new `force_at` for the summary turn; false when no pause waits.
    pub async fn pause_summary_asked(
        &self,
        session_id: SessionId,
        at: i64,
        force_at: i64,
    ) -> Result<bool, StoreError> {
        self.call(move |conn| {
            let changed = conn.execute(
                "UPDATE session_pauses SET summary_asked_at = ?2, force_at = ?3 WHERE session_id = ?1",
                params![session_id, at, force_at],
            )?;
            Ok(changed == 1)
        })
        .await
    }

    /// Every pause request that waits: `(session id, request)`.
    pub async fn pauses(&self) -> Result<Vec<(SessionId, PauseRequest)>, StoreError> {
        self.call(|conn| {
            let mut stmt = conn.prepare(
                "SELECT session_id, reason, force_at, kind, summary_asked_at, requested_at FROM session_pauses",
            )?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((
                        r.get::<_, SessionId>(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get::<_, String>(3)?,
                        r.get(4)?,
                        r.get(5)?,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter()
                .map(|(session_id, reason, force_at, kind, summary_asked_at, requested_at)| {
                    let trigger = journal::parse_trigger(&kind)?;
                    let request =
                        PauseRequest { reason, force_at, requested_at, trigger, summary_asked_at };
                    Ok((session_id, request))
                })
                .collect()
        })
        .await
    }

    /// The session's pause request, if one waits.
    pub async fn get_pause(
        &self,
        session_id: SessionId,
    ) -> Result<Option<PauseRequest>, StoreError> {
        self.call(move |conn| {
            let row: Option<PauseRow> = conn
                .query_row(
                    "SELECT reason, force_at, kind, summary_asked_at, requested_at FROM session_pauses WHERE session_id = ?1",
                    [&session_id],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
                )
                .optional()?;
            row.map(|(reason, force_at, kind, summary_asked_at, requested_at)| {
                let trigger = journal::parse_trigger(&kind)?;
                Ok(PauseRequest { reason, force_at, requested_at, trigger, summary_asked_at })
            })
            .transpose()
        })
        .await
    }

    /// Sets the session `PAUSED` and drops its pause request, in one transaction with its
    /// timeline rows and, for an exhaustion, the pending handoff.
    pub async fn set_paused(
        &self,
        session_id: SessionId,
        paused: PausedRecord,
        event_seq_high: u64,
    ) -> Result<(), StoreError> {
        let announce = session_id.clone();
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let changed = tx.execute(
                "UPDATE task_sessions SET state = 'PAUSED', error_message = NULL, updated_at = ?2, \
                 event_seq_high = MAX(event_seq_high, ?3), paused_at = ?2, pause_kind = ?4, \
                 pause_reason = ?5 WHERE id = ?1",
                params![
                    session_id,
                    now_ms(),
                    event_seq_high as i64,
                    paused.trigger.as_str(),
                    paused.reason
                ],
            )?;
            if changed == 0 {
                return Err(StoreError::NotFound { what: "session", id: session_id.into_string() });
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
        .await?;
        self.announce_session(&announce);
        Ok(())
    }

    /// When the session was last paused and what paused it (`None` if it never was).
    pub async fn last_pause(&self, session_id: SessionId) -> Result<Option<LastPause>, StoreError> {
        self.call(move |conn| {
            let row: Option<(Option<i64>, Option<String>, Option<String>)> = conn
                .query_row(
                    "SELECT paused_at, pause_kind, pause_reason FROM task_sessions WHERE id = ?1",
                    [&session_id],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()?;
            match row {
                Some((Some(at), Some(kind), reason)) => {
                    Ok(Some(LastPause { at, trigger: journal::parse_trigger(&kind)?, reason }))
                }
                _ => Ok(None),
            }
        })
        .await
    }

    /// Removes every pending request of a session; returns how many.
    pub async fn clear_pending(&self, session_id: SessionId) -> Result<usize, StoreError> {
        let announce = session_id.clone();
        let cleared = self
            .call(move |conn| {
                Ok(conn
                    .execute("DELETE FROM pending_requests WHERE session_id = ?1", [&session_id])?)
            })
            .await?;
        if cleared > 0 {
            self.announce_session(&announce);
        }
        Ok(cleared)
    }

    /// The sessions (of `session_id` alone, when given) whose agent waits for a person's
    /// answer to a permission or elicitation request.
    pub async fn awaiting_permission(
        &self,
        session_id: Option<SessionId>,
    ) -> Result<std::collections::HashSet<SessionId>, StoreError> {
        self.call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT DISTINCT session_id FROM pending_requests \
                 WHERE method IN ('session/request_permission', 'elicitation/create') \
                 AND (?1 IS NULL OR session_id = ?1)",
            )?;
            let ids = stmt.query_map([&session_id], |r| r.get::<_, SessionId>(0))?;
            Ok(ids.collect::<Result<_, _>>()?)
        })
        .await
    }

    /// Records a turn before its prompt is sent.
    pub async fn insert_turn(
        &self,
        turn_id: crate::ids::TurnId,
        session_id: SessionId,
        execution_id: crate::ids::ExecutionId,
        request_id: String,
        prompt: TurnPrompt,
    ) -> Result<(), StoreError> {
        let ids = (turn_id, session_id, execution_id, request_id);
        self.insert_turn_telling(ids, prompt, Vec::new()).await
    }

    /// [`Store::insert_turn`], with the agent notes (`agent_notes` ids) its prompt carries
    /// tied to the turn in the same transaction (removed once it is delivered).
    pub async fn insert_turn_telling(
        &self,
        (turn_id, session_id, execution_id, request_id): (
            crate::ids::TurnId,
            SessionId,
            crate::ids::ExecutionId,
            String,
        ),
        (prompt, retry_of, queued): TurnPrompt,
        told: Vec<i64>,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            if let Some(queued) = &queued {
                // Taken from the queue with the turn's record, or not at all: it runs once.
                super::queue::take_queued(&tx, &session_id, queued)?;
            }
            super::keeps::tie_agent_notes(&tx, &told, &turn_id)?;
            tx.execute(
                "INSERT INTO turns (id, session_id, execution_id, request_id, state, started_at, delivered, prompt, retry_of, queued_prompt) \
                 VALUES (?1, ?2, ?3, ?4, 'running', ?5, 0, ?6, ?7, ?8)",
                params![turn_id, session_id, execution_id, request_id, now_ms(), prompt, retry_of, queued],
            )?;
            // A prompt goes out after all: a refusal before it is history.
            tx.execute(
                "UPDATE task_sessions SET prompt_refused = NULL WHERE id = ?1 AND prompt_refused IS NOT NULL",
                [&session_id],
            )?;
            log(&tx, &session_id, &TimelineEvent::TurnStarted { turn_id: turn_id.into_string(), execution_id: execution_id.into_string() })?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// Records that the prompt a session's launch sends by itself was refused (on its
    /// timeline too), and announces the workflow whose step it runs, if any: the step's
    /// driver decides what follows.
    pub async fn refuse_prompt(
        &self,
        session_id: SessionId,
        refusal: PromptRefusal,
    ) -> Result<(), StoreError> {
        let text = serde_json::to_string(&refusal).map_err(|err| StoreError::Corrupt {
            what: "prompt refusal",
            detail: err.to_string(),
        })?;
        let workflow = self
            .call(move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let changed = tx.execute(
                    "UPDATE task_sessions SET prompt_refused = ?2 WHERE id = ?1",
                    params![session_id, text],
                )?;
                if changed == 0 {
                    return Err(StoreError::NotFound {
                        what: "session",
                        id: session_id.into_string(),
                    });
                }
                let message = format!("its first prompt was refused: {}", refusal.reason);
                log(&tx, &session_id, &TimelineEvent::Error { message })?;
                let workflow = super::workflows::workflow_of(&tx, &session_id)?;
                tx.commit()?;
                Ok(workflow)
            })
            .await?;
        self.announce(workflow);
        Ok(())
    }

    /// Records that a turn's prompt reached agentctl.
    pub async fn mark_delivered(&self, turn_id: crate::ids::TurnId) -> Result<(), StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute("UPDATE turns SET delivered = 1 WHERE id = ?1", [&turn_id])?;
            super::keeps::delivered_agent_notes(&tx, &turn_id)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// Ends a turn.
    pub async fn end_turn(
        &self,
        turn_id: crate::ids::TurnId,
        state: TurnState,
        stop_reason: Option<String>,
        error: Option<String>,
    ) -> Result<(), StoreError> {
        self.end_turn_then(turn_id, (state, stop_reason, error), None, 0, None, None).await
    }

    /// Ends a turn and, in the same transaction, sets its session's state (`then`: state,
    /// error, task state): one write, and the timeline lists the turn's end before the
    /// state it led to. Records `event_seq_high` as [`Store::set_session_state`] does. A
    /// session that runs a workflow step completes the step in the same transaction when
    /// the turn completed (stop reason `end_turn`), its output `output` (the turn's final
    /// agent message).
    pub async fn end_turn_then(
        &self,
        turn_id: crate::ids::TurnId,
        (state, stop_reason, error): (TurnState, Option<String>, Option<String>),
        then: Option<(SessionState, Option<String>, Option<&'static str>)>,
        event_seq_high: u64,
        output: Option<super::TurnOutput>,
        usage: Option<super::TurnUsage>,
    ) -> Result<(), StoreError> {
        let state_changes = then.is_some();
        let (workflow, session) = self.call(move |conn| {
            let completed = state == TurnState::Completed
                && stop_reason.as_deref().is_none_or(|reason| reason == "end_turn");
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ms();
            tx.execute(
                "UPDATE turns SET state = ?2, stop_reason = ?3, error = ?4, ended_at = ?5 WHERE id = ?1",
                params![turn_id, Named(state), stop_reason, error, now],
            )?;
            let session_id: Option<SessionId> = tx
                .query_row("SELECT session_id FROM turns WHERE id = ?1", [&turn_id], |r| r.get(0))
                .optional()?;
            let ended_turn = turn_id.clone();
            if let Some(session_id) = session_id {
                let ended =
                    TimelineEvent::TurnEnded { turn_id: turn_id.into_string(), state, stop_reason, error };
                log(&tx, &session_id, &ended)?;
                if let Some(usage) = &usage {
                    super::usage::write_turn_usage(&tx, &ended_turn, &session_id, usage)?;
                }
                tx.execute(
                    "UPDATE task_sessions SET event_seq_high = MAX(event_seq_high, ?2) WHERE id = ?1",
                    params![session_id, event_seq_high as i64],
                )?;
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
                let workflow = super::workflows::step_turn_ended(
                    &tx,
                    &session_id,
                    completed,
                    output.as_ref(),
                )?;
                tx.commit()?;
                return Ok((workflow, Some(session_id)));
            }
            tx.commit()?;
            Ok((None, None))
        })
        .await?;
        self.announce(workflow);
        if let Some(session) = session.filter(|_| state_changes) {
            self.announce_session(&session);
        }
        Ok(())
    }

    /// A turn's `(state, stop_reason, error)`.
    pub async fn get_turn(
        &self,
        turn_id: crate::ids::TurnId,
    ) -> Result<(String, Option<String>, Option<String>), StoreError> {
        self.call(move |conn| {
            conn.query_row(
                "SELECT state, stop_reason, error FROM turns WHERE id = ?1",
                [&turn_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?
            .ok_or(StoreError::NotFound { what: "turn", id: turn_id.into_string() })
        })
        .await
    }

    /// The session's first turn started at or after `since` (Unix ms) with this prompt:
    /// `(turn id, state, stop reason, error)`.
    pub async fn first_turn_with_prompt(
        &self,
        session_id: SessionId,
        since: i64,
        prompt: String,
    ) -> Result<Option<(crate::ids::TurnId, TurnState, Option<String>, Option<String>)>, StoreError>
    {
        self.call(move |conn| {
            Ok(conn
                .query_row(
                    "SELECT id, state, stop_reason, error FROM turns \
                     WHERE session_id = ?1 AND started_at >= ?2 AND prompt = ?3 \
                     ORDER BY started_at, id LIMIT 1",
                    params![session_id, since, prompt],
                    |r| {
                        let state = r.get::<_, Named<TurnState>>(1)?.0;
                        Ok((r.get(0)?, state, r.get(2)?, r.get(3)?))
                    },
                )
                .optional()?)
        })
        .await
    }

    /// Whether a prompt of the session ever reached its agent (a turn marked delivered):
    /// until one did, the prompt the session was created with has not run.
    pub async fn prompt_delivered(&self, session_id: SessionId) -> Result<bool, StoreError> {
        self.call(move |conn| {
            Ok(conn.query_row(
                "SELECT EXISTS (SELECT 1 FROM turns WHERE session_id = ?1 AND delivered = 1)",
                [&session_id],
                |row| row.get(0),
            )?)
        })
        .await
    }

    /// Notes where a turn's `turn_started` event is in the session's event log.
    pub async fn set_turn_event_seq(
        &self,
        turn_id: crate::ids::TurnId,
        seq: u64,
    ) -> Result<(), StoreError> {
        let seq = i64::try_from(seq).unwrap_or(i64::MAX);
        self.call(move |conn| {
            conn.execute("UPDATE turns SET event_seq = ?2 WHERE id = ?1", params![turn_id, seq])?;
            Ok(())
        })
        .await
    }

    /// Every turn of a session, oldest first.
    pub async fn session_turns(&self, session_id: SessionId) -> Result<Vec<TurnRow>, StoreError> {
        self.call(move |conn| {
            let mut statement = conn.prepare(
                "SELECT id, execution_id, state, stop_reason, error, started_at, ended_at, \
                 total_tokens, cost, cost_currency, retry_of, rewound_by, prompt, event_seq \
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
                    total_tokens: r.get::<_, i64>(7)?.max(0) as u64,
                    cost: r.get::<_, Option<f64>>(8)?.zip(r.get::<_, Option<String>>(9)?),
                    retry_of: r.get(10)?,
                    rewound_by: r.get(11)?,
                    prompt: r.get(12)?,
                    event_seq: r.get::<_, Option<i64>>(13)?.and_then(|seq| u64::try_from(seq).ok()),
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Records an agent request waiting for a person.
    pub async fn insert_pending(
        &self,
        session_id: SessionId,
        execution_id: crate::ids::ExecutionId,
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
            Ok(session_id)
        })
        .await
        .map(|session_id| self.announce_session(&session_id))
    }

    /// Removes a pending request; returns whether it existed.
    pub async fn delete_pending(
        &self,
        session_id: SessionId,
        request_id: String,
    ) -> Result<bool, StoreError> {
        let announce = session_id.clone();
        let deleted = self
            .call(move |conn| {
                Ok(conn.execute(
                    "DELETE FROM pending_requests WHERE session_id = ?1 AND request_id = ?2",
                    params![session_id, request_id],
                )? == 1)
            })
            .await?;
        if deleted {
            self.announce_session(&announce);
        }
        Ok(deleted)
    }

    /// The pending requests of a session: `(request_id, method, params)`.
    pub async fn list_pending(
        &self,
        session_id: SessionId,
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
