//! The frontend API: JSON-RPC 2.0 over WebSocket (jsonrpsee), the only module that knows
//! the wire format. Methods map one to one onto [`Supervisor`] operations; errors carry
//! `data.kind` ∈ `not_found, conflict, invalid_params, invalid_state, agent_unavailable,
//! runtime_unavailable, internal`.
//!
//! Access: every upgrade request passes one check — a browser `Origin` must be on the
//! allowlist (a local WebSocket server is reachable from any web page otherwise), and when
//! a token is configured (required beyond loopback) the `Authorization: Bearer` header must
//! match it.

use std::net::SocketAddr;
use std::sync::Arc;

use jsonrpsee::server::{RpcModule, Server, ServerConfig, ServerHandle};
use jsonrpsee::types::{ErrorObjectOwned, Params};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

pub use agentctl::server::AccessPolicy;
use agentctl::server::{AccessLayer, serve_subscription};

use crate::service::{ServiceError, Supervisor};

/// Method names.
pub mod method {
    /// `agents.list`
    pub const AGENTS_LIST: &str = "agents.list";
    /// `task.create`
    pub const TASK_CREATE: &str = "task.create";
    /// `task.list`
    pub const TASK_LIST: &str = "task.list";
    /// `task.get`
    pub const TASK_GET: &str = "task.get";
    /// `task.session.create`
    pub const SESSION_CREATE: &str = "task.session.create";
    /// `task.session.list`
    pub const SESSION_LIST: &str = "task.session.list";
    /// `task.session.status`
    pub const SESSION_STATUS: &str = "task.session.status";
    /// `task.session.prompt`
    pub const SESSION_PROMPT: &str = "task.session.prompt";
    /// `task.session.resume`
    pub const SESSION_RESUME: &str = "task.session.resume";
    /// `sessions.stop_all`: stop every live agent, keep the sessions resumable.
    pub const STOP_ALL: &str = "sessions.stop_all";
    /// `task.session.cancel`
    pub const SESSION_CANCEL: &str = "task.session.cancel";
    /// `task.session.stop`
    pub const SESSION_STOP: &str = "task.session.stop";
    /// `task.session.delete`
    pub const SESSION_DELETE: &str = "task.session.delete";
    /// `task.session.permission.respond`
    pub const PERMISSION_RESPOND: &str = "task.session.permission.respond";
    /// `task.session.history`
    pub const SESSION_HISTORY: &str = "task.session.history";
    /// Subscription: `task.session.subscribe`.
    pub const SESSION_SUBSCRIBE: &str = "task.session.subscribe";
    /// The subscription's notifications.
    pub const SESSION_EVENT: &str = "task.session.event";
    /// Unsubscribe.
    pub const SESSION_UNSUBSCRIBE: &str = "task.session.unsubscribe";
}

fn to_rpc(err: ServiceError) -> ErrorObjectOwned {
    let code = match &err {
        ServiceError::InvalidParams(_) => -32602,
        ServiceError::NotFound(_) => -32001,
        ServiceError::Conflict(_) => -32002,
        ServiceError::InvalidState(_) => -32003,
        ServiceError::AgentUnavailable(_) => -32004,
        ServiceError::RuntimeUnavailable(_) => -32005,
        ServiceError::Internal(_) => -32603,
    };
    ErrorObjectOwned::owned(code, err.to_string(), Some(json!({"kind": err.kind()})))
}

