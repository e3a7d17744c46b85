//! Agent profiles: the TOML schema, its validation, and the resolved [`Profile`] value.
//!
//! A profile says how to launch one agent and which resume paths it supports. Parsing is
//! strict — unknown keys are errors, so a typo cannot silently turn resume off — and every
//! error carries `file:line:col`, the field and the reason ([`ProfileError`]).
//!
//! Placeholders: `command`, `env` values and `session.resume_command` may contain `{home}`
//! (the agent's home directory, expanded by the launcher); `session.resume_command` must
//! contain `{token}` (the stored resume token). Any other `{name}` is an error; braces
//! around anything but a name (JSON in an env value) are literal.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml::Spanned;

/// A validated agent profile. Serialisable: a session stores the snapshot it started with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Unique id (`[a-z0-9][a-z0-9_-]*`); user files override built-ins with the same id.
    pub id: String,
    /// Human name.
    pub display_name: String,
    /// The launch argv; `command[0]` is looked up on `PATH`.
    pub command: Vec<String>,
    /// How to install `command[0]` (and what it needs), said when it is not found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install: Option<String>,
    /// Extra environment for the agent.
    pub env: BTreeMap<String, String>,
    /// Variables that must be set (and non-empty) for the agent to work.
    pub required_env: Vec<String>,
    /// The wire protocol.
    pub protocol: Protocol,
    /// The ACP `authenticate` methods to use when the agent asks for authentication, in
    /// order of preference (empty: none is chosen, and such an agent needs credentials).
    #[serde(default)]
    pub auth: Vec<AuthChoice>,
    /// Where the agent finds its credentials; any one of them is enough.
    #[serde(default)]
    pub credentials: Credentials,
    /// Where sessions run unless the request says: `standalone` or `docker`.
    #[serde(default = "default_runtime")]
    pub runtime: String,
    /// Resume behaviour.
    pub session: SessionSettings,
    /// Container settings, for the Docker runtime.
    pub docker: DockerSettings,
    /// Process timeouts.
    pub process: ProcessSettings,
    /// `[workspace]`: present, sessions of this profile work in a git worktree of their
    /// own (unless a create says `worktree: false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceSettings>,
    /// `[pool]`: agents kept started ahead of the sessions that will use them.
    #[serde(default, skip_serializing_if = "PoolSettings::is_off")]
    pub pool: PoolSettings,
    /// `[sandbox]`: how the agent is confined (absent: as the daemon's `config.toml` says,
    /// by default not at all; see [`Profile::sandbox_or`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxSettings>,
    /// Where the profile came from.
    pub source: ProfileSource,
    /// A user profile that `extends` a built-in: which, and the keys it sets itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extends: Option<crate::registry::Extended>,
}

/// `[pool]`: how many agents of this profile the daemon keeps started and initialized
/// (standalone runtime only), so a session's start only opens its ACP session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSettings {
    /// Warm agents kept ready (0, the default: none).
    #[serde(default)]
    pub warm: u32,
}

impl PoolSettings {
    /// No pool.
    pub fn is_off(&self) -> bool {
        self.warm == 0
    }
}

/// The most warm agents a profile may keep.
pub const MAX_WARM: u32 = 32;

/// `[workspace]`: the repository a session's worktree is made from, and its base.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceSettings {
    /// The repository (an absolute path); absent, the session's `workspace_path` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    /// The branch or commit the session's branch starts from; absent, the repository's
    /// `HEAD`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
}

/// One `authenticate` method a profile allows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthChoice {
    /// The method's id among the agent's `authMethods`.
    pub method: String,
    /// The method is used only when one of these variables is set and not empty (the
    /// credentials it reads); empty: whenever the agent offers it.
    #[serde(default)]
    pub env: Vec<String>,
}

/// Where an agent's credentials may be: an API key in one of `env`, or a login file (one
/// of `files`, relative to the user's home). Both empty: it needs none we know of.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    /// Variables holding an API key.
    #[serde(default)]
    pub env: Vec<String>,
    /// Files a login leaves behind, relative to `$HOME`.
    #[serde(default)]
    pub files: Vec<String>,
    /// Variables that move a directory of `files` (`KIMI_SHARE_DIR = ".kimi"`): while one
    /// is set, a file under that directory is looked for under the variable's value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub moved_by: BTreeMap<String, String>,
}

impl Credentials {
    /// Where login file `file` is: under `$HOME`, or under the value of a variable that
    /// moves its directory (`var` says a variable's value, if set).
    pub fn file_path(
        &self,
        file: &str,
        home: &std::path::Path,
        var: impl Fn(&str) -> Option<String>,
    ) -> std::path::PathBuf {
        self.moved(file, var).unwrap_or_else(|| home.join(file))
    }

