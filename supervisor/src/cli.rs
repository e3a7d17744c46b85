//! The `supervisor` command line: `serve` runs the daemon; every other command is a client
//! of a running daemon's API and prints plain, specific lines. Exit codes: 0 ok, 1 other
//! error, 2 usage, 3 server not running, 4 not found, 5 conflict, 6 refused (a missing or
//! wrong token).

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentctl::client::object_params;
use agents::registry::{DEFAULT_DEBOUNCE, Environment, Registry};
use anyhow::{Context, bail};
use jsonrpsee::core::client::{ClientT, SubscriptionClientT};
use jsonrpsee::ws_client::{WsClient, WsClientBuilder};
use serde_json::{Value, json};

use crate::api::{self, AccessPolicy, method};
use crate::home::Home;
use crate::runtime::StandaloneRuntime;
use crate::runtime::docker::{DockerConfig, DockerRuntime};
use crate::service::{Supervisor, SupervisorConfig};
use crate::store::Store;

/// The default API address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7733";

const USAGE: &str = "\
usage: supervisor [--url URL] [--token TOKEN] <command>

daemon:
  serve [--listen ADDR] [--home DIR] [--auth-token-file FILE | --auth-token TOKEN]
        [--allow-origin ORIGIN]...  (or the token in TETHER_AUTH_TOKEN; a file must be 0600)
        [--static-agentctl PATH]     (for the Docker runtime; or $TETHER_STATIC_AGENTCTL)

client (talks to a running daemon; --url defaults to ws://127.0.0.1:7733, or $TETHER_URL):
  agents
  task create TITLE [--description TEXT]
  task list
    session start --agent PROFILE --workspace DIR (--task ID | --new-task TITLE) [--prompt TEXT]
                [--runtime standalone|docker] [--quiet]
  prompt SESSION TEXT          (resumes the session first if its agent is not running)
  resume SESSION
  status SESSION
  sessions list [--task ID]
  sessions show SESSION
  sessions delete SESSION
  stop SESSION
  stop-all                     stop every agent and sidecar; sessions stay resumable
  history SESSION

`serve` leaves agent sidecars running when it gets SIGTERM, so a restart loses nothing; it
re-adopts them when it starts again.
";

/// A failure with its exit code and the one line to print.
struct Failure {
    code: i32,
    line: String,
}

impl From<anyhow::Error> for Failure {
    fn from(err: anyhow::Error) -> Failure {
        Failure { code: 1, line: format!("error: {err:#}") }
    }
}

/// Runs the command line (without the program name); returns the exit code.
pub fn main(args: Vec<String>, self_command: Vec<OsString>) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the runtime: {err}");
            return 1;
        }
    };
    match runtime.block_on(dispatch(args, self_command)) {
        Ok(()) => 0,
        Err(failure) => {
            eprintln!("{}", failure.line);
            failure.code
        }
    }
}

fn usage(message: &str) -> Failure {
    Failure { code: 2, line: format!("{message}\n\n{USAGE}") }
}

/// Pulls `--name VALUE` out of `args`.
fn take_option(args: &mut Vec<String>, name: &str) -> Result<Option<String>, Failure> {
    match args.iter().position(|arg| arg == name) {
        Some(idx) if idx + 1 < args.len() => {
            let value = args.remove(idx + 1);
            args.remove(idx);
            Ok(Some(value))
        }
        Some(_) => Err(usage(&format!("{name} needs a value"))),
        None => Ok(None),
    }
}

fn take_flag(args: &mut Vec<String>, name: &str) -> bool {
    match args.iter().position(|arg| arg == name) {
        Some(idx) => {
            args.remove(idx);
            true
        }
        None => false,
    }
}

