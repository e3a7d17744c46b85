//! `bench`: measures Tether against its performance targets (DESIGN §12 and later ones) with
//! real processes, prints a table and writes `target/bench.json`. Run by `scripts/bench.sh`
//! (release build). Benchmarks, not tests: nothing here fails on a slow machine.
//!
//! Every figure is the min / median of [`RUNS`] runs, or a ratio against a baseline
//! measured in the same run: the relay is compared with `fast-agent` read straight from a
//! pipe and with the official ACP SDK client (`sdk-baseline`) driving the same agent.
//!
//! `bench [SECTION…]` runs some sections only: relay, sessions, scale, restart, docker,
//! context, workflows, page, review, usage, warm, idle, face, sandbox, checkpoint.
// The test crate is exempt from the length rule: a scenario reads top to bottom.
#![allow(clippy::too_many_lines)]

use std::time::{Duration, Instant};

use protocol::api::EventKind;
use protocol::api::{ApiClient, ResumeOutcome, SessionState};
use serde_json::{Value, json};
use tether_tests::daemon::{Api, Create, Daemon, is_state, ok, turn_ended, until};

#[path = "bench/workflows.rs"]
mod workflows;

#[path = "bench/page.rs"]
mod page;

#[path = "bench/idle.rs"]
mod idle;

#[path = "bench/face.rs"]
mod face;

#[path = "bench/sandbox.rs"]
mod sandbox;

#[path = "bench/checkpoint.rs"]
mod checkpoint;

struct Row {
    measure: &'static str,
    target: &'static str,
    result: String,
    value: Value,
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let idx = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[idx]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn create_ready(api: &Api, workspace: &std::path::Path) -> (String, Duration) {
    let task = ok("task.create", api.typed().task_create("bench".into(), None)).await;
    let started = Instant::now();
    let row = ok(
        "task.session.create",
        Create { shared: Some(true), ..Create::new(&task.id, "mock", Some(workspace)) }
            .send(api.typed()),
    )
    .await;
    let session = row.id;
    let mut events = api.subscribe(&session, 0).await;
    until(&mut events, |e| is_state(e, SessionState::WaitingForInput)).await;
    (session, started.elapsed())
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| status.lines().find(|l| l.starts_with("VmRSS:")).map(str::to_owned))
        .and_then(|line| line.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// How many times each figure is measured.
const RUNS: usize = 3;

/// Chunks per relay run.
const RELAY_CHUNKS: u64 = 100_000;

/// The fixed rate of the latency rows, and how many chunks are sent at it.
const LATENCY_RATE: u64 = 5_000;
const LATENCY_CHUNKS: u64 = 10_000;

/// A row's text made from figures (rows hold `&'static str`; a bench run is short).
fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

/// Min and median of a set of samples (sorted here).
fn min_median(samples: &mut [f64]) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    (samples[0], samples[samples.len() / 2])
}

fn now_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_micros())
}

/// The send time `fast-agent` writes into a paced chunk (`chunk N at <µs> `).
fn sent_at(text: &str) -> Option<u128> {
    text.split_whitespace().nth(3)?.parse().ok()
}

/// Percentile `p` of latencies in µs (sorted here).
fn pct(samples: &mut [u128], p: f64) -> u128 {
    samples.sort_unstable();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

/// A profile running `fast-agent` (no state, no resume).
fn fast_profile() -> String {
    let command = tether_tests::target_dir().join("fast-agent");
    format!(
        "id = \"fast\"\ndisplay_name = \"fast-agent\"\ncommand = [{:?}]\nprotocol = \"acp\"\n",
        command.to_str().expect("UNWRAP: the target dir is UTF-8")
    )
}

/// An agent program (in the target dir) on pipes, for a baseline without Tether: the
/// child, its stdin, and its stdout's lines.
fn spawn_piped(
    program: &str,
    args: &[&str],
) -> (
    tokio::process::Child,
    tokio::process::ChildStdin,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(tether_tests::target_dir().join(program))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|err| panic!("spawn {program}: {err}"));
    let stdin = child.stdin.take().expect("UNWRAP: piped");
    let lines = tokio::io::BufReader::new(child.stdout.take().expect("UNWRAP: piped")).lines();
    (child, stdin, lines)
}

