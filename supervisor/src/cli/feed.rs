//! A session's events as a client follows them: the resubscribing stream the supervisor
//! reads agentctl with ([`agentctl::resubscribe`]), over the daemon's `session.subscribe`,
//! reconnecting when the daemon restarts within the reconnect window (`follow_restarts`).

use agentctl::resubscribe::{Resubscribing, Source};

use super::{
    ApiClient, Arc, Client, Exit, Failure, MAX_EMPTY_RESUBSCRIBES, SessionEvent, SessionState,
    Shown, Subscription, Target, WsClient, call_failure,
};

/// A session's events from a cursor, in order, each once: a gap (the client library drops a
/// notification when the reader falls behind) or an ended subscription subscribes again
/// after the last event seen.
pub(super) struct Feed<'a> {
    events: Resubscribing<Subscriptions<'a>>,
}

/// A session's event subscriptions on the daemon.
pub(super) struct Subscriptions<'a> {
    target: Target,
    client: Arc<WsClient>,
    shown: &'a Shown,
    session: String,
    /// The batched subscription (`task.session.subscribe_batch`: one message carries the
    /// events the daemon had ready, so a fast stream is not a message per event).
    subscription: Option<Subscription<protocol::api::EventBatch>>,
    /// A closed connection is opened again (the daemon restarted), not the end.
    follow_restarts: bool,
    /// The session's newest event when the feed (re)connected.
    last_seq: u64,
    /// The session's state when the feed (re)connected.
    state: SessionState,
    /// Subscriptions in a row that brought no event: a stream the daemon keeps ending is an
    /// error, not a loop.
    empty_resubscribes: u32,
}

impl Subscriptions<'_> {
    /// Connects to the daemon again (it went away) and reads where the session is.
    async fn reconnect(&mut self) -> Result<(), Failure> {
        self.subscription = None;
        self.client = Arc::new(self.target.reopen(self.shown).await?);
        let status = self
            .client
            .session_status(self.session.clone())
            .await
            .map_err(|e| call_failure(&self.target, &self.client, e))?;
        self.last_seq = status.last_event_seq;
        self.state = status.state;
        self.empty_resubscribes = 0;
        Ok(())
    }
}

impl Source for Subscriptions<'_> {
    type Item = SessionEvent;
    type Error = Failure;

    fn seq(event: &SessionEvent) -> u64 {
        event.seq
    }

    async fn subscribe(&mut self, after: u64) -> Result<(), Failure> {
        self.subscription = None;
        if !self.client.is_connected() {
            if !self.follow_restarts {
                return Err(Failure {
                    code: Exit::NotRunning,
                    line: format!(
                        "server not running at {} (the connection closed)",
                        self.target.url
                    ),
                });
            }
            self.reconnect().await?;
        }
        self.empty_resubscribes += 1;
        if self.empty_resubscribes > MAX_EMPTY_RESUBSCRIBES {
            return Err(Failure {
                code: Exit::Error,
                line: format!(
                    "error: the daemon at {} keeps ending the event stream of session {}",
                    self.target.url, self.session
                ),
            });
        }
        let subscription = self
            .client
            .session_subscribe_batch(self.session.clone(), Some(after))
            .await
            .map_err(|e| call_failure(&self.target, &self.client, e))?;
        self.subscription = Some(subscription);
        Ok(())
    }

    async fn next_batch(&mut self) -> Option<Result<Vec<SessionEvent>, Failure>> {
        match self.subscription.as_mut()?.next().await? {
            Ok(events) => Some(Ok(events.0)),
            Err(err) => Some(Err(Failure {
                code: Exit::Error,
                line: format!("error: malformed event: {err}"),
            })),
        }
    }
}

impl<'a> Feed<'a> {
    /// The session's events after `after`, or, without one, from its newest event on
    /// (what happens after now).
    pub(super) async fn open(
        client: &Client,
        session: &str,
        after: Option<u64>,
        shown: &'a Shown,
    ) -> Result<Feed<'a>, Failure> {
        let status = client
            .client
            .session_status(session.to_owned())
            .await
            .map_err(|e| client.failure(e))?;
        let after = after.unwrap_or(status.last_event_seq);
        let subscription = client
            .client
            .session_subscribe_batch(session.to_owned(), Some(after))
            .await
            .map_err(|e| client.failure(e))?;
        let subscriptions = Subscriptions {
            target: client.target.clone(),
            client: Arc::clone(&client.client),
            shown,
            session: session.to_owned(),
            subscription: Some(subscription),
            follow_restarts: false,
            last_seq: status.last_event_seq,
            state: status.state,
            empty_resubscribes: 0,
        };
        Ok(Feed { events: Resubscribing::subscribed(subscriptions, after) })
    }

    /// A daemon restart is followed (the connection is opened again), not the end.
    pub(super) fn follow_restarts(&mut self) {
        self.events.source_mut().follow_restarts = true;
    }

    /// The last seq delivered.
    pub(super) fn cursor(&self) -> u64 {
        self.events.cursor()
    }

    /// The session's newest event when the feed (re)connected.
    pub(super) fn last_seq(&self) -> u64 {
        self.events.source().last_seq
    }

    /// The session's state when the feed (re)connected.
    pub(super) fn state(&self) -> SessionState {
        self.events.source().state
    }

    /// Connects to the daemon again (it went away) and resubscribes after the cursor.
    pub(super) async fn reconnect(&mut self) -> Result<(), Failure> {
        self.events.source_mut().reconnect().await?;
        self.events.resubscribe().await
    }

    /// Every event up to the newest one at (re)connection has been delivered.
    pub(super) fn caught_up(&self) -> bool {
        self.cursor() >= self.last_seq()
    }

    /// Events received and not yet taken: [`Feed::next`] answers at once.
    pub(super) fn has_queued(&self) -> bool {
        self.events.has_queued()
    }

    /// The next event; meanwhile a launch step waited in says how long it has waited
    /// (see [`Shown::tick`]).
    pub(super) async fn next(&mut self) -> Result<SessionEvent, Failure> {
        let shown: &Shown = self.events.source().shown;
        let event = loop {
            let tick = shown.until_tick();
            tokio::select! {
                event = self.events.next() => break event?,
                () = tokio::time::sleep(tick.unwrap_or_default()), if tick.is_some() => {
                    shown.tick();
                }
            }
        };
        self.events.source_mut().empty_resubscribes = 0;
        Ok(event)
    }
}
