//! Session subscriptions: a session's event log, read from any seq, sent to a client as
//! it grows.

/// Sends every entry of `reader` on `sink`, as `wire` makes it, until the client goes
/// away: a session subscription (whose log records keep marks of their own that
/// subscribers do not get).
pub(super) async fn stream_spool<E: agentctl::spool::Entry, W: serde::Serialize>(
    sink: jsonrpsee::SubscriptionSink,
    mut reader: agentctl::spool::SpoolReader<E>,
    wire: impl Fn(E) -> W,
) -> Result<(), jsonrpsee::core::SubscriptionError> {
    loop {
        let entry = tokio::select! {
            biased;
            _ = sink.closed() => return Ok(()),
            entry = reader.next() => entry.map_err(|err| err.to_string())?,
        };
        let message =
            serde_json::value::to_raw_value(&wire(entry)).map_err(|err| err.to_string())?;
        if sink.send(message).await.is_err() {
            // The connection is gone; the client resumes from its last seq.
            return Ok(());
        }
    }
}

/// [`stream_spool`] in batches: each notification an array of the entries that were ready
/// at once (up to `max`), as `wire` makes them.
pub(super) async fn stream_spool_batches<E: agentctl::spool::Entry, W: serde::Serialize>(
    sink: jsonrpsee::SubscriptionSink,
    mut reader: agentctl::spool::SpoolReader<E>,
    max: usize,
    wire: impl Fn(E) -> W,
) -> Result<(), jsonrpsee::core::SubscriptionError> {
    loop {
        let entries = tokio::select! {
            biased;
            _ = sink.closed() => return Ok(()),
            entries = reader.next_batch(max) => entries.map_err(|err| err.to_string())?,
        };
        let batch: Vec<W> = entries.into_iter().map(&wire).collect();
        let message = serde_json::value::to_raw_value(&batch).map_err(|err| err.to_string())?;
        if sink.send(message).await.is_err() {
            return Ok(());
        }
    }
}
