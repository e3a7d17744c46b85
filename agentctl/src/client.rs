//! The supervisor's side of the control channel: launching agentctl detached, a typed
//! client for every method, and an event stream that reconnects and resumes after the
//! last event it delivered.
//!
//! Delivery is at-least-once on the wire; [`EventStream`] makes it exactly-once for its
//! caller by dropping any event whose seq it has already delivered.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use jsonrpsee::core::client::{ClientT, Subscription};
use jsonrpsee::core::params::ObjectParams;
use jsonrpsee::ws_client::{WsClient, WsClientBuilder};
use protocol::control::{
    self, AgentStarted, ControlClient as _, Event, ReadyInfo, StartAgent, Status, Stopped,
};
use protocol::errors::{ErrorData, ErrorKind};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::resubscribe::{Resubscribing, Source};
use crate::server::MAX_MESSAGE_BYTES;

/// Where a sidecar's control channel listens: a TCP address, or the Unix socket a local
/// sidecar serves in its 0700 state dir (`unix:PATH`), which only its user can dial.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ControlAddr {
    /// `IP:PORT`.
    Tcp(SocketAddr),
    /// `unix:PATH`.
    Unix(PathBuf),
}

impl std::fmt::Display for ControlAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControlAddr::Tcp(addr) => write!(f, "{addr}"),
            ControlAddr::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

impl std::str::FromStr for ControlAddr {
    type Err = std::net::AddrParseError;

    fn from_str(text: &str) -> Result<ControlAddr, Self::Err> {
        match text.strip_prefix("unix:") {
            Some(path) => Ok(ControlAddr::Unix(PathBuf::from(path))),
            None => text.parse().map(ControlAddr::Tcp),
        }
    }
}

impl From<SocketAddr> for ControlAddr {
    fn from(addr: SocketAddr) -> ControlAddr {
        ControlAddr::Tcp(addr)
    }
}

/// The longest Unix socket path (`sun_path` holds 108 bytes with its NUL); a longer one
/// cannot be bound, and a local sidecar then listens on loopback TCP.
pub const MAX_SOCKET_PATH: usize = 107;

/// Errors on the client side.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The connection could not be made, or broke.
    #[error("control channel to {addr}: {source}")]
    Transport {
        /// Where.
        addr: ControlAddr,
        /// Why.
        source: jsonrpsee::core::ClientError,
    },
    /// agentctl answered with an error; `kind` is its `data.kind`.
    #[error("agentctl refused {method}: {message} ({kind})")]
    Refused {
        /// The method.
        method: String,
        /// `data.kind`, e.g. `not_running`, `pruned`.
        kind: ErrorKind,
        /// The message.
        message: String,
    },
    /// An event did not parse.
    #[error("malformed event from agentctl: {0}")]
    Malformed(String),
    /// agentctl did not answer in time (it may be stopped, or its machine overloaded).
    #[error("agentctl at {addr} did not answer {method} within {after:?}")]
    Timeout {
        /// Where.
        addr: ControlAddr,
        /// The method.
        method: String,
        /// How long we waited.
        after: Duration,
    },
}

impl ClientError {
    fn from_call(
        addr: ControlAddr,
        method: &str,
        err: jsonrpsee::core::ClientError,
    ) -> ClientError {
        match err {
            jsonrpsee::core::ClientError::Call(object) => ClientError::Refused {
                method: method.to_owned(),
                kind: ErrorData::of(&object).map_or(ErrorKind::Unknown, |data| data.kind),
                message: object.message().to_owned(),
            },
            other => ClientError::Transport { addr, source: other },
        }
    }

    /// The `data.kind` of a refusal.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            ClientError::Refused { kind, .. } => Some(*kind),
            _ => None,
        }
    }
}

/// A connection to one agentctl. Clones share the connection (calls and the event stream
/// of one session go over one socket).
#[derive(Debug, Clone)]
pub struct ControlClient {
    addr: ControlAddr,
    token: String,
    client: std::sync::Arc<WsClient>,
    capacity: usize,
    /// The pinned certificate (PEM) when the channel is TLS.
    pinned: Option<std::sync::Arc<[u8]>>,
}

/// How many unread notifications a subscription may hold by default.
pub const DEFAULT_SUBSCRIPTION_CAPACITY: usize = 16 * 1024;

