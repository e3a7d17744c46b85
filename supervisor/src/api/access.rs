//! Who may use the API: browser origins and a bearer token, checked on every request (and
//! so on every WebSocket upgrade) before it is served; and the token itself, checked once
//! wherever it came from.

use std::fmt;
use std::path::{Path, PathBuf};

/// The fewest characters an API token may have (`openssl rand -hex 32` gives 64).
pub const MIN_TOKEN_CHARS: usize = 16;

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
        Ok(ApiToken(token.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
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
        let token = ApiToken::new("t0123456789abcdef", &TokenSource::Flag).unwrap();
        let policy = AccessPolicy {
            token: Some(token),
            allowed_origins: vec!["http://localhost:5173".into()],
        };
        let mut headers = http::HeaderMap::new();
        assert_eq!(policy.refuse(&headers).map(|r| r.0), Some(http::StatusCode::UNAUTHORIZED));
        headers.insert(http::header::AUTHORIZATION, "Bearer t0123456789abcdef".parse().unwrap());
        assert_eq!(policy.refuse(&headers), None);
        headers.insert(http::header::AUTHORIZATION, "Bearer x".parse().unwrap());
        assert_eq!(policy.refuse(&headers).map(|r| r.0), Some(http::StatusCode::UNAUTHORIZED));
        headers.insert(http::header::AUTHORIZATION, "Bearer t0123456789abcdef".parse().unwrap());
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
        let token = ApiToken::new(" 0123456789abcdef\n", &TokenSource::Flag).unwrap();
        assert_eq!(token.as_str(), "0123456789abcdef");
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
