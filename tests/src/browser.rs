//! A real browser for the UI tests: Debian's `chromium`, headless, driven through
//! `chromedriver` over the W3C WebDriver protocol (a few JSON calls over HTTP on
//! loopback), plus a plain HTTP GET for `/metrics`.
//!
//! Waiting is awaiting: [`Browser::wait_text`] runs an asynchronous script in the page
//! that resolves when a `MutationObserver` sees the text appear — nothing polls.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use crate::within;

/// The WebDriver id key of an element.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A plain HTTP/1.1 exchange on loopback: `(status, headers, body)`.
pub async fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> (u16, Vec<(String, String)>, String) {
    let mut stream = within("an HTTP connection", TcpStream::connect(addr)).await.expect("connect");
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        request.push_str("Content-Type: application/json\r\n");
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(&body);
    stream.write_all(request.as_bytes()).await.expect("send");
    // The head, then `Content-Length` bytes (chromedriver keeps the connection open after
    // its answer, `Connection: close` or not); to the end when no length is given.
    let raw = within("an HTTP answer", read_answer(&mut stream)).await;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let chunked = headers.iter().any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked { dechunk(rest) } else { rest.to_owned() };
    (status, headers, body)
}

async fn read_answer(stream: &mut TcpStream) -> Vec<u8> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = stream.read(&mut buf).await.expect("read");
        if n == 0 {
            return raw;
        }
        raw.extend_from_slice(&buf[..n]);
        let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
        let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
        let length = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|value| value.trim().parse::<usize>().ok());
        if let Some(length) = length {
            while raw.len() < end + 4 + length {
                let n = stream.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                raw.extend_from_slice(&buf[..n]);
            }
            return raw;
        }
        let mut rest = Vec::new();
        stream.read_to_end(&mut rest).await.expect("read");
        raw.extend_from_slice(&rest);
        return raw;
    }
}

fn dechunk(mut rest: &str) -> String {
    let mut body = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else { break };
        if size == 0 || after.len() < size {
            break;
        }
        body.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    body
}

/// Whether the browser and its driver are installed (`scripts/setup.sh` installs them).
pub fn available() -> bool {
    Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists()
}

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Skips a UI test (returns `None`) when no browser is installed, unless CI demands one
/// (`REQUIRE_DOCKER=1`, which demands every real part).
pub async fn start(name: &str) -> Option<Browser> {
    if !available() {
        assert!(
            !crate::docker::docker_required(),
            "REQUIRE_DOCKER=1 but chromium and chromium-driver are not installed (scripts/setup.sh installs them)"
        );
        eprintln!("skipped: no chromium/chromedriver (scripts/setup.sh installs them)");
        return None;
    }
    Some(Browser::start(name).await)
}

