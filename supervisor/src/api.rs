//! The frontend API's server: the [`ApiServer`] trait (defined once in `protocol::api`)
//! over [`Supervisor`] operations, JSON-RPC 2.0 over WebSocket (jsonrpsee). Each call's
//! params are checked against `protocol::api::params` first; errors carry `data.kind`
//! from `protocol::errors::ErrorKind` (and `data.field` for a bad param).
//!
//! Access: every upgrade request passes one check — a browser `Origin` must be on the
//! allowlist (a local WebSocket server is reachable from any web page otherwise), and when
//! a token is configured (required beyond loopback) the `Authorization: Bearer` header must
//! match it.

use std::net::SocketAddr;
use std::sync::Arc;

use jsonrpsee::PendingSubscriptionSink;
use jsonrpsee::core::middleware::RpcServiceBuilder;
use jsonrpsee::core::{RpcResult, SubscriptionResult};
use jsonrpsee::server::{BatchRequestConfig, RpcModule, Server, ServerConfig, ServerHandle};

use crate::ids::WorkflowId;
use jsonrpsee::types::ErrorObjectOwned;
use protocol::api::{
    AgentInfo, ApiServer, CleanupResult, Done, ErrorData, HistoryEntry, PauseResult, PromptQueue,
    PromptStarted, ResumeResult, RuntimeKind, SessionState, SessionStatus, SessionSummary,
    Snapshot, SnapshotSummary, Steered, StopAllResult, Task, TaskDetail, Timeline, WorkflowStarted,
    WorkflowStatus, WorkflowSummary, params,
};
use protocol::errors::CheckParams;
use serde_json::Value;

mod access;
pub mod admission;
mod streaming;

pub use access::{
    AccessPolicy, ApiToken, MIN_TOKEN_CHARS, TOKEN_ENV, TokenError, TokenSource, resolve_token,
};
use admission::{Admission, Limits, SlotGate};
pub use admission::{MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER};
use agentctl::server::AccessLayer;
use streaming::{
    stream_session_list, stream_spool, stream_spool_batches, stream_workflow, stream_workflow_list,
};

use crate::service::{CleanupPolicy, NewSession, NewWorkflow, ServiceError, Supervisor};
use crate::session::{Prompted, QueueChange};

fn to_rpc(err: ServiceError) -> ErrorObjectOwned {
    let field = match &err {
        ServiceError::InvalidParams { field, .. } => Some((*field).to_owned()),
        _ => None,
    };
    ErrorData { kind: err.kind(), field, limit: None }.into_error(err.to_string())
}

/// The [`ApiServer`] side of the frontend API, over the supervisor.
struct Methods(Arc<Supervisor>);

impl Methods {
    /// Opens a reader of the session's event log and accepts the subscription, or rejects
    /// it with the reason (`None`: rejected, nothing more to do).
    async fn accept(
        &self,
        pending: PendingSubscriptionSink,
        session_id: String,
        after_seq: Option<u64>,
    ) -> Result<
        Option<(
            jsonrpsee::SubscriptionSink,
            agentctl::spool::SpoolReader<crate::events::SessionEvent>,
        )>,
        jsonrpsee::core::SubscriptionError,
    > {
        match self.0.subscribe(session_id.into(), after_seq.unwrap_or(0)).await {
            Ok(reader) => Ok(Some((pending.accept().await?, reader))),
            Err(err) => {
                pending.reject(to_rpc(err)).await;
                Ok(None)
            }
        }
    }
}

#[jsonrpsee::core::async_trait]
impl ApiServer for Methods {
    async fn agents_list(&self) -> RpcResult<Vec<AgentInfo>> {
        Ok(self.0.agents())
    }

    async fn task_create(&self, title: String, description: Option<String>) -> RpcResult<Task> {
        let task = self.0.create_task(title, description.unwrap_or_default()).await;
        task.map(Into::into).map_err(to_rpc)
    }

    async fn task_list(&self) -> RpcResult<Vec<Task>> {
        let tasks = self.0.list_tasks().await.map_err(to_rpc)?;
        Ok(tasks.into_iter().map(Into::into).collect())
    }

