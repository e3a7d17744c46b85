//! An agent's own settings chosen through Tether, checked where the choice shows —
//! the model the scripted model server is asked for — for the real agents that offer their
//! model as an ACP config option (claude's is in `real_agents`).

use protocol::api::{ApiClient, EventKind};
use serde_json::json;
use tether_tests::daemon::{Api, Daemon, ok, until};
use tether_tests::model_server::{ModelServer, Reply};

/// The model the newest turn asked the model server for.
fn asked_model(server: &ModelServer) -> String {
    let asked = server.main_requests();
    asked.last().expect("the model was asked")["model"].as_str().unwrap_or_default().to_owned()
}

/// Chooses `value` for the session's `category: model` option (which must offer it), and
/// returns the model asked for before and after; then pauses the agent and asks again,
/// returning the model asked for after it came back too.
pub(crate) async fn choose_model(
    api: &Api,
    session: &str,
    server: &ModelServer,
    value: &str,
) -> (String, String, String) {
    let config = ok("config", api.typed().session_config_options(session.to_owned())).await;
    let model = config.config_options.iter().find(|option| option["category"] == "model");
    let model = model.expect("the agent offers its model as a config option").clone();
    let offered: Vec<&str> =
        model["options"].as_array().unwrap().iter().filter_map(|o| o["value"].as_str()).collect();
    assert!(offered.contains(&value), "{value} among {offered:?}");
    let id = model["id"].as_str().unwrap().to_owned();
    server.script([Reply::Text("first".into())]);
    api.ask(session, "one").await;
    let before = asked_model(server);
    let set = api.typed().session_set_config_option(session.to_owned(), id.clone(), json!(value));
    ok("set model", set).await;
    server.script([Reply::Text("second".into())]);
    api.ask(session, "two").await;
    let chosen = asked_model(server);
    let mut events = api.subscribe_at_end(session).await;
    ok("pause", api.typed().session_pause(session.to_owned(), None, None)).await;
    until(&mut events, |event| matches!(event.kind, EventKind::Paused { .. })).await;
    server.script([Reply::Text("third".into())]);
    api.ask(session, "three").await;
    let after = asked_model(server);
    let config = ok("config", api.typed().session_config_options(session.to_owned())).await;
    let current = config.config_options.iter().find(|option| option["id"] == id.as_str());
    assert_eq!(current.unwrap()["currentValue"], value, "the choice as it stands");
    (before, chosen, after)
}

/// opencode offers its model (`provider/model`) as a config option: the one chosen through
/// Tether is the one the model server is asked for, also after the agent came back.
#[tokio::test]
async fn opencode_model_chosen_through_tether_reaches_the_model_server() {
    let server = ModelServer::start().await;
    let Some(profile) = tether_tests::real_agents::opencode_profile() else { return };
    let daemon = Daemon::start_with_profiles(&[], &[("opencode.toml", &profile)]).await;
    let workspace = daemon.workspace("oc");
    let config = tether_tests::real_agents::opencode_config(&server.url);
    std::fs::write(workspace.join("opencode.json"), config).unwrap();
    let api = daemon.api().await;
    let session = api.ready_session("opencode", &workspace).await;
    let (before, chosen, after) =
        choose_model(&api, &session, &server, "anthropic/claude-opus-4-5").await;
    assert!(before.contains("haiku"), "the workspace's default first: {before}");
    assert_eq!(chosen, "claude-opus-4-5", "{before} → {chosen}");
    assert_eq!(after, chosen, "after the agent came back");
}

/// codex offers its model as a config option (and its approval preset as both an option and
/// a mode): the model chosen through Tether is the one the Responses API is asked for, also
/// after the agent came back; a mode chosen through Tether is the agent's current mode.
#[tokio::test]
async fn codex_model_and_mode_chosen_through_tether_reach_the_agent() {
    let server = ModelServer::start().await;
    let Some(profile) = tether_tests::real_agents::codex_scripted_profile(&server.url, None) else {
        return;
    };
    let daemon = Daemon::start_with_profiles(&[], &[("codex.toml", &profile)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("codex-here", &daemon.workspace("cx")).await;
    let (before, chosen, after) = choose_model(&api, &session, &server, "gpt-6-luna").await;
    assert_ne!(before, "gpt-6-luna");
    assert_eq!(chosen, "gpt-6-luna", "{before} → {chosen}");
    assert_eq!(after, chosen, "after the agent came back");
    ok("mode", api.typed().session_set_mode(session.clone(), Some("read-only".into()))).await;
    let config = ok("config", api.typed().session_config_options(session.clone())).await;
    let modes = config.modes.expect("codex has modes");
    assert_eq!(modes["currentModeId"], "read-only", "{modes}");
    let preset = config.config_options.iter().find(|option| option["id"] == "mode").unwrap();
    assert_eq!(preset["currentValue"], "read-only", "the agent's own option follows: {preset}");
}
