//! The profile registry: built-in profiles overridden by user files, hot reload, and
//! availability checks.
//!
//! Theory of operation:
//! - [`Registry::open`] creates the profiles directory if needed, starts a debounced
//!   watcher on the *directory* (editors replace files by rename, which a file watch would
//!   miss), then loads every `*.toml` in it over the built-ins.
//! - Each debounced batch of file events re-reads the directory. A file that fails to parse
//!   keeps the last good profile it produced, and its [`ProfileError`] (with `file:line:col`
//!   and the field) is published in [`Catalog::errors`]; a deleted file falls back to the
//!   built-in with the same id (or disappears if there is none).
//! - Consumers read [`Registry::catalog`] or [`Registry::subscribe`] to a
//!   `tokio::sync::watch` that changes only when the catalog does — never by polling.
//! - A running session keeps the [`Profile`] it started with: profiles are immutable
//!   `Arc`s, and a new catalog never changes an old one.
//!
//! Failure semantics: dropping the [`Registry`] stops the watcher; subscribers then see the
//! channel closed. Watcher errors are logged and the last catalog stays in force.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::RecursiveMode;
use notify_debouncer_full::{DebounceEventResult, Debouncer, RecommendedCache, new_debouncer};
use tokio::sync::watch;

mod extends;

pub use extends::Extended;

use crate::profile::{self, Profile, ProfileError, ProfileSource};

/// The built-in profiles, compiled in from `agents/profiles/`.
pub const BUILTIN_FILES: &[(&str, &str)] = &[
    ("amp.toml", include_str!("../profiles/amp.toml")),
    ("auggie.toml", include_str!("../profiles/auggie.toml")),
    ("claude-code.toml", include_str!("../profiles/claude-code.toml")),
    ("codex.toml", include_str!("../profiles/codex.toml")),
    ("copilot.toml", include_str!("../profiles/copilot.toml")),
    ("eliza.toml", include_str!("../profiles/eliza.toml")),
    ("fast-agent.toml", include_str!("../profiles/fast-agent.toml")),
    ("gemini.toml", include_str!("../profiles/gemini.toml")),
    ("goose.toml", include_str!("../profiles/goose.toml")),
    ("kimi.toml", include_str!("../profiles/kimi.toml")),
    ("mock.toml", include_str!("../profiles/mock.toml")),
    ("opencode.toml", include_str!("../profiles/opencode.toml")),
    ("qwen.toml", include_str!("../profiles/qwen.toml")),
];

/// How long file events are gathered before a reload: short enough that an edit is live
/// well within a second, long enough to fold an editor's write-rename-chmod into one.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(200);

/// Parses every built-in profile.
pub fn builtins() -> Vec<Result<Profile, ProfileError>> {
    BUILTIN_FILES
        .iter()
        .map(|(name, text)| profile::parse(text, ProfileSource::Builtin((*name).to_owned())))
        .collect()
}

/// One consistent view of the profiles and of the errors in user files.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Catalog {
    profiles: BTreeMap<String, Arc<Profile>>,
    errors: Vec<ProfileError>,
}

impl Catalog {
    /// The profile with this id.
    pub fn get(&self, id: &str) -> Option<&Arc<Profile>> {
        self.profiles.get(id)
    }

    /// Every profile, by id.
    pub fn profiles(&self) -> impl Iterator<Item = &Arc<Profile>> {
        self.profiles.values()
    }

    /// The files that failed to load in the last reload (their last good profile, if any,
    /// is still in force).
    pub fn errors(&self) -> &[ProfileError] {
        &self.errors
    }

    /// The errors of this catalog that `before` did not have.
    pub fn new_errors<'a>(&'a self, before: &Catalog) -> Vec<&'a ProfileError> {
        self.errors.iter().filter(|error| !before.errors.contains(error)).collect()
    }
}

/// Errors that stop the registry from starting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The profiles directory could not be created.
    #[error("cannot create the profiles directory {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The directory could not be watched.
    #[error("cannot watch the profiles directory {path}: {source}")]
    Watch {
        /// The directory.
        path: PathBuf,
        /// The watcher's error.
        source: notify::Error,
    },
}

/// Handle to the live profile catalog. Dropping it stops hot reload.
pub struct Registry {
    catalog_rx: watch::Receiver<Arc<Catalog>>,
    /// Kept alive for its side effect: the watcher thread runs while this exists.
    _debouncer: Option<Debouncer<notify::RecommendedWatcher, RecommendedCache>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("catalog", &*self.catalog_rx.borrow())
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// The built-in profiles only, without a directory or a watcher.
    pub fn builtin_only() -> Registry {
        let mut loader = Loader::new(None);
        let (_tx, catalog_rx) = watch::channel(Arc::new(loader.reload()));
        Registry { catalog_rx, _debouncer: None }
    }

