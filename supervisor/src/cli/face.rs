//! `supervisor acp`: Tether as an ACP agent on stdin/stdout. An ACP client (an editor)
//! launches it like any agent; each ACP session it opens is a Tether session of the chosen
//! profile, run by the daemon, so it outlives the client and is the same session the CLI
//! and the web page show.
//!
//! - `initialize` is answered here; `session/new` creates a task and a session on `cwd` and
//!   answers with the Tether session's id once its agent is ready.
//! - `session/prompt` starts a turn (`task.session.prompt`) and answers with its
//!   `stopReason` when the session's event stream ends it; every update on the way is sent
//!   as `session/update` (the agent's own, under the Tether session's id).
//! - `session/cancel` cancels the turn; the agent's `session/request_permission` goes to
//!   the client, and its answer back through the daemon (which keeps the question across
//!   a restart).
//! - A daemon that restarts is followed: the stream resubscribes after its last event.
//! - With no daemon at a loopback address, the face starts one there (`start_daemon`),
//!   detached, its log in the data directory's `daemon.log`.

mod config;

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

use self::config::Draft;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::{
    ApiClient, Arc, Client, Duration, ErrorKind, EventKind, Exit, Failure, Feed, HashMap, Home,
    OsString, Path, SessionEvent, SessionState, Shown, SocketAddr, Target, TurnState, WsClient,
    client,
};

/// The most bytes the face gathers for one write to the client.
const WRITE_BATCH: usize = 256 * 1024;

/// JSON-RPC error codes the face answers with.
const INVALID_PARAMS: i64 = -32602;
const METHOD_NOT_FOUND: i64 = -32601;
const INTERNAL_ERROR: i64 = -32603;
/// ACP's (and LSP's) "request cancelled".
const REQUEST_CANCELLED: i64 = -32800;

/// A failed request: its JSON-RPC error.
#[derive(Debug)]
struct RpcFailure {
    code: i64,
    message: String,
}

impl RpcFailure {
    fn params(message: impl Into<String>) -> RpcFailure {
        RpcFailure { code: INVALID_PARAMS, message: message.into() }
    }

    fn internal(message: impl Into<String>) -> RpcFailure {
        RpcFailure { code: INTERNAL_ERROR, message: message.into() }
    }
}

impl From<Failure> for RpcFailure {
    fn from(failure: Failure) -> RpcFailure {
        RpcFailure::internal(failure.line.trim_start_matches("error: ").to_owned())
    }
}

/// How a turn ended, as the face answers its `session/prompt`.
type TurnEnd = Result<String, RpcFailure>;

/// A session the client opened (or that another of its requests named).
#[derive(Default)]
struct Turns {
    /// Prompts waiting for their turn's end, by turn id.
    waiting: HashMap<String, oneshot::Sender<TurnEnd>>,
    /// Turns that ended before their prompt's call answered.
    ended: HashMap<String, TurnEnd>,
    /// Prompts queued behind a running turn, waiting for the turn their queued prompt
    /// becomes, by prompt id.
    queued: HashMap<String, oneshot::Sender<TurnEnd>>,
    /// Turns started from a queued prompt before that prompt's call answered: prompt id →
    /// turn id.
    started: HashMap<String, String>,
    /// `session/cancel`s received: a prompt whose turn started after one arrived is
    /// cancelled then (the cancel reached the daemon before the turn did).
    cancels: u64,
    /// Ends the session's follower (`session/close`).
    stop: tokio_util::sync::CancellationToken,
}

/// The face: the daemon's client, the client's stdout, and the requests in flight.
struct Face {
    /// The daemon's address (to reconnect to, and to name in errors).
    target: Target,
    /// The daemon's connection for calls, opened again after a restart.
    api: tokio::sync::Mutex<Arc<WsClient>>,
    /// Where reconnects are said (stderr).
    shown: Shown,
    agent: Option<String>,
    /// Lines for the client (serialized by their sender, written by one task).
    out: mpsc::UnboundedSender<String>,
    next_id: AtomicI64,
    /// Our requests to the ACP client, by id.
    asked: Mutex<HashMap<i64, oneshot::Sender<Value>>>,
    /// The agent's questions asked of the client and not answered yet: Tether's request id
    /// → ours. Answered elsewhere first (the page, another client), ours is withdrawn.
    questions: Mutex<HashMap<String, i64>>,
    /// Per session: the turns its prompts wait for.
    sessions: Mutex<HashMap<String, Arc<Mutex<Turns>>>>,
    /// The client advertised `elicitation` at `initialize`.
    elicits: std::sync::atomic::AtomicBool,
    /// Sessions answered but not created yet (no `--agent`: the first prompt creates them
    /// with the agent chosen meanwhile).
    drafts: Mutex<HashMap<String, Draft>>,
    /// The client's requests not yet answered, by id (as JSON text).
    requests: Mutex<HashMap<String, Inflight>>,
}

/// A client's request being handled.
struct Inflight {
    /// A `session/prompt`'s session: cancelling it cancels the turn, which answers it.
    prompt_of: Option<String>,
    task: tokio::task::AbortHandle,
}

