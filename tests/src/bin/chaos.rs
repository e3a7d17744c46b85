//! `chaos`: the fault matrix. Drives a real `supervisor serve` with several mock sessions
//! streaming long turns (several messages, tool calls, a permission request), a subscriber
//! per session that reconnects from its last seq, and, each round, one disruption chosen by
//! a seeded generator: SIGKILL of the supervisor (at a random moment, or at a named fault
//! point through `TETHER_FAULT`), of a session's agentctl, of its agent, or — with a Docker
//! engine (required under `REQUIRE_DOCKER=1`), where one more session runs in a container —
//! of that session's container. The operator's part (restarting the supervisor) is done as
//! an operator would.
//!
//! One round in ten each is an edge of a session's life instead:
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
//!   what it streamed, once, and no sidecar or agent is left. The next round's prompts
//!   resume the sessions.
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

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use agentctl::process::PidFd;
use jsonrpsee::core::client::Subscription;
use protocol::api::{ApiClient, EntryType, EventKind, SessionEvent, SessionState};
use tether_tests::daemon::{Api, Create, Daemon};
use tokio::sync::mpsc;
use tokio::time::Instant;

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
}

impl Disruption {
    /// The `TETHER_FAULT` the supervisor is armed with for the round (through a clean
    /// restart); draws the hit for a [`Disruption::Fault`].
    fn armed(self, rng: &mut Rng) -> Option<String> {
        match self {
            Disruption::Fault(point) => Some(format!("{point}@{}", 1 + rng.below(3))),
            Disruption::Create(point) => Some(point.to_owned()),
            Disruption::Stop | Disruption::Delete => Some("stop.recorded".to_owned()),
            _ => None,
        }
    }

    /// Whether `--only NAME` keeps this disruption (its lowercased name starts with it).
    fn named(self, only: &str) -> bool {
        format!("{self:?}").to_lowercase().starts_with(&only.to_lowercase())
    }