    /// Loads built-ins and the user files in `dir` (created with mode 0700 if missing) and
    /// keeps them current as the directory changes.
    pub fn open(dir: &Path, debounce: Duration) -> Result<Registry, RegistryError> {
        create_private_dir(dir)
            .map_err(|source| RegistryError::CreateDir { path: dir.to_owned(), source })?;
        let loader = Arc::new(Mutex::new(Loader::new(Some(dir.to_owned()))));
        let (catalog_tx, catalog_rx) = watch::channel(Arc::new(Catalog::default()));
        let catalog_tx = Arc::new(catalog_tx);
        let reload = {
            let loader = Arc::clone(&loader);
            let catalog_tx = Arc::clone(&catalog_tx);
            move || {
                let catalog = loader.lock().expect("UNWRAP: never poisoned").reload();
                catalog_tx.send_if_modified(|current| {
                    if **current == catalog {
                        return false;
                    }
                    // Each broken file is said once, not at every event an edit makes.
                    for error in catalog.new_errors(current) {
                        tracing::warn!(%error, "profile not loaded");
                    }
                    *current = Arc::new(catalog);
                    true
                });
            }
        };
        let on_events = {
            let reload = reload.clone();
            move |result: DebounceEventResult| match result {
                Ok(_) => reload(),
                Err(errors) => {
                    for error in errors {
                        tracing::warn!(%error, "profile watcher error; the last catalog stays in force");
                    }
                }
            }
        };
        // Watch first, then load: an edit made in between is then seen by both, never by
        // neither.
        let mut debouncer = new_debouncer(debounce, None, on_events)
            .map_err(|source| RegistryError::Watch { path: dir.to_owned(), source })?;
        debouncer
            .watch(dir, RecursiveMode::NonRecursive)
            .map_err(|source| RegistryError::Watch { path: dir.to_owned(), source })?;
        reload();
        Ok(Registry { catalog_rx, _debouncer: Some(debouncer) })
    }

    /// The current catalog.
    pub fn catalog(&self) -> Arc<Catalog> {
        Arc::clone(&self.catalog_rx.borrow())
    }

    /// A profile by id, from the current catalog.
    pub fn get(&self, id: &str) -> Option<Arc<Profile>> {
        self.catalog_rx.borrow().get(id).cloned()
    }

    /// Every current profile.
    pub fn list(&self) -> Vec<Arc<Profile>> {
        self.catalog_rx.borrow().profiles().cloned().collect()
    }

    /// A receiver that wakes whenever the catalog changes.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Catalog>> {
        self.catalog_rx.clone()
    }
}

fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(err) => Err(err),
    }
}

/// Rebuilds catalogs; remembers each file's last good profile.
struct Loader {
    dir: Option<PathBuf>,
    builtins: Vec<Result<Profile, ProfileError>>,
    last_good: HashMap<PathBuf, Profile>,
}

impl Loader {
    fn new(dir: Option<PathBuf>) -> Loader {
        Loader { dir, builtins: builtins(), last_good: HashMap::new() }
    }

    fn reload(&mut self) -> Catalog {
        let mut catalog = Catalog::default();
        for builtin in &self.builtins {
            match builtin {
                Ok(profile) => {
                    catalog.profiles.insert(profile.id.clone(), Arc::new(profile.clone()));
                }
                Err(error) => catalog.errors.push(error.clone()),
            }
        }
        let Some(dir) = &self.dir else { return catalog };
        let files = match profile_files(dir) {
            Ok(files) => files,
            Err(err) => {
                tracing::warn!(dir = %dir.display(), %err, "cannot list the profiles directory");
                Vec::new()
            }
        };
        self.last_good.retain(|path, _| files.contains(path));
        let mut from_user: BTreeMap<String, PathBuf> = BTreeMap::new();
        for path in files {
            let source = ProfileSource::File(path.clone());
            let parsed = match std::fs::read_to_string(&path) {
                Ok(text) => extends::parse_user(&text, source.clone()),
                Err(err) => Err(ProfileError {
                    file: source,
                    line: 1,
                    column: 1,
                    field: "(file)".into(),
                    reason: format!("cannot read: {err}"),
                }),
            };
            match parsed {
                Ok(profile) => {
                    self.last_good.insert(path.clone(), profile);
                }
                Err(error) => catalog.errors.push(error),
            }
            let Some(profile) = self.last_good.get(&path) else { continue };
            if let Some(first) = from_user.get(&profile.id) {
                catalog.errors.push(ProfileError {
                    file: ProfileSource::File(path.clone()),
                    line: 1,
                    column: 1,
                    field: "id".into(),
                    reason: format!(
                        "duplicate id {:?}, already defined in {}",
                        profile.id,
                        first.display()
                    ),
                });
                continue;
            }
            from_user.insert(profile.id.clone(), path.clone());
            catalog.profiles.insert(profile.id.clone(), Arc::new(profile.clone()));
        }
        catalog
    }
}

