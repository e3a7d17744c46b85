//! The workflow file (TOML): a name, variables, and steps — each an agent profile, a prompt
//! template and the steps it depends on. Loading checks everything that can be checked
//! without running: step ids, dependencies (known, no cycle), and every template reference
//! (`{{vars.NAME}}`, `{{task.title}}`, `{{task.description}}`, `{{steps.ID.output}}` of a
//! step it depends on, directly or not). Each error names `file:line:col` and the field.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

/// The most steps that run at once, by default (`max_parallel`).
pub const DEFAULT_MAX_PARALLEL: usize = 4;

/// The longest workflow file, in bytes: what the CLI reads and the API takes.
pub const MAX_FILE: usize = protocol::api::params::MAX_SPEC;

/// The longest prompt, in bytes, as the API takes one: a step's, its references filled.
pub const MAX_PROMPT: usize = protocol::api::params::MAX_PROMPT;

/// The most passes of a loop (`loop.max_iterations`): each is a new session per step of
/// its body.
pub const MAX_ITERATIONS: i64 = 100;

/// The most workers a `for_each` step may have (the items of its source's list): each is
/// a session of its own.
pub const MAX_WORKERS: usize = 100;

/// The most launch retries of a step (`retries`).
pub const MAX_RETRIES: i64 = 100;

/// Why a workflow file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// It cannot be opened or read.
    #[error("cannot read {}: {source}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is longer than [`MAX_FILE`] (`/dev/zero` is).
    #[error("{} is over the 1 MiB a workflow file may be", path.display())]
    TooLong {
        /// The file.
        path: PathBuf,
    },
    /// It is not UTF-8.
    #[error("{} is not UTF-8 text", path.display())]
    NotText {
        /// The file.
        path: PathBuf,
    },
}

/// Reads a workflow file, at most [`MAX_FILE`] bytes of it: a longer one (or an endless
/// one) is refused without reading more.
pub fn read_file(path: &Path) -> Result<String, ReadError> {
    use std::io::Read;
    let unreadable = |source| ReadError::Unreadable { path: path.to_owned(), source };
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE as u64 + 1).read_to_end(&mut bytes).map_err(unreadable)?;
    if bytes.len() > MAX_FILE {
        return Err(ReadError::TooLong { path: path.to_owned() });
    }
    String::from_utf8(bytes).map_err(|_| ReadError::NotText { path: path.to_owned() })
}

/// Why a workflow file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}:{column}: {field}: {reason}", file.display())]
pub struct SpecError {
    /// The file.
    pub file: PathBuf,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// The dotted field (`steps[1].prompt`), or `(file)`.
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

/// A loaded, checked workflow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Its name.
    pub name: String,
    /// Its variables, after `--var` overrides.
    pub vars: BTreeMap<String, String>,
    /// The most steps that run at once.
    pub max_parallel: usize,
    /// Where the steps work (the repository of their worktrees), as written.
    pub workspace: Option<String>,
    /// The steps, in file order.
    pub steps: Vec<Step>,
}

/// One step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Unique in the workflow.
    pub id: String,
    /// The agent profile that runs it.
    pub agent: String,
    /// What it is asked.
    pub prompt: Template,
    /// The steps that complete before it starts.
    pub depends_on: Vec<String>,
    /// The runtime its session runs on (else its profile's).
    pub runtime: Option<String>,
    /// Where it works.
    pub worktree: WorktreeChoice,
    /// It waits for `workflow approve` before it starts.
    pub approval: bool,
    /// How long its turn may run, ms (then it is cancelled and the step fails).
    pub timeout_ms: Option<u64>,
    /// Failed launches of its session tolerated (each launches it again).
    pub retries: u32,
    /// Go back to an earlier step until the output says so.
    pub repeat: Option<Loop>,
    /// Routes: a marker in its output → the step that runs (the other routes' steps are
    /// skipped), in file order.
    pub routes: Vec<(String, String)>,
    /// Run once per item of this step's output (a JSON list): a worker per item.
    pub for_each: Option<String>,
}

