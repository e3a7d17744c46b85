//! The face's session config: the `agent` option (which Tether profile runs the session)
//! beside the agent's own config options and modes, relayed to the daemon's
//! `task.session.config_options`, `set_config_option` and `set_mode`.
//!
//! Without `--agent`, `session/new` creates nothing yet: it answers with an id of its own
//! choosing and the `agent` option, and the Tether session (with that id) is created with
//! the chosen profile by the first prompt — so the client can choose the agent first, as
//! ACP clients offer. Once created, a session's agent is fixed (its conversation is that
//! agent's); its other options change any time.

use serde_json::{Value, json};

use super::{Face, RpcFailure};
use protocol::api::{AgentInfo, ApiClient, SessionConfig};

/// Profiles preferred as the default agent, in order, when available.
const PREFERRED: [&str; 4] = ["claude-code", "codex", "gemini", "opencode"];

/// A session answered but not created yet: what its creation needs.
#[derive(Debug, Clone)]
pub(super) struct Draft {
    pub(super) cwd: String,
    pub(super) mcp_servers: Option<Vec<Value>>,
    pub(super) additional_directories: Option<Vec<String>>,
    pub(super) agent: String,
}

/// A profile that can run here.
fn runs_here(agent: &AgentInfo) -> bool {
    agent.available && !agent.invalid
}

/// The `agent` select option.
fn agent_option(current: &str, agents: &[AgentInfo]) -> Value {
    let mut options: Vec<Value> = agents
        .iter()
        .filter(|agent| runs_here(agent))
        .map(|agent| json!({"value": agent.id, "name": agent.display_name}))
        .collect();
    if !options.iter().any(|option| option["value"] == current) {
        options.insert(0, json!({"value": current, "name": current}));
    }
    json!({
        "id": "agent",
        "name": "Agent",
        "description": "The Tether agent profile that runs this session (chosen before its first prompt)",
        "type": "select",
        "currentValue": current,
        "options": options,
    })
}

/// The default agent: the first preferred one available, else the first available.
fn default_agent(agents: &[AgentInfo]) -> Option<String> {
    let available: Vec<&AgentInfo> = agents.iter().filter(|agent| runs_here(agent)).collect();
    PREFERRED
        .iter()
        .find_map(|id| available.iter().find(|agent| agent.id == *id))
        .or_else(|| available.iter().find(|agent| agent.id != "mock"))
        .or_else(|| available.first())
        .map(|agent| agent.id.clone())
}

impl Face {
    async fn agents(&self) -> Result<Vec<AgentInfo>, RpcFailure> {
        let api = self.api().await?;
        api.agents_list().await.map_err(|err| self.failed(&api, err))
    }

    /// `session/new` without `--agent`: a draft with the default agent.
    pub(super) async fn new_draft(&self, draft_of: Draft) -> Result<Value, RpcFailure> {
        let agents = self.agents().await?;
        let agent = default_agent(&agents).ok_or_else(|| {
            RpcFailure::internal("no agent profile can run here (`supervisor agents` says why)")
        })?;
        let id = uuid::Uuid::now_v7().to_string();
        let option = agent_option(&agent, &agents);
        self.drafts().insert(id.clone(), Draft { agent, ..draft_of });
        Ok(json!({"sessionId": id, "configOptions": [option]}))
    }

