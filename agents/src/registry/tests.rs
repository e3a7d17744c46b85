//! Tests for the registry: built-ins, overrides, availability and hot reload against a real
//! directory and a real watcher. Waits are on the catalog's watch channel.

use std::path::PathBuf;
use std::time::Duration;

use super::*;

const SETTLE: Duration = Duration::from_secs(20);

fn open(dir: &Path) -> Registry {
    Registry::open(dir, Duration::from_millis(50)).expect("the registry opens")
}

/// Waits until the catalog satisfies `pred` (a hang guard bounds the wait).
async fn settle(
    registry: &Registry,
    what: &str,
    pred: impl FnMut(&Arc<Catalog>) -> bool,
) -> Arc<Catalog> {
    let mut rx = registry.subscribe();
    match tokio::time::timeout(SETTLE, rx.wait_for(pred)).await {
        Ok(Ok(catalog)) => Arc::clone(&catalog),
        Ok(Err(_)) => panic!("the registry closed while waiting for {what}"),
        Err(_) => panic!("timed out waiting for {what}; catalog: {:?}", registry.catalog()),
    }
}

fn display_name(catalog: &Catalog, id: &str) -> Option<String> {
    catalog.get(id).map(|profile| profile.display_name.clone())
}

/// Writes like an editor that saves atomically: a temporary file, then a rename.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_file_name(format!(".{}.tmp", path.file_name().unwrap().to_string_lossy()));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn mock_override(display: &str) -> String {
    format!(
        "id = \"mock\"\ndisplay_name = \"{display}\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n"
    )
}

#[test]
fn every_builtin_parses_and_follows_the_design_table() {
    let profiles: BTreeMap<String, Profile> =
        builtins().into_iter().map(|result| result.unwrap()).map(|p| (p.id.clone(), p)).collect();
    let ids: Vec<&str> = profiles.keys().map(String::as_str).collect();
    assert_eq!(
        ids,
        [
            "amp",
            "auggie",
            "claude-code",
            "codex",
            "copilot",
            "eliza",
            "fast-agent",
            "gemini",
            "goose",
            "kimi",
            "mock",
            "opencode",
            "qwen"
        ]
    );
    // (native_resume, history_injection, has resume_command). The resume ladder
    // follows what each agent advertises, so no built-in overrides it (Amp's adapter had
    // no continue flag after all: it gets the history injected, as it advertises nothing).
    let expected = [
        ("claude-code", (None, None, false)),
        ("codex", (None, None, false)),
        ("copilot", (None, None, false)),
        ("auggie", (None, None, false)),
        ("gemini", (None, None, false)),
        ("amp", (None, None, false)),
        ("opencode", (None, None, false)),
        ("qwen", (None, None, false)),
        ("kimi", (None, None, false)),
        ("fast-agent", (None, None, false)),
        ("goose", (None, None, false)),
        ("mock", (None, None, false)),
        ("eliza", (None, None, false)),
    ];
    for (id, (native, injection, command)) in expected {
        let session = &profiles[id].session;
        assert_eq!(
            (session.native_resume, session.history_injection, session.resume_command.is_some()),
            (native, injection, command),
            "{id}"
        );
    }
    assert_eq!(
        profiles["claude-code"].process.root_env,
        BTreeMap::from([("IS_SANDBOX".to_owned(), "1".to_owned())])
    );
    assert_eq!(profiles["eliza"].command, ["elizacp", "--deterministic", "acp"]);
}

/// The built-ins started through `npx` name their adapter's version (unpinned,
/// `npx` picks whatever suits the installed Node: on Node 20, claude-agent-acp 0.49.0).
#[test]
fn npx_builtins_pin_their_adapter_version() {
    let profiles: BTreeMap<String, Profile> =
        builtins().into_iter().map(|result| result.unwrap()).map(|p| (p.id.clone(), p)).collect();
    for (id, package) in [
        ("claude-code", "@agentclientprotocol/claude-agent-acp@0.101.0"),
        ("codex", "@agentclientprotocol/codex-acp@2.6.0"),
    ] {
        assert_eq!(profiles[id].command, ["npx", "--yes", package], "{id}");
        // A first start downloads hundreds of MB before `initialize` is answered.
        assert!(profiles[id].process.init_timeout_ms >= 300_000, "{id}");
    }
}

