//! An agent's settings (ACP session config options — its model — and
//! modes) through the API. What is chosen survives a daemon kill and is set again when
//! the agent comes back with its defaults (mock-agent, like most agents, does not keep
//! them across a load); a choice the agent will not take again refuses prompts until it
//! is chosen anew.

use protocol::api::{ApiClient, EventKind, SessionConfig};
use protocol::errors::ErrorKind;
use serde_json::{Value, json};
use tether_tests::daemon::{Api, Daemon, ok, progress_steps, refused, until};

async fn config(api: &Api, session: &str) -> SessionConfig {
    ok("config_options", api.typed().session_config_options(session.to_owned())).await
}

async fn set_option(api: &Api, session: &str, id: &str, value: Value) -> SessionConfig {
    let call = api.typed().session_set_config_option(session.to_owned(), id.to_owned(), value);
    ok("set_config_option", call).await
}

fn current(config: &SessionConfig, id: &str) -> Value {
    let option = config.config_options.iter().find(|option| option["id"] == id);
    option.map(|option| option["currentValue"].clone()).unwrap_or_default()
}

async fn pause(api: &Api, session: &str) {
    let mut events = api.subscribe_at_end(session).await;
    ok("pause", api.typed().session_pause(session.to_owned(), None, None)).await;
    tether_tests::daemon::until(&mut events, |event| {
        matches!(event.kind, EventKind::Paused { .. })
    })
    .await;
}

#[tokio::test]
async fn a_chosen_model_and_mode_outlive_a_kill_and_are_set_again_when_the_agent_comes_back() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("w")).await;
    let offered = config(&api, &session).await;
    assert_eq!(current(&offered, "model"), json!("mock-small"), "{offered:?}");
    assert_eq!(offered.modes.as_ref().unwrap()["currentModeId"], "ask");
    // Tether checks a choice against what the agent offers.
    let wrong = refused(
        "set_config_option",
        api.typed().session_set_config_option(session.clone(), "model".into(), json!("gpt-9")),
    )
    .await;
    assert_eq!((wrong.kind, wrong.field.as_deref()), (ErrorKind::InvalidParams, Some("value")));
    assert!(wrong.message.contains("mock-small, mock-large"), "{}", wrong.message);
    // Set at once while the agent runs: the agent's answer says so.
    let chosen = set_option(&api, &session, "model", json!("mock-large")).await;
    assert_eq!(current(&chosen, "model"), json!("mock-large"));
    assert_eq!(chosen.chosen["model"], json!("mock-large"));
    assert_eq!(api.ask(&session, "/settings").await, "model=mock-large mode=ask");
    // The daemon dies; its successor re-attaches, then the agent is paused (it stops),
    // and a mode is chosen while nothing runs: recorded for the next start.
    daemon.kill().await;
    daemon.restart().await;
    let api = daemon.api().await;
    pause(&api, &session).await;
    let chosen =
        ok("set_mode", api.typed().session_set_mode(session.clone(), Some("code".into()))).await;
    assert_eq!(chosen.chosen_mode.as_deref(), Some("code"));
    assert_eq!(chosen.modes.as_ref().unwrap()["currentModeId"], "ask", "not set yet: {chosen:?}");
    let unknown =
        refused("set_mode", api.typed().session_set_mode(session.clone(), Some("yolo".into())))
            .await;
    assert_eq!(unknown.kind, ErrorKind::InvalidParams);
    // A prompt resumes it: mock-agent loads the session with its defaults, and both
    // choices are set again before the prompt goes out.
    assert_eq!(api.ask(&session, "/settings").await, "model=mock-large mode=code");
    let window = api.typed().session_event_window(session.clone(), None, Some(500));
    let history = ok("event_window", window).await;
    let steps = progress_steps(&history.events);
    assert!(steps.iter().any(|step| step.contains("settings")), "{steps:?}");
    let now = config(&api, &session).await;
    assert_eq!(current(&now, "model"), json!("mock-large"));
    assert_eq!(now.modes.as_ref().unwrap()["currentModeId"], "code");
    assert_eq!(now.blocked, None);
}

