//! The bottom layer of Tether: JSON-RPC 2.0 over newline-delimited streams, and ACP on top.
//!
//! Data flows through the modules in this order:
//! - [`frame`]: bytes → lines (bounded by a maximum length) → classified messages;
//! - [`message`]: the plain Rust values for requests, notifications, responses and errors;
//! - [`peer`]: a bidirectional connection that correlates responses with requests and hands
//!   the other side's requests and notifications over in arrival order;
//! - [`acp`]: ACP method names, the typed schema and tolerant parsing;
//! - [`control`]: the shapes of the supervisor ⇄ agentctl control channel and its events;
//! - [`allowlist`]: the `host:port` pairs a confined agent may reach (`[sandbox] allow`),
//!   read by the profile and asked by agentctl's egress proxy.
//!
//! Design choices:
//! - No input can panic the decoder or wedge the reader: every line is classified, and a bad
//!   line is reported as [`frame::Invalid`] without touching the next one.
//! - Params and results stay raw JSON in transit; typed views are opt-in, so an agent that
//!   speaks a newer dialect is relayed intact.
//! - The peer's I/O is a future the caller spawns, so tests can run it anywhere and the
//!   caller decides on which runtime it lives.
// Test code is exempt from the length rule: a scenario reads top to bottom.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod acp;
pub mod allowlist;
pub mod api;
pub mod control;
pub mod errors;
pub mod frame;
pub mod message;
pub mod peer;

pub use message::{ErrorCode, Id, Message, Notification, Request, Response, RpcError};
pub use peer::{Inbound, InboundRx, Peer, PeerConfig, PeerError, connect};
