//! Planning a wave: its assignments read from the run's input or an earlier level's
//! answer, every problem an error naming its JSON pointer, before any worker exists.

use serde_json::Value;

use baton_scenario::limits::{WAVE_ASSIGNMENTS_MAX, WAVE_PARALLEL_MAX};
use baton_scenario::model::{WaveDispatch, WaveSource, WaveSpec};

use crate::event::{Assignment, WavePlanned};
use crate::state::RunState;
use crate::wave::{TASK_ID_CHARS_MAX, TEXT_BYTES_MAX, TITLE_CHARS_MAX};

/// Plans a wave from its source (the run's input, or an earlier level's parsed answer):
/// `{tasks: [...]}` or `{assignments: [...]}` or a bare list, each task `{id, title,
/// description?, priority?}`, with an optional `context` and `max_parallel`. Every problem
/// is an error naming its JSON pointer, before any worker exists.
pub fn plan(spec: &WaveSpec, state: &RunState) -> Result<WavePlanned, String> {
    let (data, whence) = match &spec.source {
        WaveSource::Input => match &state.session.input_json {
            Some(v) => (v, "the run's input".to_owned()),
            None => {
                return Err(
                    "the run's input is not JSON; a wave reads its tasks from it (`{\"tasks\": [{\"id\": …, \"title\": …}]}`)"
                        .to_owned(),
                );
            }
        },
        WaveSource::Level(id) => match state.level(id).and_then(|l| l.parsed.as_ref()) {
            Some(v) => (v, format!("the answer of level `{id}`")),
            None => {
                return Err(format!(
                    "level `{id}` gave no JSON answer to plan the wave from (it must be a prompt level with `response: json` that ran before the wave)"
                ));
            }
        },
    };
    let at = |pointer: &str, message: &str| format!("{whence} at `{pointer}`: {message}");
    let (tasks, key, object) = match data {
        Value::Array(items) => (items, "", None),
        Value::Object(obj) => {
            let (key, items) = match (obj.get("tasks"), obj.get("assignments")) {
                (Some(_), Some(_)) => {
                    return Err(at("", "give `tasks` or `assignments`, not both"));
                }
                (Some(t), None) => ("/tasks", t),
                (None, Some(a)) => ("/assignments", a),
                (None, None) => return Err(at("", "no `tasks` (or `assignments`) list")),
            };
            let Value::Array(items) = items else {
                return Err(at(key, "must be a list of tasks"));
            };
            (items, key, Some(obj))
        }
        _ => return Err(at("", "must be an object with `tasks`, or a list of tasks")),
    };
    if tasks.is_empty() {
        return Err(at(key, "a wave needs at least one assignment"));
    }
    let max = spec.max_assignments.min(WAVE_ASSIGNMENTS_MAX) as usize;
    if tasks.len() > max {
        return Err(at(
            key,
            &format!(
                "{} assignments, more than the wave's `max_assignments` of {max}",
                tasks.len()
            ),
        ));
    }
    let mut assignments: Vec<Assignment> = Vec::with_capacity(tasks.len());
    for (n, task) in tasks.iter().enumerate() {
        let here = format!("{key}/{n}");
        let Some(t) = task.as_object() else {
            return Err(at(&here, "a task is an object `{id, title, description?, priority?}`"));
        };
        if let Some(unknown) = t.keys().find(|k| {
            !["id", "title", "description", "priority", "objective"].contains(&k.as_str())
        }) {
            return Err(at(
                &format!("{here}/{unknown}"),
                "unknown field (a task has id, title, description, priority)",
            ));
        }
        let text =
            |field: &str, required: bool, max_bytes: usize| -> Result<Option<String>, String> {
                match t.get(field) {
                    None | Some(Value::Null) if !required => Ok(None),
                    Some(Value::String(s)) if !s.trim().is_empty() && s.len() <= max_bytes => {
                        Ok(Some(s.trim().to_owned()))
                    }
                    Some(Value::String(s)) if s.len() > max_bytes => Err(at(
                        &format!("{here}/{field}"),
                        &format!("longer than {max_bytes} bytes"),
                    )),
                    _ => Err(at(&format!("{here}/{field}"), "must be a non-empty string")),
                }
            };
        let task_id = match t.get("id") {
            Some(Value::Number(num)) => num.to_string(),
            _ => text("id", true, TASK_ID_CHARS_MAX * 4)?.unwrap_or_default(),
        };
        if task_id.chars().count() > TASK_ID_CHARS_MAX || task_id.chars().any(char::is_control) {
            return Err(at(
                &format!("{here}/id"),
                &format!(
                    "a task id is at most {TASK_ID_CHARS_MAX} characters, without control characters"
                ),
            ));
        }
        if assignments.iter().any(|a| a.task_id == task_id) {
            return Err(at(&format!("{here}/id"), &format!("task id `{task_id}` is given twice")));
        }
        let title = match text("title", t.get("objective").is_none(), TITLE_CHARS_MAX * 4)? {
            Some(title) => title,
            None => text("objective", true, TITLE_CHARS_MAX * 4)?.unwrap_or_default(),
        };
        if title.chars().count() > TITLE_CHARS_MAX {
            return Err(at(
                &format!("{here}/title"),
                &format!("longer than {TITLE_CHARS_MAX} characters"),
            ));
        }
        let description = text("description", false, TEXT_BYTES_MAX)?;
        let priority = text("priority", false, 16)?;
        if let Some(p) = &priority
            && !["high", "medium", "low"].contains(&p.as_str())
        {
            return Err(at(&format!("{here}/priority"), "one of high, medium, low"));
        }
        assignments.push(Assignment {
            id: format!("assign-{:03}", n + 1),
            task_id,
            title,
            description,
            priority,
        });
    }
    let plan_context = match object.and_then(|o| o.get("context")) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.len() <= TEXT_BYTES_MAX => Some(s.clone()),
        Some(Value::String(_)) => {
            return Err(at("/context", &format!("longer than {TEXT_BYTES_MAX} bytes")));
        }
        Some(_) => return Err(at("/context", "must be a string")),
    };
    let context = match (&spec.context, plan_context) {
        (Some(a), Some(b)) => Some(format!("{a}\n\n{b}")),
        (a, b) => a.clone().or(b),
    };
    let plan_parallel = match object.and_then(|o| o.get("max_parallel")) {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) if (1..=WAVE_PARALLEL_MAX).contains(&n) => Some(n),
            _ => {
                return Err(at(
                    "/max_parallel",
                    &format!("must be an integer from 1 through {WAVE_PARALLEL_MAX}, not {v}"),
                ));
            }
        },
    };
    Ok(WavePlanned {
        assignments,
        context,
        max_parallel: spec.max_parallel.or(plan_parallel),
        timeout_ms: spec.timeout_ms,
        worker: spec.worker.clone(),
        command: spec.command.clone(),
        dispatch: match spec.dispatch {
            WaveDispatch::Auto => "auto",
            WaveDispatch::Manual => "manual",
        }
        .to_owned(),
        reports_required: true,
        order: spec.order,
    })
}