/// Where a step's session works.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorktreeChoice {
    /// In the workflow's workspace itself.
    #[default]
    None,
    /// In a git worktree of its own.
    Step,
    /// In the one git worktree the workflow's steps share.
    Workflow,
}

/// A loop: after its step completes, unless its output passes, the steps from `back_to`
/// to it run again (at most `max_iterations` passes in all).
#[derive(Debug, Clone, PartialEq)]
pub struct Loop {
    /// The step the loop goes back to (the step itself or one it depends on).
    pub back_to: String,
    /// The output passes when it contains this.
    pub until: Option<String>,
    /// The output passes when the first number in it is at least this.
    pub until_score: Option<f64>,
    /// Passes at most (the first included).
    pub max_iterations: u32,
}

impl Eq for Loop {}

impl Loop {
    /// Whether `output` ends the loop.
    pub fn passes(&self, output: &str) -> bool {
        if let Some(marker) = &self.until
            && output.contains(marker.as_str())
        {
            return true;
        }
        self.until_score
            .is_some_and(|threshold| first_number(output).is_some_and(|n| n >= threshold))
    }
}

/// The first number written in `text` (`8`, `8.5`, `-1`).
pub fn first_number(text: &str) -> Option<f64> {
    let bytes = text.as_bytes();
    let start = bytes.iter().position(u8::is_ascii_digit)?;
    let start = if start > 0 && bytes[start - 1] == b'-' { start - 1 } else { start };
    let mut end = start + 1;
    let mut dot = false;
    while end < bytes.len() {
        match bytes[end] {
            b'0'..=b'9' => {}
            b'.' if !dot && bytes.get(end + 1).is_some_and(u8::is_ascii_digit) => dot = true,
            _ => break,
        }
        end += 1;
    }
    text[start..end].parse().ok()
}

impl Step {
    /// The route `output` chooses: the route whose marker appears first in it (case
    /// insensitive; at the same place, the longer marker).
    pub fn route(&self, output: &str) -> Option<&(String, String)> {
        let lower = output.to_lowercase();
        self.routes
            .iter()
            .filter_map(|route| lower.find(&route.0.to_lowercase()).map(|at| (at, route)))
            .min_by(|(a, x), (b, y)| a.cmp(b).then(y.0.len().cmp(&x.0.len())))
            .map(|(_, route)| route)
    }
}

/// A prompt with references, checked at load time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Var(String),
    TaskTitle,
    TaskDescription,
    StepOutput(String),
    Item,
}

/// What a template is filled from when its step starts.
pub trait Values {
    /// The task's title.
    fn task_title(&self) -> &str;
    /// The task's description.
    fn task_description(&self) -> &str;
    /// A completed step's output (its final agent message).
    fn step_output(&self, step: &str) -> Option<&str>;
    /// A `for_each` worker's item.
    fn item(&self) -> Option<&str> {
        None
    }
}

/// Nothing known yet: every reference but a variable is empty.
struct NoValues;

impl Values for NoValues {
    fn task_title(&self) -> &str {
        ""
    }
    fn task_description(&self) -> &str {
        ""
    }
    fn step_output(&self, _: &str) -> Option<&str> {
        None
    }
}

impl Template {
    /// How long [`Template::render`] would make it, in bytes, without making it (a
    /// template may repeat a long output many times).
    pub fn filled_len(&self, vars: &BTreeMap<String, String>, values: &dyn Values) -> usize {
        self.parts
            .iter()
            .map(|part| match part {
                Part::Text(literal) => literal.len(),
                Part::Var(name) => vars.get(name).map_or(0, String::len),
                Part::TaskTitle => values.task_title().len(),
                Part::TaskDescription => values.task_description().len(),
                Part::StepOutput(step) => values.step_output(step).map_or(0, str::len),
                Part::Item => values.item().map_or(0, str::len),
            })
            .fold(0, usize::saturating_add)
    }

