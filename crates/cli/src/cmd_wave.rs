//! `baton wave …`: standalone waves and the actions outside agents take on any wave.
//!
//! `plan` makes a run of a one-level wave scenario (manual dispatch) from a task list;
//! `dispatch` and `record` let an agent run workers itself; `run` makes this process the
//! wave's active dispatcher; `decide`, `complete`, `cancel`, `get`, `list` and `summary`
//! read and end waves. A wave is named by its run id, or `current`: the newest run with a
//! wave under way. Every action goes through the engine's typed wave actions
//! (`baton_engine::wave_actions`), each a conditional append.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use baton_engine::Engine;
use baton_engine::event::WorkerOutcome;
use baton_engine::wave_actions::{self, Target, WaveAction, WaveReply};
use baton_scenario::Scenario;
use serde_json::{Value, json};

use crate::drive;
use crate::escape::one_line;
use crate::out::outln;
use baton_app::engines::WaveDrive;
use baton_app::place::Place;

/// Largest task list `plan` reads, in bytes.
const TASKS_BYTES_MAX: u64 = 1024 * 1024;
/// Most runs `list`, `summary` and `current` look through, newest first.
const RUNS_SCANNED_MAX: usize = 500;

/// Options of `baton wave plan`.
#[derive(Debug)]
pub(crate) struct PlanArgs {
    pub tasks: PathBuf,
    pub worker: Option<String>,
    pub max_parallel: Option<i64>,
    pub timeout_s: Option<f64>,
    pub max_assignments: Option<u32>,
    pub context: Option<String>,
    pub script: Option<PathBuf>,
    pub json: bool,
}

/// The one-level scenario of a standalone wave, from the command's settings (checked
/// here first, so the message names the flag).
fn wave_scenario(place: &Place, args: &PlanArgs) -> anyhow::Result<Arc<Scenario>> {
    let max_parallel = args
        .max_parallel
        .map(|n| baton_engine::wave::check_parallel(n, "--max-parallel"))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let timeout_ms = args
        .timeout_s
        .map(|s| {
            baton_scenario::check::wave_timeout_ms(s).ok_or_else(|| {
                anyhow::anyhow!(
                    "--timeout-s must be from 0.001 through 2147483.647 seconds (1 to 2147483647 ms), not {s}"
                )
            })
        })
        .transpose()?;
    let standalone = wave_actions::Standalone {
        worker: args.worker.clone(),
        max_parallel,
        timeout_ms,
        max_assignments: args.max_assignments,
        context: args.context.clone(),
    };
    wave_actions::standalone_scenario(&standalone, &place.scenarios).map_err(anyhow::Error::msg)
}

/// `baton wave plan`: a new run of a standalone wave; its assignments are planned (or the
/// plan refused) before anything else happens.
pub(crate) async fn plan(place: &Place, args: PlanArgs) -> anyhow::Result<ExitCode> {
    let tasks = baton_scenario::capped::read_text(&args.tasks, TASKS_BYTES_MAX)
        .map_err(|e| anyhow::anyhow!("--tasks: {e}"))?;
    let parsed: Value = serde_json::from_str(&tasks).with_context(|| {
        format!(
            "--tasks {}: not JSON; give {{\"tasks\": [{{\"id\": …, \"title\": …}}], \"context\": …}}",
            args.tasks.display()
        )
    })?;
    if let Some(worker) = &args.worker {
        let registry = baton_app::scenarios::registry(place)?;
        if registry.get(worker).is_none() {
            let ids: Vec<&str> = registry.scenarios().map(|s| s.id.as_str()).collect();
            bail!(
                "--worker: no scenario `{worker}` in {} (known: {})",
                place.scenarios.display(),
                ids.join(", ")
            );
        }
    }
    let scenario = wave_scenario(place, &args)?;
    drive::run(
        place,
        drive::RunArgs {
            queue: false,
            more_inputs: Vec::new(),
            job: baton_engine::job::JobRequest::default(),
            max_cost_usd: None,
            max_forecast_usd: None,
            settle_timeout_s: None,
            idempotency_key: None,
            tenant: None,
            input: parsed.to_string(),
            meta: Vec::new(),
            script: args.script,
            json: args.json,
            stream: false,
            cassette: None,
            record: None,
            workspace: None,
            branch: None,
            given: Some(scenario),
        },
    )
    .await
}

