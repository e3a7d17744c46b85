//! `supervisor acp`, Tether's ACP face, driven by the official ACP client crate as any ACP
//! client drives an agent: the turn, its updates, a permission answered through the
//! daemon, and a cancel.

use protocol::api::ApiClient;
use protocol::api::{EventKind, TurnState};
use protocol::errors::ErrorKind;
use serde_json::{Value, json};
use tether_tests::daemon::{Create, Daemon, ok, refused, until};
use tether_tests::face::RawFace;
use tether_tests::sdk::{SdkClient, prompt};
use tether_tests::{within, workspace_bin};

fn tools(seen: &[String]) -> usize {
    seen.iter().filter(|line| line.starts_with("tool: ")).count()
}

#[tokio::test]
async fn an_acp_client_runs_a_turn_with_a_permission_and_a_cancel_through_the_face() {
    let daemon = Daemon::start(&[]).await;
    let workspace = daemon.workspace("face");
    let mut client = SdkClient::face(&daemon.url, &["--agent", "mock"]);
    let init = client.call("initialize", json!({"protocolVersion": 1})).await.unwrap();
    assert_eq!(init["agentInfo"]["name"], "tether", "{init}");
    let probe = json!({"name": "probe", "command": "/bin/true", "args": [], "env": []});
    let new = json!({"cwd": workspace, "mcpServers": [probe]});
    let session = client.call("session/new", new).await.unwrap();
    let session = session["sessionId"].as_str().expect("a session id").to_owned();
    let answer = client.call("session/prompt", prompt(&session, "/permission\nhello face")).await;
    assert_eq!(answer.unwrap()["stopReason"], "end_turn");
    // A slow turn, cancelled once it has begun to answer.
    let slow =
        client.start("session/prompt", prompt(&session, "/tool\n/sleep 60000\nnever said")).await;
    client.saw("the slow turn's tool call", |seen| tools(seen) == 2).await;
    client.cancel(&session).await;
    assert_eq!(slow.answer().await.unwrap()["stopReason"], "cancelled");
    let seen = client.close().await;
    assert!(seen.contains(&format!("permission: {session}")), "{seen:?}");
    assert!(seen.iter().any(|line| line.starts_with("tool: ")), "{seen:?}");
    assert!(seen.iter().any(|line| line.contains("hello face")), "{seen:?}");
    assert!(!seen.iter().any(|line| line.contains("never said")), "{seen:?}");

    // The session is Tether's: the same one over its own API, the permission answered
    // through the daemon with the client's choice, both turns ended as the client heard.
    let api = daemon.api().await;
    let mut ends_seen = 0;
    let events = until(&mut api.subscribe(&session, 0).await, |event| {
        ends_seen += usize::from(matches!(event.kind, EventKind::TurnEnded { .. }));
        ends_seen == 2
    })
    .await;
    let resolved = events
        .iter()
        .find_map(|event| match &event.kind {
            EventKind::PermissionResolved { outcome, .. } => Some(outcome.clone()),
            _ => None,
        })
        .expect("the permission was resolved");
    assert_eq!(resolved["outcome"], "selected", "{resolved}");
    // The cancelled turn said nothing after its tool call, here as to the client.
    let never_said = events.iter().any(|event| {
        matches!(&event.kind, EventKind::AgentMessageChunk { text, .. } if text.contains("never said"))
    });
    assert!(!never_said, "{events:?}");
    let ends: Vec<(TurnState, Option<String>)> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::TurnEnded { state, stop_reason, .. } => Some((*state, stop_reason.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        ends,
        [
            (TurnState::Completed, Some("end_turn".to_owned())),
            (TurnState::Completed, Some("cancelled".to_owned()))
        ]
    );
    // The client's MCP server reached the agent (mock-agent keeps their names).
    let acp_session = api.status(&session).await.acp_session_id.expect("an ACP session");
    let kept = daemon.home().join(format!(".mock-agent/{acp_session}.json"));
    let kept: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&kept).unwrap()).unwrap();
    assert_eq!(kept["mcp_servers"], serde_json::json!(["probe"]), "{kept}");
}

