//! mock-agent's sessions: `session/new`, `session/load` (with its replay),
//! `session/resume`, and the settings a client changes with `session/set_config_option`
//! and `session/set_mode`.

use protocol::RpcError;
use protocol::acp::{self, schema};
use serde_json::{Value, json};

use super::settings::Settings;
use super::store::{self, Role, StoredSession};
use super::{Agent, LiveSession};

impl Agent {
    pub(super) fn new_session(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let request: schema::NewSessionRequest = acp::params(params)?;
        self.check_auth()?;
        let mut state = self.lock();
        let stored = match state.restored.take() {
            Some(restored) => restored,
            None => StoredSession {
                session_id: format!("mock-{}", uuid::Uuid::new_v4()),
                cwd: request.cwd,
                messages: Vec::new(),
                mcp_servers: store::mcp_names(&request.mcp_servers),
                closed: 0,
                additional_directories: request.additional_directories,
            },
        };
        self.store.save(&stored).map_err(RpcError::internal)?;
        let session_id = stored.session_id.clone();
        let settings = Settings::default();
        let answer = json!({"sessionId": session_id, "configOptions": settings.config_options(),
            "modes": settings.modes()});
        state.sessions.insert(
            session_id.clone(),
            LiveSession { stored, turn: None, steer: None, settings, then: None },
        );
        Ok(answer)
    }

    pub(super) fn load_session(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let request: schema::LoadSessionRequest = acp::params(params)?;
        let stored = self.restore(&request.session_id.0)?;
        if self.config.replay_with_next {
            self.lock().held_replay = Some(stored.clone());
        } else if self.config.late_replay {
            // As gemini-cli does: the replay is not awaited, and comes after the answer.
            self.lock().late_replay = Some(stored.clone());
        } else {
            // Replay the conversation before answering, as ACP requires.
            self.replay(&stored)?;
        }
        // What real agents also send while loading, and which is not part of the replay.
        self.update(
            &stored.session_id,
            json!({"sessionUpdate": "available_commands_update", "availableCommands": [
                {"name": "recall", "description": "list the earlier user messages"}
            ]}),
        )?;
        self.update(
            &stored.session_id,
            json!({"sessionUpdate": "session_info_update", "title": "mock session"}),
        )?;
        Ok(self.opened(stored))
    }

    pub(super) fn replay(&self, stored: &StoredSession) -> Result<(), RpcError> {
        for (index, message) in stored.messages.iter().enumerate() {
            let kind = match message.role {
                Role::User => "user_message_chunk",
                Role::Agent => "agent_message_chunk",
            };
            self.update(
                &stored.session_id,
                json!({"sessionUpdate": kind, "messageId": format!("m{index}"),
                       "content": {"type": "text", "text": message.text}}),
            )?;
        }
        Ok(())
    }

    pub(super) fn resume_session(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let request: schema::ResumeSessionRequest = acp::params(params)?;
        let stored = self.restore(&request.session_id.0)?;
        if self.config.replay_on_resume {
            let whole: Vec<&str> =
                stored.messages.iter().map(|message| message.text.as_str()).collect();
            self.update(
                &stored.session_id,
                json!({"sessionUpdate": "agent_message_chunk",
                       "content": {"type": "text", "text": whole.join("\n")}}),
            )?;
        }
        Ok(self.opened(stored))
    }

    /// `session/fork` (`--fork`): a new session whose conversation is a copy of the stored
    /// one's, answered with its id; the original is left as it was.
    pub(super) fn fork_session(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let params = params.ok_or_else(|| RpcError::invalid_params("session/fork needs params"))?;
        let source = params["sessionId"]
            .as_str()
            .ok_or_else(|| RpcError::invalid_params("session/fork needs a sessionId"))?;
        let mut stored = self.restore(source)?;
        stored.session_id = format!("mock-{}", uuid::Uuid::new_v4());
        if let Some(cwd) = params["cwd"].as_str() {
            stored.cwd = cwd.into();
        }
        stored.closed = 0;
        self.store.save(&stored).map_err(RpcError::internal)?;
        let session_id = stored.session_id.clone();
        let mut answer = self.opened(stored);
        answer["sessionId"] = json!(session_id);
        Ok(answer)
    }

    pub(super) fn restore(&self, session_id: &str) -> Result<StoredSession, RpcError> {
        self.check_auth()?;
        let not_found = || {
            RpcError::new(
                protocol::ErrorCode::ResourceNotFound,
                format!("unknown session {session_id}"),
            )
            .with_data(json!({"uri": session_id}))
        };
        if self.config.reject_load || !store::is_safe_id(session_id) {
            return Err(not_found());
        }
        if self.config.fail_load {
            return Err(RpcError::new(
                protocol::ErrorCode::Other(-32000),
                "Internal error: the stored session could not be restored",
            ));
        }
        if let Some(live) = self.lock().sessions.get(session_id) {
            return Ok(live.stored.clone());
        }
        match self.store.load(session_id) {
            Ok(Some(mut stored)) => {
                let keep = stored.messages.len().saturating_sub(self.config.forget_last_messages);
                stored.messages.truncate(keep);
                Ok(stored)
            }
            Ok(None) => Err(not_found()),
            Err(err) => Err(RpcError::internal(err)),
        }
    }

