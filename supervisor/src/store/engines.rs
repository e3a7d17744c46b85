//! Engines taken out of service (`engine_states`), the sessions placed on the Docker
//! runtime, a session's move off an engine (its timeline row, its resume token), and its
//! move to another runtime.

use protocol::api::{EngineState, MoveReason, TimelineEvent};
use rusqlite::params;

use super::journal::log;
use super::{Store, StoreError, now_ms};
use crate::ids::SessionId;

/// A session's move under way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveRow {
    /// The session.
    pub session_id: SessionId,
    /// The engine it leaves.
    pub from: String,
    /// Why.
    pub reason: MoveReason,
    /// Its agent was running: it is resumed where it moves to.
    pub resume: bool,
}

/// A session's move to another runtime (`task.session.move`), stored at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relocation {
    /// The session.
    pub session_id: SessionId,
    /// The runtime it runs on from now on.
    pub runtime: String,
    /// Its placement labels there.
    pub labels: std::collections::BTreeMap<String, String>,
    /// The execution whose resume token is dropped (its agent's state does not travel).
    pub drop_token_of: Option<crate::ids::ExecutionId>,
    /// Where it ran, in words (the timeline's `from`).
    pub from: String,
}

/// An engine out of service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineRow {
    /// Its name.
    pub name: String,
    /// `Draining`, `Drained`, or `Unreachable` (failed over: back in service once it
    /// answers again and is cleared).
    pub state: EngineState,
    /// Since when, Unix ms.
    pub since: i64,
    /// How long a running turn may take to end before it is cancelled for a move.
    pub force_after_ms: u64,
}

impl Store {
    /// Takes an engine out of service (or changes how), or returns it (`None`).
    pub async fn set_engine_state(
        &self,
        name: String,
        state: Option<(EngineState, u64)>,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            match state {
                Some((state, force_after_ms)) => conn.execute(
                    "INSERT INTO engine_states (name, state, since, force_after_ms) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (name) DO UPDATE SET state = excluded.state, force_after_ms = excluded.force_after_ms",
                    params![name, state.as_str(), now_ms(), i64::try_from(force_after_ms).unwrap_or(i64::MAX)],
                )?,
                None => conn.execute("DELETE FROM engine_states WHERE name = ?1", [&name])?,
            };
            Ok(())
        })
        .await
    }

    /// The engines out of service.
    pub async fn engine_states(&self) -> Result<Vec<EngineRow>, StoreError> {
        self.call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT name, state, since, force_after_ms FROM engine_states ORDER BY name",
            )?;
            let rows = stmt.query_map([], |r| {
                let state: String = r.get(1)?;
                Ok(EngineRow {
                    name: r.get(0)?,
                    state: match state.as_str() {
                        "drained" => EngineState::Drained,
                        "unreachable" => EngineState::Unreachable,
                        _ => EngineState::Draining,
                    },
                    since: r.get(2)?,
                    force_after_ms: u64::try_from(r.get::<_, i64>(3)?).unwrap_or(0),
                })
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    /// The sessions of `runtime` not ended, each with its newest execution's handle.
    pub async fn placed_sessions(
        &self,
        runtime: String,
    ) -> Result<Vec<(SessionId, Option<serde_json::Value>)>, StoreError> {
        self.call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT s.id, e.runtime_handle FROM task_sessions s \
                 LEFT JOIN executors_running e ON e.session_id = s.id \
                 WHERE s.runtime = ?1 AND s.state NOT IN ('COMPLETED', 'CANCELLED') \
                 ORDER BY s.created_at, s.id",
            )?;
            let rows = stmt.query_map([&runtime], |r| {
                let handle: Option<String> = r.get(1)?;
                Ok((r.get(0)?, handle.and_then(|text| serde_json::from_str(&text).ok())))
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    /// Starts a session's move (kept until [`Store::finish_move`]); a move already under
    /// way for it is kept as it is, and returned (whether its agent ran is what it said).
    pub async fn begin_move(&self, row: MoveRow) -> Result<MoveRow, StoreError> {
        self.call(move |conn| {
            conn.execute(
                "INSERT OR IGNORE INTO session_moves \
                 (session_id, from_engine, reason, resume, started_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![row.session_id, row.from, row.reason.as_str(), row.resume, now_ms()],
            )?;
            let resume: bool = conn.query_row(
                "SELECT resume FROM session_moves WHERE session_id = ?1",
                [&row.session_id],
                |r| r.get(0),
            )?;
            Ok(MoveRow { resume, ..row })
        })
        .await
    }

    /// The moves under way.
    pub async fn moves(&self) -> Result<Vec<MoveRow>, StoreError> {
        self.call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT session_id, from_engine, reason, resume FROM session_moves ORDER BY started_at",
            )?;
            let rows = stmt.query_map([], |r| {
                let reason: String = r.get(2)?;
                Ok(MoveRow {
                    session_id: r.get(0)?,
                    from: r.get(1)?,
                    reason: if reason == "failover" { MoveReason::Failover } else { MoveReason::Drain },
                    resume: r.get(3)?,
                })
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    /// Ends a session's move: its timeline row, the move forgotten, in one transaction.
    pub async fn finish_move(&self, row: MoveRow, to: Option<String>) -> Result<(), StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction()?;
            let ended =
                tx.execute("DELETE FROM session_moves WHERE session_id = ?1", [&row.session_id])?;
            // Once: a move carried out twice is recorded by the first to end it.
            if ended > 0 {
                let event = TimelineEvent::Moved { from: row.from, to, reason: row.reason };
                log(&tx, &row.session_id, &event)?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// Stores a session's move to another runtime in one transaction: its runtime and
    /// labels, the resume token dropped where it does not travel, and the `moved` row.
    pub async fn relocate_session(&self, relocation: Relocation) -> Result<(), StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction()?;
            let labels = (!relocation.labels.is_empty())
                .then(|| serde_json::to_string(&relocation.labels).unwrap_or_default());
            let changed = tx.execute(
                "UPDATE task_sessions SET runtime = ?2, runtime_labels = ?3, updated_at = ?4 WHERE id = ?1",
                params![relocation.session_id, relocation.runtime, labels, now_ms()],
            )?;
            if changed == 0 {
                let id = relocation.session_id.into_string();
                return Err(StoreError::NotFound { what: "session", id });
            }
            if let Some(execution) = &relocation.drop_token_of {
                tx.execute(
                    "UPDATE executors_running SET resume_token = NULL, updated_at = ?3 WHERE session_id = ?1 AND execution_id = ?2",
                    params![relocation.session_id, execution, now_ms()],
                )?;
            }
            let event = TimelineEvent::Moved {
                from: relocation.from,
                to: Some(relocation.runtime),
                reason: MoveReason::Requested,
            };
            log(&tx, &relocation.session_id, &event)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }
}
