//! The review of a session's changes end to end, with a real daemon, mock-agent writing
//! files through the client and a real repository: what the session changed since its
//! base (untracked files in, what was dirty before it left out), keeps that hold for the
//! content seen, a revert that saves what it takes away on a ref, typed refusals, and the
//! changes of an ended session.

use protocol::api::{ApiClient, ChangeKind, SessionChanges};
use protocol::errors::ErrorKind;
use tether_tests::daemon::{Api, Daemon, call, ok};
use tether_tests::git;

use crate::workspaces::repository;

async fn changes(api: &Api, session: &str) -> SessionChanges {
    ok("changes", api.typed().session_changes(session.to_owned())).await
}

fn listed(changes: &SessionChanges) -> Vec<(&str, ChangeKind, bool)> {
    changes.files.iter().map(|file| (file.path.as_str(), file.kind, file.kept)).collect()
}

#[tokio::test]
async fn a_review_lists_the_sessions_changes_keeps_what_was_seen_and_reverts_without_loss() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let repo = repository(&daemon, "repo").await;
    // Uncommitted before the session: not its change.
    std::fs::write(repo.join("notes.txt"), "mine\n").unwrap();
    let session = api.ready_session("mock", &repo).await;
    let readme = repo.join("README");
    api.ask(&session, &format!("/write {} the project, edited", readme.display())).await;
    api.ask(&session, &format!("/write {} one", repo.join("src/a.txt").display())).await;

    let seen = changes(&api, &session).await;
    assert!(seen.repository);
    assert_eq!(
        seen.base_commit.as_deref(),
        Some(git(&repo, &["rev-parse", "HEAD"]).await.as_str())
    );
    assert_eq!(
        listed(&seen),
        [("README", ChangeKind::Modified, false), ("src/a.txt", ChangeKind::Added, false)]
    );
    assert!(seen.files[0].diff.as_deref().unwrap().contains("+the project, edited"));
    assert_eq!(seen.files[1].additions, Some(1));

    // Kept at the content seen; changed again, it is shown again.
    let added = seen.files[1].clone();
    let kept = ok(
        "keep",
        api.typed().session_changes_keep(
            session.clone(),
            added.path.clone(),
            added.content.clone(),
            None,
        ),
    )
    .await;
    assert_eq!(listed(&kept)[1], ("src/a.txt", ChangeKind::Added, true));
    api.ask(&session, &format!("/write {} two", repo.join("src/a.txt").display())).await;
    assert_eq!(listed(&changes(&api, &session).await)[1], ("src/a.txt", ChangeKind::Added, false));
    // A keep of what the reviewer saw before that is refused.
    let stale = api.typed().session_changes_keep(session.clone(), added.path, added.content, None);
    let refused = call("stale keep", stale).await.expect_err("the file changed since");
    assert_eq!(refused.kind, ErrorKind::Conflict, "{refused:?}");

    // The revert puts README back and keeps the edit on its ref.
    let reverted =
        ok("revert", api.typed().session_changes_revert(session.clone(), "README".into())).await;
    assert_eq!(std::fs::read_to_string(&readme).unwrap(), "the project\n");
    assert!(reverted.saved_ref.starts_with(&format!("refs/tether/reverted/{session}/")));
    let saved = git(&repo, &["show", &format!("{}:README", reverted.saved_ref)]).await;
    assert_eq!(saved, "the project, edited");
    assert_eq!(listed(&reverted.changes), [("src/a.txt", ChangeKind::Added, false)]);
    let nothing = api.typed().session_changes_revert(session.clone(), "notes.txt".into());
    let refused = call("revert of no change", nothing).await.expect_err("not a change");
    assert_eq!(refused.kind, ErrorKind::NotFound, "{refused:?}");

    // An ended session's changes are still there to review.
    ok("stop", api.typed().session_stop(session.clone())).await;
    assert_eq!(listed(&changes(&api, &session).await), [("src/a.txt", ChangeKind::Added, false)]);
}

#[tokio::test]
async fn a_workspace_outside_git_has_no_changes_to_review_and_says_so() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("plain")).await;
    let seen = changes(&api, &session).await;
    assert!(!seen.repository && seen.files.is_empty(), "{seen:?}");
    let revert = api.typed().session_changes_revert(session.clone(), "a".into());
    let refused = call("revert outside git", revert).await.expect_err("not a repository");
    assert_eq!(refused.kind, ErrorKind::InvalidState, "{refused:?}");
    assert!(refused.message.contains("not in a git repository"), "{refused:?}");
}

