//! Many Docker engines: sessions placed across two real engines by label and by
//! load, re-attached on both after a supervisor SIGKILL, orphans removed from both at
//! start, and an engine that goes away making only its own sessions
//! `runtime_unavailable` until it is back, when they resume there.
//!
//! The second engine is the test's own `dockerd` (with its own data root, exec root and
//! bridge), so the test can stop it and start it again without disturbing other tests. It
//! is reached as a remote engine is: over TCP with TLS client certificates
//! (`dockerd --tlsverify`), its sidecars' control channels are TLS too, and nothing of the
//! supervisor's host but the workspace is mounted there (`storage = "volumes"`: agentctl
//! is copied in, the session's state lives in volumes on that engine).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use bollard::Docker;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{CreateContainerOptions, InspectContainerOptions};
use protocol::api::{ApiClient, SessionState};
use protocol::errors::ErrorKind;
use tether_tests::daemon::{Api, Create, Daemon, ok, settled};
use tether_tests::docker::{
    Cleanup, CleanupWith, PrivateEngine, build_mock_image, engine, static_binary,
};
use tether_tests::within;

fn docker_profile(image: &str) -> String {
    format!(
        "id = \"mock-docker\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{{home}}/.mock-agent\"]\nprotocol = \"acp\"\n\
         runtime = \"docker\"\n[session]\nnative_resume = true\nhistory_injection = true\nagent_state_dirs = [\".mock-agent\"]\n\
         [docker]\nimage = \"{image}\"\nmemory_mb = 256\ncpus = 1.0\n"
    )
}

/// A daemon whose config lists `engines` (TOML), with the test image built on the local
/// engine (the tag is returned; build it on the others too) and the static agentctl named;
/// what it leaves on the local engine is removed when the [`Cleanup`] drops.
async fn daemon_with_engines(local: &Docker, engines: &str) -> (Daemon, Cleanup, String) {
    daemon_with_engines_env(local, engines, &[]).await
}

/// [`daemon_with_engines`], the daemon run with `env`.
async fn daemon_with_engines_env(
    local: &Docker,
    engines: &str,
    env: &[(&str, &str)],
) -> (Daemon, Cleanup, String) {
    let tag = format!("tether-test-mock:{}", uuid::Uuid::new_v4().simple());
    build_mock_image(local, &tag).await;
    let agentctl = static_binary("TETHER_STATIC_AGENTCTL", "agentctl");
    let config = format!("static_agentctl = \"{}\"\n\n{engines}", agentctl.display());
    let (daemon, ()) =
        Daemon::start_prepared(&[], &[("mock-docker.toml", &docker_profile(&tag))], env, |root| {
            std::fs::create_dir_all(root.join("tether")).unwrap();
            std::fs::write(root.join("tether/config.toml"), &config).unwrap();
        })
        .await;
    let label = format!("tether.install_id={}", daemon.install_id);
    let cleanup = Cleanup { label, image: Some(tag.clone()) };
    (daemon, cleanup, tag)
}

/// Creates a task and a session of it placed by `labels`.
async fn create_placed(api: &Api, workspace: &Path, labels: &[(&str, &str)]) -> String {
    let task = ok("task.create", api.typed().task_create("placed".into(), None)).await;
    let labels: BTreeMap<String, String> =
        labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let create = Create {
        labels: (!labels.is_empty()).then_some(labels),
        ..Create::new(&task.id, "mock-docker", Some(workspace))
    };
    ok("task.session.create", create.send(api.typed())).await.id
}

/// Creates a session placed by `labels` and waits until it is `WAITING_FOR_INPUT`.
async fn placed_session(api: &Api, workspace: &Path, labels: &[(&str, &str)]) -> String {
    let session = create_placed(api, workspace, labels).await;
    let mut events = api.subscribe(&session, 0).await;
    match settled(&mut events).await {
        (SessionState::WaitingForInput, _) => session,
        (state, error) => panic!("the session settled {state}: {error}"),
    }
}

/// Creates a session placed by `labels` that no engine can take: its launch fails, and it
/// is `FAILED` (resumable, should such an engine come). Returns the session and the error.
async fn unplaceable_session(
    api: &Api,
    workspace: &Path,
    labels: &[(&str, &str)],
) -> (String, String) {
    let session = create_placed(api, workspace, labels).await;
    let mut events = api.subscribe(&session, 0).await;
    let (state, error) = settled(&mut events).await;
    assert_eq!(state, SessionState::Failed, "{error}");
    let status = api.status(&session).await;
    assert!(status.is_resumable && status.needs_resume, "{status:?}");
    (session, error)
}

async fn container_on(docker: &Docker, session: &str) -> Option<String> {
    let name = format!("tether-{session}");
    docker.inspect_container(&name, None::<InspectContainerOptions>).await.ok()?.id
}

/// A container of ours (this daemon's install id) whose session was never stored.
async fn make_orphan(docker: &Docker, install_id: &str, image: &str) -> String {
    let unknown = uuid::Uuid::now_v7().to_string();
    let labels = HashMap::from([
        ("tether.managed".to_owned(), "true".to_owned()),
        ("tether.session_id".to_owned(), unknown.clone()),
        ("tether.install_id".to_owned(), install_id.to_owned()),
    ]);
    let body = ContainerCreateBody {
        image: Some(image.to_owned()),
        cmd: Some(vec!["mock-agent".into()]),
        labels: Some(labels),
        ..Default::default()
    };
    let options =
        CreateContainerOptions { name: Some(format!("tether-{unknown}")), ..Default::default() };
    docker.create_container(Some(options), body).await.unwrap().id
}

