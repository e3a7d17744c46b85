//! Hardening, each point tried from outside — a weak token, a framed page,
//! secrets within an agent's reach, damaged files, odd request ids, escaped descendants.

use std::time::Duration;

use protocol::api::ApiClient;
use serde_json::json;
use tether_tests::browser;
use tether_tests::daemon::{Api, Daemon};

/// Arguments, environment, and what the refusal says.
type ServeCase = (&'static [&'static str], &'static [(&'static str, &'static str)], &'static str);

/// How long a refused start may take before the test calls it "it started".
const START_REFUSAL_BOUND: Duration = Duration::from_secs(20);

/// Starts `supervisor serve` beyond loopback with `args` and `env`, and returns its exit
/// code and stderr, or `None` if it is still running after [`START_REFUSAL_BOUND`] (then it
/// is killed: it started and served).
async fn serve_outcome(args: &[&str], env: &[(&str, &str)]) -> Option<(i32, String)> {
    let home = tempfile::tempdir().unwrap();
    let mut command = tokio::process::Command::new(tether_tests::workspace_bin("supervisor"));
    command
        .args(["serve", "--listen", "0.0.0.0:0", "--home"])
        .arg(home.path().join("tether"))
        .args(args)
        .env_remove("TETHER_AUTH_TOKEN")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let child = command.spawn().unwrap();
    match tokio::time::timeout(START_REFUSAL_BOUND, child.wait_with_output()).await {
        Ok(output) => {
            let output = output.unwrap();
            Some((
                output.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&output.stderr).into(),
            ))
        }
        Err(_) => None,
    }
}

/// Point 1: an empty or whitespace token (a script's unset `$TOKEN`) beyond loopback started
/// the daemon, and a client offering the subprotocol `tether-token.` (or `tether-token.20`)
/// got the whole API. Now a token is checked once, wherever it comes from: empty, short or
/// spaced tokens stop the start naming their source, and an empty offered token never
/// matches.
#[tokio::test]
async fn an_empty_or_weak_token_is_refused_at_start_naming_its_source() {
    let cases: [ServeCase; 4] = [
        (&["--auth-token", ""], &[], "the API token from --auth-token is empty"),
        (&[], &[("TETHER_AUTH_TOKEN", " ")], "the API token from TETHER_AUTH_TOKEN is empty"),
        (&[], &[("TETHER_AUTH_TOKEN", "")], "the API token from TETHER_AUTH_TOKEN is empty"),
        (
            &["--auth-token", "hunter2"],
            &[],
            "the API token from --auth-token has 7 characters; it needs at least 16",
        ),
    ];
    for (args, env, said) in cases {
        let outcome = serve_outcome(args, env).await;
        let Some((code, err)) = outcome else {
            panic!("serve {args:?} {env:?} started and served");
        };
        assert_ne!(code, 0, "{err}");
        assert!(err.contains(said), "serve {args:?} {env:?}: {err}");
    }
    // A file named in config.toml is named as that, not as the flag.
    let home = tempfile::tempdir().unwrap();
    let data = home.path().join("tether");
    std::fs::create_dir_all(&data).unwrap();
    let missing = home.path().join("no-such-token");
    std::fs::write(
        data.join("config.toml"),
        format!("auth_token_file = \"{}\"\n", missing.display()),
    )
    .unwrap();
    let output = tokio::process::Command::new(tether_tests::workspace_bin("supervisor"))
        .args(["serve", "--listen", "127.0.0.1:0", "--home"])
        .arg(&data)
        .env_remove("TETHER_AUTH_TOKEN")
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{err}");
    assert!(
        err.contains(&format!("auth_token_file {} (set in {}", missing.display(), data.display())),
        "{err}"
    );
    assert!(!err.contains("--auth-token-file"), "not named as the flag: {err}");

    // A daemon with a real token: an empty or blank token offered the browser's way is
    // refused like any wrong one; the real one, offered the same way, is taken.
    let token = "a-real-token-0123456789";
    let daemon = Daemon::start_with_env(&[], &[], &[("TETHER_AUTH_TOKEN", token)]).await;
    let host = daemon.url.trim_start_matches("ws://").trim_end_matches('/').to_owned();
    for offered in ["tether, tether-token.", "tether, tether-token.20"] {
        assert_eq!(upgrade_status(&host, offered).await, 401, "{offered}");
    }
    let real = format!("tether, tether-token.{}", hex(token));
    assert_eq!(upgrade_status(&host, &real).await, 101, "the real token opens it");
}

