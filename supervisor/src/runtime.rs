//! Runtimes launch a session's agentctl somewhere and say how to reach it: the standalone
//! runtime as a detached local process, the Docker runtime ([`docker`]) in a container on
//! one of several engines. The session actor, the service and recovery see only the
//! [`Runtime`] trait and the [`Runtimes`] registry.
//!
//! The seam: a launch returns an [`Endpoint`] — the control channel's address, which is
//! stored and used as stored, and an opaque, serialisable handle (which container on which
//! engine, for Docker) that the runtime alone reads back. Liveness at restart, fencing,
//! orphans and removal are all asked of the runtime with what it returned. Adding a runtime
//! is one module implementing [`Runtime`] and one [`Runtimes::register`] call.

pub mod cgroup;
pub mod docker;

use crate::ids::SessionId;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use agentctl::client::{self, LaunchConfig, LaunchError};
use agents::profile::DockerSettings;
use protocol::control::ReadyInfo;

use crate::store::ExecutionRow;

/// What a workspace copied to the place a session runs on is filled from, when that place
/// has none of it yet (see [`Runtime::copies_workspace`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceSeed {
    /// The session's checkpoint repository.
    pub repo: PathBuf,
    /// Its newest checkpoint; none yet: the supervisor's workspace directory as it is.
    pub commit: Option<String>,
}

/// What a runtime needs to launch agentctl for one execution.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// The session.
    pub session_id: SessionId,
    /// Its task.
    pub task_id: String,
    /// The execution being launched.
    pub execution_id: crate::ids::ExecutionId,
    /// Its generation (the previous execution's plus one; 1 for the first): a container
    /// carries it as its `tether.generation` label, checked at a re-attach.
    pub generation: i64,
    /// agentctl's state dir on the host (spool, ready.json, log).
    pub state_dir: PathBuf,
    /// The bearer token for this execution.
    pub token: String,
    /// How long agentctl may take to print its ready line.
    pub ready_timeout: Duration,
    /// The workspace (mounted at the same path in a container).
    pub workspace: PathBuf,
    /// For a worktree, the repository's git dir (mounted at the same path too).
    pub git_dir: Option<PathBuf>,
    /// The profile's container settings.
    pub docker: DockerSettings,
    /// The agent's own state dirs, relative to its home.
    pub agent_state_dirs: Vec<String>,
    /// Where those dirs live on the host (`agent-state/<session-id>/`).
    pub agent_state_root: PathBuf,
    /// Placement: labels the place it runs on must carry (the profile's and the
    /// session's requested ones; empty: anywhere).
    pub labels: BTreeMap<String, String>,
    /// The previous execution's handle, when there was one: a runtime whose agent state
    /// lives on one place (an engine's host) launches there again.
    pub previous: Option<serde_json::Value>,
    /// The profile's `[sandbox]`: how the agent is confined (checked before each launch).
    pub sandbox: agents::profile::SandboxSettings,
    /// What a workspace copied to its place is filled from, when that place has none yet.
    pub seed: Option<WorkspaceSeed>,
}

/// A launched agentctl.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Where its control channel listens (on the host): a local sidecar's Unix socket, or
    /// a TCP address.
    pub addr: client::ControlAddr,
    /// What it announced.
    pub ready: ReadyInfo,
    /// What the runtime needs to find it again (stored as JSON, read only by the runtime
    /// that made it): for Docker, the engine and the container.
    pub handle: serde_json::Value,
    /// The certificate (PEM) agentctl serves its control channel with, when the runtime
    /// put it behind TLS (a sidecar across a network); the client pins it.
    pub tls_cert: Option<String>,
    /// Who the agent runs as when its profile names no one (`process.user`): the
    /// runtime's choice (a container's non-root user), or `None` (agentctl's own user).
    pub agent_user: Option<String>,
    /// Directories (as the agent sees them) the runtime filled as root that the agent's
    /// user must own: a copied workspace.
    pub owned_dirs: Vec<PathBuf>,
}

