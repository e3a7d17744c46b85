//! The data directory's own rules, seen from outside: one daemon per data directory (a
//! second is refused before it touches anything, and clients find the one that runs), and
//! no agent is given a directory that reaches it; a database that cannot be written is
//! refused at start, and storage errors name the file.

use std::process::Stdio;

use protocol::api::{ApiClient, SessionState};
use protocol::errors::ErrorKind;
use serde_json::json;
use tether_tests::daemon::{Create, Daemon, call};
use tether_tests::sdk::{SdkClient, prompt};
use tether_tests::{within, workspace_bin};

/// `supervisor serve` on the daemon's own data directory, another port (while the daemon
/// runs, or after it stopped): (exit code, stdout, stderr).
async fn second_serve(daemon: &Daemon) -> (i32, String, String) {
    let output = tokio::process::Command::new(workspace_bin("supervisor"))
        .args(["serve", "--listen", "127.0.0.1:0", "--home"])
        .arg(daemon.data_dir())
        .env("HOME", daemon.home())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = within("the second daemon to give up", output).await.expect("it runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_second_daemon_on_one_data_directory_is_refused_naming_the_first() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("one")).await;
    let sidecar = daemon.agentctl_pid(&session);

    let (code, out, err) = second_serve(&daemon).await;
    assert_ne!(code, 0, "refused: {out} {err}");
    assert!(!out.contains("serving"), "it never served: {out}");
    assert!(err.contains(&daemon.url), "names where the first serves: {err}");
    let pid = daemon.pid().expect("the first runs").to_string();
    assert!(err.contains(&pid), "names the first's pid: {err}");
    assert!(err.contains("one daemon per data directory"), "{err}");

    // Nothing of the first was touched: its sidecar is the same process, its session
    // answers a prompt as before.
    assert_eq!(daemon.agentctl_pid(&session), sidecar);
    let reply = api.ask(&session, "still mine").await;
    assert!(reply.contains("still mine"), "{reply}");
    assert_eq!(api.status(&session).await.state, SessionState::WaitingForInput);
}

#[tokio::test]
async fn clients_without_a_url_find_the_daemon_of_their_data_directory() {
    let daemon = Daemon::start(&[]).await;
    let data = daemon.data_dir();
    let home = daemon.home().to_str().unwrap().to_owned();
    let env = [("TETHER_HOME", data.to_str().unwrap()), ("HOME", home.as_str())];
    // The CLI, as people run it: no --url, no TETHER_URL.
    let output = tokio::process::Command::new(workspace_bin("supervisor"))
        .args(["sessions", "list", "--json"])
        .envs(env)
        .env_remove("TETHER_URL")
        .stdin(Stdio::null())
        .output();
    let output = within("the CLI", output).await.expect("it runs");
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "found the daemon: {err}");

    // The face, as an editor configures it (README: `supervisor acp --agent mock`): it
    // talks to the running daemon, wherever it listens, and starts none of its own.
    let workspace = daemon.workspace("face");
    let mut client =
        SdkClient::spawn(&workspace_bin("supervisor"), &["acp", "--agent", "mock"], &env);
    client.call("initialize", json!({"protocolVersion": 1})).await.unwrap();
    let new = client.call("session/new", json!({"cwd": workspace, "mcpServers": []})).await;
    let session = new.unwrap()["sessionId"].as_str().expect("a session id").to_owned();
    let answer = client.call("session/prompt", prompt(&session, "hello")).await.unwrap();
    assert_eq!(answer["stopReason"], "end_turn");
    client.close().await;
    let status = daemon.api().await.status(&session).await;
    assert_eq!(status.state, SessionState::WaitingForInput, "the first daemon has it");
    assert!(!data.join("daemon.log").exists(), "the face started no daemon of its own");
}

