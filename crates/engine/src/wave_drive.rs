//! The active wave dispatcher: admits a wave's planned assignments as child runs of its
//! worker scenario, drives them concurrently in a sliding window, times out the ones that
//! overrun, and settles each in the wave's run exactly once.
//!
//! A dispatch is one commit of the wave's run: `wave_decided` (dispatch, with the counts it
//! read) and, per admitted assignment, `child_run_started` (before the worker exists) and
//! `wave_dispatched`. A worker that ends is settled by the next drive of the wave's run,
//! in the same commit as the next admission. After a crash the next driver reconciles:
//! a worker recorded but not created is created, one not finished is driven on, one
//! finished is settled; a settled assignment is never run again.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use baton_scenario::Scenario;

use crate::event::{
    Assignment, ChildRunSettled, ChildRunStarted, EventData, FinalStatus, NewEvent, WaveDecided,
    WaveDecision, WaveDispatched, WaveRecorded, WorkerOutcome,
};
use crate::exec::{Engine, Error, Outcome};
use crate::state::{ChildRun, RunState};
use crate::store;
pub use crate::wave::WaveSettings;
use crate::wave::{self, WaveState};

/// The wave of the level in flight, if the level in flight is a wave.
pub fn wave_in_flight(state: &RunState) -> Option<&WaveState> {
    state.in_flight.as_ref().and_then(|id| state.waves.get(id))
}

impl Engine {
    /// How this engine dispatches waves.
    pub fn wave_settings(&self) -> WaveSettings {
        self.wave_drive.or_else(|| self.runtime.jobs.as_ref().map(|j| j.waves)).unwrap_or_default()
    }

    /// The events that dispatch what the wave of `level_id` admits now: none when nothing
    /// is admitted (or, for a manual wave, when this drive is not its active dispatcher).
    /// A worker scenario that is not loaded fails the level before any worker starts, and
    /// fails the admitted assignments once some have.
    pub(crate) async fn wave_dispatch(
        &self,
        run_id: &str,
        state: &RunState,
        level_id: &str,
    ) -> Result<Vec<NewEvent>, Error> {
        let Some(w) = state.waves.get(level_id) else { return Ok(Vec::new()) };
        let settings = self.wave_settings();
        if w.plan.is_manual() && !settings.active {
            return Ok(Vec::new());
        }
        let parallel = settings.parallel_for(w);
        // The active dispatcher of a manual wave ends it once its decision is an end, as
        // the driver of an automatic one does.
        let decision = w.decide(false, parallel);
        if w.plan.is_manual() && decision.is_final() {
            return Ok(vec![NewEvent::level(
                level_id,
                w.attempt,
                EventData::WaveDecided(WaveDecided {
                    decision,
                    counts: w.counts(),
                    max_parallel: parallel,
                    dispatched: Vec::new(),
                    closes: true,
                    by: Some("baton wave run".to_owned()),
                }),
            )]);
        }
        let admitted: Vec<_> = w.admissible(parallel).into_iter().cloned().collect();
        if admitted.is_empty() {
            return Ok(Vec::new());
        }
        let none_yet = w.assignments.iter().all(|a| a.dispatched.is_none());
        let registry = self.runtime.jobs.as_ref().map(|j| j.registry());
        if let Some(argv) = &w.plan.command
            && self.runtime.jobs.is_some()
        {
            return self.dispatch_commands(run_id, state, w, &admitted, argv, parallel).await;
        }
        let worker = w.plan.worker.as_ref().and_then(|id| registry.as_ref()?.get(id).cloned());
        let Some(worker) = worker else {
            let why = match (&w.plan.worker, &registry) {
                (None, _) if w.plan.command.is_some() => {
                    "the wave's command workers run as child runs, and this engine starts none"
                        .to_owned()
                }
                (None, _) => "the wave names no worker scenario; dispatch its assignments with `baton wave dispatch` and record them with `baton wave record`".to_owned(),
                (Some(id), None) => format!("worker scenario `{id}`: this engine starts no child runs"),
                (Some(id), Some(r)) => format!(
                    "worker scenario `{id}` is not among the scenarios ({})",
                    r.scenarios().map(|s| s.id.as_str()).collect::<Vec<_>>().join(", ")
                ),
            };
            if none_yet {
                return Ok(vec![NewEvent::level(
                    level_id,
                    w.attempt,
                    EventData::LevelFinished(Box::new(crate::event::LevelFinished::failed(
                        format!("wave_worker: {why}"),
                        0,
                    ))),
                )]);
            }
            return Ok(admitted
                .iter()
                .map(|a| {
                    NewEvent::level(
                        level_id,
                        w.attempt,
                        EventData::WaveRecorded(WaveRecorded {
                            assignment_id: a.id.clone(),
                            outcome: WorkerOutcome::Failed,
                            summary: format!("not dispatched: {why}"),
                            blockers: Vec::new(),
                            by: None,
                            reason: Some("worker".to_owned()),
                        }),
                    )
                })
                .collect());
        };
        self.keep_texts(&worker).await?;
        let workers: Vec<(Assignment, Arc<Scenario>)> =
            admitted.into_iter().map(|a| (a, Arc::clone(&worker))).collect();
        Ok(dispatch_events(run_id, state, w, &workers, parallel))
    }

