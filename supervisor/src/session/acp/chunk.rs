//! The agent's text, the bulk of what it sends: an `agent_message_chunk` notification read
//! straight into the few fields it carries, without building its JSON tree (the rest of
//! the agent's messages go through [`SessionActor::handle_acp`]).

use std::borrow::Cow;

use serde::Deserialize;

use super::{Replay, SessionActor, SessionEventKind};

/// `{"method": "session/update", "params": {"update": {"sessionUpdate": …, "content":
/// {"text": …}, "messageId": …}}}`, other members ignored.
#[derive(Deserialize)]
struct Notification<'a> {
    #[serde(borrow)]
    method: Cow<'a, str>,
    /// Present: a request, not this.
    #[serde(default)]
    id: Option<serde::de::IgnoredAny>,
    #[serde(borrow)]
    params: Params<'a>,
}

#[derive(Deserialize)]
struct Params<'a> {
    #[serde(borrow)]
    update: Update<'a>,
}

#[derive(Deserialize)]
struct Update<'a> {
    #[serde(borrow, rename = "sessionUpdate")]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    content: Content<'a>,
    #[serde(borrow, default, rename = "messageId")]
    message_id: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Content<'a> {
    #[serde(borrow)]
    text: Cow<'a, str>,
}

impl SessionActor {
    /// Handles `raw` if it is a chunk of the agent's reply that needs nothing but its text
    /// (no replay being dropped, no primed session to tell apart); false if it is anything
    /// else, left to the general path.
    pub(super) async fn agent_text_fast(&mut self, raw: &str) -> bool {
        if !matches!(self.conversation.replay, Replay::Off)
            || self.conversation.foreign_session.is_some()
        {
            return false;
        }
        let Ok(chunk) = serde_json::from_str::<Notification<'_>>(raw) else { return false };
        let update = chunk.params.update;
        if chunk.id.is_some()
            || chunk.method != protocol::acp::method::SESSION_UPDATE
            || update.kind != "agent_message_chunk"
        {
            return false;
        }
        self.heard();
        self.agent_message_chunk(
            update.content.text.into_owned(),
            update.message_id.map(Cow::into_owned),
        );
        self.settings_updated().await;
        true
    }

    /// The turn heard from its agent.
    pub(super) fn heard(&mut self) {
        if let Some(turn) = self.conversation.turn.as_mut() {
            turn.heard = true;
        }
    }

    /// A chunk of the agent's reply: into the message being coalesced, and published.
    pub(super) fn agent_message_chunk(&mut self, text: String, message_id: Option<String>) {
        if !self.recorder.recorded.history {
            if self.recorder.history.is_new_message(message_id.as_deref())
                && let Err(err) = self.recorder.history.flush_agent()
            {
                self.write_failed("the history", &err);
            }
            self.recorder.history.agent_chunk(&text, message_id.as_deref());
            self.bound_coalescing();
        }
        self.emit(SessionEventKind::AgentMessageChunk { text, message_id });
    }
}
