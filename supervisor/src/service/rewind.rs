//! `task.session.rewind` (see [`crate::rewind`]): through the session's actor when one
//! runs (it parks a running agent first); else under the start lock, so no start of the
//! session races it.

use protocol::api::RewindResult;

use super::{ServiceError, Supervisor};
use crate::events::SessionEventKind;
use crate::ids::{SessionId, TurnId};
use crate::rewind::Target;
use crate::session::SessionHandle;

impl Supervisor {
    /// `task.session.rewind`.
    pub async fn rewind(
        &self,
        session_id: SessionId,
        turn_id: TurnId,
        restore_workspace: bool,
    ) -> Result<RewindResult, ServiceError> {
        self.unended_row(&session_id).await?;
        if let Some(handle) = self.handle(&session_id).filter(SessionHandle::is_live) {
            return Ok(handle.rewind(turn_id, restore_workspace).await?);
        }
        let guard = self.start_lock.lock().await;
        // Read again under the lock: an actor may have started, or a stop ended it.
        if let Some(handle) = self.handle(&session_id).filter(SessionHandle::is_live) {
            drop(guard);
            return Ok(handle.rewind(turn_id, restore_workspace).await?);
        }
        let row = self.unended_row(&session_id).await?;
        let runtime = self.runtime(&row.runtime)?;
        let paths = self.config.home.session(&row.id);
        let (history, dir) = (paths.history(), paths.dir().to_owned());
        let target = Target {
            store: &self.config.store,
            session: &row.id,
            workspace: std::path::Path::new(&row.workspace_path),
            history: &history,
            checkpoints: (&self.config.checkpoints, &dir),
            runtime: &*runtime,
        };
        let (result, rewind) = crate::rewind::apply(&target, &turn_id, restore_workspace).await?;
        tracing::info!(session = %row.id, turn = %turn_id, rewound = result.rewound.len(), "rewound at rest");
        // Announced as the actor announces its own (under the start lock, nothing else
        // writes the session's stream now).
        let announced = SessionEventKind::Rewound {
            turn_id: result.turn_id.clone(),
            rewound: result.rewound.clone(),
            saved_ref: rewind.saved_ref,
        };
        self.publish_at_rest(&row.id, announced).await;
        Ok(result)
    }
}
