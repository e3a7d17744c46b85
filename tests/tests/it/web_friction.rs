//! The page's small frictions, each pinned in a real browser: sending while scrolled up
//! shows what comes of it, Enter in the pause's reason pauses, an action's error goes when
//! the state moves on, the heading names the task, a running turn says it is working,
//! a disabled button looks it, and a workflow's update leaves a step's card alone.

use protocol::api::ApiClient;
use serde_json::json;
use tether_tests::browser::{self, Browser};
use tether_tests::daemon::Daemon;

async fn connected(browser: &Browser, url: &str) {
    browser.open(url).await;
    browser.wait_text("#connection", "connected").await;
}

/// A ready mock session (of the task "mock test") open in the page.
async fn session_page(browser: &Browser) -> (Daemon, String) {
    let daemon = Box::pin(Daemon::start(&[])).await;
    let api = daemon.api().await;
    let session = Box::pin(api.ready_session("mock", &daemon.workspace("friction"))).await;
    let url = format!("{}/#/session/{session}", daemon.url.replace("ws://", "http://"));
    connected(browser, &url).await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    (daemon, session)
}

async fn send(browser: &Browser, text: &str) {
    browser.set_value("#prompt", text).await;
    browser.click("#prompt-form button[type=submit]").await;
}

#[tokio::test]
async fn sending_while_scrolled_up_shows_what_comes_of_it() {
    let Some(browser) = browser::start("friction-scroll").await else { return };
    let (_daemon, _session) = session_page(&browser).await;
    browser.set_window(1000, 700).await;
    send(&browser, "/stream 400").await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    let scrolled = "const box = document.querySelector('#transcript'); box.scrollTop = 0; \
        box.dispatchEvent(new Event('scroll')); return box.scrollHeight > box.clientHeight * 2;";
    assert_eq!(browser.run(scrolled, json!([])).await, json!(true), "a transcript to scroll");
    send(&browser, "/say the answer").await;
    browser.wait_text("#transcript .agent", "the answer").await;
    let at_end = "const box = document.querySelector('#transcript'); \
        return box.scrollHeight - box.scrollTop - box.clientHeight < 40;";
    assert_eq!(browser.run(at_end, json!([])).await, json!(true), "the new output is in view");
}

#[tokio::test]
async fn enter_in_the_pause_reason_pauses_the_session() {
    let Some(browser) = browser::start("friction-pause").await else { return };
    let (_daemon, _session) = session_page(&browser).await;
    browser.click("#pause").await;
    browser.type_into("#pause-reason", "lunch\u{E007}").await;
    browser.wait_text("#session-state", "PAUSED").await;
    browser.wait_text("#activity", "paused: lunch").await;
}

#[tokio::test]
async fn an_actions_error_goes_when_the_state_moves_on() {
    let Some(browser) = browser::start("friction-error").await else { return };
    let (_daemon, session) = session_page(&browser).await;
    send(&browser, "/sleep 3000").await;
    browser.wait_text("#session-state", "RUNNING").await;
    // Rewinding while a turn runs is refused: the refusal names the running turn.
    let refused = "tether.act('task.session.rewind', {session_id: arguments[0], turn_id: 'none'}); return true;";
    browser.run(refused, json!([session])).await;
    browser.wait_text("#session-error", "").await;
    let shown = "return !document.querySelector('#session-error').hidden && !document.querySelector('#error').hidden;";
    assert_eq!(browser.run(shown, json!([])).await, json!(true), "the refusal is shown");
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    let gone = "return document.querySelector('#session-error').hidden && document.querySelector('#error').hidden;";
    assert_eq!(browser.run(gone, json!([])).await, json!(true), "the refusal went with the state");
}

#[tokio::test]
async fn the_heading_names_the_task_and_a_running_turn_says_it_is_working() {
    let Some(browser) = browser::start("friction-heading").await else { return };
    let (_daemon, session) = session_page(&browser).await;
    let heading = browser.wait_text("#session-title", "mock test").await;
    assert!(heading.starts_with("mock test") && heading.contains(&session), "{heading}");
    let working = "return document.querySelector('#working').hidden;";
    assert_eq!(browser.run(working, json!([])).await, json!(true), "at rest: not working");
    send(&browser, "/sleep 1500").await;
    browser.wait_text("#working", "working").await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    assert_eq!(browser.run(working, json!([])).await, json!(true), "the turn ended");
}

#[tokio::test]
async fn a_disabled_button_looks_disabled() {
    let Some(browser) = browser::start("friction-disabled").await else { return };
    let (_daemon, _session) = session_page(&browser).await;
    let looks = "const b = document.createElement('button'); b.textContent = 'x'; \
        document.querySelector('#session .actions').append(b); \
        const on = getComputedStyle(b).opacity; b.disabled = true; \
        const off = getComputedStyle(b); const result = [on, off.opacity, off.cursor]; b.remove(); return result;";
    let [enabled, disabled, cursor] =
        browser.run(looks, json!([])).await.as_array().cloned().unwrap().try_into().unwrap();
    assert_eq!(enabled, json!("1"));
    assert!(disabled.as_str().unwrap().parse::<f64>().unwrap() < 0.6, "{disabled}");
    assert_eq!(cursor, json!("not-allowed"));
}

