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
}

impl BudgetUse {
    /// "the session's budget of 1000 tokens is 105% used (1050 tokens, 0.00 USD)".
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
        format!(
            "{scope} budget of {} is {}% used ({} tokens, {:.2} {currency})",
            limits.join(" and "),
            self.percent,
            self.used_tokens,
            self.used_cost,
        )
    }
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
