//! A cgroup per local session, where cgroup v2 can be written: agentctl is moved into
//! `<the daemon's cgroup>/tether-<install id>/<session id>` as soon as it is up, so the
//! agent and everything it starts — also what leaves the agent's process group with
//! `setsid` or `setpgid` — is in it, and fencing the session (which stop, delete and every
//! relaunch do) kills it whole through `cgroup.kill`. Without cgroup v2 (or without the
//! right to create a subtree, or on a kernel before 5.14), what leaves the agent's group
//! outlives a SIGKILLed agentctl: the daemon says so once at start, and ARCHITECTURE.md.

use crate::ids::SessionId;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The daemon's subtree of cgroup v2.
#[derive(Debug, Clone)]
pub struct Cgroups {
    base: PathBuf,
}

impl Cgroups {
    /// Creates (or finds) `tether-<install_id>` under this process's cgroup v2; `None`,
    /// with the reason, where that cannot be done.
    pub fn open(install_id: &str) -> Result<Cgroups, String> {
        let mount = v2_mount().ok_or("cgroup v2 is not mounted")?;
        let own = own_cgroup().ok_or("this process has no cgroup v2 path")?;
        let base = mount.join(own.trim_start_matches('/')).join(format!("tether-{install_id}"));
        match std::fs::create_dir(&base) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(format!("cannot create {}: {err}", base.display())),
        }
        if !base.join("cgroup.kill").exists() {
            return Err(format!("{} has no cgroup.kill (Linux 5.14 or later)", base.display()));
        }
        Ok(Cgroups { base })
    }

    /// The session's cgroup.
    pub fn session(&self, session_id: &SessionId) -> PathBuf {
        self.base.join(session_id)
    }

    /// The session's cgroup, created if needed (for `agentctl::client::LaunchConfig`, which
    /// moves the sidecar into it).
    pub fn prepare(&self, session_id: &SessionId) -> io::Result<PathBuf> {
        let dir = self.session(session_id);
        match std::fs::create_dir(&dir) {
            Err(err) if err.kind() != io::ErrorKind::AlreadyExists => Err(err),
            _ => Ok(dir),
        }
    }

    /// Kills every process in the session's cgroup, waits (at most `bound`) until it is
    /// empty, and removes it. Nothing to do when it does not exist.
    pub async fn kill(&self, session_id: &SessionId, bound: Duration) -> io::Result<()> {
        let dir = self.session(session_id);
        match std::fs::write(dir.join("cgroup.kill"), "1") {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(err) => return Err(err),
        }
        let watched = dir.clone();
        tokio::task::spawn_blocking(move || wait_empty(&watched, bound))
            .await
            .map_err(io::Error::other)??;
        match std::fs::remove_dir(&dir) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
            _ => Ok(()),
        }
    }
}

/// Kills everything in an installation's subtree and removes what is already empty, best
/// effort: for test harnesses that SIGKILL a daemon and its sidecars (a daemon leaves its
/// sessions' cgroups to their sidecars, which outlive it on purpose).
pub fn discard(install_id: &str) {
    let Ok(cgroups) = Cgroups::open(install_id) else { return };
    let _ = std::fs::write(cgroups.base.join("cgroup.kill"), "1");
    if let Ok(entries) = std::fs::read_dir(&cgroups.base) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                let _ = wait_empty(&entry.path(), Duration::from_secs(5));
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(&cgroups.base);
}

/// Waits, blocking the thread, until the cgroup at `dir` holds no process (`populated 0`
/// in `cgroup.events`, whose every change the kernel reports as a modification) or `bound`
/// passed. Exited processes count until they are reaped, so waiting for them alone is not
/// enough to remove the cgroup.
fn wait_empty(dir: &Path, bound: Duration) -> io::Result<()> {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    use std::os::fd::AsFd;
    let events = dir.join("cgroup.events");
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
    inotify.add_watch(&events, AddWatchFlags::IN_MODIFY)?;
    let deadline = std::time::Instant::now() + bound;
    loop {
        // Read after the watch is set: a change in between is not missed.
        if std::fs::read_to_string(&events)?.lines().any(|line| line == "populated 0") {
            return Ok(());
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let millis = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [nix::poll::PollFd::new(inotify.as_fd(), nix::poll::PollFlags::POLLIN)];
        if left.is_zero() || nix::poll::poll(&mut fds, millis)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{} still holds processes after {bound:?}", dir.display()),
            ));
        }
        match inotify.read_events() {
            Ok(_) | Err(nix::errno::Errno::EAGAIN) => {}
            Err(err) => return Err(err.into()),
        }
    }
}

/// Where cgroup v2 is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` beside v1).
fn v2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        if after.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        before.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// This process's cgroup v2 path (`0::/path` in `/proc/self/cgroup`).
fn own_cgroup() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|line| line.strip_prefix("0::").map(str::to_owned))
}
