//! The control channel's server side: JSON-RPC 2.0 over WebSocket (jsonrpsee), behind a
//! bearer-token check on the HTTP upgrade.
//!
//! The methods are the [`ControlServer`] trait (defined once in `protocol::control`); each
//! maps to the [`AgentHost`] or the [`Spool`]. Errors carry `data.kind` from
//! `protocol::errors::ErrorKind`, so clients never match on message text.

use crate::client::ControlAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use std::collections::BTreeMap;
use std::path::PathBuf;

use jsonrpsee::PendingSubscriptionSink;
use jsonrpsee::core::{RpcResult, SubscriptionResult};
use jsonrpsee::server::{
    HttpBody, HttpRequest, HttpResponse, RpcModule, Server, ServerConfig, ServerHandle,
};
use jsonrpsee::types::ErrorObjectOwned;
use protocol::api::Done;
use protocol::control::{Acked, AgentStarted, ControlServer, StartAgent, Status, Stopped};
use protocol::errors::{ErrorKind, error_object};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::agent::{AgentError, AgentHost};
use crate::spool::{Spool, SpoolError};

/// The largest control message, either way: room for a 16 MiB ACP line plus framing.
pub const MAX_MESSAGE_BYTES: u32 = 64 * 1024 * 1024;

/// What the methods share.
#[derive(Debug)]
pub struct Ctl {
    /// The event spool.
    pub spool: Arc<Spool>,
    /// The agent.
    pub agent: AgentHost,
    /// Cancelled by `shutdown`; `main` then stops the agent and exits.
    pub shutdown: CancellationToken,
}

fn error(kind: ErrorKind, message: impl std::fmt::Display) -> ErrorObjectOwned {
    error_object(kind, message.to_string())
}

impl From<AgentError> for ErrorObjectOwned {
    fn from(err: AgentError) -> ErrorObjectOwned {
        match &err {
            AgentError::AlreadyStarted => error(ErrorKind::AlreadyStarted, err),
            AgentError::NotStarted => error(ErrorKind::NotStarted, err),
            AgentError::NotRunning => error(ErrorKind::NotRunning, err),
            AgentError::InvalidMessage(_) | AgentError::Root { .. } | AgentError::User { .. } => {
                error(ErrorKind::InvalidParams, err)
            }
            AgentError::Spawn { .. } | AgentError::Egress { .. } => {
                error(ErrorKind::SpawnFailed, err)
            }
            AgentError::Spool(spool) => spool_error(spool),
        }
    }
}

fn spool_error(err: &SpoolError) -> ErrorObjectOwned {
    match err {
        SpoolError::Pruned { .. } => error(ErrorKind::Pruned, err),
        _ => error(ErrorKind::Internal, err),
    }
}

/// The [`ControlServer`] side of agentctl, over what the methods share.
struct Methods(Arc<Ctl>);

#[jsonrpsee::core::async_trait]
impl ControlServer for Methods {
    async fn status(&self) -> RpcResult<Status> {
        Ok(self.0.agent.status())
    }

    async fn agent_start(
        &self,
        command: String,
        args: Option<Vec<String>>,
        env: Option<BTreeMap<String, String>>,
        cwd: PathBuf,
        extra_roots: Option<Vec<PathBuf>>,
        user: Option<String>,
        owned_dirs: Option<Vec<PathBuf>>,
        egress: Option<protocol::control::Egress>,
        isolate_network: Option<bool>,
    ) -> RpcResult<AgentStarted> {
        let start = StartAgent {
            command,
            args: args.unwrap_or_default(),
            env: env.unwrap_or_default(),
            cwd,
            extra_roots: extra_roots.unwrap_or_default(),
            user,
            owned_dirs: owned_dirs.unwrap_or_default(),
            egress,
            isolate_network: isolate_network.unwrap_or(false),
        };
        let (pid, seq) = self.0.agent.start(start).await?;
        Ok(AgentStarted { pid, seq })
    }

    async fn acp_send(&self, message: Value) -> RpcResult<Done> {
        self.0.agent.send(&message)?;
        Ok(Done {})
    }

    async fn events_ack(&self, seq: u64) -> RpcResult<Acked> {
        let acked_seq = self.0.spool.ack(seq);
        Ok(Acked { acked_seq })
    }

    async fn agent_stop(&self, grace_ms: u64) -> RpcResult<Stopped> {
        Ok(self.0.agent.stop(Duration::from_millis(grace_ms)).await?)
    }

    async fn intake_hold(&self, hold: bool) -> RpcResult<Done> {
        self.0.agent.hold_intake(hold);
        Ok(Done {})
    }

