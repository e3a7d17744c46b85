//! Tests for the bidirectional peer, over in-memory pipes.

use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};

use super::*;
use crate::frame::InvalidReason;
use crate::message::ErrorCode;

const WAIT: Duration = Duration::from_secs(10);

/// Two peers joined by in-memory pipes, their I/O futures spawned.
fn pair() -> ((Peer, InboundRx), (Peer, InboundRx)) {
    let (a_io, b_io) = tokio::io::duplex(1024);
    let (a_read, a_write) = tokio::io::split(a_io);
    let (b_read, b_write) = tokio::io::split(b_io);
    let (a, a_in, a_fut) = connect(a_read, a_write, PeerConfig::default());
    let (b, b_in, b_fut) = connect(b_read, b_write, PeerConfig::default());
    tokio::spawn(a_fut);
    tokio::spawn(b_fut);
    ((a, a_in), (b, b_in))
}

/// A peer whose other end is a raw pipe the test writes and reads by hand.
fn raw() -> (Peer, InboundRx, DuplexStream) {
    let (ours, theirs) = tokio::io::duplex(1 << 16);
    let (read, write) = tokio::io::split(ours);
    let (peer, inbound, fut) = connect(read, write, PeerConfig { max_line: 64 });
    tokio::spawn(fut);
    (peer, inbound, theirs)
}

async fn next(inbound: &mut InboundRx) -> Inbound {
    tokio::time::timeout(WAIT, inbound.recv())
        .await
        .expect("inbound timed out")
        .expect("inbound ended")
}

/// Answers every request on `inbound` with `{"echo": params}` until the stream ends.
fn serve_echo(peer: Peer, mut inbound: InboundRx) {
    tokio::spawn(async move {
        while let Some(item) = inbound.recv().await {
            if let Inbound::Request(request) = item {
                let _ = peer.respond(request.id, Ok(json!({"echo": request.params})));
            }
        }
    });
}

#[tokio::test]
async fn request_round_trip() {
    let ((a, _a_in), (b, b_in)) = pair();
    serve_echo(b, b_in);
    let result = a.request("ping", Some(json!({"n": 1}))).await.unwrap();
    assert_eq!(result, json!({"echo": {"n": 1}}));
    let typed: Value = a.request_typed("ping", &json!([1, 2])).await.unwrap();
    assert_eq!(typed, json!({"echo": [1, 2]}));
}

#[tokio::test]
async fn error_responses_are_typed() {
    let ((a, _a_in), (b, mut b_in)) = pair();
    let call = tokio::spawn(async move { a.request("session/load", None).await });
    let Inbound::Request(request) = next(&mut b_in).await else { panic!("expected a request") };
    b.respond(request.id, Err(RpcError::new(ErrorCode::ResourceNotFound, "unknown session")))
        .unwrap();
    match call.await.unwrap() {
        Err(PeerError::Rpc(error)) => assert_eq!(error.code, ErrorCode::ResourceNotFound),
        other => panic!("expected an RPC error, got {other:?}"),
    }
}

#[tokio::test]
async fn interleaved_requests_in_both_directions() {
    let ((a, a_in), (b, b_in)) = pair();
    serve_echo(a.clone(), a_in);
    serve_echo(b.clone(), b_in);
    let mut calls = Vec::new();
    for n in 0..200 {
        let (from, to) = if n % 2 == 0 { (a.clone(), "a") } else { (b.clone(), "b") };
        calls.push(tokio::spawn(
            async move { (n, to, from.request("echo", Some(json!([n]))).await) },
        ));
    }
    for call in calls {
        let (n, _, result) = call.await.unwrap();
        assert_eq!(result.unwrap(), json!({"echo": [n]}), "response {n} reached the wrong caller");
    }
}

#[tokio::test]
async fn notifications_sent_before_a_response_are_queued_before_it_resolves() {
    let ((a, mut a_in), (b, mut b_in)) = pair();
    let call = tokio::spawn(async move { a.request("session/prompt", None).await });
    let Inbound::Request(request) = next(&mut b_in).await else { panic!("expected a request") };
    for n in 0..100 {
        b.notify("session/update", Some(json!({"n": n}))).unwrap();
    }
    b.respond(request.id, Ok(json!({"stopReason": "end_turn"}))).unwrap();
    assert_eq!(call.await.unwrap().unwrap(), json!({"stopReason": "end_turn"}));
    // Everything sent before the response is already queued: no waiting needed.
    for n in 0..100 {
        match a_in.try_recv() {
            Ok(Inbound::Notification(notification)) => {
                assert_eq!(notification.params, Some(json!({"n": n})))
            }
            other => panic!("notification {n} missing before the response: {other:?}"),
        }
    }
}

