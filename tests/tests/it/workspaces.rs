//! Issue 16 (part), workspaces: a workspace directory is held by at most one live session
//! unless the caller says `shared: true`; the second gets `conflict` naming the holder.

use protocol::api::ApiClient;
use protocol::errors::ErrorKind;
use tether_tests::daemon::{Api, ApiError, Daemon, call, ok};

async fn create(
    api: &Api,
    task: &str,
    workspace: &std::path::Path,
    shared: Option<bool>,
) -> Result<String, ApiError> {
    let create = api.typed().session_create(
        task.to_owned(),
        "mock".into(),
        workspace.to_str().unwrap().to_owned(),
        None,
        None,
        shared,
    );
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
