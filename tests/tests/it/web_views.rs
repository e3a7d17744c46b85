//! The page's capabilities in a real browser: an agent's Markdown, thoughts,
//! plan, usage, diffs, failed commands and every permission option rendered; the "needs
//! you" signal; a list that searches, filters, sorts and pages 200 sessions; the pause
//! dialog, the snapshot viewer, the workspace checkpoints and the graphical timeline; dark
//! mode and a phone's width
//! (with the screenshots `docs/` shows).

use protocol::api::ApiClient;
use serde_json::json;
use tether_tests::browser::{self, Browser};
use tether_tests::daemon::{Daemon, ok, settled};

fn page(daemon: &Daemon) -> String {
    daemon.url.replace("ws://", "http://") + "/"
}

async fn connected(browser: &Browser, url: &str) {
    browser.open(url).await;
    browser.wait_text("#connection", "connected").await;
}

async fn prompt_in_page(browser: &Browser, text: &str) {
    browser.set_value("#prompt", text).await;
    browser.click("#prompt-form button[type=submit]").await;
}

async fn count(browser: &Browser, css: &str) -> usize {
    browser.texts(css).await.len()
}

async fn attribute(browser: &Browser, css: &str, name: &str) -> serde_json::Value {
    let script =
        "const n = document.querySelector(arguments[0]); return n && n.getAttribute(arguments[1]);";
    browser.run(script, json!([css, name])).await
}

/// Opens `session` in a page that reads its events one at a time (the page's
/// `tether-window` setting, read when it loads).
async fn open_with_window_of_one(browser: &Browser, daemon: &Daemon, session: &str) {
    connected(browser, &page(daemon)).await;
    browser.run("sessionStorage.setItem('tether-window', '1'); return true;", json!([])).await;
    browser.open("about:blank").await; // a new load, so the page reads the setting
    connected(browser, &format!("{}#/session/{session}", page(daemon))).await;
}

/// Opens a ready mock session in the page; the daemon, its session.
async fn session_page(browser: &Browser, name: &str) -> (Daemon, String) {
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace(name)).await;
    connected(browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    (daemon, session)
}

const MARKDOWN_REPLY: &str = "# Release notes\\n\\nSome **bold** text and `code`.\\n\\n\
```rust\\nfn main() { let x = 1; } // done\\n```\\n\\n| a | b |\\n|---|---|\\n| 1 | 2 |\\n\\n\
[docs](https://example.org/docs) [bad](javascript:alert(1))\\n\\n\
<script>window.pwned = 1</script><img src=x onerror=\"window.pwned = 2\">";

/// The agent's reply as Markdown (a heading, a highlighted code block, a table, a link);
/// its raw HTML and `javascript:` link never become markup.
#[tokio::test]
async fn a_markdown_reply_renders_a_heading_and_a_code_block() {
    let Some(browser) = browser::start("markdown").await else { return };
    let (_daemon, _session) = session_page(&browser, "m").await;
    prompt_in_page(&browser, &format!("/say {MARKDOWN_REPLY}")).await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    browser.wait_text("#transcript .agent h1", "Release notes").await;
    browser.wait_text("#transcript .agent pre code", "fn main()").await;
    assert!(
        count(&browser, "#transcript .agent pre code .tok-k").await >= 2,
        "keywords highlighted"
    );
    browser.wait_text("#transcript .agent pre code .tok-c", "// done").await;
    browser.wait_text("#transcript .agent strong", "bold").await;
    browser.wait_text("#transcript .agent table td", "2").await;
    let link = "#transcript .agent a";
    assert_eq!(attribute(&browser, link, "href").await, json!("https://example.org/docs"));
    assert_eq!(attribute(&browser, link, "rel").await, json!("noopener noreferrer"));
    // No markup from the agent: its script and image are text, its javascript: link inert.
    assert_eq!(count(&browser, "#transcript script, #transcript img").await, 0);
    let pwned = browser.run("return window.pwned === undefined;", json!([])).await;
    assert_eq!(pwned, json!(true), "no agent script ran");
    browser.wait_text("#transcript .agent", "<script>window.pwned = 1</script>").await;
    let hrefs = "return Array.from(document.querySelectorAll('#transcript a'), a => a.getAttribute('href'));";
    let hrefs = browser.run(hrefs, json!([])).await;
    assert!(!hrefs.to_string().contains("javascript:"), "{hrefs}");
    browser.screenshot("rendered").await;
}

/// The agent's thought folds; its plan shows each entry's status; its context use and
/// cost show in the session's head, and the session's token and cost totals.
#[tokio::test]
async fn thoughts_fold_and_the_plan_and_usage_show() {
    let Some(browser) = browser::start("plan").await else { return };
    let (_daemon, _session) = session_page(&browser, "p").await;
    let prompt = "/think weighing the options\\nthen deciding\n/plan read the code; edit it; run the tests\n\
/usage 150000 200000 1.25\n/tokens 1200 300\nwhat next";
    prompt_in_page(&browser, prompt).await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    browser.wait_text("#transcript details.thought", "weighing the options").await;
    assert_eq!(attribute(&browser, "#transcript details.thought", "open").await, json!(null));
    assert_eq!(count(&browser, "#transcript .plan li").await, 3);
    browser.wait_text(".plan [data-status=completed]", "read the code").await;
    browser.wait_text(".plan [data-status=in_progress]", "edit it").await;
    browser.wait_text(".plan [data-status=pending]", "run the tests").await;
    browser.wait_text("#usage-text", "context 150k / 200k (75%) · 1.25 USD").await;
    let meter =
        browser.run("return document.querySelector('#context-meter').value;", json!([])).await;
    assert_eq!(meter, json!(150000));
    browser.wait_text("#totals", "1.5k tokens · 1.25 USD").await;
}

