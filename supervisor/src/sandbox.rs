//! Confinement of an agent: what it may reach on the network. A session with
//! `network = "allowlist"` reaches the outside only through its [`egress`] proxy, which lets
//! through the `host:port` pairs of its profile's allowlist ([`agents::allowlist`]) and
//! reports every refusal.

pub mod egress;

use std::ffi::OsString;

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
    /// What gives it is not installed here.
    #[error(
        "[sandbox] network = \"none\" needs bubblewrap (bwrap), which is not installed here: install Debian's bubblewrap (apt-get install bubblewrap); the agent is never run unconfined instead"
    )]
    NoBwrap,
}

/// How an agent is confined as `sandbox` asks on `runtime`: the argv its command runs
/// under (empty: as it is), with `resolve` finding the programs that confine it. Every
/// launch asks first, and a profile it cannot confine is unavailable. So far: unconfined
/// (`host`, `host`) anywhere, and on the standalone runtime `network = "none"` with the
/// file system as it is — a network namespace of its own (bubblewrap), whose processes
/// die with the agent's sidecar.
pub fn confinement(
    sandbox: &SandboxSettings,
    runtime: &str,
    resolve: &crate::sidecar::Resolver,
) -> Result<Vec<OsString>, SandboxError> {
    if sandbox.is_host() {
        return Ok(Vec::new());
    }
    let standalone = runtime == "standalone";
    if standalone
        && sandbox.filesystem == FilesystemAccess::Host
        && sandbox.network == NetworkAccess::None
    {
        let mut argv = resolve("bwrap").ok_or(SandboxError::NoBwrap)?;
        argv.extend(
            ["--dev-bind", "/", "/", "--unshare-net", "--die-with-parent", "--"]
                .map(OsString::from),
        );
        return Ok(argv);
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
    use std::sync::Arc;

    fn resolver(bwrap: bool) -> crate::sidecar::Resolver {
        Arc::new(move |name| {
            (bwrap && name == "bwrap").then(|| vec![OsString::from("/usr/bin/bwrap")])
        })
    }

    #[test]
    fn an_unconfined_profile_runs_as_it_is() {
        let confinement = confinement(&SandboxSettings::default(), "docker", &resolver(false));
        assert_eq!(confinement, Ok(Vec::new()));
    }

    #[test]
    fn no_network_on_the_standalone_runtime_is_a_network_namespace_of_its_own() {
        let none = SandboxSettings { network: NetworkAccess::None, ..SandboxSettings::default() };
        let argv = confinement(&none, "standalone", &resolver(true)).unwrap();
        let argv: Vec<&str> = argv.iter().map(|arg| arg.to_str().unwrap()).collect();
        assert_eq!(
            argv,
            ["/usr/bin/bwrap", "--dev-bind", "/", "/", "--unshare-net", "--die-with-parent", "--"]
        );
        let err = confinement(&none, "standalone", &resolver(false)).unwrap_err();
        assert_eq!(err, SandboxError::NoBwrap);
        assert!(err.to_string().contains("apt-get install bubblewrap"), "{err}");
    }

    #[test]
    fn an_agent_is_never_run_unconfined_when_its_profile_asks_for_confinement() {
        let none = SandboxSettings { network: NetworkAccess::None, ..SandboxSettings::default() };
        let err = confinement(&none, "docker", &resolver(true)).unwrap_err();
        let said = err.to_string();
        assert!(
            said.contains("network = \"none\"") && said.contains("the docker runtime"),
            "{said}"
        );
        assert!(said.contains("never run unconfined"), "{said}");
        let workspace = SandboxSettings {
            filesystem: FilesystemAccess::Workspace,
            network: NetworkAccess::None,
            ..SandboxSettings::default()
        };
        let err = confinement(&workspace, "standalone", &resolver(true)).unwrap_err();
        assert!(matches!(err, SandboxError::NotGiven { .. }), "{err}");
    }
}