#[test]
fn builtin_only_registry_lists_every_builtin() {
    let registry = Registry::builtin_only();
    assert_eq!(registry.list().len(), BUILTIN_FILES.len());
    assert!(registry.catalog().errors().is_empty());
    assert_eq!(registry.get("mock").unwrap().source, ProfileSource::Builtin("mock.toml".into()));
}

#[tokio::test]
async fn user_files_override_builtins_by_id_and_add_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mine.toml"), mock_override("My mock")).unwrap();
    std::fs::write(
        dir.path().join("extra.toml"),
        "id = \"extra\"\ncommand = [\"extra-agent\"]\nprotocol = \"acp\"\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a profile").unwrap();
    let registry = open(dir.path());
    let catalog = registry.catalog();
    assert_eq!(display_name(&catalog, "mock").as_deref(), Some("My mock"));
    assert_eq!(
        catalog.get("mock").unwrap().source,
        ProfileSource::File(dir.path().join("mine.toml"))
    );
    assert!(catalog.get("extra").is_some());
    assert_eq!(catalog.get("codex").unwrap().source, ProfileSource::Builtin("codex.toml".into()));
    assert!(catalog.errors().is_empty(), "{:?}", catalog.errors());
}

#[tokio::test]
async fn duplicate_ids_in_user_files_keep_the_first() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.toml"), mock_override("first")).unwrap();
    std::fs::write(dir.path().join("b.toml"), mock_override("second")).unwrap();
    let catalog = open(dir.path()).catalog();
    assert_eq!(display_name(&catalog, "mock").as_deref(), Some("first"));
    assert_eq!(catalog.errors().len(), 1);
    assert_eq!(catalog.errors()[0].field, "id");
    assert!(catalog.errors()[0].reason.contains("duplicate id"));
}

#[tokio::test]
async fn the_profiles_directory_is_created_private() {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("nested/profiles");
    let _registry = open(&dir);
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
}

/// An agent whose credentials are nowhere is not "available".
#[test]
fn availability_checks_credentials_in_the_environment_or_a_login_file() {
    let home = tempfile::tempdir().unwrap();
    let text = "id = \"t\"\ncommand = [\"sh\"]\nprotocol = \"acp\"\n[credentials]\nenv = [\"T_API_KEY\"]\nfiles = [\".t/auth.json\"]\n";
    let profile = profile::parse(text, ProfileSource::Builtin("t.toml".into())).unwrap();
    let mut environment = Environment::current(&[]);
    environment.vars.insert("HOME".into(), home.path().to_str().unwrap().into());
    environment.vars.remove("T_API_KEY");
    let missing = availability(&profile, &environment);
    assert!(!missing.available);
    assert_eq!(
        missing.reasons,
        ["needs credentials: set T_API_KEY, or log in first (none of ~/.t/auth.json was found)"]
    );
    environment.vars.insert("T_API_KEY".into(), "k".into());
    assert!(availability(&profile, &environment).available, "an API key");
    environment.vars.remove("T_API_KEY");
    let mut own_key = profile.clone();
    own_key.env.insert("T_API_KEY".into(), "k".into());
    assert!(availability(&own_key, &environment).available, "a key in the profile's env");
    environment.vars.remove("T_API_KEY");
    std::fs::create_dir(home.path().join(".t")).unwrap();
    std::fs::write(home.path().join(".t/auth.json"), "{}").unwrap();
    assert!(availability(&profile, &environment).available, "a login file");

    let bad =
        "id = \"t\"\ncommand = [\"sh\"]\nprotocol = \"acp\"\n[credentials]\nfiles = [\"../x\"]\n";
    let err = profile::parse(bad, ProfileSource::Builtin("t.toml".into())).unwrap_err();
    assert_eq!((err.line, err.field.as_str()), (5, "credentials.files"));
}

