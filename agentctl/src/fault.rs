//! Named fault points: places where a test or the fault matrix can make this process die
//! by SIGKILL, exactly there, instead of hoping for the timing.
//!
//! A point is armed by the environment: `TETHER_FAULT=NAME` kills the process the first
//! time it reaches `NAME`; `TETHER_FAULT=NAME@N` the N-th time. Several points may be armed
//! at once, separated by commas. Unarmed points cost one relaxed load of a cached list.
//! SIGKILL (not `exit`, not a panic) is the point: no destructor, flush or handler runs, as
//! when an operator or the kernel kills the process.
//!
//! The points (a name says where; the code that calls [`point`] documents each):
//! - `ack.stored`: the supervisor stored `acked_seq` and has not yet sent `events.ack`;
//! - `ack.sent`: agentctl confirmed an `events.ack`;
//! - `history.mid_message`: the supervisor folded a chunk into a message still coalescing;
//! - `launch.after_runtime`: the runtime started agentctl, nothing has connected to it yet;
//! - `load.sent`: `session/load` went out, its answer has not arrived;
//! - `load.opened`: a load completed, was acknowledged and the session recorded open;
//! - `permission.queued`: a permission answer was accepted and is not yet sent;
//! - `turn.recorded`: the store says a turn ended (its events must be out already);
//! - `prompt.recorded`: a turn is recorded and its prompt not yet sent;
//! - `create.recorded`: a new session is stored `CREATED` and its actor is not started;
//! - `stop.recorded`: a stopped session's end is stored and its sidecar not yet retired;
//! - `pause.retired`: a pausing (or parked) session's agent and sidecar are stopped, and
//!   `PAUSED` is not stored yet;
//! - `pause.summary_asked`: a waiting pause recorded that it asks its agent for a summary
//!   (`summarize_on_pause`), and the summary prompt is not yet sent;
//! - `launch.started`: a session is `STARTING` and nothing of its launch is recorded yet;
//! - `workflow.planned`: a workflow's driver decided what to do and has done none of it;
//! - `workflow.step_started`: a step's session is stored with the step `running` (one
//!   write), and its actor started its launch;
//! - `workflow.advanced`: a workflow decision (a loop back, a route, workers, a failure,
//!   the workflow's end) is written, nothing after it done;
//! - `workflow.stopping`: a finished step's session is about to be stopped;
//! - `state.opened_published`: a session's ACP session is open and recorded (its execution
//!   `running`), its `WAITING_FOR_INPUT` event is in the log, and the store still says
//!   `STARTING`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable that arms fault points.
pub const FAULT_ENV: &str = "TETHER_FAULT";

struct Armed {
    name: String,
    at: u64,
    hits: AtomicU64,
}

fn armed() -> &'static [Armed] {
    static ARMED: OnceLock<Vec<Armed>> = OnceLock::new();
    ARMED.get_or_init(|| match std::env::var(FAULT_ENV) {
        Ok(spec) => parse(&spec),
        Err(_) => Vec::new(),
    })
}

fn parse(spec: &str) -> Vec<Armed> {
    spec.split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| {
            let (name, at) = match part.split_once('@') {
                Some((name, at)) => (name, at.parse().unwrap_or(1)),
                None => (part, 1),
            };
            Armed { name: name.to_owned(), at: at.max(1), hits: AtomicU64::new(0) }
        })
        .collect()
}

/// Passes fault point `name`: when it is armed and this is the hit it waits for, the
/// process SIGKILLs itself here.
pub fn point(name: &str) {
    for armed in armed() {
        if armed.name == name && armed.hits.fetch_add(1, Ordering::Relaxed) + 1 == armed.at {
            tracing::warn!(point = name, "fault point reached: killing this process");
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
            // SIGKILL cannot be caught; this is never reached.
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_name_points_and_hits() {
        let armed = parse("ack.sent@3, load.sent,,bad@x");
        let summary: Vec<(&str, u64)> = armed.iter().map(|a| (a.name.as_str(), a.at)).collect();
        assert_eq!(summary, [("ack.sent", 3), ("load.sent", 1), ("bad", 1)]);
    }
}
