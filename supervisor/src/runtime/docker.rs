//! The Docker runtime: one container per session, with the statically linked agentctl
//! bind-mounted read-only as its entrypoint, so any image works.
//!
//! Engines ([`engines`]): one or more, each with labels and a capacity. A new session is
//! placed by the labels it asks for, then on the least loaded engine; a resumed one goes
//! back to the engine it ran on (its agent's state is there), and is `runtime_unavailable`
//! while that engine is unreachable. The handle stored for an execution is
//! [`DockerHandle`]: the engine's name and the container's id.
//!
//! Container lifecycle:
//! - launch: one container per execution: a container the session's earlier execution
//!   left (stopped, or running with an agent we lost) is removed, and a new one
//!   (`tether-<session id>`) created from the profile's image; attach to its stdout *before*
//!   starting it and read agentctl's ready line there (no polling); the control port
//!   (7070) is published only on the address the engine's host is reached at (loopback
//!   for a local engine), on a port the engine picks;
//! - labels: `tether.managed=true`, `tether.session_id`, `tether.task_id`,
//!   `tether.execution_id`, `tether.generation` (the execution's), `tether.install_id`,
//!   `tether.engine`;
//!   recovery re-attaches a running container only when its execution id and generation
//!   are the ones recorded for the session (a stale one is fenced);
//! - mounts: agentctl (read-only), its state dir, the workspace (at the same path), and the
//!   agent's own state dirs from `agent-state/<session-id>/` (so a native resume works in a
//!   new container);
//! - `init: true`, memory and CPU limits from the profile, never privileged, no Docker
//!   socket inside;
//! - the token is a 0600 file in the mounted state dir (`--token-file`), so it does not
//!   appear in `docker inspect`;
//! - a plain stop keeps the container; delete removes it.

mod archive;
pub mod engines;
mod sidecar;

use crate::ids::SessionId;
use sidecar::{entrypoint_archive, write_private};
pub use sidecar::{
    find_static_agentctl, is_static_elf, sidecar_certificate, static_agentctl_candidates,
};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::models::{ContainerCreateBody, HostConfig, PortBinding};
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, InspectContainerOptions, KillContainerOptions,
    ListContainersOptions, ListVolumesOptions, RemoveContainerOptions, RemoveVolumeOptions,
    UploadToContainerOptions, WaitContainerOptions,
};
use futures_util::StreamExt;
use protocol::control::ReadyInfo;

use serde::{Deserialize, Serialize};

use self::engines::{Candidate, Engine, EngineConfig, Storage, WorkspaceMode, place};
use super::{
    BoxFuture, Endpoint, FenceTarget, LaunchSpec, Liveness, Orphan, OrphanScan, Runtime,
    RuntimeError,
};
use crate::store::ExecutionRow;

/// The port agentctl listens on inside the container.
pub const CONTAINER_PORT: u16 = 7070;
/// The agent's home inside the container.
pub const CONTAINER_HOME: &str = "/root";
/// How long an engine may take to answer a ping before it counts as unreachable.
pub const ENGINE_ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// The label every container of ours carries.
pub const MANAGED_LABEL: &str = "tether.managed";

/// Settings for the Docker runtime.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// The statically linked agentctl to mount (`scripts/build-static.sh` builds it): as
    /// configured, else found by [`find_static_agentctl`].
    pub agentctl: Option<PathBuf>,
    /// Where [`find_static_agentctl`] looked, for the error when nothing was found.
    pub searched: Vec<PathBuf>,
    /// This installation's id, on every container's labels.
    pub install_id: String,
    /// The engines sessions are placed on (`[[docker.engines]]`); empty: the one at
    /// `DOCKER_HOST`, else the local socket.
    pub engines: Vec<EngineConfig>,
}

/// The execution a running container's labels name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerExecution {
    /// `tether.execution_id` (`None` when missing).
    pub execution_id: Option<crate::ids::ExecutionId>,
    /// `tether.generation` (`None` when missing or not a number).
    pub generation: Option<i64>,
}

impl ContainerExecution {
    /// Whether the container runs the execution recorded for its session: the same id
    /// and generation. A container from an older execution (a stale generation) is not
    /// re-attached, whatever else it says.
    pub fn is_current(&self, execution: &crate::store::ExecutionRow) -> bool {
        self.execution_id.as_ref() == Some(&execution.execution_id)
            && self.generation == Some(execution.generation)
    }

    fn from_labels(labels: &HashMap<String, String>) -> ContainerExecution {
        ContainerExecution {
            execution_id: labels.get("tether.execution_id").map(|id| id.as_str().into()),
            generation: labels.get("tether.generation").and_then(|g| g.parse().ok()),
        }
    }
}

/// What the Docker runtime stores for an execution (its opaque handle): the engine and
/// the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DockerHandle {
    /// The engine's name (absent in rows from before there were several: the first
    /// engine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// The container id.
    pub container: String,
    /// Whether its workspace was copied to the engine (`workspace = "copy"` when it
    /// launched): a copied one lives there and in the session's checkpoints, whatever the
    /// engine's config says now. `None` in rows from before: the engine's config is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copied: Option<bool>,
}

impl DockerHandle {
    /// The handle in a stored value, if it is one of ours.
    pub fn parse(handle: Option<&serde_json::Value>) -> Option<DockerHandle> {
        serde_json::from_value(handle?.clone()).ok()
    }
}

/// Containers through bollard, on one or more engines.
#[derive(Debug)]
pub struct DockerRuntime {
    config: DockerConfig,
    engines: Vec<Engine>,
    /// The engines out of service (draining, drained): no new session goes there, and a
    /// session whose last execution ran on one is placed afresh.
    closed: std::sync::RwLock<std::collections::BTreeSet<String>>,
}

fn engine_error(err: bollard::errors::Error) -> RuntimeError {
    RuntimeError::Engine(err.to_string())
}

fn is_not_found(err: &bollard::errors::Error) -> bool {
    matches!(err, bollard::errors::Error::DockerResponseServerError { status_code: 404, .. })
}

