//! `engines.list`, `engines.drain`, `engines.undrain`, and a session's move off an engine:
//! its intent stored first (`session_moves`), its agent paused at the turn boundary (the
//! pause's checkpoint taken), what the session kept on the engine removed, its resume
//! token dropped when the agent's own state stays behind (volumes), then — if its agent
//! ran — resumed where placement puts it now (never on an engine out of service), and the
//! move's timeline row written as the intent is forgotten. A restart carries on every
//! move under way and every drain not finished.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use protocol::api::{EngineInfo, EngineList, EngineState, MoveReason, SessionState};

use super::{ServiceError, Supervisor};
use crate::ids::SessionId;
use crate::runtime::Runtime;
use crate::store::{EngineRow, MoveRow};

/// How long a drain lets a running turn take to end before it is cancelled, by default.
pub(crate) const DEFAULT_DRAIN_FORCE_MS: u64 = 30_000;
/// How much longer than its `force_after` a move waits for its pause before it gives up.
const PAUSE_SLACK: Duration = Duration::from_secs(60);

impl Supervisor {
    /// The Docker runtime, whose engines these are.
    pub(super) fn engines_runtime(&self) -> Result<Arc<dyn Runtime>, ServiceError> {
        self.config.runtimes.get("docker").ok_or_else(|| {
            ServiceError::InvalidState("this daemon has no Docker runtime, so no engines".into())
        })
    }

    /// The sessions not ended whose newest execution ran on each engine.
    pub(super) async fn sessions_by_engine(
        &self,
        runtime: &dyn Runtime,
    ) -> Result<Vec<(String, SessionId, Option<serde_json::Value>)>, ServiceError> {
        let placed = self.config.store.placed_sessions(runtime.name().to_owned()).await?;
        Ok(placed
            .into_iter()
            .filter_map(|(session, handle)| {
                let engine = runtime.placement(handle.as_ref())?;
                Some((engine, session, handle))
            })
            .collect())
    }

    /// `engines.list`.
    pub async fn engines(&self) -> Result<EngineList, ServiceError> {
        let runtime = self.engines_runtime()?;
        let places = runtime.places().await;
        let states = self.config.store.engine_states().await?;
        let placed = self.sessions_by_engine(&*runtime).await?;
        let engines: Vec<EngineInfo> = places
            .into_iter()
            .map(|(name, unreachable)| {
                let row = states.iter().find(|row| row.name == name);
                let state = match (row, &unreachable) {
                    (Some(row), _) => row.state,
                    (None, Some(_)) => EngineState::Unreachable,
                    (None, None) => EngineState::Serving,
                };
                let sessions = placed
                    .iter()
                    .filter(|(engine, ..)| *engine == name)
                    .map(|(_, session, _)| session.to_string())
                    .collect();
                EngineInfo {
                    since: row.map(|row| row.since),
                    name,
                    state,
                    reason: unreachable,
                    sessions,
                }
            })
            .collect();
        let metrics = crate::metrics::get();
        metrics.engine_state.clear();
        for engine in &engines {
            let labels =
                vec![("engine", engine.name.clone()), ("state", engine.state.as_str().to_owned())];
            metrics.engine_state.get_or_create(&labels).set(1);
        }
        Ok(EngineList { engines })
    }

    async fn engine_info(&self, name: &str) -> Result<EngineInfo, ServiceError> {
        let listed = self.engines().await?;
        listed.engines.into_iter().find(|engine| engine.name == name).ok_or_else(|| {
            ServiceError::NotFound(format!("no Docker engine named {name:?} in config.toml"))
        })
    }

    /// Tells the runtime which engines are out of service, as the store says.
    pub(super) async fn apply_engine_states(&self) -> Result<Vec<EngineRow>, ServiceError> {
        let states = self.config.store.engine_states().await?;
        if let Ok(runtime) = self.engines_runtime() {
            runtime.set_closed(states.iter().map(|row| row.name.clone()).collect::<BTreeSet<_>>());
        }
        Ok(states)
    }

