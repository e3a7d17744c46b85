//! The ACP client side of the actor: agentctl events in, history and session events out;
//! responses matched to our requests; the resume ladder after `initialize`.
//!
//! Results are parsed with the pinned ACP schema crate (`protocol::acp::schema`),
//! tolerantly: a result that does not fit the schema (a newer agent) is kept raw and read
//! for the one field needed, never a reason to fail the session.

pub(super) mod explain;
pub(super) mod parse;
pub(super) mod requests;

use serde::Deserialize;
use serde_json::{Value, json};

use super::Phase;
use super::actor::{AfterAuth, Pending, Recorded, Replay, ResumeContext, SessionActor, Stage};
use super::meter::{ContextReport, ContextWarning};
use super::outbox::Outgoing;
use crate::events::{LaunchStep, SessionEventKind};
use crate::history::{self, EntryType};
use crate::store::{ExecutionStatus, ResumeOutcome, SessionState, TurnState, task_state};
use agents::profile::{Advertised, RestoreMethod};
pub(super) use parse::KnownConversation;
use parse::{failed_tool_text, tool_diffs, tool_name, tool_text, tool_title};
use protocol::acp::{Parsed, schema};
use protocol::control::{Event, EventKind};

/// The longest a message is coalesced in memory, in bytes of text and in agentctl events,
/// before what it has so far is written as one history entry (the rest follows in the next).
const MAX_COALESCED_BYTES: usize = 256 * 1024;
const MAX_COALESCED_EVENTS: u64 = 4096;

/// How much of the history's end a load's trailing replay is matched against.
const REPLAY_WINDOW_BYTES: u64 = 256 * 1024;

/// A JSON-RPC error object, tolerantly.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RpcErrorBody {
    code: Option<i64>,
    message: Option<String>,
    data: Option<Value>,
}

impl RpcErrorBody {
    /// One line; `-32603` with `data.details` shows the details.
    fn text(&self) -> String {
        let message = self.message.as_deref().unwrap_or("error");
        match self.data.as_ref().and_then(|data| data.get("details")).and_then(Value::as_str) {
            Some(details) => format!("{message}: {details}"),
            None => message.to_owned(),
        }
    }
}

/// A `plan` update's entries; what is not an object with a text `content` is left out, a
/// missing `status` is `pending`.
fn plan_entries(update: &Value) -> Vec<protocol::api::PlanEntry> {
    let entries = update.get("entries").and_then(Value::as_array).map(Vec::as_slice);
    let entry = |entry: &Value| {
        Some(protocol::api::PlanEntry {
            content: entry.get("content")?.as_str()?.to_owned(),
            status: entry.get("status").and_then(Value::as_str).unwrap_or("pending").to_owned(),
            priority: entry.get("priority").and_then(Value::as_str).map(str::to_owned),
        })
    };
    entries.unwrap_or_default().iter().filter_map(entry).collect()
}

/// `session/update` kinds that a `session/load` replays to restore the conversation: they
/// are in our records already. Everything else that arrives during a load (available
/// commands, a session title, a mode) is news, and is forwarded.
fn is_replayed_kind(kind: &str) -> bool {
    matches!(
        kind,
        "user_message_chunk"
            | "agent_message_chunk"
            | "agent_thought_chunk"
            | "tool_call"
            | "tool_call_update"
            | "plan"
    )
}

impl SessionActor {
    pub(super) async fn handle_agent_event(&mut self, event: Event) {
        if let EventKind::IntakeStalled { reason } = event.kind {
            // Outside the sequence: nothing to record or acknowledge, only to say.
            return self.agentctl_stalled(reason);
        }
        if let EventKind::BacklogFull = event.kind {
            // agentctl's spool is at its bound and the agent waits: what is handled is
            // made durable and acknowledged now (a message being coalesced included).
            if let Err(err) = self.recorder.history.flush_agent() {
                self.recorder.write_failed("the history", &err);
            }
            // Again once what is still in flight is handled (the notice may overtake it).
            self.conversation.replay_unacked = true;
            return self.ack(true).await;
        }
        if event.seq == 0 {
            // Outside the sequence too (a damaged spool line, said where it was).
            if let EventKind::Error { message } = event.kind {
                self.recorder.emit(SessionEventKind::Notice { message });
            }
            return;
        }
        let seq = event.seq;
        crate::metrics::get().relayed_events.inc();
        self.recorder.durability.handled = event.seq;
        self.recorder.durability.unacked += 1;
        // After a restart, replayed events that were already recorded are not recorded
        // again (their effects on the store are idempotent).
        self.recorder.recorded = Recorded {
            history: self.recorder.durability.in_history(event.seq),
            events: self.recorder.durability.in_events(event.seq),
        };
        if !self.recorder.recorded.history {
            self.recorder.history.set_watermark(event.seq);
        }
        let force_ack = match event.kind {
            EventKind::Acp { message, answered: None }
                if self.agent_text_fast(message.get()).await =>
            {
                false
            }
            EventKind::Acp { message, answered } => match serde_json::from_str(message.get()) {
                Ok(message) => self.handle_acp(message, answered.is_some()).await,
                // Valid JSON nested past what a tree holds: no message of ACP's.
                Err(err) => {
                    let message = format!("the agent sent a message that cannot be read: {err}");
                    self.recorder.emit(SessionEventKind::Notice { message });
                    false
                }
            },
            EventKind::AgentExited { status, stderr_tail } => {
                let reason = explain::exit_reason(
                    status,
                    &stderr_tail,
                    &self.profile,
                    self.context.runtime.agent_home().is_some(),
                );
                self.agent_gone(reason).await;
                true
            }
            EventKind::StdoutClosed => {
                let reason =
                    "the agent closed its stdout and can answer nothing more; it was stopped";
                self.agent_gone(reason.into()).await;
                true
            }
            EventKind::StdoutNoise { line, reason } => {
                self.recorder.emit(SessionEventKind::Notice {
                    message: format!("agent output that is not ACP ({reason}): {line}"),
                });
                false
            }
            EventKind::Error { message } => {
                self.recorder.emit(SessionEventKind::Notice { message });
                false
            }
            EventKind::Stderr { line } => {
                self.stderr_while_quiet(&line);
                self.conversation.stderr_line(&line);
                false
            }
            EventKind::Delivered { id } => {
                self.delivered(&id).await;
                false
            }
            EventKind::AgentStarted { .. } => false,
            _ => false,
        };
        self.recorder.recorded = Recorded::default();
        if self.sidecar.catch_up.until.is_some_and(|until| seq >= until) {
            self.settle_undelivered().await;
        }
        // A trailing replay is acknowledged once its burst is through (nothing queued
        // behind it), not one fsync per dropped chunk.
        let replay_done = self.conversation.replay_unacked
            && self
                .sidecar
                .execution
                .as_ref()
                .is_some_and(|execution| execution.events_rx.is_empty());
        if replay_done {
            self.conversation.replay_unacked = false;
        }
        self.ack(force_ack || replay_done).await;
    }

