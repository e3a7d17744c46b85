//! `chaos`: the fault matrix. Drives a real `supervisor serve` with several mock sessions
//! streaming long turns (several messages, tool calls, a permission request), a subscriber
//! per session that reconnects from its last seq, and, each round, one disruption chosen by
//! a seeded generator: SIGKILL of the supervisor (at a random moment, or at a named fault
//! point through `TETHER_FAULT`), of a session's agentctl, of its agent, or — with a Docker
//! engine (required under `REQUIRE_DOCKER=1`), where one more session runs in a container —
//! of that session's container. The operator's part (restarting the supervisor) is done as
//! an operator would.
//!
//! One round in twelve each is an edge of a session's life instead, a workflow, or the
//! prompt queue:
//! - create: a new session, its first prompt given with the create, while the supervisor is
//!   armed at `create.recorded`, `launch.started` or `launch.after_runtime` (it dies after
//!   the row is stored, before the agent is up). After the restart the session is found in
//!   its task and resumed if it asks to be; its first prompt runs exactly once (one turn,
//!   one user message in the history) and whole (every chunk once, the history the stream),
//!   within 10 s (stuck otherwise). Then it is stopped, and nothing of it may run on;
//! - stop: `task.session.stop` of a session mid-turn, the supervisor armed at
//!   `stop.recorded` (it dies after the end is stored, before the sidecar is retired). After
//!   the restart its sidecar and agent are gone (orphans otherwise), it is `COMPLETED`, its
//!   turn ends (stuck otherwise) and every chunk streamed is in its history once. A fresh
//!   session takes its place in the matrix;
//! - delete: the same with `task.session.delete` (which stops first, at the same point);
//!   besides, a second delete succeeds;
//! - stop-all: `sessions.stop_all` mid-turn, no kill. Every running turn ends (a turn the
//!   agent finished within its stop grace may end `completed`), each session's history is
//!   what it streamed, once, and no sidecar or agent is left. A prompt queued while its
//!   agent was starting, which the stop-all stopped, is kept (as a pause keeps the queue)
//!   and runs once when the round resumes its session (then stopped again). The next
//!   round's prompts resume the sessions;
//! - workflow: a workflow of three steps (two at once, then one reading both) started with
//!   the supervisor armed at a workflow point (`chaos/workflows.rs` says which and what is
//!   checked: it completes, each step's prompt reached its agent once, nothing runs on);
//! - queue: each session gets a second prompt while its first turn runs (queued behind it),
//!   with the supervisor armed at `prompt.recorded` on one of the queued prompts' turns (it
//!   dies right after a queued prompt left the queue as a turn, before the prompt reached
//!   the agent). After the restart every queued prompt runs once, whole, after its first.
//! - steer: each session's turn is steered while it runs (the mock agent takes no message
//!   mid-turn, so Tether cancels the turn and runs the steer next), with the supervisor
//!   armed at `steer.queued` (it dies with the steer durable, before the cancel went out)
//!   or at `prompt.recorded` on a steer's turn. After the restart every steer runs once,
//!   whole; the cancelled turn holds a prefix of its chunks.
//! - wake: every session's agent is stopped (`sessions.stop_all`), then each is prompted:
//!   the prompt is queued while its agent is brought back, with the supervisor armed at
//!   `launch.started` or `launch.after_runtime` on one of those launches. After the restart
//!   every prompt that was answered runs once, whole, and no queue is left holding one
//!   (stuck otherwise).
//! - fork: each session is forked at its newest turn with the supervisor armed at
//!   `fork.history_written` (`chaos/forks.rs` says what is checked: no half-made fork,
//!   each fork holds its original's conversation and runs its first prompt once).
//!
//! After each round it checks, and at the end it prints (zero everywhere is the only pass):
//! - lost / duplicated: every chunk the agent streamed appears exactly once in the
//!   subscriber's stream (seqs gapless, each turn's chunks in order, a completed turn whole)
//!   and exactly once in `history.jsonl` (the turn's recorded message is the streamed text);
//! - stuck: every turn ends within 10 s of the round's disruption;
//! - orphans: no sidecar or agent outlives its owner (each is given 5 s to go, awaited on
//!   its pidfd);
//! - doubled: never two live sidecars for one session, nor two agents under one sidecar.
//!
//! Usage: `chaos [--rounds N] [--sessions N] [--seed N] [--no-docker] [--only KIND]` (`--only`
//! keeps the rounds whose disruption's name starts with KIND, e.g. `stop`, `fault`, `create`). Exit code 1 when any column is
//! not zero. Run by `scripts/chaos.sh`.
// The test crate is exempt from the length rule: a scenario reads top to bottom.
#![allow(clippy::too_many_lines)]

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use agentctl::process::PidFd;
use jsonrpsee::core::client::Subscription;
use protocol::api::{ApiClient, EntryType, EventKind, SessionEvent, SessionState};
use tether_tests::daemon::{Api, Create, Daemon};
use tokio::sync::mpsc;
use tokio::time::Instant;