    async fn workspace_bind(
        &self,
        cwd: PathBuf,
        extra_roots: Option<Vec<PathBuf>>,
    ) -> RpcResult<Done> {
        self.0.agent.bind_workspace(&cwd, &extra_roots.unwrap_or_default())?;
        Ok(Done {})
    }

    async fn shutdown(&self) -> RpcResult<Done> {
        self.0.shutdown.cancel();
        Ok(Done {})
    }

    async fn events_subscribe(
        &self,
        pending: PendingSubscriptionSink,
        after_seq: u64,
    ) -> SubscriptionResult {
        self.subscribe(pending, after_seq, false).await
    }

    async fn events_subscribe_batch(
        &self,
        pending: PendingSubscriptionSink,
        after_seq: u64,
    ) -> SubscriptionResult {
        self.subscribe(pending, after_seq, true).await
    }
}

impl Methods {
    /// Accepts a subscription after `after_seq` and streams it (see [`stream_events`]),
    /// or rejects it when those events were dropped.
    async fn subscribe(
        &self,
        pending: PendingSubscriptionSink,
        after_seq: u64,
        batched: bool,
    ) -> SubscriptionResult {
        match self.0.spool.reader(after_seq) {
            Ok(reader) => {
                let sink = pending.accept().await?;
                let watches = (self.0.spool.watch_stalled(), self.0.spool.watch_backlog_full());
                stream_events(sink, reader, watches, batched).await
            }
            Err(err) => {
                pending.reject(spool_error(&err)).await;
                Ok(())
            }
        }
    }
}

/// Builds the method table.
pub fn methods(ctl: Arc<Ctl>) -> RpcModule<()> {
    let mut module = RpcModule::new(());
    module.merge(Methods(ctl).into_rpc()).expect("UNWRAP: one set of distinct methods");
    module
}

/// Starts the server on `listen` with the bearer `token`, over TLS when `tls` is given
/// (`wss://`; see [`crate::tls`]). Returns the bound address and the handle that stops it.
pub async fn serve(
    listen: ControlAddr,
    token: &str,
    ctl: Arc<Ctl>,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> std::io::Result<(ControlAddr, ServerHandle)> {
    let gate = TokenGate { token: token.to_owned() };
    let auth = tower::ServiceBuilder::new().layer(AccessLayer::new(gate));
    let config = ServerConfig::builder()
        .max_request_body_size(MAX_MESSAGE_BYTES)
        .max_response_body_size(MAX_MESSAGE_BYTES)
        // Params are checked per call (`CheckParams`), and a batch would go around that.
        .set_batch_request_config(jsonrpsee::server::BatchRequestConfig::Disabled)
        .ws_only()
        .build();
    let builder = Server::builder()
        .set_config(config)
        .set_http_middleware(auth)
        .set_rpc_middleware(jsonrpsee::server::middleware::rpc::RpcServiceBuilder::new().layer_fn(
            |service| protocol::errors::CheckParams::new(service, protocol::control::params::check),
        ));
    let listener = match (listen, tls) {
        (ControlAddr::Tcp(listen), None) => {
            let server = builder.build(listen).await?;
            let addr = server.local_addr()?;
            return Ok((ControlAddr::Tcp(addr), server.start(methods(ctl))));
        }
        (ControlAddr::Tcp(listen), Some(tls)) => Listener::Tls(
            tokio::net::TcpListener::bind(listen).await?,
            tokio_rustls::TlsAcceptor::from(tls),
        ),
        (ControlAddr::Unix(path), _) => {
            // In the 0700 state dir, 0600 itself: only agentctl's user can dial it. A
            // socket left by an earlier agentctl of this dir (fenced before this one was
            // launched) is replaced.
            match std::fs::remove_file(&path) {
                Err(err) if err.kind() != std::io::ErrorKind::NotFound => return Err(err),
                _ => {}
            }
            let listener = tokio::net::UnixListener::bind(&path)?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            Listener::Unix(listener, path)
        }
    };
    // Accept (and for TLS handshake), then serve each connection with the same stack.
    let addr = listener.addr()?;
    let services = builder.to_service_builder();
    let methods: jsonrpsee::Methods = methods(ctl).into();
    let (stop_handle, server_handle) = jsonrpsee::server::stop_channel();
    tokio::spawn(async move {
        loop {
            let opening = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(opening) => opening,
                    Err(err) => {
                        tracing::warn!(%err, "cannot accept a control connection");
                        continue;
                    }
                },
                () = stop_handle.clone().shutdown() => return,
            };
            let service = services.clone().build(methods.clone(), stop_handle.clone());
            let stopped = stop_handle.clone().shutdown();
            tokio::spawn(async move {
                let stream = match opening.await {
                    Ok(stream) => stream,
                    Err(err) => return tracing::warn!(%err, "a control connection failed to open"),
                };
                let served =
                    jsonrpsee::server::serve_with_graceful_shutdown(stream, service, stopped);
                if let Err(err) = served.await {
                    tracing::debug!(%err, "a control connection ended");
                }
            });
        }
    });
    Ok((addr, server_handle))
}

