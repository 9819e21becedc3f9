//! `baton graph` and `baton schema`: a scenario drawn, and the format described.

#![allow(clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use baton_scenario::{Registry, Scenario, graph};

use crate::out::{out, outln};

pub(crate) fn run(scenarios: &Path, which: &str, dot: bool) -> anyhow::Result<ExitCode> {
    let Some(scenario) = find(scenarios, which)? else {
        return Ok(ExitCode::from(1));
    };
    out!("{}", if dot { graph::dot(&scenario) } else { graph::mermaid(&scenario) })?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn schema() -> anyhow::Result<ExitCode> {
    outln!("{}", serde_json::to_string_pretty(&baton_scenario::raw::json_schema())?)?;
    Ok(ExitCode::SUCCESS)
}

/// Finds a scenario by file path or by id in the scenarios directory, printing load
/// errors. `None` when it cannot be loaded.
pub(crate) fn find(scenarios: &Path, which: &str) -> anyhow::Result<Option<Arc<Scenario>>> {
    let as_file = PathBuf::from(which);
    let is_file = as_file.is_file();
    let path = if is_file { as_file } else { scenarios.to_path_buf() };
    let loaded = match Registry::load(&[path]) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("{}", e.diagnostics.render());
            return Ok(None);
        }
    };
    let found = if is_file {
        loaded.registry.scenarios().next().cloned()
    } else {
        loaded.registry.get(which).cloned()
    };
    if found.is_none() {
        let ids: Vec<&str> = loaded.registry.scenarios().map(|s| s.id.as_str()).collect();
        eprintln!(
            "error: no scenario `{which}` in {} (known: {})\n  = help: give a scenario id or the path of a scenario file",
            scenarios.display(),
            ids.join(", ")
        );
    }
    Ok(found)
}