/// On a phone: a diff fits the screen (its halves stacked, lines wrapped), and an open
/// workflow leaves the session list its full width.
#[tokio::test]
async fn on_a_phone_a_diff_fits_and_an_open_workflow_leaves_the_list_whole() {
    let Some(browser) = browser::start("friction-phone").await else { return };
    let (daemon, _session) = session_page(&browser).await;
    browser.set_window(390, 844).await;
    let long =
        "let parsed = parser.parse_everything_in_this_rather_long_line(input, options, more);";
    send(&browser, &format!("/diff src/lib.rs fn a() {{}} => fn a() {{ {long} }}")).await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    let fits = "const cell = document.querySelector('#transcript .diff td.code.ins'); \
        const box = cell.getBoundingClientRect(); \
        return [box.left >= 0 && box.right <= window.innerWidth, \
                document.documentElement.scrollWidth <= window.innerWidth];";
    assert_eq!(browser.run(fits, json!([])).await, json!([true, true]), "the diff fits");
    let api = daemon.api().await;
    let spec = "name = \"phone flow\"\n[[steps]]\nid = \"only\"\nagent = \"mock\"\nprompt = \"/say done\"\n";
    let started = Box::pin(api.start_workflow(spec, &daemon.workspace("phone-flow"))).await;
    let url =
        format!("{}/#/workflow/{}", daemon.url.replace("ws://", "http://"), started.workflow_id);
    connected(&browser, &url).await;
    browser.wait_text("#workflow-title", "phone flow").await;
    let widths = "return [document.querySelector('#tasks').getBoundingClientRect().width, \
        document.querySelector('#workflow').getBoundingClientRect().width, window.innerWidth];";
    let widths = browser.run(widths, json!([])).await;
    let [list, workflow, screen] = [0, 1, 2].map(|at| widths[at].as_f64().unwrap());
    assert!(
        list > screen * 0.8 && workflow > screen * 0.8,
        "list {list}, workflow {workflow} of {screen}"
    );
}

/// N opens the next session that needs you, A goes to its question, Enter answers it.
#[tokio::test]
async fn keys_reach_the_next_session_that_needs_you_and_answer_its_question() {
    let Some(browser) = browser::start("friction-keys").await else { return };
    let (daemon, _quiet) = session_page(&browser).await;
    let api = daemon.api().await;
    let asking = Box::pin(api.ready_session("mock", &daemon.workspace("asking"))).await;
    api.prompt(&asking, "/permission\nmay I list the files?").await.expect("prompt");
    browser.wait_text(&format!("[data-session='{asking}']"), "needs you").await;
    browser.run("document.activeElement.blur(); return true;", json!([])).await;
    browser.press("n").await;
    browser.wait_text("#session-title", &asking).await;
    browser.wait_text(".permission.open", "mock tool").await;
    browser.press("a").await;
    let focused = "return document.activeElement.closest('.permission') !== null;";
    assert_eq!(browser.run(focused, json!([])).await, json!(true), "on the question's answer");
    browser.press("\u{E007}").await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    browser.wait_text(".permission .answer", "answered").await;
}

/// One place to start work: the prompt titles the task made on the way, a recent
/// workspace is offered, and the new session opens.
#[tokio::test]
async fn the_new_session_dialog_starts_work_in_one_place() {
    let Some(browser) = browser::start("friction-start").await else { return };
    let (daemon, earlier) = session_page(&browser).await;
    let workspace = daemon.workspace("friction");
    // Its workspace free again: a recent one to start the next session in.
    let api = daemon.api().await;
    tether_tests::daemon::ok("stop", protocol::api::ApiClient::session_stop(api.typed(), earlier))
        .await;
    browser.click("#new-session-open").await;
    let open = "return document.querySelector('#new-session-dialog').open;";
    assert_eq!(browser.run(open, json!([])).await, json!(true));
    let recent =
        "return [...document.querySelectorAll('#recent-workspaces option')].map((o) => o.value);";
    let offered = browser.run(recent, json!([])).await;
    assert_eq!(offered, json!([workspace.to_str().unwrap()]), "the workspace used before");
    browser
        .type_into(
            "#new-session textarea[name=prompt]",
            "Fix the flaky parser test\nIt fails one run in ten.",
        )
        .await;
    browser.set_value("#new-session select[name=agent]", "mock").await;
    browser.type_into("#new-session input[name=workspace]", workspace.to_str().unwrap()).await;
    browser.click("#new-session-start").await;
    let heading = browser.wait_text("#session-title", "Fix the flaky parser test").await;
    assert!(!heading.contains("It fails"), "the first line titles the task: {heading}");
    browser.wait_text("#transcript .agent", "Fix the flaky parser test").await;
    assert_eq!(browser.run(open, json!([])).await, json!(false), "the dialog closed");
}

