//! Who may use the API: browser origins and a bearer token, checked on every request (and
//! so on every WebSocket upgrade) before it is served; and the token itself, checked once
//! wherever it came from.

use std::fmt;
use std::path::{Path, PathBuf};

/// The fewest characters an API token may have (`openssl rand -hex 32` gives 64).
pub const MIN_TOKEN_CHARS: usize = 16;

/// The fewest bits a token must be guessed to carry by [`guess_bits`]: a 16-character
/// random hex string carries about 70 there, `password12345678` about 49.
pub(super) const MIN_TOKEN_BITS: u32 = 60;

/// The environment variable the daemon's token may come from.
pub const TOKEN_ENV: &str = "TETHER_AUTH_TOKEN";

/// The API's bearer token: never empty, at least [`MIN_TOKEN_CHARS`] characters, with no
/// whitespace or control characters (a script's unset variable cannot open the API).
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken(String);

impl ApiToken {
    /// Checks a token given by `from`. Surrounding whitespace (a file's newline) is not
    /// part of it.
    pub fn new(raw: &str, from: &TokenSource) -> Result<ApiToken, TokenError> {
        let token = raw.trim();
        if token.is_empty() {
            return Err(TokenError::Empty(from.clone()));
        }
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(TokenError::BadCharacters(from.clone()));
        }
        let chars = token.chars().count();
        if chars < MIN_TOKEN_CHARS {
            return Err(TokenError::TooShort { from: from.clone(), chars });
        }
        let bits = guess_bits(token);
        if bits < MIN_TOKEN_BITS {
            return Err(TokenError::Guessable { from: from.clone(), bits });
        }
        Ok(ApiToken(token.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A rough count of the bits a guesser needs for `token`: each character costs the size of
/// the alphabets it draws on (lower, upper, digits, others), except one that repeats or
/// continues the one before (`aa`, `ab`, `43`) or makes a pair seen before (`passpass`),
/// which costs one bit. Rough on purpose: it refuses runs, sequences and repeats, not
/// every weak phrase.
pub(super) fn guess_bits(token: &str) -> u32 {
    let alphabet: u32 = [
        (token.chars().any(|c| c.is_ascii_lowercase()), 26),
        (token.chars().any(|c| c.is_ascii_uppercase()), 26),
        (token.chars().any(|c| c.is_ascii_digit()), 10),
        (token.chars().any(|c| !c.is_ascii_alphanumeric()), 33),
    ]
    .iter()
    .filter_map(|(present, size)| present.then_some(*size))
    .sum();
    let per_char = f64::from(alphabet.max(2)).log2();
    let mut pairs = std::collections::HashSet::new();
    let mut previous: Option<char> = None;
    let mut bits = 0.0;
    for c in token.chars() {
        let cheap = previous.is_some_and(|before| {
            (i64::from(u32::from(c)) - i64::from(u32::from(before))).abs() <= 1
                || !pairs.insert((before, c))
        });
        bits += if cheap { 1.0 } else { per_char };
        previous = Some(c);
    }
    bits as u32
}

impl fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiToken(…)")
    }
}

/// Where the daemon's token came from: every error about it names the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `--auth-token`.
    Flag,
    /// `--auth-token-file`.
    FlagFile(PathBuf),
    /// `TETHER_AUTH_TOKEN`.
    Env,
    /// `auth_token_file` in `config.toml`.
    ConfigFile { file: PathBuf, config: PathBuf },
    /// `--auth-token` or `TETHER_AUTH_TOKEN`, handed on when the daemon started itself
    /// again without them in sight.
    Inherited,
}

impl fmt::Display for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSource::Flag => f.write_str("--auth-token"),
            TokenSource::FlagFile(path) => write!(f, "--auth-token-file {}", path.display()),
            TokenSource::Env => f.write_str(TOKEN_ENV),
            TokenSource::Inherited => write!(f, "--auth-token or {TOKEN_ENV} (handed on)"),
            TokenSource::ConfigFile { file, config } => {
                write!(f, "auth_token_file {} (set in {})", file.display(), config.display())
            }
        }
    }
}

