//! A long session in the page, by turn: it opens with the newest prompt
//! in view, earlier content loads a turn at a time under a button that names the turn,
//! a navigator goes to any turn, and a search finds words anywhere in the conversation.

use serde_json::json;
use tether_tests::browser::{self, Browser};
use tether_tests::daemon::Daemon;

fn page(daemon: &Daemon) -> String {
    daemon.url.replace("ws://", "http://") + "/"
}

/// Whether the first element matching `css` is inside the transcript's visible box.
async fn in_view(browser: &Browser, css: &str) -> bool {
    let script = "const box = document.querySelector('#transcript').getBoundingClientRect(); \
        const node = document.querySelector(arguments[0]); if (!node) return false; \
        const r = node.getBoundingClientRect(); \
        return r.top >= box.top - 12 && r.bottom <= box.bottom + 1 && r.height > 0;";
    browser.run(script, json!([css])).await == json!(true)
}

async fn count(browser: &Browser, css: &str) -> usize {
    browser.texts(css).await.len()
}

/// A session of three turns, the last one longer than the page's window, opened in a
/// page whose window is 10 events.
async fn three_turns_in_a_small_window(browser: &Browser) -> (Daemon, String) {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("long")).await;
    api.ask(&session, "/stream 5\nfirst: alpha").await;
    api.ask(&session, "/stream 5\nsecond: the zebra line").await;
    api.ask(&session, "/plan read; write\n/rounds 8\n/stream 6\nthird: the long one").await;
    browser.open(&page(&daemon)).await;
    browser.wait_text("#connection", "connected").await;
    browser.run("sessionStorage.setItem('tether-window', '10'); return true;", json!([])).await;
    browser.open("about:blank").await; // a new load, so the page reads the setting
    browser.open(&format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#connection", "connected").await;
    (daemon, session)
}

/// A session whose newest turn is longer than the window opens with that turn's prompt
/// pinned in view over its output; "Show earlier" loads the rest of the turn (named), then
/// the turn before; the navigator goes back to turn 1, each prompt shown once; the
/// search finds a word of turn 2 and goes to it; a turn started live joins the navigator
/// and becomes the prompt kept in view.
#[tokio::test]
async fn a_long_session_opens_at_its_newest_prompt_and_loads_by_turn() {
    Box::pin(long_session_by_turn()).await;
}

async fn long_session_by_turn() {
    let Some(browser) = browser::start("turns").await else { return };
    let (_daemon, _session) = Box::pin(three_turns_in_a_small_window(&browser)).await;
    Box::pin(opened_at_the_newest_prompt(&browser)).await;
    Box::pin(back_by_turn(&browser)).await;
    Box::pin(search_and_go(&browser)).await;
}

/// Opened: turn 3's prompt pinned and in view, the button naming the rest of turn 3, the
/// navigator listing the three turns.
async fn opened_at_the_newest_prompt(browser: &Browser) {
    browser.wait_text("#transcript > .pinned .user", "third: the long one").await;
    browser.wait_text("#transcript .agent", "you said").await;
    assert!(in_view(browser, "#transcript > .current").await, "the newest prompt is in view");
    let button = browser.wait_text("#transcript button.earlier", "the rest of turn 3").await;
    assert!(button.contains("10 at a time"), "{button}");
    let options = browser.texts("#turn-nav option").await;
    assert_eq!(options.len(), 4, "a placeholder and three turns: {options:?}");
    assert!(options[1].starts_with("1 · ") && options[1].contains("first: alpha"), "{options:?}");
    browser.screenshot("opened").await;
}

/// The navigator's turn 1: loaded back to it, marked, in view; the pin gone, each prompt
/// once.
async fn back_by_turn(browser: &Browser) {
    let first = browser
        .run("return document.querySelector('#turn-nav').options[1].value;", json!([]))
        .await;
    browser.set_value("#turn-nav", first.as_str().unwrap()).await;
    browser.wait_text("#transcript .user.hit", "first: alpha").await;
    assert!(in_view(browser, ".user.hit").await, "turn 1's prompt is brought into view");
    assert_eq!(
        count(browser, "#transcript > .pinned").await,
        0,
        "the pin went with the turn's rest"
    );
    let users = browser.texts("#transcript .user").await;
    assert_eq!(users.len(), 3, "{users:?}");
    for prompt in ["first: alpha", "second: the zebra line", "third: the long one"] {
        assert_eq!(users.iter().filter(|u| u.contains(prompt)).count(), 1, "{prompt}: {users:?}");
    }
    assert_eq!(count(browser, "#transcript .plan").await, 1, "turn 3's plan once");
}

/// Search: each match by turn; choosing one marks its part and brings it into view. Then
/// a turn started in the page joins the navigator and is the prompt kept in view.
async fn search_and_go(browser: &Browser) {
    browser.set_value("#search-text", "ZEBRA").await;
    browser.click("#search-form button[type=submit]").await;
    let hit = browser.wait_text("#search-results button", "turn 2").await;
    assert!(hit.contains("zebra"), "{hit}");
    browser
        .run("document.querySelector('#transcript').scrollTop = 1e9; return true;", json!([]))
        .await;
    browser.click("#search-results button").await;
    browser.wait_text("#transcript .hit", "zebra").await;
    assert!(in_view(browser, "#transcript .hit").await, "the match is brought into view");
    browser.set_value("#search-text", "no such words").await;
    browser.click("#search-form button[type=submit]").await;
    browser.wait_text("#search-results li", "Nothing in this conversation says").await;
    // A long prompt (40 lines) kept in view takes a bounded part of it (it scrolls).
    let long: String = (1..=40).map(|n| format!("line {n} of the brief\n")).collect();
    browser.set_value("#prompt", &format!("fourth, live\n{long}")).await;
    browser.click("#prompt-form button[type=submit]").await;
    browser.wait_text("#transcript > .current", "fourth, live").await;
    browser.wait_text("#turn-nav option", "fourth, live").await;
    assert_eq!(count(browser, "#transcript > .current").await, 1, "one prompt kept in view");
    let bounded = "const node = document.querySelector('#transcript > .current'); \
        return node.offsetHeight <= 11 * parseFloat(getComputedStyle(node).fontSize) \
          && node.scrollHeight > node.clientHeight;";
    assert_eq!(
        browser.run(bounded, json!([])).await,
        json!(true),
        "a long prompt scrolls in its box"
    );
}
