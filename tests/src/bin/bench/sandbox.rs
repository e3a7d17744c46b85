//! The `sandbox` section: what confining an agent costs.
//! - Start: create → `WAITING_FOR_INPUT` of mock-agent in a workspace sandbox with an
//!   egress allowlist (bubblewrap, the proxy, the relay) beside the same agent unconfined,
//!   interleaved in the same run.
//! - Start on Docker: the same for mock-agent's container (a read-only root, the agent's
//!   network namespace made by agentctl, the relay), beside the same container unconfined.
//! - Relay: fast-agent's chunks through a confined agent (its output still goes agentctl →
//!   supervisor → WebSocket; the sandbox sits between agentctl and the agent's pipes)
//!   beside the same agent unconfined, same run.

use super::{
    Api, ApiClient, Create, Daemon, Instant, RELAY_CHUNKS, RUNS, Row, SessionState, fast_profile,
    is_state, json, min_median, ms, ok, percentile, tether_run, until,
};

/// Sessions started per profile and run.
const STARTS: usize = 20;

const CONFINED: &str =
    "[sandbox]\nfilesystem = \"workspace\"\nnetwork = \"allowlist\"\nallow = [\"127.0.0.1:9\"]\n";

/// Create → ready of a session of `profile`.
async fn start(api: &Api, profile: &str, workspace: &std::path::Path) -> (String, f64) {
    let task = ok("task.create", api.typed().task_create("bench".into(), None)).await;
    let started = Instant::now();
    let create = Create { shared: Some(true), ..Create::new(&task.id, profile, Some(workspace)) };
    let session = ok("task.session.create", create.send(api.typed())).await.id;
    let mut events = api.subscribe(&session, 0).await;
    until(&mut events, |event| is_state(event, SessionState::WaitingForInput)).await;
    (session, ms(started.elapsed()))
}

pub(super) async fn sandbox(rows: &mut Vec<Row>) {
    let bwrap = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .any(|dir| dir.join("bwrap").is_file());
    if !bwrap {
        eprintln!("bench: sandbox skipped: bubblewrap is not installed (scripts/setup.sh)");
        return;
    }
    let boxed =
        format!("id = \"boxed\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n{CONFINED}");
    let fast_boxed = fast_profile().replace("id = \"fast\"", "id = \"fast-boxed\"") + CONFINED;
    let profiles = [
        ("boxed.toml", boxed.as_str()),
        ("fast.toml", &fast_profile()),
        ("fast-boxed.toml", &fast_boxed),
    ];
    let daemon = Daemon::start_with_profiles(&[], &profiles).await;
    let api = daemon.api().await;
    let measure = "sandbox start overhead, create → ready, workspace + allowlist vs unconfined (p50 of 20; min / median of runs)";
    rows.push(compare_starts(&api, &daemon, ["mock", "boxed"], STARTS, measure).await);

    let open = api.ready_session("fast", &daemon.workspace("relay-open")).await;
    let confined = api.ready_session("fast-boxed", &daemon.workspace("relay-boxed")).await;
    let (mut open_rates, mut boxed_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let o = tether_run(&api, &open, RELAY_CHUNKS, None).await.0;
        let b = tether_run(&api, &confined, RELAY_CHUNKS, None).await.0;
        open_rates.push(o);
        boxed_rates.push(b);
        ratios.push(b / o);
    }
    let (open_min, open_med) = min_median(&mut open_rates);
    let (boxed_min, boxed_med) = min_median(&mut boxed_rates);
    let (ratio_min, ratio_med) = min_median(&mut ratios);
    rows.push(Row {
        measure: "relay through a confined agent vs unconfined, fast-agent (min / median)",
        target: "nothing measurable (≈ 1.0×)",
        result: format!(
            "confined {boxed_min:.0} / {boxed_med:.0} msg/s, unconfined {open_min:.0} / {open_med:.0} msg/s; ratio {ratio_min:.2} / {ratio_med:.2}×"
        ),
        value: json!({"confined": [boxed_min, boxed_med], "unconfined": [open_min, open_med], "ratio": [ratio_min, ratio_med]}),
    });
    ok("sessions.stop_all", api.typed().stop_all()).await;
    docker_start(rows).await;
}

/// Create → ready of `[unconfined, confined]` profiles, `count` of each per run,
/// interleaved, each session stopped once measured (an engine takes 16 at a time): the
/// overhead's row.
async fn compare_starts(
    api: &Api,
    daemon: &Daemon,
    profiles: [&str; 2],
    count: usize,
    measure: &'static str,
) -> Row {
    let (mut open_p50, mut boxed_p50, mut overhead) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..RUNS {
        let mut samples = [Vec::new(), Vec::new()];
        for n in 0..count {
            for (profile, samples) in profiles.iter().zip(samples.iter_mut()) {
                let workspace = daemon.workspace(&format!("{profile}-{run}-{n}"));
                let (session, took) = start(api, profile, &workspace).await;
                samples.push(std::time::Duration::from_secs_f64(took / 1000.0));
                ok("task.session.stop", api.typed().session_stop(session)).await;
            }
        }
        let [open, confined] = &mut samples;
        let (o, b) = (ms(percentile(open, 0.5)), ms(percentile(confined, 0.5)));
        open_p50.push(o);
        boxed_p50.push(b);
        overhead.push(b - o);
    }
    let (open_min, open_med) = min_median(&mut open_p50);
    let (boxed_min, boxed_med) = min_median(&mut boxed_p50);
    let (over_min, over_med) = min_median(&mut overhead);
    Row {
        measure,
        target: "≤ 20 ms added to a cold start",
        result: format!(
            "{over_min:+.1} / {over_med:+.1} ms (confined {boxed_min:.1} / {boxed_med:.1} ms, unconfined {open_min:.1} / {open_med:.1} ms)"
        ),
        value: json!({"overhead_ms": [over_min, over_med], "confined_ms": [boxed_min, boxed_med], "unconfined_ms": [open_min, open_med]}),
    }
}

/// Create → ready on Docker, confined beside unconfined, interleaved.
async fn docker_start(rows: &mut Vec<Row>) {
    const DOCKER_STARTS: usize = 10;
    let measure = "sandbox start overhead on Docker, create → ready, workspace + allowlist vs unconfined (p50 of 10; min / median of runs)";
    let Some(docker) = tether_tests::docker::engine().await else {
        let result = "not measured: no Docker engine".into();
        rows.push(Row { measure, target: "≤ 20 ms added", result, value: json!(null) });
        return;
    };
    let tag = format!("tether-bench-mock:{}", uuid::Uuid::new_v4().simple());
    tether_tests::docker::build_mock_image(&docker, &tag).await;
    let agentctl = tether_tests::docker::static_binary("TETHER_STATIC_AGENTCTL", "agentctl");
    let open = format!(
        "id = \"open-docker\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n\
         runtime = \"docker\"\n[docker]\nimage = \"{tag}\"\nmemory_mb = 64\ncpus = 0.5\n"
    );
    let boxed = open.replace("open-docker", "boxed-docker") + CONFINED;
    let profiles = [("open.toml", open.as_str()), ("boxed.toml", boxed.as_str())];
    let args = ["--static-agentctl", agentctl.to_str().unwrap()];
    let daemon = Daemon::start_with_env(&args, &profiles, &[]).await;
    let _cleanup = tether_tests::docker::Cleanup {
        label: format!("tether.install_id={}", daemon.install_id),
        image: Some(tag),
    };
    let api = daemon.api().await;
    let profiles = ["open-docker", "boxed-docker"];
    rows.push(compare_starts(&api, &daemon, profiles, DOCKER_STARTS, measure).await);
}
