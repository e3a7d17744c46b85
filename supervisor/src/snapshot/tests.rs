//! Snapshots, the handoff context and the git state, against real files and a real git
//! repository.

use protocol::api::SnapshotToolCall;

use super::*;

fn turn(n: usize, prompt: &str) -> SnapshotTurn {
    SnapshotTurn {
        turn_id: format!("t{n}"),
        prompt: Some(prompt.into()),
        state: TurnState::Completed,
        stop_reason: Some("end_turn".into()),
        error: None,
        reply: Some(format!("did step {n}")),
        tool_calls: vec![SnapshotToolCall {
            tool_call_id: format!("c{n}"),
            title: "run tests".into(),
            status: "completed".into(),
        }],
        started_at: n as i64,
        ended_at: Some(n as i64 + 1),
    }
}

fn snapshot(turns: Vec<SnapshotTurn>, omitted: usize) -> Snapshot {
    Snapshot {
        snapshot_id: "snap-1".into(),
        session_id: "s".into(),
        trigger: SnapshotTrigger::Exhaustion,
        reason: None,
        taken_at: 0,
        execution_id: None,
        generation: None,
        task: SnapshotTask {
            task_id: "t".into(),
            title: "Port the parser".into(),
            description: "Move the parser to the new crate".into(),
        },
        git: GitState {
            repository: true,
            branch: Some("work".into()),
            start_commit: Some("aaaaaaaaaaaaaaaa".into()),
            head_commit: Some("bbbbbbbbbbbbbbbb".into()),
            commits_since_start: vec!["bbbbbbb move lexer".into()],
            modified_files: vec!["src/lexer.rs".into()],
            staged_files: vec![],
            dirty: true,
            diffstat: Some("1 file changed, 3 insertions(+)".into()),
            dirty_hashes: Default::default(),
            error: None,
            checkpoint: None,
        },
        turns,
        turns_omitted: omitted,
        errors: vec![SnapshotError {
            at: 1,
            source: "tool".into(),
            message: "cargo test failed: 2 failures".into(),
            followed_by: Some("the agent said: fixing the two tests".into()),
            resolution: Some(protocol::api::ErrorResolution::Fixed),
        }],
        usage: SnapshotUsage::default(),
        plan: vec![
            protocol::api::PlanEntry {
                content: "move the lexer".into(),
                status: "completed".into(),
                priority: None,
            },
            protocol::api::PlanEntry {
                content: "fix the two tests".into(),
                status: "in_progress".into(),
                priority: Some("high".into()),
            },
        ],
        plan_at: Some(1),
        tests: Some(protocol::api::SnapshotTests {
            command: "cargo test".into(),
            passed: false,
            at: 1,
            failing: vec!["lexer::empty".into(), "lexer::nested".into()],
            output: "test result: FAILED".into(),
        }),
        summary: None,
        checkpoint: None,
    }
}

/// Tether's own question at a pause was listed in WORK SO FAR as a turn of the session.
#[test]
fn the_summary_turn_is_no_work_so_far() {
    let mut asked = snapshot(vec![turn(1, "split the lexer"), turn(2, "summarise it")], 0);
    asked.summary = Some(protocol::api::PauseSummary {
        state: protocol::api::SummaryState::Stored,
        note: None,
        summary: None,
        turn_id: Some("t2".into()),
    });
    let text = handoff_context(&asked, "go on", 50_000, None);
    assert!(text.contains("Turn 1 (completed, end_turn): split the lexer"), "{text}");
    assert!(!text.contains("summarise it") && !text.contains("Turn 2"), "{text}");
}

#[test]
fn the_handoff_context_has_the_documented_sections() {
    let text = handoff_context(
        &snapshot(vec![turn(1, "split the lexer\nthen the parser")], 0),
        "go on",
        50_000,
        None,
    );
    let expected = "RESUME CONTEXT FOR CONTINUING TASK\n\
        (handed over from an agent session whose context was full; compiled from snapshot snap-1)\n\
        \n=== ORIGINAL TASK ===\nPort the parser\nMove the parser to the new crate\n\
        \n=== WORK SO FAR ===\n\
        Turn 1 (completed, end_turn): split the lexer\n    then the parser\n  Tools: run tests (completed)\n  Result: did step 1\n\
        \n=== ERRORS AND WHAT FOLLOWED ===\n\
        - [tool, fixed] cargo test failed: 2 failures -> then: the agent said: fixing the two tests\n\
        \n=== TESTS ===\nThe last test run, `cargo test`, failed; failing: lexer::empty, lexer::nested\n\
        \n=== PLAN (as the agent last gave it) ===\n[done] move the lexer\n[in progress] fix the two tests\n\
        \n=== WORKSPACE ===\nBranch work at bbbbbbbbbbbb (the session started at aaaaaaaaaaaa).\n\
        Commits since the start: bbbbbbb move lexer\nFiles changed since the start: src/lexer.rs\n\
        There are uncommitted changes.\n1 file changed, 3 insertions(+)\n\
        \n=== CURRENT REQUEST ===\ngo on\n\n=== INSTRUCTIONS ===\n";
    assert!(text.starts_with(expected), "{text}");
}

