//! Helpers for supervisor tests: the real `supervisor serve` in a private data directory
//! (ready when it prints its serving line), a WebSocket API client, and cleanup that
//! removes every process the daemon started, even when a test fails.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use agentctl::client::object_params;
use jsonrpsee::core::client::{ClientT, Subscription};
use jsonrpsee::ws_client::{WsClient, WsClientBuilder};
use protocol::api::{
    ApiClient, EventKind, HistoryEntry, ResumeResult, SessionEvent, SessionState, SessionStatus,
    TurnState,
};
use protocol::errors::{ErrorData, ErrorKind};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::{within, workspace_bin};

/// A running `supervisor serve`.
pub struct Daemon {
    /// The API address, `ws://…`.
    pub url: String,
    /// The installation id (labels its containers).
    pub install_id: String,
    env: Vec<(String, String)>,
    /// The extra `serve` arguments it started with (kept across restarts).
    args: Vec<String>,
    /// The test's private root: data dir, HOME for agents, workspaces.
    pub root: tempfile::TempDir,
    child: Child,
    /// Every line the daemon writes on stderr (also copied to the test's stderr).
    log_tx: tokio::sync::broadcast::Sender<String>,
    /// Keep the root (data, histories, logs) when dropped, for a post-mortem.
    keep_root: bool,
    /// A receiver subscribed before the daemon started (see [`Daemon::log_from_start`]).
    first_lines: std::sync::Mutex<Option<tokio::sync::broadcast::Receiver<String>>>,
}

impl Daemon {
    /// Starts the daemon on a free loopback port with `TETHER_HOME` and `HOME` inside a
    /// fresh temp dir, and waits for its serving line.
    pub async fn start(extra_args: &[&str]) -> Daemon {
        Daemon::start_with_profiles(extra_args, &[]).await
    }

    /// Like [`Daemon::start`], with user profile files `(name, text)` in its profiles dir.
    pub async fn start_with_profiles(extra_args: &[&str], profiles: &[(&str, &str)]) -> Daemon {
        Daemon::start_with_env(extra_args, profiles, &[]).await
    }

    /// Like [`Daemon::start_with_profiles`], with extra environment variables.
    pub async fn start_with_env(
        extra_args: &[&str],
        profiles: &[(&str, &str)],
        env: &[(&str, &str)],
    ) -> Daemon {
        Daemon::start_prepared(extra_args, profiles, env, |_| ()).await.0
    }

    /// Like [`Daemon::start_with_env`], running `prepare` on the fresh root before anything
    /// is written there (e.g. to mount a small filesystem at `root/tether`).
    pub async fn start_prepared<T>(
        extra_args: &[&str],
        profiles: &[(&str, &str)],
        env: &[(&str, &str)],
        prepare: impl FnOnce(&Path) -> T,
    ) -> (Daemon, T) {
        let root = tempfile::tempdir().expect("a temp dir");
        // A test that dies without dropping this leaves its processes to the reaper.
        crate::reap::own(root.path());
        let prepared = prepare(root.path());
        let install_id = uuid::Uuid::new_v4().to_string();
        std::fs::create_dir_all(root.path().join("tether")).expect("create the data dir");
        std::fs::write(root.path().join("tether/install_id"), &install_id)
            .expect("write the install id");
        let env: Vec<(String, String)> =
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let profiles_dir = root.path().join("tether/profiles");
        std::fs::create_dir_all(&profiles_dir).expect("create the profiles dir");
        for (name, text) in profiles {
            std::fs::write(profiles_dir.join(name), text).expect("write a profile");
        }
        let (log_tx, first_lines) = tokio::sync::broadcast::channel(4096);
        let first_lines = std::sync::Mutex::new(Some(first_lines));
        let (url, child) = Daemon::spawn(root.path(), extra_args, &env, &log_tx).await;
        let args = extra_args.iter().map(|arg| arg.to_string()).collect();
        let daemon = Daemon {
            url,
            install_id,
            env,
            args,
            root,
            child,
            log_tx,
            keep_root: false,
            first_lines,
        };
        (daemon, prepared)
    }

