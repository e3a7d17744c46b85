//! Regression tests for "Sessions you can trust": each verified defect, driven
//! with real processes and, where timing would otherwise decide, a named fault point
//! (`TETHER_FAULT`) that SIGKILLs the supervisor exactly there.

use protocol::errors::ErrorKind;
use std::time::Duration;

use agentctl::process::PidFd;
use nix::sys::signal::Signal;
use protocol::api::{
    ApiClient, EntryType, EventKind, HistoryEntry, ResumeOutcome, SessionEvent, SessionState,
    TurnState,
};
use tether_tests::daemon::{
    Api, Create, Daemon, await_log, chunks, is_state, kill_sidecar, next, ok, stop_reason,
    turn_ended, until, until_permission_request,
};
use tether_tests::within;

fn signal(pid: u32, signal: Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).expect("signal");
}

fn sidecars(daemon: &Daemon, session: &str) -> Vec<u32> {
    daemon.sidecars(session)
}

/// Waits until the process is gone (it must be, soon).
async fn gone(pid: u32) {
    if let Ok(pidfd) = PidFd::open(pid) {
        within("a fenced process to die", pidfd.exited()).await.expect("pidfd");
    }
}

/// Sends a prompt to a daemon armed with a fault point, waits for the daemon to die there,
/// restarts it disarmed and follows the session's events from before the prompt to the end
/// of the turn. Returns a client of the new daemon and every event seen.
async fn prompt_through_a_fault(
    daemon: &mut Daemon,
    api: Api,
    session: &str,
    prompt: &str,
) -> (Api, Vec<SessionEvent>) {
    let mut events = api.subscribe_at_end(session).await;
    api.prompt(session, prompt).await.unwrap();
    let mut seen = vec![next(&mut events).await];
    drop(events);
    drop(api);
    let api = daemon.fault_restart_and_follow(session, &mut seen).await;
    (api, seen)
}

/// `(chunks, history)` of a finished turn: every streamed chunk and the agent messages of
/// the history, for exactly-once checks.
async fn history_text(api: &Api, session: &str) -> Vec<HistoryEntry> {
    api.history(session).await
}

/// The texts of the agent messages in a history.
fn agent_messages(history: &[HistoryEntry]) -> Vec<&str> {
    history
        .iter()
        .filter(|e| e.kind == EntryType::AgentMessage)
        .map(|e| e.content.as_str())
        .collect()
}

/// The state of the turn a `turn_ended` event ended.
fn turn_state(event: &SessionEvent) -> Option<TurnState> {
    match event.kind {
        EventKind::TurnEnded { state, .. } => Some(state),
        _ => None,
    }
}

const WAITING: SessionState = SessionState::WaitingForInput;

/// An acknowledgement racing a SIGKILL. The turn holds several
/// messages (tool calls between them), so acknowledgements go out mid-turn; the supervisor
/// dies right after agentctl confirmed the second one. The restarted supervisor must be
/// accepted by agentctl, deliver every chunk once, record every chunk once in the history,
/// and keep exactly one sidecar.
#[tokio::test]
async fn a_kill_right_after_an_ack_loses_nothing_and_doubles_nothing() {
    let mut daemon = Daemon::start_with_env(&[], &[], &[("TETHER_FAULT", "ack.sent@3")]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("a")).await;
    let (api, seen) =
        prompt_through_a_fault(&mut daemon, api, &session, "/stream 600\n/rounds 4\nmany").await;
    let ended = seen.last().unwrap();
    assert_eq!(turn_state(ended), Some(TurnState::Completed), "{ended:?}");
    let texts = chunks(&seen);
    assert_eq!(texts.len(), 3 * 600 + 600, "every chunk once in the stream");
    let mut unique = texts.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), texts.len(), "no chunk twice");
    let history = history_text(&api, &session).await;
    let recorded: String = agent_messages(&history).concat();
    assert_eq!(recorded, texts.concat(), "the history holds every chunk once, in order");
    assert_eq!(sidecars(&daemon, &session).len(), 1, "one sidecar");
    assert!(api.ask(&session, "still there?").await.contains("remembered 2 earlier messages"));
}

