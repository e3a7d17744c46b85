//! The schema as numbered migrations. Each runs in its own transaction and is recorded in
//! `schema_migrations`; existing migrations are never edited, only new ones appended.

use rusqlite::{Connection, OptionalExtension, params};

use super::{StoreError, now_ms};

/// The migrations, in order; migration `n` is `MIGRATIONS[n - 1]`.
pub const MIGRATIONS: &[&str] = &[
    // 1: the data model of DESIGN §3.
    "
    CREATE TABLE tasks (
        id TEXT PRIMARY KEY,
        title TEXT NOT NULL,
        description TEXT NOT NULL DEFAULT '',
        state TEXT NOT NULL CHECK (state IN ('TODO','IN_PROGRESS','REVIEW','COMPLETED','FAILED','CANCELLED')),
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );
    CREATE TABLE task_sessions (
        id TEXT PRIMARY KEY,
        task_id TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
        agent_profile_id TEXT NOT NULL,
        profile_snapshot TEXT NOT NULL,
        runtime TEXT NOT NULL CHECK (runtime IN ('standalone','docker')),
        state TEXT NOT NULL CHECK (state IN ('CREATED','STARTING','RUNNING','WAITING_FOR_INPUT','COMPLETED','FAILED','CANCELLED')),
        workspace_path TEXT NOT NULL,
        error_message TEXT,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );
    CREATE INDEX task_sessions_by_task ON task_sessions(task_id);
    CREATE INDEX task_sessions_by_state ON task_sessions(state);
    CREATE TABLE executors_running (
        session_id TEXT PRIMARY KEY REFERENCES task_sessions(id) ON DELETE CASCADE,
        execution_id TEXT NOT NULL,
        generation INTEGER NOT NULL,
        runtime TEXT NOT NULL,
        status TEXT NOT NULL,
        resume_token TEXT,
        last_message_uuid TEXT,
        container_id TEXT,
        agentctl_url TEXT,
        agentctl_port INTEGER,
        agentctl_pid INTEGER,
        agentctl_start_time INTEGER,
        boot_id TEXT,
        agentctl_token TEXT,
        acked_seq INTEGER NOT NULL DEFAULT 0,
        resume_context_pending INTEGER NOT NULL DEFAULT 0,
        worktree_id TEXT,
        worktree_path TEXT,
        worktree_branch TEXT,
        last_seen_at INTEGER,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );
    CREATE TABLE turns (
        id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES task_sessions(id) ON DELETE CASCADE,
        execution_id TEXT NOT NULL,
        request_id TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('running','completed','failed','interrupted')),
        stop_reason TEXT,
        error TEXT,
        started_at INTEGER NOT NULL,
        ended_at INTEGER
    );
    CREATE INDEX turns_by_session ON turns(session_id);
    CREATE TABLE pending_requests (
        session_id TEXT NOT NULL REFERENCES task_sessions(id) ON DELETE CASCADE,
        execution_id TEXT NOT NULL,
        request_id TEXT NOT NULL,
        method TEXT NOT NULL,
        params TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (session_id, request_id)
    );
    ",
    // 2: what a re-attach and resume need: the ACP session id of the execution (kept even
    // when it is not a resume token) and the outcome of the last resume.
    "
    ALTER TABLE executors_running ADD COLUMN acp_session_id TEXT;
    ALTER TABLE executors_running ADD COLUMN resume_outcome TEXT;
    ",
    // 3: whether a turn's prompt reached agentctl (its `delivered` event was handled), so a
    // restart can fail a prompt that never got through instead of waiting for it forever.
    // Turns recorded before this migration count as delivered.
    "
    ALTER TABLE turns ADD COLUMN delivered INTEGER NOT NULL DEFAULT 1;
    ",
    // 4: restart recovery finds the few sessions that need it through indexes, without
    // reading the rows of the thousands at rest (a session row's pinned profile comes
    // before its state and runtime, so reading those from the table reads the snapshot).
    "
    DROP INDEX task_sessions_by_state;
    CREATE INDEX task_sessions_by_state_runtime ON task_sessions(state, runtime, id);
    CREATE INDEX executors_running_by_status ON executors_running(status);
    CREATE INDEX executors_running_by_runtime ON executors_running(runtime);
    CREATE INDEX executors_running_by_pid ON executors_running(agentctl_pid);
    CREATE INDEX turns_running ON turns(session_id) WHERE state = 'running';
    ",
    // 5: the `PAUSED` state. A CHECK constraint cannot be altered: the table is
    // rebuilt (foreign keys are off while migrations run, so dropping the old table
    // cascades to nothing; `foreign_key_check` runs before the commit). A pause asked for
    // while a turn runs is kept in `session_pauses`, so it survives a restart.
    "
    CREATE TABLE task_sessions_new (
        id TEXT PRIMARY KEY,
        task_id TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
        agent_profile_id TEXT NOT NULL,
        profile_snapshot TEXT NOT NULL,
        runtime TEXT NOT NULL CHECK (runtime IN ('standalone','docker')),
        state TEXT NOT NULL CHECK (state IN ('CREATED','STARTING','RUNNING','WAITING_FOR_INPUT','COMPLETED','FAILED','CANCELLED','PAUSED')),
        workspace_path TEXT NOT NULL,
        error_message TEXT,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );
    INSERT INTO task_sessions_new (id, task_id, agent_profile_id, profile_snapshot, runtime, state,
        workspace_path, error_message, created_at, updated_at)
        SELECT id, task_id, agent_profile_id, profile_snapshot, runtime, state, workspace_path,
        error_message, created_at, updated_at FROM task_sessions;
    DROP TABLE task_sessions;
    ALTER TABLE task_sessions_new RENAME TO task_sessions;
    CREATE INDEX task_sessions_by_task ON task_sessions(task_id);
    CREATE INDEX task_sessions_by_state_runtime ON task_sessions(state, runtime, id);
    CREATE TABLE session_pauses (
        session_id TEXT PRIMARY KEY REFERENCES task_sessions(id) ON DELETE CASCADE,
        reason TEXT,
        force_at INTEGER NOT NULL,
        requested_at INTEGER NOT NULL
    );
    ",
    // 6: snapshots, the timeline and the capacity handoff. `session_log` is the
    // timeline: one row per thing that happened to a session, written in the same
    // transaction as the change it records. A snapshot is its JSON plus the columns a list
    // shows. `session_start` keeps the workspace's commit when the session started;
    // `session_handoffs` marks a session paused for exhaustion, whose next resume opens a
    // fresh agent session primed from the snapshot named.
    "
    CREATE TABLE session_log (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL REFERENCES task_sessions(id) ON DELETE CASCADE,
        at INTEGER NOT NULL,
        entry TEXT NOT NULL
    );
    CREATE INDEX session_log_by_session ON session_log(session_id, seq);
    CREATE TABLE session_snapshots (
        id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES task_sessions(id) ON DELETE CASCADE,
        kind TEXT NOT NULL CHECK (kind IN ('pause','turn_complete','exhaustion','timeout','crash')),
        reason TEXT,
        taken_at INTEGER NOT NULL,
        git_branch TEXT,
        git_head TEXT,
        git_dirty INTEGER,
        context_used INTEGER,
        context_size INTEGER,
        snapshot TEXT NOT NULL
    );
    CREATE INDEX session_snapshots_by_session ON session_snapshots(session_id, taken_at);
    CREATE TABLE session_start (
        session_id TEXT PRIMARY KEY REFERENCES task_sessions(id) ON DELETE CASCADE,
        git_commit TEXT,
        recorded_at INTEGER NOT NULL
    );
    CREATE TABLE session_handoffs (
        session_id TEXT PRIMARY KEY REFERENCES task_sessions(id) ON DELETE CASCADE,
        snapshot_id TEXT NOT NULL,
        created_at INTEGER NOT NULL
    );
    ALTER TABLE session_pauses ADD COLUMN kind TEXT NOT NULL DEFAULT 'pause';
    ",
    // 7: occupancy: a workspace's live holder is found through an index.
    "
    CREATE INDEX task_sessions_by_workspace ON task_sessions(workspace_path, state);
    ",
    // 8: The prompt a session was created with, so the resume of a session whose
    // first launch failed sends it; the repository and branch of the worktree Tether made
    // for a session (its `workspace_path` is the worktree). Added last, after the columns
    // restart recovery reads.
    "
    ALTER TABLE task_sessions ADD COLUMN initial_prompt TEXT;
    ALTER TABLE task_sessions ADD COLUMN worktree_repo TEXT;
    ALTER TABLE task_sessions ADD COLUMN worktree_branch TEXT;
    ",
    // 9: An open runtime seam. The runtime is any registered name (the CHECK
    // goes: the table is rebuilt as in 5); the labels a session asked to be placed by; the
    // runtime's opaque handle of an execution (JSON) replaces the per-runtime
    // `container_id`, which is carried over into it and no longer written; the certificate
    // a TLS control channel is pinned to (a sidecar on a remote engine).
    "
    CREATE TABLE task_sessions_new (
        id TEXT PRIMARY KEY,
        task_id TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
        agent_profile_id TEXT NOT NULL,
        profile_snapshot TEXT NOT NULL,
        runtime TEXT NOT NULL CHECK (length(runtime) BETWEEN 1 AND 64),
        state TEXT NOT NULL CHECK (state IN ('CREATED','STARTING','RUNNING','WAITING_FOR_INPUT','COMPLETED','FAILED','CANCELLED','PAUSED')),
        workspace_path TEXT NOT NULL,
        error_message TEXT,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        initial_prompt TEXT,
        worktree_repo TEXT,
        worktree_branch TEXT,
        runtime_labels TEXT
    );
    INSERT INTO task_sessions_new (id, task_id, agent_profile_id, profile_snapshot, runtime, state,
        workspace_path, error_message, created_at, updated_at, initial_prompt, worktree_repo,
        worktree_branch)
        SELECT id, task_id, agent_profile_id, profile_snapshot, runtime, state, workspace_path,
        error_message, created_at, updated_at, initial_prompt, worktree_repo, worktree_branch
        FROM task_sessions;
    DROP TABLE task_sessions;
    ALTER TABLE task_sessions_new RENAME TO task_sessions;
    CREATE INDEX task_sessions_by_task ON task_sessions(task_id);
    CREATE INDEX task_sessions_by_state_runtime ON task_sessions(state, runtime, id);
    CREATE INDEX task_sessions_by_workspace ON task_sessions(workspace_path, state);
    ALTER TABLE executors_running ADD COLUMN runtime_handle TEXT;
    ALTER TABLE executors_running ADD COLUMN agentctl_cert TEXT;
    UPDATE executors_running SET runtime_handle = json_object('container', container_id)
        WHERE container_id IS NOT NULL;
    ",
    // 10: Branches Tether made whose deletion was asked for (a delete with
    // `delete_branch`), kept until the branch is gone: recovery finishes a deletion a kill
    // cut short, by the recorded name only.
    "
    CREATE TABLE branch_deletions (
        repo TEXT NOT NULL,
        branch TEXT NOT NULL,
        session_id TEXT NOT NULL,
        PRIMARY KEY (repo, branch)
    );
    ",
    // 11: The highest session event seq issued as of the session's last state
    // change: a reopened event log never numbers below it (see `Spool::open_marked`).
    "
    ALTER TABLE task_sessions ADD COLUMN event_seq_high INTEGER NOT NULL DEFAULT 0;
    ",
    // 12: Workflows: the spec they run (text and SHA-256), each step's state,
    // run, loop pass, session and output, and the workflow's event stream. A step's end is
    // written in the transaction that ends its session's turn.
    "
    CREATE TABLE workflows (
        id TEXT PRIMARY KEY,
        task_id TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
        name TEXT NOT NULL,
        spec_file TEXT,
        spec_text TEXT NOT NULL,
        spec_sha256 TEXT NOT NULL,
        vars TEXT NOT NULL,
        workspace TEXT,
        state TEXT NOT NULL CHECK (state IN ('running','completed','failed','cancelled')),
        error TEXT,
        resumes INTEGER NOT NULL DEFAULT 0,
        event_seq INTEGER NOT NULL DEFAULT 0,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );
    CREATE INDEX workflows_by_state ON workflows(state);
    CREATE TABLE workflow_steps (
        workflow_id TEXT NOT NULL REFERENCES workflows(id) ON DELETE CASCADE,
        step_id TEXT NOT NULL,
        position INTEGER NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('pending','waiting_approval','running','completed','failed','skipped','cancelled')),
        iteration INTEGER NOT NULL DEFAULT 0,
        runs INTEGER NOT NULL DEFAULT 0,
        resends INTEGER NOT NULL DEFAULT 0,
        launch_failures INTEGER NOT NULL DEFAULT 0,
        approved INTEGER NOT NULL DEFAULT 0,
        applied INTEGER NOT NULL DEFAULT 0,
        session_id TEXT,
        prompt TEXT,
        output TEXT,
        error TEXT,
        started_at INTEGER,
        ended_at INTEGER,
        PRIMARY KEY (workflow_id, step_id)
    );
    CREATE INDEX workflow_steps_by_session ON workflow_steps(session_id);
    CREATE TABLE workflow_events (
        workflow_id TEXT NOT NULL REFERENCES workflows(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        at INTEGER NOT NULL,
        event TEXT NOT NULL,
        PRIMARY KEY (workflow_id, seq)
    );
    ",
    // 13: A step's usage (what its agent reported of context and cost), stored
    // with its end.
    "
    ALTER TABLE workflow_steps ADD COLUMN usage TEXT;
    ",
    // 14: Parking idle sessions and the pauses of budgets and limits. Snapshots
    // take the new triggers (the CHECK is rebuilt as in 5); a session keeps when it was last
    // paused and what paused it, for `status` to say.
    "
    CREATE TABLE session_snapshots_new (
        id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES task_sessions(id) ON DELETE CASCADE,
        kind TEXT NOT NULL CHECK (kind IN ('pause','turn_complete','exhaustion','timeout','crash','idle','budget','max_turns','max_duration')),
        reason TEXT,
        taken_at INTEGER NOT NULL,
        git_branch TEXT,
        git_head TEXT,
        git_dirty INTEGER,
        context_used INTEGER,
        context_size INTEGER,
        snapshot TEXT NOT NULL
    );
    INSERT INTO session_snapshots_new SELECT id, session_id, kind, reason, taken_at, git_branch,
        git_head, git_dirty, context_used, context_size, snapshot FROM session_snapshots;
    DROP TABLE session_snapshots;
    ALTER TABLE session_snapshots_new RENAME TO session_snapshots;
    CREATE INDEX session_snapshots_by_session ON session_snapshots(session_id, taken_at);
    ALTER TABLE task_sessions ADD COLUMN paused_at INTEGER;
    ALTER TABLE task_sessions ADD COLUMN pause_kind TEXT;
    ",
    // 15: Usage and budgets, and re-sending an interrupted turn. A turn keeps its
    // prompt (for `retry_turn`), the turn it re-sends, and what its agent reported: tokens
    // by kind, the cost it added and the context at its end, written with its end. A
    // session keeps the agent's last cumulative cost (`cost_mark`), from which the next
    // turn's cost is taken apart; sessions and tasks may carry a budget.
    "
    ALTER TABLE turns ADD COLUMN prompt TEXT;
    ALTER TABLE turns ADD COLUMN retry_of TEXT;
    ALTER TABLE turns ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE turns ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE turns ADD COLUMN cached_read_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE turns ADD COLUMN cached_write_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE turns ADD COLUMN thought_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE turns ADD COLUMN total_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE turns ADD COLUMN cost REAL;
    ALTER TABLE turns ADD COLUMN cost_currency TEXT;
    ALTER TABLE turns ADD COLUMN context_used INTEGER;
    ALTER TABLE turns ADD COLUMN context_size INTEGER;
    CREATE UNIQUE INDEX turns_retry_of ON turns(retry_of) WHERE retry_of IS NOT NULL;
    CREATE INDEX turns_by_end ON turns(ended_at);
    ALTER TABLE task_sessions ADD COLUMN cost_mark REAL;
    ALTER TABLE task_sessions ADD COLUMN cost_mark_currency TEXT;
    ALTER TABLE task_sessions ADD COLUMN budget TEXT;
    ALTER TABLE tasks ADD COLUMN budget TEXT;
    ",
    // 16: The MCP servers a session's agent is given (ACP `McpServer` objects as
    // the client sent them, JSON; NULL for none), at every `session/new`, `load` and
    // `resume`.
    "
    ALTER TABLE task_sessions ADD COLUMN mcp_servers TEXT;
    ",
    // 17: The agent's settings (`crate::settings::SessionSettings`, JSON): the
    // config options and modes it last reported and those chosen through Tether; NULL
    // until either is known. And the title the agent gave the session
    // (`session_info_update`), for lists; the directories besides the workspace its agent
    // is given (JSON array; NULL for none).
    "
    ALTER TABLE task_sessions ADD COLUMN settings TEXT;
    ALTER TABLE task_sessions ADD COLUMN title TEXT;
    ALTER TABLE task_sessions ADD COLUMN additional_directories TEXT;
    ",
    // 18: The reason a paused session was given (as `task.session.pause` was
    // asked, or a limit's own words), beside `paused_at` and `pause_kind`.
    "
    ALTER TABLE task_sessions ADD COLUMN pause_reason TEXT;
    ",
    // 19: When a waiting pause asked its agent for a summary (a restart then
    // knows the summary turn and does not ask again).
    "
    ALTER TABLE session_pauses ADD COLUMN summary_asked_at INTEGER;
    ",
    // 20: What the workspace's uncommitted files held when the session started
    // (JSON object path → content hash; NULL: not recorded), so that they are not counted
    // as the session's changes.
    "
    ALTER TABLE session_start ADD COLUMN dirty TEXT;
    ",
    // 21: Tokens an agent never reported are unknown, not zero: a turn keeps
    // whether its agent reported any (turns before this migration did if they counted
    // some). A session keeps its agent's last running totals (`tokens_mark`, JSON with
    // the ACP session they count), from which a cumulative agent's next turn is taken
    // apart, as `cost_mark` is for cost.
    "
    ALTER TABLE turns ADD COLUMN tokens_reported INTEGER NOT NULL DEFAULT 0;
    UPDATE turns SET tokens_reported = 1 WHERE total_tokens > 0;
    ALTER TABLE task_sessions ADD COLUMN tokens_mark TEXT;
    ",
    // 22: why the prompt a session's launch sends by itself (the one it was created with)
    // was refused before any turn of it was recorded (JSON of `store::PromptRefusal`;
    // NULL: not refused, or a turn was recorded since), so that a workflow step whose
    // session will never send its prompt ends instead of waiting for it.
    "
    ALTER TABLE task_sessions ADD COLUMN prompt_refused TEXT;
    ",
    // 23: Prompts queued while a turn runs, in their order (`position`, from 1), each
    // taken into the turn it becomes in the transaction that records that turn
    // (`turns.queued_prompt`, unique: a queued prompt runs once); and why a session's
    // queue is halted (a turn failed; NULL: it runs).
    "
    CREATE TABLE prompt_queue (
        id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES task_sessions(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        prompt TEXT NOT NULL,
        queued_at INTEGER NOT NULL
    );
    CREATE INDEX prompt_queue_by_session ON prompt_queue(session_id, position);
    ALTER TABLE turns ADD COLUMN queued_prompt TEXT;
    CREATE UNIQUE INDEX turns_queued_prompt ON turns(queued_prompt) WHERE queued_prompt IS NOT NULL;
    ALTER TABLE task_sessions ADD COLUMN queue_halted TEXT;
    ",
    // 24: A steer that fell back to cancelling its turn waits in the queue, first, with the
    // turn it cancelled (`steer_of`; NULL: an ordinary queued prompt).
    "
    ALTER TABLE prompt_queue ADD COLUMN steer_of TEXT;
    ",
    // 25: Forks: a session made from another's conversation up to one of its turns
    // (`from_session` is not a reference: the original may be deleted and the fork live
    // on), and the original's agent session to `session/fork` at the fork's first start
    // (`native_token`; NULL: its history is injected instead, or it opened already).
    "
    CREATE TABLE session_forks (
        session_id TEXT PRIMARY KEY REFERENCES task_sessions(id) ON DELETE CASCADE,
        from_session TEXT NOT NULL,
        from_turn TEXT NOT NULL,
        native_token TEXT,
        created_at INTEGER NOT NULL
    );
    CREATE INDEX session_forks_by_origin ON session_forks(from_session);
    ",
    // 26: Rewinds: a session's conversation made to end at one of its turns. The history
    // entries `from_seq..=to_seq` (the later turns', as the file held them) are left out of
    // every history injection from then on; `pending` until the agent's next session
    // opened without them. Turns rewound name their rewind (`turns.rewound_by`).
    "
    CREATE TABLE session_rewinds (
        id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES task_sessions(id) ON DELETE CASCADE,
        turn_id TEXT NOT NULL,
        from_seq INTEGER NOT NULL,
        to_seq INTEGER NOT NULL,
        workspace_restored INTEGER NOT NULL,
        saved_ref TEXT,
        pending INTEGER NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE INDEX session_rewinds_by_session ON session_rewinds(session_id, created_at);
    ALTER TABLE turns ADD COLUMN rewound_by TEXT;
    ",
    // 27: A review's keeps: a changed file of a session kept at the content the reviewer
    // saw (its blob hash, `-` for a deletion); it is kept while it still holds that.
    "
    CREATE TABLE change_keeps (
        session_id TEXT NOT NULL REFERENCES task_sessions(id) ON DELETE CASCADE,
        path TEXT NOT NULL,
        content TEXT NOT NULL,
        kept_at INTEGER NOT NULL,
        PRIMARY KEY (session_id, path)
    );
    ",
    // 28: Where each turn starts in the session's event log (its `turn_started` event's
    // seq), so a page can open a long session at its newest prompt and load it by turn.
    "
    ALTER TABLE turns ADD COLUMN event_seq INTEGER;
    ",
    // 29: Workspace checkpoints: one row per commit in the session's checkpoint
    // repository (`sessions/<id>/checkpoints.git`), written once its ref is; `left_out` is
    // a JSON list of the files over the per-file limit.
    "
    CREATE TABLE session_checkpoints (
        session_id TEXT NOT NULL REFERENCES task_sessions(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        trigger TEXT NOT NULL,
        turn_id TEXT,
        turn INTEGER,
        commit_id TEXT NOT NULL,
        ref TEXT NOT NULL,
        files INTEGER NOT NULL,
        bytes INTEGER NOT NULL,
        added_bytes INTEGER NOT NULL,
        left_out TEXT NOT NULL,
        taken_at INTEGER NOT NULL,
        PRIMARY KEY (session_id, seq)
    );
    ",
    // 30: Engines taken out of service (`engines.drain`): `draining` until none of its
    // sessions is left there, then `drained`; no row: serving. A session's move off an
    // engine, from its start to its timeline row (a restart carries it on); `resume`: its
    // agent was running, and runs again on the engine it moves to.
    "
    CREATE TABLE engine_states (
        name TEXT PRIMARY KEY,
        state TEXT NOT NULL,
        since INTEGER NOT NULL,
        force_after_ms INTEGER NOT NULL
    );
    CREATE TABLE session_moves (
        session_id TEXT PRIMARY KEY REFERENCES task_sessions(id) ON DELETE CASCADE,
        from_engine TEXT NOT NULL,
        reason TEXT NOT NULL,
        resume INTEGER NOT NULL,
        started_at INTEGER NOT NULL
    );
    ",
    // 31: What the session's agent is to be told with its next prompt (a file the
    // reviewer reverted): tied to that prompt's turn in the transaction that records it,
    // removed once the prompt was delivered (a turn that never reached the agent leaves
    // its notes to the next).
    "
    CREATE TABLE agent_notes (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL REFERENCES task_sessions(id) ON DELETE CASCADE,
        note TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        turn_id TEXT
    );
    CREATE INDEX agent_notes_by_session ON agent_notes(session_id, id);
    ",
];

/// Brings the database up to the newest migration.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
    )?;
    let current: usize =
        conn.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |r| {
            r.get(0)
        })?;
    if current > MIGRATIONS.len() {
        return Err(StoreError::Corrupt {
            what: "schema version",
            detail: format!(
                "the database is at version {current}, newer than this build ({})",
                MIGRATIONS.len()
            ),
        });
    }
    if current < MIGRATIONS.len() {
        // Off while migrations run: a table rebuild must not cascade (each migration checks
        // the keys before it commits). It only takes effect outside a transaction.
        conn.pragma_update(None, "foreign_keys", "OFF")?;
    }
    for (idx, sql) in MIGRATIONS.iter().enumerate().skip(current) {
        let version = idx + 1;
        let apply = |conn: &mut Connection| -> rusqlite::Result<()> {
            let tx = conn.transaction()?;
            tx.execute_batch(sql)?;
            let broken: Option<String> =
                tx.query_row("PRAGMA foreign_key_check", [], |r| r.get(0)).optional()?;
            if let Some(table) = broken {
                return Err(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY),
                    Some(format!("a row of {table} refers to a missing row")),
                ));
            }
            tx.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, ?2)",
                params![version, now_ms()],
            )?;
            tx.commit()
        };
        let applied = apply(conn);
        if applied.is_err() {
            let _ = conn.pragma_update(None, "foreign_keys", "ON");
        }
        applied.map_err(|source| StoreError::Migration { version, source })?;
        tracing::info!(version, "applied database migration");
    }
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(())
}
