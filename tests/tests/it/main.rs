//! Tether's black-box tests: real processes, real agents, a real Docker engine.
//!
//! One test binary for the workspace (fast to link); each module is one boundary.
// The test crate is exempt from the length rule: a scenario reads top to bottom.
#![allow(clippy::too_many_lines)]

mod access;
mod acp_client;
mod agentctl;
mod auth;
mod checkpoints;
mod cli;
mod conformance;
mod damage;
mod data_directory;
mod docker;
mod docker_runtime;
mod eliza;
mod engines;
mod face;
mod faults;
mod fork;
mod idle;
mod metrics;
mod mock_agent;
mod nothing_lost;
mod official_client;
mod pause;
mod pause_summary;
mod permissions;
mod plans;
mod pool;
mod progress;
mod queue;
mod real_agents;
mod real_settings;
mod reaping;
mod resume;
mod retention;
mod review;
mod rewind;
mod sandbox;
mod settings;
mod snapshots;
mod steer;
mod supervisor;
mod tidy;
mod usage;
mod web_access;
mod web_friction;
mod web_review;
mod web_turns;
mod web_ui;
mod web_views;
mod workflow_edges;
mod workflows;
mod workspaces;
