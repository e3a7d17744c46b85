//! The CLI people expect (clap), and the API's edge. One test per verified
//! problem; the API calls here go through the typed client (`protocol::api::ApiClient`).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Stdio;

use protocol::api::{ApiClient, EventKind, SessionEvent, SessionState, SessionSummary, TurnState};
use protocol::errors::{ErrorData, ErrorKind};
use tether_tests::daemon::{Daemon, cli};
use tether_tests::{within, workspace_bin};
use tokio::io::{AsyncBufReadExt, BufReader};

/// A URL nothing listens on.
fn dead_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("ws://127.0.0.1:{port}")
}

/// The next event of `events` for which `pred` holds.
async fn wait_for(
    events: &mut jsonrpsee::core::client::Subscription<SessionEvent>,
    mut pred: impl FnMut(&SessionEvent) -> bool,
) -> SessionEvent {
    loop {
        let event = within("an event", events.next()).await.expect("open").expect("an event");
        if pred(&event) {
            return event;
        }
    }
}

#[tokio::test]
async fn options_are_not_taken_from_prompt_text_and_help_needs_no_server() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("o")).await;
    // Words that look like options after SESSION are the prompt, sent as typed.
    let (code, out, err) =
        daemon.cli(&["prompt", &session, "--url", "nowhere", "--quiet", "-h", "--token"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("you said: --url nowhere --quiet -h --token"), "{out}");
    // `--quiet` where it means nothing is a usage error, not silently dropped.
    let (code, _, err) = daemon.cli(&["status", &session, "--quiet"]).await;
    assert_eq!(code, 2, "{err}");
    // Client options given to the daemon are refused, not ignored.
    let (code, _, err) = daemon.cli(&["serve", "--listen", "127.0.0.1:0"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--url and --token are for client commands"), "{err}");
    // Help never needs a daemon.
    let nowhere = dead_url();
    for args in [
        &["session", "--help"][..],
        &["session", "start", "--help"],
        &["prompt", "--help"],
        &["permission", "respond", "--help"],
        &["--help"],
    ] {
        let (code, out, err) = cli(&nowhere, args).await;
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(out.contains("Usage: supervisor"), "{args:?}: {out}");
    }
    let (_, out, _) = cli(&nowhere, &["stop", "--help"]).await;
    assert!(out.contains("FOR GOOD") && out.contains("cannot be resumed"), "{out}");
    let (_, out, _) = cli(&nowhere, &["--help"]).await;
    for command in ["cancel", "permission", "follow", "sessions", "Exit codes"] {
        assert!(out.contains(command), "{command} in {out}");
    }
}

#[tokio::test]
async fn a_non_utf8_argument_is_a_clear_error_not_a_panic() {
    let daemon = Daemon::start(&[]).await;
    let bad = OsStr::from_bytes(b"/tmp/caf\xe9");
    let run = |args: Vec<&OsStr>| {
        tokio::process::Command::new(workspace_bin("supervisor"))
            .arg("--url")
            .arg(&daemon.url)
            .args(args)
            .stdin(Stdio::null())
            .output()
    };
    let output = within(
        "the CLI",
        run(vec![
            "session".as_ref(),
            "start".as_ref(),
            "--agent".as_ref(),
            "mock".as_ref(),
            "--new-task".as_ref(),
            "t".as_ref(),
            "--workspace".as_ref(),
            bad,
        ]),
    )
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(err.contains("not valid UTF-8") && !err.contains("panicked"), "{err}");
    let output = within("the CLI", run(vec!["status".as_ref(), bad])).await.unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(err.contains("UTF-8") && !err.contains("panicked"), "{err}");
}

#[tokio::test]
async fn sessions_list_filters_by_status_task_and_agent() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let kept = api.ready_session("mock", &daemon.workspace("a")).await;
    let stopped = api.ready_session("mock", &daemon.workspace("b")).await;
    let (code, _, err) = daemon.cli(&["stop", &stopped]).await;
    assert_eq!(code, 0, "{err}");
    let list = |args: Vec<&'static str>| {
        let daemon = &daemon;
        async move {
            let mut full = vec!["sessions", "list", "--json"];
            full.extend(args);
            let (code, out, err) = daemon.cli(&full).await;
            assert_eq!(code, 0, "{full:?}: {err}");
            let sessions: Vec<SessionSummary> = serde_json::from_str(&out).expect(&out);
            sessions.into_iter().map(|s| s.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(list(vec!["--status", "COMPLETED"]).await, vec![stopped.clone()]);
    assert_eq!(list(vec!["--status", "WAITING_FOR_INPUT"]).await, vec![kept.clone()]);
    assert!(list(vec!["--status", "FAILED"]).await.is_empty());
    assert_eq!(list(vec!["--agent", "mock"]).await.len(), 2);
    assert!(list(vec!["--agent", "nosuch"]).await.is_empty());
    let task = api.typed().session_status(kept.clone()).await.unwrap().task_id;
    let (code, out, _) = daemon.cli(&["sessions", "list", "--task", &task]).await;
    assert_eq!(code, 0);
    assert!(out.contains(&kept) && !out.contains(&stopped), "{out}");
    let (code, _, err) = daemon.cli(&["sessions", "list", "--status", "FAILD"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("FAILED"), "the valid values are listed: {err}");
}

#[tokio::test]
async fn cancel_and_permission_answers_from_the_cli() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let typed = api.typed();
    let session = api.ready_session("mock", &daemon.workspace("p")).await;
    for (answer, reply) in [("allow", "the tool ran"), ("deny", "the tool was not allowed")] {
        let last = typed.session_status(session.clone()).await.unwrap().last_event_seq;
        let mut events = typed.session_subscribe(session.clone(), Some(last)).await.unwrap();
        let turn = typed.session_prompt(session.clone(), "/permission\nask".into()).await.unwrap();
        let turn_id_started = turn.turn_id.clone().expect("a turn started");
        let asked =
            wait_for(&mut events, |e| matches!(e.kind, EventKind::PermissionRequest { .. })).await;
        let EventKind::PermissionRequest { request_id, .. } = asked.kind else { unreachable!() };
        let (code, out, err) =
            daemon.cli(&["permission", "respond", &session, &request_id, answer]).await;
        assert_eq!(code, 0, "{err}");
        assert!(
            out.contains(&format!(
                "request {request_id} answered: {}",
                if answer == "allow" { "allow" } else { "reject" }
            )),
            "{out}"
        );
        let mut text = String::new();
        loop {
            let event = wait_for(&mut events, |_| true).await;
            match event.kind {
                EventKind::AgentMessageChunk { text: chunk, .. } => text.push_str(&chunk),
                EventKind::TurnEnded { turn_id, state, .. } if turn_id == turn_id_started => {
                    assert_eq!(state, TurnState::Completed);
                    break;
                }
                _ => {}
            }
        }
        assert!(text.contains(reply), "{answer}: {text}");
    }
    // An unknown request is `not found` (exit 4).
    let (code, _, err) = daemon.cli(&["permission", "respond", &session, "999", "allow"]).await;
    assert_eq!(code, 4, "{err}");

    let last = typed.session_status(session.clone()).await.unwrap().last_event_seq;
    let mut events = typed.session_subscribe(session.clone(), Some(last)).await.unwrap();
    let turn = typed.session_prompt(session.clone(), "/sleep 60000\nslow".into()).await.unwrap();
    let turn_id_started = turn.turn_id.clone().expect("a turn started");
    wait_for(&mut events, |e| matches!(e.kind, EventKind::TurnStarted { .. })).await;
    let (code, out, err) = daemon.cli(&["cancel", &session]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("cancel sent"), "{out}");
    let ended = wait_for(
        &mut events,
        |e| matches!(&e.kind, EventKind::TurnEnded { turn_id, .. } if *turn_id == turn_id_started),
    )
    .await;
    let EventKind::TurnEnded { stop_reason, .. } = ended.kind else { unreachable!() };
    assert_eq!(stop_reason.as_deref(), Some("cancelled"));
}

#[tokio::test]
async fn prompt_and_follow_carry_on_across_a_daemon_restart() {
    // A fixed port, so the restarted daemon is where the CLI left it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let mut daemon = Daemon::start(&["--listen", &listen]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("r")).await;
    let spawn = |args: Vec<String>| {
        tokio::process::Command::new(workspace_bin("supervisor"))
            .arg("--url")
            .arg(&daemon.url)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    };
    let mut follow = spawn(vec!["follow".into(), session.clone(), "--json".into()]);
    let mut follow_lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let mut prompt = spawn(vec![
        "prompt".into(),
        session.clone(),
        "/tool\n/sleep 3000\nafter the restart".into(),
    ]);
    let mut prompt_lines = BufReader::new(prompt.stdout.take().unwrap()).lines();
    // The turn is under way once its tool call is printed.
    loop {
        let line = within("the prompt's output", prompt_lines.next_line()).await.unwrap();
        if line.expect("more output").contains("[tool:") {
            break;
        }
    }
    drop(api);
    daemon.kill().await;
    daemon.restart().await;
    let mut out = String::new();
    while let Some(line) = within("the prompt's output", prompt_lines.next_line()).await.unwrap() {
        out.push_str(&line);
        out.push('\n');
    }
    let output = within("the prompt to end", prompt.wait_with_output()).await.unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{out}\n{err}");
    assert!(out.contains("you said: after the restart"), "{out}");
    assert!(out.trim_end().ends_with("[turn completed: end_turn]"), "{out}");
    assert!(err.contains("went away; reconnecting") && err.contains("reconnected"), "{err}");

    // `follow` saw the whole turn, seqs without a gap, and ends with the session.
    let api = daemon.api().await;
    api.typed().session_stop(session.clone()).await.unwrap();
    let mut events: Vec<SessionEvent> = Vec::new();
    while let Some(line) = within("follow's output", follow_lines.next_line()).await.unwrap() {
        events.push(serde_json::from_str(&line).expect(&line));
    }
    let status = within("follow to end", follow.wait()).await.unwrap();
    assert!(status.success(), "{status:?}");
    for pair in events.windows(2) {
        assert_eq!(pair[1].seq, pair[0].seq + 1, "no gap: {events:?}");
    }
    assert!(
        events
            .iter()
            .any(|e| matches!(&e.kind, EventKind::TurnEnded { state: TurnState::Completed, .. }))
    );
    assert!(matches!(
        events.last().map(|e| &e.kind),
        Some(EventKind::State { state: SessionState::Completed, .. })
    ));
}

/// The daemon dies after it recorded the turn but before the prompt went anywhere (and
/// before its start was published): the CLI reconnects to the restarted daemon, finds no
/// turn of its own, and says to send the prompt again — at once, not after a hang.
#[tokio::test]
async fn a_prompt_cut_off_before_it_was_taken_says_to_send_it_again() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let mut daemon =
        Daemon::start_with_env(&["--listen", &listen], &[], &[("TETHER_FAULT", "prompt.recorded")])
            .await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("l")).await;
    drop(api);
    let prompt = tokio::process::Command::new(workspace_bin("supervisor"))
        .args(["--url", &daemon.url, "prompt", &session, "cut off"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    within("the supervisor to die at the fault point", daemon.wait_exit()).await;
    daemon.restart_with_env(&[]).await;
    let output = within("the prompt to end", prompt.wait_with_output()).await.unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(err.contains("reconnected") && err.contains("send it again"), "{err}");
    let api = daemon.api().await;
    assert!(api.ask(&session, "again").await.contains("you said: again"));
}

#[tokio::test]
async fn sessions_show_has_the_timeline_of_executions_and_turns() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("t")).await;
    api.ask(&session, "one").await;
    tether_tests::daemon::kill_sidecar(&daemon, &api, &session).await;
    api.ask(&session, "two").await;
    let timeline = api.typed().session_timeline(session.clone(), None).await.unwrap();
    assert_eq!(timeline.turns.len(), 2, "{timeline:?}");
    assert_eq!(timeline.executions.len(), 2, "a turn per execution: {timeline:?}");
    assert!(timeline.executions[1].current && !timeline.executions[0].current);
    assert_eq!(timeline.executions[1].generation, Some(2));
    let (code, out, err) = daemon.cli(&["sessions", "show", &session]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("state: WAITING_FOR_INPUT"), "{out}");
    assert!(out.contains("executions:") && out.contains("(current)"), "{out}");
    for turn in &timeline.turns {
        assert!(out.contains(&turn.turn_id), "{out}");
    }
    let (_, status_out, _) = daemon.cli(&["status", &session]).await;
    assert_ne!(out, status_out, "show is more than status");
}

/// Runs a CLI command that must succeed and print JSON.
async fn cli_json(daemon: &Daemon, args: &[&str]) -> serde_json::Value {
    let (code, out, err) = daemon.cli(args).await;
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

/// Every read command prints the API's own result with `--json`, for scripts.
#[tokio::test]
async fn read_commands_print_json_for_scripts() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("j")).await;
    api.ask(&session, "hello").await;
    let agents: Vec<protocol::api::AgentInfo> =
        serde_json::from_value(cli_json(&daemon, &["agents", "--json"]).await).unwrap();
    assert!(agents.iter().any(|a| a.id == "mock" && a.available));
    let status: protocol::api::SessionStatus =
        serde_json::from_value(cli_json(&daemon, &["status", &session, "--json"]).await).unwrap();
    assert_eq!(status.session_id, session);
    let history: Vec<protocol::api::HistoryEntry> =
        serde_json::from_value(cli_json(&daemon, &["history", &session, "--json"]).await).unwrap();
    assert_eq!(history.len(), 2);
    let tasks: Vec<protocol::api::Task> =
        serde_json::from_value(cli_json(&daemon, &["task", "list", "--json"]).await).unwrap();
    assert_eq!(tasks.len(), 1);
    let detail: protocol::api::TaskDetail = serde_json::from_value(
        cli_json(&daemon, &["task", "show", &status.task_id, "--json"]).await,
    )
    .unwrap();
    assert_eq!(detail.sessions[0].id, session);
    let shown: protocol::api::SessionDetail =
        serde_json::from_value(cli_json(&daemon, &["sessions", "show", &session, "--json"]).await)
            .unwrap();
    assert_eq!((shown.status.session_id, shown.timeline.turns.len()), (session, 1));
}

