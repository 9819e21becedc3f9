//! `baton validate`: load scenarios, print every diagnostic, summarise.

#![allow(clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use baton_scenario::{Diagnostic, Diagnostics, Registry};

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
    let config_path = config.map(Path::to_path_buf).or_else(|| {
        // Whatever is there is read (and refused when it is not a regular file), never
        // silently skipped.
        let default = PathBuf::from("baton.toml");
        std::fs::symlink_metadata(&default).is_ok().then_some(default)
    });
    if let (Some(path), Some(r)) = (config_path, registry.as_ref()) {
        let config = baton_providers::config::Config::from_file(&path)?;
        for d in check_models(r, &config, &path) {
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

/// Every level that calls a model must resolve to a configured one; fallback entries that
/// match nothing are worth a warning.
fn check_models(
    registry: &Registry,
    config: &baton_providers::config::Config,
    config_path: &Path,
) -> Vec<Diagnostic> {
    use baton_scenario::Pos;
    let mut out = Vec::new();
    for s in registry.scenarios() {
        for (level, wanted) in unsatisfiable_levels(s, config) {
            out.push(
                Diagnostic::error(
                    "unsatisfiable-model",
                    Pos::UNKNOWN,
                    format!(
                        "level `{level}` of `{}` wants {wanted}, which no model in {} satisfies",
                        s.id,
                        config_path.display()
                    ),
                )
                .in_file(s.file.clone())
                .with_help(
                    "configure a matching provider and model, or widen the level's `model.allow`",
                ),
            );
        }
        for level in &s.levels {
            if !calls_a_model(&level.kind) {
                continue;
            }
            for entry in level.model.iter().flat_map(|m| m.fallback.iter()) {
                if baton_providers::resolve::find(config, entry).is_none() {
                    out.push(
                        Diagnostic::warning(
                            "dead-fallback",
                            Pos::UNKNOWN,
                            format!("fallback `{entry}` of level `{}` of `{}` matches no configured model", level.id, s.id),
                        )
                        .in_file(s.file.clone()),
                    );
                }
            }
        }
    }
    out
}

/// Whether a level of this kind calls a model itself.
fn calls_a_model(kind: &baton_scenario::LevelKind) -> bool {
    matches!(
        kind,
        baton_scenario::LevelKind::Prompt { .. } | baton_scenario::LevelKind::ToolLoop { .. }
    )
}

/// The levels of a scenario that call a model which nothing in `config` satisfies, each
/// with what it wants (`allow [...]`, or the routing default).
pub(crate) fn unsatisfiable_levels(
    scenario: &baton_scenario::Scenario,
    config: &baton_providers::config::Config,
) -> Vec<(String, String)> {
    scenario
        .levels
        .iter()
        .filter(|level| calls_a_model(&level.kind))
        .filter(|level| baton_providers::resolve::chain(config, level.model.as_ref()).is_empty())
        .map(|level| {
            let wanted = level.model.as_ref().map_or_else(
                || "the routing default (none configured)".to_owned(),
                |m| format!("allow [{}]", m.allow.join(", ")),
            );
            (level.id.clone(), wanted)
        })
        .collect()
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}
