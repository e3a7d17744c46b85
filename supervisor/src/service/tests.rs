//! The supervisor in process, over the fake runtime and sidecar (`sidecar/fake.rs`):
//! create, prompt, pause, resume and stop; a restart's recovery (re-attaching to a live
//! sidecar, or finding it dead); and the workflow driver — with real SQLite and real files,
//! and no daemon, no agentctl, no agent process.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use protocol::api::{StepState, WorkflowState, WorkflowStatus};

use super::workflows::NewWorkflow;
use super::{NewSession, ServiceError, Supervisor, SupervisorConfig};
use crate::home::Home;
use crate::runtime::Runtimes;
use crate::session::{Phase, SessionView};
use crate::sidecar::fake::{FakeConnector, FakeRuntime, Mode};
use crate::store::{SessionState, Store};

/// A supervisor over `dir` (its data directory), the fake runtime and a fake sidecar.
struct Setup {
    supervisor: Arc<Supervisor>,
    runtime: Arc<FakeRuntime>,
    connector: Arc<FakeConnector>,
}

fn supervisor(dir: &std::path::Path, mode: Mode, alive: bool) -> Setup {
    supervisor_beside(dir, mode, alive, None)
}

/// [`supervisor`], with a second runtime beside the first (`standalone`) when given.
fn supervisor_beside(
    dir: &std::path::Path,
    mode: Mode,
    alive: bool,
    other: Option<Arc<FakeRuntime>>,
) -> Setup {
    let home = Home::open(dir).expect("the data directory");
    let store = Store::open(&home.database()).expect("the store");
    let runtime = Arc::new(FakeRuntime::default());
    runtime.alive.store(alive, Ordering::SeqCst);
    let connector = Arc::new(FakeConnector::new(mode));
    let mut runtimes =
        Runtimes::new().register(Arc::clone(&runtime) as Arc<dyn crate::runtime::Runtime>);
    if let Some(other) = other {
        runtimes = runtimes.register(other);
    }
    let config = SupervisorConfig {
        home,
        store,
        registry: agents::registry::Registry::builtin_only(),
        environment: agents::registry::Environment::current(&[]),
        runtimes,
        connector: Arc::clone(&connector) as Arc<dyn crate::sidecar::Connector>,
        applets: HashMap::from([("mock-agent".to_owned(), vec!["mock-agent".into()])]),
        event_log: crate::events::LogLimits {
            retain_bytes: crate::events::DEFAULT_RETAIN_BYTES,
            segment_bytes: 1 << 20,
        },
        idle_timeout: None,
        default_sandbox: None,
        api_token: false,
        checkpoints: Arc::default(),
        failover_after: None,
    };
    Setup { supervisor: Arc::new(Supervisor::new(config)), runtime, connector }
}

fn new_session(task_id: String, workspace: &std::path::Path) -> NewSession {
    NewSession {
        task_id,
        agent_profile_id: "mock".into(),
        workspace_path: Some(workspace.display().to_string()),
        prompt: None,
        runtime: None,
        shared: false,
        worktree: None,
        base: None,
        labels: BTreeMap::new(),
        workflow_step: None,
        mcp_servers: Vec::new(),
        session_id: None,
        additional_directories: Vec::new(),
    }
}

/// Waits (bounded) until the session's view is as `what` says.
async fn until(supervisor: &Supervisor, id: &str, what: impl Fn(&SessionView) -> bool) {
    let mut view = supervisor.handle(&id.into()).expect("a live actor").watch();
    tokio::time::timeout(Duration::from_secs(10), view.wait_for(|view| what(view)))
        .await
        .expect("the session got there in time")
        .expect("the actor is alive");
}

fn ready(view: &SessionView) -> bool {
    view.phase == Phase::Open && view.state == SessionState::WaitingForInput
}

