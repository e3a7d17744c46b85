//! The page section: the web page opening a session of 220,000 events in a real
//! browser (headless chromium through chromedriver) — how long until its newest events are
//! shown, the page's first paint, and the tab's JavaScript heap — beside reading the same
//! events over the API from the start (what a page that replays everything must read
//! before it shows anything), measured in the same run. The review section: the Changes
//! tab of a session that changed 200 files, beside the API call it makes. The lists
//! section: the list of 1,000 sessions updated while the open session streams.

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

/// The lists section: the page's list of 1,000 sessions updated while one streams.
pub(super) async fn lists(rows: &mut Vec<Row>) {
    if !browser::available() {
        eprintln!("bench: the lists section needs chromium and chromedriver (scripts/setup.sh)");
        return;
    }
    Box::pin(list_updates(rows)).await;
}

/// Sessions in the list before the list-updates benchmark's runs, and the ones each run
/// adds while a session streams (each a list update), and that stream's chunks.
const LISTED: usize = 1000;
const ADDED_PER_RUN: usize = 60;
const STREAMED: u32 = 4000;

/// The page with a session open that streams 4,000 chunks while 60 sessions join a list of
/// 1,000 (each a `changed` event: the list reduced and its page of rows reconciled): the
/// longest stretch the page's main thread was busy, as the longest gap between two
/// animation frames and the longest task Chrome reports (its Long Tasks API: 50 ms and
/// over).
async fn list_updates(rows: &mut Vec<Row>) {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let typed = api.typed();
    let streaming = api.ready_session("mock", &daemon.workspace("streams")).await;
    let source = api.ready_session("mock", &daemon.workspace("forked")).await;
    api.ask(&source, "a turn to fork from").await;
    eprintln!("bench: lists: forking {LISTED} sessions at rest");
    for _ in 2..LISTED {
        typed.session_fork(source.clone(), None).await.expect("fork");
    }
    let browser = browser::start("bench-lists").await.expect("chromium");
    let url = format!("{}/#/session/{streaming}", daemon.url.replace("ws://", "http://"));
    browser.open(&url).await;
    browser.wait_text("#list-count", &format!("{LISTED} sessions")).await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    let (mut gaps, mut tasks, mut idle) = (vec![], vec![], vec![]);
    for run in 0..RUNS {
        // The baseline, in the same run: the same page at rest for a second.
        let rest = "const done = arguments[0]; let gap = 0; let last = performance.now(); \
            const started = last; const frame = (now) => { gap = Math.max(gap, now - last); last = now; \
              if (now - started < 1000) requestAnimationFrame(frame); else done(gap); }; \
            requestAnimationFrame(frame);";
        idle.push(browser.run_async(rest, json!([])).await.as_f64().unwrap_or(f64::NAN));
        let watch = "window.__busy = { gap: 0, task: 0 }; let last = performance.now(); \
            const frame = (now) => { window.__busy.gap = Math.max(window.__busy.gap, now - last); \
              last = now; window.__busyFrame = requestAnimationFrame(frame); }; \
            window.__busyFrame = requestAnimationFrame(frame); \
            window.__busyTasks = new PerformanceObserver((list) => { for (const entry of list.getEntries()) \
              window.__busy.task = Math.max(window.__busy.task, entry.duration); }); \
            window.__busyTasks.observe({ type: 'longtask' }); return true;";
        browser.run(watch, json!([])).await;
        let prompt = format!("/stream {STREAMED}\nrun {run}");
        let stream = api.ask(&streaming, &prompt);
        let forks = async {
            for _ in 0..ADDED_PER_RUN {
                typed.session_fork(source.clone(), None).await.expect("fork");
            }
        };
        let ((), ()) = tokio::join!(
            async {
                stream.await;
            },
            forks
        );
        let listed = LISTED + ADDED_PER_RUN * (run + 1);
        browser.wait_text("#list-count", &format!("{listed} sessions")).await;
        browser.wait_text("#transcript .agent", &format!("[{STREAMED}/{STREAMED}]")).await;
        let busy = "const done = arguments[0]; requestAnimationFrame(() => { \
            cancelAnimationFrame(window.__busyFrame); window.__busyTasks.disconnect(); \
            done([window.__busy.gap, window.__busy.task]); });";
        let busy = browser.run_async(busy, json!([])).await;
        gaps.push(busy[0].as_f64().unwrap_or(f64::NAN));
        tasks.push(busy[1].as_f64().unwrap_or(f64::NAN));
    }
    // One list update's own cost: a session of the 1,000 changed, the list drawn again
    // (reduced, sorted, its page of rows reconciled), 30 times; the longest and the median.
    let update = "const sessions = tether.state.sessions; const took = []; \
        for (let i = 0; i < 30; i++) { const s = sessions[i % sessions.length]; \
          s.state = s.state === 'PAUSED' ? 'WAITING_FOR_INPUT' : 'PAUSED'; \
          const t = performance.now(); tether.renderLists(); took.push(performance.now() - t); } \
        took.sort((a, b) => a - b); return [took[15], took[29]];";
    let update = browser.run(update, json!([])).await;
    let (update_med, update_max) =
        (update[0].as_f64().unwrap_or(f64::NAN), update[1].as_f64().unwrap_or(f64::NAN));
    let (gap_min, gap_med) = min_median(&mut gaps);
    let (task_min, task_med) = min_median(&mut tasks);
    let (idle_min, idle_med) = min_median(&mut idle);
    rows.push(Row {
        measure: "the list of 1,000 sessions updated (60 joining) while the open session streams 4,000 chunks: the page's longest main-thread block (min / median)",
        target: "≤ 50 ms",
        result: format!(
            "longest task (Long Tasks API, ≥ 50 ms; 0: none) {task_min:.0} / {task_med:.0} ms; one list update {update_med:.1} ms (median of 30; longest {update_max:.1} ms); longest gap between frames {gap_min:.0} / {gap_med:.0} ms (the page at rest: {idle_min:.0} / {idle_med:.0} ms)"
        ),
        value: json!({"sessions": LISTED, "long_task_ms": [task_min, task_med], "list_update_ms": {"median": update_med, "max": update_max}, "frame_gap_ms": [gap_min, gap_med], "idle_frame_gap_ms": [idle_min, idle_med]}),
    });
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
