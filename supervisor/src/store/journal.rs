//! The timeline (`session_log`), snapshots (`session_snapshots`), the workspace's commit at
//! a session's start (`session_start`) and pending handoffs (`session_handoffs`).
//!
//! A timeline row is written in the same transaction as the change it records (a state, a
//! turn, a pause, a resume's outcome, a new execution, a snapshot), so the timeline never
//! says something the rest of the store does not, nor misses what it does.

use crate::ids::SessionId;
use std::collections::BTreeMap;

use protocol::api::{Snapshot, SnapshotSummary, SnapshotTrigger, TimelineEvent};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::{Store, StoreError, now_ms};

/// How many `turn_complete` snapshots a session keeps (the newest); other triggers are
/// rare and all kept.
pub const TURN_SNAPSHOTS_KEPT: usize = 20;

/// Appends a timeline row (inside the caller's transaction, when it has one).
pub(super) fn log(
    conn: &Connection,
    session_id: &SessionId,
    event: &TimelineEvent,
) -> rusqlite::Result<()> {
    let entry = serde_json::to_string(event)
        .map_err(|err| rusqlite::Error::ToSqlConversionFailure(Box::new(err)))?;
    conn.execute(
        "INSERT INTO session_log (session_id, at, entry) VALUES (?1, ?2, ?3)",
        params![session_id, now_ms(), entry],
    )?;
    Ok(())
}

/// One stored timeline row: `(seq, at, entry JSON)`.
pub type LogRow = (i64, i64, String);

impl Store {
    /// Records an error on the session's timeline (an agent exit, a failed restore or
    /// launch).
    pub async fn log_error(
        &self,
        session_id: SessionId,
        message: String,
    ) -> Result<(), StoreError> {
        self.call(move |conn| Ok(log(conn, &session_id, &TimelineEvent::Error { message })?)).await
    }

    /// Adds a timeline row (one that records no change of its own: a plan's progress).
    pub async fn log_event(
        &self,
        session_id: SessionId,
        event: TimelineEvent,
    ) -> Result<(), StoreError> {
        self.call(move |conn| Ok(log(conn, &session_id, &event)?)).await
    }