#[tokio::test]
async fn sessions_spread_over_two_engines_and_one_engine_going_away_stops_only_its_own() {
    let Some(local) = engine().await else { return };
    let Some(mut other_engine) = PrivateEngine::start_tls().await else { return };
    let tls = other_engine.client_tls().expect("a TLS engine");
    let other = other_engine.client();
    let engines = format!(
        "[[docker.engines]]\nname = \"local\"\nhost = \"unix:///var/run/docker.sock\"\nlabels = {{ zone = \"a\" }}\ncapacity = 3\n\n\
         [[docker.engines]]\nname = \"other\"\nhost = \"{}\"\nlabels = {{ zone = \"b\" }}\ncapacity = 3\n\
         tls = {{ ca = \"{}\", cert = \"{}\", key = \"{}\" }}\nstorage = \"volumes\"\n",
        other_engine.host(),
        tls.ca.display(),
        tls.cert.display(),
        tls.key.display(),
    );
    let (mut daemon, _cleanup_local, tag) = daemon_with_engines(&local, &engines).await;
    build_mock_image(&other, &tag).await;
    let label = format!("tether.install_id={}", daemon.install_id);
    let _cleanup_other =
        CleanupWith { docker: other.clone(), label: label.clone(), image: Some(tag.clone()) };
    let api = daemon.api().await;

    // By label: each on the engine that carries it, and only there.
    let a = placed_session(&api, &daemon.workspace("a"), &[("zone", "a")]).await;
    let b = placed_session(&api, &daemon.workspace("b"), &[("zone", "b")]).await;
    assert_eq!(api.status(&a).await.placement.as_deref(), Some("local"));
    assert_eq!(api.status(&b).await.placement.as_deref(), Some("other"));
    assert!(container_on(&local, &a).await.is_some() && container_on(&other, &a).await.is_none());
    assert!(container_on(&other, &b).await.is_some() && container_on(&local, &b).await.is_none());
    // The remote engine's sidecars serve TLS; the local one's plain WebSocket on loopback.
    for (session, tls) in [(&a, false), (&b, true)] {
        let cert = daemon.session_dir(session).join("agentctl/tls.crt");
        assert_eq!(cert.exists(), tls, "{session}: TLS as its engine asks");
    }
    // On the volumes engine only the workspace is bind-mounted; the state is in volumes.
    let binds = |docker: &Docker, session: &str| {
        let (docker, name) = (docker.clone(), format!("tether-{session}"));
        async move {
            let inspected = docker.inspect_container(&name, None::<InspectContainerOptions>).await;
            inspected.unwrap().host_config.and_then(|config| config.binds).unwrap_or_default()
        }
    };
    let on_other = binds(&other, &b).await;
    assert!(on_other.iter().all(|bind| !bind.contains("/tether/agentctl")), "{on_other:?}");
    assert!(on_other.contains(&format!("tether-{b}-state:/tether/state")), "{on_other:?}");
    assert!(on_other.contains(&format!("tether-{b}-agent-0:/root/.mock-agent")), "{on_other:?}");
    let on_local = binds(&local, &a).await;
    assert!(on_local.iter().any(|bind| bind.contains("/tether/agentctl")), "{on_local:?}");
    // A label no engine carries: the launch fails, saying so.
    let (_, error) = unplaceable_session(&api, &daemon.workspace("n"), &[("zone", "c")]).await;
    assert!(error.contains("no Docker engine carries the labels asked for (zone=c)"), "{error}");

    // By load: one each, a tie, goes to the first engine; then the other has fewer.
    let c = placed_session(&api, &daemon.workspace("c"), &[]).await;
    assert_eq!(api.status(&c).await.placement.as_deref(), Some("local"));
    let d = placed_session(&api, &daemon.workspace("d"), &[]).await;
    assert_eq!(api.status(&d).await.placement.as_deref(), Some("other"));
    for session in [&a, &b, &c, &d] {
        assert!(api.ask(session, &format!("hello {session}")).await.contains("you said"));
    }
    let containers: Vec<(String, Option<String>)> =
        futures_util::future::join_all(
            [(&a, &local), (&b, &other), (&c, &local), (&d, &other)].map(
                |(session, docker)| async move {
                    (session.clone(), container_on(docker, session).await)
                },
            ),
        )
        .await;

    // SIGKILL the supervisor; orphans appear on both engines meanwhile. At restart every
    // session on both engines is re-attached (same containers, same generation), and the
    // orphans are gone from both.
    drop(api);
    daemon.kill().await;
    let orphan_local = make_orphan(&local, &daemon.install_id, &tag).await;
    let orphan_other = make_orphan(&other, &daemon.install_id, &tag).await;
    let orphan_volume = format!("tether-{}-state", uuid::Uuid::now_v7());
    let volume_labels = HashMap::from([
        ("tether.managed".to_owned(), "true".to_owned()),
        ("tether.session_id".to_owned(), orphan_volume[7..43].to_owned()),
        ("tether.install_id".to_owned(), daemon.install_id.clone()),
    ]);
    other
        .create_volume(bollard::models::VolumeCreateRequest {
            name: Some(orphan_volume.clone()),
            labels: Some(volume_labels),
            ..Default::default()
        })
        .await
        .unwrap();
    daemon.restart().await;
    let api = daemon.api().await;
    for (session, container) in &containers {
        assert!(api.ask(session, "still there?").await.contains("you said: still there?"));
        let status = api.status(session).await;
        assert!(status.is_agent_running, "{status:?}");
        assert_eq!(status.generation, 1, "re-attached, not relaunched: {status:?}");
        let docker = if status.placement.as_deref() == Some("local") { &local } else { &other };
        assert_eq!(&container_on(docker, session).await, container, "the same container");
    }
    assert!(local.inspect_container(&orphan_local, None::<InspectContainerOptions>).await.is_err());
    assert!(other.inspect_container(&orphan_other, None::<InspectContainerOptions>).await.is_err());
    assert!(other.inspect_volume(&orphan_volume).await.is_err(), "the orphaned volume is gone");
    assert!(other.inspect_volume(&format!("tether-{b}-state")).await.is_ok(), "a kept one stays");

    // The other engine goes away: its sessions lose their agents and are
    // runtime_unavailable; the local ones keep running.
    let mut watch_b = api.subscribe_at_end(&b).await;
    let mut watch_d = api.subscribe_at_end(&d).await;
    other_engine.stop().await;
    for events in [&mut watch_b, &mut watch_d] {
        tether_tests::daemon::until(events, |e| {
            matches!(&e.kind, protocol::api::EventKind::State { error: Some(_), .. })
        })
        .await;
    }
    for session in [&b, &d] {
        let status = api.status(session).await;
        assert_eq!(status.resume_reason, "runtime_unavailable", "{status:?}");
        assert!(status.needs_resume && !status.is_resumable, "{status:?}");
        assert_eq!(status.placement.as_deref(), Some("other"));
        assert!(status.error.as_deref().unwrap_or_default().contains("other"), "{status:?}");
        let refused = api.resume(session).await.expect_err("its engine is down");
        assert_eq!(refused.kind, ErrorKind::RuntimeUnavailable, "{refused:?}");
        assert!(api.prompt(session, "anyone?").await.is_err());
    }
    for session in [&a, &c] {
        assert!(api.ask(session, "unaffected").await.contains("you said: unaffected"));
        assert!(api.status(session).await.is_agent_running);
    }

    // Back: they resume, on the same engine (their state is there), and remember.
    other_engine.restart().await;
    for session in [&b, &d] {
        let status = api.status(session).await;
        assert_eq!(status.resume_reason, "agent_not_running", "{status:?}");
        let resumed = api.resume(session).await.expect("resumed once the engine is back");
        assert!(resumed.is_agent_running, "{resumed:?}");
        assert_eq!(api.status(session).await.placement.as_deref(), Some("other"));
        assert!(container_on(&other, session).await.is_some());
        assert!(container_on(&local, session).await.is_none());
        let recalled = api.ask(session, "/recall").await;
        assert!(recalled.contains("remembered"), "{recalled}");
    }

    // The supervisor is SIGKILLed and the other engine goes away before it is back: at
    // restart the local sessions are re-attached; the other engine's cannot be reached,
    // fenced or re-attached, and wait runtime_unavailable. When the engine returns, a
    // prompt resumes one there.
    drop(api);
    daemon.kill().await;
    other_engine.stop().await;
    daemon.restart().await;
    let api = daemon.api().await;
    for session in [&a, &c] {
        assert!(api.ask(session, "after both").await.contains("you said: after both"));
        assert_eq!(api.status(session).await.generation, 1, "re-attached");
    }
    let status = api.status(&b).await;
    assert_eq!(status.resume_reason, "runtime_unavailable", "{status:?}");
    assert!(!status.is_agent_running && !status.is_resumable, "{status:?}");
    other_engine.restart().await;
    let reply = api.ask(&b, "/recall").await;
    assert!(reply.contains("remembered"), "resumed lazily on its engine: {reply}");
    assert_eq!(api.status(&b).await.placement.as_deref(), Some("other"));

    // Deleting a session removes its container and volumes from its engine.
    ok("delete", api.typed().session_delete(d.clone(), None, None)).await;
    assert!(container_on(&other, &d).await.is_none());
    assert!(other.inspect_volume(&format!("tether-{d}-state")).await.is_err());
    assert!(other.inspect_volume(&format!("tether-{d}-agent-0")).await.is_err());
}

