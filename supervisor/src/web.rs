//! The built-in web UI and the metrics endpoint, on the API's own address.
//!
//! Two HTTP layers around the JSON-RPC server:
//! - [`PagesLayer`], outermost: `GET /` and `/ui/*` answer the page and its assets
//!   (embedded in the binary; static, no data, so they need no token); and a browser's
//!   WebSocket upgrade is adapted to the API's access rules — its own page's origin is
//!   accepted (see [`same_origin`]), and the token it cannot put in an `Authorization`
//!   header arrives as a subprotocol entry `tether-token.<hex>`;
//! - [`MetricsLayer`], inside the access check: `GET /metrics` answers the OpenMetrics
//!   text, under the same rules as the API (the token beyond loopback).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, Method, StatusCode, header};
use jsonrpsee::server::{HttpBody, HttpRequest, HttpResponse};

use crate::service::Supervisor;

const INDEX: &str = include_str!("web/index.html");
/// The page's ES modules by path (app.js is the entry; it imports the rest).
const MODULES: &[(&str, &str)] = &[
    ("/ui/app.js", include_str!("web/app.js")),
    ("/ui/render.js", include_str!("web/render.js")),
    ("/ui/list.js", include_str!("web/list.js")),
    ("/ui/views.js", include_str!("web/views.js")),
    ("/ui/rewind.js", include_str!("web/rewind.js")),
    ("/ui/changes.js", include_str!("web/changes.js")),
    ("/ui/diff.js", include_str!("web/diff.js")),
    ("/ui/turns.js", include_str!("web/turns.js")),
    ("/ui/state.js", include_str!("web/state.js")),
    ("/ui/windows.js", include_str!("web/windows.js")),
    ("/ui/stream.js", include_str!("web/stream.js")),
    ("/ui/lists.js", include_str!("web/lists.js")),
    ("/ui/sandbox.js", include_str!("web/sandbox.js")),
];
/// Pinned, vendored libraries (see `web/vendor/README.md`): Markdown and its sanitizer.
const MARKED_JS: &str = include_str!("web/vendor/marked.umd.js");
const PURIFY_JS: &str = include_str!("web/vendor/purify.min.js");
const APP_CSS: &str = include_str!("web/app.css");
/// The page's icon.
const FAVICON: &str = include_str!("web/favicon.svg");

/// The subprotocol the page asks for; the server names it in its answer, as browsers
/// require when a page offers subprotocols.
pub const SUBPROTOCOL: &str = "tether";
/// The prefix of the subprotocol entry that carries the token, hex-encoded (a header token
/// cannot hold every character a token may have).
pub const TOKEN_PROTOCOL: &str = "tether-token.";

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
type BoxFuture = Pin<Box<dyn Future<Output = Result<HttpResponse, BoxError>> + Send + 'static>>;

/// What the page may do: its own script, style and WebSocket, nothing inline, no plugins,
/// and never inside another page's frame (a transparent overlay could make a user click
/// Allow, Start or Delete). `X-Frame-Options` says the last for browsers without CSP.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<HttpBody>,
) -> HttpResponse {
    http::Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-store")
        .header(header::X_CONTENT_TYPE_OPTIONS, "nosniff")
        .header(header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY)
        .header(header::X_FRAME_OPTIONS, "DENY")
        .header(header::REFERRER_POLICY, "no-referrer")
        .body(body.into())
        .expect("UNWRAP: a static response is well formed")
}

/// Whether a browser's `Origin` is the daemon's own page: `http://<Host>`, where the host
/// is an IP literal or `localhost` (a DNS name could be rebound to this address by
/// another site), or any host when a token is required anyway.
pub fn same_origin(headers: &http::HeaderMap, token_required: bool) -> bool {
    let (Some(origin), Some(host)) = (
        headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()),
        headers.get(header::HOST).and_then(|v| v.to_str().ok()),
    ) else {
        return false;
    };
    if origin != format!("http://{host}") && origin != format!("https://{host}") {
        return false;
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => host,
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    token_required || name == "localhost" || name.parse::<std::net::IpAddr>().is_ok()
}

