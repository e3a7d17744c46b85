//! Real agents, installed from npm by `scripts/setup.sh` into `.tools/npm`,
//! driven through the supervisor's API against the scripted model server on 127.0.0.1 —
//! full turns offline, and the check that a native resume really restored the context:
//! the model's next request carries the earlier conversation.

use protocol::errors::ErrorKind;
use std::path::{Path, PathBuf};

use protocol::acp::schema as acp;
use protocol::api::{ApiClient, EntryType, EventKind, ResumeOutcome, SessionState};
use serde_json::json;
use tether_tests::Direction;
use tether_tests::daemon::{
    Api, Daemon, kill_sidecar, notices, ok, progress_steps, stop_reason, turn_ended, until,
    until_permission_request,
};
use tether_tests::model_server::{ModelServer, Reply, conversation_text};
use tether_tests::real_agents::{agent_command, codex_profile, installed};
use tether_tests::schema::AcpSchema;

/// Awaits `future` and prints how long it took, labelled — for the closing note's table
/// of agents (a figure to read, never asserted: timings are benchmarks' business).
async fn timed<T>(label: &str, future: impl std::future::Future<Output = T>) -> T {
    let started = std::time::Instant::now();
    let out = future.await;
    println!("TIMING {label}: {} ms", started.elapsed().as_millis());
    out
}

/// Checks every line Tether sent the agents recorded under `transcript` (see
/// [`agent_command`]) against the ACP schema, and that among them were requests of each
/// of `methods`. The agents' own lines may use fields newer than the schema: not ours to
/// judge, though they pair the ids of our answers.
fn check_what_we_sent(transcript: &Path, methods: &[&str]) {
    let read = |path: &Path| -> Vec<Vec<u8>> {
        std::fs::read(path)
            .unwrap_or_default()
            .split(|&b| b == b'\n')
            .filter(|line| !line.is_empty())
            .map(<[u8]>::to_vec)
            .collect()
    };
    let dir = transcript.parent().unwrap();
    let prefix = format!("{}.", transcript.file_name().unwrap().to_string_lossy());
    let mut schema = AcpSchema::load();
    let mut sent_methods = std::collections::BTreeSet::new();
    let mut processes = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !(name.starts_with(&prefix) && name.ends_with(".in")) {
            continue;
        }
        processes += 1;
        let sent = read(&entry.path());
        let received = read(&entry.path().with_extension("out"));
        for line in &sent {
            let message: serde_json::Value = serde_json::from_slice(line).unwrap();
            if let Some(method) = message["method"].as_str() {
                sent_methods.insert(method.to_owned());
            }
        }
        match schema.check_transcript(&sent, &received) {
            Ok(checked) => {
                let ours = checked.iter().filter(|c| c.direction == Direction::ToAgent).count();
                assert_eq!(ours, sent.len(), "every line we sent was checked ({name})");
            }
            Err(errors) => {
                let ours: Vec<&String> =
                    errors.iter().filter(|error| error.starts_with("ToAgent")).collect();
                assert!(ours.is_empty(), "{name}: {ours:#?}");
            }
        }
    }
    assert!(processes > 0, "a transcript was recorded under {}", transcript.display());
    for method in methods {
        assert!(sent_methods.contains(*method), "we sent {method}: {sent_methods:?}");
    }
}

/// Claude Code's own default may approve edits by itself: a project whose settings make it
/// ask first.
pub(crate) fn ask_before_edits(workspace: &Path) {
    std::fs::create_dir_all(workspace.join(".claude")).unwrap();
    std::fs::write(
        workspace.join(".claude/settings.json"),
        r#"{"permissions": {"defaultMode": "default"}}"#,
    )
    .unwrap();
}

/// A daemon with a `claude` profile running claude-agent-acp against `server`, its
/// traffic recorded under `transcript` if given (see [`agent_command`]).
pub(crate) async fn claude_daemon(
    server: &ModelServer,
    transcript: Option<&Path>,
) -> Option<Daemon> {
    claude_daemon_with(server, transcript, "").await
}

/// [`claude_daemon`] with `session` (TOML lines) added to the profile's `[session]`.
async fn claude_daemon_with(
    server: &ModelServer,
    transcript: Option<&Path>,
    session: &str,
) -> Option<Daemon> {
    let profile = tether_tests::real_agents::claude_profile(&server.url, transcript, session)?;
    Some(Daemon::start_with_profiles(&[], &[("claude.toml", &profile)]).await)
}

/// A full turn of claude-agent-acp against the scripted model: the model's text streams
/// back as the reply, and the model saw the prompt.
#[tokio::test]
async fn claude_completes_a_turn_against_the_scripted_model() {
    let server = ModelServer::start().await;
    let Some(daemon) = claude_daemon(&server, None).await else { return };
    let api = daemon.api().await;
    let session = timed("claude start", api.ready_session("claude", &daemon.workspace("c"))).await;
    server.script([Reply::Text("Hello from the scripted model, streamed in pieces.".into())]);
    let reply = timed("claude turn", api.ask(&session, "say hello")).await;
    assert!(reply.contains("Hello from the scripted model, streamed in pieces."), "{reply}");
    let asked = server.main_requests();
    let last = asked.last().expect("the model was asked");
    assert!(conversation_text(last).contains("say hello"), "{last}");
}