/// The status of a WebSocket upgrade of `/` offering the subprotocols `offered`.
async fn upgrade_status(host: &str, offered: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let request = format!(
        "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Protocol: {offered}\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap() == 1 {
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    head.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or_else(|| panic!("{head}"))
}

fn hex(text: &str) -> String {
    text.bytes().map(|byte| format!("{byte:02x}")).collect()
}

/// Point 2: any origin could frame the page, and the framed page passed the Origin check,
/// so a transparent overlay could make a user click Allow, Start session or Delete. Now the
/// page says `frame-ancestors 'none'` (and `X-Frame-Options: DENY`): framed from another
/// origin in a real browser, it does not load; opened directly, it works (the other UI
/// tests drive it under the same policy).
#[tokio::test]
async fn the_page_refuses_to_be_framed_by_another_origin() {
    let Some(browser) = browser::start("framed").await else { return };
    let daemon = Daemon::start(&[]).await;
    let page = daemon.url.replace("ws://", "http://") + "/";
    let host = daemon.url.trim_start_matches("ws://").trim_end_matches('/').to_owned();
    // Another origin frames it: `localhost` is not `127.0.0.1` to a browser (and both are
    // local, so the browser's private-network rules play no part). The framing page is
    // whatever `localhost` serves (here the same daemon), with a frame added.
    let other_origin = page.replace("127.0.0.1", "localhost");
    assert_ne!(other_origin, page);
    browser.open(&other_origin).await;
    let loaded = browser
        .run_async(
            "const [url, done] = arguments; const frame = document.createElement('iframe'); \
             frame.onload = () => done(true); frame.src = url; document.body.append(frame);",
            json!([page]),
        )
        .await;
    assert_eq!(loaded, json!(true), "the frame finished loading (or failing)");
    browser.switch_to_frame(Some(0)).await;
    let inside = browser
        .run("return [location.href, document.querySelector('#connection') !== null, document.body ? document.body.innerText.slice(0, 300) : ''];", json!([]))
        .await;
    browser.switch_to_frame(None).await;
    browser.screenshot("framed").await;
    assert_eq!(
        inside[1],
        json!(false),
        "the page rendered inside another origin's frame: {inside}"
    );
    // And the headers that say so.
    let (status, headers, _) = browser::http(&host, "GET", "/", &[], None).await;
    assert_eq!(status, 200);
    let header = |name: &str| {
        headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.clone())
            .unwrap_or_default()
    };
    assert!(header("content-security-policy").contains("frame-ancestors 'none'"), "{headers:?}");
    assert_eq!(header("x-frame-options"), "DENY");
    assert_eq!(header("referrer-policy"), "no-referrer");
    assert_eq!(header("x-content-type-options"), "nosniff");
}

/// Point 6: one unparsable history line vanished silently from `task.session.history`, and
/// one byte that is not UTF-8 made the whole history unreadable (`internal: stream did not
/// contain valid UTF-8`, no path, no line), new turns included. Now each damaged line is
/// skipped and reported with its path and line (a log line, and a timeline row), and the
/// rest — new turns too — reads as before.
#[tokio::test]
async fn a_damaged_history_line_is_reported_with_path_and_line_and_the_rest_kept() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("damaged")).await;
    api.ask(&session, "first").await;
    api.ask(&session, "second").await;
    let whole = api.history(&session).await;
    assert_eq!(whole.len(), 4, "{whole:?}");
    // The disk goes bad while the session is idle: line 2 gets a byte that is not UTF-8,
    // and a garbage line appears after line 3.
    let path = daemon.session_dir(&session).join("history.jsonl");
    let text = std::fs::read(&path).unwrap();
    let mut lines: Vec<Vec<u8>> =
        text.split(|&b| b == b'\n').filter(|l| !l.is_empty()).map(<[u8]>::to_vec).collect();
    assert_eq!(lines.len(), 4);
    let quote = lines[1].iter().rposition(|&b| b == b'"').unwrap();
    lines[1][quote - 1] = 0xff;
    lines.insert(3, b"\x00\x00garbage".to_vec());
    let mut damaged = lines.join(&b'\n');
    damaged.push(b'\n');
    std::fs::write(&path, damaged).unwrap();

    let kept = api.history(&session).await;
    let seqs: Vec<u64> = kept.iter().map(|entry| entry.seq).collect();
    assert_eq!(seqs, [1, 3, 4], "the damaged entry alone is skipped");
    // New turns are read as before.
    api.ask(&session, "third").await;
    let after = api.history(&session).await;
    assert_eq!(after.len(), 5, "{after:?}");
    assert_eq!(after[3].content, "third");
    // Said where: path and line, once each in the timeline however often it is read.
    let timeline = api.typed().session_timeline(session.clone(), None).await.unwrap();
    let errors: Vec<String> = timeline
        .entries
        .iter()
        .filter_map(|entry| match &entry.event {
            protocol::api::TimelineEvent::Error { message } => Some(message.clone()),
            _ => None,
        })
        .collect();
    let at = |line: usize| format!("{}:{line}: a damaged history line was skipped", path.display());
    assert_eq!(errors.iter().filter(|e| e.starts_with(&at(2))).count(), 1, "{errors:?}");
    assert_eq!(errors.iter().filter(|e| e.starts_with(&at(4))).count(), 1, "{errors:?}");
    assert!(errors.iter().any(|e| e.contains("not UTF-8")), "{errors:?}");
}

/// `supervisor serve --home HOME` on loopback, expected to refuse to start: its stderr.
async fn refused_start(home: &std::path::Path) -> String {
    let output = tokio::process::Command::new(tether_tests::workspace_bin("supervisor"))
        .args(["serve", "--listen", "127.0.0.1:0", "--home"])
        .arg(home)
        .env_remove("TETHER_AUTH_TOKEN")
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "it started: {err}");
    err
}

/// Points 8 and 9: a database that is not one ("file is not a database", no path), a
/// locked one (the daemon served, then refused prompts as `conflict`), and an unwritable
/// `sessions/` (`internal: Permission denied`, no path). Now a database that cannot be
/// opened or written stops the start naming the file and the cause, and a storage failure
/// while serving is its own kind, `storage`, naming the path.
#[tokio::test]
async fn storage_failures_name_the_file_and_have_their_own_kind() {
    // Not a database.
    let root = tempfile::tempdir().unwrap();
    let home = root.path().join("tether");
    std::fs::create_dir_all(&home).unwrap();
    let db = home.join("state.db");
    std::fs::write(&db, vec![b'x'; 4096]).unwrap();
    let err = refused_start(&home).await;
    assert!(err.contains(&format!("cannot open the database {}", db.display())), "{err}");
    assert!(err.contains("file is not a database"), "{err}");

    // Locked by another process for writing: said at start (after the busy timeout), not at
    // the first prompt.
    std::fs::remove_file(&db).unwrap();
    let mut daemon = Daemon::start(&[]).await;
    let home = daemon.root.path().join("tether");
    let db = home.join("state.db");
    daemon.terminate().await;
    let locker = rusqlite::Connection::open(&db).unwrap();
    locker.execute_batch("BEGIN EXCLUSIVE;").unwrap();
    let err = refused_start(&home).await;
    assert!(err.contains(&format!("{}", db.display())), "{err}");
    assert!(err.contains("database is locked"), "{err}");
    drop(locker);

    // `sessions/` cannot hold a session's directory (a file stands there; root ignores
    // modes): the create is refused as `storage`, naming the path.
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let sessions = daemon.root.path().join("tether/sessions");
    std::fs::remove_dir_all(&sessions).unwrap();
    std::fs::write(&sessions, b"").unwrap();
    let refused = api.create_session("mock", &daemon.workspace("storage")).await.unwrap_err();
    assert_eq!(refused.kind, protocol::errors::ErrorKind::Storage, "{refused:?}");
    assert!(refused.message.contains(&sessions.display().to_string()), "{refused:?}");
}

