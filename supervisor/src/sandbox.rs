//! Confinement of an agent: what it may reach on the network. A session with
//! `network = "allowlist"` reaches the outside only through its [`egress`] proxy, which lets
//! through the `host:port` pairs of its [`allowlist`] and reports every refusal.

pub mod allowlist;
pub mod egress;
