//! The API trait: every method of Tether's JSON-RPC surface, its params and results.

use super::{
    AgentInfo, BudgetUse, ChangesReverted, CheckpointList, CheckpointRestored, CleanupResult, Done,
    EngineInfo, EngineList, EventBatch, EventWindow, ForkResult, HistoryEntry, PauseResult,
    PromptQueue, PromptStarted, ResumeResult, RewindResult, RpcResult, RuntimeKind, SessionChanges,
    SessionConfig, SessionEvent, SessionMoved, SessionState, SessionStatus, SessionSummary,
    SessionsEvent, Snapshot, SnapshotSummary, Steered, StopAllResult, SubscriptionResult, Task,
    TaskDetail, Timeline, UsageGroupBy, UsageReport, Value, WorkflowEvent, WorkflowStarted,
    WorkflowStatus, WorkflowSummary, WorkflowsEvent, params, rpc,
};

#[rpc(server, client)]
pub trait Api {
    /// Every agent profile, with whether it can run here and why not.
    #[method(name = "agents.list")]
    async fn agents_list(&self) -> RpcResult<Vec<AgentInfo>>;

    /// Creates a task.
    #[method(name = "task.create", param_kind = map)]
    async fn task_create(&self, title: String, description: Option<String>) -> RpcResult<Task>;

    /// Every task, oldest first.
    #[method(name = "task.list")]
    async fn task_list(&self) -> RpcResult<Vec<Task>>;

    /// A task and its sessions.
    #[method(name = "task.get", param_kind = map)]
    async fn task_get(&self, task_id: String) -> RpcResult<TaskDetail>;

    /// Deletes a task and every session of it (each as `task.session.delete` does):
    /// refused, changing nothing, while one of its sessions is live (its agent runs or is
    /// being brought up: stop or pause it first) or, unless `force`, while a worktree of one
    /// holds uncommitted work; the branches stay unless `delete_branch`.
    #[method(name = "task.delete", param_kind = map)]
    async fn task_delete(
        &self,
        task_id: String,
        force: Option<bool>,
        delete_branch: Option<bool>,
    ) -> RpcResult<Done>;

    /// Creates a session of `task_id` with an agent profile in a workspace and starts its
    /// agent; `prompt` (or else the task's description) is its first prompt. A workspace
    /// held by a live session is refused (`conflict`) unless `shared` is true. With
    /// `worktree` (default: whether the profile has a `[workspace]` section), the session
    /// works in a git worktree of its own, on a new branch from `base`, of the repository
    /// at `workspace_path` (or the profile's `workspace.repo`). `labels` place it: the
    /// runtime runs it only where every label is carried (a Docker engine's labels),
    /// besides the profile's own `[docker] labels`. `mcp_servers` (ACP `McpServer`
    /// objects: stdio, http or sse) are given to its agent at every `session/new`,
    /// `session/load` and `session/resume`, this execution's and every later one's, and so
    /// are `additional_directories` (to agents that take them). `session_id` (a UUID)
    /// chooses the new session's id.
    #[method(name = "task.session.create", param_kind = map)]
    async fn session_create(
        &self,
        task_id: String,
        agent_profile_id: String,
        workspace_path: Option<String>,
        prompt: Option<String>,
        runtime: Option<RuntimeKind>,
        shared: Option<bool>,
        worktree: Option<bool>,
        base: Option<String>,
        labels: Option<std::collections::BTreeMap<String, String>>,
        mcp_servers: Option<Vec<serde_json::Value>>,
        session_id: Option<String>,
        additional_directories: Option<Vec<String>>,
    ) -> RpcResult<SessionSummary>;

    /// Sessions, oldest first, filtered by task, state and profile when given.
    #[method(name = "task.session.list", param_kind = map)]
    async fn session_list(
        &self,
        task_id: Option<String>,
        state: Option<SessionState>,
        agent_profile_id: Option<String>,
    ) -> RpcResult<Vec<SessionSummary>>;

    /// A session's status; `needs_resume` says whether to call `task.session.resume`.
    #[method(name = "task.session.status", param_kind = map)]
    async fn session_status(&self, session_id: String) -> RpcResult<SessionStatus>;

    /// Sends a prompt (resuming the session first when its agent is not running); the
    /// turn's output arrives as events.
    #[method(name = "task.session.prompt", param_kind = map)]
    async fn session_prompt(&self, session_id: String, prompt: String) -> RpcResult<PromptStarted>;

