//! A confined agent's egress proxy: an HTTP proxy — `CONNECT` tunnels for TLS, requests
//! in absolute form for plain HTTP — that lets through only the [`Allowlist`]'s pairs,
//! resolves names itself (the agent's own resolver reaches nothing), answers anything else
//! with `403` and reports the refusal. Reading a request's head is pure ([`parse_head`]);
//! [`EgressProxy`] is the thin driver. It listens on a Unix socket in agentctl's state dir,
//! which the agent's sandbox binds in and its relay (see [`crate::relay`]) forwards the
//! agent's loopback `http_proxy` to: it lives with the sidecar, so a restart of the
//! supervisor drops none of the agent's connections.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use protocol::allowlist::{Allowlist, Target};

/// The longest request head read before a request is refused.
pub const MAX_HEAD: usize = 16 * 1024;
/// How long a connection to an allowed target may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What an agent asked the proxy for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Where to.
    pub target: Target,
    /// A tunnel, or a plain HTTP request to send on.
    pub kind: RequestKind,
}

/// How a request goes on once allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestKind {
    /// `CONNECT host:port`: answered `200`, then bytes both ways.
    Tunnel,
    /// A plain HTTP request: its head rewritten for the origin server (origin-form target,
    /// `Connection: close`, no `Proxy-*` headers), sent first.
    Forward(Vec<u8>),
}

/// Why a request head was refused (`400`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// Not an HTTP/1 request line.
    #[error("not an HTTP/1 request: {0}")]
    NotHttp(String),
    /// A request in origin form (`GET /path`): this is a proxy, it needs the target.
    #[error("a proxy request names its target: CONNECT host:port, or GET http://host/path")]
    NoTarget,
    /// An `https://` (or other) absolute target outside a tunnel.
    #[error("only http:// is proxied in the clear; use CONNECT for {0}")]
    Scheme(String),
    /// A target that is not `host:port`.
    #[error("{0}")]
    Target(String),
}

/// Reads a request head (its bytes up to and including the blank line) as a proxy request.
pub fn parse_head(head: &[u8]) -> Result<Request, HeadError> {
    let text = std::str::from_utf8(head).map_err(|_| HeadError::NotHttp("not UTF-8".into()))?;
    let (line, rest) =
        text.split_once("\r\n").ok_or_else(|| HeadError::NotHttp("no line end".into()))?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HeadError::NotHttp(format!("{line:?}")));
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() {
        return Err(HeadError::NotHttp(format!("{line:?}")));
    }
    if method.eq_ignore_ascii_case("CONNECT") {
        let target = Target::parse(target).map_err(|err| HeadError::Target(err.to_string()))?;
        return Ok(Request { target, kind: RequestKind::Tunnel });
    }
    if target.starts_with('/') || target == "*" {
        return Err(HeadError::NoTarget);
    }
    let Some(after) = target.strip_prefix("http://").or_else(|| {
        target.get(..7).filter(|s| s.eq_ignore_ascii_case("http://")).map(|_| &target[7..])
    }) else {
        return Err(HeadError::Scheme(target.split("://").next().unwrap_or(target).to_owned()));
    };
    let (authority, path) = match after.find(['/', '?']) {
        Some(at) if after[at..].starts_with('/') => (&after[..at], &after[at..]),
        Some(at) => (&after[..at], &after[at..]),
        None => (after, "/"),
    };
    let path = if path.starts_with('?') { format!("/{path}") } else { path.to_owned() };
    let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let with_port = if authority.ends_with(']') || !authority.contains(':') {
        format!("{authority}:80")
    } else {
        authority.to_owned()
    };
    let target = Target::parse(&with_port).map_err(|err| HeadError::Target(err.to_string()))?;
    Ok(Request { target, kind: RequestKind::Forward(origin_head(method, &path, version, rest)) })
}

/// A forwarded request's head as its origin server takes it: origin-form, one request per
/// connection, no headers meant for the proxy.
fn origin_head(method: &str, path: &str, version: &str, headers: &str) -> Vec<u8> {
    let mut head = format!("{method} {path} {version}\r\n");
    for line in headers.split("\r\n").filter(|line| !line.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().trim().to_ascii_lowercase();
        if name.starts_with("proxy-") || name == "connection" || name == "keep-alive" {
            continue;
        }
        head.push_str(line);
        head.push_str("\r\n");
    }
    head.push_str("Connection: close\r\n\r\n");
    head.into_bytes()
}

/// A request the proxy refused: what was asked, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The target asked for (`host:port`), or what stood in its place.
    pub target: String,
    /// Why.
    pub reason: String,
}

/// An agent's egress proxy, listening on its socket until dropped (its connections with
/// it).
#[derive(Debug)]
pub struct EgressProxy {
    socket: PathBuf,
    /// The socket opened `O_PATH`: what the agent's command gets as
    /// [`protocol::control::EGRESS_FD`].
    path_fd: std::os::fd::OwnedFd,
    serving: Option<tokio::task::JoinHandle<()>>,
}

