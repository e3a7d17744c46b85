//! The meter alone: usage reports, cost marks, budgets and limits — tables, no actor.

use protocol::api::{Budget, BudgetScope, BudgetUse, SnapshotTrigger};
use serde_json::json;

use super::{BudgetNews, ContextReport, ContextWarning, Due, Meter, prompt_usage};
use crate::store::TurnUsage;

fn report(used: u64, size: u64) -> ContextReport {
    ContextReport { used, size, cost: None }
}

fn costing(amount: f64, currency: &str) -> ContextReport {
    ContextReport { used: 1, size: 100, cost: Some((amount, currency.to_owned())) }
}

#[test]
fn a_usage_update_is_read_with_its_cost_and_without_a_bad_one() {
    let cases = [
        (json!({"used": 5, "size": 10}), Some(report(5, 10))),
        (
            json!({"used": 5, "size": 10, "cost": {"amount": 0.5}}),
            Some(ContextReport { cost: Some((0.5, "USD".into())), ..report(5, 10) }),
        ),
        (
            json!({"used": 5, "size": 10, "cost": {"amount": 2.0, "currency": "EUR"}}),
            Some(ContextReport { cost: Some((2.0, "EUR".into())), ..report(5, 10) }),
        ),
        (json!({"used": 5, "size": 10, "cost": {"amount": -1.0}}), Some(report(5, 10))),
        (json!({"used": 5}), None),
        (json!({"size": 10}), None),
        (json!({"used": "5", "size": 10}), None),
    ];
    for (update, expected) in cases {
        assert_eq!(ContextReport::parse(&update), expected, "{update}");
    }
}

#[test]
fn the_context_warning_is_said_once_until_the_context_drops_below_its_mark() {
    // Threshold 80: the mark is 70.
    let mut meter = Meter::default();
    let said = |meter: &mut Meter, used| meter.on_report(&report(used, 100), 80, None);
    assert_eq!(said(&mut meter, 50), None);
    assert_eq!(
        said(&mut meter, 72),
        Some(ContextWarning { used: 72, size: 100, percent: 72, threshold: 80 })
    );
    assert_eq!(said(&mut meter, 75), None, "said once");
    assert_eq!(said(&mut meter, 10), None, "below the mark: armed again");
    assert!(said(&mut meter, 71).is_some(), "said again after a fresh start");
    assert_eq!(meter.context(), Some((71, 100)));
    assert_eq!(meter.take_handoff(), None, "nothing at the threshold yet");
}

#[test]
fn the_threshold_makes_a_handoff_due_once_per_report_and_none_without_a_threshold() {
    let mut meter = Meter::default();
    assert_eq!(meter.on_report(&report(90, 100), 80, None), None, "past the warning band");
    assert_eq!(meter.take_due(), Due::default(), "a handoff is taken on its own");
    assert_eq!(
        meter.take_handoff().as_deref(),
        Some("the agent's context is 90% full (90 of 100 tokens; the threshold is 80%)")
    );
    assert_eq!(meter.take_handoff(), None, "taken");
    meter.on_report(&report(100, 100), 0, None);
    meter.on_report(&report(100, 0), 80, None);
    assert_eq!(meter.take_handoff(), None, "no threshold, or no size: no handoff");
}

#[test]
fn a_handoff_forgets_the_context_until_the_new_agent_reports() {
    let mut meter = Meter::default();
    meter.on_report(&report(90, 100), 80, None);
    meter.forget_context();
    assert_eq!(meter.context(), None);
    assert!(meter.usage().is_some(), "the figures are known to be empty, not unknown");
}

#[test]
fn cost_in_a_turn_is_the_turns_and_between_turns_is_due_for_the_newest() {
    let mut meter = Meter::default();
    meter.load_cost_mark(Some((1.0, "USD".into())));
    let mut turn = TurnUsage::default();
    meter.on_report(&costing(1.5, "USD"), 0, Some(&mut turn));
    meter.on_report(&costing(2.0, "USD"), 0, Some(&mut turn));
    assert_eq!(turn.cost, Some((1.0, "USD".into())), "what the turn added past the mark");
    assert_eq!(turn.cost_mark, Some((2.0, "USD".into())));
    assert_eq!(turn.context, Some((1, 100)));
    assert_eq!(meter.take_due(), Due::default(), "written with the turn's end");

    meter.on_report(&costing(2.25, "USD"), 0, None);
    meter.on_report(&costing(2.5, "USD"), 0, None);
    let due = meter.take_due();
    assert_eq!(due.cost_between_turns, Some(((0.5, "USD".into()), (2.5, "USD".into()))));
}

#[test]
fn a_cost_below_the_mark_or_in_another_currency_is_a_new_count() {
    let mut meter = Meter::default();
    meter.load_cost_mark(Some((5.0, "USD".into())));
    meter.on_report(&costing(0.25, "USD"), 0, None);
    assert_eq!(
        meter.take_due().cost_between_turns,
        Some(((0.25, "USD".into()), (0.25, "USD".into()))),
        "a fresh agent session counts from zero"
    );
    meter.on_report(&costing(3.0, "EUR"), 0, None);
    meter.on_report(&costing(0.0, "EUR"), 0, None);
    assert_eq!(
        meter.take_due().cost_between_turns,
        Some(((3.0, "EUR".into()), (3.0, "EUR".into()))),
        "nothing added leaves what is due; the mark of the report that added stands"
    );
    let mut turn = TurnUsage { cost: Some((1.0, "USD".into())), ..TurnUsage::default() };
    meter.on_report(&costing(2.0, "EUR"), 0, Some(&mut turn));
    assert_eq!(turn.cost, Some((1.0, "USD".into())), "another currency is not added in");
    assert_eq!(turn.cost_mark, Some((2.0, "EUR".into())));
}

