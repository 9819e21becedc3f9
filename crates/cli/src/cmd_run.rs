//! `baton approve`, `answer`, `cancel`, `runs`, `events` and `cassette export`: the
//! commands on runs that exist.

#![allow(clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use baton_engine::cassette;
use baton_engine::event::{Event, EventData};
use baton_engine::model::ScriptedModel;
use baton_engine::store::EventStore;
use baton_engine::{Engine, Status};
use baton_scenario::Registry;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use baton_app::engines::{WaveDrive, engine, jobs, probe_engine, redactor, workspace_setup};
use baton_app::jail::jail;
use baton_app::place::{Place, open_existing_store};
use baton_app::scenarios::run_scenario;

use crate::drive::{
    Followed, check_who_and_why, follow, print_event, print_json_line, print_timeline, resume,
    waiting_lines,
};
use crate::escape;
use crate::limits::DATA_BYTES_MAX;
use crate::out::outln;

/// Options of `baton approve`.
#[derive(Debug)]
pub(crate) struct Decision {
    pub request: Option<String>,
    pub reject: bool,
    pub comment: Option<String>,
    pub by: Option<String>,
    /// A file with the approver's data for the level's `output_schema`.
    pub data: Option<PathBuf>,
    pub script: Option<PathBuf>,
    pub no_resume: bool,
}

/// Reads the approver's data: a regular file of at most [`DATA_BYTES_MAX`] bytes holding JSON.
fn read_data(path: &Path) -> anyhow::Result<Value> {
    let shown = path.display();
    let bytes = baton_scenario::capped::read_bytes(path, DATA_BYTES_MAX)
        .map_err(|e| anyhow::anyhow!("--data: {e}"))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| anyhow::anyhow!("--data {shown}:{}:{}: not JSON: {e}", e.line(), e.column()))
}

/// An engine that records decisions and answers: it needs no scenario, so it works from a
/// directory where the scenarios do not load.
async fn decision_engine(place: &Place) -> anyhow::Result<Engine> {
    let store = open_existing_store(place).await?;
    Ok(probe_engine(place, &store, &Registry::default()))
}

/// Continues a run after a decision or an answer was recorded, on the scenario version it
/// started with; when that cannot be loaded here, says why and how to continue it (exit 0:
/// what was asked is recorded).
async fn continue_run(
    place: &Place,
    run_id: &str,
    script: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let probe = decision_engine(place).await?;
    let state = probe.state(run_id).await?;
    if let Err(e) = run_scenario(place, &probe, &state, run_id).await {
        eprintln!(
            "the run is not continued here: {}; continue it with `baton resume {run_id}` once that is fixed",
            escape::terminal_safe(&format!("{e:#}"), escape::Layout::Block)
        );
        return Ok(ExitCode::SUCCESS);
    }
    resume(place, run_id, script, false, false, WaveDrive::default()).await
}

pub(crate) async fn approve(place: &Place, run_id: &str, d: Decision) -> anyhow::Result<ExitCode> {
    let data = d.data.as_deref().map(read_data).transpose()?;
    let engine = decision_engine(place).await?;
    let decision = baton_engine::Decision {
        request_id: d.request,
        approved: !d.reject,
        comment: d.comment,
        by: d.by,
        data,
    };
    let decided = engine.decide(run_id, decision).await?;
    outln!(
        "{} request {} of run {run_id}",
        if decided.approved { "approved" } else { "rejected" },
        escape::one_line(&decided.request_id)
    )?;
    if d.no_resume {
        return Ok(ExitCode::SUCCESS);
    }
    continue_run(place, run_id, d.script.as_deref()).await
}

pub(crate) async fn answer(
    place: &Place,
    run_id: &str,
    answer: &str,
    script: Option<&Path>,
    no_resume: bool,
) -> anyhow::Result<ExitCode> {
    let value: Value = serde_json::from_str(answer).with_context(|| {
        format!("--answer must be JSON (a string needs quotes: '\"yes\"'), got {answer}")
    })?;
    let engine = decision_engine(place).await?;
    engine.answer(run_id, value).await?;
    outln!("answered run {run_id}")?;
    if no_resume {
        return Ok(ExitCode::SUCCESS);
    }
    continue_run(place, run_id, script).await
}

