//! `baton wave …`: standalone waves and the actions outside agents take on any wave.
//!
//! `plan` makes a run of a one-level wave scenario (manual dispatch) from a task list;
//! `dispatch` and `record` let an agent run workers itself; `run` makes this process the
//! wave's active dispatcher; `decide`, `complete`, `cancel`, `get`, `list` and `summary`
//! read and end waves. A wave is named by its run id, or `current`: the newest run with a
//! wave under way. Every action is the application layer's (`baton_app::waves`).

use std::path::Path;
use std::process::ExitCode;

use anyhow::bail;
use baton_app::engines::WaveDrive;
use baton_app::place::Place;
use baton_app::start::{JobStart, Setup};
use baton_app::waves::{self, PlanSettings};
use baton_engine::wave_actions::{self, WaveReply};
use serde_json::{Value, json};

use crate::drive;
use crate::escape::one_line;
use crate::out::outln;

/// `baton wave plan`: a new run of a standalone wave; its assignments are planned (or the
/// plan refused) before anything else happens.
pub(crate) async fn plan(
    place: &Place,
    settings: PlanSettings,
    script: Option<std::path::PathBuf>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let (input, scenario) = waves::plan(place, &settings)?;
    let request = JobStart { input, ..JobStart::default() };
    let setup = Setup { script, given: Some(scenario), ..Setup::default() };
    let args =
        drive::RunArgs { request, setup, json, stream: false, queue: None, more_inputs: vec![] };
    drive::run(place, args).await
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
    target: (Option<String>, Option<String>),
    worker_run: String,
    by: Option<String>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let reply = waves::dispatch(place, wave, target, worker_run, by).await?;
    let id = reply.assignment_id.clone().unwrap_or_default();
    print_reply(&reply, &format!("dispatched {id}: "), json)?;
    Ok(ExitCode::SUCCESS)
}

/// `baton wave record`.
pub(crate) async fn record(
    place: &Place,
    wave: &str,
    record: waves::Record,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let (reply, outcome) = waves::record(place, wave, record).await?;
    let id = reply.assignment_id.clone().unwrap_or_default();
    print_reply(&reply, &format!("recorded {id} {}: ", outcome.as_str()), json)?;
    Ok(ExitCode::SUCCESS)
}

/// `baton wave decide`.
pub(crate) async fn decide(place: &Place, wave: &str, json: bool) -> anyhow::Result<ExitCode> {
    let reply = waves::decide(place, wave).await?;
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
    let reply = waves::complete(place, wave, by).await?;
    if !json {
        print_reply(&reply, "ended ", false)?;
    }
    drive::resume(place, &reply.run_id, None, json, false, WaveDrive::default()).await
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
    let (run_id, drive) = waves::to_run(place, wave, max_parallel).await?;
    let code = drive::resume(place, &run_id, script, json, false, drive).await?;
    if !json {
        outln!(
            "the wave's table: `baton wave get {run_id}` (`--watch` to follow it live; `baton serve` shows its run at /#/runs/{run_id})"
        )?;
    }
    Ok(code)
}

/// `baton wave cancel`: cancels the wave's run and its workers, and waits (up to the
/// settle timeout) for the run to end.
pub(crate) async fn cancel(
    place: &Place,
    wave: &str,
    by: Option<String>,
    reason: Option<String>,
) -> anyhow::Result<ExitCode> {
    let (engine, run_id) = waves::cancel(place, wave, by, reason).await?;
    outln!("cancel recorded for wave {run_id} and its workers")?;
    let Some(state) = waves::ended(&engine, &run_id).await? else {
        outln!(
            "wave {run_id}: the cancel is recorded; the process driving it has not ended it yet (see `baton wave get {run_id}`)"
        )?;
        return Ok(ExitCode::SUCCESS);
    };
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
    Ok(ExitCode::SUCCESS)
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
    let (engine, run_id) = waves::open(place, wave).await?;
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

/// `baton wave list`: waves, newest first.
pub(crate) async fn list(place: &Place, json: bool) -> anyhow::Result<ExitCode> {
    let all = waves::all(place).await?;
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
    let all = waves::all(place).await?;
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