async fn dispatch(mut args: Vec<String>, self_command: Vec<OsString>) -> Result<(), Failure> {
    let url = take_option(&mut args, "--url")?
        .or_else(|| std::env::var("TETHER_URL").ok())
        .unwrap_or_else(|| format!("ws://{DEFAULT_LISTEN}"));
    let token = take_option(&mut args, "--token")?.or_else(|| std::env::var("TETHER_TOKEN").ok());
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["serve", rest @ ..] if rest.iter().any(|arg| matches!(*arg, "-h" | "--help")) => {
            print!("{USAGE}");
            Ok(())
        }
        ["serve", ..] => serve(args[1..].to_vec(), self_command).await.map_err(Failure::from),
        ["-h" | "--help"] | [] => {
            print!("{USAGE}");
            Ok(())
        }
        _ => {
            // A client command's output may go to `head`: when the reader goes, the
            // command ends quietly as Unix tools do, instead of panicking in a print.
            // SAFETY: restores the default disposition of one signal before any thread of
            // ours writes to a pipe; no handler is installed. The daemon (above) keeps
            // Rust's "ignore", since it writes to sockets and agents' pipes.
            let _ = unsafe {
                nix::sys::signal::signal(
                    nix::sys::signal::Signal::SIGPIPE,
                    nix::sys::signal::SigHandler::SigDfl,
                )
            };
            let client = Client::connect(&url, token.as_deref()).await?;
            client.run(args).await
        }
    }
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

async fn serve(mut args: Vec<String>, self_command: Vec<OsString>) -> anyhow::Result<()> {
    let listen: SocketAddr = take_option(&mut args, "--listen")
        .map_err(|f| anyhow::anyhow!(f.line))?
        .unwrap_or_else(|| DEFAULT_LISTEN.into())
        .parse()
        .context("--listen: not an address")?;
    let home =
        take_option(&mut args, "--home").map_err(|f| anyhow::anyhow!(f.line))?.map(PathBuf::from);
    let token = take_option(&mut args, "--auth-token").map_err(|f| anyhow::anyhow!(f.line))?;
    let token_file =
        take_option(&mut args, "--auth-token-file").map_err(|f| anyhow::anyhow!(f.line))?;
    // A token in argv shows in `ps`: a 0600 file or the environment keeps it out of sight.
    let token = match (token, token_file) {
        (Some(_), Some(_)) => bail!("give --auth-token or --auth-token-file, not both"),
        (Some(token), None) => Some(token),
        (None, Some(path)) => Some(read_token_file(Path::new(&path))?),
        (None, None) => std::env::var("TETHER_AUTH_TOKEN").ok().filter(|t| !t.is_empty()),
    };
    let static_agentctl = take_option(&mut args, "--static-agentctl")
        .map_err(|f| anyhow::anyhow!(f.line))?
        .or_else(|| std::env::var("TETHER_STATIC_AGENTCTL").ok())
        .map(PathBuf::from);
    let mut allowed_origins = Vec::new();
    while let Some(origin) =
        take_option(&mut args, "--allow-origin").map_err(|f| anyhow::anyhow!(f.line))?
    {
        allowed_origins.push(origin);
    }
    if let Some(extra) = args.first() {
        bail!("unknown argument {extra:?}\n\n{USAGE}");
    }
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
    let root = home
        .or_else(Home::default_root)
        .context("no data directory: set TETHER_HOME or HOME, or pass --home")?;
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
    let supervisor = Arc::new(Supervisor::new(SupervisorConfig {
        home: home.clone(),
        store,
        registry,
        environment,
        standalone: Arc::new(StandaloneRuntime { agentctl }),
        docker: Arc::new(DockerRuntime::new(DockerConfig {
            agentctl: static_agentctl.map(|path| std::path::absolute(&path).unwrap_or(path)),
            install_id: home.install_id().context("cannot read or create the install id")?,
        })),
        applets,
    }));
    // Restart recovery happens before the API serves anything.
    supervisor.recover().await?;
    let policy = AccessPolicy { token, allowed_origins };
    let (addr, handle) = api::serve(listen, policy, supervisor)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    println!("tether serving on ws://{addr} (data in {})", home.root().display());
    let _ = std::io::stdout().flush();
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping the API; agent sidecars keep running"),
        _ = int.recv() => tracing::info!("SIGINT: stopping the API; agent sidecars keep running"),
        () = handle.clone().stopped() => {}
    }
    let _ = handle.stop();
    handle.stopped().await;
    Ok(())
}