/// The subprotocol entries a request offers.
fn offered(headers: &http::HeaderMap) -> Vec<String> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|entry| entry.trim().to_owned())
        .filter(|entry| !entry.is_empty())
        .collect()
}

fn unhex(text: &str) -> Option<String> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// Adapts a browser's upgrade request; returns whether the answer must name
/// [`SUBPROTOCOL`].
fn adapt_browser_request<B>(request: &mut HttpRequest<B>, token_required: bool) -> bool {
    let offered = offered(request.headers());
    if let Some(token) =
        offered.iter().find_map(|entry| entry.strip_prefix(TOKEN_PROTOCOL)).and_then(unhex)
        && !request.headers().contains_key(header::AUTHORIZATION)
        && let Ok(value) = HeaderValue::from_str(&format!("Bearer {token}"))
    {
        request.headers_mut().insert(header::AUTHORIZATION, value);
    }
    if same_origin(request.headers(), token_required) {
        // The access check's allowlist is for other origins; this one is the page's own.
        request.headers_mut().remove(header::ORIGIN);
    }
    offered.iter().any(|entry| entry == SUBPROTOCOL)
}

/// Serves the page and adapts browsers' upgrades (outermost layer).
#[derive(Clone)]
pub struct PagesLayer {
    token_required: bool,
}

impl PagesLayer {
    /// `token_required`: the daemon asks for a token (the page asks the user for it).
    pub fn new(token_required: bool) -> PagesLayer {
        PagesLayer { token_required }
    }
}

impl<S> tower::Layer<S> for PagesLayer {
    type Service = Pages<S>;

    fn layer(&self, inner: S) -> Pages<S> {
        Pages { inner, token_required: self.token_required }
    }
}

/// The service of [`PagesLayer`].
#[derive(Clone)]
pub struct Pages<S> {
    inner: S,
    token_required: bool,
}

impl<S, B> tower::Service<HttpRequest<B>> for Pages<S>
where
    S: tower::Service<HttpRequest<B>, Response = HttpResponse>,
    S::Error: Into<BoxError> + 'static,
    S::Future: Send + 'static,
{
    type Response = HttpResponse;
    type Error = BoxError;
    type Future = BoxFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: HttpRequest<B>) -> Self::Future {
        let upgrade = request.headers().contains_key(header::UPGRADE);
        if request.method() == Method::GET && !upgrade {
            let page = match request.uri().path() {
                "/" | "/index.html" => Some((
                    "text/html; charset=utf-8",
                    INDEX.replace(
                        "{{TOKEN_REQUIRED}}",
                        if self.token_required { "true" } else { "false" },
                    ),
                )),
                "/ui/vendor/marked.umd.js" => {
                    Some(("text/javascript; charset=utf-8", MARKED_JS.to_owned()))
                }
                "/ui/vendor/purify.min.js" => {
                    Some(("text/javascript; charset=utf-8", PURIFY_JS.to_owned()))
                }
                "/ui/app.css" => Some(("text/css; charset=utf-8", APP_CSS.to_owned())),
                path if let Some((_, module)) = MODULES.iter().find(|(at, _)| *at == path) => {
                    Some(("text/javascript; charset=utf-8", (*module).to_owned()))
                }
                // Browsers ask for `/favicon.ico` whatever the page names.
                "/ui/favicon.svg" | "/favicon.ico" => Some(("image/svg+xml", FAVICON.to_owned())),
                _ => None,
            };
            if let Some((content_type, body)) = page {
                return Box::pin(async move { Ok(respond(StatusCode::OK, content_type, body)) });
            }
        }
        let name_protocol = upgrade && adapt_browser_request(&mut request, self.token_required);
        let future = self.inner.call(request);
        Box::pin(async move {
            let mut response = future.await.map_err(Into::into)?;
            if name_protocol && response.status() == StatusCode::SWITCHING_PROTOCOLS {
                response
                    .headers_mut()
                    .insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(SUBPROTOCOL));
            }
            Ok(response)
        })
    }
}

/// Serves `GET /metrics` (inside the access check).
#[derive(Clone)]
pub struct MetricsLayer {
    supervisor: Arc<Supervisor>,
}