/// Creates a session and waits until its agent is open.
async fn open_session(setup: &Setup, workspace: &std::path::Path) -> String {
    let supervisor = &setup.supervisor;
    let task = supervisor.create_task("in process".into(), String::new()).await.unwrap();
    let row = supervisor.create_session(new_session(task.id, workspace)).await.unwrap();
    until(supervisor, row.id.as_str(), ready).await;
    row.id.into_string()
}

/// Prompts and waits for the turn's end; the agent's reply as the history has it.
async fn prompt(supervisor: &Supervisor, id: &str, text: &str) -> String {
    supervisor.prompt(id.to_owned().into(), text.to_owned()).await.expect("the prompt is taken");
    until(supervisor, id, |view| view.turn_id.is_none() && ready(view)).await;
    let history = supervisor.history(id.to_owned().into(), 0, 1000).await.unwrap();
    history.last().expect("an entry").content.clone()
}

#[tokio::test]
async fn a_session_is_created_prompted_paused_resumed_and_stopped_without_a_process() {
    let (dir, workspace) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let setup = supervisor(dir.path(), Mode::Streams(3), false);
    let supervisor = &setup.supervisor;
    let id = open_session(&setup, workspace.path()).await;
    assert_eq!(prompt(supervisor, &id, "hello").await, "<1><2><3>");

    supervisor.pause(id.clone().into(), None, None).await.expect("paused");
    assert_eq!(supervisor.status(id.clone().into()).await.unwrap().state, SessionState::Paused);
    let resumed = supervisor.resume(id.clone().into(), false).await.expect("resumed");
    assert_eq!(resumed.state, SessionState::WaitingForInput);
    until(supervisor, &id, ready).await;
    assert_eq!(prompt(supervisor, &id, "again").await, "<1><2><3>");

    let fenced = setup.runtime.fenced.lock().unwrap().len();
    let fence = setup.runtime.fence_called.notified();
    supervisor.stop(id.clone().into()).await.expect("stopped");
    assert_eq!(supervisor.status(id.clone().into()).await.unwrap().state, SessionState::Completed);
    tokio::time::timeout(Duration::from_secs(10), fence).await.expect("its sidecar is fenced");
    assert!(setup.runtime.fenced.lock().unwrap().len() > fenced);
}

/// Runs `work` on a runtime of its own, then drops that runtime: every actor and task of
/// that supervisor dies where it is, as with a daemon killed.
fn in_a_daemon_that_dies<T>(work: impl std::future::Future<Output = T>) -> T {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let out = runtime.block_on(work);
    runtime.shutdown_background();
    out
}

#[test]
fn a_restart_re_attaches_to_a_live_sidecar_and_its_session_takes_prompts() {
    let (dir, workspace) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let id = in_a_daemon_that_dies(async {
        let setup = supervisor(dir.path(), Mode::Streams(2), false);
        let id = open_session(&setup, workspace.path()).await;
        assert_eq!(prompt(&setup.supervisor, &id, "before").await, "<1><2>");
        // The daemon dies once all its sidecar said is durable: the sidecar, alive, goes on
        // from there (what it held unacknowledged would be replayed; the fake keeps none).
        let sidecar = setup.connector.sidecar().expect("its sidecar");
        tokio::time::timeout(Duration::from_secs(10), sidecar.all_acked()).await.expect("acked");
        id
    });
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let setup = supervisor(dir.path(), Mode::Streams(2), true);
        let summary = setup.supervisor.recover().await.expect("recovery");
        assert_eq!((summary.dead, summary.skipped), (0, 0), "{summary:?}");
        until(&setup.supervisor, &id, |view| view.phase != Phase::Reattaching).await;
        let status = setup.supervisor.status(id.clone().into()).await.unwrap();
        assert_eq!(status.state, SessionState::WaitingForInput);
        assert!(setup.connector.sidecar().is_some(), "re-attached to its sidecar");
        assert!(setup.runtime.fenced.lock().unwrap().is_empty(), "a live sidecar is not fenced");
        assert_eq!(prompt(&setup.supervisor, &id, "after").await, "<1><2>");
    });
}