/// Records a cancel and ends the run here when nobody drives it. Needs no scenario: the
/// end of a cancelled run reads nothing from it, so a broken or changed scenarios
/// directory never keeps a run from being stopped.
pub(crate) async fn cancel(
    place: &Place,
    run_id: &str,
    by: Option<String>,
    reason: Option<String>,
) -> anyhow::Result<ExitCode> {
    check_who_and_why(by.as_deref(), reason.as_deref())?;
    let store = open_existing_store(place).await?;
    // The settle timeout of the configuration when it loads; a broken configuration never
    // keeps a run from being stopped.
    let probe = engine(
        Arc::clone(&store),
        Arc::new(ScriptedModel::default()),
        &Registry::default(),
        workspace_setup(place, None, None),
        redactor(place),
        jail(place),
        jobs(place, Arc::new(Registry::default()), None, WaveDrive::default()).ok().map(Arc::new),
    );
    let Some(record) = store.run(run_id).await? else {
        bail!("no run {run_id} in {}", place.db_shown());
    };
    match baton_app::runs::cancel(&probe, &record, by, reason).await? {
        baton_app::runs::Cancelled::Ended => outln!("cancelled run {run_id}")?,
        baton_app::runs::Cancelled::Requested => outln!(
            "cancel requested for run {run_id}: the process driving it stops at its next check"
        )?,
    }
    Ok(ExitCode::SUCCESS)
}

/// How the run list shows a run whose status is `running` and that no process drives
/// (its driver died, or it stopped for a transient reason): `baton resume RUN` continues it.
pub(crate) const INTERRUPTED: &str = Status::Interrupted.as_str();

/// Every status a run can have in the run list (`runs --status`): the stored ones, and
/// [`INTERRUPTED`].
pub(crate) fn run_statuses() -> [&'static str; 8] {
    [
        Status::Running.as_str(),
        Status::Paused.as_str(),
        Status::Waiting.as_str(),
        Status::Interrupted.as_str(),
        Status::Completed.as_str(),
        Status::Aborted.as_str(),
        Status::Cancelled.as_str(),
        Status::Failed.as_str(),
    ]
}

/// A level a paused run waits on, and for what.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
struct Waiting {
    level_id: String,
    /// `approval` or `answer`.
    #[serde(rename = "for")]
    wants: &'static str,
}

/// The approvals and questions of a log that nobody has decided or answered yet, in the
/// order they were asked.
fn waiting_on(events: &[Event]) -> Vec<Waiting> {
    let mut open: Vec<(&str, Waiting)> = Vec::new();
    for e in events {
        let level_id = e.level_id.clone().unwrap_or_default();
        match &e.data {
            EventData::ApprovalRequested(a) => {
                open.push((&a.request_id, Waiting { level_id, wants: "approval" }));
            }
            EventData::AskUser(a) => open.push((&a.call_id, Waiting { level_id, wants: "answer" })),
            EventData::ApprovalDecided(d) => {
                open.retain(|(id, w)| !(w.wants == "approval" && *id == d.request_id));
            }
            EventData::UserAnswered(a) => {
                open.retain(|(id, w)| !(w.wants == "answer" && *id == a.call_id));
            }
            // A level that ended no longer waits (a cancel closes it as skipped).
            EventData::LevelFinished(_) => open.retain(|(_, w)| w.level_id != level_id),
            EventData::ScenarioFinished(_) => open.clear(),
            _ => {}
        }
    }
    open.into_iter().map(|(_, w)| w).collect()
}

