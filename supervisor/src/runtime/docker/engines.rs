//! The Docker engines a daemon places sessions on: how each is configured and reached,
//! and placement (labels, then least load).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use bollard::{API_DEFAULT_VERSION, Docker};
use serde::{Deserialize, Serialize};

/// How many live sessions an engine takes when the config does not say.
pub const DEFAULT_CAPACITY: u32 = 16;

/// The name of the one engine a daemon uses when the config lists none (`DOCKER_HOST`, or
/// the local socket).
pub const DEFAULT_ENGINE: &str = "default";

/// Seconds a request to an engine may take.
const REQUEST_TIMEOUT: u64 = 120;

/// One engine, as `[[docker.engines]]` in `config.toml` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// Its name (letters, digits, `-`, `_`): stored with each execution placed on it.
    pub name: String,
    /// `unix:///path/docker.sock`, `tcp://host:port` (with `tls`, HTTPS) or
    /// `ssh://user@host` (the system `ssh` runs `docker system dial-stdio` there, as the
    /// Docker CLI does; a port is refused: name a Host of `~/.ssh/config` that sets it);
    /// absent: the `DOCKER_HOST` environment variable, else the local socket.
    #[serde(default)]
    pub host: Option<String>,
    /// The address the supervisor reaches this engine's published ports at, and that the
    /// control port is published on (default: the IP of a `tcp://` host, `127.0.0.1` for a
    /// local socket).
    #[serde(default)]
    pub address: Option<IpAddr>,
    /// What it offers (`gpu = "a100"`, `zone = "eu"`): a session is placed only on an
    /// engine carrying every label it asks for.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// How many live sessions it takes at most.
    #[serde(default = "default_capacity")]
    pub capacity: u32,
    /// Client certificates for a `tcp://` engine that requires TLS (`dockerd --tlsverify`).
    #[serde(default)]
    pub tls: Option<EngineTls>,
    /// The private key for an `ssh://` engine (else ssh's own configuration decides).
    #[serde(default)]
    pub ssh_key: Option<PathBuf>,
    /// Whether the control channel to sidecars on this engine is TLS (a certificate made
    /// for each execution and pinned); default: for a `tcp://` engine, whose published
    /// ports are reached across a network.
    #[serde(default)]
    pub sidecar_tls: Option<bool>,
    /// Where a session's files live: `host` (default), bind mounts of the supervisor's
    /// paths (the engine's host must see them: a local engine, or a shared filesystem);
    /// `volumes`, named volumes on the engine for agentctl's state and the agent's own
    /// state, with agentctl and its secrets copied into the container (only the workspace
    /// is bind-mounted, at its own path).
    #[serde(default)]
    pub storage: Storage,
    /// Where a session's workspace lives: `mount` (default), the supervisor's directory
    /// bind-mounted at its own path (the engine's host must see it); `copy`, a volume on
    /// the engine, filled from the session's newest checkpoint (or the supervisor's
    /// directory, for a new session) when the session is first placed there, and fetched
    /// from the container at every checkpoint — for an engine whose host cannot see the
    /// supervisor's paths. A session whose workspace was copied moves only to engines that
    /// copy.
    #[serde(default)]
    pub workspace: WorkspaceMode,
}

/// See [`EngineConfig::workspace`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkspaceMode {
    /// Bind-mounted from the supervisor's host.
    #[default]
    Mount,
    /// A volume on the engine, copied in and fetched back.
    Copy,
}

/// See [`EngineConfig::storage`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Storage {
    /// Bind mounts of the supervisor's paths.
    #[default]
    Host,
    /// Named volumes on the engine.
    Volumes,
}

fn default_capacity() -> u32 {
    DEFAULT_CAPACITY
}

/// The files of a TLS engine connection (as `docker --tlsverify` takes them).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EngineTls {
    /// The CA that signed the engine's certificate.
    pub ca: PathBuf,
    /// The client certificate.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

