//! The built-in web UI in a real browser (headless chromium through
//! chromedriver): the page creates a session and streams its reply, answers a permission
//! request, keeps its transcript whole across a daemon restart, resumes a session whose
//! agent was killed (showing "resuming…" and the outcome), shows errors with their reason,
//! and asks for the token when the daemon has one. Screenshots land in
//! `target/ui-screenshots/`.

use protocol::api::ApiClient;
use serde_json::json;
use tether_tests::browser::{self, Browser};
use tether_tests::daemon::{Api, Daemon, kill_sidecar, ok};
use tether_tests::face::RawFace;

fn page(daemon: &Daemon) -> String {
    daemon.url.replace("ws://", "http://") + "/"
}

/// Opens the page and waits until it is connected.
async fn connected(browser: &Browser, url: &str) {
    browser.open(url).await;
    browser.wait_text("#connection", "connected").await;
}

/// Presses "Show earlier events" until the transcript holds the whole log (the page opens
/// a session at its newest window).
pub(crate) async fn show_all_earlier(browser: &Browser) {
    let script = "const done = arguments[0]; const box = document.querySelector('#transcript'); \
        const step = () => { const button = box.querySelector('button.earlier'); if (!button) return done(true); \
          const observer = new MutationObserver(() => { if (box.querySelector('button.earlier') !== button) { \
            observer.disconnect(); step(); } }); \
          observer.observe(box, {childList: true}); button.click(); }; \
        step();";
    browser.run_async(script, serde_json::json!([])).await;
}

/// Opens a session in the page and sends a prompt through its prompt box.
async fn prompt_in_page(browser: &Browser, text: &str) {
    browser.set_value("#prompt", text).await;
    browser.click("#prompt-form button[type=submit]").await;
}

#[tokio::test]
async fn the_page_creates_a_session_and_streams_its_reply() {
    let Some(browser) = browser::start("create").await else { return };
    let daemon = Daemon::start(&[]).await;
    connected(&browser, &page(&daemon)).await;
    // A task, then a session of the mock agent with a first prompt.
    browser.click("#new-session-open").await;
    browser.type_into("#new-session input[name=title]", "ui task").await;
    browser.set_value("#new-session select[name=agent]", "mock").await;
    let workspace = daemon.workspace("ui");
    browser.type_into("#new-session input[name=workspace]", workspace.to_str().unwrap()).await;
    browser.set_value("#new-session textarea[name=prompt]", "/stream 5\nhello from the page").await;
    browser.click("#new-session button[type=submit]").await;
    let reply = browser.wait_text("#transcript .agent", "[5/5]").await;
    assert!(
        reply.contains("you said: hello from the page [1/5] [2/5] [3/5] [4/5] [5/5]"),
        "{reply}"
    );
    browser.wait_text("#transcript .turn-end", "turn completed: end_turn").await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    // The list shows the session with a live badge.
    browser.wait_text("#tasks .session", "WAITING_FOR_INPUT").await;
    // Unavailable agents are listed with their reason.
    let reasons = browser.texts("#agent-reasons").await.concat();
    assert!(reasons.contains("needs") || reasons.is_empty(), "{reasons}");
    browser.screenshot("streamed").await;
    // And the API agrees.
    let api = daemon.api().await;
    let sessions = ok("list", api.typed().session_list(None, None, None)).await;
    assert_eq!(sessions.len(), 1);
    let history = api.history(&sessions[0].id).await;
    assert_eq!(history.len(), 2, "{history:?}");
}

/// The form makes a worktree session of a repository, and the session's header
/// names its branch.
#[tokio::test]
async fn the_page_creates_a_worktree_session_and_shows_its_branch() {
    let Some(browser) = browser::start("worktree").await else { return };
    let daemon = Daemon::start(&[]).await;
    let repo = daemon.workspace("repo");
    for args in
        [&["init", "-q", "-b", "main"][..], &["commit", "-q", "--allow-empty", "-m", "start"]]
    {
        let status = std::process::Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(["-c", "user.name=tether", "-c", "user.email=t@example.com"])
            .args(args)
            .status()
            .unwrap();
        assert!(status.success());
    }
    connected(&browser, &page(&daemon)).await;
    browser.click("#new-session-open").await;
    browser.type_into("#new-session input[name=title]", "Branch Me").await;
    browser.set_value("#new-session select[name=agent]", "mock").await;
    browser.type_into("#new-session input[name=workspace]", repo.to_str().unwrap()).await;
    browser.click("#new-session input[name=worktree]").await;
    browser.click("#new-session-more summary").await;
    browser.type_into("#new-session input[name=base]", "main").await;
    browser.click("#new-session button[type=submit]").await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    browser.wait_text("#session-title", "Branch Me").await;
    // The line under the title ends with the branch (the sandbox's chip comes after it).
    let title = browser.wait_text("#session-title .session-sub", "tether/branch-me-").await;
    browser.screenshot("worktree").await;
    let api = daemon.api().await;
    let sessions = ok("list", api.typed().session_list(None, None, None)).await;
    let branch = sessions[0].worktree_branch.clone().expect("a worktree session");
    assert!(title.ends_with(&branch), "{title}");
    assert!(sessions[0].workspace_path.contains("/worktrees/"), "{:?}", sessions[0]);
}

/// The form sends placement labels as typed; on a runtime that does not place
/// by labels the daemon refuses them, and the page shows why.
#[tokio::test]
async fn the_page_sends_placement_labels_and_shows_a_refusal() {
    let Some(browser) = browser::start("labels").await else { return };
    let daemon = Daemon::start(&[]).await;
    connected(&browser, &page(&daemon)).await;
    browser.click("#new-session-open").await;
    browser.type_into("#new-session input[name=title]", "Placed").await;
    browser.set_value("#new-session select[name=agent]", "mock").await;
    browser.set_value("#new-session select[name=runtime]", "standalone").await;
    let workspace = daemon.workspace("l");
    browser.type_into("#new-session input[name=workspace]", workspace.to_str().unwrap()).await;
    browser.click("#new-session-more summary").await;
    browser.type_into("#new-session input[name=labels]", "zone=a gpu=yes").await;
    browser.click("#new-session button[type=submit]").await;
    let shown = browser.wait_text("#new-session-error", "does not place sessions by labels").await;
    assert!(shown.starts_with("invalid_params"), "{shown}");
    browser.screenshot("labels").await;
    let api = daemon.api().await;
    let sessions = ok("list", api.typed().session_list(None, None, None)).await;
    assert!(sessions.is_empty(), "nothing was created: {sessions:?}");
}

#[tokio::test]
async fn a_permission_request_is_answered_with_allow() {
    let Some(browser) = browser::start("permission").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("p")).await;
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    prompt_in_page(&browser, "/permission\nlist the files").await;
    browser.wait_text(".permission", "The agent asks to run mock tool: list files").await;
    browser.screenshot("asked").await;
    browser.click(".permission button.allow").await;
    browser.wait_text(".permission", "answered: allow").await;
    browser.wait_text("#transcript .agent", "the tool ran").await;
    browser.wait_text("#transcript .turn-end", "turn completed: end_turn").await;
    browser.wait_text("#transcript .tool", "completed").await;
    browser.screenshot("allowed").await;
}

