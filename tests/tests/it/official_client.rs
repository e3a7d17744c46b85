//! An independent client drives mock-agent: the official `agent-client-protocol` crate in
//! the Client role (`sdk-client`) runs initialize → session/new → prompt, then a new
//! process loads the session and the client sees the replayed history.

use serde_json::json;
use tether_tests::sdk::{SdkClient, prompt};
use tether_tests::workspace_bin;

#[tokio::test]
async fn official_client_runs_a_session_and_loads_it_in_a_new_process() {
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().to_str().unwrap().to_owned();
    let cwd = state.path().to_owned();
    let mock = workspace_bin("mock-agent");

    let mut first = SdkClient::spawn(&mock, &["--state-dir", &state_dir], &[]);
    let init = first.call("initialize", json!({"protocolVersion": 1})).await.unwrap();
    assert_eq!(init["agentCapabilities"]["loadSession"], true, "{init}");
    let new = first.call("session/new", json!({"cwd": cwd, "mcpServers": []})).await.unwrap();
    let session = new["sessionId"].as_str().expect("a session id").to_owned();
    let answer = first.call("session/prompt", prompt(&session, "the secret is 42")).await;
    assert_eq!(answer.unwrap()["stopReason"], "end_turn");
    let seen = first.saw("the reply chunk", |seen| !seen.is_empty()).await;
    first.close().await;
    assert!(seen[0].starts_with("agent: mock-agent: remembered 0 earlier messages"), "{seen:?}");

    let mut second = SdkClient::spawn(&mock, &["--state-dir", &state_dir], &[]);
    second.call("initialize", json!({"protocolVersion": 1})).await.unwrap();
    let load = json!({"sessionId": session, "cwd": cwd, "mcpServers": []});
    second.call("session/load", load).await.unwrap();
    second.saw("the replayed history", |seen| seen.len() >= 2).await;
    let replayed = second.close().await;
    assert_eq!(replayed[0], "user: the secret is 42");
    assert!(replayed[1].starts_with(
        "agent: mock-agent: remembered 0 earlier messages; you said: the secret is 42"
    ));
    assert_eq!(replayed.len(), 2, "history is replayed once: {replayed:?}");
}