impl EngineConfig {
    /// The engine used when the config lists none.
    pub fn default_engine() -> EngineConfig {
        EngineConfig {
            name: DEFAULT_ENGINE.into(),
            host: None,
            address: None,
            labels: BTreeMap::new(),
            capacity: DEFAULT_CAPACITY,
            tls: None,
            ssh_key: None,
            sidecar_tls: None,
            storage: Storage::Host,
            workspace: WorkspaceMode::Mount,
        }
    }

    /// Whether its sidecars serve their control channel over TLS.
    pub fn sidecar_tls(&self) -> bool {
        self.sidecar_tls.unwrap_or_else(|| {
            let host = match &self.host {
                Some(host) => host.clone(),
                None => std::env::var("DOCKER_HOST").unwrap_or_default(),
            };
            host.starts_with("tcp://") || host.starts_with("ssh://")
        })
    }

    /// Checks what can be checked without contacting it: the name, the address scheme,
    /// TLS only over TCP, a capacity, an address the published ports can be reached at.
    /// The error names the field.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.name.is_empty()
            || self.name.len() > 64
            || !self.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(("name", "1 to 64 letters, digits, '-' or '_'".into()));
        }
        if self.capacity == 0 {
            return Err(("capacity", "must be at least 1".into()));
        }
        match self.host.as_deref() {
            None => {}
            Some(host) if host.starts_with("unix://") && self.tls.is_some() => {
                return Err(("tls", "TLS applies to tcp:// engines only".into()));
            }
            Some(host) if host.starts_with("unix://") => {}
            Some(host) if host.starts_with("tcp://") => {}
            Some(host) if host.starts_with("ssh://") && self.tls.is_some() => {
                return Err(("tls", "an ssh:// engine is reached through ssh, not TLS".into()));
            }
            Some(host) if ssh_port(host).is_some() => {
                return Err((
                    "host",
                    "an ssh:// engine cannot take a port here (bollard's ssh transport drops it): name a Host from ~/.ssh/config that sets HostName and Port, e.g. ssh://build-2".into(),
                ));
            }
            Some(host) if host.starts_with("ssh://") => {}
            Some(_) => return Err(("host", "must start with unix://, tcp:// or ssh://".into())),
        }
        let over_ssh = self.host.as_deref().is_some_and(|host| host.starts_with("ssh://"));
        if self.ssh_key.is_some() && !over_ssh {
            return Err(("ssh_key", "applies to ssh:// engines only".into()));
        }
        if self.ssh_key.as_ref().is_some_and(|key| !key.is_absolute()) {
            return Err(("ssh_key", "must be an absolute path".into()));
        }
        self.reach_address().map(drop).map_err(|reason| ("address", reason))
    }

    /// Where the supervisor reaches what this engine publishes: `address`, else the host of
    /// a `tcp://` address (resolved once), else loopback (a local socket, or `DOCKER_HOST`
    /// unset or local).
    pub fn reach_address(&self) -> Result<IpAddr, String> {
        if let Some(address) = self.address {
            return Ok(address);
        }
        let from_env;
        let host = match self.host.as_deref() {
            Some(host) => host,
            None => {
                from_env = std::env::var("DOCKER_HOST").unwrap_or_default();
                from_env.as_str()
            }
        };
        let (rest, default_port) = match (host.strip_prefix("tcp://"), host.strip_prefix("ssh://"))
        {
            (Some(rest), _) => (rest, 2375),
            (_, Some(rest)) => (rest, 22),
            _ => return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        };
        let authority = rest.split('/').next().unwrap_or_default();
        // `user@` is ssh's business, not the address's.
        let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
        let with_port = if authority.rsplit_once(':').is_some() {
            authority.to_owned()
        } else {
            format!("{authority}:{default_port}")
        };
        with_port
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .map(|addr| addr.ip())
            .ok_or_else(|| {
                format!("cannot resolve {authority:?}; set `address` to the engine host's IP")
            })
    }
}