impl MetricsLayer {
    /// Metrics of `supervisor`.
    pub fn new(supervisor: Arc<Supervisor>) -> MetricsLayer {
        MetricsLayer { supervisor }
    }
}

impl<S> tower::Layer<S> for MetricsLayer {
    type Service = MetricsService<S>;

    fn layer(&self, inner: S) -> MetricsService<S> {
        MetricsService { inner, supervisor: Arc::clone(&self.supervisor) }
    }
}

/// The service of [`MetricsLayer`].
#[derive(Clone)]
pub struct MetricsService<S> {
    inner: S,
    supervisor: Arc<Supervisor>,
}

impl<S, B> tower::Service<HttpRequest<B>> for MetricsService<S>
where
    S: tower::Service<HttpRequest<B>, Response = HttpResponse>,
    S::Error: Into<BoxError> + 'static,
    S::Future: Send + 'static,
{
    type Response = HttpResponse;
    type Error = BoxError;
    type Future = BoxFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: HttpRequest<B>) -> Self::Future {
        if request.method() == Method::GET && request.uri().path() == "/metrics" {
            let supervisor = Arc::clone(&self.supervisor);
            return Box::pin(async move {
                Ok(match supervisor.metrics().await {
                    Ok(text) => respond(StatusCode::OK, crate::metrics::CONTENT_TYPE, text),
                    Err(err) => respond(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "text/plain; charset=utf-8",
                        err.to_string(),
                    ),
                })
            });
        }
        let future = self.inner.call(request);
        Box::pin(async move { future.await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    /// Every module the page loads or imports is served: a missing one would leave the
    /// page blank (a module graph fails whole).
    #[test]
    fn every_module_the_page_imports_is_served() {
        let served = |path: &str| MODULES.iter().any(|(at, _)| *at == path);
        assert!(INDEX.contains(r#"<script type="module" src="/ui/app.js">"#));
        for (path, source) in MODULES {
            for line in source.lines().filter(|line| line.starts_with("import ")) {
                let Some(from) = line.split(" from \"./").nth(1) else { continue };
                let module = from.trim_end_matches(['"', ';']);
                assert!(served(&format!("/ui/{module}")), "{path} imports {module}, not served");
            }
        }
    }

    #[test]
    fn only_the_pages_own_origin_on_a_literal_host_is_the_same_origin() {
        let own = headers(&[("origin", "http://127.0.0.1:7400"), ("host", "127.0.0.1:7400")]);
        assert!(same_origin(&own, false));
        let v6 = headers(&[("origin", "http://[::1]:7400"), ("host", "[::1]:7400")]);
        assert!(same_origin(&v6, false));
        let local = headers(&[("origin", "http://localhost:7400"), ("host", "localhost:7400")]);
        assert!(same_origin(&local, false));
        // Another site, or a DNS name that could be rebound to us.
        let other = headers(&[("origin", "http://evil.example"), ("host", "127.0.0.1:7400")]);
        assert!(!same_origin(&other, false));
        let rebound =
            headers(&[("origin", "http://evil.example:7400"), ("host", "evil.example:7400")]);
        assert!(!same_origin(&rebound, false));
        assert!(same_origin(&rebound, true), "a token guards it anyway");
        assert!(!same_origin(&headers(&[("host", "127.0.0.1:7400")]), false));
    }

    #[test]
    fn a_browsers_token_becomes_its_authorization() {
        let mut request = http::Request::builder()
            .header(
                "sec-websocket-protocol",
                format!(
                    "tether, {TOKEN_PROTOCOL}{}",
                    "s3cr3t t0ken".bytes().map(|b| format!("{b:02x}")).collect::<String>()
                ),
            )
            .body(())
            .unwrap();
        assert!(adapt_browser_request(&mut request, true));
        assert_eq!(request.headers()[header::AUTHORIZATION], "Bearer s3cr3t t0ken");
        let mut bad = http::Request::builder()
            .header("sec-websocket-protocol", format!("{TOKEN_PROTOCOL}zz"))
            .body(())
            .unwrap();
        assert!(!adapt_browser_request(&mut bad, true));
        assert!(!bad.headers().contains_key(header::AUTHORIZATION));
    }
}