/// History injection wraps the history in the state compiled from the resume's snapshot:
/// task and why it stopped before, the agent's summary and the rest after; within the
/// budget, which the history shares.
#[test]
fn an_injected_resume_gets_the_compiled_state_around_the_history() {
    use protocol::api::{AgentSummary, Decision, PauseSummary, SummaryState};
    let mut paused = snapshot(vec![turn(1, "split the lexer")], 0);
    paused.trigger = SnapshotTrigger::Pause;
    paused.reason = Some("end of day".into());
    paused.summary = Some(PauseSummary {
        state: SummaryState::Stored,
        note: None,
        summary: Some(AgentSummary {
            decisions: vec![Decision {
                decision: "one crate per stage".into(),
                rationale: "faster builds".into(),
                alternatives: vec![],
            }],
            open_problems: vec![],
            next_steps: vec!["port the parser".into()],
        }),
        turn_id: None,
    });
    let (head, tail) = injected_sections(Some(&paused), &paused.plan, None, 50_000);
    assert_eq!(
        head,
        "\n=== ORIGINAL TASK ===\nPort the parser\nMove the parser to the new crate\n\
         \n=== WHY THE SESSION STOPPED ===\nIt was paused: end of day\n"
    );
    assert!(
        tail.starts_with(
            "\n=== DECISIONS (as the agent summarised them at the pause) ===\n- one crate per stage (because: faster builds)\n\
             \n=== NEXT STEPS (as the agent planned them at the pause) ===\n- port the parser\n\
             \n=== ERRORS AND WHAT FOLLOWED ===\n"
        ),
        "{tail}"
    );
    assert!(tail.contains("\n=== PLAN (as the agent last gave it) ===\n[done] move the lexer\n"));
    assert!(tail.contains("\n=== WORKSPACE ===\nBranch work at bbbbbbbbbbbb"), "{tail}");
    // Placed around the history, which gets what they leave of the budget.
    let history: String = (1..=200)
        .map(|seq| {
            let entry = HistoryEntry {
                wire: protocol::api::HistoryEntry {
                    seq,
                    at: seq as i64,
                    kind: EntryType::UserMessage,
                    role: "user".into(),
                    content: format!("message {seq:03} {}", "y".repeat(80)),
                    tool_name: None,
                    tool_call_id: None,
                    tool_status: None,
                    message_id: None,
                    plan: None,
                    rewound: false,
                },
                agent_seq: None,
                generation: None,
            };
            serde_json::to_string(&entry).unwrap() + "\n"
        })
        .collect();
    let budget = 6000;
    let (head, tail) = injected_sections(Some(&paused), &paused.plan, None, budget);
    assert!(head.chars().count() + tail.chars().count() <= budget / 2);
    let mut file = std::io::Cursor::new(history);
    let built =
        crate::resume_context::build_after(&mut file, "go", budget, (None, &[]), (&head, &tail))
            .unwrap();
    let text = &built.text;
    assert!(
        text.starts_with(&format!(
            "RESUME CONTEXT FOR CONTINUING TASK\n{head}\n=== EXECUTION HISTORY ===\n["
        )),
        "{text}"
    );
    assert!(text.contains(&format!(
        "[USER]: message 200 {}\n{tail}\n=== CURRENT REQUEST ===\ngo\n",
        "y".repeat(80)
    )));
    assert!(built.omitted > 0 && built.included > 0, "{built:?}");
    let without_prompt = text.chars().count() - "go".len();
    assert!(without_prompt < budget + 400, "{without_prompt}");
}