/// The port in an `ssh://[user@]host[:port]` address, if one is given.
fn ssh_port(host: &str) -> Option<&str> {
    let authority = host.strip_prefix("ssh://")?.split('/').next()?;
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    host.rsplit_once(':').map(|(_, port)| port)
}

/// A client for an engine (nothing is contacted yet).
pub fn connect(config: &EngineConfig) -> Result<Docker, String> {
    let connected = match (config.host.as_deref(), &config.tls) {
        (None, _) => Docker::connect_with_defaults(),
        (Some(host), _) if host.starts_with("unix://") => {
            Docker::connect_with_unix(host, REQUEST_TIMEOUT, API_DEFAULT_VERSION)
        }
        (Some(host), _) if host.starts_with("ssh://") => Docker::connect_with_ssh(
            host,
            REQUEST_TIMEOUT,
            API_DEFAULT_VERSION,
            config.ssh_key.as_ref().map(|key| key.display().to_string()),
        ),
        (Some(host), Some(tls)) => Docker::connect_with_ssl(
            host,
            &tls.key,
            &tls.cert,
            &tls.ca,
            REQUEST_TIMEOUT,
            API_DEFAULT_VERSION,
        ),
        (Some(host), None) => Docker::connect_with_http(host, REQUEST_TIMEOUT, API_DEFAULT_VERSION),
    };
    connected.map_err(|err| err.to_string())
}

/// Where bollard's ssh transport (the `openssh` crate) keeps its ssh masters' control
/// sockets: `$XDG_STATE_HOME`, else `~/.local/state`, in `.ssh-connection*` dirs.
fn ssh_control_dir() -> Option<PathBuf> {
    match std::env::var_os("XDG_STATE_HOME").map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => Some(dir),
        _ => std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/state")),
    }
}

/// Tells the ssh masters an earlier daemon process left behind (they live until told to
/// exit, and a SIGKILLed daemon never told them) to exit, and removes their control dirs.
/// Called before this process connects to any engine, so every master found is stale.
/// Returns how many were closed.
pub fn close_stale_ssh_masters() -> usize {
    let Some(dir) = ssh_control_dir() else { return 0 };
    let Ok(entries) = std::fs::read_dir(&dir) else { return 0 };
    let mut closed = 0;
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(".ssh-connection") {
            continue;
        }
        let master = entry.path().join("master");
        if master.exists() {
            let exited = std::process::Command::new("ssh")
                .arg("-S")
                .arg(&master)
                .args(["-O", "exit", "stale-master"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
            if exited.is_ok_and(|status| status.success()) {
                closed += 1;
            }
        }
        let _ = std::fs::remove_dir_all(entry.path());
    }
    if closed > 0 {
        tracing::info!(closed, dir = %dir.display(), "closed ssh masters left by an earlier run");
    }
    closed
}

/// An engine in use.
#[derive(Debug)]
pub struct Engine {
    /// As configured.
    pub config: EngineConfig,
    /// Its client, or why there is none.
    pub docker: Result<Docker, String>,
    /// Where its published ports are reached.
    pub address: IpAddr,
    /// Launches placed on it that have not finished (they count as load, so concurrent
    /// placements spread).
    pub inflight: AtomicUsize,
    /// When a ping last timed out, and the reason (cleared when it answers).
    last_timeout: std::sync::Mutex<Option<(std::time::Instant, String)>>,
}

/// How long an engine whose ping timed out is taken as down before it is asked again.
pub const DOWN_FOR: std::time::Duration = std::time::Duration::from_secs(30);

impl Engine {
    /// An engine from its config (checked with [`EngineConfig::validate`] first; an
    /// address that does not resolve falls back to loopback here).
    pub fn new(config: EngineConfig) -> Engine {
        let docker = connect(&config);
        let address = config.reach_address().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        Engine {
            config,
            docker,
            address,
            inflight: AtomicUsize::new(0),
            last_timeout: std::sync::Mutex::new(None),
        }
    }

    /// Records a ping that timed out (`Some(reason)`), or one that was answered.
    pub fn record_timeout(&self, timed_out: Option<String>) {
        let mut last = self.last_timeout.lock().expect("UNWRAP: never poisoned");
        *last = timed_out.map(|reason| (std::time::Instant::now(), reason));
    }

    /// Why it is taken as down: a ping timed out within the last [`DOWN_FOR`].
    pub fn recently_timed_out(&self) -> Option<String> {
        let last = self.last_timeout.lock().expect("UNWRAP: never poisoned");
        last.as_ref().filter(|(at, _)| at.elapsed() < DOWN_FOR).map(|(_, reason)| reason.clone())
    }

    /// Counts a launch on it until the guard drops.
    pub fn launching(&self) -> InflightGuard<'_> {
        self.inflight.fetch_add(1, Ordering::SeqCst);
        InflightGuard(&self.inflight)
    }
}

