//! Newline-delimited framing: bytes → lines → classified JSON-RPC messages.
//!
//! [`LineReader`] cuts a byte stream into lines without ever buffering more than the
//! configured maximum: an oversized line is skipped to its end and reported as
//! [`Line::TooLong`]. [`decode`] turns one line into a [`Decoded`] value: a valid
//! [`Message`] or an [`Invalid`] with its reason. Neither function can panic on any input,
//! and a bad line never affects the lines after it.

use std::io;

use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

use crate::message::{Id, Message, Notification, Request, Response, RpcError};

/// The default maximum line length: 16 MiB.
pub const DEFAULT_MAX_LINE: usize = 16 * 1024 * 1024;

/// How many bytes of a bad line an [`Invalid`] keeps, so that a huge bad line does not
/// become a huge event.
pub const INVALID_EXCERPT: usize = 4096;

/// One line read from the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// A complete line without its terminator (`\n`, or `\r\n`).
    Complete(Vec<u8>),
    /// A line longer than the limit; its bytes were discarded. `len` is its full length.
    TooLong {
        /// The line's length in bytes, without the terminator.
        len: usize,
    },
}

/// Reads lines of at most `max_line` bytes from a buffered reader.
///
/// Cancel safety: not cancel safe; drive it from one task that does not drop
/// `next_line` halfway (the peer's reader loop does exactly that).
#[derive(Debug)]
pub struct LineReader<R> {
    reader: R,
    max_line: usize,
    buf: Vec<u8>,
    /// Set while skipping the rest of an oversized line; holds its length so far.
    discarding: Option<usize>,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    /// A reader with the given maximum line length (in bytes, without the terminator).
    pub fn new(reader: R, max_line: usize) -> LineReader<R> {
        LineReader { reader, max_line, buf: Vec::new(), discarding: None }
    }

    /// The next line, or `None` at end of stream. A last line without a terminator is
    /// returned as a complete line.
    pub async fn next_line(&mut self) -> io::Result<Option<Line>> {
        loop {
            let available = self.reader.fill_buf().await?;
            if available.is_empty() {
                if let Some(len) = self.discarding.take() {
                    return Ok(Some(Line::TooLong { len }));
                }
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(self.finish_line()));
            }
            let newline = available.iter().position(|&b| b == b'\n');
            let chunk_len = newline.unwrap_or(available.len());
            match self.discarding.as_mut() {
                Some(len) => *len += chunk_len,
                None if self.buf.len() + chunk_len > self.max_line => {
                    self.discarding = Some(self.buf.len() + chunk_len);
                    self.buf = Vec::new();
                }
                None => self.buf.extend_from_slice(&available[..chunk_len]),
            }
            match newline {
                Some(idx) => {
                    self.reader.consume(idx + 1);
                    if let Some(len) = self.discarding.take() {
                        return Ok(Some(Line::TooLong { len }));
                    }
                    return Ok(Some(self.finish_line()));
                }
                None => self.reader.consume(chunk_len),
            }
        }
    }

    /// Whether a whole next line is already buffered (reading it needs no I/O).
    pub fn has_buffered_line(&self) -> bool
    where
        R: BufferedBytes,
    {
        self.reader.buffered().contains(&b'\n')
    }

    fn finish_line(&mut self) -> Line {
        let mut line = std::mem::take(&mut self.buf);
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        Line::Complete(line)
    }
}

/// A reader whose buffered, not yet consumed, bytes can be looked at.
pub trait BufferedBytes {
    /// The bytes read ahead.
    fn buffered(&self) -> &[u8];
}

impl<R: tokio::io::AsyncRead> BufferedBytes for tokio::io::BufReader<R> {
    fn buffered(&self) -> &[u8] {
        self.buffer()
    }
}

