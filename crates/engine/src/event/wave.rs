//! The payloads of a wave's events: its plan, each dispatch and recorded outcome, and the
//! decisions of its controller, with the values they carry (assignments, outcomes, counts,
//! the admission order).

use serde::{Deserialize, Serialize};

pub use baton_scenario::model::WaveOrder;

use super::payloads::is_false;

/// One assignment of a wave: a task for one worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Assignment {
    /// `assign-001`, `assign-002` … in the plan's order.
    pub id: String,
    /// The task brief's own id.
    pub task_id: String,
    pub title: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
}

/// A wave's assignments, planned when its level starts and before any worker exists.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WavePlanned {
    pub assignments: Vec<Assignment>,
    /// Text every worker receives beside its assignment.
    pub context: Option<String>,
    /// The wave's parallelism: the level's, else the plan's, else `[waves] max_parallel`
    /// as configured where the wave was planned. Waves planned before that was recorded
    /// have none, and run under the configuration of the process driving them.
    pub max_parallel: Option<u32>,
    /// Longest time one worker may take.
    pub timeout_ms: u64,
    /// The scenario workers run; none when workers run outside Baton.
    pub worker: Option<String>,
    /// The program workers run instead of a scenario (its argv).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// `auto` or `manual`.
    pub dispatch: String,
    /// Whether a worker's run must end with a worker report: a completed run without one
    /// fails its assignment (`report missing`), and the assignment takes the stricter of
    /// the run's status and its report. Waves planned before reports were required read
    /// a report-less completion as completed.
    #[serde(default, skip_serializing_if = "is_false")]
    pub reports_required: bool,
    /// The order planned assignments are admitted in. Waves planned before it was recorded
    /// admit in plan order, the only one there was.
    #[serde(default, skip_serializing_if = "WaveOrder::is_plan")]
    pub order: WaveOrder,
}

impl WavePlanned {
    /// Whether outside agents dispatch the wave (`dispatch: manual`).
    pub fn is_manual(&self) -> bool {
        self.dispatch == "manual"
    }
}

/// An assignment went to a worker: a child run Baton starts (`child_run_id`, recorded in
/// the same commit as its `child_run_started`), or a worker an outside agent runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WaveDispatched {
    pub assignment_id: String,
    /// The worker's run: the child run's id, or the outside worker's.
    pub worker_run: String,
    /// Set when Baton runs the worker as a child run (the active dispatcher owns it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// How an assignment ended, from the least strict to the strictest (the order the
/// stricter of a worker run's status and its report is taken in).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerOutcome {
    Completed,
    Partial,
    Blocked,
    Failed,
    Cancelled,
}

impl WorkerOutcome {
    pub const ALL: [WorkerOutcome; 5] = [
        WorkerOutcome::Completed,
        WorkerOutcome::Partial,
        WorkerOutcome::Blocked,
        WorkerOutcome::Failed,
        WorkerOutcome::Cancelled,
    ];

    /// The outcome as written.
    pub const fn as_str(self) -> &'static str {
        match self {
            WorkerOutcome::Completed => "completed",
            WorkerOutcome::Partial => "partial",
            WorkerOutcome::Blocked => "blocked",
            WorkerOutcome::Failed => "failed",
            WorkerOutcome::Cancelled => "cancelled",
        }
    }

    /// The outcome named `name`, if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == name)
    }

    /// Whether no further assignment is admitted after this outcome.
    pub fn stops_admission(self) -> bool {
        matches!(self, WorkerOutcome::Blocked | WorkerOutcome::Failed | WorkerOutcome::Cancelled)
    }
}

/// An assignment's outcome, recorded exactly once: by an outside agent (`baton wave
/// record`), or by Baton when its worker overran the timeout. A child run's own result
/// settles its assignment through `child_run_settled` instead.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WaveRecorded {
    pub assignment_id: String,
    pub outcome: WorkerOutcome,
    pub summary: String,
    #[serde(default)]
    pub blockers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// Why Baton recorded it (`timeout`), when Baton did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What a wave does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaveDecision {
    Dispatch,
    Wait,
    Complete,
    Replan,
    Escalate,
    Cancelled,
}

impl WaveDecision {
    /// The decision as written.
    pub const fn as_str(self) -> &'static str {
        match self {
            WaveDecision::Dispatch => "dispatch",
            WaveDecision::Wait => "wait",
            WaveDecision::Complete => "complete",
            WaveDecision::Replan => "replan",
            WaveDecision::Escalate => "escalate",
            WaveDecision::Cancelled => "cancelled",
        }
    }

    /// Whether the decision ends the wave.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            WaveDecision::Complete
                | WaveDecision::Replan
                | WaveDecision::Escalate
                | WaveDecision::Cancelled
        )
    }
}

/// Assignments counted by where they stand.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaveCounts {
    pub assignments: u32,
    pub planned: u32,
    pub in_flight: u32,
    pub completed: u32,
    pub partial: u32,
    pub blocked: u32,
    pub failed: u32,
    pub cancelled: u32,
}

impl std::fmt::Display for WaveCounts {
    /// `2 planned, 1 in flight, 3 completed, 0 partial, 0 blocked, 1 failed, 0 cancelled`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} planned, {} in flight, {} completed, {} partial, {} blocked, {} failed, {} cancelled",
            self.planned,
            self.in_flight,
            self.completed,
            self.partial,
            self.blocked,
            self.failed,
            self.cancelled
        )
    }
}

/// A decision of the wave's controller, with the counts it read: recorded when it
/// dispatches, and when it ends the wave (`closes`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WaveDecided {
    pub decision: WaveDecision,
    pub counts: WaveCounts,
    /// The parallelism it admitted under (0 when it admitted nothing).
    pub max_parallel: u32,
    /// The assignments it dispatched.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dispatched: Vec<String>,
    /// The wave ends with this decision.
    #[serde(default)]
    pub closes: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}
