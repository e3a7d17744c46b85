//! Who may use the API: browser origins and a bearer token, checked on every request (and
//! so on every WebSocket upgrade) before it is served.

/// The API's access policy. A local WebSocket server is reachable from any web page, so a
/// request naming an origin that is not listed is refused; the token is wanted only when
/// configured.
#[derive(Debug, Clone, Default)]
pub struct AccessPolicy {
    /// The bearer token every request must present, if any.
    pub token: Option<String>,
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
            Some(token) if !agentctl::server::bearer_matches(headers, token) => {
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
        let policy = AccessPolicy {
            token: Some("t".into()),
            allowed_origins: vec!["http://localhost:5173".into()],
        };
        let mut headers = http::HeaderMap::new();
        assert_eq!(policy.refuse(&headers).map(|r| r.0), Some(http::StatusCode::UNAUTHORIZED));
        headers.insert(http::header::AUTHORIZATION, "Bearer t".parse().unwrap());
        assert_eq!(policy.refuse(&headers), None);
        headers.insert(http::header::AUTHORIZATION, "Bearer x".parse().unwrap());
        assert_eq!(policy.refuse(&headers).map(|r| r.0), Some(http::StatusCode::UNAUTHORIZED));
        headers.insert(http::header::AUTHORIZATION, "Bearer t".parse().unwrap());
        headers.insert(http::header::ORIGIN, "http://evil.example".parse().unwrap());
        assert_eq!(policy.refuse(&headers).map(|r| r.0), Some(http::StatusCode::FORBIDDEN));
        headers.insert(http::header::ORIGIN, "http://localhost:5173".parse().unwrap());
        assert_eq!(policy.refuse(&headers), None);
        assert_eq!(AccessPolicy::default().refuse(&http::HeaderMap::new()), None);
    }
}
