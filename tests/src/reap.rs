//! What a test leaves running when its process dies without cleaning up (an abort, a stack
//! overflow, a SIGKILL: no `Drop` runs). The harness marks each directory its processes
//! run under (a daemon's root, a browser's profile) with the test process's identity;
//! `target/debug/reap-orphans` (run by `scripts/test.sh` before and after the tests) finds
//! the marks whose test process is gone, kills every process still naming that directory,
//! discards the daemon's cgroups and containers and removes the directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The mark's file name in a directory the harness owns.
pub const OWNER_FILE: &str = ".tether-test-owner";

/// How long a SIGKILLed process may take to be gone.
const DEATH_WAIT: Duration = Duration::from_secs(10);

/// Marks `dir` as this test process's: `pid start-time`, so a recycled pid is not taken
/// for it.
pub fn own(dir: &Path) {
    let pid = std::process::id();
    let started = agentctl::ready::process_start_time(pid).unwrap_or_default();
    std::fs::write(dir.join(OWNER_FILE), format!("{pid} {started}\n"))
        .expect("write the test owner mark");
}

/// Whether the test process named by a mark's text is still running.
fn owner_alive(mark: &str) -> bool {
    let mut fields = mark.split_whitespace().map(str::parse::<u64>);
    let (Some(Ok(pid)), Some(Ok(started))) = (fields.next(), fields.next()) else {
        // Unreadable (half-written by a test that died there): its test is gone too.
        return false;
    };
    let Ok(pid) = u32::try_from(pid) else { return false };
    agentctl::ready::process_start_time(pid).is_ok_and(|now| now == started)
}

/// The pids of the running processes whose command line mentions `needle` (not zombies,
/// not this process).
pub fn processes_mentioning(needle: &Path) -> Vec<u32> {
    let needle = needle.to_string_lossy().into_owned();
    let own = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()))
        .filter(|&pid| pid != own && !agentctl::process::is_zombie(pid))
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains(&needle)
        })
        .collect()
}

/// The directories under `tmp` marked by a test process that is gone.
pub fn orphaned(tmp: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(tmp) else { return Vec::new() };
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|dir| match std::fs::read_to_string(dir.join(OWNER_FILE)) {
            Ok(mark) => !owner_alive(&mark),
            Err(_) => false,
        })
        .collect();
    dirs.sort();
    dirs
}

/// What [`reap`] did to one directory.
#[derive(Debug)]
pub struct Reaped {
    /// The processes killed.
    pub killed: Vec<u32>,
    /// The processes that did not die in time (their pids).
    pub survivors: Vec<u32>,
    /// The daemon's containers removed.
    pub containers: usize,
}

/// Kills what runs under an orphaned directory (waiting for each to be gone), discards the
/// cgroups and removes the containers of the daemon rooted there, and removes it.
pub async fn reap(dir: &Path) -> Reaped {
    let mut killed = Vec::new();
    let mut survivors = Vec::new();
    // Killed until none is left: a daemon killed mid-launch cannot start another, but one
    // started just before the kill shows up in the next look.
    loop {
        let pids = processes_mentioning(dir);
        if pids.is_empty() {
            break;
        }
        let mut waits = Vec::new();
        for pid in pids {
            if survivors.contains(&pid) {
                continue;
            }
            // Opened first: the pid cannot be recycled while the pidfd is held.
            let Ok(pidfd) = agentctl::process::PidFd::open(pid) else { continue };
            if pidfd.kill().is_ok() {
                waits.push(pidfd);
            }
        }
        if waits.is_empty() {
            break;
        }
        for pidfd in waits {
            match tokio::time::timeout(DEATH_WAIT, pidfd.exited()).await {
                Ok(_) => killed.push(pidfd.pid()),
                Err(_) => survivors.push(pidfd.pid()),
            }
        }
    }
    let mut containers = 0;
    if let Ok(install_id) = std::fs::read_to_string(dir.join("tether/install_id")) {
        supervisor::runtime::cgroup::discard(install_id.trim());
        containers = remove_containers(install_id.trim()).await;
    }
    let _ = std::fs::remove_dir_all(dir);
    Reaped { killed, survivors, containers }
}

/// Removes the containers of the daemon with this install id (their `tether.install_id`
/// label) on the local engine and on the second one `scripts/setup.sh` starts; how many.
async fn remove_containers(install_id: &str) -> usize {
    let label = format!("tether.install_id={install_id}");
    let mut removed = crate::docker::remove_labelled(&label, None).await;
    let second = std::env::var("TETHER_SECOND_DOCKER_HOST").ok().filter(|host| !host.is_empty());
    if let Some(host) = second
        && let Ok(docker) =
            bollard::Docker::connect_with_http(&host, 120, bollard::API_DEFAULT_VERSION)
    {
        removed += crate::docker::remove_labelled_on(&docker, &label, None).await;
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_of_this_process_is_alive_and_a_recycled_or_broken_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        own(dir.path());
        let mark = std::fs::read_to_string(dir.path().join(OWNER_FILE)).unwrap();
        assert!(owner_alive(&mark), "{mark}");
        let pid = std::process::id();
        assert!(!owner_alive(&format!("{pid} 1")), "another start time: a recycled pid");
        assert!(!owner_alive(""), "an empty mark");
        assert!(!owner_alive("12x 5"), "a broken mark");
        assert!(orphaned(dir.path().parent().unwrap()).iter().all(|d| d != dir.path()));
    }
}