struct Client {
    url: String,
    client: WsClient,
}

/// Why the CLI could not connect: a daemon that refused it (wrong or missing token, an
/// origin it does not allow) is not a daemon that is not running.
fn connect_failure(url: &str, had_token: bool, err: jsonrpsee::core::ClientError) -> Failure {
    use jsonrpsee::client_transport::ws::WsHandshakeError;
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
        Some(401) if had_token => Failure {
            code: 6,
            line: format!("unauthorized: the daemon at {url} refused this token"),
        },
        Some(401) => Failure {
            code: 6,
            line: format!(
                "unauthorized: the daemon at {url} wants a token (--token or TETHER_TOKEN)"
            ),
        },
        Some(status) => Failure {
            code: 6,
            line: format!("refused: the daemon at {url} answered HTTP {status}"),
        },
        None => Failure {
            code: 3,
            line: format!("server not running at {url} (start it with `supervisor serve`): {err}"),
        },
    }
}

impl Client {
    async fn connect(url: &str, token: Option<&str>) -> Result<Client, Failure> {
        let mut headers = http::HeaderMap::new();
        if let Some(token) = token {
            let value = http::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| usage("the token is not a valid header value"))?;
            headers.insert(http::header::AUTHORIZATION, value);
        }
        let client = WsClientBuilder::default()
            .set_headers(headers)
            .build(url)
            .await
            .map_err(|err| connect_failure(url, token.is_some(), err))?;
        Ok(Client { url: url.to_owned(), client })
    }

    async fn call(&self, method: &str, params: Value) -> Result<Value, Failure> {
        self.client.request(method, object_params(params)).await.map_err(|err| self.failure(err))
    }

    fn failure(&self, err: jsonrpsee::core::ClientError) -> Failure {
        match err {
            jsonrpsee::core::ClientError::Call(object) => {
                let kind = object
                    .data()
                    .and_then(|data| serde_json::from_str::<Value>(data.get()).ok())
                    .and_then(|data| data["kind"].as_str().map(str::to_owned))
                    .unwrap_or_default();
                let message = object.message();
                match kind.as_str() {
                    "not_found" => Failure { code: 4, line: format!("not found: {message}") },
                    "conflict" => Failure { code: 5, line: format!("conflict: {message}") },
                    "" => Failure { code: 1, line: format!("error: {message}") },
                    other => Failure { code: 1, line: format!("error ({other}): {message}") },
                }
            }
            other if !self.client.is_connected() => Failure {
                code: 3,
                line: format!(
                    "server not running at {} (the connection closed: {other})",
                    self.url
                ),
            },
            other => Failure { code: 1, line: format!("error: {other}") },
        }
    }

    async fn run(&self, mut args: Vec<String>) -> Result<(), Failure> {
        let quiet = take_flag(&mut args, "--quiet");
        let words: Vec<String> = args.clone();
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        match words.as_slice() {
            ["agents"] => {
                let agents = self.call(method::AGENTS_LIST, json!({})).await?;
                for agent in agents.as_array().into_iter().flatten() {
                    let state = if agent["invalid"] == true {
                        format!(
                            "invalid profile: {}",
                            agent["reasons"][0].as_str().unwrap_or_default()
                        )
                    } else if agent["available"] == true {
                        "available".to_owned()
                    } else {
                        format!(
                            "unavailable: {}",
                            agent["reasons"]
                                .as_array()
                                .map(|r| r
                                    .iter()
                                    .filter_map(Value::as_str)
                                    .collect::<Vec<_>>()
                                    .join("; "))
                                .unwrap_or_default()
                        )
                    };
                    println!(
                        "{}\t{}\t{state}",
                        agent["id"].as_str().unwrap_or(""),
                        agent["display_name"].as_str().unwrap_or("")
                    );
                }
                Ok(())
            }
            ["task", "create", ..] => {
                let description = take_option(&mut args, "--description")?.unwrap_or_default();
                let [_, _, title] = args.as_slice() else {
                    return Err(usage("task create takes one TITLE"));
                };
                let task = self
                    .call(method::TASK_CREATE, json!({"title": title, "description": description}))
                    .await?;
                let id = task["id"].as_str().unwrap_or_default();
                if quiet {
                    println!("{id}")
                } else {
                    println!("task {id} created")
                }
                Ok(())
            }
            ["task", "list"] => {
                for task in
                    self.call(method::TASK_LIST, json!({})).await?.as_array().into_iter().flatten()
                {
                    println!(
                        "{}\t{}\t{}",
                        task["id"].as_str().unwrap_or(""),
                        task["state"].as_str().unwrap_or(""),
                        task["title"].as_str().unwrap_or("")
                    );
                }
                Ok(())
            }
            ["session", "start", ..] => self.session_start(args, quiet).await,
            ["prompt", session, text] => self.prompt(session, text, quiet).await,
            ["status", session] | ["sessions", "show", session] => {
                let status =
                    self.call(method::SESSION_STATUS, json!({"session_id": session})).await?;
                for (key, value) in status.as_object().into_iter().flatten() {
                    let shown = match value {
                        Value::String(text) => text.clone(),
                        Value::Null => "-".into(),
                        other => other.to_string(),
                    };
                    println!("{key}: {shown}");
                }
                Ok(())
            }
            ["sessions", "list", ..] => {
                let task = take_option(&mut args, "--task")?;
                let sessions = self.call(method::SESSION_LIST, json!({"task_id": task})).await?;
                for session in sessions.as_array().into_iter().flatten() {
                    println!(
                        "{}\t{}\t{}\ttask {}",
                        session["id"].as_str().unwrap_or(""),
                        session["state"].as_str().unwrap_or(""),
                        session["agent_profile_id"].as_str().unwrap_or(""),
                        session["task_id"].as_str().unwrap_or("")
                    );
                }
                Ok(())
            }
            ["sessions", "delete", session] => {
                self.call(method::SESSION_DELETE, json!({"session_id": session})).await?;
                println!("session {session} deleted");
                Ok(())
            }
            ["resume", session] => {
                let result = self.resume_with_progress(session, quiet).await?;
                println!(
                    "session {session} resumed ({}), {}",
                    result["outcome"].as_str().unwrap_or(""),
                    result["state"].as_str().unwrap_or("")
                );
                Ok(())
            }
            ["stop-all"] => {
                let result = self.call(method::STOP_ALL, json!({})).await?;
                println!("stopped {} agent(s); their sessions stay resumable", result["stopped"]);
                Ok(())
            }
            ["stop", session] => {
                self.call(method::SESSION_STOP, json!({"session_id": session})).await?;
                println!("session {session} stopped");
                Ok(())
            }
            ["history", session] => {
                let entries =
                    self.call(method::SESSION_HISTORY, json!({"session_id": session})).await?;
                for entry in entries.as_array().into_iter().flatten() {
                    println!(
                        "[{}] {}: {}",
                        entry["seq"],
                        entry["type"].as_str().unwrap_or(""),
                        entry["content"].as_str().unwrap_or("")
                    );
                }
                Ok(())
            }
            _ => Err(usage("unknown command")),
        }
    }

    async fn session_start(&self, mut args: Vec<String>, quiet: bool) -> Result<(), Failure> {
        let agent = take_option(&mut args, "--agent")?
            .ok_or_else(|| usage("session start needs --agent"))?;
        let workspace = take_option(&mut args, "--workspace")?
            .ok_or_else(|| usage("session start needs --workspace"))?;
        let prompt = take_option(&mut args, "--prompt")?;
        let runtime = take_option(&mut args, "--runtime")?;
        let task = match (take_option(&mut args, "--task")?, take_option(&mut args, "--new-task")?)
        {
            (Some(task), None) => task,
            (None, Some(title)) => {
                let task = self.call(method::TASK_CREATE, json!({"title": title})).await?;
                task["id"].as_str().unwrap_or_default().to_owned()
            }
            _ => return Err(usage("session start needs one of --task ID or --new-task TITLE")),
        };
        let workspace =
            std::path::absolute(&workspace).map_err(|err| usage(&format!("--workspace: {err}")))?;
        let row = self
            .call(
                method::SESSION_CREATE,
                json!({"task_id": task, "agent_profile_id": agent, "workspace_path": workspace, "prompt": prompt, "runtime": runtime}),
            )
            .await?;
        let session = row["id"].as_str().unwrap_or_default().to_owned();
        let mut events = Feed::open(self, &session, 0).await?;
        let shown = Shown::new(quiet);
        loop {
            let event = events.next(self).await?;
            shown.progress(&event);
            if event["type"] == "state" {
                match event["state"].as_str() {
                    Some("WAITING_FOR_INPUT") | Some("RUNNING") => break,
                    Some("FAILED") => {
                        return Err(Failure {
                            code: 1,
                            line: format!(
                                "session {session} failed: {}",
                                event["error"].as_str().unwrap_or("")
                            ),
                        });
                    }
                    _ => {}
                }
            }
        }
        if quiet {
            println!("{session}")
        } else {
            println!("session {session} ready (agent {agent}, task {task})")
        }
        Ok(())
    }

    async fn subscribe(
        &self,
        session: &str,
        after: u64,
    ) -> Result<jsonrpsee::core::client::Subscription<Value>, Failure> {
        self.client
            .subscribe(
                method::SESSION_SUBSCRIBE,
                object_params(json!({"session_id": session, "after_seq": after})),
                method::SESSION_UNSUBSCRIBE,
            )
            .await
            .map_err(|err| self.failure(err))
    }

    /// Resumes `session` while showing its progress events (a slow agent start says what
    /// it is doing instead of nothing), through the event that states the outcome.
    async fn resume_with_progress(&self, session: &str, quiet: bool) -> Result<Value, Failure> {
        let mut events = Feed::open_at_end(self, session).await?;
        let shown = Shown::new(quiet);
        let call = self.call(method::SESSION_RESUME, json!({"session_id": session}));
        tokio::pin!(call);
        let mut outcome_shown = false;
        let result = loop {
            tokio::select! {
                result = &mut call => break result?,
                event = events.next(self) => match event {
                    Ok(event) => {
                        outcome_shown |= event["type"] == "resume_outcome";
                        shown.progress(&event);
                    }
                    // The stream is only for show: the call's answer is what counts.
                    Err(_) => return call.await,
                },
            }
        };
        // The answer can overtake the outcome's event on the stream; show it too (a
        // resume that joined a running agent has none).
        while !quiet && !outcome_shown && result["outcome"] != "already_running" {
            let Ok(event) = events.next(self).await else { break };
            outcome_shown |= event["type"] == "resume_outcome";
            shown.progress(&event);
        }
        Ok(result)
    }

    async fn prompt(&self, session: &str, text: &str, quiet: bool) -> Result<(), Failure> {
        let mut events = Feed::open_at_end(self, session).await?;
        // A prompt to a session without a live agent resumes it first, which can take a
        // while: its progress is shown as it happens, so the call runs beside the stream.
        let call =
            self.call(method::SESSION_PROMPT, json!({"session_id": session, "prompt": text}));
        tokio::pin!(call);
        let mut turn: Option<Value> = None;
        // Turn ends seen before the call answered with its turn id.
        let mut early: Vec<Value> = Vec::new();
        let shown = Shown::new(quiet);
        let mut stdout = std::io::stdout();
        loop {
            let event = tokio::select! {
                started = &mut call, if turn.is_none() => {
                    let id = started?["turn_id"].clone();
                    if let Some(ended) = early.iter().find(|event| event["turn_id"] == id) {
                        return turn_result(ended);
                    }
                    turn = Some(id);
                    continue;
                }
                event = events.next(self) => event?,
            };
            shown.progress(&event);
            match event["type"].as_str() {
                Some("agent_message_chunk") => {
                    let _ = write!(stdout, "{}", event["text"].as_str().unwrap_or(""));
                    let _ = stdout.flush();
                }
                Some("tool_call") => {
                    println!("\n[tool: {}]", event["update"]["title"].as_str().unwrap_or("tool"))
                }
                Some("permission_request") => println!(
                    "\n[permission requested ({}): answer with task.session.permission.respond]",
                    event["request_id"]
                ),
                Some("turn_ended") if turn.as_ref() == Some(&event["turn_id"]) => {
                    return turn_result(&event);
                }
                Some("turn_ended") if turn.is_none() => early.push(event),
                _ => {}
            }
        }
    }
}

