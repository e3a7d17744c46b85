//! Agents: what Tether knows about the agents it launches.
//!
//! Today this crate holds [`mock`], the scriptable ACP agent behind the `mock-agent` binary
//! that tests and the demo use. The profiles issue adds the profile schema, the built-in
//! profiles in `agents/profiles/` and the hot-reloading registry.

pub mod mock;