/// One run of the raw-pipe baseline: `fast-agent`'s stdout read line by line with a
/// check of each chunk (parsed, as any client must), nothing kept. Returns msg/s, or the
/// latencies (µs) in paced mode.
async fn raw_pipe(chunks: u64, rate: Option<u64>) -> (f64, Vec<u128>) {
    use tokio::io::AsyncWriteExt;
    let (mut child, mut stdin, mut lines) = spawn_piped("fast-agent", &[]);
    let text = match rate {
        Some(rate) => format!("/stream {chunks} {rate}"),
        None => format!("/stream {chunks}"),
    };
    let prompt = json!({"jsonrpc": "2.0", "id": 1, "method": "session/prompt",
        "params": {"sessionId": "s", "prompt": [{"type": "text", "text": text}]}});
    let started = Instant::now();
    stdin.write_all(format!("{prompt}\n").as_bytes()).await.unwrap();
    let (mut count, mut latencies) = (0u64, Vec::new());
    while let Some(line) = lines.next_line().await.unwrap() {
        let message: Value = serde_json::from_str(&line).unwrap();
        if message.get("id").is_some() {
            break;
        }
        let chunk = message["params"]["update"]["content"]["text"].as_str().unwrap();
        count += 1;
        assert!(chunk.starts_with(&format!("chunk {count} ")), "in order");
        if rate.is_some() {
            latencies.push(now_us().saturating_sub(sent_at(chunk).unwrap()));
        }
    }
    let took = started.elapsed();
    assert_eq!(count, chunks);
    drop(stdin);
    child.wait().await.unwrap();
    (count as f64 / took.as_secs_f64(), latencies)
}

/// One run of the official SDK client against `fast-agent`, when `sdk-baseline` is built
/// (scripts/bench.sh builds it). Returns msg/s, or the latencies' p50/p99 (µs).
fn sdk(chunks: u64, rate: Option<u64>) -> Option<Value> {
    sdk_driving(chunks, rate, &[tether_tests::target_dir().join("fast-agent").into_os_string()])
}

/// One run of the official SDK client against the agent `argv` runs (e.g. `supervisor acp`
/// in front of `fast-agent`), as [`sdk`].
fn sdk_driving(chunks: u64, rate: Option<u64>, argv: &[std::ffi::OsString]) -> Option<Value> {
    sdk_driving_on(None, chunks, rate, argv)
}

/// [`sdk_driving`] with the SDK client kept to one CPU (`taskset`), when `cpu` says which.
fn sdk_driving_on(
    cpu: Option<usize>,
    chunks: u64,
    rate: Option<u64>,
    argv: &[std::ffi::OsString],
) -> Option<Value> {
    let program = tether_tests::target_dir().join("sdk-baseline");
    if !program.is_file() {
        return None;
    }
    let mut command = match cpu {
        Some(cpu) => {
            let mut taskset = std::process::Command::new("taskset");
            taskset.args(["-c", &cpu.to_string()]).arg(program);
            taskset
        }
        None => std::process::Command::new(program),
    };
    command.args(["--chunks", &chunks.to_string()]);
    if let Some(rate) = rate {
        command.args(["--rate", &rate.to_string()]);
    }
    command.arg("--").args(argv);
    let output = command.output().expect("run sdk-baseline");
    assert!(output.status.success(), "sdk-baseline: {}", String::from_utf8_lossy(&output.stderr));
    Some(serde_json::from_slice(&output.stdout).expect("sdk-baseline prints JSON"))
}