/// Runs the face until the client closes stdin.
pub(super) async fn serve_acp(client: Client, agent: Option<String>) -> Result<(), Failure> {
    let (out, mut lines) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        let mut buffer = Vec::new();
        while let Some(message) = lines.recv().await {
            // What is queued goes in one write (a fast stream is not a syscall a line).
            let mut next = Some(message);
            while let Some(message) = next {
                buffer.extend_from_slice(message.as_bytes());
                buffer.push(b'\n');
                next = if buffer.len() < WRITE_BATCH { lines.try_recv().ok() } else { None };
            }
            if stdout.write_all(&buffer).await.is_err() || stdout.flush().await.is_err() {
                return;
            }
            buffer.clear();
        }
    });
    let face = Arc::new(Face {
        api: tokio::sync::Mutex::new(client.client),
        shown: Shown::new(false),
        target: client.target,
        agent,
        out,
        next_id: AtomicI64::new(1),
        asked: Mutex::new(HashMap::new()),
        questions: Mutex::new(HashMap::new()),
        sessions: Mutex::new(HashMap::new()),
        drafts: Mutex::new(HashMap::new()),
        elicits: std::sync::atomic::AtomicBool::new(false),
        requests: Mutex::new(HashMap::new()),
    });
    let mut input = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    loop {
        let line = match input.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) => break,
            Err(err) => {
                return Err(Failure {
                    code: Exit::Error,
                    line: format!("error: reading stdin: {err}"),
                });
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let message: Value = match serde_json::from_str(&line) {
            Ok(message) => message,
            Err(err) => {
                face.send(json!({"jsonrpc": "2.0", "id": null, "error": {
                    "code": -32700, "message": format!("not JSON: {err}")}}));
                continue;
            }
        };
        face.receive(message);
    }
    // The client is gone: what runs on goes on in the daemon (that is the point).
    writer.abort();
    Ok(())
}

impl Face {
    fn send(&self, message: Value) {
        let _ = self.out.send(message.to_string());
    }

    /// Sends the chunk lines `follow` gathered (one message for the writer, lines joined).
    fn send_chunks(&self, pending: &mut String) {
        if !pending.is_empty() {
            let _ = self.out.send(std::mem::take(pending));
        }
    }