#[tokio::test]
async fn oversized_fields_are_refused_and_subscribing_past_the_end_too() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let typed = api.typed();
    let title = "t".repeat(20 * 1024 * 1024);
    let err = typed.task_create(title, None).await.unwrap_err();
    let data = match &err {
        jsonrpsee::core::ClientError::Call(object) => ErrorData::of(object).expect("data"),
        other => panic!("{other}"),
    };
    assert_eq!(
        (data.kind, data.field.as_deref(), data.limit),
        (ErrorKind::InvalidParams, Some("title"), Some(1024))
    );
    assert!(typed.task_list().await.unwrap().is_empty(), "nothing was stored");
    let session = api.ready_session("mock", &daemon.workspace("s")).await;
    let last = typed.session_status(session.clone()).await.unwrap().last_event_seq;
    assert!(typed.session_subscribe(session.clone(), Some(last)).await.is_ok());
    let err = typed.session_subscribe(session.clone(), Some(last + 1)).await.unwrap_err();
    match &err {
        jsonrpsee::core::ClientError::Call(object) => {
            let data = ErrorData::of(object).expect("data");
            assert_eq!(
                (data.kind, data.field.as_deref()),
                (ErrorKind::InvalidParams, Some("after_seq"))
            );
        }
        other => panic!("{other}"),
    }
}