/// The `*.toml` files in `dir`, sorted; hidden files (editor temporaries) are skipped.
fn profile_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|name| name.to_str()).unwrap_or_default();
        if !name.starts_with('.') && name.ends_with(".toml") && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Where programs are looked up and which variables are set, for [`availability`].
#[derive(Debug, Clone, Default)]
pub struct Environment {
    /// Directories searched for `command[0]`, in order.
    pub search_dirs: Vec<PathBuf>,
    /// The environment variables.
    pub vars: HashMap<String, String>,
    /// Whether agents run as root here (the profile's `process.root_env` then applies).
    pub root: bool,
}

impl Environment {
    /// This process's `PATH` and variables, with `extra_dirs` searched first (the
    /// supervisor passes its own directory, where `mock-agent` is installed beside it).
    pub fn current(extra_dirs: &[PathBuf]) -> Environment {
        let mut search_dirs = extra_dirs.to_vec();
        if let Some(path) = std::env::var_os("PATH") {
            search_dirs.extend(std::env::split_paths(&path));
        }
        Environment {
            search_dirs,
            vars: std::env::vars().collect(),
            root: nix::unistd::geteuid().is_root(),
        }
    }

    /// Resolves a program name as a shell would: a name with a `/` is a path, anything
    /// else is searched in `search_dirs`. Only executable files count.
    pub fn find_program(&self, program: &str) -> Option<PathBuf> {
        if program.contains('/') {
            let path = PathBuf::from(program);
            return is_executable(&path).then_some(path);
        }
        self.search_dirs.iter().map(|dir| dir.join(program)).find(|path| is_executable(path))
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// Whether a profile can be launched here, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Availability {
    /// True when nothing is missing.
    pub available: bool,
    /// The resolved program, when found.
    pub program: Option<PathBuf>,
    /// One human sentence per missing thing.
    pub reasons: Vec<String>,
}

/// Checks that `command[0]` can be found, every `required_env` variable is set, and the
/// agent's credentials are somewhere (one of `credentials.env` set, or one of its login
/// files under `$HOME`).
pub fn availability(profile: &Profile, environment: &Environment) -> Availability {
    let mut reasons = Vec::new();
    let program_name = &profile.command[0];
    let program = environment.find_program(program_name);
    if program.is_none() {
        reasons.push(match &profile.install {
            Some(how) => format!("`{program_name}` was not found on PATH; install it first: {how}"),
            None => format!("`{program_name}` was not found on PATH; install it first"),
        });
    }
    for name in &profile.required_env {
        if environment.vars.get(name).is_none_or(|value| value.is_empty()) {
            reasons.push(format!("the environment variable {name} is not set"));
        }
    }
    let credentials = &profile.credentials;
    if !credentials.env.is_empty() || !credentials.files.is_empty() {
        // A key may come from the supervisor's environment or from the profile's own env.
        let set = |name: &String| {
            profile.has_var(name, |name| environment.vars.get(name).is_some_and(|v| !v.is_empty()))
        };
        let home = environment.vars.get("HOME").filter(|home| !home.is_empty()).map(PathBuf::from);
        let var = |name: &str| {
            profile.env.get(name).cloned().or_else(|| environment.vars.get(name).cloned())
        };
        let logged_in = |file: &String| {
            home.as_ref().is_some_and(|home| credentials.file_path(file, home, var).exists())
        };
        if !credentials.env.iter().any(set) && !credentials.files.iter().any(logged_in) {
            let mut ways = Vec::new();
            if !credentials.env.is_empty() {
                ways.push(format!("set {}", credentials.env.join(" or ")));
            }
            if !credentials.files.is_empty() {
                let shown = |file: &String| match credentials.moved(file, var) {
                    Some(path) => path.display().to_string(),
                    None => format!("~/{file}"),
                };
                let files: Vec<String> = credentials.files.iter().map(shown).collect();
                ways.push(format!("log in first (none of {} was found)", files.join(", ")));
            }
            reasons.push(format!("needs credentials: {}", ways.join(", or ")));
        }
    }
    reasons.extend(root_env_lacking(profile, environment));
    Availability { available: reasons.is_empty(), program, reasons }
}

/// Why the agent cannot run as root here, if agents run as root and a variable of its
/// `process.root_env` is not set to its value (neither in `environment` nor in the
/// profile's env).
pub fn root_env_lacking(profile: &Profile, environment: &Environment) -> Option<String> {
    if !environment.root || profile.process.user.is_some() {
        return None;
    }
    let missing = profile.root_env_missing(|name| environment.vars.get(name).cloned());
    (!missing.is_empty()).then(|| {
        format!(
            "run as root, it needs {} in its environment (set it in the supervisor's \
             environment or the profile's [env]; in a container it is set)",
            missing.join(" and ")
        )
    })
}

#[cfg(test)]
mod tests;