/// How many unread batches the supervisor's event stream may hold: a batch holds at most
/// `protocol::control::MAX_BATCH_EVENTS` events and about `MAX_BATCH_BYTES`, so this bounds
/// a session's buffered events to about 64 MiB. A stream that falls further behind is
/// closed by the client library and resubscribed from its cursor (the rest is on disk).
pub const BATCH_SUBSCRIPTION_CAPACITY: usize = 256;

/// How long a connection (TCP and the WebSocket handshake) may take. A sidecar that is
/// stopped (SIGSTOP) or wedged accepts the TCP connection in the kernel and then never
/// answers: without this bound its caller would wait forever.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a control call may take, except `agent.stop` (bounded by its grace periods).
/// Every call is local and small; a sidecar that does not answer in this time is treated as
/// gone by its callers.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A JSON object as jsonrpsee named params (anything else becomes empty params).
pub fn object_params(value: Value) -> ObjectParams {
    let mut params = ObjectParams::new();
    if let Value::Object(map) = value {
        for (key, value) in map {
            params.insert(&key, value).expect("UNWRAP: a Value always serialises");
        }
    }
    params
}

impl ControlClient {
    /// Connects to agentctl at `addr` with its bearer token.
    pub async fn connect(addr: ControlAddr, token: &str) -> Result<ControlClient, ClientError> {
        ControlClient::connect_with_capacity(addr, token, DEFAULT_SUBSCRIPTION_CAPACITY).await
    }

    /// Like [`ControlClient::connect`], with the number of events a subscription may hold
    /// unread before the client library gives up on it (and [`EventStream`] resubscribes).
    pub async fn connect_with_capacity(
        addr: ControlAddr,
        token: &str,
        capacity: usize,
    ) -> Result<ControlClient, ClientError> {
        ControlClient::connect_pinned(addr, token, capacity, None).await
    }