#[test]
fn the_handoff_context_keeps_the_newest_turns_within_the_budget() {
    let turns: Vec<SnapshotTurn> = (1..=20).map(|n| turn(n, &"x".repeat(400))).collect();
    let prompt = "p".repeat(5000);
    let text = handoff_context(&snapshot(turns, 7), &prompt, 3000, None);
    // The prompt is always whole; the rest keeps to the budget.
    assert!(text.contains(&prompt));
    assert!(text.chars().count() - prompt.chars().count() < 3000 + 400, "{}", text.len());
    // Numbered from the session's first turn: 7 omitted before the 20 kept here.
    assert!(text.contains("Turn 27 ("), "{text}");
    assert!(!text.contains("Turn 8 ("), "the oldest go first: {text}");
    let kept = text.matches("\nTurn ").count();
    assert!((1..20).contains(&kept), "{kept}");
    assert!(text.contains(&format!("[{} earlier turns omitted]", 27 - kept)), "{text}");
}

fn entry(seq: u64, at: i64, kind: EntryType, content: &str, status: Option<&str>) -> HistoryEntry {
    HistoryEntry {
        wire: protocol::api::HistoryEntry {
            seq,
            at,
            kind,
            role: "x".into(),
            content: content.into(),
            tool_name: status.map(|_| "cargo test".into()),
            tool_call_id: status.map(|_| "c1".into()),
            tool_status: status.map(str::to_owned),
            message_id: None,
            plan: None,
            rewound: false,
        },
        agent_seq: None,
        generation: None,
    }
}

#[test]
fn an_error_names_what_followed_it() {
    let entries = vec![
        entry(1, 10, EntryType::UserMessage, "fix it", None),
        entry(2, 11, EntryType::ToolCall, "cargo test", Some("pending")),
        entry(3, 12, EntryType::ToolResult, "2 failures", Some("failed")),
        entry(4, 13, EntryType::AgentMessage, "fixing the two tests", None),
    ];
    let timeline = vec![
        (20, TimelineEvent::Error { message: "the agent exited (exit code 3)".into() }),
        (
            30,
            TimelineEvent::Resumed {
                execution_id: "e2".into(),
                outcome: protocol::api::ResumeOutcome::NativeLoad,
            },
        ),
    ];
    let found = errors(&entries, &timeline, false);
    assert_eq!(found.len(), 2, "{found:?}");
    let unresolved = Some(protocol::api::ErrorResolution::Unresolved);
    assert_eq!((found[0].resolution, found[1].resolution), (unresolved, unresolved));
    let paused = errors(&entries, &timeline, true);
    let deferred = Some(protocol::api::ErrorResolution::Deferred);
    assert_eq!((paused[0].resolution, paused[1].resolution), (deferred, deferred), "a pause's");
    assert_eq!(found[0].source, "tool");
    assert_eq!(found[0].message, "cargo test failed: 2 failures");
    assert_eq!(found[0].followed_by.as_deref(), Some("the agent said: fixing the two tests"));
    assert_eq!(found[1].source, "session");
    assert_eq!(found[1].followed_by.as_deref(), Some("the session resumed (native_load)"));
}

/// Found flaky in a full run: a failed tool and its turn's end in the same millisecond.
/// The turn's end follows the history of its turn, so the failure was worked around.
#[test]
fn a_turns_end_in_the_same_millisecond_follows_its_entries() {
    let entries = vec![entry(1, 10, EntryType::ToolResult, "exit code 1", Some("failed"))];
    let ended = TimelineEvent::TurnEnded {
        turn_id: "t1".into(),
        state: TurnState::Completed,
        stop_reason: Some("end_turn".into()),
        error: None,
    };
    let found = errors(&entries, &[(10, ended)], true);
    assert_eq!(found[0].resolution, Some(protocol::api::ErrorResolution::WorkedAround));
    assert_eq!(found[0].followed_by.as_deref(), Some("the turn ended (end_turn)"));
}

#[test]
fn the_history_tail_skips_the_line_its_window_cuts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.jsonl");
    let lines: String = (1..=50)
        .map(|n| {
            serde_json::to_string(&entry(n, n as i64, EntryType::AgentMessage, "abc", None))
                .unwrap()
                + "\n"
        })
        .collect();
    std::fs::write(&path, &lines).unwrap();
    let all = history::read_tail(&path, 1 << 20);
    assert_eq!(all.len(), 50);
    let some = history::read_tail(&path, 300);
    assert!(!some.is_empty() && some.len() < 50);
    assert_eq!(some.last().unwrap().seq, 50);
    assert_eq!(some.first().unwrap().seq, 51 - some.len() as u64, "whole lines only");
}