    /// Steers the running turn with `prompt`: into the turn where the agent takes that,
    /// else by cancelling the turn and running `prompt` next, ahead of the queue. With no
    /// turn running it is a prompt.
    #[method(name = "task.session.steer", param_kind = map)]
    async fn session_steer(&self, session_id: String, prompt: String) -> RpcResult<Steered>;

    /// Forks the session at `turn_id` (default: its newest turn): a new session of the same
    /// task whose conversation is the original's up to and including that turn.
    #[method(name = "task.session.fork", param_kind = map)]
    async fn session_fork(
        &self,
        session_id: String,
        turn_id: Option<String>,
    ) -> RpcResult<ForkResult>;

    /// Rewinds the session to `turn_id`: later turns are marked rewound (kept, never
    /// deleted) and leave the agent's context; with `restore_workspace`, the workspace
    /// returns to its git state at that turn, what it held saved on a ref first.
    #[method(name = "task.session.rewind", param_kind = map)]
    async fn session_rewind(
        &self,
        session_id: String,
        turn_id: String,
        restore_workspace: Option<bool>,
    ) -> RpcResult<RewindResult>;

    /// Every file the session's workspace changed since its base commit, with its diff
    /// and whether a review kept it.
    #[method(name = "task.session.changes", param_kind = map)]
    async fn session_changes(&self, session_id: String) -> RpcResult<SessionChanges>;

    /// Reverts one changed file to its content in the base commit, the workspace's files
    /// saved on a ref first.
    #[method(name = "task.session.changes.revert", param_kind = map)]
    async fn session_changes_revert(
        &self,
        session_id: String,
        path: String,
    ) -> RpcResult<ChangesReverted>;

    /// Moves a session to another runtime (or, on Docker, to an engine carrying other
    /// labels): a running turn ends first, the agent is stopped where it ran, and resumed
    /// on the new runtime if it was running.
    #[method(name = "task.session.move", param_kind = map)]
    async fn session_move(
        &self,
        session_id: String,
        runtime: RuntimeKind,
        labels: Option<std::collections::BTreeMap<String, String>>,
        force_after_ms: Option<u64>,
    ) -> RpcResult<SessionMoved>;

    /// The Docker engines, each with its state and its sessions.
    #[method(name = "engines.list")]
    async fn engines_list(&self) -> RpcResult<EngineList>;

    /// Drains an engine: no new session goes there, and each of its sessions moves off
    /// it at its next turn boundary.
    #[method(name = "engines.drain", param_kind = map)]
    async fn engines_drain(
        &self,
        name: String,
        force_after_ms: Option<u64>,
    ) -> RpcResult<EngineInfo>;

    /// Returns a drained (or draining) engine to service.
    #[method(name = "engines.undrain", param_kind = map)]
    async fn engines_undrain(&self, name: String) -> RpcResult<EngineInfo>;

    /// The session's workspace checkpoints, oldest first.
    #[method(name = "task.session.checkpoint.list", param_kind = map)]
    async fn session_checkpoint_list(&self, session_id: String) -> RpcResult<CheckpointList>;

    /// Writes a checkpoint's files into a new or empty directory.
    #[method(name = "task.session.checkpoint.restore", param_kind = map)]
    async fn session_checkpoint_restore(
        &self,
        session_id: String,
        #[argument(rename = "seq")] number: Option<u64>,
        turn: Option<u64>,
        into: String,
    ) -> RpcResult<CheckpointRestored>;

    /// Marks a changed file kept at the content the reviewer saw (or takes that back).
    #[method(name = "task.session.changes.keep", param_kind = map)]
    async fn session_changes_keep(
        &self,
        session_id: String,
        path: String,
        content: String,
        kept: Option<bool>,
    ) -> RpcResult<SessionChanges>;

    /// The session's prompt queue: prompts sent while a turn ran, in the order they run,
    /// and why it is halted.
    #[method(name = "task.session.queue.list", param_kind = map)]
    async fn session_queue_list(&self, session_id: String) -> RpcResult<PromptQueue>;

    /// Changes a queued prompt's text, its place (from 1), or both; returns the queue.
    #[method(name = "task.session.queue.edit", param_kind = map)]
    async fn session_queue_edit(
        &self,
        session_id: String,
        prompt_id: String,
        prompt: Option<String>,
        position: Option<usize>,
    ) -> RpcResult<PromptQueue>;