/// claude-agent-acp in a sandbox — the workspace file system, and a network allowlist
/// that names nothing: its model endpoint (`ANTHROPIC_BASE_URL`) is allowlisted by
/// itself — completes turns against the scripted model through the egress proxy, and
/// writes in its workspace.
#[tokio::test]
async fn claude_completes_turns_in_a_sandbox_with_only_its_model_allowlisted() {
    let server = ModelServer::start().await;
    let Some(profile) = tether_tests::real_agents::claude_profile(&server.url, None, "") else {
        return;
    };
    let profile =
        format!("{profile}\n[sandbox]\nfilesystem = \"workspace\"\nnetwork = \"allowlist\"\n");
    let daemon = Daemon::start_with_profiles(&[], &[("claude.toml", &profile)]).await;
    let api = daemon.api().await;
    let workspace = daemon.workspace("boxed");
    ask_before_edits(&workspace);
    let session = timed("claude start in a sandbox", api.ready_session("claude", &workspace)).await;
    server.script([Reply::Text("Hello from inside the sandbox.".into())]);
    let reply = timed("claude turn in a sandbox", api.ask(&session, "say hello")).await;
    assert!(reply.contains("Hello from inside the sandbox."), "{reply}");
    server.script([
        Reply::ToolUse {
            name: "Write".into(),
            input: json!({"file_path": workspace.join("boxed.txt"), "content": "written in the box\n"}),
        },
        Reply::Text("Wrote it.".into()),
    ]);
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, "write boxed.txt").await.unwrap();
    let (_, request_id, params) = until_permission_request(&mut events).await;
    let option = Some(allow_once(&params));
    ok("respond", api.typed().permission_respond(session.clone(), request_id, option)).await;
    let seen = until(&mut events, turn_ended).await;
    assert_eq!(stop_reason(seen.last().unwrap()), Some("end_turn"), "{:?}", seen.last());
    assert_eq!(
        std::fs::read_to_string(workspace.join("boxed.txt")).unwrap(),
        "written in the box\n"
    );
    let asked = server.main_requests();
    assert!(conversation_text(asked.last().unwrap()).contains("write boxed.txt"));
}

/// The id of the allow-once option of a permission request's ACP `params`.
fn allow_once(params: &serde_json::Value) -> String {
    let options: Vec<acp::PermissionOption> =
        serde_json::from_value(params["options"].clone()).expect("ACP permission options");
    let allow = options
        .iter()
        .find(|option| option.kind == acp::PermissionOptionKind::AllowOnce)
        .unwrap_or_else(|| panic!("an allow-once option: {options:?}"));
    allow.option_id.to_string()
}

/// Kill the agent, resume: claude-agent-acp restores through `session/resume`, and the
/// model's next request contains the earlier conversation — the context really is back.
#[tokio::test]
async fn claude_resumes_natively_with_its_context() {
    let server = ModelServer::start().await;
    let Some(daemon) = claude_daemon(&server, None).await else { return };
    let api = daemon.api().await;
    let session = api.ready_session("claude", &daemon.workspace("r")).await;
    resume_keeps_the_context(&daemon, &api, &session, &server).await;
}

/// Tells the agent something (the model notes it), kills the agent, resumes, asks again:
/// the resume is native, and the model's next request carries the first exchange.
async fn resume_keeps_the_context(daemon: &Daemon, api: &Api, session: &str, server: &ModelServer) {
    resume_restores(daemon, api, session, server, ResumeOutcome::NativeResume, || ()).await;
}

/// [`resume_keeps_the_context`] with the `outcome` expected, and `before_resume` run once
/// the agent is dead.
async fn resume_restores(
    daemon: &Daemon,
    api: &Api,
    session: &str,
    server: &ModelServer,
    outcome: ResumeOutcome,
    before_resume: impl FnOnce(),
) {
    let agent = session_agent(api, session).await;
    server.script([Reply::Text("Noted: the code word is papaya.".into())]);
    let label = format!("{agent} turn");
    let noted = timed(&label, api.ask(session, "remember the code word papaya")).await;
    assert!(noted.contains("Noted: the code word is papaya."), "{noted}");
    kill_sidecar(daemon, api, session).await;
    before_resume();
    let resumed = timed(&format!("{agent} resume"), api.resume(session)).await.unwrap();
    assert_eq!(resumed.outcome, outcome, "{resumed:?}");
    server.script([Reply::Text("The code word was papaya.".into())]);
    let reply = api.ask(session, "what was the code word?").await;
    assert!(reply.contains("papaya"), "{reply}");
    let last = server.main_requests().pop().expect("the model was asked");
    let seen = conversation_text(&last);
    assert!(
        seen.contains("remember the code word papaya") && seen.contains("Noted: the code word"),
        "the earlier turn is in the model's context: {seen}"
    );
}

/// Claude-agent-acp parked for being idle is woken by the next prompt through
/// its native restore, and the model's next request carries the exchange before the park.
#[tokio::test]
async fn claude_parked_when_idle_wakes_with_its_context() {
    let server = ModelServer::start().await;
    let Some(daemon) = claude_daemon_with(&server, None, "idle_timeout_secs = 3").await else {
        return;
    };
    let api = daemon.api().await;
    let session = api.ready_session("claude", &daemon.workspace("idle")).await;
    server.script([Reply::Text("Noted: the code word is papaya.".into())]);
    let noted = api.ask(&session, "remember the code word papaya").await;
    assert!(noted.contains("Noted: the code word is papaya."), "{noted}");
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    until(&mut events, |e| {
        matches!(
            e.kind,
            EventKind::Paused { trigger: Some(protocol::api::SnapshotTrigger::Idle), .. }
        )
    })
    .await;
    let status = api.status(&session).await;
    assert_eq!((status.state, status.resume_reason.as_str()), (SessionState::Paused, "idle"));
    server.script([Reply::Text("The code word was papaya.".into())]);
    let reply = timed("claude wake and turn", api.ask(&session, "what was the code word?")).await;
    assert!(reply.contains("papaya"), "{reply}");
    let seen = conversation_text(&server.main_requests().pop().expect("the model was asked"));
    assert!(
        seen.contains("remember the code word papaya") && seen.contains("Noted: the code word"),
        "the exchange before the park is in the model's context: {seen}"
    );
    assert_eq!(api.status(&session).await.generation, 2, "woken by a second execution");
}

/// The profile a session runs.
async fn session_agent(api: &Api, session: &str) -> String {
    api.status(session).await.agent_profile_id
}

