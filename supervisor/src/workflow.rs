//! Durable workflows: a task as a chain or graph of agent steps, each step a
//! session. `spec` reads and checks the workflow file; `plan` decides, from what is
//! stored, what a workflow does next; the engine that carries the plan out is
//! `service::workflows`.

pub mod plan;
pub mod spec;
