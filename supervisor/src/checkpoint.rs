//! Workspace checkpoints: a session's files as git objects at every turn's end (and at a
//! pause, a park, a stop, and before a restore), in a repository the daemon keeps for the
//! session (`sessions/<id>/checkpoints.git`, bare), one commit per checkpoint chained on
//! the one before, a ref per turn (`refs/tether/sessions/<id>/turns/<n>`). The user's
//! repository, index, HEAD and branches are never touched: the workspace is only read.
//!
//! Cheap because git stores only what changed: the repository's own index remembers each
//! file's size and time, so a checkpoint hashes only the files changed since the last one.
//! Tracked and untracked files are taken, ignored ones (`.gitignore`) left out, and so is
//! every file over `max_file_bytes` (listed in the checkpoint); a workspace whose files
//! come to more than `max_workspace_bytes` is not checkpointed (the error says so).
//!
//! [`select`] decides which files go in (pure, tested on its own); [`git`] lists and
//! commits them; [`Checkpoints`] serialises a session's checkpoints, stores each row (with
//! its timeline row) once its ref is written, and lets the next turn wait for one in
//! flight, at most [`Limits::wait`].

pub mod git;
pub mod mirror;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protocol::api::{Checkpoint, CheckpointTrigger, LeftOut};

use crate::ids::{SessionId, TurnId};
use crate::store::{Store, StoreError};

/// The default of `[checkpoints] max_file_bytes`: 10 MiB.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 10 * 1024 * 1024;
/// The default of `[checkpoints] max_workspace_bytes`: 1 GiB.
pub const DEFAULT_MAX_WORKSPACE_BYTES: u64 = 1024 * 1024 * 1024;
/// The default of `[checkpoints] wait_ms`: 2 s.
pub const DEFAULT_WAIT_MS: u64 = 2000;

/// Why a checkpoint was not taken or not restored.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The workspace's files are over `max_workspace_bytes`.
    #[error(
        "the workspace's files come to {bytes} bytes, over [checkpoints] max_workspace_bytes = {limit}: no checkpoint taken"
    )]
    TooBig {
        /// What the files come to.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// The session has no such checkpoint.
    #[error("{0}")]
    NotFound(String),
    /// The restore's target is not usable (not absolute, not empty).
    #[error("{0}")]
    Refused(String),
    /// A git command failed.
    #[error("the checkpoint repository: {0}")]
    Git(String),
    /// The workspace could not be fetched from where the session runs.
    #[error("the workspace could not be fetched from where the session runs: {0}")]
    Fetch(String),
    /// Reading the workspace or writing the target failed.
    #[error("{0}")]
    Io(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// `config.toml`'s `[checkpoints]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A file larger than this is left out (and listed).
    pub max_file_bytes: u64,
    /// A workspace whose files come to more is not checkpointed.
    pub max_workspace_bytes: u64,
    /// How long a turn's start waits for the checkpoint before it.
    pub wait: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_workspace_bytes: DEFAULT_MAX_WORKSPACE_BYTES,
            wait: Duration::from_millis(DEFAULT_WAIT_MS),
        }
    }
}

/// A file of the workspace as the listing saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Its path from the workspace's top.
    pub path: String,
    /// Its size (a symlink's own), `None` when it is gone.
    pub size: Option<u64>,
    /// In the repository's index (the previous checkpoint had it).
    pub indexed: bool,
}

/// What goes into a checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Paths to update in the index: present ones added or refreshed, gone ones removed.
    pub update: Vec<String>,
    /// Indexed paths now over the per-file limit: taken out of the index.
    pub drop: Vec<String>,
    /// Files over the per-file limit.
    pub left_out: Vec<LeftOut>,
    /// The files kept.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// Which files a checkpoint takes: every present file within `max_file_bytes`; gone files
/// leave it; refused whole when the kept files exceed `max_workspace_bytes`.
pub fn select(candidates: Vec<Candidate>, limits: &Limits) -> Result<Selection, CheckpointError> {
    let mut selection = Selection::default();
    for candidate in candidates {
        match candidate.size {
            Some(size) if size > limits.max_file_bytes => {
                if candidate.indexed {
                    selection.drop.push(candidate.path.clone());
                }
                selection.left_out.push(LeftOut { path: candidate.path, bytes: size });
            }
            Some(size) => {
                selection.files += 1;
                selection.bytes += size;
                selection.update.push(candidate.path);
            }
            None if candidate.indexed => selection.update.push(candidate.path),
            None => {}
        }
    }
    if selection.bytes > limits.max_workspace_bytes {
        return Err(CheckpointError::TooBig {
            bytes: selection.bytes,
            limit: limits.max_workspace_bytes,
        });
    }
    Ok(selection)
}

