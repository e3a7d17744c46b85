//! Executions: launching, re-attaching, retiring, stopping and losing an agent's sidecar,
//! and recording what a gone sidecar's spool still held.

use super::{
    AGENT_EVENT_BURST, AfterLaunch, Arc, CatchUp, Connected, Control, Durability, EventKind,
    Execution, ExecutionRow, ExecutionStatus, Instant, Internal, Launch, LaunchFailure, LaunchPlan,
    LaunchStep, Opening, Outgoing, Pending, PendingPause, Phase, ReattachPlan, Replay, Reply,
    ResumeContext, ResumeOutcome, ResumeState, Retired, SessionActor, SessionError,
    SessionEventKind, SessionState, SnapshotTrigger, Stage, SummaryStep, Teardown, Turn, TurnState,
    UnwrittenState, launch, leftovers, mpsc, outbox, task_state,
};

/// The agent's sidecar as the actor holds it: the execution, a launch landing after a stop,
/// a stop's retire, background retires, and a re-attach catching up.
#[derive(Default)]
pub(in crate::session) struct Sidecar {
    pub(in crate::session) execution: Option<Execution>,
    pub(super) after_launch: AfterLaunch,
    /// A stop's or detach's retire in flight, whose leftovers are recorded when it is done.
    pub(super) teardown: Option<Teardown>,
    /// Background retires and fences not finished yet (a launch waits for them).
    pub(super) retiring: Vec<tokio::task::JoinHandle<()>>,
    /// After a re-attach: what waits for agentctl's replay to catch up.
    pub(in crate::session) catch_up: CatchUp,
}

impl Sidecar {
    /// Remembers a background retire or fence: the next launch waits for it, so a fence
    /// that runs late can never hit the execution launched after it.
    pub(in crate::session) fn keep_retiring(&mut self, task: tokio::task::JoinHandle<()>) {
        self.retiring.retain(|task| !task.is_finished());
        self.retiring.push(task);
    }

    /// A launch or re-attach in flight is retired when it lands; `reply` (a detach's) is
    /// answered once that is done.
    pub(in crate::session) fn retire_on_landing(&mut self, reply: Option<Reply<()>>) {
        match &mut self.after_launch {
            AfterLaunch::Retire(waiters) => waiters.extend(reply),
            AfterLaunch::Keep => {
                self.after_launch = AfterLaunch::Retire(reply.into_iter().collect())
            }
        }
    }

    /// A stop or detach came while launching or re-attaching: clears the request and
    /// returns the reply to give once the retire is done (other callers are answered now).
    pub(in crate::session) fn stop_after_launch(&mut self) -> Option<Reply<()>> {
        let AfterLaunch::Retire(mut waiters) =
            std::mem::replace(&mut self.after_launch, AfterLaunch::Keep)
        else {
            return None;
        };
        let reply = waiters.pop();
        for other in waiters {
            let _ = other.send(Ok(()));
        }
        reply
    }

    /// A re-attach's replay will not finish (the execution is gone): prompts that waited for
    /// it are answered (the caller resumes and retries), and nothing is left to settle.
    pub(in crate::session) fn drop_replay(&mut self, reason: &str) {
        self.catch_up.until = None;
        self.catch_up.undelivered.clear();
        for (_, reply) in self.catch_up.deferred.drain(..) {
            let _ = reply.send(Err(SessionError::AgentGone(reason.to_owned())));
        }
    }
}

impl SessionActor {
    pub(in crate::session) async fn stop(&mut self, end: SessionState, reply: Reply<()>) {
        // The end is recorded first: a kill from here on leaves a stopped session whose
        // sidecar recovery kills, never a live session without its stop.
        let recorded = self.set_state(end, None, None).await;
        agentctl::fault::point("stop.recorded");
        if matches!(self.phase(), Phase::Launching | Phase::Reattaching) {
            // Its task reports later; what it brings is retired then.
            self.sidecar.retire_on_landing(None);
        }
        if let Some(execution) = self.sidecar.execution.take() {
            self.retire_open(execution, None, "the session was stopped").await;
        }
        if self.conversation.turn.is_some() && self.sidecar.teardown.is_none() {
            self.end_turn(TurnState::Failed, None, Some("the session was stopped".into())).await;
        }
        self.update_view(|view| view.agent_running = false);
        self.waits.pause = None;
        self.fail_waiters("the session was stopped");
        self.enter(Stage::Ended);
        let _ = reply.send(recorded);
    }

    /// Stops the agent and agentctl; the session stays active and needs a resume. The
    /// caller is answered once the sidecar is gone for certain.
    pub(in crate::session) async fn detach(&mut self, reply: Reply<()>) {
        let in_flight = matches!(self.phase(), Phase::Launching | Phase::Reattaching);
        if in_flight {
            self.sidecar.retire_on_landing(Some(reply));
        } else if let Some(execution) = self.sidecar.execution.take() {
            self.retire_open(execution, Some(reply), "the agent was stopped").await;
        } else {
            let _ = reply.send(Ok(()));
        }
        if self.conversation.turn.is_some() && self.sidecar.teardown.is_none() {
            self.end_turn(TurnState::Failed, None, Some("the agent was stopped".into())).await;
        }
        self.update_view(|view| view.agent_running = false);
        self.fail_waiters("the agent was stopped");
        if !in_flight {
            self.enter(Stage::Idle);
            if self.row.state == SessionState::Starting {
                let _ = self.set_state(SessionState::WaitingForInput, None, None).await;
            }
        }
    }

