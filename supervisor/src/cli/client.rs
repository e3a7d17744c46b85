//! The client commands: a typed API client of a running daemon, what each command calls
//! and how a failed call becomes an exit code.

use super::{
    AcpUpdate, ApiClient, Arc, Command, Deserialize, Duration, ElicitationCommand, ErrorKind,
    EventKind, Exit, Failure, Feed, Instant, JsonFlag, PermissionCommand, RECONNECT_WINDOW,
    ResumeOutcome, ResumeResult, RuntimeKind, SessionCommand, SessionEvent, SessionState,
    SessionsCommand, Shown, SnapshotsCommand, StartArgs, TaskCommand, TurnState, UsageBy, Waiting,
    Write, WsClient, WsClientBuilder, acp, ago, describe, face, or_dash, permission_lines,
    print_fields, print_json, session_usage_line, sessions_json, since_ms, timeline_lines, usage,
    usage_line,
};

/// How long the client waits for one answer. The daemon bounds every wait of its own (a
/// launch by the profile's `init_timeout_ms`, which is minutes for some agents, a pause by
/// its wait), and says why when one runs out; a shorter bound here (the client library's
/// is a minute) would cut that answer off with a bare "request timeout". A daemon that goes
/// away closes the connection, which ends the call at once.
pub(super) const CALL_BOUND: Duration = Duration::from_secs(60 * 60);

/// Where the daemon is and how to get in.
#[derive(Clone)]
pub(super) struct Target {
    pub(super) url: String,
    pub(super) token: Option<String>,
}

