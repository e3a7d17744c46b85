//! A session's agent settings: the ACP session config options its agent reports (a model
//! is one, of category `model`), its session modes, and the values chosen through Tether.
//!
//! Agents do not keep these across a load or a resume (most start again with their
//! defaults), so what was chosen is set again each time the agent's ACP session opens, and
//! a session whose choice cannot be set again takes no prompt until it is chosen anew: a
//! prompt to the wrong model is worse than none. Options are kept raw as the agent sent
//! them (a newer agent's kinds survive); only `id`, `type`, `currentValue` and the offered
//! values are read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// What the agent reported and what was chosen, as stored with the session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionSettings {
    /// The agent's config options as it last reported them (ACP `SessionConfigOption`).
    #[serde(default)]
    pub options: Vec<Value>,
    /// Its modes (ACP `SessionModeState`), if it has any.
    #[serde(default)]
    pub modes: Option<Value>,
    /// Values chosen through Tether, by option id (a value id, or a boolean).
    #[serde(default)]
    pub chosen: BTreeMap<String, Value>,
    /// The mode chosen through Tether.
    #[serde(default)]
    pub chosen_mode: Option<String>,
    /// The agent advertised `sessionCapabilities.close` at its last `initialize` (kept
    /// here so a re-attached execution, which skips `initialize`, still knows).
    #[serde(default)]
    pub close_supported: bool,
    /// It advertised `sessionCapabilities.additionalDirectories` (likewise).
    #[serde(default)]
    pub directories_supported: bool,
    /// It advertised `_session/steering` (`_meta.steering.supported`; likewise).
    #[serde(default)]
    pub steering_supported: bool,
    /// It advertised `sessionCapabilities.fork` (likewise; what a fork of this session
    /// asks its own agent to do at its first start).
    #[serde(default)]
    pub fork_supported: bool,
}

/// One change asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Setting {
    /// `session/set_config_option`: a value id (a string) or a boolean.
    Option {
        /// The option's id.
        id: String,
        /// Its new value.
        value: Value,
    },
    /// `session/set_mode`.
    Mode(String),
}

impl Setting {
    /// The ACP method that carries it.
    pub fn method(&self) -> &'static str {
        match self {
            Setting::Option { .. } => protocol::acp::method::SESSION_SET_CONFIG_OPTION,
            Setting::Mode(_) => protocol::acp::method::SESSION_SET_MODE,
        }
    }

    /// The API field that carries it.
    pub fn field(&self) -> &'static str {
        match self {
            Setting::Option { .. } => "value",
            Setting::Mode(_) => "mode_id",
        }
    }

    /// Its params for the ACP session `acp_session`, as the schema's
    /// `SetSessionConfigOptionRequest` (a boolean, or a value id) or `SetSessionModeRequest`.
    /// A value of another kind (an agent's own) is passed as the agent gave it.
    pub fn params(&self, acp_session: &str) -> Value {
        use protocol::acp::schema::{
            SessionConfigOptionValue, SetSessionConfigOptionRequest, SetSessionModeRequest,
        };
        let option = |id: &str, value| {
            let request =
                SetSessionConfigOptionRequest::new(acp_session.to_owned(), id.to_owned(), value);
            serde_json::to_value(request).unwrap_or(Value::Null)
        };
        match self {
            Setting::Option { id, value: Value::Bool(flag) } => {
                option(id, SessionConfigOptionValue::boolean(*flag))
            }
            Setting::Option { id, value: Value::String(value) } => {
                option(id, SessionConfigOptionValue::value_id(value.clone()))
            }
            Setting::Option { id, value } => {
                json!({"sessionId": acp_session, "configId": id, "value": value})
            }
            Setting::Mode(mode) => {
                let request = SetSessionModeRequest::new(acp_session.to_owned(), mode.clone());
                serde_json::to_value(request).unwrap_or(Value::Null)
            }
        }
    }
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Setting::Option { id, value: Value::String(value) } => write!(f, "{id} = {value}"),
            Setting::Option { id, value } => write!(f, "{id} = {value}"),
            Setting::Mode(mode) => write!(f, "mode {mode}"),
        }
    }
}