    /// A text chunk's `session/update`, written straight (the stream's bulk: no JSON tree),
    /// added to `pending` on a line of its own.
    fn chunk(
        pending: &mut String,
        session: &str,
        kind: &str,
        text: &str,
        message_id: Option<&str>,
    ) {
        let text = serde_json::to_string(text).expect("UNWRAP: a string serializes");
        let session = serde_json::to_string(session).expect("UNWRAP: a string serializes");
        let id = match message_id {
            Some(id) => {
                format!(r#","messageId":{}"#, serde_json::to_string(id).expect("UNWRAP: a string"))
            }
            None => String::new(),
        };
        if !pending.is_empty() {
            pending.push('\n');
        }
        let _ = write!(
            pending,
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":{session},"update":{{"sessionUpdate":"{kind}","content":{{"type":"text","text":{text}}}{id}}}}}}}"#
        );
    }

    fn notify(&self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// Asks the ACP client the agent's question `request_id` (Tether's) and awaits its
    /// answer (`result` or `error`): `None` when it was answered elsewhere first and
    /// withdrawn (see [`Face::question_resolved`]).
    async fn ask_question(&self, request_id: &str, method: &str, params: Value) -> Option<Value> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.questions.lock().expect("UNWRAP: never poisoned").insert(request_id.to_owned(), id);
        let answer = self.ask_as(id, method, params).await;
        self.questions.lock().expect("UNWRAP: never poisoned").remove(request_id);
        answer
    }

    /// Sends request `id` to the ACP client and awaits its answer.
    async fn ask_as(&self, id: i64, method: &str, params: Value) -> Option<Value> {
        let (reply, answer) = oneshot::channel();
        self.asked.lock().expect("UNWRAP: never poisoned").insert(id, reply);
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        answer.await.ok()
    }

    /// The agent's question `request_id` was answered (by anyone): if it is still asked of
    /// this client, the question is withdrawn (`$/cancel_request`; the first answer won).
    fn question_resolved(&self, request_id: &str) {
        let ours = self.questions.lock().expect("UNWRAP: never poisoned").remove(request_id);
        let Some(id) = ours else { return };
        // Its waiter goes: a late answer of the client is passed on to nobody.
        self.asked.lock().expect("UNWRAP: never poisoned").remove(&id);
        self.notify(protocol::acp::method::CANCEL_REQUEST, json!({"requestId": id}));
    }

    /// One message from the client: a request (handled in a task of its own, so a long
    /// prompt does not hold back a cancel), a notification, or an answer to our request.
    fn receive(self: &Arc<Self>, message: Value) {
        let method = message["method"].as_str().map(str::to_owned);
        let id = message.get("id").cloned().filter(|id| !id.is_null());
        match (method, id) {
            (Some(method), Some(id)) => {
                let face = Arc::clone(self);
                let key = id.to_string();
                let params = message.get("params").cloned().unwrap_or(Value::Null);
                let prompt_of = (method == "session/prompt")
                    .then(|| params["sessionId"].as_str().map(str::to_owned))
                    .flatten();
                // Held until the request is answered: whoever takes it out answers it (the
                // handler, or a `$/cancel_request`).
                let mut requests = self.requests.lock().expect("UNWRAP: never poisoned");
                let task = tokio::spawn(async move {
                    let answer = match face.handle(&method, params).await {
                        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
                        Err(failure) => json!({"jsonrpc": "2.0", "id": id, "error": {
                            "code": failure.code, "message": failure.message}}),
                    };
                    let mine = face
                        .requests
                        .lock()
                        .expect("UNWRAP: never poisoned")
                        .remove(&id.to_string());
                    if mine.is_some() {
                        face.send(answer);
                    }
                });
                requests.insert(key, Inflight { prompt_of, task: task.abort_handle() });
            }
            (Some(method), None) => {
                let face = Arc::clone(self);
                tokio::spawn(async move {
                    let params = message.get("params").cloned().unwrap_or(Value::Null);
                    if method == "session/cancel"
                        && let Some(session) = params["sessionId"].as_str()
                    {
                        face.cancel_turn(session).await;
                    } else if method == "$/cancel_request" {
                        face.cancel_request(&params["requestId"]).await;
                    }
                });
            }
            (None, Some(id)) => {
                let waiting = id
                    .as_i64()
                    .and_then(|id| self.asked.lock().expect("UNWRAP: never poisoned").remove(&id));
                if let Some(waiting) = waiting {
                    let _ = waiting.send(message);
                }
            }
            (None, None) => {}
        }
    }

    /// The daemon's connection, opened again if the daemon restarted (within the reconnect
    /// window).
    async fn api(&self) -> Result<Arc<WsClient>, RpcFailure> {
        let mut current = self.api.lock().await;
        if !current.is_connected() {
            *current = Arc::new(self.target.reopen(&self.shown).await?);
        }
        Ok(Arc::clone(&current))
    }

    /// A failed call as the client hears it: bad params as such, the rest internal.
    fn failed(&self, api: &WsClient, err: jsonrpsee::core::ClientError) -> RpcFailure {
        let bad_params = kind_of(&err) == Some(ErrorKind::InvalidParams);
        let failure = RpcFailure::from(client::call_failure(&self.target, api, err));
        if bad_params { RpcFailure { code: INVALID_PARAMS, ..failure } } else { failure }
    }

    /// Follows `session` from after `after` for this client (`ready` hears when its agent
    /// is ready, or could not start).
    fn open(
        self: &Arc<Self>,
        session: &str,
        after: u64,
        ready: Option<oneshot::Sender<Result<(), RpcFailure>>>,
    ) {
        let turns = Arc::new(Mutex::new(Turns::default()));
        let replaced = self
            .sessions
            .lock()
            .expect("UNWRAP: never poisoned")
            .insert(session.to_owned(), Arc::clone(&turns));
        if let Some(replaced) = replaced {
            replaced.lock().expect("UNWRAP: never poisoned").stop.cancel();
        }
        let face = Arc::clone(self);
        let session = session.to_owned();
        tokio::spawn(async move { face.follow(session, turns, after, ready).await });
    }

    fn turns(&self, session: &str) -> Option<Arc<Mutex<Turns>>> {
        self.sessions.lock().expect("UNWRAP: never poisoned").get(session).cloned()
    }

    /// `session/cancel`: the session's turn (also one whose prompt has not started yet).
    async fn cancel_turn(&self, session: &str) {
        if let Some(turns) = self.turns(session) {
            turns.lock().expect("UNWRAP: never poisoned").cancels += 1;
        }
        self.cancel(session).await;
    }

    /// `$/cancel_request`: a prompt's turn is cancelled (the prompt then answers
    /// `cancelled`); any other request in flight is dropped and answered `-32800`.
    async fn cancel_request(&self, id: &Value) {
        let key = id.to_string();
        let prompt_of = {
            let mut requests = self.requests.lock().expect("UNWRAP: never poisoned");
            match requests.get(&key).map(|inflight| inflight.prompt_of.clone()) {
                None => return,
                Some(Some(session)) => Some(session),
                Some(None) => {
                    let inflight = requests.remove(&key).expect("UNWRAP: just found");
                    inflight.task.abort();
                    None
                }
            }
        };
        match prompt_of {
            Some(session) => self.cancel_turn(&session).await,
            None => self.send(json!({"jsonrpc": "2.0", "id": id, "error": {
                "code": REQUEST_CANCELLED, "message": "the request was cancelled"}})),
        }
    }

    async fn cancel(&self, session: &str) {
        let cancelled = match self.api().await {
            Ok(api) => {
                api.session_cancel(session.to_owned()).await.map_err(|err| self.failed(&api, err))
            }
            Err(failure) => Err(failure),
        };
        if let Err(failure) = cancelled {
            eprintln!("tether acp: cannot cancel the turn of {session}: {}", failure.message);
        }
    }

    async fn handle(self: &Arc<Self>, method: &str, params: Value) -> Result<Value, RpcFailure> {
        match method {
            "initialize" => {
                // A client that takes elicitations gets the agent's; else they wait for
                // another (the page, the CLI).
                let elicits = params["clientCapabilities"]["elicitation"].is_object();
                self.elicits.store(elicits, Ordering::Relaxed);
                Ok(json!({
                // Steering, as claude-agent-acp and codex-acp advertise it.
                "_meta": {"steering": {"supported": true}},
                "protocolVersion": 1,
                "agentCapabilities": {
                    "loadSession": true,
                    "sessionCapabilities": {"list": {}, "resume": {}, "close": {}, "fork": {}},
                    "promptCapabilities": {"image": false, "audio": false, "embeddedContext": true},
                },
                "authMethods": [],
                "agentInfo": {"name": "tether", "title": "Tether", "version": env!("CARGO_PKG_VERSION")},
                }))
            }
            "session/new" => self.new_session(params).await,
            "session/prompt" => self.prompt(params).await,
            protocol::acp::method::SESSION_STEERING => self.steer(params).await,
            "session/list" => self.list(params).await,
            "session/load" => self.load(params, true).await,
            "session/resume" => self.load(params, false).await,
            "session/close" => self.close(params).await,
            protocol::acp::method::SESSION_FORK => self.fork(params).await,
            "session/set_config_option" => self.set_config_option(params).await,
            "session/set_mode" => self.set_mode(params).await,
            other => Err(RpcFailure {
                code: METHOD_NOT_FOUND,
                message: format!("{other} is not a method Tether's ACP face serves"),
            }),
        }
    }

    /// `session/new`: with `--agent`, a task and a session of that profile on `cwd`,
    /// answered once its agent is ready (or refused with why it could not start); without,
    /// a draft whose agent the client chooses (`config.rs`).
    async fn new_session(self: &Arc<Self>, params: Value) -> Result<Value, RpcFailure> {
        let cwd = params["cwd"]
            .as_str()
            .filter(|cwd| Path::new(cwd).is_absolute())
            .ok_or_else(|| RpcFailure::params("session/new needs an absolute cwd"))?
            .to_owned();
        let directories: Option<Vec<String>> = params["additionalDirectories"]
            .as_array()
            .map(|dirs| dirs.iter().filter_map(|dir| dir.as_str().map(str::to_owned)).collect());
        let draft = Draft {
            cwd,
            mcp_servers: params["mcpServers"].as_array().cloned(),
            additional_directories: directories,
            agent: self.agent.clone().unwrap_or_default(),
        };
        if self.agent.is_none() {
            return self.new_draft(draft).await;
        }
        let session = self.create(draft, None).await?;
        self.config_answer(&session).await.map(|mut answer| {
            answer["sessionId"] = json!(session);
            answer
        })
    }

    /// Creates the Tether session of `draft` (with the id `id`, when given) and waits
    /// until its agent is ready; its id.
    async fn create(
        self: &Arc<Self>,
        draft: Draft,
        id: Option<String>,
    ) -> Result<String, RpcFailure> {
        let Draft { cwd, mcp_servers, additional_directories, agent: profile } = draft;
        let api = self.api().await?;
        let folder = Path::new(&cwd)
            .file_name()
            .map_or(cwd.clone(), |name| name.to_string_lossy().into_owned());
        let task = api
            .task_create(format!("{profile} in {folder}"), None)
            .await
            .map_err(|err| self.failed(&api, err))?;
        let session = api
            .session_create(
                task.id,
                profile,
                Some(cwd),
                None,
                None,
                Some(true),
                None,
                None,
                None,
                mcp_servers,
                id,
                additional_directories,
            )
            .await
            .map_err(|err| self.failed(&api, err))?;
        let (ready_tx, ready) = oneshot::channel();
        self.open(&session.id, 0, Some(ready_tx));
        match ready.await {
            Ok(Ok(())) => Ok(session.id),
            Ok(Err(failure)) => Err(failure),
            Err(_) => Err(RpcFailure::internal("the session's event stream ended")),
        }
    }

    /// `session/list`: Tether's sessions (of `cwd`, when given) that can go on, newest
    /// first; each titled by its task.
    async fn list(&self, params: Value) -> Result<Value, RpcFailure> {
        let cwd = params["cwd"].as_str();
        let api = self.api().await?;
        let mut sessions =
            api.session_list(None, None, None).await.map_err(|e| self.failed(&api, e))?;
        sessions.retain(|session| {
            !session.state.is_terminal() && cwd.is_none_or(|cwd| session.workspace_path == cwd)
        });
        sessions.sort_by_key(|session| std::cmp::Reverse(session.updated_at));
        let tasks: HashMap<String, String> = api
            .task_list()
            .await
            .map_err(|e| self.failed(&api, e))?
            .into_iter()
            .map(|task| (task.id, task.title))
            .collect();
        let listed: Vec<Value> = sessions
            .into_iter()
            .map(|session| {
                // The agent's own title when it gave one, else the task's.
                let title = session
                    .title
                    .clone()
                    .or_else(|| tasks.get(&session.task_id).cloned())
                    .unwrap_or_default();
                json!({
                    "sessionId": session.id,
                    "cwd": session.workspace_path,
                    "title": format!("{title} ({}, {})", session.agent_profile_id, session.state),
                    "updatedAt": rfc3339(session.updated_at),
                })
            })
            .collect();
        Ok(json!({"sessions": listed}))
    }

    /// `session/load` (`replay`: the conversation is sent first, as `session/update`s, from
    /// Tether's own history) and `session/resume`: the session is followed from now on;
    /// its agent is brought back by the next prompt, natively where it can restore.
    async fn load(self: &Arc<Self>, params: Value, replay: bool) -> Result<Value, RpcFailure> {
        let session = params["sessionId"]
            .as_str()
            .ok_or_else(|| RpcFailure::params("a sessionId is needed"))?
            .to_owned();
        let api = self.api().await?;
        let status = api.session_status(session.clone()).await.map_err(|e| self.failed(&api, e))?;
        if status.state.is_terminal() {
            return Err(RpcFailure::params(format!(
                "session {session} has ended ({}); start a new one",
                status.state
            )));
        }
        if replay {
            let mut after = 0;
            let mut tools = std::collections::HashSet::new();
            loop {
                let page = api
                    .session_history(session.clone(), Some(after), None)
                    .await
                    .map_err(|e| self.failed(&api, e))?;
                let Some(last) = page.last() else { break };
                after = last.seq;
                // A rewound turn is no longer part of the conversation.
                for entry in page.iter().filter(|entry| !entry.rewound) {
                    if let Some(update) = history_update(entry, &mut tools) {
                        self.notify(
                            "session/update",
                            json!({"sessionId": session, "update": update}),
                        );
                    }
                }
            }
        }
        self.open(&session, status.last_event_seq, None);
        self.config_answer(&session).await
    }

    /// `session/fork`: `task.session.fork` at the session's newest turn (natively where its
    /// agent can, else with the history injected before the fork's first prompt), followed
    /// as a loaded session is; answered with the fork's id and options. The fork works where
    /// Tether puts it (a worktree of its own, or the original's workspace), not in `cwd`.
    async fn fork(self: &Arc<Self>, params: Value) -> Result<Value, RpcFailure> {
        let session = params["sessionId"]
            .as_str()
            .ok_or_else(|| RpcFailure::params("session/fork needs a sessionId"))?
            .to_owned();
        let api = self.api().await?;
        let forked = api.session_fork(session, None).await.map_err(|e| self.failed(&api, e))?;
        let status = api
            .session_status(forked.session_id.clone())
            .await
            .map_err(|e| self.failed(&api, e))?;
        self.open(&forked.session_id, status.last_event_seq, None);
        let mut answer = self.config_answer(&forked.session_id).await?;
        answer["sessionId"] = json!(forked.session_id);
        Ok(answer)
    }

    /// `session/close`: its turn is cancelled and its agent let go (the session is paused,
    /// not ended: it can be loaded again).
    async fn close(&self, params: Value) -> Result<Value, RpcFailure> {
        let session = params["sessionId"]
            .as_str()
            .ok_or_else(|| RpcFailure::params("a sessionId is needed"))?
            .to_owned();
        if self.drafts().remove(&session).is_some() {
            // Nothing was created for it.
            return Ok(json!({}));
        }
        let turns = self.sessions.lock().expect("UNWRAP: never poisoned").remove(&session);
        let Some(turns) = turns else {
            return Err(RpcFailure::params(format!("no session {session} is open here")));
        };
        turns.lock().expect("UNWRAP: never poisoned").stop.cancel();
        let api = self.api().await?;
        let reason = Some("closed by the ACP client".to_owned());
        match api.session_pause(session.clone(), reason, Some(0)).await {
            Ok(_) => Ok(json!({})),
            // Already at rest (paused, or its agent gone): nothing holds resources.
            Err(err) if kind_of(&err) == Some(ErrorKind::InvalidState) => Ok(json!({})),
            Err(err) => Err(self.failed(&api, err)),
        }
    }

    /// `session/prompt`: the turn, answered with its stop reason.
    async fn prompt(self: &Arc<Self>, params: Value) -> Result<Value, RpcFailure> {
        let session = params["sessionId"]
            .as_str()
            .ok_or_else(|| RpcFailure::params("session/prompt needs a sessionId"))?
            .to_owned();
        let draft = self.drafts().remove(&session);
        if let Some(draft) = draft {
            // The first prompt of a draft: its session is created with the agent chosen,
            // and the client learns the agent's own options.
            self.create(draft, Some(session.clone())).await?;
            let config = self.config_answer(&session).await?;
            self.notify("session/update", json!({"sessionId": session, "update": {
                "sessionUpdate": "config_option_update", "configOptions": config["configOptions"]}}));
            if let Some(mode) = config["modes"]["currentModeId"].as_str() {
                self.notify(
                    "session/update",
                    json!({"sessionId": session, "update": {
                    "sessionUpdate": "current_mode_update", "currentModeId": mode}}),
                );
            }
        }
        let turns = self
            .turns(&session)
            .ok_or_else(|| RpcFailure::params(format!("no session {session} is open here")))?;
        let text = prompt_text(&params["prompt"])?;
        if let Some(args) = text.trim().strip_prefix(REWIND_COMMAND)
            && (args.is_empty() || args.starts_with(char::is_whitespace))
        {
            return self.rewind(&session, args).await;
        }
        let cancels = turns.lock().expect("UNWRAP: never poisoned").cancels;
        let api = self.api().await?;
        let started = api
            .session_prompt(session.clone(), text)
            .await
            .map_err(|err| self.failed(&api, err))?;
        let (reply, end) = oneshot::channel();
        let cancelled_meanwhile = {
            let mut turns = turns.lock().expect("UNWRAP: never poisoned");
            let prompt_id = started.prompt_id.unwrap_or_default();
            let turn_id = started.turn_id.or_else(|| turns.started.remove(&prompt_id));
            match turn_id {
                Some(turn_id) => match turns.ended.remove(&turn_id) {
                    Some(ended) => return ended.map(|reason| json!({"stopReason": reason})),
                    None => turns.waiting.insert(turn_id, reply),
                },
                // Queued behind the running turn: its turn is known once it starts.
                None => turns.queued.insert(prompt_id, reply),
            };
            turns.cancels != cancels
        };
        if cancelled_meanwhile {
            self.cancel(&session).await;
        }
        match end.await {
            Ok(ended) => ended.map(|reason| json!({"stopReason": reason})),
            Err(_) => Err(RpcFailure::internal("the session's event stream ended")),
        }
    }

    /// `/rewind [N] [--restore-workspace]` sent as a prompt (ACP has no rewind of its own):
    /// undoes the conversation's last N turns (default 1) with `task.session.rewind`, and
    /// says what it did as the agent's message of a turn of its own.
    async fn rewind(self: &Arc<Self>, session: &str, args: &str) -> Result<Value, RpcFailure> {
        let usage = "/rewind [N] [--restore-workspace]: undo the last N turns (default 1)";
        let (mut count, mut restore) = (1usize, false);
        for word in args.split_whitespace() {
            match word {
                "--restore-workspace" => restore = true,
                number => {
                    count = number.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        RpcFailure::params(format!("{usage}; {number} is not a number of turns"))
                    })?;
                }
            }
        }
        let api = self.api().await?;
        let timeline = api
            .session_timeline(session.to_owned(), None)
            .await
            .map_err(|err| self.failed(&api, err))?;
        let kept: Vec<&str> = timeline
            .turns
            .iter()
            .filter(|turn| !turn.rewound)
            .map(|turn| turn.turn_id.as_str())
            .collect();
        let text = match kept.len().checked_sub(count + 1) {
            None => format!(
                "this conversation has {} turn(s): undoing {count} would leave none (start a new session instead)",
                kept.len()
            ),
            Some(at) => {
                let rewound = api
                    .session_rewind(session.to_owned(), kept[at].to_owned(), Some(restore))
                    .await
                    .map_err(|err| self.failed(&api, err))?;
                let workspace = match &rewound.workspace {
                    Some(restored) => format!(
                        "; the workspace is back as it was then (what it had is on {})",
                        restored.saved_ref
                    ),
                    None => "; the workspace keeps what they changed".to_owned(),
                };
                format!(
                    "rewound {} turn(s): the conversation now ends at turn {}{workspace}. The agent starts afresh from there at the next prompt.",
                    rewound.rewound.len(),
                    rewound.turn_id
                )
            }
        };
        self.notify(
            "session/update",
            json!({"sessionId": session, "update": {"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": text}}}),
        );
        Ok(json!({"stopReason": "end_turn"}))
    }

    /// `_session/steering`: `task.session.steer`. Taken into the turn (`injected`) either
    /// way: natively, the turn carries it; by the fallback, the client's `session/prompt`
    /// carries on through the steer's own turn (see the `steered` event in
    /// [`Face::forward_event`]). With no turn of the client's running, one that asked for
    /// `promptRequired` gets that (it sends the prompt itself); else the text is a prompt
    /// (`startedNewTurn`).
    async fn steer(self: &Arc<Self>, params: Value) -> Result<Value, RpcFailure> {
        let session = params["sessionId"]
            .as_str()
            .ok_or_else(|| RpcFailure::params("_session/steering needs a sessionId"))?
            .to_owned();
        let turns = self
            .turns(&session)
            .ok_or_else(|| RpcFailure::params(format!("no session {session} is open here")))?;
        let text = prompt_text(&params["prompt"])?;
        let prompt_required =
            params.pointer("/_meta/steering/idleBehavior").and_then(Value::as_str)
                == Some("promptRequired");
        let idle = {
            let turns = turns.lock().expect("UNWRAP: never poisoned");
            turns.waiting.is_empty() && turns.queued.is_empty()
        };
        if idle && prompt_required {
            return Ok(json!({"outcome": "promptRequired", "reason": "noRunningTurn"}));
        }
        let api = self.api().await?;
        let steered =
            api.session_steer(session, text).await.map_err(|err| self.failed(&api, err))?;
        Ok(match steered.mode {
            protocol::api::SteerMode::Native | protocol::api::SteerMode::Fallback => {
                json!({"outcome": "injected"})
            }
            protocol::api::SteerMode::Prompt => json!({"outcome": "startedNewTurn"}),
        })
    }

    /// Follows a session's events for as long as the face runs: readiness, updates,
    /// questions and turn ends.
    async fn follow(
        self: Arc<Self>,
        session: String,
        turns: Arc<Mutex<Turns>>,
        after: u64,
        mut ready: Option<oneshot::Sender<Result<(), RpcFailure>>>,
    ) {
        let stop = turns.lock().expect("UNWRAP: never poisoned").stop.clone();
        let shown = Shown::new(false);
        let mut events = match self.open_feed(&session, after, &shown).await {
            Ok(events) => events,
            Err(failure) => {
                eprintln!("tether acp: cannot follow session {session}: {}", failure.message);
                if let Some(ready) = ready.take() {
                    let _ = ready.send(Err(failure));
                }
                return;
            }
        };
        events.follow_restarts();
        // A stream's chunks, gathered while the feed has more at hand: the writer gets them
        // as one message (and the client one write), sent before anything else goes out.
        let mut pending = String::new();
        loop {
            if !events.has_queued() || pending.len() >= WRITE_BATCH {
                self.send_chunks(&mut pending);
            }
            let next = tokio::select! {
                () = stop.cancelled() => return self.send_chunks(&mut pending),
                next = events.next() => next,
            };
            if !matches!(
                next,
                Ok(SessionEvent {
                    kind: EventKind::AgentMessageChunk { .. } | EventKind::AgentThoughtChunk { .. },
                    ..
                })
            ) {
                self.send_chunks(&mut pending);
            }
            let event = match next {
                Ok(event) => event,
                Err(failure) => {
                    eprintln!("tether acp: {}", failure.line);
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(Err(failure.into()));
                    }
                    return;
                }
            };
            shown.progress(&event);
            self.forward_event(event.kind, &session, &turns, &mut pending, &mut ready);
        }
    }

    /// Opens the feed of a session's events after `after`, on the daemon's connection.
    async fn open_feed<'a>(
        &self,
        session: &str,
        after: u64,
        shown: &'a Shown,
    ) -> Result<Feed<'a>, RpcFailure> {
        let api = self.api().await?;
        let client = Client { target: self.target.clone(), client: api };
        Feed::open(&client, session, Some(after), shown).await.map_err(RpcFailure::from)
    }

    /// Passes one of a session's events on: readiness to `ready`, updates to the client
    /// (text chunks gathered in `pending`), questions asked of it, turn ends to their prompt.
    fn forward_event(
        self: &Arc<Self>,
        kind: EventKind,
        session: &str,
        turns: &Mutex<Turns>,
        pending: &mut String,
        ready: &mut Option<oneshot::Sender<Result<(), RpcFailure>>>,
    ) {
        let update = |update: Value| {
            self.notify("session/update", json!({"sessionId": session, "update": update}))
        };
        match kind {
            EventKind::State { state, error } => {
                let answer = match state {
                    SessionState::WaitingForInput | SessionState::Running => Some(Ok(())),
                    SessionState::Failed => Some(Err(RpcFailure::internal(format!(
                        "the agent could not start: {}",
                        error.unwrap_or_default()
                    )))),
                    _ => None,
                };
                if let Some(answer) = answer
                    && let Some(waiting) = ready.take()
                {
                    let _ = waiting.send(answer);
                }
            }
            EventKind::AgentMessageChunk { text, message_id } => {
                let id = message_id.as_deref();
                Face::chunk(pending, session, "agent_message_chunk", &text, id)
            }
            EventKind::AgentThoughtChunk { text, message_id } => {
                let id = message_id.as_deref();
                Face::chunk(pending, session, "agent_thought_chunk", &text, id)
            }
            EventKind::ToolCall { update: raw }
            | EventKind::ToolCallUpdate { update: raw }
            | EventKind::SessionUpdate { update: raw } => update(raw),
            EventKind::PermissionRequest { request_id, mut params } => {
                params["sessionId"] = json!(session);
                let face = Arc::clone(self);
                let session = session.to_owned();
                tokio::spawn(async move { face.ask_permission(session, request_id, params).await });
            }
            EventKind::ElicitationRequest { request_id, mut params }
                if self.elicits.load(Ordering::Relaxed) =>
            {
                params["sessionId"] = json!(session);
                let face = Arc::clone(self);
                let session = session.to_owned();
                tokio::spawn(
                    async move { face.ask_elicitation(session, request_id, params).await },
                );
            }
            // A steer cancelled the turn a prompt of ours waits on: the prompt carries on
            // through the steer's turn (it comes first, with this `prompt_id`).
            EventKind::Steered {
                turn_id,
                mode: protocol::api::SteerMode::Fallback,
                prompt_id: Some(prompt_id),
                ..
            } => {
                let mut turns = turns.lock().expect("UNWRAP: never poisoned");
                if let Some(waiting) = turns.waiting.remove(&turn_id) {
                    turns.queued.insert(prompt_id, waiting);
                }
            }
            EventKind::PermissionResolved { request_id, .. } => self.question_resolved(&request_id),
            // The queue halted (a launch or a turn before them failed) with prompts of ours
            // in it: their `session/prompt` ends with why; they stay queued.
            EventKind::Queue { queue } => {
                let Some(why) = queue.halted else { return };
                let mut turns = turns.lock().expect("UNWRAP: never poisoned");
                for prompt in queue.prompts {
                    if let Some(waiting) = turns.queued.remove(&prompt.prompt_id) {
                        let _ = waiting.send(Err(RpcFailure::internal(format!(
                            "the prompt queue halted: {why} (the prompt stays queued as {}: go on with `supervisor queue resume {session}`)",
                            prompt.prompt_id
                        ))));
                    }
                }
            }
            EventKind::TurnStarted { turn_id, prompt_id: Some(prompt_id), .. } => {
                let mut turns = turns.lock().expect("UNWRAP: never poisoned");
                match turns.queued.remove(&prompt_id) {
                    Some(waiting) => drop(turns.waiting.insert(turn_id, waiting)),
                    None => drop(turns.started.insert(prompt_id, turn_id)),
                }
            }
            EventKind::TurnEnded { turn_id, state, stop_reason, error } => {
                let ended = match state {
                    TurnState::Completed => Ok(stop_reason.unwrap_or_else(|| "end_turn".into())),
                    _ => Err(RpcFailure::internal(format!(
                        "the turn {}: {}",
                        state.as_str(),
                        error.unwrap_or_default()
                    ))),
                };
                let mut turns = turns.lock().expect("UNWRAP: never poisoned");
                match turns.waiting.remove(&turn_id) {
                    Some(waiting) => {
                        let _ = waiting.send(ended);
                    }
                    None => {
                        turns.ended.insert(turn_id, ended);
                    }
                }
            }
            _ => {}
        }
    }

    /// The agent's elicitation, asked of the client; its answer goes back through the
    /// daemon.
    async fn ask_elicitation(&self, session: String, request_id: String, params: Value) {
        use protocol::api::params::ElicitationAnswer;
        let asked = self.ask_question(&request_id, "elicitation/create", params);
        let Some(answer) = asked.await else { return };
        let result = &answer["result"];
        let action = match result["action"].as_str() {
            Some("accept") => ElicitationAnswer::Accept,
            Some("decline") => ElicitationAnswer::Decline,
            _ => ElicitationAnswer::Cancel,
        };
        let content = result["content"].as_object().cloned();
        let api = match self.api().await {
            Ok(api) => api,
            Err(failure) => return self.unanswered(&session, "elicitation", failure),
        };
        let answered = api.elicitation_respond(session.clone(), request_id, action, content).await;
        if let Err(err) = answered {
            self.unanswered(&session, "elicitation", self.failed(&api, err));
        }
    }

    /// Says that the client's answer to a question of `session` could not be passed on.
    fn unanswered(&self, session: &str, what: &str, failure: RpcFailure) {
        eprintln!("tether acp: cannot answer the {what} of {session}: {}", failure.message);
    }

    /// The agent's question, asked of the client; its choice goes back through the daemon.
    async fn ask_permission(&self, session: String, request_id: String, params: Value) {
        let asked = self.ask_question(&request_id, "session/request_permission", params);
        let Some(answer) = asked.await else { return };
        let option = match &answer["result"]["outcome"] {
            outcome if outcome["outcome"] == "selected" => {
                outcome["optionId"].as_str().map(str::to_owned)
            }
            _ => None,
        };
        let api = match self.api().await {
            Ok(api) => api,
            Err(failure) => return self.unanswered(&session, "permission request", failure),
        };
        let answered = api.permission_respond(session.clone(), request_id, option).await;
        if let Err(err) = answered {
            self.unanswered(&session, "permission request", self.failed(&api, err));
        }
    }
}

