//! The egress proxy: its request heads read, and its decisions over loopback, against
//! "outside" servers these tests run.

use super::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{TcpListener, UnixStream};

/// A proxy for `allow` on a socket in a directory of its own (kept with it).
fn proxy(
    allow: &[String],
    refused: mpsc::UnboundedSender<Refusal>,
) -> (EgressProxy, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let list = Allowlist::parse(allow).unwrap();
    (EgressProxy::start(&dir.path().join("egress.sock"), list, refused).unwrap(), dir)
}

#[test]
fn a_connect_names_its_tunnels_target() {
    let request =
        parse_head(b"CONNECT API.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n");
    let request = request.unwrap();
    assert_eq!(request.target, Target::parse("api.example.com:443").unwrap());
    assert_eq!(request.kind, RequestKind::Tunnel);
}

#[test]
fn a_plain_request_goes_on_in_origin_form_one_per_connection() {
    let head = b"GET http://localhost:8080/v1/models?x=1 HTTP/1.1\r\nHost: localhost:8080\r\n\
        Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\nConnection: keep-alive\r\n\
        Accept: */*\r\n\r\n";
    let request = parse_head(head).unwrap();
    assert_eq!(request.target, Target::parse("localhost:8080").unwrap());
    let RequestKind::Forward(sent) = request.kind else { panic!("a forward") };
    assert_eq!(
        String::from_utf8(sent).unwrap(),
        "GET /v1/models?x=1 HTTP/1.1\r\nHost: localhost:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    let request = parse_head(b"POST http://example.org HTTP/1.0\r\n\r\n").unwrap();
    assert_eq!(request.target, Target::parse("example.org:80").unwrap(), "port 80 by default");
    let RequestKind::Forward(sent) = request.kind else { panic!("a forward") };
    assert!(String::from_utf8(sent).unwrap().starts_with("POST / HTTP/1.0\r\n"));
}

#[test]
fn what_is_not_a_proxy_request_is_refused_saying_why() {
    let cases: [(&[u8], &str); 6] = [
        (b"GET /index.html HTTP/1.1\r\n\r\n", "names its target"),
        (b"GET https://example.org/ HTTP/1.1\r\n\r\n", "use CONNECT for https"),
        (b"CONNECT example.org HTTP/1.1\r\n\r\n", "no port"),
        (b"HELLO\r\n\r\n", "not an HTTP/1 request"),
        (b"GET http://example.org/ SPDY/3\r\n\r\n", "not an HTTP/1 request"),
        (b"\xff\xfe\r\n\r\n", "not UTF-8"),
    ];
    for (head, why) in cases {
        let err = parse_head(head).unwrap_err();
        assert!(err.to_string().contains(why), "{:?}: {err}", String::from_utf8_lossy(head));
    }
}

/// An "outside" server on loopback that echoes what it reads; its port.
async fn echo_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut read, mut write) = stream.split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
            });
        }
    });
    port
}

/// Sends `head` to the proxy; the connection and the status line of its answer.
async fn ask(proxy: &EgressProxy, head: &str) -> (BufReader<UnixStream>, String) {
    let mut stream = UnixStream::connect(proxy.socket()).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    reader.read_line(&mut status).await.unwrap();
    (reader, status)
}

/// The rest of an answer's head and its body, read to the end.
async fn rest_of(mut reader: BufReader<UnixStream>) -> String {
    let mut rest = String::new();
    reader.read_to_string(&mut rest).await.unwrap();
    rest
}

#[tokio::test]
async fn an_allowed_target_is_tunnelled_and_its_name_resolved_by_the_proxy() {
    let port = echo_server().await;
    let (refused, mut refusals) = mpsc::unbounded_channel();
    let (proxy, _dir) = proxy(&[format!("localhost:{port}")], refused);
    let (mut reader, status) =
        ask(&proxy, &format!("CONNECT localhost:{port} HTTP/1.1\r\n\r\nearly")).await;
    assert_eq!(status, "HTTP/1.1 200 Connection established\r\n");
    let mut blank = String::new();
    reader.read_line(&mut blank).await.unwrap();
    assert_eq!(blank, "\r\n");
    // What came with the head goes through first, then the tunnel carries both ways.
    reader.get_mut().write_all(b" and later\n").await.unwrap();
    let mut echoed = String::new();
    reader.read_line(&mut echoed).await.unwrap();
    assert_eq!(echoed, "early and later\n");
    assert!(refusals.try_recv().is_err(), "nothing refused");
}

