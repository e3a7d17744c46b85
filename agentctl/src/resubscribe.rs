//! One ordered stream over subscriptions that may end or drop items: agentctl's events as
//! the supervisor reads them, and a session's events as the CLI follows them.
//!
//! Both producers number their items without gaps, and the client library drops a
//! notification when a subscriber falls behind (and may deliver later ones before it
//! closes the subscription). So a gap, or an ended subscription, means: subscribe again
//! after the last item delivered. Items at or below that cursor are skipped (a
//! resubscription repeats them); an item numbered 0 is outside the sequence and delivered
//! as it is.
//!
//! A gap that a new subscription shows again, at the same place, is no dropped
//! notification (a new subscription's first notification is never dropped: nothing is
//! buffered before it): the producer cannot give those items (a damaged or cut spool, whose
//! reader says so). It is taken, and the stream goes on after it, rather than resubscribing
//! forever.

use std::collections::VecDeque;
use std::future::Future;

/// Where the items come from: a subscription that can be (re)started after a seq.
pub trait Source: Send {
    type Item: Send;
    type Error: Send;

    /// The item's seq (0: outside the sequence).
    fn seq(item: &Self::Item) -> u64;

    /// Subscribes after `after`, replacing the current subscription: on the same
    /// connection while it lives, else as the source sees fit (reconnect, or fail).
    fn subscribe(&mut self, after: u64) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// The items of the current subscription's next notification; `None` once it ended.
    fn next_batch(
        &mut self,
    ) -> impl Future<Output = Option<Result<Vec<Self::Item>, Self::Error>>> + Send;
}

/// Items in order, each once and without gaps, across lagging and ended subscriptions.
#[derive(Debug)]
pub struct Resubscribing<S: Source> {
    source: S,
    /// The last seq delivered.
    cursor: u64,
    /// The source holds a subscription after the cursor (else the next read starts one).
    subscribed: bool,
    /// Items of the last notification not returned yet.
    queued: VecDeque<S::Item>,
    /// The last gap met, as `(cursor, seq after it)`: met again right after resubscribing,
    /// it is a hole in the source, not a dropped notification.
    gap: Option<(u64, u64)>,
}

impl<S: Source> Resubscribing<S> {
    /// Items after `after`; the first read subscribes.
    pub fn new(source: S, after: u64) -> Self {
        Resubscribing {
            source,
            cursor: after,
            subscribed: false,
            queued: VecDeque::new(),
            gap: None,
        }
    }

    /// Items after `after` from a source already subscribed there.
    pub fn subscribed(source: S, after: u64) -> Self {
        Resubscribing { subscribed: true, ..Self::new(source, after) }
    }

    /// The last seq delivered.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Whether the next item is already here (returning it needs no I/O): a queued item that
    /// follows the cursor, past any repeats (after a gap, `next` subscribes again).
    pub fn has_queued(&self) -> bool {
        let next = self.queued.iter().map(S::seq).find(|&seq| seq == 0 || seq > self.cursor);
        next.is_some_and(|seq| seq == 0 || seq == self.cursor + 1)
    }

    pub fn source(&self) -> &S {
        &self.source
    }

    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    /// Subscribes again after the cursor now (e.g. after the source reconnected).
    pub async fn resubscribe(&mut self) -> Result<(), S::Error> {
        self.queued.clear();
        self.subscribed = false;
        Box::pin(self.source.subscribe(self.cursor)).await?;
        self.subscribed = true;
        Ok(())
    }

