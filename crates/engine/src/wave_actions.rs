//! What outside agents do to a wave, as one typed set of actions: dispatch an assignment
//! to a worker they run, record its outcome, ask for the controller's decision, and close
//! the wave. The CLI's `baton wave …`, the server and the MCP tools all go through
//! [`Engine::wave_act`].
//!
//! Every action is a conditional append on the wave's run (`append_external`): it re-reads
//! the log and re-checks that what it changes is still open in the same step as the
//! append, so of two agents recording one assignment, exactly one wins.

use std::sync::Arc;

use baton_scenario::Scenario;
use serde::Serialize;
use serde_json::{Value, json};

use crate::event::{
    EventData, NewEvent, WaveCounts, WaveDecided, WaveDecision, WaveDispatched, WaveRecorded,
    WorkerOutcome,
};
use crate::exec::{Engine, Error};
use crate::state::RunState;
use crate::wave::{self, WaveState};

/// Which assignment an action is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// By its id (`assign-001`).
    Assignment(String),
    /// By its task's id.
    Task(String),
}

/// An action on a wave.
#[derive(Clone, Debug, PartialEq)]
pub enum WaveAction {
    /// An outside agent gives a planned assignment to a worker it runs (`worker_run`).
    Dispatch { target: Target, worker_run: String, by: Option<String> },
    /// An outside agent records the outcome of an assignment it dispatched.
    Record {
        target: Target,
        outcome: WorkerOutcome,
        summary: String,
        blockers: Vec<String>,
        by: Option<String>,
    },
    /// The controller's decision now (assignments past their timeout are recorded failed
    /// first).
    Decide,
    /// Ends a wave whose decision is an end (complete, replan or escalate).
    Complete { by: Option<String> },
    /// Cancels the wave's run and every worker below it; a run nobody drives ends here,
    /// after its workers settled (up to the settle timeout), one being driven at its
    /// driver's next check.
    Cancel { by: Option<String>, reason: Option<String> },
}

/// What an action did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WaveReply {
    pub run_id: String,
    pub level_id: String,
    /// The assignment acted on, when the action had one.
    pub assignment_id: Option<String>,
    pub decision: WaveDecision,
    pub counts: WaveCounts,
    /// The parallelism the decision was made under.
    pub max_parallel: u32,
}

/// The wave a run is at: its level in flight, when that is a wave that has not ended.
pub fn wave_under_way(state: &RunState) -> Option<&WaveState> {
    crate::wave_drive::wave_in_flight(state).filter(|w| w.closed.is_none())
}

/// The wave a run ran last (under way or ended), for reading.
pub fn latest_wave(state: &RunState) -> Option<&WaveState> {
    wave_under_way(state).or_else(|| {
        state.waves.values().max_by_key(|w| state.level(&w.level_id).map_or(0, |l| l.started_seq))
    })
}

fn find<'a>(wave: &'a WaveState, target: &Target) -> Result<&'a wave::AssignmentState, String> {
    let found = match target {
        Target::Assignment(id) => wave.assignments.iter().find(|a| &a.assignment.id == id),
        Target::Task(id) => wave.assignments.iter().find(|a| &a.assignment.task_id == id),
    };
    found.ok_or_else(|| {
        let ids: Vec<&str> = wave.assignments.iter().map(|a| a.assignment.id.as_str()).collect();
        match target {
            Target::Assignment(id) => {
                format!("the wave has no assignment `{id}` (assignments: {})", ids.join(", "))
            }
            Target::Task(id) => format!("no assignment of the wave is for task `{id}`"),
        }
    })
}

/// What an append decided: the reply, or a refusal recorded as a failure (a record past
/// the assignment's deadline).
enum Done {
    Reply(Option<String>),
    Expired(String),
}

