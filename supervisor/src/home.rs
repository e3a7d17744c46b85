//! The data directory (`$TETHER_HOME`, default `$XDG_DATA_HOME/tether`, i.e.
//! `~/.local/share/tether`): mode 0700 (its directories 0700, its files 0600), and where
//! everything of a session lives.

use crate::ids::SessionId;
use std::io;
use std::path::{Path, PathBuf};

pub mod lock;

/// The data directory.
#[derive(Debug, Clone)]
pub struct Home {
    root: PathBuf,
}

impl Home {
    /// `$TETHER_HOME`, else `$XDG_DATA_HOME/tether`, else `~/.local/share/tether`.
    pub fn default_root() -> Option<PathBuf> {
        if let Some(home) = std::env::var_os("TETHER_HOME").filter(|v| !v.is_empty()) {
            return Some(PathBuf::from(home));
        }
        if let Some(data) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
            return Some(PathBuf::from(data).join("tether"));
        }
        std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/share/tether"))
    }

    /// Opens `root`, creating it and `sessions/` with mode 0700. The root is made absolute
    /// so the daemon never depends on its working directory.
    pub fn open(root: &Path) -> io::Result<Home> {
        let root = std::path::absolute(root)?;
        create_private_dir(&root)?;
        // An existing directory is made private too.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))?;
        create_private_dir(&root.join("sessions"))?;
        // Agents' own state (their logins among it) is as private as the rest; a directory
        // left 0755 by an older version is tightened.
        let agent_state = root.join("agent-state");
        create_private_dir(&agent_state)?;
        std::fs::set_permissions(&agent_state, std::fs::Permissions::from_mode(0o700))?;
        // Profiles and the config may hold keys (a profile's `[env]`): one a person made
        // under a permissive umask is tightened like the rest.
        for (path, mode) in [(root.join("profiles"), 0o700), (root.join("config.toml"), 0o600)] {
            match std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)) {
                Err(err) if err.kind() != io::ErrorKind::NotFound => {
                    return Err(io::Error::new(err.kind(), format!("{}: {err}", path.display())));
                }
                _ => {}
            }
        }
        Ok(Home { root })
    }

    /// The root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `state.db`.
    pub fn database(&self) -> PathBuf {
        self.root.join("state.db")
    }

    /// This installation's id (a UUID kept in `install_id`, created on first use): it
    /// marks the containers this installation owns.
    pub fn install_id(&self) -> io::Result<String> {
        use std::io::Write;
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let path = self.root.join("install_id");
        match std::fs::read_to_string(&path) {
            Ok(id) if is_valid_id(id.trim()) => {
                // Files here are 0600; one written 0644 by an older version is tightened.
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
                Ok(id.trim().to_owned())
            }
            Ok(_) | Err(_) => {
                let id = uuid::Uuid::new_v4().to_string();
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&path)?;
                file.write_all(id.as_bytes())?;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
                Ok(id)
            }
        }
    }

    /// `profiles/`.
    pub fn profiles(&self) -> PathBuf {
        self.root.join("profiles")
    }

    /// `sessions/<id>/`, created 0700.
    pub fn session_dir(&self, session_id: &SessionId) -> io::Result<PathBuf> {
        let dir = self.session_path(session_id);
        create_private_dir(&dir)?;
        Ok(dir)
    }

    /// `sessions/<id>/` without creating it. The id must be a UUID (checked by callers
    /// before any path is built from it).
    pub fn session_path(&self, session_id: &SessionId) -> PathBuf {
        self.sessions().join(session_id)
    }

    /// The files of one session (`sessions/<id>/…`), none created.
    pub fn session(&self, session_id: &SessionId) -> SessionPaths {
        SessionPaths::new(self.session_path(session_id))
    }

    /// `sessions/`.
    pub fn sessions(&self) -> PathBuf {
        self.root.join("sessions")
    }

    /// `pool/`: warm agents' sidecars, each in `pool/<id>/agentctl` (see `pool.rs`).
    pub fn pool(&self) -> PathBuf {
        self.root.join("pool")
    }

    /// The session whose agentctl state dir `dir` is (`sessions/<id>/agentctl`, or a warm
    /// sidecar's `pool/<id>/agentctl` that a session claimed), if any.
    pub fn session_of_agentctl(&self, dir: &Path) -> Option<SessionId> {
        let session = dir.parent()?;
        if session.parent() == Some(self.pool().as_path()) && dir.file_name()? == "agentctl" {
            return claimed_by(session);
        }
        let id = SessionId::from(session.file_name()?.to_str()?);
        (session.parent() == Some(self.sessions().as_path()) && self.session(&id).agentctl() == dir)
            .then_some(id)
    }

    /// `agent-state/<id>/`: what a session's agent keeps between executions (its own
    /// home's state), outside the session's directory.
    pub fn agent_state(&self, session_id: &SessionId) -> PathBuf {
        self.root.join("agent-state").join(session_id)
    }
}

/// The files of one session's directory: the only place their names are spelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPaths {
    dir: PathBuf,
}

impl SessionPaths {
    /// The files under `dir` (a session's directory).
    pub fn new(dir: PathBuf) -> SessionPaths {
        SessionPaths { dir }
    }

