//! Usage and budgets: what each turn's agent reported (written with the turn's end), the
//! sums over turns by session, task, profile, workflow or day, and the budgets of sessions
//! and tasks.

use super::{
    Connection, Deserialize, OptionalExtension, Serialize, Store, StoreError, TransactionBehavior,
    params,
};
use crate::ids::SessionId;
use crate::ids::TurnId;
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
    /// Its agent reported tokens (`PromptResponse.usage`). Without a report the token
    /// fields are unknown, not zero: totals say "not reported".
    pub tokens_reported: bool,
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

    /// The tokens by kind, and the agent's total.
    fn tokens(&self) -> Tokens {
        Tokens {
            input: self.input_tokens,
            output: self.output_tokens,
            cached_read: self.cached_read_tokens,
            cached_write: self.cached_write_tokens,
            thought: self.thought_tokens,
            total: self.total_tokens,
        }
    }

    /// The same usage with these tokens.
    fn with_tokens(&self, tokens: Tokens) -> TurnUsage {
        TurnUsage {
            input_tokens: tokens.input,
            output_tokens: tokens.output,
            cached_read_tokens: tokens.cached_read,
            cached_write_tokens: tokens.cached_write,
            thought_tokens: tokens.thought,
            total_tokens: tokens.total,
            ..self.clone()
        }
    }
}

/// One token report (`PromptResponse.usage`): a turn's own, or an agent's running totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Tokens {
    input: u64,
    output: u64,
    cached_read: u64,
    cached_write: u64,
    thought: u64,
    /// The agent's `totalTokens`, when it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    total: Option<u64>,
}

/// A cumulative agent's last running totals (`task_sessions.tokens_mark`): the next
/// report's increase over them is its turn's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct TokensMark {
    /// The ACP session they count (another one counts anew).
    acp_session: Option<String>,
    #[serde(flatten)]
    tokens: Tokens,
}

impl Tokens {
    /// This report's increase over the `mark` of the same ACP session: what the turn used.
    /// A report below the mark in any kind is a new count (the agent's session started
    /// again: a fresh process, a restore that does not keep the count), taken whole, and
    /// so is one of another ACP session or one without a mark.
    fn increase_over(self, mark: Option<&TokensMark>, acp_session: Option<&str>) -> Tokens {
        let Some(mark) = mark.filter(|mark| mark.acp_session.as_deref() == acp_session) else {
            return self;
        };
        let before = mark.tokens;
        let pairs = [
            (self.input, before.input),
            (self.output, before.output),
            (self.cached_read, before.cached_read),
            (self.cached_write, before.cached_write),
            (self.thought, before.thought),
        ];
        let total_fell =
            matches!((self.total, before.total), (Some(now), Some(then)) if now < then);
        if total_fell || pairs.iter().any(|(now, then)| now < then) {
            return self;
        }
        Tokens {
            input: self.input - before.input,
            output: self.output - before.output,
            cached_read: self.cached_read - before.cached_read,
            cached_write: self.cached_write - before.cached_write,
            thought: self.thought - before.thought,
            total: match (self.total, before.total) {
                (Some(now), Some(then)) => Some(now - then),
                // A total now and none before: the sum of the kinds' increases counts.
                _ => None,
            },
        }
    }
}

/// A turn `task.session.retry_turn` may re-send.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryCandidate {
    /// The turn.
    pub turn_id: crate::ids::TurnId,
    /// Its state.
    pub state: protocol::api::TurnState,
    /// Its prompt (`None` for turns recorded before prompts were kept).
    pub prompt: Option<String>,
    /// The turn that re-sent it, if one did.
    pub retried_by: Option<crate::ids::TurnId>,
}

/// Which turns `usage` sums (every field narrows it; turns by when they ended, or began if
/// still running).
#[derive(Debug, Clone, Default)]
pub struct UsageFilter {
    /// One session's.
    pub session_id: Option<SessionId>,
    /// One task's.
    pub task_id: Option<String>,
    /// One profile's.
    pub profile: Option<String>,
    /// One workflow's.
    pub workflow_id: Option<crate::ids::WorkflowId>,
    /// From this time on (Unix ms).
    pub since: Option<i64>,
    /// Before this time (Unix ms).
    pub until: Option<i64>,
}