/// One Tether run: `fast-agent` behind agentctl and the supervisor, read by a WebSocket
/// client. Returns msg/s (every chunk checked in order), or the latencies in paced mode.
async fn tether_run(api: &Api, session: &str, chunks: u64, rate: Option<u64>) -> (f64, Vec<u128>) {
    let after = api.status(session).await.last_event_seq;
    let mut batches = api.subscribe_batches(session, after).await;
    let text = match rate {
        Some(rate) => format!("/stream {chunks} {rate}"),
        None => format!("/stream {chunks}"),
    };
    let started = Instant::now();
    api.prompt(session, &text).await.unwrap();
    let (mut count, mut latencies) = (0u64, Vec::new());
    'read: loop {
        let batch = tether_tests::within("a batch of events", batches.next())
            .await
            .expect("the subscription is open")
            .expect("the batch parses")
            .0;
        for event in batch {
            match &event.kind {
                EventKind::AgentMessageChunk { text, .. } => {
                    count += 1;
                    assert!(text.starts_with(&format!("chunk {count} ")), "in order: {text}");
                    if rate.is_some() {
                        latencies.push(now_us().saturating_sub(sent_at(text).unwrap()));
                    }
                }
                _ if turn_ended(&event) => break 'read,
                _ => {}
            }
        }
    }
    let took = started.elapsed();
    assert_eq!(count, chunks, "every chunk once");
    (count as f64 / took.as_secs_f64(), latencies)
}

async fn relay(rows: &mut Vec<Row>) {
    let daemon = Daemon::start_with_profiles(&[], &[("fast.toml", &fast_profile())]).await;
    let api = daemon.api().await;
    let session = api.ready_session("fast", &daemon.workspace("relay")).await;
    let (mut raw, mut sdk_rates, mut ours) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        raw.push(raw_pipe(RELAY_CHUNKS, None).await.0);
        if let Some(out) = sdk(RELAY_CHUNKS, None) {
            sdk_rates.push(out["msgs_per_s"].as_f64().unwrap());
        }
        ours.push(tether_run(&api, &session, RELAY_CHUNKS, None).await.0);
    }
    let (raw_min, raw_med) = min_median(&mut raw);
    let (our_min, our_med) = min_median(&mut ours);
    let (sdk_text, sdk_value) = if sdk_rates.is_empty() {
        ("not built".to_owned(), Value::Null)
    } else {
        let (min, med) = min_median(&mut sdk_rates);
        (
            format!("{min:.0} / {med:.0} msg/s; Tether ÷ SDK (medians) {:.2}×", our_med / med),
            json!({"min": min, "median": med, "ratio_median": our_med / med}),
        )
    };
    rows.push(Row {
        measure: "relay, fast-agent → agentctl → supervisor → WebSocket client (min / median)",
        target: "≥ 100,000 msg/s and ≥ 0.8× the SDK client",
        result: format!(
            "{our_min:.0} / {our_med:.0} msg/s ({RELAY_CHUNKS} chunks, in order, none lost or doubled)"
        ),
        value: json!({"min": our_min, "median": our_med, "chunks": RELAY_CHUNKS}),
    });
    rows.push(Row {
        measure: "  baseline: official ACP SDK client on fast-agent (min / median)",
        target: "—",
        result: sdk_text,
        value: sdk_value,
    });
    rows.push(Row {
        measure: "  baseline: fast-agent's stdout read from a pipe (min / median)",
        target: "—",
        result: format!(
            "{raw_min:.0} / {raw_med:.0} msg/s; Tether ÷ pipe (medians) {:.2}×",
            our_med / raw_med
        ),
        value: json!({"min": raw_min, "median": raw_med, "ratio_median": our_med / raw_med}),
    });

    // Latency at a fixed rate: the agent writes each chunk with its time; the client
    // takes the difference (same clock).
    let (mut p50s, mut p99s, mut raw_p99s, mut sdk_p99s) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let (_, mut latencies) =
            tether_run(&api, &session, LATENCY_CHUNKS, Some(LATENCY_RATE)).await;
        p50s.push(pct(&mut latencies, 0.5) as f64 / 1000.0);
        p99s.push(pct(&mut latencies, 0.99) as f64 / 1000.0);
        let (_, mut latencies) = raw_pipe(LATENCY_CHUNKS, Some(LATENCY_RATE)).await;
        raw_p99s.push(pct(&mut latencies, 0.99) as f64 / 1000.0);
        if let Some(out) = sdk(LATENCY_CHUNKS, Some(LATENCY_RATE)) {
            sdk_p99s.push(out["latency_us"]["p99"].as_f64().unwrap() / 1000.0);
        }
    }
    let (p50_min, p50_med) = min_median(&mut p50s);
    let (p99_min, p99_med) = min_median(&mut p99s);
    let (raw_min, raw_med) = min_median(&mut raw_p99s);
    let sdk_text = if sdk_p99s.is_empty() {
        "SDK not built".to_owned()
    } else {
        let (min, med) = min_median(&mut sdk_p99s);
        format!("SDK p99 {min:.2} / {med:.2} ms")
    };
    rows.push(Row {
        measure: "relay latency at 5,000 msg/s, agent write → WebSocket client (p50; p99; min / median)",
        target: "overhead p99 ≤ 2 ms",
        result: format!(
            "p50 {p50_min:.2} / {p50_med:.2} ms; p99 {p99_min:.2} / {p99_med:.2} ms (pipe p99 {raw_min:.2} / {raw_med:.2} ms; {sdk_text})"
        ),
        value: json!({"p50_ms": [p50_min, p50_med], "p99_ms": [p99_min, p99_med], "pipe_p99_ms": [raw_min, raw_med]}),
    });
    ok("sessions.stop_all", api.typed().stop_all()).await;
}

