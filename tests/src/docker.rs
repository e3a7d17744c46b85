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

/// Builds an image offline from `context`. One build at a time on this machine (a file
/// lock across the test processes): an engine building one tag twice at once can lose a
/// layer of one ("failed to get digest").
pub async fn build_image(docker: &Docker, tag: &str, context: Vec<u8>) {
    let lock_path = target_dir().join("docker-build.lock");
    let lock = tokio::task::spawn_blocking(move || {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .expect("the build lock file");
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, errno)| errno)
            .expect("the build lock")
    });
    let _held = within("the docker build lock", lock).await.expect("the lock task");
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

/// The Docker profile of the mock agent (`mock-docker`) with this image.
pub fn mock_docker_profile(image: &str) -> String {
    format!(
        // The agent exits at once unless its root_env is set: a container is the sandbox
        // such an agent asks for, so the Docker runtime sets it.
        "id = \"mock-docker\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{{home}}/.mock-agent\", \"--require-env\", \"TETHER_TEST_SANDBOX=1\"]\nprotocol = \"acp\"\n\
         runtime = \"docker\"\n[session]\nnative_resume = true\nhistory_injection = true\nagent_state_dirs = [\".mock-agent\"]\n\
         [docker]\nimage = \"{image}\"\nmemory_mb = 256\ncpus = 1.0\n[process]\nroot_env = {{ TETHER_TEST_SANDBOX = \"1\" }}\n"
    )
}

