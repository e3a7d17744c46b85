//! A workspace directory is held by at most one live session
//! unless the caller says `shared: true`; the second gets `conflict` naming the holder.

use protocol::api::ApiClient;
use protocol::errors::ErrorKind;
use tether_tests::daemon::{Api, ApiError, Create, Daemon, call, ok};
use tether_tests::git;

async fn create(
    api: &Api,
    task: &str,
    workspace: &std::path::Path,
    shared: Option<bool>,
) -> Result<String, ApiError> {
    let create = Create { shared, ..Create::new(task, "mock", Some(workspace)) }.send(api.typed());
    call("task.session.create", create).await.map(|row| row.id)
}

#[tokio::test]
async fn a_held_workspace_is_refused_naming_its_holder_unless_shared() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let task = ok("task.create", api.typed().task_create("w".into(), None)).await.id;
    let workspace = daemon.workspace("held");
    let holder = create(&api, &task, &workspace, None).await.unwrap();
    let second = create(&api, &task, &workspace, None).await.unwrap_err();
    assert_eq!(second.kind, ErrorKind::Conflict, "{second:?}");
    assert!(second.message.contains(&holder), "names the holder: {}", second.message);
    // The same directory by another spelling is the same workspace.
    let dotted = workspace.join(".");
    let again = create(&api, &task, &dotted, Some(false)).await.unwrap_err();
    assert_eq!(again.kind, ErrorKind::Conflict, "{again:?}");
    // Said to share, it may.
    let sharing = create(&api, &task, &workspace, Some(true)).await.unwrap();
    assert_ne!(sharing, holder);
    // A paused holder still holds it; an ended one does not.
    ok("pause", api.typed().session_pause(holder.clone(), None, None)).await;
    let paused = create(&api, &task, &workspace, None).await.unwrap_err();
    assert_eq!(paused.kind, ErrorKind::Conflict);
    ok("stop", api.typed().session_stop(holder)).await;
    ok("stop", api.typed().session_stop(sharing)).await;
    create(&api, &task, &workspace, None).await.expect("free once its sessions ended");
}

/// Two creates at once for one workspace: exactly one wins.
#[tokio::test]
async fn concurrent_creates_of_one_workspace_let_one_through() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let task = ok("task.create", api.typed().task_create("w".into(), None)).await.id;
    let workspace = daemon.workspace("race");
    let attempts: Vec<_> = (0..6).map(|_| create(&api, &task, &workspace, None)).collect();
    let results = futures_util::future::join_all(attempts).await;
    let won = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(won, 1, "{results:?}");
    for refusal in results.into_iter().filter_map(Result::err) {
        assert_eq!(refusal.kind, ErrorKind::Conflict);
    }
}