/// The supervisor is SIGKILLed in the middle of one long
/// message, about a thousand chunks in; the history must hold the whole message. (Where the
/// kill lands depends on timing; the fault-point test below pins it.)
#[tokio::test]
async fn history_keeps_the_start_of_a_message_cut_by_a_kill() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("h")).await;
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    api.prompt(&session, "/stream 3000\nlong").await.unwrap();
    // About a thousand chunks in: past several 256-event ack points.
    let mut seen = Vec::new();
    while chunks(&seen).len() < 1000 {
        seen.push(next(&mut events).await);
    }
    drop(events);
    drop(api);
    let api = daemon.kill_restart_and_follow(&session, &mut seen).await;
    let texts = chunks(&seen);
    assert_eq!(texts.len(), 3000, "the stream is complete");
    let history = history_text(&api, &session).await;
    assert_eq!(agent_messages(&history), [texts.concat().as_str()], "one message, all 3000 chunks");
}

/// The same, killed by the fault point inside the message (deterministic position).
#[tokio::test]
async fn a_kill_mid_message_at_the_fault_point_keeps_the_history_whole() {
    let mut daemon =
        Daemon::start_with_env(&[], &[], &[("TETHER_FAULT", "history.mid_message@1500")]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("m")).await;
    api.prompt(&session, "/stream 2000\nx").await.unwrap();
    drop(api);
    let mut seen = Vec::new();
    let api = daemon.fault_restart_and_follow(&session, &mut seen).await;
    assert_eq!(chunks(&seen).len(), 2000);
    let history = history_text(&api, &session).await;
    let kinds: Vec<EntryType> = history.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [EntryType::UserMessage, EntryType::AgentMessage]);
    assert_eq!(history[1].content, chunks(&seen).concat());
}

/// Two sidecars are SIGSTOPped across a supervisor restart. The API
/// serves at once and says `reattaching`; the hung sidecars are fenced (killed) when the
/// re-attach gives up; a resume then starts exactly one new sidecar per session, and
/// `stop-all` leaves none.
#[tokio::test]
async fn hung_sidecars_at_restart_are_fenced_never_doubled() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let one = api.ready_session("mock", &daemon.workspace("one")).await;
    let two = api.ready_session("mock", &daemon.workspace("two")).await;
    api.ask(&one, "hello").await;
    let stopped = [daemon.agentctl_pid(&one), daemon.agentctl_pid(&two)];
    drop(api);
    daemon.kill().await;
    for pid in stopped {
        signal(pid, Signal::SIGSTOP);
    }
    daemon.restart().await;
    let api = daemon.api().await;
    // Serving already, while the re-attaches hang.
    let status = api.status(&one).await;
    assert_eq!(
        (status.resume_reason.as_str(), status.needs_resume),
        ("reattaching", false),
        "{status:?}"
    );
    // A resume asked meanwhile waits for the re-attach, which fails and fences.
    let resumed = api.resume(&one).await.unwrap();
    assert_eq!(resumed.outcome, ResumeOutcome::NativeLoad, "{resumed:?}");
    for pid in stopped {
        gone(pid).await;
    }
    let lost = api.status(&two).await;
    assert_eq!((lost.needs_resume, lost.is_agent_running), (true, false));
    api.resume(&two).await.unwrap();
    for session in [&one, &two] {
        assert_eq!(sidecars(&daemon, session).len(), 1, "one sidecar for {session}");
    }
    assert!(api.ask(&one, "and now?").await.contains("remembered 2 earlier messages"));
    let (code, _, err) = daemon.cli(&["stop-all"]).await;
    assert_eq!(code, 0, "{err}");
    for session in [&one, &two] {
        assert!(sidecars(&daemon, session).is_empty(), "stop-all left a sidecar of {session}");
    }
}

