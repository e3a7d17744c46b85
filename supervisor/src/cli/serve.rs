//! `supervisor serve`: the daemon's wiring — its home, store, runtimes, profiles, the API
//! server, recovery, retention and a bounded shutdown.

use super::{
    AccessPolicy, Arc, Context, DEFAULT_DEBOUNCE, DEFAULT_LISTEN, DockerConfig, DockerRuntime,
    Environment, HashMap, Home, OsString, Path, PathBuf, Registry, Runtimes, ServeArgs, SocketAddr,
    StandaloneRuntime, Store, Supervisor, SupervisorConfig, Write, api, bail,
};

/// Raises the soft limit on open files to the hard one: every live session holds a
/// connection and a file, and the common soft default (1,024) would cap the daemon at a few
/// hundred sessions. Sidecars and agents inherit what they were given by their own spawns.
pub(super) fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(err) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!(%err, soft, hard, "cannot raise the open-file limit");
            } else {
                tracing::debug!(from = soft, to = hard, "raised the open-file limit");
            }
        }
        Ok(_) => {}
        Err(err) => tracing::warn!(%err, "cannot read the open-file limit"),
    }
}

/// Any process of the daemon's user can read its argv (`/proc/<pid>/cmdline`) and its
/// environment (`/proc/<pid>/environ`), and neither can be wiped in place: a token given by
/// `--auth-token` or `TETHER_AUTH_TOKEN` is handed to a fresh image of this program (same
/// pid, same stdio) on an inherited pipe, with both removed. Returns only on failure.
fn restart_out_of_sight(token: Option<&crate::api::ApiToken>) -> anyhow::Error {
    use std::ffi::CString;
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let restarted = (|| -> anyhow::Result<std::convert::Infallible> {
        let c_string = |bytes: &[u8]| CString::new(bytes).context("a NUL inside an argument");
        let mut argv = Vec::new();
        let mut args = std::env::args_os();
        let mut fd = None;
        while let Some(arg) = args.next() {
            if arg == "--auth-token" {
                args.next();
            } else if !arg.as_bytes().starts_with(b"--auth-token=") {
                argv.push(c_string(arg.as_bytes())?);
            }
        }
        if let Some(token) = token {
            // Not close-on-exec: the new image inherits it. A short token fits the pipe.
            let (read, write) = nix::unistd::pipe().context("a pipe for the token")?;
            nix::unistd::write(&write, token.as_str().as_bytes()).context("the token's pipe")?;
            drop(write);
            argv.push(c_string(b"--auth-token-fd")?);
            argv.push(c_string(read.as_raw_fd().to_string().as_bytes())?);
            fd = Some(read);
        }
        let env = std::env::vars_os()
            .filter(|(name, _)| name != crate::api::TOKEN_ENV)
            .map(|(name, value)| c_string(&[name.as_bytes(), b"=", value.as_bytes()].concat()))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let restarted = nix::unistd::execve(c"/proc/self/exe", &argv, &env);
        drop(fd);
        restarted.context("starting again without the token in sight")
    })();
    match restarted {
        Ok(never) => match never {},
        Err(err) => err,
    }
}

/// The token handed on by [`restart_out_of_sight`].
fn inherited_token(fd: i32) -> anyhow::Result<crate::api::ApiToken> {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    // SAFETY: the descriptor is the pipe `restart_out_of_sight` opened for this image
    // alone; nothing else here owns or closes it.
    let mut pipe = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut token = String::new();
    pipe.read_to_string(&mut token).context("--auth-token-fd: reading the token")?;
    Ok(crate::api::ApiToken::new(&token, &crate::api::TokenSource::Inherited)?)
}