/// Prints the newest rows to stderr as each section ends (the table comes at the end).
fn progress(rows: &[Row]) {
    static SHOWN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let from = SHOWN.swap(rows.len(), std::sync::atomic::Ordering::Relaxed);
    for row in &rows[from..] {
        eprintln!("bench: {} — {}", row.measure, row.result);
    }
}

#[tokio::main]
async fn main() {
    let wanted: Vec<String> = std::env::args().skip(1).collect();
    let run = |section: &str| wanted.is_empty() || wanted.iter().any(|w| w == section);
    let mut rows = Vec::new();
    if run("relay") {
        relay(&mut rows).await;
        progress(&rows);
    }
    if run("sessions") {
        sessions(&mut rows).await;
        progress(&rows);
    }
    if run("scale") {
        scale(&mut rows).await;
        progress(&rows);
    }
    if run("restart") {
        restart(&mut rows).await;
        progress(&rows);
    }
    if run("docker") {
        docker(&mut rows).await;
        progress(&rows);
    }
    if run("context") {
        context(&mut rows);
        progress(&rows);
    }
    if run("workflows") {
        workflows::workflows(&mut rows).await;
        progress(&rows);
    }
    if run("page") {
        page::page(&mut rows).await;
        progress(&rows);
    }
    if run("review") {
        page::review(&mut rows).await;
        progress(&rows);
    }
    if run("lists") {
        page::lists(&mut rows).await;
        progress(&rows);
    }
    if run("usage") {
        idle::usage(&mut rows).await;
        progress(&rows);
    }
    if run("warm") {
        idle::warm(&mut rows).await;
        progress(&rows);
    }
    if run("idle") {
        idle::idle(&mut rows).await;
        progress(&rows);
    }
    if run("face") {
        face::face(&mut rows).await;
        progress(&rows);
    }
    if run("sandbox") {
        sandbox::sandbox(&mut rows).await;
        progress(&rows);
    }
    if run("checkpoint") {
        checkpoint::checkpoint(&mut rows).await;
        progress(&rows);
    }

    println!("| measure | target | result |\n|---|---|---|");
    for row in &rows {
        println!("| {} | {} | {} |", row.measure, row.target, row.result);
    }
    let out: Vec<Value> = rows
        .iter()
        .map(|row| json!({"measure": row.measure, "target": row.target, "result": row.value}))
        .collect();
    let path = tether_tests::target_dir().join("../bench.json");
    std::fs::write(&path, serde_json::to_string_pretty(&out).unwrap()).unwrap();
    println!("\nwritten to {}", path.display());
}

