//! Agents: what Tether knows about the agents it launches.
//!
//! - [`profile`]: the per-agent capability profile (TOML), strict parsing with located
//!   errors, and the serialisable [`profile::Profile`] a session snapshots when it starts.
//! - [`registry`]: built-in profiles (`agents/profiles/*.toml`, compiled in) overridden by
//!   user files, hot reload through a watch channel, and availability checks.
//! - [`allowlist`]: the `host:port` pairs a confined agent may reach (`[sandbox] allow`;
//!   defined in `protocol`, where agentctl's egress proxy reads it too).
//! - [`mock`]: the scriptable ACP agent behind the `mock-agent` binary that tests and the
//!   demo use.
//!
//! The supervisor-facing API: [`registry::Registry::open`] (load + watch),
//! [`registry::Registry::get`] / [`registry::Registry::list`] / [`registry::Registry::catalog`],
//! [`registry::Registry::subscribe`] (changes), [`registry::availability`], and
//! [`profile::Profile`] itself as the snapshot (serde).
// Test code is exempt from the length rule: a scenario reads top to bottom.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub use protocol::allowlist;
pub mod mock;
pub mod npx;
pub mod profile;
pub mod registry;
