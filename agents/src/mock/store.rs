//! mock-agent's own session persistence: one JSON file per session under `--state-dir`,
//! written atomically (temp file + rename) after every change, so that a new process can
//! `session/load` or `--resume` what an earlier one said.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Who said a stored message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The user's prompt text.
    User,
    /// The agent's reply text.
    Agent,
}

/// One message of a session's conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredMessage {
    /// Who said it.
    pub role: Role,
    /// What was said.
    pub text: String,
}

/// A session as mock-agent remembers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSession {
    /// The ACP session id.
    pub session_id: String,
    /// The working directory it was created with.
    pub cwd: PathBuf,
    /// The conversation so far.
    pub messages: Vec<StoredMessage>,
    /// The names of the MCP servers the client gave it at `session/new`.
    #[serde(default)]
    pub mcp_servers: Vec<String>,
    /// How many times a client closed it (`session/close`).
    #[serde(default)]
    pub closed: u32,
    /// The `additionalDirectories` it was created with.
    #[serde(default)]
    pub additional_directories: Vec<PathBuf>,
}

/// The names of an ACP request's `mcpServers`.
pub fn mcp_names<T: Serialize>(servers: &[T]) -> Vec<String> {
    servers
        .iter()
        .filter_map(|server| serde_json::to_value(server).ok())
        .filter_map(|server| server["name"].as_str().map(str::to_owned))
        .collect()
}

/// Where sessions live. `None` keeps them in memory only.
#[derive(Debug, Clone)]
pub struct Store {
    dir: Option<PathBuf>,
}

impl Store {
    /// A store under `dir`, or an in-memory one.
    pub fn new(dir: Option<PathBuf>) -> Store {
        Store { dir }
    }

    /// The state dir, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Loads a session; `Ok(None)` when it does not exist (or there is no state dir).
    pub fn load(&self, session_id: &str) -> io::Result<Option<StoredSession>> {
        let Some(path) = self.path(session_id)? else { return Ok(None) };
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|err| {
                io::Error::new(io::ErrorKind::InvalidData, format!("{}: {err}", path.display()))
            }),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Writes a session atomically.
    pub fn save(&self, session: &StoredSession) -> io::Result<()> {
        let Some(path) = self.path(&session.session_id)? else { return Ok(()) };
        let dir = path.parent().expect("UNWRAP: a session path has a parent");
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!(".{}.tmp", session.session_id));
        let bytes = serde_json::to_vec_pretty(session).map_err(io::Error::other)?;
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &path)
    }

    fn path(&self, session_id: &str) -> io::Result<Option<PathBuf>> {
        let Some(dir) = &self.dir else { return Ok(None) };
        if !is_safe_id(session_id) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("session id {session_id:?} is not a plain identifier"),
            ));
        }
        Ok(Some(Path::new(dir).join(format!("{session_id}.json"))))
    }
}

/// Session ids become file names, so only plain identifiers are accepted.
pub fn is_safe_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_round_trip_through_the_state_dir() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(Some(dir.path().to_owned()));
        assert_eq!(store.load("s-1").unwrap(), None);
        let session = StoredSession {
            session_id: "s-1".into(),
            cwd: "/w".into(),
            messages: vec![StoredMessage { role: Role::User, text: "hi".into() }],
            mcp_servers: vec!["files".into()],
            closed: 1,
            additional_directories: vec!["/data".into()],
        };
        store.save(&session).unwrap();
        assert_eq!(Store::new(Some(dir.path().to_owned())).load("s-1").unwrap(), Some(session));
    }

    #[test]
    fn path_like_ids_are_refused() {
        let store = Store::new(Some("/tmp".into()));
        assert!(store.load("../etc/passwd").is_err());
        assert!(!is_safe_id(""));
        assert!(is_safe_id("sess_0f-A"));
    }
}