/// An edit renders both sides of its diff with its location; a failed command its
/// command line and output.
#[tokio::test]
async fn a_diff_renders_both_sides_and_a_failed_command_its_output() {
    let Some(browser) = browser::start("diff").await else { return };
    let (_daemon, _session) = session_page(&browser, "d").await;
    let prompt = "/diff src/lib.rs fn a() {}\\nfn b() {}\\nfn keep() {} => fn a() {}\\nfn c() {}\\nfn keep() {}\n\
/exec cargo test --workspace";
    prompt_in_page(&browser, prompt).await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    browser.wait_text(".diff .diff-head", "src/lib.rs").await;
    browser.wait_text(".diff td.del", "fn b() {}").await;
    browser.wait_text(".diff td.ins", "fn c() {}").await;
    assert_eq!(count(&browser, ".diff td.ctx").await, 4, "two unchanged lines, both sides");
    assert_eq!(count(&browser, ".diff td.del").await, 1);
    assert_eq!(count(&browser, ".diff td.ins").await, 1);
    browser.wait_text("details.tool .locations", "src/lib.rs:1").await;
    // The failed command: open, with its command line, its output and the failure.
    browser.wait_text("details.tool.failed .status", "failed").await;
    browser.wait_text("details.tool.failed pre.command", "$ cargo test --workspace").await;
    browser.wait_text("details.tool.failed pre.output", "exit code 1").await;
    assert_eq!(attribute(&browser, "details.tool.failed", "open").await, json!(""));
    browser.screenshot("diff").await;
    // The diff's edges: a file emptied, nothing changed, only the last line's end, and a
    // big new file (its first 2,000 rows, the rest counted).
    let heads = "const head = (o, n) => tether.diffView({path: 'f', oldText: o, newText: n}); \
        const big = Array.from({length: 3000}, (_, i) => 'line ' + i).join('\\n'); \
        return [head('a\\nb\\n', ''), head('a\\n', 'a\\n'), head('a', 'a\\n'), head(null, big)] \
          .map(d => [d.querySelector('.diff-head').textContent, d.querySelectorAll('tbody tr').length]);";
    let heads = browser.run(heads, json!([])).await;
    assert_eq!(
        heads,
        json!([
            ["f−2 +0", 2],
            ["f−0 +0", 1],
            ["fthe line endings changed", 1],
            ["fnew file−0 +3000", 2001]
        ])
    );
}

/// A question of an agent flags its session in the list and the tab's title while
/// another session is open; opened, it offers every option the agent gave, and answering
/// clears the flag.
#[tokio::test]
async fn a_waiting_permission_flags_the_list_and_title_and_offers_every_option() {
    let Some(browser) = browser::start("needs-you").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let asking = api.ready_session("mock", &daemon.workspace("a")).await;
    let other = api.ready_session("mock", &daemon.workspace("b")).await;
    connected(&browser, &format!("{}#/session/{other}", page(&daemon))).await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    assert_eq!(browser.run("return document.title;", json!([])).await, json!("Tether"));
    // The system's notifications, as the page would find them once allowed ("Notify me").
    let fake = "window.Notification = class { static permission = 'granted'; \
        constructor(title, options) { (window.notes = window.notes || []).push([title, options.body]); } }; return true;";
    browser.run(fake, json!([])).await;
    api.prompt(&asking, "/permission").await.expect("prompt");
    let row = format!("#tasks .session.needs-you[data-session=\"{asking}\"]");
    browser.wait_text(&row, "needs you").await;
    let title = browser.run("return document.title;", json!([])).await;
    assert_eq!(title, json!("(1) needs you · Tether"));
    let notes = browser.run("return window.notes;", json!([])).await;
    assert_eq!(notes, json!([["Tether: a session needs you", "mock asks for permission"]]));
    browser.screenshot("flagged").await;
    // The list's filter finds it.
    browser.set_value("#filter-state", "needs-you").await;
    assert_eq!(count(&browser, "#tasks .session").await, 1);
    browser.set_value("#filter-state", "").await;
    browser.click(&row).await;
    browser.wait_text(".permission", "The agent asks to run mock tool: list files").await;
    let options = browser.texts(".permission button").await;
    assert_eq!(options, ["Allow once", "Always allow", "Reject", "Always reject"]);
    browser.click(".permission button.allow-always").await;
    browser.wait_text(".permission", "answered: allow-always").await;
    browser.wait_text("#transcript .agent", "the tool ran").await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    let flagged = format!("#tasks .session.needs-you[data-session=\"{asking}\"]");
    browser
        .run_async(
            "const [css, done] = arguments; const check = () => !document.querySelector(css) && document.title === 'Tether'; \
             if (check()) return done(true); new MutationObserver((_, o) => { if (check()) { o.disconnect(); done(true); } }) \
             .observe(document.documentElement, {subtree: true, childList: true, attributes: true, characterData: true});",
            json!([flagged]),
        )
        .await;
}

/// A turn that ends in another session while one is open is news: that session is
/// flagged until it is opened, and the flag goes when the session ends.
#[tokio::test]
async fn a_turn_that_ends_unseen_flags_its_session_until_opened() {
    let Some(browser) = browser::start("unseen").await else { return };
    let (daemon, _open) = session_page(&browser, "open").await;
    let api = daemon.api().await;
    let other = api.ready_session("mock", &daemon.workspace("other")).await;
    let row = format!("#tasks .session[data-session=\"{other}\"]");
    browser.wait_text(&row, "WAITING_FOR_INPUT").await;
    api.ask(&other, "done elsewhere").await;
    let flagged = format!("#tasks .session.needs-you[data-session=\"{other}\"]");
    browser.wait_text(&flagged, "needs you").await;
    assert_eq!(
        browser.run("return document.title;", json!([])).await,
        json!("(1) needs you · Tether")
    );
    browser.click(&flagged).await;
    browser.wait_text("#session-title", &other).await;
    assert_eq!(count(&browser, "#tasks .session.needs-you").await, 0);
    assert_eq!(browser.run("return document.title;", json!([])).await, json!("Tether"));
}

/// The list of 200 sessions: 50 shown newest first, more on request, search narrows it to
/// the matching ones, filters by agent and state; rows open from the keyboard.
#[tokio::test]
async fn search_filters_200_sessions() {
    Box::pin(search_filters_200_sessions_steps()).await;
}

