//! `mock-agent`: a real ACP agent that we control, for tests and for the demo.
//!
//! It speaks ACP v1 over stdio through [`protocol::Peer`], persists its sessions under
//! `--state-dir` (so a new process can `session/load` them and replays their history), and
//! is scripted two ways:
//! - **flags** set capabilities and faults for the whole process (see [`USAGE`]);
//! - **commands in the prompt text** shape one turn (see [`script::Command`]).
//!
//! Every reply says how many earlier messages of the session the agent remembers
//! (`remembered N earlier messages`), which is how resume tests tell a restored
//! conversation from a fresh one.

pub mod script;
mod sessions;
pub mod settings;
pub mod store;

use std::collections::HashMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protocol::acp::{self, method, schema};
use protocol::{Inbound, Peer, PeerConfig, Request, RpcError};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use self::script::{Command, Script};
use self::store::{Role, Store, StoredMessage, StoredSession};

/// The command-line help.
pub const USAGE: &str = "\
usage: mock-agent [options]

A scriptable ACP agent on stdio, for tests and demos.

options:
  --state-dir DIR       persist sessions in DIR (session/load and --resume need it)
  --no-load-session     do not advertise or serve session/load
  --resume-capability   advertise and serve session/resume
  --auth-required       refuse sessions with -32000 until `authenticate`
  --forget-last-turn    restore a session without its last turn (an agent killed
                        before it kept it, as an older claude adapter was)
  --forget-last-answer  restore a session without its last answer (as qwen-code,
                        which writes it after the turn's end)
  --terminal-login      with --auth-required: offer only a login at a terminal
                        (an ACP `terminal` auth method, as copilot and kimi do)
  --resume ID           start with session ID restored; the first session/new continues it
  --reject-load         answer session/load and session/resume with -32002
  --fail-load           answer session/load and session/resume with -32000 (as gemini does)
  --cancel-as-end-turn  answer a cancelled prompt with stopReason end_turn (as opencode does)
  --hang-on METHOD      never answer METHOD (e.g. initialize)
  --crash-on METHOD     exit when METHOD arrives, after a line on stderr
  --exit-code N         the exit code for --crash-on (default 3)
  --garbage-at-start    print a non-JSON line and an invalid UTF-8 line before anything else
  --stderr-at-start N   print N numbered lines on stderr at start (an agent's debug output
                        as it starts, as claude-agent-acp's at every resume)
  --ignore-eof          keep running after stdin closes (stop it with a signal)
  --ignore-sigterm      ignore SIGTERM (stop it with SIGKILL)
  --name NAME           the agentInfo name (default mock-agent)
  --late-replay         replay a loaded session after answering session/load (gemini)
  --replay-with-next    hold that replay until the next request, and send it first
  --replay-on-resume    replay the conversation on session/resume too, as one agent
                        message holding all of it (fast-agent)
  --require-env N=V     exit with code 1 and nothing on stderr unless N is set to V
                        (as claude-agent-acp does run as root without IS_SANDBOX=1)
  --fail-while PATH     exit with --exit-code at start, after a line on stderr, while PATH
                        exists (a launch failure that a later attempt outlives)
  --ballast-mb N        hold N MB resident for the process's life (an agent's size)
  --turn-log PATH       append a JSON line {session, prompt} for each prompt it
                        starts to answer (tests count turns from the agent's side), and
                        {session, steer} for each steer it takes
  --fork                advertise and serve `session/fork` (needs --state-dir)
  --steering            advertise and serve `_session/steering` (a message into the
                        running turn: it ends a /sleep early and is named in the reply)

prompt commands (one per line; other lines are the message):
  /stream N  /tool  /permission  /permission-always-first  /permission-only (the tool
  announced only in the question)  /read PATH  /write PATH TEXT
  /peek PATH  /connect HOST:PORT  /fetch URL  /sh COMMAND  /sleep MS
  /crash [CODE]  /close-stdout  /edit PATH TEXT  /patch PATH TEXT  /blob N KB  /garbage  /stderr TEXT  /recall  /spawn  /escape  /rounds R
  /usage USED SIZE [COST]  /tokens IN OUT [CACHED]  /say TEXT (the reply is exactly TEXT; a backslash-n in it is a newline)
  /think TEXT  /plan A; B; C  /diff PATH OLD => NEW  /exec COMMAND (a failing command's output)
";

/// Process-wide settings, from the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Where sessions are persisted.
    pub state_dir: Option<PathBuf>,
    /// Advertise and serve `session/load`.
    pub load_session: bool,
    /// Advertise and serve `session/resume`.
    pub resume_capability: bool,
    /// Require `authenticate` before sessions.
    pub auth_required: bool,
    /// Offer only a `terminal` login method (with `auth_required`).
    pub terminal_login: bool,
    /// Restore sessions without their last this many messages (2: the last turn).
    pub forget_last_messages: usize,
    /// A session to continue on the first `session/new`.
    pub resume: Option<String>,
    /// Answer `session/load` and `session/resume` with `-32002`.
    pub reject_load: bool,
    /// Answer `session/load` and `session/resume` with a generic `-32000`.
    pub fail_load: bool,
    /// Answer a cancelled prompt with `end_turn` instead of `cancelled`.
    pub cancel_as_end_turn: bool,
    /// A method never answered.
    pub hang_on: Option<String>,
    /// A method that makes the process exit.
    pub crash_on: Option<String>,
    /// The exit code for `crash_on`.
    pub exit_code: i32,
    /// Print garbage before the first message.
    pub garbage_at_start: bool,
    /// Lines printed on stderr at start (`--stderr-at-start`).
    pub stderr_at_start: u32,
    /// Keep running after stdin EOF.
    pub ignore_eof: bool,
    /// Ignore SIGTERM.
    pub ignore_sigterm: bool,
    /// The advertised agent name.
    pub name: String,
    /// Internal: run as the idle child spawned by `/spawn`.
    pub idle: bool,
    /// `(name, value)`: exit silently with code 1 unless the variable is set to the value.
    pub require_env: Option<(String, String)>,
    /// `--fail-while`: the file whose existence makes the start fail.
    pub fail_while: Option<PathBuf>,
    /// `--turn-log`: a file that gets one JSON line per prompt this agent starts to answer
    /// (`{"session", "prompt"}`), so tests count turns from the agent's side.
    pub turn_log: Option<PathBuf>,
    /// Replay a loaded session after the `session/load` answer, not before it.
    pub late_replay: bool,
    /// Later still: hold the replay until the next request arrives, then send it first
    /// (the worst case of gemini-cli under load: the replay trails the next prompt).
    pub replay_with_next: bool,
    /// Answer `session/resume` after replaying the whole conversation as one agent message
    /// (as fast-agent does).
    pub replay_on_resume: bool,
    /// Megabytes held resident for the process's life (`--ballast-mb`: an agent's size).
    pub ballast_mb: usize,
    /// Advertise and serve `_session/steering` (`--steering`).
    pub steering: bool,
    /// Advertise and serve `session/fork` (`--fork`).
    pub fork: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            state_dir: None,
            load_session: true,
            resume_capability: false,
            auth_required: false,
            terminal_login: false,
            forget_last_messages: 0,
            resume: None,
            reject_load: false,
            fail_load: false,
            cancel_as_end_turn: false,
            hang_on: None,
            crash_on: None,
            exit_code: 3,
            garbage_at_start: false,
            stderr_at_start: 0,
            ignore_eof: false,
            ignore_sigterm: false,
            name: "mock-agent".into(),
            idle: false,
            require_env: None,
            fail_while: None,
            turn_log: None,
            late_replay: false,
            replay_with_next: false,
            replay_on_resume: false,
            ballast_mb: 0,
            steering: false,
            fork: false,
        }
    }
}

