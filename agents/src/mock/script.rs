//! The commands a prompt can carry: each line that starts with `/` is a command, the other
//! lines are the message. Parsing is pure, so it is tested here without a process.

use std::fmt;

/// One command from a prompt line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `/stream N`: send the reply as N `agent_message_chunk`s.
    Stream(u32),
    /// `/tool`: report a tool call (`tool_call`, then `tool_call_update`s to `completed`).
    Tool,
    /// `/permission`: ask `session/request_permission` before running the tool.
    Permission,
    /// `/permission-always-first`: ask as `/permission` does, offering the "always"
    /// options first (as gemini-cli and Zed's Claude adapter order them).
    PermissionAlwaysFirst,
    /// `/permission-only`: ask as `/permission` does, the tool announced only inside the
    /// question (as some agents do), never by a `tool_call` update before it.
    PermissionOnly,
    /// `/read PATH`: ask the client for a file with `fs/read_text_file`.
    Read(String),
    /// `/say TEXT`: the reply is exactly TEXT (`\n` in it a newline), for callers that
    /// feed it on (a workflow step's output: a chosen text, a score, a JSON list).
    Say(String),
    /// `/peek PATH`: read a file directly, as any process of the agent's user could (what
    /// an agent that goes looking for secrets does).
    Peek(String),
    /// `/connect HOST:PORT`: open a TCP connection directly, as any process of the agent
    /// could (what an agent that sends what it read elsewhere does).
    Connect(String),
    /// `/fetch http://HOST:PORT/PATH`: a plain HTTP GET, through `http_proxy` when it is
    /// set (as a real agent's HTTP client does); the reply holds the answer's status line and
    /// body (a probe for images without a shell).
    Fetch(String),
    /// `/sh COMMAND`: run COMMAND with `sh -c` as the agent's own child (a probe of what the
    /// agent's processes can do); the reply holds its exit status and output.
    Sh(String),
    /// `/write PATH TEXT`: ask the client to write TEXT with `fs/write_text_file`.
    Write(String, String),
    /// `/sleep MS`: a slow turn; `session/cancel` ends it early with stop reason `cancelled`.
    Sleep(u64),
    /// `/crash [CODE]`: send one chunk, print to stderr and exit mid-turn (default code 3).
    Crash(i32),
    /// `/edit PATH TEXT`: report an edit as claude-agent-acp does: a `tool_call` with a
    /// placeholder title, then updates that give the real title, a diff and raw output
    /// (nothing is written).
    Edit(String, String),
    /// `/patch PATH TEXT`: report an edit as opencode does: a `tool_call` titled with the
    /// tool's name, completed by an update titled with the file's path.
    Patch(String, String),
    /// `/blob N KB`: send N agent message chunks of KB kilobytes each (few, large events).
    Blob(u32, u32),
    /// `/close-stdout`: send one chunk, then close stdout and stay up, answering nothing
    /// more (an agent whose output is gone but whose process lives).
    CloseStdout,
    /// `/garbage`: print a non-JSON line and an invalid UTF-8 line on stdout, then go on.
    Garbage,
    /// `/stderr TEXT`: print TEXT on stderr.
    Stderr(String),
    /// `/recall`: list the earlier user messages of the session in the reply.
    Recall,
    /// `/settings`: the reply is the session's model and mode (`model=M mode=X`).
    Settings,
    /// `/elicit TEXT`: ask the client for a name with an ACP `elicitation/create` form
    /// (TEXT its message); the reply says how it was answered.
    Elicit(String),
    /// `/withdraw`: ask as `/elicit` does, then withdraw the question at once
    /// (`$/cancel_request`) and go on without an answer.
    Withdraw,
    /// `/spawn`: start a long-lived child process (`sleep`) and name its pid in the reply.
    Spawn,
    /// `/escape`: like `/spawn`, the child in a process group of its own (out of the
    /// agent's, as a daemonising tool does).
    Escape,
    /// `/rounds R`: before the reply, R−1 rounds of a streamed message (as many chunks as
    /// `/stream` says, each ` <rK:n/N>`) closed by a tool call, so one turn holds many
    /// messages.
    Rounds(u32),
    /// `/usage USED SIZE [COST]`: report context use with an ACP `usage_update` (and a
    /// cumulative cost in USD when given).
    Usage { used: u64, size: u64, cost: Option<String> },
    /// `/tokens IN OUT [CACHED]`: the turn's answer reports these tokens (ACP
    /// `PromptResponse.usage`).
    Tokens { input: u64, output: u64, cached: u64 },
    /// `/think TEXT`: send TEXT as an `agent_thought_chunk` (`\n` in it a newline).
    Think(String),
    /// `/plan A; B; C`: send an ACP `plan` with those entries, the first completed, the
    /// second in progress, the rest pending.
    Plan(Vec<String>),
    /// `/diff PATH OLD => NEW`: report an edit of PATH from OLD to NEW (`\n` newlines) as a
    /// tool call with ACP `diff` content and its location (nothing is written).
    Diff { path: String, old: String, new: String },
    /// `/exec COMMAND`: report a command run as a tool call that fails with output and
    /// exit code 1 (nothing is run).
    Exec(String),
    /// `/then PROMPT`: the session's next prompt, whatever it says, is answered as if it
    /// were PROMPT (`\n` in it a newline): how a test scripts the answer to a prompt it
    /// does not write (the supervisor's summary request at a pause).
    Then(String),
}

