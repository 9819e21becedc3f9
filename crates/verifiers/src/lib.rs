//! The verifiers that start programs: the `command` verifier and the project presets
//! (`build`, `typecheck`, `lint`, `unit_test`), the `semgrep` and `gitleaks` scanners, and
//! tools of MCP servers — and the `llm_judge`'s question and scoring (the engine makes its
//! one model call). Each program-starting verifier implements [`Confined`] and is handed
//! to the engine wrapped in [`InJail`], which gives it the jail its programs run in, says
//! why it cannot run on this host (the jail cannot be set up) and marks its outcomes
//! `jail: off` when the jail is off. [`register`] adds them all to a `Verifiers` set beside
//! the engine's own `schema` check.
//!
//! **Boundary:** every program is started by [`program::run_program`] (scrubbed
//! environment, process group killed on timeout or cancel, capped output) or, for MCP
//! servers, its own stdio client over [`program::jailed_command`] — both through the jail;
//! never prints, never touches the event log.

pub mod command;
pub mod confined;
pub mod judge;
pub mod mcp;
pub mod mcp_client;
pub mod program;
pub mod scanners;

use std::sync::Arc;

use baton_engine::verifier::{Verifier, Verifiers};
use baton_jail::Jail;
use baton_scenario::model::Uses;

pub use confined::{Confined, InJail};

/// Adds this crate's verifiers to `verifiers`, their programs run in `jail`, and the
/// rubric judge.
pub fn register(verifiers: &mut Verifiers, jail: &Arc<Jail>) {
    verifiers.register(Uses::Command, in_jail(jail, command::CommandVerifier));
    for preset in [Uses::Build, Uses::Typecheck, Uses::Lint, Uses::UnitTest] {
        verifiers.register(preset, in_jail(jail, command::PresetVerifier(preset)));
    }
    verifiers.register(Uses::Semgrep, in_jail(jail, scanners::Semgrep));
    verifiers.register(Uses::Gitleaks, in_jail(jail, scanners::Gitleaks));
    verifiers.register(Uses::Mcp, in_jail(jail, mcp::McpVerifier::default()));
    verifiers.set_judge(Arc::new(judge::RubricJudge));
}

fn in_jail<V: Confined + 'static>(jail: &Arc<Jail>, verifier: V) -> Arc<dyn Verifier> {
    Arc::new(InJail::new(Arc::clone(jail), verifier))
}