    /// Stops an execution in the background: politely, then the fence. `reply` (if any)
    /// is answered when it is gone.
    pub(in crate::session) fn retire(&mut self, execution: Execution, reply: Option<Reply<()>>) {
        let context = self.context.clone();
        let grace = std::time::Duration::from_millis(self.profile.process.stop_grace_ms);
        let farewell = self.farewell();
        let Execution { id, record, calls, .. } = execution;
        let store = self.context.store.clone();
        let session_id = self.row.id.clone();
        let retiring = self.context.teardowns.spawn(async move {
            let result = launch::retire(context, calls, record, grace, farewell).await;
            let _ = store.set_execution_status(session_id, id, ExecutionStatus::Stopped).await;
            if let Some(reply) = reply {
                let _ = reply.send(result.map_err(SessionError::InvalidState));
            }
        });
        self.sidecar.keep_retiring(retiring);
    }

    /// The `session/close` an open ACP session of an agent that advertises it gets before
    /// its agent stops (a stop, a pause, a park: it may let go of what it holds). Not
    /// awaited: the agent's input ends right after it, and its answer is of no use.
    fn farewell(&mut self) -> Option<serde_json::Value> {
        let acp_session = self.view_tx.borrow().acp_session_id.clone()?;
        if self.phase() != Phase::Open || !self.choices.settings().close_supported {
            return None;
        }
        let id = self.conversation.take_request_id();
        Some(serde_json::json!({"jsonrpc": "2.0", "id": id,
            "method": protocol::acp::method::SESSION_CLOSE, "params": {"sessionId": acp_session}}))
    }

    /// Fences an execution that is being dropped (lost, refused), in the background.
    pub(in crate::session) fn fence_now(&mut self, record: ExecutionRow) {
        let context = self.context.clone();
        let fencing = self.context.teardowns.spawn(async move {
            if let Err(err) = launch::fence(&context, record, std::time::Duration::ZERO).await {
                tracing::error!(%err, "cannot fence a lost execution");
            }
        });
        self.sidecar.keep_retiring(fencing);
    }

    // ---- launching ----------------------------------------------------------------------

    /// Starts a resume (DESIGN §6.2): A, a token → native restore (or `resume_command`), no
    /// prompt; B, no token and the session was waiting → boot idle; C, otherwise → the
    /// task's description as the initial prompt.
    pub(in crate::session) async fn begin_resume(&mut self) {
        let recorded = self.context.store.get_execution(self.row.id.clone()).await.ok().flatten();
        let mut token = recorded.as_ref().and_then(|recorded| recorded.resume_token.clone());
        if token.is_some() && !self.profile.keeps_resume_token() {
            // The profile has no restore path (any more): the token is useless.
            if let Some(recorded) = &recorded {
                let _ = self
                    .context
                    .store
                    .set_resume_token(self.row.id.clone(), recorded.execution_id.clone(), None)
                    .await;
            }
            token = None;
        }
        // A session paused for exhaustion is handed over to a fresh agent session: a native
        // restore would bring the full context back.
        let handoff = matches!(self.context.store.handoff(self.row.id.clone()).await, Ok(Some(_)));
        if handoff {
            token = None;
        }
        let relaunch = token.is_some() && self.profile.relaunches_to_resume();
        let initial_prompt = match (self.unsent_initial_prompt().await, &token, self.row.state) {
            // The prompt the session was created with never reached an agent (a launch that
            // failed, a create cut short by a kill): it goes out now, whatever else holds.
            (Some(prompt), _, _) => Some(prompt),
            (None, Some(_), _)
            | (None, None, SessionState::WaitingForInput | SessionState::Paused)
            | (None, None, SessionState::Failed) => None,
            (None, None, _) => match self.context.store.get_task(self.row.task_id.clone()).await {
                Ok(task) if !task.description.trim().is_empty() => Some(task.description),
                _ => None,
            },
        };
        let resume = ResumeState {
            token: token.clone(),
            relaunched: relaunch,
            native_failed: false,
            handoff,
            wake: self.row.state == SessionState::Paused
                && matches!(
                    self.context.store.last_pause(self.row.id.clone()).await,
                    Ok(Some(crate::store::LastPause { trigger: SnapshotTrigger::Idle, .. }))
                ),
        };
        if handoff {
            self.meter.forget_context();
        }
        let relaunch_token = if relaunch { token } else { None };
        self.start_launch(relaunch_token.as_deref(), Launch::new(Some(resume), initial_prompt))
            .await;
    }

