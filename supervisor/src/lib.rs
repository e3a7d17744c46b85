//! The Tether supervisor: store, runtimes, session actors, resume policy, recovery and API.
//!
//! Not built yet. This crate reserves its place in the workspace; the supervisor issue
//! fills it (DESIGN.md §1–§3, §5–§7, §10). Nothing here pretends to work in the meantime.
