//! agentctl: the per-session sidecar that owns exactly one agent process and its stdio.
//!
//! Not built yet. This crate reserves its place in the workspace; the agentctl issue fills
//! it with the control channel, the event spool and process hygiene described in
//! DESIGN.md §4. Nothing here pretends to work in the meantime.
