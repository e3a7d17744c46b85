//! JSON-RPC 2.0 messages as plain Rust values: ids, requests, notifications, responses and
//! error objects.
//!
//! Params and results stay raw `serde_json::Value`s so that nothing an agent sends is lost
//! or rejected for having fields we do not know; typed views live in [`crate::acp`].

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A JSON-RPC request id.
///
/// JSON-RPC allows numbers and strings; `null` is rejected at decode time (see
/// [`crate::frame::InvalidReason::NullId`]) because it cannot be correlated.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Id {
    /// An integer id; the ones we generate are always of this kind.
    Number(i64),
    /// A string id, as some clients use.
    String(String),
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Id::Number(n) => write!(f, "{n}"),
            Id::String(s) => write!(f, "{s:?}"),
        }
    }
}

impl From<i64> for Id {
    fn from(n: i64) -> Id {
        Id::Number(n)
    }
}

/// A JSON-RPC error code. Unknown codes are kept as [`ErrorCode::Other`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// -32700: the line was not valid JSON.
    ParseError,
    /// -32600: the JSON was not a valid request object.
    InvalidRequest,
    /// -32601: the method does not exist or is not offered.
    MethodNotFound,
    /// -32602: the params did not match the method.
    InvalidParams,
    /// -32603: the other side failed while handling the request.
    InternalError,
    /// -32000: ACP "authentication required".
    AuthRequired,
    /// -32002: ACP "resource not found" (e.g. an unknown session id on `session/load`).
    ResourceNotFound,
    /// -32800: the request was cancelled.
    RequestCancelled,
    /// Any other code, kept as sent.
    Other(i64),
}

impl ErrorCode {
    /// The numeric code on the wire.
    pub fn code(self) -> i64 {
        match self {
            ErrorCode::ParseError => -32700,
            ErrorCode::InvalidRequest => -32600,
            ErrorCode::MethodNotFound => -32601,
            ErrorCode::InvalidParams => -32602,
            ErrorCode::InternalError => -32603,
            ErrorCode::AuthRequired => -32000,
            ErrorCode::ResourceNotFound => -32002,
            ErrorCode::RequestCancelled => -32800,
            ErrorCode::Other(code) => code,
        }
    }

    /// The variant for a numeric code.
    pub fn from_code(code: i64) -> ErrorCode {
        match code {
            -32700 => ErrorCode::ParseError,
            -32600 => ErrorCode::InvalidRequest,
            -32601 => ErrorCode::MethodNotFound,
            -32602 => ErrorCode::InvalidParams,
            -32603 => ErrorCode::InternalError,
            -32000 => ErrorCode::AuthRequired,
            -32002 => ErrorCode::ResourceNotFound,
            -32800 => ErrorCode::RequestCancelled,
            other => ErrorCode::Other(other),
        }
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_i64(self.code())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        i64::deserialize(deserializer).map(ErrorCode::from_code)
    }
}

/// A JSON-RPC error object, as sent or received.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("JSON-RPC error {}: {message}", code.code())]
pub struct RpcError {
    /// The error code.
    pub code: ErrorCode,
    /// A short human description.
    pub message: String,
    /// Extra structured detail (ACP agents put `details` here on `-32603`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    /// An error with a code and message and no data.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into(), data: None }
    }

    /// The same error with `data` attached.
    pub fn with_data(mut self, data: Value) -> RpcError {
        self.data = Some(data);
        self
    }

    /// `-32601` for `method`.
    pub fn method_not_found(method: &str) -> RpcError {
        RpcError::new(ErrorCode::MethodNotFound, format!("method not found: {method}"))
    }

    /// `-32602` with a reason.
    pub fn invalid_params(reason: impl fmt::Display) -> RpcError {
        RpcError::new(ErrorCode::InvalidParams, format!("invalid params: {reason}"))
    }

    /// `-32603` with a reason.
    pub fn internal(reason: impl fmt::Display) -> RpcError {
        RpcError::new(ErrorCode::InternalError, reason.to_string())
    }
}

/// A request: it carries an id and expects exactly one response.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The id the response must carry.
    pub id: Id,
    /// The method name.
    pub method: String,
    /// The params, raw.
    pub params: Option<Value>,
}

/// A notification: no id, no response.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    /// The method name.
    pub method: String,
    /// The params, raw.
    pub params: Option<Value>,
}

/// A response: the result of the request with the same id, or its error.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// The id of the request this answers.
    pub id: Id,
    /// `result` or `error`.
    pub result: Result<Value, RpcError>,
}

/// Any valid JSON-RPC 2.0 message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// See [`Request`].
    Request(Request),
    /// See [`Notification`].
    Notification(Notification),
    /// See [`Response`]; an error response is a `Response` whose `result` is `Err`.
    Response(Response),
}

impl Message {
    /// The message as a JSON object with `"jsonrpc": "2.0"`.
    pub fn to_value(&self) -> Value {
        let mut object = Map::new();
        object.insert("jsonrpc".into(), Value::from("2.0"));
        match self {
            Message::Request(request) => {
                object.insert("id".into(), id_value(&request.id));
                object.insert("method".into(), Value::from(request.method.clone()));
                if let Some(params) = &request.params {
                    object.insert("params".into(), params.clone());
                }
            }
            Message::Notification(notification) => {
                object.insert("method".into(), Value::from(notification.method.clone()));
                if let Some(params) = &notification.params {
                    object.insert("params".into(), params.clone());
                }
            }
            Message::Response(response) => {
                object.insert("id".into(), id_value(&response.id));
                match &response.result {
                    Ok(result) => object.insert("result".into(), result.clone()),
                    Err(error) => object.insert(
                        "error".into(),
                        serde_json::to_value(error).expect("UNWRAP: RpcError always serialises"),
                    ),
                };
            }
        }
        Value::Object(object)
    }

    /// The message as one newline-terminated line.
    ///
    /// `serde_json` escapes control characters inside strings, so the encoded line never
    /// contains a raw newline before its end.
    pub fn to_line(&self) -> Vec<u8> {
        let mut line =
            serde_json::to_vec(&self.to_value()).expect("UNWRAP: a Value always serialises");
        line.push(b'\n');
        line
    }

    /// The method name, for requests and notifications.
    pub fn method(&self) -> Option<&str> {
        match self {
            Message::Request(request) => Some(&request.method),
            Message::Notification(notification) => Some(&notification.method),
            Message::Response(_) => None,
        }
    }
}

fn id_value(id: &Id) -> Value {
    match id {
        Id::Number(n) => Value::from(*n),
        Id::String(s) => Value::from(s.clone()),
    }
}