async fn search_filters_200_sessions_steps() {
    let Some(browser) = browser::start("search").await else { return };
    let profile = "id = \"broken\"\ncommand = [\"false\"]\nprotocol = \"acp\"\n";
    let daemon = Daemon::start_with_profiles(&[], &[("broken.toml", profile)]).await;
    let api = daemon.api().await;
    let typed = api.typed();
    let mut made = Vec::new();
    let mut tasks = Vec::new();
    for (title, n) in [("alpha", 90), ("beta", 90), ("needle in the haystack", 3), ("omega", 17)] {
        let task = ok("task.create", typed.task_create(title.into(), None)).await;
        tasks.push(task.id.clone());
        for index in 0..n {
            let workspace = daemon.workspace(&format!("{title}-{index}").replace(' ', "-"));
            let agent = if title == "omega" { "mock" } else { "broken" };
            let mut create = tether_tests::daemon::Create::new(&task.id, agent, Some(&workspace));
            create.prompt = Some(String::new());
            made.push(ok("create", create.send(typed)).await.id);
        }
    }
    assert_eq!(made.len(), 200);
    connected(&browser, &page(&daemon)).await;
    Box::pin(the_list_of_200(&browser, &made)).await;
    Box::pin(the_list_of_200_filtered(&browser, &made, &tasks)).await;
    ok("stop-all", typed.stop_all()).await;
}

/// What the list of 200 does (see the test above): paging, search, filters, sort, keys.
async fn the_list_of_200(browser: &Browser, made: &[String]) {
    browser.wait_text("#list-count", "200 sessions").await;
    assert_eq!(count(browser, "#tasks .session").await, 50, "a page of 50");
    let first = attribute(browser, "#tasks .session", "data-session").await;
    assert_eq!(first, json!(made[199]), "newest first");
    browser.click("#more").await;
    browser.wait_text("#more", "Show 50 more").await;
    assert_eq!(count(browser, "#tasks .session").await, 100);
    browser.type_into("#search", "needle").await;
    browser.wait_text("#list-count", "3 of 200 sessions").await;
    let rows = browser.texts("#tasks .session .row-title").await;
    assert_eq!(rows, vec!["needle in the haystack"; 3]);
}

/// The rest of it: filters by task, state and agent, sort, a row opened from the keys.
async fn the_list_of_200_filtered(browser: &Browser, made: &[String], tasks: &[String]) {
    browser.set_value("#search", "").await;
    browser.set_value("#filter-task", &tasks[1]).await;
    browser.wait_text("#list-count", "90 of 200 sessions").await;
    browser.set_value("#filter-state", "FAILED").await;
    browser.wait_text("#list-count", "90 of 200 sessions").await;
    browser.set_value("#filter-task", "").await;
    browser.set_value("#filter-state", "").await;
    browser.set_value("#filter-agent", "mock").await;
    browser.wait_text("#list-count", "17 of 200 sessions").await;
    browser.set_value("#sort", "oldest").await;
    assert_eq!(attribute(browser, "#tasks .session", "data-session").await, json!(made[183]));
    // Keyboard: the first row takes the focus and Enter opens it.
    browser.run("document.querySelector('#tasks .session').focus(); return true;", json!([])).await;
    browser.type_into_more("#tasks .session", "\u{E007}").await;
    browser.wait_text("#session-title", &made[183]).await;
    browser.screenshot("list").await;
}

/// Pause asks for a reason, which the activity and the pause's snapshot then show; the
/// timeline draws the turn and the pause.
#[tokio::test]
async fn pause_asks_a_reason_and_the_snapshot_and_timeline_show_it() {
    let Some(browser) = browser::start("pause-dialog").await else { return };
    let (_daemon, _session) = session_page(&browser, "pd").await;
    prompt_in_page(&browser, "/say all done").await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    browser.click("#pause").await;
    let open = browser.run("return document.querySelector('#pause-dialog').open;", json!([])).await;
    assert_eq!(open, json!(true), "Pause asks first");
    browser.type_into("#pause-reason", "lunch break").await;
    browser.click("#pause-confirm").await;
    browser.wait_text("#session-state", "PAUSED").await;
    browser.wait_text("#activity", "paused: lunch break").await;
    browser.click("[data-tab=snapshots]").await;
    browser.wait_text("#snapshot-list", "pause").await;
    browser.click("#snapshot-list button[data-snapshot]").await;
    browser.wait_text("#snapshot-view", "lunch break").await;
    browser.wait_text("#snapshot-view .snapshot-turns", "all done").await;
    browser.click("[data-tab=timeline]").await;
    browser.wait_text("#timeline-entries", "paused").await;
    assert!(
        count(&browser, "#timeline-chart svg rect.turn.completed").await >= 1,
        "the turn drawn"
    );
    assert!(count(&browser, "#timeline-chart svg line.mark.paused").await >= 1, "the pause marked");
    browser.screenshot("timeline").await;
}

/// The snapshots view lists the workspace's checkpoints, newest first, and writes the
/// one chosen into a new directory.
#[tokio::test]
async fn the_page_lists_the_workspace_checkpoints_and_writes_one_out() {
    let Some(browser) = browser::start("checkpoints").await else { return };
    let (daemon, session) = session_page(&browser, "cp").await;
    let api = daemon.api().await;
    let dir = daemon.workspace("cp");
    let mut events = api.subscribe_at_end(&session).await;
    let turn = api.prompt(&session, &format!("/write {} hello", dir.join("a.txt").display())).await;
    let turn = turn.expect("a turn");
    tether_tests::daemon::until(&mut events, |e| {
        matches!(&e.kind, protocol::api::EventKind::CheckpointTaken { checkpoint } if checkpoint.turn_id.as_ref() == Some(&turn))
    })
    .await;
    browser.click("[data-tab=snapshots]").await;
    browser.wait_text("#checkpoint-list", "turn 1").await;
    let into = daemon.root.path().join("written-out");
    browser.type_into("#checkpoint-into", &into.display().to_string()).await;
    browser.click("#checkpoint-restore button[type=submit]").await;
    browser.wait_text("#checkpoint-restored", "written into").await;
    assert_eq!(std::fs::read_to_string(into.join("a.txt")).unwrap(), "hello");
    // A directory that is not empty is refused, saying why.
    browser.click("#checkpoint-restore button[type=submit]").await;
    browser.wait_text("#checkpoint-restored", "not empty").await;
}