/// What a runtime says of a recorded execution at restart recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    /// Its sidecar runs and is the one recorded: re-attach it.
    Alive,
    /// It is gone (or cannot be told to run): fence and mark it.
    Dead,
    /// Something of the session runs, but not the execution recorded (a stale
    /// generation): it is fenced, never re-attached. The reason, for the log.
    Stale(String),
    /// Where it ran cannot be reached now (an engine is down): it is neither re-attached
    /// nor fenced; the session waits, `runtime_unavailable`, until the place returns.
    Unreachable(String),
}

/// Something a runtime runs for this installation whose session is not stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    /// The session it names, if any.
    pub session_id: Option<SessionId>,
    /// Where it is, for the log (`engine/container`).
    pub location: String,
    /// What [`Runtime::remove_orphan`] needs.
    pub handle: serde_json::Value,
}

/// Orphans found on the places a runtime could reach, and the places it could not.
#[derive(Debug, Default)]
pub struct OrphanScan {
    /// What runs for sessions that are not stored… or may not be: the caller checks.
    pub found: Vec<Orphan>,
    /// Places that could not be searched, with why.
    pub unreachable: Vec<String>,
}

/// Errors from a runtime; the API reports them as `runtime_unavailable`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// agentctl could not be launched.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The runtime cannot work here (the engine is unreachable, no static agentctl…).
    #[error("{0}")]
    Unavailable(String),
    /// The profile's image does not exist on the engine.
    #[error("the image {0} is not on the Docker engine (build or pull it first)")]
    ImageMissing(String),
    /// The engine refused something else.
    #[error("docker: {0}")]
    Engine(String),
    /// No place matches the session's placement (labels, capacity).
    #[error("{0}")]
    NoPlacement(String),
}

