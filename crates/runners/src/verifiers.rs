//! `verifier` levels, and every level's verifiers: run in their mode (serial, parallel,
//! race), judged by a model for `llm_judge`, their failures turned into feedback.

use crate::calls::Calls;
use crate::*;

impl Attempt {
    pub(super) async fn verifier_level(&self) -> Vec<NewEvent> {
        let started = Instant::now();
        let level = &self.scenario.levels[self.level];
        let mut events = Vec::new();
        let mut calls = self.calls();
        // A verifier level checks the work so far: the workspace, and for judges the output
        // of the last level that produced one.
        let last = self.state.session.last_output.clone().unwrap_or_default();
        let outcomes = self.verify(&mut calls, last, None, &mut events).await;
        if let Some(reason) = interrupted_judge(&outcomes) {
            return Stop::Interrupted(reason).finish(self, &mut events, started);
        }
        let failed = failures(&level.verifiers, &outcomes);
        let passed_names: Vec<&str> =
            outcomes.iter().filter(|o| o.passed).map(|o| o.name.as_str()).collect();
        let not_run: Vec<&str> =
            outcomes.iter().filter(|o| o.not_run()).map(|o| o.name.as_str()).collect();
        let summary = if failed.is_empty() {
            format!("all {} verifiers passed ({})", outcomes.len(), passed_names.join(", "))
        } else {
            let names: Vec<&str> = failed.iter().map(|(s, _)| s.name.as_str()).collect();
            let ran = outcomes.len() - not_run.len();
            let mut summary =
                format!("{} of {ran} verifiers failed ({})", failed.len(), names.join(", "));
            if !not_run.is_empty() {
                summary.push_str(&format!(
                    "; {} not run after it ({})",
                    not_run.len(),
                    not_run.join(", ")
                ));
            }
            summary
        };
        let mut scratchpad = Map::new();
        scratchpad.insert("build_result_summary".to_owned(), Value::String(summary.clone()));
        // The level's output is what later levels read of the check: the summary, and on
        // failure every failed verifier's reasons.
        let mut output = summary;
        let verdict = if failed.is_empty() {
            scratchpad.insert("build_feedback".to_owned(), Value::Null);
            "PASS"
        } else {
            let feedback = feedback_text(&failed);
            output = format!("{output}\n{feedback}");
            scratchpad.insert("build_feedback".to_owned(), Value::String(feedback));
            "FAIL"
        };
        events.push(self.event(EventData::LevelFinished(Box::new(LevelFinished {
            ok: true,
            skipped: false,
            verdict: Some(verdict.to_owned()),
            output,
            parsed: None,
            confidence: None,
            scratchpad,
            conflict: (verdict == "FAIL").then(|| format!("verify:{}", level.id)),
            error: None,
            error_kind: (verdict == "FAIL").then_some(ErrorKind::Verifier),
            cost_usd: calls.cost_usd,
            tokens: calls.tokens,
            duration_ms: elapsed_ms(started),
            terminal: level.terminal,
            touched_paths: Vec::new(),
            snapshot: None,
        }))));
        events
    }
}

/// The verifiers that failed and count (those not set to `on_fail: ignore`).
pub(super) fn failures<'a>(
    specs: &'a [VerifierSpec],
    outcomes: &'a [VerifierFinished],
) -> Vec<(&'a VerifierSpec, &'a VerifierFinished)> {
    specs
        .iter()
        .zip(outcomes)
        .filter(|(spec, o)| {
            !o.passed && spec.on_fail != OnFail::Ignore && !lost_race(o) && !o.not_run()
        })
        .collect()
}