/// Runs the daemon until a signal (or the API itself) stops it, then shuts it down within a
/// bounded time.
pub(super) async fn serve(args: ServeArgs, self_command: Vec<OsString>) -> anyhow::Result<()> {
    let root = args
        .home
        .clone()
        .or_else(Home::default_root)
        .context("no data directory: set TETHER_HOME or HOME, or pass --home")?;
    let config = crate::config::load(&root.join(crate::config::FILE_NAME))?;
    let default_listen: SocketAddr = DEFAULT_LISTEN.parse().expect("UNWRAP: a valid constant");
    let listen = args.listen.or(config.listen).unwrap_or(default_listen);
    let token = api_token(&args, &config, &root, listen)?;
    init_logging();
    raise_fd_limit();
    // One daemon per data directory, refused before anything in it is touched.
    crate::home::create_private_dir(&root)
        .with_context(|| format!("cannot create the data directory {}", root.display()))?;
    let mut lock = crate::home::lock::DaemonLock::acquire(&root)?;
    let home = Home::open(&root)
        .with_context(|| format!("cannot create the data directory {}", root.display()))?;
    let store = Store::open(&home.database())?;
    let registry = open_registry(&home, token.is_some())?;
    let supervisor =
        new_supervisor(&args, &config, &self_command, &home, store, registry, token.is_some())?;
    // Signals are caught from here on: once "serving" is printed a SIGTERM must be the
    // clean stop it promises, however soon it comes.
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate())?;
    let int = signal(SignalKind::interrupt())?;
    // Restart recovery happens before the API serves anything.
    supervisor.recover().await?;
    // Engines out of service stay so; moves and drains a stop cut short go on.
    supervisor.resume_drains().await?;
    if let Some(after) = supervisor.failover_after() {
        tokio::spawn(Arc::clone(&supervisor).watch_engines(after));
    }
    // Workflows go on once their sessions are re-attached.
    supervisor.drive_workflows().await?;
    // Warm agents: what a kill left is removed, then the pools fill.
    tokio::spawn(Arc::clone(&supervisor).run_pool());
    let mut allowed_origins = config.allow_origins.clone();
    allowed_origins.extend(args.allow_origin);
    let policy = AccessPolicy { token, allowed_origins };
    if let Some(retention) = config.retention.clone() {
        // The first pass runs before the API serves, so a restart applies the policy
        // before anyone can see what it removes.
        retention_pass(&supervisor, &retention.policy).await;
        tokio::spawn(run_retention(Arc::clone(&supervisor), retention));
    }
    let limits = api::admission::Limits {
        max: args.max_connections,
        per_peer: args.max_connections_per_peer,
    };
    let (addr, handle) = api::serve(listen, policy, limits, Arc::clone(&supervisor))
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    if let Err(err) = lock.announce(&format!("ws://{addr}")) {
        tracing::warn!(%err, "cannot record the daemon's address: clients will not find it");
    }
    println!("tether serving on ws://{addr} (data in {})", home.root().display());
    let _ = std::io::stdout().flush();
    shut_down_on_signal(term, int, handle, &supervisor).await;
    Ok(())
}

/// The API token, from `--auth-token-fd`, the flags, the environment or the config file;
/// one given where other processes can read it makes the daemon start again without it in
/// sight (this returns that restart's failure as its error).
fn api_token(
    args: &ServeArgs,
    config: &crate::config::DaemonConfig,
    root: &Path,
    listen: SocketAddr,
) -> anyhow::Result<Option<crate::api::ApiToken>> {
    // A token in argv shows in `ps`: a 0600 file or the environment keeps it out of sight.
    let config_path = root.join(crate::config::FILE_NAME);
    let token = match args.auth_token_fd {
        Some(fd) => Some(inherited_token(fd)?),
        None => crate::api::resolve_token(
            args.auth_token.as_deref(),
            args.auth_token_file.as_deref(),
            std::env::var_os(crate::api::TOKEN_ENV).as_deref(),
            config.auth_token_file.as_deref().map(|file| (file, config_path.as_path())),
        )?,
    };
    if !listen.ip().is_loopback() && token.is_none() {
        bail!(
            "listening on {listen} (beyond loopback) requires a token: --auth-token-file, \
             TETHER_AUTH_TOKEN or --auth-token"
        );
    }
    let in_sight = args.auth_token.is_some() || std::env::var_os(crate::api::TOKEN_ENV).is_some();
    if args.auth_token_fd.is_none() && in_sight {
        return Err(restart_out_of_sight(token.as_ref()));
    }
    Ok(token)
}

/// Logs to stderr at the level `TETHER_LOG` names (info by default).
fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TETHER_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colours for a person at a terminal; none in a log file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Opens the agent profiles, warning of those not loaded and, without an API token, of
/// those whose agents run as another user.
fn open_registry(home: &Home, has_token: bool) -> anyhow::Result<Registry> {
    let registry = Registry::open(&home.profiles(), DEFAULT_DEBOUNCE)?;
    for error in registry.catalog().errors() {
        tracing::warn!(%error, "profile not loaded");
    }
    if !has_token {
        for profile in registry.catalog().profiles().filter(|it| it.process.user.is_some()) {
            tracing::warn!(
                profile = %profile.id,
                "runs its agents as another user, which needs an API token: its sessions are refused until the daemon has one (--auth-token-file)"
            );
        }
    }
    Ok(registry)
}

