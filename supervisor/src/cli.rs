//! The `supervisor` command line (clap): `serve` runs the daemon; every other command is a
//! typed client (`protocol::api::ApiClient`) of a running daemon and prints plain,
//! specific lines, or JSON with `--json` on the commands that read.
//!
//! Files: this one holds the command line's shape, the exit codes and the dispatch;
//! `serve.rs` the daemon's wiring; `client.rs` the client commands; `feed.rs` a session's
//! events as a client follows them; `face.rs` the ACP face (`supervisor acp`); `output.rs` what the commands print; `workflow.rs`
//! the `workflow` commands.

mod client;
mod engines;
mod face;
mod feed;
mod here;
mod output;
mod questions;
mod queue;
mod review;
mod serve;
mod settings;
mod workflow;

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agents::registry::{DEFAULT_DEBOUNCE, Environment, Registry};
use anyhow::{Context, bail};
use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use jsonrpsee::core::client::Subscription;
use jsonrpsee::ws_client::{WsClient, WsClientBuilder};
use protocol::acp::schema as acp;
use protocol::api::{
    ApiClient, ErrorKind, EventKind, LaunchStep, ResumeOutcome, ResumeResult, RuntimeKind,
    SessionEvent, SessionState, TurnState,
};
use serde::{Deserialize, Serialize};

use crate::api::{self, AccessPolicy};
use crate::home::Home;
use crate::runtime::docker::{DockerConfig, DockerRuntime};
use crate::runtime::{Runtimes, StandaloneRuntime};
use crate::service::{Supervisor, SupervisorConfig};
use crate::store::Store;

use client::{Client, MAX_EMPTY_RESUBSCRIBES, Target, call_failure};
use feed::Feed;
use output::{
    AcpUpdate, Shown, Waiting, ago, describe, or_dash, permission_lines, print_fields, print_json,
    session_usage_line, sessions_json, since_ms, timeline_lines, usage_line,
};
use serve::serve;
use workflow::WorkflowCommand;

/// The default API address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7733";

const EXIT_CODES: &str = "\
Exit codes: 0 ok, 1 error, 2 usage, 3 server not running, 4 not found, 5 conflict (the
session has ended), 6 refused (a missing or wrong token), 7 busy (the daemon has no room
for another connection).";

/// How long a client command waits for a daemon that went away (a restart) to answer
/// again before it gives up.
const RECONNECT_WINDOW: Duration = Duration::from_secs(60);