#[tokio::test]
async fn the_openrpc_document_is_served_by_rpc_discover() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let served = api.typed().discover().await.unwrap();
    let checked_in: serde_json::Value =
        serde_json::from_str(protocol::api::openrpc::DOCUMENT).unwrap();
    assert_eq!(served, checked_in);
    assert!(
        served["methods"].as_array().unwrap().iter().any(|m| m["name"] == "task.session.timeline")
    );
}

/// The prompt command shows what a permission asks — the tool, its kind and
/// input, every option with its id — and how to answer; answered, the turn goes on.
#[tokio::test]
async fn a_permission_shows_the_tool_and_its_options_in_the_prompt_command() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("ask")).await;
    let mut prompt = tokio::process::Command::new(workspace_bin("supervisor"))
        .args(["--url", &daemon.url, "prompt", &session, "/permission\nmay I"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the CLI starts");
    let mut lines = BufReader::new(prompt.stdout.take().expect("UNWRAP: piped")).lines();
    let mut shown = Vec::new();
    while let Some(line) =
        within("the CLI's lines", lines.next_line()).await.expect("the CLI's stdout reads")
    {
        let done = line.contains("answer with");
        shown.push(line);
        if done {
            break;
        }
    }
    let shown = shown.join("\n");
    assert!(shown.contains("[permission requested]"), "{shown}");
    assert!(shown.contains("mock tool: list files (execute)"), "{shown}");
    let open = api.status(&session).await.open_questions;
    let (request, params) = (&open[0].request_id, &open[0].params);
    for option in params["options"].as_array().unwrap() {
        let (id, name) = (option["optionId"].as_str().unwrap(), option["name"].as_str().unwrap());
        assert!(shown.contains(&format!("{id} — {name}")), "{id} {name}: {shown}");
    }
    assert!(
        shown.contains(&format!(
            "supervisor permission respond {session} {request} allow|allow-always|deny|deny-always|OPTION_ID` (allow is once)"
        )),
        "{shown}"
    );
    let (code, _, err) = daemon.cli(&["permission", "respond", &session, request, "allow"]).await;
    assert_eq!(code, 0, "{err}");
    let mut rest = String::new();
    while let Some(line) =
        within("the CLI's lines", lines.next_line()).await.expect("the CLI's stdout reads")
    {
        rest.push_str(&line);
        rest.push('\n');
    }
    assert!(rest.contains("the tool ran"), "{rest}");
    assert!(within("the CLI", prompt.wait()).await.unwrap().success());
}

/// A user profile extends a built-in and changes one key; `agents`
/// says what it extends and which keys are its own, and it runs as the built-in does.
#[tokio::test]
async fn a_user_profile_extends_a_builtin_and_agents_says_so() {
    let slow = "extends = \"mock\"\nid = \"mock-patient\"\ndisplay_name = \"Patient mock\"\n[process]\ninit_timeout_ms = 20000\n";
    let daemon =
        tether_tests::daemon::Daemon::start_with_profiles(&[], &[("patient.toml", slow)]).await;
    let (code, out, err) = daemon.cli(&["agents"]).await;
    assert_eq!(code, 0, "{err}");
    let line = out.lines().find(|line| line.starts_with("mock-patient\t")).expect(&out);
    assert!(line.contains("Patient mock\tavailable"), "{line}");
    assert!(
        line.contains(
            "(extends mock; its own: display_name, id, process.init_timeout_ms; the rest is mock's)"
        ),
        "{line}"
    );
    let api = daemon.api().await;
    let session = api.ready_session("mock-patient", &daemon.workspace("p")).await;
    assert!(api.ask(&session, "hello").await.contains("you said: hello"));
}

/// A session refused for its budget is told how to raise it with a command that exists.
#[tokio::test]
async fn a_budget_refusal_names_the_cli_command_that_raises_it() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("b")).await;
    let (code, _, err) = daemon.cli(&["budget", "--session", &session, "--tokens", "10"]).await;
    assert_eq!(code, 0, "{err}");
    api.ask(&session, "/tokens 100 100\nbig").await;
    let (code, _, err) = daemon.cli(&["prompt", &session, "more"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("budget_exceeded"), "{err}");
    assert!(!err.contains("budget set"), "there is no `budget set`: {err}");
    assert!(err.contains(&format!("supervisor budget --session {session}")), "{err}");
}

