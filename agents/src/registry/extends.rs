//! `extends = "BUILTIN"` in a user profile: the built-in's file with the user's keys laid
//! over it (tables merge key by key, any other value — an array too — is replaced), so one
//! key can change without copying the whole profile. The result is parsed and checked like
//! any profile, and remembers what it extends and which keys are its own, for `agents`.

use serde::{Deserialize, Serialize};

use super::BUILTIN_FILES;
use crate::profile::{self, Profile, ProfileError, ProfileSource};

/// What a profile extends, and the keys its own file sets (dotted: `process.init_timeout_ms`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extended {
    /// The built-in's id.
    pub base: String,
    /// The keys the user's file sets, each a leaf (a table's keys, not the table).
    pub own: Vec<String>,
}

/// Parses a user file: as it is, or — with `extends` — laid over the built-in it names.
pub(super) fn parse_user(text: &str, source: ProfileSource) -> Result<Profile, ProfileError> {
    let error = |field: &str, reason: String| ProfileError {
        file: source.clone(),
        line: 1,
        column: 1,
        field: field.to_owned(),
        reason,
    };
    let Ok(mut own) = text.parse::<toml::Table>() else {
        // Not TOML: the plain parse says where.
        return profile::parse(text, source);
    };
    let Some(base) = own.remove("extends") else { return profile::parse(text, source) };
    let Some(base) = base.as_str().map(str::to_owned) else {
        return Err(error("extends", "extends names a built-in profile's id (a string)".into()));
    };
    let Some(base_text) = builtin_text(&base) else {
        let ids: Vec<String> = super::builtins().into_iter().flatten().map(|p| p.id).collect();
        return Err(error(
            "extends",
            format!("no built-in profile {base:?} (the built-ins: {})", ids.join(", ")),
        ));
    };
    if !own.contains_key("id") {
        return Err(error(
            "id",
            format!(
                "a profile that extends {base} needs an id of its own (or {base:?}, to replace it)"
            ),
        ));
    }
    let mut merged: toml::Table = base_text.parse().expect("UNWRAP: built-ins are valid TOML");
    let mut keys = Vec::new();
    leaf_keys(&own, "", &mut keys);
    lay_over(&mut merged, own);
    let text = toml::to_string(&merged).map_err(|err| error("(file)", err.to_string()))?;
    let mut profile = profile::parse(&text, source.clone()).map_err(|err| ProfileError {
        // The merged text's lines are not the file's: the field says where.
        line: 1,
        column: 1,
        reason: format!("{} (with what it takes from {base})", err.reason),
        ..err
    })?;
    profile.source = source;
    profile.extends = Some(Extended { base, own: keys });
    Ok(profile)
}

fn builtin_text(id: &str) -> Option<&'static str> {
    BUILTIN_FILES.iter().map(|(_, text)| *text).find(|text| {
        text.parse::<toml::Table>().ok().and_then(|table| table.get("id").cloned())
            == Some(toml::Value::String(id.to_owned()))
    })
}

/// `own`'s keys over `base`: tables merge, other values replace.
fn lay_over(base: &mut toml::Table, own: toml::Table) {
    for (key, value) in own {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(inner)), toml::Value::Table(over)) => lay_over(inner, over),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

fn leaf_keys(table: &toml::Table, prefix: &str, keys: &mut Vec<String>) {
    for (key, value) in table {
        let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
        match value {
            toml::Value::Table(inner) => leaf_keys(inner, &path, keys),
            _ => keys.push(path),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> Result<Profile, ProfileError> {
        parse_user(text, ProfileSource::File("/p/fast.toml".into()))
    }

    #[test]
    fn a_user_profile_changes_one_key_of_a_builtin() {
        let profile = user(
            "extends = \"claude-code\"\nid = \"claude-fast\"\n[process]\ninit_timeout_ms = 5000\n",
        )
        .unwrap();
        let builtin =
            super::super::builtins().into_iter().flatten().find(|p| p.id == "claude-code");
        let builtin = builtin.unwrap();
        assert_eq!(profile.id, "claude-fast");
        assert_eq!(profile.process.init_timeout_ms, 5000);
        // Everything else is the built-in's: its command, credentials, root_env, docker.
        assert_eq!(profile.command, builtin.command);
        assert_eq!(profile.credentials, builtin.credentials);
        assert_eq!(profile.process.root_env, builtin.process.root_env);
        assert_eq!(profile.docker, builtin.docker);
        let extended = profile.extends.unwrap();
        assert_eq!(extended.base, "claude-code");
        assert_eq!(extended.own, ["id", "process.init_timeout_ms"]);
    }

    #[test]
    fn extends_names_a_builtin_and_brings_its_own_id() {
        let unknown = user("extends = \"clod\"\nid = \"x\"\n").unwrap_err();
        assert_eq!(unknown.field, "extends");
        assert!(unknown.reason.contains("claude-code"), "{}", unknown.reason);
        let no_id = user("extends = \"codex\"\n").unwrap_err();
        assert_eq!(no_id.field, "id");
        let bad = user("extends = \"codex\"\nid = \"c\"\n[process]\ninit_timeout_ms = \"soon\"\n")
            .unwrap_err();
        assert_eq!(bad.field, "process.init_timeout_ms", "{bad:?}");
        assert!(bad.reason.contains("with what it takes from codex"), "{}", bad.reason);
        // Without extends, a file is parsed as it is.
        assert!(
            user("id = \"plain\"\ncommand = [\"x\"]\nprotocol = \"acp\"\n")
                .unwrap()
                .extends
                .is_none()
        );
    }
}
