//! A pause's summary turn (`[session] summarize_on_pause`): the prompt that asks the agent
//! for its decisions, open problems and next steps as JSON, and the check of its answer
//! before the snapshot keeps it.
//!
//! The answer is looked for in the agent's messages of the summary turn, newest first, then
//! in all of them joined: the first that holds a valid object wins. A message may wrap the
//! object in a fenced code block or in prose; the object is what lies between its first `{`
//! and last `}`. Valid means: a JSON object with `decisions` (objects with a non-empty
//! `decision`, a `rationale` and an `alternatives` list of strings), `open_problems` and
//! `next_steps` (lists of strings); other members are ignored, each list holds at most
//! [`MAX_ITEMS`] items and each text is cut to [`ITEM_CHARS`] characters.

use crate::ids::SessionId;
use std::path::{Path, PathBuf};

use protocol::api::{AgentSummary, Decision, PauseSummary, SummaryState, TurnState};
use serde_json::Value;

use crate::history::{self, EntryType, excerpt};
use crate::store::Store;

/// The prompt of a summary turn.
pub const PROMPT: &str = "The session is being paused. Before it stops, summarise it for whoever resumes it.\n\
Answer with one JSON object and nothing else, in exactly this form:\n\
{\"decisions\": [{\"decision\": \"what you decided\", \"rationale\": \"why\", \"alternatives\": [\"what else you considered\"]}], \
\"open_problems\": [\"a problem that is still open\"], \"next_steps\": [\"what you would do next\"]}\n\
Use empty lists where there is nothing to say. Do not run tools or change files for this answer.";

/// The most items of one list in a summary.
pub const MAX_ITEMS: usize = 50;
/// The most characters of one text in a summary.
pub const ITEM_CHARS: usize = 1000;
/// How much of the history's end is read for the answer.
const ANSWER_TAIL_BYTES: u64 = 1024 * 1024;

/// Why an answer is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SummaryError {
    /// The agent said nothing in the summary turn.
    #[error("the agent's answer is empty")]
    Empty,
    /// No JSON object could be read from the answer.
    #[error("the answer holds no JSON object: {0}")]
    NotJson(String),
    /// The object lacks a member or has one of the wrong type.
    #[error("the answer's `{field}` {problem}")]
    Shape { field: String, problem: &'static str },
    /// A list is longer than [`MAX_ITEMS`].
    #[error("the answer's `{0}` has more than {MAX_ITEMS} items")]
    TooMany(&'static str),
}

/// A pause's summary when its agent was not asked: `off` when the profile does not ask for
/// one (`wanted`), else `skipped` saying `why`.
pub fn not_asked(wanted: bool, why: &str) -> PauseSummary {
    if wanted {
        without(SummaryState::Skipped, why)
    } else {
        without(SummaryState::Off, "the profile does not ask for one (session.summarize_on_pause)")
    }
}

/// A snapshot's summary in a state that holds no summary.
pub fn without(state: SummaryState, note: impl Into<String>) -> PauseSummary {
    PauseSummary { state, note: Some(note.into()), summary: None, turn_id: None }
}

/// The agent's messages of turn `turn_id` (the ones after the user message of that turn),
/// oldest first, from the end of the history at `path`.
pub fn answer_messages(path: &Path, turn_id: &crate::ids::TurnId) -> Vec<String> {
    let entries = history::read_tail(path, ANSWER_TAIL_BYTES);
    let Some(start) = entries.iter().rposition(|entry| {
        entry.kind == EntryType::UserMessage
            && entry.message_id.as_deref() == Some(turn_id.as_str())
    }) else {
        return Vec::new();
    };
    entries[start + 1..]
        .iter()
        .take_while(|entry| entry.kind != EntryType::UserMessage)
        .filter(|entry| entry.kind == EntryType::AgentMessage)
        .map(|entry| entry.content.clone())
        .collect()
}

/// What a pause's snapshot says of the summary its agent was asked for at `at` (Unix ms):
/// the answer of the session's first turn since, when it completed and validates.
pub async fn answer_of(
    store: &Store,
    session_id: SessionId,
    history: PathBuf,
    at: i64,
) -> PauseSummary {
    // The summary turn: the first since, with the summary's prompt (not a user's prompt a
    // restart sent meanwhile).
    let found = store.first_turn_with_prompt(session_id.clone(), at, PROMPT.to_owned()).await;
    let (id, state, stop_reason, error) = match found {
        Ok(Some(turn)) => turn,
        Ok(None) => {
            let note = "the supervisor stopped before the summary prompt was sent";
            return without(SummaryState::Failed, note);
        }
        Err(err) => return without(SummaryState::Failed, format!("cannot read the turns: {err}")),
    };
    let turn_id = Some(id.to_string());
    let cancelled = stop_reason.as_deref() == Some("cancelled");
    if state != TurnState::Completed || cancelled {
        let how = match (error, cancelled) {
            (Some(error), _) => format!("{state}: {error}"),
            (None, true) => "was cancelled before the agent answered".to_owned(),
            (None, false) => state.to_string(),
        };
        let note = format!("the summary turn {how}");
        return PauseSummary { turn_id, ..without(SummaryState::Failed, note) };
    }
    let messages = tokio::task::spawn_blocking(move || answer_messages(&history, &id))
        .await
        .unwrap_or_default();
    match from_answer(&messages) {
        Ok(stored) => {
            PauseSummary { state: SummaryState::Stored, note: None, summary: Some(stored), turn_id }
        }
        Err(err) => {
            tracing::warn!(session = %session_id, %err, "the agent's summary is refused");
            PauseSummary { turn_id, ..without(SummaryState::Invalid, err.to_string()) }
        }
    }
}

/// The summary in the agent's `messages` (see the module's rules), or why there is none.
pub fn from_answer(messages: &[String]) -> Result<AgentSummary, SummaryError> {
    if messages.iter().all(|message| message.trim().is_empty()) {
        return Err(SummaryError::Empty);
    }
    let joined = messages.concat();
    let mut first_error = None;
    for candidate in messages.iter().rev().chain(std::iter::once(&joined)) {
        match parse(candidate) {
            Ok(summary) => return Ok(summary),
            Err(err) => {
                first_error.get_or_insert(err);
            }
        }
    }
    Err(first_error.unwrap_or(SummaryError::Empty))
}

/// One candidate text.
fn parse(text: &str) -> Result<AgentSummary, SummaryError> {
    let text = text.trim();
    let value: Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(whole) => {
            let (Some(open), Some(close)) = (text.find('{'), text.rfind('}')) else {
                return Err(SummaryError::NotJson(whole.to_string()));
            };
            if close < open {
                return Err(SummaryError::NotJson(whole.to_string()));
            }
            serde_json::from_str(&text[open..=close])
                .map_err(|err| SummaryError::NotJson(err.to_string()))?
        }
    };
    let Value::Object(object) = value else {
        return Err(SummaryError::Shape { field: "answer".into(), problem: "is not an object" });
    };
    let list = |name: &'static str| -> Result<&Vec<Value>, SummaryError> {
        match object.get(name) {
            Some(Value::Array(items)) if items.len() > MAX_ITEMS => {
                Err(SummaryError::TooMany(name))
            }
            Some(Value::Array(items)) => Ok(items),
            Some(_) => Err(SummaryError::Shape { field: name.into(), problem: "is not a list" }),
            None => Err(SummaryError::Shape { field: name.into(), problem: "is missing" }),
        }
    };
    let decisions = list("decisions")?
        .iter()
        .enumerate()
        .map(|(idx, item)| decision(idx, item))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(AgentSummary {
        decisions,
        open_problems: texts("open_problems", list("open_problems")?)?,
        next_steps: texts("next_steps", list("next_steps")?)?,
    })
}

