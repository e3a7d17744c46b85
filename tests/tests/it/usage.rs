//! Usage, budgets and re-sending: every turn's tokens (`PromptResponse.usage`)
//! and cost (`usage_update`, cumulative, taken apart per turn) are stored with the turn's
//! end and summed per session, task and profile — the same after a restart; budgets warn
//! at 80 % and pause at 100 % until raised; `max_turns` and `max_duration_secs` pause; an
//! interrupted turn is re-sent on request, once.

use std::path::Path;

use nix::sys::signal::Signal;
use protocol::api::{
    ApiClient, BudgetScope, EventKind, SessionEvent, SessionState, SnapshotTrigger, TurnState,
    UsageGroupBy, UsageTotals,
};
use protocol::errors::ErrorKind;
use tether_tests::daemon::{
    Api, Create, Daemon, is_state, ok, refused, settled, turn_ended, until,
    until_permission_request,
};
use tether_tests::within;

use crate::metrics::{scrape, value};

fn paused_by(event: &SessionEvent, wanted: SnapshotTrigger) -> bool {
    matches!(event.kind, EventKind::Paused { trigger: Some(trigger), .. } if trigger == wanted)
}

fn usd(totals: &UsageTotals) -> f64 {
    totals.cost.iter().filter(|c| c.currency == "USD").map(|c| c.amount).sum()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// A second session of `task` on `profile`, waited for until it is ready.
async fn second_session(api: &Api, task: &str, profile: &str, workspace: &Path) -> String {
    let created = ok("create", Create::new(task, profile, Some(workspace)).send(api.typed())).await;
    let mut events = api.subscribe(&created.id, 0).await;
    assert_eq!(settled(&mut events).await.0, SessionState::WaitingForInput);
    created.id
}

/// Tokens and cost per turn add up per session, task and profile, in `status`, in
/// `usage.query` (grouped), in the CLI and in the metrics — and are the same after a
/// restart; the cost mark survives it, so the next report adds only what is new.
#[tokio::test]
async fn usage_adds_up_per_session_task_and_profile_across_a_restart() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let before = scrape(&daemon, &[]).await;
    let one = api.ready_session("mock", &daemon.workspace("one")).await;
    let task = api.status(&one).await.task_id;
    api.ask(&one, "/tokens 100 20 5\n/usage 1000 10000 0.25\nfirst").await;
    api.ask(&one, "/tokens 50 10\n/usage 2000 10000 0.40\nsecond").await;
    let status = api.status(&one).await;
    let usage = &status.usage;
    assert_eq!(
        (usage.totals.turns, usage.totals.input_tokens, usage.totals.output_tokens),
        (2, 150, 30),
        "{usage:?}"
    );
    assert_eq!((usage.totals.cached_read_tokens, usage.totals.total_tokens), (5, 185));
    assert!(close(usd(&usage.totals), 0.40), "{usage:?}");
    assert_eq!((usage.context_used, usage.context_percent), (Some(2000), Some(20)));
    let two = second_session(&api, &task, "mock", &daemon.workspace("two")).await;
    api.ask(&two, "/tokens 10 1\n/usage 10 100 0.05\nthird").await;
    let query = |group_by| {
        api.typed().usage_query(None, Some(task.clone()), None, None, None, None, group_by)
    };
    let report = ok("usage.query", query(Some(UsageGroupBy::Session))).await;
    assert_eq!((report.total.turns, report.total.total_tokens), (3, 196), "{report:?}");
    assert!(close(usd(&report.total), 0.45), "{report:?}");
    let per: Vec<(&str, u64)> =
        report.groups.iter().map(|g| (g.key.as_str(), g.totals.total_tokens)).collect();
    assert_eq!(per, vec![(one.as_str(), 185), (two.as_str(), 11)]);
    let by_profile = ok("usage.query", query(Some(UsageGroupBy::Profile))).await;
    assert_eq!(by_profile.groups.len(), 1);
    assert_eq!((by_profile.groups[0].key.as_str(), by_profile.groups[0].totals.turns), ("mock", 3));
    let after = scrape(&daemon, &[]).await;
    let input = "tether_tokens_total{direction=\"input\",profile=\"mock\"}";
    assert_eq!(value(&after, input) - value(&before, input), 160.0);
    let cost = "tether_cost_total{currency=\"USD\",profile=\"mock\"}";
    assert!(close(value(&after, cost) - value(&before, cost), 0.45));
    let (code, out, err) = daemon.cli(&["usage", "--task", &task, "--by", "session"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("total\t196 tokens (in 160, out 31, cached 5), 0.4500 USD, 3 turn(s)"),
        "{out}"
    );
    // A restart: the same totals, read from the turns.
    drop(api);
    daemon.kill().await;
    daemon.restart().await;
    let api = daemon.api().await;
    let again = ok(
        "usage.query",
        api.typed().usage_query(None, Some(task.clone()), None, None, None, None, None),
    )
    .await;
    assert_eq!(again.total, report.total);
    // The agent's cumulative cost goes on from the mark: 0.40 → 0.50 adds 0.10.
    api.ask(&one, "/usage 2100 10000 0.50\nfourth").await;
    let status = api.status(&one).await;
    assert!(close(usd(&status.usage.totals), 0.50), "{:?}", status.usage);
    let (code, out, _) = daemon.cli(&["sessions", "show", &one]).await;
    assert_eq!(code, 0);
    assert!(out.contains("usage (turns): 185 tokens"), "{out}");
}

/// A session's token budget: a warning event as it passes 80 %, a pause (`budget`, with a
/// snapshot) at 100 %, prompts and resumes refused with `budget_exceeded` until it is
/// raised; then it goes on. A task's cost budget pauses the session that used it up.
#[tokio::test]
async fn a_budget_warns_pauses_and_lets_go_once_raised() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("b")).await;
    let task = api.status(&session).await.task_id;
    let set = api.typed().budget_set(Some(session.clone()), None, Some(200), None, None);
    let set = ok("budget.set", set).await.expect("a budget");
    assert_eq!((set.scope, set.used_tokens, set.percent), (BudgetScope::Session, 0, 0));
    let mut events = api.subscribe_at_end(&session).await;
    api.ask(&session, "/tokens 100 60\nmost of it").await;
    let seen = until(&mut events, turn_ended).await;
    let seen =
        [seen, until(&mut events, |e| matches!(e.kind, EventKind::BudgetWarning { .. })).await]
            .concat();
    let Some(EventKind::BudgetWarning { budget }) = seen.last().map(|e| &e.kind) else {
        unreachable!()
    };
    assert_eq!((budget.used_tokens, budget.percent), (160, 80), "{budget:?}");
    assert_eq!(api.status(&session).await.state, SessionState::WaitingForInput);
    api.ask(&session, "/tokens 30 20\nthe rest").await;
    let seen = until(&mut events, |e| paused_by(e, SnapshotTrigger::Budget)).await;
    assert!(
        seen.iter().any(|e| matches!(
            &e.kind,
            EventKind::SnapshotTaken { trigger: SnapshotTrigger::Budget, .. }
        )),
        "{seen:?}"
    );
    let status = api.status(&session).await;
    assert_eq!((status.state, status.resume_reason.as_str()), (SessionState::Paused, "budget"));
    assert_eq!(status.usage.budgets[0].percent, 105, "{:?}", status.usage);
    let prompt =
        refused("prompt over budget", api.typed().session_prompt(session.clone(), "more".into()))
            .await;
    assert_eq!(prompt.kind, ErrorKind::BudgetExceeded, "{prompt:?}");
    assert!(prompt.message.contains("budget.set"), "{prompt:?}");
    let resume =
        refused("resume over budget", api.typed().session_resume(session.clone(), None)).await;
    assert_eq!(resume.kind, ErrorKind::BudgetExceeded, "{resume:?}");
    let raised = api.typed().budget_set(Some(session.clone()), None, Some(1000), None, None);
    assert_eq!(ok("budget.set", raised).await.unwrap().percent, 21);
    let reply = api.ask(&session, "go on").await;
    assert!(reply.contains("remembered 4 earlier messages"), "resumed natively: {reply}");
    // The task's cost budget, over both of its sessions' turns.
    let set = api.typed().budget_set(None, Some(task.clone()), None, Some(0.30), None);
    assert_eq!(ok("budget.set", set).await.unwrap().scope, BudgetScope::Task);
    api.ask(&session, "/usage 10 100 0.35\ncostly").await;
    until(&mut events, |e| paused_by(e, SnapshotTrigger::Budget)).await;
    let (code, _, err) = daemon.cli(&["prompt", &session, "again"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("budget_exceeded") && err.contains("its task's budget"), "{err}");
}