/// A tool call that asks permission: the request reaches the API, is answered through
/// `task.session.permission.respond`, and the file the model wrote is in the workspace.
/// Everything Tether sent the agent validates against the ACP schema.
#[tokio::test]
async fn claude_asks_permission_and_its_write_lands() {
    let server = ModelServer::start().await;
    let transcript = tempfile::tempdir().unwrap();
    let lines = transcript.path().join("claude");
    let Some(daemon) = claude_daemon(&server, Some(&lines)).await else { return };
    let api = daemon.api().await;
    let workspace = daemon.workspace("p");
    ask_before_edits(&workspace);
    let session = api.ready_session("claude", &workspace).await;
    let target = workspace.join("hello.txt");
    server.script([
        Reply::ToolUse {
            name: "Write".into(),
            input: json!({"file_path": target, "content": "written by the scripted model\n"}),
        },
        Reply::Text("The file is written.".into()),
    ]);
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, "write hello.txt").await.unwrap();
    let (_, request_id, params) = until_permission_request(&mut events).await;
    assert!(!target.exists(), "nothing is written before the answer");
    // The ACP params are the agent's (`session/request_permission`), relayed as they came.
    let allow = allow_once(&params);
    ok(
        "task.session.permission.respond",
        api.typed().permission_respond(session.clone(), request_id, Some(allow)),
    )
    .await;
    let seen = until(&mut events, turn_ended).await;
    assert_eq!(stop_reason(seen.last().unwrap()), Some("end_turn"), "{:?}", seen.last());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "written by the scripted model\n");
    // The write's result is recorded with what claude's updates said
    // of it (not its first placeholder title, not `tool`), and with what it wrote.
    let history = api.history(&session).await;
    let result = history
        .iter()
        .find(|entry| entry.kind == protocol::api::EntryType::ToolResult)
        .unwrap_or_else(|| panic!("the write's result is recorded: {history:?}"));
    let name = result.tool_name.clone().unwrap_or_default();
    assert!(name != "tool" && !name.ends_with('…'), "{result:?}");
    assert!(result.content.contains("written by the scripted model"), "{result:?}");
    drop(events);
    ok("task.session.stop", api.typed().session_stop(session.clone())).await;
    check_what_we_sent(&lines, &["initialize", "session/new", "session/prompt"]);
}

/// A cancel while the model has not answered ends the turn as cancelled, and the session
/// takes the next prompt.
#[tokio::test]
async fn claude_cancels_mid_turn() {
    let server = ModelServer::start().await;
    let Some(daemon) = claude_daemon(&server, None).await else { return };
    let api = daemon.api().await;
    let session = api.ready_session("claude", &daemon.workspace("x")).await;
    cancel_mid_turn(&api, &session, &server).await;
}

/// A prompt the model never answers is cancelled: the turn ends `cancelled`, and the
/// session takes the next prompt.
async fn cancel_mid_turn(api: &Api, session: &str, server: &ModelServer) {
    server.script([Reply::Hang]);
    let asked = server.main_requests().len();
    let mut events = api.subscribe_at_end(session).await;
    api.prompt(session, "think forever").await.unwrap();
    // Cancel once the model has the request (it never answers).
    server.main_requested(asked + 1).await;
    let label = format!("{} cancel", session_agent(api, session).await);
    let seen = timed(&label, async {
        ok("task.session.cancel", api.typed().session_cancel(session.to_owned())).await;
        until(&mut events, turn_ended).await
    })
    .await;
    assert_eq!(stop_reason(seen.last().unwrap()), Some("cancelled"), "{:?}", seen.last());
    server.script([Reply::Text("back again".into())]);
    assert!(api.ask(session, "hello?").await.contains("back again"));
}

/// claude-agent-acp takes a steer into its running turn (`_session/steering`, advertised
/// with `_meta.steering.supported`): the model is asked again with the steer while the
/// first request still hangs, and the one turn ends answering it.
#[tokio::test]
async fn claude_takes_a_steer_into_its_running_turn() {
    let server = ModelServer::start().await;
    let Some(daemon) = claude_daemon(&server, None).await else { return };
    let api = daemon.api().await;
    let session = api.ready_session("claude", &daemon.workspace("st")).await;
    steer_mid_turn(&api, &session, &server).await;
}

/// claude-agent-acp forks natively (`session/fork`, advertised as
/// `sessionCapabilities.fork`): a fork at the newest turn starts its own claude session
/// from the original's, and the model's first request of the fork carries the earlier
/// exchange without Tether injecting it.
#[tokio::test]
async fn claude_forks_a_session_natively() {
    let server = ModelServer::start().await;
    let Some(daemon) = claude_daemon(&server, None).await else { return };
    let api = daemon.api().await;
    let session = api.ready_session("claude", &daemon.workspace("fk")).await;
    server.script([Reply::Text("Noted: the colour is teal.".into())]);
    api.ask(&session, "remember the colour teal").await;
    let forked = ok("task.session.fork", api.typed().session_fork(session.clone(), None)).await;
    assert_eq!(forked.context, protocol::api::ForkContext::Native, "{forked:?}");
    server.script([Reply::Text("It was teal.".into())]);
    let mut events = api.subscribe(&forked.session_id, 0).await;
    assert!(api.ask(&forked.session_id, "which colour?").await.contains("teal"));
    let outcome = until(&mut events, |e| matches!(e.kind, EventKind::ResumeOutcome { .. })).await;
    let outcome = outcome.iter().find_map(|e| match &e.kind {
        EventKind::ResumeOutcome { outcome, .. } => Some(*outcome),
        _ => None,
    });
    assert_eq!(outcome, Some(ResumeOutcome::NativeFork));
    let asked = conversation_text(&server.main_requests().pop().unwrap());
    assert!(asked.contains("remember the colour teal"), "{asked}");
    assert!(!asked.contains("RESUME CONTEXT"), "nothing injected: {asked}");
}

