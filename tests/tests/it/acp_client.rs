//! ACP as it is today, toward the agent — `session/close` when an
//! agent that advertises it is let go.

use protocol::api::{ApiClient, EntryType, EventKind, SessionEvent};
use tether_tests::daemon::{Api, Daemon, ok, refused, turn_ended, until};

/// How many times mock-agent saw its session closed (its stored file says).
fn closes(daemon: &Daemon, acp_session: &str) -> u64 {
    let file = daemon.mock_state_dir().join(format!("{acp_session}.json"));
    let stored: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    stored["closed"].as_u64().unwrap_or(0)
}

async fn acp_session(api: &Api, session: &str) -> String {
    api.status(session).await.acp_session_id.expect("the ACP session is open")
}

#[tokio::test]
async fn an_agent_that_takes_session_close_gets_it_when_paused_and_when_stopped() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("w")).await;
    api.ask(&session, "hello").await;
    let first = acp_session(&api, &session).await;
    assert_eq!(closes(&daemon, &first), 0);
    let mut events = api.subscribe_at_end(&session).await;
    ok("pause", api.typed().session_pause(session.clone(), None, None)).await;
    until(&mut events, |event| matches!(event.kind, EventKind::Paused { .. })).await;
    assert_eq!(closes(&daemon, &first), 1, "a pause closes the agent's session");
    // Loaded again (mock-agent loads natively: the same ACP session), then stopped.
    assert!(api.ask(&session, "/recall").await.contains("hello"));
    assert_eq!(acp_session(&api, &session).await, first);
    // The stop answers at once and lets the sidecar go in the background: its exit is
    // awaited (the agent's came first).
    let sidecar = agentctl::process::PidFd::open(daemon.agentctl_pid(&session)).unwrap();
    ok("stop", api.typed().session_stop(session.clone())).await;
    tether_tests::within("the sidecar to exit", sidecar.exited()).await.unwrap();
    assert_eq!(closes(&daemon, &first), 2, "a stop closes it too");
}

/// A title the agent gives its session (`session_info_update`) is the session's title in
/// lists: the API's, the CLI's, and an ACP client's `session/list`.
#[tokio::test]
async fn the_title_an_agent_gives_its_session_appears_in_lists() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("w")).await;
    api.ask(&session, "hello").await;
    let listed = ok("list", api.typed().session_list(None, None, None)).await;
    assert_eq!(listed[0].title, None);
    // mock-agent names the session when it loads it (as gemini-cli and claude do).
    let mut events = api.subscribe_at_end(&session).await;
    ok("pause", api.typed().session_pause(session.clone(), None, None)).await;
    until(&mut events, |event| matches!(event.kind, EventKind::Paused { .. })).await;
    api.ask(&session, "again").await;
    let listed = ok("list", api.typed().session_list(None, None, None)).await;
    assert_eq!(listed[0].title.as_deref(), Some("mock session"), "{listed:?}");
    let (code, out, err) = daemon.cli(&["sessions", "list"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\tmock session"), "{out}");
}

/// Agents name a tool call after announcing it (claude-agent-acp: "Preparing file…", then
/// the edit's own title): the history records the name, as the API, the page and the CLI
/// serve it, not the placeholder; the stream carries both, the name last.
#[tokio::test]
async fn a_tool_call_renamed_by_its_agent_is_recorded_with_its_new_title() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("w")).await;
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, "/edit notes.txt hello there\nedit it").await.unwrap();
    let seen = until(&mut events, turn_ended).await;
    let titles: Vec<&str> = seen
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolCall { update } | EventKind::ToolCallUpdate { update } => {
                update["title"].as_str()
            }
            _ => None,
        })
        .collect();
    assert_eq!(titles, ["Preparing file…", "Edit notes.txt"], "the agent's own updates");
    let history = api.history(&session).await;
    let call = history.iter().find(|entry| entry.kind == EntryType::ToolCall);
    let call = call.unwrap_or_else(|| panic!("the call is recorded: {history:?}"));
    assert_eq!(call.tool_name.as_deref(), Some("Edit notes.txt"), "{call:?}");
    assert_eq!(call.content, "Edit notes.txt", "{call:?}");
    let (code, out, err) = daemon.cli(&["history", &session]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("tool_call: Edit notes.txt") && !out.contains("Preparing"), "{out}");
    // The CLI's prompt shows the call under each name it is given, the newest last.
    let (code, out, err) = daemon.cli(&["prompt", &session, "/edit b.txt again\nedit"]).await;
    assert_eq!(code, 0, "{err}");
    let at = |text: &str| out.find(text).unwrap_or_else(|| panic!("{text} in {out}"));
    assert!(at("[tool: Preparing file…]") < at("[tool: Edit b.txt]"), "{out}");
}