#[path = "chaos/checks.rs"]
mod checks;
#[path = "chaos/edges.rs"]
mod edges;
#[path = "chaos/forks.rs"]
mod forks;
#[path = "chaos/rewinds.rs"]
mod rewinds;
#[path = "chaos/workflows.rs"]
mod workflows;

use checks::{
    check_histories, check_processes, children_named_mock_agent, kill, observe, print_table,
    went_away,
};
use edges::{Victim, check_stopped_all, create_round, end_victim};
use workflows::{WORKFLOW_POINTS, flow_profile, workflow_round};

/// Chunks per message and messages per turn.
const CHUNKS: usize = 150;
const ROUNDS_PER_TURN: usize = 3;
/// How long a turn may take to end after the round's disruption.
const SETTLE: Duration = Duration::from_secs(10);
/// How long a process that should be gone may take to go.
const GO_AWAY: Duration = Duration::from_secs(5);

/// The named fault points the matrix arms (each kills the supervisor there).
const FAULT_POINTS: &[&str] = &[
    "ack.stored",
    "ack.sent",
    "history.mid_message",
    "permission.queued",
    "turn.recorded",
    "prompt.recorded",
    // These fire only when a session is resumed through `session/load` while armed.
    "load.sent",
    "load.opened",
    // This one when a session opens (a relaunch after an agent was lost) while armed.
    "state.opened_published",
];

/// The fault points a [`Disruption::Create`] round arms: each fires after the new session's
/// row is stored and before its agent is up.
const CREATE_POINTS: &[&str] = &["create.recorded", "launch.started", "launch.after_runtime"];
/// Where a wake round's supervisor dies: as the agent it brings back for a queued prompt
/// starts (its row `STARTING`), or once that agent's sidecar is recorded.
const WAKE_POINTS: &[&str] = &["launch.started", "launch.after_runtime"];
/// Chunks of a created session's first prompt (one message).
const CREATE_CHUNKS: usize = 20;

#[derive(Debug, Default)]
struct Tally {
    rounds: u64,
    kills: BTreeMap<String, u64>,
    turns_completed: u64,
    turns_failed: u64,
    lost: u64,
    duplicated: u64,
    stuck: u64,
    orphans: u64,
    doubled: u64,
    problems: Vec<String>,
    /// Rounds in which any problem was found (the end-of-run checks count as one more).
    rounds_failed: u64,
}

impl Tally {
    fn problem(&mut self, what: String) {
        eprintln!("chaos: {what}");
        self.problems.push(what);
    }
}

/// A deterministic generator (xorshift64*), so a seed reproduces a run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One turn as the subscriber saw it.
#[derive(Debug, Default)]
struct TurnSeen {
    tag: String,
    turn_id: Option<String>,
    chunks: Vec<String>,
    /// The event seq of each chunk (where a hole is, for a post-mortem).
    chunk_seqs: Vec<u64>,
    ended: Option<String>,
    /// The prompt call failed (the daemon died answering it): the turn may never start.
    prompt_failed: bool,
    /// Its prompt's `/stream` and `/rounds` when not the matrix's own (a create's prompt).
    shape: Option<(usize, usize)>,
}

impl TurnSeen {
    /// The chunk keys a completed turn streams, in order.
    fn expected(&self) -> Vec<String> {
        let (chunks, rounds) = self.shape.unwrap_or((CHUNKS, ROUNDS_PER_TURN));
        expected_keys(chunks, rounds)
    }
}

struct SessionTrack {
    id: String,
    /// Runs in a container (its sidecar and agent are not local processes).
    docker: bool,
    /// The last event seq received.
    last_seq: u64,
    turns: Vec<TurnSeen>,
    /// Where this round's turns begin in `turns` (a queue round has two a session).
    round_from: usize,
}

impl SessionTrack {
    /// This round's turns.
    fn round(&self) -> &[TurnSeen] {
        &self.turns[self.round_from.min(self.turns.len())..]
    }

    fn round_mut(&mut self) -> &mut [TurnSeen] {
        let from = self.round_from.min(self.turns.len());
        &mut self.turns[from..]
    }

