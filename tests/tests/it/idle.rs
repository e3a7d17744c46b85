//! A session whose agent sat idle for its `idle_timeout_secs` is
//! parked — agent and sidecar stopped, `PAUSED` by `idle`, a snapshot — and the next prompt
//! brings it back by the resume ladder, the agent remembering; never during a turn or while
//! a question waits; a kill while parking or waking loses nothing and leaks nothing.

use protocol::api::ApiClient;
use protocol::api::{EventKind, SessionEvent, SessionState, SnapshotTrigger};
use tether_tests::daemon::{
    Api, Daemon, is_state, ok, turn_ended, until, until_permission_request,
};
use tether_tests::within;

use crate::metrics::{scrape, value};

/// The built-in mock profile, parked after `secs` idle seconds.
fn idle_profile(id: &str, secs: u64) -> String {
    format!(
        "id = \"{id}\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{{home}}/.mock-agent\"]\nprotocol = \"acp\"\n\
         [session]\nagent_state_dirs = [\".mock-agent\"]\nidle_timeout_secs = {secs}\n"
    )
}

fn parked(event: &SessionEvent) -> bool {
    matches!(event.kind, EventKind::Paused { trigger: Some(SnapshotTrigger::Idle), .. })
}

/// Follows the session from `after` until it is parked; the events seen.
async fn until_parked(api: &Api, session: &str, after: u64) -> Vec<SessionEvent> {
    let mut events = api.subscribe(session, after).await;
    until(&mut events, parked).await
}

/// Waits until the sidecars `pids` are gone.
async fn gone(pids: Vec<u32>) {
    for pid in pids {
        if let Ok(pidfd) = agentctl::process::PidFd::open(pid) {
            within("the parked session's sidecar to exit", pidfd.exited()).await.unwrap();
        }
    }
}

/// Parked after a turn: the sidecar goes, status says when and why, a snapshot is taken;
/// the next prompt wakes the same session natively (the agent remembers the first turn),
/// and the metrics count the eviction and the wake-up.
#[tokio::test]
async fn an_idle_session_is_parked_and_the_next_prompt_wakes_it_remembering() {
    let profile = idle_profile("mock-idle", 1);
    let daemon = Daemon::start_with_profiles(&[], &[("mock-idle.toml", &profile)]).await;
    let api = daemon.api().await;
    let before = scrape(&daemon, &[]).await;
    let session = api.ready_session("mock-idle", &daemon.workspace("idle")).await;
    let sidecars = daemon.sidecars(&session);
    assert_eq!(sidecars.len(), 1, "{sidecars:?}");
    assert!(api.ask(&session, "first").await.contains("first"));
    let seen = until_parked(&api, &session, 0).await;
    assert!(seen.iter().any(|e| is_state(e, SessionState::Paused)), "{seen:?}");
    let snapshot = seen.iter().find_map(|e| match &e.kind {
        EventKind::SnapshotTaken { trigger: SnapshotTrigger::Idle, .. } => Some(e.seq),
        _ => None,
    });
    assert!(snapshot.is_some(), "a snapshot with the park: {seen:?}");
    gone(sidecars).await;
    assert!(daemon.sidecars(&session).is_empty(), "no sidecar while parked");
    let status = api.status(&session).await;
    assert_eq!(status.state, SessionState::Paused);
    assert_eq!(status.paused_by, Some(SnapshotTrigger::Idle), "{status:?}");
    assert_eq!(status.resume_reason, "idle");
    assert!(status.paused_at.is_some() && status.needs_resume && !status.is_agent_running);
    let parked_now = scrape(&daemon, &[]).await;
    assert_eq!(value(&parked_now, "tether_sessions_parked"), 1.0);
    let last = seen.last().unwrap().seq;
    // The next prompt wakes it: same session, native restore, the agent remembers.
    let reply = api.ask(&session, "second").await;
    assert!(reply.contains("remembered 2 earlier messages"), "{reply}");
    // Parked again after the second turn; both parks and the wake-up are counted.
    let seen = until_parked(&api, &session, last).await;
    assert!(
        seen.iter().any(|e| matches!(e.kind, EventKind::Resumed { .. })),
        "woken by a resume: {seen:?}"
    );
    let after = scrape(&daemon, &[]).await;
    let moved = |name: &str| value(&after, name) - value(&before, name);
    assert_eq!(moved("tether_evictions_total"), 2.0);
    assert_eq!(moved("tether_wakeups_total"), 1.0);
    assert_eq!(moved("tether_wake_seconds_count"), 1.0);
    assert_eq!(api.status(&session).await.generation, 2, "one execution per wake");
}

