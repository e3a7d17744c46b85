//! Usage: context and cost reports (`usage_update`), a turn's tokens (`PromptResponse`),
//! and the limits checked at a turn's end — budgets, `max_turns`, `max_duration` — that
//! pause the session.

use super::*;
use agents::profile::UsageReporting;
use protocol::api::BudgetUse;

/// How many points below the handoff threshold the context warning comes.
pub(crate) const CONTEXT_WARNING_POINTS: u64 = 10;

impl SessionActor {
    /// ACP `usage_update`: kept for snapshots; at the profile's threshold the session is
    /// to pause for a handoff.
    pub(in crate::session) fn usage_reported(&mut self, update: &Value) {
        let (Some(used), Some(size)) = (update["used"].as_u64(), update["size"].as_u64()) else {
            return;
        };
        let usage = self.usage.get_or_insert_with(Default::default);
        usage.context_used = Some(used);
        usage.context_size = Some(size);
        if let Some(amount) =
            update["cost"]["amount"].as_f64().filter(|a| a.is_finite() && *a >= 0.0)
        {
            let currency = update["cost"]["currency"].as_str().unwrap_or("USD").to_owned();
            usage.cost = Some(amount);
            usage.cost_currency = Some(currency.clone());
            self.cost_reported(amount, currency);
        }
        if let Some(turn) = self.turn.as_mut() {
            turn.usage.context = Some((used, size));
        }
        self.update_view(|view| view.context = Some((used, size)));
        let threshold = u64::from(self.profile.session.context_handoff_percent);
        if threshold == 0 || size == 0 {
            return;
        }
        let percent = used.saturating_mul(100) / size;
        let warning = threshold.saturating_sub(CONTEXT_WARNING_POINTS);
        if percent < warning {
            self.context_warned = false;
        } else if percent < threshold && !self.context_warned {
            self.context_warned = true;
            tracing::info!(session = %self.row.id, percent, threshold, "the agent's context nears the handoff threshold");
            self.emit(SessionEventKind::ContextWarning { used, size, percent, threshold });
        }
        // The new agent of a handoff starts small; its first report says so.
        if used.saturating_mul(100) >= threshold.saturating_mul(size) {
            self.exhausted = Some(format!(
                "the agent's context is {percent}% full ({used} of {size} tokens; the threshold is {threshold}%)"
            ));
        }
    }

    /// The agent's cumulative cost: what it added since the mark goes to the running turn
    /// (written with its end) or, between turns, to the newest turn. A figure below the mark
    /// or in another currency is a new count (a fresh agent session), all of it added.
    fn cost_reported(&mut self, amount: f64, currency: String) {
        let added = match &self.cost_mark {
            Some((mark, known)) if *known == currency && amount >= *mark => amount - mark,
            _ => amount,
        };
        let mark = (amount, currency.clone());
        self.cost_mark = Some(mark.clone());
        if let Some(turn) = self.turn.as_mut() {
            let cost = turn.usage.cost.get_or_insert((0.0, currency.clone()));
            if cost.1 == currency {
                cost.0 += added;
            }
            turn.usage.cost_mark = Some(mark);
        } else if added > 0.0 {
            let total = match self.cost_between_turns.take() {
                Some(((earlier, known), _)) if known == currency => earlier + added,
                _ => added,
            };
            self.cost_between_turns = Some(((total, currency), mark));
        }
    }
}

/// The kinds of tokens a `PromptResponse`'s `usage` holds (ACP, unstable).
const TOKEN_FIELDS: [&str; 6] = [
    "inputTokens",
    "outputTokens",
    "cachedReadTokens",
    "cachedWriteTokens",
    "thoughtTokens",
    "totalTokens",
];

/// The tokens of a `PromptResponse`'s `usage` (ACP, unstable: `inputTokens`,
/// `outputTokens`, `cachedReadTokens`, `cachedWriteTokens`, `thoughtTokens`,
/// `totalTokens`), as the agent reported them: this turn's, or its running totals (the
/// store takes those apart, `session.usage_totals`). Without a figure nothing was
/// reported: the turn's tokens are unknown.
pub(in crate::session) fn prompt_usage(result: &Value, usage: &mut crate::store::TurnUsage) {
    let reported = &result["usage"];
    if !TOKEN_FIELDS.iter().any(|name| reported[*name].is_u64()) {
        return;
    }
    usage.tokens_reported = true;
    let n = |name: &str| reported[name].as_u64().unwrap_or(0);
    usage.input_tokens = n("inputTokens");
    usage.output_tokens = n("outputTokens");
    usage.cached_read_tokens = n("cachedReadTokens");
    usage.cached_write_tokens = n("cachedWriteTokens");
    usage.thought_tokens = n("thoughtTokens");
    usage.total_tokens = reported["totalTokens"].as_u64();
}

impl SessionActor {
    /// A turn's usage in the metrics (`tether_tokens_total`, `tether_cost_total`): its
    /// cost, and the tokens of an agent that reports each turn's own (a cumulative agent's
    /// are counted by `check_limits`, once the store took this turn's increase apart).
    pub(in crate::session) fn turn_counted(&self, usage: &crate::store::TurnUsage) {
        if self.profile.session.usage_totals == UsageReporting::PerTurn {
            self.tokens_counted(usage);
        }
        if let Some((amount, currency)) = usage.cost.as_ref().filter(|(amount, _)| *amount > 0.0) {
            let labels = vec![
                ("currency", currency.clone()),
                ("profile", self.row.agent_profile_id.clone()),
            ];
            crate::metrics::get().cost.get_or_create(&labels).inc_by(*amount);
        }
    }

