//! Damaged, cut and deleted files under a session, met while it runs or at a restart: the
//! damage is said once, where it is, and everything else reaches the stream, the history and
//! the next turn.

use protocol::api::{EntryType, EventKind, SessionEvent, SessionState};
use tether_tests::daemon::{Api, Daemon, chunks, notices, until};
use tether_tests::within;

/// A session event log's segments, oldest first.
fn event_log_segments(daemon: &Daemon, session: &str) -> Vec<std::path::PathBuf> {
    let mut segments: Vec<_> = std::fs::read_dir(daemon.session_dir(session).join("events"))
        .expect("the event log is there")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "jsonl"))
        .collect();
    segments.sort();
    segments
}

/// Overwrites the line of `dir`'s segments that starts with `{"seq":SEQ,` with garbage of
/// the same length (its newline kept); returns where it was (`FILE:LINE`).
fn garble_line(segments: &[std::path::PathBuf], seq: u64) -> String {
    let prefix = format!("{{\"seq\":{seq},");
    for path in segments {
        let mut text = std::fs::read(path).unwrap();
        let mut start = 0;
        for (number, line) in text.clone().split(|&b| b == b'\n').enumerate() {
            if line.starts_with(prefix.as_bytes()) {
                text[start..start + line.len()].fill(b'#');
                std::fs::write(path, &text).unwrap();
                return format!("{}:{}", path.display(), number + 1);
            }
            start += line.len() + 1;
        }
    }
    panic!("no line of seq {seq} in {segments:?}")
}

/// A client that follows the documented rule (docs/api.md, the delivery contract): a seq
/// past the last one + 1 is a dropped notification, so it resubscribes after the last
/// one. Reads until the event `last`; fails after `max_resubscribes` resubscriptions.
async fn follow_by_the_gap_rule(
    api: &Api,
    session: &str,
    after: u64,
    last: u64,
    max_resubscribes: usize,
) -> Vec<SessionEvent> {
    let mut cursor = after;
    let mut seen = Vec::new();
    let mut resubscribes = 0;
    let mut batches = api.subscribe_batches(session, cursor).await;
    while cursor < last {
        let batch = within("a batch", batches.next()).await.expect("open").expect("parses");
        for event in batch.0 {
            if event.seq <= cursor || cursor == last {
                continue;
            }
            if event.seq > cursor + 1 {
                resubscribes += 1;
                assert!(
                    resubscribes <= max_resubscribes,
                    "a gap after {cursor} (seq {}) again and again: the client never gets past it",
                    event.seq
                );
                batches = api.subscribe_batches(session, cursor).await;
                break;
            }
            cursor = event.seq;
            seen.push(event);
        }
    }
    seen
}

/// A session whose turn streamed `count` chunks and ended: its events, from the turn's
/// `RUNNING` on.
async fn streamed_turn(api: &Api, daemon: &Daemon, count: usize) -> (String, Vec<SessionEvent>) {
    let session = api.ready_session("mock", &daemon.workspace("damage")).await;
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, &format!("/stream {count}\nstreamed")).await.unwrap();
    let mut seen = until(&mut events, |e| {
        matches!(&e.kind, EventKind::State { state: SessionState::Running, .. })
    })
    .await;
    seen.drain(..seen.len() - 1);
    seen.extend(
        until(&mut events, |e| {
            matches!(&e.kind, EventKind::State { state: SessionState::WaitingForInput, .. })
        })
        .await,
    );
    (session, seen)
}

