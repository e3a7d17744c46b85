//! The page section: the web page opening a session of 220,000 events in a real
//! browser (headless chromium through chromedriver) — how long until its newest events are
//! shown, the page's first paint, and the tab's JavaScript heap — beside reading the same
//! events over the API from the start (what a page that replays everything must read
//! before it shows anything), measured in the same run. The review section: the Changes
//! tab of a session that changed 200 files, beside the API call it makes.

use super::{Daemon, Instant, RUNS, Row, json, min_median, ms};
use protocol::api::ApiClient;
use tether_tests::browser;

/// 11 turns of 20,000 chunks: 220,000 chunk events, and each turn's own few.
const TURNS: u32 = 11;
const CHUNKS: u32 = 20_000;

pub(super) async fn page(rows: &mut Vec<Row>) {
    if !browser::available() {
        eprintln!("bench: the page section needs chromium and chromedriver (scripts/setup.sh)");
        return;
    }
    Box::pin(long_session(rows)).await;
}

/// The review section: the Changes tab (also `page`'s browser, but a section of its own).
pub(super) async fn review(rows: &mut Vec<Row>) {
    if !browser::available() {
        eprintln!("bench: the review section needs chromium and chromedriver (scripts/setup.sh)");
        return;
    }
    Box::pin(changes(rows)).await;
}

/// Files the Changes benchmark's session changed, and the lines of each.
const CHANGED_FILES: usize = 200;
const FILE_LINES: usize = 40;

/// The Changes tab of a session whose workspace changed 200 files (a few lines of each):
/// from the tab's click to every file's diff drawn, beside `task.session.changes` alone.
async fn changes(rows: &mut Vec<Row>) {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let repo = daemon.workspace("changes");
    tether_tests::git_repository(&repo).await;
    let line = |file: usize, at: usize, word: &str| format!("fn f{file}_{at}() {{ {word}(); }}\n");
    let text = |file: usize, word: &str| {
        (0..FILE_LINES).map(|at| line(file, at, word)).collect::<String>()
    };
    for file in 0..CHANGED_FILES {
        std::fs::write(repo.join(format!("m{file:03}.rs")), text(file, "old")).unwrap();
    }
    tether_tests::git(&repo, &["add", "."]).await;
    tether_tests::git(&repo, &["commit", "-q", "-m", "files"]).await;
    let session = api.ready_session("mock", &repo).await;
    for file in 0..CHANGED_FILES {
        let edited = text(file, "old").replacen("old", "new", 3);
        std::fs::write(repo.join(format!("m{file:03}.rs")), edited).unwrap();
    }
    let browser = browser::start("bench-changes").await.expect("chromium");
    let url = format!("{}/#/session/{session}", daemon.url.replace("ws://", "http://"));
    let (mut view, mut call) = (vec![], vec![]);
    for _ in 0..RUNS {
        browser.open("about:blank").await;
        browser.open(&url).await;
        browser.wait_text("#connection", "connected").await;
        browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
        browser.click("[data-tab=changes]").await;
        browser.wait_text("#changes-summary", "200 files changed").await;
        // From nothing: the review read again and every file drawn, then a frame painted.
        let script = "const [files, done] = arguments; const started = performance.now(); \
            const check = () => document.querySelectorAll('#changes-files .change table').length === files; \
            const finish = () => requestAnimationFrame(() => done(performance.now() - started)); \
            const observer = new MutationObserver(() => { if (check()) { observer.disconnect(); finish(); } }); \
            observer.observe(document.body, {subtree: true, childList: true}); \
            tether.changes.reset(tether.state.open);";
        view.push(
            browser.run_async(script, json!([CHANGED_FILES])).await.as_f64().unwrap_or(f64::NAN),
        );
        let started = Instant::now();
        let seen = api.typed().session_changes(session.clone()).await.expect("changes");
        call.push(ms(started.elapsed()));
        assert_eq!(seen.files.len(), CHANGED_FILES);
    }
    let (view_min, view_med) = min_median(&mut view);
    let (call_min, call_med) = min_median(&mut call);
    rows.push(Row {
        measure: "the Changes tab of a session that changed 200 files: read and every diff drawn (min / median)",
        target: "≤ 300 ms",
        result: format!(
            "{view_min:.0} / {view_med:.0} ms (task.session.changes alone: {call_min:.0} / {call_med:.0} ms)"
        ),
        value: json!({"files": CHANGED_FILES, "view_ms": [view_min, view_med], "call_ms": [call_min, call_med]}),
    });
}

