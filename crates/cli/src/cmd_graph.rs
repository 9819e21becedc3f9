//! `baton graph` and `baton schema`: a scenario drawn, and the format described.

#![allow(clippy::print_stderr)]

use std::path::Path;
use std::process::ExitCode;

use baton_scenario::graph;

use crate::out::{out, outln};

pub(crate) fn run(scenarios: &Path, which: &str, dot: bool) -> anyhow::Result<ExitCode> {
    let scenario = baton_app::scenarios::by_file_or_id(scenarios, which)?;
    out!("{}", if dot { graph::dot(&scenario) } else { graph::mermaid(&scenario) })?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn schema() -> anyhow::Result<ExitCode> {
    outln!("{}", serde_json::to_string_pretty(&baton_scenario::raw::json_schema())?)?;
    Ok(ExitCode::SUCCESS)
}