    /// The prompt, every reference filled (`vars` from the spec).
    pub fn render(&self, vars: &BTreeMap<String, String>, values: &dyn Values) -> String {
        let mut text = String::new();
        for part in &self.parts {
            match part {
                Part::Text(literal) => text.push_str(literal),
                Part::Var(name) => text.push_str(vars.get(name).map_or("", String::as_str)),
                Part::TaskTitle => text.push_str(values.task_title()),
                Part::TaskDescription => text.push_str(values.task_description()),
                Part::StepOutput(step) => text.push_str(values.step_output(step).unwrap_or("")),
                Part::Item => text.push_str(values.item().unwrap_or("")),
            }
        }
        text
    }

    /// Whether it reads variable `name`.
    pub fn uses_var(&self, name: &str) -> bool {
        self.parts.iter().any(|part| matches!(part, Part::Var(var) if var == name))
    }

    /// The steps whose output it uses.
    pub fn steps_used(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|part| match part {
            Part::StepOutput(step) => Some(step.as_str()),
            _ => None,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    name: Spanned<String>,
    #[serde(default)]
    vars: BTreeMap<Spanned<String>, Spanned<String>>,
    max_parallel: Option<Spanned<i64>>,
    workspace: Option<Spanned<String>>,
    #[serde(default)]
    steps: Vec<Spanned<RawStep>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLoop {
    back_to: Spanned<String>,
    until: Option<Spanned<String>>,
    until_score: Option<f64>,
    max_iterations: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStep {
    id: Spanned<String>,
    agent: Spanned<String>,
    prompt: Spanned<String>,
    #[serde(default)]
    depends_on: Vec<Spanned<String>>,
    runtime: Option<Spanned<String>>,
    worktree: Option<Spanned<String>>,
    #[serde(default)]
    approval: bool,
    timeout_ms: Option<Spanned<i64>>,
    retries: Option<Spanned<i64>>,
    #[serde(rename = "loop")]
    repeat: Option<Spanned<RawLoop>>,
    #[serde(default)]
    routes: BTreeMap<String, Spanned<String>>,
    for_each: Option<Spanned<String>>,
}

/// Loads the workflow file at `path`, with `overrides` (`--var NAME=VALUE`) replacing its
/// variables; `known_agent` says whether an agent profile id exists, `known_runtime`
/// whether a runtime does (else which there are).
pub fn load(
    path: &Path,
    overrides: &BTreeMap<String, String>,
    known_agent: &dyn Fn(&str) -> bool,
    known_runtime: &dyn Fn(&str) -> Result<(), String>,
) -> Result<Spec, SpecError> {
    let text = read_file(path).map_err(|err| SpecError {
        file: path.to_owned(),
        line: 1,
        column: 1,
        field: "(file)".into(),
        reason: err.to_string(),
    })?;
    parse(&text, path, overrides, known_agent, known_runtime)
}

/// Parses and checks a workflow file's text (see [`load`]).
pub fn parse(
    text: &str,
    file: &Path,
    overrides: &BTreeMap<String, String>,
    known_agent: &dyn Fn(&str) -> bool,
    known_runtime: &dyn Fn(&str) -> Result<(), String>,
) -> Result<Spec, SpecError> {
    let locator = Locator { text, file };
    let raw: RawSpec = toml::from_str(text).map_err(|err| {
        let span = err.span().unwrap_or(0..0);
        locator.fail(span, "(file)", err.message().to_owned())
    })?;
    if raw.name.get_ref().trim().is_empty() {
        return Err(locator.fail(raw.name.span(), "name", "must not be empty".into()));
    }
    let max_parallel = max_parallel(&locator, raw.max_parallel.as_ref())?;
    let vars = variables(&locator, &raw.vars, overrides)?;
    if raw.steps.is_empty() {
        return Err(locator.fail(
            raw.name.span(),
            "steps",
            "a workflow needs at least one step".into(),
        ));
    }
    let ids: BTreeSet<&str> =
        raw.steps.iter().map(|step| step.get_ref().id.get_ref().as_str()).collect();
    let known = Known { ids: &ids, vars: &vars, agent: known_agent, runtime: known_runtime };
    let mut seen = BTreeSet::new();
    let mut steps = Vec::new();
    for (index, step) in raw.steps.iter().enumerate() {
        steps.push(check_step(&locator, &known, index, step.get_ref(), &mut seen)?);
    }
    check_cycle(&locator, &raw.steps, &steps)?;
    for (index, step) in steps.iter().enumerate() {
        let raw_step = raw.steps[index].get_ref();
        if let Some(repeat) = &step.repeat {
            check_loop(&locator, &steps, index, step, repeat, raw_step)?;
        }
        check_routes(&locator, &steps, index, step, raw_step)?;
    }
    check_outputs_used(&locator, &raw.steps, &steps)?;
    let workspace = raw.workspace.map(Spanned::into_inner);
    Ok(Spec { name: raw.name.into_inner(), vars, max_parallel, workspace, steps })
}

/// The file's text and name, to locate its errors.
struct Locator<'a> {
    text: &'a str,
    file: &'a Path,
}

impl Locator<'_> {
    /// An error at `span`, for `field`.
    fn fail(&self, span: Range<usize>, field: &str, reason: String) -> SpecError {
        let (line, column, _) = agents::profile::toml_location(self.text, span.start);
        SpecError { file: self.file.to_owned(), line, column, field: field.to_owned(), reason }
    }
}

/// What a step's names are checked against: the file's step ids and variables, and the
/// agent profiles and runtimes there are.
struct Known<'a> {
    ids: &'a BTreeSet<&'a str>,
    vars: &'a BTreeMap<String, String>,
    agent: &'a dyn Fn(&str) -> bool,
    runtime: &'a dyn Fn(&str) -> Result<(), String>,
}

/// The dotted name of field `field` of step `index`: `steps[1].prompt`.
fn step_field(index: usize, field: &str) -> String {
    format!("steps[{index}].{field}")
}

/// `max_parallel`, checked to be at least 1 (else the default).
fn max_parallel(locator: &Locator<'_>, value: Option<&Spanned<i64>>) -> Result<usize, SpecError> {
    match value {
        None => Ok(DEFAULT_MAX_PARALLEL),
        Some(value) => match usize::try_from(*value.get_ref()) {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(locator.fail(value.span(), "max_parallel", "must be at least 1".into())),
        },
    }
}

/// The file's variables with `overrides` in place, each override naming one of them.
fn variables(
    locator: &Locator<'_>,
    raw: &BTreeMap<Spanned<String>, Spanned<String>>,
    overrides: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, SpecError> {
    let mut vars: BTreeMap<String, String> =
        raw.iter().map(|(name, value)| (name.get_ref().clone(), value.get_ref().clone())).collect();
    for (name, value) in overrides {
        if !vars.contains_key(name) {
            return Err(locator.fail(
                0..0,
                "vars",
                format!("--var {name}: the file has no variable {name:?}"),
            ));
        }
        vars.insert(name.clone(), value.clone());
    }
    Ok(vars)
}

/// Step `index` of the file, checked on its own: its id, names, counts, loop, routes,
/// `for_each` and prompt.
fn check_step<'r>(
    locator: &Locator<'_>,
    known: &Known<'_>,
    index: usize,
    step: &'r RawStep,
    seen: &mut BTreeSet<&'r str>,
) -> Result<Step, SpecError> {
    let at = |field: &str| step_field(index, field);
    let id = step.id.get_ref();
    check_step_id(locator, index, step, seen)?;
    check_step_names(locator, known, index, step)?;
    let timeout_ms = count(locator, index, step.timeout_ms.as_ref(), "timeout_ms", 1, i64::MAX)?;
    let retries = count(locator, index, step.retries.as_ref(), "retries", 0, MAX_RETRIES)?
        .unwrap_or(0) as u32;
    let worktree = worktree_choice(locator, index, step.worktree.as_ref())?;
    let repeat = step_loop(locator, known, index, step.repeat.as_ref())?;
    for target in step.routes.values() {
        if !known.ids.contains(target.get_ref().as_str()) {
            return Err(locator.fail(
                target.span(),
                &at("routes"),
                format!("no step {:?}", target.get_ref()),
            ));
        }
    }
    let depends_on = dependencies(locator, known, index, step, repeat.is_some())?;
    let prompt = step_prompt(locator, known, index, step)?;
    Ok(Step {
        id: id.clone(),
        agent: step.agent.get_ref().clone(),
        prompt,
        depends_on,
        runtime: step.runtime.as_ref().map(|runtime| runtime.get_ref().clone()),
        worktree,
        approval: step.approval,
        timeout_ms,
        retries,
        repeat,
        routes: step
            .routes
            .iter()
            .map(|(marker, target)| (marker.clone(), target.get_ref().clone()))
            .collect(),
        for_each: step.for_each.as_ref().map(|f| f.get_ref().clone()),
    })
}

/// A step's id: a-z, 0-9, - and _, and not one an earlier step has (`seen`).
fn check_step_id<'r>(
    locator: &Locator<'_>,
    index: usize,
    step: &'r RawStep,
    seen: &mut BTreeSet<&'r str>,
) -> Result<(), SpecError> {
    let id = step.id.get_ref();
    if id.is_empty()
        || !id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
    {
        return Err(locator.fail(
            step.id.span(),
            &step_field(index, "id"),
            format!("{id:?} is not a step id (a-z, 0-9, - and _)"),
        ));
    }
    if !seen.insert(id.as_str()) {
        return Err(locator.fail(
            step.id.span(),
            &step_field(index, "id"),
            format!("step {id:?} is defined twice"),
        ));
    }
    Ok(())
}

