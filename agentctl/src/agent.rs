//! The one agent process agentctl owns: spawning it, relaying its stdio into the spool,
//! serving its `fs/*` requests, and stopping it so that no descendant survives.
//!
//! Process hygiene, and why each piece is there:
//! - The agent leads its own process group, so one signal reaches everything it starts
//!   (unless a descendant leaves the group on purpose).
//! - `PR_SET_PDEATHSIG(SIGKILL)` is set in the child before exec. The signal follows the
//!   *thread* that forked, so every spawn happens on one dedicated thread that lives as long
//!   as the [`AgentHost`]; a `getppid` check closes the race where agentctl died before the
//!   prctl took effect.
//! - A guard process (`agentctl guard`) joins the agent's group holding the read end of a
//!   pipe whose write end only agentctl has. When agentctl dies, even by SIGKILL, the pipe
//!   reads EOF and the guard SIGKILLs the whole group — grandchildren included, which the
//!   parent-death signal alone would leave behind. It ignores SIGTERM so that it outlives the
//!   polite stop steps.
//! - agentctl is a child subreaper (set in `main`): descendants that leave the group and
//!   are orphaned come back to it, and [`AgentHost::stop`] kills and reaps them.
//!
//! Stop: close stdin → grace → SIGTERM to the group → grace → SIGKILL to the group; then
//! the guard pipe is closed (the guard kills what is left of the group) and escaped
//! descendants are killed and reaped.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use protocol::control::{AgentState, EventKind, ExitInfo, StartAgent, Status, StopStage, Stopped};
use protocol::frame::{self, Inspected, Line, LineReader, Relayed, Shape};
use protocol::{Id, Message, Response};
use serde_json::Value;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::{mpsc, oneshot, watch};

use crate::fs::{self, Roots};
use crate::process;
use crate::spool::{Spool, SpoolError};
use crate::stderr::StderrTail;

/// How long, after the agent exits, its output pipes may take to drain before
/// `agent_exited` is emitted anyway (a descendant may hold them open forever).
pub const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// How long the agent may live on after closing its stdout before `stdout_closed` is
/// spooled (an agent that exits meanwhile gets only `agent_exited`).
pub const STDOUT_CLOSED_GRACE: Duration = Duration::from_secs(2);