/// An agent's elicitation is a form in the page, built from its schema; what is
/// typed and ticked there is what the agent gets.
#[tokio::test]
async fn an_elicitation_is_a_form_the_page_fills_and_sends() {
    let Some(browser) = browser::start("elicitation").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("e")).await;
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    prompt_in_page(&browser, "/elicit Who are you?\nhello").await;
    browser.wait_text(".elicitation", "Who are you?").await;
    browser.wait_text(".elicitation label", "Name *").await;
    browser.type_into(".elicitation input[name=name]", "Ada").await;
    browser.click(".elicitation input[name=subscribe]").await;
    browser.screenshot("asked").await;
    browser.click(".elicitation button[type=submit]").await;
    browser.wait_text(".elicitation", "answered").await;
    browser
        .wait_text("#transcript .agent", r#"elicited: accept {"name":"Ada","subscribe":true}"#)
        .await;
    browser.wait_text("#transcript .turn-end", "turn completed: end_turn").await;
    browser.screenshot("answered").await;
}

/// The agent's model and mode are choices under the session's head; a change
/// reaches the agent at once.
#[tokio::test]
async fn the_model_and_mode_are_chosen_in_the_page() {
    let Some(browser) = browser::start("settings").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("s")).await;
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#settings", "Model").await;
    // Each change is a call of the page's; the agent's answer comes back as an update.
    let mut events = api.subscribe_at_end(&session).await;
    let update_of = |kind: &'static str| {
        move |event: &protocol::api::SessionEvent| {
            matches!(&event.kind, protocol::api::EventKind::SessionUpdate { update }
                if update["sessionUpdate"] == kind)
        }
    };
    browser.set_value("#settings select[data-setting=model]", "mock-large").await;
    tether_tests::daemon::until(&mut events, update_of("config_option_update")).await;
    browser.set_value("#settings select[data-setting=mode]", "code").await;
    tether_tests::daemon::until(&mut events, update_of("current_mode_update")).await;
    let settings = ok("config", api.typed().session_config_options(session.clone())).await;
    assert_eq!(settings.modes.as_ref().unwrap()["currentModeId"], "code");
    assert_eq!(settings.chosen["model"], "mock-large");
    browser.screenshot("chosen").await;
    prompt_in_page(&browser, "/settings").await;
    browser.wait_text("#transcript .agent", "model=mock-large mode=code").await;
}

#[tokio::test]
async fn the_transcript_survives_a_daemon_restart_whole_and_once() {
    let Some(browser) = browser::start("restart").await else { return };
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let mut daemon = Daemon::start(&["--listen", &listen]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("r")).await;
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    // A turn that has shown a tool call and then waits: the daemon is killed under it.
    prompt_in_page(&browser, "/tool\n/sleep 3000\n/stream 10\nafter the restart").await;
    browser.wait_text("#transcript .tool", "completed").await;
    drop(api);
    daemon.kill().await;
    browser.wait_text("#connection", "reconnecting").await;
    daemon.restart().await;
    browser.wait_text("#connection", "connected").await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    browser.screenshot("after-restart").await;
    let agent = browser.texts("#transcript .agent").await.concat();
    for n in 1..=10 {
        assert_eq!(agent.matches(&format!("[{n}/10]")).count(), 1, "chunk {n} once: {agent}");
    }
    assert_eq!(browser.texts("#transcript .user").await.len(), 1, "the prompt once");
    assert_eq!(browser.texts("#transcript .tool").await.len(), 1, "the tool call once");
    assert_eq!(browser.texts("#transcript .turn-end").await.len(), 1, "the turn's end once");
}

#[tokio::test]
async fn a_session_whose_agent_was_killed_is_resumed_once_when_opened() {
    let Some(browser) = browser::start("resume").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("k")).await;
    api.ask(&session, "the code word is quince").await;
    kill_sidecar(&daemon, &api, &session).await;
    assert!(api.status(&session).await.needs_resume);
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#activity", "resuming…").await;
    browser.wait_text("#activity", "resumed: native_load").await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    browser.screenshot("resumed").await;
    // The agent remembers, through the page.
    prompt_in_page(&browser, "/recall\nwhat was it?").await;
    browser
        .wait_text("#transcript .agent", "earlier user messages: [the code word is quince]")
        .await;
    // One resume for the visit.
    let resumes = browser.texts("#activity li").await;
    assert_eq!(resumes.iter().filter(|line| line.contains("resuming…")).count(), 1, "{resumes:?}");
    // The history and timeline views.
    browser.click("[data-tab=history]").await;
    browser.wait_text("#history", "[user_message] the code word is quince").await;
    browser.click("[data-tab=timeline]").await;
    browser.wait_text("#timeline", "resumed").await;
    browser.wait_text("#timeline", "outcome=native_load").await;
}

#[tokio::test]
async fn errors_are_shown_with_their_reason() {
    let Some(browser) = browser::start("errors").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api: Api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("e")).await;
    ok("stop", api.typed().session_stop(session.clone())).await;
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#session-state", "COMPLETED").await;
    prompt_in_page(&browser, "anyone there?").await;
    let shown = browser.wait_text("#error", "conflict").await;
    assert!(shown.contains("COMPLETED"), "the reason is shown: {shown}");
    browser.screenshot("error").await;
    // A session that cannot start says why.
    browser.click("#new-session-open").await;
    browser.type_into("#new-session input[name=title]", "bad").await;
    browser.set_value("#new-session select[name=agent]", "mock").await;
    browser.type_into("#new-session input[name=workspace]", "relative/path").await;
    browser.click("#new-session button[type=submit]").await;
    let shown = browser.wait_text("#new-session-error", "invalid_params").await;
    assert!(shown.contains("workspace"), "{shown}");
}

#[tokio::test]
async fn the_page_asks_for_the_token_and_keeps_it_for_the_tab() {
    let Some(browser) = browser::start("token").await else { return };
    let token = "ui-s3cret-0123456789";
    let daemon = Daemon::start_with_env(&[], &[], &[("TETHER_AUTH_TOKEN", token)]).await;
    browser.open(&page(&daemon)).await;
    browser.wait_text("#token-form", "asks for its API token").await;
    browser.type_into("#token", token).await;
    browser.click("#token-form button[type=submit]").await;
    browser.wait_text("#connection", "connected").await;
    browser.wait_text("#new-session select[name=agent]", "mock").await;
    // Kept for the tab (a reload does not ask again), never in the URL.
    browser.open(&page(&daemon)).await;
    browser.wait_text("#connection", "connected").await;
    let url = browser.run("return location.href;", serde_json::json!([])).await;
    assert!(!url.as_str().unwrap().contains(token), "{url}");
    // And the API's own guard still stands: a plain request without it is refused.
    let addr = daemon.url.trim_start_matches("ws://").to_owned();
    let (status, _, _) = browser::http(&addr, "GET", "/metrics", &[], None).await;
    assert_eq!(status, 401);
}

