//! The git of checkpoints: a bare repository of the daemon's, with the workspace as its
//! work tree for the length of one command. Its index is its own (`<repo>/index`), so the
//! workspace's repository is only ever read from disk, never written.

use std::collections::BTreeSet;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::AsyncWriteExt;

use super::{Candidate, CheckpointError, Limits, Selection, select};

/// Who the commits are by.
const IDENTITY: [(&str, &str); 4] = [
    ("GIT_AUTHOR_NAME", "Tether"),
    ("GIT_AUTHOR_EMAIL", "tether@localhost"),
    ("GIT_COMMITTER_NAME", "Tether"),
    ("GIT_COMMITTER_EMAIL", "tether@localhost"),
];

/// Variables of the daemon's environment that would send git elsewhere.
const INHERITED: [&str; 7] = [
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE",
    "GIT_CEILING_DIRECTORIES",
];

/// What [`Repo::commit`] made.
#[derive(Debug, Clone)]
pub struct Made {
    /// The commit.
    pub commit: String,
    /// Its tree.
    pub tree: String,
    /// What went in.
    pub selection: Selection,
    /// The bytes the repository grew by.
    pub added_bytes: u64,
}

/// A session's checkpoint repository.
#[derive(Debug, Clone)]
pub struct Repo {
    dir: PathBuf,
}

impl Repo {
    /// The repository at `dir`, made (bare) when it is not there yet.
    pub async fn open(dir: &Path) -> Result<Repo, CheckpointError> {
        let repo = Repo { dir: dir.to_owned() };
        if !dir.join("HEAD").exists() {
            let text = dir.display().to_string();
            run(None, &["init", "-q", "--bare", &text], None, &[], None).await?;
            // Nothing collects a checkpoint's objects behind the daemon's back.
            repo.git(None, &["config", "gc.auto", "0"]).await?;
        }
        Ok(repo)
    }

    async fn git(&self, work: Option<&Path>, args: &[&str]) -> Result<String, CheckpointError> {
        let out = run(Some(self), args, work, &[], None).await?;
        Ok(String::from_utf8_lossy(&out).trim().to_owned())
    }

    /// The workspace's files: those the last checkpoint had, and the others not ignored
    /// (one `ls-files`, each path tagged: `?` for one the index does not have).
    async fn candidates(&self, work: &Path) -> Result<Vec<Candidate>, CheckpointError> {
        let mut args = vec!["ls-files", "-z", "-t", "--cached", "--others", "--exclude-standard"];
        let exclude = own_excludes(work);
        args.extend(exclude.as_deref());
        let out = run(Some(self), &args, Some(work), &[], None).await?;
        let work = work.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut seen = BTreeSet::new();
            let mut found = Vec::new();
            for entry in out.split(|byte| *byte == 0) {
                let Some((tag, path)) =
                    entry.split_first().filter(|(_, rest)| rest.first() == Some(&b' '))
                else {
                    continue;
                };
                let path = String::from_utf8_lossy(&path[1..]).into_owned();
                if path.ends_with('/') || !seen.insert(path.clone()) {
                    continue;
                }
                let size = std::fs::symlink_metadata(work.join(&path))
                    .ok()
                    .filter(|meta| !meta.is_dir())
                    .map(|meta| meta.len());
                found.push(Candidate { path, size, indexed: *tag != b'?' });
            }
            found
        })
        .await
        .map_err(|err| CheckpointError::Io(format!("listing the workspace: {err}")))
    }

    /// The bytes of its objects (loose and packed), read from its `objects` directory.
    async fn object_bytes(&self) -> Result<u64, CheckpointError> {
        let objects = self.dir.join("objects");
        tokio::task::spawn_blocking(move || {
            let mut total = 0;
            let Ok(dirs) = std::fs::read_dir(&objects) else { return 0 };
            for dir in dirs.flatten() {
                let Ok(files) = std::fs::read_dir(dir.path()) else { continue };
                for file in files.flatten() {
                    total += file
                        .metadata()
                        .map_or(0, |meta| if meta.is_file() { meta.len() } else { 0 });
                }
            }
            total
        })
        .await
        .map_err(|err| CheckpointError::Io(format!("sizing the repository: {err}")))
    }

    /// Whether `commit`'s tree is `tree`.
    pub async fn has_tree(&self, commit: &str, tree: &str) -> Result<bool, CheckpointError> {
        Ok(self.git(None, &["rev-parse", &format!("{commit}^{{tree}}")]).await? == tree)
    }

    /// Commits the workspace's files (as [`select`] chooses them) on `parent`.
    pub async fn commit(
        &self,
        work: &Path,
        limits: &Limits,
        parent: Option<&str>,
        message: &str,
    ) -> Result<Made, CheckpointError> {
        // A daemon killed mid-checkpoint leaves its lock; the session's lock is held now.
        let _ = std::fs::remove_file(self.dir.join("index.lock"));
        let before = self.object_bytes().await?;
        let selection = select(self.candidates(work).await?, limits)?;
        for (paths, flags) in [
            (&selection.update, &["update-index", "--add", "--remove", "-z", "--stdin"][..]),
            (&selection.drop, &["update-index", "--force-remove", "-z", "--stdin"][..]),
        ] {
            if !paths.is_empty() {
                let mut input = Vec::new();
                for path in paths {
                    input.extend_from_slice(path.as_bytes());
                    input.push(0);
                }
                run(Some(self), flags, Some(work), &[], Some(input)).await?;
            }
        }
        let tree = self.git(None, &["write-tree"]).await?;
        let mut args = vec!["commit-tree", tree.as_str(), "-m", message];
        if let Some(parent) = parent {
            args.extend(["-p", parent]);
        }
        let out = run(Some(self), &args, None, &IDENTITY, None).await?;
        let commit = String::from_utf8_lossy(&out).trim().to_owned();
        let added_bytes = self.object_bytes().await?.saturating_sub(before);
        Ok(Made { commit, tree, selection, added_bytes })
    }

    /// Points `name` at `commit`.
    pub async fn update_ref(&self, name: &str, commit: &str) -> Result<(), CheckpointError> {
        self.git(None, &["update-ref", name, commit]).await.map(drop)
    }

    /// Makes `into` hold `commit`'s files: each written, and every other file not ignored
    /// (`.gitignore`) removed — but those over `max_file_bytes`, which no checkpoint holds
    /// and so none can put back. How many files it holds.
    pub async fn overlay(
        &self,
        commit: &str,
        into: &Path,
        max_file_bytes: u64,
    ) -> Result<u64, CheckpointError> {
        let written = self.write_out(commit, into).await?;
        let scratch = self.dir.join(format!("overlay-index-{}", uuid::Uuid::now_v7()));
        let scratch_text = scratch.display().to_string();
        let env = [("GIT_INDEX_FILE", scratch_text.as_str())];
        let others = async {
            run(Some(self), &["read-tree", commit], Some(into), &env, None).await?;
            let mut args = vec!["ls-files", "-z", "--others", "--exclude-standard"];
            let exclude = own_excludes(into);
            args.extend(exclude.as_deref());
            run(Some(self), &args, Some(into), &env, None).await
        }
        .await;
        let _ = std::fs::remove_file(&scratch);
        // A directory (a nested repository, listed as `dir/`) is not the checkpoint's to
        // remove; nor is a file no checkpoint could hold.
        for path in others?.split(|byte| *byte == 0).filter(|path| !path.is_empty()) {
            if path.ends_with(b"/") {
                continue;
            }
            let path = into.join(std::ffi::OsStr::from_bytes(path));
            let kept = std::fs::symlink_metadata(&path)
                .is_ok_and(|meta| meta.is_dir() || (meta.is_file() && meta.len() > max_file_bytes));
            if !kept {
                std::fs::remove_file(&path)
                    .map_err(|err| CheckpointError::Io(format!("{}: {err}", path.display())))?;
            }
        }
        Ok(written)
    }

    /// `commit`'s files as a tar archive (paths relative to the workspace).
    pub async fn archive(&self, commit: &str) -> Result<Vec<u8>, CheckpointError> {
        run(Some(self), &["archive", "--format=tar", commit], None, &[], None).await
    }

    /// Writes `commit`'s files into `into` (through an index of its own); how many.
    pub async fn write_out(&self, commit: &str, into: &Path) -> Result<u64, CheckpointError> {
        let scratch = self.dir.join(format!("restore-index-{}", uuid::Uuid::now_v7()));
        let scratch_text = scratch.display().to_string();
        let env = [("GIT_INDEX_FILE", scratch_text.as_str())];
        let written = async {
            run(Some(self), &["read-tree", commit], Some(into), &env, None).await?;
            run(Some(self), &["checkout-index", "-a", "-f"], Some(into), &env, None).await?;
            let listed = run(Some(self), &["ls-files", "-z"], Some(into), &env, None).await?;
            Ok(listed.split(|byte| *byte == 0).filter(|path| !path.is_empty()).count() as u64)
        }
        .await;
        let _ = std::fs::remove_file(&scratch);
        written
    }
}