/// An engine reached over `ssh://` (here the local engine, through an sshd of the test's
/// own and `docker system dial-stdio`): a session placed there runs, is re-attached after a
/// supervisor SIGKILL, and the ssh masters the killed daemon left are closed at restart.
#[tokio::test]
async fn an_engine_reached_over_ssh_runs_and_reattaches_a_session() {
    let Some(local) = engine().await else { return };
    let Some(sshd) = tether_tests::ssh::PrivateSshd::start().await else { return };
    let engines = format!(
        "[[docker.engines]]\nname = \"over-ssh\"\nhost = \"{}\"\nssh_key = \"{}\"\nlabels = {{ via = \"ssh\" }}\n",
        sshd.url(),
        sshd.key().display(),
    );
    let (mut daemon, _cleanup, _) = daemon_with_engines(&local, &engines).await;
    let api = daemon.api().await;
    let session = placed_session(&api, &daemon.workspace("s"), &[("via", "ssh")]).await;
    assert_eq!(api.status(&session).await.placement.as_deref(), Some("over-ssh"));
    assert!(api.ask(&session, "through ssh").await.contains("you said: through ssh"));
    let container = container_on(&local, &session).await;
    assert!(container.is_some(), "the container is on the engine ssh reaches");

    // SIGKILL: the ssh masters it held are left behind; the next daemon closes them.
    drop(api);
    daemon.kill().await;
    let control = daemon.root.path().join(".local/state");
    let stale: Vec<std::path::PathBuf> = std::fs::read_dir(&control)
        .map(|entries| entries.flatten().map(|entry| entry.path()).collect())
        .unwrap_or_default();
    // Its pooled connections' masters outlive it (they persist until told to exit).
    assert!(!stale.is_empty(), "the killed daemon left ssh masters behind");
    daemon.restart().await;
    let api = daemon.api().await;
    assert!(api.ask(&session, "still through ssh").await.contains("you said: still through ssh"));
    let status = api.status(&session).await;
    assert_eq!(status.generation, 1, "re-attached: {status:?}");
    assert_eq!(container_on(&local, &session).await, container, "the same container");
    for dir in &stale {
        assert!(!dir.exists(), "{} was closed and removed", dir.display());
        let left = tether_tests::ssh::processes_naming(&dir.to_string_lossy());
        assert!(left.is_empty(), "no ssh master of the killed daemon is left: {left:?}");
    }
}

