//! `task.session.fork`: a new session of the same task whose conversation is another's up
//! to and including one of its turns. The fork is recorded at rest (`WAITING_FOR_INPUT`,
//! no agent: it costs nothing until prompted) with the original's history up to that turn
//! as its own; its first start asks its agent to `session/fork` the original's agent
//! session where that can work (the turn is the original's newest, the agent advertised
//! `sessionCapabilities.fork`, both run as local processes sharing the agent's state), and
//! otherwise injects that history before its first prompt. With a worktree, the fork gets
//! a branch of its own made from the commit the workspace had at that turn (its snapshot).
//! The settings chosen for the original (its model, its mode) go on in the fork.

use protocol::api::{EntryType, ForkContext, ForkResult, SessionState, SnapshotTrigger};

use super::{ServiceError, Supervisor, worktree};
use crate::history::HistoryEntry;
use crate::ids::{SessionId, TurnId};
use crate::store::{SessionRow, TurnRow};

/// The turn a fork keeps last: `asked`, or the newest. Refused while it runs (its
/// conversation is not settled) and when the session has none.
fn pick_turn<'a>(
    turns: &'a [TurnRow],
    asked: Option<&TurnId>,
) -> Result<&'a TurnRow, ServiceError> {
    let turn = match asked {
        Some(asked) => turns
            .iter()
            .find(|turn| turn.id == *asked)
            .ok_or_else(|| ServiceError::NotFound(format!("no turn {asked} in this session")))?,
        None => turns.last().ok_or_else(|| {
            ServiceError::InvalidState(
                "the session has no turn yet: there is nothing to fork".into(),
            )
        })?,
    };
    if turn.ended_at.is_none() {
        return Err(ServiceError::InvalidState(format!(
            "turn {} is still running: fork it once it ended (or fork at an earlier turn)",
            turn.id
        )));
    }
    Ok(turn)
}

/// The history a fork starts with: the original's entries up to and including `turn`'s
/// (its prompt, its steers, the agent's messages and tools), numbered from 1, without the
/// original's replay marks (they count its executions' events); `None` when the turn's
/// prompt is not in the history (it was trimmed, or never written).
pub(crate) fn history_through(
    entries: &[HistoryEntry],
    turn: &TurnId,
) -> Option<Vec<HistoryEntry>> {
    let turn = turn.as_str();
    let start = entries.iter().position(|entry| {
        entry.kind == EntryType::UserMessage && entry.message_id.as_deref() == Some(turn)
    })?;
    let after = entries[start + 1..]
        .iter()
        .position(|entry| {
            entry.kind == EntryType::UserMessage
                && !entry.message_id.as_deref().is_some_and(|id| id.starts_with(turn))
        })
        .map_or(entries.len(), |at| start + 1 + at);
    Some(
        entries[..after]
            .iter()
            .zip(1..)
            .map(|(entry, seq)| {
                let mut entry = entry.clone();
                entry.wire.seq = seq;
                (entry.agent_seq, entry.generation) = (None, None);
                entry
            })
            .collect(),
    )
}

/// Where a fork works, and what it could not carry over.
struct ForkPlace {
    workspace_path: String,
    made: Option<worktree::Worktree>,
    base_commit: Option<String>,
    notes: Vec<String>,
}

