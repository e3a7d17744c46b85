//! Executions: launching one (fence first), re-attaching to one after a restart, and
//! retiring one (stop politely, then fence). Each runs as a task that reports to the
//! actor, so the actor keeps answering commands while a sidecar is slow or stuck.
//!
//! The fencing rule (**one live execution per session**): a new execution is launched only
//! after [`Runtime::fence`] made certain that the previous one — the recorded sidecar, and
//! any the runtime can find for the session — is dead. An execution the actor drops (lost,
//! refused, a failed launch, a failed re-attach) is fenced at once, so nothing runs unowned.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use protocol::control::{StartAgent, Status};

use super::SessionContext;
use crate::runtime::{FenceTarget, LaunchSpec, WorkspaceSeed};
use crate::sidecar::{Control, EventsRx};
use crate::store::{ExecutionRow, ExecutionStatus};

/// What a launch needs, decided by the actor.
#[derive(Debug)]
pub(super) struct LaunchPlan {
    pub(super) spec: LaunchSpec,
    /// The agent's argv, resolved (`[program, args…]`).
    pub(super) argv: Vec<OsString>,
    /// The agent's environment.
    pub(super) env: Vec<(String, String)>,
    /// Who the agent runs as (`process.user`).
    pub(super) user: Option<String>,
    /// The runtime record of the previous execution, if any (fenced first; its resume token
    /// carries over).
    pub(super) previous: Option<ExecutionRow>,
}

/// A launched (or re-attached) execution, connected.
pub(super) struct Connected {
    pub(super) record: ExecutionRow,
    pub(super) calls: Arc<dyn Control>,
    pub(super) events_rx: EventsRx,
    /// agentctl's status at re-attach (`None` for a launch: its agent was just started).
    pub(super) status: Option<Status>,
    /// The sidecar is gone: the events are what its spool held (see `leftovers.rs`).
    pub(super) gone: bool,
    /// A warm agent's (see `pool.rs`).
    pub(super) warm: Option<WarmStart>,
}

/// What a launch from the pool brings beside the sidecar.
pub(super) struct WarmStart {
    /// The agent's `initialize` result.
    pub(super) init: serde_json::Value,
    /// The seq acknowledged.
    pub(super) acked: u64,
    /// The ACP session it was primed with.
    pub(super) primed: Option<String>,
    /// Starts the pool's replacement when dropped (see [`crate::pool::Refill`]).
    pub(super) refill: Option<crate::pool::Refill>,
}

/// Why a launch failed, and whether its own sidecar was fenced.
#[derive(Debug)]
pub(super) struct LaunchFailure {
    pub(super) reason: String,
}

/// The previous execution when it ran on this runtime: one that ran on another was
/// fenced there when the session moved (`task.session.move`), and its record means
/// nothing to this one (neither a process to kill nor a place to go back to).
pub(super) fn ran_here(
    context: &SessionContext,
    previous: Option<&ExecutionRow>,
) -> Option<ExecutionRow> {
    previous.filter(|previous| previous.runtime == context.runtime.name()).cloned()
}