/// A launch cut short after the runtime started agentctl (the
/// supervisor dies before it connects) leaves no sidecar running after the restart.
#[tokio::test]
async fn a_launch_cut_short_leaves_no_orphan_sidecar() {
    let mut daemon =
        Daemon::start_with_env(&[], &[], &[("TETHER_FAULT", "launch.after_runtime")]).await;
    let api = daemon.api().await;
    let task = ok("task.create", api.typed().task_create("cut".into(), None)).await;
    let workspace = daemon.workspace("cut");
    // The create call itself may lose its answer when the supervisor dies.
    let create = Create::new(&task.id, "mock", Some(&workspace)).send(api.typed());
    let _ = within("task.session.create", create).await;
    drop(api);
    within("the supervisor to die at the fault point", daemon.wait_exit()).await;
    let sessions: Vec<String> = std::fs::read_dir(daemon.root.path().join("tether/sessions"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(sessions.len(), 1);
    let session = &sessions[0];
    let orphans = sidecars(&daemon, session);
    assert_eq!(orphans.len(), 1, "the fault point fired after agentctl started");
    daemon.restart_with_env(&[]).await;
    gone(orphans[0]).await;
    let api = daemon.api().await;
    let status = api.status(session).await;
    assert_eq!(status.state, WAITING, "{status:?}");
    assert!(
        status.error.as_deref().is_some_and(|e| e.contains("supervisor was down")),
        "{status:?}"
    );
    // It can be used: a prompt resumes it, with one sidecar.
    assert!(api.ask(session, "hi").await.contains("you said: hi"));
    assert_eq!(sidecars(&daemon, session).len(), 1);
}

/// With its sidecar stopped (SIGSTOP) mid-turn, the session still
/// answers status, cancel and stop at once; stop kills the stopped sidecar for certain.
#[tokio::test]
async fn a_stalled_sidecar_does_not_freeze_the_session() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("s")).await;
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    api.prompt(&session, "/sleep 60000\nslow").await.unwrap();
    until(&mut events, |e| is_state(e, SessionState::Running)).await;
    let sidecar = daemon.agentctl_pid(&session);
    signal(sidecar, Signal::SIGSTOP);
    let quick = Duration::from_secs(1);
    let status =
        tokio::time::timeout(quick, api.status(&session)).await.expect("status answers at once");
    assert_eq!(status.state, SessionState::Running);
    tokio::time::timeout(quick, api.typed().session_cancel(session.clone()))
        .await
        .expect("cancel answers at once")
        .expect("cancel");
    tokio::time::timeout(quick, api.typed().session_stop(session.clone()))
        .await
        .expect("stop answers at once")
        .expect("stop");
    gone(sidecar).await;
    let status = api.status(&session).await;
    assert_eq!(status.state, SessionState::Completed);
    let ended = until(&mut events, turn_ended).await;
    assert_eq!(turn_state(ended.last().unwrap()), Some(TurnState::Failed));
    assert!(sidecars(&daemon, &session).is_empty());
}

/// Two concurrent `agent.start` calls to one agentctl start one agent.
#[tokio::test]
async fn concurrent_agent_starts_spawn_one_agent() {
    let sidecar = tether_tests::sidecar::Sidecar::launch(&[]).await;
    let (a, b) = (sidecar.client().await, sidecar.client().await);
    let start = protocol::control::StartAgent {
        command: tether_tests::workspace_bin("mock-agent").to_string_lossy().into_owned(),
        args: Vec::new(),
        env: Default::default(),
        cwd: sidecar.workspace.path().to_owned(),
        extra_roots: Vec::new(),
        user: None,
        owned_dirs: Vec::new(),
        egress: None,
        isolate_network: false,
    };
    let (first, second) = tokio::join!(a.start_agent(&start), b.start_agent(&start));
    let refused: Vec<_> = [&first, &second].iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(refused.len(), 1, "exactly one start is refused: {first:?} {second:?}");
    assert_eq!(refused[0].kind(), Some(ErrorKind::AlreadyStarted));
    let agents = Daemon::processes_mentioning(&tether_tests::workspace_bin("mock-agent"))
        .into_iter()
        .filter(|pid| agentctl_parent(*pid) == Some(sidecar.pid()))
        .count();
    assert_eq!(agents, 1, "one agent process");
}

fn agentctl_parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()
}

/// A stored row with an unknown runtime does not stop the daemon; the
/// other sessions recover, and the bad one says why.
#[tokio::test]
async fn one_bad_row_does_not_stop_recovery() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let good = api.ready_session("mock", &daemon.workspace("good")).await;
    let bad = api.ready_session("mock", &daemon.workspace("bad")).await;
    drop(api);
    daemon.kill().await;
    let db = daemon.root.path().join("tether/state.db");
    let store = supervisor::store::Store::open(&db).unwrap();
    let bad_id = bad.clone();
    store
        .call(move |conn| {
            conn.execute(
                "UPDATE executors_running SET runtime = 'kubernetes' WHERE session_id = ?1",
                [&bad_id],
            )?;
            Ok(())
        })
        .await
        .unwrap();
    drop(store);
    daemon.restart().await;
    let api = daemon.api().await;
    // A resume joins the background re-attach and answers once it is done.
    let resumed = api.resume(&good).await.unwrap();
    assert_eq!(resumed.outcome, ResumeOutcome::AlreadyRunning, "{resumed:?}");
    assert!(api.status(&good).await.is_agent_running, "the good one is re-attached");
    let status = api.status(&bad).await;
    assert!(status.error.as_deref().is_some_and(|e| e.contains("kubernetes")), "{status:?}");
}