#[tokio::test]
async fn a_choice_the_agent_will_not_take_again_refuses_prompts_until_chosen_anew() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("w")).await;
    set_option(&api, &session, "model", json!("mock-large")).await;
    pause(&api, &session).await;
    // The model is no longer offered when the agent comes back.
    let marker = daemon.mock_state_dir().join("refuse-settings");
    std::fs::write(&marker, "").unwrap();
    // The prompt is queued while the agent comes back; the agent will not take the
    // choice, so the queue halts, saying why, and the prompt waits there.
    let mut events = api.subscribe_at_end(&session).await;
    let queued = api.prompt_or_queue(&session, "to the wrong model?").await.unwrap();
    assert!(queued.queued && queued.waking, "{queued:?}");
    let seen = until(
        &mut events,
        |event| matches!(&event.kind, EventKind::Queue { queue } if queue.halted.is_some()),
    )
    .await;
    let EventKind::Queue { queue } = &seen.last().unwrap().kind else { unreachable!() };
    let why = queue.halted.as_deref().unwrap_or_default();
    assert!(why.contains("model = mock-large"), "{why}");
    assert_eq!(queue.prompts.len(), 1, "it stays queued: {queue:?}");
    // While the choice is not taken, a prompt is refused, saying why.
    let refusal =
        refused("prompt", api.typed().session_prompt(session.clone(), "and now?".into())).await;
    assert_eq!(refusal.kind, ErrorKind::SettingsNotRestored, "{refusal:?}");
    assert!(refusal.message.contains("model = mock-large"), "{}", refusal.message);
    let blocked = config(&api, &session).await;
    assert!(blocked.blocked.is_some(), "{blocked:?}");
    assert_eq!(current(&blocked, "model"), json!("mock-small"));
    // Nothing reached the agent: no turn was recorded.
    let state_now = api.status(&session).await;
    assert_eq!(state_now.state, protocol::api::SessionState::WaitingForInput);
    // While the agent refuses, a new choice is refused too (and says why).
    let again = refused(
        "set_config_option",
        api.typed().session_set_config_option(session.clone(), "model".into(), json!("mock-large")),
    )
    .await;
    assert_eq!(again.kind, ErrorKind::AgentRefused, "{again:?}");
    assert!(again.message.contains("no longer offered"), "{}", again.message);
    // Forgetting the choice lets the agent's own model stand: prompts are taken again.
    let forgotten = set_option(&api, &session, "model", Value::Null).await;
    assert!(forgotten.chosen.is_empty() && forgotten.blocked.is_none(), "{forgotten:?}");
    assert_eq!(api.ask(&session, "/settings").await, "model=mock-small mode=ask");
    // Offered again, chosen again: set at once.
    std::fs::remove_file(&marker).unwrap();
    set_option(&api, &session, "model", json!("mock-large")).await;
    assert_eq!(api.ask(&session, "/settings").await, "model=mock-large mode=ask");
}

/// The CLI lists what can be chosen, chooses, and says why a choice was refused.
#[tokio::test]
async fn the_cli_lists_and_chooses_settings() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("w")).await;
    let (code, out, err) = daemon.cli(&["settings", &session]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("model = mock-small; can be: mock-small, mock-large"), "{out}");
    assert!(
        out.contains("mode = ask; can be: ask (Ask before editing), code (Edit freely)"),
        "{out}"
    );
    let (code, out, err) =
        daemon.cli(&["settings", &session, "--set", "model=mock-large", "--mode", "code"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("model = mock-large, chosen;"), "{out}");
    assert!(out.contains("mode = code, chosen;"), "{out}");
    let (code, _, err) = daemon.cli(&["settings", &session, "--set", "model=gpt-9"]).await;
    assert_ne!(code, 0);
    assert!(err.contains("model cannot be gpt-9 (it can be: mock-small, mock-large)"), "{err}");
    assert_eq!(api.ask(&session, "/settings").await, "model=mock-large mode=code");
}
