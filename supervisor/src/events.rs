//! The events a session publishes to API subscribers, spooled per session under
//! `sessions/<id>/events/` (agentctl's spool, which is generic over its entries) so that a
//! client reconnecting with `after_seq` misses nothing.

use serde::{Deserialize, Serialize};

/// How much of a session's event log is kept: it is cut in segments of `segment_bytes`, and
/// once it holds more than `retain_bytes` its oldest segments are dropped — so at least the
/// newest `retain_bytes − segment_bytes` stay. `task.session.subscribe` delivers every event
/// after `after_seq` when the log still holds it, and refuses an `after_seq` before what it
/// holds (`invalid_params`, field `after_seq`, naming the oldest seq kept); the
/// conversation itself stays whole in the history.
#[derive(Debug, Clone, Copy)]
pub struct LogLimits {
    /// Keep at least the newest this many bytes.
    pub retain_bytes: u64,
    /// Segment size.
    pub segment_bytes: u64,
}

/// The default of [`LogLimits::retain_bytes`]: 64 MiB, about 600,000 chunk events.
pub const DEFAULT_RETAIN_BYTES: u64 = 64 << 20;

/// One session event.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionEvent {
    /// From 1, without gaps, per session.
    pub seq: u64,
    /// Unix ms.
    pub at: u64,
    /// The newest agentctl event seq handled when this was emitted; after a restart, events
    /// at or below it are not emitted again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_seq: Option<u64>,
    /// The execution (its generation) whose events `agent_seq` counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// In a batch written at once: the seq of its last event. The batch's events share one
    /// `agent_seq`, so a batch a kill left half-written is cut whole when the log is
    /// reopened (its mark would claim the events that are missing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_last: Option<u64>,
    /// What happened.
    #[serde(flatten)]
    pub kind: SessionEventKind,
}

impl agentctl::spool::Entry for SessionEvent {
    fn seq(&self) -> u64 {
        self.seq
    }

    fn batch_last(&self) -> Option<u64> {
        self.batch_last
    }

    fn set_batch_last(&mut self, last: u64) {
        self.batch_last = Some(last);
    }

    /// A `notice` in the place of an event the log cannot give (a damaged line, lines cut
    /// or deleted): clients follow seqs one by one and take a missing one for a dropped
    /// notification, so every seq is delivered, this one saying why it holds nothing else.
    fn unreadable(seq: u64, at: u64, why: &str) -> Option<Self> {
        Some(SessionEvent {
            seq,
            at,
            agent_seq: None,
            generation: None,
            batch_last: None,
            kind: SessionEventKind::Notice { message: why.to_owned() },
        })
    }
}

/// What a session event says: the API's event kinds. The log exists to replay exactly what
/// subscribers are sent, so it stores the wire payload; only the marks around it
/// (`agent_seq`, `generation`, `batch_last`) are the log's own and never leave the daemon.
pub use protocol::api::{EventKind as SessionEventKind, LaunchStep};

impl SessionEvent {
    /// The event as subscribers get it.
    pub fn to_wire(&self) -> protocol::api::SessionEvent {
        protocol::api::SessionEvent { seq: self.seq, at: self.at, kind: self.kind.clone() }
    }
}

/// A log line of the kinds a stream is made of (agent message and thought chunks, most of
/// every stream), read without building the event: its marks, and the kind's members
/// borrowed from the text. Any other line, or one with a member this does not know, is
/// `None` and takes the general path ([`SessionEvent::to_wire`]).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChunkLine<'a> {
    seq: u64,
    at: u64,
    #[serde(default)]
    #[allow(dead_code, reason = "the log's own mark: read to be known, never sent")]
    agent_seq: Option<u64>,
    #[serde(default)]
    #[allow(dead_code, reason = "the log's own mark: read to be known, never sent")]
    generation: Option<i64>,
    #[serde(default)]
    #[allow(dead_code, reason = "the log's own mark: read to be known, never sent")]
    batch_last: Option<u64>,
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    text: &'a serde_json::value::RawValue,
    #[serde(default, borrow)]
    message_id: Option<&'a serde_json::value::RawValue>,
}

/// The wire form of a [`ChunkLine`]: the same members in the order the general path writes
/// them, the text copied as it was written.
#[derive(Serialize)]
struct ChunkWire<'a> {
    seq: u64,
    at: u64,
    #[serde(rename = "type")]
    kind: &'a str,
    text: &'a serde_json::value::RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    message_id: Option<&'a serde_json::value::RawValue>,
}

