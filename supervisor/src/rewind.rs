//! `task.session.rewind`: a session's conversation made to end at one of its turns. The
//! later turns stay in the history and the timeline, marked rewound (never deleted); the
//! history entries they wrote leave every history injection from then on; the agent's own
//! session, which holds them, is dropped, and the next start opens a fresh one primed with
//! the turns kept. With `restore_workspace`, the workspace returns to its git state at the
//! turn (the snapshot taken as it ended, its uncommitted files from the checkpoint commit
//! taken then), after what it holds now is saved on `refs/tether/rewound/<session>/<id>`.
//!
//! [`plan`] decides (pure, tested on its own); [`apply`] carries it out: the workspace
//! first (a kill after it leaves the turns unmarked, and the call, never answered, can be
//! made again), then the marks, the token cleared, in one transaction.

pub mod git;

use std::path::Path;

use protocol::api::{Checkpoint, EntryType, RewindResult, SnapshotSummary, WorkspaceRestore};

use crate::checkpoint::{CheckpointError, Checkpoints};
use crate::history::HistoryEntry;
use crate::ids::{RewindId, SessionId, TurnId};
use crate::store::{RewindRow, Store, StoreError, TurnRow};

/// Why a rewind was not made.
#[derive(Debug, thiserror::Error)]
pub enum RewindError {
    /// The session has no such turn.
    #[error("no turn {0} in this session")]
    NoSuchTurn(TurnId),
    /// Not now, or not to that turn (the reason says why).
    #[error("{0}")]
    Refused(String),
    /// The workspace's state at the turn is not known: it cannot be restored.
    #[error("the workspace cannot be restored: {0}")]
    WorkspaceUnknown(String),
    /// A git command on the workspace failed.
    #[error("the workspace's repository: {0}")]
    Git(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a rewind does to the conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The turn made last.
    pub turn: TurnId,
    /// The turns it takes out, oldest first.
    pub rewound: Vec<TurnId>,
    /// The history entries they wrote, `from..=to` (`from > to`: none).
    pub seqs: (u64, u64),
}

/// The rewind to `turn`: refused when the session has no such turn, when it was rewound
/// itself, and while a turn runs. The turns after it not rewound already are taken out,
/// and the history from the first of their prompts to the end of the file.
pub fn plan(
    turns: &[TurnRow],
    entries: &[HistoryEntry],
    turn: &TurnId,
) -> Result<Plan, RewindError> {
    let at = turns
        .iter()
        .find(|row| row.id == *turn)
        .ok_or_else(|| RewindError::NoSuchTurn(turn.clone()))?;
    if let Some(running) = turns.iter().find(|row| row.ended_at.is_none()) {
        return Err(RewindError::Refused(format!(
            "turn {} is running: cancel it (or wait for its end) before rewinding",
            running.id
        )));
    }
    if at.rewound_by.is_some() {
        return Err(RewindError::Refused(format!(
            "turn {turn} was rewound already: rewind to a turn still in the conversation"
        )));
    }
    let rewound: Vec<TurnId> = turns
        .iter()
        .filter(|row| {
            row.rewound_by.is_none() && (row.started_at, &row.id) > (at.started_at, &at.id)
        })
        .map(|row| row.id.clone())
        .collect();
    let last = entries.last().map_or(0, |entry| entry.seq);
    let from = entries
        .iter()
        .find(|entry| {
            entry.kind == EntryType::UserMessage
                && entry
                    .message_id
                    .as_deref()
                    .is_some_and(|id| rewound.iter().any(|t| t.as_str() == id))
        })
        .map_or(last + 1, |entry| entry.seq);
    let seqs = if rewound.is_empty() { (last + 1, last) } else { (from, last) };
    Ok(Plan { turn: turn.clone(), rewound, seqs })
}

/// The snapshot that shows the workspace as turn `at` left it: the newest with a commit
/// from its end to the next turn's start (`next_start`).
pub fn snapshot_at(
    snapshots: &[SnapshotSummary],
    ended: i64,
    next_start: Option<i64>,
) -> Option<&SnapshotSummary> {
    snapshots.iter().rev().find(|snapshot| {
        snapshot.taken_at >= ended
            && next_start.is_none_or(|next| snapshot.taken_at < next)
            && snapshot.git_head.is_some()
    })
}

/// Whether history entry `seq` was rewound by one of `rewinds`.
pub fn is_rewound(rewinds: &[RewindRow], seq: u64) -> bool {
    rewinds.iter().any(|rewind| (rewind.seqs.0..=rewind.seqs.1).contains(&seq))
}

/// What the rewinds of a session change in a history injection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Injected {
    /// The history entries left out (ranges, inclusive).
    pub skip: Vec<(u64, u64)>,
    /// A section saying the conversation was rewound, and where the workspace stands.
    pub note: String,
    /// The newest snapshot (taken at `snapshot_at`) predates the newest rewind: what it
    /// says of the work is of turns rewound.
    pub stale_snapshot: bool,
}

