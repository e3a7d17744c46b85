//! Usage and budgets: what each turn's agent reported (written with the turn's end), the
//! sums over turns by session, task, profile, workflow or day, and the budgets of sessions
//! and tasks.

use super::*;
use protocol::api::{
    Budget, BudgetScope, BudgetUse, CostTotal, UsageGroup, UsageGroupBy, UsageReport, UsageTotals,
};

/// What a turn's agent reported, written with the turn's end.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnUsage {
    /// Input tokens (`PromptResponse.usage`).
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Cache reads.
    pub cached_read_tokens: u64,
    /// Cache writes.
    pub cached_write_tokens: u64,
    /// Reasoning tokens.
    pub thought_tokens: u64,
    /// The agent's `totalTokens`, when it said.
    pub total_tokens: Option<u64>,
    /// The cost the turn added, and its currency.
    pub cost: Option<(f64, String)>,
    /// The agent's context use at the turn's end: `(used, size)`.
    pub context: Option<(u64, u64)>,
    /// The agent's cumulative cost as of the turn's end: the session's new mark.
    pub cost_mark: Option<(f64, String)>,
}

impl TurnUsage {
    /// The tokens a budget counts: the agent's total, else the sum of the kinds.
    pub fn total(&self) -> u64 {
        self.total_tokens.unwrap_or(
            self.input_tokens
                + self.output_tokens
                + self.cached_read_tokens
                + self.cached_write_tokens
                + self.thought_tokens,
        )
    }
}

/// A turn `task.session.retry_turn` may re-send.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryCandidate {
    /// The turn.
    pub turn_id: String,
    /// Its state.
    pub state: protocol::api::TurnState,
    /// Its prompt (`None` for turns recorded before prompts were kept).
    pub prompt: Option<String>,
    /// The turn that re-sent it, if one did.
    pub retried_by: Option<String>,
}

/// Which turns `usage` sums (every field narrows it; turns by when they ended, or began if
/// still running).
#[derive(Debug, Clone, Default)]
pub struct UsageFilter {
    /// One session's.
    pub session_id: Option<String>,
    /// One task's.
    pub task_id: Option<String>,
    /// One profile's.
    pub profile: Option<String>,
    /// One workflow's.
    pub workflow_id: Option<String>,
    /// From this time on (Unix ms).
    pub since: Option<i64>,
    /// Before this time (Unix ms).
    pub until: Option<i64>,
}

/// Writes a turn's usage and the session's cost mark (in the transaction ending it).
pub(super) fn write_turn_usage(
    tx: &rusqlite::Transaction<'_>,
    turn_id: &str,
    session_id: &str,
    usage: &TurnUsage,
) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE turns SET input_tokens = ?2, output_tokens = ?3, cached_read_tokens = ?4, \
         cached_write_tokens = ?5, thought_tokens = ?6, total_tokens = ?7, cost = ?8, \
         cost_currency = ?9, context_used = ?10, context_size = ?11 WHERE id = ?1",
        params![
            turn_id,
            usage.input_tokens as i64,
            usage.output_tokens as i64,
            usage.cached_read_tokens as i64,
            usage.cached_write_tokens as i64,
            usage.thought_tokens as i64,
            usage.total() as i64,
            usage.cost.as_ref().map(|(amount, _)| *amount),
            usage.cost.as_ref().map(|(_, currency)| currency.as_str()),
            usage.context.map(|(used, _)| used as i64),
            usage.context.map(|(_, size)| size as i64),
        ],
    )?;
    set_cost_mark(tx, session_id, usage.cost_mark.as_ref())
}

fn set_cost_mark(
    tx: &rusqlite::Transaction<'_>,
    session_id: &str,
    mark: Option<&(f64, String)>,
) -> rusqlite::Result<()> {
    if let Some((amount, currency)) = mark {
        tx.execute(
            "UPDATE task_sessions SET cost_mark = ?2, cost_mark_currency = ?3 WHERE id = ?1",
            params![session_id, amount, currency],
        )?;
    }
    Ok(())
}