/// A duration as people read it: `850 ms`, `12.4 s`, `3 min 05 s`, `2 h 10 min`.
fn human_duration(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{} min {:02} s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{} h {:02} min", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

pub(crate) async fn runs(
    place: &Place,
    status: Option<&str>,
    tree: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let store = open_existing_store(place).await?;
    // A run is interrupted when its status is running and nobody holds it.
    // (A waiting run nobody drives is interrupted too: it is found among all of them.)
    let stored = if status == Some(INTERRUPTED) { None } else { status };
    let mut list = Vec::new();
    for mut record in store.runs(stored).await? {
        if record.status == Status::Running.as_str() && !store.is_held(&record.run_id).await? {
            record.status = INTERRUPTED.to_owned();
        }
        let maybe_interrupted =
            status == Some(INTERRUPTED) && record.status == Status::Waiting.as_str();
        if status.is_none_or(|s| s == record.status) || maybe_interrupted {
            list.push(record);
        }
    }
    let list = if tree { as_tree(list) } else { list.into_iter().map(|r| (r, 0)).collect() };
    let mut rows = Vec::with_capacity(list.len());
    for (mut record, depth) in list {
        let events = store.load(&record.run_id, 0).await?;
        let state = baton_engine::state::fold(&events);
        if record.status == Status::Waiting.as_str()
            && !tree_is_live(store.as_ref(), &state).await?
        {
            record.status = INTERRUPTED.to_owned();
        }
        let paused = record.status == Status::Paused.as_str();
        let mut waiting = if paused { waiting_on(&events) } else { Vec::new() };
        if let Some(w) = manual_wave(&state) {
            let c = w.counts();
            waiting.push(Waiting {
                level_id: format!(
                    "{} ({} planned, {} in flight)",
                    w.level_id, c.planned, c.in_flight
                ),
                wants: "outside agents",
            });
        }
        // A run waiting for its children waits on each of them.
        for child in state.open_children() {
            waiting.push(Waiting {
                level_id: format!("{} ({})", child.started.child_run_id, child.started.scenario_id),
                wants: "child run",
            });
        }
        // The approval requests a paused run waits for, by id (for `approve --request`).
        let requests: Vec<String> = if paused {
            state.open_approvals().map(|p| p.request.request_id.clone()).collect()
        } else {
            Vec::new()
        };
        if status.is_some_and(|s| s != record.status) {
            continue;
        }
        rows.push((record, depth, state.totals, waiting, requests));
    }
    if json {
        let mut list = Vec::with_capacity(rows.len());
        for (record, depth, totals, waiting, requests) in &rows {
            let mut row = serde_json::to_value(record)?;
            if let Value::Object(map) = &mut row {
                map.insert("cost_usd".to_owned(), json!(totals.cost_usd));
                map.insert("tokens".to_owned(), json!(totals.tokens));
                map.insert("duration_ms".to_owned(), json!(totals.duration_ms));
                map.insert("waiting_on".to_owned(), serde_json::to_value(waiting)?);
                map.insert("pending_requests".to_owned(), json!(requests));
                if tree {
                    map.insert("depth".to_owned(), json!(depth));
                }
                if record.status == INTERRUPTED {
                    let resume = format!("baton resume {}", record.run_id);
                    map.insert("continue_with".to_owned(), json!(resume));
                }
            }
            list.push(row);
        }
        outln!("{}", serde_json::to_string_pretty(&list)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        outln!("no runs{}", status.map_or(String::new(), |s| format!(" with status {s}")))?;
        return Ok(ExitCode::SUCCESS);
    }
    let width = 36 + rows.iter().map(|(_, d, ..)| d * 2).max().unwrap_or(0);
    outln!(
        "{:<width$}  {:<11} {:<22} {:>9} {:>9} {:>12}  {:<19}  waits on",
        "run",
        "status",
        "scenario",
        "cost",
        "tokens",
        "duration",
        "updated"
    )?;
    for (r, depth, totals, waiting, requests) in rows {
        let waits: Vec<String> =
            waiting.iter().map(|w| format!("{} ({})", w.level_id, w.wants)).collect();
        let row = format!(
            "{:<width$}  {:<11} {:<22} {:>9} {:>9} {:>12}  {:<19}  {}",
            format!("{}{}", "  ".repeat(depth), r.run_id),
            r.status,
            r.scenario_id,
            format!("${:.4}", totals.cost_usd),
            totals.tokens,
            human_duration(totals.duration_ms),
            r.updated_at.format("%Y-%m-%d %H:%M:%S"),
            waits.join(", ")
        );
        outln!("{}", escape::one_line(&row))?;
        if !requests.is_empty() {
            outln!("    waits for approval: {}", escape::one_line(&requests.join(", ")))?;
        }
        if r.status == INTERRUPTED {
            outln!("    no process drives it; continue it with `baton resume {}`", r.run_id)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether a waiting run's tree is going on: one of its open children is driven, waits
/// for a person, or waits for children of its own that are. A waiting run whose children
/// are missing, ended or undriven waits for nothing: its driver died.
async fn tree_is_live(
    store: &dyn EventStore,
    state: &baton_engine::RunState,
) -> anyhow::Result<bool> {
    // A manual wave waits for outside agents, not for a driver.
    if manual_wave(state).is_some() {
        return Ok(true);
    }
    let mut pending: Vec<String> =
        state.open_children().map(|c| c.started.child_run_id.clone()).collect();
    // Bounded by the chain's depth and the children a run records.
    let mut looked = 0;
    while let Some(id) = pending.pop() {
        looked += 1;
        if looked > 1_000 {
            return Ok(true);
        }
        let Some(record) = store.run(&id).await? else { continue };
        if record.status == Status::Paused.as_str() || store.is_held(&id).await? {
            return Ok(true);
        }
        if record.status == Status::Waiting.as_str() {
            let child = baton_engine::state::fold(&store.load(&id, 0).await?);
            pending.extend(child.open_children().map(|c| c.started.child_run_id.clone()));
        }
    }
    Ok(false)
}

/// The manual wave a run is at, if it waits for outside agents.
fn manual_wave(state: &baton_engine::RunState) -> Option<&baton_engine::wave::WaveState> {
    baton_engine::wave_actions::wave_under_way(state).filter(|w| w.plan.is_manual())
}

/// Runs ordered as trees: each run whose parent is not listed, newest first, then the
/// runs below it, depth first, each with its depth under the first.
fn as_tree(
    list: Vec<baton_engine::store::RunRecord>,
) -> Vec<(baton_engine::store::RunRecord, usize)> {
    let listed: std::collections::HashSet<String> = list.iter().map(|r| r.run_id.clone()).collect();
    let mut below: std::collections::HashMap<String, Vec<baton_engine::store::RunRecord>> =
        std::collections::HashMap::new();
    let mut tops = Vec::new();
    for r in list {
        match r.parent_run_id.clone().filter(|p| listed.contains(p)) {
            Some(parent) => below.entry(parent).or_default().push(r),
            None => tops.push(r),
        }
    }
    let mut out = Vec::new();
    let mut pending: Vec<(baton_engine::store::RunRecord, usize)> =
        tops.into_iter().rev().map(|r| (r, 0)).collect();
    while let Some((r, depth)) = pending.pop() {
        if let Some(mut children) = below.remove(&r.run_id) {
            // The list is newest first; children read in the order they started.
            children.reverse();
            pending.extend(children.into_iter().rev().map(|c| (c, depth + 1)));
        }
        out.push((r, depth));
    }
    out
}

pub(crate) async fn export_cassette(
    place: &Place,
    run_id: &str,
    out: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let store = open_existing_store(place).await?;
    if store.run(run_id).await?.is_none() {
        bail!("no run {run_id} in {}", place.db_shown());
    }
    let cassette = cassette::from_events(&store.load(run_id, 0).await?);
    match out {
        Some(path) => {
            cassette.save(path).map_err(anyhow::Error::msg)?;
            outln!("wrote {} recorded answers to {}", cassette.entries.len(), path.display())?;
        }
        None => outln!("{}", serde_json::to_string_pretty(&cassette)?)?,
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn events(
    place: &Place,
    run_id: &str,
    follow_on: bool,
    tree: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let store = open_existing_store(place).await?;
    if store.run(run_id).await?.is_none() {
        bail!("no run {run_id} in {}", place.db_shown());
    }
    if tree {
        // Each run's events with those of the runs it started nested under the event that
        // started each; read once (closed at once) unless following.
        let (stop, stopped) = oneshot::channel();
        if !follow_on {
            let _ = stop.send(());
        }
        let runs = vec![Followed::new(run_id, 0, 0)];
        follow(store.as_ref(), runs, true, Some(stopped), |id, depth, e| {
            if json { print_json_line(e, id) } else { print_timeline(e, depth, id) }
        })
        .await?;
        return Ok(ExitCode::SUCCESS);
    }
    if follow_on {
        let runs = vec![Followed::new(run_id, 0, 0)];
        follow(store.as_ref(), runs, false, None, |_, _, e| print_event(e, json)).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let log = store.load(run_id, 0).await?;
    for e in &log {
        print_event(e, json)?;
    }
    if !json {
        for line in waiting_lines(&baton_engine::fold(&log), run_id) {
            outln!("waiting   {line}")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use baton_engine::event::{
        ApprovalDecided, ApprovalRequested, AskUser, LevelStarted, NewEvent, UserAnswered,
    };

    use chrono::Utc;

    use super::*;

    fn at(seq: u64, level: &str, data: EventData) -> Event {
        NewEvent::level(level, 1, data).at(seq, Utc::now())
    }

    #[test]
    fn a_run_waits_on_the_approvals_and_questions_nobody_has_answered() {
        let started = |seq, level: &str| {
            at(
                seq,
                level,
                EventData::LevelStarted(LevelStarted {
                    role: "r".to_owned(),
                    kind: "k".to_owned(),
                    parent: None,
                }),
            )
        };
        let approval = |seq, level: &str, id: &str| {
            at(
                seq,
                level,
                EventData::ApprovalRequested(ApprovalRequested {
                    request_id: id.to_owned(),
                    approver_role: "lead".to_owned(),
                    question: "ok?".to_owned(),
                    schema: Value::Null,
                    deadline: None,
                }),
            )
        };
        let decided = |seq, id: &str| {
            NewEvent::run(EventData::ApprovalDecided(ApprovalDecided {
                request_id: id.to_owned(),
                approved: false,
                comment: None,
                by: None,
                data: None,
                timed_out: false,
            }))
            .at(seq, Utc::now())
        };
        let ask = at(
            5,
            "ask",
            EventData::AskUser(AskUser { call_id: "c1".to_owned(), question: json!("which?") }),
        );
        let mut log = vec![started(1, "gate"), approval(2, "gate", "a1")];
        let waits = |log: &[Event]| -> Vec<(String, &'static str)> {
            waiting_on(log).into_iter().map(|w| (w.level_id, w.wants)).collect()
        };
        assert_eq!(waits(&log), [("gate".to_owned(), "approval")]);
        log.push(decided(3, "a1"));
        assert!(waits(&log).is_empty());
        // A request decided under another id does not answer this one.
        log.push(approval(4, "gate", "a2"));
        log.push(ask);
        assert_eq!(waits(&log), [("gate".to_owned(), "approval"), ("ask".to_owned(), "answer")]);
        log.push(
            NewEvent::run(EventData::UserAnswered(UserAnswered {
                call_id: "c1".to_owned(),
                answer: json!("b"),
            }))
            .at(6, Utc::now()),
        );
        assert_eq!(waits(&log), [("gate".to_owned(), "approval")]);
        log.push(decided(7, "other"));
        assert_eq!(waits(&log), [("gate".to_owned(), "approval")]);
    }

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(human_duration(850), "850 ms");
        assert_eq!(human_duration(12_400), "12.4 s");
        assert_eq!(human_duration(185_000), "3 min 05 s");
        assert_eq!(human_duration(7_800_000), "2 h 10 min");
    }

    #[test]
    fn the_statuses_runs_accepts_are_the_ones_runs_have() {
        let statuses = run_statuses();
        for s in [Status::Running, Status::Paused, Status::Completed, Status::Cancelled] {
            assert!(statuses.contains(&s.as_str()));
        }
        assert!(!statuses.contains(&Status::New.as_str()), "a run is listed once it started");
        assert!(statuses.contains(&INTERRUPTED));
    }
}