    /// Like [`ControlClient::connect_with_capacity`]; with `pinned` (a certificate, PEM)
    /// over TLS, trusting the sidecar only if it presents exactly that certificate.
    pub async fn connect_pinned(
        addr: ControlAddr,
        token: &str,
        capacity: usize,
        pinned: Option<std::sync::Arc<[u8]>>,
    ) -> Result<ControlClient, ClientError> {
        let mut headers = http::HeaderMap::new();
        let value = http::HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
            ClientError::Refused {
                method: "connect".into(),
                kind: ErrorKind::InvalidParams,
                message: "the token is not a valid header value".into(),
            }
        })?;
        headers.insert(http::header::AUTHORIZATION, value);
        let mut builder = WsClientBuilder::default();
        let mut url = format!("ws://{addr}");
        if let Some(cert) = &pinned {
            let config =
                crate::tls::pinned_client_config(cert).map_err(|err| ClientError::Refused {
                    method: "connect".into(),
                    kind: ErrorKind::InvalidParams,
                    message: format!("the sidecar's certificate: {err}"),
                })?;
            builder = builder.with_custom_cert_store(config);
            url = format!("wss://{addr}");
        }
        let builder = builder
            .set_headers(headers)
            .max_request_size(MAX_MESSAGE_BYTES)
            .max_response_size(MAX_MESSAGE_BYTES)
            .max_buffer_capacity_per_subscription(capacity)
            // Each call has its own bound (`call_within`); this is only a backstop.
            .request_timeout(Duration::from_secs(3600))
            .connection_timeout(CONNECT_TIMEOUT);
        let transport = |source| ClientError::Transport { addr: addr.clone(), source };
        let client = async {
            match &addr {
                ControlAddr::Tcp(_) => builder.build(url).await.map_err(transport),
                ControlAddr::Unix(path) => {
                    let stream = tokio::net::UnixStream::connect(path).await.map_err(|err| {
                        transport(jsonrpsee::core::ClientError::Transport(err.into()))
                    })?;
                    builder.build_with_stream("ws://localhost", stream).await.map_err(transport)
                }
            }
        };
        let client = match tokio::time::timeout(CONNECT_TIMEOUT, client).await {
            Ok(built) => built?,
            Err(_) => {
                return Err(ClientError::Timeout {
                    addr,
                    method: "connect".into(),
                    after: CONNECT_TIMEOUT,
                });
            }
        };
        Ok(ControlClient {
            addr,
            token: token.to_owned(),
            client: std::sync::Arc::new(client),
            capacity,
            pinned,
        })
    }

    /// Runs `call` (a method of the generated [`control::ControlClient`]) within `limit`.
    async fn within<R>(
        &self,
        method: &str,
        limit: Duration,
        call: impl Future<Output = Result<R, jsonrpsee::core::ClientError>>,
    ) -> Result<R, ClientError> {
        match tokio::time::timeout(limit, call).await {
            Ok(answer) => {
                answer.map_err(|err| ClientError::from_call(self.addr.clone(), method, err))
            }
            Err(_) => Err(ClientError::Timeout {
                addr: self.addr.clone(),
                method: method.to_owned(),
                after: limit,
            }),
        }
    }

    /// Any method with any params, for tests of malformed input (everything else goes
    /// through the typed methods).
    pub async fn call_raw(&self, method: &str, params: Value) -> Result<Value, ClientError> {
        self.within(method, CALL_TIMEOUT, self.client.request(method, object_params(params))).await
    }

    /// `status`.
    pub async fn status(&self) -> Result<Status, ClientError> {
        self.within("status", CALL_TIMEOUT, self.client.status()).await
    }

    /// `agent.start`.
    pub async fn start_agent(&self, start: &StartAgent) -> Result<AgentStarted, ClientError> {
        let start = start.clone();
        let call = self.client.agent_start(
            start.command,
            Some(start.args),
            Some(start.env),
            start.cwd,
            Some(start.extra_roots),
            start.user,
            Some(start.owned_dirs),
            start.egress,
            Some(start.isolate_network).filter(|isolate| *isolate),
        );
        self.within("agent.start", CALL_TIMEOUT, call).await
    }

    /// `acp.send`: one JSON-RPC message to the agent.
    pub async fn send_acp(&self, message: &Value) -> Result<(), ClientError> {
        self.within("acp.send", CALL_TIMEOUT, self.client.acp_send(message.clone())).await.map(drop)
    }

    /// `events.ack`; returns the acknowledged seq.
    pub async fn ack(&self, seq: u64) -> Result<u64, ClientError> {
        let acked = self.within("events.ack", CALL_TIMEOUT, self.client.events_ack(seq)).await?;
        Ok(acked.acked_seq)
    }

    /// `intake.hold`.
    pub async fn hold_intake(&self, hold: bool) -> Result<(), ClientError> {
        self.within("intake.hold", CALL_TIMEOUT, self.client.intake_hold(hold)).await.map(drop)
    }

    /// `workspace.bind`.
    pub async fn bind_workspace(
        &self,
        cwd: &std::path::Path,
        extra_roots: &[std::path::PathBuf],
    ) -> Result<(), ClientError> {
        let call = self.client.workspace_bind(cwd.to_owned(), Some(extra_roots.to_vec()));
        self.within("workspace.bind", CALL_TIMEOUT, call).await.map(drop)
    }

    /// `agent.stop`.
    pub async fn stop_agent(&self, grace: Duration) -> Result<Stopped, ClientError> {
        // EOF, SIGTERM and SIGKILL are each `grace` apart, then the output drains.
        let limit = grace * 2 + crate::agent::DRAIN_AFTER_EXIT + CALL_TIMEOUT;
        self.within("agent.stop", limit, self.client.agent_stop(grace.as_millis() as u64)).await
    }

    /// `shutdown`: agentctl stops its agent and exits.
    pub async fn shutdown(&self) -> Result<(), ClientError> {
        self.within("shutdown", CALL_TIMEOUT, self.client.shutdown()).await.map(drop)
    }

    /// `events.subscribe`: every event with `seq > after_seq`, then live ones.
    pub async fn subscribe(&self, after_seq: u64) -> Result<Subscription<Event>, ClientError> {
        self.within("events.subscribe", CALL_TIMEOUT, self.client.events_subscribe(after_seq)).await
    }

    /// `events.subscribe_batch` (each item the events ready at once), or, from an agentctl
    /// that does not have it, `events.subscribe`.
    pub async fn subscribe_feed(&self, after_seq: u64) -> Result<Feed, ClientError> {
        let batch = self.client.events_subscribe_batch(after_seq);
        match self.within("events.subscribe_batch", CALL_TIMEOUT, batch).await {
            Ok(subscription) => Ok(Feed::Batches(subscription)),
            Err(ClientError::Refused { kind: ErrorKind::NoSuchMethod, .. }) => {
                self.subscribe(after_seq).await.map(Feed::Single)
            }
            Err(err) => Err(err),
        }
    }

    /// An event stream starting after `after_seq` that survives reconnects.
    pub fn events(self, after_seq: u64) -> EventStream {
        let events = SidecarEvents {
            addr: self.addr.clone(),
            token: self.token.clone(),
            capacity: self.capacity,
            pinned: self.pinned.clone(),
            client: Some(self),
            subscription: None,
        };
        Resubscribing::new(events, after_seq)
    }

    /// Where this client is connected.
    pub fn addr(&self) -> &ControlAddr {
        &self.addr
    }
}