#[tokio::test]
async fn a_daemon_killed_mid_turn_is_invisible_to_the_acp_client() {
    // A fixed port, so the restarted daemon is where the face left it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let mut daemon = Daemon::start(&["--listen", &listen]).await;
    let workspace = daemon.workspace("face-restart");
    let mut client = SdkClient::face(&daemon.url, &["--agent", "mock"]);
    client.call("initialize", json!({"protocolVersion": 1})).await.unwrap();
    let new = client.call("session/new", json!({"cwd": workspace, "mcpServers": []})).await;
    let session = new.unwrap()["sessionId"].as_str().expect("a session id").to_owned();
    let text = "/tool\n/sleep 1500\n/stream 6\nsaid after the restart";
    let turn = client.start("session/prompt", prompt(&session, text)).await;
    client.saw("the turn's tool call", |seen| tools(seen) == 1).await;
    daemon.kill().await;
    daemon.restart().await;
    assert_eq!(turn.answer().await.unwrap()["stopReason"], "end_turn");
    // The session goes on after the restart as before it.
    let again = client.call("session/prompt", prompt(&session, "and once more")).await;
    assert_eq!(again.unwrap()["stopReason"], "end_turn");
    let seen = client.close().await;
    assert_eq!(tools(&seen), 1, "each update once: {seen:?}");
    // The streamed reply arrives whole and once: its chunks, joined, are the reply.
    let reply: String =
        seen.iter().filter_map(|line| line.strip_prefix("agent: ")).collect::<Vec<_>>().concat();
    assert_eq!(
        reply.matches("you said: said after the restart").count(),
        1,
        "the reply once, whole: {reply:?}"
    );
    assert_eq!(reply.matches("you said: and once more").count(), 1, "{reply:?}");
}

#[tokio::test]
async fn a_new_client_lists_loads_and_continues_a_session_an_earlier_one_opened() {
    let daemon = Daemon::start(&[]).await;
    let workspace = daemon.workspace("face-load");
    let mut first = SdkClient::face(&daemon.url, &["--agent", "mock"]);
    first.call("initialize", json!({"protocolVersion": 1})).await.unwrap();
    let new = first.call("session/new", json!({"cwd": workspace, "mcpServers": []})).await;
    let id = new.unwrap()["sessionId"].as_str().expect("a session id").to_owned();
    first.call("session/prompt", prompt(&id, "the secret is 42")).await.unwrap();
    first.close().await;
    // Another session elsewhere is not listed for this workspace.
    let api = daemon.api().await;
    api.ready_session("mock", &daemon.workspace("elsewhere")).await;

    let mut second = SdkClient::face(&daemon.url, &["--agent", "mock"]);
    let init = second.call("initialize", json!({"protocolVersion": 1})).await.unwrap();
    assert_eq!(init["agentCapabilities"]["loadSession"], true, "{init}");
    let caps = &init["agentCapabilities"]["sessionCapabilities"];
    for capability in ["list", "resume", "close"] {
        assert!(caps[capability].is_object(), "{capability}: {init}");
    }
    let listed = second.call("session/list", json!({"cwd": workspace})).await.unwrap();
    let ids: Vec<&Value> =
        listed["sessions"].as_array().unwrap().iter().map(|s| &s["sessionId"]).collect();
    assert_eq!(ids, [&json!(id)], "{listed}");
    assert!(listed["sessions"][0]["updatedAt"].is_string(), "{listed}");
    let load = json!({"sessionId": id, "cwd": workspace, "mcpServers": []});
    second.call("session/load", load).await.unwrap();
    let answer = second.call("session/prompt", prompt(&id, "/recall")).await.unwrap();
    assert_eq!(answer["stopReason"], "end_turn");
    second.call("session/close", json!({"sessionId": id})).await.unwrap();
    let seen = second.close().await;
    // The load replayed the conversation from Tether's history, then the agent (brought back
    // by the prompt) still knew it.
    assert_eq!(seen[0], "user: the secret is 42", "{seen:?}");
    assert!(seen[1].starts_with("agent: mock-agent: remembered 0 earlier messages"), "{seen:?}");
    assert!(
        seen[2..]
            .iter()
            .any(|line| line.starts_with("agent: ") && line.contains("the secret is 42")),
        "{seen:?}"
    );
    // Closed: the agent is let go, the session kept (paused), not ended.
    let status = api.status(&id).await;
    assert_eq!(status.state, protocol::api::SessionState::Paused, "{status:?}");
    assert!(!status.is_agent_running);
}

/// What a daemon the face started leaves to clean up: it, its sidecars and agents, and its
/// cgroups (also when an assertion fails).
struct Started {
    root: tempfile::TempDir,
    listen: String,
    install_id: String,
}

impl Drop for Started {
    fn drop(&mut self) {
        let daemons = Daemon::processes_mentioning(std::path::Path::new(&self.listen));
        let others = Daemon::processes_mentioning(self.root.path());
        for pid in daemons.into_iter().chain(others) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        supervisor::runtime::cgroup::discard(&self.install_id);
    }
}

