//! Agents in a sandbox, as far as this build confines them: a profile's `[sandbox]` is read
//! and checked; `network = "none"` on the standalone runtime gives the agent a network
//! namespace of its own; and an agent whose profile asks for confinement the runtime
//! cannot give is never run unconfined — `agents` says why it is unavailable, and a
//! session of it is refused with that reason. (The rest of the confinement — the file
//! system, the egress proxy in front of the agent — comes next; the proxy's own tests are
//! in `supervisor::sandbox`.)

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

/// `network = "none"`: the agent's own connection to a server on this machine fails,
/// while the same agent unconfined reaches it; the agent works otherwise (its turns, its
/// reads of the file system). Needs bubblewrap (`scripts/setup.sh` installs it).
#[tokio::test]
async fn an_agent_without_network_reaches_nothing_and_works_otherwise() {
    if which_bwrap().is_none() {
        assert!(std::env::var_os("REQUIRE_DOCKER").is_none(), "CI must have bubblewrap");
        println!("SKIPPED: bubblewrap is not installed (scripts/setup.sh installs it)");
        return;
    }
    let offline = "id = \"offline\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n\
        [sandbox]\nnetwork = \"none\"\n";
    let daemon = Daemon::start_with_profiles(&[], &[("offline.toml", offline)]).await;
    let api = daemon.api().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let agents = ok("agents.list", api.typed().agents_list()).await;
    let offline = agents.iter().find(|a| a.id == "offline").expect("offline");
    assert!(offline.available, "{offline:?}");
    let session = api.ready_session("offline", &daemon.workspace("offline")).await;
    // Its own loopback, where nothing listens: the port this test listens on is refused.
    let reply = api.ask(&session, &format!("/connect 127.0.0.1:{port}\nreach out")).await;
    assert!(reply.contains(&format!("connect 127.0.0.1:{port} failed")), "{reply}");
    let secret = daemon.workspace("offline").join("notes.txt");
    std::fs::write(&secret, "kept").unwrap();
    let reply = api.ask(&session, &format!("/peek {}\nread", secret.display())).await;
    assert!(reply.contains("4 bytes"), "the file system is as it was: {reply}");
    let open = api.ready_session("mock", &daemon.workspace("open")).await;
    let reply = api.ask(&open, &format!("/connect 127.0.0.1:{port}\nreach out")).await;
    assert!(reply.contains(&format!("connect 127.0.0.1:{port}: connected")), "{reply}");
}

fn which_bwrap() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join("bwrap")).find(|bwrap| bwrap.is_file())
}