/// codex-acp forks natively too (it advertises `sessionCapabilities.fork`): the fork's first
/// model request carries the earlier exchange, nothing injected.
#[tokio::test]
async fn codex_forks_a_session_natively() {
    let server = ModelServer::start().await;
    let transcript = tempfile::tempdir().unwrap();
    let Some(daemon) = codex_daemon(&server, &transcript.path().join("codex")).await else {
        return;
    };
    let api = daemon.api().await;
    let session = api.ready_session("codex-here", &daemon.workspace("cf")).await;
    server.script([Reply::Text("Noted: the colour is teal.".into())]);
    api.ask(&session, "remember the colour teal").await;
    let forked = ok("task.session.fork", api.typed().session_fork(session.clone(), None)).await;
    assert_eq!(forked.context, protocol::api::ForkContext::Native, "{forked:?}");
    server.script([Reply::Text("It was teal.".into())]);
    assert!(api.ask(&forked.session_id, "which colour?").await.contains("teal"));
    let asked = conversation_text(&server.main_requests().pop().unwrap());
    assert!(asked.contains("remember the colour teal"), "{asked}");
    assert!(!asked.contains("RESUME CONTEXT"), "nothing injected: {asked}");
}

/// claude-agent-acp forgets rewound turns: after a rewind to the first turn, the next model
/// request is a fresh conversation carrying the first exchange (injected) and not the
/// rewound one.
#[tokio::test]
async fn claude_forgets_the_turns_a_rewind_took_out() {
    let server = ModelServer::start().await;
    let Some(daemon) = claude_daemon(&server, None).await else { return };
    let api = daemon.api().await;
    let session = api.ready_session("claude", &daemon.workspace("rw")).await;
    forget_after_rewind(&api, &session, &server).await;
}

/// codex-acp likewise.
#[tokio::test]
async fn codex_forgets_the_turns_a_rewind_took_out() {
    let server = ModelServer::start().await;
    let transcript = tempfile::tempdir().unwrap();
    let Some(daemon) = codex_daemon(&server, &transcript.path().join("codex")).await else {
        return;
    };
    let api = daemon.api().await;
    let session = api.ready_session("codex-here", &daemon.workspace("rw")).await;
    forget_after_rewind(&api, &session, &server).await;
}

/// Two turns, a rewind to the first, a third turn: its model request has the first
/// exchange and not the second.
async fn forget_after_rewind(api: &Api, session: &str, server: &ModelServer) {
    server.script([Reply::Text("Noted: the colour is teal.".into())]);
    api.ask(session, "remember the colour teal").await;
    server.script([Reply::Text("Noted: the animal is an otter.".into())]);
    api.ask(session, "remember the animal otter").await;
    let timeline = ok("timeline", api.typed().session_timeline(session.to_owned(), None)).await;
    let first = timeline.turns[0].turn_id.clone();
    let call = api.typed().session_rewind(session.to_owned(), first, None);
    let rewound = ok("task.session.rewind", call).await;
    assert_eq!(rewound.rewound.len(), 1, "{rewound:?}");
    server.script([Reply::Text("The colour was teal.".into())]);
    assert!(api.ask(session, "what do you remember?").await.contains("teal"));
    let asked = conversation_text(&server.main_requests().pop().unwrap());
    assert!(asked.contains("remember the colour teal"), "the kept turn: {asked}");
    assert!(!asked.contains("otter"), "the rewound turn is forgotten: {asked}");
}

/// codex-acp takes a steer into its running turn the same way.
#[tokio::test]
async fn codex_takes_a_steer_into_its_running_turn() {
    let server = ModelServer::start().await;
    let transcript = tempfile::tempdir().unwrap();
    let Some(daemon) = codex_daemon(&server, &transcript.path().join("codex")).await else {
        return;
    };
    let api = daemon.api().await;
    let session = api.ready_session("codex-here", &daemon.workspace("cs")).await;
    steer_mid_turn(&api, &session, &server).await;
}

/// A steer while the model has not answered: taken natively, in the same turn, which ends
/// with the model's answer to it; the history has the steer as the person's message.
async fn steer_mid_turn(api: &Api, session: &str, server: &ModelServer) {
    // The first request is held until the steer was taken: claude gives up on it at once,
    // codex finishes its message first (then asks again, with the steer).
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let first = Reply::Held(release.clone(), Box::new(Reply::Text("Going right.".into())));
    server.script([first, Reply::Text("Going left, as you say.".into())]);
    let asked = server.main_requests().len();
    let mut events = api.subscribe_at_end(session).await;
    let turn = api.prompt(session, "go right").await.unwrap();
    server.main_requested(asked + 1).await;
    let label = format!("{} steer", session_agent(api, session).await);
    let steered = timed(&label, api.steer(session, "no, go left")).await.expect("steered");
    assert_eq!(steered.mode, protocol::api::SteerMode::Native, "{steered:?}");
    assert_eq!(steered.turn_id.as_deref(), Some(turn.as_str()));
    release.notify_one();
    let seen = until(&mut events, turn_ended).await;
    let started = seen.iter().filter(|e| matches!(e.kind, EventKind::TurnStarted { .. })).count();
    assert_eq!(started, 1, "one turn: {seen:#?}");
    assert_eq!(stop_reason(seen.last().unwrap()), Some("end_turn"), "{:?}", seen.last());
    let last = server.main_requests().pop().expect("the model was asked again");
    assert!(conversation_text(&last).contains("no, go left"), "{last}");
    let history = api.history(session).await;
    let users: Vec<_> = history
        .iter()
        .filter(|entry| entry.kind == EntryType::UserMessage)
        .map(|entry| entry.content.as_str())
        .collect();
    assert_eq!(users, ["go right", "no, go left"], "{history:#?}");
    assert!(history.last().unwrap().content.contains("Going left"), "{history:#?}");
}

