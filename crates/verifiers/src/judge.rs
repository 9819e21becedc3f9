//! The `llm_judge` verifier's question and scoring: the prompt that asks a model to score
//! a level's output against each criterion of a rubric, and the outcome its answer gives
//! — the weighted mean of the criteria's scores against the threshold. The engine makes
//! the one model call between them (reserved against the budget, recorded in the step's
//! events, replayed from the log).

use baton_engine::event::VerifierFinished;
use baton_engine::verifier::{Judge, JudgeCall, VerifyContext, unavailable};
use baton_runners::verdict;
use baton_scenario::model::VerifierSpec;
use serde_json::{Map, Value, json};

/// Scores against the verifier's rubric: each criterion from 0.0 to 1.0, with a reason.
#[derive(Clone, Copy, Debug, Default)]
pub struct RubricJudge;

impl Judge for RubricJudge {
    fn ask(&self, spec: &VerifierSpec, ctx: &VerifyContext) -> Result<JudgeCall, String> {
        let Some(rubric) = &spec.rubric else {
            return Err("the judge has no rubric".to_owned());
        };
        let mut prompt = format!(
            "You are a strict reviewer. Score the work below against each criterion, from 0.0 (not met) to 1.0 (fully met).\n\n{}\n\nCriteria:\n",
            rubric.body
        );
        for c in &rubric.criteria {
            prompt.push_str(&format!("- {} (weight {}): {}\n", c.id, c.weight, c.description));
        }
        prompt.push_str(&format!(
            "\nThe work:\n{}\n\nAnswer with only a JSON object: {{\"scores\": {{\"<criterion>\": <0.0 to 1.0>}}, \"reasons\": {{\"<criterion>\": \"<one sentence>\"}}}}",
            ctx.output
        ));
        Ok(JudgeCall { name: format!("judge:{}", rubric.id), prompt })
    }

    fn score(&self, spec: &VerifierSpec, answer: &str) -> VerifierFinished {
        let Some(rubric) = &spec.rubric else {
            return unavailable(spec, "the judge has no rubric");
        };
        let parsed = verdict::parse_json(answer);
        let Some(scores) =
            parsed.as_ref().and_then(|v| v.get("scores").cloned()).filter(Value::is_object)
        else {
            return unavailable(spec, "the judge did not answer with {\"scores\": {…}}");
        };
        let reasons_given =
            parsed.as_ref().and_then(|v| v.get("reasons").cloned()).unwrap_or(Value::Null);
        let threshold =
            spec.params.get("threshold").and_then(Value::as_f64).unwrap_or(rubric.pass_threshold);
        let (mut weighted, mut weights) = (0.0, 0.0);
        let mut reasons = Vec::new();
        let mut per_criterion = Map::new();
        for c in &rubric.criteria {
            let score =
                scores.get(&c.id).and_then(Value::as_f64).map_or(0.0, |s| s.clamp(0.0, 1.0));
            weighted += c.weight * score;
            weights += c.weight;
            per_criterion.insert(c.id.clone(), json!(score));
            if score < threshold {
                let why = reasons_given.get(&c.id).and_then(Value::as_str).unwrap_or(
                    if scores.get(&c.id).is_none() { "not scored" } else { "no reason given" },
                );
                reasons.push(format!("{} {score:.2}: {why}", c.id));
            }
        }
        let score = if weights > 0.0 { weighted / weights } else { 0.0 };
        let passed = score >= threshold;
        VerifierFinished {
            name: spec.name.clone(),
            passed,
            score: Some(score),
            reasons: if passed { Vec::new() } else { reasons },
            cost_usd: 0.0,
            duration_ms: 0,
            details: json!({"rubric": rubric.id, "threshold": threshold, "scores": per_criterion}),
        }
    }
}
