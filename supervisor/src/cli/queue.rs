//! `supervisor queue list|edit|remove|clear|resume SESSION`: a session's prompt queue —
//! prompts sent while a turn ran, run in order as turns end — and changing it.

use protocol::api::{ApiClient, PromptQueue};

use super::client::Client;
use super::output::{ago, print_json};
use super::{Failure, QueueCommand, usage};

impl Client {
    pub(super) async fn queue(&self, command: QueueCommand) -> Result<(), Failure> {
        let api = &*self.client;
        let (queue, json) = match command {
            QueueCommand::List { session, json } => {
                (api.session_queue_list(session).await.map_err(|e| self.failure(e))?, json.json)
            }
            QueueCommand::Edit { position, session, prompt_id, text } => {
                let text = (!text.is_empty()).then(|| text.join(" "));
                if text.is_none() && position.is_none() {
                    return Err(usage("error: queue edit changes the text (words after PROMPT_ID), --position, or both".into()));
                }
                let call = api.session_queue_edit(session, prompt_id, text, position);
                (call.await.map_err(|e| self.failure(e))?, false)
            }
            QueueCommand::Remove { session, prompt_id } => {
                let call = api.session_queue_remove(session, prompt_id);
                (call.await.map_err(|e| self.failure(e))?, false)
            }
            QueueCommand::Clear { session } => {
                (api.session_queue_clear(session).await.map_err(|e| self.failure(e))?, false)
            }
            QueueCommand::Resume { session } => {
                (api.session_queue_resume(session).await.map_err(|e| self.failure(e))?, false)
            }
        };
        if json {
            return print_json(&queue);
        }
        print_queue(&queue);
        Ok(())
    }
}

/// One line per queued prompt (place, id, when, its first line), and why it is halted.
fn print_queue(queue: &PromptQueue) {
    if let Some(why) = &queue.halted {
        println!("halted: {why} (supervisor queue resume SESSION lets it run)");
    }
    if queue.prompts.is_empty() {
        println!("no prompt is queued");
    }
    for prompt in &queue.prompts {
        let first_line = prompt.prompt.lines().next().unwrap_or_default();
        println!(
            "{}\t{}\t{}\t{}",
            prompt.position,
            prompt.prompt_id,
            ago(prompt.queued_at),
            crate::history::excerpt(first_line, 100)
        );
    }
}
