//! A scripted model server on 127.0.0.1, so real agents complete real turns offline.
//!
//! It speaks enough of the Anthropic Messages API (`POST /v1/messages`, streamed as
//! server-sent events or not, and `/v1/messages/count_tokens`) to stand in for the model
//! behind claude-agent-acp and opencode, of the OpenAI Responses API (`POST
//! /v1/responses`, streamed) for codex, which has no other wire API, and of the Gemini API
//! (`POST /v1beta/models/M:streamGenerateContent?alt=sse`) for gemini-cli, and of the
//! OpenAI Chat Completions API (`POST /v1/chat/completions`, streamed or not) for the
//! agents that take any OpenAI-compatible endpoint (Qwen Code). Each test scripts the
//! replies of the agent's main loop (the
//! requests that offer tools) and reads back every request the server received — which is
//! how a test checks that a resumed agent sent its earlier conversation to the model.
//!
//! HTTP/1.1 by hand on a tokio listener: one request per connection (`Connection: close`),
//! which every client handles.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// One scripted reply of the model.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Text, streamed in a few deltas; the turn ends (`end_turn`).
    Text(String),
    /// No answer: the request is held open until the client gives up on it (a cancel).
    Hang,
    /// Held open until the test releases it (`notify_one`), then answered as the boxed
    /// reply; or until the client gives up on it, as [`Reply::Hang`].
    Held(Arc<tokio::sync::Notify>, Box<Reply>),
    /// A tool call (`stop_reason: tool_use`); the agent runs it and asks again.
    ToolUse {
        /// The tool's name (e.g. `Write`).
        name: String,
        /// Its input.
        input: Value,
    },
}

struct Shared {
    script: VecDeque<Reply>,
    requests: Vec<Value>,
    served: u64,
    /// How many main-loop requests arrived (awaited by tests, never polled).
    main_count: tokio::sync::watch::Sender<usize>,
}

