//! Rewinds: a session's conversation made to end at one of its turns. The later turns are
//! kept (in the history and the timeline), marked; the history entries they wrote are
//! left out of every injection from then on; the agent's own session, which holds them,
//! is dropped (the resume token cleared in the same transaction) and the next start opens
//! a fresh one primed with the turns kept.

use super::{OptionalExtension, Store, StoreError, TransactionBehavior, params};
use crate::ids::{RewindId, SessionId, TurnId};

/// A rewind's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RewindRow {
    /// The rewind.
    pub id: RewindId,
    /// The session rewound.
    pub session_id: SessionId,
    /// The turn made the conversation's last.
    pub turn_id: TurnId,
    /// The history entries rewound, `from..=to` (empty when `from > to`).
    pub seqs: (u64, u64),
    /// The workspace was returned to its state at the turn.
    pub workspace_restored: bool,
    /// Where what the workspace held before is saved.
    pub saved_ref: Option<String>,
    /// When (Unix ms).
    pub created_at: i64,
}

fn seq(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl Store {
    /// Stores a rewind in one transaction: its row (pending), the turns it rewinds marked,
    /// the session's resume token cleared (its agent session holds those turns), and,
    /// when it restored the workspace, the notes its agent was still to be told dropped.
    pub async fn record_rewind(
        &self,
        row: RewindRow,
        rewound: Vec<TurnId>,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "INSERT INTO session_rewinds (id, session_id, turn_id, from_seq, to_seq, workspace_restored, saved_ref, pending, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 1, ?8)",
                params![
                    row.id,
                    row.session_id,
                    row.turn_id,
                    seq(row.seqs.0),
                    seq(row.seqs.1),
                    row.workspace_restored,
                    row.saved_ref,
                    row.created_at
                ],
            )?;
            for turn in &rewound {
                tx.execute(
                    "UPDATE turns SET rewound_by = ?1 WHERE id = ?2 AND session_id = ?3",
                    params![row.id, turn, row.session_id],
                )?;
            }
            tx.execute(
                "UPDATE executors_running SET resume_token = NULL WHERE session_id = ?1",
                [&row.session_id],
            )?;
            if row.workspace_restored {
                // What the notes say of the workspace is no longer so.
                super::keeps::drop_pending_agent_notes(&tx, &row.session_id)?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// A session's rewinds, oldest first.
    pub async fn rewinds(&self, session_id: SessionId) -> Result<Vec<RewindRow>, StoreError> {
        self.call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT id, session_id, turn_id, from_seq, to_seq, workspace_restored, saved_ref, created_at FROM session_rewinds WHERE session_id = ?1 ORDER BY created_at, id",
            )?;
            let rows = stmt.query_map([&session_id], |r| {
                Ok(RewindRow {
                    id: r.get(0)?,
                    session_id: r.get(1)?,
                    turn_id: r.get(2)?,
                    seqs: (
                        r.get::<_, i64>(3)?.max(0) as u64,
                        r.get::<_, i64>(4)?.max(0) as u64,
                    ),
                    workspace_restored: r.get(5)?,
                    saved_ref: r.get(6)?,
                    created_at: r.get(7)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Whether a rewind waits for the agent's next session (which must open fresh, with the
    /// turns kept injected).
    pub async fn rewind_pending(&self, session_id: SessionId) -> Result<bool, StoreError> {
        self.call(move |conn| {
            Ok(conn
                .query_row(
                    "SELECT 1 FROM session_rewinds WHERE session_id = ?1 AND pending = 1 LIMIT 1",
                    [&session_id],
                    |_| Ok(()),
                )
                .optional()?
                .is_some())
        })
        .await
    }

    /// The agent's session opened without the rewound turns: no rewind waits any more.
    pub async fn rewind_opened(&self, session_id: SessionId) -> Result<(), StoreError> {
        self.call(move |conn| {
            conn.execute(
                "UPDATE session_rewinds SET pending = 0 WHERE session_id = ?1 AND pending = 1",
                [&session_id],
            )?;
            Ok(())
        })
        .await
    }
}
