//! The one vocabulary of error kinds on both JSON-RPC surfaces (the frontend API and
//! agentctl's control channel): every error object carries `data.kind` from
//! [`ErrorKind`], and, for bad params, the field at fault and the limit it broke. Clients
//! decide on the kind, never on the message.

use std::future::Future;

use jsonrpsee::types::{ErrorObject, ErrorObjectOwned};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `data.kind` of an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// Params that do not fit the method: a missing, unknown, mistyped or oversized field
    /// (`data.field` names it, `data.limit` gives the bound it broke).
    InvalidParams,
    /// No such task, session or permission request.
    NotFound,
    /// The request conflicts with the session's state for good (it has ended).
    Conflict,
    /// Not possible now (a prompt during a turn, a resume of a session whose workspace is
    /// gone); may be possible later.
    InvalidState,
    /// The agent profile cannot run here (its program is missing, a root-only setting).
    AgentUnavailable,
    /// The runtime (agentctl, Docker) failed or did not answer.
    RuntimeUnavailable,
    /// The daemon's storage failed: its database or a session's files cannot be read or
    /// written (a read-only or full disk, a locked or damaged database); the message names
    /// the file and the cause.
    Storage,
    /// The session's or its task's token or cost budget is used up: raise it
    /// (`budget.set`) first.
    BudgetExceeded,
    /// A model, mode or other setting chosen for the session could not be set again after
    /// its agent restarted: no prompt is sent until it is chosen anew
    /// (`task.session.set_config_option`, `task.session.set_mode`).
    SettingsNotRestored,
    /// The agent refused the request (a setting it does not take now); the message says
    /// what it answered.
    AgentRefused,
    /// A bug or an I/O failure on the server's side.
    Internal,
    /// No method of that name (a client newer than the server, or a typo).
    NoSuchMethod,
    /// Control channel: `agent.start` a second time.
    AlreadyStarted,
    /// Control channel: the agent was never started.
    NotStarted,
    /// Control channel: the agent has exited.
    NotRunning,
    /// Control channel: events at or below the acknowledged seq are gone.
    Pruned,
    /// Control channel: the agent's program could not be spawned.
    SpawnFailed,
    /// A kind this build does not know (a newer server).
    #[serde(other)]
    Unknown,
}

impl ErrorKind {
    /// The JSON-RPC error code that goes with the kind.
    pub fn code(self) -> i32 {
        match self {
            ErrorKind::InvalidParams => -32602,
            ErrorKind::NotFound => -32001,
            ErrorKind::Conflict => -32002,
            ErrorKind::InvalidState => -32003,
            ErrorKind::AgentUnavailable => -32004,
            ErrorKind::RuntimeUnavailable => -32005,
            ErrorKind::NoSuchMethod => -32601,
            ErrorKind::AlreadyStarted => -32010,
            ErrorKind::NotStarted => -32011,
            ErrorKind::NotRunning => -32012,
            ErrorKind::Pruned => -32013,
            ErrorKind::SpawnFailed => -32014,
            ErrorKind::Storage => -32015,
            ErrorKind::BudgetExceeded => -32016,
            ErrorKind::SettingsNotRestored => -32017,
            ErrorKind::AgentRefused => -32018,
            ErrorKind::Internal | ErrorKind::Unknown => -32603,
        }
    }

