//! What a `session/load` replays, held against the history: the recorded conversation a
//! load repeats (dropped, not recorded again), and what the agent's restore lacks (sent
//! with the next prompt).

use super::{
    EntryType, KnownConversation, REPLAY_WINDOW_BYTES, ResumeContext, SessionActor,
    SessionEventKind, history,
};

impl SessionActor {
    /// What a `session/load` may replay: the recorded conversation's newest messages and
    /// tool call ids (from the last [`REPLAY_WINDOW_BYTES`] of the history).
    pub(super) async fn known_conversation(&self) -> KnownConversation {
        let path = self.recorder.history.path().to_owned();
        let entries =
            tokio::task::spawn_blocking(move || history::read_tail(&path, REPLAY_WINDOW_BYTES))
                .await
                .unwrap_or_default();
        let mut known = KnownConversation::default();
        for entry in entries {
            match entry.kind {
                EntryType::UserMessage | EntryType::AgentMessage => {
                    // As the agent has it: without Tether's note on a cut-off reply.
                    let text = history::without_cut_off_notes(&entry.content);
                    known.texts.insert(text.trim().to_owned());
                }
                EntryType::ToolCall | EntryType::ToolResult => {
                    known.tool_calls.extend(entry.wire.tool_call_id);
                }
                // A replayed plan is dropped as a replay by its kind alone.
                EntryType::Plan => {}
            }
        }
        known
    }

    /// A load was answered: what its replay carried is held against the history. When the
    /// agent replayed messages but not the newest ones Tether recorded (an agent killed
    /// right after a turn may come back without it, or without its last answer: qwen-code
    /// writes that after the turn's end), what it lacks goes with the next prompt. A load
    /// that replayed no message (or replays after its answer, as gemini-cli does) cannot
    /// be checked, nor can a resume (it replays nothing).
    pub(super) async fn check_replay(&mut self) {
        let Some(replayed) =
            self.conversation.replayed_messages.take().filter(|text| !text.trim().is_empty())
        else {
            return;
        };
        let path = self.recorder.history.path().to_owned();
        let entries =
            tokio::task::spawn_blocking(move || history::read_tail(&path, REPLAY_WINDOW_BYTES))
                .await
                .unwrap_or_default();
        // Held as the agent has them: a cut-off reply without Tether's note on it.
        let messages: Vec<(u64, String)> = entries
            .iter()
            .filter(|entry| matches!(entry.kind, EntryType::UserMessage | EntryType::AgentMessage))
            .map(|entry| (entry.seq, history::without_cut_off_notes(&entry.content)))
            .filter(|(_, text)| !text.trim().is_empty())
            .collect();
        let Some(last_had) = messages.iter().rposition(|(_, text)| replayed.contains(text.trim()))
        else {
            return; // none of the recent ones: nothing to tell it by
        };
        let Some(&(first_missing, _)) = messages.get(last_had + 1) else { return };
        let lacking = messages.len() - last_had - 1;
        self.conversation.resume_context =
            Some(ResumeContext::Missing { after: first_missing - 1 });
        self.emit(SessionEventKind::Notice {
            message: format!(
                "the agent's restored conversation lacks the last {lacking} message(s) Tether recorded; they go with the next prompt"
            ),
        });
    }
}
