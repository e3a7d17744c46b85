//! A session's changes on the wire (`task.session.changes`): every file its workspace
//! changed since the session's base commit, with its diff, and what a review did to each
//! (kept, reverted).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What happened to a changed file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Not in the base commit.
    Added,
    /// In the base commit, different now.
    Modified,
    /// In the base commit, gone now.
    Deleted,
}

/// One changed file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ChangedFile {
    /// Its path from the top of the repository.
    pub path: String,
    /// What happened to it.
    pub kind: ChangeKind,
    /// Lines added (absent for a binary file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additions: Option<u64>,
    /// Lines removed (absent for a binary file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletions: Option<u64>,
    /// Its content now: the git blob hash of the file (`-` once deleted). A keep names it,
    /// so that a file changed again after it was kept is shown again.
    pub content: String,
    /// Kept in a review (`task.session.changes.keep`) with the content it has now.
    pub kept: bool,
    /// Its unified diff against the base (`git diff` text); absent for a binary file or
    /// one whose diff is over the limit (see `omitted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
    /// Why the diff is not shown, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub omitted: Option<String>,
}

/// `task.session.changes`'s answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionChanges {
    /// The session.
    pub session_id: String,
    /// Whether its workspace is in a git repository (without one, no changes are known).
    pub repository: bool,
    /// The commit changes are counted from: the workspace's commit when the session
    /// started (its worktree's base), else its HEAD now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_commit: Option<String>,
    /// The changed files, by path; files that were uncommitted before the session started
    /// and still hold what they held then are not the session's changes and not listed.
    pub files: Vec<ChangedFile>,
    /// More files changed than are listed.
    pub truncated: bool,
    /// What could not be read, said plainly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `task.session.changes.revert`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ChangesReverted {
    /// The file reverted to its content in the base commit (removed if it had none).
    pub path: String,
    /// The ref that holds the workspace's files as they were before the revert (a commit
    /// whose first parent is the HEAD it had): nothing a revert takes away is lost.
    pub saved_ref: String,
    /// The commit `saved_ref` points at.
    pub saved_commit: String,
    /// The session's changes after the revert.
    pub changes: SessionChanges,
}
