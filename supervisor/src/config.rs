//! The daemon's config file, `$TETHER_HOME/config.toml`: what `serve`'s flags
//! set, and the automatic retention policy. Optional; a flag given on the command line
//! wins over the file, the file over the built-in default. Validated strictly (unknown
//! keys refused) with errors located like a profile's: `file:line:column: field: reason`.
//!
//! ```toml
//! listen = "127.0.0.1:7777"
//! auth_token_file = "/etc/tether/token"     # 0600
//! allow_origins = ["https://tether.example"]
//! static_agentctl = "/opt/tether/agentctl"
//! event_log_retain_bytes = 67108864
//!
//! [retention]                # absent: nothing is removed automatically
//! max_age_days = 30          # required in the section
//! keep_completed = false
//! states = ["COMPLETED", "CANCELLED", "FAILED"]   # default: any state at rest
//! force = false              # remove worktrees with uncommitted work too
//! interval_minutes = 60      # how often it runs (first: when serving starts)
//!
//! [[docker.engines]]         # absent: the one engine at DOCKER_HOST, or the local socket
//! name = "local"
//! host = "unix:///var/run/docker.sock"
//! labels = { zone = "a" }
//! capacity = 8               # live sessions at most (default 16)
//!
//! [[docker.engines]]
//! name = "build-2"
//! host = "tcp://10.0.0.12:2376"
//! address = "10.0.0.12"      # where its published ports are reached (default: host's IP)
//! labels = { zone = "b", gpu = "yes" }
//! tls = { ca = "/etc/tether/ca.pem", cert = "/etc/tether/cert.pem", key = "/etc/tether/key.pem" }
//! storage = "volumes"        # the session's state in volumes there; agentctl copied in
//! workspace = "copy"         # its workspace in a volume there, checkpointed from inside
//!
//! [[docker.engines]]
//! name = "build-3"
//! host = "ssh://tether@build-3"   # a port goes in ~/.ssh/config, not here
//! ssh_key = "/etc/tether/id_ed25519"
//! ```

use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::runtime::docker::engines::EngineConfig;
use crate::service::CleanupPolicy;
use crate::store::SessionState;

/// The file's name in the data directory.
pub const FILE_NAME: &str = "config.toml";

/// The default for `retention.interval_minutes`.
pub const DEFAULT_RETENTION_INTERVAL_MINUTES: u64 = 60;

/// A config file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// It exists but cannot be read.
    #[error("{file}: cannot read it: {source}")]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It does not parse or validate.
    #[error("{file}:{line}:{column}: {field}: {reason}")]
    Invalid {
        /// The file.
        file: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column, in characters.
        column: usize,
        /// The dotted field (`retention.max_age_days`), or `(file)`.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

/// The validated file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DaemonConfig {
    /// `listen`.
    pub listen: Option<SocketAddr>,
    /// `auth_token_file`.
    pub auth_token_file: Option<PathBuf>,
    /// `allow_origins`.
    pub allow_origins: Vec<String>,
    /// `static_agentctl`.
    pub static_agentctl: Option<PathBuf>,
    /// `event_log_retain_bytes`.
    pub event_log_retain_bytes: Option<u64>,
    /// `[retention]`.
    pub retention: Option<Retention>,
    /// `[[docker.engines]]`.
    pub docker_engines: Vec<EngineConfig>,
    /// `[session] idle_timeout_secs`: profiles that do not say park sessions idle this long
    /// (`0`: never; absent: [`DEFAULT_IDLE_TIMEOUT_SECS`]).
    pub idle_timeout_secs: Option<u64>,
    /// `[sandbox]`: how the agents of profiles without one are confined (absent: not at
    /// all), checked as a profile's.
    pub sandbox: Option<agents::profile::SandboxSettings>,
    /// `[checkpoints]`: the limits of workspace checkpoints.
    pub checkpoints: crate::checkpoint::Limits,
    /// `[docker] failover_after_secs`: an engine that does not answer this long has its
    /// sessions moved to the others (`None`: never, the default).
    pub failover_after_secs: Option<u64>,
}