/// The supervisor, with its runtimes (standalone and Docker), applets and limits.
fn new_supervisor(
    args: &ServeArgs,
    config: &crate::config::DaemonConfig,
    self_command: &[OsString],
    home: &Home,
    store: Store,
    registry: Registry,
    has_token: bool,
) -> anyhow::Result<Arc<Supervisor>> {
    let exe_dir: Vec<PathBuf> = self_command
        .first()
        .and_then(|exe| PathBuf::from(exe).parent().map(|dir| vec![dir.to_owned()]))
        .unwrap_or_default();
    let environment = Environment::current(&exe_dir);
    let applet = |name: &str| -> Vec<OsString> {
        let mut command = self_command.to_vec();
        command.push(name.into());
        command
    };
    let agentctl = match environment.find_program("agentctl") {
        Some(path) => vec![path.into_os_string()],
        None => applet("agentctl"),
    };
    let applets = HashMap::from([("mock-agent".to_owned(), applet("mock-agent"))]);
    let install_id = home.install_id().context("cannot read or create the install id")?;
    let cgroups = match crate::runtime::cgroup::Cgroups::open(&install_id) {
        Ok(cgroups) => Some(cgroups),
        Err(why) => {
            tracing::warn!(
                "no cgroup per session ({why}): a process that leaves its agent's process group \
                 outlives a killed sidecar"
            );
            None
        }
    };
    // Zero-config Docker: without --static-agentctl, a static build is found where the
    // build and set-up scripts put it.
    let own_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let searched = crate::runtime::docker::static_agentctl_candidates(&own_dir, home.root());
    Ok(Arc::new(Supervisor::new(SupervisorConfig {
        home: home.clone(),
        store,
        registry,
        environment,
        runtimes: Runtimes::new()
            .register(Arc::new(StandaloneRuntime { agentctl, cgroups }))
            .register(Arc::new(DockerRuntime::new(DockerConfig {
                agentctl: args
                    .static_agentctl
                    .clone()
                    .map(|path| std::path::absolute(&path).unwrap_or(path))
                    .or(config.static_agentctl.clone())
                    .or_else(|| crate::runtime::docker::find_static_agentctl(&searched)),
                searched,
                install_id: install_id.clone(),
                engines: config.docker_engines.clone(),
            }))),
        connector: Arc::new(crate::sidecar::WsConnector),
        applets,
        event_log: crate::events::LogLimits {
            retain_bytes: args
                .event_log_retain_bytes
                .or(config.event_log_retain_bytes)
                .unwrap_or(crate::events::DEFAULT_RETAIN_BYTES),
            segment_bytes: args.event_log_segment_bytes.max(1),
        },
        api_token: has_token,
        idle_timeout: Some(
            config.idle_timeout_secs.unwrap_or(crate::config::DEFAULT_IDLE_TIMEOUT_SECS),
        )
        .filter(|secs| *secs > 0)
        .map(std::time::Duration::from_secs),
        default_sandbox: config.sandbox.clone(),
        checkpoints: Arc::new(crate::checkpoint::Checkpoints::new(config.checkpoints)),
        failover_after: config.failover_after_secs.map(std::time::Duration::from_secs),
    })))
}

/// Waits for SIGTERM, SIGINT or the API's own stop, then stops the API, drains the warm
/// agents and waits for the teardowns in flight (agent sidecars keep running).
async fn shut_down_on_signal(
    mut term: tokio::signal::unix::Signal,
    mut int: tokio::signal::unix::Signal,
    handle: jsonrpsee::server::ServerHandle,
    supervisor: &Supervisor,
) {
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping the API; agent sidecars keep running"),
        _ = int.recv() => tracing::info!("SIGINT: stopping the API; agent sidecars keep running"),
        () = handle.clone().stopped() => {}
    }
    let _ = handle.stop();
    handle.stopped().await;
    // Warm agents belong to no session: they stop with the daemon.
    if let Some(pool) = supervisor.pool() {
        pool.drain(SHUTDOWN_TEARDOWN_BOUND).await;
    }
    // A launch, retire or fence under way is finished first: nothing is left half done.
    let pending = supervisor.shutdown(SHUTDOWN_TEARDOWN_BOUND).await;
    if pending > 0 {
        tracing::info!(pending, "shutdown: waited for the teardowns in flight");
    }
}

/// How long a shutdown waits for launches, retires and fences in flight.
pub(super) const SHUTDOWN_TEARDOWN_BOUND: std::time::Duration = std::time::Duration::from_secs(20);

/// The automatic retention policy after its first pass: one per interval (a timer, not a
/// poll: nothing signals that a session grew old).
pub(super) async fn run_retention(
    supervisor: Arc<Supervisor>,
    retention: crate::config::Retention,
) {
    let start = tokio::time::Instant::now() + retention.interval;
    let mut ticks = tokio::time::interval_at(start, retention.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        retention_pass(&supervisor, &retention.policy).await;
    }
}

/// One cleanup by the retention policy; one log line with what it removed and kept.
pub(super) async fn retention_pass(
    supervisor: &Supervisor,
    policy: &crate::service::CleanupPolicy,
) {
    match supervisor.cleanup(policy).await {
        Ok(result) => {
            let removed: Vec<&str> =
                result.removed.iter().map(|gone| gone.session_id.as_str()).collect();
            let kept: Vec<String> = result
                .kept
                .iter()
                .map(|kept| format!("{} ({})", kept.session_id, kept.reason))
                .collect();
            tracing::info!(
                removed = removed.len(),
                kept = kept.len(),
                ?removed,
                ?kept,
                "retention: cleanup done"
            );
        }
        Err(err) => tracing::warn!(%err, "retention: cleanup failed"),
    }
}