/// Whether `word` looks like a Unix time in milliseconds (what a person cannot read).
fn is_raw_ms(word: &str) -> bool {
    word.len() == 13 && word.bytes().all(|byte| byte.is_ascii_digit())
}

/// `sessions show` reads as a person reads it: times as times, every execution with its
/// generation (not "generation - - -"); its JSON has the turns.
#[tokio::test]
async fn sessions_show_prints_readable_times_and_each_executions_generation() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("g")).await;
    api.ask(&session, "one").await;
    tether_tests::daemon::kill_sidecar(&daemon, &api, &session).await;
    api.ask(&session, "two").await;
    let (code, out, err) = daemon.cli(&["sessions", "show", &session]).await;
    assert_eq!(code, 0, "{err}");
    let raw: Vec<&str> =
        out.split(|c: char| !c.is_ascii_digit()).filter(|w| is_raw_ms(w)).collect();
    assert!(raw.is_empty(), "no raw ms times ({raw:?}):\n{out}");
    assert!(!out.contains("generation -"), "{out}");
    let executions = out.split("executions:\n").nth(1).and_then(|rest| rest.split("turns:").next());
    let executions = executions.unwrap_or_else(|| panic!("{out}"));
    assert!(executions.contains("generation 1") && executions.contains("generation 2"), "{out}");
    let timeline = api.typed().session_timeline(session.clone(), None).await.unwrap();
    let shown = cli_json(&daemon, &["sessions", "show", &session, "--json"]).await;
    assert_eq!(shown["timeline"]["turns"].as_array().map(Vec::len), Some(timeline.turns.len()));
    assert_eq!(timeline.turns.len(), 2);
}

