//! Session subscriptions: a session's event log, read from any seq, sent to a client as
//! it grows.

use crate::ids::{SessionId, WorkflowId};
use serde_json::value::RawValue;

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
/// at once (up to `max`), as `fast` makes them from a line's text when it can (a stream's
/// chunks), else as `wire` makes them from the parsed entry.
pub(super) async fn stream_spool_batches<E: agentctl::spool::Entry, W: serde::Serialize>(
    sink: jsonrpsee::SubscriptionSink,
    mut reader: agentctl::spool::SpoolReader<E>,
    max: usize,
    fast: impl Fn(&[u8]) -> Option<Box<RawValue>>,
    wire: impl Fn(E) -> W,
) -> Result<(), jsonrpsee::core::SubscriptionError> {
    // An entry the general path cannot write out is refused like a read error.
    let slow = |entry: E| serde_json::value::to_raw_value(&wire(entry));
    loop {
        let entries = tokio::select! {
            biased;
            _ = sink.closed() => return Ok(()),
            entries = reader.next_batch_with(max, |line| fast(line).map(Ok), slow) =>
                entries.map_err(|err| err.to_string())?,
        };
        let batch =
            entries.into_iter().collect::<Result<Vec<_>, _>>().map_err(|err| err.to_string())?;
        // The entries are JSON already: the array is their text, joined.
        let message = serde_json::value::to_raw_value(&batch).map_err(|err| err.to_string())?;
        if sink.send(message).await.is_err() {
            return Ok(());
        }
    }
}

/// A workflow's events after `after_seq`, then each one as it is written: read from the
/// store whenever it announces a change of the workflow (`changes` was subscribed before
/// the first read, so nothing falls between).
pub(super) async fn stream_workflow(
    sink: jsonrpsee::SubscriptionSink,
    supervisor: std::sync::Arc<crate::service::Supervisor>,
    workflow_id: WorkflowId,
    mut after_seq: u64,
    mut changes: tokio::sync::broadcast::Receiver<WorkflowId>,
) -> Result<(), jsonrpsee::core::SubscriptionError> {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let events = supervisor
            .workflow_events(workflow_id.clone(), after_seq, 512)
            .await
            .map_err(|err| err.to_string())?;
        let full = events.len() == 512;
        for event in events {
            after_seq = event.seq;
            let message = serde_json::value::to_raw_value(&event).map_err(|err| err.to_string())?;
            if sink.send(message).await.is_err() {
                return Ok(());
            }
        }
        if full {
            continue;
        }
        loop {
            tokio::select! {
                biased;
                _ = sink.closed() => return Ok(()),
                changed = changes.recv() => match changed {
                    Ok(id) if id == workflow_id => break,
                    Ok(_) => {}
                    Err(RecvError::Lagged(_)) => break,
                    Err(RecvError::Closed) => return Ok(()),
                },
            }
        }
    }
}

/// The session list's changes: each session the store announces is read as it is now (a
/// summary, or gone), and a receiver that fell behind says `resync`.
pub(super) async fn stream_session_list(
    sink: jsonrpsee::SubscriptionSink,
    supervisor: std::sync::Arc<crate::service::Supervisor>,
    mut changes: tokio::sync::broadcast::Receiver<SessionId>,
) -> Result<(), jsonrpsee::core::SubscriptionError> {
    use protocol::api::SessionsEvent;
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let event = tokio::select! {
            biased;
            _ = sink.closed() => return Ok(()),
            changed = changes.recv() => match changed {
                Ok(session_id) => match supervisor.session_summary(&session_id).await {
                    Ok(Some(session)) => SessionsEvent::Changed { session },
                    Ok(None) => SessionsEvent::Deleted { session_id: session_id.into_string() },
                    Err(err) => {
                        tracing::warn!(session = %session_id, %err, "cannot read a changed session for a list");
                        SessionsEvent::Resync
                    }
                },
                Err(RecvError::Lagged(_)) => SessionsEvent::Resync,
                Err(RecvError::Closed) => return Ok(()),
            },
        };
        let message = serde_json::value::to_raw_value(&event).map_err(|err| err.to_string())?;
        if sink.send(message).await.is_err() {
            return Ok(());
        }
    }
}

/// The workflow list's changes: each workflow the store announces is read as it is now (a
/// summary, or gone) and sent when it differs from what this subscriber was last sent of
/// it (a step session's own changes announce its workflow too, mostly changing nothing
/// listed); a receiver that fell behind says `resync`.
pub(super) async fn stream_workflow_list(
    sink: jsonrpsee::SubscriptionSink,
    supervisor: std::sync::Arc<crate::service::Supervisor>,
    mut changes: tokio::sync::broadcast::Receiver<WorkflowId>,
) -> Result<(), jsonrpsee::core::SubscriptionError> {
    use protocol::api::WorkflowsEvent;
    use tokio::sync::broadcast::error::RecvError;
    let mut sent = std::collections::HashMap::new();
    loop {
        let event = tokio::select! {
            biased;
            _ = sink.closed() => return Ok(()),
            changed = changes.recv() => match changed {
                Ok(workflow_id) => match supervisor.workflow_summary(&workflow_id).await {
                    Ok(Some(workflow)) if sent.get(&workflow_id) == Some(&workflow) => continue,
                    Ok(Some(workflow)) => {
                        sent.insert(workflow_id, workflow.clone());
                        WorkflowsEvent::Changed { workflow }
                    }
                    Ok(None) => {
                        sent.remove(&workflow_id);
                        WorkflowsEvent::Deleted { workflow_id: workflow_id.into_string() }
                    }
                    Err(err) => {
                        tracing::warn!(workflow = %workflow_id, %err, "cannot read a changed workflow for a list");
                        sent.clear();
                        WorkflowsEvent::Resync
                    }
                },
                Err(RecvError::Lagged(_)) => {
                    sent.clear();
                    WorkflowsEvent::Resync
                }
                Err(RecvError::Closed) => return Ok(()),
            },
        };
        let message = serde_json::value::to_raw_value(&event).map_err(|err| err.to_string())?;
        if sink.send(message).await.is_err() {
            return Ok(());
        }
    }
}
