//! The endpoints an agent's own settings name — `ANTHROPIC_BASE_URL`, `OPENAI_BASE_URL`,
//! any `*_BASE_URL`, `*_API_BASE` or `*_ENDPOINT` holding an `http(s)://` URL — which join
//! its egress allowlist without being listed: an agent pointed at a model server may
//! always reach it.

use agents::profile::SandboxSettings;
use protocol::allowlist::{Allowlist, Target};

/// The `host:port` of each model endpoint `env` names (variable name, value), in order,
/// without repeats.
pub fn model_endpoints(env: &[(String, String)]) -> Vec<String> {
    let mut found = Allowlist::default();
    for (name, value) in env {
        let named = ["_BASE_URL", "_API_BASE", "_ENDPOINT"].iter().any(|end| name.ends_with(end));
        if let Some(target) = named.then(|| url_target(value)).flatten() {
            found = found.with(target);
        }
    }
    found.entries()
}

/// The allowlist a session of `sandbox` gets with `env`: the profile's entries, then its
/// model endpoints.
pub fn allowlist_for(sandbox: &SandboxSettings, env: &[(String, String)]) -> Vec<String> {
    let mut list = sandbox.allowlist();
    for entry in model_endpoints(env) {
        if let Ok(target) = Target::parse(&entry) {
            list = list.with(target);
        }
    }
    list.entries()
}

/// `http(s)://[user@]host[:port][/…]`'s host and port (80 or 443 by default).
fn url_target(url: &str) -> Option<Target> {
    let (scheme, rest) = url.trim().split_once("://")?;
    let default = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let has_port = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once("]:").is_some(),
        None => authority.contains(':'),
    };
    let text = if has_port { authority.to_owned() } else { format!("{authority}:{default}") };
    Target::parse(&text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect()
    }

    #[test]
    fn an_agents_model_endpoints_are_read_from_its_settings() {
        let env = env(&[
            ("ANTHROPIC_BASE_URL", "http://127.0.0.1:8080"),
            ("OPENAI_BASE_URL", "https://user:pw@API.example.com/v1"),
            ("AZURE_OPENAI_ENDPOINT", "https://[::1]:9443/openai"),
            ("OPENAI_API_BASE", "http://127.0.0.1:8080/v1"),
            ("SOME_BASE_URL", "not a url"),
            ("FTP_BASE_URL", "ftp://files.example.com"),
            ("HOME", "http://looks.like/a/url"),
        ]);
        assert_eq!(
            model_endpoints(&env),
            ["127.0.0.1:8080", "api.example.com:443", "[::1]:9443"],
            "named ones with an http(s) URL, once each"
        );
    }

    #[test]
    fn the_allowlist_is_the_profiles_entries_then_its_endpoints() {
        let sandbox = SandboxSettings {
            allow: vec!["registry.npmjs.org:443".into(), "127.0.0.1:8080".into()],
            ..SandboxSettings::default()
        };
        let env =
            env(&[("ANTHROPIC_BASE_URL", "http://127.0.0.1:8080"), ("X_ENDPOINT", "http://h")]);
        assert_eq!(
            allowlist_for(&sandbox, &env),
            ["registry.npmjs.org:443", "127.0.0.1:8080", "h:80"]
        );
    }
}
