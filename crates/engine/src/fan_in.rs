//! A fan-out's fan-in: its children's results folded into the fan-out's own result, pure.
//!
//! The runner uses it when every child finished within the fan-out's step; the planner
//! uses it when some children were `human_approval` levels and the last of them has been
//! decided, reading the children's results from the state. Both give the same event.

use baton_scenario::model::{Aggregator, Level, LevelKind};
use serde_json::{Map, Value, json};

use crate::event::LevelFinished;
use crate::runner::error_finish;

/// What the fan-in reads of one child's finished attempt.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildResult<'a> {
    pub id: &'a str,
    pub ok: bool,
    pub verdict: Option<&'a str>,
    pub error: Option<&'a str>,
    pub cost_usd: f64,
    pub tokens: u64,
}

impl ChildResult<'_> {
    fn passed(&self) -> bool {
        self.ok && self.verdict.is_none_or(|v| v == "PASS")
    }
}

/// The fan-out `level`'s result from its `count` children's, those that finished given in
/// declared order (a child without a result counts as not passed). A child that failed (an
/// error, not a FAIL verdict) fails the fan-out.
pub fn aggregate(
    level: &Level,
    children: &[ChildResult<'_>],
    count: usize,
    duration_ms: u64,
) -> LevelFinished {
    let LevelKind::FanOut { fan_in, .. } = &level.kind else {
        return error_finish(format!("level `{}` is not a fan-out", level.id), duration_ms);
    };
    if let Some((id, err)) = children.iter().find_map(|c| c.error.map(|e| (c.id, e))) {
        return error_finish(format!("fan-out child `{id}` failed: {err}"), duration_ms);
    }
    let cost: f64 = children.iter().map(|c| c.cost_usd).sum();
    let tokens: u64 = children.iter().map(|c| c.tokens).sum();
    let mut verdicts = Map::new();
    let (mut weight_all, mut weight_pass, mut passed) = (0.0, 0.0, 0usize);
    for child in children {
        let pass = child.passed();
        let w = fan_in.weights.get(child.id).copied().unwrap_or(1.0);
        weight_all += w;
        if pass {
            passed += 1;
            weight_pass += w;
        }
        verdicts.insert(
            child.id.to_owned(),
            Value::String(if pass { "PASS" } else { "FAIL" }.to_owned()),
        );
    }
    let n = count;
    let score = if weight_all > 0.0 { weight_pass / weight_all } else { 0.0 };
    let pass = match fan_in.aggregator {
        Aggregator::MajorityPass => passed * 2 > n,
        Aggregator::AllPass => passed == n,
        Aggregator::WeightedScore => score >= fan_in.threshold,
    };
    let verdict = if pass { "PASS" } else { "FAIL" };
    let aggregator = match fan_in.aggregator {
        Aggregator::MajorityPass => "majority_pass",
        Aggregator::AllPass => "all_pass",
        Aggregator::WeightedScore => "weighted_score",
    };
    LevelFinished {
        ok: true,
        skipped: false,
        verdict: Some(verdict.to_owned()),
        output: format!("{passed} of {n} children passed ({aggregator}): {verdict}"),
        parsed: Some(json!({"children": verdicts, "score": score, "aggregator": aggregator})),
        confidence: None,
        scratchpad: Map::new(),
        conflict: (!pass).then(|| level.id.clone()),
        error: None,
        cost_usd: cost,
        tokens,
        duration_ms,
        terminal: level.terminal,
        touched_paths: Vec::new(),
        snapshot: None,
    }
}
