//! A bidirectional JSON-RPC peer over any `AsyncRead`/`AsyncWrite` pair.
//!
//! [`connect`] returns three things:
//! - a [`Peer`] handle (cheap to clone) to send requests, notifications and responses;
//! - an [`InboundRx`] carrying the other side's requests, notifications and invalid lines
//!   in exactly the order their lines arrived;
//! - the I/O future, which the caller spawns (or polls in place, in tests).
//!
//! Ordering guarantee: a response is routed to its waiting caller only after every line
//! that preceded it has been queued on the inbound channel. A client that drains the
//! inbound channel after its request completes therefore sees every `session/update`
//! the agent sent before the response.
//!
//! Failure semantics:
//! - At end of input (or a read error) every pending request resolves with
//!   [`PeerError::Closed`]; later requests fail at once with the same error, and the
//!   inbound channel ends.
//! - Dropping a waiting request future removes its entry; a late response for it is logged
//!   and ignored.
//! - When every `Peer` handle is dropped, queued output is flushed and the writer is shut
//!   down (the other side sees EOF); the I/O future still reads until end of input.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot, watch};

use crate::frame::{self, Decoded, Invalid, LineReader};
use crate::message::{Id, Message, Notification, Request, Response, RpcError};

/// Errors from sending requests through a [`Peer`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    /// The connection ended before a response arrived.
    #[error("connection closed")]
    Closed,
    /// The other side answered with a JSON-RPC error.
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// Our params could not be serialised.
    #[error("cannot serialise params for {method}: {source}")]
    Serialize {
        /// The method being called.
        method: String,
        /// The serde error.
        source: serde_json::Error,
    },
    /// The result did not match the expected type.
    #[error("unexpected result for {method}: {source}")]
    Decode {
        /// The method that was called.
        method: String,
        /// The serde error.
        source: serde_json::Error,
    },
    /// A request with this id is already waiting for its response.
    #[error("request id {0} is already in use")]
    DuplicateId(Id),
}

/// Something the other side sent that is not a response to one of our requests.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    /// A request; answer it with [`Peer::respond`].
    Request(Request),
    /// A notification.
    Notification(Notification),
    /// A line that was not a valid message. The connection goes on.
    Invalid(Invalid),
}

/// The ordered stream of [`Inbound`] items. Unbounded on purpose: the reader must never
/// block on a slow consumer while that consumer waits for a response further down the
/// stream (that would deadlock); memory is bounded by what the other side writes.
pub type InboundRx = mpsc::UnboundedReceiver<Inbound>;

/// Settings for [`connect`].
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// The longest line accepted, in bytes; longer ones become
    /// [`frame::InvalidReason::TooLong`].
    pub max_line: usize,
}

impl Default for PeerConfig {
    fn default() -> PeerConfig {
        PeerConfig { max_line: frame::DEFAULT_MAX_LINE }
    }
}

type Reply = Result<Value, RpcError>;

/// Handle to one JSON-RPC connection. Cloning shares the connection.
#[derive(Debug, Clone)]
pub struct Peer {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    next_id: AtomicI64,
    /// Requests waiting for responses. A std mutex: held only to insert or remove one entry,
    /// never across an await.
    pending: Mutex<Pending>,
    /// Encoded lines for the writer. Dropping the last `Shared` closes it, which tells the
    /// writer to flush and shut down.
    out_tx: mpsc::UnboundedSender<Outgoing>,
}

/// What the writer loop is asked to do, in order.
#[derive(Debug)]
enum Outgoing {
    Line(Vec<u8>),
    /// Resolved once every earlier line has been written and flushed.
    Flushed(oneshot::Sender<()>),
}

#[derive(Debug, Default)]
struct Pending {
    closed: bool,
    /// Each entry carries a serial so that a dropped [`PendingResponse`] removes only its
    /// own entry, never a later request that reused the id.
    waiting: HashMap<Id, (u64, oneshot::Sender<Reply>)>,
    serial: u64,
}

