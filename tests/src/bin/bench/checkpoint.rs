//! The `checkpoint` section: what sessions that outlive their host cost.
//! - A turn's checkpoint: a 200 MB workspace (200 files of 1 MiB, incompressible, not a
//!   repository) checkpointed once, then 1 MiB of it changed and checkpointed again, as
//!   each turn's end does (the time is off the turn's path: the next turn waits for it at
//!   most `wait_ms`); time and the bytes it added to the session's repository.
//! - A move: `engines.drain` of the engine a live, idle session runs on → the session
//!   ready on the other engine (the setup's two engines), back and forth.
//! - A copied workspace (`workspace = "copy"`): the same 200 MB copied into the engine's
//!   volume as the session starts, then each turn's checkpoint fetched from the container
//!   (Docker's archive of the whole directory, the supervisor's copy brought in step).

use super::{
    ApiClient, Create, Daemon, Instant, RUNS, Row, SessionState, is_state, json, min_median, ms,
    ok, until,
};

/// Files of the workspace, 1 MiB each.
const FILES: usize = 200;
const MIB: usize = 1024 * 1024;

/// `len` bytes no compressor shrinks (xorshift; each seed its own bytes).
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(2).wrapping_add(1);
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 32) as u8
        })
        .collect()
}

pub(super) async fn checkpoint(rows: &mut Vec<Row>) {
    use supervisor::checkpoint::{Limits, git::Repo};
    let dir = tempfile::tempdir().expect("a temp dir");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    for n in 0..FILES {
        std::fs::write(work.join(format!("f{n:03}.bin")), noise(MIB, n as u64 + 1)).unwrap();
    }
    let limits = Limits::default();
    let (mut times, mut added, mut firsts) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..RUNS {
        let repo = Repo::open(&dir.path().join(format!("repo-{run}.git"))).await.unwrap();
        let started = Instant::now();
        let first = repo.commit(&work, &limits, None, "first").await.unwrap();
        firsts.push(ms(started.elapsed()));
        // One turn changed 1 MiB: a file rewritten.
        std::fs::write(work.join(format!("f{run:03}.bin")), noise(MIB, 1000 + run as u64)).unwrap();
        let started = Instant::now();
        let next = repo.commit(&work, &limits, Some(&first.commit), "turn").await.unwrap();
        times.push(ms(started.elapsed()));
        added.push(next.added_bytes as f64 / MIB as f64);
    }
    let (first_min, first_med) = min_median(&mut firsts);
    let (min, med) = min_median(&mut times);
    let (added_min, added_med) = min_median(&mut added);
    rows.push(Row {
        measure: "checkpoint of a turn that changed 1 MiB of a 200 MB workspace (min / median)",
        target: "≤ 50 ms, off the turn's path",
        result: format!(
            "{min:.1} / {med:.1} ms, {added_min:.2} / {added_med:.2} MiB added (the first checkpoint of the 200 MB: {first_min:.0} / {first_med:.0} ms)"
        ),
        value: json!({"ms": [min, med], "added_mib": [added_min, added_med], "first_ms": [first_min, first_med]}),
    });
    move_time(rows).await;
    copied_time(rows, &work).await;
}

/// A session in a copy of `work` on the local engine: its start (the copy going in), and
/// each turn's end → its checkpoint (the copy coming back).
async fn copied_time(rows: &mut Vec<Row>, work: &std::path::Path) {
    let measure = "a copied 200 MB workspace: the session's start (copied in), then a turn's end → its checkpoint (fetched from the container) (min / median)";
    let Some(docker) = tether_tests::docker::engine().await else {
        return not_measured(rows, measure);
    };
    let tag = format!("tether-bench-mock:{}", uuid::Uuid::new_v4().simple());
    tether_tests::docker::build_mock_image(&docker, &tag).await;
    let agentctl = tether_tests::docker::static_binary("TETHER_STATIC_AGENTCTL", "agentctl");
    let profile = format!(
        "id = \"mock-docker\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n\
         runtime = \"docker\"\n[docker]\nimage = \"{tag}\"\nmemory_mb = 256\ncpus = 1.0\n"
    );
    let config = format!(
        "static_agentctl = \"{}\"\n[checkpoints]\nmax_file_bytes = 2097152\n\n[[docker.engines]]\nname = \"a\"\nhost = \"unix:///var/run/docker.sock\"\nworkspace = \"copy\"\n",
        agentctl.display()
    );
    let daemon = with_config(&profile, &config).await;
    let label = format!("tether.install_id={}", daemon.install_id);
    let _cleanup = tether_tests::docker::Cleanup { label, image: Some(tag) };
    let api = daemon.api().await;
    let task = ok("task.create", api.typed().task_create("bench".into(), None)).await;
    let started = Instant::now();
    let create = Create::new(&task.id, "mock-docker", Some(work));
    let session = ok("task.session.create", create.send(api.typed())).await.id;
    let mut events = api.subscribe(&session, 0).await;
    until(&mut events, |event| is_state(event, SessionState::WaitingForInput)).await;
    let start_ms = ms(started.elapsed());
    let mut times = Vec::new();
    for run in 0..=RUNS {
        let path = work.join(format!("turn-{run}.txt"));
        api.prompt(&session, &format!("/write {} turn {run}", path.display()))
            .await
            .expect("prompt");
        until(&mut events, |event| matches!(event.kind, super::EventKind::TurnEnded { .. })).await;
        let ended = Instant::now();
        until(&mut events, |event| matches!(event.kind, super::EventKind::CheckpointTaken { .. }))
            .await;
        // The first fetch writes the whole copy; the others are what every turn costs.
        if run > 0 {
            times.push(ms(ended.elapsed()));
        }
    }
    ok("sessions.stop_all", api.typed().stop_all()).await;
    let (min, med) = min_median(&mut times);
    rows.push(Row {
        measure,
        target: "(measured)",
        result: format!("start {start_ms:.0} ms; checkpoint {min:.0} / {med:.0} ms"),
        value: json!({"start_ms": start_ms, "checkpoint_ms": [min, med]}),
    });
}