impl Injected {
    /// For `rewinds` (oldest first), the newest snapshot taken at `snapshot_at`.
    pub fn of(rewinds: &[RewindRow], snapshot_at: Option<i64>) -> Injected {
        let Some(newest) = rewinds.last() else { return Injected::default() };
        let workspace = if newest.workspace_restored {
            "The workspace was returned to its state at that turn."
        } else {
            "The workspace still holds what the later turns changed."
        };
        Injected {
            skip: rewinds.iter().map(|rewind| rewind.seqs).collect(),
            note: format!(
                "\n=== REWOUND ===\nThe user rewound this conversation to an earlier turn: what came after it is left out below and is no longer part of the conversation. {workspace}\n"
            ),
            stale_snapshot: snapshot_at.is_some_and(|at| at <= newest.created_at),
        }
    }
}

/// What a rewind works on.
pub struct Target<'a> {
    /// The store.
    pub store: &'a Store,
    /// The session.
    pub session: &'a SessionId,
    /// Its workspace.
    pub workspace: &'a Path,
    /// Its history file.
    pub history: &'a Path,
    /// The daemon's checkpoints and the session's directory (its checkpoint repository).
    pub checkpoints: (&'a Checkpoints, &'a Path),
    /// The session's runtime (a workspace it keeps where the session runs is not here).
    pub runtime: &'a dyn crate::runtime::Runtime,
}

/// Carries out the rewind to `turn` (see the module doc); the caller made sure no agent
/// works on the session meanwhile.
pub async fn apply(
    target: &Target<'_>,
    turn: &TurnId,
    restore_workspace: bool,
) -> Result<(RewindResult, RewindRow), RewindError> {
    let turns = target.store.session_turns(target.session.clone()).await?;
    let path = target.history.to_owned();
    let entries = tokio::task::spawn_blocking(move || crate::history::read_tail(&path, u64::MAX))
        .await
        .map_err(|err| RewindError::Refused(format!("reading the history: {err}")))?;
    let plan = plan(&turns, &entries, turn)?;
    let id = RewindId::new(uuid::Uuid::now_v7().to_string());
    let workspace = match restore_workspace {
        true => Some(restore(target, &turns, &plan, &id).await?),
        false => None,
    };
    agentctl::fault::point("rewind.workspace_restored");
    let row = RewindRow {
        id: id.clone(),
        session_id: target.session.clone(),
        turn_id: plan.turn.clone(),
        seqs: plan.seqs,
        workspace_restored: workspace.is_some(),
        saved_ref: workspace.as_ref().map(|restore| restore.saved_ref.clone()),
        created_at: crate::store::now_ms(),
    };
    target.store.record_rewind(row.clone(), plan.rewound.clone()).await?;
    let mut notes = vec![
        "the next prompt opens a fresh agent session, given the conversation up to the turn"
            .to_owned(),
    ];
    if workspace.is_none() && !plan.rewound.is_empty() {
        notes.push("the workspace keeps what the rewound turns changed (restore_workspace returns it to its state at the turn)".into());
    }
    let result = RewindResult {
        session_id: target.session.to_string(),
        rewind_id: id.into_string(),
        turn_id: plan.turn.into_string(),
        rewound: plan.rewound.into_iter().map(TurnId::into_string).collect(),
        workspace,
        notes,
    };
    Ok((result, row))
}

impl From<CheckpointError> for RewindError {
    fn from(err: CheckpointError) -> RewindError {
        match err {
            CheckpointError::Store(store) => RewindError::Store(store),
            other => RewindError::Git(other.to_string()),
        }
    }
}

/// Refuses a restore of a workspace the session's runtime keeps where it runs (a copied
/// workspace): the directory here is not the session's.
pub async fn workspace_here(
    store: &Store,
    session: &SessionId,
    runtime: &dyn crate::runtime::Runtime,
    workspace: &Path,
) -> Result<(), RewindError> {
    let newest = store.get_execution(session.clone()).await?;
    if runtime.copies_workspace(newest.and_then(|newest| newest.runtime_handle).as_ref()) {
        return Err(RewindError::Refused(format!(
            "the session's workspace lives on its engine (workspace = \"copy\"), not in {}: rewind without restore_workspace, and write the turn's checkpoint out with task.session.checkpoint.restore",
            workspace.display()
        )));
    }
    Ok(())
}