/// What a container's `[sandbox]` adds: a read-only root with a private `/tmp` and home
/// (`filesystem = "workspace"`), the profile's `readable` and `writable` paths mounted at
/// the same place (`~/` is this host's home, mounted under the container's), and for a
/// network namespace of the agent's own the capabilities agentctl makes it with (root's
/// in the container only; the agent never holds them).
struct ContainerConfinement {
    read_only: bool,
    tmpfs: HashMap<String, String>,
    cap_add: Vec<String>,
}

fn sandboxed(
    sandbox: &agents::profile::SandboxSettings,
    on_volumes: bool,
    binds: &mut Vec<String>,
) -> Result<ContainerConfinement, RuntimeError> {
    use agents::profile::{FilesystemAccess, NetworkAccess};
    let mut confined =
        ContainerConfinement { read_only: false, tmpfs: HashMap::new(), cap_add: Vec::new() };
    if sandbox.network != NetworkAccess::Host {
        confined.cap_add = vec!["SYS_ADMIN".to_owned(), "NET_ADMIN".to_owned()];
    }
    if sandbox.filesystem != FilesystemAccess::Workspace {
        return Ok(confined);
    }
    if on_volumes {
        // agentctl is copied into such a container, which a read-only root refuses.
        return Err(RuntimeError::Unavailable(
            "[sandbox] filesystem = \"workspace\" needs an engine whose storage is binds (this engine keeps sessions in volumes); the agent is never run unconfined instead".into(),
        ));
    }
    confined.read_only = true;
    let private = "rw,nosuid,nodev,mode=1777".to_owned();
    confined.tmpfs.insert("/tmp".to_owned(), private.clone());
    confined.tmpfs.insert(CONTAINER_HOME.to_owned(), private);
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let lists = [(&sandbox.readable, ":ro"), (&sandbox.writable, "")];
    for (paths, mode) in lists {
        for path in paths.iter() {
            let (host, inside) = match path.strip_prefix("~/") {
                Some(rest) => match &home {
                    Some(home) => (home.join(rest), Path::new(CONTAINER_HOME).join(rest)),
                    None => continue,
                },
                None => (PathBuf::from(path), PathBuf::from(path)),
            };
            // As bubblewrap's `-try`: a path that is not there is not mounted.
            if host.exists() {
                binds.push(format!("{}:{}{mode}", host.display(), inside.display()));
            }
        }
    }
    Ok(confined)
}

/// The container name of a session (the same on every engine).
pub fn container_name(session_id: &SessionId) -> String {
    format!("tether-{session_id}")
}

impl DockerRuntime {
    /// A runtime for the configured engines (none: the one at `DOCKER_HOST`, or the local
    /// socket). Nothing is contacted until it is used.
    pub fn new(config: DockerConfig) -> DockerRuntime {
        let configured = if config.engines.is_empty() {
            vec![EngineConfig::default_engine()]
        } else {
            config.engines.clone()
        };
        if configured
            .iter()
            .any(|engine| engine.host.as_deref().is_some_and(|h| h.starts_with("ssh://")))
        {
            engines::close_stale_ssh_masters();
        }
        DockerRuntime {
            engines: configured.into_iter().map(Engine::new).collect(),
            config,
            closed: std::sync::RwLock::default(),
        }
    }

    /// The engine of that name; `None` names the first (rows from before there were
    /// several).
    fn engine_named(&self, name: Option<&str>) -> Option<&Engine> {
        match name {
            None => self.engines.first(),
            Some(name) => self.engines.iter().find(|engine| engine.config.name == name),
        }
    }

    /// The engine a handle names, if it is configured.
    fn engine_of(&self, handle: &DockerHandle) -> Option<&Engine> {
        self.engine_named(handle.engine.as_deref())
    }

    /// Whether an engine is out of service.
    fn is_closed(&self, engine: &Engine) -> bool {
        let closed = self.closed.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        closed.contains(&engine.config.name)
    }

    /// The engine a handle names when it is in service: where the session's state is, so
    /// where it must run again.
    fn serving_engine_of(&self, handle: &DockerHandle) -> Option<&Engine> {
        self.engine_of(handle).filter(|engine| !self.is_closed(engine))
    }

    /// A client that has just answered a ping.
    async fn reach(&self, engine: &Engine) -> Result<Docker, RuntimeError> {
        let name = &engine.config.name;
        let unreachable = |reason: String| {
            RuntimeError::Unavailable(format!("the Docker engine {name} is unreachable: {reason}"))
        };
        let docker = engine.docker.clone().map_err(unreachable)?;
        // One that just let a ping time out is taken as down for a while, not waited for
        // again by every status, placement and fence (a refusal is cheap: asked each time).
        if let Some(reason) = engine.recently_timed_out() {
            return Err(unreachable(reason));
        }
        // Bounded: an engine whose host does not answer at all (a dropped route) would
        // otherwise hold a restart, a status or a placement for the OS's connect timeout.
        let answered = tokio::time::timeout(ENGINE_ANSWER_TIMEOUT, async {
            let docker = docker.negotiate_version().await?;
            docker.ping().await?;
            Ok::<Docker, bollard::errors::Error>(docker)
        });
        match answered.await {
            Ok(Ok(docker)) => {
                engine.record_timeout(None);
                Ok(docker)
            }
            Ok(Err(err)) => Err(unreachable(err.to_string())),
            Err(_) => {
                let reason = format!("it did not answer within {ENGINE_ANSWER_TIMEOUT:?}");
                engine.record_timeout(Some(reason.clone()));
                Err(unreachable(reason))
            }
        }
    }

    fn agentctl(&self) -> Result<&Path, RuntimeError> {
        match &self.config.agentctl {
            Some(path) if path.is_file() => Ok(path),
            Some(path) => Err(RuntimeError::Unavailable(format!(
                "the static agentctl {} does not exist (scripts/build-static.sh builds it)",
                path.display()
            ))),
            None => {
                let searched: Vec<String> =
                    self.config.searched.iter().map(|path| path.display().to_string()).collect();
                Err(RuntimeError::Unavailable(format!(
                    "no statically linked agentctl to run in containers (looked for one at {}); scripts/build-static.sh builds it where it is found, or pass serve --static-agentctl PATH",
                    searched.join(", ")
                )))
            }
        }
    }

