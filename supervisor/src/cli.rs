//! The `supervisor` command line (clap): `serve` runs the daemon; every other command is a
//! typed client (`protocol::api::ApiClient`) of a running daemon and prints plain,
//! specific lines, or JSON with `--json` on the commands that read.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agents::registry::{DEFAULT_DEBOUNCE, Environment, Registry};
use anyhow::{Context, bail};
use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use jsonrpsee::core::client::Subscription;
use jsonrpsee::ws_client::{WsClient, WsClientBuilder};
use protocol::acp::schema as acp;
use protocol::api::{
    ApiClient, ErrorKind, EventKind, LaunchStep, ResumeOutcome, ResumeResult, RuntimeKind,
    SessionEvent, SessionState, TurnState,
};
use serde::{Deserialize, Serialize};

use crate::api::{self, AccessPolicy};
use crate::home::Home;
use crate::runtime::docker::{DockerConfig, DockerRuntime};
use crate::runtime::{Runtimes, StandaloneRuntime};
use crate::service::{Supervisor, SupervisorConfig};
use crate::store::Store;

/// The default API address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7733";

const EXIT_CODES: &str = "\
Exit codes: 0 ok, 1 error, 2 usage, 3 server not running, 4 not found, 5 conflict (the
session has ended), 6 refused (a missing or wrong token).";

/// How long a client command waits for a daemon that went away (a restart) to answer
/// again before it gives up.
const RECONNECT_WINDOW: Duration = Duration::from_secs(60);

