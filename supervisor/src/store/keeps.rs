//! A review's keeps (`task.session.changes.keep`): which changed files of a session were
//! kept, at which content. A keep stands while the file holds that content.

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
}
