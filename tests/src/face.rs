//! A raw ACP client of `supervisor acp`: JSON lines both ways, every line kept so a test
//! can check the whole transcript against the vendored ACP schema.

use std::path::Path;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::schema::{AcpSchema, Checked};
use crate::{within, workspace_bin};

/// The face as a child process, and what went each way.
pub struct RawFace {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    /// Every line sent to the face.
    pub sent: Vec<Vec<u8>>,
    /// Every line received from it.
    pub received: Vec<Vec<u8>>,
}

impl RawFace {
    /// `supervisor --url URL acp ARGS…` (`supervisor` from the workspace's target dir, or
    /// `program`).
    pub fn spawn(program: Option<&Path>, url: &str, args: &[&str]) -> RawFace {
        let program = program.map(Path::to_path_buf).unwrap_or_else(|| workspace_bin("supervisor"));
        let mut child = tokio::process::Command::new(program)
            .args(["--url", url, "acp"])
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("the face starts");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("UNWRAP: piped");
        RawFace {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            sent: Vec::new(),
            received: Vec::new(),
        }
    }

    /// Sends one message.
    pub async fn send(&mut self, message: Value) {
        self.sent.push(message.to_string().into_bytes());
        let stdin = self.stdin.as_mut().expect("stdin is open");
        stdin.write_all(format!("{message}\n").as_bytes()).await.expect("the face reads");
    }

    /// The next message (bounded by [`within`]).
    pub async fn next(&mut self) -> Value {
        let line = within("the face's lines", self.lines.next_line())
            .await
            .expect("the face's stdout")
            .expect("a line from the face");
        self.received.push(line.clone().into_bytes());
        serde_json::from_str(&line).expect("the face writes JSON lines")
    }

    /// Reads until a message matches `wanted`; returns it.
    pub async fn until(&mut self, wanted: impl Fn(&Value) -> bool) -> Value {
        loop {
            let message = self.next().await;
            if wanted(&message) {
                return message;
            }
        }
    }

    /// The first message matching `wanted` among those read already (an earlier
    /// [`RawFace::until`] read past it), else the next one to match: for messages whose
    /// order between themselves is not promised.
    pub async fn seen_or_until(&mut self, wanted: impl Fn(&Value) -> bool) -> Value {
        let seen = self.received.iter().find_map(|line| {
            serde_json::from_slice::<Value>(line).ok().filter(|message| wanted(message))
        });
        match seen {
            Some(message) => message,
            None => self.until(wanted).await,
        }
    }

    /// Sends a request and returns its answer (the whole response).
    pub async fn request(&mut self, id: Value, method: &str, params: Value) -> Value {
        self.send(serde_json::json!({"jsonrpc": "2.0", "id": id.clone(), "method": method, "params": params}))
            .await;
        self.until(|message| message["id"] == id && message.get("method").is_none()).await
    }

    /// `initialize`, answered.
    pub async fn initialize(&mut self) -> Value {
        self.request(0.into(), "initialize", serde_json::json!({"protocolVersion": 1})).await
    }

    /// Every line so far checked against the vendored ACP schema (what was checked), or
    /// the errors.
    pub fn check_schema(&self) -> Result<Vec<Checked>, Vec<String>> {
        AcpSchema::load().check_transcript(&self.sent, &self.received)
    }

    /// Closes its stdin and waits for it to exit.
    pub async fn close(mut self) {
        drop(self.stdin.take());
        let _ = within("the face to exit", self.child.wait()).await;
    }
}