    /// `engines.drain`: stored (and the runtime told) before the answer; the sessions move
    /// in the background.
    pub async fn drain(
        self: &Arc<Self>,
        name: String,
        force_after_ms: Option<u64>,
    ) -> Result<EngineInfo, ServiceError> {
        self.engine_info(&name).await?;
        let force_after_ms = force_after_ms.unwrap_or(DEFAULT_DRAIN_FORCE_MS);
        let state = Some((EngineState::Draining, force_after_ms));
        self.config.store.set_engine_state(name.clone(), state).await?;
        self.apply_engine_states().await?;
        tracing::info!(engine = %name, "draining: its sessions move off it");
        tokio::spawn(Arc::clone(self).run_drain(name.clone(), force_after_ms));
        self.engine_info(&name).await
    }

    /// `engines.undrain`.
    pub async fn undrain(&self, name: String) -> Result<EngineInfo, ServiceError> {
        self.engine_info(&name).await?;
        self.config.store.set_engine_state(name.clone(), None).await?;
        self.apply_engine_states().await?;
        tracing::info!(engine = %name, "back in service");
        self.engine_info(&name).await
    }

    /// At start: the runtime told which engines are out of service, the moves a kill cut
    /// short carried on, and the drains not finished taken up again.
    pub async fn resume_drains(self: &Arc<Self>) -> Result<(), ServiceError> {
        let states = self.apply_engine_states().await?;
        let draining = |engine: &str| {
            states.iter().any(|row| row.name == engine && row.state == EngineState::Draining)
        };
        // A draining engine's moves are carried on by its drain, below.
        for row in self.config.store.moves().await?.into_iter().filter(|row| !draining(&row.from)) {
            let supervisor = Arc::clone(self);
            let force = states
                .iter()
                .find(|state| state.name == row.from)
                .map_or(DEFAULT_DRAIN_FORCE_MS, |state| state.force_after_ms);
            tokio::spawn(async move { supervisor.carry_out_move(row, force).await });
        }
        for row in states.into_iter().filter(|row| row.state == EngineState::Draining) {
            tokio::spawn(Arc::clone(self).run_drain(row.name, row.force_after_ms));
        }
        Ok(())
    }

    /// Moves every session off `name`, then marks it drained (unless it was returned to
    /// service meanwhile).
    async fn run_drain(self: Arc<Self>, name: String, force_after_ms: u64) {
        let Ok(runtime) = self.engines_runtime() else { return };
        let placed = match self.sessions_by_engine(&*runtime).await {
            Ok(placed) => placed,
            Err(err) => {
                tracing::warn!(engine = %name, %err, "cannot list the engine's sessions to drain it");
                return;
            }
        };
        let moves =
            placed.into_iter().filter(|(engine, ..)| *engine == name).map(|(_, session, _)| {
                let row = MoveRow {
                    resume: self.agent_runs(&session),
                    session_id: session,
                    from: name.clone(),
                    reason: MoveReason::Drain,
                };
                let supervisor = Arc::clone(&self);
                async move {
                    match supervisor.config.store.begin_move(row.clone()).await {
                        Ok(row) => supervisor.carry_out_move(row, force_after_ms).await,
                        Err(err) => {
                            tracing::warn!(session = %row.session_id, %err, "cannot start the move")
                        }
                    }
                }
            });
        futures_util::future::join_all(moves).await;
        let still = self.config.store.engine_states().await.unwrap_or_default();
        if still.iter().any(|row| row.name == name && row.state == EngineState::Draining) {
            let drained = Some((EngineState::Drained, force_after_ms));
            if let Err(err) = self.config.store.set_engine_state(name.clone(), drained).await {
                tracing::warn!(engine = %name, %err, "cannot record the engine drained");
            } else {
                tracing::info!("engine {name} drained");
            }
        }
    }

    /// Whether the session's agent runs now (a live actor with its agent up).
    pub(super) fn agent_runs(&self, session: &SessionId) -> bool {
        self.handle(session).is_some_and(|handle| {
            let view = handle.view();
            handle.is_live() && (view.agent_running || view.is_starting())
        })
    }

    /// Carries a move out from wherever it stands (see the module doc); failures are
    /// logged and leave the move stored for the next start.
    pub(super) async fn carry_out_move(&self, row: MoveRow, force_after_ms: u64) {
        let session = row.session_id.clone();
        let (reason, from) = (row.reason, row.from.clone());
        match self.move_session(row, force_after_ms).await {
            Ok(to) => {
                crate::metrics::get()
                    .moves
                    .get_or_create(&crate::metrics::label("reason", reason.as_str()))
                    .inc();
                let to = to.unwrap_or_else(|| "its next resume's placement".into());
                tracing::info!("session {session} moved off engine {from} to {to}");
            }
            Err(err) => tracing::warn!(%session, %err, "the move did not finish"),
        }
    }

