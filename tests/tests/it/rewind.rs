//! Rewinds end to end, with real daemons and mock-agent logging what it was sent
//! (`--turn-log`): the later turns stay in the history and the timeline marked rewound and
//! leave the agent's context (a fresh agent session, the turns kept injected); with
//! `restore_workspace` the workspace returns to its state at the turn (its uncommitted
//! files too, from the turn's checkpoint) and what it had is on `refs/tether/rewound/...`
//! (outside git: in a checkpoint of the session's own); a restore whose state is unknown
//! is refused and changes nothing; the CLI says what it did.

use std::path::{Path, PathBuf};

use protocol::api::{ApiClient, EntryType, EventKind, RewindResult};
use protocol::errors::ErrorKind;
use serde_json::json;
use tether_tests::daemon::{Api, Daemon, ok, until};
use tether_tests::git;

/// A daemon whose `plain` profile logs the prompts it is sent to `root/turns.jsonl`.
async fn daemon() -> (Daemon, PathBuf) {
    daemon_with_config("").await
}

/// [`daemon`], with `config` (TOML) as its `config.toml`.
async fn daemon_with_config(config: &str) -> (Daemon, PathBuf) {
    let dir = tempfile::tempdir().unwrap().keep();
    let log = dir.join("turns.jsonl");
    let profile = format!(
        "id = \"plain\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{{home}}/.mock-agent\", \"--turn-log\", \"{}\"]\nprotocol = \"acp\"\n[session]\nagent_state_dirs = [\".mock-agent\"]\n",
        log.display()
    );
    let (daemon, ()) =
        Daemon::start_prepared(&[], &[("plain.toml", profile.as_str())], &[], |root| {
            std::fs::create_dir_all(root.join("tether")).unwrap();
            std::fs::write(root.join("tether/config.toml"), config).unwrap();
        })
        .await;
    (daemon, log)
}

/// The last prompt an agent was sent.
fn last_sent(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let line = text.lines().last().expect("a prompt was sent");
    let entry: serde_json::Value = serde_json::from_str(line).expect("a turn-log line");
    entry["prompt"].as_str().unwrap().to_owned()
}

async fn turn_ids(api: &Api, session: &str) -> Vec<(String, bool)> {
    let timeline = ok("timeline", api.typed().session_timeline(session.to_owned(), None)).await;
    timeline.turns.into_iter().map(|turn| (turn.turn_id, turn.rewound)).collect()
}

async fn rewind(api: &Api, session: &str, turn: &str, restore: bool) -> RewindResult {
    let call = api.typed().session_rewind(session.to_owned(), turn.to_owned(), Some(restore));
    ok("task.session.rewind", call).await
}

#[tokio::test]
async fn a_rewound_conversation_keeps_its_turns_marked_and_the_agent_starts_from_the_turn() {
    let (daemon, log) = daemon().await;
    let api = daemon.api().await;
    let session = api.ready_session("plain", &daemon.workspace("r")).await;
    for words in ["first words", "second words", "third words"] {
        api.ask(&session, words).await;
    }
    let turns: Vec<String> = turn_ids(&api, &session).await.into_iter().map(|(id, _)| id).collect();
    let mut events = api.subscribe_at_end(&session).await;
    let rewound = rewind(&api, &session, &turns[0], false).await;
    assert_eq!(rewound.rewound, turns[1..], "{rewound:?}");
    assert!(rewound.workspace.is_none());
    let seen = until(&mut events, |event| matches!(event.kind, EventKind::Rewound { .. })).await;
    assert!(
        seen.iter().any(|event| matches!(&event.kind, EventKind::Rewound { turn_id, rewound, .. } if *turn_id == turns[0] && rewound.len() == 2)),
        "{seen:#?}"
    );
    // The agent was stopped: its own session held the turns rewound.
    let status = api.status(&session).await;
    assert!(!status.is_agent_running, "{status:?}");
    // Kept, marked: the timeline and the history.
    assert_eq!(
        turn_ids(&api, &session).await,
        [(turns[0].clone(), false), (turns[1].clone(), true), (turns[2].clone(), true)]
    );
    let history = api.history(&session).await;
    let marks: Vec<(String, bool)> = history
        .iter()
        .filter(|entry| entry.kind == EntryType::UserMessage)
        .map(|entry| (entry.content.clone(), entry.rewound))
        .collect();
    assert_eq!(
        marks,
        [
            ("first words".into(), false),
            ("second words".into(), true),
            ("third words".into(), true)
        ]
    );
    // The next prompt: a fresh agent session, given the first turn alone.
    let reply = api.ask(&session, "fourth words").await;
    assert!(reply.contains("remembered 0 earlier messages"), "a fresh agent session: {reply}");
    let sent = last_sent(&log);
    assert!(sent.contains("first words") && sent.contains("=== REWOUND ==="), "{sent}");
    assert!(!sent.contains("second words") && !sent.contains("third words"), "{sent}");
    assert!(sent.contains("=== CURRENT REQUEST ===\nfourth words"), "{sent}");
    // And on from there, natively: nothing injected any more.
    let reply = api.ask(&session, "fifth words").await;
    assert!(reply.contains("remembered 2 earlier messages"), "{reply}");
    assert_eq!(last_sent(&log), "fifth words");
    // A rewound turn is not a place to rewind to; the CLI says what a rewind did.
    let refused = api
        .call_raw("task.session.rewind", json!({"session_id": session, "turn_id": turns[2]}))
        .await
        .expect_err("a rewound turn");
    assert_eq!(refused.kind, ErrorKind::InvalidState, "{refused:?}");
    let (code, out, err) = daemon.cli(&["rewind", &session, &turns[0]]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("rewound to turn") && out.contains("2 turn(s)"), "{out}");
}