fn decision(idx: usize, item: &Value) -> Result<Decision, SummaryError> {
    let field = |name: &str| format!("decisions[{idx}].{name}");
    let Value::Object(item) = item else {
        return Err(SummaryError::Shape {
            field: format!("decisions[{idx}]"),
            problem: "is not an object",
        });
    };
    let text = |name: &str| match item.get(name) {
        Some(Value::String(text)) => Ok(excerpt(text.trim(), ITEM_CHARS)),
        Some(_) => Err(SummaryError::Shape { field: field(name), problem: "is not a string" }),
        None => Err(SummaryError::Shape { field: field(name), problem: "is missing" }),
    };
    let chosen = text("decision")?;
    if chosen.is_empty() {
        return Err(SummaryError::Shape { field: field("decision"), problem: "is empty" });
    }
    let alternatives = match item.get("alternatives") {
        Some(Value::Array(items)) if items.len() > MAX_ITEMS => {
            return Err(SummaryError::TooMany("alternatives"));
        }
        Some(Value::Array(items)) => texts("alternatives", items)?,
        Some(_) => {
            return Err(SummaryError::Shape {
                field: field("alternatives"),
                problem: "is not a list",
            });
        }
        None => {
            return Err(SummaryError::Shape {
                field: field("alternatives"),
                problem: "is missing",
            });
        }
    };
    Ok(Decision { decision: chosen, rationale: text("rationale")?, alternatives })
}

fn texts(name: &str, items: &[Value]) -> Result<Vec<String>, SummaryError> {
    items
        .iter()
        .enumerate()
        .map(|(idx, item)| match item {
            Value::String(text) => Ok(excerpt(text.trim(), ITEM_CHARS)),
            _ => Err(SummaryError::Shape {
                field: format!("{name}[{idx}]"),
                problem: "is not a string",
            }),
        })
        .collect()
}

