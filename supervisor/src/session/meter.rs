//! The meter: what the agent reports of its context and cost, and the limits checked at a
//! turn's end. It decides and the actor performs: a report returns the warning to publish,
//! a turn's end the events and the pause it calls for, and what is due after the event
//! being handled (cost to write, a pause, a handoff) is taken with [`Meter::take_due`].
//! A `PromptResponse`'s tokens are read here and a turn's usage counted in the metrics.
//! No store, no clock, no channel: table-tested below.

use protocol::api::{BudgetUse, SnapshotTrigger, SnapshotUsage};
use serde_json::Value;

use crate::store::TurnUsage;

/// How many points below the handoff threshold the context warning comes.
const CONTEXT_WARNING_POINTS: u64 = 10;

/// A cost in a currency.
pub(super) type Cost = (f64, String);

/// An ACP `usage_update`: the context's use and size, and the agent's cumulative cost.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ContextReport {
    pub(super) used: u64,
    pub(super) size: u64,
    pub(super) cost: Option<Cost>,
}

impl ContextReport {
    /// Reads an update; one without both figures is no report. A cost that is negative or
    /// not finite is left out (the figures stand).
    pub(super) fn parse(update: &Value) -> Option<ContextReport> {
        let (used, size) = (update["used"].as_u64()?, update["size"].as_u64()?);
        let cost = update["cost"]["amount"].as_f64().filter(|a| a.is_finite() && *a >= 0.0).map(
            |amount| (amount, update["cost"]["currency"].as_str().unwrap_or("USD").to_owned()),
        );
        Some(ContextReport { used, size, cost })
    }
}

/// The context passed the warning mark: said once, until a report below the mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ContextWarning {
    pub(super) used: u64,
    pub(super) size: u64,
    pub(super) percent: u64,
    pub(super) threshold: u64,
}

/// A limit reached at a turn's end: the session pauses for it.
pub(super) type Limit = (String, SnapshotTrigger);

/// What the event just handled left for the actor to do (in this order; a handoff is
/// taken on its own, after a limit's pause: see [`Meter::take_handoff`]).
#[derive(Debug, Default, PartialEq)]
pub(super) struct Due {
    /// Cost reported between turns, to add to the newest turn: `(added, new mark)`.
    pub(super) cost_between_turns: Option<(Cost, Cost)>,
    /// A limit was reached: pause.
    pub(super) limit: Option<Limit>,
}

/// What a turn's end says of a budget, in the budgets' order.
#[derive(Debug, PartialEq)]
pub(super) enum BudgetNews {
    /// A token budget cannot be checked: its turns never reported tokens (said once).
    Unchecked(String),
    /// The budget passed 80 % with this turn.
    Warning(BudgetUse),
}

/// The session's usage as the agent reports it, and what follows from it.
#[derive(Debug, Default)]
pub(super) struct Meter {
    /// Context use and cost as last reported (for snapshots and a turn's output).
    usage: Option<Box<SnapshotUsage>>,
    /// The context passed the warning mark and that was said.
    context_warned: bool,
    /// The agent's cumulative cost last recorded (the session's `cost_mark`), from which
    /// each report's addition is taken; loaded when the actor starts.
    cost_mark: Option<Cost>,
    due: Due,
    /// The context reached the handoff threshold: pause for a handoff (the reason).
    exhausted: Option<String>,
}

impl Meter {
    /// The cost mark the store holds, read when the actor starts.
    pub(super) fn load_cost_mark(&mut self, mark: Option<Cost>) {
        self.cost_mark = mark;
    }

    /// A handoff: the fresh agent session starts with an empty context, so the old figures
    /// (which caused it) no longer hold until the new agent reports its own.
    pub(super) fn forget_context(&mut self) {
        self.usage = Some(Box::default());
    }

    /// Context use and cost as last reported.
    pub(super) fn usage(&self) -> Option<&SnapshotUsage> {
        self.usage.as_deref()
    }

    /// The context's `(used, size)` as last reported.
    pub(super) fn context(&self) -> Option<(u64, u64)> {
        self.usage().and_then(|usage| usage.context_used.zip(usage.context_size))
    }

    /// A `usage_update`. `turn` is the running turn's usage (the report's figures and cost
    /// go there); `threshold` the profile's `context_handoff_percent` (0: none). Returns the
    /// warning to publish, if the context just passed its mark; a handoff is due at the
    /// threshold.
    pub(super) fn on_report(
        &mut self,
        report: &ContextReport,
        threshold: u64,
        mut turn: Option<&mut TurnUsage>,
    ) -> Option<ContextWarning> {
        let ContextReport { used, size, .. } = *report;
        let usage = self.usage.get_or_insert_with(Default::default);
        usage.context_used = Some(used);
        usage.context_size = Some(size);
        if let Some((amount, currency)) = &report.cost {
            usage.cost = Some(*amount);
            usage.cost_currency = Some(currency.clone());
            self.cost_reported(*amount, currency, turn.as_deref_mut());
        }
        if let Some(turn) = turn {
            turn.context = Some((used, size));
        }
        if threshold == 0 || size == 0 {
            return None;
        }
        let percent = used.saturating_mul(100) / size;
        let mut warning = None;
        if percent < threshold.saturating_sub(CONTEXT_WARNING_POINTS) {
            self.context_warned = false;
        } else if percent < threshold && !self.context_warned {
            self.context_warned = true;
            warning = Some(ContextWarning { used, size, percent, threshold });
        }
        // The new agent of a handoff starts small; its first report says so.
        if used.saturating_mul(100) >= threshold.saturating_mul(size) {
            self.exhausted = Some(format!(
                "the agent's context is {percent}% full ({used} of {size} tokens; the threshold is {threshold}%)"
            ));
        }
        warning
    }