/// An engine whose host takes connections and never answers (a listener nobody serves):
/// it counts as unreachable within a bound instead of holding anything up. The daemon
/// serves, a session placed on the other engine runs, and one that can only go to the
/// silent engine fails its launch saying why, resumable later.
#[tokio::test]
async fn an_engine_that_never_answers_is_unreachable_within_a_bound() {
    let Some(local) = engine().await else { return };
    // The kernel completes the handshakes; nothing ever reads or answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let engines = format!(
        "[[docker.engines]]\nname = \"local\"\nhost = \"unix:///var/run/docker.sock\"\nlabels = {{ zone = \"a\" }}\n\n\
         [[docker.engines]]\nname = \"silent\"\nhost = \"tcp://127.0.0.1:{silent_port}\"\nlabels = {{ zone = \"s\" }}\n",
    );
    let (daemon, _cleanup, _) = daemon_with_engines(&local, &engines).await;
    let api = daemon.api().await;
    let here = placed_session(&api, &daemon.workspace("a"), &[("zone", "a")]).await;
    assert_eq!(api.status(&here).await.placement.as_deref(), Some("local"));

    let (_, error) = unplaceable_session(&api, &daemon.workspace("s"), &[("zone", "s")]).await;
    assert!(error.contains("silent: unreachable") && error.contains("did not answer"), "{error}");
    // The other engine's session never noticed.
    assert!(api.ask(&here, "still here").await.contains("you said: still here"));
    drop(silent);
}

/// Two engines, the one listed first (so ties go there) a remote-like TLS engine keeping
/// sessions in volumes; returns what the drain tests need.
async fn two_engines_other_first()
-> Option<(Daemon, Docker, PrivateEngine, Docker, Vec<Box<dyn std::any::Any>>)> {
    two_engines_other_first_with("").await
}

/// [`two_engines_other_first`], `docker` (TOML) put in the config's `[docker]` section.
async fn two_engines_other_first_with(
    docker: &str,
) -> Option<(Daemon, Docker, PrivateEngine, Docker, Vec<Box<dyn std::any::Any>>)> {
    two_engines_with(docker, "").await
}

/// [`two_engines_other_first_with`], `each` (TOML) added to both engines' sections.
async fn two_engines_with(
    docker: &str,
    each: &str,
) -> Option<(Daemon, Docker, PrivateEngine, Docker, Vec<Box<dyn std::any::Any>>)> {
    let local = engine().await?;
    let other_engine = PrivateEngine::start_tls().await?;
    let tls = other_engine.client_tls().expect("a TLS engine");
    let other = other_engine.client();
    let engines = format!(
        "[docker]\n{docker}\n\n[[docker.engines]]\nname = \"other\"\nhost = \"{}\"\ncapacity = 4\n\
         tls = {{ ca = \"{}\", cert = \"{}\", key = \"{}\" }}\nstorage = \"volumes\"\n{each}\n\
         [[docker.engines]]\nname = \"local\"\nhost = \"unix:///var/run/docker.sock\"\ncapacity = 4\n{each}",
        other_engine.host(),
        tls.ca.display(),
        tls.cert.display(),
        tls.key.display(),
    );
    let log = std::env::var("TETHER_TEST_LOG").unwrap_or_else(|_| "warn".into());
    let log = format!("{log},supervisor::service::engines=info,supervisor::service::failover=info");
    let (daemon, cleanup_local, tag) =
        daemon_with_engines_env(&local, &engines, &[("TETHER_LOG", &log)]).await;
    build_mock_image(&other, &tag).await;
    let label = format!("tether.install_id={}", daemon.install_id);
    let cleanup_other = CleanupWith { docker: other.clone(), label, image: Some(tag) };
    let guards: Vec<Box<dyn std::any::Any>> =
        vec![Box::new(cleanup_local), Box::new(cleanup_other)];
    Some((daemon, local, other_engine, other, guards))
}

/// The Docker volumes of a session on an engine.
async fn volumes_on(docker: &Docker, session: &str) -> Vec<String> {
    let listed = docker.list_volumes(None::<bollard::query_parameters::ListVolumesOptions>).await;
    let volumes = listed.unwrap().volumes.unwrap_or_default();
    volumes.into_iter().map(|volume| volume.name).filter(|name| name.contains(session)).collect()
}