/// A change that does not fit what the agent offers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    /// No such option.
    #[error("the agent offers no config option {id} (it offers: {offered})")]
    UnknownOption {
        /// The option asked for.
        id: String,
        /// The options there are.
        offered: String,
    },
    /// A value the option does not offer, or of the wrong type.
    #[error("{id} cannot be {value} (it can be: {offered})")]
    UnknownValue {
        /// The option.
        id: String,
        /// The value asked for.
        value: String,
        /// The values there are.
        offered: String,
    },
    /// No such mode.
    #[error("the agent has no mode {mode} (its modes: {offered})")]
    UnknownMode {
        /// The mode asked for.
        mode: String,
        /// The modes there are.
        offered: String,
    },
}

fn listed(items: Vec<String>) -> String {
    if items.is_empty() { "none".to_owned() } else { items.join(", ") }
}

/// The value ids a select option offers (flat, or in groups).
pub(crate) fn offered_values(option: &Value) -> Vec<String> {
    let mut values = Vec::new();
    for item in option["options"].as_array().into_iter().flatten() {
        match item["options"].as_array() {
            Some(group) => values.extend(group.iter().filter_map(|o| o["value"].as_str())),
            None => values.extend(item["value"].as_str()),
        }
    }
    values.into_iter().map(str::to_owned).collect()
}

impl SessionSettings {
    /// An answer that reports settings (`session/new`, `load`, `resume`,
    /// `set_config_option`): what it holds replaces what was known.
    pub fn reported(&mut self, answer: &Value) {
        if let Some(options) = answer.get("configOptions").and_then(Value::as_array) {
            self.options = options.clone();
        }
        if let Some(modes) = answer.get("modes").filter(|modes| modes.is_object()) {
            self.modes = Some(modes.clone());
        }
    }

    /// A `config_option_update` or `current_mode_update` the agent sent. With `track` (the
    /// session is open, not being restored) it was the agent's own change (leaving plan
    /// mode, say): an option's value stands, also for a choice made earlier, so a later
    /// restore does not undo it; a mode the agent switched itself into (qwen's auto-edit
    /// after an "always allow") is no choice of the user's, so the mode chosen earlier is
    /// dropped and nothing is set again at the next open. True when it was one.
    pub fn updated(&mut self, update: &Value, track: bool) -> bool {
        match update["sessionUpdate"].as_str() {
            Some("config_option_update") => {
                self.reported(update);
                for (id, value) in self.chosen.iter_mut().filter(|_| track) {
                    if let Some(current) = current_of(&self.options, id) {
                        *value = current.clone();
                    }
                }
                true
            }
            Some("current_mode_update") => {
                if let Some(mode) = update["currentModeId"].as_str() {
                    self.set_current_mode(mode);
                    if track {
                        self.chosen_mode = None;
                    }
                }
                true
            }
            _ => false,
        }
    }

    /// The option's current value, as last reported.
    pub fn current(&self, id: &str) -> Option<&Value> {
        current_of(&self.options, id)
    }

    /// The current mode, as last reported.
    pub fn current_mode(&self) -> Option<&str> {
        self.modes.as_ref()?["currentModeId"].as_str()
    }

    /// The current value of the option of category `model`, for lists and headers.
    pub fn model(&self) -> Option<&str> {
        let option = self.options.iter().find(|option| option["category"] == "model")?;
        option["currentValue"].as_str()
    }

