//! mock-agent's command line, parsed.

use super::*;

fn args(list: &[&str]) -> Result<Invocation, String> {
    parse_args(list.iter().map(|s| s.to_string()))
}

#[test]
fn flags_set_the_config() {
    let Invocation::Run(config) = args(&[
        "--state-dir",
        "/s",
        "--no-load-session",
        "--resume-capability",
        "--auth-required",
        "--resume",
        "mock-1",
        "--reject-load",
        "--fail-load",
        "--cancel-as-end-turn",
        "--hang-on",
        "initialize",
        "--crash-on",
        "session/new",
        "--exit-code",
        "9",
        "--garbage-at-start",
        "--stderr-at-start",
        "12",
        "--ignore-eof",
        "--ignore-sigterm",
        "--name",
        "m2",
        "--require-env",
        "IS_SANDBOX=1",
        "--late-replay",
        "--fail-while",
        "/tmp/flag",
        "--turn-log",
        "/tmp/turns",
        "--ballast-mb",
        "3",
        "--steering",
        "--fork",
    ])
    .unwrap() else {
        panic!("expected a run")
    };
    assert_eq!(
        *config,
        Config {
            state_dir: Some("/s".into()),
            load_session: false,
            resume_capability: true,
            auth_required: true,
            terminal_login: false,
            forget_last_messages: 0,
            resume: Some("mock-1".into()),
            reject_load: true,
            fail_load: true,
            cancel_as_end_turn: true,
            hang_on: Some("initialize".into()),
            crash_on: Some("session/new".into()),
            exit_code: 9,
            garbage_at_start: true,
            stderr_at_start: 12,
            ignore_eof: true,
            ignore_sigterm: true,
            name: "m2".into(),
            idle: false,
            require_env: Some(("IS_SANDBOX".into(), "1".into())),
            fail_while: Some("/tmp/flag".into()),
            turn_log: Some("/tmp/turns".into()),
            late_replay: true,
            replay_with_next: false,
            replay_on_resume: false,
            ballast_mb: 3,
            steering: true,
            fork: true,
        }
    );
}

#[test]
fn bad_flags_are_reported() {
    assert_eq!(args(&["--bogus"]), Err("unknown argument \"--bogus\"".into()));
    assert_eq!(args(&["--state-dir"]), Err("--state-dir needs a value".into()));
    assert_eq!(args(&["--resume", "x"]), Err("--resume needs --state-dir".into()));
    assert_eq!(
        args(&["--state-dir", "/s", "--resume", "../x"]),
        Err("--resume: \"../x\" is not a session id".into())
    );
    assert_eq!(args(&["--exit-code", "z"]), Err("--exit-code: \"z\" is not a number".into()));
    assert_eq!(args(&["-h"]), Ok(Invocation::Help));
}
