//! The run list (`baton runs`): every run with its status as a person reads it — a run
//! nobody drives is queued (never started) or interrupted —, what it spent and what it
//! waits on (a person, outside agents, its children), as rows or as trees.

use baton_engine::Status;
use baton_engine::event::{Event, EventData, Totals};
use baton_engine::store::{Error as StoreError, EventStore, RunRecord};
use serde_json::{Value, json};

use crate::place::{Place, open_existing_store};

/// How the run list shows a run whose status is `running` and that no process drives
/// (its driver died, or it stopped for a transient reason): `baton resume RUN` continues it.
pub const INTERRUPTED: &str = Status::Interrupted.as_str();

/// How the run list shows a run created to wait for a worker (`baton run --queue`) that no
/// process has taken up yet: its status is `running`, nobody holds it, and no level of it
/// ever started. A `baton worker` on the database claims it.
pub const QUEUED: &str = "queued";

/// How a run whose stored status is `running` and that no process holds is shown, by its
/// log: [`QUEUED`] until a level of it started, [`INTERRUPTED`] after.
pub fn undriven(state: &baton_engine::RunState) -> &'static str {
    if state.level_runs == 0 && state.interrupted.is_none() { QUEUED } else { INTERRUPTED }
}

/// How the run list shows a run whose log does not pass its checks (`baton verify` says
/// where): one damaged run is listed as such, never a reason to list none.
pub const DAMAGED: &str = "damaged";

/// Every status a run can have in the run list (`runs --status`): the stored ones,
/// [`QUEUED`], [`INTERRUPTED`] and [`DAMAGED`].
pub fn run_statuses() -> [&'static str; 10] {
    [
        DAMAGED,
        QUEUED,
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
pub struct Waiting {
    pub level_id: String,
    /// `approval` or `answer`.
    #[serde(rename = "for")]
    pub wants: &'static str,
}

/// The approvals and questions of a log that nobody has decided or answered yet, in the
/// order they were asked.
pub fn waiting_on(events: &[Event]) -> Vec<Waiting> {
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

/// A row of the run list: the run, its depth in its tree (with `tree`), what it spent, what
/// it waits on, and the approval requests it waits for by id (for `approve --request`).
#[derive(Debug)]
pub struct Row {
    pub record: RunRecord,
    pub depth: usize,
    pub totals: Totals,
    pub waiting: Vec<Waiting>,
    pub requests: Vec<String>,
    /// Why the run's log cannot be read, for a [`DAMAGED`] run.
    pub damage: Option<String>,
}

/// The runs of the database, newest first (with `tree`, as trees), of `status` when given:
/// a `running` run nobody holds is [`QUEUED`] or [`INTERRUPTED`] ([`undriven`]), and a
/// `waiting` one whose tree nobody drives is [`INTERRUPTED`].
pub async fn list(place: &Place, status: Option<&str>, tree: bool) -> anyhow::Result<Vec<Row>> {
    let store = open_existing_store(place).await?;
    // A run is interrupted when its status is running and nobody holds it.
    // (A waiting run nobody drives is interrupted too: it is found among all of them.)
    let shown_only = [Some(QUEUED), Some(INTERRUPTED), Some(DAMAGED)];
    let stored = if shown_only.contains(&status) { None } else { status };
    let mut list = Vec::new();
    for mut record in store.runs(stored).await? {
        if record.status == Status::Running.as_str() && !store.is_held(&record.run_id).await? {
            record.status = INTERRUPTED.to_owned();
        }
        let maybe_interrupted =
            status == Some(INTERRUPTED) && record.status == Status::Waiting.as_str();
        let maybe_queued = status == Some(QUEUED) && record.status == INTERRUPTED;
        if status.is_none_or(|s| s == record.status)
            || maybe_interrupted
            || maybe_queued
            || status == Some(DAMAGED)
        {
            list.push(record);
        }
    }
    let list = if tree { as_tree(list) } else { list.into_iter().map(|r| (r, 0)).collect() };
    let mut rows = Vec::with_capacity(list.len());
    for (mut record, depth) in list {
        let events = match store.load(&record.run_id, 0).await {
            Ok(events) => events,
            Err(e @ StoreError::Damaged { .. }) => {
                record.status = DAMAGED.to_owned();
                if status.is_none_or(|s| s == DAMAGED) {
                    let damage = Some(e.to_string());
                    let totals = Totals::default();
                    let (waiting, requests) = (Vec::new(), Vec::new());
                    rows.push(Row { record, depth, totals, waiting, requests, damage });
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if status == Some(DAMAGED) {
            continue;
        }
        let state = baton_engine::state::fold(&events);
        if record.status == INTERRUPTED {
            record.status = undriven(&state).to_owned();
        }
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
        let requests: Vec<String> = if paused {
            state.open_approvals().map(|p| p.request.request_id.clone()).collect()
        } else {
            Vec::new()
        };
        if status.is_some_and(|s| s != record.status) {
            continue;
        }
        rows.push(Row { record, depth, totals: state.totals, waiting, requests, damage: None });
    }
    Ok(rows)
}

/// A row as `baton runs --json` lists it (with `tree`, its depth).
pub fn row_json(row: &Row, tree: bool) -> serde_json::Result<Value> {
    let mut json_row = serde_json::to_value(&row.record)?;
    if let Value::Object(map) = &mut json_row {
        map.insert("cost_usd".to_owned(), json!(row.totals.cost_usd));
        map.insert("tokens".to_owned(), json!(row.totals.tokens));
        map.insert("duration_ms".to_owned(), json!(row.totals.duration_ms));
        map.insert("waiting_on".to_owned(), serde_json::to_value(&row.waiting)?);
        map.insert("pending_requests".to_owned(), json!(row.requests));
        if tree {
            map.insert("depth".to_owned(), json!(row.depth));
        }
        if row.record.status == INTERRUPTED {
            let resume = format!("baton resume {}", row.record.run_id);
            map.insert("continue_with".to_owned(), json!(resume));
        }
        if row.record.status == QUEUED {
            map.insert("continue_with".to_owned(), json!("baton worker"));
        }
        if let Some(damage) = &row.damage {
            map.insert("damage".to_owned(), json!(damage));
        }
    }
    Ok(json_row)
}

/// Whether a waiting run's tree is going on: one of its open children is driven, waits
/// for a person, or waits for children of its own that are. A waiting run whose children
/// are missing, ended or undriven waits for nothing: its driver died.
async fn tree_is_live(
    store: &dyn EventStore,
    state: &baton_engine::RunState,
) -> Result<bool, StoreError> {
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
            // A damaged child is driven by nobody: it is listed as damaged itself.
            let events = match store.load(&id, 0).await {
                Ok(events) => events,
                Err(StoreError::Damaged { .. }) => continue,
                Err(e) => return Err(e),
            };
            let child = baton_engine::state::fold(&events);
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
                    model_constraint_allow: None,
                    process: None,
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
                    tool: None,
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
    fn the_statuses_runs_accepts_are_the_ones_runs_have() {
        let statuses = run_statuses();
        for s in [Status::Running, Status::Paused, Status::Completed, Status::Cancelled] {
            assert!(statuses.contains(&s.as_str()));
        }
        assert!(!statuses.contains(&Status::New.as_str()), "a run is listed once it started");
        assert!(statuses.contains(&INTERRUPTED));
        assert!(statuses.contains(&QUEUED));
        assert!(statuses.contains(&DAMAGED));
    }
}