#[derive(Parser, Debug)]
#[command(
    name = "supervisor",
    version,
    about = "Tether: a supervisor for coding agents that speak ACP.",
    after_help = EXIT_CODES
)]
struct Cli {
    /// The daemon's API address (client commands).
    #[arg(long, env = "TETHER_URL", value_name = "URL")]
    url: Option<String>,
    /// The daemon's bearer token (client commands).
    #[arg(long, env = "TETHER_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    token: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the daemon. It leaves agent sidecars running when it gets SIGTERM, so a restart
    /// loses nothing; it re-adopts them when it starts again.
    #[command(args_override_self = true)]
    Serve(ServeArgs),
    /// List the agent profiles and whether each can run here.
    Agents(JsonFlag),
    /// Tasks.
    #[command(subcommand)]
    Task(TaskCommand),
    /// Start sessions.
    #[command(subcommand)]
    Session(SessionCommand),
    /// List, show and delete sessions.
    #[command(subcommand)]
    Sessions(SessionsCommand),
    /// List and read a session's snapshots.
    #[command(subcommand)]
    Snapshots(SnapshotsCommand),
    /// Send a prompt and follow its turn to the end (resuming the session first if its agent
    /// is not running; following on across a daemon restart). Options go before SESSION:
    /// everything after it is the prompt.
    Prompt {
        /// Print only the agent's reply.
        #[arg(long, short)]
        quiet: bool,
        /// The session.
        session: String,
        /// The prompt (words are joined by spaces).
        #[arg(required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true)]
        text: Vec<String>,
    },
    /// Bring a session's agent back (natively when it can), showing progress and outcome.
    Resume {
        /// Print nothing but the outcome line.
        #[arg(long, short)]
        quiet: bool,
        /// Adopt the agent profile as it is now (the session keeps the one it started
        /// with otherwise; `status` shows where they differ).
        #[arg(long)]
        refresh_profile: bool,
        /// The session.
        session: String,
    },
    /// A session's status.
    Status {
        /// The session.
        session: String,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Cancel a session's running turn (a PAUSED session: end it, CANCELLED).
    Cancel {
        /// The session.
        session: String,
    },
    /// Pause a session at the next turn boundary: a running turn ends first (or is
    /// cancelled after --force-after-ms), then its agent stops and it is PAUSED until
    /// resumed (`resume`, or a prompt). Waits until it is paused unless --no-wait.
    Pause {
        /// The session.
        session: String,
        /// Why (kept with the pause and shown in its events).
        #[arg(long)]
        reason: Option<String>,
        /// How long a running turn may still take before it is cancelled [default: 300000].
        #[arg(long, value_name = "MS")]
        force_after_ms: Option<u64>,
        /// Return once the pause is requested, without waiting for the turn to end.
        #[arg(long)]
        no_wait: bool,
    },
    /// Answer an agent's permission request.
    #[command(subcommand)]
    Permission(PermissionCommand),
    /// Print a session's events as they happen, from a seq on; follows on across daemon
    /// restarts and ends when the session ends (or on Ctrl-C).
    Follow {
        /// The session.
        session: String,
        /// Start after this event seq (default: from now on).
        #[arg(long, value_name = "SEQ")]
        after: Option<u64>,
        /// One JSON event per line.
        #[arg(long)]
        json: bool,
    },
    /// End a session FOR GOOD: its agent stops and it cannot be resumed or prompted again.
    /// (To free an agent but keep the session resumable, use `stop-all`.)
    Stop {
        /// The session.
        session: String,
    },
    /// Stop every agent and sidecar; the sessions stay resumable.
    StopAll,
    /// A session's conversation history.
    History {
        /// The session.
        session: String,
        /// Entries after this seq.
        #[arg(long, default_value_t = 0, value_name = "SEQ")]
        after: u64,
        /// At most this many entries.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        #[command(flatten)]
        json: JsonFlag,
    },
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// The address the API listens on [default: config.toml's `listen`, else
    /// 127.0.0.1:7733]. Every flag here wins over `$TETHER_HOME/config.toml`, which wins
    /// over the default; the file also holds the automatic retention policy.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Each session's event log keeps at least its newest this many bytes; older
    /// segments are dropped (subscribing before them is refused; the history keeps the
    /// conversation) [default: 64 MiB].
    #[arg(long, value_name = "BYTES")]
    event_log_retain_bytes: Option<u64>,
    /// The size of an event log's segments (what retention drops at a time).
    #[arg(long, value_name = "BYTES", default_value_t = agentctl::spool::DEFAULT_SEGMENT_BYTES, hide = true)]
    event_log_segment_bytes: u64,
    /// The data directory (default: $TETHER_HOME, else $XDG_DATA_HOME/tether, else
    /// ~/.local/share/tether).
    #[arg(long)]
    home: Option<PathBuf>,
    /// A file holding the API token; it must be readable by its owner only (0600).
    #[arg(long, value_name = "FILE", conflicts_with = "auth_token")]
    auth_token_file: Option<PathBuf>,
    /// The API token (visible in `ps`: prefer --auth-token-file or TETHER_AUTH_TOKEN).
    #[arg(long, value_name = "TOKEN")]
    auth_token: Option<String>,
    /// A browser origin allowed to connect (repeatable).
    #[arg(long, value_name = "ORIGIN", action = clap::ArgAction::Append)]
    allow_origin: Vec<String>,
    /// A statically linked agentctl for the Docker runtime.
    #[arg(long, env = "TETHER_STATIC_AGENTCTL", value_name = "PATH")]
    static_agentctl: Option<PathBuf>,
}

#[derive(Args, Debug, Clone, Copy)]
struct JsonFlag {
    /// Print JSON (the API's result) instead of lines.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum TaskCommand {
    /// Create a task.
    Create {
        /// The title.
        title: String,
        /// The description (the first prompt of its sessions when they get none).
        #[arg(long, default_value = "")]
        description: String,
        /// Print only the task id.
        #[arg(long, short)]
        quiet: bool,
    },
    /// List tasks.
    List(JsonFlag),
    /// A task and its sessions.
    Show {
        /// The task.
        task: String,
        #[command(flatten)]
        json: JsonFlag,
    },
}

#[derive(Subcommand, Debug)]
enum SessionCommand {
    /// Start a session and wait until its agent is ready.
    Start(StartArgs),
}

#[derive(Subcommand, Debug)]
enum SessionsCommand {
    /// List sessions, oldest first.
    List {
        /// Only this task's.
        #[arg(long)]
        task: Option<String>,
        /// Only those in this state (CREATED, STARTING, RUNNING, WAITING_FOR_INPUT,
        /// COMPLETED, FAILED, CANCELLED).
        #[arg(long, value_name = "STATE")]
        status: Option<SessionState>,
        /// Only those of this agent profile.
        #[arg(long)]
        agent: Option<String>,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// A session's status, its executions and turns, and its timeline.
    Show {
        /// The session.
        session: String,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Delete a session and its records, and its worktree if Tether made one (refused
    /// while that holds uncommitted work, unless --force; its branch stays unless
    /// --delete-branch).
    Delete {
        /// The session.
        session: String,
        /// Remove its worktree even with uncommitted work in it.
        #[arg(long)]
        force: bool,
        /// Delete its worktree's branch too.
        #[arg(long)]
        delete_branch: bool,
    },
    /// Remove the sessions at rest older than --max-age-days: rows, history, event logs,
    /// spools, containers and worktrees. Live sessions are never touched; a worktree with
    /// uncommitted work keeps its session unless --force. Prints what went and what was
    /// kept, and why.
    Cleanup {
        /// Sessions whose last change is older than this many days (0: any age).
        #[arg(long, value_name = "DAYS")]
        max_age_days: u32,
        /// Spare COMPLETED sessions.
        #[arg(long)]
        keep_completed: bool,
        /// Only sessions in this state (repeatable).
        #[arg(long = "state", value_name = "STATE", action = clap::ArgAction::Append)]
        states: Vec<SessionState>,
        /// Print what would be removed; remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// Remove worktrees with uncommitted work too.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        json: JsonFlag,
    },
}

/// What `session start` creates.
#[derive(Args, Debug)]
struct StartArgs {
    /// The agent profile.
    #[arg(long)]
    agent: String,
    /// The workspace directory; with --worktree, the repository (optional when the
    /// profile names workspace.repo).
    #[arg(long)]
    workspace: Option<PathBuf>,
    /// The task.
    #[arg(long, required_unless_present = "new_task", conflicts_with = "new_task")]
    task: Option<String>,
    /// Create a task with this title for the session.
    #[arg(long, value_name = "TITLE")]
    new_task: Option<String>,
    /// The first prompt.
    #[arg(long)]
    prompt: Option<String>,
    /// Where the agent runs: `standalone` or `docker` (default: the profile's).
    #[arg(long, value_name = "NAME")]
    runtime: Option<String>,
    /// Place it where this label is carried (a Docker engine's `labels`); repeatable.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Share the workspace with live sessions already in it (else a held workspace is
    /// refused, naming its holder).
    #[arg(long)]
    shared: bool,
    /// Work in a git worktree of its own, on a new branch tether/<task>-<id> (the
    /// default when the profile has a [workspace] section).
    #[arg(long, conflicts_with = "no_worktree")]
    worktree: bool,
    /// Work in the workspace itself even when the profile asks for worktrees.
    #[arg(long)]
    no_worktree: bool,
    /// The branch or commit the worktree's branch starts from (default: the profile's
    /// workspace.base, else the repository's HEAD).
    #[arg(long, value_name = "REF")]
    base: Option<String>,
    /// Print only the session id.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Subcommand, Debug)]
enum SnapshotsCommand {
    /// A session's snapshots, oldest first.
    List {
        /// The session.
        session: String,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// One snapshot, whole (JSON).
    Get {
        /// The snapshot.
        snapshot: String,
    },
}

#[derive(Subcommand, Debug)]
enum PermissionCommand {
    /// Answer a permission request (see its `permission_request` event) with `allow`,
    /// `deny`, `cancel` or one of its option ids.
    Respond {
        /// The session.
        session: String,
        /// The request id.
        request: String,
        /// `allow` (the first allow option), `deny` (the first reject option), `cancel`,
        /// or an option id.
        answer: String,
    },
}

/// The CLI's exit codes (listed in `--help` and the README).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
enum Exit {
    Ok = 0,
    /// Anything else that failed.
    Error = 1,
    /// The command line is wrong.
    Usage = 2,
    /// No daemon answers at the URL.
    NotRunning = 3,
    /// The session, task or request named does not exist.
    NotFound = 4,
    /// The session has ended.
    Conflict = 5,
    /// The daemon refused the token (missing or wrong).
    Refused = 6,
}

impl Exit {
    fn code(self) -> i32 {
        self as i32
    }
}

/// A failure with its exit code and the one line to print.
struct Failure {
    code: Exit,
    line: String,
}

impl From<anyhow::Error> for Failure {
    fn from(err: anyhow::Error) -> Failure {
        Failure { code: Exit::Error, line: format!("error: {err:#}") }
    }
}

fn usage(line: String) -> Failure {
    Failure { code: Exit::Usage, line }
}

/// Runs the command line (without the program name); returns the exit code.
pub fn main(args: Vec<OsString>, self_command: Vec<OsString>) -> i32 {
    let argv = std::iter::once(OsString::from("supervisor")).chain(args);
    let parsed = Cli::command().try_get_matches_from(argv).and_then(|matches| {
        let cli = Cli::from_arg_matches(&matches)?;
        // `--url` and `--token` say which daemon a client talks to: given to `serve`, which
        // is the daemon, they would be silently ignored.
        let given = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
        if matches!(cli.command, Command::Serve(_)) && (given("url") || given("token")) {
            return Err(Cli::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                "--url and --token are for client commands; `serve` takes --listen and \
                 --auth-token-file",
            ));
        }
        Ok(cli)
    });
    let cli = match parsed {
        Ok(cli) => cli,
        Err(err) => {
            // Help and version go to stdout with 0; usage errors to stderr with 2.
            let _ = err.print();
            return if err.use_stderr() { Exit::Usage } else { Exit::Ok }.code();
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the runtime: {err}");
            return Exit::Error.code();
        }
    };
    match runtime.block_on(dispatch(cli, self_command)) {
        Ok(()) => Exit::Ok.code(),
        Err(failure) => {
            eprintln!("{}", failure.line);
            failure.code.code()
        }
    }
}

async fn dispatch(cli: Cli, self_command: Vec<OsString>) -> Result<(), Failure> {
    if let Command::Serve(args) = cli.command {
        return serve(args, self_command).await.map_err(Failure::from);
    }
    // A client command's output may go to `head`: when the reader goes, the command ends
    // quietly as Unix tools do, instead of panicking in a print.
    // SAFETY: restores the default disposition of one signal before any thread of ours
    // writes to a pipe; no handler is installed. The daemon (above) keeps Rust's "ignore",
    // since it writes to sockets and agents' pipes.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigDfl,
        )
    };
    let url = cli.url.unwrap_or_else(|| format!("ws://{DEFAULT_LISTEN}"));
    let client = Client::connect(Target { url, token: cli.token }).await?;
    client.run(cli.command).await
}

/// The daemon's token from a file that only its owner can read (it is a password).
fn read_token_file(path: &Path) -> anyhow::Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let metadata =
        std::fs::metadata(path).with_context(|| format!("--auth-token-file {}", path.display()))?;
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!(
            "--auth-token-file {}: readable by others (mode {mode:o}); chmod 600 it",
            path.display()
        );
    }
    let token = std::fs::read_to_string(path)
        .with_context(|| format!("--auth-token-file {}", path.display()))?;
    let token = token.trim();
    if token.is_empty() {
        bail!("--auth-token-file {}: empty", path.display());
    }
    Ok(token.to_owned())
}

/// Raises the soft limit on open files to the hard one: every live session holds a
/// connection and a file, and the common soft default (1,024) would cap the daemon at a few
/// hundred sessions. Sidecars and agents inherit what they were given by their own spawns.
fn raise_fd_limit() {
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

async fn serve(args: ServeArgs, self_command: Vec<OsString>) -> anyhow::Result<()> {
    let root = args
        .home
        .clone()
        .or_else(Home::default_root)
        .context("no data directory: set TETHER_HOME or HOME, or pass --home")?;
    let config = crate::config::load(&root.join(crate::config::FILE_NAME))?;
    let default_listen: SocketAddr = DEFAULT_LISTEN.parse().expect("UNWRAP: a valid constant");
    let listen = args.listen.or(config.listen).unwrap_or(default_listen);
    // A token in argv shows in `ps`: a 0600 file or the environment keeps it out of sight.
    let token = match (args.auth_token, args.auth_token_file) {
        (Some(token), _) => Some(token),
        (None, Some(path)) => Some(read_token_file(&path)?),
        (None, None) => match std::env::var("TETHER_AUTH_TOKEN").ok().filter(|t| !t.is_empty()) {
            Some(token) => Some(token),
            None => config.auth_token_file.as_deref().map(read_token_file).transpose()?,
        },
    };
    if !listen.ip().is_loopback() && token.is_none() {
        bail!(
            "listening on {listen} (beyond loopback) requires a token: --auth-token-file, \
             TETHER_AUTH_TOKEN or --auth-token"
        );
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TETHER_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    raise_fd_limit();
    let home = Home::open(&root)
        .with_context(|| format!("cannot create the data directory {}", root.display()))?;
    let store = Store::open(&home.database())?;
    let registry = Registry::open(&home.profiles(), DEFAULT_DEBOUNCE)?;
    for error in registry.catalog().errors() {
        tracing::warn!(%error, "profile not loaded");
    }
    let exe_dir: Vec<PathBuf> = self_command
        .first()
        .and_then(|exe| PathBuf::from(exe).parent().map(|dir| vec![dir.to_owned()]))
        .unwrap_or_default();
    let environment = Environment::current(&exe_dir);
    let applet = |name: &str| -> Vec<OsString> {
        let mut command = self_command.clone();
        command.push(name.into());
        command
    };
    let agentctl = match environment.find_program("agentctl") {
        Some(path) => vec![path.into_os_string()],
        None => applet("agentctl"),
    };
    let applets = HashMap::from([("mock-agent".to_owned(), applet("mock-agent"))]);
    // Zero-config Docker: without --static-agentctl, a static build is found where the
    // build and set-up scripts put it.
    let own_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let searched = crate::runtime::docker::static_agentctl_candidates(&own_dir, home.root());
    let supervisor = Arc::new(Supervisor::new(SupervisorConfig {
        home: home.clone(),
        store,
        registry,
        environment,
        runtimes: Runtimes::new().register(Arc::new(StandaloneRuntime { agentctl })).register(
            Arc::new(DockerRuntime::new(DockerConfig {
                agentctl: args
                    .static_agentctl
                    .map(|path| std::path::absolute(&path).unwrap_or(path))
                    .or(config.static_agentctl.clone())
                    .or_else(|| crate::runtime::docker::find_static_agentctl(&searched)),
                searched,
                install_id: home.install_id().context("cannot read or create the install id")?,
                engines: config.docker_engines.clone(),
            })),
        ),
        applets,
        event_log: crate::events::LogLimits {
            retain_bytes: args
                .event_log_retain_bytes
                .or(config.event_log_retain_bytes)
                .unwrap_or(crate::events::DEFAULT_RETAIN_BYTES),
            segment_bytes: args.event_log_segment_bytes.max(1),
        },
    }));
    // Signals are caught from here on: once "serving" is printed a SIGTERM must be the
    // clean stop it promises, however soon it comes.
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    // Restart recovery happens before the API serves anything.
    supervisor.recover().await?;
    let mut allowed_origins = config.allow_origins.clone();
    allowed_origins.extend(args.allow_origin);
    let policy = AccessPolicy { token, allowed_origins };
    if let Some(retention) = config.retention.clone() {
        // The first pass runs before the API serves, so a restart applies the policy
        // before anyone can see what it removes.
        retention_pass(&supervisor, &retention.policy).await;
        tokio::spawn(run_retention(Arc::clone(&supervisor), retention));
    }
    let (addr, handle) = api::serve(listen, policy, Arc::clone(&supervisor))
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    println!("tether serving on ws://{addr} (data in {})", home.root().display());
    let _ = std::io::stdout().flush();
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping the API; agent sidecars keep running"),
        _ = int.recv() => tracing::info!("SIGINT: stopping the API; agent sidecars keep running"),
        () = handle.clone().stopped() => {}
    }
    let _ = handle.stop();
    handle.stopped().await;
    // A launch, retire or fence under way is finished first: nothing is left half done.
    let pending = supervisor.shutdown(SHUTDOWN_TEARDOWN_BOUND).await;
    if pending > 0 {
        tracing::info!(pending, "shutdown: waited for the teardowns in flight");
    }
    Ok(())
}

/// How long a shutdown waits for launches, retires and fences in flight.
const SHUTDOWN_TEARDOWN_BOUND: std::time::Duration = std::time::Duration::from_secs(20);

/// The automatic retention policy after its first pass: one per interval (a timer, not a
/// poll: nothing signals that a session grew old).
async fn run_retention(supervisor: Arc<Supervisor>, retention: crate::config::Retention) {
    let start = tokio::time::Instant::now() + retention.interval;
    let mut ticks = tokio::time::interval_at(start, retention.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        retention_pass(&supervisor, &retention.policy).await;
    }
}

/// One cleanup by the retention policy; one log line with what it removed and kept.
async fn retention_pass(supervisor: &Supervisor, policy: &crate::service::CleanupPolicy) {
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

/// Where the daemon is and how to get in.
#[derive(Clone)]
struct Target {
    url: String,
    token: Option<String>,
}

impl Target {
    async fn open(&self) -> Result<WsClient, Failure> {
        let mut headers = http::HeaderMap::new();
        if let Some(token) = &self.token {
            let value = http::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| usage("error: the token is not a valid header value".into()))?;
            headers.insert(http::header::AUTHORIZATION, value);
        }
        WsClientBuilder::default()
            .set_headers(headers)
            .max_response_size(64 * 1024 * 1024)
            .build(&self.url)
            .await
            .map_err(|err| self.connect_failure(err))
    }

    /// Why the CLI could not connect: a daemon that refused it (wrong or missing token, an
    /// origin it does not allow) is not a daemon that is not running.
    fn connect_failure(&self, err: jsonrpsee::core::ClientError) -> Failure {
        use jsonrpsee::client_transport::ws::WsHandshakeError;
        let url = &self.url;
        let rejected = match &err {
            jsonrpsee::core::ClientError::Transport(inner) => {
                match inner.downcast_ref::<WsHandshakeError>() {
                    Some(WsHandshakeError::Rejected { status_code }) => Some(*status_code),
                    _ => None,
                }
            }
            _ => None,
        };
        match rejected {
            Some(401) if self.token.is_some() => Failure {
                code: Exit::Refused,
                line: format!("unauthorized: the daemon at {url} refused this token"),
            },
            Some(401) => Failure {
                code: Exit::Refused,
                line: format!(
                    "unauthorized: the daemon at {url} wants a token (--token or TETHER_TOKEN)"
                ),
            },
            Some(status) => Failure {
                code: Exit::Refused,
                line: format!("refused: the daemon at {url} answered HTTP {status}"),
            },
            None => Failure {
                code: Exit::NotRunning,
                line: format!(
                    "server not running at {url} (start it with `supervisor serve`): {err}"
                ),
            },
        }
    }

    /// Connects again after the daemon went away, within [`RECONNECT_WINDOW`]. There is no
    /// event to await for a daemon that is not there yet, so this retries with a growing
    /// delay.
    async fn reopen(&self, shown: &Shown) -> Result<WsClient, Failure> {
        shown.line(&format!("the daemon at {} went away; reconnecting", self.url));
        let deadline = Instant::now() + RECONNECT_WINDOW;
        let mut delay = Duration::from_millis(100);
        loop {
            match self.open().await {
                Ok(client) => {
                    shown.line("reconnected");
                    return Ok(client);
                }
                Err(failure) if failure.code != Exit::NotRunning || Instant::now() >= deadline => {
                    return Err(failure);
                }
                Err(_) => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}

struct Client {
    target: Target,
    client: Arc<WsClient>,
}

/// What a failed call means for the exit code.
fn call_failure(target: &Target, client: &WsClient, err: jsonrpsee::core::ClientError) -> Failure {
    match err {
        jsonrpsee::core::ClientError::Call(object) => {
            let kind = protocol::errors::ErrorData::of(&object).map(|data| data.kind);
            let message = object.message();
            match kind {
                Some(ErrorKind::NotFound) => {
                    Failure { code: Exit::NotFound, line: format!("not found: {message}") }
                }
                Some(ErrorKind::Conflict) => {
                    Failure { code: Exit::Conflict, line: format!("conflict: {message}") }
                }
                Some(kind) => {
                    Failure { code: Exit::Error, line: format!("error ({kind}): {message}") }
                }
                None => Failure { code: Exit::Error, line: format!("error: {message}") },
            }
        }
        other if !client.is_connected() => Failure {
            code: Exit::NotRunning,
            line: format!("server not running at {} (the connection closed: {other})", target.url),
        },
        other => Failure { code: Exit::Error, line: format!("error: {other}") },
    }
}

/// Prints `value` as pretty JSON.
fn print_json<T: Serialize>(value: &T) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|err| Failure { code: Exit::Error, line: format!("error: {err}") })?;
    println!("{text}");
    Ok(())
}

fn or_dash(value: Option<&str>) -> &str {
    value.unwrap_or("-")
}

impl Client {
    async fn connect(target: Target) -> Result<Client, Failure> {
        let client = Arc::new(target.open().await?);
        Ok(Client { target, client })
    }

    fn failure(&self, err: jsonrpsee::core::ClientError) -> Failure {
        call_failure(&self.target, &self.client, err)
    }

    async fn run(&self, command: Command) -> Result<(), Failure> {
        let api = &*self.client;
        match command {
            Command::Serve(_) => unreachable!("UNWRAP: dispatched before connecting"),
            Command::Agents(JsonFlag { json }) => {
                let agents = api.agents_list().await.map_err(|e| self.failure(e))?;
                if json {
                    return print_json(&agents);
                }
                for agent in agents {
                    let state = if agent.invalid {
                        format!("invalid profile: {}", agent.reasons.join("; "))
                    } else if agent.available {
                        "available".to_owned()
                    } else {
                        format!("unavailable: {}", agent.reasons.join("; "))
                    };
                    println!("{}\t{}\t{state}", agent.id, agent.display_name);
                }
                Ok(())
            }
            Command::Task(TaskCommand::Create { title, description, quiet }) => {
                let task =
                    api.task_create(title, Some(description)).await.map_err(|e| self.failure(e))?;
                if quiet {
                    println!("{}", task.id)
                } else {
                    println!("task {} created", task.id)
                }
                Ok(())
            }
            Command::Task(TaskCommand::List(JsonFlag { json })) => {
                let tasks = api.task_list().await.map_err(|e| self.failure(e))?;
                if json {
                    return print_json(&tasks);
                }
                for task in tasks {
                    println!("{}\t{}\t{}", task.id, task.state, task.title);
                }
                Ok(())
            }
            Command::Task(TaskCommand::Show { task, json: JsonFlag { json } }) => {
                let detail = api.task_get(task).await.map_err(|e| self.failure(e))?;
                if json {
                    return print_json(&detail);
                }
                println!("task {}: {} ({})", detail.task.id, detail.task.title, detail.task.state);
                for session in detail.sessions {
                    println!(
                        "  session {}\t{}\t{}",
                        session.id,
                        session.state.as_str(),
                        session.agent_profile_id
                    );
                }
                Ok(())
            }
            Command::Session(SessionCommand::Start(start)) => self.session_start(start).await,
            Command::Prompt { quiet, session, text } => {
                self.prompt(&session, &text.join(" "), quiet).await
            }
            Command::Resume { quiet, refresh_profile, session } => {
                let result = self.resume_with_progress(&session, quiet, refresh_profile).await?;
                println!(
                    "session {session} resumed ({}), {}",
                    result.outcome.as_str(),
                    result.state.as_str()
                );
                match (result.profile_refreshed, result.profile_drift.is_empty()) {
                    (true, _) => {
                        println!("adopted the current profile: {}", result.profile_drift.join(", "))
                    }
                    (false, false) => println!(
                        "the profile changed since the session started ({}); resume --refresh-profile adopts it",
                        result.profile_drift.join(", ")
                    ),
                    (false, true) => {}
                }
                Ok(())
            }
            Command::Status { session, json: JsonFlag { json } } => {
                let status = api.session_status(session).await.map_err(|e| self.failure(e))?;
                if json {
                    return print_json(&status);
                }
                print_fields(&status)
            }
            Command::Cancel { session } => {
                api.session_cancel(session.clone()).await.map_err(|e| self.failure(e))?;
                println!("session {session}: cancel sent (the turn ends as cancelled)");
                Ok(())
            }
            Command::Pause { session, reason, force_after_ms, no_wait } => {
                self.pause(&session, reason, force_after_ms, no_wait).await
            }
            Command::Permission(PermissionCommand::Respond { session, request, answer }) => {
                self.permission_respond(&session, &request, &answer).await
            }
            Command::Follow { session, after, json } => self.follow(&session, after, json).await,
            Command::Stop { session } => {
                api.session_stop(session.clone()).await.map_err(|e| self.failure(e))?;
                println!("session {session} stopped");
                Ok(())
            }
            Command::StopAll => {
                let result = api.stop_all().await.map_err(|e| self.failure(e))?;
                println!("stopped {} agent(s); their sessions stay resumable", result.stopped);
                Ok(())
            }
            Command::History { session, after, limit, json: JsonFlag { json } } => {
                let entries = api
                    .session_history(session, Some(after), Some(limit))
                    .await
                    .map_err(|e| self.failure(e))?;
                if json {
                    return print_json(&entries);
                }
                for entry in entries {
                    println!("[{}] {}: {}", entry.seq, entry.kind, entry.content);
                }
                Ok(())
            }
            Command::Sessions(SessionsCommand::List { task, status, agent, json }) => {
                let sessions =
                    api.session_list(task, status, agent).await.map_err(|e| self.failure(e))?;
                if json.json {
                    return print_json(&sessions);
                }
                for session in sessions {
                    println!(
                        "{}\t{}\t{}\ttask {}",
                        session.id,
                        session.state.as_str(),
                        session.agent_profile_id,
                        session.task_id
                    );
                }
                Ok(())
            }
            Command::Sessions(SessionsCommand::Show { session, json: JsonFlag { json } }) => {
                let status =
                    api.session_status(session.clone()).await.map_err(|e| self.failure(e))?;
                let timeline =
                    api.session_timeline(session, None).await.map_err(|e| self.failure(e))?;
                if json {
                    return print_json(&protocol::api::SessionDetail { status, timeline });
                }
                print_fields(&status)?;
                println!("executions:");
                for execution in &timeline.executions {
                    println!(
                        "  {}{}\tgeneration {}\t{}\t{}\t{} turn(s)",
                        execution.execution_id,
                        if execution.current { " (current)" } else { "" },
                        execution.generation.map_or_else(|| "-".into(), |g| g.to_string()),
                        or_dash(execution.status.as_deref()),
                        execution.resume_outcome.map_or("-", ResumeOutcome::as_str),
                        execution.turns
                    );
                }
                println!("turns:");
                for turn in &timeline.turns {
                    println!(
                        "  {}\t{}\t{}\t{}\tstarted {}\tended {}",
                        turn.turn_id,
                        turn.state.as_str(),
                        or_dash(turn.stop_reason.as_deref().or(turn.error.as_deref())),
                        turn.execution_id,
                        turn.started_at,
                        turn.ended_at.map_or_else(|| "-".into(), |at| at.to_string())
                    );
                }
                println!("timeline:");
                for entry in &timeline.entries {
                    println!("  {}	{}	{}", entry.seq, entry.at, describe_timeline(&entry.event));
                }
                Ok(())
            }
            Command::Snapshots(SnapshotsCommand::List { session, json }) => {
                let snapshots = api.snapshot_list(session).await.map_err(|e| self.failure(e))?;
                if json.json {
                    return print_json(&snapshots);
                }
                for snapshot in snapshots {
                    let context = match (snapshot.context_used, snapshot.context_size) {
                        (Some(used), Some(size)) => format!("context {used}/{size}"),
                        _ => "context -".into(),
                    };
                    println!(
                        "{}	{}	{}	{}	{}	{}{}",
                        snapshot.snapshot_id,
                        snapshot.trigger,
                        snapshot.taken_at,
                        or_dash(snapshot.git_branch.as_deref()),
                        or_dash(snapshot.git_head.as_deref()),
                        context,
                        if snapshot.git_dirty == Some(true) { "\tdirty" } else { "" },
                    );
                }
                Ok(())
            }
            Command::Snapshots(SnapshotsCommand::Get { snapshot }) => {
                let snapshot = api.snapshot_get(snapshot).await.map_err(|e| self.failure(e))?;
                print_json(&snapshot)
            }
            Command::Sessions(SessionsCommand::Delete { session, force, delete_branch }) => {
                api.session_delete(session.clone(), Some(force), Some(delete_branch))
                    .await
                    .map_err(|e| self.failure(e))?;
                println!("session {session} deleted");
                Ok(())
            }
            Command::Sessions(SessionsCommand::Cleanup {
                max_age_days,
                keep_completed,
                states,
                dry_run,
                force,
                json: JsonFlag { json },
            }) => {
                let states = (!states.is_empty()).then_some(states);
                let result = api
                    .cleanup(max_age_days, states, Some(keep_completed), Some(dry_run), Some(force))
                    .await
                    .map_err(|e| self.failure(e))?;
                if json {
                    return print_json(&result);
                }
                let verb = if result.dry_run { "would remove" } else { "removed" };
                for gone in &result.removed {
                    let with = if gone.resources.is_empty() {
                        String::new()
                    } else {
                        format!(" (with its {})", gone.resources.join(", "))
                    };
                    println!("{verb} {} {}{with}", gone.session_id, gone.state);
                }
                for kept in &result.kept {
                    println!("kept {} {}: {}", kept.session_id, kept.state, kept.reason);
                }
                println!("{verb} {} session(s), kept {}", result.removed.len(), result.kept.len());
                Ok(())
            }
        }
    }

    async fn session_start(&self, start: StartArgs) -> Result<(), Failure> {
        let StartArgs {
            agent,
            workspace,
            task,
            new_task,
            prompt,
            runtime,
            shared,
            worktree,
            no_worktree,
            base,
            labels,
            quiet,
        } = start;
        let worktree = match (worktree, no_worktree) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        };
        let api = &*self.client;
        let workspace = match workspace {
            Some(workspace) => {
                let workspace = std::path::absolute(&workspace)
                    .map_err(|err| usage(format!("error: --workspace: {err}")))?;
                Some(workspace.to_str().map(str::to_owned).ok_or_else(|| {
                    usage(format!(
                        "error: --workspace {}: not valid UTF-8 (the API carries paths as UTF-8 text)",
                        workspace.display()
                    ))
                })?)
            }
            None => None,
        };
        let task = match (task, new_task) {
            (Some(task), _) => task,
            (None, Some(title)) => {
                api.task_create(title, None).await.map_err(|e| self.failure(e))?.id
            }
            (None, None) => unreachable!("UNWRAP: clap requires one of --task, --new-task"),
        };
        let runtime = runtime.map(RuntimeKind::named);
        let row = api
            .session_create(
                task.clone(),
                agent.clone(),
                workspace,
                prompt,
                runtime,
                Some(shared),
                worktree,
                base,
                (!labels.is_empty()).then(|| labels.into_iter().collect()),
            )
            .await
            .map_err(|e| self.failure(e))?;
        let shown = Shown::new(quiet);
        let mut events = Feed::open(self, &row.id, Some(0), &shown).await?;
        loop {
            let event = events.next().await?;
            shown.progress(&event);
            if let EventKind::State { state, error } = &event.kind {
                match state {
                    SessionState::WaitingForInput | SessionState::Running => break,
                    SessionState::Failed => {
                        return Err(Failure {
                            code: Exit::Error,
                            line: format!(
                                "session {} failed: {}",
                                row.id,
                                error.as_deref().unwrap_or("")
                            ),
                        });
                    }
                    _ => {}
                }
            }
        }
        if quiet {
            println!("{}", row.id)
        } else {
            println!("session {} ready (agent {agent}, task {task})", row.id)
        }
        Ok(())
    }

    /// Resumes `session` while showing its progress events (a slow agent start says what
    /// it is doing instead of nothing), through the event that states the outcome.
    async fn resume_with_progress(
        &self,
        session: &str,
        quiet: bool,
        refresh_profile: bool,
    ) -> Result<ResumeResult, Failure> {
        let shown = Shown::new(quiet);
        let mut events = Feed::open(self, session, None, &shown).await?;
        let call = self.client.session_resume(session.to_owned(), Some(refresh_profile));
        tokio::pin!(call);
        let mut outcome_shown = false;
        let result = loop {
            tokio::select! {
                result = &mut call => break result.map_err(|e| self.failure(e))?,
                event = events.next() => match event {
                    Ok(event) => {
                        outcome_shown |= matches!(event.kind, EventKind::ResumeOutcome { .. });
                        shown.progress(&event);
                    }
                    // The stream is only for show: the call's answer is what counts.
                    Err(_) => return call.await.map_err(|e| self.failure(e)),
                },
            }
        };
        // The answer can overtake the outcome's event on the stream; show it too (a
        // resume that joined a running agent has none).
        while !quiet && !outcome_shown && result.outcome != ResumeOutcome::AlreadyRunning {
            let Ok(event) = events.next().await else { break };
            outcome_shown |= matches!(event.kind, EventKind::ResumeOutcome { .. });
            shown.progress(&event);
        }
        Ok(result)
    }

    /// Sends a prompt and prints the turn to its end. When the daemon restarts meanwhile,
    /// it reconnects and follows the same turn from the last event it printed.
    async fn prompt(&self, session: &str, text: &str, quiet: bool) -> Result<(), Failure> {
        let shown = Shown::new(quiet);
        let mut events = Feed::open(self, session, None, &shown).await?;
        events.follow_restarts = true;
        let started_after = events.cursor;
        // A prompt to a session without a live agent resumes it first, which can take a
        // while: its progress is shown as it happens, so the call runs beside the stream.
        let call = self.client.session_prompt(session.to_owned(), text.to_owned());
        tokio::pin!(call);
        let mut turn: Option<String> = None;
        let mut call_lost = false;
        // A turn started with our text since we began: ours, if the call's answer is lost.
        let mut candidate: Option<String> = None;
        // Turns seen starting and ending before the call answered with its turn id.
        let mut seen: Vec<SessionEvent> = Vec::new();
        let mut stdout = std::io::stdout();
        loop {
            let event = tokio::select! {
                started = &mut call, if turn.is_none() && !call_lost => {
                    match started {
                        Ok(started) => {
                            if let Some(ended) = seen.iter().find(|e| ends_turn(e, &started.turn_id)) {
                                return turn_result(ended);
                            }
                            turn = Some(started.turn_id);
                        }
                        // The daemon went away before it answered: whether it took the
                        // prompt is told by the stream (a `turn_started` with our text),
                        // seen already or found once reconnected.
                        Err(_) if !self.client.is_connected() => {
                            call_lost = true;
                            if let Some(id) = candidate.take() {
                                if let Some(ended) = seen.iter().find(|e| ends_turn(e, &id)) {
                                    return turn_result(ended);
                                }
                                turn = Some(id);
                            } else {
                                events.reconnect().await?;
                                if events.caught_up() {
                                    return Err(not_taken());
                                }
                            }
                        }
                        Err(err) => return Err(self.failure(err)),
                    }
                    continue;
                }
                event = events.next() => event?,
            };
            shown.progress(&event);
            match &event.kind {
                EventKind::TurnStarted { turn_id, prompt }
                    if turn.is_none() && prompt == text && event.seq > started_after =>
                {
                    if call_lost {
                        turn = Some(turn_id.clone());
                    } else {
                        candidate = Some(turn_id.clone());
                    }
                }
                EventKind::AgentMessageChunk { text } => {
                    let _ = write!(stdout, "{text}");
                    let _ = stdout.flush();
                }
                EventKind::ToolCall { update } => {
                    println!(
                        "\n[tool: {}]",
                        AcpUpdate::of(update).title.as_deref().unwrap_or("tool")
                    )
                }
                EventKind::PermissionRequest { request_id, .. } => println!(
                    "\n[permission requested: answer with `supervisor permission respond {session} {request_id} allow|deny`]"
                ),
                EventKind::TurnEnded { turn_id, .. } if turn.as_deref() == Some(turn_id) => {
                    return turn_result(&event);
                }
                _ => {}
            }
            if turn.is_none() && matches!(event.kind, EventKind::TurnEnded { .. }) {
                seen.push(event);
            }
            if call_lost && turn.is_none() && events.caught_up() {
                return Err(not_taken());
            }
        }
    }

    /// Answers a permission request; `allow`/`deny` pick the request's first option of
    /// that kind (read from its `permission_request` event).
    async fn permission_respond(
        &self,
        session: &str,
        request: &str,
        answer: &str,
    ) -> Result<(), Failure> {
        let option = match answer {
            "cancel" => None,
            "allow" | "deny" => {
                let params = self.permission_params(session, request).await?;
                // The agent's ACP params, as relayed.
                let asked: PermissionParams =
                    serde_json::from_value(params).map_err(|err| Failure {
                        code: Exit::Error,
                        line: format!("error: request {request}'s options do not parse: {err}"),
                    })?;
                let wanted: &[acp::PermissionOptionKind] = if answer == "allow" {
                    &[acp::PermissionOptionKind::AllowOnce, acp::PermissionOptionKind::AllowAlways]
                } else {
                    &[
                        acp::PermissionOptionKind::RejectOnce,
                        acp::PermissionOptionKind::RejectAlways,
                    ]
                };
                match asked.options.iter().find(|option| wanted.contains(&option.kind)) {
                    Some(option) => Some(option.option_id.to_string()),
                    None => {
                        return Err(usage(format!(
                            "error: request {request} offers no {answer} option; give an option id"
                        )));
                    }
                }
            }
            option_id => Some(option_id.to_owned()),
        };
        self.client
            .permission_respond(session.to_owned(), request.to_owned(), option.clone())
            .await
            .map_err(|e| self.failure(e))?;
        match option {
            Some(option) => println!("request {request} answered: {option}"),
            None => println!("request {request} cancelled"),
        }
        Ok(())
    }

    /// The ACP params of a session's permission request, from its event.
    async fn permission_params(
        &self,
        session: &str,
        request: &str,
    ) -> Result<serde_json::Value, Failure> {
        let shown = Shown::new(true);
        let mut events = Feed::open(self, session, Some(0), &shown).await?;
        let last = events.last_seq;
        while events.cursor < last {
            let event = events.next().await?;
            if let EventKind::PermissionRequest { request_id, params } = event.kind
                && request_id == request
            {
                return Ok(params);
            }
        }
        Err(Failure {
            code: Exit::NotFound,
            line: format!("not found: session {session} has no permission request {request}"),
        })
    }

    /// Prints a session's events until it ends, across daemon restarts.
    async fn pause(
        &self,
        session: &str,
        reason: Option<String>,
        force_after_ms: Option<u64>,
        no_wait: bool,
    ) -> Result<(), Failure> {
        let api = &*self.client;
        // Where the stream is now, so that the pause's own events are not missed.
        let status = api.session_status(session.to_owned()).await.map_err(|e| self.failure(e))?;
        let paused = api
            .session_pause(session.to_owned(), reason, force_after_ms)
            .await
            .map_err(|e| self.failure(e))?;
        if !paused.pause_requested {
            println!("session {session} paused");
            return Ok(());
        }
        println!("session {session}: pause requested; the running turn finishes first");
        if no_wait {
            return Ok(());
        }
        let shown = Shown::new(false);
        let mut events = Feed::open(self, session, Some(status.last_event_seq), &shown).await?;
        events.follow_restarts = true;
        loop {
            let event = events.next().await?;
            match event.kind {
                EventKind::Paused { forced, .. } => {
                    let how = if forced { " (the turn was cancelled)" } else { "" };
                    println!("session {session} paused{how}");
                    return Ok(());
                }
                EventKind::State { state, .. } if state.is_at_rest() => {
                    return Err(Failure {
                        code: Exit::Conflict,
                        line: format!("error: session {session} ended ({state}) before it paused"),
                    });
                }
                _ => {}
            }
        }
    }

    async fn follow(&self, session: &str, after: Option<u64>, json: bool) -> Result<(), Failure> {
        let shown = Shown::new(json);
        let mut events = Feed::open(self, session, after, &shown).await?;
        events.follow_restarts = true;
        if after.is_none() && events.state.is_at_rest() {
            // Nothing more will happen (until a resume); `--after` replays what did.
            let what = if events.state.is_terminal() { "has ended" } else { "is at rest" };
            eprintln!("session {session} {what} ({}); nothing to follow", events.state);
            return Ok(());
        }
        loop {
            let event = events.next().await?;
            if json {
                let line = serde_json::to_string(&event)
                    .map_err(|err| Failure { code: Exit::Error, line: format!("error: {err}") })?;
                println!("{line}");
            } else {
                println!("[{}] {}", event.seq, describe(&event.kind));
            }
            if let EventKind::State { state, .. } = event.kind
                && state.is_at_rest()
            {
                return Ok(());
            }
        }
    }
}

/// Prints a struct's members as `key: value` lines.
fn print_fields<T: Serialize>(value: &T) -> Result<(), Failure> {
    let value = serde_json::to_value(value)
        .map_err(|err| Failure { code: Exit::Error, line: format!("error: {err}") })?;
    for (key, value) in value.as_object().into_iter().flatten() {
        let shown = match value {
            serde_json::Value::String(text) => text.clone(),
            serde_json::Value::Null => "-".into(),
            other => other.to_string(),
        };
        println!("{key}: {shown}");
    }
    Ok(())
}

/// What a launch step is doing, in words.
fn step_name(step: LaunchStep) -> &'static str {
    match step {
        LaunchStep::Launching => "launching the agent",
        LaunchStep::Initializing => "the agent is starting (initialize)",
        LaunchStep::Authenticating => "authenticating",
        LaunchStep::Restoring => "restoring the agent's session",
        LaunchStep::Opening => "opening an agent session",
    }
}

/// A progress event's line.
fn progress_line(step: LaunchStep, detail: Option<&str>) -> String {
    match detail {
        Some(detail) => format!("{}: {detail}", step_name(step)),
        None => step_name(step).to_owned(),
    }
}

/// One line for an event, as `follow` prints it.
fn describe(kind: &EventKind) -> String {
    match kind {
        EventKind::State { state, error } => match error {
            Some(error) => format!("state {}: {error}", state.as_str()),
            None => format!("state {}", state.as_str()),
        },
        EventKind::TurnStarted { turn_id, prompt } => format!("turn {turn_id} started: {prompt}"),
        EventKind::AgentMessageChunk { text } => format!("agent: {text}"),
        EventKind::AgentThoughtChunk { text } => format!("thought: {text}"),
        EventKind::ToolCall { update } => {
            format!("tool: {}", AcpUpdate::of(update).title.as_deref().unwrap_or("tool"))
        }
        EventKind::ToolCallUpdate { update } => {
            format!("tool update: {}", AcpUpdate::of(update).status.as_deref().unwrap_or("-"))
        }
        EventKind::SessionUpdate { update } => {
            format!("update: {}", AcpUpdate::of(update).kind.as_deref().unwrap_or("-"))
        }
        EventKind::PermissionRequest { request_id, .. } => {
            format!("permission requested: {request_id}")
        }
        EventKind::PermissionResolved { request_id, .. } => {
            format!("permission resolved: {request_id}")
        }
        EventKind::TurnEnded { turn_id, state, stop_reason, error } => format!(
            "turn {turn_id} {}: {}",
            state.as_str(),
            stop_reason.as_deref().or(error.as_deref()).unwrap_or("-")
        ),
        EventKind::Notice { message } => format!("notice: {message}"),
        EventKind::Progress { step, detail } => progress_line(*step, detail.as_deref()),
        EventKind::ResumeOutcome { outcome } => format!("resumed: {}", outcome.as_str()),
        _ => "event".to_owned(),
    }
}

/// How many resubscriptions in a row may bring no event before the feed gives up.
const MAX_EMPTY_RESUBSCRIBES: u32 = 5;

/// A prompt whose call was cut off and whose turn never showed up.
fn not_taken() -> Failure {
    Failure {
        code: Exit::Error,
        line: "error: the daemon restarted before it took the prompt; send it again".into(),
    }
}

/// What the CLI reads of an ACP update it relays (tool calls, other session updates).
#[derive(Debug, Default, Deserialize)]
struct AcpUpdate {
    title: Option<String>,
    status: Option<String>,
    #[serde(rename = "sessionUpdate")]
    kind: Option<String>,
}

impl AcpUpdate {
    fn of(update: &serde_json::Value) -> AcpUpdate {
        AcpUpdate::deserialize(update).unwrap_or_default()
    }
}

/// What the CLI reads of an ACP `session/request_permission`.
#[derive(Debug, Deserialize)]
struct PermissionParams {
    options: Vec<acp::PermissionOption>,
}

fn ends_turn(event: &SessionEvent, turn: &str) -> bool {
    matches!(&event.kind, EventKind::TurnEnded { turn_id, .. } if turn_id == turn)
}

/// Prints how a turn ended; a turn that did not complete is exit code 1.
fn turn_result(event: &SessionEvent) -> Result<(), Failure> {
    let EventKind::TurnEnded { state, stop_reason, error, .. } = &event.kind else {
        return Err(Failure { code: Exit::Error, line: "error: not a turn's end".into() });
    };
    let name = state.as_str();
    match stop_reason {
        Some(reason) => println!("\n[turn {name}: {reason}]"),
        None => println!("\n[turn {name}: {}]", error.as_deref().unwrap_or("")),
    }
    if *state == TurnState::Completed {
        Ok(())
    } else {
        Err(Failure { code: Exit::Error, line: "error: the turn failed".into() })
    }
}

/// Shows, on stderr, what a session does while the user waits: the steps of bringing its
/// agent up (with the time since the command started), notices, a resume's outcome and
/// reconnects. Nothing with `--quiet`.
struct Shown {
    quiet: bool,
    started: Instant,
}

impl Shown {
    fn new(quiet: bool) -> Shown {
        Shown { quiet, started: Instant::now() }
    }

