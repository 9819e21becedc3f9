//! `prompt` levels: render, call, read the answer (markdown, a verdict, JSON with its
//! schema), ask the user, retry on failed checks, write the scratchpad.

use crate::verifiers::{failures, feedback_text};
use crate::*;

impl Attempt {
    pub(super) async fn prompt(&self) -> Vec<NewEvent> {
        let started = Instant::now();
        let level = &self.scenario.levels[self.level];
        let LevelKind::Prompt { prompt, response } = &level.kind else { return Vec::new() };
        let mut events = Vec::new();
        let ctx = render::context(&self.state, &self.run_id, &level.id, &self.runtime.catalog);
        let mut text = match self.renderer.render(prompt, &ctx) {
            Ok(t) => t,
            Err(e) => {
                events.push(self.event(EventData::LevelFinished(Box::new(LevelFinished::failed(
                    e,
                    elapsed_ms(started),
                )))));
                return events;
            }
        };
        if !self.state.session.answers.is_empty() {
            let answers: Vec<&Value> = self.state.session.answers.iter().map(|(_, a)| a).collect();
            text.push_str(&format!(
                "\n\nThe user answered your questions: {}",
                Value::from(answers.into_iter().cloned().collect::<Vec<_>>())
            ));
        }
        let mut calls = self.calls();
        let json_mode = matches!(response, Response::Json { .. });
        let mut reply = match calls.call(&mut events, &prompt.name, &text, json_mode).await {
            Ok(r) => r,
            Err(stop) => return stop.finish(self, &mut events, started),
        };
        if let Some(question) = Some(&reply)
            .filter(|r| r.contains("ask_user"))
            .and_then(|r| verdict::parse_json(r))
            .and_then(|v| v.get("ask_user").cloned())
        {
            let call_id = format!("{}#{}#{}", level.id, self.attempt, calls.call);
            events.push(self.event(EventData::AskUser(AskUser { call_id, question })));
            return events;
        }
        let retries_max: u32 = level
            .verifiers
            .iter()
            .filter(|v| v.on_fail == OnFail::Retry)
            .map(|v| v.max_retries)
            .max()
            .unwrap_or(0);
        let mut retries_left = retries_max;
        let mut json_failure: Option<Vec<String>> = None;
        let mut unreadable_verdict = false;
        loop {
            let (mut verdict, confidence, parsed) = match response {
                Response::Markdown => (None, None, None),
                Response::Verdict => match verdict::parse(&reply) {
                    Some(v) => (Some(v.verdict), v.confidence, None),
                    None => {
                        let repair =
                            format!("{text}\n\nYour answer was:\n{reply}\n\n{}", verdict::CONTRACT);
                        match calls.call(&mut events, &prompt.name, &repair, false).await {
                            Ok(r) => reply = r,
                            Err(stop) => return stop.finish(self, &mut events, started),
                        }
                        match verdict::parse(&reply) {
                            Some(v) => (Some(v.verdict), v.confidence, None),
                            None => {
                                unreadable_verdict = true;
                                (Some("FAIL".to_owned()), None, None)
                            }
                        }
                    }
                },
                Response::Json { schema } => {
                    let mut parsed = verdict::parse_json(&reply);
                    let mut problems = json_problems(parsed.as_ref(), schema.as_ref());
                    if !problems.is_empty() {
                        // One repair call that says what was wrong.
                        let contract = schema.as_ref().map_or(String::new(), |s| {
                            format!(" matching this JSON Schema:\n{}", s.value())
                        });
                        let repair = format!(
                            "{text}\n\nYour answer was:\n{reply}\n\nAnswer with one JSON value{contract}\nProblems with your answer:\n- {}",
                            problems.join("\n- ")
                        );
                        match calls.call(&mut events, &prompt.name, &repair, true).await {
                            Ok(r) => reply = r,
                            Err(stop) => return stop.finish(self, &mut events, started),
                        }
                        parsed = verdict::parse_json(&reply);
                        problems = json_problems(parsed.as_ref(), schema.as_ref());
                    }
                    json_failure = (!problems.is_empty()).then_some(problems);
                    let confidence =
                        parsed.as_ref().and_then(|p| p.get("confidence")).and_then(Value::as_f64);
                    (None, confidence, parsed)
                }
            };
            let outcomes =
                self.verify(&mut calls, reply.clone(), parsed.clone(), &mut events).await;
            if let Some(reason) = interrupted_judge(&outcomes) {
                return Stop::Interrupted(reason).finish(self, &mut events, started);
            }
            let failed = failures(&level.verifiers, &outcomes);
            if failed.iter().any(|(spec, _)| spec.on_fail == OnFail::Retry) && retries_left > 0 {
                retries_left -= 1;
                let feedback = feedback_text(&failed);
                events.push(self.event(EventData::RetryScheduled(
                    baton_engine::event::RetryScheduled {
                        retry: retries_max - retries_left,
                        retries_max,
                        reason: feedback.trim_end().to_owned(),
                    },
                )));
                let retry = format!(
                    "{text}\n\nYour previous answer was:\n{reply}\n\nIt failed these checks; fix them:\n{feedback}"
                );
                match calls.call(&mut events, &prompt.name, &retry, json_mode).await {
                    Ok(r) => reply = r,
                    Err(stop) => return stop.finish(self, &mut events, started),
                }
                continue;
            }
            let mut scratchpad = Map::new();
            let mut feedback = String::new();
            if let Some(problems) = &json_failure {
                feedback.push_str(&format!(
                    "- the answer does not match its JSON contract: {}\n",
                    problems.join("; ")
                ));
            }
            feedback.push_str(&feedback_text(&failed));
            if !feedback.is_empty() {
                verdict = Some("FAIL".to_owned());
                scratchpad.insert("feedback".to_owned(), Value::String(feedback));
            }
            // A JSON answer's `scratchpad` object writes notes, each its own event.
            let (writes, refused) = baton_engine::scratchpad::from_answer(
                &self.state.session.scratchpad,
                parsed.as_ref(),
            );
            for (key, value) in writes {
                events.push(self.event(EventData::ScratchpadWritten(
                    baton_engine::event::ScratchpadWritten { key, value },
                )));
            }
            for message in refused {
                events
                    .push(self.event(EventData::Warning(baton_engine::event::Warning { message })));
            }
            let conflict = (verdict.as_deref() == Some("FAIL")).then(|| level.id.clone());
            // An answer that did not read, or checks that failed, fail the attempt in a way
            // edges can route; a FAIL the model gave on its own is its result.
            let error_kind = if json_failure.is_some() || unreadable_verdict {
                Some(ErrorKind::Invalid)
            } else if !failed.is_empty() {
                Some(ErrorKind::Verifier)
            } else {
                None
            };
            events.push(self.event(EventData::LevelFinished(Box::new(LevelFinished {
                ok: true,
                skipped: false,
                verdict,
                output: reply,
                parsed,
                confidence,
                scratchpad,
                conflict,
                error: None,
                error_kind,
                cost_usd: calls.cost_usd,
                tokens: calls.tokens,
                duration_ms: elapsed_ms(started),
                terminal: level.terminal,
                touched_paths: Vec::new(),
                snapshot: None,
            }))));
            return events;
        }
    }
}

/// What is wrong with a JSON answer: not JSON at all, or its schema's violations.
fn json_problems(parsed: Option<&Value>, schema: Option<&JsonSchema>) -> Vec<String> {
    match (parsed, schema) {
        (None, _) => vec!["the answer is not valid JSON".to_owned()],
        (Some(value), Some(schema)) => schema.violations(value),
        (Some(_), None) => Vec::new(),
    }
}
