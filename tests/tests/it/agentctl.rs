//! agentctl as a real process with mock-agent as its agent: readiness, auth, the ACP
//! relay, fs confinement, replay and ack, survival of its launcher, process hygiene and bad
//! input.

use protocol::errors::ErrorKind;
use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use agentctl::client::{ClientError, ControlClient};
use agentctl::process::{PidFd, is_alive};
use protocol::control::{AgentState, EventKind, ReadyInfo, StopStage};
use serde_json::{Value, json};
use tether_tests::sidecar::{Conversation, Sidecar, acp_message, prompt, refuse};
use tether_tests::{within, workspace_bin};
use tokio::io::{AsyncBufReadExt, BufReader};

fn allow(_: &Value) -> Value {
    json!({"outcome": {"outcome": "selected", "optionId": "allow"}})
}

/// The number in "spawned pid N" in a reply.
fn spawned_pid(reply: &str) -> u32 {
    let rest = reply.split("spawned pid ").nth(1).expect("the reply names the spawned pid");
    rest.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

async fn gone(pidfd: &PidFd, what: &str) {
    within(what, pidfd.exited()).await.expect("pidfd readable");
}

#[tokio::test]
async fn the_ready_line_is_the_readiness_signal() {
    let sidecar = Sidecar::launch(&[]).await;
    let ready = &sidecar.launched.ready;
    let file: ReadyInfo = serde_json::from_str(
        &std::fs::read_to_string(sidecar.state_dir.join("ready.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(&file, ready, "ready.json and the ready line agree");
    assert!(is_alive(ready.pid));
    assert_eq!(ready.start_time, agentctl::ready::process_start_time(ready.pid).unwrap());
    assert_eq!(ready.boot_id, agentctl::ready::boot_id().unwrap());
    let status = sidecar.client().await.status().await.unwrap();
    assert_eq!(
        (status.agent_state, status.last_seq, status.acked_seq),
        (AgentState::NotStarted, 0, 0)
    );
    // The token never appears on the command line.
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", ready.pid)).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains(&sidecar.token));
}

#[tokio::test]
async fn connections_without_the_token_are_refused() {
    let sidecar = Sidecar::launch(&[]).await;
    for token in ["wrong", "", &sidecar.token[1..]] {
        match ControlClient::connect(sidecar.addr(), token).await {
            Err(ClientError::Transport { .. }) => {}
            other => panic!("token {token:?} must be refused, got {other:?}"),
        }
    }
    assert!(ControlClient::connect(sidecar.addr(), &sidecar.token).await.is_ok());
}

/// A sidecar on a remote engine serves its control channel over TLS with a
/// certificate made for it; a client pinned to that certificate (and holding the token)
/// gets through, events included; plain WebSocket, another certificate, or the wrong token
/// do not.
#[tokio::test]
async fn a_tls_control_channel_answers_only_a_client_pinned_to_its_certificate() {
    use std::os::unix::fs::PermissionsExt;
    let files = tempfile::tempdir().unwrap();
    let local = "127.0.0.1".parse().unwrap();
    let (cert, key) = supervisor::runtime::docker::sidecar_certificate(local).unwrap();
    let (cert_path, key_path) = (files.path().join("tls.crt"), files.path().join("tls.key"));
    std::fs::write(&cert_path, &cert).unwrap();
    std::fs::write(&key_path, &key).unwrap();
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let sidecar = Sidecar::launch(&[
        "--tls-cert",
        cert_path.to_str().unwrap(),
        "--tls-key",
        key_path.to_str().unwrap(),
    ])
    .await;
    let pinned = || Some(std::sync::Arc::<[u8]>::from(cert.as_bytes()));
    let (addr, token) = (sidecar.addr(), sidecar.token.as_str());

    let client = within(
        "a pinned connection",
        ControlClient::connect_pinned(addr.clone(), token, 64, pinned()),
    )
    .await
    .expect("the pinned client gets through");
    let status = within("status", client.status()).await.expect("status over TLS");
    assert_eq!(status.agent_pid, None, "no agent yet: {status:?}");
    let start = protocol::control::StartAgent {
        command: workspace_bin("mock-agent").to_string_lossy().into_owned(),
        args: Vec::new(),
        env: Default::default(),
        cwd: sidecar.workspace.path().to_owned(),
        extra_roots: Vec::new(),
        user: None,
        owned_dirs: Vec::new(),
        egress: None,
        isolate_network: false,
    };
    within("agent.start", client.start_agent(&start)).await.expect("the agent starts over TLS");
    let mut events = client.clone().events(0);
    let first = within("an event over TLS", events.next()).await.expect("an event");
    assert!(matches!(first.kind, EventKind::AgentStarted { .. }), "{first:?}");

    // Plain WebSocket to a TLS port: no handshake, no connection.
    assert!(matches!(
        within("plain ws", ControlClient::connect(addr.clone(), token)).await,
        Err(ClientError::Transport { .. })
    ));
    // Another certificate pinned: refused by the client before anything is sent.
    let (other, _) = supervisor::runtime::docker::sidecar_certificate(local).unwrap();
    let other = Some(std::sync::Arc::<[u8]>::from(other.as_bytes()));
    assert!(matches!(
        within("another pin", ControlClient::connect_pinned(addr.clone(), token, 64, other)).await,
        Err(ClientError::Transport { .. })
    ));
    // The right certificate and the wrong token: refused by the sidecar.
    assert!(matches!(
        within("wrong token", ControlClient::connect_pinned(addr.clone(), "wrong", 64, pinned()))
            .await,
        Err(ClientError::Transport { .. })
    ));
}

#[tokio::test]
async fn acp_round_trip_with_streaming_and_a_permission_answered_through_acp_send() {
    let sidecar = Sidecar::launch(&[]).await;
    let agent_pid = sidecar.start_mock(&[]).await;
    let mut talk = sidecar.conversation(0).await;
    let started = talk.until(|event| matches!(event.kind, EventKind::AgentStarted { .. })).await;
    assert!(matches!(started.kind, EventKind::AgentStarted { pid, .. } if pid == agent_pid));
    let session = talk.open_session(sidecar.workspace.path()).await;
    let mut asked = 0;
    let response = talk
        .request(3, "session/prompt", prompt(&session, "/stream 5\n/permission\nhi"), |request| {
            assert_eq!(request["method"], "session/request_permission");
            asked += 1;
            allow(request)
        })
        .await;
    assert_eq!(response["result"]["stopReason"], "end_turn");
    assert_eq!(asked, 1);
    let chunks = talk.chunks();
    assert_eq!(chunks.len(), 5);
    assert!(chunks[0].contains("the tool ran [1/5]"), "{chunks:?}");
    // Seqs are consecutive from 1.
    let seqs: Vec<u64> = talk.seen.iter().map(|event| event.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
}

#[tokio::test]
async fn fs_requests_are_served_inside_the_workspace_only() {
    let sidecar = Sidecar::launch(&[]).await;
    let ws = sidecar.workspace.path();
    std::fs::write(ws.join("a.txt"), "inside text").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "secret").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), ws.join("link.txt")).unwrap();
    sidecar.start_mock(&[]).await;
    let mut talk = sidecar.conversation(0).await;
    let session = talk.open_session(ws).await;
    let script = format!(
        "/read {0}/a.txt\n/read {1}/secret.txt\n/read {0}/link.txt\n/read {0}/../x.txt\n/write {0}/sub/b.txt written by the agent",
        ws.display(),
        outside.path().display()
    );
    // agentctl answers every fs request itself: `refuse` would panic if one reached us.
    let response = talk.request(3, "session/prompt", prompt(&session, &script), refuse).await;
    assert_eq!(response["result"]["stopReason"], "end_turn");
    let reply = talk.chunks().concat();
    assert!(reply.contains(&format!("read {}/a.txt: inside text", ws.display())), "{reply}");
    assert!(
        reply.contains("secret.txt failed:") && reply.contains("outside the workspace"),
        "{reply}"
    );
    assert!(reply.contains("link.txt failed:"), "{reply}");
    assert!(reply.contains("x.txt failed:") && reply.contains("contains '..'"), "{reply}");
    assert!(reply.contains("wrote 20 bytes"), "{reply}");
    assert_eq!(std::fs::read_to_string(ws.join("sub/b.txt")).unwrap(), "written by the agent");
    assert!(
        !reply.contains("secret\n") && !reply.contains(": secret"),
        "nothing from outside leaked: {reply}"
    );
    // Each served request is recorded with the answer agentctl gave.
    let served: Vec<&Value> = talk
        .seen
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Acp { answered: Some(answer), .. } => Some(answer),
            _ => None,
        })
        .collect();
    assert_eq!(served.len(), 5);
    assert_eq!(served[0]["result"]["content"], "inside text");
    assert!(served[1]["error"]["message"].as_str().unwrap().contains("outside the workspace"));
}

