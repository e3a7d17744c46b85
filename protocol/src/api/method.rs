//! Method names, for servers that check params before a method runs and for docs.

/// `agents.list`
pub const AGENTS_LIST: &str = "agents.list";
/// `task.create`
pub const TASK_CREATE: &str = "task.create";
/// `task.list`
pub const TASK_LIST: &str = "task.list";
/// `task.get`
pub const TASK_GET: &str = "task.get";
/// `task.delete`
pub const TASK_DELETE: &str = "task.delete";
/// `task.session.create`
pub const SESSION_CREATE: &str = "task.session.create";
/// `task.session.list`
pub const SESSION_LIST: &str = "task.session.list";
/// `task.session.status`
pub const SESSION_STATUS: &str = "task.session.status";
/// `task.session.prompt`
pub const SESSION_PROMPT: &str = "task.session.prompt";
/// `task.session.resume`
pub const SESSION_RESUME: &str = "task.session.resume";
/// `task.session.steer`
pub const SESSION_STEER: &str = "task.session.steer";
/// `task.session.fork`
pub const SESSION_FORK: &str = "task.session.fork";
/// `task.session.rewind`
pub const SESSION_REWIND: &str = "task.session.rewind";
/// `task.session.move`
pub const SESSION_MOVE: &str = "task.session.move";
/// `engines.list`
pub const ENGINES_LIST: &str = "engines.list";
/// `engines.drain`
pub const ENGINES_DRAIN: &str = "engines.drain";
/// `engines.undrain`
pub const ENGINES_UNDRAIN: &str = "engines.undrain";
/// `task.session.checkpoint.list`
pub const SESSION_CHECKPOINT_LIST: &str = "task.session.checkpoint.list";
/// `task.session.checkpoint.restore`
pub const SESSION_CHECKPOINT_RESTORE: &str = "task.session.checkpoint.restore";
/// `task.session.changes`
pub const SESSION_CHANGES: &str = "task.session.changes";
/// `task.session.changes.revert`
pub const SESSION_CHANGES_REVERT: &str = "task.session.changes.revert";
/// `task.session.changes.keep`
pub const SESSION_CHANGES_KEEP: &str = "task.session.changes.keep";
/// `task.session.queue.list`
pub const SESSION_QUEUE_LIST: &str = "task.session.queue.list";
/// `task.session.queue.edit`
pub const SESSION_QUEUE_EDIT: &str = "task.session.queue.edit";
/// `task.session.queue.remove`
pub const SESSION_QUEUE_REMOVE: &str = "task.session.queue.remove";
/// `task.session.queue.clear`
pub const SESSION_QUEUE_CLEAR: &str = "task.session.queue.clear";
/// `task.session.queue.resume`
pub const SESSION_QUEUE_RESUME: &str = "task.session.queue.resume";
/// `sessions.stop_all`
pub const STOP_ALL: &str = "sessions.stop_all";
/// `sessions.cleanup`
pub const CLEANUP: &str = "sessions.cleanup";
/// `task.session.cancel`
pub const SESSION_CANCEL: &str = "task.session.cancel";
/// `task.session.pause`
pub const SESSION_PAUSE: &str = "task.session.pause";
/// `task.session.stop`
pub const SESSION_STOP: &str = "task.session.stop";
/// `task.session.delete`
pub const SESSION_DELETE: &str = "task.session.delete";
/// `task.session.permission.respond`
pub const PERMISSION_RESPOND: &str = "task.session.permission.respond";
/// `task.session.history`
pub const SESSION_HISTORY: &str = "task.session.history";
/// `task.session.timeline`
pub const SESSION_TIMELINE: &str = "task.session.timeline";
/// `task.session.event_window`
pub const SESSION_EVENT_WINDOW: &str = "task.session.event_window";
/// `task.session.snapshot.list`
pub const SNAPSHOT_LIST: &str = "task.session.snapshot.list";
/// `task.session.snapshot.get`
pub const SNAPSHOT_GET: &str = "task.session.snapshot.get";
/// `task.session.subscribe`
pub const SESSION_SUBSCRIBE: &str = "task.session.subscribe";
/// The subscription's notifications.
pub const SESSION_EVENT: &str = "task.session.event";
/// `task.session.unsubscribe`
pub const SESSION_UNSUBSCRIBE: &str = "task.session.unsubscribe";
/// `task.session.subscribe_batch`
pub const SESSION_SUBSCRIBE_BATCH: &str = "task.session.subscribe_batch";
/// The batched subscription's notifications.
pub const SESSION_EVENTS: &str = "task.session.events";
/// `task.session.unsubscribe_batch`
pub const SESSION_UNSUBSCRIBE_BATCH: &str = "task.session.unsubscribe_batch";
/// `sessions.subscribe`
pub const SESSIONS_SUBSCRIBE: &str = "sessions.subscribe";
/// The session list's notifications.
pub const SESSIONS_EVENT: &str = "sessions.event";
/// `sessions.unsubscribe`
pub const SESSIONS_UNSUBSCRIBE: &str = "sessions.unsubscribe";
/// `workflow.start`
pub const WORKFLOW_START: &str = "workflow.start";
/// `workflow.status`
pub const WORKFLOW_STATUS: &str = "workflow.status";
/// `workflow.list`
pub const WORKFLOW_LIST: &str = "workflow.list";
/// `workflow.resume`
pub const WORKFLOW_RESUME: &str = "workflow.resume";
/// `workflow.cancel`
pub const WORKFLOW_CANCEL: &str = "workflow.cancel";
/// `workflow.approve`
pub const WORKFLOW_APPROVE: &str = "workflow.approve";
/// `workflow.delete`
pub const WORKFLOW_DELETE: &str = "workflow.delete";
/// `workflow.subscribe`
pub const WORKFLOW_SUBSCRIBE: &str = "workflow.subscribe";
/// The workflow subscription's notifications.
pub const WORKFLOW_EVENT: &str = "workflow.event";
/// `workflow.unsubscribe`
pub const WORKFLOW_UNSUBSCRIBE: &str = "workflow.unsubscribe";
/// `workflows.subscribe`
pub const WORKFLOWS_SUBSCRIBE: &str = "workflows.subscribe";
/// The workflow list's notifications.
pub const WORKFLOWS_EVENT: &str = "workflows.event";
/// `workflows.unsubscribe`
pub const WORKFLOWS_UNSUBSCRIBE: &str = "workflows.unsubscribe";
/// `rpc.discover`: the OpenRPC document.
pub const DISCOVER: &str = "rpc.discover";

