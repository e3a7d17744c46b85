//! The summary turn at a pause (`[session] summarize_on_pause`): the agent is
//! asked once more for its decisions, open problems and next steps as JSON; a valid answer
//! is stored in the pause's snapshot and carried into the next injected resume, a malformed
//! one is refused without losing the pause, and a supervisor killed around the summary turn
//! leaves the session paused, never stuck.

use protocol::api::{
    ApiClient, EventKind, PauseSummary, PromptOrigin, SessionEvent, SessionState, SnapshotTrigger,
    SummaryState,
};
use tether_tests::daemon::{Api, Daemon, ok, until};
use tether_tests::within;

const SUMMARIZE: &str = "id = \"summarize\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{home}/.mock-agent\"]\nprotocol = \"acp\"\n[session]\nnative_resume = false\nhistory_injection = true\nsummarize_on_pause = true\n";

const ANSWER: &str = r#"{"decisions":[{"decision":"keep the parser hand-written","rationale":"the grammar is tiny","alternatives":["a parser generator"]}],"open_problems":["the lexer drops tabs"],"next_steps":["fix the lexer"]}"#;

fn is_paused(event: &SessionEvent) -> bool {
    matches!(event.kind, EventKind::Paused { .. })
}

/// Asks for a pause and follows the session until it is `PAUSED`: the events seen, and the
/// pause's snapshot's summary.
async fn pause_and_read(
    api: &Api,
    session: &str,
    force_after_ms: Option<u64>,
    summarizes: bool,
) -> (Vec<SessionEvent>, PauseSummary) {
    let after = api.status(session).await.last_event_seq;
    let mut events = api.subscribe(session, after).await;
    let asked =
        api.typed().session_pause(session.to_owned(), Some("end of day".into()), force_after_ms);
    let asked = ok("task.session.pause", asked).await;
    // A summary turn is waited for: the pause is not immediate.
    assert_eq!(asked.pause_requested, summarizes, "{asked:?}");
    assert_eq!(asked.snapshot_id.is_none(), summarizes, "{asked:?}");
    let seen = until(&mut events, is_paused).await;
    (seen, paused_summary(api, session, SnapshotTrigger::Pause).await)
}

/// The summary in the session's newest (the pause's) snapshot.
async fn paused_summary(api: &Api, session: &str, trigger: SnapshotTrigger) -> PauseSummary {
    assert_eq!(api.status(session).await.state, SessionState::Paused);
    let list = ok("snapshot.list", api.typed().snapshot_list(session.to_owned())).await;
    // (A turn's snapshot, taken in the background, may land after the pause's.)
    let newest = list
        .iter()
        .rev()
        .find(|s| s.trigger != SnapshotTrigger::TurnComplete)
        .expect("the pause's snapshot");
    let snapshot = ok("snapshot.get", api.typed().snapshot_get(newest.snapshot_id.clone())).await;
    assert_eq!(snapshot.trigger, trigger, "{snapshot:?}");
    snapshot.summary.expect("a pause's snapshot says what became of its summary")
}

/// The summary turn started among `events`: `(turn id, prompt)`. Every turn started there
/// is one (a pause takes no prompt of a person), and says it is Tether's.
fn started(events: &[SessionEvent]) -> Option<(String, String)> {
    let turns: Vec<_> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::TurnStarted { turn_id, prompt, origin, .. } => {
                Some((turn_id, prompt, origin))
            }
            _ => None,
        })
        .collect();
    assert!(turns.len() <= 1, "one summary turn at most: {turns:?}");
    turns.first().map(|(turn_id, prompt, origin)| {
        assert_eq!(**origin, PromptOrigin::PauseSummary, "{events:?}");
        ((*turn_id).clone(), (*prompt).clone())
    })
}

