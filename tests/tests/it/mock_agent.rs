//! mock-agent as a real process, driven by our own peer: every scripted behaviour and
//! fault that later tests rely on.

use std::time::Duration;

use protocol::frame::InvalidReason;
use protocol::{ErrorCode, PeerError, RpcError};
use serde_json::{Value, json};
use tether_tests::client::{chunk_texts, no_requests};
use tether_tests::{AgentProcess, StopStage, workspace_bin};

fn mock(args: &[&str]) -> AgentProcess {
    AgentProcess::spawn(workspace_bin("mock-agent"), args).expect("mock-agent starts")
}

fn rpc_code(result: Result<impl std::fmt::Debug, PeerError>) -> ErrorCode {
    match result {
        Err(PeerError::Rpc(error)) => error.code,
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

#[tokio::test]
async fn streams_chunks_in_order_and_remembers_the_conversation() {
    let state = tempfile::tempdir().unwrap();
    let mut agent = mock(&["--state-dir", state.path().to_str().unwrap()]);
    let init = agent.initialize().await.unwrap();
    assert_eq!(init["protocolVersion"], 1);
    assert_eq!(init["agentCapabilities"]["loadSession"], true);
    let session = agent.new_session(state.path()).await.unwrap();

    let turn = agent.prompt(&session, "/stream 5\nhello there", no_requests).await;
    assert_eq!(turn.stop_reason(), "end_turn");
    let chunks = turn.chunks();
    assert_eq!(chunks.len(), 5);
    assert!(
        chunks[0]
            .starts_with("mock-agent: remembered 0 earlier messages; you said: hello there [1/5]")
    );
    assert_eq!(&chunks[1..], [" [2/5]", " [3/5]", " [4/5]", " [5/5]"]);

    let turn = agent.prompt(&session, "second\n/recall", no_requests).await;
    assert!(
        turn.reply().starts_with("mock-agent: remembered 2 earlier messages; you said: second; earlier user messages: [/stream 5\nhello there]"),
        "{}",
        turn.reply()
    );
}

#[tokio::test]
async fn tool_calls_permission_and_fs_requests() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = mock(&[]);
    agent.initialize().await.unwrap();
    let session = agent.new_session(dir.path()).await.unwrap();

    let turn = agent.prompt(&session, "/tool", no_requests).await;
    assert_eq!(
        turn.kinds(),
        ["tool_call", "tool_call_update", "tool_call_update", "agent_message_chunk"]
    );
    assert_eq!(turn.updates[2]["update"]["status"], "completed");

    // Allowed: the tool runs after the permission request.
    let turn = agent
        .prompt(&session, "/permission", |request| {
            assert_eq!(request.method, "session/request_permission");
            Ok(json!({"outcome": {"outcome": "selected", "optionId": "allow"}}))
        })
        .await;
    assert_eq!(turn.requests.len(), 1);
    assert!(turn.reply().contains("the tool ran"), "{}", turn.reply());
    assert_eq!(turn.updates[2]["update"]["status"], "completed");

    // Rejected: the tool fails and the reply says so.
    let turn = agent
        .prompt(&session, "/permission", |_| {
            Ok(json!({"outcome": {"outcome": "selected", "optionId": "reject"}}))
        })
        .await;
    assert_eq!(turn.updates[1]["update"]["status"], "failed");
    assert!(turn.reply().contains("the tool was not allowed"));

    // Cancelled permission: the turn ends as cancelled.
    let turn = agent
        .prompt(&session, "/permission", |_| Ok(json!({"outcome": {"outcome": "cancelled"}})))
        .await;
    assert_eq!(turn.stop_reason(), "cancelled");

    // fs requests go to the client, which answers (or refuses).
    let turn = agent
        .prompt(&session, "/read /work/a.txt\n/write /work/b.txt new text", |request| match request
            .method
            .as_str()
        {
            "fs/read_text_file" => Ok(json!({"content": "file body"})),
            "fs/write_text_file" => {
                Err(RpcError::new(ErrorCode::InvalidParams, "outside the workspace"))
            }
            other => panic!("unexpected {other}"),
        })
        .await;
    assert_eq!(turn.requests[0].params.as_ref().unwrap()["path"], "/work/a.txt");
    assert_eq!(turn.requests[1].params.as_ref().unwrap()["content"], "new text");
    assert!(turn.reply().contains("read /work/a.txt: file body"), "{}", turn.reply());
    assert!(
        turn.reply().contains("write /work/b.txt failed: outside the workspace"),
        "{}",
        turn.reply()
    );
}

#[tokio::test]
async fn a_slow_turn_honours_cancel() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = mock(&[]);
    agent.initialize().await.unwrap();
    let session = agent.new_session(dir.path()).await.unwrap();
    let peer = agent.peer().clone();
    let pending = peer
        .send_request_with_id(peer.next_id(), "session/prompt", Some(json!({"sessionId": session, "prompt": [{"type": "text", "text": "/sleep 600000"}]})))
        .unwrap();
    // The agent registers a turn before reading its next line, so this cancel always lands.
    peer.notify("session/cancel", Some(json!({"sessionId": session}))).unwrap();
    let turn = agent.drive(pending.response(), no_requests).await;
    assert_eq!(turn.stop_reason(), "cancelled");
    // The session is usable again.
    let turn = agent.prompt(&session, "after cancel", no_requests).await;
    assert_eq!(turn.stop_reason(), "end_turn");
}