#[tokio::test]
async fn a_drained_engine_moves_its_sessions_off_and_takes_no_new_one() {
    let Some((daemon, local, _other_engine, other, _guards)) = two_engines_other_first().await
    else {
        return;
    };
    let api = daemon.api().await;
    // Two sessions on the engine drained: one idle, one in a turn when the drain comes
    // (placed while the local engine, empty, is drained itself).
    let closed = ok("drain", api.typed().engines_drain("local".into(), None)).await;
    use protocol::api::EngineState::{Drained, Draining, Serving};
    // With nothing on it, it may be drained by the time it answers.
    assert!(matches!(closed.state, Draining | Drained), "{closed:?}");
    let idle_dir = daemon.workspace("idle");
    let idle = placed_session(&api, &idle_dir, &[]).await;
    let busy = placed_session(&api, &daemon.workspace("busy"), &[]).await;
    for session in [&idle, &busy] {
        assert_eq!(api.status(session).await.placement.as_deref(), Some("other"));
    }
    ok("undrain", api.typed().engines_undrain("local".into())).await;
    let write = |path: &str, text: &str| format!("/write {} {text}", idle_dir.join(path).display());
    api.ask(&idle, &format!("the secret is kumquat\n{}", write("src/a.txt", "one"))).await;
    api.ask(&idle, &write("notes.md", "two")).await;
    let files = tether_tests::files_of(&idle_dir);
    let mut log = daemon.log_lines();
    let mut busy_events = api.subscribe_at_end(&busy).await;
    api.prompt(&busy, "/sleep 20000\nthe long job").await.expect("a turn starts");
    tether_tests::daemon::until(&mut busy_events, |e| {
        matches!(e.kind, protocol::api::EventKind::TurnStarted { .. })
    })
    .await;

    // The running turn is given 1.5 s to end, then cancelled for the move.
    let drain = ["engines", "drain", "other", "--force-after-ms", "1500"];
    let (code, stdout, stderr) = daemon.cli(&drain).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("other\tdraining since "), "{stdout}");
    // Nothing new goes there meanwhile.
    let fresh = placed_session(&api, &daemon.workspace("fresh"), &[]).await;
    assert_eq!(api.status(&fresh).await.placement.as_deref(), Some("local"));
    let mut moved = BTreeSet::new();
    while moved.len() < 2 {
        let line = tether_tests::daemon::await_log(&mut log, "moved off engine other").await;
        moved.extend([&idle, &busy].into_iter().filter(|s| line.contains(s.as_str())).cloned());
    }
    tether_tests::daemon::await_log(&mut log, "engine other drained").await;

    for session in [&idle, &busy] {
        let status = api.status(session).await;
        assert_eq!(status.placement.as_deref(), Some("local"), "{status:?}");
        assert!(status.is_agent_running, "resumed on the other engine: {status:?}");
        assert!(container_on(&other, session).await.is_none(), "its container left behind");
        assert_eq!(volumes_on(&other, session).await, Vec::<String>::new(), "its volumes left");
        assert!(container_on(&local, session).await.is_some());
        let timeline = ok("timeline", api.typed().session_timeline(session.clone(), None)).await;
        let moves: Vec<_> = timeline
            .entries
            .iter()
            .filter_map(|entry| match &entry.event {
                protocol::api::TimelineEvent::Moved { from, to, reason } => {
                    Some((from.clone(), to.clone(), *reason))
                }
                _ => None,
            })
            .collect();
        let drain = protocol::api::MoveReason::Drain;
        assert_eq!(moves, [("other".to_owned(), Some("local".to_owned()), drain)]);
    }
    // The busy session's turn was cancelled for the move, recorded once, not run again.
    let turns = ok("timeline", api.typed().session_timeline(busy.clone(), None)).await.turns;
    assert_eq!(turns.len(), 1, "{turns:?}");
    assert_eq!(turns[0].stop_reason.as_deref(), Some("cancelled"), "{turns:?}");
    let prompts = api.history(&busy).await;
    let long = prompts.iter().filter(|entry| entry.content.contains("the long job")).count();
    assert_eq!(long, 1, "the prompt, once: {prompts:?}");
    // The idle one has every file of its last turn and its conversation (injected: the
    // agent's own state stayed in the other engine's volumes, now removed).
    assert_eq!(tether_tests::files_of(&idle_dir), files);
    let reply = api.ask(&idle, "what was the secret?\n/recall").await;
    assert!(reply.contains("kumquat"), "{reply}");

    let listed = ok("engines", api.typed().engines_list()).await;
    let states: Vec<_> =
        listed.engines.iter().map(|e| (e.name.as_str(), e.state, e.sessions.len())).collect();
    assert_eq!(states, [("other", Drained, 0), ("local", Serving, 3)]);
    let samples = crate::metrics::scrape(&daemon, &[]).await;
    let drained = samples.get("tether_engine_state{engine=\"other\",state=\"drained\"}");
    assert_eq!(drained, Some(&1.0), "{samples:?}");
    assert_eq!(samples.get("tether_session_moves_total{reason=\"drain\"}"), Some(&2.0));
    // Back in service: a new session may go there again.
    let back = ok("undrain", api.typed().engines_undrain("other".into())).await;
    assert_eq!(back.state, Serving);
    let again = placed_session(&api, &daemon.workspace("again"), &[]).await;
    assert_eq!(api.status(&again).await.placement.as_deref(), Some("other"));
}

/// A session placed on `other` (the local engine closed meanwhile, so it cannot go there).
async fn session_on_other(api: &Api, workspace: &Path) -> String {
    ok("drain", api.typed().engines_drain("local".into(), None)).await;
    let session = placed_session(api, workspace, &[]).await;
    ok("undrain", api.typed().engines_undrain("local".into())).await;
    assert_eq!(api.status(&session).await.placement.as_deref(), Some("other"));
    session
}

#[tokio::test]
async fn a_daemon_killed_in_the_middle_of_a_move_ends_with_the_session_on_one_engine() {
    let Some((mut daemon, local, _other_engine, other, _guards)) = two_engines_other_first().await
    else {
        return;
    };
    let log = ("TETHER_LOG", "warn,supervisor::service::engines=info");
    for fault in ["move.paused", "move.cleared"] {
        daemon.kill().await;
        daemon.restart_with_env(&[("TETHER_FAULT", fault), log]).await;
        let api = daemon.api().await;
        ok("undrain", api.typed().engines_undrain("other".into())).await;
        let session = session_on_other(&api, &daemon.workspace(fault)).await;
        api.ask(&session, "the secret is kumquat").await;
        let _ = api.typed().engines_drain("other".into(), Some(2000)).await;
        within("the daemon to die at the fault point", daemon.wait_exit()).await;
        drop(api);
        let mut lines = daemon.log_lines();
        daemon.restart_with_env(&[log]).await;
        let api = daemon.api().await;
        let moved = format!("session {session} moved off engine other to local");
        tether_tests::daemon::await_log(&mut lines, &moved).await;
        let status = api.status(&session).await;
        assert_eq!(status.placement.as_deref(), Some("local"), "{fault}: {status:?}");
        assert!(container_on(&other, &session).await.is_none(), "{fault}: left on the old engine");
        assert_eq!(volumes_on(&other, &session).await, Vec::<String>::new(), "{fault}");
        assert!(container_on(&local, &session).await.is_some(), "{fault}");
        let reply = api.ask(&session, "what was the secret?").await;
        assert!(reply.contains("kumquat"), "{fault}: {reply}");
        let timeline = ok("timeline", api.typed().session_timeline(session.clone(), None)).await;
        let moves = timeline
            .entries
            .iter()
            .filter(|entry| matches!(entry.event, protocol::api::TimelineEvent::Moved { .. }))
            .count();
        assert_eq!(moves, 1, "{fault}: one move recorded");
        // Ended, so the next round's placement (which drains the local engine) leaves it.
        ok("stop", api.typed().session_stop(session.clone())).await;
    }
}