/// Writes a turn's usage and the session's cost mark (in the transaction ending it). The
/// tokens of an agent whose profile says its reports are running totals
/// (`session.usage_totals = "cumulative"`, read from the session's pinned profile) are
/// this report's increase over the session's token mark, which the report replaces.
pub(super) fn write_turn_usage(
    tx: &rusqlite::Transaction<'_>,
    turn_id: &crate::ids::TurnId,
    session_id: &SessionId,
    usage: &TurnUsage,
) -> rusqlite::Result<()> {
    let taken_apart;
    let usage = match usage.tokens_reported && reports_running_totals(tx, session_id)? {
        true => {
            let (mark, acp_session) = tokens_mark(tx, session_id, turn_id)?;
            let reported = usage.tokens();
            let next = TokensMark { acp_session: acp_session.clone(), tokens: reported };
            tx.execute(
                "UPDATE task_sessions SET tokens_mark = ?2 WHERE id = ?1",
                params![session_id, serde_json::to_string(&next).ok()],
            )?;
            taken_apart =
                usage.with_tokens(reported.increase_over(mark.as_ref(), acp_session.as_deref()));
            &taken_apart
        }
        false => usage,
    };
    tx.execute(
        "UPDATE turns SET input_tokens = ?2, output_tokens = ?3, cached_read_tokens = ?4, \
         cached_write_tokens = ?5, thought_tokens = ?6, total_tokens = ?7, cost = ?8, \
         cost_currency = ?9, context_used = ?10, context_size = ?11, tokens_reported = ?12 \
         WHERE id = ?1",
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
            usage.tokens_reported,
        ],
    )?;
    set_cost_mark(tx, session_id, usage.cost_mark.as_ref())
}

/// Whether the session's pinned profile says its agent reports running totals.
fn reports_running_totals(
    tx: &rusqlite::Transaction<'_>,
    session_id: &SessionId,
) -> rusqlite::Result<bool> {
    let snapshot: Option<String> = tx
        .query_row("SELECT profile_snapshot FROM task_sessions WHERE id = ?1", [session_id], |r| {
            r.get(0)
        })
        .optional()?;
    let reporting: agents::profile::UsageReporting = snapshot
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .and_then(|profile| serde_json::from_value(profile["session"]["usage_totals"].clone()).ok())
        .unwrap_or_default();
    Ok(reporting == agents::profile::UsageReporting::Cumulative)
}

/// The session's token mark, and the ACP session of the execution that ran `turn_id`.
fn tokens_mark(
    tx: &rusqlite::Transaction<'_>,
    session_id: &SessionId,
    turn_id: &crate::ids::TurnId,
) -> rusqlite::Result<(Option<TokensMark>, Option<String>)> {
    let mark: Option<String> = tx
        .query_row("SELECT tokens_mark FROM task_sessions WHERE id = ?1", [session_id], |r| {
            r.get(0)
        })
        .optional()?
        .flatten();
    let acp_session: Option<String> = tx
        .query_row(
            "SELECT e.acp_session_id FROM turns t JOIN executors_running e \
             ON e.session_id = t.session_id AND e.execution_id = t.execution_id WHERE t.id = ?1",
            [turn_id],
            |r| r.get(0),
        )
        .optional()?
        .flatten();
    // A mark that does not read (written by a newer build) is no mark: the report counts whole.
    Ok((mark.and_then(|text| serde_json::from_str(&text).ok()), acp_session))
}

