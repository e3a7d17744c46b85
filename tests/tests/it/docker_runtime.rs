//! The Docker runtime against a real engine: a session in a container, a re-attach after a
//! supervisor restart, resume in the same and in a new container, orphan removal, and an
//! unreachable engine. Every container and image is removed, even when a test fails.

use protocol::errors::ErrorKind;
use std::collections::HashMap;

use bollard::Docker;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    CreateContainerOptions, InspectContainerOptions, StopContainerOptions,
};
use protocol::api::{ApiClient, EventKind, ResumeOutcome, RuntimeKind, SessionState};
use tether_tests::daemon::{Api, Daemon, chunks, next, ok, settled, until};
use tether_tests::docker::{Cleanup, build_mock_image, engine, remove_labelled, static_binary};
use tether_tests::within;
use tether_tests::{git, git_repository};

use tether_tests::docker::{mock_docker_profile as docker_profile, setup};

/// The `tether.generation` label of the session's container.
async fn generation_label(docker: &Docker, session: &str) -> String {
    let container = docker
        .inspect_container(&format!("tether-{session}"), None::<InspectContainerOptions>)
        .await
        .expect("the container");
    container.config.and_then(|c| c.labels).unwrap_or_default()["tether.generation"].clone()
}

async fn container_id(docker: &Docker, session: &str) -> String {
    let container = docker
        .inspect_container(&format!("tether-{session}"), None::<InspectContainerOptions>)
        .await
        .expect("the container");
    container.id.expect("an id")
}

/// Waits until the session has noticed its sidecar is gone.
async fn until_lost(api: &Api, session: &str, after: u64) {
    let mut events = api.subscribe(session, after).await;
    until(&mut events, |e| matches!(&e.kind, EventKind::State { error: Some(_), .. })).await;
    assert!(api.status(session).await.needs_resume);
}

#[tokio::test]
async fn docker_session_streams_and_is_reattached_after_a_supervisor_kill() {
    let Some((docker, mut daemon, cleanup)) = setup().await else { return };
    let api = daemon.api().await;
    let session = api.ready_session("mock-docker", &daemon.workspace("d")).await;
    assert_eq!(api.status(&session).await.runtime, RuntimeKind::DOCKER);
    let reply = api.ask(&session, "/stream 5\nhello from a container").await;
    assert!(
        reply.contains("you said: hello from a container [1/5]") && reply.ends_with("[5/5]"),
        "{reply}"
    );

    // The container is what the design says it is.
    let container = docker
        .inspect_container(&format!("tether-{session}"), None::<InspectContainerOptions>)
        .await
        .unwrap();
    let labels = container.config.as_ref().and_then(|c| c.labels.clone()).unwrap();
    assert_eq!(labels["tether.managed"], "true");
    assert_eq!(labels["tether.session_id"], session);
    assert_eq!(labels["tether.install_id"], daemon.install_id);
    for key in ["tether.task_id", "tether.execution_id", "tether.generation"] {
        assert!(labels.contains_key(key), "{key}");
    }
    let host = container.host_config.clone().unwrap();
    assert_eq!((host.init, host.privileged), (Some(true), Some(false)));
    assert_eq!(host.memory, Some(256 * 1024 * 1024));
    // A fork bomb stops at the default pids limit.
    assert_eq!(host.pids_limit, Some(4096), "the default docker.pids_limit");
    let bindings = host.port_bindings.unwrap();
    let binding = bindings.values().flatten().flatten().next().unwrap();
    assert_eq!(binding.host_ip.as_deref(), Some("127.0.0.1"), "published on loopback only");
    assert!(
        !host.binds.unwrap().iter().any(|bind| bind.contains("docker.sock")),
        "no Docker socket inside"
    );
    let env = container.config.and_then(|c| c.env).unwrap_or_default();
    assert!(
        !env.iter().any(|var| var.starts_with("AGENTCTL_TOKEN")),
        "the token is not in docker inspect"
    );

    // SIGKILL the supervisor mid-turn; the restarted one re-attaches the container.
    reattached_mid_turn(&mut daemon, api, &session).await;
    drop(cleanup);
}