/// The text of a prompt's content blocks: text as is, resources by their text or link.
/// The prompt that is a rewind, not a message (see [`Face::rewind`]).
const REWIND_COMMAND: &str = "/rewind";

fn prompt_text(blocks: &Value) -> Result<String, RpcFailure> {
    let blocks = blocks.as_array().ok_or_else(|| RpcFailure::params("prompt must be an array"))?;
    let mut parts = Vec::new();
    for block in blocks {
        match block["type"].as_str() {
            Some("text") => parts.push(block["text"].as_str().unwrap_or_default().to_owned()),
            Some("resource_link") => {
                parts.push(block["uri"].as_str().unwrap_or_default().to_owned())
            }
            Some("resource") => {
                let resource = &block["resource"];
                match resource["text"].as_str() {
                    Some(text) => parts.push(format!(
                        "{}:\n{text}",
                        resource["uri"].as_str().unwrap_or("resource")
                    )),
                    None => parts.push(resource["uri"].as_str().unwrap_or_default().to_owned()),
                }
            }
            other => {
                return Err(RpcFailure::params(format!(
                    "a prompt block of type {} is not supported (text and resources are)",
                    other.unwrap_or("?")
                )));
            }
        }
    }
    if parts.iter().all(|part| part.trim().is_empty()) {
        return Err(RpcFailure::params("the prompt is empty"));
    }
    Ok(parts.join("\n\n"))
}