/// A session keeps the profile it started with: an edit of the profile is reported as
/// drift (which fields) by status and resume, and adopted only by a resume that asks —
/// refused while the agent runs with the old one.
#[tokio::test]
async fn a_profile_edit_is_reported_as_drift_and_adopted_only_on_request() {
    let before = "id = \"drifty\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{home}/.mock-agent\"]\nprotocol = \"acp\"\n";
    let mut daemon = Daemon::start_with_profiles(&[], &[("drifty.toml", before)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("drifty", &daemon.workspace("d")).await;
    assert_eq!(api.status(&session).await.profile_drift, Vec::<String>::new());
    // The profile is edited; a restart reads it (the daemon's watcher would too, later).
    let after = format!("{before}[env]\nDRIFT_MARK = \"adopted\"\n");
    std::fs::write(daemon.root.path().join("tether/profiles/drifty.toml"), after).unwrap();
    drop(api);
    daemon.terminate().await;
    daemon.restart().await;
    let api = daemon.api().await;
    assert_eq!(api.status(&session).await.profile_drift, ["env.DRIFT_MARK"]);
    // Not reattached by an ordinary resume, nor while the agent runs.
    let joined = api.resume(&session).await.unwrap();
    assert_eq!(
        (joined.profile_drift.as_slice(), joined.profile_refreshed),
        (&["env.DRIFT_MARK".to_owned()][..], false)
    );
    let busy = api.typed().session_resume(session.clone(), Some(true));
    let busy = tether_tests::daemon::refused("refresh while running", busy).await;
    assert_eq!(busy.kind, ErrorKind::InvalidState, "{busy:?}");
    let agents = || Daemon::processes_mentioning(&daemon.root.path().join(".mock-agent"));
    let environ = |pid: u32| std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    assert!(
        agents()
            .into_iter()
            .all(|pid| !String::from_utf8_lossy(&environ(pid)).contains("DRIFT_MARK"))
    );
    // Paused, then resumed with the refresh: the new agent runs with the edited profile,
    // and the session remembers (a native restore, as before).
    ok("pause", api.typed().session_pause(session.clone(), None, None)).await;
    let refreshed = ok("resume", api.typed().session_resume(session.clone(), Some(true))).await;
    assert!(refreshed.profile_refreshed, "{refreshed:?}");
    assert_eq!(refreshed.profile_drift, ["env.DRIFT_MARK"]);
    assert_eq!(refreshed.outcome, protocol::api::ResumeOutcome::NativeLoad);
    assert!(api.status(&session).await.profile_drift.is_empty(), "adopted");
    let marked = agents()
        .into_iter()
        .any(|pid| String::from_utf8_lossy(&environ(pid)).contains("DRIFT_MARK=adopted"));
    assert!(marked, "the agent runs with the edited profile");
    // Kept across a restart: it is the session's snapshot now.
    drop(api);
    daemon.terminate().await;
    daemon.restart().await;
    let api = daemon.api().await;
    assert!(api.status(&session).await.profile_drift.is_empty());
}

/// A launch that fails for a reason a later attempt can outlive (here the agent exits at
/// start while a file exists) leaves the session `FAILED` but resumable, the reason shown;
/// a resume once the cause is gone launches it and delivers the prompt it was created with.
/// A failed session can still be ended for good; a pause is refused, saying why.
#[tokio::test]
async fn a_crash_at_launch_leaves_the_session_resumable_and_a_resume_fixes_it() {
    let root = tempfile::tempdir().unwrap();
    let flag = root.path().join("broken");
    std::fs::write(&flag, "").unwrap();
    let profile = tether_tests::daemon::fail_while_profile("flaky", &flag);
    let daemon = Daemon::start_with_profiles(&[], &[("flaky.toml", &profile)]).await;
    let api = daemon.api().await;
    let task = ok("task.create", api.typed().task_create("flaky".into(), None)).await.id;
    let workspace = daemon.workspace("f");
    let create = Create {
        prompt: Some("the first words".into()),
        ..Create::new(&task, "flaky", Some(&workspace))
    }
    .send(api.typed());
    let session = ok("task.session.create", create).await.id;
    let mut events = api.subscribe(&session, 0).await;
    let (state, error) = tether_tests::daemon::settled(&mut events).await;
    assert_eq!(state, protocol::api::SessionState::Failed);
    assert!(error.contains("--fail-while"), "the agent's stderr is in the reason: {error}");
    let status = api.status(&session).await;
    assert_eq!(
        (status.is_resumable, status.needs_resume, status.resume_reason.as_str()),
        (true, true, "failed"),
        "{status:?}"
    );
    assert!(status.error.as_deref().is_some_and(|e| e.contains("--fail-while")), "{status:?}");
    let pause = api.typed().session_pause(session.clone(), None, None);
    let pause = tether_tests::daemon::refused("pause a failed session", pause).await;
    assert_eq!(pause.kind, ErrorKind::InvalidState, "{pause:?}");
    assert!(pause.message.contains("FAILED"), "{pause:?}");
    // Still failing: the resume says why, and the session stays resumable.
    let again = api.resume(&session).await.unwrap_err();
    assert!(again.message.contains("--fail-while"), "{again:?}");
    assert!(api.status(&session).await.is_resumable);
    // The cause is gone: a resume launches it, and the prompt it was created with goes out.
    std::fs::remove_file(&flag).unwrap();
    let mut events = api.subscribe_at_end(&session).await;
    let resumed = api.resume(&session).await.unwrap();
    assert_eq!(resumed.outcome, protocol::api::ResumeOutcome::Fresh, "{resumed:?}");
    tether_tests::daemon::until(&mut events, tether_tests::daemon::turn_ended).await;
    let history = api.history(&session).await;
    let prompts: Vec<_> = history.iter().filter(|entry| entry.role == "user").collect();
    assert_eq!(prompts.len(), 1, "{history:?}");
    assert_eq!(prompts[0].content, "the first words");
    assert!(
        history.iter().any(|entry| entry.role == "assistant"
            && entry.content.contains("you said: the first words")),
        "{history:?}"
    );
    let status = api.status(&session).await;
    assert_eq!(
        (status.state, status.is_agent_running, status.error),
        (protocol::api::SessionState::WaitingForInput, true, None)
    );
    let task = ok("task.get", api.typed().task_get(task)).await;
    assert_ne!(task.task.state, "FAILED", "{task:?}");
    // Ended for good on request, failed or not.
    ok("stop", api.typed().session_stop(session.clone())).await;
    assert_eq!(api.status(&session).await.state, protocol::api::SessionState::Completed);
}

// ---- worktrees ------------------------------------------------------------------------

/// A repository with one commit on `main` (holding `README`).
pub(crate) async fn repository(daemon: &Daemon, name: &str) -> std::path::PathBuf {
    let repo = daemon.workspace(name);
    git(&repo, &["init", "-q", "-b", "main"]).await;
    std::fs::write(repo.join("README"), "the project\n").unwrap();
    git(&repo, &["add", "."]).await;
    git(&repo, &["commit", "-q", "-m", "start"]).await;
    repo
}

/// A worktree session of `mock` on `repo`, ready for prompts; its status.
async fn worktree_session(
    api: &Api,
    title: &str,
    repo: &std::path::Path,
    base: Option<&str>,
) -> protocol::api::SessionStatus {
    let task = ok("task.create", api.typed().task_create(title.into(), None)).await.id;
    let row = api.create_worktree(&task, "mock", repo, base).await.unwrap();
    let mut events = api.subscribe(&row.id, 0).await;
    let (state, error) = tether_tests::daemon::settled(&mut events).await;
    assert_eq!(state, protocol::api::SessionState::WaitingForInput, "{error}");
    assert_eq!(row.worktree_branch, api.status(&row.id).await.worktree_branch);
    api.status(&row.id).await
}

fn worktree_of(status: &protocol::api::SessionStatus) -> std::path::PathBuf {
    std::path::PathBuf::from(status.worktree_path.clone().expect("a worktree path"))
}

/// Two sessions on one repository each get a worktree of their own on a branch of their
/// own (named after the task and the session), outside the repository; what the agents
/// write lands in their own worktree only, and the repository's checkout is untouched.
#[tokio::test]
async fn two_sessions_on_one_repository_get_separate_worktrees_and_their_edits_do_not_mix() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let repo = repository(&daemon, "repo").await;
    let one = worktree_session(&api, "Fix the parser", &repo, None).await;
    let two = worktree_session(&api, "Fix the parser", &repo, Some("main")).await;
    let (path_one, path_two) = (worktree_of(&one), worktree_of(&two));
    assert_ne!(path_one, path_two);
    for (status, path) in [(&one, &path_one), (&two, &path_two)] {
        assert!(path.starts_with(daemon.root.path().join("tether/worktrees")), "{path:?}");
        let branch = status.worktree_branch.clone().expect("a branch");
        let short = &status.session_id[status.session_id.len() - 8..];
        assert_eq!(branch, format!("tether/fix-the-parser-{short}"));
        assert_eq!(git(path, &["branch", "--show-current"]).await, branch);
        assert!(path.join("README").exists(), "checked out from main");
    }
    assert_ne!(one.worktree_branch, two.worktree_branch);
    let branches = git(&repo, &["branch", "--list", "tether/*"]).await;
    assert_eq!(branches.lines().count(), 2, "{branches}");
    // Each agent writes through ACP (fs/write_text_file) into its own worktree.
    let a = path_one.join("one.txt");
    let b = path_two.join("two.txt");
    api.ask(&one.session_id, &format!("/write {} from one", a.display())).await;
    api.ask(&two.session_id, &format!("/write {} from two", b.display())).await;
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "from one");
    assert_eq!(std::fs::read_to_string(&b).unwrap(), "from two");
    assert!(!path_one.join("two.txt").exists() && !path_two.join("one.txt").exists());
    assert!(!repo.join("one.txt").exists() && !repo.join("two.txt").exists());
    assert_eq!(git(&repo, &["status", "--porcelain"]).await, "", "the repository is untouched");
    // Committed on one branch, absent from the other.
    git(&path_one, &["add", "one.txt"]).await;
    git(&path_one, &["commit", "-q", "-m", "one"]).await;
    let on_two =
        git(&repo, &["ls-tree", "--name-only", two.worktree_branch.as_deref().unwrap()]).await;
    assert!(!on_two.contains("one.txt"), "{on_two}");
    // Worktree sessions do not hold the repository: an ordinary session may still use it.
    create(&api, &one.task_id, &repo, None).await.expect("the repository itself is free");
    // A base that names nothing is refused before anything is made.
    let bad = api.create_worktree(&one.task_id, "mock", &repo, Some("no-such-branch")).await;
    let bad = bad.unwrap_err();
    assert_eq!((bad.kind, bad.field.as_deref()), (ErrorKind::InvalidParams, Some("base")));
    let not_repo = daemon.workspace("plain");
    let plain = api.create_worktree(&one.task_id, "mock", &not_repo, None).await.unwrap_err();
    assert_eq!(plain.kind, ErrorKind::InvalidParams, "{plain:?}");
    assert!(plain.message.contains("not in a git repository"), "{plain:?}");
    assert_eq!(git(&repo, &["branch", "--list", "tether/*"]).await.lines().count(), 2);
}

