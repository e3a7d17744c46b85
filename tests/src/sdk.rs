//! The official Rust ACP SDK as a test's ACP client: `sdk-client` (`tests/sdk-baseline`),
//! a process of its own because that SDK pins an older ACP schema crate than Tether uses,
//! driven here over JSON lines. Every request goes through the SDK as its typed request,
//! every update is what the SDK parsed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{oneshot, watch};

use crate::{ensure_built, target_dir, within, workspace_bin};

/// The `sdk-client` binary, built into the shared target dir when a plain test run needs it
/// (`scripts/test.sh` builds it first).
pub fn sdk_client_bin() -> PathBuf {
    let target = target_dir();
    let root = target.parent().expect("UNWRAP: target/<profile> has a parent");
    let root = root.to_str().expect("UNWRAP: the target dir is UTF-8");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk-baseline/Cargo.toml");
    let manifest = manifest.to_str().expect("UNWRAP: the checkout's path is UTF-8");
    ensure_built(
        "sdk-client",
        &[env!("CARGO"), "build", "--quiet", "--manifest-path", manifest, "--target-dir", root],
        "cargo build --manifest-path tests/sdk-baseline/Cargo.toml --target-dir target",
    );
    let path = target.join("sdk-client");
    assert!(
        path.is_file(),
        "{} is missing: cargo build --manifest-path tests/sdk-baseline/Cargo.toml \
         --target-dir target (scripts/test.sh does)",
        path.display()
    );
    path
}

/// Answers by call id, taken by the caller waiting for each.
type Answers = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;

/// An ACP agent process with the SDK's client in front of it.
pub struct SdkClient {
    child: Child,
    stdin: Option<ChildStdin>,
    next_call: u64,
    answers: Answers,
    /// What the client was sent, as lines: `user: TEXT` and `agent: TEXT` (message chunks),
    /// `tool: TITLE` (tool calls), `permission: SESSION` (permission requests, each
    /// answered with its `allow_once` option).
    pub seen: watch::Receiver<Vec<String>>,
    /// Reads the client's stdout to its end.
    reader: tokio::task::JoinHandle<()>,
}

/// A call sent, its answer still to come.
pub struct Pending(oneshot::Receiver<Value>);

impl Pending {
    /// The call's result, or its error.
    pub async fn answer(self) -> Result<Value, Value> {
        let answer = within("the SDK client's answer", self.0).await.expect("sdk-client answers");
        match answer.get("error") {
            Some(error) => Err(error.clone()),
            None => Ok(answer["result"].clone()),
        }
    }
}

impl SdkClient {
    /// Starts `program` with `args` (and `env`) as the agent of an SDK client.
    pub fn spawn(program: &Path, args: &[&str], env: &[(&str, &str)]) -> SdkClient {
        let mut command = Command::new(sdk_client_bin());
        for (name, value) in env {
            command.arg("--env").arg(format!("{name}={value}"));
        }
        let mut child = command
            .arg("--")
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("sdk-client starts");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("UNWRAP: piped");
        let answers: Answers = Arc::default();
        let (seen_tx, seen) = watch::channel(Vec::new());
        let routed = Arc::clone(&answers);
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(message) = serde_json::from_str::<Value>(&line) else {
                    // Kept, so `close` fails on it (and `seen` shows it).
                    seen_tx.send_modify(|seen| seen.push(format!("unreadable: {line}")));
                    continue;
                };
                if let Some(id) = message["answer"].as_u64() {
                    let waiting = routed.lock().expect("UNWRAP: never poisoned").remove(&id);
                    if let Some(waiting) = waiting {
                        let _ = waiting.send(message);
                    }
                } else if let Some(line) = seen_line(&message) {
                    seen_tx.send_modify(|seen| seen.push(line));
                }
            }
        });
        SdkClient { child, stdin, next_call: 1, answers, seen, reader }
    }

    /// The SDK client in front of `supervisor --url URL acp ARGS…` (Tether's face).
    pub fn face(url: &str, args: &[&str]) -> SdkClient {
        let mut all = vec!["--url", url, "acp"];
        all.extend_from_slice(args);
        SdkClient::spawn(&workspace_bin("supervisor"), &all, &[])
    }

    async fn write(&mut self, message: Value) {
        let mut line = message.to_string();
        line.push('\n');
        let stdin = self.stdin.as_mut().expect("the client is open");
        stdin.write_all(line.as_bytes()).await.expect("sdk-client reads its stdin");
    }

    /// Sends the request `method`; its answer comes later.
    pub async fn start(&mut self, method: &str, params: Value) -> Pending {
        let id = self.next_call;
        self.next_call += 1;
        let (tx, rx) = oneshot::channel();
        self.answers.lock().expect("UNWRAP: never poisoned").insert(id, tx);
        self.write(json!({"call": id, "method": method, "params": params})).await;
        Pending(rx)
    }

    /// The request `method`: its result, or its error.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        self.start(method, params).await.answer().await
    }

    /// `session/cancel` of `session`.
    pub async fn cancel(&mut self, session: &str) {
        self.write(json!({"notify": "session/cancel", "params": {"sessionId": session}})).await;
    }

    /// Waits until what the client saw satisfies `done`; returns it.
    pub async fn saw(&mut self, what: &str, done: impl FnMut(&Vec<String>) -> bool) -> Vec<String> {
        within(what, self.seen.wait_for(done)).await.expect("the client is alive").clone()
    }

    /// Closes the client (its agent's stdin with it), waits for it to exit cleanly and for
    /// everything it wrote to be read; returns what it saw.
    pub async fn close(mut self) -> Vec<String> {
        drop(self.stdin.take());
        let status = within("sdk-client to exit", self.child.wait()).await.expect("it exits");
        assert!(status.success(), "sdk-client failed: {status}");
        within("sdk-client's output read to its end", &mut self.reader)
            .await
            .expect("the reader task ends");
        let seen = self.seen.borrow().clone();
        assert!(!seen.iter().any(|line| line.starts_with("unreadable: ")), "{seen:?}");
        seen
    }
}

/// A text prompt's `session/prompt` params.
pub fn prompt(session: &str, text: &str) -> Value {
    json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]})
}

/// The line [`SdkClient::seen`] keeps for a message from the client, if any.
fn seen_line(message: &Value) -> Option<String> {
    if let Some(permission) = message.get("permission") {
        return Some(format!("permission: {}", permission["sessionId"].as_str()?));
    }
    let update = &message.get("update")?["update"];
    let text = || update["content"]["text"].as_str().map(str::to_owned);
    match update["sessionUpdate"].as_str()? {
        "user_message_chunk" => Some(format!("user: {}", text()?)),
        "agent_message_chunk" => Some(format!("agent: {}", text()?)),
        "tool_call" => Some(format!("tool: {}", update["title"].as_str()?)),
        _ => None,
    }
}
