//! Resume and restart recovery with real processes: the supervisor and agentctl killed at
//! chosen points, sessions restored natively, by `resume_command`, or by history
//! injection, and nothing acknowledged lost.

use agentctl::process::PidFd;
use protocol::api::{ApiClient, EntryType, EventKind, ResumeOutcome, ResumeResult, SessionState};
use protocol::errors::ErrorKind;
use tether_tests::daemon::{
    Api, Daemon, chunks, kill_sidecar, next, notices, ok, stop_reason, turn_ended, until,
    until_permission_request,
};
use tether_tests::within;

fn profile(id: &str, extra: &str, session: &str) -> String {
    format!(
        "id = \"{id}\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{{home}}/.mock-agent\"{extra}]\nprotocol = \"acp\"\n[session]\n{session}\n"
    )
}

async fn resume(api: &Api, session: &str) -> ResumeResult {
    api.resume(session).await.expect("resume")
}

/// The kinds of a session's history entries, in order.
async fn kinds(api: &Api, session: &str) -> Vec<EntryType> {
    api.history(session).await.iter().map(|e| e.kind).collect()
}

const WAITING: SessionState = SessionState::WaitingForInput;
const INJECTION: ResumeOutcome = ResumeOutcome::HistoryInjection;
const USER: EntryType = EntryType::UserMessage;
const AGENT: EntryType = EntryType::AgentMessage;

#[tokio::test]
async fn a_supervisor_killed_mid_turn_loses_nothing() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("k")).await;
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    api.prompt(&session, "/stream 2000\nstreaming").await.unwrap();
    let mut seen = vec![next(&mut events).await];
    drop(events);
    drop(api);
    let api = daemon.kill_restart_and_follow(&session, &mut seen).await;
    assert_eq!(stop_reason(seen.last().unwrap()), Some("end_turn"));
    let seqs: Vec<u64> = seen.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (after + 1..=after + seqs.len() as u64).collect::<Vec<_>>(),
        "gapless, each once"
    );
    let texts = chunks(&seen);
    assert_eq!(texts.len(), 2000, "every chunk exactly once");
    assert!(
        texts.iter().enumerate().all(|(idx, text)| text.ends_with(&format!("[{}/2000]", idx + 1)))
    );
    let history = api.history(&session).await;
    let kinds: Vec<EntryType> = history.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [USER, AGENT], "the turn is in the history once");
    assert_eq!(history[1].content, texts.concat());
    let reattached = api.status(&session).await;
    assert_eq!(
        (reattached.is_agent_running, reattached.resume_reason.as_str()),
        (true, "agent_running")
    );
    // The re-attached agent keeps working.
    assert!(api.ask(&session, "still there?").await.contains("remembered 2 earlier messages"));
}

#[tokio::test]
async fn native_resume_through_load_resume_and_resume_command() {
    let profiles = [
        (
            "resumable.toml",
            // Nothing said about resume: the agent's advertisement decides.
            profile("resumable", ", \"--resume-capability\"", ""),
        ),
        (
            "relaunch.toml",
            String::from(
                "id = \"relaunch\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{home}/.mock-agent\", \"--no-load-session\"]\n\
                 protocol = \"acp\"\n[session]\nnative_resume = false\n\
                 resume_command = [\"mock-agent\", \"--state-dir\", \"{home}/.mock-agent\", \"--no-load-session\", \"--resume\", \"{token}\"]\n",
            ),
        ),
    ];
    let profile_refs: Vec<(&str, &str)> =
        profiles.iter().map(|(name, text)| (*name, text.as_str())).collect();
    let daemon = Daemon::start_with_profiles(&[], &profile_refs).await;
    let api = daemon.api().await;
    for (agent, expected) in [
        ("mock", ResumeOutcome::NativeLoad),
        ("resumable", ResumeOutcome::NativeResume),
        ("relaunch", ResumeOutcome::ResumeCommand),
    ] {
        let session = api.ready_session(agent, &daemon.workspace(agent)).await;
        api.ask(&session, "the secret is kumquat").await;
        kill_sidecar(&daemon, &api, &session).await;
        assert_eq!(api.status(&session).await.resume_reason, "agent_not_running");
        let resumed = resume(&api, &session).await;
        assert_eq!((resumed.outcome, resumed.state), (expected, WAITING), "{agent}");
        let reply = api.ask(&session, "what was the secret?\n/recall").await;
        assert!(reply.contains("remembered 2 earlier messages"), "{agent}: {reply}");
        assert!(reply.contains("kumquat"), "{agent}: {reply}");
        // A load's replay restores the agent; it is not recorded again.
        let history = api.history(&session).await;
        assert_eq!(history.len(), 4, "{agent}: {history:?}");
        let again = resume(&api, &session).await;
        assert_eq!(again.outcome, ResumeOutcome::AlreadyRunning);
    }
}

