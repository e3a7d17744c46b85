//! Turns: a prompt's start and end, cancel, permission answers, and the prompts a restart
//! found undelivered.

use super::{
    CANCEL_GRACE, Instant, MAX_PROMPT_LINE, Outgoing, Pending, Phase, Reply, SessionActor,
    SessionError, SessionEventKind, SessionState, SnapshotTrigger, Turn, TurnState, Value, json,
    task_state,
};
use agents::profile::UsageReporting;
use protocol::api::PromptOrigin;

use crate::session::acp::requests;
use crate::session::record::TurnEnd;

/// How much of each stderr line shown while the agent is quiet is shown.
const QUIET_STDERR_CHARS: usize = 300;

/// What a new turn is, beyond its prompt.
pub(in crate::session) enum TurnKind {
    /// A prompt of a person or a client.
    Prompt,
    /// A person's retry of this turn: its prompt again.
    RetryOf(crate::ids::TurnId),
    /// Tether asking the agent for its summary before a pause.
    PauseSummary,
}

impl SessionActor {
    /// Starts a turn and queues its prompt; `reply` (if any) gets the turn id once the
    /// prompt reached agentctl, or the error. Returns the error too, for the caller's log.
    pub(in crate::session) async fn start_turn(
        &mut self,
        text: String,
        reply: Option<Reply<crate::ids::TurnId>>,
    ) -> Result<(), String> {
        self.start_turn_as(text, TurnKind::Prompt, reply).await
    }

    /// [`Self::start_turn`], for a turn of the given kind.
    pub(in crate::session) async fn start_turn_as(
        &mut self,
        text: String,
        kind: TurnKind,
        reply: Option<Reply<crate::ids::TurnId>>,
    ) -> Result<(), String> {
        match self.prepare_turn(text, kind).await {
            Ok((turn_id, message)) => {
                self.send(Outgoing::Prompt { message, turn_id, reply });
                Ok(())
            }
            Err(err) => {
                let text = err.to_string();
                if let Some(reply) = reply {
                    let _ = reply.send(Err(err));
                }
                Err(text)
            }
        }
    }

    /// Records a turn (row, history, events, state) and builds its `session/prompt`.
    pub(in crate::session) async fn prepare_turn(
        &mut self,
        text: String,
        kind: TurnKind,
    ) -> Result<(crate::ids::TurnId, Value), SessionError> {
        let (retry_of, origin) = match kind {
            TurnKind::Prompt => (None, PromptOrigin::User),
            TurnKind::RetryOf(turn_id) => (Some(turn_id), PromptOrigin::User),
            TurnKind::PauseSummary => (None, PromptOrigin::PauseSummary),
        };
        match self.row.state {
            SessionState::WaitingForInput => {}
            other => {
                return Err(SessionError::InvalidState(format!(
                    "the session is {}; prompts are taken in WAITING_FOR_INPUT",
                    other.as_str()
                )));
            }
        }
        if let Some(reason) = self.view_tx.borrow().settings_blocked.clone() {
            return Err(SessionError::SettingsNotRestored(reason));
        }
        let Some(execution) =
            self.sidecar.execution.as_ref().filter(|execution| execution.agent_running)
        else {
            return Err(SessionError::AgentGone("no execution".into()));
        };
        let execution_id = execution.id.clone();
        let Some(acp_session) = self.view_tx.borrow().acp_session_id.clone() else {
            return Err(SessionError::InvalidState("the ACP session is not open yet".into()));
        };
        let injected = self.conversation.resume_context.is_some();
        let sent_text = if injected { self.resume_context(&text).await? } else { text.clone() };
        let request_id = self.conversation.take_request_id();
        let message = json!({
            "jsonrpc": "2.0",
            "id": request_id,
            "method": protocol::acp::method::SESSION_PROMPT,
            "params": requests::prompt(&acp_session, sent_text),
        });
        // The agent's framing drops a line over its limit: the turn would never end.
        let size = serde_json::to_vec(&message).map_or(usize::MAX, |line| line.len() + 1);
        if size > MAX_PROMPT_LINE {
            return Err(SessionError::InvalidParams {
                field: "prompt",
                message: format!(
                    "the prompt is {size} bytes as a JSON-RPC line, over the agent's {MAX_PROMPT_LINE}-byte line limit"
                ),
            });
        }
        let turn_id = crate::ids::TurnId::new(uuid::Uuid::now_v7().to_string());
        // The turn and its request id are durable before the request leaves.
        self.context
            .store
            .insert_turn(
                turn_id.clone(),
                self.row.id.clone(),
                execution_id,
                request_id.to_string(),
                (text.clone(), retry_of),
            )
            .await?;
        agentctl::fault::point("prompt.recorded");
        self.recorder.record_prompt(text.clone(), turn_id.clone());
        self.recorder.emit(SessionEventKind::TurnStarted {
            turn_id: turn_id.to_string(),
            prompt: text,
            origin,
        });
        self.conversation.turn = Some(Turn {
            id: turn_id.clone(),
            cancel_at: None,
            deadline: self
                .profile
                .process
                .turn_timeout_ms
                .map(|ms| Instant::now() + std::time::Duration::from_millis(ms)),
            usage: crate::store::TurnUsage::default(),
            heard: false,
        });
        self.conversation.quiet_again(false);
        self.set_state(SessionState::Running, None, Some(task_state::IN_PROGRESS)).await?;
        self.update_view(|view| view.turn_id = Some(turn_id.clone()));
        self.conversation
            .pending
            .insert(request_id.to_string(), Pending::Prompt { turn_id: turn_id.clone(), injected });
        Ok((turn_id, message))
    }

