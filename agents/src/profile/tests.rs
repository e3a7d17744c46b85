//! Tests for profile parsing and validation: defaults, located errors, placeholders and the
//! serialisable snapshot.

use std::path::Path;

use super::*;

fn file() -> ProfileSource {
    ProfileSource::File("/p/test.toml".into())
}

fn error(text: &str) -> ProfileError {
    match parse(text, file()) {
        Err(error) => error,
        Ok(profile) => panic!("expected an error, got {profile:?}"),
    }
}

const MINIMAL: &str = "id = \"x\"\ncommand = [\"x-agent\"]\nprotocol = \"acp\"\n";

#[test]
fn minimal_profile_gets_defaults() {
    let profile = parse(MINIMAL, file()).unwrap();
    assert_eq!(profile.display_name, "x");
    // Resume follows what the agent advertises; nothing is overridden.
    assert_eq!((profile.session.native_resume, profile.session.history_injection), (None, None));
    assert_eq!(profile.session.restore_method, None);
    assert!(profile.process.root_env.is_empty());
    assert_eq!(profile.session.resume_context_budget, defaults::RESUME_CONTEXT_BUDGET);
    assert_eq!(profile.docker.image, None);
    assert_eq!(profile.docker.memory_mb, defaults::MEMORY_MB);
    assert_eq!(profile.docker.pids_limit, defaults::PIDS_LIMIT);
    assert_eq!(profile.process.init_timeout_ms, defaults::INIT_TIMEOUT_MS);
    assert_eq!(profile.process.stop_grace_ms, defaults::STOP_GRACE_MS);
    assert!(profile.keeps_resume_token() && !profile.relaunches_to_resume());
    assert!(profile.injects_history(false));
}

/// A profile can ask for engines with labels; a snapshot stored before the field
/// reads as asking for none.
#[test]
fn docker_placement_labels_are_read_and_optional() {
    let text = "id = \"x\"\ncommand = [\"x\"]\nprotocol = \"acp\"\n[docker]\nimage = \"i\"\nlabels = { gpu = \"yes\" }\n";
    let profile = parse(text, file()).unwrap();
    assert_eq!(profile.docker.labels.get("gpu").map(String::as_str), Some("yes"));
    assert!(parse(MINIMAL, file()).unwrap().docker.labels.is_empty());
    let mut stored = serde_json::to_value(&profile).unwrap();
    stored["docker"].as_object_mut().unwrap().remove("labels");
    stored["docker"].as_object_mut().unwrap().remove("pids_limit");
    let old: Profile = serde_json::from_value(stored).unwrap();
    assert!(old.docker.labels.is_empty());
    let bad = error(
        "id = \"x\"\ncommand = [\"x\"]\nprotocol = \"acp\"\n[docker]\nlabels = { gpu = 1 }\n",
    );
    assert!(bad.to_string().contains("docker.labels"), "{bad}");
}

/// The ladder: the agent's advertisement decides, the profile overrides.
#[test]
fn the_restore_method_follows_the_agent_unless_the_profile_overrides_it() {
    use RestoreMethod::{Load, Resume};
    let with = |session: &str| parse(&format!("{MINIMAL}[session]\n{session}\n"), file()).unwrap();
    let both = Advertised { resume: true, load: true };
    let load = Advertised { resume: false, load: true };
    let none = Advertised::default();
    let cases = [
        ("", both, Some(Resume)),
        ("", load, Some(Load)),
        ("", none, None),
        ("native_resume = false", both, None),
        ("native_resume = true", none, Some(Load)),
        ("native_resume = true", both, Some(Resume)),
        ("restore_method = \"load\"", both, Some(Load)),
        // A pinned method needs an agent that restores at all, unless forced.
        ("restore_method = \"resume\"", none, None),
        ("native_resume = true\nrestore_method = \"resume\"", none, Some(Resume)),
        ("native_resume = false\nrestore_method = \"load\"", both, None),
    ];
    for (session, advertised, expected) in cases {
        assert_eq!(
            with(session).restore_method(advertised),
            expected,
            "{session:?} {advertised:?}"
        );
    }
    let off = with("native_resume = false\nhistory_injection = false");
    assert!(!off.keeps_resume_token());
    assert!(!off.injects_history(false) && off.injects_history(true), "a failed restore injects");
    let relaunch = with("native_resume = false\nresume_command = [\"x\", \"{token}\"]");
    assert!(relaunch.keeps_resume_token() && relaunch.relaunches_to_resume());
    let err = error(&format!("{MINIMAL}[session]\nrestore_method = \"reload\"\n"));
    assert_eq!((err.line, err.field.as_str()), (5, "session.restore_method"));
}