/// The same restore across a supervisor restart: the supervisor is SIGKILLed, the agent
/// dies while it is down, and the resumed agent still has the conversation.
#[tokio::test]
async fn claude_resumes_with_its_context_after_a_supervisor_restart() {
    let server = ModelServer::start().await;
    let Some(mut daemon) = claude_daemon(&server, None).await else { return };
    let api = daemon.api().await;
    let session = api.ready_session("claude", &daemon.workspace("s")).await;
    server.script([Reply::Text("Noted: the colour is teal.".into())]);
    api.ask(&session, "remember the colour teal").await;
    let sidecar = daemon.agentctl_pid(&session);
    drop(api);
    daemon.kill().await;
    tether_tests::daemon::sigkill(sidecar).await;
    daemon.restart().await;
    let api = daemon.api().await;
    let resumed = api.resume(&session).await.unwrap();
    assert_eq!(resumed.outcome, ResumeOutcome::NativeResume, "{resumed:?}");
    server.script([Reply::Text("It was teal.".into())]);
    assert!(api.ask(&session, "which colour?").await.contains("teal"));
    let seen = conversation_text(&server.main_requests().pop().unwrap());
    assert!(seen.contains("remember the colour teal"), "{seen}");
}

/// A daemon with an `opencode` profile running `opencode acp`, and a workspace whose
/// `opencode.json` points opencode's Anthropic provider at `server`.
async fn opencode_daemon(server: &ModelServer) -> Option<(Daemon, PathBuf)> {
    let profile = tether_tests::real_agents::opencode_profile()?;
    let daemon = Daemon::start_with_profiles(&[], &[("opencode.toml", &profile)]).await;
    let workspace = daemon.workspace("oc");
    let config = tether_tests::real_agents::opencode_config(&server.url);
    std::fs::write(workspace.join("opencode.json"), config).unwrap();
    Some((daemon, workspace))
}

/// opencode: a full turn against the scripted model, then kill → resume → the model's
/// next request carries the earlier conversation.
#[tokio::test]
async fn opencode_completes_a_turn_and_resumes_with_its_context() {
    let server = ModelServer::start().await;
    let Some((daemon, workspace)) = opencode_daemon(&server).await else { return };
    let api = daemon.api().await;
    let session = timed("opencode start", api.ready_session("opencode", &workspace)).await;
    resume_keeps_the_context(&daemon, &api, &session, &server).await;
}

/// opencode answers a cancelled prompt with `end_turn`; Tether records what the user did.
#[tokio::test]
async fn opencode_cancel_is_recorded_cancelled() {
    let server = ModelServer::start().await;
    let Some((daemon, workspace)) = opencode_daemon(&server).await else { return };
    let api = daemon.api().await;
    let session = api.ready_session("opencode", &workspace).await;
    cancel_mid_turn(&api, &session, &server).await;
}