/// A damaged line of a session's event log is said to its subscribers in its place (a
/// notice at its seq, naming file and line), so a client following the gap rule moves past
/// it, and `supervisor follow` shows everything after it.
#[tokio::test]
async fn a_damaged_event_log_line_is_said_in_its_place_and_the_stream_goes_on() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let (session, turn) = streamed_turn(&api, &daemon, 60).await;
    let (running, last) = (turn[0].seq, turn.last().unwrap().seq);
    let damaged = running + 10;
    let at = garble_line(&event_log_segments(&daemon, &session), damaged);

    let seen = follow_by_the_gap_rule(&api, &session, running, last, 3).await;
    let seqs: Vec<u64> = seen.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (running + 1..=last).collect::<Vec<_>>(), "every seq, once, in order");
    let said = &seen[(damaged - running - 1) as usize];
    let EventKind::Notice { message } = &said.kind else { panic!("not a notice: {said:?}") };
    assert!(message.contains("unreadable") && message.contains(&at), "{message}");
    assert_eq!(chunks(&seen).len(), 59, "every other chunk");

    // `follow` ends with the session.
    protocol::api::ApiClient::session_stop(api.typed(), session.clone()).await.unwrap();
    let (code, out, err) =
        daemon.cli(&["follow", &session, "--after", &running.to_string(), "--json"]).await;
    assert_eq!(code, 0, "{err}\n{out}");
    let followed: Vec<SessionEvent> =
        out.lines().map(|line| serde_json::from_str(line).expect(line)).collect();
    let followed_seqs: Vec<u64> = followed.iter().map(|e| e.seq).collect();
    assert_eq!(followed_seqs[..seqs.len()], seqs, "follow shows the rest: {err}");
    assert!(
        matches!(
            followed.last().unwrap().kind,
            EventKind::State { state: SessionState::Completed, .. }
        ),
        "{followed:?}"
    );
    assert_eq!(notices(&followed).iter().filter(|n| n.contains(&at)).count(), 1);
    assert!(api.history(&session).await.iter().any(|e| e.kind == EntryType::AgentMessage));
}

/// A history whose last line is cut short while the session runs (a write cut short, another
/// writer's crash): the next entry starts on a line of its own, so the next prompt's
/// `user_message` and the reply are kept.
#[tokio::test]
async fn a_torn_history_tail_is_not_glued_to_the_next_entry() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("torn")).await;
    assert!(api.ask(&session, "before the tear").await.contains("you said: before the tear"));
    let path = daemon.session_dir(&session).join("history.jsonl");
    {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"{\"seq\":99,\"at\":1,\"type\":\"agent_mes").unwrap();
    }
    assert!(api.ask(&session, "after the tear").await.contains("you said: after the tear"));
    let history = api.history(&session).await;
    let users: Vec<&str> = history
        .iter()
        .filter(|entry| entry.kind == EntryType::UserMessage)
        .map(|entry| entry.content.as_str())
        .collect();
    assert_eq!(users, ["before the tear", "after the tear"], "{history:?}");
    let last = history.last().expect("entries");
    assert!(
        last.kind == EntryType::AgentMessage && last.content.contains("you said: after the tear"),
        "{last:?}"
    );
}

/// Where a session's last event is, once its turn ended.
async fn last_event(api: &Api, session: &str) -> u64 {
    api.status(session).await.last_event_seq
}

/// A prompt's turn followed on `events` to its end: its events.
async fn turn_of(
    api: &Api,
    session: &str,
    events: &mut jsonrpsee::core::client::Subscription<SessionEvent>,
    prompt: &str,
) -> Vec<SessionEvent> {
    api.prompt(session, prompt).await.unwrap();
    within("the turn", async {
        until(events, |e| {
            matches!(&e.kind, EventKind::State { state: SessionState::WaitingForInput, .. })
        })
        .await
    })
    .await
}

/// Asserts `events` are numbered one after another from `first`.
fn numbered_from(events: &[SessionEvent], first: u64) {
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let wanted: Vec<u64> = (first..first + seqs.len() as u64).collect();
    assert_eq!(seqs, wanted, "one after another");
}

/// An event log cut short while the daemon runs (in the middle of a line): the next turn is
/// recorded and streamed, to a subscriber that was there and to a new one, numbered on
/// after the highest seq issued; a client behind the cut is told which seqs are gone.
#[tokio::test]
async fn an_event_log_cut_short_while_running_records_and_streams_the_next_turn() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let (session, _) = streamed_turn(&api, &daemon, 20).await;
    let before = last_event(&api, &session).await;
    let mut live = api.subscribe(&session, before).await;
    let active = event_log_segments(&daemon, &session).pop().unwrap();
    let text = std::fs::read(&active).unwrap();
    let cut_seq = before - 4;
    let start = text
        .windows(format!("\n{{\"seq\":{cut_seq},").len())
        .position(|w| w == format!("\n{{\"seq\":{cut_seq},").as_bytes())
        .expect("the line")
        + 1;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&active)
        .unwrap()
        .set_len(start as u64 + 9)
        .unwrap();

    let turn = turn_of(&api, &session, &mut live, "/stream 20\nafter the cut").await;
    numbered_from(&turn, before + 1);
    assert_eq!(chunks(&turn).len(), 20, "the live subscriber gets the next turn");
    // Up to the turn's last event (a snapshot's event may follow it any time).
    let last = turn.last().unwrap().seq;
    let mut fresh = api.subscribe(&session, before).await;
    let again = until(&mut fresh, |e| e.seq == last).await;
    let seqs = |events: &[SessionEvent]| events.iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(seqs(&again), seqs(&turn), "so does a new subscriber");
    let behind = follow_by_the_gap_rule(&api, &session, cut_seq - 2, last, 3).await;
    numbered_from(&behind, cut_seq - 1);
    let gone = &behind[1..=(before - cut_seq + 1) as usize];
    assert!(
        gone.iter().all(
            |e| matches!(&e.kind, EventKind::Notice { message } if message.contains("unreadable"))
        ),
        "the seqs cut away are said: {gone:?}"
    );
}