/// Session creation, the sidecar's memory and native resume, with `mock-agent`.
async fn sessions(rows: &mut Vec<Row>) {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let (mut p50s, mut p99s, mut resumes) = (Vec::new(), Vec::new(), Vec::new());
    let mut rss = Vec::new();
    for run in 0..RUNS {
        let mut samples = Vec::new();
        let mut sessions = Vec::new();
        for n in 0..50 {
            let workspace = daemon.workspace(&format!("c{run}-{n}"));
            let (session, took) = create_ready(&api, &workspace).await;
            samples.push(took);
            sessions.push(session);
        }
        p50s.push(ms(percentile(&mut samples, 0.5)));
        p99s.push(ms(percentile(&mut samples, 0.99)));
        rss.push(rss_kib(daemon.agentctl_pid(&sessions[0])) as f64 / 1024.0);
        // Native resume (session/load) of 20 stopped sessions that have a history.
        for session in sessions.iter().take(20) {
            api.ask(session, "hello").await;
        }
        ok("sessions.stop_all", api.typed().stop_all()).await;
        let mut samples = Vec::new();
        for session in sessions.iter().take(20) {
            let started = Instant::now();
            let resumed = api.resume(session).await.unwrap();
            samples.push(started.elapsed());
            assert_eq!(resumed.outcome, ResumeOutcome::NativeLoad);
        }
        resumes.push(ms(percentile(&mut samples, 0.5)));
        ok("sessions.stop_all", api.typed().stop_all()).await;
    }
    let ((p50_min, p50_med), (p99_min, p99_med)) = (min_median(&mut p50s), min_median(&mut p99s));
    rows.push(Row {
        measure: "create session → WAITING_FOR_INPUT, 50 sessions (p50; p99; min / median of runs)",
        target: "≤ 10 ms / ≤ 30 ms",
        result: format!("p50 {p50_min:.1} / {p50_med:.1} ms; p99 {p99_min:.1} / {p99_med:.1} ms"),
        value: json!({"p50_ms": [p50_min, p50_med], "p99_ms": [p99_min, p99_med]}),
    });
    let (rss_min, rss_med) = min_median(&mut rss);
    rows.push(Row {
        measure: "agentctl RSS, idle (min / median)",
        target: "≤ 8 MiB",
        result: format!("{rss_min:.1} / {rss_med:.1} MiB"),
        value: json!({"mib": [rss_min, rss_med]}),
    });
    let (min, med) = min_median(&mut resumes);
    rows.push(Row {
        measure: "task.session.resume → WAITING_FOR_INPUT, native (p50 of 20; min / median)",
        target: "≤ 15 ms",
        result: format!("{min:.1} / {med:.1} ms"),
        value: json!({"p50_ms": [min, med]}),
    });
}

/// Building the resume context: from a 1 GiB history, and with a huge newest entry.
fn context(rows: &mut Vec<Row>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.jsonl");
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(1 << 30).unwrap();
    drop(file);
    {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        for n in 1..=2000u64 {
            let line = json!({"seq": n, "at": 0, "type": "user_message", "role": "user", "content": format!("message {n} with some text")});
            writeln!(file, "{line}").unwrap();
        }
    }
    let mut samples = Vec::new();
    let mut bytes_read = 0;
    for _ in 0..RUNS {
        let started = Instant::now();
        let mut file = std::fs::File::open(&path).unwrap();
        let context = supervisor::resume_context::build(&mut file, "next", 50_000).unwrap();
        samples.push(ms(started.elapsed()));
        bytes_read = context.bytes_read;
    }
    let (min, med) = min_median(&mut samples);
    rows.push(Row {
        measure: "resume context from a 1 GiB history (min / median)",
        target: "≤ 20 ms",
        result: format!("{min:.2} / {med:.2} ms ({} KiB read)", bytes_read / 1024),
        value: json!({"ms": [min, med], "bytes_read": bytes_read}),
    });

    // The newest entry is huge (an agent's 8 MiB reply).
    let big = dir.path().join("big.jsonl");
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&big).unwrap();
        for n in 1..=100u64 {
            let line = json!({"seq": n, "at": 0, "type": "user_message", "role": "user", "content": format!("message {n}")});
            writeln!(file, "{line}").unwrap();
        }
        let huge = json!({"seq": 101, "at": 0, "type": "agent_message", "role": "assistant", "content": "x".repeat(8 << 20)});
        writeln!(file, "{huge}").unwrap();
    }
    let mut samples = Vec::new();
    for _ in 0..RUNS {
        let started = Instant::now();
        let mut file = std::fs::File::open(&big).unwrap();
        let context = supervisor::resume_context::build(&mut file, "next", 50_000).unwrap();
        samples.push(ms(started.elapsed()));
        assert_eq!(context.included, 101);
    }
    let (min, med) = min_median(&mut samples);
    rows.push(Row {
        measure: "resume context, newest entry 8 MiB (min / median)",
        target: "≤ 20 ms",
        result: format!("{min:.2} / {med:.2} ms"),
        value: json!({"ms": [min, med]}),
    });
}

