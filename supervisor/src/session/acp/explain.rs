//! Why an agent cannot go on, said for the person reading the session's error: missing
//! credentials and what would supply them, an agent's exit and what its stderr said.

use crate::history;
use crate::session::actor::Opening;
use crate::session::conversation::STDERR_IN_ERROR;

/// Why a session cannot start without credentials: what the agent said and offers, and
/// what the profile allows.
pub(in crate::session) fn credentials_needed(
    opening: Option<&Opening>,
    profile: &agents::profile::Profile,
    agent_home: &std::path::Path,
    said: &str,
) -> String {
    let offered = match opening {
        Some(opening) if !opening.auth_offered.is_empty() => {
            format!("it offers {}", opening.auth_offered.join(", "))
        }
        _ => "it offers no authentication method Tether can use".to_owned(),
    };
    let terminal = match opening {
        Some(opening) if opening.auth_offered.is_empty() => opening.auth_terminal.first().cloned(),
        _ => None,
    };
    let allowed = if let Some((name, args)) = terminal {
        // Only a login at a terminal: an [[auth]] method would not help (it hangs).
        let program = profile.command.first().cloned().unwrap_or_default();
        let mut run = std::iter::once(program).chain(args).collect::<Vec<_>>().join(" ");
        if run.trim().is_empty() {
            run = "the agent's own login command".into();
        }
        let home = agent_home.display();
        let files = match profile.session.agent_state_dirs.as_slice() {
            [] => String::new(),
            dirs => format!(
                " ({})",
                dirs.iter().map(|dir| format!("{home}/{dir}")).collect::<Vec<_>>().join(", ")
            ),
        };
        format!(
            "it logs in only at a terminal ({name}): run `{run}` once in a terminal, as the user the agent runs as, with HOME={home}; it keeps the login in its own files there{files}, which it reads at every start; then resume"
        )
    } else if opening.is_some_and(|opening| opening.auth_offered.is_empty()) {
        // Nothing to choose (Auggie): only the agent's own program can log it in.
        format!(
            "log in with the agent's own program once, as the user the agent runs as, with HOME={}; then resume",
            agent_home.display()
        )
    } else if profile.auth.is_empty() {
        "the profile allows none (add an [[auth]] method)".to_owned()
    } else {
        let choices: Vec<String> = profile
            .auth
            .iter()
            .map(|choice| match choice.env.as_slice() {
                [] => choice.method.clone(),
                env => format!("{} (with {} set)", choice.method, env.join(" or ")),
            })
            .collect();
        format!("the profile allows {}", choices.join(", "))
    };
    format!("needs credentials: the agent said \"{said}\"; {offered}; {allowed}")
}

/// claude-agent-acp run as root without IS_SANDBOX=1 exits with code 1 and says nothing:
/// when that is what happened (on the host, as root, a `root_env` variable not set), the
/// error says which.
fn root_env_hint(
    profile: &agents::profile::Profile,
    in_container: bool,
    code: Option<i32>,
) -> String {
    if code != Some(1) || in_container || !nix::unistd::geteuid().is_root() {
        return String::new();
    }
    let missing = profile.root_env_missing(|name| std::env::var(name).ok());
    if missing.is_empty() {
        return String::new();
    }
    format!("; run as root, this agent needs {} in its environment", missing.join(" and "))
}

/// Why the agent is gone, from its exit status and the tail of its stderr.
pub(in crate::session) fn exit_reason(
    status: protocol::control::ExitInfo,
    stderr_tail: &str,
    profile: &agents::profile::Profile,
    in_container: bool,
) -> String {
    let how = match (status.code, status.signal) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => "unknown status".into(),
    };
    let tail = history::excerpt_tail(stderr_tail.trim_end(), STDERR_IN_ERROR);
    if tail.is_empty() {
        format!("the agent exited ({how}){}", root_env_hint(profile, in_container, status.code))
    } else {
        format!("the agent exited ({how}): {tail}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::control::ExitInfo;

    #[test]
    fn an_exit_is_said_with_its_code_or_signal_and_the_stderr_tail() {
        let profile =
            agents::registry::Registry::builtin_only().get("mock").expect("the mock profile");
        let code = ExitInfo { code: Some(3), signal: None };
        assert_eq!(
            exit_reason(code, "boom\n", &profile, true),
            "the agent exited (exit code 3): boom"
        );
        let signal = ExitInfo { code: None, signal: Some(9) };
        assert_eq!(exit_reason(signal, "  ", &profile, true), "the agent exited (signal 9)");
    }

    #[test]
    fn credentials_needed_says_what_the_profile_allows() {
        let profile =
            agents::registry::Registry::builtin_only().get("mock").expect("the mock profile");
        let said = credentials_needed(None, &profile, std::path::Path::new("/home/a"), "no key");
        assert!(said.starts_with("needs credentials: the agent said \"no key\"; "), "{said}");
        assert!(said.contains("it offers no authentication method Tether can use"), "{said}");
    }
}