/// What the command line asked for.
#[derive(Debug, PartialEq, Eq)]
pub enum Invocation {
    /// Run the agent.
    Run(Box<Config>),
    /// Print [`USAGE`] and exit successfully.
    Help,
}

/// Parses the arguments (without the program name). The error is a one-line reason.
pub fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Invocation, String> {
    let mut config = Config::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "-h" | "--help" => return Ok(Invocation::Help),
            "--state-dir" => config.state_dir = Some(value("--state-dir")?.into()),
            "--no-load-session" => config.load_session = false,
            "--resume-capability" => config.resume_capability = true,
            "--auth-required" => config.auth_required = true,
            "--terminal-login" => config.terminal_login = true,
            "--forget-last-turn" => config.forget_last_messages = 2,
            "--forget-last-answer" => config.forget_last_messages = 1,
            "--resume" => {
                let id = value("--resume")?;
                if !store::is_safe_id(&id) {
                    return Err(format!("--resume: {id:?} is not a session id"));
                }
                config.resume = Some(id);
            }
            "--reject-load" => config.reject_load = true,
            "--fail-load" => config.fail_load = true,
            "--replay-on-resume" => config.replay_on_resume = true,
            "--cancel-as-end-turn" => config.cancel_as_end_turn = true,
            "--hang-on" => config.hang_on = Some(value("--hang-on")?),
            "--crash-on" => config.crash_on = Some(value("--crash-on")?),
            "--exit-code" => {
                let code = value("--exit-code")?;
                config.exit_code =
                    code.parse().map_err(|_| format!("--exit-code: {code:?} is not a number"))?;
            }
            "--garbage-at-start" => config.garbage_at_start = true,
            "--stderr-at-start" => {
                let lines = value("--stderr-at-start")?;
                config.stderr_at_start =
                    lines.parse().map_err(|_| format!("--stderr-at-start: {lines:?}"))?;
            }
            "--ignore-eof" => config.ignore_eof = true,
            "--ignore-sigterm" => config.ignore_sigterm = true,
            "--name" => config.name = value("--name")?,
            "--idle" => config.idle = true,
            "--late-replay" => config.late_replay = true,
            "--replay-with-next" => config.replay_with_next = true,
            "--fail-while" => config.fail_while = Some(value("--fail-while")?.into()),
            "--turn-log" => config.turn_log = Some(value("--turn-log")?.into()),
            "--steering" => config.steering = true,
            "--fork" => config.fork = true,
            "--ballast-mb" => {
                let mb = value("--ballast-mb")?;
                config.ballast_mb = mb.parse().map_err(|_| format!("--ballast-mb: {mb:?}"))?;
            }
            "--require-env" => {
                let pair = value("--require-env")?;
                let (name, wanted) = pair
                    .split_once('=')
                    .ok_or_else(|| format!("--require-env: {pair:?} is not NAME=VALUE"))?;
                config.require_env = Some((name.to_owned(), wanted.to_owned()));
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if config.resume.is_some() && config.state_dir.is_none() {
        return Err("--resume needs --state-dir".into());
    }
    Ok(Invocation::Run(Box::new(config)))
}

/// The whole program: parses `args` (without the program name), runs the agent on its own
/// current-thread runtime, and returns the exit code. Binaries (and applets) call this.
pub fn main(args: impl IntoIterator<Item = String>, self_command: Vec<std::ffi::OsString>) -> i32 {
    let _ = SELF_COMMAND.set(self_command);
    let config = match parse_args(args) {
        Ok(Invocation::Run(config)) => *config,
        Ok(Invocation::Help) => {
            print!("{USAGE}");
            return 0;
        }
        Err(reason) => {
            eprintln!("mock-agent: {reason}\n\n{USAGE}");
            return 2;
        }
    };
    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime.block_on(run(config)),
        Err(err) => {
            eprintln!("mock-agent: cannot start a runtime: {err}");
            1
        }
    }
}

