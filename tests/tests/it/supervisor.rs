//! The real `supervisor` binary, driven over its WebSocket API (and its CLI): sessions end
//! to end with mock-agent and with elizacp.

use protocol::api::{ApiClient, EntryType, EventKind, SessionEvent, SessionState, TurnState};
use protocol::errors::ErrorKind;
use serde_json::json;
use tether_tests::daemon::{
    Api, Create, Daemon, chunks, is_state, next, ok, refused, stop_reason, turn_ended, until,
    until_permission_request,
};
use tether_tests::within;

async fn prompt(api: &Api, session: &str, text: &str) -> String {
    api.prompt(session, text).await.expect("prompt accepted")
}

/// The kinds of a session's history entries, in order.
async fn kinds(api: &Api, session: &str) -> Vec<EntryType> {
    api.history(session).await.iter().map(|e| e.kind).collect()
}

/// The states among `events`.
fn states(events: &[SessionEvent]) -> Vec<SessionState> {
    events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::State { state, .. } => Some(state),
            _ => None,
        })
        .collect()
}

const WAITING: SessionState = SessionState::WaitingForInput;

#[tokio::test]
async fn a_mock_session_streams_a_turn_and_records_history() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("a")).await;
    let status_before = api.status(&session).await;
    assert_eq!((status_before.state, status_before.is_agent_running), (WAITING, true));
    assert_eq!(status_before.resume_reason, "agent_running");

    let mut events = api.subscribe(&session, status_before.last_event_seq).await;
    let turn = prompt(&api, &session, "/stream 20\nhello there").await;
    let mut seen = until(&mut events, turn_ended).await;
    let ended = seen.last().unwrap().clone();
    assert!(
        matches!(&ended.kind, EventKind::TurnEnded { turn_id, stop_reason: Some(reason), .. }
            if *turn_id == turn && reason == "end_turn"),
        "{ended:?}"
    );
    // The state change follows the turn's end.
    seen.extend(until(&mut events, |e| matches!(e.kind, EventKind::State { .. })).await);
    let texts = chunks(&seen);
    assert_eq!(texts.len(), 20);
    for (idx, text) in texts.iter().enumerate() {
        assert!(text.ends_with(&format!("[{}/20]", idx + 1)), "chunk {idx} out of order: {text}");
    }
    assert_eq!(states(&seen), [SessionState::Running, WAITING]);

    let entries = api.history(&session).await;
    let kinds: Vec<EntryType> = entries.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [EntryType::UserMessage, EntryType::AgentMessage],
        "chunks are coalesced into one message"
    );
    assert_eq!(entries[0].content, "/stream 20\nhello there");
    assert_eq!(entries[1].content, texts.concat());
    // The file on disk is what the API returned, and private, like the data directory.
    let path = daemon.session_dir(&session).join("history.jsonl");
    let file = std::fs::read_to_string(&path).unwrap();
    assert_eq!(file.lines().count(), 2);
    use std::os::unix::fs::PermissionsExt;
    let mode =
        |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(&daemon.root.path().join("tether")), 0o700);
    assert_eq!(mode(&daemon.root.path().join("tether/state.db")), 0o600);
    let task = ok("task.get", api.typed().task_get(status_before.task_id.clone())).await;
    assert_eq!(task.task.state, "REVIEW");
    assert_eq!(task.sessions[0].id, session);
}

#[tokio::test]
async fn a_permission_request_is_answered_through_the_api() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("p")).await;
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    prompt(&api, &session, "/permission").await;
    let (_, request_id, params) = until_permission_request(&mut events).await;
    // The ACP params are the agent's, relayed as they came.
    let options: Vec<protocol::acp::schema::PermissionOption> =
        serde_json::from_value(params["options"].clone()).expect("ACP permission options");
    assert_eq!(options[0].option_id.to_string(), "allow");
    // A wrong id is not found; the right one proceeds.
    let answer = |request: &str| {
        api.typed().permission_respond(session.clone(), request.to_owned(), Some("allow".into()))
    };
    let wrong = refused("a wrong request id", answer("999")).await;
    assert_eq!(wrong.kind, ErrorKind::NotFound);
    ok("task.session.permission.respond", answer(&request_id)).await;
    let seen = until(&mut events, turn_ended).await;
    assert!(seen.iter().any(|e| matches!(&e.kind,
        EventKind::ToolCallUpdate { update } if update["status"] == "completed")));
    assert!(chunks(&seen).concat().contains("the tool ran"));
    assert_eq!(
        kinds(&api, &session).await,
        [
            EntryType::UserMessage,
            EntryType::ToolCall,
            EntryType::ToolResult,
            EntryType::AgentMessage
        ]
    );
}