    /// A turn's tokens in the metrics (`tether_tokens_total`).
    fn tokens_counted(&self, usage: &crate::store::TurnUsage) {
        let metrics = crate::metrics::get();
        let profile = self.row.agent_profile_id.clone();
        for (direction, tokens) in [
            ("input", usage.input_tokens),
            ("output", usage.output_tokens),
            ("cached_read", usage.cached_read_tokens),
            ("cached_write", usage.cached_write_tokens),
            ("thought", usage.thought_tokens),
        ] {
            if tokens > 0 {
                let labels =
                    vec![("direction", direction.to_owned()), ("profile", profile.clone())];
                metrics.tokens.get_or_create(&labels).inc_by(tokens);
            }
        }
    }

    /// The tokens the store recorded for the turn that just ended (a cumulative agent's
    /// report taken apart), counted in the metrics; the turn's usage as reported else.
    async fn recorded_tokens(&self, reported: &crate::store::TurnUsage) -> crate::store::TurnUsage {
        if self.profile.session.usage_totals == UsageReporting::PerTurn {
            return reported.clone();
        }
        match self.context.store.newest_turn_tokens(self.row.id.clone()).await {
            Ok(Some(recorded)) => {
                self.tokens_counted(&recorded);
                crate::store::TurnUsage { cost: reported.cost.clone(), ..recorded }
            }
            Ok(None) => reported.clone(),
            Err(err) => {
                tracing::warn!(session = %self.row.id, %err, "cannot read the turn's tokens");
                reported.clone()
            }
        }
    }

    /// After a turn's end: a budget passing 80 % is announced (`budget_warning`); a budget
    /// used up, `max_turns` turns or `max_duration_secs` since the session was created
    /// pause the session once the turn's end is handled. A token limit whose turns never
    /// reported tokens cannot be checked: a notice says so at the first such turn.
    pub(in crate::session) async fn check_limits(&mut self, reported: &crate::store::TurnUsage) {
        let turn = &self.recorded_tokens(reported).await;
        if self.row.state.is_terminal() {
            return;
        }
        // A pause already waits (its summary turn runs): warnings only.
        let pausing = self.pause.is_some();
        let store = self.context.store.clone();
        match store.budget_uses(self.row.id.clone()).await {
            Ok(uses) => {
                for used in uses {
                    if !turn.tokens_reported
                        && used.budget.tokens.is_some()
                        && used.tokens_unknown()
                        && used.turns_without_tokens == 1
                    {
                        self.emit(SessionEventKind::Notice { message: used.describe() });
                    }
                    if used.percent >= 100 && !pausing {
                        let reason = format!("{} (raise it with budget.set)", used.describe());
                        self.limit_reached.get_or_insert((reason, SnapshotTrigger::Budget));
                    } else if used.percent >= 80 && budget_before(&used, turn).percent < 80 {
                        self.emit(SessionEventKind::BudgetWarning { budget: used });
                    }
                }
            }
            Err(err) => tracing::warn!(session = %self.row.id, %err, "cannot read the budgets"),
        }
        if pausing {
            return;
        }
        if let Some(max) = self.profile.session.max_turns {
            let filter = crate::store::UsageFilter {
                session_id: Some(self.row.id.clone()),
                ..Default::default()
            };
            match store.usage(filter, None).await {
                Ok(report) if report.total.turns >= u64::from(max) => {
                    let reason = format!("the session ran its {max} turns (session.max_turns)");
                    self.limit_reached.get_or_insert((reason, SnapshotTrigger::MaxTurns));
                }
                Ok(_) => {}
                Err(err) => tracing::warn!(session = %self.row.id, %err, "cannot count the turns"),
            }
        }
        if let Some(secs) = self.profile.session.max_duration_secs {
            let age = crate::store::now_ms().saturating_sub(self.row.created_at);
            if age >= i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX) {
                let reason =
                    format!("the session ran for its {secs} s (session.max_duration_secs)");
                self.limit_reached.get_or_insert((reason, SnapshotTrigger::MaxDuration));
            }
        }
    }

    /// A limit was reached at a turn's end: the session pauses (its snapshot says why).
    pub(in crate::session) async fn limit_pause(
        &mut self,
        reason: String,
        trigger: SnapshotTrigger,
    ) {
        if self.pause.is_some()
            || self.row.state.is_terminal()
            || self.row.state == SessionState::Paused
        {
            return;
        }
        tracing::info!(session = %self.row.id, %reason, "a limit was reached; pausing");
        let wait = std::time::Duration::from_millis(crate::session::DEFAULT_PAUSE_WAIT_MS);
        if let Err(err) = self.request_pause(Some(reason), wait, trigger).await {
            tracing::warn!(session = %self.row.id, %err, "cannot pause at a limit");
        }
    }
}

/// The budget as it stood before `turn`.
fn budget_before(used: &BudgetUse, turn: &crate::store::TurnUsage) -> BudgetUse {
    let cost = match &turn.cost {
        Some((amount, currency)) if currency == used.budget.currency() => *amount,
        _ => 0.0,
    };
    BudgetUse {
        turns_with_tokens: used.turns_with_tokens,
        turns_without_tokens: used.turns_without_tokens,
        ..crate::store::budget_use(
            used.scope,
            used.id.clone(),
            used.budget.clone(),
            used.used_tokens.saturating_sub(turn.total()),
            (used.used_cost - cost).max(0.0),
        )
    }
}
