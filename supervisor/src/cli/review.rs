//! `supervisor changes SESSION [--diff] [--keep PATH | --revert PATH]`: a review of what a
//! session changed, from a terminal.

use protocol::api::{ApiClient, ChangeKind, SessionChanges};

use super::Failure;
use super::client::Client;
use super::output::print_json;

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