/// A boxed future, so the trait stays object safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where agentctl runs.
pub trait Runtime: Send + Sync + 'static {
    /// The name it is registered and stored under (`standalone`, `docker`).
    fn name(&self) -> &str;

    /// The agent's home as the agent sees it (for `{home}`), when it is not the
    /// supervisor's own; programs are then looked up where the agent runs, not here, and
    /// the agent counts as sandboxed (a root user's `root_env` is not asked for).
    fn agent_home(&self) -> Option<PathBuf> {
        None
    }

    /// agentctl's argv prefix where the agent runs, when that is this machine (a confined
    /// agent's `agentctl relay` runs in its sandbox); `None` elsewhere.
    fn agentctl_command(&self) -> Option<Vec<OsString>> {
        None
    }

    /// Whether liveness is told by this host's processes (the restart scan of `/proc`
    /// finds its sidecars): a session at rest on such a runtime is left unread at restart.
    fn local_processes(&self) -> bool {
        false
    }

    /// Whether it places sessions by labels (`LaunchSpec::labels`); a session asking for
    /// labels on a runtime that does not is refused at create.
    fn places_by_labels(&self) -> bool {
        false
    }

    /// What [`Runtime::remove`] removes for a session, as cleanup reports name it
    /// (`container`); `None` when it keeps nothing.
    fn resource_kind(&self) -> Option<&'static str> {
        None
    }

    /// Where an execution runs, in words (an engine's name), from its handle.
    fn placement(&self, _handle: Option<&serde_json::Value>) -> Option<String> {
        None
    }

    /// The places it runs sessions on (a Docker runtime's engines), in config order, each
    /// with why it does not answer now, if it does not; empty for a runtime of one place.
    fn places(&self) -> BoxFuture<'_, Vec<(String, Option<String>)>> {
        Box::pin(async { Vec::new() })
    }

    /// The places out of service (`engines.drain`): no new session goes there, and a
    /// session whose last execution ran on one is placed afresh at its next launch.
    fn set_closed(&self, _places: std::collections::BTreeSet<String>) {}

    /// Whether an execution's agent state (its `agent_state_dirs`) stays on its place when
    /// the session moves off it (a Docker engine's volumes), so the next start cannot
    /// restore the agent's own session there and injects the history.
    fn state_stays(&self, _handle: Option<&serde_json::Value>) -> bool {
        false
    }

    /// Whether the workspace of the execution `handle` names lives on its place (a Docker
    /// engine with `workspace = "copy"`) rather than in the supervisor's directory: its
    /// checkpoints are then fetched from there ([`Runtime::fetch_workspace`]).
    fn copies_workspace(&self, _handle: Option<&serde_json::Value>) -> bool {
        false
    }

    /// Writes a tar archive of the directory `path` as it is where the execution `handle`
    /// names runs (its container, running or stopped) into the file `to`.
    fn fetch_workspace<'a>(
        &'a self,
        _handle: &'a serde_json::Value,
        _path: &'a std::path::Path,
        _to: &'a std::path::Path,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async {
            Err(RuntimeError::Unavailable(format!("runtime {} keeps no workspace", self.name())))
        })
    }

    /// Removes what the runtime keeps for a session on the one place `handle` names (a
    /// container, state volumes), after the session moved off it; whether there was any.
    fn remove_from<'a>(
        &'a self,
        _session_id: &'a SessionId,
        _handle: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<bool, RuntimeError>> {
        Box::pin(async { Ok(false) })
    }

    /// Removes what the runtime keeps on `place` for every session but those in `keep`
    /// (the sessions whose place it is now): a place back after its sessions moved off it
    /// has their stale containers and state removed, never adopted; how many were.
    fn remove_stale<'a>(
        &'a self,
        _place: &'a str,
        _keep: &'a std::collections::BTreeSet<String>,
    ) -> BoxFuture<'a, Result<usize, RuntimeError>> {
        Box::pin(async { Ok(0) })
    }

    /// Whether the place an execution ran on (its handle) can be used now: a session whose
    /// place is gone is `runtime_unavailable` until it returns.
    fn reachable<'a>(
        &'a self,
        _handle: Option<&'a serde_json::Value>,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        self.check()
    }

    /// Liveness of many recorded executions at once (restart recovery), keyed by session;
    /// a session left out counts as [`Liveness::Dead`]. `boot_id` is this machine's boot.
    fn liveness<'a>(
        &'a self,
        executions: &'a [ExecutionRow],
        boot_id: &'a str,
    ) -> BoxFuture<'a, HashMap<SessionId, Liveness>>;

    /// What runs for this installation on every place the runtime can reach (the caller
    /// keeps those whose session is not stored). None by default.
    fn orphans(&self) -> BoxFuture<'_, OrphanScan> {
        Box::pin(async { OrphanScan::default() })
    }

    /// Removes one orphan found by [`Runtime::orphans`].
    fn remove_orphan<'a>(&'a self, _orphan: &'a Orphan) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async { Ok(()) })
    }

    /// Whether the runtime can launch anything now.
    fn check(&self) -> BoxFuture<'_, Result<(), RuntimeError>>;

    /// Launches agentctl and waits for its ready line.
    fn launch(&self, spec: LaunchSpec) -> BoxFuture<'_, Result<Endpoint, RuntimeError>>;

    /// Why an execution's sidecar went away, when the runtime can tell (e.g. OOM).
    fn exit_reason<'a>(&'a self, _executor: &'a ExecutionRow) -> BoxFuture<'a, Option<String>> {
        Box::pin(async { None })
    }

    /// Forgets a deleted session: removes what the runtime keeps for it (a container),
    /// where its last execution's handle says and wherever else it finds one; whether
    /// there was anything.
    fn remove<'a>(
        &'a self,
        _session_id: &'a SessionId,
        _handle: Option<&'a serde_json::Value>,
    ) -> BoxFuture<'a, Result<bool, RuntimeError>> {
        Box::pin(async { Ok(false) })
    }

    /// The fence: makes certain that no sidecar of the session is alive — the one its
    /// runtime record names and any other the runtime can find for the session (one that
    /// was started but never recorded) — killing them and waiting until they are gone.
    /// A new execution is launched only after this returned `Ok`; a sidecar that is
    /// stopped (SIGSTOP), wedged or mid-shutdown is killed all the same.
    fn fence<'a>(&'a self, target: &'a FenceTarget) -> BoxFuture<'a, Result<(), RuntimeError>>;
}