/// Fence, record, launch, connect, start the agent. On any failure after the runtime
/// started agentctl, the new sidecar is fenced before this returns.
pub(super) async fn launch(
    context: SessionContext,
    plan: LaunchPlan,
) -> Result<Connected, LaunchFailure> {
    let fail = |reason: String| LaunchFailure { reason };
    // Confined as its profile asks, or not launched at all.
    let confined = confinement(&context, &plan).await.map_err(fail)?;
    let session_id = plan.spec.session_id.clone();
    let target = FenceTarget {
        session_id: session_id.clone(),
        state_dir: plan.spec.state_dir.clone(),
        execution: ran_here(&context, plan.previous.as_ref()),
        grace: Duration::ZERO,
    };
    context
        .runtime
        .fence(&target)
        .await
        .map_err(|err| fail(format!("the previous execution could not be stopped: {err}")))?;
    // Recorded before it exists, so a restart in the middle knows there may be a sidecar
    // to fence (found through its state dir or container name).
    let record = ExecutionRow {
        runtime: context.runtime.name().into(),
        status: ExecutionStatus::Launching,
        resume_token: plan.previous.as_ref().and_then(|previous| previous.resume_token.clone()),
        // Where the previous execution ran, until the runtime says where this one runs: a
        // launch that fails still resumes where the session's state is.
        runtime_handle: plan.spec.previous.clone(),
        agentctl_token: Some(plan.spec.token.clone()),
        ..ExecutionRow::new(session_id.clone(), plan.spec.execution_id.clone())
    };
    let mut record =
        context.store.put_execution(record).await.map_err(|err| fail(err.to_string()))?;
    let endpoint = context
        .runtime
        .launch(plan.spec.clone())
        .await
        .map_err(|err| fail(format!("runtime {}: {err}", context.runtime.name())))?;
    record.status = ExecutionStatus::Starting;
    record.agentctl_port = match &endpoint.addr {
        agentctl::client::ControlAddr::Tcp(addr) => Some(addr.port().into()),
        agentctl::client::ControlAddr::Unix(_) => None,
    };
    record.agentctl_url = Some(endpoint.addr.to_string());
    record.agentctl_pid = Some(endpoint.ready.pid.into());
    record.agentctl_start_time = Some(endpoint.ready.start_time as i64);
    record.boot_id = Some(endpoint.ready.boot_id.clone());
    record.runtime_handle = Some(endpoint.handle.clone()).filter(|handle| !handle.is_null());
    record.agentctl_cert = endpoint.tls_cert.clone();
    let recorded = context.store.put_execution(record.clone()).await;
    if let Ok(stored) = &recorded {
        record = stored.clone();
    }
    agentctl::fault::point("launch.after_runtime");
    let connected = async {
        recorded.map_err(|err| err.to_string())?;
        let token = plan.spec.token.as_str();
        let (calls, events_rx) = context
            .connector
            .connect(endpoint.addr.clone(), token, endpoint.tls_cert.as_deref(), 0)
            .await
            .map_err(|err| err.to_string())?;
        let (program, args) =
            confined.argv.split_first().ok_or_else(|| "the agent's command is empty".to_owned())?;
        let start = StartAgent {
            command: program.to_string_lossy().into_owned(),
            args: args.iter().map(|arg| arg.to_string_lossy().into_owned()).collect(),
            env: plan.env.iter().chain(&confined.env).cloned().collect(),
            cwd: plan.spec.workspace.clone(),
            extra_roots: Vec::new(),
            user: plan.user.clone().or_else(|| endpoint.agent_user.clone()),
            // In a container the agent's state directories are mounts made as root's, and
            // so is a copied workspace's volume.
            owned_dirs: match context.runtime.agent_home() {
                Some(home) => plan.spec.agent_state_dirs.iter().map(|dir| home.join(dir)).collect(),
                None => Vec::new(),
            }
            .into_iter()
            .chain(endpoint.owned_dirs.iter().cloned())
            .collect(),
            egress: confined.egress.clone(),
            isolate_network: confined.isolate_network,
        };
        calls.start_agent(&start).await.map_err(|e| e.to_string())?;
        Ok::<_, String>((calls, events_rx))
    };
    match connected.await {
        Ok((calls, events_rx)) => {
            Ok(Connected { record, calls, events_rx, status: None, gone: false, warm: None })
        }
        Err(reason) => {
            let target = FenceTarget { execution: Some(record), ..target };
            if let Err(err) = context.runtime.fence(&target).await {
                tracing::error!(session = %session_id, %err, "cannot fence a failed launch");
            }
            Err(fail(reason))
        }
    }
}