    /// Removes a queued prompt; returns the queue.
    #[method(name = "task.session.queue.remove", param_kind = map)]
    async fn session_queue_remove(
        &self,
        session_id: String,
        prompt_id: String,
    ) -> RpcResult<PromptQueue>;

    /// Removes every queued prompt; returns the (empty) queue.
    #[method(name = "task.session.queue.clear", param_kind = map)]
    async fn session_queue_clear(&self, session_id: String) -> RpcResult<PromptQueue>;

    /// Lets a queue halted by a failed or cancelled turn run again (resuming the session's
    /// agent when it is not running and prompts wait); returns the queue.
    #[method(name = "task.session.queue.resume", param_kind = map)]
    async fn session_queue_resume(&self, session_id: String) -> RpcResult<PromptQueue>;

    /// Brings a session's agent back: natively when it can, else with the history for the
    /// next prompt. Joins a resume already under way.
    #[method(name = "task.session.resume", param_kind = map)]
    async fn session_resume(
        &self,
        session_id: String,
        refresh_profile: Option<bool>,
    ) -> RpcResult<ResumeResult>;

    /// Stops every live agent; the sessions stay resumable.
    #[method(name = "sessions.stop_all")]
    async fn stop_all(&self) -> RpcResult<StopAllResult>;

    /// The agent's settings (config options such as its model, and modes) and those chosen.
    #[method(name = "task.session.config_options", param_kind = map)]
    async fn session_config_options(&self, session_id: String) -> RpcResult<SessionConfig>;

    /// Chooses a config option's value (`null` forgets the choice): set at once when the
    /// agent runs (its refusal is `agent_refused`), else when it next starts; set again at
    /// every resume.
    #[method(name = "task.session.set_config_option", param_kind = map)]
    async fn session_set_config_option(
        &self,
        session_id: String,
        config_id: String,
        value: Value,
    ) -> RpcResult<SessionConfig>;

    /// Chooses the agent's mode (`null` forgets the choice), as `set_config_option` does.
    #[method(name = "task.session.set_mode", param_kind = map)]
    async fn session_set_mode(
        &self,
        session_id: String,
        mode_id: Option<String>,
    ) -> RpcResult<SessionConfig>;

    /// Cancels the running turn (it ends `cancelled`, or `failed` if the agent does not
    /// confirm within the grace period).
    #[method(name = "task.session.cancel", param_kind = map)]
    async fn session_cancel(&self, session_id: String) -> RpcResult<Done>;

    /// Pauses a session at the next turn boundary: a running turn ends first (or is
    /// cancelled after `force_after_ms`, default 5 minutes); then its agent and sidecar stop
    /// and it is `PAUSED`, resumable with `task.session.resume` (or a prompt).
    #[method(name = "task.session.pause", param_kind = map)]
    async fn session_pause(
        &self,
        session_id: String,
        reason: Option<String>,
        force_after_ms: Option<u64>,
    ) -> RpcResult<PauseResult>;

    /// Ends a session for good: its agent stops and it cannot be resumed.
    #[method(name = "task.session.stop", param_kind = map)]
    async fn session_stop(&self, session_id: String) -> RpcResult<Done>;

    /// Deletes a session and its records (its agent is stopped first), and its worktree if
    /// Tether made one — refused while that holds uncommitted work unless `force`; the
    /// worktree's branch stays unless `delete_branch`.
    #[method(name = "task.session.delete", param_kind = map)]
    async fn session_delete(
        &self,
        session_id: String,
        force: Option<bool>,
        delete_branch: Option<bool>,
    ) -> RpcResult<Done>;

    /// Removes the sessions at rest (not live: `COMPLETED`, `CANCELLED`, `FAILED`, and
    /// `PAUSED` or `WAITING_FOR_INPUT` without an agent) whose last change is older than
    /// `max_age_days`: rows, history, event logs, spools, containers and worktrees.
    /// `states` narrows the states; `keep_completed` spares `COMPLETED` ones; a worktree
    /// with uncommitted work is kept unless `force`; `dry_run` removes nothing.
    #[method(name = "sessions.cleanup", param_kind = map)]
    async fn cleanup(
        &self,
        max_age_days: u32,
        states: Option<Vec<SessionState>>,
        keep_completed: Option<bool>,
        dry_run: Option<bool>,
        force: Option<bool>,
    ) -> RpcResult<CleanupResult>;

