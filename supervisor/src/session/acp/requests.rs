//! The params of the ACP requests the client sends, built from the pinned schema's types
//! (`protocol::acp::schema`), so what an agent gets is what the schema says; the JSON-RPC
//! envelope and the request id are the actor's.

use protocol::acp::schema::{
    AuthenticateRequest, CancelNotification, ContentBlock, PromptRequest, TextContent,
};
use serde_json::Value;

/// A schema type as JSON (they serialize without fail: no map has non-string keys).
fn json(params: impl serde::Serialize) -> Value {
    serde_json::to_value(params).unwrap_or(Value::Null)
}

/// `session/prompt`: one text block.
pub(in crate::session) fn prompt(acp_session: &str, text: String) -> Value {
    let block = ContentBlock::Text(TextContent::new(text));
    json(PromptRequest::new(acp_session.to_owned(), vec![block]))
}

/// `_session/steering` with `text`, asking the agent to refuse (`promptRequired`) rather
/// than start a turn of its own when none runs: Tether records every turn it starts.
pub(in crate::session) fn steer(acp_session: &str, text: &str) -> Value {
    serde_json::json!({
        "sessionId": acp_session,
        "prompt": [{"type": "text", "text": text}],
        "_meta": {"steering": {"idleBehavior": "promptRequired"}},
    })
}

/// Whether an `initialize` answer advertises `_session/steering` (top-level
/// `_meta.steering.supported`, beside `agentCapabilities`).
pub(in crate::session) fn steering_advertised(initialize: &Value) -> bool {
    initialize.pointer("/_meta/steering/supported").and_then(Value::as_bool) == Some(true)
}

/// `session/cancel`.
pub(in crate::session) fn cancel(acp_session: &str) -> Value {
    json(CancelNotification::new(acp_session.to_owned()))
}

/// `authenticate` with the method the agent offered.
pub(in crate::session) fn authenticate(method: &str) -> Value {
    json(AuthenticateRequest::new(method.to_owned()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{authenticate, cancel, prompt};

    /// What agents got before these were typed, field for field.
    #[test]
    fn requests_are_the_schemas_and_what_agents_got_before() {
        assert_eq!(
            prompt("s1", "fix the bug".into()),
            json!({"sessionId": "s1", "prompt": [{"type": "text", "text": "fix the bug"}]})
        );
        assert_eq!(cancel("s1"), json!({"sessionId": "s1"}));
        assert_eq!(authenticate("api-key"), json!({"methodId": "api-key"}));
    }
}