/// How the agent of `plan` is confined (see [`crate::sandbox`]); a sandbox's own state
/// dirs are made first (bound into it as its home's).
async fn confinement(
    context: &SessionContext,
    plan: &LaunchPlan,
) -> Result<crate::sandbox::Confinement, String> {
    let spec = &plan.spec;
    if spec.sandbox.is_host() {
        return Ok(crate::sandbox::Confinement { argv: plan.argv.clone(), ..Default::default() });
    }
    let mut env: Vec<(String, String)> = std::env::vars().collect();
    env.extend(plan.env.iter().cloned());
    // The home of the user it runs as (`process.user`), else its environment's.
    let user_home = plan.user.as_deref().and_then(|user| {
        let found = match user.split(':').next().map(str::parse::<u32>) {
            Some(Ok(uid)) => nix::unistd::User::from_uid(uid.into()),
            _ => nix::unistd::User::from_name(user),
        };
        found.ok().flatten().map(|user| user.dir)
    });
    let home = user_home
        .or_else(|| env.iter().rev().find(|(name, _)| name == "HOME").map(|(_, home)| home.into()));
    let agent_state: Vec<(PathBuf, String)> = spec
        .agent_state_dirs
        .iter()
        .map(|dir| (spec.agent_state_root.join(dir), dir.clone()))
        .collect();
    for (dir, _) in &agent_state {
        std::fs::create_dir_all(dir)
            .map_err(|err| format!("cannot make the agent's state dir {}: {err}", dir.display()))?;
    }
    let place = crate::sandbox::Place {
        workspace: spec.workspace.clone(),
        git_dir: spec.git_dir.clone(),
        home,
        agent_state,
        argv: plan.argv.clone(),
        agentctl: context.runtime.agentctl_command().unwrap_or_default(),
        state_dir: spec.state_dir.clone(),
        env,
    };
    let runtime = context.runtime.name();
    crate::sandbox::confine(&spec.sandbox, runtime, &context.resolve, &place)
        .await
        .map_err(|err| err.to_string())
}

/// Takes a warm agent (see `pool.rs`) as the session's new execution: the previous one
/// fenced, the entry marked claimed, the execution recorded (its runtime handle naming the
/// warm sidecar's state dir and cgroup), the session's workspace bound. A failure kills the
/// warm sidecar.
pub(super) async fn claim(
    context: SessionContext,
    plan: LaunchPlan,
    warm: crate::pool::Warm,
) -> Result<Connected, LaunchFailure> {
    let fail = |reason: String| LaunchFailure { reason };
    let session_id = plan.spec.session_id.clone();
    let previous = FenceTarget {
        session_id: session_id.clone(),
        state_dir: plan.spec.state_dir.clone(),
        execution: ran_here(&context, plan.previous.as_ref()),
        grace: Duration::ZERO,
    };
    let crate::pool::Warm {
        id,
        state_dir,
        token,
        endpoint,
        calls,
        events_rx,
        init,
        acked,
        primed,
        refill,
        ..
    } = warm;
    let record = ExecutionRow {
        runtime: context.runtime.name().into(),
        status: ExecutionStatus::Starting,
        resume_token: plan.previous.as_ref().and_then(|previous| previous.resume_token.clone()),
        runtime_handle: Some(crate::runtime::warm_handle(&state_dir, &id)),
        agentctl_token: Some(token),
        agentctl_url: Some(endpoint.addr.to_string()),
        agentctl_pid: Some(endpoint.ready.pid.into()),
        agentctl_start_time: Some(endpoint.ready.start_time as i64),
        boot_id: Some(endpoint.ready.boot_id.clone()),
        acked_seq: i64::try_from(acked).unwrap_or(i64::MAX),
        ..ExecutionRow::new(session_id.clone(), plan.spec.execution_id.clone())
    };
    let claimed = async {
        context
            .runtime
            .fence(&previous)
            .await
            .map_err(|err| format!("the previous execution could not be stopped: {err}"))?;
        crate::home::claim(&state_dir, &session_id)
            .map_err(|err| format!("cannot claim a warm agent: {err}"))?;
        // Binding the workspace gives the agent nothing to act on (no session is open yet):
        // it goes beside the record's write.
        let (record, bound) = tokio::join!(
            context.store.put_execution(record.clone()),
            calls.bind_workspace(&plan.spec.workspace)
        );
        bound.map_err(|err| err.to_string())?;
        record.map_err(|err| err.to_string())
    };
    match claimed.await {
        Ok(record) => Ok(Connected {
            record,
            calls,
            events_rx,
            status: None,
            gone: false,
            warm: Some(WarmStart { init, acked, primed, refill }),
        }),
        Err(reason) => {
            drop(calls);
            let target = FenceTarget { execution: Some(record), state_dir, ..previous };
            if let Err(err) = context.runtime.fence(&target).await {
                tracing::error!(session = %session_id, %err, "cannot fence a warm agent it could not claim");
            }
            Err(fail(reason))
        }
    }
}

