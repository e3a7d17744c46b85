//! A workspace's git state, read with the `git` CLI (read-only: `GIT_OPTIONAL_LOCKS=0`, so
//! a snapshot never takes the index lock from an agent at work).

use std::path::Path;

use std::collections::BTreeMap;

use protocol::api::{GitDrift, GitState};

/// The most paths in one list of a [`GitState`].
pub const MAX_PATHS: usize = 200;
/// The most commits listed.
pub const MAX_COMMITS: usize = 20;

/// Runs git in `dir`; its stdout, or why it failed.
async fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    git_with(dir, args, &[]).await
}

/// [`git`] with `env` set too (a rewind's scratch index, the identity of its commits).
pub(crate) async fn git_with(
    dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<String, String> {
    let output = tokio::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "core.quotePath=false"])
        .args(args)
        .envs(env.iter().copied())
        .env("GIT_OPTIONAL_LOCKS", "0")
        .env("LC_ALL", "C")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|err| format!("cannot run git: {err}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!("git {} failed: {}", args.join(" "), stderr.trim()));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Whether `dir` is inside a git work tree, as far as a `.git` entry in it or an ancestor
/// says: a few `stat`s, so a workspace that is not a repository costs no git process.
/// (A repository named only by `GIT_DIR` is not seen.)
pub fn in_repository(dir: &Path) -> bool {
    dir.ancestors().any(|ancestor| ancestor.join(".git").exists())
}

/// The commit checked out in `dir`, if it is a repository with one.
pub async fn head(dir: &Path) -> Option<String> {
    if !in_repository(dir) {
        return None;
    }
    git(dir, &["rev-parse", "--verify", "-q", "HEAD"]).await.ok().map(|out| out.trim().to_owned())
}

/// What the uncommitted files of `dir` hold (their content hashes), tracked and untracked:
/// recorded at a session's start, so that what was dirty before the agent came is not
/// counted as its change while it stays as it was. Empty outside a repository.
pub async fn dirty(dir: &Path) -> BTreeMap<String, String> {
    if !in_repository(dir) {
        return BTreeMap::new();
    }
    let Ok(out) = git(dir, &["status", "--porcelain=v2", "--untracked-files=all"]).await else {
        return BTreeMap::new();
    };
    let status = parse_status(&out);
    let paths = capped(status.changed.into_iter().chain(status.untracked).collect());
    contents(dir, &paths).await.unwrap_or_default()
}

/// What `git status --porcelain=v2 --branch` says.
#[derive(Debug, Default, PartialEq, Eq)]
struct Status {
    head: Option<String>,
    branch: Option<String>,
    /// Tracked files with changes, staged or not.
    changed: Vec<String>,
    staged: Vec<String>,
    untracked: Vec<String>,
}

fn parse_status(out: &str) -> Status {
    let mut status = Status::default();
    for line in out.lines() {
        if let Some(oid) = line.strip_prefix("# branch.oid ") {
            status.head = (oid != "(initial)").then(|| oid.to_owned());
        } else if let Some(head) = line.strip_prefix("# branch.head ") {
            status.branch = (head != "(detached)").then(|| head.to_owned());
        } else if let Some(path) = line.strip_prefix("? ") {
            status.untracked.push(path.to_owned());
        } else if let Some(rest) = line.strip_prefix("1 ") {
            // `1 XY sub mH mI mW hH hI path`: the path is what follows the 7th space.
            if let Some(path) = rest.splitn(8, ' ').nth(7) {
                note_change(&mut status, rest, path);
            }
        } else if let Some(rest) = line.strip_prefix("2 ") {
            // `2 XY sub mH mI mW hH hI Xscore path<TAB>orig`.
            if let Some(paths) = rest.splitn(9, ' ').nth(8) {
                let path = paths.split('\t').next().unwrap_or(paths);
                note_change(&mut status, rest, path);
            }
        } else if let Some(rest) = line.strip_prefix("u ") {
            // `u XY sub m1 m2 m3 mW h1 h2 h3 path`.
            if let Some(path) = rest.splitn(10, ' ').nth(9) {
                status.changed.push(path.to_owned());
            }
        }
    }
    status
}

fn note_change(status: &mut Status, rest: &str, path: &str) {
    status.changed.push(path.to_owned());
    if !rest.starts_with('.') {
        status.staged.push(path.to_owned());
    }
}

fn capped(mut paths: Vec<String>) -> Vec<String> {
    paths.sort();
    paths.dedup();
    paths.truncate(MAX_PATHS);
    paths
}

/// The git state of `dir`, against `start` (the commit when the session started) and
/// `dirty_at_start` (what its uncommitted files held then: one that still holds it is no
/// change since the start). Not a repository, or no git: `repository: false`.
pub async fn state(
    dir: &Path,
    start: Option<&str>,
    dirty_at_start: &BTreeMap<String, String>,
) -> GitState {
    if !in_repository(dir) {
        return GitState::default();
    }
    let out =
        match git(dir, &["status", "--porcelain=v2", "--branch", "--untracked-files=all"]).await {
            Ok(out) => out,
            Err(_) => return GitState::default(),
        };
    let status = parse_status(&out);
    let mut state = GitState {
        repository: true,
        branch: status.branch,
        start_commit: start.map(str::to_owned),
        head_commit: status.head.clone(),
        dirty: !(status.changed.is_empty() && status.untracked.is_empty()),
        staged_files: capped(status.staged),
        ..GitState::default()
    };
    let mut errors = Vec::new();
    // Against the start when it is known (and still there), else against HEAD.
    let base = start.or(status.head.as_deref());
    let mut modified = status.changed.clone();
    if let Some(base) = base {
        match git(dir, &["diff", "--name-only", base, "--"]).await {
            Ok(out) => modified.extend(out.lines().map(str::to_owned)),
            Err(err) => errors.push(err),
        }
        match git(dir, &["diff", "--shortstat", base, "--"]).await {
            Ok(out) => state.diffstat = Some(out.trim().to_owned()).filter(|s| !s.is_empty()),
            Err(err) => errors.push(err),
        }
    }
    if let (Some(start), Some(_)) = (start, status.head.as_deref()) {
        let range = format!("{start}..HEAD");
        let count = format!("-n{MAX_COMMITS}");
        match git(dir, &["log", "--format=%h %s", &count, &range, "--"]).await {
            Ok(out) => state.commits_since_start = out.lines().map(str::to_owned).collect(),
            Err(err) => errors.push(err),
        }
    }
    let dirty = capped(status.changed.iter().chain(&status.untracked).cloned().collect());
    match contents(dir, &dirty).await {
        Ok(hashes) => state.dirty_hashes = hashes,
        Err(err) => errors.push(err),
    }
    modified.extend(status.untracked);
    let mut modified = capped(modified);
    let were_dirty: Vec<String> =
        modified.iter().filter(|path| dirty_at_start.contains_key(*path)).cloned().collect();
    match contents(dir, &were_dirty).await {
        Ok(now) => modified
            .retain(|path| dirty_at_start.get(path).is_none_or(|then| now.get(path) != Some(then))),
        Err(err) => errors.push(err),
    }
    state.modified_files = modified;
    if !errors.is_empty() {
        state.error = Some(errors.join("; "));
    }
    state
}

/// Files larger than this are not read to tell whether they changed (a snapshot is taken at
/// every turn's end): their size and modification time stand for their content.
const HASHED_BYTES: u64 = 16 << 20;

/// What the files at `paths` (relative to the top of `dir`'s repository, as git's status
/// and diffs name them) hold now: `git hash-object` of each, `-` for one that is not there,
/// `size N, modified T` for one over [`HASHED_BYTES`].
async fn contents(dir: &Path, paths: &[String]) -> Result<BTreeMap<String, String>, String> {
    if paths.is_empty() {
        return Ok(BTreeMap::new());
    }
    let top = git(dir, &["rev-parse", "--show-toplevel"]).await?;
    let top = Path::new(top.trim());
    let mut hashes: BTreeMap<String, String> = BTreeMap::new();
    let mut present: Vec<&String> = Vec::new();
    for path in paths {
        match std::fs::metadata(top.join(path.as_str())) {
            Ok(meta) if meta.is_file() && meta.len() > HASHED_BYTES => {
                use std::os::unix::fs::MetadataExt;
                let stamp =
                    format!("size {}, modified {}.{}", meta.len(), meta.mtime(), meta.mtime_nsec());
                hashes.insert(path.clone(), stamp);
            }
            Ok(meta) if meta.is_file() => present.push(path),
            _ => drop(hashes.insert(path.clone(), "-".to_owned())),
        }
    }
    if !present.is_empty() {
        let mut args = vec!["hash-object", "--"];
        args.extend(present.iter().map(|path| path.as_str()));
        let out = git(top, &args).await?;
        hashes.extend(present.into_iter().cloned().zip(out.lines().map(str::to_owned)));
    }
    Ok(hashes)
}

/// What the files at `paths` held in `commit`: their blobs, `-` for one it does not have.
async fn contents_at(
    dir: &Path,
    commit: &str,
    paths: &[String],
) -> Result<BTreeMap<String, String>, String> {
    let mut hashes: BTreeMap<String, String> =
        paths.iter().map(|path| (path.clone(), "-".to_owned())).collect();
    if paths.is_empty() {
        return Ok(hashes);
    }
    let mut args = vec!["ls-tree", "-r", "--full-tree", commit, "--"];
    args.extend(paths.iter().map(String::as_str));
    // `<mode> blob <hash>\t<path>`, for the paths the commit has.
    for line in git(dir, &args).await?.lines() {
        if let Some((meta, path)) = line.split_once('\t')
            && let Some(hash) = meta.split(' ').nth(2)
        {
            hashes.insert(path.to_owned(), hash.to_owned());
        }
    }
    Ok(hashes)
}

/// How `dir` changed since `before` (the git state snapshot `snapshot_id` recorded): HEAD
/// and branch moves, the commits since, and the files whose content is not what it was.
/// `None` when nothing changed, or it is not (or no longer) a repository.
pub async fn drift(dir: &Path, before: &GitState, snapshot_id: &str) -> Option<GitDrift> {
    if !before.repository || !in_repository(dir) {
        return None;
    }
    let out = git(dir, &["status", "--porcelain=v2", "--branch", "--untracked-files=all"]).await;
    let now = parse_status(&out.ok()?);
    let mut drift = GitDrift {
        snapshot_id: snapshot_id.to_owned(),
        head_before: before.head_commit.clone(),
        head_now: now.head.clone(),
        ..GitDrift::default()
    };
    if before.branch != now.branch {
        drift.branch_change = Some((before.branch.clone(), now.branch.clone()));
    }
    if let (Some(then), Some(head)) = (before.head_commit.as_deref(), now.head.as_deref())
        && then != head
    {
        let descends = git(dir, &["merge-base", "--is-ancestor", then, head]).await.is_ok();
        drift.head_rewound = !descends;
        if descends {
            let (range, count) = (format!("{then}..{head}"), format!("-n{MAX_COMMITS}"));
            let log = git(dir, &["log", "--format=%h %s", &count, &range, "--"]).await;
            drift.commits =
                log.map(|out| out.lines().map(str::to_owned).collect()).unwrap_or_default();
        }
    }
    // Candidates: what differs from the commit then (committed since or not), what is
    // untracked now, and what was uncommitted then.
    let mut candidates: Vec<String> = now.changed.iter().chain(&now.untracked).cloned().collect();
    candidates.extend(before.dirty_hashes.keys().cloned());
    if let Some(then) = before.head_commit.as_deref()
        && let Ok(out) = git(dir, &["diff", "--name-only", then, "--"]).await
    {
        candidates.extend(out.lines().map(str::to_owned));
    }
    let candidates = capped(candidates);
    let current = contents(dir, &candidates).await.ok()?;
    let clean_then: Vec<String> = candidates
        .iter()
        .filter(|path| !before.dirty_hashes.contains_key(*path))
        .cloned()
        .collect();
    let committed = match before.head_commit.as_deref() {
        Some(then) => contents_at(dir, then, &clean_then).await.ok()?,
        None => clean_then.iter().map(|path| (path.clone(), "-".to_owned())).collect(),
    };
    let was = |path: &String| before.dirty_hashes.get(path).or_else(|| committed.get(path));
    drift.changed_files =
        candidates.iter().filter(|path| was(path) != current.get(*path)).cloned().collect();
    let moved = drift.head_before != drift.head_now || drift.branch_change.is_some();
    (moved || !drift.changed_files.is_empty()).then_some(drift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn porcelain_v2_is_read() {
        let out = "# branch.oid 1234abcd\n# branch.head feature/x\n\
                   1 M. N... 100644 100644 100644 aa bb src/a b.rs\n\
                   1 .M N... 100644 100644 100644 aa bb README.md\n\
                   2 R. N... 100644 100644 100644 aa bb R100 new.rs\told.rs\n\
                   ? notes.txt\n";
        let status = parse_status(out);
        assert_eq!(status.head.as_deref(), Some("1234abcd"));
        assert_eq!(status.branch.as_deref(), Some("feature/x"));
        assert_eq!(status.changed, ["src/a b.rs", "README.md", "new.rs"]);
        assert_eq!(status.staged, ["src/a b.rs", "new.rs"]);
        assert_eq!(status.untracked, ["notes.txt"]);
        let fresh = parse_status("# branch.oid (initial)\n# branch.head (detached)\n");
        assert_eq!((fresh.head, fresh.branch), (None, None));
    }
}
