//! Runtimes launch a session's agentctl somewhere and say how to reach it. The standalone
//! runtime starts it as a detached local process; the Docker runtime (a later issue)
//! implements the same trait with a container.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use agentctl::client::{self, LaunchConfig, LaunchError};
use protocol::control::ReadyInfo;

/// What a runtime needs to launch agentctl for one execution.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// The session.
    pub session_id: String,
    /// agentctl's state dir (spool, ready.json, log).
    pub state_dir: PathBuf,
    /// The bearer token for this execution.
    pub token: String,
    /// How long agentctl may take to print its ready line.
    pub ready_timeout: Duration,
}

/// A launched agentctl.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Where its control channel listens.
    pub addr: SocketAddr,
    /// What it announced.
    pub ready: ReadyInfo,
}

/// Errors from a runtime; the API reports them as `runtime_unavailable`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// agentctl could not be launched.
    #[error(transparent)]
    Launch(#[from] LaunchError),
}

/// A boxed future, so the trait stays object safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where agentctl runs.
pub trait Runtime: Send + Sync + 'static {
    /// `standalone` or `docker`, as stored in the session row.
    fn name(&self) -> &'static str;

    /// Launches agentctl and waits for its ready line.
    fn launch(&self, spec: LaunchSpec) -> BoxFuture<'_, Result<Endpoint, RuntimeError>>;
}

/// agentctl as a detached local process.
#[derive(Debug, Clone)]
pub struct StandaloneRuntime {
    /// The argv prefix that runs agentctl (its binary, or `supervisor agentctl`).
    pub agentctl: Vec<OsString>,
}

impl Runtime for StandaloneRuntime {
    fn name(&self) -> &'static str {
        "standalone"
    }

    fn launch(&self, spec: LaunchSpec) -> BoxFuture<'_, Result<Endpoint, RuntimeError>> {
        Box::pin(async move {
            let (program, prefix) =
                self.agentctl.split_first().expect("UNWRAP: the agentctl command is never empty");
            let config = LaunchConfig {
                program: PathBuf::from(program),
                prefix_args: prefix.to_vec(),
                state_dir: spec.state_dir,
                listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                token: spec.token,
                ready_timeout: spec.ready_timeout,
                extra_args: Vec::new(),
            };
            let launched = client::launch(&config).await?;
            Ok(Endpoint { addr: launched.addr, ready: launched.ready })
        })
    }
}
