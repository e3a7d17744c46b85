//! The workflow file: what loads, what it renders, and each refusal with its location.

use super::*;

fn known(agent: &str) -> bool {
    matches!(agent, "mock" | "claude-code")
}

fn load_text(text: &str) -> Result<Spec, SpecError> {
    parse(text, Path::new("/w/flow.toml"), &BTreeMap::new(), &known)
}

fn refusal(text: &str) -> String {
    load_text(text).unwrap_err().to_string()
}

struct Done(BTreeMap<&'static str, &'static str>);

impl Values for Done {
    fn task_title(&self) -> &str {
        "Trailing commas"
    }
    fn task_description(&self) -> &str {
        "the parser"
    }
    fn step_output(&self, step: &str) -> Option<&str> {
        self.0.get(step).copied()
    }
}

const CHAIN: &str = r#"name = "plan-build-review"
[vars]
goal = "make the parser tolerate trailing commas"

[[steps]]
id = "plan"
agent = "mock"
prompt = "Plan this change: {{vars.goal}} ({{ task.title }})"

[[steps]]
id = "build"
agent = "mock"
depends_on = ["plan"]
prompt = "Implement this plan:\n{{steps.plan.output}}"

[[steps]]
id = "review"
agent = "claude-code"
depends_on = ["build"]
prompt = "Review against the plan: {{steps.plan.output}}"
"#;

#[test]
fn a_chain_loads_and_renders_its_references() {
    let spec = load_text(CHAIN).unwrap();
    assert_eq!(spec.name, "plan-build-review");
    assert_eq!(spec.max_parallel, DEFAULT_MAX_PARALLEL);
    let ids: Vec<&str> = spec.steps.iter().map(|step| step.id.as_str()).collect();
    assert_eq!(ids, ["plan", "build", "review"]);
    let done = Done(BTreeMap::from([("plan", "1. find the parser")]));
    assert_eq!(
        spec.steps[0].prompt.render(&spec.vars, &done),
        "Plan this change: make the parser tolerate trailing commas (Trailing commas)"
    );
    assert_eq!(
        spec.steps[1].prompt.render(&spec.vars, &done),
        "Implement this plan:\n1. find the parser"
    );
    // A grandparent's output is there too.
    assert_eq!(spec.steps[2].prompt.steps_used().collect::<Vec<_>>(), ["plan"]);
}

#[test]
fn a_var_given_on_the_command_line_replaces_the_files_and_an_unknown_one_is_refused() {
    let overrides = BTreeMap::from([("goal".to_owned(), "faster".to_owned())]);
    let spec = parse(CHAIN, Path::new("/w/flow.toml"), &overrides, &known).unwrap();
    assert_eq!(spec.vars["goal"], "faster");
    let unknown = BTreeMap::from([("gaol".to_owned(), "x".to_owned())]);
    let err = parse(CHAIN, Path::new("/w/flow.toml"), &unknown, &known).unwrap_err();
    assert_eq!(err.reason, "--var gaol: the file has no variable \"gaol\"");
}

