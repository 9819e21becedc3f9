//! `baton expr`: parse, check and evaluate one gate expression — an author's debugger.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use baton_scenario::expr::{self, JsonContext, Scope, Span, Val};

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
        Some((which, _)) => match crate::cmd_graph::find(scenarios, which)? {
            Some(s) => Some(s),
            None => return Ok(ExitCode::from(1)),
        },
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
            let raw = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read state file {}", path.display()))?;
            serde_json::from_str(&raw)
                .with_context(|| format!("state file {} is not valid JSON", path.display()))?
        }
        None => serde_json::json!({}),
    };
    let ctx = JsonContext(&state);
    let value = gate.value(&ctx);
    let (fires, readings) = gate.fires_traced(&ctx);
    println!("expression: {gate}");
    for r in &readings {
        println!("  {} = {}", r.path, r.value);
    }
    let shown = match value {
        Val::Undefined => "UNDEFINED".to_owned(),
        Val::Bool(b) => b.to_string(),
        Val::Num(n) => n.to_string(),
        Val::Str(s) => format!("{s:?}"),
    };
    println!("value: {shown}");
    println!("fires: {}", if fires { "yes" } else { "no" });
    Ok(ExitCode::SUCCESS)
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
