//! The page against axe-core in a real browser: no serious or critical accessibility
//! violation in any view a person works in — the list and the forms, a session with a
//! finished turn (Markdown, a tool call, a diff, a plan) and a question waiting, the
//! Changes tab, the pause dialog, a workflow — and tab semantics a screen reader can use.

use serde_json::json;
use tether_tests::browser::{self, Browser};
use tether_tests::daemon::Daemon;

async fn connected(browser: &Browser, url: &str) {
    Box::pin(browser.open(url)).await;
    Box::pin(browser.wait_text("#connection", "connected")).await;
}

/// Asserts axe-core finds nothing serious in the page as it is now (`what` names it).
async fn clean(browser: &Browser, what: &str) {
    let Some(found) = Box::pin(browser.accessibility_violations()).await else { return };
    assert!(found.is_empty(), "{what}: {found:#?}");
}

#[tokio::test]
async fn every_view_has_no_serious_accessibility_violation() {
    Box::pin(views_checked()).await;
}

async fn views_checked() {
    let Some(browser) = browser::start("access").await else { return };
    let daemon = Box::pin(Daemon::start(&[])).await;
    let api = daemon.api().await;
    let repo = daemon.workspace("access");
    tether_tests::git_repository(&repo).await;
    let session = Box::pin(api.ready_session("mock", &repo)).await;
    let page = daemon.url.replace("ws://", "http://") + "/";
    connected(&browser, &page).await;
    browser.wait_text("#tasks", "mock test").await;
    clean(&browser, "the list and the forms").await;
    let turn = format!(
        "/plan read; write\n/diff a.rs fn a() {{}} => fn a() {{ b(); }}\n/exec cargo test\n\
         /write {} hello\n/say ## Done\\n\\nSee `a.rs`.",
        repo.join("hello.txt").display()
    );
    Box::pin(api.ask(&session, &turn)).await;
    Box::pin(api.prompt(&session, "/permission\nmay I?")).await.expect("prompt");
    Box::pin(session_views(&browser, &page, &session)).await;
    let spec = "name = \"checked flow\"\n[[steps]]\nid = \"only\"\nagent = \"mock\"\nprompt = \"/say done\"\n";
    let started = Box::pin(api.start_workflow(spec, &daemon.workspace("flow"))).await;
    connected(&browser, &format!("{page}#/workflow/{}", started.workflow_id)).await;
    browser.wait_text("#workflow-title", "checked flow").await;
    clean(&browser, "a workflow").await;
}

/// The session's views: a finished turn and a question, errors in both schemes, the
/// Changes tab and its tab semantics, the pause dialog.
async fn session_views(browser: &Browser, page: &str, session: &str) {
    connected(browser, &format!("{page}#/session/{session}")).await;
    browser.wait_text(".permission", "mock tool").await;
    clean(browser, "a session with a finished turn and a question").await;
    // The errors, in the header and the session, readable in both schemes.
    let errors = "const e = new Error('the session is RUNNING'); e.kind = 'invalid_state'; \
        tether.showError(e); tether.sessionError(e); return true;";
    browser.run(errors, json!([])).await;
    clean(browser, "errors shown, light").await;
    browser.color_scheme("dark").await;
    clean(browser, "a session with errors, dark").await;
    browser.color_scheme("light").await;
    browser.click(".permission button").await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    browser.click("[data-tab=changes]").await;
    browser.wait_text("#changes-summary", "1 file changed").await;
    clean(browser, "the Changes tab").await;
    let tabs = "const list = document.querySelector('.tabs'); \
        const tab = document.querySelector('[data-tab=changes]'); \
        return [list.getAttribute('role'), tab.getAttribute('role'), tab.getAttribute('aria-selected'), \
                document.getElementById(tab.getAttribute('aria-controls'))?.getAttribute('role')];";
    assert_eq!(browser.run(tabs, json!([])).await, json!(["tablist", "tab", "true", "tabpanel"]));
    browser.click("#pause").await;
    clean(browser, "the pause dialog").await;
    browser.click("#pause-cancel").await;
}
