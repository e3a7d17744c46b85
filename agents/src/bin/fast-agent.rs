//! `fast-agent`: the smallest ACP agent that streams, for benchmarks. It answers
//! `initialize`, `session/new` and `session/prompt`; a prompt `/stream N` is answered with N
//! `agent_message_chunk` updates and then `end_turn`, anything else with one chunk. Every
//! line is formatted in place into one buffered stdout, flushed once per turn, so the agent
//! costs next to nothing and a relay's own limit shows (`mock-agent` spends 17–25 µs a line).
//!
//! `/stream N R` paces the chunks at R a second instead, flushing each one, with the time it
//! was written (`at <Unix µs>`) in its text: for latency at a fixed rate.
//!
//! A `+usage` word (`/stream N +usage`) also reports usage as a metered agent does: a
//! `usage_update` with a growing cumulative cost every 100 chunks, and the turn's tokens in
//! its answer (the accounting benchmark's load); `+plan` sends an empty `plan` update
//! instead, the same events unaccounted (its baseline).
//!
//! Blocking I/O on one thread: a turn runs to its end before the next line is read, so a
//! `session/cancel` arriving meanwhile is read after it (and ignored).

use std::io::{BufRead, BufWriter, Write};

use serde_json::{Value, json};

fn main() {
    let stdin = std::io::stdin().lock();
    let mut out = BufWriter::with_capacity(256 * 1024, std::io::stdout().lock());
    let mut sessions = 0u64;
    for line in stdin.lines() {
        let Ok(line) = line else { return };
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            eprintln!("fast-agent: ignoring a line that is not JSON");
            continue;
        };
        let (Some(id), Some(method)) = (message.get("id"), message["method"].as_str()) else {
            continue; // a notification (session/cancel) or a response: nothing to answer
        };
        let result = match method {
            "initialize" => json!({
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": false},
                "authMethods": [],
                "agentInfo": {"name": "fast-agent", "version": env!("CARGO_PKG_VERSION")},
            }),
            "session/new" => {
                sessions += 1;
                json!({"sessionId": format!("fast-{}-{sessions}", std::process::id())})
            }
            "session/prompt" => {
                let session = message["params"]["sessionId"].as_str().unwrap_or_default();
                let text = message["params"]["prompt"][0]["text"].as_str().unwrap_or_default();
                let metered = text.split_whitespace().any(|word| word == "+usage");
                let planned = text.split_whitespace().any(|word| word == "+plan");
                let mut words = text.strip_prefix("/stream ").unwrap_or("1").split_whitespace();
                let count = words.next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(1);
                let rate = words.next().and_then(|r| r.parse::<u64>().ok()).filter(|&r| r > 0);
                // The session id is a JSON string already escaped once, reused for every line.
                let session = serde_json::to_string(session).expect("UNWRAP: a str serialises");
                let started = std::time::Instant::now();
                for n in 1..=count {
                    let written = match rate {
                        None => writeln!(
                            out,
                            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":{session},"update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"chunk {n} "}}}}}}}}"#
                        ),
                        Some(rate) => {
                            // Load generation, not synchronisation: chunk n is due at n/R s.
                            let due = started
                                + std::time::Duration::from_secs_f64(n as f64 / rate as f64);
                            std::thread::sleep(
                                due.saturating_duration_since(std::time::Instant::now()),
                            );
                            let at = std::time::SystemTime::now()
                                .duration_since(std::time::UNIX_EPOCH)
                                .map_or(0, |since| since.as_micros());
                            writeln!(
                                out,
                                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":{session},"update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"chunk {n} at {at} "}}}}}}}}"#
                            )
                            .and_then(|()| out.flush())
                        }
                    };
                    let metered = if metered && n % 100 == 0 {
                        writeln!(
                            out,
                            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":{session},"update":{{"sessionUpdate":"usage_update","used":{n},"size":1000000000,"cost":{{"amount":{},"currency":"USD"}}}}}}}}"#,
                            n as f64 / 1e6
                        )
                    } else if planned && n % 100 == 0 {
                        writeln!(
                            out,
                            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":{session},"update":{{"sessionUpdate":"plan","entries":[]}}}}}}"#
                        )
                    } else {
                        Ok(())
                    };
                    if written.and(metered).is_err() {
                        return;
                    }
                }
                match metered {
                    true => json!({"stopReason": "end_turn", "usage": {"inputTokens": count,
                        "outputTokens": count, "totalTokens": 2 * count}}),
                    false => json!({"stopReason": "end_turn"}),
                }
            }
            other => {
                let error = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": format!("method not found: {other}")}});
                if writeln!(out, "{error}").and_then(|()| out.flush()).is_err() {
                    return;
                }
                continue;
            }
        };
        let response = json!({"jsonrpc": "2.0", "id": id, "result": result});
        if writeln!(out, "{response}").and_then(|()| out.flush()).is_err() {
            return;
        }
    }
}
