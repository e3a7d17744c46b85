//! Issue 11: real agents, installed from npm by `scripts/setup.sh` into `.tools/npm`,
//! driven through the supervisor's API against the scripted model server on 127.0.0.1 —
//! full turns offline, and the check that a native resume really restored the context:
//! the model's next request carries the earlier conversation.

use std::path::PathBuf;

use serde_json::json;
use tether_tests::daemon::{Daemon, kill_sidecar};
use tether_tests::model_server::{ModelServer, Reply, conversation_text};

/// The project-local install of a real agent's binary, if `scripts/setup.sh` made one.
/// CI (`REQUIRE_DOCKER=1`, which runs setup) must have it; elsewhere the test says it
/// skipped.
fn installed(bin: &str) -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = root.join(".tools/npm/node_modules/.bin").join(bin);
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var_os("REQUIRE_DOCKER").is_none(),
        "{bin} is not installed in .tools/npm: scripts/setup.sh installs it"
    );
    println!("SKIPPED: {bin} is not installed (scripts/setup.sh installs it)");
    None
}

/// A daemon with a `claude` profile running claude-agent-acp against `server`.
async fn claude_daemon(server: &ModelServer) -> Option<Daemon> {
    let bin = installed("claude-agent-acp")?;
    let profile = format!(
        r#"id = "claude"
command = ["{bin}"]
protocol = "acp"

[env]
ANTHROPIC_BASE_URL = "{url}"
ANTHROPIC_API_KEY = "sk-ant-test"
CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = "1"
DISABLE_AUTOUPDATER = "1"
IS_SANDBOX = "1"

[session]
native_resume = true
agent_state_dirs = [".claude"]

[process]
init_timeout_ms = 60000
"#,
        bin = bin.display(),
        url = server.url,
    );
    Some(Daemon::start_with_profiles(&[], &[("claude.toml", &profile)]).await)
}

/// A full turn of claude-agent-acp against the scripted model: the model's text streams
/// back as the reply, and the model saw the prompt.
#[tokio::test]
async fn r11_claude_completes_a_turn_against_the_scripted_model() {
    let server = ModelServer::start().await;
    let Some(daemon) = claude_daemon(&server).await else { return };
    let api = daemon.api().await;
    let session = api.ready_session("claude", &daemon.workspace("c")).await;
    server.script([Reply::Text("Hello from the scripted model, streamed in pieces.".into())]);
    let reply = api.ask(&session, "say hello").await;
    assert!(reply.contains("Hello from the scripted model, streamed in pieces."), "{reply}");
    let asked = server.main_requests();
    let last = asked.last().expect("the model was asked");
    assert!(conversation_text(last).contains("say hello"), "{last}");
}

/// Kill the agent, resume: claude-agent-acp restores through `session/resume`, and the
/// model's next request contains the earlier conversation — the context really is back.
#[tokio::test]
async fn r11_claude_resumes_natively_with_its_context() {
    let server = ModelServer::start().await;
    let Some(daemon) = claude_daemon(&server).await else { return };
    let api = daemon.api().await;
    let session = api.ready_session("claude", &daemon.workspace("r")).await;
    server.script([Reply::Text("Noted: the code word is papaya.".into())]);
    api.ask(&session, "remember the code word papaya").await;
    kill_sidecar(&daemon, &api, &session).await;
    let resumed = api.call("task.session.resume", json!({"session_id": &session})).await.unwrap();
    assert_eq!(resumed["outcome"], "native_resume", "{resumed}");
    server.script([Reply::Text("The code word was papaya.".into())]);
    let reply = api.ask(&session, "what was the code word?").await;
    assert!(reply.contains("papaya"), "{reply}");
    let last = server.main_requests().pop().expect("the model was asked");
    let seen = conversation_text(&last);
    assert!(
        seen.contains("remember the code word papaya") && seen.contains("Noted: the code word"),
        "the earlier turn is in the model's context: {seen}"
    );
}