/// Codex-acp 2.6.0 refuses `session/new` with `-32000` until
/// `authenticate`; the built-in profile's choice (`api-key`, with OPENAI_API_KEY set)
/// gets the session open, and without a key the agent is unavailable, saying why.
#[tokio::test]
async fn codex_authenticates_with_an_api_key_and_says_when_it_has_none() {
    let Some(bin) = installed("codex-acp") else { return };
    let command = agent_command(&bin, &[], None);
    let keyed = codex_profile(&command, "env = { OPENAI_API_KEY = \"sk-test\" }");
    let daemon = Daemon::start_with_profiles(&[], &[("codex.toml", &keyed)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("codex-here", &daemon.workspace("k")).await;
    let status = api.status(&session).await;
    assert_eq!(status.state, SessionState::WaitingForInput, "{status:?}");
    assert!(status.acp_session_id.is_some(), "{status:?}");
    drop(api);
    drop(daemon);

    // Without a key (and no login file) it is not offered at all, and says why.
    let keyless = codex_profile(&command, "");
    let env = [("OPENAI_API_KEY", ""), ("CODEX_API_KEY", "")];
    let daemon = Daemon::start_with_env(&[], &[("codex.toml", &keyless)], &env).await;
    let api = daemon.api().await;
    let refused = api.create_session("codex-here", &daemon.workspace("n")).await.unwrap_err();
    assert_eq!(refused.kind, ErrorKind::AgentUnavailable, "{refused:?}");
    assert!(
        refused.message.contains("needs credentials: set CODEX_API_KEY or OPENAI_API_KEY"),
        "{refused:?}"
    );
}

/// A daemon whose `codex-here` profile is the built-in one with an API key, and codex's
/// model provider pointed at `server` through `CODEX_CONFIG` (the adapter's own variable;
/// codex ignores OPENAI_BASE_URL, and speaks only the Responses API).
async fn codex_daemon(server: &ModelServer, transcript: &Path) -> Option<Daemon> {
    let profile = tether_tests::real_agents::codex_scripted_profile(&server.url, Some(transcript))?;
    Some(Daemon::start_with_profiles(&[], &[("codex.toml", &profile)]).await)
}

/// codex-acp end to end against the scripted Responses API: `authenticate` with the key,
/// a streamed turn, cancel while the model holds the request, then kill → resume: a
/// native restore (it advertises `session/resume`), and the model's next request carries
/// the earlier exchange.
#[tokio::test]
async fn codex_turns_cancels_and_resumes_with_its_context() {
    let server = ModelServer::start().await;
    let transcript = tempfile::tempdir().unwrap();
    let lines = transcript.path().join("codex");
    let Some(daemon) = codex_daemon(&server, &lines).await else { return };
    let api = daemon.api().await;
    let session =
        timed("codex start", api.ready_session("codex-here", &daemon.workspace("cx"))).await;
    cancel_mid_turn(&api, &session, &server).await;
    server.script([Reply::Text("A streamed answer from the scripted Responses API.".into())]);
    let reply = timed("codex turn", api.ask(&session, "say something")).await;
    assert_eq!(reply, "A streamed answer from the scripted Responses API.");
    let asked = server.main_requests().pop().expect("the model was asked");
    assert!(conversation_text(&asked).contains("say something"), "{asked}");
    resume_keeps_the_context(&daemon, &api, &session, &server).await;
    ok("task.session.stop", api.typed().session_stop(session.clone())).await;
    let methods = ["initialize", "authenticate", "session/new", "session/prompt", "session/cancel"];
    check_what_we_sent(&lines, &[&methods[..], &["session/resume"]].concat());
}

/// codex-acp (a Rust binary, not Node) in the same sandbox, its model endpoint — named in
/// its own config, not a `*_BASE_URL` — on the allowlist: its turn goes through the egress
/// proxy and completes.
#[tokio::test]
async fn codex_completes_a_turn_in_a_sandbox_with_its_endpoint_allowlisted() {
    let server = ModelServer::start().await;
    let Some(profile) = tether_tests::real_agents::codex_scripted_profile(&server.url, None) else {
        return;
    };
    let endpoint = server.url.trim_start_matches("http://");
    let profile = format!(
        "{profile}\n[sandbox]\nfilesystem = \"workspace\"\nnetwork = \"allowlist\"\nallow = [\"{endpoint}\"]\n"
    );
    let daemon = Daemon::start_with_profiles(&[], &[("codex.toml", &profile)]).await;
    let api = daemon.api().await;
    let session =
        timed("codex start in a sandbox", api.ready_session("codex-here", &daemon.workspace("b")))
            .await;
    server.script([Reply::Text("An answer from inside the sandbox.".into())]);
    let reply = timed("codex turn in a sandbox", api.ask(&session, "say something")).await;
    assert_eq!(reply, "An answer from inside the sandbox.");
    let asked = server.main_requests().pop().expect("the model was asked");
    assert!(conversation_text(&asked).contains("say something"), "{asked}");
}

/// A daemon whose `gemini-here` profile is the built-in one with the installed CLI, an
/// API key, and (with `server`) the Gemini API pointed at the scripted model. Its HOME's
/// `~/.gemini/settings.json` turns off telemetry and the session cleanup that deletes a
/// loaded session (an upstream bug).
async fn gemini_daemon(server: Option<&ModelServer>, transcript: Option<&Path>) -> Option<Daemon> {
    let profile =
        tether_tests::real_agents::gemini_profile(server.map(|s| s.url.as_str()), transcript)?;
    let daemon = Daemon::start_with_profiles(&[], &[("gemini.toml", &profile)]).await;
    tether_tests::real_agents::gemini_settings(daemon.home());
    Some(daemon)
}

/// gemini-cli 0.61.0 loses a session that is loaded in the UTC minute it was created in
/// (its start writes an empty conversation over the minute-stamped file; upstream
/// google-gemini/gemini-cli#28693). A user resumes later; the test ages the session files
/// as a later resume finds them, instead of waiting for the minute to turn. (Were it
/// lost, Tether falls back to a fresh session with the history, as tested with the mock.)
fn age_gemini_sessions(daemon: &Daemon) {
    let tmp = daemon.home().join(".gemini/tmp");
    for project in std::fs::read_dir(&tmp).unwrap().flatten() {
        let Ok(chats) = std::fs::read_dir(project.path().join("chats")) else { continue };
        for file in chats.flatten() {
            let name = file.file_name().to_string_lossy().into_owned();
            // session-YYYY-MM-DDTHH-MM-<id>.jsonl
            if let Some(rest) = name.strip_prefix("session-").and_then(|rest| rest.get(16..)) {
                let aged = format!("session-2000-01-01T00-00{rest}");
                std::fs::rename(file.path(), file.path().with_file_name(aged)).unwrap();
            }
        }
    }
}

/// gemini-cli end to end against the scripted Gemini API: a streamed turn, cancel while
/// the model holds the request, then kill → resume: `session/load` (it advertises
/// `loadSession`), the model's next request carries the earlier exchange, and its replay
/// (which trails the load's answer) is not recorded again.
#[tokio::test]
async fn gemini_turns_cancels_and_resumes_with_its_context() {
    let server = ModelServer::start().await;
    let transcript = tempfile::tempdir().unwrap();
    let lines = transcript.path().join("gemini");
    let Some(daemon) = gemini_daemon(Some(&server), Some(&lines)).await else { return };
    let api = daemon.api().await;
    let workspace = daemon.workspace("gm");
    let session = timed("gemini start", api.ready_session("gemini-here", &workspace)).await;
    cancel_mid_turn(&api, &session, &server).await;
    let age = || age_gemini_sessions(&daemon);
    resume_restores(&daemon, &api, &session, &server, ResumeOutcome::NativeLoad, age).await;
    let history = api.history(&session).await;
    let agent_messages: Vec<&str> = history
        .iter()
        .filter(|e| e.kind == EntryType::AgentMessage)
        .map(|e| e.content.as_str())
        .collect();
    assert_eq!(
        agent_messages.iter().filter(|m| m.contains("Noted: the code word")).count(),
        1,
        "the load's replay is not recorded again: {history:?}"
    );
    ok("task.session.stop", api.typed().session_stop(session.clone())).await;
    let methods = ["initialize", "session/new", "session/prompt", "session/cancel", "session/load"];
    check_what_we_sent(&lines, &methods);
}

/// gemini-cli could not create a file under Tether: its write begins with a read of the
/// file through ACP, and no JSON-RPC error for a missing file reaches its check as ENOENT
/// (the error arrives as a plain object), so every new file failed before a permission was
/// asked. Its profile now offers no `fs/*` (`session.client_fs = false`). And the CLI's
/// `allow` picked the first allow option in gemini's order, "always". Now the new file is
/// asked for, allowed once from the CLI, and written.
#[tokio::test]
async fn gemini_creates_a_new_file_after_the_cli_allows_it_once() {
    let server = ModelServer::start().await;
    let Some(daemon) = gemini_daemon(Some(&server), None).await else { return };
    let api = daemon.api().await;
    let workspace = daemon.workspace("gw");
    let session = timed("gemini start", api.ready_session("gemini-here", &workspace)).await;
    let target = workspace.join("created.txt");
    server.script([
        Reply::ToolUse {
            name: "write_file".into(),
            input: json!({"file_path": target, "content": "made by the scripted model\n"}),
        },
        Reply::Text("The file is made.".into()),
    ]);
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, "make created.txt").await.unwrap();
    let (_, request_id, params) = until_permission_request(&mut events).await;
    assert!(!target.exists(), "nothing is written before the answer");
    let (code, out, err) =
        daemon.cli(&["permission", "respond", &session, &request_id, "allow"]).await;
    assert_eq!(code, 0, "{err}");
    let options: Vec<acp::PermissionOption> =
        serde_json::from_value(params["options"].clone()).expect("ACP permission options");
    let once = options
        .iter()
        .find(|option| option.kind == acp::PermissionOptionKind::AllowOnce)
        .unwrap_or_else(|| panic!("an allow-once option: {options:?}"));
    assert!(out.contains(&format!("answered: {}", once.option_id)), "allowed once: {out}");
    let seen = until(&mut events, turn_ended).await;
    assert_eq!(stop_reason(seen.last().unwrap()), Some("end_turn"), "{:?}", seen.last());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "made by the scripted model\n");
    ok("task.session.stop", api.typed().session_stop(session.clone())).await;
}

