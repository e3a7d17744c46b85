//! Usage: context and cost reports (`usage_update`), a turn's tokens (`PromptResponse`),
//! and the limits checked at a turn's end — budgets, `max_turns`, `max_duration` — that
//! pause the session.

use super::{SessionActor, SessionEventKind, SessionState, SnapshotTrigger, Value};
use crate::session::meter::{BudgetNews, ContextReport, ContextWarning};
use agents::profile::UsageReporting;

impl SessionActor {
    /// ACP `usage_update`: the meter keeps it for snapshots and says what follows (a
    /// warning now; a handoff once the report is handled).
    pub(in crate::session) fn usage_reported(&mut self, update: &Value) {
        let Some(report) = ContextReport::parse(update) else { return };
        let threshold = u64::from(self.profile.session.context_handoff_percent);
        let turn = self.conversation.turn.as_mut().map(|turn| &mut turn.usage);
        let warning = self.meter.on_report(&report, threshold, turn);
        let (used, size) = (report.used, report.size);
        self.update_view(|view| view.context = Some((used, size)));
        if let Some(ContextWarning { used, size, percent, threshold }) = warning {
            tracing::info!(session = %self.row.id, percent, threshold, "the agent's context nears the handoff threshold");
            self.emit(SessionEventKind::ContextWarning { used, size, percent, threshold });
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
        let pausing = self.waits.pause.is_some();
        let store = self.context.store.clone();
        match store.budget_uses(self.row.id.clone()).await {
            Ok(uses) => {
                for news in self.meter.judge_budgets(uses, turn, pausing) {
                    self.emit(match news {
                        BudgetNews::Unchecked(message) => SessionEventKind::Notice { message },
                        BudgetNews::Warning(budget) => SessionEventKind::BudgetWarning { budget },
                    });
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
                Ok(report) => self.meter.judge_turns(report.total.turns, max),
                Err(err) => tracing::warn!(session = %self.row.id, %err, "cannot count the turns"),
            }
        }
        if let Some(secs) = self.profile.session.max_duration_secs {
            let age = crate::store::now_ms().saturating_sub(self.row.created_at);
            self.meter.judge_age(age, secs);
        }
    }

    /// A limit was reached at a turn's end: the session pauses (its snapshot says why).
    pub(in crate::session) async fn limit_pause(
        &mut self,
        reason: String,
        trigger: SnapshotTrigger,
    ) {
        if self.waits.pause.is_some()
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