/// Runs the agent on stdin/stdout until stdin closes (or forever with `--ignore-eof`).
/// Returns the process exit code.
pub async fn run(config: Config) -> i32 {
    if config.idle {
        // The child of `/spawn`: do nothing until killed.
        std::future::pending::<()>().await;
    }
    if let Some((name, wanted)) = &config.require_env
        && std::env::var(name).ok().as_ref() != Some(wanted)
    {
        return 1;
    }
    if let Some(path) = config.fail_while.as_ref().filter(|path| path.exists()) {
        eprintln!("mock-agent: failing at start while {} exists (--fail-while)", path.display());
        return config.exit_code;
    }
    if config.ignore_sigterm {
        ignore_sigterm();
    }
    // Written, so resident (as a real agent's heap is), and kept until the process ends.
    std::hint::black_box(&*vec![1u8; config.ballast_mb << 20].leak());
    for line in 1..=config.stderr_at_start {
        eprintln!("mock-agent: starting, debug line {line} of {}", config.stderr_at_start);
    }
    if config.garbage_at_start {
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(b"mock-agent starting up (not JSON)\n\xff\xfe\xfd not UTF-8\n");
        let _ = stdout.flush();
    }
    let store = Store::new(config.state_dir.clone());
    let restored = match &config.resume {
        Some(id) => match store.load(id) {
            Ok(Some(session)) => Some(session),
            Ok(None) => {
                eprintln!("mock-agent: --resume {id}: no such session");
                return 1;
            }
            Err(err) => {
                eprintln!("mock-agent: --resume {id}: {err}");
                return 1;
            }
        },
        None => None,
    };
    let (peer, mut inbound, io) =
        protocol::connect(tokio::io::stdin(), tokio::io::stdout(), PeerConfig::default());
    let io = tokio::spawn(io);
    let agent = Agent {
        config: Arc::new(config),
        store,
        peer: peer.clone(),
        state: Arc::new(Mutex::new(State {
            authenticated: false,
            restored,
            sessions: HashMap::new(),
            late_replay: None,
            held_replay: None,
        })),
    };
    while let Some(item) = inbound.recv().await {
        match item {
            Inbound::Request(request) => agent.handle_request(request),
            Inbound::Notification(notification) => {
                if notification.method == method::SESSION_CANCEL {
                    agent.cancel(notification.params.as_ref());
                }
                // Other notifications (including `_`-prefixed extensions) are ignored.
            }
            Inbound::Invalid(invalid) => {
                eprintln!("mock-agent: ignoring bad input: {}", invalid.reason)
            }
        }
    }
    if agent.config.ignore_eof {
        eprintln!("mock-agent: stdin closed; staying up as configured (--ignore-eof)");
        std::future::pending::<()>().await;
    }
    let _ = peer.flush().await;
    drop(agent);
    drop(peer);
    io.abort();
    0
}

fn ignore_sigterm() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut terms) => {
            tokio::spawn(async move {
                while terms.recv().await.is_some() {
                    eprintln!("mock-agent: ignoring SIGTERM as configured (--ignore-sigterm)");
                }
            });
        }
        Err(err) => eprintln!("mock-agent: cannot install a SIGTERM handler: {err}"),
    }
}

/// Shared by the request loop and the turn tasks.
#[derive(Clone)]
struct Agent {
    config: Arc<Config>,
    store: Store,
    peer: Peer,
    /// A std mutex: held for map lookups and small edits only, never across an await.
    state: Arc<Mutex<State>>,
}

struct State {
    authenticated: bool,
    /// The `--resume` session, handed out by the first `session/new`.
    restored: Option<StoredSession>,
    sessions: HashMap<String, LiveSession>,
    /// A loaded session to replay once the load is answered (`--late-replay`).
    late_replay: Option<StoredSession>,
    /// `--replay-with-next`: the replay waiting for the next request.
    held_replay: Option<StoredSession>,
}

struct LiveSession {
    stored: StoredSession,
    /// The running turn's cancel switch; `None` between turns.
    turn: Option<CancellationToken>,
    /// Where steers of the running turn go (`--steering`); `None` between turns.
    steer: Option<tokio::sync::mpsc::UnboundedSender<String>>,
    /// Its model and mode (not persisted).
    settings: settings::Settings,
    /// What the next prompt is answered as (`/then`; not persisted).
    then: Option<String>,
}

impl Agent {
    fn handle_request(&self, request: Request) {
        let method = request.method.as_str();
        let held = self.lock().held_replay.take();
        if let Some(stored) = held {
            let _ = self.replay(&stored);
        }
        if self.config.crash_on.as_deref() == Some(method) {
            eprintln!("mock-agent: crashing on {method} as configured (--crash-on)");
            std::process::exit(self.config.exit_code);
        }
        if self.config.hang_on.as_deref() == Some(method) {
            eprintln!("mock-agent: not answering {method} as configured (--hang-on)");
            return;
        }
        if method == method::SESSION_PROMPT {
            // The turn is registered here, before the next input line is read, so a
            // `session/cancel` that follows the prompt always finds it. It then runs on its
            // own task so that cancel and other requests are handled while it streams.
            match self.begin_turn(request.params.as_ref()) {
                Ok(turn) => {
                    let agent = self.clone();
                    tokio::spawn(async move {
                        let result = agent.run_turn(turn).await;
                        let _ = agent.peer.respond(request.id, result);
                    });
                }
                Err(error) => {
                    let _ = self.peer.respond(request.id, Err(error));
                }
            }
            return;
        }
        let result = match method {
            method::INITIALIZE => self.initialize(request.params.as_ref()),
            method::AUTHENTICATE => self.authenticate(request.params.as_ref()),
            method::SESSION_NEW => self.new_session(request.params.as_ref()),
            method::SESSION_LOAD if self.config.load_session => {
                self.load_session(request.params.as_ref())
            }
            method::SESSION_RESUME if self.config.resume_capability => {
                self.resume_session(request.params.as_ref())
            }
            method::SESSION_SET_CONFIG_OPTION => self.set_config_option(request.params.as_ref()),
            method::SESSION_SET_MODE => self.set_mode(request.params.as_ref()),
            method::SESSION_CLOSE => self.close_session(request.params.as_ref()),
            method::SESSION_STEERING if self.config.steering => self.steer(request.params.as_ref()),
            method::SESSION_FORK if self.config.fork => self.fork_session(request.params.as_ref()),
            other => Err(RpcError::method_not_found(other)),
        };
        let _ = self.peer.respond(request.id, result);
        let late = self.lock().late_replay.take();
        if let Some(stored) = late {
            let _ = self.replay(&stored);
        }
    }