    /// Every turn of this round ended.
    fn settled(&self) -> bool {
        self.round().iter().all(|turn| turn.ended.is_some())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Disruption {
    Supervisor,
    Fault(&'static str),
    Agentctl,
    Agent,
    Container,
    /// A new session created with the supervisor armed at one of [`CREATE_POINTS`].
    Create(&'static str),
    /// `task.session.stop` of a session mid-turn, the supervisor armed at `stop.recorded`.
    Stop,
    /// `task.session.delete` of a session mid-turn, armed likewise.
    Delete,
    /// `sessions.stop_all` mid-turn (no kill).
    StopAll,
    /// A workflow started with the supervisor armed at one of [`WORKFLOW_POINTS`].
    Workflow(&'static str),
    /// A second prompt queued behind each session's turn, the supervisor armed at
    /// `prompt.recorded` on a queued one's turn.
    Queue,
    /// Each session's turn steered while it runs, the supervisor armed at `steer.queued`
    /// or at `prompt.recorded` on a steer's turn.
    Steer,
    /// Each session forked at its newest turn, the supervisor armed at
    /// `fork.history_written` (see `chaos/forks.rs`).
    Fork,
    /// Every session's agent stopped, then each prompted (queued while its agent wakes),
    /// the supervisor armed at one of [`WAKE_POINTS`] on a wake's launch.
    Wake(&'static str),
    /// A side session rewound to its first turn, the supervisor armed at
    /// `rewind.workspace_restored` (see `chaos/rewinds.rs`).
    Rewind,
}

impl Disruption {
    /// The `TETHER_FAULT` the supervisor is armed with for the round (through a clean
    /// restart); draws the hit for a [`Disruption::Fault`].
    fn armed(self, rng: &mut Rng) -> Option<String> {
        match self {
            Disruption::Fault(point) | Disruption::Workflow(point) | Disruption::Wake(point) => {
                Some(format!("{point}@{}", 1 + rng.below(3)))
            }
            Disruption::Create(point) => Some(point.to_owned()),
            Disruption::Stop | Disruption::Delete => Some("stop.recorded".to_owned()),
            // The first prompts are the first hits (one a session); a queued prompt's turn
            // is recorded later, when the turn before it ended.
            Disruption::Queue => Some(format!("prompt.recorded@{}", 4 + rng.below(3))),
            // The first steer's hit, or a steer's turn (after the first prompts).
            Disruption::Steer if rng.below(2) == 0 => {
                Some(format!("steer.queued@{}", 1 + rng.below(3)))
            }
            Disruption::Steer => Some(format!("prompt.recorded@{}", 4 + rng.below(3))),
            Disruption::Fork => Some(format!("fork.history_written@{}", 1 + rng.below(3))),
            Disruption::Rewind => Some("rewind.workspace_restored".to_owned()),
            _ => None,
        }
    }

    /// Whether the round's kill is the armed fault point's alone (no kill of ours).
    fn armed_only(self) -> bool {
        matches!(
            self,
            Disruption::Fault(_) | Disruption::Queue | Disruption::Steer | Disruption::Wake(_)
        )
    }

    /// Whether `--only NAME` keeps this disruption (its lowercased name starts with it).
    fn named(self, only: &str) -> bool {
        format!("{self:?}").to_lowercase().starts_with(&only.to_lowercase())
    }

    /// A seeded choice: the kills of a running session six times in sixteen, each edge of
    /// a session's life (create, stop, delete, stop-all), a workflow, a queue, a steer, a
    /// fork, a rewind and a wake once in sixteen.
    fn choose(rng: &mut Rng, docker: bool) -> Disruption {
        match rng.below(16) {
            0..6 => match rng.below(if docker { 5 } else { 4 }) {
                0 => Disruption::Supervisor,
                1 => Disruption::Fault(FAULT_POINTS[rng.below(FAULT_POINTS.len() as u64) as usize]),
                2 => Disruption::Agentctl,
                3 => Disruption::Agent,
                _ => Disruption::Container,
            },
            6 => Disruption::Create(CREATE_POINTS[rng.below(CREATE_POINTS.len() as u64) as usize]),
            7 => Disruption::Stop,
            8 => Disruption::Delete,
            9 => Disruption::StopAll,
            10 => Disruption::Queue,
            11 => Disruption::Steer,
            12 => Disruption::Fork,
            13 => Disruption::Rewind,
            14 => Disruption::Wake(WAKE_POINTS[rng.below(WAKE_POINTS.len() as u64) as usize]),
            _ => Disruption::Workflow(
                WORKFLOW_POINTS[rng.below(WORKFLOW_POINTS.len() as u64) as usize],
            ),
        }
    }
}

/// The chunk's identity: `<rK:n/N>` for round chunks, `[n/N]` for the final reply's.
fn chunk_key(text: &str) -> String {
    match (text.rfind('<'), text.rfind('[')) {
        (Some(at), _) if text.ends_with('>') => text[at..].to_owned(),
        (_, Some(at)) if text.ends_with(']') => text[at..].to_owned(),
        _ => text.to_owned(),
    }
}

fn expected_keys(chunks: usize, rounds: usize) -> Vec<String> {
    let mut keys = Vec::new();
    for round in 1..rounds {
        for n in 1..=chunks {
            keys.push(format!("<r{round}:{n}/{chunks}>"));
        }
    }
    for n in 1..=chunks {
        keys.push(format!("[{n}/{chunks}]"));
    }
    keys
}

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|idx| args.get(idx + 1))
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds = arg(&args, "--rounds", 20);
    let sessions = arg(&args, "--sessions", 3) as usize;
    let only = args.iter().position(|a| a == "--only").and_then(|at| args.get(at + 1)).cloned();
    let seed = arg(&args, "--seed", 0x7e7e_5eed);
    let started = Instant::now();
    let mut rng = Rng(seed | 1);
    let mut tally = Tally::default();
    // A Docker engine adds a session in a container (and container kills).
    let docker = match args.iter().any(|a| a == "--no-docker") {
        true => None,
        false => tether_tests::docker::engine().await,
    };
    let image = format!("tether-chaos-mock:{}", uuid::Uuid::new_v4().simple());
    let mut daemon_args: Vec<String> = Vec::new();
    let mut profiles: Vec<(&str, String)> = Vec::new();
    if let Some(docker) = &docker {
        tether_tests::docker::build_mock_image(docker, &image).await;
        let agentctl = tether_tests::docker::static_binary("TETHER_STATIC_AGENTCTL", "agentctl");
        daemon_args = vec!["--static-agentctl".into(), agentctl.to_string_lossy().into_owned()];
        profiles.push(("mock-docker.toml", docker_profile(&image)));
    }
    // The workflow rounds' agents log each prompt they answer here.
    let flow_log =
        std::env::temp_dir().join(format!("tether-chaos-flow-{}.jsonl", uuid::Uuid::new_v4()));
    profiles.push(("mock-flow.toml", flow_profile(&flow_log)));
    let daemon_args: Vec<&str> = daemon_args.iter().map(String::as_str).collect();
    let profile_refs: Vec<(&str, &str)> = profiles.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let mut daemon = Daemon::start_with_profiles(&daemon_args, &profile_refs).await;
    let _cleanup = docker.as_ref().map(|_| tether_tests::docker::Cleanup {
        label: format!("tether.install_id={}", daemon.install_id),
        image: Some(image.clone()),
    });
    let mut api = daemon.api().await;
    let mut tracks = Vec::new();
    for idx in 0..sessions {
        let id = api.ready_session("mock", &daemon.workspace(&format!("s{idx}"))).await;
        tracks.push(SessionTrack {
            id,
            docker: false,
            last_seq: 0,
            turns: Vec::new(),
            round_from: 0,
        });
    }
    if docker.is_some() {
        let id = api.ready_session("mock-docker", &daemon.workspace("docker")).await;
        tracks.push(SessionTrack {
            id,
            docker: true,
            last_seq: 0,
            turns: Vec::new(),
            round_from: 0,
        });
    }
    // Sessions stopped by a round (and replaced in `tracks`).
    let mut retired: Vec<SessionTrack> = Vec::new();
    for round in 1..=rounds {
        tally.rounds += 1;
        let mut disruption = Disruption::choose(&mut rng, docker.is_some());
        while !only.as_deref().is_none_or(|only| disruption.named(only)) {
            disruption = Disruption::choose(&mut rng, docker.is_some());
        }
        if let Some(armed) = disruption.armed(&mut rng) {
            // Armed through a clean restart (SIGTERM leaves the sidecars running).
            daemon.terminate().await;
            daemon.restart_with_env(&[("TETHER_FAULT", &armed)]).await;
            api = daemon.api().await;
        }
        let before = tally.problems.len();
        // A session that left the matrix (stopped): its history is checked at the end too.
        let retire = match disruption {
            Disruption::Create(point) => {
                create_round(&mut daemon, &mut api, round, point, &mut tally).await
            }
            Disruption::Workflow(point) => {
                workflow_round(&mut daemon, &mut api, &flow_log, round, point, &mut tally).await;
                None
            }
            // The round's turns first (nothing strikes them), then the forks of what they
            // left.
            Disruption::Fork => {
                let (rng, tally) = (&mut rng, &mut tally);
                let retire =
                    run_round(&mut daemon, &mut api, &mut tracks, round, disruption, rng, tally)
                        .await;
                let point = "fork.history_written";
                forks::fork_round(&mut daemon, &mut api, &tracks, round, point, tally).await;
                retire
            }
            // Likewise, then the rewind of a session of its own.
            Disruption::Rewind => {
                let (rng, tally) = (&mut rng, &mut tally);
                let retire =
                    run_round(&mut daemon, &mut api, &mut tracks, round, disruption, rng, tally)
                        .await;
                let armed = ("rewind.workspace_restored", rng.below(2) == 0);
                rewinds::rewind_round(&mut daemon, &mut api, round, armed, tally).await;
                retire
            }
            _ => {
                run_round(
                    &mut daemon,
                    &mut api,
                    &mut tracks,
                    round,
                    disruption,
                    &mut rng,
                    &mut tally,
                )
                .await
            }
        };
        retired.extend(retire);
        check_processes(&daemon, &tracks, &mut tally).await;
        if tally.problems.len() > before {
            tally.rounds_failed += 1;
        }
        if round % 10 == 0 || round == rounds {
            eprintln!(
                "chaos: round {round}/{rounds}, {:.0} s, problems so far: {}",
                started.elapsed().as_secs_f64(),
                tally.problems.len()
            );
        }
    }
    let before = tally.problems.len();
    check_histories(&api, &tracks, &mut tally).await;
    check_histories(&api, &retired, &mut tally).await;
    // The end: stop-all leaves nothing behind, and neither does the daemon.
    let (code, _, err) = daemon.cli(&["stop-all"]).await;
    if code != 0 {
        tally.problem(format!("stop-all failed: {err}"));
    }
    for track in tracks.iter().chain(&retired) {
        for pid in daemon.sidecars(&track.id) {
            if !went_away(pid).await {
                tally.orphans += 1;
                tally.problem(format!("sidecar {pid} of {} survived stop-all", track.id));
            }
        }
    }
    for pid in Daemon::processes_mentioning(&daemon.root.path().join(".mock-agent")) {
        if !went_away(pid).await {
            tally.orphans += 1;
            tally.problem(format!("agent {pid} survived stop-all"));
        }
    }
    let failed = tally.lost + tally.duplicated + tally.stuck + tally.orphans + tally.doubled > 0;
    // Nothing is left behind: each session is deleted (its stopped container with it) —
    // unless the data is kept for a post-mortem, when only the containers go.
    for track in tracks.iter().chain(&retired) {
        if failed {
            let _ = std::process::Command::new("docker")
                .args(["rm", "-f", &format!("tether-{}", track.id)])
                .output();
            continue;
        }
        let (code, _, err) = daemon.cli(&["sessions", "delete", &track.id]).await;
        if code != 0 {
            tally.problem(format!("deleting {} failed: {err}", track.id));
        }
    }
    if tally.problems.len() > before {
        tally.rounds_failed += 1;
    }
    let _ = std::fs::remove_file(&flow_log);
    print_table(&tally, started.elapsed());
    if failed {
        let root = daemon.keep_root();
        eprintln!(
            "chaos: kept the data for a post-mortem in {} (sessions/<id>/history.jsonl, events/, state.db)",
            root.display()
        );
    }
    drop(daemon);
    std::process::exit(i32::from(failed));
}

/// One round: a turn on every session, one disruption, then everything settles. Returns
/// the session a stop took out of the matrix (replaced in `tracks` by a fresh one).
async fn run_round(
    daemon: &mut Daemon,
    api: &mut Api,
    tracks: &mut [SessionTrack],
    round: u64,
    disruption: Disruption,
    rng: &mut Rng,
    tally: &mut Tally,
) -> Option<SessionTrack> {
    if matches!(disruption, Disruption::Wake(_))
        && let Err(err) = lossy(api.typed().stop_all()).await
    {
        tally.problem(format!("round {round}: stop-all before the wake failed: {err}"));
    }
    let (mut readers, mut events_rx) = subscribe_all(api, tracks).await;
    for (idx, track) in tracks.iter_mut().enumerate() {
        let permission = if rng.below(2) == 0 { "\n/permission" } else { "" };
        let tag = format!("chaos round {round} session {idx}");
        let prompt = format!("/stream {CHUNKS}\n/rounds {ROUNDS_PER_TURN}{permission}\n{tag}");
        track.round_from = track.turns.len();
        let sent = send_prompt(api, track, tag, prompt, round).await;
        if sent && disruption == Disruption::Queue {
            // Queued behind the turn just started (its tag does not contain the first's).
            let tag = format!("chaos round {round} queued {idx}");
            let prompt = format!("/stream {CHUNKS}\n/rounds {ROUNDS_PER_TURN}\n{tag}");
            send_prompt(api, track, tag, prompt, round).await;
        }
        if sent && disruption == Disruption::Steer {
            let tag = format!("chaos round {round} steer {idx}");
            let prompt = format!("/stream {CHUNKS}\n/rounds {ROUNDS_PER_TURN}\n{tag}");
            send_steer(api, track, tag, prompt, round).await;
        }
    }
    let victim = rng.below(tracks.len() as u64) as usize;
    let strike_at = 1 + rng.below((CHUNKS * ROUNDS_PER_TURN) as u64 * tracks.len() as u64 / 2);
    let mut seen_in_round = 0u64;
    let mut struck = false;
    // What of the victim must go with its stop or delete: its sidecar and agent.
    let mut doomed = Vec::new();
    let mut settle_from = Instant::now();
    // Whether the round looked for queues a stop-all kept (once), and resumed any.
    let (mut looked_for_kept, mut resumed_kept) = (false, false);
    loop {
        let all_ended = tracks.iter().all(SessionTrack::settled);
        if all_ended {
            break;
        }
        let deadline = settle_from + SETTLE + if struck { Duration::ZERO } else { SETTLE };
        let next = tokio::time::timeout_at(deadline, events_rx.recv()).await;
        let (idx, event) = match next {
            Ok(Some(item)) => item,
            Ok(None) => unreachable!("a reader task holds a sender"),
            Err(_)
                if tracks.iter().all(|t| {
                    t.round().iter().all(|turn| {
                        turn.ended.is_some() || (turn.turn_id.is_none() && turn.prompt_failed)
                    })
                }) =>
            {
                // Only prompts lost with a dying daemon are left, and they never started.
                for track in tracks.iter_mut() {
                    for turn in track.round_mut().iter_mut().filter(|turn| turn.ended.is_none()) {
                        turn.ended = Some("not_started".into());
                    }
                }
                break;
            }
            Err(_) if disruption == Disruption::StopAll && !looked_for_kept => {
                looked_for_kept = true;
                resumed_kept = resume_kept_queues(api, tracks).await;
                settle_from = Instant::now();
                continue;
            }
            Err(_) => {
                for track in tracks.iter().filter(|t| !t.settled()) {
                    tally.stuck += 1;
                    let status = lossy(api.typed().session_status(track.id.clone()))
                        .await
                        .map(|s| format!("{s:?}"))
                        .unwrap_or_else(|err| err.to_string());
                    let turn = track
                        .round()
                        .iter()
                        .find(|turn| turn.ended.is_none())
                        .expect("UNWRAP: filtered on it");
                    tally.problem(format!(
                        "round {round}: session {} did not settle ({disruption:?}, turn {:?} with {} chunks, last seq {}): {status}",
                        track.id,
                        turn.turn_id,
                        turn.chunks.len(),
                        track.last_seq
                    ));
                }
                unstick(api, tracks).await;
                break;
            }
        };
        let Some(event) = event else {
            // A subscription ended: the daemon died (a fault point fired) or is dying. Our
            // own kills stop the readers first, so only a fault point gets here.
            let died = disruption.armed_only()
                && tokio::time::timeout(GO_AWAY, daemon.wait_exit()).await.is_ok();
            if died {
                let point = match disruption {
                    Disruption::Fault(point) => point,
                    Disruption::Steer => "steer.queued or prompt.recorded (a steer's turn)",
                    Disruption::Wake(point) => point,
                    _ => "prompt.recorded (a queued prompt's turn)",
                };
                *tally.kills.entry(format!("supervisor at {point}")).or_default() += 1;
                readers.iter().for_each(|reader| reader.abort());
                daemon.restart_with_env(&[]).await;
                *api = daemon.api().await;
                (readers, events_rx) = subscribe_all(api, tracks).await;
                settle_from = Instant::now();
                struck = true;
                // A prompt whose answer was lost with the daemon may or may not have
                // started; it is not sent again (that would be a second prompt, which Tether
                // rightly runs twice): a turn that never shows up ends the round as
                // `not_started` once the others settled.
            }
            continue;
        };
        observe(&mut tracks[idx], &event, tally, round);
        if let EventKind::PermissionRequest { request_id, .. } = &event.kind {
            let answer = api.typed().permission_respond(
                tracks[idx].id.clone(),
                request_id.clone(),
                Some("allow".into()),
            );
            let _ = lossy(answer).await;
        }
        if matches!(event.kind, EventKind::AgentMessageChunk { .. }) {
            seen_in_round += 1;
        }
        if !struck && seen_in_round >= strike_at && !disruption.armed_only() {
            struck = true;
            if matches!(disruption, Disruption::Stop | Disruption::Delete) {
                doomed = daemon.sidecars(&tracks[victim].id);
                doomed.extend(doomed.clone().into_iter().flat_map(children_named_mock_agent));
            }
            if strike(daemon, api, tracks, victim, disruption, tally).await {
                // A new daemon: new subscriptions, from the last seq each session saw; what
                // the old ones still had queued is dropped with their channel.
                readers.iter().for_each(|reader| reader.abort());
                (readers, events_rx) = subscribe_all(api, tracks).await;
            }
            settle_from = Instant::now();
        }
    }
    readers.iter().for_each(|reader| reader.abort());
    // A stop or delete that struck restarted the daemon disarmed already.
    let still_armed = match disruption {
        Disruption::Stop | Disruption::Delete => !struck,
        _ => disruption.armed_only(),
    };
    if still_armed {
        // Disarm for the next round.
        if !daemon.has_exited() {
            daemon.terminate().await;
        }
        daemon.restart_with_env(&[]).await;
        *api = daemon.api().await;
    }
    for turn in tracks.iter().flat_map(SessionTrack::round) {
        match turn.ended.as_deref() {
            Some("completed") => tally.turns_completed += 1,
            Some(_) => tally.turns_failed += 1,
            None => {}
        }
    }
    if matches!(disruption, Disruption::Wake(_)) {
        check_no_prompt_left(api, tracks, round, tally).await;
    }
    match disruption {
        Disruption::Stop | Disruption::Delete if struck => {
            let victim = Victim { idx: victim, pids: doomed };
            end_victim(daemon, api, tracks, victim, disruption, round, tally).await
        }
        Disruption::StopAll if struck => {
            // The sessions resumed for their kept queues ran their prompts: stopped again.
            if resumed_kept && let Err(err) = lossy(api.typed().stop_all()).await {
                tally.problem(format!("round {round}: the second stop-all failed: {err}"));
            }
            check_stopped_all(daemon, api, tracks, round, tally).await;
            None
        }
        _ => None,
    }
}

/// Sends a prompt tagged `tag` to `track` and follows it as one of the round's turns;
/// whether the daemon answered (a lost answer leaves a turn that may never start).
async fn send_prompt(
    api: &Api,
    track: &mut SessionTrack,
    tag: String,
    prompt: String,
    round: u64,
) -> bool {
    track.turns.push(TurnSeen { tag, ..Default::default() });
    let sent = lossy(api.typed().session_prompt(track.id.clone(), prompt)).await;
    let Err(err) = sent else { return true };
    // A fault point may fire while the prompt is accepted: it may or may not start.
    eprintln!("chaos: round {round}: prompt to {} not answered: {err}", track.id);
    // Only a lost answer, not a refusal: a refused prompt is a finding.
    let lost_answer = !matches!(err, jsonrpsee::core::ClientError::Call(_));
    if let Some(turn) = track.turns.last_mut() {
        turn.prompt_failed = lost_answer;
    }
    false
}

/// Steers `track`'s running turn with `prompt`, tagged `tag`, and follows the turn it
/// becomes (the mock agent's fallback: the steer's own turn) as one of the round's turns.
async fn send_steer(api: &Api, track: &mut SessionTrack, tag: String, prompt: String, round: u64) {
    track.turns.push(TurnSeen { tag, ..Default::default() });
    let Err(err) = lossy(api.typed().session_steer(track.id.clone(), prompt)).await else {
        return;
    };
    eprintln!("chaos: round {round}: steer of {} not answered: {err}", track.id);
    let lost_answer = !matches!(err, jsonrpsee::core::ClientError::Call(_));
    if let Some(turn) = track.turns.last_mut() {
        turn.prompt_failed = lost_answer;
    }
}

/// Ends what did not settle, so the next round starts clean (already counted as stuck).
/// After a stop-all: resumes each unsettled session whose queue still holds prompts (taken
/// while its agent was starting, kept across the stop as a pause keeps them), as its
/// user would; they run then, once. Whether it resumed any.
async fn resume_kept_queues(api: &Api, tracks: &[SessionTrack]) -> bool {
    let mut resumed = false;
    for track in tracks.iter().filter(|track| !track.settled()) {
        let Ok(status) = lossy(api.typed().session_status(track.id.clone())).await else {
            continue;
        };
        if !status.queue.prompts.is_empty() && status.queue.halted.is_none() {
            eprintln!("chaos: resuming {}: its queue kept prompts across the stop-all", track.id);
            let _ = lossy(api.typed().session_resume(track.id.clone(), None)).await;
            resumed = true;
        }
    }
    resumed
}

async fn unstick(api: &Api, tracks: &mut [SessionTrack]) {
    for track in tracks.iter_mut() {
        if !track.settled() {
            let _ = lossy(api.typed().session_cancel(track.id.clone())).await;
        }
        for turn in track.round_mut().iter_mut().filter(|turn| turn.ended.is_none()) {
            turn.ended = Some("stuck".into());
        }
    }
}

/// Subscribes to every session after the last seq it saw, into one fresh channel.
async fn subscribe_all(
    api: &Api,
    tracks: &[SessionTrack],
) -> (Vec<tokio::task::JoinHandle<()>>, mpsc::UnboundedReceiver<(usize, Option<SessionEvent>)>) {
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let mut readers = Vec::new();
    for (idx, track) in tracks.iter().enumerate() {
        let subscription = api.subscribe(&track.id, track.last_seq).await;
        readers.push(tokio::spawn(forward(idx, subscription, events_tx.clone())));
    }
    // A task that only holds a sender, so the channel never reads as closed (the round
    // waits on its deadline instead); aborted with the readers.
    readers.push(tokio::spawn(async move {
        events_tx.closed().await;
    }));
    (readers, events_rx)
}

async fn forward(
    idx: usize,
    mut subscription: Subscription<SessionEvent>,
    events_tx: mpsc::UnboundedSender<(usize, Option<SessionEvent>)>,
) {
    while let Some(Ok(event)) = subscription.next().await {
        if events_tx.send((idx, Some(event))).is_err() {
            return;
        }
    }
    let _ = events_tx.send((idx, None));
}

/// Kills the round's victim. A supervisor kill is followed by the operator's restart;
/// returns whether the daemon is a new one.
async fn strike(
    daemon: &mut Daemon,
    api: &mut Api,
    tracks: &[SessionTrack],
    victim: usize,
    disruption: Disruption,
    tally: &mut Tally,
) -> bool {
    let session = &tracks[victim].id;
    // A container's sidecar and agent are not ours to kill one by one: the container is.
    let disruption = match disruption {
        Disruption::Agentctl | Disruption::Agent if tracks[victim].docker => Disruption::Container,
        Disruption::Container => match tracks.iter().position(|t| t.docker) {
            Some(idx) => return kill_container(&tracks[idx].id, tally).await,
            None => Disruption::Agentctl,
        },
        other => other,
    };
    match disruption {
        Disruption::Supervisor => {
            *tally.kills.entry("supervisor".into()).or_default() += 1;
            daemon.kill().await;
            daemon.restart_with_env(&[]).await;
            *api = daemon.api().await;
            return true;
        }
        Disruption::Agentctl => {
            if let Some(&pid) = daemon.sidecars(session).first() {
                *tally.kills.entry("agentctl".into()).or_default() += 1;
                kill(pid);
            }
        }
        Disruption::Agent => {
            let agents: Vec<u32> =
                daemon.sidecars(session).into_iter().flat_map(children_named_mock_agent).collect();
            if let Some(&pid) = agents.first() {
                *tally.kills.entry("agent".into()).or_default() += 1;
                kill(pid);
            }
        }
        Disruption::Container => return kill_container(session, tally).await,
        Disruption::Stop | Disruption::Delete => {
            let (what, answer) = if disruption == Disruption::Stop {
                ("stop", lossy(api.typed().session_stop(session.clone())).await.map(drop))
            } else {
                let delete = api.typed().session_delete(session.clone(), None, None);
                ("delete", lossy(delete).await.map(drop))
            };
            // Armed at `stop.recorded`, the supervisor dies answering: the operator
            // restarts it (disarmed).
            if tokio::time::timeout(GO_AWAY, daemon.wait_exit()).await.is_ok() {
                *tally.kills.entry(format!("supervisor at stop.recorded ({what})")).or_default() +=
                    1;
            } else {
                tally.problem(format!(
                    "the {what} of {session} did not reach stop.recorded (answered {answer:?})"
                ));
                daemon.terminate().await;
            }
            daemon.restart_with_env(&[]).await;
            *api = daemon.api().await;
            return true;
        }
        Disruption::StopAll => {
            *tally.kills.entry("stop-all".into()).or_default() += 1;
            if let Err(err) = lossy(api.typed().stop_all()).await {
                tally.problem(format!("stop-all failed: {err}"));
            }
        }
        Disruption::Fault(_)
        | Disruption::Create(_)
        | Disruption::Workflow(_)
        | Disruption::Queue
        | Disruption::Steer
        | Disruption::Fork
        | Disruption::Rewind
        | Disruption::Wake(_) => {}
    }
    false
}

/// After a wake round: a prompt queued while its agent woke, which the restart left in
/// its queue (or a queue halted by a launch the kill cut short), never ran — stuck.
async fn check_no_prompt_left(api: &Api, tracks: &[SessionTrack], round: u64, tally: &mut Tally) {
    for track in tracks {
        match lossy(api.typed().session_status(track.id.clone())).await {
            Ok(status) if status.queue.prompts.is_empty() && status.queue.halted.is_none() => {}
            Ok(status) => {
                tally.stuck += 1;
                tally.problem(format!(
                    "round {round}: session {} was left with its queue {:?}",
                    track.id, status.queue
                ));
            }
            Err(err) => tally.problem(format!("round {round}: status of {}: {err}", track.id)),
        }
    }
}

/// SIGKILLs a session's container (through the engine).
async fn kill_container(session: &str, tally: &mut Tally) -> bool {
    let Ok(docker) = bollard::Docker::connect_with_defaults() else { return false };
    let name = format!("tether-{session}");
    let options = bollard::query_parameters::KillContainerOptions { signal: "SIGKILL".into() };
    if docker.kill_container(&name, Some(options)).await.is_ok() {
        *tally.kills.entry("container".into()).or_default() += 1;
    }
    false
}

fn docker_profile(image: &str) -> String {
    format!(
        "id = \"mock-docker\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{{home}}/.mock-agent\"]\nprotocol = \"acp\"\n\
         runtime = \"docker\"\n[session]\nnative_resume = true\nagent_state_dirs = [\".mock-agent\"]\n\
         [docker]\nimage = \"{image}\"\nmemory_mb = 256\ncpus = 1.0\n"
    )
}

/// An API call whose answer may be lost (a fault point may kill the daemon meanwhile):
/// bounded by [`tether_tests::within`], any error returned.
async fn lossy<T>(
    call: impl std::future::Future<Output = Result<T, jsonrpsee::core::ClientError>>,
) -> Result<T, jsonrpsee::core::ClientError> {
    tether_tests::within("an API call", call).await
}
