//! `[sandbox]`: how a profile's agent is confined — what of the file system it sees and
//! what of the network it reaches. Absent, the agent runs as before (`host` and `host`).

use std::path::Path;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::{Check, ProfileError};
use crate::allowlist::Allowlist;

/// What of the file system a confined agent sees.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FilesystemAccess {
    /// Its workspace and its own state read-write, the system read-only, a private `/tmp`,
    /// and of the rest only what the profile lists.
    Workspace,
    /// Everything its user may (unconfined).
    #[default]
    Host,
}

/// What of the network a confined agent reaches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkAccess {
    /// Only the allowlist's `host:port` pairs, through the session's egress proxy.
    Allowlist,
    /// No network at all.
    None,
    /// Everything (unconfined).
    #[default]
    Host,
}

/// `[sandbox]`, checked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSettings {
    /// What of the file system it sees.
    #[serde(default)]
    pub filesystem: FilesystemAccess,
    /// What of the network it reaches.
    #[serde(default)]
    pub network: NetworkAccess,
    /// With `network = "allowlist"`: the `host:port` pairs it may reach (normalized).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// With `filesystem = "workspace"`: more paths it may read (absolute, or `~/` for the
    /// agent's home), such as credentials.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readable: Vec<String>,
    /// With `filesystem = "workspace"`: more paths it may write (`~/.claude`, say).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writable: Vec<String>,
}

impl SandboxSettings {
    /// Unconfined: today's behaviour, the default.
    pub fn is_host(&self) -> bool {
        *self == SandboxSettings::default()
    }

    /// The allowlist (with `network = "allowlist"`; checked when the profile was parsed).
    pub fn allowlist(&self) -> Allowlist {
        Allowlist::parse(&self.allow).unwrap_or_default()
    }
}

/// The section as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSandbox {
    filesystem: Option<FilesystemAccess>,
    network: Option<NetworkAccess>,
    allow: Option<Spanned<Vec<String>>>,
    readable: Option<Spanned<Vec<String>>>,
    writable: Option<Spanned<Vec<String>>>,
}

impl RawSandbox {
    /// Checks `[sandbox]`: the allowlist's entries and that it goes with `network =
    /// "allowlist"`, then the extra paths and that they go with `filesystem = "workspace"`.
    pub(super) fn validate(self, check: &Check<'_>) -> Result<SandboxSettings, ProfileError> {
        let filesystem = self.filesystem.unwrap_or_default();
        let network = self.network.unwrap_or_default();
        let mut allow = Vec::new();
        if let Some(entries) = &self.allow {
            if network != NetworkAccess::Allowlist {
                return check.fail(
                    entries.span(),
                    "sandbox.allow",
                    "goes with network = \"allowlist\"",
                );
            }
            match Allowlist::parse(entries.get_ref()) {
                Ok(list) => allow = list.entries(),
                Err(err) => return check.fail(entries.span(), "sandbox.allow", err.to_string()),
            }
        }
        let paths = |field: &str,
                     list: &Option<Spanned<Vec<String>>>|
         -> Result<Vec<String>, ProfileError> {
            let Some(list) = list else { return Ok(Vec::new()) };
            let name = format!("sandbox.{field}");
            if filesystem != FilesystemAccess::Workspace {
                return check.fail(list.span(), &name, "goes with filesystem = \"workspace\"");
            }
            for path in list.get_ref() {
                let ok = Path::new(path).is_absolute() || path.starts_with("~/");
                if !ok || path.split('/').any(|part| part == "..") {
                    let reason =
                        format!("{path:?} is not an absolute path or one under ~/ (without ..)");
                    return check.fail(list.span(), &name, reason);
                }
            }
            Ok(list.get_ref().clone())
        };
        let readable = paths("readable", &self.readable)?;
        let writable = paths("writable", &self.writable)?;
        Ok(SandboxSettings { filesystem, network, allow, readable, writable })
    }
}