    fn line(&self, line: &str) {
        if !self.quiet {
            eprintln!("[{:5.1}s] {line}", self.started.elapsed().as_secs_f64());
        }
    }

    fn progress(&self, event: &SessionEvent) {
        let line = match &event.kind {
            EventKind::Progress { step, detail } => progress_line(*step, detail.as_deref()),
            EventKind::Notice { message } => format!("notice: {message}"),
            EventKind::ResumeOutcome { outcome } => format!("resumed: {}", outcome.as_str()),
            _ => return,
        };
        self.line(&line);
    }
}

/// A session's events from a cursor, resubscribing after the last one seen when the
/// client library drops the subscription or a notification (it does when the reader falls
/// behind), and — with `follow_restarts` — reconnecting when the daemon restarts. Session
/// event seqs have no gaps, so a gap means a dropped notification.
struct Feed<'a> {
    target: Target,
    client: Arc<WsClient>,
    shown: &'a Shown,
    session: String,
    cursor: u64,
    /// The session's newest event when the feed (re)connected.
    last_seq: u64,
    subscription: Subscription<SessionEvent>,
    follow_restarts: bool,
    /// The session's state when the feed (re)connected.
    state: SessionState,
    /// Resubscriptions in a row that brought no event: a stream the daemon keeps ending
    /// is an error, not a loop.
    empty_resubscribes: u32,
}

