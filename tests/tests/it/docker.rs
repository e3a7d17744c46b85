//! The first Docker test: the pipeline CI relies on. From Rust with bollard, build an image
//! offline (`FROM scratch` + the statically linked mock-agent, context built in memory), run
//! it, and complete `initialize` + `session/new` over the container's attached stdio.
//! Everything it creates is removed, even when it fails.
//!
//! Without a reachable engine it prints `SKIPPED: no Docker engine`; with
//! `REQUIRE_DOCKER=1` it fails instead.

use std::path::PathBuf;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    AttachContainerOptions, BuildImageOptionsBuilder, CreateContainerOptions,
    ListContainersOptions, RemoveContainerOptions, RemoveImageOptions, WaitContainerOptions,
};
use futures_util::StreamExt;
use protocol::PeerConfig;
use serde_json::json;
use tether_tests::{target_dir, within};
use tokio::io::AsyncWriteExt;

const TEST_LABEL: &str = "tether.test-run";

fn docker_required() -> bool {
    std::env::var("REQUIRE_DOCKER").is_ok_and(|value| value == "1")
}

/// The engine, or `None` after printing the SKIPPED line (a failure when Docker is required).
async fn engine() -> Option<Docker> {
    let connected = match Docker::connect_with_defaults() {
        Ok(docker) => docker.negotiate_version().await,
        Err(err) => Err(err),
    };
    let reason = match connected {
        Ok(docker) => match docker.ping().await {
            Ok(_) => return Some(docker),
            Err(err) => err.to_string(),
        },
        Err(err) => err.to_string(),
    };
    assert!(!docker_required(), "REQUIRE_DOCKER=1 but no Docker engine is reachable: {reason}");
    eprintln!("SKIPPED: no Docker engine ({reason})");
    None
}

/// The static mock-agent that `scripts/build-static.sh` builds.
fn static_mock_agent() -> PathBuf {
    let path = std::env::var_os("TETHER_STATIC_MOCK_AGENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("../x86_64-unknown-linux-gnu/debug/mock-agent"));
    assert!(
        path.is_file(),
        "no static mock-agent at {}: run scripts/build-static.sh (scripts/test.sh does)",
        path.display()
    );
    path
}

/// A build context with a Dockerfile and the binary, as an in-memory tar.
fn build_context(mock_agent: &[u8]) -> Vec<u8> {
    let dockerfile = b"FROM scratch\nCOPY mock-agent /mock-agent\nENTRYPOINT [\"/mock-agent\"]\n";
    let mut tar = tar::Builder::new(Vec::new());
    for (name, bytes, mode) in
        [("Dockerfile", &dockerfile[..], 0o644), ("mock-agent", mock_agent, 0o755)]
    {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(mode);
        header.set_cksum();
        tar.append_data(&mut header, name, bytes).expect("UNWRAP: writing to a Vec cannot fail");
    }
    tar.into_inner().expect("UNWRAP: writing to a Vec cannot fail")
}

#[tokio::test]
async fn scratch_image_with_mock_agent_speaks_acp_over_attached_stdio() {
    let Some(docker) = engine().await else { return };
    let binary = std::fs::read(static_mock_agent()).expect("read the static mock-agent");
    let run_id = uuid_like();
    let tag = format!("tether-test-mock-agent:{run_id}");
    let container = format!("tether-test-{run_id}");

    let scenario = tokio::spawn(run_scenario(
        docker.clone(),
        binary,
        tag.clone(),
        container.clone(),
        run_id.clone(),
    ));
    let outcome = scenario.await;

    // Clean up whatever exists, whether the scenario passed, failed or panicked.
    let _ = docker
        .remove_container(
            &container,
            Some(RemoveContainerOptions { force: true, ..Default::default() }),
        )
        .await;
    let _ = docker
        .remove_image(&tag, Some(RemoveImageOptions { force: true, ..Default::default() }), None)
        .await;
    let filters = std::collections::HashMap::from([(
        "label".to_owned(),
        vec![format!("{TEST_LABEL}={run_id}")],
    )]);
    let left = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await
        .expect("list containers");
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic.into_panic());
    }
    assert!(left.is_empty(), "containers left behind: {left:?}");
}

