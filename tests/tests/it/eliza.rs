//! Our peer drives `elizacp`, an ACP agent nobody here wrote: initialize → session/new →
//! a prompt → `end_turn`, then a stop that needs the SIGTERM step because elizacp ignores
//! stdin EOF. Everything our side sent is also checked against the ACP schema.

use std::time::Duration;

use tether_tests::client::no_requests;
use tether_tests::schema::AcpSchema;
use tether_tests::{AgentProcess, Direction, StopStage, find_program};

#[tokio::test]
async fn our_peer_drives_elizacp_and_stops_it() {
    let elizacp = find_program("elizacp").expect(
        "elizacp is not installed: scripts/test.sh installs it (cargo install --locked elizacp)",
    );
    let dir = tempfile::tempdir().unwrap();
    let mut eliza = AgentProcess::spawn(elizacp, &["--deterministic", "acp"]).unwrap();
    let init = eliza.initialize().await.unwrap();
    assert_eq!(init["protocolVersion"], 1);
    let session = eliza.new_session(dir.path()).await.unwrap();
    let turn = eliza.prompt(&session, "Hello, I am feeling sad today.", no_requests).await;
    assert_eq!(turn.stop_reason(), "end_turn");
    assert!(!turn.reply().trim().is_empty(), "eliza answered nothing: {:?}", turn.updates);
    let second = eliza.prompt(&session, "Because my code does not compile.", no_requests).await;
    assert_eq!(second.stop_reason(), "end_turn");

    let stage = eliza.stop(Duration::from_millis(500)).await;
    assert!(
        matches!(stage, StopStage::Terminated(_)),
        "elizacp ignores EOF, so SIGTERM must end it: {stage:?}"
    );

    let mut schema = AcpSchema::load();
    let ours = eliza.transcript.lines(Direction::ToAgent);
    // Only our side is ours to answer for; check it message by message (the agent's
    // responses are needed to pair ids, so the check is on requests and notifications).
    let checked = schema
        .check_transcript(&ours, &[])
        .unwrap_or_else(|errors| panic!("{}", errors.join("\n")));
    assert_eq!(checked.len(), ours.len());
}