/// A pause that waits for the running turn says so while it waits (one line when the
/// output is not a terminal).
#[tokio::test]
async fn pause_says_what_it_waits_for() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("w")).await;
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, "/sleep 60000\nslow").await.unwrap();
    tether_tests::daemon::until(&mut events, |e| {
        tether_tests::daemon::is_state(e, SessionState::Running)
    })
    .await;
    let (code, out, err) = daemon.cli(&["pause", &session, "--force-after-ms", "500"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("session {session} paused (the turn was cancelled)")), "{out}");
    let waiting: Vec<&str> =
        err.lines().filter(|line| line.contains("waiting for the running turn to end")).collect();
    assert_eq!(waiting.len(), 1, "one progress line, not a ticking one, off a terminal: {err}");
    assert!(!err.contains('\r'), "{err:?}");
}

/// `session start --quiet` whose launch fails still prints the id of the session it made
/// (it exists: a script can read or delete it), and the failure on stderr.
#[tokio::test]
async fn session_start_quiet_prints_the_id_of_a_session_whose_launch_failed() {
    let root = tempfile::tempdir().unwrap();
    let flag = root.path().join("fail");
    std::fs::write(&flag, "").unwrap();
    let profile = tether_tests::daemon::fail_while_profile("failing", &flag);
    let daemon = Daemon::start_with_profiles(&[], &[("failing.toml", &profile)]).await;
    let workspace = daemon.workspace("f");
    let args = ["session", "start", "--agent", "failing", "--new-task", "t", "--quiet"];
    let (code, out, err) =
        daemon.cli(&[&args[..], &["--workspace", workspace.to_str().unwrap()]].concat()).await;
    assert_eq!(code, 1, "{out}{err}");
    let id = out.trim();
    assert!(!id.is_empty() && !id.contains(char::is_whitespace), "the id alone: {out:?}");
    assert!(err.contains(&format!("session {id} failed")), "{err}");
    let (code, out, err) = daemon.cli(&["status", id]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("state: FAILED"), "{out}");
}