impl Engine {
    /// Takes `action` on the wave `run_id` is at.
    pub async fn wave_act(&self, run_id: &str, action: WaveAction) -> Result<WaveReply, Error> {
        let refused = |message: String| Error::Refused { run_id: run_id.to_owned(), message };
        if let WaveAction::Cancel { by, reason } = &action {
            let state = self.state(run_id).await?;
            if wave_under_way(&state).is_none() {
                return Err(refused("it has no wave under way".to_owned()));
            }
            self.cancel_tree(run_id, by.clone(), reason.clone()).await?;
            match self.end_cancelled_tree(run_id).await {
                Ok(_) | Err(Error::Store(crate::store::Error::Busy(_))) => {}
                Err(e) => return Err(e),
            }
            return self.wave_reply(run_id, None).await;
        }
        if matches!(action, WaveAction::Decide | WaveAction::Complete { .. }) {
            self.expire_outside_workers(run_id).await?;
        }
        let settings = self.wave_settings();
        let done = self
            .append_external(run_id, |state, _, now| {
                let Some(w) = wave_under_way(state) else {
                    return Err(refused(match latest_wave(state) {
                        Some(w) => format!(
                            "its wave (level `{}`) has ended{}",
                            w.level_id,
                            w.closed.as_ref().map_or(String::new(), |d| format!(" ({})", d.decision.as_str()))
                        ),
                        None => "it has no wave under way".to_owned(),
                    }));
                };
                if state.cancel_requested.is_some() {
                    return Err(refused("its wave is being cancelled".to_owned()));
                }
                let parallel = settings.parallel_for(w);
                let level = |data: EventData| NewEvent::level(&w.level_id, w.attempt, data);
                match &action {
                    WaveAction::Decide | WaveAction::Cancel { .. } => Ok(None),
                    WaveAction::Dispatch { target, worker_run, by } => {
                        wave::check_worker_run(worker_run).map_err(refused)?;
                        let a = find(w, target).map_err(refused)?;
                        let id = &a.assignment.id;
                        if a.dispatched.is_some() || a.settled.is_some() {
                            return Err(refused(format!("assignment `{id}` is already {}", a.stage())));
                        }
                        let admissible = w.admissible(parallel);
                        if !admissible.is_empty() && !admissible.iter().any(|p| &p.id == id) {
                            let next: Vec<&str> = admissible.iter().map(|p| p.id.as_str()).collect();
                            return Err(refused(format!(
                                "assignment `{id}` is not next in the wave's `{}` order: dispatch {} first",
                                w.plan.order.as_str(),
                                next.join(", ")
                            )));
                        }
                        if admissible.is_empty() {
                            return Err(refused(format!(
                                "assignment `{id}` cannot be dispatched now: the decision is `{}` ({} in flight of at most {parallel})",
                                w.decide(false, parallel).as_str(),
                                w.counts().in_flight
                            )));
                        }
                        let event = level(EventData::WaveDispatched(WaveDispatched {
                            assignment_id: id.clone(),
                            worker_run: worker_run.clone(),
                            child_run_id: None,
                            by: by.clone(),
                        }));
                        Ok(Some((event, Done::Reply(Some(id.clone())))))
                    }
                    WaveAction::Record { target, outcome, summary, blockers, by } => {
                        let a = find(w, target).map_err(refused)?;
                        let id = &a.assignment.id;
                        if let Some(s) = &a.settled {
                            return Err(refused(format!(
                                "assignment `{id}` is already settled ({}{})",
                                s.outcome.as_str(),
                                s.by.as_ref().map_or(String::new(), |b| format!(", by {b}"))
                            )));
                        }
                        let Some(d) = &a.dispatched else {
                            return Err(refused(format!(
                                "assignment `{id}` has not been dispatched; dispatch it first (`baton wave dispatch`)"
                            )));
                        };
                        if let Some(child) = &d.child_run_id {
                            return Err(refused(format!(
                                "assignment `{id}` is owned by the active dispatcher: its worker is child run {child}, which settles it"
                            )));
                        }
                        let deadline = d.at
                            + chrono::Duration::milliseconds(
                                i64::try_from(w.plan.timeout_ms).unwrap_or(i64::MAX),
                            );
                        if now > deadline {
                            let event = level(EventData::WaveRecorded(timed_out(id, w.plan.timeout_ms)));
                            return Ok(Some((event, Done::Expired(id.clone()))));
                        }
                        let event = level(EventData::WaveRecorded(WaveRecorded {
                            assignment_id: id.clone(),
                            outcome: *outcome,
                            summary: wave::cut(summary, wave::SUMMARY_BYTES_MAX),
                            blockers: blockers
                                .iter()
                                .take(wave::BLOCKERS_MAX)
                                .map(|b| wave::cut(b, wave::BLOCKER_BYTES_MAX))
                                .collect(),
                            by: by.clone(),
                            reason: None,
                        }));
                        Ok(Some((event, Done::Reply(Some(id.clone())))))
                    }
                    WaveAction::Complete { by } => {
                        let decision = w.decide(false, parallel);
                        if !decision.is_final() {
                            let c = w.counts();
                            return Err(refused(format!(
                                "the wave cannot end yet: its decision is `{}` ({} planned, {} in flight)",
                                decision.as_str(),
                                c.planned,
                                c.in_flight
                            )));
                        }
                        let event = level(EventData::WaveDecided(WaveDecided {
                            decision,
                            counts: w.counts(),
                            max_parallel: parallel,
                            dispatched: Vec::new(),
                            closes: true,
                            by: by.clone(),
                        }));
                        Ok(Some((event, Done::Reply(None))))
                    }
                }
            })
            .await?;
        let assignment_id = match done {
            Some(Done::Expired(id)) => {
                return Err(refused(format!(
                    "assignment `{id}` is past its deadline; it was recorded failed (timeout), not as given"
                )));
            }
            Some(Done::Reply(id)) => id,
            None => None,
        };
        self.wave_reply(run_id, assignment_id).await
    }

