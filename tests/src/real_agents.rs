//! Profiles of the real agents installed by `scripts/setup.sh` into `.tools/npm` (and, for
//! the Python ones, a venv each under `.tools/`), pointed at the scripted model server:
//! shared by the `real_agents` tests and the benchmarks.

use std::path::{Path, PathBuf};

use serde_json::json;

/// The project-local install of a real agent's binary, if `scripts/setup.sh` made one.
pub fn find(bin: &str) -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = root.join(".tools/npm/node_modules/.bin").join(bin);
    path.exists().then_some(path)
}

/// [`find`], for tests: CI (`REQUIRE_DOCKER=1`, which runs setup) must have it; elsewhere
/// the test says it skipped.
pub fn installed(bin: &str) -> Option<PathBuf> {
    if let Some(path) = find(bin) {
        return Some(path);
    }
    assert!(
        std::env::var_os("REQUIRE_DOCKER").is_none(),
        "{bin} is not installed in .tools/npm: scripts/setup.sh installs it"
    );
    println!("SKIPPED: {bin} is not installed (scripts/setup.sh installs it)");
    None
}

/// The project-local venv install of a Python agent's `bin` (`.tools/<venv>/bin/<bin>`), for
/// tests. Where `scripts/setup.sh` found no Python 3.12 or newer it left the reason in
/// `.tools/<venv>.skipped`: the test says it skipped, with that reason, even in CI.
/// Otherwise as [`installed`]: CI must have it, elsewhere the test says it skipped.
pub fn installed_python(venv: &str, bin: &str) -> Option<PathBuf> {
    let tools = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools");
    let path = tools.join(venv).join("bin").join(bin);
    if path.exists() {
        return Some(path);
    }
    if let Ok(why) = std::fs::read_to_string(tools.join(format!("{venv}.skipped"))) {
        println!("SKIPPED: {}", why.trim());
        return None;
    }
    assert!(
        std::env::var_os("REQUIRE_DOCKER").is_none(),
        "{bin} is not installed in .tools/{venv}: scripts/setup.sh installs it"
    );
    println!("SKIPPED: {bin} is not installed (scripts/setup.sh installs it)");
    None
}

/// A profile `command` (a TOML array) running `bin args…`; with a `transcript` path,
/// every line Tether sends the agent is also appended to `<path>.<pid>.in`, and every line
/// the agent sends to `<path>.<pid>.out` — a pair of files per agent process.
pub fn agent_command(bin: &Path, args: &[&str], transcript: Option<&Path>) -> String {
    let mut argv: Vec<String> = Vec::new();
    if let Some(path) = transcript {
        let tee = r#"exec "$0" "${@:2}" < <(tee -a "$1.$$.in") > >(tee -a "$1.$$.out")"#;
        argv.extend(["bash".into(), "-c".into(), tee.into()]);
        argv.push(bin.display().to_string());
        argv.push(path.display().to_string());
    } else {
        argv.push(bin.display().to_string());
    }
    argv.extend(args.iter().map(|arg| arg.to_string()));
    serde_json::to_string(&argv).unwrap()
}

/// A `claude` profile running claude-agent-acp against the model server at `url`, with
/// `session` (TOML lines) added to its `[session]`.
pub fn claude_profile(url: &str, transcript: Option<&Path>, session: &str) -> Option<String> {
    let bin = installed("claude-agent-acp")?;
    let command = agent_command(&bin, &[], transcript);
    Some(format!(
        r#"id = "claude"
command = {command}
protocol = "acp"

[env]
ANTHROPIC_BASE_URL = "{url}"
ANTHROPIC_API_KEY = "sk-ant-test"
CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = "1"
DISABLE_AUTOUPDATER = "1"
IS_SANDBOX = "1"

[session]
agent_state_dirs = [".claude"]
{session}

[process]
init_timeout_ms = 60000
"#
    ))
}

/// An `opencode` profile running `opencode acp` (its provider is set per workspace, see
/// [`opencode_config`]).
pub fn opencode_profile() -> Option<String> {
    let bin = installed("opencode")?;
    Some(format!(
        r#"id = "opencode"
command = ["{bin}", "acp"]
protocol = "acp"

[env]
ANTHROPIC_API_KEY = "sk-ant-test"
OPENCODE_DISABLE_AUTOUPDATE = "1"
OPENCODE_DISABLE_MODELS_FETCH = "1"

[session]
agent_state_dirs = [".local/share/opencode"]

[process]
init_timeout_ms = 60000
"#,
        bin = bin.display(),
    ))
}

/// A workspace's `opencode.json` pointing opencode's Anthropic provider at `url`.
pub fn opencode_config(url: &str) -> String {
    json!({
        "model": "anthropic/claude-haiku-4-5",
        "small_model": "anthropic/claude-haiku-4-5",
        "provider": {"anthropic": {"options": {"baseURL": format!("{url}/v1"), "apiKey": "sk-ant-test"}}},
    })
    .to_string()
}

