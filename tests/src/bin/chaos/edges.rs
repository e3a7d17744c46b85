//! The rounds at the edges of a session's life: a stop or delete cut short by a kill at
//! `stop.recorded`, a stop-all mid-turn, and a create killed at one of its fault points.

use super::{
    Api, ApiClient, CREATE_CHUNKS, Create, Daemon, Disruption, EventKind, GO_AWAY, Instant, SETTLE,
    SessionState, SessionTrack, Tally, TurnSeen, check_histories, children_named_mock_agent, lossy,
    observe, subscribe_all, went_away,
};

/// A session a round stopped or deleted, and the processes that must go with it.
pub(super) struct Victim {
    pub(super) idx: usize,
    pub(super) pids: Vec<u32>,
}

/// After a stop or delete cut short by a kill at `stop.recorded`, and the restart: nothing
/// of the victim runs on, its end stood (`COMPLETED`), what it streamed is its history once,
/// and a delete can be asked again and succeeds. The victim is replaced by a fresh session
/// (as the setup makes them), so the matrix keeps its size; a stopped one is returned.
pub(super) async fn end_victim(
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
        round_from: 0,
    };
    let old = std::mem::replace(&mut tracks[victim.idx], fresh);
    (disruption == Disruption::Stop).then_some(old)
}

/// After `sessions.stop_all` mid-turn (every turn ended already): no sidecar or agent is
/// left, and each session's history holds what it streamed, once.
pub(super) async fn check_stopped_all(
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
pub(super) async fn create_round(
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
        round_from: 0,
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