/// Prints how a turn ended; a turn that did not complete is exit code 1.
fn turn_result(event: &Value) -> Result<(), Failure> {
    let state = event["state"].as_str().unwrap_or("");
    match event["stop_reason"].as_str() {
        Some(reason) => println!("\n[turn {state}: {reason}]"),
        None => println!("\n[turn {state}: {}]", event["error"].as_str().unwrap_or("")),
    }
    if state == "completed" {
        Ok(())
    } else {
        Err(Failure { code: 1, line: "error: the turn failed".into() })
    }
}

/// Shows, on stderr, what a session does while the user waits: the steps of bringing its
/// agent up (with the time since the command started), notices and a resume's outcome.
/// Nothing with `--quiet`.
struct Shown {
    quiet: bool,
    started: std::time::Instant,
}

impl Shown {
    fn new(quiet: bool) -> Shown {
        Shown { quiet, started: std::time::Instant::now() }
    }

    fn progress(&self, event: &Value) {
        if self.quiet {
            return;
        }
        let elapsed = self.started.elapsed().as_secs_f64();
        let line = match event["type"].as_str() {
            Some("progress") => {
                let step = match event["step"].as_str() {
                    Some("launching") => "launching the agent",
                    Some("initializing") => "the agent is starting (initialize)",
                    Some("authenticating") => "authenticating",
                    Some("restoring") => "restoring the agent's session",
                    Some("opening") => "opening an agent session",
                    _ => "working",
                };
                match event["detail"].as_str() {
                    Some(detail) => format!("{step}: {detail}"),
                    None => step.to_owned(),
                }
            }
            Some("notice") => format!("notice: {}", event["message"].as_str().unwrap_or("")),
            Some("resume_outcome") => {
                format!("resumed: {}", event["outcome"].as_str().unwrap_or(""))
            }
            _ => return,
        };
        eprintln!("[{elapsed:5.1}s] {line}");
    }
}