async fn run_scenario(
    docker: Docker,
    binary: Vec<u8>,
    tag: String,
    container: String,
    run_id: String,
) {
    // Build offline: FROM scratch needs no registry.
    let options = BuildImageOptionsBuilder::new().t(&tag).rm(true).forcerm(true).build();
    let context = bollard::body_full(build_context(&binary).into());
    let mut build = docker.build_image(options, None, Some(context));
    while let Some(step) = within("docker build", build.next()).await {
        let step = step.expect("the image builds");
        assert!(step.error_detail.is_none(), "build failed: {step:?}");
    }

    let labels = std::collections::HashMap::from([(TEST_LABEL.to_owned(), run_id)]);
    let body = ContainerCreateBody {
        image: Some(tag.clone()),
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        open_stdin: Some(true),
        stdin_once: Some(true),
        tty: Some(false),
        labels: Some(labels),
        host_config: Some(HostConfig { network_mode: Some("none".into()), ..Default::default() }),
        ..Default::default()
    };
    let created = docker
        .create_container(
            Some(CreateContainerOptions { name: Some(container.clone()), ..Default::default() }),
            body,
        )
        .await
        .expect("the container is created");
    // Attach before starting, so no output is missed.
    let attached = docker
        .attach_container(
            &created.id,
            Some(AttachContainerOptions {
                stdin: true,
                stdout: true,
                stderr: true,
                stream: true,
                ..Default::default()
            }),
        )
        .await
        .expect("attach to the container");
    docker.start_container(&created.id, None).await.expect("the container starts");

    // Demultiplex the attached stream: stdout feeds our peer, stderr is kept for messages.
    let (mut stdout_tx, stdout_rx) = tokio::io::duplex(64 * 1024);
    let mut output = attached.output;
    let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let stderr_sink = std::sync::Arc::clone(&stderr);
    tokio::spawn(async move {
        while let Some(Ok(frame)) = output.next().await {
            match frame {
                LogOutput::StdOut { message } | LogOutput::Console { message } => {
                    if stdout_tx.write_all(&message).await.is_err() {
                        break;
                    }
                }
                LogOutput::StdErr { message } => {
                    stderr_sink.lock().unwrap().push_str(&String::from_utf8_lossy(&message))
                }
                LogOutput::StdIn { .. } => {}
            }
        }
    });
    let (peer, _inbound, io) = protocol::connect(stdout_rx, attached.input, PeerConfig::default());
    tokio::spawn(io);

    let init = within(
        "initialize in the container",
        peer.request("initialize", Some(json!({"protocolVersion": 1, "clientCapabilities": {}}))),
    )
    .await
    .unwrap_or_else(|err| panic!("initialize failed: {err}; stderr: {}", stderr.lock().unwrap()));
    assert_eq!(init["protocolVersion"], 1);
    assert_eq!(init["agentInfo"]["name"], "mock-agent");
    let session = within(
        "session/new in the container",
        peer.request("session/new", Some(json!({"cwd": "/", "mcpServers": []}))),
    )
    .await
    .expect("session/new succeeds");
    assert!(session["sessionId"].as_str().is_some_and(|id| id.starts_with("mock-")), "{session}");

    // Closing stdin ends mock-agent, and so the container, with status 0.
    drop(peer);
    let mut wait = docker.wait_container(&created.id, None::<WaitContainerOptions>);
    let exit = within("the container to exit", wait.next())
        .await
        .expect("a wait result")
        .expect("wait succeeds");
    assert_eq!(exit.status_code, 0, "stderr: {}", stderr.lock().unwrap());
}

/// A unique id for this run's names and labels.
fn uuid_like() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}