pub(super) fn feedback_text(failed: &[(&VerifierSpec, &VerifierFinished)]) -> String {
    let mut out = String::new();
    for (spec, outcome) in failed {
        out.push_str(&format!(
            "- {} ({}): {}\n",
            spec.name,
            spec.uses.as_str(),
            outcome.reasons.join("; ")
        ));
        // The program's complaint: its stderr, or its stdout when it wrote nothing else
        // (compilers such as Python's compileall report errors there).
        let output = |key: &str| {
            outcome.details.get(key).and_then(Value::as_str).filter(|t| !t.trim().is_empty())
        };
        let complaint = output("stderr_tail")
            .map(|t| ("stderr", t))
            .or_else(|| output("stdout_tail").map(|t| ("stdout", t)));
        if let Some((stream, tail)) = complaint {
            out.push_str(&format!(
                "  {stream} (tail):\n{}\n",
                verifier::tail(tail, limits::FEEDBACK_TAIL_BYTES)
            ));
        }
    }
    out
}

/// Runs a level's verifiers in its mode; outcomes come back in declared order.
pub(super) async fn run_verifiers(
    run: &Attempt,
    calls: &mut Calls<'_>,
    specs: &[VerifierSpec],
    mode: Mode,
    run_all: bool,
    ctx: &VerifyContext,
    events: &mut Vec<NewEvent>,
) -> Vec<VerifierFinished> {
    let mut outcomes = Vec::with_capacity(specs.len());
    for spec in specs {
        events.push(run.event(EventData::VerifierStarted(VerifierStarted {
            name: spec.name.clone(),
            uses: spec.uses.as_str().to_owned(),
        })));
    }
    match mode {
        Mode::Serial => {
            let mut stopped = false;
            for spec in specs {
                let outcome = if stopped {
                    verifier::not_run(spec, "not run: an earlier verifier failed (serial mode)")
                } else if spec.uses == Uses::LlmJudge {
                    judge(run, calls, spec, ctx, events).await
                } else {
                    verify_one(run, spec, ctx, &run.cancel).await
                };
                if !outcome.passed && !run_all && spec.on_fail != OnFail::Ignore {
                    stopped = true;
                }
                outcomes.push(outcome);
            }
        }
        Mode::Parallel | Mode::Race => {
            // Judges are model calls recorded in this step's events: they run one after
            // another, in declared order; the other verifiers run all at once.
            let others: Vec<&VerifierSpec> =
                specs.iter().filter(|s| s.uses != Uses::LlmJudge).collect();
            let mut done = if mode == Mode::Race {
                race(run, &others, ctx).await.into_iter()
            } else {
                let futures: Vec<_> =
                    others.iter().map(|spec| verify_one(run, spec, ctx, &run.cancel)).collect();
                join_limited(futures, others.len()).await.into_iter()
            };
            let mut slots = Vec::with_capacity(specs.len());
            for spec in specs {
                if spec.uses == Uses::LlmJudge {
                    slots.push(judge(run, calls, spec, ctx, events).await);
                } else {
                    slots.push(done.next().unwrap_or_else(|| {
                        verifier::unavailable(spec, "the verifier did not run")
                    }));
                }
            }
            outcomes = slots;
        }
    }
    // What a verifier saw is outside text (a program's output, an MCP result): secrets
    // go before it is recorded or fed back to a model.
    for outcome in &mut outcomes {
        run.runtime.redactor.redact_outcome(outcome);
        events.push(run.event(EventData::VerifierFinished(outcome.clone())));
    }
    outcomes
}