impl EgressProxy {
    /// Starts the proxy for `allowlist` on the Unix socket `socket` (a stale one there is
    /// replaced); each refusal is sent on `refused`.
    pub fn start(
        socket: &Path,
        allowlist: Allowlist,
        refused: mpsc::UnboundedSender<Refusal>,
    ) -> std::io::Result<EgressProxy> {
        match std::fs::remove_file(socket) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => return Err(err),
            _ => {}
        }
        let listener = UnixListener::bind(socket)?;
        // Any user the agent runs as may connect (through the descriptor it is given: the
        // path is in a directory only agentctl's user may enter).
        std::fs::set_permissions(socket, std::os::unix::fs::PermissionsExt::from_mode(0o666))?;
        let flags = nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_CLOEXEC;
        let path_fd = nix::fcntl::open(socket, flags, nix::sys::stat::Mode::empty())?;
        let serving = tokio::spawn(accept(listener, std::sync::Arc::new(allowlist), refused));
        Ok(EgressProxy { socket: socket.to_owned(), path_fd, serving: Some(serving) })
    }

    /// The socket opened `O_PATH` (connect to `/proc/self/fd/N` through it).
    pub fn path_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.path_fd)
    }

    /// Stops it: its listener and its connections are closed when this returns.
    pub async fn stop(mut self) {
        if let Some(serving) = self.serving.take() {
            serving.abort();
            let _ = serving.await;
        }
    }

    /// Where it listens.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        // Its connections are in the accept task's set: they end with it.
        if let Some(serving) = &self.serving {
            serving.abort();
        }
    }
}

async fn accept(
    listener: UnixListener,
    allowlist: std::sync::Arc<Allowlist>,
    refused: mpsc::UnboundedSender<Refusal>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    connections.spawn(serve(client, allowlist.clone(), refused.clone()));
                }
                Err(err) => tracing::warn!(%err, "the egress proxy cannot accept a connection"),
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// One client connection: its request read, decided, and tunnelled or refused.
async fn serve(
    mut client: tokio::net::UnixStream,
    allowlist: std::sync::Arc<Allowlist>,
    refused: mpsc::UnboundedSender<Refusal>,
) {
    let (head, early) = match read_head(&mut client).await {
        Ok(read) => read,
        Err(why) => return answer(&mut client, 400, &why).await,
    };
    let request = match parse_head(&head) {
        Ok(request) => request,
        Err(err) => return answer(&mut client, 400, &err.to_string()).await,
    };
    if !allowlist.permits(&request.target) {
        let target = request.target.to_string();
        let reason = format!("{target} is not on this session's egress allowlist");
        let _ = refused.send(Refusal { target, reason: reason.clone() });
        return answer(&mut client, 403, &reason).await;
    }
    let mut upstream = match connect(&request.target).await {
        Ok(upstream) => upstream,
        Err(why) => return answer(&mut client, 502, &why).await,
    };
    let sent = match &request.kind {
        RequestKind::Tunnel => {
            client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await
        }
        RequestKind::Forward(head) => upstream.write_all(head).await,
    };
    if sent.is_err() || upstream.write_all(&early).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

/// The request head (through its blank line) and whatever came after it in the same reads.
async fn read_head(client: &mut (impl AsyncRead + Unpin)) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut read = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") {
            let early = read.split_off(end + 4);
            return Ok((read, early));
        }
        if read.len() > MAX_HEAD {
            return Err(format!("the request head is over {MAX_HEAD} bytes"));
        }
        match client.read(&mut chunk).await {
            Ok(0) => return Err("the connection ended before the request head did".into()),
            Ok(n) => read.extend_from_slice(&chunk[..n]),
            Err(err) => return Err(format!("cannot read the request: {err}")),
        }
    }
}

/// A connection to an allowed target, its name resolved here.
async fn connect(target: &Target) -> Result<TcpStream, String> {
    let addrs = tokio::net::lookup_host((target.host.as_str(), target.port))
        .await
        .map_err(|err| format!("cannot resolve {target}: {err}"))?;
    let mut last = format!("{target} resolves to no address");
    for addr in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(err)) => last = format!("cannot connect to {target} ({addr}): {err}"),
            Err(_) => last = format!("cannot connect to {target} ({addr}): no answer in 10 s"),
        }
    }
    Err(last)
}

/// Answers with `status` and `why` as the body, then closes.
async fn answer(client: &mut (impl AsyncWrite + Unpin), status: u16, why: &str) {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        _ => "Bad Gateway",
    };
    let body = format!("Tether's egress proxy: {why}\n");
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.write_all(response.as_bytes()).await;
    let _ = client.shutdown().await;
}

#[cfg(test)]
mod tests;