    /// Where the wave `run_id` ran last stands now.
    async fn wave_reply(
        &self,
        run_id: &str,
        assignment_id: Option<String>,
    ) -> Result<WaveReply, Error> {
        let refused = |message: String| Error::Refused { run_id: run_id.to_owned(), message };
        let settings = self.wave_settings();
        let state = self.state(run_id).await?;
        let Some(w) = latest_wave(&state) else {
            return Err(refused("it has no wave".to_owned()));
        };
        let parallel = settings.parallel_for(w);
        Ok(WaveReply {
            run_id: run_id.to_owned(),
            level_id: w.level_id.clone(),
            assignment_id,
            decision: w.closed.as_ref().map_or_else(
                || w.decide(state.cancel_requested.is_some(), parallel),
                |d| d.decision,
            ),
            counts: w.counts(),
            max_parallel: parallel,
        })
    }

    /// Records failed (timeout) every assignment an outside agent dispatched whose
    /// deadline has passed, each exactly once.
    async fn expire_outside_workers(&self, run_id: &str) -> Result<(), Error> {
        loop {
            let recorded = self
                .append_external(run_id, |state, _, now| {
                    let Some(w) = wave_under_way(state) else { return Ok(None) };
                    let overdue = w.assignments.iter().find(|a| {
                        a.settled.is_none()
                            && a.dispatched.as_ref().is_some_and(|d| {
                                d.child_run_id.is_none()
                                    && now
                                        > d.at
                                            + chrono::Duration::milliseconds(
                                                i64::try_from(w.plan.timeout_ms)
                                                    .unwrap_or(i64::MAX),
                                            )
                            })
                    });
                    Ok(overdue.map(|a| {
                        let event = NewEvent::level(
                            &w.level_id,
                            w.attempt,
                            EventData::WaveRecorded(timed_out(&a.assignment.id, w.plan.timeout_ms)),
                        );
                        (event, ())
                    }))
                })
                .await?;
            if recorded.is_none() {
                return Ok(());
            }
        }
    }
}