    fn initialize(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let _request: schema::InitializeRequest = acp::params(params)?;
        let mut session_capabilities = json!({"close": {}, "additionalDirectories": {}});
        if self.config.resume_capability {
            session_capabilities["resume"] = json!({});
        }
        if self.config.fork {
            session_capabilities["fork"] = json!({});
        }
        let auth_methods = if self.config.terminal_login {
            json!([{"id": "mock-terminal", "name": "Mock terminal login", "type": "terminal", "args": ["--login"]}])
        } else if self.config.auth_required {
            json!([{"id": "mock-login", "name": "Mock login", "description": "Any call to authenticate succeeds."}])
        } else {
            json!([])
        };
        let meta =
            if self.config.steering { json!({"steering": {"supported": true}}) } else { json!({}) };
        Ok(json!({
            "_meta": meta,
            "protocolVersion": acp::PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": self.config.load_session,
                "promptCapabilities": {"image": false, "audio": false, "embeddedContext": false},
                "sessionCapabilities": session_capabilities,
            },
            "authMethods": auth_methods,
            "agentInfo": {"name": self.config.name, "title": "Tether mock agent", "version": env!("CARGO_PKG_VERSION")},
        }))
    }

    fn authenticate(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let request: schema::AuthenticateRequest = acp::params(params)?;
        if request.method_id.0.as_ref() != "mock-login" {
            return Err(RpcError::invalid_params(format!(
                "unknown auth method {}",
                request.method_id.0
            )));
        }
        self.lock().authenticated = true;
        Ok(json!({}))
    }

    fn check_auth(&self) -> Result<(), RpcError> {
        if self.config.auth_required && !self.lock().authenticated {
            return Err(RpcError::new(
                protocol::ErrorCode::AuthRequired,
                "authentication required",
            ));
        }
        Ok(())
    }

    fn cancel(&self, params: Option<&Value>) {
        let Ok(notification) = acp::params::<schema::CancelNotification>(params) else {
            eprintln!("mock-agent: ignoring a malformed session/cancel");
            return;
        };
        if let Some(turn) = self
            .lock()
            .sessions
            .get(notification.session_id.0.as_ref())
            .and_then(|live| live.turn.as_ref())
        {
            turn.cancel();
        }
    }

    /// `_session/steering`: the text goes into the running turn (`injected`); with none
    /// running it is refused as the client asked (`promptRequired`) or as failed.
    fn steer(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let params = params.ok_or_else(|| RpcError::invalid_params("steer needs params"))?;
        let session_id = params["sessionId"]
            .as_str()
            .ok_or_else(|| RpcError::invalid_params("steer params need a sessionId"))?;
        let blocks: Vec<schema::ContentBlock> =
            serde_json::from_value(params["prompt"].clone()).map_err(RpcError::invalid_params)?;
        let text = acp::prompt_text(&blocks);
        let mut state = self.lock();
        let live = state.sessions.get_mut(session_id).ok_or_else(|| {
            RpcError::new(
                protocol::ErrorCode::ResourceNotFound,
                format!("unknown session {session_id}"),
            )
        })?;
        let Some(steer) = live.steer.as_ref().filter(|_| live.turn.is_some()) else {
            let idle = params.pointer("/_meta/steering/idleBehavior").and_then(Value::as_str);
            let outcome = if idle == Some("promptRequired") { "promptRequired" } else { "failed" };
            return Ok(json!({"outcome": outcome}));
        };
        if steer.send(text.clone()).is_err() {
            return Ok(json!({"outcome": "failed"}));
        }
        live.stored.messages.push(StoredMessage { role: Role::User, text: text.clone() });
        drop(state);
        self.log_turn(&json!({"session": session_id, "steer": text}))?;
        Ok(json!({"outcome": "injected"}))
    }

    /// Appends a line to `--turn-log`, if set: one write of the whole line (agents of
    /// parallel steps append to one file, and an append of one write is never interleaved
    /// with another's).
    fn log_turn(&self, line: &Value) -> Result<(), RpcError> {
        let Some(log) = &self.config.turn_log else { return Ok(()) };
        let mut line = line.to_string();
        line.push('\n');
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .and_then(|mut file| file.write_all(line.as_bytes()))
            .map_err(RpcError::internal)
    }

    fn begin_turn(&self, params: Option<&Value>) -> Result<PendingTurn, RpcError> {
        let request: schema::PromptRequest = acp::params(params)?;
        self.check_auth()?;
        let session_id = request.session_id.0.to_string();
        let text = acp::prompt_text(&request.prompt);
        let mut script = script::parse(&text).map_err(RpcError::invalid_params)?;
        let cancel = CancellationToken::new();
        let mut state = self.lock();
        let Some(live) = state.sessions.get_mut(&session_id) else {
            return Err(RpcError::new(
                protocol::ErrorCode::ResourceNotFound,
                format!("unknown session {session_id}"),
            ));
        };
        if live.turn.is_some() {
            return Err(RpcError::internal("a turn is already running in this session"));
        }
        if let Some(then) = live.then.take() {
            script = script::parse(&then).map_err(RpcError::invalid_params)?;
        }
        for command in &script.commands {
            if let Command::Then(next) = command {
                live.then = Some(next.clone());
            }
        }
        live.turn = Some(cancel.clone());
        let (steer, steers) = tokio::sync::mpsc::unbounded_channel();
        live.steer = Some(steer);
        let earlier = live.stored.messages.clone();
        live.stored.messages.push(StoredMessage { role: Role::User, text });
        Ok(PendingTurn { session_id, script, cancel, earlier, steers })
    }

    async fn run_turn(&self, pending: PendingTurn) -> Result<Value, RpcError> {
        let mut turn = Turn {
            agent: self,
            session_id: &pending.session_id,
            cancel: &pending.cancel,
            steers: pending.steers,
            steered: Vec::new(),
            said: String::new(),
            // Its message's place in the stored conversation, after the prompt's.
            message_id: format!("m{}", pending.earlier.len() + 1),
        };
        let stop_reason = turn.run(&pending.script, &pending.earlier).await;
        let said = turn.said;
        let mut state = self.lock();
        let live = state
            .sessions
            .get_mut(&pending.session_id)
            .expect("UNWRAP: sessions are never removed");
        live.turn = None;
        live.steer = None;
        if !said.is_empty() {
            live.stored.messages.push(StoredMessage { role: Role::Agent, text: said });
        }
        self.store.save(&live.stored).map_err(RpcError::internal)?;
        let mut answer = json!({"stopReason": stop_reason?});
        for command in &pending.script.commands {
            if let Command::Tokens { input, output, cached } = command {
                answer["usage"] = json!({"inputTokens": input, "outputTokens": output,
                    "cachedReadTokens": cached, "totalTokens": input + output + cached});
            }
        }
        Ok(answer)
    }

    fn update(&self, session_id: &str, update: Value) -> Result<(), RpcError> {
        self.peer
            .notify(
                method::SESSION_UPDATE,
                Some(json!({"sessionId": session_id, "update": update})),
            )
            .map_err(RpcError::internal)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("UNWRAP: never poisoned")
    }
}