    /// Keeps the root directory when the daemon is dropped (its processes are still
    /// killed); returns its path.
    pub fn keep_root(&mut self) -> PathBuf {
        self.keep_root = true;
        self.root.path().to_owned()
    }

    /// A receiver of the daemon's stderr lines from its start on (once; then
    /// [`Daemon::log_lines`]): a line written before the test asked is not missed.
    pub fn log_from_start(&self) -> tokio::sync::broadcast::Receiver<String> {
        let first = self.first_lines.lock().expect("UNWRAP: never poisoned").take();
        first.unwrap_or_else(|| self.log_tx.subscribe())
    }

    /// A receiver of the daemon's stderr lines from now on.
    pub fn log_lines(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.log_tx.subscribe()
    }

    /// SIGKILLs the daemon (only the daemon: its sidecars live in their own sessions).
    pub async fn kill(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        within("the supervisor to die", self.child.wait()).await.expect("wait for the supervisor");
    }

    /// SIGTERMs the daemon and waits for it to exit.
    pub async fn terminate(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let status = within("the supervisor to exit", self.child.wait())
            .await
            .expect("wait for the supervisor");
        assert!(status.success(), "SIGTERM is a clean exit: {status:?}");
    }

    /// Whether the daemon has exited (e.g. killed at a fault point), without waiting.
    pub fn has_exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for the daemon to exit by itself (e.g. killed at a fault point).
    pub async fn wait_exit(&mut self) -> std::process::ExitStatus {
        self.child.wait().await.expect("wait for the supervisor")
    }

    /// Starts the daemon again with a new set of extra environment variables (e.g. none,
    /// to disarm a fault point).
    pub async fn restart_with_env(&mut self, env: &[(&str, &str)]) {
        self.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.restart().await;
    }

    /// Like [`Daemon::restart`], with other `serve` arguments (kept for later restarts).
    pub async fn restart_with_args(&mut self, args: &[&str]) {
        self.args = args.iter().map(|arg| arg.to_string()).collect();
        self.restart().await;
    }

