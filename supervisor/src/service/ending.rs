//! How sessions end: stop, stop-all, delete and the retention cleanup, each fencing what
//! runs before the records change.

use super::{
    CleanedSession, CleanupPolicy, CleanupResult, FenceTarget, KeptSession, Phase, ServiceError,
    SessionHandle, SessionRow, SessionState, Supervisor, home, session_worktree, worktree,
};
use crate::ids::SessionId;

/// How long a delete waits for the session's actor to end once its sidecar is fenced.
const ACTOR_END_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Supervisor {
    /// Stops every live agent and its sidecar; the sessions stay resumable. Then every
    /// recorded execution of an active session is fenced, so a sidecar that no actor owns
    /// (whatever happened to it) is gone too. Returns how many agents were stopped.
    pub async fn stop_all(&self) -> usize {
        let handles: Vec<SessionHandle> =
            self.sessions().values().filter(|handle| handle.is_live()).cloned().collect();
        let mut stopped = 0;
        for handle in handles {
            let running = handle.view().agent_running;
            if handle.detach().await.is_ok() && running {
                stopped += 1;
            }
        }
        match self.config.store.active_executions().await {
            Ok(executions) => {
                for (row, execution) in executions {
                    if let Err(err) = self.fence(&row, Some(execution)).await {
                        tracing::error!(session = %row.id, %err, "cannot fence a sidecar");
                    }
                }
            }
            Err(err) => tracing::error!(%err, "cannot list executions to fence"),
        }
        // And whatever a teardown cut short left behind.
        self.sweep_leaked_sidecars().await;
        stopped
    }

    /// Kills whatever sidecar of the session still lives (see [`crate::runtime::Runtime::fence`]).
    pub(super) async fn fence(
        &self,
        row: &SessionRow,
        execution: Option<crate::store::ExecutionRow>,
    ) -> Result<(), ServiceError> {
        let runtime = self.runtime(&row.runtime)?;
        let state_dir = self
            .config
            .home
            .session_dir(&row.id)
            .map(|dir| crate::home::SessionPaths::new(dir).agentctl())
            .map_err(|err| ServiceError::Internal(err.to_string()))?;
        let state_dir = match &execution {
            Some(execution) => crate::runtime::execution_state_dir(execution, state_dir),
            None => state_dir,
        };
        let target = FenceTarget {
            session_id: row.id.clone(),
            state_dir,
            execution,
            grace: std::time::Duration::ZERO,
        };
        runtime
            .fence(&target)
            .await
            .map_err(|err| ServiceError::RuntimeUnavailable(err.to_string()))
    }

    /// `task.session.stop`: the agent is stopped and the session ends (`COMPLETED`).
    pub async fn stop(&self, session_id: SessionId) -> Result<(), ServiceError> {
        let row = self.session_row(&session_id).await?;
        self.end(row, SessionState::Completed).await
    }

    /// Ends a session for good as `end` (`COMPLETED` or `CANCELLED`).
    pub(super) async fn end(&self, row: SessionRow, end: SessionState) -> Result<(), ServiceError> {
        let session_id = row.id.clone();
        if row.state.is_terminal() {
            return Err(ServiceError::Conflict(format!(
                "session {session_id} is already {}",
                row.state.as_str()
            )));
        }
        match self.handle(&session_id).filter(SessionHandle::is_live) {
            Some(handle) if end == SessionState::Cancelled => Ok(handle.cancel_session().await?),
            Some(handle) => Ok(handle.stop().await?),
            None => {
                // Checked again under the start lock: a create that just stored the row puts
                // its actor in the table before it lets go of the lock.
                let guard = self.start_lock.lock().await;
                if let Some(handle) = self.handle(&session_id).filter(SessionHandle::is_live) {
                    drop(guard);
                    return match end {
                        SessionState::Cancelled => Ok(handle.cancel_session().await?),
                        _ => Ok(handle.stop().await?),
                    };
                }
                drop(guard);
                // No actor: whatever sidecar its record names must not outlive the session.
                let execution = self.config.store.get_execution(session_id.clone()).await?;
                if let Err(err) = self.fence(&row, execution).await {
                    tracing::warn!(session = %session_id, %err, "cannot fence a stopped session's sidecar");
                }
                self.set_state_without_actor(&session_id, end, None).await?;
                Ok(())
            }
        }
    }

    /// `task.session.delete`: stops it if live, then removes its records and files, and its
    /// worktree (refused while that holds uncommitted work, unless `force`; the branch is
    /// kept unless `delete_branch`).
    pub async fn delete(
        &self,
        session_id: SessionId,
        force: bool,
        delete_branch: bool,
    ) -> Result<(), ServiceError> {
        let row = self.session_row(&session_id).await?;
        if !force {
            // Checked before anything stops: a refusal changes nothing.
            refuse_uncommitted(&row).await?;
        }
        self.remove_session(&row, force, delete_branch).await.map(|_| ())
    }

    /// Whether a session is live: its agent runs or is being brought up (a launch or
    /// re-attach under way, `STARTING` or `RUNNING`). Asked under the start lock, it stays
    /// so until the lock is let go.
    fn is_live_now(&self, row: &SessionRow) -> bool {
        let running = self.handle(&row.id).filter(SessionHandle::is_live).is_some_and(|handle| {
            let view = handle.view();
            view.agent_running || view.is_starting() || view.phase == Phase::Reattaching
        });
        running || matches!(row.state, SessionState::Starting | SessionState::Running)
    }

    /// `task.delete`: the task and every session of it. Refused, changing nothing, while a
    /// workflow of it runs, a session of it is live or (unless `force`) a worktree of one
    /// holds uncommitted work.
    pub async fn delete_task(
        &self,
        task_id: String,
        force: bool,
        delete_branch: bool,
    ) -> Result<(), ServiceError> {
        self.config.store.get_task(task_id.clone()).await?;
        // Under the start lock: no resume or prompt can bring an agent up meanwhile.
        let _guard = self.start_lock.lock().await;
        // A running workflow is named first: stopping its sessions would not be enough,
        // its driver starts the next step's.
        self.refuse_running_workflows(&task_id).await?;
        let rows = self.config.store.list_sessions(Some(task_id.clone())).await?;
        let live: Vec<String> = rows
            .iter()
            .filter(|row| self.is_live_now(row))
            .map(|row| format!("{} ({})", row.id, row.state.as_str()))
            .collect();
        if !live.is_empty() {
            return Err(ServiceError::InvalidState(format!(
                "task {task_id} has live sessions: {}; stop or pause them first",
                live.join(", ")
            )));
        }
        if !force {
            for row in &rows {
                refuse_uncommitted(row).await?;
            }
        }
        for row in &rows {
            self.remove_session(row, force, delete_branch).await?;
        }
        self.config.store.delete_task(task_id).await?;
        Ok(())
    }

    /// Removes a session whatever it is doing (its agent stopped first): its worktree, its
    /// container, its rows, its history, event log and spool. Returns what went besides the
    /// rows (see `CleanedSession::resources`).
    pub(super) async fn remove_session(
        &self,
        row: &SessionRow,
        force: bool,
        delete_branch: bool,
    ) -> Result<Vec<String>, ServiceError> {
        let session_id = row.id.clone();
        let mut removed = Vec::new();
        if let Some(handle) = self.handle(&session_id).filter(SessionHandle::is_live)
            && !row.state.is_terminal()
        {
            let _ = handle.stop().await;
        }
        // Whatever sidecar of it still runs (a stop cut short by a kill left one) goes first.
        let execution = self.config.store.get_execution(session_id.clone()).await.ok().flatten();
        if let Err(err) = self.fence(row, execution.clone()).await {
            tracing::warn!(session = %session_id, %err, "cannot fence a deleted session's sidecar");
        }
        // An actor still retiring its sidecar (a stop answers before the sidecar is gone)
        // records what the sidecar's spool held once the retire lands: its files are
        // removed after that, not under its writes. Bounded: the fence just ended the retire.
        if let Some(handle) = self.handle(&session_id)
            && tokio::time::timeout(ACTOR_END_WAIT, handle.ended()).await.is_err()
        {
            tracing::warn!(session = %session_id, "the deleted session's actor did not end in time");
        }
        // Its checkpoint in flight ends first, and no other starts while its files go.
        let _checkpoints_held = self.config.checkpoints.hold(&session_id).await;
        if let Some(made) = session_worktree(row) {
            let existed = made.path.is_dir();
            if delete_branch {
                // Recorded first: recovery finishes a deletion a kill cuts short.
                let repo = made.repo.display().to_string();
                let branch = made.branch.clone();
                self.config.store.add_branch_deletion(repo, branch, session_id.clone()).await?;
            }
            worktree::remove(&made, force, delete_branch).await.map_err(|err| match err {
                worktree::WorktreeError::Uncommitted { .. } => {
                    ServiceError::Conflict(format!("session {session_id}: {err}"))
                }
                other => ServiceError::Internal(format!("session {session_id}: {other}")),
            })?;
            if delete_branch {
                let repo = made.repo.display().to_string();
                self.config.store.remove_branch_deletion(repo, made.branch.clone()).await?;
            }
            if existed {
                removed.push("worktree".to_owned());
            }
        }
        if let Ok(runtime) = self.runtime(&row.runtime) {
            let handle = match self.config.store.get_execution(session_id.clone()).await {
                Ok(execution) => execution.and_then(|execution| execution.runtime_handle),
                Err(_) => None,
            };
            match runtime.remove(&session_id, handle.as_ref()).await {
                Ok(true) => removed.push(runtime.resource_kind().unwrap_or("runtime").to_owned()),
                Ok(false) => {}
                Err(err) => {
                    tracing::warn!(session = %session_id, %err, "cannot remove the session's runtime resources");
                }
            }
        }
        self.config.store.delete_session(session_id.clone()).await?;
        // A kill from here on leaves files without rows: recovery removes them.
        agentctl::fault::point("delete.rows_removed");
        self.sessions().remove(&session_id);
        self.event_logs.lock().expect("UNWRAP: never poisoned").remove(&session_id);
        // The files the agent kept per ACP session on this host (the profile names them).
        if let (Some(execution), Ok(profile)) = (&execution, Self::pinned_profile(row))
            && self.runtime(&row.runtime).is_ok_and(|runtime| runtime.agent_home().is_none())
        {
            let ids = [&execution.acp_session_id, &execution.resume_token];
            let ids: std::collections::BTreeSet<&str> =
                ids.into_iter().flatten().map(String::as_str).collect();
            for id in ids.into_iter().filter(|id| is_file_name(id)) {
                for file in &profile.session.state_files {
                    let path = self.agent_home().join(file.replace("{acp_session}", id));
                    if std::fs::remove_file(&path).is_ok() {
                        removed.push(format!("agent state {}", path.display()));
                    }
                }
            }
        }
        let agent_state = self.config.home.agent_state(&session_id);
        if agent_state.exists() {
            let _ = std::fs::remove_dir_all(&agent_state);
        }
        let paths = self.config.home.session(&session_id);
        for (path, name) in paths.kept() {
            if path.exists() {
                removed.push(name.to_owned());
            }
        }
        let dir = paths.dir();
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|err| {
                ServiceError::Internal(format!("removing {}: {err}", dir.display()))
            })?;
        }
        self.config.checkpoints.forget(&session_id);
        Ok(removed)
    }

    /// Removes the directories of sessions that are not stored (`sessions/<id>/`,
    /// `agent-state/<id>/`): a delete killed after it removed the rows left them. Run by
    /// recovery after the leaked sidecars are gone and before the API serves (a create
    /// stores its row before it makes files, so none is under way); how many.
    pub(super) async fn remove_orphaned_session_dirs(&self) -> usize {
        let home = &self.config.home;
        let parents = [home.sessions(), home.root().join("agent-state")];
        let found: Vec<(std::path::PathBuf, SessionId)> = parents
            .iter()
            .filter_map(|parent| std::fs::read_dir(parent).ok())
            .flat_map(|entries| entries.flatten())
            .filter_map(|entry| Some((entry.path(), SessionId::from(entry.file_name().to_str()?))))
            .filter(|(_, name)| home::is_valid_id(name))
            .collect();
        let ids = found.iter().map(|(_, id)| id.clone()).collect();
        let known = match self.config.store.existing_sessions(ids).await {
            Ok(known) => known,
            Err(err) => {
                tracing::warn!(%err, "cannot check the session directories for orphans");
                return 0;
            }
        };
        let mut removed = 0;
        for (path, _) in found.into_iter().filter(|(_, id)| !known.contains(id)) {
            match std::fs::remove_dir_all(&path) {
                Ok(()) => {
                    tracing::info!(path = %path.display(), "removed the files of a deleted session (its delete was cut short)");
                    removed += 1;
                }
                Err(err) => {
                    tracing::warn!(path = %path.display(), %err, "cannot remove a deleted session's files")
                }
            }
        }
        removed
    }

    /// `sessions.cleanup`: removes the sessions at rest whose last change is older than the
    /// policy's age and that its filters select; never a live one (an agent running, a
    /// launch or re-attach under way, `STARTING` or `RUNNING`). A worktree with uncommitted
    /// work keeps its session unless `force`.
    pub async fn cleanup(&self, policy: &CleanupPolicy) -> Result<CleanupResult, ServiceError> {
        let cutoff = crate::store::now_ms()
            .saturating_sub(i64::from(policy.max_age_days).saturating_mul(86_400_000));
        let mut removed = Vec::new();
        let mut kept = Vec::new();
        for row in self.config.store.list_sessions(None).await? {
            if row.updated_at > cutoff
                || policy.states.as_ref().is_some_and(|states| !states.contains(&row.state))
                || (policy.keep_completed && row.state == SessionState::Completed)
            {
                continue;
            }
            let keep = |reason: String| KeptSession {
                session_id: row.id.to_string(),
                state: row.state,
                reason,
            };
            // Checked and removed under the start lock: no resume or prompt can bring the
            // session's agent up in between (they start actors under it, and read the row
            // again there).
            let _guard = self.start_lock.lock().await;
            if self.is_live_now(&row) {
                kept.push(keep("live: its agent runs (or is being brought up)".into()));
                continue;
            }
            if let Some(made) = session_worktree(&row)
                && !policy.force
            {
                match worktree::uncommitted(&made).await {
                    Ok(changed) if !changed.is_empty() => {
                        kept.push(keep(format!(
                            "its worktree {} has uncommitted changes ({} paths); --force removes them",
                            made.path.display(),
                            changed.len()
                        )));
                        continue;
                    }
                    Ok(_) => {}
                    Err(err) => {
                        kept.push(keep(format!("its worktree cannot be read: {err}")));
                        continue;
                    }
                }
            }
            let resources = if policy.dry_run {
                self.resources_of(&row)
            } else {
                match self.remove_session(&row, policy.force, false).await {
                    Ok(resources) => resources,
                    Err(err) => {
                        kept.push(keep(format!("cannot remove it: {err}")));
                        continue;
                    }
                }
            };
            tracing::info!(session = %row.id, state = %row.state.as_str(), dry_run = policy.dry_run, ?resources, "cleanup");
            removed.push(CleanedSession {
                session_id: row.id.to_string(),
                state: row.state,
                updated_at: row.updated_at,
                resources,
            });
        }
        removed.sort_by_key(|session| session.updated_at);
        Ok(CleanupResult { dry_run: policy.dry_run, removed, kept })
    }

    /// What removing a session would take besides its rows (for a dry run).
    pub(super) fn resources_of(&self, row: &SessionRow) -> Vec<String> {
        let mut resources = Vec::new();
        if session_worktree(row).is_some_and(|made| made.path.is_dir()) {
            resources.push("worktree".to_owned());
        }
        if let Some(kind) = self.runtime(&row.runtime).ok().and_then(|r| r.resource_kind()) {
            resources.push(kind.to_owned());
        }
        for (path, name) in self.config.home.session(&row.id).kept() {
            if path.exists() {
                resources.push(name.to_owned());
            }
        }
        resources
    }
}

/// Whether `id` can stand for one file name (an agent's session id put into a path).
fn is_file_name(id: &str) -> bool {
    !id.is_empty() && id != "." && id != ".." && !id.contains(['/', '\\', '\0'])
}

/// A `conflict` naming the files, when the session's worktree holds uncommitted work.
async fn refuse_uncommitted(row: &SessionRow) -> Result<(), ServiceError> {
    let Some(made) = session_worktree(row) else { return Ok(()) };
    let changed = worktree::uncommitted(&made)
        .await
        .map_err(|err| ServiceError::Internal(err.to_string()))?;
    if changed.is_empty() {
        return Ok(());
    }
    let err = worktree::WorktreeError::Uncommitted {
        path: made.path.display().to_string(),
        files: changed.into_iter().take(20).collect(),
    };
    Err(ServiceError::Conflict(format!("session {}: {err}", row.id)))
}