    /// This installation's containers on an engine (running ones only unless `all`), in
    /// one call.
    async fn list_ours(
        &self,
        docker: &Docker,
        all: bool,
    ) -> Result<Vec<bollard::models::ContainerSummary>, RuntimeError> {
        let labels = vec![
            format!("{MANAGED_LABEL}=true"),
            format!("tether.install_id={}", self.config.install_id),
        ];
        let filters = HashMap::from([("label".to_owned(), labels)]);
        docker
            .list_containers(Some(ListContainersOptions {
                all,
                filters: Some(filters),
                ..Default::default()
            }))
            .await
            .map_err(engine_error)
    }

    /// This installation's running containers on an engine, each id with the execution
    /// its labels name.
    async fn running_on(
        &self,
        engine: &Engine,
    ) -> Result<HashMap<String, ContainerExecution>, RuntimeError> {
        let docker = self.reach(engine).await?;
        let containers = self.list_ours(&docker, false).await?;
        Ok(containers
            .into_iter()
            .filter_map(|container| {
                let labels = container.labels.unwrap_or_default();
                Some((container.id?, ContainerExecution::from_labels(&labels)))
            })
            .collect())
    }

    /// Where a new execution goes: the engine of the previous one when it is still
    /// configured and carries the session's labels (the agent's state lives there: it
    /// must be reachable), else placement by labels and least load over every engine.
    async fn choose(&self, spec: &LaunchSpec) -> Result<&Engine, RuntimeError> {
        // A workspace copied to an engine lives there and in its checkpoints, not in the
        // supervisor's directory: it goes on only where workspaces are copied.
        let copied = self.copies_workspace(spec.previous.as_ref());
        if let Some(previous) = DockerHandle::parse(spec.previous.as_ref()) {
            let carries = |engine: &&Engine| {
                spec.labels.iter().all(|(key, value)| engine.config.labels.get(key) == Some(value))
                    && (!copied || engine.config.workspace == WorkspaceMode::Copy)
            };
            match self.serving_engine_of(&previous).filter(carries) {
                Some(engine) => {
                    self.reach(engine).await.map_err(|err| {
                        RuntimeError::Unavailable(format!(
                            "{err}; the session ran there and resumes there when it is back"
                        ))
                    })?;
                    return Ok(engine);
                }
                None => tracing::warn!(
                    session = %spec.session_id,
                    engine = ?previous.engine,
                    "the session's engine is out of service, no longer configured, without its labels or no longer copying workspaces: it is placed afresh"
                ),
            }
        }
        // Only the engines carrying the labels are asked for their load.
        let loads = futures_util::future::join_all(self.engines.iter().map(|engine| async move {
            let labels = &engine.config.labels;
            if !spec.labels.iter().all(|(key, value)| labels.get(key) == Some(value)) {
                return Ok(0);
            }
            if self.is_closed(engine) {
                return Err("draining or drained (engines.undrain returns it)".to_owned());
            }
            if copied && engine.config.workspace != WorkspaceMode::Copy {
                return Err("mounts workspaces, and this session's was copied to its engine: it goes on only on an engine with workspace = \"copy\"".to_owned());
            }
            let running =
                self.running_on(engine).await.map_err(|err| format!("unreachable ({err})"))?;
            Ok::<usize, String>(running.len() + engine.inflight.load(Ordering::SeqCst))
        }))
        .await;
        let candidates: Vec<Candidate<'_>> = self
            .engines
            .iter()
            .zip(loads)
            .map(|(engine, load)| Candidate {
                name: &engine.config.name,
                labels: &engine.config.labels,
                capacity: engine.config.capacity,
                load,
            })
            .collect();
        let index = place(&candidates, &spec.labels).map_err(RuntimeError::NoPlacement)?;
        Ok(&self.engines[index])
    }

