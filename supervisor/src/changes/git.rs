//! The git a review needs: a workspace's diff against a commit with its untracked files
//! in it (marked intent-to-add in a scratch copy of the index, so neither the workspace's
//! index nor its objects change), and one file put back as the commit has it.

use std::path::{Path, PathBuf};

use super::ChangesError;

/// Git's empty tree: the base of a repository with no commit yet.
const EMPTY_TREE: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

/// The diff's options: whole hashes, no renames (each path stands alone, as a revert
/// does), plain output whatever the user's git config says.
const DIFF: [&str; 8] = [
    "diff",
    "--full-index",
    "--no-renames",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--src-prefix=a/",
    "--dst-prefix=b/",
];

async fn git(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<String, ChangesError> {
    crate::snapshot::git::git_with(dir, args, env).await.map_err(ChangesError::Git)
}

/// A workspace's repository: its top directory and the commit changes count from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repository {
    /// The top of the work tree.
    pub top: PathBuf,
    /// The base: `start` when the repository still has it, else HEAD, else the empty tree.
    pub base: String,
}

/// Finds `dir`'s repository and the base its changes count from (`start`: the commit
/// when the session started).
pub async fn repository(dir: &Path, start: Option<&str>) -> Result<Repository, ChangesError> {
    if !dir.is_dir() {
        return Err(ChangesError::WorkspaceGone(dir.display().to_string()));
    }
    if !crate::snapshot::git::in_repository(dir) {
        return Err(ChangesError::NotRepository(dir.display().to_string()));
    }
    let top = PathBuf::from(git(dir, &["rev-parse", "--show-toplevel"], &[]).await?.trim());
    let mut base = None;
    for name in start.into_iter().chain(["HEAD"]) {
        let commit = format!("{name}^{{commit}}");
        if let Ok(out) = git(&top, &["rev-parse", "--verify", "-q", &commit], &[]).await {
            base = Some(out.trim().to_owned());
            break;
        }
    }
    Ok(Repository { top, base: base.unwrap_or_else(|| EMPTY_TREE.to_owned()) })
}

/// The diff of the work tree against the base, untracked files (not ignored) in it:
/// `(numstat -z, patch)`.
pub async fn diff(repo: &Repository) -> Result<(String, String), ChangesError> {
    let git_dir =
        PathBuf::from(git(&repo.top, &["rev-parse", "--absolute-git-dir"], &[]).await?.trim());
    let scratch = git_dir.join(format!("tether-review-index-{}", uuid::Uuid::now_v7()));
    let index = ["rev-parse", "--path-format=absolute", "--git-path", "index"];
    let index = PathBuf::from(git(&repo.top, &index, &[]).await?.trim());
    if index.exists() {
        crate::rewind::git::copy_index(&index, &scratch).map_err(ChangesError::Git)?;
    }
    let scratch_text = scratch.display().to_string();
    let env = [("GIT_INDEX_FILE", scratch_text.as_str())];
    let read = async {
        git(&repo.top, &["add", "--intent-to-add", "--", "."], &env).await?;
        let mut numstat: Vec<&str> = DIFF.to_vec();
        numstat.extend(["-z", "--numstat", &repo.base, "--"]);
        let numstat = git(&repo.top, &numstat, &env).await?;
        let mut patch: Vec<&str> = DIFF.to_vec();
        patch.extend([repo.base.as_str(), "--"]);
        let patch = git(&repo.top, &patch, &env).await?;
        Ok((numstat, patch))
    }
    .await;
    let _ = std::fs::remove_file(&scratch);
    read
}

/// Puts `path` back as the base has it, in the work tree and the index (removes it when
/// the base has none), after saving the workspace's files on `saved_ref`; the saved commit.
pub async fn revert(
    repo: &Repository,
    path: &str,
    saved_ref: &str,
) -> Result<String, ChangesError> {
    let message = format!("tether: the workspace before {path} was reverted");
    let saved = crate::rewind::git::save(&repo.top, saved_ref, &message)
        .await
        .map_err(ChangesError::Git)?;
    let literal = format!(":(literal){path}");
    let in_base =
        git(&repo.top, &["cat-file", "-e", &format!("{}:{path}", repo.base)], &[]).await.is_ok();
    if in_base {
        let source = format!("--source={}", repo.base);
        git(&repo.top, &["restore", &source, "--staged", "--worktree", "--", &literal], &[])
            .await?;
    } else {
        git(&repo.top, &["rm", "-q", "--cached", "--ignore-unmatch", "--", &literal], &[]).await?;
        match std::fs::remove_file(repo.top.join(path)) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(ChangesError::Git(format!("removing {path}: {err}"))),
        }
    }
    Ok(saved)
}
