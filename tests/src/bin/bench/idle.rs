//! The idle, warm-start and usage sections:
//! - `idle`: sessions per GB — 1,000 sessions of a mock-agent holding 100 MB, 20 active at a
//!   time, parked after 1 s idle, beside the same sessions never parked (measured on 20 and
//!   scaled to 1,000: a thousand 100 MB agents do not fit this machine); memory is the PSS
//!   of the daemon, its sidecars and agents; and a parked session's wake-up beside the
//!   agent's own restore (a process started by hand: `initialize` + `session/load`).
//! - `warm`: create → ready from a warm pool beside cold, mock-agent and the real agents
//!   installed here (against the scripted model server), same run.
//! - `usage`: the relay with usage reports (a `usage_update` every 100 chunks and tokens per
//!   turn, all accounted) beside the relay without, same run.

use super::{
    Api, ApiClient, Create, Daemon, Duration, EventKind, Instant, RELAY_CHUNKS, RUNS, Row,
    SessionState, Value, fast_profile, is_state, json, leak, min_median, ms, ok, percentile,
    spawn_piped, tether_run, turn_ended, until,
};
use protocol::api::{SessionsEvent, UsageGroupBy};
use tether_tests::daemon::await_log;

/// Sessions in the sessions-per-GB run, how many are active at a time, and each agent's
/// size.
const SESSIONS: usize = 1000;
const ACTIVE: usize = 20;
const BALLAST_MB: u32 = 100;

/// Runs of each stream in the usage section.
const USAGE_RUNS: usize = 9;

/// The proportional set size (KiB) of `pid`, 0 when it is gone.
fn pss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|line| line.starts_with("Pss:"))?.to_owned();
            line.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

/// PSS (MiB) of the daemon and every process of its test root (sidecars, agents).
fn total_pss_mib(daemon: &Daemon) -> f64 {
    let mut pids = Daemon::processes_mentioning(daemon.home());
    pids.extend(daemon.pid());
    pids.sort_unstable();
    pids.dedup();
    pids.into_iter().map(pss_kib).sum::<u64>() as f64 / 1024.0
}

fn ballast_profile(id: &str, idle_secs: u64) -> String {
    format!(
        "id = \"{id}\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{{home}}/.mock-agent\", \"--ballast-mb\", \"{BALLAST_MB}\"]\n\
         protocol = \"acp\"\n[session]\nagent_state_dirs = [\".mock-agent\"]\nidle_timeout_secs = {idle_secs}\n"
    )
}

/// Creates `n` sessions of `profile` at once and runs a turn in each; their ids.
async fn active_batch(
    api: &Api,
    daemon: &Daemon,
    profile: &str,
    n: usize,
    tag: &str,
) -> Vec<String> {
    let task = ok("task.create", api.typed().task_create("bench".into(), None)).await;
    let creates = (0..n).map(|i| {
        let workspace = daemon.workspace(&format!("{tag}-{i}"));
        let create =
            Create { shared: Some(true), ..Create::new(&task.id, profile, Some(&workspace)) };
        async move { ok("task.session.create", create.send(api.typed())).await.id }
    });
    let sessions = futures_util::future::join_all(creates).await;
    futures_util::future::join_all(sessions.iter().map(|session| api.ask(session, "work"))).await;
    sessions
}

