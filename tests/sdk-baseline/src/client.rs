//! `sdk-client`: the official Rust ACP SDK (`agent-client-protocol` 5.2.0) as the ACP client
//! of an agent process, driven by a test over JSON lines. It lives here, outside the Tether
//! workspace, because that SDK pins its schema crate exactly (`=1.17.0`) and Tether uses
//! the current one: in one build graph the two cannot meet, across a pipe they need not.
//!
//! Every message to the agent goes through the SDK as its typed request (the test's params
//! are read into the SDK's type first, so a test cannot send what the SDK would not), and
//! every message from it is what the SDK parsed, written back out.
//!
//! ```text
//! sdk-client [--env NAME=VALUE]... -- AGENT_PROGRAM [AGENT_ARGS...]
//! ```
//!
//! On stdin, one JSON object a line:
//! - `{"call": N, "method": M, "params": P}`: the request M (`initialize`, `session/new`,
//!   `session/prompt`, `session/load`, `session/list`, `session/resume`, `session/close`,
//!   `session/set_mode`, `session/set_config_option`); calls run concurrently;
//! - `{"notify": "session/cancel", "params": P}`.
//!
//! On stdout, one JSON object a line:
//! - `{"answer": N, "result": R}` or `{"answer": N, "error": E}`;
//! - `{"update": P}`: a `session/update` notification's params;
//! - `{"permission": P, "chose": OPTION_ID}`: a `session/request_permission`, answered with
//!   its first `allow_once` option (else cancelled, `"chose": null`).
//!
//! It exits when stdin closes and the calls in flight are answered (the agent's stdin is
//! then closed and the agent killed); 2 on bad arguments, 1 when the connection fails.

use std::process::ExitCode;

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    CancelNotification, CloseSessionRequest, InitializeRequest, ListSessionsRequest,
    LoadSessionRequest, NewSessionRequest, PermissionOptionKind, PromptRequest,
    RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
    ResumeSessionRequest, SelectedPermissionOutcome, SessionNotification,
    SetSessionConfigOptionRequest, SetSessionModeRequest,
};
use agent_client_protocol::{Agent, Client};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

mod agent;

const USAGE: &str = "usage: sdk-client [--env NAME=VALUE]... -- AGENT_PROGRAM [AGENT_ARGS...]";

struct Args {
    env: Vec<(String, String)>,
    agent: Vec<String>,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut env = Vec::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--env" => {
                let pair = args.next().ok_or("--env needs NAME=VALUE")?;
                let (name, value) = pair.split_once('=').ok_or(format!("--env {pair}: no '='"))?;
                env.push((name.to_owned(), value.to_owned()));
            }
            "--" => break,
            other => return Err(format!("unexpected argument: {other}")),
        }
    }
    let agent: Vec<String> = args.collect();
    if agent.is_empty() {
        return Err("no agent program after --".into());
    }
    Ok(Args { env, agent })
}

/// The SDK's answer to one call, as JSON: its typed response, or its error.
async fn call(cx: &ConnectionTo<Agent>, method: &str, params: Value) -> Value {
    macro_rules! typed {
        ($request:ty) => {{
            match serde_json::from_value::<$request>(params) {
                Err(err) => Err(json!({
                    "message": format!("the params do not read as the SDK's {}: {err}", stringify!($request)),
                })),
                Ok(request) => match cx.send_request(request).block_task().await {
                    Ok(response) => Ok(serde_json::to_value(response).expect("a response serialises")),
                    Err(err) => Err(serde_json::to_value(err).expect("an error serialises")),
                },
            }
        }};
    }
    let answer = match method {
        "initialize" => typed!(InitializeRequest),
        "session/new" => typed!(NewSessionRequest),
        "session/prompt" => typed!(PromptRequest),
        "session/load" => typed!(LoadSessionRequest),
        "session/list" => typed!(ListSessionsRequest),
        "session/resume" => typed!(ResumeSessionRequest),
        "session/close" => typed!(CloseSessionRequest),
        "session/set_mode" => typed!(SetSessionModeRequest),
        "session/set_config_option" => typed!(SetSessionConfigOptionRequest),
        other => Err(json!({"message": format!("sdk-client does not send {other}")})),
    };
    match answer {
        Ok(result) => json!({"result": result}),
        Err(error) => json!({"error": error}),
    }
}

async fn run(args: Args) -> Result<(), String> {
    let (child, streams) = agent::start(&args.agent, &args.env)?;

    // One writer of stdout: every line whole, in the order it was made.
    let (out, mut lines) = mpsc::unbounded_channel::<Value>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = lines.recv().await {
            let mut text = line.to_string();
            text.push('\n');
            if stdout.write_all(text.as_bytes()).await.is_err() || stdout.flush().await.is_err() {
                return;
            }
        }
    });
    let updates = out.clone();
    let permissions = out.clone();
    let outcome = Client
        .v1()
        .name("sdk-client")
        .on_receive_notification(
            async move |notification: SessionNotification, _cx| {
                let params = serde_json::to_value(notification).expect("it serialises");
                let _ = updates.send(json!({"update": params}));
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: RequestPermissionRequest, responder, _cx| {
                let allow = request
                    .options
                    .iter()
                    .find(|option| option.kind == PermissionOptionKind::AllowOnce)
                    .map(|option| option.option_id.clone());
                let params = serde_json::to_value(&request).expect("it serialises");
                let _ = permissions.send(json!({"permission": params, "chose": allow}));
                responder.respond(RequestPermissionResponse::new(match allow {
                    Some(id) => {
                        RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id))
                    }
                    None => RequestPermissionOutcome::Cancelled,
                }))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(streams, async |cx: ConnectionTo<Agent>| {
            let mut input = tokio::io::BufReader::new(tokio::io::stdin()).lines();
            let mut calls = tokio::task::JoinSet::new();
            while let Some(line) = input.next_line().await.ok().flatten() {
                let Ok(message) = serde_json::from_str::<Value>(&line) else {
                    eprintln!("sdk-client: not JSON: {line}");
                    continue;
                };
                let params = message.get("params").cloned().unwrap_or(Value::Null);
                if let Some(id) = message.get("call").cloned() {
                    let method = message["method"].as_str().unwrap_or_default().to_owned();
                    let (cx, out) = (cx.clone(), out.clone());
                    calls.spawn(async move {
                        let mut answer = call(&cx, &method, params).await;
                        answer["answer"] = id;
                        let _ = out.send(answer);
                    });
                } else if message["notify"] == "session/cancel" {
                    match serde_json::from_value::<CancelNotification>(params) {
                        Ok(cancel) => cx.send_notification(cancel)?,
                        Err(err) => eprintln!("sdk-client: a cancel that does not read: {err}"),
                    }
                } else {
                    eprintln!("sdk-client: neither a call nor a cancel: {line}");
                }
            }
            // Stdin closed: the calls in flight are answered first.
            while calls.join_next().await.is_some() {}
            Ok(())
        })
        .await;
    drop(out);
    let _ = writer.await;
    agent::finish(child, outcome).await
}

fn main() -> ExitCode {
    let args = match agent::args_or_usage("sdk-client", USAGE, parse_args(std::env::args().skip(1)))
    {
        Ok(args) => args,
        Err(code) => return code,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("cannot build the tokio runtime");
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sdk-client: {e}");
            ExitCode::FAILURE
        }
    }
}
