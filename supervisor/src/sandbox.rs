//! Confinement of an agent: what of the file system it sees and what of the network it
//! reaches, as its profile's `[sandbox]` asks. Every launch asks [`confine`] first; a
//! profile it cannot confine is unavailable, and its agent is never run unconfined.
//!
//! On the standalone runtime an agent is confined with bubblewrap (`bwrap.rs` builds its
//! argv): namespaces of its own (mount, pid, ipc, and network unless `network = "host"`),
//! as root and as a normal user (bubblewrap makes a user namespace then). On Docker the
//! container's mounts are the rules and agentctl makes the agent's network namespace. With
//! `network = "allowlist"` its only way out is agentctl's egress proxy (`agentctl::egress`),
//! reached from inside through `agentctl relay` on its loopback and given to it in the
//! standard proxy variables; the endpoints its own settings name (`ANTHROPIC_BASE_URL`, …)
//! are on its allowlist without being listed ([`model_endpoints`]).

mod bwrap;
mod endpoints;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use agents::profile::{FilesystemAccess, NetworkAccess, SandboxSettings};

pub use endpoints::{allowlist_for, model_endpoints};

/// Where a confined agent's relay listens inside its sandbox: its `http_proxy`.
pub const PROXY_INSIDE: &str = agentctl::relay::DEFAULT_LISTEN;

/// Why an agent cannot be confined as its profile's `[sandbox]` asks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxError {
    /// The runtime cannot give this confinement (yet): the agent is not run unconfined.
    #[error(
        "[sandbox] asks for filesystem = {filesystem} and network = {network}, which the {runtime} runtime cannot give yet; the agent is never run unconfined instead (set both to \"host\", or remove [sandbox], to run it as before)"
    )]
    NotGiven {
        /// The runtime asked to launch it.
        runtime: String,
        /// What the profile asks of the file system.
        filesystem: &'static str,
        /// What the profile asks of the network.
        network: &'static str,
    },
    /// What gives it is not installed here.
    #[error(
        "[sandbox] needs bubblewrap (bwrap), which is not installed here: install Debian's bubblewrap (apt-get install bubblewrap); the agent is never run unconfined instead"
    )]
    NoBwrap,
    /// bubblewrap is there but cannot make a sandbox on this machine.
    #[error(
        "[sandbox]: bubblewrap cannot make a sandbox on this machine ({detail}); a normal user needs unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, and on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0), or run the daemon as root; the agent is never run unconfined instead"
    )]
    Unsupported {
        /// What bubblewrap said.
        detail: String,
    },
}

/// Where an agent runs, as far as its confinement needs to know.
#[derive(Debug, Clone, Default)]
pub struct Place {
    /// Its workspace (read-write).
    pub workspace: PathBuf,
    /// A worktree's repository git dir (read-write).
    pub git_dir: Option<PathBuf>,
    /// Its home (`HOME`): an empty one in the sandbox, but for what is bound into it.
    pub home: Option<PathBuf>,
    /// Its own state dirs: (the dir on the host, the dir under its home).
    pub agent_state: Vec<(PathBuf, String)>,
    /// The agent's argv: the programs and scripts it names are bound read-only.
    pub argv: Vec<OsString>,
    /// agentctl's argv prefix on this machine (its relay runs in the sandbox).
    pub agentctl: Vec<OsString>,
    /// agentctl's state dir: the egress proxy's socket is there.
    pub state_dir: PathBuf,
    /// The agent's environment (its model endpoints join its allowlist).
    pub env: Vec<(String, String)>,
}

/// How an agent is confined: the argv it runs as, the variables it gets, and the egress
/// proxy agentctl runs for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Confinement {
    /// The whole argv: the agent's own when unconfined; else bubblewrap's, then the
    /// agent's with its paths written without `.` and `..` (a path through a directory
    /// the sandbox does not have would not resolve in it).
    pub argv: Vec<OsString>,
    /// Set in its environment.
    pub env: Vec<(String, String)>,
    /// For `network = "allowlist"`.
    pub egress: Option<protocol::control::Egress>,
    /// agentctl puts the agent in a network namespace of its own (in a container, where
    /// bubblewrap cannot).
    pub isolate_network: bool,
}

/// Whether `runtime` can confine an agent as `sandbox` asks, with `resolve` finding the
/// programs that confine it (before a session is created, and in `agents`).
pub fn check(
    sandbox: &SandboxSettings,
    runtime: &str,
    resolve: &crate::sidecar::Resolver,
) -> Result<(), SandboxError> {
    mechanism(sandbox, runtime, resolve).map(drop)
}