#[test]
fn root_env_is_checked_against_the_profile_and_the_inherited_environment() {
    let profile =
        parse(&format!("{MINIMAL}[process]\nroot_env = {{ IS_SANDBOX = \"1\" }}\n"), file())
            .unwrap();
    assert_eq!(profile.root_env_missing(|_| None), ["IS_SANDBOX=1"]);
    assert_eq!(profile.root_env_missing(|_| Some("yes".into())), ["IS_SANDBOX=1"], "exactly 1");
    assert!(profile.root_env_missing(|_| Some("1".into())).is_empty());
    let in_profile = parse(
        &format!(
            "{MINIMAL}[env]\nIS_SANDBOX = \"1\"\n[process]\nroot_env = {{ IS_SANDBOX = \"1\" }}\n"
        ),
        file(),
    )
    .unwrap();
    assert!(in_profile.root_env_missing(|_| None).is_empty());
    let err = error(&format!("{MINIMAL}[process]\nroot_env = {{ \"1X\" = \"1\" }}\n"));
    assert_eq!(err.field, "process.root_env");
}

#[test]
fn unknown_keys_are_located_errors() {
    let text =
        "id = \"x\"\ncommand = [\"x\"]\nprotocol = \"acp\"\n\n[session]\nnativ_resume = true\n";
    let err = error(text);
    assert_eq!((err.line, err.column), (6, 1));
    assert_eq!(err.field, "session.nativ_resume");
    assert!(err.reason.contains("unknown field"), "{}", err.reason);
    assert!(err.to_string().starts_with("/p/test.toml:6:1: session.nativ_resume: "), "{err}");

    let err = error(&format!("{MINIMAL}colour = \"red\"\n"));
    assert_eq!((err.line, err.field.as_str()), (4, "colour"));
}

#[test]
fn wrong_types_are_located_errors() {
    let text =
        "id = \"x\"\ncommand = [\"x\"]\nprotocol = \"acp\"\n[process]\nstop_grace_ms = \"soon\"\n";
    let err = error(text);
    assert_eq!((err.line, err.column), (5, 17));
    assert_eq!(err.field, "process.stop_grace_ms");
    let err = error("id = \"x\"\ncommand = \"x-agent\"\nprotocol = \"acp\"\n");
    assert_eq!((err.line, err.field.as_str()), (2, "command"));
    let err = error("id = \"x\"\ncommand = [\"x\"]\nprotocol = \"lsp\"\n");
    assert_eq!((err.line, err.field.as_str()), (3, "protocol"));
}

#[test]
fn missing_required_fields_are_errors() {
    let err = error("id = \"x\"\nprotocol = \"acp\"\n");
    assert!(err.reason.contains("command"), "{}", err.reason);
}

#[test]
fn empty_command_is_a_located_error() {
    let err = error("id = \"x\"\n\ncommand = []\nprotocol = \"acp\"\n");
    assert_eq!((err.line, err.column, err.field.as_str()), (3, 11, "command"));
    assert!(err.reason.contains("empty argv"));
    let err = error("id = \"x\"\ncommand = [\"  \"]\nprotocol = \"acp\"\n");
    assert!(err.reason.contains("program name is empty"));
}

