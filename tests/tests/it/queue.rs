//! The prompt queue end to end, with real daemons and mock-agent counting turns from its
//! side (`--turn-log`): prompts sent while a turn runs — or while the session is starting,
//! paused or parked — are queued durably and run once each, in order, across a daemon
//! SIGKILL and a pause; a failed turn or launch halts the queue until `queue.resume`; the
//! CLI says where a prompt was queued and follows its turn.

use std::path::Path;

use protocol::api::{ApiClient, EventKind, PromptStarted, SessionEvent, SessionState};
use tether_tests::daemon::{Api, ok, until};

use crate::workflows::daemon;

/// The prompts the agents started to answer, in the order they did.
fn answered(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(|line| {
            let entry: serde_json::Value = serde_json::from_str(line).expect("a turn-log line");
            entry["prompt"].as_str().expect("a prompt").to_owned()
        })
        .collect()
}

/// The queued prompt's id, asserting that `started` queued it at `position`.
fn queued_at(started: &PromptStarted, position: usize) -> String {
    assert!(started.queued && started.turn_id.is_none(), "queued: {started:?}");
    assert_eq!(started.position, Some(position), "{started:?}");
    started.prompt_id.clone().expect("a queued prompt has an id")
}

/// Follows `session` from the start until the turn its queued prompt `prompt_id` became
/// has ended; returns everything seen.
async fn until_queued_turn_ends(api: &Api, session: &str, prompt_id: &str) -> Vec<SessionEvent> {
    let mut events = api.subscribe(session, 0).await;
    let mut turn: Option<String> = None;
    until(&mut events, |event| match &event.kind {
        EventKind::TurnStarted { turn_id, prompt_id: Some(id), .. } if id == prompt_id => {
            turn = Some(turn_id.clone());
            false
        }
        EventKind::TurnEnded { turn_id, .. } => turn.as_ref() == Some(turn_id),
        _ => false,
    })
    .await
}

#[tokio::test]
async fn queued_prompts_run_once_each_in_order_across_a_daemon_sigkill() {
    let (mut daemon, log, workspace) = daemon(None).await;
    let api = daemon.api().await;
    let session = api.ready_session("flow", &workspace).await;
    api.prompt(&session, "/sleep 1500\nfirst").await.expect("the first prompt starts a turn");
    let second = queued_at(&api.prompt_or_queue(&session, "second").await.unwrap(), 1);
    let third = queued_at(&api.prompt_or_queue(&session, "third").await.unwrap(), 2);
    let queue = api.status(&session).await.queue;
    let ids: Vec<_> = queue.prompts.iter().map(|prompt| prompt.prompt_id.clone()).collect();
    assert_eq!(ids, [second.clone(), third.clone()], "durable before the answers, in order");
    drop(api);
    daemon.kill().await;
    daemon.restart().await;
    let api = daemon.api().await;
    let seen = until_queued_turn_ends(&api, &session, &third).await;
    // (The log has each prompt's message, without mock-agent's commands.)
    assert_eq!(answered(&log), ["first", "second", "third"], "{seen:#?}");
    let status = api.status(&session).await;
    assert!(status.queue.prompts.is_empty() && status.queue.halted.is_none(), "{status:?}");
}

/// A queued prompt left the queue as a turn, and the supervisor died before the prompt
/// reached the agent (`prompt.recorded`): nobody waits to send it again, so the restart
/// does, once — it was answered `queued`, and once taken it was only in its turn's row.
#[tokio::test]
async fn a_queued_prompt_whose_turn_was_cut_before_delivery_is_sent_again_once() {
    // The first prompt's turn is the first hit; the queued one's, the second.
    let (mut daemon, log, workspace) = daemon(Some("prompt.recorded@2")).await;
    let api = daemon.api().await;
    let session = api.ready_session("flow", &workspace).await;
    api.prompt(&session, "/sleep 300\nfirst").await.expect("the first prompt starts a turn");
    let queued = queued_at(&api.prompt_or_queue(&session, "second").await.unwrap(), 1);
    drop(api);
    daemon.wait_exit().await;
    daemon.restart_with_env(&[]).await;
    let api = daemon.api().await;
    until_queued_turn_ends(&api, &session, &queued).await;
    assert_eq!(answered(&log), ["first", "second"]);
    let history = api.history(&session).await;
    let asked = history.iter().filter(|entry| entry.content.contains("second")).count();
    assert_eq!(asked, 2, "its prompt and the reply, once each: {history:#?}");
}