/// A worktree directory that went away is rebuilt from its branch on resume, with the
/// session's commits; the session carries on natively. With the branch gone too, the
/// resume says there is nothing to rebuild from.
#[tokio::test]
async fn a_deleted_worktree_is_rebuilt_from_its_branch_with_the_sessions_commits() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let repo = repository(&daemon, "repo").await;
    let status = worktree_session(&api, "rebuild", &repo, None).await;
    let session = status.session_id.clone();
    let path = worktree_of(&status);
    let file = path.join("work.txt");
    api.ask(&session, &format!("/write {} committed work", file.display())).await;
    git(&path, &["add", "work.txt"]).await;
    git(&path, &["commit", "-q", "-m", "the session's work"]).await;
    let head = git(&path, &["rev-parse", "HEAD"]).await;
    ok("pause", api.typed().session_pause(session.clone(), None, None)).await;
    std::fs::remove_dir_all(&path).unwrap();
    let resumed = api.resume(&session).await.unwrap();
    assert_eq!(resumed.state, protocol::api::SessionState::WaitingForInput, "{resumed:?}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "committed work");
    assert_eq!(git(&path, &["rev-parse", "HEAD"]).await, head);
    assert_eq!(git(&path, &["branch", "--show-current"]).await, status.worktree_branch.unwrap());
    assert!(api.ask(&session, "/recall").await.contains("remembered"), "the agent carries on");
    // Both gone: nothing to rebuild from, said plainly; nothing launched.
    let other = worktree_session(&api, "gone", &repo, None).await;
    ok("pause", api.typed().session_pause(other.session_id.clone(), None, None)).await;
    let other_path = worktree_of(&other);
    std::fs::remove_dir_all(&other_path).unwrap();
    git(&repo, &["worktree", "prune"]).await;
    git(&repo, &["branch", "-D", other.worktree_branch.as_deref().unwrap()]).await;
    let refused = api.resume(&other.session_id).await.unwrap_err();
    assert_eq!(refused.kind, ErrorKind::InvalidState, "{refused:?}");
    assert!(refused.message.contains("nothing to rebuild it from"), "{refused:?}");
    assert!(api.status(&other.session_id).await.is_resumable, "still resumable once fixed");
}