/// A subscription to agentctl's events: batched, or one event per notification (an
/// older agentctl).
#[derive(Debug)]
pub enum Feed {
    /// `events.subscribe_batch`.
    Batches(Subscription<Vec<Event>>),
    /// `events.subscribe`.
    Single(Subscription<Event>),
}

impl Feed {
    /// The next notification's events; `None` when the subscription ended.
    async fn next(&mut self) -> Option<Result<Vec<Event>, serde_json::Error>> {
        match self {
            Feed::Batches(subscription) => subscription.next().await,
            Feed::Single(subscription) => {
                subscription.next().await.map(|next| next.map(|event| vec![event]))
            }
        }
    }
}

/// agentctl's events in order, each once and without gaps, across reconnects and lagging
/// (see [`crate::resubscribe`]).
pub type EventStream = Resubscribing<SidecarEvents>;

/// agentctl's event subscriptions: on one connection while it lives, else on a new one.
#[derive(Debug)]
pub struct SidecarEvents {
    addr: ControlAddr,
    token: String,
    capacity: usize,
    pinned: Option<std::sync::Arc<[u8]>>,
    client: Option<ControlClient>,
    subscription: Option<Feed>,
}

impl Source for SidecarEvents {
    type Item = Event;
    type Error = ClientError;

    fn seq(event: &Event) -> u64 {
        event.seq
    }

    async fn subscribe(&mut self, after: u64) -> Result<(), ClientError> {
        self.subscription = None;
        let client = match self.client.take() {
            Some(client) if client.client.is_connected() => client,
            _ => {
                let pinned = self.pinned.clone();
                ControlClient::connect_pinned(self.addr.clone(), &self.token, self.capacity, pinned)
                    .await?
            }
        };
        self.subscription = Some(client.subscribe_feed(after).await?);
        self.client = Some(client);
        Ok(())
    }

    async fn next_batch(&mut self) -> Option<Result<Vec<Event>, ClientError>> {
        let next = self.subscription.as_mut()?.next().await;
        match next {
            Some(Ok(events)) => Some(Ok(events)),
            Some(Err(err)) => Some(Err(ClientError::Malformed(err.to_string()))),
            None => {
                // The subscription ended (connection lost, or the client fell behind).
                self.subscription = None;
                None
            }
        }
    }
}

impl Resubscribing<SidecarEvents> {
    /// The connection, for other calls (e.g. acks) on the same socket.
    pub fn client(&self) -> Option<&ControlClient> {
        self.source().client.as_ref()
    }
}

/// How to launch an agentctl.
#[derive(Debug, Clone)]
pub struct LaunchConfig {
    /// The agentctl binary.
    pub program: PathBuf,
    /// Arguments before `serve` (e.g. `agentctl` when the binary embeds it as an applet).
    pub prefix_args: Vec<std::ffi::OsString>,
    /// Its state dir (spool, ready.json, log).
    pub state_dir: PathBuf,
    /// Where the control channel listens (a Unix socket path, or a TCP address).
    pub listen: ControlAddr,
    /// The bearer token, passed in the environment (never argv).
    pub token: String,
    /// How long to wait for the ready line.
    pub ready_timeout: Duration,
    /// More `serve` arguments (e.g. `--max-line`).
    pub extra_args: Vec<String>,
    /// A cgroup (v2) directory to move agentctl into before it is announced ready, so the
    /// agent it starts later is in it.
    pub cgroup: Option<PathBuf>,
}

/// A launched agentctl.
#[derive(Debug, Clone)]
pub struct Launched {
    /// What it announced.
    pub ready: ReadyInfo,
    /// The address to connect to.
    pub addr: ControlAddr,
}

