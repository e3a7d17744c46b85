//! `supervisor engines list|drain NAME|undrain NAME`: the Docker engines, each one's state
//! and sessions, and taking one out of service and back.

use protocol::api::{ApiClient, EngineInfo, EngineState};

use super::client::Client;
use super::output::{ago, print_json};
use super::{EnginesCommand, Failure};

/// One engine, as `engines` lists it.
pub(super) fn engine_line(engine: &EngineInfo) -> String {
    let sessions = match engine.sessions.len() {
        1 => "1 session".to_owned(),
        n => format!("{n} sessions"),
    };
    let since = engine.since.map(|at| format!(" since {}", ago(at))).unwrap_or_default();
    let reason = engine.reason.as_deref().map(|r| format!("\t({r})")).unwrap_or_default();
    format!("{}\t{}{since}\t{sessions}{reason}", engine.name, engine.state.as_str())
}

impl Client {
    pub(super) async fn engines(&self, command: EnginesCommand) -> Result<(), Failure> {
        let api = &*self.client;
        let (engine, json) = match command {
            EnginesCommand::List { json } => {
                let listed = api.engines_list().await.map_err(|e| self.failure(e))?;
                if json.json {
                    return print_json(&listed);
                }
                for engine in &listed.engines {
                    println!("{}", engine_line(engine));
                    for session in &engine.sessions {
                        println!("  {session}");
                    }
                }
                return Ok(());
            }
            EnginesCommand::Drain { name, force_after_ms, json } => {
                let drained = api.engines_drain(name, force_after_ms).await;
                (drained.map_err(|e| self.failure(e))?, json.json)
            }
            EnginesCommand::Undrain { name, json } => {
                (api.engines_undrain(name).await.map_err(|e| self.failure(e))?, json.json)
            }
        };
        if json {
            return print_json(&engine);
        }
        println!("{}", engine_line(&engine));
        match engine.state {
            EngineState::Draining => eprintln!(
                "its sessions move to other engines at their next turn boundary; `supervisor engines list` shows what is left"
            ),
            EngineState::Serving => eprintln!("new sessions may be placed there again"),
            EngineState::Drained | EngineState::Unreachable => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_line_says_its_state_since_when_and_its_sessions() {
        let engine = EngineInfo {
            name: "gpu-1".into(),
            state: EngineState::Unreachable,
            reason: Some("connection refused".into()),
            sessions: vec!["s1".into(), "s2".into()],
            since: None,
        };
        assert_eq!(engine_line(&engine), "gpu-1\tunreachable\t2 sessions\t(connection refused)");
        let draining = EngineInfo {
            state: EngineState::Draining,
            reason: None,
            since: Some(0),
            sessions: vec!["s".into()],
            ..engine
        };
        assert!(
            engine_line(&draining).starts_with("gpu-1\tdraining since "),
            "{}",
            engine_line(&draining)
        );
        assert!(engine_line(&draining).ends_with("\t1 session"));
    }
}