#[tokio::test]
async fn the_cli_lists_the_changes_shows_diffs_keeps_and_reverts() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let repo = daemon.workspace("cli-repo");
    tether_tests::git_repository(&repo).await;
    let session = api.ready_session("mock", &repo).await;
    api.ask(&session, &format!("/write {} one", repo.join("a.txt").display())).await;
    api.ask(&session, &format!("/write {} two", repo.join("b.txt").display())).await;

    let (code, out, err) = daemon.cli(&["changes", &session, "--diff"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("2 file(s) changed since"), "{out}");
    assert!(out.contains("  A  a.txt  +1 −0"), "{out}");
    assert!(out.contains("+one"), "the diff: {out}");
    let (code, out, err) = daemon.cli(&["changes", &session, "--keep", "a.txt"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("kept a.txt"), "{err}");
    assert!(out.contains("a.txt  +1 −0  kept") && out.contains("1 kept"), "{out}");
    let (code, out, err) = daemon.cli(&["changes", &session, "--revert", "b.txt"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("reverted b.txt") && err.contains("refs/tether/reverted/"), "{err}");
    assert!(!repo.join("b.txt").exists());
    assert!(out.contains("1 file(s) changed") && !out.contains("b.txt"), "{out}");
    // A path that is no change is refused with the not-found exit code.
    let (code, _, err) = daemon.cli(&["changes", &session, "--revert", "nothing.txt"]).await;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("nothing.txt is not among the session's changes"), "{err}");
}

/// A file the reviewer reverts is told to the session's agent with its next prompt, once
/// (it would take its change as made): said to be Tether's, before the prompt as written;
/// the history keeps the prompt as written and the stream says what the agent was told.
#[tokio::test]
async fn a_reverted_file_is_told_to_the_agent_with_its_next_prompt_once() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let repo = repository(&daemon, "told").await;
    let session = api.ready_session("mock", &repo).await;
    api.ask(&session, &format!("/write {} edited", repo.join("README").display())).await;
    let reverted =
        ok("revert", api.typed().session_changes_revert(session.clone(), "README".into())).await;
    let mut events = api.subscribe_at_end(&session).await;
    let reply = api.ask(&session, "go on").await;
    let told = format!(
        "[Tether, not the user: since your last turn\n- README was reverted by the person reviewing this session's changes: it is back as it was when the session started (your change to it is saved on {})]\n\ngo on",
        reverted.saved_ref
    );
    assert!(reply.ends_with(&format!("you said: {told}")), "{reply}");
    let seen = tether_tests::daemon::until(&mut events, |event| {
        matches!(event.kind, protocol::api::EventKind::TurnStarted { .. })
    })
    .await;
    assert!(
        seen.iter().any(|event| matches!(&event.kind, protocol::api::EventKind::Notice { message } if message.starts_with("told the agent: README was reverted"))),
        "{seen:#?}"
    );
    let prompts: Vec<String> = api
        .history(&session)
        .await
        .into_iter()
        .filter(|entry| entry.kind == protocol::api::EntryType::UserMessage)
        .map(|entry| entry.content)
        .collect();
    assert_eq!(prompts.last().map(String::as_str), Some("go on"), "{prompts:?}");
    let reply = api.ask(&session, "and again").await;
    assert!(reply.ends_with("you said: and again"), "told once: {reply}");
}

/// A review's keeps and reverts are announced on the session's stream (a page in another
/// window reads the changes again): through its actor while it runs, at rest once it
/// ended.
#[tokio::test]
async fn a_review_is_announced_on_the_sessions_stream_live_and_at_rest() {
    use protocol::api::{EventKind, ReviewAction};
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let repo = repository(&daemon, "announced").await;
    let session = api.ready_session("mock", &repo).await;
    api.ask(&session, &format!("/write {} one", repo.join("a.txt").display())).await;
    api.ask(&session, &format!("/write {} two", repo.join("b.txt").display())).await;
    let mut events = api.subscribe_at_end(&session).await;
    let listed = changes(&api, &session).await;
    let a = listed.files.iter().find(|file| file.path == "a.txt").unwrap().clone();
    let keep = api.typed().session_changes_keep(session.clone(), a.path, a.content, None);
    ok("keep", keep).await;
    let seen = tether_tests::daemon::until(&mut events, |event| {
        matches!(event.kind, EventKind::ChangeReviewed { .. })
    })
    .await;
    let kept = &seen.last().unwrap().kind;
    assert!(
        matches!(kept, EventKind::ChangeReviewed { path, action: ReviewAction::Kept, saved_ref: None } if path == "a.txt"),
        "{kept:?}"
    );
    // Ended: no actor publishes; the revert is announced at rest.
    ok("stop", api.typed().session_stop(session.clone())).await;
    let reverted =
        ok("revert", api.typed().session_changes_revert(session.clone(), "b.txt".into())).await;
    let seen = tether_tests::daemon::until(&mut events, |event| {
        matches!(event.kind, EventKind::ChangeReviewed { .. })
    })
    .await;
    let announced = &seen.last().unwrap().kind;
    assert!(
        matches!(announced, EventKind::ChangeReviewed { path, action: ReviewAction::Reverted, saved_ref: Some(saved) } if path == "b.txt" && *saved == reverted.saved_ref),
        "{announced:?}"
    );
}