    /// Decides the argv and starts the launch task (fence, runtime, agentctl, agent).
    pub(in crate::session) async fn start_launch(
        &mut self,
        resume_token: Option<&str>,
        launch: Launch,
    ) {
        // A new agent: an earlier one's stderr explains nothing of its failures.
        self.conversation.quiet_again(true);
        // An execution still held (an reattached one whose agent died, not yet replayed) is
        // let go first; the launch fences it anyway, and its end must not look like a loss.
        if let Some(execution) = self.sidecar.execution.take() {
            self.retire(execution, None);
        }
        self.enter(Stage::Launching(Box::new(launch)));
        // The previous execution (the one to fence) is read beside the state's write.
        let (store, id) = (self.context.store.clone(), self.row.id.clone());
        let (starting, previous) = tokio::join!(
            self.set_state(SessionState::Starting, None, Some(task_state::IN_PROGRESS)),
            store.get_execution(id)
        );
        if let Err(err) = starting {
            return self.fail(format!("launch failed: {err}")).await;
        }
        agentctl::fault::point("launch.started");
        // In a container the agent's home and programs are the container's.
        let in_container = self.context.runtime.agent_home();
        let home = in_container.clone().unwrap_or_else(|| self.context.agent_home.clone());
        let (argv, resolved) = match launch::agent_argv(
            &self.profile,
            &self.context.resolve,
            resume_token,
            &home,
            in_container.is_some(),
        ) {
            Ok(argvs) => argvs,
            Err(message) => return self.fail(message).await,
        };
        let runtime = self.context.runtime.name();
        self.recorder.progress(LaunchStep::Launching, Some(format!("{} ({runtime})", argv[0])));
        if in_container.is_none()
            && let Some(message) = launch::npx_download_notice(&self.profile, &argv, &home)
        {
            self.recorder.emit(SessionEventKind::Notice { message });
        }
        let previous = previous.ok().flatten();
        let execution_id = uuid::Uuid::now_v7().to_string();
        let spec = launch::spec(
            &self.context,
            &self.row,
            &self.profile,
            // The store gives the execution the same generation when it records it.
            (execution_id.into(), previous.as_ref().map_or(1, |previous| previous.generation + 1)),
            agentctl::client::new_token(),
            previous.as_ref().and_then(|previous| previous.runtime_handle.clone()),
        );
        let plan = LaunchPlan {
            spec,
            argv: resolved,
            env: launch::agent_env(&self.profile, &home, in_container.is_some()),
            user: self.profile.process.user.clone(),
            previous,
        };
        // A warm agent launched the same way, if the pool has one (a relaunch with a
        // resume token, and a container, never fit).
        let warm = match (&self.context.pool, &in_container, resume_token) {
            (Some(pool), None, None) => {
                let user = plan.user.as_deref();
                pool.take(&self.profile.id, &crate::pool::fingerprint(&plan.argv, &plan.env, user))
            }
            _ => None,
        };
        self.conversation.resume_context = None;
        self.conversation.replay = Replay::Off;
        let context = self.context.clone();
        let internal_tx = self.internal_tx.clone();
        let retiring = std::mem::take(&mut self.sidecar.retiring);
        let first = matches!(&self.stage, Stage::Launching(launch) if launch.first);
        let start = first
            .then(|| (self.row.id.clone(), std::path::PathBuf::from(&self.row.workspace_path)));
        self.context.teardowns.spawn(async move {
            for task in retiring {
                let _ = task.await;
            }
            let launching = async {
                match warm {
                    Some(warm) => launch::claim(context.clone(), plan, warm).await,
                    None => launch::launch(context.clone(), plan).await,
                }
            };
            // The workspace's commit is read while the agent starts (before it can change
            // anything: no prompt reaches it until it is open) and written once the launch
            // is reported, off the way to ready.
            let (launched, commit) = tokio::join!(launching, async {
                match &start {
                    Some((_, workspace)) => Some((
                        crate::snapshot::git::head(workspace).await,
                        crate::snapshot::git::dirty(workspace).await,
                    )),
                    None => None,
                }
            });
            let launched = Box::new(launched);
            if let Err(mpsc::error::SendError(Internal::Launched(launched))) =
                internal_tx.send(Internal::Launched(launched))
                && let Ok(connected) = *launched
            {
                // The actor is gone: nobody owns this execution.
                if let Err(err) =
                    launch::fence(&context, connected.record, std::time::Duration::ZERO).await
                {
                    tracing::error!(%err, "cannot fence an unowned execution");
                }
            }
            if let (Some((session_id, _)), Some((commit, dirty))) = (start, commit)
                && let Err(err) = context.store.set_start_commit(session_id, commit, dirty).await
            {
                tracing::debug!(%err, "cannot record the start commit");
            }
        });
    }

    pub(in crate::session) fn start_reattach(
        &mut self,
        plan: ReattachPlan,
        primed_session: Option<String>,
    ) {
        self.enter(Stage::Reattaching { primed_session });
        let internal_tx = self.internal_tx.clone();
        let context = self.context.clone();
        self.context.teardowns.spawn(async move {
            let reattached = Box::new(if plan.gone {
                Ok(launch::reattach_gone(&context, plan.execution))
            } else {
                launch::reattach(context.clone(), plan.addr, plan.execution).await
            });
            if let Err(mpsc::error::SendError(Internal::Reattached(reattached))) =
                internal_tx.send(Internal::Reattached(reattached))
                && let Ok(connected) = *reattached
            {
                // The actor is gone: nobody owns this execution.
                if let Err(err) =
                    launch::fence(&context, connected.record, std::time::Duration::ZERO).await
                {
                    tracing::error!(%err, "cannot fence an unowned execution");
                }
            }
        });
        self.expect_open_turns(plan.open_turns);
    }

