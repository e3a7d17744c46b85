//! Tests for line cutting and classification.

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::message::ErrorCode;

fn reason(line: &str) -> InvalidReason {
    match decode(line.as_bytes()) {
        Decoded::Invalid(invalid) => invalid.reason,
        other => panic!("expected an invalid line for {line:?}, got {other:?}"),
    }
}

fn message(line: &str) -> Message {
    match decode(line.as_bytes()) {
        Decoded::Message(message) => message,
        other => panic!("expected a message for {line:?}, got {other:?}"),
    }
}

async fn lines(input: &[u8], max: usize) -> Vec<Line> {
    let mut reader = LineReader::new(input, max);
    let mut out = Vec::new();
    while let Some(line) = reader.next_line().await.expect("reading a slice cannot fail") {
        out.push(line);
    }
    out
}

#[test]
fn classifies_each_kind() {
    assert_eq!(
        message(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}"#),
        Message::Request(Request {
            id: Id::Number(1),
            method: "initialize".into(),
            params: Some(json!({"protocolVersion": 1})),
        })
    );
    assert_eq!(
        message(r#"{"jsonrpc":"2.0","method":"session/cancel"}"#),
        Message::Notification(Notification { method: "session/cancel".into(), params: None })
    );
    assert_eq!(
        message(r#"{"jsonrpc":"2.0","id":"a","result":null}"#),
        Message::Response(Response { id: Id::String("a".into()), result: Ok(Value::Null) })
    );
    let Message::Response(Response { result: Err(error), .. }) =
        message(r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32002,"message":"no such session"}}"#)
    else {
        panic!("expected an error response");
    };
    assert_eq!(error.code, ErrorCode::ResourceNotFound);
    assert_eq!(error.message, "no such session");
}

#[test]
fn keeps_unknown_fields_and_methods() {
    let msg =
        message(r#"{"jsonrpc":"2.0","method":"_vendor/x","params":{"weird":[1,2]},"extra":true}"#);
    assert_eq!(msg.method(), Some("_vendor/x"));
}

#[test]
fn rejects_malformed_lines_with_a_reason() {
    assert!(matches!(reason(r#"{"jsonrpc":"2.0","id":1,"#), InvalidReason::NotJson(_)));
    assert_eq!(reason(r#"[{"jsonrpc":"2.0","method":"x"}]"#), InvalidReason::Batch);
    assert_eq!(reason(r#"42"#), InvalidReason::NotAnObject);
    assert_eq!(reason(r#"{"id":1,"method":"x"}"#), InvalidReason::MissingVersion);
    assert_eq!(reason(r#"{"jsonrpc":"1.0","id":1,"method":"x"}"#), InvalidReason::MissingVersion);
    assert_eq!(reason(r#"{"jsonrpc":"2.0","id":null,"method":"x"}"#), InvalidReason::NullId);
    assert_eq!(
        reason(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"p"}}"#),
        InvalidReason::NullId
    );
    assert_eq!(reason(r#"{"jsonrpc":"2.0","id":1.5,"method":"x"}"#), InvalidReason::BadId);
    assert_eq!(reason(r#"{"jsonrpc":"2.0","id":{},"method":"x"}"#), InvalidReason::BadId);
    assert_eq!(reason(r#"{"jsonrpc":"2.0","id":1,"method":3}"#), InvalidReason::BadMethod);
    assert_eq!(reason(r#"{"jsonrpc":"2.0","method":"x","params":"s"}"#), InvalidReason::BadParams);
    assert_eq!(reason(r#"{"jsonrpc":"2.0","id":1}"#), InvalidReason::BadResponse);
    assert_eq!(
        reason(r#"{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1,"message":"m"}}"#),
        InvalidReason::BadResponse
    );
    assert_eq!(reason(r#"{"jsonrpc":"2.0","id":1,"error":"oops"}"#), InvalidReason::BadResponse);
    assert_eq!(reason(r#"{"jsonrpc":"2.0"}"#), InvalidReason::Unrecognised);
    assert!(matches!(reason("hello world"), InvalidReason::NotJson(_)));
    match decode(b"\xff\xfe{}") {
        Decoded::Invalid(Invalid { reason: InvalidReason::NotUtf8, excerpt }) => {
            assert_eq!(excerpt, b"\xff\xfe{}")
        }
        other => panic!("expected NotUtf8, got {other:?}"),
    }
    assert_eq!(decode(b"   "), Decoded::Blank);
}

#[test]
fn invalid_excerpt_is_bounded() {
    let garbage = vec![b'x'; INVALID_EXCERPT * 3];
    let Decoded::Invalid(invalid) = decode(&garbage) else { panic!("garbage must be invalid") };
    assert_eq!(invalid.excerpt.len(), INVALID_EXCERPT);
}

#[tokio::test]
async fn cuts_lines_and_skips_oversized_ones() {
    let input = b"short\r\n0123456789abcdef\nok\nlast-without-newline";
    assert_eq!(
        lines(input, 10).await,
        vec![
            Line::Complete(b"short".to_vec()),
            Line::TooLong { len: 16 },
            Line::Complete(b"ok".to_vec()),
            Line::TooLong { len: 20 },
        ]
    );
    assert_eq!(
        lines(b"a\n\nb\n", 10).await,
        vec![
            Line::Complete(b"a".to_vec()),
            Line::Complete(Vec::new()),
            Line::Complete(b"b".to_vec())
        ]
    );
}

#[tokio::test]
async fn oversized_line_split_across_reads_is_skipped_exactly() {
    // A tiny BufReader capacity forces the long line to arrive in many pieces.
    let mut input = vec![b'y'; 1000];
    input.extend_from_slice(b"\n{\"jsonrpc\":\"2.0\",\"method\":\"m\"}\n");
    let reader = tokio::io::BufReader::with_capacity(7, input.as_slice());
    let mut reader = LineReader::new(reader, 100);
    assert_eq!(reader.next_line().await.unwrap(), Some(Line::TooLong { len: 1000 }));
    let Some(next) = reader.next_line().await.unwrap() else { panic!("second line lost") };
    assert!(matches!(decode_line(next, 100), Decoded::Message(Message::Notification(_))));
    assert_eq!(reader.next_line().await.unwrap(), None);
}

#[test]
fn encoded_messages_decode_to_themselves() {
    let messages = [
        Message::Request(Request {
            id: Id::Number(3),
            method: "a/b".into(),
            params: Some(json!({"x": "line\nbreak"})),
        }),
        Message::Notification(Notification { method: "n".into(), params: None }),
        Message::Response(Response { id: Id::String("s".into()), result: Ok(json!({})) }),
        Message::Response(Response {
            id: Id::Number(-1),
            result: Err(RpcError::new(ErrorCode::RequestCancelled, "cancelled")
                .with_data(json!({"why": 1}))),
        }),
    ];
    for msg in messages {
        let line = msg.to_line();
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1, "one line per message");
        assert_eq!(decode(&line[..line.len() - 1]), Decoded::Message(msg));
    }
}

proptest! {
    #[test]
    fn decoder_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&bytes);
    }

    #[test]
    fn line_reader_accounts_for_every_byte(
        bytes in proptest::collection::vec(prop_oneof![Just(b'\n'), any::<u8>()], 0..2048),
        max in 1usize..64,
        capacity in 1usize..32,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let got = rt.block_on(async {
            let reader = tokio::io::BufReader::with_capacity(capacity, bytes.as_slice());
            let mut reader = LineReader::new(reader, max);
            let mut out = Vec::new();
            while let Some(line) = reader.next_line().await.unwrap() {
                out.push(line);
            }
            out
        });
        // Reference: split on '\n' in memory.
        let mut expected: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
        if bytes.last() == Some(&b'\n') || bytes.is_empty() {
            expected.pop();
        }
        prop_assert_eq!(got.len(), expected.len());
        for (line, want) in got.iter().zip(expected) {
            let want = want.strip_suffix(b"\r").filter(|_| want.len() <= max).unwrap_or(want);
            match line {
                Line::Complete(bytes) => prop_assert_eq!(bytes.as_slice(), want),
                Line::TooLong { len } => {
                    prop_assert!(*len > max);
                    prop_assert_eq!(*len, want.len());
                }
            }
        }
    }
}

/// Every line the relay check judges, as [`inspect`] judges it: the same shape (and method)
/// or the same reason, the text kept as written.
fn agrees_with_inspect(line: &[u8]) {
    match (inspect_for_relay(line), inspect(line)) {
        (Relayed::Valid { shape, method, message }, Inspected::Valid(same, value)) => {
            assert_eq!(shape, same, "{}", String::from_utf8_lossy(line));
            assert_eq!(method.as_deref(), value.get("method").and_then(Value::as_str));
            assert_eq!(message.get(), String::from_utf8_lossy(line).trim());
        }
        (Relayed::Invalid(relayed), Inspected::Invalid(invalid)) => {
            assert_eq!(relayed.reason, invalid.reason)
        }
        (Relayed::Blank, Inspected::Blank) => {}
        (relayed, inspected) => panic!(
            "{}: the relay check says {relayed:?}, inspect {inspected:?}",
            String::from_utf8_lossy(line)
        ),
    }
}

#[test]
fn the_relay_check_judges_every_line_as_inspect_does() {
    let lines: &[&[u8]] = &[
        br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a \"quoted\" \u00e9 word"}}}}"#,
        br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}"#,
        br#"{"jsonrpc":"2.0","id":"a","method":"fs/read_text_file","params":[1,2]}"#,
        br#"{"jsonrpc":"2.0","method":"session/cancel"}"#,
        br#"{"jsonrpc":"2.0","id":"a","result":null}"#,
        br#"{"jsonrpc":"2.0","id":-3,"result":{"stopReason":"end_turn"},"extra":[1,{"x":null}]}"#,
        br#"{"jsonrpc":"2.0","id":7,"error":{"code":-32002,"message":"no such session"}}"#,
        br#"{"jsonrpc":"2.0","id":7,"error":{"code":"x","message":"m"}}"#,
        br#"  {"result":true,"id":9,"jsonrpc":"2.0"}  "#,
        // What only `inspect` judges: odd ids, null members, duplicates, bad version.
        br#"{"jsonrpc":"2.0","id":1.5,"method":"x"}"#,
        br#"{"jsonrpc":"2.0","id":1e3,"method":"x"}"#,
        br#"{"jsonrpc":"2.0","id":-0,"method":"x"}"#,
        br#"{"jsonrpc":"2.0","id":007,"method":"x"}"#,
        br#"{"jsonrpc":"2.0","id":18446744073709551615,"method":"x"}"#,
        br#"{"jsonrpc":"2.0","id":null,"method":"x"}"#,
        br#"{"jsonrpc":"2.0","id":{},"method":"x"}"#,
        br#"{"jsonrpc":"2.0","method":null,"id":1,"result":1}"#,
        br#"{"jsonrpc":"2.0","method":3}"#,
        br#"{"jsonrpc":"2.0","method":"x","params":null}"#,
        br#"{"jsonrpc":"2.0","method":"x","params":"s"}"#,
        br#"{"jsonrpc":"2.0","method":"x","method":"y"}"#,
        br#"{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1,"message":"m"}}"#,
        br#"{"jsonrpc":"2.0","id":1,"result":1,"error":null}"#,
        br#"{"jsonrpc":"2.0","id":1}"#,
        br#"{"jsonrpc":"2.0"}"#,
        br#"{"jsonrpc":null,"method":"x"}"#,
        br#"{"jsonrpc":"1.0","method":"x"}"#,
        br#"{"jsonrpc":"2.0","method":"x"} trailing"#,
        br#"[{"jsonrpc":"2.0","method":"x"}]"#,
        b"42",
        b"hello",
        b"   ",
        b"{\"jsonrpc\":\"2.0\",\"method\":\"x\",\"params\":{\"k\":\"\xff\xfe\"}}",
        b"{\"jsonrpc\":\"2.0\",\"method\":\"x\",\"skipped\":\"\xff\"}",
        // What a syntax check passes and a full parse refuses (found in review).
        br#"["2.0",1,"x"]"#,
        br#"["2.0","a","x",{}]"#,
        br#"{"jsonrpc":"2.0","method":"x","params":{"k":"\udc00"}}"#,
        br#"{"jsonrpc":"2.0","id":1,"result":"\uD800"}"#,
        br#"{"jsonrpc":"2.0","method":"x","params":{"k":"\ud83d\ude00 a pair"}}"#,
        br#"{"jsonrpc":"2.0","method":"x","skipped":"\udc00"}"#,
        br#"{"jsonrpc":"2.0","id":1,"result":-1e999}"#,
        br#"{"jsonrpc":"2.0","id":1,"result":1E5}"#,
        br#"{"jsonrpc":"2.0","method":"x","params":{"t":"chunk 1e5"}}"#,
        br#"{"jsonrpc":"2.0","method":"x","params":{"t":"C:\\users"}}"#,
    ];
    for line in lines {
        agrees_with_inspect(line);
    }
    let huge = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{}}}"#, "9".repeat(400));
    agrees_with_inspect(huge.as_bytes());
    for depth in [99, 127, 128, 129, 200] {
        let nested = format!(
            r#"{{"jsonrpc":"2.0","method":"x","params":{{"k":{}1{}}}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        agrees_with_inspect(nested.as_bytes());
    }
}

#[test]
fn the_relay_check_reads_the_common_messages_without_a_tree() {
    // The probe alone answers these (the fast path is the one taken).
    let chunk = br#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{}}}"#;
    assert_eq!(probe(chunk), Some((Shape::Notification, Some("session/update".into()))));
    let request =
        br#"{"jsonrpc":"2.0","id":"r1","method":"session/request_permission","params":{}}"#;
    assert_eq!(probe(request), Some((Shape::Request, Some("session/request_permission".into()))));
    assert_eq!(probe(br#"{"jsonrpc":"2.0","id":4,"result":{}}"#), Some((Shape::Response, None)));
}

proptest! {
    #[test]
    fn the_relay_check_agrees_with_inspect_on_arbitrary_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..256)
    ) {
        agrees_with_inspect(&bytes);
    }
}