    /// The agent's cumulative cost: what it added since the mark goes to the running turn
    /// (written with its end) or, between turns, to the newest turn. A figure below the mark
    /// or in another currency is a new count (a fresh agent session), all of it added.
    fn cost_reported(&mut self, amount: f64, currency: &str, turn: Option<&mut TurnUsage>) {
        let added = match &self.cost_mark {
            Some((mark, known)) if known == currency && amount >= *mark => amount - mark,
            _ => amount,
        };
        let mark = (amount, currency.to_owned());
        self.cost_mark = Some(mark.clone());
        if let Some(turn) = turn {
            let cost = turn.cost.get_or_insert((0.0, currency.to_owned()));
            if cost.1 == currency {
                cost.0 += added;
            }
            turn.cost_mark = Some(mark);
        } else if added > 0.0 {
            let total = match self.due.cost_between_turns.take() {
                Some(((earlier, known), _)) if known == currency => earlier + added,
                _ => added,
            };
            self.due.cost_between_turns = Some(((total, currency.to_owned()), mark));
        }
    }

    /// The budgets' use after a turn (`turn` is what it added): for each budget, a notice
    /// when its tokens cannot be checked, a warning when it passes 80 %, and — unless a
    /// pause waits already (`pausing`) — a pause when it is used up.
    pub(super) fn judge_budgets(
        &mut self,
        uses: Vec<BudgetUse>,
        turn: &TurnUsage,
        pausing: bool,
    ) -> Vec<BudgetNews> {
        let mut news = Vec::new();
        for used in uses {
            if !turn.tokens_reported
                && used.budget.tokens.is_some()
                && used.tokens_unknown()
                && used.turns_without_tokens == 1
            {
                news.push(BudgetNews::Unchecked(used.describe()));
            }
            if used.percent >= 100 && !pausing {
                let reason = format!("{} (raise it with budget.set)", used.describe());
                self.limit((reason, SnapshotTrigger::Budget));
            } else if used.percent >= 80 && budget_before(&used, turn).percent < 80 {
                news.push(BudgetNews::Warning(used));
            }
        }
        news
    }

    /// `session.max_turns`: the session ran `turns` of its `max`.
    pub(super) fn judge_turns(&mut self, turns: u64, max: u32) {
        if turns >= u64::from(max) {
            self.limit((
                format!("the session ran its {max} turns (session.max_turns)"),
                SnapshotTrigger::MaxTurns,
            ));
        }
    }

    /// `session.max_duration_secs`: the session is `age_ms` old.
    pub(super) fn judge_age(&mut self, age_ms: i64, max_secs: u64) {
        if age_ms >= i64::try_from(max_secs.saturating_mul(1000)).unwrap_or(i64::MAX) {
            self.limit((
                format!("the session ran for its {max_secs} s (session.max_duration_secs)"),
                SnapshotTrigger::MaxDuration,
            ));
        }
    }

    /// The first limit reached stands.
    fn limit(&mut self, limit: Limit) {
        self.due.limit.get_or_insert(limit);
    }

    /// What the event just handled left to do.
    pub(super) fn take_due(&mut self) -> Due {
        std::mem::take(&mut self.due)
    }

    /// A handoff the context calls for (the reason), taken after a limit's pause was
    /// handled: that pause may replay reports that reach the threshold.
    pub(super) fn take_handoff(&mut self) -> Option<String> {
        self.exhausted.take()
    }
}

/// The budget as it stood before `turn`.
fn budget_before(used: &BudgetUse, turn: &TurnUsage) -> BudgetUse {
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
pub(super) fn prompt_usage(result: &Value, usage: &mut TurnUsage) {
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

/// A turn's usage in the metrics (`tether_tokens_total`, `tether_cost_total`) for the
/// agents of `profile`: its cost, and its tokens when the agent reports each turn's own
/// (`per_turn`; a cumulative agent's are counted once the store took this turn's increase
/// apart).
pub(super) fn count_turn(profile: &str, per_turn: bool, usage: &TurnUsage) {
    if per_turn {
        count_tokens(profile, usage);
    }
    if let Some((amount, currency)) = usage.cost.as_ref().filter(|(amount, _)| *amount > 0.0) {
        let labels = vec![("currency", currency.clone()), ("profile", profile.to_owned())];
        crate::metrics::get().cost.get_or_create(&labels).inc_by(*amount);
    }
}

/// A turn's tokens in the metrics (`tether_tokens_total`).
pub(super) fn count_tokens(profile: &str, usage: &TurnUsage) {
    let metrics = crate::metrics::get();
    for (direction, tokens) in [
        ("input", usage.input_tokens),
        ("output", usage.output_tokens),
        ("cached_read", usage.cached_read_tokens),
        ("cached_write", usage.cached_write_tokens),
        ("thought", usage.thought_tokens),
    ] {
        if tokens > 0 {
            let labels = vec![("direction", direction.to_owned()), ("profile", profile.to_owned())];
            metrics.tokens.get_or_create(&labels).inc_by(tokens);
        }
    }
}

#[cfg(test)]
mod tests;