/// Starts a peer over `reader` and `writer`. Spawn the returned future; the peer does
/// nothing until it runs.
pub fn connect<R, W>(
    reader: R,
    writer: W,
    config: PeerConfig,
) -> (Peer, InboundRx, impl Future<Output = io::Result<()>> + Send + 'static)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let (inbound_tx, inbound_rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        next_id: AtomicI64::new(0),
        pending: Mutex::new(Pending::default()),
        out_tx,
    });
    let peer = Peer { shared: Arc::clone(&shared) };
    let weak = Arc::downgrade(&shared);
    drop(shared);
    let io = async move {
        let (reader_done_tx, reader_done_rx) = watch::channel(false);
        let read = async move {
            let res = read_loop(reader, config.max_line, &weak, inbound_tx).await;
            if let Some(shared) = weak.upgrade() {
                shared.close();
            }
            let _ = reader_done_tx.send(true);
            res
        };
        let write = write_loop(writer, out_rx, reader_done_rx);
        let (read_res, write_res) = tokio::join!(read, write);
        read_res.and(write_res)
    };
    (peer, inbound_rx, io)
}

async fn read_loop<R: AsyncRead + Unpin>(
    reader: R,
    max_line: usize,
    shared: &std::sync::Weak<Shared>,
    inbound_tx: mpsc::UnboundedSender<Inbound>,
) -> io::Result<()> {
    let mut lines = LineReader::new(BufReader::with_capacity(64 * 1024, reader), max_line);
    while let Some(line) = lines.next_line().await? {
        let inbound = match frame::decode_line(line, max_line) {
            Decoded::Blank => continue,
            Decoded::Invalid(invalid) => Inbound::Invalid(invalid),
            Decoded::Message(Message::Request(request)) => Inbound::Request(request),
            Decoded::Message(Message::Notification(notification)) => {
                Inbound::Notification(notification)
            }
            Decoded::Message(Message::Response(response)) => {
                match shared.upgrade() {
                    Some(shared) => shared.route(response),
                    None => {
                        tracing::debug!(id = %response.id, "response after every handle dropped")
                    }
                }
                continue;
            }
        };
        // A closed receiver means nobody listens any more; keep reading so responses still
        // reach their callers.
        let _ = inbound_tx.send(inbound);
    }
    Ok(())
}

async fn write_loop<W: AsyncWrite + Unpin>(
    writer: W,
    mut out_rx: mpsc::UnboundedReceiver<Outgoing>,
    mut reader_done: watch::Receiver<bool>,
) -> io::Result<()> {
    // Lines queued together go out in one write: the buffer is flushed when the queue is
    // empty (and before a flush is confirmed), so a burst costs a few syscalls, not one per
    // line, and a lone line still leaves at once.
    let mut writer = tokio::io::BufWriter::with_capacity(WRITE_BUFFER, writer);
    loop {
        let line = tokio::select! {
            biased;
            line = out_rx.recv() => line,
            _ = reader_done.wait_for(|done| *done) => None,
        };
        let written = match line {
            None => break,
            Some(Outgoing::Flushed(done)) => {
                let flushed = writer.flush().await;
                let _ = done.send(());
                flushed
            }
            Some(Outgoing::Line(line)) => match writer.write_all(&line).await {
                Ok(()) if out_rx.is_empty() => writer.flush().await,
                other => other,
            },
        };
        if let Err(err) = written {
            // The other side stopped reading; nothing we send can be answered any more.
            if err.kind() == io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(err);
        }
    }
    match writer.shutdown().await {
        Err(err) if err.kind() != io::ErrorKind::BrokenPipe => Err(err),
        _ => Ok(()),
    }
}

/// The most bytes of queued lines gathered into one write.
const WRITE_BUFFER: usize = 64 * 1024;

impl Shared {
    fn route(&self, response: Response) {
        let waiter =
            self.pending.lock().expect("UNWRAP: never poisoned").waiting.remove(&response.id);
        match waiter {
            Some((_, tx)) => {
                let _ = tx.send(response.result);
            }
            None => tracing::debug!(id = %response.id, "response to no waiting request"),
        }
    }

    fn close(&self) {
        let mut pending = self.pending.lock().expect("UNWRAP: never poisoned");
        pending.closed = true;
        // Dropping the senders resolves every waiter with `Closed`.
        pending.waiting.clear();
    }
}