/// A bare WebSocket client (RFC 6455 text frames), for messages a JSON-RPC library will not
/// send.
struct RawWs {
    stream: tokio::net::TcpStream,
}

impl RawWs {
    async fn connect(host: &str) -> RawWs {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
        let request = format!(
            "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap() == 1 {
            head.push(byte[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
        RawWs { stream }
    }

    /// Sends one masked text frame.
    async fn send(&mut self, text: &str) {
        use tokio::io::AsyncWriteExt;
        let payload = text.as_bytes();
        let mut frame = vec![0x81u8];
        match payload.len() {
            len if len < 126 => frame.push(0x80 | len as u8),
            len => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(len as u16).to_be_bytes());
            }
        }
        let mask = [0x37u8, 0xfa, 0x21, 0x3d];
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(at, byte)| byte ^ mask[at % 4]));
        self.stream.write_all(&frame).await.unwrap();
    }

    /// The next text message (pings and other control frames are skipped).
    async fn receive(&mut self) -> String {
        use tokio::io::AsyncReadExt;
        loop {
            let mut head = [0u8; 2];
            self.stream.read_exact(&mut head).await.unwrap();
            let len = match head[1] & 0x7f {
                126 => {
                    let mut len = [0u8; 2];
                    self.stream.read_exact(&mut len).await.unwrap();
                    u16::from_be_bytes(len) as usize
                }
                127 => {
                    let mut len = [0u8; 8];
                    self.stream.read_exact(&mut len).await.unwrap();
                    u64::from_be_bytes(len) as usize
                }
                len => len as usize,
            };
            let mut payload = vec![0u8; len];
            self.stream.read_exact(&mut payload).await.unwrap();
            if head[0] & 0x0f == 0x1 {
                return String::from_utf8(payload).unwrap();
            }
        }
    }
}

/// Sends `message` and reads its refusal: `-32600` with `id: null` (what is not a request
/// the API serves); returns the refusal's message.
async fn refused_as_no_request(ws: &mut RawWs, message: &str) -> String {
    ws.send(message).await;
    // Bounded only so that a missing answer fails the test instead of hanging it.
    let answer = tokio::time::timeout(START_REFUSAL_BOUND, ws.receive())
        .await
        .unwrap_or_else(|_| panic!("no answer to {message}"));
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["id"], serde_json::Value::Null, "{message}: {answer}");
    assert_eq!(answer["error"]["code"], -32600, "{message}: {answer}");
    answer["error"]["message"].as_str().unwrap_or_default().to_owned()
}