/// What [`Runtime::fence`] must make sure is dead.
#[derive(Debug, Clone)]
pub struct FenceTarget {
    /// The session.
    pub session_id: SessionId,
    /// agentctl's state dir (its `ready.json` names the newest agentctl started there).
    pub state_dir: PathBuf,
    /// The runtime record, when there is one.
    pub execution: Option<ExecutionRow>,
    /// How long a sidecar that is already shutting down may take to exit by itself before
    /// it is killed (zero: kill at once).
    pub grace: Duration,
}

/// The runtimes this daemon has, by name: how the service, the actor and recovery find
/// the one a session is stored with.
#[derive(Clone)]
pub struct Runtimes {
    by_name: BTreeMap<String, Arc<dyn Runtime>>,
}

impl Runtimes {
    /// An empty registry.
    pub fn new() -> Runtimes {
        Runtimes { by_name: BTreeMap::new() }
    }

    /// Adds a runtime under its [`Runtime::name`] (a later one of the same name wins).
    pub fn register(mut self, runtime: Arc<dyn Runtime>) -> Runtimes {
        self.by_name.insert(runtime.name().to_owned(), runtime);
        self
    }

    /// The runtime of that name.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Runtime>> {
        self.by_name.get(name).cloned()
    }

    /// Every registered name, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.by_name.keys().map(String::as_str).collect()
    }

    /// Every runtime.
    pub fn all(&self) -> impl Iterator<Item = &Arc<dyn Runtime>> {
        self.by_name.values()
    }

    /// The runtime whose sidecars are this host's processes (standalone), if registered:
    /// the restart's process scan tells its liveness for thousands of sessions at once.
    pub fn local(&self) -> Option<&Arc<dyn Runtime>> {
        self.all().find(|runtime| runtime.local_processes())
    }
}

impl Default for Runtimes {
    fn default() -> Runtimes {
        Runtimes::new()
    }
}

/// How long a killed sidecar may take to be gone before the fence reports failure.
pub const FENCE_TIMEOUT: Duration = Duration::from_secs(10);

/// agentctl as a detached local process.
#[derive(Debug, Clone)]
pub struct StandaloneRuntime {
    /// The argv prefix that runs agentctl (its binary, or `supervisor agentctl`).
    pub agentctl: Vec<OsString>,
    /// A cgroup per session, where cgroup v2 can be written (see `cgroup.rs`).
    pub cgroups: Option<cgroup::Cgroups>,
}

impl Runtime for StandaloneRuntime {
    fn name(&self) -> &str {
        "standalone"
    }

    fn agentctl_command(&self) -> Option<Vec<OsString>> {
        Some(self.agentctl.clone())
    }

    fn local_processes(&self) -> bool {
        true
    }

