//! agentctl's command line: `serve` (the sidecar), `call`/`events` (a small operator
//! client) and `guard` (the helper that kills the agent's process group when agentctl
//! dies). A library module so that another binary can embed agentctl as an applet.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::agent::{AgentHost, HostConfig};
use crate::server::{self, Ctl};
use crate::spool::{DEFAULT_SEGMENT_BYTES, Spool};
use anyhow::{Context, bail};
use tokio_util::sync::CancellationToken;

const USAGE: &str = "\
usage:
  agentctl serve --state-dir DIR [--listen ADDR | --listen unix:PATH] [--token-file PATH | --token-stdin]
                 [--max-line BYTES]
                 [--segment-bytes BYTES] [--max-backlog-bytes BYTES] [--stop-grace-ms MS]
                 [--tls-cert PEM --tls-key PEM]
  agentctl call --addr ADDR METHOD [PARAMS_JSON]
  agentctl events --addr ADDR [--after SEQ]
  agentctl guard --pgid PGID
  agentctl relay --socket PATH [--listen IP:PORT] -- PROGRAM [ARGS...]

serve: run the sidecar. The bearer token comes from --token-file (mode 0600), from the
first line of stdin (--token-stdin: what the supervisor uses, so that no process's
environment holds it) or the AGENTCTL_TOKEN environment variable, never from argv. Prints one ready line (JSON) on
stdout once it listens (default 127.0.0.1:0). With --tls-cert and --tls-key the control
channel is served over TLS (wss://), for a supervisor on another host.

call, events: a small client for operators. The token comes from AGENTCTL_TOKEN. `call`
prints the result as JSON; `events` prints every event after SEQ as one JSON line each, then
follows live events until interrupted.

guard: internal. Blocks on stdin; when it closes, SIGKILLs process group PGID.

relay: internal. Inside a confined agent's network namespace, runs PROGRAM and carries
connections to IP:PORT (default 127.0.0.1:3128, its http_proxy) to the egress proxy's socket.
";

struct ServeArgs {
    state_dir: PathBuf,
    listen: crate::client::ControlAddr,
    token_file: Option<PathBuf>,
    /// The token is the first line of stdin.
    token_stdin: bool,
    max_line: usize,
    segment_bytes: u64,
    /// The most the spool may hold unacknowledged before the agent's output waits (`None`:
    /// a quarter of the file system, between two segments and 64 MiB).
    max_backlog: Option<u64>,
    stop_grace: Duration,
    /// The control channel's certificate and key (PEM), for TLS.
    tls: Option<(PathBuf, PathBuf)>,
}

/// Runs agentctl with `args` (without the program name). `self_command` is the argv prefix
/// that runs agentctl again (for the guard). Returns the exit code.
pub fn run(args: &[String], self_command: Vec<std::ffi::OsString>) -> i32 {
    let result = match args.first().map(String::as_str) {
        Some("serve") => {
            parse_serve(&args[1..]).and_then(|serve_args| serve(serve_args, self_command))
        }
        Some("guard") => guard(&args[1..]),
        Some("relay") => return crate::relay::main(&args[1..]),
        Some("call") => client_command(&args[1..], false),
        Some("events") => client_command(&args[1..], true),
        Some("-h" | "--help") => {
            print!("{USAGE}");
            return 0;
        }
        _ => Err(anyhow::anyhow!("expected a command\n\n{USAGE}")),
    };
    match result {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("agentctl: {err:#}");
            2
        }
    }
}

/// The spool's default bound: a quarter of the file system it is on (so the supervisor,
/// often on the same one, keeps room to record and acknowledge), at least two segments
/// (acknowledgements free whole segments), at most 64 MiB.
fn default_backlog(spool_dir: &std::path::Path, segment_bytes: u64) -> u64 {
    let quarter = nix::sys::statvfs::statvfs(spool_dir)
        .map(|fs| fs.blocks().saturating_mul(fs.fragment_size()) / 4)
        .unwrap_or(u64::MAX);
    quarter.clamp(2 * segment_bytes, (64 << 20).max(2 * segment_bytes))
}

