//! The user's own tools, as the kernel sees them: [`ToolHost`], the embedder's trait that
//! makes one call of a tool a scenario declares (a program in the jail, today), and the
//! bounds every call is held to whichever host makes it. The kernel decides when a call
//! is made, with which idempotency key, and what is recorded; how it reaches the world is
//! the host's.

use std::path::Path;
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

/// Makes the calls of the user's tools (the embedder's: `baton-tools`).
pub trait ToolHost: Send + Sync + std::fmt::Debug {
    /// Makes one call and says what came of it; a failure of the tool itself (it could not
    /// start, it timed out, it failed) is an error result the model reads, never a panic.
    fn call<'a>(&'a self, call: OwnCall<'a>, cancel: &'a CancelToken)
    -> BoxFuture<'a, ToolOutcome>;
}

/// A result cut to [`RESULT_BYTES_MAX`], saying how much was left out.
pub fn bounded_result(mut content: String) -> String {
    if content.len() <= RESULT_BYTES_MAX {
        return content;
    }
    let mut cut = RESULT_BYTES_MAX;
    while !content.is_char_boundary(cut) {
        cut -= 1;
    }
    let dropped = content.len() - cut;
    content.truncate(cut);
    content.push_str(&format!("\n[{dropped} more bytes of this result were cut]"));
    content
}