/// The ladder follows what the agent advertises at `initialize`; the
/// profile's fields only override it. Each case: (profile, mock flags, session fields,
/// outcome, whether the fallback notice is expected).
#[tokio::test]
async fn the_resume_ladder_follows_what_the_agent_advertises() {
    let cases = [
        // Advertises nothing: no restore is tried, the history is injected, no complaint.
        ("silent", ", \"--no-load-session\"", "", INJECTION, false),
        // Advertises both: session/resume is preferred…
        ("both", ", \"--resume-capability\"", "", ResumeOutcome::NativeResume, false),
        // …unless the profile pins session/load.
        (
            "pinned",
            ", \"--resume-capability\"",
            "restore_method = \"load\"",
            ResumeOutcome::NativeLoad,
            false,
        ),
        // Forced where the agent advertises nothing: tried, refused, and the fallback says so.
        ("forced", ", \"--no-load-session\"", "native_resume = true", INJECTION, true),
        // Turned off where the agent could: the history is injected instead.
        ("off", "", "native_resume = false", INJECTION, false),
    ];
    let files: Vec<(String, String)> = cases
        .iter()
        .map(|(id, flags, session, ..)| (format!("{id}.toml"), profile(id, flags, session)))
        .collect();
    let refs: Vec<(&str, &str)> = files.iter().map(|(n, t)| (n.as_str(), t.as_str())).collect();
    let daemon = Daemon::start_with_profiles(&[], &refs).await;
    let api = daemon.api().await;
    for (agent, _, _, expected, notice) in cases {
        let session = api.ready_session(agent, &daemon.workspace(agent)).await;
        api.ask(&session, "the secret is kumquat").await;
        kill_sidecar(&daemon, &api, &session).await;
        let after = api.status(&session).await.last_event_seq;
        let mut events = api.subscribe(&session, after).await;
        let resumed = resume(&api, &session).await;
        assert_eq!((resumed.outcome, resumed.state), (expected, WAITING), "{agent}");
        let seen = until(&mut events, |e| matches!(e.kind, EventKind::ResumeOutcome { .. })).await;
        assert_eq!(!notices(&seen).is_empty(), notice, "{agent}: {seen:?}");
        let reply = api.ask(&session, "what was the secret?").await;
        if expected == INJECTION {
            assert!(reply.contains("remembered 0 earlier messages"), "{agent}: {reply}");
            assert!(reply.contains("[USER]: the secret is kumquat"), "{agent}: {reply}");
        } else {
            assert!(reply.contains("remembered 2 earlier messages"), "{agent}: {reply}");
        }
    }
}

