//! The session's choices: the agent's settings and those chosen ([`SessionSettings`]),
//! whether an update of the agent changed them (to be written once it is handled), and
//! their restore — each choice set again, one at a time, when the ACP session opens. It
//! decides; the actor sends the requests and writes the rows.

use serde_json::Value;

use crate::settings::{SessionSettings, Setting};
use crate::store::ResumeOutcome;

/// The ACP session answered open; its choices are being set again.
#[derive(Debug)]
struct Restore {
    acp_session: String,
    restored: Option<ResumeOutcome>,
    /// Not sent yet, the next last.
    queue: Vec<Setting>,
    /// What the agent refused, with its answer.
    failed: Vec<String>,
}

/// The next step of a restore.
#[derive(Debug, PartialEq)]
pub(super) enum RestoreStep {
    /// Set this choice again (on the ACP session).
    Send { setting: Setting, acp_session: String },
    /// All were sent and answered: the session opens (the choices the agent refused, if
    /// any, block prompts).
    Done { acp_session: String, restored: Option<ResumeOutcome>, failed: Vec<String> },
}

/// The settings, their dirtiness and their restore.
#[derive(Debug, Default)]
pub(super) struct Choices {
    settings: SessionSettings,
    /// An update of the agent changed the settings; written after it is handled.
    dirty: bool,
    restore: Option<Restore>,
}

impl Choices {
    /// The settings the store holds (read when the actor starts).
    pub(super) fn load(&mut self, settings: SessionSettings) {
        self.settings = settings;
    }

    pub(super) fn settings(&self) -> &SessionSettings {
        &self.settings
    }

    /// What the agent said it supports (`initialize`'s answer).
    pub(super) fn settings_mut(&mut self) -> &mut SessionSettings {
        &mut self.settings
    }

    /// The settings to write: they are clean once taken.
    pub(super) fn take_for_writing(&mut self) -> SessionSettings {
        self.dirty = false;
        self.settings.clone()
    }

    /// An agent update changed them and they were not written yet.
    pub(super) fn dirty(&self) -> bool {
        self.dirty
    }

    /// A `config_option_update` or `current_mode_update`; a change the agent made itself
    /// while the session is `open` also replaces what was chosen.
    pub(super) fn agent_update(&mut self, update: &Value, open: bool) {
        self.dirty |= self.settings.updated(update, open);
    }

    /// The ACP session answered open (`answer`: that of `session/new`, `load` or
    /// `resume`): its settings are taken, and the choices it lacks are to be set again.
    pub(super) fn opened(
        &mut self,
        acp_session: String,
        restored: Option<ResumeOutcome>,
        answer: &Value,
    ) {
        self.settings.reported(answer);
        let queue = self.settings.to_restore().into_iter().rev().collect();
        self.restore = Some(Restore { acp_session, restored, queue, failed: Vec::new() });
    }

    /// The next step of the restore under way (`None`: none is).
    pub(super) fn next_restore(&mut self) -> Option<RestoreStep> {
        let restore = self.restore.as_mut()?;
        if let Some(setting) = restore.queue.pop() {
            let acp_session = restore.acp_session.clone();
            return Some(RestoreStep::Send { setting, acp_session });
        }
        let Restore { acp_session, restored, failed, .. } = self.restore.take()?;
        Some(RestoreStep::Done { acp_session, restored, failed })
    }

    /// The agent answered a setting of ours: `chosen` when a caller chose it (not a
    /// restore). Returns whether it belongs to a restore under way (whose next step
    /// follows).
    pub(super) fn answered(
        &mut self,
        setting: &Setting,
        chosen: bool,
        result: &Result<Value, String>,
    ) -> bool {
        if let Ok(answer) = result {
            self.settings.applied(setting, answer);
            if chosen {
                self.settings.choose(setting);
            }
        }
        if chosen {
            return false;
        }
        let Some(restore) = self.restore.as_mut() else { return false };
        if let Err(error) = result {
            restore.failed.push(format!("{setting}: {error}"));
        }
        true
    }

    /// A choice recorded for the next open (the ACP session is not open now).
    pub(super) fn choose(&mut self, setting: &Setting) {
        self.settings.choose(setting);
    }

    /// A choice forgotten: the agent's own value stands.
    pub(super) fn forget(&mut self, setting: &Setting) {
        self.settings.forget(setting);
    }

    /// Every choice is as chosen again (prompts blocked for a refused one are taken).
    pub(super) fn all_restored(&self) -> bool {
        self.settings.to_restore().is_empty()
    }
}

#[cfg(test)]
mod tests;