/// Asserts that the session's history holds one prompt with `words` (an interrupted turn
/// recorded once, never re-run).
async fn prompted_once(api: &Api, session: &str, words: &str) {
    let history = api.history(session).await;
    let prompts = history
        .iter()
        .filter(|entry| entry.kind == protocol::api::EntryType::UserMessage)
        .filter(|entry| entry.content.contains(words))
        .count();
    assert_eq!(prompts, 1, "the interrupted prompt, once: {history:?}");
}

/// Starts a turn of `prompt` on a session on engine `other`, SIGKILLs that engine's
/// dockerd mid-turn, and waits until the session has failed over to `local`.
async fn killed_mid_turn(
    daemon: &Daemon,
    api: &Api,
    session: &str,
    prompt: &str,
    engine: &mut PrivateEngine,
) {
    let mut events = api.subscribe_at_end(session).await;
    api.prompt(session, prompt).await.expect("a turn starts");
    tether_tests::daemon::until(&mut events, |e| {
        matches!(e.kind, protocol::api::EventKind::TurnStarted { .. })
    })
    .await;
    let mut log = daemon.log_lines();
    engine.kill().await;
    let moved = format!("session {session} moved off engine other to local");
    tether_tests::daemon::await_log(&mut log, &moved).await;
}

#[tokio::test]
async fn an_engine_that_dies_has_its_sessions_failed_over_and_its_stale_containers_removed() {
    let Some((daemon, local, mut other_engine, other, _guards)) =
        two_engines_other_first_with("failover_after_secs = 2").await
    else {
        return;
    };
    let api = daemon.api().await;
    let dir = daemon.workspace("work");
    let session = session_on_other(&api, &dir).await;
    let write = |path: &str, text: &str| format!("/write {} {text}", dir.join(path).display());
    api.ask(&session, &format!("the secret is kumquat\n{}", write("src/a.txt", "one"))).await;
    api.ask(&session, &write("notes.md", "two")).await;
    let files = tether_tests::files_of(&dir);
    // Its dockerd is SIGKILLed mid-turn: two seconds later the session moves.
    killed_mid_turn(&daemon, &api, &session, "/sleep 30000\nthe long job", &mut other_engine).await;
    let status = api.status(&session).await;
    assert_eq!(status.placement.as_deref(), Some("local"), "{status:?}");
    assert!(status.is_agent_running, "{status:?}");
    let listed = ok("engines", api.typed().engines_list()).await;
    assert_eq!(listed.engines[0].state, protocol::api::EngineState::Unreachable, "{listed:?}");
    // The turn it was in is recorded once, ended, and not run again; the files of the
    // last completed turn are there, and the conversation (injected) too.
    let turns = ok("timeline", api.typed().session_timeline(session.clone(), None)).await.turns;
    assert_eq!(turns.len(), 3, "{turns:?}");
    assert!(turns[2].ended_at.is_some(), "{turns:?}");
    assert_eq!(tether_tests::files_of(&dir), files);
    let reply = api.ask(&session, "what was the secret?\n/recall").await;
    assert!(reply.contains("kumquat"), "{reply}");
    prompted_once(&api, &session, "the long job").await;
    let timeline = ok("timeline", api.typed().session_timeline(session.clone(), None)).await;
    let failover = timeline.entries.iter().any(|entry| {
        matches!(
            &entry.event,
            protocol::api::TimelineEvent::Moved { reason: protocol::api::MoveReason::Failover, .. }
        )
    });
    assert!(failover, "{:?}", timeline.entries);

    // The engine comes back: its stale container and volumes are removed, never adopted.
    let mut log = daemon.log_lines();
    other_engine.restart().await;
    tether_tests::daemon::await_log(&mut log, "engine other is back").await;
    assert!(container_on(&other, &session).await.is_none(), "the stale container is gone");
    assert_eq!(volumes_on(&other, &session).await, Vec::<String>::new());
    assert!(container_on(&local, &session).await.is_some());
    let listed = ok("engines", api.typed().engines_list()).await;
    assert_eq!(listed.engines[0].state, protocol::api::EngineState::Serving, "{listed:?}");
    assert!(api.ask(&session, "still here?").await.contains("still here?"));
}

/// The `moved` rows of a session's timeline: from, to, why.
async fn moves_of(
    api: &Api,
    session: &str,
) -> Vec<(String, Option<String>, protocol::api::MoveReason)> {
    let timeline = ok("timeline", api.typed().session_timeline(session.to_owned(), None)).await;
    timeline
        .entries
        .into_iter()
        .filter_map(|entry| match entry.event {
            protocol::api::TimelineEvent::Moved { from, to, reason } => Some((from, to, reason)),
            _ => None,
        })
        .collect()
}

/// A `mock-docker` session run as a local process in `dir`, waiting for input.
async fn local_session(api: &Api, dir: &Path) -> String {
    let task = ok("task.create", api.typed().task_create("moving".into(), None)).await;
    let create = Create {
        runtime: Some(protocol::api::RuntimeKind::STANDALONE),
        ..Create::new(&task.id, "mock-docker", Some(dir))
    };
    let session = ok("task.session.create", create.send(api.typed())).await.id;
    let mut events = api.subscribe(&session, 0).await;
    assert_eq!(settled(&mut events).await.0, SessionState::WaitingForInput);
    session
}

