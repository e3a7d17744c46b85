//! Workflows on the wire: a task run as several agent steps, each a session.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a workflow is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkflowState {
    /// Steps run or wait (for their dependencies, or an approval).
    Running,
    /// Every step completed (or was skipped by a route).
    Completed,
    /// A step failed; `workflow.resume` goes on from the first step not completed.
    Failed,
    /// Cancelled (`workflow.cancel`); resumable like a failed one.
    Cancelled,
}

wire_names!(WorkflowState {
    Running => "running",
    Completed => "completed",
    Failed => "failed",
    Cancelled => "cancelled",
});

impl WorkflowState {
    /// Nothing runs until someone resumes it.
    pub fn is_over(self) -> bool {
        self != WorkflowState::Running
    }
}

/// Where a step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    /// Not started: its dependencies are not done, or there is no room (`max_parallel`).
    Pending,
    /// Its dependencies are done; it waits for `workflow.approve`.
    WaitingApproval,
    /// Its session runs its prompt.
    Running,
    /// Its turn ended `completed`; `output` is its final agent message.
    Completed,
    /// It failed (`error` says why).
    Failed,
    /// Not run: a route chose another step.
    Skipped,
    /// Cancelled with its workflow.
    Cancelled,
}

wire_names!(StepState {
    Pending => "pending",
    WaitingApproval => "waiting_approval",
    Running => "running",
    Completed => "completed",
    Failed => "failed",
    Skipped => "skipped",
    Cancelled => "cancelled",
});

impl StepState {
    /// Done with, as far as the steps after it are concerned.
    pub fn is_done(self) -> bool {
        matches!(self, StepState::Completed | StepState::Skipped)
    }
}

/// One step of `workflow.status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StepStatus {
    /// The step's id in the file (a worker of `for_each` is `ID[N]`).
    pub id: String,
    /// Where it is.
    pub state: StepState,
    /// Its session (of its latest run), once it started.
    pub session_id: Option<String>,
    /// Its agent profile.
    pub agent: String,
    /// How many times it started (a loop runs a step again; so does a launch retry).
    pub runs: u32,
    /// How many times its latest run's prompt was sent again, its turn cut short (its
    /// agent died mid-turn, or the prompt never reached it); at most 3.
    #[serde(default)]
    pub resends: u32,
    /// Which pass of its loop (0 for the first).
    pub iteration: u32,
    /// Its final agent message, once completed.
    pub output: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
    /// The prompt of its latest run, as sent.
    pub prompt: Option<String>,
    /// The steps it waits for.
    pub depends_on: Vec<String>,
    /// It waits for an approval before it starts.
    pub approval: bool,
    /// What its agent reported of its context and cost (ACP `usage_update`) by the end of
    /// its turn, when it reported anything.
    pub usage: Option<StepUsage>,
    /// When its latest run started, Unix ms.
    pub started_at: Option<i64>,
    /// When it ended, Unix ms.
    pub ended_at: Option<i64>,
}

/// A step's usage as its agent last reported it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StepUsage {
    /// Tokens in the agent's context (`usage_update.used`).
    pub context_used: Option<u64>,
    /// Its context window (`usage_update.size`).
    pub context_size: Option<u64>,
    /// The session's cumulative cost (`usage_update.cost.amount`).
    pub cost: Option<f64>,
    /// Its unit (`usage_update.cost.currency`).
    pub cost_currency: Option<String>,
}

/// `workflow.status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WorkflowStatus {
    /// The workflow.
    pub workflow_id: String,
    /// Its task.
    pub task_id: String,
    /// The workflow file's `name`.
    pub name: String,
    /// Where it is.
    pub state: WorkflowState,
    /// Why it failed.
    pub error: Option<String>,
    /// The file it was started from, if it came from one.
    pub spec_file: Option<String>,
    /// SHA-256 of the workflow file's text it runs.
    pub spec_sha256: String,
    /// Where its steps work.
    pub workspace: Option<String>,
    /// How many times it was resumed.
    pub resumes: u32,
    /// The newest event's seq (subscribe after it for what comes next).
    pub last_event_seq: u64,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms.
    pub updated_at: i64,
    /// Its steps, in file order (workers after their template).
    pub steps: Vec<StepStatus>,
}

/// One workflow of `workflow.list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WorkflowSummary {
    /// The workflow.
    pub workflow_id: String,
    /// Its task.
    pub task_id: String,
    /// Its name.
    pub name: String,
    /// Where it is.
    pub state: WorkflowState,
    /// Its steps.
    pub steps: u32,
    /// Those completed (or skipped).
    pub steps_done: u32,
    /// The steps that wait for `workflow.approve`, in file order: while it runs, a person
    /// is needed.
    #[serde(default)]
    pub waiting_approval: Vec<String>,
    /// The newest event's seq: it grows with each change of the workflow's stream.
    #[serde(default)]
    pub last_event_seq: u64,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms.
    pub updated_at: i64,
}

/// One event of `workflows.subscribe` (`workflows.event` notifications).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum WorkflowsEvent {
    /// A workflow was created, or changed (a step started, waits for approval or ended; the
    /// workflow ended or was resumed): the workflow as it is now.
    Changed {
        /// The workflow.
        workflow: WorkflowSummary,
    },
    /// A workflow was deleted.
    Deleted {
        /// The workflow.
        workflow_id: String,
    },
    /// Changes were missed (the client fell behind): list the workflows again.
    Resync,
    /// A kind this build does not know (a newer daemon's).
    #[serde(other)]
    Other,
}

/// `workflow.start`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WorkflowStarted {
    /// The workflow.
    pub workflow_id: String,
    /// Its task (made for it unless one was given).
    pub task_id: String,
}

/// One event of a workflow's stream (`workflow.event` notifications).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WorkflowEvent {
    /// From 1, without gaps, per workflow: resubscribe with the last one seen as
    /// `after_seq` and nothing is missed.
    pub seq: u64,
    /// Unix ms.
    pub at: i64,
    /// What happened.
    #[serde(flatten)]
    pub kind: WorkflowEventKind,
}

/// The kinds of [`WorkflowEvent`] (its `type` member).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum WorkflowEventKind {
    /// The workflow's state changed.
    WorkflowState {
        /// The new state.
        state: WorkflowState,
        /// Why, when it failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A step's session was created with its prompt.
    StepStarted {
        /// The step.
        step_id: String,
        /// Its session.
        session_id: String,
        /// Its run (from 1).
        run: u32,
        /// Its loop pass (from 0).
        iteration: u32,
    },
    /// A step's turn ended `completed`.
    StepCompleted {
        /// The step.
        step_id: String,
        /// Its final agent message.
        output: String,
    },
    /// A step failed.
    StepFailed {
        /// The step.
        step_id: String,
        /// Why.
        error: String,
    },
    /// A step waits for `workflow.approve`.
    StepWaitingApproval {
        /// The step.
        step_id: String,
    },
    /// A step was not run (a route chose another) or was set back to run again (a loop).
    StepReset {
        /// The step.
        step_id: String,
        /// Its new state.
        state: StepState,
        /// Why.
        reason: String,
    },
    /// A kind this build does not know (a newer daemon's).
    #[serde(other)]
    Other,
}
