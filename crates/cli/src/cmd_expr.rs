//! `baton expr`: parse, check and evaluate one gate expression — an author's debugger.
//!
//! Prints the value of every path the expression reads, then the expression's value in
//! three-valued logic (true, false or UNDEFINED) and whether an edge with this gate fires;
//! where runs started under the older two-valued rule would decide differently, it says
//! so too.

#![allow(clippy::print_stderr)]

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use baton_scenario::expr::{self, Context, Gate, JsonContext, Scope, Semantics, Span, Val};

use crate::out::out;

pub(crate) fn run(
    scenarios: &Path,
    text: &str,
    at: Option<(&str, &str)>,
    state: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let parsed = match expr::parse(text) {
        Ok(e) => e,
        Err(e) => {
            eprint!("{}", render(text, "syntax error", &e.message, e.span, e.help.as_deref()));
            return Ok(ExitCode::from(1));
        }
    };
    let scenario = match at {
        Some((which, _)) => Some(baton_app::scenarios::by_file_or_id(scenarios, which)?),
        None => None,
    };
    let scope = match (&scenario, at) {
        (Some(s), Some((_, from))) => {
            let Some(level) = s.level(from) else {
                let ids: Vec<&str> = s.levels.iter().map(|l| l.id.as_str()).collect();
                eprintln!(
                    "error: scenario `{}` has no level `{from}` (levels: {})",
                    s.id,
                    ids.join(", ")
                );
                return Ok(ExitCode::from(1));
            };
            Scope {
                levels: Some(s.levels.iter().map(|l| l.id.as_str()).collect()),
                verifiers: Some(level.verifiers.iter().map(|v| v.name.as_str()).collect()),
                source_level: Some(level.id.as_str()),
                result: false,
                args: false,
                wave: Some(matches!(level.kind, baton_scenario::model::LevelKind::Wave(_))),
            }
        }
        _ => Scope::open(),
    };
    let gate = match expr::resolve(&parsed, &scope) {
        Ok(g) => g,
        Err(e) => {
            eprint!("{}", render(text, "check error", &e.message, e.span, e.help.as_deref()));
            return Ok(ExitCode::from(1));
        }
    };
    let state: serde_json::Value = match state {
        Some(path) => {
            let raw = baton_scenario::capped::read_text(path, crate::limits::STATE_BYTES_MAX)
                .map_err(|e| anyhow::anyhow!("--state: {e}"))?;
            serde_json::from_str(&raw)
                .with_context(|| format!("state file {} is not valid JSON", path.display()))?
        }
        None => serde_json::json!({}),
    };
    out!("{}", report(&gate, &JsonContext(&state)))?;
    Ok(ExitCode::SUCCESS)
}

/// What `baton expr` prints for `gate` evaluated against `ctx`.
fn report(gate: &Gate, ctx: &dyn Context) -> String {
    let mut out = format!("expression: {gate}\n");
    for r in gate.readings(ctx) {
        out.push_str(&format!("  {} = {}\n", r.path, r.value));
    }
    let value = gate.value_under(Semantics::ThreeValued, ctx);
    out.push_str(&format!("value: {}\n", truth(value)));
    let fires = gate.fires_under(Semantics::ThreeValued, ctx);
    out.push_str(&format!("fires: {}\n", if fires { "yes" } else { "no" }));
    let old = gate.value_under(Semantics::TwoValued, ctx);
    let old_fires = gate.fires_under(Semantics::TwoValued, ctx);
    if old_fires != fires {
        out.push_str(&format!(
            "note: runs started under the older two-valued rule read this as {} and {}\n",
            truth(old),
            if old_fires { "fire" } else { "do not fire" }
        ));
    }
    out
}

/// A gate's value as a condition: true, false or UNDEFINED (with what it was, when a
/// dynamic path held something other than a boolean).
fn truth(value: Val<'_>) -> String {
    match value {
        Val::Bool(b) => b.to_string(),
        Val::Undefined => "UNDEFINED".to_owned(),
        Val::Num(n) => format!("UNDEFINED ({n} is a number, not true or false)"),
        Val::Str(s) => format!("UNDEFINED ({s:?} is a string, not true or false)"),
    }
}

/// The expression with the span underlined.
fn render(text: &str, what: &str, message: &str, span: Span, help: Option<&str>) -> String {
    let start = text.get(..span.start as usize).map_or(0, |s| s.chars().count());
    let width =
        text.get(span.start as usize..span.end as usize).map_or(1, |s| s.chars().count().max(1));
    let mut out = format!(
        "error: {what}: {message}\n  |\n  | {text}\n  | {}{}\n",
        " ".repeat(start),
        "^".repeat(width)
    );
    if let Some(help) = help {
        out.push_str(&format!("  = help: {help}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(text: &str, state: &serde_json::Value) -> String {
        let parsed = expr::parse(text).expect("the test expression parses");
        let gate = expr::resolve(&parsed, &Scope::open()).expect("the test expression checks");
        report(&gate, &JsonContext(state))
    }

    #[test]
    fn prints_undefined_and_every_path_read() {
        let out = shown("!(confidence >= 0.7) && attempt < 3", &serde_json::json!({"attempt": 1}));
        assert_eq!(
            out,
            "expression: !(confidence >= 0.7) && attempt < 3\n  confidence = \"UNDEFINED\"\n  \
             attempt = 1.0\nvalue: UNDEFINED\nfires: no\nnote: runs started under the older \
             two-valued rule read this as true and fire\n"
        );
    }

    #[test]
    fn prints_true_and_false() {
        let state = serde_json::json!({"confidence": 0.5});
        let out = shown("!(confidence >= 0.7)", &state);
        assert!(out.ends_with("  confidence = 0.5\nvalue: true\nfires: yes\n"), "{out}");
        let out = shown("confidence >= 0.7 && !defined(confidence)", &state);
        assert!(out.ends_with("value: false\nfires: no\n"), "{out}");
    }

    #[test]
    fn a_value_that_is_not_a_boolean_is_undefined() {
        let out = shown("scratchpad.flag", &serde_json::json!({"scratchpad": {"flag": "yes"}}));
        assert!(out.contains("value: UNDEFINED (\"yes\" is a string, not true or false)"), "{out}");
    }
}