/// Whether the daemon's "re-attaching done" line counts `live` re-attached and none failed
/// (its colours taken out).
fn all_reattached(line: &str, live: usize) -> bool {
    let mut plain = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('\x1b') {
        plain.push_str(&rest[..start]);
        rest = rest[start..].find('m').map_or("", |end| &rest[start + end + 1..]);
    }
    plain.push_str(rest);
    plain.contains(&format!("reattached={live}")) && plain.contains("failed=0")
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |dir| dir.count())
}

/// The daemon's memory and fds per session at 1,000 live `fast-agent` sessions, and its
/// fds once they are stopped.
async fn scale(rows: &mut Vec<Row>) {
    const SESSIONS: usize = 1000;
    let (mut kib, mut live_fds, mut stopped_fds, mut totals) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let daemon = Daemon::start_with_profiles(&[], &[("fast.toml", &fast_profile())]).await;
        let pid = daemon.pid().expect("the daemon runs");
        let api = daemon.api().await;
        // One session first, so that what every session shares is already there.
        api.ready_session("fast", &daemon.workspace("warm")).await;
        let (rss_before, fds_before) = (rss_kib(pid), open_fds(pid));
        for n in 0..SESSIONS {
            api.ready_session("fast", &daemon.workspace(&format!("s{n}"))).await;
        }
        let (rss_after, fds_after) = (rss_kib(pid), open_fds(pid));
        kib.push(rss_after.saturating_sub(rss_before) as f64 / SESSIONS as f64);
        live_fds.push(fds_after.saturating_sub(fds_before) as f64 / SESSIONS as f64);
        totals.push(fds_after as f64);
        ok("sessions.stop_all", api.typed().stop_all()).await;
        stopped_fds.push(open_fds(pid).saturating_sub(fds_before) as f64 / SESSIONS as f64);
    }
    // The daemon's own limit (it raises its soft limit to the hard one).
    let limit = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|text| text.lines().find(|l| l.starts_with("Max open files")).map(str::to_owned))
        .and_then(|line| line.split_whitespace().nth(4).map(str::to_owned))
        .unwrap_or_default();
    let (kib_min, kib_med) = min_median(&mut kib);
    rows.push(Row {
        measure: "supervisor memory per idle session, 1,000 live sessions (min / median)",
        target: "≤ 64 KiB",
        result: format!("{kib_min:.0} / {kib_med:.0} KiB"),
        value: json!({"kib": [kib_min, kib_med]}),
    });
    let (live_min, live_med) = min_median(&mut live_fds);
    let (stopped_min, stopped_med) = min_median(&mut stopped_fds);
    let (total_min, total_med) = min_median(&mut totals);
    rows.push(Row {
        measure: "supervisor fds per live session; per stopped session (min / median)",
        target: "≤ 2; 0",
        result: format!(
            "{live_min:.2} / {live_med:.2}; {stopped_min:.2} / {stopped_med:.2} (daemon total at 1,000 live: {total_min:.0} / {total_med:.0} fds; hard limit here {limit})"
        ),
        value: json!({"live": [live_min, live_med], "stopped": [stopped_min, stopped_med], "total_at_1000": [total_min, total_med]}),
    });
}