/// See [`Engine::launching`].
pub struct InflightGuard<'a>(&'a AtomicUsize);

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What placement knows of an engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its labels.
    pub labels: &'a BTreeMap<String, String>,
    /// Its capacity.
    pub capacity: u32,
    /// Its live sessions (running containers of ours plus launches under way), or why it
    /// cannot take one (`unreachable (…)`, `draining`).
    pub load: Result<usize, String>,
}

/// Picks an engine for a new session: of those carrying every wanted label, the reachable
/// ones with room, the least loaded (live sessions over capacity; ties: fewer sessions,
/// then the order of the config). The error says why none fits.
pub fn place(
    candidates: &[Candidate<'_>],
    wanted: &BTreeMap<String, String>,
) -> Result<usize, String> {
    let matching: Vec<(usize, &Candidate<'_>)> = candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| wanted.iter().all(|(key, value)| c.labels.get(key) == Some(value)))
        .collect();
    let asked = || {
        if wanted.is_empty() {
            "any labels".to_owned()
        } else {
            wanted.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")
        }
    };
    if matching.is_empty() {
        return Err(format!("no Docker engine carries the labels asked for ({})", asked()));
    }
    let mut why = Vec::new();
    let mut best: Option<(usize, usize, u32)> = None;
    for (index, candidate) in &matching {
        match &candidate.load {
            Err(reason) => why.push(format!("{}: {reason}", candidate.name)),
            Ok(load) if *load >= candidate.capacity as usize => {
                why.push(format!("{}: full ({load} of {})", candidate.name, candidate.capacity))
            }
            Ok(load) => {
                let better = match best {
                    None => true,
                    // load / capacity < best_load / best_capacity, without floats.
                    Some((_, best_load, best_capacity)) => {
                        let (left, right) = (
                            *load as u128 * u128::from(best_capacity),
                            best_load as u128 * u128::from(candidate.capacity),
                        );
                        left < right || (left == right && *load < best_load)
                    }
                };
                if better {
                    best = Some((*index, *load, candidate.capacity));
                }
            }
        }
    }
    best.map(|(index, _, _)| index).ok_or_else(|| {
        format!("no Docker engine with {} can take a session now: {}", asked(), why.join("; "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn placement_follows_labels_then_load() {
        let (a, b) = (labels(&[("zone", "a")]), labels(&[("zone", "b"), ("gpu", "yes")]));
        let engines = |load_a: Result<usize, String>, load_b: Result<usize, String>| {
            vec![
                Candidate { name: "one", labels: &a, capacity: 4, load: load_a },
                Candidate { name: "two", labels: &b, capacity: 8, load: load_b },
            ]
        };
        // Labels decide first, whatever the load.
        assert_eq!(place(&engines(Ok(0), Ok(7)), &labels(&[("gpu", "yes")])), Ok(1));
        assert_eq!(place(&engines(Ok(3), Ok(0)), &labels(&[("zone", "a")])), Ok(0));
        // Then the least loaded relative to capacity: 1/4 > 1/8.
        assert_eq!(place(&engines(Ok(1), Ok(1)), &BTreeMap::new()), Ok(1));
        // 2/4 = 4/8: the fewer sessions.
        assert_eq!(place(&engines(Ok(2), Ok(4)), &BTreeMap::new()), Ok(0));
        // Equal in every way: the config's order.
        let same = labels(&[]);
        let twins = vec![
            Candidate { name: "x", labels: &same, capacity: 2, load: Ok(1) },
            Candidate { name: "y", labels: &same, capacity: 2, load: Ok(1) },
        ];
        assert_eq!(place(&twins, &BTreeMap::new()), Ok(0));
    }

    #[test]
    fn placement_skips_full_and_unreachable_engines_and_says_why() {
        let (a, b) = (labels(&[("zone", "a")]), labels(&[("zone", "a")]));
        let engines = vec![
            Candidate { name: "one", labels: &a, capacity: 2, load: Ok(2) },
            Candidate {
                name: "two",
                labels: &b,
                capacity: 2,
                load: Err("unreachable (refused)".into()),
            },
        ];
        let err = place(&engines, &labels(&[("zone", "a")])).unwrap_err();
        assert!(err.contains("one: full (2 of 2)"), "{err}");
        assert!(err.contains("two: unreachable (refused)"), "{err}");
        let err = place(&engines, &labels(&[("zone", "c")])).unwrap_err();
        assert!(err.contains("no Docker engine carries the labels asked for (zone=c)"), "{err}");
        let one_free = vec![
            Candidate { name: "one", labels: &a, capacity: 2, load: Ok(2) },
            Candidate { name: "two", labels: &b, capacity: 2, load: Ok(1) },
        ];
        assert_eq!(place(&one_free, &BTreeMap::new()), Ok(1));
    }

    #[test]
    fn engine_configs_are_checked_field_by_field() {
        let mut engine = EngineConfig::default_engine();
        engine.host = Some("tcp://127.0.0.1:23750".into());
        assert_eq!(engine.validate(), Ok(()));
        assert_eq!(engine.reach_address(), Ok("127.0.0.1".parse().unwrap()));
        engine.address = Some("10.1.2.3".parse().unwrap());
        assert_eq!(engine.reach_address(), Ok("10.1.2.3".parse().unwrap()));
        engine.host = Some("unix:///var/run/docker.sock".into());
        engine.address = None;
        assert_eq!(engine.reach_address(), Ok(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        engine.tls = Some(EngineTls { ca: "ca".into(), cert: "c".into(), key: "k".into() });
        assert_eq!(engine.validate().unwrap_err().0, "tls");
        engine.tls = None;
        engine.host = Some("ssh://me@10.0.0.7:2222".into());
        assert_eq!(engine.validate().unwrap_err().0, "host", "a port is refused, with a hint");
        engine.host = Some("ssh://me@10.0.0.7".into());
        assert_eq!(engine.validate(), Ok(()));
        assert_eq!(engine.reach_address(), Ok("10.0.0.7".parse().unwrap()));
        assert!(engine.sidecar_tls(), "across a network");
        engine.ssh_key = Some("id_ed25519".into());
        assert_eq!(engine.validate().unwrap_err().0, "ssh_key");
        engine.ssh_key = None;
        engine.host = Some("http://x".into());
        assert_eq!(engine.validate().unwrap_err().0, "host");
        engine.host = None;
        engine.name = "bad name".into();
        assert_eq!(engine.validate().unwrap_err().0, "name");
        engine.name = "ok".into();
        engine.capacity = 0;
        assert_eq!(engine.validate().unwrap_err().0, "capacity");
    }
}