/// A running model server; stops when dropped.
pub struct ModelServer {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    shared: Arc<Mutex<Shared>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ModelServer {
    /// Binds an ephemeral port on 127.0.0.1 and serves until dropped.
    pub async fn start() -> ModelServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the model server");
        let url = format!("http://{}", listener.local_addr().expect("its address"));
        let shared = Arc::new(Mutex::new(Shared {
            script: VecDeque::new(),
            requests: Vec::new(),
            served: 0,
            main_count: tokio::sync::watch::channel(0).0,
        }));
        let serving = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = Arc::clone(&serving);
                tokio::spawn(async move {
                    if let Err(err) = serve(stream, shared).await {
                        eprintln!("model server: {err}");
                    }
                });
            }
        });
        ModelServer { url, shared, task }
    }

    /// Queues replies for the agent's main loop, in order.
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        self.lock().script.extend(replies);
    }

    /// Waits until `n` main-loop requests have arrived.
    pub async fn main_requested(&self, n: usize) {
        let mut count = self.lock().main_count.subscribe();
        crate::within("the model to be asked", count.wait_for(|&count| count >= n))
            .await
            .expect("the server lives as long as the test");
    }

    /// Every request body received so far (with `"path"` added).
    pub fn requests(&self) -> Vec<Value> {
        self.lock().requests.clone()
    }

    /// The main-loop requests (those offering tools), in order.
    pub fn main_requests(&self) -> Vec<Value> {
        self.requests().into_iter().filter(is_main).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Whether a request is the agent's main loop (it offers tools), not a side request (a
/// title, a quota check).
fn is_main(request: &Value) -> bool {
    let path = request["path"].as_str().unwrap_or_default();
    if path.starts_with("/v1beta/models/") {
        // gemini-cli's turns stream; its side calls (choosing a model) do not.
        return path.contains(":streamGenerateContent");
    }
    if path.starts_with("/v1/chat/completions") {
        // The turn's requests offer tools; side requests (a next-speaker check, a
        // title) do not.
        return request["tools"].as_array().is_some_and(|tools| !tools.is_empty());
    }
    if path.starts_with("/v1/responses") {
        // codex lists its tools among the input items; its one side request asks for a
        // title through a JSON schema.
        return !is_title_request(request);
    }
    path.starts_with("/v1/messages")
        && !path.contains("count_tokens")
        && request["tools"].as_array().is_some_and(|tools| !tools.is_empty())
}

/// codex's background title request: a structured output with a `title` property.
fn is_title_request(request: &Value) -> bool {
    request["text"]["format"]["schema"]["properties"]["title"].is_object()
}

/// The text of every message of a request, joined (to look for earlier turns in it):
/// Anthropic's `messages` and OpenAI's `input` items alike.
pub fn conversation_text(request: &Value) -> String {
    let mut text = String::new();
    let messages = request["messages"].as_array().into_iter().flatten();
    let items = request["input"].as_array().into_iter().flatten();
    for content in request["contents"].as_array().into_iter().flatten() {
        for part in content["parts"].as_array().into_iter().flatten() {
            if let Some(s) = part["text"].as_str() {
                text.push_str(s);
                text.push('\n');
            }
        }
    }
    for message in messages.chain(items) {
        match &message["content"] {
            Value::String(s) => text.push_str(s),
            Value::Array(blocks) => {
                for block in blocks {
                    if let Some(s) = block["text"].as_str() {
                        text.push_str(s);
                    }
                    text.push('\n');
                }
            }
            _ => {}
        }
        text.push('\n');
    }
    text
}

async fn serve(stream: TcpStream, shared: Arc<Mutex<Shared>>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    let mut request_line = String::new();
    reader.read_line(&mut request_line).await?;
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let path = parts.next().unwrap_or_default().to_owned();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.trim().eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).await?;
    let mut stream = reader.into_inner();
    let mut request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if !request.is_object() {
        request = json!({});
    }
    request["path"] = json!(path);
    let main = is_main(&request);
    let streamed = request["stream"].as_bool() == Some(true);
    let model = request["model"].as_str().unwrap_or("scripted-model").to_owned();
    let (reply, n) = {
        let mut shared = shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        shared.requests.push(request);
        shared.served += 1;
        if main {
            shared.main_count.send_modify(|count| *count += 1);
        }
        let reply = if main { shared.script.pop_front() } else { None };
        (reply.unwrap_or_else(|| Reply::Text("scripted reply".into())), shared.served)
    };
    let responses = path.starts_with("/v1/responses");
    let gemini = path.starts_with("/v1beta/models/");
    let chat = path.starts_with("/v1/chat/completions");
    if method != "POST" || !(path.starts_with("/v1/messages") || responses || gemini || chat) {
        return respond(&mut stream, "404 Not Found", "application/json", b"{}").await;
    }
    if path.contains("count_tokens") {
        return respond(&mut stream, "200 OK", "application/json", br#"{"input_tokens":10}"#).await;
    }
    let reply = match reply {
        Reply::Held(release, then) => {
            let mut byte = [0u8; 1];
            tokio::select! {
                () = release.notified() => *then,
                // The client gave up on it (it closed its side).
                _ = stream.read(&mut byte) => return Ok(()),
            }
        }
        other => other,
    };
    if matches!(reply, Reply::Hang) {
        // Held until the client closes its side.
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest).await;
        return Ok(());
    }
    if gemini && !main {
        // A side call with a JSON schema (gemini-cli choosing a model): the lowest score.
        let text = r#"{"complexity_reasoning":"scripted","complexity_score":0}"#;
        let body = json!({"candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": "STOP", "index": 0}]});
        return respond(&mut stream, "200 OK", "application/json", body.to_string().as_bytes())
            .await;
    }
    if chat && streamed {
        let events = chat_events(&reply, &model, n);
        return respond(&mut stream, "200 OK", "text/event-stream", events.as_bytes()).await;
    }
    if chat {
        let body = chat_completion(&reply, &model, n);
        return respond(&mut stream, "200 OK", "application/json", body.to_string().as_bytes())
            .await;
    }
    if gemini {
        let events = gemini_events(&reply, n);
        return respond(&mut stream, "200 OK", "text/event-stream", events.as_bytes()).await;
    }
    if responses {
        let reply = if main { reply } else { Reply::Text(r#"{"title":"Scripted title"}"#.into()) };
        let events = response_events(&reply, n);
        return respond(&mut stream, "200 OK", "text/event-stream", events.as_bytes()).await;
    }
    if streamed {
        let events = stream_events(&reply, &model, n);
        respond(&mut stream, "200 OK", "text/event-stream", events.as_bytes()).await
    } else {
        let message = whole_message(&reply, &model, n);
        respond(&mut stream, "200 OK", "application/json", message.to_string().as_bytes()).await
    }
}

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    stream.shutdown().await
}