/// The workflow view — the steps in order with live state badges, an Approve
/// button on the step that waits for one, each step opening its session.
#[tokio::test]
async fn the_page_shows_a_workflow_live_approves_a_step_and_opens_its_sessions() {
    let Some(browser) = browser::start("workflow").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let spec = r#"name = "ui flow"
[[steps]]
id = "plan"
agent = "mock"
prompt = "plan\n/say the plan"
[[steps]]
id = "build"
agent = "mock"
depends_on = ["plan"]
approval = true
prompt = "build {{steps.plan.output}}\n/say built it"
"#;
    let workspace = daemon.workspace("flow");
    let started = api.start_workflow(spec, &workspace).await;
    let id = started.workflow_id;
    connected(&browser, &format!("{}#/workflow/{id}", page(&daemon))).await;
    browser.wait_text("#workflows li", "ui flow").await;
    browser.wait_text("#steps [data-step=plan]", "completed").await;
    browser.wait_text("#steps [data-step-row=plan] .output", "the plan").await;
    browser.wait_text("#steps [data-step=build]", "waiting approval").await;
    browser.screenshot("waiting").await;
    browser.click("#steps [data-step-row=build] .approve").await;
    browser.wait_text("#workflow-state", "completed").await;
    browser.wait_text("#steps [data-step-row=build] .output", "built it").await;
    browser.wait_text("#workflows li", "2/2 steps").await;
    browser.screenshot("completed").await;
    // A step opens its session: its transcript is there.
    browser.click("#steps [data-step-row=plan] .open-session").await;
    browser.wait_text("#transcript .agent", "the plan").await;
    let status = ok("workflow.status", api.typed().workflow_status(id)).await;
    let plan = status.steps[0].session_id.clone().unwrap();
    browser.wait_text("#session-title", &plan).await;
}

/// A failed workflow shows why, and its Resume button goes on with it.
#[tokio::test]
async fn the_page_resumes_a_failed_workflow() {
    let Some(browser) = browser::start("workflow-resume").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let spec = "name = \"routed\"\n[[steps]]\nid = \"triage\"\nagent = \"mock\"\nprompt = \"triage\\n/say neither\"\nroutes = { bug = \"fix\" }\n[[steps]]\nid = \"fix\"\nagent = \"mock\"\ndepends_on = [\"triage\"]\nprompt = \"fix\"\n";
    let workspace = daemon.workspace("flow");
    let started = api.start_workflow(spec, &workspace).await;
    let id = started.workflow_id;
    connected(&browser, &format!("{}#/workflow/{id}", page(&daemon))).await;
    browser.wait_text("#workflow-state", "failed").await;
    browser.wait_text("#workflow-error", "its output names none of its routes (bug)").await;
    browser.wait_text("#steps [data-step=triage]", "failed").await;
    let status = ok("workflow.status", api.typed().workflow_status(id.clone())).await;
    let mut events = ok(
        "workflow.subscribe",
        api.typed().workflow_subscribe(id.clone(), Some(status.last_event_seq)),
    )
    .await;
    browser.click("#workflow-resume").await;
    // Resumed: running again (and, the file unchanged, failing again the same way).
    loop {
        let event = tether_tests::within("a workflow event", events.next()).await.unwrap().unwrap();
        if let protocol::api::WorkflowEventKind::WorkflowState { state, .. } = event.kind {
            assert_eq!(state, protocol::api::WorkflowState::Running);
            break;
        }
    }
    let resumed = ok("workflow.status", api.typed().workflow_status(id)).await;
    assert_eq!(resumed.resumes, 1);
    browser.wait_text("#steps [data-step-row=triage]", "neither").await;
}

/// Switching away from a session and back while it streams dropped
/// most of its transcript — the first subscription was never ended, its live events moved
/// the page's last seq on, and the new subscription's replay was then thrown away as
/// already shown.
#[tokio::test]
async fn switching_away_from_a_streaming_session_and_back_keeps_its_whole_transcript() {
    let Some(browser) = browser::start("switch").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let a = api.ready_session("mock", &daemon.workspace("a")).await;
    let b = api.ready_session("mock", &daemon.workspace("b")).await;
    // A history worth replaying.
    for n in 1..=10 {
        api.ask(&a, &format!("/stream 300\nearlier turn {n}")).await;
    }
    connected(&browser, &format!("{}#/session/{a}", page(&daemon))).await;
    browser.wait_text("#transcript .user", "earlier turn 10").await;
    // A turn that waits for a permission, then streams.
    let mut events = api.subscribe_at_end(&a).await;
    api.prompt(&a, "/permission\n/stream 300\nthe live turn").await.unwrap();
    let (_, request, _) = tether_tests::daemon::until_permission_request(&mut events).await;
    browser.wait_text(".permission", "mock tool: list files").await;
    browser.click(&format!("#tasks .session[data-session=\"{b}\"]")).await;
    browser.wait_text("#session-title", &b).await;
    browser.click(&format!("#tasks .session[data-session=\"{a}\"]")).await;
    // Answered at once: the turn streams while the page replays the session.
    ok(
        "permission.respond",
        api.typed().permission_respond(a.clone(), request, Some("allow".into())),
    )
    .await;
    tether_tests::daemon::until(&mut events, tether_tests::daemon::turn_ended).await;
    browser.wait_text("#transcript .agent", "the live turn").await;
    browser.wait_text("#transcript .agent", "[300/300]").await;
    // The page opened at the newest window: the earlier ones read back, each once.
    show_all_earlier(&browser).await;
    let users = browser.texts("#transcript .user").await;
    let wanted: Vec<String> =
        (1..=10).map(|n| format!("earlier turn {n}")).chain(["the live turn".to_owned()]).collect();
    for text in &wanted {
        assert_eq!(
            users.iter().filter(|user| user.ends_with(text.as_str())).count(),
            1,
            "{text:?} once in the transcript: {users:?}"
        );
    }
    let agent = browser.texts("#transcript .agent").await.concat();
    assert_eq!(agent.matches("[300/300]").count(), 11, "every turn's last chunk, once");
}

/// A permission request pending across a daemon restart was shown
/// twice (the daemon asks it again after re-attaching), and the stale box kept live
/// buttons forever.
#[tokio::test]
async fn a_permission_pending_across_a_restart_is_shown_once() {
    let Some(browser) = browser::start("permission-restart").await else { return };
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let mut daemon = Daemon::start(&["--listen", &listen]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("p")).await;
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    prompt_in_page(&browser, "/permission\nacross a restart").await;
    browser.wait_text(".permission", "The agent asks to run mock tool: list files").await;
    drop(api);
    daemon.kill().await;
    browser.wait_text("#connection", "reconnecting").await;
    daemon.restart().await;
    browser.wait_text("#connection", "connected").await;
    // Asked again by the re-attached daemon: the page shows the question once, and that
    // box answers it.
    let api = daemon.api().await;
    let mut events = api.subscribe(&session, 0).await;
    let asked = tether_tests::daemon::until(&mut events, |event| {
        matches!(event.kind, protocol::api::EventKind::PermissionRequest { .. })
    })
    .await;
    let last_seq = asked.last().unwrap().seq;
    let mut events = api.subscribe(&session, last_seq).await;
    let again = tether_tests::daemon::until(&mut events, |event| {
        matches!(event.kind, protocol::api::EventKind::PermissionRequest { .. })
    });
    tether_tests::within("the question asked again after the restart", again).await;
    browser.click(".permission button.allow").await;
    browser.wait_text(".permission", "answered: allow").await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    assert_eq!(browser.texts(".permission").await.len(), 1, "the question once");
    assert!(browser.texts(".permission button").await.is_empty(), "no live button is left");
}