/// A history entry as the `session/update` a load replays: a tool's first entry is its
/// `tool_call`, later ones (`tools` holds the ids seen) its `tool_call_update`s.
fn history_update(
    entry: &protocol::api::HistoryEntry,
    tools: &mut std::collections::HashSet<String>,
) -> Option<Value> {
    let text = |kind: &str| {
        let mut update =
            json!({"sessionUpdate": kind, "content": {"type": "text", "text": entry.content}});
        if let Some(id) = &entry.message_id {
            update["messageId"] = json!(id);
        }
        update
    };
    if let Some(plan) = entry.plan.as_ref().filter(|_| entry.kind == protocol::api::EntryType::Plan)
    {
        return Some(json!({"sessionUpdate": "plan", "entries": plan}));
    }
    match entry.role.as_str() {
        "user" => Some(text("user_message_chunk")),
        "assistant" => Some(text("agent_message_chunk")),
        "tool" => {
            let id = entry.tool_call_id.clone().unwrap_or_else(|| format!("history-{}", entry.seq));
            let kind = if tools.insert(id.clone()) { "tool_call" } else { "tool_call_update" };
            Some(json!({
                "sessionUpdate": kind,
                "toolCallId": id,
                "title": entry.tool_name.clone().unwrap_or_else(|| entry.content.clone()),
                "status": entry.tool_status.clone().unwrap_or_else(|| "completed".into()),
            }))
        }
        _ => None,
    }
}