#[tokio::test]
async fn a_target_not_on_the_list_is_refused_and_reported() {
    let allowed = echo_server().await;
    let other = echo_server().await;
    let (refused, mut refusals) = mpsc::unbounded_channel();
    let (proxy, _dir) = proxy(&[format!("127.0.0.1:{allowed}")], refused);
    for head in [
        format!("CONNECT 127.0.0.1:{other} HTTP/1.1\r\n\r\n"),
        // A name is not matched by its address.
        format!("GET http://localhost:{allowed}/ HTTP/1.1\r\n\r\n"),
    ] {
        let (reader, status) = ask(&proxy, &head).await;
        assert_eq!(status, "HTTP/1.1 403 Forbidden\r\n", "{head}");
        assert!(rest_of(reader).await.contains("is not on this session's egress allowlist"));
    }
    let first = refusals.recv().await.unwrap();
    assert_eq!(first.target, format!("127.0.0.1:{other}"));
    assert!(first.reason.contains("not on this session's egress allowlist"), "{first:?}");
    assert_eq!(refusals.recv().await.unwrap().target, format!("localhost:{allowed}"));
}

#[tokio::test]
async fn a_plain_http_request_is_forwarded_and_its_answer_comes_back() {
    // An "outside" HTTP server that answers with the request line it got.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).await.unwrap();
        let body = line.trim_end().to_owned();
        let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        reader.get_mut().write_all(answer.as_bytes()).await.unwrap();
    });
    let (refused, _refusals) = mpsc::unbounded_channel();
    let (proxy, _dir) = proxy(&[format!("127.0.0.1:{port}")], refused);
    let head =
        format!("GET http://127.0.0.1:{port}/models HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    let (reader, status) = ask(&proxy, &head).await;
    assert_eq!(status, "HTTP/1.1 200 OK\r\n");
    assert!(rest_of(reader).await.ends_with("GET /models HTTP/1.1"));
}

#[tokio::test]
async fn a_bad_request_or_an_unreachable_target_is_answered_saying_why() {
    let (refused, mut refusals) = mpsc::unbounded_channel();
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap().port()
    }; // nothing listens there any more
    let allow = [format!("127.0.0.1:{closed}"), "no-such-host.invalid:443".into()];
    let (proxy, _dir) = proxy(&allow, refused);
    let (reader, status) = ask(&proxy, "GET /index.html HTTP/1.1\r\n\r\n").await;
    assert_eq!(status, "HTTP/1.1 400 Bad Request\r\n");
    assert!(rest_of(reader).await.contains("names its target"));
    let (reader, status) =
        ask(&proxy, &format!("CONNECT 127.0.0.1:{closed} HTTP/1.1\r\n\r\n")).await;
    assert_eq!(status, "HTTP/1.1 502 Bad Gateway\r\n");
    assert!(rest_of(reader).await.contains("cannot connect to 127.0.0.1"));
    let (reader, status) = ask(&proxy, "CONNECT no-such-host.invalid:443 HTTP/1.1\r\n\r\n").await;
    assert_eq!(status, "HTTP/1.1 502 Bad Gateway\r\n");
    assert!(rest_of(reader).await.contains("cannot resolve no-such-host.invalid:443"));
    assert!(refusals.try_recv().is_err(), "allowed, only unreachable: no refusal");
}

#[tokio::test]
async fn a_stopped_proxy_listens_no_more_and_a_stale_socket_is_replaced() {
    let (refused, _refusals) = mpsc::unbounded_channel();
    let (proxy, dir) = proxy(&[], refused.clone());
    let socket = proxy.socket().to_owned();
    proxy.stop().await;
    assert!(UnixStream::connect(&socket).await.is_err(), "nothing listens any more");
    // The socket file a stopped (or killed) sidecar left is replaced by the next one's.
    let again = EgressProxy::start(&socket, Allowlist::default(), refused).unwrap();
    let (_, status) = ask(&again, "CONNECT example.org:443 HTTP/1.1\r\n\r\n").await;
    assert_eq!(status, "HTTP/1.1 403 Forbidden\r\n");
    drop(dir);
}