/// Point 10: a request whose `id` is an object, an array, a float or over 2^64 got no
/// answer at all (the client waits forever), and a notification to a method that changes
/// state was dropped unseen. Now both are answered `-32600` with `id: null`, and the
/// notification changes nothing.
#[tokio::test]
async fn odd_ids_and_notifications_are_answered_not_dropped() {
    let daemon = Daemon::start(&[]).await;
    let host = daemon.url.trim_start_matches("ws://").trim_end_matches('/').to_owned();
    let mut ws = RawWs::connect(&host).await;
    let odd = [
        r#"{"jsonrpc":"2.0","id":{"a":1},"method":"task.list","params":{}}"#,
        r#"{"jsonrpc":"2.0","id":[1],"method":"task.list","params":{}}"#,
        r#"{"jsonrpc":"2.0","id":1.5,"method":"task.list","params":{}}"#,
        r#"{"jsonrpc":"2.0","id":18446744073709551616,"method":"task.list","params":{}}"#,
        r#"{"jsonrpc":"2.0","method":"task.create","params":{"title":"by notification"}}"#,
    ];
    for message in odd {
        let refusal = refused_as_no_request(&mut ws, message).await;
        assert!(refusal.contains("needs an id"), "{refusal}");
    }
    // The notification created nothing.
    ws.send(r#"{"jsonrpc":"2.0","id":9,"method":"task.list","params":{}}"#).await;
    let answer: serde_json::Value = serde_json::from_str(&ws.receive().await).unwrap();
    assert_eq!(answer["id"], 9);
    assert_eq!(answer["result"], json!([]), "{answer}");
}

/// A 16-character token of one repeated character, or `password12345678`, was accepted
/// beyond loopback. A token easy to guess stops the start, saying how to make one.
#[tokio::test]
async fn a_guessable_token_is_refused_at_start_saying_how_to_make_one() {
    let cases: [ServeCase; 2] = [
        (&[], &[("TETHER_AUTH_TOKEN", "aaaaaaaaaaaaaaaa")], "TETHER_AUTH_TOKEN is easy to guess"),
        (&["--auth-token", "password12345678"], &[], "--auth-token is easy to guess"),
    ];
    for (args, env, said) in cases {
        let Some((code, err)) = serve_outcome(args, env).await else {
            panic!("serve {args:?} {env:?} started and served");
        };
        assert_ne!(code, 0, "{err}");
        assert!(err.contains(said), "serve {args:?} {env:?}: {err}");
        assert!(err.contains("openssl rand -hex 32"), "{err}");
    }
}

/// A request with `"id": null` was run (a `task.create` made a task) and answered as if
/// the id were one; an id that is a negative integer was refused as if it were not an
/// integer. A null id is refused and runs nothing; the refusal of a negative one says so.
#[tokio::test]
async fn a_null_id_runs_nothing_and_a_negative_one_is_refused_saying_why() {
    let daemon = Daemon::start(&[]).await;
    let host = daemon.url.trim_start_matches("ws://").trim_end_matches('/').to_owned();
    let mut ws = RawWs::connect(&host).await;
    let cases = [
        (r#"{"jsonrpc":"2.0","id":null,"method":"task.create","params":{"title":"null"}}"#, "null"),
        (
            r#"{"jsonrpc":"2.0","id":-7,"method":"task.create","params":{"title":"neg"}}"#,
            "negative",
        ),
    ];
    for (message, named) in cases {
        let refusal = refused_as_no_request(&mut ws, message).await;
        assert!(refusal.contains(named), "the refusal names {named} ids: {refusal}");
    }
    ws.send(r#"{"jsonrpc":"2.0","id":9,"method":"task.list","params":{}}"#).await;
    let answer: serde_json::Value = serde_json::from_str(&ws.receive().await).unwrap();
    assert_eq!(answer["id"], 9);
    assert_eq!(answer["result"], json!([]), "nothing was created: {answer}");
}

/// Point 12 (first part): there was no way to delete a task (2,394 were left after a soak).
/// `task.delete` removes a task and every session of it, and is refused, changing nothing,
/// while one of them is live.
#[tokio::test]
async fn a_task_is_deleted_with_its_sessions_but_not_while_one_is_live() {
    use tether_tests::daemon::{Create, ok};
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let task = ok("task.create", api.typed().task_create("to delete".into(), None)).await;
    let mut sessions = Vec::new();
    for name in ["one", "two"] {
        let workspace = daemon.workspace(name);
        let row = Create::new(&task.id, "mock", Some(&workspace)).send(api.typed()).await.unwrap();
        let mut events = api.subscribe(&row.id, 0).await;
        tether_tests::daemon::settled(&mut events).await;
        sessions.push(row.id);
    }
    api.ask(&sessions[0], "leave a history").await;
    // Live: refused, naming the session, and nothing changed.
    let refused = api.typed().task_delete(task.id.clone(), None, None).await.unwrap_err();
    let refused = tether_tests::daemon::ApiError::of("task.delete", refused);
    assert_eq!(refused.kind, protocol::errors::ErrorKind::InvalidState, "{refused:?}");
    assert!(refused.message.contains(&sessions[0]), "{refused:?}");
    assert_eq!(ok("task.get", api.typed().task_get(task.id.clone())).await.sessions.len(), 2);
    // Stopped: the task goes, and its sessions with their files.
    for session in &sessions {
        ok("stop", api.typed().session_stop(session.clone())).await;
    }
    ok("task.delete", api.typed().task_delete(task.id.clone(), None, None)).await;
    let gone = api.typed().task_get(task.id.clone()).await.unwrap_err();
    let gone = tether_tests::daemon::ApiError::of("task.get", gone);
    assert_eq!(gone.kind, protocol::errors::ErrorKind::NotFound);
    for session in &sessions {
        assert!(!daemon.session_dir(session).exists(), "{session}'s files are gone");
        let status = api.typed().session_status(session.clone()).await.unwrap_err();
        assert_eq!(
            tether_tests::daemon::ApiError::of("status", status).kind,
            protocol::errors::ErrorKind::NotFound
        );
    }
    // The CLI says it too.
    let again = ok("task.create", api.typed().task_create("by the cli".into(), None)).await;
    let (code, out, err) = daemon.cli(&["task", "delete", &again.id]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), format!("task {} deleted", again.id));
}

/// Point 3 (the easy paths, first part): a `workspace_path` that is `$TETHER_HOME` or
/// normalises into it (`work/../tether/sessions`) was accepted, and the agent then worked
/// beside `state.db`; and `TETHER_HOME` reached the agent's environment, telling it where
/// the daemon's data is. Now such a workspace is refused, and the variable stays with the
/// daemon.
#[tokio::test]
async fn an_agent_is_never_pointed_into_the_daemons_data_nor_told_where_it_is() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let data = daemon.root.path().join("tether");
    let sneaky = daemon.workspace("w").join("../../tether/sessions");
    for workspace in [data.clone(), sneaky] {
        let refused = api.create_session("mock", &workspace).await.unwrap_err();
        assert_eq!(refused.kind, protocol::errors::ErrorKind::InvalidParams, "{refused:?}");
        assert_eq!(refused.field.as_deref(), Some("workspace_path"));
        assert!(refused.message.contains("Tether's data directory"), "{refused:?}");
    }
    // A daemon started with TETHER_HOME set does not pass it on.
    let env = [("TETHER_HOME", "/a/tether/home")];
    let daemon = Daemon::start_with_env(&[], &[], &env).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("env")).await;
    let processes = Daemon::processes_mentioning(&daemon.session_dir(&session));
    assert!(!processes.is_empty(), "its sidecar runs");
    let mut agents = Daemon::processes_mentioning(&daemon.root.path().join(".mock-agent"));
    agents.extend(processes);
    for pid in agents {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let environ = String::from_utf8_lossy(&environ);
        assert!(!environ.split('\0').any(|var| var.starts_with("TETHER_HOME=")), "{pid}");
    }
}