    async fn create(
        &self,
        docker: &Docker,
        engine: &Engine,
        spec: &LaunchSpec,
        agentctl: &Path,
        tls: bool,
    ) -> Result<(String, bool), RuntimeError> {
        let image = spec.docker.image.clone().ok_or_else(|| {
            RuntimeError::Unavailable(
                "the profile names no [docker] image, so it cannot run in Docker".into(),
            )
        })?;
        let (mut binds, seed) = self.workspace_binds(docker, engine, spec).await?;
        let on_volumes = engine.config.storage == Storage::Volumes;
        if on_volumes {
            // The engine keeps the session's state: named volumes there, made once and
            // found again by the next container of the session.
            let state = self.ensure_volume(docker, engine, &spec.session_id, "state").await?;
            binds.push(format!("{state}:/tether/state"));
            for (index, dir) in spec.agent_state_dirs.iter().enumerate() {
                let kind = format!("agent-{index}");
                let volume = self.ensure_volume(docker, engine, &spec.session_id, &kind).await?;
                binds.push(format!("{volume}:{CONTAINER_HOME}/{dir}"));
            }
        } else {
            binds.push(format!("{}:/tether/agentctl:ro", agentctl.display()));
            binds.push(format!("{}:/tether/state", spec.state_dir.display()));
            for dir in &spec.agent_state_dirs {
                let host = spec.agent_state_root.join(dir);
                crate::home::create_private_dir(&host)
                    .map_err(|err| RuntimeError::Engine(format!("{}: {err}", host.display())))?;
                binds.push(format!("{}:{CONTAINER_HOME}/{dir}", host.display()));
            }
        }
        let confined = sandboxed(&spec.sandbox, on_volumes, &mut binds)?;
        if let Some(runtime) = &spec.docker.runtime {
            let info = docker.info().await.map_err(engine_error)?;
            if !info.runtimes.is_some_and(|runtimes| runtimes.contains_key(runtime)) {
                return Err(RuntimeError::Unavailable(format!(
                    "[docker] runtime = {runtime:?}: the engine {} has no such runtime (gVisor's is runsc: install it and register it in the engine's daemon.json, or remove the key)",
                    engine.config.name
                )));
            }
        }
        // Secrets: in the mounted state dir, or copied into the container with agentctl.
        let secrets = if on_volumes { "/tether/secrets" } else { "/tether/state" };
        let port = format!("{CONTAINER_PORT}/tcp");
        let labels = HashMap::from([
            (MANAGED_LABEL.to_owned(), "true".to_owned()),
            ("tether.session_id".to_owned(), spec.session_id.to_string()),
            ("tether.task_id".to_owned(), spec.task_id.clone()),
            ("tether.execution_id".to_owned(), spec.execution_id.to_string()),
            ("tether.generation".to_owned(), spec.generation.to_string()),
            ("tether.install_id".to_owned(), self.config.install_id.clone()),
            ("tether.engine".to_owned(), engine.config.name.clone()),
        ]);
        let mut cmd: Vec<String> = [
            "serve",
            "--state-dir",
            "/tether/state",
            "--listen",
            &format!("0.0.0.0:{CONTAINER_PORT}"),
            "--token-file",
            &format!("{secrets}/token"),
        ]
        .map(str::to_owned)
        .to_vec();
        if tls {
            cmd.extend([
                "--tls-cert".to_owned(),
                format!("{secrets}/tls.crt"),
                "--tls-key".to_owned(),
                format!("{secrets}/tls.key"),
            ]);
        }
        let body = ContainerCreateBody {
            image: Some(image.clone()),
            // agentctl is root in its container, so that it can start the agent as a user of
            // its own (see `non_root_user`) and always stop it.
            user: Some("0:0".into()),
            entrypoint: Some(vec!["/tether/agentctl".into()]),
            cmd: Some(cmd),
            env: Some(vec![
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
                format!("HOME={CONTAINER_HOME}"),
            ]),
            working_dir: Some(spec.workspace.display().to_string()),
            labels: Some(labels),
            exposed_ports: Some(vec![port.clone()]),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(false),
            host_config: Some(HostConfig {
                binds: Some(binds),
                // Published on the address the engine's host is reached at, only there.
                port_bindings: Some(HashMap::from([(
                    port,
                    Some(vec![PortBinding {
                        host_ip: Some(engine.address.to_string()),
                        host_port: Some(String::new()),
                    }]),
                )])),
                init: Some(true),
                privileged: Some(false),
                memory: Some((spec.docker.memory_mb * 1024 * 1024) as i64),
                nano_cpus: Some((spec.docker.cpus * 1e9) as i64),
                // Docker reads 0 (and -1) as no limit.
                pids_limit: Some(i64::try_from(spec.docker.pids_limit).unwrap_or(i64::MAX)),
                readonly_rootfs: Some(confined.read_only),
                runtime: spec.docker.runtime.clone(),
                tmpfs: Some(confined.tmpfs).filter(|tmpfs| !tmpfs.is_empty()),
                cap_add: Some(confined.cap_add).filter(|caps| !caps.is_empty()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let options = CreateContainerOptions {
            name: Some(container_name(&spec.session_id)),
            ..Default::default()
        };
        let created = docker.create_container(Some(options), body).await;
        if created.is_err() && seed {
            // Not filled: made again (and filled) by the next launch.
            forget_workspace(docker, &spec.session_id).await;
        }
        match created {
            Ok(created) => Ok((created.id, seed)),
            Err(err) if is_not_found(&err) => Err(RuntimeError::ImageMissing(image)),
            Err(err) => Err(engine_error(err)),
        }
    }

    /// The workspace's binds: the supervisor's directory (and a worktree's git dir) at
    /// their own paths, or on an engine that copies workspaces the session's volume there
    /// — and whether that volume is new, so to be filled before the start.
    async fn workspace_binds(
        &self,
        docker: &Docker,
        engine: &Engine,
        spec: &LaunchSpec,
    ) -> Result<(Vec<String>, bool), RuntimeError> {
        if engine.config.workspace == WorkspaceMode::Copy {
            let name = format!("tether-{}-workspace", spec.session_id);
            let new = docker.inspect_volume(&name).await.is_err_and(|err| is_not_found(&err));
            let volume = self.ensure_volume(docker, engine, &spec.session_id, "workspace").await?;
            return Ok((vec![format!("{volume}:{}", spec.workspace.display())], new));
        }
        let mut binds = vec![format!("{0}:{0}", spec.workspace.display())];
        if let Some(git_dir) = &spec.git_dir {
            binds.push(format!("{0}:{0}", git_dir.display()));
        }
        Ok((binds, false))
    }

    /// The session's named volume of `kind` on an engine (made, labelled as ours, when it
    /// does not exist yet); its name.
    async fn ensure_volume(
        &self,
        docker: &Docker,
        engine: &Engine,
        session_id: &SessionId,
        kind: &str,
    ) -> Result<String, RuntimeError> {
        let name = format!("tether-{session_id}-{kind}");
        let labels = HashMap::from([
            (MANAGED_LABEL.to_owned(), "true".to_owned()),
            ("tether.session_id".to_owned(), session_id.to_string()),
            ("tether.install_id".to_owned(), self.config.install_id.clone()),
            ("tether.engine".to_owned(), engine.config.name.clone()),
        ]);
        let request = bollard::models::VolumeCreateRequest {
            name: Some(name.clone()),
            labels: Some(labels),
            ..Default::default()
        };
        // Creating one that exists answers the existing one.
        docker.create_volume(request).await.map_err(engine_error)?;
        Ok(name)
    }

    /// This installation's volumes on an engine (all of them, or one session's), by name
    /// with the session each names.
    async fn volumes_of(
        &self,
        docker: &Docker,
        session_id: Option<&SessionId>,
    ) -> Result<Vec<(String, String)>, RuntimeError> {
        let mut labels = vec![
            format!("{MANAGED_LABEL}=true"),
            format!("tether.install_id={}", self.config.install_id),
        ];
        if let Some(session_id) = session_id {
            labels.push(format!("tether.session_id={session_id}"));
        }
        let filters = HashMap::from([("label".to_owned(), labels)]);
        let listed = docker
            .list_volumes(Some(ListVolumesOptions { filters: Some(filters) }))
            .await
            .map_err(engine_error)?;
        Ok(listed
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|volume| {
                let session = volume.labels.get("tether.session_id").cloned().unwrap_or_default();
                (volume.name, session)
            })
            .collect())
    }

    /// Starts a created container and reads agentctl's ready line from its output
    /// (attached before the start, so it cannot be missed).
    async fn start_and_read_ready(
        &self,
        docker: &Docker,
        id: &str,
        ready_timeout: std::time::Duration,
    ) -> Result<ReadyInfo, RuntimeError> {
        let attached = docker
            .attach_container(
                id,
                Some(AttachContainerOptions {
                    stdout: true,
                    stderr: true,
                    stream: true,
                    ..Default::default()
                }),
            )
            .await
            .map_err(engine_error)?;
        docker.start_container(id, None).await.map_err(engine_error)?;
        let mut output = attached.output;
        let mut line = Vec::new();
        let mut stderr = String::new();
        let read = async {
            while let Some(frame) = output.next().await {
                match frame {
                    Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
                        line.extend_from_slice(&message);
                        if line.contains(&b'\n') {
                            return true;
                        }
                    }
                    Ok(LogOutput::StdErr { message }) => {
                        stderr.push_str(&String::from_utf8_lossy(&message))
                    }
                    _ => {}
                }
            }
            false
        };
        let got_line = tokio::time::timeout(ready_timeout, read).await.unwrap_or(false);
        if !got_line {
            let tail: String =
                stderr.chars().rev().take(2000).collect::<Vec<_>>().into_iter().rev().collect();
            return Err(RuntimeError::Engine(format!(
                "agentctl in container {id} never became ready: {tail}"
            )));
        }
        let first = line.split(|&b| b == b'\n').next().unwrap_or_default();
        serde_json::from_slice(first).map_err(|err| {
            RuntimeError::Engine(format!("agentctl's ready line in {id} is malformed: {err}"))
        })
    }

    /// The engines to search for a session's containers: the one its handle names first
    /// (it must answer), then the others that answer.
    async fn engines_for(
        &self,
        handle: Option<&DockerHandle>,
    ) -> Result<Vec<(&Engine, Docker)>, RuntimeError> {
        let named = handle.and_then(|handle| self.engine_of(handle));
        // Every engine is asked at once; the named one first in the answer.
        let mut ordered: Vec<&Engine> = named.into_iter().collect();
        ordered.extend(
            self.engines.iter().filter(|engine| !named.is_some_and(|n| std::ptr::eq(n, *engine))),
        );
        let answers =
            futures_util::future::join_all(ordered.iter().map(|engine| self.reach(engine))).await;
        let mut found = Vec::new();
        for (index, (engine, answer)) in ordered.into_iter().zip(answers).enumerate() {
            match answer {
                Ok(docker) => found.push((engine, docker)),
                // The recorded engine must answer: nothing can be promised without it —
                // unless it was failed over (out of service): what runs there is fenced and
                // removed when it answers again, never adopted.
                Err(err) if index == 0 && named.is_some_and(|named| !self.is_closed(named)) => {
                    return Err(err);
                }
                Err(err) => tracing::debug!(%err, "not searched for the session's containers"),
            }
        }
        Ok(found)
    }
}

impl Runtime for DockerRuntime {
    fn name(&self) -> &str {
        "docker"
    }

    fn agent_home(&self) -> Option<PathBuf> {
        Some(PathBuf::from(CONTAINER_HOME))
    }

    fn resource_kind(&self) -> Option<&'static str> {
        Some("container")
    }

    fn places_by_labels(&self) -> bool {
        true
    }

    fn placement(&self, handle: Option<&serde_json::Value>) -> Option<String> {
        let handle = DockerHandle::parse(handle)?;
        Some(self.engine_of(&handle)?.config.name.clone())
    }

    fn places(&self) -> BoxFuture<'_, Vec<(String, Option<String>)>> {
        Box::pin(async move {
            let answers =
                futures_util::future::join_all(self.engines.iter().map(|e| self.reach(e))).await;
            self.engines
                .iter()
                .zip(answers)
                .map(|(engine, answer)| {
                    (engine.config.name.clone(), answer.err().map(|err| err.to_string()))
                })
                .collect()
        })
    }