    pub(super) fn drafts(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Draft>> {
        self.drafts.lock().expect("UNWRAP: never poisoned")
    }

    /// The `configOptions` and `modes` of a created session, the `agent` option first.
    pub(super) async fn config_answer(&self, session: &str) -> Result<Value, RpcFailure> {
        let api = self.api().await?;
        let config = api
            .session_config_options(session.to_owned())
            .await
            .map_err(|e| self.failed(&api, e))?;
        let status =
            api.session_status(session.to_owned()).await.map_err(|e| self.failed(&api, e))?;
        let agents = self.agents().await?;
        Ok(with_agent(&status.agent_profile_id, &agents, config))
    }

    /// `session/set_config_option`.
    pub(super) async fn set_config_option(&self, params: Value) -> Result<Value, RpcFailure> {
        let session = session_of(&params)?;
        let config_id = params["configId"]
            .as_str()
            .ok_or_else(|| RpcFailure::params("a configId is needed"))?
            .to_owned();
        let value = params.get("value").cloned().unwrap_or(Value::Null);
        let is_draft = self.drafts().contains_key(&session);
        if is_draft {
            if config_id != "agent" {
                return Err(RpcFailure::params(format!(
                    "{config_id} is not known yet: the agent's own options come when it starts (with the first prompt)"
                )));
            }
            let agents = self.agents().await?;
            let chosen = value.as_str().unwrap_or_default();
            if !agents.iter().any(|agent| agent.id == chosen && runs_here(agent)) {
                return Err(RpcFailure::params(format!("no agent {chosen} can run here")));
            }
            if let Some(draft) = self.drafts().get_mut(&session) {
                draft.agent = chosen.to_owned();
            }
            return Ok(json!({"configOptions": [agent_option(chosen, &agents)]}));
        }
        let api = self.api().await?;
        if config_id == "agent" {
            let status =
                api.session_status(session.clone()).await.map_err(|e| self.failed(&api, e))?;
            if value.as_str() != Some(status.agent_profile_id.as_str()) {
                return Err(RpcFailure::params(format!(
                    "this session's conversation is {}'s: its agent does not change once it started (start a new session for another)",
                    status.agent_profile_id
                )));
            }
        } else {
            // A boolean option's value comes as `{"type": "boolean", "value": true}`.
            api.session_set_config_option(session.clone(), config_id, value)
                .await
                .map_err(|err| self.failed(&api, err))?;
        }
        let answer = self.config_answer(&session).await?;
        Ok(json!({"configOptions": answer["configOptions"]}))
    }

    /// `session/set_mode`.
    pub(super) async fn set_mode(&self, params: Value) -> Result<Value, RpcFailure> {
        let session = session_of(&params)?;
        if self.drafts().contains_key(&session) {
            return Err(RpcFailure::params(
                "the agent's modes come when it starts (with the first prompt)",
            ));
        }
        let mode = params["modeId"]
            .as_str()
            .ok_or_else(|| RpcFailure::params("a modeId is needed"))?
            .to_owned();
        let api = self.api().await?;
        api.session_set_mode(session, Some(mode)).await.map_err(|err| self.failed(&api, err))?;
        Ok(json!({}))
    }
}

fn session_of(params: &Value) -> Result<String, RpcFailure> {
    params["sessionId"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| RpcFailure::params("a sessionId is needed"))
}

/// The agent option, then the agent's own; its modes.
fn with_agent(profile: &str, agents: &[AgentInfo], config: SessionConfig) -> Value {
    let mut options = vec![agent_option(profile, agents)];
    options.extend(config.config_options);
    let mut answer = json!({"configOptions": options});
    if let Some(modes) = config.modes {
        answer["modes"] = modes;
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(id: &str, available: bool) -> AgentInfo {
        serde_json::from_value(json!({"id": id, "display_name": id.to_uppercase(),
            "available": available, "invalid": false, "reasons": [], "resume_command": false,
            "history_injection": false}))
        .unwrap_or_else(|err| panic!("an AgentInfo: {err}"))
    }

    #[test]
    fn the_default_agent_is_a_preferred_one_that_can_run() {
        let agents = [agent("mock", true), agent("claude-code", false), agent("codex", true)];
        assert_eq!(default_agent(&agents).as_deref(), Some("codex"));
        assert_eq!(default_agent(&[agent("mock", true)]).as_deref(), Some("mock"));
        assert_eq!(
            default_agent(&[agent("goose", true), agent("mock", true)]).as_deref(),
            Some("goose")
        );
        let option = agent_option("codex", &agents);
        let values: Vec<&str> = option["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["value"].as_str().unwrap())
            .collect();
        assert_eq!(values, ["mock", "codex"]);
    }
}
