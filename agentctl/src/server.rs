//! The control channel's server side: JSON-RPC 2.0 over WebSocket (jsonrpsee), behind a
//! bearer-token check on the HTTP upgrade.
//!
//! Every method maps to the [`AgentHost`] or the [`Spool`]; errors become JSON-RPC errors
//! whose `data.kind` names the case (`invalid_params`, `already_started`, `not_started`,
//! `not_running`, `pruned`, `internal`), so clients never match on message text.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use jsonrpsee::server::{
    HttpBody, HttpRequest, HttpResponse, RpcModule, Server, ServerConfig, ServerHandle,
};
use jsonrpsee::types::{ErrorObjectOwned, Params};
use protocol::control::{Ack, AcpSend, AgentStarted, StartAgent, Stop, Subscribe, method};
use serde_json::json;
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

/// Error kinds in `data.kind`.
fn error(code: i32, kind: &str, message: impl std::fmt::Display) -> ErrorObjectOwned {
    ErrorObjectOwned::owned(code, message.to_string(), Some(json!({"kind": kind})))
}

fn invalid_params(message: impl std::fmt::Display) -> ErrorObjectOwned {
    error(-32602, "invalid_params", message)
}

impl From<AgentError> for ErrorObjectOwned {
    fn from(err: AgentError) -> ErrorObjectOwned {
        match &err {
            AgentError::AlreadyStarted => error(-32010, "already_started", err),
            AgentError::NotStarted => error(-32011, "not_started", err),
            AgentError::NotRunning => error(-32012, "not_running", err),
            AgentError::InvalidMessage(_) | AgentError::Root { .. } => invalid_params(err),
            AgentError::Spawn { .. } => error(-32014, "spawn_failed", err),
            AgentError::Spool(spool) => spool_error(spool),
        }
    }
}

fn spool_error(err: &SpoolError) -> ErrorObjectOwned {
    match err {
        SpoolError::Pruned { .. } => error(-32013, "pruned", err),
        _ => error(-32603, "internal", err),
    }
}

fn parse<T: serde::de::DeserializeOwned>(params: &Params<'_>) -> Result<T, ErrorObjectOwned> {
    params.parse::<T>().map_err(|err| invalid_params(err.message()))
}

/// Builds the method table.
pub fn methods(ctl: Arc<Ctl>) -> RpcModule<Ctl> {
    let mut module = RpcModule::from_arc(ctl);
    let registered = (|| -> Result<(), jsonrpsee::core::RegisterMethodError> {
        module.register_method(method::STATUS, |_, ctl, _| {
            Ok::<_, ErrorObjectOwned>(ctl.agent.status())
        })?;
        module.register_async_method(method::AGENT_START, |params, ctl, _| async move {
            let start: StartAgent = parse(&params)?;
            let (pid, seq) = ctl.agent.start(start).await?;
            Ok::<_, ErrorObjectOwned>(AgentStarted { pid, seq })
        })?;
        module.register_method(method::ACP_SEND, |params, ctl, _| {
            let send: AcpSend = parse(&params)?;
            ctl.agent.send(&send.message)?;
            Ok::<_, ErrorObjectOwned>(json!({}))
        })?;
        module.register_method(method::EVENTS_ACK, |params, ctl, _| {
            let ack: Ack = parse(&params)?;
            let acked = ctl.spool.ack(ack.seq).map_err(|err| spool_error(&err))?;
            Ok::<_, ErrorObjectOwned>(json!({"acked_seq": acked}))
        })?;
        module.register_async_method(method::AGENT_STOP, |params, ctl, _| async move {
            let stop: Stop = parse(&params)?;
            Ok::<_, ErrorObjectOwned>(ctl.agent.stop(Duration::from_millis(stop.grace_ms)).await?)
        })?;
        module.register_method(method::SHUTDOWN, |_, ctl, _| {
            ctl.shutdown.cancel();
            json!({})
        })?;
        module.register_subscription(
            method::EVENTS_SUBSCRIBE,
            method::EVENTS_NOTIFICATION,
            method::EVENTS_UNSUBSCRIBE,
            |params, pending, ctl, _| async move {
                let subscribe: Subscribe = match parse(&params) {
                    Ok(subscribe) => subscribe,
                    Err(err) => {
                        pending.reject(err).await;
                        return Ok(());
                    }
                };
                let mut reader = match ctl.spool.reader(subscribe.after_seq) {
                    Ok(reader) => reader,
                    Err(err) => {
                        pending.reject(spool_error(&err)).await;
                        return Ok(());
                    }
                };
                let sink = pending.accept().await.map_err(|err| err.to_string())?;
                loop {
                    let event = tokio::select! {
                        biased;
                        _ = sink.closed() => return Ok(()),
                        event = reader.next() => event.map_err(|err| err.to_string())?,
                    };
                    let message =
                        serde_json::value::to_raw_value(&event).map_err(|err| err.to_string())?;
                    if sink.send(message).await.is_err() {
                        // The connection is gone; the client resumes from its last seq.
                        return Ok(());
                    }
                }
            },
        )?;
        Ok(())
    })();
    registered.expect("UNWRAP: method names are distinct constants");
    module
}

