//! Steering end to end, with real daemons and mock-agent counting turns and steers from
//! its side (`--turn-log`): an agent that takes a message mid-turn (`--steering`, as
//! claude-agent-acp and codex-acp do) gets it in its running turn, recorded in the history;
//! one that cannot has its turn cancelled at once and the message run next, ahead of the
//! queue, told what the cancelled turn had done — once, across a daemon SIGKILL too. The
//! CLI's `steer` says which happened and follows the turn.

use std::path::{Path, PathBuf};

use protocol::api::{ApiClient, EntryType, EventKind, SessionEvent, SteerMode, TurnState};
use tether_tests::daemon::{Api, Daemon, until};

/// A daemon whose `flow` agent logs to `root/turns.jsonl`, taking steers when `steering`;
/// armed with `fault` (`TETHER_FAULT`) when given.
async fn daemon(steering: bool, fault: Option<&str>) -> (Daemon, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap().keep();
    let log = dir.join("turns.jsonl");
    let flag = if steering { ", \"--steering\"" } else { "" };
    let profile = format!(
        "id = \"flow\"\ncommand = [\"mock-agent\", \"--turn-log\", \"{}\"{flag}]\nprotocol = \"acp\"\n",
        log.display()
    );
    let env: Vec<(&str, &str)> = fault.map(|f| ("TETHER_FAULT", f)).into_iter().collect();
    let daemon = Daemon::start_with_env(&[], &[("flow.toml", &profile)], &env).await;
    let workspace = daemon.workspace("ws");
    (daemon, log, workspace)
}

/// What the agent was sent, in order: `("prompt", text)` or `("steer", text)`.
fn agent_saw(log: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(|line| {
            let entry: serde_json::Value = serde_json::from_str(line).expect("a turn-log line");
            let kind = if entry.get("steer").is_some() { "steer" } else { "prompt" };
            (kind.to_owned(), entry[kind].as_str().expect("its text").to_owned())
        })
        .collect()
}

/// Starts a long turn and waits until the agent is in it (its thought arrived): a steer
/// sent before the agent registered the turn would find none.
async fn long_turn(api: &Api, session: &str, script: &str) -> String {
    let mut events = api.subscribe_at_end(session).await;
    let script = if script.is_empty() { String::new() } else { format!("{script}\n") };
    let turn = api.prompt(session, &format!("/think working\n{script}/sleep 60000\nfirst")).await;
    let turn = turn.expect("the first prompt starts a turn");
    until(&mut events, |event| matches!(event.kind, EventKind::AgentThoughtChunk { .. })).await;
    turn
}

/// Follows `session` from the start until `turn` ended; returns everything seen.
async fn until_turn_ends(api: &Api, session: &str, turn: &str) -> Vec<SessionEvent> {
    let mut events = api.subscribe(session, 0).await;
    until(
        &mut events,
        |event| matches!(&event.kind, EventKind::TurnEnded { turn_id, .. } if turn_id == turn),
    )
    .await
}

/// Follows `session` from the start until the turn whose `turn_started` `picked` chooses
/// has ended; returns everything seen.
async fn until_picked_turn_ends(
    api: &Api,
    session: &str,
    picked: impl Fn(&EventKind) -> bool,
) -> Vec<SessionEvent> {
    let mut events = api.subscribe(session, 0).await;
    let mut turn: Option<String> = None;
    until(&mut events, |event| match &event.kind {
        EventKind::TurnStarted { turn_id, .. } if picked(&event.kind) => {
            turn = Some(turn_id.clone());
            false
        }
        EventKind::TurnEnded { turn_id, .. } => turn.as_ref() == Some(turn_id),
        _ => false,
    })
    .await
}

/// The turn that ran the queued prompt `prompt_id`, and its `steer_of`.
fn turn_of(seen: &[SessionEvent], prompt_id: &str) -> Option<(String, Option<String>)> {
    seen.iter().find_map(|event| match &event.kind {
        EventKind::TurnStarted { turn_id, prompt_id: Some(id), steer_of, .. }
            if id == prompt_id =>
        {
            Some((turn_id.clone(), steer_of.clone()))
        }
        _ => None,
    })
}

#[tokio::test]
async fn an_agent_that_takes_a_steer_gets_it_in_its_running_turn() {
    let (daemon, log, workspace) = daemon(true, None).await;
    let api = daemon.api().await;
    let session = api.ready_session("flow", &workspace).await;
    let turn = long_turn(&api, &session, "").await;
    let steered = api.steer(&session, "go left instead").await.expect("task.session.steer");
    assert_eq!(steered.mode, SteerMode::Native, "{steered:?}");
    assert_eq!(steered.turn_id.as_deref(), Some(turn.as_str()));
    // The steer ends the agent's wait: the same turn completes, answering it.
    let seen = until_turn_ends(&api, &session, &turn).await;
    let ended = seen.iter().find_map(|event| match &event.kind {
        EventKind::TurnEnded { turn_id, state, .. } if *turn_id == turn => Some(*state),
        _ => None,
    });
    assert_eq!(ended, Some(TurnState::Completed), "{seen:#?}");
    let started = seen.iter().filter(|e| matches!(e.kind, EventKind::TurnStarted { .. })).count();
    assert_eq!(started, 1, "no other turn: {seen:#?}");
    assert!(
        seen.iter().any(|event| matches!(&event.kind,
        EventKind::Steered { turn_id, prompt, mode: SteerMode::Native, .. }
            if *turn_id == turn && prompt == "go left instead")),
        "{seen:#?}"
    );
    assert_eq!(
        agent_saw(&log),
        [("prompt".into(), "first".into()), ("steer".into(), "go left instead".into())]
    );
    // The history has it as the person's message within the turn, before the reply.
    let history = api.history(&session).await;
    let users: Vec<_> = history
        .iter()
        .filter(|entry| entry.kind == EntryType::UserMessage)
        .map(|entry| entry.content.as_str())
        .collect();
    assert_eq!(users.last(), Some(&"go left instead"), "{history:#?}");
    let reply = history.last().expect("the reply");
    assert!(reply.content.contains("steered: go left instead"), "{reply:?}");
}