    /// Where login file `file` is when a variable that moves its directory is set.
    pub fn moved(
        &self,
        file: &str,
        var: impl Fn(&str) -> Option<String>,
    ) -> Option<std::path::PathBuf> {
        self.moved_by.iter().find_map(|(name, dir)| {
            let rest = std::path::Path::new(file).strip_prefix(dir).ok()?;
            let value = var(name).filter(|value| !value.is_empty())?;
            Some(std::path::PathBuf::from(value).join(rest))
        })
    }
}

/// The protocols an agent can speak. Only ACP today.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Protocol {
    /// The Agent Client Protocol over stdio.
    Acp,
}

/// How a session of this agent is resumed.
///
/// The agent says at `initialize` what it can restore (`sessionCapabilities.resume`,
/// `loadSession`); these fields are overrides of that, and unset they follow it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionSettings {
    /// Native restore through ACP. Unset: as the agent advertises (`session/resume`, else
    /// `session/load`, else none). `false`: never. `true`: always try, even when the agent
    /// does not advertise it (`restore_method`, else what it advertises, else `load`).
    pub native_resume: Option<bool>,
    /// Pins the ACP method of a native restore, whatever the agent advertises.
    #[serde(default)]
    pub restore_method: Option<RestoreMethod>,
    /// Injecting the recorded history into the first prompt when nothing was restored
    /// natively. Unset or `true`: yes. `false`: only after a native restore that failed.
    pub history_injection: Option<bool>,
    /// An argv that relaunches the agent restoring session `{token}` (a CLI `--resume`).
    pub resume_command: Option<Vec<String>>,
    /// The agent's own state directories, relative to its home (e.g. `.codex`), persisted
    /// per session so a native resume works in a new container.
    pub agent_state_dirs: Vec<String>,
    /// Files the agent keeps per ACP session, relative to its home, with `{acp_session}`
    /// where the session's id goes (e.g. `.mock-agent/{acp_session}.json`): removed when
    /// the session is deleted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state_files: Vec<String>,
    /// The most characters of history a resume context may hold.
    pub resume_context_budget: usize,
    /// When the agent reports its context this full (`usage_update` used/size, in
    /// percent), the session pauses at the turn boundary and its resume hands over to a
    /// fresh agent session primed from a snapshot. `0`: never.
    #[serde(default = "defaults::context_handoff_percent")]
    pub context_handoff_percent: u8,
    /// Parks a session whose agent has been idle this long (no turn, no open question):
    /// agent and sidecar stop, the session is `PAUSED` (`idle`) and the next prompt or
    /// resume brings it back. Unset: the daemon's `[session] idle_timeout_secs`; `0`: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_secs: Option<u64>,
    /// A session pauses (`max_turns`) at the end of its turn number this; unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    /// A session pauses (`max_duration`) at the first turn boundary this long after it was
    /// created; unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration_secs: Option<u64>,
    /// At a pause, the agent is asked once more for its decisions, open problems and next
    /// steps as JSON, kept in the pause's snapshot when it validates.
    #[serde(default)]
    pub summarize_on_pause: bool,
    /// Tether offers to read and write the agent's files (ACP `fs/*`, confined to the
    /// workspace). `false`: not offered at `initialize`, and the agent uses the disk
    /// itself — for an agent that cannot take a missing file from an ACP client (gemini-cli
    /// 0.61: every new file failed).
    #[serde(default = "defaults::client_fs")]
    pub client_fs: bool,
    /// What the tokens of the agent's `PromptResponse.usage` count: each turn's own
    /// (`per_turn`, the default, as ACP means them) or the agent session's running totals
    /// (`cumulative`, as copilot reports them), from which each turn's increase is taken.
    #[serde(default)]
    pub usage_totals: UsageReporting,
}

/// What an agent's token reports (`PromptResponse.usage`) count.
///
/// Set in the profile, not guessed: a per-turn agent's reports grow turn after turn too
/// (each turn sends the whole conversation again), so reports that never fall do not tell
/// running totals apart, and a wrong guess would count a per-turn agent's turns as a few
/// tokens each — too little, which lets a budget through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageReporting {
    /// Each report is the turn's own tokens.
    #[default]
    PerTurn,
    /// Each report is the agent session's running total: a turn used its increase over
    /// the previous report; a report below it (in any kind), or of another ACP session, is
    /// a new count, taken whole.
    Cumulative,
}

/// The ACP method of a native restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RestoreMethod {
    /// `session/resume`: the agent restores its context without replaying it.
    Resume,
    /// `session/load`: the agent restores its context and replays the conversation.
    Load,
}

/// What an agent advertised at `initialize` that the resume ladder reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Advertised {
    /// `agentCapabilities.sessionCapabilities.resume`.
    pub resume: bool,
    /// `agentCapabilities.loadSession`.
    pub load: bool,
}

/// Container settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DockerSettings {
    /// The image; `None` means the agent cannot run in Docker.
    pub image: Option<String>,
    /// Memory limit in MiB.
    pub memory_mb: u64,
    /// CPU limit.
    pub cpus: f64,
    /// The most processes and threads the container may hold (a fork bomb stops there); 0
    /// lifts the limit.
    #[serde(default = "defaults::pids_limit")]
    pub pids_limit: u64,
    /// Placement: the labels an engine must carry to run this agent (`gpu = "yes"`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The engine's container runtime to use (`runsc`: gVisor, a kernel of its own between
    /// the agent and the host's); `None`: the engine's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
}