/// How long an agent may sit idle before its session is parked, unless a profile or
/// `config.toml` says: 30 minutes.
pub const DEFAULT_IDLE_TIMEOUT_SECS: u64 = 1800;

/// The automatic retention policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// What each run removes (never a dry run).
    pub policy: CleanupPolicy,
    /// How often it runs.
    pub interval: Duration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<Spanned<String>>,
    auth_token_file: Option<Spanned<String>>,
    #[serde(default)]
    allow_origins: Vec<Spanned<String>>,
    static_agentctl: Option<Spanned<String>>,
    event_log_retain_bytes: Option<Spanned<u64>>,
    retention: Option<RawRetention>,
    docker: Option<RawDockerSection>,
    session: Option<RawSessionSection>,
    /// Read again, checked, by `agents::profile::parse_sandbox_table`.
    sandbox: Option<toml::Table>,
    checkpoints: Option<RawCheckpoints>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCheckpoints {
    max_file_bytes: Option<Spanned<u64>>,
    max_workspace_bytes: Option<Spanned<u64>>,
    wait_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSessionSection {
    idle_timeout_secs: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDockerSection {
    #[serde(default)]
    engines: Vec<Spanned<EngineConfig>>,
    failover_after_secs: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetention {
    max_age_days: Spanned<u32>,
    #[serde(default)]
    keep_completed: bool,
    states: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    force: bool,
    interval_minutes: Option<Spanned<u64>>,
}

/// Reads `path`; a missing file is the empty config.
pub fn load(path: &Path) -> Result<DaemonConfig, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text, path),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(DaemonConfig::default()),
        Err(source) => Err(ConfigError::Read { file: path.to_owned(), source }),
    }
}

/// Parses and validates the file's text (`file` is for the messages).
pub fn parse(text: &str, file: &Path) -> Result<DaemonConfig, ConfigError> {
    let locator = Locator { text, file };
    let raw: RawConfig = toml::from_str(text).map_err(|err| {
        locator.invalid(err.span().unwrap_or(0..0), None, err.message().trim().to_owned())
    })?;
    let listen = listen_address(&locator, raw.listen)?;
    let auth_token_file = absolute_path(&locator, raw.auth_token_file, "auth_token_file")?;
    let static_agentctl = absolute_path(&locator, raw.static_agentctl, "static_agentctl")?;
    let allow_origins = origins(&locator, raw.allow_origins)?;
    let event_log_retain_bytes = retain_bytes(&locator, raw.event_log_retain_bytes)?;
    let failover_after_secs = match raw.docker.as_ref().and_then(|d| d.failover_after_secs.clone())
    {
        Some(secs) if *secs.get_ref() == 0 => {
            let reason = "must be greater than 0 (leave it out to never fail over)".into();
            return Err(locator.invalid(secs.span(), Some("docker.failover_after_secs"), reason));
        }
        other => other.map(Spanned::into_inner),
    };
    let docker_engines = engines(&locator, raw.docker)?;
    let retention = retention(&locator, raw.retention)?;
    let sandbox = match raw.sandbox {
        Some(_) => {
            let source = agents::profile::ProfileSource::File(file.to_owned());
            agents::profile::parse_sandbox_table(text, source).map_err(|err| {
                ConfigError::Invalid {
                    file: file.to_owned(),
                    line: err.line,
                    column: err.column,
                    field: err.field,
                    reason: err.reason,
                }
            })?
        }
        None => None,
    };
    Ok(DaemonConfig {
        listen,
        auth_token_file,
        allow_origins,
        static_agentctl,
        event_log_retain_bytes,
        retention,
        docker_engines,
        idle_timeout_secs: raw.session.and_then(|session| session.idle_timeout_secs),
        sandbox,
        checkpoints: checkpoint_limits(&locator, raw.checkpoints)?,
        failover_after_secs,
    })
}