/// SIGKILLs the supervisor in the middle of a 1000-chunk turn, restarts it, and checks
/// that the restarted one re-attached the session's container with every chunk once.
async fn reattached_mid_turn(daemon: &mut Daemon, api: Api, session: &str) {
    let mut events = api.subscribe_at_end(session).await;
    api.prompt(session, "/stream 1000").await.unwrap();
    let mut seen = vec![next(&mut events).await];
    drop(events);
    drop(api);
    let api = daemon.kill_restart_and_follow(session, &mut seen).await;
    let texts = chunks(&seen);
    assert_eq!(texts.len(), 1000, "every chunk exactly once");
    assert!(
        texts.iter().enumerate().all(|(idx, text)| text.ends_with(&format!("[{}/1000]", idx + 1)))
    );
    assert!(api.status(session).await.is_agent_running, "re-attached");
}

#[tokio::test]
async fn resume_replaces_a_stopped_or_removed_container_and_still_remembers() {
    let Some((docker, daemon, cleanup)) = setup().await else { return };
    let api = daemon.api().await;
    let session = api.ready_session("mock-docker", &daemon.workspace("r")).await;
    api.ask(&session, "the secret is kumquat").await;
    let first = container_id(&docker, &session).await;

    assert_eq!(generation_label(&docker, &session).await, "1");

    // Stopped behind Tether's back: status says resume; resume replaces the container
    // with one of the next execution (its labels say which), and the agent remembers.
    let after = api.status(&session).await.last_event_seq;
    docker
        .stop_container(&first, Some(StopContainerOptions { t: Some(1), ..Default::default() }))
        .await
        .unwrap();
    until_lost(&api, &session, after).await;
    let resumed = api.resume(&session).await.unwrap();
    assert_eq!(resumed.outcome, ResumeOutcome::NativeLoad);
    let first = container_id(&docker, &session).await;
    assert_eq!(generation_label(&docker, &session).await, "2", "one container per execution");
    assert_eq!(api.status(&session).await.generation, 2);
    assert!(api.ask(&session, "/recall").await.contains("remembered 2 earlier messages"));

    // Removed: resume creates a new container, and the mounted agent state restores it.
    let after = api.status(&session).await.last_event_seq;
    docker
        .remove_container(
            &first,
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await
        .unwrap();
    until_lost(&api, &session, after).await;
    let resumed = api.resume(&session).await.unwrap();
    assert_eq!(resumed.outcome, ResumeOutcome::NativeLoad);
    let second = container_id(&docker, &session).await;
    assert_ne!(second, first, "a new container");
    let reply = api.ask(&session, "what was the secret?\n/recall").await;
    assert!(
        reply.contains("remembered 4 earlier messages") && reply.contains("kumquat"),
        "{reply}"
    );

    // Delete removes the container and the agent state.
    ok("task.session.delete", api.typed().session_delete(session.clone(), None, None)).await;
    assert!(docker.inspect_container(&second, None::<InspectContainerOptions>).await.is_err());
    assert!(!daemon.root.path().join("tether/agent-state").join(&session).exists());
    drop(cleanup);
}

#[tokio::test]
async fn orphan_containers_are_removed_at_startup() {
    let Some((docker, mut daemon, cleanup)) = setup().await else { return };
    let image = cleanup.image.clone().unwrap();
    let unknown = uuid::Uuid::now_v7().to_string();
    let labels = HashMap::from([
        ("tether.managed".to_owned(), "true".to_owned()),
        ("tether.session_id".to_owned(), unknown.clone()),
        ("tether.install_id".to_owned(), daemon.install_id.clone()),
    ]);
    let body = ContainerCreateBody {
        image: Some(image),
        cmd: Some(vec!["mock-agent".into()]),
        labels: Some(labels),
        ..Default::default()
    };
    let orphan = docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(format!("tether-{unknown}")),
                ..Default::default()
            }),
            body,
        )
        .await
        .unwrap();
    daemon.kill().await;
    daemon.restart().await;
    // Recovery ran before the API answered this.
    ok("task.list", daemon.api().await.typed().task_list()).await;
    assert!(
        docker.inspect_container(&orphan.id, None::<InspectContainerOptions>).await.is_err(),
        "the orphan is gone"
    );
    drop(cleanup);
}