/// Deleting a worktree session removes its worktree and keeps its branch; uncommitted work
/// refuses the delete (naming the files) unless forced; `delete_branch` takes the branch.
#[tokio::test]
async fn delete_removes_the_worktree_keeps_the_branch_and_never_loses_uncommitted_work() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let repo = repository(&daemon, "repo").await;
    let status = worktree_session(&api, "delete me", &repo, None).await;
    let (session, path) = (status.session_id.clone(), worktree_of(&status));
    let branch = status.worktree_branch.clone().unwrap();
    std::fs::write(path.join("draft.txt"), "not committed").unwrap();
    let delete = api.typed().session_delete(session.clone(), None, None);
    let refused = tether_tests::daemon::refused("a dirty worktree", delete).await;
    assert_eq!(refused.kind, ErrorKind::Conflict, "{refused:?}");
    assert!(refused.message.contains("draft.txt"), "names the files: {refused:?}");
    assert!(path.join("draft.txt").exists() && api.status(&session).await.is_agent_running);
    ok("delete", api.typed().session_delete(session.clone(), Some(true), None)).await;
    assert!(!path.exists(), "the worktree is gone");
    assert_eq!(git(&repo, &["branch", "--list", &branch]).await.trim_start_matches("* "), branch);
    assert!(!git(&repo, &["worktree", "list"]).await.contains(path.to_str().unwrap()));
    let status = worktree_session(&api, "and the branch", &repo, None).await;
    let branch = status.worktree_branch.clone().unwrap();
    ok("delete", api.typed().session_delete(status.session_id.clone(), None, Some(true))).await;
    assert_eq!(git(&repo, &["branch", "--list", &branch]).await, "", "the branch went too");
}