    async fn move_session(
        &self,
        row: MoveRow,
        force_after_ms: u64,
    ) -> Result<Option<String>, ServiceError> {
        let runtime = self.engines_runtime()?;
        let session = row.session_id.clone();
        let recorded = self.config.store.get_execution(session.clone()).await?;
        let execution_id = recorded.as_ref().map(|recorded| recorded.execution_id.clone());
        let handle = recorded.and_then(|recorded| recorded.runtime_handle);
        if runtime.placement(handle.as_ref()).as_deref() == Some(row.from.as_str()) {
            if self.agent_runs(&session) {
                let reason = format!("moving off engine {}", row.from);
                self.pause_for_move(&session, reason, force_after_ms).await?;
            }
            // The pause's checkpoint is the workspace the session moves with (fetched from
            // the engine when it keeps it): taken before anything there is removed.
            drop(self.config.checkpoints.hold(&session).await);
            if row.reason != MoveReason::Failover {
                self.save_copied(&session, &runtime, handle.as_ref()).await?;
            }
            agentctl::fault::point("move.paused");
            if let Some(execution_id) = execution_id
                && runtime.state_stays(handle.as_ref())
            {
                self.config.store.set_resume_token(session.clone(), execution_id, None).await?;
            }
            if let Some(handle) = &handle {
                match runtime.remove_from(&session, handle).await {
                    Ok(_) => {}
                    // A silent engine is cleared when it answers again.
                    Err(err) if row.reason == MoveReason::Failover => {
                        tracing::debug!(%session, %err, "left on the failed engine until it is back");
                    }
                    Err(err) => return Err(ServiceError::RuntimeUnavailable(err.to_string())),
                }
            }
            agentctl::fault::point("move.cleared");
        }
        let to = if row.resume {
            self.resume(session.clone(), false).await?;
            let now = self.config.store.get_execution(session.clone()).await?;
            runtime.placement(now.and_then(|now| now.runtime_handle).as_ref())
        } else {
            None
        };
        self.config.store.finish_move(row, to.clone()).await?;
        Ok(to)
    }

    /// A workspace the engine keeps (copied) checkpointed from there before the session's
    /// volumes there go; refused (nothing removed, the move left to its next try) when it
    /// cannot be.
    async fn save_copied(
        &self,
        session: &SessionId,
        runtime: &Arc<dyn Runtime>,
        handle: Option<&serde_json::Value>,
    ) -> Result<(), ServiceError> {
        let row = self.session_row(session).await?;
        let dir = self.config.home.session(session).dir().to_owned();
        let workspace = std::path::Path::new(&row.workspace_path);
        let saved = self
            .config
            .checkpoints
            .save_copied(&self.config.store, (session, &dir), workspace, (runtime, handle))
            .await;
        saved.map_err(|err| {
            ServiceError::RuntimeUnavailable(format!(
                "the workspace of session {session} on its engine could not be checkpointed ({err}): nothing of it is removed there"
            ))
        })
    }

    /// Pauses a session for its move and waits until it is paused (the running turn ends
    /// first, or is cancelled after `force_after_ms`).
    pub(super) async fn pause_for_move(
        &self,
        session: &SessionId,
        reason: String,
        force_after_ms: u64,
    ) -> Result<(), ServiceError> {
        self.pause(session.clone(), Some(reason.clone()), Some(force_after_ms)).await?;
        let Some(handle) = self.handle(session) else { return Ok(()) };
        let mut view = handle.watch();
        let bound = Duration::from_millis(force_after_ms) + PAUSE_SLACK;
        let paused = view.wait_for(|view| {
            view.state == SessionState::Paused || view.state.is_at_rest() || !view.agent_running
        });
        match tokio::time::timeout(bound, paused).await {
            Ok(_) => Ok(()),
            Err(_) => Err(ServiceError::InvalidState(format!(
                "session {session} did not pause within {bound:?} ({reason})"
            ))),
        }
    }
}
