//! The payload of a level's result that came after its run's cancel: the step had finished
//! when the cancel got in ahead of its commit. The result is dropped like any cut step's
//! work, and the run ends `aborted` (`late_result_after_cancel`) instead of `cancelled`,
//! so the log says a result was there; a wave counts its worker's assignment `cancelled`.

use serde::{Deserialize, Serialize};

/// Why a run whose result came after its cancel ended `aborted`.
pub const LATE_RESULT_AFTER_CANCEL: &str = "late_result_after_cancel";

/// A level's result dropped because the run's cancel was recorded first (a level event,
/// written once, before the run's end).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LateResultDiscarded {
    /// The verdict the dropped result gave, when its level gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// The size of the dropped output, in bytes (the output itself is not kept).
    pub output_bytes: u64,
}
