//! Helpers for Tether's black-box tests: finding the workspace's binaries, running agents
//! as real processes that are always cleaned up, recording every line that crosses their
//! stdio, and validating those lines against the ACP v1 JSON schema.
// The test crate is exempt from the length rule: a scenario reads top to bottom.
#![allow(clippy::too_many_lines)]

pub mod browser;
pub mod client;
pub mod daemon;
pub mod docker;
pub mod face;
pub mod model_server;
pub mod real_agents;
pub mod reap;
pub mod schema;
pub mod sdk;
pub mod sidecar;
pub mod ssh;

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use protocol::{InboundRx, Peer, PeerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::process::{Child, Command};

/// How long any single exchange with an agent may take before a test fails.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// Awaits `future`, failing the test with `what` if it takes longer than
/// [`EXCHANGE_TIMEOUT`]. A guard against hangs, not a way to synchronise.
pub async fn within<F: Future>(what: &str, future: F) -> F::Output {
    match tokio::time::timeout(EXCHANGE_TIMEOUT, future).await {
        Ok(output) => output,
        Err(_) => panic!("timed out after {EXCHANGE_TIMEOUT:?}: {what}"),
    }
}

/// Runs git in `dir` (as a fixed test author); its trimmed stdout. Fails the test when
/// git fails.
pub async fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=tether", "-c", "user.email=t@example.com"])
        .args(args)
        .output()
        .await
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("git prints UTF-8").trim().to_owned()
}

/// Every file under `dir` but those of a `.git` in it, path → content (a symlink: its
/// target), to compare two trees byte for byte.
pub fn files_of(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    fn walk(top: &Path, dir: &Path, out: &mut std::collections::BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).expect("the directory is readable") {
            let path = entry.expect("an entry").path();
            let name = path.strip_prefix(top).expect("under top").display().to_string();
            let meta = std::fs::symlink_metadata(&path).expect("a file");
            if path.file_name().is_some_and(|name| name == ".git") {
                continue;
            } else if meta.is_symlink() {
                let target = std::fs::read_link(&path).expect("a link");
                out.insert(name, target.display().to_string().into_bytes());
            } else if meta.is_dir() {
                walk(top, &path, out);
            } else {
                out.insert(name, std::fs::read(&path).expect("readable"));
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Makes `dir` a repository on `main` with one (empty) commit.
pub async fn git_repository(dir: &Path) {
    git(dir, &["init", "-q", "-b", "main"]).await;
    git(dir, &["commit", "-q", "--allow-empty", "-m", "start"]).await;
}

/// The directory holding the workspace's built binaries (`target/<profile>`), derived from
/// the running executable: a test (`target/<profile>/deps/it-…`) or a binary beside them.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("UNWRAP: the running binary has a path");
    let dir = exe.parent().expect("UNWRAP: the binary lives in a directory");
    match dir.file_name() {
        Some(name) if name == "deps" => {
            dir.parent().expect("UNWRAP: deps/ has a parent").to_owned()
        }
        _ => dir.to_owned(),
    }
}

/// The path of a workspace binary. A plain `cargo test` (or `cargo nextest run`) builds
/// the workspace's binaries first, once per test build (see [`ensure_built`]);
/// `scripts/test.sh` builds them itself and says so with `TETHER_TEST_BINS_BUILT=1`.
pub fn workspace_bin(name: &str) -> PathBuf {
    ensure_built(
        "bins",
        &[env!("CARGO"), "build", "--quiet", "--workspace", "--bins"],
        "cargo build --workspace --bins",
    );
    let path = target_dir().join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the workspace binaries first (cargo build --workspace --bins, \
         as scripts/test.sh does)",
        path.display()
    );
    path
}

/// Runs `command` (from the workspace root) once per state of the sources: the first test
/// process to get here builds, holding a lock, and leaves a stamp naming the newest source
/// it built; the others (nextest runs each test in a process of its own) find the stamp
/// and go on, until a source changes. Nothing runs when `TETHER_TEST_BINS_BUILT` is set (scripts/test.sh
/// builds everything before the tests). A failed build fails the test with `what` to run.
pub fn ensure_built(stamp: &str, command: &[&str], what: &str) {
    static BUILT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    if std::env::var_os("TETHER_TEST_BINS_BUILT").is_some() {
        return;
    }
    let mut built = BUILT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if built.iter().any(|done| done == stamp) {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // Built for the sources as they are now: the newest manifest or source file of the
    // workspace (binaries' own sources included) names the build.
    let want = format!("{:?}", newest_source(&root));
    let dir = target_dir();
    let lock = std::fs::File::create(dir.join(format!(".tether-{stamp}.lock")))
        .expect("the build lock file can be created");
    let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, err)| err)
        .expect("the build lock");
    let stamp_path = dir.join(format!(".tether-{stamp}.stamp"));
    if std::fs::read_to_string(&stamp_path).is_ok_and(|have| have == want) {
        built.push(stamp.to_owned());
        return;
    }
    let mut build = std::process::Command::new(command[0]);
    build.args(&command[1..]).current_dir(&root).stdout(std::process::Stdio::null());
    if dir.file_name().is_some_and(|name| name == "release") {
        build.arg("--release");
    }
    eprintln!("tests: building what they need first: {what}");
    let status = build.status().unwrap_or_else(|err| panic!("{what}: cannot run: {err}"));
    assert!(status.success(), "{what} failed ({status}): run it to see why");
    std::fs::write(&stamp_path, want).expect("the build stamp can be written");
    built.push(stamp.to_owned());
}