    async fn task_get(&self, task_id: String) -> RpcResult<TaskDetail> {
        self.0.get_task(task_id).await.map_err(to_rpc)
    }

    async fn task_delete(
        &self,
        task_id: String,
        force: Option<bool>,
        delete_branch: Option<bool>,
    ) -> RpcResult<Done> {
        let (force, delete_branch) = (force.unwrap_or(false), delete_branch.unwrap_or(false));
        self.0.delete_task(task_id, force, delete_branch).await.map_err(to_rpc).map(|()| Done {})
    }

    async fn session_create(
        &self,
        task_id: String,
        agent_profile_id: String,
        workspace_path: Option<String>,
        prompt: Option<String>,
        runtime: Option<RuntimeKind>,
        shared: Option<bool>,
        worktree: Option<bool>,
        base: Option<String>,
        labels: Option<std::collections::BTreeMap<String, String>>,
        mcp_servers: Option<Vec<serde_json::Value>>,
        session_id: Option<String>,
        additional_directories: Option<Vec<String>>,
    ) -> RpcResult<SessionSummary> {
        let new = NewSession {
            session_id: session_id.map(Into::into),
            additional_directories: additional_directories.unwrap_or_default(),
            mcp_servers: mcp_servers.unwrap_or_default(),
            task_id,
            agent_profile_id,
            workspace_path,
            prompt,
            runtime: runtime.map(|kind| kind.as_str().to_owned()),
            shared: shared.unwrap_or(false),
            worktree,
            base,
            labels: labels.unwrap_or_default(),
            workflow_step: None,
        };
        let row = self.0.create_session(new).await.map_err(to_rpc)?;
        Ok(row.into())
    }

    async fn session_list(
        &self,
        task_id: Option<String>,
        state: Option<SessionState>,
        agent_profile_id: Option<String>,
    ) -> RpcResult<Vec<SessionSummary>> {
        self.0.list_sessions(task_id, state, agent_profile_id).await.map_err(to_rpc)
    }

    async fn session_status(&self, session_id: String) -> RpcResult<SessionStatus> {
        self.0.status(session_id.into()).await.map_err(to_rpc)
    }

    async fn session_prompt(&self, session_id: String, prompt: String) -> RpcResult<PromptStarted> {
        let prompted = self.0.prompt(session_id.into(), prompt).await.map_err(to_rpc)?;
        Ok(match prompted {
            Prompted::Started(turn_id) => PromptStarted::started(turn_id.into_string()),
            Prompted::Queued { prompt_id, position, waking } => PromptStarted {
                turn_id: None,
                queued: true,
                prompt_id: Some(prompt_id.into_string()),
                position: Some(position),
                waking,
            },
        })
    }

    async fn session_steer(&self, session_id: String, prompt: String) -> RpcResult<Steered> {
        self.0.steer(session_id.into(), prompt).await.map_err(to_rpc)
    }

    async fn session_fork(
        &self,
        session_id: String,
        turn_id: Option<String>,
    ) -> RpcResult<protocol::api::ForkResult> {
        self.0.fork(session_id.into(), turn_id.map(Into::into)).await.map_err(to_rpc)
    }

    async fn session_rewind(
        &self,
        session_id: String,
        turn_id: String,
        restore_workspace: Option<bool>,
    ) -> RpcResult<protocol::api::RewindResult> {
        let restore = restore_workspace.unwrap_or(false);
        self.0.rewind(session_id.into(), turn_id.into(), restore).await.map_err(to_rpc)
    }

    async fn session_changes(
        &self,
        session_id: String,
    ) -> RpcResult<protocol::api::SessionChanges> {
        self.0.changes(session_id.into()).await.map_err(to_rpc)
    }

    async fn session_changes_revert(
        &self,
        session_id: String,
        path: String,
    ) -> RpcResult<protocol::api::ChangesReverted> {
        self.0.revert_change(session_id.into(), path).await.map_err(to_rpc)
    }

    async fn engines_list(&self) -> RpcResult<protocol::api::EngineList> {
        self.0.engines().await.map_err(to_rpc)
    }