#[tokio::test]
async fn cancel_ends_a_slow_turn_and_the_session_is_ready_again() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("c")).await;
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    prompt(&api, &session, "/sleep 600000").await;
    until(&mut events, |e| is_state(e, SessionState::Running)).await;
    // A prompt meanwhile is queued behind the turn (no longer refused); the cancel halts
    // the queue, and a prompt after it starts at once.
    let queued = api.prompt_or_queue(&session, "again").await.unwrap();
    assert!(queued.queued, "{queued:?}");
    ok("task.session.cancel", api.typed().session_cancel(session.clone())).await;
    let seen = until(&mut events, turn_ended).await;
    assert_eq!(stop_reason(seen.last().unwrap()), Some("cancelled"));
    until(&mut events, |e| is_state(e, WAITING)).await;
    prompt(&api, &session, "after the cancel").await;
    let seen = until(&mut events, turn_ended).await;
    assert_eq!(stop_reason(seen.last().unwrap()), Some("end_turn"));
}

/// An agent that answers a cancelled prompt with `end_turn` (opencode)
/// still has its turn recorded as cancelled.
#[tokio::test]
async fn a_cancelled_turn_answered_end_turn_is_recorded_cancelled() {
    let profile = "id = \"opencode-like\"\ncommand = [\"mock-agent\", \"--cancel-as-end-turn\"]\nprotocol = \"acp\"\n";
    let daemon = Daemon::start_with_profiles(&[], &[("oc.toml", profile)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("opencode-like", &daemon.workspace("o")).await;
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    prompt(&api, &session, "/sleep 600000").await;
    until(&mut events, |e| is_state(e, SessionState::Running)).await;
    ok("task.session.cancel", api.typed().session_cancel(session.clone())).await;
    let seen = until(&mut events, turn_ended).await;
    assert_eq!(stop_reason(seen.last().unwrap()), Some("cancelled"), "{:?}", seen.last());
    // Only a cancel makes end_turn read as cancelled.
    prompt(&api, &session, "next").await;
    let seen = until(&mut events, turn_ended).await;
    assert_eq!(stop_reason(seen.last().unwrap()), Some("end_turn"));
}

#[tokio::test]
async fn an_agent_crash_fails_the_turn_and_leaves_the_session_recoverable() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("x")).await;
    // Everything this session runs (agentctl, the guard, the agent) names its directory.
    let session_dir = daemon.session_dir(&session);
    let mut pids = Daemon::processes_mentioning(&session_dir);
    pids.extend(Daemon::processes_mentioning(&daemon.root.path().join(".mock-agent")));
    assert!(pids.len() >= 2, "agentctl and the agent are running: {pids:?}");
    let pidfds: Vec<_> =
        pids.iter().filter_map(|&pid| agentctl::process::PidFd::open(pid).ok()).collect();

    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    prompt(&api, &session, "/crash 9").await;
    let seen = until(&mut events, turn_ended).await;
    let Some(EventKind::TurnEnded { state, error: Some(error), .. }) = seen.last().map(|e| &e.kind)
    else {
        panic!("a failed turn with its error: {:?}", seen.last())
    };
    assert_eq!(*state, TurnState::Failed);
    assert!(error.contains("exit code 9") && error.contains("crashing mid-turn"), "{error}");
    until(&mut events, |e| is_state(e, WAITING)).await;
    let after_crash = api.status(&session).await;
    assert_eq!(after_crash.state, WAITING);
    assert!(!after_crash.is_agent_running);
    assert!(after_crash.needs_resume);
    assert!(after_crash.is_resumable);
    assert!(after_crash.error.unwrap().contains("exit code 9"));
    // No orphan: every process of the session is gone.
    for pidfd in &pidfds {
        within("a process of the crashed session to exit", pidfd.exited()).await.unwrap();
    }
}

#[tokio::test]
async fn a_subscriber_that_reconnects_misses_nothing() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("r")).await;
    let after = api.status(&session).await.last_event_seq;
    let first = daemon.api().await;
    let mut events = first.subscribe(&session, after).await;
    prompt(&api, &session, "/stream 2000").await;
    let mut seen = Vec::new();
    while seen.len() < 500 {
        seen.push(next(&mut events).await);
    }
    drop(events);
    drop(first);
    let second = daemon.api().await;
    let mut events = second.subscribe(&session, seen.last().unwrap().seq).await;
    seen.extend(until(&mut events, turn_ended).await);
    let seqs: Vec<u64> = seen.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (after + 1..=after + seqs.len() as u64).collect::<Vec<_>>(),
        "gapless, once each"
    );
    let texts = chunks(&seen);
    assert_eq!(texts.len(), 2000);
    assert!(
        texts.iter().enumerate().all(|(idx, text)| text.ends_with(&format!("[{}/2000]", idx + 1)))
    );
}

