//! The frontend API as an OpenRPC 1.3 document, generated from the same types the
//! `Api` trait uses: each method's params from its [`super::params`] struct, its
//! result and the subscription's item from their wire types, the error kinds from
//! [`ErrorKind`]. The daemon serves the checked-in copy (`docs/openrpc.json`) through
//! `rpc.discover`; a test regenerates it and fails when the two differ.

use schemars::JsonSchema;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value, json};

use super::params::{self, Checked};
use super::{
    AgentInfo, BudgetUse, ChangesReverted, CheckpointList, CheckpointRestored, CleanupResult, Done,
    EngineInfo, EngineList, ErrorData, EventWindow, ForkResult, HistoryEntry, PauseResult,
    PromptQueue, PromptStarted, ResumeResult, RewindResult, SessionChanges, SessionConfig,
    SessionEvent, SessionMoved, SessionStatus, SessionSummary, SessionsEvent, Snapshot,
    SnapshotSummary, Steered, StopAllResult, Task, TaskDetail, Timeline, UsageReport,
    WorkflowEvent, WorkflowStarted, WorkflowStatus, WorkflowSummary, WorkflowsEvent, method,
};
use crate::errors::ErrorKind;

/// The checked-in document, as served by `rpc.discover`.
pub const DOCUMENT: &str = include_str!("../../../docs/openrpc.json");

struct Methods {
    generator: SchemaGenerator,
    methods: Vec<Value>,
}

impl Methods {
    fn add<P: Checked, R: JsonSchema>(&mut self, name: &str, summary: &str) {
        let params = self.params::<P>();
        let result = self.generator.subschema_for::<R>();
        self.push(name, summary, params, json!({"name": "result", "schema": result.to_value()}));
    }

    /// A subscription: the call answers with the subscription's id; each item arrives as a
    /// notification (`x-notification`) whose `params.result` is an `R`.
    fn add_subscription<P: Checked, R: JsonSchema>(
        &mut self,
        name: &str,
        notification: &str,
        unsubscribe: &str,
        summary: &str,
    ) {
        let params = self.params::<P>();
        let item = self.generator.subschema_for::<R>().to_value();
        let id = json!({"name": "subscription", "schema": {"type": ["string", "integer"]}});
        self.push(name, summary, params, id);
        let method = self.methods.last_mut().expect("UNWRAP: just pushed");
        method["x-notification"] =
            json!({"name": notification, "result": {"name": "event", "schema": item}});
        method["x-unsubscribe"] = json!({"name": unsubscribe, "params": "[subscription id]"});
    }

    fn push(&mut self, name: &str, summary: &str, params: Vec<Value>, result: Value) {
        self.methods.push(json!({
            "name": name,
            "summary": summary,
            "paramStructure": "by-name",
            "params": params,
            "result": result,
            "errors": [{"$ref": "#/components/errors/TetherError"}],
        }));
    }

    fn params<P: Checked>(&mut self) -> Vec<Value> {
        let schema = P::json_schema(&mut self.generator).to_value();
        let required: Vec<&str> = schema["required"]
            .as_array()
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let Some(properties) = schema["properties"].as_object() else { return Vec::new() };
        properties
            .iter()
            .map(|(name, property)| {
                let mut property = property.clone();
                let description = property
                    .as_object_mut()
                    .and_then(|object| object.remove("description"))
                    .unwrap_or(Value::Null);
                let mut descriptor = json!({
                    "name": name,
                    "required": required.contains(&name.as_str()),
                    "schema": property,
                });
                if !description.is_null() {
                    descriptor["description"] = description;
                }
                descriptor
            })
            .collect()
    }
}

