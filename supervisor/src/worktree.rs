//! A git worktree per session, made and removed with the `git` CLI.
//!
//! A worktree session works in `$TETHER_HOME/worktrees/<session id>`, on its own branch
//! `tether/<task slug>-<last 8 hex digits of the session id>` made from a base (a branch, or the
//! repository's `HEAD`). The branch is the durable part: a worktree directory that went
//! away is rebuilt from it, with the session's commits; deleting a session removes the
//! worktree and keeps the branch unless asked. Uncommitted work is never removed without
//! `force`.

use crate::ids::SessionId;
use std::path::{Path, PathBuf};

/// What went wrong with a worktree.
#[derive(Debug, thiserror::Error)]
pub enum WorktreeError {
    /// The path given as the repository is not in a git repository.
    #[error("{path} is not in a git repository: {detail}")]
    NotARepository {
        /// The path.
        path: String,
        /// What git said.
        detail: String,
    },
    /// The base to branch from does not name a commit.
    #[error("the base {base:?} is not a branch or commit of {repo}: {detail}")]
    BadBase {
        /// The base.
        base: String,
        /// The repository.
        repo: String,
        /// What git said.
        detail: String,
    },
    /// The session's branch no longer exists, so its worktree cannot be rebuilt.
    #[error(
        "the worktree {path} is gone and so is its branch {branch} in {repo}: nothing to rebuild it from"
    )]
    BranchGone {
        /// The worktree.
        path: String,
        /// The branch.
        branch: String,
        /// The repository.
        repo: String,
    },
    /// The worktree holds changes not committed (listed, at most 20).
    #[error("the worktree {path} has uncommitted changes ({}); commit them, or pass force", files.join(", "))]
    Uncommitted {
        /// The worktree.
        path: String,
        /// The changed paths.
        files: Vec<String>,
    },
    /// A git command failed.
    #[error("git {command} failed: {detail}")]
    Git {
        /// The command's arguments.
        command: String,
        /// Its stderr (or why it did not run).
        detail: String,
    },
}

/// A session's worktree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worktree {
    /// The repository's top-level directory.
    pub repo: PathBuf,
    /// The worktree directory.
    pub path: PathBuf,
    /// Its branch.
    pub branch: String,
}