    /// Dispatches command workers: each assignment runs as a child run of a one-level
    /// scenario made for it, whose `command` verifier runs the wave's program in the jail,
    /// in the child's own workspace, with the assignment as JSON for its last argument.
    async fn dispatch_commands(
        &self,
        run_id: &str,
        state: &RunState,
        w: &WaveState,
        admitted: &[Assignment],
        argv: &[String],
        parallel: u32,
    ) -> Result<Vec<NewEvent>, Error> {
        let root = self.runtime.jobs.as_ref().map(|j| j.scenarios_dir.clone()).unwrap_or_default();
        let mut workers = Vec::with_capacity(admitted.len());
        for a in admitted {
            let scenario = command_worker(w, a, argv, &root)
                .map_err(|message| Error::Refused { run_id: run_id.to_owned(), message })?;
            self.keep_texts(&scenario).await?;
            workers.push((a.clone(), scenario));
        }
        Ok(dispatch_events(run_id, state, w, &workers, parallel))
    }

    /// The settlements of a wave's workers that ended: each worker's `child_run_settled`,
    /// after — for a command worker that completed — the outcome its program's report gave
    /// (`wave_recorded`; no report, or one that does not read, fails the assignment).
    pub(crate) async fn wave_settlements(
        &self,
        state: &RunState,
        ended: Vec<ChildRunSettled>,
    ) -> Result<Vec<NewEvent>, Error> {
        let mut events = Vec::with_capacity(ended.len());
        for c in ended {
            let command_worker = state.waves.values().find_map(|w| {
                let a = w.by_child(&c.child_run_id).filter(|a| a.settled.is_none())?;
                w.plan.command.is_some().then_some((w, a))
            });
            if let Some((w, a)) = command_worker
                && c.status == FinalStatus::Completed
            {
                let log = self.store.load(&c.child_run_id, 0).await?;
                let ran = log.iter().rev().find_map(|e| match &e.data {
                    EventData::VerifierFinished(v) if v.name == COMMAND_VERIFIER => Some(v),
                    _ => None,
                });
                let recorded = command_report(&a.assignment.id, ran);
                events.push(NewEvent::level(
                    &w.level_id,
                    w.attempt,
                    EventData::WaveRecorded(recorded),
                ));
            }
            events.push(NewEvent::run(EventData::ChildRunSettled(Box::new(c))));
        }
        Ok(events)
    }

    /// Drives a wave's open workers concurrently until none is left to drive here: each
    /// that ends brings the wave's run back (settling it and admitting the next), so the
    /// window slides. `Some` when the job waits on a worker (a person, an interruption);
    /// `None` when the wave's run should be driven again. Once the wave's run is cancelled,
    /// workers still running after the settle timeout are left to its end, which records
    /// them unsettled.
    pub(crate) async fn wave_window(
        &self,
        run_id: &str,
        scenario: &Arc<Scenario>,
        state: RunState,
    ) -> Result<Option<Outcome>, Error> {
        let settle =
            self.runtime.jobs.as_ref().map_or(Duration::from_secs(15), |j| j.settle_timeout);
        let mut state = Arc::new(state);
        let mut running = crate::join::Pool::default();
        let mut driving: HashSet<String> = HashSet::new();
        let mut finished: HashSet<String> = HashSet::new();
        // A replay's recorded settle order (none outside replays).
        let order = self.runtime.jobs.as_ref().and_then(|j| j.settle_order.clone());
        let mut waits: Option<Outcome> = None;
        let mut cancel_deadline: Option<tokio::time::Instant> = None;
        loop {
            if state.cancel_requested.is_some() && cancel_deadline.is_none() {
                cancel_deadline = Some(tokio::time::Instant::now() + settle);
            }
            for child in state.open_children() {
                let id = &child.started.child_run_id;
                // A replay drives a worker once every group its recording settled before
                // the worker's own has been settled.
                if let Some(order) = &order
                    && let Some(g) = order.group_of(run_id, id)
                    && (0..g).any(|earlier| {
                        order.group(run_id, earlier).iter().any(|c| {
                            state.children.iter().any(|k| {
                                &k.started.child_run_id == c
                                    && k.settled.is_none()
                                    && k.unsettled.is_none()
                            })
                        })
                    })
                {
                    continue;
                }
                if driving.insert(id.clone()) {
                    let worker = self.drive_worker(run_id, Arc::clone(&state), child.clone());
                    let id = id.clone();
                    running.push(async move { (id, worker.await) });
                }
            }
            let next = match cancel_deadline {
                Some(deadline) => match tokio::time::timeout_at(deadline, running.next()).await {
                    Ok(next) => next,
                    // The settle timeout passed: the wave's end records the rest unsettled.
                    Err(_) => return Ok(None),
                },
                None => running.next().await,
            };
            let Some(result) = next else { return Ok(waits) };
            let (ended, result) = result;
            match result {
                Ok(Outcome::Finished(_)) => {
                    finished.insert(ended.clone());
                    // A replay settles a recorded group only once all of it has ended.
                    if let Some(order) = &order
                        && let Some(g) = order.group_of(run_id, &ended)
                        && order.group(run_id, g).iter().any(|c| {
                            !finished.contains(c)
                                && state
                                    .children
                                    .iter()
                                    .any(|k| &k.started.child_run_id == c && k.settled.is_none())
                        })
                    {
                        continue;
                    }
                }
                Ok(other) => {
                    waits.get_or_insert(other);
                    continue;
                }
                Err(e) => return Err(e),
            }
            // A worker ended: the wave's run settles it and admits the next.
            state = match self.drive_to_state(run_id, scenario, Some(&state)).await {
                Ok((_, driven)) => driven,
                // Another process holds it (a canceller ending it): read what it wrote.
                Err(Error::Store(store::Error::Busy(_))) => Arc::new(self.state(run_id).await?),
                Err(e) => return Err(e),
            };
        }
    }

