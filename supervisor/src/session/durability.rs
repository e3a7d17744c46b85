//! What may be acknowledged to agentctl, and when.
//!
//! The invariant (**ack ≤ durable**): agentctl's acknowledged prefix never passes what is
//! durable in the session's history, its event log and the store. Three things keep it:
//! - the ack point stops short of the first chunk of a message that is still being
//!   coalesced in memory, and of a tool call held until the agent names it (neither is on
//!   any disk yet; after a restart they are rebuilt from agentctl's replay, which needs
//!   those events);
//! - the history and the event log are synced, and `acked_seq` is stored, before
//!   `events.ack` is sent — a kill between the two leaves the store *ahead* of agentctl,
//!   which only means some events are replayed and skipped;
//! - a failed sync or store write acknowledges nothing.

/// How many handled events may wait before an ack is tried.
pub(super) const ACK_EVERY: u64 = 256;

/// The actor's bookkeeping of agentctl seqs.
#[derive(Debug, Default)]
pub(super) struct Durability {
    /// agentctl seqs at or below this were written to the history before a restart.
    pub(super) history_mark: u64,
    /// agentctl seqs at or below this were written to the event log before a restart.
    pub(super) events_mark: u64,
    /// The newest agentctl seq handled.
    pub(super) handled: u64,
    /// Events handled since the last ack.
    pub(super) unacked: u64,
    /// The seq stored as `acked_seq` and sent to agentctl last.
    pub(super) acked: u64,
}

impl Durability {
    /// Bookkeeping for an execution whose events were acknowledged up to `acked`, with the
    /// marks read back from the history and the event log.
    pub(super) fn resuming_at(acked: u64, history_mark: u64, events_mark: u64) -> Durability {
        Durability { history_mark, events_mark, handled: acked, unacked: 0, acked }
    }

    /// The highest seq that may be acknowledged now: everything handled, except a message
    /// still coalescing from `unflushed_since` on.
    pub(super) fn ack_point(&self, unflushed_since: Option<u64>) -> u64 {
        match unflushed_since {
            Some(first) => self.handled.min(first.saturating_sub(1)),
            None => self.handled,
        }
    }

    /// The seq to acknowledge now, if any: `force` at turn ends and exits, otherwise once
    /// [`ACK_EVERY`] events were handled since the last ack.
    pub(super) fn due(&self, unflushed_since: Option<u64>, force: bool) -> Option<u64> {
        if !force && self.unacked < ACK_EVERY {
            return None;
        }
        let point = self.ack_point(unflushed_since);
        (point > self.acked).then_some(point)
    }

    /// Records that `seq` was stored and sent.
    pub(super) fn acked(&mut self, seq: u64) {
        self.acked = seq;
        self.unacked = 0;
    }

    /// Whether an event was recorded in the history before a restart.
    pub(super) fn in_history(&self, seq: u64) -> bool {
        seq <= self.history_mark
    }

    /// Whether an event was published to the event log before a restart.
    pub(super) fn in_events(&self, seq: u64) -> bool {
        seq <= self.events_mark
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ack_point_stops_before_a_coalescing_message() {
        let mut durability = Durability { handled: 1000, unacked: 300, ..Durability::default() };
        assert_eq!(durability.due(None, false), Some(1000));
        // A message began at seq 40 and is still in memory: nothing from 40 on is durable.
        assert_eq!(durability.due(Some(40), false), Some(39));
        durability.acked(39);
        assert_eq!(durability.due(Some(40), true), None, "nothing new is durable");
        durability.unacked = ACK_EVERY;
        assert_eq!(durability.due(Some(40), false), None);
        assert_eq!(durability.due(None, false), Some(1000), "flushed: all of it");
    }

    #[test]
    fn acks_wait_for_enough_events_unless_forced() {
        let mut durability = Durability::resuming_at(10, 8, 9);
        durability.handled = 20;
        durability.unacked = 10;
        assert_eq!(durability.due(None, false), None);
        assert_eq!(durability.due(None, true), Some(20));
        assert!(durability.in_history(8) && !durability.in_history(9));
        assert!(durability.in_events(9) && !durability.in_events(10));
    }
}
