//! The first Docker test: the pipeline CI relies on. From Rust with bollard, build an image
//! offline (`FROM scratch` + the statically linked mock-agent, context built in memory), run
//! it, and complete `initialize` + `session/new` over the container's attached stdio.
//! Everything it creates is removed, even when it fails.
//!
//! Without a reachable engine it prints `SKIPPED: no Docker engine`; with
//! `REQUIRE_DOCKER=1` it fails instead.

use bollard::container::LogOutput;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, WaitContainerOptions,
};
use futures_util::StreamExt;
use protocol::PeerConfig;
use serde_json::json;
use tether_tests::docker::{
    Cleanup, build_context, build_image, engine, remove_labelled, static_binary,
};
use tether_tests::within;
use tokio::io::AsyncWriteExt;

const TEST_LABEL: &str = "tether.test-run";

#[tokio::test]
async fn scratch_image_with_mock_agent_speaks_acp_over_attached_stdio() {
    let Some(docker) = engine().await else { return };
    let binary = std::fs::read(static_binary("TETHER_STATIC_MOCK_AGENT", "mock-agent"))
        .expect("read the static mock-agent");
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let tag = format!("tether-test-mock-agent:{run_id}");
    let label = format!("{TEST_LABEL}={run_id}");
    let _cleanup = Cleanup { label: label.clone(), image: Some(tag.clone()) };

    let dockerfile = "FROM scratch\nCOPY mock-agent /mock-agent\nENTRYPOINT [\"/mock-agent\"]\n";
    build_image(&docker, &tag, build_context(dockerfile, &[("mock-agent", &binary, 0o755)])).await;
    let labels = std::collections::HashMap::from([(TEST_LABEL.to_owned(), run_id.clone())]);
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
            Some(CreateContainerOptions {
                name: Some(format!("tether-test-{run_id}")),
                ..Default::default()
            }),
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
    assert_eq!(remove_labelled(&label, Some(&tag)).await, 1, "the container is removed");
    assert_eq!(remove_labelled(&label, None).await, 0, "nothing is left behind");
}
