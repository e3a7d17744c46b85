//! The workflow file: what loads, what it renders, and each refusal with its location.

use super::*;

fn known(agent: &str) -> bool {
    matches!(agent, "mock" | "claude-code")
}

fn load_text(text: &str) -> Result<Spec, SpecError> {
    parse(text, Path::new("/w/flow.toml"), &BTreeMap::new(), &known, &|runtime| {
        if runtime == "standalone" { Ok(()) } else { Err("there is standalone".into()) }
    })
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
    let spec = parse(CHAIN, Path::new("/w/flow.toml"), &overrides, &known, &|_| Ok(())).unwrap();
    assert_eq!(spec.vars["goal"], "faster");
    let unknown = BTreeMap::from([("gaol".to_owned(), "x".to_owned())]);
    let err = parse(CHAIN, Path::new("/w/flow.toml"), &unknown, &known, &|_| Ok(())).unwrap_err();
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
            "/w/flow.toml:5:11: steps[0].prompt: {{task.owner}} is not a reference (vars.NAME, task.title, task.description, steps.ID.output, item)",
        ),
        (
            "name = \"x\"\n[[steps]]\nid = \"a\"\nagent = \"mock\"\nprompt = \"p\"\ncolour = 1\n".into(),
            "/w/flow.toml:6:1: (file): unknown field `colour`, expected one of `id`, `agent`, `prompt`, `depends_on`, `runtime`, `worktree`, `approval`, `timeout_ms`, `retries`, `loop`, `routes`, `for_each`",
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

const PATTERNS: &str = r#"name = "patterns"
workspace = "/repo"

[[steps]]
id = "triage"
agent = "mock"
prompt = "bug or feature?"
routes = { bug = "fix", feature = "design" }

[[steps]]
id = "fix"
agent = "mock"
depends_on = ["triage"]
prompt = "Fix it. Reviewer said: {{steps.review.output}}"
worktree = "workflow"
retries = 2

[[steps]]
id = "design"
agent = "mock"
depends_on = ["triage"]
prompt = "Design it"
approval = true
timeout_ms = 60000

[[steps]]
id = "review"
agent = "mock"
depends_on = ["fix"]
prompt = "Review: {{steps.fix.output}}"
loop = { back_to = "fix", until = "APPROVED", max_iterations = 4 }

[[steps]]
id = "split"
agent = "mock"
depends_on = ["review", "design"]
prompt = "List the subtasks as JSON"

[[steps]]
id = "work"
agent = "mock"
for_each = "split"
prompt = "Do {{item}}"
worktree = "step"

[[steps]]
id = "merge"
agent = "mock"
depends_on = ["work"]
prompt = "Merge {{steps.work.output}}"
"#;

#[test]
fn loops_routes_workers_and_step_settings_load() {
    let spec = load_text(PATTERNS).unwrap();
    assert_eq!(spec.workspace.as_deref(), Some("/repo"));
    let step = |id: &str| spec.steps.iter().find(|step| step.id == id).unwrap();
    assert_eq!(step("fix").worktree, WorktreeChoice::Workflow);
    assert_eq!(step("fix").retries, 2);
    assert!(step("design").approval);
    assert_eq!(step("design").timeout_ms, Some(60000));
    let repeat = step("review").repeat.clone().unwrap();
    assert_eq!((repeat.back_to.as_str(), repeat.max_iterations), ("fix", 4));
    assert!(repeat.passes("looks good. APPROVED") && !repeat.passes("needs work"));
    // for_each adds its source to the dependencies.
    assert_eq!(step("work").depends_on, ["split"]);
    assert_eq!(step("work").worktree, WorktreeChoice::Step);
    // The earliest marker in the output wins, whatever its case.
    assert_eq!(step("triage").route("A Feature, not a bug").unwrap().1, "design");
    assert_eq!(step("triage").route("bug").unwrap().1, "fix");
    assert!(step("triage").route("neither").is_none());
    let mut done = Done(BTreeMap::new());
    done.0.insert("fix", "patched");
    struct Item<'a>(&'a Done);
    impl Values for Item<'_> {
        fn task_title(&self) -> &str {
            self.0.task_title()
        }
        fn task_description(&self) -> &str {
            self.0.task_description()
        }
        fn step_output(&self, step: &str) -> Option<&str> {
            self.0.step_output(step)
        }
        fn item(&self) -> Option<&str> {
            Some("the lexer")
        }
    }
    assert_eq!(step("work").prompt.render(&spec.vars, &Item(&done)), "Do the lexer");
    // A loop's feedback: empty on the first pass.
    assert_eq!(step("fix").prompt.render(&spec.vars, &done), "Fix it. Reviewer said: ");
}