#[tokio::test]
async fn a_failed_turn_halts_the_queue_until_it_is_resumed() {
    let (daemon, log, workspace) = daemon(None).await;
    let api = daemon.api().await;
    let session = api.ready_session("flow", &workspace).await;
    let mut events = api.subscribe(&session, 0).await;
    // The agent dies in the middle of the first turn: it fails.
    api.prompt(&session, "/sleep 300\n/crash 3").await.expect("a turn starts");
    let waiting = queued_at(&api.prompt_or_queue(&session, "after the crash").await.unwrap(), 1);
    until(
        &mut events,
        |event| matches!(&event.kind, EventKind::Queue { queue } if queue.halted.is_some()),
    )
    .await;
    let halted = api.status(&session).await.queue;
    assert_eq!(halted.prompts.len(), 1, "the queued prompt waits: {halted:?}");
    assert!(halted.halted.as_deref().unwrap_or_default().contains("failed"), "{halted:?}");
    let ran = |log: &Path| answered(log).iter().filter(|p| p.contains("after the crash")).count();
    assert_eq!(ran(&log), 0, "not run while halted");
    // Go on: the agent comes back and the queued prompt runs, once.
    let (code, out, err) = daemon.cli(&["queue", "resume", &session]).await;
    assert_eq!(code, 0, "{out}{err}");
    // (A fresh agent gets the history injected before it: the prompt is in what it got.)
    until_queued_turn_ends(&api, &session, &waiting).await;
    assert_eq!(ran(&log), 1, "{:?}", answered(&log));
}

#[tokio::test]
async fn a_pause_keeps_the_queue_and_its_resume_runs_it_once() {
    let (daemon, log, workspace) = daemon(None).await;
    let api = daemon.api().await;
    let session = api.ready_session("flow", &workspace).await;
    let mut events = api.subscribe(&session, 0).await;
    api.prompt(&session, "/sleep 500\nbefore the pause").await.expect("a turn starts");
    let waiting = queued_at(&api.prompt_or_queue(&session, "after the pause").await.unwrap(), 1);
    // The pause waits for the running turn, then takes effect before the queue's head.
    let pause = api.typed().session_pause(session.clone(), Some("lunch".into()), Some(60_000));
    ok("pause", pause).await;
    until(&mut events, |event| matches!(event.kind, EventKind::Paused { .. })).await;
    let status = api.status(&session).await;
    assert_eq!(status.state, SessionState::Paused);
    assert_eq!(status.queue.prompts.len(), 1, "the queue waits: {status:?}");
    assert!(status.queue.halted.is_none(), "a pause does not halt it: {status:?}");
    let ran = |log: &Path| answered(log).iter().filter(|p| p.contains("after the pause")).count();
    assert_eq!(ran(&log), 0, "{:?}", answered(&log));
    // Resumed: the queued prompt runs, once.
    api.resume(&session).await.expect("the session resumes");
    until_queued_turn_ends(&api, &session, &waiting).await;
    assert_eq!(ran(&log), 1, "{:?}", answered(&log));
    assert!(api.status(&session).await.queue.prompts.is_empty());
}