/// The ref of a checkpoint: a turn's by its number, the others by their own.
pub fn ref_name(
    session: &SessionId,
    trigger: CheckpointTrigger,
    turn: Option<u64>,
    seq: u64,
) -> String {
    match (trigger, turn) {
        (CheckpointTrigger::Turn, Some(turn)) => {
            format!("refs/tether/sessions/{session}/turns/{turn}")
        }
        _ => format!("refs/tether/sessions/{session}/{}/{seq}", trigger.as_str()),
    }
}

/// What asks for a checkpoint.
#[derive(Clone)]
pub struct Request {
    /// The session.
    pub session_id: SessionId,
    /// Its directory (`sessions/<id>/`), which holds the repository.
    pub session_dir: PathBuf,
    /// Its workspace.
    pub workspace: PathBuf,
    /// What takes it.
    pub trigger: CheckpointTrigger,
    /// The turn it ends, for a turn's.
    pub turn_id: Option<TurnId>,
    /// The runtime the session runs on: asked for the workspace when it keeps it where the
    /// session runs (a copied workspace), which is then checkpointed from the supervisor's
    /// copy of it (`sessions/<id>/workspace-copy`).
    pub runtime: Option<Arc<dyn crate::runtime::Runtime>>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("session_id", &self.session_id)
            .field("workspace", &self.workspace)
            .field("trigger", &self.trigger)
            .field("turn_id", &self.turn_id)
            .field("runtime", &self.runtime.as_ref().map(|runtime| runtime.name().to_owned()))
            .finish_non_exhaustive()
    }
}

/// The daemon's checkpoints: the limits, and one lock per session so that its
/// checkpoints are taken one at a time, in order, and a turn can wait for one.
#[derive(Debug, Default)]
pub struct Checkpoints {
    limits: Limits,
    locks: Mutex<HashMap<SessionId, Arc<tokio::sync::Mutex<()>>>>,
}

impl Checkpoints {
    /// With `limits`.
    pub fn new(limits: Limits) -> Checkpoints {
        Checkpoints { limits, locks: Mutex::new(HashMap::new()) }
    }

