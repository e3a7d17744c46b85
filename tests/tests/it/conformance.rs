//! Every message exchanged with mock-agent in a scripted run — ours and the agent's — is
//! valid against the ACP v1 JSON schema, each against its own definition.

use std::collections::BTreeSet;
use std::time::Duration;

use protocol::{ErrorCode, RpcError};
use serde_json::json;
use tether_tests::client::no_requests;
use tether_tests::schema::AcpSchema;
use tether_tests::{AgentProcess, Direction, workspace_bin};

fn validate(schema: &mut AcpSchema, agent: &AgentProcess, seen: &mut BTreeSet<String>) {
    let to_agent = agent.transcript.lines(Direction::ToAgent);
    let from_agent = agent.transcript.lines(Direction::FromAgent);
    assert!(!to_agent.is_empty() && !from_agent.is_empty(), "nothing was recorded");
    match schema.check_transcript(&to_agent, &from_agent) {
        Ok(checked) => seen.extend(checked.into_iter().map(|c| c.definition)),
        Err(errors) => panic!("schema violations:\n{}", errors.join("\n")),
    }
}

#[tokio::test]
async fn a_scripted_run_validates_message_by_message() {
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().to_str().unwrap();
    let file = state.path().join("notes.txt");
    let mut schema = AcpSchema::load();
    let mut seen = BTreeSet::new();

    let mut agent = AgentProcess::spawn(
        workspace_bin("mock-agent"),
        &["--state-dir", state_dir, "--auth-required", "--resume-capability"],
    )
    .unwrap();
    agent.initialize().await.unwrap();
    assert!(agent.new_session(state.path()).await.is_err(), "auth is required first");
    agent.peer().request("authenticate", Some(json!({"methodId": "mock-login"}))).await.unwrap();
    let session = agent.new_session(state.path()).await.unwrap();
    let script =
        format!("/stream 3\n/permission\n/read {0}\n/write {0} new\nhello", file.display());
    let turn = agent
        .prompt(&session, &script, |request| match request.method.as_str() {
            "session/request_permission" => {
                Ok(json!({"outcome": {"outcome": "selected", "optionId": "allow"}}))
            }
            "fs/read_text_file" => Ok(json!({"content": "old"})),
            "fs/write_text_file" => Ok(json!({})),
            other => panic!("unexpected {other}"),
        })
        .await;
    assert_eq!(turn.stop_reason(), "end_turn");
    let turn = agent
        .prompt(&session, "/permission", |_| Ok(json!({"outcome": {"outcome": "cancelled"}})))
        .await;
    assert_eq!(turn.stop_reason(), "cancelled");
    let turn = agent
        .prompt(&session, "/read /outside", |_| {
            Err(RpcError::new(ErrorCode::ResourceNotFound, "no such file"))
        })
        .await;
    assert_eq!(turn.stop_reason(), "end_turn");
    let peer = agent.peer().clone();
    let slow = peer
        .send_request_with_id(
            peer.next_id(),
            "session/prompt",
            Some(json!({"sessionId": session, "prompt": [{"type": "text", "text": "/sleep 600000"}]})),
        )
        .unwrap();
    peer.notify("session/cancel", Some(json!({"sessionId": session}))).unwrap();
    assert_eq!(agent.drive(slow.response(), no_requests).await.stop_reason(), "cancelled");
    drop(peer);
    agent.stop(Duration::from_secs(10)).await;
    validate(&mut schema, &agent, &mut seen);

    let mut second = AgentProcess::spawn(
        workspace_bin("mock-agent"),
        &["--state-dir", state_dir, "--resume-capability"],
    )
    .unwrap();
    second.initialize().await.unwrap();
    let (replayed, load) = second.restore_session("session/load", &session, state.path()).await;
    load.unwrap();
    assert!(!replayed.is_empty());
    second.restore_session("session/resume", &session, state.path()).await.1.unwrap();
    second.prompt(&session, "again", no_requests).await;
    second.stop(Duration::from_secs(10)).await;
    validate(&mut schema, &second, &mut seen);

    let expected = [
        "InitializeRequest",
        "InitializeResponse",
        "AuthenticateRequest",
        "AuthenticateResponse",
        "NewSessionRequest",
        "NewSessionResponse",
        "LoadSessionRequest",
        "LoadSessionResponse",
        "ResumeSessionRequest",
        "ResumeSessionResponse",
        "PromptRequest",
        "PromptResponse",
        "CancelNotification",
        "SessionNotification",
        "RequestPermissionRequest",
        "RequestPermissionResponse",
        "ReadTextFileRequest",
        "ReadTextFileResponse",
        "WriteTextFileRequest",
        "WriteTextFileResponse",
        "Error",
    ];
    let missing: Vec<_> = expected.iter().filter(|name| !seen.contains(**name)).collect();
    assert!(missing.is_empty(), "the run never exercised {missing:?}; checked {seen:?}");
}

#[test]
fn the_validator_rejects_what_the_schema_forbids() {
    let mut schema = AcpSchema::load();
    assert!(schema.validate("PromptResponse", &json!({"stopReason": "end_turn"})).is_ok());
    assert!(schema.validate("PromptResponse", &json!({"stopReason": "bored"})).is_err());
    assert!(schema.validate("SessionNotification", &json!({"update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}}})).is_err());
    // A response recorded for a method it does not belong to is caught too.
    let to_agent = vec![
        br#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/","mcpServers":[]}}"#
            .to_vec(),
    ];
    let from_agent =
        vec![br#"{"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn"}}"#.to_vec()];
    assert!(schema.check_transcript(&to_agent, &from_agent).is_err());
}