#[tokio::test]
async fn load_in_a_new_process_replays_history() {
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().to_str().unwrap();
    let session = {
        let mut first = mock(&["--state-dir", state_dir]);
        first.initialize().await.unwrap();
        let session = first.new_session(state.path()).await.unwrap();
        first.prompt(&session, "remember the word kumquat", no_requests).await;
        assert!(
            matches!(first.stop(Duration::from_secs(10)).await, StopStage::ExitedOnEof(status) if status.success())
        );
        session
    };
    let mut second = mock(&["--state-dir", state_dir]);
    second.initialize().await.unwrap();
    let (replayed, result) = second.restore_session("session/load", &session, state.path()).await;
    // A loaded session starts again with the default settings, and says so.
    let result = result.unwrap();
    assert_eq!(result["modes"]["currentModeId"], "ask", "{result}");
    assert_eq!(result["configOptions"][0]["currentValue"], "mock-small", "{result}");
    assert_eq!(chunk_texts(&replayed, "user_message_chunk"), ["remember the word kumquat"]);
    assert_eq!(chunk_texts(&replayed, "agent_message_chunk").len(), 1);
    let turn = second.prompt(&session, "what was the word?\n/recall", no_requests).await;
    assert!(turn.reply().contains("remembered 2 earlier messages"), "{}", turn.reply());
    assert!(turn.reply().contains("kumquat"));
    // Unknown sessions are -32002.
    let (_, result) = second.restore_session("session/load", "mock-nope", state.path()).await;
    assert_eq!(rpc_code(result), ErrorCode::ResourceNotFound);
}

#[tokio::test]
async fn resume_capability_and_resume_flag_restore_without_replay() {
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().to_str().unwrap();
    let session = {
        let mut first = mock(&["--state-dir", state_dir]);
        first.initialize().await.unwrap();
        let session = first.new_session(state.path()).await.unwrap();
        first.prompt(&session, "one", no_requests).await;
        session
    };
    // session/resume: advertised only with the flag; restores silently.
    let mut plain = mock(&["--state-dir", state_dir]);
    let init = plain.initialize().await.unwrap();
    assert_eq!(init["agentCapabilities"]["sessionCapabilities"].get("resume"), None);
    let (_, result) = plain.restore_session("session/resume", &session, state.path()).await;
    assert_eq!(rpc_code(result), ErrorCode::MethodNotFound);

    let mut resumable = mock(&["--state-dir", state_dir, "--resume-capability"]);
    let init = resumable.initialize().await.unwrap();
    assert_eq!(init["agentCapabilities"]["sessionCapabilities"]["resume"], json!({}));
    let (replayed, result) =
        resumable.restore_session("session/resume", &session, state.path()).await;
    assert_eq!(result.unwrap()["configOptions"][0]["id"], "model");
    assert_eq!(replayed, Vec::<Value>::new(), "resume does not replay");
    let turn = resumable.prompt(&session, "two", no_requests).await;
    assert!(turn.reply().contains("remembered 2 earlier messages"), "{}", turn.reply());

    // --resume ID: the first session/new continues the stored session.
    let mut flagged = mock(&["--state-dir", state_dir, "--resume", &session]);
    flagged.initialize().await.unwrap();
    assert_eq!(flagged.new_session(state.path()).await.unwrap(), session);
    let turn = flagged.prompt(&session, "three", no_requests).await;
    assert!(turn.reply().contains("remembered 4 earlier messages"), "{}", turn.reply());
    // A second session/new is a fresh session.
    assert_ne!(flagged.new_session(state.path()).await.unwrap(), session);
}