/// Point 5 (the message): when the daemon had no room for another connection, the CLI
/// exited 6 "refused", which its help documents as a wrong token. Now a full daemon's HTTP
/// 429 is "too many connections", exit 7, and the limit is `serve --max-connections`.
#[tokio::test]
async fn a_full_daemon_is_reported_as_too_many_connections_not_a_wrong_token() {
    let daemon = Daemon::start(&["--max-connections", "3"]).await;
    let host = daemon.url.trim_start_matches("ws://").trim_end_matches('/').to_owned();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(RawWs::connect(&host).await);
    }
    let (code, _, err) = daemon.cli(&["agents"]).await;
    assert_eq!(code, 7, "{err}");
    assert!(err.starts_with("too many connections: "), "{err}");
    assert!(!err.contains("token"), "{err}");
    let (_, help, _) = daemon.cli(&["--help"]).await;
    assert!(help.contains("7 busy"), "{help}");
    drop(held);
}

/// Point 12 (third part): the mock agent's per-session state files were never removed.
/// A profile names the files its agent keeps per ACP session (`session.state_files`), and
/// deleting the session removes them on this host.
#[tokio::test]
async fn deleting_a_session_removes_the_state_files_its_agent_kept() {
    use tether_tests::daemon::ok;
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("state")).await;
    api.ask(&session, "remember this").await;
    let acp = api.status(&session).await.acp_session_id.expect("an ACP session");
    let file = daemon.root.path().join(".mock-agent").join(format!("{acp}.json"));
    assert!(file.exists(), "the agent keeps {}", file.display());
    ok("delete", api.typed().session_delete(session.clone(), None, None)).await;
    assert!(!file.exists(), "{} is removed with the session", file.display());
}

/// The session's events from `after_seq` up to its newest (`task.session.status`).
async fn events_after(
    api: &tether_tests::daemon::Api,
    session: &str,
    after_seq: u64,
) -> Vec<protocol::api::SessionEvent> {
    let last = api.status(session).await.last_event_seq;
    let mut events = api.subscribe(session, after_seq).await;
    tether_tests::daemon::until(&mut events, |event| event.seq >= last).await
}

/// Whether an event is a notice that says `what`.
fn said(event: &protocol::api::SessionEvent, what: &str) -> bool {
    matches!(&event.kind, protocol::api::EventKind::Notice { message } if message.contains(what))
}

/// The "events lost" error a reopened log published, if any.
fn lost_notice(events: &[protocol::api::SessionEvent]) -> Option<(u64, String)> {
    events.iter().find_map(|event| match &event.kind {
        protocol::api::EventKind::Notice { message } if message.contains("event log lost") => {
            Some((event.seq, message.clone()))
        }
        _ => None,
    })
}

/// Point 7: an event log truncated, emptied or deleted while the daemon was down was taken
/// as it was: `subscribe {after_seq: 0}` returned half the events with no error, and new
/// events reused the lost seqs, so a client holding a cursor among them missed events.
/// Now numbering continues after the highest seq ever issued, and the gap is said (a
/// `notice` event at the first new seq, naming the range) to whoever subscribes; each lost
/// seq is delivered in its place as a notice that it is unreadable (so a client following
/// the gap rule moves past them).
#[tokio::test]
async fn event_seqs_never_go_backwards_when_the_log_is_cut_while_down() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("seqs")).await;
    for n in 0..3 {
        api.ask(&session, &format!("turn {n}")).await;
    }
    assert!(api.status(&session).await.last_event_seq >= 12);
    drop(api);
    daemon.terminate().await;

    // Truncated to its first half.
    let dir = daemon.session_dir(&session);
    let segments: Vec<_> = std::fs::read_dir(dir.join("events"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "jsonl"))
        .collect();
    assert_eq!(segments.len(), 1, "{segments:?}");
    let text = std::fs::read_to_string(&segments[0]).unwrap();
    // The highest seq issued: the whole log's last (a background snapshot's event may have
    // come after any status read).
    let last_line = text.lines().last().unwrap();
    let high =
        serde_json::from_str::<serde_json::Value>(last_line).unwrap()["seq"].as_u64().unwrap();
    let kept = (high / 2) as usize;
    let half: String = text.lines().take(kept).map(|line| format!("{line}\n")).collect();
    std::fs::write(&segments[0], half).unwrap();

    daemon.restart().await;
    let api = daemon.api().await;
    let all = events_after(&api, &session, 0).await;
    let seqs: Vec<u64> = all.iter().map(|event| event.seq).collect();
    assert_eq!(&seqs[..kept], (1..=kept as u64).collect::<Vec<_>>(), "{seqs:?}");
    let (at, message) = lost_notice(&all).expect("the loss is said");
    assert_eq!(at, high + 1, "numbering continues after the highest seq: {seqs:?}");
    assert!(message.contains(&format!("{}–{high}", kept + 1)), "{message}");
    // Each lost seq is said in its place (so a client following the gap rule moves past
    // them), and nothing else stands there.
    assert_eq!(seqs, (1..=high + 1).collect::<Vec<_>>(), "{seqs:?}");
    let range = format!("events {}–{high} are unreadable", kept + 1);
    assert!(all[kept..high as usize].iter().all(|event| said(event, &range)), "{all:?}");
    // A client whose cursor is among the lost seqs gets the rest of them, then the notice.
    let mut events = api.subscribe(&session, kept as u64 + 2).await;
    let first = tether_tests::daemon::next(&mut events).await;
    assert_eq!(first.seq, kept as u64 + 3, "{first:?}");
    assert!(said(&first, &format!("events {}–{high} are unreadable", kept + 3)), "{first:?}");
    api.ask(&session, "after the cut").await;
    let after: Vec<u64> =
        events_after(&api, &session, high + 1).await.iter().map(|event| event.seq).collect();
    assert!(after.first().is_some_and(|&seq| seq == high + 2), "no seq reused: {after:?}");
    let high = *after.last().unwrap();
    drop(events);
    drop(api);
    daemon.terminate().await;

    // Deleted whole, and every file beside it that counts events: the store still knows
    // the seq of the last state change.
    let last_state_seq = {
        let text: String = std::fs::read_dir(dir.join("events"))
            .unwrap()
            .map(|entry| std::fs::read_to_string(entry.unwrap().path()).unwrap())
            .collect();
        text.lines()
            .filter(|line| line.contains("\"type\":\"state\""))
            .map(|line| {
                serde_json::from_str::<serde_json::Value>(line).unwrap()["seq"].as_u64().unwrap()
            })
            .max()
            .expect("state events")
    };
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap().to_string_lossy().starts_with("events") {
            if path.is_dir() {
                std::fs::remove_dir_all(&path).unwrap();
            } else {
                std::fs::remove_file(&path).unwrap();
            }
        }
    }
    daemon.restart().await;
    let api = daemon.api().await;
    let all = events_after(&api, &session, 0).await;
    let (at, message) = lost_notice(&all).expect("the loss is said");
    assert!(at > last_state_seq && at <= high + 1, "{at} after {last_state_seq}: {message}");
    // Nothing older is left: each seq before it is said unreadable, in its place.
    let before: Vec<&protocol::api::SessionEvent> = all.iter().take_while(|e| e.seq < at).collect();
    assert_eq!(before.len() as u64, at - 1, "{all:?}");
    assert!(before.iter().all(|event| said(event, "are unreadable")), "{all:?}");
}