    /// A request of ours reached agentctl: for a prompt, the turn's row says so.
    async fn delivered(&mut self, id: &Value) {
        let key = match id {
            Value::Number(n) => n.to_string(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        self.sidecar.catch_up.undelivered.remove(&key);
        if let Some(Pending::Prompt { turn_id, .. }) = self.conversation.pending.get(&key) {
            // Whatever a load still replays was logged before this prompt.
            if let Replay::Loading(known) = std::mem::take(&mut self.conversation.replay) {
                self.conversation.replay = known.map_or(Replay::Off, Replay::Trailing);
            }
            let turn_id = turn_id.clone();
            if let Err(err) = self.context.store.mark_delivered(turn_id).await {
                self.recorder.write_failed("a delivered prompt", &err);
            }
        }
    }

    /// agentctl cannot write its spool (a full disk): the agent's output is held there, and
    /// status says so until it can again.
    fn agentctl_stalled(&mut self, reason: Option<String>) {
        let held = reason.is_some();
        let error = match reason {
            Some(reason) => Some(format!(
                "agentctl cannot write its spool ({reason}); the agent's output is held, nothing is lost"
            )),
            None => self.row.error_message.clone(),
        };
        self.update_view(|view| view.error = error);
        // Said after the status shows it, so whoever reads the log line finds it there.
        if held {
            tracing::warn!(session = %self.row.id, "agentctl cannot write its spool; the agent's output is held");
        } else {
            tracing::info!(session = %self.row.id, "agentctl writes its spool again");
        }
    }

    /// Handles one ACP message from the agent. Returns whether a turn ended.
    async fn handle_acp(&mut self, message: Value, answered_by_agentctl: bool) -> bool {
        let method = message.get("method").and_then(Value::as_str).map(str::to_owned);
        let id = message.get("id").cloned();
        // The params are moved out of the message, not copied (a chunk's whole tree).
        let params = |mut message: Value| match message.get_mut("params") {
            Some(params) => params.take(),
            None => Value::Null,
        };
        match (method, id) {
            (Some(method), Some(id)) => {
                if !answered_by_agentctl {
                    self.agent_request(method, id, params(message)).await;
                }
                false
            }
            (Some(method), None) => {
                let params = params(message);
                let foreign = (self.sidecar.execution.as_ref())
                    .is_some_and(|execution| execution.is_primed(&params));
                if method == protocol::acp::method::SESSION_UPDATE && !foreign {
                    self.session_update(params);
                    self.settings_updated().await;
                } else if method == protocol::acp::method::CANCEL_REQUEST
                    && !self.recorder.recorded.events
                {
                    self.question_withdrawn(&params["requestId"]).await;
                }
                false
            }
            (None, Some(id)) => self.response(id, message).await,
            (None, None) => false,
        }
    }

    async fn agent_request(&mut self, method: String, id: Value, params: Value) {
        if self.recorder.recorded.events {
            // Handled before the restart (recorded, and possibly answered since).
            return;
        }
        if method == protocol::acp::method::SESSION_REQUEST_PERMISSION
            || method == protocol::acp::method::ELICITATION_CREATE
        {
            self.tool_announced(&params["toolCall"]);
            // Unique for the session's whole life: the agent's id within its execution.
            let request_id = super::permission_request_id(self.recorder.generation(), &id);
            let Some(execution_id) =
                self.sidecar.execution.as_ref().map(|execution| execution.id.clone())
            else {
                return;
            };
            if let Err(err) = self
                .context
                .store
                .insert_pending(
                    self.row.id.clone(),
                    execution_id,
                    request_id.clone(),
                    method.clone(),
                    params.clone(),
                )
                .await
            {
                self.recorder.write_failed("a question of the agent", &err);
            }
            self.recorder.emit(super::question_event(&method, request_id, params));
            return;
        }
        self.send(Outgoing::Acp(json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": -32601, "message": format!("method not found: {method}")},
        })));
    }