/// Runs verifiers at once until the first conclusive outcome (a check that ran, passed or
/// not); the others are cancelled then (their processes killed) and reported as not
/// needed. A cancel of the step cancels them all.
async fn race(
    run: &Attempt,
    specs: &[&VerifierSpec],
    ctx: &VerifyContext,
) -> Vec<VerifierFinished> {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::Poll;
    let race = CancelToken::new();
    let mut pending: Vec<Option<Pin<Box<dyn Future<Output = VerifierFinished> + Send + '_>>>> =
        specs.iter().map(|spec| Some(Box::pin(verify_one(run, spec, ctx, &race)) as _)).collect();
    let mut results: Vec<Option<VerifierFinished>> = vec![None; specs.len()];
    let mut winner: Option<usize> = None;
    let outer = run.cancel.cancelled();
    tokio::pin!(outer);
    let mut outer_done = false;
    std::future::poll_fn(|cx| {
        if !outer_done && outer.as_mut().poll(cx).is_ready() {
            outer_done = true;
            race.cancel();
        }
        for (i, slot) in pending.iter_mut().enumerate() {
            let Some(future) = slot else { continue };
            if let Poll::Ready(outcome) = future.as_mut().poll(cx) {
                *slot = None;
                if winner.is_none() && !race.is_cancelled() && outcome.score.is_some() {
                    winner = Some(i);
                    race.cancel();
                }
                results[i] = Some(outcome);
            }
        }
        if pending.iter().all(Option::is_none) { Poll::Ready(()) } else { Poll::Pending }
    })
    .await;
    let cut_short = winner.is_some() || run.cancel.is_cancelled();
    specs
        .iter()
        .zip(results)
        .enumerate()
        .map(|(i, (spec, outcome))| match (outcome, winner) {
            (Some(o), Some(w)) if i != w && o.score.is_none() && cut_short => {
                let by = &specs[w].name;
                let mut lost = verifier::unavailable(
                    spec,
                    &format!("not needed: `{by}` settled the race first"),
                );
                lost.details = json!({"race_lost_to": by});
                lost
            }
            (Some(o), _) => o,
            (None, _) => verifier::unavailable(spec, "the verifier did not run"),
        })
        .collect()
}

/// Whether an outcome is a race's loser, cancelled once another verifier settled it.
fn lost_race(outcome: &VerifierFinished) -> bool {
    outcome.details.get("race_lost_to").is_some()
}

/// An `llm_judge`: one model call, recorded in the step's events, between the [`Judge`]'s
/// question and its scoring of the answer.
///
/// [`Judge`]: baton_engine::verifier::Judge
async fn judge(
    run: &Attempt,
    calls: &mut Calls<'_>,
    spec: &VerifierSpec,
    ctx: &VerifyContext,
    events: &mut Vec<NewEvent>,
) -> VerifierFinished {
    let started = Instant::now();
    let Some(judge) = run.runtime.verifiers.judge() else {
        return verifier::unavailable(
            spec,
            "the `llm_judge` verifier is not available in this build",
        );
    };
    let asked = match judge.ask(spec, ctx) {
        Ok(asked) => asked,
        Err(why) => return verifier::unavailable(spec, &why),
    };
    let spent = calls.cost_usd;
    let answer = match calls.call(events, &asked.name, &asked.prompt, true).await {
        Ok(text) => text,
        Err(Stop::Failed(message, _)) => {
            return verifier::unavailable(
                spec,
                &format!("the judge's model call failed: {message}"),
            );
        }
        // An outage says nothing about the work: the level is interrupted, not failed.
        Err(Stop::Interrupted(message)) => {
            let mut outcome = verifier::unavailable(
                spec,
                &format!("every model the judge may use is unavailable: {message}"),
            );
            outcome.details = json!({ INTERRUPTED_KEY: message });
            return outcome;
        }
        Err(Stop::Halted) => {
            return verifier::unavailable(
                spec,
                "the judge was not called: the budget or a cancel stopped the level",
            );
        }
    };
    let mut outcome = judge.score(spec, &answer);
    outcome.cost_usd = calls.cost_usd - spent;
    outcome.duration_ms = elapsed_ms(started);
    outcome
}

async fn verify_one(
    run: &Attempt,
    spec: &VerifierSpec,
    ctx: &VerifyContext,
    cancel: &CancelToken,
) -> VerifierFinished {
    if let Some(recorded) =
        run.runtime.verifiers.trusted(&run.run_id, run.id(), run.attempt, &spec.name)
    {
        return recorded;
    }
    match run.runtime.verifiers.get(spec.uses) {
        Some(v) => v.verify(spec, ctx, cancel).await,
        None => verifier::unavailable(
            spec,
            &format!("the `{}` verifier is not available in this build", spec.uses.as_str()),
        ),
    }
}