/// Drain → ready elsewhere, on the setup's two engines.
async fn move_time(rows: &mut Vec<Row>) {
    let measure = "a move, engines.drain → the session ready on the other engine (min / median)";
    let Some(docker) = tether_tests::docker::engine().await else {
        return not_measured(rows, measure);
    };
    let Some((second_client, second)) = tether_tests::docker::second_engine().await else {
        return not_measured(rows, measure);
    };
    let tag = format!("tether-bench-mock:{}", uuid::Uuid::new_v4().simple());
    tether_tests::docker::build_mock_image(&docker, &tag).await;
    tether_tests::docker::build_mock_image(&second_client, &tag).await;
    let agentctl = tether_tests::docker::static_binary("TETHER_STATIC_AGENTCTL", "agentctl");
    let profile = format!(
        "id = \"mock-docker\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n\
         runtime = \"docker\"\n[docker]\nimage = \"{tag}\"\nmemory_mb = 64\ncpus = 0.5\n"
    );
    let config = format!(
        "static_agentctl = \"{}\"\n[[docker.engines]]\nname = \"a\"\nhost = \"unix:///var/run/docker.sock\"\n\n\
         [[docker.engines]]\nname = \"b\"\nhost = \"{second}\"\n",
        agentctl.display()
    );
    let daemon = with_config(&profile, &config).await;
    let label = format!("tether.install_id={}", daemon.install_id);
    let _cleanup = tether_tests::docker::Cleanup { label: label.clone(), image: Some(tag.clone()) };
    let _cleanup_second =
        tether_tests::docker::CleanupWith { docker: second_client, label, image: Some(tag) };
    let api = daemon.api().await;
    let task = ok("task.create", api.typed().task_create("bench".into(), None)).await;
    let create = Create::new(&task.id, "mock-docker", Some(&daemon.workspace("moving")));
    let session = ok("task.session.create", create.send(api.typed())).await.id;
    let mut events = api.subscribe(&session, 0).await;
    until(&mut events, |event| is_state(event, SessionState::WaitingForInput)).await;
    let mut times = Vec::new();
    for _ in 0..RUNS {
        let from = api.status(&session).await.placement.unwrap_or_default();
        let to = if from == "a" { "b" } else { "a" };
        ok("undrain", api.typed().engines_undrain(to.into())).await;
        let started = Instant::now();
        ok("drain", api.typed().engines_drain(from.clone(), None)).await;
        until(&mut events, |event| is_state(event, SessionState::Paused)).await;
        until(&mut events, |event| is_state(event, SessionState::WaitingForInput)).await;
        times.push(ms(started.elapsed()));
    }
    ok("sessions.stop_all", api.typed().stop_all()).await;
    let (min, med) = min_median(&mut times);
    rows.push(Row {
        measure,
        target: "(measured)",
        result: format!("{min:.0} / {med:.0} ms"),
        value: json!({"ms": [min, med]}),
    });
}

/// A daemon with the `mock-docker` profile and this `config.toml`.
async fn with_config(profile: &str, config: &str) -> Daemon {
    let (daemon, ()) = Daemon::start_prepared(&[], &[("mock-docker.toml", profile)], &[], |root| {
        std::fs::create_dir_all(root.join("tether")).unwrap();
        std::fs::write(root.join("tether/config.toml"), config).unwrap();
    })
    .await;
    daemon
}

fn not_measured(rows: &mut Vec<Row>, measure: &'static str) {
    rows.push(Row {
        measure,
        target: "(measured)",
        result: "not measured: two Docker engines are needed (scripts/setup.sh)".into(),
        value: serde_json::Value::Null,
    });
}