/// A pause's snapshot shows the agent's plan, each step as done, in progress or
/// next, the newest test run and what became of each error.
#[tokio::test]
async fn the_snapshot_view_shows_the_agents_plan() {
    let Some(browser) = browser::start("snapshot-plan").await else { return };
    let (_daemon, _session) = session_page(&browser, "sp").await;
    prompt_in_page(&browser, "/plan read the code; change it; test it\n/exec cargo test").await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    browser.click("#pause").await;
    browser.type_into("#pause-reason", "plan review").await;
    browser.click("#pause-confirm").await;
    browser.wait_text("#session-state", "PAUSED").await;
    browser.click("[data-tab=snapshots]").await;
    browser.wait_text("#snapshot-list", "pause").await;
    browser.click("#snapshot-list button[data-snapshot]").await;
    browser.wait_text("#snapshot-view .snapshot-plan", "change it").await;
    let steps = browser
        .run(
            "return [...document.querySelectorAll('#snapshot-view .snapshot-plan li')].map((li) => li.className + ': ' + li.textContent);",
            json!([]),
        )
        .await;
    let expected = [
        "plan-entry completed: read the code",
        "plan-entry in_progress: change it",
        "plan-entry pending: test it",
    ];
    assert_eq!(steps, json!(expected));
    // The test run and what became of its failure.
    browser
        .wait_text("#snapshot-view .snapshot-tests.failed", "Last test run: cargo test — failed")
        .await;
    browser
        .wait_text(
            "#snapshot-view .snapshot-errors .badge.resolution-worked_around",
            "worked around",
        )
        .await;
}

/// The timeline is a card per run of the agent — how it began, its turns as a
/// progress bar, a badge for what ended it (a pause's trigger) — and a pause's snapshot
/// shows the summary the agent gave at the pause.
#[tokio::test]
async fn runs_are_cards_with_trigger_badges_and_the_snapshot_shows_the_summary() {
    Box::pin(runs_as_cards()).await;
}