/// A new session's first prompt spends its task's budget too: a create with a prompt (or a
/// task description, its first prompt) over the task's budget is refused with
/// `budget_exceeded`, as a prompt is, and stores nothing; one without a first prompt is
/// made.
#[tokio::test]
async fn a_create_with_a_prompt_over_its_task_budget_is_refused() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("first")).await;
    let task = api.status(&session).await.task_id;
    api.ask(&session, "/tokens 100 200\nspent").await;
    let set = api.typed().budget_set(None, Some(task.clone()), Some(250), None, None);
    assert_eq!(ok("budget.set", set).await.expect("a budget").percent, 120);
    let create = Create {
        prompt: Some("more".into()),
        ..Create::new(&task, "mock", Some(&daemon.workspace("second")))
    };
    let refusal = refused("create over budget", create.send(api.typed())).await;
    assert_eq!(refusal.kind, ErrorKind::BudgetExceeded, "{refusal:?}");
    assert!(refusal.message.contains("its task's budget"), "{refusal:?}");
    let sessions =
        ok("task.session.list", api.typed().session_list(Some(task.clone()), None, None)).await;
    assert_eq!(sessions.len(), 1, "nothing stored: {sessions:?}");
    let described =
        ok("task.create", api.typed().task_create("described".into(), Some("do the work".into())))
            .await;
    let set = api.typed().budget_set(None, Some(described.id.clone()), Some(0), None, None);
    ok("budget.set", set).await;
    let create = Create::new(&described.id, "mock", Some(&daemon.workspace("third")));
    let refusal = refused("create with a description over budget", create.send(api.typed())).await;
    assert_eq!(refusal.kind, ErrorKind::BudgetExceeded, "{refusal:?}");
    // Without a first prompt nothing is spent: made.
    let create = Create::new(&task, "mock", Some(&daemon.workspace("fourth")));
    ok("create without a prompt", create.send(api.typed())).await;
}