    /// The turns the store holds open for an execution being re-attached to (or whose dead
    /// spool is read): their answers are awaited under their request ids.
    pub(in crate::session) fn expect_open_turns(
        &mut self,
        open_turns: Vec<crate::store::OpenTurn>,
    ) {
        for open in open_turns {
            let turn_id = open.turn_id;
            if !open.delivered {
                self.sidecar.catch_up.undelivered.insert(open.request_id.clone(), turn_id.clone());
            }
            self.conversation.pending.insert(
                open.request_id,
                Pending::Prompt { turn_id: turn_id.clone(), injected: false },
            );
            self.conversation.turn = Some(Turn {
                id: turn_id,
                cancel_at: None,
                deadline: None,
                usage: crate::store::TurnUsage::default(),
                heard: true,
            });
        }
    }

    pub(in crate::session) async fn launched(
        &mut self,
        launched: Result<Connected, LaunchFailure>,
    ) {
        let connected = match launched {
            Ok(connected) => connected,
            Err(failure) => {
                if matches!(self.sidecar.after_launch, AfterLaunch::Retire(_)) {
                    if let Some(reply) = self.sidecar.stop_after_launch() {
                        let _ = reply.send(Ok(()));
                    }
                    if self.phase() != Phase::Ended {
                        self.enter(Stage::Idle);
                        let _ = self.set_state(SessionState::WaitingForInput, None, None).await;
                    }
                    return;
                }
                return self.fail(format!("launch failed: {}", failure.reason)).await;
            }
        };
        let mut connected = connected;
        let warm = connected.warm.take();
        let mut execution = Execution::new(connected, true, &self.internal_tx);
        execution.primed_session = warm.as_ref().and_then(|warm| warm.primed.clone());
        if matches!(self.sidecar.after_launch, AfterLaunch::Retire(_)) {
            // Stopped or detached while launching.
            let reply = self.sidecar.stop_after_launch();
            self.retire(execution, reply);
            if self.phase() != Phase::Ended {
                self.enter(Stage::Idle);
                let _ = self.set_state(SessionState::WaitingForInput, None, None).await;
            }
            return;
        }
        // A new execution starts a new agentctl sequence: nothing of it was recorded yet
        // (and nothing of it is held); a warm agent's starts after its `initialize`.
        self.recorder.durability = match &warm {
            Some(warm) => Durability::resuming_at(warm.acked, 0, 0),
            None => Default::default(),
        };
        self.sidecar.catch_up.holding = false;
        self.conversation.replay = Replay::Off;
        self.recorder.generation = Some(execution.record.generation);
        self.recorder.history.set_generation(execution.record.generation);
        self.sidecar.execution = Some(execution);
        self.update_view(|view| view.agent_running = true);
        let launch = match std::mem::replace(&mut self.stage, Stage::Idle) {
            Stage::Launching(launch) => *launch,
            // (Only a launch lands here.)
            _ => Launch::new(None, None),
        };
        let (warm, refill) = match warm {
            Some(warm) => (Some(warm.init), warm.refill),
            None => (None, None),
        };
        self.enter(Stage::Opening(Box::new(Opening {
            launch,
            step: None,
            auth_offered: Vec::new(),
            auth_terminal: Vec::new(),
            load_offered: false,
            authenticated: false,
            _refill: refill,
        })));
        match warm {
            // Initialized before the session asked: on to the ACP session.
            Some(init) => {
                let detail = Some("warm: the agent was started ahead".to_owned());
                self.recorder.progress(LaunchStep::Initializing, detail);
                self.initialized(init).await;
            }
            None => {
                self.recorder.progress(LaunchStep::Initializing, None);
                let params = crate::sidecar::initialize_params(&self.profile);
                self.request(protocol::acp::method::INITIALIZE, params, Pending::Initialize);
            }
        }
    }