impl Supervisor {
    /// `task.session.fork` (see the module doc).
    pub async fn fork(
        &self,
        session_id: SessionId,
        turn_id: Option<TurnId>,
    ) -> Result<ForkResult, ServiceError> {
        let original = self.session_row(&session_id).await?;
        let turns = self.config.store.session_turns(session_id.clone()).await?;
        let at = pick_turn(&turns, turn_id.as_ref())?;
        let next_start =
            turns.iter().find(|turn| turn.started_at > at.started_at).map(|t| t.started_at);
        let history = self.fork_history(&original, &at.id).await?;
        let id = SessionId::new(uuid::Uuid::now_v7().to_string());
        let place = self.fork_place(&original, &id, at, next_start).await?;
        let (token, context, why_not) =
            self.fork_context(&original, turns.last().map(|t| &t.id) == Some(&at.id)).await?;
        let mut notes = place.notes;
        notes.extend(why_not);
        let row = SessionRow {
            id: id.clone(),
            state: SessionState::WaitingForInput,
            workspace_path: place.workspace_path.clone(),
            error_message: None,
            created_at: crate::store::now_ms(),
            updated_at: crate::store::now_ms(),
            initial_prompt: None,
            worktree_repo: place.made.as_ref().map(|made| made.repo.display().to_string()),
            worktree_branch: place.made.as_ref().map(|made| made.branch.clone()),
            title: original.title.clone().map(|title| format!("{title} (fork)")),
            ..original.clone()
        };
        if let Err(err) = self.record_fork(row, &history, (&session_id, &at.id), token).await {
            if let Some(made) = &place.made
                && let Err(undo) = worktree::remove(made, true, true).await
            {
                tracing::warn!(%undo, "cannot remove the worktree of a fork not made");
            }
            return Err(err);
        }
        tracing::info!(session = %id, from = %session_id, turn = %at.id, ?context, "forked");
        Ok(ForkResult {
            session_id: id.into_string(),
            forked_from: session_id.into_string(),
            turn_id: at.id.to_string(),
            context,
            workspace_path: place.workspace_path,
            branch: place.made.map(|made| made.branch),
            base_commit: place.base_commit,
            notes,
        })
    }

    /// The original's history through `turn`, refused when it is not there.
    async fn fork_history(
        &self,
        original: &SessionRow,
        turn: &TurnId,
    ) -> Result<Vec<HistoryEntry>, ServiceError> {
        let path = self.config.home.session(&original.id).history();
        let entries =
            tokio::task::spawn_blocking(move || crate::history::read_tail(&path, u64::MAX))
                .await
                .map_err(|err| ServiceError::Internal(err.to_string()))?;
        history_through(&entries, turn).ok_or_else(|| {
            ServiceError::InvalidState(format!(
                "turn {turn}'s prompt is not in the session's history (trimmed, or never written): it cannot be forked there"
            ))
        })
    }

    /// How the fork's agent will get the conversation: natively (the original's agent
    /// session to `session/fork`) or by injection, and why not natively.
    async fn fork_context(
        &self,
        original: &SessionRow,
        newest: bool,
    ) -> Result<(Option<String>, ForkContext, Option<String>), ServiceError> {
        let settings = self.config.store.session_settings(original.id.clone()).await?;
        let execution = self.config.store.get_execution(original.id.clone()).await?;
        let token = execution.and_then(|execution| execution.resume_token);
        let why_not = if !settings.fork_supported {
            Some(
                "the agent does not advertise session/fork: its history up to the turn goes with the fork's first prompt",
            )
        } else if !newest {
            Some(
                "forked before the original's newest turn, which the agent's own session holds: the history up to the turn goes with the fork's first prompt",
            )
        } else if original.runtime != "standalone" {
            Some(
                "a container's agent state is its own session's: the history up to the turn goes with the fork's first prompt",
            )
        } else if token.is_none() {
            Some(
                "the original keeps no agent session to fork: the history up to the turn goes with the fork's first prompt",
            )
        } else {
            None
        };
        Ok(match why_not {
            None => (token, ForkContext::Native, None),
            Some(why) => (None, ForkContext::History, Some(why.to_owned())),
        })
    }

