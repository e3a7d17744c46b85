//! ACP (Agent Client Protocol) v1 on top of the JSON-RPC peer: method names, the typed
//! schema, and tolerant parsing.
//!
//! The typed structs come from `agent-client-protocol-schema` (pinned exactly in the
//! workspace manifest) and are re-exported as [`schema`]. Real agents send fields,
//! `sessionUpdate` kinds and `_`-prefixed methods that a given schema version does not know,
//! so nothing here fails the connection on such input: [`parse`] returns
//! [`Parsed::Unknown`] with the raw JSON instead of an error, and callers decide.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::message::RpcError;

/// The ACP v1 schema types (`InitializeRequest`, `SessionNotification`, …).
pub use agent_client_protocol_schema::v1 as schema;

/// The protocol version we speak.
pub const PROTOCOL_VERSION: u16 = 1;

/// Method names, client → agent.
pub mod method {
    /// `initialize`
    pub const INITIALIZE: &str = "initialize";
    /// `authenticate`
    pub const AUTHENTICATE: &str = "authenticate";
    /// `session/new`
    pub const SESSION_NEW: &str = "session/new";
    /// `session/load`
    pub const SESSION_LOAD: &str = "session/load";
    /// `session/resume`
    pub const SESSION_RESUME: &str = "session/resume";
    /// `session/prompt`
    pub const SESSION_PROMPT: &str = "session/prompt";
    /// `session/cancel` (a notification)
    pub const SESSION_CANCEL: &str = "session/cancel";
    /// `session/fork` (unstable in the schema: a new session from an existing one's
    /// conversation, advertised as `sessionCapabilities.fork`)
    pub const SESSION_FORK: &str = "session/fork";
    /// `session/list`
    pub const SESSION_LIST: &str = "session/list";
    /// `session/close`
    pub const SESSION_CLOSE: &str = "session/close";
    /// `session/delete`
    pub const SESSION_DELETE: &str = "session/delete";
    /// `session/set_config_option`
    pub const SESSION_SET_CONFIG_OPTION: &str = "session/set_config_option";
    /// `session/set_mode`
    pub const SESSION_SET_MODE: &str = "session/set_mode";
    /// `_session/steering`: a message into the running turn, an extension that
    /// claude-agent-acp and codex-acp serve and advertise with `_meta.steering.supported`
    /// in their `initialize` answer (ACP's draft `session/inject` is the same idea).
    pub const SESSION_STEERING: &str = "_session/steering";
    /// `$/cancel_request` (a notification, either way)
    pub const CANCEL_REQUEST: &str = "$/cancel_request";
    /// `elicitation/create` (agent → client)
    pub const ELICITATION_CREATE: &str = "elicitation/create";
    /// `elicitation/complete` (agent → client notification)
    pub const ELICITATION_COMPLETE: &str = "elicitation/complete";
    /// `session/update` (agent → client notification)
    pub const SESSION_UPDATE: &str = "session/update";
    /// `session/request_permission` (agent → client)
    pub const SESSION_REQUEST_PERMISSION: &str = "session/request_permission";
    /// `fs/read_text_file` (agent → client)
    pub const FS_READ_TEXT_FILE: &str = "fs/read_text_file";
    /// `fs/write_text_file` (agent → client)
    pub const FS_WRITE_TEXT_FILE: &str = "fs/write_text_file";
}

/// A tolerant parse: the typed value when it fits, the raw JSON otherwise.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed<T> {
    /// The JSON matched `T`.
    Known(T),
    /// The JSON did not match `T` (a newer protocol, a vendor extension); kept as is.
    Unknown(Value),
}

/// Parses `value` as `T`, keeping the raw JSON when it does not fit.
pub fn parse<T: DeserializeOwned>(value: &Value) -> Parsed<T> {
    match serde_json::from_value(value.clone()) {
        Ok(typed) => Parsed::Known(typed),
        Err(_) => Parsed::Unknown(value.clone()),
    }
}

/// Parses request params as `T`, or returns the `-32602` error to answer with.
pub fn params<T: DeserializeOwned>(params: Option<&Value>) -> Result<T, RpcError> {
    let value = params.cloned().unwrap_or(Value::Object(Default::default()));
    serde_json::from_value(value).map_err(RpcError::invalid_params)
}

/// Whether a method is an extension (`_`-prefixed) that may be ignored when unknown.
pub fn is_extension(method: &str) -> bool {
    method.starts_with('_')
}

/// The `sessionUpdate` discriminator of a `session/update` notification's params, if any.
pub fn session_update_kind(params: &Value) -> Option<&str> {
    params.get("update")?.get("sessionUpdate")?.as_str()
}

/// The text of a prompt: every text block, joined by newlines. Other blocks are skipped.
pub fn prompt_text(prompt: &[schema::ContentBlock]) -> String {
    let texts: Vec<&str> = prompt
        .iter()
        .filter_map(|block| match block {
            schema::ContentBlock::Text(text) => Some(text.text.as_str()),
            _ => None,
        })
        .collect();
    texts.join("\n")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn unknown_session_update_kinds_are_kept_raw() {
        let raw = json!({"sessionId": "s1", "update": {"sessionUpdate": "hologram", "x": 1}});
        assert_eq!(session_update_kind(&raw), Some("hologram"));
        assert_eq!(parse::<schema::SessionNotification>(&raw), Parsed::Unknown(raw.clone()));
        let known = json!({"sessionId": "s1", "update": {"sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": "hi"}, "future": true}, "alsoFuture": 1});
        match parse::<schema::SessionNotification>(&known) {
            Parsed::Known(notification) => match notification.update {
                schema::SessionUpdate::AgentMessageChunk(chunk) => {
                    assert_eq!(
                        chunk.content,
                        schema::ContentBlock::Text(schema::TextContent::new("hi"))
                    )
                }
                other => panic!("wrong update {other:?}"),
            },
            Parsed::Unknown(raw) => panic!("unknown fields must not fail the parse: {raw}"),
        }
    }

    #[test]
    fn typed_params_report_invalid_params() {
        let err = params::<schema::PromptRequest>(Some(&json!({"sessionId": 5}))).unwrap_err();
        assert_eq!(err.code, crate::message::ErrorCode::InvalidParams);
        let ok: schema::PromptRequest =
            params(Some(&json!({"sessionId": "s", "prompt": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})))
                .unwrap();
        assert_eq!(prompt_text(&ok.prompt), "a\nb");
    }

    #[test]
    fn extension_methods_are_recognised() {
        assert!(is_extension("_zed/hello"));
        assert!(!is_extension("session/update"));
    }
}