/// A wrong token looped on "reconnecting…" forever with no way to
/// enter another, and the page's icon was answered 403 (an error on every load).
#[tokio::test]
async fn a_wrong_token_is_asked_again_and_the_icon_is_served() {
    let Some(browser) = browser::start("wrong-token").await else { return };
    let token = "ui-s3cret-0123456789";
    let daemon = Daemon::start_with_env(&[], &[], &[("TETHER_AUTH_TOKEN", token)]).await;
    browser.open(&page(&daemon)).await;
    browser.wait_text("#token-form", "asks for its API token").await;
    browser.type_into("#token", "not-the-token-000000").await;
    browser.click("#token-form button[type=submit]").await;
    browser.wait_text("#token-form", "refused this token").await;
    browser.wait_text("#connection", "token refused").await;
    browser.type_into("#token", token).await;
    browser.click("#token-form button[type=submit]").await;
    browser.wait_text("#connection", "connected").await;
    // The icon the page names is served, without a token, as the page itself is.
    let icon = browser
        .run(
            "return document.querySelector('link[rel=icon]').getAttribute('href');",
            serde_json::json!([]),
        )
        .await;
    let addr = daemon.url.trim_start_matches("ws://").to_owned();
    for path in [icon.as_str().unwrap(), "/favicon.ico"] {
        let (status, head, _) = browser::http(&addr, "GET", path, &[], None).await;
        assert_eq!(status, 200, "{path}");
        let kind = head.iter().find(|(name, _)| name == "content-type").map(|(_, v)| v.as_str());
        assert_eq!(kind, Some("image/svg+xml"), "{path}");
    }
}

/// An error shown before a reconnect stayed after it, and
/// activity lines carried the page's time, not the event's.
#[tokio::test]
async fn an_old_error_goes_after_a_reconnect_and_activity_has_the_events_time() {
    let Some(browser) = browser::start("reconnect-error").await else { return };
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let mut daemon = Daemon::start(&["--listen", &listen]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("ok")).await;
    // A turn leaves a snapshot: an activity line from an event, at the event's time.
    api.ask(&session, "hello").await;
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#activity", "snapshot (turn_complete)").await;
    let script = "return document.querySelector('#activity li[data-at]:last-child').dataset.at;";
    let at = browser.run(script, serde_json::json!([])).await;
    let mut events = api.subscribe(&session, 0).await;
    let seen = tether_tests::daemon::until(&mut events, |e| {
        matches!(e.kind, protocol::api::EventKind::SnapshotTaken { .. })
    })
    .await;
    assert_eq!(at.as_str().unwrap(), seen.last().unwrap().at.to_string(), "the event's time");
    // An error (a cancel with no turn running, asked through the page's own call) is
    // shown, and gone after a reconnect since the daemon then says nothing is wrong.
    let cancel =
        "tether.act('task.session.cancel', { session_id: tether.state.open }); return true;";
    browser.run(cancel, serde_json::json!([])).await;
    browser.wait_text("#session-error", "no turn is running").await;
    drop((events, api));
    daemon.kill().await;
    browser.wait_text("#connection", "reconnecting").await;
    daemon.restart().await;
    browser.wait_text("#connection", "connected").await;
    let script = "return document.querySelector('#session-error').hidden;";
    let hidden = browser.run(script, serde_json::json!([])).await;
    assert_eq!(hidden, serde_json::json!(true), "the old error is gone");
}

/// After Stop on a FAILED session the badge still said FAILED
/// (the daemon said COMPLETED), and back and forward did nothing.
#[tokio::test]
async fn stop_on_a_failed_session_shows_completed_and_back_and_forward_move() {
    let Some(browser) = browser::start("failed-stop").await else { return };
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("blocked");
    std::fs::write(&blocker, "").unwrap();
    let profile = tether_tests::daemon::fail_while_profile("flaky", &blocker);
    let daemon = Daemon::start_with_profiles(&[], &[("flaky.toml", &profile)]).await;
    let api = daemon.api().await;
    let healthy = api.ready_session("mock", &daemon.workspace("ok")).await;
    let task = ok("task.create", api.typed().task_create("flaky".into(), None)).await;
    let create = tether_tests::daemon::Create::new(&task.id, "flaky", Some(&daemon.workspace("f")));
    let failed = ok("create", create.send(api.typed())).await.id;
    let mut events = api.subscribe(&failed, 0).await;
    tether_tests::daemon::until(&mut events, |e| {
        tether_tests::daemon::is_state(e, protocol::api::SessionState::Failed)
    })
    .await;
    connected(&browser, &format!("{}#/session/{healthy}", page(&daemon))).await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    browser.click(&format!("#tasks .session[data-session=\"{failed}\"]")).await;
    browser.wait_text("#session-state", "FAILED").await;
    browser.run("window.confirm = () => true; return true;", serde_json::json!([])).await;
    browser.click("#stop").await;
    browser.wait_text("#session-state", "COMPLETED").await;
    browser.wait_text(&format!("#tasks [data-badge=\"{failed}\"]"), "COMPLETED").await;
    assert_eq!(api.status(&failed).await.state, protocol::api::SessionState::Completed);
    // Back: the healthy session again; forward: the stopped one.
    browser.run("history.back(); return true;", serde_json::json!([])).await;
    browser.wait_text("#session-title", &healthy).await;
    browser.run("history.forward(); return true;", serde_json::json!([])).await;
    browser.wait_text("#session-title", &failed).await;
}

/// Opening a PAUSED or FAILED session relaunched its agent, and
/// "Cancel turn" on a PAUSED session ended it for good without asking. Opening has no side
/// effect now, and only the buttons the state allows are shown.
#[tokio::test]
async fn opening_a_paused_session_leaves_it_paused_and_shows_only_what_it_allows() {
    let Some(browser) = browser::start("paused").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("p")).await;
    api.ask(&session, "before the pause").await;
    let paused = api.typed().session_pause(session.clone(), Some("end of day".into()), None);
    ok("pause", paused).await;
    assert_eq!(api.status(&session).await.state, protocol::api::SessionState::Paused);
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#session-state", "PAUSED").await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    // A round trip after the page's own calls on opening: any resume it sent went first.
    browser.click("[data-tab=history]").await;
    browser.wait_text("#history", "before the pause").await;
    assert_eq!(api.status(&session).await.state, protocol::api::SessionState::Paused);
    let hidden = |css: &str| format!("return document.querySelector('{css}').hidden;");
    for (button, shown) in [
        ("#cancel", false),
        ("#pause", false),
        ("#resume", true),
        ("#stop", true),
        ("#delete", true),
    ] {
        let hidden = browser.run(&hidden(button), serde_json::json!([])).await;
        assert_eq!(hidden, serde_json::json!(!shown), "{button}");
    }
    // Resumed by its button.
    browser.click("#resume").await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    let hidden = browser.run(&hidden("#pause"), serde_json::json!([])).await;
    assert_eq!(hidden, serde_json::json!(false), "a running agent can be paused");
}

/// The number on the metrics line that starts with `prefix`, 0 when there is none.
fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0)
}

