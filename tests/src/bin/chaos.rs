//! `chaos`: the fault matrix. Drives a real `supervisor serve` with several mock sessions
//! streaming long turns (several messages, tool calls, a permission request), a subscriber
//! per session that reconnects from its last seq, and, each round, one disruption chosen by
//! a seeded generator: SIGKILL of the supervisor (at a random moment, or at a named fault
//! point through `TETHER_FAULT`), of a session's agentctl, of its agent, or — with a Docker
//! engine (required under `REQUIRE_DOCKER=1`), where one more session runs in a container —
//! of that session's container. The operator's part (restarting the supervisor) is done as
//! an operator would.
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
//! Usage: `chaos [--rounds N] [--sessions N] [--seed N] [--no-docker]`. Exit code 1 when any column is
//! not zero. Run by `scripts/chaos.sh`.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use agentctl::process::PidFd;
use jsonrpsee::core::client::Subscription;
use protocol::api::{ApiClient, EntryType, EventKind, SessionEvent};
use tether_tests::daemon::{Api, Daemon};
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
    ended: Option<String>,
    /// The prompt call failed (the daemon died answering it): the turn may never start.
    prompt_failed: bool,
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
}

/// The chunk's identity: `<rK:n/N>` for round chunks, `[n/N]` for the final reply's.
fn chunk_key(text: &str) -> String {
    match (text.rfind('<'), text.rfind('[')) {
        (Some(at), _) if text.ends_with('>') => text[at..].to_owned(),
        (_, Some(at)) if text.ends_with(']') => text[at..].to_owned(),
        _ => text.to_owned(),
    }
}

fn expected_keys() -> Vec<String> {
    let mut keys = Vec::new();
    for round in 1..ROUNDS_PER_TURN {
        for n in 1..=CHUNKS {
            keys.push(format!("<r{round}:{n}/{CHUNKS}>"));
        }
    }
    for n in 1..=CHUNKS {
        keys.push(format!("[{n}/{CHUNKS}]"));
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
    for round in 1..=rounds {
        tally.rounds += 1;
        let disruption = match rng.below(if docker.is_some() { 5 } else { 4 }) {
            0 => Disruption::Supervisor,
            1 => Disruption::Fault(FAULT_POINTS[rng.below(FAULT_POINTS.len() as u64) as usize]),
            2 => Disruption::Agentctl,
            3 => Disruption::Agent,
            _ => Disruption::Container,
        };
        if let Disruption::Fault(point) = disruption {
            // Armed through a clean restart (SIGTERM leaves the sidecars running).
            let hit = 1 + rng.below(3);
            daemon.terminate().await;
            daemon.restart_with_env(&[("TETHER_FAULT", &format!("{point}@{hit}"))]).await;
            api = daemon.api().await;
        }
        let before = tally.problems.len();
        run_round(&mut daemon, &mut api, &mut tracks, round, disruption, &mut rng, &mut tally)
            .await;
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
    // The end: stop-all leaves nothing behind, and neither does the daemon.
    let (code, _, err) = daemon.cli(&["stop-all"]).await;
    if code != 0 {
        tally.problem(format!("stop-all failed: {err}"));
    }
    for track in &tracks {
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
    for track in &tracks {
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

/// One round: a turn on every session, one disruption, then everything settles.
async fn run_round(
    daemon: &mut Daemon,
    api: &mut Api,
    tracks: &mut [SessionTrack],
    round: u64,
    disruption: Disruption,
    rng: &mut Rng,
    tally: &mut Tally,
) {
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
    if let Disruption::Fault(_) = disruption {
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
    let expected = expected_keys();
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
        tally.problem(format!(
            "round {round}: {session} completed with {} of {} chunks",
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
        Disruption::Fault(_) => {}
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