    async fn session_move(
        &self,
        session_id: String,
        runtime: protocol::api::RuntimeKind,
        labels: Option<std::collections::BTreeMap<String, String>>,
        force_after_ms: Option<u64>,
    ) -> RpcResult<protocol::api::SessionMoved> {
        let runtime = runtime.as_str().to_owned();
        self.0
            .move_to_runtime(session_id.into(), runtime, labels, force_after_ms)
            .await
            .map_err(to_rpc)
    }

    async fn engines_drain(
        &self,
        name: String,
        force_after_ms: Option<u64>,
    ) -> RpcResult<protocol::api::EngineInfo> {
        self.0.drain(name, force_after_ms).await.map_err(to_rpc)
    }

    async fn engines_undrain(&self, name: String) -> RpcResult<protocol::api::EngineInfo> {
        self.0.undrain(name).await.map_err(to_rpc)
    }

    async fn session_checkpoint_list(
        &self,
        session_id: String,
    ) -> RpcResult<protocol::api::CheckpointList> {
        self.0.checkpoints(session_id.into()).await.map_err(to_rpc)
    }

    async fn session_checkpoint_restore(
        &self,
        session_id: String,
        number: Option<u64>,
        turn: Option<u64>,
        into: String,
    ) -> RpcResult<protocol::api::CheckpointRestored> {
        self.0.restore_checkpoint(session_id.into(), number, turn, into).await.map_err(to_rpc)
    }

    async fn session_changes_keep(
        &self,
        session_id: String,
        path: String,
        content: String,
        kept: Option<bool>,
    ) -> RpcResult<protocol::api::SessionChanges> {
        let kept = kept.unwrap_or(true);
        self.0.keep_change(session_id.into(), path, content, kept).await.map_err(to_rpc)
    }

    async fn session_queue_list(&self, session_id: String) -> RpcResult<PromptQueue> {
        self.0.queue(session_id.into()).await.map_err(to_rpc)
    }

    async fn session_queue_edit(
        &self,
        session_id: String,
        prompt_id: String,
        prompt: Option<String>,
        position: Option<usize>,
    ) -> RpcResult<PromptQueue> {
        let change = QueueChange::Edit { prompt_id: prompt_id.into(), prompt, position };
        self.0.change_queue(session_id.into(), change).await.map_err(to_rpc)
    }

    async fn session_queue_remove(
        &self,
        session_id: String,
        prompt_id: String,
    ) -> RpcResult<PromptQueue> {
        let change = QueueChange::Remove(Some(prompt_id.into()));
        self.0.change_queue(session_id.into(), change).await.map_err(to_rpc)
    }

    async fn session_queue_clear(&self, session_id: String) -> RpcResult<PromptQueue> {
        let change = QueueChange::Remove(None);
        self.0.change_queue(session_id.into(), change).await.map_err(to_rpc)
    }

    async fn session_queue_resume(&self, session_id: String) -> RpcResult<PromptQueue> {
        self.0.change_queue(session_id.into(), QueueChange::Resume).await.map_err(to_rpc)
    }

    async fn session_resume(
        &self,
        session_id: String,
        refresh_profile: Option<bool>,
    ) -> RpcResult<ResumeResult> {
        self.0.resume(session_id.into(), refresh_profile.unwrap_or(false)).await.map_err(to_rpc)
    }

    async fn stop_all(&self) -> RpcResult<StopAllResult> {
        Ok(StopAllResult { stopped: self.0.stop_all().await })
    }

    async fn elicitation_respond(
        &self,
        session_id: String,
        request_id: String,
        action: protocol::api::params::ElicitationAnswer,
        content: Option<serde_json::Map<String, serde_json::Value>>,
    ) -> RpcResult<Done> {
        let answered =
            self.0.respond_elicitation(session_id.into(), request_id, action, content).await;
        answered.map_err(to_rpc).map(|()| Done {})
    }

    async fn session_config_options(
        &self,
        session_id: String,
    ) -> RpcResult<protocol::api::SessionConfig> {
        self.0.session_config(session_id.into()).await.map_err(to_rpc)
    }

    async fn session_set_config_option(
        &self,
        session_id: String,
        config_id: String,
        value: serde_json::Value,
    ) -> RpcResult<protocol::api::SessionConfig> {
        let forget = value.is_null();
        let setting = crate::settings::Setting::Option { id: config_id, value };
        self.0.choose_setting(session_id.into(), setting, forget).await.map_err(to_rpc)
    }

