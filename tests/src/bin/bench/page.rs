//! The page section: the web page opening a session of 220,000 events in a real
//! browser (headless chromium through chromedriver) — how long until its newest events are
//! shown, the page's first paint, and the tab's JavaScript heap — beside reading the same
//! events over the API from the start (what a page that replays everything must read
//! before it shows anything), measured in the same run.

use super::{Daemon, Instant, RUNS, Row, json, min_median, ms};
use tether_tests::browser;

/// 11 turns of 20,000 chunks: 220,000 chunk events, and each turn's own few.
const TURNS: u32 = 11;
const CHUNKS: u32 = 20_000;

pub(super) async fn page(rows: &mut Vec<Row>) {
    if !browser::available() {
        eprintln!("bench: the page section needs chromium and chromedriver (scripts/setup.sh)");
        return;
    }
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
    let (mut open, mut paint, mut heap, mut replay) = (vec![], vec![], vec![], vec![]);
    for _ in 0..RUNS {
        browser.open("about:blank").await;
        let started = Instant::now();
        browser.open(&url).await;
        browser.wait_text("#transcript .agent", &last_chunk).await;
        browser.wait_text("#transcript .turn-end", "turn completed").await;
        open.push(ms(started.elapsed()));
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
        measure: "the page opens a session of 220,000 events: navigation to its newest events shown (min / median)",
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
