//! The rewind's plan (which turns and entries it takes out, what it refuses), what it
//! changes in an injection, and its git on a real repository.

use protocol::api::{EntryType, TurnState};

use super::{Injected, RewindError, git, is_rewound, plan};
use crate::history::HistoryEntry;
use crate::ids::{RewindId, SessionId, TurnId};
use crate::snapshot::tests::{racily_clean_edit, run};
use crate::store::{RewindRow, TurnRow};

fn entry(seq: u64, kind: EntryType, content: &str, message_id: Option<&str>) -> HistoryEntry {
    HistoryEntry {
        wire: protocol::api::HistoryEntry {
            seq,
            at: 0,
            kind,
            role: String::new(),
            content: content.into(),
            tool_name: None,
            tool_call_id: None,
            tool_status: None,
            message_id: message_id.map(str::to_owned),
            plan: None,
            rewound: false,
        },
        agent_seq: None,
        generation: None,
    }
}

fn turn(id: &str, started_at: i64, ended: bool, rewound_by: Option<&str>) -> TurnRow {
    TurnRow {
        id: TurnId::new(id),
        execution_id: "e".into(),
        state: if ended { TurnState::Completed } else { TurnState::Running },
        stop_reason: None,
        error: None,
        started_at,
        ended_at: ended.then_some(started_at + 1),
        total_tokens: 0,
        cost: None,
        retry_of: None,
        rewound_by: rewound_by.map(RewindId::new),
        prompt: None,
        event_seq: None,
    }
}

fn history() -> Vec<HistoryEntry> {
    vec![
        entry(1, EntryType::UserMessage, "first", Some("t1")),
        entry(2, EntryType::AgentMessage, "one", None),
        entry(3, EntryType::UserMessage, "second", Some("t2")),
        entry(4, EntryType::AgentMessage, "two", None),
        entry(5, EntryType::UserMessage, "third", Some("t3")),
        entry(6, EntryType::AgentMessage, "three", None),
    ]
}

#[test]
fn a_rewind_takes_out_the_later_turns_and_their_entries_to_the_end() {
    let turns =
        [turn("t1", 10, true, None), turn("t2", 20, true, None), turn("t3", 30, true, None)];
    let made = plan(&turns, &history(), &TurnId::new("t1")).unwrap();
    assert_eq!(made.rewound, [TurnId::new("t2"), TurnId::new("t3")]);
    assert_eq!(made.seqs, (3, 6));
    let last = plan(&turns, &history(), &TurnId::new("t3")).unwrap();
    assert!(last.rewound.is_empty(), "the last turn: nothing to take out");
    assert!(last.seqs.0 > last.seqs.1, "an empty range: {:?}", last.seqs);
}

#[test]
fn a_rewind_skips_turns_rewound_before_and_refuses_them_and_a_running_turn() {
    // t2 was rewound; t3 followed t1 since.
    let turns =
        [turn("t1", 10, true, None), turn("t2", 20, true, Some("r1")), turn("t3", 30, true, None)];
    let made = plan(&turns, &history(), &TurnId::new("t1")).unwrap();
    assert_eq!(made.rewound, [TurnId::new("t3")]);
    assert_eq!(made.seqs, (5, 6));
    let refused = plan(&turns, &history(), &TurnId::new("t2")).unwrap_err();
    assert!(matches!(refused, RewindError::Refused(_)), "{refused}");
    assert!(matches!(
        plan(&turns, &history(), &TurnId::new("t9")),
        Err(RewindError::NoSuchTurn(_))
    ));
    let running = [turn("t1", 10, true, None), turn("t2", 20, false, None)];
    let refused = plan(&running, &history(), &TurnId::new("t1")).unwrap_err();
    assert!(refused.to_string().contains("t2 is running"), "{refused}");
}

fn rewind_row(seqs: (u64, u64), created_at: i64, restored: bool) -> RewindRow {
    RewindRow {
        id: RewindId::new(format!("r{created_at}")),
        session_id: SessionId::new("s"),
        turn_id: TurnId::new("t1"),
        seqs,
        workspace_restored: restored,
        saved_ref: None,
        created_at,
    }
}