/// What a step names: its agent profile and runtime exist, and it depends on other steps
/// of the file.
fn check_step_names(
    locator: &Locator<'_>,
    known: &Known<'_>,
    index: usize,
    step: &RawStep,
) -> Result<(), SpecError> {
    let at = |field: &str| step_field(index, field);
    let id = step.id.get_ref();
    if !(known.agent)(step.agent.get_ref()) {
        let agent = step.agent.get_ref();
        return Err(locator.fail(
            step.agent.span(),
            &at("agent"),
            format!("no agent profile {agent:?}"),
        ));
    }
    if let Some(runtime) = &step.runtime
        && let Err(runtimes) = (known.runtime)(runtime.get_ref())
    {
        let name = runtime.get_ref();
        return Err(locator.fail(
            runtime.span(),
            &at("runtime"),
            format!("no runtime {name:?} ({runtimes})"),
        ));
    }
    for dependency in &step.depends_on {
        let name = dependency.get_ref();
        if name == id {
            return Err(locator.fail(
                dependency.span(),
                &at("depends_on"),
                format!("step {id:?} depends on itself"),
            ));
        }
        if !known.ids.contains(name.as_str()) {
            return Err(locator.fail(
                dependency.span(),
                &at("depends_on"),
                format!("no step {name:?}"),
            ));
        }
    }
    Ok(())
}