/// The workspace repository's own ignore list (`.git/info/exclude`), which git reads only
/// for that repository: given to a listing through the checkpoint repository as well.
fn own_excludes(work: &Path) -> Option<String> {
    let exclude = work.join(".git/info/exclude");
    exclude.is_file().then(|| format!("--exclude-from={}", exclude.display()))
}

/// Runs git on `repo` (with `work` as its work tree), `input` on its stdin; its stdout.
async fn run(
    repo: Option<&Repo>,
    args: &[&str],
    work: Option<&Path>,
    env: &[(&str, &str)],
    input: Option<Vec<u8>>,
) -> Result<Vec<u8>, CheckpointError> {
    let mut command = tokio::process::Command::new("git");
    for name in INHERITED {
        command.env_remove(name);
    }
    if let Some(repo) = repo {
        command.arg("--git-dir").arg(&repo.dir);
    }
    if let Some(work) = work {
        command.arg("--work-tree").arg(work).current_dir(work);
    }
    // It dies with the daemon: a SIGKILLed daemon leaves no git behind (its lock is
    // removed by the next checkpoint).
    // SAFETY: between fork and exec only `prctl`, which is async-signal-safe, runs.
    unsafe {
        command.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    command
        .args([
            "-c",
            "core.quotePath=false",
            "-c",
            "core.autocrlf=false",
            "-c",
            "core.symlinks=true",
        ])
        .args(["-c", "core.hooksPath=/dev/null"])
        .args(args)
        .envs(env.iter().copied())
        .env("GIT_OPTIONAL_LOCKS", "0")
        .env("LC_ALL", "C")
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let failed = |err: std::io::Error| CheckpointError::Git(format!("cannot run git: {err}"));
    let mut child = command.spawn().map_err(failed)?;
    if let Some(input) = input
        && let Some(mut stdin) = child.stdin.take()
    {
        stdin.write_all(&input).await.map_err(failed)?;
    }
    let output = child.wait_with_output().await.map_err(failed)?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(CheckpointError::Git(format!(
            "git {} failed: {}",
            args.join(" "),
            stderr.trim()
        )));
    }
    Ok(output.stdout)
}