    fn remove_stale<'a>(
        &'a self,
        place: &'a str,
        keep: &'a std::collections::BTreeSet<String>,
    ) -> BoxFuture<'a, Result<usize, RuntimeError>> {
        Box::pin(async move {
            let Some(engine) = self.engine_named(Some(place)) else { return Ok(0) };
            let docker = self.reach(engine).await?;
            let mut removed = 0;
            for container in self.list_ours(&docker, true).await? {
                let labels = container.labels.unwrap_or_default();
                let session = labels.get("tether.session_id").cloned().unwrap_or_default();
                if let Some(id) = container.id.filter(|_| !keep.contains(&session)) {
                    removed += usize::from(remove_container(&docker, &id).await?);
                }
            }
            for (volume, session) in self.volumes_of(&docker, None).await? {
                if !keep.contains(&session) {
                    removed += usize::from(remove_volume(&docker, &volume).await?);
                }
            }
            Ok(removed)
        })
    }

    fn set_closed(&self, places: std::collections::BTreeSet<String>) {
        *self.closed.write().unwrap_or_else(std::sync::PoisonError::into_inner) = places;
    }

    fn state_stays(&self, handle: Option<&serde_json::Value>) -> bool {
        DockerHandle::parse(handle)
            .and_then(|handle| self.engine_of(&handle))
            .is_some_and(|engine| engine.config.storage == Storage::Volumes)
    }

    fn remove_from<'a>(
        &'a self,
        session_id: &'a crate::ids::SessionId,
        handle: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<bool, RuntimeError>> {
        Box::pin(async move {
            let Some(engine) = DockerHandle::parse(Some(handle)).and_then(|h| self.engine_of(&h))
            else {
                return Ok(false);
            };
            let docker = self.reach(engine).await?;
            let mut removed = remove_container(&docker, &container_name(session_id)).await?;
            for (volume, _) in self.volumes_of(&docker, Some(session_id)).await? {
                removed |= remove_volume(&docker, &volume).await?;
            }
            Ok(removed)
        })
    }

    fn check(&self) -> BoxFuture<'_, Result<(), RuntimeError>> {
        Box::pin(async move {
            self.agentctl()?;
            // One engine that answers is enough here; placement picks among them. The
            // first answer decides, so an engine that does not answer costs nothing when
            // another does.
            let mut asked: futures_util::stream::FuturesUnordered<_> =
                self.engines.iter().map(|engine| self.reach(engine)).collect();
            let mut reasons = Vec::new();
            while let Some(answer) = asked.next().await {
                match answer {
                    Ok(_) => return Ok(()),
                    Err(err) => reasons.push(err.to_string()),
                }
            }
            Err(RuntimeError::Unavailable(reasons.join("; ")))
        })
    }

    fn copies_workspace(&self, handle: Option<&serde_json::Value>) -> bool {
        DockerHandle::parse(handle).is_some_and(|handle| match handle.copied {
            Some(copied) => copied,
            None => self
                .engine_of(&handle)
                .is_some_and(|engine| engine.config.workspace == WorkspaceMode::Copy),
        })
    }

    fn fetch_workspace<'a>(
        &'a self,
        handle: &'a serde_json::Value,
        path: &'a Path,
        to: &'a Path,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let handle = DockerHandle::parse(Some(handle))
                .ok_or_else(|| RuntimeError::Engine("not a container's handle".into()))?;
            let engine = self.engine_of(&handle).ok_or_else(|| {
                RuntimeError::Unavailable(format!("no engine {:?} in config.toml", handle.engine))
            })?;
            let docker = self.reach(engine).await?;
            archive::download(&docker, &handle.container, path, to).await
        })
    }

    fn reachable<'a>(
        &'a self,
        handle: Option<&'a serde_json::Value>,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            self.agentctl()?;
            match DockerHandle::parse(handle).and_then(|handle| self.serving_engine_of(&handle)) {
                Some(engine) => self.reach(engine).await.map(drop),
                None => self.check().await,
            }
        })
    }

    fn launch(&self, spec: LaunchSpec) -> BoxFuture<'_, Result<Endpoint, RuntimeError>> {
        Box::pin(async move {
            let agentctl = self.agentctl()?.to_owned();
            let engine = self.choose(&spec).await?;
            let _counted = engine.launching();
            let docker = self.reach(engine).await?;
            // One container per execution: its labels name the execution and generation
            // (checked at a re-attach), and labels cannot change, so a container left by an
            // earlier execution — stopped, or running with an agent we lost — is replaced.
            // What the agent keeps lives in the mounted state dirs, not in the container.
            remove_container(&docker, &container_name(&spec.session_id)).await?;
            // A sidecar reached across a network serves TLS with a certificate made for this
            // execution, which the supervisor pins.
            let tls = engine.config.sidecar_tls();
            let tls_material = tls.then(|| sidecar_certificate(engine.address)).transpose()?;
            // Its secrets: files in the mounted state dir, or copied into the container
            // below. The certificate (public) is kept in the state dir either way.
            let on_volumes = engine.config.storage == Storage::Volumes;
            let mut secrets = vec![("token", spec.token.clone(), 0o600)];
            if let Some((cert, key)) = &tls_material {
                secrets.push(("tls.crt", cert.clone(), 0o644));
                secrets.push(("tls.key", key.clone(), 0o600));
            }
            for (name, text, _) in &secrets {
                if !on_volumes || *name == "tls.crt" {
                    write_private(&spec.state_dir, name, text)?;
                }
            }
            let tls_cert = tls_material.map(|(cert, _)| cert);
            let (id, seed) = self.create(&docker, engine, &spec, &agentctl, tls).await?;
            if seed
                && let Some(from) = &spec.seed
                && let Err(err) = archive::upload_seed(&docker, &id, from, &spec.workspace).await
            {
                forget_workspace(&docker, &spec.session_id).await;
                return Err(err);
            }
            if on_volumes {
                // Nothing of the supervisor's host is mounted: agentctl and its secrets are
                // copied in before the start.
                let archive = entrypoint_archive(&agentctl, &secrets)?;
                let options = UploadToContainerOptions { path: "/".into(), ..Default::default() };
                docker
                    .upload_to_container(&id, Some(options), bollard::body_full(archive.into()))
                    .await
                    .map_err(engine_error)?;
            }
            let ready = self.start_and_read_ready(&docker, &id, spec.ready_timeout).await?;
            let inspected = docker
                .inspect_container(&id, None::<InspectContainerOptions>)
                .await
                .map_err(engine_error)?;
            let host_port = inspected
                .network_settings
                .and_then(|settings| settings.ports)
                .and_then(|ports| ports.get(&format!("{CONTAINER_PORT}/tcp")).cloned().flatten())
                .and_then(|bindings| bindings.into_iter().find_map(|binding| binding.host_port))
                .and_then(|port| port.parse::<u16>().ok())
                .ok_or_else(|| {
                    RuntimeError::Engine(format!("container {id} has no published control port"))
                })?;
            let copied = engine.config.workspace == WorkspaceMode::Copy;
            let handle = DockerHandle {
                engine: Some(engine.config.name.clone()),
                container: id,
                copied: Some(copied),
            };
            let workspace = (!on_volumes && !copied).then_some(spec.workspace.as_path());
            let agent_user = match &spec.docker.image {
                Some(image) => non_root_user(&docker, image, workspace).await,
                None => None,
            };
            Ok(Endpoint {
                agent_user,
                addr: SocketAddr::new(engine.address, host_port).into(),
                ready,
                handle: serde_json::to_value(handle)
                    .map_err(|err| RuntimeError::Engine(err.to_string()))?,
                tls_cert,
                owned_dirs: if copied { vec![spec.workspace.clone()] } else { Vec::new() },
            })
        })
    }

    fn liveness<'a>(
        &'a self,
        executions: &'a [ExecutionRow],
        _boot_id: &'a str,
    ) -> BoxFuture<'a, HashMap<crate::ids::SessionId, Liveness>> {
        Box::pin(async move {
            // One list per engine the executions name, not an inspect per container; the
            // engines are asked together, so one that does not answer costs its timeout once.
            let named: Vec<&Engine> = self
                .engines
                .iter()
                .filter(|engine| {
                    executions.iter().any(|execution| {
                        DockerHandle::parse(execution.runtime_handle.as_ref())
                            .and_then(|handle| self.engine_of(&handle))
                            .is_some_and(|of| std::ptr::eq(of, *engine))
                    })
                })
                .collect();
            let listed = futures_util::future::join_all(named.iter().map(|engine| async move {
                self.running_on(engine).await.map_err(|err| err.to_string())
            }))
            .await;
            let running: HashMap<&str, Result<HashMap<String, ContainerExecution>, String>> =
                named.iter().map(|engine| engine.config.name.as_str()).zip(listed).collect();
            let mut found = HashMap::new();
            for execution in executions {
                let handle = DockerHandle::parse(execution.runtime_handle.as_ref());
                let engine = handle.as_ref().and_then(|handle| self.engine_of(handle));
                let liveness = match (handle, engine) {
                    (Some(handle), Some(engine)) => match &running[engine.config.name.as_str()] {
                        Err(reason) => Liveness::Unreachable(reason.clone()),
                        Ok(containers) => match containers.get(&handle.container) {
                            Some(labels) if labels.is_current(execution) => Liveness::Alive,
                            Some(labels) => Liveness::Stale(format!(
                                "its container is labelled generation {:?} of execution {}; generation {} of {} is recorded",
                                labels.generation,
                                labels.execution_id.as_deref().unwrap_or("(none)"),
                                execution.generation,
                                execution.execution_id
                            )),
                            None => Liveness::Dead,
                        },
                    },
                    _ => Liveness::Dead,
                };
                found.insert(execution.session_id.clone(), liveness);
            }
            found
        })
    }

    fn exit_reason<'a>(&'a self, execution: &'a ExecutionRow) -> BoxFuture<'a, Option<String>> {
        Box::pin(async move {
            let handle = DockerHandle::parse(execution.runtime_handle.as_ref())?;
            let engine = self.engine_of(&handle)?;
            let docker = match self.reach(engine).await {
                Ok(docker) => docker,
                Err(err) => return Some(err.to_string()),
            };
            let state = docker
                .inspect_container(&handle.container, None::<InspectContainerOptions>)
                .await
                .ok()?
                .state?;
            if state.oom_killed == Some(true) {
                return Some("the container was killed for running out of memory (OOM)".into());
            }
            match (state.running, state.exit_code) {
                (Some(false), Some(code)) => {
                    Some(format!("the container stopped (exit code {code})"))
                }
                _ => None,
            }
        })
    }

    fn fence<'a>(&'a self, target: &'a FenceTarget) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let handle = target
                .execution
                .as_ref()
                .and_then(|execution| DockerHandle::parse(execution.runtime_handle.as_ref()));
            // The recorded engine must answer (else nothing can be promised); a launch cut
            // short before it was recorded may have left a container on any other.
            let engines = self.engines_for(handle.as_ref()).await?;
            let name = container_name(&target.session_id);
            for (index, (engine, docker)) in engines.iter().enumerate() {
                if index == 0 && !target.grace.is_zero() {
                    // A container whose agentctl is shutting down stops by itself.
                    let mut waited = docker.wait_container(&name, None::<WaitContainerOptions>);
                    let _ = tokio::time::timeout(target.grace, waited.next()).await;
                }
                kill_container(docker, &engine.config.name, &name).await?;
            }
            Ok(())
        })
    }

    fn remove<'a>(
        &'a self,
        session_id: &'a crate::ids::SessionId,
        handle: Option<&'a serde_json::Value>,
    ) -> BoxFuture<'a, Result<bool, RuntimeError>> {
        Box::pin(async move {
            let handle = DockerHandle::parse(handle);
            let mut removed = false;
            for (_, docker) in self.engines_for(handle.as_ref()).await? {
                removed |= remove_container(&docker, &container_name(session_id)).await?;
                // Its state volumes (an engine with `storage = "volumes"`), after the
                // container that used them.
                for (volume, _) in self.volumes_of(&docker, Some(session_id)).await? {
                    removed |= remove_volume(&docker, &volume).await?;
                }
            }
            Ok(removed)
        })
    }

    fn orphans(&self) -> BoxFuture<'_, OrphanScan> {
        Box::pin(async move {
            let mut scan = OrphanScan::default();
            // The engines are asked together: one that does not answer costs its timeout once.
            let answers = futures_util::future::join_all(
                self.engines.iter().map(|engine| self.reach(engine)),
            )
            .await;
            for (engine, answer) in self.engines.iter().zip(answers) {
                let listed = match &answer {
                    Ok(docker) => self.list_ours(docker, true).await,
                    Err(err) => Err(RuntimeError::Unavailable(err.to_string())),
                };
                match listed {
                    Ok(containers) => {
                        for container in containers {
                            let Some(id) = container.id else { continue };
                            let session_id = container
                                .labels
                                .as_ref()
                                .and_then(|labels| labels.get("tether.session_id"))
                                .map(|id| SessionId::from(id.as_str()));
                            let handle = DockerHandle {
                                engine: Some(engine.config.name.clone()),
                                container: id.clone(),
                                copied: Some(engine.config.workspace == WorkspaceMode::Copy),
                            };
                            scan.found.push(Orphan {
                                session_id,
                                location: format!("{}/{id}", engine.config.name),
                                handle: serde_json::to_value(handle).unwrap_or_default(),
                            });
                        }
                    }
                    Err(err) => {
                        scan.unreachable.push(err.to_string());
                        continue;
                    }
                }
                // Volumes after containers: a volume is removed once nothing uses it.
                let Ok(docker) = answer else { continue };
                match self.volumes_of(&docker, None).await {
                    Ok(volumes) => {
                        for (volume, session_id) in volumes {
                            let handle = serde_json::json!({
                                "engine": engine.config.name,
                                "volume": volume,
                            });
                            scan.found.push(Orphan {
                                session_id: (!session_id.is_empty()).then(|| session_id.into()),
                                location: format!("{}/volume {volume}", engine.config.name),
                                handle,
                            });
                        }
                    }
                    Err(err) => scan.unreachable.push(err.to_string()),
                }
            }
            scan
        })
    }

    fn remove_orphan<'a>(&'a self, orphan: &'a Orphan) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let text = |key: &str| orphan.handle.get(key).and_then(|value| value.as_str());
            let engine = self.engine_named(text("engine")).ok_or_else(|| {
                RuntimeError::Engine(format!("no engine named {:?}", text("engine")))
            })?;
            let docker = self.reach(engine).await?;
            tracing::info!(orphan = %orphan.location, session = ?orphan.session_id.as_deref(), "removing an orphan");
            match (text("container"), text("volume")) {
                (Some(container), _) => remove_container(&docker, container).await.map(drop),
                (_, Some(volume)) => remove_volume(&docker, volume).await.map(drop),
                _ => Err(RuntimeError::Engine(format!("not an orphan of ours: {}", orphan.handle))),
            }
        })
    }
}