/// The page opening a long session at its end.
async fn long_session(rows: &mut Vec<Row>) {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("long")).await;
    for turn in 1..=TURNS {
        eprintln!("bench: page: writing turn {turn} of {TURNS} ({CHUNKS} chunks)");
        api.ask(&session, &format!("/stream {CHUNKS}\nturn {turn}")).await;
    }
    let events = api.status(&session).await.last_event_seq;
    let browser = browser::start("bench-page").await.expect("chromium");
    let url = format!("{}/#/session/{session}", daemon.url.replace("ws://", "http://"));
    let last_chunk = format!("[{CHUNKS}/{CHUNKS}]");
    let newest_prompt = format!("turn {TURNS}");
    let (mut open, mut paint, mut heap, mut replay) = (vec![], vec![], vec![], vec![]);
    for _ in 0..RUNS {
        browser.open("about:blank").await;
        let started = Instant::now();
        browser.open(&url).await;
        browser.wait_text("#transcript .agent", &last_chunk).await;
        browser.wait_text("#transcript .turn-end", "turn completed").await;
        browser.wait_text("#transcript > .current", &newest_prompt).await;
        open.push(ms(started.elapsed()));
        let in_view = "const box = document.querySelector('#transcript').getBoundingClientRect(); \
            const r = document.querySelector('#transcript > .current').getBoundingClientRect(); \
            return r.top >= box.top - 12 && r.bottom <= box.bottom + 1;";
        assert_eq!(browser.run(in_view, json!([])).await, json!(true), "the newest prompt in view");
        let figures = browser
            .run(
                "return [performance.getEntriesByName('first-contentful-paint')[0].startTime, \
                 performance.memory.usedJSHeapSize / 1048576];",
                json!([]),
            )
            .await;
        paint.push(figures[0].as_f64().unwrap_or(f64::NAN));
        heap.push(figures[1].as_f64().unwrap_or(f64::NAN));
        // The baseline: every event read from the start over the API, batched.
        let started = Instant::now();
        let mut stream = api.subscribe_batches(&session, 0).await;
        let mut seen = 0;
        while seen < events {
            let batch = tether_tests::within("a batch", stream.next()).await.unwrap().unwrap().0;
            seen = batch.last().map_or(seen, |event| event.seq);
        }
        replay.push(ms(started.elapsed()));
    }
    let (open_min, open_med) = min_median(&mut open);
    let (replay_min, replay_med) = min_median(&mut replay);
    rows.push(Row {
        measure: "the page opens a session of 220,000 events: navigation to its newest events and its newest prompt shown, in view (min / median)",
        target: "≤ 1 s",
        result: format!(
            "{open_min:.0} / {open_med:.0} ms for {events} events (reading them all over the API from the start: {replay_min:.0} / {replay_med:.0} ms, ×{:.0})",
            replay_med / open_med
        ),
        value: json!({"events": events, "open_ms": [open_min, open_med], "full_read_ms": [replay_min, replay_med]}),
    });
    let (heap_min, heap_med) = min_median(&mut heap);
    rows.push(Row {
        measure: "the page's JavaScript heap with that session open (min / median)",
        target: "< 150 MB",
        result: format!("{heap_min:.1} / {heap_med:.1} MB"),
        value: json!({"heap_mb": [heap_min, heap_med]}),
    });
    let (paint_min, paint_med) = min_median(&mut paint);
    rows.push(Row {
        measure: "the page's first contentful paint on loopback (min / median)",
        target: "≤ 300 ms",
        result: format!("{paint_min:.0} / {paint_med:.0} ms"),
        value: json!({"first_paint_ms": [paint_min, paint_med]}),
    });
}