#[tokio::test]
async fn capabilities_and_auth_are_configurable() {
    let dir = tempfile::tempdir().unwrap();
    let agent = mock(&["--no-load-session", "--auth-required"]);
    let init = agent.initialize().await.unwrap();
    assert_eq!(init["agentCapabilities"]["loadSession"], false);
    assert_eq!(init["authMethods"][0]["id"], "mock-login");
    assert_eq!(rpc_code(agent.new_session(dir.path()).await), ErrorCode::AuthRequired);
    let load = agent
        .peer()
        .request("session/load", Some(json!({"sessionId": "x", "cwd": "/", "mcpServers": []})))
        .await;
    assert_eq!(rpc_code(load), ErrorCode::MethodNotFound);
    agent.peer().request("authenticate", Some(json!({"methodId": "mock-login"}))).await.unwrap();
    assert!(agent.new_session(dir.path()).await.unwrap().starts_with("mock-"));
}

#[tokio::test]
async fn rejected_loads_answer_resource_not_found() {
    let state = tempfile::tempdir().unwrap();
    let mut agent = mock(&[
        "--state-dir",
        state.path().to_str().unwrap(),
        "--reject-load",
        "--resume-capability",
    ]);
    agent.initialize().await.unwrap();
    let session = agent.new_session(state.path()).await.unwrap();
    let (_, load) = agent.restore_session("session/load", &session, state.path()).await;
    assert_eq!(rpc_code(load), ErrorCode::ResourceNotFound);
    let (_, resume) = agent.restore_session("session/resume", &session, state.path()).await;
    assert_eq!(rpc_code(resume), ErrorCode::ResourceNotFound);
}

#[tokio::test]
async fn crash_before_and_during_a_turn() {
    let dir = tempfile::tempdir().unwrap();
    let mut before = mock(&["--crash-on", "session/prompt", "--exit-code", "5"]);
    before.initialize().await.unwrap();
    let session = before.new_session(dir.path()).await.unwrap();
    let turn = before.prompt(&session, "hi", no_requests).await;
    assert!(matches!(turn.result, Err(PeerError::Closed)), "{:?}", turn.result);
    assert!(turn.updates.is_empty());
    assert_eq!(before.wait().await.code(), Some(5));
    assert!(
        before.stderr_text().contains("crashing on session/prompt"),
        "{}",
        before.stderr_text()
    );

    let mut during = mock(&[]);
    during.initialize().await.unwrap();
    let session = during.new_session(dir.path()).await.unwrap();
    let turn = during.prompt(&session, "/crash 7", no_requests).await;
    assert!(matches!(turn.result, Err(PeerError::Closed)));
    assert_eq!(turn.chunks(), ["mock-agent: about to crash"]);
    assert_eq!(during.wait().await.code(), Some(7));
    assert!(during.stderr_text().contains("crashing mid-turn"), "{}", during.stderr_text());
}

#[tokio::test]
async fn hang_on_initialize_leaves_it_unanswered() {
    let dir = tempfile::tempdir().unwrap();
    let agent = mock(&["--hang-on", "initialize"]);
    let peer = agent.peer().clone();
    let initialize = peer
        .send_request_with_id(
            peer.next_id(),
            "initialize",
            Some(json!({"protocolVersion": 1, "clientCapabilities": {}})),
        )
        .unwrap();
    // The agent handles lines in order: once session/new is answered, initialize was read
    // and deliberately left unanswered.
    agent.new_session(dir.path()).await.unwrap();
    let mut initialize = std::pin::pin!(initialize.response());
    assert!(futures_util::poll!(&mut initialize).is_pending());
}