    /// Drives one worker to its end; past its assignment's timeout (counted from its
    /// dispatch) its assignment is recorded failed and its run cancelled, and its drive
    /// goes on until the cancel ends it.
    async fn drive_worker(
        &self,
        run_id: &str,
        parent: Arc<RunState>,
        child: ChildRun,
    ) -> Result<Outcome, Error> {
        let found = parent.waves.values().find_map(|w| {
            let a = w.by_child(&child.started.child_run_id)?;
            let at = a.dispatched.as_ref()?.at;
            let id = a.assignment.id.clone();
            Some((w.level_id.clone(), w.attempt, id, at, w.plan.timeout_ms, a.settled.is_some()))
        });
        let drive = self.drive_child(run_id, &parent, &child);
        let Some((level_id, attempt, assignment_id, at, timeout_ms, settled)) = found else {
            return drive.await;
        };
        if settled {
            // Already settled (its timeout passed): it only has to end.
            return drive.await;
        }
        let deadline =
            at + chrono::Duration::milliseconds(i64::try_from(timeout_ms).unwrap_or(i64::MAX));
        let left = (deadline - self.clock.now()).to_std().unwrap_or(Duration::ZERO);
        tokio::pin!(drive);
        tokio::select! {
            outcome = &mut drive => outcome,
            () = tokio::time::sleep(left) => {
                self.time_out_worker(run_id, &level_id, attempt, &assignment_id, &child.started.child_run_id, timeout_ms)
                    .await?;
                drive.await
            }
        }
    }

