//! The effect ledger: the events that make a call of a user's `write` tool happen once.
//!
//! A write call gets an idempotency key (see [`idempotency_key`]); `tool_call_started` is
//! committed before the call is made and `tool_call_finished` — the receipt, with what
//! the tool answered — after it. A driver that resumes the attempt answers a call that has
//! a receipt from it and never makes it again; one that finds a start without a receipt
//! makes the call again with the same key and says so with `tool_call_reissued` first: a
//! tool that honours its key then acts once.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A write call of a user's tool, about to be made (committed before it is).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCallStarted {
    /// The model's id of the call (its `tool_call`'s).
    pub call_id: String,
    pub tool: String,
    pub toolset: String,
    /// The idempotency key the tool is given.
    pub key: String,
}

/// A call's receipt: what the tool answered, which answers the call from now on. Every
/// call of a user's tool has one; a read call's has no key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCallFinished {
    pub call_id: String,
    pub tool: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The result as the model got it.
    pub content: String,
    pub is_error: bool,
    /// What the call cost (the tool's `cost_usd`), counted against the run's budget.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cost_usd: f64,
    /// The workspace after a write call of a program (which may have changed its files): a
    /// driver that goes through the attempt again restores it here instead of making the
    /// call again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

/// A started call without a receipt, made again with its key by the driver that resumed
/// the attempt (written just before it is).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCallReissued {
    pub call_id: String,
    pub tool: String,
    pub key: String,
}

/// What MCP servers said of the tools an attempt offers its model (their descriptions and
/// schemas), recorded as the attempt begins so a replay offers the same without a server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolsListed {
    pub tools: Vec<ListedTool>,
}

/// One tool an MCP server listed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ListedTool {
    pub name: String,
    pub description: String,
    pub schema: serde_json::Value,
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// Where a write call stands in its run: what its idempotency key is derived from.
#[derive(Clone, Copy, Debug)]
pub struct CallPlace<'a> {
    pub run_id: &'a str,
    pub level_id: &'a str,
    /// The level's attempt; `None` for a tool declaring `once_per_run`.
    pub attempt: Option<u32>,
    /// The call's position among the attempt's calls of the user's tools, in the model's
    /// order (parallel calls of one turn included).
    pub index: u32,
    pub tool: &'a str,
    pub arguments: &'a serde_json::Value,
}

/// The idempotency key of a write call: `baton-` and 32 hex digits of the sha256 of where
/// the call stands and its arguments, so the same call in the same place always gets the
/// same key, and a fork (a new run) gets new ones.
pub fn idempotency_key(place: &CallPlace<'_>) -> String {
    let mut hash = Sha256::new();
    for part in [place.run_id, place.level_id, place.tool] {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    hash.update(place.attempt.map_or(0, |a| u64::from(a) + 1).to_le_bytes());
    hash.update(u64::from(place.index).to_le_bytes());
    hash.update(place.arguments.to_string().as_bytes());
    let digest = hash.finalize();
    let mut key = String::with_capacity(38);
    key.push_str("baton-");
    for byte in &digest[..16] {
        use std::fmt::Write as _;
        let _ = write!(key, "{byte:02x}");
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_key_changes_with_every_part_of_the_place_and_nothing_else() {
        let args = json!({"ticket": 7, "text": "done"});
        let place = CallPlace {
            run_id: "r1",
            level_id: "triage",
            attempt: Some(1),
            index: 0,
            tool: "post_reply",
            arguments: &args,
        };
        let key = idempotency_key(&place);
        assert_eq!(key, idempotency_key(&place));
        assert!(key.starts_with("baton-") && key.len() == 38, "{key}");
        let other_args = json!({"ticket": 8, "text": "done"});
        let changed = [
            CallPlace { run_id: "r2", ..place },
            CallPlace { level_id: "reply", ..place },
            CallPlace { attempt: Some(2), ..place },
            CallPlace { attempt: None, ..place },
            CallPlace { index: 1, ..place },
            CallPlace { tool: "post_note", ..place },
            CallPlace { arguments: &other_args, ..place },
        ];
        for other in changed {
            assert_ne!(idempotency_key(&other), key, "{other:?}");
        }
        // Parts are length-prefixed: moving a character between two parts changes the key.
        let a = CallPlace { run_id: "ab", level_id: "c", ..place };
        let b = CallPlace { run_id: "a", level_id: "bc", ..place };
        assert_ne!(idempotency_key(&a), idempotency_key(&b));
    }
}
