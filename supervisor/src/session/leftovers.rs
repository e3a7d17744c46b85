//! What a sidecar that is gone left in its spool.
//!
//! agentctl spools every event before it publishes it, so when it dies (killed, fenced, or
//! stopped with the session) its spool on the host still holds whatever the agent emitted
//! that the supervisor had not handled yet: events in flight on the control channel, a
//! burst still being relayed, the rest of a turn the agent went on emitting through a stop's
//! grace period, or all of a turn when the supervisor died too. The next agentctl starts a
//! fresh spool in the same directory, so that tail is read first, through the same handling
//! as live events (the durability marks skip what was recorded already): whatever reached
//! a spool is recorded exactly once.
//!
//! A dead sidecar is modelled as a [`Control`] that takes acknowledgements (there is nobody
//! left to tell) and refuses everything for the agent as `not_running`; its events are the
//! spool's, read after a seq, ending where the spool ends. A damaged line is skipped and
//! said (its file and line, as a notice); a torn last line is what a kill cuts, and is
//! dropped silently, as agentctl's own reopen cuts it.
//!
//! An engine with `storage = "volumes"` keeps the spool in a volume the supervisor cannot
//! read: there the tail is not recovered (see ARCHITECTURE.md).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentctl::client::ClientError;
use protocol::control::{
    AgentStarted, AgentState, Event, EventKind, ExitInfo, StartAgent, Status, StopStage, Stopped,
};
use protocol::errors::ErrorKind;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::runtime::BoxFuture;
use crate::sidecar::{Control, EventsRx};

/// The calls of a sidecar that is gone.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct DeadSidecar;

fn not_running(method: &str) -> ClientError {
    ClientError::Refused {
        method: method.to_owned(),
        kind: ErrorKind::NotRunning,
        message: "the sidecar is gone".into(),
    }
}

impl Control for DeadSidecar {
    fn send_acp<'a>(&'a self, _message: &'a Value) -> BoxFuture<'a, Result<(), ClientError>> {
        Box::pin(async { Err(not_running("acp.send")) })
    }

    fn ack(&self, seq: u64) -> BoxFuture<'_, Result<u64, ClientError>> {
        Box::pin(async move { Ok(seq) })
    }

    fn start_agent<'a>(
        &'a self,
        _start: &'a StartAgent,
    ) -> BoxFuture<'a, Result<AgentStarted, ClientError>> {
        Box::pin(async { Err(not_running("agent.start")) })
    }

    fn stop_agent(&self, _grace: Duration) -> BoxFuture<'_, Result<Stopped, ClientError>> {
        Box::pin(async {
            Ok(Stopped {
                stage: StopStage::AlreadyExited,
                status: ExitInfo { code: None, signal: None },
            })
        })
    }

    fn shutdown(&self) -> BoxFuture<'_, Result<(), ClientError>> {
        Box::pin(async { Ok(()) })
    }

    fn status(&self) -> BoxFuture<'_, Result<Status, ClientError>> {
        Box::pin(async { Err(not_running("status")) })
    }
}

/// Whether the spool in an agentctl state dir was written by `execution`'s agentctl: the
/// one `ready.json` announces (a new agentctl empties the spool before it announces) is
/// the one the execution recorded.
pub(super) fn spool_is_of(agentctl_dir: &Path, execution: &crate::store::ExecutionRow) -> bool {
    let Ok(text) = std::fs::read(agentctl_dir.join(agentctl::ready::READY_FILE)) else {
        return false;
    };
    let Ok(ready) = serde_json::from_slice::<protocol::control::ReadyInfo>(&text) else {
        return false;
    };
    execution.agentctl_pid == Some(i64::from(ready.pid))
        && execution.agentctl_start_time == Some(ready.start_time as i64)
}

/// The spool directory of a session's agentctl state dir.
pub(super) fn spool_dir(agentctl_dir: &Path) -> PathBuf {
    agentctl_dir.join(agentctl::spool::SPOOL_DIR)
}

