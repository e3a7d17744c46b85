//! Agents in a sandbox, as far as this build confines them: a profile's `[sandbox]` is read
//! and checked, and an agent whose profile asks for confinement the runtime cannot give
//! is never run unconfined — `agents` says why it is unavailable, and a session of it is
//! refused with that reason. (The confinement itself — namespaces, the egress proxy in
//! front of the agent — comes next; the proxy's own tests are in `supervisor::sandbox`.)

use protocol::api::ApiClient;
use protocol::errors::ErrorKind;
use tether_tests::daemon::{Daemon, ok};

#[tokio::test]
async fn a_profile_asking_for_confinement_is_never_run_unconfined() {
    let confined = "id = \"confined\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n\
        [sandbox]\nfilesystem = \"workspace\"\nnetwork = \"allowlist\"\nallow = [\"127.0.0.1:9\"]\n";
    let open = "id = \"open\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n\
        [sandbox]\nfilesystem = \"host\"\nnetwork = \"host\"\n";
    let daemon =
        Daemon::start_with_profiles(&[], &[("confined.toml", confined), ("open.toml", open)]).await;
    let api = daemon.api().await;
    let agents = ok("agents.list", api.typed().agents_list()).await;
    let find = |id: &str| agents.iter().find(|a| a.id == id).cloned().expect(id);
    let confined = find("confined");
    assert!(!confined.available, "{confined:?}");
    let said = confined.reasons.join("; ");
    assert!(
        said.contains("filesystem = \"workspace\" and network = \"allowlist\"")
            && said.contains("never run unconfined"),
        "{said}"
    );
    assert!(find("open").available, "host and host is today's behaviour");
    let refused = api.create_session("confined", &daemon.workspace("w")).await.unwrap_err();
    assert_eq!(refused.kind, ErrorKind::AgentUnavailable, "{refused:?}");
    assert!(refused.message.contains("never run unconfined"), "{refused:?}");
    // The same profile, unconfined, runs as before.
    let session = api.ready_session("open", &daemon.workspace("open")).await;
    assert!(api.ask(&session, "hello").await.contains("you said: hello"));
}