async fn runs_as_cards() {
    let Some(browser) = browser::start("exec-cards").await else { return };
    let profile = "id = \"summarize\"\ncommand = [\"mock-agent\", \"--state-dir\", \"{home}/.mock-agent\"]\nprotocol = \"acp\"\n[session]\nsummarize_on_pause = true\nmax_turns = 3\n";
    let daemon = Daemon::start_with_profiles(&[], &[("summarize.toml", profile)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("summarize", &daemon.workspace("cards")).await;
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    // Each part boxed: a debug build's frame of one async fn holding them all overflows.
    Box::pin(first_run_paused_with_a_summary(&browser)).await;
    // A second run, paused by `max_turns` at its first turn (the session's third).
    api.resume(&session).await.expect("resume");
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, "second").await.expect("prompt");
    let paused =
        |e: &protocol::api::SessionEvent| matches!(e.kind, protocol::api::EventKind::Paused { .. });
    Box::pin(tether_tests::daemon::until(&mut events, paused)).await;
    Box::pin(browser.wait_text("#session-state", "PAUSED")).await;
    Box::pin(runs_shown_as_cards(&browser)).await;
}

async fn first_run_paused_with_a_summary(browser: &Browser) {
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    let answer = r#"{"decisions":[{"decision":"keep the parser hand-written","rationale":"the grammar is tiny","alternatives":["a parser generator"]}],"open_problems":[],"next_steps":["fix the lexer"]}"#;
    let plan = "/plan read the grammar; write the parser; test it";
    prompt_in_page(browser, &format!("{plan}\n/then /say {answer}\nfirst")).await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    browser.click("#pause").await;
    browser.type_into("#pause-reason", "first break").await;
    browser.click("#pause-confirm").await;
    browser.wait_text("#session-state", "PAUSED").await;
    Box::pin(summary_prompt_shown_as_tethers(browser)).await;
    browser.click("[data-tab=snapshots]").await;
    browser.wait_text("#snapshot-list", "first break").await;
    // The pause's snapshot (a turn's may be listed beside it).
    let open = "for (const li of document.querySelectorAll('#snapshot-list li')) \
        if (li.textContent.includes('first break')) { li.querySelector('button').click(); return true; } return false;";
    assert_eq!(browser.run(open, json!([])).await, json!(true));
    let decisions = "#snapshot-view .snapshot-summary .decisions";
    browser.wait_text(decisions, "keep the parser hand-written").await;
    browser.wait_text(decisions, "considered: a parser generator").await;
    browser.wait_text("#snapshot-view .snapshot-summary .next-steps", "fix the lexer").await;
    browser.wait_text("#snapshot-view .snapshot-turns .user.tether-ask", ASKED).await;
}

const ASKED: &str = "Tether asked the agent for its summary before pausing";

/// Tether's summary prompt is shown as its own, not as the person's.
async fn summary_prompt_shown_as_tethers(browser: &Browser) {
    browser.wait_text("#transcript .user.tether-ask summary", ASKED).await;
    let mine = browser.texts("#transcript .user:not(.tether-ask)").await;
    assert_eq!(mine.len(), 1, "{mine:?}");
    assert!(mine[0].starts_with("You: /plan read the grammar"), "{mine:?}");
    browser.screenshot("summary-asked").await;
}

async fn runs_shown_as_cards(browser: &Browser) {
    browser.click("[data-tab=timeline]").await;
    browser.wait_text("#timeline-entries .exec-card .badge.trigger-max_turns", "max turns").await;
    let cards = browser.texts("#timeline-entries .exec-card header").await;
    assert_eq!(cards.len(), 2, "{cards:?}");
    // Newest first: the second run began with a restore and ended at the turn limit.
    assert!(cards[0].starts_with("Run 2"), "{cards:?}");
    assert!(cards[1].starts_with("Run 1") && cards[1].contains("paused"), "{cards:?}");
    let started = browser.texts("#timeline-entries .exec-card:first-child .badge.start").await;
    assert_eq!(started.len(), 1, "how run 2 began: {started:?}");
    // Its turns: the prompt and the summary turn the pause asked for; run 1 had two too.
    assert_eq!(count(browser, ".exec-card:first-child .progress .seg.completed").await, 2);
    assert_eq!(count(browser, ".exec-card:last-child .progress .seg.completed").await, 2);
    browser.wait_text(".exec-card:last-child .card-meta", "first break").await;
    let plan = "Plan: 1 of 3 done, 1 in progress — now: write the parser";
    browser.wait_text(".exec-card:last-child .card-plan", plan).await;
    browser.screenshot("timeline-cards").await;
}

/// Resuming in the page says what changed in the workspace while the session
/// was paused — someone's commit and edits — as the agent is told in its next prompt.
#[tokio::test]
async fn resuming_in_the_page_shows_what_changed_while_paused() {
    Box::pin(drift_in_page()).await;
}

async fn drift_in_page() {
    use tether_tests::git;
    let Some(browser) = browser::start("drift").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let workspace = daemon.workspace("drift");
    let dir = workspace.as_path();
    git(dir, &["init", "-q", "-b", "main"]).await;
    std::fs::write(dir.join("a.txt"), "a 1\n").unwrap();
    git(dir, &["add", "."]).await;
    git(dir, &["commit", "-q", "-m", "start"]).await;
    let session = api.ready_session("mock", &workspace).await;
    api.ask(&session, "hello").await;
    ok("pause", api.typed().session_pause(session.clone(), None, None)).await;
    std::fs::write(dir.join("a.txt"), "a 2\n").unwrap();
    git(dir, &["commit", "-q", "-am", "fix a"]).await;
    std::fs::write(dir.join("b.txt"), "new\n").unwrap();
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#session-state", "PAUSED").await;
    browser.click("#resume").await;
    browser.wait_text("#drift", "The workspace changed while the session was paused").await;
    browser.wait_text("#drift", "1 new commit").await;
    browser.wait_text("#drift .drift-commits", "fix a").await;
    browser.wait_text("#drift .drift-files", "Files changed: a.txt, b.txt").await;
    browser.screenshot("drift").await;
}

/// The session view in light and dark (following the system) and at a desktop's and a
/// phone's width, where nothing is wider than the screen; the screenshots are the ones in
/// `docs/screenshots/`.
#[tokio::test]
async fn the_session_view_in_light_and_dark_on_a_desktop_and_a_phone() {
    Box::pin(light_and_dark_desktop_and_phone()).await;
}

async fn light_and_dark_desktop_and_phone() {
    let Some(browser) = browser::start("look").await else { return };
    let (daemon, session) = session_page(&browser, "look").await;
    let reply = "## Fixed the parser\\n\\nThe lexer now keeps **line numbers**:\\n\\n\
```rust\\nfn next(&mut self) -> Option<Token> { self.line += 1; None }\\n```";
    let prompt = format!(
        "/think the lexer drops newlines\n/plan read the lexer; keep line numbers; run the tests\n\
/diff src/lexer.rs fn next(&mut self) {{\\n    self.pos += 1;\\n}} => fn next(&mut self) {{\\n    self.pos += 1;\\n    self.line += 1;\\n}}\n\
/exec cargo test -p parser\n/usage 41000 200000 0.42\n/tokens 38000 3100\n/say {reply}"
    );
    prompt_in_page(&browser, &prompt).await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    let api = daemon.api().await;
    api.prompt(&session, "/permission\nmay I run the tests?").await.expect("prompt");
    browser.wait_text(".permission", "mock tool: list files").await;
    let background = "return getComputedStyle(document.body).backgroundColor;";
    let overflow = "return document.documentElement.scrollWidth <= window.innerWidth;";
    for (width, height, name) in [(1440, 900, "desktop"), (390, 844, "phone")] {
        browser.set_window(width, height).await;
        for scheme in ["light", "dark"] {
            browser.color_scheme(scheme).await;
            let color = browser.run(background, json!([])).await;
            let expected = if scheme == "dark" { "rgb(20, 20, 22)" } else { "rgb(245, 245, 247)" };
            assert_eq!(color, json!(expected), "{name} {scheme}");
            assert_eq!(
                browser.run(overflow, json!([])).await,
                json!(true),
                "{name} {scheme}: no overflow"
            );
            browser.screenshot(&format!("{name}-{scheme}")).await;
        }
    }
}

/// `task.session.event_window` reads a session's events a window at a
/// time from the end — the newest first, then back with `before_seq` to where the log
/// starts — with its bounds checked.
#[tokio::test]
async fn the_event_window_reads_back_from_the_newest() {
    let limits = ["--event-log-segment-bytes", "16384", "--event-log-retain-bytes", "65536"];
    let daemon = Daemon::start(&limits).await;
    let api = daemon.api().await;
    let typed = api.typed();
    let session = api.ready_session("mock", &daemon.workspace("w")).await;
    api.ask(&session, "/stream 40\nfirst").await;
    let newest = ok("window", typed.session_event_window(session.clone(), None, Some(10))).await;
    assert_eq!(newest.events.len(), 10);
    assert_eq!(newest.events.last().unwrap().seq, newest.last_seq, "ends at the newest");
    let seqs: Vec<u64> = newest.events.iter().map(|e| e.seq).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "oldest first, no gap: {seqs:?}");
    // Back one window, then to the start: every event once, in order.
    let mut all = newest.events.clone();
    let mut before = newest.events[0].seq;
    loop {
        let window =
            ok("window", typed.session_event_window(session.clone(), Some(before), Some(25))).await;
        if window.events.is_empty() {
            assert_eq!(before, window.kept_after_seq + 1, "read back to the log's start");
            break;
        }
        assert_eq!(window.events.last().unwrap().seq, before - 1);
        before = window.events[0].seq;
        all.splice(0..0, window.events);
    }
    assert_eq!(all.len() as u64, newest.last_seq, "the untrimmed log, whole");
    // Trimmed: the window stops where the log starts.
    for n in 0..8 {
        api.ask(&session, &format!("/stream 300\nturn {n}")).await;
    }
    let trimmed = ok("window", typed.session_event_window(session.clone(), None, Some(5000))).await;
    assert!(trimmed.kept_after_seq > 0, "the log was trimmed");
    assert_eq!(trimmed.events[0].seq, trimmed.kept_after_seq + 1);
    assert_eq!(trimmed.events.last().unwrap().seq, trimmed.last_seq);
    let err = tether_tests::daemon::refused(
        "limit 0",
        typed.session_event_window(session.clone(), None, Some(0)),
    )
    .await;
    assert_eq!(err.kind, protocol::errors::ErrorKind::InvalidParams);
    let err = tether_tests::daemon::refused(
        "no such session",
        typed.session_event_window(uuid::Uuid::now_v7().to_string(), None, None),
    )
    .await;
    assert_eq!(err.kind, protocol::errors::ErrorKind::NotFound);
}