/// The segments of a spool, oldest first.
fn segments(dir: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut found: Vec<(u64, PathBuf)> = entries
        .flatten()
        .filter_map(|entry| {
            let path = entry.path();
            let first = path
                .file_name()?
                .to_str()?
                .strip_prefix("events-")?
                .strip_suffix(".jsonl")?
                .parse::<u64>()
                .ok()?;
            Some((first, path))
        })
        .collect();
    found.sort_unstable();
    found
}

/// The newest seq a dead spool holds (0 when it holds nothing readable).
pub(super) fn last_seq(dir: &Path) -> u64 {
    let Some((first, path)) = segments(dir).pop() else { return 0 };
    let Ok(text) = std::fs::read(&path) else { return first.saturating_sub(1) };
    let whole = text.iter().rposition(|&b| b == b'\n').map_or(0, |idx| idx + 1);
    text[..whole]
        .split(|&b| b == b'\n')
        .filter(|line| !line.is_empty())
        .rev()
        .find_map(|line| serde_json::from_slice::<Event>(line).ok().map(|event| event.seq))
        .unwrap_or(first.saturating_sub(1))
}

/// How many events the reader keeps ahead of the actor.
const READ_AHEAD: usize = 1024;

/// Reads the events of a dead spool after `after_seq`, in order, each once; the stream ends
/// where the spool ends. Read on a blocking thread, a bounded window ahead of the reader.
pub(super) fn read(dir: PathBuf, after_seq: u64) -> EventsRx {
    let (tx, rx) = mpsc::channel(READ_AHEAD);
    tokio::task::spawn_blocking(move || {
        for_each(&dir, after_seq, |event| tx.blocking_send(Ok(Box::new(event))).is_ok());
    });
    rx
}

/// Every event of a dead spool after `after_seq`, in order (blocking).
pub(super) fn read_all(dir: &Path, after_seq: u64) -> Vec<Event> {
    let mut events = Vec::new();
    for_each(dir, after_seq, |event| {
        events.push(event);
        true
    });
    events
}

/// Hands each event of a dead spool after `after_seq` to `take`, in order, until it says
/// stop. A damaged line becomes a notice outside the sequence (seq 0).
fn for_each(dir: &Path, after_seq: u64, mut take: impl FnMut(Event) -> bool) {
    let mut last = after_seq;
    for (_, path) in segments(dir) {
        if !each_in_segment(&path, &mut last, &mut take) {
            return;
        }
    }
}

/// One segment's events past `*last`; false when the taker said stop.
fn each_in_segment(path: &Path, last: &mut u64, take: &mut impl FnMut(Event) -> bool) -> bool {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(err) => {
            tracing::warn!(path = %path.display(), %err, "cannot read a dead sidecar's spool segment");
            return true;
        }
    };
    let mut reader = std::io::BufReader::with_capacity(256 * 1024, file);
    let mut line = Vec::new();
    let mut number = 0u64;
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(path = %path.display(), %err, "reading a dead sidecar's spool");
                return true;
            }
        }
        number += 1;
        if line.last() != Some(&b'\n') {
            // A torn last line: cut by the kill, never published.
            return true;
        }
        let event = match serde_json::from_slice::<Event>(&line) {
            Ok(event) if event.seq > *last => event,
            Ok(_) => continue,
            Err(err) => {
                let message = format!(
                    "a damaged line in the agent's spool was skipped ({}:{number}: {err})",
                    path.display()
                );
                tracing::warn!("{message}");
                if !take(Event { seq: 0, at: 0, kind: EventKind::Error { message } }) {
                    return false;
                }
                continue;
            }
        };
        *last = event.seq;
        if !take(event) {
            return false;
        }
    }
}

/// The status a dead sidecar would report: the agent gone, the spool's end.
pub(super) fn status(dir: &Path, acked_seq: u64) -> Status {
    Status {
        version: String::new(),
        agent_state: AgentState::Exited,
        agent_pid: None,
        exit: None,
        last_seq: last_seq(dir),
        acked_seq,
        intake_stalled: None,
    }
}
