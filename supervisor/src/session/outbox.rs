//! The one task per execution that makes control calls: messages to the agent
//! (`acp.send`), permission answers and acknowledgements (`events.ack`), in the order the
//! actor queued them. The actor never awaits the sidecar, so a stalled sidecar cannot
//! freeze the session; a call that fails or times out is reported back and the execution is
//! treated as lost (and fenced).

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;

use super::actor::Internal;
use super::{Reply, SessionError};
use crate::sidecar::Control;

/// A control call to make, in order.
#[derive(Debug)]
pub(super) enum Outgoing {
    /// One JSON-RPC message for the agent.
    Acp(Value),
    /// A turn's `session/prompt`; whoever started the turn is answered once it reached
    /// agentctl (an accepted prompt is a delivered prompt).
    Prompt {
        /// The request.
        message: Value,
        /// The turn.
        turn_id: crate::ids::TurnId,
        /// The caller, if any (not for an initial prompt).
        reply: Option<Reply<super::Prompted>>,
    },
    /// The answer to a permission request; its row is deleted once it is sent.
    Answer {
        /// The request.
        request_id: String,
        /// The JSON-RPC response.
        message: Value,
    },
    /// `events.ack`: everything up to this seq is durable (and `acked_seq` is stored).
    Ack(u64),
    /// `intake.hold`: hold the agent's output while nothing can be recorded, or take it
    /// in again.
    Hold(bool),
}

/// Starts the outbox of an execution; returns where to queue calls (boxed: the channel's
/// buffer is allocated in slots of its item's size). The task ends when the
/// sender is dropped or a call fails.
pub(super) fn start_outbox(
    execution_id: crate::ids::ExecutionId,
    calls: Arc<dyn Control>,
    internal_tx: mpsc::UnboundedSender<Internal>,
) -> mpsc::UnboundedSender<Box<Outgoing>> {
    let (outbox_tx, mut outbox_rx) = mpsc::unbounded_channel::<Box<Outgoing>>();
    tokio::spawn(async move {
        while let Some(outgoing) = outbox_rx.recv().await {
            let result = match *outgoing {
                Outgoing::Acp(message) => calls.send_acp(&message).await,
                Outgoing::Prompt { message, turn_id, reply } => {
                    let sent = calls.send_acp(&message).await;
                    if let Some(reply) = reply {
                        let _ = reply.send(match &sent {
                            Ok(()) => Ok(super::Prompted::Started(turn_id)),
                            Err(err) => Err(SessionError::Undelivered(err.to_string())),
                        });
                    }
                    sent
                }
                Outgoing::Answer { request_id, message } => {
                    calls.send_acp(&message).await.map(|()| {
                        let _ = internal_tx.send(Internal::AnswerSent {
                            execution_id: execution_id.clone(),
                            request_id,
                        });
                    })
                }
                Outgoing::Hold(hold) => {
                    // Best effort: an agentctl that cannot hold (an older one) takes the
                    // output in as before, which is no reason to give up on it.
                    if let Err(err) = calls.hold_intake(hold).await {
                        tracing::warn!(execution = %execution_id, %err, hold, "cannot hold the agent's output");
                    }
                    Ok(())
                }
                Outgoing::Ack(seq) => calls.ack(seq).await.map(|_| {
                    // agentctl may now drop everything up to `seq`.
                    agentctl::fault::point("ack.sent");
                }),
            };
            // The agent has exited (agentctl took the call, the agent was gone): not a lost
            // sidecar. agentctl publishes the exit, with its status and stderr tail, on the
            // event stream, and the actor handles it there (a launch fails with that
            // reason; a running turn ends). The handshake's timeout still bounds the wait.
            if let Err(agentctl::client::ClientError::Refused {
                kind: protocol::errors::ErrorKind::NotRunning,
                ..
            }) = &result
            {
                tracing::debug!(execution = %execution_id, "the agent is not running; its exit event follows");
                continue;
            }
            if let Err(err) = result {
                let _ = internal_tx.send(Internal::ControlFailed {
                    execution_id: execution_id.clone(),
                    error: err.to_string(),
                });
                return;
            }
        }
    });
    outbox_tx
}