fn parse_serve(args: &[String]) -> anyhow::Result<ServeArgs> {
    let mut state_dir = None;
    let mut parsed = ServeArgs {
        state_dir: PathBuf::new(),
        listen: crate::client::ControlAddr::Tcp(
            "127.0.0.1:0".parse().expect("UNWRAP: a literal address"),
        ),
        token_file: None,
        token_stdin: false,
        max_line: protocol::frame::DEFAULT_MAX_LINE,
        segment_bytes: DEFAULT_SEGMENT_BYTES,
        max_backlog: None,
        stop_grace: Duration::from_secs(5),
        tls: None,
    };
    let (mut tls_cert, mut tls_key) = (None, None);
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--state-dir" => state_dir = Some(PathBuf::from(value()?)),
            "--listen" => {
                parsed.listen =
                    value()?.parse().context("--listen: not an address (IP:PORT or unix:PATH)")?
            }
            "--token-file" => parsed.token_file = Some(PathBuf::from(value()?)),
            "--token-stdin" => parsed.token_stdin = true,
            "--tls-cert" => tls_cert = Some(PathBuf::from(value()?)),
            "--tls-key" => tls_key = Some(PathBuf::from(value()?)),
            "--max-line" => {
                parsed.max_line = value()?.parse().context("--max-line: not a number")?
            }
            "--segment-bytes" => {
                parsed.segment_bytes = value()?.parse().context("--segment-bytes: not a number")?
            }
            "--max-backlog-bytes" => {
                parsed.max_backlog =
                    Some(value()?.parse().context("--max-backlog-bytes: not a number")?)
            }
            "--stop-grace-ms" => {
                parsed.stop_grace = Duration::from_millis(
                    value()?.parse().context("--stop-grace-ms: not a number")?,
                )
            }
            other => bail!("unknown argument {other:?}\n\n{USAGE}"),
        }
    }
    parsed.state_dir = state_dir.context("--state-dir is required")?;
    parsed.tls = match (tls_cert, tls_key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => bail!("--tls-cert and --tls-key go together"),
    };
    Ok(parsed)
}

fn read_token(token_file: Option<&PathBuf>, from_stdin: bool) -> anyhow::Result<String> {
    if from_stdin {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).context("--token-stdin: reading stdin")?;
        let token = line.trim().to_owned();
        if token.is_empty() {
            bail!("--token-stdin: stdin holds no token");
        }
        return Ok(token);
    }
    let token = match token_file {
        Some(path) => {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path)
                .with_context(|| format!("token file {}", path.display()))?
                .permissions()
                .mode();
            if mode & 0o077 != 0 {
                bail!(
                    "token file {} must not be readable by others (mode {:o}; use 0600)",
                    path.display(),
                    mode & 0o777
                );
            }
            std::fs::read_to_string(path)
                .with_context(|| format!("token file {}", path.display()))?
                .trim()
                .to_owned()
        }
        None => std::env::var(protocol::control::TOKEN_ENV).unwrap_or_default(),
    };
    if token.is_empty() {
        bail!("no token: pass --token-file or set {}", protocol::control::TOKEN_ENV);
    }
    Ok(token)
}