/// And 3 for gemini: with only GEMINI_API_KEY (no Google login, no gateway),
/// its `session/load` answers `-32000` until ACP `authenticate`; the built-in profile's
/// `gemini-api-key` choice is sent and the load retried. A session that never had a turn
/// has nothing saved, so gemini then fails the load ("No previous sessions found") — which
/// falls back to a fresh session with a notice, never FAILED. (No model is asked.)
#[tokio::test]
async fn gemini_authenticates_before_a_load_and_a_failed_load_falls_back() {
    let Some(daemon) = gemini_daemon(None, None).await else { return };
    let api = daemon.api().await;
    let session = api.ready_session("gemini-here", &daemon.workspace("ga")).await;
    kill_sidecar(&daemon, &api, &session).await;
    age_gemini_sessions(&daemon);
    let mut events = api.subscribe_at_end(&session).await;
    let resumed = api.resume(&session).await.unwrap();
    let seen = until(&mut events, |e| matches!(e.kind, EventKind::ResumeOutcome { .. })).await;
    let steps = progress_steps(&seen);
    let at = |step: &str| {
        steps.iter().position(|s| s == step).unwrap_or_else(|| panic!("{step}: {steps:?}"))
    };
    assert!(at("restoring session/load") < at("authenticating gemini-api-key"), "{steps:?}");
    assert_eq!(
        (resumed.state, resumed.outcome),
        (SessionState::WaitingForInput, ResumeOutcome::Fresh),
        "{resumed:?}"
    );
    assert!(
        notices(&seen).iter().any(|m| m.starts_with("restoring the stored session failed")),
        "{seen:?}"
    );
}

/// Claude-agent-acp's model is a config option (`category: model`); chosen
/// through Tether it is what the model server is asked for, also after the agent
/// restarted (a pause and a resume).
#[tokio::test]
async fn claude_model_chosen_through_tether_reaches_the_model_server_and_survives_a_resume() {
    let server = ModelServer::start().await;
    let Some(daemon) = claude_daemon(&server, None).await else { return };
    let api = daemon.api().await;
    let session = timed("claude start", api.ready_session("claude", &daemon.workspace("m"))).await;
    let (default_model, chosen, after) =
        crate::real_settings::choose_model(&api, &session, &server, "haiku").await;
    assert!(chosen.contains("haiku") && chosen != default_model, "{default_model} → {chosen}");
    // (claude-agent-acp keeps the model in its own session and reports it at the resume,
    // so Tether has nothing to set again; mock-agent, which forgets, is the test of that.)
    assert_eq!(after, chosen, "the model after the resume");
}

/// A turn cancelled while the model holds it, then kill → `session/load` with the earlier
/// exchange in the model's next request; the session stopped, and every line Tether sent
/// (recorded under `lines`) valid.
async fn cancel_then_load(
    daemon: &Daemon,
    api: &Api,
    session: &str,
    server: &ModelServer,
    lines: &Path,
) {
    cancel_mid_turn(api, session, server).await;
    resume_restores(daemon, api, session, server, ResumeOutcome::NativeLoad, || ()).await;
    ok("task.session.stop", api.typed().session_stop(session.to_owned())).await;
    let methods = ["initialize", "session/new", "session/prompt", "session/cancel", "session/load"];
    check_what_we_sent(lines, &methods);
}

/// Qwen Code (the built-in profile, installed here) against the scripted
/// model as an OpenAI-compatible endpoint: a streamed turn, cancel while the model holds
/// the request (it answers with an error, recorded as the cancel it is), then kill → a
/// native restore, and the model's next request carries the earlier exchange. It
/// advertises `session/resume` but answers it "Method not found": the built-in profile
/// loads instead, and a profile without that pin gets there too, with a notice.
#[tokio::test]
async fn qwen_turns_cancels_and_resumes_with_its_context() {
    let server = ModelServer::start().await;
    let transcript = tempfile::tempdir().unwrap();
    let lines = transcript.path().join("qwen");
    let Some(profile) = tether_tests::real_agents::qwen_profile(&server.url, Some(&lines)) else {
        return;
    };
    let pin = "restore_method = \"load\"\n";
    assert!(profile.contains(pin), "{profile}");
    let unpinned = profile.replace(pin, "").replace("id = \"qwen-here\"", "id = \"qwen-unpinned\"");
    let profiles = [("qwen.toml", profile.as_str()), ("unpinned.toml", unpinned.as_str())];
    let daemon = Daemon::start_with_profiles(&[], &profiles).await;
    tether_tests::real_agents::qwen_settings(daemon.home());
    let api = daemon.api().await;
    let session =
        timed("qwen start", api.ready_session("qwen-here", &daemon.workspace("qw"))).await;
    cancel_then_load(&daemon, &api, &session, &server, &lines).await;

    let other = api.ready_session("qwen-unpinned", &daemon.workspace("qw2")).await;
    resume_restores(&daemon, &api, &other, &server, ResumeOutcome::NativeLoad, || ()).await;
    let window =
        ok("window", api.typed().session_event_window(other.clone(), None, Some(300))).await;
    let said = notices(&window.events);
    assert!(
        said.iter().any(|n| n.contains("advertises session/resume but does not take it")),
        "{said:?}"
    );
    ok("task.session.stop", api.typed().session_stop(other)).await;
}