/// The newest modification time among the workspace's manifests and Rust sources.
fn newest_source(root: &Path) -> Option<std::time::SystemTime> {
    fn walk(dir: &Path, newest: &mut Option<std::time::SystemTime>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name == "target" || name.starts_with('.') || name == "node_modules" {
                continue;
            }
            if path.is_dir() {
                walk(&path, newest);
            } else if name.ends_with(".rs") || name == "Cargo.toml" || name == "Cargo.lock" {
                let modified = entry.metadata().and_then(|m| m.modified()).ok();
                *newest = (*newest).max(modified);
            }
        }
    }
    let mut newest = None;
    walk(root, &mut newest);
    newest
}

/// Which way a recorded line went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Written by the client (us) to the agent's stdin.
    ToAgent,
    /// Read by the client from the agent's stdout.
    FromAgent,
}

/// Every byte that crossed an agent's stdio, in order, per direction.
#[derive(Debug, Clone, Default)]
pub struct Transcript {
    inner: Arc<Mutex<(Vec<u8>, Vec<u8>)>>,
}

impl Transcript {
    fn record(&self, direction: Direction, bytes: &[u8]) {
        let mut inner = self.inner.lock().expect("UNWRAP: never poisoned");
        match direction {
            Direction::ToAgent => inner.0.extend_from_slice(bytes),
            Direction::FromAgent => inner.1.extend_from_slice(bytes),
        }
    }

    /// The complete, non-blank lines that went one way.
    pub fn lines(&self, direction: Direction) -> Vec<Vec<u8>> {
        let inner = self.inner.lock().expect("UNWRAP: never poisoned");
        let bytes = match direction {
            Direction::ToAgent => &inner.0,
            Direction::FromAgent => &inner.1,
        };
        bytes
            .split(|&b| b == b'\n')
            .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
            .map(<[u8]>::to_vec)
            .collect()
    }
}

/// An `AsyncRead`/`AsyncWrite` wrapper that copies what passes through into a transcript.
struct Tee<T> {
    inner: T,
    transcript: Transcript,
    direction: Direction,
}

impl<T: AsyncRead + Unpin> AsyncRead for Tee<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &poll {
            let new = buf.filled()[before..].to_vec();
            self.transcript.record(self.direction, &new);
        }
        poll
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tee<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &poll {
            self.transcript.record(self.direction, &buf[..*n]);
        }
        poll
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// How [`AgentProcess::stop`] ended the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopStage {
    /// It exited by itself after stdin closed.
    ExitedOnEof(ExitStatus),
    /// It needed SIGTERM.
    Terminated(ExitStatus),
    /// It needed SIGKILL.
    Killed(ExitStatus),
}

/// An agent running as a real child process in its own process group, with our
/// [`Peer`] on its stdio. Dropping it SIGKILLs the whole group, so no test leaves a process
/// behind, even when it fails.
pub struct AgentProcess {
    /// Our side of the ACP connection; `None` once [`AgentProcess::stop`] closed it.
    peer: Option<Peer>,
    /// The agent's requests and notifications, in order.
    pub inbound: InboundRx,
    /// Everything that crossed stdio.
    pub transcript: Transcript,
    /// The agent's stderr, collected concurrently so the pipe never fills.
    pub stderr: Arc<Mutex<Vec<u8>>>,
    /// The stderr collector; joined once the process has exited, so that what it wrote
    /// last is in `stderr` before a test reads it.
    stderr_done: Option<tokio::task::JoinHandle<()>>,
    child: Child,
    pgid: i32,
}

impl AgentProcess {
    /// Spawns `program args…` with piped stdio and connects a peer to it.
    pub fn spawn(program: impl Into<PathBuf>, args: &[&str]) -> io::Result<AgentProcess> {
        let mut command = Command::new(program.into());
        command.args(args);
        AgentProcess::spawn_command(command)
    }

