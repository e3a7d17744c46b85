//! Workspace checkpoints end to end, with a real daemon and mock-agent writing files over
//! turns: one checkpoint per turn (its event, its timeline row, its ref in the session's
//! own repository), each restored into a directory byte for byte as the workspace was at
//! that turn's end, the user's repository never touched, and the CLI's list.

use protocol::api::{ApiClient, CheckpointTrigger, EventKind, TimelineEvent};
use protocol::errors::ErrorKind;
use tether_tests::daemon::{Api, Daemon, call, ok, until};
use tether_tests::{files_of, git};

/// Prompts, and waits past the turn's end for its checkpoint and its snapshot.
async fn turn_and_checkpoint(api: &Api, session: &str, prompt: &str) -> protocol::api::Checkpoint {
    let mut events = api.subscribe_at_end(session).await;
    api.prompt(session, prompt).await.expect("prompt");
    let (mut checkpoint, mut snapshot) = (None, false);
    until(&mut events, |e| {
        match &e.kind {
            EventKind::CheckpointTaken { checkpoint: taken } => checkpoint = Some(taken.clone()),
            EventKind::SnapshotTaken { .. } => snapshot = true,
            _ => {}
        }
        checkpoint.is_some() && snapshot
    })
    .await;
    checkpoint.expect("UNWRAP: until ends once it is seen")
}

#[tokio::test]
async fn every_turn_is_checkpointed_and_each_restores_byte_for_byte() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let repo = daemon.workspace("repo");
    git(&repo, &["init", "-q", "-b", "main"]).await;
    std::fs::write(repo.join(".gitignore"), "build/\n").unwrap();
    std::fs::write(repo.join("README"), "the project\n").unwrap();
    git(&repo, &["add", "."]).await;
    git(&repo, &["commit", "-q", "-m", "start"]).await;
    let head = git(&repo, &["rev-parse", "HEAD"]).await;
    let index = std::fs::read(repo.join(".git/index")).unwrap();
    let session = api.ready_session("mock", &repo).await;

    let write = |path: &str, text: &str| format!("/write {} {text}", repo.join(path).display());
    let mut at_turn = Vec::new();
    for (path, text) in
        [("src/a.txt", "one"), ("README", "the project, edited"), ("build/x", "out")]
    {
        let checkpoint = turn_and_checkpoint(&api, &session, &write(path, text)).await;
        let mut files = files_of(&repo);
        files.retain(|name, _| !name.starts_with("build/"));
        at_turn.push((checkpoint, files));
    }
    let turns: Vec<_> = at_turn.iter().map(|(c, _)| (c.seq, c.turn, c.trigger)).collect();
    assert_eq!(
        turns,
        [
            (1, Some(1), CheckpointTrigger::Turn),
            (2, Some(2), CheckpointTrigger::Turn),
            (3, Some(3), CheckpointTrigger::Turn)
        ]
    );
    assert_eq!(git(&repo, &["rev-parse", "HEAD"]).await, head, "the user's HEAD moved");
    assert_eq!(std::fs::read(repo.join(".git/index")).unwrap(), index, "the user's index changed");
    assert_eq!(git(&repo, &["for-each-ref", "refs/tether/sessions"]).await, "");

    // The newest in the status and in the turn's snapshot (which waits for it).
    let status = api.status(&session).await;
    assert_eq!(status.checkpoint.as_ref(), Some(&at_turn[2].0));
    let snapshots = ok("snapshots", api.typed().snapshot_list(session.clone())).await;
    let newest = snapshots.iter().max_by_key(|s| s.taken_at).expect("a turn's snapshot");
    let snapshot = ok("snapshot", api.typed().snapshot_get(newest.snapshot_id.clone())).await;
    assert_eq!(snapshot.checkpoint.map(|c| c.seq), Some(3));
    let (code, stdout, _) = daemon.cli(&["status", &session]).await;
    assert_eq!(code, 0);
    assert!(stdout.contains("checkpoint: 3 (turn 3), 3 file(s)"), "{stdout}");
    let listed = ok("list", api.typed().session_checkpoint_list(session.clone())).await;
    assert_eq!(listed.checkpoints, at_turn.iter().map(|(c, _)| c.clone()).collect::<Vec<_>>());
    let out = tempfile::tempdir().unwrap();
    for (checkpoint, files) in &at_turn {
        let into = out.path().join(format!("turn-{}", checkpoint.seq));
        let into_text = into.display().to_string();
        let restore = api.typed().session_checkpoint_restore(
            session.clone(),
            None,
            checkpoint.turn,
            into_text,
        );
        let restored = ok("restore", restore).await;
        assert_eq!(restored.checkpoint, *checkpoint);
        assert_eq!(files_of(&into), *files, "checkpoint {}", checkpoint.seq);
    }
    // Its ref, in the session's own repository.
    let own = daemon.session_dir(&session).join("checkpoints.git");
    let named = git(&own, &["rev-parse", &format!("refs/tether/sessions/{session}/turns/2")]).await;
    assert_eq!(named, at_turn[1].0.commit);

    // Refused: a directory that is not empty; a checkpoint that is not there.
    let full = out.path().join("turn-1").display().to_string();
    let again = api.typed().session_checkpoint_restore(session.clone(), Some(1), None, full);
    let refused = call("restore into a full directory", again).await.expect_err("not empty");
    assert_eq!(refused.kind, ErrorKind::InvalidParams, "{refused:?}");
    let fresh = out.path().join("new").display().to_string();
    let missing = api.typed().session_checkpoint_restore(session.clone(), Some(9), None, fresh);
    let refused = call("restore of no checkpoint", missing).await.expect_err("no such");
    assert_eq!(refused.kind, ErrorKind::NotFound, "{refused:?}");

    // On the timeline, and in the CLI.
    let timeline = ok("timeline", api.typed().session_timeline(session.clone(), None)).await;
    let on_timeline = timeline
        .entries
        .iter()
        .filter(|e| matches!(e.event, TimelineEvent::CheckpointTaken { .. }))
        .count();
    assert_eq!(on_timeline, 3);
    let (code, stdout, stderr) = daemon.cli(&["checkpoints", &session]).await;
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(lines[1].trim_start().starts_with("2\tturn 2\t"), "{stdout}");
    let into = out.path().join("cli");
    let (code, stdout, stderr) = daemon
        .cli(&[
            "checkpoints",
            &session,
            "--turn",
            "1",
            "--restore-into",
            &into.display().to_string(),
        ])
        .await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("wrote checkpoint 1 ("), "{stdout}");
    assert_eq!(files_of(&into), at_turn[0].1);
}