/// Writes `text` to `name` in the workspace through the agent, and waits for the turn's
/// snapshot.
async fn write_turn(
    api: &Api,
    session: &str,
    events: &mut jsonrpsee::core::client::Subscription<protocol::api::SessionEvent>,
    path: &Path,
    text: &str,
) {
    api.ask(session, &format!("/write {} {text}", path.display())).await;
    until(events, |event| matches!(event.kind, EventKind::SnapshotTaken { .. })).await;
}

#[tokio::test]
async fn a_rewind_restores_the_workspace_and_saves_what_it_had_on_a_ref() {
    let (daemon, _log) = daemon().await;
    let api = daemon.api().await;
    let repo = daemon.workspace("repo");
    git(&repo, &["init", "-q", "-b", "main"]).await;
    std::fs::write(repo.join("README"), "the project\n").unwrap();
    git(&repo, &["add", "."]).await;
    git(&repo, &["commit", "-q", "-m", "start"]).await;
    let session = api.ready_session("plain", &repo).await;
    let mut events = api.subscribe(&session, 0).await;
    write_turn(&api, &session, &mut events, &repo.join("a.txt"), "one").await;
    write_turn(&api, &session, &mut events, &repo.join("b.txt"), "two").await;
    std::fs::write(repo.join("README"), "edited by hand\n").unwrap();
    let turns: Vec<String> = turn_ids(&api, &session).await.into_iter().map(|(id, _)| id).collect();
    let rewound = rewind(&api, &session, &turns[0], true).await;
    let restored = rewound.workspace.clone().expect("the workspace was restored");
    assert!(restored.checkpoint.is_some(), "a.txt was not committed: {rewound:?}");
    assert!(restored.saved_ref.starts_with(&format!("refs/tether/rewound/{session}/")));
    // As the first turn left it: a.txt, no b.txt, the README as committed.
    assert_eq!(std::fs::read_to_string(repo.join("a.txt")).unwrap(), "one");
    assert!(!repo.join("b.txt").exists(), "the second turn's file is gone");
    assert_eq!(std::fs::read_to_string(repo.join("README")).unwrap(), "the project\n");
    // What it had is on the ref.
    let saved = git(&repo, &["show", &format!("{}:b.txt", restored.saved_ref)]).await;
    assert_eq!(saved.trim(), "two");
    let readme = git(&repo, &["show", &format!("{}:README", restored.saved_ref)]).await;
    assert_eq!(readme.trim(), "edited by hand");
}