/// A connection's byte stream, whatever carries it.
trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// An accepted connection still to be opened (a TLS handshake, bounded).
type Opening = Pin<Box<dyn Future<Output = std::io::Result<Box<dyn Stream>>> + Send>>;

/// What the control server accepts on besides plain TCP, which jsonrpsee's own loop serves.
enum Listener {
    Tls(tokio::net::TcpListener, tokio_rustls::TlsAcceptor),
    Unix(tokio::net::UnixListener, std::path::PathBuf),
}

impl Listener {
    fn addr(&self) -> std::io::Result<ControlAddr> {
        match self {
            Listener::Tls(listener, _) => listener.local_addr().map(ControlAddr::Tcp),
            Listener::Unix(_, path) => Ok(ControlAddr::Unix(path.clone())),
        }
    }

    async fn accept(&self) -> std::io::Result<Opening> {
        Ok(match self {
            Listener::Unix(listener, _) => {
                let (socket, _) = listener.accept().await?;
                Box::pin(async move { Ok(Box::new(socket) as Box<dyn Stream>) })
            }
            Listener::Tls(listener, acceptor) => {
                let (socket, _) = listener.accept().await?;
                let handshake = acceptor.accept(socket);
                Box::pin(async move {
                    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, handshake).await {
                        Ok(stream) => Ok(Box::new(stream?) as Box<dyn Stream>),
                        Err(_) => Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "the TLS handshake timed out",
                        )),
                    }
                })
            }
        })
    }
}

/// How long a client may take to complete its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A check every request (and so every WebSocket upgrade) passes before it is served:
/// agentctl's is its bearer token ([`TokenGate`]); the supervisor's API has its own policy.
pub trait Gate: Send + Sync + 'static {
    /// Why a request is refused (its status and a short reason), if it is.
    fn refuse(&self, headers: &http::HeaderMap) -> Option<(http::StatusCode, &'static str)>;

    /// Like [`Gate::refuse`], for a gate that marks what it lets through (in its
    /// extensions) or says more about a refusal.
    fn admit(
        &self,
        headers: &http::HeaderMap,
        _extensions: &mut http::Extensions,
    ) -> Result<(), (http::StatusCode, String)> {
        match self.refuse(headers) {
            Some((status, why)) => Err((status, why.to_owned())),
            None => Ok(()),
        }
    }
}

/// Whether `headers` carry `Authorization: Bearer <token>`, compared in constant time.
pub fn bearer_matches(headers: &http::HeaderMap, token: &str) -> bool {
    let expected = format!("Bearer {token}");
    let presented = headers.get(http::header::AUTHORIZATION).map(|value| value.as_bytes());
    presented.is_some_and(|presented| constant_time_eq(presented, expected.as_bytes()))
}

/// agentctl's gate: its bearer token on every request.
#[derive(Debug, Clone)]
pub struct TokenGate {
    /// The token.
    pub token: String,
}

impl Gate for TokenGate {
    fn refuse(&self, headers: &http::HeaderMap) -> Option<(http::StatusCode, &'static str)> {
        (!bearer_matches(headers, &self.token))
            .then_some((http::StatusCode::UNAUTHORIZED, "missing or wrong bearer token"))
    }
}

/// HTTP middleware that applies a [`Gate`] to every request, and so to every WebSocket
/// upgrade, answering refusals with their status and no detail.
#[derive(Clone)]
pub struct AccessLayer {
    policy: Arc<dyn Gate>,
}

impl AccessLayer {
    /// A layer enforcing `gate`.
    pub fn new(gate: impl Gate) -> AccessLayer {
        AccessLayer { policy: Arc::new(gate) }
    }
}

impl<S> tower::Layer<S> for AccessLayer {
    type Service = Access<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Access { inner, policy: Arc::clone(&self.policy) }
    }
}