/// The list is updated in place: a row a person is on keeps the focus when sessions come
/// and when its own session changes.
#[tokio::test]
async fn a_list_update_keeps_the_focus_on_its_row() {
    let Some(browser) = browser::start("friction-focus").await else { return };
    let (daemon, open) = session_page(&browser).await;
    let api = daemon.api().await;
    let other = Box::pin(api.ready_session("mock", &daemon.workspace("other"))).await;
    let row = format!("#tasks [data-session='{other}']");
    browser.wait_text(&row, "WAITING_FOR_INPUT").await;
    let mark = "const row = document.querySelector(arguments[0]); row.focus(); row.dataset.marked = 'yes'; \
        return document.activeElement === row;";
    assert_eq!(browser.run(mark, json!([row])).await, json!(true));
    // Another session comes: the row stays the node it was, focused.
    let third = Box::pin(api.ready_session("mock", &daemon.workspace("third"))).await;
    browser.wait_text(&format!("#tasks [data-session='{third}']"), "WAITING_FOR_INPUT").await;
    let focused = "const now = document.activeElement; return [now.dataset.session, now.dataset.marked || null];";
    assert_eq!(browser.run(focused, json!([])).await, json!([other, "yes"]));
    // Its own session changes: the row is drawn again and keeps the focus.
    Box::pin(api.ask(&other, "hello")).await;
    let count = "return document.querySelectorAll('#tasks .session').length;";
    assert_eq!(browser.run(count, json!([])).await, json!(3));
    assert_eq!(browser.run(focused, json!([])).await.get(0), Some(&json!(other)));
    assert_ne!(open, other);
}

/// Titles alike at their start are not cut to the same text in the list: a long one keeps
/// its end too, and nothing shown is cut off.
#[tokio::test]
async fn titles_alike_at_their_start_stay_told_apart_in_the_list() {
    let Some(browser) = browser::start("friction-titles").await else { return };
    let (daemon, _session) = session_page(&browser).await;
    let api = daemon.api().await;
    let long = "Refactor the session actor so that its queue component owns the halted state";
    for (part, dir) in [("part one", "one"), ("part two", "two")] {
        let title = format!("{long} ({part})");
        let task = tether_tests::daemon::ok(
            "task.create",
            protocol::api::ApiClient::task_create(api.typed(), title, None),
        )
        .await;
        let create =
            tether_tests::daemon::Create::new(&task.id, "mock", Some(&daemon.workspace(dir)));
        tether_tests::daemon::ok("session.create", create.send(api.typed())).await;
    }
    browser.set_value("#search", "Refactor").await;
    browser
        .run(
            "document.querySelector('#search').dispatchEvent(new Event('input')); return true;",
            json!([]),
        )
        .await;
    browser.wait_text("#tasks", "(part two)").await;
    let shown = "return [...document.querySelectorAll('#tasks .row-title')].map((t) => \
        [t.textContent, t.scrollWidth <= t.clientWidth && t.scrollHeight <= t.clientHeight + 1, t.title]);";
    let rows = browser.run(shown, json!([])).await;
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (row, part) in rows.iter().zip(["(part two)", "(part one)"]) {
        assert_eq!(row[1], json!(true), "nothing of what is shown is cut off: {row}");
        assert!(row[0].as_str().unwrap().ends_with(part), "the end that differs is shown: {row}");
        assert!(
            row[2].as_str().unwrap().starts_with(long),
            "the whole title is the tooltip: {row}"
        );
    }
}

/// A workflow's update (a step approved and run) leaves the steps that did not change
/// alone: the card of a finished step stays the node it was, and the button a person is on
/// keeps the focus.
#[tokio::test]
async fn a_workflow_update_leaves_the_step_a_person_is_on_alone() {
    Box::pin(workflow_update_in_place()).await;
}

async fn workflow_update_in_place() {
    let Some(browser) = browser::start("friction-steps").await else { return };
    let daemon = Box::pin(Daemon::start(&[])).await;
    let api = daemon.api().await;
    let spec = "name = \"kept\"\n[[steps]]\nid = \"plan\"\nagent = \"mock\"\nprompt = \"/say the plan\"\n\
        [[steps]]\nid = \"build\"\nagent = \"mock\"\ndepends_on = [\"plan\"]\napproval = true\nprompt = \"/say built\"\n";
    let started = Box::pin(api.start_workflow(spec, &daemon.workspace("kept"))).await;
    let id = started.workflow_id;
    let url = format!("{}/#/workflow/{id}", daemon.url.replace("ws://", "http://"));
    connected(&browser, &url).await;
    browser.wait_text("#steps [data-step=build]", "waiting approval").await;
    let mark = "const card = document.querySelector('#steps [data-step-row=plan]'); card.kept = true; \
        card.querySelector('.open-session').focus(); return true;";
    browser.run(mark, json!([])).await;
    api.typed().workflow_approve(id.clone(), "build".into()).await.expect("approve");
    browser.wait_text("#workflow-state", "completed").await;
    browser.wait_text("#steps [data-step-row=build] .output", "built").await;
    let kept = "const card = document.querySelector('#steps [data-step-row=plan]'); \
        return [card.kept === true, document.activeElement === card.querySelector('.open-session')];";
    assert_eq!(
        browser.run(kept, json!([])).await,
        json!([true, true]),
        "the plan's card, and the focus"
    );
}