/// A profile with `[workspace] repo = …, base = …` gives its sessions worktrees of that
/// repository from that base without being asked (no workspace_path needed); a create
/// that says `worktree: false` works in its workspace itself.
#[tokio::test]
async fn a_profiles_workspace_section_makes_worktrees_by_default() {
    let root = tempfile::tempdir().unwrap();
    let repo = root.path().join("project");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]).await;
    git(&repo, &["commit", "-q", "--allow-empty", "-m", "start"]).await;
    git(&repo, &["checkout", "-q", "-b", "develop"]).await;
    std::fs::write(repo.join("DEVELOP"), "only on develop\n").unwrap();
    git(&repo, &["add", "."]).await;
    git(&repo, &["commit", "-q", "-m", "develop"]).await;
    git(&repo, &["checkout", "-q", "main"]).await;
    let profile = format!(
        "id = \"wt\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n[workspace]\nrepo = \"{}\"\nbase = \"develop\"\n",
        repo.display()
    );
    let daemon = Daemon::start_with_profiles(&[], &[("wt.toml", &profile)]).await;
    let api = daemon.api().await;
    let task = ok("task.create", api.typed().task_create("by profile".into(), None)).await.id;
    let create = Create::new(&task, "wt", None).send(api.typed());
    let row = ok("task.session.create", create).await;
    let branch = row.worktree_branch.clone().expect("a worktree by default");
    let path = std::path::PathBuf::from(&row.workspace_path);
    assert!(path.join("DEVELOP").exists(), "made from the profile's base");
    assert_eq!(git(&path, &["branch", "--show-current"]).await, branch);
    let (state, error) = tether_tests::daemon::settled(&mut api.subscribe(&row.id, 0).await).await;
    assert_eq!(state, protocol::api::SessionState::WaitingForInput, "{error}");
    let plain_dir = daemon.workspace("plain");
    let create = Create { worktree: Some(false), ..Create::new(&task, "wt", Some(&plain_dir)) }
        .send(api.typed());
    let plain = ok("task.session.create", create).await;
    assert_eq!(
        (plain.worktree_branch, plain.workspace_path.as_str()),
        (None, plain_dir.to_str().unwrap())
    );
    // Without the profile's repo and without a workspace, there is nothing to work in.
    let task = ok("task.create", api.typed().task_create("nowhere".into(), None)).await.id;
    let create = Create::new(&task, "mock", None).send(api.typed());
    let refused = tether_tests::daemon::refused("no workspace", create).await;
    assert_eq!(
        (refused.kind, refused.field.as_deref()),
        (ErrorKind::InvalidParams, Some("workspace_path"))
    );
}

