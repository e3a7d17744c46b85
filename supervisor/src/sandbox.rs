//! Confinement of an agent: what it may reach on the network. A session with
//! `network = "allowlist"` reaches the outside only through its [`egress`] proxy, which lets
//! through the `host:port` pairs of its profile's allowlist ([`agents::allowlist`]) and
//! reports every refusal.

pub mod egress;

use agents::profile::{FilesystemAccess, NetworkAccess, SandboxSettings};

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
}

/// Whether `runtime` can confine an agent as `sandbox` asks: every launch asks first, and
/// a profile it cannot confine is unavailable. Unconfined (`host`, `host`) always can.
pub fn confinable(sandbox: &SandboxSettings, runtime: &str) -> Result<(), SandboxError> {
    if sandbox.is_host() {
        return Ok(());
    }
    Err(SandboxError::NotGiven {
        runtime: runtime.to_owned(),
        filesystem: match sandbox.filesystem {
            FilesystemAccess::Workspace => "\"workspace\"",
            FilesystemAccess::Host => "\"host\"",
        },
        network: match sandbox.network {
            NetworkAccess::Allowlist => "\"allowlist\"",
            NetworkAccess::None => "\"none\"",
            NetworkAccess::Host => "\"host\"",
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_is_never_run_unconfined_when_its_profile_asks_for_confinement() {
        assert_eq!(confinable(&SandboxSettings::default(), "standalone"), Ok(()));
        let none = SandboxSettings { network: NetworkAccess::None, ..SandboxSettings::default() };
        let err = confinable(&none, "docker").unwrap_err();
        let said = err.to_string();
        assert!(
            said.contains("network = \"none\"") && said.contains("the docker runtime"),
            "{said}"
        );
        assert!(said.contains("never run unconfined"), "{said}");
    }
}
