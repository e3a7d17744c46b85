//! Restoring an agent's own session natively: `session/resume` or `session/load` of the
//! stored token, and what their answers lead to (the session open, another method, or a
//! fresh session with the history).

use serde_json::{Value, json};

use super::{
    AfterAuth, LaunchStep, Pending, Replay, ResumeOutcome, RpcErrorBody, SessionActor,
    SessionEventKind, Stage,
};

impl SessionActor {
    /// Sends `session/load` (`load`) or `session/resume` for the stored `token`.
    pub(super) fn restore(&mut self, load: bool, token: String) {
        let method = if load { "session/load" } else { "session/resume" };
        self.progress(LaunchStep::Restoring, Some(method.to_owned()));
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
    pub(super) async fn restored(
        &mut self,
        load: bool,
        token: String,
        result: Result<Value, RpcErrorBody>,
    ) {
        // A load that worked keeps dropping its replay until the next prompt.
        if matches!(self.conversation.replay, Replay::Loading(_)) {
            self.conversation.replay = match result {
                Ok(_) => Replay::Loading(Some(Box::new(self.known_conversation().await))),
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
            Err(error) if !load && error.code == Some(-32601) && self.load_offered() => {
                self.emit(SessionEventKind::Notice {
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

    /// Whether the agent being opened advertised `session/load` at `initialize`.
    fn load_offered(&self) -> bool {
        matches!(&self.stage, Stage::Opening(opening) if opening.load_offered)
    }
}