/// A session's events from a cursor, resubscribing after the last one seen when the
/// client library drops the subscription or a notification (it does when the reader falls
/// behind). Session event seqs have no gaps, so a gap means a dropped notification.
struct Feed {
    session: String,
    cursor: u64,
    subscription: jsonrpsee::core::client::Subscription<Value>,
}

impl Feed {
    /// From the session's newest event on: what happens after now.
    async fn open_at_end(client: &Client, session: &str) -> Result<Feed, Failure> {
        let status = client.call(method::SESSION_STATUS, json!({"session_id": session})).await?;
        Feed::open(client, session, status["last_event_seq"].as_u64().unwrap_or(0)).await
    }

    async fn open(client: &Client, session: &str, after: u64) -> Result<Feed, Failure> {
        let subscription = client.subscribe(session, after).await?;
        Ok(Feed { session: session.to_owned(), cursor: after, subscription })
    }

    async fn next(&mut self, client: &Client) -> Result<Value, Failure> {
        loop {
            match self.subscription.next().await {
                Some(Ok(event)) => {
                    let seq = event["seq"].as_u64().unwrap_or(0);
                    if seq <= self.cursor {
                        continue;
                    }
                    if seq > self.cursor + 1 {
                        self.subscription = client.subscribe(&self.session, self.cursor).await?;
                        continue;
                    }
                    self.cursor = seq;
                    return Ok(event);
                }
                Some(Err(err)) => {
                    return Err(Failure {
                        code: 1,
                        line: format!("error: malformed event: {err}"),
                    });
                }
                None if client.client.is_connected() => {
                    self.subscription = client.subscribe(&self.session, self.cursor).await?;
                }
                None => {
                    return Err(Failure {
                        code: 3,
                        line: format!(
                            "server not running at {} (the connection closed)",
                            client.url
                        ),
                    });
                }
            }
        }
    }
}