    /// A seeded choice: the kills of a running session six times in ten, each edge of a
    /// session's life (create, stop, delete, stop-all) once in ten.
    fn choose(rng: &mut Rng, docker: bool) -> Disruption {
        match rng.below(10) {
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
            _ => Disruption::StopAll,
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
        tracks.push(SessionTrack { id, docker: false, last_seq: 0, turns: Vec::new() });
    }
    if docker.is_some() {
        let id = api.ready_session("mock-docker", &daemon.workspace("docker")).await;
        tracks.push(SessionTrack { id, docker: true, last_seq: 0, turns: Vec::new() });
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
    let (mut readers, mut events_rx) = subscribe_all(api, tracks).await;
    for (idx, track) in tracks.iter_mut().enumerate() {
        let permission = if rng.below(2) == 0 { "\n/permission" } else { "" };
        let tag = format!("chaos round {round} session {idx}");
        let prompt = format!("/stream {CHUNKS}\n/rounds {ROUNDS_PER_TURN}{permission}\n{tag}");
        track.turns.push(TurnSeen { tag, ..Default::default() });
        let sent = lossy(api.typed().session_prompt(track.id.clone(), prompt)).await;
        if let Err(err) = sent {
            // A fault point may fire while the prompt is accepted: it may or may not start.
            eprintln!("chaos: round {round}: prompt to {} not answered: {err}", track.id);
            // Only a lost answer, not a refusal: a refused prompt is a finding.
            let lost_answer = !matches!(err, jsonrpsee::core::ClientError::Call(_));
            if let Some(turn) = track.turns.last_mut() {
                turn.prompt_failed = lost_answer;
            }
        }
    }
    let victim = rng.below(tracks.len() as u64) as usize;
    let strike_at = 1 + rng.below((CHUNKS * ROUNDS_PER_TURN) as u64 * tracks.len() as u64 / 2);
    let mut seen_in_round = 0u64;
    let mut struck = false;
    // What of the victim must go with its stop or delete: its sidecar and agent.
    let mut doomed = Vec::new();
    let mut settle_from = Instant::now();
    loop {
        let all_ended =
            tracks.iter().all(|t| t.turns.last().is_some_and(|turn| turn.ended.is_some()));
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
                    t.turns.last().is_some_and(|turn| {
                        turn.ended.is_some() || (turn.turn_id.is_none() && turn.prompt_failed)
                    })
                }) =>
            {
                // Only prompts lost with a dying daemon are left, and they never started.
                for track in tracks.iter_mut() {
                    if let Some(turn) = track.turns.last_mut().filter(|turn| turn.ended.is_none()) {
                        turn.ended = Some("not_started".into());
                    }
                }
                break;
            }
            Err(_) => {
                for track in tracks
                    .iter()
                    .filter(|t| t.turns.last().is_some_and(|turn| turn.ended.is_none()))
                {
                    tally.stuck += 1;
                    let status = lossy(api.typed().session_status(track.id.clone()))
                        .await
                        .map(|s| format!("{s:?}"))
                        .unwrap_or_else(|err| err.to_string());
                    let turn = track.turns.last().expect("UNWRAP: filtered on it");
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
            let died = matches!(disruption, Disruption::Fault(_))
                && tokio::time::timeout(GO_AWAY, daemon.wait_exit()).await.is_ok();
            if died {
                if let Disruption::Fault(point) = disruption {
                    *tally.kills.entry(format!("supervisor at {point}")).or_default() += 1;
                }
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
        if !struck && seen_in_round >= strike_at && !matches!(disruption, Disruption::Fault(_)) {
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
        Disruption::Fault(_) => true,
        Disruption::Stop | Disruption::Delete => !struck,
        _ => false,
    };
    if still_armed {
        // Disarm for the next round.
        if !daemon.has_exited() {
            daemon.terminate().await;
        }
        daemon.restart_with_env(&[]).await;
        *api = daemon.api().await;
    }
    for track in tracks.iter() {
        match track.turns.last().and_then(|turn| turn.ended.as_deref()) {
            Some("completed") => tally.turns_completed += 1,
            Some(_) => tally.turns_failed += 1,
            None => {}
        }
    }
    match disruption {
        Disruption::Stop | Disruption::Delete if struck => {
            let victim = Victim { idx: victim, pids: doomed };
            end_victim(daemon, api, tracks, victim, disruption, round, tally).await
        }
        Disruption::StopAll if struck => {
            check_stopped_all(daemon, api, tracks, round, tally).await;
            None
        }
        _ => None,
    }
}

/// A session a round stopped or deleted, and the processes that must go with it.
struct Victim {
    idx: usize,
    pids: Vec<u32>,
}

/// After a stop or delete cut short by a kill at `stop.recorded`, and the restart: nothing
/// of the victim runs on, its end stood (`COMPLETED`), what it streamed is its history once,
/// and a delete can be asked again and succeeds. The victim is replaced by a fresh session
/// (as the setup makes them), so the matrix keeps its size; a stopped one is returned.
async fn end_victim(
    daemon: &Daemon,
    api: &Api,
    tracks: &mut [SessionTrack],
    victim: Victim,
    disruption: Disruption,
    round: u64,
    tally: &mut Tally,
) -> Option<SessionTrack> {
    let track = &tracks[victim.idx];
    let id = track.id.clone();
    let mut pids = victim.pids;
    pids.extend(daemon.sidecars(&id));
    pids.sort_unstable();
    pids.dedup();
    for pid in pids {
        if !went_away(pid).await {
            tally.orphans += 1;
            tally.problem(format!(
                "round {round}: process {pid} of {id} outlived its {disruption:?} by {GO_AWAY:?}"
            ));
        }
    }
    match lossy(api.typed().session_status(id.clone())).await {
        Ok(status) if status.state == SessionState::Completed => {}
        Ok(status) => {
            tally.lost += 1;
            tally.problem(format!(
                "round {round}: {id} is {} after its {disruption:?} (want COMPLETED): {status:?}",
                status.state
            ));
        }
        Err(err) => tally.problem(format!("round {round}: status of {id}: {err}")),
    }
    check_histories(api, std::slice::from_ref(track), tally).await;
    if disruption == Disruption::Delete {
        // The delete was cut short: asked again, it goes through.
        if let Err(err) = lossy(api.typed().session_delete(id.clone(), None, None)).await {
            tally.orphans += 1;
            tally.problem(format!("round {round}: the second delete of {id} failed: {err}"));
        }
    }
    let profile = if track.docker { "mock-docker" } else { "mock" };
    let docker = track.docker;
    let workspace = daemon.workspace(&format!("s{}-r{round}", victim.idx));
    let fresh = SessionTrack {
        id: api.ready_session(profile, &workspace).await,
        docker,
        last_seq: 0,
        turns: Vec::new(),
    };
    let old = std::mem::replace(&mut tracks[victim.idx], fresh);
    (disruption == Disruption::Stop).then_some(old)
}

/// After `sessions.stop_all` mid-turn (every turn ended already): no sidecar or agent is
/// left, and each session's history holds what it streamed, once.
async fn check_stopped_all(
    daemon: &Daemon,
    api: &Api,
    tracks: &[SessionTrack],
    round: u64,
    tally: &mut Tally,
) {
    for track in tracks.iter().filter(|track| !track.docker) {
        for pid in daemon.sidecars(&track.id) {
            if !went_away(pid).await {
                tally.orphans += 1;
                tally.problem(format!(
                    "round {round}: sidecar {pid} of {} survived stop-all",
                    track.id
                ));
            }
        }
    }
    for pid in Daemon::processes_mentioning(&daemon.root.path().join(".mock-agent")) {
        if !went_away(pid).await {
            tally.orphans += 1;
            tally.problem(format!("round {round}: agent {pid} survived stop-all"));
        }
    }
    check_histories(api, tracks, tally).await;
}

/// A create round: a new session (its first prompt given with the create) while the
/// supervisor is armed at `point`, which kills it after the session's row is stored and
/// before its agent is up. After the operator's restart the session is found in its task,
/// resumed if it asks to be, and its first prompt runs exactly once, whole; then it is
/// stopped (and nothing of it may run on). Returns it, stopped.
async fn create_round(
    daemon: &mut Daemon,
    api: &mut Api,
    round: u64,
    point: &'static str,
    tally: &mut Tally,
) -> Option<SessionTrack> {
    let tag = format!("chaos create round {round}");
    let task = match lossy(api.typed().task_create(format!("chaos create {round}"), None)).await {
        Ok(task) => task,
        Err(err) => {
            tally.problem(format!("round {round}: task.create: {err}"));
            return None;
        }
    };
    let workspace = daemon.workspace(&format!("create-r{round}"));
    let create = Create {
        prompt: Some(format!("/stream {CREATE_CHUNKS}\n{tag}")),
        ..Create::new(&task.id, "mock", Some(&workspace))
    };
    // The daemon dies at the point: the answer may or may not arrive.
    let answer = lossy(create.send(api.typed())).await;
    if tokio::time::timeout(GO_AWAY, daemon.wait_exit()).await.is_ok() {
        *tally.kills.entry(format!("supervisor at {point} (create)")).or_default() += 1;
    } else {
        tally.problem(format!(
            "round {round}: the create did not reach {point} (answered {:?})",
            answer.map(|row| row.id)
        ));
        daemon.terminate().await;
    }
    daemon.restart_with_env(&[]).await;
    *api = daemon.api().await;
    let listed = match lossy(api.typed().session_list(Some(task.id.clone()), None, None)).await {
        Ok(listed) => listed,
        Err(err) => {
            tally.problem(format!("round {round}: task.session.list: {err}"));
            return None;
        }
    };
    let Some(row) = listed.first() else {
        // Every create point fires after the row is stored.
        tally.lost += 1;
        tally.problem(format!("round {round}: the session created at {point} is not stored"));
        return None;
    };
    if listed.len() > 1 {
        tally.duplicated += (listed.len() - 1) as u64;
        tally.problem(format!(
            "round {round}: one create at {point} stored {} sessions",
            listed.len()
        ));
    }
    let mut track = SessionTrack {
        id: row.id.clone(),
        docker: false,
        last_seq: 0,
        turns: vec![TurnSeen {
            tag: tag.clone(),
            shape: Some((CREATE_CHUNKS, 1)),
            ..Default::default()
        }],
    };
    // Subscribed before a resume, from the start: nothing it publishes is missed.
    let (readers, mut events_rx) = subscribe_all(api, std::slice::from_ref(&track)).await;
    match lossy(api.typed().session_status(track.id.clone())).await {
        Ok(status) if status.needs_resume => {
            if let Err(err) = lossy(api.typed().session_resume(track.id.clone(), None)).await {
                tally.problem(format!("round {round}: resuming {} failed: {err}", track.id));
            }
        }
        // Re-attached (or attaching): the prompt goes on by itself.
        Ok(_) => {}
        Err(err) => tally.problem(format!("round {round}: status of {}: {err}", track.id)),
    }
    let deadline = Instant::now() + SETTLE;
    let mut tagged_turns = 0;
    while track.turns[0].ended.is_none() {
        match tokio::time::timeout_at(deadline, events_rx.recv()).await {
            Ok(Some((_, Some(event)))) => {
                if matches!(&event.kind, EventKind::TurnStarted { prompt, .. } if prompt.contains(&tag))
                {
                    tagged_turns += 1;
                }
                observe(&mut track, &event, tally, round);
            }
            Ok(Some((_, None))) | Ok(None) => {
                tally.problem(format!("round {round}: the subscription to {} ended", track.id));
                break;
            }
            Err(_) => break,
        }
    }
    let turn = &track.turns[0];
    match turn.ended.as_deref() {
        None => {
            tally.stuck += 1;
            let status = lossy(api.typed().session_status(track.id.clone()))
                .await
                .map(|s| format!("{s:?}"))
                .unwrap_or_else(|err| err.to_string());
            tally.problem(format!(
                "round {round}: the first prompt of {} (created at {point}) did not run to its end (turn {:?}, {} chunks): {status}",
                track.id,
                turn.turn_id,
                turn.chunks.len()
            ));
        }
        Some("completed") if turn.chunks.len() == CREATE_CHUNKS => tally.turns_completed += 1,
        Some(state) => {
            tally.turns_failed += 1;
            tally.lost += 1;
            tally.problem(format!(
                "round {round}: the first prompt of {} (created at {point}) ended {state} with {} of {CREATE_CHUNKS} chunks",
                track.id,
                turn.chunks.len()
            ));
        }
    }
    if tagged_turns > 1 {
        tally.duplicated += tagged_turns - 1;
        tally.problem(format!(
            "round {round}: the first prompt of {} ran {tagged_turns} times",
            track.id
        ));
    }
    // Stopped, so created sessions do not pile up: nothing of it may run on.
    let doomed: Vec<u32> = daemon
        .sidecars(&track.id)
        .into_iter()
        .flat_map(|pid| std::iter::once(pid).chain(children_named_mock_agent(pid)))
        .collect();
    if let Err(err) = lossy(api.typed().session_stop(track.id.clone())).await {
        tally.problem(format!("round {round}: stopping {} failed: {err}", track.id));
    }
    readers.iter().for_each(|reader| reader.abort());
    for pid in doomed.into_iter().chain(daemon.sidecars(&track.id)) {
        if !went_away(pid).await {
            tally.orphans += 1;
            tally
                .problem(format!("round {round}: process {pid} of {} outlived its stop", track.id));
        }
    }
    // Its prompt is in the history once, with what it streamed.
    check_histories(api, std::slice::from_ref(&track), tally).await;
    Some(track)
}

/// Ends what did not settle, so the next round starts clean (already counted as stuck).
async fn unstick(api: &Api, tracks: &mut [SessionTrack]) {
    for track in tracks.iter_mut() {
        if let Some(turn) = track.turns.last_mut().filter(|turn| turn.ended.is_none()) {
            let _ = lossy(api.typed().session_cancel(track.id.clone())).await;
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

/// Folds one event into what the subscriber saw; checks seqs are gapless and unique.
fn observe(track: &mut SessionTrack, event: &SessionEvent, tally: &mut Tally, round: u64) {
    let seq = event.seq;
    if seq <= track.last_seq {
        tally.duplicated += 1;
        tally.problem(format!("round {round}: {} event {seq} delivered twice", track.id));
        return;
    }
    if seq > track.last_seq + 1 && track.last_seq > 0 {
        tally.lost += seq - track.last_seq - 1;
        tally.problem(format!(
            "round {round}: {} events {}..{seq} missing",
            track.id,
            track.last_seq + 1
        ));
    }
    track.last_seq = seq;
    let Some(turn) = track.turns.last_mut() else { return };
    match &event.kind {
        EventKind::TurnStarted { turn_id, prompt } if prompt.contains(&turn.tag) => {
            turn.turn_id = Some(turn_id.clone());
        }
        EventKind::AgentMessageChunk { text } if turn.turn_id.is_some() && turn.ended.is_none() => {
            turn.chunks.push(text.clone());
            turn.chunk_seqs.push(seq);
        }
        EventKind::TurnEnded { turn_id, state, .. } if turn.turn_id.as_ref() == Some(turn_id) => {
            turn.ended = Some(state.as_str().to_owned());
            check_turn(&track.id, turn, tally, round);
        }
        _ => {}
    }
}

/// A completed turn holds every expected chunk once, in order; a failed one a prefix.
fn check_turn(session: &str, turn: &TurnSeen, tally: &mut Tally, round: u64) {
    let keys: Vec<String> = turn.chunks.iter().map(|text| chunk_key(text)).collect();
    let expected = turn.expected();
    let mut unique = keys.clone();
    unique.sort();
    unique.dedup();
    if unique.len() != keys.len() {
        tally.duplicated += (keys.len() - unique.len()) as u64;
        tally.problem(format!("round {round}: {session} streamed a chunk twice"));
    }
    let completed = turn.ended.as_deref() == Some("completed");
    let prefix_ok = keys.len() <= expected.len() && keys[..] == expected[..keys.len()];
    if completed && keys.len() < expected.len() {
        tally.lost += (expected.len() - keys.len()) as u64;
        // Where the first hole is: the chunks (and their event seqs) on either side.
        let hole = keys.iter().zip(&expected).position(|(got, want)| got != want);
        let at = match hole {
            Some(0) => format!(" (the first, {}, missing)", expected[0]),
            Some(i) => format!(
                " (after {} at event {}, {} came at event {})",
                keys[i - 1],
                turn.chunk_seqs[i - 1],
                keys[i],
                turn.chunk_seqs[i]
            ),
            None => " (the last missing)".into(),
        };
        tally.problem(format!(
            "round {round}: {session} completed with {} of {} chunks{at}",
            keys.len(),
            expected.len()
        ));
    } else if !prefix_ok && unique.len() == keys.len() {
        tally.lost += 1;
        tally.problem(format!(
            "round {round}: {session} streamed chunks out of order or with a hole"
        ));
    }
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
        Disruption::Fault(_) | Disruption::Create(_) => {}
    }
    false
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

fn kill(pid: u32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()
}

/// The mock-agent processes whose parent is `agentctl`.
fn children_named_mock_agent(agentctl: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()))
        .filter(|&pid| parent_of(pid) == Some(agentctl))
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie =
                stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z'));
            !zombie && String::from_utf8_lossy(&cmdline).contains("mock-agent")
        })
        .collect()
}

/// Whether a process goes away within [`GO_AWAY`] (awaited on its pidfd).
async fn went_away(pid: u32) -> bool {
    match PidFd::open(pid) {
        Ok(pidfd) => tokio::time::timeout(GO_AWAY, pidfd.exited()).await.is_ok(),
        Err(_) => true,
    }
}

/// At most one sidecar per session and one agent per sidecar; no agent without a sidecar.
async fn check_processes(daemon: &Daemon, tracks: &[SessionTrack], tally: &mut Tally) {
    let mut owned: HashMap<u32, u32> = HashMap::new();
    for track in tracks.iter().filter(|track| !track.docker) {
        let mut sidecars = daemon.sidecars(&track.id);
        if sidecars.len() > 1 {
            // Give a sidecar being retired its moment to go.
            let mut alive = Vec::new();
            for pid in sidecars {
                if !went_away(pid).await || alive.is_empty() {
                    alive.push(pid);
                }
            }
            sidecars = alive.into_iter().filter(|pid| agentctl::process::is_alive(*pid)).collect();
            if sidecars.len() > 1 {
                tally.doubled += (sidecars.len() - 1) as u64;
                tally.problem(format!(
                    "{} has {} live sidecars: {sidecars:?}",
                    track.id,
                    sidecars.len()
                ));
            }
        }
        for sidecar in sidecars {
            let agents = children_named_mock_agent(sidecar);
            if agents.len() > 1 {
                tally.doubled += (agents.len() - 1) as u64;
                tally.problem(format!(
                    "sidecar {sidecar} of {} runs {} agents",
                    track.id,
                    agents.len()
                ));
            }
            for agent in agents {
                owned.insert(agent, sidecar);
            }
        }
    }
    for pid in Daemon::processes_mentioning(&daemon.root.path().join(".mock-agent")) {
        if owned.contains_key(&pid) || parent_of(pid).is_some_and(|p| owned.contains_key(&p)) {
            continue;
        }
        // An agent whose sidecar just died dies with it: give it its moment.
        if !went_away(pid).await {
            tally.orphans += 1;
            tally
                .problem(format!("agent {pid} runs with no sidecar (parent {:?})", parent_of(pid)));
        }
    }
}

/// Each turn's recorded agent text is exactly what was streamed for it.
async fn check_histories(api: &Api, tracks: &[SessionTrack], tally: &mut Tally) {
    for track in tracks {
        let history =
            match lossy(api.typed().session_history(track.id.clone(), None, Some(100_000))).await {
                Ok(history) => history,
                Err(err) => {
                    tally.problem(format!("history of {}: {err}", track.id));
                    continue;
                }
            };
        let mut recorded: HashMap<String, String> = HashMap::new();
        let mut user_turns: HashMap<String, u64> = HashMap::new();
        let mut current: Option<String> = None;
        for entry in history {
            match entry.kind {
                EntryType::UserMessage => {
                    let content = entry.content.as_str();
                    current = track
                        .turns
                        .iter()
                        .find(|t| content.contains(&t.tag))
                        .map(|t| t.tag.clone());
                    if let Some(tag) = &current {
                        *user_turns.entry(tag.clone()).or_default() += 1;
                    }
                }
                EntryType::AgentMessage => {
                    if let Some(tag) = &current {
                        recorded.entry(tag.clone()).or_default().push_str(&entry.content);
                    }
                }
                _ => {}
            }
        }
        for turn in &track.turns {
            let streamed = turn.chunks.concat();
            let got = recorded.get(&turn.tag).cloned().unwrap_or_default();
            if turn.turn_id.is_some() && user_turns.get(&turn.tag).copied().unwrap_or(0) != 1 {
                tally.duplicated += 1;
                tally.problem(format!(
                    "{}: the prompt of '{}' is in the history {} times",
                    track.id,
                    turn.tag,
                    user_turns.get(&turn.tag).copied().unwrap_or(0)
                ));
            }
            if got == streamed {
                continue;
            }
            if got.len() > streamed.len() {
                tally.duplicated += 1;
            } else {
                tally.lost += 1;
            }
            tally.problem(format!(
                "{}: '{}' history holds {} bytes, the stream {} bytes",
                track.id,
                turn.tag,
                got.len(),
                streamed.len()
            ));
        }
    }
}

fn print_table(tally: &Tally, took: Duration) {
    let kills: Vec<String> =
        tally.kills.iter().map(|(target, n)| format!("{target}: {n}")).collect();
    println!("chaos fault matrix ({:.0} s)", took.as_secs_f64());
    println!(
        "| rounds | turns completed | turns failed | kills | lost | duplicated | stuck | orphans | doubled agents |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        tally.rounds,
        tally.turns_completed,
        tally.turns_failed,
        kills.join(", "),
        tally.lost,
        tally.duplicated,
        tally.stuck,
        tally.orphans,
        tally.doubled
    );
    // Each round is one check, and the end-of-run checks (histories, stop-all) one more.
    let checks = tally.rounds + 1;
    println!("chaos: {} passed, {} failed", checks - tally.rounds_failed, tally.rounds_failed);
}

/// An API call whose answer may be lost (a fault point may kill the daemon meanwhile):
/// bounded by [`tether_tests::within`], any error returned.
async fn lossy<T>(
    call: impl std::future::Future<Output = Result<T, jsonrpsee::core::ClientError>>,
) -> Result<T, jsonrpsee::core::ClientError> {
    tether_tests::within("an API call", call).await
}