/// Killed after it made a session's worktree and before it stored the session, the daemon
/// finds the worktree without a session when it starts again and removes it (the branch,
/// the durable part, stays); nothing else remembers the half-made session.
#[tokio::test]
async fn a_worktree_made_by_a_create_cut_short_is_removed_at_restart() {
    let mut daemon =
        Daemon::start_with_env(&[], &[], &[("TETHER_FAULT", "create.worktree_made")]).await;
    let api = daemon.api().await;
    let repo = repository(&daemon, "repo").await;
    let task = ok("task.create", api.typed().task_create("cut short".into(), None)).await.id;
    let create = Create { worktree: Some(true), ..Create::new(&task, "mock", Some(&repo)) }
        .send(api.typed());
    let cut = create.await;
    assert!(cut.is_err(), "the daemon died before answering: {cut:?}");
    assert!(!daemon.wait_exit().await.success());
    let worktrees = daemon.root.path().join("tether/worktrees");
    let made: Vec<_> = std::fs::read_dir(&worktrees).unwrap().flatten().collect();
    assert_eq!(made.len(), 1, "the fault point is after the worktree was made");
    let branches = ["for-each-ref", "--format=%(refname:short)", "refs/heads/tether/"];
    let branch = git(&repo, &branches).await;
    assert_eq!(branch.lines().count(), 1);
    daemon.restart_with_env(&[]).await;
    assert_eq!(std::fs::read_dir(&worktrees).unwrap().count(), 0, "removed at recovery");
    assert!(!git(&repo, &["worktree", "list"]).await.contains("tether/worktrees"));
    assert_eq!(git(&repo, &branches).await, branch, "the branch stays");
    let api = daemon.api().await;
    assert!(ok("list", api.typed().session_list(None, None, None)).await.is_empty());
}

/// An interrupted `delete_branch` left a `tether/*` branch behind for
/// good. The deletion is recorded before it begins, and the restarted daemon finishes it
/// (by the recorded name only) before it serves.
#[tokio::test]
async fn a_branch_deletion_cut_short_is_finished_at_restart() {
    let fault = [("TETHER_FAULT", "delete.worktree_removed")];
    let mut daemon = Daemon::start_with_env(&[], &[], &fault).await;
    let api = daemon.api().await;
    let repo = repository(&daemon, "repo").await;
    let status = worktree_session(&api, "Cut short", &repo, None).await;
    let branch = status.worktree_branch.clone().expect("a branch");
    let session = status.session_id.clone();
    ok("stop", api.typed().session_stop(session.clone())).await;
    let cut = api.typed().session_delete(session, None, Some(true)).await;
    assert!(cut.is_err(), "the daemon died between the worktree and the branch");
    tether_tests::within("the supervisor to die at the fault point", daemon.wait_exit()).await;
    let branches = git(&repo, &["branch", "--list", "tether/*"]).await;
    assert!(branches.contains(&branch), "the kill left the branch: {branches}");
    daemon.restart_with_env(&[]).await;
    // Recovery runs before the API serves.
    let _api = daemon.api().await;
    let branches = git(&repo, &["branch", "--list", "tether/*"]).await;
    assert!(!branches.contains(&branch), "finished at restart: {branches}");
    assert!(git(&repo, &["branch", "--list", "main"]).await.contains("main"), "ours only");
}

/// Worktree sessions created at once
/// on one repository all get their worktree — git's own `worktree add`s race on the
/// repository's metadata, so Tether makes them one at a time per repository.
#[tokio::test]
async fn worktrees_made_at_once_on_one_repository_all_succeed() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let repo = repository(&daemon, "repo").await;
    let task = ok("task.create", api.typed().task_create("at once".into(), None)).await;
    let mut clients = Vec::new();
    for _ in 0..12 {
        clients.push(daemon.api().await);
    }
    let creates =
        clients.iter().map(|client| client.create_worktree(&task.id, "mock", &repo, None));
    let made = futures_util::future::join_all(creates).await;
    let failed: Vec<_> = made.iter().filter_map(|made| made.as_ref().err()).collect();
    assert!(failed.is_empty(), "{failed:?}");
    let listed = tether_tests::git(&repo, &["worktree", "list", "--porcelain"]).await;
    assert_eq!(listed.lines().filter(|line| line.starts_with("worktree ")).count(), 13, "{listed}");
}