pub(super) async fn idle(rows: &mut Vec<Row>) {
    let profiles =
        [("parked.toml", ballast_profile("parked", 1)), ("kept.toml", ballast_profile("kept", 0))];
    let profiles: Vec<(&str, &str)> = profiles.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let daemon = Daemon::start_with_profiles(&[], &profiles).await;
    let api = daemon.api().await;
    let idle_daemon = total_pss_mib(&daemon);
    // Never parked: ACTIVE sessions alive, scaled to SESSIONS.
    let kept = active_batch(&api, &daemon, "kept", ACTIVE, "kept").await;
    let kept_mib = total_pss_mib(&daemon);
    let per_session = (kept_mib - idle_daemon) / ACTIVE as f64;
    let without = idle_daemon + per_session * SESSIONS as f64;
    ok("stop_all", api.typed().stop_all()).await;
    drop(kept);
    // Parked after 1 s: SESSIONS sessions in rounds of ACTIVE, each round's turns at once.
    let mut changes = api.typed().sessions_subscribe().await.expect("sessions.subscribe");
    let mut sessions = Vec::new();
    let started = Instant::now();
    for round in 0..SESSIONS / ACTIVE {
        if round % 10 == 0 {
            eprintln!("bench: idle: {} of {SESSIONS} sessions", round * ACTIVE);
        }
        sessions.extend(active_batch(&api, &daemon, "parked", ACTIVE, &format!("p{round}")).await);
    }
    let mut parked = std::collections::HashSet::new();
    while parked.len() < SESSIONS {
        let event = tether_tests::within("a session parked", changes.next())
            .await
            .expect("the subscription is open")
            .expect("the event parses");
        if let SessionsEvent::Changed { session } = event
            && session.state == SessionState::Paused
        {
            parked.insert(session.id);
        }
    }
    let all_parked = total_pss_mib(&daemon);
    let filled = started.elapsed();
    // ACTIVE of them woken (a turn each) while the rest stay parked.
    let woken = &sessions[..ACTIVE];
    futures_util::future::join_all(woken.iter().map(|session| api.ask(session, "again"))).await;
    let with_active = total_pss_mib(&daemon);
    let ratio = without / with_active;
    rows.push(Row {
        measure: leak(format!(
            "sessions per GB: {SESSIONS} sessions of a {BALLAST_MB} MB agent, {ACTIVE} active, parked after 1 s idle (PSS of daemon, sidecars, agents)"
        )),
        target: "≥ 20× fewer MB than without eviction",
        result: format!(
            "{with_active:.0} MiB with {ACTIVE} active ({all_parked:.0} MiB all parked) vs {without:.0} MiB never parked: {ratio:.1}× fewer ({:.0} sessions per GB; filled in {:.0} s)",
            SESSIONS as f64 * 1024.0 / with_active,
            filled.as_secs_f64()
        ),
        value: json!({"with_eviction_mib": with_active, "all_parked_mib": all_parked,
            "without_eviction_mib": without, "ratio": ratio}),
    });
    rows.push(Row {
        measure: "  baseline: never parked (measured on 20 sessions, scaled to 1,000)",
        target: "—",
        result: format!(
            "{per_session:.1} MiB a session (daemon alone {idle_daemon:.0} MiB; {ACTIVE} sessions {kept_mib:.0} MiB)"
        ),
        value: json!({"per_session_mib": per_session, "daemon_mib": idle_daemon}),
    });
    wake(rows, &daemon, &api, &sessions[ACTIVE..]).await;
}

/// Wake-ups of parked sessions (`task.session.resume` until ready) beside the agent's own
/// restore: the same mock-agent started by hand, `initialize` and `session/load`.
async fn wake(rows: &mut Vec<Row>, daemon: &Daemon, api: &Api, parked: &[String]) {
    let (mut ours, mut own) = (Vec::new(), Vec::new());
    for run in 0..RUNS {
        let (mut wake_samples, mut own_samples) = (Vec::new(), Vec::new());
        for session in &parked[run * 20..run * 20 + 20] {
            let token = api.status(session).await.acp_session_id.expect("a resume token");
            own_samples.push(own_restore(daemon, &token).await);
            let started = Instant::now();
            api.resume(session).await.expect("resume");
            wake_samples.push(started.elapsed());
        }
        ours.push(ms(percentile(&mut wake_samples, 0.5)));
        own.push(ms(percentile(&mut own_samples, 0.5)));
    }
    let (our_min, our_med) = min_median(&mut ours);
    let (own_min, own_med) = min_median(&mut own);
    rows.push(Row {
        measure: "wake-up of a parked session: resume until ready (p50; min / median of 3 runs of 20)",
        target: "p50 ≤ 50 ms above the agent's own restore",
        result: format!(
            "{our_min:.1} / {our_med:.1} ms; the agent's own restore {own_min:.1} / {own_med:.1} ms: {:.1} ms above it",
            our_med - own_med
        ),
        value: json!({"wake_p50_ms": our_med, "own_restore_p50_ms": own_med, "above_ms": our_med - own_med}),
    });
}

