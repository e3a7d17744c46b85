//! Forks end to end, with real daemons and mock-agent logging what it was sent
//! (`--turn-log`): a fork at an earlier turn gets the history up to that turn injected
//! before its first prompt and lives on apart from its original; a fork at the newest turn
//! of an agent that advertises `session/fork` is forked natively; a worktree session's fork
//! gets a branch of its own from the commit the workspace had at that turn; the timelines
//! and statuses name each other; the CLI says what it made.

use std::path::{Path, PathBuf};

use protocol::api::{ApiClient, EntryType, EventKind, ForkContext, ResumeOutcome};
use tether_tests::daemon::{Api, Create, Daemon, ok, until};
use tether_tests::git;

/// A daemon with two profiles logging to `root/turns.jsonl`: `plain` (no fork) and
/// `forking` (`--fork`); both keep their sessions, so a resume is native.
async fn daemon() -> (Daemon, PathBuf) {
    daemon_with(&[]).await
}

/// [`daemon`] with `env`.
async fn daemon_with(env: &[(&str, &str)]) -> (Daemon, PathBuf) {
    let dir = tempfile::tempdir().unwrap().keep();
    let log = dir.join("turns.jsonl");
    let profile = |id: &str, extra: &str| {
        format!(
            "id = \"{id}\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{{home}}/.mock-agent\", \"--turn-log\", \"{}\"{extra}]\nprotocol = \"acp\"\n[session]\nagent_state_dirs = [\".mock-agent\"]\n",
            log.display()
        )
    };
    let (plain, forking) = (profile("plain", ""), profile("forking", ", \"--fork\""));
    let profiles = [("plain.toml", plain.as_str()), ("forking.toml", forking.as_str())];
    let daemon = Daemon::start_with_env(&[], &profiles, env).await;
    (daemon, log)
}