/// Each listed session held a subscription of its own
/// (1,024 a connection, so past that sessions could not be opened), and sessions created
/// or deleted elsewhere did not show up or go. The list now follows one subscription.
#[tokio::test]
async fn the_list_follows_every_session_through_one_subscription() {
    let Some(browser) = browser::start("list").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let mut sessions = Vec::new();
    for n in 0..25 {
        sessions.push(api.ready_session("mock", &daemon.workspace(&format!("s{n}"))).await);
    }
    ok("stop-all", api.typed().stop_all()).await;
    // The test's own subscriptions (each session awaited ready) are counted before.
    let addr = daemon.url.trim_start_matches("ws://").to_owned();
    let per_session = "tether_api_requests_total{method=\"task.session.subscribe\",error=\"none\"}";
    let list = "tether_api_requests_total{method=\"sessions.subscribe\",error=\"none\"}";
    let (_, _, before) = browser::http(&addr, "GET", "/metrics", &[], None).await;
    connected(&browser, &page(&daemon)).await;
    for session in &sessions {
        browser.wait_text("#tasks .session", &session[session.len() - 8..]).await;
    }
    let (_, _, after) = browser::http(&addr, "GET", "/metrics", &[], None).await;
    let added = metric(&after, per_session) - metric(&before, per_session);
    assert_eq!(added, 0.0, "no subscription per listed session");
    assert_eq!(metric(&after, list), 1.0, "one for the list");
    // Made elsewhere: it shows up, with its state as it changes.
    let made = api.ready_session("mock", &daemon.workspace("elsewhere")).await;
    let badge = format!("#tasks [data-badge=\"{made}\"]");
    browser.wait_text(&badge, "WAITING_FOR_INPUT").await;
    ok("stop", api.typed().session_stop(made.clone())).await;
    browser.wait_text(&badge, "COMPLETED").await;
    // Deleted elsewhere: it goes (the list's events come in order, so once a later one is
    // shown, the deletion was applied).
    ok("delete", api.typed().session_delete(sessions[0].clone(), None, None)).await;
    let later = api.ready_session("mock", &daemon.workspace("later")).await;
    browser.wait_text("#tasks .session", &later[later.len() - 8..]).await;
    let listed = browser.texts("#tasks .session").await.concat();
    assert!(!listed.contains(&sessions[0][sessions[0].len() - 8..]), "{listed}");
}

/// Once a session's event log dropped its oldest
/// events, the page (which replayed from the first) opened the session blank and showed
/// not even new replies. It now starts where the log starts, says so, and follows on.
#[tokio::test]
async fn a_session_whose_event_log_was_trimmed_opens_and_follows() {
    let Some(browser) = browser::start("trimmed").await else { return };
    let limits = ["--event-log-segment-bytes", "16384", "--event-log-retain-bytes", "65536"];
    let daemon = Daemon::start(&limits).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("t")).await;
    // Turns short enough for the test's own subscriber to keep up with the log.
    for n in 1..=8 {
        api.ask(&session, &format!("/stream 300\nturn {n}")).await;
    }
    assert!(api.status(&session).await.kept_after_seq > 0, "the log was trimmed");
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#transcript .notice", "History tab").await;
    browser.wait_text("#transcript .agent", "turn 8 [1/300]").await;
    prompt_in_page(&browser, "a new reply").await;
    browser.wait_text("#transcript .agent", "you said: a new reply").await;
}

/// Enter sends the prompt, Shift+Enter starts a new line.
#[tokio::test]
async fn enter_sends_and_shift_enter_starts_a_new_line() {
    let Some(browser) = browser::start("enter").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("e")).await;
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    // WebDriver keys: U+E008 holds Shift, U+E007 is Enter, U+E000 releases the modifiers.
    browser.type_into("#prompt", "first line\u{E008}\u{E007}\u{E000}second line").await;
    let value =
        browser.run("return document.querySelector('#prompt').value;", serde_json::json!([])).await;
    assert_eq!(value, serde_json::json!("first line\nsecond line"), "Shift+Enter is a new line");
    assert!(browser.texts("#transcript .user").await.is_empty(), "nothing sent yet");
    browser.type_into_more("#prompt", "\u{E007}").await;
    browser.wait_text("#transcript .user", "first line\nsecond line").await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    let value =
        browser.run("return document.querySelector('#prompt').value;", serde_json::json!([])).await;
    assert_eq!(value, serde_json::json!(""), "the box is emptied once sent");
}

/// Counts, from now on, the characters the page hands to the Markdown lexer (marked's,
/// which every rendering goes through) in `window.__lexed`.
async fn count_lexing(browser: &Browser) {
    let script = "const lex = marked.Lexer.prototype.lex; window.__lexed = 0; \
        marked.Lexer.prototype.lex = function (src) { window.__lexed += src.length; return lex.call(this, src); }; \
        return true;";
    browser.run(script, serde_json::json!([])).await;
}

/// After the page's next animation frame (where a streamed message is rendered): the
/// characters lexed so far, and the newest agent message's text, its HTML and the HTML of
/// its whole text rendered at once.
async fn newest_message(browser: &Browser) -> serde_json::Value {
    let script = "const done = arguments[0]; requestAnimationFrame(() => { \
        const lexed = window.__lexed; \
        const block = [...document.querySelectorAll('#transcript .agent')].pop(); \
        const whole = document.createElement('div'); whole.append(tether.markdown(block.raw)); \
        done({lexed, length: block.raw.length, html: block.innerHTML, whole: whole.innerHTML}); });";
    browser.run_async(script, serde_json::json!([])).await
}

/// A long reply streamed in many chunks costs the page about its length in Markdown
/// lexing (the settled blocks are rendered once, each frame lexes only the open tail, an
/// open code fence grows without lexing), and it ends rendered as its whole text would be
/// — also when chunks cut a code fence's marks, a list or a table anywhere.
#[tokio::test]
async fn a_long_streamed_reply_renders_each_chunk_without_reparsing_the_whole_reply() {
    let Some(browser) = browser::start("streaming").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("s")).await;
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    // Cut anywhere: a document streamed a few characters a frame, as a message of its own.
    let document = "## Streaming\n\nA paragraph with **bold**, `code` and a [link](https://example.com).\n\n\
        - one\n- two\n  continued\n\n  second paragraph of two\n- three\n\n\
        ```rust\nfn main() {\n    println!(\"```\");\n}\n```\n\n\
        | a | b |\n|---|---|\n| 1 | 2 |\n\n\
        > quoted\nlazily\n\n~~~~\n~~~\nstill code\n~~~~\n\n\
        Setext heading\n===\n\n1. first\n\n2. second\n\n\
        ````md\n```python\nnested\n```\n````\n\nA closing paragraph, then an open fence:\n\n```sh\necho one\necho two";
    count_lexing(&browser).await;
    let script = "const [text, sizes, done] = arguments; let at = 0; let k = 0; \
        tether.render({ type: 'turn_started', turn_id: 'cut', prompt: 'cut anywhere' }); \
        const step = () => { \
          try { \
            if (at >= text.length) { tether.render({ type: 'turn_ended', turn_id: 'cut', state: 'completed' }); done(true); return; } \
            const n = sizes[k++ % sizes.length]; \
            tether.render({ type: 'agent_message_chunk', text: text.slice(at, at + n) }); at += n; \
            requestAnimationFrame(step); \
          } catch (error) { done(String(error.stack)); } }; \
        step();";
    let streamed = browser
        .run_async(script, serde_json::json!([document, [1, 2, 3, 5, 8, 1, 4, 7, 2, 1, 6]]))
        .await;
    assert_eq!(streamed, serde_json::json!(true), "streamed");
    let shown = newest_message(&browser).await;
    assert_eq!(shown["length"].as_u64().unwrap(), document.len() as u64);
    assert_eq!(shown["html"], shown["whole"], "cut anywhere, rendered as the whole text");
    let lexed = shown["lexed"].as_u64().unwrap();
    assert!(
        lexed <= 25 * document.len() as u64,
        "lexed {lexed} characters for {} streamed a few a frame",
        document.len()
    );
    browser.screenshot("streamed-cut").await;
    count_lexing(&browser).await;
    // The mock agent's reply, then 6,000 chunks that grow its open code block.
    let say = "/say Here is the plan:\\n\\n1. read it\\n2. **write** it\\n\\n```python\\ndef main():\\n    return 1";
    prompt_in_page(&browser, &format!("/stream 6000\n{say}")).await;
    browser.wait_text("#transcript .turn-end", "turn completed: end_turn").await;
    let shown = newest_message(&browser).await;
    let (lexed, length) = (shown["lexed"].as_u64().unwrap(), shown["length"].as_u64().unwrap());
    assert!(length > 60_000, "a long reply: {length} characters");
    // The open fence's code is lexed when the fence is first seen (with however much of it
    // came by then) and once more when the message ends, never once a frame.
    assert!(lexed <= 3 * length, "lexed {lexed} characters for a reply of {length}");
    assert_eq!(shown["html"], shown["whole"], "the streamed rendering is the whole text's");
    let code = browser.texts("#transcript .agent pre > code").await.concat();
    assert!(code.contains("def main():") && code.contains("[6000/6000]"), "{code}");
    browser.screenshot("streamed-code").await;
}