#[tokio::test]
async fn the_face_starts_a_daemon_when_none_runs_and_the_session_outlives_the_client() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("tether");
    std::fs::create_dir_all(&data).unwrap();
    let install_id = uuid::Uuid::new_v4().to_string();
    std::fs::write(data.join("install_id"), &install_id).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let url = format!("ws://{listen}");
    let workspace = root.path().join("project");
    std::fs::create_dir_all(&workspace).unwrap();
    let started = Started { root, listen, install_id };
    let home = started.root.path().to_str().unwrap();
    let mut client = SdkClient::spawn(
        &workspace_bin("supervisor"),
        &["--url", url.as_str(), "acp", "--agent", "mock"],
        &[("TETHER_HOME", data.to_str().unwrap()), ("HOME", home)],
    );
    client.call("initialize", json!({"protocolVersion": 1})).await.unwrap();
    let new = client.call("session/new", json!({"cwd": workspace, "mcpServers": []})).await;
    let session = new.unwrap()["sessionId"].as_str().expect("a session id").to_owned();
    let answer = client.call("session/prompt", prompt(&session, "hello")).await.unwrap();
    assert_eq!(answer["stopReason"], "end_turn");
    client.close().await;
    // The client and its face are gone; the daemon it started still runs, with the
    // session (its log in the data directory).
    let api = tether_tests::daemon::Api::connect(&url, &[]).await.expect("the daemon runs");
    let status = api.status(&session).await;
    assert_eq!(status.state, protocol::api::SessionState::WaitingForInput, "{status:?}");
    let log = std::fs::read_to_string(data.join("daemon.log")).unwrap_or_default();
    assert!(!log.contains("ERROR"), "{log}");
    drop(started);
}

#[tokio::test]
async fn mcp_servers_that_are_not_acp_ones_are_refused_at_create() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let task = ok("task.create", api.typed().task_create("mcp".into(), None)).await.id;
    let workspace = daemon.workspace("mcp");
    let bad = Create {
        mcp_servers: Some(vec![serde_json::json!({"command": "/bin/true"})]),
        ..Create::new(&task, "mock", Some(&workspace))
    };
    let refusal = refused("a nameless MCP server", bad.send(api.typed())).await;
    assert_eq!(refusal.kind, ErrorKind::InvalidParams);
    assert_eq!(refusal.field.as_deref(), Some("mcp_servers"));
    let many = Create {
        mcp_servers: Some(vec![
            serde_json::json!({"name": "x", "command": "/bin/true", "args": [], "env": []});
            33
        ]),
        ..Create::new(&task, "mock", Some(&workspace))
    };
    let refusal = refused("33 MCP servers", many.send(api.typed())).await;
    assert_eq!((refusal.field.as_deref(), refusal.limit), (Some("mcp_servers"), Some(32)));
    // Nothing was created by either.
    assert!(ok("the list", api.typed().session_list(None, None, None)).await.is_empty());
}

/// The project's Python venv with the ACP SDK (`scripts/setup.sh`); CI must have it.
fn python_acp() -> Option<std::path::PathBuf> {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join(".tools/python/bin/python");
    if python.exists() {
        return Some(python);
    }
    assert!(
        std::env::var_os("REQUIRE_DOCKER").is_none(),
        "the Python ACP SDK is not installed in .tools/python: scripts/setup.sh installs it"
    );
    println!("SKIPPED: the Python ACP SDK is not installed (scripts/setup.sh installs it)");
    None
}