    pub(in crate::session) async fn reattached(&mut self, reattached: Result<Connected, String>) {
        if matches!(self.sidecar.after_launch, AfterLaunch::Retire(_)) {
            // Stopped or detached while re-attaching: what was found is retired (or fenced).
            let reply = self.sidecar.stop_after_launch();
            match reattached {
                Ok(connected) => {
                    let execution = Execution::new(connected, false, &self.internal_tx);
                    self.retire(execution, reply);
                }
                Err(_) => {
                    if let Ok(Some(record)) =
                        self.context.store.get_execution(self.row.id.clone()).await
                    {
                        self.fence_now(record);
                    }
                    if let Some(reply) = reply {
                        let _ = reply.send(Ok(()));
                    }
                }
            }
            if self.phase() != Phase::Ended {
                self.conversation.pending.clear();
                self.conversation.turn = None;
                self.enter(Stage::Idle);
            }
            return;
        }
        let connected = match reattached {
            Ok(connected) => connected,
            Err(err) => return self.reattach_failed(err).await,
        };
        let status = connected.status.clone();
        let record = connected.record.clone();
        let mut execution = Execution::new(connected, false, &self.internal_tx);
        if let Stage::Reattaching { primed_session } = &mut self.stage {
            execution.primed_session = primed_session.take();
        }
        let running = status
            .as_ref()
            .is_some_and(|s| s.agent_state == protocol::control::AgentState::Running);
        let acked = record.acked_seq.max(0) as u64;
        // Marks count only for the execution they were written for.
        let events_mark = self.recorder.record.events_mark(record.generation);
        let history_mark = self.recorder.history.mark_for(record.generation);
        tracing::debug!(
            session = %self.row.id,
            generation = record.generation,
            acked,
            history_mark,
            events_mark,
            last_seq = ?status.as_ref().map(|status| status.last_seq),
            "re-attached to agentctl"
        );
        self.recorder.durability = Durability::resuming_at(acked, history_mark, events_mark);
        self.recorder.generation = Some(record.generation);
        self.recorder.history.set_generation(record.generation);
        self.conversation.resume_context =
            record.resume_context_pending.then_some(match record.resume_outcome {
                Some(ResumeOutcome::ContextHandoff) => ResumeContext::Handoff,
                Some(ResumeOutcome::NativeLoad | ResumeOutcome::NativeResume) => {
                    ResumeContext::Drift
                }
                _ => ResumeContext::History,
            });
        self.sidecar.execution = Some(Execution { agent_running: running, ..execution });
        let turn_id = self.conversation.turn_id().map(str::to_owned);
        self.update_view(|view| {
            view.agent_running = running;
            view.acp_session_id = record.acp_session_id.clone();
            view.turn_id = turn_id.map(Into::into);
            view.resume_outcome = record.resume_outcome;
        });
        if !self.sidecar.catch_up.holding && running {
            // A hold a stalled predecessor (killed since) asked for ends here.
            self.send(Outgoing::Hold(false));
        }
        match status.as_ref().map(|status| status.last_seq) {
            Some(until) if until > acked => self.sidecar.catch_up.until = Some(until),
            _ => self.settle_undelivered().await,
        }
        self.enter(Stage::Open);
        // A pause asked for before the restart still holds (its turn may still run).
        if let Ok(Some(request)) = self.context.store.get_pause(self.row.id.clone()).await {
            let left = request.force_at.saturating_sub(crate::store::now_ms()).max(0);
            // A summary not yet asked for waits as long as the pause was asked to.
            let asked = request.force_at.saturating_sub(request.requested_at).max(0);
            self.waits.pause = Some(PendingPause {
                reason: request.reason,
                force_at: Some(Instant::now() + std::time::Duration::from_millis(left as u64)),
                forced: false,
                trigger: request.trigger,
                wait: std::time::Duration::from_millis(asked as u64),
                summary: match request.summary_asked_at {
                    Some(at) => SummaryStep::Asked(at),
                    None => SummaryStep::NotAsked,
                },
            });
            self.update_view(|view| view.pause_requested = true);
        }
        // Killed after the ACP session opened and before the store said so: the state is
        // completed now (published again if it was already; the same state twice is
        // harmless, never is not).
        if self.row.state == SessionState::Starting
            && let Err(err) =
                self.set_state(SessionState::WaitingForInput, None, Some(task_state::REVIEW)).await
        {
            tracing::error!(session = %self.row.id, %err, "cannot record the session state");
        }
        self.waits.opened(|| Ok(ResumeOutcome::AlreadyRunning));
        // People may still answer what the agent asked before the restart.
        if let Ok(pending) = self.context.store.list_pending(self.row.id.clone()).await {
            for (request_id, method, params) in pending {
                self.recorder.emit(crate::session::question_event(&method, request_id, params));
            }
        }
        self.send_unsent_initial_prompt().await;
    }

    /// The resume context around `prompt`, from the history on disk.
    pub(in crate::session) async fn resume_context(
        &self,
        prompt: &str,
    ) -> Result<String, SessionError> {
        let latest = self.context.store.latest_snapshot(self.row.id.clone()).await?;
        let workspace = std::path::Path::new(&self.row.workspace_path);
        let drift = match &latest {
            Some(snapshot) => {
                crate::snapshot::git::drift(workspace, &snapshot.git, &snapshot.snapshot_id).await
            }
            None => None,
        };
        if self.conversation.resume_context == Some(ResumeContext::Drift) {
            return Ok(match drift {
                Some(drift) => format!(
                    "{}\n\n=== CURRENT REQUEST ===\n{prompt}",
                    crate::snapshot::drift_section(Some(&drift)).trim_start()
                ),
                None => prompt.to_owned(),
            });
        }
        // A handoff without a snapshot to compile from: the history it would summarise.
        if self.conversation.resume_context == Some(ResumeContext::Handoff)
            && let Some(snapshot) = latest
        {
            let budget = self.profile.session.resume_context_budget;
            return Ok(crate::snapshot::handoff_context(&snapshot, prompt, budget, drift.as_ref()));
        }
        let path = self.recorder.history.path().to_owned();
        let prompt = prompt.to_owned();
        let budget = self.profile.session.resume_context_budget;
        let after = match self.conversation.resume_context {
            Some(ResumeContext::Missing { after }) => Some(after),
            _ => None,
        };
        let built = tokio::task::spawn_blocking(move || {
            let plan = crate::history::last_plan(&path).map(|(_, plan)| plan).unwrap_or_default();
            let (head, tail) =
                crate::snapshot::injected_sections(latest.as_ref(), &plan, drift.as_ref(), budget);
            let mut file = std::fs::File::open(&path)?;
            crate::resume_context::build_after(&mut file, &prompt, budget, after, (&head, &tail))
        })
        .await
        .map_err(|err| SessionError::InvalidState(format!("building the resume context: {err}")))?
        .map_err(|err| SessionError::InvalidState(format!("reading the history: {err}")))?;
        Ok(built.text)
    }

