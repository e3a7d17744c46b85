//! A batch of session events as a client reads it (`task.session.events`). Most of a
//! stream is chunks of the agent's text; those are read straight into their event, and
//! every other event through [`SessionEvent`]'s own deserialisation, whose flattened,
//! tagged kind makes serde buffer each member first (the face spent a third of its time
//! there).

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::{EventKind, SessionEvent};

/// The events of one `task.session.events` notification, oldest first. Read from JSON
/// text (`serde_json::from_str`/`from_slice`, as the client library does): each event is
/// borrowed from it before it is read.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventBatch(pub Vec<SessionEvent>);

/// A chunk event's members. Any other member, or a duplicate, makes it not one: the
/// general path reads it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Chunk<'a> {
    seq: u64,
    at: u64,
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    text: Cow<'a, str>,
    #[serde(default, borrow)]
    message_id: Option<Cow<'a, str>>,
}

impl SessionEvent {
    /// One event from its JSON text: what `serde_json::from_str` makes of it (tested),
    /// a chunk without building it member by member.
    pub fn from_wire(json: &str) -> Result<SessionEvent, serde_json::Error> {
        if let Ok(chunk) = serde_json::from_str::<Chunk<'_>>(json) {
            let (text, message_id) = (chunk.text, chunk.message_id.map(Cow::into_owned));
            let kind = match &*chunk.kind {
                "agent_message_chunk" => {
                    Some(EventKind::AgentMessageChunk { text: text.into_owned(), message_id })
                }
                "agent_thought_chunk" => {
                    Some(EventKind::AgentThoughtChunk { text: text.into_owned(), message_id })
                }
                _ => None,
            };
            if let Some(kind) = kind {
                return Ok(SessionEvent { seq: chunk.seq, at: chunk.at, kind });
            }
        }
        serde_json::from_str(json)
    }
}

impl<'de> Deserialize<'de> for EventBatch {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<EventBatch, D::Error> {
        struct Events;

        impl<'de> Visitor<'de> for Events {
            type Value = EventBatch;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of session events")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<EventBatch, A::Error> {
                let mut events = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(event) = seq.next_element::<&'de RawValue>()? {
                    events.push(SessionEvent::from_wire(event.get()).map_err(de::Error::custom)?);
                }
                Ok(EventBatch(events))
            }
        }

        deserializer.deserialize_seq(Events)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The general path's verdict on `json`, and the fast one's, agree: the same event, or
    /// both refuse it.
    fn agree(json: &str) {
        let general = serde_json::from_str::<SessionEvent>(json).ok();
        assert_eq!(SessionEvent::from_wire(json).ok(), general, "{json}");
    }

    #[test]
    fn a_chunk_read_straight_is_the_event_the_general_path_reads() {
        let cases = [
            r#"{"seq":1,"at":2,"type":"agent_message_chunk","text":"hello"}"#,
            r#"{"seq":1,"at":2,"type":"agent_thought_chunk","text":"hm","message_id":"m1"}"#,
            r#"{"type":"agent_message_chunk","text":"a\"b\\c\n\u0041\ud83d\ude00","at":2,"seq":9}"#,
            r#"{"seq":1,"at":2,"type":"agent_message_chunk","text":"x","message_id":null}"#,
            r#"{"seq":1,"at":2,"type":"agent_message_chunk","text":""}"#,
            // Not chunks as the fast path reads them: the general path decides.
            r#"{"seq":1,"at":2,"type":"agent_message_chunk","text":"x","extra":1}"#,
            r#"{"seq":1,"at":2,"type":"agent_message_chunk","text":"x","text":"y"}"#,
            r#"{"seq":1,"at":2,"type":"agent_message_chunk","text":7}"#,
            r#"{"seq":1,"at":2,"type":"agent_message_chunk"}"#,
            r#"{"seq":-1,"at":2,"type":"agent_message_chunk","text":"x"}"#,
            r#"{"seq":1.5,"at":2,"type":"agent_message_chunk","text":"x"}"#,
            r#"{"seq":1,"at":2,"type":"agent_message_chunk","text":"\ud800"}"#,
            r#"{"seq":1,"at":2,"type":"no_such_kind","text":"x"}"#,
            r#"{"seq":1,"at":2,"type":"state","state":"RUNNING"}"#,
            r#"{"seq":1,"at":2,"type":"turn_ended","turn_id":"t","stop_reason":"end_turn"}"#,
            r#"{"seq":1,"at":2,"type":"agent_message_chunk","text":"x","message_id":5}"#,
            r#"[1,2]"#,
            r#"{"seq":1,"at":2,"type":"agent_message_chunk","text":"x"} trailing"#,
        ];
        for json in cases {
            agree(json);
        }
    }

    #[test]
    fn a_batch_reads_every_event_in_order_and_refuses_a_bad_one() {
        let json = r#"[{"seq":1,"at":5,"type":"agent_message_chunk","text":"a"},
            {"seq":2,"at":5,"type":"state","state":"RUNNING"},
            {"seq":3,"at":6,"type":"agent_thought_chunk","text":"b","message_id":"m"}]"#;
        let batch: EventBatch = serde_json::from_str(json).expect("a batch");
        let general: Vec<SessionEvent> = serde_json::from_str(json).expect("events");
        assert_eq!(batch.0, general);
        assert_eq!(batch.0.iter().map(|event| event.seq).collect::<Vec<_>>(), [1, 2, 3]);
        let bad = r#"[{"seq":1,"at":5,"type":"agent_message_chunk","text":"a"},{"seq":2}]"#;
        assert!(serde_json::from_str::<EventBatch>(bad).is_err());
        assert!(serde_json::from_str::<EventBatch>(r#"{"seq":1}"#).is_err());
        let empty: EventBatch = serde_json::from_str("[]").expect("an empty batch");
        assert!(empty.0.is_empty());
    }

    proptest! {
        #[test]
        fn any_chunk_the_daemon_writes_reads_back_as_it_was(
            text in any::<String>(),
            id in proptest::option::of(any::<String>()),
            thought in any::<bool>(),
            seq in any::<u64>(),
        ) {
            let (text, message_id) = (text.clone(), id.clone());
            let kind = if thought {
                EventKind::AgentThoughtChunk { text, message_id }
            } else {
                EventKind::AgentMessageChunk { text, message_id }
            };
            let event = SessionEvent { seq, at: 7, kind };
            let json = serde_json::to_string(&event).expect("an event serialises");
            prop_assert_eq!(SessionEvent::from_wire(&json).ok(), Some(event));
        }

        #[test]
        fn arbitrary_text_gets_the_general_paths_verdict(json in "\\PC{0,80}") {
            agree(&json);
        }
    }
}