    fn check(&self) -> BoxFuture<'_, Result<(), RuntimeError>> {
        Box::pin(async { Ok(()) })
    }

    fn launch(&self, spec: LaunchSpec) -> BoxFuture<'_, Result<Endpoint, RuntimeError>> {
        Box::pin(async move {
            let session_id = spec.session_id.clone();
            let (program, prefix) =
                self.agentctl.split_first().expect("UNWRAP: the agentctl command is never empty");
            let config = LaunchConfig {
                program: PathBuf::from(program),
                prefix_args: prefix.to_vec(),
                listen: control_socket(&spec.state_dir),
                state_dir: spec.state_dir,
                token: spec.token,
                ready_timeout: spec.ready_timeout,
                extra_args: Vec::new(),
                // Joined before it is announced ready, so before its agent starts: all it
                // starts is in there.
                cgroup: self.cgroups.as_ref().and_then(|cgroups| {
                    cgroups.prepare(&session_id).map_err(|err| {
                        tracing::warn!(session = %session_id, %err, "cannot make the session's cgroup");
                    }).ok()
                }),
            };
            let launched = client::launch(&config).await?;
            Ok(Endpoint {
                agent_user: None,
                addr: launched.addr,
                ready: launched.ready,
                handle: serde_json::Value::Null,
                tls_cert: None,
                owned_dirs: Vec::new(),
            })
        })
    }

    fn liveness<'a>(
        &'a self,
        executions: &'a [ExecutionRow],
        boot_id: &'a str,
    ) -> BoxFuture<'a, HashMap<SessionId, Liveness>> {
        Box::pin(async move {
            executions
                .iter()
                .map(|execution| {
                    let alive = standalone_alive(execution, boot_id);
                    let liveness = if alive { Liveness::Alive } else { Liveness::Dead };
                    (execution.session_id.clone(), liveness)
                })
                .collect()
        })
    }

    fn fence<'a>(&'a self, target: &'a FenceTarget) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let boot_id = agentctl::ready::boot_id().unwrap_or_default();
            // The recorded sidecar, and the newest one its state dir announced (a launch
            // that was cut short before it was recorded).
            let mut candidates: Vec<(i64, i64, Option<String>)> = Vec::new();
            if let Some(execution) = &target.execution
                && let (Some(pid), Some(start_time)) =
                    (execution.agentctl_pid, execution.agentctl_start_time)
            {
                candidates.push((pid, start_time, execution.boot_id.clone()));
            }
            if let Ok(text) = std::fs::read(target.state_dir.join(agentctl::ready::READY_FILE))
                && let Ok(ready) = serde_json::from_slice::<ReadyInfo>(&text)
            {
                candidates.push((ready.pid.into(), ready.start_time as i64, Some(ready.boot_id)));
            }
            // A warm agent's sidecar keeps the cgroup it was started in.
            let warm_cgroup = target
                .execution
                .as_ref()
                .and_then(|execution| execution.runtime_handle.as_ref())
                .and_then(|handle| handle.get("cgroup"))
                .and_then(|cgroup| cgroup.as_str())
                .map(str::to_owned);
            for candidate in candidates {
                kill_sidecar(candidate, &boot_id, target.grace).await?;
            }
            // What escaped the agent's process group (its guard killed the group).
            if let Some(cgroups) = &self.cgroups {
                for cgroup in std::iter::once(target.session_id.clone())
                    .chain(warm_cgroup.map(SessionId::from))
                {
                    if let Err(err) = cgroups.kill(&cgroup, FENCE_TIMEOUT).await {
                        tracing::warn!(session = %target.session_id, %err, "cannot kill the session's cgroup");
                    }
                }
            }
            Ok(())
        })
    }
}

/// A standalone execution's handle when it runs in a warm agent's sidecar (see `pool.rs`):
/// its state dir and cgroup are the pool entry's, not the session's.
pub fn warm_handle(state_dir: &std::path::Path, entry: &str) -> serde_json::Value {
    serde_json::json!({"state_dir": state_dir, "cgroup": format!("pool-{entry}")})
}

/// The state dir an execution's sidecar uses: a warm one's (its handle says), else
/// `default` (the session's `agentctl/`).
pub fn execution_state_dir(execution: &ExecutionRow, default: PathBuf) -> PathBuf {
    execution
        .runtime_handle
        .as_ref()
        .and_then(|handle| handle.get("state_dir"))
        .and_then(|dir| dir.as_str())
        .map(PathBuf::from)
        .unwrap_or(default)
}

/// Where a local sidecar listens: a Unix socket in its 0700 state dir, which only the
/// daemon's user can dial, or loopback TCP when that path is too long for a socket.
fn control_socket(state_dir: &std::path::Path) -> client::ControlAddr {
    let path = state_dir.join("control.sock");
    if path.as_os_str().len() <= client::MAX_SOCKET_PATH {
        client::ControlAddr::Unix(path)
    } else {
        tracing::warn!(path = %path.display(), "too long for a Unix socket: the sidecar listens on loopback TCP");
        client::ControlAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 0)))
    }
}

