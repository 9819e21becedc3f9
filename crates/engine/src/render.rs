//! Prompt templates rendered against a run's state.
//!
//! Templates are compiled once per scenario, in `baton_scenario::template::environment`
//! (the environment the loader checks filters, tests and functions against). They read
//! exactly the names `baton_scenario::files::TEMPLATE_VARIABLES` lists — the loader
//! refuses any other — and undefined values are errors, never empty strings. `level.<id>`
//! is a finished level; a level's own earlier attempt, while it runs again, is `previous`.

use std::sync::Arc;

use baton_scenario::Scenario;
use baton_scenario::files::TEMPLATE_VARIABLES;
use baton_scenario::model::{LevelKind, Template};
use minijinja::value::{Enumerator, Object};
use serde_json::{Value, json};

use crate::state::{LevelState, RunState};

/// The compiled templates of one scenario.
#[derive(Debug)]
pub struct Renderer {
    env: minijinja::Environment<'static>,
}

impl Renderer {
    /// Compiles every template the scenario uses.
    pub fn new(scenario: &Scenario) -> Result<Self, String> {
        // The loader checked every filter, test and function against this same environment.
        let mut env = baton_scenario::template::environment();
        for level in &scenario.levels {
            let template = match &level.kind {
                LevelKind::Prompt { prompt, .. } | LevelKind::ToolLoop { prompt, .. } => {
                    Some(prompt)
                }
                LevelKind::HumanApproval { prompt, .. } => prompt.as_ref(),
                _ => None,
            };
            if let Some(t) = template
                && env.get_template(&t.name).is_err()
            {
                env.add_template_owned(t.name.clone(), t.text.to_string())
                    .map_err(|e| format!("template {}: {e}", t.name))?;
            }
        }
        Ok(Renderer { env })
    }

    /// Renders a template for an attempt of a level.
    pub fn render(&self, template: &Template, ctx: &minijinja::Value) -> Result<String, String> {
        let t = self
            .env
            .get_template(&template.name)
            .map_err(|e| format!("template {}: {e}", template.name))?;
        t.render(ctx).map_err(|e| {
            let mut message = format!("cannot render template {}: {e}", template.name);
            if let Some(detail) = e.detail() {
                message.push_str(&format!(" ({detail})"));
            }
            message
        })
    }
}

/// The values a template reads, for an attempt of `level_id`.
///
/// The context is lazy: a value is built only when the template reads it, so a template
/// that reads `level.draft.output` costs one string, not a copy of the whole state.
pub fn context(
    state: &Arc<RunState>,
    run_id: &str,
    level_id: &str,
    catalog: &Arc<Value>,
) -> minijinja::Value {
    minijinja::Value::from_object(Ctx {
        state: Arc::clone(state),
        run_id: run_id.to_owned(),
        level_id: level_id.to_owned(),
        catalog: Arc::clone(catalog),
    })
}

fn serde<T: serde::Serialize>(value: &T) -> minijinja::Value {
    minijinja::Value::from(minijinja::value::Serde(value))
}

#[derive(Debug)]
struct Ctx {
    state: Arc<RunState>,
    run_id: String,
    level_id: String,
    catalog: Arc<Value>,
}

impl Object for Ctx {
    fn get_value(self: &Arc<Self>, key: &minijinja::Value) -> Option<minijinja::Value> {
        let s = &self.state;
        Some(match key.as_str()? {
            "input" => minijinja::Value::from(s.session.input.as_str()),
            "level" => minijinja::Value::from_object(Levels(Arc::clone(s))),
            "scratchpad" => serde(&s.session.scratchpad),
            "feedback" => {
                let feedback = s
                    .session
                    .scratchpad
                    .get("build_feedback")
                    .or_else(|| s.session.scratchpad.get("feedback"));
                feedback.map_or(minijinja::Value::from(()), serde)
            }
            "metadata" => serde(&s.session.metadata),
            "attempt" => minijinja::Value::from(s.level(&self.level_id).map_or(1, |l| l.attempts)),
            "scenario" => serde(&json!({"id": s.scenario_id, "version": s.scenario_version})),
            "catalog" => serde(self.catalog.as_ref()),
            "answers" => {
                let answers: Vec<Value> = s
                    .session
                    .answers
                    .iter()
                    .map(|(id, a)| json!({"call_id": id, "answer": a}))
                    .collect();
                serde(&answers)
            }
            "run" => serde(&json!({"id": self.run_id})),
            // Undefined on a level's first attempt, so `previous is defined` tells a retry.
            "previous" => {
                let level = s.levels.get(&self.level_id)?;
                let earlier =
                    if level.running { level.attempts.saturating_sub(1) } else { level.attempts };
                if earlier == 0 {
                    return None;
                }
                minijinja::Value::from_object(Previous {
                    state: Arc::clone(s),
                    id: self.level_id.clone(),
                    attempt: earlier,
                })
            }
            _ => return None,
        })
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(TEMPLATE_VARIABLES)
    }
}

