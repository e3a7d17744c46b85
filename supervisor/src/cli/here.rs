//! Finding the session a command means when none is named (the one working in the current
//! directory), and what a paused session's resume says first.

use super::client::Client;
use super::{ApiClient, Exit, Failure, SessionState};
use protocol::api::SnapshotTrigger;

impl Client {
    /// `session`, or the session whose workspace is the current directory: of those not
    /// ended, the one there (refused, listing them, when several are).
    pub(super) async fn session_or_here(
        &self,
        session: Option<String>,
        what: &str,
    ) -> Result<String, Failure> {
        if let Some(session) = session {
            return Ok(session);
        }
        let here =
            std::env::current_dir().and_then(std::fs::canonicalize).map_err(|err| Failure {
                code: Exit::Usage,
                line: format!(
                    "error: no session named, and the current directory cannot be read: {err}"
                ),
            })?;
        let sessions =
            self.client.session_list(None, None, None).await.map_err(|e| self.failure(e))?;
        let same = |path: &str| std::fs::canonicalize(path).is_ok_and(|path| path == here);
        let mut found: Vec<_> = sessions
            .into_iter()
            .filter(|session| !session.state.is_terminal() && same(&session.workspace_path))
            .collect();
        match found.len() {
            1 => Ok(found.remove(0).id),
            0 => Err(Failure {
                code: Exit::NotFound,
                line: format!(
                    "error: no session works in {} (one not ended); name the session to {what} (supervisor sessions list)",
                    here.display()
                ),
            }),
            _ => {
                let list: Vec<String> = found
                    .iter()
                    .map(|s| format!("  {}\t{}\t{}", s.id, s.state.as_str(), s.agent_profile_id))
                    .collect();
                Err(Failure {
                    code: Exit::Usage,
                    line: format!(
                        "error: {} sessions work in {}; name the one to {what}:\n{}",
                        found.len(),
                        here.display(),
                        list.join("\n")
                    ),
                })
            }
        }
    }

    /// Before a paused session is resumed: why and when it paused, and what its newest
    /// snapshot says (nothing for a session that is not paused).
    pub(super) async fn pause_summary(&self, session: &str) -> Result<(), Failure> {
        let api = &*self.client;
        let status = api.session_status(session.to_owned()).await.map_err(|e| self.failure(e))?;
        if status.state != SessionState::Paused {
            return Ok(());
        }
        let listed = api.snapshot_list(session.to_owned()).await.map_err(|e| self.failure(e))?;
        // The newest; of one millisecond, a pause's before a turn's.
        let newest =
            listed.iter().max_by_key(|s| (s.taken_at, s.trigger != SnapshotTrigger::TurnComplete));
        let snapshot = match newest {
            Some(newest) => Some(
                api.snapshot_get(newest.snapshot_id.clone()).await.map_err(|e| self.failure(e))?,
            ),
            None => None,
        };
        for line in super::output::pause_summary(&status, snapshot.as_ref()) {
            println!("{line}");
        }
        Ok(())
    }
}
