//! Payloads as schema version 1 wrote them, and their upgrades to today's.

use baton_scenario::expr::Semantics;
use serde::Deserialize;
use serde_json::Value;

use crate::event::payloads::{BudgetCaps, WorkspaceInfo};

/// `scenario_started` before it recorded the gate semantics.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct ScenarioStarted {
    pub scenario_id: String,
    pub scenario_version: u32,
    pub checksum: String,
    pub input: String,
    pub metadata: serde_json::Map<String, Value>,
    pub budget: BudgetCaps,
    pub max_attempts_per_conflict: u32,
    pub model_source: Option<String>,
    #[serde(default)]
    pub workspace: Option<WorkspaceInfo>,
}

/// A version-1 run started when gates were two-valued, and finishes under that rule.
impl From<ScenarioStarted> for crate::event::payloads::ScenarioStarted {
    fn from(old: ScenarioStarted) -> Self {
        crate::event::payloads::ScenarioStarted {
            scenario_id: old.scenario_id,
            scenario_version: old.scenario_version,
            checksum: old.checksum,
            input: old.input,
            metadata: old.metadata,
            budget: old.budget,
            max_attempts_per_conflict: old.max_attempts_per_conflict,
            model_source: old.model_source,
            workspace: old.workspace,
            gate_semantics: Semantics::TwoValued,
            failures_routed: false,
            parent: None,
            tenant: None,
            process: None,
        }
    }
}

/// `approval_decided` before it carried the approver's data.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalDecided {
    pub request_id: String,
    pub approved: bool,
    pub comment: Option<String>,
    pub by: Option<String>,
}

/// A version-1 decision had no data.
impl From<ApprovalDecided> for crate::event::payloads::ApprovalDecided {
    fn from(old: ApprovalDecided) -> Self {
        crate::event::payloads::ApprovalDecided {
            request_id: old.request_id,
            approved: old.approved,
            comment: old.comment,
            by: old.by,
            data: None,
            timed_out: false,
        }
    }
}