    async fn session_set_mode(
        &self,
        session_id: String,
        mode_id: Option<String>,
    ) -> RpcResult<protocol::api::SessionConfig> {
        let forget = mode_id.is_none();
        let setting = crate::settings::Setting::Mode(mode_id.unwrap_or_default());
        self.0.choose_setting(session_id.into(), setting, forget).await.map_err(to_rpc)
    }

    async fn session_cancel(&self, session_id: String) -> RpcResult<Done> {
        self.0.cancel(session_id.into()).await.map_err(to_rpc).map(|()| Done {})
    }

    async fn session_pause(
        &self,
        session_id: String,
        reason: Option<String>,
        force_after_ms: Option<u64>,
    ) -> RpcResult<PauseResult> {
        self.0.pause(session_id.into(), reason, force_after_ms).await.map_err(to_rpc)
    }

    async fn session_stop(&self, session_id: String) -> RpcResult<Done> {
        self.0.stop(session_id.into()).await.map_err(to_rpc).map(|()| Done {})
    }

    async fn session_delete(
        &self,
        session_id: String,
        force: Option<bool>,
        delete_branch: Option<bool>,
    ) -> RpcResult<Done> {
        let (force, delete_branch) = (force.unwrap_or(false), delete_branch.unwrap_or(false));
        self.0
            .delete(session_id.into(), force, delete_branch)
            .await
            .map_err(to_rpc)
            .map(|()| Done {})
    }

    async fn cleanup(
        &self,
        max_age_days: u32,
        states: Option<Vec<SessionState>>,
        keep_completed: Option<bool>,
        dry_run: Option<bool>,
        force: Option<bool>,
    ) -> RpcResult<CleanupResult> {
        let policy = CleanupPolicy {
            max_age_days,
            states: states.map(|states| states.into_iter().collect()),
            keep_completed: keep_completed.unwrap_or(false),
            dry_run: dry_run.unwrap_or(false),
            force: force.unwrap_or(false),
        };
        self.0.cleanup(&policy).await.map_err(to_rpc)
    }

    async fn permission_respond(
        &self,
        session_id: String,
        request_id: String,
        option_id: Option<String>,
    ) -> RpcResult<Done> {
        let answered = self.0.respond_permission(session_id.into(), request_id, option_id).await;
        answered.map_err(to_rpc).map(|()| Done {})
    }

    async fn session_history(
        &self,
        session_id: String,
        after_seq: Option<u64>,
        limit: Option<usize>,
    ) -> RpcResult<Vec<HistoryEntry>> {
        let entries = self
            .0
            .history(
                session_id.into(),
                after_seq.unwrap_or(0),
                limit.unwrap_or(DEFAULT_HISTORY_LIMIT),
            )
            .await
            .map_err(to_rpc)?;
        Ok(entries.into_iter().map(Into::into).collect())
    }

    async fn session_timeline(
        &self,
        session_id: String,
        after: Option<i64>,
    ) -> RpcResult<Timeline> {
        self.0.timeline(session_id.into(), after).await.map_err(to_rpc)
    }

    async fn snapshot_list(&self, session_id: String) -> RpcResult<Vec<SnapshotSummary>> {
        self.0.snapshot_list(session_id.into()).await.map_err(to_rpc)
    }

    async fn snapshot_get(&self, snapshot_id: String) -> RpcResult<Snapshot> {
        self.0.snapshot_get(snapshot_id).await.map_err(to_rpc)
    }

    async fn session_subscribe(
        &self,
        pending: PendingSubscriptionSink,
        session_id: String,
        after_seq: Option<u64>,
    ) -> SubscriptionResult {
        let Some((sink, reader)) = self.accept(pending, session_id, after_seq).await? else {
            return Ok(());
        };
        // The log's own marks stay here: subscribers get the wire event.
        stream_spool(sink, reader, |event| event.to_wire()).await
    }

