//! Pause: `task.session.pause` takes effect at the next turn boundary (a running
//! turn ends first, or is cancelled after `force_after_ms`), then the agent and its sidecar
//! stop and the session is `PAUSED` — across daemon restarts — until it is resumed.

use protocol::api::{ApiClient, EventKind, ResumeOutcome, SessionEvent, SessionState};
use protocol::errors::ErrorKind;
use tether_tests::daemon::{
    Api, Daemon, is_state, notices, ok, refused, stop_reason, turn_ended, until,
    until_permission_request,
};
use tether_tests::within;

const PAUSED: SessionState = SessionState::Paused;

fn paused(event: &SessionEvent) -> Option<bool> {
    match event.kind {
        EventKind::Paused { forced, .. } => Some(forced),
        _ => None,
    }
}

/// Waits until the session's sidecar processes are gone.
async fn sidecars_gone(daemon: &Daemon, session: &str) {
    for pid in daemon.sidecars(session) {
        if let Ok(pidfd) = agentctl::process::PidFd::open(pid) {
            within("the paused session's sidecar to exit", pidfd.exited()).await.unwrap();
        }
    }
}

/// A pause asked for during a turn waits for the turn to end (here: the agent waits for a
/// permission answer); then the agent and its sidecar stop and the session is `PAUSED`,
/// resumable natively — the agent remembers.
#[tokio::test]
async fn a_pause_waits_for_the_running_turn_then_stops_the_agent() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("p")).await;
    assert!(api.ask(&session, "first").await.contains("first"));
    let sidecar = daemon.agentctl_pid(&session);
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    api.prompt(&session, "/permission\nsecond").await.unwrap();
    let (_, request_id, _) = until_permission_request(&mut events).await;
    let pause = api.typed().session_pause(session.clone(), Some("lunch".into()), Some(600_000));
    let requested = ok("task.session.pause", pause).await;
    assert!(requested.pause_requested, "{requested:?}");
    assert_eq!(requested.state, SessionState::Running);
    let status = api.status(&session).await;
    assert!(status.pause_requested && status.is_agent_running, "{status:?}");
    let seen = until(&mut events, |e| matches!(e.kind, EventKind::PauseRequested { .. })).await;
    match &seen.last().unwrap().kind {
        EventKind::PauseRequested { reason, force_after_ms } => {
            assert_eq!((reason.as_deref(), *force_after_ms), (Some("lunch"), 600_000));
        }
        other => unreachable!("{other:?}"),
    }
    // Asking again while it waits is refused, saying why.
    let again =
        refused("pause twice", api.typed().session_pause(session.clone(), None, None)).await;
    assert_eq!(again.kind, ErrorKind::InvalidState, "{again:?}");
    // The turn ends normally; then the pause.
    let answer = api.typed().permission_respond(session.clone(), request_id, Some("allow".into()));
    ok("permission.respond", answer).await;
    let seen = until(&mut events, |e| paused(e).is_some()).await;
    let ended = seen.iter().find(|e| turn_ended(e)).expect("the turn ended before the pause");
    assert_eq!(stop_reason(ended), Some("end_turn"));
    assert_eq!(paused(seen.last().unwrap()), Some(false), "not forced");
    assert!(seen.iter().any(|e| is_state(e, PAUSED)), "{seen:?}");
    let status = api.status(&session).await;
    assert_eq!(status.state, PAUSED);
    assert!(!status.is_agent_running && !status.pause_requested, "{status:?}");
    assert!(status.is_resumable && status.needs_resume, "{status:?}");
    assert_eq!(status.resume_reason, "paused");
    assert!(!agentctl::process::is_alive(sidecar), "the sidecar is stopped");
    // Resumed natively: the agent remembers both turns.
    let resumed = api.resume(&session).await.unwrap();
    assert_eq!(resumed.outcome, ResumeOutcome::NativeLoad, "{resumed:?}");
    assert_eq!(resumed.state, SessionState::WaitingForInput);
    assert_eq!(api.status(&session).await.generation, 2, "a second execution");
    // (mock-agent counts the messages of its conversation, both sides, before this one.)
    let reply = api.ask(&session, "third").await;
    assert!(reply.contains("remembered 4 earlier messages"), "{reply}");
}

