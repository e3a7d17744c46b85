//! The choices alone: an open's restore, a caller's choice, an agent's own change.

use serde_json::json;

use super::{Choices, RestoreStep};
use crate::settings::Setting;
use crate::store::ResumeOutcome;

/// What an agent opens with: a model option (small) and a mode (ask).
fn answer() -> serde_json::Value {
    json!({
        "configOptions": [
            {"id": "model", "name": "Model", "category": "model", "type": "select",
             "currentValue": "small",
             "options": [{"value": "small", "name": "S"}, {"value": "large", "name": "L"}]},
        ],
        "modes": {"currentModeId": "ask",
                  "availableModes": [{"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code"}]},
    })
}

fn large() -> Setting {
    Setting::Option { id: "model".into(), value: json!("large") }
}

#[test]
fn an_open_sets_each_lacking_choice_again_then_opens_naming_what_was_refused() {
    let mut choices = Choices::default();
    choices.choose(&large());
    choices.choose(&Setting::Mode("code".into()));
    choices.opened("acp-1".into(), Some(ResumeOutcome::NativeLoad), &answer());
    let send = |setting| RestoreStep::Send { setting, acp_session: "acp-1".into() };
    assert_eq!(choices.next_restore(), Some(send(large())), "options first");
    assert!(choices.answered(&large(), false, &Ok(json!({}))), "a restore's answer");
    assert_eq!(choices.next_restore(), Some(send(Setting::Mode("code".into()))));
    let refused = Err("no such mode".to_owned());
    assert!(choices.answered(&Setting::Mode("code".into()), false, &refused));
    assert_eq!(
        choices.next_restore(),
        Some(RestoreStep::Done {
            acp_session: "acp-1".into(),
            restored: Some(ResumeOutcome::NativeLoad),
            failed: vec!["mode code: no such mode".into()],
        })
    );
    assert_eq!(choices.next_restore(), None, "the restore is over");
    assert_eq!(choices.settings().model(), Some("large"), "the agent's answer was applied");
    assert!(!choices.all_restored(), "the mode is still not as chosen");
}

#[test]
fn an_open_with_nothing_to_restore_is_done_at_once() {
    let mut choices = Choices::default();
    choices.opened("acp-1".into(), None, &answer());
    assert_eq!(
        choices.next_restore(),
        Some(RestoreStep::Done { acp_session: "acp-1".into(), restored: None, failed: vec![] })
    );
    assert!(choices.all_restored());
}

#[test]
fn a_callers_choice_is_answered_to_the_caller_not_to_a_restore() {
    let mut choices = Choices::default();
    choices.opened("acp-1".into(), None, &answer());
    assert!(!choices.answered(&large(), true, &Ok(json!({}))));
    assert_eq!(choices.settings().model(), Some("large"));
    assert!(choices.all_restored(), "chosen and current agree");
    let refused = Err("busy".to_owned());
    assert!(!choices.answered(&Setting::Mode("code".into()), true, &refused));
    assert_eq!(choices.settings().current_mode(), Some("ask"), "a refusal changes nothing");
}

#[test]
fn an_agents_own_change_is_dirty_until_taken_for_writing() {
    let mut choices = Choices::default();
    choices.opened("acp-1".into(), None, &answer());
    assert!(!choices.dirty());
    let update = json!({"sessionUpdate": "current_mode_update", "currentModeId": "code"});
    choices.agent_update(&update, true);
    assert!(choices.dirty());
    assert_eq!(choices.take_for_writing().current_mode(), Some("code"));
    assert!(!choices.dirty(), "clean once taken");
    choices.agent_update(&json!({"sessionUpdate": "plan"}), true);
    assert!(!choices.dirty(), "not a settings update");
}

#[test]
fn a_forgotten_choice_is_no_longer_restored() {
    let mut choices = Choices::default();
    choices.choose(&large());
    choices.forget(&large());
    choices.opened("acp-1".into(), None, &answer());
    assert!(matches!(choices.next_restore(), Some(RestoreStep::Done { .. })));
}
