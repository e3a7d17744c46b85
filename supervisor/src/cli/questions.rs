//! An agent's elicitations (ACP `elicitation/create`) in the CLI: how one reads, and
//! `supervisor elicitation respond SESSION REQUEST accept|decline|cancel [--field K=V]…`,
//! each value typed by the form's own schema.

use serde_json::{Map, Value};

use super::client::Client;
use super::{Failure, usage};
use protocol::api::ApiClient;
use protocol::api::params::ElicitationAnswer;

/// What an elicitation asks, a line each: its message, then a form's fields (name, type,
/// whether required, its description) or a URL to visit.
pub(super) fn elicitation_lines(params: &Value) -> Vec<String> {
    let mut lines = vec![params["message"].as_str().unwrap_or("(no message)").to_owned()];
    if let Some(url) = params["url"].as_str() {
        lines.push(format!("visit {url}"));
    }
    let schema = &params["requestedSchema"];
    let required: Vec<&str> =
        schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    for (name, property) in schema["properties"].as_object().into_iter().flatten() {
        let kind = match property["enum"].as_array() {
            Some(choices) => {
                let choices: Vec<&str> = choices.iter().filter_map(Value::as_str).collect();
                format!("one of {}", choices.join(", "))
            }
            None => property["type"].as_str().unwrap_or("value").to_owned(),
        };
        let mut line = format!("field {name} ({kind}");
        if required.contains(&name.as_str()) {
            line.push_str(", required");
        }
        line.push(')');
        if let Some(about) = property["description"].as_str().or(property["title"].as_str()) {
            line.push_str(&format!(": {about}"));
        }
        lines.push(line);
    }
    lines
}

/// `--field K=V` values as the form's schema types them (numbers, booleans, lists split
/// at commas, text).
fn content(schema: &Value, fields: &[String]) -> Result<Map<String, Value>, Failure> {
    let mut content = Map::new();
    for field in fields {
        let Some((name, text)) = field.split_once('=') else {
            return Err(usage(format!("error: --field takes NAME=VALUE, not {field:?}")));
        };
        let property = &schema["properties"][name];
        if property.is_null() {
            let known: Vec<&String> =
                schema["properties"].as_object().map(|p| p.keys().collect()).unwrap_or_default();
            return Err(usage(format!(
                "error: the form has no field {name} (it has: {})",
                known.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
            )));
        }
        let bad = |what: &str| usage(format!("error: field {name} wants {what}, not {text:?}"));
        let value = match property["type"].as_str() {
            Some("boolean") => Value::Bool(text.parse().map_err(|_| bad("true or false"))?),
            Some("integer") => Value::from(text.parse::<i64>().map_err(|_| bad("an integer"))?),
            Some("number") => Value::from(text.parse::<f64>().map_err(|_| bad("a number"))?),
            Some("array") => Value::from(text.split(',').map(str::trim).collect::<Vec<_>>()),
            _ => Value::String(text.to_owned()),
        };
        content.insert(name.to_owned(), value);
    }
    Ok(content)
}

impl Client {
    pub(super) async fn elicitation_respond(
        &self,
        session: String,
        request: String,
        answer: &str,
        fields: &[String],
    ) -> Result<(), Failure> {
        let api = &*self.client;
        let action = match answer {
            "accept" => ElicitationAnswer::Accept,
            "decline" => ElicitationAnswer::Decline,
            "cancel" => ElicitationAnswer::Cancel,
            other => {
                return Err(usage(format!(
                    "error: answer with accept, decline or cancel, not {other:?}"
                )));
            }
        };
        let content = if action == ElicitationAnswer::Accept && !fields.is_empty() {
            let status = api.session_status(session.clone()).await.map_err(|e| self.failure(e))?;
            let Some(question) = status.open_questions.iter().find(|q| q.request_id == request)
            else {
                return Err(Failure {
                    code: super::Exit::NotFound,
                    line: format!("not found: session {session} has no open question {request}"),
                });
            };
            Some(content(&question.params["requestedSchema"], fields)?)
        } else if !fields.is_empty() {
            return Err(usage("error: --field goes with accept only".into()));
        } else {
            None
        };
        api.elicitation_respond(session.clone(), request.clone(), action, content)
            .await
            .map_err(|e| self.failure(e))?;
        println!("session {session}: elicitation {request} answered {answer}");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_form_reads_as_its_fields_and_values_take_their_types() {
        let params = json!({"message": "Who?", "requestedSchema": {"type": "object",
            "properties": {"name": {"type": "string", "title": "Name"},
                "age": {"type": "integer"}, "ok": {"type": "boolean"},
                "tags": {"type": "array"}, "size": {"type": "string", "enum": ["s", "m"]}},
            "required": ["name"]}});
        let lines = elicitation_lines(&params);
        assert_eq!(lines[0], "Who?");
        assert!(lines.contains(&"field name (string, required): Name".to_owned()), "{lines:?}");
        assert!(lines.contains(&"field size (one of s, m)".to_owned()), "{lines:?}");
        let fields: Vec<String> =
            ["name=Ada", "age=36", "ok=true", "tags=a, b"].iter().map(|f| f.to_string()).collect();
        let typed = content(&params["requestedSchema"], &fields).ok().unwrap();
        assert_eq!(
            Value::Object(typed),
            json!({"name": "Ada", "age": 36, "ok": true, "tags": ["a", "b"]})
        );
        assert!(content(&params["requestedSchema"], &["age=old".into()]).is_err());
        assert!(content(&params["requestedSchema"], &["nope=1".into()]).is_err());
    }
}
