//! Docker helpers for tests: the engine (or a visible skip), the static binaries, an
//! offline test image (`FROM scratch` + static mock-agent, built from an in-memory tar),
//! and cleanup of everything a test created, even when it fails.

use std::collections::HashMap;
use std::path::PathBuf;

use bollard::Docker;
use bollard::query_parameters::{
    BuildImageOptionsBuilder, ListContainersOptions, RemoveContainerOptions, RemoveImageOptions,
};
use futures_util::StreamExt;

use crate::{target_dir, within};

/// Whether CI demands an engine (`REQUIRE_DOCKER=1`).
pub fn docker_required() -> bool {
    std::env::var("REQUIRE_DOCKER").is_ok_and(|value| value == "1")
}

/// The engine, or `None` after printing the SKIPPED line (a failure when Docker is required).
pub async fn engine() -> Option<Docker> {
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

/// The second engine `scripts/setup.sh` starts (`TETHER_SECOND_DOCKER_HOST`, a `tcp://`
/// address) and that address, or `None` after printing the SKIPPED line (a failure when
/// Docker is required).
pub async fn second_engine() -> Option<(Docker, String)> {
    let host = std::env::var("TETHER_SECOND_DOCKER_HOST").ok().filter(|host| !host.is_empty());
    let reason = match &host {
        None => "TETHER_SECOND_DOCKER_HOST is not set (scripts/setup.sh starts it)".to_owned(),
        Some(host) => {
            let connected = match Docker::connect_with_http(host, 120, bollard::API_DEFAULT_VERSION)
            {
                Ok(docker) => docker.negotiate_version().await,
                Err(err) => Err(err),
            };
            match connected {
                Ok(docker) => match docker.ping().await {
                    Ok(_) => return Some((docker, host.clone())),
                    Err(err) => err.to_string(),
                },
                Err(err) => err.to_string(),
            }
        }
    };
    assert!(
        !docker_required(),
        "REQUIRE_DOCKER=1 but the second engine is not reachable: {reason}"
    );
    eprintln!("SKIPPED: no second Docker engine ({reason})");
    None
}

/// A static binary that `scripts/build-static.sh` builds, from `$VAR` or the default path.
pub fn static_binary(var: &str, name: &str) -> PathBuf {
    let path = match std::env::var_os(var) {
        Some(path) => PathBuf::from(path),
        None => {
            // A plain `cargo test`: build them (once per test build) rather than test a
            // stale copy.
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/build-static.sh");
            crate::ensure_built("static", &["bash", script], "scripts/build-static.sh");
            target_dir().join("../x86_64-unknown-linux-gnu/debug").join(name)
        }
    };
    assert!(
        path.is_file(),
        "no static {name} at {}: run scripts/build-static.sh (scripts/test.sh does)",
        path.display()
    );
    path
}

/// A build context with a Dockerfile and files `(name, bytes, mode)`, as an in-memory tar.
pub fn build_context(dockerfile: &str, files: &[(&str, &[u8], u32)]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut entries: Vec<(&str, &[u8], u32)> = vec![("Dockerfile", dockerfile.as_bytes(), 0o644)];
    entries.extend_from_slice(files);
    for (name, bytes, mode) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(mode);
        header.set_cksum();
        tar.append_data(&mut header, name, bytes).expect("UNWRAP: writing to a Vec cannot fail");
    }
    tar.into_inner().expect("UNWRAP: writing to a Vec cannot fail")
}

/// Builds an image offline from `context`.
pub async fn build_image(docker: &Docker, tag: &str, context: Vec<u8>) {
    let options = BuildImageOptionsBuilder::new().t(tag).rm(true).forcerm(true).build();
    let mut build = docker.build_image(options, None, Some(bollard::body_full(context.into())));
    while let Some(step) = within("docker build", build.next()).await {
        let step = step.expect("the image builds");
        assert!(step.error_detail.is_none(), "build failed: {step:?}");
    }
}

/// The test image: `FROM scratch` with the static mock-agent on `PATH`.
pub async fn build_mock_image(docker: &Docker, tag: &str) {
    let binary = std::fs::read(static_binary("TETHER_STATIC_MOCK_AGENT", "mock-agent"))
        .expect("read mock-agent");
    let dockerfile =
        "FROM scratch\nCOPY mock-agent /usr/local/bin/mock-agent\nENV PATH=/usr/local/bin\n";
    build_image(docker, tag, build_context(dockerfile, &[("mock-agent", &binary, 0o755)])).await;
}

/// Removes every container labelled `label` (`key=value`) and, if given, an image; returns
/// how many containers there were.
pub async fn remove_labelled(label: &str, image: Option<&str>) -> usize {
    let Some(docker) = Docker::connect_with_defaults().ok() else { return 0 };
    remove_labelled_on(&docker, label, image).await
}

/// [`remove_labelled`] on a given engine.
pub async fn remove_labelled_on(docker: &Docker, label: &str, image: Option<&str>) -> usize {
    let filters = HashMap::from([("label".to_owned(), vec![label.to_owned()])]);
    let containers = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await
        .unwrap_or_default();
    for container in &containers {
        if let Some(id) = &container.id {
            let _ = docker
                .remove_container(
                    id,
                    Some(RemoveContainerOptions { force: true, v: true, ..Default::default() }),
                )
                .await;
        }
    }
    if let Some(image) = image {
        let _ = docker
            .remove_image(
                image,
                Some(RemoveImageOptions { force: true, ..Default::default() }),
                None,
            )
            .await;
    }
    containers.len()
}

/// Calls [`remove_labelled`] when dropped, so a failing test leaves nothing behind.
pub struct Cleanup {
    /// The label filter, `key=value`.
    pub label: String,
    /// An image to remove, if any.
    pub image: Option<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (label, image) = (self.label.clone(), self.image.clone());
        on_a_thread(async move {
            remove_labelled(&label, image.as_deref()).await;
        });
    }
}

/// [`Cleanup`] on the engine at `host` (a `tcp://` address).
pub struct CleanupOn {
    /// The engine.
    pub host: String,
    /// The label filter, `key=value`.
    pub label: String,
    /// An image to remove, if any.
    pub image: Option<String>,
}

impl Drop for CleanupOn {
    fn drop(&mut self) {
        let (host, label, image) = (self.host.clone(), self.label.clone(), self.image.clone());
        on_a_thread(async move {
            if let Ok(docker) = Docker::connect_with_http(&host, 120, bollard::API_DEFAULT_VERSION)
            {
                remove_labelled_on(&docker, &label, image.as_deref()).await;
            }
        });
    }
}

/// Runs `work` to its end on a thread with its own runtime (Drop cannot await), and waits.
fn on_a_thread(work: impl Future<Output = ()> + Send + 'static) {
    let _ = std::thread::spawn(move || {
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(work);
    })
    .join();
}