#[tokio::test]
async fn the_same_flow_works_with_elizacp() {
    assert!(
        tether_tests::find_program("elizacp").is_some(),
        "elizacp is not installed: scripts/test.sh installs it"
    );
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let agents = ok("agents.list", api.typed().agents_list()).await;
    let eliza = agents.iter().find(|a| a.id == "eliza").unwrap();
    assert!(eliza.available, "{eliza:?}");
    let session = api.ready_session("eliza", &daemon.workspace("e")).await;
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    prompt(&api, &session, "Hello, I am feeling sad today.").await;
    let seen = until(&mut events, turn_ended).await;
    assert_eq!(stop_reason(seen.last().unwrap()), Some("end_turn"));
    assert!(!chunks(&seen).concat().trim().is_empty());
    assert_eq!(kinds(&api, &session).await, [EntryType::UserMessage, EntryType::AgentMessage]);
    // elizacp ignores EOF: the stop takes the SIGTERM step, and nothing is left running.
    let pids = Daemon::processes_mentioning(&daemon.session_dir(&session));
    let pidfds: Vec<_> =
        pids.iter().filter_map(|&pid| agentctl::process::PidFd::open(pid).ok()).collect();
    ok("task.session.stop", api.typed().session_stop(session.clone())).await;
    for pidfd in &pidfds {
        within("the eliza session's processes to exit", pidfd.exited()).await.unwrap();
    }
    assert_eq!(api.status(&session).await.state, SessionState::Completed);
}

#[tokio::test]
async fn bad_requests_get_the_right_kind() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let unknown = "01900000-0000-7000-8000-000000000000";
    let cases = [
        ("task.session.status", json!({"session_id": unknown}), ErrorKind::NotFound, None),
        (
            "task.session.status",
            json!({"session_id": "../etc"}),
            ErrorKind::InvalidParams,
            Some("session_id"),
        ),
        ("task.session.status", json!({}), ErrorKind::InvalidParams, Some("session_id")),
        (
            "task.session.status",
            json!({"session_id": 7}),
            ErrorKind::InvalidParams,
            Some("session_id"),
        ),
        (
            "task.session.prompt",
            json!({"session_id": unknown, "prompt": "x"}),
            ErrorKind::NotFound,
            None,
        ),
        ("task.get", json!({"task_id": unknown}), ErrorKind::NotFound, None),
        ("task.create", json!({"title": ""}), ErrorKind::InvalidParams, Some("title")),
        (
            "task.create",
            json!({"title": "x", "colour": "red"}),
            ErrorKind::InvalidParams,
            Some("colour"),
        ),
        ("task.session.list", json!({"state": "FAILD"}), ErrorKind::InvalidParams, Some("state")),
        (
            "task.session.history",
            json!({"session_id": unknown, "limit": -1}),
            ErrorKind::InvalidParams,
            Some("limit"),
        ),
        ("no.such.method", json!({}), ErrorKind::NoSuchMethod, None),
        // Runtimes are an open set, checked against those the daemon has.
        (
            "task.session.create",
            json!({"task_id": unknown, "agent_profile_id": "mock", "workspace_path": "/usr", "runtime": "vm"}),
            ErrorKind::InvalidParams,
            Some("runtime"),
        ),
        // Placement labels on a runtime that does not place.
        (
            "task.session.create",
            json!({"task_id": unknown, "agent_profile_id": "mock", "workspace_path": "/usr", "labels": {"gpu": "yes"}}),
            ErrorKind::InvalidParams,
            Some("labels"),
        ),
    ];
    // Every refused param is named in `data.field`.
    for (method, params, kind, field) in cases {
        let error = api.call_raw(method, params.clone()).await.unwrap_err();
        assert_eq!(
            (error.kind, error.field.as_deref()),
            (kind, field),
            "{method} {params}: {error:?}"
        );
    }
    let task = ok("task.create", api.typed().task_create("t".into(), None)).await;
    let workspace = daemon.workspace("w");
    let create = |profile: &str, path: &str| {
        let call =
            Create::new(&task.id, profile, Some(std::path::Path::new(path))).send(api.typed());
        refused("task.session.create", call)
    };
    let here = workspace.to_str().unwrap();
    let error = create("nope", here).await;
    assert_eq!((error.kind, error.field.as_deref()), (ErrorKind::NotFound, None));
    let error = create("mock", "/no/such/dir").await;
    assert_eq!(
        (error.kind, error.field.as_deref()),
        (ErrorKind::InvalidParams, Some("workspace_path"))
    );
    let error = create("mock", "relative/dir").await;
    assert_eq!(
        (error.kind, error.field.as_deref()),
        (ErrorKind::InvalidParams, Some("workspace_path"))
    );
    assert_eq!(create("gemini", here).await.kind, ErrorKind::AgentUnavailable);
    // A terminal session refuses prompts with `conflict`.
    let session = api.ready_session("mock", &workspace).await;
    ok("task.session.stop", api.typed().session_stop(session.clone())).await;
    let error = api.prompt(&session, "x").await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::Conflict);
    let error = refused("a second stop", api.typed().session_stop(session.clone())).await;
    assert_eq!(error.kind, ErrorKind::Conflict);
    let stopped = api.status(&session).await;
    assert_eq!((stopped.is_resumable, stopped.needs_resume), (false, false));
    // Unknown methods are JSON-RPC "method not found".
    assert_eq!(api.call_raw("task.nope", json!({})).await.unwrap_err().code, -32601);
    // Delete removes records and files.
    ok("task.session.delete", api.typed().session_delete(session.clone(), None, None)).await;
    assert!(!daemon.session_dir(&session).exists());
    let error = refused("status of a deleted session", api.typed().session_status(session)).await;
    assert_eq!(error.kind, ErrorKind::NotFound);
}