    /// Spawns a prepared command (stdio and process group are set here).
    pub fn spawn_command(mut command: Command) -> io::Result<AgentProcess> {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = command.spawn()?;
        let pgid = child.id().expect("UNWRAP: a just-spawned child has a pid") as i32;
        let transcript = Transcript::default();
        let stdin = Tee {
            inner: child.stdin.take().expect("UNWRAP: stdin is piped"),
            transcript: transcript.clone(),
            direction: Direction::ToAgent,
        };
        let stdout = Tee {
            inner: child.stdout.take().expect("UNWRAP: stdout is piped"),
            transcript: transcript.clone(),
            direction: Direction::FromAgent,
        };
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut stderr_pipe = child.stderr.take().expect("UNWRAP: stderr is piped");
        let stderr_sink = Arc::clone(&stderr);
        let stderr_done = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 8192];
            while let Ok(n @ 1..) = stderr_pipe.read(&mut buf).await {
                stderr_sink.lock().expect("UNWRAP: never poisoned").extend_from_slice(&buf[..n]);
            }
        });
        let (peer, inbound, io) = protocol::connect(stdout, stdin, PeerConfig::default());
        tokio::spawn(io);
        Ok(AgentProcess {
            peer: Some(peer),
            inbound,
            transcript,
            stderr,
            stderr_done: Some(stderr_done),
            child,
            pgid,
        })
    }

    /// Our side of the ACP connection.
    pub fn peer(&self) -> &Peer {
        self.peer.as_ref().expect("the connection was closed by stop()")
    }

    /// The agent's pid (also its process group id).
    pub fn pid(&self) -> i32 {
        self.pgid
    }

    /// The stderr collected so far, as text.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().expect("UNWRAP: never poisoned")).into_owned()
    }

    /// Waits for the process to exit by itself (and for its stderr to be collected).
    pub async fn wait(&mut self) -> ExitStatus {
        let status = within("waiting for the agent to exit", self.child.wait()).await;
        self.collect_stderr().await;
        status.expect("UNWRAP: wait on our own child")
    }

    async fn collect_stderr(&mut self) {
        if let Some(done) = self.stderr_done.take() {
            let _ = within("collecting the agent's stderr", done).await;
        }
    }

    /// Stops the agent the way agentctl will: close stdin, wait `grace`; SIGTERM the
    /// group, wait `grace`; SIGKILL. Returns the stage that ended it.
    pub async fn stop(&mut self, grace: Duration) -> StopStage {
        // Dropping the last handle closes stdin once queued output is flushed (callers must
        // not keep clones of the peer).
        self.peer = None;
        if let Ok(status) = tokio::time::timeout(grace, self.child.wait()).await {
            self.collect_stderr().await;
            return StopStage::ExitedOnEof(status.expect("UNWRAP: wait on our own child"));
        }
        signal_group(self.pgid, nix::sys::signal::Signal::SIGTERM);
        if let Ok(status) = tokio::time::timeout(grace, self.child.wait()).await {
            self.collect_stderr().await;
            return StopStage::Terminated(status.expect("UNWRAP: wait on our own child"));
        }
        signal_group(self.pgid, nix::sys::signal::Signal::SIGKILL);
        StopStage::Killed(self.wait().await)
    }
}

fn signal_group(pgid: i32, signal: nix::sys::signal::Signal) {
    // ESRCH (the group is already gone) is fine: that is what we want.
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), signal);
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        signal_group(self.pgid, nix::sys::signal::Signal::SIGKILL);
    }
}

/// Finds an installed program: on `PATH`, then in cargo's bin directory (where
/// `cargo install` puts it, and `scripts/test.sh` installs `elizacp`).
pub fn find_program(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect())
        .unwrap_or_default();
    if let Some(cargo_home) = std::env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(cargo_home).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo/bin"));
    }
    dirs.into_iter().map(|dir| dir.join(name)).find(|path| path.is_file())
}

/// Spawns `command` with its stderr piped and waits for the stderr line containing
/// `ready` (the program's own readiness line), failing the test with what it printed if
/// it exits first; the rest of its stderr is drained in the background, so it never blocks
/// on a full pipe. Killed when the child is dropped.
pub async fn spawn_until_ready(
    mut command: tokio::process::Command,
    ready: &str,
    what: &str,
) -> tokio::process::Child {
    use tokio::io::AsyncBufReadExt;
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|err| panic!("cannot start {what}: {err}"));
    let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut seen = Vec::new();
    let started = async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains(ready) {
                return true;
            }
            seen.push(line);
        }
        false
    };
    assert!(within(what, started).await, "{what} exited: {}", seen.join("\n"));
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

/// A history entry's `content` without Tether's cut-off notes (`CUT_OFF`, a reason, `]`) on
/// a reply its failed turn cut off: what the agent itself said, to compare with the stream.
pub fn without_cut_off_notes(content: &str) -> String {
    supervisor::history::without_cut_off_notes(content)
}
