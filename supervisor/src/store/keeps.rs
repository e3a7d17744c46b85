//! A review's keeps (`task.session.changes.keep`): which changed files of a session were
//! kept, at which content. A keep stands while the file holds that content. And what its
//! reverts leave the agent to be told (`agent_notes`): tied to the turn whose prompt
//! carries them, gone once that prompt reached the agent.

use std::collections::BTreeMap;

use super::{Store, StoreError, now_ms, params};
use crate::ids::SessionId;

impl Store {
    /// Keeps `path` of the session at `content` (replacing an earlier keep), or takes its
    /// keep back (`content: None`).
    pub async fn set_keep(
        &self,
        session_id: SessionId,
        path: String,
        content: Option<String>,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            match content {
                Some(content) => conn.execute(
                    "INSERT INTO change_keeps (session_id, path, content, kept_at) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (session_id, path) DO UPDATE SET content = excluded.content, kept_at = excluded.kept_at",
                    params![session_id, path, content, now_ms()],
                )?,
                None => conn.execute(
                    "DELETE FROM change_keeps WHERE session_id = ?1 AND path = ?2",
                    params![session_id, path],
                )?,
            };
            Ok(())
        })
        .await
    }

    /// The session's keeps: path → the content kept.
    pub async fn keeps(
        &self,
        session_id: SessionId,
    ) -> Result<BTreeMap<String, String>, StoreError> {
        self.call(move |conn| {
            let mut stmt =
                conn.prepare("SELECT path, content FROM change_keeps WHERE session_id = ?1")?;
            let rows = stmt.query_map([&session_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    /// A file reverted: its keep taken back, and `note` left for the session's agent
    /// (it goes with the next prompt delivered), in one transaction.
    pub async fn reverted(
        &self,
        session_id: SessionId,
        path: String,
        note: String,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            tx.execute(
                "DELETE FROM change_keeps WHERE session_id = ?1 AND path = ?2",
                params![session_id, path],
            )?;
            tx.execute(
                "INSERT INTO agent_notes (session_id, note, created_at) VALUES (?1, ?2, ?3)",
                params![session_id, note, now_ms()],
            )?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// The notes the session's agent is still to be told, oldest first, each with its id:
    /// those no turn carried yet and those of a turn that ended before reaching the agent;
    /// or, for a prompt sent again (`resent`), those its turn carries.
    pub async fn agent_notes(
        &self,
        session_id: SessionId,
        resent: Option<crate::ids::TurnId>,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        self.call(move |conn| {
            let sql = match resent {
                Some(_) => "SELECT id, note FROM agent_notes WHERE session_id = ?1 AND turn_id = ?2 ORDER BY id",
                None => &format!(
                    "SELECT id, note FROM agent_notes WHERE {PENDING_NOTES} AND ?2 IS NULL ORDER BY id"
                ),
            };
            let mut query = conn.prepare(sql)?;
            let rows = query
                .query_map(params![session_id, resent], |row| Ok((row.get(0)?, row.get(1)?)))?;
            let notes = rows.collect::<Result<Vec<_>, _>>()?;
            Ok(notes)
        })
        .await
    }
}

/// Ties the notes `ids` to the turn whose prompt carries them (in that turn's
/// transaction); they go once it is delivered ([`delivered_agent_notes`]).
pub(super) fn tie_agent_notes(
    tx: &rusqlite::Transaction<'_>,
    ids: &[i64],
    turn: &crate::ids::TurnId,
) -> Result<(), StoreError> {
    for id in ids {
        tx.execute("UPDATE agent_notes SET turn_id = ?2 WHERE id = ?1", params![id, turn])?;
    }
    Ok(())
}

/// Removes the notes `turn`'s prompt carried: it reached the agent.
pub(super) fn delivered_agent_notes(
    conn: &rusqlite::Connection,
    turn: &crate::ids::TurnId,
) -> Result<(), StoreError> {
    conn.execute("DELETE FROM agent_notes WHERE turn_id = ?1", [turn])?;
    Ok(())
}

/// The notes of session `?1` still to be told: no turn carried them yet, or the turn that
/// did ended before its prompt was delivered.
const PENDING_NOTES: &str = "session_id = ?1 AND (turn_id IS NULL OR turn_id IN (SELECT id FROM \
    turns WHERE session_id = ?1 AND delivered = 0 AND state != 'running'))";

/// Drops the notes the session's agent was still to be told: a rewind that restored the
/// workspace made them untrue.
pub(super) fn drop_pending_agent_notes(
    tx: &rusqlite::Transaction<'_>,
    session_id: &SessionId,
) -> Result<(), StoreError> {
    tx.execute(&format!("DELETE FROM agent_notes WHERE {PENDING_NOTES}"), [session_id])?;
    Ok(())
}