/// An event log deleted while the daemon runs is made again: the next turn is recorded
/// and streamed, numbered on after the highest seq issued.
#[tokio::test]
async fn an_event_log_deleted_while_running_is_made_again_and_numbering_goes_on() {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let (session, _) = streamed_turn(&api, &daemon, 20).await;
    let before = last_event(&api, &session).await;
    let mut live = api.subscribe(&session, before).await;
    std::fs::remove_dir_all(daemon.session_dir(&session).join("events")).unwrap();

    let turn = turn_of(&api, &session, &mut live, "/stream 20\nafter the deletion").await;
    numbered_from(&turn, before + 1);
    assert_eq!(chunks(&turn).len(), 20, "the live subscriber gets the next turn");
    // Up to the turn's last event (a snapshot's event may follow it any time).
    let last = turn.last().unwrap().seq;
    let mut fresh = api.subscribe(&session, before).await;
    let again = until(&mut fresh, |e| e.seq == last).await;
    let seqs = |events: &[SessionEvent]| events.iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(seqs(&again), seqs(&turn), "so does a new subscriber");
    assert!(api.ask(&session, "and on").await.contains("you said: and on"));
}

/// A session's agentctl spool: its segments, oldest first.
pub(crate) fn spool_segments(daemon: &Daemon, session: &str) -> Vec<std::path::PathBuf> {
    let dir = daemon.session_dir(session).join("agentctl/spool");
    let mut segments: Vec<_> = std::fs::read_dir(&dir)
        .expect("the spool is there")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "jsonl"))
        .collect();
    segments.sort();
    segments
}

/// The whole lines of a segment: (seq, where the line starts, its length without newline).
fn lines_of(path: &std::path::Path) -> Vec<(u64, usize, usize)> {
    let text = std::fs::read(path).unwrap();
    let whole = text.iter().rposition(|&b| b == b'\n').map_or(0, |at| at + 1);
    let mut lines = Vec::new();
    let mut start = 0;
    for line in text[..whole].split(|&b| b == b'\n') {
        if let Ok(event) = serde_json::from_slice::<serde_json::Value>(line) {
            lines.push((event["seq"].as_u64().unwrap(), start, line.len()));
        }
        start += line.len() + 1;
    }
    lines
}

/// A line of a live agentctl's spool is cut (mid-line, the lines after it gone) while the
/// supervisor is down and the agent runs on: at the restart the cut events are said (a
/// notice naming their range), the agent is not fenced for it, and the turn goes on.
#[tokio::test]
async fn a_spool_cut_while_the_supervisor_is_down_is_said_and_the_agent_goes_on() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("cut")).await;
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, "/tool\n/sleep 4000\n/stream 30\nafter the cut").await.unwrap();
    let seen = until(&mut events, |e| matches!(e.kind, EventKind::ToolCallUpdate { .. })).await;
    let sidecar = daemon.agentctl_pid(&session);
    drop(events);
    drop(api);
    daemon.kill().await;
    // The agent sleeps: agentctl writes nothing now. Cut its last two lines, mid-line.
    let active = spool_segments(&daemon, &session).pop().unwrap();
    let lines = lines_of(&active);
    let [.., (first, start, len), (last, _, _)] = lines[..] else { panic!("{lines:?}") };
    std::fs::OpenOptions::new()
        .write(true)
        .open(&active)
        .unwrap()
        .set_len((start + len / 2) as u64)
        .unwrap();
    daemon.restart().await;
    let api = daemon.api().await;
    let mut events = api.subscribe(&session, seen.last().unwrap().seq).await;
    let rest = until(&mut events, tether_tests::daemon::turn_ended).await;
    assert!(
        matches!(
            rest.last().unwrap().kind,
            EventKind::TurnEnded { state: protocol::api::TurnState::Completed, .. }
        ),
        "{:?}",
        rest.last()
    );
    assert_eq!(chunks(&rest).len(), 30, "every chunk after the cut");
    let range = format!("{first}–{last}");
    let said = notices(&rest);
    assert!(said.iter().any(|n| n.contains(&range) && n.contains("unreadable")), "{said:?}");
    assert_eq!(daemon.agentctl_pid(&session), sidecar, "the agent was not fenced");
    assert!(api.ask(&session, "still there?").await.contains("you said: still there?"));
}