/// Removes a container (by id or name), with its anonymous volumes, running or not;
/// whether there was one.
async fn remove_container(docker: &Docker, container: &str) -> Result<bool, RuntimeError> {
    let options = RemoveContainerOptions { force: true, v: true, ..Default::default() };
    match docker.remove_container(container, Some(options)).await {
        Ok(()) => Ok(true),
        Err(err) if is_not_found(&err) => Ok(false),
        Err(err) => Err(engine_error(err)),
    }
}

/// Removes a named volume; whether there was one.
/// A copied workspace's volume that was made but not filled is removed (its container
/// first), so that the next launch makes and fills it again; best effort.
async fn forget_workspace(docker: &Docker, session_id: &SessionId) {
    let _ = remove_container(docker, &container_name(session_id)).await;
    let volume = format!("tether-{session_id}-workspace");
    if let Err(err) = remove_volume(docker, &volume).await {
        tracing::warn!(session = %session_id, %err, "an unfilled workspace volume is left: its next launch finds it empty");
    }
}

async fn remove_volume(docker: &Docker, volume: &str) -> Result<bool, RuntimeError> {
    match docker.remove_volume(volume, None::<RemoveVolumeOptions>).await {
        Ok(()) => Ok(true),
        Err(err) if is_not_found(&err) => Ok(false),
        Err(err) => Err(engine_error(err)),
    }
}