    /// The execution is gone (its agent exited, its sidecar was lost or refused us): the
    /// agent's questions are void, a running turn fails, and the session waits for input
    /// with the reason, recoverable.
    pub(in crate::session) async fn execution_gone(&mut self, reason: &str, turn_ends: TurnState) {
        self.sidecar.drop_replay(reason);
        self.update_view(|view| view.agent_running = false);
        self.void_pending().await;
        if self.conversation.turn.is_some() {
            self.end_turn(turn_ends, None, Some(reason.to_owned())).await;
        }
        if self.row.state.is_terminal() {
            // The end of a stopped session's teardown: it stays as it was ended.
            return;
        }
        self.set_state_or_stall(
            SessionState::WaitingForInput,
            Some(reason.to_owned()),
            Some(task_state::REVIEW),
        )
        .await;
        let _ = self.context.store.log_error(self.row.id.clone(), reason.to_owned()).await;
        self.snapshot_in_background(SnapshotTrigger::Crash, Some(reason.to_owned()));
    }

    /// agentctl itself went away, stopped answering, or refused our subscription. It is
    /// fenced (nothing may run unowned), then what its spool holds beyond what was handled
    /// is recorded, then the execution's open work is void.
    pub(in crate::session) async fn lost(&mut self, reason: String) {
        let mut reason = reason;
        let Some(execution) = self.sidecar.execution.take() else { return };
        if !execution.gone {
            // (A dead sidecar's replay ends this way too: that loss was said at recovery.)
            tracing::warn!(session = %self.row.id, %reason, "agentctl is lost");
        }
        if let Some(why) = self.context.runtime.exit_reason(&execution.record).await {
            reason = format!("{reason}: {why}");
        }
        let _ = self
            .context
            .store
            .set_execution_status(self.row.id.clone(), execution.id.clone(), ExecutionStatus::Lost)
            .await;
        if matches!(self.phase(), Phase::Opening | Phase::Launching) {
            self.fence_now(execution.record.clone());
            drop(execution);
            return self.fail(reason).await;
        }
        if self.recorder.stall.is_some() && !execution.gone && !self.row.state.is_terminal() {
            // Nothing handled since the stall is durable: the sidecar is fenced now, the
            // rest (its spool from what was acknowledged, its open work, the state) is
            // written at the stall's next try.
            if let Err(err) =
                launch::fence(&self.context, execution.record, std::time::Duration::ZERO).await
            {
                tracing::error!(session = %self.row.id, %err, "cannot fence a lost execution");
            }
            return self.defer_loss(reason);
        }
        // Its turn was cut by the supervisor's own downtime (its spool replayed at
        // recovery), or by the sidecar's loss now.
        let mut turn_ends = TurnState::Failed;
        if execution.gone {
            // A stop cut short by a kill, finished at recovery, or a loss while down.
            reason = if self.row.state.is_terminal() {
                "the session was stopped".into()
            } else {
                crate::session::STOPPED_WHILE_DOWN.into()
            };
            turn_ends = TurnState::Interrupted;
        } else {
            // Its spool is read once nothing writes it any more.
            let Execution { id, record, .. } = execution;
            match launch::fence(&self.context, record.clone(), std::time::Duration::ZERO).await {
                Ok(()) => {
                    let dir = leftovers::spool_dir(&self.context.state_dir_of(&record));
                    let events = leftovers::read(dir, self.recorder.durability.handled);
                    if let Some(exit) = self.record_leftovers(id, record, events).await {
                        reason = exit;
                    }
                }
                Err(err) => {
                    tracing::error!(session = %self.row.id, %err, "cannot fence a lost execution")
                }
            }
            if self.recorder.stall.is_some() && !self.row.state.is_terminal() {
                // Its spool could not all be recorded: the rest first, at the next try.
                return self.defer_loss(reason);
            }
        }
        self.enter(Stage::Idle);
        self.execution_gone(&reason, turn_ends).await;
        if self.row.state.is_terminal() {
            // A stopped session's teardown, finished: nothing more to own.
            return self.enter(Stage::Ended);
        }
        // Anyone who asked for a resume meanwhile gets one now.
        if self.waits.anyone_waits_for_open() {
            self.begin_resume().await;
        }
    }