#[tokio::test]
async fn a_workspace_outside_git_is_rewound_from_its_checkpoints() {
    let (daemon, _log) = daemon().await;
    let api = daemon.api().await;
    let dir = daemon.workspace("outside-git");
    let session = api.ready_session("plain", &dir).await;
    let mut events = api.subscribe(&session, 0).await;
    write_turn(&api, &session, &mut events, &dir.join("a.txt"), "one").await;
    write_turn(&api, &session, &mut events, &dir.join("sub/b.txt"), "two").await;
    std::fs::write(dir.join("a.txt"), "edited by hand").unwrap();
    let turns: Vec<String> = turn_ids(&api, &session).await.into_iter().map(|(id, _)| id).collect();
    let rewound = rewind(&api, &session, &turns[0], true).await;
    let restored = rewound.workspace.clone().expect("the workspace was restored");
    // As the first turn left it.
    assert_eq!(std::fs::read_to_string(dir.join("a.txt")).unwrap(), "one");
    assert!(!dir.join("sub/b.txt").exists(), "the second turn's file is gone");
    // What it held is in a checkpoint of the session's own (the one taken as its agent
    // was parked for the rewind, or one taken for the restore), never in the workspace.
    let prefix = format!("refs/tether/sessions/{session}/");
    assert!(restored.saved_ref.starts_with(&prefix), "{restored:?}");
    let listed = ok("list", api.typed().session_checkpoint_list(session.clone())).await;
    let saved =
        listed.checkpoints.iter().find(|c| c.git_ref == restored.saved_ref).expect("listed");
    assert_eq!(saved.commit, restored.saved_commit);
    let back = daemon.workspace("before-the-rewind");
    let into = back.display().to_string();
    ok(
        "restore",
        api.typed().session_checkpoint_restore(session.clone(), Some(saved.seq), None, into),
    )
    .await;
    assert_eq!(std::fs::read_to_string(back.join("a.txt")).unwrap(), "edited by hand");
    assert_eq!(std::fs::read_to_string(back.join("sub/b.txt")).unwrap(), "two");
}

#[tokio::test]
async fn a_restore_of_an_unknown_state_is_refused_and_changes_nothing() {
    // No checkpoint is ever taken (every workspace is over the limit), and it is no
    // repository: its state at a turn is not known.
    let (daemon, _log) = daemon_with_config("[checkpoints]\nmax_workspace_bytes = 1\n").await;
    let api = daemon.api().await;
    let dir = daemon.workspace("plain-dir");
    std::fs::write(dir.join("notes.txt"), "more than a byte").unwrap();
    let session = api.ready_session("plain", &dir).await;
    api.ask(&session, "first words").await;
    api.ask(&session, "second words").await;
    let turns: Vec<String> = turn_ids(&api, &session).await.into_iter().map(|(id, _)| id).collect();
    let refused = api
        .call_raw(
            "task.session.rewind",
            json!({"session_id": session, "turn_id": turns[0], "restore_workspace": true}),
        )
        .await
        .expect_err("not a git repository");
    assert_eq!(refused.kind, ErrorKind::InvalidState, "{refused:?}");
    assert!(refused.message.contains("not in a git repository"), "{refused:?}");
    assert!(turn_ids(&api, &session).await.iter().all(|(_, rewound)| !rewound));
    assert_eq!(std::fs::read_to_string(dir.join("notes.txt")).unwrap(), "more than a byte");
    // The conversation goes on as it was.
    let reply = api.ask(&session, "third words").await;
    assert!(reply.contains("remembered 4 earlier messages"), "{reply}");
}

/// A rewind of a session at rest (paused, the daemon restarted since: no actor runs it) is
/// announced on its stream as one made by its actor is, so a page following it redraws.
#[tokio::test]
async fn a_rewind_at_rest_is_announced_on_the_sessions_stream() {
    let (mut daemon, _log) = daemon().await;
    let api = daemon.api().await;
    let session = api.ready_session("plain", &daemon.workspace("rest")).await;
    for words in ["first words", "second words"] {
        api.ask(&session, words).await;
    }
    ok("pause", api.typed().session_pause(session.clone(), None, None)).await;
    drop(api);
    daemon.terminate().await;
    daemon.restart().await;
    let api = daemon.api().await;
    let turns: Vec<String> = turn_ids(&api, &session).await.into_iter().map(|(id, _)| id).collect();
    let mut events = api.subscribe_at_end(&session).await;
    let rewound = rewind(&api, &session, &turns[0], false).await;
    assert_eq!(rewound.rewound, turns[1..], "{rewound:?}");
    let seen = until(&mut events, |event| matches!(event.kind, EventKind::Rewound { .. })).await;
    let announced = seen.last().map(|event| &event.kind);
    assert!(
        matches!(announced, Some(EventKind::Rewound { turn_id, rewound, .. }) if *turn_id == turns[0] && *rewound == turns[1..]),
        "{seen:#?}"
    );
    // Said once: the stream read again from the start holds it once.
    let status = api.status(&session).await;
    let mut all = api.subscribe(&session, 0).await;
    let replayed =
        tether_tests::daemon::until(&mut all, |event| event.seq >= status.last_event_seq).await;
    let count = replayed.iter().filter(|e| matches!(e.kind, EventKind::Rewound { .. })).count();
    assert_eq!(count, 1, "{replayed:#?}");
}
