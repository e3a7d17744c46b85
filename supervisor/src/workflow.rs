//! Durable workflows (issue 30): a task as a chain or graph of agent steps. This is its
//! first part, the workflow file: parsed, its templates and dependencies checked, every
//! error located `file:line:col` before anything runs. Running steps as sessions comes next.

pub mod spec;