#[tokio::test]
async fn a_session_moves_from_a_local_process_into_a_container_and_back() {
    use protocol::api::{MoveReason, RuntimeKind};
    let Some(local) = engine().await else { return };
    let (daemon, _cleanup, _tag) = daemon_with_engines(&local, "").await;
    let api = daemon.api().await;
    let dir = daemon.workspace("moving");
    let session = local_session(&api, &dir).await;
    let write = |path: &str, text: &str| format!("/write {} {text}", dir.join(path).display());
    api.ask(&session, &format!("the secret is kumquat\n{}", write("src/a.txt", "one"))).await;
    api.ask(&session, &write("notes.md", "two")).await;
    let files = tether_tests::files_of(&dir);
    assert!(container_on(&local, &session).await.is_none(), "a local process so far");

    // Into a container, by the CLI, while the agent runs: it is started there, with the
    // conversation (injected: a local agent's own state is not the session's to carry).
    let (code, stdout, stderr) = daemon.cli(&["move", &session, "--runtime", "docker"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains(&format!("session {session} moved from standalone to docker/")),
        "{stdout}"
    );
    assert!(stdout.contains("the conversation injected"), "{stdout}");
    let status = api.status(&session).await;
    assert_eq!(status.runtime, RuntimeKind::DOCKER, "{status:?}");
    assert!(status.is_agent_running, "{status:?}");
    let engine = status.placement.clone().expect("placed on an engine");
    assert!(container_on(&local, &session).await.is_some(), "its container");
    assert_eq!(tether_tests::files_of(&dir), files, "the workspace, as it was");
    let reply = api.ask(&session, "what was the secret?\n/recall").await;
    assert!(reply.contains("kumquat"), "{reply}");
    api.ask(&session, &write("c.txt", "three")).await;
    let files = tether_tests::files_of(&dir);

    // And back, by the API: the container is gone, the agent runs here again.
    let back = ok(
        "task.session.move",
        api.typed().session_move(session.clone(), RuntimeKind::STANDALONE, None, None),
    )
    .await;
    assert_eq!(
        (back.from.as_str(), back.to.as_str()),
        (format!("docker/{engine}").as_str(), "standalone")
    );
    assert!(back.resumed, "{back:?}");
    assert!(container_on(&local, &session).await.is_none(), "its container left behind");
    let status = api.status(&session).await;
    assert_eq!(status.runtime, RuntimeKind::STANDALONE, "{status:?}");
    assert!(status.is_agent_running && status.placement.is_none(), "{status:?}");
    assert_eq!(tether_tests::files_of(&dir), files);
    let reply = api.ask(&session, "and the secret?\n/recall").await;
    assert!(reply.contains("kumquat"), "{reply}");
    let requested = MoveReason::Requested;
    assert_eq!(
        moves_of(&api, &session).await,
        [
            ("standalone".to_owned(), Some("docker".to_owned()), requested),
            (format!("docker/{engine}"), Some("standalone".to_owned()), requested),
        ]
    );
    let samples = crate::metrics::scrape(&daemon, &[]).await;
    assert_eq!(samples.get("tether_session_moves_total{reason=\"requested\"}"), Some(&2.0));
    // Where it runs already: refused, nothing changed.
    let again = api.typed().session_move(session.clone(), RuntimeKind::STANDALONE, None, None);
    let again = tether_tests::daemon::ApiError::of("move", again.await.expect_err("refused"));
    assert_eq!(again.kind, ErrorKind::InvalidState, "{again:?}");
    assert!(again.message.contains("runs on runtime standalone already"), "{again:?}");
}

/// Prompts, and waits past the turn's end for that turn's checkpoint.
async fn turn_checkpointed(api: &Api, session: &str, prompt: &str) -> protocol::api::Checkpoint {
    let mut events = api.subscribe_at_end(session).await;
    let turn = api.prompt(session, prompt).await.expect("prompt");
    let mut taken = None;
    tether_tests::daemon::until(&mut events, |e| {
        if let protocol::api::EventKind::CheckpointTaken { checkpoint } = &e.kind
            && checkpoint.turn_id.as_ref() == Some(&turn)
        {
            taken = Some(checkpoint.clone());
        }
        taken.is_some()
    })
    .await;
    taken.expect("UNWRAP: until ends once it is seen")
}

#[tokio::test]
async fn a_copied_workspace_is_checkpointed_from_its_container_and_follows_its_session() {
    use protocol::api::RuntimeKind;
    let Some((daemon, local, _other_engine, other, _guards)) =
        two_engines_with("", "workspace = \"copy\"\n").await
    else {
        return;
    };
    let api = daemon.api().await;
    let dir = daemon.workspace("copied");
    std::fs::write(dir.join("README.md"), "from the supervisor\n").unwrap();
    let before = tether_tests::files_of(&dir);
    let session = session_on_other(&api, &dir).await;
    let path = |name: &str| dir.join(name).display().to_string();
    // The agent finds the supervisor's files in its engine's volume, and what it writes
    // stays there: the supervisor's directory is left as it was.
    let reply = api.ask(&session, &format!("/read {}", path("README.md"))).await;
    assert!(reply.contains("from the supervisor"), "{reply}");
    turn_checkpointed(
        &api,
        &session,
        &format!("the secret is kumquat\n/write {} one", path("src/a.txt")),
    )
    .await;
    let newest =
        turn_checkpointed(&api, &session, &format!("/write {} two", path("notes.md"))).await;
    assert_eq!(tether_tests::files_of(&dir), before, "written in the engine's volume only");
    // Each turn's checkpoint was fetched from the container.
    let restored = daemon.workspace("restored");
    std::fs::remove_dir(&restored).unwrap();
    let into = restored.display().to_string();
    ok(
        "restore",
        api.typed().session_checkpoint_restore(session.clone(), Some(newest.seq), None, into),
    )
    .await;
    let files = tether_tests::files_of(&restored);
    let names: Vec<&str> = files.keys().map(String::as_str).collect();
    assert_eq!(names, ["README.md", "notes.md", "src/a.txt"], "{files:?}");
    assert_eq!(files["notes.md"], b"two");

    // A rewind cannot restore it here, and says so before anything stops.
    let timeline = ok("timeline", api.typed().session_timeline(session.clone(), None)).await;
    let first = timeline.turns[0].turn_id.clone();
    let rewind = api.typed().session_rewind(session.clone(), first, Some(true));
    let rewind = tether_tests::daemon::ApiError::of("rewind", rewind.await.expect_err("refused"));
    assert_eq!(rewind.kind, ErrorKind::InvalidState, "{rewind:?}");
    assert!(rewind.message.contains("lives on its engine"), "{rewind:?}");
    // Leaving for the local runtime is refused (the supervisor's directory is not the
    // session's workspace), and the session is left running.
    let refused = api.typed().session_move(session.clone(), RuntimeKind::STANDALONE, None, None);
    let refused = tether_tests::daemon::ApiError::of("move", refused.await.expect_err("refused"));
    assert_eq!(refused.kind, ErrorKind::InvalidState, "{refused:?}");
    assert!(refused.message.contains("workspace = \"copy\""), "{refused:?}");
    assert!(api.status(&session).await.is_agent_running);

    // Drained: the session goes on on the local engine, its new volume there filled from
    // its newest checkpoint; nothing of it is left on the drained engine.
    let mut log = daemon.log_lines();
    ok("drain", api.typed().engines_drain("other".into(), Some(1500))).await;
    tether_tests::daemon::await_log(&mut log, "moved off engine other").await;
    let status = api.status(&session).await;
    assert_eq!(status.placement.as_deref(), Some("local"), "{status:?}");
    assert!(container_on(&other, &session).await.is_none());
    assert_eq!(volumes_on(&other, &session).await, Vec::<String>::new());
    assert!(volumes_on(&local, &session).await.iter().any(|name| name.ends_with("-workspace")));
    let reply = api
        .ask(&session, &format!("what was the secret?\n/read {}\n/recall", path("notes.md")))
        .await;
    assert!(reply.contains("read") && reply.contains(": two"), "{reply}");
    assert!(reply.contains("kumquat"), "{reply}");
    assert_eq!(tether_tests::files_of(&dir), before);
}

#[tokio::test]
async fn a_copied_workspace_lost_with_its_engine_comes_back_from_the_last_completed_turn() {
    let Some((daemon, local, mut other_engine, _other, _guards)) =
        two_engines_with("failover_after_secs = 2", "workspace = \"copy\"\n").await
    else {
        return;
    };
    let api = daemon.api().await;
    let dir = daemon.workspace("lost");
    let session = session_on_other(&api, &dir).await;
    let path = |name: &str| dir.join(name).display().to_string();
    turn_checkpointed(
        &api,
        &session,
        &format!("the secret is kumquat\n/write {} one", path("a.txt")),
    )
    .await;
    turn_checkpointed(&api, &session, &format!("/write {} two", path("notes.md"))).await;
    // The turn running when the engine dies writes a file, then works on.
    let long = format!("/write {} half\n/sleep 30000\nthe long job", path("partial.txt"));
    killed_mid_turn(&daemon, &api, &session, &long, &mut other_engine).await;
    assert!(volumes_on(&local, &session).await.iter().any(|name| name.ends_with("-workspace")));
    // The new volume holds every file of the last completed turn, and nothing of the
    // interrupted one (whether or not its write came before the kill); the conversation
    // goes on.
    let reply = api
        .ask(
            &session,
            &format!(
                "what was the secret?\n/read {}\n/read {}\n/recall",
                path("notes.md"),
                path("partial.txt")
            ),
        )
        .await;
    assert!(reply.contains(&format!("read {}: two", path("notes.md"))), "{reply}");
    assert!(reply.contains(&format!("read {} failed", path("partial.txt"))), "{reply}");
    assert!(reply.contains("kumquat"), "{reply}");
    prompted_once(&api, &session, "the long job").await;
}

#[tokio::test]
async fn a_daemon_killed_in_the_middle_of_a_move_between_runtimes_leaves_the_session_on_one() {
    use protocol::api::RuntimeKind;
    let Some(local) = engine().await else { return };
    let (mut daemon, _cleanup, _tag) = daemon_with_engines(&local, "").await;
    daemon.kill().await;
    daemon.restart_with_env(&[("TETHER_FAULT", "relocate.cleared")]).await;
    let api = daemon.api().await;
    let session = local_session(&api, &daemon.workspace("half-moved")).await;
    api.ask(&session, "the secret is kumquat").await;
    let _ = api.typed().session_move(session.clone(), RuntimeKind::DOCKER, None, None).await;
    within("the daemon to die at the fault point", daemon.wait_exit()).await;
    drop(api);

    // Where it was, at rest, nothing of it running anywhere; it resumes there and can be
    // moved again.
    daemon.restart_with_env(&[]).await;
    let api = daemon.api().await;
    let status = api.status(&session).await;
    assert_eq!(status.runtime, RuntimeKind::STANDALONE, "{status:?}");
    assert!(!status.is_agent_running, "{status:?}");
    assert!(container_on(&local, &session).await.is_none(), "a container of a move not made");
    let reply = api.ask(&session, "what was the secret?\n/recall").await;
    assert!(reply.contains("kumquat"), "{reply}");
    let moved = ok(
        "task.session.move",
        api.typed().session_move(session.clone(), RuntimeKind::DOCKER, None, None),
    )
    .await;
    assert!(moved.resumed && moved.to.starts_with("docker/"), "{moved:?}");
    assert!(container_on(&local, &session).await.is_some());
    assert_eq!(moves_of(&api, &session).await.len(), 1, "one move recorded");
}