/// A reply longer than the page's window (its newest 500 events) is shown whole: the
/// window is taken back to the start of the message it begins in, so its code block is
/// code (not prose with a literal fence), and "Show earlier" adds what came before, never
/// a second half of the message.
#[tokio::test]
async fn a_reply_that_crosses_the_window_opens_whole_and_stays_one_message() {
    let Some(browser) = browser::start("window-message").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("w")).await;
    api.ask(&session, "/stream 700\n/say The code:\\n\\n```python\\ndef main():\\n    return 1")
        .await;
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    let code = browser.wait_text("#transcript .agent pre > code", "[700/700]").await;
    assert!(code.starts_with("def main():\n    return 1 [1/700] [2/700]"), "{code}");
    // (The prompt, shown above the reply, has its fence as the person typed it.)
    let replies = browser.texts("#transcript .agent").await.concat();
    assert!(!replies.contains("```"), "no literal fence: {replies}");
    browser.screenshot("window-whole").await;
    show_all_earlier(&browser).await;
    browser.wait_text("#transcript .user", "/stream 700").await;
    let messages = browser.texts("#transcript .agent").await;
    assert_eq!(messages.len(), 1, "one message: {messages:?}");
    let code = browser.texts("#transcript .agent pre > code").await;
    assert_eq!(code.len(), 1, "one code block: {code:?}");
    assert!(code[0].starts_with("def main():") && code[0].contains("[700/700]"), "{code:?}");
}

/// Makes the page's notifications land in `window.__notes` (a headless browser shows
/// none), as "title: body".
async fn catch_notifications(browser: &Browser) {
    let script = "window.__notes = []; window.Notification = class { \
        static permission = 'granted'; static requestPermission() { return Promise.resolve('granted'); } \
        constructor(title, options) { window.__notes.push(title + ': ' + options.body); } }; return true;";
    browser.run(script, serde_json::json!([])).await;
}

/// Runs the workflow file `spec` from the CLI (`supervisor workflow run FILE`), which
/// returns once it is started.
async fn run_from_cli(daemon: &Daemon, spec: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flow.toml");
    std::fs::write(&file, spec).unwrap();
    let workspace = daemon.workspace("flow");
    let (file, workspace) = (file.to_str().unwrap(), workspace.to_str().unwrap());
    let (code, out, err) = daemon.cli(&["workflow", "run", file, "--workspace", workspace]).await;
    assert_eq!(code, 0, "{out}{err}");
}

/// The open page's workflow row says "needs you" for `name`, and so do the tab's title
/// and a notification.
async fn flagged_as_needing_you(browser: &Browser, name: &str) {
    let row = browser.wait_text("#workflows li", "needs you").await;
    assert!(row.contains(name), "{row}");
    let title = browser.run("return document.title;", serde_json::json!([])).await;
    assert!(title.as_str().unwrap().contains("needs you"), "{title}");
    let notes = browser.run("return window.__notes;", serde_json::json!([])).await;
    assert!(notes.to_string().contains(name), "{notes}");
}

/// A workflow started elsewhere (the CLI) shows up in the open page without a reload,
/// and a step waiting for approval makes it "need you": in its row, the tab's title and
/// a notification.
#[tokio::test]
async fn a_workflow_started_from_the_cli_is_listed_live_and_its_approval_needs_you() {
    let Some(browser) = browser::start("workflow-live").await else { return };
    let daemon = Daemon::start(&[]).await;
    connected(&browser, &page(&daemon)).await;
    catch_notifications(&browser).await;
    let spec = r#"name = "live flow"
[[steps]]
id = "draft"
agent = "mock"
prompt = "draft\n/say a draft"
[[steps]]
id = "ship"
agent = "mock"
depends_on = ["draft"]
approval = true
prompt = "ship {{steps.draft.output}}"
"#;
    run_from_cli(&daemon, spec).await;
    browser.wait_text("#workflows li", "live flow").await;
    flagged_as_needing_you(&browser, "live flow").await;
    browser.screenshot("workflow-needs-you").await;
    // Approved in the page, it needs nobody any more.
    browser.click("#workflows li").await;
    // The workflow's view renders after the click: its step first, then its button.
    browser.wait_text("#steps [data-step=ship]", "waiting approval").await;
    browser.click("#steps [data-step-row=ship] .approve").await;
    browser.wait_text("#workflow-state", "completed").await;
    browser.wait_text("#workflows li", "2/2 steps").await;
    let row = browser.texts("#workflows li").await.concat();
    assert!(!row.contains("needs you"), "{row}");
}

/// A workflow whose first step waits for approval starts no session, so nothing but the
/// workflow itself tells of it: started from the CLI, it shows up in the open page and
/// needs you, without a reload; approved there, it runs to its end.
#[tokio::test]
async fn a_workflow_waiting_for_approval_at_its_first_step_is_listed_live_and_needs_you() {
    let Some(browser) = browser::start("workflow-first-approval").await else { return };
    let daemon = Daemon::start(&[]).await;
    connected(&browser, &page(&daemon)).await;
    catch_notifications(&browser).await;
    let spec = r#"name = "gated flow"
[[steps]]
id = "deploy"
agent = "mock"
approval = true
prompt = "deploy\n/say deployed"
"#;
    run_from_cli(&daemon, spec).await;
    flagged_as_needing_you(&browser, "gated flow").await;
    browser.screenshot("workflow-first-step-needs-you").await;
    browser.click("#workflows li").await;
    // The workflow's view renders after the click: its step first, then its button.
    browser.wait_text("#steps [data-step=deploy]", "waiting approval").await;
    browser.click("#steps [data-step-row=deploy] .approve").await;
    browser.wait_text("#workflow-state", "completed").await;
    browser.wait_text("#workflows li", "1/1 steps").await;
    let row = browser.texts("#workflows li").await.concat();
    assert!(!row.contains("needs you"), "{row}");
}