/// Generates the document.
#[expect(clippy::too_many_lines, reason = "a catalogue: one entry per method of the API")]
pub fn generate() -> Value {
    let settings = SchemaSettings::draft07().with(|settings| {
        settings.definitions_path = "#/components/schemas/".into();
    });
    let mut m = Methods { generator: settings.into_generator(), methods: Vec::new() };
    use params::{
        BudgetSet, Cleanup, ElicitationRespond, EngineName, EnginesDrain, NoParams,
        PermissionRespond, SessionChangesKeep, SessionChangesRevert, SessionCheckpointRestore,
        SessionCreate, SessionDelete, SessionEventWindow, SessionFork, SessionHistory, SessionId,
        SessionList, SessionMove, SessionPause, SessionPrompt, SessionQueueEdit,
        SessionQueueRemove, SessionResume, SessionRetryTurn, SessionRewind, SessionSetConfigOption,
        SessionSetMode, SessionSubscribe, SessionTimeline, SnapshotGet, TaskCreate, TaskDelete,
        TaskGet, UsageQuery, WorkflowApprove, WorkflowId, WorkflowResume, WorkflowStart,
        WorkflowSubscribe,
    };
    m.add::<NoParams, Vec<AgentInfo>>(
        method::AGENTS_LIST,
        "Every agent profile, with whether it can run here and why not.",
    );
    m.add::<TaskCreate, Task>(method::TASK_CREATE, "Creates a task.");
    m.add::<NoParams, Vec<Task>>(method::TASK_LIST, "Every task, oldest first.");
    m.add::<TaskGet, TaskDetail>(method::TASK_GET, "A task and its sessions.");
    m.add::<TaskDelete, Done>(
        method::TASK_DELETE,
        "Deletes a task and every session of it (as task.session.delete does each); refused, changing nothing, while one of its sessions is live or a worktree of one holds uncommitted work (unless force).",
    );
    m.add::<SessionCreate, SessionSummary>(
        method::SESSION_CREATE,
        "Creates a session and starts its agent; the prompt (or the task's description) is its first prompt. With worktree, it works in a git worktree of its own on a new branch.",
    );
    m.add::<SessionList, Vec<SessionSummary>>(
        method::SESSION_LIST,
        "Sessions, oldest first, filtered by task, state and profile when given.",
    );
    m.add::<SessionId, SessionStatus>(
        method::SESSION_STATUS,
        "A session's status; `needs_resume` says whether to call task.session.resume.",
    );
    m.add::<SessionPrompt, PromptStarted>(
        method::SESSION_PROMPT,
        "Sends a prompt (resuming the session first when its agent is not running); the turn's output arrives as events. While a turn runs, the prompt is queued behind it (queued: true, with its prompt_id and position), durably, and runs once, in order.",
    );
    m.add::<SessionPrompt, Steered>(
        method::SESSION_STEER,
        "Steers the running turn with a message: into the turn where the agent takes one mid-turn (mode native, ACP `_session/steering`), else by cancelling the turn at once and running the message next, ahead of anything queued, with a line saying what the cancelled turn had done (mode fallback). With no turn running it is a prompt (mode prompt). Durable before the answer.",
    );
    m.add::<SessionFork, ForkResult>(
        method::SESSION_FORK,
        "Forks the session at turn_id (default: its newest turn): a new session of the same task, at rest until prompted, whose conversation is the original's up to and including that turn — natively (ACP session/fork) where the agent advertises it and the turn is the original's newest, else by injecting that history before its first prompt. With a worktree, the fork gets a branch of its own made from the commit the workspace had at that turn, holding the files the turn left. The model and mode chosen for the original go on in the fork.",
    );
    m.add::<SessionRewind, RewindResult>(
        method::SESSION_REWIND,
        "Rewinds the session to turn_id, which becomes its conversation's last: later turns stay in the history and the timeline, marked rewound, and leave the agent's context (its agent is stopped if it runs; the next prompt opens a fresh agent session primed with the turns kept). With restore_workspace, the workspace returns to its git state at that turn (the snapshot taken as it ended) after what it holds now is saved on refs/tether/rewound/<session>/<rewind>; refused, with the reason, when that state is unknown. Refused while a turn runs.",
    );
    m.add::<SessionId, SessionChanges>(
        method::SESSION_CHANGES,
        "Every file the session's workspace changed since its base commit (the workspace's commit when the session started, its worktree's base; else its HEAD), tracked or not (ignored files left out), each with its unified diff and whether a review kept it at the content it has now. Files uncommitted before the session started that still hold what they held then are not listed. Works for ended sessions while their workspace is there.",
    );
    m.add::<SessionChangesRevert, ChangesReverted>(
        method::SESSION_CHANGES_REVERT,
        "Reverts one file the changes list to its content in the base commit (in the working tree and the index; a file the base does not have is removed), after the workspace's files are saved on refs/tether/reverted/<session>/<id>, so nothing it takes away is lost. Allowed while the agent works; the agent is told with its next prompt (a note before it, said to be Tether's; the history keeps the prompt as written).",
    );
    m.add::<SessionMove, SessionMoved>(
        method::SESSION_MOVE,
        "Moves a session to another runtime (standalone ↔ docker), or on Docker to an engine carrying other labels. A running turn ends first (cancelled after force_after_ms, default 30000), the agent is stopped where it ran and what that runtime kept for the session there (a container, state volumes) removed; the session's runtime and labels are then stored, and a session whose agent was running is resumed on the new runtime — natively when its agent's state dirs are the session's own on both sides (a sandboxed local agent, a container on an engine that bind-mounts them), else with its history injected. The workspace stays where it is (it is mounted, not copied). A moved timeline row records it.",
    );
    m.add::<NoParams, EngineList>(
        method::ENGINES_LIST,
        "Every configured Docker engine in config order: its state (serving, draining, drained, unreachable), why it does not answer, and the sessions not ended whose newest execution ran there.",
    );
    m.add::<EnginesDrain, EngineInfo>(
        method::ENGINES_DRAIN,
        "Drains an engine (durable before the answer): no new session is placed there, and each of its sessions moves off it — a running turn ends first (cancelled after force_after_ms, default 30000), the agent is stopped there, the session's container and state volumes there removed, and a session whose agent ran is resumed on another engine by the same placement rules (natively where its agent state travels, else with its history injected); one at rest moves at its next resume. Each move is a moved timeline row. The engine is drained when none is left.",
    );
    m.add::<EngineName, EngineInfo>(
        method::ENGINES_UNDRAIN,
        "Returns a drained or draining engine to service: new sessions may be placed there again (sessions that moved stay where they are).",
    );
    m.add::<SessionId, CheckpointList>(
        method::SESSION_CHECKPOINT_LIST,
        "The session's workspace checkpoints, oldest first: the workspace's files (tracked and untracked, ignored ones and those over [checkpoints] max_file_bytes left out) as a commit in a repository the supervisor keeps for the session, taken at every turn's end (ref refs/tether/sessions/<session>/turns/<n>), at a pause, a park and a stop, and before a restore. The user's repository, index, HEAD and branches are never touched.",
    );
    m.add::<SessionCheckpointRestore, CheckpointRestored>(
        method::SESSION_CHECKPOINT_RESTORE,
        "Writes a checkpoint's files (seq, else turn's, else the newest) into into, an absolute path to a new or empty directory (refused otherwise). The session and its workspace are not changed.",
    );
    m.add::<SessionChangesKeep, SessionChanges>(
        method::SESSION_CHANGES_KEEP,
        "Marks a changed file kept at content (the content task.session.changes gave: what the reviewer saw), or takes the mark back with kept: false. A file changed again after it was kept is no longer kept. Durable before the answer.",
    );
    m.add::<SessionId, PromptQueue>(
        method::SESSION_QUEUE_LIST,
        "The session's prompt queue: prompts sent while a turn ran, in the order they run, and why it is halted.",
    );
    m.add::<SessionQueueEdit, PromptQueue>(
        method::SESSION_QUEUE_EDIT,
        "Changes a queued prompt's text, its place (from 1), or both; returns the queue.",
    );
    m.add::<SessionQueueRemove, PromptQueue>(
        method::SESSION_QUEUE_REMOVE,
        "Removes a queued prompt; returns the queue.",
    );
    m.add::<SessionId, PromptQueue>(
        method::SESSION_QUEUE_CLEAR,
        "Removes every queued prompt; returns the (empty) queue.",
    );
    m.add::<SessionId, PromptQueue>(
        method::SESSION_QUEUE_RESUME,
        "Lets a queue halted by a failed or cancelled turn run again (resuming the session's agent when it is not running and prompts wait); returns the queue.",
    );
    m.add::<SessionResume, ResumeResult>(
        method::SESSION_RESUME,
        "Brings a session's agent back: natively when it can, else with the history for the next prompt.",
    );
    m.add::<NoParams, StopAllResult>(
        method::STOP_ALL,
        "Stops every live agent; the sessions stay resumable.",
    );
    m.add::<ElicitationRespond, Done>(
        method::ELICITATION_RESPOND,
        "Answers an elicitation request: accept with the form's content, decline, or cancel.",
    );
    m.add::<SessionId, SessionConfig>(
        method::SESSION_CONFIG_OPTIONS,
        "The agent's settings (config options such as its model, and modes) as it last reported them, and those chosen through Tether.",
    );
    m.add::<SessionSetConfigOption, SessionConfig>(
        method::SESSION_SET_CONFIG_OPTION,
        "Chooses a config option's value (null forgets the choice): set at once when the agent runs, else when it next starts; set again at every resume, and prompts are refused (settings_not_restored) while a choice cannot be.",
    );
    m.add::<SessionSetMode, SessionConfig>(
        method::SESSION_SET_MODE,
        "Chooses the agent's mode (null forgets the choice), as task.session.set_config_option does.",
    );
    m.add::<SessionId, Done>(method::SESSION_CANCEL, "Cancels the running turn.");
    m.add::<SessionPause, PauseResult>(
        method::SESSION_PAUSE,
        "Pauses a session at the next turn boundary (a running turn ends first, or is cancelled after force_after_ms); then its agent stops and it is PAUSED, resumable.",
    );
    m.add::<SessionId, Done>(
        method::SESSION_STOP,
        "Ends a session for good: its agent stops and it cannot be resumed.",
    );
    m.add::<SessionDelete, Done>(
        method::SESSION_DELETE,
        "Deletes a session and its records, and its worktree (refused with uncommitted work unless force; the branch stays unless delete_branch).",
    );
    m.add::<Cleanup, CleanupResult>(
        method::CLEANUP,
        "Removes the sessions at rest older than max_age_days (rows, history, event logs, spools, containers, worktrees); reports what it removed and what it kept and why. Never a live session.",
    );
    m.add::<PermissionRespond, Done>(
        method::PERMISSION_RESPOND,
        "Answers a permission request with one of its options, or cancels it (no option_id).",
    );
    m.add::<SessionHistory, Vec<HistoryEntry>>(
        method::SESSION_HISTORY,
        "The conversation history after after_seq, at most limit entries.",
    );
    m.add::<SessionTimeline, Timeline>(
        method::SESSION_TIMELINE,
        "A session's executions and turns, and what happened to it in order (entries after `after`).",
    );
    m.add::<SessionEventWindow, EventWindow>(
        method::SESSION_EVENT_WINDOW,
        "A window of a session's events, oldest first: at most limit (default 500, at most 5000) of those before before_seq (default: the newest), from where the log starts (kept_after_seq). A page opens a long session at its end and reads back a window at a time.",
    );
    m.add::<SessionId, Vec<SnapshotSummary>>(
        method::SNAPSHOT_LIST,
        "A session's snapshots, oldest first.",
    );
    m.add::<SnapshotGet, Snapshot>(method::SNAPSHOT_GET, "One snapshot, whole.");
    m.add_subscription::<SessionSubscribe, SessionEvent>(
        method::SESSION_SUBSCRIBE,
        method::SESSION_EVENT,
        method::SESSION_UNSUBSCRIBE,
        "Subscribes to a session's events after after_seq, then live ones; each arrives as a task.session.event notification whose result is the event. Unsubscribe with task.session.unsubscribe [subscription id].",
    );
    m.add_subscription::<SessionSubscribe, Vec<SessionEvent>>(
        method::SESSION_SUBSCRIBE_BATCH,
        method::SESSION_EVENTS,
        method::SESSION_UNSUBSCRIBE_BATCH,
        "Like task.session.subscribe, but each task.session.events notification's result is an array of the events that were ready at once, oldest first (at most 512; nothing is held back to fill one): one frame per burst. Unsubscribe with task.session.unsubscribe_batch [subscription id].",
    );
    m.add_subscription::<NoParams, SessionsEvent>(
        method::SESSIONS_SUBSCRIBE,
        method::SESSIONS_EVENT,
        method::SESSIONS_UNSUBSCRIBE,
        "Subscribes to changes of the session list from now on: each sessions.event notification says a session was created or changed state (changed, with the session), was deleted (deleted), or that changes were missed (resync: list again). One subscription for a whole list. Unsubscribe with sessions.unsubscribe [subscription id].",
    );
    m.add::<WorkflowStart, WorkflowStarted>(
        method::WORKFLOW_START,
        "Starts a workflow: its file checked (a refusal names file:line:col), stored with its SHA-256, and its first steps started as sessions.",
    );
    m.add::<WorkflowId, WorkflowStatus>(
        method::WORKFLOW_STATUS,
        "A workflow and each step's state, session, runs and output.",
    );
    m.add::<NoParams, Vec<WorkflowSummary>>(method::WORKFLOW_LIST, "Every workflow, oldest first.");
    m.add::<WorkflowResume, WorkflowStatus>(
        method::WORKFLOW_RESUME,
        "Goes on with a failed or cancelled workflow from its steps not completed; a changed workflow file is refused (conflict, saying what changed) unless accept_spec_change.",
    );
    m.add::<WorkflowId, Done>(
        method::WORKFLOW_CANCEL,
        "Cancels a running workflow: steps not done are cancelled and their sessions stopped. Resumable.",
    );
    m.add::<WorkflowApprove, Done>(
        method::WORKFLOW_APPROVE,
        "Approves a step that waits for approval (or approves a pending one ahead).",
    );
    m.add::<WorkflowId, Done>(
        method::WORKFLOW_DELETE,
        "Deletes a workflow that is over (completed, failed or cancelled): its record, steps and events. Its steps' sessions stay, as sessions of its task. Refused (invalid_state) while it runs.",
    );
    m.add_subscription::<WorkflowSubscribe, WorkflowEvent>(
        method::WORKFLOW_SUBSCRIBE,
        method::WORKFLOW_EVENT,
        method::WORKFLOW_UNSUBSCRIBE,
        "Subscribes to a workflow's events after after_seq, then live ones; each arrives as a workflow.event notification. Unsubscribe with workflow.unsubscribe [subscription id].",
    );
    m.add_subscription::<NoParams, WorkflowsEvent>(
        method::WORKFLOWS_SUBSCRIBE,
        method::WORKFLOWS_EVENT,
        method::WORKFLOWS_UNSUBSCRIBE,
        "Subscribes to changes of the workflow list from now on: each workflows.event notification says a workflow was created or changed (changed, with its summary: steps done, steps waiting for approval, newest event seq), was deleted (deleted), or that changes were missed (resync: list again). One subscription for a whole list. Unsubscribe with workflows.unsubscribe [subscription id].",
    );
    m.add::<SessionRetryTurn, PromptStarted>(
        method::SESSION_RETRY_TURN,
        "Re-sends the prompt of a turn a crash left interrupted (the newest turn when turn_id is absent) as a new turn; never automatic. Refused when that turn completed, was not interrupted or failed, or was re-sent already.",
    );
    m.add::<BudgetSet, Option<BudgetUse>>(
        method::BUDGET_SET,
        "Sets the token or cost budget of a session or (task_id) of a task; neither tokens nor cost removes it. At 80 % a budget_warning event is published; at 100 % the session pauses at its turn's end, and prompts and resumes are refused (budget_exceeded) until the budget is raised.",
    );
    m.add::<UsageQuery, UsageReport>(
        method::USAGE_QUERY,
        "Tokens and cost of the turns matching every filter given (session, task, profile, workflow, since_ms, until_ms), in total and per group_by (session, task, profile, workflow, day).",
    );
    m.add::<NoParams, Value>(method::DISCOVER, "This document.");
    let Methods { mut generator, methods } = m;
    let mut schemas: Map<String, Value> = generator.take_definitions(true);
    schemas.insert("ErrorData".into(), ErrorData::json_schema(&mut generator).to_value());
    schemas.extend(generator.take_definitions(true));
    let kinds: Vec<Value> = ErrorKind::ALL
        .iter()
        .map(|kind| json!({"kind": kind.as_str(), "code": kind.code()}))
        .collect();
    json!({
        "openrpc": "1.3.2",
        "info": {
            "title": "Tether frontend API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "JSON-RPC 2.0 over WebSocket. Params are objects by name. Every error's data is an ErrorData: decide on data.kind, never on the message. x-error-kinds lists each kind with its code.",
        },
        "methods": methods,
        "components": {
            "schemas": schemas,
            "errors": {
                "TetherError": {
                    "code": -32000,
                    "message": "An error whose data.kind says which (see x-error-kinds for the code of each).",
                    "data": {"$ref": "#/components/schemas/ErrorData"},
                },
            },
        },
        "x-error-kinds": kinds,
    })
}