    /// Whether `setting` fits what the agent last offered. Before the agent reported
    /// anything (a session not started yet) every choice is taken, and checked by the
    /// agent when it is set.
    pub fn check(&self, setting: &Setting) -> Result<(), SettingError> {
        match setting {
            Setting::Option { .. } if self.options.is_empty() => Ok(()),
            Setting::Option { id, value } => {
                let ids = || {
                    listed(
                        self.options
                            .iter()
                            .filter_map(|o| o["id"].as_str())
                            .map(str::to_owned)
                            .collect(),
                    )
                };
                let Some(option) = self.options.iter().find(|option| option["id"] == id.as_str())
                else {
                    return Err(SettingError::UnknownOption { id: id.clone(), offered: ids() });
                };
                let fits = match (option["type"].as_str(), value) {
                    (Some("boolean"), Value::Bool(_)) => true,
                    (Some("select"), Value::String(value)) => {
                        offered_values(option).iter().any(|offered| offered == value)
                    }
                    // A kind newer than us: the agent judges.
                    (Some("boolean" | "select"), _) => false,
                    _ => true,
                };
                if fits {
                    return Ok(());
                }
                let offered = match option["type"].as_str() {
                    Some("boolean") => "true, false".to_owned(),
                    _ => listed(offered_values(option)),
                };
                let value = value.as_str().map(str::to_owned).unwrap_or_else(|| value.to_string());
                Err(SettingError::UnknownValue { id: id.clone(), value, offered })
            }
            Setting::Mode(_) if self.modes.is_none() => Ok(()),
            Setting::Mode(mode) => {
                let modes: Vec<String> = self
                    .modes
                    .as_ref()
                    .map(|modes| {
                        modes["availableModes"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|m| m["id"].as_str())
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default();
                if modes.iter().any(|known| known == mode) {
                    Ok(())
                } else {
                    Err(SettingError::UnknownMode { mode: mode.clone(), offered: listed(modes) })
                }
            }
        }
    }

    /// Records `setting` as chosen (to be set again at every open).
    pub fn choose(&mut self, setting: &Setting) {
        match setting {
            Setting::Option { id, value } => {
                self.chosen.insert(id.clone(), value.clone());
            }
            Setting::Mode(mode) => self.chosen_mode = Some(mode.clone()),
        }
    }

    /// Drops the choice of `setting`'s option or of the mode (the agent's value stands).
    pub fn forget(&mut self, setting: &Setting) {
        match setting {
            Setting::Option { id, .. } => {
                self.chosen.remove(id);
            }
            Setting::Mode(_) => self.chosen_mode = None,
        }
    }

    /// The agent took `setting`: it is current (its answer may report more).
    pub fn applied(&mut self, setting: &Setting, answer: &Value) {
        match setting {
            Setting::Option { id, value } => {
                if let Some(option) =
                    self.options.iter_mut().find(|option| option["id"] == id.as_str())
                {
                    option["currentValue"] = value.clone();
                }
                self.reported(answer);
            }
            Setting::Mode(mode) => self.set_current_mode(mode),
        }
    }

    fn set_current_mode(&mut self, mode: &str) {
        if let Some(modes) = self.modes.as_mut() {
            modes["currentModeId"] = Value::String(mode.to_owned());
        }
    }

    /// The choices the agent does not have now (after it opened with its defaults): the
    /// options first, in id order, then the mode.
    pub fn to_restore(&self) -> Vec<Setting> {
        let mut restore: Vec<Setting> = self
            .chosen
            .iter()
            .filter(|(id, value)| self.current(id) != Some(*value))
            .map(|(id, value)| Setting::Option { id: id.clone(), value: value.clone() })
            .collect();
        if let Some(mode) =
            self.chosen_mode.as_ref().filter(|mode| self.current_mode() != Some(mode.as_str()))
        {
            restore.push(Setting::Mode(mode.clone()));
        }
        restore
    }
}

fn current_of<'a>(options: &'a [Value], id: &str) -> Option<&'a Value> {
    options.iter().find(|option| option["id"] == id)?.get("currentValue")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mock() -> SessionSettings {
        let mut settings = SessionSettings::default();
        settings.reported(&json!({
            "configOptions": [
                {"id": "model", "name": "Model", "category": "model", "type": "select",
                 "currentValue": "small", "options": [{"value": "small", "name": "S"},
                 {"group": "big", "name": "Big", "options": [{"value": "large", "name": "L"}]}]},
                {"id": "fast", "name": "Fast", "type": "boolean", "currentValue": false},
            ],
            "modes": {"currentModeId": "ask", "availableModes": [{"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code"}]},
        }));
        settings
    }