/// Restart with 10,000 stored resumable sessions, and with 100 live sidecars.
async fn restart(rows: &mut Vec<Row>) {
    const STORED: usize = 10_000;
    const LIVE: usize = 100;
    // One real session, asked and stopped (resumable), copied in the store.
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let model = api.ready_session("mock", &daemon.workspace("model")).await;
    api.ask(&model, "hello").await;
    ok("sessions.stop_all", api.typed().stop_all()).await;
    drop(api);
    daemon.terminate().await;
    // The baseline: the same daemon with that one stored session.
    let mut baseline = Vec::new();
    for _ in 0..RUNS {
        let started = Instant::now();
        daemon.restart().await;
        baseline.push(ms(started.elapsed()));
        daemon.terminate().await;
    }
    let (base_min, base_med) = min_median(&mut baseline);
    let store = supervisor::store::Store::open(&daemon.home().join("tether/state.db")).unwrap();
    store
        .call(move |conn| {
            let tx = conn.transaction()?;
            let mut inserted = 0;
            let copies = format!(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {STORED})"
            );
            inserted += tx.execute(
                &format!(
                    "{copies} INSERT INTO task_sessions (id, task_id, agent_profile_id, profile_snapshot, runtime, state, \
                     workspace_path, error_message, created_at, updated_at) SELECT substr(s.id, 1, 24) || printf('%012x', n.i), task_id, agent_profile_id, \
                     profile_snapshot, runtime, state, workspace_path, error_message, created_at, updated_at \
                     FROM n, task_sessions s WHERE s.id = ?1"
                ),
                [&model],
            )?;
            inserted += tx.execute(
                &format!(
                    "{copies} INSERT INTO executors_running (session_id, execution_id, generation, runtime, status, \
                     resume_token, agentctl_port, agentctl_pid, agentctl_start_time, boot_id, agentctl_token, acked_seq, \
                     resume_context_pending, acp_session_id, resume_outcome, container_id, last_seen_at, created_at, \
                     updated_at) SELECT substr(e.session_id, 1, 24) || printf('%012x', n.i), \
                     substr(e.execution_id, 1, 24) || printf('%012x', n.i), generation, runtime, status, resume_token, agentctl_port, \
                     agentctl_pid, agentctl_start_time, boot_id, agentctl_token, acked_seq, resume_context_pending, \
                     acp_session_id, resume_outcome, container_id, last_seen_at, created_at, updated_at \
                     FROM n, executors_running e WHERE e.session_id = ?1"
                ),
                [&model],
            )?;
            tx.commit()?;
            Ok(inserted)
        })
        .await
        .map(|inserted| assert_eq!(inserted, 2 * STORED, "sessions and runtime records copied"))
        .unwrap();
    drop(store);
    let mut samples = Vec::new();
    for _ in 0..RUNS {
        let started = Instant::now();
        daemon.restart().await;
        samples.push(ms(started.elapsed()));
        daemon.terminate().await;
    }
    let (min, med) = min_median(&mut samples);
    rows.push(Row {
        measure: "restart → API serving, 10,000 stored resumable sessions (min / median)",
        target: "≤ 100 ms",
        result: format!(
            "{min:.0} / {med:.0} ms (baseline, the same daemon with 1 stored session: {base_min:.0} / {base_med:.0} ms)"
        ),
        value: json!({"ms": [min, med], "baseline_ms": [base_min, base_med], "stored": STORED + 1}),
    });
    drop(daemon);

    // Live sidecars: serving, then every one re-attached (the daemon logs when).
    let mut daemon = Daemon::start(&[]).await;
    let mut sessions = Vec::new();
    {
        let api = daemon.api().await;
        for n in 0..LIVE {
            sessions.push(api.ready_session("mock", &daemon.workspace(&format!("l{n}"))).await);
        }
    }
    let (mut serving, mut reattached, mut counts) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        daemon.kill().await;
        let mut log = daemon.log_lines();
        let started = Instant::now();
        daemon.restart().await;
        serving.push(ms(started.elapsed()));
        let line = tether_tests::daemon::await_log(&mut log, "recovery: re-attaching done").await;
        reattached.push(ms(started.elapsed()));
        counts.push(all_reattached(&line, LIVE));
    }
    let api = daemon.api().await;
    let mut running = 0;
    for session in &sessions {
        if api.status(session).await.is_agent_running {
            running += 1;
        }
    }
    let (serving_min, serving_med) = min_median(&mut serving);
    let (min, med) = min_median(&mut reattached);
    rows.push(Row {
        measure: "restart with 100 live sidecars: API serving; all re-attached (min / median)",
        target: "≤ 500 ms for 100, 0 lost",
        result: format!(
            "serving {serving_min:.0} / {serving_med:.0} ms; re-attached {min:.0} / {med:.0} ms; all {LIVE} in every run: {}; running after: {running}",
            counts.iter().all(|&all| all)
        ),
        value: json!({"serving_ms": [serving_min, serving_med], "reattached_ms": [min, med], "running": running}),
    });
    ok("sessions.stop_all", api.typed().stop_all()).await;
}

