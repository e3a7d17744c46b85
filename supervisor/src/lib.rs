//! The Tether supervisor: the daemon that runs coding agents' sessions and the CLI that
//! talks to it.
//!
//! Data flows through the modules in this order:
//! - [`api`]: JSON-RPC over WebSocket — the only module that knows the wire format;
//! - [`service`]: the operations (tasks, sessions, agents) over the pieces below;
//! - [`session`]: one actor per live session, owning its execution and serialising its
//!   commands, publishing state on a watch channel and events on a per-session spool;
//! - [`runtime`]: where agentctl runs (a local process, or a Docker container on one of
//!   several engines);
//! - [`history`] and [`events`]: the conversation record and the subscriber stream;
//! - [`store`]: SQLite, owned by one thread;
//! - [`home`]: the data directory; [`worktree`]: a git worktree per session;
//!   [`config`]: the daemon's config file; [`workflow`]: workflow files (loaded and checked;
//!   running them is the workflow driver's part).
//!
//! Guarantees: a turn's row and request id are durable before its prompt is sent; an
//! agentctl event is acknowledged only after what it caused is synced to disk; writes that
//! depend on the current execution are compare-and-set, so a dead execution cannot
//! overwrite its successor.
// Test code is exempt from the length rule: a scenario reads top to bottom.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod api;
pub mod changes;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod events;
pub mod history;
pub mod home;
pub mod ids;
pub mod metrics;
pub mod pool;
pub mod resume_context;
pub mod rewind;
pub mod runtime;
pub mod sandbox;
pub mod service;
pub mod session;
pub mod settings;
pub mod sidecar;
pub mod snapshot;
pub mod store;
pub mod web;
pub mod wire;
pub mod workflow;
pub mod worktree;