/// Unix ms as RFC 3339 (UTC).
fn rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The kind a daemon's error names.
fn kind_of(err: &jsonrpsee::core::ClientError) -> Option<ErrorKind> {
    match err {
        jsonrpsee::core::ClientError::Call(object) => {
            protocol::errors::ErrorData::of(object).map(|data| data.kind)
        }
        _ => None,
    }
}

/// Starts `supervisor serve` on `url`'s loopback address, detached from the face (its own
/// process group; it outlives the face and the editor), its output appended to
/// `daemon.log` in the data directory; returns where it serves once it does. When another
/// daemon took the data directory meanwhile (the one started is refused), returns where
/// that one serves.
pub(super) async fn start_daemon(url: &str, self_command: &[OsString]) -> Result<String, Failure> {
    let not_running = |why: String| Failure { code: Exit::NotRunning, line: why };
    let addr = url
        .strip_prefix("ws://")
        .map(|rest| rest.trim_end_matches('/'))
        .and_then(|addr| addr.parse::<SocketAddr>().ok())
        .filter(|addr| addr.ip().is_loopback())
        .ok_or_else(|| {
            not_running(format!(
                "server not running at {url}; start it there with `supervisor serve` (the ACP face starts one by itself only on a loopback ws:// address)"
            ))
        })?;
    let root = Home::default_root().ok_or_else(|| {
        not_running(
            "server not running, and no data directory to start one in (set TETHER_HOME)".into(),
        )
    })?;
    std::fs::create_dir_all(&root).map_err(|err| {
        not_running(format!("cannot make the data directory {}: {err}", root.display()))
    })?;
    let log_path = root.join("daemon.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|err| not_running(format!("cannot open {}: {err}", log_path.display())))?;
    let (program, args) = self_command.split_first().ok_or_else(|| {
        not_running("server not running, and this program cannot name itself to start one".into())
    })?;
    eprintln!("tether acp: no daemon at {url}; starting one (log: {})", log_path.display());
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .args(["serve", "--listen", &addr.to_string()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(|err| not_running(format!("cannot start the daemon: {err}")))?;
    let stdout = child.stdout.take().expect("UNWRAP: piped");
    let mut line = String::new();
    let mut stdout = tokio::io::BufReader::new(stdout);
    // Its first line says it serves; an end of output first means it exited.
    let read = tokio::time::timeout(DAEMON_START, stdout.read_line(&mut line)).await;
    match read {
        Ok(Ok(n)) if n > 0 => {
            eprintln!("tether acp: {}", line.trim_end());
            Ok(served_url(&line).unwrap_or_else(|| url.to_owned()))
        }
        Ok(_) => match crate::home::lock::running(&root).and_then(|daemon| daemon.url) {
            Some(running) => {
                eprintln!("tether acp: a daemon of this data directory serves at {running}");
                Ok(running)
            }
            None => Err(not_running(format!(
                "the daemon it started at {url} exited; see {}",
                log_path.display()
            ))),
        },
        Err(_) => Err(not_running(format!(
            "the daemon it started at {url} did not serve within {} s; see {}",
            DAEMON_START.as_secs(),
            log_path.display()
        ))),
    }
}

/// The address in a daemon's serving line (`tether serving on ws://ADDR (…)`).
fn served_url(line: &str) -> Option<String> {
    line.split_whitespace().find(|word| word.starts_with("ws://")).map(str::to_owned)
}

/// How long a daemon the face starts may take to serve (it recovers what a previous one
/// left first).
const DAEMON_START: Duration = Duration::from_secs(60);
