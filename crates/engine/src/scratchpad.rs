//! The scratchpad: a run-scoped map of short notes that levels write and later levels,
//! templates (`scratchpad`) and gates (`scratchpad.KEY`) read (reference 001).
//!
//! A tool-loop level reads and writes it through three tools — `scratchpad_get`,
//! `scratchpad_put`, `scratchpad_list` — and a JSON prompt level through a `scratchpad`
//! object in its answer. Every write is a `scratchpad_written` event; keys and values are
//! bounded, and a write past a bound is refused with a message the model can act on.

use serde_json::{Map, Value, json};

use crate::model::ToolSpec;
use crate::workspace::ToolOutcome;

/// The scratchpad's tools, as a tool loop offers them.
pub const TOOLS: [&str; 3] = ["scratchpad_get", "scratchpad_put", "scratchpad_list"];
/// Longest key, in characters.
pub const KEY_CHARS_MAX: usize = 64;
/// Largest value, as JSON, in bytes.
pub const VALUE_BYTES_MAX: usize = 16 * 1024;
/// Most keys the scratchpad holds.
pub const KEYS_MAX: usize = 256;

/// The tools' specifications.
pub fn specs() -> Vec<ToolSpec> {
    let key = json!({"type": "string", "pattern": "^[a-z][a-z0-9_]*$", "maxLength": KEY_CHARS_MAX});
    vec![
        ToolSpec {
            name: "scratchpad_get".to_owned(),
            description: "Read a note from the run's scratchpad (shared with later levels and the run's routing).".to_owned(),
            parameters: json!({"type": "object", "properties": {"key": key}, "required": ["key"], "additionalProperties": false}),
        },
        ToolSpec {
            name: "scratchpad_put".to_owned(),
            description: format!("Write a note (any JSON value up to {VALUE_BYTES_MAX} bytes; null removes it) to the run's scratchpad."),
            parameters: json!({"type": "object", "properties": {"key": key, "value": {}}, "required": ["key", "value"], "additionalProperties": false}),
        },
        ToolSpec {
            name: "scratchpad_list".to_owned(),
            description: "List the keys of the run's scratchpad.".to_owned(),
            parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
        },
    ]
}

/// Why `key` cannot name a note: lower-case letters, digits and `_`, starting with a
/// letter, at most [`KEY_CHARS_MAX`] characters (gates read it as `scratchpad.KEY`).
pub fn check_key(key: &str) -> Result<(), String> {
    let mut chars = key.chars();
    let good = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !good || key.chars().count() > KEY_CHARS_MAX {
        return Err(format!(
            "scratchpad key {key:?} must be lower-case letters, digits and `_`, start with a letter, and be at most {KEY_CHARS_MAX} characters"
        ));
    }
    Ok(())
}

/// Why a write cannot go in: a bad key, a value too large, or one key too many.
pub fn check_write(pad: &Map<String, Value>, key: &str, value: &Value) -> Result<(), String> {
    check_key(key)?;
    let size = value.to_string().len();
    if size > VALUE_BYTES_MAX {
        return Err(format!(
            "the value for scratchpad key `{key}` is {size} bytes as JSON; at most {VALUE_BYTES_MAX} are kept"
        ));
    }
    if !value.is_null() && !pad.contains_key(key) && pad.len() >= KEYS_MAX {
        return Err(format!(
            "the scratchpad holds {KEYS_MAX} keys already; remove one (put null) before adding `{key}`"
        ));
    }
    Ok(())
}

/// Applies one write to a map (null removes the key).
pub fn apply(pad: &mut Map<String, Value>, key: &str, value: &Value) {
    if value.is_null() {
        pad.remove(key);
    } else {
        pad.insert(key.to_owned(), value.clone());
    }
}

/// Runs one scratchpad tool against `pad` (the run's notes with this attempt's writes):
/// what the model reads, and the write to record, if any.
pub fn call(
    pad: &mut Map<String, Value>,
    name: &str,
    arguments: &Value,
) -> (ToolOutcome, Option<(String, Value)>) {
    let key = arguments.get("key").and_then(Value::as_str);
    match (name, key) {
        ("scratchpad_list", _) => {
            let keys: Vec<&String> = pad.keys().collect();
            (ToolOutcome::ok(json!(keys).to_string()), None)
        }
        ("scratchpad_get", Some(key)) => match pad.get(key) {
            Some(value) => (ToolOutcome::ok(value.to_string()), None),
            None => (ToolOutcome::error(format!("the scratchpad has no key `{key}`")), None),
        },
        ("scratchpad_put", Some(key)) => {
            let Some(value) = arguments.get("value") else {
                return (
                    ToolOutcome::error("scratchpad_put needs `value` (null removes the key)"),
                    None,
                );
            };
            match check_write(pad, key, value) {
                Ok(()) => {
                    apply(pad, key, value);
                    (
                        ToolOutcome::ok(format!("scratchpad `{key}` written")),
                        Some((key.to_owned(), value.clone())),
                    )
                }
                Err(why) => (ToolOutcome::error(why), None),
            }
        }
        (_, None) => (ToolOutcome::error(format!("{name} needs a string argument `key`")), None),
        _ => (ToolOutcome::error(format!("there is no scratchpad tool `{name}`")), None),
    }
}

/// The writes a JSON answer asks for in its `scratchpad` object, checked against `pad`;
/// the ones refused come back with why.
pub fn from_answer(
    pad: &Map<String, Value>,
    parsed: Option<&Value>,
) -> (Vec<(String, Value)>, Vec<String>) {
    let Some(asked) = parsed.and_then(|p| p.get("scratchpad")) else {
        return (Vec::new(), Vec::new());
    };
    let Some(asked) = asked.as_object() else {
        return (
            Vec::new(),
            vec!["the answer's `scratchpad` is not an object of notes".to_owned()],
        );
    };
    let mut pad = pad.clone();
    let (mut writes, mut refused) = (Vec::new(), Vec::new());
    for (key, value) in asked {
        match check_write(&pad, key, value) {
            Ok(()) => {
                apply(&mut pad, key, value);
                writes.push((key.clone(), value.clone()));
            }
            Err(why) => refused.push(why),
        }
    }
    (writes, refused)
}