/// An agent that died while the supervisor was down ends its turn and
/// its RUNNING state on the session's stream, so a frontend that only listens learns it.
#[tokio::test]
async fn an_agent_lost_during_downtime_is_announced_on_the_stream() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("d")).await;
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    api.prompt(&session, "/sleep 60000\nslow").await.unwrap();
    let seen = until(&mut events, |e| is_state(e, SessionState::Running)).await;
    let last = seen.last().unwrap().seq;
    let sidecar = daemon.agentctl_pid(&session);
    drop(events);
    drop(api);
    daemon.kill().await;
    signal(sidecar, Signal::SIGKILL);
    gone(sidecar).await;
    daemon.restart().await;
    let api = daemon.api().await;
    let mut events = api.subscribe(&session, last).await;
    let ended = next(&mut events).await;
    assert_eq!(turn_state(&ended), Some(TurnState::Interrupted), "{ended:?}");
    let state = next(&mut events).await;
    assert!(is_state(&state, WAITING), "{state:?}");
    let status = api.status(&session).await;
    assert_eq!((status.state, status.needs_resume), (WAITING, true));
}

/// While a session is starting, status does not ask for a
/// resume; an agent that never answers `session/new` fails the launch after the profile's
/// timeout with a clear error instead of staying `STARTING`.
#[tokio::test]
async fn a_hung_session_new_times_out_and_starting_is_not_needs_resume() {
    let hang = "id = \"hang\"\ncommand = [\"mock-agent\", \"--hang-on\", \"session/new\"]\nprotocol = \"acp\"\n[process]\ninit_timeout_ms = 8000\n";
    let daemon = Daemon::start_with_profiles(&[], &[("hang.toml", hang)]).await;
    let api = daemon.api().await;
    let session = api.create_session("hang", &daemon.workspace("h")).await.unwrap();
    let mut events = api.subscribe(&session, 0).await;
    until(&mut events, |e| is_state(e, SessionState::Starting)).await;
    let status = api.status(&session).await;
    assert_eq!(
        (status.needs_resume, status.resume_reason.as_str()),
        (false, "starting"),
        "{status:?}"
    );
    let (state, error) = tether_tests::daemon::settled(&mut events).await;
    assert_eq!(state, SessionState::Failed);
    assert!(error.contains("did not answer session/new within 8000 ms"), "{error}");
    // The failed execution is retired in the background: each sidecar left goes.
    for pid in sidecars(&daemon, &session) {
        gone(pid).await;
    }
    assert!(sidecars(&daemon, &session).is_empty(), "the failed launch's sidecar is gone");
}

/// A prompt over the agent's line limit is refused, not accepted and
/// lost.
#[tokio::test]
async fn an_oversized_prompt_is_refused() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("big")).await;
    // Over the API's prompt limit: refused before it reaches the session, naming the limit.
    let huge = "x".repeat(17 * 1024 * 1024);
    let error = api.prompt(&session, &huge).await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::InvalidParams, "{error:?}");
    assert_eq!((error.field.as_deref(), error.limit), (Some("prompt"), Some(8 * 1024 * 1024)));
    // Within it, but over the agent's line limit once escaped as JSON: refused by the
    // session, which says so.
    let quotes = "\"".repeat(8 * 1024 * 1024);
    let error = api.prompt(&session, &quotes).await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::InvalidParams, "{error:?}");
    assert_eq!(error.field.as_deref(), Some("prompt"));
    assert!(error.message.contains("line limit"), "{error:?}");
    // The session is untouched and goes on.
    assert!(api.ask(&session, "small").await.contains("you said: small"));
}

/// An agent crash mid-turn publishes its state change once.
#[tokio::test]
async fn a_crash_mid_turn_publishes_one_state_change() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("c")).await;
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    api.prompt(&session, "/crash 4").await.unwrap();
    let mut seen = until(&mut events, turn_ended).await;
    seen.extend(until(&mut events, |e| matches!(e.kind, EventKind::Notice { .. })).await);
    assert_eq!(seen.iter().filter(|e| is_state(e, WAITING)).count(), 1, "{seen:#?}");
}

