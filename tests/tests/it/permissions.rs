//! Answering an agent's questions: `allow` is allow once, whatever order the agent offers
//! its options in, and "always" is only ever said by name.

use protocol::api::{ApiClient, EventKind};
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