/// Kills a session's container on an engine if it runs (it is kept, stopped, for a fast
/// resume), and waits until the engine reports it stopped.
async fn kill_container(docker: &Docker, engine: &str, name: &str) -> Result<(), RuntimeError> {
    match docker.inspect_container(name, None::<InspectContainerOptions>).await {
        Ok(container) if container.state.as_ref().and_then(|s| s.running) == Some(true) => {}
        Ok(_) => return Ok(()),
        Err(err) if is_not_found(&err) => return Ok(()),
        Err(err) => return Err(engine_error(err)),
    }
    tracing::warn!(container = %name, %engine, "fencing a container: kill");
    match docker.kill_container(name, None::<KillContainerOptions>).await {
        Ok(()) => {}
        // Not running any more (409) or gone (404): dead either way.
        Err(err) if is_not_found(&err) || is_conflict(&err) => return Ok(()),
        Err(err) => return Err(engine_error(err)),
    }
    // Killing is asynchronous in the engine: wait until it reports the container stopped.
    let mut waited = docker.wait_container(name, None::<WaitContainerOptions>);
    match tokio::time::timeout(super::FENCE_TIMEOUT, waited.next()).await {
        Ok(_) => Ok(()),
        Err(_) => Err(RuntimeError::Engine(format!(
            "container {name} on {engine} did not stop within {:?} of a kill",
            super::FENCE_TIMEOUT
        ))),
    }
}