#[tokio::test]
async fn cross_origin_websockets_are_refused() {
    let daemon = Daemon::start(&["--allow-origin", "http://localhost:5173"]).await;
    assert!(Api::connect(&daemon.url, &[("Origin", "http://evil.example")]).await.is_err());
    let allowed = Api::connect(&daemon.url, &[("Origin", "http://localhost:5173")])
        .await
        .expect("an allowed origin connects");
    ok("task.list", allowed.typed().task_list()).await;
    ok("task.list", daemon.api().await.typed().task_list()).await;
}

#[tokio::test]
async fn fifty_sessions_in_parallel_each_complete_a_turn() {
    let daemon = Daemon::start(&[]).await;
    let mut runs = Vec::new();
    for n in 0..50 {
        let url = daemon.url.clone();
        let workspace = daemon.workspace(&format!("p{n}"));
        runs.push(tokio::spawn(async move {
            let api = Api::connect(&url, &[]).await.unwrap();
            let session = api.ready_session("mock", &workspace).await;
            let after = api.status(&session).await.last_event_seq;
            let mut events = api.subscribe(&session, after).await;
            prompt(&api, &session, &format!("/stream 3\nsession {n}")).await;
            let seen = until(&mut events, turn_ended).await;
            (n, stop_reason(seen.last().unwrap()).map(str::to_owned), chunks(&seen).concat())
        }));
    }
    for run in runs {
        let (n, stop_reason, reply) = run.await.unwrap();
        assert_eq!(stop_reason.as_deref(), Some("end_turn"));
        assert!(reply.contains(&format!("session {n} [1/3]")), "{reply}");
    }
}

