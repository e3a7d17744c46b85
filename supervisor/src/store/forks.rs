//! Forks: which session was made from which other's conversation, at which of its turns,
//! and the agent session a fork's first start asks its agent to `session/fork` (cleared
//! once the fork opened, so a later resume restores the fork's own).

use protocol::api::ForkLink;

use super::sessions::insert_session;
use super::{
    OptionalExtension, SessionRow, Store, StoreError, TransactionBehavior, now_ms, params,
};
use crate::ids::{SessionId, TurnId};

/// A fork's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkRow {
    /// The session it was made from, and the turn.
    pub from: ForkLink,
    /// The original's agent session to `session/fork`, while the fork never opened.
    pub native_token: Option<String>,
}

impl Store {
    /// Stores a fork: its session row, that it is a fork of `from_session` at
    /// `from_turn`, and the original's agent settings as they are now (the model and mode
    /// chosen for it go on in the fork), in one transaction (a kill leaves all or none).
    pub async fn create_fork(
        &self,
        row: SessionRow,
        (from_session, from_turn): (SessionId, TurnId),
        native_token: Option<String>,
    ) -> Result<(), StoreError> {
        let id = row.id.clone();
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            insert_session(&tx, &row)?;
            tx.execute(
                "INSERT INTO session_forks (session_id, from_session, from_turn, native_token, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![row.id, from_session, from_turn, native_token, now_ms()],
            )?;
            tx.execute(
                "UPDATE task_sessions SET settings = (SELECT settings FROM task_sessions WHERE id = ?2) WHERE id = ?1",
                params![row.id, from_session],
            )?;
            tx.commit()?;
            Ok(())
        })
        .await?;
        self.announce_session(&id);
        Ok(())
    }

    /// What `session_id` was forked from, if it is a fork.
    pub async fn fork_of(&self, session_id: SessionId) -> Result<Option<ForkRow>, StoreError> {
        self.call(move |conn| {
            Ok(conn
                .query_row(
                    "SELECT from_session, from_turn, created_at, native_token FROM session_forks WHERE session_id = ?1",
                    [&session_id],
                    |r| {
                        Ok(ForkRow {
                            from: ForkLink { session_id: r.get(0)?, turn_id: r.get(1)?, at: r.get(2)? },
                            native_token: r.get(3)?,
                        })
                    },
                )
                .optional()?)
        })
        .await
    }

    /// The forks made of `session_id`, oldest first.
    pub async fn forks_from(&self, session_id: SessionId) -> Result<Vec<ForkLink>, StoreError> {
        self.call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT session_id, from_turn, created_at FROM session_forks WHERE from_session = ?1 ORDER BY created_at, session_id",
            )?;
            let rows = stmt.query_map([&session_id], |r| {
                Ok(ForkLink { session_id: r.get(0)?, turn_id: r.get(1)?, at: r.get(2)? })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// The fork opened (natively or not): its first start's token is spent.
    pub async fn fork_opened(&self, session_id: SessionId) -> Result<(), StoreError> {
        self.call(move |conn| {
            conn.execute(
                "UPDATE session_forks SET native_token = NULL WHERE session_id = ?1",
                [&session_id],
            )?;
            Ok(())
        })
        .await
    }
}