/// The built-in `codex` profile's `[[auth]]`, with the adapter installed here instead of
/// fetched by `npx`, and `env` extra lines.
pub fn codex_profile(command: &str, env: &str) -> String {
    let builtin = include_str!("../../agents/profiles/codex.toml");
    let line = builtin
        .lines()
        .find(|line| line.starts_with("command = "))
        .expect("the built-in has a command");
    builtin
        .replace(line, &format!("command = {command}\n{env}"))
        .replace("id = \"codex\"", "id = \"codex-here\"")
}

/// The `codex-here` profile with an API key, and codex's model provider pointed at the
/// model server at `url` through `CODEX_CONFIG` (the adapter's own variable; codex ignores
/// OPENAI_BASE_URL, and speaks only the Responses API).
pub fn codex_scripted_profile(url: &str, transcript: Option<&Path>) -> Option<String> {
    let bin = installed("codex-acp")?;
    let config = json!({
        "model_provider": "scripted",
        "model_providers": {"scripted": {
            "name": "Scripted", "base_url": format!("{url}/v1"),
            "wire_api": "responses", "requires_openai_auth": true,
        }},
    });
    let env = format!("env = {{ OPENAI_API_KEY = \"sk-test\", CODEX_CONFIG = '{config}' }}");
    Some(codex_profile(&agent_command(&bin, &[], transcript), &env))
}

/// The `gemini-here` profile: the built-in one with the installed CLI, an API key, and
/// (with `url`) the Gemini API pointed at the model server.
pub fn gemini_profile(url: Option<&str>, transcript: Option<&Path>) -> Option<String> {
    let bin = installed("gemini")?;
    let builtin = include_str!("../../agents/profiles/gemini.toml");
    let command = builtin.lines().find(|line| line.starts_with("command = ")).unwrap();
    let mut env = String::from("[env]\nGEMINI_API_KEY = \"test-key\"\n");
    if let Some(url) = url {
        env.push_str(&format!(
            "GOOGLE_GEMINI_BASE_URL = \"{url}\"\nGEMINI_MODEL = \"gemini-2.5-flash\"\n"
        ));
    }
    Some(
        builtin
            .replace(command, &format!("command = {}", agent_command(&bin, &["--acp"], transcript)))
            .replace("id = \"gemini\"", "id = \"gemini-here\"")
            .replace("[env]\n", &env)
            .replace("[process]\n", "[process]\ninit_timeout_ms = 60000\n"),
    )
}

/// `~/.gemini/settings.json` under `home`: no telemetry, and no session cleanup (it deletes
/// a loaded session: an upstream bug).
pub fn gemini_settings(home: &Path) {
    let settings = home.join(".gemini");
    std::fs::create_dir_all(&settings).unwrap();
    std::fs::write(
        settings.join("settings.json"),
        r#"{"privacy": {"usageStatisticsEnabled": false}, "telemetry": {"enabled": false},
            "general": {"sessionRetention": {"enabled": false}}}"#,
    )
    .unwrap();
}

/// The `qwen-here` profile: the built-in one with the CLI installed here, pointed at the
/// model server at `url` as an OpenAI-compatible endpoint (Chat Completions).
pub fn qwen_profile(url: &str, transcript: Option<&Path>) -> Option<String> {
    let bin = installed("qwen")?;
    let env = format!(
        "[env]\nOPENAI_API_KEY = \"sk-test\"\nOPENAI_BASE_URL = \"{url}/v1\"\nOPENAI_MODEL = \"scripted-model\"\n"
    );
    let builtin = include_str!("../../agents/profiles/qwen.toml");
    let profile = builtin_here(builtin, &bin, &["--acp"], transcript, &env);
    Some(profile + "\n[process]\ninit_timeout_ms = 60000\n")
}

/// `~/.qwen/settings.json` under `home`: no update checks, no usage statistics.
pub fn qwen_settings(home: &Path) {
    let settings = home.join(".qwen");
    std::fs::create_dir_all(&settings).unwrap();
    std::fs::write(
        settings.join("settings.json"),
        r#"{"general": {"disableAutoUpdate": true, "disableUpdateNag": true},
            "privacy": {"usageStatisticsEnabled": false}, "telemetry": {"enabled": false}}"#,
    )
    .unwrap();
}