impl SessionEvent {
    /// The event a log line holds as subscribers get it, straight from the line's text when
    /// it is a chunk (a stream's relay then never builds the event); `None` for every
    /// other line, which [`SessionEvent::to_wire`] makes instead. The same JSON either
    /// way (tested).
    pub fn wire_from_line(line: &[u8]) -> Option<Box<serde_json::value::RawValue>> {
        let chunk: ChunkLine = serde_json::from_slice(line).ok()?;
        let known = matches!(&*chunk.kind, "agent_message_chunk" | "agent_thought_chunk");
        // Strings only, as the general path reads them (a `null` id is absent there too),
        // escaped as serde_json writes them, so the text going out is the general path's
        // (`\u` escapes — control characters, surrogates — and `\/` take that path).
        let string = |raw: &serde_json::value::RawValue| {
            let mut bytes = raw.get().bytes();
            bytes.next() == Some(b'"')
                && std::iter::from_fn(|| {
                    bytes.find(|&b| b == b'\\').map(|_| bytes.next().unwrap_or_default())
                })
                .all(|escaped| matches!(escaped, b'"' | b'\\' | b'n' | b'r' | b't' | b'b' | b'f'))
        };
        if !known || !string(chunk.text) || !chunk.message_id.is_none_or(string) {
            return None;
        }
        let wire = ChunkWire {
            seq: chunk.seq,
            at: chunk.at,
            kind: &chunk.kind,
            text: chunk.text,
            message_id: chunk.message_id,
        };
        serde_json::value::to_raw_value(&wire).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::api::{EventKind, SessionState};

    fn logged(kind: EventKind, marks: bool) -> (SessionEvent, Vec<u8>) {
        let event = SessionEvent {
            seq: 41,
            at: 1_795_770_525_644,
            agent_seq: marks.then_some(273_605),
            generation: marks.then_some(-2),
            batch_last: marks.then_some(43),
            kind,
        };
        let line = serde_json::to_vec(&event).unwrap();
        (event, line)
    }

    #[test]
    fn a_chunk_line_goes_out_as_the_general_path_writes_its_event() {
        let texts = ["chunk 1 ", "a \"quoted\"\n\ttab\r\u{8}\u{c} \u{e9} \u{1f600} \\ end", ""];
        for text in texts {
            for message_id in [None, Some("m\"1".to_owned())] {
                for marks in [true, false] {
                    let kinds = [
                        EventKind::AgentMessageChunk {
                            text: text.to_owned(),
                            message_id: message_id.clone(),
                        },
                        EventKind::AgentThoughtChunk {
                            text: text.to_owned(),
                            message_id: message_id.clone(),
                        },
                    ];
                    for kind in kinds {
                        let (event, line) = logged(kind, marks);
                        let fast = SessionEvent::wire_from_line(&line).expect("a chunk line");
                        let general = serde_json::to_string(&event.to_wire()).unwrap();
                        assert_eq!(fast.get(), general);
                    }
                }
            }
        }
    }

    #[test]
    fn other_lines_take_the_general_path() {
        let (_, state) =
            logged(EventKind::State { state: SessionState::WaitingForInput, error: None }, true);
        assert!(SessionEvent::wire_from_line(&state).is_none());
        // A member the fast path does not know, a text that is not a string, a damaged line.
        let unknown = br#"{"seq":1,"at":2,"type":"agent_message_chunk","text":"t","extra":1}"#;
        let number = br#"{"seq":1,"at":2,"type":"agent_message_chunk","text":5}"#;
        let id = br#"{"seq":1,"at":2,"type":"agent_message_chunk","text":"t","message_id":[]}"#;
        // Escapes serde_json would not write as they stand: the general path writes them.
        let control = logged(
            EventKind::AgentMessageChunk { text: "bell \u{7}".into(), message_id: None },
            true,
        )
        .1;
        let unicode = br#"{"seq":1,"at":2,"type":"agent_message_chunk","text":"\u0041"}"#;
        let slash = br#"{"seq":1,"at":2,"type":"agent_message_chunk","text":"a\/b"}"#;
        let surrogate = br#"{"seq":1,"at":2,"type":"agent_message_chunk","text":"\ud800"}"#;
        for line in [&control[..], unicode, slash, surrogate] {
            assert!(SessionEvent::wire_from_line(line).is_none(), "{}", line.escape_ascii());
        }
        for line in [&unknown[..], number, id, b"{\"seq\":1,\"at\":2,\"ty"] {
            assert!(SessionEvent::wire_from_line(line).is_none(), "{}", line.escape_ascii());
        }
        // A null id is an absent one, as the general path reads it.
        let null = br#"{"seq":1,"at":2,"type":"agent_message_chunk","text":"t","message_id":null}"#;
        let fast = SessionEvent::wire_from_line(null).expect("a chunk line");
        let event: SessionEvent = serde_json::from_slice(null).unwrap();
        assert_eq!(fast.get(), serde_json::to_string(&event.to_wire()).unwrap());
    }
}
