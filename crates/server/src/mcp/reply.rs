//! What a tool call sends back: its answer (structured content, and JSON text), its failure
//! (the problem's text, with its type and status in `_meta`), its progress notifications —
//! and how long a host may keep what never changes while Baton runs.

use rmcp::model::{CallToolResult, ContentBlock, ProgressNotificationParam, ProgressToken};
use rmcp::service::{Peer, RequestContext, RoleServer};

use crate::problem::Problem;

/// How long a host may keep what never changes while Baton runs (the tools, prompts and
/// templates, the guide), in milliseconds; what runs change is never kept (`ttlMs` 0).
pub(crate) const STATIC_TTL_MS: u64 = 3_600_000;

/// A tool's failure as the model sees it: what went wrong and what to do, as the HTTP API
/// says it; for a program, the problem's type and HTTP status in `_meta` under
/// [`PROBLEM_META`] (the application layer's table, as the API answers).
pub(crate) fn failed(problem: &Problem) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(problem.detail.clone())]);
    result.structured_content = None;
    let mut meta = serde_json::Map::new();
    meta.insert(
        PROBLEM_META.to_owned(),
        serde_json::json!({"type": problem.kind, "status": problem.status}),
    );
    result.meta = Some(rmcp::model::MetaObject(meta));
    result
}

/// The `_meta` key of a failed tool call's problem.
pub(crate) const PROBLEM_META: &str = "baton/problem";

/// A tool's answer: the value as structured content, and as JSON text for hosts that read
/// only text.
pub(crate) fn answered(value: &impl serde::Serialize) -> CallToolResult {
    match serde_json::to_value(value) {
        Ok(v) => CallToolResult::structured(v),
        Err(e) => failed(&Problem::internal(format!("the answer could not be written: {e}"))),
    }
}

/// Progress notifications of one call: sent only when the caller asked for them (a
/// progress token), each with more progress than the last.
pub(crate) struct Progress {
    peer: Peer<RoleServer>,
    token: Option<ProgressToken>,
    sent: f64,
}

impl Progress {
    pub(crate) fn of(context: &RequestContext<RoleServer>) -> Self {
        Progress { peer: context.peer.clone(), token: context.meta.get_progress_token(), sent: 0.0 }
    }

    /// Says `message` with `progress` (sent when it is more than last time) out of `total`.
    pub(crate) async fn say(&mut self, progress: f64, total: Option<f64>, message: String) {
        let Some(token) = &self.token else { return };
        if progress <= self.sent {
            return;
        }
        self.sent = progress;
        let mut param = ProgressNotificationParam::new(token.clone(), progress);
        param.total = total;
        param.message = Some(message);
        // A host that went away misses it; the call's result says the rest.
        let _ = self.peer.notify_progress(param).await;
    }
}