/// Restart with 100 live containers (needs a Docker engine and the static binaries).
async fn docker(rows: &mut Vec<Row>) {
    const LIVE: usize = 100;
    let Some(docker) = tether_tests::docker::engine().await else {
        rows.push(Row {
            measure: "restart with 100 live containers: all re-attached",
            target: "≤ 1 s, 0 lost",
            result: "not measured: no Docker engine".into(),
            value: Value::Null,
        });
        return;
    };
    let tag = format!("tether-bench-mock:{}", uuid::Uuid::new_v4().simple());
    tether_tests::docker::build_mock_image(&docker, &tag).await;
    let agentctl = tether_tests::docker::static_binary("TETHER_STATIC_AGENTCTL", "agentctl");
    let profile = format!(
        "id = \"mock-docker\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{{home}}/.mock-agent\"]\nprotocol = \"acp\"\n\
         runtime = \"docker\"\n[docker]\nimage = \"{tag}\"\nmemory_mb = 64\ncpus = 0.5\n"
    );
    let mut daemon = Daemon::start_with_env(
        &["--static-agentctl", agentctl.to_str().unwrap()],
        &[("mock-docker.toml", &profile)],
        &[],
    )
    .await;
    let cleanup = tether_tests::docker::Cleanup {
        label: format!("tether.install_id={}", daemon.install_id),
        image: Some(tag),
    };
    {
        let api = daemon.api().await;
        for n in 0..LIVE {
            api.ready_session("mock-docker", &daemon.workspace(&format!("d{n}"))).await;
        }
    }
    let (mut serving, mut reattached, mut all) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        daemon.kill().await;
        let mut log = daemon.log_lines();
        let started = Instant::now();
        daemon.restart().await;
        serving.push(ms(started.elapsed()));
        let line = tether_tests::daemon::await_log(&mut log, "recovery: re-attaching done").await;
        reattached.push(ms(started.elapsed()));
        all.push(all_reattached(&line, LIVE));
    }
    let (serving_min, serving_med) = min_median(&mut serving);
    let (min, med) = min_median(&mut reattached);
    rows.push(Row {
        measure: "restart with 100 live containers: API serving; all re-attached (min / median)",
        target: "≤ 1 s, 0 lost",
        result: format!(
            "serving {serving_min:.0} / {serving_med:.0} ms; re-attached {min:.0} / {med:.0} ms; all {LIVE} in every run: {}",
            all.iter().all(|&all| all)
        ),
        value: json!({"serving_ms": [serving_min, serving_med], "reattached_ms": [min, med]}),
    });
    let api = daemon.api().await;
    ok("sessions.stop_all", api.typed().stop_all()).await;
    drop(api);
    drop(daemon);
    drop(cleanup);
}
