//! Failover (`[docker] failover_after_secs`): an engine that has not answered that long
//! is taken out of service and its sessions are moved to the others as a drain moves them
//! (see `engines.rs`), from where they stand: an agent still reachable through its control
//! channel is paused at once (its running turn cancelled and recorded), one already lost
//! is not run again; the next start is placed elsewhere, its history injected where the
//! agent's state stayed on the engine. When the engine answers again, what it still holds
//! for sessions that moved (stale containers, volumes) is removed, never adopted, and it
//! serves again.
//!
//! Whether a host answers cannot be awaited: the engines are asked on an interval (a
//! quarter of the failover time, between 0.5 and 10 s).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use protocol::api::{EngineState, MoveReason, SessionState};
use tokio::time::Instant;

use super::Supervisor;
use crate::store::MoveRow;

impl Supervisor {
    /// `[docker] failover_after_secs`, when set.
    pub fn failover_after(&self) -> Option<Duration> {
        self.config.failover_after
    }

    /// Asks every engine whether it answers, on an interval, for as long as the daemon
    /// runs: one silent for `after` is failed over, one failed over that answers again is
    /// cleared of stale containers and serves again.
    pub async fn watch_engines(self: Arc<Self>, after: Duration) {
        let Ok(runtime) = self.engines_runtime() else { return };
        let every = (after / 4).clamp(Duration::from_millis(500), Duration::from_secs(10));
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut silent_since: HashMap<String, Instant> = HashMap::new();
        loop {
            ticker.tick().await;
            let states = self.config.store.engine_states().await.unwrap_or_default();
            for (name, unreachable) in runtime.places().await {
                let failed = states
                    .iter()
                    .any(|row| row.name == name && row.state == EngineState::Unreachable);
                match unreachable {
                    Some(reason) => {
                        let since = *silent_since.entry(name.clone()).or_insert_with(Instant::now);
                        if !failed && since.elapsed() >= after {
                            self.fail_over(&name, &reason, after).await;
                        }
                    }
                    None => {
                        silent_since.remove(&name);
                        if failed {
                            self.engine_back(&name).await;
                        }
                    }
                }
            }
        }
    }

    /// Takes a silent engine out of service and moves its sessions off it.
    async fn fail_over(self: &Arc<Self>, name: &str, reason: &str, after: Duration) {
        tracing::warn!(
            "engine {name} has not answered for {after:?} ({reason}): its sessions fail over"
        );
        let out = Some((EngineState::Unreachable, 0));
        if let Err(err) = self.config.store.set_engine_state(name.to_owned(), out).await {
            tracing::warn!(engine = %name, %err, "cannot record the failover; tried again later");
            return;
        }
        let _ = self.apply_engine_states().await;
        let Ok(runtime) = self.engines_runtime() else { return };
        let placed = match self.sessions_by_engine(&*runtime).await {
            Ok(placed) => placed,
            Err(err) => {
                tracing::warn!(engine = %name, %err, "cannot list the sessions to fail over");
                return;
            }
        };
        for (_, session, _) in placed.into_iter().filter(|(engine, ..)| engine == name) {
            let state = self.config.store.get_session(session.clone()).await.map(|row| row.state);
            let row = MoveRow {
                session_id: session,
                from: name.to_owned(),
                reason: MoveReason::Failover,
                // A session at rest by choice stays at rest; the others run again.
                resume: !matches!(state, Ok(SessionState::Paused)),
            };
            let supervisor = Arc::clone(self);
            tokio::spawn(async move {
                match supervisor.config.store.begin_move(row.clone()).await {
                    Ok(row) => supervisor.carry_out_move(row, 0).await,
                    Err(err) => tracing::warn!(session = %row.session_id, %err, "cannot fail over"),
                }
            });
        }
    }

    /// A failed-over engine answers again: what it holds for sessions that are elsewhere
    /// now is removed, and it serves again.
    async fn engine_back(&self, name: &str) {
        let Ok(runtime) = self.engines_runtime() else { return };
        let keep: BTreeSet<String> = match self.sessions_by_engine(&*runtime).await {
            Ok(placed) => placed
                .into_iter()
                .filter(|(engine, ..)| engine == name)
                .map(|(_, session, _)| session.to_string())
                .collect(),
            Err(err) => {
                tracing::warn!(engine = %name, %err, "cannot tell which sessions are still there");
                return;
            }
        };
        match runtime.remove_stale(name, &keep).await {
            Ok(removed) => {
                if let Err(err) = self.config.store.set_engine_state(name.to_owned(), None).await {
                    tracing::warn!(engine = %name, %err, "cannot return the engine to service");
                    return;
                }
                let _ = self.apply_engine_states().await;
                tracing::info!(
                    "engine {name} is back: {removed} stale container(s) and volume(s) of sessions that moved off it removed; it serves again"
                );
            }
            Err(err) => {
                tracing::warn!(engine = %name, %err, "cannot clear the engine that came back")
            }
        }
    }
}