fn set_cost_mark(
    tx: &rusqlite::Transaction<'_>,
    session_id: &SessionId,
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
    pub async fn cost_mark(
        &self,
        session_id: SessionId,
    ) -> Result<Option<(f64, String)>, StoreError> {
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
        session_id: SessionId,
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
            let total = total.map(|group| group.totals).unwrap_or_else(|| UsageTotals {
                turns_with_tokens: Some(0),
                turns_without_tokens: Some(0),
                ..UsageTotals::default()
            });
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

    /// The tokens recorded for the session's newest turn (a cumulative agent's are its
    /// report taken apart), with whether its agent reported any; `None` without a turn.
    pub async fn newest_turn_tokens(
        &self,
        session_id: SessionId,
    ) -> Result<Option<TurnUsage>, StoreError> {
        self.call(move |conn| {
            let row = conn
                .query_row(
                    "SELECT input_tokens, output_tokens, cached_read_tokens, cached_write_tokens, \
                     thought_tokens, total_tokens, tokens_reported FROM turns WHERE session_id = ?1 \
                     ORDER BY started_at DESC, id DESC LIMIT 1",
                    [&session_id],
                    |r| {
                        let n = |i: usize| r.get::<_, i64>(i).map(|v| v.max(0) as u64);
                        Ok(TurnUsage {
                            input_tokens: n(0)?,
                            output_tokens: n(1)?,
                            cached_read_tokens: n(2)?,
                            cached_write_tokens: n(3)?,
                            thought_tokens: n(4)?,
                            total_tokens: Some(n(5)?),
                            tokens_reported: r.get(6)?,
                            ..TurnUsage::default()
                        })
                    },
                )
                .optional()?;
            Ok(row)
        })
        .await
    }

    /// The agent's context use at the end of the session's newest turn that said.
    pub async fn last_context(
        &self,
        session_id: SessionId,
    ) -> Result<Option<(u64, u64)>, StoreError> {
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
        session_id: SessionId,
        turn_id: Option<crate::ids::TurnId>,
    ) -> Result<Option<RetryCandidate>, StoreError> {
        self.call(move |conn| {
            let row: Option<(TurnId, String, Option<String>, Option<TurnId>)> = conn
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
    pub async fn budget_uses(&self, session_id: SessionId) -> Result<Vec<BudgetUse>, StoreError> {
        self.call(move |conn| {
            let task_id: Option<String> = conn
                .query_row("SELECT task_id FROM task_sessions WHERE id = ?1", [&session_id], |r| {
                    r.get(0)
                })
                .optional()?;
            let Some(task_id) = task_id else { return Ok(Vec::new()) };
            let session = use_of(conn, BudgetScope::Session, session_id.into_string())?;
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
    let (used_tokens, used_cost, with, without): (i64, f64, i64, i64) = conn.query_row(
        &format!(
            "SELECT COALESCE(SUM(t.total_tokens), 0), \
             COALESCE(SUM(CASE WHEN t.cost_currency = ?2 THEN t.cost END), 0), \
             COALESCE(SUM(t.tokens_reported), 0), {WITHOUT_TOKENS} \
             FROM turns t JOIN task_sessions s ON s.id = t.session_id WHERE {column} = ?1"
        ),
        params![id, budget.currency()],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )?;
    Ok(Some(BudgetUse {
        turns_with_tokens: with.max(0) as u64,
        turns_without_tokens: without.max(0) as u64,
        ..budget_use(scope, id, budget, used_tokens.max(0) as u64, used_cost)
    }))
}

/// Counts the ended turns whose agent reported no tokens (`t`: the turns).
const WITHOUT_TOKENS: &str = "COALESCE(SUM(CASE WHEN t.ended_at IS NOT NULL AND t.tokens_reported = 0 THEN 1 ELSE 0 END), 0)";

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
    BudgetUse {
        scope,
        id,
        budget,
        used_tokens,
        used_cost,
        percent: tokens.max(cost),
        turns_with_tokens: 0,
        turns_without_tokens: 0,
    }
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
        Some(UsageGroupBy::Turn) => "t.id",
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
         COALESCE(SUM(t.thought_tokens), 0), COALESCE(SUM(t.total_tokens), 0), \
         COALESCE(SUM(t.tokens_reported), 0), {WITHOUT_TOKENS} {from} GROUP BY 1"
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
                turns_with_tokens: Some(n(8)?),
                turns_without_tokens: Some(n(9)?),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(input: u64, output: u64, total: Option<u64>) -> Tokens {
        Tokens { input, output, total, ..Tokens::default() }
    }

    /// A running total's turn is its increase over the mark of the same ACP session; a
    /// report below the mark in any kind, or of another ACP session, counts whole.
    #[test]
    fn running_totals_are_taken_apart_against_the_mark_of_their_session() {
        let mark = TokensMark { acp_session: Some("a".into()), tokens: tokens(100, 20, Some(120)) };
        let report = tokens(250, 50, Some(300));
        assert_eq!(report.increase_over(Some(&mark), Some("a")), tokens(150, 30, Some(180)));
        assert_eq!(report.increase_over(Some(&mark), Some("b")), report, "another session");
        assert_eq!(report.increase_over(None, Some("a")), report, "no mark yet");
        let fell = tokens(250, 10, Some(260));
        assert_eq!(fell.increase_over(Some(&mark), Some("a")), fell, "output fell: a new count");
        let no_total = tokens(250, 50, None);
        assert_eq!(no_total.increase_over(Some(&mark), Some("a")), tokens(150, 30, None));
        let total_fell = tokens(250, 50, Some(100));
        assert_eq!(total_fell.increase_over(Some(&mark), Some("a")), total_fell);
        let mark = TokensMark { acp_session: None, ..mark };
        assert_eq!(report.increase_over(Some(&mark), None), tokens(150, 30, Some(180)));
    }
}
