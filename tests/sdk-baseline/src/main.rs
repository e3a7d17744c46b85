//! `sdk-baseline`: the baseline that Tether's relay is compared against in `scripts/bench.sh`.
//!
//! It drives an ACP agent directly with the official Rust ACP SDK (`agent-client-protocol`
//! 5.0.0) as its client, with no relay in between: `initialize`, `session/new`, then one
//! `session/prompt` of `/stream N` (or `/stream N R` with `--rate R`), counting the
//! `agent_message_chunk` updates that come back and checking they run `chunk 1`, `chunk 2`, …
//! With `--rate`, each chunk carries the Unix µs it was written at, and the time from then to
//! its handling here is kept as a latency sample.
//!
//! ```text
//! sdk-baseline --chunks N [--rate R] -- AGENT_PROGRAM [AGENT_ARGS...]
//! ```
//!
//! Prints one JSON line: `{"count", "in_order", "seconds", "msgs_per_s", "latency_us"}`, and
//! exits 0 only if all N chunks arrived in order and the turn ended with `end_turn`.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    ContentBlock, InitializeRequest, NewSessionRequest, PromptRequest, SessionNotification,
    SessionUpdate, StopReason, TextContent,
};
use agent_client_protocol::{Agent, Client};
use serde_json::json;
use tokio::sync::Notify;

mod agent;

const USAGE: &str = "usage: sdk-baseline --chunks N [--rate R] -- AGENT_PROGRAM [AGENT_ARGS...]";

/// How long to wait, once the prompt has been answered, for chunks still being handled.
const STRAGGLER_WAIT: Duration = Duration::from_secs(5);

struct Args {
    chunks: u64,
    rate: Option<u64>,
    agent: Vec<String>,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let (mut chunks, mut rate) = (None, None);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> Result<u64, String> {
            let value = args.next().ok_or(format!("{name} needs a value"))?;
            value.parse().map_err(|_| format!("{name}: not a number: {value}"))
        };
        match arg.as_str() {
            "--chunks" => chunks = Some(number("--chunks")?),
            "--rate" => rate = Some(number("--rate")?).filter(|&r| r > 0),
            "--" => break,
            other => return Err(format!("unexpected argument: {other}")),
        }
    }
    let agent: Vec<String> = args.collect();
    match (chunks, agent.is_empty()) {
        (None, _) => Err("--chunks is required".into()),
        (_, true) => Err("no agent program after --".into()),
        (Some(chunks), false) => Ok(Args { chunks, rate, agent }),
    }
}

/// What the notification handler has seen so far.
#[derive(Default)]
struct Tally {
    count: u64,
    /// The K the next chunk should carry.
    next: u64,
    /// Chunks out of order, duplicated, after a gap, or unreadable.
    errors: u64,
    latencies_us: Vec<i64>,
}

impl Tally {
    fn record(&mut self, text: &str, paced: bool) {
        self.count += 1;
        let mut words = text.strip_prefix("chunk ").unwrap_or_default().split_whitespace();
        match words.next().and_then(|k| k.parse::<u64>().ok()) {
            Some(k) if k == self.next => self.next += 1,
            Some(k) => {
                self.errors += 1;
                self.next = k + 1;
            }
            None => self.errors += 1,
        }
        if paced {
            let sent = match (words.next(), words.next()) {
                (Some("at"), Some(at)) => at.parse::<i64>().ok(),
                _ => None,
            };
            match sent {
                Some(sent) => self.latencies_us.push(unix_micros() - sent),
                None => self.errors += 1,
            }
        }
    }
}

/// The state shared between the SDK's notification handler and the prompting task.
struct Shared {
    tally: Mutex<Tally>,
    /// Signalled once, when the N-th chunk has been counted.
    all_in: Notify,
    target: u64,
    paced: bool,
}

fn unix_micros() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[i64], p: usize) -> i64 {
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank - 1]
}

