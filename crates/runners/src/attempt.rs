//! One attempt of a level: its kind's work, bounded by the level's `timeout_s`, and its
//! verifiers.

use crate::calls::Calls;
use crate::verifiers::run_verifiers;
use crate::*;

impl Attempt {
    /// Runs this level's verifiers on `output` (and its parsed JSON).
    pub(super) async fn verify(
        &self,
        calls: &mut Calls<'_>,
        output: String,
        parsed: Option<Value>,
        events: &mut Vec<NewEvent>,
    ) -> Vec<VerifierFinished> {
        let level = &self.scenario.levels[self.level];
        let ctx = VerifyContext {
            workspace: self.workspace_dir(),
            input: self.state.session.input.clone(),
            output,
            parsed,
            scratchpad: self.state.session.scratchpad.clone(),
        };
        run_verifiers(self, calls, &level.verifiers, level.mode, level.run_all, &ctx, events).await
    }

    /// The model calls of this attempt, numbered on from the ones already in the log.
    pub(crate) fn calls(&self) -> Calls<'_> {
        let level = self.state.level(self.id());
        // A resumed attempt's answers in the log are counted in the state already; the
        // attempt goes through them again, counting them as it does.
        #[allow(clippy::cast_possible_truncation)]
        let replayed = self
            .resumed
            .iter()
            .filter(|e| matches!(e.data, baton_engine::event::EventData::ModelResponse(_)))
            .count() as u32;
        Calls {
            run: self,
            call_index: level.map_or(0, |l| l.calls_total).saturating_sub(replayed),
            cost_usd: 0.0,
            tokens: 0,
            call: level.map_or(0, |l| l.calls).saturating_sub(replayed),
        }
    }

    /// Runs the attempt within the level's `timeout_s`. At the deadline the attempt's own
    /// cancel token fires (its model stream is dropped, its processes are killed) and the
    /// attempt is awaited until it has stopped, so nothing it started runs or writes after
    /// it; what it did is replaced by `level_timed_out` and a failed `level_finished`. The
    /// model calls it made are kept: their spend counts.
    pub(crate) async fn bounded(&self, in_fan_out: bool) -> Vec<NewEvent> {
        let level = &self.scenario.levels[self.level];
        // An approval's timeout bounds the wait for a person, not work.
        let limit = match level.kind {
            LevelKind::HumanApproval { .. } => None,
            _ => level.timeout_s.map(Duration::from_secs_f64),
        };
        let Some(limit) = limit else { return self.body(in_fan_out).await };
        let started = Instant::now();
        let mut attempt = self.clone();
        attempt.cancel = self.cancel.child();
        let ends = started + limit;
        attempt.deadline = Some(self.deadline.map_or(ends, |d| d.min(ends)));
        let work = attempt.body(in_fan_out);
        tokio::pin!(work);
        tokio::select! {
            events = &mut work => return events,
            () = tokio::time::sleep(limit) => {}
        }
        attempt.cancel.cancel();
        let cut = work.await;
        if self.cancel.is_cancelled() {
            // The run was cancelled meanwhile: the executor keeps none of the step.
            return cut;
        }
        let mut events = kept_when_cut(cut);
        let elapsed = elapsed_ms(started);
        let timeout_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        events.push(
            self.event(EventData::LevelTimedOut(LevelTimedOut { timeout_ms, elapsed_ms: elapsed })),
        );
        let (cost_usd, tokens) = events
            .iter()
            .filter(|e| e.level_id.as_deref() == Some(self.id()))
            .filter_map(|e| e.data.spend())
            .fold((0.0, 0), |(c, t), (cost, tokens)| (c + cost, t + tokens));
        let mut finished = LevelFinished::failed(String::new(), elapsed);
        finished.error = None;
        finished.error_kind = Some(ErrorKind::Timeout);
        finished.cost_usd = cost_usd;
        finished.tokens = tokens;
        finished.conflict = Some(format!("timed_out:{}", level.id));
        finished.scratchpad.insert(
            "feedback".to_owned(),
            Value::String(format!(
                "level `{}` attempt {} timed out after {} (timeout_s) and was cut",
                level.id,
                self.attempt,
                seconds(limit)
            )),
        );
        events.push(self.event(EventData::LevelFinished(Box::new(finished))));
        events
    }

    /// The attempt's work, by kind; inside a fan-out only the kinds a child may be.
    pub(super) async fn body(&self, in_fan_out: bool) -> Vec<NewEvent> {
        let level = &self.scenario.levels[self.level];
        match &level.kind {
            LevelKind::Prompt { .. } => self.prompt().await,
            LevelKind::Verifier => self.verifier_level().await,
            // Each approval child asks for its own decision and waits for it.
            LevelKind::HumanApproval { .. } => self.approval(),
            _ if in_fan_out => {
                vec![self.event(EventData::LevelFinished(Box::new(LevelFinished::failed(
                    format!(
                        "fan-out child `{}` is a {}, which cannot run inside a fan-out",
                        level.id,
                        level.kind_name()
                    ),
                    0,
                ))))]
            }
            LevelKind::FanOut { .. } => Box::pin(self.fan_out()).await,
            LevelKind::ToolLoop { .. } => self.tool_loop().await,
            // The planner and the executor drive a wave; it never comes to a runner.
            LevelKind::Wave(_) => {
                vec![self.event(EventData::LevelFinished(Box::new(LevelFinished::failed(
                    format!(
                        "wave level `{}` is driven by the executor, not run as a step",
                        level.id
                    ),
                    0,
                ))))]
            }
        }
    }
}
