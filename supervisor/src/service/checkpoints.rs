//! `task.session.checkpoint.list` and `task.session.checkpoint.restore` (see
//! [`crate::checkpoint`]): read from the store and the session's checkpoint repository,
//! for a session in any state.

use protocol::api::{CheckpointList, CheckpointRestored};

use super::{ServiceError, Supervisor};
use crate::checkpoint::CheckpointError;
use crate::ids::SessionId;

impl From<CheckpointError> for ServiceError {
    fn from(err: CheckpointError) -> ServiceError {
        match err {
            CheckpointError::NotFound(_) => ServiceError::NotFound(err.to_string()),
            CheckpointError::Refused(_) => {
                ServiceError::InvalidParams { field: "into", message: err.to_string() }
            }
            CheckpointError::TooBig { .. } => ServiceError::InvalidState(err.to_string()),
            CheckpointError::Git(_) | CheckpointError::Io(_) => {
                ServiceError::Storage(err.to_string())
            }
            CheckpointError::Store(store) => store.into(),
            CheckpointError::Fetch(_) => ServiceError::RuntimeUnavailable(err.to_string()),
        }
    }
}

impl Supervisor {
    /// `task.session.checkpoint.list`.
    pub async fn checkpoints(&self, session_id: SessionId) -> Result<CheckpointList, ServiceError> {
        let row = self.session_row(&session_id).await?;
        let checkpoints = self.config.store.checkpoints(session_id).await?;
        Ok(CheckpointList { session_id: row.id.into_string(), checkpoints })
    }

    /// `task.session.checkpoint.restore`: checkpoint `seq` (else turn `turn`'s, else the
    /// newest) written into `into`, a new or empty directory.
    pub async fn restore_checkpoint(
        &self,
        session_id: SessionId,
        seq: Option<u64>,
        turn: Option<u64>,
        into: String,
    ) -> Result<CheckpointRestored, ServiceError> {
        self.session_row(&session_id).await?;
        let listed = self.config.store.checkpoints(session_id.clone()).await?;
        let chosen = match (seq, turn) {
            (Some(seq), _) => listed.iter().find(|checkpoint| checkpoint.seq == seq),
            (None, Some(turn)) => {
                listed.iter().rev().find(|checkpoint| checkpoint.turn == Some(turn))
            }
            (None, None) => listed.last(),
        };
        let Some(chosen) = chosen else {
            let which = match (seq, turn) {
                (Some(seq), _) => format!("no checkpoint {seq}"),
                (None, Some(turn)) => format!("no checkpoint of turn {turn}"),
                (None, None) => "no checkpoint yet".to_owned(),
            };
            return Err(ServiceError::NotFound(format!("session {session_id} has {which}")));
        };
        let dir = self
            .config
            .home
            .session_dir(&session_id)
            .map_err(|err| ServiceError::Storage(format!("the session's directory: {err}")))?;
        let into = std::path::PathBuf::from(into);
        let (checkpoint, files) = self
            .config
            .checkpoints
            .restore_into(&self.config.store, session_id, &dir, chosen.seq, &into)
            .await?;
        Ok(CheckpointRestored { checkpoint, into: into.display().to_string(), files })
    }
}