fn serve(args: ServeArgs, self_command: Vec<std::ffi::OsString>) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AGENTCTL_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let token = read_token(args.token_file.as_ref(), args.token_stdin)?;
    let tls = match &args.tls {
        None => None,
        Some((cert, key)) => {
            let read = |path: &PathBuf| {
                std::fs::read(path).with_context(|| format!("TLS file {}", path.display()))
            };
            let config = crate::tls::server_config(&read(cert)?, &read(key)?)
                .context("--tls-cert/--tls-key")?;
            Some(Arc::new(config))
        }
    };
    // Orphaned descendants of the agent come back to us, so a stop can remove them.
    nix::sys::prctl::set_child_subreaper(true).context("cannot become a child subreaper")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(async move {
        let spool = Arc::new(Spool::create(
            &args.state_dir.join(crate::spool::SPOOL_DIR),
            args.segment_bytes,
        )?);
        let max_backlog = args.max_backlog.unwrap_or_else(|| {
            default_backlog(&args.state_dir.join(crate::spool::SPOOL_DIR), args.segment_bytes)
        });
        let config = HostConfig { max_line: args.max_line, self_command, max_backlog };
        let agent = AgentHost::new(Arc::clone(&spool), config, tokio::runtime::Handle::current());
        let shutdown = CancellationToken::new();
        let ctl = Arc::new(Ctl { spool, agent, shutdown: shutdown.clone() });
        let (addr, handle) = server::serve(args.listen.clone(), &token, Arc::clone(&ctl), tls)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let info =
            crate::ready::ready_info(&addr).context("cannot read this process's identity")?;
        crate::ready::announce(&args.state_dir, &info).context("cannot announce readiness")?;
        tracing::info!(%addr, pid = info.pid, "agentctl ready");

        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = shutdown.cancelled() => tracing::info!("shutdown requested"),
            _ = term.recv() => tracing::info!("SIGTERM"),
            _ = int.recv() => tracing::info!("SIGINT"),
        }
        match ctl.agent.stop(args.stop_grace).await {
            Ok(stopped) => tracing::info!(?stopped, "agent stopped"),
            Err(err) => tracing::info!(%err, "no agent to stop"),
        }
        let _ = handle.stop();
        handle.stopped().await;
        Ok(())
    })
}

/// `call` and `events`: the operator's client.
fn client_command(args: &[String], events: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let mut addr: Option<crate::client::ControlAddr> = None;
    let mut after = 0u64;
    let mut rest = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--addr" => {
                addr = Some(
                    args.next()
                        .context("--addr needs a value")?
                        .parse()
                        .context("--addr: not an address (IP:PORT or unix:PATH)")?,
                )
            }
            "--after" if events => {
                after = args
                    .next()
                    .context("--after needs a value")?
                    .parse()
                    .context("--after: not a number")?
            }
            _ => rest.push(arg.clone()),
        }
    }
    let addr = addr.context("--addr is required")?;
    let token = read_token(None, false)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(async move {
        let client = crate::client::ControlClient::connect(addr, &token).await?;
        if events {
            let mut stream = client.events(after);
            loop {
                let event = stream.next().await?;
                let mut stdout = std::io::stdout().lock();
                serde_json::to_writer(&mut stdout, &event)?;
                writeln!(stdout)?;
            }
        }
        let [method, params @ ..] = rest.as_slice() else { bail!("call needs a METHOD") };
        let params: serde_json::Value = match params {
            [] => serde_json::json!({}),
            [json] => serde_json::from_str(json).context("PARAMS_JSON is not JSON")?,
            _ => bail!("call takes one PARAMS_JSON argument"),
        };
        let result = client.call_raw(method, params).await?;
        println!("{}", serde_json::to_string_pretty(&result)?);
        Ok(())
    })
}

/// Waits for stdin to close (agentctl holds the only write end), then kills the group.
fn guard(args: &[String]) -> anyhow::Result<()> {
    use nix::sys::signal::{SigHandler, Signal, signal};
    use std::io::Read;
    let pgid: i32 = match args {
        [flag, pgid] if flag == "--pgid" => pgid.parse().context("--pgid: not a number")?,
        _ => bail!("guard takes --pgid PGID"),
    };
    // Outlive the polite stop steps: only SIGKILL or agentctl's end stops the guard.
    for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        // SAFETY: installing SIG_IGN runs no handler code.
        unsafe { signal(sig, SigHandler::SigIgn) }.context("cannot ignore signals")?;
    }
    let mut stdin = std::io::stdin().lock();
    let mut buf = [0u8; 64];
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), Signal::SIGKILL);
    Ok(())
}