#[tokio::test]
async fn the_python_sdk_client_runs_cancels_lists_and_loads_through_the_face() {
    let Some(python) = python_acp() else { return };
    let daemon = Daemon::start(&[]).await;
    let workspace = daemon.workspace("python");
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/face_client.py");
    let output = within(
        "the Python client",
        tokio::process::Command::new(python)
            .arg(script)
            .arg(workspace_bin("supervisor"))
            .arg(&daemon.url)
            .arg(&workspace)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the Python client runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let seen: serde_json::Value = serde_json::from_slice(&output.stdout).expect("its JSON");
    assert_eq!(seen["agent"], "tether", "{seen}");
    assert_eq!(
        (&seen["first_stop"], &seen["cancelled_stop"], &seen["recall_stop"]),
        (&json!("end_turn"), &json!("cancelled"), &json!("end_turn")),
        "{seen}"
    );
    assert_eq!(seen["permissions"], 1, "{seen}");
    assert_eq!(seen["listed"], json!([seen["session"]]), "{seen}");
    let first: Vec<&str> =
        seen["first_lines"].as_array().unwrap().iter().filter_map(|l| l.as_str()).collect();
    assert!(first.iter().any(|l| l.contains("you said: from python")), "{seen}");
    assert!(!first.iter().any(|l| l.contains("never said")), "{seen}");
    // The load replayed the conversation once (each tool call once), then the agent knew it.
    let second: Vec<&str> =
        seen["second_lines"].as_array().unwrap().iter().filter_map(|l| l.as_str()).collect();
    assert_eq!(second[0], "user: /permission\nfrom python", "{seen}");
    assert_eq!(second.iter().filter(|l| l.starts_with("tool: ")).count(), 2, "{seen}");
    assert!(
        second.last().unwrap().contains("earlier user messages: [/permission\nfrom python"),
        "{seen}"
    );
}

/// `$/cancel_request` of a prompt cancels its turn, and the prompt answers `cancelled`
/// (ACP: a valid response with a cancellation marker); an id not in flight is ignored.
/// Every line both ways is valid against the vendored ACP schema.
#[tokio::test]
async fn cancel_request_of_a_prompt_cancels_its_turn() {
    let daemon = Daemon::start(&[]).await;
    let mut face = RawFace::spawn(None, &daemon.url, &["--agent", "mock"]);
    face.initialize().await;
    let cwd = daemon.workspace("cancel-request");
    let new = face.request(json!(2), "session/new", json!({"cwd": cwd, "mcpServers": []})).await;
    let session = new["result"]["sessionId"].clone();
    face.send(json!({"jsonrpc": "2.0", "id": "slow", "method": "session/prompt", "params": {
        "sessionId": session, "prompt": [{"type": "text", "text": "/tool\n/sleep 60000\nnever said"}]}}))
    .await;
    face.until(|m| m["params"]["update"]["sessionUpdate"] == "tool_call").await;
    face.send(json!({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 99}}))
        .await;
    face.send(
        json!({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": "slow"}}),
    )
    .await;
    let answer = face.until(|m| m.get("id").is_some()).await;
    assert_eq!(answer["id"], "slow", "nothing answers the id not in flight first: {answer}");
    assert_eq!(answer["result"]["stopReason"], "cancelled", "{answer}");
    // The protocol-level `$/cancel_request` has a definition of its own (no side).
    let mut schema = tether_tests::schema::AcpSchema::load();
    for cancel in
        face.sent.iter().filter(|line| String::from_utf8_lossy(line).contains("$/cancel_request"))
    {
        let cancel: serde_json::Value = serde_json::from_slice(cancel).unwrap();
        schema.validate("CancelRequestNotification", &cancel["params"]).unwrap();
    }
    let to_face: Vec<Vec<u8>> = face
        .sent
        .iter()
        .filter(|line| !String::from_utf8_lossy(line).contains("$/cancel_request"))
        .cloned()
        .collect();
    let checked = schema
        .check_transcript(&to_face, &face.received)
        .unwrap_or_else(|errors| panic!("{}", errors.join("\n")));
    let methods: std::collections::BTreeSet<_> =
        checked.iter().map(|checked| checked.method.as_str()).collect();
    for method in ["initialize", "session/new", "session/prompt", "session/update"] {
        assert!(methods.contains(method), "{method} checked: {methods:?}");
    }
}

/// Without `--agent` the client chooses the agent (the `agent` config option) before the
/// first prompt creates the session; then the agent's own options and modes are there,
/// set through the face (the agent sees them), kept when a new client loads the session,
/// and the agent cannot change any more. Every line is valid against the ACP schema.
#[tokio::test]
async fn config_options_and_modes_through_the_face() {
    let daemon = Daemon::start(&[]).await;
    let mut face = RawFace::spawn(None, &daemon.url, &[]);
    face.initialize().await;
    let cwd = daemon.workspace("config");
    let new = face.request(json!(1), "session/new", json!({"cwd": cwd, "mcpServers": []})).await;
    let session = new["result"]["sessionId"].as_str().expect("a sessionId").to_owned();
    let agent = &new["result"]["configOptions"][0];
    assert_eq!(agent["id"], "agent", "{new}");
    // The agents that can run here are offered, mock-agent among them.
    let values: Vec<&str> =
        agent["options"].as_array().unwrap().iter().filter_map(|o| o["value"].as_str()).collect();
    assert!(values.contains(&"mock"), "{values:?}");
    let options = |answer: &Value| answer["result"]["configOptions"].clone();
    let chosen = face
        .request(
            json!(2),
            "session/set_config_option",
            json!({"sessionId": session, "configId": "agent", "value": "mock"}),
        )
        .await;
    assert_eq!(options(&chosen)[0]["currentValue"], "mock", "{chosen}");
    let early = face
        .request(json!(3), "session/set_mode", json!({"sessionId": session, "modeId": "code"}))
        .await;
    assert_eq!(early["error"]["code"], -32602, "modes come with the agent: {early}");
    // The first prompt creates the session with that agent; its options arrive.
    let first = face
        .request(
            json!(4),
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": "/settings"}]}),
        )
        .await;
    assert_eq!(first["result"]["stopReason"], "end_turn", "{first}");
    let api = daemon.api().await;
    assert_eq!(api.status(&session).await.agent_profile_id, "mock");
    let set = face
        .request(
            json!(5),
            "session/set_config_option",
            json!({"sessionId": session, "configId": "model", "value": "mock-large"}),
        )
        .await;
    let model =
        options(&set).as_array().unwrap().iter().find(|o| o["id"] == "model").cloned().unwrap();
    assert_eq!(model["currentValue"], "mock-large", "{set}");
    let mode = face
        .request(json!(6), "session/set_mode", json!({"sessionId": session, "modeId": "code"}))
        .await;
    assert_eq!(mode["result"], json!({}), "{mode}");
    let switch = face
        .request(
            json!(7),
            "session/set_config_option",
            json!({"sessionId": session, "configId": "agent", "value": "other"}),
        )
        .await;
    assert_eq!(switch["error"]["code"], -32602, "{switch}");
    face.send(json!({"jsonrpc": "2.0", "id": 8, "method": "session/prompt",
        "params": {"sessionId": session, "prompt": [{"type": "text", "text": "/settings"}]}}))
        .await;
    let reply =
        face.until(|m| m["params"]["update"]["sessionUpdate"] == "agent_message_chunk").await;
    assert_eq!(reply["params"]["update"]["content"]["text"], "model=mock-large mode=code");
    face.until(|m| m["id"] == 8).await;
    let checked = face.check_schema().unwrap_or_else(|errors| panic!("{}", errors.join("\n")));
    let methods: std::collections::BTreeSet<_> = checked.iter().map(|c| c.method.clone()).collect();
    for method in ["session/set_config_option", "session/set_mode", "session/new"] {
        assert!(methods.contains(method), "{method} checked: {methods:?}");
    }
    face.close().await;
    // A new client loading the session hears the options as they stand.
    let mut second = RawFace::spawn(None, &daemon.url, &[]);
    second.initialize().await;
    let loaded = second
        .request(
            json!(1),
            "session/load",
            json!({"sessionId": session, "cwd": cwd, "mcpServers": []}),
        )
        .await;
    let model =
        options(&loaded).as_array().unwrap().iter().find(|o| o["id"] == "model").cloned().unwrap();
    assert_eq!(model["currentValue"], "mock-large", "{loaded}");
    assert_eq!(loaded["result"]["modes"]["currentModeId"], "code", "{loaded}");
    second.check_schema().unwrap_or_else(|errors| panic!("{}", errors.join("\n")));
    second.close().await;
}

/// An agent's elicitation reaches a client that takes them (its `initialize` said so) as
/// `elicitation/create`, and the client's answer reaches the agent through the daemon.
#[tokio::test]
async fn an_elicitation_goes_to_the_acp_client_and_its_answer_to_the_agent() {
    let daemon = Daemon::start(&[]).await;
    let mut face = RawFace::spawn(None, &daemon.url, &["--agent", "mock"]);
    face.request(
        json!(0),
        "initialize",
        json!({"protocolVersion": 1,
        "clientCapabilities": {"elicitation": {"form": {}}}}),
    )
    .await;
    let cwd = daemon.workspace("elicit");
    let new = face.request(json!(1), "session/new", json!({"cwd": cwd, "mcpServers": []})).await;
    let session = new["result"]["sessionId"].clone();
    face.send(json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": {
        "sessionId": session, "prompt": [{"type": "text", "text": "/elicit Who are you?"}]}}))
        .await;
    let asked = face.until(|m| m["method"] == "elicitation/create").await;
    assert_eq!(asked["params"]["sessionId"], session, "{asked}");
    assert_eq!(asked["params"]["message"], "Who are you?");
    face.send(json!({"jsonrpc": "2.0", "id": asked["id"], "result": {
        "action": "accept", "content": {"name": "Ada", "subscribe": true}}}))
        .await;
    let reply =
        face.until(|m| m["params"]["update"]["sessionUpdate"] == "agent_message_chunk").await;
    let text = reply["params"]["update"]["content"]["text"].as_str().unwrap_or_default();
    assert!(text.contains(r#"elicited: accept {"name":"Ada","subscribe":true}"#), "{text}");
    let end = face.until(|m| m["id"] == 2).await;
    assert_eq!(end["result"]["stopReason"], "end_turn", "{end}");
    let checked = face.check_schema().unwrap_or_else(|errors| panic!("{}", errors.join("\n")));
    assert!(checked.iter().any(|c| c.method == "elicitation/create"), "{checked:?}");
    face.close().await;
}

/// An ACP client steers through the face as it steers claude-agent-acp: the face
/// advertises `_meta.steering.supported`; `_session/steering` while the client's prompt
/// runs is `injected`, and (the mock agent taking no message mid-turn, so Tether cancels
/// and runs the steer next) the client's `session/prompt` carries on through the steer's
/// turn to its `end_turn`. With no turn running, `promptRequired` is honoured.
#[tokio::test]
async fn an_acp_client_steers_a_running_turn_through_the_face() {
    let daemon = Daemon::start(&[]).await;
    let mut face = RawFace::spawn(None, &daemon.url, &["--agent", "mock"]);
    let init = face.initialize().await;
    assert_eq!(init["result"]["_meta"]["steering"]["supported"], true, "{init}");
    let cwd = daemon.workspace("steer");
    let new = face.request(json!(2), "session/new", json!({"cwd": cwd, "mcpServers": []})).await;
    let session = new["result"]["sessionId"].clone();
    let steer = |text: &str| {
        json!({"sessionId": session, "prompt": [{"type": "text", "text": text}],
            "_meta": {"steering": {"idleBehavior": "promptRequired"}}})
    };
    let idle = face.request(json!(3), "_session/steering", steer("too early")).await;
    assert_eq!(idle["result"]["outcome"], "promptRequired", "{idle}");
    face.send(json!({"jsonrpc": "2.0", "id": "slow", "method": "session/prompt", "params": {
        "sessionId": session, "prompt": [{"type": "text", "text": "/tool\n/sleep 60000\nthe wrong way"}]}}))
    .await;
    face.until(|m| m["params"]["update"]["sessionUpdate"] == "tool_call").await;
    face.send(json!({"jsonrpc": "2.0", "id": "steer", "method": "_session/steering",
        "params": steer("the right way")}))
        .await;
    let mut answers = Vec::new();
    while answers.len() < 2 {
        let answer = face.until(|m| m.get("id").is_some() && m.get("method").is_none()).await;
        answers.push(answer);
    }
    let by_id = |id: &str| answers.iter().find(|a| a["id"] == id).cloned().unwrap_or_default();
    assert_eq!(by_id("steer")["result"]["outcome"], "injected", "{answers:?}");
    assert_eq!(by_id("slow")["result"]["stopReason"], "end_turn", "{answers:?}");
    let said: String = face
        .received
        .iter()
        .map(|line| String::from_utf8_lossy(line).into_owned())
        .filter(|line| line.contains("agent_message_chunk"))
        .collect();
    assert!(said.contains("the right way"), "the steer's turn reached the client: {said}");
}

/// An ACP client forks a session through the face (`session/fork`, advertised): the fork
/// is a session of its own whose first prompt carries the conversation so far.
#[tokio::test]
async fn an_acp_client_forks_a_session_through_the_face() {
    let daemon = Daemon::start(&[]).await;
    let mut face = RawFace::spawn(None, &daemon.url, &["--agent", "mock"]);
    let init = face.initialize().await;
    assert!(
        init["result"]["agentCapabilities"]["sessionCapabilities"]["fork"].is_object(),
        "{init}"
    );
    let cwd = daemon.workspace("fork");
    let new = face.request(json!(2), "session/new", json!({"cwd": cwd, "mcpServers": []})).await;
    let session = new["result"]["sessionId"].clone();
    let prompt = |session: &Value, text: &str| json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]});
    let first =
        face.request(json!(3), "session/prompt", prompt(&session, "remember the lighthouse")).await;
    assert_eq!(first["result"]["stopReason"], "end_turn", "{first}");
    let forked = face
        .request(
            json!(4),
            "session/fork",
            json!({"sessionId": session, "cwd": cwd, "mcpServers": []}),
        )
        .await;
    let fork = forked["result"]["sessionId"].clone();
    assert!(fork.is_string() && fork != session, "{forked}");
    let second = face.request(json!(5), "session/prompt", prompt(&fork, "what was it?")).await;
    assert_eq!(second["result"]["stopReason"], "end_turn", "{second}");
    let said: String = face
        .received
        .iter()
        .map(|line| String::from_utf8_lossy(line).into_owned())
        .filter(|line| {
            line.contains("agent_message_chunk") && line.contains(fork.as_str().unwrap())
        })
        .collect();
    assert!(said.contains("remember the lighthouse"), "the fork's agent got the history: {said}");
    let api = daemon.api().await;
    let status = api.status(fork.as_str().unwrap()).await;
    assert_eq!(status.forked_from.map(|link| link.session_id).as_deref(), session.as_str());
}