/// The service made by [`AccessLayer`].
#[derive(Clone)]
pub struct Access<S> {
    inner: S,
    policy: Arc<dyn Gate>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

impl<S, B> tower::Service<HttpRequest<B>> for Access<S>
where
    S: tower::Service<HttpRequest<B>, Response = HttpResponse>,
    S::Error: Into<BoxError> + 'static,
    S::Future: Send + 'static,
{
    type Response = HttpResponse;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<HttpResponse, BoxError>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: HttpRequest<B>) -> Self::Future {
        let (mut parts, body) = request.into_parts();
        let admitted = self.policy.admit(&parts.headers, &mut parts.extensions);
        let request = HttpRequest::from_parts(parts, body);
        match admitted {
            Ok(()) => {
                let future = self.inner.call(request);
                Box::pin(async move { future.await.map_err(Into::into) })
            }
            Err((status, why)) => Box::pin(async move {
                Ok(http::Response::builder()
                    .status(status)
                    .header(http::header::CONNECTION, "close")
                    .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
                    .body(HttpBody::from(why))
                    .expect("UNWRAP: a static response is well formed"))
            }),
        }
    }
}

/// agentctl's event subscription: the spool's events, and, outside the sequence (seq 0),
/// a notice whenever the spool starts or stops failing, so the supervisor can say why the
/// agent's output is held although nothing can be spooled. `batched`
/// (`events.subscribe_batch`): each notification is an array of the events ready at once
/// (a stall notice goes alone).
async fn stream_events(
    sink: jsonrpsee::SubscriptionSink,
    mut reader: crate::spool::SpoolReader<protocol::control::Event>,
    (mut stalled, mut backlog_full): (
        tokio::sync::watch::Receiver<Option<String>>,
        tokio::sync::watch::Receiver<bool>,
    ),
    batched: bool,
) -> Result<(), jsonrpsee::core::SubscriptionError> {
    use protocol::control::{MAX_BATCH_BYTES, MAX_BATCH_EVENTS};
    // A stall that began before this subscription is announced first.
    if stalled.borrow().is_some() {
        stalled.mark_changed();
    }
    loop {
        let message = tokio::select! {
            biased;
            _ = sink.closed() => return Ok(()),
            changed = stalled.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                let reason = stalled.borrow_and_update().clone();
                let kind = protocol::control::EventKind::IntakeStalled { reason };
                out_of_sequence(kind, batched).map_err(|err| err.to_string())?
            }
            changed = backlog_full.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                if !*backlog_full.borrow_and_update() {
                    continue;
                }
                let kind = protocol::control::EventKind::BacklogFull;
                out_of_sequence(kind, batched).map_err(|err| err.to_string())?
            }
            entry = async {
                if batched {
                    reader.next_raw_batch(MAX_BATCH_EVENTS, MAX_BATCH_BYTES).await
                } else {
                    reader.next_raw().await
                }
            } => entry.map_err(|err| err.to_string())?,
        };
        // Damaged lines skipped on the way are said first, outside the sequence.
        for message in reader.take_damaged() {
            let kind = protocol::control::EventKind::Error { message };
            let notice = out_of_sequence(kind, batched).map_err(|err| err.to_string())?;
            if sink.send(notice).await.is_err() {
                return Ok(());
            }
        }
        if sink.send(message).await.is_err() {
            return Ok(());
        }
    }
}

/// An event outside the sequence (seq 0: nothing to acknowledge), as one notification
/// of the stream (`batched`: an array of it).
fn out_of_sequence(
    kind: protocol::control::EventKind,
    batched: bool,
) -> Result<Box<serde_json::value::RawValue>, serde_json::Error> {
    let event = protocol::control::Event { seq: 0, at: 0, kind };
    if batched {
        serde_json::value::to_raw_value(&[event])
    } else {
        serde_json::value::to_raw_value(&event)
    }
}

/// Compares without an early exit, so timing does not reveal how much of a guess matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_gate_wants_the_exact_bearer_token() {
        let gate = TokenGate { token: "t".into() };
        let mut headers = http::HeaderMap::new();
        assert_eq!(gate.refuse(&headers).map(|r| r.0), Some(http::StatusCode::UNAUTHORIZED));
        headers.insert(http::header::AUTHORIZATION, "Bearer t".parse().unwrap());
        assert_eq!(gate.refuse(&headers), None);
        headers.insert(http::header::AUTHORIZATION, "Bearer x".parse().unwrap());
        assert_eq!(gate.refuse(&headers).map(|r| r.0), Some(http::StatusCode::UNAUTHORIZED));
    }

    #[test]
    fn token_comparison_is_exact() {
        assert!(constant_time_eq(b"Bearer abc", b"Bearer abc"));
        assert!(!constant_time_eq(b"Bearer abd", b"Bearer abc"));
        assert!(!constant_time_eq(b"Bearer ab", b"Bearer abc"));
    }
}