/// A prompt accepted and registered, not yet run.
struct PendingTurn {
    session_id: String,
    script: Script,
    cancel: CancellationToken,
    /// The conversation before this prompt.
    earlier: Vec<StoredMessage>,
    /// Steers of this turn (`--steering`).
    steers: tokio::sync::mpsc::UnboundedReceiver<String>,
}

/// One prompt being answered.
struct Turn<'a> {
    agent: &'a Agent,
    session_id: &'a str,
    cancel: &'a CancellationToken,
    /// Steers sent into this turn, and those taken so far (named in the reply).
    steers: tokio::sync::mpsc::UnboundedReceiver<String>,
    steered: Vec<String>,
    /// The agent text sent so far, persisted as the agent's message.
    said: String,
    /// The ACP `messageId` of that message: `m` and its index in the stored conversation
    /// (a load's replay gives each message the same).
    message_id: String,
}

/// Whether a tool call asks permission first, and in which order it offers the options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    /// It runs without asking.
    No,
    /// Allow once, always allow, reject, always reject.
    OnceFirst,
    /// Always allow, allow once, always reject, reject.
    AlwaysFirst,
    /// As [`Ask::OnceFirst`], the tool announced only inside the permission request (no
    /// `tool_call` update before it).
    Only,
}

/// How a step of a turn ended early.
enum Stop {
    Cancelled,
    Failed(RpcError),
}

/// The reply a turn builds as its commands run, and how it is streamed at the end.
struct Reply {
    /// The text so far.
    text: String,
    /// How many chunks it is sent in (`/stream`).
    chunks: u32,
    /// R of `/rounds R`: R−1 rounds of chunks, each closed by a tool call, come before it.
    rounds: u32,
    /// Whether the turn's one tool call (`/tool` or a `/permission` command) has run.
    tool_run: bool,
}