    /// Starts the daemon again on the same data directory (after [`Daemon::kill`]).
    pub async fn restart(&mut self) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let (url, child) = Daemon::spawn(self.root.path(), &args, &self.env, &self.log_tx).await;
        self.url = url;
        self.child = child;
    }

    /// SIGKILLs the daemon in the middle of a turn, restarts it, and follows the session's
    /// events from the last one in `seen` to the end of the turn (appending them). Returns
    /// a client of the new daemon.
    pub async fn kill_restart_and_follow(
        &mut self,
        session: &str,
        seen: &mut Vec<SessionEvent>,
    ) -> Api {
        self.kill().await;
        self.restart().await;
        self.follow_turn(session, seen).await
    }

    /// Like [`Daemon::kill_restart_and_follow`], for a daemon armed with a fault point
    /// (`TETHER_FAULT`): waits for it to die there, then starts it again disarmed.
    pub async fn fault_restart_and_follow(
        &mut self,
        session: &str,
        seen: &mut Vec<SessionEvent>,
    ) -> Api {
        within("the supervisor to die at the fault point", self.wait_exit()).await;
        self.restart_with_env(&[]).await;
        self.follow_turn(session, seen).await
    }

    /// A new client that follows the session's events from the last one in `seen` to the
    /// end of a turn, appending them.
    async fn follow_turn(&self, session: &str, seen: &mut Vec<SessionEvent>) -> Api {
        let api = self.api().await;
        let after = seen.last().map_or(0, |event| event.seq);
        let mut events = api.subscribe(session, after).await;
        seen.extend(until(&mut events, turn_ended).await);
        api
    }

    /// The pid of a session's agentctl.
    pub fn agentctl_pid(&self, session_id: &str) -> u32 {
        let pids = self.sidecars(session_id);
        assert_eq!(pids.len(), 1, "one agentctl for session {session_id}: {pids:?}");
        pids[0]
    }

    /// The state dirs of the warm agents' sidecars (`pool/<id>/agentctl`) this session
    /// claimed.
    pub fn claimed_pool_dirs(&self, session_id: &str) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(self.root.path().join("tether/pool")) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|entry| {
                std::fs::read_to_string(entry.path().join("claimed_by"))
                    .is_ok_and(|owner| owner.trim() == session_id)
            })
            .map(|entry| entry.path().join("agentctl"))
            .collect()
    }

    /// The warm agents' sidecars (every agentctl serving a `pool/` entry), claimed or not.
    pub fn pool_sidecars(&self) -> Vec<u32> {
        Daemon::processes_mentioning(&self.root.path().join("tether/pool"))
            .into_iter()
            .filter(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                String::from_utf8_lossy(&cmdline).contains("serve")
            })
            .collect()
    }

    /// Every live agentctl serving this session's state dir (one at most, by the fencing
    /// rule), or a warm agent's that the session claimed (`pool/<id>/agentctl`).
    pub fn sidecars(&self, session_id: &str) -> Vec<u32> {
        let mut dirs = vec![self.session_dir(session_id).join("agentctl")];
        dirs.extend(self.claimed_pool_dirs(session_id));
        dirs.iter()
            .flat_map(|dir| Daemon::processes_mentioning(dir))
            .filter(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                String::from_utf8_lossy(&cmdline).contains("serve")
            })
            .collect()
    }

    async fn spawn(
        root: &Path,
        extra_args: &[&str],
        env: &[(String, String)],
        log_tx: &tokio::sync::broadcast::Sender<String>,
    ) -> (String, Child) {
        let mut child = Command::new(workspace_bin("supervisor"))
            .args(["serve", "--listen", "127.0.0.1:0", "--home"])
            .arg(root.join("tether"))
            .args(extra_args)
            .env("HOME", root)
            // A test says what it configures: `scripts/test.sh` exports the static
            // agentctl for the tests' own use, not for every daemon (the daemon
            // finds one by itself).
            .env_remove("TETHER_STATIC_AGENTCTL")
            // `TETHER_TEST_LOG=debug` shows the daemon's reasoning when a test fails (a
            // test's own `TETHER_LOG` wins: it awaits a log line).
            .env("TETHER_LOG", std::env::var("TETHER_TEST_LOG").unwrap_or_else(|_| "warn".into()))
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("the supervisor starts");
        let stderr = child.stderr.take().expect("UNWRAP: piped");
        let log_tx = log_tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("{line}");
                let _ = log_tx.send(line);
            }
        });
        let mut line = String::new();
        let mut stdout = BufReader::new(child.stdout.take().expect("UNWRAP: piped"));
        within("the supervisor's serving line", stdout.read_line(&mut line))
            .await
            .expect("read the serving line");
        let url = line
            .split_whitespace()
            .find(|word| word.starts_with("ws://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned();
        (url, child)
    }

    /// A new API client.
    pub async fn api(&self) -> Api {
        Api::connect(&self.url, &[]).await.expect("connects to the API")
    }

    /// The daemon's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The `HOME` the daemon and its agents see (the test's private root).
    pub fn home(&self) -> &Path {
        self.root.path()
    }

    /// Where the `mock` profile's mock-agent keeps its sessions (its `--state-dir`, a
    /// `.mock-agent` directory under the test's root), once an agent made it.
    pub fn mock_state_dir(&self) -> PathBuf {
        let mut dirs = vec![self.home().to_path_buf()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                    if path.file_name().is_some_and(|name| name == ".mock-agent") {
                        return path;
                    }
                    dirs.push(path);
                }
            }
        }
        panic!("no .mock-agent under {}", self.home().display())
    }

    /// A fresh workspace directory.
    pub fn workspace(&self, name: &str) -> PathBuf {
        let dir = self.root.path().join("work").join(name);
        std::fs::create_dir_all(&dir).expect("create a workspace");
        dir
    }

    /// The data directory (`TETHER_HOME`, passed as `--home`).
    pub fn data_dir(&self) -> PathBuf {
        self.root.path().join("tether")
    }

    /// A session's directory.
    pub fn session_dir(&self, session_id: &str) -> PathBuf {
        self.root.path().join("tether/sessions").join(session_id)
    }

    /// Pids of live processes whose command line mentions `needle`.
    pub fn processes_mentioning(needle: &Path) -> Vec<u32> {
        crate::reap::processes_mentioning(needle)
    }

    /// Runs the CLI against this daemon; returns (exit code, stdout, stderr).
    pub async fn cli(&self, args: &[&str]) -> (i32, String, String) {
        cli(&self.url, args).await
    }

    /// [`Daemon::cli`] run in the directory `dir`.
    pub async fn cli_in(&self, dir: &Path, args: &[&str]) -> (i32, String, String) {
        cli_at(&self.url, Some(dir), args).await
    }

    /// [`Daemon::cli`] for a command that may rightly take longer than a single exchange
    /// (an agent given minutes to start): guarded by `bound` instead.
    pub async fn cli_waiting(
        &self,
        bound: std::time::Duration,
        args: &[&str],
    ) -> (i32, String, String) {
        tokio::time::timeout(bound, cli_run(&self.url, None, args))
            .await
            .unwrap_or_else(|_| panic!("the CLI ran longer than {bound:?}: {args:?}"))
    }
}

