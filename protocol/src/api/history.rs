//! A session's conversation history on the wire (`task.session.history`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::PlanEntry;

/// The kinds of history entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EntryType {
    /// What the user asked.
    UserMessage,
    /// What the agent answered (chunks coalesced into one message).
    AgentMessage,
    /// A tool the agent started.
    ToolCall,
    /// A tool's outcome.
    ToolResult,
    /// The agent's plan as it gave it (ACP `plan`: each one replaces the last); its entries
    /// in `plan`, and as lines of text in `content`.
    Plan,
}

wire_names!(EntryType {
    UserMessage => "user_message",
    AgentMessage => "agent_message",
    ToolCall => "tool_call",
    ToolResult => "tool_result",
    Plan => "plan",
});

/// One entry of a session's conversation history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HistoryEntry {
    /// From 1, without gaps.
    pub seq: u64,
    /// Unix ms.
    pub at: i64,
    /// The kind.
    #[serde(rename = "type")]
    pub kind: EntryType,
    /// `user`, `assistant` (agent messages and plans) or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
    /// The tool's title, for tool entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    /// The tool call id, for tool entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The tool's status, for tool entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_status: Option<String>,
    /// The message's id: an agent message's is the agent's ACP `messageId` (when it gave
    /// one), a user message's is its turn's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// A plan entry's plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Vec<PlanEntry>>,
    /// Part of a turn that was rewound (`task.session.rewind`): kept, but no longer part of
    /// the conversation. Set when the history is read, never written.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rewound: bool,
}