fn budget_use(tokens: u64, used: u64, without: u64) -> BudgetUse {
    let budget = Budget { tokens: Some(tokens), ..Budget::default() };
    BudgetUse {
        turns_with_tokens: u64::from(without == 0),
        turns_without_tokens: without,
        ..crate::store::budget_use(BudgetScope::Session, "s".into(), budget, used, 0.0)
    }
}

fn turn_of(tokens: u64) -> TurnUsage {
    TurnUsage { total_tokens: Some(tokens), tokens_reported: true, ..TurnUsage::default() }
}

fn warnings(news: &[BudgetNews]) -> usize {
    news.iter().filter(|news| matches!(news, BudgetNews::Warning(_))).count()
}

#[test]
fn a_budget_warns_as_it_passes_eighty_percent_and_pauses_when_used_up() {
    let mut meter = Meter::default();
    let news = meter.judge_budgets(vec![budget_use(100, 85, 0)], &turn_of(10), false);
    assert_eq!(warnings(&news), 1, "75 % before, 85 % after");
    let news = meter.judge_budgets(vec![budget_use(100, 90, 0)], &turn_of(5), false);
    assert_eq!(warnings(&news), 0, "past 80 % already");
    assert_eq!(meter.take_due(), Due::default());

    let news = meter.judge_budgets(vec![budget_use(100, 100, 0)], &turn_of(10), false);
    assert_eq!(warnings(&news), 0, "used up: a pause, not a warning");
    let limit = meter.take_due().limit.expect("a pause is due");
    assert_eq!(limit.1, SnapshotTrigger::Budget);
    assert!(limit.0.ends_with("(raise it with budget.set)"), "{}", limit.0);

    meter.judge_budgets(vec![budget_use(100, 100, 0)], &turn_of(10), true);
    assert_eq!(meter.take_due(), Due::default(), "a pause waits already");
}

#[test]
fn a_token_budget_whose_turns_report_no_tokens_is_said_once_in_the_budgets_order() {
    let mut meter = Meter::default();
    let silent = TurnUsage::default();
    let news = meter.judge_budgets(vec![budget_use(100, 0, 1)], &silent, false);
    assert!(matches!(news.as_slice(), [BudgetNews::Unchecked(_)]), "{news:?}");
    let news = meter.judge_budgets(vec![budget_use(100, 0, 2)], &silent, false);
    assert!(news.is_empty(), "said at the first such turn only");
    // Each budget's news together, budget by budget.
    let cost = protocol::api::Budget { cost: Some(1.0), ..protocol::api::Budget::default() };
    let passing = crate::store::budget_use(BudgetScope::Task, "t".into(), cost, 0, 0.85);
    let silent = TurnUsage { cost: Some((0.1, "USD".into())), ..TurnUsage::default() };
    let news = meter.judge_budgets(vec![passing, budget_use(100, 0, 1)], &silent, false);
    assert!(
        matches!(news.as_slice(), [BudgetNews::Warning(_), BudgetNews::Unchecked(_)]),
        "{news:?}"
    );
}

#[test]
fn turns_and_age_limits_pause_and_the_first_limit_stands() {
    let mut meter = Meter::default();
    meter.judge_turns(2, 3);
    meter.judge_age(999, 1);
    assert_eq!(meter.take_due(), Due::default(), "under both limits");
    meter.judge_turns(3, 3);
    meter.judge_age(1000, 1);
    let limit = meter.take_due().limit.expect("due");
    assert_eq!(
        limit,
        ("the session ran its 3 turns (session.max_turns)".into(), SnapshotTrigger::MaxTurns)
    );
    meter.judge_age(i64::MAX, u64::MAX);
    assert_eq!(meter.take_due().limit.map(|l| l.1), Some(SnapshotTrigger::MaxDuration));
}

#[test]
fn a_prompt_responses_usage_is_read_and_a_response_without_figures_reports_none() {
    let mut usage = TurnUsage::default();
    let result = json!({"stopReason": "end_turn", "usage": {"inputTokens": 120,
        "outputTokens": 30, "cachedReadTokens": 100, "thoughtTokens": 7, "totalTokens": 257}});
    prompt_usage(&result, &mut usage);
    assert!(usage.tokens_reported);
    let figures = (usage.input_tokens, usage.output_tokens, usage.cached_read_tokens);
    assert_eq!(figures, (120, 30, 100));
    assert_eq!((usage.cached_write_tokens, usage.thought_tokens), (0, 7), "missing is zero");
    assert_eq!(usage.total_tokens, Some(257));
    // No figure at all: the turn's tokens are unknown, not zero.
    for result in [json!({"stopReason": "end_turn"}), json!({"usage": {"inputTokens": "12"}})] {
        let mut usage = TurnUsage::default();
        prompt_usage(&result, &mut usage);
        assert!(!usage.tokens_reported, "{result}");
        assert_eq!(usage.total_tokens, None);
    }
}
