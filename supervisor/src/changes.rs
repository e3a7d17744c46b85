//! A session's changes for review (`task.session.changes`): every file its workspace
//! changed since the session's base commit, read with git ([`git`]) and put together here
//! (pure: the parsing of git's output, what is left out, the limits), and a file reverted
//! to the base with the workspace saved on a ref first.

use std::collections::BTreeMap;

use protocol::api::{ChangeKind, ChangedFile};

use crate::store::StoreError;

pub mod git;
#[cfg(test)]
mod tests;

/// The most files listed (more: `truncated`).
pub const MAX_FILES: usize = 1000;
/// The largest diff of one file sent.
pub const MAX_DIFF_BYTES: usize = 512 * 1024;
/// The most diff text one answer carries (later files' diffs are omitted).
pub const MAX_DIFFS_BYTES: usize = 16 << 20;

/// What the agent is told of a file the reviewer reverted (with its next prompt): the
/// file is back as it was, and where its change went.
pub fn revert_note(path: &str, saved_ref: &str) -> String {
    format!(
        "{path} was reverted by the person reviewing this session's changes: it is back as it was when the session started (your change to it is saved on {saved_ref})"
    )
}

/// A prompt as its agent gets it when notes were left for it: the notes first, said to be
/// Tether's, then the prompt as it was written.
pub fn with_notes(notes: &[String], prompt: &str) -> String {
    if notes.is_empty() {
        return prompt.to_owned();
    }
    let mut text = String::from("[Tether, not the user: since your last turn");
    for note in notes {
        text.push_str("\n- ");
        text.push_str(note);
    }
    text.push_str("]\n\n");
    text.push_str(prompt);
    text
}

/// Why the changes cannot be read or a file not reverted or kept.
#[derive(Debug, thiserror::Error)]
pub enum ChangesError {
    /// The workspace directory is not there any more.
    #[error("the workspace {0} is gone")]
    WorkspaceGone(String),
    /// The workspace is not in a git repository.
    #[error("the workspace {0} is not in a git repository: its changes are not known")]
    NotRepository(String),
    /// The path is not among the session's changes (now).
    #[error("{0} is not among the session's changes")]
    NotChanged(String),
    /// A git command on the workspace failed.
    #[error("the workspace's repository: {0}")]
    Git(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One file as `git diff -z --numstat` counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    /// Its path from the top of the repository.
    pub path: String,
    /// Lines added and removed; `None` for a binary file.
    pub lines: Option<(u64, u64)>,
}

/// `git diff -z --numstat --no-renames` output: one `added\tremoved\tpath\0` per file
/// (`-\t-` for a binary one).
pub fn parse_numstat(out: &str) -> Vec<Counted> {
    out.split('\0')
        .filter_map(|entry| {
            let mut fields = entry.splitn(3, '\t');
            let (added, removed, path) = (fields.next()?, fields.next()?, fields.next()?);
            let lines = added.parse().ok().zip(removed.parse().ok());
            Some(Counted { path: path.to_owned(), lines })
        })
        .collect()
}

/// One file's part of a patch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Patch {
    /// What happened to the file.
    pub kind: ChangeKind,
    /// Its blob hash now (`-` once deleted), from the `index` line; `None` when the patch
    /// has none (a change of mode alone).
    pub content: Option<String>,
    /// Git says the file is binary.
    pub binary: bool,
    /// The file's part of the patch, its `diff --git` line first.
    pub text: String,
}

/// A `git diff --full-index` patch split per file, in its order (that of `--numstat`).
pub fn split_patch(out: &str) -> Vec<Patch> {
    let mut starts: Vec<usize> = out.match_indices("diff --git ").map(|(at, _)| at).collect();
    starts.retain(|&at| at == 0 || out.as_bytes()[at - 1] == b'\n');
    let ends = starts.iter().skip(1).copied().chain([out.len()]);
    starts.iter().zip(ends).map(|(&start, end)| read_part(&out[start..end])).collect()
}