/// Connects to a live sidecar found at startup and subscribes after `acked_seq`.
pub(super) async fn reattach(
    context: SessionContext,
    addr: agentctl::client::ControlAddr,
    record: ExecutionRow,
) -> Result<Connected, String> {
    let token = record.agentctl_token.clone().unwrap_or_default();
    let after = record.acked_seq.max(0) as u64;
    let cert = record.agentctl_cert.as_deref();
    let (calls, events_rx) = context
        .connector
        .connect(addr, &token, cert, after)
        .await
        .map_err(|err| err.to_string())?;
    let status = calls.status().await.map_err(|err| err.to_string())?;
    Ok(Connected { record, calls, events_rx, status: Some(status), gone: false, warm: None })
}

/// "Re-attaches" to a sidecar that died: its events are what its spool holds after
/// `acked_seq` (see `leftovers.rs`), its calls those of a dead sidecar.
pub(super) fn reattach_gone(context: &SessionContext, record: ExecutionRow) -> Connected {
    let state_dir = context.state_dir_of(&record);
    let dir = super::leftovers::spool_dir(&state_dir);
    let acked = record.acked_seq.max(0) as u64;
    let status = super::leftovers::status(&dir, acked);
    let events_rx = if super::leftovers::spool_is_of(&state_dir, &record) {
        super::leftovers::read(dir, acked)
    } else {
        // Another execution's spool (this one's agentctl never started): nothing of it.
        tokio::sync::mpsc::channel(1).1
    };
    let calls: Arc<dyn Control> = Arc::new(super::leftovers::DeadSidecar);
    Connected { record, calls, events_rx, status: Some(status), gone: true, warm: None }
}

/// Stops an execution politely (`agent.stop`, `shutdown`, each bounded), then fences it.
/// Returns an error only when the sidecar could not be killed.
pub(super) async fn retire(
    context: SessionContext,
    calls: Arc<dyn Control>,
    record: ExecutionRow,
    grace: Duration,
    farewell: Option<serde_json::Value>,
) -> Result<(), String> {
    // `session/close` for an agent that takes it: its last line before its input ends.
    // Bounded: a sidecar that does not take it (stopped, stalled) is fenced all the same.
    if let Some(farewell) = farewell {
        match tokio::time::timeout(FAREWELL_WAIT, calls.send_acp(&farewell)).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                tracing::debug!(session = %record.session_id, %err, "cannot send session/close")
            }
            Err(_) => {
                tracing::warn!(session = %record.session_id, "the sidecar did not take session/close in time")
            }
        }
    }
    if let Err(err) = calls.stop_agent(grace).await {
        tracing::warn!(session = %record.session_id, %err, "stopping the agent");
    }
    let _ = calls.shutdown().await;
    drop(calls);
    fence(&context, record, RETIRE_GRACE).await
}

/// How long a sidecar may take to accept the `session/close` sent before a stop.
const FAREWELL_WAIT: Duration = Duration::from_secs(1);

/// How long a sidecar told to shut down may take to exit before the fence kills it.
const RETIRE_GRACE: Duration = Duration::from_secs(2);

/// Fences one execution of the session (and whatever else the runtime finds for it),
/// giving a sidecar that is shutting down `grace` to exit by itself.
pub(super) async fn fence(
    context: &SessionContext,
    record: ExecutionRow,
    grace: Duration,
) -> Result<(), String> {
    let target = FenceTarget {
        session_id: record.session_id.clone(),
        state_dir: context.state_dir_of(&record),
        execution: Some(record),
        grace,
    };
    context.runtime.fence(&target).await.map_err(|err| err.to_string())
}