/// An engine, a test image, a daemon with the Docker profile, and cleanup of all of it.
pub async fn setup() -> Option<(Docker, crate::daemon::Daemon, Cleanup)> {
    let docker = engine().await?;
    let tag = format!("tether-test-mock:{}", uuid::Uuid::new_v4().simple());
    build_mock_image(&docker, &tag).await;
    let agentctl = static_binary("TETHER_STATIC_AGENTCTL", "agentctl");
    let profile = mock_docker_profile(&tag);
    let daemon = crate::daemon::Daemon::start_with_env(
        &["--static-agentctl", agentctl.to_str().unwrap()],
        &[("mock-docker.toml", &profile)],
        &[],
    )
    .await;
    let cleanup =
        Cleanup { label: format!("tether.install_id={}", daemon.install_id), image: Some(tag) };
    Some((docker, daemon, cleanup))
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

/// [`Cleanup`] through a given client (any engine, TLS included).
pub struct CleanupWith {
    /// The engine.
    pub docker: Docker,
    /// The label filter, `key=value`.
    pub label: String,
    /// An image to remove, if any.
    pub image: Option<String>,
}

impl Drop for CleanupWith {
    fn drop(&mut self) {
        let (docker, label, image) = (self.docker.clone(), self.label.clone(), self.image.clone());
        on_a_thread(async move {
            remove_labelled_on(&docker, &label, image.as_deref()).await;
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

/// A Docker engine of the test's own: a `dockerd` with its own data root, exec root and
/// bridge, that the test can stop and start again (an engine that goes away and comes
/// back); on a unix socket in a temp dir, or on a loopback TCP port requiring TLS client
/// certificates (`--tlsverify`, a CA made for it). Stopped, its bridge deleted and its dirs
/// removed when dropped.
pub struct PrivateEngine {
    dir: PathBuf,
    bridge: String,
    child: Option<tokio::process::Child>,
    /// The TCP port, for a TLS engine.
    tls_port: Option<u16>,
}

/// The files a client of a TLS engine presents: `(ca, cert, key)`.
pub struct ClientTls {
    /// The CA that signed the engine's certificate.
    pub ca: PathBuf,
    /// The client's certificate.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

/// A CA, and a server and a client certificate it signed (PEM files in `dir`): `ca.pem`,
/// `server.pem`/`server-key.pem` for 127.0.0.1, `client.pem`/`client-key.pem`.
fn make_certificates(dir: &std::path::Path) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).expect("write PEM");
    let ca_key = KeyPair::generate().expect("a key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.distinguished_name.push(DnType::CommonName, "tether test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    write("ca.pem", &ca.self_signed(&ca_key).expect("the CA").pem());
    let issuer = Issuer::new(ca, ca_key);
    for (name, sans, purpose) in [
        ("server", vec!["127.0.0.1".to_owned()], ExtendedKeyUsagePurpose::ServerAuth),
        ("client", Vec::new(), ExtendedKeyUsagePurpose::ClientAuth),
    ] {
        let key = KeyPair::generate().expect("a key");
        let mut params = CertificateParams::new(sans).expect("params");
        params.distinguished_name.push(DnType::CommonName, format!("tether test {name}"));
        params.extended_key_usages = vec![purpose];
        let cert = params.signed_by(&key, &issuer).expect("a certificate");
        write(&format!("{name}.pem"), &cert.pem());
        write(&format!("{name}-key.pem"), &key.serialize_pem());
    }
}

impl PrivateEngine {
    /// Starts one on a unix socket, or `None` after printing the SKIPPED line (a failure
    /// when Docker is required): it needs root, `dockerd` and `ip`.
    pub async fn start() -> Option<PrivateEngine> {
        PrivateEngine::start_with(false).await
    }

    /// Starts one on a loopback TCP port that requires TLS client certificates.
    pub async fn start_tls() -> Option<PrivateEngine> {
        PrivateEngine::start_with(true).await
    }

    async fn start_with(tls: bool) -> Option<PrivateEngine> {
        let root = nix::unistd::Uid::effective().is_root();
        let have = |program: &str| {
            std::env::var_os("PATH").is_some_and(|path| {
                std::env::split_paths(&path).any(|dir| dir.join(program).is_file())
            })
        };
        if !(root && have("dockerd") && have("ip")) {
            assert!(
                !docker_required(),
                "REQUIRE_DOCKER=1 but no private engine can be started (root, dockerd and ip are needed)"
            );
            eprintln!("SKIPPED: no private Docker engine (it needs root, dockerd and ip)");
            return None;
        }
        // Short: the socket's path must fit in sun_path.
        let dir =
            PathBuf::from(format!("/tmp/te-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]));
        std::fs::create_dir_all(dir.join("data")).expect("the engine's dirs");
        std::fs::create_dir_all(dir.join("exec")).expect("the engine's dirs");
        // A bridge and subnet of its own (engine 2 of setup.sh has 172.31.250.0/24).
        let octet = 10 + (std::process::id() % 200);
        let bridge = format!("tbr{octet}");
        let ip = |args: &[&str]| {
            let status = std::process::Command::new("ip").args(args).status().expect("run ip");
            assert!(status.success(), "ip {args:?}");
        };
        let _ = std::process::Command::new("ip").args(["link", "del", &bridge]).status();
        ip(&["link", "add", "name", &bridge, "type", "bridge"]);
        ip(&["addr", "add", &format!("172.31.{octet}.1/24"), "dev", &bridge]);
        ip(&["link", "set", &bridge, "up"]);
        let tls_port = tls.then(|| {
            make_certificates(&dir);
            // A free port now; dockerd binds it a moment later.
            let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            probe.local_addr().expect("its address").port()
        });
        let mut engine = PrivateEngine { dir, bridge, child: None, tls_port };
        engine.run().await;
        Some(engine)
    }

    /// `unix://…/docker.sock`, or `tcp://127.0.0.1:PORT` for a TLS engine.
    pub fn host(&self) -> String {
        match self.tls_port {
            Some(port) => format!("tcp://127.0.0.1:{port}"),
            None => format!("unix://{}", self.dir.join("docker.sock").display()),
        }
    }

    /// What a client of a TLS engine presents.
    pub fn client_tls(&self) -> Option<ClientTls> {
        self.tls_port.map(|_| ClientTls {
            ca: self.dir.join("ca.pem"),
            cert: self.dir.join("client.pem"),
            key: self.dir.join("client-key.pem"),
        })
    }

    /// A client.
    pub fn client(&self) -> Docker {
        let connected = match self.client_tls() {
            Some(tls) => Docker::connect_with_ssl(
                &self.host(),
                &tls.key,
                &tls.cert,
                &tls.ca,
                120,
                bollard::API_DEFAULT_VERSION,
            ),
            None => Docker::connect_with_host(&self.host()),
        };
        connected.expect("a client of the private engine")
    }

    /// Starts `dockerd` and waits for its "API listen on" line.
    async fn run(&mut self) {
        let _ = std::fs::remove_file(self.dir.join("docker.pid"));
        let mut command = tokio::process::Command::new("dockerd");
        command
            .arg("--host")
            .arg(self.host())
            .arg("--data-root")
            .arg(self.dir.join("data"))
            .arg("--exec-root")
            .arg(self.dir.join("exec"))
            .arg("--pidfile")
            .arg(self.dir.join("docker.pid"))
            .args(["--bridge", &self.bridge, "--shutdown-timeout", "2"])
            .args(match self.tls_port {
                Some(_) => vec![
                    "--tlsverify".into(),
                    format!("--tlscacert={}", self.dir.join("ca.pem").display()),
                    format!("--tlscert={}", self.dir.join("server.pem").display()),
                    format!("--tlskey={}", self.dir.join("server-key.pem").display()),
                ],
                None => Vec::new(),
            });
        let child = crate::spawn_until_ready(command, "API listen on", "the private dockerd").await;
        self.child = Some(child);
    }

    /// Stops the engine (SIGTERM: its containers are stopped) and waits for it to exit.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            let _ = within("the private dockerd to stop", child.wait()).await;
        }
    }

    /// SIGKILLs the engine's `dockerd` (its host gone, as the supervisor sees it: its
    /// containers may run on) and reaps it.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = within("the private dockerd to die", child.wait()).await;
        }
    }

    /// Starts it again on the same data.
    pub async fn restart(&mut self) {
        self.run().await;
    }
}

impl Drop for PrivateEngine {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            if let Some(pid) = child.id() {
                // SIGTERM, then wait for it (blocking; it stops its containers first). If
                // tokio reaped it already, the wait answers at once.
                let pid = nix::unistd::Pid::from_raw(pid as i32);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
                let _ = nix::sys::wait::waitpid(pid, None);
            }
            drop(child);
        }
        let _ = std::process::Command::new("ip").args(["link", "del", &self.bridge]).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