/// Errors while launching.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// The state dir or log could not be prepared, or the process not spawned.
    #[error("cannot launch agentctl ({}): {source}", program.display())]
    Spawn {
        /// The binary.
        program: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It exited or closed stdout before its ready line.
    #[error("agentctl exited before it was ready; see {}", log.display())]
    NoReadyLine {
        /// Its log.
        log: PathBuf,
    },
    /// The ready line did not arrive in time.
    #[error("agentctl did not become ready within {0:?}")]
    Timeout(Duration),
    /// The ready line did not parse.
    #[error("agentctl's ready line is malformed: {0}")]
    BadReadyLine(String),
}

/// A fresh random bearer token.
pub fn new_token() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// Launches `agentctl serve` fully detached — its own session, stderr appended to
/// `<state_dir>/agentctl.log`, not killed when we drop it or die — and waits for its ready
/// line on the stdout pipe. The token goes as the first line of its stdin (then closed),
/// so that no process's environment or argv holds it.
pub async fn launch(config: &LaunchConfig) -> Result<Launched, LaunchError> {
    let spawn_err = |source| LaunchError::Spawn { program: config.program.clone(), source };
    create_private_dir(&config.state_dir).map_err(spawn_err)?;
    let log_path = config.state_dir.join("agentctl.log");
    let log = open_log(&log_path).map_err(spawn_err)?;
    let mut command = tokio::process::Command::new(&config.program);
    command
        .args(&config.prefix_args)
        .arg("serve")
        .arg("--state-dir")
        .arg(&config.state_dir)
        .arg("--listen")
        .arg(config.listen.to_string())
        .arg("--token-stdin")
        .args(&config.extra_args)
        .env_remove(control::TOKEN_ENV)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .kill_on_drop(false);
    for name in control::DAEMON_ONLY_ENV {
        command.env_remove(name);
    }
    // SAFETY: setsid is async-signal-safe and touches no memory of ours.
    unsafe {
        command.pre_exec(|| nix::unistd::setsid().map(drop).map_err(std::io::Error::from));
    }
    let mut child = command.spawn().map_err(spawn_err)?;
    let mut stdin = child.stdin.take().expect("UNWRAP: stdin is piped");
    // One short line into an empty pipe: written at once, whatever agentctl does.
    let handed = async {
        stdin.write_all(format!("{}\n", config.token).as_bytes()).await?;
        stdin.shutdown().await
    };
    if let Err(err) = handed.await {
        let _ = child.start_kill();
        return Err(spawn_err(err));
    }
    drop(stdin);
    // A migration takes the kernel a while (an RCU grace period): it runs beside agentctl's
    // own start, off the runtime's threads, and is awaited with the ready line.
    let moving = config.cgroup.clone().zip(child.id()).map(|(dir, pid)| {
        tokio::task::spawn_blocking(move || {
            std::fs::write(dir.join("cgroup.procs"), pid.to_string()).map_err(|err| (dir, err))
        })
    });
    let stdout = child.stdout.take().expect("UNWRAP: stdout is piped");
    let mut line = String::new();
    let mut stdout = BufReader::new(stdout);
    let read = stdout.read_line(&mut line);
    match tokio::time::timeout(config.ready_timeout, read).await {
        Err(_) => {
            let _ = child.start_kill();
            return Err(LaunchError::Timeout(config.ready_timeout));
        }
        Ok(Err(_)) | Ok(Ok(0)) => return Err(LaunchError::NoReadyLine { log: log_path }),
        Ok(Ok(_)) => {}
    }
    if let Some(moving) = moving {
        match moving.await {
            Ok(Ok(())) => {}
            Ok(Err((dir, err))) => {
                tracing::warn!(cgroup = %dir.display(), %err, "cannot move agentctl into its cgroup")
            }
            Err(err) => tracing::warn!(%err, "moving agentctl into its cgroup failed"),
        }
    }
    // `child` is dropped without a kill: agentctl lives on, and tokio reaps it if it exits
    // while we are still here.
    drop(child);
    let ready: ReadyInfo = serde_json::from_str(line.trim())
        .map_err(|err| LaunchError::BadReadyLine(err.to_string()))?;
    let addr = match &config.listen {
        ControlAddr::Tcp(listen) => ControlAddr::Tcp(SocketAddr::new(listen.ip(), ready.port)),
        ControlAddr::Unix(path) => ControlAddr::Unix(path.clone()),
    };
    Ok(Launched { ready, addr })
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path)
}