/// Process timeouts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessSettings {
    /// How long `initialize` may take.
    pub init_timeout_ms: u64,
    /// The grace period of each stop step (EOF, then SIGTERM).
    pub stop_grace_ms: u64,
    /// A turn still running after this long is cancelled (for agents that may never
    /// answer); `None`, the default: turns may take as long as they take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_timeout_ms: Option<u64>,
    /// Variables the agent needs, with these exact values, when it runs as root (e.g.
    /// claude-agent-acp's `IS_SANDBOX = "1"`). Not set for it: it is unavailable as root,
    /// saying so; in a container (a sandbox) they are set.
    #[serde(default)]
    pub root_env: BTreeMap<String, String>,
    /// Who the agent runs as: a user name, a uid, or `uid:gid` (an image without
    /// `/etc/passwd`). agentctl, running as root, starts the agent with that user's uid,
    /// gid and groups (and its `HOME`, `USER`, `LOGNAME` unless the profile sets them), so
    /// it cannot read the daemon's data or another session's secrets; the workspace is
    /// shared through group permissions. `None`: as agentctl's own user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// Where a profile was defined.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "path")]
pub enum ProfileSource {
    /// Compiled into the binary from `agents/profiles/<name>`.
    Builtin(String),
    /// A user file.
    File(PathBuf),
}

impl fmt::Display for ProfileSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProfileSource::Builtin(name) => write!(f, "builtin:{name}"),
            ProfileSource::File(path) => write!(f, "{}", path.display()),
        }
    }
}

fn default_runtime() -> String {
    "standalone".into()
}

/// Defaults for optional fields.
pub mod defaults {
    /// `session.resume_context_budget`, in characters.
    pub const RESUME_CONTEXT_BUDGET: usize = 50_000;
    /// `session.context_handoff_percent`.
    pub const CONTEXT_HANDOFF_PERCENT: u8 = 85;

    /// [`CONTEXT_HANDOFF_PERCENT`], for serde (profile snapshots stored before the field).
    pub fn context_handoff_percent() -> u8 {
        CONTEXT_HANDOFF_PERCENT
    }
    /// `session.client_fs`, for serde (profile snapshots stored before the field): offered.
    pub fn client_fs() -> bool {
        true
    }
    /// `docker.memory_mb`.
    pub const MEMORY_MB: u64 = 2048;
    /// `docker.cpus`.
    pub const CPUS: f64 = 2.0;
    /// `docker.pids_limit`.
    pub const PIDS_LIMIT: u64 = 4096;

    /// [`PIDS_LIMIT`], for serde (profile snapshots stored before the field).
    pub fn pids_limit() -> u64 {
        PIDS_LIMIT
    }
    /// `process.init_timeout_ms`.
    pub const INIT_TIMEOUT_MS: u64 = 30_000;
    /// `process.stop_grace_ms`.
    pub const STOP_GRACE_MS: u64 = 5_000;
}

impl Profile {
    /// How its agent is confined: its own `[sandbox]`, else `default` (the daemon's
    /// `config.toml` `[sandbox]`), else not at all.
    pub fn sandbox_or(&self, default: Option<&SandboxSettings>) -> SandboxSettings {
        self.sandbox.as_ref().or(default).cloned().unwrap_or_default()
    }

    /// Whether the agent gets variable `name` set and not empty: from the profile's own
    /// env, or from the environment it inherits (`inherited` says for that one).
    pub fn has_var(&self, name: &str, inherited: impl Fn(&str) -> bool) -> bool {
        self.env.get(name).is_some_and(|value| !value.is_empty()) || inherited(name)
    }

    /// The `authenticate` method to use among those the agent `offered`: the first of the
    /// profile's choices that is offered and whose credentials are there (see
    /// [`Profile::has_var`] for `inherited`).
    pub fn auth_method(
        &self,
        offered: &[String],
        inherited: impl Fn(&str) -> bool,
    ) -> Option<&str> {
        self.auth
            .iter()
            .find(|choice| {
                offered.contains(&choice.method)
                    && (choice.env.is_empty()
                        || choice.env.iter().any(|name| self.has_var(name, &inherited)))
            })
            .map(|choice| choice.method.as_str())
    }

    /// Whether a resume token is worth keeping: some restore path can use it.
    pub fn keeps_resume_token(&self) -> bool {
        self.session.native_resume != Some(false) || self.session.resume_command.is_some()
    }

    /// Whether a resume with a token relaunches the agent with `resume_command` (a profile
    /// that has one and does not insist on a native restore).
    pub fn relaunches_to_resume(&self) -> bool {
        self.session.resume_command.is_some() && self.session.native_resume != Some(true)
    }

