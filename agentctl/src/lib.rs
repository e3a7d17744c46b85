//! agentctl: the per-session sidecar that owns exactly one agent process and never loses
//! its output.
//!
//! Theory of operation:
//! - `agentctl serve` binds its control channel ([`server`]: JSON-RPC over WebSocket,
//!   bearer token), writes `ready.json` and prints the same object as one line on stdout
//!   ([`ready`]). That line is the readiness signal; nobody polls.
//! - `agent.start` spawns the agent ([`agent`]) in its own process group, armed so that it
//!   and its group die with agentctl. Everything the agent says — each stdout message, each
//!   stderr line, noise, its start and exit — becomes an event, appended to the on-disk
//!   [`spool`] with the next sequence number *before* anyone can see it.
//! - `events.subscribe {after_seq}` replays the spool from any point after the acknowledged
//!   prefix and then follows live, through one reader, so the stream is gapless and
//!   duplicate-free. `events.ack {seq}` lets the acknowledged prefix be deleted.
//! - The agent's `fs/*` requests are served here ([`fs`]), confined to the workspace roots,
//!   and recorded as events with the answer attached; every other message is relayed.
//! - A confined agent (`[sandbox] network = "allowlist"`) reaches the network only through
//!   its [`egress`] proxy, which agentctl runs on a Unix socket for as long as it lives;
//!   inside the agent's network namespace, [`relay`] (`agentctl relay`, the agent's parent
//!   there) forwards the agent's loopback `http_proxy` to that socket.
//! - [`client`] is the supervisor's side: launching agentctl detached, typed calls, and an
//!   event stream that reconnects and resumes after the last seq it delivered.
//!
//! Guarantees: an event is delivered only after it is on disk; a subscriber that reconnects
//! with the last seq it handled misses nothing and sees nothing twice; bad agent output never
//! stops agentctl; no descendant of the agent outlives a stop, or agentctl itself.
// Test code is exempt from the length rule: a scenario reads top to bottom.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod agent;
pub mod cli;
pub mod client;
pub mod egress;
pub mod fault;
pub mod fs;
pub mod process;
pub mod ready;
pub mod relay;
pub mod resubscribe;
pub mod server;
pub mod spool;
pub mod stderr;
pub mod tls;
