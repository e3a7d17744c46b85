//! What a person waiting for an agent to come up sees: each launch step as it starts, the
//! agent's latest stderr line as that step's detail (one updating line, not a notice per
//! line), and a step that never ends failing within the profile's bound with what the
//! agent printed.

use protocol::api::{ApiClient, EventKind, LaunchStep, SessionEvent, SessionState};
use tether_tests::daemon::{Daemon, settled};

/// A mock agent that prints twelve debug lines as it starts (as claude-agent-acp does at
/// every resume) and never answers `initialize`, bounded at `init_timeout_ms`.
fn chatty_hang(init_timeout_ms: u64) -> String {
    format!(
        "id = \"chatty\"\ncommand = [\"mock-agent\", \"--stderr-at-start\", \"12\", \"--hang-on\", \"initialize\"]\nprotocol = \"acp\"\n[process]\ninit_timeout_ms = {init_timeout_ms}\n"
    )
}

fn agent_says(event: &SessionEvent) -> Option<&str> {
    match &event.kind {
        EventKind::Notice { message } if message.starts_with("the agent says") => Some(message),
        _ => None,
    }
}

/// The agent's stderr while it starts is the current step's detail (`progress` events of
/// that step, the latest line last), never a notice per line; the step that never ends
/// fails within the bound, the agent's stderr in the error.
#[tokio::test]
async fn a_starting_agents_stderr_is_the_steps_detail_not_notices() {
    let profile = chatty_hang(2000);
    let daemon = Daemon::start_with_profiles(&[], &[("chatty.toml", &profile)]).await;
    let api = daemon.api().await;
    let session = api.create_session("chatty", &daemon.workspace("c")).await.unwrap();
    let mut events = api.subscribe(&session, 0).await;
    let (state, error) = settled(&mut events).await;
    assert_eq!(state, SessionState::Failed);
    assert!(error.contains("did not answer initialize within 2000 ms"), "{error}");
    assert!(error.contains("debug line 12 of 12"), "the agent's stderr: {error}");
    let window =
        api.typed().session_event_window(session.clone(), None, None).await.expect("a window");
    let notices: Vec<&str> = window.events.iter().filter_map(agent_says).collect();
    assert!(notices.is_empty(), "no notice per stderr line: {notices:?}");
    let details: Vec<&str> = window
        .events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Progress { step: LaunchStep::Initializing, detail: Some(detail) } => {
                Some(detail.as_str())
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        details.last().copied(),
        Some("the agent says: mock-agent: not answering initialize as configured (--hang-on)"),
        "{details:?}"
    );
    assert!(details.contains(&"the agent says: mock-agent: starting, debug line 1 of 12"));
}

/// `session start` off a terminal: the step's line, not a line per stderr line of the
/// agent (a line every ten seconds at most while a step waits), and the failure with the
/// agent's stderr.
#[tokio::test]
async fn session_start_shows_one_line_per_step_not_one_per_stderr_line() {
    let profile = chatty_hang(2000);
    let daemon = Daemon::start_with_profiles(&[], &[("chatty.toml", &profile)]).await;
    let workspace = daemon.workspace("s");
    let args = ["session", "start", "--agent", "chatty", "--new-task", "t", "--workspace"];
    let (code, _, err) = daemon.cli(&[&args[..], &[workspace.to_str().unwrap()]].concat()).await;
    assert_eq!(code, 1, "{err}");
    let shown: Vec<&str> = err.lines().filter(|line| line.starts_with('[')).collect();
    assert!(!err.contains("notice: the agent says"), "{err}");
    let initializing =
        shown.iter().filter(|line| line.contains("the agent is starting (initialize)")).count();
    assert_eq!(initializing, 1, "one line for the step: {err}");
    assert!(err.contains("did not answer initialize within 2000 ms"), "{err}");
    assert!(err.contains("debug line 12 of 12"), "the agent's stderr: {err}");
}

/// An agent that never answers `initialize` ends `session start`, `resume` and a `prompt`
/// without a running agent within the profile's `init_timeout_ms`, each saying so with
/// the agent's stderr.
#[tokio::test]
async fn an_agent_that_never_answers_initialize_fails_every_launch_within_its_bound() {
    let profile = chatty_hang(1500);
    let daemon = Daemon::start_with_profiles(&[], &[("chatty.toml", &profile)]).await;
    let workspace = daemon.workspace("b");
    let args = ["session", "start", "--agent", "chatty", "--new-task", "t", "--quiet"];
    let (code, out, err) =
        daemon.cli(&[&args[..], &["--workspace", workspace.to_str().unwrap()]].concat()).await;
    assert_eq!(code, 1, "{err}");
    let session = out.trim().to_owned();
    for args in [vec!["resume", &session], vec!["prompt", &session, "hello"]] {
        let started = std::time::Instant::now();
        let (code, _, err) = daemon.cli(&args).await;
        let took = started.elapsed();
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains("did not answer initialize within 1500 ms"), "{args:?}: {err}");
        assert!(err.contains("not answering initialize as configured"), "{args:?}: {err}");
        assert!(took < std::time::Duration::from_secs(15), "{args:?} took {took:?}");
    }
}

/// An agent whose profile gives it longer than a minute and a half to start (claude-code's
/// and codex's built-ins give five minutes) and that never answers `initialize`: `resume`
/// and a `prompt` waiting for it fail with the agent's own words at the profile's bound —
/// neither the CLI's nor the daemon's shorter wait cuts it off first with a bare timeout.
#[tokio::test]
async fn a_slow_bound_agent_that_never_starts_fails_with_its_own_words_not_a_timeout() {
    let fail_first = tempfile::NamedTempFile::new().unwrap();
    let profile = format!(
        "id = \"slow\"\ncommand = [\"mock-agent\", \"--fail-while\", \"{}\", \"--stderr-at-start\", \"3\", \"--hang-on\", \"initialize\"]\nprotocol = \"acp\"\n[process]\ninit_timeout_ms = 95000\n",
        fail_first.path().display()
    );
    let daemon = Daemon::start_with_profiles(&[], &[("slow.toml", &profile)]).await;
    let workspace = daemon.workspace("slow");
    // It fails at once the first time (the file is there), and leaves the session.
    let args = ["session", "start", "--agent", "slow", "--new-task", "t", "--quiet"];
    let (code, out, err) =
        daemon.cli(&[&args[..], &["--workspace", workspace.to_str().unwrap()]].concat()).await;
    assert_eq!(code, 1, "{err}");
    let session = out.trim().to_owned();
    drop(fail_first);
    let (resume_args, prompt_args) = (["resume", &session], ["prompt", &session, "hello"]);
    let bound = std::time::Duration::from_secs(150);
    let (resumed, prompted) = tokio::join!(
        daemon.cli_waiting(bound, &resume_args),
        daemon.cli_waiting(bound, &prompt_args)
    );
    for (what, (code, _, err)) in [("resume", resumed), ("prompt", prompted)] {
        assert_eq!(code, 1, "{what}: {err}");
        assert!(err.contains("did not answer initialize within 95000 ms"), "{what}: {err}");
        assert!(err.contains("not answering initialize as configured"), "{what}: {err}");
    }
}
