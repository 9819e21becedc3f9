//! Waves outside agents act on (`baton wave …`): a standalone wave's scenario planned from
//! a task list, a wave named by its run id or `current`, and the actions — dispatch,
//! record, decide, complete, cancel — each through the engine's typed wave actions
//! (`baton_engine::wave_actions`), a conditional append.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use baton_engine::event::WorkerOutcome;
use baton_engine::wave_actions::{self, Target, WaveAction, WaveReply};
use baton_engine::{Engine, RunState};
use baton_scenario::Scenario;
use serde_json::Value;

use crate::engines::{WaveDrive, wave_engine};
use crate::error::Error;
use crate::place::Place;

/// Largest task list `plan` reads, in bytes.
const TASKS_BYTES_MAX: u64 = 1024 * 1024;
/// Most runs `list`, `summary` and `current` look through, newest first.
const RUNS_SCANNED_MAX: usize = 500;

/// How a standalone wave is planned (`baton wave plan`).
#[derive(Debug)]
pub struct PlanSettings {
    /// The task list: `{"tasks": [{"id": …, "title": …}], "context": …}`.
    pub tasks: PathBuf,
    /// The scenario each assignment runs (none: outside agents run them).
    pub worker: Option<String>,
    pub max_parallel: Option<i64>,
    pub timeout_s: Option<f64>,
    pub max_assignments: Option<u32>,
    pub context: Option<String>,
}

/// A standalone wave's job: its input (the task list) and its one-level scenario, checked
/// before a run is made.
pub fn plan(place: &Place, settings: &PlanSettings) -> anyhow::Result<(String, Arc<Scenario>)> {
    let tasks = baton_scenario::capped::read_text(&settings.tasks, TASKS_BYTES_MAX)
        .map_err(|e| Error::invalid(format!("--tasks: {e}")))?;
    let parsed: Value = serde_json::from_str(&tasks).with_context(|| {
        format!(
            "--tasks {}: not JSON; give {{\"tasks\": [{{\"id\": …, \"title\": …}}], \"context\": …}}",
            settings.tasks.display()
        )
    })?;
    if let Some(worker) = &settings.worker {
        let registry = crate::scenarios::registry(place)?;
        if registry.get(worker).is_none() {
            let ids: Vec<&str> = registry.scenarios().map(|s| s.id.as_str()).collect();
            return Err(Error::invalid(format!(
                "--worker: no scenario `{worker}` in {} (known: {})",
                place.scenarios.display(),
                ids.join(", ")
            ))
            .into());
        }
    }
    Ok((parsed.to_string(), wave_scenario(place, settings)?))
}

/// The one-level scenario of a standalone wave, from its settings (checked here first, so
/// the message names the flag).
fn wave_scenario(place: &Place, settings: &PlanSettings) -> Result<Arc<Scenario>, Error> {
    let max_parallel = check_parallel(settings.max_parallel)?;
    let timeout_ms = settings
        .timeout_s
        .map(|s| {
            baton_scenario::check::wave_timeout_ms(s).ok_or_else(|| {
                Error::invalid(format!(
                    "--timeout-s must be from 0.001 through 2147483.647 seconds (1 to 2147483647 ms), not {s}"
                ))
            })
        })
        .transpose()?;
    let standalone = wave_actions::Standalone {
        worker: settings.worker.clone(),
        max_parallel,
        timeout_ms,
        max_assignments: settings.max_assignments,
        context: settings.context.clone(),
    };
    wave_actions::standalone_scenario(&standalone, &place.scenarios).map_err(Error::invalid)
}

/// A `--max-parallel` checked.
fn check_parallel(max_parallel: Option<i64>) -> Result<Option<u32>, Error> {
    max_parallel
        .map(|n| baton_engine::wave::check_parallel(n, "--max-parallel"))
        .transpose()
        .map_err(Error::invalid)
}

/// An engine for wave actions, and the run a wave name stands for: `current` is the newest
/// run with a wave under way.
pub async fn open(place: &Place, wave: &str) -> anyhow::Result<(Engine, String)> {
    let engine = wave_engine(place).await?;
    if wave != "current" {
        if engine.store.run(wave).await?.is_none() {
            return Err(Error::not_found(format!(
                "no run {wave}; name a wave by its run id (see `baton wave list`) or say `current`"
            ))
            .into());
        }
        return Ok((engine, wave.to_owned()));
    }
    let runs: Vec<_> = engine.store.runs(None).await?.into_iter().take(RUNS_SCANNED_MAX).collect();
    match engine.current_wave(&runs).await? {
        Some(run_id) => Ok((engine, run_id)),
        None => Err(Error::not_found(
            "no wave is under way (`current` names the newest run whose wave has not ended)",
        )
        .into()),
    }
}