    /// The native restore to try, given what the agent advertised: `None` when the
    /// profile turns it off, or leaves it to an agent that offers none.
    pub fn restore_method(&self, advertised: Advertised) -> Option<RestoreMethod> {
        let offered = if advertised.resume {
            Some(RestoreMethod::Resume)
        } else if advertised.load {
            Some(RestoreMethod::Load)
        } else {
            None
        };
        match self.session.native_resume {
            Some(false) => None,
            None => match self.session.restore_method {
                // A pinned method is used only when the agent restores at all.
                Some(method) => offered.map(|_| method),
                None => offered,
            },
            Some(true) => {
                Some(self.session.restore_method.or(offered).unwrap_or(RestoreMethod::Load))
            }
        }
    }

    /// Whether a fresh session after a resume gets the recorded history injected.
    pub fn injects_history(&self, native_failed: bool) -> bool {
        native_failed || self.session.history_injection != Some(false)
    }

    /// The `root_env` entries not set to their value, neither inherited (`inherited`
    /// returns a variable's value) nor in the profile's env; as `NAME=value`.
    pub fn root_env_missing(&self, inherited: impl Fn(&str) -> Option<String>) -> Vec<String> {
        self.process
            .root_env
            .iter()
            .filter(|(name, value)| {
                self.env.get(*name).or(inherited(name).as_ref()) != Some(*value)
            })
            .map(|(name, value)| format!("{name}={value}"))
            .collect()
    }

    /// The launch argv with `{home}` expanded.
    pub fn launch_argv(&self, home: &Path) -> Vec<String> {
        expand_all(&self.command, home, None)
    }

    /// The resume argv with `{home}` and `{token}` expanded, if the profile has one.
    pub fn resume_argv(&self, home: &Path, token: &str) -> Option<Vec<String>> {
        self.session.resume_command.as_ref().map(|argv| expand_all(argv, home, Some(token)))
    }

    /// The extra environment with `{home}` expanded.
    pub fn launch_env(&self, home: &Path) -> BTreeMap<String, String> {
        self.env.iter().map(|(key, value)| (key.clone(), expand(value, home, None))).collect()
    }
}

fn expand_all(argv: &[String], home: &Path, token: Option<&str>) -> Vec<String> {
    argv.iter().map(|arg| expand(arg, home, token)).collect()
}

fn expand(text: &str, home: &Path, token: Option<&str>) -> String {
    let mut out = text.replace("{home}", &home.to_string_lossy());
    if let Some(token) = token {
        out = out.replace("{token}", token);
    }
    out
}