impl Target {
    pub(super) async fn open(&self) -> Result<WsClient, Failure> {
        let mut headers = http::HeaderMap::new();
        if let Some(token) = &self.token {
            let value = http::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| usage("error: the token is not a valid header value".into()))?;
            headers.insert(http::header::AUTHORIZATION, value);
        }
        WsClientBuilder::default()
            .set_headers(headers)
            .max_response_size(64 * 1024 * 1024)
            .request_timeout(CALL_BOUND)
            .build(&self.url)
            .await
            .map_err(|err| self.connect_failure(err))
    }

    /// Why the CLI could not connect: a daemon that refused it (wrong or missing token, an
    /// origin it does not allow) is not a daemon that is not running.
    pub(super) fn connect_failure(&self, err: jsonrpsee::core::ClientError) -> Failure {
        use jsonrpsee::client_transport::ws::WsHandshakeError;
        let url = &self.url;
        let rejected = match &err {
            jsonrpsee::core::ClientError::Transport(inner) => {
                match inner.downcast_ref::<WsHandshakeError>() {
                    Some(WsHandshakeError::Rejected { status_code }) => Some(*status_code),
                    _ => None,
                }
            }
            _ => None,
        };
        match rejected {
            Some(401) if self.token.is_some() => Failure {
                code: Exit::Refused,
                line: format!("unauthorized: the daemon at {url} refused this token"),
            },
            Some(429) => Failure {
                code: Exit::Busy,
                line: format!(
                    "too many connections: the daemon at {url} has no room for another one (its --max-connections); try again when clients have closed theirs"
                ),
            },
            Some(401) => Failure {
                code: Exit::Refused,
                line: format!(
                    "unauthorized: the daemon at {url} wants a token (--token or TETHER_TOKEN)"
                ),
            },
            Some(status) => Failure {
                code: Exit::Refused,
                line: format!("refused: the daemon at {url} answered HTTP {status}"),
            },
            None => Failure {
                code: Exit::NotRunning,
                line: format!(
                    "server not running at {url} (start it with `supervisor serve`): {err}"
                ),
            },
        }
    }

    /// Connects again after the daemon went away, within [`RECONNECT_WINDOW`]. There is no
    /// event to await for a daemon that is not there yet, so this retries with a growing
    /// delay.
    pub(super) async fn reopen(&self, shown: &Shown) -> Result<WsClient, Failure> {
        shown.line(&format!("the daemon at {} went away; reconnecting", self.url));
        let deadline = Instant::now() + RECONNECT_WINDOW;
        let mut delay = Duration::from_millis(100);
        loop {
            match self.open().await {
                Ok(client) => {
                    shown.line("reconnected");
                    return Ok(client);
                }
                Err(failure) if failure.code != Exit::NotRunning || Instant::now() >= deadline => {
                    return Err(failure);
                }
                Err(_) => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}

pub(super) struct Client {
    pub(super) target: Target,
    pub(super) client: Arc<WsClient>,
}

/// What a failed call means for the exit code.
pub(super) fn call_failure(
    target: &Target,
    client: &WsClient,
    err: jsonrpsee::core::ClientError,
) -> Failure {
    match err {
        jsonrpsee::core::ClientError::Call(object) => {
            let kind = protocol::errors::ErrorData::of(&object).map(|data| data.kind);
            let message = object.message();
            match kind {
                Some(ErrorKind::NotFound) => {
                    Failure { code: Exit::NotFound, line: format!("not found: {message}") }
                }
                Some(ErrorKind::Conflict) => {
                    Failure { code: Exit::Conflict, line: format!("conflict: {message}") }
                }
                Some(kind) => {
                    Failure { code: Exit::Error, line: format!("error ({kind}): {message}") }
                }
                None => Failure { code: Exit::Error, line: format!("error: {message}") },
            }
        }
        other if !client.is_connected() => Failure {
            code: Exit::NotRunning,
            line: format!("server not running at {} (the connection closed: {other})", target.url),
        },
        other => Failure { code: Exit::Error, line: format!("error: {other}") },
    }
}

impl Client {
    pub(super) async fn connect(target: Target) -> Result<Client, Failure> {
        let client = Arc::new(target.open().await?);
        Ok(Client { target, client })
    }

    pub(super) fn failure(&self, err: jsonrpsee::core::ClientError) -> Failure {
        call_failure(&self.target, &self.client, err)
    }

    /// Runs one client command: each command, or family of commands, has its own method.
    pub(super) async fn run(&self, command: Command) -> Result<(), Failure> {
        let api = &*self.client;
        match command {
            Command::Serve(_) => unreachable!("UNWRAP: dispatched before connecting"),
            Command::Acp { agent } => {
                let client =
                    Client { target: self.target.clone(), client: Arc::clone(&self.client) };
                face::serve_acp(client, agent).await
            }
            Command::Agents(JsonFlag { json }) => self.agents(json).await,
            Command::Task(command) => self.task(command).await,
            Command::Session(SessionCommand::Start(start)) => self.session_start(start).await,
            Command::Workflow(command) => self.workflow(command).await,
            Command::Prompt { quiet, session, text } => {
                self.prompt(&session, &text.join(" "), quiet).await
            }
            Command::Fork { session, turn, json } => {
                let forked = api.session_fork(session, turn).await.map_err(|e| self.failure(e))?;
                if json.json {
                    return super::output::print_json(&forked);
                }
                print_fork(&forked);
                Ok(())
            }
            Command::Rewind { session, turn, restore_workspace, json } => {
                let rewound = api
                    .session_rewind(session, turn, Some(restore_workspace))
                    .await
                    .map_err(|e| self.failure(e))?;
                if json.json {
                    return super::output::print_json(&rewound);
                }
                print_rewind(&rewound);
                Ok(())
            }
            Command::Steer { quiet, session, text } => {
                self.steer(&session, &text.join(" "), quiet).await
            }
            Command::Retry { quiet, session, turn } => self.retry(&session, turn, quiet).await,
            Command::Usage { session, task, profile, workflow, since, by, json } => {
                self.usage_report([session, task, profile, workflow], since, by, json.json).await
            }
            Command::Budget { session, task, tokens, cost, currency, json } => {
                self.budget(session, task, tokens, cost, currency, json.json).await
            }
            Command::Resume { quiet, refresh_profile, session } => {
                self.resume(session, quiet, refresh_profile).await
            }
            Command::Status { session, json: JsonFlag { json } } => {
                self.status(session, json).await
            }
            Command::Settings { session, set, mode, json: JsonFlag { json } } => {
                self.settings(session, set, mode, json).await
            }
            Command::Cancel { session } => {
                api.session_cancel(session.clone()).await.map_err(|e| self.failure(e))?;
                println!("session {session}: cancel sent (the turn ends as cancelled)");
                Ok(())
            }
            Command::Pause { session, reason, force_after_ms, no_wait } => {
                let session = self.session_or_here(session, "pause").await?;
                self.pause(&session, reason, force_after_ms, no_wait).await
            }
            Command::Elicitation(ElicitationCommand::Respond {
                session,
                request,
                answer,
                fields,
            }) => self.elicitation_respond(session, request, &answer, &fields).await,
            Command::Permission(PermissionCommand::Respond { session, request, answer }) => {
                self.permission_respond(&session, &request, &answer).await
            }
            Command::Follow { session, after, json } => self.follow(&session, after, json).await,
            Command::Stop { session } => {
                api.session_stop(session.clone()).await.map_err(|e| self.failure(e))?;
                println!("session {session} stopped");
                Ok(())
            }
            Command::StopAll => {
                let result = api.stop_all().await.map_err(|e| self.failure(e))?;
                println!("stopped {} agent(s); their sessions stay resumable", result.stopped);
                Ok(())
            }
            Command::History { session, after, limit, json: JsonFlag { json } } => {
                self.history(session, after, limit, json).await
            }
            Command::Sessions(command) => self.sessions(command).await,
            Command::Snapshots(command) => self.snapshots(command).await,
            Command::Queue(command) => self.queue(command).await,
            Command::Engines(command) => self.engines(command).await,
            Command::Move { session, runtime, labels, force_after_ms, json } => {
                let labels = labels.into_iter().collect();
                self.move_session(session, runtime, labels, force_after_ms, json.json).await
            }
            Command::Changes { session, diff, keep, revert, json } => {
                self.changes(session, super::review::Review { diff, keep, revert }, json.json).await
            }
            Command::Checkpoints { session, restore_into, seq, turn, json } => {
                let restore = restore_into.map(|into| super::review::Restore { into, seq, turn });
                self.checkpoints(session, restore, json.json).await
            }
        }
    }

    /// Lists the agent profiles and whether each can run.
    async fn agents(&self, json: bool) -> Result<(), Failure> {
        let agents = self.client.agents_list().await.map_err(|e| self.failure(e))?;
        if json {
            return print_json(&agents);
        }
        for agent in agents {
            let state = if agent.invalid {
                format!("invalid profile: {}", agent.reasons.join("; "))
            } else if agent.available {
                "available".to_owned()
            } else {
                format!("unavailable: {}", agent.reasons.join("; "))
            };
            let from = match &agent.extends {
                Some(base) => format!(
                    "\t(extends {base}; its own: {}; the rest is {base}'s)",
                    agent.own_keys.join(", ")
                ),
                None => String::new(),
            };
            println!("{}\t{}\t{state}{from}", agent.id, agent.display_name);
            if let Some(sandbox) = &agent.sandbox {
                println!("\t{}", super::output::confinement_line(Some(sandbox)));
            }
        }
        Ok(())
    }

    /// The `task` commands: create, delete, list and show tasks.
    async fn task(&self, command: TaskCommand) -> Result<(), Failure> {
        let api = &*self.client;
        match command {
            TaskCommand::Create { title, description, quiet } => {
                let task =
                    api.task_create(title, Some(description)).await.map_err(|e| self.failure(e))?;
                if quiet {
                    println!("{}", task.id)
                } else {
                    println!("task {} created", task.id)
                }
                Ok(())
            }
            TaskCommand::Delete { task, force, delete_branch } => {
                api.task_delete(task.clone(), Some(force), Some(delete_branch))
                    .await
                    .map_err(|e| self.failure(e))?;
                println!("task {task} deleted");
                Ok(())
            }
            TaskCommand::List(JsonFlag { json }) => {
                let tasks = api.task_list().await.map_err(|e| self.failure(e))?;
                if json {
                    return print_json(&tasks);
                }
                for task in tasks {
                    println!("{}\t{}\t{}", task.id, task.state, task.title);
                }
                Ok(())
            }
            TaskCommand::Show { task, json: JsonFlag { json } } => {
                let detail = api.task_get(task).await.map_err(|e| self.failure(e))?;
                if json {
                    let mut value = serde_json::to_value(&detail).map_err(|err| Failure {
                        code: Exit::Error,
                        line: format!("error: {err}"),
                    })?;
                    value["sessions"] = sessions_json(&detail.sessions)?;
                    return print_json(&value);
                }
                println!("task {}: {} ({})", detail.task.id, detail.task.title, detail.task.state);
                for session in detail.sessions {
                    println!(
                        "  session {}\t{}\t{}",
                        session.id,
                        session.state.as_str(),
                        session.agent_profile_id
                    );
                }
                Ok(())
            }
        }
    }

    /// Prints the usage totals of `scope` (a session, task, profile and workflow, each
    /// optional), since `since` ago, and per group when `by` names one.
    async fn usage_report(
        &self,
        scope: [Option<String>; 4],
        since: Option<String>,
        by: Option<UsageBy>,
        json: bool,
    ) -> Result<(), Failure> {
        let [session, task, profile, workflow] = scope;
        let since_ms = match since {
            Some(text) => Some(crate::store::now_ms() - since_ms(&text)?),
            None => None,
        };
        let report = self
            .client
            .usage_query(session, task, profile, workflow, since_ms, None, by.map(Into::into))
            .await
            .map_err(|e| self.failure(e))?;
        if json {
            return print_json(&report);
        }
        println!("total\t{}", usage_line(&report.total));
        for group in &report.groups {
            println!("{}\t{}", group.key, usage_line(&group.totals));
        }
        Ok(())
    }

    /// Sets the budget of a session or a task and prints what it has used of it.
    async fn budget(
        &self,
        session: Option<String>,
        task: Option<String>,
        tokens: Option<u64>,
        cost: Option<f64>,
        currency: Option<String>,
        json: bool,
    ) -> Result<(), Failure> {
        let set = self
            .client
            .budget_set(session.clone(), task.clone(), tokens, cost, currency)
            .await
            .map_err(|e| self.failure(e))?;
        if json {
            return print_json(&set);
        }
        let what = match (&session, &task) {
            (Some(session), _) => format!("session {session}"),
            (_, Some(task)) => format!("task {task}"),
            _ => String::new(),
        };
        match set {
            Some(used) => println!("{what}: {}", used.describe()),
            None => println!("{what}: no budget"),
        }
        Ok(())
    }

    /// Resumes a session (by default the one here) and says what changed while it rested.
    async fn resume(
        &self,
        session: Option<String>,
        quiet: bool,
        refresh_profile: bool,
    ) -> Result<(), Failure> {
        let session = self.session_or_here(session, "resume").await?;
        if !quiet {
            self.pause_summary(&session).await?;
        }
        let result = self.resume_with_progress(&session, quiet, refresh_profile).await?;
        println!(
            "session {session} resumed ({}), {}",
            result.outcome.as_str(),
            result.state.as_str()
        );
        if let Some(drift) = &result.git_drift {
            println!(
                "the workspace changed since snapshot {} (the agent is told so with your next prompt):",
                drift.snapshot_id
            );
            for line in drift.describe().lines() {
                println!("  {line}");
            }
        }
        match (result.profile_refreshed, result.profile_drift.is_empty()) {
            (true, _) => {
                println!("adopted the current profile: {}", result.profile_drift.join(", "))
            }
            (false, false) => println!(
                "the profile changed since the session started ({}); resume --refresh-profile adopts it",
                result.profile_drift.join(", ")
            ),
            (false, true) => {}
        }
        Ok(())
    }

    /// Prints a session's status and its usage.
    async fn status(&self, session: String, json: bool) -> Result<(), Failure> {
        let status = self.client.session_status(session).await.map_err(|e| self.failure(e))?;
        if json {
            return print_json(&status);
        }
        print_fields(&status)?;
        println!("{}", super::output::confinement_line(status.sandbox.as_ref()));
        println!("{}", super::output::checkpoint_line(status.checkpoint.as_ref()));
        println!("usage (turns): {}", session_usage_line(&status.usage));
        if !status.queue.prompts.is_empty() || status.queue.halted.is_some() {
            println!("{}", super::output::queue_line(&status.queue));
        }
        Ok(())
    }

    /// Prints a session's conversation history after `after`, at most `limit` entries.
    async fn history(
        &self,
        session: String,
        after: u64,
        limit: usize,
        json: bool,
    ) -> Result<(), Failure> {
        let entries = self
            .client
            .session_history(session, Some(after), Some(limit))
            .await
            .map_err(|e| self.failure(e))?;
        if json {
            return print_json(&entries);
        }
        for entry in entries {
            println!("[{}] {}: {}", entry.seq, entry.kind, entry.content);
        }
        Ok(())
    }

    /// The `sessions` commands: list, show, delete and clean up sessions.
    async fn sessions(&self, command: SessionsCommand) -> Result<(), Failure> {
        let api = &*self.client;
        match command {
            SessionsCommand::List { task, status, agent, json } => {
                let sessions =
                    api.session_list(task, status, agent).await.map_err(|e| self.failure(e))?;
                if json.json {
                    return print_json(&sessions_json(&sessions)?);
                }
                for session in sessions {
                    let title = session.title.map(|title| format!("\t{title}")).unwrap_or_default();
                    println!(
                        "{}\t{}\t{}\ttask {}{title}",
                        session.id,
                        session.state.as_str(),
                        session.agent_profile_id,
                        session.task_id
                    );
                }
                Ok(())
            }
            SessionsCommand::Show { session, json: JsonFlag { json } } => {
                self.session_show(session, json).await
            }
            SessionsCommand::Delete { session, force, delete_branch } => {
                api.session_delete(session.clone(), Some(force), Some(delete_branch))
                    .await
                    .map_err(|e| self.failure(e))?;
                println!("session {session} deleted");
                Ok(())
            }
            SessionsCommand::Cleanup {
                max_age_days,
                keep_completed,
                states,
                dry_run,
                force,
                json: JsonFlag { json },
            } => self.cleanup(max_age_days, keep_completed, states, dry_run, force, json).await,
        }
    }

    /// Prints a session's status, its usage and its timeline with each turn's tokens.
    async fn session_show(&self, session: String, json: bool) -> Result<(), Failure> {
        let api = &*self.client;
        let status = api.session_status(session.clone()).await.map_err(|e| self.failure(e))?;
        let timeline =
            api.session_timeline(session.clone(), None).await.map_err(|e| self.failure(e))?;
        if json {
            return print_json(&protocol::api::SessionDetail { status, timeline });
        }
        print_fields(&status)?;
        println!("{}", super::output::confinement_line(status.sandbox.as_ref()));
        println!("{}", super::output::checkpoint_line(status.checkpoint.as_ref()));
        println!("usage (turns): {}", session_usage_line(&status.usage));
        // Each turn's tokens (a daemon that cannot group by turn: none shown).
        let by_turn = Some(protocol::api::UsageGroupBy::Turn);
        let turn_usage = api
            .usage_query(Some(session), None, None, None, None, None, by_turn)
            .await
            .map(|report| report.groups)
            .unwrap_or_default();
        for line in timeline_lines(&timeline, &turn_usage) {
            println!("{line}");
        }
        Ok(())
    }

    /// Removes the sessions at rest that the policy given selects, or says which it would.
    async fn cleanup(
        &self,
        max_age_days: u32,
        keep_completed: bool,
        states: Vec<SessionState>,
        dry_run: bool,
        force: bool,
        json: bool,
    ) -> Result<(), Failure> {
        let states = (!states.is_empty()).then_some(states);
        let result = self
            .client
            .cleanup(max_age_days, states, Some(keep_completed), Some(dry_run), Some(force))
            .await
            .map_err(|e| self.failure(e))?;
        if json {
            return print_json(&result);
        }
        let verb = if result.dry_run { "would remove" } else { "removed" };
        for gone in &result.removed {
            let with = if gone.resources.is_empty() {
                String::new()
            } else {
                format!(" (with its {})", gone.resources.join(", "))
            };
            println!("{verb} {} {}{with}", gone.session_id, gone.state);
        }
        for kept in &result.kept {
            println!("kept {} {}: {}", kept.session_id, kept.state, kept.reason);
        }
        println!("{verb} {} session(s), kept {}", result.removed.len(), result.kept.len());
        Ok(())
    }

    /// The `snapshots` commands: list a session's snapshots, or print one.
    async fn snapshots(&self, command: SnapshotsCommand) -> Result<(), Failure> {
        let api = &*self.client;
        match command {
            SnapshotsCommand::List { session, json } => {
                let snapshots = api.snapshot_list(session).await.map_err(|e| self.failure(e))?;
                if json.json {
                    return print_json(&snapshots);
                }
                for snapshot in snapshots {
                    let context = match (snapshot.context_used, snapshot.context_size) {
                        (Some(used), Some(size)) => format!("context {used}/{size}"),
                        _ => "context -".into(),
                    };
                    println!(
                        "{}	{}	{}	{}	{}	{}{}",
                        snapshot.snapshot_id,
                        snapshot.trigger,
                        ago(snapshot.taken_at),
                        or_dash(snapshot.git_branch.as_deref()),
                        or_dash(snapshot.git_head.as_deref()),
                        context,
                        if snapshot.git_dirty == Some(true) { "\tdirty" } else { "" },
                    );
                }
                Ok(())
            }
            // JSON either way: `--json` is taken as every read command takes it.
            SnapshotsCommand::Get { snapshot, json: _ } => {
                let snapshot = api.snapshot_get(snapshot).await.map_err(|e| self.failure(e))?;
                print_json(&snapshot)
            }
        }
    }

    pub(super) async fn session_start(&self, start: StartArgs) -> Result<(), Failure> {
        let StartArgs {
            agent,
            workspace,
            task,
            new_task,
            prompt,
            runtime,
            shared,
            worktree,
            no_worktree,
            base,
            labels,
            quiet,
        } = start;
        let worktree = match (worktree, no_worktree) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        };
        let api = &*self.client;
        let workspace = match workspace {
            Some(workspace) => {
                let workspace = std::path::absolute(&workspace)
                    .map_err(|err| usage(format!("error: --workspace: {err}")))?;
                Some(workspace.to_str().map(str::to_owned).ok_or_else(|| {
                    usage(format!(
                        "error: --workspace {}: not valid UTF-8 (the API carries paths as UTF-8 text)",
                        workspace.display()
                    ))
                })?)
            }
            None => None,
        };
        let task = match (task, new_task) {
            (Some(task), _) => task,
            (None, Some(title)) => {
                api.task_create(title, None).await.map_err(|e| self.failure(e))?.id
            }
            (None, None) => unreachable!("UNWRAP: clap requires one of --task, --new-task"),
        };
        let runtime = runtime.map(RuntimeKind::named);
        let row = api
            .session_create(
                task.clone(),
                agent.clone(),
                workspace,
                prompt,
                runtime,
                Some(shared),
                worktree,
                base,
                (!labels.is_empty()).then(|| labels.into_iter().collect()),
                None,
                None,
                None,
            )
            .await
            .map_err(|e| self.failure(e))?;
        let shown = Shown::new(quiet);
        let mut events = Feed::open(self, &row.id, Some(0), &shown).await?;
        loop {
            let event = events.next().await?;
            shown.progress(&event);
            if let EventKind::State { state, error } = &event.kind {
                match state {
                    SessionState::WaitingForInput | SessionState::Running => break,
                    SessionState::Failed => {
                        // The session exists (to read, resume or delete): a script that
                        // reads its id gets it.
                        if quiet {
                            println!("{}", row.id);
                        }
                        return Err(Failure {
                            code: Exit::Error,
                            line: format!(
                                "session {} failed: {}",
                                row.id,
                                error.as_deref().unwrap_or("")
                            ),
                        });
                    }
                    _ => {}
                }
            }
        }
        if quiet {
            println!("{}", row.id)
        } else {
            println!("session {} ready (agent {agent}, task {task})", row.id)
        }
        Ok(())
    }

    /// Resumes `session` while showing its progress events (a slow agent start says what
    /// it is doing instead of nothing), through the event that states the outcome.
    pub(super) async fn resume_with_progress(
        &self,
        session: &str,
        quiet: bool,
        refresh_profile: bool,
    ) -> Result<ResumeResult, Failure> {
        let shown = Shown::new(quiet);
        let mut events = Feed::open(self, session, None, &shown).await?;
        let call = self.client.session_resume(session.to_owned(), Some(refresh_profile));
        tokio::pin!(call);
        let mut outcome_shown = false;
        let result = loop {
            tokio::select! {
                result = &mut call => break result.map_err(|e| self.failure(e))?,
                event = events.next() => match event {
                    Ok(event) => {
                        outcome_shown |= matches!(event.kind, EventKind::ResumeOutcome { .. });
                        shown.progress(&event);
                    }
                    // The stream is only for show: the call's answer is what counts.
                    Err(_) => return call.await.map_err(|e| self.failure(e)),
                },
            }
        };
        // The answer can overtake the outcome's event on the stream; show it too (a
        // resume that joined a running agent has none).
        while !quiet && !outcome_shown && result.outcome != ResumeOutcome::AlreadyRunning {
            let Ok(event) = events.next().await else { break };
            outcome_shown |= matches!(event.kind, EventKind::ResumeOutcome { .. });
            shown.progress(&event);
        }
        Ok(result)
    }

    /// Sends a prompt and prints the turn to its end. When the daemon restarts meanwhile,
    /// it reconnects and follows the same turn from the last event it printed.
    pub(super) async fn prompt(
        &self,
        session: &str,
        text: &str,
        quiet: bool,
    ) -> Result<(), Failure> {
        let call = self.client.session_prompt(session.to_owned(), text.to_owned());
        self.follow_new_turn(session, Some(text), call, quiet).await
    }

    /// Steers the running turn and follows the turn that carries the message to its end.
    pub(super) async fn steer(
        &self,
        session: &str,
        text: &str,
        quiet: bool,
    ) -> Result<(), Failure> {
        use protocol::api::{PromptStarted, SteerMode};
        let call = self.client.session_steer(session.to_owned(), text.to_owned());
        // Told as it is answered, then followed as a prompt's turn is.
        let call = async move {
            let steered = call.await?;
            let turn = steered.turn_id.clone().unwrap_or_default();
            let queued = |prompt_id: Option<String>, position| PromptStarted {
                turn_id: None,
                queued: true,
                prompt_id,
                position,
                waking: false,
            };
            Ok(match steered.mode {
                SteerMode::Native => {
                    eprintln!("steered: the agent took the message into its running turn {turn}");
                    PromptStarted::started(turn)
                }
                SteerMode::Fallback => {
                    eprintln!(
                        "steered: this agent cannot take a message mid-turn, so turn {turn} was cancelled; the message runs next (prompt {}), ahead of anything queued",
                        steered.prompt_id.as_deref().unwrap_or_default()
                    );
                    queued(steered.prompt_id, None)
                }
                SteerMode::Prompt => {
                    if steered.turn_id.is_none() {
                        return Ok(queued(steered.prompt_id, steered.position));
                    }
                    eprintln!("no turn was running: the message was sent as a prompt");
                    PromptStarted::started(turn)
                }
            })
        };
        self.follow_new_turn(session, None, call, quiet).await
    }

    /// Re-sends an interrupted turn's prompt and follows the new turn to its end.
    pub(super) async fn retry(
        &self,
        session: &str,
        turn: Option<String>,
        quiet: bool,
    ) -> Result<(), Failure> {
        let call = self.client.session_retry_turn(session.to_owned(), turn);
        self.follow_new_turn(session, None, call, quiet).await
    }

    /// Follows the turn `call` starts (a prompt of `text`, or a retry) to its end,
    /// printing the reply.
    async fn follow_new_turn(
        &self,
        session: &str,
        text: Option<&str>,
        call: impl std::future::Future<
            Output = Result<protocol::api::PromptStarted, jsonrpsee::core::ClientError>,
        >,
        quiet: bool,
    ) -> Result<(), Failure> {
        let shown = Shown::new(quiet);
        let mut events = Feed::open(self, session, None, &shown).await?;
        events.follow_restarts();
        let started_after = events.cursor();
        // A prompt to a session without a live agent resumes it first, which can take a
        // while: its progress is shown as it happens, so the call runs beside the stream.
        tokio::pin!(call);
        let mut turn: Option<String> = None;
        // Queued: the queued prompt whose turn is ours.
        let mut queued: Option<QueuedOurs> = None;
        let mut call_lost = false;
        // A turn started with our text since we began: ours, if the call's answer is lost.
        let mut candidate: Option<String> = None;
        // Turns seen starting and ending before the call answered with its turn id.
        let mut seen: Vec<SessionEvent> = Vec::new();
        let mut stdout = std::io::stdout();
        loop {
            let event = tokio::select! {
                started = &mut call, if turn.is_none() && queued.is_none() && !call_lost => {
                    match started {
                        Ok(started) => {
                            let Some(turn_id) = started_turn(&started, &seen) else {
                                say_queued(&started);
                                let mut waiting = QueuedOurs::new(started.prompt_id);
                                for event in &seen {
                                    if let Some(failure) = waiting.told(&event.kind, session) {
                                        return Err(failure);
                                    }
                                }
                                queued = Some(waiting);
                                continue;
                            };
                            if let Some(ended) = seen.iter().find(|e| ends_turn(e, &turn_id)) {
                                return turn_result(ended);
                            }
                            turn = Some(turn_id);
                        }
                        // The daemon went away before it answered: whether it took the
                        // prompt is told by the stream (a `turn_started` with our text),
                        // seen already or found once reconnected.
                        Err(_) if !self.client.is_connected() => {
                            call_lost = true;
                            if let Some(id) = candidate.take() {
                                if let Some(ended) = seen.iter().find(|e| ends_turn(e, &id)) {
                                    return turn_result(ended);
                                }
                                turn = Some(id);
                            } else {
                                events.reconnect().await?;
                                if events.caught_up() {
                                    return Err(not_taken());
                                }
                            }
                        }
                        Err(err) => return Err(self.failure(err)),
                    }
                    continue;
                }
                event = events.next() => event?,
            };
            shown.progress(&event);
            // While queued, the running turn's output is not ours.
            let ours = queued.is_none();
            match &event.kind {
                EventKind::TurnStarted { turn_id, prompt_id: Some(prompt_id), .. }
                    if queued.as_ref().is_some_and(|waiting| waiting.prompt_id == *prompt_id) =>
                {
                    turn = Some(turn_id.clone());
                    queued = None;
                }
                EventKind::TurnStarted { turn_id, prompt, .. }
                    if turn.is_none()
                        && Some(prompt.as_str()) == text
                        && event.seq > started_after =>
                {
                    if call_lost {
                        turn = Some(turn_id.clone());
                    } else {
                        candidate = Some(turn_id.clone());
                    }
                }
                EventKind::TurnEnded { turn_id, .. } if turn.as_deref() == Some(turn_id) => {
                    return turn_result(&event);
                }
                EventKind::Queue { .. } => {
                    if let Some(failure) =
                        queued.as_mut().and_then(|w| w.told(&event.kind, session))
                    {
                        return Err(failure);
                    }
                }
                kind => show_turn_event(kind, session, ours, &mut stdout),
            }
            if turn.is_none()
                && matches!(
                    event.kind,
                    EventKind::TurnEnded { .. }
                        | EventKind::TurnStarted { .. }
                        | EventKind::Queue { .. }
                )
            {
                seen.push(event);
            }
            if call_lost && turn.is_none() && events.caught_up() {
                return Err(not_taken());
            }
        }
    }

    /// Answers a permission request; `allow`, `allow-always`, `deny` and `deny-always`
    /// pick the request's option of exactly that kind (read from its `permission_request`
    /// event): `allow` is once, never "always" by the agent's order.
    pub(super) async fn permission_respond(
        &self,
        session: &str,
        request: &str,
        answer: &str,
    ) -> Result<(), Failure> {
        let option = match answer {
            "cancel" => None,
            "allow" | "allow-always" | "deny" | "deny-always" => {
                let params = self.permission_params(session, request).await?;
                // The agent's ACP params, as relayed.
                let asked: PermissionParams =
                    serde_json::from_value(params).map_err(|err| Failure {
                        code: Exit::Error,
                        line: format!("error: request {request}'s options do not parse: {err}"),
                    })?;
                let wanted = match answer {
                    "allow" => acp::PermissionOptionKind::AllowOnce,
                    "allow-always" => acp::PermissionOptionKind::AllowAlways,
                    "deny" => acp::PermissionOptionKind::RejectOnce,
                    _ => acp::PermissionOptionKind::RejectAlways,
                };
                match asked.options.iter().find(|option| option.kind == wanted) {
                    Some(option) => Some(option.option_id.to_string()),
                    None => {
                        let offered: Vec<String> = asked
                            .options
                            .iter()
                            .map(|option| format!("{} ({})", option.option_id, option.name))
                            .collect();
                        return Err(usage(format!(
                            "error: request {request} offers no {answer} option; give one of its option ids: {}",
                            offered.join(", ")
                        )));
                    }
                }
            }
            option_id => Some(option_id.to_owned()),
        };
        self.client
            .permission_respond(session.to_owned(), request.to_owned(), option.clone())
            .await
            .map_err(|e| self.failure(e))?;
        match option {
            Some(option) => println!("request {request} answered: {option}"),
            None => println!("request {request} cancelled"),
        }
        Ok(())
    }

    /// The ACP params of a session's permission request, from its event.
    pub(super) async fn permission_params(
        &self,
        session: &str,
        request: &str,
    ) -> Result<serde_json::Value, Failure> {
        let shown = Shown::new(true);
        let mut events = Feed::open(self, session, Some(0), &shown).await?;
        let last = events.last_seq();
        while events.cursor() < last {
            let event = events.next().await?;
            if let EventKind::PermissionRequest { request_id, params } = event.kind
                && request_id == request
            {
                return Ok(params);
            }
        }
        Err(Failure {
            code: Exit::NotFound,
            line: format!("not found: session {session} has no permission request {request}"),
        })
    }

    /// Prints a session's events until it ends, across daemon restarts.
    pub(super) async fn pause(
        &self,
        session: &str,
        reason: Option<String>,
        force_after_ms: Option<u64>,
        no_wait: bool,
    ) -> Result<(), Failure> {
        let api = &*self.client;
        // Where the stream is now, so that the pause's own events are not missed.
        let status = api.session_status(session.to_owned()).await.map_err(|e| self.failure(e))?;
        let paused = api
            .session_pause(session.to_owned(), reason, force_after_ms)
            .await
            .map_err(|e| self.failure(e))?;
        let taken = |snapshot: Option<&str>| match snapshot {
            Some(snapshot) => format!(" (snapshot {snapshot})"),
            None => String::new(),
        };
        if !paused.pause_requested {
            println!("session {session} paused{}", taken(paused.snapshot_id.as_deref()));
            return Ok(());
        }
        let (first, waiting) = match status.state {
            SessionState::Running => {
                ("the running turn finishes first", "waiting for the running turn to end")
            }
            SessionState::WaitingForInput => (
                "the agent is asked for its summary first (session.summarize_on_pause)",
                "waiting for the agent's summary",
            ),
            _ => ("the agent's start finishes first", "waiting for the agent's start to finish"),
        };
        println!("session {session}: pause requested; {first}");
        if no_wait {
            return Ok(());
        }
        let shown = Shown::new(false);
        let mut events = Feed::open(self, session, Some(status.last_event_seq), &shown).await?;
        events.follow_restarts();
        let mut snapshot = None;
        let wait = Waiting::start(waiting);
        let mut ticks = tokio::time::interval(Duration::from_secs(1));
        loop {
            let event = tokio::select! {
                event = events.next() => event?,
                _ = ticks.tick(), if wait.counts() => {
                    wait.tick();
                    continue;
                }
            };
            match event.kind {
                EventKind::SnapshotTaken { snapshot_id, .. } => snapshot = Some(snapshot_id),
                EventKind::Paused { forced, .. } => {
                    drop(wait);
                    let how = if forced { " (the turn was cancelled)" } else { "" };
                    println!("session {session} paused{how}{}", taken(snapshot.as_deref()));
                    // What the agent summarised, if it was asked.
                    if let Some(id) = snapshot
                        && let Ok(snapshot) = api.snapshot_get(id).await
                        && let Some(line) =
                            snapshot.summary.as_ref().and_then(super::output::summary_line)
                    {
                        println!("{line}");
                    }
                    return Ok(());
                }
                EventKind::State { state, .. } if state.is_at_rest() => {
                    return Err(Failure {
                        code: Exit::Conflict,
                        line: format!("error: session {session} ended ({state}) before it paused"),
                    });
                }
                _ => {}
            }
        }
    }

    pub(super) async fn follow(
        &self,
        session: &str,
        after: Option<u64>,
        json: bool,
    ) -> Result<(), Failure> {
        let shown = Shown::new(json);
        let mut events = Feed::open(self, session, after, &shown).await?;
        events.follow_restarts();
        if after.is_none() && events.state().is_at_rest() {
            // Nothing more will happen (until a resume); `--after` replays what did.
            let what = if events.state().is_terminal() { "has ended" } else { "is at rest" };
            eprintln!("session {session} {what} ({}); nothing to follow", events.state());
            return Ok(());
        }
        // The daemon says a resume's outcome twice (`resume_outcome`, kept for older
        // clients, then `resumed`): a line says it once.
        let mut outcome_said = None;
        loop {
            let event = events.next().await?;
            let said = std::mem::take(&mut outcome_said);
            if json {
                let line = serde_json::to_string(&event)
                    .map_err(|err| Failure { code: Exit::Error, line: format!("error: {err}") })?;
                println!("{line}");
            } else {
                match &event.kind {
                    EventKind::ResumeOutcome { outcome } => outcome_said = Some(*outcome),
                    EventKind::Resumed { outcome } if said == Some(*outcome) => continue,
                    _ => {}
                }
                println!("[{}] {}", event.seq, describe(&event.kind));
            }
            if let EventKind::State { state, .. } = event.kind
                && state.is_at_rest()
            {
                return Ok(());
            }
        }
    }
}

/// A prompt whose call was cut off and whose turn never showed up.
pub(super) fn not_taken() -> Failure {
    Failure {
        code: Exit::Error,
        line: "error: the daemon restarted before it took the prompt; send it again".into(),
    }
}

/// What the CLI reads of an ACP `session/request_permission`.
#[derive(Debug, Deserialize)]
pub(super) struct PermissionParams {
    pub(super) options: Vec<acp::PermissionOption>,
}

/// Prints what a followed turn shows: the agent's text and tools (when the turn is
/// `ours`), and every question asked meanwhile with how to answer it.
fn show_turn_event(kind: &EventKind, session: &str, ours: bool, stdout: &mut std::io::Stdout) {
    match kind {
        EventKind::AgentMessageChunk { text, .. } if ours => {
            let _ = write!(stdout, "{text}");
            let _ = stdout.flush();
        }
        EventKind::ToolCall { update } if ours => {
            println!("\n[tool: {}]", AcpUpdate::of(update).title.as_deref().unwrap_or("tool"))
        }
        // The agent names it anew (its first title may be a placeholder).
        EventKind::ToolCallUpdate { update } if ours => {
            if let Some(title) = AcpUpdate::of(update).title {
                println!("\n[tool: {title}]");
            }
        }
        EventKind::PermissionRequest { request_id, params } => {
            println!("\n[permission requested]");
            for line in permission_lines(params) {
                println!("  {line}");
            }
            println!(
                "  answer with `supervisor permission respond {session} {request_id} allow|allow-always|deny|deny-always|OPTION_ID` (allow is once)"
            );
        }
        EventKind::ElicitationRequest { request_id, params } => {
            println!("\n[the agent asks]");
            for line in super::questions::elicitation_lines(params) {
                println!("  {line}");
            }
            println!(
                "  answer with `supervisor elicitation respond {session} {request_id} accept --field NAME=VALUE…|decline|cancel`"
            );
        }
        _ => {}
    }
}

/// Says where a queued prompt waits (a steer's fallback, without a place, said what it
/// did).
fn say_queued(started: &protocol::api::PromptStarted) {
    let prompt_id = started.prompt_id.as_deref().unwrap_or_default();
    match started.position {
        Some(1) if started.waking => eprintln!(
            "the session's agent is not running: starting it; the prompt runs once it is up (queued as {prompt_id})"
        ),
        Some(position) if started.waking => eprintln!(
            "queued at position {position} (prompt {prompt_id}): the session's agent is being started; the prompt runs after the ones before it"
        ),
        Some(position) => eprintln!(
            "queued at position {position} behind the running turn (prompt {prompt_id}); it runs when the turns before it end"
        ),
        None => {}
    }
}

/// A prompt of ours waiting in the session's queue, for the turn it becomes.
struct QueuedOurs {
    prompt_id: String,
    /// A `queue` event was seen holding it (so one without it took it out).
    listed: bool,
}

impl QueuedOurs {
    fn new(prompt_id: Option<String>) -> QueuedOurs {
        QueuedOurs { prompt_id: prompt_id.unwrap_or_default(), listed: false }
    }

    /// What a `queue` event means for the prompt: it halted with the prompt in it (a
    /// launch or a turn before it failed), or the prompt was taken out before it ran (its
    /// turn would have started first).
    fn told(&mut self, event: &EventKind, session: &str) -> Option<Failure> {
        let EventKind::Queue { queue } = event else { return None };
        let id = &self.prompt_id;
        if !queue.prompts.iter().any(|prompt| prompt.prompt_id == *id) {
            let line = format!("error: prompt {id} was taken out of the queue before it ran");
            return self.listed.then_some(Failure { code: Exit::Error, line });
        }
        self.listed = true;
        let why = queue.halted.as_deref()?;
        Some(Failure {
            code: Exit::Error,
            line: format!(
                "error: the prompt queue halted: {why}\nprompt {id} stays queued: go on with `supervisor queue resume {session}`, or take it out with `supervisor queue remove {session} {id}`"
            ),
        })
    }
}

/// The turn a prompt's answer names: the one it started, or, when it was queued, the turn
/// already seen starting with its queued prompt (the answer and the events are not
/// ordered); `None` while it waits in the queue.
/// What a fork made: the new session, how its agent gets the conversation, where it
/// works, and what it could not carry over.
fn print_fork(forked: &protocol::api::ForkResult) {
    println!(
        "forked {} at turn {} into session {}",
        forked.forked_from, forked.turn_id, forked.session_id
    );
    let context = match forked.context {
        protocol::api::ForkContext::Native => {
            "its agent forks the original's agent session (session/fork) when it starts"
        }
        protocol::api::ForkContext::History => {
            "the history up to that turn goes with its first prompt"
        }
    };
    println!("  conversation: {context}");
    println!("  workspace: {}", forked.workspace_path);
    if let Some(branch) = &forked.branch {
        let base = forked.base_commit.as_deref().unwrap_or("the original branch's head");
        println!("  branch: {branch} (from {base})");
    }
    for note in &forked.notes {
        println!("  note: {note}");
    }
    println!("  it is at rest until prompted: supervisor prompt {} …", forked.session_id);
}

fn print_rewind(rewound: &protocol::api::RewindResult) {
    println!(
        "rewound to turn {}: {} turn(s) left the conversation{}",
        rewound.turn_id,
        rewound.rewound.len(),
        if rewound.rewound.is_empty() { "" } else { " (kept in the history, marked rewound)" }
    );
    if let Some(workspace) = &rewound.workspace {
        let files =
            if workspace.checkpoint.is_some() { ", with its uncommitted files" } else { "" };
        println!("  workspace: back at {}{files}", workspace.commit);
        if workspace.saved_ref.starts_with("refs/tether/sessions/") {
            println!(
                "  what it had is the session's checkpoint {} ({}): `supervisor checkpoints {}` lists it, --restore-into DIR --seq N writes it out",
                workspace.saved_ref, workspace.saved_commit, rewound.session_id
            );
        } else {
            println!(
                "  what it had is saved on {} ({}): git checkout {} -- . brings it back",
                workspace.saved_ref, workspace.saved_commit, workspace.saved_ref
            );
        }
    }
    for note in &rewound.notes {
        println!("  note: {note}");
    }
}

fn started_turn(started: &protocol::api::PromptStarted, seen: &[SessionEvent]) -> Option<String> {
    if let Some(turn_id) = &started.turn_id {
        return Some(turn_id.clone());
    }
    let prompt_id = started.prompt_id.as_deref()?;
    seen.iter().find_map(|event| match &event.kind {
        EventKind::TurnStarted { turn_id, prompt_id: Some(id), .. } if id == prompt_id => {
            Some(turn_id.clone())
        }
        _ => None,
    })
}

pub(super) fn ends_turn(event: &SessionEvent, turn: &str) -> bool {
    matches!(&event.kind, EventKind::TurnEnded { turn_id, .. } if turn_id == turn)
}

/// Prints how a turn ended; a turn that did not complete is exit code 1.
pub(super) fn turn_result(event: &SessionEvent) -> Result<(), Failure> {
    let EventKind::TurnEnded { state, stop_reason, error, .. } = &event.kind else {
        return Err(Failure { code: Exit::Error, line: "error: not a turn's end".into() });
    };
    let name = state.as_str();
    match stop_reason {
        Some(reason) => println!("\n[turn {name}: {reason}]"),
        None => println!("\n[turn {name}: {}]", error.as_deref().unwrap_or("")),
    }
    if *state == TurnState::Completed {
        Ok(())
    } else {
        Err(Failure { code: Exit::Error, line: "error: the turn failed".into() })
    }
}

/// How many resubscriptions in a row may bring no event before the feed gives up.
pub(super) const MAX_EMPTY_RESUBSCRIBES: u32 = 5;