/// `/rewind` sent as a prompt undoes the conversation's last turn (ACP has no rewind of its
/// own): the client is told in the agent's words, the turn is marked rewound, and the next
/// prompt's agent starts from the turn before; a later `session/load` does not replay it.
#[tokio::test]
async fn an_acp_client_rewinds_the_last_turn_with_a_rewind_prompt() {
    let daemon = Daemon::start(&[]).await;
    let mut face = RawFace::spawn(None, &daemon.url, &["--agent", "mock"]);
    face.initialize().await;
    let cwd = daemon.workspace("rewind");
    let new = face.request(json!(2), "session/new", json!({"cwd": cwd, "mcpServers": []})).await;
    let session = new["result"]["sessionId"].clone();
    let prompt =
        |text: &str| json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]});
    for (id, text) in [(3, "remember the lighthouse"), (4, "and forget the harbour")] {
        let ended = face.request(json!(id), "session/prompt", prompt(text)).await;
        assert_eq!(ended["result"]["stopReason"], "end_turn", "{ended}");
    }
    let rewound = face.request(json!(5), "session/prompt", prompt("/rewind")).await;
    assert_eq!(rewound["result"]["stopReason"], "end_turn", "{rewound}");
    let said: String = face
        .received
        .iter()
        .map(|line| String::from_utf8_lossy(line).into_owned())
        .filter(|line| line.contains("agent_message_chunk"))
        .collect();
    assert!(said.contains("rewound 1 turn(s)"), "{said}");
    let api = daemon.api().await;
    let session_id = session.as_str().unwrap();
    let timeline = ok("timeline", api.typed().session_timeline(session_id.to_owned(), None)).await;
    let marks: Vec<bool> = timeline.turns.iter().map(|turn| turn.rewound).collect();
    assert_eq!(marks, [false, true], "{timeline:?}");
    let next = face.request(json!(6), "session/prompt", prompt("what was it?")).await;
    assert_eq!(next["result"]["stopReason"], "end_turn", "{next}");
    let said: String = face
        .received
        .iter()
        .rev()
        .map(|line| String::from_utf8_lossy(line).into_owned())
        .take_while(|line| !line.contains("rewound 1 turn(s)"))
        .collect();
    assert!(said.contains("lighthouse") && !said.contains("harbour"), "{said}");
    face.close().await;
    // A second client loading the session is not replayed the rewound turn.
    let mut other = RawFace::spawn(None, &daemon.url, &["--agent", "mock"]);
    other.initialize().await;
    let loaded = other
        .request(
            json!(2),
            "session/load",
            json!({"sessionId": session, "cwd": cwd, "mcpServers": []}),
        )
        .await;
    assert!(loaded["result"].is_object(), "{loaded}");
    let replayed: String =
        other.received.iter().map(|line| String::from_utf8_lossy(line).into_owned()).collect();
    assert!(replayed.contains("lighthouse") && !replayed.contains("harbour"), "{replayed}");
    other.close().await;
}

