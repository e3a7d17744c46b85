//! bubblewrap's argv for a confined agent (pure: [`argv`]), and the one question asked of
//! bubblewrap before its first sandbox ([`probe`]).

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use agents::profile::{FilesystemAccess, NetworkAccess, SandboxSettings};

use super::{Place, SandboxError, expand};

/// The system, read-only in a `filesystem = "workspace"` sandbox (a merged-`/usr` link
/// such as `/bin → usr/bin` stays a link).
const SYSTEM: [&str; 8] = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"];

/// An argv builder: bubblewrap's options in order (later mounts go over earlier ones).
struct Args(Vec<OsString>);

impl Args {
    fn push(&mut self, words: &[&str]) {
        self.0.extend(words.iter().map(OsString::from));
    }

    fn mount(&mut self, option: &str, source: &Path, target: &Path) {
        self.0.push(option.into());
        self.0.push(source.into());
        self.0.push(target.into());
    }

    fn same(&mut self, option: &str, path: &Path) {
        self.mount(option, path, path);
    }
}

/// bubblewrap (`bwrap`, its argv) confining an agent as `sandbox` asks at `place`; then,
/// with an egress proxy, its relay (which reaches the proxy through the descriptor
/// agentctl gives the command, not through the socket's path); then `--`, after which the
/// agent's argv goes.
pub(super) fn argv(
    bwrap: Vec<OsString>,
    sandbox: &SandboxSettings,
    place: &Place,
    egress: bool,
) -> Vec<OsString> {
    let mut args = Args(bwrap);
    // Its processes die with the agent's sidecar, and every one of them — a `setsid`
    // grandchild too — with the sandbox's first process (the pid namespace's end).
    args.push(&["--die-with-parent", "--unshare-pid", "--unshare-ipc"]);
    if sandbox.network != NetworkAccess::Host {
        args.push(&["--unshare-net"]);
    }
    match sandbox.filesystem {
        FilesystemAccess::Host => args.push(&["--dev-bind", "/", "/", "--proc", "/proc"]),
        FilesystemAccess::Workspace => workspace_only(&mut args, sandbox, place),
    }
    args.push(&["--"]);
    if let Some((program, prefix)) = place.agentctl.split_first().filter(|_| egress) {
        args.0.push(program.clone());
        args.0.extend(prefix.iter().cloned());
        let socket = protocol::control::EGRESS_SOCKET_INSIDE;
        args.push(&["relay", "--socket", socket, "--listen", super::PROXY_INSIDE, "--"]);
    }
    args.0
}

/// The mounts of `filesystem = "workspace"`: the system read-only, fresh `/proc`, `/dev`,
/// `/tmp` and home, what the agent's command runs (read-only), what the profile lists, the
/// agent's own state, its workspace and git dir (read-write).
fn workspace_only(args: &mut Args, sandbox: &SandboxSettings, place: &Place) {
    for dir in SYSTEM.map(Path::new) {
        match std::fs::read_link(dir) {
            Ok(target) => {
                args.0.push("--symlink".into());
                args.0.push(target.into());
                args.0.push(dir.into());
            }
            Err(_) => args.same("--ro-bind-try", dir),
        }
    }
    args.push(&["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]);
    let home = place.home.as_deref();
    if let Some(home) = home {
        args.0.push("--tmpfs".into());
        args.0.push(home.into());
    }
    let runs: Vec<PathBuf> =
        place.argv.iter().chain(&place.agentctl).flat_map(runtime_of).collect();
    for dir in dedup(runs) {
        args.same("--ro-bind", &dir);
    }
    for path in sandbox.readable.iter().filter_map(|path| expand(path, home)) {
        args.same("--ro-bind-try", &path);
    }
    for path in sandbox.writable.iter().filter_map(|path| expand(path, home)) {
        args.same("--bind-try", &path);
    }
    if let Some(home) = home {
        for (host, under_home) in &place.agent_state {
            args.mount("--bind", host, &home.join(under_home));
        }
    }
    args.same("--bind", &place.workspace);
    if let Some(git_dir) = &place.git_dir {
        args.same("--bind", git_dir);
    }
    args.0.push("--chdir".into());
    args.0.push(place.workspace.clone().into());
}

/// What must be readable for `word` of an agent's argv to run, when it names a file
/// outside the system: its `node_modules` tree, its Python virtualenv, or the file itself
/// — as written (without `.` and `..`) and where its links lead.
fn runtime_of(word: &OsString) -> Vec<PathBuf> {
    let path = Path::new(word);
    if !path.is_absolute() || !path.exists() {
        return Vec::new();
    }
    let written = lexical(path);
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| written.clone());
    let mut found = Vec::new();
    for path in [written, real] {
        if SYSTEM.iter().any(|dir| path.starts_with(dir)) {
            continue;
        }
        // The outermost node_modules: a package's dependencies may sit beside it.
        let modules =
            path.ancestors().filter(|dir| dir.file_name() == Some("node_modules".as_ref()));
        let venv = || path.ancestors().find(|dir| dir.join("pyvenv.cfg").is_file());
        let root = modules.last().or_else(venv).unwrap_or(&path);
        found.push(root.to_owned());
    }
    found
}

/// `path` without `.` and `..` components, read as written (links not followed).
pub(super) fn lexical(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// `paths` without any that another one holds.
fn dedup(mut paths: Vec<PathBuf>) -> Vec<PathBuf> {
    paths.sort();
    let mut kept: Vec<PathBuf> = Vec::new();
    for path in paths {
        if !kept.iter().any(|outer| path.starts_with(outer)) {
            kept.push(path);
        }
    }
    kept
}

/// bubblewraps that made a sandbox here already.
static WORKS: Mutex<Option<HashSet<Vec<OsString>>>> = Mutex::new(None);

/// Whether `bwrap` can make a sandbox on this machine: asked once per daemon (a failure is
/// asked again at the next launch: the machine may have been fixed).
pub(super) async fn probe(bwrap: &[OsString]) -> Result<(), SandboxError> {
    let known = |works: &mut Option<HashSet<_>>| works.get_or_insert_default().contains(bwrap);
    if known(&mut WORKS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)) {
        return Ok(());
    }
    let (program, prefix) = bwrap.split_first().ok_or(SandboxError::NoBwrap)?;
    let output = tokio::process::Command::new(program)
        .args(prefix)
        .args(["--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "--", "true"])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await;
    match output {
        Ok(output) if output.status.success() => {
            let mut works = WORKS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            works.get_or_insert_default().insert(bwrap.to_vec());
            Ok(())
        }
        Ok(output) => {
            let said = String::from_utf8_lossy(&output.stderr).trim().to_owned();
            let detail = if said.is_empty() { output.status.to_string() } else { said };
            Err(SandboxError::Unsupported { detail })
        }
        Err(err) => Err(SandboxError::Unsupported {
            detail: format!("{} cannot be run: {err}", Path::new(program).display()),
        }),
    }
}