#[tokio::test]
async fn an_unreachable_engine_gives_runtime_unavailable_and_standalone_goes_on() {
    let Some((_docker, daemon, cleanup)) = setup().await else { return };
    drop(daemon);
    let agentctl = static_binary("TETHER_STATIC_AGENTCTL", "agentctl");
    let image = cleanup.image.clone().unwrap();
    let profile = docker_profile(&image);
    let daemon = Daemon::start_with_env(
        &["--static-agentctl", agentctl.to_str().unwrap()],
        &[("mock-docker.toml", &profile)],
        &[("DOCKER_HOST", "unix:///nonexistent/docker.sock")],
    )
    .await;
    let api = daemon.api().await;
    let error = api.create_session("mock-docker", &daemon.workspace("u")).await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::RuntimeUnavailable, "{error:?}");
    assert!(error.message.contains("unreachable"), "{error:?}");
    let session = api.ready_session("mock", &daemon.workspace("s")).await;
    assert!(api.ask(&session, "standalone still works").await.contains("standalone still works"));
    let missing = Daemon::start_with_env(
        &["--static-agentctl", agentctl.to_str().unwrap()],
        &[("mock-docker.toml", &docker_profile("tether-test-no-such-image:latest"))],
        &[],
    )
    .await;
    let api = missing.api().await;
    let session = api.create_session("mock-docker", &missing.workspace("m")).await.unwrap();
    let mut events = api.subscribe(&session, 0).await;
    let (state, reason) = settled(&mut events).await;
    assert_eq!(state, SessionState::Failed);
    assert!(
        reason.contains("tether-test-no-such-image:latest"),
        "the error names the image: {reason}"
    );
    let _ = within(
        "cleanup",
        remove_labelled(&format!("tether.install_id={}", missing.install_id), None),
    )
    .await;
    drop(cleanup);
}

/// A worktree session in a container gets its worktree and the repository's git
/// dir mounted at their own paths (the worktree's `.git` file points there), and what the
/// agent writes lands in the worktree; `sessions.cleanup` then removes its container and
/// its worktree along with its records.
#[tokio::test]
async fn a_docker_worktree_session_mounts_the_git_dir_and_cleanup_removes_its_container() {
    let Some((docker, daemon, cleanup)) = setup().await else { return };
    let api = daemon.api().await;
    let repo = daemon.workspace("repo");
    git_repository(&repo).await;
    let task = ok("task.create", api.typed().task_create("in a box".into(), None)).await.id;
    let session = api.create_worktree(&task, "mock-docker", &repo, None).await.unwrap().id;
    let (state, error) = settled(&mut api.subscribe(&session, 0).await).await;
    assert_eq!(state, SessionState::WaitingForInput, "{error}");
    let worktree = std::path::PathBuf::from(api.status(&session).await.worktree_path.unwrap());
    let container = docker
        .inspect_container(&format!("tether-{session}"), None::<InspectContainerOptions>)
        .await
        .unwrap();
    let binds = container.host_config.and_then(|host| host.binds).unwrap_or_default();
    let git_dir = repo.join(".git");
    for path in [&worktree, &git_dir] {
        let bind = format!("{0}:{0}", path.display());
        assert!(binds.contains(&bind), "{bind} in {binds:?}");
    }
    let file = worktree.join("from-the-box.txt");
    api.ask(&session, &format!("/write {} written in a container", file.display())).await;
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "written in a container");
    assert!(git(&worktree, &["status", "--porcelain"]).await.contains("from-the-box.txt"));
    ok("stop", api.typed().session_stop(session.clone())).await;
    let call = api.typed().cleanup(0, Some(vec![SessionState::Completed]), None, None, Some(true));
    let result = ok("sessions.cleanup", call).await;
    assert_eq!(result.removed.len(), 1, "{result:?}");
    let resources = &result.removed[0].resources;
    for what in ["container", "worktree", "history"] {
        assert!(resources.contains(&what.to_owned()), "{what} in {resources:?}");
    }
    assert!(
        docker
            .inspect_container(&format!("tether-{session}"), None::<InspectContainerOptions>)
            .await
            .is_err(),
        "the container is gone"
    );
    assert!(!worktree.exists());
    drop(cleanup);
}