/// Opens `count` WebSocket connections to `host` as user `uid` and holds them until the
/// returned child's stdin closes; returns the child and each upgrade's HTTP status and
/// body.
async fn hold_connections_as(
    uid: u32,
    host: &str,
    count: usize,
) -> (tokio::process::Child, Vec<(u16, String)>) {
    use tokio::io::{AsyncBufReadExt, BufReader};
    const HOLDER: &str = r#"
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
held = []
for n in range(int(sys.argv[2])):
    s = socket.create_connection((host, int(port)))
    s.sendall(("GET / HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
               % sys.argv[1]).encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = s.recv(4096)
        if not chunk:
            break
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 101"):
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            body += chunk
    print(head.split(b" ")[1].decode(), body.decode(errors="replace").replace("\n", " "), flush=True)
    held.append(s)
sys.stdin.read()
"#;
    let mut child = tokio::process::Command::new("/usr/bin/python3")
        .args(["-c", HOLDER, host, &count.to_string()])
        .uid(uid)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut answers = Vec::new();
    while answers.len() < count {
        let line = tether_tests::within("an upgrade's answer", lines.next_line())
            .await
            .unwrap()
            .expect("the holder answers for each connection");
        let (status, body) = line.split_once(' ').unwrap_or((&line, ""));
        answers.push((status.parse().unwrap(), body.trim().to_owned()));
    }
    (child, answers)
}

/// Point 5 (the limit): 1,024 idle WebSockets from any local process locked everyone out.
/// Now a peer — a remote address, or on loopback a local user — holds at most
/// `--max-connections-per-peer`, and the last slots are kept for the daemon's own user
/// (its CLI and page): other users together get at most `--max-connections` less that
/// headroom.
#[tokio::test]
async fn one_peer_cannot_take_every_connection_and_the_owner_keeps_headroom() {
    let daemon =
        Daemon::start(&["--max-connections", "12", "--max-connections-per-peer", "4"]).await;
    let host = daemon.url.trim_start_matches("ws://").trim_end_matches('/').to_owned();
    // One local user opens twelve: four get in.
    let (nobody, answers) = hold_connections_as(65534, &host, 12).await;
    let statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
    assert_eq!(statuses, [[101; 4].as_slice(), &[429; 8]].concat(), "{answers:?}");
    assert!(answers[4].1.contains("too many connections from this peer"), "{answers:?}");
    // Two more users: together the others get 12 less the headroom (2 for 12).
    let (second, answers) = hold_connections_as(65533, &host, 4).await;
    assert!(answers.iter().all(|(status, _)| *status == 101), "{answers:?}");
    let (third, answers) = hold_connections_as(65532, &host, 4).await;
    let statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
    assert_eq!(statuses, [101, 101, 429, 429], "{answers:?}");
    assert!(answers[2].1.contains("too many connections"), "{answers:?}");
    // The daemon's own user still gets in, twice at once.
    let api = daemon.api().await;
    let (code, out, err) = daemon.cli(&["agents"]).await;
    assert_eq!(code, 0, "{out}{err}");
    drop(api);
    drop((nobody, second, third));
}

/// Whether `/proc/<pid>/<file>` mentions `secret`.
fn proc_mentions(pid: u32, file: &str, secret: &str) -> bool {
    let text = std::fs::read(format!("/proc/{pid}/{file}")).unwrap_or_default();
    String::from_utf8_lossy(&text).contains(secret)
}

/// Point 3 (secrets in environments): an agent of the same user read the daemon's token in
/// `/proc/<supervisor>/environ` (`TETHER_AUTH_TOKEN`) and its sidecar's in
/// `/proc/<agentctl>/environ` (`AGENTCTL_TOKEN`). Now no secret stays in any process's
/// environment or argv after start: the daemon takes its token and starts itself again
/// (same pid) with the token on an inherited pipe, and a sidecar reads its token from its
/// stdin.
#[tokio::test]
async fn no_secret_is_left_in_a_process_environment_or_argv() {
    use tether_tests::daemon::Api;
    let token = "scrubbed-token-0123456789";
    let flag = ["--auth-token", token];
    let env = [("TETHER_AUTH_TOKEN", token)];
    for (args, env) in [(&flag[..], &[][..]), (&[][..], &env[..])] {
        let daemon = Daemon::start_with_env(args, &[], env).await;
        let pid = daemon.pid().unwrap();
        assert!(!proc_mentions(pid, "environ", token), "the daemon's environment ({args:?})");
        assert!(!proc_mentions(pid, "cmdline", token), "the daemon's argv ({args:?})");
        let bearer = format!("Bearer {token}");
        let api = Api::connect(&daemon.url, &[("Authorization", bearer.as_str())]).await.unwrap();
        let session = api.ready_session("mock", &daemon.workspace("secrets")).await;
        assert!(api.ask(&session, "still works").await.contains("you said: still works"));
        let sidecar = daemon.agentctl_pid(&session);
        let sidecar_token = std::fs::read_to_string(format!("/proc/{sidecar}/environ")).unwrap();
        assert!(!sidecar_token.contains("AGENTCTL_TOKEN="), "the sidecar's environment");
        assert!(!proc_mentions(sidecar, "environ", token), "the sidecar's environment");
        for agent in Daemon::processes_mentioning(&daemon.root.path().join(".mock-agent")) {
            assert!(!proc_mentions(agent, "environ", token), "the agent's environment");
            assert!(!proc_mentions(agent, "environ", "AGENTCTL_TOKEN="), "the agent's");
        }
    }
}

/// A process's real uid and its groups, from `/proc/<pid>/status`.
fn uid_and_groups(pid: u32) -> (u32, Vec<u32>) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .unwrap_or_default()
            .split_whitespace()
            .map(|n| n.parse::<u32>().unwrap())
            .collect::<Vec<_>>()
    };
    (field("Uid:")[0], field("Groups:"))
}

