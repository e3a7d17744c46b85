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
}

/// What a template is filled from when its step starts.
pub trait Values {
    /// The task's title.
    fn task_title(&self) -> &str;
    /// The task's description.
    fn task_description(&self) -> &str;
    /// A completed step's output (its final agent message).
    fn step_output(&self, step: &str) -> Option<&str>;
}

impl Template {
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
            }
        }
        text
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
    #[serde(default)]
    steps: Vec<Spanned<RawStep>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStep {
    id: Spanned<String>,
    agent: Spanned<String>,
    prompt: Spanned<String>,
    #[serde(default)]
    depends_on: Vec<Spanned<String>>,
}

/// Loads the workflow file at `path`, with `overrides` (`--var NAME=VALUE`) replacing its
/// variables; `known_agent` says whether an agent profile id exists.
pub fn load(
    path: &Path,
    overrides: &BTreeMap<String, String>,
    known_agent: &dyn Fn(&str) -> bool,
) -> Result<Spec, SpecError> {
    let text = std::fs::read_to_string(path).map_err(|err| SpecError {
        file: path.to_owned(),
        line: 1,
        column: 1,
        field: "(file)".into(),
        reason: format!("cannot read it: {err}"),
    })?;
    parse(&text, path, overrides, known_agent)
}

/// Parses and checks a workflow file's text (see [`load`]).
pub fn parse(
    text: &str,
    file: &Path,
    overrides: &BTreeMap<String, String>,
    known_agent: &dyn Fn(&str) -> bool,
) -> Result<Spec, SpecError> {
    let fail = |span: Range<usize>, field: &str, reason: String| {
        let (line, column, _) = agents::profile::toml_location(text, span.start);
        SpecError { file: file.to_owned(), line, column, field: field.to_owned(), reason }
    };
    let raw: RawSpec = toml::from_str(text).map_err(|err| {
        let span = err.span().unwrap_or(0..0);
        fail(span, "(file)", err.message().to_owned())
    })?;
    if raw.name.get_ref().trim().is_empty() {
        return Err(fail(raw.name.span(), "name", "must not be empty".into()));
    }
    let max_parallel = match &raw.max_parallel {
        None => DEFAULT_MAX_PARALLEL,
        Some(value) => match usize::try_from(*value.get_ref()) {
            Ok(n) if n > 0 => n,
            _ => return Err(fail(value.span(), "max_parallel", "must be at least 1".into())),
        },
    };
    let mut vars: BTreeMap<String, String> = raw
        .vars
        .iter()
        .map(|(name, value)| (name.get_ref().clone(), value.get_ref().clone()))
        .collect();
    for (name, value) in overrides {
        if !vars.contains_key(name) {
            return Err(fail(
                0..0,
                "vars",
                format!("--var {name}: the file has no variable {name:?}"),
            ));
        }
        vars.insert(name.clone(), value.clone());
    }
    if raw.steps.is_empty() {
        return Err(fail(raw.name.span(), "steps", "a workflow needs at least one step".into()));
    }
    let ids: BTreeSet<&str> =
        raw.steps.iter().map(|step| step.get_ref().id.get_ref().as_str()).collect();
    let mut seen = BTreeSet::new();
    let mut steps = Vec::new();
    for (index, step) in raw.steps.iter().enumerate() {
        let step = step.get_ref();
        let at = |field: &str| format!("steps[{index}].{field}");
        let id = step.id.get_ref();
        if id.is_empty()
            || !id
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        {
            return Err(fail(
                step.id.span(),
                &at("id"),
                format!("{id:?} is not a step id (a-z, 0-9, - and _)"),
            ));
        }
        if !seen.insert(id.as_str()) {
            return Err(fail(step.id.span(), &at("id"), format!("step {id:?} is defined twice")));
        }
        if !known_agent(step.agent.get_ref()) {
            let agent = step.agent.get_ref();
            return Err(fail(
                step.agent.span(),
                &at("agent"),
                format!("no agent profile {agent:?}"),
            ));
        }
        for dependency in &step.depends_on {
            let name = dependency.get_ref();
            if name == id {
                return Err(fail(
                    dependency.span(),
                    &at("depends_on"),
                    format!("step {id:?} depends on itself"),
                ));
            }
            if !ids.contains(name.as_str()) {
                return Err(fail(
                    dependency.span(),
                    &at("depends_on"),
                    format!("no step {name:?}"),
                ));
            }
        }
        let prompt = template(step.prompt.get_ref(), &vars, &ids).map_err(|(offset, reason)| {
            // The string's text starts after its opening quote (or quotes).
            let quote = if text[step.prompt.span()].starts_with("\"\"\"") { 3 } else { 1 };
            let start = step.prompt.span().start + quote + offset;
            fail(start..start, &at("prompt"), reason)
        })?;
        steps.push(Step {
            id: id.clone(),
            agent: step.agent.get_ref().clone(),
            prompt,
            depends_on: step.depends_on.iter().map(|d| d.get_ref().clone()).collect(),
        });
    }
    if let Some(cycle) = cycle(&steps) {
        let index =
            steps.iter().position(|step| step.id == cycle[0]).expect("UNWRAP: a known step");
        let span = raw.steps[index].get_ref().id.span();
        return Err(fail(
            span,
            &format!("steps[{index}].depends_on"),
            format!("a cycle: {}", cycle.join(" → ")),
        ));
    }
    // A step reads only the output of a step that completes before it starts.
    for (index, step) in steps.iter().enumerate() {
        let before = ancestors(&steps, &step.id);
        if let Some(used) = step.prompt.steps_used().find(|used| !before.contains(*used)) {
            let span = raw.steps[index].get_ref().prompt.span();
            return Err(fail(
                span,
                &format!("steps[{index}].prompt"),
                format!(
                    "{{{{steps.{used}.output}}}}: step {:?} does not depend on {used:?}, so its output may not exist yet",
                    step.id
                ),
            ));
        }
    }
    Ok(Spec { name: raw.name.into_inner(), vars, max_parallel, steps })
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
                        "{{{{{reference}}}}} is not a reference (vars.NAME, task.title, task.description, steps.ID.output)"
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

/// Every step that `id` depends on, directly or not.
fn ancestors<'a>(steps: &'a [Step], id: &str) -> BTreeSet<&'a str> {
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