fn usage() -> Value {
    json!({"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0})
}

fn whole_message(reply: &Reply, model: &str, n: u64) -> Value {
    let (content, stop) = match reply {
        Reply::Text(text) => (json!([{"type": "text", "text": text}]), "end_turn"),
        Reply::Hang | Reply::Held(..) => (json!([]), "end_turn"),
        Reply::ToolUse { name, input } => (
            json!([{"type": "tool_use", "id": format!("toolu_{n}"), "name": name, "input": input}]),
            "tool_use",
        ),
    };
    json!({
        "id": format!("msg_{n}"), "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": stop, "stop_sequence": null, "usage": usage(),
    })
}

fn stream_events(reply: &Reply, model: &str, n: u64) -> String {
    let mut out = String::new();
    let mut event = |name: &str, data: Value| {
        out.push_str(&format!("event: {name}\ndata: {data}\n\n"));
    };
    let mut start = whole_message(reply, model, n);
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    event("message_start", json!({"type": "message_start", "message": start}));
    let stop = match reply {
        Reply::Hang | Reply::Held(..) => "end_turn",
        Reply::Text(text) => {
            event(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            );
            // A few deltas, split on spaces, so the agent streams chunks.
            let words: Vec<&str> = text.split_inclusive(' ').collect();
            for piece in words.chunks(3) {
                event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece.concat()}}),
                );
            }
            "end_turn"
        }
        Reply::ToolUse { name, input } => {
            event(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": format!("toolu_{n}"), "name": name, "input": {}}}),
            );
            event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": input.to_string()}}),
            );
            "tool_use"
        }
    };
    event("content_block_stop", json!({"type": "content_block_stop", "index": 0}));
    event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 5}}),
    );
    event("message_stop", json!({"type": "message_stop"}));
    out
}

