//! `baton validate`: load scenarios, print every diagnostic, summarise.

#![allow(clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use baton_scenario::{Diagnostics, Registry};

use crate::out::outln;

pub(crate) fn run(
    paths: &[PathBuf],
    json: bool,
    overrides: Option<&Path>,
    config: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let mut all = Diagnostics::new();
    let mut registry = match Registry::load(paths) {
        Ok(loaded) => {
            all.extend(loaded.warnings);
            Some(loaded.registry)
        }
        Err(e) => {
            all.extend(e.diagnostics);
            None
        }
    };
    // Each tenant's overrides are merged over the base and checked; the base registry is
    // the one summarised.
    if let (Some(dir), Some(base)) = (overrides, registry.as_ref()) {
        // A file where a tenant directory belongs is an error the loader reports.
        match baton_scenario::registry::read_overrides(dir) {
            Ok(tenants) => {
                for (tenant, list) in tenants {
                    match base.with_overrides(&tenant, &list) {
                        Ok(loaded) => all.extend(loaded.warnings),
                        Err(e) => all.extend(e.diagnostics),
                    }
                }
            }
            Err(e) => all.extend(e.diagnostics),
        }
        if all.has_errors() {
            registry = None;
        }
    }
    // With a provider configuration, every model constraint must resolve to something.
    if let (Some(path), Some(r)) = (baton_app::place::config_file(config), registry.as_ref()) {
        for d in baton_app::models::check_models(r, &path)? {
            all.push(d);
        }
        if all.has_errors() {
            registry = None;
        }
    }
    let ok = !all.has_errors();
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
            "warnings": all.len() - all.error_count(),
            "scenarios": scenarios,
            "diagnostics": all.iter().collect::<Vec<_>>(),
        });
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        for d in &all {
            eprintln!("{d}");
        }
        let warnings = all.len() - all.error_count();
        match &registry {
            Some(r) if ok => outln!(
                "ok: {} scenario{} valid, {warnings} warning{}",
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