/// Why a line is not a valid JSON-RPC 2.0 message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidReason {
    /// The bytes are not UTF-8.
    #[error("line is not valid UTF-8")]
    NotUtf8,
    /// The text is not JSON.
    #[error("line is not JSON: {0}")]
    NotJson(String),
    /// The line is longer than the limit; it was dropped unread.
    #[error("line of {len} bytes exceeds the {max}-byte limit")]
    TooLong {
        /// The line's length.
        len: usize,
        /// The limit in force.
        max: usize,
    },
    /// A JSON array: batches are not part of ACP.
    #[error("batch arrays are not supported")]
    Batch,
    /// JSON that is not an object (a number, a string…).
    #[error("message is not a JSON object")]
    NotAnObject,
    /// `"jsonrpc": "2.0"` is missing or has another value.
    #[error("missing or wrong \"jsonrpc\" member (must be \"2.0\")")]
    MissingVersion,
    /// `"id": null`, which cannot be correlated with anything.
    #[error("id is null")]
    NullId,
    /// An id that is neither an integer nor a string.
    #[error("id must be an integer or a string")]
    BadId,
    /// `method` is present but not a string.
    #[error("method must be a string")]
    BadMethod,
    /// `params` is present but neither an object nor an array.
    #[error("params must be an object or an array")]
    BadParams,
    /// A response with both or neither of `result` and `error`, or a malformed `error`.
    #[error("response must carry exactly one of result or a well-formed error")]
    BadResponse,
    /// No `method` and no `id`: not a request, notification or response.
    #[error("object is neither a request, a notification nor a response")]
    Unrecognised,
}

/// A line that is not a valid message, with the reason and an excerpt of its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// Why it was rejected.
    pub reason: InvalidReason,
    /// At most [`INVALID_EXCERPT`] bytes of the line (empty for a line that was too long).
    pub excerpt: Vec<u8>,
}

/// The result of decoding one line.
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded {
    /// A valid message.
    Message(Message),
    /// Not a valid message.
    Invalid(Invalid),
    /// A line holding only white space; ignored by the peer.
    Blank,
}

/// Classifies one line as read by [`LineReader`].
pub fn decode_line(line: Line, max_line: usize) -> Decoded {
    match line {
        Line::Complete(bytes) => decode(&bytes),
        Line::TooLong { len } => Decoded::Invalid(Invalid {
            reason: InvalidReason::TooLong { len, max: max_line },
            excerpt: Vec::new(),
        }),
    }
}

/// Classifies one line (without its terminator).
pub fn decode(bytes: &[u8]) -> Decoded {
    match inspect(bytes) {
        Inspected::Valid(shape, Value::Object(object)) => Decoded::Message(build(object, shape)),
        Inspected::Valid(..) => unreachable!("inspect only accepts objects"),
        Inspected::Invalid(invalid) => Decoded::Invalid(invalid),
        Inspected::Blank => Decoded::Blank,
    }
}

/// What kind of message a valid line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// It has a `method` and an `id`.
    Request,
    /// It has a `method` and no `id`.
    Notification,
    /// It has an `id`, and `result` or `error`.
    Response,
}

/// A line checked without being taken apart.
#[derive(Debug, Clone, PartialEq)]
pub enum Inspected {
    /// A valid message: its shape and its whole JSON, every member kept.
    Valid(Shape, Value),
    /// Not a valid message.
    Invalid(Invalid),
    /// White space only.
    Blank,
}

/// Checks one line like [`decode`] but keeps its parsed JSON whole, for relays that forward
/// messages as they are (one parse, no rebuilding).
pub fn inspect(bytes: &[u8]) -> Inspected {
    let invalid = |reason| {
        Inspected::Invalid(Invalid {
            reason,
            excerpt: bytes[..bytes.len().min(INVALID_EXCERPT)].to_vec(),
        })
    };
    let Ok(text) = std::str::from_utf8(bytes) else {
        return invalid(InvalidReason::NotUtf8);
    };
    if text.trim().is_empty() {
        return Inspected::Blank;
    }
    let value: Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(err) => return invalid(InvalidReason::NotJson(err.to_string())),
    };
    let shape = match &value {
        Value::Object(object) => shape(object),
        Value::Array(_) => Err(InvalidReason::Batch),
        _ => Err(InvalidReason::NotAnObject),
    };
    match shape {
        Ok(shape) => Inspected::Valid(shape, value),
        Err(reason) => invalid(reason),
    }
}