/// Runs `supervisor --url URL args…`; returns (exit code, stdout, stderr).
pub async fn cli(url: &str, args: &[&str]) -> (i32, String, String) {
    cli_at(url, None, args).await
}

/// [`cli`] in the directory `dir` (the test's own when `None`).
async fn cli_at(url: &str, dir: Option<&Path>, args: &[&str]) -> (i32, String, String) {
    within("the CLI", cli_run(url, dir, args)).await
}

/// Runs the CLI to its end, unbounded.
async fn cli_run(url: &str, dir: Option<&Path>, args: &[&str]) -> (i32, String, String) {
    let mut command = Command::new(workspace_bin("supervisor"));
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let output = command
        .arg("--url")
        .arg(url)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("the CLI runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        // Sidecars are detached from the daemon on purpose; they all run under our root.
        for pid in Daemon::processes_mentioning(self.root.path()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        // And their cgroups (where the daemon made them), with anything that escaped.
        supervisor::runtime::cgroup::discard(&self.install_id);
        if self.keep_root
            && let Ok(empty) = tempfile::tempdir()
        {
            let _ = std::mem::replace(&mut self.root, empty).keep();
        }
    }
}

/// An API error: `data` (kind, field, limit) and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// `data.kind` (`Unknown` when the server gave none).
    pub kind: ErrorKind,
    /// `data.field`: the param at fault.
    pub field: Option<String>,
    /// `data.limit`: the size limit broken.
    pub limit: Option<u64>,
    /// The JSON-RPC code.
    pub code: i32,
    /// The message.
    pub message: String,
}

impl ApiError {
    /// The server's refusal in `err`; a transport error fails the test (`what` says where).
    pub fn of(what: &str, err: jsonrpsee::core::ClientError) -> ApiError {
        match err {
            jsonrpsee::core::ClientError::Call(error) => {
                let data =
                    ErrorData::of(&error).unwrap_or_else(|| ErrorData::kind(ErrorKind::Unknown));
                ApiError {
                    kind: data.kind,
                    field: data.field,
                    limit: data.limit,
                    code: error.code(),
                    message: error.message().to_owned(),
                }
            }
            other => panic!("{what}: transport error {other}"),
        }
    }
}

/// Awaits an API call (bounded by [`within`]): its answer, or the server's refusal.
pub async fn call<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, jsonrpsee::core::ClientError>>,
) -> Result<T, ApiError> {
    within(what, call).await.map_err(|err| ApiError::of(what, err))
}

/// Awaits an API call that must succeed.
pub async fn ok<T>(
    what: &str,
    answer: impl std::future::Future<Output = Result<T, jsonrpsee::core::ClientError>>,
) -> T {
    call(what, answer).await.unwrap_or_else(|err| panic!("{what}: {err:?}"))
}

/// Awaits an API call that must be refused; returns the refusal.
pub async fn refused<T: std::fmt::Debug>(
    what: &str,
    answer: impl std::future::Future<Output = Result<T, jsonrpsee::core::ClientError>>,
) -> ApiError {
    match call(what, answer).await {
        Ok(answer) => panic!("{what}: accepted, answered {answer:?}"),
        Err(err) => err,
    }
}

/// A WebSocket client of the API: [`Api::typed`] is the typed client every test calls
/// (`protocol::api::ApiClient`); the helpers below wrap the common sequences.
pub struct Api {
    client: WsClient,
}

