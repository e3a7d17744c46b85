//! A session's events as a client follows them: resubscribing from the last seq seen when
//! the daemon goes away (a restart) and comes back within the reconnect window.

use super::*;

/// A session's events from a cursor, resubscribing after the last one seen when the
/// client library drops the subscription or a notification (it does when the reader falls
/// behind), and — with `follow_restarts` — reconnecting when the daemon restarts. Session
/// event seqs have no gaps, so a gap means a dropped notification.
pub(super) struct Feed<'a> {
    pub(super) target: Target,
    pub(super) client: Arc<WsClient>,
    pub(super) shown: &'a Shown,
    pub(super) session: String,
    pub(super) cursor: u64,
    /// The session's newest event when the feed (re)connected.
    pub(super) last_seq: u64,
    pub(super) subscription: Subscription<SessionEvent>,
    pub(super) follow_restarts: bool,
    /// The session's state when the feed (re)connected.
    pub(super) state: SessionState,
    /// Resubscriptions in a row that brought no event: a stream the daemon keeps ending
    /// is an error, not a loop.
    pub(super) empty_resubscribes: u32,
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
            .session_subscribe(session.to_owned(), Some(after))
            .await
            .map_err(|e| client.failure(e))?;
        Ok(Feed {
            target: client.target.clone(),
            client: Arc::clone(&client.client),
            shown,
            session: session.to_owned(),
            cursor: after,
            last_seq: status.last_event_seq,
            subscription,
            follow_restarts: false,
            state: status.state,
            empty_resubscribes: 0,
        })
    }

    /// Connects to the daemon again (it went away) and resubscribes after the cursor.
    pub(super) async fn reconnect(&mut self) -> Result<(), Failure> {
        self.client = Arc::new(self.target.reopen(self.shown).await?);
        let status = self
            .client
            .session_status(self.session.clone())
            .await
            .map_err(|e| call_failure(&self.target, &self.client, e))?;
        self.last_seq = status.last_event_seq;
        self.state = status.state;
        self.empty_resubscribes = 0;
        self.resubscribe().await
    }

    /// Every event up to the newest one at (re)connection has been delivered.
    pub(super) fn caught_up(&self) -> bool {
        self.cursor >= self.last_seq
    }

    pub(super) async fn resubscribe(&mut self) -> Result<(), Failure> {
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
            .session_subscribe(self.session.clone(), Some(self.cursor))
            .await
            .map_err(|e| call_failure(&self.target, &self.client, e))?;
        self.subscription = subscription;
        Ok(())
    }

    pub(super) async fn next(&mut self) -> Result<SessionEvent, Failure> {
        loop {
            match self.subscription.next().await {
                Some(Ok(event)) => {
                    if event.seq <= self.cursor {
                        continue;
                    }
                    if event.seq > self.cursor + 1 {
                        self.resubscribe().await?;
                        continue;
                    }
                    self.cursor = event.seq;
                    self.empty_resubscribes = 0;
                    return Ok(event);
                }
                Some(Err(err)) => {
                    return Err(Failure {
                        code: Exit::Error,
                        line: format!("error: malformed event: {err}"),
                    });
                }
                None if self.client.is_connected() => self.resubscribe().await?,
                None if self.follow_restarts => self.reconnect().await?,
                None => {
                    return Err(Failure {
                        code: Exit::NotRunning,
                        line: format!(
                            "server not running at {} (the connection closed)",
                            self.target.url
                        ),
                    });
                }
            }
        }
    }
}