    /// A line the agent wrote on stderr while it is quiet, cut to `QUIET_STDERR_CHARS`.
    /// While it starts, the line is the detail of the launch step it waits in (a
    /// `progress` event of that step, "the agent says: …", which clients show as that
    /// step's one line, updated: claude-agent-acp prints a dozen debug lines at every
    /// resume), at most `MAX_QUIET_STDERR` per execution. While a turn has produced
    /// nothing yet (an agent retrying a refused request says nothing else for minutes), it
    /// is a notice, at most `MAX_QUIET_STDERR` per turn.
    pub(in crate::session) fn stderr_while_quiet(&mut self, line: &str) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        let said =
            || format!("the agent says: {}", crate::history::excerpt(line, QUIET_STDERR_CHARS));
        if let Some(step) = self.stage.launch_step() {
            // Counted per execution: its generation keys the count (a turn's start, or
            // another execution's first line, begins a new one).
            if self.conversation.show_starting_stderr(self.recorder.generation()) {
                self.recorder.progress(step, Some(said()));
            }
            return;
        }
        let starting = matches!(self.phase(), Phase::Launching | Phase::Opening);
        if !self.conversation.show_quiet_stderr(starting) {
            return;
        }
        self.recorder.emit(SessionEventKind::Notice { message: said() });
    }

    pub(in crate::session) async fn cancel(&mut self) -> Result<(), SessionError> {
        let Some(turn) = self.conversation.turn.as_mut() else {
            return Err(SessionError::InvalidState("no turn is running".into()));
        };
        // The agent ends the turn with `cancelled`; if it does not, we do.
        turn.cancel_at.get_or_insert(Instant::now() + CANCEL_GRACE);
        // (A turn runs only on an open ACP session.)
        if let Some(acp_session) = self.view_tx.borrow().acp_session_id.clone() {
            self.send(Outgoing::Acp(json!({
                "jsonrpc": "2.0",
                "method": protocol::acp::method::SESSION_CANCEL,
                "params": requests::cancel(&acp_session),
            })));
        }
        self.cancel_pending_permissions().await;
        Ok(())
    }

    pub(in crate::session) async fn cancel_pending_permissions(&mut self) {
        let pending =
            self.context.store.list_pending(self.row.id.clone()).await.unwrap_or_default();
        for (request_id, method, _) in pending {
            if self.conversation.answering.contains_key(&request_id) {
                continue;
            }
            if let Err(err) = self
                .answer_permission(&request_id, &method, crate::session::cancelled_answer(&method))
                .await
            {
                tracing::warn!(session = %self.row.id, %err, "cannot cancel a permission request");
            }
        }
    }

    /// The agent withdrew a question of its own (`$/cancel_request` of its request): it
    /// resolves as cancelled, and nothing is sent back (the agent wants no answer).
    pub(in crate::session) async fn question_withdrawn(&mut self, agent_id: &Value) {
        let request_id =
            crate::session::permission_request_id(self.recorder.generation(), agent_id);
        let pending = self.context.store.list_pending(self.row.id.clone()).await;
        let Some((_, method, _)) =
            pending.unwrap_or_default().into_iter().find(|(id, _, _)| *id == request_id)
        else {
            return;
        };
        let answer = crate::session::cancelled_answer(&method);
        let outcome = answer.get("outcome").cloned().unwrap_or(answer);
        self.conversation.answering.remove(&request_id);
        self.recorder
            .emit(SessionEventKind::PermissionResolved { request_id: request_id.clone(), outcome });
        self.recorder.flush_events();
        if let Err(err) = self.context.store.delete_pending(self.row.id.clone(), request_id).await {
            self.recorder.write_failed("a withdrawn question", &err);
        }
    }

    /// Queues the answer (`result`, the JSON-RPC result) to a question of the agent (a
    /// permission or an elicitation); its row is deleted (and `permission_resolved`
    /// published) only once it reached agentctl, so an answer cut off by a kill is asked
    /// again after a restart.
    pub(in crate::session) async fn answer_permission(
        &mut self,
        request_id: &str,
        method: &str,
        result: Value,
    ) -> Result<(), SessionError> {
        let pending = self.context.store.list_pending(self.row.id.clone()).await?;
        let Some((_, asked, _)) = pending.iter().find(|(id, _, _)| id == request_id) else {
            return Err(SessionError::NoSuchRequest(request_id.to_owned()));
        };
        if asked != method {
            return Err(SessionError::InvalidParams {
                field: "request_id",
                message: format!("request {request_id} is a {asked} request, not a {method} one"),
            });
        }
        // Asked by this execution's agent (its generation leads the id), or not at all.
        let current = crate::session::permission_request_generation(request_id)
            .is_none_or(|generation| generation == self.recorder.generation());
        if !current || self.conversation.answering.contains_key(request_id) {
            return Err(SessionError::NoSuchRequest(request_id.to_owned()));
        }
        if self.sidecar.execution.as_ref().is_none_or(|execution| !execution.agent_running) {
            return Err(SessionError::AgentGone("the agent that asked is not running".into()));
        }
        let id = crate::session::agent_request_id(request_id);
        agentctl::fault::point("permission.queued");
        self.send(Outgoing::Answer {
            request_id: request_id.to_owned(),
            message: json!({"jsonrpc": "2.0", "id": id, "result": result.clone()}),
        });
        self.conversation.answering.insert(request_id.to_owned(), result);
        Ok(())
    }

    pub(in crate::session) async fn end_turn(
        &mut self,
        state: TurnState,
        stop_reason: Option<String>,
        error: Option<String>,
    ) {
        let Some(Turn { id: turn_id, mut usage, .. }) = self.conversation.end_turn() else {
            return;
        };
        if usage.context.is_none() {
            usage.context = self.meter.context();
        }
        if state == TurnState::Failed {
            self.recorder.history.mark_cut(error.as_deref().unwrap_or("the turn failed"));
        }
        if let Err(err) = self.recorder.history.flush_agent() {
            self.recorder.write_failed("the history", &err);
        }
        // Events first (the turn's end, then the state it leads to), then one store write
        // for both (see `SessionRecord::end_turn`).
        let waiting = SessionState::WaitingForInput;
        let then = (!self.row.state.is_terminal()
            && (self.row.state != waiting || self.row.error_message != error))
            .then(|| (waiting, error.clone(), Some(task_state::REVIEW)));
        let end = TurnEnd { turn_id, state, stop_reason, error, then: then.clone() };
        for kind in end.events() {
            self.recorder.emit(kind);
        }
        self.update_view(|view| view.turn_id = None);
        self.recorder.flush_events();
        let output = (state == TurnState::Completed).then(|| crate::store::TurnOutput {
            text: self.recorder.history.final_message(),
            usage: self.meter.usage().and_then(|usage| {
                let step = protocol::api::StepUsage {
                    context_used: usage.context_used,
                    context_size: usage.context_size,
                    cost: usage.cost,
                    cost_currency: usage.cost_currency.clone(),
                };
                serde_json::to_string(&step).ok()
            }),
        });
        match self.recorder.record.end_turn(end, output, usage.clone()).await {
            Ok(()) => {
                if let Some((state, error, _)) = then {
                    self.row.state = state;
                    self.row.error_message = error.clone();
                    self.update_view(|view| {
                        view.state = state;
                        view.error = error;
                    });
                }
            }
            Err(err) => self.recorder.write_failed("the end of a turn", &err),
        }
        agentctl::fault::point("turn.recorded");
        let per_turn = self.profile.session.usage_totals == UsageReporting::PerTurn;
        crate::session::meter::count_turn(&self.row.agent_profile_id, per_turn, &usage);
        self.check_limits(&usage).await;
        if state == TurnState::Completed {
            self.snapshot_in_background(SnapshotTrigger::TurnComplete, None);
        }
    }

    /// After a re-attach, once the replay has passed what agentctl held when we connected:
    /// a turn whose prompt was never delivered will never end, so it fails now, saying so.
    pub(in crate::session) async fn settle_undelivered(&mut self) {
        self.sidecar.catch_up.until = None;
        if std::mem::take(&mut self.sidecar.catch_up.holding) {
            // Caught up after a stall: the agent's output is taken in again.
            self.send(Outgoing::Hold(false));
        }
        let deferred = std::mem::take(&mut self.sidecar.catch_up.deferred);
        let undelivered: Vec<(String, crate::ids::TurnId)> =
            self.sidecar.catch_up.undelivered.drain().collect();
        let first_prompt = self.unsent_initial_prompt().await;
        for (request_id, turn_id) in undelivered {
            // The create's prompt was acknowledged: sent again under the same request, so it
            // runs once and is recorded once. Any other prompt's caller had no answer yet.
            if let Some(prompt) = &first_prompt
                && self.conversation.turn_id() == Some(turn_id.as_str())
                && self.resend_prompt(&request_id, &turn_id, prompt)
            {
                continue;
            }
            self.conversation.pending.remove(&request_id);
            let error =
                "the supervisor stopped before this prompt reached the agent; send it again";
            if self.conversation.turn_id() == Some(turn_id.as_str()) {
                self.end_turn(TurnState::Failed, None, Some(error.into())).await;
            } else if let Err(err) = self
                .context
                .store
                .end_turn(turn_id, TurnState::Failed, None, Some(error.into()))
                .await
            {
                self.recorder.write_failed("the end of a turn", &err);
            }
        }
        self.send_unsent_initial_prompt().await;
        for (text, reply) in deferred {
            if let Err(err) = self.start_turn(text, Some(reply)).await {
                tracing::debug!(session = %self.row.id, %err, "prompt refused");
            }
        }
    }

    /// Sends a recorded turn's prompt that never reached the agent again, under its own
    /// request id; false when it cannot be (no agent, no ACP session, a resume context).
    pub(in crate::session) fn resend_prompt(
        &mut self,
        request_id: &str,
        turn_id: &crate::ids::TurnId,
        prompt: &str,
    ) -> bool {
        let running =
            self.sidecar.execution.as_ref().is_some_and(|execution| execution.agent_running);
        let acp_session = self.view_tx.borrow().acp_session_id.clone();
        let injected = matches!(
            self.conversation.pending.get(request_id),
            Some(Pending::Prompt { injected: true, .. })
        );
        let (Some(acp_session), Ok(id), true, false) =
            (acp_session, request_id.parse::<i64>(), running, injected)
        else {
            return false;
        };
        let message = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": protocol::acp::method::SESSION_PROMPT,
            "params": requests::prompt(&acp_session, prompt.to_owned()),
        });
        tracing::info!(session = %self.row.id, turn = %turn_id, "sending the first prompt again: it never reached the agent");
        if self.recorder.history.is_empty() {
            // Killed before the turn's start was written (see `prepare_turn`).
            self.recorder.record_prompt(prompt.to_owned(), turn_id.clone());
            self.recorder.emit(SessionEventKind::TurnStarted {
                turn_id: turn_id.to_string(),
                prompt: prompt.to_owned(),
                origin: PromptOrigin::User,
            });
        }
        self.send(Outgoing::Prompt { message, turn_id: turn_id.to_owned(), reply: None });
        true
    }

    /// The prompt the session was created with (its task's description when it was
    /// created without one), while no prompt of it ever reached an agent: an acknowledged
    /// create runs it exactly once, across kills and failed launches.
    pub(in crate::session) async fn unsent_initial_prompt(&self) -> Option<String> {
        let prompt = self.row.initial_prompt.clone().filter(|prompt| !prompt.trim().is_empty())?;
        match self.context.store.prompt_delivered(self.row.id.clone()).await {
            Ok(false) => Some(prompt),
            Ok(true) => None,
            Err(err) => {
                tracing::error!(session = %self.row.id, %err, "cannot tell whether the initial prompt ran");
                None
            }
        }
    }

    /// After a re-attach settled: a create cut short between the agent's start and its
    /// first prompt's delivery has its prompt sent now (once the replay caught up).
    pub(in crate::session) async fn send_unsent_initial_prompt(&mut self) {
        let ready =
            self.sidecar.execution.as_ref().is_some_and(|execution| execution.agent_running)
                && self.phase() == Phase::Open
                && self.conversation.turn.is_none()
                && self.sidecar.catch_up.until.is_none()
                && self.row.state == SessionState::WaitingForInput;
        if !ready {
            return;
        }
        if let Some(prompt) = self.unsent_initial_prompt().await {
            self.send_initial_prompt(prompt).await;
        }
    }

    /// Sends the prompt a launch sends by itself. Refused, it is said, and recorded: what
    /// waits for it (a workflow step) learns that it will not come, and why.
    pub(in crate::session) async fn send_initial_prompt(&mut self, prompt: String) {
        let err = match self.prepare_turn(prompt, TurnKind::Prompt).await {
            Ok((turn_id, message)) => {
                self.send(Outgoing::Prompt { message, turn_id, reply: None });
                return;
            }
            Err(err) => err,
        };
        self.recorder.emit(SessionEventKind::Notice {
            message: format!("the initial prompt could not be sent: {err}"),
        });
        // Too long for the agent's line: so it would be anywhere. Anything else is about
        // this session (its settings, its agent, its state).
        let lasting = matches!(err, SessionError::InvalidParams { .. });
        let refusal = crate::store::PromptRefusal { reason: err.to_string(), lasting };
        if let Err(err) = self.context.store.refuse_prompt(self.row.id.clone(), refusal).await {
            tracing::error!(session = %self.row.id, %err, "cannot record a refused first prompt");
        }
    }

    pub(in crate::session) fn fail_waiters(&mut self, reason: &str) {
        self.sidecar.drop_replay(reason);
        self.waits.opened(|| Err(SessionError::InvalidState(reason.to_owned())));
    }
}
