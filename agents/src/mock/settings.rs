//! mock-agent's session settings: a model (an ACP session config option of category
//! `model`) and a mode (ACP session modes), as real agents advertise them. Like most real
//! agents, mock-agent does not remember them: a session loaded or resumed by a new process
//! starts with the defaults again, and it is the client's job to set them back.
//!
//! A file named [`REFUSE_MARKER`] in the state dir makes every change refused (a model
//! that is no longer offered), so tests can see what a client does when a restore fails.

use std::path::Path;

use protocol::RpcError;
use serde_json::{Value, json};

/// The file in `--state-dir` whose presence makes setting an option or a mode fail.
pub const REFUSE_MARKER: &str = "refuse-settings";

const MODELS: [(&str, &str); 2] = [("mock-small", "Mock small"), ("mock-large", "Mock large")];
const MODES: [(&str, &str); 2] = [("ask", "Ask before editing"), ("code", "Edit freely")];

/// One session's current settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The `model` option's value.
    pub model: String,
    /// The current mode id.
    pub mode: String,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings { model: MODELS[0].0.to_owned(), mode: MODES[0].0.to_owned() }
    }
}

impl Settings {
    /// The `configOptions` of a session/new, load or resume answer, and of a
    /// `config_option_update`.
    pub fn config_options(&self) -> Value {
        let options: Vec<Value> =
            MODELS.iter().map(|(value, name)| json!({"value": value, "name": name})).collect();
        json!([{
            "id": "model",
            "name": "Model",
            "description": "Which model answers",
            "category": "model",
            "type": "select",
            "currentValue": self.model,
            "options": options,
        }])
    }

    /// The `modes` of a session/new, load or resume answer.
    pub fn modes(&self) -> Value {
        let available: Vec<Value> =
            MODES.iter().map(|(id, name)| json!({"id": id, "name": name})).collect();
        json!({"currentModeId": self.mode, "availableModes": available})
    }

    /// `session/set_config_option`: the new value, or why not.
    pub fn set_option(
        &mut self,
        state_dir: Option<&Path>,
        id: &str,
        value: &str,
    ) -> Result<(), RpcError> {
        refused(state_dir)?;
        if id != "model" {
            return Err(RpcError::invalid_params(format!("unknown config option {id}")));
        }
        if !MODELS.iter().any(|(known, _)| *known == value) {
            return Err(RpcError::invalid_params(format!("model {value} is not offered")));
        }
        self.model = value.to_owned();
        Ok(())
    }

    /// `session/set_mode`: the new mode, or why not.
    pub fn set_mode(&mut self, state_dir: Option<&Path>, mode: &str) -> Result<(), RpcError> {
        refused(state_dir)?;
        if !MODES.iter().any(|(known, _)| *known == mode) {
            return Err(RpcError::invalid_params(format!("unknown mode {mode}")));
        }
        self.mode = mode.to_owned();
        Ok(())
    }

    /// What `/settings` replies.
    pub fn describe(&self) -> String {
        format!("model={} mode={}", self.model, self.mode)
    }
}

fn refused(state_dir: Option<&Path>) -> Result<(), RpcError> {
    match state_dir {
        Some(dir) if dir.join(REFUSE_MARKER).exists() => Err(RpcError::invalid_params(
            "this session's settings cannot be changed now (the model is no longer offered)",
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_modes_change_only_to_what_is_offered() {
        let mut settings = Settings::default();
        assert_eq!(settings.config_options()[0]["currentValue"], "mock-small");
        settings.set_option(None, "model", "mock-large").unwrap();
        assert_eq!(settings.config_options()[0]["currentValue"], "mock-large");
        assert!(settings.set_option(None, "model", "gpt-9").is_err());
        assert!(settings.set_option(None, "speed", "fast").is_err());
        settings.set_mode(None, "code").unwrap();
        assert!(settings.set_mode(None, "yolo").is_err());
        assert_eq!(settings.describe(), "model=mock-large mode=code");
        assert_eq!(settings.modes()["currentModeId"], "code");
    }

    #[test]
    fn the_marker_refuses_every_change() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(REFUSE_MARKER), "").unwrap();
        let mut settings = Settings::default();
        assert!(settings.set_option(Some(dir.path()), "model", "mock-large").is_err());
        assert!(settings.set_mode(Some(dir.path()), "code").is_err());
        assert_eq!(settings, Settings::default());
    }
}