/// A count field of step `index`, if given, checked to be within `least..=most`.
fn count(
    locator: &Locator<'_>,
    index: usize,
    value: Option<&Spanned<i64>>,
    field: &str,
    least: i64,
    most: i64,
) -> Result<Option<u64>, SpecError> {
    match value {
        None => Ok(None),
        Some(n) if *n.get_ref() < least => Err(locator.fail(
            n.span(),
            &step_field(index, field),
            format!("must be at least {least}"),
        )),
        Some(n) if *n.get_ref() > most => Err(locator.fail(
            n.span(),
            &step_field(index, field),
            format!("must be at most {most}"),
        )),
        Some(n) => Ok(Some(*n.get_ref() as u64)),
    }
}

/// A step's `worktree`: `none` (the default), `step` or `workflow`.
fn worktree_choice(
    locator: &Locator<'_>,
    index: usize,
    worktree: Option<&Spanned<String>>,
) -> Result<WorktreeChoice, SpecError> {
    match worktree.map(|w| (w.get_ref().as_str(), w.span())) {
        None | Some(("none", _)) => Ok(WorktreeChoice::None),
        Some(("step", _)) => Ok(WorktreeChoice::Step),
        Some(("workflow", _)) => Ok(WorktreeChoice::Workflow),
        Some((other, span)) => Err(locator.fail(
            span,
            &step_field(index, "worktree"),
            format!(
                "{other:?}: one of \"none\" (the workspace), \"step\" (a worktree of its own), \"workflow\" (one the steps share)"
            ),
        )),
    }
}