/// `session.max_turns` pauses the session at the end of its last allowed turn, and
/// `session.max_duration_secs` at the first turn boundary past it.
#[tokio::test]
async fn max_turns_and_max_duration_pause_at_the_turn_boundary() {
    let turns = "id = \"two-turns\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n[session]\nmax_turns = 2\n";
    let duration = "id = \"one-second\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n[session]\nmax_duration_secs = 1\n";
    let daemon = Daemon::start_with_profiles(
        &[],
        &[("two-turns.toml", turns), ("one-second.toml", duration)],
    )
    .await;
    let api = daemon.api().await;
    let session = api.ready_session("two-turns", &daemon.workspace("t")).await;
    let mut events = api.subscribe_at_end(&session).await;
    api.ask(&session, "one").await;
    // Not paused after its first turn: it settles waiting for input (the `state` event
    // follows the turn's end).
    let first = until(&mut events, |e| is_state(e, SessionState::WaitingForInput)).await;
    api.ask(&session, "two").await;
    let seen = until(&mut events, |e| paused_by(e, SnapshotTrigger::MaxTurns)).await;
    let ends = first.iter().chain(&seen).filter(|e| turn_ended(e)).count();
    assert_eq!(ends, 2, "{first:?} {seen:?}");
    assert_eq!(api.status(&session).await.resume_reason, "max_turns");
    let session = api.ready_session("one-second", &daemon.workspace("d")).await;
    let mut events = api.subscribe_at_end(&session).await;
    // The turn ends more than a second after the session was created.
    api.ask(&session, "/sleep 1100\nslow").await;
    until(&mut events, |e| paused_by(e, SnapshotTrigger::MaxDuration)).await;
    let status = api.status(&session).await;
    assert_eq!(
        (status.state, status.resume_reason.as_str()),
        (SessionState::Paused, "max_duration")
    );
}