/// A prompt split into commands and the message proper.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Script {
    /// Commands in the order they appeared.
    pub commands: Vec<Command>,
    /// The non-command lines, joined by newlines.
    pub message: String,
}

/// A command line that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptError {
    /// The offending line.
    pub line: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl fmt::Display for ScriptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad command {:?}: {}", self.line, self.reason)
    }
}

impl std::error::Error for ScriptError {}

/// Splits a prompt into commands and message. A line with an unknown `/word` is part of
/// the message (prompts may legitimately start with a slash); a known command with bad
/// arguments is an error.
pub fn parse(prompt: &str) -> Result<Script, ScriptError> {
    let mut script = Script::default();
    let mut message = Vec::new();
    for line in prompt.lines() {
        match parse_command(line) {
            Ok(Some(command)) => script.commands.push(command),
            Ok(None) => message.push(line),
            Err(reason) => return Err(ScriptError { line: line.to_owned(), reason }),
        }
    }
    script.message = message.join("\n");
    Ok(script)
}

fn parse_command(line: &str) -> Result<Option<Command>, &'static str> {
    // Only at the very start of a line: an indented `/word` (a quoted earlier prompt in a
    // resume context) is message text.
    let Some(rest) = line.trim_end().strip_prefix('/') else { return Ok(None) };
    let (word, args) = rest.split_once(' ').map_or((rest, ""), |(w, a)| (w, a.trim()));
    let command = match word {
        "stream" => Command::Stream(match args.parse() {
            Ok(n) if n > 0 => n,
            _ => return Err("expects a positive chunk count"),
        }),
        "tool" => Command::Tool,
        "permission" => Command::Permission,
        "permission-always-first" => Command::PermissionAlwaysFirst,
        "permission-only" => Command::PermissionOnly,
        "read" if args.is_empty() => return Err("expects a path"),
        "read" => Command::Read(args.to_owned()),
        "say" => Command::Say(args.replace("\\n", "\n")),
        "peek" if args.is_empty() => return Err("expects a path"),
        "peek" => Command::Peek(args.to_owned()),
        "connect" if args.is_empty() => return Err("expects host:port"),
        "connect" => Command::Connect(args.to_owned()),
        "fetch" if !args.starts_with("http://") => return Err("expects an http:// URL"),
        "fetch" => Command::Fetch(args.to_owned()),
        "sh" if args.is_empty() => return Err("expects a command"),
        "sh" => Command::Sh(args.to_owned()),
        "write" => match args.split_once(' ') {
            Some((path, text)) => Command::Write(path.to_owned(), text.to_owned()),
            None => return Err("expects a path and text"),
        },
        "sleep" => Command::Sleep(args.parse().map_err(|_| "expects milliseconds")?),
        "crash" if args.is_empty() => Command::Crash(3),
        "crash" => Command::Crash(args.parse().map_err(|_| "expects an exit code")?),
        "garbage" => Command::Garbage,
        "close-stdout" => Command::CloseStdout,
        "blob" => match args.split_once(' ').map(|(n, kb)| (n.parse(), kb.parse())) {
            Some((Ok(n), Ok(kb))) if n > 0 && kb > 0 => Command::Blob(n, kb),
            _ => return Err("expects a chunk count and kilobytes per chunk"),
        },
        "edit" | "patch" => match args.split_once(' ') {
            Some((path, text)) if word == "edit" => Command::Edit(path.to_owned(), text.to_owned()),
            Some((path, text)) => Command::Patch(path.to_owned(), text.to_owned()),
            None => return Err("expects a path and text"),
        },
        "stderr" => Command::Stderr(args.to_owned()),
        "recall" => Command::Recall,
        "settings" => Command::Settings,
        "elicit" => Command::Elicit(args.to_owned()),
        "withdraw" => Command::Withdraw,
        "spawn" => Command::Spawn,
        "escape" => Command::Escape,
        "rounds" => Command::Rounds(match args.parse() {
            Ok(n) if n > 0 => n,
            _ => return Err("expects a positive round count"),
        }),
        "usage" => {
            let mut words = args.split_whitespace();
            let mut number = || words.next().and_then(|word| word.parse::<u64>().ok());
            let (Some(used), Some(size)) = (number(), number()) else {
                return Err("expects USED SIZE [COST]");
            };
            let cost = match words.next() {
                Some(cost) if cost.parse::<f64>().is_ok() => Some(cost.to_owned()),
                Some(_) => return Err("expects USED SIZE [COST]"),
                None => None,
            };
            Command::Usage { used, size, cost }
        }
        "tokens" => {
            let numbers: Vec<Option<u64>> =
                args.split_whitespace().map(|w| w.parse().ok()).collect();
            match numbers[..] {
                [Some(input), Some(output)] => Command::Tokens { input, output, cached: 0 },
                [Some(input), Some(output), Some(cached)] => {
                    Command::Tokens { input, output, cached }
                }
                _ => return Err("expects IN OUT [CACHED]"),
            }
        }
        "think" => Command::Think(args.replace("\\n", "\n")),
        "plan" => Command::Plan(
            args.split(';').map(str::trim).filter(|e| !e.is_empty()).map(str::to_owned).collect(),
        ),
        "diff" => {
            match args.split_once(' ').and_then(|(p, rest)| Some((p, rest.split_once(" => ")?))) {
                Some((path, (old, new))) => Command::Diff {
                    path: path.to_owned(),
                    old: old.replace("\\n", "\n"),
                    new: new.replace("\\n", "\n"),
                },
                None => return Err("expects PATH OLD => NEW"),
            }
        }
        "exec" if args.is_empty() => return Err("expects a command"),
        "exec" => Command::Exec(args.to_owned()),
        "then" if args.is_empty() => return Err("expects a prompt"),
        "then" => Command::Then(args.replace("\\n", "\n")),
        _ => return Ok(None),
    };
    Ok(Some(command))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn then_keeps_its_prompt_with_newlines() {
        let script = parse("/then /say {\"a\": 1}\\n/sleep 5").unwrap();
        assert_eq!(script.commands, vec![Command::Then("/say {\"a\": 1}\n/sleep 5".into())]);
        assert_eq!(parse("/then").unwrap_err().reason, "expects a prompt");
    }

    #[test]
    fn commands_and_message_are_separated() {
        let script =
            parse("/stream 5\nhello\n/tool\n/permission\nworld\n/sleep 20\n/crash\n/crash 7")
                .unwrap();
        assert_eq!(
            script.commands,
            vec![
                Command::Stream(5),
                Command::Tool,
                Command::Permission,
                Command::Sleep(20),
                Command::Crash(3),
                Command::Crash(7)
            ]
        );
        assert_eq!(script.message, "hello\nworld");
    }

    #[test]
    fn rich_updates_are_parsed() {
        let script = parse(
            "/think a\\nb\n/plan read; edit ;test;\n/diff src/a.rs x\\ny => x\\nz\n/exec cargo test",
        )
        .unwrap();
        assert_eq!(
            script.commands,
            vec![
                Command::Think("a\nb".into()),
                Command::Plan(vec!["read".into(), "edit".into(), "test".into()]),
                Command::Diff { path: "src/a.rs".into(), old: "x\ny".into(), new: "x\nz".into() },
                Command::Exec("cargo test".into()),
            ]
        );
        assert!(parse("/diff src/a.rs no arrow").is_err());
        assert!(parse("/exec").is_err());
    }

    #[test]
    fn say_sets_the_reply_with_escaped_newlines() {
        let script = parse("/say [\"a\", \"b\"]\\nscore: 0.9\nignored").unwrap();
        assert_eq!(script.commands, vec![Command::Say("[\"a\", \"b\"]\nscore: 0.9".into())]);
        assert_eq!(script.message, "ignored");
    }

    #[test]
    fn arguments_are_parsed() {
        let script = parse(
            "/read /tmp/a b\n/write /tmp/x some text\n/stderr oops\n/recall\n/spawn\n/garbage",
        )
        .unwrap();
        assert_eq!(
            script.commands,
            vec![
                Command::Read("/tmp/a b".into()),
                Command::Write("/tmp/x".into(), "some text".into()),
                Command::Stderr("oops".into()),
                Command::Recall,
                Command::Spawn,
                Command::Garbage,
            ]
        );
    }

    #[test]
    fn unknown_slash_words_are_message_text() {
        let script = parse("/usr/bin is a directory").unwrap();
        assert!(script.commands.is_empty());
        assert_eq!(script.message, "/usr/bin is a directory");
        let quoted = parse("Turn 1: hello\n    /permission").unwrap();
        assert!(quoted.commands.is_empty(), "an indented command is quoted text");
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert_eq!(parse("/stream 0").unwrap_err().reason, "expects a positive chunk count");
        assert_eq!(parse("/sleep soon").unwrap_err().reason, "expects milliseconds");
        assert_eq!(parse("/write /only-a-path").unwrap_err().reason, "expects a path and text");
        assert_eq!(parse("/read").unwrap_err().reason, "expects a path");
        assert_eq!(parse("/rounds 0").unwrap_err().reason, "expects a positive round count");
        assert_eq!(parse("/rounds 3").unwrap().commands, vec![Command::Rounds(3)]);
        assert_eq!(parse("/usage 90").unwrap_err().reason, "expects USED SIZE [COST]");
        assert_eq!(
            parse("/tokens 10 2").unwrap().commands,
            vec![Command::Tokens { input: 10, output: 2, cached: 0 }]
        );
        assert_eq!(parse("/tokens 10").unwrap_err().reason, "expects IN OUT [CACHED]");
        assert_eq!(parse("/usage 9 10 cheap").unwrap_err().reason, "expects USED SIZE [COST]");
        assert_eq!(
            parse("/usage 90 100 0.25").unwrap().commands,
            vec![Command::Usage { used: 90, size: 100, cost: Some("0.25".into()) }]
        );
    }
}