#[test]
fn a_score_loop_reads_the_first_number() {
    assert_eq!(first_number("score: 7.5/10"), Some(7.5));
    assert_eq!(first_number("-2 points"), Some(-2.0));
    assert_eq!(first_number("none"), None);
    let text = CHAIN.replace(
        "depends_on = [\"plan\"]\nprompt",
        "depends_on = [\"plan\"]\nloop = { back_to = \"plan\", until_score = 8 }\nprompt",
    );
    let spec = load_text(&text).unwrap();
    let repeat = spec.steps[1].repeat.clone().unwrap();
    assert_eq!(repeat.max_iterations, 3);
    assert!(repeat.passes("I rate it 9") && !repeat.passes("7 of 10"));
}

#[test]
fn bad_patterns_are_refused_where_they_are_written() {
    let cases = [
        ("until = \"APPROVED\"", "until_x = \"APPROVED\"", "unknown field `until_x`"),
        ("back_to = \"fix\"", "back_to = \"merge\"", "is not a step \"review\" depends on"),
        ("back_to = \"fix\"", "back_to = \"nope\"", "loop.back_to: no step \"nope\""),
        ("bug = \"fix\"", "bug = \"merge\"", "step \"merge\" must depend on \"triage\""),
        ("for_each = \"split\"", "for_each = \"work\"", "for_each: no other step \"work\""),
        ("Do {{item}}\"\nworktree", "Do\"\nworktree", ""),
        ("prompt = \"Design it\"", "prompt = \"Design {{item}}\"", "this step has no for_each"),
        ("worktree = \"step\"", "worktree = \"mine\"", "worktree: \"mine\": one of"),
        ("timeout_ms = 60000", "timeout_ms = 0", "timeout_ms: must be at least 1"),
        ("retries = 2", "retries = -1", "retries: must be at least 0"),
        ("retries = 2", "retries = 101", "retries: must be at most 100"),
        ("max_iterations = 4", "max_iterations = 101", "loop.max_iterations: must be at most 100"),
    ];
    for (from, to, wanted) in cases {
        assert!(PATTERNS.contains(from), "{from}");
        let text = PATTERNS.replacen(from, to, 1);
        if wanted.is_empty() {
            load_text(&text).unwrap();
            continue;
        }
        let err = refusal(&text);
        assert!(err.starts_with("/w/flow.toml:"), "{err}");
        assert!(err.contains(wanted), "{to}: {err}");
    }
    // A feedback reference to a step outside the loop is not one.
    let text = PATTERNS.replace("Design it", "Design {{steps.review.output}}");
    assert!(refusal(&text).contains("does not depend on \"review\""));
    // No route without a marker condition: a loop needs until or until_score.
    let text = PATTERNS.replace("until = \"APPROVED\", ", "");
    assert!(refusal(&text).contains("a loop needs `until`"));
}

#[test]
fn an_unknown_runtime_is_refused_where_it_is_written() {
    let text = "name = \"x\"\n[[steps]]\nid = \"a\"\nagent = \"mock\"\nruntime = \"nowhere\"\nprompt = \"go\"\n";
    assert_eq!(
        refusal(text),
        "/w/flow.toml:5:11: steps[0].runtime: no runtime \"nowhere\" (there is standalone)"
    );
    assert!(load_text(&text.replace("nowhere", "standalone")).is_ok());
}