/// How `sandbox` confines an agent that runs at `place`: checked as [`check`] does, then
/// bubblewrap asked once whether it can work here (a failure says the cause and the fix).
pub async fn confine(
    sandbox: &SandboxSettings,
    runtime: &str,
    resolve: &crate::sidecar::Resolver,
    place: &Place,
) -> Result<Confinement, SandboxError> {
    let Some(mechanism) = mechanism(sandbox, runtime, resolve)? else {
        return Ok(Confinement { argv: place.argv.clone(), ..Confinement::default() });
    };
    // Where agentctl runs its proxy: its state dir, as it sees it.
    let state_dir = match &mechanism {
        Mechanism::Bwrap(_) => place.state_dir.clone(),
        Mechanism::Container => PathBuf::from(CONTAINER_STATE_DIR),
    };
    let egress = (sandbox.network == NetworkAccess::Allowlist).then(|| protocol::control::Egress {
        socket: state_dir.join("egress.sock"),
        allow: allowlist_for(sandbox, &place.env),
    });
    let (mut argv, isolate_network) = match mechanism {
        Mechanism::Bwrap(bwrap) => {
            bwrap::probe(&bwrap).await?;
            (bwrap::argv(bwrap, sandbox, place, egress.is_some()), false)
        }
        // agentctl makes the namespace (the container's mounts are the file system's rules).
        Mechanism::Container => {
            let relay = if egress.is_some() { container_relay() } else { Vec::new() };
            (relay, sandbox.network != NetworkAccess::Host)
        }
    };
    argv.extend(place.argv.iter().map(|word| bwrap::lexical(Path::new(word)).into_os_string()));
    let mut env = Vec::new();
    if egress.is_some() {
        let proxy = format!("http://{PROXY_INSIDE}");
        for name in ["http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"] {
            env.push((name.to_owned(), proxy.clone()));
        }
        // Everything goes through the proxy, loopback too: the sandbox's own is empty.
        env.push(("NO_PROXY".to_owned(), String::new()));
        env.push(("no_proxy".to_owned(), String::new()));
        // Node (22.21, 24+) reads the variables for its fetch only when asked.
        env.push(("NODE_USE_ENV_PROXY".to_owned(), "1".to_owned()));
    }
    if sandbox.filesystem == FilesystemAccess::Workspace {
        env.push(("TMPDIR".to_owned(), "/tmp".to_owned()));
    }
    Ok(Confinement { argv, env, egress, isolate_network })
}

/// agentctl's state dir and binary in a container (see the Docker runtime's mounts).
const CONTAINER_STATE_DIR: &str = "/tether/state";
const CONTAINER_AGENTCTL: &str = "/tether/agentctl";

/// The relay's argv in a container, before the agent's.
fn container_relay() -> Vec<OsString> {
    let socket = protocol::control::EGRESS_SOCKET_INSIDE;
    [CONTAINER_AGENTCTL, "relay", "--socket", socket, "--listen", PROXY_INSIDE, "--"]
        .map(OsString::from)
        .to_vec()
}

/// How `sandbox` confines an agent with `env` (its profile's, over the daemon's) on
/// `runtime`, as `agents` and `status` show it; `None` when unconfined.
pub fn describe(
    sandbox: &SandboxSettings,
    env: &std::collections::BTreeMap<String, String>,
    runtime: &str,
    container_runtime: Option<&str>,
) -> Option<protocol::api::Confinement> {
    if sandbox.is_host() {
        return None;
    }
    let mut all: Vec<(String, String)> = std::env::vars().collect();
    all.extend(env.iter().map(|(name, value)| (name.clone(), value.clone())));
    let allowlist = sandbox.network == NetworkAccess::Allowlist;
    let unquote = |text: &str| text.trim_matches('"').to_owned();
    Some(protocol::api::Confinement {
        filesystem: unquote(quoted_filesystem(sandbox.filesystem)),
        network: unquote(quoted_network(sandbox.network)),
        allow: if allowlist { allowlist_for(sandbox, &all) } else { Vec::new() },
        endpoints: if allowlist { model_endpoints(&all) } else { Vec::new() },
        readable: sandbox.readable.clone(),
        writable: sandbox.writable.clone(),
        by: match runtime {
            "standalone" => Some("bubblewrap".to_owned()),
            "docker" => Some(match container_runtime {
                Some(runtime) => format!("docker, runtime {runtime}"),
                None => "docker".to_owned(),
            }),
            _ => None,
        },
    })
}

/// What confines an agent.
enum Mechanism {
    /// bubblewrap (its argv), on this machine.
    Bwrap(Vec<OsString>),
    /// The container's mounts and read-only root (the Docker runtime's), and a network
    /// namespace agentctl makes for the agent.
    Container,
}

/// What confines an agent as `sandbox` asks on `runtime`; `None` when it asks for nothing.
fn mechanism(
    sandbox: &SandboxSettings,
    runtime: &str,
    resolve: &crate::sidecar::Resolver,
) -> Result<Option<Mechanism>, SandboxError> {
    if sandbox.is_host() {
        return Ok(None);
    }
    match runtime {
        "standalone" => {
            resolve("bwrap").map(|bwrap| Some(Mechanism::Bwrap(bwrap))).ok_or(SandboxError::NoBwrap)
        }
        "docker" => Ok(Some(Mechanism::Container)),
        _ => Err(SandboxError::NotGiven {
            runtime: runtime.to_owned(),
            filesystem: quoted_filesystem(sandbox.filesystem),
            network: quoted_network(sandbox.network),
        }),
    }
}

fn quoted_filesystem(access: FilesystemAccess) -> &'static str {
    match access {
        FilesystemAccess::Workspace => "\"workspace\"",
        FilesystemAccess::Host => "\"host\"",
    }
}

fn quoted_network(access: NetworkAccess) -> &'static str {
    match access {
        NetworkAccess::Allowlist => "\"allowlist\"",
        NetworkAccess::None => "\"none\"",
        NetworkAccess::Host => "\"host\"",
    }
}

/// `path` with a leading `~/` taken as `home`'s (`None` when there is no home to take).
fn expand(path: &str, home: Option<&Path>) -> Option<PathBuf> {
    match path.strip_prefix("~/") {
        Some(rest) => home.map(|home| home.join(rest)),
        None => Some(PathBuf::from(path)),
    }
}

#[cfg(test)]
mod tests;