#[tokio::test]
async fn the_cli_says_where_a_prompt_was_queued_and_follows_its_turn() {
    let (daemon, _log, workspace) = daemon(None).await;
    let api = daemon.api().await;
    let session = api.ready_session("flow", &workspace).await;
    api.prompt(&session, "/sleep 1000\nfirst").await.expect("a turn starts");
    let (code, out, err) = daemon.cli(&["prompt", &session, "/say queued reply"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("queued at position 1 behind the running turn"), "{err}");
    assert!(out.starts_with("queued reply\n[turn completed"), "its own turn's reply: {out}");
    assert!(!out.contains("first"), "not the running turn's: {out}");
    let (code, out, err) = daemon.cli(&["queue", "list", &session]).await;
    assert_eq!((code, out.trim()), (0, "no prompt is queued"), "{err}");
}

/// Pauses `session` (no turn runs: at once) and waits until it is `PAUSED`.
async fn paused(api: &Api, session: &str) {
    let mut events = api.subscribe_at_end(session).await;
    ok("pause", api.typed().session_pause(session.to_owned(), None, None)).await;
    until(&mut events, |event| matches!(event.kind, EventKind::Paused { .. })).await;
}

#[tokio::test]
async fn a_prompt_to_a_paused_session_is_queued_at_once_and_runs_once_its_agent_is_up() {
    let (daemon, log, workspace) = daemon(None).await;
    let api = daemon.api().await;
    let session = api.ready_session("flow", &workspace).await;
    paused(&api, &session).await;
    let started = api.prompt_or_queue(&session, "while parked").await.unwrap();
    let prompt_id = queued_at(&started, 1);
    assert!(started.waking, "the answer says the agent is being brought back: {started:?}");
    let seen = until_queued_turn_ends(&api, &session, &prompt_id).await;
    // In the queue (a `queue` event holding it) before its turn took it out.
    let listed = seen.iter().position(|event| match &event.kind {
        EventKind::Queue { queue } => queue.prompts.iter().any(|p| p.prompt_id == prompt_id),
        _ => false,
    });
    let started_at = seen.iter().position(|event| {
        matches!(&event.kind, EventKind::TurnStarted { prompt_id: Some(id), .. } if *id == prompt_id)
    });
    assert!(listed.is_some() && listed < started_at, "{seen:#?}");
    assert_eq!(answered(&log), ["while parked"]);
    let status = api.status(&session).await;
    assert_eq!(status.state, SessionState::WaitingForInput, "{status:?}");
    assert!(status.queue.prompts.is_empty() && status.queue.halted.is_none(), "{status:?}");
}

/// The daemon dies as the agent it wakes for a queued prompt starts: the restart finds
/// the prompt queued, its session at rest, and brings the agent back for it — it runs once.
#[tokio::test]
async fn a_prompt_queued_while_its_agent_wakes_runs_once_across_a_daemon_sigkill() {
    // The session's first launch is the first hit; the wake's, the second.
    let (mut daemon, log, workspace) = daemon(Some("launch.after_runtime@2")).await;
    let api = daemon.api().await;
    let session = api.ready_session("flow", &workspace).await;
    paused(&api, &session).await;
    // Answered `queued`, or not at all when the fault came first: taken either way.
    let answer = api.prompt_or_queue(&session, "woken").await;
    drop(api);
    daemon.wait_exit().await;
    daemon.restart_with_env(&[]).await;
    let api = daemon.api().await;
    api.until_turn_of_prompt_ends(&session, "woken").await;
    assert_eq!(answered(&log), ["woken"], "once: {answer:?}");
    let status = api.status(&session).await;
    assert!(status.queue.prompts.is_empty(), "{status:?}");
}

/// A daemon whose `flaky` agent fails to start while `root/broken` exists.
async fn flaky_daemon() -> (tether_tests::daemon::Daemon, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap().keep();
    let (log, broken) = (dir.join("turns.jsonl"), dir.join("broken"));
    let profile = format!(
        "id = \"flaky\"\ncommand = [\"mock-agent\", \"--turn-log\", \"{}\", \"--fail-while\", \"{}\"]\nprotocol = \"acp\"\n",
        log.display(),
        broken.display()
    );
    let daemon =
        tether_tests::daemon::Daemon::start_with_env(&[], &[("flaky.toml", &profile)], &[]).await;
    (daemon, log, broken)
}

#[tokio::test]
async fn a_launch_that_fails_for_a_queued_prompt_halts_the_queue_and_the_cli_says_why() {
    let (daemon, log, broken) = flaky_daemon().await;
    let workspace = daemon.workspace("ws");
    let api = daemon.api().await;
    let session = api.ready_session("flaky", &workspace).await;
    paused(&api, &session).await;
    std::fs::write(&broken, "").unwrap();
    let (code, out, err) = daemon.cli(&["prompt", &session, "after the fix"]).await;
    assert_ne!(code, 0, "{out}{err}");
    assert!(err.contains("the session's agent is not running: starting it"), "{err}");
    assert!(err.contains("the prompt queue halted: the agent did not start"), "{err}");
    assert!(err.contains(&format!("supervisor queue resume {session}")), "{err}");
    let status = api.status(&session).await;
    assert_eq!(status.queue.prompts.len(), 1, "it stays queued: {status:?}");
    assert!(status.queue.halted.as_deref().unwrap_or_default().contains("did not start"));
    assert!(answered(&log).is_empty(), "{:?}", answered(&log));
    // Fixed, and told to go on: the agent comes back and the prompt runs, once.
    std::fs::remove_file(&broken).unwrap();
    let prompt_id = status.queue.prompts[0].prompt_id.clone();
    let (code, out, err) = daemon.cli(&["queue", "resume", &session]).await;
    assert_eq!(code, 0, "{out}{err}");
    until_queued_turn_ends(&api, &session, &prompt_id).await;
    assert_eq!(answered(&log), ["after the fix"]);
}

#[tokio::test]
async fn the_cli_prompt_to_a_paused_session_starts_its_agent_and_prints_the_reply() {
    let (daemon, log, workspace) = daemon(None).await;
    let api = daemon.api().await;
    let session = api.ready_session("flow", &workspace).await;
    paused(&api, &session).await;
    let (code, out, err) = daemon.cli(&["prompt", &session, "/say back again\nhello"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("the session's agent is not running: starting it"), "{err}");
    assert!(out.starts_with("back again\n[turn completed"), "{out}");
    assert_eq!(answered(&log), ["hello"], "once");
}
