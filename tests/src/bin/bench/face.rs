//! The section `face`: `supervisor acp` in front of `fast-agent`, driven by the
//! official SDK client (`sdk-baseline`), beside the same client driving `fast-agent`
//! directly, alternating in one run: relay throughput and the latency of a paced stream's
//! updates (p99); and a `session/load` through the face of a conversation of about 10,000
//! messages (history entries), from the request to its answer (the replay before it).

use super::{
    Daemon, Instant, LATENCY_CHUNKS, LATENCY_RATE, RELAY_CHUNKS, RUNS, Row, Value, fast_profile,
    json, leak, min_median, ms, sdk_driving, sdk_driving_on,
};
use std::path::Path;
use tether_tests::face::RawFace;

/// Rounds of the conversation the load reads: each an agent message and a tool call's two
/// entries, about 10,000 entries in all.
const LOAD_ROUNDS: u32 = 3_400;

pub(super) async fn face(rows: &mut Vec<Row>) {
    let daemon = Daemon::start_with_profiles(&[], &[("fast.toml", &fast_profile())]).await;
    let supervisor = tether_tests::target_dir().join("supervisor").into_os_string();
    let through_face: Vec<std::ffi::OsString> = vec![
        supervisor.clone(),
        "--url".into(),
        daemon.url.clone().into(),
        "acp".into(),
        "--agent".into(),
        "fast".into(),
    ];
    let direct = vec![tether_tests::target_dir().join("fast-agent").into_os_string()];
    if sdk_driving(10, None, &direct).is_none() {
        eprintln!("bench: face: sdk-baseline is not built (scripts/bench.sh builds it)");
        return;
    }
    let (mut direct_rates, mut face_rates) = (Vec::new(), Vec::new());
    let (mut direct_p99s, mut face_p99s) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let rate = |out: Value| out["msgs_per_s"].as_f64().expect("a rate");
        direct_rates.push(rate(sdk_driving(RELAY_CHUNKS, None, &direct).unwrap()));
        face_rates.push(rate(sdk_driving(RELAY_CHUNKS, None, &through_face).unwrap()));
        let p99 = |out: Value| out["latency_us"]["p99"].as_f64().expect("a p99") / 1000.0;
        direct_p99s.push(p99(sdk_driving(LATENCY_CHUNKS, Some(LATENCY_RATE), &direct).unwrap()));
        face_p99s
            .push(p99(sdk_driving(LATENCY_CHUNKS, Some(LATENCY_RATE), &through_face).unwrap()));
    }
    let (direct_min, direct_med) = min_median(&mut direct_rates);
    let (face_min, face_med) = min_median(&mut face_rates);
    rows.push(Row {
        measure: "relay through `supervisor acp` vs the SDK client driving fast-agent directly (msg/s, min / median)",
        target: "≥ 0.9×",
        result: format!(
            "{:.2}× ({face_min:.0} / {face_med:.0} vs {direct_min:.0} / {direct_med:.0} msg/s)",
            face_med / direct_med
        ),
        value: json!({"face": face_med, "direct": direct_med, "ratio": face_med / direct_med}),
    });
    pinned(rows, &daemon, &through_face, &direct);
    let (direct_min, direct_med) = min_median(&mut direct_p99s);
    let (face_min, face_med) = min_median(&mut face_p99s);
    rows.push(Row {
        measure: "an update's latency at 5,000/s through the face vs direct, p99 (min / median)",
        target: "≤ 2 ms extra",
        result: format!(
            "{:+.2} ms ({face_min:.2} / {face_med:.2} vs {direct_min:.2} / {direct_med:.2} ms)",
            face_med - direct_med
        ),
        value: json!({"face_p99_ms": face_med, "direct_p99_ms": direct_med}),
    });
    load(rows, &daemon, &supervisor).await;
}