#[tokio::test]
async fn garbage_on_stdout_is_reported_and_the_session_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = mock(&["--garbage-at-start"]);
    agent.initialize().await.unwrap();
    let mut reasons = Vec::new();
    while let Ok(protocol::Inbound::Invalid(invalid)) = agent.inbound.try_recv() {
        reasons.push(invalid.reason);
    }
    assert!(
        matches!(reasons.as_slice(), [InvalidReason::NotJson(_), InvalidReason::NotUtf8]),
        "{reasons:?}"
    );
    let session = agent.new_session(dir.path()).await.unwrap();
    let turn = agent.prompt(&session, "/garbage\nstill here", no_requests).await;
    assert_eq!(turn.invalid.len(), 2);
    assert_eq!(turn.stop_reason(), "end_turn");
    assert!(turn.reply().contains("still here"));
}

#[tokio::test]
async fn stop_escalates_for_agents_that_ignore_eof_and_sigterm() {
    let mut polite = mock(&[]);
    polite.initialize().await.unwrap();
    assert!(matches!(polite.stop(Duration::from_secs(10)).await, StopStage::ExitedOnEof(_)));

    let mut stubborn = mock(&["--ignore-eof"]);
    stubborn.initialize().await.unwrap();
    let stage = stubborn.stop(Duration::from_millis(300)).await;
    assert!(matches!(stage, StopStage::Terminated(_)), "{stage:?}");

    let mut deaf = mock(&["--ignore-eof", "--ignore-sigterm"]);
    deaf.initialize().await.unwrap();
    let stage = deaf.stop(Duration::from_millis(300)).await;
    assert!(matches!(stage, StopStage::Killed(_)), "{stage:?}");
    assert!(deaf.stderr_text().contains("ignoring SIGTERM"), "{}", deaf.stderr_text());
}

/// For workflow tests: `/say` makes the reply exactly a chosen text (a step's
/// output), and `--turn-log` counts the prompts the agent answered from its own side.
#[tokio::test]
async fn say_chooses_the_reply_and_the_turn_log_counts_prompts() {
    let state = tempfile::tempdir().unwrap();
    let log = state.path().join("turns.jsonl");
    let mut agent =
        mock(&["--state-dir", state.path().to_str().unwrap(), "--turn-log", log.to_str().unwrap()]);
    agent.initialize().await.unwrap();
    let session = agent.new_session(state.path()).await.unwrap();
    let turn = agent
        .prompt(&session, "plan it\n/say [\"parse\", \"test\"]\\nscore: 0.9", no_requests)
        .await;
    assert_eq!(turn.reply(), "[\"parse\", \"test\"]\nscore: 0.9");
    agent.prompt(&session, "again", no_requests).await;
    let lines: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(
        lines,
        [
            json!({"session": session, "prompt": "plan it"}),
            json!({"session": session, "prompt": "again"})
        ]
    );
}

#[tokio::test]
async fn settings_change_through_acp_and_are_refused_when_the_marker_is_there() {
    let state = tempfile::tempdir().unwrap();
    let mut agent = mock(&["--state-dir", state.path().to_str().unwrap()]);
    agent.initialize().await.unwrap();
    let session = agent.new_session(state.path()).await.unwrap();
    let peer = agent.peer().clone();
    let set = |params: Value, method: &'static str| {
        let peer = peer.clone();
        async move { peer.request(method, Some(params)).await }
    };
    let answer = set(
        json!({"sessionId": session, "configId": "model", "value": "mock-large"}),
        "session/set_config_option",
    )
    .await
    .unwrap();
    assert_eq!(answer["configOptions"][0]["currentValue"], "mock-large", "{answer}");
    set(json!({"sessionId": session, "modeId": "code"}), "session/set_mode").await.unwrap();
    let turn = agent.prompt(&session, "/settings", no_requests).await;
    assert_eq!(turn.reply(), "model=mock-large mode=code");
    let wrong = set(
        json!({"sessionId": session, "configId": "model", "value": "gpt-9"}),
        "session/set_config_option",
    )
    .await;
    assert_eq!(rpc_code(wrong), ErrorCode::InvalidParams);
    std::fs::write(state.path().join("refuse-settings"), "").unwrap();
    let refused = set(json!({"sessionId": session, "modeId": "ask"}), "session/set_mode").await;
    assert_eq!(rpc_code(refused), ErrorCode::InvalidParams);
}
