//! `supervisor engines list|drain NAME|undrain NAME`: the Docker engines, each one's state
//! and sessions, and taking one out of service and back; `supervisor move`: a session to
//! another runtime.

use std::collections::BTreeMap;

use protocol::api::{ApiClient, EngineInfo, EngineState, RuntimeKind, SessionMoved};

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

/// A move, as `move` says it.
pub(super) fn moved_line(moved: &SessionMoved) -> String {
    let how = match (moved.resumed, moved.native) {
        (true, true) => "its agent resumed there with its own session",
        (true, false) => "its agent started there with the conversation injected",
        (false, true) => "its next resume starts it there, with its agent's own session",
        (false, false) => "its next resume starts it there, with the conversation injected",
    };
    format!("session {} moved from {} to {}: {how}", moved.session_id, moved.from, moved.to)
}

impl Client {
    pub(super) async fn move_session(
        &self,
        session: String,
        runtime: String,
        labels: BTreeMap<String, String>,
        force_after_ms: Option<u64>,
        json: bool,
    ) -> Result<(), Failure> {
        let labels = (!labels.is_empty()).then_some(labels);
        eprintln!("moving session {session} to runtime {runtime} (a running turn ends first)…");
        let moved = self
            .client
            .session_move(session, RuntimeKind::named(runtime), labels, force_after_ms)
            .await
            .map_err(|e| self.failure(e))?;
        if json {
            return print_json(&moved);
        }
        println!("{}", moved_line(&moved));
        Ok(())
    }

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

    #[test]
    fn a_move_line_says_where_from_where_to_and_how_the_agent_comes_back() {
        let moved = SessionMoved {
            session_id: "s".into(),
            from: "standalone".into(),
            to: "docker/local".into(),
            runtime: RuntimeKind::DOCKER,
            resumed: true,
            native: false,
        };
        assert_eq!(
            moved_line(&moved),
            "session s moved from standalone to docker/local: its agent started there with the conversation injected"
        );
        let at_rest = SessionMoved { resumed: false, native: true, ..moved };
        assert!(
            moved_line(&at_rest)
                .ends_with("its next resume starts it there, with its agent's own session")
        );
    }
}