#[test]
fn bad_files_are_refused_with_file_line_and_column() {
    let step = |extra: &str| {
        format!("name = \"x\"\n[[steps]]\nid = \"a\"\nagent = \"mock\"\nprompt = \"p\"\n{extra}")
    };
    let cases: Vec<(String, &str)> = vec![
        (
            step("[[steps]]\nid = \"b\"\nagent = \"nope\"\nprompt = \"p\"\n"),
            "/w/flow.toml:8:9: steps[1].agent: no agent profile \"nope\"",
        ),
        (
            step("depends_on = [\"zz\"]\n"),
            "/w/flow.toml:6:15: steps[0].depends_on: no step \"zz\"",
        ),
        (
            step("[[steps]]\nid = \"a\"\nagent = \"mock\"\nprompt = \"p\"\n"),
            "/w/flow.toml:7:6: steps[1].id: step \"a\" is defined twice",
        ),
        (
            "name = \"x\"\n[[steps]]\nid = \"a\"\nagent = \"mock\"\nprompt = \"say {{vars.nope}}\"\n".into(),
            "/w/flow.toml:5:15: steps[0].prompt: {{vars.nope}}: no variable \"nope\" in [vars]",
        ),
        (
            "name = \"x\"\n[[steps]]\nid = \"a\"\nagent = \"mock\"\nprompt = \"{{steps.b.output}}\"\n[[steps]]\nid = \"b\"\nagent = \"mock\"\nprompt = \"p\"\n".into(),
            "/w/flow.toml:5:10: steps[0].prompt: {{steps.b.output}}: step \"a\" does not depend on \"b\", so its output may not exist yet",
        ),
        (
            "name = \"x\"\n[[steps]]\nid = \"a\"\nagent = \"mock\"\nprompt = \"{{task.owner}}\"\n".into(),
            "/w/flow.toml:5:11: steps[0].prompt: {{task.owner}} is not a reference (vars.NAME, task.title, task.description, steps.ID.output)",
        ),
        (
            "name = \"x\"\n[[steps]]\nid = \"a\"\nagent = \"mock\"\nprompt = \"p\"\ncolour = 1\n".into(),
            "/w/flow.toml:6:1: (file): unknown field `colour`, expected one of `id`, `agent`, `prompt`, `depends_on`",
        ),
        ("name = \"x\"\n".into(), "/w/flow.toml:1:8: steps: a workflow needs at least one step"),
        (
            "name = \"x\"\nmax_parallel = 0\n[[steps]]\nid = \"a\"\nagent = \"mock\"\nprompt = \"p\"\n".into(),
            "/w/flow.toml:2:16: max_parallel: must be at least 1",
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(refusal(&text), expected, "{text}");
    }
}

#[test]
fn a_dependency_cycle_is_named() {
    let text = "name = \"x\"\n[[steps]]\nid = \"a\"\nagent = \"mock\"\nprompt = \"p\"\ndepends_on = [\"c\"]\n\
                [[steps]]\nid = \"b\"\nagent = \"mock\"\nprompt = \"p\"\ndepends_on = [\"a\"]\n\
                [[steps]]\nid = \"c\"\nagent = \"mock\"\nprompt = \"p\"\ndepends_on = [\"b\"]\n";
    assert_eq!(refusal(text), "/w/flow.toml:3:6: steps[0].depends_on: a cycle: a → c → b → a");
}

#[test]
fn ready_steps_follow_the_dependencies_within_max_parallel() {
    let text = "name = \"fan\"\nmax_parallel = 2\n\
                [[steps]]\nid = \"split\"\nagent = \"mock\"\nprompt = \"p\"\n\
                [[steps]]\nid = \"a\"\nagent = \"mock\"\nprompt = \"p\"\ndepends_on = [\"split\"]\n\
                [[steps]]\nid = \"b\"\nagent = \"mock\"\nprompt = \"p\"\ndepends_on = [\"split\"]\n\
                [[steps]]\nid = \"c\"\nagent = \"mock\"\nprompt = \"p\"\ndepends_on = [\"split\"]\n\
                [[steps]]\nid = \"merge\"\nagent = \"mock\"\nprompt = \"{{steps.a.output}} {{steps.c.output}}\"\ndepends_on = [\"a\", \"b\", \"c\"]\n";
    let spec = load_text(text).unwrap();
    let ids = |steps: Vec<&Step>| steps.into_iter().map(|s| s.id.clone()).collect::<Vec<_>>();
    let none = BTreeSet::new();
    assert_eq!(ids(spec.ready(&none, &none)), ["split"]);
    let done = BTreeSet::from(["split"]);
    assert_eq!(ids(spec.ready(&done, &none)), ["a", "b"], "two at once");
    assert_eq!(ids(spec.ready(&done, &BTreeSet::from(["a"]))), ["b"]);
    let done = BTreeSet::from(["split", "a", "b"]);
    assert_eq!(ids(spec.ready(&done, &none)), ["c"], "merge waits for all three");
    let done = BTreeSet::from(["split", "a", "b", "c"]);
    assert_eq!(ids(spec.ready(&done, &none)), ["merge"]);
    let all = BTreeSet::from(["split", "a", "b", "c", "merge"]);
    assert!(spec.ready(&all, &none).is_empty());
}