/// A step's `loop`, if it has one: an end condition, a pass count, and a step of the file
/// to go back to.
fn step_loop(
    locator: &Locator<'_>,
    known: &Known<'_>,
    index: usize,
    repeat: Option<&Spanned<RawLoop>>,
) -> Result<Option<Loop>, SpecError> {
    let at = |field: &str| step_field(index, field);
    let Some(raw) = repeat else { return Ok(None) };
    let span = raw.span();
    let raw = raw.get_ref();
    if raw.until.is_none() && raw.until_score.is_none() {
        return Err(locator.fail(
            span,
            &at("loop"),
            "a loop needs `until` (a marker) or `until_score` (a threshold)".into(),
        ));
    }
    if let Some(until) = &raw.until
        && until.get_ref().is_empty()
    {
        return Err(locator.fail(until.span(), &at("loop.until"), "must not be empty".into()));
    }
    let max_iterations = count(
        locator,
        index,
        raw.max_iterations.as_ref(),
        "loop.max_iterations",
        1,
        MAX_ITERATIONS,
    )?
    .unwrap_or(3) as u32;
    if !known.ids.contains(raw.back_to.get_ref().as_str()) {
        return Err(locator.fail(
            raw.back_to.span(),
            &at("loop.back_to"),
            format!("no step {:?}", raw.back_to.get_ref()),
        ));
    }
    Ok(Some(Loop {
        back_to: raw.back_to.get_ref().clone(),
        until: raw.until.as_ref().map(|u| u.get_ref().clone()),
        until_score: raw.until_score,
        max_iterations,
    }))
}

/// A step's dependencies: its `depends_on`, and its `for_each` source (another step of
/// the file, on a step with no loop and no routes).
fn dependencies(
    locator: &Locator<'_>,
    known: &Known<'_>,
    index: usize,
    step: &RawStep,
    has_loop: bool,
) -> Result<Vec<String>, SpecError> {
    let mut depends_on: Vec<String> = step.depends_on.iter().map(|d| d.get_ref().clone()).collect();
    if let Some(source) = &step.for_each {
        let name = source.get_ref();
        if name == step.id.get_ref() || !known.ids.contains(name.as_str()) {
            return Err(locator.fail(
                source.span(),
                &step_field(index, "for_each"),
                format!("no other step {name:?}"),
            ));
        }
        if has_loop || !step.routes.is_empty() {
            return Err(locator.fail(
                source.span(),
                &step_field(index, "for_each"),
                "a for_each step has no loop and no routes".into(),
            ));
        }
        if !depends_on.contains(name) {
            depends_on.push(name.clone());
        }
    }
    Ok(depends_on)
}

/// A step's prompt template, its references checked, and what the file alone makes of it
/// within a prompt's size.
fn step_prompt(
    locator: &Locator<'_>,
    known: &Known<'_>,
    index: usize,
    step: &RawStep,
) -> Result<Template, SpecError> {
    let at = |field: &str| step_field(index, field);
    let prompt = template(step.prompt.get_ref(), known.vars, known.ids, step.for_each.is_some())
        .map_err(|(offset, reason)| {
            // The string's text starts after its opening quote (or quotes).
            let quote = if locator.text[step.prompt.span()].starts_with("\"\"\"") { 3 } else { 1 };
            let start = step.prompt.span().start + quote + offset;
            locator.fail(start..start, &at("prompt"), reason)
        })?;
    // What the file alone makes of it (its text and variables) must fit in a prompt;
    // what the outputs add is checked when the step starts.
    let least = prompt.filled_len(known.vars, &NoValues);
    if least > MAX_PROMPT {
        return Err(locator.fail(
            step.prompt.span(),
            &at("prompt"),
            format!(
                "it is {least} bytes with its variables filled in, over the {MAX_PROMPT} bytes (8 MiB) a prompt may be"
            ),
        ));
    }
    Ok(prompt)
}