#[tokio::test]
async fn the_cli_prints_plain_specific_lines() {
    let daemon = Daemon::start(&[]).await;
    let workspace = daemon.workspace("cli");
    let (code, out, _) = daemon.cli(&["task", "create", "from the cli"]).await;
    assert_eq!(code, 0);
    let task = out
        .trim()
        .strip_prefix("task ")
        .and_then(|rest| rest.strip_suffix(" created"))
        .expect(&out)
        .to_owned();
    let (code, out, err) = daemon
        .cli(&[
            "session",
            "start",
            "--task",
            &task,
            "--agent",
            "mock",
            "--workspace",
            workspace.to_str().unwrap(),
            "--quiet",
        ])
        .await;
    assert_eq!(code, 0, "{err}");
    let session = out.trim().to_owned();
    let (code, out, _) = daemon.cli(&["prompt", &session, "/stream 3\nhi from the cli"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("you said: hi from the cli [1/3] [2/3] [3/3]"), "{out}");
    assert!(out.trim_end().ends_with("[turn completed: end_turn]"), "{out}");
    let (_, out, _) = daemon.cli(&["status", &session]).await;
    assert!(
        out.contains("state: WAITING_FOR_INPUT") && out.contains("resume_reason: agent_running"),
        "{out}"
    );
    let (_, out, _) = daemon.cli(&["history", &session]).await;
    assert!(
        out.contains("[1] user_message: /stream 3")
            && out.contains("[2] agent_message: mock-agent"),
        "{out}"
    );
    let (_, out, _) = daemon.cli(&["sessions", "list"]).await;
    assert!(out.contains(&session) && out.contains("WAITING_FOR_INPUT"), "{out}");
    let unknown = "01900000-0000-7000-8000-000000000000";
    let (code, _, err) = daemon.cli(&["status", unknown]).await;
    assert_eq!((code, err.trim()), (4, format!("not found: session {unknown} not found").as_str()));
    let (code, out, _) = daemon.cli(&["stop", &session]).await;
    assert_eq!((code, out.trim()), (0, format!("session {session} stopped").as_str()));
    let (code, _, err) = daemon.cli(&["prompt", &session, "more"]).await;
    assert_eq!(code, 5);
    assert!(err.starts_with("conflict: "), "{err}");
    let (code, out, _) = daemon.cli(&["sessions", "delete", &session]).await;
    assert_eq!((code, out.trim()), (0, format!("session {session} deleted").as_str()));
    // Nothing listens on a port we just freed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (code, _, err) =
        tether_tests::daemon::cli(&format!("ws://127.0.0.1:{port}"), &["status", &session]).await;
    assert_eq!(code, 3);
    assert!(err.starts_with(&format!("server not running at ws://127.0.0.1:{port}")), "{err}");
}

#[tokio::test]
async fn an_agent_that_never_answers_initialize_fails_the_launch_with_its_stderr() {
    let profile = "id = \"hang\"\ncommand = [\"mock-agent\", \"--hang-on\", \"initialize\"]\nprotocol = \"acp\"\n[process]\ninit_timeout_ms = 300\n";
    let daemon = Daemon::start_with_profiles(&[], &[("hang.toml", profile)]).await;
    let api = daemon.api().await;
    let session = api.create_session("hang", &daemon.workspace("h")).await.unwrap();
    let mut events = api.subscribe(&session, 0).await;
    let (state, error) = tether_tests::daemon::settled(&mut events).await;
    assert_eq!(state, SessionState::Failed);
    assert!(error.contains("did not answer initialize within 300 ms"), "{error}");
    assert!(
        error.contains("not answering initialize as configured"),
        "the stderr tail is included: {error}"
    );
    let failed = api.status(&session).await;
    let task = ok("task.get", api.typed().task_get(failed.task_id.clone())).await;
    assert_eq!(task.task.state, "FAILED");
    assert_eq!((failed.state, failed.is_resumable), (SessionState::Failed, true));
}

/// `serve --help` prints the usage instead of failing.
#[tokio::test]
async fn serve_help_prints_the_usage() {
    let output = tokio::process::Command::new(tether_tests::workspace_bin("supervisor"))
        .args(["serve", "--help"])
        .output()
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(
        out.contains("Usage: supervisor serve [OPTIONS]") && out.contains("--auth-token-file"),
        "{out}"
    );
}

/// `agents` does not call an agent available when its credentials are
/// nowhere, and lists a user profile that does not load, with where and why.
/// A profile whose agent runs in a container was judged against this host's PATH: its
/// command lives in the image, so it is listed available (and a host profile missing its
/// program still is not).
#[tokio::test]
async fn a_container_agents_command_is_not_looked_for_on_the_hosts_path() {
    let boxed = "id = \"boxed\"\ncommand = [\"tether-test-only-in-the-image\"]\nprotocol = \"acp\"\nruntime = \"docker\"\n[docker]\nimage = \"tether-test-none:latest\"\n";
    let host = "id = \"host\"\ncommand = [\"tether-test-only-in-the-image\"]\nprotocol = \"acp\"\n";
    let daemon =
        Daemon::start_with_profiles(&[], &[("boxed.toml", boxed), ("host.toml", host)]).await;
    let api = daemon.api().await;
    let agents = ok("agents.list", api.typed().agents_list()).await;
    let find = |id: &str| agents.iter().find(|a| a.id == id).cloned().expect(id);
    let boxed = find("boxed");
    assert!(boxed.available, "the image has it: {boxed:?}");
    let host = find("host");
    assert!(!host.available, "{host:?}");
    assert!(host.reasons[0].contains("was not found on PATH"), "{host:?}");
}

#[tokio::test]
async fn agents_lists_missing_credentials_and_invalid_profiles() {
    let needs_key = "id = \"keyed\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n[credentials]\nenv = [\"TETHER_TEST_NO_SUCH_KEY\"]\nfiles = [\".tether-test-none/auth.json\"]\n";
    let broken = "id = \"broken\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n[session]\nnativ_resume = true\n";
    let daemon =
        Daemon::start_with_profiles(&[], &[("keyed.toml", needs_key), ("broken.toml", broken)])
            .await;
    let api = daemon.api().await;
    let agents = ok("agents.list", api.typed().agents_list()).await;
    let find = |id: &str| agents.iter().find(|a| a.id == id).cloned();
    let keyed = find("keyed").expect("the keyed profile");
    assert!(!keyed.available, "{keyed:?}");
    let reason = &keyed.reasons[0];
    assert!(
        reason.contains("needs credentials: set TETHER_TEST_NO_SUCH_KEY")
            && reason.contains("~/.tether-test-none/auth.json"),
        "{reason}"
    );
    let broken = find("broken.toml").expect("the invalid file is listed");
    assert_eq!((broken.invalid, broken.available), (true, false));
    let error = &broken.reasons[0];
    assert!(error.contains("broken.toml:5:1: session.nativ_resume"), "{error}");
    let (code, out, _) = daemon.cli(&["agents"]).await;
    assert_eq!(code, 0);
    assert!(
        out.lines().any(|l| l.starts_with("broken.toml") && l.contains("invalid profile: ")),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l.starts_with("keyed") && l.contains("needs credentials")),
        "{out}"
    );
}