fn read_part(text: &str) -> Patch {
    let mut patch =
        Patch { kind: ChangeKind::Modified, content: None, binary: false, text: text.to_owned() };
    // The header: up to the first hunk.
    for line in text.lines().skip(1).take_while(|line| !line.starts_with("@@")) {
        if line.starts_with("new file mode") {
            patch.kind = ChangeKind::Added;
        } else if line.starts_with("deleted file mode") {
            patch.kind = ChangeKind::Deleted;
        } else if let Some(hashes) = line.strip_prefix("index ") {
            let hashes = hashes.split(' ').next().unwrap_or_default();
            patch.content = hashes.split_once("..").map(|(_, now)| now.to_owned());
        } else if line.starts_with("Binary files ") || line == "GIT binary patch" {
            patch.binary = true;
        }
    }
    if patch.kind == ChangeKind::Deleted {
        patch.content = Some("-".to_owned());
    }
    patch
}

/// What git said of a workspace, and what the session knows of it.
#[derive(Debug, Default)]
pub struct Reading {
    /// `git diff -z --numstat` against the base.
    pub numstat: String,
    /// `git diff --full-index` against the base.
    pub patch: String,
    /// What the uncommitted files held at the session's start (path → content).
    pub dirty_at_start: BTreeMap<String, String>,
    /// The review's keeps (path → the content kept).
    pub keeps: BTreeMap<String, String>,
}

/// The changed files a reading shows, and whether more were changed than are listed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Assembled {
    /// By path.
    pub files: Vec<ChangedFile>,
    /// More files changed than [`MAX_FILES`].
    pub truncated: bool,
    /// Git's two lists did not agree (the workspace changed between them): the diffs are
    /// left out rather than shown against the wrong file.
    pub mismatch: bool,
}

/// Puts a reading together: the files in git's order, without those that hold what they
/// held when the session started, each with its diff within the limits and its keep.
pub fn assemble(reading: &Reading) -> Assembled {
    let counted = parse_numstat(&reading.numstat);
    let mut patches = split_patch(&reading.patch);
    let mismatch = patches.len() != counted.len();
    if mismatch {
        patches.clear();
    }
    let mut budget = MAX_DIFFS_BYTES;
    let mut files = Vec::new();
    let mut truncated = false;
    for (at, counted) in counted.into_iter().enumerate() {
        let patch = patches.get(at);
        let content = patch.and_then(|patch| patch.content.clone()).unwrap_or_default();
        if reading.dirty_at_start.get(&counted.path).is_some_and(|then| *then == content) {
            continue;
        }
        if files.len() == MAX_FILES {
            truncated = true;
            break;
        }
        files.push(changed_file(counted, patch, content, &reading.keeps, &mut budget));
    }
    Assembled { files, truncated, mismatch }
}

fn changed_file(
    counted: Counted,
    patch: Option<&Patch>,
    content: String,
    keeps: &BTreeMap<String, String>,
    budget: &mut usize,
) -> ChangedFile {
    let (diff, omitted) = match patch {
        None => (None, Some("the workspace changed while it was read: read it again".to_owned())),
        Some(patch) if patch.binary => (None, Some("binary file".to_owned())),
        Some(patch) if patch.text.len() > MAX_DIFF_BYTES => {
            (None, Some(format!("the diff is {} KiB, too large to show", patch.text.len() / 1024)))
        }
        Some(patch) if patch.text.len() > *budget => {
            (None, Some("too many diffs for one answer: shown up to here".to_owned()))
        }
        Some(patch) => {
            *budget -= patch.text.len();
            (Some(patch.text.clone()), None)
        }
    };
    let kept = !content.is_empty() && keeps.get(&counted.path) == Some(&content);
    ChangedFile {
        kind: patch.map_or(ChangeKind::Modified, |patch| patch.kind),
        additions: counted.lines.map(|(added, _)| added),
        deletions: counted.lines.map(|(_, removed)| removed),
        path: counted.path,
        content,
        kept,
        diff,
        omitted,
    }
}