#[tokio::test]
async fn a_subscriber_that_reconnects_mid_stream_gets_every_event_once_in_order() {
    // Small segments: the spool rotates many times under the readers.
    let sidecar = Sidecar::launch(&["--segment-bytes", "16384"]).await;
    sidecar.start_mock(&[]).await;
    let mut talk = sidecar.conversation(0).await;
    let session = talk.open_session(sidecar.workspace.path()).await;
    let after_setup = talk.seen.last().unwrap().seq;

    // A raw subscriber (no automatic resume) reads part of a 10,000-chunk stream…
    let first = sidecar.client().await;
    let mut subscription = first.subscribe(after_setup).await.unwrap();
    talk.calls.send_acp(&json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": prompt(&session, "/stream 10000")})).await.unwrap();
    let mut events = Vec::new();
    while events.len() < 3000 {
        let event = within("an event", subscription.next()).await.expect("open").expect("parses");
        events.push(event);
    }
    // …and disconnects.
    drop(subscription);
    drop(first);
    // A new connection resumes after the last seq it handled.
    let second = sidecar.client().await;
    let mut resumed = second.subscribe(events.last().unwrap().seq).await.unwrap();
    loop {
        let event = within("an event", resumed.next()).await.expect("open").expect("parses");
        let done = acp_message(&event).is_some_and(|m| m["id"] == 3 && m.get("result").is_some());
        events.push(event);
        if done {
            break;
        }
    }
    let seqs: Vec<u64> = events.iter().map(|event| event.seq).collect();
    assert_eq!(
        seqs,
        (after_setup + 1..=after_setup + seqs.len() as u64).collect::<Vec<_>>(),
        "gapless, no duplicates"
    );
    let chunk_numbers: Vec<u32> = events
        .iter()
        .filter_map(acp_message)
        .filter_map(|m| m["params"]["update"]["content"]["text"].as_str().map(str::to_owned))
        .map(|text| {
            let mark = text.rsplit('[').next().unwrap();
            mark.split('/').next().unwrap().parse().unwrap()
        })
        .collect();
    assert_eq!(
        chunk_numbers,
        (1..=10_000).collect::<Vec<_>>(),
        "every chunk exactly once, in order"
    );
}

#[tokio::test]
async fn ack_truncates_the_spool() {
    let sidecar = Sidecar::launch(&["--segment-bytes", "4096"]).await;
    sidecar.start_mock(&[]).await;
    let mut talk = sidecar.conversation(0).await;
    let session = talk.open_session(sidecar.workspace.path()).await;
    talk.request(3, "session/prompt", prompt(&session, "/stream 500"), refuse).await;
    let last = talk.seen.last().unwrap().seq;
    let before = sidecar.spool_bytes();
    assert!(before > 20_000, "the stream is on disk: {before}");
    assert_eq!(talk.calls.ack(last).await.unwrap(), last);
    let after = sidecar.spool_bytes();
    assert!(after < 4096, "acknowledged segments are deleted: {before} → {after}");
    let status = talk.calls.status().await.unwrap();
    assert_eq!((status.last_seq, status.acked_seq), (last, last));
    match talk.calls.subscribe(last - 10).await {
        Err(error) => assert_eq!(error.kind(), Some(ErrorKind::Pruned)),
        Ok(_) => panic!("replay from before the ack point must be refused"),
    }
    // New events still flow after the truncation.
    talk.request(4, "session/prompt", prompt(&session, "after ack"), refuse).await;
}

#[tokio::test]
async fn agentctl_survives_its_launcher_and_replays_what_happened_meanwhile() {
    let state = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let token = agentctl::client::new_token();
    // The launcher is a shell that starts agentctl detached and waits; its stdout (which
    // agentctl inherits) carries the ready line to us.
    let script = format!(
        "setsid {} serve --state-dir {} < /dev/null 2>> {}/agentctl.log & wait",
        workspace_bin("agentctl").display(),
        state.path().join("ctl").display(),
        state.path().display()
    );
    let mut launcher = tokio::process::Command::new("sh")
        .args(["-c", &script])
        .env(protocol::control::TOKEN_ENV, &token)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut stdout = BufReader::new(launcher.stdout.take().unwrap());
    within("the ready line", stdout.read_line(&mut line)).await.unwrap();
    let ready: ReadyInfo = serde_json::from_str(line.trim()).unwrap();
    let addr: agentctl::client::ControlAddr = format!("127.0.0.1:{}", ready.port).parse().unwrap();
    // Make sure the sidecar is cleaned up whatever happens below.
    struct KillOnDrop(u32);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.0 as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let _cleanup = KillOnDrop(ready.pid);

    let calls = ControlClient::connect(addr.clone(), &token).await.unwrap();
    let start = protocol::control::StartAgent {
        command: workspace_bin("mock-agent").to_string_lossy().into_owned(),
        args: vec![],
        env: Default::default(),
        cwd: workspace.path().to_owned(),
        extra_roots: vec![],
        user: None,
        owned_dirs: Vec::new(),
        egress: None,
        isolate_network: false,
    };
    let agent_pid = calls.start_agent(&start).await.unwrap().pid;
    let send = |message: Value| {
        let calls = &calls;
        async move { calls.send_acp(&message).await.unwrap() }
    };
    send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {}}})).await;

    // SIGKILL the launcher: agentctl and the agent keep running.
    if let Some(pid) = launcher.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    within("the launcher to die", launcher.wait()).await.unwrap();
    assert!(is_alive(ready.pid), "agentctl outlives its launcher");
    assert!(is_alive(agent_pid), "the agent outlives agentctl's launcher");

    // Events keep being spooled while nobody listens.
    send(json!({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": workspace.path(), "mcpServers": []}})).await;
    drop(calls);
    let fresh = ControlClient::connect(addr.clone(), &token).await.unwrap();
    let mut talk = Conversation {
        calls: ControlClient::connect(addr.clone(), &token).await.unwrap(),
        events: fresh.events(0),
        seen: vec![],
    };
    let session = talk.until(|event| acp_message(event).is_some_and(|m| m["id"] == 2)).await;
    let session_id =
        acp_message(&session).unwrap()["result"]["sessionId"].as_str().unwrap().to_owned();
    let response =
        talk.request(3, "session/prompt", prompt(&session_id, "/stream 100"), refuse).await;
    assert_eq!(response["result"]["stopReason"], "end_turn");
    assert_eq!(talk.seen[0].seq, 1, "replay starts at the first event");
    assert!(matches!(talk.seen[0].kind, EventKind::AgentStarted { .. }));
    assert!(
        talk.seen.iter().any(|e| acp_message(e).is_some_and(|m| m["id"] == 1)),
        "the initialize response was replayed"
    );
    assert_eq!(talk.chunks().len(), 100);
}

#[tokio::test]
async fn sigkill_of_agentctl_takes_the_agent_and_its_grandchild() {
    let sidecar = Sidecar::launch(&[]).await;
    let agent_pid = sidecar.start_mock(&[]).await;
    let mut talk = sidecar.conversation(0).await;
    let session = talk.open_session(sidecar.workspace.path()).await;
    talk.request(3, "session/prompt", prompt(&session, "/spawn"), refuse).await;
    let grandchild = spawned_pid(&talk.chunks().concat());
    let agent = PidFd::open(agent_pid).unwrap();
    let grandchild = PidFd::open(grandchild).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sidecar.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    gone(&agent, "the agent to die with agentctl").await;
    gone(&grandchild, "the grandchild to die with agentctl").await;
}

#[tokio::test]
async fn stop_escalates_and_leaves_no_descendant() {
    for (args, expected) in [
        (&[][..], StopStage::Eof),
        (&["--ignore-eof"][..], StopStage::Sigterm),
        (&["--ignore-eof", "--ignore-sigterm"][..], StopStage::Sigkill),
    ] {
        let sidecar = Sidecar::launch(&[]).await;
        let agent_pid = sidecar.start_mock(args).await;
        let mut talk = sidecar.conversation(0).await;
        let session = talk.open_session(sidecar.workspace.path()).await;
        talk.request(3, "session/prompt", prompt(&session, "/spawn"), refuse).await;
        let grandchild = PidFd::open(spawned_pid(&talk.chunks().concat())).unwrap();
        let agent = PidFd::open(agent_pid).unwrap();
        let stopped =
            within("agent.stop", talk.calls.stop_agent(Duration::from_millis(300))).await.unwrap();
        assert_eq!(stopped.stage, expected, "{args:?}");
        gone(&agent, "the agent").await;
        gone(&grandchild, "the grandchild").await;
        let exited = talk.until(|event| matches!(event.kind, EventKind::AgentExited { .. })).await;
        assert!(
            matches!(exited.kind, EventKind::AgentExited { status, .. } if status == stopped.status)
        );
        assert_eq!(talk.calls.status().await.unwrap().agent_state, AgentState::Exited);
        // agentctl is still there to be asked.
        assert!(is_alive(sidecar.pid()));
    }
}

#[tokio::test]
async fn bad_agent_output_becomes_events_and_nothing_stops() {
    let sidecar = Sidecar::launch(&["--max-line", "4096"]).await;
    sidecar.start_mock(&["--garbage-at-start"]).await;
    let mut talk = sidecar.conversation(0).await;
    let session = talk.open_session(sidecar.workspace.path()).await;
    let noise: Vec<String> = talk
        .seen
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::StdoutNoise { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(noise.len(), 2, "{noise:?}");
    assert!(noise[1].contains("UTF-8"), "{noise:?}");

    // A reply longer than the line limit is dropped with an error event; the turn still ends.
    let long = "x".repeat(10_000);
    let response = talk.request(3, "session/prompt", prompt(&session, &long), refuse).await;
    assert_eq!(response["result"]["stopReason"], "end_turn");
    assert!(talk.seen.iter().any(|e| matches!(&e.kind, EventKind::Error { message } if message.contains("over the 4096-byte limit"))));

    // Malformed control requests get JSON-RPC errors.
    for bad in [json!({"message": {"not": "json-rpc"}}), json!({"message": [1, 2]}), json!({})] {
        let error = talk.calls.call_raw("acp.send", bad.clone()).await.unwrap_err();
        assert_eq!(error.kind(), Some(ErrorKind::InvalidParams), "{bad}: {error}");
    }
    let error = talk.calls.call_raw("agent.start", json!({"command": 5})).await.unwrap_err();
    assert_eq!(error.kind(), Some(ErrorKind::InvalidParams));
    let error = talk.calls.call_raw("events.ack", json!({"seq": "soon"})).await.unwrap_err();
    assert_eq!(error.kind(), Some(ErrorKind::InvalidParams));
    // A subscription's bad params are refused with their kind too (jsonrpsee's own
    // refusal of a subscription carries none).
    let error =
        talk.calls.call_raw("events.subscribe", json!({"after_seq": "x"})).await.unwrap_err();
    assert_eq!(error.kind(), Some(ErrorKind::InvalidParams), "{error}");
    let error = talk.calls.call_raw("no.such.method", json!({})).await.unwrap_err();
    assert_eq!(error.kind(), Some(ErrorKind::NoSuchMethod));
    let again = protocol::control::StartAgent {
        command: "x".into(),
        args: Vec::new(),
        env: Default::default(),
        cwd: "/".into(),
        extra_roots: Vec::new(),
        user: None,
        owned_dirs: Vec::new(),
        egress: None,
        isolate_network: false,
    };
    let error = talk.calls.start_agent(&again).await.unwrap_err();
    assert_eq!(error.kind(), Some(ErrorKind::AlreadyStarted));

    // The agent dying mid-turn is an event with its status and stderr tail.
    talk.calls
        .send_acp(&json!({"jsonrpc": "2.0", "id": 4, "method": "session/prompt", "params": prompt(&session, "/crash 7")}))
        .await
        .unwrap();
    let exited = talk.until(|event| matches!(event.kind, EventKind::AgentExited { .. })).await;
    let EventKind::AgentExited { status, stderr_tail } = exited.kind else { unreachable!() };
    assert_eq!(status.code, Some(7));
    assert!(stderr_tail.contains("crashing mid-turn"), "{stderr_tail}");
    let error = talk.calls.send_acp(&json!({"jsonrpc": "2.0", "method": "x"})).await.unwrap_err();
    assert_eq!(error.kind(), Some(ErrorKind::NotRunning));
    // agentctl itself goes on.
    let status = talk.calls.status().await.unwrap();
    assert_eq!(status.agent_state, AgentState::Exited);
    let kinds: BTreeSet<&str> = talk
        .seen
        .iter()
        .map(|event| match event.kind {
            EventKind::Acp { .. } => "acp",
            EventKind::Stderr { .. } => "stderr",
            EventKind::StdoutNoise { .. } => "stdout_noise",
            EventKind::AgentStarted { .. } => "agent_started",
            EventKind::AgentExited { .. } => "agent_exited",
            EventKind::Error { .. } => "error",
            EventKind::Delivered { .. } => "delivered",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        BTreeSet::from([
            "acp",
            "agent_exited",
            "agent_started",
            "delivered",
            "error",
            "stderr",
            "stdout_noise"
        ])
    );
}

#[tokio::test]
async fn shutdown_stops_the_agent_and_exits() {
    let sidecar = Sidecar::launch(&[]).await;
    let agent = PidFd::open(sidecar.start_mock(&[]).await).unwrap();
    let agentctl = PidFd::open(sidecar.pid()).unwrap();
    sidecar.client().await.shutdown().await.unwrap();
    gone(&agent, "the agent").await;
    gone(&agentctl, "agentctl").await;
}

#[tokio::test]
async fn a_resuming_event_stream_with_acks_loses_nothing_over_a_long_stream() {
    // The supervisor's way of reading: an EventStream (resubscribes when it falls behind),
    // acking as it goes, over many spool rotations.
    let sidecar = Sidecar::launch(&["--segment-bytes", "65536"]).await;
    sidecar.start_mock(&[]).await;
    let mut talk = sidecar.conversation(0).await;
    let session = talk.open_session(sidecar.workspace.path()).await;
    // A tiny subscription buffer makes the client library fall behind (and drop
    // notifications) again and again; the stream must resubscribe without a gap.
    let tiny =
        ControlClient::connect_with_capacity(sidecar.addr(), &sidecar.token, 64).await.unwrap();
    let mut stream = tiny.events(talk.seen.last().unwrap().seq);
    let acks = sidecar.client().await;
    talk.calls
        .send_acp(&json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": prompt(&session, "/stream 30000")}))
        .await
        .unwrap();
    let mut last = stream.cursor();
    let mut chunks = 0u32;
    loop {
        let event = within("an event", stream.next()).await.expect("an event");
        assert_eq!(event.seq, last + 1, "a gap or a duplicate after {last}");
        last = event.seq;
        if let Some(message) = acp_message(&event) {
            if message["params"]["update"]["sessionUpdate"] == "agent_message_chunk" {
                chunks += 1;
            }
            if message["id"] == 3 {
                break;
            }
        }
        if last % 256 == 0 {
            acks.ack(last).await.unwrap();
        }
    }
    assert_eq!(chunks, 30_000);
}