/// A line checked for a relay that forwards it as the agent wrote it.
#[derive(Debug)]
pub enum Relayed {
    /// A valid message: its shape, its method (requests and notifications), and its text
    /// as written (white space around it trimmed).
    Valid {
        /// What kind of message it is.
        shape: Shape,
        /// The `method`, when it has one.
        method: Option<String>,
        /// The message's text.
        message: Box<serde_json::value::RawValue>,
    },
    /// Not a valid message.
    Invalid(Invalid),
    /// White space only.
    Blank,
}

/// [`inspect`] for a relay: the same verdict on every line, without building the message's
/// JSON tree for the common case (the members a check needs are read borrowed from the
/// text; anything unusual is judged by [`inspect`]). The text is kept as written.
pub fn inspect_for_relay(bytes: &[u8]) -> Relayed {
    // A member the probe skips is not checked for UTF-8: the text is, as a whole.
    if let (Some((shape, method)), Ok(text)) = (probe(bytes), std::str::from_utf8(bytes))
        && let Ok(message) = serde_json::value::RawValue::from_string(text.trim().to_owned())
    {
        return Relayed::Valid { shape, method, message };
    }
    match inspect(bytes) {
        Inspected::Valid(shape, value) => {
            let method = value.get("method").and_then(Value::as_str).map(str::to_owned);
            let text = String::from_utf8_lossy(bytes).trim().to_owned();
            let message = serde_json::value::RawValue::from_string(text)
                .unwrap_or_else(|_| crate::control::raw_json(&value));
            Relayed::Valid { shape, method, message }
        }
        Inspected::Invalid(invalid) => Relayed::Invalid(invalid),
        Inspected::Blank => Relayed::Blank,
    }
}

/// Whether `bytes` hold none of what JSON's grammar allows but a full parse (a `Value`, as
/// [`inspect`] makes) refuses and a syntax check lets through: a surrogate escape
/// (`\uD800`–`\uDFFF`; a lone one is refused), a number beyond `f64` (an exponent, or 300
/// digits in a row), nesting deeper than serde_json's limit (counted as 100 brackets in all).
/// Conservative: text inside strings can say no too (`1e5`), which only costs a full parse.
fn plain(bytes: &[u8]) -> bool {
    let surrogate = || {
        memchr::memchr_iter(b'\\', bytes).any(|at| {
            bytes.get(at + 1) == Some(&b'u') && matches!(bytes.get(at + 2), Some(b'd' | b'D'))
        })
    };
    let exponent = || {
        memchr::memchr2_iter(b'e', b'E', bytes).any(|at| at > 0 && bytes[at - 1].is_ascii_digit())
    };
    // (A run of 300 digits needs a line that long: stream chunks are shorter.)
    let long_number =
        || bytes.len() >= 300 && bytes.split(|b| !b.is_ascii_digit()).any(|run| run.len() >= 300);
    memchr::memchr2_iter(b'{', b'[', bytes).nth(99).is_none()
        && !surrogate()
        && !exponent()
        && !long_number()
}