    /// Where the fork works: a worktree of its own from the commit the original's had at
    /// `at` when the original has one, else the original's workspace, shared.
    async fn fork_place(
        &self,
        original: &SessionRow,
        id: &SessionId,
        at: &TurnRow,
        next_start: Option<i64>,
    ) -> Result<ForkPlace, ServiceError> {
        let Some(repo) = &original.worktree_repo else {
            return Ok(ForkPlace {
                workspace_path: original.workspace_path.clone(),
                made: None,
                base_commit: None,
                notes: vec![format!(
                    "the original has no worktree: the fork shares its workspace {} (as it is now, not as it was at the turn)",
                    original.workspace_path
                )],
            });
        };
        let ended = at.ended_at.unwrap_or(at.started_at);
        let snapshots = self.config.store.snapshots(original.id.clone()).await?;
        // The workspace as the turn left it: the newest snapshot from its end to the next
        // turn's start (its own `turn_complete` one, dated at its end, first of all).
        let then = crate::rewind::snapshot_at(&snapshots, ended, next_start);
        let mut notes = Vec::new();
        let checkpoint =
            crate::checkpoint::Checkpoints::of_turn(&self.config.store, &original.id, &at.id)
                .await?;
        let base = match then {
            Some(snapshot) => {
                if snapshot.git_dirty == Some(true) && checkpoint.is_none() {
                    notes.push(format!("the workspace had uncommitted changes at turn {}: they are not in the fork's branch (it starts from the commit then)", at.id));
                }
                if snapshot.trigger != SnapshotTrigger::TurnComplete {
                    tracing::debug!(snapshot = %snapshot.snapshot_id, "a fork's base from a later snapshot");
                }
                snapshot.git_head.clone()
            }
            None => {
                notes.push(format!(
                    "the workspace's commit at turn {} is unknown (no snapshot of it): the fork's branch starts from {}'s head",
                    at.id,
                    original.worktree_branch.as_deref().unwrap_or("the original's branch")
                ));
                None
            }
        };
        let task = self.config.store.get_task(original.task_id.clone()).await?;
        let made = worktree::Worktree {
            repo: repo.into(),
            path: self.config.home.root().join("worktrees").join(id),
            branch: worktree::branch_name(&format!("{} fork", task.title), id),
        };
        let from = base
            .clone()
            .or_else(|| original.worktree_branch.clone())
            .unwrap_or_else(|| "HEAD".into());
        worktree::create(&made, &from)
            .await
            .map_err(|err| ServiceError::InvalidState(format!("the fork's worktree: {err}")))?;
        if checkpoint.is_some() {
            // The files as the turn left them, its uncommitted changes too (uncommitted).
            let dir = self.config.home.session(&original.id).dir().to_owned();
            let overlaid = self
                .config
                .checkpoints
                .overlay_turn(&self.config.store, (&original.id, &dir), (&at.id, &made.path), false)
                .await;
            if let Err(err) = overlaid {
                let _ = worktree::remove(&made, true, true).await;
                return Err(err.into());
            }
            notes.push(format!(
                "the fork's worktree holds the files as turn {} left them (from its checkpoint), uncommitted changes included",
                at.id
            ));
        }
        Ok(ForkPlace {
            workspace_path: made.path.display().to_string(),
            made: Some(made),
            base_commit: base,
            notes,
        })
    }

    /// Stores the fork: its history first (a kill after it leaves a directory without a
    /// session, which recovery removes), then its row with the link and its native token
    /// in one transaction. Nothing of it is left when a step fails.
    async fn record_fork(
        &self,
        row: SessionRow,
        history: &[HistoryEntry],
        (from, turn): (&SessionId, &TurnId),
        token: Option<String>,
    ) -> Result<(), ServiceError> {
        let id = row.id.clone();
        let written = match self.write_fork_history(&id, history).await {
            Ok(()) => {
                agentctl::fault::point("fork.history_written");
                let _guard = self.start_lock.lock().await;
                self.config
                    .store
                    .create_fork(row, (from.clone(), turn.clone()), token)
                    .await
                    .map_err(ServiceError::from)
            }
            Err(err) => Err(err),
        };
        if written.is_err() {
            let _ = std::fs::remove_dir_all(self.config.home.session_path(&id));
        }
        written
    }

    /// Writes the fork's history file, synced.
    async fn write_fork_history(
        &self,
        id: &SessionId,
        history: &[HistoryEntry],
    ) -> Result<(), ServiceError> {
        let dir = self
            .config
            .home
            .session_dir(id)
            .map_err(|err| ServiceError::Storage(format!("the fork's directory: {err}")))?;
        let path = self.config.home.session(id).history();
        let mut text = Vec::new();
        for entry in history {
            serde_json::to_writer(&mut text, entry)
                .map_err(|err| ServiceError::Internal(err.to_string()))?;
            text.push(b'\n');
        }
        tokio::task::spawn_blocking(move || {
            use std::io::Write as _;
            let mut file = std::fs::File::create(&path)?;
            file.write_all(&text)?;
            file.sync_all()?;
            std::fs::File::open(&dir)?.sync_all()
        })
        .await
        .map_err(|err| ServiceError::Internal(err.to_string()))?
        .map_err(|err| ServiceError::Storage(format!("the fork's history: {err}")))
    }
}

#[cfg(test)]
mod tests;