/// `level`: the finished levels, by id.
#[derive(Debug)]
struct Levels(Arc<RunState>);

impl Levels {
    fn finished(&self) -> impl Iterator<Item = &String> {
        self.0.levels.iter().filter(|(_, l)| l.attempts > 0 && !l.running).map(|(id, _)| id)
    }
}

impl Object for Levels {
    fn get_value(self: &Arc<Self>, key: &minijinja::Value) -> Option<minijinja::Value> {
        let id = key.as_str()?;
        let level = self.0.levels.get(id)?;
        if level.attempts == 0 || level.running {
            return None;
        }
        Some(minijinja::Value::from_object(LevelView {
            state: Arc::clone(&self.0),
            id: id.to_owned(),
        }))
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        let ids: Vec<minijinja::Value> =
            self.finished().map(|id| minijinja::Value::from(id.as_str())).collect();
        Enumerator::Values(ids)
    }
}

const LEVEL_KEYS: &[&str] = &[
    "output",
    "parsed",
    "verdict",
    "ok",
    "attempts",
    "confidence",
    "approved",
    "comment",
    "touched_paths",
];

fn none() -> minijinja::Value {
    minijinja::Value::from(())
}

/// What a level's last finished attempt left that both `level.<id>` and `previous` show.
fn attempt_field(l: &LevelState, key: &str) -> Option<minijinja::Value> {
    Some(match key {
        "output" => minijinja::Value::from(l.output.as_str()),
        "parsed" => l.parsed.as_ref().map_or_else(none, serde),
        "verdict" => l.verdict.as_deref().map_or_else(none, minijinja::Value::from),
        "confidence" => l.confidence.map_or_else(none, minijinja::Value::from),
        "approved" => l.approved.map_or_else(none, minijinja::Value::from),
        "comment" => l.comment.as_deref().map_or_else(none, minijinja::Value::from),
        _ => return None,
    })
}

/// `level.<id>`: one finished level.
#[derive(Debug)]
struct LevelView {
    state: Arc<RunState>,
    id: String,
}

impl Object for LevelView {
    fn get_value(self: &Arc<Self>, key: &minijinja::Value) -> Option<minijinja::Value> {
        let l = self.state.levels.get(&self.id)?;
        let key = key.as_str()?;
        Some(match key {
            "ok" => l.ok.map_or_else(none, minijinja::Value::from),
            "attempts" => minijinja::Value::from(l.attempts),
            "touched_paths" => serde(&l.touched_paths),
            _ => return attempt_field(l, key),
        })
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(LEVEL_KEYS)
    }
}

const PREVIOUS_KEYS: &[&str] =
    &["output", "parsed", "verdict", "confidence", "approved", "comment", "feedback", "attempt"];

/// `previous`: the last finished attempt of the level being rendered.
#[derive(Debug)]
struct Previous {
    state: Arc<RunState>,
    id: String,
    /// The attempt's number.
    attempt: u32,
}

impl Object for Previous {
    fn get_value(self: &Arc<Self>, key: &minijinja::Value) -> Option<minijinja::Value> {
        let l = self.state.levels.get(&self.id)?;
        let key = key.as_str()?;
        Some(match key {
            "feedback" => l.feedback.as_deref().map_or_else(none, minijinja::Value::from),
            "attempt" => minijinja::Value::from(self.attempt),
            _ => return attempt_field(l, key),
        })
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(PREVIOUS_KEYS)
    }
}