/// `snapshots get` takes `--json` as every other read does.
#[tokio::test]
async fn snapshots_get_takes_json() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("s")).await;
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, "hello").await.unwrap();
    wait_for(&mut events, |e| matches!(e.kind, EventKind::SnapshotTaken { .. })).await;
    let listed = cli_json(&daemon, &["snapshots", "list", &session, "--json"]).await;
    let id = listed[0]["snapshot_id"].as_str().unwrap_or_else(|| panic!("{listed}")).to_owned();
    let snapshot: protocol::api::Snapshot =
        serde_json::from_value(cli_json(&daemon, &["snapshots", "get", &id, "--json"]).await)
            .unwrap();
    assert_eq!((snapshot.snapshot_id.as_str(), snapshot.session_id.as_str()), (&*id, &*session));
    let (code, out, err) = daemon.cli(&["snapshots", "list", &session]).await;
    assert_eq!(code, 0, "{err}");
    assert!(!out.split(|c: char| !c.is_ascii_digit()).any(is_raw_ms), "readable times: {out}");
}

/// `sessions list --json` names each session's id `session_id`, as `status` does (and
/// still `id`, for the scripts that read it).
#[tokio::test]
async fn sessions_list_json_has_session_id_as_status_does() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("l")).await;
    let listed = cli_json(&daemon, &["sessions", "list", "--json"]).await;
    assert_eq!(listed[0]["session_id"], session.as_str(), "{listed}");
    assert_eq!(listed[0]["id"], session.as_str(), "{listed}");
    let status = cli_json(&daemon, &["status", &session, "--json"]).await;
    assert_eq!(status["session_id"], listed[0]["session_id"]);
    let task = status["task_id"].as_str().unwrap();
    let shown = cli_json(&daemon, &["task", "show", task, "--json"]).await;
    assert_eq!(shown["sessions"][0]["session_id"], session.as_str(), "{shown}");
}