/// A headless chromium session, closed (with its driver) when dropped.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    name: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn start(name: &str) -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        // The driver and the browser both name the profile's directory (the driver in its
        // log's path): a test that dies without dropping this leaves them to the reaper.
        let profile = tempfile::tempdir().unwrap();
        crate::reap::own(profile.path());
        let mut driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .arg(format!("--log-path={}", profile.path().join("chromedriver.log").display()))
            .arg("--log-level=SEVERE")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        // Its ready line.
        let mut lines = BufReader::new(driver.stdout.take().unwrap()).lines();
        loop {
            let line = within("chromedriver's ready line", lines.next_line()).await.unwrap();
            match line {
                Some(line) if line.contains("started successfully") => break,
                Some(_) => continue,
                None => panic!("chromedriver exited before it was ready"),
            }
        }
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let base = format!("127.0.0.1:{port}");
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,900", format!("--user-data-dir={}", profile.path().display())],
            },
        }}});
        let (_, _, body) = http(&base, "POST", "/session", &[], Some(&capabilities)).await;
        let answer: Value = serde_json::from_str(&body).expect(&body);
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {body}"))
            .to_owned();
        let browser = Browser { driver, base, session, name: name.to_owned(), _profile: profile };
        browser.command("POST", "timeouts", json!({"script": 20_000, "pageLoad": 20_000})).await;
        browser
    }

    async fn command(&self, method: &str, path: &str, body: Value) -> Value {
        let path = format!("/session/{}/{path}", self.session);
        let body = (method == "POST").then_some(body);
        let (status, _, text) = http(&self.base, method, &path, &[], body.as_ref()).await;
        let answer: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        assert!(status == 200, "WebDriver {method} {path}: {status} {text}");
        answer["value"].clone()
    }

    /// Opens `url`.
    pub async fn open(&self, url: &str) {
        self.command("POST", "url", json!({"url": url})).await;
    }

    async fn element(&self, css: &str) -> String {
        let found =
            self.command("POST", "element", json!({"using": "css selector", "value": css})).await;
        found[ELEMENT].as_str().unwrap_or_else(|| panic!("no element {css}: {found}")).to_owned()
    }

    /// Clicks the first element matching `css`.
    pub async fn click(&self, css: &str) {
        let id = self.element(css).await;
        self.command("POST", &format!("element/{id}/click"), json!({})).await;
    }

    /// Drags the first element matching `from` with the mouse and lets go just above the
    /// middle of the first element matching `to`: WebDriver actions, so the page gets real
    /// pointer events.
    pub async fn drag(&self, from: &str, to: &str) {
        let origin = |id: String| {
            let mut reference = serde_json::Map::new();
            reference.insert(ELEMENT.to_owned(), Value::String(id));
            Value::Object(reference)
        };
        let (from, to) = (origin(self.element(from).await), origin(self.element(to).await));
        let steps = json!([
            {"type": "pointerMove", "origin": from, "x": 0, "y": 0},
            {"type": "pointerDown", "button": 0},
            {"type": "pointerMove", "origin": to, "x": 0, "y": -4, "duration": 150},
            {"type": "pointerUp", "button": 0},
        ]);
        let mouse = json!({"type": "pointer", "id": "mouse",
            "parameters": {"pointerType": "mouse"}, "actions": steps});
        self.command("POST", "actions", json!({"actions": [mouse]})).await;
        self.command("DELETE", "actions", Value::Null).await;
    }

    /// Presses `key` (a character, or a WebDriver key code) wherever the focus is: real
    /// key events, as a person's.
    pub async fn press(&self, key: &str) {
        let keys = json!([{"type": "keyDown", "value": key}, {"type": "keyUp", "value": key}]);
        let keyboard = json!({"type": "key", "id": "keyboard", "actions": keys});
        self.command("POST", "actions", json!({"actions": [keyboard]})).await;
        self.command("DELETE", "actions", Value::Null).await;
    }

    /// Types `text` into the first element matching `css`.
    pub async fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css).await;
        self.command("POST", &format!("element/{id}/clear"), json!({})).await;
        self.command("POST", &format!("element/{id}/value"), json!({"text": text})).await;
    }

    /// Types `text` into the first element matching `css`, after what it holds.
    pub async fn type_into_more(&self, css: &str, text: &str) {
        let id = self.element(css).await;
        self.command("POST", &format!("element/{id}/value"), json!({"text": text})).await;
    }

    /// Runs the next commands in the page's `index`th frame (`None`: the top page again).
    pub async fn switch_to_frame(&self, index: Option<u32>) {
        match index {
            Some(index) => self.command("POST", "frame", json!({"id": index})).await,
            None => self.command("POST", "frame", json!({"id": null})).await,
        };
    }

    /// Runs an asynchronous script in the page (it calls its last argument with the
    /// result; the WebDriver script timeout bounds it); its result.
    pub async fn run_async(&self, script: &str, args: Value) -> Value {
        self.command("POST", "execute/async", json!({"script": script, "args": args})).await
    }

    /// Sets the window's size (a phone's 390×844, a desktop's 1440×900).
    pub async fn set_window(&self, width: u32, height: u32) {
        self.command("POST", "window/rect", json!({"width": width, "height": height})).await;
    }

    /// Emulates the system's colour scheme (`"dark"`, `"light"`) through the DevTools
    /// protocol, as `prefers-color-scheme` media queries see it.
    pub async fn color_scheme(&self, scheme: &str) {
        let params = json!({"features": [{"name": "prefers-color-scheme", "value": scheme}]});
        let body = json!({"cmd": "Emulation.setEmulatedMedia", "params": params});
        self.command("POST", "goog/cdp/execute", body).await;
    }

    /// Runs a script in the page; its result.
    pub async fn run(&self, script: &str, args: Value) -> Value {
        self.command("POST", "execute/sync", json!({"script": script, "args": args})).await
    }

    /// Sets a form field's value directly (a select or a multi-line prompt).
    pub async fn set_value(&self, css: &str, value: &str) {
        let script = "const node = document.querySelector(arguments[0]); node.value = arguments[1]; \
                      node.dispatchEvent(new Event('change')); return node.value;";
        let set = self.run(script, json!([css, value])).await;
        assert_eq!(set, value, "{css} took the value");
    }

    /// Awaits the first element matching `css` whose text contains `text` (a
    /// `MutationObserver` in the page; the WebDriver script timeout bounds it). Returns
    /// its text.
    pub async fn wait_text(&self, css: &str, text: &str) -> String {
        let script = "const [css, text, done] = arguments; \
            const check = () => { for (const node of document.querySelectorAll(css)) { \
              if (!node.closest('[hidden]') && node.textContent.includes(text)) return node.textContent; } return null; }; \
            const found = check(); if (found !== null) { done(found); return; } \
            const observer = new MutationObserver(() => { const now = check(); \
              if (now !== null) { observer.disconnect(); done(now); } }); \
            observer.observe(document.documentElement, {subtree: true, childList: true, characterData: true, attributes: true});";
        let path = format!("/session/{}/execute/async", self.session);
        let body = json!({"script": script, "args": [css, text]});
        let (status, _, answer) = http(&self.base, "POST", &path, &[], Some(&body)).await;
        if status != 200 {
            let shot = self.screenshot("timeout").await;
            panic!(
                "waiting for {text:?} in {css}: {status} {answer} (screenshot {})",
                shot.display()
            );
        }
        let answer: Value = serde_json::from_str(&answer).unwrap();
        answer["value"].as_str().unwrap_or_default().to_owned()
    }

    /// The text of every element matching `css`.
    pub async fn texts(&self, css: &str) -> Vec<String> {
        let script =
            "return Array.from(document.querySelectorAll(arguments[0]), n => n.textContent);";
        let value = self.run(script, json!([css])).await;
        value
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// The serious and critical accessibility violations axe-core finds in the page as it
    /// is, one line each (the rule, its help, the first elements); `None` when axe-core is
    /// not installed (`scripts/setup.sh` installs it) and CI does not demand it.
    pub async fn accessibility_violations(&self) -> Option<Vec<String>> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../.tools/npm/node_modules/axe-core/axe.min.js");
        let Ok(axe) = std::fs::read_to_string(&path) else {
            assert!(
                !crate::docker::docker_required(),
                "REQUIRE_DOCKER=1 but axe-core is not installed in .tools/npm (scripts/setup.sh installs it)"
            );
            eprintln!("skipped: no axe-core in .tools/npm (scripts/setup.sh installs it)");
            return None;
        };
        // WebDriver's scripts are not the page's: its CSP does not apply to them.
        self.run(&format!("{axe}\nreturn true;"), json!([])).await;
        let script = "const done = arguments[arguments.length - 1]; \
            axe.run(document, {resultTypes: ['violations']}).then((result) => done(result.violations \
              .filter((v) => v.impact === 'serious' || v.impact === 'critical') \
              .map((v) => `${v.id} (${v.impact}): ${v.help}: ${v.nodes.slice(0, 4).map((n) => n.target.join(' ')).join(', ')}`)));";
        let found = self.run_async(script, json!([])).await;
        Some(found.as_array()?.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
    }

    /// Saves a screenshot as a test artifact (`target/ui-screenshots/<test>-<step>.png`);
    /// returns its path.
    pub async fn screenshot(&self, step: &str) -> PathBuf {
        let encoded = self.command("GET", "screenshot", Value::Null).await;
        let png = decode_base64(encoded.as_str().unwrap_or_default());
        let dir = crate::target_dir()
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
            .join("ui-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}-{step}.png", self.name));
        std::fs::write(&path, png).unwrap();
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The driver is killed, and so is every browser process of this profile (a killed
        // driver does not take its browser with it).
        let _ = self.driver.start_kill();
        for pid in crate::daemon::Daemon::processes_mentioning(self._profile.path()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Standard base64 (what WebDriver screenshots are).
fn decode_base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let digits: Vec<u8> = text.bytes().filter_map(value).collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n =
            chunk.iter().enumerate().fold(0u32, |n, (i, d)| n | (u32::from(*d) << (18 - 6 * i)));
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..chunk.len().saturating_sub(1)]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes() {
        assert_eq!(decode_base64("aGVsbG8="), b"hello");
        assert_eq!(decode_base64("aGk="), b"hi");
        assert_eq!(decode_base64("YWJj"), b"abc");
    }
}