    /// Every kind, in declaration order (for documentation and tests).
    pub const ALL: [ErrorKind; 17] = [
        ErrorKind::InvalidParams,
        ErrorKind::NotFound,
        ErrorKind::Conflict,
        ErrorKind::InvalidState,
        ErrorKind::AgentUnavailable,
        ErrorKind::RuntimeUnavailable,
        ErrorKind::Storage,
        ErrorKind::BudgetExceeded,
        ErrorKind::SettingsNotRestored,
        ErrorKind::AgentRefused,
        ErrorKind::Internal,
        ErrorKind::NoSuchMethod,
        ErrorKind::AlreadyStarted,
        ErrorKind::NotStarted,
        ErrorKind::NotRunning,
        ErrorKind::Pruned,
        ErrorKind::SpawnFailed,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidParams => "invalid_params",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::InvalidState => "invalid_state",
            ErrorKind::AgentUnavailable => "agent_unavailable",
            ErrorKind::RuntimeUnavailable => "runtime_unavailable",
            ErrorKind::Internal => "internal",
            ErrorKind::NoSuchMethod => "no_such_method",
            ErrorKind::AlreadyStarted => "already_started",
            ErrorKind::NotStarted => "not_started",
            ErrorKind::NotRunning => "not_running",
            ErrorKind::Pruned => "pruned",
            ErrorKind::SpawnFailed => "spawn_failed",
            ErrorKind::Storage => "storage",
            ErrorKind::BudgetExceeded => "budget_exceeded",
            ErrorKind::SettingsNotRestored => "settings_not_restored",
            ErrorKind::AgentRefused => "agent_refused",
            ErrorKind::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `data` member of every error object Tether sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorData {
    /// What went wrong, as a kind to decide on.
    pub kind: ErrorKind,
    /// For `invalid_params`: the field at fault (a dotted path for nested ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// For `invalid_params` over a size limit: the limit (bytes, or items for counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

impl ErrorData {
    /// Just a kind.
    pub fn kind(kind: ErrorKind) -> ErrorData {
        ErrorData { kind, field: None, limit: None }
    }

    /// Reads the data of an error object; `None` when it has none or not ours.
    pub fn of(object: &ErrorObject<'_>) -> Option<ErrorData> {
        object.data().and_then(|data| serde_json::from_str(data.get()).ok())
    }

    /// The error object with this data, `message` and the kind's code.
    pub fn into_error(self, message: impl Into<String>) -> ErrorObjectOwned {
        ErrorObjectOwned::owned(self.kind.code(), message.into(), Some(self))
    }
}

/// An error object of `kind` with `message`.
pub fn error_object(kind: ErrorKind, message: impl Into<String>) -> ErrorObjectOwned {
    ErrorData::kind(kind).into_error(message)
}

/// The kind of a client-side error: a server's refusal has one; a transport failure has
/// none.
pub fn kind_of(err: &jsonrpsee::core::ClientError) -> Option<ErrorKind> {
    match err {
        jsonrpsee::core::ClientError::Call(object) => ErrorData::of(object).map(|data| data.kind),
        _ => None,
    }
}

/// How a server checks a method's params before it runs: `Err` names the field.
pub type ParamCheck =
    fn(&str, Option<&serde_json::value::RawValue>) -> Result<(), crate::api::params::ParamError>;

/// The RPC middleware both servers put in front of their methods, so every error carries
/// `data` of ours:
/// - each call's params are checked with `check` before the method runs, so a bad field is
///   refused with its name (and the limit it broke) — the generated parsers name neither.
///   The refusal is an ordinary call error, which reaches the client for subscriptions too;
/// - errors jsonrpsee makes itself (an unknown method, params it cannot parse) are answered
///   again as `no_such_method` (-32601), `invalid_params` (-32602) or `internal` (-32603,
///   anything else), the library's detail moved into the message.
///
/// Servers that use it disable batches, which would go around it.
#[derive(Clone)]
pub struct CheckParams<S> {
    service: S,
    check: ParamCheck,
}

impl<S> CheckParams<S> {
    /// Wraps `service`.
    pub fn new(service: S, check: ParamCheck) -> CheckParams<S> {
        CheckParams { service, check }
    }
}

impl<S> jsonrpsee::core::middleware::RpcServiceT for CheckParams<S>
where
    S: jsonrpsee::core::middleware::RpcServiceT<MethodResponse = jsonrpsee::MethodResponse>
        + Send
        + Sync
        + Clone
        + 'static,
{
    type MethodResponse = S::MethodResponse;
    type NotificationResponse = S::NotificationResponse;
    type BatchResponse = S::BatchResponse;

    fn call<'a>(
        &self,
        request: jsonrpsee::types::Request<'a>,
    ) -> impl Future<Output = Self::MethodResponse> + Send + 'a {
        let service = self.service.clone();
        let check = self.check;
        async move {
            if let Err(err) = check(&request.method, request.params.as_deref()) {
                return jsonrpsee::MethodResponse::error(request.id, err.into_error());
            }
            let id = request.id.clone().into_owned();
            let response = service.call(request).await;
            match kinded(&response) {
                Some(error) if response.is_subscription() => {
                    jsonrpsee::MethodResponse::subscription_error(id, error)
                }
                Some(error) => jsonrpsee::MethodResponse::error(id, error),
                None => response,
            }
        }
    }

    fn batch<'a>(
        &self,
        batch: jsonrpsee::core::middleware::Batch<'a>,
    ) -> impl Future<Output = Self::BatchResponse> + Send + 'a {
        self.service.batch(batch)
    }

    fn notification<'a>(
        &self,
        notification: jsonrpsee::core::middleware::Notification<'a>,
    ) -> impl Future<Output = Self::NotificationResponse> + Send + 'a {
        self.service.notification(notification)
    }
}

/// The error of `response` again with a kind, when it is an error jsonrpsee made (no data
/// of ours); `None` otherwise.
fn kinded(response: &jsonrpsee::MethodResponse) -> Option<ErrorObjectOwned> {
    if !response.is_error() {
        return None;
    }
    let parsed = serde_json::from_str::<ErrorResponse>(response.as_json().get()).ok()?;
    let data = parsed.error.data;
    if data.as_ref().is_some_and(|data| ErrorData::deserialize(data).is_ok()) {
        return None;
    }
    let kind = match parsed.error.code {
        -32602 => ErrorKind::InvalidParams,
        -32601 => ErrorKind::NoSuchMethod,
        _ => ErrorKind::Internal,
    };
    // jsonrpsee puts the parse error's text in `data`: it moves into the message.
    let message = match data {
        Some(serde_json::Value::String(detail)) => format!("{}: {detail}", parsed.error.message),
        _ => parsed.error.message,
    };
    Some(ErrorData::kind(kind).into_error(message))
}

#[derive(Deserialize)]
struct ErrorResponse {
    error: ErrorMember,
}

#[derive(Deserialize)]
struct ErrorMember {
    code: i32,
    message: String,
    #[serde(default)]
    data: Option<serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_by_their_wire_names_and_unknown_ones_are_tolerated() {
        for kind in ErrorKind::ALL {
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json, kind.as_str());
            assert_eq!(serde_json::from_value::<ErrorKind>(json).unwrap(), kind);
        }
        let newer: ErrorKind = serde_json::from_str("\"quota_exceeded\"").unwrap();
        assert_eq!(newer, ErrorKind::Unknown);
    }

    #[test]
    fn an_error_object_carries_its_data() {
        let object = ErrorData {
            kind: ErrorKind::InvalidParams,
            field: Some("title".into()),
            limit: Some(8),
        }
        .into_error("too long");
        assert_eq!(object.code(), -32602);
        let data = ErrorData::of(&object).unwrap();
        assert_eq!(data.field.as_deref(), Some("title"));
        assert_eq!(data.limit, Some(8));
        assert_eq!(ErrorData::of(&ErrorObjectOwned::owned::<()>(1, "x", None)), None);
    }
}