/// A permission answer cut off by a kill (accepted, not yet sent) is
/// not lost: after the restart the request is still pending and can be answered.
#[tokio::test]
async fn a_permission_answer_cut_off_by_a_kill_can_be_given_again() {
    let mut daemon =
        Daemon::start_with_env(&[], &[], &[("TETHER_FAULT", "permission.queued")]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("p")).await;
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    api.prompt(&session, "/permission").await.unwrap();
    let (asked, request_id, _) = until_permission_request(&mut events).await;
    let allow = Some("allow".to_owned());
    // The answer may be lost with the daemon.
    let answer = api.typed().permission_respond(session.clone(), request_id.clone(), allow.clone());
    let _ = within("task.session.permission.respond", answer).await;
    drop(events);
    drop(api);
    within("the supervisor to die at the fault point", daemon.wait_exit()).await;
    daemon.restart_with_env(&[]).await;
    let api = daemon.api().await;
    let mut events = api.subscribe(&session, asked.last().unwrap().seq).await;
    until(&mut events, |e| {
        matches!(&e.kind, EventKind::PermissionRequest { request_id: id, .. } if *id == request_id)
    })
    .await;
    let answer = api.typed().permission_respond(session.clone(), request_id.clone(), allow);
    ok("task.session.permission.respond", answer).await;
    let seen = until(&mut events, turn_ended).await;
    assert_eq!(turn_state(seen.last().unwrap()), Some(TurnState::Completed));
    assert!(chunks(&seen).concat().contains("the tool ran"));
}

/// Updates that are news (available commands, a title) arriving during
/// a `session/load` are forwarded, while the replayed conversation is not.
#[tokio::test]
async fn updates_during_a_load_that_are_not_replay_are_forwarded() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("l")).await;
    api.ask(&session, "remember this").await;
    let sidecar = daemon.agentctl_pid(&session);
    let after = api.status(&session).await.last_event_seq;
    signal(sidecar, Signal::SIGKILL);
    gone(sidecar).await;
    let mut events = api.subscribe(&session, after).await;
    until(&mut events, |e| matches!(&e.kind, EventKind::State { error: Some(_), .. })).await;
    let resumed = api.resume(&session).await.unwrap();
    assert_eq!(resumed.outcome, ResumeOutcome::NativeLoad);
    let seen = until(&mut events, |e| matches!(e.kind, EventKind::ResumeOutcome { .. })).await;
    // The updates are the agent's ACP `session/update` payloads, relayed raw.
    let kinds: Vec<&str> = seen
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::SessionUpdate { update } => update["sessionUpdate"].as_str(),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["available_commands_update", "session_info_update"], "{seen:#?}");
    assert!(chunks(&seen).is_empty(), "the replay is not shown again");
}

/// A small tmpfs mounted at `root/tether` for one test (root only), lazily unmounted and
/// removed when dropped.
pub(crate) struct Tmpfs {
    root: std::path::PathBuf,
}

impl Tmpfs {
    pub(crate) fn mount(root: &std::path::Path, bytes: u64) -> Option<Tmpfs> {
        let data = root.join("tether");
        std::fs::create_dir_all(&data).ok()?;
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes},mode=0700"), "tmpfs"])
            .arg(&data)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        mounted.then(|| Tmpfs { root: root.to_owned() })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ =
            std::process::Command::new("umount").arg("-l").arg(self.root.join("tether")).status();
        // The temp dir could not remove a mount point; once unmounted, it can be.
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The disk fills in the middle of a streamed turn. Intake stops with a
/// clear error in status (nothing is dropped), cancel still answers, and once space is freed
/// the turn ends, every chunk the subscriber saw is in the history exactly once, and the
/// session goes on.
#[tokio::test]
async fn a_full_disk_holds_the_output_and_loses_nothing() {
    let (daemon, tmpfs) =
        Daemon::start_prepared(&[], &[], &[], |root| Tmpfs::mount(root, 48 * 1024 * 1024)).await;
    let Some(_tmpfs) = tmpfs else {
        assert!(
            std::env::var_os("REQUIRE_DOCKER").is_none(),
            "a tmpfs could not be mounted (CI runs as root and must be able to)"
        );
        println!("SKIPPED: a tmpfs cannot be mounted here (needs root)");
        return;
    };
    let mut log = daemon.log_lines();
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("full")).await;
    api.ask(&session, "warm up").await;
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    // Fill the disk but for a little room: enough to accept the prompt, far too little for
    // its 30,000 chunks.
    let data = daemon.root.path().join("tether");
    let stat = nix::sys::statvfs::statvfs(&data).unwrap();
    let free = stat.blocks_available() as u64 * stat.fragment_size() as u64;
    let filler = data.join("filler");
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 1024 * 1024];
        let mut left = free.saturating_sub(2 * 1024 * 1024);
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            if file.write_all(&block[..n]).is_err() {
                break;
            }
            left -= n as u64;
        }
    }
    api.prompt(&session, "/stream 30000\nflood").await.expect("the prompt fits in what is left");
    // The stall is said: by agentctl (its spool) or by the supervisor (its own writes).
    let line = tokio::select! {
        line = await_log(&mut log, "the agent's output is held") => line,
        line = await_log_again(&daemon, "intake stops until it can") => line,
    };
    println!("stalled: {line}");
    let status = api.status(&session).await;
    let error = status.error.clone().unwrap_or_default();
    assert!(error.contains("held") || error.contains("cannot write"), "{status:?}");
    tokio::time::timeout(Duration::from_secs(1), api.typed().session_cancel(session.clone()))
        .await
        .expect("cancel answers at once")
        .expect("cancel");
    std::fs::remove_file(&filler).unwrap();
    let seen = until(&mut events, turn_ended).await;
    let ended = seen.last().unwrap();
    assert!(
        stop_reason(ended) == Some("cancelled") || turn_state(ended) == Some(TurnState::Completed),
        "the turn ends once space is back: {ended:?}"
    );
    let texts = chunks(&seen);
    assert!(!texts.is_empty());
    for (idx, text) in texts.iter().enumerate() {
        assert!(
            text.ends_with(&format!("[{}/30000]", idx + 1)),
            "chunk {idx} out of order or twice: {text}"
        );
    }
    let history = history_text(&api, &session).await;
    // The flood's reply (a long message is recorded in parts): everything after its prompt.
    let flood = history.iter().rposition(|e| e.kind == EntryType::UserMessage).unwrap();
    let recorded: String = agent_messages(&history[flood..]).concat();
    assert_eq!(recorded, texts.concat(), "the history holds what was streamed, once");
    assert!(api.ask(&session, "still there?").await.contains("you said: still there?"));
    drop(events);
    drop(api);
    drop(daemon);
}