/// `additional_directories` at create reach an agent that takes them (ACP
/// `additionalDirectories` at `session/new`, and at every load and resume after).
#[tokio::test]
async fn additional_directories_reach_the_agent() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let task = ok("task", api.typed().task_create("dirs".into(), None)).await;
    let (workspace, data) = (daemon.workspace("w"), daemon.workspace("data"));
    let create = tether_tests::daemon::Create {
        additional_directories: Some(vec![data.display().to_string()]),
        ..tether_tests::daemon::Create::new(&task.id, "mock", Some(&workspace))
    };
    let created = ok("create", create.send(api.typed())).await;
    let mut events = api.subscribe(&created.id, 0).await;
    tether_tests::daemon::settled(&mut events).await;
    let acp = acp_session(&api, &created.id).await;
    let file = daemon.mock_state_dir().join(format!("{acp}.json"));
    let stored: serde_json::Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
    assert_eq!(stored["additional_directories"], serde_json::json!([data]), "{stored}");
    // One that is not a directory is refused at create.
    let bad = tether_tests::daemon::Create {
        additional_directories: Some(vec!["/no/such/dir".into()]),
        ..tether_tests::daemon::Create::new(&task.id, "mock", Some(&daemon.workspace("x")))
    };
    let refused = tether_tests::daemon::refused("create", bad.send(api.typed())).await;
    assert_eq!(refused.field.as_deref(), Some("additional_directories"), "{refused:?}");
    // A caller may choose the id, but not one that is taken.
    let again = tether_tests::daemon::Create {
        session_id: Some(created.id.clone()),
        ..tether_tests::daemon::Create::new(&task.id, "mock", Some(&daemon.workspace("y")))
    };
    let taken = tether_tests::daemon::refused("create", again.send(api.typed())).await;
    assert_eq!(taken.kind, protocol::errors::ErrorKind::Conflict, "{taken:?}");
}

fn elicitation_id(event: &protocol::api::SessionEvent) -> Option<String> {
    match &event.kind {
        EventKind::ElicitationRequest { request_id, .. } => Some(request_id.clone()),
        _ => None,
    }
}

