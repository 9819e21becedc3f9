//! `fan_out` levels: children run at once, each settled child committed as it finishes,
//! the fan-in read in declared order.

use crate::*;

impl Attempt {
    /// Runs the fan-out's children that have not started in its current attempt (all of
    /// them, but after a step stopped part-way); the others are read from the state.
    /// Each child that finishes is sent to the executor through `settled` to be committed
    /// at once, but the last to settle: its events come back with the fan-out's result, so
    /// the log never holds every child without the fan-out's end. The fan-out's result
    /// reads every child in declared order, whatever order they settled in.
    pub(super) async fn fan_out(&self) -> Vec<NewEvent> {
        let started = Instant::now();
        let level = &self.scenario.levels[self.level];
        let LevelKind::FanOut { children, max_parallel, .. } = &level.kind else {
            return Vec::new();
        };
        let before = fan_in::children_in_attempt(&self.scenario, &self.state, self.level);
        let runs: Vec<Attempt> = before
            .iter()
            .filter(|(_, c)| matches!(c, ChildState::NotStarted))
            .map(|&(child, _)| {
                let mut run = self.clone();
                run.sent = None;
                run.level = child;
                run.attempt =
                    self.state.level(&self.scenario.levels[child].id).map_or(0, |l| l.attempts) + 1;
                run
            })
            .collect();
        let unsettled = AtomicUsize::new(runs.len());
        let futures = runs.iter().map(|run| {
            let parent = level.id.clone();
            let unsettled = &unsettled;
            async move {
                let child = &run.scenario.levels[run.level];
                let mut events = vec![run.event(EventData::LevelStarted(LevelStarted {
                    role: child.role.clone(),
                    kind: child.kind_name().to_owned(),
                    parent: Some(parent),
                    model_constraint_allow: Some(baton_engine::plan::constraint_allow(child)),
                    process: None,
                }))];
                events.extend(run.bounded(true).await);
                let last = unsettled.fetch_sub(1, Ordering::SeqCst) == 1;
                let sent = !last && self.send_settled(&child.id, &events);
                (events, sent)
            }
        });
        let mut results = join_limited(futures.collect(), *max_parallel as usize).await.into_iter();
        // Every child in declared order: those that settled before this step from the
        // state, the others from what they did now.
        let mut ran: Vec<(LevelIdx, Vec<NewEvent>, bool)> = Vec::with_capacity(runs.len());
        for (child, state) in &before {
            if matches!(state, ChildState::NotStarted)
                && let Some((events, sent)) = results.next()
            {
                ran.push((*child, events, sent));
            }
        }
        let mut finished = Vec::with_capacity(children.len());
        let (mut budget_stop, mut waiting) = (false, false);
        let mut interrupted: Option<baton_engine::event::RunInterrupted> = None;
        for (child, state) in &before {
            let child_id = self.scenario.levels[*child].id.as_str();
            match state {
                ChildState::Finished(result) => finished.push(result.clone()),
                ChildState::Unsettled => {
                    waiting |= self.state.open_approvals().any(|p| p.level_id == child_id);
                }
                ChildState::NotStarted => {
                    let Some((_, child_events, _)) = ran.iter().find(|(c, ..)| c == child) else {
                        continue;
                    };
                    for e in child_events {
                        match &e.data {
                            EventData::LevelFinished(f)
                                if e.level_id.as_deref() == Some(child_id) =>
                            {
                                finished.push(ChildResult {
                                    id: child_id,
                                    ok: f.ok,
                                    verdict: f.verdict.as_deref(),
                                    error: f.error.as_deref(),
                                    error_kind: f.error_kind,
                                    cost_usd: f.cost_usd,
                                    tokens: f.tokens,
                                });
                            }
                            EventData::BudgetExceeded(_) => budget_stop = true,
                            EventData::ApprovalRequested(_) => waiting = true,
                            EventData::RunInterrupted(i) => interrupted = Some(i.clone()),
                            _ => {}
                        }
                    }
                }
            }
        }
        // A child that waits for a decision leaves the fan-out in flight (unless another
        // child failed): the planner finishes it once the last decision is in.
        let waiting = waiting && finished.iter().all(|c| c.error.is_none());
        let result = (!budget_stop && !waiting && interrupted.is_none())
            .then(|| fan_in::aggregate(level, &finished, children.len(), elapsed_ms(started)));
        // What was not committed as its child settled comes back in declared order. A child
        // stopped by an outage keeps only what it spent, so a resume runs it again.
        let mut events: Vec<NewEvent> = Vec::new();
        for (_, child_events, sent) in ran {
            if sent {
                continue;
            }
            if child_events.iter().any(|e| matches!(e.data, EventData::RunInterrupted(_))) {
                events.extend(child_events.into_iter().filter(|e| {
                    e.data.spend().is_some() || matches!(e.data, EventData::ProviderRetry(_))
                }));
            } else {
                events.extend(child_events);
            }
        }
        if let Some(result) = result {
            events.push(self.event(EventData::LevelFinished(Box::new(result))));
        }
        if let Some(interrupted) = interrupted {
            events.push(self.event(EventData::RunInterrupted(interrupted)));
        }
        events
    }

    /// Sends a child's events to the executor to be committed now, when the child finished
    /// (a child that waits for a person or was stopped comes back with the step) and the
    /// step goes on; whether they were sent.
    fn send_settled(&self, child_id: &str, events: &[NewEvent]) -> bool {
        let Some(settled) = &self.settled else { return false };
        let finished = events.iter().any(|e| {
            matches!(e.data, EventData::LevelFinished(_)) && e.level_id.as_deref() == Some(child_id)
        });
        finished && !self.cancel.is_cancelled() && settled.try_send(events.to_vec()).is_ok()
    }
}