    /// The next item. A source's error is returned as it is (the next call subscribes
    /// again, after the cursor).
    pub async fn next(&mut self) -> Result<S::Item, S::Error> {
        loop {
            if let Some(item) = self.queued.pop_front() {
                match S::seq(&item) {
                    0 => return Ok(item),
                    seq if seq <= self.cursor => continue,
                    seq if seq > self.cursor + 1 && self.gap == Some((self.cursor, seq)) => {
                        tracing::warn!(
                            cursor = self.cursor,
                            seq,
                            "the same gap after resubscribing: those items cannot be had"
                        );
                        self.gap = None;
                        self.cursor = seq;
                        return Ok(item);
                    }
                    seq if seq > self.cursor + 1 => {
                        tracing::debug!(
                            cursor = self.cursor,
                            seq,
                            "gap in a stream; resubscribing"
                        );
                        self.gap = Some((self.cursor, seq));
                        self.queued.clear();
                        self.subscribed = false;
                    }
                    seq => {
                        self.gap = None;
                        self.cursor = seq;
                        return Ok(item);
                    }
                }
                continue;
            }
            if !self.subscribed {
                // Boxed: (re)connecting is a large future, and a rare one; inline it would
                // make every `next` (and whatever holds one) that large.
                Box::pin(self.source.subscribe(self.cursor)).await?;
                self.subscribed = true;
            }
            match self.source.next_batch().await {
                Some(Ok(items)) => self.queued.extend(items),
                Some(Err(err)) => return Err(err),
                None => self.subscribed = false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scripted source: each subscription yields the notifications listed for it.
    struct Script {
        subscriptions: VecDeque<VecDeque<Vec<u64>>>,
        current: VecDeque<Vec<u64>>,
        subscribed_after: Vec<u64>,
    }

    impl Script {
        fn new(subscriptions: Vec<Vec<Vec<u64>>>) -> Script {
            Script {
                subscriptions: subscriptions.into_iter().map(VecDeque::from).collect(),
                current: VecDeque::new(),
                subscribed_after: Vec::new(),
            }
        }
    }

    impl Source for Script {
        type Item = u64;
        type Error = &'static str;

        fn seq(item: &u64) -> u64 {
            *item
        }

        async fn subscribe(&mut self, after: u64) -> Result<(), &'static str> {
            self.subscribed_after.push(after);
            self.current = self.subscriptions.pop_front().ok_or("no more subscriptions")?;
            Ok(())
        }

        async fn next_batch(&mut self) -> Option<Result<Vec<u64>, &'static str>> {
            self.current.pop_front().map(Ok)
        }
    }

    async fn read(stream: &mut Resubscribing<Script>, count: usize) -> Vec<u64> {
        let mut items = Vec::new();
        for _ in 0..count {
            items.push(stream.next().await.expect("an item"));
        }
        items
    }

    /// Found in review: queued items after a gap are not "here" (taking the next one
    /// subscribes again, which waits on the source).
    #[tokio::test]
    async fn queued_items_count_as_here_only_when_the_next_one_follows_the_cursor() {
        let script = Script::new(vec![vec![vec![1, 2]], vec![vec![2, 5, 6]]]);
        let mut stream = Resubscribing::new(script, 0);
        assert_eq!(read(&mut stream, 1).await, [1]);
        assert!(stream.has_queued(), "2 is queued after 1");
        assert_eq!(read(&mut stream, 1).await, [2]);
        assert!(!stream.has_queued());
        stream.queued.extend([1, 2, 4]);
        assert!(!stream.has_queued(), "4 after cursor 2 is a gap");
        stream.queued = VecDeque::from([2, 3]);
        assert!(stream.has_queued(), "the repeat 2 is skipped, 3 follows");
    }

    #[tokio::test]
    async fn a_gap_resubscribes_after_the_last_item_delivered_and_repeats_are_skipped() {
        let script = Script::new(vec![
            // 3 was dropped (the subscriber fell behind): 4 is a gap.
            vec![vec![1, 2], vec![4, 5]],
            // The new subscription repeats 2 (at or below the cursor).
            vec![vec![2, 3, 4], vec![5]],
        ]);
        let mut stream = Resubscribing::new(script, 0);
        assert_eq!(read(&mut stream, 5).await, vec![1, 2, 3, 4, 5]);
        assert_eq!(stream.cursor(), 5);
        assert_eq!(stream.source().subscribed_after, vec![0, 2]);
    }

    #[tokio::test]
    async fn an_ended_subscription_resubscribes_and_unnumbered_items_pass_as_they_are() {
        let script = Script::new(vec![vec![vec![7, 0, 8]], vec![vec![9]]]);
        let mut stream = Resubscribing::subscribed(script, 6);
        // Already subscribed: the script's first subscription is taken by hand.
        stream.source_mut().current = stream.source_mut().subscriptions.pop_front().unwrap();
        assert_eq!(read(&mut stream, 4).await, vec![7, 0, 8, 9]);
        assert_eq!(stream.cursor(), 9);
        assert_eq!(stream.source().subscribed_after, vec![8]);
    }

    /// A gap a new subscription shows again at the same place is a hole in the source (a
    /// damaged spool line, said by its reader): taken, not resubscribed for forever. One
    /// that a resubscription fills was a dropped notification.
    #[tokio::test]
    async fn a_gap_shown_again_after_resubscribing_is_taken() {
        let script = Script::new(vec![
            vec![vec![1, 2], vec![4, 5]],
            vec![vec![4, 5], vec![6]],
            // Later a dropped notification: the resubscription fills it.
            vec![vec![7, 8]],
        ]);
        let mut stream = Resubscribing::new(script, 0);
        assert_eq!(read(&mut stream, 4).await, vec![1, 2, 4, 5]);
        assert_eq!(stream.source().subscribed_after, vec![0, 2]);
        stream.source_mut().current.push_back(vec![8]);
        assert_eq!(read(&mut stream, 3).await, vec![6, 7, 8]);
        assert_eq!(stream.source().subscribed_after, vec![0, 2, 6]);
    }

    #[tokio::test]
    async fn a_failed_subscribe_is_returned_and_the_next_read_tries_again() {
        let script = Script::new(vec![vec![vec![1]]]);
        let mut stream = Resubscribing::new(script, 0);
        assert_eq!(stream.next().await, Ok(1));
        // The subscription ends; the script has no more: the error comes back.
        assert_eq!(stream.next().await, Err("no more subscriptions"));
        assert_eq!(stream.source().subscribed_after, vec![0, 1]);
        stream.source_mut().subscriptions.push_back(VecDeque::from(vec![vec![2]]));
        assert_eq!(stream.next().await, Ok(2));
        assert_eq!(stream.source().subscribed_after, vec![0, 1, 1]);
    }
}