    /// A re-attach failed: the sidecar died, hangs, or refused us. It is fenced, then what
    /// its spool holds beyond what was acknowledged is recorded (as for a sidecar lost while
    /// attached), then its open work is void and the session waits, resumable.
    async fn reattach_failed(&mut self, err: String) {
        tracing::warn!(session = %self.row.id, %err, "cannot re-attach to agentctl");
        let mut reason = format!("could not re-attach to the agent: {err}");
        let record = self.context.store.get_execution(self.row.id.clone()).await.ok().flatten();
        if let Some(record) = record {
            match launch::fence(&self.context, record.clone(), std::time::Duration::ZERO).await {
                Ok(()) => {
                    if let Some(exit) = self.record_spool_of_gone(record.clone()).await {
                        reason = format!("{reason}; {exit}");
                    }
                }
                Err(err) => {
                    tracing::error!(session = %self.row.id, %err, "cannot fence an execution it could not re-attach to")
                }
            }
            let _ = self
                .context
                .store
                .set_execution_status(
                    self.row.id.clone(),
                    record.execution_id,
                    ExecutionStatus::Dead,
                )
                .await;
        }
        self.conversation.pending.clear();
        self.conversation.turn = None;
        self.update_view(|view| view.turn_id = None);
        if self.recorder.stall.is_some() && !self.row.state.is_terminal() {
            return self.defer_loss(reason);
        }
        // Its turns interrupted and its questions void, as recovery ends a dead execution's
        // work (after what this actor published so far).
        self.recorder.flush_events();
        self.conversation.answering.clear();
        if let Err(err) =
            self.recorder.record.void_open_work(&reason, Vec::new(), self.recorder.mark()).await
        {
            self.recorder.write_failed("interrupted turns", &err);
        }
        self.enter(Stage::Idle);
        self.execution_gone(&reason, TurnState::Failed).await;
        // Anyone who asked for a resume meanwhile gets one now.
        if self.waits.anyone_waits_for_open() {
            self.begin_resume().await;
        }
    }

    /// Ends a loss (its sidecar fenced) while writes fail: nothing more can be written now,
    /// so the rest of its spool, its open work's end and the state it leaves follow, in
    /// that order, at the stall's next try (`finish_loss`). Until then the session is idle,
    /// its agent gone, the stall's reason shown.
    fn defer_loss(&mut self, reason: String) {
        self.sidecar.drop_replay(&reason);
        self.conversation.pending.clear();
        self.conversation.turn = None;
        self.conversation.answering.clear();
        self.enter(Stage::Idle);
        self.update_view(|view| {
            view.turn_id = None;
            view.agent_running = false;
        });
        if let Some(stall) = self.recorder.stall.as_mut() {
            stall.unwritten_state = Some(UnwrittenState {
                state: SessionState::WaitingForInput,
                error: Some(reason.clone()),
                task: Some(task_state::REVIEW),
            });
            stall.deferred_loss = Some(reason);
        }
    }

    /// Records what the spool of an execution whose sidecar is gone (fenced) holds beyond
    /// what was acknowledged, from where the history and the event log left off (their
    /// marks: nothing is recorded twice). Returns why the agent exited, when the spool says.
    pub(in crate::session) async fn record_spool_of_gone(
        &mut self,
        record: ExecutionRow,
    ) -> Option<String> {
        let state_dir = self.context.state_dir_of(&record);
        if !leftovers::spool_is_of(&state_dir, &record) {
            return None;
        }
        let acked = record.acked_seq.max(0) as u64;
        let history_mark = self.recorder.history.mark_for(record.generation);
        let events_mark = self.recorder.record.events_mark(record.generation);
        self.recorder.durability = Durability::resuming_at(acked, history_mark, events_mark);
        self.recorder.generation = Some(record.generation);
        self.recorder.history.set_generation(record.generation);
        let events = leftovers::read(leftovers::spool_dir(&state_dir), acked);
        let exit = self.record_leftovers(record.execution_id.clone(), record, events).await;
        // No answer ends its turn: the message being coalesced is the last of it. (Not
        // acknowledged: the marks keep a later read of this spool from recording it again.)
        if self.recorder.stall.is_none()
            && let Err(err) = self.recorder.history.flush_agent()
        {
            self.recorder.write_failed("the history", &err);
        }
        exit
    }

    /// Records what the spool of an execution whose sidecar is gone (fenced or retired)
    /// holds beyond the last event handled, through the same handling as live events, and
    /// acknowledges it. Returns why the agent exited, when the spool says so (its exit is
    /// the caller's to handle: a stop ends the turn its own way).
    pub(in crate::session) async fn record_leftovers(
        &mut self,
        id: crate::ids::ExecutionId,
        record: ExecutionRow,
        events_rx: crate::sidecar::EventsRx,
    ) -> Option<String> {
        let calls: Arc<dyn Control> = Arc::new(leftovers::DeadSidecar);
        let outbox = outbox::start_outbox(id.clone(), Arc::clone(&calls), self.internal_tx.clone());
        self.sidecar.execution = Some(Execution {
            id,
            record,
            calls,
            outbox,
            events_rx,
            agent_running: false,
            gone: true,
            primed_session: None,
        });
        let mut exit = None;
        let mut in_burst = 0;
        while let Some(execution) = self.sidecar.execution.as_mut() {
            if self.recorder.stall.is_some() {
                // Not acknowledged: read again at the next try (the spool stays).
                break;
            }
            let Some(Ok(event)) = execution.events_rx.recv().await else { break };
            // The agent's end is the caller's to handle (a stop ends the turn its own way).
            match event.kind {
                EventKind::AgentExited { status, stderr_tail } => {
                    self.recorder.durability.handled = event.seq;
                    exit = Some(crate::session::acp::explain::exit_reason(
                        status,
                        &stderr_tail,
                        &self.profile,
                        self.context.runtime.agent_home().is_some(),
                    ));
                }
                EventKind::StdoutClosed => self.recorder.durability.handled = event.seq,
                _ => self.handle_agent_event(*event).await,
            }
            in_burst += 1;
            if in_burst == AGENT_EVENT_BURST {
                in_burst = 0;
                self.recorder.flush_events();
            }
        }
        self.ack(true).await;
        self.recorder.flush_events();
        self.sidecar.execution = None;
        exit
    }