/// An assignment recorded failed for overrunning its timeout.
fn timed_out(assignment_id: &str, timeout_ms: u64) -> WaveRecorded {
    WaveRecorded {
        assignment_id: assignment_id.to_owned(),
        outcome: WorkerOutcome::Failed,
        summary: format!("no outcome was recorded within the worker timeout of {timeout_ms} ms"),
        blockers: Vec::new(),
        by: None,
        reason: Some("timeout".to_owned()),
    }
}

impl Engine {
    /// [`view`] of the wave `run_id` ran last, with its unsettled workers reconciled: a
    /// worker its wave stopped waiting for (`child_run_unsettled`, the settle timeout of a
    /// cancel passed) that has ended since shows the outcome its run gives, marked
    /// `reconciled`; the wave's ended log is not written.
    pub async fn wave_view(&self, run_id: &str) -> Result<Option<Value>, Error> {
        let state = self.state(run_id).await?;
        let Some(w) = latest_wave(&state) else { return Ok(None) };
        let mut view = view(run_id, &state, w, self.wave_settings().parallel_for(w));
        for (i, a) in w.assignments.iter().enumerate() {
            let Some(child) = a.worker_child() else {
                continue;
            };
            if !a.unsettled {
                continue;
            }
            let ended = self.state(child).await.ok().and_then(|s| s.finished);
            let Some(finished) = ended else { continue };
            let settled = crate::wave::settlement_of(
                &crate::event::ChildRunSettled {
                    child_run_id: child.to_owned(),
                    link: String::new(),
                    status: finished.status,
                    aborted_reason: finished.aborted_reason,
                    final_output: finished.final_output,
                    totals: finished.totals,
                    tree_totals: finished.tree_totals.unwrap_or(finished.totals),
                },
                w.plan.reports_required,
            );
            if let Some(entry) = view["assignments"].get_mut(i).and_then(Value::as_object_mut) {
                entry.insert("outcome".to_owned(), json!(settled.outcome.as_str()));
                entry.insert("summary".to_owned(), json!(settled.summary));
                entry.insert("reconciled".to_owned(), json!(true));
            }
        }
        Ok(Some(view))
    }

    /// The wave `current` names among `runs` (newest first): the first run whose wave is
    /// under way.
    pub async fn current_wave(
        &self,
        runs: &[crate::store::RunRecord],
    ) -> Result<Option<String>, Error> {
        for record in runs {
            if crate::Status::from_name(&record.status).is_some_and(crate::Status::is_final) {
                continue;
            }
            let state = self.state(&record.run_id).await?;
            if wave_under_way(&state).is_some() {
                return Ok(Some(record.run_id.clone()));
            }
        }
        Ok(None)
    }

    /// The waves `runs` ran (their latest each), in the order of `runs`, as [`view`] shows
    /// them.
    pub async fn wave_views(&self, runs: &[crate::store::RunRecord]) -> Result<Vec<Value>, Error> {
        let mut out = Vec::new();
        for record in runs {
            let state = self.state(&record.run_id).await?;
            if let Some(w) = latest_wave(&state) {
                out.push(view(&record.run_id, &state, w, self.wave_settings().parallel_for(w)));
            }
        }
        Ok(out)
    }
}

/// A wave view's counts, as [`WaveCounts`] prints them (`2 planned, 1 in flight, …`).
pub fn counts_of(view: &Value) -> WaveCounts {
    serde_json::from_value(view["counts"].clone()).unwrap_or_default()
}