/// An agent's `elicitation/create` is a question like a permission: an event, a durable
/// row that a daemon kill does not lose (it is asked again after the restart), answered
/// through `task.session.elicitation.respond`; an answer of the wrong kind is refused, and
/// a question the agent withdraws (`$/cancel_request`) resolves without an answer.
#[tokio::test]
async fn an_elicitation_outlives_a_daemon_kill_and_is_answered_through_the_api() {
    use protocol::api::params::ElicitationAnswer;
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("w")).await;
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, "/elicit Who are you?\nhello").await.unwrap();
    let seen = until(&mut events, |event| elicitation_id(event).is_some()).await;
    let asked = seen.last().unwrap();
    let EventKind::ElicitationRequest { params, .. } = &asked.kind else { unreachable!() };
    assert_eq!(params["message"], "Who are you?", "{params}");
    assert_eq!(params["requestedSchema"]["properties"]["name"]["type"], "string");
    let open = api.status(&session).await.open_questions;
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0].method, "elicitation/create");
    // The daemon dies with the question open; its successor asks it again.
    daemon.kill().await;
    daemon.restart().await;
    let api = daemon.api().await;
    let mut events = api.subscribe(&session, asked.seq).await;
    let again = until(&mut events, |event| elicitation_id(event).is_some()).await;
    let request = elicitation_id(again.last().unwrap()).unwrap();
    // A permission's answer to it is refused; the elicitation's is taken.
    let wrong = refused(
        "permission.respond",
        api.typed().permission_respond(session.clone(), request.clone(), Some("allow".into())),
    )
    .await;
    assert_eq!(wrong.kind, protocol::errors::ErrorKind::InvalidParams, "{wrong:?}");
    let content: serde_json::Map<String, serde_json::Value> =
        serde_json::from_value(serde_json::json!({"name": "Ada"})).unwrap();
    let answer = api.typed().elicitation_respond(
        session.clone(),
        request.clone(),
        ElicitationAnswer::Accept,
        Some(content),
    );
    ok("elicitation.respond", answer).await;
    let mut rest = until(&mut events, tether_tests::daemon::turn_ended).await;
    let reply = tether_tests::daemon::chunks(&rest).concat();
    assert!(reply.contains(r#"elicited: accept {"name":"Ada"}"#), "{reply}");
    // The resolution is published once agentctl took the answer, which the agent's reply
    // (and the turn's end) may overtake.
    let resolved = |event: &SessionEvent| {
        matches!(&event.kind,
        EventKind::PermissionResolved { request_id, .. } if *request_id == request)
    };
    if !rest.iter().any(resolved) {
        rest.extend(until(&mut events, resolved).await);
    }
    let resolution = rest.iter().find(|event| resolved(event)).expect("resolved");
    let EventKind::PermissionResolved { outcome, .. } = &resolution.kind else { unreachable!() };
    assert_eq!(outcome["action"], "accept", "{rest:?}");
    // Withdrawn by the agent: resolved as cancelled, the turn goes on.
    let reply = api.ask(&session, "/withdraw\nthen on").await;
    assert!(reply.contains("asked, then withdrew"), "{reply}");
    assert!(api.status(&session).await.open_questions.is_empty());
    let history =
        ok("window", api.typed().session_event_window(session.clone(), None, Some(50))).await;
    let withdrawn = history.events.iter().rev().find_map(|event| match &event.kind {
        EventKind::PermissionResolved { outcome, .. } => Some(outcome.clone()),
        _ => None,
    });
    assert_eq!(withdrawn, Some(serde_json::json!({"action": "cancel"})));
}

/// An agent that says nothing but writes to stderr (claude retrying a
/// refused request for minutes) is heard: its stderr lines are notices while the turn has
/// produced nothing yet.
#[tokio::test]
async fn stderr_of_a_quiet_turn_is_shown_as_notices() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("w")).await;
    let mut events = api.subscribe_at_end(&session).await;
    // The agent then thinks (until cancelled) without a word: stderr and stdout are two
    // pipes, so a reply right after the line could be read first and end the quiet.
    let prompt = "/stderr API error 401, retrying in 30 s\n/sleep 600000\nhello";
    api.prompt(&session, prompt).await.unwrap();
    let said = "the agent says: API error 401, retrying in 30 s";
    let seen = until(&mut events, |event| {
        turn_ended(event) || matches!(&event.kind, EventKind::Notice { message } if message == said)
    })
    .await;
    assert!(!turn_ended(seen.last().unwrap()), "the turn ended without the notice: {seen:?}");
    ok("cancel", api.typed().session_cancel(session.clone())).await;
    let ended = until(&mut events, turn_ended).await;
    assert_eq!(tether_tests::daemon::stop_reason(ended.last().unwrap()), Some("cancelled"));
}