/// The steps' dependencies have no cycle.
fn check_cycle(
    locator: &Locator<'_>,
    raw_steps: &[Spanned<RawStep>],
    steps: &[Step],
) -> Result<(), SpecError> {
    if let Some(cycle) = cycle(steps) {
        let index =
            steps.iter().position(|step| step.id == cycle[0]).expect("UNWRAP: a known step");
        let span = raw_steps[index].get_ref().id.span();
        return Err(locator.fail(
            span,
            &format!("steps[{index}].depends_on"),
            format!("a cycle: {}", cycle.join(" → ")),
        ));
    }
    Ok(())
}

/// A step's loop goes back to the step itself or one it depends on, and holds no routes,
/// `for_each` or loop of another step.
fn check_loop(
    locator: &Locator<'_>,
    steps: &[Step],
    index: usize,
    step: &Step,
    repeat: &Loop,
    raw_step: &RawStep,
) -> Result<(), SpecError> {
    let before = ancestors(steps, &step.id);
    let span = raw_step.repeat.as_ref().map_or(0..0, |r| r.get_ref().back_to.span());
    if repeat.back_to != step.id && !before.contains(repeat.back_to.as_str()) {
        return Err(locator.fail(
            span,
            &format!("steps[{index}].loop.back_to"),
            format!(
                "{:?} is not a step {:?} depends on (a loop goes back to an earlier step, or the step itself)",
                repeat.back_to, step.id
            ),
        ));
    }
    let body = loop_body(steps, &repeat.back_to, &step.id);
    if let Some(inner) = steps.iter().find(|other| {
        body.contains(other.id.as_str())
            && (other.for_each.is_some()
                || !other.routes.is_empty()
                || (other.repeat.is_some() && other.id != step.id))
    }) {
        return Err(locator.fail(
            span,
            &format!("steps[{index}].loop.back_to"),
            format!(
                "step {:?} in the loop has routes, for_each or a loop of its own; loops do not nest",
                inner.id
            ),
        ));
    }
    Ok(())
}

/// Each of a step's routes leads to a step that depends on it directly.
fn check_routes(
    locator: &Locator<'_>,
    steps: &[Step],
    index: usize,
    step: &Step,
    raw_step: &RawStep,
) -> Result<(), SpecError> {
    for (marker, target) in &step.routes {
        let direct =
            steps.iter().any(|other| other.id == *target && other.depends_on.contains(&step.id));
        if !direct {
            let span = raw_step.routes.get(marker).map_or(0..0, Spanned::span);
            return Err(locator.fail(
                span,
                &format!("steps[{index}].routes"),
                format!(
                    "route {marker:?}: step {target:?} must depend on {:?} (depends_on)",
                    step.id
                ),
            ));
        }
    }
    Ok(())
}

/// A step reads only the output of a step that completes before it starts, or of a later
/// step of its loop (its previous pass; empty on the first).
fn check_outputs_used(
    locator: &Locator<'_>,
    raw_steps: &[Spanned<RawStep>],
    steps: &[Step],
) -> Result<(), SpecError> {
    for (index, step) in steps.iter().enumerate() {
        let before = ancestors(steps, &step.id);
        let feedback = |used: &str| {
            steps.iter().any(|other| {
                other.id == used
                    && other.repeat.as_ref().is_some_and(|repeat| {
                        loop_body(steps, &repeat.back_to, &other.id).contains(step.id.as_str())
                    })
            })
        };
        if let Some(used) =
            step.prompt.steps_used().find(|used| !before.contains(*used) && !feedback(used))
        {
            let span = raw_steps[index].get_ref().prompt.span();
            return Err(locator.fail(
                span,
                &format!("steps[{index}].prompt"),
                format!(
                    "{{{{steps.{used}.output}}}}: step {:?} does not depend on {used:?}, so its output may not exist yet",
                    step.id
                ),
            ));
        }
    }
    Ok(())
}