/// The `copilot-here` profile: the built-in one with the CLI installed here, its own model
/// provider ("bring your own key") pointed at the model server at `url` (OpenAI Chat
/// Completions), offline: no GitHub login, no update check.
pub fn copilot_profile(url: &str, transcript: Option<&Path>) -> Option<String> {
    let bin = installed("copilot")?;
    let env = format!(
        "[env]\nCOPILOT_PROVIDER_BASE_URL = \"{url}/v1\"\nCOPILOT_PROVIDER_TYPE = \"openai\"\n\
         COPILOT_PROVIDER_API_KEY = \"sk-test\"\nCOPILOT_PROVIDER_MODEL_ID = \"scripted-model\"\n\
         COPILOT_OFFLINE = \"true\"\nCOPILOT_AUTO_UPDATE = \"false\"\n"
    );
    let builtin = include_str!("../../agents/profiles/copilot.toml");
    let profile = builtin_here(builtin, &bin, &["--acp"], transcript, &env);
    Some(profile + "\n[process]\ninit_timeout_ms = 60000\n")
}

/// The `fast-agent-here` profile: the built-in one with `fast-agent-acp` from its venv here,
/// its `generic` (OpenAI-compatible) provider pointed at the model server at `url` (Chat
/// Completions) through its own variables, and the model chosen with `--model`.
pub fn fast_agent_profile(url: &str, transcript: Option<&Path>) -> Option<String> {
    let bin = installed_python("fast-agent", "fast-agent-acp")?;
    let env = format!("[env]\nGENERIC_BASE_URL = \"{url}/v1\"\nGENERIC_API_KEY = \"sk-test\"\n");
    let builtin = include_str!("../../agents/profiles/fast-agent.toml");
    let args = ["--model", "generic.scripted-model"];
    let profile = builtin_here(builtin, &bin, &args, transcript, &env);
    // Its Python start (imports) takes seconds, tens on a loaded machine.
    Some(profile + "\n[process]\ninit_timeout_ms = 120000\n")
}

/// The `kimi-here` profile: the built-in one with `kimi` from its venv here (its provider is
/// set in its home, see [`kimi_settings`]).
pub fn kimi_profile(transcript: Option<&Path>) -> Option<String> {
    let bin = installed_python("kimi", "kimi")?;
    let builtin = include_str!("../../agents/profiles/kimi.toml");
    let profile = builtin_here(builtin, &bin, &["acp"], transcript, "");
    Some(profile + "\n[process]\ninit_timeout_ms = 120000\n")
}

/// `~/.kimi` under `home`: a provider (OpenAI Chat Completions) pointed at the model server
/// at `url` as the default model, no telemetry, and a placeholder in place of the Kimi Code login. kimi
/// 1.51.0 opens no ACP session until a login token file is there (it only checks that the
/// file holds a token); the placeholder is never sent anywhere, since the model used is the
/// configured provider's, with its own key.
pub fn kimi_settings(home: &Path, url: &str) {
    let kimi = home.join(".kimi");
    std::fs::create_dir_all(kimi.join("credentials")).unwrap();
    std::fs::write(
        kimi.join("config.toml"),
        format!(
            r#"default_model = "scripted"
telemetry = false

[providers.scripted]
type = "openai_legacy"
base_url = "{url}/v1"
api_key = "sk-test"

[models.scripted]
provider = "scripted"
model = "scripted-model"
max_context_size = 100000
"#
        ),
    )
    .unwrap();
    std::fs::write(
        kimi.join("credentials/kimi-code.json"),
        r#"{"access_token": "placeholder-not-a-login", "refresh_token": "", "expires_at": null}"#,
    )
    .unwrap();
}

/// The `auggie-here` profile: the built-in one with the CLI installed here and a session
/// token it cannot use (no Augment service is reachable).
pub fn auggie_profile() -> Option<String> {
    let bin = installed("auggie")?;
    let env = "[env]\nAUGMENT_SESSION_AUTH = '{\"accessToken\": \"x\", \"tenantURL\": \"http://127.0.0.1:9/\"}'\n";
    let builtin = include_str!("../../agents/profiles/auggie.toml");
    Some(builtin_here(builtin, &bin, &["--acp", "--allow-indexing"], None, env))
}

/// A built-in profile (`builtin`, its file's text) as `<id>-here`: its command run from the
/// project-local install `bin` with `args` (and `transcript`), and `before_session` (TOML,
/// e.g. an `[env]` table) put before its `[session]` table.
fn builtin_here(
    builtin: &str,
    bin: &Path,
    args: &[&str],
    transcript: Option<&Path>,
    before_session: &str,
) -> String {
    let command = builtin.lines().find(|line| line.starts_with("command = ")).unwrap();
    let id = builtin.lines().find(|line| line.starts_with("id = ")).unwrap();
    let here = id.trim_end_matches('"').to_owned() + "-here\"";
    builtin
        .replace(command, &format!("command = {}", agent_command(bin, args, transcript)))
        .replace(id, &here)
        .replacen("[session]\n", &format!("{before_session}\n[session]\n"), 1)
}