/// `task.session.retry_turn`
pub const SESSION_RETRY_TURN: &str = "task.session.retry_turn";
/// `budget.set`
pub const BUDGET_SET: &str = "budget.set";
/// `usage.query`
pub const USAGE_QUERY: &str = "usage.query";
/// `task.session.config_options`
pub const SESSION_CONFIG_OPTIONS: &str = "task.session.config_options";
/// `task.session.set_config_option`
pub const SESSION_SET_CONFIG_OPTION: &str = "task.session.set_config_option";
/// `task.session.set_mode`
pub const SESSION_SET_MODE: &str = "task.session.set_mode";
/// `task.session.elicitation.respond`
pub const ELICITATION_RESPOND: &str = "task.session.elicitation.respond";

/// Every method a client calls (not the notifications), for bounded metric labels.
pub const ALL: &[&str] = &[
    AGENTS_LIST,
    TASK_CREATE,
    TASK_LIST,
    TASK_GET,
    TASK_DELETE,
    SESSION_CREATE,
    SESSION_LIST,
    SESSION_STATUS,
    SESSION_PROMPT,
    SESSION_RESUME,
    STOP_ALL,
    CLEANUP,
    SESSION_CANCEL,
    SESSION_PAUSE,
    SESSION_STOP,
    SESSION_DELETE,
    PERMISSION_RESPOND,
    SESSION_HISTORY,
    SESSION_TIMELINE,
    SESSION_EVENT_WINDOW,
    SNAPSHOT_LIST,
    SNAPSHOT_GET,
    SESSION_SUBSCRIBE,
    SESSION_UNSUBSCRIBE,
    SESSION_SUBSCRIBE_BATCH,
    SESSION_UNSUBSCRIBE_BATCH,
    SESSIONS_SUBSCRIBE,
    SESSIONS_UNSUBSCRIBE,
    WORKFLOW_START,
    WORKFLOW_STATUS,
    WORKFLOW_LIST,
    WORKFLOW_RESUME,
    WORKFLOW_CANCEL,
    WORKFLOW_APPROVE,
    WORKFLOW_DELETE,
    WORKFLOW_SUBSCRIBE,
    WORKFLOW_UNSUBSCRIBE,
    WORKFLOWS_SUBSCRIBE,
    WORKFLOWS_UNSUBSCRIBE,
    SESSION_RETRY_TURN,
    SESSION_STEER,
    SESSION_FORK,
    SESSION_REWIND,
    SESSION_CHANGES,
    SESSION_CHECKPOINT_LIST,
    SESSION_CHECKPOINT_RESTORE,
    SESSION_MOVE,
    ENGINES_LIST,
    ENGINES_DRAIN,
    ENGINES_UNDRAIN,
    SESSION_CHANGES_REVERT,
    SESSION_CHANGES_KEEP,
    SESSION_QUEUE_LIST,
    SESSION_QUEUE_EDIT,
    SESSION_QUEUE_REMOVE,
    SESSION_QUEUE_CLEAR,
    SESSION_QUEUE_RESUME,
    BUDGET_SET,
    USAGE_QUERY,
    SESSION_CONFIG_OPTIONS,
    SESSION_SET_CONFIG_OPTION,
    SESSION_SET_MODE,
    ELICITATION_RESPOND,
    DISCOVER,
];