fn sigkill(pid: u32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
}

/// A turn cut by a crash (supervisor and agent killed while it ran) is `interrupted`;
/// `retry_turn` re-sends its prompt once — two retries at the same time start one turn,
/// a later one is refused, and so is a retry of a completed turn; the agent's own log
/// shows the prompt exactly twice (the cut turn and its retry).
#[tokio::test]
async fn an_interrupted_turn_is_re_sent_once_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("turns.jsonl");
    let profile = format!(
        "id = \"logged\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{{home}}/.mock-agent\", \"--turn-log\", \"{}\"]\nprotocol = \"acp\"\n",
        log.display()
    );
    let mut daemon = Daemon::start_with_profiles(&[], &[("logged.toml", &profile)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("logged", &daemon.workspace("r")).await;
    api.ask(&session, "done already").await;
    let completed =
        refused("retry of a completed turn", api.typed().session_retry_turn(session.clone(), None))
            .await;
    assert_eq!(completed.kind, ErrorKind::Conflict, "{completed:?}");
    let mut events = api.subscribe_at_end(&session).await;
    let cut = api.prompt(&session, "/permission\nretry me").await.unwrap();
    until_permission_request(&mut events).await;
    let sidecars = daemon.sidecars(&session);
    drop(events);
    drop(api);
    daemon.kill().await;
    for pid in &sidecars {
        sigkill(*pid);
    }
    for pid in sidecars {
        if let Ok(pidfd) = agentctl::process::PidFd::open(pid) {
            within("the sidecar to die", pidfd.exited()).await.unwrap();
        }
    }
    daemon.restart().await;
    let api = daemon.api().await;
    let timeline = ok("timeline", api.typed().session_timeline(session.clone(), None)).await;
    let turn = timeline.turns.iter().find(|t| t.turn_id == cut).expect("the cut turn");
    assert_eq!(turn.state, TurnState::Interrupted, "{turn:?}");
    let mut events = api.subscribe_at_end(&session).await;
    let (first, second) = tokio::join!(
        api.typed().session_retry_turn(session.clone(), Some(cut.clone())),
        api.typed().session_retry_turn(session.clone(), None),
    );
    let (started, other) = match (first, second) {
        (Ok(started), Err(other)) | (Err(other), Ok(started)) => (started, other),
        both => panic!("one retry starts a turn, the other is refused: {both:?}"),
    };
    let other = tether_tests::daemon::ApiError::of("retry", other);
    assert_eq!(other.kind, ErrorKind::Conflict, "{other:?}");
    let (_, request_id, _) = until_permission_request(&mut events).await;
    let answer = api.typed().permission_respond(session.clone(), request_id, Some("allow".into()));
    ok("permission.respond", answer).await;
    let seen = until(&mut events, turn_ended).await;
    assert!(
        matches!(&seen.last().unwrap().kind, EventKind::TurnEnded { turn_id, state: TurnState::Completed, .. } if Some(turn_id) == started.turn_id.as_ref()),
        "{seen:?}"
    );
    let (code, _, err) = daemon.cli(&["retry", &session, "--turn", &cut]).await;
    assert_eq!(code, 5, "refused as a conflict: {err}");
    assert!(err.contains("re-sent already"), "{err}");
    let text = std::fs::read_to_string(&log).unwrap();
    let sent = text.lines().filter(|line| line.contains("retry me")).count();
    assert_eq!(sent, 2, "the cut turn and its one retry: {text}");
}

/// An agent that reports running totals in `PromptResponse.usage` (the profile says
/// `session.usage_totals = "cumulative"`, as the built-in copilot does): each turn records
/// its increase over the agent's previous report, a report below it (a new count) counts
/// whole, and the mark survives a restart — so a budget counts what was used, not the
/// sum of running totals.
#[tokio::test]
async fn running_token_totals_count_each_turns_increase() {
    let running = "id = \"running\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{home}/.mock-agent\"]\nprotocol = \"acp\"\n[session]\nagent_state_dirs = [\".mock-agent\"]\nusage_totals = \"cumulative\"\n";
    let mut daemon = Daemon::start_with_profiles(&[], &[("running.toml", running)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("running", &daemon.workspace("r")).await;
    let set = api.typed().budget_set(Some(session.clone()), None, Some(400), None, None);
    ok("budget.set", set).await;
    api.ask(&session, "/tokens 100 20\none").await;
    api.ask(&session, "/tokens 250 50\ntwo").await;
    let status = api.status(&session).await;
    let totals = &status.usage.totals;
    assert_eq!(
        (totals.input_tokens, totals.output_tokens, totals.total_tokens),
        (250, 50, 300),
        "the second turn added 150 and 30: {totals:?}"
    );
    assert_eq!(status.state, SessionState::WaitingForInput, "300 of 400: {:?}", status.usage);
    assert_eq!(status.usage.budgets[0].percent, 75, "{:?}", status.usage);
    // Smaller than the last report: a new count (a fresh agent session), taken whole.
    api.ask(&session, "/tokens 40 5\nthree").await;
    drop(api);
    daemon.kill().await;
    daemon.restart().await;
    let api = daemon.api().await;
    api.ask(&session, "/tokens 100 10\nfour").await;
    let report = ok(
        "usage.query",
        api.typed().usage_query(Some(session.clone()), None, None, None, None, None, None),
    )
    .await;
    assert_eq!(
        (report.total.input_tokens, report.total.output_tokens, report.total.total_tokens),
        (350, 60, 410),
        "{report:?}"
    );
    let (code, out, err) = daemon.cli(&["usage", "--session", &session]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("total\t410 tokens (in 350, out 60, cached 0)"), "{out}");
}

/// Tokens an agent never reported are unknown, not zero: `usage`, `status`, `sessions
/// show` (the session and each turn) and the JSON say so; a token budget says it cannot
/// be checked (a notice at the first turn that reported none, and wherever it is shown).
#[tokio::test]
async fn tokens_an_agent_never_reported_read_not_reported() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("n")).await;
    let set = api.typed().budget_set(Some(session.clone()), None, Some(1000), None, None);
    ok("budget.set", set).await;
    let mut events = api.subscribe_at_end(&session).await;
    api.ask(&session, "no tokens said").await;
    let unchecked = |e: &SessionEvent| matches!(&e.kind, EventKind::Notice { message } if message.contains("cannot be checked"));
    until(&mut events, unchecked).await;
    let (code, out, err) = daemon.cli(&["status", &session, "--json"]).await;
    assert_eq!(code, 0, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["usage"]["turns_with_tokens"], 0, "{out}");
    let status = api.status(&session).await;
    let budget = &status.usage.budgets[0];
    assert!(budget.describe().contains("cannot be checked"), "{}", budget.describe());
    for args in [
        &["usage", "--session", &session][..],
        &["status", &session],
        &["sessions", "show", &session],
        &["budget", "--session", &session, "--tokens", "2000"],
    ] {
        let (code, out, err) = daemon.cli(args).await;
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(
            out.contains("not reported") || out.contains("cannot be checked"),
            "{args:?}: {out}"
        );
        assert!(!out.contains(" 0 tokens") && !out.contains("\t0 tokens"), "{args:?}: {out}");
    }
    let (_, out, _) = daemon.cli(&["sessions", "show", &session]).await;
    let turn = out.lines().find(|line| line.contains("execution ")).unwrap_or_default();
    assert!(turn.contains("tokens not reported"), "the turn's line says so: {out}");
    let (_, out, _) = daemon.cli(&["budget", "--session", &session, "--tokens", "2000"]).await;
    assert!(out.contains("cannot be checked"), "{out}");
}

/// The page shows unknown tokens as not reported, not as nothing or zero.
#[tokio::test]
async fn the_page_shows_unreported_tokens_as_not_reported() {
    let Some(browser) = tether_tests::browser::start("unreported").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("p")).await;
    api.ask(&session, "/usage 10 100 0.25\nno tokens said").await;
    let page = daemon.url.replace("ws://", "http://") + "/";
    browser.open(&format!("{page}#/session/{session}")).await;
    browser.wait_text("#connection", "connected").await;
    browser.wait_text("#totals", "tokens not reported · 0.25 USD").await;
}