fn parse_budget(json: Option<String>) -> Result<Option<Budget>, StoreError> {
    json.map(|json| {
        serde_json::from_str(&json)
            .map_err(|err| StoreError::Corrupt { what: "budget", detail: err.to_string() })
    })
    .transpose()
}

impl Store {
    /// The session's cost mark: the agent's cumulative cost last recorded.
    pub async fn cost_mark(&self, session_id: String) -> Result<Option<(f64, String)>, StoreError> {
        self.call(move |conn| {
            let mark: Option<(Option<f64>, Option<String>)> = conn
                .query_row(
                    "SELECT cost_mark, cost_mark_currency FROM task_sessions WHERE id = ?1",
                    [&session_id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            Ok(match mark {
                Some((Some(amount), Some(currency))) => Some((amount, currency)),
                _ => None,
            })
        })
        .await
    }

    /// Cost an agent reported between turns: added to the session's newest turn, with the
    /// new mark, in one write.
    pub async fn add_cost_between_turns(
        &self,
        session_id: String,
        (amount, currency): (f64, String),
        mark: (f64, String),
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "UPDATE turns SET cost = COALESCE(cost, 0) + ?2, cost_currency = ?3 WHERE id = \
                 (SELECT id FROM turns WHERE session_id = ?1 ORDER BY started_at DESC, id DESC LIMIT 1) \
                 AND (cost_currency IS NULL OR cost_currency = ?3)",
                params![session_id, amount, currency],
            )?;
            set_cost_mark(&tx, &session_id, Some(&mark))?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// Sums the turns `filter` selects, in total and, with `group_by`, per group.
    pub async fn usage(
        &self,
        filter: UsageFilter,
        group_by: Option<UsageGroupBy>,
    ) -> Result<UsageReport, StoreError> {
        self.call(move |conn| {
            let total = usage_groups(conn, &filter, None)?.into_iter().next();
            let total = total.map(|group| group.totals).unwrap_or_default();
            let mut groups = match group_by {
                Some(by) => usage_groups(conn, &filter, Some(by))?,
                None => Vec::new(),
            };
            groups.sort_by(|a, b| {
                b.totals.total_tokens.cmp(&a.totals.total_tokens).then(a.key.cmp(&b.key))
            });
            Ok(UsageReport { total, groups })
        })
        .await
    }

    /// The agent's context use at the end of the session's newest turn that said.
    pub async fn last_context(&self, session_id: String) -> Result<Option<(u64, u64)>, StoreError> {
        self.call(move |conn| {
            let context: Option<(i64, i64)> = conn
                .query_row(
                    "SELECT context_used, context_size FROM turns WHERE session_id = ?1 \
                     AND context_size IS NOT NULL ORDER BY started_at DESC, id DESC LIMIT 1",
                    [&session_id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            Ok(context.map(|(used, size)| (used.max(0) as u64, size.max(0) as u64)))
        })
        .await
    }

    /// Sets (or, with an empty budget, removes) a session's or task's budget.
    pub async fn set_budget(
        &self,
        scope: BudgetScope,
        id: String,
        budget: Budget,
    ) -> Result<(), StoreError> {
        let json = (!budget.is_empty()).then(|| serde_json::to_string(&budget)).transpose();
        let json =
            json.map_err(|err| StoreError::Corrupt { what: "budget", detail: err.to_string() })?;
        self.call(move |conn| {
            let (table, what) = match scope {
                BudgetScope::Session => ("task_sessions", "session"),
                BudgetScope::Task => ("tasks", "task"),
            };
            let changed = conn.execute(
                &format!("UPDATE {table} SET budget = ?2 WHERE id = ?1"),
                params![id, json],
            )?;
            if changed == 0 {
                return Err(StoreError::NotFound { what, id });
            }
            Ok(())
        })
        .await
    }

    /// A session's turn to re-send (its newest when `turn_id` is absent): its state,
    /// prompt and the turn that re-sent it already, if any.
    pub async fn turn_to_retry(
        &self,
        session_id: String,
        turn_id: Option<String>,
    ) -> Result<Option<RetryCandidate>, StoreError> {
        self.call(move |conn| {
            let row: Option<(String, String, Option<String>, Option<String>)> = conn
                .query_row(
                    "SELECT t.id, t.state, t.prompt, (SELECT r.id FROM turns r WHERE r.retry_of = t.id) \
                     FROM turns t WHERE t.session_id = ?1 AND (?2 IS NULL OR t.id = ?2) \
                     ORDER BY t.started_at DESC, t.id DESC LIMIT 1",
                    params![session_id, turn_id],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                )
                .optional()?;
            row.map(|(turn_id, state, prompt, retried_by)| {
                let state = state.parse().map_err(|detail| StoreError::Corrupt { what: "turn state", detail })?;
                Ok(RetryCandidate { turn_id, state, prompt, retried_by })
            })
            .transpose()
        })
        .await
    }

    /// The budgets that apply to a session (its own, then its task's) with what they used.
    pub async fn budget_uses(&self, session_id: String) -> Result<Vec<BudgetUse>, StoreError> {
        self.call(move |conn| {
            let task_id: Option<String> = conn
                .query_row("SELECT task_id FROM task_sessions WHERE id = ?1", [&session_id], |r| {
                    r.get(0)
                })
                .optional()?;
            let Some(task_id) = task_id else { return Ok(Vec::new()) };
            let session = use_of(conn, BudgetScope::Session, session_id)?;
            let task = use_of(conn, BudgetScope::Task, task_id)?;
            Ok(session.into_iter().chain(task).collect())
        })
        .await
    }

    /// A session's or a task's budget with what it used (`None`: it has none).
    pub async fn budget_use(
        &self,
        scope: BudgetScope,
        id: String,
    ) -> Result<Option<BudgetUse>, StoreError> {
        self.call(move |conn| use_of(conn, scope, id)).await
    }
}

/// `scope` `id`'s budget and what its turns used of it.
fn use_of(
    conn: &Connection,
    scope: BudgetScope,
    id: String,
) -> Result<Option<BudgetUse>, StoreError> {
    let (table, column) = match scope {
        BudgetScope::Session => ("task_sessions", "t.session_id"),
        BudgetScope::Task => ("tasks", "s.task_id"),
    };
    let json: Option<Option<String>> = conn
        .query_row(&format!("SELECT budget FROM {table} WHERE id = ?1"), [&id], |r| r.get(0))
        .optional()?;
    let Some(budget) = parse_budget(json.flatten())? else { return Ok(None) };
    let (used_tokens, used_cost): (i64, f64) = conn.query_row(
        &format!(
            "SELECT COALESCE(SUM(t.total_tokens), 0), \
             COALESCE(SUM(CASE WHEN t.cost_currency = ?2 THEN t.cost END), 0) \
             FROM turns t JOIN task_sessions s ON s.id = t.session_id WHERE {column} = ?1"
        ),
        params![id, budget.currency()],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok(Some(budget_use(scope, id, budget, used_tokens.max(0) as u64, used_cost)))
}

/// A budget's use, with its percent: the larger of tokens and cost (rounded down).
pub fn budget_use(
    scope: BudgetScope,
    id: String,
    budget: Budget,
    used_tokens: u64,
    used_cost: f64,
) -> BudgetUse {
    let tokens = budget.tokens.map_or(0, |limit| {
        (used_tokens.saturating_mul(100))
            .checked_div(limit)
            .map_or(u32::MAX, |percent| percent.min(u64::from(u32::MAX)) as u32)
    });
    let cost = budget.cost.map_or(0, |limit| {
        if limit <= 0.0 {
            u32::MAX
        } else {
            (used_cost * 100.0 / limit).floor().clamp(0.0, f64::from(u32::MAX)) as u32
        }
    });
    BudgetUse { scope, id, budget, used_tokens, used_cost, percent: tokens.max(cost) }
}

/// Sums per group (`None`: one group, all of them).
fn usage_groups(
    conn: &Connection,
    filter: &UsageFilter,
    group_by: Option<UsageGroupBy>,
) -> Result<Vec<UsageGroup>, StoreError> {
    let key = match group_by {
        None => "''",
        Some(UsageGroupBy::Session) => "t.session_id",
        Some(UsageGroupBy::Task) => "s.task_id",
        Some(UsageGroupBy::Profile) => "s.agent_profile_id",
        Some(UsageGroupBy::Workflow) => "w.workflow_id",
        Some(UsageGroupBy::Day) => {
            "strftime('%Y-%m-%d', COALESCE(t.ended_at, t.started_at) / 1000, 'unixepoch')"
        }
    };
    let workflow_only = if group_by == Some(UsageGroupBy::Workflow) {
        " AND w.workflow_id IS NOT NULL"
    } else {
        ""
    };
    let from = format!(
        "FROM turns t JOIN task_sessions s ON s.id = t.session_id \
         LEFT JOIN workflow_steps w ON w.session_id = t.session_id \
         WHERE (?1 IS NULL OR t.session_id = ?1) AND (?2 IS NULL OR s.task_id = ?2) \
         AND (?3 IS NULL OR s.agent_profile_id = ?3) AND (?4 IS NULL OR w.workflow_id = ?4) \
         AND (?5 IS NULL OR COALESCE(t.ended_at, t.started_at) >= ?5) \
         AND (?6 IS NULL OR COALESCE(t.ended_at, t.started_at) < ?6){workflow_only}"
    );
    let args = params![
        filter.session_id,
        filter.task_id,
        filter.profile,
        filter.workflow_id,
        filter.since,
        filter.until
    ];
    let mut groups: Vec<UsageGroup> = Vec::new();
    let mut stmt = conn.prepare(&format!(
        "SELECT {key}, count(*), COALESCE(SUM(t.input_tokens), 0), COALESCE(SUM(t.output_tokens), 0), \
         COALESCE(SUM(t.cached_read_tokens), 0), COALESCE(SUM(t.cached_write_tokens), 0), \
         COALESCE(SUM(t.thought_tokens), 0), COALESCE(SUM(t.total_tokens), 0) {from} GROUP BY 1"
    ))?;
    let rows = stmt.query_map(args, |r| {
        let n = |i: usize| r.get::<_, i64>(i).map(|v| v.max(0) as u64);
        Ok(UsageGroup {
            key: r.get::<_, Option<String>>(0)?.unwrap_or_default(),
            totals: UsageTotals {
                turns: n(1)?,
                input_tokens: n(2)?,
                output_tokens: n(3)?,
                cached_read_tokens: n(4)?,
                cached_write_tokens: n(5)?,
                thought_tokens: n(6)?,
                total_tokens: n(7)?,
                cost: Vec::new(),
            },
        })
    })?;
    for row in rows {
        groups.push(row?);
    }
    let mut stmt = conn.prepare(&format!(
        "SELECT {key}, t.cost_currency, SUM(t.cost) {from} AND t.cost IS NOT NULL \
         GROUP BY 1, 2 ORDER BY 2"
    ))?;
    let costs = stmt.query_map(args, |r| {
        Ok((r.get::<_, Option<String>>(0)?.unwrap_or_default(), r.get::<_, String>(1)?, r.get(2)?))
    })?;
    for cost in costs {
        let (key, currency, amount) = cost?;
        if let Some(group) = groups.iter_mut().find(|group| group.key == key) {
            group.totals.cost.push(CostTotal { currency, amount });
        }
    }
    Ok(groups)
}
