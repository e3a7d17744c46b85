//! The fork rounds: each session of the matrix is forked at its newest turn on a
//! supervisor armed at `fork.history_written` (it dies with a fork's history written and
//! its row not yet stored), then restarted. Afterwards no half-made fork is left (a
//! session that says it is a fork was answered as one: lost otherwise), each fork's
//! history is its original's through the turn it names, and each fork's first prompt runs
//! once, carrying that conversation (lost or duplicated otherwise). The forks are deleted.

use protocol::api::{EntryType, ForkResult};

use super::{Api, ApiClient, Daemon, EventKind, GO_AWAY, SessionTrack, Tally, lossy};

/// Prompts `session` and follows the turn to its end, allowing what the agent asks (the
/// injected history holds the matrix's prompts, whose `/permission` lines mock-agent obeys
/// again); the reply.
pub(super) async fn ask_answering(api: &Api, session: &str, text: &str) -> String {
    let mut events = api.subscribe_at_end(session).await;
    let _ = lossy(api.typed().session_prompt(session.to_owned(), text.to_owned())).await;
    let mut reply = String::new();
    loop {
        let seen = tether_tests::daemon::until(&mut events, |event| {
            matches!(event.kind, EventKind::TurnEnded { .. } | EventKind::PermissionRequest { .. })
        })
        .await;
        reply.push_str(&tether_tests::daemon::chunks(&seen).concat());
        match seen.last().map(|event| &event.kind) {
            Some(EventKind::PermissionRequest { request_id, .. }) => {
                let answer = api.typed().permission_respond(
                    session.to_owned(),
                    request_id.clone(),
                    Some("allow".into()),
                );
                let _ = lossy(answer).await;
            }
            _ => return reply,
        }
    }
}

/// One fork round (see the module doc); `point` is what it was armed with.
pub(super) async fn fork_round(
    daemon: &mut Daemon,
    api: &mut Api,
    tracks: &[SessionTrack],
    round: u64,
    point: &str,
    tally: &mut Tally,
) {
    let mut made: Vec<ForkResult> = Vec::new();
    let mut cut = false;
    for track in tracks.iter().filter(|track| !track.turns.is_empty()) {
        match lossy(api.typed().session_fork(track.id.clone(), None)).await {
            Ok(forked) => made.push(forked),
            Err(jsonrpsee::core::ClientError::Call(err)) => {
                eprintln!("chaos: round {round}: fork of {} refused: {}", track.id, err.message());
            }
            Err(_) => {
                cut = true;
                break;
            }
        }
    }
    if cut && tokio::time::timeout(GO_AWAY, daemon.wait_exit()).await.is_ok() {
        *tally.kills.entry(format!("supervisor at {point} (fork)")).or_default() += 1;
    } else if cut {
        tally.problem(format!("round {round}: a fork's answer was lost but the daemon lives"));
        daemon.terminate().await;
    } else {
        // Not reached (fewer forks than the hit): disarmed for the next round.
        daemon.terminate().await;
    }
    daemon.restart_with_env(&[]).await;
    *api = daemon.api().await;
    check_forks(api, &made, round, tally).await;
    eprintln!("chaos: round {round}: {} fork(s) made and checked, one cut: {cut}", made.len());
    for forked in &made {
        let (code, _, err) = daemon.cli(&["sessions", "delete", &forked.session_id]).await;
        if code != 0 {
            tally.problem(format!(
                "round {round}: deleting fork {} failed: {err}",
                forked.session_id
            ));
        }
    }
}

/// No session is a fork that was not answered as one; each answered fork holds its
/// original's conversation through its turn and runs its first prompt once.
async fn check_forks(api: &Api, made: &[ForkResult], round: u64, tally: &mut Tally) {
    let sessions = lossy(api.typed().session_list(None, None, None)).await.unwrap_or_default();
    for session in &sessions {
        let Ok(status) = lossy(api.typed().session_status(session.id.clone())).await else {
            continue;
        };
        if status.forked_from.is_some() && !made.iter().any(|f| f.session_id == session.id) {
            tally.lost += 1;
            tally.problem(format!("round {round}: {} is a fork nobody was told of", session.id));
        }
    }
    for forked in made {
        let ours = api.history(&forked.session_id).await;
        let theirs = api.history(&forked.forked_from).await;
        let texts = |entries: &[protocol::api::HistoryEntry]| -> Vec<String> {
            entries.iter().map(|entry| entry.content.clone()).collect()
        };
        let through = theirs
            .iter()
            .position(|e| {
                e.kind == EntryType::UserMessage && e.message_id.as_deref() == Some(&forked.turn_id)
            })
            .map(|at| {
                let after = theirs[at + 1..].iter().position(|e| e.kind == EntryType::UserMessage);
                after.map_or(theirs.len(), |n| at + 1 + n)
            });
        if through.map(|n| texts(&theirs[..n])) != Some(texts(&ours)) {
            tally.lost += 1;
            tally.problem(format!(
                "round {round}: fork {} does not hold {}'s conversation through {}",
                forked.session_id, forked.forked_from, forked.turn_id
            ));
            continue;
        }
        let tag = format!("chaos fork round {round}");
        let reply = ask_answering(api, &forked.session_id, &tag).await;
        let asked = api.history(&forked.session_id).await;
        let prompts =
            asked.iter().filter(|e| e.kind == EntryType::UserMessage && e.content == tag).count();
        if prompts != 1 || !reply.contains(&tag) {
            tally.duplicated += u64::from(prompts > 1);
            tally.problem(format!(
                "round {round}: fork {} ran its prompt {prompts} times",
                forked.session_id
            ));
        }
    }
}