/// A native load that comes back without the last turn (an agent
/// killed right after it), or without only its last answer (qwen-code writes that after
/// the turn's end), is noticed by holding its replay against Tether's history, and what it
/// lacks goes with the next prompt.
#[tokio::test]
async fn a_load_that_lacks_the_last_turn_gets_it_with_the_next_prompt() {
    for (flag, lacking) in [("--forget-last-turn", 2), ("--forget-last-answer", 1)] {
        let forgetful = format!(
            "id = \"forgetful\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{{home}}/.mock-agent\", \"{flag}\"]\nprotocol = \"acp\"\n[session]\nagent_state_dirs = [\".mock-agent\"]\n"
        );
        let daemon = Daemon::start_with_profiles(&[], &[("forgetful.toml", &forgetful)]).await;
        let api = daemon.api().await;
        let session = api.ready_session("forgetful", &daemon.workspace("w")).await;
        api.ask(&session, "the first word is kumquat").await;
        api.ask(&session, "the second word is quince").await;
        let mut events = api.subscribe_at_end(&session).await;
        ok("pause", api.typed().session_pause(session.clone(), None, None)).await;
        until(&mut events, |event| matches!(event.kind, EventKind::Paused { .. })).await;
        // It loads, replaying less than was said; what it lacks goes with this prompt.
        let reply = api.ask(&session, "what were the words?").await;
        assert!(reply.contains("the end your restored session lacks"), "{flag}: {reply}");
        assert!(reply.contains("you said: the second word is quince"), "{flag}: {reply}");
        assert!(!reply.contains("[USER]: the first word is kumquat"), "{flag}: {reply}");
        let quince_asked = reply.contains("[USER]: the second word is quince");
        assert_eq!(
            quince_asked,
            lacking == 2,
            "{flag}: the prompt goes again only if lost: {reply}"
        );
        let window =
            ok("window", api.typed().session_event_window(session.clone(), None, Some(100))).await;
        let notices = tether_tests::daemon::notices(&window.events);
        let said = format!("lacks the last {lacking} message(s)");
        assert!(notices.iter().any(|n| n.contains(&said)), "{flag}: {notices:?}");
        // Once sent, it is not sent again.
        let next = api.ask(&session, "and now?").await;
        assert!(!next.contains("RESUME CONTEXT"), "{flag}: {next}");
    }
}

/// A reply cut off by its failed turn carries Tether's cut-off note in the history, which
/// the agent's own restore never holds: a load that replays the reply as far as the agent
/// had it is not taken for lacking it, and the next prompt goes alone.
#[tokio::test]
async fn a_load_after_a_cut_off_reply_is_not_taken_for_lacking_it() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("w")).await;
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, "/stream 20000\nburst").await.unwrap();
    until(&mut events, |event| matches!(event.kind, EventKind::AgentMessageChunk { .. })).await;
    tether_tests::daemon::sigkill(daemon.agentctl_pid(&session)).await;
    let ended = until(&mut events, turn_ended).await;
    assert!(
        matches!(
            ended.last().unwrap().kind,
            EventKind::TurnEnded { state: protocol::api::TurnState::Failed, .. }
        ),
        "{:?}",
        ended.last()
    );
    let cut = api.history(&session).await.into_iter().rev().find(|entry| {
        entry.kind == protocol::api::EntryType::AgentMessage
            && entry.content.contains(supervisor::history::CUT_OFF)
    });
    assert!(cut.is_some(), "the cut-off reply is marked in the history");
    let reply = api.ask(&session, "still there?").await;
    assert!(reply.contains("you said: still there?"), "{reply}");
    assert!(!reply.contains("RESUME CONTEXT"), "{reply}");
}

/// The `messageId`s of a face's updates of one kind, in order (`None` where it had none).
fn face_message_ids(face: &tether_tests::face::RawFace, kind: &str) -> Vec<Option<String>> {
    face.received
        .iter()
        .filter_map(|line| serde_json::from_slice::<serde_json::Value>(line).ok())
        .filter(|message| message["params"]["update"]["sessionUpdate"] == kind)
        .map(|message| message["params"]["update"]["messageId"].as_str().map(str::to_owned))
        .collect()
}