/// The assignment an action is on: named by its id or by its task's.
fn target(assignment: Option<String>, task: Option<String>) -> Result<Target, Error> {
    match (assignment, task) {
        (Some(a), None) => Ok(Target::Assignment(a)),
        (None, Some(t)) => Ok(Target::Task(t)),
        _ => Err(Error::invalid(
            "name the assignment with --assignment ID or its task with --task ID",
        )),
    }
}

/// `action` taken on `wave`.
async fn act(place: &Place, wave: &str, action: WaveAction) -> anyhow::Result<WaveReply> {
    let (engine, run_id) = open(place, wave).await?;
    Ok(engine.wave_act(&run_id, action).await?)
}

/// An assignment dispatched to a worker run an outside agent started.
pub async fn dispatch(
    place: &Place,
    wave: &str,
    (assignment, task): (Option<String>, Option<String>),
    worker_run: String,
    by: Option<String>,
) -> anyhow::Result<WaveReply> {
    let target = target(assignment, task)?;
    act(place, wave, WaveAction::Dispatch { target, worker_run, by }).await
}

/// What an outside agent records of an assignment (`baton wave record`).
#[derive(Debug)]
pub struct Record {
    pub assignment: Option<String>,
    pub task: Option<String>,
    /// `completed`, `partial`, `blocked`, `failed` or `cancelled`.
    pub outcome: String,
    pub summary: Option<String>,
    pub blockers: Vec<String>,
    pub by: Option<String>,
}

/// An assignment's outcome recorded; the reply and the outcome.
pub async fn record(
    place: &Place,
    wave: &str,
    record: Record,
) -> anyhow::Result<(WaveReply, WorkerOutcome)> {
    let target = target(record.assignment, record.task)?;
    let Some(outcome) = WorkerOutcome::parse(&record.outcome) else {
        return Err(Error::invalid(format!(
            "--outcome must be one of completed, partial, blocked, failed, cancelled, not {:?}",
            record.outcome
        ))
        .into());
    };
    let action = WaveAction::Record {
        target,
        outcome,
        summary: record.summary.unwrap_or_default(),
        blockers: record.blockers,
        by: record.by,
    };
    Ok((act(place, wave, action).await?, outcome))
}

/// The wave's decision made now.
pub async fn decide(place: &Place, wave: &str) -> anyhow::Result<WaveReply> {
    act(place, wave, WaveAction::Decide).await
}

/// The wave's end recorded (its run is then driven to it).
pub async fn complete(place: &Place, wave: &str, by: Option<String>) -> anyhow::Result<WaveReply> {
    act(place, wave, WaveAction::Complete { by }).await
}

/// The run of a wave this process dispatches to its worker scenario (`baton wave run`),
/// and how: as its active dispatcher.
pub async fn to_run(
    place: &Place,
    wave: &str,
    max_parallel: Option<i64>,
) -> anyhow::Result<(String, WaveDrive)> {
    let max_parallel = check_parallel(max_parallel)?;
    let (engine, run_id) = open(place, wave).await?;
    let state = engine.state(&run_id).await?;
    let Some(w) = wave_actions::wave_under_way(&state) else {
        return Err(Error::refused(format!("run {run_id} has no wave under way")).into());
    };
    if w.plan.worker.is_none() {
        return Err(Error::refused(format!(
            "wave {run_id} names no worker scenario, so only outside agents can run it (`baton wave dispatch|record`); plan a wave with --worker to run it here"
        ))
        .into());
    }
    Ok((run_id, WaveDrive { active: true, max_parallel }))
}

/// Cancels the wave's run and its workers; the engine and the run, to wait for its end.
pub async fn cancel(
    place: &Place,
    wave: &str,
    by: Option<String>,
    reason: Option<String>,
) -> anyhow::Result<(Engine, String)> {
    crate::runs::check_who_and_why(by.as_deref(), reason.as_deref())?;
    let (engine, run_id) = open(place, wave).await?;
    engine.wave_act(&run_id, WaveAction::Cancel { by, reason }).await?;
    Ok((engine, run_id))
}

/// The state of a cancelled wave's run once it has ended, waiting up to the settle timeout
/// (and 5 s more); `None` when the process driving it has not ended it by then.
pub async fn ended(engine: &Engine, run_id: &str) -> anyhow::Result<Option<RunState>> {
    let settle = engine.runtime.jobs.as_ref().map_or(Duration::from_secs(15), |j| j.settle_timeout);
    let deadline = Instant::now() + settle + Duration::from_secs(5);
    loop {
        let state = engine.state(run_id).await?;
        if state.status.is_final() {
            return Ok(Some(state));
        }
        if Instant::now() > deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The runs that ran a wave, newest first, with their latest wave.
pub async fn all(place: &Place) -> anyhow::Result<Vec<Value>> {
    let engine = wave_engine(place).await?;
    let runs: Vec<_> = engine.store.runs(None).await?.into_iter().take(RUNS_SCANNED_MAX).collect();
    Ok(engine.wave_views(&runs).await?)
}