/// An agent we did not write, in the page: claude-agent-acp against the scripted model
/// reads a file, asks to edit it — the page offers claude's own options and shows the
/// edit's diff, both sides — and replies in Markdown, rendered.
#[tokio::test]
async fn claude_s_edit_permission_diff_and_markdown_render_in_the_page() {
    Box::pin(claude_in_the_page()).await;
}

async fn claude_in_the_page() {
    use tether_tests::model_server::{ModelServer, Reply};
    let server = ModelServer::start().await;
    let Some(daemon) = crate::real_agents::claude_daemon(&server, None).await else { return };
    let Some(browser) = browser::start("claude").await else { return };
    let api = daemon.api().await;
    let workspace = daemon.workspace("claude-page");
    crate::real_agents::ask_before_edits(&workspace);
    let file = workspace.join("greet.rs");
    std::fs::write(&file, "fn greet() {\n    println!(\"hello\");\n}\n").unwrap();
    let session = api.ready_session("claude", &workspace).await;
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    server.script([
        Reply::ToolUse { name: "Read".into(), input: json!({"file_path": file}) },
        Reply::ToolUse {
            name: "Edit".into(),
            input: json!({"file_path": file, "old_string": "println!(\"hello\");",
                "new_string": "println!(\"hello, world\");"}),
        },
        Reply::Text(
            "## Done\n\nThe greeting now says **hello, world**:\n\n```rust\nfn greet() {}\n```"
                .into(),
        ),
    ]);
    prompt_in_page(&browser, "make the greeting say hello, world").await;
    browser.wait_text(".permission", "The agent asks to run").await;
    let options = browser.texts(".permission button").await;
    assert!(options.len() >= 2, "claude's options, each a button: {options:?}");
    browser.wait_text(".diff td.del", "println!(\"hello\");").await;
    browser.wait_text(".diff td.ins", "println!(\"hello, world\");").await;
    browser.screenshot("asked").await;
    browser.click(".permission button.allow").await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    browser.wait_text("#transcript .agent h2", "Done").await;
    browser.wait_text("#transcript .agent strong", "hello, world").await;
    browser.wait_text("#transcript .agent pre code", "fn greet()").await;
    let written = std::fs::read_to_string(&file).unwrap();
    assert!(written.contains("hello, world"), "{written}");
    browser.screenshot("done").await;
    ok("task.session.stop", api.typed().session_stop(session)).await;
}

/// The transcript follows new output until the reader scrolls up; then it stays where
/// they are and "new output ↓" takes them back to the end.
#[tokio::test]
async fn auto_scroll_stops_when_the_reader_scrolls_up() {
    let Some(browser) = browser::start("scroll").await else { return };
    let (daemon, session) = session_page(&browser, "s").await;
    let at_end = "const b = document.querySelector('#transcript'); \
        return b.scrollHeight - b.scrollTop - b.clientHeight < 40;";
    prompt_in_page(&browser, "/stream 200\n/say line\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline\\nline").await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    assert_eq!(browser.run(at_end, json!([])).await, json!(true), "it followed the reply");
    let up = "const b = document.querySelector('#transcript'); b.scrollTop = 0; \
        b.dispatchEvent(new Event('scroll')); return b.scrollTop;";
    assert_eq!(browser.run(up, json!([])).await, json!(0));
    let api = daemon.api().await;
    api.ask(&session, "/stream 50\nmore while I read").await;
    browser.wait_text("#transcript .agent", "more while I read").await;
    let top =
        browser.run("return document.querySelector('#transcript').scrollTop;", json!([])).await;
    assert_eq!(top, json!(0), "it stayed where the reader was");
    browser.wait_text("#jump", "new output").await;
    browser.click("#jump").await;
    assert_eq!(browser.run(at_end, json!([])).await, json!(true), "back at the end");
    let hidden = browser.run("return document.querySelector('#jump').hidden;", json!([])).await;
    assert_eq!(hidden, json!(true));
}

/// Usage reported before the window the page opens at still shows: from the session's
/// newest snapshot.
#[tokio::test]
async fn usage_older_than_the_window_shows_from_the_snapshot() {
    let Some(browser) = browser::start("usage").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("u")).await;
    api.ask(&session, "/usage 90000 200000 0.5\nsmall").await;
    api.ask(&session, "/stream 700\nlong after").await;
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#transcript .agent", "[700/700]").await;
    assert_eq!(count(&browser, "#transcript button.earlier").await, 1, "opened at a window");
    browser.wait_text("#usage-text", "context 90.0k / 200k (45%) · 0.50 USD").await;
}

/// A window never holds an event at or after its `before_seq`, also where the log has a
/// gap (a damaged line, skipped): reading back ends, each event once.
#[tokio::test]
async fn an_event_window_stops_before_its_bound_across_a_gap() {
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("gap")).await;
    api.ask(&session, "/stream 30\nwith a gap").await;
    let last = api.status(&session).await.last_event_seq;
    drop(api);
    daemon.kill().await;
    // Damage one line in the middle: the reader skips it, leaving a gap in the seqs.
    let dir = daemon.session_dir(&session).join("events");
    let segment = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).min().unwrap();
    let text = std::fs::read_to_string(&segment).unwrap();
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let middle = lines.len() / 2;
    let damaged: serde_json::Value = serde_json::from_str(lines[middle]).unwrap();
    let damaged = damaged["seq"].as_u64().unwrap();
    let mut cut = String::new();
    for (index, line) in lines.iter().enumerate() {
        if index == middle {
            cut.push_str(&"#".repeat(line.len() - 1));
            cut.push('\n');
        } else {
            cut.push_str(line);
        }
    }
    std::fs::write(&segment, cut).unwrap();
    daemon.restart().await;
    let api = daemon.api().await;
    let typed = api.typed();
    let window =
        ok("window", typed.session_event_window(session.clone(), Some(damaged + 1), Some(1))).await;
    assert!(window.events.iter().all(|e| e.seq <= damaged), "{:?}", window.events);
    // Back from the newest, two at a time: it ends, nothing past a bound, nothing twice.
    let mut before = last + 1;
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..=last {
        let window =
            ok("window", typed.session_event_window(session.clone(), Some(before), Some(2))).await;
        let Some(first) = window.events.first() else { break };
        for event in &window.events {
            assert!(event.seq < before, "{} in a window before {before}", event.seq);
            assert!(seen.insert(event.seq, event.kind.clone()).is_none(), "{} twice", event.seq);
        }
        before = first.seq;
    }
    assert!(before <= 2, "read back to the start (stopped before {before})");
    // The damaged line is said in its place: a notice naming it, not the event it held.
    assert!(
        matches!(
            seen.get(&damaged),
            Some(protocol::api::EventKind::Notice { message }) if message.contains("unreadable")
        ),
        "{:?}",
        seen.get(&damaged)
    );
}

