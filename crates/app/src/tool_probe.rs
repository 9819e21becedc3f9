//! `baton validate --tools`: what the MCP servers of the scenarios' toolsets say of their
//! tools, set beside what the scenarios declare. Each server is started the way a run
//! starts it — by the instance's tool host, in the jail, in a workspace seeded like a new
//! run's (or its URL through the egress guard) — asked for its tools, and stopped.
//!
//! The server's annotations are hints only (the scenario's `read:` says what reads): a tool
//! the server marks read-only that the scenario treats as a write, and a `read:` tool the
//! server does not mark read-only, are each a hint. A server that does not start or answer
//! within the deadline, or an allowed tool it does not offer, is a warning: the runs would
//! go on without those tools.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use baton_engine::cancel::CancelToken;
use baton_engine::tools::ToolHost;
use baton_scenario::diag::Diagnostic;
use baton_scenario::model::{Effect, OwnTool, ToolSource};
use baton_scenario::{LevelKind, Registry, Scenario};

use crate::place::Place;

/// How long one server may take to start and list its tools by default.
pub const PROBE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);

/// What the MCP servers of every scenario of `registry` say of the tools it allows, as
/// hints and warnings; each server given at most `timeout` to start and list its tools.
pub async fn probe_tools(place: &Place, registry: &Registry, timeout: Duration) -> Vec<Diagnostic> {
    let host = crate::engines::live_tools(place);
    let mut out = Vec::new();
    for scenario in registry.scenarios() {
        for (toolset, tools) in mcp_toolsets(scenario) {
            out.extend(
                probe_toolset(place, host.as_ref(), scenario, &toolset, &tools, timeout).await,
            );
        }
    }
    out
}

/// The MCP toolsets the levels of `scenario` use, each with its allowed tools.
fn mcp_toolsets(scenario: &Scenario) -> BTreeMap<String, Vec<Arc<OwnTool>>> {
    let mut sets: BTreeMap<String, Vec<Arc<OwnTool>>> = BTreeMap::new();
    for level in &scenario.levels {
        let LevelKind::ToolLoop { tools, .. } = &level.kind else { continue };
        for tool in tools {
            let ToolSource::Mcp(server) = &tool.source else { continue };
            let set = sets.entry(server.toolset.clone()).or_default();
            if !set.iter().any(|t| t.name == tool.name) {
                set.push(Arc::clone(tool));
            }
        }
    }
    sets
}

async fn probe_toolset(
    place: &Place,
    host: &dyn ToolHost,
    scenario: &Scenario,
    toolset: &str,
    tools: &[Arc<OwnTool>],
    timeout: Duration,
) -> Vec<Diagnostic> {
    let at = |d: Diagnostic| d.in_file(scenario.file.clone());
    let scratch = Scratch::new();
    let workspace = match scratch.workspace(place, scenario.workspace_seed.as_deref()) {
        Ok(dir) => dir,
        Err(why) => {
            return vec![at(Diagnostic::warning(
                "mcp-server-not-probed",
                baton_scenario::Pos::UNKNOWN,
                format!("toolset `{toolset}` of `{}` was not probed: {why}", scenario.id),
            ))];
        }
    };
    let cancel = CancelToken::new();
    let session = tokio::select! {
        session = host.open(tools, &workspace, &cancel) => Some(session),
        () = tokio::time::sleep(timeout) => None,
    };
    let Some(session) = session else {
        cancel.cancel();
        return vec![at(Diagnostic::warning(
            "mcp-server-not-probed",
            baton_scenario::Pos::UNKNOWN,
            format!(
                "toolset `{toolset}` of `{}`: its MCP server did not start and list its tools within {} s",
                scenario.id,
                timeout.as_secs_f64()
            ),
        ))
        .with_help("raise the deadline with --tools-timeout-s, or check the server's command or URL")];
    };
    let mut out: Vec<Diagnostic> = session
        .problems()
        .iter()
        .map(|why| {
            at(Diagnostic::warning(
                "mcp-tool-unavailable",
                baton_scenario::Pos::UNKNOWN,
                format!("`{}`: {why}; its runs go on without it", scenario.id),
            ))
        })
        .collect();
    for tool in tools {
        let Some(listed) = session.listed().get(&tool.name) else { continue };
        match (tool.effect, listed.read_only_hint) {
            (Effect::Write, true) => out.push(at(Diagnostic::hint(
                "mcp-annotation",
                format!(
                    "`{}` of toolset `{toolset}` (`{}`): the server annotates it read-only, and the scenario treats it as a write (each call keyed and never made twice)",
                    tool.name, scenario.id
                ),
            )
            .with_help("if it changes nothing, list it under the toolset's `read:`; annotations are never trusted on their own"))),
            (Effect::Read, false) => out.push(at(Diagnostic::hint(
                "mcp-annotation",
                format!(
                    "`{}` of toolset `{toolset}` (`{}`): `read:` lists it, and the server does not annotate it read-only",
                    tool.name, scenario.id
                ),
            )
            .with_help("a read call has no key and may be made again on resume: make sure it changes nothing, or take it out of `read:`"))),
            _ => {}
        }
    }
    drop(session);
    out
}

/// A directory of its own for one probe, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Scratch(std::env::temp_dir().join(format!("baton-probe-{}-{n}", std::process::id())))
    }

    /// A workspace seeded like a new run's, under this directory.
    fn workspace(&self, place: &Place, seed: Option<&Path>) -> Result<PathBuf, String> {
        let dir = self.0.join("workspace");
        baton_workspace::LocalWorkspace::open_jailed(
            &dir,
            seed,
            &self.0.join("snapshots"),
            crate::jail::jail(place),
        )
        .map_err(|e| e.to_string())?;
        Ok(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