impl Api {
    /// Connects with extra HTTP headers (e.g. an `Origin`).
    pub async fn connect(
        url: &str,
        headers: &[(&str, &str)],
    ) -> Result<Api, jsonrpsee::core::ClientError> {
        let mut map = http::HeaderMap::new();
        for (name, value) in headers {
            map.insert(
                http::HeaderName::from_bytes(name.as_bytes()).expect("a header name"),
                http::HeaderValue::from_str(value).expect("a header value"),
            );
        }
        let client = WsClientBuilder::default()
            .set_headers(map)
            .max_request_size(64 * 1024 * 1024)
            .max_buffer_capacity_per_subscription(1 << 20)
            .build(url)
            .await?;
        Ok(Api { client })
    }

    /// The typed client of the API (`protocol::api::ApiClient`'s methods).
    pub fn typed(&self) -> &WsClient {
        &self.client
    }

    /// Sends `params` as they are, for tests of malformed input; only the refusal can be
    /// looked at (an answer is reduced to "accepted").
    pub async fn call_raw(&self, method: &str, params: Value) -> Result<(), ApiError> {
        call(method, self.client.request::<Value, _>(method, object_params(params))).await.map(drop)
    }

    /// Starts a workflow of `spec` whose steps work in `workspace`.
    pub async fn start_workflow(
        &self,
        spec: impl Into<String>,
        workspace: &Path,
    ) -> protocol::api::WorkflowStarted {
        let workspace = workspace.to_str().expect("a UTF-8 path").to_owned();
        let start = self.client.workflow_start(spec.into(), None, None, None, Some(workspace));
        ok("workflow.start", start).await
    }

    /// Follows a workflow's events from the start until it is over: its last state and the
    /// events seen.
    pub async fn workflow_end(
        &self,
        workflow_id: &str,
    ) -> (protocol::api::WorkflowState, Vec<protocol::api::WorkflowEvent>) {
        let subscribe = self.client.workflow_subscribe(workflow_id.to_owned(), Some(0));
        let mut events = ok("workflow.subscribe", subscribe).await;
        let mut seen = Vec::new();
        loop {
            let event = within("a workflow event", events.next())
                .await
                .expect("the workflow's stream stays open")
                .expect("a workflow event");
            seen.push(event.clone());
            if let protocol::api::WorkflowEventKind::WorkflowState { state, .. } = event.kind
                && state.is_over()
            {
                return (state, seen);
            }
        }
    }

    /// Subscribes to a session's events after `after_seq`.
    pub async fn subscribe(&self, session_id: &str, after_seq: u64) -> Subscription<SessionEvent> {
        ok(
            "task.session.subscribe",
            self.client.session_subscribe(session_id.to_owned(), Some(after_seq)),
        )
        .await
    }

    /// Subscribes to a session's events after `after_seq`, in batches
    /// (`task.session.subscribe_batch`).
    pub async fn subscribe_batches(
        &self,
        session_id: &str,
        after_seq: u64,
    ) -> Subscription<protocol::api::EventBatch> {
        ok(
            "task.session.subscribe_batch",
            self.client.session_subscribe_batch(session_id.to_owned(), Some(after_seq)),
        )
        .await
    }

    /// Subscribes to a session's events from now on.
    pub async fn subscribe_at_end(&self, session_id: &str) -> Subscription<SessionEvent> {
        let after = self.status(session_id).await.last_event_seq;
        self.subscribe(session_id, after).await
    }

    /// Creates a task and a session of `profile` in it; returns the session id, or the
    /// refusal.
    pub async fn create_session(
        &self,
        profile: &str,
        workspace: &Path,
    ) -> Result<String, ApiError> {
        let task =
            ok("task.create", self.client.task_create(format!("{profile} test"), None)).await;
        let row = call(
            "task.session.create",
            Create::new(&task.id, profile, Some(workspace)).send(&self.client),
        )
        .await?;
        Ok(row.id)
    }