/// Reading a session back one event at a time (a window of 1) leaves what is newer as it
/// is: the open question keeps its buttons, a finished tool stays finished, the turn's
/// latest plan is its only one, usage stays the newest — and each event shows once.
#[tokio::test]
async fn earlier_windows_leave_what_is_newer_alone() {
    Box::pin(earlier_windows_leave_what_is_newer_alone_steps()).await;
}

async fn earlier_windows_leave_what_is_newer_alone_steps() {
    let Some(browser) = browser::start("windows").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("w1")).await;
    api.ask(&session, "/usage 10 100\n/tool\nfirst").await;
    api.ask(&session, "/plan a; b\n/plan a; b; c\n/usage 50 100\nsecond").await;
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, "/permission\nthird").await.expect("prompt");
    tether_tests::daemon::until_permission_request(&mut events).await;
    open_with_window_of_one(&browser, &daemon, &session).await;
    browser.wait_text(".permission", "mock tool: list files").await;
    // A window of one, under the newest prompt (pinned: the window starts inside its turn).
    assert_eq!(count(&browser, "#transcript > *:not(.earlier):not(.pinned)").await, 1);
    browser.wait_text("#transcript > .pinned .user", "third").await;
    crate::web_ui::show_all_earlier(&browser).await;
    assert_eq!(count(&browser, ".permission.open button").await, 4, "the open question is live");
    let statuses = browser.texts("details.tool .status").await;
    assert_eq!(statuses, ["completed", "pending"], "the first turn's tool, then the asking one");
    assert_eq!(count(&browser, ".plan").await, 1, "one plan: the turn's latest");
    assert_eq!(count(&browser, ".plan li").await, 3);
    browser.wait_text("#usage-text", "context 50 / 100 (50%)").await;
    let users = browser.texts("#transcript .user").await;
    assert_eq!(users.len(), 3, "{users:?}");
    assert_eq!(count(&browser, "#transcript .turn-end").await, 2);
    let agent = browser.texts("#transcript .agent").await.concat();
    assert_eq!(agent.matches("you said: first").count(), 1, "{agent}");
    assert_eq!(agent.matches("you said: second").count(), 1, "{agent}");
}

/// Opening a session twice at once (a double click, back and forth while it loads) shows
/// its transcript once.
#[tokio::test]
async fn opening_a_session_twice_at_once_shows_it_once() {
    let Some(browser) = browser::start("twice").await else { return };
    let (daemon, session) = session_page(&browser, "twice").await;
    let api = daemon.api().await;
    api.ask(&session, "one").await;
    api.ask(&session, "two").await;
    let both = "const [id, done] = arguments; Promise.all([tether.openSession(id), tether.openSession(id)]).then(() => done(true));";
    browser.run_async(both, json!([session])).await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    assert_eq!(browser.texts("#transcript .user").await.len(), 2);
    assert_eq!(count(&browser, "#transcript .turn-end").await, 2);
}

/// A turn of the open session that ends while the tab is hidden flags it; coming back to
/// the tab clears it.
#[tokio::test]
async fn a_turn_that_ends_in_a_hidden_tab_flags_the_open_session() {
    let Some(browser) = browser::start("hidden").await else { return };
    let (daemon, session) = session_page(&browser, "hidden").await;
    let hide = "Object.defineProperty(document, 'hidden', {value: true, configurable: true}); return true;";
    browser.run(hide, json!([])).await;
    daemon.api().await.ask(&session, "while away").await;
    let flagged = format!("#tasks .session.needs-you[data-session=\"{session}\"]");
    browser.wait_text(&flagged, "needs you").await;
    let show = "Object.defineProperty(document, 'hidden', {value: false, configurable: true}); \
        document.dispatchEvent(new Event('visibilitychange')); return true;";
    browser.run(show, json!([])).await;
    assert_eq!(count(&browser, "#tasks .session.needs-you").await, 0);
}

/// A question asked before the window the page opens at is still offered, live: the
/// status lists the open questions.
#[tokio::test]
async fn a_question_older_than_the_window_is_still_offered() {
    let Some(browser) = browser::start("old-question").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("q")).await;
    let mut events = api.subscribe_at_end(&session).await;
    api.prompt(&session, "/permission\nasking").await.expect("prompt");
    tether_tests::daemon::until_permission_request(&mut events).await;
    // An event after the question: a pause waiting for the turn.
    ok("pause", api.typed().session_pause(session.clone(), Some("later".into()), None)).await;
    let status = api.status(&session).await;
    assert_eq!(status.open_questions.len(), 1, "the status lists the question");
    open_with_window_of_one(&browser, &daemon, &session).await;
    browser.wait_text(".permission.open", "mock tool: list files").await;
    assert_eq!(count(&browser, ".permission.open button").await, 4);
    browser.click(".permission button.allow").await;
    browser.wait_text(".permission", "answered: allow").await;
    browser.wait_text("#session-state", "PAUSED").await;
    crate::web_ui::show_all_earlier(&browser).await;
    assert_eq!(count(&browser, ".permission").await, 1, "the question once");
}

/// A mock agent that prints twelve lines on stderr as it starts and never answers
/// `initialize`, bounded at three seconds.
const CHATTY_HANG: &str = "id = \"chatty\"\n\
    command = [\"mock-agent\", \"--stderr-at-start\", \"12\", \"--hang-on\", \"initialize\"]\n\
    protocol = \"acp\"\n[process]\ninit_timeout_ms = 3000\n";

/// The agent's last stderr line before it hangs.
const HANG_SAYS: &str = "the agent says: mock-agent: not answering initialize as configured";

/// The activity lines about the `initialize` step (not the failed resume's line).
async fn initialize_lines(browser: &Browser) -> Vec<String> {
    let lines = browser.texts("#activity li").await;
    lines
        .into_iter()
        .filter(|line| line.contains("initializ") && !line.contains("failed"))
        .collect()
}