impl<'a> Feed<'a> {
    /// The session's events after `after`, or, without one, from its newest event on
    /// (what happens after now).
    async fn open(
        client: &Client,
        session: &str,
        after: Option<u64>,
        shown: &'a Shown,
    ) -> Result<Feed<'a>, Failure> {
        let status = client
            .client
            .session_status(session.to_owned())
            .await
            .map_err(|e| client.failure(e))?;
        let after = after.unwrap_or(status.last_event_seq);
        let subscription = client
            .client
            .session_subscribe(session.to_owned(), Some(after))
            .await
            .map_err(|e| client.failure(e))?;
        Ok(Feed {
            target: client.target.clone(),
            client: Arc::clone(&client.client),
            shown,
            session: session.to_owned(),
            cursor: after,
            last_seq: status.last_event_seq,
            subscription,
            follow_restarts: false,
            state: status.state,
            empty_resubscribes: 0,
        })
    }

    /// Connects to the daemon again (it went away) and resubscribes after the cursor.
    async fn reconnect(&mut self) -> Result<(), Failure> {
        self.client = Arc::new(self.target.reopen(self.shown).await?);
        let status = self
            .client
            .session_status(self.session.clone())
            .await
            .map_err(|e| call_failure(&self.target, &self.client, e))?;
        self.last_seq = status.last_event_seq;
        self.state = status.state;
        self.empty_resubscribes = 0;
        self.resubscribe().await
    }

    /// Every event up to the newest one at (re)connection has been delivered.
    fn caught_up(&self) -> bool {
        self.cursor >= self.last_seq
    }

    async fn resubscribe(&mut self) -> Result<(), Failure> {
        self.empty_resubscribes += 1;
        if self.empty_resubscribes > MAX_EMPTY_RESUBSCRIBES {
            return Err(Failure {
                code: Exit::Error,
                line: format!(
                    "error: the daemon at {} keeps ending the event stream of session {}",
                    self.target.url, self.session
                ),
            });
        }
        let subscription = self
            .client
            .session_subscribe(self.session.clone(), Some(self.cursor))
            .await
            .map_err(|e| call_failure(&self.target, &self.client, e))?;
        self.subscription = subscription;
        Ok(())
    }

    async fn next(&mut self) -> Result<SessionEvent, Failure> {
        loop {
            match self.subscription.next().await {
                Some(Ok(event)) => {
                    if event.seq <= self.cursor {
                        continue;
                    }
                    if event.seq > self.cursor + 1 {
                        self.resubscribe().await?;
                        continue;
                    }
                    self.cursor = event.seq;
                    self.empty_resubscribes = 0;
                    return Ok(event);
                }
                Some(Err(err)) => {
                    return Err(Failure {
                        code: Exit::Error,
                        line: format!("error: malformed event: {err}"),
                    });
                }
                None if self.client.is_connected() => self.resubscribe().await?,
                None if self.follow_restarts => self.reconnect().await?,
                None => {
                    return Err(Failure {
                        code: Exit::NotRunning,
                        line: format!(
                            "server not running at {} (the connection closed)",
                            self.target.url
                        ),
                    });
                }
            }
        }
    }
}