    fn lock_of(&self, session: &SessionId) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        locks.entry(session.clone()).or_default().clone()
    }

    /// The repository of a session whose directory is `session_dir`.
    pub fn repository(session_dir: &Path) -> PathBuf {
        session_dir.join("checkpoints.git")
    }

    /// Takes a checkpoint and stores it (its row and timeline row in one transaction,
    /// after its ref is written). A non-turn checkpoint of files unchanged since the one
    /// before is not taken (`None`).
    pub async fn take(
        &self,
        store: &Store,
        request: Request,
    ) -> Result<Option<Checkpoint>, CheckpointError> {
        let lock = self.lock_of(&request.session_id);
        let _held = lock.lock().await;
        self.take_held(store, request).await
    }

    /// [`Self::take`], the session's lock held.
    async fn take_held(
        &self,
        store: &Store,
        request: Request,
    ) -> Result<Option<Checkpoint>, CheckpointError> {
        // A session deleted meanwhile has nothing to checkpoint (and its directory is not
        // made again): the delete held this lock while it removed the session.
        match store.get_session(request.session_id.clone()).await {
            Err(StoreError::NotFound { .. }) => return Ok(None),
            other => drop(other?),
        }
        let previous = store.latest_checkpoint(request.session_id.clone()).await?;
        let turn = match &request.turn_id {
            Some(turn_id) => store.turn_number(request.session_id.clone(), turn_id.clone()).await?,
            None => None,
        };
        let repo = git::Repo::open(&Self::repository(&request.session_dir)).await?;
        let seq = previous.as_ref().map_or(1, |previous| previous.seq + 1);
        let name = ref_name(&request.session_id, request.trigger, turn, seq);
        let message = match turn {
            Some(turn) => format!("tether: session {}, turn {turn}", request.session_id),
            None => format!("tether: session {}, {}", request.session_id, request.trigger.as_str()),
        };
        let parent = previous.as_ref().map(|previous| previous.commit.as_str());
        let workspace = workspace_of(store, &request).await?;
        let made = repo.commit(&workspace, &self.limits, parent, &message).await?;
        // A turn always gets its ref; anything else only when the files changed.
        if request.trigger != CheckpointTrigger::Turn
            && let Some(parent) = parent
            && repo.has_tree(parent, &made.tree).await?
        {
            return Ok(None);
        }
        repo.update_ref(&name, &made.commit).await?;
        let checkpoint = Checkpoint {
            seq,
            trigger: request.trigger,
            turn_id: request.turn_id.map(|turn| turn.to_string()),
            turn,
            commit: made.commit,
            git_ref: name,
            files: made.selection.files,
            bytes: made.selection.bytes,
            added_bytes: made.added_bytes,
            left_out: made.selection.left_out,
            taken_at: crate::store::now_ms(),
        };
        store.insert_checkpoint(request.session_id.clone(), checkpoint.clone()).await?;
        Ok(Some(checkpoint))
    }

    /// Takes a checkpoint in the background; failures are logged (and on the timeline).
    pub fn spawn(
        self: &Arc<Self>,
        store: Store,
        request: Request,
    ) -> tokio::task::JoinHandle<Option<Checkpoint>> {
        let checkpoints = self.clone();
        let lock = self.lock_of(&request.session_id);
        // Held from now when free, so that a turn starting next waits for this one.
        let held = lock.clone().try_lock_owned().ok();
        tokio::spawn(async move {
            let _held = match held {
                Some(held) => held,
                None => lock.lock_owned().await,
            };
            let session = request.session_id.clone();
            match checkpoints.take_held(&store, request).await {
                Ok(taken) => taken,
                // A session deleted meanwhile has nothing to checkpoint.
                Err(CheckpointError::Store(err)) => {
                    tracing::debug!(%err, "no checkpoint");
                    None
                }
                Err(err) => {
                    tracing::warn!(%session, %err, "no checkpoint of the workspace");
                    let message = format!("no checkpoint of the workspace: {err}");
                    let _ = store.log_error(session, message).await;
                    None
                }
            }
        })
    }

    /// Waits for the session's checkpoint in flight, if any, and keeps any other from
    /// starting while the guard is held (a delete removing the session's files).
    pub async fn hold(&self, session: &SessionId) -> tokio::sync::OwnedMutexGuard<()> {
        self.lock_of(session).lock_owned().await
    }

    /// Forgets a deleted session's lock.
    pub fn forget(&self, session: &SessionId) {
        let mut locks = self.locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        locks.remove(session);
    }

    /// Waits for the session's checkpoint in flight, if any, at most [`Limits::wait`];
    /// whether none is in flight now.
    pub async fn settle(&self, session: &SessionId) -> bool {
        let lock = self.lock_of(session);
        tokio::time::timeout(self.limits.wait, lock.lock()).await.is_ok()
    }

    /// Before what keeps a copied workspace where the session ran is removed (a move): a
    /// checkpoint of it taken now, fetched from there (none needed when nothing changed
    /// since the newest). An error means the copy there is the only one: keep it.
    pub async fn save_copied(
        &self,
        store: &Store,
        (session_id, session_dir): (&SessionId, &Path),
        workspace: &Path,
        (runtime, handle): (&Arc<dyn crate::runtime::Runtime>, Option<&serde_json::Value>),
    ) -> Result<(), CheckpointError> {
        if !runtime.copies_workspace(handle) {
            return Ok(());
        }
        let request = Request {
            session_id: session_id.clone(),
            session_dir: session_dir.to_owned(),
            workspace: workspace.to_owned(),
            trigger: CheckpointTrigger::Pause,
            turn_id: None,
            runtime: Some(Arc::clone(runtime)),
        };
        self.take(store, request).await.map(drop)
    }

    /// The session's checkpoint of turn `turn_id`, if it has one.
    pub async fn of_turn(
        store: &Store,
        session_id: &SessionId,
        turn_id: &TurnId,
    ) -> Result<Option<Checkpoint>, CheckpointError> {
        let wanted = turn_id.to_string();
        let checkpoints = store.checkpoints(session_id.clone()).await?;
        Ok(checkpoints
            .into_iter()
            .find(|checkpoint| checkpoint.turn_id.as_deref() == Some(wanted.as_str())))
    }

    /// Makes `workspace` hold the files of the session's checkpoint of turn `turn_id`
    /// (see [`git::Repo::overlay`]), with `save` after what it holds now is kept in a
    /// checkpoint of its own (`restore`; the newest one when nothing changed since): the
    /// turn's checkpoint and that one, or `None` when the turn has none (nothing is
    /// changed).
    pub async fn overlay_turn(
        &self,
        store: &Store,
        (session_id, session_dir): (&SessionId, &Path),
        (turn_id, workspace): (&TurnId, &Path),
        save: bool,
    ) -> Result<Option<(Checkpoint, Option<Checkpoint>)>, CheckpointError> {
        let lock = self.lock_of(session_id);
        let _held = lock.lock().await;
        let Some(turn) = Self::of_turn(store, session_id, turn_id).await? else {
            return Ok(None);
        };
        let repo = git::Repo::open(&Self::repository(session_dir)).await?;
        if !save {
            repo.overlay(&turn.commit, workspace, self.limits.max_file_bytes).await?;
            return Ok(Some((turn, None)));
        }
        let request = Request {
            session_id: session_id.clone(),
            session_dir: session_dir.to_owned(),
            workspace: workspace.to_owned(),
            trigger: CheckpointTrigger::Restore,
            turn_id: None,
            runtime: None,
        };
        let saved = match self.take_held(store, request).await? {
            Some(saved) => saved,
            None => store.latest_checkpoint(session_id.clone()).await?.ok_or_else(|| {
                CheckpointError::NotFound(format!("session {session_id} has no checkpoint"))
            })?,
        };
        repo.overlay(&turn.commit, workspace, self.limits.max_file_bytes).await?;
        Ok(Some((turn, Some(saved))))
    }

    /// Writes checkpoint `seq` of the session into `into` (absent or empty); the files
    /// written.
    pub async fn restore_into(
        &self,
        store: &Store,
        session: SessionId,
        session_dir: &Path,
        seq: u64,
        into: &Path,
    ) -> Result<(Checkpoint, u64), CheckpointError> {
        if !into.is_absolute() {
            return Err(CheckpointError::Refused(format!(
                "{} is not an absolute path",
                into.display()
            )));
        }
        let checkpoint = store
            .checkpoints(session.clone())
            .await?
            .into_iter()
            .find(|checkpoint| checkpoint.seq == seq)
            .ok_or_else(|| {
                CheckpointError::NotFound(format!("session {session} has no checkpoint {seq}"))
            })?;
        empty_dir(into)?;
        let repo = git::Repo::open(&Self::repository(session_dir)).await?;
        let files = repo.write_out(&checkpoint.commit, into).await?;
        Ok((checkpoint, files))
    }
}

