//! One daemon per data directory: `daemon.lock`, held by the daemon for its life with an
//! open-file-description lock (`F_OFD_SETLK`), and `daemon.json`, where the holder records
//! its pid and, once it serves, its address.
//!
//! Why this shape:
//! - The kernel drops the lock with the daemon's last descriptor, so a SIGKILLed daemon
//!   never leaves a stale lock; the file itself stays and means nothing on its own.
//! - The descriptor is close-on-exec: sidecars and agents the daemon spawns never hold it,
//!   so a sidecar that outlives its daemon does not keep the next one out.
//! - `F_OFD_GETLK` asks whether someone holds the lock without taking it, so a client
//!   looking for the running daemon never makes a starting one fail.
//! - `daemon.json` is trusted only while the lock is held: a record left by a daemon that
//!   died names nobody.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::fcntl::{FcntlArg, fcntl};
use nix::libc;
use serde::{Deserialize, Serialize};

/// The lock file's name in the data directory.
pub const LOCK_FILE: &str = "daemon.lock";
/// The running daemon's record's name in the data directory.
pub const RECORD_FILE: &str = "daemon.json";

/// What the daemon holding a data directory says of itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonRecord {
    /// Its process id.
    pub pid: u32,
    /// Where its API serves (`ws://ADDR`), once it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// When it took the lock (ms since the epoch).
    pub started_at_ms: i64,
}

/// Why the data directory's lock was not taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Another daemon holds it.
    #[error("{}", held_message(.root, .holder.as_ref()))]
    Held {
        /// The data directory.
        root: PathBuf,
        /// What the holder recorded, if it did yet.
        holder: Option<DaemonRecord>,
    },
    /// The lock file could not be opened or locked.
    #[error("cannot lock the data directory ({}): {source}", .path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
}

fn held_message(root: &Path, holder: Option<&DaemonRecord>) -> String {
    let who = match holder {
        Some(DaemonRecord { pid, url: Some(url), .. }) => format!("(pid {pid}) serving at {url}"),
        Some(DaemonRecord { pid, url: None, .. }) => format!("(pid {pid}, still starting)"),
        None => "(still starting)".to_owned(),
    };
    format!(
        "another Tether daemon {who} already uses the data directory {}: one daemon per data \
         directory. Use that one (supervisor --url …), stop it first, or pass another --home",
        root.display()
    )
}

/// The daemon's hold on its data directory: released when dropped (or when the process
/// dies, however it dies).
#[derive(Debug)]
pub struct DaemonLock {
    /// Kept open for the lock's life: closing it releases the lock.
    _file: File,
    root: PathBuf,
    record: DaemonRecord,
}

impl DaemonLock {
    /// Takes the lock of the data directory `root` (which must exist) without waiting, and
    /// records this process as its holder. Fails with [`LockError::Held`], naming the
    /// holder, while another daemon holds it.
    pub fn acquire(root: &Path) -> Result<DaemonLock, LockError> {
        let path = root.join(LOCK_FILE);
        let io_error = |source| LockError::Io { path: path.clone(), source };
        let file = open_lock_file(&path).map_err(io_error)?;
        let request = whole_file(libc::F_WRLCK);
        match fcntl(file.as_fd(), FcntlArg::F_OFD_SETLK(&request)) {
            Ok(_) => {}
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => {
                let holder = read_record(root);
                // The recorded daemon is gone, yet the lock is held: a process it was
                // forking when it died still shares the lock until it runs its program
                // (the descriptor is close-on-exec). That takes moments: wait that long.
                let gone = holder.as_ref().is_none_or(|holder| !is_alive(holder.pid));
                if !(gone && wait_for(&file, HANDOVER)) {
                    return Err(LockError::Held { root: root.to_owned(), holder });
                }
            }
            Err(errno) => return Err(io_error(errno.into())),
        }
        let record = DaemonRecord {
            pid: std::process::id(),
            url: None,
            started_at_ms: crate::store::now_ms(),
        };
        let lock = DaemonLock { _file: file, root: root.to_owned(), record };
        lock.write_record().map_err(io_error)?;
        Ok(lock)
    }

