//! What the actor tells itself: reports of its own tasks, what each request it sent the
//! agent was for, and what a new turn is.

use protocol::api::SnapshotTrigger;

use super::Retired;
use crate::session::Reply;
use crate::session::launch::{Connected, LaunchFailure};

/// Reports from the actor's own tasks.
pub(in crate::session) enum Internal {
    /// A launch finished. (Boxed, like the re-attach: this channel's buffer is allocated
    /// per session in slots of the largest message, and these two are rare.)
    Launched(Box<Result<Connected, LaunchFailure>>),
    /// A re-attach finished.
    Reattached(Box<Result<Connected, String>>),
    /// A control call of the outbox failed: the execution is lost.
    ControlFailed { execution_id: crate::ids::ExecutionId, error: String },
    /// A permission answer reached agentctl.
    AnswerSent { execution_id: crate::ids::ExecutionId, request_id: String },
    /// A snapshot taken in the background was stored.
    SnapshotTaken { snapshot_id: String, trigger: SnapshotTrigger },
    /// A checkpoint of the workspace was stored.
    CheckpointTaken(protocol::api::Checkpoint),
    /// A stop's or detach's retire is done: the sidecar is gone, and these are the events
    /// its spool held past what was handled (see [`super::SessionActor::retire_open`]).
    Retired(Box<Retired>),
}

/// What an outstanding request of ours was for.
#[derive(Debug)]
pub(in crate::session) enum Pending {
    Initialize,
    NewSession,
    /// `session/resume` (`load: false`) or `session/load` (`load: true`) of a token.
    Restore {
        load: bool,
        token: String,
    },
    Prompt {
        turn_id: crate::ids::TurnId,
        injected: bool,
    },
    /// `session/fork` of the original's agent session, at a fork's first start.
    Fork,
    /// `_session/steering` of the running turn `turn_id` with `text`, for `reply`.
    Steer {
        turn_id: crate::ids::TurnId,
        text: String,
        reply: Reply<crate::session::Steer>,
    },
    /// `authenticate` with `method`, after which the refused step is sent again.
    Authenticate {
        method: String,
        then: AfterAuth,
    },
    /// `session/set_config_option` or `session/set_mode`: for a caller (`reply`), or to
    /// set a choice again after the session opened.
    Setting {
        setting: crate::settings::Setting,
        reply: Option<Reply<crate::settings::SessionSettings>>,
    },
}

/// The handshake step an agent refused until `authenticate`.
#[derive(Debug)]
pub(in crate::session) enum AfterAuth {
    NewSession,
    Restore { load: bool, token: String },
}

/// What a new turn is, beyond its prompt.
pub(in crate::session) enum TurnKind {
    /// A prompt of a person or a client.
    Prompt,
    /// A person's retry of this turn: its prompt again.
    RetryOf(crate::ids::TurnId),
    /// Tether asking the agent for its summary before a pause.
    PauseSummary,
    /// The head of the prompt queue, taken into the turn with its record.
    Queued(crate::ids::PromptId),
    /// A steer's text from the head of the queue: the turn `steer_of` was cancelled for
    /// it, and what that turn had done goes before it.
    Steer { prompt_id: crate::ids::PromptId, steer_of: crate::ids::TurnId },
}
