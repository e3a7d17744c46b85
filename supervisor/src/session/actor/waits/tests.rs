//! The waits alone: resumes answered together, the idle deadline, the nearest deadline.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::Waits;
use crate::session::actor::{PendingPause, SummaryStep};
use crate::session::{ResumeOutcome, SessionError};
use protocol::api::SnapshotTrigger;

#[test]
fn everyone_waiting_for_the_open_gets_the_one_answer() {
    let mut waits = Waits::default();
    assert!(!waits.anyone_waits_for_open());
    let (first, mut first_rx) = oneshot::channel();
    let (second, mut second_rx) = oneshot::channel();
    waits.wait_for_open(first);
    waits.wait_for_open(second);
    assert!(waits.anyone_waits_for_open());
    waits.opened(|| Ok(ResumeOutcome::NativeLoad));
    assert!(matches!(first_rx.try_recv(), Ok(Ok(ResumeOutcome::NativeLoad))));
    assert!(matches!(second_rx.try_recv(), Ok(Ok(ResumeOutcome::NativeLoad))));
    assert!(!waits.anyone_waits_for_open(), "answered once");
    let (third, mut third_rx) = oneshot::channel();
    waits.wait_for_open(third);
    waits.opened(|| Err(SessionError::InvalidState("gone".into())));
    assert!(matches!(third_rx.try_recv(), Ok(Err(SessionError::InvalidState(_)))));
}

#[test]
fn the_idle_deadline_is_armed_once_kept_while_idle_and_disarmed_by_work() {
    let mut waits = Waits::default();
    let start = Instant::now();
    let minute = Duration::from_secs(60);
    waits.arm_idle(true, Some(minute), start);
    assert_eq!(waits.next_deadline(), Some(start + minute));
    waits.arm_idle(true, Some(minute), start + Duration::from_secs(30));
    assert_eq!(waits.next_deadline(), Some(start + minute), "kept, not pushed back");
    assert!(!waits.idle_due(start + Duration::from_secs(59)));
    assert!(waits.idle_due(start + minute), "due at its deadline");
    assert_eq!(waits.next_deadline(), None, "disarmed once due");

    waits.arm_idle(true, Some(minute), start);
    waits.arm_idle(false, Some(minute), start);
    assert_eq!(waits.next_deadline(), None, "work disarms it");
    waits.arm_idle(true, None, start);
    assert_eq!(waits.next_deadline(), None, "no timeout: never parked");
    waits.idle_again(start, minute);
    assert_eq!(waits.next_deadline(), Some(start + minute));
}

#[test]
fn the_nearest_deadline_is_a_pauses_force_or_the_park() {
    let mut waits = Waits::default();
    let start = Instant::now();
    waits.idle_again(start, Duration::from_secs(60));
    waits.pause = Some(PendingPause {
        reason: None,
        force_at: Some(start + Duration::from_secs(5)),
        forced: false,
        trigger: SnapshotTrigger::Pause,
        wait: Duration::from_secs(5),
        summary: SummaryStep::NotAsked,
    });
    assert_eq!(waits.next_deadline(), Some(start + Duration::from_secs(5)));
    waits.pause.as_mut().expect("a pause").force_at = None;
    assert_eq!(waits.next_deadline(), Some(start + Duration::from_secs(60)));
}
