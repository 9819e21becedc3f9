//! Prompt templates rendered against a run's state.
//!
//! Templates are compiled once per scenario. They read exactly the names
//! `baton_scenario::files::TEMPLATE_VARIABLES` lists — the loader refuses any other —
//! and undefined values are errors, never empty strings.

use baton_scenario::Scenario;
use baton_scenario::model::{LevelKind, Template};
use serde_json::{Map, Value, json};

use crate::state::RunState;

/// The compiled templates of one scenario.
#[derive(Debug)]
pub struct Renderer {
    env: minijinja::Environment<'static>,
}

impl Renderer {
    /// Compiles every template the scenario uses.
    pub fn new(scenario: &Scenario) -> Result<Self, String> {
        let mut env = minijinja::Environment::new();
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        env.set_fuel(Some(1_000_000));
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
    pub fn render(&self, template: &Template, ctx: &Value) -> Result<String, String> {
        let t = self
            .env
            .get_template(&template.name)
            .map_err(|e| format!("template {}: {e}", template.name))?;
        t.render(minijinja::value::Serde(ctx)).map_err(|e| {
            let mut message = format!("cannot render template {}: {e}", template.name);
            if let Some(detail) = e.detail() {
                message.push_str(&format!(" ({detail})"));
            }
            message
        })
    }
}

/// The values a template reads, for an attempt of `level_id`.
pub fn context(state: &RunState, run_id: &str, level_id: &str, catalog: &Value) -> Value {
    let mut levels = Map::new();
    for (id, l) in &state.levels {
        if l.attempts == 0 || l.running {
            continue;
        }
        levels.insert(
            id.clone(),
            json!({
                "output": l.output,
                "parsed": l.parsed,
                "verdict": l.verdict,
                "ok": l.ok,
                "attempts": l.attempts,
                "confidence": l.confidence,
                "approved": l.approved,
                "comment": l.comment,
            }),
        );
    }
    let feedback = state
        .scratchpad
        .get("build_feedback")
        .or_else(|| state.scratchpad.get("feedback"))
        .cloned()
        .unwrap_or(Value::Null);
    let answers: Vec<Value> =
        state.answers.iter().map(|(id, a)| json!({"call_id": id, "answer": a})).collect();
    json!({
        "input": state.input,
        "level": levels,
        "scratchpad": state.scratchpad,
        "feedback": feedback,
        "metadata": state.metadata,
        "attempt": state.level(level_id).map_or(1, |l| l.attempts),
        "scenario": {"id": state.scenario_id, "version": state.scenario_version},
        "catalog": catalog,
        "answers": answers,
        "run": {"id": run_id},
    })
}