/// Why the daemon's token cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("the API token from {0} is empty")]
    Empty(TokenSource),
    #[error(
        "the API token from {from} has {chars} characters; it needs at least {MIN_TOKEN_CHARS} \
         (e.g. `openssl rand -hex 32`)"
    )]
    TooShort { from: TokenSource, chars: usize },
    #[error(
        "the API token from {from} is easy to guess (about {bits} bits; it needs \
         {MIN_TOKEN_BITS}: no runs, sequences or repeats): make one with `openssl rand -hex 32`"
    )]
    Guessable { from: TokenSource, bits: u32 },
    #[error("the API token from {0} has whitespace or control characters inside it")]
    BadCharacters(TokenSource),
    #[error("{from}: readable by others (mode {mode:o}); chmod 600 it")]
    Loose { from: TokenSource, mode: u32 },
    #[error("{from}: {error}")]
    Unreadable { from: TokenSource, error: std::io::Error },
}

/// The daemon's token, from the first of: `--auth-token`, `--auth-token-file`,
/// `TETHER_AUTH_TOKEN` (`env`), `config.toml`'s `auth_token_file`. One check for all of
/// them; a variable that is set must hold a usable token.
pub fn resolve_token(
    flag: Option<&str>,
    flag_file: Option<&Path>,
    env: Option<&std::ffi::OsStr>,
    config_file: Option<(&Path, &Path)>,
) -> Result<Option<ApiToken>, TokenError> {
    if let Some(token) = flag {
        return ApiToken::new(token, &TokenSource::Flag).map(Some);
    }
    if let Some(path) = flag_file {
        return read_token_file(path, TokenSource::FlagFile(path.to_owned())).map(Some);
    }
    if let Some(token) = env {
        let token = token.to_str().ok_or(TokenError::BadCharacters(TokenSource::Env))?;
        return ApiToken::new(token, &TokenSource::Env).map(Some);
    }
    if let Some((file, config)) = config_file {
        let from = TokenSource::ConfigFile { file: file.to_owned(), config: config.to_owned() };
        return read_token_file(file, from).map(Some);
    }
    Ok(None)
}

/// A token from a file only its owner can read (it is a password).
fn read_token_file(path: &Path, from: TokenSource) -> Result<ApiToken, TokenError> {
    use std::os::unix::fs::PermissionsExt;
    let unreadable = |error| TokenError::Unreadable { from: from.clone(), error };
    let metadata = std::fs::metadata(path).map_err(unreadable)?;
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(TokenError::Loose { from, mode });
    }
    let token = std::fs::read_to_string(path).map_err(unreadable)?;
    ApiToken::new(&token, &from)
}

/// The API's access policy. A local WebSocket server is reachable from any web page, so a
/// request naming an origin that is not listed is refused; the token is wanted only when
/// configured.
#[derive(Debug, Clone, Default)]
pub struct AccessPolicy {
    /// The bearer token every request must present, if any.
    pub token: Option<ApiToken>,
    /// Browser origins allowed to connect (exact match).
    pub allowed_origins: Vec<String>,
}

