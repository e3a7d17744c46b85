//! A small ACP client over an [`AgentProcess`], enough to script agents in tests: the
//! lifecycle calls, and a prompt that collects every update and answers the agent's
//! requests through a callback until the turn's response arrives.

use std::path::Path;

use protocol::acp::method;
use protocol::frame::Invalid;
use protocol::{Inbound, PeerError, Request, RpcError};
use serde_json::{Value, json};

use crate::{AgentProcess, within};

/// Everything that happened during one prompt.
#[derive(Debug)]
pub struct TurnRecord {
    /// The params of every `session/update`, in order.
    pub updates: Vec<Value>,
    /// The agent's requests (permission, fs…), in order.
    pub requests: Vec<Request>,
    /// Lines from the agent that were not valid messages.
    pub invalid: Vec<Invalid>,
    /// The prompt's response.
    pub result: Result<Value, PeerError>,
}

impl TurnRecord {
    /// The `sessionUpdate` kinds, in order.
    pub fn kinds(&self) -> Vec<String> {
        self.updates
            .iter()
            .filter_map(|update| protocol::acp::session_update_kind(update).map(str::to_owned))
            .collect()
    }

    /// The text of every `agent_message_chunk`, in order.
    pub fn chunks(&self) -> Vec<String> {
        chunk_texts(&self.updates, "agent_message_chunk")
    }

    /// The agent's reply: its chunks joined.
    pub fn reply(&self) -> String {
        self.chunks().concat()
    }

    /// The stop reason, failing the test if the prompt failed.
    pub fn stop_reason(&self) -> &str {
        match &self.result {
            Ok(result) => result["stopReason"].as_str().expect("a prompt result has a stopReason"),
            Err(err) => panic!("the prompt failed: {err}"),
        }
    }
}

/// The texts of the updates of one kind (`agent_message_chunk`, `user_message_chunk`).
pub fn chunk_texts(updates: &[Value], kind: &str) -> Vec<String> {
    updates
        .iter()
        .filter(|update| protocol::acp::session_update_kind(update) == Some(kind))
        .filter_map(|update| update["update"]["content"]["text"].as_str().map(str::to_owned))
        .collect()
}

impl AgentProcess {
    /// `initialize`, advertising the fs capability. Returns the result.
    pub async fn initialize(&self) -> Result<Value, PeerError> {
        let params = json!({
            "protocolVersion": 1,
            "clientCapabilities": {"fs": {"readTextFile": true, "writeTextFile": true}, "terminal": false},
            "clientInfo": {"name": "tether-tests", "version": "0"},
        });
        within("initialize", self.peer().request(method::INITIALIZE, Some(params))).await
    }

    /// `session/new` in `cwd`; returns the session id.
    pub async fn new_session(&self, cwd: &Path) -> Result<String, PeerError> {
        let params = json!({"cwd": cwd, "mcpServers": []});
        let result =
            within("session/new", self.peer().request(method::SESSION_NEW, Some(params))).await?;
        Ok(result["sessionId"].as_str().expect("session/new returns a sessionId").to_owned())
    }

    /// `session/load` (or `session/resume`, by `method`) of `session_id`; returns the
    /// updates replayed before the response, and the response.
    pub async fn restore_session(
        &mut self,
        method: &str,
        session_id: &str,
        cwd: &Path,
    ) -> (Vec<Value>, Result<Value, PeerError>) {
        let params = json!({"sessionId": session_id, "cwd": cwd, "mcpServers": []});
        let result = within(method, self.peer().request(method, Some(params))).await;
        // Everything sent before the response is already queued (the peer's ordering rule).
        let mut updates = Vec::new();
        while let Ok(item) = self.inbound.try_recv() {
            if let Inbound::Notification(notification) = item {
                updates.extend(notification.params);
            }
        }
        (updates, result)
    }

    /// `session/prompt` with `text`; answers agent requests with `on_request` and returns
    /// when the prompt's response arrives.
    pub async fn prompt(
        &mut self,
        session_id: &str,
        text: &str,
        on_request: impl FnMut(&Request) -> Result<Value, RpcError>,
    ) -> TurnRecord {
        let params = json!({"sessionId": session_id, "prompt": [{"type": "text", "text": text}]});
        let peer = self.peer().clone();
        let pending = peer
            .send_request_with_id(peer.next_id(), method::SESSION_PROMPT, Some(params))
            .expect("the connection is open");
        within("session/prompt", self.drive(pending.response(), on_request)).await
    }

    /// Collects inbound traffic until `response` resolves.
    pub async fn drive(
        &mut self,
        response: impl Future<Output = Result<Value, PeerError>>,
        mut on_request: impl FnMut(&Request) -> Result<Value, RpcError>,
    ) -> TurnRecord {
        let mut record = TurnRecord {
            updates: Vec::new(),
            requests: Vec::new(),
            invalid: Vec::new(),
            result: Ok(Value::Null),
        };
        let peer = self.peer().clone();
        let mut response = std::pin::pin!(response);
        let result = loop {
            tokio::select! {
                biased;
                result = &mut response => break result,
                item = self.inbound.recv() => match item {
                    Some(item) => handle(&peer, item, &mut record, &mut on_request),
                    None => break response.await,
                },
            }
        };
        while let Ok(item) = self.inbound.try_recv() {
            handle(&peer, item, &mut record, &mut on_request);
        }
        record.result = result;
        record
    }
}

fn handle(
    peer: &protocol::Peer,
    item: Inbound,
    record: &mut TurnRecord,
    on_request: &mut impl FnMut(&Request) -> Result<Value, RpcError>,
) {
    match item {
        Inbound::Notification(notification) if notification.method == method::SESSION_UPDATE => {
            record.updates.extend(notification.params)
        }
        Inbound::Notification(_) => {}
        Inbound::Request(request) => {
            let answer = on_request(&request);
            let _ = peer.respond(request.id.clone(), answer);
            record.requests.push(request);
        }
        Inbound::Invalid(invalid) => record.invalid.push(invalid),
    }
}

/// An `on_request` that refuses everything, for turns that should make no requests.
pub fn no_requests(request: &Request) -> Result<Value, RpcError> {
    panic!("unexpected agent request {} {:?}", request.method, request.params)
}
