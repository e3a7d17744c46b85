//! Agents that require ACP `authenticate` before a session (codex-acp, gemini),
//! played by `mock-agent --auth-required`, which offers the method `mock-login`.

use protocol::api::{ResumeOutcome, SessionState};
use tether_tests::daemon::{Daemon, kill_sidecar, settled};

fn profile(id: &str, auth: &str) -> String {
    format!(
        "id = \"{id}\"\ncommand = [\"mock-agent\", \"--auth-required\", \"--state-dir\", \"{{home}}/.mock-agent\"]\nprotocol = \"acp\"\n{auth}[session]\nnative_resume = true\n"
    )
}

/// Creates a session of `profile` and returns its id and the first terminal-or-ready state
/// event's `(state, error)`.
async fn create(daemon: &Daemon, profile: &str) -> (String, SessionState, String) {
    let api = daemon.api().await;
    let session = api.create_session(profile, &daemon.workspace(profile)).await.unwrap();
    let mut events = api.subscribe(&session, 0).await;
    let (state, error) = settled(&mut events).await;
    (session, state, error)
}

/// The agent refuses `session/new` until `authenticate`; a profile that allows
/// the method gets a working session, and it authenticates again for a native resume.
#[tokio::test]
async fn an_agent_that_requires_authenticate_gets_it() {
    let pinned = profile("authed", "[[auth]]\nmethod = \"mock-login\"\n");
    let daemon = Daemon::start_with_profiles(&[], &[("authed.toml", &pinned)]).await;
    let (session, state, error) = create(&daemon, "authed").await;
    assert_eq!(state, SessionState::WaitingForInput, "{error}");
    let api = daemon.api().await;
    assert!(api.ask(&session, "hello").await.contains("you said: hello"));
    // A new agent process: authenticate again, then session/load.
    kill_sidecar(&daemon, &api, &session).await;
    let resumed = api.resume(&session).await.unwrap();
    assert_eq!(resumed.outcome, ResumeOutcome::NativeLoad, "{resumed:?}");
    assert!(api.ask(&session, "again").await.contains("remembered 2 earlier messages"));
}

/// Without a usable method the session fails saying that it needs credentials,
/// which methods the agent offers, and what the profile's choice lacks.
#[tokio::test]
async fn an_agent_without_usable_credentials_says_so() {
    let none = profile("noauth", "");
    let unset =
        profile("unset", "[[auth]]\nmethod = \"mock-login\"\nenv = [\"TETHER_TEST_UNSET_KEY\"]\n");
    let daemon =
        Daemon::start_with_profiles(&[], &[("noauth.toml", &none), ("unset.toml", &unset)]).await;
    let (_, state, error) = create(&daemon, "noauth").await;
    assert_eq!(state, SessionState::Failed);
    assert!(error.contains("needs credentials") && error.contains("mock-login"), "{error}");
    let (_, state, error) = create(&daemon, "unset").await;
    assert_eq!(state, SessionState::Failed);
    assert!(
        error.contains("needs credentials") && error.contains("TETHER_TEST_UNSET_KEY"),
        "{error}"
    );
}

/// An agent that logs in only at a terminal (copilot, kimi) is not told to add
/// an `[[auth]]` method (following that hung): the error says what to run, where, and which
/// files the login leaves for the agent to read.
#[tokio::test]
async fn an_agent_that_logs_in_only_at_a_terminal_says_what_to_run() {
    let terminal = "id = \"terminal\"\ncommand = [\"mock-agent\", \"--auth-required\", \"--terminal-login\"]\nprotocol = \"acp\"\n[session]\nagent_state_dirs = [\".mock-agent\"]\n";
    let daemon = Daemon::start_with_profiles(&[], &[("terminal.toml", terminal)]).await;
    let (_, state, error) = create(&daemon, "terminal").await;
    assert_eq!(state, SessionState::Failed);
    assert!(error.contains("logs in only at a terminal (Mock terminal login)"), "{error}");
    assert!(error.contains("mock-agent --login"), "{error}");
    assert!(error.contains(".mock-agent"), "{error}");
    assert!(!error.contains("add an [[auth]] method"), "{error}");
}

/// A slow agent start printed nothing. The CLI now shows each step of bringing
/// the agent up — on `session start`, on `resume`, and on a `prompt` that resumes first —
/// in order, on stderr (stdout keeps its one line), and nothing with `--quiet`.
#[tokio::test]
async fn the_cli_shows_each_step_of_a_slow_start() {
    let pinned = profile("authed", "[[auth]]\nmethod = \"mock-login\"\n");
    let daemon = Daemon::start_with_profiles(&[], &[("authed.toml", &pinned)]).await;
    let workspace = daemon.workspace("progress");
    let start = |quiet: bool| {
        let mut args = vec!["session", "start", "--new-task", "t", "--agent", "authed"];
        args.extend(["--workspace", workspace.to_str().unwrap()]);
        if quiet {
            // A second session in the same workspace says it shares it.
            args.extend(["--quiet", "--shared"]);
        }
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let in_order = |err: &str, steps: &[&str]| {
        let mut rest = err;
        for step in steps {
            let at = rest.find(step).unwrap_or_else(|| panic!("{step:?} (in order) in:\n{err}"));
            rest = &rest[at + step.len()..];
        }
    };
    let args = start(false);
    let (code, out, err) = daemon.cli(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("session ") && out.lines().count() == 1, "{out}");
    in_order(
        &err,
        &[
            "s] launching the agent: ",
            "mock-agent (standalone)",
            "s] the agent is starting (initialize)",
            "s] opening an agent session",
            "s] authenticating: mock-login",
            "s] opening an agent session",
        ],
    );
    let args = start(true);
    let (code, out, err) = daemon.cli(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!((code, err.as_str()), (0, ""), "--quiet shows nothing");
    let session = out.trim().to_owned();

    let api = daemon.api().await;
    kill_sidecar(&daemon, &api, &session).await;
    let (code, _, err) = daemon.cli(&["resume", &session]).await;
    assert_eq!(code, 0, "{err}");
    in_order(
        &err,
        &[
            "launching the agent",
            "initialize",
            "restoring the agent's session: session/load",
            "authenticating: mock-login",
            "restoring the agent's session: session/load",
            "resumed: native_load",
        ],
    );
    kill_sidecar(&daemon, &api, &session).await;
    let (code, out, err) = daemon.cli(&["prompt", &session, "hello again"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("you said: hello again"), "{out}");
    in_order(&err, &["launching the agent", "initialize", "resumed: native_load"]);
}