/// Overwrites the bytes of a line (`start`, `len`; with its newline when `newline`) in
/// place, with `fill`: what a bad disk or a stray writer leaves.
fn overwrite(path: &std::path::Path, start: usize, len: usize, fill: u8) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(&vec![fill; len], start as u64).unwrap();
}

/// The messages among `events` that say where a damaged line was (`at`: `FILE:LINE`).
fn located(events: &[SessionEvent], at: &str) -> usize {
    notices(events).iter().filter(|notice| notice.contains(at)).count()
}

/// A line overwritten in a live sidecar's spool while the supervisor is down is said once
/// after the restart, not again and again while the session runs on.
#[tokio::test]
async fn a_damaged_spool_line_is_said_once() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("once")).await;
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, "/tool\n/sleep 3000\n/stream 30\nafter the damage").await.unwrap();
    let seen = until(&mut events, |e| matches!(e.kind, EventKind::ToolCallUpdate { .. })).await;
    drop(events);
    drop(api);
    daemon.kill().await;
    let active = spool_segments(&daemon, &session).pop().unwrap();
    let lines = lines_of(&active);
    let [.., (_, start, len), _] = lines[..] else { panic!("{lines:?}") };
    overwrite(&active, start, len, b'#');
    let number = std::fs::read(&active).unwrap()[..start].iter().filter(|&&b| b == b'\n').count();
    let at = format!("{}:{}", active.display(), number + 1);
    daemon.restart().await;
    let api = daemon.api().await;
    let mut events = api.subscribe(&session, seen.last().unwrap().seq).await;
    let mut rest = until(&mut events, tether_tests::daemon::turn_ended).await;
    assert_eq!(chunks(&rest).len(), 30, "every chunk after the damage");
    assert!(api.ask(&session, "and on").await.contains("you said: and on"));
    // Said again within a few seconds, it would be said again and again.
    let again = tokio::time::timeout(std::time::Duration::from_secs(3), async {
        until(&mut events, |e| located(std::slice::from_ref(e), &at) > 0).await
    })
    .await;
    if let Ok(more) = again {
        rest.extend(more);
    }
    assert_eq!(located(&rest, &at), 1, "said once: {:?}", notices(&rest));
}

/// The text of the agent message chunk a spool line holds, if it is one.
fn chunk_of(line: &[u8]) -> Option<String> {
    let event = serde_json::from_slice::<serde_json::Value>(line).ok()?;
    let update = &event["message"]["params"]["update"];
    (event["kind"] == "acp" && update["sessionUpdate"] == "agent_message_chunk")
        .then(|| update["content"]["text"].as_str().unwrap_or_default().to_owned())
}

/// Where a spool line was damaged (`FILE:LINE`) and the chunks it (and the next line,
/// when its newline went too) held.
struct Damaged {
    at: String,
    lost: Vec<String>,
}

/// The `acked_seq` stored for a session's running execution (the daemon is down).
fn acked_seq(daemon: &Daemon, session: &str) -> u64 {
    let db = rusqlite::Connection::open(daemon.data_dir().join("state.db")).unwrap();
    db.query_row(
        "SELECT acked_seq FROM executors_running WHERE session_id = ?1",
        [session],
        |row| row.get(0),
    )
    .unwrap()
}