/// Two ACP clients and the API on one session: the second client's `session/load` of the
/// live session follows it (no second agent); each client sees the other's turns; an
/// agent's question asked of both is answered by the first to answer and withdrawn from
/// the other (`$/cancel_request`); a prompt of one while the other's turn runs is queued
/// behind it, and each prompt answers when its own turn ends.
#[tokio::test]
async fn two_acp_clients_and_the_api_share_one_session() {
    let daemon = Daemon::start(&[]).await;
    let mut a = RawFace::spawn(None, &daemon.url, &["--agent", "mock"]);
    a.initialize().await;
    let cwd = daemon.workspace("shared");
    let new = a.request(json!(1), "session/new", json!({"cwd": cwd, "mcpServers": []})).await;
    let session = new["result"]["sessionId"].clone();
    let mut b = RawFace::spawn(None, &daemon.url, &[]);
    b.initialize().await;
    let load = json!({"sessionId": session, "cwd": cwd, "mcpServers": []});
    let loaded = b.request(json!(1), "session/load", load).await;
    assert!(loaded.get("result").is_some(), "{loaded}");
    let api = daemon.api().await;
    let mut events = api.subscribe(session.as_str().unwrap(), 0).await;
    let prompt = |id: &str, text: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt", "params": {
            "sessionId": session, "prompt": [{"type": "text", "text": text}]}})
    };
    // A's turn asks permission: both clients are asked; B answers first.
    a.send(prompt("a1", "/permission\nasked of both")).await;
    let asked_a = a.until(|m| m["method"] == "session/request_permission").await;
    let asked_b = b.until(|m| m["method"] == "session/request_permission").await;
    let option = asked_b["params"]["options"][0]["optionId"].clone();
    b.send(json!({"jsonrpc": "2.0", "id": asked_b["id"], "result": {
        "outcome": {"outcome": "selected", "optionId": option}}}))
        .await;
    let withdrawn = a.until(|m| m["method"] == "$/cancel_request").await;
    assert_eq!(withdrawn["params"]["requestId"], asked_a["id"], "A's question is withdrawn");
    let answered = a.until(|m| m["id"] == "a1").await;
    assert_eq!(answered["result"]["stopReason"], "end_turn", "{answered}");
    let seen_by_b = b
        .until(|m| {
            m.to_string().contains("agent_message_chunk") && m.to_string().contains("asked of both")
        })
        .await;
    assert_eq!(seen_by_b["params"]["sessionId"], session);
    // B prompts while A's next turn runs: queued behind it; each answers at its own end.
    a.send(prompt("a2", "/think working\n/sleep 1000\nslow from a")).await;
    b.until(|m| m.to_string().contains("agent_thought_chunk")).await;
    b.send(prompt("b1", "quick from b")).await;
    let b_answer = b.until(|m| m["id"] == "b1").await;
    assert_eq!(b_answer["result"]["stopReason"], "end_turn", "{b_answer}");
    let a_answer = a.until(|m| m["id"] == "a2").await;
    assert_eq!(a_answer["result"]["stopReason"], "end_turn", "{a_answer}");
    // A saw B's reply; the API saw the three turns in order, with one agent all along.
    let b_reply = a
        .until(|m| {
            m.to_string().contains("agent_message_chunk") && m.to_string().contains("quick from b")
        })
        .await;
    assert_eq!(b_reply["params"]["sessionId"], session);
    let mut prompts = Vec::new();
    until(&mut events, |event| {
        if let EventKind::TurnStarted { prompt, .. } = &event.kind {
            prompts.push(prompt.clone());
        }
        prompts.len() == 3
    })
    .await;
    assert_eq!(
        prompts,
        ["/permission\nasked of both", "/think working\n/sleep 1000\nslow from a", "quick from b"]
    );
    let status = api.status(session.as_str().unwrap()).await;
    assert_eq!(status.generation, 1, "one agent served both clients: {status:?}");
}