/// The state dir and workspace of a launch, as the spec wants them.
pub(super) fn spec(
    context: &SessionContext,
    row: &crate::store::SessionRow,
    profile: &agents::profile::Profile,
    (execution_id, generation): (crate::ids::ExecutionId, i64),
    token: String,
    previous: Option<serde_json::Value>,
) -> LaunchSpec {
    // The profile's placement labels, and the session's own on top.
    let mut labels = profile.docker.labels.clone();
    labels.extend(row.runtime_labels.clone());
    LaunchSpec {
        session_id: row.id.clone(),
        task_id: row.task_id.clone(),
        execution_id,
        generation,
        state_dir: context.agentctl_dir(),
        token,
        ready_timeout: context.ready_timeout,
        workspace: PathBuf::from(&row.workspace_path),
        // A worktree's `.git` file points into the repository's git dir, which commits
        // write to: a container needs it too, at the same path.
        git_dir: row
            .worktree_repo
            .as_ref()
            .map(|repo| PathBuf::from(repo).join(".git"))
            .filter(|dir| dir.is_dir()),
        docker: profile.docker.clone(),
        agent_state_dirs: profile.session.agent_state_dirs.clone(),
        agent_state_root: context.agent_state_root.clone(),
        labels,
        previous,
        sandbox: profile.sandbox_or(context.default_sandbox.as_ref()),
        // Read by the launch (see `seed`).
        seed: None,
    }
}

/// What a workspace copied to an engine is filled from there: for a session whose
/// workspace was copied already, its newest checkpoint (the one in flight waited for,
/// within its bound); else its directory, which holds its files as they are now.
pub(super) async fn seed(
    context: &SessionContext,
    row: &crate::store::SessionRow,
    previous: Option<&ExecutionRow>,
) -> WorkspaceSeed {
    let copied = ran_here(context, previous)
        .is_some_and(|previous| context.runtime.copies_workspace(previous.runtime_handle.as_ref()));
    let commit = match copied {
        true => {
            context.checkpoints.settle(&row.id).await;
            let newest = context.store.latest_checkpoint(row.id.clone()).await.ok().flatten();
            newest.map(|checkpoint| checkpoint.commit)
        }
        false => None,
    };
    WorkspaceSeed { repo: crate::checkpoint::Checkpoints::repository(&context.dir), commit }
}

/// The agent's argv for a launch (its resume form when relaunched with a token), and the
/// same with its program resolved here (in a container, the container resolves it). An
/// error says the program is not available.
pub(super) fn agent_argv(
    profile: &agents::profile::Profile,
    resolve: &crate::sidecar::Resolver,
    resume_token: Option<&str>,
    home: &std::path::Path,
    in_container: bool,
) -> Result<(Vec<String>, Vec<OsString>), String> {
    let argv = match resume_token {
        Some(token) => {
            profile.resume_argv(home, token).unwrap_or_else(|| profile.launch_argv(home))
        }
        None => profile.launch_argv(home),
    };
    let mut resolved = if in_container {
        vec![OsString::from(&argv[0])]
    } else {
        resolve(&argv[0]).ok_or_else(|| {
            format!("launch failed: the agent program {} is not available", argv[0])
        })?
    };
    resolved.extend(argv[1..].iter().map(OsString::from));
    Ok((argv, resolved))
}

/// The agent's environment; in a container also the profile's `root_env` (a container is
/// the sandbox such an agent asks for when run as root).
pub(super) fn agent_env(
    profile: &agents::profile::Profile,
    home: &std::path::Path,
    in_container: bool,
) -> Vec<(String, String)> {
    let mut env = profile.launch_env(home);
    if in_container {
        for (name, value) in &profile.process.root_env {
            env.entry(name.clone()).or_insert_with(|| value.clone());
        }
    }
    env.into_iter().collect()
}

/// What to tell the user when `npx` is about to download the agent's package (its first
/// start can take minutes); nothing when the package is in npm's cache or not run by npx.
pub(super) fn npx_download_notice(
    profile: &agents::profile::Profile,
    argv: &[String],
    home: &std::path::Path,
) -> Option<String> {
    let (name, version) = agents::npx::package(argv)?;
    let configured = profile.launch_env(home).remove("npm_config_cache");
    let inherited = std::env::var("npm_config_cache").ok();
    let cache = agents::npx::cache_dir(home, configured.or(inherited).as_deref());
    if agents::npx::cached(&cache, &name, version.as_deref()) {
        return None;
    }
    let spec = version.map_or(name.clone(), |version| format!("{name}@{version}"));
    let wait = profile.process.init_timeout_ms / 1000;
    Some(format!(
        "first start of {spec}: npx downloads it into {} before the agent answers — an agent adapter can be hundreds of MB, so this may take minutes (the start waits up to {wait} s); later starts take seconds",
        cache.display()
    ))
}
