//! Readiness and identity: the ready line and `ready.json`, and the facts that tell a live
//! agentctl from a recycled pid (boot id and process start time).

use std::io::{self, Write};
use std::path::Path;

use protocol::control::ReadyInfo;

/// The name of the ready file in the state dir.
pub const READY_FILE: &str = "ready.json";

/// The kernel's boot id, which changes on every boot.
pub fn boot_id() -> io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?.trim().to_owned())
}

/// A process's start time in clock ticks since boot (`/proc/<pid>/stat`, field 22).
pub fn process_start_time(pid: u32) -> io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_start_time(&stat).ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidData, format!("unexpected /proc/{pid}/stat format"))
    })
}

/// Field 22 of a stat line. The command name (field 2) may hold spaces and parentheses, so
/// fields are counted after its last `)`.
fn parse_start_time(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // After the command come fields 3, 4, …; field 22 is the 20th of them.
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

/// This process's ready info for `port`.
pub fn ready_info(listening: &crate::client::ControlAddr) -> io::Result<ReadyInfo> {
    use crate::client::ControlAddr;
    let pid = std::process::id();
    let (port, socket) = match listening {
        ControlAddr::Tcp(addr) => (addr.port(), None),
        ControlAddr::Unix(path) => (0, Some(path.clone())),
    };
    Ok(ReadyInfo {
        pid,
        port,
        socket,
        start_time: process_start_time(pid)?,
        boot_id: boot_id()?,
        version: env!("CARGO_PKG_VERSION").to_owned(),
    })
}

/// Writes `ready.json` atomically (temporary file, then rename; mode 0600) and prints the
/// same object as one line on stdout. That line is the readiness signal.
pub fn announce(state_dir: &Path, info: &ReadyInfo) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let json = serde_json::to_string(info).expect("UNWRAP: ReadyInfo always serialises");
    let tmp = state_dir.join(".ready.json.tmp");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(json.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, state_dir.join(READY_FILE))?;
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "{json}")?;
    stdout.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_read_after_the_command_name() {
        let stat = "1234 (we ird) name)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 200";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert_eq!(parse_start_time("garbage"), None);
    }

    #[test]
    fn our_own_identity_is_readable() {
        let start = process_start_time(std::process::id()).unwrap();
        assert!(start > 0);
        assert_eq!(boot_id().unwrap().len(), 36);
    }
}