#[test]
fn a_restart_that_finds_the_sidecar_dead_fences_it_and_the_session_waits_for_input() {
    let (dir, workspace) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let id = in_a_daemon_that_dies(async {
        let setup = supervisor(dir.path(), Mode::Holds, false);
        let id = open_session(&setup, workspace.path()).await;
        // A turn runs when the daemon dies.
        setup.supervisor.prompt(id.clone().into(), "long".into()).await.unwrap();
        until(&setup.supervisor, &id, |view| view.turn_id.is_some()).await;
        id
    });
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let setup = supervisor(dir.path(), Mode::Streams(1), false);
        let summary = setup.supervisor.recover().await.expect("recovery");
        assert_eq!(summary.skipped, 0, "{summary:?}");
        let status = setup.supervisor.status(id.clone().into()).await.unwrap();
        assert_eq!(status.state, SessionState::WaitingForInput, "{status:?}");
        assert!(!setup.runtime.fenced.lock().unwrap().is_empty(), "the dead sidecar is fenced");
        let timeline = setup.supervisor.timeline(id.clone().into(), None).await.unwrap();
        let turn = timeline.turns.last().expect("the turn");
        assert!(turn.ended_at.is_some(), "the open turn ended: {turn:?}");
        // Resumed, it takes prompts again.
        setup.supervisor.resume(id.clone().into(), false).await.expect("resumed");
        until(&setup.supervisor, &id, ready).await;
        assert_eq!(prompt(&setup.supervisor, &id, "again").await, "<1>");
    });
}

#[tokio::test]
async fn a_session_moves_to_another_runtime_and_back_each_runtime_fencing_only_its_own() {
    use protocol::api::{MoveReason, RuntimeKind, TimelineEvent};
    let (dir, workspace) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let other = Arc::new(FakeRuntime { named: Some("docker"), ..Default::default() });
    let setup = supervisor_beside(dir.path(), Mode::Streams(2), false, Some(Arc::clone(&other)));
    let supervisor = &setup.supervisor;
    let id = open_session(&setup, workspace.path()).await;
    assert_eq!(prompt(supervisor, &id, "before").await, "<1><2>");
    let move_to = |runtime: &str, labels: Option<BTreeMap<String, String>>| {
        supervisor.move_to_runtime(id.clone().into(), runtime.into(), labels, None)
    };
    // Refused, the session left as it is: where it runs already, a runtime this daemon
    // lacks, labels on a runtime that does not place by them.
    let same = move_to("standalone", None).await;
    assert!(matches!(same, Err(ServiceError::InvalidState(_))), "{same:?}");
    let unknown = move_to("kubernetes", None).await;
    assert!(matches!(unknown, Err(ServiceError::InvalidParams { field: "runtime", .. })));
    let labels = BTreeMap::from([("gpu".to_owned(), "yes".to_owned())]);
    let labelled = move_to("docker", Some(labels)).await;
    assert!(matches!(labelled, Err(ServiceError::InvalidParams { field: "labels", .. })));
    assert!(other.launched.lock().unwrap().is_empty());

    let moved = move_to("docker", None).await.expect("moved");
    assert_eq!((moved.from.as_str(), moved.to.as_str()), ("standalone", "docker"));
    assert!(moved.resumed && !moved.native, "{moved:?}");
    // The runtime it left fenced its execution; the one it went to launched one and was
    // never handed the other's record to kill or to place by.
    let fenced_there = setup.runtime.fenced.lock().unwrap().clone();
    assert!(fenced_there.iter().any(|target| target.execution.is_some()), "{fenced_there:?}");
    let launched = other.launched.lock().unwrap().clone();
    assert_eq!(launched.len(), 1);
    assert_eq!(launched[0].previous, None, "no place of the other runtime's to go back to");
    assert!(other.fenced.lock().unwrap().iter().all(|target| target.execution.is_none()));
    until(supervisor, &id, ready).await;
    let status = supervisor.status(id.clone().into()).await.unwrap();
    assert_eq!(status.runtime, RuntimeKind::DOCKER);
    assert_eq!(prompt(supervisor, &id, "after").await, "<1><2>");
    let timeline = supervisor.timeline(id.clone().into(), None).await.unwrap();
    let moves: Vec<_> = timeline
        .entries
        .iter()
        .filter_map(|entry| match &entry.event {
            TimelineEvent::Moved { from, to, reason } => Some((from.clone(), to.clone(), *reason)),
            _ => None,
        })
        .collect();
    assert_eq!(
        moves,
        [("standalone".to_owned(), Some("docker".to_owned()), MoveReason::Requested)]
    );

    // Back, at rest: nothing resumes, its resume token (which cannot travel) is dropped,
    // and its next resume launches on the runtime it came back to.
    supervisor.pause(id.clone().into(), None, None).await.expect("paused");
    let token = |supervisor: &Supervisor| {
        let store = supervisor.config.store.clone();
        let id = id.clone();
        async move { store.get_execution(id.into()).await.unwrap().unwrap().resume_token }
    };
    assert!(token(supervisor).await.is_some(), "the agent's session is kept at a pause");
    let back = move_to("standalone", None).await.expect("moved back");
    assert_eq!(
        (back.from.as_str(), back.to.as_str(), back.resumed),
        ("docker", "standalone", false)
    );
    assert_eq!(token(supervisor).await, None);
    let status = supervisor.status(id.clone().into()).await.unwrap();
    assert_eq!((status.runtime, status.state), (RuntimeKind::STANDALONE, SessionState::Paused));
    let launches = setup.runtime.launched.lock().unwrap().len();
    supervisor.resume(id.clone().into(), false).await.expect("resumed");
    until(supervisor, &id, ready).await;
    assert_eq!(setup.runtime.launched.lock().unwrap().len(), launches + 1);
    assert_eq!(other.launched.lock().unwrap().len(), 1);
}

