//! `baton validate`: load scenarios, print every diagnostic, summarise.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use baton_scenario::registry::Override;
use baton_scenario::{Diagnostics, Registry};

pub(crate) fn run(
    paths: &[PathBuf],
    json: bool,
    overrides: Option<&Path>,
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
        for (tenant, list) in read_overrides(dir)? {
            match base.with_overrides(&tenant, &list) {
                Ok(loaded) => all.extend(loaded.warnings),
                Err(e) => all.extend(e.diagnostics),
            }
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
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for d in &all {
            eprintln!("{d}");
        }
        let warnings = all.len() - all.error_count();
        match &registry {
            Some(r) if ok => println!(
                "ok: {} scenario{} valid, {warnings} warning{}",
                r.len(),
                plural(r.len()),
                plural(warnings)
            ),
            _ => println!(
                "failed: {} error{}, {warnings} warning{}",
                all.error_count(),
                plural(all.error_count()),
                plural(warnings)
            ),
        }
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Reads DIR/TENANT/SCENARIO_ID.yaml into overrides grouped by tenant.
fn read_overrides(dir: &Path) -> anyhow::Result<Vec<(String, Vec<Override>)>> {
    let mut tenants = Vec::new();
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list overrides directory {}", dir.display()))?;
    let mut dirs: Vec<PathBuf> =
        entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_dir()).collect();
    dirs.sort();
    for tenant_dir in dirs {
        let tenant =
            tenant_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut files: Vec<PathBuf> = std::fs::read_dir(&tenant_dir)
            .with_context(|| format!("cannot list {}", tenant_dir.display()))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
            .collect();
        files.sort();
        let mut list = Vec::new();
        for file in files {
            let scenario_id =
                file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let yaml = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read override {}", file.display()))?;
            list.push(Override { scenario_id, name: file.display().to_string(), yaml });
        }
        tenants.push((tenant, list));
    }
    Ok(tenants)
}
