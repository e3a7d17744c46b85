//! Warm agents: for each profile with `[pool] warm = N`, N agents started through their
//! own sidecar and past `initialize` before any session asks, so a session's launch (a
//! create, or a resume that needs no relaunch) only opens its ACP session.
//!
//! - A warm sidecar lives in `pool/<id>/agentctl` (standalone runtime only: a container's
//!   mounts are fixed when it is made). Its agent runs in the empty `pool/<id>/work`
//!   directory, with the profile's command and environment; its `fs/*` roots are that
//!   directory until a session claims it.
//! - Claiming (`take`) hands the sidecar over whole — its connection, its event stream,
//!   the `initialize` answer and the seq acknowledged — and the session's launch records it
//!   as its execution (its runtime handle names the state dir), writes
//!   `pool/<id>/claimed_by`, and binds its workspace (`workspace.bind`). Per ACP, the
//!   session's working directory is the `cwd` of `session/new` (`session/load`,
//!   `session/resume`); an agent that reads its process's directory instead should not be
//!   pooled.
//! - A warm agent fits a session only when its argv, environment and user are those the
//!   session would launch with (`fingerprint`); a profile change drains its pool and
//!   refills it; a warm agent that died is dropped at claim.
//! - Refills run in the background after every claim and change; a failed start is
//!   retried after a growing delay (nothing to await).
//! - At shutdown every warm sidecar is stopped; after a kill, the next start removes the
//!   pool's unclaimed sidecars and directories (`sweep`) before it refills.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agents::profile::Profile;
use protocol::control::{EventKind, StartAgent};
use serde_json::{Value, json};

use crate::home::{Home, claimed_by};
use crate::runtime::{Endpoint, LaunchSpec, Runtime};
use crate::sidecar::Resolver;
use crate::sidecar::{Connector, Control, EventsRx};

/// The request ids of a warm agent's `initialize` and priming `session/new` (the session's
/// own ids are far above).
const INITIALIZE_ID: i64 = 1;
const PRIME_ID: i64 = 2;

/// A started, initialized agent waiting for a session.
pub struct Warm {
    /// The pool entry's id (`pool/<id>`).
    pub id: String,
    /// Its sidecar's state dir.
    pub state_dir: PathBuf,
    /// The sidecar's bearer token.
    pub token: String,
    /// Where its sidecar listens, and what it announced.
    pub endpoint: Endpoint,
    /// Its calls.
    pub calls: Arc<dyn Control>,
    /// Its events after the `initialize` answer.
    pub events_rx: EventsRx,
    /// The agent's `initialize` result.
    pub init: Value,
    /// The ACP session it was primed with (not the claiming session's).
    pub primed: Option<String>,
    /// The seq acknowledged (the priming session's answer's).
    pub acked: u64,
    /// The agent's pid.
    pub agent_pid: u32,
    /// What it was launched with (see [`fingerprint`]).
    pub fingerprint: String,
    /// Set once it is taken: its replacement starts when this is dropped.
    pub refill: Option<Refill>,
}

/// A taken warm agent's replacement, started when this is dropped: the session that took
/// it holds it until its ACP session is open (or its opening ends), so the replacement's
/// start (a sidecar and an agent spawned, initialized and primed) does not compete for the
/// host's CPUs with the session it replaces.
pub struct Refill(Option<Arc<Pool>>);

impl Drop for Refill {
    fn drop(&mut self) {
        if let Some(pool) = self.0.take() {
            pool.refill();
        }
    }
}

impl std::fmt::Debug for Refill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Refill")
    }
}

/// What makes two launches the same agent: argv, environment and user.
pub fn fingerprint(argv: &[OsString], env: &[(String, String)], user: Option<&str>) -> String {
    let argv: Vec<String> = argv.iter().map(|arg| arg.to_string_lossy().into_owned()).collect();
    json!([argv, env, user]).to_string()
}

/// An agent's argv and environment.
pub type AgentCommand = (Vec<OsString>, Vec<(String, String)>);

