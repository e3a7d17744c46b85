//! The Changes tab in a real browser: a review of what the session's workspace changed
//! (a real repository), live as the agent writes, updated in place (the focus stays where
//! the reviewer is), Keep and Revert per file, and line comments that survive a reload and
//! go to the agent as one prompt. Its screenshot is the one in `docs/screenshots/`.

use serde_json::json;
use tether_tests::browser::{self, Browser};
use tether_tests::daemon::Daemon;
use tether_tests::git;

async fn connected(browser: &Browser, url: &str) {
    browser.open(url).await;
    browser.wait_text("#connection", "connected").await;
}

/// A repository with two committed files, one the agent's session then changes by hand
/// (as an agent's shell command would) and one it adds.
async fn repository(daemon: &Daemon) -> std::path::PathBuf {
    let repo = daemon.workspace("review");
    git(&repo, &["init", "-q", "-b", "main"]).await;
    std::fs::create_dir_all(repo.join("src")).unwrap();
    std::fs::write(repo.join("src/lib.rs"), "pub fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n")
        .unwrap();
    std::fs::write(repo.join("README.md"), "# calc\n\nAdds numbers.\n").unwrap();
    git(&repo, &["add", "."]).await;
    git(&repo, &["commit", "-q", "-m", "start"]).await;
    repo
}

async fn focused_label(browser: &Browser) -> serde_json::Value {
    browser.run("return document.activeElement.getAttribute('aria-label');", json!([])).await
}

#[tokio::test]
async fn the_changes_tab_reviews_the_work_live_keeps_reverts_and_sends_comments() {
    Box::pin(review_in_page()).await;
}

async fn review_in_page() {
    let Some(browser) = browser::start("review").await else { return };
    let daemon = Box::pin(Daemon::start(&[])).await;
    let api = daemon.api().await;
    let repo = repository(&daemon).await;
    let session = Box::pin(api.ready_session("mock", &repo)).await;
    std::fs::write(
        repo.join("src/lib.rs"),
        "/// Adds two numbers.\npub fn add(a: i64, b: i64) -> i64 {\n    a + b\n}\n",
    )
    .unwrap();
    let write = format!("/write {} pub fn sub() {{}}", repo.join("src/sub.rs").display());
    Box::pin(api.ask(&session, &write)).await;
    let url = format!("{}/#/session/{session}", daemon.url.replace("ws://", "http://"));
    Box::pin(first_look(&browser, &url)).await;
    Box::pin(live_and_kept(&browser, &api, &session, &repo)).await;
    Box::pin(commented(&browser, &url)).await;
    Box::pin(reverted(&browser, &repo)).await;
}

/// Every file the session changed, its diff side by side.
async fn first_look(browser: &Browser, url: &str) {
    connected(browser, url).await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    browser.click("[data-tab=changes]").await;
    browser.wait_text("#changes-summary", "2 files changed").await;
    browser.wait_text("[data-tab=changes]", "Changes (2)").await;
    browser.wait_text(&format!("{LIB} td.code.ins"), "pub fn add(a: i64, b: i64) -> i64 {").await;
    browser.wait_text(&format!("{LIB} td.code.del"), "pub fn add(a: i32, b: i32) -> i32 {").await;
    browser.wait_text(".change[data-path='src/sub.rs'] .badge", "added").await;
}

const LIB: &str = ".change[data-path='src/lib.rs']";

async fn live_and_kept(
    browser: &Browser,
    api: &tether_tests::daemon::Api,
    session: &str,
    repo: &std::path::Path,
) {
    // The reviewer is on a button when the agent changes the workspace: the list grows
    // in place and the focus stays on that button.
    let keep_sub = "button[aria-label='keep src/sub.rs']";
    browser
        .run("document.querySelector(arguments[0]).focus(); return true;", json!([keep_sub]))
        .await;
    let write = format!("/write {} # notes", repo.join("NOTES.md").display());
    Box::pin(api.ask(session, &write)).await;
    browser.wait_text("#changes-summary", "3 files changed").await;
    assert_eq!(focused_label(browser).await, json!("keep src/sub.rs"));

    // Keep folds the file and says so; the count of kept files is in the summary.
    browser.click(keep_sub).await;
    browser.wait_text(".change[data-path='src/sub.rs'] .badge.kept", "kept").await;
    browser.wait_text("#changes-summary", "1 kept").await;
    assert!(browser.texts(".change[data-path='src/sub.rs'] table").await.is_empty(), "folded");
}

async fn commented(browser: &Browser, url: &str) {
    // A comment on a line, kept across a reload, sent as one prompt.
    browser.click("button[aria-label='comment on src/lib.rs line 1']").await;
    browser.type_into(".draft textarea", "say what it returns on overflow").await;
    browser.click(".draft button").await;
    browser.wait_text("#review-count", "1 comment for the agent").await;
    browser.wait_text(&format!("{LIB} tr.comment"), "say what it returns on overflow").await;
    connected(browser, url).await;
    browser.click("[data-tab=changes]").await;
    browser.wait_text("#review-count", "1 comment for the agent").await;
    browser.wait_text(&format!("{LIB} tr.comment"), "say what it returns on overflow").await;
    browser.screenshot("changes").await;
    browser.click("#review-send").await;
    browser.wait_text("#review-sent", "Sent").await;
    browser.click("[data-tab=transcript]").await;
    browser.wait_text("#transcript", "src/lib.rs, line 1:").await;
    browser.wait_text("#transcript", "say what it returns on overflow").await;
}