/// A turn that does not end within `force_after_ms` is cancelled for the pause, with a
/// notice saying so; the session pauses all the same (`forced`).
#[tokio::test]
async fn a_pause_that_waits_too_long_cancels_the_turn() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("f")).await;
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    api.prompt(&session, "/sleep 600000").await.unwrap();
    until(&mut events, |e| is_state(e, SessionState::Running)).await;
    let pause = api.typed().session_pause(session.clone(), None, Some(300));
    assert!(ok("task.session.pause", pause).await.pause_requested);
    let seen = until(&mut events, |e| paused(e).is_some()).await;
    assert_eq!(paused(seen.last().unwrap()), Some(true), "forced");
    let ended = seen.iter().find(|e| turn_ended(e)).expect("the turn ended");
    assert_eq!(stop_reason(ended), Some("cancelled"));
    assert!(notices(&seen).iter().any(|n| n.contains("the running turn is cancelled")), "{seen:?}");
    assert_eq!(api.status(&session).await.state, PAUSED);
    sidecars_gone(&daemon, &session).await;
}

/// A paused session stays paused across a daemon restart and resumes natively after it;
/// a pause asked for during a turn survives a SIGKILL of the daemon (the turn goes on in
/// the re-attached agent, and the session pauses when it ends).
#[tokio::test]
async fn a_pause_survives_daemon_restarts() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("r")).await;
    assert!(api.ask(&session, "before").await.contains("before"));
    let idle = ok("pause", api.typed().session_pause(session.clone(), None, None)).await;
    assert_eq!(
        (idle.state, idle.pause_requested),
        (PAUSED, false),
        "an idle session pauses at once"
    );
    sidecars_gone(&daemon, &session).await;
    drop(api);
    daemon.terminate().await;
    daemon.restart().await;
    let api = daemon.api().await;
    let status = api.status(&session).await;
    assert_eq!((status.state, status.needs_resume), (PAUSED, true), "{status:?}");
    let resumed = api.resume(&session).await.unwrap();
    assert_eq!(resumed.outcome, ResumeOutcome::NativeLoad, "{resumed:?}");
    let reply = api.ask(&session, "after").await;
    assert!(reply.contains("remembered 2 earlier messages"), "{reply}");

    // A pause pending when the daemon is killed still holds after the restart.
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    api.prompt(&session, "/permission\nheld").await.unwrap();
    let (_, request_id, _) = until_permission_request(&mut events).await;
    let pause = api.typed().session_pause(session.clone(), Some("deploy".into()), None);
    assert!(ok("pause", pause).await.pause_requested);
    until(&mut events, |e| matches!(e.kind, EventKind::PauseRequested { .. })).await;
    drop(events);
    drop(api);
    daemon.kill().await;
    daemon.restart().await;
    let api = daemon.api().await;
    // Joining the re-attach (the turn still runs in the same agent).
    assert_eq!(api.resume(&session).await.unwrap().outcome, ResumeOutcome::AlreadyRunning);
    assert!(api.status(&session).await.pause_requested, "the pause still waits");
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    let answer = api.typed().permission_respond(session.clone(), request_id, Some("allow".into()));
    ok("permission.respond", answer).await;
    let seen = until(&mut events, |e| paused(e).is_some()).await;
    match &seen.last().unwrap().kind {
        EventKind::Paused { reason, forced, .. } => {
            assert_eq!((reason.as_deref(), *forced), (Some("deploy"), false));
        }
        other => unreachable!("{other:?}"),
    }
    assert_eq!(api.status(&session).await.state, PAUSED);
}

/// Bad input: clear errors, nothing changed. A paused session ends with `stop`
/// (`COMPLETED`) or `cancel` (`CANCELLED`); a prompt resumes it.
#[tokio::test]
async fn pause_refuses_what_it_cannot_do_and_a_paused_session_can_end_or_go_on() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let typed = api.typed();
    let unknown = "01a20a40-0000-7000-8000-000000000000".to_owned();
    let missing = refused("pause unknown", typed.session_pause(unknown, None, None)).await;
    assert_eq!(missing.kind, ErrorKind::NotFound, "{missing:?}");
    let a = api.ready_session("mock", &daemon.workspace("a")).await;
    let too_long =
        refused("force_after_ms", typed.session_pause(a.clone(), None, Some(u64::MAX))).await;
    assert_eq!(
        (too_long.kind, too_long.field.as_deref()),
        (ErrorKind::InvalidParams, Some("force_after_ms"))
    );
    let reason = "x".repeat(2000);
    let long_reason = refused("reason", typed.session_pause(a.clone(), Some(reason), None)).await;
    assert_eq!(
        (long_reason.kind, long_reason.field.as_deref()),
        (ErrorKind::InvalidParams, Some("reason"))
    );
    assert_eq!(api.status(&a).await.state, SessionState::WaitingForInput, "nothing changed");
    ok("pause", typed.session_pause(a.clone(), None, None)).await;
    let twice = refused("pause a paused session", typed.session_pause(a.clone(), None, None)).await;
    assert_eq!(twice.kind, ErrorKind::InvalidState, "{twice:?}");
    // A prompt resumes it (lazily, like any session whose agent is not running).
    let mut events = api.subscribe_at_end(&a).await;
    api.prompt(&a, "go on").await.unwrap();
    let status = api.status(&a).await;
    assert!(status.is_agent_running && status.state != PAUSED, "{status:?}");
    // Paused again, then ended: stop → COMPLETED; a completed session cannot be paused.
    until(&mut events, turn_ended).await;
    ok("pause", typed.session_pause(a.clone(), None, None)).await;
    ok("stop", typed.session_stop(a.clone())).await;
    assert_eq!(api.status(&a).await.state, SessionState::Completed);
    let ended =
        refused("pause a completed session", typed.session_pause(a.clone(), None, None)).await;
    assert_eq!(ended.kind, ErrorKind::Conflict, "{ended:?}");
    // cancel of a paused session → CANCELLED, for good.
    let b = api.ready_session("mock", &daemon.workspace("b")).await;
    ok("pause", typed.session_pause(b.clone(), None, None)).await;
    ok("cancel", typed.session_cancel(b.clone())).await;
    assert_eq!(api.status(&b).await.state, SessionState::Cancelled);
    let over = refused("resume a cancelled session", typed.session_resume(b.clone(), None)).await;
    assert_eq!(over.kind, ErrorKind::Conflict, "{over:?}");
}