/// A container carries its execution's generation, and recovery
/// re-attaches a running container only when its labels name the execution recorded for the
/// session. Recorded as a later generation (as when the container is a leftover of an
/// older execution), it is fenced instead of re-attached, and the session resumes in a new
/// container of the next generation, its conversation intact.
#[tokio::test]
async fn a_container_of_a_stale_generation_is_not_reattached() {
    let Some((docker, mut daemon, cleanup)) = setup().await else { return };
    let api = daemon.api().await;
    let session = api.ready_session("mock-docker", &daemon.workspace("g")).await;
    api.ask(&session, "remember the plum").await;
    let stale = container_id(&docker, &session).await;
    assert_eq!(generation_label(&docker, &session).await, "1");
    drop(api);
    daemon.kill().await;
    let db = rusqlite::Connection::open(daemon.root.path().join("tether/state.db")).unwrap();
    let changed = db
        .execute(
            "UPDATE executors_running SET generation = generation + 1 WHERE session_id = ?1",
            [&session],
        )
        .unwrap();
    assert_eq!(changed, 1);
    drop(db);
    let mut log = daemon.log_lines();
    daemon.restart().await;
    tether_tests::daemon::await_log(
        &mut log,
        "a container of a stale generation is not re-attached",
    )
    .await;
    let api = daemon.api().await;
    let status = api.status(&session).await;
    assert!(!status.is_agent_running && status.needs_resume, "not re-attached: {status:?}");
    let running = docker
        .inspect_container(&stale, None::<InspectContainerOptions>)
        .await
        .ok()
        .and_then(|c| c.state)
        .and_then(|state| state.running);
    assert_ne!(running, Some(true), "the stale container was fenced");
    let resumed = api.resume(&session).await.unwrap();
    assert_eq!(resumed.outcome, ResumeOutcome::NativeLoad, "{resumed:?}");
    assert_eq!(generation_label(&docker, &session).await, "3");
    assert_ne!(container_id(&docker, &session).await, stale);
    assert!(api.ask(&session, "/recall").await.contains("remembered 2 earlier messages"));
    drop(cleanup);
}

/// Zero-config Docker: a daemon started with no flag and no variable
/// naming a static agentctl finds the one the build script made (`scripts/build-static.sh`,
/// run by the set-up) and runs a `--runtime docker` session.
#[tokio::test]
async fn a_docker_session_needs_no_extra_flag() {
    let Some(docker) = engine().await else { return };
    let tag = format!("tether-test-mock:{}", uuid::Uuid::new_v4().simple());
    build_mock_image(&docker, &tag).await;
    let daemon =
        Daemon::start_with_profiles(&[], &[("mock-docker.toml", &docker_profile(&tag))]).await;
    let cleanup =
        Cleanup { label: format!("tether.install_id={}", daemon.install_id), image: Some(tag) };
    let api = daemon.api().await;
    let session = api.ready_session("mock-docker", &daemon.workspace("z")).await;
    assert_eq!(api.status(&session).await.runtime, RuntimeKind::DOCKER);
    assert!(api.ask(&session, "no flags").await.contains("you said: no flags"));
    drop(cleanup);
}

