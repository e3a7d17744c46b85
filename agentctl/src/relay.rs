//! `agentctl relay`: the agent's parent inside its sandbox when its network is an
//! allowlist. The sandbox has a network namespace of its own with nothing but loopback;
//! the relay listens there (`--listen`, the agent's `http_proxy`) and carries each
//! connection to the egress proxy's Unix socket (`--socket`, bound into the sandbox), which
//! agentctl serves outside. It runs the agent (`-- program args…`) with its own stdin,
//! stdout and stderr, leaves signals to it (SIGTERM and SIGINT reach the agent's whole
//! group; the relay outlives them so the agent can stop in its own time), and exits as the
//! agent did.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;

use anyhow::Context as _;
use nix::sys::signal::{SigHandler, Signal};
use tokio::net::{TcpListener, UnixStream};

/// Where the relay listens unless told: the agent's `http_proxy` inside its sandbox.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:3128";

/// What `agentctl relay` was asked.
#[derive(Debug, PartialEq, Eq)]
struct RelayArgs {
    socket: PathBuf,
    listen: SocketAddr,
    command: Vec<String>,
}

fn parse(args: &[String]) -> anyhow::Result<RelayArgs> {
    let mut socket = None;
    let mut listen = DEFAULT_LISTEN.parse().expect("UNWRAP: a literal address");
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let mut value = || rest.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--socket" => socket = Some(PathBuf::from(value()?)),
            "--listen" => {
                let text = value()?;
                listen = text.parse().with_context(|| format!("--listen {text}: not ip:port"))?;
            }
            "--" => break,
            other => anyhow::bail!("relay: unknown argument {other}"),
        }
    }
    let command: Vec<String> = rest.cloned().collect();
    anyhow::ensure!(!command.is_empty(), "relay: no command after --");
    let socket = socket.context("relay: --socket is required")?;
    Ok(RelayArgs { socket, listen, command })
}

/// Runs `agentctl relay` with `args`; the agent's exit code (128 + its signal when killed),
/// or 2 when the relay could not start it.
pub fn main(args: &[String]) -> i32 {
    let run = || -> anyhow::Result<i32> {
        let args = parse(args)?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(relay(args))
    };
    match run() {
        Ok(code) => code,
        Err(err) => {
            eprintln!("agentctl relay: {err:#}");
            2
        }
    }
}

async fn relay(args: RelayArgs) -> anyhow::Result<i32> {
    // The descriptor the socket came on is the relay's, not the agent's.
    if let Some(fd) = args.socket.to_str().and_then(|path| path.strip_prefix("/proc/self/fd/")) {
        let fd: std::os::fd::RawFd = fd.parse().context("--socket /proc/self/fd/N")?;
        // SAFETY: the descriptor was given to this process and stays open in it.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let cloexec = nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC);
        nix::fcntl::fcntl(fd, cloexec).context("the egress descriptor")?;
    }
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {} in the sandbox", args.listen))?;
    let mut command = tokio::process::Command::new(&args.command[0]);
    command.args(&args.command[1..]).stdin(Stdio::inherit()).stdout(Stdio::inherit());
    // SAFETY: prctl only, async-signal-safe, between fork and exec.
    unsafe {
        command.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
    let mut agent = command.spawn().with_context(|| format!("cannot start {}", args.command[0]))?;
    // After the spawn (an ignored signal would stay ignored in the agent): the agent's group
    // gets these, and the relay waits for the agent to act on them.
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        // SAFETY: SIG_IGN installs no handler code.
        unsafe { nix::sys::signal::signal(signal, SigHandler::SigIgn) }?;
    }
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            status = agent.wait() => {
                let status = status?;
                use std::os::unix::process::ExitStatusExt;
                return Ok(status.code().or(status.signal().map(|signal| 128 + signal)).unwrap_or(1));
            }
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                connections.spawn(carry(client, args.socket.clone()));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// One of the agent's connections, carried to the egress proxy.
async fn carry(mut client: tokio::net::TcpStream, socket: PathBuf) {
    match UnixStream::connect(&socket).await {
        Ok(mut proxy) => {
            let _ = tokio::io::copy_bidirectional(&mut client, &mut proxy).await;
        }
        Err(err) => eprintln!("agentctl relay: cannot reach the egress proxy: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|arg| (*arg).to_owned()).collect()
    }

    #[test]
    fn the_relay_takes_its_socket_and_the_agents_command() {
        let parsed = parse(&strings(&["--socket", "/s", "--", "agent", "--flag"])).unwrap();
        assert_eq!(parsed.socket, PathBuf::from("/s"));
        assert_eq!(parsed.listen, DEFAULT_LISTEN.parse().unwrap());
        assert_eq!(parsed.command, ["agent", "--flag"]);
        let parsed =
            parse(&strings(&["--listen", "127.0.0.1:9", "--socket", "/s", "--", "a"])).unwrap();
        assert_eq!(parsed.listen, "127.0.0.1:9".parse().unwrap());
    }

    #[test]
    fn a_relay_without_what_it_needs_says_so() {
        for (args, said) in [
            (&["--", "agent"][..], "--socket is required"),
            (&["--socket", "/s", "--"][..], "no command"),
            (&["--socket"][..], "needs a value"),
            (&["--listen", "nowhere", "--socket", "/s", "--", "a"][..], "not ip:port"),
            (&["--what"][..], "unknown argument"),
        ] {
            let err = parse(&strings(args)).unwrap_err();
            assert!(format!("{err:#}").contains(said), "{args:?}: {err:#}");
        }
    }
}