/// The generated document as the checked-in file holds it (pretty, newline-terminated).
pub fn render() -> String {
    let mut text = serde_json::to_string_pretty(&generate()).expect("UNWRAP: a Value serialises");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    //! The trait, the params structs and the document are three views of one API; these
    //! tests hold them together. The trait's generated client is driven through a recorder
    //! that keeps each (method, params) it would send: every method's params must pass its
    //! params struct's check (so the trait's argument names and the struct's fields agree),
    //! and the methods must be exactly the document's.

    use std::sync::Mutex;

    use crate::api::params::ElicitationAnswer;
    use jsonrpsee::core::client::{
        BatchResponse, ClientT, Error, Subscription, SubscriptionClientT,
    };
    use jsonrpsee::core::params::BatchRequestBuilder;
    use jsonrpsee::core::traits::ToRpcParams;
    use serde::de::DeserializeOwned;

    use super::super::{ApiClient, RuntimeKind, SessionState, UsageGroupBy, params};
    use super::*;

    #[derive(Default)]
    struct Recorder {
        sent: Mutex<Vec<(String, Option<Box<serde_json::value::RawValue>>)>>,
    }

    impl Recorder {
        fn record(&self, method: &str, params: impl ToRpcParams) -> Error {
            let params = params.to_rpc_params().expect("params serialise");
            self.sent.lock().unwrap().push((method.to_owned(), params));
            // Every call "fails" after it is recorded: only what was sent matters here.
            Error::Custom("recorded".into())
        }
    }

    impl ClientT for Recorder {
        async fn notification<P: ToRpcParams + Send>(
            &self,
            method: &str,
            params: P,
        ) -> Result<(), Error> {
            Err(self.record(method, params))
        }

        async fn request<R: DeserializeOwned, P: ToRpcParams + Send>(
            &self,
            method: &str,
            params: P,
        ) -> Result<R, Error> {
            Err(self.record(method, params))
        }

        async fn batch_request<'a, R: DeserializeOwned + std::fmt::Debug + 'a>(
            &self,
            _batch: BatchRequestBuilder<'a>,
        ) -> Result<BatchResponse<'a, R>, Error> {
            Err(Error::Custom("no batches".into()))
        }
    }

    impl SubscriptionClientT for Recorder {
        async fn subscribe<'a, N: DeserializeOwned, P: ToRpcParams + Send>(
            &self,
            subscribe_method: &'a str,
            params: P,
            _unsubscribe_method: &'a str,
        ) -> Result<Subscription<N>, Error> {
            Err(self.record(subscribe_method, params))
        }

        async fn subscribe_to_method<N: DeserializeOwned>(
            &self,
            method: &str,
        ) -> Result<Subscription<N>, Error> {
            Err(self.record(method, jsonrpsee::core::params::ArrayParams::new()))
        }
    }

    /// Calls every method of the generated client once, with every optional argument set.
    async fn call_everything(client: &Recorder) {
        let s = || "01900000-0000-7000-8000-000000000000".to_owned();
        let _ = client.agents_list().await;
        let _ = client.task_create("t".into(), Some("d".into())).await;
        let _ = client.task_list().await;
        let _ = client.task_get(s()).await;
        let _ = client.task_delete(s(), Some(true), Some(true)).await;
        let _ = client
            .session_create(
                s(),
                "mock".into(),
                Some("/w".into()),
                Some("p".into()),
                Some(RuntimeKind::DOCKER),
                Some(true),
                Some(true),
                Some("main".into()),
                Some([("zone".to_owned(), "b".to_owned())].into()),
                None,
                Some(s()),
                Some(vec!["/w2".into()]),
            )
            .await;
        let _ =
            client.session_list(Some(s()), Some(SessionState::Failed), Some("mock".into())).await;
        let _ = client.session_status(s()).await;
        let _ = client.session_prompt(s(), "p".into()).await;
        let _ = client.session_steer(s(), "p".into()).await;
        let _ = client.session_fork(s(), None).await;
        let _ = client.session_rewind(s(), s(), Some(true)).await;
        let _ = client.session_changes(s()).await;
        let _ = client.session_changes_revert(s(), "a.txt".into()).await;
        let _ = client.session_changes_keep(s(), "a.txt".into(), "0a1b".into(), Some(false)).await;
        let _ = client.session_move(s(), RuntimeKind::DOCKER, None, None).await;
        let _ = client.engines_list().await;
        let _ = client.engines_drain("e".into(), Some(5)).await;
        let _ = client.engines_undrain("e".into()).await;
        let _ = client.session_checkpoint_list(s()).await;
        let _ = client.session_checkpoint_restore(s(), Some(1), None, "/tmp/x".into()).await;
        let _ = client.session_queue_list(s()).await;
        let _ = client.session_queue_edit(s(), "q".into(), Some("p".into()), Some(1)).await;
        let _ = client.session_queue_remove(s(), "q".into()).await;
        let _ = client.session_queue_clear(s()).await;
        let _ = client.session_queue_resume(s()).await;
        let _ = client.session_resume(s(), Some(true)).await;
        let _ = client.stop_all().await;
        let _ = client
            .cleanup(7, Some(vec![SessionState::Completed]), Some(true), Some(true), Some(true))
            .await;
        let _ = client.session_cancel(s()).await;
        let _ = client.session_pause(s(), Some("why".into()), Some(1000)).await;
        let _ = client.session_stop(s()).await;
        let _ = client.session_delete(s(), Some(true), Some(true)).await;
        let _ = client.permission_respond(s(), "7".into(), Some("allow".into())).await;
        let _ = client.session_history(s(), Some(3), Some(10)).await;
        let _ = client.session_timeline(s(), Some(4)).await;
        let _ = client.session_event_window(s(), Some(9), Some(5)).await;
        let _ = client.snapshot_list(s()).await;
        let _ = client.snapshot_get(s()).await;
        let _ = client.session_subscribe(s(), Some(2)).await;
        let _ = client.session_subscribe_batch(s(), Some(2)).await;
        let _ = client.sessions_subscribe().await;
        let _ = client
            .workflow_start(
                "name = \"x\"".into(),
                Some("/w/f.toml".into()),
                Some([("goal".to_owned(), "g".to_owned())].into()),
                Some(s()),
                Some("/w".into()),
            )
            .await;
        let _ = client.workflow_status(s()).await;
        let _ = client.workflow_list().await;
        let _ = client.workflow_resume(s(), Some("name = \"x\"".into()), Some(true)).await;
        let _ = client.workflow_cancel(s()).await;
        let _ = client.workflow_approve(s(), "build".into()).await;
        let _ = client.workflow_delete(s()).await;
        let _ = client.workflow_subscribe(s(), Some(2)).await;
        let _ = client.workflows_subscribe().await;
        let _ = client.session_retry_turn(s(), Some(s())).await;
        let _ = client.budget_set(Some(s()), None, Some(10), Some(1.5), Some("USD".into())).await;
        let _ = client
            .usage_query(
                Some(s()),
                Some(s()),
                Some(s()),
                Some(s()),
                Some(1),
                Some(2),
                Some(UsageGroupBy::Day),
            )
            .await;
        let _ = client
            .elicitation_respond(
                s(),
                "1.7".into(),
                ElicitationAnswer::Accept,
                Some(Default::default()),
            )
            .await;
        let _ = client.session_config_options(s()).await;
        let _ = client.session_set_config_option(s(), "model".into(), "large".into()).await;
        let _ = client.session_set_mode(s(), Some("code".into())).await;
        let _ = client.discover().await;
    }

    #[tokio::test]
    async fn the_trait_the_params_and_the_document_name_the_same_methods_and_fields() {
        let recorder = Recorder::default();
        call_everything(&recorder).await;
        let sent = recorder.sent.into_inner().unwrap();
        for (method, params) in &sent {
            params::check(method, params.as_deref()).unwrap_or_else(|err| {
                panic!("{method}: the trait sends what its params refuse: {err}")
            });
            // Every field the struct knows was set above: the trait sends all of them.
            let sent_fields = params
                .as_deref()
                .map(|raw| serde_json::from_str::<Map<String, Value>>(raw.get()).unwrap())
                .unwrap_or_default();
            let document = generate();
            let described = document["methods"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["name"] == method.as_str())
                .unwrap_or_else(|| panic!("{method} is not in the OpenRPC document"));
            let described: Vec<&str> = described["params"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["name"].as_str().unwrap())
                .collect();
            let mut sent_names: Vec<&str> = sent_fields.keys().map(String::as_str).collect();
            sent_names.sort_unstable();
            let mut described_sorted = described.clone();
            described_sorted.sort_unstable();
            assert_eq!(
                sent_names, described_sorted,
                "{method}: the trait's arguments vs the document's params"
            );
        }
        let mut called: Vec<&str> = sent.iter().map(|(m, _)| m.as_str()).collect();
        called.sort_unstable();
        let document = generate();
        let mut documented: Vec<&str> = document["methods"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap())
            .collect();
        documented.sort_unstable();
        assert_eq!(called, documented);
        // `method::ALL` names every method called (the unsubscribes are called by the
        // client's subscription machinery, not here).
        for name in &called {
            assert!(method::ALL.contains(name), "{name} is missing from method::ALL");
        }
    }

    /// A server that answers nothing: only its method table is looked at.
    struct Unanswered;

    fn never<T>() -> jsonrpsee::core::RpcResult<T> {
        Err(crate::errors::error_object(ErrorKind::Internal, "not served"))
    }

    #[jsonrpsee::core::async_trait]
    impl super::super::ApiServer for Unanswered {
        async fn agents_list(&self) -> jsonrpsee::core::RpcResult<Vec<AgentInfo>> {
            never()
        }
        async fn session_config_options(
            &self,
            _: String,
        ) -> jsonrpsee::core::RpcResult<SessionConfig> {
            never()
        }
        async fn elicitation_respond(
            &self,
            _: String,
            _: String,
            _: ElicitationAnswer,
            _: Option<serde_json::Map<String, Value>>,
        ) -> jsonrpsee::core::RpcResult<Done> {
            never()
        }
        async fn session_set_config_option(
            &self,
            _: String,
            _: String,
            _: serde_json::Value,
        ) -> jsonrpsee::core::RpcResult<SessionConfig> {
            never()
        }
        async fn session_set_mode(
            &self,
            _: String,
            _: Option<String>,
        ) -> jsonrpsee::core::RpcResult<SessionConfig> {
            never()
        }
        async fn task_create(
            &self,
            _: String,
            _: Option<String>,
        ) -> jsonrpsee::core::RpcResult<Task> {
            never()
        }
        async fn task_list(&self) -> jsonrpsee::core::RpcResult<Vec<Task>> {
            never()
        }
        async fn task_get(&self, _: String) -> jsonrpsee::core::RpcResult<TaskDetail> {
            never()
        }
        async fn task_delete(
            &self,
            _: String,
            _: Option<bool>,
            _: Option<bool>,
        ) -> jsonrpsee::core::RpcResult<Done> {
            never()
        }
        async fn session_create(
            &self,
            _: String,
            _: String,
            _: Option<String>,
            _: Option<String>,
            _: Option<RuntimeKind>,
            _: Option<bool>,
            _: Option<bool>,
            _: Option<String>,
            _: Option<std::collections::BTreeMap<String, String>>,
            _: Option<Vec<serde_json::Value>>,
            _: Option<String>,
            _: Option<Vec<String>>,
        ) -> jsonrpsee::core::RpcResult<SessionSummary> {
            never()
        }
        async fn session_list(
            &self,
            _: Option<String>,
            _: Option<SessionState>,
            _: Option<String>,
        ) -> jsonrpsee::core::RpcResult<Vec<SessionSummary>> {
            never()
        }
        async fn session_status(&self, _: String) -> jsonrpsee::core::RpcResult<SessionStatus> {
            never()
        }
        async fn session_prompt(
            &self,
            _: String,
            _: String,
        ) -> jsonrpsee::core::RpcResult<PromptStarted> {
            never()
        }
        async fn session_resume(
            &self,
            _: String,
            _: Option<bool>,
        ) -> jsonrpsee::core::RpcResult<ResumeResult> {
            never()
        }
        async fn session_steer(&self, _: String, _: String) -> jsonrpsee::core::RpcResult<Steered> {
            never()
        }
        async fn session_fork(
            &self,
            _: String,
            _: Option<String>,
        ) -> jsonrpsee::core::RpcResult<ForkResult> {
            never()
        }
        async fn session_rewind(
            &self,
            _: String,
            _: String,
            _: Option<bool>,
        ) -> jsonrpsee::core::RpcResult<RewindResult> {
            never()
        }
        async fn session_queue_list(&self, _: String) -> jsonrpsee::core::RpcResult<PromptQueue> {
            never()
        }
        async fn session_checkpoint_list(
            &self,
            _: String,
        ) -> jsonrpsee::core::RpcResult<CheckpointList> {
            never()
        }
        async fn session_move(
            &self,
            _: String,
            _: RuntimeKind,
            _: Option<std::collections::BTreeMap<String, String>>,
            _: Option<u64>,
        ) -> jsonrpsee::core::RpcResult<SessionMoved> {
            never()
        }
        async fn engines_list(&self) -> jsonrpsee::core::RpcResult<EngineList> {
            never()
        }
        async fn engines_drain(
            &self,
            _: String,
            _: Option<u64>,
        ) -> jsonrpsee::core::RpcResult<EngineInfo> {
            never()
        }
        async fn engines_undrain(&self, _: String) -> jsonrpsee::core::RpcResult<EngineInfo> {
            never()
        }
        async fn session_checkpoint_restore(
            &self,
            _: String,
            _: Option<u64>,
            _: Option<u64>,
            _: String,
        ) -> jsonrpsee::core::RpcResult<CheckpointRestored> {
            never()
        }
        async fn session_changes(&self, _: String) -> jsonrpsee::core::RpcResult<SessionChanges> {
            never()
        }
        async fn session_changes_revert(
            &self,
            _: String,
            _: String,
        ) -> jsonrpsee::core::RpcResult<ChangesReverted> {
            never()
        }
        async fn session_changes_keep(
            &self,
            _: String,
            _: String,
            _: String,
            _: Option<bool>,
        ) -> jsonrpsee::core::RpcResult<SessionChanges> {
            never()
        }
        async fn session_queue_edit(
            &self,
            _: String,
            _: String,
            _: Option<String>,
            _: Option<usize>,
        ) -> jsonrpsee::core::RpcResult<PromptQueue> {
            never()
        }
        async fn session_queue_remove(
            &self,
            _: String,
            _: String,
        ) -> jsonrpsee::core::RpcResult<PromptQueue> {
            never()
        }
        async fn session_queue_clear(&self, _: String) -> jsonrpsee::core::RpcResult<PromptQueue> {
            never()
        }
        async fn session_queue_resume(&self, _: String) -> jsonrpsee::core::RpcResult<PromptQueue> {
            never()
        }
        async fn stop_all(&self) -> jsonrpsee::core::RpcResult<StopAllResult> {
            never()
        }
        async fn session_cancel(&self, _: String) -> jsonrpsee::core::RpcResult<Done> {
            never()
        }
        async fn session_stop(&self, _: String) -> jsonrpsee::core::RpcResult<Done> {
            never()
        }
        async fn session_delete(
            &self,
            _: String,
            _: Option<bool>,
            _: Option<bool>,
        ) -> jsonrpsee::core::RpcResult<Done> {
            never()
        }
        async fn cleanup(
            &self,
            _: u32,
            _: Option<Vec<SessionState>>,
            _: Option<bool>,
            _: Option<bool>,
            _: Option<bool>,
        ) -> jsonrpsee::core::RpcResult<CleanupResult> {
            never()
        }
        async fn permission_respond(
            &self,
            _: String,
            _: String,
            _: Option<String>,
        ) -> jsonrpsee::core::RpcResult<Done> {
            never()
        }
        async fn session_history(
            &self,
            _: String,
            _: Option<u64>,
            _: Option<usize>,
        ) -> jsonrpsee::core::RpcResult<Vec<HistoryEntry>> {
            never()
        }
        async fn session_timeline(
            &self,
            _: String,
            _: Option<i64>,
        ) -> jsonrpsee::core::RpcResult<Timeline> {
            never()
        }
        async fn session_event_window(
            &self,
            _: String,
            _: Option<u64>,
            _: Option<usize>,
        ) -> jsonrpsee::core::RpcResult<EventWindow> {
            never()
        }
        async fn snapshot_list(
            &self,
            _: String,
        ) -> jsonrpsee::core::RpcResult<Vec<SnapshotSummary>> {
            never()
        }
        async fn snapshot_get(&self, _: String) -> jsonrpsee::core::RpcResult<Snapshot> {
            never()
        }
        async fn session_pause(
            &self,
            _: String,
            _: Option<String>,
            _: Option<u64>,
        ) -> jsonrpsee::core::RpcResult<PauseResult> {
            never()
        }
        async fn session_subscribe(
            &self,
            _: jsonrpsee::PendingSubscriptionSink,
            _: String,
            _: Option<u64>,
        ) -> jsonrpsee::core::SubscriptionResult {
            Ok(())
        }
        async fn session_subscribe_batch(
            &self,
            _: jsonrpsee::PendingSubscriptionSink,
            _: String,
            _: Option<u64>,
        ) -> jsonrpsee::core::SubscriptionResult {
            Ok(())
        }
        async fn sessions_subscribe(
            &self,
            _: jsonrpsee::PendingSubscriptionSink,
        ) -> jsonrpsee::core::SubscriptionResult {
            Ok(())
        }
        async fn workflow_start(
            &self,
            _: String,
            _: Option<String>,
            _: Option<std::collections::BTreeMap<String, String>>,
            _: Option<String>,
            _: Option<String>,
        ) -> jsonrpsee::core::RpcResult<WorkflowStarted> {
            never()
        }
        async fn workflow_status(&self, _: String) -> jsonrpsee::core::RpcResult<WorkflowStatus> {
            never()
        }
        async fn workflow_list(&self) -> jsonrpsee::core::RpcResult<Vec<WorkflowSummary>> {
            never()
        }
        async fn workflow_resume(
            &self,
            _: String,
            _: Option<String>,
            _: Option<bool>,
        ) -> jsonrpsee::core::RpcResult<WorkflowStatus> {
            never()
        }
        async fn workflow_cancel(&self, _: String) -> jsonrpsee::core::RpcResult<Done> {
            never()
        }
        async fn workflow_approve(&self, _: String, _: String) -> jsonrpsee::core::RpcResult<Done> {
            never()
        }
        async fn workflow_delete(&self, _: String) -> jsonrpsee::core::RpcResult<Done> {
            never()
        }
        async fn session_retry_turn(
            &self,
            _: String,
            _: Option<String>,
        ) -> jsonrpsee::core::RpcResult<PromptStarted> {
            never()
        }
        async fn budget_set(
            &self,
            _: Option<String>,
            _: Option<String>,
            _: Option<u64>,
            _: Option<f64>,
            _: Option<String>,
        ) -> jsonrpsee::core::RpcResult<Option<BudgetUse>> {
            never()
        }
        #[allow(clippy::too_many_arguments)]
        async fn usage_query(
            &self,
            _: Option<String>,
            _: Option<String>,
            _: Option<String>,
            _: Option<String>,
            _: Option<i64>,
            _: Option<i64>,
            _: Option<UsageGroupBy>,
        ) -> jsonrpsee::core::RpcResult<UsageReport> {
            never()
        }
        async fn workflow_subscribe(
            &self,
            _: jsonrpsee::PendingSubscriptionSink,
            _: String,
            _: Option<u64>,
        ) -> jsonrpsee::core::SubscriptionResult {
            Ok(())
        }
        async fn workflows_subscribe(
            &self,
            _: jsonrpsee::PendingSubscriptionSink,
        ) -> jsonrpsee::core::SubscriptionResult {
            Ok(())
        }
        async fn discover(&self) -> jsonrpsee::core::RpcResult<Value> {
            never()
        }
    }

    /// The server's method table (what the trait really registers) is what the document
    /// describes and what the params check knows: a method added to the trait alone fails
    /// here.
    #[test]
    fn every_method_the_server_registers_is_documented_and_checked() {
        use super::super::ApiServer;
        let module = Unanswered.into_rpc();
        // Unsubscribing is documented with its subscription (`x-unsubscribe`).
        let unsubscribe = [
            method::SESSION_UNSUBSCRIBE,
            method::SESSION_UNSUBSCRIBE_BATCH,
            method::WORKFLOW_UNSUBSCRIBE,
            method::SESSIONS_UNSUBSCRIBE,
            method::WORKFLOWS_UNSUBSCRIBE,
        ];
        let mut registered: Vec<&str> =
            module.method_names().filter(|name| !unsubscribe.contains(name)).collect();
        registered.sort_unstable();
        let document = generate();
        let mut documented: Vec<&str> = document["methods"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap())
            .collect();
        documented.sort_unstable();
        assert_eq!(registered, documented);
        // The params check has a shape for each: an unknown field is refused everywhere.
        let bogus = serde_json::value::RawValue::from_string(r#"{"bogus":1}"#.into()).unwrap();
        for name in registered {
            assert!(params::check(name, Some(&bogus)).is_err(), "{name} has no params check");
        }
    }

    #[test]
    fn the_checked_in_document_is_the_generated_one() {
        let generated = render();
        if std::env::var_os("UPDATE_OPENRPC").is_some() {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openrpc.json");
            std::fs::write(path, &generated).unwrap();
            return;
        }
        assert!(
            DOCUMENT == generated,
            "docs/openrpc.json is out of date with the API's types: run \
             `UPDATE_OPENRPC=1 cargo test -p protocol openrpc` and commit it"
        );
    }

    #[test]
    fn every_error_kind_is_documented_with_its_code() {
        let document = generate();
        let kinds = document["x-error-kinds"].as_array().unwrap();
        assert_eq!(kinds.len(), ErrorKind::ALL.len());
        for kind in ErrorKind::ALL {
            assert!(kinds.iter().any(|k| k["kind"] == kind.as_str() && k["code"] == kind.code()));
        }
    }
}
