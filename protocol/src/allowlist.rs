//! The egress allowlist: the `host:port` pairs a confined agent may connect to. Pure: parsed
//! from a profile's `[sandbox] allow = [...]`, asked about one target at a time (by
//! agentctl's egress proxy).

use std::fmt;

/// A host and port an agent asks to connect to (a name, an IPv4 address, or an IPv6
/// address without its brackets), the host in lower case without a trailing dot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    /// The host.
    pub host: String,
    /// The port.
    pub port: u16,
}

impl Target {
    /// `host:port` (`[v6]:port`), as an allowlist entry or a `CONNECT` names it.
    pub fn parse(text: &str) -> Result<Target, AllowlistError> {
        let bad = |why: &str| AllowlistError::Entry { entry: text.to_owned(), why: why.to_owned() };
        let (host, port) = match text.strip_prefix('[') {
            Some(rest) => {
                let (host, after) =
                    rest.split_once(']').ok_or_else(|| bad("an IPv6 address without its ']'"))?;
                (host, after.strip_prefix(':').ok_or_else(|| bad("no port after the address"))?)
            }
            None => text.rsplit_once(':').ok_or_else(|| bad("no port: write host:port"))?,
        };
        let port: u16 =
            port.parse().map_err(|_| bad("the port is not a number from 1 to 65535"))?;
        if port == 0 {
            return Err(bad("the port is not a number from 1 to 65535"));
        }
        Target::new(host, port)
            .ok_or_else(|| bad("the host is empty or holds characters no host has"))
    }

    /// `host` normalized (lower case, no trailing dot), or `None` when it cannot be a host.
    pub fn new(host: &str, port: u16) -> Option<Target> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':');
        if host.is_empty() || host.len() > 253 || !host.chars().all(allowed) {
            return None;
        }
        Some(Target { host, port })
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A bad allowlist entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllowlistError {
    /// An entry that is not `host:port`.
    #[error("the allowlist entry {entry:?} is not host:port: {why}")]
    Entry {
        /// The entry as written.
        entry: String,
        /// What is wrong with it.
        why: String,
    },
}

/// The pairs a confined agent may reach; anything else is refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    targets: Vec<Target>,
}

impl Allowlist {
    /// The list from a profile's entries (each `host:port`); the first bad one is the error.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Allowlist, AllowlistError> {
        let mut targets = Vec::with_capacity(entries.len());
        for entry in entries {
            let target = Target::parse(entry.as_ref().trim())?;
            if !targets.contains(&target) {
                targets.push(target);
            }
        }
        Ok(Allowlist { targets })
    }

    /// The list with `target` added (a model endpoint an agent is configured with).
    pub fn with(mut self, target: Target) -> Allowlist {
        if !self.targets.contains(&target) {
            self.targets.push(target);
        }
        self
    }

    /// Whether the agent may connect to `target`: its host and port are on the list as
    /// written (a name is not matched by the addresses it resolves to, nor the reverse).
    pub fn permits(&self, target: &Target) -> bool {
        self.targets.contains(target)
    }

    /// The entries, as written back (`host:port`).
    pub fn entries(&self) -> Vec<String> {
        self.targets.iter().map(ToString::to_string).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_host_and_port_normalized() {
        let list = Allowlist::parse(&["API.Anthropic.com.:443", " 127.0.0.1:8080 ", "[::1]:9000"])
            .unwrap();
        assert_eq!(list.entries(), ["api.anthropic.com:443", "127.0.0.1:8080", "[::1]:9000"]);
        assert!(list.permits(&Target::parse("api.anthropic.com:443").unwrap()));
        assert!(list.permits(&Target::new("Api.Anthropic.Com", 443).unwrap()));
        assert!(list.permits(&Target::parse("[::1]:9000").unwrap()));
    }

    #[test]
    fn only_the_pairs_on_the_list_are_permitted() {
        let list = Allowlist::parse(&["registry.npmjs.org:443"]).unwrap();
        for refused in [
            "registry.npmjs.org:80",
            "evil.example:443",
            "npmjs.org:443",
            "sub.registry.npmjs.org:443",
        ] {
            assert!(!list.permits(&Target::parse(refused).unwrap()), "{refused}");
        }
        assert!(
            !Allowlist::default().permits(&Target::parse("localhost:80").unwrap()),
            "empty: nothing"
        );
        let list = list.with(Target::parse("127.0.0.1:4000").unwrap());
        assert!(list.permits(&Target::parse("127.0.0.1:4000").unwrap()), "a model endpoint added");
    }

    #[test]
    fn a_bad_entry_says_what_is_wrong_with_it() {
        let cases = [
            ("example.com", "no port"),
            ("example.com:0", "the port is not a number"),
            ("example.com:99999", "the port is not a number"),
            ("exa mple.com:80", "characters no host has"),
            (":80", "the host is empty"),
            ("[::1:80", "without its ']'"),
            ("[::1]80", "no port after the address"),
        ];
        for (entry, why) in cases {
            let err = Allowlist::parse(&[entry]).unwrap_err();
            assert!(err.to_string().contains(why), "{entry}: {err}");
            assert!(err.to_string().contains(&format!("{entry:?}")), "{err}");
        }
    }
}