/// Overwrites a line of the oldest segment of a session's spool past what was
/// acknowledged with `fill` (its newline too when `newline`), the daemon being down.
fn damage_past_the_ack(daemon: &Daemon, session: &str, fill: u8, newline: bool) -> Damaged {
    let acked = acked_seq(daemon, session);
    let segments = spool_segments(daemon, session);
    let oldest = &segments[0];
    let lines = lines_of(oldest);
    // Not the last line when its newline goes too: the next one goes with it.
    let &(_, start, len) = if segments.len() > 1 {
        &lines[lines.len() - 2]
    } else {
        lines.iter().find(|(seq, ..)| *seq > acked + 1).expect("a line past the ack")
    };
    let text = std::fs::read(oldest).unwrap();
    let damaged_lines = if newline {
        let next_end =
            start + len + 1 + text[start + len + 1..].iter().position(|&b| b == b'\n').unwrap();
        vec![&text[start..start + len], &text[start + len + 1..next_end]]
    } else {
        vec![&text[start..start + len]]
    };
    let lost: Vec<String> = damaged_lines.into_iter().filter_map(chunk_of).collect();
    overwrite(oldest, start, len + usize::from(newline), fill);
    let number = text[..start].iter().filter(|&&b| b == b'\n').count();
    Damaged { at: format!("{}:{}", oldest.display(), number + 1), lost }
}

/// The agent text chunks a session's event log holds (read while the daemon is down).
fn streamed_before(daemon: &Daemon, session: &str) -> Vec<String> {
    event_log_segments(daemon, session)
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path).unwrap();
            text.lines()
                .filter_map(|line| serde_json::from_str::<SessionEvent>(line).ok())
                .collect::<Vec<_>>()
        })
        .filter_map(|event| match event.kind {
            EventKind::AgentMessageChunk { text, .. } => Some(text),
            _ => None,
        })
        .collect()
}

/// A session streaming `/stream COUNT`, read until `chunks` of them were seen; the daemon
/// is killed then. Returns the session and what was seen.
async fn killed_while_streaming(
    daemon: &mut Daemon,
    count: usize,
    chunks_seen: usize,
    sidecar_too: bool,
) -> (String, Vec<SessionEvent>) {
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("damaged")).await;
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, &format!("/stream {count}\nlong")).await.unwrap();
    let mut seen = Vec::new();
    while chunks(&seen).len() < chunks_seen {
        seen.push(tether_tests::daemon::next(&mut events).await);
    }
    let sidecar = daemon.agentctl_pid(&session);
    drop(events);
    drop(api);
    daemon.kill().await;
    if sidecar_too {
        tether_tests::daemon::sigkill(sidecar).await;
    }
    (session, seen)
}

/// What must be seen after a restart that meets a damaged spool line: the stream's chunks
/// and the history's text (each without what the damage took and had not reached it before
/// the kill), and where the damage is (`FILE:LINE`).
struct Wanted {
    stream: Vec<String>,
    history: String,
    at: String,
}

/// Damages a spool line past the ack (see [`damage_past_the_ack`]) and says what of `all`
/// (every chunk the agent gave) must still reach the stream and the history.
fn damage_and_expect(
    daemon: &Daemon,
    session: &str,
    all: &[String],
    fill: u8,
    newline: bool,
) -> Wanted {
    let Damaged { at, lost } = damage_past_the_ack(daemon, session, fill, newline);
    let streamed = streamed_before(daemon, session);
    let history_before =
        std::fs::read_to_string(daemon.session_dir(session).join("history.jsonl")).unwrap();
    let stream = all
        .iter()
        .filter(|text| !lost.contains(text) || streamed.contains(text))
        .cloned()
        .collect();
    let history = all
        .iter()
        .filter(|text| !lost.contains(text) || history_before.contains(text.as_str()))
        .map(String::as_str)
        .collect();
    Wanted { stream, history, at }
}