/// Claude-agent-acp run as root refuses its session unless
/// IS_SANDBOX=1 (the Claude CLI under it exits with code 1). A profile's `root_env` says
/// so up front — the agent is unavailable, naming the variable — instead of a launch that
/// fails obscurely; with the variable set it starts. (The mock stands in: run as root with
/// `--require-env` it exits silently with code 1 unless the variable is set.)
#[tokio::test]
async fn an_agent_that_needs_a_sandbox_as_root_says_so() {
    let root = nix::unistd::geteuid().is_root();
    let flag = if root { ", \"--require-env\", \"TETHER_TEST_SANDBOX=1\"" } else { "" };
    let profile = format!(
        "id = \"sandboxed\"\ncommand = [\"mock-agent\"{flag}]\nprotocol = \"acp\"\n\
         [process]\nroot_env = {{ TETHER_TEST_SANDBOX = \"1\" }}\n"
    );
    let profiles = [("sandboxed.toml", profile.as_str())];
    let daemon = Daemon::start_with_env(&[], &profiles, &[("TETHER_TEST_SANDBOX", "")]).await;
    let api = daemon.api().await;
    let created = api.create_session("sandboxed", &daemon.workspace("s")).await;
    if root {
        let refused = created.expect_err("unavailable as root without the variable");
        assert_eq!(refused.kind, ErrorKind::AgentUnavailable, "{refused:?}");
        assert!(
            refused.message.contains("run as root, it needs TETHER_TEST_SANDBOX=1"),
            "{refused:?}"
        );
        let agents = ok("agents.list", api.typed().agents_list()).await;
        let listed = agents.iter().find(|a| a.id == "sandboxed").unwrap();
        assert!(!listed.available, "{listed:?}");
        assert!(listed.reasons[0].contains("TETHER_TEST_SANDBOX=1"));
    } else {
        println!("not root: root_env does not apply, and the session opens");
        created.expect("not root: nothing needed");
    }
    drop(api);
    drop(daemon);
    let mut daemon = Daemon::start_with_env(&[], &profiles, &[("TETHER_TEST_SANDBOX", "1")]).await;
    let api = daemon.api().await;
    let session = api.ready_session("sandboxed", &daemon.workspace("s")).await;
    assert!(api.ask(&session, "hello").await.contains("hello"));
    if !root {
        return;
    }
    // The supervisor restarted (as root) without the variable, the agent gone: a resume is
    // refused up front, naming it, and the session stays resumable — not a FAILED session
    // whose agent "exited (exit code 1)".
    ok("sessions.stop_all", api.typed().stop_all()).await;
    drop(api);
    daemon.terminate().await;
    daemon.restart_with_env(&[("TETHER_TEST_SANDBOX", "")]).await;
    let api = daemon.api().await;
    let refused = api.resume(&session).await.unwrap_err();
    assert_eq!(refused.kind, ErrorKind::AgentUnavailable, "{refused:?}");
    assert!(refused.message.contains("TETHER_TEST_SANDBOX=1"), "{refused:?}");
    let status = api.status(&session).await;
    assert_eq!((status.state, status.is_resumable), (WAITING, true), "{status:?}");
}

/// The daemon's token could only be given in argv, where
/// `ps` shows it. It now also comes from TETHER_AUTH_TOKEN or a file only its owner can
/// read (a looser file is refused, saying so); either way it is out of the command line
/// and still enforced.
#[tokio::test]
async fn the_daemons_token_can_stay_out_of_its_command_line() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "from-the-file-0123456789\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let refused = tokio::process::Command::new(tether_tests::workspace_bin("supervisor"))
        .args(["serve", "--listen", "127.0.0.1:0", "--home"])
        .arg(dir.path().join("home"))
        .arg("--auth-token-file")
        .arg(&file)
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a world-readable token file is refused");
    assert!(err.contains("readable by others (mode 644); chmod 600 it"), "{err}");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();

    let by_file = ["--auth-token-file", file.to_str().unwrap()];
    token_is_enforced_and_unseen(Daemon::start(&by_file).await, "from-the-file-0123456789").await;
    let by_env = [("TETHER_AUTH_TOKEN", "from-the-env-0123456789")];
    let daemon = Daemon::start_with_env(&[], &[], &by_env).await;
    // Nor does it reach the sidecar or the agent a session starts (an agent that prints its
    // environment would hand it to its model).
    let api = Api::connect(&daemon.url, &[("Authorization", "Bearer from-the-env-0123456789")])
        .await
        .unwrap();
    let session = api.ready_session("mock", &daemon.workspace("t")).await;
    let mut processes = Daemon::processes_mentioning(&daemon.session_dir(&session));
    processes.extend(Daemon::processes_mentioning(&daemon.root.path().join(".mock-agent")));
    assert!(processes.len() >= 2, "agentctl and the agent: {processes:?}");
    for pid in processes {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&environ).contains("from-the-env"),
            "process {pid} has the daemon's token in its environment"
        );
    }
    drop(api);
    token_is_enforced_and_unseen(daemon, "from-the-env-0123456789").await;
}

