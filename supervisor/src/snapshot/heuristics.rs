//! What a snapshot reads between the lines of a history: what became of each error, and
//! the newest test run (documented for users in `docs/api.md`, "Snapshot"). Guesses from
//! what the session shows; nothing here asks the agent.

use protocol::api::{ErrorResolution, SnapshotTests};

use crate::history::{EntryType, HistoryEntry, excerpt_tail};

/// The most failing tests listed.
const MAX_FAILING: usize = 20;

/// What one thing that happened was, as far as resolving an error goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outcome {
    /// A tool call completed (its name).
    ToolDone(String),
    /// A tool call failed (its name).
    ToolFailed(String),
    /// A turn completed.
    TurnDone,
    /// The session paused.
    Paused,
    /// Anything else.
    Other,
}

/// What became of an error from `source` (`tool`: the tool `name`; `turn`; `session`)
/// given what happened after it, oldest first: fixed when the same thing succeeded later
/// (the tool completed when run again; a turn completed after a failed turn or an agent's
/// exit), worked around when something else succeeded (another tool, or the turn's end
/// after a failed tool), deferred when the session paused before either, else unresolved.
pub(super) fn resolution(source: &str, name: Option<&str>, after: &[Outcome]) -> ErrorResolution {
    let fixed = match source {
        "tool" => after
            .iter()
            .any(|o| matches!(o, Outcome::ToolDone(done) if Some(done.as_str()) == name)),
        _ => after.contains(&Outcome::TurnDone),
    };
    if fixed {
        return ErrorResolution::Fixed;
    }
    if source == "tool"
        && after.iter().any(|o| matches!(o, Outcome::ToolDone(_) | Outcome::TurnDone))
    {
        return ErrorResolution::WorkedAround;
    }
    if after.contains(&Outcome::Paused) {
        return ErrorResolution::Deferred;
    }
    ErrorResolution::Unresolved
}

/// Words that make a command a test run, matched on word boundaries.
const RUNNERS: &[&str] = &[
    "cargo test",
    "cargo nextest",
    "pytest",
    "npm test",
    "npm run test",
    "yarn test",
    "pnpm test",
    "bun test",
    "go test",
    "jest",
    "vitest",
    "mocha",
    "make test",
    "make check",
    "mvn test",
    "gradle test",
    "rspec",
    "phpunit",
    "ctest",
    "tox",
    "nox",
    "dotnet test",
    "mix test",
];

/// The command a tool call's title runs, when it is a test run: the title without a
/// leading `Run`/`Running` and backticks.
fn test_command(title: &str) -> Option<String> {
    let trimmed = title.trim();
    let command = ["Run ", "Running ", "run ", "Execute ", "$ "]
        .iter()
        .find_map(|prefix| trimmed.strip_prefix(prefix))
        .unwrap_or(trimmed)
        .trim_matches('`')
        .trim();
    let padded = format!(" {} ", command.to_lowercase());
    let is_test = RUNNERS.iter().any(|runner| {
        padded.contains(&format!(" {runner} ")) || padded.contains(&format!("/{runner} "))
    });
    is_test.then(|| command.to_owned())
}

/// The failing tests an output names, in the formats of the usual runners: cargo's
/// `test NAME ... FAILED`, pytest's `FAILED path::name`, go's `--- FAIL: Name`, jest's
/// and mocha's `✕ name`/`✗ name`.
fn failing_tests(output: &str) -> Vec<String> {
    let mut failing: Vec<String> = Vec::new();
    for line in output.lines().map(str::trim) {
        let name = if let Some(rest) = line.strip_prefix("test ") {
            rest.strip_suffix(" ... FAILED").map(str::to_owned)
        } else if let Some(rest) = line.strip_prefix("FAILED ") {
            Some(rest.split(" - ").next().unwrap_or(rest).trim().to_owned())
        } else if let Some(rest) = line.strip_prefix("--- FAIL: ") {
            Some(rest.split(' ').next().unwrap_or(rest).to_owned())
        } else {
            line.strip_prefix("✕ ").or_else(|| line.strip_prefix("✗ ")).map(|rest| {
                // jest adds the time: `✕ adds (3 ms)`.
                rest.rsplit_once(" (").map_or(rest, |(name, _)| name).to_owned()
            })
        };
        if let Some(name) = name.filter(|name| !name.is_empty())
            && !failing.contains(&name)
        {
            failing.push(name);
        }
        if failing.len() == MAX_FAILING {
            break;
        }
    }
    failing
}