    /// Answers a permission request with one of its options (`option_id`), or cancels it
    /// (no `option_id`).
    #[method(name = "task.session.permission.respond", param_kind = map)]
    async fn permission_respond(
        &self,
        session_id: String,
        request_id: String,
        option_id: Option<String>,
    ) -> RpcResult<Done>;

    /// Answers an elicitation request (`elicitation_request` event): `accept` with the
    /// form's `content`, `decline`, or `cancel`.
    #[method(name = "task.session.elicitation.respond", param_kind = map)]
    async fn elicitation_respond(
        &self,
        session_id: String,
        request_id: String,
        action: params::ElicitationAnswer,
        content: Option<serde_json::Map<String, Value>>,
    ) -> RpcResult<Done>;

    /// The conversation history after `after_seq` (default 0), at most `limit` entries
    /// (default 1000).
    #[method(name = "task.session.history", param_kind = map)]
    async fn session_history(
        &self,
        session_id: String,
        after_seq: Option<u64>,
        limit: Option<usize>,
    ) -> RpcResult<Vec<HistoryEntry>>;

    /// A session's executions and turns, and what happened to it in order after `after`
    /// (an entry's `seq`; default: from the start).
    #[method(name = "task.session.timeline", param_kind = map)]
    async fn session_timeline(&self, session_id: String, after: Option<i64>)
    -> RpcResult<Timeline>;

    /// A window of a session's events, oldest first: at most `limit` (default 500, at most
    /// [`MAX_EVENT_WINDOW`](super::MAX_EVENT_WINDOW)) of those before `before_seq` (default: the newest), never
    /// before the log's start (`kept_after_seq`). A page opens a long session at its end
    /// and reads back a window at a time.
    #[method(name = "task.session.event_window", param_kind = map)]
    async fn session_event_window(
        &self,
        session_id: String,
        before_seq: Option<u64>,
        limit: Option<usize>,
    ) -> RpcResult<EventWindow>;

    /// A session's snapshots, oldest first.
    #[method(name = "task.session.snapshot.list", param_kind = map)]
    async fn snapshot_list(&self, session_id: String) -> RpcResult<Vec<SnapshotSummary>>;

    /// One snapshot, whole.
    #[method(name = "task.session.snapshot.get", param_kind = map)]
    async fn snapshot_get(&self, snapshot_id: String) -> RpcResult<Snapshot>;