async fn token_is_enforced_and_unseen(daemon: Daemon, token: &str) {
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", daemon.pid().unwrap())).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(!cmdline.contains(token), "the token is not in argv: {cmdline}");
    // Refused, and said so: not "server not running" (exit code 3), which it is not.
    let (code, _, err) = daemon.cli(&["agents"]).await;
    assert_eq!(code, 6, "no token, no answer ({token}): {err}");
    assert!(err.starts_with("unauthorized: ") && err.contains("wants a token"), "{err}");
    let (code, _, err) = daemon.cli(&["--token", "wrong", "agents"]).await;
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("refused this token"), "{err}");
    let (code, out, err) = daemon.cli(&["--token", token, "agents"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("mock"), "{out}");
}

/// `supervisor history S | head` panicked on the broken
/// pipe. A reader that goes away now ends the command quietly (SIGPIPE, as `cat` does).
#[tokio::test]
async fn a_client_command_piped_into_a_reader_that_quits_ends_quietly() {
    use tokio::io::AsyncBufReadExt;
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("p")).await;
    for _ in 0..3 {
        api.ask(&session, "/stream 3000\na long reply").await;
    }
    let mut child = tokio::process::Command::new(tether_tests::workspace_bin("supervisor"))
        .args(["--url", &daemon.url, "history", &session])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next_line().await.unwrap().expect("a first line");
    assert!(first.starts_with("[1] user_message"), "{first}");
    drop(lines);
    let output = tether_tests::within("the CLI", child.wait_with_output()).await.unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(!err.contains("panicked"), "{err}");
    use std::os::unix::process::ExitStatusExt;
    assert!(
        output.status.success() || output.status.signal() == Some(nix::libc::SIGPIPE),
        "{:?}",
        output.status
    );
}

/// `task.session.subscribe_batch` is the same stream as `task.session.subscribe`, in
/// arrays: every event once, in order, from any point, backlog and live alike.
#[tokio::test]
async fn the_batched_subscription_carries_the_same_events_as_the_plain_one() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("batch")).await;
    let start = api.status(&session).await.last_event_seq;
    let mut plain = api.subscribe(&session, start).await;
    let mut batches = api.subscribe_batches(&session, start).await;
    api.prompt(&session, "/stream 2000").await.unwrap();
    let expected = tether_tests::daemon::until(&mut plain, turn_ended).await;
    let mut got: Vec<SessionEvent> = Vec::new();
    let mut sizes: Vec<usize> = Vec::new();
    while !got.iter().any(turn_ended) {
        let batch = within("a batch", batches.next()).await.expect("open").expect("parses").0;
        assert!(!batch.is_empty() && batch.len() <= protocol::api::MAX_BATCH_EVENTS);
        sizes.push(batch.len());
        got.extend(batch);
    }
    assert!(sizes.iter().sum::<usize>() == got.len());
    // What came after the turn's end in the same batch is not compared.
    got.truncate(got.iter().position(turn_ended).unwrap() + 1);
    let seqs = |events: &[SessionEvent]| events.iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(seqs(&got), seqs(&expected), "the same events, once each, in order");
    assert_eq!(serde_json::to_value(&got).unwrap(), serde_json::to_value(&expected).unwrap());
    // From the backlog, at any point: what is on disk comes in full batches.
    let mut replay = api.subscribe_batches(&session, start + 5).await;
    let first = within("a batch", replay.next()).await.expect("open").expect("parses").0;
    assert_eq!(first[0].seq, start + 6);
    assert_eq!(first.len(), protocol::api::MAX_BATCH_EVENTS, "a full batch from the backlog");
    assert_eq!(seqs(&first), seqs(&expected[5..5 + protocol::api::MAX_BATCH_EVENTS]));
}

/// The daemon's open files under a session's directory (resolved from /proc).
fn open_files_under(pid: u32, dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter(|target| target.starts_with(dir))
        .collect()
}

/// A live session costs the daemon its connection and its event log's active segment, no
/// more: the history is appended through short-lived handles (≤ 2 descriptors a
/// live session).
#[tokio::test]
async fn a_live_session_holds_only_its_event_log_open() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("fds")).await;
    let reply = api.ask(&session, "/stream 20\nhello").await;
    assert!(reply.contains("you said: hello"), "{reply}");
    // The turn's history is written (its entries are on disk) and nothing holds it.
    assert!(api.history(&session).await.len() >= 2);
    // The actor syncs the history (through a handle of its own) while it ends the turn,
    // which a subscriber can see end first: a command the actor answers afterwards (a
    // cancel with no turn, refused) marks that it is done.
    let refusal =
        refused("a cancel between turns", api.typed().session_cancel(session.clone())).await;
    assert_eq!(refusal.kind, ErrorKind::InvalidState);
    // And the turn's snapshot, taken beside the actor, has read the history and let go.
    // (This subscription stays open: its reader is the segment's second descriptor.)
    let mut events = api.subscribe(&session, 0).await;
    until(&mut events, |event| {
        matches!(
            event.kind,
            EventKind::SnapshotTaken { trigger: protocol::api::SnapshotTrigger::TurnComplete, .. }
        )
    })
    .await;
    let pid = daemon.pid().expect("the daemon runs");
    let open = open_files_under(pid, &daemon.session_dir(&session));
    let active = daemon.session_dir(&session).join("events/events-00000000000000000001.jsonl");
    assert!(
        open.len() <= 2 && open.iter().all(|path| *path == active),
        "only the event log's active segment (written, and read by our subscription): {open:?}"
    );
    drop(events);
    assert!(api.status(&session).await.is_agent_running);
}