#[tokio::test]
async fn eof_resolves_pending_requests_with_closed() {
    let (peer, mut inbound, mut theirs) = raw();
    let waiting = {
        let peer = peer.clone();
        tokio::spawn(async move { peer.request("initialize", None).await })
    };
    // Read the request so we know it is pending, then hang up.
    let mut reader = BufReader::new(&mut theirs);
    let mut line = String::new();
    reader.read_line(&mut line).await.unwrap();
    assert!(line.contains("\"initialize\""), "got {line}");
    drop(theirs);
    assert!(matches!(waiting.await.unwrap(), Err(PeerError::Closed)));
    assert!(matches!(peer.request("again", None).await, Err(PeerError::Closed)));
    assert!(peer.is_closed());
    assert!(
        tokio::time::timeout(WAIT, inbound.recv()).await.unwrap().is_none(),
        "inbound must end"
    );
}

#[tokio::test]
async fn dropping_a_waiting_request_leaves_the_peer_consistent() {
    let (peer, mut inbound, theirs) = raw();
    let (their_read, mut their_write) = tokio::io::split(theirs);
    let mut their_lines = BufReader::new(their_read).lines();
    let abandoned = peer.send_request_with_id(Id::Number(100), "slow", None).unwrap();
    drop(abandoned);
    let line = their_lines.next_line().await.unwrap().unwrap();
    assert!(line.contains("\"slow\""));
    // The late response is ignored; the id is free again.
    their_write.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":100,\"result\":\"late\"}\n").await.unwrap();
    // Lines are handled in order: once this marker arrives, the late response has been dropped.
    their_write.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"marker\"}\n").await.unwrap();
    assert!(matches!(next(&mut inbound).await, Inbound::Notification(n) if n.method == "marker"));
    let again = peer.send_request_with_id(Id::Number(100), "fast", None).unwrap();
    let line = their_lines.next_line().await.unwrap().unwrap();
    assert!(line.contains("\"fast\""));
    their_write
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":100,\"result\":\"fresh\"}\n")
        .await
        .unwrap();
    assert_eq!(again.response().await.unwrap(), json!("fresh"));
}

#[tokio::test]
async fn duplicate_pending_ids_are_refused() {
    let (peer, _inbound, _theirs) = raw();
    let _first = peer.send_request_with_id(Id::String("x".into()), "m", None).unwrap();
    assert!(matches!(
        peer.send_request_with_id(Id::String("x".into()), "m", None),
        Err(PeerError::DuplicateId(Id::String(_)))
    ));
}

#[tokio::test]
async fn invalid_lines_are_reported_and_the_connection_goes_on() {
    let (peer, mut inbound, theirs) = raw();
    let (_their_read, mut their_write) = tokio::io::split(theirs);
    their_write.write_all(b"not json\n\xff\xfe\n").await.unwrap();
    their_write.write_all(&[b'z'; 200]).await.unwrap();
    their_write
        .write_all(b"\n[1]\n\n{\"jsonrpc\":\"2.0\",\"method\":\"_x/y\",\"params\":{}}\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..4 {
        match next(&mut inbound).await {
            Inbound::Invalid(invalid) => got.push(invalid.reason),
            other => panic!("expected an invalid line, got {other:?}"),
        }
    }
    assert!(matches!(got[0], InvalidReason::NotJson(_)));
    assert_eq!(got[1], InvalidReason::NotUtf8);
    assert_eq!(got[2], InvalidReason::TooLong { len: 200, max: 64 });
    assert_eq!(got[3], InvalidReason::Batch);
    match next(&mut inbound).await {
        Inbound::Notification(notification) => assert_eq!(notification.method, "_x/y"),
        other => panic!("expected the notification, got {other:?}"),
    }
    assert!(!peer.is_closed());
}

#[tokio::test]
async fn dropping_every_handle_closes_the_output() {
    let (peer, _inbound, theirs) = raw();
    let (their_read, _their_write) = tokio::io::split(theirs);
    peer.notify("last", None).unwrap();
    drop(peer);
    let mut lines = BufReader::new(their_read).lines();
    assert!(lines.next_line().await.unwrap().unwrap().contains("\"last\""));
    assert_eq!(lines.next_line().await.unwrap(), None, "the other side must see EOF");
}