    /// The session's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `history.jsonl`: the conversation.
    pub fn history(&self) -> PathBuf {
        self.dir.join("history.jsonl")
    }

    /// `events/`: the session's event log.
    pub fn events(&self) -> PathBuf {
        self.dir.join("events")
    }

    /// `events.seq`: the highest event seq issued, beside the log so that it outlives it.
    pub fn events_mark(&self) -> PathBuf {
        self.dir.join("events.seq")
    }

    /// `agentctl/`: the sidecar's state dir (its spool, `ready.json`).
    pub fn agentctl(&self) -> PathBuf {
        self.dir.join("agentctl")
    }

    /// `agentctl/spool/`: the sidecar's spool of the agent's output.
    pub fn spool(&self) -> PathBuf {
        self.agentctl().join(agentctl::spool::SPOOL_DIR)
    }

    /// What the session keeps on disk, each with the name a delete reports it by.
    pub fn kept(&self) -> [(PathBuf, &'static str); 3] {
        [(self.history(), "history"), (self.events(), "events"), (self.agentctl(), "spool")]
    }
}

/// Whether `id` is a UUID in its hyphenated form: the only ids that become path components.
pub fn is_valid_id(id: &str) -> bool {
    uuid::Uuid::try_parse(id).is_ok_and(|uuid| uuid.hyphenated().to_string() == id)
}

/// Creates `dir` and any missing parents with mode 0700. A failure names the directory.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|err| io::Error::new(err.kind(), format!("{}: {err}", dir.display())))
}

/// The file of a warm sidecar's entry (`pool/<id>/`) naming the session that claimed it.
const CLAIMED_BY: &str = "claimed_by";

/// The session that claimed the warm sidecar in `entry` (`pool/<id>`), if one did.
pub fn claimed_by(entry: &Path) -> Option<SessionId> {
    let text = std::fs::read_to_string(entry.join(CLAIMED_BY)).ok()?;
    let id = text.trim();
    uuid::Uuid::parse_str(id).is_ok().then(|| id.into())
}

/// Marks a warm sidecar's entry as `session_id`'s (before its execution is recorded).
pub fn claim(state_dir: &Path, session_id: &SessionId) -> std::io::Result<()> {
    let entry = state_dir.parent().unwrap_or(state_dir);
    std::fs::write(entry.join(CLAIMED_BY), session_id.as_str())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_sidecars_state_dir_names_its_session_only_under_this_home() {
        let root = tempfile::tempdir().unwrap();
        let home = Home::open(root.path()).unwrap();
        let id = SessionId::from("01a21730-7013-75bf-a008-aa96bc7f83f2");
        let paths = home.session(&id);
        assert_eq!(home.session_of_agentctl(&paths.agentctl()), Some(id.clone()));
        assert_eq!(home.session_of_agentctl(&paths.spool()), None);
        assert_eq!(home.session_of_agentctl(paths.dir()), None);
        let elsewhere = Path::new("/elsewhere/sessions").join(&id).join("agentctl");
        assert_eq!(home.session_of_agentctl(&elsewhere), None);
        assert_eq!(paths.history(), home.session_path(&id).join("history.jsonl"));
    }

    /// `install_id` was 0644 and `agent-state/` 0755.
    #[test]
    fn the_install_id_and_agent_state_are_private_even_when_an_older_version_left_them_open() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tether");
        let home = Home::open(&root).unwrap();
        let id = home.install_id().unwrap();
        assert_eq!(mode(&root.join("install_id")), 0o600);
        assert_eq!(mode(&root.join("agent-state")), 0o700);
        create_private_dir(&root.join("agent-state/s/.codex")).unwrap();
        assert_eq!(mode(&root.join("agent-state/s")), 0o700);
        // As an older version left them.
        std::fs::set_permissions(root.join("install_id"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        std::fs::set_permissions(root.join("agent-state"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        let home = Home::open(&root).unwrap();
        assert_eq!(home.install_id().unwrap(), id, "the same id, kept");
        assert_eq!(mode(&root.join("install_id")), 0o600);
        assert_eq!(mode(&root.join("agent-state")), 0o700);
    }

    /// Profiles (which may hold keys) and the config, made by a person under a permissive
    /// umask, were left 0755/0644.
    #[test]
    fn profiles_and_the_config_are_made_private() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tether");
        std::fs::create_dir_all(root.join("profiles")).unwrap();
        std::fs::write(root.join("config.toml"), "").unwrap();
        std::fs::write(root.join("profiles/a.toml"), "").unwrap();
        for (path, loose) in [("profiles", 0o755), ("config.toml", 0o644)] {
            std::fs::set_permissions(root.join(path), std::fs::Permissions::from_mode(loose))
                .unwrap();
        }
        Home::open(&root).unwrap();
        assert_eq!(mode(&root.join("profiles")), 0o700);
        assert_eq!(mode(&root.join("config.toml")), 0o600);
        // Without them, nothing is made.
        let bare = dir.path().join("bare");
        Home::open(&bare).unwrap();
        assert!(!bare.join("config.toml").exists());
    }
}
