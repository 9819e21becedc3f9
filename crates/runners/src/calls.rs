//! The model calls of one attempt: each reserved against the budget before it is made,
//! recorded with its routing, retries, failovers and stop reason.

use crate::*;

/// The model calls of one attempt, with their running cost.
pub(crate) struct Calls<'a> {
    pub(crate) run: &'a Attempt,
    pub(super) call_index: u32,
    pub(crate) call: u32,
    pub(crate) cost_usd: f64,
    pub(crate) tokens: u64,
}

impl Calls<'_> {
    pub(super) async fn call(
        &mut self,
        events: &mut Vec<NewEvent>,
        template: &str,
        prompt: &str,
        json: bool,
    ) -> Result<String, Stop> {
        let level = &self.run.scenario.levels[self.run.level];
        // The level's own answer carries its schema; a judge's answer has its own shape.
        let schema = match &level.kind {
            LevelKind::Prompt { response: Response::Json { schema: Some(s) }, .. }
                if json && !template.starts_with("judge:") =>
            {
                Some(s.value().clone())
            }
            _ => None,
        };
        // A person's steering reaches the level's own calls, not its judges'.
        let steer = if template.starts_with("judge:") { None } else { self.steering() };
        let prompt = match &steer {
            Some(taken) => format!("{prompt}\n\n{}", taken.text()),
            None => prompt.to_owned(),
        };
        let request = ModelRequest {
            scenario_id: self.run.scenario.id.clone(),
            level_id: level.id.clone(),
            call_index: self.call_index,
            system: None,
            prompt,
            json,
            schema,
            max_tokens: limits::MAX_TOKENS_DEFAULT,
            constraint: level.model.clone(),
            turns: Vec::new(),
            tools: Vec::new(),
            deadline: None,
        };
        Ok(self.send(events, template, request, true, steer).await?.text)
    }

    /// The steering messages for the next call, when the level is steerable and any wait;
    /// the call that is given them records their delivery with its answer (or gives them
    /// back when it fails).
    pub(crate) fn steering(&self) -> Option<baton_engine::steering::Taken> {
        let level = &self.run.scenario.levels[self.run.level];
        if !level.steerable {
            return None;
        }
        self.run.steering.take(&level.id, self.run.attempt, self.call_index)
    }

    /// A call an earlier driver of the attempt made, answered from its recorded events: it
    /// counts as made, and says why it stopped as it did then.
    pub(crate) fn recorded(
        &mut self,
        response: ModelResponse,
        stop_reason: Option<String>,
    ) -> Result<ModelReply, Stop> {
        let call = self.call;
        self.call += 1;
        self.call_index += 1;
        self.cost_usd += response.cost_usd;
        self.tokens += response.usage.total();
        if stop_reason.as_deref() == Some(STOP_MAX_TOKENS) {
            return Err(Stop::Failed(
                format!(
                    "the answer of call {call} was cut at the output limit (stop reason `{STOP_MAX_TOKENS}`)"
                ),
                Some(ErrorKind::Truncated),
            ));
        }
        Ok(ModelReply {
            provider: response.provider,
            model: response.model,
            text: response.text,
            tool_calls: response.tool_calls,
            usage: response.usage,
            cost_usd: response.cost_usd,
            routing: None,
            stop_reason,
            failovers: Vec::new(),
        })
    }

    /// Counts a call that failed without an answer, so the next one gets the next index.
    pub(crate) fn skip(&mut self) {
        self.call_index += 1;
    }

    /// Reserves the call's worst case against the cost cap, with what the step's other calls
    /// (a fan-out's other children included) spent and hold; a call that would cross it is
    /// refused before it is made, recorded as `budget_exceeded`.
    pub(super) fn reserve(
        &self,
        events: &mut Vec<NewEvent>,
        request: &ModelRequest,
    ) -> Result<Option<Reservation>, Stop> {
        let state = &self.run.state;
        let Some(max) = state.budget.max_cost_usd else { return Ok(None) };
        let worst = self.run.runtime.model.worst_case_cost_usd(request);
        match self.run.reservations.reserve(state.totals.cost_usd, worst, max) {
            Ok(reservation) => Ok(Some(reservation)),
            Err(reached) => {
                events.push(self.run.event(EventData::BudgetExceeded(BudgetExceeded {
                    limit_kind: "cost".to_owned(),
                    limit_value: max,
                    observed_value: reached,
                    refused_before_call: true,
                })));
                Err(Stop::Halted)
            }
        }
    }

    /// Makes one model call: refuses it when its worst case would cross the cost cap,
    /// records the prompt (when `record_prompt`), the routing and the answer, and counts
    /// its cost. The answer's text is cut at the size limit.
    pub(crate) async fn send(
        &mut self,
        events: &mut Vec<NewEvent>,
        template: &str,
        mut request: ModelRequest,
        record_prompt: bool,
        steer: Option<baton_engine::steering::Taken>,
    ) -> Result<ModelReply, Stop> {
        request.call_index = self.call_index;
        let result = self.send_steered(events, template, &mut request, record_prompt).await;
        match (&result, steer) {
            (Ok(_), Some(taken)) => {
                let (received, delivered) = taken.delivered(request.call_index);
                events.extend(received);
                events.push(self.run.event(delivered));
            }
            (Err(_), Some(taken)) => self.run.steering.put_back(taken),
            (_, None) => {}
        }
        result
    }

    /// [`Calls::send`] but for the steering it carries.
    async fn send_steered(
        &mut self,
        events: &mut Vec<NewEvent>,
        template: &str,
        request: &mut ModelRequest,
        record_prompt: bool,
    ) -> Result<ModelReply, Stop> {
        let reservation = self.reserve(events, request)?;
        if record_prompt {
            let sent = self.run.event(EventData::PromptSent(PromptSent {
                template: template.to_owned(),
                system: request.system.clone(),
                prompt: request.prompt.clone(),
                call: self.call,
                request_hash: Some(request.hash()),
                worst_case_usd: Some(self.run.runtime.model.worst_case_cost_usd(request)),
            }));
            if self.run.runtime.model.reaches_out(request) {
                if !self.run.commit_before(events, sent).await {
                    return Err(Stop::Halted);
                }
            } else {
                events.push(sent);
            }
        }
        request.deadline = self.run.deadline;
        let result = self.run.runtime.model.call(request, &self.run.cancel).await;
        // Every HTTP-level retry the client made is recorded, whatever the call's outcome,
        // and so is what a call cut short spent.
        let progress = self.run.cancel.progress();
        let redactor = &self.run.runtime.redactor;
        for mut retry in progress.take_retries(&request.level_id, request.call_index) {
            redactor.redact_in_place(&mut retry.reason);
            events.push(self.run.event(EventData::ProviderRetry(retry)));
        }
        let mut cut_usd = 0.0;
        for cut in progress.take_cuts(&request.level_id, request.call_index) {
            self.cost_usd += cut.cost_usd;
            self.tokens += cut.usage.total();
            cut_usd += cut.cost_usd;
            events.push(self.run.event(EventData::ModelCallCut(cut)));
        }
        // The reservation shrinks to what the call spent: its answer, or what a cut one cost.
        if let Some(reservation) = reservation {
            reservation.settle(result.as_ref().map_or(cut_usd, |reply| reply.cost_usd));
        }
        let mut reply = match result {
            Ok(r) => r,
            Err(ModelError::Cancelled) => return Err(Stop::Halted),
            Err(e @ ModelError::Unavailable { .. }) => {
                return Err(Stop::Interrupted(redactor.redact(&e.to_string()).into_owned()));
            }
            Err(e) => {
                let mut kind = None;
                if let ModelError::Failed { provider, message, refused } = &e {
                    kind = Some(if *refused { ErrorKind::Refused } else { ErrorKind::Provider });
                    events.push(self.run.event(EventData::ModelCallFailed(ModelCallFailed {
                        call: self.call,
                        call_index: request.call_index,
                        request_hash: request.hash(),
                        provider: redactor.redact(provider).into_owned(),
                        message: redactor.redact(message).into_owned(),
                    })));
                }
                return Err(Stop::Failed(redactor.redact(&e.to_string()).into_owned(), kind));
            }
        };
        for mut failover in std::mem::take(&mut reply.failovers) {
            redactor.redact_in_place(&mut failover.reason);
            events.push(self.run.event(EventData::ProviderFailover(failover)));
        }
        if let Some(mut routing) = reply.routing.take() {
            routing.failovers.iter_mut().for_each(|f| redactor.redact_in_place(f));
            events.push(self.run.event(EventData::RoutingDecision(routing)));
        }
        if reply.text.len() > limits::MODEL_TEXT_BYTES_MAX {
            let mut cut = limits::MODEL_TEXT_BYTES_MAX;
            while !reply.text.is_char_boundary(cut) {
                cut -= 1;
            }
            reply.text.truncate(cut);
            reply.text.push_str("\n[answer cut at the size limit]");
        }
        baton_engine::model::cap_tool_calls(&mut reply.tool_calls);
        events.push(self.run.event(EventData::ModelResponse(ModelResponse {
            provider: reply.provider.clone(),
            model: reply.model.clone(),
            request_hash: request.hash(),
            call: self.call,
            text: reply.text.clone(),
            tool_calls: reply.tool_calls.clone(),
            usage: reply.usage,
            cost_usd: reply.cost_usd,
        })));
        let call = self.call;
        self.call += 1;
        self.call_index += 1;
        self.cost_usd += reply.cost_usd;
        self.tokens += reply.usage.total();
        if let Some(stop_reason) = reply.stop_reason.clone() {
            events.push(self.run.event(EventData::ModelStopped(ModelStopped {
                call,
                stop_reason: stop_reason.clone(),
            })));
            // An answer cut at the output limit is never a success, whatever it parses as:
            // the attempt fails with that reason (and is retried or escalated as any).
            if stop_reason == STOP_MAX_TOKENS {
                return Err(Stop::Failed(
                    format!(
                        "the answer of call {call} was cut at the output limit of {} tokens (stop reason `{STOP_MAX_TOKENS}`); raise the level's `max_tokens` or ask for a shorter answer",
                        request.max_tokens
                    ),
                    Some(ErrorKind::Truncated),
                ));
            }
        }
        Ok(reply)
    }
}