/// The orchestration state over waves' views: how many waves, how many under way, their
/// assignments counted by stage and outcome, and what they spent.
pub fn summarize(views: &[Value]) -> Value {
    let mut totals: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    let mut cost = 0.0;
    let mut under_way = 0;
    for v in views {
        let run_ended = crate::Status::from_name(v["run_status"].as_str().unwrap_or_default())
            .is_some_and(crate::Status::is_final);
        if v["ended"] != json!(true) && !run_ended {
            under_way += 1;
        }
        for key in [
            "assignments",
            "planned",
            "in_flight",
            "completed",
            "partial",
            "blocked",
            "failed",
            "cancelled",
        ] {
            *totals.entry(key).or_default() += v["counts"][key].as_u64().unwrap_or(0);
        }
        cost += v["cost_usd"].as_f64().unwrap_or(0.0);
    }
    json!({
        "waves": views.len(),
        "under_way": under_way,
        "assignments": totals,
        "cost_usd": cost,
    })
}

/// The settings of a standalone wave (`baton wave plan`), already checked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Standalone {
    pub worker: Option<String>,
    pub max_parallel: Option<u32>,
    pub timeout_ms: Option<u64>,
    pub max_assignments: Option<u32>,
    pub context: Option<String>,
}

/// The one-level scenario of a standalone wave: `dispatch: manual`, ended by its decision
/// (`complete` to `__end__`, any other end to `__fail__`). `root` is the scenarios
/// directory.
pub fn standalone_scenario(
    settings: &Standalone,
    root: &std::path::Path,
) -> Result<Arc<Scenario>, String> {
    let mut fields = vec!["dispatch: manual".to_owned()];
    let quoted = |s: &str| serde_json::to_string(s).unwrap_or_default();
    if let Some(worker) = &settings.worker {
        fields.push(format!("worker: {}", quoted(worker)));
    }
    if let Some(n) = settings.max_parallel {
        fields.push(format!("max_parallel: {n}"));
    }
    if let Some(ms) = settings.timeout_ms {
        #[allow(clippy::cast_precision_loss)]
        fields.push(format!("timeout_s: {}", ms as f64 / 1000.0));
    }
    if let Some(n) = settings.max_assignments {
        fields.push(format!("max_assignments: {n}"));
    }
    if let Some(c) = &settings.context {
        fields.push(format!("context: {}", quoted(c)));
    }
    let yaml = format!(
        "id: wave\nversion: 1\ndescription: A standalone wave, planned with `baton wave plan`.\nlevels:\n  - id: wave\n    kind: wave\n    terminal: true\n    wave: {{{}}}\nedges:\n  - {{from: wave, to: __end__, when: \"wave.decision == 'complete'\"}}\n  - {{from: wave, to: __fail__}}\n",
        fields.join(", ")
    );
    let texts = baton_scenario::Texts { canonical: yaml, files: std::collections::BTreeMap::new() };
    baton_scenario::Registry::load_texts("wave (baton wave plan)", root, &texts)
        .map_err(|e| format!("the wave's settings do not make a wave: {}", e.diagnostics.render()))
}

/// A wave as its readers see it (`baton wave get`, the server, the MCP tools): its run,
/// level, plan, decision (`parallel` in force), counts, spend and every assignment.
pub fn view(run_id: &str, state: &RunState, w: &WaveState, parallel: u32) -> Value {
    let decision = w
        .closed
        .as_ref()
        .map_or_else(|| w.decide(state.cancel_requested.is_some(), parallel), |d| d.decision);
    let mut summary = w.summary(decision, true);
    if let Some(obj) = summary.as_object_mut() {
        obj.insert("run_id".to_owned(), json!(run_id));
        obj.insert("run_status".to_owned(), json!(state.status.as_str()));
        obj.insert("level_id".to_owned(), json!(w.level_id));
        obj.insert("attempt".to_owned(), json!(w.attempt));
        obj.insert("worker".to_owned(), json!(w.plan.worker));
        obj.insert("command".to_owned(), json!(w.plan.command));
        obj.insert("dispatch".to_owned(), json!(w.plan.dispatch));
        obj.insert("max_parallel".to_owned(), json!(parallel));
        obj.insert("timeout_ms".to_owned(), json!(w.plan.timeout_ms));
        obj.insert("ended".to_owned(), json!(w.closed.is_some()));
    }
    summary
}