/// SIGKILLs a local sidecar (its pid, start time and the boot it started under) if it is
/// the one recorded (same boot, same start time), and waits for it to be gone. Its guard then kills the agent's process group.
async fn kill_sidecar(
    (pid, start_time, boot): (i64, i64, Option<String>),
    boot_id: &str,
    grace: Duration,
) -> Result<(), RuntimeError> {
    let Ok(pid) = u32::try_from(pid) else { return Ok(()) };
    if boot.as_deref() != Some(boot_id) {
        return Ok(());
    }
    // The pidfd pins the process: once it is open and the start time matches, the signal
    // cannot reach a recycled pid.
    let Ok(pidfd) = agentctl::process::PidFd::open(pid) else { return Ok(()) };
    if !agentctl::ready::process_start_time(pid).is_ok_and(|now| now as i64 == start_time) {
        return Ok(());
    }
    if !grace.is_zero() && tokio::time::timeout(grace, pidfd.exited()).await.is_ok() {
        return Ok(());
    }
    tracing::warn!(pid, "fencing a sidecar: SIGKILL");
    pidfd
        .kill()
        .map_err(|err| RuntimeError::Unavailable(format!("cannot kill agentctl {pid}: {err}")))?;
    match tokio::time::timeout(FENCE_TIMEOUT, pidfd.exited()).await {
        Ok(_) => Ok(()),
        Err(_) => Err(RuntimeError::Unavailable(format!(
            "agentctl {pid} did not die within {FENCE_TIMEOUT:?} of SIGKILL"
        ))),
    }
}

/// Every local agentctl (any process started with `--state-dir`): its pid and state dir.
pub fn local_sidecars() -> Vec<(u32, PathBuf)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return found };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let mut args = cmdline.split(|&b| b == 0);
        while let Some(arg) = args.next() {
            if arg == b"--state-dir" {
                if let Some(dir) = args.next() {
                    use std::os::unix::ffi::OsStrExt;
                    found.push((pid, PathBuf::from(std::ffi::OsStr::from_bytes(dir))));
                }
                break;
            }
        }
    }
    found
}

/// The pids and the state dirs of every local agentctl (see [`local_sidecars`]).
pub fn live_sidecars() -> (std::collections::HashSet<u32>, std::collections::HashSet<PathBuf>) {
    local_sidecars().into_iter().unzip()
}

/// SIGKILLs a local agentctl found by [`local_sidecars`], if it is still the process that
/// serves `state_dir`, and waits until it is gone (its guard then kills the agent's group).
pub async fn kill_local_sidecar(pid: u32, state_dir: &std::path::Path) -> std::io::Result<()> {
    let pidfd = agentctl::process::PidFd::open(pid)?;
    // Opened first, then checked: the pid cannot be reused while the pidfd is held.
    let serves = local_sidecars().into_iter().any(|(p, dir)| p == pid && dir == state_dir);
    if !serves {
        return Ok(());
    }
    pidfd.kill()?;
    pidfd.exited().await
}

/// A local sidecar is alive only if the machine has not rebooted since it started, its pid
/// still exists, and that pid's start time is the one it announced (not a recycled pid).
fn standalone_alive(execution: &ExecutionRow, boot_id: &str) -> bool {
    let (Some(pid), Some(start_time)) = (execution.agentctl_pid, execution.agentctl_start_time)
    else {
        return false;
    };
    let Ok(pid) = u32::try_from(pid) else { return false };
    execution.boot_id.as_deref() == Some(boot_id)
        && agentctl::process::PidFd::open(pid).is_ok()
        && !agentctl::process::is_zombie(pid)
        && agentctl::ready::process_start_time(pid).is_ok_and(|now| now as i64 == start_time)
}
