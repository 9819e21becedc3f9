//! `baton validate`: load scenarios, print every diagnostic, summarise.

#![allow(clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use baton_scenario::Registry;

use crate::out::outln;

/// Validates the scenarios at `paths`; with `probe`, also asks the MCP servers of their
/// toolsets what they offer (each within the deadline).
pub(crate) async fn run(
    paths: &[PathBuf],
    json: bool,
    overrides: Option<&Path>,
    config: Option<&Path>,
    probe: Option<(&baton_app::place::Place, std::time::Duration)>,
) -> anyhow::Result<ExitCode> {
    let (mut all, registry) = baton_app::scenarios::validate(paths, overrides, config)?;
    if let (Some((place, timeout)), Some(registry)) = (probe, &registry) {
        for d in baton_app::tool_probe::probe_tools(place, registry, timeout).await {
            all.push(d);
        }
    }
    let ok = !all.has_errors();
    let hints = all.len() - all.error_count() - all.warning_count();
    if json {
        let scenarios: Vec<serde_json::Value> = registry
            .iter()
            .flat_map(Registry::scenarios)
            .map(|s| {
                serde_json::json!({
                    "id": s.id,
                    "version": s.version,
                    "file": s.file,
                    "checksum": s.checksum,
                    "levels": s.levels.len(),
                    "edges": s.edges.len(),
                    "intent_routes": s.intent_routes,
                })
            })
            .collect();
        let report = serde_json::json!({
            "ok": ok,
            "errors": all.error_count(),
            "warnings": all.warning_count(),
            "hints": hints,
            "scenarios": scenarios,
            "diagnostics": all.iter().collect::<Vec<_>>(),
        });
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        for d in &all {
            eprintln!("{d}");
        }
        let warnings = all.warning_count();
        let hinted =
            if hints > 0 { format!(", {hints} hint{}", plural(hints)) } else { String::new() };
        match &registry {
            Some(r) if ok => outln!(
                "ok: {} scenario{} valid, {warnings} warning{}{hinted}",
                r.len(),
                plural(r.len()),
                plural(warnings)
            )?,
            _ => outln!(
                "failed: {} error{}, {warnings} warning{}",
                all.error_count(),
                plural(all.error_count()),
                plural(warnings)
            )?,
        }
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}