/// gemini-cli replays a loaded session *after* answering `session/load` (its replay is
/// not awaited). Those updates are the old conversation, not new output: nothing of them
/// is recorded or published again, and the next turn is recorded once.
#[tokio::test]
async fn a_replay_that_trails_the_load_answer_is_not_recorded_again() {
    let late = profile("late", ", \"--late-replay\"", "");
    let daemon = Daemon::start_with_profiles(&[], &[("late.toml", &late)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("late", &daemon.workspace("l")).await;
    api.ask(&session, "the secret is kumquat").await;
    kill_sidecar(&daemon, &api, &session).await;
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    assert_eq!(resume(&api, &session).await.outcome, ResumeOutcome::NativeLoad);
    let reply = api.ask(&session, "what was the secret?\n/recall").await;
    assert!(reply.contains("kumquat"), "{reply}");
    let seen = until(&mut events, turn_ended).await;
    let chunks = chunks(&seen);
    assert!(
        chunks.iter().all(|text| !text.contains("you said: the secret")),
        "the old reply is not published again: {chunks:?}"
    );
    assert_eq!(kinds(&api, &session).await, [USER, AGENT, USER, AGENT]);
}

/// A replay that trails even the next prompt's delivery (gemini-cli under load: it
/// replays without awaiting, so the prompt can reach it first) is still not recorded or
/// published again: after the delivery, updates that repeat the recorded conversation are
/// dropped until the turn's own output begins.
#[tokio::test]
async fn a_replay_that_trails_the_next_prompt_is_not_recorded_again() {
    let late = profile("later", ", \"--replay-with-next\"", "");
    let daemon = Daemon::start_with_profiles(&[], &[("later.toml", &late)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("later", &daemon.workspace("l")).await;
    api.ask(&session, "the secret is kumquat").await;
    kill_sidecar(&daemon, &api, &session).await;
    assert_eq!(resume(&api, &session).await.outcome, ResumeOutcome::NativeLoad);
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    let reply = api.ask(&session, "what was the secret?\n/recall").await;
    assert!(reply.starts_with("mock-agent: remembered 2 earlier messages"), "{reply}");
    assert!(reply.contains("kumquat"), "{reply}");
    let seen = until(&mut events, turn_ended).await;
    let chunks = chunks(&seen);
    assert!(
        chunks.iter().all(|text| !text.contains("you said: the secret")),
        "the old reply is not published again: {chunks:?}"
    );
    assert!(
        !seen.iter().any(|e| matches!(&e.kind, EventKind::SessionUpdate { update } if update["sessionUpdate"] == "user_message_chunk")),
        "{seen:?}"
    );
    assert_eq!(kinds(&api, &session).await, [USER, AGENT, USER, AGENT]);
}

/// The same, when the prompt itself resumes the session: the prompt is handled right
/// after the load's answer, while the trailing replay is still on its way. Only what the
/// agent sends after the prompt reached agentctl is the new turn's.
#[tokio::test]
async fn a_prompt_that_resumes_does_not_take_the_trailing_replay_as_its_reply() {
    let late = profile("late", ", \"--late-replay\"", "");
    let daemon = Daemon::start_with_profiles(&[], &[("late.toml", &late)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("late", &daemon.workspace("l")).await;
    for round in 0..5 {
        api.ask(&session, &format!("message {round}")).await;
        kill_sidecar(&daemon, &api, &session).await;
    }
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    // No status or resume call in between: the prompt resumes, then is sent at once.
    api.prompt(&session, "last one").await.unwrap();
    let seen = until(&mut events, turn_ended).await;
    let reply = chunks(&seen).concat();
    assert!(
        reply.starts_with("mock-agent: remembered 10 earlier messages; you said: last one"),
        "{reply}"
    );
    let kinds = kinds(&api, &session).await;
    assert_eq!(kinds.iter().filter(|k| **k == AGENT).count(), 6, "one reply per prompt: {kinds:?}");
}

#[tokio::test]
async fn history_injection_wraps_the_first_prompt_once_even_across_a_restart() {
    let inject = profile("inject", "", "native_resume = false\nhistory_injection = true");
    let mut daemon = Daemon::start_with_profiles(&[], &[("inject.toml", &inject)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("inject", &daemon.workspace("i")).await;
    api.ask(&session, "the code word is papaya").await;
    kill_sidecar(&daemon, &api, &session).await;
    assert_eq!(api.status(&session).await.resume_reason, "agent_not_running_fresh_start");
    let resumed = resume(&api, &session).await;
    assert_eq!(resumed.outcome, INJECTION);
    // A supervisor restart between the resume and the first prompt keeps the flag.
    drop(api);
    daemon.kill().await;
    daemon.restart().await;
    let api = daemon.api().await;
    let first = api.ask(&session, "what was the code word?").await;
    assert!(first.contains("remembered 0 earlier messages"), "a fresh agent: {first}");
    assert!(first.contains("you said: RESUME CONTEXT FOR CONTINUING TASK"), "{first}");
    assert!(first.contains("[USER]: the code word is papaya"), "{first}");
    assert!(first.contains("=== CURRENT REQUEST ===\nwhat was the code word?"), "{first}");
    let second = api.ask(&session, "second question").await;
    assert!(
        second.contains("you said: second question") && !second.contains("RESUME CONTEXT"),
        "{second}"
    );
    // The history keeps what the user typed, not the wrapper.
    let history = api.history(&session).await;
    let users: Vec<&str> =
        history.iter().filter(|e| e.kind == USER).map(|e| e.content.as_str()).collect();
    assert_eq!(users, ["the code word is papaya", "what was the code word?", "second question"]);
}

#[tokio::test]
async fn eliza_resumes_by_injection_and_goes_on() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("eliza", &daemon.workspace("e")).await;
    assert!(!api.ask(&session, "I am worried about my tests.").await.trim().is_empty());
    kill_sidecar(&daemon, &api, &session).await;
    assert_eq!(resume(&api, &session).await.outcome, INJECTION);
    assert!(!api.ask(&session, "They keep failing.").await.trim().is_empty());
}

#[tokio::test]
async fn a_rejected_token_falls_back_to_a_fresh_session_with_a_notice() {
    a_refused_restore_falls_back("--reject-load", "rejected").await;
}

/// `supervisor resume` prints the notice of a rejected token, with the progress
/// and the outcome.
#[tokio::test]
async fn the_cli_prints_a_rejected_tokens_notice_and_the_outcome() {
    let reject = profile("reject", ", \"--reject-load\"", "native_resume = true");
    let daemon = Daemon::start_with_profiles(&[], &[("reject.toml", &reject)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("reject", &daemon.workspace("r")).await;
    api.ask(&session, "hello").await;
    kill_sidecar(&daemon, &api, &session).await;
    let (code, out, err) = daemon.cli(&["resume", &session]).await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("] launching the agent"), "{err}");
    assert!(err.contains("] notice: ") && err.contains("rejected"), "{err}");
    assert!(err.contains("] resumed: history_injection"), "{err}");
    assert!(
        out.contains(&format!("session {session} resumed (history_injection), WAITING_FOR_INPUT")),
        "{out}"
    );
}

/// A restore that fails (gemini answers `session/load` with a generic
/// `-32000`) is not the session's end: it falls back like a rejected token.
#[tokio::test]
async fn a_failed_restore_falls_back_to_a_fresh_session_never_failed() {
    a_refused_restore_falls_back("--fail-load", "failed").await;
}

/// A restore the agent never answers (a load of a long conversation, or a method it does
/// not really serve) is not the session's end either: after the handshake timeout the
/// session falls back like a rejected token.
#[tokio::test]
async fn a_restore_that_times_out_falls_back_too() {
    a_refused_restore_falls_back_with(
        "--hang-on\", \"session/load",
        "native_resume = true\n[process]\ninit_timeout_ms = 1000",
        "did not answer session/load",
    )
    .await;
}

async fn a_refused_restore_falls_back(flag: &str, said: &str) {
    a_refused_restore_falls_back_with(flag, "native_resume = true", said).await;
}

async fn a_refused_restore_falls_back_with(flag: &str, session_settings: &str, said: &str) {
    let reject = profile("reject", &format!(", \"{flag}\""), session_settings);
    let daemon = Daemon::start_with_profiles(&[], &[("reject.toml", &reject)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("reject", &daemon.workspace("r")).await;
    api.ask(&session, "hello").await;
    let old_token = api.status(&session).await.acp_session_id.unwrap();
    kill_sidecar(&daemon, &api, &session).await;
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    let resumed = resume(&api, &session).await;
    // Not a failure: the session waits for input, with the earlier conversation injected.
    assert_eq!((resumed.state, resumed.outcome), (WAITING, INJECTION));
    let seen = until(&mut events, |e| matches!(e.kind, EventKind::ResumeOutcome { .. })).await;
    assert!(notices(&seen).iter().any(|m| m.contains(said)), "{seen:?}");
    let new_token = api.status(&session).await.acp_session_id.unwrap();
    assert_ne!(new_token, old_token, "the rejected token was replaced");
    assert!(api.ask(&session, "again").await.contains("[USER]: hello"));
}

#[tokio::test]
async fn concurrent_resumes_launch_one_agent_and_bad_resumes_are_refused() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let workspace = daemon.workspace("c");
    let session = api.ready_session("mock", &workspace).await;
    api.ask(&session, "one").await;
    kill_sidecar(&daemon, &api, &session).await;
    // 100 concurrent calls over 10 connections.
    let mut calls = Vec::new();
    for _ in 0..10 {
        let api = std::sync::Arc::new(Api::connect(&daemon.url, &[]).await.unwrap());
        for _ in 0..10 {
            let api = std::sync::Arc::clone(&api);
            let session = session.clone();
            calls.push(tokio::spawn(async move { api.resume(&session).await.unwrap() }));
        }
    }
    let mut outcomes = Vec::new();
    for call in calls {
        outcomes.push(call.await.unwrap().outcome);
    }
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, ResumeOutcome::NativeLoad | ResumeOutcome::AlreadyRunning)),
        "{outcomes:?}"
    );
    assert!(outcomes.contains(&ResumeOutcome::NativeLoad));
    // Exactly one sidecar and one agent run for the session.
    daemon.agentctl_pid(&session);
    let agents = Daemon::processes_mentioning(&daemon.root.path().join(".mock-agent"));
    assert_eq!(agents.len(), 1, "one agent process: {agents:?}");

    // A terminal session cannot be resumed; a vanished workspace is named.
    let other = api.ready_session("mock", &daemon.workspace("gone")).await;
    kill_sidecar(&daemon, &api, &other).await;
    std::fs::remove_dir_all(daemon.workspace("gone")).unwrap();
    let error = api.resume(&other).await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::InvalidState);
    assert!(error.message.contains("no longer exists"), "{error:?}");
    ok("task.session.stop", api.typed().session_stop(session.clone())).await;
    let error = api.resume(&session).await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::Conflict);
}

#[tokio::test]
async fn a_prompt_after_a_restart_that_lost_the_agent_resumes_lazily() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("l")).await;
    api.ask(&session, "remember me").await;
    let sidecar = daemon.agentctl_pid(&session);
    drop(api);
    daemon.kill().await;
    tether_tests::daemon::sigkill(sidecar).await;
    daemon.restart().await;
    let api = daemon.api().await;
    let lost = api.status(&session).await;
    assert_eq!((lost.needs_resume, lost.resume_reason.as_str()), (true, "agent_not_running"));
    // No agent was launched eagerly.
    assert!(
        Daemon::processes_mentioning(&daemon.session_dir(&session).join("agentctl")).is_empty()
    );
    let reply = api.ask(&session, "do you remember?").await;
    assert!(reply.contains("remembered 2 earlier messages"), "{reply}");
}

#[tokio::test]
async fn a_pending_permission_request_survives_a_restart() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("p")).await;
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    api.prompt(&session, "/permission").await.unwrap();
    let (asked, request_id, _) = until_permission_request(&mut events).await;
    drop(events);
    drop(api);
    daemon.kill().await;
    daemon.restart().await;
    let api = daemon.api().await;
    let asked_seq = asked.last().unwrap().seq;
    let mut events = api.subscribe(&session, asked_seq).await;
    // Re-emitted after the restart, so a fresh client learns of it.
    until(&mut events, |e| {
        matches!(&e.kind, EventKind::PermissionRequest { request_id: id, .. } if *id == request_id)
    })
    .await;
    let answer = api.typed().permission_respond(session.clone(), request_id, Some("allow".into()));
    ok("task.session.permission.respond", answer).await;
    let seen = until(&mut events, turn_ended).await;
    assert_eq!(stop_reason(seen.last().unwrap()), Some("end_turn"));
    assert!(chunks(&seen).concat().contains("the tool ran"));
}

#[tokio::test]
async fn sigterm_leaves_sidecars_running_and_stop_all_stops_them() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("t")).await;
    let sidecar = daemon.agentctl_pid(&session);
    drop(api);
    daemon.terminate().await;
    assert!(agentctl::process::is_alive(sidecar), "an operator restart leaves the sidecar running");
    daemon.restart().await;
    let api = daemon.api().await;
    // The re-attach runs in the background (status says `reattaching` meanwhile); a resume
    // joins it, and answers `already_running` once the same sidecar is reattached.
    let resumed = resume(&api, &session).await;
    assert_eq!(
        resumed.outcome,
        ResumeOutcome::AlreadyRunning,
        "re-attached, not relaunched: {resumed:?}"
    );
    assert!(api.status(&session).await.is_agent_running, "re-attached");
    assert_eq!(daemon.agentctl_pid(&session), sidecar, "the same sidecar");
    let pidfd = PidFd::open(sidecar).unwrap();
    let (code, out, err) = daemon.cli(&["stop-all"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("stopped 1 agent"), "{out}");
    within("the sidecar to stop", pidfd.exited()).await.unwrap();
    let stopped = api.status(&session).await;
    assert_eq!((stopped.needs_resume, stopped.state), (true, WAITING));
}
