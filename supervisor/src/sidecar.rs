//! The seam between the daemon and a sidecar, below the session actor and the warm pool
//! that both reach sidecars: [`Control`] (the calls) and [`Connector`] (reaching a sidecar:
//! its calls and its event stream after a seq), the [`Resolver`] of agent programs, and
//! the params of our ACP `initialize`. The daemon uses the WebSocket implementations over
//! `agentctl::client`; the actor's unit tests use in-memory fakes, so its state machine is
//! tested without processes.

pub use agentctl::client::ControlAddr;
use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use agentctl::client::{ClientError, ControlClient};
use protocol::control::{AgentStarted, Event, StartAgent, Status, Stopped};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::runtime::BoxFuture;

/// Resolves a program name to the argv prefix that runs it (`None`: it is not available).
pub type Resolver = Arc<dyn Fn(&str) -> Option<Vec<OsString>> + Send + Sync>;

/// The params of our `initialize` (a session's agent's, and a warm agent's); `fs/*`
/// offered unless the profile says not (`session.client_fs`).
pub fn initialize_params(profile: &agents::profile::Profile) -> Value {
    let fs = profile.session.client_fs;
    serde_json::json!({
        "protocolVersion": protocol::acp::PROTOCOL_VERSION,
        "clientCapabilities": {"fs": {"readTextFile": fs, "writeTextFile": fs}, "terminal": false,
            "elicitation": {"form": {}, "url": {}}},
        "clientInfo": {"name": "tether", "title": "Tether", "version": env!("CARGO_PKG_VERSION")},
    })
}

/// The control calls the actor makes on one sidecar. Every call is bounded in time by its
/// implementation; an error means the sidecar is lost.
pub trait Control: Send + Sync + 'static {
    /// `acp.send`: one JSON-RPC message to the agent.
    fn send_acp<'a>(&'a self, message: &'a Value) -> BoxFuture<'a, Result<(), ClientError>>;
    /// `events.ack`.
    fn ack(&self, seq: u64) -> BoxFuture<'_, Result<u64, ClientError>>;
    /// `agent.start`.
    fn start_agent<'a>(
        &'a self,
        start: &'a StartAgent,
    ) -> BoxFuture<'a, Result<AgentStarted, ClientError>>;
    /// `agent.stop`.
    fn stop_agent(&self, grace: Duration) -> BoxFuture<'_, Result<Stopped, ClientError>>;
    /// `shutdown`.
    fn shutdown(&self) -> BoxFuture<'_, Result<(), ClientError>>;
    /// `status`.
    fn status(&self) -> BoxFuture<'_, Result<Status, ClientError>>;
    /// `intake.hold`: hold the agent's output, or take it in again (a sidecar that cannot
    /// hold takes it in as before).
    fn hold_intake(&self, _hold: bool) -> BoxFuture<'_, Result<(), ClientError>> {
        Box::pin(async { Ok(()) })
    }
    /// `workspace.bind`: the agent's `fs/*` requests reach `cwd` (a warm agent's session).
    fn bind_workspace<'a>(
        &'a self,
        _cwd: &'a std::path::Path,
    ) -> BoxFuture<'a, Result<(), ClientError>> {
        Box::pin(async { Ok(()) })
    }
}

/// One item of an event stream. Boxed: the channel's buffer is allocated in slots of its
/// item's size, for as long as the session lives.
pub type EventItem = Result<Box<Event>, Box<ClientError>>;

/// agentctl's events, in order, each once (an error ends the stream).
pub type EventsRx = mpsc::Receiver<EventItem>;

/// A connected sidecar: its calls and its event stream.
pub type Connection = (Arc<dyn Control>, EventsRx);

/// Reaches sidecars.
pub trait Connector: Send + Sync + 'static {
    /// Connects to the sidecar at `addr` with its token (over TLS pinned to `cert`, a PEM
    /// certificate, when there is one): its calls, and its events after `after_seq`.
    fn connect<'a>(
        &'a self,
        addr: ControlAddr,
        token: &'a str,
        cert: Option<&'a str>,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Connection, ClientError>>;
}

impl Control for ControlClient {
    fn send_acp<'a>(&'a self, message: &'a Value) -> BoxFuture<'a, Result<(), ClientError>> {
        Box::pin(ControlClient::send_acp(self, message))
    }

    fn ack(&self, seq: u64) -> BoxFuture<'_, Result<u64, ClientError>> {
        Box::pin(ControlClient::ack(self, seq))
    }

    fn start_agent<'a>(
        &'a self,
        start: &'a StartAgent,
    ) -> BoxFuture<'a, Result<AgentStarted, ClientError>> {
        Box::pin(ControlClient::start_agent(self, start))
    }

    fn stop_agent(&self, grace: Duration) -> BoxFuture<'_, Result<Stopped, ClientError>> {
        Box::pin(ControlClient::stop_agent(self, grace))
    }

    fn shutdown(&self) -> BoxFuture<'_, Result<(), ClientError>> {
        Box::pin(ControlClient::shutdown(self))
    }

    fn status(&self) -> BoxFuture<'_, Result<Status, ClientError>> {
        Box::pin(ControlClient::status(self))
    }

    fn hold_intake(&self, hold: bool) -> BoxFuture<'_, Result<(), ClientError>> {
        Box::pin(ControlClient::hold_intake(self, hold))
    }

    fn bind_workspace<'a>(
        &'a self,
        cwd: &'a std::path::Path,
    ) -> BoxFuture<'a, Result<(), ClientError>> {
        Box::pin(ControlClient::bind_workspace(self, cwd, &[]))
    }
}

/// The control channel over WebSocket: one connection per session for calls and the event
/// stream.
#[derive(Debug, Clone, Copy, Default)]
pub struct WsConnector;

impl Connector for WsConnector {
    fn connect<'a>(
        &'a self,
        addr: ControlAddr,
        token: &'a str,
        cert: Option<&'a str>,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Connection, ClientError>> {
        Box::pin(async move {
            // One connection per session: calls and the event stream share it (events come
            // in batches, so a burst is a few frames ahead of a call's answer, not thousands).
            let capacity = agentctl::client::BATCH_SUBSCRIPTION_CAPACITY;
            let pinned = cert.map(|pem| std::sync::Arc::from(pem.as_bytes()));
            let calls = ControlClient::connect_pinned(addr, token, capacity, pinned).await?;
            let mut stream = calls.clone().events(after_seq);
            let (events_tx, events_rx) = mpsc::channel(1024);
            tokio::spawn(async move {
                loop {
                    let next = tokio::select! {
                        next = stream.next() => next,
                        () = events_tx.closed() => return,
                    };
                    let next = next.map(Box::new).map_err(Box::new);
                    let failed = next.is_err();
                    if events_tx.send(next).await.is_err() || failed {
                        return;
                    }
                }
            });
            Ok((Arc::new(calls) as Arc<dyn Control>, events_rx))
        })
    }
}

#[cfg(test)]
pub(crate) mod fake;