/// [`await_log`] on a second receiver (so two needles can be awaited at once).
pub(crate) async fn await_log_again(daemon: &Daemon, needle: &str) -> String {
    let mut lines = daemon.log_lines();
    await_log(&mut lines, needle).await
}

/// Found by the fault matrix: the supervisor killed right after the store recorded a turn's
/// end must already have published `turn_ended` and the state change; otherwise the replay
/// (which finds the turn closed) never publishes them and the session reads `RUNNING`
/// forever.
#[tokio::test]
async fn a_kill_after_a_turn_is_recorded_keeps_its_events() {
    let mut daemon = Daemon::start_with_env(&[], &[], &[("TETHER_FAULT", "turn.recorded@2")]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("t")).await;
    api.ask(&session, "first").await;
    let (api, seen) =
        prompt_through_a_fault(&mut daemon, api, &session, "/stream 50\nsecond").await;
    assert_eq!(seen.iter().filter(|e| turn_ended(e)).count(), 1);
    assert_eq!(chunks(&seen).len(), 50);
    let status = api.status(&session).await;
    assert_eq!(status.state, WAITING, "{status:?}");
    assert!(api.ask(&session, "third").await.contains("you said: third"));
}

/// Found by the fault matrix: the supervisor killed after a turn was recorded but before
/// its prompt reached agentctl. The restarted supervisor cannot wait for an answer that
/// will never come: once the replay has caught up, the turn fails, saying why, and the
/// session takes prompts again.
#[tokio::test]
async fn a_prompt_cut_off_before_delivery_fails_its_turn_instead_of_hanging() {
    let mut daemon = Daemon::start_with_env(&[], &[], &[("TETHER_FAULT", "prompt.recorded")]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("p")).await;
    let after = api.status(&session).await.last_event_seq;
    // The answer is lost with the daemon.
    let _ =
        within("task.session.prompt", api.typed().session_prompt(session.clone(), "lost".into()))
            .await;
    drop(api);
    within("the supervisor to die at the fault point", daemon.wait_exit()).await;
    daemon.restart_with_env(&[]).await;
    let api = daemon.api().await;
    let mut events = api.subscribe(&session, after).await;
    let seen = until(&mut events, turn_ended).await;
    let ended = seen.last().unwrap();
    assert!(
        matches!(&ended.kind, EventKind::TurnEnded { state: TurnState::Failed, error: Some(error), .. }
            if error.contains("before this prompt reached the agent")),
        "{ended:?}"
    );
    assert_eq!(api.status(&session).await.state, WAITING);
    assert!(api.ask(&session, "again").await.contains("you said: again"));
}