/// Retention: an event log keeps its newest bytes, drops whole old segments,
/// refuses a subscription from before what it keeps (saying from where to go on), keeps
/// serving the rest — across a restart too — while the history keeps the conversation.
#[tokio::test]
async fn the_event_log_keeps_its_newest_events_and_says_what_it_dropped() {
    // A long turn is recorded whole first (nothing dropped under a subscriber that lags:
    // one that falls behind what the log keeps is cut off, as documented)…
    let mut daemon = Daemon::start(&["--event-log-segment-bytes", "16384"]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("retain")).await;
    let reply = api.ask(&session, "/stream 3000\nlong").await;
    assert!(reply.ends_with("[3000/3000]"), "{}", &reply[reply.len().saturating_sub(80)..]);
    let log_bytes = |dir: &std::path::Path| -> u64 {
        std::fs::read_dir(dir).unwrap().flatten().map(|f| f.metadata().unwrap().len()).sum()
    };
    let events_dir = daemon.session_dir(&session).join("events");
    assert!(log_bytes(&events_dir) > 65536, "the turn's events: {}", log_bytes(&events_dir));
    // …then the daemon keeps 64 KiB: the next append drops the oldest segments.
    daemon.kill().await;
    let limits = ["--event-log-segment-bytes", "16384", "--event-log-retain-bytes", "65536"];
    daemon.restart_with_args(&limits).await;
    let api = daemon.api().await;
    api.resume(&session).await.unwrap();
    assert!(api.ask(&session, "hello again").await.contains("hello again"));
    assert!(log_bytes(&events_dir) <= 65536, "bounded: {}", log_bytes(&events_dir));
    refuses_the_dropped_and_serves_the_kept(&api, &session).await;
    daemon.kill().await;
    daemon.restart().await;
    let api = daemon.api().await;
    refuses_the_dropped_and_serves_the_kept(&api, &session).await;
    // The conversation itself is whole.
    let history = api.history(&session).await;
    assert!(history.iter().any(|entry| entry.content.ends_with("[3000/3000]")));
}

async fn refuses_the_dropped_and_serves_the_kept(api: &Api, session: &str) {
    let error = refused(
        "a subscription from the start",
        api.typed().session_subscribe(session.to_owned(), Some(0)),
    )
    .await;
    assert_eq!((error.kind, error.field.as_deref()), (ErrorKind::InvalidParams, Some("after_seq")));
    // What is kept is served, to its end.
    let last = api.status(session).await.last_event_seq;
    let mut events = api.subscribe(session, last - 50).await;
    assert_eq!(next(&mut events).await.seq, last - 49);
}

/// Found by the restart bench: the daemon printed "serving" before it caught SIGTERM, so a
/// SIGTERM right after the line killed it (exit by signal) instead of stopping it cleanly.
/// Each of these restarts is SIGTERMed the moment it says it serves.
#[tokio::test]
async fn a_sigterm_right_after_serving_is_a_clean_stop() {
    let mut daemon = Daemon::start(&[]).await;
    daemon.terminate().await;
    for _ in 0..30 {
        daemon.restart().await;
        // `terminate` asserts the exit was clean (status 0), not death by the signal.
        daemon.terminate().await;
    }
}

/// A session stopped while it has no actor — its agent
/// let go by stop-all, then the daemon restarted — says so on its stream like every other
/// state change, so a follower learns it ended. (Before, only its row changed.)
#[tokio::test]
async fn a_session_stopped_without_an_actor_publishes_its_end() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("w")).await;
    api.ask(&session, "hello").await;
    let (code, _, err) = daemon.cli(&["stop-all"]).await;
    assert_eq!(code, 0, "{err}");
    drop(api);
    daemon.kill().await;
    daemon.restart().await;
    let api = daemon.api().await;
    let mut events = api.subscribe_at_end(&session).await;
    ok("stop", api.typed().session_stop(session.clone())).await;
    let seen = until(&mut events, |event| is_state(event, SessionState::Completed)).await;
    assert!(is_state(seen.last().unwrap(), SessionState::Completed));
    assert_eq!(api.status(&session).await.state, SessionState::Completed);
}
