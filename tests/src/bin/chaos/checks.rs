//! What the matrix checks and counts: each event a subscriber sees (seqs gapless and
//! unique, a turn's chunks once and in order), the processes left (one sidecar, one agent,
//! no orphan), and each session's history against its stream.

use super::{
    Api, ApiClient, Daemon, Duration, EntryType, EventKind, GO_AWAY, HashMap, PidFd, SessionEvent,
    SessionTrack, Tally, TurnSeen, chunk_key, lossy,
};

/// Folds one event into what the subscriber saw; checks seqs are gapless and unique.
pub(super) fn observe(
    track: &mut SessionTrack,
    event: &SessionEvent,
    tally: &mut Tally,
    round: u64,
) {
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
    let id = track.id.clone();
    // This round's turns, in the order they were prompted (a queue round has two).
    let turns = track.round_mut();
    match &event.kind {
        EventKind::TurnStarted { turn_id, prompt, .. } => {
            let Some(turn) = turns.iter_mut().find(|turn| prompt.contains(&turn.tag)) else {
                return;
            };
            match &turn.turn_id {
                Some(started) if started != turn_id => {
                    tally.duplicated += 1;
                    tally.problem(format!(
                        "round {round}: {id} ran the prompt of '{}' twice ({started}, {turn_id})",
                        turn.tag
                    ));
                }
                _ => turn.turn_id = Some(turn_id.clone()),
            }
        }
        EventKind::AgentMessageChunk { text, .. } => {
            // One turn runs at a time: the newest started one that has not ended.
            let running =
                turns.iter_mut().rev().find(|turn| turn.turn_id.is_some() && turn.ended.is_none());
            if let Some(turn) = running {
                turn.chunks.push(text.clone());
                turn.chunk_seqs.push(seq);
            }
        }
        EventKind::TurnEnded { turn_id, state, stop_reason, .. } => {
            if let Some(turn) = turns.iter_mut().find(|turn| turn.turn_id.as_ref() == Some(turn_id))
            {
                // A cancelled turn (a steer's fallback) streams a prefix, as a failed one.
                let cancelled = stop_reason.as_deref() == Some("cancelled");
                let how = if cancelled { "cancelled" } else { state.as_str() };
                turn.ended = Some(how.to_owned());
                check_turn(&id, turn, tally, round);
            }
        }
        _ => {}
    }
}

/// A completed turn holds every expected chunk once, in order; a failed one a prefix.
pub(super) fn check_turn(session: &str, turn: &TurnSeen, tally: &mut Tally, round: u64) {
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

/// At most one sidecar per session and one agent per sidecar; no agent without a sidecar.
pub(super) async fn check_processes(daemon: &Daemon, tracks: &[SessionTrack], tally: &mut Tally) {
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
pub(super) async fn check_histories(api: &Api, tracks: &[SessionTrack], tally: &mut Tally) {
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
                        // Tether's note on a reply its failed turn cut off is no output
                        // (a spool tail replayed after a restart may follow it).
                        let content = tether_tests::without_cut_off_notes(&entry.content);
                        recorded.entry(tag.clone()).or_default().push_str(&content);
                    }
                }
                _ => {}
            }
        }
        for turn in &track.turns {
            // Stripped on both sides: an agent that echoes a resume context it was given
            // (the mock agent does) streams the notes that context quotes.
            let streamed = tether_tests::without_cut_off_notes(&turn.chunks.concat());
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

pub(super) fn print_table(tally: &Tally, took: Duration) {
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

/// Whether a process goes away within [`GO_AWAY`] (awaited on its pidfd).
pub(super) async fn went_away(pid: u32) -> bool {
    match PidFd::open(pid) {
        Ok(pidfd) => tokio::time::timeout(GO_AWAY, pidfd.exited()).await.is_ok(),
        Err(_) => true,
    }
}

/// The mock-agent processes whose parent is `agentctl`.
pub(super) fn children_named_mock_agent(agentctl: u32) -> Vec<u32> {
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

pub(super) fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()
}

pub(super) fn kill(pid: u32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}