    fn option(id: &str, value: Value) -> Setting {
        Setting::Option { id: id.into(), value }
    }

    #[test]
    fn choices_are_checked_against_what_the_agent_offers() {
        let settings = mock();
        assert_eq!(settings.model(), Some("small"));
        settings.check(&option("model", json!("large"))).unwrap();
        settings.check(&option("fast", json!(true))).unwrap();
        settings.check(&Setting::Mode("code".into())).unwrap();
        assert_eq!(
            settings.check(&option("model", json!("huge"))).unwrap_err().to_string(),
            "model cannot be huge (it can be: small, large)"
        );
        assert!(matches!(
            settings.check(&option("fast", json!("yes"))),
            Err(SettingError::UnknownValue { .. })
        ));
        assert!(matches!(
            settings.check(&option("speed", json!("x"))),
            Err(SettingError::UnknownOption { .. })
        ));
        assert!(matches!(
            settings.check(&Setting::Mode("yolo".into())),
            Err(SettingError::UnknownMode { .. })
        ));
        // Nothing reported yet: the agent judges when it is set.
        SessionSettings::default().check(&option("model", json!("anything"))).unwrap();
    }

    #[test]
    fn what_was_chosen_is_restored_after_the_agent_opens_with_its_defaults() {
        let mut settings = mock();
        let large = option("model", json!("large"));
        settings.choose(&large);
        settings.choose(&Setting::Mode("code".into()));
        settings.applied(&large, &json!({}));
        settings.applied(&Setting::Mode("code".into()), &json!({}));
        assert_eq!(settings.to_restore(), vec![]);
        // A load: the agent reports its defaults again.
        let defaults = mock();
        settings.reported(&json!({"configOptions": defaults.options, "modes": defaults.modes}));
        assert_eq!(settings.to_restore(), vec![large.clone(), Setting::Mode("code".into())]);
        assert_eq!(
            large.params("s1"),
            json!({"sessionId": "s1", "configId": "model", "value": "large"})
        );
        assert_eq!(
            option("fast", json!(true)).params("s1"),
            json!({"sessionId": "s1", "configId": "fast", "type": "boolean", "value": true})
        );
        assert_eq!(
            Setting::Mode("code".into()).params("s1"),
            json!({"sessionId": "s1", "modeId": "code"})
        );
    }

    #[test]
    fn a_change_the_agent_makes_itself_stands_and_its_own_mode_is_no_choice() {
        let mut settings = mock();
        let to_ask = json!({"sessionUpdate": "current_mode_update", "currentModeId": "ask"});
        let to_code = json!({"sessionUpdate": "current_mode_update", "currentModeId": "code"});
        // While restoring, an update says what is current, and the choice stays.
        settings.choose(&Setting::Mode("code".into()));
        assert!(settings.updated(&to_ask, false));
        assert_eq!(settings.chosen_mode.as_deref(), Some("code"));
        // Once open, the agent's own change stands, and is not set again at the next open
        // as if the user had chosen it (nor is the mode chosen before it).
        settings.choose(&Setting::Mode("ask".into()));
        assert!(settings.updated(&to_code, true));
        assert_eq!(settings.current_mode(), Some("code"));
        assert_eq!(settings.chosen_mode, None);
        assert_eq!(settings.to_restore(), vec![]);
        // Reopened in its default mode, nothing is set.
        assert!(settings.updated(&to_ask, false));
        assert_eq!(settings.to_restore(), vec![]);
        let mut options = mock().options;
        options[0]["currentValue"] = json!("large");
        settings.choose(&option("model", json!("small")));
        assert!(settings.updated(
            &json!({"sessionUpdate": "config_option_update", "configOptions": options}),
            true
        ));
        assert_eq!(settings.chosen["model"], json!("large"));
        assert!(!settings.updated(&json!({"sessionUpdate": "plan"}), true));
    }
}