#[test]
fn bad_templates_are_located_errors() {
    let base = "id = \"x\"\ncommand = [\"x\"]\nprotocol = \"acp\"\n[session]\n";
    let err = error(&format!("{base}resume_command = [\"x\", \"--resume\"]\n"));
    assert_eq!((err.line, err.column, err.field.as_str()), (5, 18, "session.resume_command"));
    assert!(err.reason.contains("must contain {token}"));
    let err = error(&format!("{base}resume_command = [\"x\", \"--resume\", \"{{tokn}}\"]\n"));
    assert!(err.reason.contains("unknown placeholder {tokn}"), "{}", err.reason);
    let err = error(&format!("{base}resume_command = [\"x\", \"--resume\", \"{{token\"]\n"));
    assert!(err.reason.contains("unclosed placeholder"), "{}", err.reason);
    let err = error("id = \"x\"\ncommand = [\"x\", \"{token}\"]\nprotocol = \"acp\"\n");
    assert_eq!(err.field, "command");
    assert!(err.reason.contains("unknown placeholder {token}"));
    // JSON in an env value is not a placeholder (codex reads its config from CODEX_CONFIG);
    // a name in braces inside it still is, and is checked.
    let json = r#"{"model_providers":{"x":{"base_url":"http://h/v1"}},"dir":"{home}/x"}"#;
    let profile = parse(&format!("{MINIMAL}[env]\nCODEX_CONFIG = '{json}'\n"), file()).unwrap();
    let expanded = profile.launch_env(Path::new("/h"));
    assert_eq!(expanded["CODEX_CONFIG"], json.replace("{home}", "/h"));
    let err = error(&format!("{MINIMAL}[env]\nC = '{{\"a\":\"{{hom}}\"}}'\n"));
    assert!(err.reason.contains("unknown placeholder {hom}"), "{}", err.reason);
    for typo in ["{home.dir}", "{home-x}", "x{home"] {
        let err = error(&format!("{MINIMAL}[env]\nC = \"{typo}\"\n"));
        assert!(err.reason.contains("unclosed placeholder"), "{typo}: {}", err.reason);
    }
}

#[test]
fn other_values_are_checked() {
    let cases = [
        ("id = \"Bad Id\"\ncommand = [\"x\"]\nprotocol = \"acp\"\n", "id"),
        (
            "id = \"x\"\ncommand = [\"x\"]\nprotocol = \"acp\"\nrequired_env = [\"NOT-A-NAME\"]\n",
            "required_env",
        ),
        ("id = \"x\"\ncommand = [\"x\"]\nprotocol = \"acp\"\n[env]\n\"1X\" = \"v\"\n", "env"),
        (
            "id = \"x\"\ncommand = [\"x\"]\nprotocol = \"acp\"\n[session]\nagent_state_dirs = [\"../escape\"]\n",
            "session.agent_state_dirs",
        ),
        (
            "id = \"x\"\ncommand = [\"x\"]\nprotocol = \"acp\"\n[session]\nagent_state_dirs = [\"/abs\"]\n",
            "session.agent_state_dirs",
        ),
        (
            "id = \"x\"\ncommand = [\"x\"]\nprotocol = \"acp\"\n[session]\nresume_context_budget = 10\n",
            "session.resume_context_budget",
        ),
        (
            "id = \"x\"\ncommand = [\"x\"]\nprotocol = \"acp\"\n[docker]\nmemory_mb = 1\n",
            "docker.memory_mb",
        ),
        (
            "id = \"x\"\ncommand = [\"x\"]\nprotocol = \"acp\"\n[docker]\ncpus = 0.0\n",
            "docker.cpus",
        ),
        (
            "id = \"x\"\ncommand = [\"x\"]\nprotocol = \"acp\"\n[docker]\npids_limit = 5\n",
            "docker.pids_limit",
        ),
        (
            "id = \"x\"\ncommand = [\"x\"]\nprotocol = \"acp\"\n[docker]\nruntime = \"run sc\"\n",
            "docker.runtime",
        ),
        (
            "id = \"x\"\ncommand = [\"x\"]\nprotocol = \"acp\"\n[session]\nstate_files = [\".x/state.json\"]\n",
            "session.state_files",
        ),
        (
            "id = \"x\"\ncommand = [\"x\"]\nprotocol = \"acp\"\n[session]\nstate_files = [\"../{acp_session}\"]\n",
            "session.state_files",
        ),
        (
            "id = \"x\"\ncommand = [\"x\"]\nprotocol = \"acp\"\n[docker]\nimage = \" \"\n",
            "docker.image",
        ),
        (
            "id = \"x\"\ncommand = [\"x\"]\nprotocol = \"acp\"\n[process]\ninit_timeout_ms = 0\n",
            "process.init_timeout_ms",
        ),
        (
            "id = \"x\"\ncommand = [\"x\"]\nprotocol = \"acp\"\nruntime = \"kubernetes\"\n",
            "runtime",
        ),
    ];
    for (text, field) in cases {
        let err = error(text);
        assert_eq!(err.field, field, "{text}\n{err}");
        // The offending value is on the last line, except for the id (first line).
        let expected_line = if field == "id" { 1 } else { text.lines().count() };
        assert_eq!(err.line, expected_line, "{err}");
    }
}