/// A valid answer is stored whole and primes the next injected resume; a malformed one is
/// refused, saying why, and the session pauses all the same.
#[tokio::test]
async fn a_summary_turn_is_validated_stored_and_carried_and_a_malformed_one_refused() {
    let daemon = Daemon::start_with_profiles(&[], &[("summarize.toml", SUMMARIZE)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("summarize", &daemon.workspace("summary")).await;
    api.ask(&session, &format!("/then /say {ANSWER}\nwork on the parser")).await;

    let (seen, summary) = pause_and_read(&api, &session, None, true).await;
    let (turn_id, prompt) = started(&seen).expect("a summary turn ran before the pause");
    assert!(prompt.contains("\"open_problems\"") && prompt.contains("JSON"), "{prompt}");
    assert_eq!(summary.state, SummaryState::Stored, "{summary:?}");
    assert_eq!(summary.turn_id.as_deref(), Some(turn_id.as_str()));
    let stored = summary.summary.expect("the stored summary");
    assert_eq!(stored.decisions.len(), 1);
    assert_eq!(stored.decisions[0].decision, "keep the parser hand-written");
    assert_eq!(stored.decisions[0].rationale, "the grammar is tiny");
    assert_eq!(stored.decisions[0].alternatives, ["a parser generator"]);
    assert_eq!(stored.open_problems, ["the lexer drops tabs"]);
    assert_eq!(stored.next_steps, ["fix the lexer"]);
    // Not a forced pause: the agent answered.
    let forced = seen.iter().find_map(|e| match e.kind {
        EventKind::Paused { forced, .. } => Some(forced),
        _ => None,
    });
    assert_eq!(forced, Some(false));

    // The CLI's resume says what the agent summarised; the resume injects history, and
    // its context carries the summary.
    let (code, out, err) = daemon.cli(&["resume", &session]).await;
    assert_eq!(code, 0, "{out}{err}");
    let line = "agent's summary: 1 decision, 1 open problem; next: fix the lexer";
    assert!(out.contains(line), "{out}");
    // Paused again before the agent worked: it is not asked (it would summarise the context
    // it is to be given); the summary so far is carried over.
    let (seen, carried) = pause_and_read(&api, &session, None, false).await;
    assert!(started(&seen).is_none(), "no summary turn: {seen:?}");
    assert_eq!(carried.state, SummaryState::Stored, "{carried:?}");
    assert_eq!(carried.turn_id.as_deref(), Some(turn_id.as_str()));
    assert!(carried.note.as_deref().unwrap_or_default().starts_with("carried over from snapshot"));
    api.resume(&session).await.expect("resume");
    let first = api.ask(&session, "go on").await;
    let decisions = "=== DECISIONS (as the agent summarised them at the pause) ===\n- keep the parser hand-written (because: the grammar is tiny) [considered: a parser generator]\n";
    assert!(first.contains(decisions), "{first}");
    assert!(first.contains("=== OPEN PROBLEMS ===\n- the lexer drops tabs\n"), "{first}");
    assert!(first.contains("- fix the lexer\n"), "{first}");

    // A malformed answer: refused with the reason; the pause and the snapshot stand.
    api.ask(&session, "/then /say I decided many things, all of them good.").await;
    let (seen, summary) = pause_and_read(&api, &session, None, true).await;
    assert!(started(&seen).is_some(), "the agent was asked again: {seen:?}");
    assert_eq!(summary.state, SummaryState::Invalid, "{summary:?}");
    assert!(summary.summary.is_none());
    let note = summary.note.unwrap_or_default();
    assert!(note.starts_with("the answer holds no JSON object"), "{note}");
    // Still resumable; the CLI says why there is no summary.
    let (code, out, err) = daemon.cli(&["resume", &session]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("agent's summary refused: the answer holds no JSON object"), "{out}");
    assert!(api.ask(&session, "and now").await.contains("and now"));
}

/// An agent that does not answer within the pause's wait: its summary turn is cancelled
/// and the session pauses without a summary (not a forced pause: no work was cut).
#[tokio::test]
async fn a_summary_turn_that_takes_too_long_is_cut_and_the_session_pauses() {
    let daemon = Daemon::start_with_profiles(&[], &[("summarize.toml", SUMMARIZE)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("summarize", &daemon.workspace("slow")).await;
    api.ask(&session, "/then /sleep 600000\nwork").await;
    let (seen, summary) = pause_and_read(&api, &session, Some(1_000), true).await;
    assert_eq!(summary.state, SummaryState::Failed, "{summary:?}");
    assert!(summary.note.as_deref().unwrap_or_default().contains("cancelled"), "{summary:?}");
    let forced = seen.iter().find_map(|e| match e.kind {
        EventKind::Paused { forced, .. } => Some(forced),
        _ => None,
    });
    assert_eq!(forced, Some(false), "{seen:?}");
}

/// The supervisor SIGKILLed while the summary turn runs: after the restart the turn's
/// answer (spooled by agentctl) is read, stored, and the session pauses.
#[tokio::test]
async fn a_kill_during_the_summary_turn_leaves_the_session_paused() {
    let mut daemon = Daemon::start_with_profiles(&[], &[("summarize.toml", SUMMARIZE)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("summarize", &daemon.workspace("kill")).await;
    api.ask(&session, &format!("/then /think summarising\\n/sleep 1500\\n/say {ANSWER}\nwork"))
        .await;
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    let asked = api.typed().session_pause(session.clone(), None, None);
    assert!(ok("task.session.pause", asked).await.pause_requested);
    // Killed once the agent has the summary prompt (it said something of it).
    let seen = until(&mut events, |e| matches!(e.kind, EventKind::AgentThoughtChunk { .. })).await;
    let (turn_id, _) = started(&seen).expect("the summary turn");
    drop(events);
    daemon.kill().await;
    daemon.restart().await;
    let api = daemon.api().await;
    let mut events = api.subscribe(&session, seen.last().map_or(0, |e| e.seq)).await;
    until(&mut events, is_paused).await;
    let summary = paused_summary(&api, &session, SnapshotTrigger::Pause).await;
    assert_eq!(summary.state, SummaryState::Stored, "{summary:?}");
    assert_eq!(summary.turn_id, Some(turn_id));
    // Nothing of the execution is left running.
    for pid in daemon.sidecars(&session) {
        if let Ok(pidfd) = agentctl::process::PidFd::open(pid) {
            within("the paused session's sidecar to exit", pidfd.exited()).await.unwrap();
        }
    }
    api.resume(&session).await.expect("resume after the kill");
    assert!(api.ask(&session, "after the kill").await.contains("after the kill"));
}

/// The supervisor killed right after it recorded asking for the summary and before the
/// prompt left: after the restart the session pauses, saying the summary was not given.
#[tokio::test]
async fn a_kill_before_the_summary_prompt_left_still_pauses() {
    let env = [("TETHER_FAULT", "pause.summary_asked")];
    let mut daemon = Daemon::start_with_env(&[], &[("summarize.toml", SUMMARIZE)], &env).await;
    let api = daemon.api().await;
    let session = api.ready_session("summarize", &daemon.workspace("fault")).await;
    api.ask(&session, &format!("/then /say {ANSWER}\nwork")).await;
    let after = api.status(&session).await.last_event_seq;
    // The supervisor dies while answering (or right after).
    let _ = api.typed().session_pause(session.clone(), None, None).await;
    within("the supervisor to die at the fault point", daemon.wait_exit()).await;
    daemon.restart_with_env(&[]).await;
    let api = daemon.api().await;
    let mut events = api.subscribe(&session, after).await;
    let seen = until(&mut events, is_paused).await;
    assert!(started(&seen).is_none(), "the agent was not asked twice: {seen:?}");
    let summary = paused_summary(&api, &session, SnapshotTrigger::Pause).await;
    assert_eq!(summary.state, SummaryState::Failed, "{summary:?}");
    let note = summary.note.unwrap_or_default();
    assert_eq!(note, "the supervisor stopped before the summary prompt was sent");
    api.resume(&session).await.expect("resume after the kill");
    assert!(api.ask(&session, "again").await.contains("again"));
}

/// A context handoff asks for the summary too: the fresh agent session's context carries
/// the agent's plan and its summary beside the turns.
#[tokio::test]
async fn a_handoff_carries_the_plan_and_the_summary() {
    let daemon = Daemon::start_with_profiles(&[], &[("summarize.toml", SUMMARIZE)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("summarize", &daemon.workspace("handoff")).await;
    let after = api.status(&session).await.last_event_seq;
    let mut events = api.subscribe(&session, after).await;
    let prompt = format!(
        "/plan read the grammar; write the parser; test it\n/then /say {ANSWER}\n/usage 90 100\nbig job"
    );
    api.prompt(&session, &prompt).await.expect("prompt");
    let seen = until(&mut events, is_paused).await;
    let turns = seen.iter().filter(|e| matches!(e.kind, EventKind::TurnStarted { .. })).count();
    assert_eq!(turns, 2, "the job, then the summary turn: {seen:?}");
    let summary = {
        let list = ok("snapshot.list", api.typed().snapshot_list(session.clone())).await;
        let exhausted = list.iter().rev().find(|s| s.trigger == SnapshotTrigger::Exhaustion);
        let id = exhausted.expect("the handoff's snapshot").snapshot_id.clone();
        ok("snapshot.get", api.typed().snapshot_get(id)).await.summary.expect("its summary")
    };
    assert_eq!(summary.state, SummaryState::Stored, "{summary:?}");

    let resumed = api.resume(&session).await.expect("resume");
    assert_eq!(resumed.outcome, protocol::api::ResumeOutcome::ContextHandoff, "{resumed:?}");
    let first = api.ask(&session, "go on").await;
    assert!(first.contains("remembered 0 earlier messages"), "a fresh agent session: {first}");
    let plan = "=== PLAN (as the agent last gave it) ===\n[done] read the grammar\n[in progress] write the parser\n[next] test it\n";
    assert!(first.contains(plan), "{first}");
    assert!(
        first.contains("- keep the parser hand-written (because: the grammar is tiny)"),
        "{first}"
    );
    assert!(first.contains("=== OPEN PROBLEMS ===\n- the lexer drops tabs\n"), "{first}");
}

/// A pause while a budget is used up does not spend a summary turn; the snapshot says so.
#[tokio::test]
async fn no_summary_turn_over_a_budget() {
    let daemon = Daemon::start_with_profiles(&[], &[("summarize.toml", SUMMARIZE)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("summarize", &daemon.workspace("budget")).await;
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, &format!("/tokens 100 200\n/then /say {ANSWER}\nwork")).await.unwrap();
    // The turn's snapshot is taken after its limits were checked: a budget set below what
    // was spent after that pauses nothing by itself.
    let turn_snapshot = |e: &SessionEvent| {
        matches!(e.kind, EventKind::SnapshotTaken { trigger: SnapshotTrigger::TurnComplete, .. })
    };
    until(&mut events, turn_snapshot).await;
    let set = api.typed().budget_set(Some(session.clone()), None, Some(100), None, None);
    ok("budget.set", set).await;
    let (seen, summary) = pause_and_read(&api, &session, None, false).await;
    assert!(started(&seen).is_none(), "no summary turn: {seen:?}");
    assert_eq!(summary.state, SummaryState::Skipped, "{summary:?}");
    assert!(
        summary.note.as_deref().unwrap_or_default().ends_with(": no more spending"),
        "{summary:?}"
    );
}

/// A session whose agent never had a turn has nothing to summarise: its pause asks for
/// nothing and is immediate; a person's prompt is marked as theirs.
#[tokio::test]
async fn a_session_that_never_worked_is_not_asked_for_a_summary() {
    let daemon = Daemon::start_with_profiles(&[], &[("summarize.toml", SUMMARIZE)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("summarize", &daemon.workspace("idle")).await;
    let (seen, summary) = pause_and_read(&api, &session, None, false).await;
    assert!(started(&seen).is_none(), "no summary turn: {seen:?}");
    assert_eq!(summary.state, SummaryState::Skipped, "{summary:?}");
    assert_eq!(summary.note.as_deref(), Some("no turn ran: there is nothing to summarise"));

    api.resume(&session).await.expect("resume");
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, "hello").await.unwrap();
    let seen = until(&mut events, |e| matches!(e.kind, EventKind::TurnStarted { .. })).await;
    let origin = seen.iter().find_map(|e| match &e.kind {
        EventKind::TurnStarted { origin, .. } => Some(*origin),
        _ => None,
    });
    assert_eq!(origin, Some(PromptOrigin::User), "{seen:?}");
}

/// A budget's own pause (a turn spent past it) asks for no summary either.
#[tokio::test]
async fn a_budgets_pause_asks_for_no_summary() {
    let daemon = Daemon::start_with_profiles(&[], &[("summarize.toml", SUMMARIZE)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("summarize", &daemon.workspace("budget-pause")).await;
    let set = api.typed().budget_set(Some(session.clone()), None, Some(100), None, None);
    ok("budget.set", set).await;
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, &format!("/tokens 100 200\n/then /say {ANSWER}\nwork")).await.unwrap();
    let seen = until(&mut events, is_paused).await;
    let turns = seen.iter().filter(|e| matches!(e.kind, EventKind::TurnStarted { .. })).count();
    assert_eq!(turns, 1, "only the prompt's turn: {seen:?}");
    let summary = paused_summary(&api, &session, SnapshotTrigger::Budget).await;
    assert_eq!(summary.state, SummaryState::Skipped, "{summary:?}");
    assert_eq!(summary.note.as_deref(), Some("a budget's pause does not spend more"));
}

/// The CLI's `pause` says the agent is asked for its summary, waits for the pause, and
/// prints what the agent summarised.
#[tokio::test]
async fn the_cli_pause_waits_for_the_summary_and_prints_it() {
    let daemon = Daemon::start_with_profiles(&[], &[("summarize.toml", SUMMARIZE)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("summarize", &daemon.workspace("cli")).await;
    api.ask(&session, &format!("/then /say {ANSWER}\nwork")).await;
    let (code, out, err) = daemon.cli(&["pause", &session, "--reason", "lunch"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let asked = "pause requested; the agent is asked for its summary first";
    assert!(out.contains(asked), "{out}");
    assert!(out.contains(&format!("session {session} paused (snapshot ")), "{out}");
    let line = "agent's summary: 1 decision, 1 open problem; next: fix the lexer";
    assert!(out.contains(line), "{out}");
    assert_eq!(api.status(&session).await.state, SessionState::Paused);
}

/// A note left for the agent (a file the reviewer reverted) is not spent on the summary
/// turn of a pause: the agent that goes on after it is told, with its first prompt.
#[tokio::test]
async fn a_note_for_the_agent_waits_past_the_summary_turn_for_the_next_prompt() {
    let daemon = Daemon::start_with_profiles(&[], &[("summarize.toml", SUMMARIZE)]).await;
    let api = daemon.api().await;
    let repo = crate::workspaces::repository(&daemon, "noted").await;
    let session = api.ready_session("summarize", &repo).await;
    let readme = repo.join("README");
    api.ask(&session, &format!("/then /say {ANSWER}\n/write {} edited", readme.display())).await;
    let revert = api.typed().session_changes_revert(session.clone(), "README".into());
    ok("revert", revert).await;
    let (seen, summary) = pause_and_read(&api, &session, None, true).await;
    let (_, prompt) = started(&seen).expect("a summary turn ran before the pause");
    assert!(!prompt.contains("was reverted"), "{prompt}");
    assert_eq!(summary.state, SummaryState::Stored, "{summary:?}");
    api.resume(&session).await.expect("resume");
    let first = api.ask(&session, "go on").await;
    assert!(first.contains("- README was reverted by the person reviewing"), "{first}");
}