/// An engine reached over TCP (`DOCKER_HOST=tcp://…`: the second engine
/// `scripts/setup.sh` starts, with its own data root and bridge) runs sessions like the
/// local one — a streamed turn, and a re-attach after a supervisor SIGKILL with every chunk
/// once — and its containers are its own (none on the first engine).
#[tokio::test]
async fn an_engine_reached_over_tcp_runs_and_reattaches_sessions() {
    let Some((docker, host)) = tether_tests::docker::second_engine().await else { return };
    let Some(local) = engine().await else { return };
    let tag = format!("tether-test-mock:{}", uuid::Uuid::new_v4().simple());
    build_mock_image(&docker, &tag).await;
    let mut daemon = Daemon::start_with_env(
        &[],
        &[("mock-docker.toml", &docker_profile(&tag))],
        &[("DOCKER_HOST", &host)],
    )
    .await;
    let _cleanup = tether_tests::docker::CleanupWith {
        docker: docker.clone(),
        label: format!("tether.install_id={}", daemon.install_id),
        image: Some(tag),
    };
    let api = daemon.api().await;
    let session = api.ready_session("mock-docker", &daemon.workspace("tcp")).await;
    assert!(api.ask(&session, "over tcp").await.contains("you said: over tcp"));
    let name = format!("tether-{session}");
    assert!(docker.inspect_container(&name, None::<InspectContainerOptions>).await.is_ok());
    assert!(
        local.inspect_container(&name, None::<InspectContainerOptions>).await.is_err(),
        "not on the local engine"
    );
    // Reached across a network (tcp://): its control channel is TLS, with a certificate
    // made for this execution; plain WebSocket gets nowhere. After the SIGKILL below the
    // a re-attach reconnects with the certificate pinned in the store.
    let inspected = docker.inspect_container(&name, None::<InspectContainerOptions>).await.unwrap();
    let cmd = inspected.config.and_then(|config| config.cmd).unwrap_or_default();
    assert!(cmd.iter().any(|arg| arg == "--tls-cert"), "{cmd:?}");
    let port = inspected
        .network_settings
        .and_then(|settings| settings.ports)
        .and_then(|ports| ports.get("7070/tcp").cloned().flatten())
        .and_then(|bindings| bindings.into_iter().find_map(|binding| binding.host_port))
        .expect("a published control port");
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let token =
        std::fs::read_to_string(daemon.session_dir(&session).join("agentctl/token")).unwrap();
    let plain = agentctl::client::ControlClient::connect(addr.into(), &token).await;
    assert!(plain.is_err(), "plain WebSocket is refused by a TLS sidecar");
    let cert = std::fs::read(daemon.session_dir(&session).join("agentctl/tls.crt")).unwrap();
    let pinned =
        agentctl::client::ControlClient::connect_pinned(addr.into(), &token, 16, Some(cert.into()))
            .await
            .expect("the pinned certificate gets through");
    pinned.status().await.expect("status over TLS");
    drop(pinned);
    reattached_mid_turn(&mut daemon, api, &session).await;
}

/// A workflow's steps run where each says — one in a container (its profile's
/// runtime, named again with `runtime`), one as a local process — and the output crosses
/// from one to the other; each step's session is stopped when it is done.
#[tokio::test]
async fn a_workflow_runs_a_step_in_a_container_and_one_beside_it() {
    let Some((_docker, daemon, _cleanup)) = setup().await else { return };
    let api = daemon.api().await;
    let spec = r#"name = "mixed"
[[steps]]
id = "inside"
agent = "mock-docker"
runtime = "docker"
prompt = "inside\n/say from the container"
[[steps]]
id = "outside"
agent = "mock"
runtime = "standalone"
depends_on = ["inside"]
prompt = "outside\n/say got: {{steps.inside.output}}"
"#;
    let workspace = daemon.workspace("mixed");
    let started = api.start_workflow(spec, &workspace).await;
    let (state, seen) = api.workflow_end(&started.workflow_id).await;
    assert_eq!(state, protocol::api::WorkflowState::Completed, "{seen:#?}");
    let status = ok("workflow.status", api.typed().workflow_status(started.workflow_id)).await;
    assert_eq!(status.steps[1].output.as_deref(), Some("got: from the container"));
    let runtimes: Vec<RuntimeKind> = {
        let mut kinds = Vec::new();
        for step in &status.steps {
            kinds.push(api.status(step.session_id.as_ref().unwrap()).await.runtime);
        }
        kinds
    };
    assert_eq!(runtimes, [RuntimeKind::DOCKER, RuntimeKind::STANDALONE]);
    for step in &status.steps {
        let session = step.session_id.as_ref().unwrap();
        let mut session_events = api.subscribe(session, 0).await;
        until(&mut session_events, |e| tether_tests::daemon::is_state(e, SessionState::Completed))
            .await;
    }
}