impl Peer {
    /// Reserves a fresh request id without sending anything, so the caller can persist it
    /// before the request goes out (see [`Peer::send_request_with_id`]).
    pub fn next_id(&self) -> Id {
        Id::Number(self.shared.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Sends a request and waits for its response.
    pub async fn request(&self, method: &str, params: Option<Value>) -> Result<Value, PeerError> {
        self.send_request_with_id(self.next_id(), method, params)?.response().await
    }

    /// Sends a request with typed params and decodes its typed result.
    pub async fn request_typed<P, R>(&self, method: &str, params: &P) -> Result<R, PeerError>
    where
        P: Serialize,
        R: DeserializeOwned,
    {
        let params = serde_json::to_value(params)
            .map_err(|source| PeerError::Serialize { method: method.to_owned(), source })?;
        let result = self.request(method, Some(params)).await?;
        serde_json::from_value(result)
            .map_err(|source| PeerError::Decode { method: method.to_owned(), source })
    }

    /// Sends a request with a caller-chosen id and returns a handle to its response.
    /// The request is on the wire (queued in order) when this returns.
    pub fn send_request_with_id(
        &self,
        id: Id,
        method: &str,
        params: Option<Value>,
    ) -> Result<PendingResponse, PeerError> {
        let (tx, rx) = oneshot::channel();
        let serial;
        {
            let mut pending = self.shared.pending.lock().expect("UNWRAP: never poisoned");
            if pending.closed {
                return Err(PeerError::Closed);
            }
            if pending.waiting.contains_key(&id) {
                return Err(PeerError::DuplicateId(id));
            }
            pending.serial += 1;
            serial = pending.serial;
            pending.waiting.insert(id.clone(), (serial, tx));
        }
        let message =
            Message::Request(Request { id: id.clone(), method: method.to_owned(), params });
        let guard = PendingResponse { id, serial, rx, shared: Arc::clone(&self.shared) };
        self.send(&message)?;
        Ok(guard)
    }

    /// Sends a notification.
    pub fn notify(&self, method: &str, params: Option<Value>) -> Result<(), PeerError> {
        self.send(&Message::Notification(Notification { method: method.to_owned(), params }))
    }

    /// Answers a request the other side sent.
    pub fn respond(&self, id: Id, result: Result<Value, RpcError>) -> Result<(), PeerError> {
        self.send(&Message::Response(Response { id, result }))
    }

    /// Sends any message as is (used by relays that forward the other side's ids).
    pub fn send(&self, message: &Message) -> Result<(), PeerError> {
        self.send_raw_line(message.to_line())
    }

    /// Writes one line verbatim; a newline is appended when missing. Meant for relays and
    /// for test agents that inject faults — it is not checked in any way.
    pub fn send_raw_line(&self, mut line: Vec<u8>) -> Result<(), PeerError> {
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        self.shared.out_tx.send(Outgoing::Line(line)).map_err(|_| PeerError::Closed)
    }

    /// Waits until everything sent so far has been written and flushed. Fails with
    /// [`PeerError::Closed`] when the writer has stopped.
    pub async fn flush(&self) -> Result<(), PeerError> {
        let (done_tx, done_rx) = oneshot::channel();
        self.shared.out_tx.send(Outgoing::Flushed(done_tx)).map_err(|_| PeerError::Closed)?;
        done_rx.await.map_err(|_| PeerError::Closed)
    }

    /// Whether the input side has ended.
    pub fn is_closed(&self) -> bool {
        self.shared.pending.lock().expect("UNWRAP: never poisoned").closed
    }
}

/// A request on the wire, waiting for its response. Dropping it forgets the request; a
/// late response is then ignored.
#[derive(Debug)]
pub struct PendingResponse {
    id: Id,
    serial: u64,
    rx: oneshot::Receiver<Reply>,
    shared: Arc<Shared>,
}

impl PendingResponse {
    /// The request's id.
    pub fn id(&self) -> &Id {
        &self.id
    }

    /// Waits for the response.
    pub async fn response(mut self) -> Result<Value, PeerError> {
        match (&mut self.rx).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(PeerError::Rpc(error)),
            Err(_) => Err(PeerError::Closed),
        }
    }
}

impl Drop for PendingResponse {
    fn drop(&mut self) {
        let mut pending = self.shared.pending.lock().expect("UNWRAP: never poisoned");
        // Remove only our own entry: after a response it is already gone.
        if pending.waiting.get(&self.id).is_some_and(|(serial, _)| *serial == self.serial) {
            pending.waiting.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests;