#[test]
fn not_toml_is_a_file_level_error() {
    let err = error("id = \"x\"\ncommand = [\"x\"\n");
    assert_eq!(err.line, 2);
    assert!(!err.reason.is_empty());
}

#[test]
fn placeholders_expand_at_launch() {
    let text = "id = \"x\"\ncommand = [\"x\", \"--state\", \"{home}/.x\"]\nprotocol = \"acp\"\n[env]\nX_HOME = \"{home}\"\n[session]\nresume_command = [\"x\", \"--resume={token}\"]\n";
    let profile = parse(text, file()).unwrap();
    let home = Path::new("/home/u");
    assert_eq!(profile.launch_argv(home), ["x", "--state", "/home/u/.x"]);
    assert_eq!(profile.launch_env(home)["X_HOME"], "/home/u");
    assert_eq!(profile.resume_argv(home, "abc").unwrap(), ["x", "--resume=abc"]);
    assert!(profile.keeps_resume_token());
}

#[test]
fn snapshot_round_trips_through_json() {
    for result in crate::registry::builtins() {
        let profile = result.unwrap();
        let json = serde_json::to_string(&profile).unwrap();
        let back: Profile = serde_json::from_str(&json).unwrap();
        assert_eq!(back, profile);
    }
}

#[test]
fn auth_choices_pick_an_offered_method_whose_credentials_are_set() {
    let text = format!(
        "{MINIMAL}[[auth]]\nmethod = \"api-key\"\nenv = [\"CODEX_API_KEY\", \"OPENAI_API_KEY\"]\n\n[[auth]]\nmethod = \"agent-login\"\n"
    );
    let profile = parse(&text, file()).unwrap();
    let offered = |ids: &[&str]| ids.iter().map(|id| id.to_string()).collect::<Vec<_>>();
    let both = offered(&["chat-gpt", "api-key", "agent-login"]);
    assert_eq!(profile.auth_method(&both, |name| name == "OPENAI_API_KEY"), Some("api-key"));
    // Without its credentials a choice is skipped; a choice without env always applies.
    assert_eq!(profile.auth_method(&both, |_| false), Some("agent-login"));
    assert_eq!(profile.auth_method(&offered(&["chat-gpt"]), |_| true), None);
    assert_eq!(parse(MINIMAL, file()).unwrap().auth_method(&both, |_| true), None);

    let err = error(&format!("{MINIMAL}[[auth]]\nmethod = \"\"\n"));
    assert_eq!((err.line, err.field.as_str()), (5, "auth.method"));
    let err = error(&format!("{MINIMAL}[[auth]]\nmethod = \"m\"\nenv = [\"NO-NAME\"]\n"));
    assert_eq!((err.line, err.field.as_str()), (6, "auth.env"));
    let err = error(&format!("{MINIMAL}[[auth]]\nmethods = \"m\"\n"));
    assert!(err.reason.contains("unknown field `methods`"), "{err}");
}

#[test]
fn a_workspace_section_asks_for_worktrees_and_is_validated() {
    let plain = parse(MINIMAL, file()).unwrap();
    assert_eq!(plain.workspace, None);
    let text = format!("{MINIMAL}[workspace]\nrepo = \"/src/project\"\nbase = \"main\"\n");
    let profile = parse(&text, file()).unwrap();
    let workspace = profile.workspace.clone().unwrap();
    assert_eq!(
        (workspace.repo.as_deref(), workspace.base.as_deref()),
        (Some("/src/project"), Some("main"))
    );
    // An empty section: worktrees of the session's own workspace, from its HEAD.
    let empty = parse(&format!("{MINIMAL}[workspace]\n"), file()).unwrap();
    assert_eq!(empty.workspace, Some(WorkspaceSettings::default()));
    // A snapshot without the section (stored before it existed) reads back the same.
    let json = serde_json::to_value(&plain).unwrap();
    assert!(json.get("workspace").is_none(), "absent, not null: no drift for old snapshots");
    let relative = error(&format!("{MINIMAL}[workspace]\nrepo = \"src/project\"\n"));
    assert_eq!((relative.line, relative.field.as_str()), (5, "workspace.repo"));
    let dashed = error(&format!("{MINIMAL}[workspace]\nbase = \"--force\"\n"));
    assert_eq!((dashed.line, dashed.field.as_str()), (5, "workspace.base"));
    let unknown = error(&format!("{MINIMAL}[workspace]\nbranch = \"x\"\n"));
    assert_eq!(unknown.field, "workspace.branch");
}