    /// `task.session.create` of a worktree session of `profile` on `repo` in `task`, from
    /// `base`; the row, or the refusal.
    pub async fn create_worktree(
        &self,
        task: &str,
        profile: &str,
        repo: &Path,
        base: Option<&str>,
    ) -> Result<protocol::api::SessionSummary, ApiError> {
        let create = Create {
            worktree: Some(true),
            base: base.map(str::to_owned),
            ..Create::new(task, profile, Some(repo))
        }
        .send(&self.client);
        call("task.session.create", create).await
    }

    /// Creates a task and a session on `profile` in `workspace`; waits until it is
    /// `WAITING_FOR_INPUT`. Returns the session id.
    pub async fn ready_session(&self, profile: &str, workspace: &Path) -> String {
        let session = self.create_session(profile, workspace).await.expect("task.session.create");
        let mut events = self.subscribe(&session, 0).await;
        match settled(&mut events).await {
            (SessionState::WaitingForInput, _) => session,
            (state, error) => panic!("the session settled {state}: {error}"),
        }
    }

    /// `task.session.status`.
    pub async fn status(&self, session: &str) -> SessionStatus {
        ok("task.session.status", self.client.session_status(session.to_owned())).await
    }

    /// `task.session.prompt`: the turn's id, or the refusal. A prompt queued while the
    /// session's agent came back (`waking`) is followed to the turn it became (a launch
    /// that failed, halting the queue, panics with why). Panics when the prompt was queued
    /// behind a running turn (see [`Api::prompt_or_queue`]).
    pub async fn prompt(&self, session: &str, text: &str) -> Result<String, ApiError> {
        let started = self.prompt_or_queue(session, text).await?;
        match (started.turn_id, started.prompt_id) {
            (Some(turn_id), _) => Ok(turn_id),
            (None, Some(prompt_id)) if started.waking => {
                Ok(self.turn_of_queued(session, &prompt_id).await)
            }
            (None, prompt_id) => panic!("the prompt was queued, not started: {prompt_id:?}"),
        }
    }

    /// Follows `session` from its start until the first turn whose prompt is `prompt` has
    /// ended (a prompt the daemon took before a kill, run after the restart); returns
    /// everything seen.
    pub async fn until_turn_of_prompt_ends(
        &self,
        session: &str,
        prompt: &str,
    ) -> Vec<SessionEvent> {
        let mut events = self.subscribe(session, 0).await;
        let mut turn = None;
        until(&mut events, |event| match &event.kind {
            EventKind::TurnStarted { turn_id, prompt: text, .. } if text == prompt => {
                turn.get_or_insert_with(|| turn_id.clone());
                false
            }
            EventKind::TurnEnded { turn_id, .. } => turn.as_ref() == Some(turn_id),
            _ => false,
        })
        .await
    }

    /// The turn a queued prompt became, once it started; panics when the queue halted
    /// with the prompt still in it.
    pub async fn turn_of_queued(&self, session: &str, prompt_id: &str) -> String {
        let mut events = self.subscribe(session, 0).await;
        loop {
            match next(&mut events).await.kind {
                EventKind::TurnStarted { turn_id, prompt_id: Some(id), .. } if id == prompt_id => {
                    return turn_id;
                }
                EventKind::Queue { queue }
                    if queue.halted.is_some()
                        && queue.prompts.iter().any(|queued| queued.prompt_id == prompt_id) =>
                {
                    panic!("the queue halted with prompt {prompt_id} in it: {queue:?}")
                }
                _ => {}
            }
        }
    }

    /// `task.session.prompt`: the turn started, or the prompt queued; or the refusal.
    pub async fn prompt_or_queue(
        &self,
        session: &str,
        text: &str,
    ) -> Result<protocol::api::PromptStarted, ApiError> {
        call("task.session.prompt", self.client.session_prompt(session.to_owned(), text.to_owned()))
            .await
    }

    /// `task.session.steer`, or the refusal.
    pub async fn steer(
        &self,
        session: &str,
        text: &str,
    ) -> Result<protocol::api::Steered, ApiError> {
        call("task.session.steer", self.client.session_steer(session.to_owned(), text.to_owned()))
            .await
    }

    /// `task.session.resume`, or the refusal.
    pub async fn resume(&self, session: &str) -> Result<ResumeResult, ApiError> {
        call("task.session.resume", self.client.session_resume(session.to_owned(), None)).await
    }

