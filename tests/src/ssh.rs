//! An sshd of the test's own, with a host key and a client key made for it: how a test
//! reaches a Docker engine over `ssh://` (the engine's host runs `docker system dial-stdio`
//! for each connection, as for the Docker CLI).
//!
//! bollard's ssh transport cannot pass a port, and ssh reads its config and known hosts
//! from the user's passwd home, not `$HOME`; so the sshd listens on port 22 of a loopback
//! address of its own (`127.x.y.z`, picked at random), and the user's `~/.ssh` — where ssh
//! records the new host key — is put back as it was when the sshd is dropped. Killed, with
//! the ssh masters that used its key, and its files removed, when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::docker::docker_required;

/// A running private sshd.
pub struct PrivateSshd {
    dir: tempfile::TempDir,
    ip: std::net::Ipv4Addr,
    child: tokio::process::Child,
    /// The user's `~/.ssh`, whether it existed, and its `known_hosts` as it was.
    user_ssh: PathBuf,
    user_ssh_existed: bool,
    known_hosts_before: Option<Vec<u8>>,
}

impl PrivateSshd {
    /// Starts one, or `None` after printing the SKIPPED line (a failure when Docker is
    /// required): it needs root, `/usr/sbin/sshd` (scripts/setup.sh installs it) and
    /// `ssh-keygen`.
    pub async fn start() -> Option<PrivateSshd> {
        let sshd = Path::new("/usr/sbin/sshd");
        if !(nix::unistd::Uid::effective().is_root() && sshd.is_file()) {
            assert!(
                !docker_required(),
                "REQUIRE_DOCKER=1 but no sshd can be started (root and /usr/sbin/sshd are needed; scripts/setup.sh installs it)"
            );
            eprintln!("SKIPPED: no private sshd (it needs root and /usr/sbin/sshd)");
            return None;
        }
        let dir = tempfile::tempdir().expect("a temp dir");
        for key in ["host_key", "client_key"] {
            let status = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(dir.path().join(key))
                .status()
                .expect("run ssh-keygen");
            assert!(status.success(), "ssh-keygen {key}");
        }
        std::fs::copy(dir.path().join("client_key.pub"), dir.path().join("authorized_keys"))
            .expect("authorized_keys");
        // sshd's privilege separation directory.
        std::fs::create_dir_all("/run/sshd").expect("/run/sshd");
        let seed = uuid::Uuid::new_v4().as_bytes().to_owned();
        let ip = std::net::Ipv4Addr::new(127, 200 + seed[0] % 50, seed[1], 1 + seed[2] % 250);
        let user_ssh = user_home().join(".ssh");
        let user_ssh_existed = user_ssh.is_dir();
        let known_hosts_before = std::fs::read(user_ssh.join("known_hosts")).ok();
        let config = format!(
            "Port 22\nListenAddress {ip}\nHostKey {0}/host_key\nAuthorizedKeysFile {0}/authorized_keys\n\
             PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             UsePAM no\nStrictModes no\nPidFile {0}/sshd.pid\n",
            dir.path().display()
        );
        std::fs::write(dir.path().join("sshd_config"), config).expect("sshd_config");
        let mut command = tokio::process::Command::new(sshd);
        command.arg("-D").arg("-e").arg("-f").arg(dir.path().join("sshd_config"));
        let child = crate::spawn_until_ready(command, "Server listening on", "sshd").await;
        Some(PrivateSshd { dir, ip, child, user_ssh, user_ssh_existed, known_hosts_before })
    }

    /// `ssh://USER@127.x.y.z`, as this user.
    pub fn url(&self) -> String {
        format!("ssh://{}@{}", user_name(), self.ip)
    }

    /// Its address.
    pub fn ip(&self) -> std::net::Ipv4Addr {
        self.ip
    }

    /// The client's private key.
    pub fn key(&self) -> PathBuf {
        self.dir.path().join("client_key")
    }
}

impl Drop for PrivateSshd {
    fn drop(&mut self) {
        // The ssh masters a daemon started with this key (their command line names it),
        // which ended the sessions they hold; then the listener.
        let needle = self.dir.path().to_string_lossy().into_owned();
        for pid in processes_naming(&needle) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.child.start_kill();
        // The user's ~/.ssh as it was.
        if !self.user_ssh_existed {
            let _ = std::fs::remove_dir_all(&self.user_ssh);
        } else {
            let known_hosts = self.user_ssh.join("known_hosts");
            let _ = match &self.known_hosts_before {
                Some(before) => std::fs::write(&known_hosts, before),
                None => std::fs::remove_file(&known_hosts),
            };
        }
    }
}

fn this_user() -> Option<nix::unistd::User> {
    nix::unistd::User::from_uid(nix::unistd::Uid::effective()).ok().flatten()
}

fn user_name() -> String {
    this_user().map_or_else(|| "root".to_owned(), |user| user.name)
}

/// The home ssh uses: the passwd entry's, not `$HOME`.
fn user_home() -> PathBuf {
    this_user().map_or_else(|| PathBuf::from("/root"), |user| user.dir)
}

/// Pids of the processes whose command line contains `needle` (this one excepted).
pub fn processes_naming(needle: &str) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(needle))
        })
        .collect()
}