/// The prompts the agents were sent, in order, each with its session.
fn sent(log: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(|line| {
            let entry: serde_json::Value = serde_json::from_str(line).expect("a turn-log line");
            (
                entry["session"].as_str().unwrap().to_owned(),
                entry["prompt"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Two turns of `session`; their ids.
async fn two_turns(api: &Api, session: &str) -> (String, String) {
    api.ask(session, "first words").await;
    let first = api.status(session).await;
    api.ask(session, "second words").await;
    let timeline = ok("timeline", api.typed().session_timeline(session.to_owned(), None)).await;
    let ids: Vec<String> = timeline.turns.iter().map(|turn| turn.turn_id.clone()).collect();
    assert_eq!(ids.len(), 2, "{timeline:?} {first:?}");
    (ids[0].clone(), ids[1].clone())
}

async fn fork(api: &Api, session: &str, turn: Option<&str>) -> protocol::api::ForkResult {
    ok("task.session.fork", api.typed().session_fork(session.to_owned(), turn.map(str::to_owned)))
        .await
}

#[tokio::test]
async fn a_fork_at_an_earlier_turn_gets_that_history_and_lives_on_apart() {
    let (daemon, log) = daemon().await;
    let api = daemon.api().await;
    let session = api.ready_session("plain", &daemon.workspace("f")).await;
    let (first, _) = two_turns(&api, &session).await;
    let forked = fork(&api, &session, Some(&first)).await;
    assert_eq!(forked.context, ForkContext::History, "{forked:?}");
    assert_eq!(
        (forked.forked_from.as_str(), forked.turn_id.as_str()),
        (session.as_str(), first.as_str())
    );
    assert!(forked.notes.iter().any(|note| note.contains("shares its workspace")), "{forked:?}");
    // At rest until prompted: no agent runs for it.
    let status = api.status(&forked.session_id).await;
    assert!(!status.is_agent_running && status.needs_resume, "{status:?}");
    let link = status.forked_from.expect("the fork names its original");
    assert_eq!(
        (link.session_id.as_str(), link.turn_id.as_str()),
        (session.as_str(), first.as_str())
    );
    // Its history is the original's through the first turn.
    let history = api.history(&forked.session_id).await;
    let users: Vec<_> = history
        .iter()
        .filter(|e| e.kind == EntryType::UserMessage)
        .map(|e| e.content.clone())
        .collect();
    assert_eq!(users, ["first words"], "{history:#?}");
    // Its first prompt carries that history (and not the second turn) to a fresh agent.
    let reply = api.ask(&forked.session_id, "third words").await;
    assert!(reply.contains("remembered 0 earlier messages"), "a fresh agent session: {reply}");
    let (fork_session, fork_prompt) = sent(&log).pop().expect("the fork's prompt");
    assert_ne!(fork_session, "", "{fork_prompt}");
    assert!(fork_prompt.contains("first words"), "{fork_prompt}");
    assert!(!fork_prompt.contains("second words"), "{fork_prompt}");
    assert!(fork_prompt.contains("=== CURRENT REQUEST ===\nthird words"), "{fork_prompt}");
    let resumed = api.status(&forked.session_id).await;
    assert!(resumed.is_agent_running, "{resumed:?}");
    // The original goes on with its own context; each timeline names the other.
    let reply = api.ask(&session, "fourth words").await;
    assert!(reply.contains("remembered 4 earlier messages"), "{reply}");
    let original = ok("timeline", api.typed().session_timeline(session.clone(), None)).await;
    assert_eq!(original.forks.len(), 1, "{original:?}");
    assert_eq!(original.forks[0].session_id, forked.session_id);
    let theirs =
        ok("timeline", api.typed().session_timeline(forked.session_id.clone(), None)).await;
    assert_eq!(theirs.forked_from.map(|link| link.session_id), Some(session.clone()));
}

#[tokio::test]
async fn a_fork_at_the_newest_turn_of_an_agent_that_forks_is_native() {
    let (daemon, log) = daemon().await;
    let api = daemon.api().await;
    let session = api.ready_session("forking", &daemon.workspace("n")).await;
    two_turns(&api, &session).await;
    let forked = fork(&api, &session, None).await;
    assert_eq!(forked.context, ForkContext::Native, "{forked:?}");
    let mut events = api.subscribe(&forked.session_id, 0).await;
    let reply = api.ask(&forked.session_id, "third words").await;
    // The agent's own copy of the conversation: two turns, four messages; nothing injected.
    assert!(reply.contains("remembered 4 earlier messages"), "{reply}");
    assert!(
        sent(&log).last().is_some_and(|(_, prompt)| prompt == "third words"),
        "{:?}",
        sent(&log)
    );
    let seen =
        until(&mut events, |event| matches!(event.kind, EventKind::ResumeOutcome { .. })).await;
    let outcome = seen.iter().find_map(|event| match &event.kind {
        EventKind::ResumeOutcome { outcome, .. } => Some(*outcome),
        _ => None,
    });
    assert_eq!(outcome, Some(ResumeOutcome::NativeFork), "{seen:#?}");
    // The original's agent session did not take the fork's turn.
    let reply = api.ask(&session, "fourth words").await;
    assert!(reply.contains("remembered 4 earlier messages"), "{reply}");
}

/// A worktree session's fork at a turn: a branch of its own from the commit the workspace
/// had then, not the one made after, and the files as the turn left them.
#[tokio::test]
async fn a_worktree_fork_branches_from_the_commit_at_its_turn() {
    let (daemon, _log) = daemon().await;
    let api = daemon.api().await;
    let repo = daemon.workspace("repo");
    git(&repo, &["init", "-q", "-b", "main"]).await;
    std::fs::write(repo.join("README"), "the project\n").unwrap();
    git(&repo, &["add", "."]).await;
    git(&repo, &["commit", "-q", "-m", "start"]).await;
    let task = ok("task.create", api.typed().task_create("forked work".into(), None)).await.id;
    let create = Create { worktree: Some(true), ..Create::new(&task, "plain", Some(&repo)) };
    let session = create.send(api.typed()).await.expect("created").id;
    let mut events = api.subscribe(&session, 0).await;
    tether_tests::daemon::settled(&mut events).await;
    let status = api.status(&session).await;
    let worktree = PathBuf::from(status.worktree_path.clone().unwrap());
    // A turn, its snapshot, then a commit; a second turn, its snapshot, another commit.
    let mut commits = Vec::new();
    // The second turn leaves a file it wrote uncommitted.
    for n in 1..=2 {
        let draft = format!("/write {} unsaved", worktree.join("draft.txt").display());
        api.ask(&session, &if n == 2 { draft } else { format!("turn {n}") }).await;
        until(&mut events, |event| matches!(event.kind, EventKind::SnapshotTaken { .. })).await;
        commits.push(git(&worktree, &["rev-parse", "HEAD"]).await.trim().to_owned());
        std::fs::write(worktree.join(format!("after-{n}")), "later\n").unwrap();
        git(&worktree, &["add", "."]).await;
        git(&worktree, &["commit", "-q", "-m", &format!("after turn {n}")]).await;
    }
    let timeline = ok("timeline", api.typed().session_timeline(session.clone(), None)).await;
    let second = timeline.turns[1].turn_id.clone();
    let forked = fork(&api, &session, Some(&second)).await;
    assert_eq!(forked.base_commit.as_deref(), Some(commits[1].as_str()), "{forked:?}");
    let branch = forked.branch.clone().expect("a branch of its own");
    assert_ne!(Some(&branch), status.worktree_branch.as_ref());
    let fork_tree = PathBuf::from(&forked.workspace_path);
    assert_eq!(git(&fork_tree, &["rev-parse", "HEAD"]).await.trim(), commits[1]);
    assert!(fork_tree.join("after-1").exists() && !fork_tree.join("after-2").exists());
    // And the files as the turn left them, from its checkpoint: its uncommitted one too.
    assert_eq!(std::fs::read_to_string(fork_tree.join("draft.txt")).unwrap(), "unsaved");
    assert_eq!(git(&fork_tree, &["status", "--porcelain"]).await.trim(), "?? draft.txt");
    assert!(forked.notes.iter().any(|note| note.contains("from its checkpoint")), "{forked:?}");
    // The CLI says where a fork is and what it holds.
    let (code, out, err) =
        daemon.cli(&["fork", &session, "--turn", &timeline.turns[0].turn_id]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("forked") && out.contains(&commits[0][..12]), "{out}");
}

/// Killed after the fork's history was written and before its row was stored, the daemon
/// leaves no half-made fork: the restart removes its files, and forking again works.
#[tokio::test]
async fn a_fork_cut_short_by_a_kill_leaves_nothing_and_can_be_made_again() {
    let (mut daemon, _log) = daemon_with(&[("TETHER_FAULT", "fork.history_written")]).await;
    let api = daemon.api().await;
    let session = api.ready_session("plain", &daemon.workspace("k")).await;
    two_turns(&api, &session).await;
    let cut = api.typed().session_fork(session.clone(), None).await;
    assert!(cut.is_err(), "the daemon died before answering: {cut:?}");
    drop(api);
    daemon.wait_exit().await;
    daemon.restart_with_env(&[]).await;
    let api = daemon.api().await;
    let sessions = ok("list", api.typed().session_list(None, None, None)).await;
    assert_eq!(sessions.len(), 1, "no half-made fork: {sessions:?}");
    let dirs = std::fs::read_dir(daemon.root.path().join("tether/sessions")).unwrap().count();
    assert_eq!(dirs, 1, "its files were removed at the restart");
    let forked = fork(&api, &session, None).await;
    let reply = api.ask(&forked.session_id, "after the kill").await;
    assert!(
        reply.contains("you said: after the kill") || reply.contains("CURRENT REQUEST"),
        "{reply}"
    );
}

/// A fork goes on with the model and mode chosen for its original: its agent starts with
/// its defaults, and the choices are set before its first prompt goes out.
#[tokio::test]
async fn a_fork_keeps_the_model_and_mode_chosen_for_its_original() {
    let (daemon, _log) = daemon().await;
    let api = daemon.api().await;
    let session = api.ready_session("plain", &daemon.workspace("chosen")).await;
    let model = api.typed().session_set_config_option(
        session.clone(),
        "model".into(),
        serde_json::json!("mock-large"),
    );
    ok("set_config_option", model).await;
    ok("set_mode", api.typed().session_set_mode(session.clone(), Some("code".into()))).await;
    assert_eq!(api.ask(&session, "/settings").await, "model=mock-large mode=code");
    let forked = fork(&api, &session, None).await;
    let config =
        ok("config_options", api.typed().session_config_options(forked.session_id.clone())).await;
    assert_eq!(config.chosen["model"], "mock-large", "{config:?}");
    assert_eq!(config.chosen_mode.as_deref(), Some("code"), "{config:?}");
    assert_eq!(api.ask(&forked.session_id, "/settings").await, "model=mock-large mode=code");
}