    /// A session's events after `after_seq` (default 0), then live ones. `after_seq` past
    /// the newest event is refused.
    #[subscription(
        name = "task.session.subscribe" => "task.session.event",
        unsubscribe = "task.session.unsubscribe",
        item = SessionEvent,
        param_kind = map
    )]
    async fn session_subscribe(
        &self,
        session_id: String,
        after_seq: Option<u64>,
    ) -> SubscriptionResult;

    /// Like `task.session.subscribe`, but each notification is an array of the events that
    /// were ready at once, oldest first (at most [`MAX_BATCH_EVENTS`](super::MAX_BATCH_EVENTS)): a burst of chunks
    /// costs one WebSocket frame, not one per event. Nothing is held back to fill a batch.
    #[subscription(
        name = "task.session.subscribe_batch" => "task.session.events",
        unsubscribe = "task.session.unsubscribe_batch",
        item = EventBatch,
        param_kind = map
    )]
    async fn session_subscribe_batch(
        &self,
        session_id: String,
        after_seq: Option<u64>,
    ) -> SubscriptionResult;

    /// Changes of the session list from now on, one subscription for a whole list: a
    /// session created or changed state (`changed`, with the session), deleted
    /// (`deleted`), or `resync` when changes were missed (list again).
    #[subscription(
        name = "sessions.subscribe" => "sessions.event",
        unsubscribe = "sessions.unsubscribe",
        item = SessionsEvent
    )]
    async fn sessions_subscribe(&self) -> SubscriptionResult;

    /// Starts a workflow (see docs/workflows.md): its file checked (a refusal names
    /// `file:line:col`), stored, and its first steps started as sessions.
    #[method(name = "workflow.start", param_kind = map)]
    async fn workflow_start(
        &self,
        spec: String,
        spec_file: Option<String>,
        vars: Option<std::collections::BTreeMap<String, String>>,
        task_id: Option<String>,
        workspace: Option<String>,
    ) -> RpcResult<WorkflowStarted>;

    /// A workflow and each step's state, session, runs and output.
    #[method(name = "workflow.status", param_kind = map)]
    async fn workflow_status(&self, workflow_id: String) -> RpcResult<WorkflowStatus>;

    /// Every workflow, oldest first.
    #[method(name = "workflow.list")]
    async fn workflow_list(&self) -> RpcResult<Vec<WorkflowSummary>>;

    /// Goes on with a failed or cancelled workflow from its steps not completed. A changed
    /// file is refused (`conflict`, saying what changed) unless `accept_spec_change`.
    #[method(name = "workflow.resume", param_kind = map)]
    async fn workflow_resume(
        &self,
        workflow_id: String,
        spec: Option<String>,
        accept_spec_change: Option<bool>,
    ) -> RpcResult<WorkflowStatus>;

    /// Cancels a running workflow: its steps not done are cancelled and their sessions
    /// stopped. It can be resumed.
    #[method(name = "workflow.cancel", param_kind = map)]
    async fn workflow_cancel(&self, workflow_id: String) -> RpcResult<Done>;

    /// Approves a step (`approval = true`) so it may start.
    #[method(name = "workflow.approve", param_kind = map)]
    async fn workflow_approve(&self, workflow_id: String, step_id: String) -> RpcResult<Done>;

    /// Deletes a workflow that is over: its record, steps and events (its steps' sessions
    /// stay, as sessions of its task). Refused while it runs.
    #[method(name = "workflow.delete", param_kind = map)]
    async fn workflow_delete(&self, workflow_id: String) -> RpcResult<Done>;

    /// Changes of the workflow list from now on, one subscription for a whole list: a
    /// workflow created or changed (`changed`, with its summary: steps done, steps waiting
    /// for approval), deleted (`deleted`), or `resync` when changes were missed (list
    /// again).
    #[subscription(
        name = "workflows.subscribe" => "workflows.event",
        unsubscribe = "workflows.unsubscribe",
        item = WorkflowsEvent
    )]
    async fn workflows_subscribe(&self) -> SubscriptionResult;

    /// A workflow's events after `after_seq` (default 0), then live ones, with the same
    /// cursor rules as `task.session.subscribe`.
    #[subscription(
        name = "workflow.subscribe" => "workflow.event",
        unsubscribe = "workflow.unsubscribe",
        item = WorkflowEvent,
        param_kind = map
    )]
    async fn workflow_subscribe(
        &self,
        workflow_id: String,
        after_seq: Option<u64>,
    ) -> SubscriptionResult;

    /// Re-sends the prompt of a session's turn that a crash left `interrupted` (the newest
    /// turn when `turn_id` is absent) as a new turn; never automatic. Refused when that
    /// turn completed, is not interrupted or failed, or was re-sent already.
    #[method(name = "task.session.retry_turn", param_kind = map)]
    async fn session_retry_turn(
        &self,
        session_id: String,
        turn_id: Option<String>,
    ) -> RpcResult<PromptStarted>;

    /// Sets the token or cost budget of a session or (`task_id`) of a task (the sum over
    /// its sessions); neither `tokens` nor `cost` removes it. Returns it with what was
    /// used. A session paused by its budget can be resumed once the budget is raised.
    #[method(name = "budget.set", param_kind = map)]
    async fn budget_set(
        &self,
        session_id: Option<String>,
        task_id: Option<String>,
        tokens: Option<u64>,
        cost: Option<f64>,
        currency: Option<String>,
    ) -> RpcResult<Option<BudgetUse>>;

    /// Tokens and cost of the turns that match every filter given (a session, task,
    /// profile, workflow; turns that ended from `since_ms` until before `until_ms`), in
    /// total and per `group_by` (`session`, `task`, `profile`, `workflow`, `day`).
    #[method(name = "usage.query", param_kind = map)]
    async fn usage_query(
        &self,
        session_id: Option<String>,
        task_id: Option<String>,
        profile: Option<String>,
        workflow_id: Option<String>,
        since_ms: Option<i64>,
        until_ms: Option<i64>,
        group_by: Option<UsageGroupBy>,
    ) -> RpcResult<UsageReport>;

    /// This API as an OpenRPC document.
    #[method(name = "rpc.discover")]
    async fn discover(&self) -> RpcResult<Value>;
}
