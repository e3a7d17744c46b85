//! Tidy checks over the workspace's own sources: every Rust file opens with a `//!` line
//! saying what it is for, no test is ignored or marked should-panic, tests are named by
//! behaviour (not by the issue that asked for them), the session actor's field count and
//! impl blocks only go down, every module is on ARCHITECTURE.md's code map, and the
//! daemon passes identifiers as types, not text.

use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in
        std::fs::read_dir(dir).unwrap_or_else(|err| panic!("read {}: {err}", dir.display()))
    {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|name| name.to_str()).unwrap_or_default();
        if name == "target" || name.starts_with('.') {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, out);
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

fn sources() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for krate in ["protocol", "agentctl", "supervisor", "agents", "tests"] {
        rust_files(&workspace_root().join(krate), &mut files);
    }
    assert!(files.len() > 10, "the walk found too few files: {files:?}");
    files
}

#[test]
fn every_rust_file_starts_with_a_module_doc() {
    let missing: Vec<_> = sources()
        .into_iter()
        .filter(|path| !std::fs::read_to_string(path).expect("a source file").starts_with("//! "))
        .collect();
    assert!(missing.is_empty(), "files without a leading //! doc line: {missing:#?}");
}

#[test]
fn no_ignored_or_should_panic_tests() {
    let banned = [concat!("#[", "ignore"), concat!("#[", "should_panic")];
    let offenders: Vec<_> = sources()
        .into_iter()
        .filter(|path| {
            let text = std::fs::read_to_string(path).expect("a source file");
            banned.iter().any(|attr| text.contains(attr))
        })
        .collect();
    assert!(offenders.is_empty(), "assert Err/None explicitly instead: {offenders:#?}");
}

/// Whether `text` names an issue by its number (the word "issue" followed by a number) or
/// a test after one ("r", the number, an underscore, a name).
fn names_an_issue(text: &str) -> bool {
    let words: Vec<&str> = text.split(|c: char| !c.is_alphanumeric() && c != '_').collect();
    let numbered = |word: &str| !word.is_empty() && word.chars().all(|c| c.is_ascii_digit());
    let after_issue = words.windows(2).any(|pair| {
        (pair[0].eq_ignore_ascii_case("issue") || pair[0].eq_ignore_ascii_case("issues"))
            && numbered(pair[1])
    });
    let prefixed = words.iter().any(|word| {
        word.strip_prefix('r')
            .and_then(|rest| rest.split_once('_'))
            .is_some_and(|(number, name)| numbered(number) && !name.is_empty())
    });
    after_issue || prefixed
}

#[test]
fn tests_and_comments_name_behaviour_not_issue_numbers() {
    // (Spelled in parts: this file is checked too.)
    assert!(names_an_issue(concat!("/// Iss", "ue 49, item 24: a full disk")));
    assert!(names_an_issue(concat!("async fn r", "27_a_stop_mid_turn() {")));
    assert!(!names_an_issue("an issue with 3 parts; r2d2 and var_1 are names; issue #x"));
    let mut offenders = Vec::new();
    for path in sources() {
        let text = std::fs::read_to_string(&path).expect("a source file");
        for (index, line) in text.lines().enumerate() {
            if names_an_issue(line) {
                offenders.push(format!("{}:{}: {line}", path.display(), index + 1));
            }
        }
    }
    assert!(offenders.is_empty(), "say what it does, not which issue: {offenders:#?}");
}

/// The most fields `SessionActor` may have. A ratchet: lower it as state moves into the
/// actor's components; it never goes up.
const SESSION_ACTOR_FIELDS: usize = 12;

#[test]
fn the_session_actor_gains_no_fields() {
    let path = workspace_root().join("supervisor/src/session/actor.rs");
    let text = std::fs::read_to_string(&path).expect("the actor's source");
    let body = text
        .split_once("pub(super) struct SessionActor {")
        .and_then(|(_, rest)| rest.split_once("\n}"))
        .map(|(body, _)| body)
        .expect("struct SessionActor in actor.rs");
    let fields = body
        .lines()
        .map(str::trim_start)
        .filter(|line| !line.starts_with("//") && !line.starts_with('#'))
        .filter(|line| {
            let line = line.strip_prefix("pub(super) ").unwrap_or(line);
            line.split_once(':').is_some_and(|(name, _)| {
                !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            })
        })
        .count();
    assert!(fields > 5, "the count found too few fields ({fields}): the parse is wrong");
    assert!(
        fields <= SESSION_ACTOR_FIELDS,
        "SessionActor has {fields} fields, more than {SESSION_ACTOR_FIELDS}: give the new state \
         to the component that owns it"
    );
}

/// The most `impl SessionActor` blocks, and the most files they are in: one block, in
/// `session/actor.rs`, so every transition the actor composes is found in one place. What
/// needs no actor goes on the component that owns its state, not into another block.
const SESSION_ACTOR_IMPLS: (usize, usize) = (1, 1);