    async fn session_subscribe_batch(
        &self,
        pending: PendingSubscriptionSink,
        session_id: String,
        after_seq: Option<u64>,
    ) -> SubscriptionResult {
        let Some((sink, reader)) = self.accept(pending, session_id, after_seq).await? else {
            return Ok(());
        };
        let max = protocol::api::MAX_BATCH_EVENTS;
        stream_spool_batches(
            sink,
            reader,
            max,
            crate::events::SessionEvent::wire_from_line,
            |event| event.to_wire(),
        )
        .await
    }

    async fn session_event_window(
        &self,
        session_id: String,
        before_seq: Option<u64>,
        limit: Option<usize>,
    ) -> RpcResult<protocol::api::EventWindow> {
        self.0.event_window(session_id.into(), before_seq, limit).await.map_err(to_rpc)
    }

    async fn sessions_subscribe(&self, pending: PendingSubscriptionSink) -> SubscriptionResult {
        // Listening before the answer: nothing that changes once the client has it is missed.
        let changes = self.0.session_changes();
        let sink = pending.accept().await?;
        stream_session_list(sink, Arc::clone(&self.0), changes).await
    }

    async fn workflow_start(
        &self,
        spec: String,
        spec_file: Option<String>,
        vars: Option<std::collections::BTreeMap<String, String>>,
        task_id: Option<String>,
        workspace: Option<String>,
    ) -> RpcResult<WorkflowStarted> {
        let new =
            NewWorkflow { spec, spec_file, vars: vars.unwrap_or_default(), task_id, workspace };
        self.0.workflow_start(new).await.map_err(to_rpc)
    }

    async fn workflow_status(&self, workflow_id: String) -> RpcResult<WorkflowStatus> {
        self.0.workflow_status(workflow_id.into()).await.map_err(to_rpc)
    }

    async fn workflow_list(&self) -> RpcResult<Vec<WorkflowSummary>> {
        self.0.workflow_list().await.map_err(to_rpc)
    }

    async fn workflow_resume(
        &self,
        workflow_id: String,
        spec: Option<String>,
        accept_spec_change: Option<bool>,
    ) -> RpcResult<WorkflowStatus> {
        let accept = accept_spec_change.unwrap_or(false);
        self.0.workflow_resume(workflow_id.into(), spec, accept).await.map_err(to_rpc)
    }

    async fn workflow_cancel(&self, workflow_id: String) -> RpcResult<Done> {
        self.0.workflow_cancel(workflow_id.into()).await.map_err(to_rpc).map(|()| Done {})
    }

    async fn workflow_approve(&self, workflow_id: String, step_id: String) -> RpcResult<Done> {
        self.0
            .workflow_approve(workflow_id.into(), step_id.into())
            .await
            .map_err(to_rpc)
            .map(|()| Done {})
    }

    async fn workflow_delete(&self, workflow_id: String) -> RpcResult<Done> {
        self.0.workflow_delete(workflow_id.into()).await.map_err(to_rpc).map(|()| Done {})
    }

    async fn session_retry_turn(
        &self,
        session_id: String,
        turn_id: Option<String>,
    ) -> RpcResult<PromptStarted> {
        let turn_id =
            self.0.retry_turn(session_id.into(), turn_id.map(Into::into)).await.map_err(to_rpc)?;
        Ok(PromptStarted::started(turn_id.into_string()))
    }

    async fn budget_set(
        &self,
        session_id: Option<String>,
        task_id: Option<String>,
        tokens: Option<u64>,
        cost: Option<f64>,
        currency: Option<String>,
    ) -> RpcResult<Option<protocol::api::BudgetUse>> {
        let budget = protocol::api::Budget { tokens, cost, currency };
        self.0.set_budget(session_id.map(Into::into), task_id, budget).await.map_err(to_rpc)
    }

    async fn usage_query(
        &self,
        session_id: Option<String>,
        task_id: Option<String>,
        profile: Option<String>,
        workflow_id: Option<String>,
        since_ms: Option<i64>,
        until_ms: Option<i64>,
        group_by: Option<protocol::api::UsageGroupBy>,
    ) -> RpcResult<protocol::api::UsageReport> {
        let filter = crate::store::UsageFilter {
            session_id: session_id.map(Into::into),
            task_id,
            profile,
            workflow_id: workflow_id.map(Into::into),
            since: since_ms,
            until: until_ms,
        };
        self.0.usage(filter, group_by).await.map_err(to_rpc)
    }