    /// Retires an execution on a stop or detach: an open one is stopped in the background
    /// and what its spool still held is recorded when that is done (see
    /// [`Internal::Retired`]), then its turn ends with `turn_error`; one still shaking
    /// hands has nothing to record. `reply` is answered once it is gone.
    pub(in crate::session) async fn retire_open(
        &mut self,
        execution: Execution,
        reply: Option<Reply<()>>,
        turn_error: &'static str,
    ) {
        if execution.gone {
            // A dead sidecar's spool being replayed: the rest of it is recorded first.
            let Execution { id, record, events_rx, .. } = execution;
            self.record_leftovers(id, record, events_rx).await;
            if let Some(reply) = reply {
                let _ = reply.send(Ok(()));
            }
            return;
        }
        if self.phase() != Phase::Open {
            return self.retire(execution, reply);
        }
        let after = self.recorder.durability.handled;
        let dir = leftovers::spool_dir(&self.context.state_dir_of(&execution.record));
        let (id, record) = (execution.id.clone(), execution.record.clone());
        let (gone_tx, gone) = tokio::sync::oneshot::channel();
        self.retire(execution, Some(gone_tx));
        self.sidecar.teardown = Some(Teardown { reply, turn_error });
        let report = self.internal_tx.clone();
        self.context.teardowns.spawn(async move {
            let result = gone.await.unwrap_or(Ok(()));
            // Read before anything else may start a sidecar (and its fresh spool) there:
            // a launch waits for the retire, and the actor for this report.
            let leftovers = tokio::task::spawn_blocking(move || leftovers::read_all(&dir, after))
                .await
                .unwrap_or_default();
            let retired = Retired { id, record, result, leftovers };
            let _ = report.send(Internal::Retired(Box::new(retired)));
        });
    }

    /// A retire of [`SessionActor::retire_open`] is done: what the spool held is recorded,
    /// the turn ends, and the stop or detach is answered.
    pub(in crate::session) async fn retired(&mut self, retired: Retired) {
        let Retired { id, record, result, leftovers } = retired;
        let Some(teardown) = self.sidecar.teardown.take() else { return };
        let (tx, events) = mpsc::channel(leftovers.len().max(1));
        for event in leftovers {
            let _ = tx.try_send(Ok(Box::new(event)));
        }
        drop(tx);
        self.record_leftovers(id, record, events).await;
        // The agent that asked is gone: its questions are void.
        self.void_pending().await;
        if self.conversation.turn.is_some() {
            self.end_turn(TurnState::Failed, None, Some(teardown.turn_error.into())).await;
        }
        if let Some(reply) = teardown.reply {
            let _ = reply.send(result);
        }
        // Anyone who asked for a resume meanwhile gets one now.
        if self.phase() != Phase::Ended && self.waits.anyone_waits_for_open() {
            self.begin_resume().await;
        }
    }

    /// Retires an execution and waits until its sidecar is gone, then records what its
    /// spool still held: what the agent emitted until it exited is kept, whatever ended it.
    pub(in crate::session) async fn retire_and_record(
        &mut self,
        execution: Execution,
    ) -> Result<(), SessionError> {
        let (id, record) = (execution.id.clone(), execution.record.clone());
        let (gone_tx, gone) = tokio::sync::oneshot::channel();
        self.retire(execution, Some(gone_tx));
        let retired = gone.await.unwrap_or(Ok(()));
        let events = leftovers::read(
            leftovers::spool_dir(&self.context.state_dir_of(&record)),
            self.recorder.durability.handled,
        );
        self.record_leftovers(id, record, events).await;
        retired
    }

    /// A launch failure: session and task `FAILED` with the reason; the execution is
    /// retired (and fenced).
    pub(in crate::session) async fn fail(&mut self, reason: String) {
        tracing::warn!(session = %self.row.id, %reason, "session failed");
        let _ = self.context.store.log_error(self.row.id.clone(), reason.clone()).await;
        if let Some(execution) = self.sidecar.execution.take() {
            self.retire(execution, None);
        }
        self.update_view(|view| view.agent_running = false);
        if self.conversation.turn.is_some() {
            self.end_turn(TurnState::Failed, None, Some(reason.clone())).await;
        }
        let _ = self
            .set_state(SessionState::Failed, Some(reason.clone()), Some(task_state::FAILED))
            .await;
        self.fail_waiters(&reason);
        self.enter(Stage::Ended);
    }
}