/// The shape and method of a plainly valid message, read without building its tree; `None`
/// for anything [`shape`] might judge otherwise (a duplicate member, an unusual id, an
/// error to check, anything invalid), which [`inspect`] then judges.
fn probe(bytes: &[u8]) -> Option<(Shape, Option<String>)> {
    use serde_json::value::RawValue;
    // The probe reads an array as a struct too, and what it skips it checks only for syntax:
    // what only a full parse refuses goes to `inspect`.
    if bytes.trim_ascii_start().first() != Some(&b'{') || !plain(bytes) {
        return None;
    }
    /// A member that is there, `null` included (`Option` alone reads `null` as absent).
    fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
        <&RawValue>::deserialize(d).map(Some)
    }
    #[derive(Deserialize)]
    struct Probe<'a> {
        #[serde(borrow)]
        jsonrpc: std::borrow::Cow<'a, str>,
        #[serde(default, borrow, deserialize_with = "present")]
        id: Option<&'a RawValue>,
        #[serde(default, borrow, deserialize_with = "present")]
        method: Option<&'a RawValue>,
        #[serde(default, borrow, deserialize_with = "present")]
        params: Option<&'a RawValue>,
        #[serde(default, borrow, deserialize_with = "present")]
        result: Option<&'a RawValue>,
        #[serde(default, borrow, deserialize_with = "present")]
        error: Option<&'a RawValue>,
    }
    let probe: Probe = serde_json::from_slice(bytes).ok()?;
    if probe.jsonrpc != "2.0" {
        return None;
    }
    let has_id = match probe.id.map(RawValue::get) {
        None => false,
        Some(id) if id.starts_with('"') => true,
        // Plain integers only; any other number is left to `shape`.
        Some(id) => {
            // (serde_json reads `-0` as a float.)
            let digits = id.strip_prefix('-').unwrap_or(id);
            let plain = digits.bytes().all(|b| b.is_ascii_digit())
                && (digits.starts_with(['1', '2', '3', '4', '5', '6', '7', '8', '9']) || id == "0");
            if !plain || id.parse::<i64>().is_err() {
                return None;
            }
            true
        }
    };
    let starts =
        |raw: Option<&RawValue>, with: &[char]| raw.is_none_or(|raw| raw.get().starts_with(with));
    match probe.method {
        Some(method) if method.get().starts_with('"') && starts(probe.params, &['{', '[']) => {
            let shape = if has_id { Shape::Request } else { Shape::Notification };
            Some((shape, Some(serde_json::from_str(method.get()).ok()?)))
        }
        Some(_) => None,
        // A result without an error; an error response is checked by `shape`.
        None if has_id && probe.result.is_some() && probe.error.is_none() => {
            Some((Shape::Response, None))
        }
        None => None,
    }
}

/// Every check of a message, by reference.
fn shape(object: &Map<String, Value>) -> Result<Shape, InvalidReason> {
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(InvalidReason::MissingVersion);
    }
    let has_id = match object.get("id") {
        None => false,
        Some(Value::Null) => return Err(InvalidReason::NullId),
        Some(Value::String(_)) => true,
        Some(Value::Number(n)) if n.as_i64().is_some() => true,
        Some(_) => return Err(InvalidReason::BadId),
    };
    if let Some(method) = object.get("method") {
        if !method.is_string() {
            return Err(InvalidReason::BadMethod);
        }
        if !matches!(object.get("params"), None | Some(Value::Object(_) | Value::Array(_))) {
            return Err(InvalidReason::BadParams);
        }
        return Ok(if has_id { Shape::Request } else { Shape::Notification });
    }
    if !has_id {
        return Err(InvalidReason::Unrecognised);
    }
    match (object.get("result"), object.get("error")) {
        (Some(_), None) => Ok(Shape::Response),
        (None, Some(error)) if RpcError::deserialize(error).is_ok() => Ok(Shape::Response),
        _ => Err(InvalidReason::BadResponse),
    }
}

/// Takes a message apart whose [`shape`] was checked.
fn build(mut object: Map<String, Value>, shape: Shape) -> Message {
    const CHECKED: &str = "UNWRAP: checked by shape()";
    let id = object.remove("id").map(|id| serde_json::from_value::<Id>(id).expect(CHECKED));
    match shape {
        Shape::Request | Shape::Notification => {
            let Some(Value::String(method)) = object.remove("method") else {
                unreachable!("{CHECKED}")
            };
            let params = object.remove("params");
            match id {
                Some(id) => Message::Request(Request { id, method, params }),
                None => Message::Notification(Notification { method, params }),
            }
        }
        Shape::Response => {
            let result =
                match object.remove("result") {
                    Some(result) => Ok(result),
                    None => Err(serde_json::from_value(object.remove("error").expect(CHECKED))
                        .expect(CHECKED)),
                };
            Message::Response(Response { id: id.expect(CHECKED), result })
        }
    }
}

#[cfg(test)]
mod tests;