#[tokio::test]
async fn the_page_queues_prompts_while_a_turn_runs_and_drags_moves_edits_removes_and_resumes_them()
{
    let Some(browser) = browser::start("queue").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("q")).await;
    // Each step boxed: a debug build gives every browser call's future a stack slot of its
    // own, and a test thread's stack holds a handful per function.
    Box::pin(queue_two_behind_a_long_turn(&browser, &page(&daemon), &session)).await;
    Box::pin(drag_a_third_to_the_top(&browser, &api, &session)).await;
    Box::pin(move_and_edit(&browser)).await;
    Box::pin(remove(&browser)).await;
    let queue = api.status(&session).await.queue;
    let prompts: Vec<_> = queue.prompts.iter().map(|queued| queued.prompt.as_str()).collect();
    assert_eq!(prompts, ["alpha, edited"], "the page's changes are the daemon's");
    Box::pin(halt_by_cancel_and_resume(&browser)).await;
    let status = api.status(&session).await;
    assert!(status.queue.prompts.is_empty() && status.queue.halted.is_none(), "{status:?}");
}

/// Opens `session`, starts a long turn from the prompt box, and types alpha and beta while
/// it runs: both are queued under the prompt box, in order.
async fn queue_two_behind_a_long_turn(browser: &Browser, page: &str, session: &str) {
    connected(browser, &format!("{page}#/session/{session}")).await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    prompt_in_page(browser, "/sleep 60000\nlong").await;
    browser.wait_text("#session-state", "RUNNING").await;
    prompt_in_page(browser, "alpha").await;
    browser.wait_text("#queue-list li:first-child", "alpha").await;
    prompt_in_page(browser, "beta").await;
    browser.wait_text("#queue-list li:nth-child(2)", "beta").await;
}

/// Queues gamma, drags it by its grip above alpha (it runs first: the daemon's queue says
/// so), then removes it.
async fn drag_a_third_to_the_top(browser: &Browser, api: &Api, session: &str) {
    prompt_in_page(browser, "gamma").await;
    browser.wait_text("#queue-list li:nth-child(3)", "gamma").await;
    browser.drag("#queue-list li:nth-child(3) .queue-grip", "#queue-list li:first-child").await;
    browser.wait_text("#queue-list li:first-child", "gamma").await;
    let queue = api.status(session).await.queue;
    let order: Vec<_> = queue.prompts.iter().map(|queued| queued.prompt.as_str()).collect();
    assert_eq!(order, ["gamma", "alpha", "beta"], "{queue:?}");
    browser.click("#queue-list li:first-child .queue-remove").await;
    browser.wait_text("#queue-list li:first-child", "alpha").await;
}

/// Moves beta (second) up, then edits alpha (now second).
async fn move_and_edit(browser: &Browser) {
    browser.click("#queue-list li:nth-child(2) button[aria-label='move up']").await;
    browser.wait_text("#queue-list li:first-child", "beta").await;
    browser.click("#queue-list li:nth-child(2) .queue-edit").await;
    browser.set_value("#queue-list .queue-editor", "alpha, edited").await;
    browser.click("#queue-list .queue-editor + button").await;
    browser.wait_text("#queue-list li:nth-child(2)", "alpha, edited").await;
}

/// Removes beta (first).
async fn remove(browser: &Browser) {
    browser.click("#queue-list li:first-child .queue-remove").await;
    browser.wait_text("#queue-list li:first-child", "alpha, edited").await;
    browser.screenshot("queued").await;
}

/// Cancels the running turn: the queue halts, and the page's button lets it go on.
async fn halt_by_cancel_and_resume(browser: &Browser) {
    browser.click("#cancel").await;
    browser.wait_text("#queue-halted", "Queue halted").await;
    browser.click("#queue-resume").await;
    browser.wait_text("#transcript .user", "alpha, edited").await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
}

/// The Steer button beside Send while the agent works: the mock profile's agent cannot take
/// a message mid-turn, so its turn is cancelled and the message runs next, shown as the
/// person's steering; then Esc in the prompt box cancels a running turn.
#[tokio::test]
async fn the_page_steers_a_running_turn_and_esc_cancels_one() {
    let Some(browser) = browser::start("steer").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("st")).await;
    Box::pin(steer_a_long_turn(&browser, &page(&daemon), &session)).await;
    Box::pin(esc_cancels(&browser)).await;
    let turns = api.status(&session).await;
    assert_eq!(turns.state, protocol::api::SessionState::WaitingForInput, "{turns:?}");
}

/// Starts a long turn, types a correction and presses Steer: the turn is cancelled, and
/// the correction's turn answers it.
async fn steer_a_long_turn(browser: &Browser, page: &str, session: &str) {
    connected(browser, &format!("{page}#/session/{session}")).await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    prompt_in_page(browser, "/sleep 60000\nheading the wrong way").await;
    browser.wait_text("#session-state", "RUNNING").await;
    browser.set_value("#prompt", "go the other way").await;
    browser.click("#steer").await;
    browser.wait_text("#transcript .notice.steer", "your message runs next").await;
    browser
        .wait_text(
            "#transcript .user + .user, #transcript .turn-end + .user",
            "You (steering): go the other way",
        )
        .await;
    browser.wait_text("#transcript", "Their message:]").await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    let ends = browser.texts("#transcript .turn-end").await.concat();
    assert!(ends.contains("cancelled"), "the steered turn was cancelled: {ends}");
    browser.screenshot("steered").await;
}

/// Esc (here in the prompt box) cancels the running turn.
async fn esc_cancels(browser: &Browser) {
    prompt_in_page(browser, "/sleep 60000\nanother long one").await;
    browser.wait_text("#session-state", "RUNNING").await;
    // WebDriver's Escape key.
    browser.type_into_more("#prompt", "\u{E00C}").await;
    browser.wait_text("#session-state", "WAITING_FOR_INPUT").await;
    let ends = browser.texts("#transcript .turn-end").await;
    assert!(ends.last().is_some_and(|end| end.contains("cancelled")), "{ends:?}");
}

/// "Fork from here" at a turn's end makes a fork at that turn and opens it: the page names
/// the original it came from, and the fork's first prompt gets the conversation up to there.
#[tokio::test]
async fn the_page_forks_a_session_at_a_turn_and_opens_the_fork() {
    let Some(browser) = browser::start("fork").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("fk")).await;
    api.ask(&session, "the first question").await;
    api.ask(&session, "the second question").await;
    Box::pin(fork_at_the_first_turn(&browser, &page(&daemon), &session)).await;
    let sessions = ok("list", api.typed().session_list(None, None, None)).await;
    let fork = sessions.iter().find(|row| row.id != session).expect("the fork is listed");
    let status = api.status(&fork.id).await;
    assert_eq!(status.forked_from.map(|link| link.session_id), Some(session.clone()));
    Box::pin(prompt_the_fork(&browser)).await;
}

/// Opens `session` and clicks its first turn's "Fork from here".
async fn fork_at_the_first_turn(browser: &Browser, page: &str, session: &str) {
    connected(browser, &format!("{page}#/session/{session}")).await;
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    browser.click("#transcript .turn-end .fork-here").await;
    browser.wait_text("#forked-from", &format!("Forked from {session}")).await;
    browser
        .wait_text("#activity", "the conversation up to that turn goes with its first prompt")
        .await;
    // What it was given is shown above its own transcript: the first question, not the second.
    browser.wait_text("#forked-conversation", "You: the first question").await;
    let given = browser.texts("#forked-conversation").await.concat();
    assert!(!given.contains("the second question"), "{given}");
    browser.screenshot("forked").await;
}