/// Not while a turn runs nor while the agent's question waits: session A asks for
/// permission; B, parked one second after its own later turn, is the clock that says A has
/// waited past its idle timeout. A is still running; once answered, its turn ends normally
/// and then it is parked.
#[tokio::test]
async fn eviction_waits_for_the_turn_and_the_open_question() {
    let profile = idle_profile("mock-idle", 1);
    let daemon = Daemon::start_with_profiles(&[], &[("mock-idle.toml", &profile)]).await;
    let api = daemon.api().await;
    let a = api.ready_session("mock-idle", &daemon.workspace("a")).await;
    let b = api.ready_session("mock-idle", &daemon.workspace("b")).await;
    let mut a_events = api.subscribe(&a, api.status(&a).await.last_event_seq).await;
    api.prompt(&a, "/permission\nmay I").await.unwrap();
    let (_, request_id, _) = until_permission_request(&mut a_events).await;
    let b_after = api.status(&b).await.last_event_seq;
    assert!(api.ask(&b, "tick").await.contains("tick"));
    until_parked(&api, &b, b_after).await;
    let status = api.status(&a).await;
    assert_eq!(status.state, SessionState::Running, "{status:?}");
    assert!(status.is_agent_running && status.open_questions.len() == 1, "{status:?}");
    let answer = api.typed().permission_respond(a.clone(), request_id, Some("allow".into()));
    ok("task.session.permission.respond", answer).await;
    let seen = until(&mut a_events, parked).await;
    let ended = seen.iter().position(turn_ended).expect("the turn ended");
    let paused = seen.iter().position(parked).unwrap();
    assert!(ended < paused, "parked only after the turn: {seen:?}");
    assert!(
        matches!(&seen[ended].kind, EventKind::TurnEnded { stop_reason: Some(r), .. } if r == "end_turn"),
        "{:?}",
        seen[ended]
    );
}

/// `config.toml`'s `[session] idle_timeout_secs` parks sessions of profiles that do not
/// say. A kill while parking (the sidecar gone, `PAUSED` not yet stored) leaves the session
/// agentless and waiting for input, with no sidecar; its next prompt resumes it remembering.
#[tokio::test]
async fn a_kill_while_parking_loses_nothing() {
    let (mut daemon, ()) =
        Daemon::start_prepared(&[], &[], &[("TETHER_FAULT", "pause.retired")], |root| {
            std::fs::create_dir_all(root.join("tether")).unwrap();
            std::fs::write(root.join("tether/config.toml"), "[session]\nidle_timeout_secs = 1\n")
                .unwrap()
        })
        .await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("k")).await;
    let sidecars = daemon.sidecars(&session);
    assert!(api.ask(&session, "first").await.contains("first"));
    within("the supervisor to die while parking", daemon.wait_exit()).await;
    gone(sidecars).await;
    daemon.restart_with_env(&[]).await;
    let api = daemon.api().await;
    let status = api.status(&session).await;
    assert_eq!(status.state, SessionState::WaitingForInput, "{status:?}");
    assert!(!status.is_agent_running && status.needs_resume, "{status:?}");
    assert!(daemon.sidecars(&session).is_empty(), "no sidecar left running");
    let reply = api.ask(&session, "second").await;
    assert!(reply.contains("remembered 2 earlier messages"), "{reply}");
    assert_eq!(daemon.sidecars(&session).len(), 1);
}

/// A kill while waking (the wake's launch started): the prompt that woke it was queued
/// before the kill, so the restart brings the agent back for it; it runs once, the agent
/// remembers, and one sidecar runs.
#[tokio::test]
async fn a_kill_while_waking_loses_nothing() {
    let profile = idle_profile("mock-idle", 1);
    let mut daemon = Daemon::start_with_env(
        &[],
        &[("mock-idle.toml", &profile)],
        &[("TETHER_FAULT", "launch.started@2")],
    )
    .await;
    let api = daemon.api().await;
    let session = api.ready_session("mock-idle", &daemon.workspace("w")).await;
    assert!(api.ask(&session, "first").await.contains("first"));
    until_parked(&api, &session, 0).await;
    // The wake-up's launch kills the supervisor: the prompt was queued first (its answer
    // may be lost with the daemon).
    let prompt = api.typed().session_prompt(session.clone(), "kept in the wake".into());
    let (answer, died) = tokio::join!(prompt, daemon.wait_exit());
    assert!(!died.success());
    if let Ok(answer) = &answer {
        assert!(answer.queued && answer.waking, "{answer:?}");
    }
    daemon.restart_with_env(&[]).await;
    let api = daemon.api().await;
    api.until_turn_of_prompt_ends(&session, "kept in the wake").await;
    let reply = api.ask(&session, "second").await;
    assert!(reply.contains("remembered 4 earlier messages"), "once, then this: {reply}");
    assert_eq!(daemon.sidecars(&session).len(), 1, "one sidecar after the wake");
}