/// kimi's login lands in `$KIMI_SHARE_DIR/credentials` when that is set (its profile's
/// comment said so), but only `~/.kimi/credentials` was looked for: a variable that moves
/// a directory of the login files moves where they are looked for.
#[test]
fn a_variable_that_moves_the_login_directory_is_followed() {
    let home = tempfile::tempdir().unwrap();
    let share = tempfile::tempdir().unwrap();
    let text = "id = \"k\"\ncommand = [\"sh\"]\nprotocol = \"acp\"\n[credentials]\nfiles = [\".k/credentials\"]\nmoved_by = { K_SHARE_DIR = \".k\" }\n";
    let profile = profile::parse(text, ProfileSource::Builtin("k.toml".into())).unwrap();
    let mut environment = Environment::current(&[]);
    environment.vars.insert("HOME".into(), home.path().to_str().unwrap().into());
    environment.vars.insert("K_SHARE_DIR".into(), share.path().to_str().unwrap().into());
    let missing = availability(&profile, &environment);
    assert!(!missing.available);
    let moved = share.path().join("credentials");
    assert!(missing.reasons[0].contains(moved.to_str().unwrap()), "{missing:?}");
    std::fs::write(&moved, "{}").unwrap();
    assert!(availability(&profile, &environment).available, "found where the variable says");
    // Unset, the home's is looked for.
    environment.vars.remove("K_SHARE_DIR");
    assert!(!availability(&profile, &environment).available);
    std::fs::create_dir(home.path().join(".k")).unwrap();
    std::fs::write(home.path().join(".k/credentials"), "{}").unwrap();
    assert!(availability(&profile, &environment).available);
    let bad = text.replace("K_SHARE_DIR = \".k\"", "K_SHARE_DIR = \"../k\"");
    let err = profile::parse(&bad, ProfileSource::Builtin("k.toml".into())).unwrap_err();
    assert_eq!(err.field, "credentials.moved_by", "{err:?}");
}

/// claude-agent-acp as root refuses its session unless IS_SANDBOX=1: the
/// profile's root_env makes that an availability reason, and only for root.
#[test]
fn availability_as_root_names_the_root_env_it_lacks() {
    let text = "id = \"t\"\ncommand = [\"sh\"]\nprotocol = \"acp\"\n[process]\nroot_env = { IS_SANDBOX = \"1\" }\n";
    let profile = profile::parse(text, ProfileSource::Builtin("t.toml".into())).unwrap();
    let mut environment = Environment::current(&[]);
    environment.vars.remove("IS_SANDBOX");
    environment.root = false;
    assert!(availability(&profile, &environment).available, "not root: nothing needed");
    environment.root = true;
    let as_root = availability(&profile, &environment);
    assert!(!as_root.available);
    assert_eq!(as_root.reasons.len(), 1);
    assert!(as_root.reasons[0].starts_with("run as root, it needs IS_SANDBOX=1 "), "{as_root:?}");
    environment.vars.insert("IS_SANDBOX".into(), "1".into());
    assert!(availability(&profile, &environment).available, "set in the environment");
}

#[test]
fn availability_reports_missing_programs_and_variables() {
    let bin = tempfile::tempdir().unwrap();
    let program = bin.path().join("fake-agent");
    std::fs::write(&program, "#!/bin/sh\n").unwrap();
    let not_executable = bin.path().join("plain-file");
    std::fs::write(&not_executable, "").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let profile = |command: &str| {
        let text = format!(
            "id = \"t\"\ncommand = [\"{command}\"]\nprotocol = \"acp\"\nrequired_env = [\"T_KEY\", \"T_OTHER\"]\n"
        );
        profile::parse(&text, ProfileSource::Builtin("t.toml".into())).unwrap()
    };
    let mut environment = Environment {
        search_dirs: vec![PathBuf::from("/nonexistent"), bin.path().to_owned()],
        vars: HashMap::new(),
        root: false,
    };
    environment.vars.insert("T_KEY".into(), "secret".into());
    environment.vars.insert("T_OTHER".into(), String::new());

    let missing_var = availability(&profile("fake-agent"), &environment);
    assert!(!missing_var.available);
    assert_eq!(missing_var.program.as_deref(), Some(program.as_path()));
    assert_eq!(missing_var.reasons, ["the environment variable T_OTHER is not set"]);

    environment.vars.insert("T_OTHER".into(), "set".into());
    let ok = availability(&profile("fake-agent"), &environment);
    assert_eq!(
        ok,
        Availability { available: true, program: Some(program.clone()), reasons: vec![] }
    );

    let missing_program = availability(&profile("no-such-agent"), &environment);
    assert_eq!(missing_program.program, None);
    assert_eq!(
        missing_program.reasons,
        ["`no-such-agent` was not found on PATH; install it first"]
    );

    assert!(!availability(&profile("plain-file"), &environment).available, "not executable");
    assert!(
        availability(&profile(program.to_str().unwrap()), &environment).available,
        "an absolute path"
    );
}