    /// A tool call in a permission request: one first heard of here (some agents announce
    /// it no other way) is recorded as a tool call, as a `tool_call` update would be; one
    /// held is named by it (what the agent asks to run is no placeholder).
    fn tool_announced(&mut self, tool_call: &Value) {
        let Some(id) = tool_call["toolCallId"].as_str().filter(|id| !id.is_empty()) else {
            return;
        };
        if let Some(known) = self.conversation.tool_titles.get_mut(id) {
            if let Some(title) = tool_title(tool_call) {
                title.clone_into(&mut known.0);
            }
            return self.tool_call_named(id);
        }
        let title = tool_title(tool_call).unwrap_or("tool").to_owned();
        let status = tool_call["status"].as_str().unwrap_or("pending").to_owned();
        let kind = tool_call["kind"].as_str().unwrap_or_default().to_owned();
        self.conversation
            .tool_titles
            .insert(id.to_owned(), (title.clone(), kind, tool_diffs(tool_call)));
        self.recorder.record_history(
            EntryType::ToolCall,
            title.clone(),
            Some((title, id.to_owned(), status)),
        );
    }

    fn session_update(&mut self, mut params: Value) {
        let update = params.get_mut("update").map(Value::take).unwrap_or(Value::Null);
        let kind =
            update.get("sessionUpdate").and_then(Value::as_str).unwrap_or_default().to_owned();
        if let Replay::Trailing(known) = &self.conversation.replay {
            if known.is_replay(&kind, &update) {
                // The tail of a replay that trails even the next prompt's delivery (gemini
                // under load): it repeats what is recorded, and is dropped like the rest.
                return;
            }
            self.conversation.replay = Replay::Off;
        }
        if matches!(self.conversation.replay, Replay::Loading(_)) && is_replayed_kind(&kind) {
            if let (Some(replayed), "user_message_chunk" | "agent_message_chunk", Some(text)) = (
                self.conversation.replayed_messages.as_mut(),
                kind.as_str(),
                update["content"]["text"].as_str(),
            ) {
                replayed.push_str(text);
            }
            // `session/load` replays the conversation into the agent; we have it already.
            // After the load's answer the session is open and nothing else acknowledges
            // these events soon: were the supervisor killed now, a new actor would not know
            // they are a replay. They hold nothing to write, so they are acknowledged.
            self.conversation.replay_unacked |= !self.conversation.restoring();
            return;
        }
        self.conversation.heard();
        let text = || update["content"]["text"].as_str().map(str::to_owned);
        let message_id = update["messageId"].as_str().map(str::to_owned);
        match kind.as_str() {
            "agent_message_chunk" => {
                if let Some(text) = text() {
                    self.agent_message_chunk(text, message_id);
                }
            }
            "agent_thought_chunk" => {
                if let Some(text) = text() {
                    self.recorder.emit(SessionEventKind::AgentThoughtChunk { text, message_id });
                }
            }
            "tool_call" => self.tool_call(update),
            "tool_call_update" => self.tool_call_update(update),
            "plan" => {
                self.record_plan(plan_entries(&update));
                self.recorder.emit(SessionEventKind::SessionUpdate { update });
            }
            "usage_update" => {
                self.usage_reported(&update);
                self.recorder.emit(SessionEventKind::SessionUpdate { update });
            }
            "session_info_update" => {
                // A title (`null` takes it back); other fields are only shown.
                if let Some(title) = update.get("title") {
                    self.conversation.new_title = Some(title.as_str().map(str::to_owned));
                }
                self.recorder.emit(SessionEventKind::SessionUpdate { update });
            }
            "config_option_update" | "current_mode_update" => {
                self.agent_setting_update(&update);
                self.recorder.emit(SessionEventKind::SessionUpdate { update });
            }
            _ => self.recorder.emit(SessionEventKind::SessionUpdate { update }),
        }
    }

    /// A tool call announced. One announced `pending` (its input still streaming: claude's
    /// first title is a placeholder such as "Preparing file…") is held in memory until the
    /// agent names or starts it, so that its entry says what the agent called it.
    fn tool_call(&mut self, update: Value) {
        let title = tool_title(&update).unwrap_or("tool").to_owned();
        let id = update["toolCallId"].as_str().unwrap_or_default().to_owned();
        let status = update["status"].as_str().unwrap_or("pending").to_owned();
        let kind = update["kind"].as_str().unwrap_or_default().to_owned();
        let diffs = tool_diffs(&update);
        self.conversation.tool_titles.insert(id.clone(), (title.clone(), kind, diffs));
        if status != "pending" {
            self.recorder.record_history(
                EntryType::ToolCall,
                title.clone(),
                Some((title, id, status)),
            );
        } else if !self.recorder.recorded.history {
            if let Err(err) = self.recorder.history.hold_tool_call(title, id, status) {
                self.recorder.write_failed("the history", &err);
            }
            self.bound_coalescing();
        }
        self.recorder.emit(SessionEventKind::ToolCall { update });
    }