    async fn workflow_subscribe(
        &self,
        pending: PendingSubscriptionSink,
        workflow_id: String,
        after_seq: Option<u64>,
    ) -> SubscriptionResult {
        let after_seq = after_seq.unwrap_or(0);
        let workflow_id = WorkflowId::from(workflow_id);
        // Listening before the first read: nothing written between the two is missed.
        let changes = self.0.workflow_changes();
        match self.0.workflow_events(workflow_id.clone(), after_seq, 1).await {
            Ok(_) => {
                let sink = pending.accept().await?;
                stream_workflow(sink, Arc::clone(&self.0), workflow_id, after_seq, changes).await
            }
            Err(err) => {
                pending.reject(to_rpc(err)).await;
                Ok(())
            }
        }
    }

    async fn workflows_subscribe(&self, pending: PendingSubscriptionSink) -> SubscriptionResult {
        // Listening before the answer: nothing that changes once the client has it is missed.
        let changes = self.0.workflow_changes();
        let sink = pending.accept().await?;
        stream_workflow_list(sink, Arc::clone(&self.0), changes).await
    }

    async fn discover(&self) -> RpcResult<Value> {
        serde_json::from_str(protocol::api::openrpc::DOCUMENT).map_err(|err| {
            to_rpc(ServiceError::Internal(format!("the OpenRPC document does not parse: {err}")))
        })
    }
}

/// How many history entries `task.session.history` returns when not told.
pub const DEFAULT_HISTORY_LIMIT: usize = 1000;

/// Builds the method table over `supervisor`.
pub fn methods(supervisor: Arc<Supervisor>) -> RpcModule<()> {
    let mut module = RpcModule::new(());
    module.merge(Methods(supervisor).into_rpc()).expect("UNWRAP: one set of distinct methods");
    module
}

/// Starts the API server: its own accept loop, so that each connection is admitted by its
/// peer ([`admission`]) before the API sees it.
pub async fn serve(
    listen: SocketAddr,
    policy: AccessPolicy,
    limits: Limits,
    supervisor: Arc<Supervisor>,
) -> std::io::Result<(SocketAddr, ServerHandle)> {
    // Outermost first: the page (no token needed: it holds no data) and browser upgrades,
    // then the access check, then /metrics behind it, then JSON-RPC.
    let token_required = policy.token.is_some();
    let access = tower::ServiceBuilder::new()
        .layer(crate::web::PagesLayer::new(token_required))
        .layer(AccessLayer::new(policy))
        .layer(crate::web::MetricsLayer::new(Arc::clone(&supervisor)));
    let config = ServerConfig::builder()
        .max_request_body_size(32 * 1024 * 1024)
        .max_response_body_size(64 * 1024 * 1024)
        .max_connections(limits.max)
        // Params are checked per call (`CheckParams`), and a batch would go around that.
        .set_batch_request_config(BatchRequestConfig::Disabled)
        .ws_only()
        .build();
    let services = Server::builder()
        .set_config(config)
        .set_http_middleware(access)
        .set_rpc_middleware(
            RpcServiceBuilder::new()
                .layer_fn(Counted)
                .layer_fn(|service| CheckParams::new(service, params::check)),
        )
        .to_service_builder();
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let (stop, handle) = jsonrpsee::server::stop_channel();
    let methods: jsonrpsee::server::Methods = methods(supervisor).into();
    let admission = Admission::new(limits, nix::unistd::geteuid().as_raw());
    tokio::spawn(async move {
        loop {
            let (socket, remote) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        tracing::debug!(%err, "cannot accept an API connection");
                        continue;
                    }
                },
                () = stop.clone().shutdown() => break,
            };
            if let Err(err) = socket.set_nodelay(true) {
                tracing::debug!(%err, "cannot set TCP_NODELAY on an API connection");
            }
            let peer = admission.identify(addr, remote);
            let slot = admission.admit(peer.clone());
            if let Err(refusal) = &slot {
                tracing::warn!(%remote, ?peer, %refusal, "refusing an API connection");
            }
            let service = tower::Layer::layer(
                &AccessLayer::new(SlotGate(slot)),
                services.clone().build(methods.clone(), stop.clone()),
            );
            let stopped = stop.clone().shutdown();
            tokio::spawn(async move {
                let served =
                    jsonrpsee::server::serve_with_graceful_shutdown(socket, service, stopped).await;
                if let Err(err) = served {
                    tracing::debug!(%err, %remote, "an API connection ended");
                }
            });
        }
    });
    Ok((addr, handle))
}