    /// The session's timeline rows after `after`, oldest first, at most `limit`.
    pub async fn timeline(
        &self,
        session_id: SessionId,
        after: i64,
        limit: usize,
    ) -> Result<Vec<LogRow>, StoreError> {
        self.call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT seq, at, entry FROM session_log WHERE session_id = ?1 AND seq > ?2 \
                 ORDER BY seq LIMIT ?3",
            )?;
            let rows = stmt
                .query_map(params![session_id, after, limit as i64], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// The session's newest `limit` timeline rows, newest first.
    pub async fn recent_timeline(
        &self,
        session_id: SessionId,
        limit: usize,
    ) -> Result<Vec<LogRow>, StoreError> {
        self.call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT seq, at, entry FROM session_log WHERE session_id = ?1 ORDER BY seq DESC LIMIT ?2",
            )?;
            let rows = stmt
                .query_map(params![session_id, limit as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// Stores a snapshot and its timeline row; a session keeps its newest
    /// [`TURN_SNAPSHOTS_KEPT`] `turn_complete` snapshots.
    pub async fn insert_snapshot(&self, snapshot: Snapshot) -> Result<(), StoreError> {
        let json = serde_json::to_string(&snapshot)
            .map_err(|err| StoreError::Corrupt { what: "snapshot", detail: err.to_string() })?;
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "INSERT INTO session_snapshots (id, session_id, kind, reason, taken_at, git_branch, \
                 git_head, git_dirty, context_used, context_size, snapshot) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                params![
                    snapshot.snapshot_id,
                    snapshot.session_id,
                    snapshot.trigger.as_str(),
                    snapshot.reason,
                    snapshot.taken_at,
                    snapshot.git.branch,
                    snapshot.git.head_commit,
                    snapshot.git.repository.then_some(snapshot.git.dirty),
                    snapshot.usage.context_used.map(|n| n as i64),
                    snapshot.usage.context_size.map(|n| n as i64),
                    json
                ],
            )?;
            log(
                &tx,
                &SessionId::from(snapshot.session_id.clone()),
                &TimelineEvent::SnapshotTaken {
                    snapshot_id: snapshot.snapshot_id.clone(),
                    trigger: snapshot.trigger,
                },
            )?;
            if snapshot.trigger == SnapshotTrigger::TurnComplete {
                tx.execute(
                    "DELETE FROM session_snapshots WHERE session_id = ?1 AND kind = 'turn_complete' \
                     AND id NOT IN (SELECT id FROM session_snapshots WHERE session_id = ?1 \
                     AND kind = 'turn_complete' ORDER BY taken_at DESC, id DESC LIMIT ?2)",
                    params![snapshot.session_id, TURN_SNAPSHOTS_KEPT as i64],
                )?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// A session's snapshots, oldest first.
    pub async fn snapshots(
        &self,
        session_id: SessionId,
    ) -> Result<Vec<SnapshotSummary>, StoreError> {
        self.call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT id, session_id, kind, reason, taken_at, git_branch, git_head, git_dirty, \
                 context_used, context_size FROM session_snapshots WHERE session_id = ?1 \
                 ORDER BY taken_at, id",
            )?;
            let rows = stmt
                .query_map([&session_id], |r| {
                    let kind: String = r.get(2)?;
                    Ok((
                        kind,
                        SnapshotSummary {
                            snapshot_id: r.get(0)?,
                            session_id: r.get(1)?,
                            trigger: SnapshotTrigger::Pause,
                            reason: r.get(3)?,
                            taken_at: r.get(4)?,
                            git_branch: r.get(5)?,
                            git_head: r.get(6)?,
                            git_dirty: r.get(7)?,
                            context_used: r.get::<_, Option<i64>>(8)?.map(|n| n as u64),
                            context_size: r.get::<_, Option<i64>>(9)?.map(|n| n as u64),
                        },
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter()
                .map(|(kind, mut summary)| {
                    summary.trigger = parse_trigger(&kind)?;
                    Ok(summary)
                })
                .collect()
        })
        .await
    }

    /// One snapshot, if it exists.
    pub async fn snapshot(&self, snapshot_id: String) -> Result<Option<Snapshot>, StoreError> {
        self.call(move |conn| {
            let json: Option<String> = conn
                .query_row(
                    "SELECT snapshot FROM session_snapshots WHERE id = ?1",
                    [&snapshot_id],
                    |r| r.get(0),
                )
                .optional()?;
            json.map(|json| parse_snapshot(&json)).transpose()
        })
        .await
    }

    /// A session's newest snapshot, if any: what a resume compiles its context from and
    /// compares the workspace with. A turn's snapshot is dated at its turn's end (though
    /// built and stored later), so a pause that followed the turn is newer; of the same
    /// millisecond, a pause's or a crash's comes before a turn's.
    pub async fn latest_snapshot(
        &self,
        session_id: SessionId,
    ) -> Result<Option<Snapshot>, StoreError> {
        self.call(move |conn| {
            let json: Option<String> = conn
                .query_row(
                    "SELECT snapshot FROM session_snapshots WHERE session_id = ?1 \
                     ORDER BY taken_at DESC, kind = 'turn_complete', id DESC LIMIT 1",
                    [&session_id],
                    |r| r.get(0),
                )
                .optional()?;
            json.map(|json| parse_snapshot(&json)).transpose()
        })
        .await
    }

    /// Keeps the workspace's commit at the session's start (`None`: not a repository) and
    /// what its uncommitted files held then; the first one recorded stays.
    pub async fn set_start_commit(
        &self,
        session_id: SessionId,
        commit: Option<String>,
        dirty: BTreeMap<String, String>,
    ) -> Result<(), StoreError> {
        let dirty = serde_json::to_string(&dirty)
            .map_err(|err| StoreError::Corrupt { what: "start files", detail: err.to_string() })?;
        self.call(move |conn| {
            conn.execute(
                "INSERT OR IGNORE INTO session_start (session_id, git_commit, recorded_at, dirty) VALUES (?1, ?2, ?3, ?4)",
                params![session_id, commit, now_ms(), dirty],
            )?;
            Ok(())
        })
        .await
    }

    /// What the workspace's uncommitted files held at the session's start (empty when
    /// none were, or it was not recorded).
    pub async fn start_dirty(
        &self,
        session_id: SessionId,
    ) -> Result<BTreeMap<String, String>, StoreError> {
        self.call(move |conn| {
            let json: Option<Option<String>> = conn
                .query_row(
                    "SELECT dirty FROM session_start WHERE session_id = ?1",
                    [&session_id],
                    |r| r.get(0),
                )
                .optional()?;
            match json.flatten() {
                Some(json) => serde_json::from_str(&json).map_err(|err| StoreError::Corrupt {
                    what: "start files",
                    detail: err.to_string(),
                }),
                None => Ok(BTreeMap::new()),
            }
        })
        .await
    }

    /// The workspace's commit at the session's start: `None` if none was recorded,
    /// `Some(None)` if the workspace was not a repository then.
    pub async fn start_commit(
        &self,
        session_id: SessionId,
    ) -> Result<Option<Option<String>>, StoreError> {
        self.call(move |conn| {
            Ok(conn
                .query_row(
                    "SELECT git_commit FROM session_start WHERE session_id = ?1",
                    [&session_id],
                    |r| r.get(0),
                )
                .optional()?)
        })
        .await
    }

    /// The snapshot a pending handoff is primed from, if the session's next resume is one.
    pub async fn handoff(&self, session_id: SessionId) -> Result<Option<String>, StoreError> {
        self.call(move |conn| {
            Ok(conn
                .query_row(
                    "SELECT snapshot_id FROM session_handoffs WHERE session_id = ?1",
                    [&session_id],
                    |r| r.get(0),
                )
                .optional()?)
        })
        .await
    }
}

/// A stored trigger name.
pub(super) fn parse_trigger(text: &str) -> Result<SnapshotTrigger, StoreError> {
    text.parse().map_err(|detail| StoreError::Corrupt { what: "snapshot trigger", detail })
}

fn parse_snapshot(json: &str) -> Result<Snapshot, StoreError> {
    serde_json::from_str(json)
        .map_err(|err| StoreError::Corrupt { what: "snapshot", detail: err.to_string() })
}
