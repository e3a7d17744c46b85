//! Identifiers as types: a workflow's id cannot be passed where a step's is wanted, nor a
//! turn's where an execution's is. Each is a string on the wire and in SQLite
//! (`#[serde(transparent)]`, bound and read as text), compared, hashed and shown as its
//! text, and read as a `&str` (or a file name: session directories are named by their
//! id) where text is wanted; no text becomes an id without saying so (`From`).

/// Declares an identifier newtype over `String`.
macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[derive(serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// The id with this text.
            pub fn new(id: impl Into<String>) -> $name {
                $name(id.into())
            }

            /// Its text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// Its text, owned.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> $name {
                $name(id)
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> $name {
                $name(id.to_owned())
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<std::path::Path> for $name {
            fn as_ref(&self) -> &std::path::Path {
                std::path::Path::new(&self.0)
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl rusqlite::ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
                self.0.to_sql()
            }
        }

        impl rusqlite::types::FromSql for $name {
            fn column_result(
                value: rusqlite::types::ValueRef<'_>,
            ) -> rusqlite::types::FromSqlResult<$name> {
                String::column_result(value).map($name)
            }
        }
    };
}

id_type! {
    /// A session (`task_sessions.id`).
    SessionId
}

id_type! {
    /// A workflow (`workflows.id`).
    WorkflowId
}

id_type! {
    /// A step of a workflow, unique within it (a `for_each` worker is `ID[N]`).
    StepId
}

id_type! {
    /// An execution: one run of a session's agent, from its launch or re-attach to its
    /// end (`executors_running.execution_id`).
    ExecutionId
}

id_type! {
    /// A turn: one prompt and the agent's work on it (`turns.turn_id`).
    TurnId
}

id_type! {
    /// A prompt waiting in a session's queue for the running turn to end
    /// (`prompt_queue.id`); the turn it becomes keeps it (`turns.queued_prompt`).
    PromptId
}

id_type! {
    /// A rewind of a session to one of its turns (`session_rewinds.id`); its saved
    /// workspace's ref is named after it.
    RewindId
}

#[cfg(test)]
mod tests {
    use super::{StepId, WorkflowId};

    #[test]
    fn an_id_is_its_text_on_the_wire_in_sqlite_and_when_shown() {
        let step = StepId::new("review[2]");
        assert_eq!(serde_json::to_string(&step).unwrap(), "\"review[2]\"");
        let back: StepId = serde_json::from_str("\"review[2]\"").unwrap();
        assert_eq!((back.to_string(), back.as_str()), ("review[2]".to_owned(), "review[2]"));
        assert!(step == "review[2]");
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let workflow = WorkflowId::from("wf-1");
        let read: WorkflowId = conn.query_row("SELECT ?1", [&workflow], |row| row.get(0)).unwrap();
        assert_eq!(read, workflow);
        let lookup: std::collections::HashMap<StepId, u32> = [(step, 1)].into();
        assert_eq!(lookup.get("review[2]"), Some(&1), "looked up by its text");
    }
}