    /// The agent named tool call `id` (or started it): a held entry is written now, under
    /// the newest title the agent gave.
    fn tool_call_named(&mut self, id: &str) {
        let Some(title) = self.conversation.tool_titles.get(id).map(|known| known.0.clone()) else {
            return;
        };
        if !self.recorder.recorded.history
            && let Err(err) = self.recorder.history.name_tool_call(id, &title)
        {
            self.recorder.write_failed("the history", &err);
        }
    }

    fn tool_call_update(&mut self, update: Value) {
        let status = update["status"].as_str().unwrap_or_default().to_owned();
        let id = update["toolCallId"].as_str().unwrap_or_default().to_owned();
        // Later updates name the tool better than its first placeholder did.
        let known = self.conversation.tool_titles.entry(id.clone()).or_default();
        let title = tool_title(&update);
        if let Some(title) = title {
            title.clone_into(&mut known.0);
        }
        if let Some(kind) = update["kind"].as_str() {
            known.1 = kind.to_owned();
        }
        let diffs = tool_diffs(&update);
        if !diffs.is_empty() {
            known.2 = diffs;
        }
        if title.is_some() || !matches!(status.as_str(), "" | "pending") {
            self.tool_call_named(&id);
        }
        if matches!(status.as_str(), "completed" | "failed") {
            self.tool_result(id, status, &update);
        }
        if !self.recorder.recorded.history {
            self.bound_coalescing();
        }
        self.recorder.emit(SessionEventKind::ToolCallUpdate { update });
    }

    /// A tool call's final update (`status` `completed` or `failed`): its result entry.
    fn tool_result(&mut self, id: String, status: String, update: &Value) {
        let (title, kind, diffs) = self.conversation.tool_titles.remove(&id).unwrap_or_default();
        // A failed (or denied) edit changed nothing: the diff it proposed is not recorded
        // as made.
        let mut content = match status.as_str() {
            "failed" => failed_tool_text(update, !diffs.is_empty()),
            _ => tool_text(update),
        };
        if status == "completed" && !diffs.is_empty() && !content.contains(&diffs) {
            // The change was shown by an earlier update (claude's), the final one says
            // only that it was made.
            content = if content.is_empty() { diffs } else { format!("{diffs}\n{content}") };
        }
        let excerpt = history::excerpt(&content, history::TOOL_RESULT_EXCERPT_CHARS);
        let name = tool_name(title, kind);
        self.recorder.record_history(EntryType::ToolResult, excerpt, Some((name, id, status)));
    }

    /// A message being coalesced in memory holds the ack point back (it is on no disk
    /// yet), as a held tool call does, and agentctl bounds what it keeps unacknowledged: a
    /// very long message is written in parts (a held call written as it is), so
    /// acknowledgements go on and the agent never waits on itself.
    fn bound_coalescing(&mut self) {
        let since =
            self.recorder.history.unflushed_since().unwrap_or(self.recorder.durability.handled);
        let long = self.recorder.history.coalesced_bytes() >= MAX_COALESCED_BYTES
            || self.recorder.durability.handled.saturating_sub(since) >= MAX_COALESCED_EVENTS;
        if long && let Err(err) = self.recorder.history.flush_agent() {
            self.recorder.write_failed("the history", &err);
        }
    }

