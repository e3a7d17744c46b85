//! Validates recorded ACP traffic against the ACP v1 JSON schema
//! (`tests/acp/schema.v1.json`, vendored), each message against its own definition.
//!
//! The root schema is an untagged union that accepts almost anything, so it is never used.
//! Instead every definition carries `x-method` and `x-side` (the side that *handles* the
//! method): a request's params are checked against `<x-method, handler side>` with a name
//! ending in `Request`, a notification's against the one ending in `Notification`, and a
//! response's result against the `Response` definition of the request with the same id.

use std::collections::HashMap;

use protocol::frame::{self, Decoded};
use protocol::{Id, Message};
use serde_json::{Value, json};

use crate::Direction;

/// Which definition a message is checked against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    method: String,
    /// The side that handles the method: `agent` or `client`.
    side: &'static str,
    shape: Shape,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Shape {
    Request,
    Response,
    Notification,
}

impl Shape {
    fn suffix(self) -> &'static str {
        match self {
            Shape::Request => "Request",
            Shape::Response => "Response",
            Shape::Notification => "Notification",
        }
    }
}

/// One message that was checked, for reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// Who sent it.
    pub direction: Direction,
    /// The method (for responses, the method of the request they answer).
    pub method: String,
    /// The definition it was validated against.
    pub definition: String,
}

/// The schema, indexed by method and side.
pub struct AcpSchema {
    root: Value,
    definitions: HashMap<Key, String>,
    validators: HashMap<String, jsonschema::Validator>,
}

impl AcpSchema {
    /// Loads the vendored `tests/acp/schema.v1.json`.
    pub fn load() -> AcpSchema {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("acp/schema.v1.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|err| {
            panic!("cannot read the ACP schema at {}: {err}", path.display())
        });
        let root: Value = serde_json::from_str(&text).expect("the ACP schema is JSON");
        let mut definitions = HashMap::new();
        for (name, definition) in root["$defs"].as_object().expect("the schema has $defs") {
            let (Some(method), Some(side)) = (
                definition.get("x-method").and_then(Value::as_str),
                definition.get("x-side").and_then(Value::as_str),
            ) else {
                continue;
            };
            let side = match side {
                "agent" => "agent",
                "client" => "client",
                _ => continue,
            };
            for shape in [Shape::Request, Shape::Response, Shape::Notification] {
                if name.ends_with(shape.suffix()) {
                    definitions
                        .insert(Key { method: method.to_owned(), side, shape }, name.clone());
                }
            }
        }
        AcpSchema { root, definitions, validators: HashMap::new() }
    }

    /// Checks every line of both directions of a transcript. Returns what was checked, or
    /// every violation found (with the offending line).
    pub fn check_transcript(
        &mut self,
        to_agent: &[Vec<u8>],
        from_agent: &[Vec<u8>],
    ) -> Result<Vec<Checked>, Vec<String>> {
        // Requests by id, per sender, to find the method a response answers.
        let mut client_requests: HashMap<Id, String> = HashMap::new();
        let mut agent_requests: HashMap<Id, String> = HashMap::new();
        let decode_all = |lines: &[Vec<u8>]| -> Vec<Result<Message, String>> {
            lines
                .iter()
                .map(|line| match frame::decode(line) {
                    Decoded::Message(message) => Ok(message),
                    other => Err(format!("not a JSON-RPC message: {other:?}")),
                })
                .collect()
        };
        let to_agent = decode_all(to_agent);
        let from_agent = decode_all(from_agent);
        for message in to_agent.iter().flatten() {
            if let Message::Request(request) = message {
                client_requests.insert(request.id.clone(), request.method.clone());
            }
        }
        for message in from_agent.iter().flatten() {
            if let Message::Request(request) = message {
                agent_requests.insert(request.id.clone(), request.method.clone());
            }
        }
        let mut checked = Vec::new();
        let mut errors = Vec::new();
        for (direction, messages) in
            [(Direction::ToAgent, &to_agent), (Direction::FromAgent, &from_agent)]
        {
            // The side that handles requests this sender makes.
            let (handler, own_side, answered) = match direction {
                Direction::ToAgent => ("agent", "client", &agent_requests),
                Direction::FromAgent => ("client", "agent", &client_requests),
            };
            for message in messages {
                let message = match message {
                    Ok(message) => message,
                    Err(err) => {
                        errors.push(format!("{direction:?}: {err}"));
                        continue;
                    }
                };
                let (key, instance) = match message {
                    Message::Request(request) => (
                        Key {
                            method: request.method.clone(),
                            side: handler,
                            shape: Shape::Request,
                        },
                        request.params.clone().unwrap_or(Value::Null),
                    ),
                    Message::Notification(notification) => (
                        Key {
                            method: notification.method.clone(),
                            side: handler,
                            shape: Shape::Notification,
                        },
                        notification.params.clone().unwrap_or(Value::Null),
                    ),
                    Message::Response(response) => {
                        let Some(method) = answered.get(&response.id) else {
                            errors.push(format!(
                                "{direction:?}: response to unknown id {}",
                                response.id
                            ));
                            continue;
                        };
                        match &response.result {
                            Ok(result) => (
                                Key {
                                    method: method.clone(),
                                    side: own_side,
                                    shape: Shape::Response,
                                },
                                result.clone(),
                            ),
                            Err(error) => {
                                let value =
                                    serde_json::to_value(error).expect("UNWRAP: errors serialise");
                                if let Err(violations) = self.validate("Error", &value) {
                                    errors.push(format!(
                                        "{direction:?} error response to {method}: {violations}"
                                    ));
                                }
                                checked.push(Checked {
                                    direction,
                                    method: method.clone(),
                                    definition: "Error".into(),
                                });
                                continue;
                            }
                        }
                    }
                };
                let Some(definition) = self.definitions.get(&key).cloned() else {
                    errors.push(format!("{direction:?}: no schema definition for {key:?}"));
                    continue;
                };
                if let Err(violations) = self.validate(&definition, &instance) {
                    errors.push(format!(
                        "{direction:?} {} as {definition}: {violations}\n  {instance}",
                        key.method
                    ));
                }
                checked.push(Checked { direction, method: key.method, definition });
            }
        }
        if errors.is_empty() { Ok(checked) } else { Err(errors) }
    }

    /// Validates `instance` against `$defs/<definition>`.
    pub fn validate(&mut self, definition: &str, instance: &Value) -> Result<(), String> {
        if !self.validators.contains_key(definition) {
            // The root minus its loose union, pointing at one definition.
            let schema = json!({
                "$schema": self.root["$schema"],
                "$defs": self.root["$defs"],
                "$ref": format!("#/$defs/{definition}"),
            });
            let validator = jsonschema::validator_for(&schema)
                .unwrap_or_else(|err| panic!("cannot compile the schema for {definition}: {err}"));
            self.validators.insert(definition.to_owned(), validator);
        }
        let validator = &self.validators[definition];
        let violations: Vec<String> = validator
            .iter_errors(instance)
            .map(|err| format!("{} at {}", err, err.instance_path()))
            .collect();
        if violations.is_empty() { Ok(()) } else { Err(violations.join("; ")) }
    }
}
