//! A session moved to another runtime (`task.session.move`) while no agent of it runs:
//! its sidecar fenced on the runtime it ran on and what that runtime kept for it there
//! removed (a container, state volumes), then its runtime and labels stored with the
//! `moved` timeline row — and its resume token dropped, unless its agent's own state
//! travels. Carried out by the session's actor when one lives (it owns the session then),
//! else by the service under its start lock: one function, so both do the same.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agents::profile::{Profile, SandboxSettings as Sandbox};

use crate::checkpoint::Checkpoints;
use crate::runtime::{FenceTarget, Runtime};
use crate::store::{ExecutionRow, Relocation, SessionRow, Store};

use super::SessionError;

/// Where a session goes.
#[derive(Clone)]
pub struct Destination {
    /// The runtime.
    pub runtime: Arc<dyn Runtime>,
    /// Its placement labels there.
    pub labels: BTreeMap<String, String>,
}

/// What a move to another runtime did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relocated {
    /// Where the session ran, in words (`standalone`, `docker/<engine>`).
    pub from: String,
    /// Whether its resume token was kept (its agent resumes natively there).
    pub native: bool,
}

/// Where an execution ran, in words: the runtime, and its place when it has places.
pub fn place_of(runtime: &dyn Runtime, handle: Option<&serde_json::Value>) -> String {
    match runtime.placement(handle) {
        Some(place) => format!("{}/{place}", runtime.name()),
        None => runtime.name().to_owned(),
    }
}

/// Whether an agent's state dirs are the session's own on a runtime (bound from the
/// session's agent-state directory): in a container on an engine that does not keep them
/// in volumes, or a local agent in a sandbox. A local agent run unconfined keeps its state
/// in the home it shares with every other session.
fn state_is_the_sessions(
    runtime: &dyn Runtime,
    handle: Option<&serde_json::Value>,
    sandbox: &Sandbox,
) -> bool {
    (runtime.agent_home().is_some() || !sandbox.is_host()) && !runtime.state_stays(handle)
}

/// Whether the agent's own session can be loaded after the move: it keeps state dirs, and
/// they are the session's own on both sides (where it goes, placement may still pick an
/// engine that keeps them in volumes; a load that fails falls back to injection).
pub fn state_travels(
    from: &dyn Runtime,
    execution: Option<&ExecutionRow>,
    to: &dyn Runtime,
    profile: &Profile,
    sandbox: &Sandbox,
) -> bool {
    let handle = execution.and_then(|execution| execution.runtime_handle.as_ref());
    !profile.session.agent_state_dirs.is_empty()
        && state_is_the_sessions(from, handle, sandbox)
        && state_is_the_sessions(to, None, sandbox)
}

/// Refuses a move off a runtime that keeps the session's workspace where it runs (a
/// copied workspace) to another runtime, where the supervisor's directory would be used.
pub fn may_leave(
    from: &dyn Runtime,
    handle: Option<&serde_json::Value>,
    to: &dyn Runtime,
    row: &SessionRow,
) -> Result<(), SessionError> {
    if !from.copies_workspace(handle) || from.name() == to.name() {
        return Ok(());
    }
    Err(SessionError::InvalidState(format!(
        "session {}'s workspace lives on {} (workspace = \"copy\") and in its checkpoints, not in {}: it moves only between engines that copy workspaces (`supervisor checkpoints {} --restore-into DIR` writes out its files)",
        row.id,
        place_of(from, handle),
        row.workspace_path,
        row.id
    )))
}

/// Moves a session whose agent does not run (see the module doc), once its checkpoint in
/// flight is taken (and a copied workspace saved). `session_dir` is the session's
/// directory.
pub async fn relocate(
    (store, checkpoints): (&Store, &Checkpoints),
    runtime: &Arc<dyn Runtime>,
    to: &Destination,
    row: &SessionRow,
    (profile, sandbox): (&Profile, &Sandbox),
    session_dir: &Path,
) -> Result<Relocated, SessionError> {
    let from = &**runtime;
    drop(checkpoints.hold(&row.id).await);
    let execution = store.get_execution(row.id.clone()).await?;
    let handle = execution.as_ref().and_then(|execution| execution.runtime_handle.clone());
    may_leave(from, handle.as_ref(), &*to.runtime, row)?;
    let workspace = Path::new(&row.workspace_path);
    let ids = (&row.id, session_dir);
    if let Err(err) =
        checkpoints.save_copied(store, ids, workspace, (runtime, handle.as_ref())).await
    {
        return Err(SessionError::RuntimeUnavailable(format!(
            "the workspace on {} could not be checkpointed ({err}): nothing of it is removed there, and the session stays",
            place_of(from, handle.as_ref())
        )));
    }
    let agentctl_dir = crate::home::SessionPaths::new(session_dir.to_owned()).agentctl();
    let state_dir = match &execution {
        Some(execution) => crate::runtime::execution_state_dir(execution, agentctl_dir),
        None => agentctl_dir,
    };
    let native = state_travels(from, execution.as_ref(), &*to.runtime, profile, sandbox);
    let target = FenceTarget {
        session_id: row.id.clone(),
        state_dir,
        execution: execution.clone(),
        grace: Duration::ZERO,
    };
    let unavailable = |err: crate::runtime::RuntimeError| {
        SessionError::RuntimeUnavailable(format!(
            "cannot clear the session off runtime {}: {err}; it stays there",
            from.name()
        ))
    };
    from.fence(&target).await.map_err(unavailable)?;
    if let Some(handle) = &handle {
        from.remove(&row.id, Some(handle)).await.map_err(unavailable)?;
    }
    // A kill here leaves the session where it was (paused, nothing of it running): its
    // next resume starts it there, and the move can be asked again.
    agentctl::fault::point("relocate.cleared");
    let relocated = Relocated { from: place_of(from, handle.as_ref()), native };
    let relocation = Relocation {
        session_id: row.id.clone(),
        runtime: to.runtime.name().to_owned(),
        labels: to.labels.clone(),
        drop_token_of: execution
            .filter(|execution| !native && execution.resume_token.is_some())
            .map(|execution| execution.execution_id),
        from: relocated.from.clone(),
    };
    store.relocate_session(relocation).await?;
    Ok(relocated)
}