#[test]
fn an_injection_after_a_rewind_leaves_out_its_entries_and_says_so() {
    let rewinds = [rewind_row((3, 6), 100, false)];
    assert!(is_rewound(&rewinds, 3) && is_rewound(&rewinds, 6));
    assert!(!is_rewound(&rewinds, 2) && !is_rewound(&rewinds, 7));
    let injected = Injected::of(&rewinds, Some(90));
    assert!(injected.stale_snapshot, "a snapshot before the rewind tells of rewound turns");
    assert!(injected.note.contains("still holds"), "{}", injected.note);
    assert!(!Injected::of(&rewinds, Some(110)).stale_snapshot);
    assert_eq!(Injected::of(&[], Some(1)), Injected::default());
    let mut text: String = history()
        .into_iter()
        .chain([entry(7, EntryType::UserMessage, "fourth", Some("t4"))])
        .map(|entry| serde_json::to_string(&entry).unwrap() + "\n")
        .collect();
    text.push('\n');
    let built = crate::resume_context::build_after(
        &mut std::io::Cursor::new(text),
        "go",
        10_000,
        (None, &injected.skip),
        (&injected.note, ""),
    )
    .unwrap();
    for kept in ["[USER]: first", "[ASSISTANT]: one", "[USER]: fourth", "=== REWOUND ==="] {
        assert!(built.text.contains(kept), "{kept} in {}", built.text);
    }
    for gone in ["second", "two", "third", "three"] {
        assert!(!built.text.contains(gone), "{gone} in {}", built.text);
    }
    assert_eq!((built.included, built.omitted), (3, 0), "rewound entries are not 'omitted'");
}

#[tokio::test]
async fn a_restore_returns_the_files_of_a_checkpoint_and_saves_what_was_there() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path();
    run(repo, &["init", "-q", "-b", "main"]).await;
    std::fs::write(repo.join("a.txt"), "one\n").unwrap();
    std::fs::write(repo.join(".gitignore"), "target/\n").unwrap();
    run(repo, &["add", "."]).await;
    run(repo, &["commit", "-qm", "first"]).await;
    let head = run(repo, &["rev-parse", "HEAD"]).await;
    // The turn's end: a.txt changed, b.txt new, neither committed.
    std::fs::write(repo.join("a.txt"), "one, edited\n").unwrap();
    std::fs::write(repo.join("b.txt"), "new\n").unwrap();
    let checkpoint = git::checkpoint(repo, "s1").await.unwrap();
    assert_eq!(run(repo, &["rev-parse", "refs/tether/checkpoints/s1"]).await, checkpoint);
    assert_eq!(run(repo, &["status", "--porcelain"]).await, "M a.txt\n?? b.txt");
    // Later turns: a commit, a.txt deleted, c.txt new, an ignored build file.
    run(repo, &["commit", "-qam", "later"]).await;
    std::fs::remove_file(repo.join("a.txt")).unwrap();
    std::fs::write(repo.join("c.txt"), "later\n").unwrap();
    std::fs::create_dir(repo.join("target")).unwrap();
    std::fs::write(repo.join("target/out"), "built\n").unwrap();
    let saved = git::save(repo, "refs/tether/rewound/s1/r1", "before").await.unwrap();
    git::restore(repo, &head, Some(&checkpoint)).await.unwrap();
    assert_eq!(run(repo, &["rev-parse", "HEAD"]).await, head);
    assert_eq!(std::fs::read_to_string(repo.join("a.txt")).unwrap(), "one, edited\n");
    assert_eq!(std::fs::read_to_string(repo.join("b.txt")).unwrap(), "new\n");
    assert!(!repo.join("c.txt").exists(), "a later turn's file is gone from the workspace");
    assert!(repo.join("target/out").exists(), "ignored files are left alone");
    assert_eq!(run(repo, &["diff", "--cached", "--name-only"]).await, "", "nothing staged");
    // What the workspace had is on the ref: c.txt, and a.txt deleted.
    assert_eq!(run(repo, &["rev-parse", "refs/tether/rewound/s1/r1"]).await, saved);
    assert_eq!(run(repo, &["show", &format!("{saved}:c.txt")]).await, "later");
    assert!(run(repo, &["ls-tree", "--name-only", &saved]).await.lines().all(|f| f != "a.txt"));
    assert!(
        run(repo, &["ls-tree", "-r", "--name-only", &saved])
            .await
            .lines()
            .all(|f| f != "target/out")
    );
}

#[tokio::test]
async fn a_save_holds_a_same_size_edit_made_in_the_second_the_index_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path();
    racily_clean_edit(top).await;
    git::save(top, "refs/tether/test", "saved").await.unwrap();
    assert_eq!(run(top, &["show", "refs/tether/test:same.txt"]).await, "new");
}