/// Runs the whole exchange; returns the stop reason and the time from sending the prompt to
/// having both its response and (unless some never came) all N chunks.
async fn run(args: &Args, shared: Arc<Shared>) -> Result<(StopReason, Duration), String> {
    let (child, streams) = agent::start(&args.agent, &[])?;

    let prompt = match args.rate {
        None => format!("/stream {}", args.chunks),
        Some(rate) => format!("/stream {} {rate}", args.chunks),
    };
    let counter = Arc::clone(&shared);
    // Requests from the agent (permissions, fs, terminals) have no handler here; the SDK
    // answers those with "method not found" on its own.
    let outcome = Client
        .v1()
        .name("sdk-baseline")
        .on_receive_notification(
            async move |notification: SessionNotification, _cx| {
                if let SessionUpdate::AgentMessageChunk(chunk) = notification.update
                    && let ContentBlock::Text(text) = chunk.content
                {
                    let mut tally = counter.tally.lock().expect("tally lock poisoned");
                    tally.record(&text.text, counter.paced);
                    if tally.count == counter.target {
                        counter.all_in.notify_one();
                    }
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_with(streams, async |cx: ConnectionTo<Agent>| {
            cx.send_request(InitializeRequest::new(ProtocolVersion::V1)).block_task().await?;
            let cwd = std::env::current_dir()
                .map_err(agent_client_protocol::Error::into_internal_error)?;
            let session = cx.send_request(NewSessionRequest::new(cwd)).block_task().await?;

            let t0 = Instant::now();
            let request = PromptRequest::new(
                session.session_id,
                vec![ContentBlock::Text(TextContent::new(prompt))],
            );
            let response = cx.send_request(request).block_task().await?;
            // The SDK handles notifications in arrival order before routing the response, but
            // do not rely on it: wait (bounded, in case some never come) for the last chunk.
            let arrived = shared.all_in.notified();
            if shared.tally.lock().expect("tally lock poisoned").count < shared.target {
                tokio::time::timeout(STRAGGLER_WAIT, arrived).await.ok();
            }
            Ok((response.stop_reason, t0.elapsed()))
        })
        .await;
    agent::finish(child, outcome).await
}

fn main() -> ExitCode {
    let args =
        match agent::args_or_usage("sdk-baseline", USAGE, parse_args(std::env::args().skip(1))) {
            Ok(args) => args,
            Err(code) => return code,
        };
    let shared = Arc::new(Shared {
        tally: Mutex::new(Tally { next: 1, ..Tally::default() }),
        all_in: Notify::new(),
        target: args.chunks,
        paced: args.rate.is_some(),
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("cannot build the tokio runtime");
    let (stop_reason, elapsed) = match runtime.block_on(run(&args, Arc::clone(&shared))) {
        Ok(outcome) => outcome,
        Err(e) => {
            eprintln!("sdk-baseline: {e}");
            return ExitCode::FAILURE;
        }
    };

    let mut tally = shared.tally.lock().expect("tally lock poisoned");
    let seconds = elapsed.as_secs_f64();
    let latency = (!tally.latencies_us.is_empty()).then(|| {
        tally.latencies_us.sort_unstable();
        let sorted = &tally.latencies_us;
        json!({
            "p50": percentile(sorted, 50),
            "p99": percentile(sorted, 99),
            "max": sorted[sorted.len() - 1],
        })
    });
    let in_order = tally.errors == 0;
    let report = json!({
        "count": tally.count,
        "in_order": in_order,
        "seconds": seconds,
        "msgs_per_s": tally.count as f64 / seconds,
        "latency_us": latency,
    });
    println!("{report}");

    let mut problems = Vec::new();
    if tally.count != args.chunks {
        problems.push(format!("saw {} chunks, expected {}", tally.count, args.chunks));
    }
    if !in_order {
        problems.push(format!("{} chunks out of order, duplicated or unreadable", tally.errors));
    }
    if stop_reason != StopReason::EndTurn {
        problems.push(format!("the turn ended with {stop_reason:?}, not end_turn"));
    }
    if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("sdk-baseline: {}", problems.join("; "));
        ExitCode::FAILURE
    }
}