/// The fork's first prompt, from the page: its reply shows it got the first question only.
async fn prompt_the_fork(browser: &Browser) {
    prompt_in_page(browser, "and now?").await;
    browser.wait_text("#transcript .agent", "the first question").await;
    let said = browser.texts("#transcript .agent").await.concat();
    assert!(!said.contains("the second question"), "{said}");
}

/// "Rewind to here" at a turn's end takes the later turns out (kept, dimmed, marked
/// rewound); "Edit" on an earlier prompt puts its text in the prompt box, and sending the
/// edit rewinds to the turn before it first: the agent's reply shows it got the first
/// question alone.
#[tokio::test]
async fn the_page_rewinds_to_a_turn_and_sends_an_edited_earlier_prompt() {
    let Some(browser) = browser::start("rewind").await else { return };
    let daemon = Daemon::start(&[]).await;
    let api = daemon.api().await;
    let session = api.ready_session("mock", &daemon.workspace("rw")).await;
    for question in ["the first question", "the second question", "the third question"] {
        api.ask(&session, question).await;
    }
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    Box::pin(rewind_the_third_turn(&browser)).await;
    Box::pin(edit_the_second_prompt(&browser)).await;
    let timeline = ok("timeline", api.typed().session_timeline(session.clone(), None)).await;
    let marks: Vec<bool> = timeline.turns.iter().map(|turn| turn.rewound).collect();
    assert_eq!(marks, [false, true, true, false], "{timeline:?}");
}

/// Clicks the second turn's "Rewind to here" and confirms: the third turn is marked.
async fn rewind_the_third_turn(browser: &Browser) {
    browser.wait_text("#transcript .turn-end", "turn completed").await;
    let clicked = browser
        .run(
            "document.querySelectorAll('#transcript .rewind-here')[1].click(); return true;",
            json!([]),
        )
        .await;
    assert_eq!(clicked, json!(true));
    browser.wait_text("#transcript .rewind-offer", "Rewind the conversation to this turn?").await;
    browser.click("#transcript .rewind-offer .rewind-go").await;
    browser.wait_text("#activity", "1 turn(s) left the conversation").await;
    browser.wait_text("#transcript .user.rewound", "the third question").await;
    let rewound = browser.texts("#transcript .user.rewound").await;
    assert_eq!(rewound.len(), 1, "{rewound:?}");
    browser.screenshot("rewound").await;
}

/// Edits the second prompt and sends it: the second turn leaves the conversation too, and
/// the agent starts afresh from the first.
async fn edit_the_second_prompt(browser: &Browser) {
    let clicked = browser
        .run(
            "document.querySelectorAll('#transcript .user .edit-prompt')[1].click(); return true;",
            json!([]),
        )
        .await;
    assert_eq!(clicked, json!(true));
    browser.wait_text("#editing", "Editing an earlier prompt").await;
    let typed = browser.run("return document.querySelector('#prompt').value;", json!([])).await;
    assert_eq!(typed, json!("the second question"));
    prompt_in_page(browser, "a better way to ask").await;
    browser.wait_text("#transcript .agent", "a better way to ask").await;
    browser.wait_text("#transcript .user.rewound", "the second question").await;
    let said = browser.texts("#transcript .agent").await;
    let reply = said.last().expect("the reply");
    assert!(reply.contains("the first question"), "the kept turn was injected: {reply}");
    assert!(
        !reply.contains("the second question") && !reply.contains("the third question"),
        "{reply}"
    );
    browser.screenshot("edited").await;
}

/// Two ACP clients (`supervisor acp`) and the page on one session: the page shows the
/// clients' turns as they run; a question the agent asks is asked of all three, and the
/// page's answer withdraws it from both clients; the page's prompt while a client's turn
/// runs is queued behind it, and both clients see its reply.
#[tokio::test]
async fn two_acp_clients_and_the_page_share_one_session() {
    let Some(browser) = browser::start("three-clients").await else { return };
    let daemon = Daemon::start(&[]).await;
    let mut a = RawFace::spawn(None, &daemon.url, &["--agent", "mock"]);
    a.initialize().await;
    let cwd = daemon.workspace("shared");
    let new = a.request(json!(1), "session/new", json!({"cwd": cwd, "mcpServers": []})).await;
    let session = new["result"]["sessionId"].as_str().expect("a session").to_owned();
    let mut b = RawFace::spawn(None, &daemon.url, &[]);
    b.initialize().await;
    let load = json!({"sessionId": session, "cwd": cwd, "mcpServers": []});
    assert!(b.request(json!(1), "session/load", load).await.get("result").is_some());
    connected(&browser, &format!("{}#/session/{session}", page(&daemon))).await;
    Box::pin(the_page_answers_a_clients_question(&browser, &mut a, &mut b, &session)).await;
    Box::pin(the_page_queues_behind_a_clients_turn(&browser, &mut a, &mut b, &session)).await;
    a.close().await;
    b.close().await;
}

fn face_prompt(session: &str, id: &str, text: &str) -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt", "params": {
        "sessionId": session, "prompt": [{"type": "text", "text": text}]}})
}

/// A's turn asks permission of everyone; the page answers; both clients' questions are
/// withdrawn and A's turn ends.
async fn the_page_answers_a_clients_question(
    browser: &Browser,
    a: &mut RawFace,
    b: &mut RawFace,
    session: &str,
) {
    a.send(face_prompt(session, "a1", "/permission\nasked of all three")).await;
    let asked_a = a.until(|m| m["method"] == "session/request_permission").await;
    let asked_b = b.until(|m| m["method"] == "session/request_permission").await;
    browser.wait_text("#transcript .user", "asked of all three").await;
    browser.wait_text(".permission", "The agent asks").await;
    browser.click(".permission button.allow").await;
    browser.wait_text(".permission", "answered: allow").await;
    let withdrawn = a.until(|m| m["method"] == "$/cancel_request").await;
    assert_eq!(withdrawn["params"]["requestId"], asked_a["id"]);
    let withdrawn = b.until(|m| m["method"] == "$/cancel_request").await;
    assert_eq!(withdrawn["params"]["requestId"], asked_b["id"]);
    // The turn's end and the question's withdrawal are not ordered between themselves.
    let answered = a.seen_or_until(|m| m["id"] == "a1").await;
    assert_eq!(answered["result"]["stopReason"], "end_turn", "{answered}");
}

/// The page's prompt while A's slow turn runs waits in the queue; A's turn ends first, and
/// both clients see the page's turn.
async fn the_page_queues_behind_a_clients_turn(
    browser: &Browser,
    a: &mut RawFace,
    b: &mut RawFace,
    session: &str,
) {
    a.send(face_prompt(session, "a2", "/think working\n/sleep 1500\nslow from a")).await;
    browser.wait_text("#transcript .thought", "Thinking").await;
    browser.wait_text("#session-state", "RUNNING").await;
    prompt_in_page(browser, "from the page").await;
    browser.wait_text("#queue-list", "from the page").await;
    let a_answer = a.until(|m| m["id"] == "a2").await;
    assert_eq!(a_answer["result"]["stopReason"], "end_turn", "{a_answer}");
    browser.wait_text("#transcript .agent", "you said: from the page").await;
    for client in [a, b] {
        client
            .until(|m| {
                let text = m.to_string();
                text.contains("agent_message_chunk") && text.contains("from the page")
            })
            .await;
    }
    browser.screenshot("shared").await;
}