/// The directory a checkpoint is taken of: the workspace, or — when it lives where the
/// session runs — the supervisor's copy of it, brought in step from there first.
async fn workspace_of(store: &Store, request: &Request) -> Result<PathBuf, CheckpointError> {
    let Some(runtime) = &request.runtime else { return Ok(request.workspace.clone()) };
    let execution = store.get_execution(request.session_id.clone()).await?;
    let Some(handle) = execution
        .and_then(|execution| execution.runtime_handle)
        .filter(|handle| runtime.copies_workspace(Some(handle)))
    else {
        return Ok(request.workspace.clone());
    };
    let copy = request.session_dir.join("workspace-copy");
    let archive = request.session_dir.join("workspace-copy.tar");
    let fetched = runtime.fetch_workspace(&handle, &request.workspace, &archive).await;
    if let Err(err) = fetched {
        let _ = std::fs::remove_file(&archive);
        return Err(CheckpointError::Fetch(err.to_string()));
    }
    let into = copy.clone();
    let synced = tokio::task::spawn_blocking(move || {
        let read = std::fs::File::open(&archive)
            .map_err(|err| CheckpointError::Io(format!("{}: {err}", archive.display())))
            .and_then(|file| mirror::sync_from_tar(std::io::BufReader::new(file), &into));
        let _ = std::fs::remove_file(&archive);
        read
    });
    synced.await.map_err(|err| CheckpointError::Io(err.to_string()))??;
    Ok(copy)
}

/// Makes `dir` (absent) or checks it is empty.
fn empty_dir(dir: &Path) -> Result<(), CheckpointError> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(CheckpointError::Refused(format!(
                    "{} is not empty: a checkpoint is restored into an empty or new directory",
                    dir.display()
                )));
            }
            Ok(())
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir_all(dir)
            .map_err(|err| CheckpointError::Io(format!("{}: {err}", dir.display()))),
        Err(err) => Err(CheckpointError::Io(format!("{}: {err}", dir.display()))),
    }
}