/// Returns the workspace to its state at the plan's turn, what it holds saved first;
/// refused when that state is unknown. In a git repository: its branch reset to the
/// commit it had then (a snapshot says which), and its files put back from the session's
/// checkpoint of the turn (or, for a turn before there were any, the checkpoint commit
/// its snapshot took in the repository). Elsewhere: its files put back from the turn's
/// checkpoint, what it held kept in a checkpoint of its own.
async fn restore(
    target: &Target<'_>,
    turns: &[TurnRow],
    plan: &Plan,
    id: &RewindId,
) -> Result<WorkspaceRestore, RewindError> {
    let turn = &plan.turn;
    let unknown = |why: String| RewindError::WorkspaceUnknown(why);
    workspace_here(target.store, target.session, target.runtime, target.workspace).await?;
    let has_checkpoint = Checkpoints::of_turn(target.store, target.session, turn).await?.is_some();
    if !crate::snapshot::git::in_repository(target.workspace) {
        if has_checkpoint {
            return restore_files(target, turn).await;
        }
        return Err(unknown(format!(
            "{} is not in a git repository, and no checkpoint of turn {turn} was taken",
            target.workspace.display()
        )));
    }
    let at = turns
        .iter()
        .find(|row| row.id == *turn)
        .ok_or_else(|| RewindError::NoSuchTurn(turn.clone()))?;
    let ended = at.ended_at.unwrap_or(at.started_at);
    let next_start =
        turns.iter().map(|row| row.started_at).filter(|start| *start > at.started_at).min();
    let snapshots = target.store.snapshots(target.session.clone()).await?;
    let Some(snapshot) = snapshot_at(&snapshots, ended, next_start) else {
        if has_checkpoint {
            return restore_files(target, turn).await;
        }
        return Err(unknown(format!(
            "no snapshot shows the workspace as turn {turn} left it (a session keeps its newest turns' snapshots)"
        )));
    };
    let commit = snapshot.git_head.clone().unwrap_or_default();
    let checkpoint = match snapshot.git_dirty {
        _ if has_checkpoint => None,
        Some(true) => {
            let full = target.store.snapshot(snapshot.snapshot_id.clone()).await?;
            Some(full.and_then(|full| full.git.checkpoint).ok_or_else(|| {
                unknown(format!("the workspace had uncommitted changes at turn {turn} and no checkpoint of them was taken"))
            })?)
        }
        _ => None,
    };
    let saved_ref = format!("refs/tether/rewound/{}/{id}", target.session);
    let saved_commit = git::save(
        target.workspace,
        &saved_ref,
        &format!(
            "tether: the workspace before session {} was rewound to turn {turn}",
            target.session
        ),
    )
    .await
    .map_err(RewindError::Git)?;
    git::restore(target.workspace, &commit, checkpoint.as_deref())
        .await
        .map_err(RewindError::Git)?;
    let checkpoint = match has_checkpoint {
        true => overlay(target, turn, false).await?.map(|(turn, _)| turn.commit),
        false => checkpoint,
    };
    Ok(WorkspaceRestore { commit, checkpoint, saved_ref, saved_commit })
}

/// The workspace's files put back from the turn's checkpoint, what it held kept in a
/// checkpoint of its own (its ref is the `saved_ref`).
async fn restore_files(
    target: &Target<'_>,
    turn: &TurnId,
) -> Result<WorkspaceRestore, RewindError> {
    let Some((turn, Some(saved))) = overlay(target, turn, true).await? else {
        return Err(RewindError::WorkspaceUnknown(format!("no checkpoint of turn {turn}")));
    };
    Ok(WorkspaceRestore {
        commit: turn.commit.clone(),
        checkpoint: Some(turn.commit),
        saved_ref: saved.git_ref,
        saved_commit: saved.commit,
    })
}

/// [`Checkpoints::overlay_turn`] on the target.
async fn overlay(
    target: &Target<'_>,
    turn: &TurnId,
    save: bool,
) -> Result<Option<(Checkpoint, Option<Checkpoint>)>, RewindError> {
    let (checkpoints, session_dir) = target.checkpoints;
    Ok(checkpoints
        .overlay_turn(target.store, (target.session, session_dir), (turn, target.workspace), save)
        .await?)
}

#[cfg(test)]
mod tests;