/// Found in review: marks are per execution. A resumed session's new agentctl numbers its
/// events from 1 again; after a supervisor restart, marks written for the old execution
/// must not hide the new one's events from the history and the stream.
#[tokio::test]
async fn marks_from_an_earlier_execution_hide_nothing_after_a_restart() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("g")).await;
    api.ask(&session, "/stream 300\nfirst").await;
    kill_sidecar(&daemon, &api, &session).await;
    let resumed = api.resume(&session).await.unwrap();
    assert_eq!(resumed.outcome, ResumeOutcome::NativeLoad);
    drop(api);
    // Before the new execution wrote anything to the history.
    daemon.kill().await;
    daemon.restart().await;
    let api = daemon.api().await;
    let reply = api.ask(&session, "/stream 50\nsecond").await;
    assert!(reply.contains("you said: second") && reply.ends_with("[50/50]"), "{reply}");
    let history = history_text(&api, &session).await;
    assert_eq!(
        agent_messages(&history).last().copied(),
        Some(reply.as_str()),
        "the new execution's reply is recorded"
    );
}

/// Found in review: a session whose first launch was cut short before anything of it was
/// recorded (no runtime record) must not read `STARTING` forever after a restart.
#[tokio::test]
async fn a_session_cut_short_before_its_first_record_is_not_stuck_starting() {
    let mut daemon = Daemon::start_with_env(&[], &[], &[("TETHER_FAULT", "launch.started")]).await;
    let api = daemon.api().await;
    let task = ok("task.create", api.typed().task_create("early".into(), None)).await;
    // The answer may be lost with the daemon; the session's directory names it either way.
    let create = Create::new(&task.id, "mock", Some(&daemon.workspace("e"))).send(api.typed());
    let _ = within("task.session.create", create).await;
    drop(api);
    within("the supervisor to die at the fault point", daemon.wait_exit()).await;
    let session = std::fs::read_dir(daemon.root.path().join("tether/sessions"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .next()
        .expect("the session's directory");
    daemon.restart_with_env(&[]).await;
    let api = daemon.api().await;
    let status = api.status(&session).await;
    assert_eq!(status.state, WAITING, "{status:?}");
    assert!(status.error.as_deref().is_some_and(|e| e.contains("while this session was starting")));
    assert!(api.ask(&session, "hello").await.contains("you said: hello"));
}

/// Found by the fault matrix: after a restart, the first entry a new execution writes (its
/// prompt) carried the old execution's mark — a seq of the old agentctl's count — labelled
/// with the new generation. A second kill, mid-message, then trusted that mark, and the
/// replayed chunks under it were taken as already recorded: the history lost the start of
/// the reply.
#[tokio::test]
async fn an_old_executions_mark_is_never_written_for_a_new_one() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("w")).await;
    api.ask(&session, "/stream 300\nfirst").await;
    kill_sidecar(&daemon, &api, &session).await;
    drop(api);
    // The next prompt starts a new execution (whose load is acknowledged at once), and the
    // supervisor dies right after recording the turn, before any entry of the new execution.
    daemon.kill().await;
    daemon.restart_with_env(&[("TETHER_FAULT", "prompt.recorded")]).await;
    let api = daemon.api().await;
    // The prompt is queued while the agent comes back (the answer may be lost with the
    // daemon), and taken into its turn.
    let _ =
        within("task.session.prompt", api.typed().session_prompt(session.clone(), "kept".into()))
            .await;
    drop(api);
    within("the supervisor to die at the fault point", daemon.wait_exit()).await;
    // Restarted and armed to die again in the middle of a later reply, well below the old
    // execution's mark (about 305); the queued prompt that never reached the agent is sent
    // again first, once.
    daemon.restart_with_env(&[("TETHER_FAULT", "history.mid_message@100")]).await;
    let api = daemon.api().await;
    api.until_turn_of_prompt_ends(&session, "kept").await;
    let (_api, seen) =
        prompt_through_a_fault(&mut daemon, api, &session, "/stream 200\nsecond").await;
    let texts = chunks(&seen);
    assert_eq!(texts.len(), 200, "the stream is complete");
    // The marks are the history file's own bookkeeping (the API does not carry them): read
    // the file.
    let file = std::fs::read_to_string(daemon.session_dir(&session).join("history.jsonl")).unwrap();
    let history: Vec<supervisor::history::HistoryEntry> =
        file.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let marks: Vec<String> = history
        .iter()
        .map(|e| format!("{} {:?} {:?} {:?}", e.seq, e.kind, e.agent_seq, e.generation))
        .collect();
    use supervisor::history::EntryType as Recorded;
    let last = history.iter().rev().find(|e| e.kind == Recorded::AgentMessage).unwrap();
    assert_eq!(last.content, texts.concat(), "the whole reply is recorded: {marks:?}");
    let prompt = history.iter().rev().find(|e| e.kind == Recorded::UserMessage).unwrap();
    assert_eq!(prompt.generation, Some(2), "{prompt:?}");
    assert!(prompt.agent_seq.unwrap() < 100, "a mark of the new count: {prompt:?}");
}

