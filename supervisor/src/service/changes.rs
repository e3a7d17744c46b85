//! `task.session.changes` and the review's actions on a changed file (revert, keep): read
//! from the session's workspace with git whenever asked (nothing cached to go stale), for
//! a session in any state while its workspace is there.

use protocol::api::{ChangedFile, ChangesReverted, ReviewAction, SessionChanges};

use super::{ServiceError, Supervisor};
use crate::changes::{self, ChangesError, Reading, git::Repository};
use crate::events::SessionEventKind;
use crate::ids::SessionId;

impl From<ChangesError> for ServiceError {
    fn from(err: ChangesError) -> ServiceError {
        match err {
            ChangesError::NotChanged(_) => ServiceError::NotFound(err.to_string()),
            ChangesError::WorkspaceGone(_) | ChangesError::NotRepository(_) => {
                ServiceError::InvalidState(err.to_string())
            }
            ChangesError::Git(_) => ServiceError::Storage(err.to_string()),
            ChangesError::Store(store) => store.into(),
        }
    }
}

impl Supervisor {
    /// `task.session.changes`.
    pub async fn changes(&self, session_id: SessionId) -> Result<SessionChanges, ServiceError> {
        let row = self.session_row(&session_id).await?;
        let dir = std::path::Path::new(&row.workspace_path);
        let repo = match self.review_repository(&session_id, dir).await {
            Ok(repo) => repo,
            Err(ChangesError::NotRepository(_)) => {
                return Ok(SessionChanges {
                    session_id: row.id.into_string(),
                    ..Default::default()
                });
            }
            Err(err) => return Err(err.into()),
        };
        Ok(self.read_changes(&session_id, &repo).await?)
    }

    /// `task.session.changes.revert`: `path` back as the base has it, the workspace's
    /// files saved on a ref of their own first; the session's agent is told with its next
    /// prompt.
    pub async fn revert_change(
        &self,
        session_id: SessionId,
        path: String,
    ) -> Result<ChangesReverted, ServiceError> {
        let row = self.session_row(&session_id).await?;
        let dir = std::path::Path::new(&row.workspace_path);
        let repo = self.review_repository(&session_id, dir).await?;
        self.changed_file(&session_id, &repo, &path).await?;
        let saved_ref = format!("refs/tether/reverted/{session_id}/{}", uuid::Uuid::now_v7());
        let saved_commit = changes::git::revert(&repo, &path, &saved_ref).await?;
        // Its keep goes, and its agent learns of it with its next prompt (it would take its
        // change as made): one write, after the file is back (a failure says so).
        let note = changes::revert_note(&path, &saved_ref);
        if let Err(err) = self.config.store.reverted(session_id.clone(), path.clone(), note).await {
            return Err(ServiceError::Storage(format!(
                "{path} was reverted (what it held is on {saved_ref}), but the revert could not be recorded, so its keep stays and the agent is not told: {err}"
            )));
        }
        tracing::info!(session = %session_id, %path, %saved_ref, "reverted a changed file");
        let reviewed = SessionEventKind::ChangeReviewed {
            path: path.clone(),
            action: ReviewAction::Reverted,
            saved_ref: Some(saved_ref.clone()),
        };
        self.announce(&session_id, reviewed).await;
        let changes = self.read_changes(&session_id, &repo).await?;
        Ok(ChangesReverted { path, saved_ref, saved_commit, changes })
    }

    /// `task.session.changes.keep`: `path` kept at `content` (what the reviewer saw), or
    /// its keep taken back; announced on the session's stream, as a revert is.
    pub async fn keep_change(
        &self,
        session_id: SessionId,
        path: String,
        content: String,
        kept: bool,
    ) -> Result<SessionChanges, ServiceError> {
        let row = self.session_row(&session_id).await?;
        let dir = std::path::Path::new(&row.workspace_path);
        let repo = self.review_repository(&session_id, dir).await?;
        if kept {
            let file = self.changed_file(&session_id, &repo, &path).await?;
            if file.content != content {
                return Err(ServiceError::Conflict(format!(
                    "{path} changed since it was shown: review it again"
                )));
            }
        }
        let store = &self.config.store;
        store.set_keep(session_id.clone(), path.clone(), kept.then_some(content)).await?;
        let action = if kept { ReviewAction::Kept } else { ReviewAction::Unkept };
        let reviewed = SessionEventKind::ChangeReviewed { path, action, saved_ref: None };
        self.announce(&session_id, reviewed).await;
        Ok(self.read_changes(&session_id, &repo).await?)
    }

    async fn review_repository(
        &self,
        session_id: &SessionId,
        dir: &std::path::Path,
    ) -> Result<Repository, ChangesError> {
        let start = self.config.store.start_commit(session_id.clone()).await?.flatten();
        changes::git::repository(dir, start.as_deref()).await
    }

    async fn read_changes(
        &self,
        session_id: &SessionId,
        repo: &Repository,
    ) -> Result<SessionChanges, ChangesError> {
        let (numstat, patch) = changes::git::diff(repo).await?;
        let store = &self.config.store;
        let reading = Reading {
            numstat,
            patch,
            dirty_at_start: store.start_dirty(session_id.clone()).await?,
            keeps: store.keeps(session_id.clone()).await?,
        };
        let assembled = changes::assemble(&reading);
        let error = assembled
            .mismatch
            .then(|| "the workspace changed while it was read: its diffs are left out".to_owned());
        Ok(SessionChanges {
            session_id: session_id.to_string(),
            repository: true,
            base_commit: Some(repo.base.clone()),
            files: assembled.files,
            truncated: assembled.truncated,
            error,
        })
    }

    async fn changed_file(
        &self,
        session_id: &SessionId,
        repo: &Repository,
        path: &str,
    ) -> Result<ChangedFile, ChangesError> {
        let changes = self.read_changes(session_id, repo).await?;
        let file = changes.files.into_iter().find(|file| file.path == path);
        file.ok_or_else(|| ChangesError::NotChanged(path.to_owned()))
    }
}