/// Point 3 (real isolation): an agent of the daemon's user could read every secret its
/// user can — the daemon's and its sidecar's environments, `state.db` with every sidecar's
/// token. A profile's `[process] user` now runs its agents as another user (agentctl, as
/// root, starts them with that uid, gid and groups), sharing the workspace through group
/// permissions: the agent works, and where it looks for secrets it finds none.
#[tokio::test]
async fn a_profile_runs_its_agent_as_another_user_who_finds_no_secrets() {
    use std::os::unix::fs::{PermissionsExt, chown};
    const NOBODY: u32 = 65534;
    let profile = "id = \"isolated\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{home}/.agent-nobody\"]\nprotocol = \"acp\"\n[process]\nuser = \"nobody\"\n";
    // Another user is a boundary only when the API asks for a token.
    let token = [("TETHER_AUTH_TOKEN", "isolated-9f3a1c07e42b8d65")];
    let (daemon, ()) = Daemon::start_prepared(&[], &[("isolated.toml", profile)], &token, |root| {
        // The test's root may be passed through (the daemon's data stays 0700); the
        // workspace is the daemon's user's, shared with the agent's group.
        tether_tests::daemon::share_workspace_with(root, "iso", NOBODY);
        let state = root.join(".agent-nobody");
        std::fs::create_dir(&state).unwrap();
        chown(&state, Some(NOBODY), Some(NOBODY)).unwrap();
    })
    .await;
    let bearer = "Bearer isolated-9f3a1c07e42b8d65";
    let api = Api::connect(&daemon.url, &[("Authorization", bearer)]).await.unwrap();
    let session = api.ready_session("isolated", &daemon.workspace("iso")).await;
    let agents = Daemon::processes_mentioning(&daemon.root.path().join(".agent-nobody"));
    let [agent] = agents[..] else { panic!("one agent: {agents:?}") };
    let (uid, groups) = uid_and_groups(agent);
    assert_eq!(uid, NOBODY, "the agent runs as nobody");
    assert!(groups.contains(&NOBODY), "with its groups: {groups:?}");
    let sidecar = daemon.agentctl_pid(&session);
    let db = daemon.root.path().join("tether/state.db");
    let secrets = [
        format!("/proc/{}/environ", daemon.pid().unwrap()),
        format!("/proc/{sidecar}/environ"),
        db.display().to_string(),
    ];
    let probe: String = secrets.iter().map(|path| format!("/peek {path}\n")).collect();
    let reply = api.ask(&session, &format!("{probe}look around")).await;
    for path in &secrets {
        assert!(
            reply.contains(&format!("peek {path} failed: Permission denied")),
            "{path}: {reply}"
        );
    }
    // Nor through the ACP file methods, which agentctl (root here) serves: with the
    // agent's own access, a root-only file in its workspace is refused, and what it writes
    // is its own.
    let work = daemon.root.path().join("work/iso");
    let private = work.join("root-only.txt");
    std::fs::write(&private, "root's secret\n").unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    let made = work.join("made-by-the-agent.txt");
    let asked = format!("/read {}\n/write {} hello\nfiles", private.display(), made.display());
    let reply = api.ask(&session, &asked).await;
    assert!(!reply.contains("root's secret"), "{reply}");
    assert!(reply.contains(&format!("read {} failed", private.display())), "{reply}");
    assert!(reply.contains("Permission denied"), "{reply}");
    assert!(reply.contains("wrote 5 bytes"), "{reply}");
    let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&made).unwrap());
    assert_eq!(owner, NOBODY, "written as the agent");
    // The same agent as the daemon's user reads them all.
    let daemon_user = api.ready_session("mock", &daemon.workspace("plain")).await;
    let reply = api.ask(&daemon_user, &format!("{probe}look around")).await;
    assert!(reply.contains(&format!("peek {}: ", db.display())), "{reply}");
    assert!(!reply.contains("failed"), "{reply}");
}

/// An agent run as `nobody` by a daemon without a token reached the daemon's API on
/// loopback, created a session of a root profile, and read `/etc/shadow` through it:
/// another user is no boundary while the API asks for no token. Such a profile is listed
/// unavailable and its sessions refused, saying why and what to do.
#[tokio::test]
async fn agents_run_as_another_user_only_behind_an_api_token() {
    let profile = "id = \"isolated\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n[process]\nuser = \"nobody\"\n";
    let daemon = Daemon::start_with_profiles(&[], &[("isolated.toml", profile)]).await;
    let api = daemon.api().await;
    let agents = api.typed().agents_list().await.unwrap();
    let isolated = agents.iter().find(|agent| agent.id == "isolated").expect("listed");
    assert!(!isolated.available, "{isolated:?}");
    let reason = isolated.reasons.join("; ");
    assert!(
        reason.contains("asks for no token") && reason.contains("--auth-token-file"),
        "{reason}"
    );
    let refused = api.create_session("isolated", &daemon.workspace("iso")).await.unwrap_err();
    assert_eq!(refused.kind, protocol::errors::ErrorKind::AgentUnavailable, "{refused:?}");
    assert!(refused.message.contains("asks for no token"), "{refused:?}");
}