impl agentctl::server::Gate for AccessPolicy {
    fn refuse(&self, headers: &http::HeaderMap) -> Option<(http::StatusCode, &'static str)> {
        if let Some(origin) = headers.get(http::header::ORIGIN) {
            let listed = origin
                .to_str()
                .is_ok_and(|origin| self.allowed_origins.iter().any(|allowed| allowed == origin));
            if !listed {
                return Some((http::StatusCode::FORBIDDEN, "origin not allowed"));
            }
        }
        match &self.token {
            Some(token) if !agentctl::server::bearer_matches(headers, token.as_str()) => {
                Some((http::StatusCode::UNAUTHORIZED, "missing or wrong bearer token"))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use agentctl::server::Gate;

    use super::*;

    #[test]
    fn origins_and_tokens_are_checked() {
        let token = ApiToken::new("t9f3a1c07e42b8d65", &TokenSource::Flag).unwrap();
        let policy = AccessPolicy {
            token: Some(token),
            allowed_origins: vec!["http://localhost:5173".into()],
        };
        let mut headers = http::HeaderMap::new();
        assert_eq!(policy.refuse(&headers).map(|r| r.0), Some(http::StatusCode::UNAUTHORIZED));
        headers.insert(http::header::AUTHORIZATION, "Bearer t9f3a1c07e42b8d65".parse().unwrap());
        assert_eq!(policy.refuse(&headers), None);
        headers.insert(http::header::AUTHORIZATION, "Bearer x".parse().unwrap());
        assert_eq!(policy.refuse(&headers).map(|r| r.0), Some(http::StatusCode::UNAUTHORIZED));
        headers.insert(http::header::AUTHORIZATION, "Bearer t9f3a1c07e42b8d65".parse().unwrap());
        headers.insert(http::header::ORIGIN, "http://evil.example".parse().unwrap());
        assert_eq!(policy.refuse(&headers).map(|r| r.0), Some(http::StatusCode::FORBIDDEN));
        headers.insert(http::header::ORIGIN, "http://localhost:5173".parse().unwrap());
        assert_eq!(policy.refuse(&headers), None);
        assert_eq!(AccessPolicy::default().refuse(&http::HeaderMap::new()), None);
    }

    #[test]
    fn a_token_is_checked_once_wherever_it_comes_from_and_errors_name_the_source() {
        use std::os::unix::fs::PermissionsExt;
        let weak =
            |raw: &str, from: TokenSource| ApiToken::new(raw, &from).unwrap_err().to_string();
        assert_eq!(weak("", TokenSource::Flag), "the API token from --auth-token is empty");
        assert_eq!(weak("  \n", TokenSource::Env), "the API token from TETHER_AUTH_TOKEN is empty");
        assert_eq!(
            weak("short", TokenSource::Env),
            "the API token from TETHER_AUTH_TOKEN has 5 characters; it needs at least 16 (e.g. `openssl rand -hex 32`)"
        );
        assert_eq!(
            weak("a token with spaces in it", TokenSource::Flag),
            "the API token from --auth-token has whitespace or control characters inside it"
        );
        // Long enough but easy to guess: one character, a word and a run, a sequence.
        for guessable in ["aaaaaaaaaaaaaaaa", "password12345678", "0123456789abcdef"] {
            let err = weak(guessable, TokenSource::Flag);
            assert!(err.contains("is easy to guess"), "{guessable}: {err}");
            assert!(err.contains("openssl rand -hex 32"), "says how to make one: {err}");
        }
        assert!(weak("passwordpassword", TokenSource::Flag).contains("easy to guess"));
        // What `openssl rand -hex 8` (the shortest accepted) and a phrase give is fine.
        for fine in ["9f3a1c07e42b8d65", "my-team-secret-of-2026", "from-the-environment"] {
            assert!(ApiToken::new(fine, &TokenSource::Flag).is_ok(), "{fine}");
        }
        let token = ApiToken::new(" 9f3a1c07e42b8d65\n", &TokenSource::Flag).unwrap();
        assert_eq!(token.as_str(), "9f3a1c07e42b8d65");
        assert_eq!(format!("{token:?}"), "ApiToken(…)", "never printed");

        // The order: flag, flag file, environment, config file; the first given decides.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        let config = dir.path().join("config.toml");
        std::fs::write(&file, "\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let env = std::ffi::OsStr::new("from-the-environment");
        let resolved = resolve_token(None, None, Some(env), Some((&file, &config))).unwrap();
        assert_eq!(resolved.unwrap().as_str(), "from-the-environment");
        let empty_env = Some(std::ffi::OsStr::new(""));
        let err = resolve_token(None, None, empty_env, None).unwrap_err().to_string();
        assert_eq!(err, "the API token from TETHER_AUTH_TOKEN is empty", "set means used");
        let err = resolve_token(None, None, None, Some((&file, &config))).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "the API token from auth_token_file {} (set in {}) is empty",
                file.display(),
                config.display()
            )
        );
        std::fs::remove_file(&file).unwrap();
        let err = resolve_token(None, None, None, Some((&file, &config))).unwrap_err().to_string();
        assert!(err.starts_with(&format!("auth_token_file {} (set in", file.display())), "{err}");
        assert_eq!(resolve_token(None, None, None, None).unwrap(), None);
    }
}
