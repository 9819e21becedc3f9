//! Gate expressions evaluated against a run's state.
//!
//! `verifier.<name>` reads the verifiers of the edge's source level; `attempt` is the
//! source level's attempt count; everything else reads the state as the gate DSL
//! describes. Lists, mappings and null are UNDEFINED (the DSL's rule). Gates are
//! evaluated under the [`Semantics`] the run started with (`scenario_started` records
//! it): three-valued for new runs, two-valued for runs begun before that rule existed.

use baton_scenario::expr::{Context, Gate, PathRef, Reading, Root, Semantics, Val, json_val, walk};

use crate::state::RunState;

/// The state as seen from the edges leaving `source`.
#[derive(Debug)]
pub struct GateContext<'a> {
    pub state: &'a RunState,
    pub source: &'a str,
    /// The rule gates are evaluated under.
    pub semantics: Semantics,
}

impl<'a> GateContext<'a> {
    /// The edges leaving `source`, under the rule the run started with.
    pub fn new(state: &'a RunState, source: &'a str) -> Self {
        GateContext { state, source, semantics: state.gate_semantics }
    }

    /// Whether `gate` fires, with the value of every path it read.
    pub fn decide(&self, gate: &Gate) -> (bool, Vec<Reading>) {
        gate.fires_traced_under(self.semantics, self)
    }
}

fn num(n: impl Into<f64>) -> Val<'static> {
    Val::Num(n.into())
}

#[allow(clippy::cast_precision_loss)]
fn count(n: u64) -> Val<'static> {
    Val::Num(n as f64)
}

impl Context for GateContext<'_> {
    fn lookup(&self, path: &PathRef) -> Val<'_> {
        let s = self.state;
        let seg = &path.segments;
        match path.root {
            Root::Verdict => s.verdict.as_deref().map_or(Val::Undefined, Val::Str),
            Root::EscalateNow => Val::Bool(s.escalate_now),
            Root::Confidence => s.confidence.map_or(Val::Undefined, num),
            Root::Attempt => s.level(self.source).map_or(Val::Undefined, |l| num(l.attempts)),
            Root::Verifier => {
                let Some(outcome) = s.level(self.source).and_then(|l| l.verifiers.get(&seg[1]))
                else {
                    return Val::Undefined;
                };
                match seg[2].as_str() {
                    "passed" => Val::Bool(outcome.passed),
                    "score" => outcome.score.map_or(Val::Undefined, num),
                    "cost_usd" => num(outcome.cost_usd),
                    "duration_ms" => count(outcome.duration_ms),
                    "exit_code" => {
                        outcome.details.get("exit_code").map_or(Val::Undefined, json_val)
                    }
                    "details" => walk(&outcome.details, &seg[3..]).map_or(Val::Undefined, json_val),
                    _ => Val::Undefined,
                }
            }
            Root::Level => {
                let Some(level) = s.level(&seg[1]) else { return Val::Undefined };
                if level.attempts == 0 {
                    return Val::Undefined;
                }
                match seg[2].as_str() {
                    "verdict" => level.verdict.as_deref().map_or(Val::Undefined, Val::Str),
                    "output" => Val::Str(&level.output),
                    "ok" => level.ok.map_or(Val::Undefined, Val::Bool),
                    "failed" => level.failed().map_or(Val::Undefined, Val::Bool),
                    "error" => match (level.error_kind, seg.get(3).map(String::as_str)) {
                        (Some(kind), Some("kind")) => Val::Str(kind.as_str()),
                        (Some(_), Some("message")) => level
                            .error
                            .as_deref()
                            .or(level.feedback.as_deref())
                            .map_or(Val::Undefined, Val::Str),
                        _ => Val::Undefined,
                    },
                    "skipped" => Val::Bool(level.skipped),
                    "timed_out" => Val::Bool(level.timed_out),
                    "attempts" => num(level.attempts),
                    "cost_usd" => num(level.cost_usd),
                    "tokens" => count(level.tokens),
                    "duration_ms" => count(level.duration_ms),
                    "confidence" => level.confidence.map_or(Val::Undefined, num),
                    "approved" => level.approved.map_or(Val::Undefined, Val::Bool),
                    "comment" => level.comment.as_deref().map_or(Val::Undefined, Val::Str),
                    "parsed" => level
                        .parsed
                        .as_ref()
                        .and_then(|p| walk(p, &seg[3..]))
                        .map_or(Val::Undefined, json_val),
                    _ => Val::Undefined,
                }
            }
            Root::Scratchpad => s
                .session
                .scratchpad
                .get(&seg[1])
                .and_then(|v| walk(v, &seg[2..]))
                .map_or(Val::Undefined, json_val),
            Root::Metadata => s
                .session
                .metadata
                .get(&seg[1])
                .and_then(|v| walk(v, &seg[2..]))
                .map_or(Val::Undefined, json_val),
            Root::Wave => {
                let Some(wave) = s.waves.get(self.source) else { return Val::Undefined };
                let Some(decided) = wave.closed.as_ref().or(wave.decided.as_ref()) else {
                    return Val::Undefined;
                };
                let c = wave.counts();
                match seg[1].as_str() {
                    "decision" => Val::Str(decided.decision.as_str()),
                    "assignments" => num(c.assignments),
                    "completed" => num(c.completed),
                    "partial" => num(c.partial),
                    "blocked" => num(c.blocked),
                    "failed" => num(c.failed),
                    "cancelled" => num(c.cancelled),
                    "planned" => num(c.planned),
                    "in_flight" => num(c.in_flight),
                    "cost_usd" => num(wave.spent().0),
                    "tokens" => count(wave.spent().1),
                    _ => Val::Undefined,
                }
            }
            // Only an MCP verifier's condition reads `result`.
            Root::Result | Root::Args => Val::Undefined,
            Root::Input => {
                if seg.len() == 1 {
                    return Val::Str(&s.session.input);
                }
                s.session
                    .input_json
                    .as_ref()
                    .and_then(|v| walk(v, &seg[1..]))
                    .map_or(Val::Undefined, json_val)
            }
        }
    }
}