    /// The whole history of a session.
    pub async fn history(&self, session: &str) -> Vec<HistoryEntry> {
        ok(
            "task.session.history",
            self.client.session_history(session.to_owned(), None, Some(100_000)),
        )
        .await
    }

    /// Prompts and waits for the end of the turn, which must complete; returns the reply.
    pub async fn ask(&self, session: &str, text: &str) -> String {
        let mut events = self.subscribe_at_end(session).await;
        self.prompt(session, text).await.expect("prompt");
        let seen = until(&mut events, turn_ended).await;
        let ended = seen.last().expect("UNWRAP: until returns what it found");
        assert!(
            matches!(ended.kind, EventKind::TurnEnded { state: TurnState::Completed, .. }),
            "{ended:?}"
        );
        chunks(&seen).concat()
    }
}

/// Waits for a daemon log line containing `needle` (an event: the line arrives).
pub async fn await_log(
    lines: &mut tokio::sync::broadcast::Receiver<String>,
    needle: &str,
) -> String {
    within(needle, async {
        loop {
            match lines.recv().await {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    panic!("the daemon's log ended before {needle:?}")
                }
            }
        }
    })
    .await
}

/// Prepares a fresh daemon root (see [`Daemon::start_prepared`]) so that an agent run as
/// `uid` (`[process] user`) may work in the workspace `name`: the root passable (0711), the
/// workspaces' directory readable, the workspace shared with `uid`'s group (setgid, 2770).
pub fn share_workspace_with(root: &Path, name: &str, uid: u32) {
    use std::os::unix::fs::{PermissionsExt, chown};
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o711)).unwrap();
    let work = root.join("work").join(name);
    std::fs::create_dir_all(&work).unwrap();
    std::fs::set_permissions(root.join("work"), std::fs::Permissions::from_mode(0o755)).unwrap();
    chown(&work, None, Some(uid)).unwrap();
    std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o2770)).unwrap();
}

/// The next event of a subscription.
pub async fn next(events: &mut Subscription<SessionEvent>) -> SessionEvent {
    within("a session event", events.next())
        .await
        .expect("the subscription is open")
        .expect("the event parses")
}

/// Reads events until one satisfies `pred`; returns all read, that one last.
pub async fn until(
    events: &mut Subscription<SessionEvent>,
    mut pred: impl FnMut(&SessionEvent) -> bool,
) -> Vec<SessionEvent> {
    let mut seen = Vec::new();
    loop {
        let event = next(events).await;
        let done = pred(&event);
        seen.push(event);
        if done {
            return seen;
        }
    }
}

/// Reads events until a permission request; returns all read, the request's id and its
/// ACP params (the agent's, relayed as they came).
pub async fn until_permission_request(
    events: &mut Subscription<SessionEvent>,
) -> (Vec<SessionEvent>, String, Value) {
    let seen = until(events, |e| matches!(e.kind, EventKind::PermissionRequest { .. })).await;
    match seen.last().map(|e| &e.kind) {
        Some(EventKind::PermissionRequest { request_id, params }) => {
            let (id, params) = (request_id.clone(), params.clone());
            (seen, id, params)
        }
        _ => unreachable!("until returns the request last"),
    }
}

/// Whether an event ends a turn.
pub fn turn_ended(event: &SessionEvent) -> bool {
    matches!(event.kind, EventKind::TurnEnded { .. })
}

/// Reads events until the session settles (`WAITING_FOR_INPUT` or `FAILED`); returns that
/// state and its error ("" when none).
pub async fn settled(events: &mut Subscription<SessionEvent>) -> (SessionState, String) {
    loop {
        if let EventKind::State { state, error } = next(events).await.kind
            && matches!(state, SessionState::WaitingForInput | SessionState::Failed)
        {
            return (state, error.unwrap_or_default());
        }
    }
}

/// Whether an event is a change to `state`.
pub fn is_state(event: &SessionEvent, wanted: SessionState) -> bool {
    matches!(event.kind, EventKind::State { state, .. } if state == wanted)
}