/// Runs git in `dir` (writes allowed); its stdout, or git's stderr.
async fn git(dir: &Path, args: &[&str]) -> Result<String, WorktreeError> {
    let output = tokio::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "core.quotePath=false"])
        .args(args)
        .env("LC_ALL", "C")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|err| WorktreeError::Git {
            command: args.join(" "),
            detail: format!("cannot run git: {err}"),
        })?;
    if !output.status.success() {
        return Err(WorktreeError::Git {
            command: args.join(" "),
            detail: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim_end().to_owned())
}

/// The top-level directory of the repository `dir` is in.
pub async fn toplevel(dir: &Path) -> Result<PathBuf, WorktreeError> {
    git(dir, &["rev-parse", "--show-toplevel"]).await.map(PathBuf::from).map_err(|err| {
        WorktreeError::NotARepository { path: dir.display().to_string(), detail: detail(err) }
    })
}

fn detail(err: WorktreeError) -> String {
    match err {
        WorktreeError::Git { detail, .. } => detail,
        other => other.to_string(),
    }
}

/// The branch of a session's worktree: `tether/<slug of the task title>-<session id's
/// last 8 hex digits>` (a v7 id begins with its timestamp, so its end is what differs
/// between sessions made in the same moment; the slug is lowercase ASCII letters, digits
/// and dashes, at most 40; `task` when the title has none).
pub fn branch_name(task_title: &str, session_id: &SessionId) -> String {
    let mut slug = String::new();
    for ch in task_title.chars() {
        if ch.is_ascii_alphanumeric() {
            slug.push(ch.to_ascii_lowercase());
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
        if slug.len() >= 40 {
            break;
        }
    }
    let slug = slug.trim_end_matches('-');
    let slug = if slug.is_empty() { "task" } else { slug };
    let hex: Vec<char> = session_id.chars().filter(|c| *c != '-').collect();
    let short: String = hex[hex.len().saturating_sub(8)..].iter().collect();
    format!("tether/{slug}-{short}")
}

/// Makes `worktree.path` a new worktree of `worktree.repo` on a new branch from `base`.
pub async fn create(worktree: &Worktree, base: &str) -> Result<(), WorktreeError> {
    if base.trim().is_empty() || base.starts_with('-') {
        return Err(WorktreeError::BadBase {
            base: base.to_owned(),
            repo: worktree.repo.display().to_string(),
            detail: "not a branch or commit name".into(),
        });
    }
    let commit = format!("{base}^{{commit}}");
    git(&worktree.repo, &["rev-parse", "--verify", "-q", &commit]).await.map_err(|err| {
        WorktreeError::BadBase {
            base: base.to_owned(),
            repo: worktree.repo.display().to_string(),
            detail: match detail(err) {
                empty if empty.is_empty() => "no such branch or commit".into(),
                said => said,
            },
        }
    })?;
    let path = worktree.path.to_string_lossy();
    let _one_at_a_time = change_lock(&worktree.repo).await;
    git(&worktree.repo, &["worktree", "add", "-q", "-b", &worktree.branch, &path, base]).await?;
    Ok(())
}

/// One change of a repository's worktrees at a time (add, remove, prune, a branch's
/// deletion): git reads every worktree's metadata while it adds one, and fails on one that
/// another `worktree add` is half-way through writing ("failed to read …/commondir").
async fn change_lock(repo: &Path) -> tokio::sync::OwnedMutexGuard<()> {
    type Locks = std::sync::Mutex<
        std::collections::HashMap<PathBuf, std::sync::Arc<tokio::sync::Mutex<()>>>,
    >;
    static LOCKS: std::sync::LazyLock<Locks> = std::sync::LazyLock::new(Default::default);
    let lock = {
        let mut locks = LOCKS.lock().expect("UNWRAP: never poisoned");
        std::sync::Arc::clone(locks.entry(repo.to_owned()).or_default())
    };
    lock.lock_owned().await
}

/// Whether the branch exists in the repository.
pub async fn branch_exists(repo: &Path, branch: &str) -> bool {
    let reference = format!("refs/heads/{branch}");
    git(repo, &["rev-parse", "--verify", "-q", &reference]).await.is_ok()
}

/// What git knows of a worktree directory that has no session (found at recovery): its
/// repository (from its git common dir) and its branch.
pub async fn orphan(path: &Path) -> Result<Worktree, WorktreeError> {
    let common = git(path, &["rev-parse", "--path-format=absolute", "--git-common-dir"]).await?;
    let repo = Path::new(&common).parent().map(Path::to_path_buf).ok_or_else(|| {
        WorktreeError::NotARepository { path: path.display().to_string(), detail: common.clone() }
    })?;
    let branch = git(path, &["branch", "--show-current"]).await?;
    Ok(Worktree { repo, path: path.to_owned(), branch })
}

/// Rebuilds a worktree whose directory went away, from its branch (the session's commits
/// are on it). Git's record of the old directory is pruned first.
pub async fn restore(worktree: &Worktree) -> Result<(), WorktreeError> {
    if !branch_exists(&worktree.repo, &worktree.branch).await {
        return Err(WorktreeError::BranchGone {
            path: worktree.path.display().to_string(),
            branch: worktree.branch.clone(),
            repo: worktree.repo.display().to_string(),
        });
    }
    let _one_at_a_time = change_lock(&worktree.repo).await;
    git(&worktree.repo, &["worktree", "prune"]).await?;
    let path = worktree.path.to_string_lossy();
    git(&worktree.repo, &["worktree", "add", "-q", &path, &worktree.branch]).await?;
    Ok(())
}

/// The paths with uncommitted changes in the worktree (staged, unstaged or untracked);
/// empty when it is clean or gone.
pub async fn uncommitted(worktree: &Worktree) -> Result<Vec<String>, WorktreeError> {
    if !worktree.path.is_dir() {
        return Ok(Vec::new());
    }
    let out = git(&worktree.path, &["status", "--porcelain", "--untracked-files=all"]).await?;
    Ok(out.lines().filter_map(|line| line.get(3..)).map(str::to_owned).collect())
}

/// Deletes `branch` of `repo` if it exists (and is not checked out anywhere); whether it
/// did. A repository that is gone has nothing to delete.
pub async fn delete_branch(repo: &Path, branch: &str) -> Result<bool, WorktreeError> {
    if !repo.is_dir() || !branch_exists(repo, branch).await {
        return Ok(false);
    }
    let _one_at_a_time = change_lock(repo).await;
    git(repo, &["worktree", "prune"]).await?;
    git(repo, &["branch", "-D", branch]).await?;
    Ok(true)
}

/// Removes the worktree: refused with [`WorktreeError::Uncommitted`] when it holds
/// uncommitted work, unless `force`. The branch is deleted too when `delete_branch`
/// (forced: its commits may be on no other branch, which the caller asked for).
pub async fn remove(
    worktree: &Worktree,
    force: bool,
    delete_branch: bool,
) -> Result<(), WorktreeError> {
    let changed = uncommitted(worktree).await?;
    if !changed.is_empty() && !force {
        return Err(WorktreeError::Uncommitted {
            path: worktree.path.display().to_string(),
            files: changed.into_iter().take(20).collect(),
        });
    }
    let _one_at_a_time = change_lock(&worktree.repo).await;
    if worktree.path.is_dir() {
        let path = worktree.path.to_string_lossy();
        git(&worktree.repo, &["worktree", "remove", "--force", &path]).await?;
    } else {
        git(&worktree.repo, &["worktree", "prune"]).await?;
    }
    agentctl::fault::point("delete.worktree_removed");
    if delete_branch && branch_exists(&worktree.repo, &worktree.branch).await {
        git(&worktree.repo, &["branch", "-D", &worktree.branch]).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_names_are_safe_and_short() {
        let id = &SessionId::from("0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b");
        assert_eq!(branch_name("Fix the login bug!", id), "tether/fix-the-login-bug-2e3f4a5b");
        assert_eq!(branch_name("  ../..  ", id), "tether/task-2e3f4a5b");
        assert_eq!(branch_name("ünïcode only", id), "tether/n-code-only-2e3f4a5b");
        let long = branch_name(&"a".repeat(100), id);
        assert_eq!(long, format!("tether/{}-2e3f4a5b", "a".repeat(40)));
    }
}