/// The same relay with the SDK client on a CPU of its own and everything else (the face,
/// the daemon, agentctl and the agent; directly, the agent) on another, as a machine with
/// cores to spare places them: what the relay itself keeps up with, apart from the client
/// and Tether sharing two CPUs. A diagnostic beside the figure above, not its target.
fn pinned(
    rows: &mut Vec<Row>,
    daemon: &Daemon,
    through_face: &[std::ffi::OsString],
    direct: &[std::ffi::OsString],
) {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let pid = daemon.pid().expect("the daemon runs").to_string();
    let taskset = |args: &[&str]| {
        std::process::Command::new("taskset")
            .args(args)
            .output()
            .is_ok_and(|out| out.status.success())
    };
    if cpus < 2 || !taskset(&["-a", "-p", "-c", "1", &pid]) {
        eprintln!(
            "bench: face: no second CPU to pin to (or no taskset); the pinned runs are skipped"
        );
        return;
    }
    let on_cpu1 = |argv: &[std::ffi::OsString]| {
        let mut pinned: Vec<std::ffi::OsString> = vec!["taskset".into(), "-c".into(), "1".into()];
        pinned.extend(argv.iter().cloned());
        pinned
    };
    let (face_argv, direct_argv) = (on_cpu1(through_face), on_cpu1(direct));
    let (mut direct_rates, mut face_rates) = (Vec::new(), Vec::new());
    let rate = |out: Value| out["msgs_per_s"].as_f64().expect("a rate");
    for _ in 0..RUNS {
        direct_rates.push(rate(sdk_driving_on(Some(0), RELAY_CHUNKS, None, &direct_argv).unwrap()));
        face_rates.push(rate(sdk_driving_on(Some(0), RELAY_CHUNKS, None, &face_argv).unwrap()));
    }
    let every = format!("0-{}", cpus - 1);
    assert!(taskset(&["-a", "-p", "-c", &every, &pid]), "the daemon's CPUs restored");
    let (direct_min, direct_med) = min_median(&mut direct_rates);
    let (face_min, face_med) = min_median(&mut face_rates);
    rows.push(Row {
        measure: "  the same, the SDK client on CPU 0 and the face, daemon, agentctl and agent on CPU 1 (diagnostic)",
        target: "—",
        result: format!(
            "{:.2}× ({face_min:.0} / {face_med:.0} vs {direct_min:.0} / {direct_med:.0} msg/s)",
            face_med / direct_med
        ),
        value: json!({"face": face_med, "direct": direct_med, "ratio": face_med / direct_med}),
    });
}

/// A `session/load` through the face of a conversation of about 10,000 messages: the time
/// from the request to its answer, every replayed update read before it.
async fn load(rows: &mut Vec<Row>, daemon: &Daemon, supervisor: &std::ffi::OsStr) {
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("load")).await;
    api.ask(&session, &format!("/stream 1\n/rounds {LOAD_ROUNDS}\nthe end")).await;
    let entries = api.history(&session).await.len();
    let mut samples = Vec::new();
    for _ in 0..RUNS {
        let mut face =
            RawFace::spawn(Some(Path::new(supervisor)), &daemon.url, &["--agent", "mock"]);
        face.initialize().await;
        let load = json!({"sessionId": session, "cwd": daemon.workspace("load"), "mcpServers": []});
        let started = Instant::now();
        face.send(json!({"jsonrpc": "2.0", "id": 2, "method": "session/load", "params": load}))
            .await;
        let mut updates = 0;
        loop {
            let message = face.next().await;
            if message["id"] == 2 {
                assert!(message.get("result").is_some(), "{message}");
                break;
            }
            updates += 1;
        }
        samples.push(ms(started.elapsed()));
        assert_eq!(updates, entries, "one update per history entry");
        face.close().await;
    }
    let (min, med) = min_median(&mut samples);
    rows.push(Row {
        measure: leak(format!(
            "session/load through the face of a {entries}-message conversation (min / median)"
        )),
        target: "≤ 200 ms",
        result: format!("{min:.0} / {med:.0} ms"),
        value: json!({"entries": entries, "min_ms": min, "median_ms": med}),
    });
}