impl Turn<'_> {
    async fn run(
        &mut self,
        script: &Script,
        earlier: &[StoredMessage],
    ) -> Result<&'static str, RpcError> {
        self.agent.log_turn(&json!({"session": self.session_id, "prompt": script.message}))?;
        match self.steps(script, earlier).await {
            Ok(()) => Ok("end_turn"),
            Err(Stop::Cancelled) if self.agent.config.cancel_as_end_turn => Ok("end_turn"),
            Err(Stop::Cancelled) => Ok("cancelled"),
            Err(Stop::Failed(error)) => Err(error),
        }
    }

    async fn steps(&mut self, script: &Script, earlier: &[StoredMessage]) -> Result<(), Stop> {
        let mut reply = Reply {
            text: format!(
                "mock-agent: remembered {} earlier messages; you said: {}",
                earlier.len(),
                script.message
            ),
            chunks: 1,
            rounds: 1,
            tool_run: false,
        };
        for command in &script.commands {
            if self.cancel.is_cancelled() {
                return Err(Stop::Cancelled);
            }
            self.step(command, &mut reply, earlier).await?;
        }
        self.rounds(reply.rounds, reply.chunks).await?;
        while let Ok(text) = self.steers.try_recv() {
            self.steered.push(text);
        }
        for text in &self.steered {
            reply.text.push_str(&format!("; steered: {text}"));
        }
        self.stream_reply(&reply.text, reply.chunks)
    }

    /// Runs one command of the script: adds to the reply, changes how it is sent, or acts.
    async fn step(
        &mut self,
        command: &Command,
        reply: &mut Reply,
        earlier: &[StoredMessage],
    ) -> Result<(), Stop> {
        match command {
            Command::Stream(n) => reply.chunks = *n,
            Command::Tool => self.first_tool(reply, Ask::No).await?,
            Command::Permission => self.first_tool(reply, Ask::OnceFirst).await?,
            Command::PermissionAlwaysFirst => self.first_tool(reply, Ask::AlwaysFirst).await?,
            Command::PermissionOnly => self.first_tool(reply, Ask::Only).await?,
            Command::Read(path) => reply.text.push_str(&self.read_file(path).await?),
            Command::Write(path, text) => reply.text.push_str(&self.write_file(path, text).await?),
            Command::Sleep(ms) => self.sleep(*ms).await?,
            Command::Crash(code) => self.crash(*code).await?,
            Command::Say(text) => reply.text = text.clone(),
            Command::Settings => reply.text = self.settings(),
            Command::Elicit(message) => reply.text.push_str(&self.elicit(message).await?),
            Command::Withdraw => reply.text.push_str(&self.withdraw()?),
            Command::Peek(path) => reply.text.push_str(&Self::peek(path)),
            Command::Connect(addr) => reply.text.push_str(&Self::connect(addr)),
            Command::Sh(command) => reply.text.push_str(&Self::sh(command)),
            Command::Fetch(url) => reply.text.push_str(&Self::fetch(url)),
            Command::Edit(path, text) => reply.text.push_str(&self.edit(path, text)?),
            Command::Patch(path, text) => reply.text.push_str(&self.patch(path, text)?),
            Command::Blob(n, kb) => self.blob(*n, *kb)?,
            Command::CloseStdout => self.close_stdout().await?,
            Command::Garbage => self.garbage()?,
            Command::Stderr(text) => eprintln!("{text}"),
            Command::Recall => reply.text.push_str(&Self::recall(earlier)),
            Command::Spawn => reply.text.push_str(&spawn_idle_child(false).map_err(Stop::Failed)?),
            Command::Escape => reply.text.push_str(&spawn_idle_child(true).map_err(Stop::Failed)?),
            Command::Rounds(n) => reply.rounds = *n,
            Command::Tokens { .. } => {}
            Command::Usage { used, size, cost } => self.usage(*used, *size, cost.as_deref())?,
            Command::Think(text) => self.think(text)?,
            Command::Plan(entries) => self.plan(entries)?,
            Command::Diff { path, old, new } => reply.text.push_str(&self.diff(path, old, new)?),
            Command::Exec(command) => reply.text.push_str(&self.exec(command)?),
            // Taken when the turn began.
            Command::Then(_) => {}
        }
        Ok(())
    }

    /// Runs the turn's first tool call (later ones are ignored) and adds its outcome to the
    /// reply.
    async fn first_tool(&mut self, reply: &mut Reply, ask: Ask) -> Result<(), Stop> {
        if !reply.tool_run {
            reply.tool_run = true;
            reply.text.push_str(&self.tool(ask).await?);
        }
        Ok(())
    }

    /// Asks the client for a file (`/read`). Returns text for the reply.
    async fn read_file(&self, path: &str) -> Result<String, Stop> {
        let params = json!({"sessionId": self.session_id, "path": path});
        Ok(match self.ask(method::FS_READ_TEXT_FILE, params).await? {
            Ok(result) => {
                let content = result.get("content").and_then(Value::as_str).unwrap_or_default();
                format!("; read {path}: {content}")
            }
            Err(error) => format!("; read {path} failed: {}", error.message),
        })
    }

    /// Asks the client to write a file (`/write`). Returns text for the reply.
    async fn write_file(&self, path: &str, text: &str) -> Result<String, Stop> {
        let params = json!({"sessionId": self.session_id, "path": path, "content": text});
        Ok(match self.ask(method::FS_WRITE_TEXT_FILE, params).await? {
            Ok(_) => format!("; wrote {} bytes to {path}", text.len()),
            Err(error) => format!("; write {path} failed: {}", error.message),
        })
    }

    /// Waits `ms` milliseconds (`/sleep`); a cancel of the turn ends the wait, and so does
    /// a steer (the agent turns to it).
    async fn sleep(&mut self, ms: u64) -> Result<(), Stop> {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(ms)) => Ok(()),
            _ = self.cancel.cancelled() => Err(Stop::Cancelled),
            Some(text) = self.steers.recv() => {
                self.steered.push(text);
                Ok(())
            }
        }
    }

    /// Sends one chunk, then exits the process mid-turn with `code` (`/crash`).
    async fn crash(&mut self, code: i32) -> Result<(), Stop> {
        self.chunk("mock-agent: about to crash")?;
        let _ = self.agent.peer.flush().await;
        eprintln!("mock-agent: crashing mid-turn as asked (/crash {code})");
        std::process::exit(code);
    }

    /// Reads a file directly, as the agent's user (`/peek`). Returns text for the reply.
    /// A direct TCP connection to `addr` (at most 2 s), and what came of it. Returns text
    /// for the reply.
    fn connect(addr: &str) -> String {
        use std::net::ToSocketAddrs;
        let target = match addr.to_socket_addrs().map(|mut addrs| addrs.next()) {
            Ok(Some(target)) => target,
            Ok(None) => return format!("; connect {addr} failed: no address"),
            Err(err) => return format!("; connect {addr} failed: {err}"),
        };
        match std::net::TcpStream::connect_timeout(&target, std::time::Duration::from_secs(2)) {
            Ok(_) => format!("; connect {addr}: connected"),
            Err(err) => format!("; connect {addr} failed: {err}"),
        }
    }

    fn fetch(url: &str) -> String {
        use std::io::{Read, Write};
        let proxy = std::env::var("http_proxy").or_else(|_| std::env::var("HTTP_PROXY")).ok();
        let rest = url.trim_start_matches("http://");
        let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
        let (target, request) = match proxy.as_deref().map(|p| p.trim_start_matches("http://")) {
            Some(proxy) => (proxy.trim_end_matches('/').to_owned(), url.to_owned()),
            None => (authority.to_owned(), format!("/{path}")),
        };
        let attempt = || -> std::io::Result<String> {
            let mut stream = std::net::TcpStream::connect(&target)?;
            stream.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
            let head =
                format!("GET {request} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
            stream.write_all(head.as_bytes())?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer)?;
            let status = answer.lines().next().unwrap_or_default().to_owned();
            let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body).trim();
            Ok(format!("{status} {body}"))
        };
        match attempt() {
            Ok(said) => format!("; fetch {url}: {said}"),
            Err(err) => format!("; fetch {url} failed: {err}"),
        }
    }

    fn sh(command: &str) -> String {
        let output = std::process::Command::new("sh")
            .args(["-c", command])
            .stdin(std::process::Stdio::null())
            .output();
        match output {
            Ok(output) => {
                let mut said = String::from_utf8_lossy(&output.stdout).into_owned();
                said.push_str(&String::from_utf8_lossy(&output.stderr));
                let said: String = said.trim().chars().take(2000).collect();
                let code = output.status.code().map_or("a signal".into(), |c| c.to_string());
                format!("; sh exit {code}: {said}")
            }
            Err(err) => format!("; sh failed: {err}"),
        }
    }

    fn peek(path: &str) -> String {
        match std::fs::read(path) {
            Ok(bytes) => format!("; peek {path}: {} bytes", bytes.len()),
            Err(err) => format!("; peek {path} failed: {err}"),
        }
    }

    /// Reports an edit as claude-agent-acp does (`/edit`). Returns text for the reply.
    fn edit(&self, path: &str, text: &str) -> Result<String, Stop> {
        let id = format!("call-{}", uuid::Uuid::new_v4());
        self.update(json!({"sessionUpdate": "tool_call", "toolCallId": id,
            "title": "Preparing file…", "kind": "edit", "status": "pending"}))?;
        self.update(json!({"sessionUpdate": "tool_call_update", "toolCallId": id,
            "title": format!("Edit {path}"), "status": "in_progress",
            "rawInput": {"file_path": path, "new_string": text}}))?;
        self.update(json!({"sessionUpdate": "tool_call_update", "toolCallId": id,
            "status": "completed",
            "content": [{"type": "diff", "path": path, "oldText": "", "newText": text}],
            "rawOutput": format!("The file {path} has been updated.")}))?;
        Ok(format!("; edited {path}"))
    }

    /// Reports an edit as opencode does (`/patch`). Returns text for the reply.
    fn patch(&self, path: &str, text: &str) -> Result<String, Stop> {
        let id = format!("call-{}", uuid::Uuid::new_v4());
        self.update(json!({"sessionUpdate": "tool_call", "toolCallId": id,
            "title": "edit", "kind": "edit", "status": "pending",
            "locations": [{"path": path}]}))?;
        self.update(json!({"sessionUpdate": "tool_call_update", "toolCallId": id,
            "title": path, "kind": "edit", "status": "completed",
            "content": [{"type": "diff", "path": path, "oldText": "", "newText": text}],
            "rawInput": {"filePath": path}}))?;
        Ok(format!("; patched {path}"))
    }

    /// Sends `n` message chunks of `kb` kilobytes each (`/blob`).
    fn blob(&mut self, n: u32, kb: u32) -> Result<(), Stop> {
        let filler = "x".repeat(kb as usize * 1024);
        for index in 0..n {
            self.chunk(&format!("<blob {}/{n}>{filler}", index + 1))?;
        }
        Ok(())
    }

    /// Sends one chunk, then closes stdout and stays up for good (`/close-stdout`).
    async fn close_stdout(&mut self) -> Result<(), Stop> {
        self.chunk("mock-agent: closing stdout")?;
        let _ = self.agent.peer.flush().await;
        eprintln!("mock-agent: closing stdout and staying up as asked (/close-stdout)");
        // /dev/null takes stdout's place: the pipe's last writer is gone, so the
        // reader sees EOF, and later writes vanish.
        let null = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .map_err(|err| Stop::Failed(RpcError::internal(err)))?;
        nix::unistd::dup2_stdout(&null).map_err(|err| Stop::Failed(RpcError::internal(err)))?;
        std::future::pending::<()>().await;
        Ok(())
    }

    /// Prints a non-JSON line and an invalid UTF-8 line on stdout (`/garbage`).
    fn garbage(&self) -> Result<(), Stop> {
        let peer = &self.agent.peer;
        let sent = peer
            .send_raw_line(b"mock-agent garbage: this line is not JSON".to_vec())
            .and_then(|()| peer.send_raw_line(b"\xff\xfe mock-agent garbage: not UTF-8".to_vec()));
        sent.map_err(|err| Stop::Failed(RpcError::internal(err)))
    }

    /// The session's earlier user messages (`/recall`), as text for the reply.
    fn recall(earlier: &[StoredMessage]) -> String {
        let users: Vec<&str> = earlier
            .iter()
            .filter(|message| message.role == Role::User)
            .map(|message| message.text.as_str())
            .collect();
        format!("; earlier user messages: [{}]", users.join(" | "))
    }

    /// Reports context use, and a cost in USD when it parses (`/usage`).
    fn usage(&self, used: u64, size: u64, cost: Option<&str>) -> Result<(), Stop> {
        let mut update = json!({"sessionUpdate": "usage_update", "used": used, "size": size});
        if let Some(amount) = cost.and_then(|cost| cost.parse::<f64>().ok()) {
            update["cost"] = json!({"amount": amount, "currency": "USD"});
        }
        self.update(update)
    }

    /// Sends `text` as a thought (`/think`).
    fn think(&self, text: &str) -> Result<(), Stop> {
        self.update(json!({"sessionUpdate": "agent_thought_chunk",
            "content": {"type": "text", "text": text}}))
    }

    /// Sends a plan of `entries`: the first completed, the second in progress, the rest
    /// pending (`/plan`).
    fn plan(&self, entries: &[String]) -> Result<(), Stop> {
        let entries: Vec<Value> = entries
            .iter()
            .enumerate()
            .map(|(index, content)| {
                let status = match index {
                    0 => "completed",
                    1 => "in_progress",
                    _ => "pending",
                };
                json!({"content": content, "priority": "medium", "status": status})
            })
            .collect();
        self.update(json!({"sessionUpdate": "plan", "entries": entries}))
    }

    /// Reports an edit from `old` to `new` as a tool call with a diff (`/diff`). Returns
    /// text for the reply.
    fn diff(&self, path: &str, old: &str, new: &str) -> Result<String, Stop> {
        let id = format!("call-{}", uuid::Uuid::new_v4());
        self.update(json!({"sessionUpdate": "tool_call", "toolCallId": id,
            "title": format!("Edit {path}"), "kind": "edit", "status": "in_progress",
            "locations": [{"path": path, "line": 1}],
            "rawInput": {"path": path}}))?;
        self.update(json!({"sessionUpdate": "tool_call_update", "toolCallId": id,
            "status": "completed",
            "content": [{"type": "diff", "path": path, "oldText": old, "newText": new}]}))?;
        Ok(format!("; diffed {path}"))
    }

    /// Reports `command` run as a tool call that fails (`/exec`). Returns text for the
    /// reply.
    fn exec(&self, command: &str) -> Result<String, Stop> {
        let id = format!("call-{}", uuid::Uuid::new_v4());
        self.update(json!({"sessionUpdate": "tool_call", "toolCallId": id,
            "title": format!("Run {command}"), "kind": "execute", "status": "in_progress",
            "rawInput": {"command": command}}))?;
        let output = format!("{command}: mock-agent runs nothing\nexit code 1");
        self.update(json!({"sessionUpdate": "tool_call_update", "toolCallId": id,
            "status": "failed",
            "content": [{"type": "content", "content": {"type": "text", "text": output}}],
            "rawOutput": {"exit_code": 1}}))?;
        Ok(format!("; ran {command} (it failed)"))
    }

    /// Streams the `/rounds` before the reply: each of them `chunks` chunks, then a tool
    /// call.
    async fn rounds(&mut self, rounds: u32, chunks: u32) -> Result<(), Stop> {
        for round in 1..rounds {
            for n in 1..=chunks {
                if self.cancel.is_cancelled() {
                    return Err(Stop::Cancelled);
                }
                self.chunk(&format!(" <r{round}:{n}/{chunks}>"))?;
            }
            self.tool(Ask::No).await?;
        }
        Ok(())
    }

    /// Streams the reply in `chunks` chunks, the first holding its text.
    fn stream_reply(&mut self, reply: &str, chunks: u32) -> Result<(), Stop> {
        for n in 1..=chunks {
            if self.cancel.is_cancelled() {
                return Err(Stop::Cancelled);
            }
            let text = match (n, chunks) {
                (_, 1) => reply.to_owned(),
                (1, _) => format!("{reply} [1/{chunks}]"),
                _ => format!(" [{n}/{chunks}]"),
            };
            self.chunk(&text)?;
        }
        Ok(())
    }

    /// A tool call, optionally behind a permission request. Returns text for the reply.
    async fn tool(&mut self, ask: Ask) -> Result<String, Stop> {
        let tool_call_id = format!("call-{}", uuid::Uuid::new_v4());
        if ask != Ask::Only {
            self.update(json!({"sessionUpdate": "tool_call", "toolCallId": tool_call_id,
                "title": "mock tool: list files", "kind": "execute", "status": "pending",
                "rawInput": {"command": "ls"}}))?;
        }
        if ask != Ask::No {
            let mut options = vec![
                json!({"optionId": "allow", "name": "Allow once", "kind": "allow_once"}),
                json!({"optionId": "allow-always", "name": "Always allow", "kind": "allow_always"}),
                json!({"optionId": "reject", "name": "Reject", "kind": "reject_once"}),
                json!({"optionId": "reject-always", "name": "Always reject", "kind": "reject_always"}),
            ];
            if ask == Ask::AlwaysFirst {
                options.swap(0, 1);
                options.swap(2, 3);
            }
            let params = json!({
                "sessionId": self.session_id,
                "toolCall": {"toolCallId": tool_call_id, "title": "mock tool: list files", "kind": "execute", "status": "pending"},
                "options": options,
            });
            let answer = self.ask(method::SESSION_REQUEST_PERMISSION, params).await?;
            let outcome = answer.as_ref().ok().and_then(|result| result.get("outcome"));
            let kind = outcome.and_then(|outcome| outcome.get("outcome")).and_then(Value::as_str);
            let option =
                outcome.and_then(|outcome| outcome.get("optionId")).and_then(Value::as_str);
            match (kind, option) {
                (Some("selected"), Some("allow" | "allow-always")) => {}
                (Some("cancelled"), _) => return Err(Stop::Cancelled),
                _ => {
                    self.update(json!({"sessionUpdate": "tool_call_update", "toolCallId": tool_call_id, "status": "failed",
                        "content": [{"type": "content", "content": {"type": "text", "text": "permission denied"}}]}))?;
                    return Ok("; the tool was not allowed".into());
                }
            }
        }
        self.update(json!({"sessionUpdate": "tool_call_update", "toolCallId": tool_call_id, "status": "in_progress"}))?;
        self.update(json!({"sessionUpdate": "tool_call_update", "toolCallId": tool_call_id, "status": "completed",
            "content": [{"type": "content", "content": {"type": "text", "text": "README.md\nsrc/"}}]}))?;
        Ok("; the tool ran".into())
    }

    /// Sends a request to the client; cancellation of the turn wins.
    async fn ask(&self, method: &str, params: Value) -> Result<Result<Value, RpcError>, Stop> {
        tokio::select! {
            result = self.agent.peer.request(method, Some(params)) => match result {
                Ok(value) => Ok(Ok(value)),
                Err(protocol::PeerError::Rpc(error)) => Ok(Err(error)),
                Err(other) => Err(Stop::Failed(RpcError::internal(other))),
            },
            _ = self.cancel.cancelled() => Err(Stop::Cancelled),
        }
    }

    fn chunk(&mut self, text: &str) -> Result<(), Stop> {
        self.said.push_str(text);
        self.update(json!({"sessionUpdate": "agent_message_chunk", "messageId": self.message_id,
            "content": {"type": "text", "text": text}}))
    }

    fn update(&self, update: Value) -> Result<(), Stop> {
        self.agent.update(self.session_id, update).map_err(Stop::Failed)
    }
}

/// The argv prefix that runs mock-agent again (its binary, or `supervisor mock-agent`).
static SELF_COMMAND: std::sync::OnceLock<Vec<std::ffi::OsString>> = std::sync::OnceLock::new();

/// Starts `mock-agent --idle` as a child that outlives the turn (it stays in our process
/// group), for tests that check no descendant survives a stop.
fn spawn_idle_child(own_group: bool) -> Result<String, RpcError> {
    use std::os::unix::process::CommandExt;
    let own = match SELF_COMMAND.get() {
        Some(command) if !command.is_empty() => command.clone(),
        _ => vec![std::env::current_exe().map_err(RpcError::internal)?.into_os_string()],
    };
    let mut command = std::process::Command::new(&own[0]);
    if own_group {
        command.process_group(0);
    }
    let child = command
        .args(&own[1..])
        .arg("--idle")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(RpcError::internal)?;
    Ok(format!("; spawned pid {}", child.id()))
}

#[cfg(test)]
mod tests;