/// The summary as a resume context's sections: decisions, open problems, next steps
/// (empty when there is none).
pub fn sections(summary: Option<&PauseSummary>) -> String {
    let Some(summary) = summary.and_then(|summary| summary.summary.as_ref()) else {
        return String::new();
    };
    let mut text = String::new();
    if !summary.decisions.is_empty() {
        text.push_str("\n=== DECISIONS (as the agent summarised them at the pause) ===\n");
        for decision in &summary.decisions {
            text.push_str(&format!("- {}", excerpt(&decision.decision, 300)));
            if !decision.rationale.is_empty() {
                text.push_str(&format!(" (because: {})", excerpt(&decision.rationale, 300)));
            }
            if !decision.alternatives.is_empty() {
                let others = excerpt(&decision.alternatives.join("; "), 300);
                text.push_str(&format!(" [considered: {others}]"));
            }
            text.push('\n');
        }
    }
    let mut list = |title: &str, items: &[String]| {
        if items.is_empty() {
            return;
        }
        text.push_str(&format!("\n=== {title} ===\n"));
        for item in items {
            text.push_str(&format!("- {}\n", excerpt(item, 300)));
        }
    };
    list("OPEN PROBLEMS", &summary.open_problems);
    list("NEXT STEPS (as the agent planned them at the pause)", &summary.next_steps);
    excerpt(&text, 6000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(text: &str) -> Result<AgentSummary, SummaryError> {
        from_answer(&[text.to_owned()])
    }

    const VALID: &str = r#"{"decisions":[{"decision":"use sqlite","rationale":"embedded","alternatives":["postgres"]}],"open_problems":["flaky test"],"next_steps":["fix it"],"extra":1}"#;

    #[test]
    fn a_valid_answer_is_read_also_inside_a_fence_or_prose() {
        let expected = AgentSummary {
            decisions: vec![Decision {
                decision: "use sqlite".into(),
                rationale: "embedded".into(),
                alternatives: vec!["postgres".into()],
            }],
            open_problems: vec!["flaky test".into()],
            next_steps: vec!["fix it".into()],
        };
        assert_eq!(answer(VALID).unwrap(), expected);
        assert_eq!(answer(&format!("```json\n{VALID}\n```")).unwrap(), expected);
        assert_eq!(answer(&format!("Here it is:\n{VALID}\nThanks.")).unwrap(), expected);
        // Split over messages, or preceded by a message of prose.
        let (head, tail) = VALID.split_at(40);
        assert_eq!(from_answer(&[head.into(), tail.into()]).unwrap(), expected);
        assert_eq!(from_answer(&["Summarising.".into(), VALID.into()]).unwrap(), expected);
    }

    #[test]
    fn a_malformed_answer_is_refused_saying_why() {
        assert_eq!(from_answer(&[]), Err(SummaryError::Empty));
        assert!(matches!(answer("I decided things."), Err(SummaryError::NotJson(_))));
        assert!(matches!(answer("{not json}"), Err(SummaryError::NotJson(_))));
        let missing = answer(r#"{"decisions":[],"open_problems":[]}"#).unwrap_err();
        assert_eq!(missing.to_string(), "the answer's `next_steps` is missing");
        let wrong = answer(r#"{"decisions":{},"open_problems":[],"next_steps":[]}"#);
        assert_eq!(wrong.unwrap_err().to_string(), "the answer's `decisions` is not a list");
        let empty = answer(
            r#"{"decisions":[{"decision":" ","rationale":"","alternatives":[]}],"open_problems":[],"next_steps":[]}"#,
        );
        assert_eq!(empty.unwrap_err().to_string(), "the answer's `decisions[0].decision` is empty");
        let typed = answer(r#"{"decisions":[],"open_problems":[3],"next_steps":[]}"#);
        assert_eq!(
            typed.unwrap_err().to_string(),
            "the answer's `open_problems[0]` is not a string"
        );
        let many = format!(
            r#"{{"decisions":[],"open_problems":[],"next_steps":[{}]}}"#,
            vec!["\"x\""; MAX_ITEMS + 1].join(",")
        );
        assert_eq!(answer(&many), Err(SummaryError::TooMany("next_steps")));
        assert!(matches!(answer("[1, 2]"), Err(SummaryError::Shape { .. })));
    }

    #[test]
    fn long_texts_are_cut_and_sections_say_each_part() {
        let long = "é".repeat(ITEM_CHARS + 10);
        let text = format!(
            r#"{{"decisions":[{{"decision":"{long}","rationale":"r","alternatives":[]}}],"open_problems":[],"next_steps":["a"]}}"#
        );
        let summary = answer(&text).unwrap();
        assert_eq!(summary.decisions[0].decision.chars().count(), ITEM_CHARS);
        let stored = PauseSummary {
            state: SummaryState::Stored,
            note: None,
            summary: Some(answer(VALID).unwrap()),
            turn_id: None,
        };
        let sections = sections(Some(&stored));
        assert!(sections.contains("- use sqlite (because: embedded) [considered: postgres]\n"));
        assert!(sections.contains("=== OPEN PROBLEMS ===\n- flaky test\n"));
        assert!(sections.contains("\n- fix it\n"));
        assert_eq!(super::sections(Some(&without(SummaryState::Off, "off"))), "");
    }
}