    /// A loaded or resumed session is live again, with default settings (nothing of them
    /// is remembered), which the answer reports.
    fn opened(&self, stored: StoredSession) -> Value {
        let settings = Settings::default();
        let answer = json!({"configOptions": settings.config_options(), "modes": settings.modes()});
        let live = LiveSession { stored, turn: None, steer: None, settings, then: None };
        self.lock().sessions.insert(live.stored.session_id.clone(), live);
        answer
    }

    /// `session/set_config_option`: answers with every option as it now stands.
    pub(super) fn set_config_option(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let request: schema::SetSessionConfigOptionRequest = acp::params(params)?;
        let value = match &request.value {
            schema::SessionConfigOptionValue::ValueId { value } => value.0.to_string(),
            other => {
                return Err(RpcError::invalid_params(format!("not a select value: {other:?}")));
            }
        };
        let mut state = self.lock();
        let live = live(&mut state.sessions, &request.session_id.0)?;
        live.settings.set_option(self.store.dir(), &request.config_id.0, &value)?;
        Ok(json!({"configOptions": live.settings.config_options()}))
    }

    /// `session/close`: the session is let go (its turn cancelled) and the close counted
    /// in its file; it can be loaded again.
    pub(super) fn close_session(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let request: schema::CloseSessionRequest = acp::params(params)?;
        let mut state = self.lock();
        let mut live = state.sessions.remove(request.session_id.0.as_ref()).ok_or_else(|| {
            RpcError::new(
                protocol::ErrorCode::ResourceNotFound,
                format!("unknown session {}", request.session_id.0),
            )
        })?;
        if let Some(turn) = live.turn.take() {
            turn.cancel();
        }
        live.stored.closed += 1;
        self.store.save(&live.stored).map_err(RpcError::internal)?;
        Ok(json!({}))
    }

    /// `session/set_mode`.
    pub(super) fn set_mode(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let request: schema::SetSessionModeRequest = acp::params(params)?;
        let mut state = self.lock();
        let live = live(&mut state.sessions, &request.session_id.0)?;
        live.settings.set_mode(self.store.dir(), &request.mode_id.0)?;
        Ok(json!({}))
    }
}

fn live<'a>(
    sessions: &'a mut std::collections::HashMap<String, LiveSession>,
    session_id: &str,
) -> Result<&'a mut LiveSession, RpcError> {
    sessions.get_mut(session_id).ok_or_else(|| {
        RpcError::new(
            protocol::ErrorCode::ResourceNotFound,
            format!("unknown session {session_id}"),
        )
    })
}

impl super::Turn<'_> {
    /// What `/settings` replies: the session's model and mode.
    pub(super) fn settings(&self) -> String {
        let state = self.agent.lock();
        state.sessions.get(self.session_id).map(|live| live.settings.describe()).unwrap_or_default()
    }
}

/// The form mock-agent's elicitations ask for.
fn elicitation(session_id: &str, message: &str) -> Value {
    json!({
        "mode": "form",
        "sessionId": session_id,
        "message": if message.is_empty() { "What is your name?" } else { message },
        "requestedSchema": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "title": "Name", "description": "What to call you"},
                "subscribe": {"type": "boolean", "title": "Subscribe", "default": false},
            },
            "required": ["name"],
        },
    })
}

impl super::Turn<'_> {
    /// `/elicit`: the answer, in words (`; elicited: accept {"name":"x"}`).
    pub(super) async fn elicit(&self, message: &str) -> Result<String, super::Stop> {
        let params = elicitation(self.session_id, message);
        Ok(match self.ask(acp::method::ELICITATION_CREATE, params).await? {
            Ok(answer) => {
                let action = answer["action"].as_str().unwrap_or("?");
                match answer.get("content") {
                    Some(content) => format!("; elicited: {action} {content}"),
                    None => format!("; elicited: {action}"),
                }
            }
            Err(error) => format!("; elicitation failed: {}", error.message),
        })
    }

    /// `/withdraw`: asks, then withdraws the question at once.
    pub(super) fn withdraw(&self) -> Result<String, super::Stop> {
        let peer = &self.agent.peer;
        let id = peer.next_id();
        let params = elicitation(self.session_id, "never mind");
        let failed = |err: protocol::PeerError| super::Stop::Failed(RpcError::internal(err));
        let pending = peer
            .send_request_with_id(id.clone(), acp::method::ELICITATION_CREATE, Some(params))
            .map_err(failed)?;
        peer.notify(acp::method::CANCEL_REQUEST, Some(json!({"requestId": id}))).map_err(failed)?;
        drop(pending);
        Ok("; asked, then withdrew the question".into())
    }
}