fn parse<T: DeserializeOwned>(params: &Params<'_>) -> Result<T, ErrorObjectOwned> {
    params.parse::<T>().map_err(|err| to_rpc(ServiceError::InvalidParams(err.message().to_owned())))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskCreate {
    title: String,
    #[serde(default)]
    description: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskId {
    task_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionCreate {
    task_id: String,
    agent_profile_id: String,
    workspace_path: String,
    #[serde(default)]
    prompt: Option<String>,
    /// `standalone` or `docker`; the profile's default when absent.
    #[serde(default)]
    runtime: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionList {
    #[serde(default)]
    task_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionId {
    session_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionPrompt {
    session_id: String,
    prompt: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PermissionRespond {
    session_id: String,
    request_id: String,
    /// The chosen option; absent means "cancelled".
    #[serde(default)]
    option_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryParams {
    session_id: String,
    #[serde(default)]
    after_seq: u64,
    #[serde(default = "default_limit")]
    limit: usize,
}

fn default_limit() -> usize {
    1000
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubscribeParams {
    session_id: String,
    #[serde(default)]
    after_seq: u64,
}

/// Builds the method table over `supervisor`.
pub fn methods(supervisor: Arc<Supervisor>) -> RpcModule<Supervisor> {
    let mut module = RpcModule::from_arc(supervisor);
    let registered = (|| -> Result<(), jsonrpsee::core::RegisterMethodError> {
        module.register_method(method::AGENTS_LIST, |_, sup, _| {
            Ok::<_, ErrorObjectOwned>(sup.agents())
        })?;
        module.register_async_method(method::TASK_CREATE, |params, sup, _| async move {
            let p: TaskCreate = parse(&params)?;
            sup.create_task(p.title, p.description).await.map_err(to_rpc)
        })?;
        module.register_async_method(method::TASK_LIST, |_, sup, _| async move {
            sup.list_tasks().await.map_err(to_rpc)
        })?;
        module.register_async_method(method::TASK_GET, |params, sup, _| async move {
            let p: TaskId = parse(&params)?;
            sup.get_task(p.task_id).await.map_err(to_rpc)
        })?;
        module.register_async_method(method::SESSION_CREATE, |params, sup, _| async move {
            let p: SessionCreate = parse(&params)?;
            sup.create_session(p.task_id, p.agent_profile_id, p.workspace_path, p.prompt, p.runtime)
                .await
                .map_err(to_rpc)
        })?;
        module.register_async_method(method::SESSION_LIST, |params, sup, _| async move {
            let p: SessionList = parse(&params)?;
            sup.list_sessions(p.task_id).await.map_err(to_rpc)
        })?;
        module.register_async_method(method::SESSION_STATUS, |params, sup, _| async move {
            let p: SessionId = parse(&params)?;
            sup.status(p.session_id).await.map_err(to_rpc)
        })?;
        module.register_async_method(method::SESSION_PROMPT, |params, sup, _| async move {
            let p: SessionPrompt = parse(&params)?;
            let turn_id = sup.prompt(p.session_id, p.prompt).await.map_err(to_rpc)?;
            Ok::<_, ErrorObjectOwned>(json!({"turn_id": turn_id}))
        })?;
        module.register_async_method(method::SESSION_RESUME, |params, sup, _| async move {
            let p: SessionId = parse(&params)?;
            sup.resume(p.session_id).await.map_err(to_rpc)
        })?;
        module.register_async_method(method::STOP_ALL, |_, sup, _| async move {
            Ok::<_, ErrorObjectOwned>(json!({"stopped": sup.stop_all().await}))
        })?;
        module.register_async_method(method::SESSION_CANCEL, |params, sup, _| async move {
            let p: SessionId = parse(&params)?;
            sup.cancel(p.session_id).await.map_err(to_rpc).map(|()| json!({}))
        })?;
        module.register_async_method(method::SESSION_STOP, |params, sup, _| async move {
            let p: SessionId = parse(&params)?;
            sup.stop(p.session_id).await.map_err(to_rpc).map(|()| json!({}))
        })?;
        module.register_async_method(method::SESSION_DELETE, |params, sup, _| async move {
            let p: SessionId = parse(&params)?;
            sup.delete(p.session_id).await.map_err(to_rpc).map(|()| json!({}))
        })?;
        module.register_async_method(method::PERMISSION_RESPOND, |params, sup, _| async move {
            let p: PermissionRespond = parse(&params)?;
            sup.respond_permission(p.session_id, p.request_id, p.option_id)
                .await
                .map_err(to_rpc)
                .map(|()| json!({}))
        })?;
        module.register_async_method(method::SESSION_HISTORY, |params, sup, _| async move {
            let p: HistoryParams = parse(&params)?;
            sup.history(p.session_id, p.after_seq, p.limit).await.map_err(to_rpc)
        })?;
        module.register_subscription(
            method::SESSION_SUBSCRIBE,
            method::SESSION_EVENT,
            method::SESSION_UNSUBSCRIBE,
            |params, pending, sup, _| async move {
                let p: SubscribeParams = match parse(&params) {
                    Ok(p) => p,
                    Err(err) => {
                        pending.reject(err).await;
                        return Ok(());
                    }
                };
                let reader = sup.subscribe(p.session_id, p.after_seq).await.map_err(to_rpc);
                serve_subscription(pending, reader).await
            },
        )?;
        Ok(())
    })();
    registered.expect("UNWRAP: method names are distinct constants");
    module
}

/// Starts the API server.
pub async fn serve(
    listen: SocketAddr,
    policy: AccessPolicy,
    supervisor: Arc<Supervisor>,
) -> std::io::Result<(SocketAddr, ServerHandle)> {
    let access = tower::ServiceBuilder::new().layer(AccessLayer::new(policy));
    let config = ServerConfig::builder()
        .max_request_body_size(32 * 1024 * 1024)
        .max_response_body_size(64 * 1024 * 1024)
        .max_connections(1024)
        .ws_only()
        .build();
    let server =
        Server::builder().set_config(config).set_http_middleware(access).build(listen).await?;
    let addr = server.local_addr()?;
    Ok((addr, server.start(methods(supervisor))))
}