    /// Records where the API serves, for clients that look for the daemon of this data
    /// directory (`supervisor acp` started by an editor, the CLI without `--url`).
    pub fn announce(&mut self, url: &str) -> io::Result<()> {
        self.record.url = Some(url.to_owned());
        self.write_record()
    }

    fn write_record(&self) -> io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.root.join(RECORD_FILE);
        let partial = self.root.join(format!("{RECORD_FILE}.partial"));
        let text = serde_json::to_string(&self.record).map_err(io::Error::other)?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&partial)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&partial, &path)
    }
}

/// The daemon that holds the data directory `root`, if one does (what it recorded; `None`
/// also when nobody holds the lock, whatever `daemon.json` says). Takes no lock.
pub fn running(root: &Path) -> Option<DaemonRecord> {
    let file = File::open(root.join(LOCK_FILE)).ok()?;
    let mut probe = whole_file(libc::F_WRLCK);
    fcntl(file.as_fd(), FcntlArg::F_OFD_GETLK(&mut probe)).ok()?;
    if i32::from(probe.l_type) == libc::F_UNLCK {
        return None;
    }
    read_record(root)
}

/// How long a lock whose recorded holder is gone may take to be let go.
const HANDOVER: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether process `pid` exists.
fn is_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else { return false };
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

/// Takes the lock of `file`, waiting for it (`F_OFD_SETLKW`) at most `bound`; whether it
/// was taken. The waiting thread is left behind when the bound passes (the caller then
/// gives up and exits).
fn wait_for(file: &File, bound: std::time::Duration) -> bool {
    let Ok(waiting) = file.try_clone() else { return false };
    let (taken_tx, taken_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let request = whole_file(libc::F_WRLCK);
        let _ = taken_tx.send(fcntl(waiting.as_fd(), FcntlArg::F_OFD_SETLKW(&request)).is_ok());
    });
    taken_rx.recv_timeout(bound).unwrap_or(false)
}

fn read_record(root: &Path) -> Option<DaemonRecord> {
    let text = std::fs::read_to_string(root.join(RECORD_FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

fn open_lock_file(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    // std opens close-on-exec: no child of the daemon inherits the lock.
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
}

/// A lock request of `kind` over the whole file (OFD locks need `l_pid` 0).
fn whole_file(kind: libc::c_int) -> libc::flock {
    // SAFETY: `flock` is a plain C struct for which all zeroes is a valid value.
    let mut request: libc::flock = unsafe { std::mem::zeroed() };
    request.l_type = kind as _;
    request.l_whence = libc::SEEK_SET as _;
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_naming_the_first_and_the_lock_goes_with_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = DaemonLock::acquire(dir.path()).unwrap();
        first.announce("ws://127.0.0.1:17703").unwrap();
        let running_now = running(dir.path()).expect("a daemon holds it");
        assert_eq!(running_now.url.as_deref(), Some("ws://127.0.0.1:17703"));
        assert_eq!(running_now.pid, std::process::id());
        // OFD locks conflict between open file descriptions, also in one process.
        match DaemonLock::acquire(dir.path()) {
            Err(err @ LockError::Held { .. }) => {
                let message = err.to_string();
                assert!(message.contains("ws://127.0.0.1:17703"), "{message}");
                assert!(message.contains(&std::process::id().to_string()), "{message}");
            }
            other => panic!("a second lock must be refused: {other:?}"),
        }
        drop(first);
        assert_eq!(running(dir.path()), None, "a record without its lock names nobody");
        let again = DaemonLock::acquire(dir.path()).expect("free once the first is gone");
        assert_eq!(running(dir.path()).map(|record| record.url), Some(None));
        drop(again);
    }
}
