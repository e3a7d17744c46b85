//! From the daemon's records to the API's wire types (`protocol::api`): the store's rows
//! and the history file's entries. Rows are separate types so a column can change without
//! the API changing, and bookkeeping (pinned profiles, agentctl marks) stays inside; the
//! enums (session and turn states, resume outcomes, entry types) have one definition, the
//! API's, which the store keeps by their wire names.

use protocol::api;

use crate::history::HistoryEntry;
use crate::store::{SessionRow, Task};

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
            id: row.id.into_string(),
            task_id: row.task_id,
            agent_profile_id: row.agent_profile_id,
            state: row.state,
            workspace_path: row.workspace_path,
            error_message: row.error_message,
            created_at: row.created_at,
            updated_at: row.updated_at,
            worktree_branch: row.worktree_branch,
            title: row.title,
            awaiting_permission: false,
        }
    }
}

impl From<HistoryEntry> for api::HistoryEntry {
    fn from(entry: HistoryEntry) -> api::HistoryEntry {
        entry.wire
    }
}
