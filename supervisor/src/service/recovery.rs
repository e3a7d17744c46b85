//! Restart recovery: what the supervisor finds of each session when it starts (a sidecar to
//! re-attach to, a dead one's spool to record, a stop cut short to finish, leaked sidecars,
//! worktrees and runtime resources), and how each is brought to a state with an exit.

use super::{
    Arc, ExecutionStatus, HashMap, Liveness, Mark, Phase, Profile, ReattachPlan, RecoverySummary,
    ServiceError, SessionEvent, SessionEventKind, SessionRecord, SessionRow, SessionState,
    SessionView, SnapshotTrigger, Spool, Start, Supervisor, home, session, worktree,
};
use crate::ids::SessionId;

/// How often [`Supervisor::announce`] tries before it gives up (each try is an actor
/// that ended before taking the announcement, or one that started meanwhile).
const ANNOUNCE_TRIES: usize = 5;

impl Supervisor {
    /// A session's event log was found holding fewer events than were issued (cut,
    /// emptied or deleted while the daemon was down): said to subscribers (a notice at the
    /// first new seq), in the log and in the session's timeline.
    pub(super) async fn report_lost_events(
        &self,
        session_id: &SessionId,
        dir: &std::path::Path,
        log: &Arc<Spool<SessionEvent>>,
        lost: std::ops::RangeInclusive<u64>,
    ) {
        let (first, last) = (*lost.start(), *lost.end());
        let message = format!(
            "the event log lost events {first}–{last} while the daemon was down ({} holds \
             fewer events than were issued); numbering continues at {}, and the conversation \
             is in task.session.history",
            dir.display(),
            last + 1
        );
        tracing::warn!(session = %session_id, "{message}");
        let record =
            SessionRecord::new(session_id.clone(), self.config.store.clone(), Arc::clone(log));
        let notice = SessionEventKind::Notice { message: message.clone() };
        // It carries the marks of the newest event kept: the agent events past them are
        // still published again from agentctl's spool, the ones before are not.
        let kept = log.last_entry().ok().flatten();
        let mark = Mark {
            agent_seq: kept.as_ref().and_then(|event| event.agent_seq),
            generation: kept.as_ref().and_then(|event| event.generation),
        };
        if let Err(err) = record.publish(vec![notice], mark) {
            tracing::warn!(session = %session_id, %err, "cannot publish the lost events' notice");
        }
        if let Err(err) = self.config.store.log_error(session_id.clone(), message).await {
            tracing::warn!(session = %session_id, %err, "cannot record the lost events");
        }
    }

    /// Sessions the restart caught starting: whatever their runtime may have started is
    /// fenced, and they wait for input. Returns how many.
    async fn wake_stranded(&self, stranded: Vec<SessionRow>) -> Result<usize, ServiceError> {
        let mut woken = 0;
        for row in stranded {
            if let Err(err) = self.fence(&row, None).await {
                tracing::error!(session = %row.id, %err, "cannot fence a stranded session's sidecar");
            }
            let reason = "the supervisor stopped while this session was starting; prompt or resume it to go on";
            self.set_state_without_actor(
                &row.id,
                SessionState::WaitingForInput,
                Some(reason.into()),
            )
            .await?;
            woken += 1;
            tracing::info!(session = %row.id, "recovery: it was starting; fenced, it waits for input");
        }
        Ok(woken)
    }

