//! Verifiers that talk to tools outside Baton: the `semgrep` and `gitleaks` scanners and
//! tools of MCP servers. Each implements the engine's `Verifier` trait; [`register`] adds
//! them to a `Verifiers` set beside the engine's own (`command`, presets, `schema`).
//!
//! **Boundary:** runs the tools through `baton_engine::verifier::run_program` (scrubbed
//! environment, process group killed on timeout or cancel, capped output) or, for MCP,
//! its own stdio client; never prints, never touches the event log.

pub mod mcp;
pub mod scanners;

use std::sync::Arc;

use baton_engine::verifier::Verifiers;
use baton_scenario::model::Uses;

/// Adds this crate's verifiers to `verifiers`.
pub fn register(verifiers: &mut Verifiers) {
    verifiers.register(Uses::Semgrep, Arc::new(scanners::Semgrep));
    verifiers.register(Uses::Gitleaks, Arc::new(scanners::Gitleaks));
    verifiers.register(Uses::Mcp, Arc::new(mcp::McpVerifier::default()));
}