/// Runs git in `dir` as a test's user; its trimmed stdout (the other modules' git tests
/// use it too).
pub(crate) async fn run(dir: &Path, args: &[&str]) -> String {
    let out = tokio::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Makes `top` a repository whose `same.txt` was committed as "old" and then edited to
/// "new" (the same size) in the second the index was written, long ago: only the index
/// file's own time tells git to look at its content (it is "racily clean").
pub(crate) async fn racily_clean_edit(top: &Path) {
    let stamp = |path: &Path| {
        let then = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000);
        let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        file.set_modified(then).unwrap();
    };
    run(top, &["init", "-q"]).await;
    let file = top.join("same.txt");
    std::fs::write(&file, "old\n").unwrap();
    stamp(&file);
    run(top, &["add", "."]).await;
    run(top, &["commit", "-qm", "base"]).await;
    stamp(&top.join(".git/index"));
    std::fs::write(&file, "new\n").unwrap();
    stamp(&file);
}

#[tokio::test]
async fn the_git_state_of_a_repository_since_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path();
    run(repo, &["init", "-q", "-b", "feature"]).await;
    std::fs::write(repo.join("a.txt"), "one\n").unwrap();
    std::fs::write(repo.join("b.txt"), "two\n").unwrap();
    run(repo, &["add", "."]).await;
    run(repo, &["commit", "-q", "-m", "start"]).await;
    let start = git::head(repo).await.unwrap();
    std::fs::write(repo.join("a.txt"), "one more\n").unwrap();
    run(repo, &["commit", "-q", "-am", "edit a"]).await;
    std::fs::write(repo.join("b.txt"), "two more\n").unwrap();
    std::fs::write(repo.join("c.txt"), "new\n").unwrap();
    run(repo, &["add", "c.txt"]).await;
    std::fs::write(repo.join("d.txt"), "untracked\n").unwrap();
    let state = git::state(repo, Some(&start), &Default::default()).await;
    assert!(state.repository && state.dirty, "{state:?}");
    assert_eq!(state.branch.as_deref(), Some("feature"));
    assert_eq!(state.start_commit.as_deref(), Some(start.as_str()));
    assert_eq!(state.head_commit, git::head(repo).await);
    assert_ne!(state.head_commit.as_deref(), Some(start.as_str()));
    assert_eq!(state.commits_since_start.len(), 1);
    assert!(state.commits_since_start[0].ends_with(" edit a"), "{state:?}");
    assert_eq!(state.modified_files, ["a.txt", "b.txt", "c.txt", "d.txt"]);
    assert_eq!(state.staged_files, ["c.txt"]);
    assert!(state.diffstat.as_deref().unwrap().starts_with("3 files changed"), "{state:?}");
    assert_eq!(state.error, None);
    let plain = tempfile::tempdir().unwrap();
    assert_eq!(git::state(plain.path(), None, &Default::default()).await, GitState::default());
}

/// "Files changed since the start" listed files that were already uncommitted when the
/// session began: one that still holds what it held then is no change of the session's;
/// one changed since is.
#[tokio::test]
async fn files_dirty_before_the_start_count_only_once_changed_again() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path();
    run(repo, &["init", "-q", "-b", "main"]).await;
    std::fs::write(repo.join("kept.txt"), "committed\n").unwrap();
    std::fs::write(repo.join("touched.txt"), "committed\n").unwrap();
    run(repo, &["add", "."]).await;
    run(repo, &["commit", "-q", "-m", "start"]).await;
    // The person's own work in progress when the session starts.
    std::fs::write(repo.join("kept.txt"), "the person's edit\n").unwrap();
    std::fs::write(repo.join("touched.txt"), "the person's edit\n").unwrap();
    std::fs::write(repo.join("notes.txt"), "untracked before\n").unwrap();
    let start = git::head(repo).await.unwrap();
    let at_start = git::dirty(repo).await;
    assert_eq!(at_start.len(), 3, "{at_start:?}");
    // The session's agent changes one of them and makes a new file.
    std::fs::write(repo.join("touched.txt"), "the agent's edit\n").unwrap();
    std::fs::write(repo.join("new.txt"), "the agent's file\n").unwrap();
    let state = git::state(repo, Some(&start), &at_start).await;
    assert_eq!(state.modified_files, ["new.txt", "touched.txt"], "{state:?}");
    // Without the start's record, everything uncommitted counts (older sessions).
    let state = git::state(repo, Some(&start), &Default::default()).await;
    assert_eq!(state.modified_files, ["kept.txt", "new.txt", "notes.txt", "touched.txt"]);
}
