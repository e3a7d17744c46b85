//! A review's keeps (`task.session.changes.keep`): which changed files of a session were
//! kept, at which content. A keep stands while the file holds that content. And what its
//! reverts leave the agent to be told (`agent_notes`): each said once, with the prompt
//! whose turn's record removes it.

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

    /// Leaves `note` for the session's agent: it goes with the next prompt whose turn is
    /// recorded.
    pub async fn add_agent_note(
        &self,
        session_id: SessionId,
        note: String,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            conn.execute(
                "INSERT INTO agent_notes (session_id, note, created_at) VALUES (?1, ?2, ?3)",
                params![session_id, note, now_ms()],
            )?;
            Ok(())
        })
        .await
    }

    /// The notes left for the session's agent, oldest first, each with its id.
    pub async fn agent_notes(
        &self,
        session_id: SessionId,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        self.call(move |conn| {
            let mut query =
                conn.prepare("SELECT id, note FROM agent_notes WHERE session_id = ?1 ORDER BY id")?;
            let rows = query.query_map([&session_id], |row| Ok((row.get(0)?, row.get(1)?)))?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }
}

/// Removes the notes `ids` once they went with a prompt (in that turn's transaction).
pub(super) fn remove_agent_notes(
    tx: &rusqlite::Transaction<'_>,
    ids: &[i64],
) -> Result<(), StoreError> {
    for id in ids {
        tx.execute("DELETE FROM agent_notes WHERE id = ?1", [id])?;
    }
    Ok(())
}