/// A streamed OpenAI Responses answer: the message item added, its text in deltas, the
/// item done (codex keeps only what `output_item.done` carries), and the response
/// completed with its id.
fn response_events(reply: &Reply, n: u64) -> String {
    let mut out = String::new();
    let mut event = |data: Value| {
        out.push_str(&format!("event: {}\ndata: {data}\n\n", data["type"].as_str().unwrap_or("")));
    };
    let id = format!("resp_{n}");
    let item = format!("msg_{n}");
    event(json!({"type": "response.created", "response": {"id": id}}));
    let text = match reply {
        Reply::Text(text) => text.clone(),
        Reply::Hang | Reply::Held(..) => String::new(),
        Reply::ToolUse { name, .. } => format!("(the scripted model cannot call {name} here)"),
    };
    event(json!({
        "type": "response.output_item.added", "output_index": 0,
        "item": {"type": "message", "id": item, "role": "assistant", "status": "in_progress", "content": []},
    }));
    let words: Vec<&str> = text.split_inclusive(' ').collect();
    for piece in words.chunks(3) {
        event(json!({
            "type": "response.output_text.delta", "item_id": item, "output_index": 0,
            "content_index": 0, "delta": piece.concat(),
        }));
    }
    event(json!({
        "type": "response.output_item.done", "output_index": 0,
        "item": {
            "type": "message", "id": item, "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        },
    }));
    event(json!({
        "type": "response.completed",
        "response": {"id": id, "usage": {
            "input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 15,
        }},
    }));
    out
}

/// A streamed Gemini answer: the text in a few chunks, the last with `finishReason` (the
/// CLI retries a stream that ends without one); a tool call is one `functionCall` part.
fn gemini_events(reply: &Reply, n: u64) -> String {
    let text = match reply {
        Reply::Text(text) => text.clone(),
        Reply::Hang | Reply::Held(..) => String::new(),
        Reply::ToolUse { name, input } => {
            let chunk = json!({
                "candidates": [{
                    "content": {"role": "model", "parts": [{"functionCall": {"name": name, "args": input}}]},
                    "finishReason": "STOP", "index": 0,
                }],
                "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
                "modelVersion": "scripted-model", "responseId": format!("resp-{n}"),
            });
            return format!("data: {chunk}\r\n\r\n");
        }
    };
    let words: Vec<&str> = text.split_inclusive(' ').collect();
    let pieces: Vec<String> = words.chunks(3).map(|piece| piece.concat()).collect();
    let mut out = String::new();
    for (index, piece) in pieces.iter().enumerate() {
        let mut chunk = json!({
            "candidates": [{"content": {"role": "model", "parts": [{"text": piece}]}, "index": 0}],
            "modelVersion": "scripted-model", "responseId": format!("resp-{n}"),
        });
        if index + 1 == pieces.len() {
            chunk["candidates"][0]["finishReason"] = json!("STOP");
            chunk["usageMetadata"] =
                json!({"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15});
        }
        out.push_str(&format!("data: {chunk}\r\n\r\n"));
    }
    out
}

/// The choice of a Chat Completions answer: its message (text, or one tool call) and its
/// finish reason.
fn chat_message(reply: &Reply, n: u64) -> (Value, &'static str) {
    match reply {
        Reply::Text(text) => (json!({"role": "assistant", "content": text}), "stop"),
        Reply::Hang | Reply::Held(..) => (json!({"role": "assistant", "content": ""}), "stop"),
        Reply::ToolUse { name, input } => (
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": format!("call_{n}"), "type": "function",
                "function": {"name": name, "arguments": input.to_string()},
            }]}),
            "tool_calls",
        ),
    }
}

fn chat_usage() -> Value {
    json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
}

/// A whole Chat Completions answer (`stream` not asked for).
fn chat_completion(reply: &Reply, model: &str, n: u64) -> Value {
    let (message, finish) = chat_message(reply, n);
    json!({
        "id": format!("chatcmpl-{n}"), "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": chat_usage(),
    })
}

/// A streamed Chat Completions answer: the text in a few deltas (or the tool call in
/// one), then the finish reason with the usage, then `[DONE]`.
fn chat_events(reply: &Reply, model: &str, n: u64) -> String {
    let mut out = String::new();
    let mut chunk = |delta: Value, finish: Option<&str>, usage: Option<Value>| {
        let mut data = json!({
            "id": format!("chatcmpl-{n}"), "object": "chat.completion.chunk", "created": 0,
            "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        if let Some(usage) = usage {
            data["usage"] = usage;
        }
        out.push_str(&format!("data: {data}\n\n"));
    };
    let (message, finish) = chat_message(reply, n);
    match reply {
        Reply::ToolUse { .. } => {
            let mut call = message["tool_calls"][0].clone();
            call["index"] = json!(0);
            chunk(json!({"role": "assistant", "tool_calls": [call]}), None, None);
        }
        Reply::Text(text) => {
            let words: Vec<&str> = text.split_inclusive(' ').collect();
            for (index, piece) in words.chunks(3).enumerate() {
                let mut delta = json!({"content": piece.concat()});
                if index == 0 {
                    delta["role"] = json!("assistant");
                }
                chunk(delta, None, None);
            }
        }
        Reply::Hang | Reply::Held(..) => {}
    }
    chunk(json!({}), Some(finish), Some(chat_usage()));
    out.push_str("data: [DONE]\n\n");
    out
}
