//! Tests of the API's wire types.

use super::*;

/// The names `as_str` gives are the ones serde puts on the wire, and parse back.
#[test]
fn wire_names_are_serdes_names() {
    fn check<T>(all: &[T])
    where
        T: Copy + PartialEq + std::fmt::Debug + Serialize + std::str::FromStr + std::fmt::Display,
        <T as std::str::FromStr>::Err: std::fmt::Debug,
    {
        for value in all {
            assert_eq!(serde_json::to_value(value).unwrap(), value.to_string());
            assert_eq!(value.to_string().parse::<T>().unwrap(), *value);
        }
    }
    check(SessionState::ALL);
    check(TurnState::ALL);
    check(ResumeOutcome::ALL);
    check(LaunchStep::ALL);
    check(EntryType::ALL);
    check(SnapshotTrigger::ALL);
    check(WorkflowState::ALL);
    check(StepState::ALL);
    assert_eq!(serde_json::to_value(RuntimeKind::DOCKER).unwrap(), "docker");
    let named: RuntimeKind = serde_json::from_value(serde_json::json!("kubernetes")).unwrap();
    assert_eq!(named, RuntimeKind::named("kubernetes"));
    let err = "FAILD".parse::<SessionState>().unwrap_err();
    assert!(err.contains("FAILED"), "{err}");
}

/// A newer daemon's event type does not break an older client: it reads as `Other`,
/// with its seq.
#[test]
fn an_unknown_event_type_is_skippable() {
    let event: SessionEvent =
        serde_json::from_str(r#"{"seq":9,"at":1,"type":"teleported","id":"s1"}"#).unwrap();
    assert_eq!((event.seq, event.kind), (9, EventKind::Other));
}