/// Message ids: the agent's `messageId`s are kept — in events, in the recorded history,
/// and toward an ACP client, live and in a load's replay — and a prompt's message has the
/// id of its turn, which a replay gives the user's message. Every line the clients see is
/// valid against the vendored ACP schema.
#[tokio::test]
async fn message_ids_are_recorded_events_carry_them_and_a_load_replays_them() {
    use serde_json::json;
    use tether_tests::face::RawFace;
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let mut face = RawFace::spawn(None, &daemon.url, &["--agent", "mock"]);
    face.initialize().await;
    let cwd = daemon.workspace("ids");
    let new = face.request(json!(1), "session/new", json!({"cwd": cwd, "mcpServers": []})).await;
    let session = new["result"]["sessionId"].as_str().expect("a sessionId").to_owned();
    let mut events = api.subscribe(&session, 0).await;
    for (id, text) in [(2, "/stream 3\nhello"), (3, "again")] {
        let prompt = json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]});
        let answer = face.request(json!(id), "session/prompt", prompt).await;
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    }
    // mock-agent numbers its messages in the session: the prompts are m0 and m2.
    let live = face_message_ids(&face, "agent_message_chunk");
    assert!(live.len() >= 4, "{live:?}");
    assert!(live[..3].iter().all(|id| id.as_deref() == Some("m1")), "{live:?}");
    assert_eq!(live.last().unwrap().as_deref(), Some("m3"), "{live:?}");
    face.check_schema().unwrap_or_else(|errors| panic!("{}", errors.join("\n")));
    face.close().await;

    let seen = until(&mut events, |event| {
        matches!(&event.kind, EventKind::AgentMessageChunk { message_id, .. } if message_id.as_deref() == Some("m3"))
    })
    .await;
    let turns: Vec<String> = seen
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::TurnStarted { turn_id, .. } => Some(turn_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(turns.len(), 2, "{seen:?}");
    let history = api.history(&session).await;
    let ids: Vec<(&str, Option<&str>)> =
        history.iter().map(|entry| (entry.role.as_str(), entry.message_id.as_deref())).collect();
    assert_eq!(
        ids,
        [
            ("user", Some(turns[0].as_str())),
            ("assistant", Some("m1")),
            ("user", Some(turns[1].as_str())),
            ("assistant", Some("m3"))
        ],
        "{history:?}"
    );

    // A new client loads the session: the replay carries the same ids.
    let mut second = RawFace::spawn(None, &daemon.url, &[]);
    second.initialize().await;
    let load = json!({"sessionId": session, "cwd": cwd, "mcpServers": []});
    let loaded = second.request(json!(1), "session/load", load).await;
    assert!(loaded.get("result").is_some(), "{loaded}");
    let users = face_message_ids(&second, "user_message_chunk");
    let agents = face_message_ids(&second, "agent_message_chunk");
    assert_eq!(users, [Some(turns[0].clone()), Some(turns[1].clone())]);
    assert_eq!(agents, [Some("m1".to_owned()), Some("m3".to_owned())]);
    second.check_schema().unwrap_or_else(|errors| panic!("{}", errors.join("\n")));
    second.close().await;
}

/// An agent run through `npx` whose package npx has not downloaded yet
/// (claude's adapter: ~400 MB before it answers `initialize`) is announced as a download,
/// with where it goes and how long the start waits; once npx has it, nothing is said. (A
/// stand-in `npx` runs mock-agent: what is checked is Tether reading npx's cache.)
#[tokio::test]
async fn a_first_start_through_npx_says_it_downloads() {
    let bin = tempfile::tempdir().unwrap();
    let npx = bin.path().join("npx");
    let mock = tether_tests::workspace_bin("mock-agent");
    std::fs::write(
        &npx,
        format!("#!/bin/sh\nexec {} --state-dir \"$HOME/.mock-agent\"\n", mock.display()),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&npx, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let profile = format!(
        "id = \"adapter\"\ncommand = [\"{}\", \"--yes\", \"@example/agent-acp@1.2.3\"]\nprotocol = \"acp\"\n[env]\nnpm_config_cache = \"{{home}}/npm-cache\"\n[process]\ninit_timeout_ms = 300000\n",
        npx.display()
    );
    let daemon = Daemon::start_with_profiles(&[], &[("adapter.toml", &profile)]).await;
    let api = daemon.api().await;
    let first = api.ready_session("adapter", &daemon.workspace("a")).await;
    let window = ok("window", api.typed().session_event_window(first, None, Some(50))).await;
    let said = tether_tests::daemon::notices(&window.events);
    let cache = daemon.home().join("npm-cache");
    let expected = format!(
        "first start of @example/agent-acp@1.2.3: npx downloads it into {} before the agent answers",
        cache.display()
    );
    assert!(said.iter().any(|n| n.starts_with(&expected) && n.contains("up to 300 s")), "{said:?}");
    // What npx leaves once it has it.
    let package = cache.join("_npx/5f1e/node_modules/@example/agent-acp");
    std::fs::create_dir_all(&package).unwrap();
    std::fs::write(package.join("package.json"), r#"{"version": "1.2.3"}"#).unwrap();
    let second = api.ready_session("adapter", &daemon.workspace("b")).await;
    let window = ok("window", api.typed().session_event_window(second, None, Some(50))).await;
    let said = tether_tests::daemon::notices(&window.events);
    assert!(!said.iter().any(|n| n.contains("npx downloads")), "{said:?}");
}