/// The CLI: `pause` waits until the session is paused; `status` shows it.
#[tokio::test]
async fn the_cli_pauses_a_session() {
    let daemon = Daemon::start(&[]).await;
    let api: Api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("c")).await;
    let (code, out, err) = daemon.cli(&["pause", &session, "--reason", "night"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("paused"), "{out}");
    let (code, out, _) = daemon.cli(&["status", &session]).await;
    assert_eq!(code, 0);
    assert!(out.contains("state: PAUSED") && out.contains("resume_reason: paused"), "{out}");
    let (code, _, err) = daemon.cli(&["pause", &session]).await;
    assert_ne!(code, 0, "pausing twice is refused");
    assert!(err.contains("already PAUSED"), "{err}");
}

/// A pause waiting for its turn when the daemon is killed, whose agent is gone when the
/// daemon comes back (its sidecar was killed meanwhile): nothing is left to wait for, so
/// recovery pauses the session.
#[tokio::test]
async fn a_pending_pause_whose_agent_died_with_the_daemon_is_applied_at_recovery() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("d")).await;
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    api.prompt(&session, "/permission\nheld").await.unwrap();
    until_permission_request(&mut events).await;
    let pause = api.typed().session_pause(session.clone(), Some("gone".into()), None);
    assert!(ok("pause", pause).await.pause_requested);
    until(&mut events, |e| matches!(e.kind, EventKind::PauseRequested { .. })).await;
    drop(events);
    drop(api);
    let sidecar = daemon.agentctl_pid(&session);
    daemon.kill().await;
    tether_tests::daemon::sigkill(sidecar).await;
    daemon.restart().await;
    let api = daemon.api().await;
    // Recovery replays the dead sidecar's spool in the background (the daemon serves
    // meanwhile): the pause applies once that is through.
    let mut events = api.subscribe(&session, after).await;
    let seen = until(&mut events, |e| paused(e).is_some()).await;
    // The interrupted turn is published as such before the pause.
    assert!(seen.iter().any(turn_ended), "{seen:?}");
    let status = api.status(&session).await;
    assert_eq!(status.state, PAUSED, "{status:?}");
    assert!(!status.pause_requested && status.needs_resume, "{status:?}");
    // And it comes back.
    let resumed = api.resume(&session).await.unwrap();
    assert_eq!(resumed.state, SessionState::WaitingForInput, "{resumed:?}");
}

/// A pause asked for while the agent is still being launched applies once the launch
/// landed — not `forced` (no turn was cancelled), even when its wait ran out first.
#[tokio::test]
async fn a_pause_during_a_launch_applies_when_the_launch_lands() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.create_session("mock", &daemon.workspace("l")).await.unwrap();
    let mut events = api.subscribe(&session, 0).await;
    let pause = ok("pause", api.typed().session_pause(session.clone(), None, Some(1))).await;
    if pause.pause_requested {
        let seen = until(&mut events, |e| paused(e).is_some()).await;
        assert_eq!(paused(seen.last().unwrap()), Some(false), "no turn was cancelled");
        assert!(!seen.iter().any(turn_ended), "{seen:?}");
    }
    assert_eq!(api.status(&session).await.state, PAUSED);
    sidecars_gone(&daemon, &session).await;
}