/// The agent restoring `acp_session` by itself: mock-agent (same flags, same state) started
/// by hand, `initialize`, `session/load` answered.
async fn own_restore(daemon: &Daemon, acp_session: &str) -> Duration {
    use tokio::io::AsyncWriteExt;
    let state = daemon.home().join(".mock-agent");
    let started = Instant::now();
    let ballast = BALLAST_MB.to_string();
    let args = ["--state-dir", state.to_str().unwrap(), "--ballast-mb", &ballast];
    let (mut child, mut stdin, mut lines) = spawn_piped("mock-agent", &args);
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": 1, "clientCapabilities": {}}});
    let load = json!({"jsonrpc": "2.0", "id": 2, "method": "session/load",
        "params": {"sessionId": acp_session, "cwd": daemon.home(), "mcpServers": []}});
    stdin.write_all(format!("{initialize}\n{load}\n").as_bytes()).await.unwrap();
    while let Some(line) = lines.next_line().await.unwrap() {
        let message: Value = serde_json::from_str(&line).unwrap();
        if message["id"] == json!(2) {
            assert!(message.get("result").is_some(), "the load worked: {message}");
            break;
        }
    }
    let took = started.elapsed();
    drop(stdin);
    let _ = child.wait().await;
    took
}

/// `(id, profile text, setup)` of a pooled agent: the warm profile `<id>-warm` beside it.
fn pooled(id: &str, profile: &str) -> [(String, String); 2] {
    let warm = profile.replacen(&format!("id = \"{id}\""), &format!("id = \"{id}-warm\""), 1)
        + "\n[pool]\nwarm = 1\n";
    [(format!("{id}.toml"), profile.to_owned()), (format!("{id}-warm.toml"), warm)]
}

pub(super) async fn warm(rows: &mut Vec<Row>) {
    let mock = "id = \"mock\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{home}/.mock-agent\"]\nprotocol = \"acp\"\n";
    warm_agent(rows, "mock-agent", "mock", mock, 20, None).await;
    let server = tether_tests::model_server::ModelServer::start().await;
    use tether_tests::real_agents as real;
    let agents = [
        ("claude", "claude", real::claude_profile(&server.url, None, "")),
        ("codex", "codex-here", real::codex_scripted_profile(&server.url, None)),
        ("gemini", "gemini-here", real::gemini_profile(Some(&server.url), None)),
        ("opencode", "opencode", real::opencode_profile()),
    ];
    for (name, id, profile) in agents {
        match profile {
            Some(profile) => {
                let config = (name == "opencode").then(|| real::opencode_config(&server.url));
                warm_agent(rows, name, id, &profile, 5, config).await;
            }
            None => eprintln!("bench: warm: {name} is not installed (scripts/setup.sh)"),
        }
    }
}

/// create → ready of `id` cold, then of `<id>-warm` from its pool (each create waits for
/// the refill first), `samples` each, min / median of the p50s of [`RUNS`] runs.
async fn warm_agent(
    rows: &mut Vec<Row>,
    name: &str,
    id: &str,
    profile: &str,
    samples: usize,
    workspace_file: Option<String>,
) {
    let files = pooled(id, profile);
    let files: Vec<(&str, &str)> = files.iter().map(|(n, t)| (n.as_str(), t.as_str())).collect();
    let log = ("TETHER_LOG", "warn,supervisor::service=info,supervisor::pool=info");
    let daemon = Daemon::start_with_env(&[], &files, &[log]).await;
    let mut lines = daemon.log_from_start();
    tether_tests::real_agents::gemini_settings(daemon.home());
    let api = daemon.api().await;
    let warm_id = format!("{id}-warm");
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    await_log(&mut lines, &format!("a warm agent of {warm_id} is ready (1 of 1)")).await;
    for run in 0..RUNS {
        let (mut cold_samples, mut warm_samples) = (Vec::new(), Vec::new());
        for n in 0..samples {
            let workspace = daemon.workspace(&format!("{run}-{n}"));
            if let Some(text) = &workspace_file {
                std::fs::write(workspace.join("opencode.json"), text).unwrap();
            }
            cold_samples.push(create_profile_ready(&api, id, &workspace).await);
            warm_samples.push(create_profile_ready(&api, &warm_id, &workspace).await);
            await_log(&mut lines, &format!("a warm agent of {warm_id} is ready (1 of 1)")).await;
            ok("stop_all", api.typed().stop_all()).await;
        }
        cold.push(ms(percentile(&mut cold_samples, 0.5)));
        warm.push(ms(percentile(&mut warm_samples, 0.5)));
    }
    let (cold_min, cold_med) = min_median(&mut cold);
    let (warm_min, warm_med) = min_median(&mut warm);
    rows.push(Row {
        measure: leak(format!(
            "create → ready, {name}: from a warm pool vs cold (p50 of {samples}; min / median of {RUNS} runs)"
        )),
        target: if name == "mock-agent" { "≤ 3 ms p50 warm" } else { "≤ 100 ms p50 warm" },
        result: format!(
            "warm {warm_min:.1} / {warm_med:.1} ms; cold {cold_min:.1} / {cold_med:.1} ms ({:.0}× faster)",
            cold_med / warm_med
        ),
        value: json!({"warm_p50_ms": warm_med, "cold_p50_ms": cold_med}),
    });
}