#[tokio::test]
async fn a_workspace_around_the_data_directory_is_refused_naming_it() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let data = daemon.data_dir();
    // The test's root holds the data directory (as `~` holds `~/.local/share/tether`).
    for workspace in [daemon.home().to_owned(), std::path::PathBuf::from("/")] {
        let refused = api.create_session("mock", &workspace).await.unwrap_err();
        assert_eq!(refused.kind, ErrorKind::InvalidParams, "{refused:?}");
        assert_eq!(refused.field.as_deref(), Some("workspace_path"));
        assert!(refused.message.contains("contains Tether's data directory"), "{refused:?}");
        assert!(refused.message.contains(data.to_str().unwrap()), "{refused:?}");
    }
    // An extra directory the agent is given is held to the same rule.
    let task = api.typed().task_create("extra".into(), None).await.unwrap();
    let mut create = Create::new(&task.id, "mock", Some(&daemon.workspace("extra")));
    create.additional_directories = Some(vec![daemon.home().to_str().unwrap().to_owned()]);
    let refused = call("task.session.create", create.send(api.typed())).await.unwrap_err();
    assert_eq!(refused.field.as_deref(), Some("additional_directories"), "{refused:?}");
    assert!(refused.message.contains("contains Tether's data directory"), "{refused:?}");
    // A project beside the data directory is fine.
    api.ready_session("mock", &daemon.workspace("project")).await;
}

fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn a_read_only_database_stops_the_start_naming_the_file_and_stays_read_only() {
    use std::os::unix::fs::PermissionsExt;
    let mut daemon = Daemon::start(&[]).await;
    daemon.terminate().await;
    let db = daemon.data_dir().join("state.db");
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o444)).unwrap();
    let (code, out, err) = second_serve(&daemon).await;
    assert_ne!(code, 0, "refused: {out} {err}");
    assert!(!out.contains("serving"), "{out}");
    assert!(err.contains(db.to_str().unwrap()), "names the file: {err}");
    assert!(err.contains("read-only"), "says why: {err}");
    assert_eq!(mode(&db), 0o444, "not made writable behind the operator's back");
    // Writable again: it starts.
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o600)).unwrap();
    daemon.restart().await;
    daemon.api().await.typed().task_create("back".into(), None).await.unwrap();
}

#[tokio::test]
async fn a_locked_database_fails_a_call_with_a_storage_error_naming_the_file() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let db = daemon.data_dir().join("state.db");
    // Another process's writer holds the database for longer than the daemon waits.
    let holder = rusqlite::Connection::open(&db).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE;").unwrap();
    let refused =
        call("task.create", api.typed().task_create("locked".into(), None)).await.unwrap_err();
    assert_eq!(refused.kind, ErrorKind::Storage, "{refused:?}");
    assert!(refused.message.contains(db.to_str().unwrap()), "names the file: {refused:?}");
    assert!(refused.message.contains("locked"), "{refused:?}");
    holder.execute_batch("COMMIT;").unwrap();
    drop(holder);
    call("task.create", api.typed().task_create("free".into(), None)).await.unwrap();
}

#[tokio::test]
async fn a_delete_cut_short_by_a_kill_leaves_no_files_after_the_restart() {
    let fault = [("TETHER_FAULT", "delete.rows_removed")];
    let mut daemon = Daemon::start_with_env(&[], &[], &fault).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("cut")).await;
    api.ask(&session, "something to keep").await;
    call("stop", api.typed().session_stop(session.clone())).await.unwrap();
    let cut = api.typed().session_delete(session.clone(), None, None).await;
    assert!(cut.is_err(), "the daemon died between the rows and the files");
    within("the supervisor to die at the fault point", daemon.wait_exit()).await;
    assert!(daemon.session_dir(&session).exists(), "the kill left the files");
    daemon.restart_with_env(&[]).await;
    // Recovery runs before the API serves.
    let api = daemon.api().await;
    assert!(!daemon.session_dir(&session).exists(), "removed at restart");
    let listed = api.typed().session_list(None, None, None).await.unwrap();
    assert!(listed.is_empty(), "{listed:?}");
}
