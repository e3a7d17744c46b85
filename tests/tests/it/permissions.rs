//! Answering an agent's questions: `allow` is allow once, whatever order the agent offers
//! its options in, and "always" is only ever said by name.

use protocol::api::{ApiClient, EntryType, EventKind};
use tether_tests::daemon::{Daemon, until, until_permission_request};

#[tokio::test]
async fn the_clis_allow_is_allow_once_even_when_the_agent_offers_always_first() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("p")).await;
    for (answer, chosen) in
        [("allow", "allow"), ("allow-always", "allow-always"), ("deny", "reject")]
    {
        let mut events = api.subscribe_at_end(&session).await;
        api.prompt(&session, "/permission-always-first\nask").await.unwrap();
        let (_, request_id, params) = until_permission_request(&mut events).await;
        assert_eq!(params["options"][0]["kind"], "allow_always", "always comes first: {params}");
        let (code, out, err) =
            daemon.cli(&["permission", "respond", &session, &request_id, answer]).await;
        assert_eq!(code, 0, "{err}");
        assert!(out.contains(&format!("answered: {chosen}")), "{answer}: {out}");
        // The answer's event and the turn's end, in whichever order they come.
        let (mut resolved, mut ended) = (None, false);
        until(&mut events, |event| {
            match &event.kind {
                EventKind::PermissionResolved { outcome, .. } => resolved = Some(outcome.clone()),
                EventKind::TurnEnded { .. } => ended = true,
                _ => {}
            }
            ended && resolved.is_some()
        })
        .await;
        let resolved = resolved.expect("UNWRAP: until returned once it was seen");
        assert_eq!(resolved["optionId"], chosen, "{answer}: {resolved}");
    }
    api.typed().session_stop(session).await.unwrap();
}

/// A tool announced only inside a permission request (no `tool_call` update before it)
/// left no tool-call entry in the history: only its result.
#[tokio::test]
async fn a_tool_announced_only_in_its_question_is_recorded_as_a_tool_call() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("p")).await;
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, "/permission-only\nask").await.unwrap();
    let (seen, request_id, _) = until_permission_request(&mut events).await;
    let announced = seen.iter().any(|event| matches!(event.kind, EventKind::ToolCall { .. }));
    assert!(!announced, "the agent announced it only in the question");
    let (code, _, err) =
        daemon.cli(&["permission", "respond", &session, &request_id, "allow"]).await;
    assert_eq!(code, 0, "{err}");
    until(&mut events, |event| matches!(event.kind, EventKind::TurnEnded { .. })).await;
    let history = api.history(&session).await;
    let kinds: Vec<EntryType> = history.iter().map(|entry| entry.kind).collect();
    let call = history.iter().position(|entry| entry.kind == EntryType::ToolCall);
    let result = history.iter().position(|entry| entry.kind == EntryType::ToolResult);
    assert!(call.is_some() && call < result, "a call, then its result: {kinds:?}");
    assert_eq!(history[call.unwrap()].tool_name.as_deref(), Some("mock tool: list files"));
}