#[test]
fn the_session_actor_is_implemented_in_no_more_places() {
    let mut files = Vec::new();
    rust_files(&workspace_root().join("supervisor/src/session"), &mut files);
    let mut blocks = 0;
    let mut holding = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a source file");
        let here = text.lines().filter(|line| line.starts_with("impl SessionActor")).count();
        blocks += here;
        holding += usize::from(here > 0);
    }
    assert!(blocks > 0, "no impl SessionActor found: the walk is wrong");
    let (most_blocks, most_files) = SESSION_ACTOR_IMPLS;
    assert!(
        blocks <= most_blocks && holding <= most_files,
        "SessionActor has {blocks} impl blocks in {holding} files, more than {most_blocks} in \
         {most_files}: put the new logic on the component that owns the state"
    );
}

/// The backticked paths listed under `### `<crate>/src/`` in ARCHITECTURE.md's code map.
/// An identifier passed as bare text: `session_id: String`, `turn_id: &str`, …
fn bare_id(line: &str) -> bool {
    let kinds = ["session", "turn", "execution", "workflow", "step"];
    let texts = [": String", ": &str", ": &String", ": Option<String>", ": Option<&str>"];
    kinds.iter().any(|kind| {
        texts.iter().any(|text| {
            let needle = format!("{kind}_id{text}");
            line.match_indices(&needle).any(|(at, _)| {
                let before = line[..at].chars().next_back();
                let after = line[at + needle.len()..].chars().next();
                !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                    && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
        })
    })
}

/// Ids are types (`crate::ids`) in the daemon; text only where the wire has it (the
/// JSON-RPC handlers in `api/`) and in tests.
#[test]
fn identifiers_are_types_not_text() {
    assert!(bare_id("    session_id: String,") && bare_id("fn f(step_id: &str)"));
    assert!(!bare_id("    acp_session_id: String,") && !bare_id("session_id: SessionId"));
    let src = workspace_root().join("supervisor").join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut found = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&src).expect("under src").to_string_lossy().into_owned();
        let wire = relative == "api.rs" || relative.starts_with("api/");
        if wire || relative.ends_with("tests.rs") || relative.contains("/tests/") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("readable");
        for (n, line) in text.lines().enumerate() {
            if bare_id(line) {
                found.push(format!("{relative}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "ids as text (use crate::ids):\n{}", found.join("\n"));
}

fn code_map(krate: &str) -> Vec<String> {
    let text =
        std::fs::read_to_string(workspace_root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let heading = format!("### `{krate}/src/`");
    let section = text
        .split_once(&heading)
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("the code map has no section {heading}"));
    let section = section.split("\n#").next().unwrap_or_default();
    section.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

#[test]
fn every_module_is_on_the_code_map() {
    let mut missing = Vec::new();
    for krate in ["protocol", "agents", "agentctl", "supervisor", "tests"] {
        let src = workspace_root().join(krate).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let listed = code_map(krate);
        assert!(listed.len() > 3, "the {krate} section lists too few paths: {listed:?}");
        for file in files {
            let relative =
                file.strip_prefix(&src).expect("under src").to_string_lossy().into_owned();
            // Test modules are not modules of the map.
            let test = relative == "tests.rs"
                || relative.ends_with("/tests.rs")
                || relative.split('/').any(|part| part == "tests");
            if !test && !listed.contains(&relative) {
                missing.push(format!("{krate}/src/{relative}"));
            }
        }
    }
    assert!(missing.is_empty(), "modules missing from ARCHITECTURE.md's code map: {missing:#?}");
}

/// Copies what `scripts/check-shape.sh` reads (manifests and Rust sources) into `to`.
fn copy_shape(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("a directory") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|name| name.to_str()).unwrap_or_default().to_owned();
        if name == "target" || name.starts_with('.') || name == "node_modules" {
            continue;
        }
        let dest = to.join(&name);
        if path.is_dir() {
            std::fs::create_dir_all(&dest).unwrap();
            copy_shape(&path, &dest);
        } else if name.ends_with(".rs")
            || name.ends_with(".toml")
            || name == "Cargo.lock"
            || name.ends_with(".sh")
        {
            std::fs::copy(&path, &dest).unwrap();
        }
    }
}

fn check_shape(root: &Path) -> (bool, String) {
    let output = std::process::Command::new("bash")
        .arg(root.join("scripts/check-shape.sh"))
        .output()
        .expect("bash runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

fn append(path: &Path, section: &str, line: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    let edited = text.replacen(section, &format!("{section}\n{line}"), 1);
    assert_ne!(text, edited, "{section} in {}", path.display());
    std::fs::write(path, edited).unwrap();
}

/// CI's shape check passes on the tree as it is, and fails — naming the crate
/// and the dependency — when a crate depends on one above it or declares a dependency it
/// does not use.
#[test]
fn the_shape_check_fails_on_a_layering_violation_and_an_unused_dependency() {
    let (ok, out) = check_shape(&workspace_root());
    assert!(ok, "the tree passes: {out}");
    for (krate, line, expected) in [
        ("protocol", "agents.workspace = true", "protocol: depends on workspace crate `agents`"),
        ("agents", "itoa = \"1\"", "agents: unused dependency `itoa`"),
    ] {
        let copy = tempfile::tempdir().unwrap();
        copy_shape(&workspace_root(), copy.path());
        append(&copy.path().join(krate).join("Cargo.toml"), "[dependencies]", line);
        let (ok, out) = check_shape(copy.path());
        assert!(!ok && out.contains(expected), "{krate} + {line}: {out}");
    }
}