/// The file's text and name, to locate its errors.
struct Locator<'a> {
    text: &'a str,
    file: &'a Path,
}

impl Locator<'_> {
    /// An error at `span`, for `field` (else the key found there, else `(file)`).
    fn invalid(&self, span: Range<usize>, field: Option<&str>, reason: String) -> ConfigError {
        let (line, column, found) = agents::profile::toml_location(self.text, span.start);
        let field = field.map(str::to_owned).or(found).unwrap_or_else(|| "(file)".to_owned());
        ConfigError::Invalid { file: self.file.to_owned(), line, column, field, reason }
    }
}

/// `listen`, checked to be an address with a port.
fn listen_address(
    locator: &Locator<'_>,
    listen: Option<Spanned<String>>,
) -> Result<Option<SocketAddr>, ConfigError> {
    listen
        .map(|listen| {
            listen.get_ref().parse::<SocketAddr>().map_err(|_| {
                locator.invalid(
                    listen.span(),
                    Some("listen"),
                    format!(
                        "{:?} is not an address with a port (127.0.0.1:7777)",
                        listen.get_ref()
                    ),
                )
            })
        })
        .transpose()
}

/// A path setting, checked to be absolute.
fn absolute_path(
    locator: &Locator<'_>,
    value: Option<Spanned<String>>,
    field: &str,
) -> Result<Option<PathBuf>, ConfigError> {
    value
        .map(|value| {
            let path = PathBuf::from(value.get_ref());
            if path.is_absolute() {
                Ok(path)
            } else {
                Err(locator.invalid(value.span(), Some(field), "must be an absolute path".into()))
            }
        })
        .transpose()
}

/// `allow_origins`, each checked to be `scheme://host[:port]` with no path.
fn origins(locator: &Locator<'_>, raw: Vec<Spanned<String>>) -> Result<Vec<String>, ConfigError> {
    let mut allow_origins = Vec::new();
    for origin in raw {
        let text = origin.get_ref();
        if !(text.starts_with("http://") || text.starts_with("https://")) || text.ends_with('/') {
            return Err(locator.invalid(
                origin.span(),
                Some("allow_origins"),
                format!("{text:?} is not an origin (scheme://host[:port], no path)"),
            ));
        }
        allow_origins.push(origin.into_inner());
    }
    Ok(allow_origins)
}

/// `event_log_retain_bytes`, checked to be more than 0.
fn retain_bytes(
    locator: &Locator<'_>,
    value: Option<Spanned<u64>>,
) -> Result<Option<u64>, ConfigError> {
    match value {
        Some(bytes) if *bytes.get_ref() == 0 => Err(locator.invalid(
            bytes.span(),
            Some("event_log_retain_bytes"),
            "must be greater than 0".into(),
        )),
        other => Ok(other.map(Spanned::into_inner)),
    }
}

/// `[checkpoints]`, its sizes checked to be more than 0.
fn checkpoint_limits(
    locator: &Locator<'_>,
    raw: Option<RawCheckpoints>,
) -> Result<crate::checkpoint::Limits, ConfigError> {
    let mut limits = crate::checkpoint::Limits::default();
    let Some(raw) = raw else { return Ok(limits) };
    for (value, field, slot) in [
        (raw.max_file_bytes, "checkpoints.max_file_bytes", &mut limits.max_file_bytes),
        (
            raw.max_workspace_bytes,
            "checkpoints.max_workspace_bytes",
            &mut limits.max_workspace_bytes,
        ),
    ] {
        if let Some(value) = value {
            if *value.get_ref() == 0 {
                return Err(locator.invalid(
                    value.span(),
                    Some(field),
                    "must be greater than 0".into(),
                ));
            }
            *slot = value.into_inner();
        }
    }
    if let Some(wait_ms) = raw.wait_ms {
        limits.wait = std::time::Duration::from_millis(wait_ms);
    }
    Ok(limits)
}

