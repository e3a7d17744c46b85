//! Helpers for agentctl tests: a launched sidecar that is SIGKILLed on drop (its guard then
//! takes the agent's group with it), and an ACP conversation driven through the control
//! channel.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentctl::client::{self, ControlClient, EventStream, LaunchConfig, Launched};
use protocol::control::{Event, EventKind, StartAgent};
use serde_json::{Value, json};

use crate::{within, workspace_bin};

/// A running agentctl with its own state dir and workspace.
pub struct Sidecar {
    /// What it announced.
    pub launched: Launched,
    /// Its bearer token.
    pub token: String,
    /// Its state dir (spool, ready.json, log).
    pub state_dir: PathBuf,
    /// A workspace directory for the agent.
    pub workspace: tempfile::TempDir,
    _state: tempfile::TempDir,
}

impl Sidecar {
    /// Launches agentctl the way the supervisor will (detached, token in the environment).
    pub async fn launch(extra_args: &[&str]) -> Sidecar {
        let state = tempfile::tempdir().expect("a temp dir");
        let state_dir = state.path().join("agentctl");
        let token = client::new_token();
        let config = LaunchConfig {
            program: workspace_bin("agentctl"),
            prefix_args: Vec::new(),
            state_dir: state_dir.clone(),
            listen: client::ControlAddr::Tcp(
                "127.0.0.1:0".parse().expect("UNWRAP: a literal address"),
            ),
            token: token.clone(),
            ready_timeout: Duration::from_secs(30),
            extra_args: extra_args.iter().map(|arg| arg.to_string()).collect(),
            cgroup: None,
        };
        let launched = client::launch(&config).await.expect("agentctl launches");
        Sidecar {
            launched,
            token,
            state_dir,
            workspace: tempfile::tempdir().expect("a temp dir"),
            _state: state,
        }
    }

    /// agentctl's pid.
    pub fn pid(&self) -> u32 {
        self.launched.ready.pid
    }

    /// The control address.
    pub fn addr(&self) -> client::ControlAddr {
        self.launched.addr.clone()
    }

    /// A new control connection.
    pub async fn client(&self) -> ControlClient {
        within("connecting to agentctl", ControlClient::connect(self.addr(), &self.token))
            .await
            .expect("connects")
    }

    /// Starts `mock-agent` with `args` in the workspace; returns its pid.
    pub async fn start_mock(&self, args: &[&str]) -> u32 {
        let start = StartAgent {
            command: workspace_bin("mock-agent").to_string_lossy().into_owned(),
            args: args.iter().map(|arg| arg.to_string()).collect(),
            env: Default::default(),
            cwd: self.workspace.path().to_owned(),
            extra_roots: Vec::new(),
            user: None,
            owned_dirs: Vec::new(),
            egress: None,
            isolate_network: false,
        };
        within("agent.start", self.client().await.start_agent(&start))
            .await
            .expect("the agent starts")
            .pid
    }

    /// A conversation over a fresh connection, reading events after `after_seq`.
    pub async fn conversation(&self, after_seq: u64) -> Conversation {
        Conversation {
            calls: self.client().await,
            events: self.client().await.events(after_seq),
            seen: Vec::new(),
        }
    }

    /// Bytes in the spool directory.
    pub fn spool_bytes(&self) -> u64 {
        std::fs::read_dir(self.state_dir.join("spool"))
            .expect("the spool dir exists")
            .map(|entry| entry.expect("an entry").metadata().expect("metadata").len())
            .sum()
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    }
}

/// Drives ACP through agentctl: requests go out with `acp.send`, everything comes back as
/// events, which are all kept in `seen`.
pub struct Conversation {
    /// For calls.
    pub calls: ControlClient,
    /// The event stream.
    pub events: EventStream,
    /// Every event read so far.
    pub seen: Vec<Event>,
}

/// The ACP message of an `acp` event.
pub fn acp_message(event: &Event) -> Option<Value> {
    event.kind.acp_value()
}

impl Conversation {
    /// The next event.
    pub async fn next(&mut self) -> Event {
        let event = within("the next agentctl event", self.events.next()).await.expect("an event");
        self.seen.push(event.clone());
        event
    }

    /// Reads events until `pred` holds; returns that event.
    pub async fn until(&mut self, mut pred: impl FnMut(&Event) -> bool) -> Event {
        loop {
            let event = self.next().await;
            if pred(&event) {
                return event;
            }
        }
    }

    /// Sends a request and reads events until its response; agent→client requests met on
    /// the way (other than those agentctl answered itself) are answered by `on_request`.
    pub async fn request(
        &mut self,
        id: i64,
        method: &str,
        params: Value,
        mut on_request: impl FnMut(&Value) -> Value,
    ) -> Value {
        self.calls
            .send_acp(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await
            .expect("acp.send");
        loop {
            let event = self.next().await;
            let EventKind::Acp { answered, .. } = &event.kind else { continue };
            let message = &event.kind.acp_value().expect("agentctl relays JSON");
            if message.get("method").is_some() && message.get("id").is_some() && answered.is_none()
            {
                let result = on_request(message);
                let reply = json!({"jsonrpc": "2.0", "id": message["id"], "result": result});
                self.calls.send_acp(&reply).await.expect("acp.send of a reply");
                continue;
            }
            if message.get("method").is_none() && message["id"] == json!(id) {
                return message.clone();
            }
        }
    }

    /// `initialize` then `session/new` in `cwd`; returns the session id.
    pub async fn open_session(&mut self, cwd: &Path) -> String {
        let init = self
            .request(1, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": true, "writeTextFile": true}}}), refuse)
            .await;
        assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
        let session =
            self.request(2, "session/new", json!({"cwd": cwd, "mcpServers": []}), refuse).await;
        session["result"]["sessionId"].as_str().expect("a session id").to_owned()
    }

    /// The texts of the `agent_message_chunk` updates seen so far.
    pub fn chunks(&self) -> Vec<String> {
        self.seen
            .iter()
            .filter_map(acp_message)
            .filter(|message| message["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
            .filter_map(|message| {
                message["params"]["update"]["content"]["text"].as_str().map(str::to_owned)
            })
            .collect()
    }
}

/// An `on_request` for conversations that expect no agent requests.
pub fn refuse(request: &Value) -> Value {
    panic!("unexpected agent request: {request}")
}

/// A prompt request's params.
pub fn prompt(session_id: &str, text: &str) -> Value {
    json!({"sessionId": session_id, "prompt": [{"type": "text", "text": text}]})
}
