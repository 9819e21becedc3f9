//! The user's own tools, as the kernel sees them: [`ToolHost`], the embedder's trait that
//! opens a [`ToolSession`] per level attempt (an MCP toolset's server started and its tools
//! listed) which makes each call of a tool a scenario declares, and the bounds every call
//! is held to whichever host makes it. The kernel decides when a call
//! is made, with which idempotency key, and what is recorded; how it reaches the world is
//! the host's.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use baton_scenario::model::OwnTool;
use serde_json::Value;

use crate::cancel::CancelToken;
use crate::future::BoxFuture;
use crate::workspace::ToolOutcome;

/// Largest result of one call the model is given, in bytes; the rest is cut with a note.
pub const RESULT_BYTES_MAX: usize = 64 * 1024;
/// Most bytes of results of the user's tools one level attempt gives its model; past it a
/// call is refused with a result that says so.
pub const RESULTS_PER_ATTEMPT_BYTES_MAX: usize = 4 * 1024 * 1024;

/// One call of a user's tool.
#[derive(Clone, Copy, Debug)]
pub struct OwnCall<'a> {
    pub tool: &'a OwnTool,
    /// The level that makes it.
    pub level_id: &'a str,
    /// The arguments, already checked against the tool's schema.
    pub arguments: &'a Value,
    /// The idempotency key of a write call; a read call has none.
    pub key: Option<&'a str>,
    /// The level's workspace, where a program runs.
    pub workspace: &'a Path,
    /// When the call must be done (the tool's timeout, or the attempt's deadline first).
    pub deadline: Instant,
    /// The run's tenant: which secrets the call may send.
    pub tenant: Option<&'a str>,
}

/// Opens what the calls of the user's tools need (the embedder's: `baton-tools`).
pub trait ToolHost: Send + Sync + std::fmt::Debug {
    /// What one attempt's calls of `tools` need: each MCP toolset's server started in the
    /// jail, in `workspace`, and asked for its tools. A server that cannot be started or
    /// asked leaves its tools out ([`ToolSession::problems`] says why). Dropping the
    /// session stops what it started.
    fn open<'a>(
        &'a self,
        tools: &'a [Arc<OwnTool>],
        workspace: &'a Path,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Box<dyn ToolSession>>;
}

/// One level attempt's access to its tools.
pub trait ToolSession: Send + Sync + std::fmt::Debug {
    /// What MCP servers said of the tools they offer, by tool name: a tool of an MCP
    /// toolset that is not here is not offered to the model.
    fn listed(&self) -> &BTreeMap<String, Listed>;

    /// Why a server's tools are missing, one line each (a server that did not start, a
    /// tool it does not offer).
    fn problems(&self) -> &[String];

    /// Makes one call and says what came of it; a failure of the tool itself (it could not
    /// start, it timed out, it failed) is an error result the model reads, never a panic.
    fn call<'a>(&'a self, call: OwnCall<'a>, cancel: &'a CancelToken)
    -> BoxFuture<'a, ToolOutcome>;
}

/// What an MCP server says of one of its tools.
#[derive(Clone, Debug, PartialEq)]
pub struct Listed {
    pub description: String,
    /// The JSON Schema of its arguments.
    pub schema: Value,
    /// Whether the server annotates it read-only (a hint: the scenario says what reads).
    pub read_only_hint: bool,
}

/// A result cut to [`RESULT_BYTES_MAX`] with the note saying how much was left out: a
/// result bounded once is left as it is.
pub fn bounded_result(mut content: String) -> String {
    if content.len() <= RESULT_BYTES_MAX {
        return content;
    }
    // Room for the note, so the whole stays within the bound.
    let mut cut = RESULT_BYTES_MAX - 64;
    while !content.is_char_boundary(cut) {
        cut -= 1;
    }
    let dropped = content.len() - cut;
    content.truncate(cut);
    content.push_str(&format!("\n[{dropped} more bytes of this result were cut]"));
    content
}