const CHAIN: &str = r#"name = "chain"

[[steps]]
id = "plan"
agent = "mock"
prompt = "plan it"

[[steps]]
id = "build"
agent = "mock"
depends_on = ["plan"]
prompt = "build {{steps.plan.output}}"
"#;

/// Waits (bounded) for the workflow to be done, woken by its changes.
async fn finished(supervisor: &Arc<Supervisor>, id: &str) -> WorkflowStatus {
    let mut changes = supervisor.workflow_changes();
    let wait = async {
        loop {
            let status = supervisor.workflow_status(id.into()).await.unwrap();
            if !matches!(status.state, WorkflowState::Running) {
                return status;
            }
            let _ = changes.recv().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), wait).await.expect("the workflow ended")
}

#[tokio::test]
async fn the_workflow_driver_runs_a_chain_and_hands_each_output_on() {
    let (dir, workspace) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let setup = supervisor(dir.path(), Mode::Streams(2), false);
    let supervisor = &setup.supervisor;
    let started = supervisor
        .workflow_start(NewWorkflow {
            spec: CHAIN.into(),
            spec_file: None,
            vars: BTreeMap::new(),
            task_id: None,
            workspace: Some(workspace.path().display().to_string()),
        })
        .await
        .expect("started");
    let status = finished(supervisor, &started.workflow_id).await;
    assert_eq!(status.state, WorkflowState::Completed, "{status:?}");
    for step in &status.steps {
        assert_eq!(step.state, StepState::Completed, "{step:?}");
        assert_eq!(step.output.as_deref(), Some("<1><2>"), "{step:?}");
        assert_eq!(step.runs, 1, "{step:?}");
    }
    let build = status.steps.iter().find(|step| step.id == "build").unwrap();
    let session = build.session_id.clone().expect("its session");
    let history = supervisor.history(session.into(), 0, 1000).await.unwrap();
    let sent = &history.first().expect("its prompt").content;
    assert_eq!(sent, "build <1><2>", "the plan's output went into the build's prompt");
}