/// The stop reason of a `turn_ended` event (`None` for any other event or a failed turn).
pub fn stop_reason(event: &SessionEvent) -> Option<&str> {
    match &event.kind {
        EventKind::TurnEnded { stop_reason, .. } => stop_reason.as_deref(),
        _ => None,
    }
}

/// The messages of the `notice` events among `events`.
pub fn notices(events: &[SessionEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Notice { message } => Some(message.clone()),
            _ => None,
        })
        .collect()
}

/// The `progress` events among `events`, each as `"step detail"` (`"step "` without one).
pub fn progress_steps(events: &[SessionEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Progress { step, detail } => {
                Some(format!("{step} {}", detail.as_deref().unwrap_or("")))
            }
            _ => None,
        })
        .collect()
}

/// The texts of the `agent_message_chunk` events among `events`.
pub fn chunks(events: &[SessionEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::AgentMessageChunk { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

/// SIGKILLs a process (e.g. an agentctl) and waits until it is gone.
pub async fn sigkill(pid: u32) {
    let pidfd = agentctl::process::PidFd::open(pid).expect("a pidfd of the process");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL");
    within("the SIGKILLed process to die", pidfd.exited()).await.expect("pidfd");
}

/// SIGKILLs the session's agentctl (its agent dies with it) and waits until the session
/// knows: it says so on its stream, and its status asks for a resume.
pub async fn kill_sidecar(daemon: &Daemon, api: &Api, session: &str) {
    let pid = daemon.agentctl_pid(session);
    let mut events = api.subscribe_at_end(session).await;
    sigkill(pid).await;
    until(&mut events, |e| matches!(&e.kind, EventKind::State { error: Some(_), .. })).await;
    let lost = api.status(session).await;
    assert!(!lost.is_agent_running);
    assert!(lost.needs_resume, "{lost:?}");
}

/// `task.session.create`'s params, with what a test does not set left to the daemon:
/// `Create { shared: Some(true), ..Create::new(task, "mock", Some(dir)) }.send(client)`.
#[derive(Debug, Clone, Default)]
pub struct Create {
    /// `task_id`.
    pub task_id: String,
    /// `agent_profile_id`.
    pub profile: String,
    /// `workspace_path`.
    pub workspace: Option<String>,
    /// `prompt`.
    pub prompt: Option<String>,
    /// `runtime`.
    pub runtime: Option<protocol::api::RuntimeKind>,
    /// `shared`.
    pub shared: Option<bool>,
    /// `worktree`.
    pub worktree: Option<bool>,
    /// `base`.
    pub base: Option<String>,
    /// `labels`.
    pub labels: Option<std::collections::BTreeMap<String, String>>,
    /// `mcp_servers`.
    pub mcp_servers: Option<Vec<serde_json::Value>>,
    /// `session_id`.
    pub session_id: Option<String>,
    /// `additional_directories`.
    pub additional_directories: Option<Vec<String>>,
}

impl Create {
    /// A session of `profile` in `task`, in `workspace` when given.
    pub fn new(task_id: &str, profile: &str, workspace: Option<&Path>) -> Create {
        Create {
            task_id: task_id.to_owned(),
            profile: profile.to_owned(),
            workspace: workspace.map(|dir| dir.to_str().expect("a UTF-8 path").to_owned()),
            ..Create::default()
        }
    }

    /// The call (to be awaited, or given to `ok`, `call` or `refused`).
    pub fn send(
        self,
        client: &WsClient,
    ) -> impl std::future::Future<
        Output = Result<protocol::api::SessionSummary, jsonrpsee::core::ClientError>,
    > + '_ {
        client.session_create(
            self.task_id,
            self.profile,
            self.workspace,
            self.prompt,
            self.runtime,
            self.shared,
            self.worktree,
            self.base,
            self.labels,
            self.mcp_servers,
            self.session_id,
            self.additional_directories,
        )
    }
}

/// A profile `id` whose mock-agent exits at start while `flag` exists (its launch fails
/// until the file goes): for tests of failed launches and what fixes them.
pub fn fail_while_profile(id: &str, flag: &Path) -> String {
    format!(
        "id = \"{id}\"\ncommand = [\"mock-agent\", \"--fail-while\", \"{}\"]\nprotocol = \"acp\"\n",
        flag.display()
    )
}