/// A face on the `mock` agent with a new session in workspace `name` that has run one
/// turn ("hello", ended `end_turn`); the face and the session.
async fn face_after_one_turn(daemon: &Daemon, name: &str) -> (RawFace, String) {
    let mut face = RawFace::spawn(None, &daemon.url, &["--agent", "mock"]);
    face.initialize().await;
    let cwd = daemon.workspace(name);
    let new = face.request(json!(2), "session/new", json!({"cwd": cwd, "mcpServers": []})).await;
    let session = new["result"]["sessionId"].as_str().expect("a session id").to_owned();
    let first = face.request(json!(3), "session/prompt", prompt_params(&session, "hello")).await;
    assert_eq!(first["result"]["stopReason"], "end_turn", "{first}");
    (face, session)
}

/// `session/prompt`'s params: `text` as one text block.
fn prompt_params(session: &str, text: &str) -> Value {
    json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]})
}

/// A prompt an ACP client sends while a turn runs waits in the queue; when that turn fails
/// the queue halts, and the client's `session/prompt` ends with why rather than waiting
/// for ever (the prompt stays queued for `queue resume`).
#[tokio::test]
async fn a_queued_prompt_of_an_acp_client_ends_when_the_queue_halts() {
    let daemon = Daemon::start(&[]).await;
    let (mut face, session) = face_after_one_turn(&daemon, "halt").await;
    let prompt = |text: &str| prompt_params(&session, text);
    // Another client's turn runs, and its agent dies in the middle of it.
    let api = daemon.api().await;
    api.prompt(&session, "/sleep 300\n/crash 3").await.expect("a turn starts");
    let ended = face.request(json!(4), "session/prompt", prompt("after the crash")).await;
    let message = ended["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("the prompt queue halted"), "{ended}");
    let queue = api.status(&session).await.queue;
    assert_eq!(queue.prompts.len(), 1, "it stays queued: {queue:?}");
    assert_eq!(queue.prompts[0].prompt, "after the crash");
    face.close().await;
}

/// An ACP client's prompt to a session at rest is queued while its agent comes back, and
/// its `session/prompt` answers when that turn ends.
#[tokio::test]
async fn an_acp_clients_prompt_to_a_paused_session_wakes_it_and_ends_with_its_turn() {
    let daemon = Daemon::start(&[]).await;
    let (mut face, session) = face_after_one_turn(&daemon, "wake").await;
    let prompt = |text: &str| prompt_params(&session, text);
    let api = daemon.api().await;
    ok("pause", api.typed().session_pause(session.clone(), None, None)).await;
    let woken = face.request(json!(4), "session/prompt", prompt("woken")).await;
    assert_eq!(woken["result"]["stopReason"], "end_turn", "{woken}");
    face.close().await;
}