/// An engine for wave actions: the store, and the configuration's wave settings.
async fn action_engine(place: &Place) -> anyhow::Result<Engine> {
    baton_app::engines::wave_engine(place).await
}

/// The run a wave name stands for: `current` is the newest run with a wave under way.
async fn resolve(engine: &Engine, wave: &str) -> anyhow::Result<String> {
    if wave != "current" {
        if engine.store.run(wave).await?.is_none() {
            bail!(
                "no run {wave}; name a wave by its run id (see `baton wave list`) or say `current`"
            );
        }
        return Ok(wave.to_owned());
    }
    let runs: Vec<_> = engine.store.runs(None).await?.into_iter().take(RUNS_SCANNED_MAX).collect();
    match engine.current_wave(&runs).await? {
        Some(run_id) => Ok(run_id),
        None => {
            bail!("no wave is under way (`current` names the newest run whose wave has not ended)")
        }
    }
}

fn target(assignment: Option<String>, task: Option<String>) -> anyhow::Result<Target> {
    match (assignment, task) {
        (Some(a), None) => Ok(Target::Assignment(a)),
        (None, Some(t)) => Ok(Target::Task(t)),
        _ => bail!("name the assignment with --assignment ID or its task with --task ID"),
    }
}

fn print_reply(reply: &WaveReply, what: &str, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(reply)?)?;
        return Ok(());
    }
    outln!(
        "{what}wave {} (level `{}`): decision {} — {} (max_parallel {})",
        reply.run_id,
        one_line(&reply.level_id),
        reply.decision.as_str(),
        reply.counts,
        reply.max_parallel
    )?;
    Ok(())
}

/// `baton wave dispatch`.
pub(crate) async fn dispatch(
    place: &Place,
    wave: &str,
    target_: (Option<String>, Option<String>),
    worker_run: String,
    by: Option<String>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let target = target(target_.0, target_.1)?;
    let engine = action_engine(place).await?;
    let run_id = resolve(&engine, wave).await?;
    let reply = engine.wave_act(&run_id, WaveAction::Dispatch { target, worker_run, by }).await?;
    let id = reply.assignment_id.clone().unwrap_or_default();
    print_reply(&reply, &format!("dispatched {id}: "), json)?;
    Ok(ExitCode::SUCCESS)
}

/// Options of `baton wave record`.
#[derive(Debug)]
pub(crate) struct RecordArgs {
    pub assignment: Option<String>,
    pub task: Option<String>,
    pub outcome: String,
    pub summary: Option<String>,
    pub blockers: Vec<String>,
    pub by: Option<String>,
    pub json: bool,
}

/// `baton wave record`.
pub(crate) async fn record(
    place: &Place,
    wave: &str,
    args: RecordArgs,
) -> anyhow::Result<ExitCode> {
    let target = target(args.assignment, args.task)?;
    let Some(outcome) = WorkerOutcome::parse(&args.outcome) else {
        bail!(
            "--outcome must be one of completed, partial, blocked, failed, cancelled, not {:?}",
            args.outcome
        );
    };
    let engine = action_engine(place).await?;
    let run_id = resolve(&engine, wave).await?;
    let action = WaveAction::Record {
        target,
        outcome,
        summary: args.summary.unwrap_or_default(),
        blockers: args.blockers,
        by: args.by,
    };
    let reply = engine.wave_act(&run_id, action).await?;
    let id = reply.assignment_id.clone().unwrap_or_default();
    print_reply(&reply, &format!("recorded {id} {}: ", outcome.as_str()), args.json)?;
    Ok(ExitCode::SUCCESS)
}

/// `baton wave decide`.
pub(crate) async fn decide(place: &Place, wave: &str, json: bool) -> anyhow::Result<ExitCode> {
    let engine = action_engine(place).await?;
    let run_id = resolve(&engine, wave).await?;
    let reply = engine.wave_act(&run_id, WaveAction::Decide).await?;
    print_reply(&reply, "", json)?;
    Ok(ExitCode::SUCCESS)
}