/// A kill while `session/load` is out (`load.sent`) or right after it completed
/// (`load.opened`): the agent's replay of the conversation is in agentctl's spool, and a
/// new actor could not tell it from new output. After the restart the replay must not be
/// recorded again, and the session must go on (remembering).
async fn a_kill_around_a_load_records_its_replay_nowhere(point: &str) {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("l")).await;
    let first = api.ask(&session, "/stream 20\nfirst").await;
    kill_sidecar(&daemon, &api, &session).await;
    drop(api);
    daemon.kill().await;
    daemon.restart_with_env(&[("TETHER_FAULT", point)]).await;
    let api = daemon.api().await;
    // The answer may be lost with the daemon.
    let _ = within("task.session.resume", api.typed().session_resume(session.clone(), None)).await;
    drop(api);
    within("the supervisor to die at the fault point", daemon.wait_exit()).await;
    daemon.restart_with_env(&[]).await;
    let api = daemon.api().await;
    let second = api.ask(&session, "second").await;
    assert!(second.contains("remembered 2 earlier messages"), "{second}");
    let history = history_text(&api, &session).await;
    let summary: Vec<(EntryType, &str)> =
        history.iter().map(|e| (e.kind, e.content.as_str())).collect();
    assert_eq!(
        summary,
        [
            (EntryType::UserMessage, "/stream 20\nfirst"),
            (EntryType::AgentMessage, first.as_str()),
            (EntryType::UserMessage, "second"),
            (EntryType::AgentMessage, second.as_str()),
        ]
    );
    assert_eq!(sidecars(&daemon, &session).len(), 1, "one sidecar");
}

#[tokio::test]
async fn a_kill_during_a_load_records_its_replay_nowhere() {
    a_kill_around_a_load_records_its_replay_nowhere("load.sent").await;
}

/// Found by the fault matrix: a kill after a load's session was recorded as open but before
/// the load's replay was acknowledged made the restarted supervisor record the replay.
#[tokio::test]
async fn a_kill_right_after_a_load_records_its_replay_nowhere() {
    a_kill_around_a_load_records_its_replay_nowhere("load.opened").await;
}

/// Found by the restart bench (one of 100 live sidecars lost): a session's
/// `WAITING_FOR_INPUT` is published before the store says it, and a kill in between left
/// the session `STARTING`, which recovery took for a handshake cut short — it killed the
/// agent of a session its client had been told was ready. The execution is recorded
/// `running` when the ACP session opens, before the state: such a session is re-attached
/// and its state completed.
#[tokio::test]
async fn a_kill_between_a_published_ready_state_and_its_store_write_keeps_the_agent() {
    let fault = [("TETHER_FAULT", "state.opened_published")];
    let mut daemon = Daemon::start_with_env(&[], &[], &fault).await;
    let api = daemon.api().await;
    let session = api.create_session("mock", &daemon.workspace("o")).await.unwrap();
    within("the supervisor to die at the fault point", daemon.wait_exit()).await;
    let sidecar = daemon.agentctl_pid(&session);
    drop(api);
    daemon.restart_with_env(&[]).await;
    let api = daemon.api().await;
    // The log had told subscribers the session was ready before the kill.
    let mut events = api.subscribe(&session, 0).await;
    let (state, _) = tether_tests::daemon::settled(&mut events).await;
    assert_eq!(state, SessionState::WaitingForInput);
    let resumed = api.resume(&session).await.unwrap();
    assert_eq!(resumed.outcome, ResumeOutcome::AlreadyRunning, "re-attached, not relaunched");
    assert_eq!(daemon.agentctl_pid(&session), sidecar, "the same sidecar");
    let status = api.status(&session).await;
    assert_eq!(status.state, SessionState::WaitingForInput, "{status:?}");
    assert!(status.is_agent_running, "{status:?}");
    assert!(api.ask(&session, "still there?").await.contains("still there?"));
}
