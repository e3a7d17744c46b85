//! Usage, budgets and re-sending an interrupted turn: `usage.query`, `budget.set` and
//! `task.session.retry_turn`.

use super::{ServiceError, Supervisor};
use crate::ids::SessionId;
use protocol::api::{Budget, BudgetScope, BudgetUse, TurnState, UsageGroupBy, UsageReport};

impl Supervisor {
    /// `usage.query`.
    pub async fn usage(
        &self,
        filter: crate::store::UsageFilter,
        group_by: Option<UsageGroupBy>,
    ) -> Result<UsageReport, ServiceError> {
        Ok(self.config.store.usage(filter, group_by).await?)
    }

    /// `budget.set`: a session's or a task's budget (an empty one removes it); the budget
    /// with what it used.
    pub async fn set_budget(
        &self,
        session_id: Option<SessionId>,
        task_id: Option<String>,
        budget: Budget,
    ) -> Result<Option<BudgetUse>, ServiceError> {
        let (scope, id) = match (session_id, task_id) {
            (Some(session), None) => (BudgetScope::Session, session.into_string()),
            (None, Some(task)) => (BudgetScope::Task, task),
            _ => {
                return Err(ServiceError::InvalidParams {
                    field: "session_id",
                    message: "give one of session_id and task_id".into(),
                });
            }
        };
        let store = &self.config.store;
        store.set_budget(scope, id.clone(), budget).await?;
        Ok(store.budget_use(scope, id).await?)
    }

    /// Refuses work that would spend a task's budget when it is used up: a new session's
    /// first prompt, a workflow's next step (a new session has no budget of its own yet).
    pub(crate) async fn task_within_budget(&self, task_id: &str) -> Result<(), ServiceError> {
        let used = self.config.store.budget_use(BudgetScope::Task, task_id.to_owned()).await?;
        match used.filter(|used| used.percent >= 100) {
            Some(used) => Err(ServiceError::BudgetExceeded(format!(
                "{}; raise it with budget.set first (CLI: supervisor budget --task {task_id} \
                 --tokens N or --cost N)",
                used.describe()
            ))),
            None => Ok(()),
        }
    }

    /// `task.session.retry_turn`: re-sends the prompt of a turn a crash left `interrupted`
    /// (or that failed) as a new turn, once; the new turn's id.
    pub async fn retry_turn(
        &self,
        session_id: SessionId,
        turn_id: Option<crate::ids::TurnId>,
    ) -> Result<crate::ids::TurnId, ServiceError> {
        let row = self.session_row(&session_id).await?;
        if row.state.is_terminal() {
            return Err(ServiceError::Conflict(format!(
                "session {session_id} is {}",
                row.state.as_str()
            )));
        }
        let turn = self.retriable(&session_id, turn_id).await?;
        self.within_budget(&session_id).await?;
        let handle = self.ensure_running(&row).await?;
        Ok(handle.retry(turn.0, turn.1).await?)
    }

    /// The turn to re-send and its prompt, or why not.
    async fn retriable(
        &self,
        session_id: &SessionId,
        turn_id: Option<crate::ids::TurnId>,
    ) -> Result<(crate::ids::TurnId, String), ServiceError> {
        let found = self.config.store.turn_to_retry(session_id.clone(), turn_id.clone()).await?;
        let Some(turn) = found else {
            return Err(ServiceError::NotFound(match turn_id {
                Some(turn) => format!("session {session_id} has no turn {turn}"),
                None => format!("session {session_id} has no turn"),
            }));
        };
        match turn.state {
            TurnState::Interrupted | TurnState::Failed => {}
            TurnState::Completed => {
                return Err(ServiceError::Conflict(format!(
                    "turn {} completed; there is nothing to re-send",
                    turn.turn_id
                )));
            }
            other => {
                return Err(ServiceError::InvalidState(format!(
                    "turn {} is {}; only an interrupted or failed turn is re-sent",
                    turn.turn_id,
                    other.as_str()
                )));
            }
        }
        if let Some(retry) = turn.retried_by {
            return Err(ServiceError::Conflict(format!(
                "turn {} was re-sent already, as turn {retry}",
                turn.turn_id
            )));
        }
        let Some(prompt) = turn.prompt else {
            return Err(ServiceError::InvalidState(format!(
                "turn {}'s prompt was not kept (it was recorded by an older version); send it again",
                turn.turn_id
            )));
        };
        Ok((turn.turn_id, prompt))
    }
}
