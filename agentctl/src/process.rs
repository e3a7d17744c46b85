//! Process plumbing shared by agentctl and its clients: waiting for any process to exit
//! through a pidfd (an event, not a poll), signalling process groups, and finding this
//! process's children (which, as a subreaper, include orphaned grandchildren).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

use tokio::io::unix::AsyncFd;

/// A handle on a process that becomes readable when it exits. Works for processes that are
/// not our children.
#[derive(Debug)]
pub struct PidFd {
    pid: u32,
    fd: AsyncFd<OwnedFd>,
}

impl PidFd {
    /// Opens a pidfd for `pid`. Fails with `ESRCH` when no such process exists.
    pub fn open(pid: u32) -> io::Result<PidFd> {
        let pid_arg = nix::libc::pid_t::try_from(pid)
            .map_err(|_| io::Error::from_raw_os_error(nix::libc::ESRCH))?;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; no memory
        // is shared with the kernel.
        let raw = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid_arg, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the syscall returned a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
        // SAFETY: `OwnedFd` keeps the descriptor open and unchanged for as long as the AsyncFd
        // owns it.
        let fd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
            .map_err(|err| err.into_parts().1)?;
        Ok(PidFd { pid, fd })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// SIGKILLs the process through the pidfd, so the signal cannot reach a recycled pid.
    /// A process that already exited is not an error.
    pub fn kill(&self) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let raw = self.fd.get_ref().as_raw_fd();
        // SAFETY: pidfd_send_signal takes an fd we own, a signal number, a null info pointer
        // and zero flags; no memory is shared with the kernel.
        let done = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_pidfd_send_signal,
                raw,
                nix::libc::SIGKILL,
                std::ptr::null::<nix::libc::siginfo_t>(),
                0,
            )
        };
        if done < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(nix::libc::ESRCH) {
                return Err(err);
            }
        }
        Ok(())
    }

    /// Waits until the process has exited (or become a zombie).
    pub async fn exited(&self) -> io::Result<()> {
        let _guard = self.fd.readable().await?;
        Ok(())
    }
}

/// Whether a process exists (it may be a zombie).
pub fn is_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else { return false };
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

/// Whether a process has exited and waits to be reaped (a zombie): it exists, but is dead.
pub fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit(')').next().map(|rest| rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

/// Sends `signal` to process group `pgid`; a group that no longer exists is not an error.
pub fn signal_group(pgid: u32, signal: nix::sys::signal::Signal) -> io::Result<()> {
    let Ok(pgid) = i32::try_from(pgid) else { return Ok(()) };
    match nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
        Err(errno) => Err(io::Error::from(errno)),
    }
}

/// The pids of this process's children, from `/proc/self/task/*/children`.
pub fn own_children() -> Vec<u32> {
    let mut pids = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return pids };
    for task in tasks.flatten() {
        if let Ok(children) = std::fs::read_to_string(task.path().join("children")) {
            pids.extend(children.split_whitespace().filter_map(|pid| pid.parse::<u32>().ok()));
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}
