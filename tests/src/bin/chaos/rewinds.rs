//! The rewind rounds: a side session in a git workspace runs three turns, each writing a
//! file of its own (left uncommitted), and is rewound to its first turn — with the
//! workspace restored or not — on a supervisor armed at `rewind.workspace_restored` (it
//! dies with the workspace restored and the turns not yet marked), then restarted.
//! Afterwards no turn is marked (nobody was told of a rewind: lost otherwise) and what the
//! workspace held is on a `refs/tether/rewound/` ref; the rewind made again is answered and
//! marks the later turns, a restored workspace holds the first turn's file alone, and the
//! next prompt runs once, on a fresh agent session given the first turn alone (lost or
//! duplicated otherwise). The session is deleted.

use std::path::Path;

use protocol::api::{EntryType, SnapshotTrigger};
use tether_tests::git;

use super::forks::ask_answering;
use super::{Api, ApiClient, Daemon, EventKind, GO_AWAY, Tally, lossy};

/// One rewind round (see the module doc); `point` is what it was armed with.
pub(super) async fn rewind_round(
    daemon: &mut Daemon,
    api: &mut Api,
    round: u64,
    (point, restore): (&str, bool),
    tally: &mut Tally,
) {
    let workspace = daemon.workspace(&format!("rewind-r{round}"));
    tether_tests::git_repository(&workspace).await;
    let session = api.ready_session("mock", &workspace).await;
    let turns = three_turns(api, &session, &workspace, round).await;
    let cut =
        lossy(api.typed().session_rewind(session.clone(), turns[0].clone(), Some(restore))).await;
    if cut.is_err() && tokio::time::timeout(GO_AWAY, daemon.wait_exit()).await.is_ok() {
        *tally.kills.entry(format!("supervisor at {point} (rewind)")).or_default() += 1;
    } else {
        tally.problem(format!("round {round}: the rewind did not reach {point} ({cut:?})"));
        daemon.terminate().await;
    }
    daemon.restart_with_env(&[]).await;
    *api = daemon.api().await;
    check_cut(api, &session, &workspace, round, restore, tally).await;
    check_made_again(api, &session, &turns, (&workspace, restore), round, tally).await;
    eprintln!("chaos: round {round}: a rewind cut at {point} and made again (restore: {restore})");
    let (code, _, err) = daemon.cli(&["sessions", "delete", &session]).await;
    if code != 0 {
        tally.problem(format!("round {round}: deleting {session} failed: {err}"));
    }
}

/// Three turns of `session`, each writing `fN.txt` in the workspace, and their snapshots;
/// the turns' ids.
async fn three_turns(api: &Api, session: &str, workspace: &Path, round: u64) -> Vec<String> {
    let mut events = api.subscribe(session, 0).await;
    for n in 1..=3 {
        let file = workspace.join(format!("f{n}.txt"));
        let text = format!("/write {} turn {n}\nchaos rewind r{round} t{n}", file.display());
        ask_answering(api, session, &text).await;
        tether_tests::daemon::until(&mut events, |event| {
            matches!(
                event.kind,
                EventKind::SnapshotTaken { trigger: SnapshotTrigger::TurnComplete, .. }
            )
        })
        .await;
    }
    let timeline = lossy(api.typed().session_timeline(session.to_owned(), None)).await;
    timeline.map(|t| t.turns.into_iter().map(|turn| turn.turn_id).collect()).unwrap_or_default()
}

/// After the kill: nothing marked; a restored workspace's earlier files on a ref.
async fn check_cut(
    api: &Api,
    session: &str,
    workspace: &Path,
    round: u64,
    restore: bool,
    tally: &mut Tally,
) {
    let timeline = lossy(api.typed().session_timeline(session.to_owned(), None)).await;
    if timeline.is_ok_and(|timeline| timeline.turns.iter().any(|turn| turn.rewound)) {
        tally.lost += 1;
        tally.problem(format!("round {round}: {session} was rewound without an answer"));
    }
    if !restore {
        return;
    }
    let refs =
        git(workspace, &["for-each-ref", "--format=%(refname)", "refs/tether/rewound/"]).await;
    let mut saved = false;
    for name in refs.lines() {
        saved |= git(workspace, &["ls-tree", "--name-only", name]).await.contains("f3.txt");
    }
    if !saved {
        tally.lost += 1;
        tally.problem(format!(
            "round {round}: the workspace's files before the cut rewind are on no ref ({refs})"
        ));
    }
}

/// The rewind made again: answered, the later turns marked, the workspace as the first
/// turn left it (when restored); the next prompt once, from the first turn alone.
async fn check_made_again(
    api: &Api,
    session: &str,
    turns: &[String],
    (workspace, restore): (&Path, bool),
    round: u64,
    tally: &mut Tally,
) {
    let again =
        lossy(api.typed().session_rewind(session.to_owned(), turns[0].clone(), Some(restore)));
    match again.await {
        Ok(rewound) if rewound.rewound == turns[1..] => {}
        answered => {
            tally.problem(format!("round {round}: the rewind made again answered {answered:?}"));
            return;
        }
    }
    let files: Vec<bool> = (1..=3).map(|n| workspace.join(format!("f{n}.txt")).exists()).collect();
    if restore && files != [true, false, false] {
        tally.problem(format!("round {round}: the restored workspace's files: {files:?}"));
    }
    let tag = format!("chaos rewind round {round}");
    let reply = ask_answering(api, session, &tag).await;
    let history = api.history(session).await;
    let prompts =
        history.iter().filter(|e| e.kind == EntryType::UserMessage && e.content == tag).count();
    let marker = |n: u32| format!("chaos rewind r{round} t{n}");
    let fresh = reply.contains("remembered 0 earlier messages") && reply.contains(&marker(1));
    if prompts != 1 || !fresh || reply.contains(&marker(2)) || reply.contains(&marker(3)) {
        tally.duplicated += u64::from(prompts > 1);
        tally.lost += u64::from(prompts == 0);
        tally.problem(format!(
            "round {round}: after the rewind the prompt ran {prompts} time(s), its agent given: {reply}"
        ));
    }
}