/// A starting agent that prints a lot shows one activity line per launch step, as the
/// CLI does: the step's latest detail (the agent's newest stderr line) and how long it
/// waited, updated in place. So it reads from the newest window, and so it follows a
/// resume live while earlier windows are read (their steps are history: they leave the
/// live line alone).
#[tokio::test]
async fn a_starting_agents_step_is_one_line_updated_in_place() {
    let Some(browser) = browser::start("steps").await else { return };
    let daemon = Daemon::start_with_profiles(&[], &[("chatty.toml", CHATTY_HANG)]).await;
    let api = daemon.api().await;
    let session = api.create_session("chatty", &daemon.workspace("c")).await.unwrap();
    settled(&mut api.subscribe(&session, 0).await).await;
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#session-state", "FAILED").await;
    // (The state comes from the status, before the events are drawn: the line is awaited.)
    browser.wait_text("#activity li[data-step=initializing]", HANG_SAYS).await;
    let lines = initialize_lines(&browser).await;
    assert_eq!(lines.len(), 1, "one line for the step: {lines:?}");
    assert!(
        lines[0].contains("the agent is starting (initialize): ") && lines[0].contains(HANG_SAYS)
    );
    // Resumed in a page that reads earlier windows one event at a time.
    open_with_window_of_one(&browser, &daemon, &session).await;
    browser.wait_text("#transcript button.earlier", "Show earlier").await;
    browser.click("#resume").await;
    browser.wait_text("#activity li", "(still waiting, ").await;
    crate::web_ui::show_all_earlier(&browser).await;
    let ended = "#activity li[data-step=initializing]:not(.waiting)";
    let line = browser.wait_text(ended, HANG_SAYS).await;
    assert!(line.contains("(waited "), "{line}");
    let lines = initialize_lines(&browser).await;
    assert_eq!(lines, [line], "the live step's one line");
}

/// Cuts a session's event log to its first half while the daemon is down; the seqs lost.
fn cut_events_in_half(daemon: &Daemon, session: &str) -> std::ops::RangeInclusive<u64> {
    let dir = daemon.session_dir(session).join("events");
    let segments: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "jsonl"))
        .collect();
    assert_eq!(segments.len(), 1, "{segments:?}");
    let text = std::fs::read_to_string(&segments[0]).unwrap();
    let last = text.lines().last().unwrap();
    let high = serde_json::from_str::<serde_json::Value>(last).unwrap()["seq"].as_u64().unwrap();
    let kept = high / 2;
    let half: String = text.lines().take(kept as usize).map(|line| format!("{line}\n")).collect();
    std::fs::write(&segments[0], half).unwrap();
    kept + 1..=high
}

/// The notice lines saying events are unreadable.
async fn unreadable_lines(browser: &Browser) -> Vec<String> {
    let lines = browser.texts("#transcript .notice").await;
    lines.into_iter().filter(|line| line.contains("unreadable")).collect()
}

/// Events a log lost (cut while the daemon was down) are each delivered as a notice, at
/// their seq: the page shows them as one line with their count, whether read in one
/// window or a window of one event at a time (each read names the range from where it
/// starts, "events 12–20" after "events 11–20").
#[tokio::test]
async fn a_lost_range_of_events_is_one_notice_line() {
    let Some(browser) = browser::start("lost").await else { return };
    let mut daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("lost")).await;
    for n in 0..3 {
        api.ask(&session, &format!("turn {n}")).await;
    }
    drop(api);
    daemon.terminate().await;
    let lost = cut_events_in_half(&daemon, &session);
    daemon.restart().await;
    let said = format!("events {}–{} are unreadable", lost.start(), lost.end());
    let count = format!("×{}", lost.end() - lost.start() + 1);
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#transcript .notice", &said).await;
    let lines = unreadable_lines(&browser).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains(&said) && lines[0].ends_with(&count), "{lines:?}");
    open_with_window_of_one(&browser, &daemon, &session).await;
    browser.wait_text("#transcript button.earlier", "Show earlier").await;
    crate::web_ui::show_all_earlier(&browser).await;
    let lines = unreadable_lines(&browser).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains(&said) && lines[0].ends_with(&count), "{lines:?}");
}

/// A sandboxed session says so beside its title (what it may reach in the tooltip), and
/// each connection its egress proxy refused is a line of its transcript; an unconfined
/// session says it is unconfined.
#[tokio::test]
async fn a_sandboxed_session_shows_its_confinement_and_each_refusal() {
    if !std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .any(|dir| dir.join("bwrap").is_file())
    {
        assert!(std::env::var_os("REQUIRE_DOCKER").is_none(), "CI must have bubblewrap");
        return println!("SKIPPED: bubblewrap is not installed (scripts/setup.sh installs it)");
    }
    let Some(browser) = browser::start("sandbox").await else { return };
    let boxed = "id = \"boxed\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n\
        [env]\nOPENAI_BASE_URL = \"http://127.0.0.1:4000/v1\"\n\
        [sandbox]\nfilesystem = \"workspace\"\nnetwork = \"allowlist\"\nallow = [\"127.0.0.1:1\"]\n";
    let daemon = Daemon::start_with_profiles(&[], &[("boxed.toml", boxed)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("boxed", &daemon.workspace("boxed")).await;
    let open = api.ready_session("mock", &daemon.workspace("open")).await;
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    browser.wait_text("#session-title .sandbox-chip", "sandboxed: workspace · 2 hosts").await;
    let title = attribute(&browser, "#session-title .sandbox-chip", "title").await;
    let title = title.as_str().unwrap_or_default().to_owned();
    assert!(title.starts_with("Confined by bubblewrap."), "{title}");
    assert!(title.contains("only 127.0.0.1:1, 127.0.0.1:4000 (model endpoint)"), "{title}");
    prompt_in_page(&browser, "/sh curl -sS -m 5 http://127.0.0.1:9/\nreach out").await;
    browser
        .wait_text(
            "#transcript .notice.egress",
            "egress refused: the agent asked for 127.0.0.1:9, which is not on its allowlist",
        )
        .await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    browser.screenshot("sandboxed").await;
    connected(&browser, &format!("{}#/session/{open}", page(&daemon))).await;
    browser.wait_text("#session-title .sandbox-chip.unconfined", "unconfined").await;
}
