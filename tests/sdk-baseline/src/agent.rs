//! What both binaries do alike: read their arguments (exit 2 on bad ones) and run the agent
//! program behind the SDK's connection, on pipes, leaving no process behind.

use std::process::{ExitCode, Stdio};

use agent_client_protocol::ByteStreams;
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio_util::compat::{Compat, TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

/// The parsed arguments, or the exit code after saying what was wrong and how to call it.
pub fn args_or_usage<T>(name: &str, usage: &str, parsed: Result<T, String>) -> Result<T, ExitCode> {
    parsed.map_err(|e| {
        eprintln!("{name}: {e}\n{usage}");
        ExitCode::from(2)
    })
}

/// The agent's stdin and stdout as the SDK's connection takes them.
pub type Streams = ByteStreams<Compat<ChildStdin>, Compat<ChildStdout>>;

/// The agent program (`agent[0]` with the rest as its arguments, `env` added), started on
/// pipes, and its streams; stderr is passed through.
pub fn start(agent: &[String], env: &[(String, String)]) -> Result<(Child, Streams), String> {
    let mut child = tokio::process::Command::new(&agent[0])
        .args(&agent[1..])
        .envs(env.iter().map(|(name, value)| (name, value)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", agent[0]))?;
    let to_agent = child.stdin.take().expect("stdin is piped").compat_write();
    let from_agent = child.stdout.take().expect("stdout is piped").compat();
    Ok((child, ByteStreams::new(to_agent, from_agent)))
}

/// After the connection: the agent (its stdin closed with the connection) is killed, so no
/// process is left; the connection's outcome, said.
pub async fn finish<T>(
    mut child: Child,
    outcome: Result<T, agent_client_protocol::Error>,
) -> Result<T, String> {
    child.kill().await.ok();
    outcome.map_err(|e| format!("ACP connection failed: {e}"))
}