/// `baton wave complete`: records the end, then drives the run to it.
pub(crate) async fn complete(
    place: &Place,
    wave: &str,
    by: Option<String>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let engine = action_engine(place).await?;
    let run_id = resolve(&engine, wave).await?;
    let reply = engine.wave_act(&run_id, WaveAction::Complete { by }).await?;
    if !json {
        print_reply(&reply, "ended ", false)?;
    }
    drive::resume(place, &run_id, None, json, false, WaveDrive::default()).await
}

/// `baton wave run`: this process dispatches the wave's planned assignments to its worker
/// scenario and drives them to the wave's end.
pub(crate) async fn run(
    place: &Place,
    wave: &str,
    max_parallel: Option<i64>,
    script: Option<&Path>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let max_parallel = max_parallel
        .map(|n| baton_engine::wave::check_parallel(n, "--max-parallel"))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let engine = action_engine(place).await?;
    let run_id = resolve(&engine, wave).await?;
    let state = engine.state(&run_id).await?;
    let Some(w) = wave_actions::wave_under_way(&state) else {
        bail!("run {run_id} has no wave under way");
    };
    if w.plan.worker.is_none() {
        bail!(
            "wave {run_id} names no worker scenario, so only outside agents can run it (`baton wave dispatch|record`); plan a wave with --worker to run it here"
        );
    }
    let drive = WaveDrive { active: true, max_parallel };
    drive::resume(place, &run_id, script, json, false, drive).await
}