/// Errors from agent operations, each mapped to a JSON-RPC error by the server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// `agent.start` was already called: one agentctl owns one agent.
    #[error("the agent was already started")]
    AlreadyStarted,
    /// No agent was started yet.
    #[error("no agent has been started")]
    NotStarted,
    /// The agent is not running (it exited, or is being stopped).
    #[error("the agent is not running")]
    NotRunning,
    /// The message given to `acp.send` is not one JSON-RPC message.
    #[error("not a JSON-RPC message: {0}")]
    InvalidMessage(String),
    /// The working directory or a root is unusable.
    #[error("workspace root {path}: {source}")]
    Root {
        /// The root.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The program could not be started.
    #[error("cannot start {command}: {source}")]
    Spawn {
        /// The program.
        command: String,
        /// Why.
        source: io::Error,
    },
    /// The user the agent should run as cannot be used.
    #[error("cannot run the agent as user {user:?}: {reason}")]
    User {
        /// The `process.user` given.
        user: String,
        /// Why.
        reason: String,
    },
    /// The agent's egress proxy could not listen.
    #[error("cannot start the agent's egress proxy on {}: {source}", socket.display())]
    Egress {
        /// Its socket.
        socket: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The spool failed.
    #[error(transparent)]
    Spool(#[from] SpoolError),
}

/// Gives `path` and everything under it to `uid:gid` (symlinks themselves, never what they
/// point at).
fn give(path: &Path, uid: nix::unistd::Uid, gid: nix::unistd::Gid) -> io::Result<()> {
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        path,
        Some(uid),
        Some(gid),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(io::Error::from)?;
    if std::fs::symlink_metadata(path)?.is_dir() {
        for entry in std::fs::read_dir(path)? {
            give(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// Who the agent runs as: a profile's `process.user`, resolved on this host (or in this
/// container).
#[derive(Debug, Clone)]
struct RunAs {
    uid: nix::unistd::Uid,
    gid: nix::unistd::Gid,
    groups: Vec<nix::unistd::Gid>,
    /// The user's name and home, when `/etc/passwd` knows it.
    account: Option<(String, PathBuf)>,
}

impl RunAs {
    /// `spec`: a name, a uid, or `uid:gid`. Changing user takes root.
    fn resolve(spec: &str) -> Result<RunAs, AgentError> {
        use nix::unistd::{Gid, Uid, User};
        let refuse = |reason: String| AgentError::User { user: spec.to_owned(), reason };
        if !nix::unistd::geteuid().is_root() {
            return Err(refuse(format!(
                "agentctl runs as uid {}, and only root can start a process as another user",
                nix::unistd::geteuid()
            )));
        }
        let lookup = |found: nix::Result<Option<User>>| {
            found.map_err(|err| refuse(format!("cannot read the user database: {err}")))
        };
        // A number needs no user database (an image may have none).
        let by_uid = |uid: Uid| User::from_uid(uid).ok().flatten();
        let (uid, gid, user) = match spec.split_once(':') {
            Some((uid, gid)) => {
                let uid: u32 = uid.parse().map_err(|_| refuse("uid:gid must be numbers".into()))?;
                let gid: u32 = gid.parse().map_err(|_| refuse("uid:gid must be numbers".into()))?;
                (Uid::from_raw(uid), Gid::from_raw(gid), by_uid(Uid::from_raw(uid)))
            }
            None => match spec.parse::<u32>() {
                Ok(uid) => {
                    let user = by_uid(Uid::from_raw(uid));
                    let gid = user.as_ref().map_or(Gid::from_raw(uid), |user| user.gid);
                    (Uid::from_raw(uid), gid, user)
                }
                Err(_) => {
                    let user = lookup(User::from_name(spec))?
                        .ok_or_else(|| refuse("no such user here".into()))?;
                    (user.uid, user.gid, Some(user))
                }
            },
        };
        let groups = match &user {
            Some(user) => {
                let name = std::ffi::CString::new(user.name.as_bytes())
                    .map_err(|_| refuse("a NUL in the user's name".into()))?;
                nix::unistd::getgrouplist(&name, gid).unwrap_or_else(|err| {
                    tracing::warn!(user = %spec, %err, "cannot list the user's groups; its own only");
                    vec![gid]
                })
            }
            None => vec![gid],
        };
        let account = user.map(|user| (user.name, user.dir));
        Ok(RunAs { uid, gid, groups, account })
    }
}

/// The agent's command as `params` and `run_as` say: its own process group, the daemon's
/// variables removed, armed to die with agentctl, and given the egress socket's
/// descriptor `egress_fd` (see [`give_egress_fd`]).
fn agent_command(
    params: &StartAgent,
    run_as: Option<RunAs>,
    egress_fd: Option<std::os::fd::RawFd>,
) -> Command {
    let mut command = Command::new(&params.command);
    if let Some((name, home)) = run_as.as_ref().and_then(|run_as| run_as.account.as_ref()) {
        // The user's own, unless the profile says otherwise.
        command.env("HOME", home).env("USER", name).env("LOGNAME", name);
    }
    command
        .args(&params.args)
        .envs(&params.env)
        .env_remove(protocol::control::TOKEN_ENV)
        .current_dir(&params.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    for name in protocol::control::DAEMON_ONLY_ENV {
        command.env_remove(name);
    }
    let parent = std::process::id();
    let isolate = params.isolate_network;
    // SAFETY: the closure runs between fork and exec and only makes syscalls (unshare,
    // socket, ioctl, close, setgroups, setgid, setuid, prctl, getppid), all
    // async-signal-safe; it allocates nothing on success (the groups were listed before
    // the fork).
    unsafe {
        command.pre_exec(move || {
            if isolate {
                isolate_network()?;
            }
            if let Some(run_as) = &run_as {
                // Groups, then gid, then uid (after which none could change). The
                // parent-death signal is armed after: changing user clears it.
                nix::unistd::setgroups(&run_as.groups).map_err(io::Error::from)?;
                nix::unistd::setgid(run_as.gid).map_err(io::Error::from)?;
                nix::unistd::setuid(run_as.uid).map_err(io::Error::from)?;
            }
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
            if let Some(fd) = egress_fd {
                give_egress_fd(fd)?;
            }
            if nix::unistd::getppid().as_raw() as u32 != parent {
                // agentctl died before the parent-death signal was armed.
                return Err(io::Error::other("agentctl exited during spawn"));
            }
            Ok(())
        });
    }
    command
}

/// Moves the calling (forked) process into a network namespace of its own with its
/// loopback up, then drops the capabilities that did it from the bounding set, so that the
/// agent — even as root — cannot make or leave namespaces (a container's agentctl, which
/// holds them for this). Between fork and exec: syscalls only.
fn isolate_network() -> io::Result<()> {
    use nix::libc;
    let check =
        |result: libc::c_int| if result < 0 { Err(io::Error::last_os_error()) } else { Ok(result) };
    // SAFETY: plain syscalls on this process and a socket it owns, closed before return;
    // `ifreq` is a C struct, valid zeroed.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNET))?;
        let socket = check(libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0))?;
        let mut request: libc::ifreq = std::mem::zeroed();
        request.ifr_name[0] = b'l' as libc::c_char;
        request.ifr_name[1] = b'o' as libc::c_char;
        let up = check(libc::ioctl(socket, libc::SIOCGIFFLAGS, &mut request)).and_then(|_| {
            request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            check(libc::ioctl(socket, libc::SIOCSIFFLAGS, &request))
        });
        libc::close(socket);
        up?;
        // CAP_NET_ADMIN and CAP_SYS_ADMIN (linux/capability.h).
        for capability in [12 as libc::c_ulong, 21] {
            check(libc::prctl(libc::PR_CAPBSET_DROP, capability, 0, 0, 0))?;
        }
    }
    Ok(())
}

/// Puts the egress socket's `O_PATH` descriptor `fd` at
/// [`protocol::control::EGRESS_FD`], kept across the exec. Between fork and exec: syscalls
/// only.
fn give_egress_fd(fd: std::os::fd::RawFd) -> io::Result<()> {
    use nix::fcntl::{FcntlArg, FdFlag, fcntl};
    let target = protocol::control::EGRESS_FD;
    // SAFETY: `fd` is open for the whole spawn (its proxy outlives it); the descriptor at
    // `target` in this child is one of agentctl's, all close-on-exec, replaced here.
    let given = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    if fd == target {
        fcntl(given, FcntlArg::F_SETFD(FdFlag::empty())).map_err(io::Error::from)?;
    } else {
        // SAFETY: as above; the duplicate must stay open, so it is not dropped.
        let duplicate = unsafe { nix::unistd::dup2_raw(given, target) }.map_err(io::Error::from)?;
        std::mem::forget(duplicate);
    }
    Ok(())
}

/// Settings for the agent host.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The longest stdout line accepted from the agent.
    pub max_line: usize,
    /// The argv prefix that runs agentctl (`<prefix> guard --pgid N` is the guard): its
    /// own binary, or a binary that embeds it as an applet (`supervisor agentctl`).
    pub self_command: Vec<std::ffi::OsString>,
    /// The most the spool may hold on disk before the agent's output waits for
    /// acknowledgements (flow control: the agent blocks on its pipe meanwhile).
    pub max_backlog: u64,
}

/// Owns the agent. Shared behind an `Arc` by the control server.
#[derive(Debug)]
pub struct AgentHost {
    spool: Arc<Spool>,
    config: HostConfig,
    spawner: Spawner,
    /// A std mutex: held for short state changes, never across an await.
    state: Mutex<HostState>,
    exit_tx: watch::Sender<Option<ExitInfo>>,
    /// The supervisor asked to hold the agent's output (`intake.hold`).
    hold_tx: watch::Sender<bool>,
    /// Where the agent's `fs/*` requests may reach: its `cwd` and `extra_roots`, until
    /// `workspace.bind` names a session's (a warm agent started before its session).
    roots: Arc<std::sync::RwLock<Arc<Roots>>>,
}

#[derive(Debug)]
enum HostState {
    NotStarted,
    /// `agent.start` is spawning: a second, concurrent `agent.start` is refused rather than
    /// spawning a second agent.
    Starting,
    Started(Running),
}

#[derive(Debug)]
struct Running {
    pid: u32,
    /// Dropping it closes the agent's stdin once queued lines are written.
    stdin_tx: Option<mpsc::UnboundedSender<Vec<u8>>>,
    guard: Option<std::process::Child>,
    /// The write end of the guard's pipe; closing it makes the guard kill the group.
    guard_pipe: Option<OwnedFd>,
    /// The agent's egress proxy, for as long as agentctl lives.
    _egress: Option<crate::egress::EgressProxy>,
}

impl AgentHost {
    /// A host that will spawn from a dedicated thread on `runtime`.
    pub fn new(
        spool: Arc<Spool>,
        config: HostConfig,
        runtime: tokio::runtime::Handle,
    ) -> AgentHost {
        AgentHost {
            spool,
            config,
            spawner: Spawner::start(runtime),
            state: Mutex::new(HostState::NotStarted),
            exit_tx: watch::channel(None).0,
            hold_tx: watch::channel(false).0,
            roots: Arc::new(std::sync::RwLock::new(Arc::new(Roots::default()))),
        }
    }

    /// Confines the agent's `fs/*` requests to `cwd` and `extra_roots` from now on (a warm
    /// agent's session was decided after it started).
    pub fn bind_workspace(&self, cwd: &Path, extra_roots: &[PathBuf]) -> Result<(), AgentError> {
        let roots = checked_roots(cwd, extra_roots)?;
        *self.roots.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(roots);
        tracing::info!(cwd = %cwd.display(), "the agent's workspace is bound");
        Ok(())
    }

    /// Holds the agent's output (its stdout is not read until released) or releases it.
    pub fn hold_intake(&self, hold: bool) {
        if self.hold_tx.send_replace(hold) != hold {
            tracing::info!(hold, "the supervisor asked to hold the agent's output");
        }
    }

    /// Starts the agent. Returns its pid and the seq of its `agent_started` event.
    pub async fn start(&self, params: StartAgent) -> Result<(u32, u64), AgentError> {
        {
            // Check and claim in one critical section: two concurrent calls must not both
            // pass the check and both spawn.
            let mut state = self.lock();
            if !matches!(*state, HostState::NotStarted) {
                return Err(AgentError::AlreadyStarted);
            }
            *state = HostState::Starting;
        }
        let started = self.spawn_agent(params).await;
        if started.is_err() {
            *self.lock() = HostState::NotStarted;
        }
        started
    }

    async fn spawn_agent(&self, params: StartAgent) -> Result<(u32, u64), AgentError> {
        let roots = checked_roots(&params.cwd, &params.extra_roots)?;

        let run_as = params.user.as_deref().map(RunAs::resolve).transpose()?;
        let identity = run_as.as_ref().map(|run_as| {
            Arc::new(fs::Identity {
                uid: run_as.uid,
                gid: run_as.gid,
                groups: run_as.groups.clone(),
            })
        });
        if let (Some(run_as), Some(user)) = (&run_as, &params.user) {
            for dir in &params.owned_dirs {
                give(dir, run_as.uid, run_as.gid).map_err(|err| AgentError::User {
                    user: user.clone(),
                    reason: format!("cannot give it {}: {err}", dir.display()),
                })?;
            }
        }
        // Listening before the agent starts: its first connection finds it.
        let egress = params.egress.as_ref().map(|egress| self.start_egress(egress)).transpose()?;
        let egress_fd =
            egress.as_ref().map(|proxy| std::os::fd::AsRawFd::as_raw_fd(&proxy.path_fd()));
        let command = agent_command(&params, run_as, egress_fd);
        let mut child = self
            .spawner
            .spawn(command)
            .await
            .map_err(|source| AgentError::Spawn { command: params.command.clone(), source })?;
        let pid = child.id().expect("UNWRAP: a just-spawned child has a pid");
        let (guard, guard_pipe) = match self.spawn_guard(pid) {
            Ok((guard, pipe)) => (Some(guard), Some(pipe)),
            Err(err) => {
                tracing::error!(%err, "cannot start the guard; the agent's group will not be killed if agentctl dies");
                self.spool.append(EventKind::Error {
                    message: format!("cannot start the process-group guard: {err}"),
                })?;
                (None, None)
            }
        };
        let seq = self.spool.append(EventKind::AgentStarted {
            pid,
            command: params.command.clone(),
            args: params.args.clone(),
        })?;

        let (stdin_tx, stdin_rx) = mpsc::unbounded_channel();
        let stdin = child.stdin.take().expect("UNWRAP: stdin is piped");
        let stdout = child.stdout.take().expect("UNWRAP: stdout is piped");
        let stderr = child.stderr.take().expect("UNWRAP: stderr is piped");
        tokio::spawn(write_stdin(stdin, stdin_rx, Arc::clone(&self.spool)));
        let tail = Arc::new(Mutex::new(StderrTail::default()));
        // Cancelled when the agent's process has exited (before its pipes are drained).
        let exited = tokio_util::sync::CancellationToken::new();
        let relay = Relay {
            spool: Arc::clone(&self.spool),
            roots: {
                let mut bound =
                    self.roots.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                *bound = Arc::new(roots);
                Arc::clone(&self.roots)
            },
            identity,
            stdin_tx: stdin_tx.downgrade(),
            max_line: self.config.max_line,
            exited: exited.clone(),
            held: self.hold_tx.subscribe(),
            max_backlog: self.config.max_backlog,
        };
        let stdout_task = tokio::spawn(relay.run(stdout));
        let exited_by = exited;
        let stderr_task = tokio::spawn(read_stderr(
            stderr,
            Arc::clone(&self.spool),
            Arc::clone(&tail),
            self.config.max_line,
        ));
        tokio::spawn(watch_exit(
            child,
            exited_by,
            stdout_task,
            stderr_task,
            tail,
            Arc::clone(&self.spool),
            self.exit_tx.clone(),
        ));

        *self.lock() = HostState::Started(Running {
            pid,
            stdin_tx: Some(stdin_tx),
            guard,
            guard_pipe,
            _egress: egress,
        });
        Ok((pid, seq))
    }

    /// Starts the agent's egress proxy; each refusal it reports becomes an event.
    fn start_egress(
        &self,
        egress: &protocol::control::Egress,
    ) -> Result<crate::egress::EgressProxy, AgentError> {
        let allowlist = protocol::allowlist::Allowlist::parse(&egress.allow).map_err(|err| {
            AgentError::Egress { socket: egress.socket.clone(), source: io::Error::other(err) }
        })?;
        let (refused, mut refusals) = mpsc::unbounded_channel();
        let proxy = crate::egress::EgressProxy::start(&egress.socket, allowlist, refused)
            .map_err(|source| AgentError::Egress { socket: egress.socket.clone(), source })?;
        let spool = Arc::clone(&self.spool);
        tokio::spawn(async move {
            while let Some(refusal) = refusals.recv().await {
                tracing::info!(target = %refusal.target, "egress refused");
                let crate::egress::Refusal { target, reason } = refusal;
                if let Err(err) = spool.append(EventKind::EgressRefused { target, reason }) {
                    tracing::warn!(%err, "cannot record an egress refusal");
                }
            }
        });
        Ok(proxy)
    }

    fn spawn_guard(&self, pgid: u32) -> io::Result<(std::process::Child, OwnedFd)> {
        use std::os::unix::process::CommandExt;
        let (read_end, write_end) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        let (program, prefix) = self
            .config
            .self_command
            .split_first()
            .ok_or_else(|| io::Error::other("no command to run agentctl"))?;
        let guard = std::process::Command::new(program)
            .args(prefix)
            .args(["guard", "--pgid", &pgid.to_string()])
            .stdin(Stdio::from(read_end))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(pgid as i32)
            .spawn()?;
        Ok((guard, write_end))
    }

    /// Queues one JSON-RPC message for the agent's stdin.
    pub fn send(&self, message: &Value) -> Result<(), AgentError> {
        let mut line = serde_json::to_vec(message).expect("UNWRAP: a Value always serialises");
        match frame::inspect(&line) {
            Inspected::Valid(..) => {}
            Inspected::Invalid(invalid) => {
                return Err(AgentError::InvalidMessage(invalid.reason.to_string()));
            }
            Inspected::Blank => return Err(AgentError::InvalidMessage("empty message".into())),
        }
        line.push(b'\n');
        if self.exit_tx.borrow().is_some() {
            return Err(AgentError::NotRunning);
        }
        let guard = self.lock();
        let tx = match &*guard {
            HostState::NotStarted | HostState::Starting => return Err(AgentError::NotStarted),
            HostState::Started(Running { stdin_tx: Some(tx), .. }) => tx,
            HostState::Started(_) => return Err(AgentError::NotRunning),
        };
        // A request is recorded as delivered before it is queued (under the state lock, so
        // deliveries are spooled in the order they are queued).
        if let (Some(_), Some(id)) = (message.get("method"), message.get("id")) {
            self.spool.append(EventKind::Delivered { id: id.clone() })?;
        }
        tx.send(line).map_err(|_| AgentError::NotRunning)
    }

    /// Stops the agent: EOF, then SIGTERM, then SIGKILL, `grace` apart; then removes every
    /// descendant that is left.
    pub async fn stop(&self, grace: Duration) -> Result<Stopped, AgentError> {
        let pid = match &mut *self.lock() {
            HostState::NotStarted | HostState::Starting => return Err(AgentError::NotStarted),
            HostState::Started(running) => {
                running.stdin_tx = None;
                running.pid
            }
        };
        let mut exit_rx = self.exit_tx.subscribe();
        let stage = if exit_rx.borrow().is_some() {
            StopStage::AlreadyExited
        } else if wait_exit(&mut exit_rx, Some(grace)).await {
            StopStage::Eof
        } else {
            let _ = process::signal_group(pid, Signal::SIGTERM);
            if wait_exit(&mut exit_rx, Some(grace)).await {
                StopStage::Sigterm
            } else {
                let _ = process::signal_group(pid, Signal::SIGKILL);
                wait_exit(&mut exit_rx, None).await;
                StopStage::Sigkill
            }
        };
        self.remove_descendants().await;
        let status =
            exit_rx.borrow().expect("UNWRAP: the waits above end only once the exit is known");
        Ok(Stopped { stage, status })
    }

    /// Kills what is left of the agent's group (through the guard) and every escaped
    /// descendant that came back to us as subreaper, and reaps them.
    async fn remove_descendants(&self) {
        let guard = match &mut *self.lock() {
            HostState::Started(running) => {
                running.guard_pipe = None;
                running.guard.take()
            }
            HostState::NotStarted | HostState::Starting => None,
        };
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(mut guard) = guard {
                let _ = guard.wait();
            }
            for pid in process::own_children() {
                let pid = nix::unistd::Pid::from_raw(pid as i32);
                let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
                let _ = nix::sys::wait::waitpid(pid, None);
            }
        })
        .await;
    }

    /// The agent's state for `status`.
    pub fn status(&self) -> Status {
        let exit = *self.exit_tx.borrow();
        let (agent_state, agent_pid) = match &*self.lock() {
            HostState::NotStarted | HostState::Starting => (AgentState::NotStarted, None),
            HostState::Started(running) if exit.is_some() => {
                (AgentState::Exited, Some(running.pid))
            }
            HostState::Started(running) => (AgentState::Running, Some(running.pid)),
        };
        Status {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            agent_state,
            agent_pid,
            exit,
            last_seq: self.spool.last_seq(),
            acked_seq: self.spool.acked_seq(),
            intake_stalled: self.spool.stalled(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HostState> {
        self.state.lock().expect("UNWRAP: never poisoned")
    }
}

/// Waits for the exit to be known, for at most `limit`. Returns whether it is.
async fn wait_exit(
    exit_rx: &mut watch::Receiver<Option<ExitInfo>>,
    limit: Option<Duration>,
) -> bool {
    let wait = exit_rx.wait_for(Option::is_some);
    match limit {
        Some(limit) => matches!(tokio::time::timeout(limit, wait).await, Ok(Ok(_))),
        None => wait.await.is_ok(),
    }
}

/// Performs every spawn on one long-lived thread, because the parent-death signal follows
/// the thread that forked: a pool thread that retires would take the agent with it.
#[derive(Debug)]
struct Spawner {
    jobs: std::sync::mpsc::Sender<(Command, oneshot::Sender<io::Result<Child>>)>,
}

impl Spawner {
    fn start(runtime: tokio::runtime::Handle) -> Spawner {
        let (jobs, rx) =
            std::sync::mpsc::channel::<(Command, oneshot::Sender<io::Result<Child>>)>();
        std::thread::Builder::new()
            .name("agent-spawner".into())
            .spawn(move || {
                // tokio's Command registers the child with the runtime's reaper.
                let _entered = runtime.enter();
                // The thread lives while the host (which holds the sender) lives.
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("UNWRAP: starting a thread only fails when the process is out of resources");
        Spawner { jobs }
    }

    async fn spawn(&self, command: Command) -> io::Result<Child> {
        let (reply, result) = oneshot::channel();
        self.jobs
            .send((command, reply))
            .map_err(|_| io::Error::other("the spawner thread is gone"))?;
        result.await.map_err(|_| io::Error::other("the spawner thread is gone"))?
    }
}

async fn write_stdin(
    mut stdin: ChildStdin,
    mut lines: mpsc::UnboundedReceiver<Vec<u8>>,
    spool: Arc<Spool>,
) {
    while let Some(line) = lines.recv().await {
        let written = async {
            stdin.write_all(&line).await?;
            stdin.flush().await
        };
        if let Err(err) = written.await {
            let _ = spool.append(EventKind::Error {
                message: format!("writing to the agent's stdin failed: {err}"),
            });
            return;
        }
    }
    // Every sender is gone: dropping `stdin` here gives the agent EOF.
}

/// Turns the agent's stdout into events and serves its `fs/*` requests.
struct Relay {
    spool: Arc<Spool>,
    roots: Arc<std::sync::RwLock<Arc<Roots>>>,
    /// The agent's own user's, for its `fs/*` requests (`None`: it runs as agentctl).
    identity: Option<Arc<fs::Identity>>,
    /// Weak, so that it does not keep stdin open after a stop dropped the real sender.
    stdin_tx: mpsc::WeakUnboundedSender<Vec<u8>>,
    max_line: usize,
    /// Cancelled once the agent's process exited.
    exited: tokio_util::sync::CancellationToken,
    /// Whether the supervisor holds the agent's output.
    held: watch::Receiver<bool>,
    /// See [`HostConfig::max_backlog`].
    max_backlog: u64,
}

/// The most agent lines gathered into one spool write.
const RELAY_BATCH: usize = 256;

impl Relay {
    /// Reads lines and spools their events, several in one write while more lines are
    /// already buffered (a burst costs one write per batch, not one per line); a batch is
    /// written as soon as no further line is waiting, so nothing is held back.
    async fn run(mut self, stdout: ChildStdout) {
        let mut lines = LineReader::new(BufReader::with_capacity(64 * 1024, stdout), self.max_line);
        let mut batch = Vec::new();
        // Lines spooled since this task last let others run.
        let mut unyielded = 0;
        loop {
            if *self.held.borrow() {
                // Held: what was read is spooled, then nothing more until released (lines
                // already buffered wait in the reader; a supervisor that went away
                // releases nothing: its successor does).
                if !batch.is_empty() {
                    append_durably(&self.spool, std::mem::take(&mut batch)).await;
                }
                let _ = self.held.wait_for(|held| !held).await;
            }
            if self.spool.disk_bytes() >= self.max_backlog {
                // Flow control: what was read is spooled, then the agent waits until the
                // supervisor's acknowledgements drop segments.
                if !batch.is_empty() {
                    append_durably(&self.spool, std::mem::take(&mut batch)).await;
                }
                tracing::debug!(
                    max = self.max_backlog,
                    "the spool is full of unacknowledged events; the agent's output waits"
                );
                self.spool.room_below(self.max_backlog).await;
            }
            match lines.next_line().await {
                Ok(Some(line)) => self.handle(line, &mut batch).await,
                Ok(None) => break,
                Err(err) => {
                    batch.push(EventKind::Error {
                        message: format!("reading the agent's stdout failed: {err}"),
                    });
                    break;
                }
            }
            if batch.len() >= RELAY_BATCH || !lines.has_buffered_line() {
                unyielded += batch.len();
                append_durably(&self.spool, std::mem::take(&mut batch)).await;
                // In a flood the control server and the subscribers get their turn once a
                // subscriber's batch is spooled (agentctl runs on one thread).
                if unyielded >= protocol::control::MAX_BATCH_EVENTS {
                    unyielded = 0;
                    tokio::task::yield_now().await;
                }
            }
        }
        append_durably(&self.spool, batch).await;
        // EOF. An agent that exits now is reported by its exit; one that lives on with its
        // stdout closed can answer nothing more, and the supervisor must be told.
        tokio::select! {
            () = self.exited.cancelled() => {}
            () = tokio::time::sleep(STDOUT_CLOSED_GRACE) => {
                tracing::warn!("the agent closed its stdout and is still running");
                append_durably(&self.spool, vec![EventKind::StdoutClosed]).await;
            }
        }
    }

    async fn handle(&self, line: Line, batch: &mut Vec<EventKind>) {
        let bytes = match line {
            Line::TooLong { len } => {
                let message = format!(
                    "the agent wrote a stdout line of {len} bytes, over the {}-byte limit; it was dropped",
                    self.max_line
                );
                return batch.push(EventKind::Error { message });
            }
            Line::Complete(bytes) => bytes,
        };
        // Checked and forwarded as the agent wrote it, without building its JSON tree.
        match frame::inspect_for_relay(&bytes) {
            Relayed::Blank => {}
            Relayed::Invalid(invalid) => batch.push(EventKind::StdoutNoise {
                line: String::from_utf8_lossy(&invalid.excerpt).into_owned(),
                reason: invalid.reason.to_string(),
            }),
            Relayed::Valid { shape, method, message } => {
                let fs_method = match method.as_deref() {
                    Some(
                        method @ (protocol::acp::method::FS_READ_TEXT_FILE
                        | protocol::acp::method::FS_WRITE_TEXT_FILE),
                    ) => Some(method.to_owned()),
                    _ => None,
                };
                let answered = match (shape, fs_method) {
                    // An fs request (rare) is taken apart to be served, by `inspect` (whose
                    // verdict the relay check shares: its id is one).
                    (Shape::Request, Some(method)) => match frame::inspect(&bytes) {
                        Inspected::Valid(_, raw) => {
                            match serde_json::from_value::<Id>(raw["id"].clone()) {
                                Ok(id) => Some(
                                    self.serve_fs(id, method, raw.get("params").cloned()).await,
                                ),
                                Err(_) => None,
                            }
                        }
                        Inspected::Invalid(_) | Inspected::Blank => None,
                    },
                    _ => None,
                };
                batch.push(EventKind::Acp { message, answered });
            }
        }
    }

    /// Answers an fs request on the agent's stdin and returns the response sent.
    async fn serve_fs(&self, id: Id, method: String, params: Option<Value>) -> Value {
        let roots =
            Arc::clone(&self.roots.read().unwrap_or_else(std::sync::PoisonError::into_inner));
        let identity = self.identity.clone();
        let result = tokio::task::spawn_blocking(move || {
            let serve = || match method.as_str() {
                protocol::acp::method::FS_READ_TEXT_FILE => {
                    fs::read_text_file(&roots, params.as_ref())
                }
                _ => fs::write_text_file(&roots, params.as_ref()),
            };
            // With the agent's own access, not agentctl's (which may be root's).
            match &identity {
                Some(identity) => identity.run(serve),
                None => serve(),
            }
        })
        .await
        .unwrap_or_else(|join| Err(fs::FsError::Params(format!("the fs task failed: {join}"))));
        let response = Message::Response(Response { id, result: result.map_err(Into::into) });
        if let Some(stdin_tx) = self.stdin_tx.upgrade() {
            let _ = stdin_tx.send(response.to_line());
        }
        response.to_value()
    }
}

/// How long a failing spool write waits before it is tried again, at most.
const STALL_RETRY_MAX: Duration = Duration::from_secs(2);

/// Appends events (one write), waiting out a spool that cannot be written (a full disk):
/// the agent's output is never dropped. Meanwhile the reader that called this stops
/// reading, so the agent blocks on its full pipe (intake stops), and `status` says why.
/// There is no event for "space was freed", so the write is tried again with a growing
/// delay.
async fn append_durably(spool: &Spool, kinds: Vec<EventKind>) -> u64 {
    let mut delay = Duration::from_millis(50);
    let mut failed: Option<(std::time::Instant, String)> = None;
    let mut kinds = kinds;
    loop {
        match spool.try_append_kinds(kinds) {
            Ok(seq) => {
                if let Some((since, why)) = failed {
                    spool.set_stalled(None);
                    // Said once the spool works again, so the supervisor can tell people.
                    let message = format!(
                        "the agent's output was held for {} ms because the spool could not be written ({why}); nothing was lost",
                        since.elapsed().as_millis()
                    );
                    let _ = spool.append(EventKind::Error { message });
                }
                return seq;
            }
            Err(failed_write) => {
                let (err, unwritten) = *failed_write;
                kinds = unwritten;
                failed.get_or_insert_with(|| (std::time::Instant::now(), err.to_string()));
                tracing::error!(%err, "cannot spool an agent event; intake stops until it can");
                spool.set_stalled(Some(err.to_string()));
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(STALL_RETRY_MAX);
            }
        }
    }
}

async fn read_stderr(
    stderr: ChildStderr,
    spool: Arc<Spool>,
    tail: Arc<Mutex<StderrTail>>,
    max_line: usize,
) {
    let mut lines = LineReader::new(BufReader::new(stderr), max_line);
    loop {
        let line = match lines.next_line().await {
            Ok(Some(Line::Complete(bytes))) => String::from_utf8_lossy(&bytes).into_owned(),
            Ok(Some(Line::TooLong { len })) => {
                format!("[a stderr line of {len} bytes was dropped]")
            }
            Ok(None) | Err(_) => return,
        };
        tail.lock().expect("UNWRAP: never poisoned").push(Instant::now(), line.clone());
        append_durably(&spool, vec![EventKind::Stderr { line }]).await;
    }
}

async fn watch_exit(
    mut child: Child,
    exited: tokio_util::sync::CancellationToken,
    stdout_task: tokio::task::JoinHandle<()>,
    stderr_task: tokio::task::JoinHandle<()>,
    tail: Arc<Mutex<StderrTail>>,
    spool: Arc<Spool>,
    exit_tx: watch::Sender<Option<ExitInfo>>,
) {
    let waited = child.wait().await;
    let exited_at = Instant::now();
    let status = match waited {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt;
            ExitInfo { code: status.code(), signal: status.signal() }
        }
        Err(err) => {
            tracing::error!(%err, "cannot wait for the agent");
            ExitInfo { code: None, signal: None }
        }
    };
    exited.cancel();
    // Lines the agent wrote just before exiting belong before `agent_exited`.
    let drained = async {
        let _ = stdout_task.await;
        let _ = stderr_task.await;
    };
    if tokio::time::timeout(DRAIN_AFTER_EXIT, drained).await.is_err() {
        tracing::warn!(
            "the agent exited but its output pipes are still open (a descendant holds them)"
        );
    }
    // The cause of its death: what it printed in its last seconds, not long before.
    let stderr_tail = tail.lock().expect("UNWRAP: never poisoned").before(exited_at);
    append_durably(&spool, vec![EventKind::AgentExited { status, stderr_tail }]).await;
    exit_tx.send_replace(Some(status));
}

/// The roots of `cwd` and `extra_roots`, which must be absolute and exist.
fn checked_roots(cwd: &Path, extra_roots: &[PathBuf]) -> Result<Roots, AgentError> {
    let mut root_paths = vec![cwd.to_owned()];
    root_paths.extend(extra_roots.iter().cloned());
    for path in &root_paths {
        if !path.is_absolute() {
            let source = io::Error::new(io::ErrorKind::InvalidInput, "not an absolute path");
            return Err(AgentError::Root { path: path.clone(), source });
        }
    }
    Roots::new(&root_paths).map_err(|source| AgentError::Root { path: cwd.to_owned(), source })
}