/// Point 4 (the user): a container's agent ran as root. agentctl is now root in its
/// container and starts the agent as a user of its own where the image and workspace allow
/// it — the image's non-root `USER`, else the owner of the workspace (what the agent writes
/// keeps that owner) — giving it the state directories mounted for it.
#[tokio::test]
async fn a_containers_agent_runs_as_the_workspaces_owner_not_root() {
    use std::os::unix::fs::{MetadataExt, chown};
    let Some((docker, daemon, _cleanup)) = tether_tests::docker::setup().await else { return };
    let api = daemon.api().await;
    let work = daemon.workspace("owned");
    chown(&work, Some(1234), Some(1234)).unwrap();
    let session = api.ready_session("mock-docker", &work).await;
    assert!(api.ask(&session, "as whom?").await.contains("you said: as whom?"));
    let top = docker
        .top_processes(&format!("tether-{session}"), None::<bollard::query_parameters::TopOptions>)
        .await
        .unwrap();
    let titles = top.titles.unwrap_or_default();
    let pid_at = titles.iter().position(|title| title == "PID").unwrap();
    let uid_of = |needle: &str| {
        top.processes.iter().flatten().find_map(|row| {
            row.last().filter(|command| command.contains(needle))?;
            let pid: u32 = row[pid_at].parse().ok()?;
            Some(uid_and_groups(pid).0)
        })
    };
    assert_eq!(uid_of("mock-agent"), Some(1234), "the agent: {:?}", top.processes);
    assert_eq!(uid_of("agentctl"), Some(0), "agentctl stays root: {:?}", top.processes);
    // Its state directory was given to it, and what it wrote there is its own.
    let state = daemon.root.path().join("tether/agent-state").join(&session).join(".mock-agent");
    let owners: Vec<u32> = std::fs::read_dir(&state)
        .map(|entries| entries.flatten().map(|entry| entry.metadata().unwrap().uid()).collect())
        .unwrap_or_default();
    assert!(!owners.is_empty() && owners.iter().all(|&uid| uid == 1234), "{owners:?}");
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet: it runs no more).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

/// Point 11: a descendant that left the agent's process group survived a SIGKILL of
/// agentctl forever, even through stop and delete (the guard kills the group, and is a
/// subreaper only while agentctl lives). Where cgroup v2 can be written, each local session
/// now runs in a cgroup of its own, killed whole when the session is fenced, stopped or
/// deleted.
#[tokio::test]
async fn an_escaped_grandchild_is_killed_with_its_session() {
    use tether_tests::daemon::ok;
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    for ending in ["stop", "delete"] {
        let session = api.ready_session("mock", &daemon.workspace(ending)).await;
        let reply = api.ask(&session, "/escape\nleave a daemon behind").await;
        let pid: u32 = reply
            .split("spawned pid ")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|pid| pid.parse().ok())
            .unwrap_or_else(|| panic!("a pid in {reply}"));
        assert!(!gone(pid), "the escaped child runs");
        // Held from now on, so the exit awaited below is this process's, whatever reuses
        // its pid.
        let child = agentctl::process::PidFd::open(pid).expect("a pidfd of the escaped child");
        // agentctl dies hard: its guard kills the agent's group, not the escaped child.
        tether_tests::daemon::sigkill(daemon.agentctl_pid(&session)).await;
        match ending {
            "stop" => ok("stop", api.typed().session_stop(session.clone())).await,
            _ => ok("delete", api.typed().session_delete(session.clone(), None, None)).await,
        };
        // Its cgroup is killed by the stop's fence (which may finish after the stop
        // answered): the child's exit is awaited, not sampled.
        let killed = format!("the escaped child {pid} to be killed by the session's {ending}");
        tether_tests::within(&killed, child.exited()).await.expect("its pidfd");
    }
}

/// The socket inodes process `pid` holds open.
fn socket_inodes(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .filter_map(|target| {
                    let target = target.to_string_lossy().into_owned();
                    Some(target.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Point 3 (the control channel): a local sidecar listened on a loopback TCP port any
/// local process could dial (and, with a token read elsewhere, drive). It now listens on a
/// Unix socket in its 0700 state dir: no TCP port, and another user cannot even connect.
#[tokio::test]
async fn a_local_sidecar_listens_on_a_private_unix_socket_not_a_tcp_port() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("socket")).await;
    assert!(api.ask(&session, "over the socket").await.contains("you said: over the socket"));
    let sidecar = daemon.agentctl_pid(&session);
    let held = socket_inodes(sidecar);
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let listening = fields.get(3) == Some(&"0A");
            assert!(
                !(listening && fields.get(9).is_some_and(|inode| held.iter().any(|h| h == inode))),
                "agentctl {sidecar} listens on TCP: {line}"
            );
        }
    }
    let socket = daemon.session_dir(&session).join("agentctl/control.sock");
    assert!(socket.exists(), "{}", socket.display());
    // Another user cannot reach it at all.
    let tried = tokio::process::Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\n    print('connected')\nexcept OSError as e:\n    print(type(e).__name__)",
        ])
        .arg(&socket)
        .uid(65534)
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&tried.stdout);
    assert_eq!(said.trim(), "PermissionError", "{said}{}", String::from_utf8_lossy(&tried.stderr));
}