/// `baton wave cancel`: cancels the wave's run and its workers, and waits (up to the
/// settle timeout) for the run to end.
pub(crate) async fn cancel(
    place: &Place,
    wave: &str,
    by: Option<String>,
    reason: Option<String>,
) -> anyhow::Result<ExitCode> {
    drive::check_who_and_why(by.as_deref(), reason.as_deref())?;
    let engine = action_engine(place).await?;
    let run_id = resolve(&engine, wave).await?;
    engine.wave_act(&run_id, WaveAction::Cancel { by, reason }).await?;
    outln!("cancel recorded for wave {run_id} and its workers")?;
    let deadline = std::time::Instant::now()
        + engine
            .runtime
            .jobs
            .as_ref()
            .map_or(std::time::Duration::from_secs(15), |j| j.settle_timeout)
        + std::time::Duration::from_secs(5);
    loop {
        let state = engine.state(&run_id).await?;
        if state.status.is_final() {
            if let Some(w) = wave_actions::latest_wave(&state) {
                let c = w.counts();
                outln!(
                    "wave {run_id} is {}: {} completed, {} partial, {} blocked, {} failed, {} cancelled, {} never started, {} unsettled",
                    state.status.as_str(),
                    c.completed,
                    c.partial,
                    c.blocked,
                    c.failed,
                    c.cancelled,
                    c.planned,
                    w.assignments.iter().filter(|a| a.unsettled).count()
                )?;
            }
            return Ok(ExitCode::SUCCESS);
        }
        if std::time::Instant::now() > deadline {
            outln!(
                "wave {run_id}: the cancel is recorded; the process driving it has not ended it yet (see `baton wave get {run_id}`)"
            )?;
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The table of a wave: one line per assignment.
fn print_table(view: &Value) -> anyhow::Result<()> {
    let s = |v: &Value| v.as_str().map(one_line).unwrap_or_else(|| "-".to_owned());
    let c = &view["counts"];
    outln!(
        "wave {} (level `{}`, run {}): decision {}{} — worker {}, max_parallel {}, timeout {} ms; {} planned, {} in flight, {} completed, {} partial, {} blocked, {} failed, {} cancelled; ${:.4}, {} tokens",
        s(&view["run_id"]),
        s(&view["level_id"]),
        s(&view["run_status"]),
        s(&view["decision"]),
        if view["ended"] == json!(true) { " (ended)" } else { "" },
        match (view["worker"].as_str(), view["command"][0].as_str()) {
            (Some(w), _) => one_line(w),
            (None, Some(program)) => format!("command {}", one_line(program)),
            (None, None) => "outside".to_owned(),
        },
        view["max_parallel"],
        view["timeout_ms"],
        c["planned"],
        c["in_flight"],
        c["completed"],
        c["partial"],
        c["blocked"],
        c["failed"],
        c["cancelled"],
        view["cost_usd"].as_f64().unwrap_or(0.0),
        view["tokens"]
    )?;
    outln!(
        "  {:<11} {:<14} {:<10} {:<9} {:<36} {:>9}  title",
        "assignment",
        "task",
        "stage",
        "outcome",
        "worker run",
        "cost"
    )?;
    for a in view["assignments"].as_array().into_iter().flatten() {
        outln!(
            "  {:<11} {:<14} {:<10} {:<9} {:<36} {:>9}  {}",
            s(&a["id"]),
            s(&a["task_id"]),
            s(&a["stage"]),
            s(&a["outcome"]),
            s(&a["worker_run"]),
            format!("${:.4}", a["cost_usd"].as_f64().unwrap_or(0.0)),
            s(&a["title"])
        )?;
    }
    Ok(())
}

/// `baton wave get`: the wave's table (with `--watch`, again whenever it changes, until
/// its run ends).
pub(crate) async fn get(
    place: &Place,
    wave: &str,
    json: bool,
    watch: bool,
) -> anyhow::Result<ExitCode> {
    let engine = action_engine(place).await?;
    let run_id = resolve(&engine, wave).await?;
    let mut shown = None;
    loop {
        let state = engine.state(&run_id).await?;
        if wave_actions::latest_wave(&state).is_none() {
            bail!("run {run_id} has run no wave");
        }
        if shown != Some(state.last_seq) {
            shown = Some(state.last_seq);
            let Some(view) = engine.wave_view(&run_id).await? else {
                bail!("run {run_id} has run no wave");
            };
            if json {
                outln!("{}", serde_json::to_string(&view)?)?;
            } else {
                print_table(&view)?;
            }
        }
        if !watch || state.status.is_final() {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// The runs that ran a wave, newest first, with their latest wave.
async fn waves(engine: &Engine) -> anyhow::Result<Vec<Value>> {
    let runs: Vec<_> = engine.store.runs(None).await?.into_iter().take(RUNS_SCANNED_MAX).collect();
    Ok(engine.wave_views(&runs).await?)
}

/// `baton wave list`: waves, newest first.
pub(crate) async fn list(place: &Place, json: bool) -> anyhow::Result<ExitCode> {
    let engine = action_engine(place).await?;
    let all = waves(&engine).await?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&all)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    if all.is_empty() {
        outln!("no waves")?;
    }
    for v in &all {
        let c = wave_actions::counts_of(v);
        outln!(
            "{}  {:<10} {:<9} level {}: {} assignments — {c}",
            one_line(v["run_id"].as_str().unwrap_or_default()),
            one_line(v["run_status"].as_str().unwrap_or_default()),
            one_line(v["decision"].as_str().unwrap_or_default()),
            one_line(v["level_id"].as_str().unwrap_or_default()),
            c.assignments,
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `baton wave summary`: the orchestration state — waves under way and ended, their
/// assignments counted by outcome, and what they spent.
pub(crate) async fn summary(place: &Place, json: bool) -> anyhow::Result<ExitCode> {
    let engine = action_engine(place).await?;
    let all = waves(&engine).await?;
    let summary = wave_actions::summarize(&all);
    if json {
        outln!("{}", serde_json::to_string_pretty(&summary)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let t = |k: &str| summary["assignments"][k].as_u64().unwrap_or(0);
    let cost = summary["cost_usd"].as_f64().unwrap_or(0.0);
    let under_way = &summary["under_way"];
    outln!(
        "{} waves ({} under way): {} assignments — {} completed, {} partial, {} blocked, {} failed, {} cancelled, {} planned, {} in flight; ${cost:.4}",
        all.len(),
        under_way,
        t("assignments"),
        t("completed"),
        t("partial"),
        t("blocked"),
        t("failed"),
        t("cancelled"),
        t("planned"),
        t("in_flight")
    )?;
    Ok(ExitCode::SUCCESS)
}
