//! Agents run through `npx` (claude-code's and codex's adapters): which package a command
//! fetches, and whether npx has it already — a first start downloads hundreds of MB before
//! the agent says anything, which a person should be told.

use std::path::{Path, PathBuf};

/// The package an `npx` command runs: its name and pinned version, from the first argument
/// that is not an option (`npx --yes @scope/name@1.2.3` → `("@scope/name", Some("1.2.3"))`).
/// `None` when `command[0]` is not npx, or it runs a `--package` it names otherwise.
pub fn package(command: &[String]) -> Option<(String, Option<String>)> {
    let (program, args) = command.split_first()?;
    if Path::new(program).file_name()? != "npx" {
        return None;
    }
    let spec = args.iter().find(|arg| !arg.starts_with('-'))?;
    if args.iter().any(|arg| arg == "-p" || arg.starts_with("--package")) {
        return None; // the package is named apart from the command: not guessed at
    }
    // A scope's `@` is the first character; a version's is after the name.
    Some(match spec.rfind('@').filter(|&at| at > 0) {
        Some(at) => (spec[..at].to_owned(), Some(spec[at + 1..].to_owned())),
        None => (spec.clone(), None),
    })
}

/// npx's cache directory for an agent: `npm_config_cache` if set, else `~/.npm` (`home`).
pub fn cache_dir(home: &Path, npm_config_cache: Option<&str>) -> PathBuf {
    match npm_config_cache.filter(|dir| !dir.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => home.join(".npm"),
    }
}

/// Whether npx has `name` (of `version`, when pinned) in its cache at `cache`: one of its
/// `_npx/<hash>/node_modules/<name>/package.json` says that version.
pub fn cached(cache: &Path, name: &str, version: Option<&str>) -> bool {
    let Ok(entries) = std::fs::read_dir(cache.join("_npx")) else { return false };
    entries.flatten().any(|entry| {
        let manifest = entry.path().join("node_modules").join(name).join("package.json");
        let Ok(text) = std::fs::read(&manifest) else { return false };
        let Ok(manifest) = serde_json::from_slice::<serde_json::Value>(&text) else {
            return false;
        };
        version.is_none_or(|version| manifest["version"].as_str() == Some(version))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(|arg| (*arg).to_owned()).collect()
    }

    #[test]
    fn the_package_an_npx_command_runs() {
        let claude = argv(&["npx", "--yes", "@agentclientprotocol/claude-agent-acp@0.101.0"]);
        assert_eq!(
            package(&claude),
            Some(("@agentclientprotocol/claude-agent-acp".into(), Some("0.101.0".into())))
        );
        assert_eq!(
            package(&argv(&["/usr/bin/npx", "-y", "amp-acp"])),
            Some(("amp-acp".into(), None))
        );
        assert_eq!(
            package(&argv(&["npx", "-y", "@scope/name"])),
            Some(("@scope/name".into(), None))
        );
        assert_eq!(package(&argv(&["node", "x@1"])), None);
        assert_eq!(package(&argv(&["npx", "--package", "a@1", "b"])), None);
        assert_eq!(package(&argv(&["npx"])), None);
    }

    #[test]
    fn cached_reads_the_version_npx_installed() {
        let home = tempfile::tempdir().unwrap();
        let cache = cache_dir(home.path(), None);
        assert_eq!(cache, home.path().join(".npm"));
        assert_eq!(cache_dir(home.path(), Some("/c")), PathBuf::from("/c"));
        assert!(!cached(&cache, "@s/agent", Some("1.0.0")), "no cache at all");
        let dir = cache.join("_npx/0123abcd/node_modules/@s/agent");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("package.json"), r#"{"name": "@s/agent", "version": "0.9.0"}"#)
            .unwrap();
        assert!(!cached(&cache, "@s/agent", Some("1.0.0")), "another version");
        assert!(cached(&cache, "@s/agent", Some("0.9.0")));
        assert!(cached(&cache, "@s/agent", None));
    }
}