/// `[[docker.engines]]`, each validated, its TLS paths absolute, its name not repeated.
fn engines(
    locator: &Locator<'_>,
    docker: Option<RawDockerSection>,
) -> Result<Vec<EngineConfig>, ConfigError> {
    let mut docker_engines: Vec<EngineConfig> = Vec::new();
    for (index, engine) in
        docker.map(|docker| docker.engines).unwrap_or_default().into_iter().enumerate()
    {
        let span = engine.span();
        let engine = engine.into_inner();
        if let Err((field, reason)) = engine.validate() {
            let field = format!("docker.engines[{index}].{field}");
            return Err(locator.invalid(span, Some(&field), reason));
        }
        if let Some(tls) = &engine.tls {
            for (name, path) in [("ca", &tls.ca), ("cert", &tls.cert), ("key", &tls.key)] {
                if !path.is_absolute() {
                    let field = format!("docker.engines[{index}].tls.{name}");
                    return Err(locator.invalid(
                        span,
                        Some(&field),
                        "must be an absolute path".into(),
                    ));
                }
            }
        }
        if docker_engines.iter().any(|known| known.name == engine.name) {
            let field = format!("docker.engines[{index}].name");
            return Err(locator.invalid(
                span,
                Some(&field),
                format!("{:?} is named twice", engine.name),
            ));
        }
        docker_engines.push(engine);
    }
    Ok(docker_engines)
}

/// `[retention]`, if the file has it: its states and its interval checked.
fn retention(
    locator: &Locator<'_>,
    raw: Option<RawRetention>,
) -> Result<Option<Retention>, ConfigError> {
    let Some(retention) = raw else { return Ok(None) };
    let states = retention_states(locator, retention.states)?;
    let interval = match retention.interval_minutes {
        Some(minutes) if *minutes.get_ref() == 0 => {
            return Err(locator.invalid(
                minutes.span(),
                Some("retention.interval_minutes"),
                "must be at least 1".into(),
            ));
        }
        Some(minutes) => *minutes.get_ref(),
        None => DEFAULT_RETENTION_INTERVAL_MINUTES,
    };
    Ok(Some(Retention {
        policy: CleanupPolicy {
            max_age_days: retention.max_age_days.into_inner(),
            states,
            keep_completed: retention.keep_completed,
            dry_run: false,
            force: retention.force,
        },
        interval: Duration::from_secs(interval.saturating_mul(60)),
    }))
}