/// The agent's argv and environment for `profile` (standalone: programs resolved here,
/// `{home}` the user's home), with `resume_token` for a profile's `resume_command`.
pub fn agent_command(
    profile: &Profile,
    home: &Path,
    resolve: &Resolver,
    resume_token: Option<&str>,
) -> Result<AgentCommand, String> {
    let argv = match resume_token {
        Some(token) => {
            profile.resume_argv(home, token).unwrap_or_else(|| profile.launch_argv(home))
        }
        None => profile.launch_argv(home),
    };
    let mut resolved = resolve(&argv[0])
        .ok_or_else(|| format!("the agent program {} is not available", argv[0]))?;
    resolved.extend(argv[1..].iter().map(OsString::from));
    Ok((resolved, profile.launch_env(home).into_iter().collect()))
}

struct Slot {
    profile: Arc<Profile>,
    fingerprint: String,
    ready: VecDeque<Warm>,
    filling: usize,
    /// Starts that failed in a row (the next waits longer).
    failures: u32,
}

/// The warm agents of every pooled profile.
pub struct Pool {
    home: Home,
    runtime: Arc<dyn Runtime>,
    connector: Arc<dyn Connector>,
    resolve: Resolver,
    agent_home: PathBuf,
    slots: Mutex<HashMap<String, Slot>>,
    closed: tokio_util::sync::CancellationToken,
    tasks: tokio_util::task::TaskTracker,
}

