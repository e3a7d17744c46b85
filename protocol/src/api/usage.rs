//! Usage and budgets on the wire: what the agents reported of tokens and cost, summed per
//! turn, session, task, workflow and profile, and the budgets that pause a session.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Token and cost totals over some turns.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UsageTotals {
    /// Turns counted (every turn, whether or not its agent reported usage).
    pub turns: u64,
    /// Input tokens (ACP `PromptResponse.usage.inputTokens`).
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Tokens read from the model's cache.
    pub cached_read_tokens: u64,
    /// Tokens written to the model's cache.
    pub cached_write_tokens: u64,
    /// Thought (reasoning) tokens.
    pub thought_tokens: u64,
    /// All tokens: the agent's `totalTokens`, else the sum of the kinds above. Token
    /// budgets count these.
    pub total_tokens: u64,
    /// Cost by currency (from ACP `usage_update.cost`, cumulative per agent session, taken
    /// apart into what each turn added).
    pub cost: Vec<CostTotal>,
    /// Turns whose agent reported tokens (absent from older daemons). The token figures
    /// are theirs alone: with none (and `turns_without_tokens` above 0) the tokens are
    /// unknown — "not reported", not 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turns_with_tokens: Option<u64>,
    /// Ended turns whose agent reported no tokens (absent from older daemons).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turns_without_tokens: Option<u64>,
}

impl UsageTotals {
    /// Turns ended without a single token report among them: the tokens are unknown.
    pub fn tokens_unknown(&self) -> bool {
        self.turns_with_tokens == Some(0) && self.turns_without_tokens.unwrap_or(0) > 0
    }
}

/// An amount in one currency (or another unit, e.g. `credits`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CostTotal {
    /// ISO 4217 code, or the agent's unit.
    pub currency: String,
    /// The amount.
    pub amount: f64,
}

/// A session's usage, in `task.session.status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionUsage {
    /// Its turns' totals.
    #[serde(flatten)]
    pub totals: UsageTotals,
    /// Tokens in the agent's context, as it last reported (`usage_update.used`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_used: Option<u64>,
    /// The agent's context window, in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_size: Option<u64>,
    /// `context_used` in percent of `context_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_percent: Option<u8>,
    /// The budgets that apply: the session's and its task's, with what they used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<BudgetUse>,
}

/// A token or cost limit (either or both). At 80 % a `budget_warning` event is published;
/// at 100 % the session pauses at its turn's end (`PAUSED` by `budget`), and prompts and
/// resumes are refused with `budget_exceeded` until the budget is raised.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// The most tokens (`total_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// The most cost, in `currency`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    /// The currency of `cost` (default `USD`); only costs in it count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
}

impl Budget {
    /// No limit set.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_none() && self.cost.is_none()
    }

    /// The currency its cost is in.
    pub fn currency(&self) -> &str {
        self.currency.as_deref().unwrap_or("USD")
    }
}

/// What a budget applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BudgetScope {
    /// One session.
    Session,
    /// A task: the sum over all its sessions.
    Task,
}

/// A budget and what was used of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BudgetUse {
    /// What it applies to.
    pub scope: BudgetScope,
    /// The session or task.
    pub id: String,
    /// The limits.
    pub budget: Budget,
    /// Tokens used (`total_tokens`).
    pub used_tokens: u64,
    /// Cost used, in the budget's currency.
    pub used_cost: f64,
    /// The larger of the two, in percent of its limit (100: used up).
    pub percent: u32,
    /// Turns it counts whose agent reported tokens (0 from older daemons).
    #[serde(default)]
    pub turns_with_tokens: u64,
    /// Ended turns it counts whose agent reported none: their tokens are unknown and not
    /// counted (0 from older daemons). With no turn reporting any, a token limit cannot be
    /// checked — only a cost limit stops the session.
    #[serde(default)]
    pub turns_without_tokens: u64,
}

impl BudgetUse {
    /// No turn it counts reported tokens, and some ended: the tokens used are unknown.
    pub fn tokens_unknown(&self) -> bool {
        self.turns_with_tokens == 0 && self.turns_without_tokens > 0
    }

    /// "the session's budget of 1000 tokens is 105% used (1050 tokens, 0.00 USD)"; for a
    /// token limit of turns that reported no tokens, that it cannot be checked.
    pub fn describe(&self) -> String {
        let scope = match self.scope {
            BudgetScope::Session => "the session's",
            BudgetScope::Task => "its task's",
        };
        let currency = self.budget.currency();
        let mut limits = Vec::new();
        if let Some(tokens) = self.budget.tokens {
            limits.push(format!("{tokens} tokens"));
        }
        if let Some(cost) = self.budget.cost {
            limits.push(format!("{cost:.2} {currency}"));
        }
        let tokens = match self.tokens_unknown() {
            true => "tokens not reported".to_owned(),
            false => format!("{} tokens", self.used_tokens),
        };
        let unchecked = match (self.budget.tokens, self.turns_without_tokens) {
            (None, _) | (_, 0) => String::new(),
            _ if self.tokens_unknown() => format!(
                "; its token limit cannot be checked: the agent reported no tokens ({})",
                turns(self.turns_without_tokens)
            ),
            (_, without) => format!("; {} without a token report not counted", turns(without)),
        };
        format!(
            "{scope} budget of {} is {}% used ({tokens}, {:.2} {currency}){unchecked}",
            limits.join(" and "),
            self.percent,
            self.used_cost,
        )
    }
}

/// "1 turn", "2 turns".
fn turns(count: u64) -> String {
    format!("{count} turn{}", if count == 1 { "" } else { "s" })
}

/// How `usage.query` groups its turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum UsageGroupBy {
    /// By session.
    Session,
    /// By task.
    Task,
    /// By agent profile.
    Profile,
    /// By workflow (turns of sessions outside workflows are left out).
    Workflow,
    /// By day (UTC, `YYYY-MM-DD`) of the turn's end.
    Day,
    /// By turn (its id; refused by older daemons).
    Turn,
}

/// `usage.query`'s answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UsageReport {
    /// Over every turn that matched.
    pub total: UsageTotals,
    /// Per group, when `group_by` was given (largest `total_tokens` first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<UsageGroup>,
}

/// One group of a [`UsageReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UsageGroup {
    /// The session, task, profile, workflow id or day.
    pub key: String,
    /// Its totals.
    pub totals: UsageTotals,
}