/// A profile that failed to parse or validate, located in its file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{column}: {field}: {reason}")]
pub struct ProfileError {
    /// The file (or built-in) the error is in.
    pub file: ProfileSource,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// The dotted field path (`session.resume_command`), or `(file)` for file-level errors.
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

/// The `[sandbox]` table of another TOML file's `text` (the daemon's `config.toml`, its
/// default for profiles without one), checked as a profile's is; errors located in it.
pub fn parse_sandbox_table(
    text: &str,
    source: ProfileSource,
) -> Result<Option<SandboxSettings>, ProfileError> {
    #[derive(Deserialize)]
    struct WithSandbox {
        sandbox: Option<sandbox::RawSandbox>,
    }
    let raw: WithSandbox = toml::from_str(text).map_err(|err| {
        let span = err.span().unwrap_or(0..0);
        let field = field_at(text, span.start).unwrap_or_else(|| "sandbox".to_owned());
        locate(text, &source, span, &field, err.message().trim().to_owned())
    })?;
    let check = Check { text, source: &source };
    raw.sandbox.map(|sandbox| sandbox.validate(&check)).transpose()
}

/// Parses and validates one profile file's text.
pub fn parse(text: &str, source: ProfileSource) -> Result<Profile, ProfileError> {
    let raw: RawProfile = match toml::from_str(text) {
        Ok(raw) => raw,
        Err(err) => {
            let span = err.span().unwrap_or(0..0);
            let field = field_at(text, span.start).unwrap_or_else(|| "(file)".to_owned());
            return Err(locate(text, &source, span, &field, err.message().trim().to_owned()));
        }
    };
    raw.validate(text, source)
}

fn locate(
    text: &str,
    source: &ProfileSource,
    span: Range<usize>,
    field: &str,
    reason: String,
) -> ProfileError {
    let (line, column) = line_col(text, span.start);
    ProfileError { file: source.clone(), line, column, field: field.to_owned(), reason }
}

// ---- the raw, strict shape of the file ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    id: Spanned<String>,
    display_name: Option<String>,
    command: Spanned<Vec<String>>,
    install: Option<String>,
    #[serde(default)]
    env: BTreeMap<Spanned<String>, Spanned<String>>,
    #[serde(default)]
    required_env: Vec<Spanned<String>>,
    protocol: Protocol,
    #[serde(default)]
    auth: Vec<RawAuth>,
    #[serde(default)]
    credentials: RawCredentials,
    runtime: Option<Spanned<String>>,
    #[serde(default)]
    session: RawSession,
    #[serde(default)]
    docker: RawDocker,
    #[serde(default)]
    process: RawProcess,
    workspace: Option<RawWorkspace>,
    pool: Option<RawPool>,
    sandbox: Option<sandbox::RawSandbox>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPool {
    warm: Spanned<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorkspace {
    repo: Option<Spanned<String>>,
    base: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawSession {
    native_resume: Option<bool>,
    restore_method: Option<RestoreMethod>,
    history_injection: Option<bool>,
    resume_command: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    agent_state_dirs: Vec<Spanned<String>>,
    #[serde(default)]
    state_files: Vec<Spanned<String>>,
    resume_context_budget: Option<Spanned<usize>>,
    context_handoff_percent: Option<Spanned<u8>>,
    idle_timeout_secs: Option<u64>,
    max_turns: Option<Spanned<u32>>,
    max_duration_secs: Option<Spanned<u64>>,
    summarize_on_pause: Option<bool>,
    client_fs: Option<bool>,
    usage_totals: Option<UsageReporting>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawCredentials {
    #[serde(default)]
    env: Vec<Spanned<String>>,
    #[serde(default)]
    files: Vec<Spanned<String>>,
    #[serde(default)]
    moved_by: BTreeMap<String, Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuth {
    method: Spanned<String>,
    #[serde(default)]
    env: Vec<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawDocker {
    image: Option<Spanned<String>>,
    memory_mb: Option<Spanned<u64>>,
    cpus: Option<Spanned<f64>>,
    pids_limit: Option<Spanned<u64>>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    runtime: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawProcess {
    init_timeout_ms: Option<Spanned<u64>>,
    stop_grace_ms: Option<Spanned<u64>>,
    turn_timeout_ms: Option<Spanned<u64>>,
    #[serde(default)]
    root_env: BTreeMap<Spanned<String>, Spanned<String>>,
    user: Option<Spanned<String>>,
}

/// Collects the first validation error with its location.
struct Check<'a> {
    text: &'a str,
    source: &'a ProfileSource,
}

impl Check<'_> {
    fn fail<T>(
        &self,
        span: Range<usize>,
        field: &str,
        reason: impl Into<String>,
    ) -> Result<T, ProfileError> {
        Err(locate(self.text, self.source, span, field, reason.into()))
    }

    fn ensure(
        &self,
        ok: bool,
        span: Range<usize>,
        field: &str,
        reason: &str,
    ) -> Result<(), ProfileError> {
        if ok { Ok(()) } else { self.fail(span, field, reason) }
    }

    fn env_name(&self, name: &Spanned<String>, field: &str) -> Result<(), ProfileError> {
        self.ensure(
            is_env_name(name.get_ref()),
            name.span(),
            field,
            "not a valid environment variable name",
        )
    }

    fn argv(
        &self,
        argv: &Spanned<Vec<String>>,
        field: &str,
        allowed: &[&str],
    ) -> Result<(), ProfileError> {
        self.ensure(
            !argv.get_ref().is_empty(),
            argv.span(),
            field,
            "must name a program (an empty argv)",
        )?;
        self.ensure(
            !argv.get_ref()[0].trim().is_empty(),
            argv.span(),
            field,
            "the program name is empty",
        )?;
        for arg in argv.get_ref() {
            if let Err(reason) = check_placeholders(arg, allowed) {
                return self.fail(argv.span(), field, reason);
            }
        }
        Ok(())
    }
}

impl RawProfile {
    /// Checks every field, in order, up to the first error, and resolves the defaults.
    fn validate(self, text: &str, source: ProfileSource) -> Result<Profile, ProfileError> {
        let check = Check { text, source: &source };
        self.check_launch(&check)?;
        self.check_env(&check)?;
        self.process.check_env_and_user(&check)?;
        let auth = self
            .auth
            .into_iter()
            .map(|choice| choice.validate(&check))
            .collect::<Result<Vec<_>, _>>()?;
        let credentials = self.credentials.validate(&check)?;
        for name in &self.required_env {
            check.env_name(name, "required_env")?;
        }
        let session = self.session.validate(&check)?;
        let docker = self.docker.validate(&check)?;
        let workspace = self.workspace.map(|workspace| workspace.validate(&check)).transpose()?;
        let process = self.process.validate(&check)?;
        let sandbox = self.sandbox.map(|sandbox| sandbox.validate(&check)).transpose()?;
        if let Some(pool) = &self.pool {
            check.ensure(
                sandbox.as_ref().is_none_or(SandboxSettings::is_host) || *pool.warm.get_ref() == 0,
                pool.warm.span(),
                "pool.warm",
                "a warm agent starts before its session's workspace is known, so it cannot be confined to it: a profile with [sandbox] is not pooled",
            )?;
        }
        Ok(Profile {
            display_name: self.display_name.unwrap_or_else(|| self.id.get_ref().clone()),
            install: self.install,
            id: self.id.into_inner(),
            command: self.command.into_inner(),
            env: self
                .env
                .into_iter()
                .map(|(key, value)| (key.into_inner(), value.into_inner()))
                .collect(),
            required_env: self.required_env.into_iter().map(Spanned::into_inner).collect(),
            protocol: self.protocol,
            auth,
            credentials,
            runtime: self.runtime.map_or_else(default_runtime, Spanned::into_inner),
            session,
            docker,
            pool: PoolSettings { warm: self.pool.map_or(0, |pool| pool.warm.into_inner()) },
            workspace,
            process,
            sandbox,
            source,
            extends: None,
        })
    }

    /// Checks what launches the agent: `id`, `command`, `runtime` and `[pool]`.
    fn check_launch(&self, check: &Check<'_>) -> Result<(), ProfileError> {
        let id = self.id.get_ref();
        check.ensure(
            is_valid_id(id),
            self.id.span(),
            "id",
            "must match [a-z0-9][a-z0-9_-]* (at most 64 characters)",
        )?;
        check.argv(&self.command, "command", &["home"])?;
        if let Some(runtime) = &self.runtime {
            check.ensure(
                matches!(runtime.get_ref().as_str(), "standalone" | "docker"),
                runtime.span(),
                "runtime",
                "must be \"standalone\" or \"docker\"",
            )?;
        }
        if let Some(pool) = &self.pool {
            let warm = *pool.warm.get_ref();
            check.ensure(warm <= MAX_WARM, pool.warm.span(), "pool.warm", "must be at most 32")?;
            let standalone = self.runtime.as_ref().is_none_or(|r| r.get_ref() == "standalone");
            check.ensure(
                warm == 0 || standalone,
                pool.warm.span(),
                "pool.warm",
                "needs the standalone runtime (a container's mounts are fixed when it is created)",
            )?;
        }
        Ok(())
    }

    /// Checks `env`: each name, and the placeholders in each value.
    fn check_env(&self, check: &Check<'_>) -> Result<(), ProfileError> {
        for (key, value) in &self.env {
            check.env_name(key, "env")?;
            if let Err(reason) = check_placeholders(value.get_ref(), &["home"]) {
                return check.fail(value.span(), &format!("env.{}", key.get_ref()), reason);
            }
        }
        Ok(())
    }
}

impl RawAuth {
    /// Checks one `[[auth]]` choice (its method, then its variables) and resolves it.
    fn validate(self, check: &Check<'_>) -> Result<AuthChoice, ProfileError> {
        check.ensure(
            !self.method.get_ref().trim().is_empty(),
            self.method.span(),
            "auth.method",
            "must name one of the agent's authMethods",
        )?;
        for name in &self.env {
            check.env_name(name, "auth.env")?;
        }
        Ok(AuthChoice {
            method: self.method.into_inner(),
            env: self.env.into_iter().map(Spanned::into_inner).collect(),
        })
    }
}

impl RawCredentials {
    /// Checks `[credentials]` (`env`, `files`, then `moved_by`) and resolves it.
    fn validate(self, check: &Check<'_>) -> Result<Credentials, ProfileError> {
        for name in &self.env {
            check.env_name(name, "credentials.env")?;
        }
        for file in &self.files {
            check.ensure(
                is_inside(file.get_ref()),
                file.span(),
                "credentials.files",
                "must be a relative path inside the user's home, without ..",
            )?;
        }
        for (name, dir) in &self.moved_by {
            check.ensure(
                is_env_name(name),
                dir.span(),
                "credentials.moved_by",
                "each key must be a valid environment variable name",
            )?;
            check.ensure(
                is_inside(dir.get_ref()),
                dir.span(),
                "credentials.moved_by",
                "must be a relative path inside the user's home, without ..",
            )?;
        }
        Ok(Credentials {
            env: self.env.into_iter().map(Spanned::into_inner).collect(),
            files: self.files.into_iter().map(Spanned::into_inner).collect(),
            moved_by: self
                .moved_by
                .into_iter()
                .map(|(name, dir)| (name, dir.into_inner()))
                .collect(),
        })
    }
}

impl RawSession {
    /// Checks `[session]` in order and resolves its defaults.
    fn validate(self, check: &Check<'_>) -> Result<SessionSettings, ProfileError> {
        self.check_restore(check)?;
        let resume_context_budget = self.resume_context_budget(check)?;
        let context_handoff_percent = self.context_handoff_percent(check)?;
        self.check_limits(check)?;
        Ok(SessionSettings {
            native_resume: self.native_resume,
            restore_method: self.restore_method,
            history_injection: self.history_injection,
            resume_command: self.resume_command.map(Spanned::into_inner),
            agent_state_dirs: self.agent_state_dirs.into_iter().map(Spanned::into_inner).collect(),
            state_files: self.state_files.into_iter().map(Spanned::into_inner).collect(),
            resume_context_budget,
            context_handoff_percent,
            idle_timeout_secs: self.idle_timeout_secs,
            max_turns: self.max_turns.map(Spanned::into_inner),
            max_duration_secs: self.max_duration_secs.map(Spanned::into_inner),
            summarize_on_pause: self.summarize_on_pause.unwrap_or(false),
            client_fs: self.client_fs.unwrap_or(true),
            usage_totals: self.usage_totals.unwrap_or_default(),
        })
    }

    /// Checks what a restore uses: `resume_command`, `agent_state_dirs` and `state_files`.
    fn check_restore(&self, check: &Check<'_>) -> Result<(), ProfileError> {
        if let Some(resume) = &self.resume_command {
            check.argv(resume, "session.resume_command", &["home", "token"])?;
            check.ensure(
                resume.get_ref().iter().any(|arg| arg.contains("{token}")),
                resume.span(),
                "session.resume_command",
                "must contain {token}, where the resume token goes",
            )?;
        }
        for dir in &self.agent_state_dirs {
            check.ensure(
                is_inside(dir.get_ref()),
                dir.span(),
                "session.agent_state_dirs",
                "must be a relative path inside the agent's home, without ..",
            )?;
        }
        for file in &self.state_files {
            check.ensure(
                is_inside(file.get_ref()) && file.get_ref().contains("{acp_session}"),
                file.span(),
                "session.state_files",
                "must be a relative path inside the agent's home, without .., naming {acp_session}",
            )?;
        }
        Ok(())
    }

    /// `resume_context_budget`, checked, or its default.
    fn resume_context_budget(&self, check: &Check<'_>) -> Result<usize, ProfileError> {
        Ok(match &self.resume_context_budget {
            Some(budget) => {
                check.ensure(
                    *budget.get_ref() >= 1000,
                    budget.span(),
                    "session.resume_context_budget",
                    "must be at least 1000 characters",
                )?;
                *budget.get_ref()
            }
            None => defaults::RESUME_CONTEXT_BUDGET,
        })
    }

    /// `context_handoff_percent`, checked, or its default.
    fn context_handoff_percent(&self, check: &Check<'_>) -> Result<u8, ProfileError> {
        Ok(match &self.context_handoff_percent {
            Some(percent) => {
                check.ensure(
                    *percent.get_ref() <= 100,
                    percent.span(),
                    "session.context_handoff_percent",
                    "must be a percentage, 0 (never) to 100",
                )?;
                *percent.get_ref()
            }
            None => defaults::CONTEXT_HANDOFF_PERCENT,
        })
    }

    /// Checks that `max_turns` and `max_duration_secs`, when set, are at least 1.
    fn check_limits(&self, check: &Check<'_>) -> Result<(), ProfileError> {
        for (value, field) in [
            (
                self.max_turns.as_ref().map(|v| (u64::from(*v.get_ref()), v.span())),
                "session.max_turns",
            ),
            (
                self.max_duration_secs.as_ref().map(|v| (*v.get_ref(), v.span())),
                "session.max_duration_secs",
            ),
        ] {
            if let Some((value, span)) = value {
                check.ensure(
                    value > 0,
                    span,
                    field,
                    "must be at least 1 (leave it out for no limit)",
                )?;
            }
        }
        Ok(())
    }
}

impl RawDocker {
    /// Checks `[docker]` (`image`, `memory_mb`, `cpus`, then `pids_limit`) and resolves its
    /// defaults.
    fn validate(self, check: &Check<'_>) -> Result<DockerSettings, ProfileError> {
        if let Some(image) = &self.image {
            check.ensure(
                !image.get_ref().trim().is_empty(),
                image.span(),
                "docker.image",
                "must not be empty",
            )?;
        }
        let memory_mb = match &self.memory_mb {
            Some(memory) => {
                check.ensure(
                    *memory.get_ref() >= 64,
                    memory.span(),
                    "docker.memory_mb",
                    "must be at least 64",
                )?;
                *memory.get_ref()
            }
            None => defaults::MEMORY_MB,
        };
        let cpus = match &self.cpus {
            Some(cpus) => {
                let value = *cpus.get_ref();
                check.ensure(
                    value.is_finite() && value > 0.0,
                    cpus.span(),
                    "docker.cpus",
                    "must be a positive number",
                )?;
                value
            }
            None => defaults::CPUS,
        };
        let pids_limit = match &self.pids_limit {
            Some(limit) => {
                let value = *limit.get_ref();
                check.ensure(
                    value == 0 || value >= 64,
                    limit.span(),
                    "docker.pids_limit",
                    "must be at least 64 (or 0 for no limit)",
                )?;
                value
            }
            None => defaults::PIDS_LIMIT,
        };
        if let Some(runtime) = &self.runtime {
            let name = runtime.get_ref();
            let fine = !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
            check.ensure(
                fine,
                runtime.span(),
                "docker.runtime",
                "must be a runtime's name (runsc)",
            )?;
        }
        Ok(DockerSettings {
            image: self.image.map(Spanned::into_inner),
            memory_mb,
            cpus,
            pids_limit,
            labels: self.labels,
            runtime: self.runtime.map(Spanned::into_inner),
        })
    }
}

impl RawWorkspace {
    /// Checks `[workspace]` (`repo`, then `base`) and resolves it.
    fn validate(self, check: &Check<'_>) -> Result<WorkspaceSettings, ProfileError> {
        if let Some(repo) = &self.repo {
            check.ensure(
                Path::new(repo.get_ref()).is_absolute(),
                repo.span(),
                "workspace.repo",
                "must be an absolute path to a git repository",
            )?;
        }
        if let Some(base) = &self.base {
            let name = base.get_ref();
            check.ensure(
                !name.trim().is_empty() && !name.starts_with('-') && !name.contains(".."),
                base.span(),
                "workspace.base",
                "must name a branch or commit (not empty, no leading -, no ..)",
            )?;
        }
        Ok(WorkspaceSettings {
            repo: self.repo.map(Spanned::into_inner),
            base: self.base.map(Spanned::into_inner),
        })
    }
}

impl RawProcess {
    /// Checks the names in `root_env` and the `user` (the timeouts come later, in
    /// [`RawProcess::validate`]).
    fn check_env_and_user(&self, check: &Check<'_>) -> Result<(), ProfileError> {
        for key in self.root_env.keys() {
            check.env_name(key, "process.root_env")?;
        }
        if let Some(user) = &self.user {
            let text = user.get_ref();
            check.ensure(
                !text.is_empty() && !text.chars().any(|c| c.is_whitespace() || c.is_control()),
                user.span(),
                "process.user",
                "must name a user: a name, a uid, or uid:gid",
            )?;
        }
        Ok(())
    }

    /// Checks the timeouts and resolves `[process]` (its names and user are checked
    /// earlier, by [`RawProcess::check_env_and_user`]).
    fn validate(self, check: &Check<'_>) -> Result<ProcessSettings, ProfileError> {
        let positive = |value: &Option<Spanned<u64>>, field: &str, default: u64| match value {
            Some(value) => {
                check.ensure(
                    *value.get_ref() > 0,
                    value.span(),
                    field,
                    "must be greater than 0",
                )?;
                Ok(*value.get_ref())
            }
            None => Ok(default),
        };
        let init_timeout_ms =
            positive(&self.init_timeout_ms, "process.init_timeout_ms", defaults::INIT_TIMEOUT_MS)?;
        let stop_grace_ms =
            positive(&self.stop_grace_ms, "process.stop_grace_ms", defaults::STOP_GRACE_MS)?;
        let turn_timeout_ms = match &self.turn_timeout_ms {
            Some(value) => Some(positive(&Some(value.clone()), "process.turn_timeout_ms", 0)?),
            None => None,
        };
        Ok(ProcessSettings {
            init_timeout_ms,
            stop_grace_ms,
            turn_timeout_ms,
            root_env: self
                .root_env
                .into_iter()
                .map(|(key, value)| (key.into_inner(), value.into_inner()))
                .collect(),
            user: self.user.map(Spanned::into_inner),
        })
    }
}

/// A non-empty relative path of plain components (no `..`, no root).
fn is_inside(path: &str) -> bool {
    !path.is_empty()
        && Path::new(path).is_relative()
        && Path::new(path).components().all(|c| matches!(c, std::path::Component::Normal(_)))
}

fn is_valid_id(id: &str) -> bool {
    let mut bytes = id.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'0'..=b'9'))
        && id.len() <= 64
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_'))
}

fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'A'..=b'Z' | b'a'..=b'z' | b'_'))
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Checks that every `{name}` in `text` (a name: letters, digits, `_`) is one of
/// `allowed`, and that a name after `{` is closed at once. A `{` followed by anything
/// else (`"`, a space, `}`) is literal, so a value may hold JSON (codex's CODEX_CONFIG).
fn check_placeholders(text: &str, allowed: &[&str]) -> Result<(), String> {
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let name_len =
            after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
        let name = &after[..name_len];
        match after[name_len..].chars().next() {
            Some('}') if !name.is_empty() && !allowed.contains(&name) => {
                let allowed: Vec<String> =
                    allowed.iter().map(|name| format!("{{{name}}}")).collect();
                return Err(format!(
                    "unknown placeholder {{{name}}} (allowed here: {})",
                    allowed.join(", ")
                ));
            }
            Some('}') => {}
            // `{home.x}`, `{home-x}`, `{home`: a name not closed at once is a typo.
            _ if !name.is_empty() => {
                return Err(format!("unclosed placeholder in {text:?}"));
            }
            _ => {}
        }
        rest = &after[name_len..];
    }
    Ok(())
}

mod location;
mod sandbox;
#[cfg(test)]
mod tests;

pub use location::toml_location;
use location::{field_at, line_col};
pub use sandbox::{FilesystemAccess, NetworkAccess, SandboxSettings};
