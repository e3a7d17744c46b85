//! An independent client drives mock-agent: the official `agent-client-protocol` crate in
//! the Client role runs initialize → session/new → prompt, then a new process loads the
//! session and the client sees the replayed history.

use std::sync::Arc;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    ContentBlock, InitializeRequest, LoadSessionRequest, NewSessionRequest, PromptRequest,
    SessionNotification, SessionUpdate, StopReason, TextContent,
};
use agent_client_protocol::{AcpAgent, Agent};
use tether_tests::{within, workspace_bin};
use tokio::sync::watch;

/// The text of every message chunk seen, tagged `user:` or `agent:`.
type Seen = watch::Sender<Vec<String>>;

async fn connect_and(
    state_dir: &str,
    seen: Arc<Seen>,
    body: impl AsyncFnOnce(ConnectionTo<Agent>) -> Result<(), agent_client_protocol::Error>,
) -> Result<(), agent_client_protocol::Error> {
    let agent = AcpAgent::from_args([
        workspace_bin("mock-agent").to_str().unwrap(),
        "--state-dir",
        state_dir,
    ])?;
    agent_client_protocol::Client
        .v1()
        .name("official-client-test")
        .on_receive_notification(
            async move |notification: SessionNotification, _cx| {
                let text = match notification.update {
                    SessionUpdate::UserMessageChunk(chunk) => chunk_text("user", chunk.content),
                    SessionUpdate::AgentMessageChunk(chunk) => chunk_text("agent", chunk.content),
                    _ => None,
                };
                if let Some(text) = text {
                    seen.send_modify(|all| all.push(text));
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_with(agent, body)
        .await
}

fn chunk_text(role: &str, content: ContentBlock) -> Option<String> {
    match content {
        ContentBlock::Text(text) => Some(format!("{role}: {}", text.text)),
        _ => None,
    }
}

#[tokio::test]
async fn official_client_runs_a_session_and_loads_it_in_a_new_process() {
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().to_str().unwrap().to_owned();
    let cwd = state.path().to_owned();

    let first_seen = Arc::new(watch::channel(Vec::new()).0);
    let (session_tx, session_rx) = tokio::sync::oneshot::channel();
    let first_cwd = cwd.clone();
    within(
        "the first official-client connection",
        connect_and(&state_dir, Arc::clone(&first_seen), async move |cx: ConnectionTo<Agent>| {
            let init =
                cx.send_request(InitializeRequest::new(ProtocolVersion::V1)).block_task().await?;
            assert!(init.agent_capabilities.load_session);
            let session = cx.send_request(NewSessionRequest::new(first_cwd)).block_task().await?;
            let response = cx
                .send_request(PromptRequest::new(
                    session.session_id.clone(),
                    vec![ContentBlock::Text(TextContent::new("the secret is 42"))],
                ))
                .block_task()
                .await?;
            assert_eq!(response.stop_reason, StopReason::EndTurn);
            let _ = session_tx.send(session.session_id);
            Ok(())
        }),
    )
    .await
    .expect("the first connection runs to completion");
    let session_id = session_rx.await.expect("the session id was sent");
    let mut first_rx = first_seen.subscribe();
    within("the reply chunk", first_rx.wait_for(|seen| !seen.is_empty())).await.unwrap();
    assert!(first_seen.borrow()[0].starts_with("agent: mock-agent: remembered 0 earlier messages"));

    let second_seen = Arc::new(watch::channel(Vec::new()).0);
    within(
        "the second official-client connection",
        connect_and(&state_dir, Arc::clone(&second_seen), async move |cx: ConnectionTo<Agent>| {
            cx.send_request(InitializeRequest::new(ProtocolVersion::V1)).block_task().await?;
            cx.send_request(LoadSessionRequest::new(session_id, cwd)).block_task().await?;
            Ok(())
        }),
    )
    .await
    .expect("the second connection runs to completion");
    let mut second_rx = second_seen.subscribe();
    let replayed = within("the replayed history", second_rx.wait_for(|seen| seen.len() >= 2))
        .await
        .unwrap()
        .clone();
    assert_eq!(replayed[0], "user: the secret is 42");
    assert!(replayed[1].starts_with(
        "agent: mock-agent: remembered 0 earlier messages; you said: the secret is 42"
    ));
    assert_eq!(replayed.len(), 2, "history is replayed once: {replayed:?}");
}