/// The daemon's log, written to a file or a pipe, holds no colour codes.
#[tokio::test]
async fn the_daemon_log_has_no_colour_codes_off_a_terminal() {
    let daemon = Daemon::start_with_env(&[], &[], &[("TETHER_LOG", "info")]).await;
    let mut log = daemon.log_from_start();
    let line = tether_tests::daemon::await_log(&mut log, "applied database migration").await;
    assert!(!line.contains('\u{1b}'), "{line:?}");
}

/// `follow` prints a resume once (the daemon publishes `resume_outcome`, kept for older
/// clients, and `resumed`).
#[tokio::test]
async fn follow_prints_a_resume_once() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("r")).await;
    let (code, _, err) = daemon.cli(&["stop-all"]).await;
    assert_eq!(code, 0, "{err}");
    let resumed = api.resume(&session).await.unwrap();
    api.typed().session_stop(session.clone()).await.unwrap();
    let (code, out, err) = daemon.cli(&["follow", &session, "--after", "0"]).await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().filter(|line| line.contains("resumed")).collect();
    assert_eq!(lines.len(), 1, "{out}");
    assert!(lines[0].ends_with(&format!("resumed: {}", resumed.outcome.as_str())), "{out}");
}

/// A session whose sidecar died with the daemon, with a turn running and a question open:
/// the restart's log says what recovery did for it, and counts it once.
#[tokio::test]
async fn the_restart_log_says_what_recovery_did_for_each_session() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("d")).await;
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, "/permission\nmay I").await.unwrap();
    wait_for(&mut events, |e| matches!(e.kind, EventKind::PermissionRequest { .. })).await;
    let sidecar = daemon.agentctl_pid(&session);
    drop(events);
    drop(api);
    daemon.kill().await;
    tether_tests::daemon::sigkill(sidecar).await;
    let mut log = daemon.log_lines();
    daemon.restart_with_env(&[("TETHER_LOG", "info")]).await;
    let mut lines = Vec::new();
    loop {
        let line = within("the daemon's log", log.recv()).await.expect("the log goes on");
        let done = line.contains("recovery: re-attaching done");
        lines.push(line);
        if done {
            break;
        }
    }
    let all = lines.join("\n");
    let mine = lines
        .iter()
        .find(|line| line.contains(&session) && line.contains("recovery:"))
        .unwrap_or_else(|| panic!("a line for the session: {all}"));
    assert!(mine.contains("interrupting 1 turn and voiding 1 question"), "{all}");
    assert!(
        lines.iter().any(|line| line.contains(&session) && line.contains("replayed its dead")),
        "{all}"
    );
    let serving = lines.iter().find(|line| line.contains("recovery: serving")).expect(&all);
    assert!(serving.contains("reattaching=0"), "not re-attached: {all}");
    assert!(serving.contains("approvals_restored=0"), "no question restored: {all}");
    assert!(lines.last().unwrap().contains("failed=0"), "nothing failed: {all}");
}
