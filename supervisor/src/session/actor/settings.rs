//! The agent's settings (`crate::settings`): reported when the ACP session opens and by
//! the agent's updates, chosen through the API, and set again — one at a time, before the
//! session counts as open — whenever the ACP session opens. A choice the agent will not
//! take again blocks prompts (`settings_blocked` in the view) until it is chosen anew or
//! forgotten: a prompt to the wrong model is worse than none.

use serde_json::{Value, json};

use super::{Pending, SessionActor};
use crate::events::{LaunchStep, SessionEventKind};
use crate::session::choices::RestoreStep;
use crate::session::{Phase, Reply, SessionError};
use crate::settings::{SessionSettings, Setting};
use crate::store::ResumeOutcome;

impl SessionActor {
    /// Loaded before any agent event is handled. Unreadable settings are said and
    /// replaced by none (the agent's own values stand).
    pub(super) async fn load_settings(&mut self) {
        match self.context.store.session_settings(self.row.id.clone()).await {
            Ok(settings) => self.choices.load(settings),
            Err(err) => {
                tracing::warn!(session = %self.row.id, %err, "cannot read the session's settings");
                self.recorder.emit(SessionEventKind::Notice {
                    message: format!(
                        "the session's chosen settings cannot be read ({err}); the agent's own stand"
                    ),
                });
            }
        }
    }

    async fn save_settings(&mut self) {
        let settings = self.choices.take_for_writing();
        let saved = self.context.store.set_session_settings(self.row.id.clone(), settings).await;
        if let Err(err) = saved {
            tracing::error!(session = %self.row.id, %err, "cannot record the session's settings");
        }
    }

    /// After an agent update was handled: the settings it changed, and the title it gave,
    /// are written.
    pub(in crate::session) async fn settings_updated(&mut self) {
        if self.choices.dirty() {
            self.save_settings().await;
        }
        if let Some(title) = self.conversation.new_title.take()
            && title != self.row.title
        {
            let store = &self.context.store;
            match store.set_session_title(self.row.id.clone(), title.clone()).await {
                Ok(()) => self.row.title = title,
                Err(err) => tracing::warn!(session = %self.row.id, %err, "cannot record the title"),
            }
        }
    }

    /// A `config_option_update` or `current_mode_update`; a change the agent made itself
    /// once the session is open also replaces what was chosen.
    pub(in crate::session) fn agent_setting_update(&mut self, update: &Value) {
        let open = self.phase() == Phase::Open;
        self.choices.agent_update(update, open);
    }

    /// The ACP session answered open (`answer`: that of `session/new`, `load` or
    /// `resume`): its settings are recorded, and the choices it lacks are set again before
    /// the session counts as open.
    pub(in crate::session) async fn opened_with(
        &mut self,
        acp_session: String,
        restored: Option<ResumeOutcome>,
        answer: &Value,
    ) {
        self.choices.opened(acp_session, restored, answer);
        self.save_settings().await;
        self.update_view(|view| view.settings_blocked = None);
        self.next_restore().await;
    }

    async fn next_restore(&mut self) {
        match self.choices.next_restore() {
            Some(RestoreStep::Send { setting, acp_session }) => {
                self.recorder.progress(LaunchStep::Settings, Some(setting.to_string()));
                let params = setting.params(&acp_session);
                self.request(setting.method(), params, Pending::Setting { setting, reply: None });
            }
            Some(RestoreStep::Done { acp_session, restored, failed }) => {
                self.settings_restored(acp_session, restored, failed).await;
            }
            None => {}
        }
    }

    async fn settings_restored(
        &mut self,
        acp_session: String,
        restored: Option<ResumeOutcome>,
        failed: Vec<String>,
    ) {
        if !failed.is_empty() {
            let reason = format!(
                "the agent did not take the session's settings again ({}); no prompt is sent until they are chosen anew (task.session.set_config_option or set_mode, CLI: settings)",
                failed.join("; ")
            );
            let _ = self.context.store.log_error(self.row.id.clone(), reason.clone()).await;
            self.recorder.emit(SessionEventKind::Notice { message: reason.clone() });
            self.update_view(|view| view.settings_blocked = Some(reason));
        }
        self.session_opened(acp_session, restored).await;
    }

    /// The agent answered a `session/set_config_option` or `session/set_mode` of ours.
    pub(in crate::session) async fn setting_answered(
        &mut self,
        setting: Setting,
        reply: Option<Reply<SessionSettings>>,
        result: Result<Value, String>,
    ) {
        let restoring = self.choices.answered(&setting, reply.is_some(), &result);
        if result.is_ok() {
            self.save_settings().await;
            self.announce_settings(&setting);
        }
        if let Some(reply) = reply {
            if result.is_ok() {
                self.unblock_if_restored();
            }
            let answer =
                result.map(|_| self.choices.settings().clone()).map_err(SessionError::AgentRefused);
            let _ = reply.send(answer);
        } else if restoring {
            self.next_restore().await;
        }
    }

    /// Viewers learn a change as the agent would have said it.
    fn announce_settings(&mut self, setting: &Setting) {
        let update = match setting {
            Setting::Option { .. } => json!({"sessionUpdate": "config_option_update",
                "configOptions": self.choices.settings().options}),
            Setting::Mode(mode) => json!({"sessionUpdate": "current_mode_update",
                "currentModeId": mode}),
        };
        self.recorder.emit(SessionEventKind::SessionUpdate { update });
    }

    fn unblock_if_restored(&mut self) {
        let blocked = self.view_tx.borrow().settings_blocked.is_some();
        if blocked && self.choices.all_restored() {
            self.update_view(|view| view.settings_blocked = None);
            self.recorder.emit(SessionEventKind::Notice {
                message: "the session's settings are as chosen again; prompts are taken".into(),
            });
        }
    }

    /// `task.session.set_config_option` / `set_mode`: checked against what the agent
    /// offers; sent at once when the ACP session is open, else recorded for the next open.
    pub(in crate::session) async fn choose_setting(
        &mut self,
        setting: Setting,
        forget: bool,
        reply: Reply<SessionSettings>,
    ) {
        if forget {
            self.choices.forget(&setting);
            self.save_settings().await;
            self.unblock_if_restored();
            let _ = reply.send(Ok(self.choices.settings().clone()));
            return;
        }
        if let Err(err) = self.choices.settings().check(&setting) {
            let field = setting.field();
            let _ =
                reply.send(Err(SessionError::InvalidParams { field, message: err.to_string() }));
            return;
        }
        let acp_session = self.view_tx.borrow().acp_session_id.clone();
        let open = self.phase() == Phase::Open
            && self.sidecar.execution.as_ref().is_some_and(|execution| execution.agent_running);
        match acp_session.filter(|_| open) {
            Some(acp_session) => {
                let params = setting.params(&acp_session);
                self.request(
                    setting.method(),
                    params,
                    Pending::Setting { setting, reply: Some(reply) },
                );
            }
            None => {
                self.choices.choose(&setting);
                self.save_settings().await;
                let _ = reply.send(Ok(self.choices.settings().clone()));
            }
        }
    }
}