impl Pool {
    /// A pool launching through `runtime` (the standalone one).
    pub fn new(
        home: Home,
        runtime: Arc<dyn Runtime>,
        connector: Arc<dyn Connector>,
        resolve: Resolver,
        agent_home: PathBuf,
    ) -> Pool {
        Pool {
            home,
            runtime,
            connector,
            resolve,
            agent_home,
            slots: Mutex::new(HashMap::new()),
            closed: tokio_util::sync::CancellationToken::new(),
            tasks: tokio_util::task::TaskTracker::new(),
        }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Warm agents ready now, by profile.
    pub fn ready(&self) -> Vec<(String, usize)> {
        let slots = self.slots();
        let mut ready: Vec<(String, usize)> =
            slots.iter().map(|(id, slot)| (id.clone(), slot.ready.len())).collect();
        ready.sort();
        ready
    }

    /// Takes on `profiles` as they are now: a pooled profile whose launch changed is
    /// drained, one no longer pooled is emptied, and every slot is refilled.
    pub fn configure(self: &Arc<Self>, profiles: &[Arc<Profile>]) {
        let mut drained = Vec::new();
        {
            let mut slots = self.slots();
            let mut wanted = HashMap::new();
            for profile in profiles.iter().filter(|profile| profile.pool.warm > 0) {
                if profile.runtime != self.runtime.name() {
                    continue;
                }
                match agent_command(profile, &self.agent_home, &self.resolve, None) {
                    Ok((argv, env)) => {
                        let print = fingerprint(&argv, &env, profile.process.user.as_deref());
                        wanted.insert(profile.id.clone(), (Arc::clone(profile), print));
                    }
                    Err(err) => {
                        tracing::warn!(profile = %profile.id, %err, "cannot pool this profile")
                    }
                }
            }
            slots.retain(|id, slot| {
                let keep = wanted.get(id).is_some_and(|(_, print)| *print == slot.fingerprint);
                if !keep {
                    drained.extend(slot.ready.drain(..));
                }
                keep
            });
            for (id, (profile, print)) in wanted {
                let slot = slots.entry(id).or_insert_with(|| Slot {
                    profile: Arc::clone(&profile),
                    fingerprint: print,
                    ready: VecDeque::new(),
                    filling: 0,
                    failures: 0,
                });
                slot.profile = profile;
                while slot.ready.len() > slot.profile.pool.warm as usize {
                    drained.extend(slot.ready.pop_back());
                }
            }
        }
        for warm in drained {
            self.tasks.spawn(stop(Arc::clone(&self.runtime), warm));
        }
        self.refill();
    }

    /// A warm agent of `profile` launched as `print` says, if one is ready (a dead one is
    /// dropped); a refill follows, once the agent's [`Refill`] is dropped when one was found.
    pub fn take(self: &Arc<Self>, profile_id: &str, print: &str) -> Option<Warm> {
        let mut dead = Vec::new();
        let found = {
            let mut slots = self.slots();
            let slot = slots.get_mut(profile_id).filter(|slot| slot.fingerprint == print)?;
            let mut found = None;
            while let Some(warm) = slot.ready.pop_front() {
                if agentctl::process::is_alive(warm.agent_pid)
                    && !agentctl::process::is_zombie(warm.agent_pid)
                {
                    found = Some(warm);
                    break;
                }
                dead.push(warm);
            }
            found
        };
        for warm in dead {
            tracing::warn!(entry = %warm.id, "a warm agent died while it waited");
            self.tasks.spawn(stop(Arc::clone(&self.runtime), warm));
        }
        let metrics = crate::metrics::get();
        let outcome = if found.is_some() { "claimed" } else { "empty" };
        metrics.pool_takes.get_or_create(&crate::metrics::label("outcome", outcome)).inc();
        match found {
            Some(mut warm) => {
                warm.refill = Some(Refill(Some(Arc::clone(self))));
                Some(warm)
            }
            None => {
                self.refill();
                None
            }
        }
    }

    /// Starts what each slot lacks.
    fn refill(self: &Arc<Self>) {
        if self.closed.is_cancelled() {
            return;
        }
        let mut starts = Vec::new();
        {
            let mut slots = self.slots();
            for slot in slots.values_mut() {
                let want = slot.profile.pool.warm as usize;
                while slot.ready.len() + slot.filling < want {
                    slot.filling += 1;
                    let delay = match slot.failures {
                        0 => Duration::ZERO,
                        n => Duration::from_secs(1u64 << n.min(6)),
                    };
                    starts.push((Arc::clone(&slot.profile), slot.fingerprint.clone(), delay));
                }
            }
        }
        for (profile, print, delay) in starts {
            let pool = Arc::clone(self);
            self.tasks.spawn(async move {
                tokio::select! {
                    () = pool.closed.cancelled() => {}
                    () = tokio::time::sleep(delay) => {}
                }
                let started = if pool.closed.is_cancelled() {
                    Err("the pool is closed".to_owned())
                } else {
                    pool.start(&profile, print.clone()).await
                };
                pool.started(&profile.id, &print, started);
            });
        }
    }

    /// A start finished: the agent joins its slot (if the slot still wants it), or the
    /// failure is counted and the slot refilled later.
    fn started(self: &Arc<Self>, profile_id: &str, print: &str, started: Result<Warm, String>) {
        let mut unwanted = None;
        let mut retry = false;
        {
            let mut slots = self.slots();
            match slots.get_mut(profile_id) {
                Some(slot) => {
                    slot.filling = slot.filling.saturating_sub(1);
                    match started {
                        Ok(warm)
                            if slot.fingerprint == print
                                && !self.closed.is_cancelled()
                                && slot.ready.len() < slot.profile.pool.warm as usize =>
                        {
                            slot.failures = 0;
                            slot.ready.push_back(warm);
                            let (ready, want) = (slot.ready.len(), slot.profile.pool.warm);
                            tracing::info!(
                                "a warm agent of {profile_id} is ready ({ready} of {want})"
                            );
                        }
                        Ok(warm) => unwanted = Some(warm),
                        Err(err) => {
                            if !self.closed.is_cancelled() {
                                tracing::warn!(profile = %profile_id, %err, "cannot start a warm agent");
                                slot.failures += 1;
                                retry = true;
                            }
                        }
                    }
                }
                None => unwanted = started.ok(),
            }
        }
        if let Some(warm) = unwanted {
            self.tasks.spawn(stop(Arc::clone(&self.runtime), warm));
        }
        if retry {
            self.refill();
        }
    }

    /// Starts one warm agent: sidecar, agent, `initialize`, acknowledged.
    async fn start(&self, profile: &Profile, print: String) -> Result<Warm, String> {
        let id = uuid::Uuid::now_v7().to_string();
        let entry = self.home.pool().join(&id);
        let work = entry.join("work");
        crate::home::create_private_dir(&work)
            .map_err(|err| format!("{}: {err}", work.display()))?;
        let state_dir = entry.join("agentctl");
        let token = agentctl::client::new_token();
        let spec = LaunchSpec {
            session_id: format!("pool-{id}").into(),
            task_id: String::new(),
            execution_id: id.as_str().into(),
            generation: 0,
            state_dir: state_dir.clone(),
            token: token.clone(),
            ready_timeout: Duration::from_secs(30),
            workspace: work.clone(),
            git_dir: None,
            docker: profile.docker.clone(),
            agent_state_dirs: profile.session.agent_state_dirs.clone(),
            agent_state_root: entry.join("agent-state"),
            labels: Default::default(),
            previous: None,
            // A profile with [sandbox] is not pooled (its profile says so when parsed).
            sandbox: Default::default(),
            seed: None,
        };
        let endpoint = self.runtime.launch(spec).await.map_err(|err| err.to_string())?;
        let started = async {
            let (calls, mut events_rx) = self
                .connector
                .connect(endpoint.addr.clone(), &token, None, 0)
                .await
                .map_err(|err| err.to_string())?;
            let (argv, env) = agent_command(profile, &self.agent_home, &self.resolve, None)?;
            let (program, args) = argv.split_first().ok_or("the agent's command is empty")?;
            let start = StartAgent {
                command: program.to_string_lossy().into_owned(),
                args: args.iter().map(|arg| arg.to_string_lossy().into_owned()).collect(),
                env: env.into_iter().collect(),
                cwd: work.clone(),
                extra_roots: Vec::new(),
                user: profile.process.user.clone(),
                owned_dirs: Vec::new(),
                egress: None,
                isolate_network: false,
            };
            let agent = calls.start_agent(&start).await.map_err(|err| err.to_string())?;
            let initialize = json!({"jsonrpc": "2.0", "id": INITIALIZE_ID,
                "method": protocol::acp::method::INITIALIZE,
                "params": crate::sidecar::initialize_params(profile)});
            calls.send_acp(&initialize).await.map_err(|err| err.to_string())?;
            let wait = Duration::from_millis(profile.process.init_timeout_ms);
            let mut stderr = String::new();
            let asked = answer(&mut events_rx, INITIALIZE_ID, &mut stderr);
            let (init, _) = tokio::time::timeout(wait, asked)
                .await
                .map_err(|_| unanswered("initialize", wait, &stderr))??;
            let init = match (init.get("result"), init.get("error")) {
                (Some(result), _) => result.clone(),
                (None, error) => return Err(format!("the agent refused initialize: {error:?}")),
            };
            // Primed: agents set much up at their first session (opencode 0.7 s, claude-
            // agent-acp 0.4 s more than later ones), so a throwaway one is opened here, in
            // the entry's own directory; its updates are not the session's (the claiming
            // actor drops them). One refused (an agent that wants `authenticate` first) is
            // no failure.
            let prime = json!({"jsonrpc": "2.0", "id": PRIME_ID,
                "method": protocol::acp::method::SESSION_NEW,
                "params": {"cwd": work, "mcpServers": []}});
            calls.send_acp(&prime).await.map_err(|err| err.to_string())?;
            let asked = answer(&mut events_rx, PRIME_ID, &mut stderr);
            let (primed, seq) = tokio::time::timeout(wait, asked)
                .await
                .map_err(|_| unanswered("session/new", wait, &stderr))??;
            let primed = primed["result"]["sessionId"].as_str().map(str::to_owned);
            calls.ack(seq).await.map_err(|err| err.to_string())?;
            Ok::<_, String>(Warm {
                id: id.clone(),
                state_dir: state_dir.clone(),
                token: token.clone(),
                endpoint: endpoint.clone(),
                calls,
                events_rx,
                init,
                primed,
                acked: seq,
                agent_pid: agent.pid,
                fingerprint: print,
                refill: None,
            })
        };
        match started.await {
            Ok(warm) => Ok(warm),
            Err(err) => {
                fence(self.runtime.as_ref(), &state_dir).await;
                let _ = std::fs::remove_dir_all(&entry);
                Err(err)
            }
        }
    }

    /// Warm sidecars a kill left are removed, then the pool follows the profiles (at once,
    /// then at every change) until the daemon stops.
    pub async fn keep_in_step(
        self: &Arc<Self>,
        store: &crate::store::Store,
        registry: &agents::registry::Registry,
    ) {
        let swept = self.sweep(store).await;
        if swept > 0 {
            tracing::info!(swept, "removed warm agents a previous run left");
        }
        let mut changes = registry.subscribe();
        loop {
            self.configure(&registry.list());
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    /// Stops every warm agent (shutdown); waits for them, at most `bound`.
    pub async fn drain(&self, bound: Duration) {
        self.closed.cancel();
        let ready: Vec<Warm> =
            self.slots().values_mut().flat_map(|slot| slot.ready.drain(..)).collect();
        for warm in ready {
            self.tasks.spawn(stop(Arc::clone(&self.runtime), warm));
        }
        self.tasks.close();
        let _ = tokio::time::timeout(bound, self.tasks.wait()).await;
    }

    /// After a restart, before anything is pooled: kills the sidecars of entries no
    /// session claimed (or whose session is gone) and removes those entries; how many.
    pub async fn sweep(&self, store: &crate::store::Store) -> usize {
        let Ok(entries) = std::fs::read_dir(self.home.pool()) else { return 0 };
        let live = crate::runtime::local_sidecars();
        let mut swept = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            if let Some(session) = claimed_by(&path) {
                match store.get_session(session).await {
                    Ok(_) => continue,
                    Err(crate::store::StoreError::NotFound { .. }) => {}
                    // Kept when it cannot be told.
                    Err(err) => {
                        tracing::warn!(%err, "cannot tell whether a warm agent's session exists");
                        continue;
                    }
                }
            }
            let state_dir = path.join("agentctl");
            if live.iter().any(|(_, dir)| *dir == state_dir) {
                fence(self.runtime.as_ref(), &state_dir).await;
            }
            if let Err(err) = std::fs::remove_dir_all(&path) {
                tracing::warn!(entry = %path.display(), %err, "cannot remove a warm agent's directory");
            }
            swept += 1;
        }
        swept
    }
}

/// Waits for the warm agent's answer to request `id`: the message and its seq.
/// The most of a warm agent's stderr kept to say why it did not start.
const STDERR_KEPT: usize = 2000;

/// Awaits the answer to request `id`, keeping the agent's stderr meanwhile in `stderr` (its
/// last [`STDERR_KEPT`] bytes), which says why when the answer never comes.
async fn answer(
    events_rx: &mut EventsRx,
    id: i64,
    stderr: &mut String,
) -> Result<(Value, u64), String> {
    while let Some(item) = events_rx.recv().await {
        let event = item.map_err(|err| err.to_string())?;
        match event.kind {
            EventKind::Acp { .. } => {
                let message = event.kind.acp_value().unwrap_or_default();
                if message["id"] == json!(id) && message.get("method").is_none() {
                    return Ok((message, event.seq));
                }
            }
            EventKind::Stderr { line } => {
                stderr.push_str(&line);
                stderr.push('\n');
                if stderr.len() > 2 * STDERR_KEPT {
                    *stderr = crate::history::excerpt_tail(stderr, STDERR_KEPT);
                }
            }
            EventKind::AgentExited { status, .. } => {
                return Err(format!(
                    "the warm agent exited ({status:?}); stderr: {}",
                    stderr.trim_end()
                ));
            }
            _ => {}
        }
    }
    Err("the sidecar's event stream ended".into())
}

/// Why a warm agent is given up: `method` not answered within `wait`, and what it printed.
fn unanswered(method: &str, wait: Duration, stderr: &str) -> String {
    // On one line: it is said in the daemon's log.
    let lines: Vec<&str> = stderr.lines().filter(|line| !line.trim().is_empty()).collect();
    let said = match lines.is_empty() {
        true => String::new(),
        false => format!("; its stderr: {}", lines.join(" | ")),
    };
    format!("the agent did not answer {method} within {} ms{said}", wait.as_millis())
}

/// Stops a warm agent that is not wanted: its sidecar shut down, fenced, and its
/// directory removed.
async fn stop(runtime: Arc<dyn Runtime>, warm: Warm) {
    let _ = tokio::time::timeout(Duration::from_secs(2), warm.calls.shutdown()).await;
    drop(warm.calls);
    fence(runtime.as_ref(), &warm.state_dir).await;
    if let Some(entry) = warm.state_dir.parent() {
        let _ = std::fs::remove_dir_all(entry);
    }
}

/// Kills a warm sidecar, the one its state dir announced, and its entry's cgroup (named
/// `pool-<id>` like a session's).
async fn fence(runtime: &dyn Runtime, state_dir: &Path) {
    let entry = state_dir.parent().and_then(Path::file_name).and_then(|name| name.to_str());
    let target = crate::runtime::FenceTarget {
        session_id: format!("pool-{}", entry.unwrap_or_default()).into(),
        state_dir: state_dir.to_owned(),
        execution: None,
        grace: Duration::ZERO,
    };
    if let Err(err) = runtime.fence(&target).await {
        tracing::warn!(dir = %state_dir.display(), %err, "cannot stop a warm sidecar");
    }
}
