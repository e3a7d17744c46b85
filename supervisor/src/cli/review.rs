//! `supervisor changes SESSION [--diff] [--keep PATH | --revert PATH]`: a review of what a
//! session changed, from a terminal; `supervisor checkpoints SESSION [--restore-into DIR]`:
//! its files at each turn's end.

use protocol::api::{ApiClient, ChangeKind, Checkpoint, SessionChanges};

use super::Failure;
use super::client::Client;
use super::output::{ago, bytes, print_json};

/// Which checkpoint `checkpoints --restore-into` writes, and where.
pub(super) struct Restore {
    /// The directory.
    pub into: std::path::PathBuf,
    /// The checkpoint, by number.
    pub seq: Option<u64>,
    /// The turn whose checkpoint.
    pub turn: Option<u64>,
}

/// One checkpoint, as `checkpoints` lists it.
pub(super) fn checkpoint_line(checkpoint: &Checkpoint) -> String {
    let what = match checkpoint.turn {
        Some(turn) => format!("turn {turn}"),
        None => checkpoint.trigger.as_str().to_owned(),
    };
    let left_out = match checkpoint.left_out.len() {
        0 => String::new(),
        n => format!(", {n} left out (over the size limit)"),
    };
    format!(
        "  {}\t{what}\t{}\t{} file(s), {}, {} added{left_out}\t{}",
        checkpoint.seq,
        checkpoint.commit.get(..12).unwrap_or(&checkpoint.commit),
        checkpoint.files,
        bytes(checkpoint.bytes),
        bytes(checkpoint.added_bytes),
        ago(checkpoint.taken_at),
    )
}

/// What `changes` was asked to do besides listing.
pub(super) struct Review {
    /// Print each file's diff.
    pub diff: bool,
    /// Keep this file at its content now.
    pub keep: Option<String>,
    /// Revert this file.
    pub revert: Option<String>,
}

impl Client {
    pub(super) async fn checkpoints(
        &self,
        session: String,
        restore: Option<Restore>,
        json: bool,
    ) -> Result<(), Failure> {
        let api = &*self.client;
        if let Some(Restore { into, seq, turn }) = restore {
            let into = std::path::absolute(&into).unwrap_or(into).display().to_string();
            let restored = api.session_checkpoint_restore(session, seq, turn, into).await;
            let restored = restored.map_err(|e| self.failure(e))?;
            if json {
                return print_json(&restored);
            }
            println!(
                "wrote checkpoint {} ({} file(s), {}) into {}",
                restored.checkpoint.seq, restored.files, restored.checkpoint.commit, restored.into
            );
            return Ok(());
        }
        let listed = api.session_checkpoint_list(session).await.map_err(|e| self.failure(e))?;
        if json {
            return print_json(&listed);
        }
        if listed.checkpoints.is_empty() {
            println!("no checkpoints yet (one is taken at each turn's end)");
        }
        for checkpoint in &listed.checkpoints {
            println!("{}", checkpoint_line(checkpoint));
        }
        Ok(())
    }

    pub(super) async fn changes(
        &self,
        session: String,
        review: Review,
        json: bool,
    ) -> Result<(), Failure> {
        let api = &*self.client;
        let mut changes =
            api.session_changes(session.clone()).await.map_err(|e| self.failure(e))?;
        if let Some(path) = review.revert {
            let reverted = api.session_changes_revert(session, path).await;
            let reverted = reverted.map_err(|e| self.failure(e))?;
            eprintln!(
                "reverted {} to the base; what it held is on {} ({})",
                reverted.path, reverted.saved_ref, reverted.saved_commit
            );
            changes = reverted.changes;
        } else if let Some(path) = review.keep {
            let content = changes.files.iter().find(|file| file.path == path);
            let content = content.map(|file| file.content.clone()).unwrap_or_default();
            let kept = api.session_changes_keep(session, path.clone(), content, None).await;
            changes = kept.map_err(|e| self.failure(e))?;
            eprintln!("kept {path} at its content now (until it changes again)");
        }
        if json {
            return print_json(&changes);
        }
        print_changes(&changes, review.diff);
        Ok(())
    }
}

fn print_changes(changes: &SessionChanges, diff: bool) {
    let base = changes.base_commit.as_deref().map_or("", |base| &base[..base.len().min(10)]);
    if !changes.repository {
        println!("the workspace is not in a git repository: Tether reviews changes through git");
        return;
    }
    if changes.files.is_empty() {
        println!("no changes since the session's base ({base})");
        return;
    }
    let (added, removed) = changes.files.iter().fold((0, 0), |(a, r), file| {
        (a + file.additions.unwrap_or(0), r + file.deletions.unwrap_or(0))
    });
    let kept = changes.files.iter().filter(|file| file.kept).count();
    let files = changes.files.len();
    let mut head = format!("{files} file(s) changed since {base} · +{added} −{removed}");
    if kept > 0 {
        head.push_str(&format!(" · {kept} kept"));
    }
    if changes.truncated {
        head.push_str(" · more not listed");
    }
    println!("{head}");
    let width = changes.files.iter().map(|file| file.path.chars().count()).max().unwrap_or(0);
    for file in &changes.files {
        let mark = match file.kind {
            ChangeKind::Added => 'A',
            ChangeKind::Modified => 'M',
            ChangeKind::Deleted => 'D',
        };
        let lines = match (file.additions, file.deletions) {
            (Some(added), Some(removed)) => format!("+{added} −{removed}"),
            _ => "binary".to_owned(),
        };
        let kept = if file.kept { "  kept" } else { "" };
        println!("  {mark}  {:width$}  {lines}{kept}", file.path);
    }
    if let Some(error) = &changes.error {
        println!("note: {error}");
    }
    if diff {
        for file in &changes.files {
            match (&file.diff, &file.omitted) {
                (Some(text), _) => print!("{text}"),
                (None, why) => {
                    println!("{}: diff not shown ({})", file.path, why.as_deref().unwrap_or("none"))
                }
            }
        }
    }
}