#[tokio::test]
async fn a_steer_of_an_agent_that_cannot_cancels_the_turn_and_runs_next_ahead_of_the_queue() {
    let (daemon, log, workspace) = daemon(false, None).await;
    let api = daemon.api().await;
    let session = api.ready_session("flow", &workspace).await;
    let turn = long_turn(&api, &session, "/tool").await;
    let queued = api.prompt_or_queue(&session, "queued before the steer").await.unwrap();
    let queued = queued.prompt_id.expect("queued");
    let steered = api.steer(&session, "go right instead").await.expect("task.session.steer");
    assert_eq!(steered.mode, SteerMode::Fallback, "{steered:?}");
    assert_eq!((steered.turn_id.as_deref(), steered.position), (Some(turn.as_str()), Some(1)));
    let steer = steered.prompt_id.expect("the steer's queued prompt");
    // The queued prompt runs after it: follow until its turn ended.
    let seen = until_picked_turn_ends(
        &api,
        &session,
        |kind| matches!(kind, EventKind::TurnStarted { prompt_id: Some(id), .. } if *id == queued),
    )
    .await;
    // It was queued first, ahead of the prompt queued before it, naming the turn.
    let first_queued = seen.iter().find_map(|event| match &event.kind {
        EventKind::Queue { queue } if queue.prompts.len() == 2 => Some(queue.prompts.clone()),
        _ => None,
    });
    let order: Vec<_> =
        first_queued.unwrap_or_default().into_iter().map(|p| (p.prompt_id, p.steer_of)).collect();
    assert_eq!(order, [(steer.clone(), Some(turn.clone())), (queued.clone(), None)], "{seen:#?}");
    let cancelled = seen.iter().find_map(|event| match &event.kind {
        EventKind::TurnEnded { turn_id, stop_reason, .. } if *turn_id == turn => {
            stop_reason.clone()
        }
        _ => None,
    });
    assert_eq!(cancelled.as_deref(), Some("cancelled"), "{seen:#?}");
    let (_, steer_of) = turn_of(&seen, &steer).expect("the steer ran as a turn");
    assert_eq!(steer_of.as_deref(), Some(turn.as_str()));
    let saw = agent_saw(&log);
    let prompts: Vec<_> = saw.iter().map(|(_, text)| text.as_str()).collect();
    assert_eq!(prompts.len(), 3, "{saw:#?}");
    assert_eq!(prompts[0], "first");
    // The steer went with what the cancelled turn had done (its tool call), then ran alone.
    assert!(prompts[1].ends_with("\n\ngo right instead"), "{}", prompts[1]);
    assert!(prompts[1].contains("interrupted your previous turn"), "{}", prompts[1]);
    assert!(prompts[1].contains("1 tool call"), "{}", prompts[1]);
    assert_eq!(prompts[2], "queued before the steer");
    let status = api.status(&session).await;
    assert!(status.queue.prompts.is_empty() && status.queue.halted.is_none(), "{status:?}");
}

/// The supervisor is SIGKILLed right after a fallback steer was queued (`steer.queued`),
/// before its cancel reached the agent: the restart cancels the turn again, and the steer
/// runs once.
#[tokio::test]
async fn a_fallback_steer_survives_a_daemon_sigkill_and_runs_once() {
    let (mut daemon, log, workspace) = daemon(false, Some("steer.queued")).await;
    let api = daemon.api().await;
    let session = api.ready_session("flow", &workspace).await;
    let turn = long_turn(&api, &session, "").await;
    let refused = api.typed().session_steer(session.clone(), "after the crash".into()).await;
    assert!(refused.is_err(), "the daemon died before answering: {refused:?}");
    drop(api);
    daemon.wait_exit().await;
    daemon.restart_with_env(&[]).await;
    let api = daemon.api().await;
    let queue = api.status(&session).await.queue;
    let steer = queue.prompts.first().map(|p| p.prompt_id.clone());
    let seen = until_picked_turn_ends(
        &api,
        &session,
        |kind| matches!(kind, EventKind::TurnStarted { steer_of: Some(of), .. } if *of == turn),
    )
    .await;
    assert!(steer.is_none() || turn_of(&seen, steer.as_deref().unwrap()).is_some(), "{seen:#?}");
    let ran = agent_saw(&log).iter().filter(|(_, text)| text.ends_with("after the crash")).count();
    assert_eq!(ran, 1, "{:?}", agent_saw(&log));
}

#[tokio::test]
async fn the_cli_steer_says_how_it_steered_and_follows_the_turn() {
    let (daemon, _log, workspace) = daemon(true, None).await;
    let api = daemon.api().await;
    let session = api.ready_session("flow", &workspace).await;
    long_turn(&api, &session, "").await;
    let (code, out, err) = daemon.cli(&["steer", &session, "mind", "the", "tests"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("took the message into its running turn"), "{err}");
    assert!(out.contains("steered: mind the tests"), "the turn's reply: {out}");
    // With no turn running it is a prompt, said so.
    let (code, out, err) = daemon.cli(&["steer", &session, "and", "now?"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("sent as a prompt"), "{err}");
    assert!(out.contains("you said: and now?"), "{out}");
}
