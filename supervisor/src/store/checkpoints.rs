//! Workspace checkpoints (`session_checkpoints`): one row per commit of a session's
//! checkpoint repository, with its timeline row in the same transaction.

use protocol::api::{Checkpoint, CheckpointTrigger, LeftOut, TimelineEvent};
use rusqlite::{OptionalExtension, params};

use super::journal::log;
use super::{Store, StoreError};
use crate::ids::{SessionId, TurnId};

const COLUMNS: &str =
    "seq, trigger, turn_id, turn, commit_id, ref, files, bytes, added_bytes, left_out, taken_at";

fn as_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn as_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Checkpoint> {
    let trigger: String = r.get(1)?;
    let left_out: String = r.get(9)?;
    Ok(Checkpoint {
        seq: as_u64(r.get(0)?),
        trigger: serde_json::from_value(serde_json::Value::String(trigger))
            .unwrap_or(CheckpointTrigger::Turn),
        turn_id: r.get(2)?,
        turn: r.get::<_, Option<i64>>(3)?.map(as_u64),
        commit: r.get(4)?,
        git_ref: r.get(5)?,
        files: as_u64(r.get(6)?),
        bytes: as_u64(r.get(7)?),
        added_bytes: as_u64(r.get(8)?),
        left_out: serde_json::from_str::<Vec<LeftOut>>(&left_out).unwrap_or_default(),
        taken_at: r.get(10)?,
    })
}

impl Store {
    /// Stores a checkpoint and its timeline row.
    pub async fn insert_checkpoint(
        &self,
        session_id: SessionId,
        checkpoint: Checkpoint,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction()?;
            let left_out = serde_json::to_string(&checkpoint.left_out)
                .map_err(|err| rusqlite::Error::ToSqlConversionFailure(Box::new(err)))?;
            tx.execute(
                &format!(
                    "INSERT INTO session_checkpoints (session_id, {COLUMNS}) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
                ),
                params![
                    session_id,
                    as_i64(checkpoint.seq),
                    checkpoint.trigger.as_str(),
                    checkpoint.turn_id,
                    checkpoint.turn.map(as_i64),
                    checkpoint.commit,
                    checkpoint.git_ref,
                    as_i64(checkpoint.files),
                    as_i64(checkpoint.bytes),
                    as_i64(checkpoint.added_bytes),
                    left_out,
                    checkpoint.taken_at,
                ],
            )?;
            let event = TimelineEvent::CheckpointTaken {
                checkpoint: checkpoint.seq,
                trigger: checkpoint.trigger,
                turn: checkpoint.turn,
                commit: checkpoint.commit,
                files: checkpoint.files,
                added_bytes: checkpoint.added_bytes,
            };
            log(&tx, &session_id, &event)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// The session's checkpoints, oldest first.
    pub async fn checkpoints(&self, session_id: SessionId) -> Result<Vec<Checkpoint>, StoreError> {
        self.call(move |conn| {
            let mut stmt = conn.prepare(&format!(
                "SELECT {COLUMNS} FROM session_checkpoints WHERE session_id = ?1 ORDER BY seq"
            ))?;
            let rows = stmt.query_map([&session_id], row)?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    /// The session's newest checkpoint.
    pub async fn latest_checkpoint(
        &self,
        session_id: SessionId,
    ) -> Result<Option<Checkpoint>, StoreError> {
        self.call(move |conn| {
            Ok(conn
                .query_row(
                    &format!(
                        "SELECT {COLUMNS} FROM session_checkpoints WHERE session_id = ?1 \
                         ORDER BY seq DESC LIMIT 1"
                    ),
                    [&session_id],
                    row,
                )
                .optional()?)
        })
        .await
    }

    /// A turn's number in its session, from 1 (in the order turns started).
    pub async fn turn_number(
        &self,
        session_id: SessionId,
        turn_id: TurnId,
    ) -> Result<Option<u64>, StoreError> {
        self.call(move |conn| {
            let n: i64 = conn.query_row(
                "SELECT COUNT(*) FROM turns t, turns me WHERE me.id = ?2 AND me.session_id = ?1 \
                 AND t.session_id = ?1 AND (t.started_at, t.id) <= (me.started_at, me.id)",
                params![session_id, turn_id],
                |r| r.get(0),
            )?;
            Ok((n > 0).then(|| as_u64(n)))
        })
        .await
    }
}
