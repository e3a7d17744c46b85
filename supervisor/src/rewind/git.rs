//! The git a rewind needs: a commit of a workspace's files as they are (tracked and
//! untracked, ignored ones left out) made through a scratch index, so neither the
//! workspace's index nor its branch moves; and the return of a workspace to a commit and
//! the uncommitted files a checkpoint holds.

use std::path::{Path, PathBuf};

/// Who the commits Tether makes are by.
const IDENTITY: [(&str, &str); 4] = [
    ("GIT_AUTHOR_NAME", "Tether"),
    ("GIT_AUTHOR_EMAIL", "tether@localhost"),
    ("GIT_COMMITTER_NAME", "Tether"),
    ("GIT_COMMITTER_EMAIL", "tether@localhost"),
];

/// The snapshot's git runner, its output trimmed.
async fn git(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<String, String> {
    let out = crate::snapshot::git::git_with(dir, args, env).await?;
    Ok(out.trim().to_owned())
}

/// The repository's top directory.
async fn top(dir: &Path) -> Result<PathBuf, String> {
    Ok(PathBuf::from(git(dir, &["rev-parse", "--show-toplevel"], &[]).await?))
}

/// The commit `name` names, if any.
async fn resolve(dir: &Path, name: &str) -> Option<String> {
    git(dir, &["rev-parse", "--verify", "-q", &format!("{name}^{{commit}}")], &[]).await.ok()
}

/// Commits the workspace's files as they are, without touching its index or branch: the
/// commit's first parent is HEAD (when there is one), then `also` (when given).
async fn commit_files(dir: &Path, also: Option<&str>, message: &str) -> Result<String, String> {
    let top = top(dir).await?;
    let git_dir = PathBuf::from(git(&top, &["rev-parse", "--absolute-git-dir"], &[]).await?);
    let scratch = git_dir.join(format!("tether-index-{}", uuid::Uuid::now_v7()));
    let index = git(&top, &["rev-parse", "--path-format=absolute", "--git-path", "index"], &[])
        .await
        .map(PathBuf::from);
    // From a copy of the real index, `add` hashes only what changed since it was written.
    if let Ok(index) = index
        && index.exists()
    {
        copy_index(&index, &scratch)?;
    }
    let scratch_text = scratch.display().to_string();
    let with_index = [("GIT_INDEX_FILE", scratch_text.as_str())];
    let made = async {
        git(&top, &["add", "-A", "--", "."], &with_index).await?;
        let tree = git(&top, &["write-tree"], &with_index).await?;
        let mut args = vec!["commit-tree".to_owned(), tree, "-m".into(), message.into()];
        for parent in [resolve(&top, "HEAD").await, also.map(str::to_owned)].into_iter().flatten() {
            args.extend(["-p".to_owned(), parent]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        git(&top, &args, &IDENTITY).await
    }
    .await;
    let _ = std::fs::remove_file(&scratch);
    made
}

/// Copies a workspace's index to `scratch` with its modification time. Git trusts an
/// entry whose file has the size and time it recorded unless the entry is "racily clean"
/// (its file changed in the second the index was written, judged by the index file's own
/// time): a copy stamped now would let a same-size edit made in that second pass for
/// unchanged.
pub(crate) fn copy_index(index: &Path, scratch: &Path) -> Result<(), String> {
    let failed = |err: std::io::Error| format!("copying the index: {err}");
    std::fs::copy(index, scratch).map_err(failed)?;
    let modified = std::fs::metadata(index).and_then(|meta| meta.modified()).map_err(failed)?;
    let copy = std::fs::OpenOptions::new().write(true).open(scratch).map_err(failed)?;
    copy.set_modified(modified).map_err(failed)
}

/// Saves the workspace's files on `name` (a ref); the commit it points at.
pub async fn save(dir: &Path, name: &str, message: &str) -> Result<String, String> {
    let commit = commit_files(dir, None, message).await?;
    git(dir, &["update-ref", name, &commit], &[]).await?;
    Ok(commit)
}

/// A checkpoint of the workspace's uncommitted files, chained on the session's ref
/// (`refs/tether/checkpoints/<session>`: each one's second parent is the one before, so
/// none is collected while the ref lives); the commit, or why none was made.
pub async fn checkpoint(dir: &Path, session: &str) -> Result<String, String> {
    let name = format!("refs/tether/checkpoints/{session}");
    let before = resolve(dir, &name).await;
    let commit = commit_files(dir, before.as_deref(), "tether: checkpoint at a turn's end").await?;
    git(dir, &["update-ref", &name, &commit], &[]).await?;
    Ok(commit)
}

/// Returns the workspace to `commit` (its branch moves there; untracked files not ignored
/// are removed), then puts back the uncommitted files `checkpoint` holds, unstaged.
pub async fn restore(dir: &Path, commit: &str, checkpoint: Option<&str>) -> Result<(), String> {
    let top = top(dir).await?;
    git(&top, &["reset", "-q", "--hard", commit], &[]).await?;
    git(&top, &["clean", "-fdq"], &[]).await?;
    if let Some(checkpoint) = checkpoint {
        git(&top, &["read-tree", "-u", "--reset", checkpoint], &[]).await?;
        git(&top, &["reset", "-q"], &[]).await?;
    }
    Ok(())
}