/// GitHub Copilot CLI (the built-in profile, installed here) with its own
/// model provider pointed at the scripted model (no GitHub login): a streamed turn, cancel
/// while the model holds the request, then kill → `session/load` (it advertises it), and
/// the model's next request carries the earlier exchange.
#[tokio::test]
async fn copilot_turns_cancels_and_resumes_with_its_context() {
    let server = ModelServer::start().await;
    let transcript = tempfile::tempdir().unwrap();
    let lines = transcript.path().join("copilot");
    let Some(profile) = tether_tests::real_agents::copilot_profile(&server.url, Some(&lines))
    else {
        return;
    };
    let daemon = Daemon::start_with_profiles(&[], &[("copilot.toml", &profile)]).await;
    let api = daemon.api().await;
    let workspace = daemon.workspace("cp");
    let session = timed("copilot start", api.ready_session("copilot-here", &workspace)).await;
    cancel_then_load(&daemon, &api, &session, &server, &lines).await;
}

/// Auggie (installed here) starts and answers `initialize`, but offers no
/// way to log in over ACP and needs Augment's service: without a login the session fails
/// saying to log in with its own CLI — not to add an `[[auth]]` method, which cannot help.
#[tokio::test]
async fn auggie_without_a_login_says_to_log_in_with_its_own_cli() {
    let Some(profile) = tether_tests::real_agents::auggie_profile() else { return };
    let daemon = Daemon::start_with_profiles(&[], &[("auggie.toml", &profile)]).await;
    let api = daemon.api().await;
    let workspace = daemon.workspace("ag");
    let task = ok("task", api.typed().task_create("auggie".into(), None)).await;
    let create = tether_tests::daemon::Create::new(&task.id, "auggie-here", Some(&workspace));
    let created = ok("create", create.send(api.typed())).await;
    let mut events = api.subscribe(&created.id, 0).await;
    let (state, error) = tether_tests::daemon::settled(&mut events).await;
    assert_eq!(state, SessionState::Failed, "{error}");
    assert!(error.contains("run `auggie login` from your terminal"), "the agent's words: {error}");
    assert!(error.contains("log in with the agent's own program"), "{error}");
    assert!(!error.contains("[[auth]]"), "no [[auth]] method can help: {error}");
}

/// What the agents that replay a restored session (as `session/update`s) left in the
/// history: the first exchange is recorded once, not again at each restore.
fn assert_recorded_once(history: &[protocol::api::HistoryEntry], text: &str) {
    let agent_messages: Vec<&str> = history
        .iter()
        .filter(|e| e.kind == EntryType::AgentMessage)
        .map(|e| e.content.as_str())
        .collect();
    assert_eq!(
        agent_messages.iter().filter(|m| m.contains(text)).count(),
        1,
        "the restore's replay is not recorded again: {history:?}"
    );
}

/// fast-agent (PyPI fast-agent-mcp, in its venv here, on the Python 3.12+ setup found)
/// with its `generic` provider pointed at the scripted model as an OpenAI-compatible
/// endpoint: a streamed turn, cancel while the model holds the request, then kill → a
/// native restore (it advertises `session/resume`), and the model's next request carries
/// the earlier exchange.
#[tokio::test]
async fn fast_agent_turns_cancels_and_resumes_with_its_context() {
    let server = ModelServer::start().await;
    let transcript = tempfile::tempdir().unwrap();
    let lines = transcript.path().join("fast-agent");
    let Some(profile) = tether_tests::real_agents::fast_agent_profile(&server.url, Some(&lines))
    else {
        return;
    };
    let daemon = Daemon::start_with_profiles(&[], &[("fast-agent.toml", &profile)]).await;
    turn_cancel_and_native_resume(&daemon, &server, "fast-agent-here", &lines).await;
}

/// A Python agent's run against the scripted model (Chat Completions): a streamed turn
/// the model saw, a cancel while the model holds the request, then kill → a native
/// `session/resume` whose next request carries the earlier exchange, recorded once; every
/// line Tether sent it valid against the schema.
async fn turn_cancel_and_native_resume(
    daemon: &Daemon,
    server: &ModelServer,
    profile: &str,
    lines: &Path,
) {
    let api = daemon.api().await;
    let workspace = daemon.workspace(profile);
    let session = timed("the agent's start", api.ready_session(profile, &workspace)).await;
    server.script([Reply::Text("A streamed answer from the scripted Chat Completions.".into())]);
    let reply = timed("the agent's turn", api.ask(&session, "say something")).await;
    assert_eq!(reply, "A streamed answer from the scripted Chat Completions.");
    let asked = server.main_requests().pop().expect("the model was asked");
    assert!(conversation_text(&asked).contains("say something"), "{asked}");
    cancel_mid_turn(&api, &session, server).await;
    resume_keeps_the_context(daemon, &api, &session, server).await;
    assert_recorded_once(&api.history(&session).await, "Noted: the code word");
    ok("task.session.stop", api.typed().session_stop(session.clone())).await;
    let methods = ["initialize", "session/new", "session/prompt", "session/cancel"];
    check_what_we_sent(lines, &[&methods[..], &["session/resume"]].concat());
}

/// Kimi CLI 1.51.0 (PyPI kimi-cli, in its venv here) with a provider of its own config
/// pointed at the scripted model (Chat Completions) and a placeholder where its login
/// would be (it only checks that one is there): a streamed turn, cancel while the model
/// holds the request, then kill → a native restore, and the model's next request carries
/// the earlier exchange.
#[tokio::test]
async fn kimi_turns_cancels_and_resumes_with_its_context() {
    let server = ModelServer::start().await;
    let transcript = tempfile::tempdir().unwrap();
    let lines = transcript.path().join("kimi");
    let Some(profile) = tether_tests::real_agents::kimi_profile(Some(&lines)) else { return };
    let daemon = Daemon::start_with_profiles(&[], &[("kimi.toml", &profile)]).await;
    tether_tests::real_agents::kimi_settings(daemon.home(), &server.url);
    turn_cancel_and_native_resume(&daemon, &server, "kimi-here", &lines).await;
}