async fn reverted(browser: &Browser, repo: &std::path::Path) {
    // Revert asks in place, then puts the file back; what it held is on a ref.
    browser.click("[data-tab=changes]").await;
    browser.click("button[aria-label='revert src/lib.rs']").await;
    browser.wait_text(".change .confirm", "Revert src/lib.rs to the base?").await;
    browser.click(".change .confirm button.danger").await;
    browser.wait_text("#changes-summary", "2 files changed").await;
    browser.wait_text("#activity", "reverted src/lib.rs").await;
    let lib_now = std::fs::read_to_string(repo.join("src/lib.rs")).unwrap();
    assert!(lib_now.starts_with("pub fn add(a: i32"), "{lib_now}");
    let saved = git(repo, &["for-each-ref", "--format=%(refname)", "refs/tether/reverted"]).await;
    let saved_lib = git(repo, &["show", &format!("{saved}:src/lib.rs")]).await;
    assert!(saved_lib.starts_with("/// Adds two numbers."), "{saved_lib}");
}

/// Runs `spec` in `workspace` to its end (completed) and opens its view.
async fn open_finished_workflow(
    browser: &Browser,
    daemon: &Daemon,
    spec: String,
    workspace: &std::path::Path,
) {
    let api = daemon.api().await;
    let started = Box::pin(api.start_workflow(spec, workspace)).await;
    let (end, _) = Box::pin(api.workflow_end(&started.workflow_id)).await;
    assert_eq!(end, protocol::api::WorkflowState::Completed);
    let page = daemon.url.replace("ws://", "http://");
    connected(browser, &format!("{page}/#/workflow/{}", started.workflow_id)).await;
    browser.wait_text("#workflow-state", "completed").await;
}

/// A workflow's review: each step's session's changes since its own base, and a way into
/// that session's Changes tab.
#[tokio::test]
async fn a_workflows_changes_are_reviewed_step_by_step() {
    Box::pin(workflow_review()).await;
}

async fn workflow_review() {
    let Some(browser) = browser::start("workflow-review").await else { return };
    let daemon = Box::pin(Daemon::start(&[])).await;
    let repo = daemon.workspace("flow");
    tether_tests::git_repository(&repo).await;
    let spec = format!(
        "name = \"reviewed flow\"\n[[steps]]\nid = \"plan\"\nagent = \"mock\"\nprompt = \"/write {} the plan\"\n\
         [[steps]]\nid = \"build\"\nagent = \"mock\"\ndepends_on = [\"plan\"]\nprompt = \"/write {} built\"\n",
        repo.join("PLAN.md").display(),
        repo.join("src/main.rs").display()
    );
    Box::pin(open_finished_workflow(&browser, &daemon, spec, &repo)).await;
    browser.click("#workflow-changes").await;
    // The build step started after the plan was written: the plan is not its change.
    let build = "[data-review-step=build]";
    browser.wait_text(build, "1 file changed · +1 −0").await;
    browser.wait_text(&format!("{build} .review-files"), "src/main.rs").await;
    assert!(
        !browser.texts(build).await.concat().contains("PLAN.md"),
        "the plan is not the build's"
    );
    browser.wait_text("[data-review-step=plan] .review-files", "PLAN.md").await;
    browser.click("button[aria-label=\"review build's changes\"]").await;
    browser.wait_text("#changes-summary", "1 file changed").await;
    browser.wait_text(".change[data-path='src/main.rs'] td.code.ins", "built").await;
}

/// The workflow view is a run view: a lane per stage (a step one lane after the last step
/// it waits for), each step with its state and how long it took, its session and its
/// changes a click away.
#[tokio::test]
async fn the_workflow_view_shows_its_steps_in_lanes_with_their_times() {
    Box::pin(workflow_lanes()).await;
}

async fn workflow_lanes() {
    let Some(browser) = browser::start("workflow-lanes").await else { return };
    let daemon = Box::pin(Daemon::start(&[])).await;
    let step = |id: &str, after: &str| {
        format!("[[steps]]\nid = \"{id}\"\nagent = \"mock\"\nprompt = \"/say {id} done\"\n{after}")
    };
    let spec = format!(
        "name = \"diamond\"\n{}{}{}{}",
        step("plan", ""),
        step("build", "depends_on = [\"plan\"]\n"),
        step("test", "depends_on = [\"plan\"]\n"),
        step("ship", "depends_on = [\"build\", \"test\"]\n"),
    );
    let workspace = daemon.workspace("diamond");
    Box::pin(open_finished_workflow(&browser, &daemon, spec, &workspace)).await;
    let lanes = "return [...document.querySelectorAll('#steps .lane')].map((lane) => \
        [...lane.querySelectorAll('[data-step-row]')].map((row) => row.dataset.stepRow));";
    let lanes = browser.run(lanes, json!([])).await;
    assert_eq!(lanes, json!([["plan"], ["build", "test"], ["ship"]]));
    let time = browser.wait_text("[data-step-row=ship] .step-time", " ").await;
    assert!(time.ends_with(" ms") || time.ends_with(" s"), "how long it took: {time}");
    browser.screenshot("lanes").await;
    browser.click("[data-step-row=test] .open-session").await;
    browser.wait_text("#transcript .agent", "test done").await;
}