fn is_conflict(err: &bollard::errors::Error) -> bool {
    matches!(err, bollard::errors::Error::DockerResponseServerError { status_code: 409, .. })
}

/// Who a container's agent runs as when its profile names no one: the image's own `USER`
/// when that is not root, else — for a workspace bind-mounted from this host — its owner
/// when that is not root (what the agent writes keeps that owner), else root (`None`).
async fn non_root_user(docker: &Docker, image: &str, workspace: Option<&Path>) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let is_root =
        |user: &str| user.is_empty() || matches!(user.split(':').next(), Some("0" | "root"));
    let image_user = match docker.inspect_image(image).await {
        Ok(inspected) => inspected.config.and_then(|config| config.user),
        Err(err) => {
            tracing::warn!(%image, %err, "cannot read the image's user");
            None
        }
    };
    if let Some(user) = image_user.filter(|user| !is_root(user)) {
        return Some(user);
    }
    let owner = std::fs::metadata(workspace?).ok()?;
    (owner.uid() != 0).then(|| format!("{}:{}", owner.uid(), owner.gid()))
}

#[cfg(test)]
mod tests {
    use super::{DockerConfig, DockerRuntime, EngineConfig, WorkspaceMode};
    use crate::runtime::Runtime;

    fn engine(name: &str, workspace: WorkspaceMode) -> EngineConfig {
        EngineConfig { name: name.into(), workspace, ..EngineConfig::default_engine() }
    }

    /// Whether a session's workspace was copied to its engine is what its execution's
    /// handle says (recorded at launch), not the engine's config now: an engine taken out
    /// of config.toml, or switched to mounting, leaves its copied sessions copied (they
    /// go on only on an engine that copies, from their checkpoints).
    #[test]
    fn a_copied_workspace_stays_copied_when_its_engine_is_no_longer_configured_so() {
        let runtime = DockerRuntime::new(DockerConfig {
            agentctl: None,
            searched: Vec::new(),
            install_id: "test".into(),
            engines: vec![engine("a", WorkspaceMode::Mount), engine("c", WorkspaceMode::Copy)],
        });
        let handle = |engine: &str, copied: Option<bool>| {
            let mut handle = serde_json::json!({"engine": engine, "container": "x"});
            if let Some(copied) = copied {
                handle["copied"] = copied.into();
            }
            handle
        };
        // Recorded copied: on an engine gone from config, or one that mounts now.
        assert!(runtime.copies_workspace(Some(&handle("gone", Some(true)))));
        assert!(runtime.copies_workspace(Some(&handle("a", Some(true)))));
        // Recorded mounted: on an engine that copies now (its next launch fills the new
        // volume from the directory, not from an older checkpoint).
        assert!(!runtime.copies_workspace(Some(&handle("c", Some(false)))));
        // Not recorded (rows from before): the engine's config says.
        assert!(runtime.copies_workspace(Some(&handle("c", None))));
        assert!(!runtime.copies_workspace(Some(&handle("a", None))));
        assert!(!runtime.copies_workspace(Some(&handle("gone", None))));
        assert!(!runtime.copies_workspace(None));
        // Written either way.
        let mounted = super::DockerHandle {
            engine: Some("a".into()),
            container: "x".into(),
            copied: Some(false),
        };
        assert_eq!(serde_json::to_value(mounted).unwrap(), handle("a", Some(false)));
    }
}