    /// Records an assignment failed for overrunning its timeout (exactly once, while it is
    /// unsettled) and cancels its worker's run.
    pub(crate) async fn time_out_worker(
        &self,
        run_id: &str,
        level_id: &str,
        attempt: u32,
        assignment_id: &str,
        child_run_id: &str,
        timeout_ms: u64,
    ) -> Result<(), Error> {
        let recorded = WaveRecorded {
            assignment_id: assignment_id.to_owned(),
            outcome: WorkerOutcome::Failed,
            summary: format!("the worker overran its timeout of {timeout_ms} ms and was cancelled"),
            blockers: Vec::new(),
            by: None,
            reason: Some("timeout".to_owned()),
        };
        self.append_external(run_id, |state, _, _| {
            let open = state
                .waves
                .get(level_id)
                .filter(|w| w.attempt == attempt)
                .and_then(|w| w.assignment(assignment_id))
                .is_some_and(|a| a.settled.is_none());
            Ok(open.then(|| {
                (NewEvent::level(level_id, attempt, EventData::WaveRecorded(recorded.clone())), ())
            }))
        })
        .await?;
        match self
            .cancel_tree(
                child_run_id,
                Some("wave".to_owned()),
                Some(format!("timeout: {timeout_ms} ms")),
            )
            .await
        {
            Ok(()) | Err(Error::Refused { .. } | Error::Store(store::Error::NotFound(_))) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The name of the verifier a command worker's scenario runs its program as.
const COMMAND_VERIFIER: &str = "worker";

/// One commit's worth of dispatch: the decision, then per worker `child_run_started` and
/// `wave_dispatched`.
fn dispatch_events(
    run_id: &str,
    state: &RunState,
    w: &WaveState,
    workers: &[(Assignment, Arc<Scenario>)],
    parallel: u32,
) -> Vec<NewEvent> {
    let counts = w.counts();
    // What the tree may still spend is shared among the assignments not yet started.
    let share = state.tree_cost_left().map(|left| left / f64::from(counts.planned.max(1)));
    let mut events = vec![NewEvent::level(
        &w.level_id,
        w.attempt,
        EventData::WaveDecided(WaveDecided {
            decision: WaveDecision::Dispatch,
            counts,
            max_parallel: parallel,
            dispatched: workers.iter().map(|(a, _)| a.id.clone()).collect(),
            closes: false,
            by: None,
        }),
    )];
    for (a, worker) in workers {
        let link = wave::link(&w.level_id, w.attempt, &a.id);
        let child_run_id = crate::run_ids::child_run_id(run_id, &link);
        let (input, mut metadata) = wave::worker_input(w, a);
        metadata.insert("wave_run".to_owned(), serde_json::Value::String(run_id.to_owned()));
        events.push(NewEvent::run(EventData::ChildRunStarted(Box::new(ChildRunStarted {
            child_run_id: child_run_id.clone(),
            link,
            scenario_id: worker.id.clone(),
            scenario_version: worker.version,
            checksum: worker.checksum.clone(),
            input,
            metadata,
            budget: crate::job::caps(worker, share),
            depth: state.depth() + 1,
        }))));
        events.push(NewEvent::level(
            &w.level_id,
            w.attempt,
            EventData::WaveDispatched(WaveDispatched {
                assignment_id: a.id.clone(),
                worker_run: child_run_id.clone(),
                child_run_id: Some(child_run_id),
                by: None,
            }),
        ));
    }
    events
}

/// The one-level scenario a command worker runs: a `verifier` level whose `command`
/// verifier runs `argv` plus the assignment as JSON, within the wave's worker timeout.
fn command_worker(
    w: &WaveState,
    a: &Assignment,
    argv: &[String],
    root: &std::path::Path,
) -> Result<Arc<Scenario>, String> {
    let assignment = serde_json::json!({
        "id": a.id,
        "task_id": a.task_id,
        "title": a.title,
        "description": a.description,
        "priority": a.priority,
        "context": w.plan.context,
    });
    let mut full: Vec<String> = argv.to_vec();
    full.push(assignment.to_string());
    #[allow(clippy::cast_precision_loss)]
    let timeout_s = (w.plan.timeout_ms as f64 / 1000.0).min(baton_scenario::limits::TIMEOUT_S_MAX);
    let argv_json = serde_json::to_string(&full).map_err(|e| e.to_string())?;
    let yaml = format!(
        "id: wave_command\nversion: 1\ndescription: One assignment of a wave, run as a program.\nlevels:\n  - id: run\n    kind: verifier\n    terminal: true\n    timeout_s: {timeout_s}\n    verifiers:\n      - {{name: {COMMAND_VERIFIER}, uses: command, timeout_s: {timeout_s}, params: {{argv: {argv_json}}}}}\n"
    );
    let texts = baton_scenario::Texts { canonical: yaml, files: std::collections::BTreeMap::new() };
    baton_scenario::Registry::load_texts("wave command worker", root, &texts).map_err(|e| {
        format!("the wave's command does not make a worker: {}", e.diagnostics.render())
    })
}

/// The outcome a command worker's program reported at the end of its standard output;
/// none, or one that does not read, fails the assignment with what the program did.
fn command_report(
    assignment_id: &str,
    ran: Option<&crate::event::VerifierFinished>,
) -> WaveRecorded {
    let failed = |summary: String| WaveRecorded {
        assignment_id: assignment_id.to_owned(),
        outcome: WorkerOutcome::Failed,
        summary,
        blockers: Vec::new(),
        by: None,
        reason: Some("report".to_owned()),
    };
    let Some(ran) = ran else {
        return failed("the worker's program did not run".to_owned());
    };
    let stdout = ran.details.get("stdout_tail").and_then(serde_json::Value::as_str).unwrap_or("");
    match wave::report_of(stdout) {
        Some(Ok(report)) => WaveRecorded {
            assignment_id: assignment_id.to_owned(),
            outcome: report.outcome,
            summary: report.summary,
            blockers: report.blockers,
            by: None,
            reason: None,
        },
        Some(Err(why)) => failed(format!("the worker report does not read: {why}")),
        None => {
            let what = if ran.reasons.is_empty() {
                "it exited 0".to_owned()
            } else {
                wave::cut(&ran.reasons.join("; "), wave::SUMMARY_BYTES_MAX)
            };
            failed(format!("the worker's program printed no worker report ({what})"))
        }
    }
}