    /// A response to one of our requests. Returns whether a turn ended.
    async fn response(&mut self, id: Value, message: Value) -> bool {
        let key = match &id {
            Value::Number(n) => n.to_string(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let Some(purpose) = self.conversation.pending.remove(&key) else { return false };
        if !matches!(purpose, Pending::Prompt { .. })
            && let Some(opening) = self.stage.opening()
        {
            opening.step = None;
        }
        let result = match message.get("error") {
            Some(error) => {
                Err(serde_json::from_value::<RpcErrorBody>(error.clone()).unwrap_or_default())
            }
            None => Ok(message.get("result").cloned().unwrap_or(Value::Null)),
        };
        match purpose {
            Pending::Initialize => {
                match result {
                    Ok(result) => self.initialized(result).await,
                    Err(error) => {
                        let tail = self.conversation.stderr_tail();
                        self.fail(format!("the agent refused initialize: {}{tail}", error.text()))
                            .await
                    }
                }
                false
            }
            Pending::Restore { load, token } => {
                self.restored(load, token, result).await;
                false
            }
            Pending::Authenticate { method, then } => {
                match result {
                    Ok(_) => {
                        if let Some(opening) = self.stage.opening() {
                            opening.authenticated = true;
                        }
                        match then {
                            AfterAuth::NewSession => self.new_acp_session(),
                            AfterAuth::Restore { load, token } => self.restore(load, token),
                        }
                    }
                    Err(error) => {
                        self.fail(format!(
                            "needs credentials: the agent refused authenticate with {method}: {}",
                            error.text()
                        ))
                        .await
                    }
                }
                false
            }
            Pending::NewSession => {
                self.new_session_answered(result).await;
                false
            }
            Pending::Setting { setting, reply } => {
                self.setting_answered(setting, reply, result.map_err(|error| error.text())).await;
                false
            }
            Pending::Prompt { turn_id, injected } => {
                if self.conversation.turn_id() == Some(turn_id.as_str()) {
                    self.prompt_answered(injected, result).await;
                }
                true
            }
        }
    }

    /// `session/new` answered: the ACP session opens (its settings restored first), or
    /// the launch fails — unless credentials can still be offered.
    async fn new_session_answered(&mut self, result: Result<Value, RpcErrorBody>) {
        let session_id = result.as_ref().map(|result| {
            match protocol::acp::parse::<schema::NewSessionResponse>(result) {
                Parsed::Known(response) => Some(response.session_id.0.to_string()),
                Parsed::Unknown(raw) => {
                    raw.get("sessionId").and_then(Value::as_str).map(str::to_owned)
                }
            }
        });
        let answer = result.as_ref().ok().cloned().unwrap_or_default();
        match session_id {
            Ok(Some(acp_session)) => self.opened_with(acp_session, None, &answer).await,
            Ok(None) => self.fail("session/new returned no sessionId".into()).await,
            Err(error) if self.try_authenticate(error, AfterAuth::NewSession) => {}
            Err(error) if error.code == Some(protocol::ErrorCode::AuthRequired.code()) => {
                let reason = explain::credentials_needed(
                    self.stage.opening_ref(),
                    &self.profile,
                    &self.context.agent_home,
                    &error.text(),
                );
                self.fail(reason).await
            }
            Err(error) => {
                self.fail(format!("the agent refused session/new: {}", error.text())).await
            }
        }
    }

    /// The running turn's `session/prompt` answered (`injected`: it carried the resume
    /// context): the turn ends with the agent's stop reason, or as failed. A cancel the
    /// user asked for is recorded as cancelled whatever the agent answered.
    async fn prompt_answered(&mut self, injected: bool, result: Result<Value, RpcErrorBody>) {
        match result {
            Ok(result) => {
                if injected {
                    self.clear_resume_context_pending().await;
                }
                self.store_token_again().await;
                let stop_reason = match protocol::acp::parse::<schema::PromptResponse>(&result) {
                    Parsed::Known(response) => serde_json::to_value(response.stop_reason)
                        .ok()
                        .and_then(|reason| reason.as_str().map(str::to_owned)),
                    // A stop reason newer than the schema is kept as said.
                    Parsed::Unknown(raw) => {
                        raw.get("stopReason").and_then(Value::as_str).map(str::to_owned)
                    }
                }
                .unwrap_or_else(|| "end_turn".into());
                // Some agents (opencode) answer a prompt the user cancelled
                // with end_turn; what the user did is what is recorded.
                let stop_reason =
                    if self.conversation.turn.as_ref().is_some_and(|turn| turn.cancel_at.is_some())
                        && stop_reason == "end_turn"
                    {
                        "cancelled".to_owned()
                    } else {
                        stop_reason
                    };
                if let Some(turn) = self.conversation.turn.as_mut() {
                    super::meter::prompt_usage(&result, &mut turn.usage);
                }
                self.end_turn(TurnState::Completed, Some(stop_reason), None).await;
            }
            Err(error)
                if self.conversation.turn.as_ref().is_some_and(|turn| turn.cancel_at.is_some()) =>
            {
                // Others (qwen-code) answer it with the error of their aborted
                // model request: still the cancel the user asked for.
                self.recorder.emit(SessionEventKind::Notice {
                    message: format!(
                        "the agent answered the cancel with an error ({}); the turn is recorded as cancelled",
                        error.text()
                    ),
                });
                self.end_turn(TurnState::Completed, Some("cancelled".into()), None).await
            }
            Err(error) => self.end_turn(TurnState::Failed, None, Some(error.text())).await,
        }
    }

    /// `initialize` answered: restore natively when a resume has a token and the agent
    /// can, else open a new ACP session.
    pub(in crate::session) async fn initialized(&mut self, result: Value) {
        let Some(opening) = self.stage.opening() else { return };
        opening.authenticated = false;
        opening.auth_offered = result["authMethods"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|method| method["type"].as_str() != Some("terminal"))
            .filter_map(|method| method["id"].as_str().map(str::to_owned))
            .collect();
        opening.auth_terminal = result["authMethods"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|method| method["type"].as_str() == Some("terminal"))
            .map(|method| {
                let name = method["name"].as_str().or(method["id"].as_str()).unwrap_or("login");
                let args = method["args"].as_array().into_iter().flatten();
                (name.to_owned(), args.filter_map(|arg| arg.as_str().map(str::to_owned)).collect())
            })
            .collect();
        let token = opening
            .launch
            .resume
            .as_ref()
            .filter(|resume| !resume.relaunched)
            .and_then(|resume| resume.token.clone());
        // An answer that does not fit the schema is read for its capabilities alone.
        let capabilities = match protocol::acp::parse::<schema::InitializeResponse>(&result) {
            Parsed::Known(response) => response.agent_capabilities,
            // Its capabilities may still parse on their own (their fields default on error).
            Parsed::Unknown(raw) => raw
                .get("agentCapabilities")
                .and_then(|caps| serde_json::from_value(caps.clone()).ok())
                .unwrap_or_default(),
        };
        let sessions = &capabilities.session_capabilities;
        self.choices.settings_mut().close_supported = sessions.close.is_some();
        self.choices.settings_mut().directories_supported =
            sessions.additional_directories.is_some();
        let Some(token) = token else {
            return self.new_acp_session();
        };
        let advertised = Advertised {
            resume: capabilities.session_capabilities.resume.is_some(),
            load: capabilities.load_session,
        };
        if let Some(opening) = self.stage.opening() {
            opening.load_offered = advertised.load;
        }
        match self.profile.restore_method(advertised) {
            Some(RestoreMethod::Resume) => self.restore(false, token),
            Some(RestoreMethod::Load) => self.restore(true, token),
            // Nothing to restore with: a fresh session (with the history, when the
            // profile injects it); the token is of no use to this agent.
            None => {
                self.forget_token().await;
                self.new_acp_session();
            }
        }
    }

    /// The agent refused a step with ACP's "authentication required" (`-32000`): sends
    /// `authenticate` with the profile's choice among the offered methods, once per
    /// execution, and the step again after it. False when there is nothing to try.
    fn try_authenticate(&mut self, error: &RpcErrorBody, then: AfterAuth) -> bool {
        if error.code != Some(protocol::ErrorCode::AuthRequired.code()) {
            return false;
        }
        let Stage::Opening(opening) = &self.stage else { return false };
        if opening.authenticated {
            return false;
        }
        let inherited = |name: &str| std::env::var_os(name).is_some_and(|value| !value.is_empty());
        let Some(method) = self.profile.auth_method(&opening.auth_offered, inherited) else {
            return false;
        };
        let method = method.to_owned();
        tracing::info!(session = %self.row.id, %method, "the agent asks for authentication");
        self.recorder.progress(LaunchStep::Authenticating, Some(method.clone()));
        self.request(
            protocol::acp::method::AUTHENTICATE,
            requests::authenticate(&method),
            Pending::Authenticate { method, then },
        );
        true
    }

    fn new_acp_session(&mut self) {
        self.recorder.progress(LaunchStep::Opening, None);
        let mut params =
            json!({"cwd": self.row.workspace_path, "mcpServers": self.row.mcp_servers});
        self.add_directories(&mut params);
        self.request(protocol::acp::method::SESSION_NEW, params, Pending::NewSession);
    }

    /// The session's additional directories, to an agent that takes them; to one that does
    /// not, a notice (once per open) that it works in the workspace alone.
    fn add_directories(&mut self, params: &mut Value) {
        if self.row.additional_directories.is_empty() {
            return;
        }
        if self.choices.settings().directories_supported {
            params["additionalDirectories"] = json!(self.row.additional_directories);
        } else {
            self.recorder.emit(SessionEventKind::Notice {
                message: format!(
                    "the agent does not take additional directories; it is given the workspace alone, not {}",
                    self.row.additional_directories.join(", ")
                ),
            });
        }
    }

    /// A native restore was refused: the token is cleared, a notice says so, and a fresh
    /// ACP session takes its place (not a failure).
    pub(super) async fn restore_rejected(&mut self, reason: String) {
        let _ = self.context.store.log_error(self.row.id.clone(), reason.clone()).await;
        self.recorder.emit(SessionEventKind::Notice {
            message: format!("{reason}; starting a fresh agent session"),
        });
        self.forget_token().await;
        if let Some(resume) = self.stage.opening().and_then(|o| o.launch.resume.as_mut()) {
            resume.native_failed = true;
        }
        self.new_acp_session();
    }

    /// The stored token cannot restore anything for this agent: it is cleared.
    async fn forget_token(&mut self) {
        if let Some(execution) = &self.sidecar.execution {
            let _ = self
                .context
                .store
                .set_resume_token(self.row.id.clone(), execution.id.clone(), None)
                .await;
        }
        if let Some(resume) = self.stage.opening().and_then(|o| o.launch.resume.as_mut()) {
            resume.token = None;
        }
    }

    /// The ACP session is open (new or restored): record it, settle a resume's outcome,
    /// and send the initial prompt if there is one.
    pub(in crate::session) async fn session_opened(
        &mut self,
        acp_session: String,
        restored: Option<ResumeOutcome>,
    ) {
        let execution_id = self.sidecar.execution.as_ref().map(|execution| execution.id.clone());
        let resume = self.stage.opening().and_then(|opening| opening.launch.resume.take());
        let wake = resume.as_ref().is_some_and(|resume| resume.wake);
        let outcome = match resume {
            None => None,
            Some(resume) => Some(match restored {
                Some(outcome) => {
                    // Restored natively: the agent is told what changed meanwhile.
                    self.conversation.resume_context.get_or_insert(ResumeContext::Drift);
                    outcome
                }
                None if resume.handoff => {
                    self.conversation.resume_context = Some(ResumeContext::Handoff);
                    ResumeOutcome::ContextHandoff
                }
                None if resume.relaunched => ResumeOutcome::ResumeCommand,
                None if !self.recorder.history.is_empty()
                    && self.profile.injects_history(resume.native_failed) =>
                {
                    self.conversation.resume_context = Some(ResumeContext::History);
                    ResumeOutcome::HistoryInjection
                }
                None => ResumeOutcome::Fresh,
            }),
        };
        // One write: the token, the ACP session, `running`, and a resume's outcome.
        let opened = crate::store::Opened {
            resume_token: self.profile.keeps_resume_token().then(|| acp_session.clone()),
            acp_session_id: acp_session.clone(),
            outcome,
            inject_history: self.conversation.resume_context.is_some(),
        };
        // (Only an execution opens a session: there is always one here.)
        if let Some(execution_id) = execution_id
            && let Err(err) =
                self.context.store.record_opened(self.row.id.clone(), execution_id, opened).await
        {
            tracing::error!(session = %self.row.id, %err, "cannot record the opened session");
        }
        self.update_view(|view| view.acp_session_id = Some(acp_session));
        if let Err(err) =
            self.set_state(SessionState::WaitingForInput, None, Some(task_state::REVIEW)).await
        {
            tracing::error!(session = %self.row.id, %err, "cannot record the session state");
        }
        let launch = self.enter_open();
        let metrics = crate::metrics::get();
        if let Some(started) = launch.as_ref().map(|launch| launch.started) {
            let histogram =
                if outcome.is_some() { &metrics.resume_seconds } else { &metrics.launch_seconds };
            crate::metrics::observe(histogram, started.elapsed());
        }
        if let Some(launch) = launch.as_ref().filter(|_| wake) {
            metrics.wakeups.inc();
            crate::metrics::observe(&metrics.wake_seconds, launch.started.elapsed());
        }
        if let Some(outcome) = outcome {
            metrics
                .resumes
                .get_or_create(&crate::metrics::label("outcome", outcome.as_str()))
                .inc();
        }
        let answer = match outcome {
            Some(outcome) => {
                self.recorder.emit(SessionEventKind::ResumeOutcome { outcome });
                self.recorder.emit(SessionEventKind::Resumed { outcome });
                self.update_view(|view| view.resume_outcome = Some(outcome));
                outcome
            }
            None => ResumeOutcome::AlreadyRunning,
        };
        self.waits.opened(|| Ok(answer));
        if let Some(prompt) = launch
            .and_then(|launch| launch.initial_prompt)
            .filter(|prompt| !prompt.trim().is_empty())
        {
            self.send_initial_prompt(prompt).await;
        }
    }

    async fn clear_resume_context_pending(&mut self) {
        self.conversation.resume_context = None;
        if let Some(execution) = &self.sidecar.execution {
            let _ = self
                .context
                .store
                .set_resume_context_pending(self.row.id.clone(), execution.id.clone(), false)
                .await;
        }
    }

    /// The token is stored again when a turn completes (compare-and-set on the execution).
    async fn store_token_again(&self) {
        let acp_session = self.view_tx.borrow().acp_session_id.clone();
        if let (Some(execution), Some(acp_session)) = (&self.sidecar.execution, acp_session)
            && self.profile.keeps_resume_token()
        {
            let _ = self
                .context
                .store
                .set_resume_token(self.row.id.clone(), execution.id.clone(), Some(acp_session))
                .await;
        }
    }

    /// The agent can do nothing more (it exited, or closed its stdout): a launch fails; an
    /// open session's turn and questions end with `reason`, and the execution is retired.
    async fn agent_gone(&mut self, reason: String) {
        if let Some(execution) = self.sidecar.execution.as_mut() {
            execution.agent_running = false;
            let _ = self
                .context
                .store
                .set_execution_status(
                    self.row.id.clone(),
                    execution.id.clone(),
                    ExecutionStatus::Exited,
                )
                .await;
        }
        if matches!(self.phase(), Phase::Opening | Phase::Launching)
            || self.row.state == SessionState::Starting
        {
            return self.fail(format!("launch failed: {reason}")).await;
        }
        self.enter(Stage::Idle);
        self.execution_gone(&reason, TurnState::Failed).await;
        self.recorder.emit(SessionEventKind::Notice { message: reason });
        // What was handled is acknowledged before agentctl is let go.
        self.ack(true).await;
        if let Some(execution) = self.sidecar.execution.take() {
            self.retire(execution, None);
        }
        if self.row.state.is_terminal() {
            // A stopped session's teardown (replayed at recovery) ended with its agent.
            self.enter(Stage::Ended);
        }
    }

    /// ACP `usage_update`: the meter keeps it for snapshots and says what follows (a
    /// warning now; a handoff once the report is handled).
    fn usage_reported(&mut self, update: &Value) {
        let Some(report) = ContextReport::parse(update) else { return };
        let threshold = u64::from(self.profile.session.context_handoff_percent);
        let turn = self.conversation.turn.as_mut().map(|turn| &mut turn.usage);
        let warning = self.meter.on_report(&report, threshold, turn);
        let (used, size) = (report.used, report.size);
        self.update_view(|view| view.context = Some((used, size)));
        if let Some(ContextWarning { used, size, percent, threshold }) = warning {
            tracing::info!(session = %self.row.id, percent, threshold, "the agent's context nears the handoff threshold");
            self.recorder.emit(SessionEventKind::ContextWarning { used, size, percent, threshold });
        }
    }

    // ---- the agent's text ----------------------------------------------------------------

    /// Handles `raw` if it is a chunk of the agent's reply that needs nothing but its text
    /// (no replay being dropped, no primed session to tell apart); false if it is anything
    /// else, left to the general path ([`SessionActor::handle_acp`]).
    async fn agent_text_fast(&mut self, raw: &str) -> bool {
        if !matches!(self.conversation.replay, Replay::Off)
            || self.sidecar.execution.as_ref().is_some_and(|e| e.primed_session.is_some())
        {
            return false;
        }
        let Some((text, message_id)) = parse::agent_text(raw) else { return false };
        self.conversation.heard();
        self.agent_message_chunk(text, message_id);
        self.settings_updated().await;
        true
    }

    /// A chunk of the agent's reply: into the message being coalesced, and published.
    fn agent_message_chunk(&mut self, text: String, message_id: Option<String>) {
        if !self.recorder.recorded.history {
            if self.recorder.history.is_new_message(message_id.as_deref())
                && let Err(err) = self.recorder.history.flush_agent()
            {
                self.recorder.write_failed("the history", &err);
            }
            self.recorder.history.agent_chunk(&text, message_id.as_deref());
            self.bound_coalescing();
        }
        self.recorder.emit(SessionEventKind::AgentMessageChunk { text, message_id });
    }

    // ---- a native restore and its replay -------------------------------------------------

    /// Sends `session/load` (`load`) or `session/resume` for the stored `token`.
    fn restore(&mut self, load: bool, token: String) {
        let method = if load { "session/load" } else { "session/resume" };
        self.recorder.progress(LaunchStep::Restoring, Some(method.to_owned()));
        let mut params = json!({
            "sessionId": token,
            "cwd": self.row.workspace_path,
            "mcpServers": self.row.mcp_servers,
        });
        self.add_directories(&mut params);
        // Either may replay the conversation (a load must; some agents' resume does too,
        // fast-agent's as one message holding all of it): it is in our records already.
        self.conversation.replay = Replay::Loading(None);
        self.conversation.replayed_messages = load.then(String::new);
        if load {
            self.request(
                protocol::acp::method::SESSION_LOAD,
                params,
                Pending::Restore { load: true, token },
            );
            agentctl::fault::point("load.sent");
        } else {
            self.request(
                protocol::acp::method::SESSION_RESUME,
                params,
                Pending::Restore { load: false, token },
            );
        }
    }

    /// A `session/load` (`load`) or `session/resume` of `token` was answered.
    async fn restored(&mut self, load: bool, token: String, result: Result<Value, RpcErrorBody>) {
        // A load that worked keeps dropping its replay until the next prompt.
        if matches!(self.conversation.replay, Replay::Loading(_)) {
            self.conversation.replay = match result {
                Ok(_) => Replay::Loading(Some(Box::new(KnownConversation::of(
                    self.recorder.history_tail(REPLAY_WINDOW_BYTES).await,
                )))),
                Err(_) => Replay::Off,
            };
        }
        match result {
            Ok(answer) => {
                let outcome =
                    if load { ResumeOutcome::NativeLoad } else { ResumeOutcome::NativeResume };
                // A load's replay must never be replayed to us again after a restart
                // (a new actor would not know it was a replay and would record it):
                // everything up to its answer is acknowledged before the session is
                // recorded as open. A kill in between leaves it STARTING, and a
                // session caught starting is fenced and resumed, not re-attached.
                self.ack(true).await;
                if load {
                    self.check_replay().await;
                }
                self.opened_with(token, Some(outcome), &answer).await;
                agentctl::fault::point("load.opened");
            }
            Err(error)
                if self.try_authenticate(
                    &error,
                    AfterAuth::Restore { load, token: token.clone() },
                ) => {}
            // An agent that advertises `session/resume` without answering it (qwen-code
            // 0.15.10: "Method not found") is asked for a load, when it offers that.
            Err(error) if !load && error.code == Some(-32601) && self.stage.load_offered() => {
                self.recorder.emit(SessionEventKind::Notice {
                message: format!(
                    "the agent advertises session/resume but does not take it ({}); loading the session instead",
                    error.text()
                ),
            });
                self.restore(true, token);
            }
            Err(error) if matches!(error.code, Some(-32601) | Some(-32002)) => {
                self.restore_rejected(format!(
                    "the agent rejected the stored session: {}",
                    error.text()
                ))
                .await;
            }
            // Any other failure (gemini answers a load it cannot do with -32000)
            // is not the session's end either: a fresh session with the history.
            Err(error) => {
                self.restore_rejected(format!(
                    "restoring the stored session failed: {}",
                    error.text()
                ))
                .await
            }
        }
    }

    /// A load was answered: what its replay carried is held against the history. When the
    /// agent replayed messages but not the newest ones Tether recorded (an agent killed
    /// right after a turn may come back without it, or without its last answer: qwen-code
    /// writes that after the turn's end), what it lacks goes with the next prompt. A load
    /// that replayed no message (or replays after its answer, as gemini-cli does) cannot
    /// be checked, nor can a resume (it replays nothing).
    async fn check_replay(&mut self) {
        let Some(replayed) =
            self.conversation.replayed_messages.take().filter(|text| !text.trim().is_empty())
        else {
            return;
        };
        let entries = self.recorder.history_tail(REPLAY_WINDOW_BYTES).await;
        let Some((first_missing, lacking)) = parse::lacking(&entries, &replayed) else { return };
        self.conversation.resume_context =
            Some(ResumeContext::Missing { after: first_missing - 1 });
        self.recorder.emit(SessionEventKind::Notice {
            message: format!(
                "the agent's restored conversation lacks the last {lacking} message(s) Tether recorded; they go with the next prompt"
            ),
        });
    }
}