/// `retention.states`, if given: each a known state, none of them live.
fn retention_states(
    locator: &Locator<'_>,
    names: Option<Vec<Spanned<String>>>,
) -> Result<Option<Vec<SessionState>>, ConfigError> {
    let Some(names) = names else { return Ok(None) };
    let mut states = Vec::new();
    for name in names {
        let state: SessionState = name
            .get_ref()
            .parse()
            .map_err(|reason| locator.invalid(name.span(), Some("retention.states"), reason))?;
        if matches!(state, SessionState::Starting | SessionState::Running) {
            return Err(locator.invalid(
                name.span(),
                Some("retention.states"),
                format!("{state:?} sessions are live; cleanup never removes them"),
            ));
        }
        states.push(state);
    }
    Ok(Some(states))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(text: &str) -> (usize, usize, String, String) {
        match parse(text, Path::new("/h/config.toml")) {
            Err(ConfigError::Invalid { line, column, field, reason, .. }) => {
                (line, column, field, reason)
            }
            other => panic!("expected a located error, got {other:?}"),
        }
    }

    #[test]
    fn a_full_file_is_read_and_an_empty_one_is_the_defaults() {
        let text = r#"
listen = "0.0.0.0:9000"
auth_token_file = "/etc/tether/token"
allow_origins = ["https://tether.example", "http://localhost:3000"]
static_agentctl = "/opt/agentctl"
event_log_retain_bytes = 1048576

[retention]
max_age_days = 30
keep_completed = true
states = ["COMPLETED", "FAILED"]
interval_minutes = 5
"#;
        let config = parse(text, Path::new("/h/config.toml")).unwrap();
        assert_eq!(config.listen, Some("0.0.0.0:9000".parse().unwrap()));
        assert_eq!(config.auth_token_file.as_deref(), Some(Path::new("/etc/tether/token")));
        assert_eq!(config.allow_origins.len(), 2);
        assert_eq!(config.event_log_retain_bytes, Some(1_048_576));
        let retention = config.retention.unwrap();
        assert_eq!(retention.interval, Duration::from_secs(300));
        assert_eq!(
            retention.policy,
            CleanupPolicy {
                max_age_days: 30,
                states: Some(vec![SessionState::Completed, SessionState::Failed]),
                keep_completed: true,
                dry_run: false,
                force: false,
            }
        );
        assert_eq!(parse("", Path::new("/x")).unwrap(), DaemonConfig::default());
        let missing = load(Path::new("/nonexistent/tether/config.toml")).unwrap();
        assert_eq!(missing, DaemonConfig::default());
    }

    #[test]
    fn errors_name_the_line_column_and_field() {
        let (line, column, field, reason) = invalid("listen = \"127.0.0.1:1\"\nlisen = 3\n");
        assert_eq!((line, column, field.as_str()), (2, 1, "lisen"));
        assert!(reason.contains("unknown field"), "{reason}");
        let (line, column, field, _) = invalid("[retention]\nmax_age_days = \"ten\"\n");
        assert_eq!((line, field.as_str()), (2, "retention.max_age_days"));
        assert_eq!(column, 16);
        let (line, _, field, reason) =
            invalid("[retention]\nmax_age_days = 1\nstates = [\"DONE\"]\n");
        assert_eq!((line, field.as_str()), (3, "retention.states"));
        assert!(reason.contains("COMPLETED"), "the valid names are listed: {reason}");
        let (_, _, field, reason) =
            invalid("[retention]\nmax_age_days = 1\nstates = [\"RUNNING\"]\n");
        assert_eq!(field, "retention.states");
        assert!(reason.contains("live"), "{reason}");
        let (line, _, field, _) = invalid("listen = \"localhost\"\n");
        assert_eq!((line, field.as_str()), (1, "listen"));
        let (_, _, field, _) = invalid("static_agentctl = \"bin/agentctl\"\n");
        assert_eq!(field, "static_agentctl");
        let (_, _, field, _) = invalid("allow_origins = [\"tether.example\"]\n");
        assert_eq!(field, "allow_origins");
        let (_, _, field, reason) = invalid("[retention]\nkeep_completed = true\n");
        assert!(reason.contains("max_age_days"), "{field}: {reason}");
        let (_, _, field, _) = invalid("[retention]\nmax_age_days = 1\ninterval_minutes = 0\n");
        assert_eq!(field, "retention.interval_minutes");
        let (line, _, field, _) = invalid("listen = [");
        assert_eq!((line, field.as_str()), (1, "(file)"));
    }

    #[test]
    fn checkpoint_limits_are_read_and_a_zero_size_refused() {
        let text =
            "[checkpoints]\nmax_file_bytes = 100\nmax_workspace_bytes = 1000\nwait_ms = 50\n";
        let limits = parse(text, Path::new("/h/config.toml")).unwrap().checkpoints;
        assert_eq!((limits.max_file_bytes, limits.max_workspace_bytes), (100, 1000));
        assert_eq!(limits.wait, Duration::from_millis(50));
        let text = "[docker]\nfailover_after_secs = 30\n";
        assert_eq!(parse(text, Path::new("/h/c.toml")).unwrap().failover_after_secs, Some(30));
        let (_, _, field, _) = invalid("[docker]\nfailover_after_secs = 0\n");
        assert_eq!(field, "docker.failover_after_secs");
        let (line, _, field, reason) = invalid("[checkpoints]\nmax_file_bytes = 0\n");
        assert_eq!((line, field.as_str()), (2, "checkpoints.max_file_bytes"));
        assert!(reason.contains("greater than 0"), "{reason}");
    }

    #[test]
    fn a_default_sandbox_is_read_and_checked_as_a_profiles() {
        let text = "listen = \"127.0.0.1:1\"\n[sandbox]\nfilesystem = \"workspace\"\n\
            network = \"allowlist\"\nallow = [\"Registry.npmjs.org:443\"]\n";
        let sandbox = parse(text, Path::new("/h/config.toml")).unwrap().sandbox.unwrap();
        use agents::profile::{FilesystemAccess, NetworkAccess};
        assert_eq!(
            (sandbox.filesystem, sandbox.network),
            (FilesystemAccess::Workspace, NetworkAccess::Allowlist)
        );
        assert_eq!(sandbox.allow, ["registry.npmjs.org:443"]);
        let (line, _, field, reason) =
            invalid("listen = \"127.0.0.1:1\"\n[sandbox]\nnetwork = \"none\"\nallow = [\"x:1\"]\n");
        assert_eq!((line, field.as_str()), (4, "sandbox.allow"));
        assert!(reason.contains("network = \"allowlist\""), "{reason}");
        let (line, _, field, _) = invalid("[sandbox]\nnetwrk = \"none\"\n");
        assert_eq!((line, field.as_str()), (2, "sandbox.netwrk"));
    }

    #[test]
    fn docker_engines_are_read_and_checked_one_by_one() {
        let text = r#"
[[docker.engines]]
name = "local"
labels = { zone = "a" }
capacity = 4

[[docker.engines]]
name = "far"
host = "tcp://10.0.0.12:2376"
labels = { zone = "b", gpu = "yes" }
tls = { ca = "/etc/t/ca.pem", cert = "/etc/t/cert.pem", key = "/etc/t/key.pem" }
"#;
        let config = parse(text, Path::new("config.toml")).unwrap();
        let names: Vec<&str> = config.docker_engines.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["local", "far"]);
        assert_eq!(config.docker_engines[0].capacity, 4);
        assert_eq!(config.docker_engines[1].capacity, 16, "the default capacity");
        assert_eq!(config.docker_engines[1].reach_address(), Ok("10.0.0.12".parse().unwrap()));
        assert_eq!(config.docker_engines[1].labels.get("gpu").map(String::as_str), Some("yes"));
        let twice = "[[docker.engines]]\nname = \"a\"\n[[docker.engines]]\nname = \"a\"\n";
        let (line, _, field, reason) = invalid(twice);
        assert_eq!((line, field.as_str()), (3, "docker.engines[1].name"));
        assert!(reason.contains("twice"), "{reason}");
        let (_, _, field, _) = invalid("[[docker.engines]]\nname = \"a\"\nhost = \"ftp://x\"\n");
        assert_eq!(field, "docker.engines[0].host");
        let (_, _, field, _) = invalid("[[docker.engines]]\nname = \"a\"\ncapacity = 0\n");
        assert_eq!(field, "docker.engines[0].capacity");
        let relative = "[[docker.engines]]\nname = \"a\"\nhost = \"tcp://1.2.3.4:2376\"\ntls = { ca = \"ca.pem\", cert = \"/c\", key = \"/k\" }\n";
        let (_, _, field, _) = invalid(relative);
        assert_eq!(field, "docker.engines[0].tls.ca");
        let (line, _, field, reason) = invalid("[[docker.engines]]\nname = \"a\"\nlables = {}\n");
        assert_eq!(line, 3, "{field}: {reason}");
        assert!(reason.contains("unknown field"), "{reason}");
    }
}
