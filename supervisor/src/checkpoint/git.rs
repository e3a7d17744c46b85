//! The git of checkpoints: a bare repository of the daemon's, with the workspace as its
//! work tree for the length of one command. Its index is its own (`<repo>/index`), so the
//! workspace's repository is only ever read from disk, never written.

use std::collections::BTreeSet;
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
    /// Its tree is its parent's.
    pub unchanged: bool,
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

    /// The workspace's files: those the last checkpoint had, and the others not ignored.
    async fn candidates(&self, work: &Path) -> Result<Vec<Candidate>, CheckpointError> {
        let listed = |args: &'static [&'static str]| async move {
            let out = run(Some(self), args, Some(work), &[], None).await?;
            Ok::<Vec<String>, CheckpointError>(
                out.split(|byte| *byte == 0)
                    .filter(|path| !path.is_empty() && !path.ends_with(b"/"))
                    .map(|path| String::from_utf8_lossy(path).into_owned())
                    .collect(),
            )
        };
        let indexed: BTreeSet<String> =
            listed(&["ls-files", "-z", "--cached"]).await?.into_iter().collect();
        let others = listed(&["ls-files", "-z", "--others", "--exclude-standard"]).await?;
        let work = work.to_owned();
        tokio::task::spawn_blocking(move || {
            let paths: BTreeSet<String> = indexed.iter().cloned().chain(others).collect();
            paths
                .into_iter()
                .map(|path| {
                    let size = std::fs::symlink_metadata(work.join(&path))
                        .ok()
                        .filter(|meta| !meta.is_dir())
                        .map(|meta| meta.len());
                    let indexed = indexed.contains(&path);
                    Candidate { path, size, indexed }
                })
                .collect()
        })
        .await
        .map_err(|err| CheckpointError::Io(format!("listing the workspace: {err}")))
    }

    /// The bytes of its objects.
    async fn object_bytes(&self) -> Result<u64, CheckpointError> {
        let out = self.git(None, &["count-objects", "-v"]).await?;
        let kib: u64 = out
            .lines()
            .filter_map(|line| {
                let (key, value) = line.split_once(": ")?;
                matches!(key, "size" | "size-pack").then(|| value.parse::<u64>().ok())?
            })
            .sum();
        Ok(kib * 1024)
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
        let unchanged = match parent {
            Some(parent) => {
                self.git(None, &["rev-parse", &format!("{parent}^{{tree}}")]).await? == tree
            }
            None => false,
        };
        let mut args = vec!["commit-tree", tree.as_str(), "-m", message];
        if let Some(parent) = parent {
            args.extend(["-p", parent]);
        }
        let out = run(Some(self), &args, None, &IDENTITY, None).await?;
        let commit = String::from_utf8_lossy(&out).trim().to_owned();
        let added_bytes = self.object_bytes().await?.saturating_sub(before);
        Ok(Made { commit, unchanged, selection, added_bytes })
    }

    /// Points `name` at `commit`.
    pub async fn update_ref(&self, name: &str, commit: &str) -> Result<(), CheckpointError> {
        self.git(None, &["update-ref", name, commit]).await.map(drop)
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