#[tokio::test]
async fn atomic_replace_is_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let registry = open(dir.path());
    let before = registry.get("mock").unwrap();
    replace(&dir.path().join("mock.toml"), &mock_override("Replaced"));
    settle(&registry, "the replaced file", |c| {
        display_name(c, "mock").as_deref() == Some("Replaced")
    })
    .await;
    // A profile handed out earlier (a running session's snapshot) is unchanged.
    assert_eq!(before.display_name, "Mock agent");
}

#[tokio::test]
async fn an_invalid_edit_keeps_the_last_good_profile_and_reports_where() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mock.toml");
    let registry = open(dir.path());
    replace(&path, &mock_override("Good"));
    settle(&registry, "the good version", |c| display_name(c, "mock").as_deref() == Some("Good"))
        .await;

    replace(&path, &format!("{}[session]\nnative_resum = true\n", mock_override("Bad")));
    let catalog = settle(&registry, "the error", |c| !c.errors().is_empty()).await;
    assert_eq!(
        display_name(&catalog, "mock").as_deref(),
        Some("Good"),
        "the last good profile stays"
    );
    let error = &catalog.errors()[0];
    assert_eq!(error.file, ProfileSource::File(path.clone()));
    assert_eq!((error.line, error.column, error.field.as_str()), (6, 1, "session.native_resum"));

    // Fixing the file clears the error.
    replace(&path, &mock_override("Fixed"));
    let catalog =
        settle(&registry, "the fix", |c| display_name(c, "mock").as_deref() == Some("Fixed")).await;
    assert!(catalog.errors().is_empty());
}

#[tokio::test]
async fn deleting_an_override_restores_the_builtin() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("override.toml");
    std::fs::write(&path, mock_override("Override")).unwrap();
    let registry = open(dir.path());
    assert_eq!(display_name(&registry.catalog(), "mock").as_deref(), Some("Override"));
    std::fs::remove_file(&path).unwrap();
    settle(&registry, "the built-in back", |c| {
        display_name(c, "mock").as_deref() == Some("Mock agent")
    })
    .await;
}

#[tokio::test]
async fn rapid_writes_settle_on_the_final_content() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mock.toml");
    let registry = open(dir.path());
    for n in 1..=50 {
        if n % 2 == 0 {
            replace(&path, &mock_override(&format!("v{n}")));
        } else {
            std::fs::write(&path, mock_override(&format!("v{n}"))).unwrap();
        }
    }
    let catalog =
        settle(&registry, "the final write", |c| display_name(c, "mock").as_deref() == Some("v50"))
            .await;
    assert!(catalog.errors().is_empty(), "{:?}", catalog.errors());
}

/// A broken file was logged at every event of one edit (three times);
/// only errors a new catalog did not have before are said.
#[test]
fn only_new_profile_errors_are_reported() {
    let error = |reason: &str| ProfileError {
        file: ProfileSource::File("/p/a.toml".into()),
        line: 1,
        column: 1,
        field: "id".into(),
        reason: reason.into(),
    };
    let catalog = |errors: Vec<ProfileError>| Catalog { profiles: BTreeMap::new(), errors };
    let before = catalog(vec![error("x")]);
    assert!(catalog(vec![error("x")]).new_errors(&before).is_empty());
    let after = catalog(vec![error("x"), error("y")]);
    assert_eq!(after.new_errors(&before), [&error("y")]);
}

/// The agents that cannot be installed from a registry here (or need what this
/// machine lacks) say how to install them when their program is missing, and amp is not
/// called available for having `npx` (its adapter is on no registry).
#[test]
fn missing_builtins_say_how_to_install_them() {
    let environment = Environment { search_dirs: Vec::new(), vars: HashMap::new(), root: false };
    let profiles: BTreeMap<String, Profile> =
        builtins().into_iter().map(|result| result.unwrap()).map(|p| (p.id.clone(), p)).collect();
    for (id, how) in [
        ("kimi", "uv tool install kimi-cli"),
        ("fast-agent", "uv tool install fast-agent-mcp"),
        ("goose", "GitHub releases"),
        ("amp", "amp-acp is not on npm"),
        ("qwen", "npm install -g @qwen-code/qwen-code@0.15.10"),
    ] {
        let checked = availability(&profiles[id], &environment);
        assert!(!checked.available, "{id}");
        let reason = &checked.reasons[0];
        assert!(reason.contains("was not found on PATH; install it first: "), "{id}: {reason}");
        assert!(reason.contains(how), "{id}: {reason}");
    }
    assert_eq!(profiles["amp"].command[0], "amp-acp");
}