async fn create_profile_ready(api: &Api, profile: &str, workspace: &std::path::Path) -> Duration {
    let task = ok("task.create", api.typed().task_create("bench".into(), None)).await;
    let create = Create { shared: Some(true), ..Create::new(&task.id, profile, Some(workspace)) };
    let started = Instant::now();
    let session = ok("task.session.create", create.send(api.typed())).await.id;
    let mut events = api.subscribe(&session, 0).await;
    until(&mut events, |e| is_state(e, SessionState::WaitingForInput)).await;
    started.elapsed()
}

pub(super) async fn usage(rows: &mut Vec<Row>) {
    let daemon = Daemon::start_with_profiles(&[], &[("fast.toml", &fast_profile())]).await;
    let api = daemon.api().await;
    let session = api.ready_session("fast", &daemon.workspace("usage")).await;
    let (mut plain, mut planned, mut metered) = (Vec::new(), Vec::new(), Vec::new());
    // More runs than elsewhere, in alternating order: the difference sought is small
    // beside the run-to-run spread.
    for run in 0..USAGE_RUNS {
        plain.push(tether_run(&api, &session, RELAY_CHUNKS, None).await.0);
        if run % 2 == 0 {
            planned.push(metered_run(&api, &session, "+plan").await);
            metered.push(metered_run(&api, &session, "+usage").await);
        } else {
            metered.push(metered_run(&api, &session, "+usage").await);
            planned.push(metered_run(&api, &session, "+plan").await);
        }
    }
    let (plain_min, plain_med) = min_median(&mut plain);
    let (planned_min, planned_med) = min_median(&mut planned);
    let (metered_min, metered_med) = min_median(&mut metered);
    let report = api.typed().usage_query(
        Some(session),
        None,
        None,
        None,
        None,
        None,
        Some(UsageGroupBy::Day),
    );
    let report = ok("usage.query", report).await;
    let cost: f64 = report.total.cost.iter().map(|cost| cost.amount).sum();
    let change = (metered_med / planned_med - 1.0) * 100.0;
    rows.push(Row {
        measure: "relay with usage accounted (a usage_update every 100 chunks, tokens per turn) vs the same stream unaccounted (a plan update instead; min / median)",
        target: "≤ 1 % slower",
        result: format!(
            "{metered_min:.0} / {metered_med:.0} msg/s vs {planned_min:.0} / {planned_med:.0}: {change:+.2} % (medians); {} tokens, {cost:.2} USD accounted",
            report.total.total_tokens
        ),
        value: json!({"metered_median": metered_med, "unaccounted_median": planned_med,
            "change_percent": change}),
    });
    rows.push(Row {
        measure: "  baseline: the relay with no update between chunks (min / median)",
        target: "—",
        result: format!("{plain_min:.0} / {plain_med:.0} msg/s"),
        value: json!({"min": plain_min, "median": plain_med}),
    });
}

/// A relay run of `fast-agent` with an update every 100 chunks (`extra`: `+usage` or
/// `+plan`): chunks a second.
async fn metered_run(api: &Api, session: &str, extra: &str) -> f64 {
    let after = api.status(session).await.last_event_seq;
    let mut batches = api.subscribe_batches(session, after).await;
    let started = Instant::now();
    api.prompt(session, &format!("/stream {RELAY_CHUNKS} {extra}")).await.unwrap();
    let mut count = 0u64;
    'read: loop {
        let batch = tether_tests::within("a batch of events", batches.next())
            .await
            .expect("the subscription is open")
            .expect("the batch parses")
            .0;
        for event in batch {
            match &event.kind {
                EventKind::AgentMessageChunk { .. } => count += 1,
                _ if turn_ended(&event) => break 'read,
                _ => {}
            }
        }
    }
    assert_eq!(count, RELAY_CHUNKS, "every chunk once");
    count as f64 / started.elapsed().as_secs_f64()
}
