//! From the daemon's records to the API's wire types (`protocol::api`): the store's rows
//! and enums, the history file's entries. The two sides are separate types so a column can
//! change without the API changing, and bookkeeping (profile snapshots, agentctl marks)
//! stays inside.

use protocol::api;

use crate::history::{EntryType, HistoryEntry};
use crate::store::{ResumeOutcome, SessionRow, SessionState, Task, TurnState};

/// `$from` and `$to` have the same variants; `From` maps each to its namesake.
macro_rules! same_variants {
    ($from:ty => $to:ty { $($variant:ident),+ $(,)? }) => {
        impl From<$from> for $to {
            fn from(value: $from) -> $to {
                match value {
                    $(<$from>::$variant => <$to>::$variant,)+
                }
            }
        }
    };
}

same_variants!(SessionState => api::SessionState {
    Created, Starting, Running, WaitingForInput, Completed, Failed, Cancelled, Paused,
});
same_variants!(api::SessionState => SessionState {
    Created, Starting, Running, WaitingForInput, Completed, Failed, Cancelled, Paused,
});
same_variants!(TurnState => api::TurnState { Running, Completed, Failed, Interrupted });
same_variants!(ResumeOutcome => api::ResumeOutcome {
    NativeResume, NativeLoad, ResumeCommand, HistoryInjection, ContextHandoff, Fresh, AlreadyRunning,
});
same_variants!(EntryType => api::EntryType { UserMessage, AgentMessage, ToolCall, ToolResult });

/// A profile's pinned restore method as the API names it.
pub fn restore_method(method: agents::profile::RestoreMethod) -> api::RestoreMethod {
    match method {
        agents::profile::RestoreMethod::Resume => api::RestoreMethod::Resume,
        agents::profile::RestoreMethod::Load => api::RestoreMethod::Load,
    }
}

/// A stored runtime name as the API carries it (any registered runtime's name).
pub fn runtime_kind(name: &str) -> api::RuntimeKind {
    api::RuntimeKind::named(name)
}

impl From<Task> for api::Task {
    fn from(task: Task) -> api::Task {
        api::Task {
            id: task.id,
            title: task.title,
            description: task.description,
            state: task.state,
            created_at: task.created_at,
            updated_at: task.updated_at,
        }
    }
}

impl From<SessionRow> for api::SessionSummary {
    fn from(row: SessionRow) -> api::SessionSummary {
        api::SessionSummary {
            runtime: runtime_kind(&row.runtime),
            id: row.id,
            task_id: row.task_id,
            agent_profile_id: row.agent_profile_id,
            state: row.state.into(),
            workspace_path: row.workspace_path,
            error_message: row.error_message,
            created_at: row.created_at,
            updated_at: row.updated_at,
            worktree_branch: row.worktree_branch,
        }
    }
}

impl From<HistoryEntry> for api::HistoryEntry {
    fn from(entry: HistoryEntry) -> api::HistoryEntry {
        api::HistoryEntry {
            seq: entry.seq,
            at: entry.at,
            kind: entry.kind.into(),
            role: entry.role,
            content: entry.content,
            tool_name: entry.tool_name,
            tool_call_id: entry.tool_call_id,
            tool_status: entry.tool_status,
        }
    }
}