/// Restarts the daemon and follows the session to its turn's end: the stream and the
/// history are as wanted, the damage is said once where it is, and the session answers.
/// Returns how the turn ended.
async fn restart_and_check(
    daemon: &mut Daemon,
    session: &str,
    mut seen: Vec<SessionEvent>,
    wanted: Wanted,
) -> EventKind {
    daemon.restart().await;
    let api = daemon.api().await;
    let mut events = api.subscribe(session, seen.last().unwrap().seq).await;
    seen.extend(until(&mut events, tether_tests::daemon::turn_ended).await);
    let got = chunks(&seen);
    let parted = got.iter().zip(&wanted.stream).position(|(a, b)| a != b);
    assert!(
        got.len() == wanted.stream.len() && parted.is_none(),
        "the stream has {} chunks, {} wanted; first difference at {parted:?}",
        got.len(),
        wanted.stream.len()
    );
    let recorded: String = api
        .history(session)
        .await
        .iter()
        .filter(|entry| entry.kind == EntryType::AgentMessage)
        .map(|entry| tether_tests::without_cut_off_notes(&entry.content))
        .collect();
    let parted = recorded.bytes().zip(wanted.history.bytes()).position(|(a, b)| a != b);
    assert!(
        recorded == wanted.history,
        "the history has every chunk once: {} bytes, {} wanted, first difference at {parted:?}",
        recorded.len(),
        wanted.history.len(),
    );
    assert_eq!(located(&seen, &wanted.at), 1, "said once, where: {:?}", notices(&seen));
    // The session answers. A dead agent comes back by a load whose replay need not match
    // the history (the damaged chunk is not in it): then the prompt goes with the history's
    // end before it, and the mock echoes both.
    let reply = api.ask(session, "and now?").await;
    assert!(reply.starts_with("mock-agent: ") && reply.contains("and now?"), "{reply}");
    seen.last().unwrap().kind.clone()
}

/// The supervisor is killed in a long stream; a line of the oldest segment of the live
/// sidecar's spool past what was acknowledged is overwritten (`fill`, its newline too when
/// `newline`); the supervisor comes back. The line is skipped and said once (file and line),
/// every other chunk reaches the stream and the history once, and the turn ends.
async fn a_damaged_line_met_at_a_restart_loses_only_itself(fill: u8, newline: bool) {
    let mut daemon = Daemon::start(&[]).await;
    let (session, seen) = killed_while_streaming(&mut daemon, 60_000, 2000, false).await;
    let all: Vec<String> = std::iter::once(chunks(&seen)[0].clone())
        .chain((2..=60_000).map(|n| format!(" [{n}/60000]")))
        .collect();
    let wanted = damage_and_expect(&daemon, &session, &all, fill, newline);
    let ended = restart_and_check(&mut daemon, &session, seen, wanted).await;
    assert!(
        matches!(ended, EventKind::TurnEnded { state: protocol::api::TurnState::Completed, .. }),
        "{ended:?}"
    );
}

#[tokio::test]
async fn a_garbled_spool_line_met_at_a_restart_loses_only_itself() {
    a_damaged_line_met_at_a_restart_loses_only_itself(b'#', false).await;
}

#[tokio::test]
async fn a_zeroed_spool_line_met_at_a_restart_loses_only_itself() {
    a_damaged_line_met_at_a_restart_loses_only_itself(0, true).await;
}

/// Every agent text chunk a session's spool holds, in order (damaged lines skipped).
fn spooled(daemon: &Daemon, session: &str) -> Vec<String> {
    spool_segments(daemon, session)
        .iter()
        .flat_map(|path| {
            let text = std::fs::read(path).unwrap();
            text.split(|&b| b == b'\n').filter_map(chunk_of).collect::<Vec<_>>()
        })
        .collect()
}

/// Item 23: the supervisor and the session's sidecar are SIGKILLed together in a long
/// stream, and a line of the dead sidecar's spool past the ack is damaged (`fill`, its
/// newline too when `newline`). At the restart the spool is recorded without that line:
/// every other chunk it held is in the history and the stream once — none twice — the
/// damage is said once, where it is, and the session goes on.
async fn a_damaged_line_in_a_dead_sidecars_spool_loses_only_itself(fill: u8, newline: bool) {
    let mut daemon = Daemon::start(&[]).await;
    let (session, seen) = killed_while_streaming(&mut daemon, 20_000, 300, true).await;
    let all = spooled(&daemon, &session);
    let wanted = damage_and_expect(&daemon, &session, &all, fill, newline);
    restart_and_check(&mut daemon, &session, seen, wanted).await;
}

#[tokio::test]
async fn a_garbled_line_in_a_dead_sidecars_spool_loses_only_itself() {
    a_damaged_line_in_a_dead_sidecars_spool_loses_only_itself(b'#', false).await;
}

#[tokio::test]
async fn a_zeroed_line_in_a_dead_sidecars_spool_loses_only_itself() {
    a_damaged_line_in_a_dead_sidecars_spool_loses_only_itself(0, true).await;
}
