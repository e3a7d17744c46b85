//! `bench`: measures Tether against the performance targets of DESIGN §12 with real
//! processes, prints a table and writes `target/bench.json`. Run by `scripts/bench.sh`
//! (release build). Benchmarks, not tests: nothing here fails on a slow machine.

use std::time::{Duration, Instant};

use protocol::api::{ApiClient, ResumeOutcome, SessionState};
use serde_json::{Value, json};
use tether_tests::daemon::{Api, Daemon, chunks, is_state, ok, turn_ended, until};

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
        api.typed().session_create(
            task.id,
            "mock".into(),
            workspace.to_str().unwrap().to_owned(),
            None,
            None,
        ),
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

#[tokio::main]
async fn main() {
    let mut rows = Vec::new();

    // 1. create → WAITING_FOR_INPUT (standalone).
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let mut samples = Vec::new();
    let mut sessions = Vec::new();
    for n in 0..50 {
        let (session, took) = create_ready(&api, &daemon.workspace(&format!("c{n}"))).await;
        samples.push(took);
        sessions.push(session);
    }
    let (p50, p99) = (percentile(&mut samples, 0.5), percentile(&mut samples, 0.99));
    rows.push(Row {
        measure: "create session → WAITING_FOR_INPUT (p50 / p99)",
        target: "≤ 10 ms / ≤ 30 ms",
        result: format!("{:.1} ms / {:.1} ms", ms(p50), ms(p99)),
        value: json!({"p50_ms": ms(p50), "p99_ms": ms(p99)}),
    });

    // agentctl RSS, idle.
    let sidecar = daemon.agentctl_pid(&sessions[0]);
    let rss = rss_kib(sidecar);
    rows.push(Row {
        measure: "agentctl RSS (idle)",
        target: "≤ 8 MiB",
        result: format!("{:.1} MiB", rss as f64 / 1024.0),
        value: json!({"kib": rss}),
    });

    // 2. relay throughput: session/update chunks reaching a WebSocket client.
    let session = &sessions[0];
    let mut events = api.subscribe_at_end(session).await;
    let started = Instant::now();
    api.prompt(session, "/stream 100000").await.unwrap();
    let seen = until(&mut events, turn_ended).await;
    let took = started.elapsed();
    let count = chunks(&seen).len();
    let rate = count as f64 / took.as_secs_f64();
    rows.push(Row {
        measure: "agent → WebSocket client relay",
        target: "≥ 100,000 msg/s",
        result: format!("{rate:.0} msg/s ({count} in {:.2} s)", took.as_secs_f64()),
        value: json!({"msgs_per_s": rate, "count": count}),
    });

    // 3. resume → WAITING_FOR_INPUT, native (session/load).
    let mut samples = Vec::new();
    for session in sessions.iter().take(20) {
        api.ask(session, "hello").await;
    }
    ok("sessions.stop_all", api.typed().stop_all()).await;
    for session in sessions.iter().take(20) {
        let started = Instant::now();
        let resumed = api.resume(session).await.unwrap();
        samples.push(started.elapsed());
        assert_eq!(resumed.outcome, ResumeOutcome::NativeLoad);
    }
    let p50 = percentile(&mut samples, 0.5);
    rows.push(Row {
        measure: "task.session.resume → WAITING_FOR_INPUT, native (p50)",
        target: "≤ 15 ms",
        result: format!("{:.1} ms", ms(p50)),
        value: json!({"p50_ms": ms(p50)}),
    });

    // 4. restart with live sidecars: time until the API serves (re-adoption included).
    drop(api);
    let mut daemon = daemon;
    let live = 100usize.min(sessions.len() + 50);
    {
        let api = daemon.api().await;
        for n in sessions.len()..live {
            let (session, _) = create_ready(&api, &daemon.workspace(&format!("l{n}"))).await;
            sessions.push(session);
        }
    }
    daemon.kill().await;
    let started = Instant::now();
    daemon.restart().await;
    let took = started.elapsed();
    let api = daemon.api().await;
    let mut running = 0;
    for session in &sessions {
        if api.status(session).await.is_agent_running {
            running += 1;
        }
    }
    rows.push(Row {
        measure: "restart → API serving, live sidecars re-adopted",
        target: "≤ 500 ms for 100, 0 lost",
        result: format!("{:.0} ms for {running} live sidecars", ms(took)),
        value: json!({"ms": ms(took), "readopted": running}),
    });
    ok("sessions.stop_all", api.typed().stop_all()).await;
    drop(api);
    drop(daemon);

    // 5. resume context from a 1 GiB history.
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
    let started = Instant::now();
    let mut file = std::fs::File::open(&path).unwrap();
    let context = supervisor::resume_context::build(&mut file, "next", 50_000).unwrap();
    let took = started.elapsed();
    rows.push(Row {
        measure: "resume context from a 1 GiB history",
        target: "≤ 20 ms",
        result: format!(
            "{:.2} ms ({} entries, {} KiB read)",
            ms(took),
            context.included,
            context.bytes_read / 1024
        ),
        value: json!({"ms": ms(took), "bytes_read": context.bytes_read}),
    });

    // 6. resume context when the newest entry is huge (an agent's 8 MiB reply): the read
    // joins each line once (it used to re-copy the line for every 64 KiB step back).
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
    for _ in 0..3 {
        let started = Instant::now();
        let mut file = std::fs::File::open(&big).unwrap();
        let context = supervisor::resume_context::build(&mut file, "next", 50_000).unwrap();
        samples.push(started.elapsed());
        assert_eq!(context.included, 101);
    }
    samples.sort();
    rows.push(Row {
        measure: "resume context, newest entry 8 MiB (min / median of 3)",
        target: "≤ 20 ms",
        result: format!("{:.2} / {:.2} ms", ms(samples[0]), ms(samples[1])),
        value: json!({"min_ms": ms(samples[0]), "median_ms": ms(samples[1])}),
    });

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
