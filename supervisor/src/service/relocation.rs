//! `task.session.move`: a session moved to another runtime (standalone ↔ docker), or on
//! Docker to an engine carrying other labels. Checked first (the runtime answers, the
//! session's pinned profile can run there), its running turn ended at the boundary
//! (cancelled after `force_after_ms`), then moved by its actor, or by this module under
//! the start lock when none lives (see [`crate::session::relocate`]), and resumed on the
//! new runtime if its agent was running.

use std::collections::BTreeMap;

use protocol::api::{MoveReason, SessionMoved};

use super::engines::DEFAULT_DRAIN_FORCE_MS;
use super::{ServiceError, Supervisor};
use crate::ids::SessionId;
use crate::session::SessionHandle;
use crate::session::relocate::{self, Destination, Relocated};
use crate::wire::runtime_kind;

impl Supervisor {
    /// `task.session.move`.
    pub async fn move_to_runtime(
        &self,
        session_id: SessionId,
        runtime: String,
        labels: Option<BTreeMap<String, String>>,
        force_after_ms: Option<u64>,
    ) -> Result<SessionMoved, ServiceError> {
        let destination =
            self.destination(&session_id, &runtime, labels.unwrap_or_default()).await?;
        let ran = self.agent_runs(&session_id);
        if ran {
            let reason = format!("moving to runtime {runtime}");
            let force = force_after_ms.unwrap_or(DEFAULT_DRAIN_FORCE_MS);
            self.pause_for_move(&session_id, reason, force).await?;
        }
        let relocated = self.relocate(&session_id, destination).await.map_err(|err| {
            if !ran {
                return err;
            }
            err.with_hint(
                "; the session was paused for the move and stays where it was (task.session.resume starts it there again)",
            )
        })?;
        crate::metrics::get()
            .moves
            .get_or_create(&crate::metrics::label("reason", MoveReason::Requested.as_str()))
            .inc();
        let to = if ran {
            self.resume(session_id.clone(), false).await.map_err(|err| {
                err.with_hint(&format!(
                    "; the session was moved to runtime {runtime} and did not start there (task.session.move takes it back)"
                ))
            })?;
            let now = self.config.store.get_execution(session_id.clone()).await?;
            let handle = now.and_then(|now| now.runtime_handle);
            relocate::place_of(&*self.runtime(&runtime)?, handle.as_ref())
        } else {
            runtime.clone()
        };
        tracing::info!(session = %session_id, from = %relocated.from, %to, "moved to another runtime");
        Ok(SessionMoved {
            session_id: session_id.into_string(),
            from: relocated.from,
            to,
            runtime: runtime_kind(&runtime),
            resumed: ran,
            native: relocated.native,
        })
    }

    /// Where a session may move: a runtime that answers, labels only where they place, not
    /// where it is already, and one its pinned profile runs on.
    async fn destination(
        &self,
        session_id: &SessionId,
        runtime: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<Destination, ServiceError> {
        let row = self.session_row(session_id).await?;
        if row.state.is_terminal() {
            return Err(ServiceError::Conflict(format!(
                "session {session_id} is {} and cannot be moved",
                row.state.as_str()
            )));
        }
        let to = self.check_runtime(runtime).await?;
        if !labels.is_empty() && !to.places_by_labels() {
            return Err(ServiceError::InvalidParams {
                field: "labels",
                message: format!(
                    "runtime {runtime} does not place sessions by labels (docker does)"
                ),
            });
        }
        if row.runtime == runtime && row.runtime_labels == labels {
            return Err(ServiceError::InvalidState(format!(
                "session {session_id} runs on runtime {runtime} already{}",
                if labels.is_empty() { "" } else { " with those labels" }
            )));
        }
        let newest = self.config.store.get_execution(session_id.clone()).await?;
        let handle = newest.and_then(|newest| newest.runtime_handle);
        relocate::may_leave(&*self.runtime(&row.runtime)?, handle.as_ref(), &*to, &row)?;
        let profile = Supervisor::pinned_profile(&row)?;
        let reasons = self.unavailable(&profile, runtime);
        if !reasons.is_empty() {
            return Err(ServiceError::InvalidState(format!(
                "session {session_id}'s profile {} cannot run on runtime {runtime}: {}",
                row.agent_profile_id,
                reasons.join("; ")
            )));
        }
        self.check_root_env(&crate::store::SessionRow { runtime: runtime.to_owned(), ..row })?;
        if let Some(moving) =
            self.config.store.moves().await?.into_iter().find(|row| row.session_id == *session_id)
        {
            return Err(ServiceError::InvalidState(format!(
                "session {session_id} is moving off engine {} ({}); move it when that is done",
                moving.from,
                moving.reason.as_str()
            )));
        }
        Ok(Destination { runtime: to, labels })
    }

    /// Moves the session while its agent does not run: by its actor when one lives (the
    /// start lock let go first: the actor takes its commands one at a time), else here,
    /// under the start lock (no actor starts meanwhile).
    async fn relocate(
        &self,
        session_id: &SessionId,
        destination: Destination,
    ) -> Result<Relocated, ServiceError> {
        let guard = self.start_lock.lock().await;
        if let Some(handle) = self.handle(session_id).filter(SessionHandle::is_live) {
            drop(guard);
            return Ok(handle.relocate(destination).await?);
        }
        let row = self.session_row(session_id).await?;
        let profile = Supervisor::pinned_profile(&row)?;
        let sandbox = self.sandbox_of(&profile);
        let session_dir = self
            .config
            .home
            .session_dir(session_id)
            .map_err(|err| ServiceError::Internal(err.to_string()))?;
        let from = self.runtime(&row.runtime)?;
        let relocated = relocate::relocate(
            (&self.config.store, &self.config.checkpoints),
            &from,
            &destination,
            &row,
            (&profile, &sandbox),
            &session_dir,
        )
        .await?;
        Ok(relocated)
    }
}