/// One timeline entry, as `sessions show` prints it.
fn describe_timeline(event: &protocol::api::TimelineEvent) -> String {
    use protocol::api::TimelineEvent as E;
    match event {
        E::ExecutionStarted { execution_id, generation } => {
            format!("execution started\t{execution_id} (generation {generation})")
        }
        E::State { state, error } => match error {
            Some(error) => format!("state {state}\t{error}"),
            None => format!("state {state}"),
        },
        E::TurnStarted { turn_id, .. } => format!("turn started\t{turn_id}"),
        E::TurnEnded { turn_id, state, stop_reason, error } => format!(
            "turn {state}\t{turn_id}\t{}",
            or_dash(error.as_deref().or(stop_reason.as_deref()))
        ),
        E::PauseRequested { reason, trigger, force_at } => format!(
            "pause requested ({trigger})\t{}\tforced at {force_at}",
            or_dash(reason.as_deref())
        ),
        E::Paused { reason, trigger, forced } => format!(
            "paused ({trigger}{})\t{}",
            if *forced { ", forced" } else { "" },
            or_dash(reason.as_deref())
        ),
        E::Resumed { outcome, execution_id } => format!("resumed ({outcome})\t{execution_id}"),
        E::SnapshotTaken { snapshot_id, trigger } => format!("snapshot ({trigger})\t{snapshot_id}"),
        E::Error { message } => format!("error\t{message}"),
    }
}

/// A `--label KEY=VALUE`.
fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}