impl Spec {
    /// The steps that may start now: not done and not running, every dependency done, in
    /// file order, as many as `max_parallel` leaves room for beside the running ones.
    pub fn ready(&self, done: &BTreeSet<&str>, running: &BTreeSet<&str>) -> Vec<&Step> {
        let room = self.max_parallel.saturating_sub(running.len());
        self.steps
            .iter()
            .filter(|step| !done.contains(step.id.as_str()) && !running.contains(step.id.as_str()))
            .filter(|step| {
                step.depends_on.iter().all(|dependency| done.contains(dependency.as_str()))
            })
            .take(room)
            .collect()
    }
}

/// Parses a template: `{{ reference }}` among text. An error is the byte offset of the
/// reference in the template and the reason.
fn template(
    text: &str,
    vars: &BTreeMap<String, String>,
    steps: &BTreeSet<&str>,
    item: bool,
) -> Result<Template, (usize, String)> {
    let mut parts = Vec::new();
    let mut rest = text;
    let mut offset = 0;
    while let Some(open) = rest.find("{{") {
        if open > 0 {
            parts.push(Part::Text(rest[..open].to_owned()));
        }
        let at = offset + open;
        let Some(close) = rest[open..].find("}}") else {
            return Err((at, "an unclosed {{".into()));
        };
        let reference = rest[open + 2..open + close].trim();
        let part = match reference.split('.').collect::<Vec<_>>().as_slice() {
            ["vars", name] if vars.contains_key(*name) => Part::Var((*name).to_owned()),
            ["vars", name] => {
                return Err((at, format!("{{{{{reference}}}}}: no variable {name:?} in [vars]")));
            }
            ["task", "title"] => Part::TaskTitle,
            ["task", "description"] => Part::TaskDescription,
            ["item"] if item => Part::Item,
            ["item"] => {
                return Err((
                    at,
                    "{{item}} is a for_each step's item; this step has no for_each".into(),
                ));
            }
            ["steps", step, "output"] if steps.contains(step) => {
                Part::StepOutput((*step).to_owned())
            }
            ["steps", step, "output"] => {
                return Err((at, format!("{{{{{reference}}}}}: no step {step:?}")));
            }
            _ => {
                return Err((
                    at,
                    format!(
                        "{{{{{reference}}}}} is not a reference (vars.NAME, task.title, task.description, steps.ID.output, item)"
                    ),
                ));
            }
        };
        parts.push(part);
        offset += open + close + 2;
        rest = &rest[open + close + 2..];
    }
    if !rest.is_empty() {
        parts.push(Part::Text(rest.to_owned()));
    }
    Ok(Template { parts })
}

/// A dependency cycle, as step ids from one step back to it, if there is one.
fn cycle(steps: &[Step]) -> Option<Vec<String>> {
    fn visit<'a>(
        id: &'a str,
        steps: &'a [Step],
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|on| *on == id) {
            let mut found: Vec<String> = path[at..].iter().map(|s| (*s).to_owned()).collect();
            found.push(id.to_owned());
            return Some(found);
        }
        if !done.insert(id) {
            return None;
        }
        path.push(id);
        let step = steps.iter().find(|step| step.id == id)?;
        for dependency in &step.depends_on {
            if let Some(found) = visit(dependency, steps, path, done) {
                return Some(found);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    steps.iter().find_map(|step| visit(&step.id, steps, &mut Vec::new(), &mut done))
}

/// The steps of a loop: `last`, `back_to`, and every step between (depending on
/// `back_to` and depended on by `last`, directly or not).
pub fn loop_body<'a>(steps: &'a [Step], back_to: &str, last: &'a str) -> BTreeSet<&'a str> {
    let mut body: BTreeSet<&str> = ancestors(steps, last)
        .into_iter()
        .filter(|id| *id == back_to || ancestors(steps, id).contains(back_to))
        .collect();
    body.insert(last);
    body
}

/// Every step that `id` depends on, directly or not.
pub fn ancestors<'a>(steps: &'a [Step], id: &str) -> BTreeSet<&'a str> {
    let mut found = BTreeSet::new();
    let mut todo: Vec<&str> = vec![id];
    while let Some(next) = todo.pop() {
        if let Some(step) = steps.iter().find(|step| step.id == next) {
            for dependency in &step.depends_on {
                if found.insert(dependency.as_str()) {
                    todo.push(dependency.as_str());
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests;
