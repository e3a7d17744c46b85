//! `supervisor settings SESSION [--set ID=VALUE] [--mode MODE]`: a session's agent
//! settings (its model and other ACP config options, its mode), and choosing them.

use protocol::api::SessionConfig;
use serde_json::Value;

use super::client::Client;
use super::output::print_json;
use super::{Failure, usage};
use protocol::api::ApiClient;

/// What `--set ID=VALUE` asks for: `true`/`false` for a switch, nothing to forget.
fn parse_set(set: &str) -> Result<(String, Value), Failure> {
    let Some((id, value)) = set.split_once('=') else {
        return Err(usage(format!(
            "error: --set takes ID=VALUE (like model=claude-sonnet-4; ID= forgets the choice), not {set:?}"
        )));
    };
    let value = match value.trim() {
        "" => Value::Null,
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        other => Value::String(other.to_owned()),
    };
    Ok((id.trim().to_owned(), value))
}

impl Client {
    pub(super) async fn settings(
        &self,
        session: String,
        set: Option<String>,
        mode: Option<String>,
        json: bool,
    ) -> Result<(), Failure> {
        let api = &*self.client;
        let mut config = None;
        if let Some(set) = set {
            let (id, value) = parse_set(&set)?;
            let call = api.session_set_config_option(session.clone(), id, value);
            config = Some(call.await.map_err(|e| self.failure(e))?);
        }
        if let Some(mode) = mode {
            let mode = (mode != "-").then_some(mode);
            let call = api.session_set_mode(session.clone(), mode);
            config = Some(call.await.map_err(|e| self.failure(e))?);
        }
        let config = match config {
            Some(config) => config,
            None => api.session_config_options(session).await.map_err(|e| self.failure(e))?,
        };
        if json {
            return print_json(&config);
        }
        for line in settings_lines(&config) {
            println!("{line}");
        }
        Ok(())
    }
}

/// One line per option and one for the modes: the current value, whether it was chosen
/// (and to what, if the agent has something else now), and what can be chosen.
pub(super) fn settings_lines(config: &SessionConfig) -> Vec<String> {
    let mut lines = Vec::new();
    if config.config_options.is_empty() && config.modes.is_none() {
        lines.push(
            "the agent has reported no settings (yet: they come when it first starts)".into(),
        );
    }
    let text =
        |value: &Value| value.as_str().map(str::to_owned).unwrap_or_else(|| value.to_string());
    // An agent may offer its mode both as an option of category `mode` and as ACP modes
    // (codex does): the option's line says it, with a mode chosen either way.
    let mode_option = config.config_options.iter().any(|option| option["category"] == "mode");
    let chosen_mode = config.chosen_mode.clone().map(Value::String);
    for option in &config.config_options {
        let id = option["id"].as_str().unwrap_or("?");
        let current = option.get("currentValue").map(text).unwrap_or_else(|| "?".into());
        let mut line = format!("{id} = {current}");
        if let Some(category) = option["category"].as_str().filter(|category| *category != id) {
            line.push_str(&format!(" ({category})"));
        }
        let chosen = match config.chosen.get(id) {
            None if option["category"] == "mode" => chosen_mode.as_ref(),
            chosen => chosen,
        };
        match chosen {
            Some(chosen) if option.get("currentValue") == Some(chosen) => line.push_str(", chosen"),
            Some(chosen) => line.push_str(&format!(", chosen: {}", text(chosen))),
            None => {}
        }
        let offered = choices(option);
        if !offered.is_empty() {
            line.push_str(&format!("; can be: {}", offered.join(", ")));
        }
        lines.push(line);
    }
    for (id, chosen) in config
        .chosen
        .iter()
        .filter(|(id, _)| !config.config_options.iter().any(|option| option["id"] == id.as_str()))
    {
        lines.push(format!("{id}: chosen {} (set when the agent starts)", text(chosen)));
    }
    if mode_option {
        // Said on the option's line.
    } else if let Some(modes) = &config.modes {
        let current = modes["currentModeId"].as_str().unwrap_or("?");
        let mut line = format!("mode = {current}");
        match config.chosen_mode.as_deref() {
            Some(chosen) if chosen == current => line.push_str(", chosen"),
            Some(chosen) => line.push_str(&format!(", chosen: {chosen}")),
            None => {}
        }
        let available: Vec<String> = modes["availableModes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|mode| {
                let id = mode["id"].as_str()?;
                Some(match mode["name"].as_str().filter(|name| *name != id) {
                    Some(name) => format!("{id} ({name})"),
                    None => id.to_owned(),
                })
            })
            .collect();
        if !available.is_empty() {
            line.push_str(&format!("; can be: {}", available.join(", ")));
        }
        lines.push(line);
    } else if let Some(chosen) = &config.chosen_mode {
        lines.push(format!("mode: chosen {chosen} (set when the agent starts)"));
    }
    if let Some(blocked) = &config.blocked {
        lines.push(format!("prompts are refused: {blocked}"));
    }
    lines
}

/// The values a select option offers (flat or grouped), or `true, false` for a switch.
fn choices(option: &Value) -> Vec<String> {
    if option["type"] == "boolean" {
        return vec!["true".into(), "false".into()];
    }
    crate::settings::offered_values(option)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn settings_read_as_current_chosen_and_offered() {
        let config = SessionConfig {
            config_options: vec![json!({"id": "model", "name": "Model", "category": "model",
                "type": "select", "currentValue": "small",
                "options": [{"value": "small", "name": "S"}, {"value": "large", "name": "L"}]})],
            modes: Some(json!({"currentModeId": "ask", "availableModes": [
                {"id": "ask", "name": "Ask"}, {"id": "code", "name": "code"}]})),
            chosen: [("model".to_owned(), json!("large"))].into(),
            chosen_mode: Some("ask".into()),
            blocked: Some("the agent did not take model = large again".into()),
        };
        assert_eq!(
            settings_lines(&config),
            vec![
                "model = small, chosen: large; can be: small, large",
                "mode = ask, chosen; can be: ask (Ask), code",
                "prompts are refused: the agent did not take model = large again",
            ]
        );
        let parsed = |set: &str| parse_set(set).ok();
        assert_eq!(parsed("model=large"), Some(("model".into(), json!("large"))));
        assert_eq!(parsed("fast=true"), Some(("fast".into(), json!(true))));
        assert_eq!(parsed("model="), Some(("model".into(), Value::Null)));
        assert!(parse_set("model").is_err());
    }

    /// An agent (codex) that offers its mode both as a config option of category `mode`
    /// and as ACP modes: one line says the mode, with what was chosen through either.
    #[test]
    fn a_mode_offered_as_an_option_and_as_modes_reads_once() {
        let config = SessionConfig {
            config_options: vec![json!({"id": "mode", "name": "Approval preset",
                "category": "mode", "type": "select", "currentValue": "read-only",
                "options": [{"value": "read-only", "name": "Read only"},
                    {"value": "auto", "name": "Auto"}]})],
            modes: Some(json!({"currentModeId": "read-only", "availableModes": [
                {"id": "read-only", "name": "Read only"}, {"id": "auto", "name": "Auto"}]})),
            chosen: Default::default(),
            chosen_mode: Some("read-only".into()),
            blocked: None,
        };
        assert_eq!(
            settings_lines(&config),
            vec!["mode = read-only, chosen; can be: read-only, auto"]
        );
    }
}