    /// Pauses asked for before the restart whose session has no agent any more (it was
    /// found dead) take effect: nothing is left to wait for.
    async fn settle_pauses_without_agent(&self) -> Result<(), ServiceError> {
        for (session_id, request) in self.config.store.pauses().await? {
            let reattaching_it = self.handle(&session_id).is_some_and(|handle| handle.is_live());
            if reattaching_it {
                continue;
            }
            match self.config.store.get_session(session_id.clone()).await {
                Ok(row) if row.state.is_active() => {
                    if let Err(err) = self
                        .pause_without_agent(
                            &row,
                            request.reason,
                            false,
                            request.trigger,
                            request.summary_asked_at,
                        )
                        .await
                    {
                        tracing::error!(session = %session_id, %err, "cannot pause a session at recovery");
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Restart recovery (DESIGN §7). Serves at once: live sidecars are re-attached in the
    /// background (status says `reattaching` meanwhile), and a summary is logged when every
    /// re-attach has settled. Dead sidecars are fenced (a stray one is killed) and what
    /// they leave behind is marked and published. One bad row is reported and skipped; it
    /// never stops the daemon. No agent is launched.
    pub async fn recover(&self) -> Result<RecoverySummary, ServiceError> {
        let mut summary = RecoverySummary::default();
        let mut reattaching = Vec::new();
        let boot_id = agentctl::ready::boot_id().unwrap_or_default();
        // Sessions at rest — stopped, nothing open, no sidecar of theirs alive — need
        // nothing: one scan of the processes and one indexed query leave them out unread,
        // so a restart does not grow with the number of stored sessions.
        let (sidecar_pids, sidecar_dirs) = crate::runtime::live_sidecars();
        let live_sessions: Vec<crate::ids::SessionId> = sidecar_dirs
            .iter()
            .filter_map(|dir| self.config.home.session_of_agentctl(dir))
            .collect();
        // The runtime whose sidecars the process scan finds (the standalone one).
        let local = self.config.runtimes.local().map_or("", |runtime| runtime.name());
        let (candidates, active) =
            self.config.store.recovery_candidates(local, &sidecar_pids, live_sessions).await?;
        let examined = candidates.len();
        let mut to_recover = Vec::new();
        for candidate in candidates {
            if self.at_rest(&candidate, &sidecar_pids, &sidecar_dirs) {
                summary.at_rest += 1;
            } else {
                to_recover.push(candidate);
            }
        }
        // Liveness, asked of each runtime once for all its executions (one call per Docker
        // engine, not an inspect per container).
        let mut by_runtime: HashMap<String, Vec<crate::store::ExecutionRow>> = HashMap::new();
        for candidate in &to_recover {
            let execution = &candidate.execution;
            by_runtime.entry(execution.runtime.clone()).or_default().push(execution.clone());
        }
        let mut liveness: HashMap<crate::ids::SessionId, Liveness> = HashMap::new();
        for (name, executions) in &by_runtime {
            if let Some(runtime) = self.config.runtimes.get(name) {
                liveness.extend(runtime.liveness(executions, &boot_id).await);
            }
        }
        for candidate in to_recover {
            let execution = candidate.execution;
            let row = match self.config.store.get_session(execution.session_id.clone()).await {
                Ok(row) => row,
                Err(err) => {
                    summary.skipped += 1;
                    tracing::error!(session = %execution.session_id, %err, "cannot read this session for recovery; skipped");
                    continue;
                }
            };
            let session_id = row.id.clone();
            let (kept_row, kept_execution) = (row.clone(), execution.clone());
            let found = liveness.remove(&session_id).unwrap_or(Liveness::Dead);
            match self.recover_one(row, execution, found, &mut summary).await {
                Ok(Some(reattached)) => reattaching.push(reattached),
                Ok(None) => {}
                Err(err) => {
                    // Whatever it was, no sidecar of it may run on unowned.
                    if let Err(fence) = self.fence(&kept_row, Some(kept_execution)).await {
                        tracing::error!(session = %session_id, %fence, "cannot fence a skipped session's sidecar");
                    }
                    summary.skipped += 1;
                    tracing::error!(session = %session_id, %err, "cannot recover this session; skipped");
                    let message = format!("recovery skipped this session: {err}");
                    let _ = self
                        .set_state_without_actor(
                            &session_id,
                            SessionState::WaitingForInput,
                            Some(message),
                        )
                        .await;
                }
            }
        }
        // A session caught before its first launch recorded anything: whatever its runtime
        // may have started is fenced (found through its state dir or container name), and it
        // waits for input instead of reading `STARTING` forever.
        // A pause asked for before the restart, whose session has no agent any more (it was
        // found dead): nothing is left to wait for.
        self.settle_pauses_without_agent().await?;
        let stranded = self.config.store.stranded_sessions().await?;
        // Those the query left out are at rest too.
        summary.at_rest += active.saturating_sub(examined + stranded.len());
        summary.dead += self.wake_stranded(stranded).await?;
        // Sidecars a teardown cut short left running (a stop, delete or failed launch
        // killed halfway), whatever their session's state, go.
        summary.orphans_removed += self.sweep_leaked_sidecars().await;
        // And the rest of such a teardown: what the sidecar spooled is recorded, the turn
        // ends.
        for row in self.config.store.ended_with_open_work().await? {
            match self.finish_teardown(row.clone()).await {
                Ok(Some(reattached)) => reattaching.push(reattached),
                Ok(None) => {
                    summary.interrupted += 1;
                    tracing::info!(session = %row.id, "recovery: finished the stop a kill cut short");
                }
                Err(err) => {
                    summary.skipped += 1;
                    tracing::error!(session = %row.id, %err, "cannot finish a stopped session's teardown");
                }
            }
        }
        // Worktrees made for a session that was never stored (killed mid-create) go, and
        // the files of a session whose delete was cut short.
        summary.orphans_removed += self.remove_orphaned_worktrees().await;
        summary.orphans_removed += self.remove_orphaned_session_dirs().await;
        summary.orphans_removed += self.finish_branch_deletions().await;
        // Containers of ours whose session is gone are removed (on every engine there).
        summary.orphans_removed += self.remove_orphaned_runtime_resources().await;
        // Prompts taken while no agent was up, which the restart caught before they ran:
        // their agents are brought back (the one launch recovery makes, for work asked).
        self.wake_for_queued_prompts().await?;
        count_recovery(&summary, &reattaching);
        // A line per session once its actor has settled (connected or not), then the sums.
        tokio::spawn(async move {
            let (mut reattached, mut replayed, mut failed) = (0, 0, 0);
            for Reattaching { session_id, mut view, replay } in reattaching {
                let settled =
                    view.wait_for(|view| view.phase != Phase::Reattaching).await.map(|view| {
                        (view.agent_running || view.phase == Phase::Open, view.error.clone())
                    });
                match (replay, settled) {
                    (true, _) => {
                        replayed += 1;
                        tracing::info!(session = %session_id, "recovery: replayed its dead sidecar's spool");
                    }
                    (false, Ok((true, _))) => {
                        reattached += 1;
                        tracing::info!(session = %session_id, "recovery: re-attached to its live sidecar");
                    }
                    (false, settled) => {
                        failed += 1;
                        let error = settled.ok().and_then(|(_, error)| error).unwrap_or_default();
                        tracing::warn!(session = %session_id, %error, "recovery: could not re-attach to its sidecar");
                    }
                }
            }
            tracing::info!(reattached, replayed, failed, "recovery: re-attaching done");
        });
        Ok(summary)
    }

    /// Kills every sidecar no actor owns that a cut-short teardown left running: those of
    /// executions not marked over whose session is at rest (stopped, paused, failed,
    /// cancelled), on any runtime, and every local agentctl serving a session dir under
    /// this home whose session has no live actor (or is not stored at all). Returns how
    /// many were found.
    pub(super) async fn sweep_leaked_sidecars(&self) -> usize {
        let mut swept = 0;
        let owned =
            |session_id: &SessionId| self.handle(session_id).is_some_and(|handle| handle.is_live());
        match self.config.store.unfinished_executions_at_rest().await {
            Ok(executions) => {
                for (row, execution) in executions {
                    if owned(&row.id) {
                        continue;
                    }
                    let execution_id = execution.execution_id.clone();
                    match self.fence(&row, Some(execution)).await {
                        Ok(()) => {
                            let dead = ExecutionStatus::Dead;
                            let _ = self
                                .config
                                .store
                                .set_execution_status(row.id.clone(), execution_id, dead)
                                .await;
                            swept += 1;
                        }
                        Err(err) => {
                            tracing::warn!(session = %row.id, %err, "cannot fence a sidecar left by a teardown")
                        }
                    }
                }
            }
            Err(err) => tracing::warn!(%err, "cannot list the executions left by teardowns"),
        }
        for (pid, dir) in crate::runtime::local_sidecars() {
            let Some(session_id) = self.config.home.session_of_agentctl(&dir) else { continue };
            if owned(&session_id) {
                continue;
            }
            tracing::warn!(session = %session_id, pid, "killing a sidecar that no session owns");
            match crate::runtime::kill_local_sidecar(pid, &dir).await {
                Ok(()) => swept += 1,
                Err(err) => {
                    tracing::warn!(session = %session_id, pid, %err, "cannot kill a sidecar no session owns")
                }
            }
        }
        swept
    }

    /// Branches whose deletion a kill cut short (recorded before it began) are deleted now,
    /// by their recorded names only, unless a session still works on one; how many went.
    pub(super) async fn finish_branch_deletions(&self) -> usize {
        let pending = match self.config.store.branch_deletions().await {
            Ok(pending) => pending,
            Err(err) => {
                tracing::warn!(%err, "cannot read the branch deletions left to finish");
                return 0;
            }
        };
        let mut deleted = 0;
        for (repo, branch, in_use) in pending {
            if !in_use {
                match worktree::delete_branch(std::path::Path::new(&repo), &branch).await {
                    Ok(true) => {
                        tracing::info!(%repo, %branch, "deleted a branch whose deletion was cut short");
                        deleted += 1;
                    }
                    Ok(false) => {}
                    Err(err) => {
                        tracing::warn!(%repo, %branch, %err, "cannot delete a branch left to delete");
                        continue;
                    }
                }
            }
            if let Err(err) = self.config.store.remove_branch_deletion(repo, branch).await {
                tracing::warn!(%err, "cannot record a finished branch deletion");
            }
        }
        deleted
    }

    /// Removes our containers (stopped ones too) whose session is not stored; how many.
    /// Only the sessions the containers name are looked up.
    /// Worktrees under `$TETHER_HOME/worktrees/` whose session is not stored: made by a
    /// create that was killed before it stored the session. One with uncommitted work is
    /// kept (and said); its branch is kept either way.
    pub(super) async fn remove_orphaned_worktrees(&self) -> usize {
        let dir = self.config.home.root().join("worktrees");
        let Ok(entries) = std::fs::read_dir(&dir) else { return 0 };
        let ids: Vec<SessionId> = entries
            .flatten()
            .filter_map(|entry| entry.file_name().to_str().map(SessionId::from))
            .filter(|name| home::is_valid_id(name))
            .collect();
        let known = match self.config.store.existing_sessions(ids.clone()).await {
            Ok(known) => known,
            Err(err) => {
                tracing::warn!(%err, "cannot check the worktrees for orphans");
                return 0;
            }
        };
        let mut removed = 0;
        for id in ids.into_iter().filter(|id| !known.contains(id)) {
            let path = dir.join(&id);
            match worktree::orphan(&path).await {
                Ok(made) => match worktree::remove(&made, false, false).await {
                    Ok(()) => {
                        tracing::info!(path = %path.display(), branch = %made.branch, "removed a worktree whose session was never stored");
                        removed += 1;
                    }
                    Err(err) => {
                        tracing::warn!(path = %path.display(), %err, "an orphaned worktree is kept")
                    }
                },
                Err(err) => {
                    tracing::warn!(path = %path.display(), %err, "an orphaned worktree is kept")
                }
            }
        }
        removed
    }

    /// Removes what each runtime runs for this installation whose session is not stored
    /// (on every engine that answers); how many. Only the sessions named are looked up.
    pub(super) async fn remove_orphaned_runtime_resources(&self) -> usize {
        let mut removed = 0;
        for runtime in self.config.runtimes.all() {
            let scan = runtime.orphans().await;
            for place in &scan.unreachable {
                tracing::warn!(runtime = runtime.name(), %place, "not searched for orphans");
            }
            let named = scan.found.iter().filter_map(|orphan| orphan.session_id.clone()).collect();
            let known = match self.config.store.existing_sessions(named).await {
                Ok(known) => known,
                Err(err) => {
                    tracing::warn!(%err, "cannot check for orphans");
                    continue;
                }
            };
            let unknown = |orphan: &&crate::runtime::Orphan| {
                !orphan.session_id.as_ref().is_some_and(|id| known.contains(id))
            };
            for orphan in scan.found.iter().filter(unknown) {
                match runtime.remove_orphan(orphan).await {
                    Ok(()) => removed += 1,
                    Err(err) => {
                        tracing::warn!(location = %orphan.location, %err, "cannot remove an orphan")
                    }
                }
            }
        }
        removed
    }

    /// A session recovery can leave as it is: standalone, waiting for input, its execution
    /// over, no turn running or request pending, and no live agentctl that is its recorded
    /// one or serves its state dir.
    pub(super) fn at_rest(
        &self,
        candidate: &crate::store::RecoveryCandidate,
        sidecar_pids: &std::collections::HashSet<u32>,
        sidecar_dirs: &std::collections::HashSet<std::path::PathBuf>,
    ) -> bool {
        let execution = &candidate.execution;
        let recorded_alive = execution
            .agentctl_pid
            .and_then(|pid| u32::try_from(pid).ok())
            .is_some_and(|pid| sidecar_pids.contains(&pid));
        let local = self.config.runtimes.local().map(|runtime| runtime.name());
        local == Some(candidate.runtime.as_str())
            && local == Some(execution.runtime.as_str())
            && candidate.state == SessionState::WaitingForInput
            && execution.status.is_over()
            && !candidate.open_work
            && !recorded_alive
            && (sidecar_dirs.is_empty()
                || !sidecar_dirs.contains(&crate::runtime::execution_state_dir(
                    execution,
                    self.config.home.session(&execution.session_id).agentctl(),
                )))
    }

    /// Starts an actor that re-attaches (to a live sidecar, or to a dead one's spool) at
    /// recovery; returns a watch on its view.
    pub(super) async fn start_reattaching(
        &self,
        row: &SessionRow,
        profile: Arc<Profile>,
        plan: ReattachPlan,
    ) -> Result<tokio::sync::watch::Receiver<SessionView>, ServiceError> {
        let handle = session::start_session(
            self.context(row)?,
            row.clone(),
            profile,
            self.event_log(&row.id).await?,
            Start::Reattach(Box::new(plan)),
        )?;
        let view = handle.watch();
        self.sessions().insert(row.id.clone(), handle);
        Ok(view)
    }

    /// Finishes the teardown of a session stopped (or cancelled) by a stop that a kill cut
    /// short: when its sidecar's spool holds what was never recorded, an actor replays it
    /// (its turn ends there; returns its view); else its open turns and questions end now.
    pub(super) async fn finish_teardown(
        &self,
        row: SessionRow,
    ) -> Result<Option<Reattaching>, ServiceError> {
        let store = &self.config.store;
        let reason = "the session was stopped";
        let execution = store.get_execution(row.id.clone()).await?;
        let leftovers = match execution {
            Some(execution) if self.unrecorded_leftovers(&execution).await => Some(execution),
            _ => None,
        };
        if let Some(execution) = leftovers {
            let open_turns =
                store.open_turns(row.id.clone(), execution.execution_id.clone()).await?;
            let questions = store.list_pending(row.id.clone()).await?.len();
            replaying_line(&row.id, open_turns.len(), questions);
            let addr = execution.endpoint();
            let plan = ReattachPlan { execution, addr, open_turns, gone: true };
            let view =
                self.start_reattaching(&row, Supervisor::pinned_profile(&row)?, plan).await?;
            return Ok(Some(Reattaching { session_id: row.id, view, replay: true }));
        }
        self.void_open_work(&row.id, reason, Vec::new()).await?;
        Ok(None)
    }

    /// Ends what a session without an agent left open, as recovery finds it: each running
    /// turn `interrupted` with `reason`, each question void, published (with `then` after
    /// them) before the store changes. Returns how many turns and questions there were.
    pub(super) async fn void_open_work(
        &self,
        session_id: &SessionId,
        reason: &str,
        then: Vec<SessionEventKind>,
    ) -> Result<(usize, usize), ServiceError> {
        let record = self.record(session_id).await?;
        record.void_open_work(reason, then, Mark::default()).await.map_err(ServiceError::from)
    }

    /// Whether a dead execution's spool holds events that are not in the session's
    /// history or event log (past what each had recorded of that execution, and past
    /// what was acknowledged).
    pub(super) async fn unrecorded_leftovers(
        &self,
        execution: &crate::store::ExecutionRow,
    ) -> bool {
        // Before its ACP session opened an execution holds nothing of the conversation
        // (a load's replay is acknowledged before the open is recorded): nothing to record.
        if execution.acp_session_id.is_none() {
            return false;
        }
        let paths = self.config.home.session(&execution.session_id);
        let last = session::leftover_seq(
            &crate::runtime::execution_state_dir(execution, paths.agentctl()),
            execution,
        );
        if last <= execution.acked_seq.max(0) as u64 {
            return false;
        }
        let generation = execution.generation;
        let history_mark = crate::history::History::open(&paths.history())
            .map_or(0, |history| history.mark_for(generation));
        let events_mark = self
            .record(&execution.session_id)
            .await
            .map_or(0, |record| record.events_mark(generation));
        last > history_mark.min(events_mark)
    }

    /// Brings back the agent of each session at rest whose queue holds prompts and runs
    /// (answered `queued` while the agent woke, and the restart came first): its actor
    /// runs them once the agent is open. One that cannot launch here (its workspace gone,
    /// its runtime missing) has its queue halted, saying why.
    async fn wake_for_queued_prompts(&self) -> Result<(), ServiceError> {
        for session_id in self.config.store.sessions_with_queued_prompts().await? {
            if self.handle(&session_id).is_some_and(|handle| handle.is_live()) {
                continue;
            }
            let row = self.session_row(&session_id).await?;
            if let Err(err) = self.check_launchable(&row).await {
                self.halt_queue_without_actor(
                    &session_id,
                    format!("its agent cannot start: {err}"),
                )
                .await?;
                continue;
            }
            let handle = self.actor(&row).await?;
            tracing::info!(session = %session_id, "recovery: starting its agent for its queued prompts");
            tokio::spawn(async move {
                if let Err(err) = handle.resume().await {
                    tracing::info!(session = %session_id, %err, "recovery: its agent did not start for its queued prompts");
                }
            });
        }
        Ok(())
    }

    /// Halts the queue of a session that has no actor (recovery), saying why: published,
    /// then stored (a kill in between says it again at the next start).
    pub(super) async fn halt_queue_without_actor(
        &self,
        session_id: &SessionId,
        reason: String,
    ) -> Result<(), ServiceError> {
        let store = &self.config.store;
        let mut queue = store.prompt_queue(session_id.clone()).await?;
        queue.halted = Some(reason.clone());
        let message = format!(
            "the prompt queue halts: {reason}; resume it with task.session.queue.resume (CLI: queue resume)"
        );
        self.publish_recovery(
            session_id,
            vec![SessionEventKind::Notice { message }, SessionEventKind::Queue { queue }],
        )
        .await?;
        Ok(store.halt_queue(session_id.clone(), Some(reason)).await?)
    }

    /// Changes the state of a session that has no actor, published before the row changes.
    pub(super) async fn set_state_without_actor(
        &self,
        session_id: &SessionId,
        state: SessionState,
        error: Option<String>,
    ) -> Result<(), ServiceError> {
        let record = self.record(session_id).await?;
        Ok(record.set_state(state, error, None, Mark::default(), None).await?)
    }

    /// Publishes what recovery found on a session's stream, in one append. The events
    /// carry no agentctl mark: no agent event caused them.
    pub(super) async fn publish_recovery(
        &self,
        session_id: &SessionId,
        kinds: Vec<SessionEventKind>,
    ) -> Result<(), ServiceError> {
        self.record(session_id)
            .await?
            .publish(kinds, Mark::default())
            .map_err(|err| ServiceError::Internal(format!("publishing recovery events: {err}")))
    }

    /// Publishes `kind` on the stream of a session whose actor does not run (the caller
    /// holds the start lock, so none starts meanwhile). A failure is said, not returned:
    /// what it announces is made already.
    pub(super) async fn publish_at_rest(&self, session_id: &SessionId, kind: SessionEventKind) {
        let published = async {
            self.record(session_id)
                .await?
                .publish(vec![kind], Mark::default())
                .map_err(|err| ServiceError::Storage(err.to_string()))
        };
        if let Err(err) = published.await {
            tracing::warn!(session = %session_id, %err, "a change is made but cannot be announced");
        }
    }

    /// Publishes `kind` on the session's stream: through its actor when one runs (after
    /// what it published), else at rest under the start lock — never holding the lock
    /// while an actor is awaited (an actor ending, or one started meanwhile, is tried
    /// again).
    pub(super) async fn announce(&self, session_id: &SessionId, kind: SessionEventKind) {
        let live =
            |this: &Self| this.handle(session_id).filter(crate::session::SessionHandle::is_live);
        for _ in 0..ANNOUNCE_TRIES {
            if let Some(handle) = live(self) {
                match handle.announce(kind.clone()).await {
                    Ok(()) => return,
                    // It ended before taking it: at rest, or its successor.
                    Err(_) => continue,
                }
            }
            let guard = self.start_lock.lock().await;
            if live(self).is_some() {
                drop(guard);
                continue;
            }
            return self.publish_at_rest(session_id, kind).await;
        }
        tracing::warn!(session = %session_id, "a change is made but cannot be announced: its actor kept ending and starting");
    }

    /// The record of a session (its event log and open-work rows), for recovery and the
    /// paths that change a session without its actor.
    pub(super) async fn record(
        &self,
        session_id: &SessionId,
    ) -> Result<SessionRecord, ServiceError> {
        let log = self.event_log(session_id).await?;
        Ok(SessionRecord::new(session_id.clone(), self.config.store.clone(), log))
    }

    /// Recovers one session: returns what is being re-attached (or replayed).
    pub(super) async fn recover_one(
        &self,
        row: SessionRow,
        execution: crate::store::ExecutionRow,
        liveness: Liveness,
        summary: &mut RecoverySummary,
    ) -> Result<Option<Reattaching>, ServiceError> {
        // A runtime this daemon does not have: reported, and the session skipped.
        self.runtime(&execution.runtime)?;
        let recorded_live = !execution.status.is_over();
        // A session caught mid-launch or mid-handshake cannot pick up where it was (the
        // handshake's requests are gone with the old process): it is fenced and resumed
        // later like a dead one. An execution recorded `running` finished its handshake
        // (that is recorded when the ACP session opens, before the session's state): caught
        // between the two, it is re-attached and its state completed, not killed — its
        // `WAITING_FOR_INPUT` may already have been published.
        let handshake_done = execution.status == ExecutionStatus::Running;
        let mut unreachable = None;
        let alive = recorded_live
            && (row.state != SessionState::Starting || handshake_done)
            && match &liveness {
                Liveness::Alive => true,
                Liveness::Dead => false,
                Liveness::Stale(why) => {
                    // Fenced below like a dead one; the session resumes afresh.
                    tracing::warn!(session = %row.id, %why, "a container of a stale generation is not re-attached");
                    false
                }
                Liveness::Unreachable(why) => {
                    unreachable = Some(why.clone());
                    false
                }
            };
        // Dead (or not to be trusted): make sure. Where it ran cannot be reached (an engine
        // is down): it cannot be fenced now — the next launch fences it on that engine
        // before anything starts — and the session waits, `runtime_unavailable`, until the
        // engine is back.
        if !alive && unreachable.is_none() {
            self.fence(&row, Some(execution.clone())).await?;
        }
        // A dead sidecar whose spool holds what was never recorded (the supervisor died
        // with it, or while reading it): the spool is replayed like a live re-attach's,
        // then the execution is lost — whatever reached a spool is recorded once.
        let gone = !alive && unreachable.is_none() && self.unrecorded_leftovers(&execution).await;
        if alive || gone {
            // Where the runtime said agentctl listens, as stored.
            let addr = execution.endpoint();
            let open_turns = self
                .config
                .store
                .open_turns(row.id.clone(), execution.execution_id.clone())
                .await?;
            let questions = self.config.store.list_pending(row.id.clone()).await?.len();
            // A dead sidecar's questions are void once its spool is replayed, not restored.
            match gone {
                true => replaying_line(&row.id, open_turns.len(), questions),
                false => summary.approvals_restored += questions,
            }
            let profile = Supervisor::pinned_profile(&row)?;
            let plan = ReattachPlan { execution, addr, open_turns, gone };
            let view = self.start_reattaching(&row, profile, plan).await?;
            return Ok(Some(Reattaching { session_id: row.id, view, replay: gone }));
        }
        // Then what it left behind is marked.
        let store = &self.config.store;
        // Subscribers that only listen learn it from the stream: each interrupted turn ends,
        // each question is void, and the session waits for input with the reason. Published
        // before the store changes (a kill in between publishes again at the next start,
        // rather than never).
        let unreachable_reason = unreachable
            .map(|why| format!("{why}; the session resumes when its runtime is reachable again"));
        let reason = unreachable_reason.as_deref().unwrap_or(session::STOPPED_WHILE_DOWN);
        let unstuck = matches!(row.state, SessionState::Starting | SessionState::Running);
        let (interrupted, cancelled) = self.void_open_work(&row.id, reason, Vec::new()).await?;
        // Prompts queued behind an interrupted turn were written for it to succeed: the
        // queue halts, as it does when a live turn is interrupted.
        let queue = store.prompt_queue(row.id.clone()).await?;
        if interrupted > 0 && !queue.prompts.is_empty() && queue.halted.is_none() {
            let why = format!("the turn before them was interrupted ({reason})");
            self.halt_queue_without_actor(&row.id, why).await?;
        }
        summary.interrupted += interrupted;
        summary.approvals_cancelled += cancelled;
        let _ = store
            .set_execution_status(row.id.clone(), execution.execution_id, ExecutionStatus::Dead)
            .await;
        summary.dead += 1;
        if unstuck {
            self.set_state_without_actor(
                &row.id,
                SessionState::WaitingForInput,
                Some(reason.into()),
            )
            .await?;
        }
        // A crash found at recovery: the error, and a snapshot (taken before serving, while
        // no actor writes this session's event log).
        store.log_error(row.id.clone(), reason.into()).await?;
        let trigger = SnapshotTrigger::Crash;
        if let Some(snapshot_id) = self.snapshot_now(&row.id, trigger, Some(reason.into())).await {
            self.publish_recovery(
                &row.id,
                vec![SessionEventKind::SnapshotTaken { snapshot_id, trigger }],
            )
            .await?;
        }
        let found = if unreachable_reason.is_some() { "cannot be reached" } else { "is dead" };
        let (turns, questions) = (plural(interrupted, "turn"), plural(cancelled, "question"));
        tracing::info!(session = %row.id, "recovery: its sidecar {found}; interrupted {turns} and voided {questions}");
        Ok(None)
    }
}

/// A session recovery handed to an actor, for its line in the log once that settled.
pub(super) struct Reattaching {
    session_id: SessionId,
    view: tokio::sync::watch::Receiver<SessionView>,
    /// Its sidecar is dead: the actor replays what the spool holds (not a re-attach).
    replay: bool,
}

/// The log line of a session whose dead sidecar's spool is replayed: what it left open
/// ends once the spool is recorded.
fn replaying_line(session_id: &SessionId, turns: usize, questions: usize) {
    let (turns, questions) = (plural(turns, "turn"), plural(questions, "question"));
    tracing::info!(session = %session_id, "recovery: its sidecar is dead; replaying its spool, then interrupting {turns} and voiding {questions} (what the spool does not end)");
}

/// "1 turn", "2 questions".
fn plural(count: usize, what: &str) -> String {
    format!("{count} {what}{}", if count == 1 { "" } else { "s" })
}

/// The recovery's outcomes in the metrics (`tether_recovery_total`) and the log.
fn count_recovery(summary: &RecoverySummary, reattaching: &[Reattaching]) {
    let replaying = reattaching.iter().filter(|reattached| reattached.replay).count();
    let reattaching = reattaching.len() - replaying;
    let counted = [
        ("reattaching", reattaching),
        ("replaying", replaying),
        ("at_rest", summary.at_rest),
        ("dead", summary.dead),
        ("interrupted", summary.interrupted),
        ("approvals_restored", summary.approvals_restored),
        ("approvals_cancelled", summary.approvals_cancelled),
        ("orphans_removed", summary.orphans_removed),
        ("skipped", summary.skipped),
    ];
    for (outcome, count) in counted {
        let family = &crate::metrics::get().recovery;
        family.get_or_create(&crate::metrics::label("outcome", outcome)).inc_by(count as u64);
    }
    tracing::info!(
        reattaching,
        replaying,
        at_rest = summary.at_rest,
        dead = summary.dead,
        interrupted = summary.interrupted,
        approvals_restored = summary.approvals_restored,
        approvals_cancelled = summary.approvals_cancelled,
        orphans_removed = summary.orphans_removed,
        skipped = summary.skipped,
        "recovery: serving; re-attaching in the background"
    );
}