/// Starts the server on `listen` with the bearer `token`. Returns the bound address and the
/// handle that stops it.
pub async fn serve(
    listen: SocketAddr,
    token: &str,
    ctl: Arc<Ctl>,
) -> std::io::Result<(SocketAddr, ServerHandle)> {
    let auth = tower::ServiceBuilder::new().layer(BearerAuthLayer::new(token));
    let config = ServerConfig::builder()
        .max_request_body_size(MAX_MESSAGE_BYTES)
        .max_response_body_size(MAX_MESSAGE_BYTES)
        .ws_only()
        .build();
    let server =
        Server::builder().set_config(config).set_http_middleware(auth).build(listen).await?;
    let addr = server.local_addr()?;
    Ok((addr, server.start(methods(ctl))))
}

/// Refuses any HTTP request (and so any WebSocket upgrade) without the exact
/// `Authorization: Bearer <token>` header, with 401 and no detail. Also used by the
/// supervisor's API when it listens beyond loopback.
#[derive(Debug, Clone)]
pub struct BearerAuthLayer {
    expected: Arc<str>,
}

impl BearerAuthLayer {
    /// A layer that accepts exactly `token`.
    pub fn new(token: &str) -> BearerAuthLayer {
        BearerAuthLayer { expected: Arc::from(format!("Bearer {token}")) }
    }
}

impl<S> tower::Layer<S> for BearerAuthLayer {
    type Service = BearerAuth<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BearerAuth { inner, expected: Arc::clone(&self.expected) }
    }
}

/// The service made by [`BearerAuthLayer`].
#[derive(Debug, Clone)]
pub struct BearerAuth<S> {
    inner: S,
    expected: Arc<str>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

impl<S, B> tower::Service<HttpRequest<B>> for BearerAuth<S>
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
        let presented =
            request.headers().get(http::header::AUTHORIZATION).map(|value| value.as_bytes());
        if presented.is_some_and(|presented| constant_time_eq(presented, self.expected.as_bytes()))
        {
            let future = self.inner.call(request);
            return Box::pin(async move { future.await.map_err(Into::into) });
        }
        Box::pin(async {
            let response = http::Response::builder()
                .status(http::StatusCode::UNAUTHORIZED)
                .body(HttpBody::from("missing or wrong bearer token"))
                .expect("UNWRAP: a static response is well formed");
            Ok(response)
        })
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
    fn token_comparison_is_exact() {
        assert!(constant_time_eq(b"Bearer abc", b"Bearer abc"));
        assert!(!constant_time_eq(b"Bearer abd", b"Bearer abc"));
        assert!(!constant_time_eq(b"Bearer ab", b"Bearer abc"));
    }
}
