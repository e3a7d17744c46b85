//! A session's agent settings (`crate::settings`): one JSON column, written by the
//! session's actor alone (or, while it has none, by the service under its start lock).

use crate::ids::SessionId;
use rusqlite::OptionalExtension;

use super::{Store, StoreError};
use crate::settings::SessionSettings;

impl Store {
    /// The session's settings (the default when none were recorded).
    pub async fn session_settings(
        &self,
        session_id: SessionId,
    ) -> Result<SessionSettings, StoreError> {
        self.call(move |conn| {
            let text: Option<Option<String>> = conn
                .query_row("SELECT settings FROM task_sessions WHERE id = ?1", [&session_id], |r| {
                    r.get(0)
                })
                .optional()?;
            match text {
                None => Err(StoreError::NotFound { what: "session", id: session_id.into_string() }),
                Some(None) => Ok(SessionSettings::default()),
                Some(Some(text)) => serde_json::from_str(&text).map_err(|err| {
                    StoreError::Corrupt { what: "session settings", detail: err.to_string() }
                }),
            }
        })
        .await
    }

    /// Records the title the session's agent gave it (`None`: it took it back).
    pub async fn set_session_title(
        &self,
        session_id: SessionId,
        title: Option<String>,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            conn.execute(
                "UPDATE task_sessions SET title = ?2 WHERE id = ?1",
                rusqlite::params![session_id, title],
            )?;
            Ok(())
        })
        .await
    }

    /// Records the session's settings.
    pub async fn set_session_settings(
        &self,
        session_id: SessionId,
        settings: SessionSettings,
    ) -> Result<(), StoreError> {
        let text = serde_json::to_string(&settings).map_err(|err| StoreError::Corrupt {
            what: "session settings",
            detail: err.to_string(),
        })?;
        self.call(move |conn| {
            let changed = conn.execute(
                "UPDATE task_sessions SET settings = ?2 WHERE id = ?1",
                rusqlite::params![session_id, text],
            )?;
            if changed == 0 {
                return Err(StoreError::NotFound { what: "session", id: session_id.into_string() });
            }
            Ok(())
        })
        .await
    }
}