/// The newest test run among `entries` (a history read, oldest first): the last tool
/// result whose call's title runs a test suite.
pub(super) fn last_test_run(entries: &[HistoryEntry]) -> Option<SnapshotTests> {
    entries.iter().rev().filter(|entry| entry.kind == EntryType::ToolResult).find_map(|entry| {
        let command = test_command(entry.tool_name.as_deref()?)?;
        Some(SnapshotTests {
            command,
            passed: entry.tool_status.as_deref() == Some("completed"),
            at: entry.at,
            failing: failing_tests(&entry.content),
            output: excerpt_tail(&entry.content, 500),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_runs_are_told_from_other_commands() {
        assert_eq!(
            test_command("Run cargo test -p parser").as_deref(),
            Some("cargo test -p parser")
        );
        assert_eq!(test_command("`pytest -x tests/`").as_deref(), Some("pytest -x tests/"));
        assert_eq!(test_command("Running npm test").as_deref(), Some("npm test"));
        assert_eq!(
            test_command("./node_modules/.bin/jest src").as_deref(),
            Some("./node_modules/.bin/jest src")
        );
        assert_eq!(test_command("go test ./..."), Some("go test ./...".to_owned()));
        assert_eq!(test_command("Run cargo build"), None);
        assert_eq!(test_command("Read attestation.md"), None, "a word containing test");
        assert_eq!(test_command("Edit src/toxic.rs"), None);
    }

    #[test]
    fn failing_tests_are_read_in_the_usual_formats() {
        let cargo = "running 3 tests\ntest lexer::ok ... ok\ntest parser::nested ... FAILED\ntest parser::empty ... FAILED\n";
        assert_eq!(failing_tests(cargo), ["parser::nested", "parser::empty"]);
        let pytest = "FAILED tests/test_a.py::test_one - AssertionError: 1 != 2\nFAILED tests/test_a.py::test_two\n";
        assert_eq!(
            failing_tests(pytest),
            ["tests/test_a.py::test_one", "tests/test_a.py::test_two"]
        );
        let go = "--- FAIL: TestParse (0.00s)\n--- FAIL: TestParse (0.00s)\nFAIL\n";
        assert_eq!(failing_tests(go), ["TestParse"]);
        let jest = "  ✓ works (2 ms)\n  ✕ adds numbers (3 ms)\n";
        assert_eq!(failing_tests(jest), ["adds numbers"]);
        assert!(failing_tests("all good\n").is_empty());
    }

    #[test]
    fn an_error_is_fixed_worked_around_deferred_or_unresolved() {
        use ErrorResolution::*;
        let tool = |name: &str| Outcome::ToolDone(name.into());
        let failed = |name: &str| Outcome::ToolFailed(name.into());
        let name = Some("cargo test");
        assert_eq!(resolution("tool", name, &[failed("cargo test"), tool("cargo test")]), Fixed);
        assert_eq!(resolution("tool", name, &[tool("edit"), Outcome::TurnDone]), WorkedAround);
        assert_eq!(resolution("tool", name, &[Outcome::Other, Outcome::Paused]), Deferred);
        assert_eq!(resolution("tool", name, &[failed("cargo test")]), Unresolved);
        assert_eq!(resolution("turn", None, &[Outcome::Paused, Outcome::TurnDone]), Fixed);
        assert_eq!(resolution("session", None, &[tool("ls"), Outcome::Paused]), Deferred);
        assert_eq!(resolution("session", None, &[]), Unresolved);
    }
}