#[derive(Parser, Debug)]
#[command(
    name = "supervisor",
    version,
    about = "Tether: a supervisor for coding agents that speak ACP.",
    after_help = EXIT_CODES
)]
struct Cli {
    /// The daemon's API address (client commands).
    #[arg(long, env = "TETHER_URL", value_name = "URL")]
    url: Option<String>,
    /// The daemon's bearer token (client commands).
    #[arg(long, env = "TETHER_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    token: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the daemon. It leaves agent sidecars running when it gets SIGTERM, so a restart
    /// loses nothing; it re-attaches them when it starts again.
    #[command(args_override_self = true)]
    Serve(ServeArgs),
    /// List the agent profiles and whether each can run here.
    Agents(JsonFlag),
    /// Tasks.
    #[command(subcommand)]
    Task(TaskCommand),
    /// Start sessions.
    #[command(subcommand)]
    Session(SessionCommand),
    /// List, show and delete sessions.
    #[command(subcommand)]
    Sessions(SessionsCommand),
    /// List and read a session's snapshots.
    #[command(subcommand)]
    Snapshots(SnapshotsCommand),
    /// Run workflows: tasks as chains or graphs of agent steps (docs/workflows.md).
    #[command(subcommand)]
    Workflow(WorkflowCommand),
    /// Speak ACP on stdin/stdout, as an agent: an editor launches this like any agent, and
    /// each session it opens is a Tether session of PROFILE, kept by the daemon (so it
    /// outlives the editor).
    Acp {
        /// The agent profile new sessions run (`supervisor agents` lists them).
        #[arg(long, value_name = "PROFILE")]
        agent: Option<String>,
    },
    /// Send a prompt and follow its turn to the end (resuming the session first if its agent
    /// is not running; following on across a daemon restart). Options go before SESSION:
    /// everything after it is the prompt.
    Prompt {
        /// Print only the agent's reply.
        #[arg(long, short)]
        quiet: bool,
        /// The session.
        session: String,
        /// The prompt (words are joined by spaces).
        #[arg(required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true)]
        text: Vec<String>,
    },
    /// Steer a session's running turn with a message and follow the turn that carries it:
    /// into the turn where the agent takes one mid-turn, else the turn is cancelled and the
    /// message runs next, ahead of anything queued. With no turn running it is a prompt.
    Steer {
        /// Print only the agent's reply.
        #[arg(long, short)]
        quiet: bool,
        /// The session.
        session: String,
        /// The message (words are joined by spaces).
        #[arg(required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true)]
        text: Vec<String>,
    },
    /// Fork a session at a turn (default: its newest): a new session of the same task whose
    /// conversation is the original's up to and including that turn, at rest until
    /// prompted; with a worktree, on a branch of its own from the commit at that turn.
    Fork {
        /// The session to fork.
        session: String,
        /// The last turn the fork keeps (`timeline` lists them).
        #[arg(long, value_name = "TURN_ID")]
        turn: Option<String>,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Rewind a session to a turn: the later turns stay in its history and timeline, marked
    /// rewound, and leave the agent's context (the next prompt starts it afresh, given the
    /// turns kept). Refused while a turn runs.
    Rewind {
        /// The session.
        session: String,
        /// The turn that becomes the conversation's last (`timeline` lists them).
        turn: String,
        /// Also return the workspace to its git state at that turn; what it holds now is
        /// saved on a ref first (refs/tether/rewound/...).
        #[arg(long)]
        restore_workspace: bool,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Bring a session's agent back (natively when it can), showing progress and outcome.
    Resume {
        /// Print nothing but the outcome line.
        #[arg(long, short)]
        quiet: bool,
        /// Adopt the agent profile as it is now (the session keeps the one it started
        /// with otherwise; `status` shows where they differ).
        #[arg(long)]
        refresh_profile: bool,
        /// The session [default: the one whose workspace is the current directory].
        session: Option<String>,
    },
    /// Review what a session changed: every file its workspace changed since the session's
    /// base commit, with --diff each one's diff; --keep marks a file reviewed, --revert
    /// puts it back as the base has it (what it holds saved on a ref first).
    Changes {
        /// The session.
        session: String,
        /// Print each file's diff too.
        #[arg(long)]
        diff: bool,
        /// Mark this file kept at its content now (until it changes again).
        #[arg(long, value_name = "PATH", conflicts_with = "revert")]
        keep: Option<String>,
        /// Put this file back as the base commit has it.
        #[arg(long, value_name = "PATH")]
        revert: Option<String>,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// A session's workspace checkpoints (its files at every turn's end, kept by the
    /// supervisor); --restore-into writes one into a new or empty directory.
    Checkpoints {
        /// The session.
        session: String,
        /// Write a checkpoint's files into this directory (absolute, new or empty): the
        /// newest, or --seq's, or --turn's.
        #[arg(long, value_name = "DIR")]
        restore_into: Option<PathBuf>,
        /// The checkpoint, by its number.
        #[arg(long, requires = "restore_into", conflicts_with = "turn")]
        seq: Option<u64>,
        /// The turn whose checkpoint, by its number from 1.
        #[arg(long, requires = "restore_into")]
        turn: Option<u64>,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// A session's prompt queue: prompts sent while a turn ran, run in order as turns end;
    /// a failed or cancelled turn halts it until `queue resume`.
    #[command(subcommand)]
    Queue(QueueCommand),
    /// The Docker engines: each one's state and sessions; drain one for maintenance (its
    /// sessions move to the others), or return it to service.
    #[command(subcommand)]
    Engines(EnginesCommand),
    /// Move a session to another runtime (standalone, docker), or on Docker to an engine
    /// carrying other labels: a running turn ends first, and an agent that was running
    /// is resumed there.
    Move {
        /// The session.
        session: String,
        /// The runtime to run it on.
        #[arg(long)]
        runtime: String,
        /// Place it where this label is carried (a Docker engine's `labels`); repeatable.
        /// Replaces the labels it had.
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// Cancel a turn still running after this long, to move the session.
        #[arg(long, value_name = "MS")]
        force_after_ms: Option<u64>,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Re-send the prompt of a turn a crash left interrupted (the session's newest turn
    /// unless --turn) and follow the new turn; never done automatically, refused when that
    /// turn completed or was re-sent already.
    Retry {
        /// Print only the agent's reply.
        #[arg(long, short)]
        quiet: bool,
        /// The turn to re-send.
        #[arg(long)]
        turn: Option<String>,
        /// The session.
        session: String,
    },
    /// Tokens and cost the agents reported, summed over turns: of everything, or of a
    /// session, task, profile or workflow, optionally per group.
    Usage {
        /// One session's.
        #[arg(long)]
        session: Option<String>,
        /// One task's.
        #[arg(long)]
        task: Option<String>,
        /// One agent profile's.
        #[arg(long)]
        profile: Option<String>,
        /// One workflow's.
        #[arg(long)]
        workflow: Option<String>,
        /// Only turns that ended within this long (90s, 30m, 24h, 7d).
        #[arg(long, value_name = "DURATION")]
        since: Option<String>,
        /// A line per session, task, profile, workflow or day as well.
        #[arg(long, value_enum)]
        by: Option<UsageBy>,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Set the token or cost budget of a session or a task (neither --tokens nor --cost
    /// removes it). At 80 % the session's events warn; at 100 % it pauses at the turn's end
    /// and takes no prompt until the budget is raised.
    Budget {
        /// The session.
        #[arg(long, conflicts_with = "task", required_unless_present = "task")]
        session: Option<String>,
        /// The task (the sum over its sessions).
        #[arg(long)]
        task: Option<String>,
        /// The most tokens.
        #[arg(long)]
        tokens: Option<u64>,
        /// The most cost.
        #[arg(long)]
        cost: Option<f64>,
        /// The currency of --cost [default: USD].
        #[arg(long)]
        currency: Option<String>,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// A session's status.
    Status {
        /// The session.
        session: String,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// A session's agent settings — its model and other config options, its mode — as the
    /// agent reports them and as chosen; --set and --mode choose (kept across resumes).
    Settings {
        /// The session.
        session: String,
        /// Choose a config option: ID=VALUE (model=NAME; true/false for a switch; ID=
        /// forgets the choice).
        #[arg(long, value_name = "ID=VALUE")]
        set: Option<String>,
        /// Choose the mode (- forgets the choice).
        #[arg(long, value_name = "MODE")]
        mode: Option<String>,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Cancel a session's running turn (a PAUSED session: end it, CANCELLED).
    Cancel {
        /// The session.
        session: String,
    },
    /// Pause a session at the next turn boundary: a running turn ends first (or is
    /// cancelled after --force-after-ms), then its agent stops and it is PAUSED until
    /// resumed (`resume`, or a prompt). Waits until it is paused unless --no-wait.
    Pause {
        /// The session [default: the live one whose workspace is the current directory].
        session: Option<String>,
        /// Why (kept with the pause and shown in its events).
        #[arg(long)]
        reason: Option<String>,
        /// How long a running turn may still take before it is cancelled [default: 300000].
        #[arg(long, value_name = "MS")]
        force_after_ms: Option<u64>,
        /// Return once the pause is requested, without waiting for the turn to end.
        #[arg(long)]
        no_wait: bool,
    },
    /// Answer an agent's permission request.
    #[command(subcommand)]
    Permission(PermissionCommand),
    /// Answer an agent's elicitation (a form to fill, a URL to visit).
    #[command(subcommand)]
    Elicitation(ElicitationCommand),
    /// Print a session's events as they happen, from a seq on; follows on across daemon
    /// restarts and ends when the session ends (or on Ctrl-C).
    Follow {
        /// The session.
        session: String,
        /// Start after this event seq (default: from now on).
        #[arg(long, value_name = "SEQ")]
        after: Option<u64>,
        /// One JSON event per line.
        #[arg(long)]
        json: bool,
    },
    /// End a session FOR GOOD: its agent stops and it cannot be resumed or prompted again.
    /// (To free an agent but keep the session resumable, use `stop-all`.)
    Stop {
        /// The session.
        session: String,
    },
    /// Stop every agent and sidecar; the sessions stay resumable.
    StopAll,
    /// A session's conversation history.
    History {
        /// The session.
        session: String,
        /// Entries after this seq.
        #[arg(long, default_value_t = 0, value_name = "SEQ")]
        after: u64,
        /// At most this many entries.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        #[command(flatten)]
        json: JsonFlag,
    },
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// The address the API listens on [default: config.toml's `listen`, else
    /// 127.0.0.1:7733]. Every flag here wins over `$TETHER_HOME/config.toml`, which wins
    /// over the default; the file also holds the automatic retention policy.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Each session's event log keeps at least its newest this many bytes; older
    /// segments are dropped (subscribing before them is refused; the history keeps the
    /// conversation) [default: 64 MiB].
    #[arg(long, value_name = "BYTES")]
    event_log_retain_bytes: Option<u64>,
    /// The size of an event log's segments (what retention drops at a time).
    #[arg(long, value_name = "BYTES", default_value_t = agentctl::spool::DEFAULT_SEGMENT_BYTES, hide = true)]
    event_log_segment_bytes: u64,
    /// The data directory (default: $TETHER_HOME, else $XDG_DATA_HOME/tether, else
    /// ~/.local/share/tether).
    #[arg(long)]
    home: Option<PathBuf>,
    /// A file holding the API token; it must be readable by its owner only (0600).
    #[arg(long, value_name = "FILE", conflicts_with = "auth_token")]
    auth_token_file: Option<PathBuf>,
    /// The API token. The daemon starts itself again at once (same pid) with the token
    /// on an inherited pipe, so it does not stay in its argv or environment (nor does
    /// TETHER_AUTH_TOKEN's).
    #[arg(long, value_name = "TOKEN")]
    auth_token: Option<String>,
    /// Internal: the token on this inherited descriptor (see --auth-token).
    #[arg(long, value_name = "FD", hide = true)]
    auth_token_fd: Option<i32>,
    /// A browser origin allowed to connect (repeatable).
    #[arg(long, value_name = "ORIGIN", action = clap::ArgAction::Append)]
    allow_origin: Vec<String>,
    /// A statically linked agentctl for the Docker runtime.
    #[arg(long, env = "TETHER_STATIC_AGENTCTL", value_name = "PATH")]
    static_agentctl: Option<PathBuf>,
    /// The most API connections at once (pages, CLIs, frontends); one more is answered
    /// HTTP 429, "too many connections".
    #[arg(long, value_name = "N", default_value_t = crate::api::MAX_CONNECTIONS)]
    max_connections: u32,
    /// The most API connections one peer other than the daemon's own user holds (another
    /// local user, or a remote address); the last sixteenth of --max-connections is kept
    /// for the daemon's own user.
    #[arg(long, value_name = "N", default_value_t = crate::api::MAX_CONNECTIONS_PER_PEER)]
    max_connections_per_peer: u32,
}

/// `usage --by`.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
enum UsageBy {
    Session,
    Task,
    Profile,
    Workflow,
    Day,
}

impl From<UsageBy> for protocol::api::UsageGroupBy {
    fn from(by: UsageBy) -> Self {
        match by {
            UsageBy::Session => protocol::api::UsageGroupBy::Session,
            UsageBy::Task => protocol::api::UsageGroupBy::Task,
            UsageBy::Profile => protocol::api::UsageGroupBy::Profile,
            UsageBy::Workflow => protocol::api::UsageGroupBy::Workflow,
            UsageBy::Day => protocol::api::UsageGroupBy::Day,
        }
    }
}

#[derive(Args, Debug, Clone, Copy)]
struct JsonFlag {
    /// Print JSON (the API's result) instead of lines.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum TaskCommand {
    /// Create a task.
    Create {
        /// The title.
        title: String,
        /// The description (the first prompt of its sessions when they get none).
        #[arg(long, default_value = "")]
        description: String,
        /// Print only the task id.
        #[arg(long, short)]
        quiet: bool,
    },
    /// List tasks.
    List(JsonFlag),
    /// A task and its sessions.
    Show {
        /// The task.
        task: String,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Delete a task and every session of it (refused while one is live: stop or pause it
    /// first).
    Delete {
        /// The task.
        task: String,
        /// Remove its sessions' worktrees even with uncommitted work in them.
        #[arg(long)]
        force: bool,
        /// Delete their worktree branches too.
        #[arg(long)]
        delete_branch: bool,
    },
}

#[derive(Subcommand, Debug)]
enum SessionCommand {
    /// Start a session and wait until its agent is ready.
    Start(StartArgs),
}

#[derive(Subcommand, Debug)]
enum SessionsCommand {
    /// List sessions, oldest first.
    List {
        /// Only this task's.
        #[arg(long)]
        task: Option<String>,
        /// Only those in this state (CREATED, STARTING, RUNNING, WAITING_FOR_INPUT,
        /// COMPLETED, FAILED, CANCELLED).
        #[arg(long, value_name = "STATE")]
        status: Option<SessionState>,
        /// Only those of this agent profile.
        #[arg(long)]
        agent: Option<String>,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// A session's status, its executions and turns, and its timeline.
    Show {
        /// The session.
        session: String,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Delete a session and its records, and its worktree if Tether made one (refused
    /// while that holds uncommitted work, unless --force; its branch stays unless
    /// --delete-branch).
    Delete {
        /// The session.
        session: String,
        /// Remove its worktree even with uncommitted work in it.
        #[arg(long)]
        force: bool,
        /// Delete its worktree's branch too.
        #[arg(long)]
        delete_branch: bool,
    },
    /// Remove the sessions at rest older than --max-age-days: rows, history, event logs,
    /// spools, containers and worktrees. Live sessions are never touched; a worktree with
    /// uncommitted work keeps its session unless --force. Prints what went and what was
    /// kept, and why.
    Cleanup {
        /// Sessions whose last change is older than this many days (0: any age).
        #[arg(long, value_name = "DAYS")]
        max_age_days: u32,
        /// Spare COMPLETED sessions.
        #[arg(long)]
        keep_completed: bool,
        /// Only sessions in this state (repeatable).
        #[arg(long = "state", value_name = "STATE", action = clap::ArgAction::Append)]
        states: Vec<SessionState>,
        /// Print what would be removed; remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// Remove worktrees with uncommitted work too.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        json: JsonFlag,
    },
}

/// What `session start` creates.
#[derive(Args, Debug)]
struct StartArgs {
    /// The agent profile.
    #[arg(long)]
    agent: String,
    /// The workspace directory; with --worktree, the repository (optional when the
    /// profile names workspace.repo).
    #[arg(long)]
    workspace: Option<PathBuf>,
    /// The task.
    #[arg(long, required_unless_present = "new_task", conflicts_with = "new_task")]
    task: Option<String>,
    /// Create a task with this title for the session.
    #[arg(long, value_name = "TITLE")]
    new_task: Option<String>,
    /// The first prompt.
    #[arg(long)]
    prompt: Option<String>,
    /// Where the agent runs: `standalone` or `docker` (default: the profile's).
    #[arg(long, value_name = "NAME")]
    runtime: Option<String>,
    /// Place it where this label is carried (a Docker engine's `labels`); repeatable.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Share the workspace with live sessions already in it (else a held workspace is
    /// refused, naming its holder).
    #[arg(long)]
    shared: bool,
    /// Work in a git worktree of its own, on a new branch tether/<task>-<id> (the
    /// default when the profile has a [workspace] section).
    #[arg(long, conflicts_with = "no_worktree")]
    worktree: bool,
    /// Work in the workspace itself even when the profile asks for worktrees.
    #[arg(long)]
    no_worktree: bool,
    /// The branch or commit the worktree's branch starts from (default: the profile's
    /// workspace.base, else the repository's HEAD).
    #[arg(long, value_name = "REF")]
    base: Option<String>,
    /// Print only the session id.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Subcommand, Debug)]
enum EnginesCommand {
    /// Each engine: serving, draining, drained or unreachable, and its sessions.
    List {
        #[command(flatten)]
        json: JsonFlag,
    },
    /// No new session goes to NAME, and each of its sessions moves to another engine at
    /// its next turn boundary (idle ones at once).
    Drain {
        /// The engine (`[[docker.engines]] name`).
        name: String,
        /// Cancel a turn still running after this long, to move its session.
        #[arg(long, value_name = "MS")]
        force_after_ms: Option<u64>,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Return NAME to service: new sessions may be placed there again.
    Undrain {
        /// The engine.
        name: String,
        #[command(flatten)]
        json: JsonFlag,
    },
}

#[derive(Subcommand, Debug)]
enum QueueCommand {
    /// The queued prompts, in the order they run, and why the queue is halted.
    List {
        /// The session.
        session: String,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Change a queued prompt's text (the words after PROMPT_ID), its place, or both.
    Edit {
        /// Its new place, from 1.
        #[arg(long)]
        position: Option<usize>,
        /// The session.
        session: String,
        /// The queued prompt (as `queue list` shows it).
        prompt_id: String,
        /// Its new text (words are joined by spaces; unchanged when absent).
        #[arg(num_args = 0.., trailing_var_arg = true, allow_hyphen_values = true)]
        text: Vec<String>,
    },
    /// Remove a queued prompt.
    Remove {
        /// The session.
        session: String,
        /// The queued prompt.
        prompt_id: String,
    },
    /// Remove every queued prompt.
    Clear {
        /// The session.
        session: String,
    },
    /// Let a halted queue run again (bringing the agent back if it is not running).
    Resume {
        /// The session.
        session: String,
    },
}

#[derive(Subcommand, Debug)]
enum SnapshotsCommand {
    /// A session's snapshots, oldest first.
    List {
        /// The session.
        session: String,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// One snapshot, whole, as JSON (with or without --json).
    Get {
        /// The snapshot.
        snapshot: String,
        /// Print JSON (as without it: a snapshot is read whole, as the API's result).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum ElicitationCommand {
    /// Answer an elicitation request (see its `elicitation_request` event): `accept` with
    /// the form's values as --field NAME=VALUE, `decline`, or `cancel`.
    Respond {
        /// The session.
        session: String,
        /// The request id.
        request: String,
        /// `accept`, `decline` or `cancel`.
        answer: String,
        /// A form value, NAME=VALUE (typed by the form: numbers, true/false, lists
        /// split at commas); repeat for each.
        #[arg(long = "field", value_name = "NAME=VALUE")]
        fields: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
enum PermissionCommand {
    /// Answer a permission request (see its `permission_request` event) with `allow`,
    /// `allow-always`, `deny`, `deny-always`, `cancel` or one of its option ids.
    Respond {
        /// The session.
        session: String,
        /// The request id.
        request: String,
        /// `allow` (allow once), `allow-always`, `deny` (reject once), `deny-always`,
        /// `cancel`, or an option id.
        answer: String,
    },
}

/// The CLI's exit codes (listed in `--help` and the README).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
enum Exit {
    Ok = 0,
    /// Anything else that failed.
    Error = 1,
    /// The command line is wrong.
    Usage = 2,
    /// No daemon answers at the URL.
    NotRunning = 3,
    /// The session, task or request named does not exist.
    NotFound = 4,
    /// The session has ended.
    Conflict = 5,
    /// The daemon refused the token (missing or wrong).
    Refused = 6,
    /// The daemon has no room for another connection (HTTP 429).
    Busy = 7,
}

impl Exit {
    fn code(self) -> i32 {
        self as i32
    }
}

/// A failure with its exit code and the one line to print.
struct Failure {
    code: Exit,
    line: String,
}

impl From<anyhow::Error> for Failure {
    fn from(err: anyhow::Error) -> Failure {
        Failure { code: Exit::Error, line: format!("error: {err:#}") }
    }
}

fn usage(line: String) -> Failure {
    Failure { code: Exit::Usage, line }
}

/// Runs the command line (without the program name); returns the exit code.
pub fn main(args: Vec<OsString>, self_command: Vec<OsString>) -> i32 {
    let argv = std::iter::once(OsString::from("supervisor")).chain(args);
    let parsed = Cli::command().try_get_matches_from(argv).and_then(|matches| {
        let cli = Cli::from_arg_matches(&matches)?;
        // `--url` and `--token` say which daemon a client talks to: given to `serve`, which
        // is the daemon, they would be silently ignored.
        let given = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
        if matches!(cli.command, Command::Serve(_)) && (given("url") || given("token")) {
            return Err(Cli::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                "--url and --token are for client commands; `serve` takes --listen and \
                 --auth-token-file",
            ));
        }
        Ok(cli)
    });
    let cli = match parsed {
        Ok(cli) => cli,
        Err(err) => {
            // Help and version go to stdout with 0; usage errors to stderr with 2.
            let _ = err.print();
            return if err.use_stderr() { Exit::Usage } else { Exit::Ok }.code();
        }
    };
    // The daemon serves many clients at once; a client command (the face included) is one
    // conversation with it, on one thread (no hand-offs between workers for every message).
    let mut builder = match cli.command {
        Command::Serve(_) => tokio::runtime::Builder::new_multi_thread(),
        _ => tokio::runtime::Builder::new_current_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the runtime: {err}");
            return Exit::Error.code();
        }
    };
    match runtime.block_on(dispatch(cli, self_command)) {
        Ok(()) => Exit::Ok.code(),
        Err(failure) => {
            eprintln!("{}", failure.line);
            failure.code.code()
        }
    }
}

async fn dispatch(cli: Cli, self_command: Vec<OsString>) -> Result<(), Failure> {
    if let Command::Serve(args) = cli.command {
        return serve(args, self_command).await.map_err(Failure::from);
    }
    // A client command's output may go to `head`: when the reader goes, the command ends
    // quietly as Unix tools do, instead of panicking in a print.
    // SAFETY: restores the default disposition of one signal before any thread of ours
    // writes to a pipe; no handler is installed. The daemon (above) keeps Rust's "ignore",
    // since it writes to sockets and agents' pipes.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigDfl,
        )
    };
    // Without --url (or TETHER_URL): the daemon serving this data directory, wherever it
    // listens, else the default address.
    let url =
        cli.url.or_else(running_daemon_url).unwrap_or_else(|| format!("ws://{DEFAULT_LISTEN}"));
    let mut target = Target { url, token: cli.token };
    let client = match Client::connect(target.clone()).await {
        // An editor starts the face as it would any agent: with no daemon on this machine's
        // address, the face starts one, detached, so sessions outlive the editor.
        Err(failure)
            if failure.code == Exit::NotRunning && matches!(cli.command, Command::Acp { .. }) =>
        {
            target.url = face::start_daemon(&target.url, &self_command).await?;
            Client::connect(target).await?
        }
        connected => connected?,
    };
    client.run(cli.command).await
}

/// Where the daemon holding this user's data directory (`TETHER_HOME`, …) serves, if one
/// holds it and serves yet.
fn running_daemon_url() -> Option<String> {
    Home::default_root().and_then(|root| crate::home::lock::running(&root)).and_then(|it| it.url)
}

/// A `--label KEY=VALUE`.
fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}