/// The answer to a notification, or to a request whose id cannot be echoed.
pub const NOT_A_REQUEST: &str = "invalid request: every call needs an id that is a string or an \
     integer from 0 to 2^64-1 (notifications and null ids are not served; an object, array, \
     float, negative or over-large id cannot be answered with itself)";

/// The answer to what is not a request the API serves: `-32600` with `id: null`.
fn not_a_request() -> jsonrpsee::MethodResponse {
    jsonrpsee::MethodResponse::error(
        jsonrpsee::types::Id::Null,
        jsonrpsee::types::ErrorObject::owned(
            jsonrpsee::types::error::INVALID_REQUEST_CODE,
            NOT_A_REQUEST,
            None::<()>,
        ),
    )
}

/// Counts every API request by method and error kind (`tether_api_requests_total`). It
/// sits outside [`CheckParams`], so the kinds counted are the ones clients get. Method
/// names outside the API are counted as `other`, so a client cannot grow the label set.
#[derive(Clone)]
struct Counted<S>(S);

/// The error kind of a response (`none` for success).
fn error_kind(response: &jsonrpsee::MethodResponse) -> String {
    if !response.is_error() {
        return "none".into();
    }
    let parsed: Option<Value> = serde_json::from_str(response.as_json().get()).ok();
    parsed
        .as_ref()
        .and_then(|value| value["error"]["data"]["kind"].as_str())
        .unwrap_or("unknown")
        .to_owned()
}

impl<S> jsonrpsee::core::middleware::RpcServiceT for Counted<S>
where
    S: jsonrpsee::core::middleware::RpcServiceT<
            MethodResponse = jsonrpsee::MethodResponse,
            NotificationResponse = jsonrpsee::MethodResponse,
        > + Send
        + Sync
        + Clone
        + 'static,
{
    type MethodResponse = S::MethodResponse;
    type NotificationResponse = S::NotificationResponse;
    type BatchResponse = S::BatchResponse;

    fn call<'a>(
        &self,
        request: jsonrpsee::types::Request<'a>,
    ) -> impl Future<Output = Self::MethodResponse> + Send + 'a {
        let service = self.0.clone();
        let method = protocol::api::method::ALL
            .iter()
            .find(|name| **name == request.method)
            .map_or("other", |name| name);
        // A null id correlates nothing (JSON-RPC: a client should not send it): such a
        // call is refused, never run.
        let null_id = matches!(request.id, jsonrpsee::types::Id::Null);
        async move {
            let response = if null_id { not_a_request() } else { service.call(request).await };
            let labels = vec![("method", method.to_owned()), ("error", error_kind(&response))];
            crate::metrics::get().api_requests.get_or_create(&labels).inc();
            response
        }
    }

    fn batch<'a>(
        &self,
        batch: jsonrpsee::core::middleware::Batch<'a>,
    ) -> impl Future<Output = Self::BatchResponse> + Send + 'a {
        self.0.batch(batch)
    }

    /// Every method of the API answers, so a notification (no id) is refused with
    /// `-32600` and `id: null` rather than dropped unseen; a request whose id is not a
    /// string or an integer (an object, an array, a float, a number over 2^64) reaches here
    /// too, and so gets an answer instead of none.
    fn notification<'a>(
        &self,
        notification: jsonrpsee::core::middleware::Notification<'a>,
    ) -> impl Future<Output = Self::NotificationResponse> + Send + 'a {
        drop(notification);
        async move {
            let response = not_a_request();
            let labels =
                vec![("method", "other".to_owned()), ("error", "invalid_request".to_owned())];
            crate::metrics::get().api_requests.get_or_create(&labels).inc();
            response
        }
    }
}
