//! `task.session.config_options`, `set_config_option`, `set_mode`: the agent's settings
//! (see `crate::settings`). A session with a live actor is served by it (it sets a choice
//! at once when the agent runs); one without has its choice recorded under the start lock,
//! so no actor starts meanwhile, and set when its agent next starts.

use crate::ids::SessionId;
use std::time::Duration;

use protocol::api::SessionConfig;

use super::{ServiceError, Supervisor};
use crate::session::SessionHandle;
use crate::settings::{SessionSettings, Setting};

/// How long a caller waits for the agent to take a setting.
const SETTING_WAIT: Duration = Duration::from_secs(30);

fn config(settings: SessionSettings, blocked: Option<String>) -> SessionConfig {
    SessionConfig {
        config_options: settings.options,
        modes: settings.modes,
        chosen: settings.chosen,
        chosen_mode: settings.chosen_mode,
        blocked,
    }
}

impl Supervisor {
    /// `task.session.config_options`.
    pub async fn session_config(
        &self,
        session_id: SessionId,
    ) -> Result<SessionConfig, ServiceError> {
        self.session_row(&session_id).await?;
        let settings = self.config.store.session_settings(session_id.clone()).await?;
        Ok(config(settings, self.settings_blocked(&session_id)))
    }

    fn settings_blocked(&self, session_id: &SessionId) -> Option<String> {
        self.handle(session_id).filter(SessionHandle::is_live)?.view().settings_blocked
    }

    /// `task.session.set_config_option` (`value` null: forget) and `task.session.set_mode`
    /// (`Setting::Mode` with `forget`).
    pub async fn choose_setting(
        &self,
        session_id: SessionId,
        setting: Setting,
        forget: bool,
    ) -> Result<SessionConfig, ServiceError> {
        let row = self.session_row(&session_id).await?;
        if row.state.is_terminal() {
            return Err(ServiceError::Conflict(format!(
                "session {session_id} is {}",
                row.state.as_str()
            )));
        }
        let guard = self.start_lock.lock().await;
        if let Some(handle) = self.handle(&session_id).filter(SessionHandle::is_live) {
            drop(guard);
            let chosen = tokio::time::timeout(SETTING_WAIT, handle.set_setting(setting, forget))
                .await
                .map_err(|_| {
                    ServiceError::RuntimeUnavailable(format!(
                        "the agent did not answer the setting within {} s",
                        SETTING_WAIT.as_secs()
                    ))
                })??;
            return Ok(config(chosen, handle.view().settings_blocked));
        }
        let store = &self.config.store;
        let mut settings = store.session_settings(session_id.clone()).await?;
        if forget {
            settings.forget(&setting);
        } else {
            settings.check(&setting).map_err(|err| ServiceError::InvalidParams {
                field: setting.field(),
                message: err.to_string(),
            })?;
            settings.choose(&setting);
        }
        store.set_session_settings(session_id, settings.clone()).await?;
        Ok(config(settings, None))
    }
}