#[test]
fn a_sandbox_section_confines_and_is_validated() {
    let plain = parse(MINIMAL, file()).unwrap();
    assert_eq!(plain.sandbox, None, "absent: the daemon's default, by default unconfined");
    assert!(plain.sandbox_or(None).is_host());
    let offline = SandboxSettings { network: NetworkAccess::None, ..SandboxSettings::default() };
    assert_eq!(plain.sandbox_or(Some(&offline)), offline, "the daemon's default applies");
    let json = serde_json::to_value(&plain).unwrap();
    assert!(json.get("sandbox").is_none(), "absent, not null: no drift for old snapshots");
    let text = format!(
        "{MINIMAL}[sandbox]\nfilesystem = \"workspace\"\nnetwork = \"allowlist\"\n\
         allow = [\"API.Anthropic.com:443\", \"127.0.0.1:8080\"]\nwritable = [\"~/.claude\"]\n\
         readable = [\"/etc/ssl/certs\"]\n"
    );
    let sandbox = parse(&text, file()).unwrap().sandbox.unwrap();
    assert_eq!(sandbox.filesystem, FilesystemAccess::Workspace);
    assert_eq!(sandbox.network, NetworkAccess::Allowlist);
    assert_eq!(sandbox.allow, ["api.anthropic.com:443", "127.0.0.1:8080"], "normalized");
    assert_eq!(sandbox.allowlist().entries(), sandbox.allow);
    assert_eq!((sandbox.readable.len(), sandbox.writable.len()), (1, 1));
    let none = parse(&format!("{MINIMAL}[sandbox]\nnetwork = \"none\"\n"), file()).unwrap();
    assert_eq!(none.sandbox_or(Some(&SandboxSettings::default())), offline, "its own wins");
    // A profile opts out of a confining default by saying host and host.
    let open = format!("{MINIMAL}[sandbox]\nfilesystem = \"host\"\nnetwork = \"host\"\n");
    assert!(parse(&open, file()).unwrap().sandbox_or(Some(&offline)).is_host());
}

#[test]
fn a_bad_sandbox_section_names_the_field_and_why() {
    let cases = [
        ("network = \"allowlist\"\nallow = [\"example.com\"]\n", "sandbox.allow", "no port"),
        (
            "network = \"none\"\nallow = [\"example.com:443\"]\n",
            "sandbox.allow",
            "goes with network = \"allowlist\"",
        ),
        ("readable = [\"/etc\"]\n", "sandbox.readable", "goes with filesystem = \"workspace\""),
        (
            "filesystem = \"workspace\"\nwritable = [\"relative/dir\"]\n",
            "sandbox.writable",
            "not an absolute path",
        ),
        (
            "filesystem = \"workspace\"\nwritable = [\"~/../etc\"]\n",
            "sandbox.writable",
            "without ..",
        ),
        ("network = \"everywhere\"\n", "sandbox.network", "unknown variant"),
        ("filesystems = \"workspace\"\n", "sandbox.filesystems", "unknown field"),
        (
            "network = \"none\"\n[pool]\nwarm = 2\n",
            "pool.warm",
            "a profile with [sandbox] is not pooled",
        ),
    ];
    for (section, field, why) in cases {
        let err = error(&format!("{MINIMAL}[sandbox]\n{section}"));
        assert_eq!(err.field, field, "{section}: {err}");
        assert!(err.reason.contains(why), "{section}: {err}");
        assert!(err.line >= 5, "located: {err}");
    }
}
