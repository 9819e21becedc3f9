//! Waves (CEREBEL, reference 003): a batch of assignments, each run by a worker, with
//! bounded parallelism and a controller that decides what comes next.
//!
//! Everything here is pure: a wave's state is folded from its run's log (`wave_planned`,
//! `wave_dispatched`, `wave_recorded`, `wave_decided`, and the `child_run_settled` of
//! the workers Baton runs as child runs), and every decision is a function of that state.
//! The executor dispatches what [`WaveState::admissible`] admits (`job.rs` drives the
//! workers); outside agents dispatch and record through [`crate::wave_actions`].
//!
//! Decisions, in precedence order (the reference leaves it open):
//! 1. `cancelled` — the wave's run was cancelled;
//! 2. once any assignment is `blocked`, `failed` or `cancelled`, nothing more is admitted:
//!    `wait` while a worker is in flight, then `escalate` if any is blocked, else `replan`;
//! 3. `dispatch` — planned assignments and a free slot under `max_parallel`;
//! 4. `wait` — workers in flight and nothing to admit;
//! 5. `complete` — every assignment `completed` or `partial`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Map, Value, json};

use baton_scenario::limits::{WAVE_PARALLEL_DEFAULT, WAVE_PARALLEL_MAX};

use crate::event::{
    Assignment, ChildRunSettled, FinalStatus, WaveCounts, WaveDecided, WaveDecision,
    WaveDispatched, WaveOrder, WavePlanned, WaveRecorded, WorkerOutcome,
};

/// Longest task title, in characters.
pub const TITLE_CHARS_MAX: usize = 500;
/// Longest task description or wave context, in bytes.
pub const TEXT_BYTES_MAX: usize = 20 * 1024;
/// Longest task id, in characters.
pub const TASK_ID_CHARS_MAX: usize = 64;
/// Longest summary kept from a worker report, in bytes.
pub const SUMMARY_BYTES_MAX: usize = 4 * 1024;
/// Most blockers kept from a worker report, and the longest of each, in bytes.
pub const BLOCKERS_MAX: usize = 20;
pub const BLOCKER_BYTES_MAX: usize = 1024;
/// Longest id of an outside worker's run.
pub const WORKER_RUN_CHARS_MAX: usize = 128;

/// The prefix of a wave worker's link in its parent: `wave:<level>:<attempt>:<assignment>`.
pub const LINK_PREFIX: &str = "wave:";

/// A worker's link in its parent, which names its child run.
pub fn link(level_id: &str, attempt: u32, assignment_id: &str) -> String {
    format!("{LINK_PREFIX}{level_id}:{attempt}:{assignment_id}")
}

/// An assignment's worker, once dispatched.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Dispatch {
    pub worker_run: String,
    /// The child run Baton runs it as, when it does.
    pub child_run_id: Option<String>,
    pub by: Option<String>,
    pub at: DateTime<Utc>,
}

/// An assignment's outcome, as recorded or as its worker's run ended.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Settlement {
    pub outcome: WorkerOutcome,
    pub summary: String,
    pub blockers: Vec<String>,
    pub by: Option<String>,
    pub reason: Option<String>,
}

/// One assignment, where it stands.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AssignmentState {
    pub assignment: Assignment,
    pub dispatched: Option<Dispatch>,
    pub settled: Option<Settlement>,
    /// The worker's child run has not ended yet (a timed-out worker is settled before its
    /// run has stopped).
    pub child_open: bool,
    /// The child run's parent stopped waiting for it (`child_run_unsettled`).
    pub unsettled: bool,
    pub cost_usd: f64,
    pub tokens: u64,
}

impl AssignmentState {
    /// The child run its worker is, when Baton runs it.
    pub fn worker_child(&self) -> Option<&str> {
        self.dispatched.as_ref().and_then(|d| d.child_run_id.as_deref())
    }

    /// `planned`, `dispatched` or `settled`.
    pub fn stage(&self) -> &'static str {
        match (&self.dispatched, &self.settled) {
            (_, Some(_)) => "settled",
            (Some(_), None) => "dispatched",
            (None, None) => "planned",
        }
    }

    /// A worker runs for it: dispatched and not settled, or settled while its child run
    /// still ends.
    pub fn in_flight(&self) -> bool {
        (self.dispatched.is_some() && self.settled.is_none() && !self.unsettled) || self.child_open
    }
}

/// A wave level's current attempt, folded.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WaveState {
    pub level_id: String,
    pub attempt: u32,
    pub plan: WavePlanned,
    pub assignments: Vec<AssignmentState>,
    /// The last decision recorded.
    pub decided: Option<WaveDecided>,
    /// The decision that ended the wave, once one did.
    pub closed: Option<WaveDecided>,
}

impl WaveState {
    /// A wave just planned.
    pub fn new(level_id: &str, attempt: u32, plan: WavePlanned) -> Self {
        let assignments = plan
            .assignments
            .iter()
            .map(|a| AssignmentState {
                assignment: a.clone(),
                dispatched: None,
                settled: None,
                child_open: false,
                unsettled: false,
                cost_usd: 0.0,
                tokens: 0,
            })
            .collect();
        WaveState {
            level_id: level_id.to_owned(),
            attempt,
            plan,
            assignments,
            decided: None,
            closed: None,
        }
    }

    /// The assignment with this id.
    pub fn assignment(&self, id: &str) -> Option<&AssignmentState> {
        self.assignments.iter().find(|a| a.assignment.id == id)
    }

    /// The assignment whose worker is the child run `child_run_id`.
    pub fn by_child(&self, child_run_id: &str) -> Option<&AssignmentState> {
        self.assignments.iter().find(|a| a.worker_child() == Some(child_run_id))
    }

    fn by_child_mut(&mut self, child_run_id: &str) -> Option<&mut AssignmentState> {
        self.assignments.iter_mut().find(|a| a.worker_child() == Some(child_run_id))
    }

    /// Folds a dispatch.
    pub fn apply_dispatched(&mut self, d: &WaveDispatched, at: DateTime<Utc>) {
        if let Some(a) = self.assignments.iter_mut().find(|a| a.assignment.id == d.assignment_id)
            && a.dispatched.is_none()
        {
            a.child_open = d.child_run_id.is_some();
            a.dispatched = Some(Dispatch {
                worker_run: d.worker_run.clone(),
                child_run_id: d.child_run_id.clone(),
                by: d.by.clone(),
                at,
            });
        }
    }

    /// Folds a recorded outcome; the first one stands.
    pub fn apply_recorded(&mut self, r: &WaveRecorded) {
        if let Some(a) = self.assignments.iter_mut().find(|a| a.assignment.id == r.assignment_id)
            && a.settled.is_none()
        {
            a.settled = Some(Settlement {
                outcome: r.outcome,
                summary: r.summary.clone(),
                blockers: r.blockers.clone(),
                by: r.by.clone(),
                reason: r.reason.clone(),
            });
        }
    }

    /// Folds a worker child run's settlement: its assignment takes the run's result unless
    /// an outcome was recorded first.
    pub fn apply_child_settled(&mut self, c: &ChildRunSettled) {
        let reports_required = self.plan.reports_required;
        let Some(a) = self.by_child_mut(&c.child_run_id) else { return };
        a.child_open = false;
        a.cost_usd = c.tree_totals.cost_usd;
        a.tokens = c.tree_totals.tokens;
        if a.settled.is_none() {
            a.settled = Some(settlement_of(c, reports_required));
        }
    }

    /// Folds a worker child run its parent stopped waiting for.
    pub fn apply_child_unsettled(&mut self, child_run_id: &str) {
        if let Some(a) = self.by_child_mut(child_run_id) {
            a.child_open = false;
            a.unsettled = a.settled.is_none();
        }
    }

    /// The assignments counted by where they stand.
    pub fn counts(&self) -> WaveCounts {
        let mut c = WaveCounts {
            assignments: u32::try_from(self.assignments.len()).unwrap_or(u32::MAX),
            ..WaveCounts::default()
        };
        for a in &self.assignments {
            if a.in_flight() {
                c.in_flight += 1;
            }
            match &a.settled {
                None if a.dispatched.is_none() => c.planned += 1,
                None => {}
                Some(s) => match s.outcome {
                    WorkerOutcome::Completed => c.completed += 1,
                    WorkerOutcome::Partial => c.partial += 1,
                    WorkerOutcome::Blocked => c.blocked += 1,
                    WorkerOutcome::Failed => c.failed += 1,
                    WorkerOutcome::Cancelled => c.cancelled += 1,
                },
            }
        }
        c
    }

    /// The controller's decision (see the module's precedence), under `max_parallel`.
    pub fn decide(&self, cancelled: bool, max_parallel: u32) -> WaveDecision {
        if cancelled {
            return WaveDecision::Cancelled;
        }
        let c = self.counts();
        if c.blocked + c.failed + c.cancelled > 0 {
            return if c.in_flight > 0 {
                WaveDecision::Wait
            } else if c.blocked > 0 {
                WaveDecision::Escalate
            } else {
                WaveDecision::Replan
            };
        }
        if c.planned > 0 && c.in_flight < max_parallel {
            return WaveDecision::Dispatch;
        }
        if c.in_flight > 0 || c.planned > 0 {
            return WaveDecision::Wait;
        }
        WaveDecision::Complete
    }

    /// The planned assignments that may be dispatched now under `max_parallel`, in the
    /// wave's recorded admission order ([`admission_order`]).
    pub fn admissible(&self, max_parallel: u32) -> Vec<&Assignment> {
        if self.decide(false, max_parallel) != WaveDecision::Dispatch {
            return Vec::new();
        }
        let free = max_parallel.saturating_sub(self.counts().in_flight) as usize;
        let waiting: Vec<&Assignment> = self
            .assignments
            .iter()
            .filter(|a| a.dispatched.is_none() && a.settled.is_none())
            .map(|a| &a.assignment)
            .collect();
        let mut admitted = admission_order(self.plan.order, waiting);
        admitted.truncate(free);
        admitted
    }

    /// What the wave spent, all assignments together.
    pub fn spent(&self) -> (f64, u64) {
        self.assignments.iter().fold((0.0, 0), |(c, t), a| (c + a.cost_usd, t + a.tokens))
    }

    /// The wave's summary: counts, spend, and each assignment's stage and outcome, with
    /// its worker's run when `workers` (the view). The level's output, which prompts and
    /// gates read, leaves the workers' runs out: their ids come from time, and a prompt
    /// holding one could never be answered from a recording.
    pub fn summary(&self, decision: WaveDecision, workers: bool) -> Value {
        let counts = self.counts();
        let (cost_usd, tokens) = self.spent();
        // Sums of binary fractions: shown to the nano-dollar, not to the float's last bit.
        let usd = |x: f64| (x * 1e9).round() / 1e9;
        let assignments: Vec<Value> = self
            .assignments
            .iter()
            .map(|a| {
                let mut v = json!({
                    "id": a.assignment.id,
                    "task_id": a.assignment.task_id,
                    "title": a.assignment.title,
                    "stage": if a.unsettled { "unsettled" } else { a.stage() },
                    "outcome": a.settled.as_ref().map(|s| s.outcome.as_str()),
                    "summary": a.settled.as_ref().map(|s| s.summary.as_str()),
                    "blockers": a.settled.as_ref().map(|s| s.blockers.clone()).unwrap_or_default(),
                    "cost_usd": usd(a.cost_usd),
                    "tokens": a.tokens,
                });
                if workers && let Some(o) = v.as_object_mut() {
                    o.insert(
                        "worker_run".to_owned(),
                        json!(a.dispatched.as_ref().map(|d| d.worker_run.as_str())),
                    );
                }
                v
            })
            .collect();
        json!({
            "decision": decision.as_str(),
            "counts": counts,
            "cost_usd": usd(cost_usd),
            "tokens": tokens,
            "assignments": assignments,
        })
    }
}

/// The scheduling hook: the waiting assignments (in plan order) in the order `order`
/// admits them. A strategy is a pure function of the wave's folded state, named on
/// `wave_planned`: the dispatcher, `baton wave dispatch` and every replay call this one
/// function, so they agree on what comes next; a new strategy is a new [`WaveOrder`].
pub fn admission_order(order: WaveOrder, mut waiting: Vec<&Assignment>) -> Vec<&Assignment> {
    match order {
        WaveOrder::Plan => {}
        // A stable sort: the plan's order among equals.
        WaveOrder::Priority => waiting.sort_by_key(|a| match a.priority.as_deref() {
            Some("high") => 0,
            Some("medium") => 1,
            Some("low") => 2,
            _ => 3,
        }),
    }
    waiting
}

/// The settlement a worker's run gives its assignment.
///
/// Where reports are required (every wave planned since), the stricter of the run's
/// status (completed, failed or aborted → failed, cancelled or aborted by a result that
/// came after the cancel → cancelled) and the worker
/// report ending its output, in the order completed < partial < blocked < failed <
/// cancelled; a completed run without a report fails (`report missing`), and a report
/// that is there but does not read fails the assignment with why. Before, a completed
/// run took its report when it had one and read as completed without.
pub fn settlement_of(c: &ChildRunSettled, reports_required: bool) -> Settlement {
    let settlement = |outcome: WorkerOutcome, summary: String, reason: Option<&str>| Settlement {
        outcome,
        summary,
        blockers: Vec::new(),
        by: None,
        reason: reason.map(str::to_owned),
    };
    let ended = format!(
        "the worker run ended {}{}",
        c.status.as_str(),
        c.aborted_reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default()
    );
    let late = c.aborted_reason.as_deref() == Some(crate::event::LATE_RESULT_AFTER_CANCEL);
    let by_status = match c.status {
        FinalStatus::Completed => WorkerOutcome::Completed,
        // A worker whose result came after its cancel was cancelled, not failed.
        FinalStatus::Aborted if late => WorkerOutcome::Cancelled,
        FinalStatus::Failed | FinalStatus::Aborted => WorkerOutcome::Failed,
        FinalStatus::Cancelled => WorkerOutcome::Cancelled,
    };
    let report = c.final_output.as_deref().and_then(report_of);
    if !reports_required {
        return match (c.status, report) {
            (FinalStatus::Completed, Some(Ok(report))) => report,
            (FinalStatus::Completed, Some(Err(why))) => settlement(
                WorkerOutcome::Failed,
                format!("the worker report does not read: {why}"),
                Some("report"),
            ),
            _ => settlement(by_status, ended, None),
        };
    }
    match report {
        Some(Ok(report)) if report.outcome >= by_status => report,
        Some(Ok(report)) => settlement(
            by_status,
            format!("{ended}; its report said {}: {}", report.outcome.as_str(), report.summary),
            None,
        ),
        Some(Err(why)) => settlement(
            by_status.max(WorkerOutcome::Failed),
            format!("{ended}; the worker report does not read: {why}"),
            Some("report"),
        ),
        None if by_status == WorkerOutcome::Completed => settlement(
            WorkerOutcome::Failed,
            format!(
                "report missing: {ended} without a worker report (a ```worker_report or ```json block holding {{\"outcome\": …}})"
            ),
            Some("report"),
        ),
        None => settlement(by_status, ended, None),
    }
}

/// The worker report that ends `output`: the last fenced block tagged `worker_report`,
/// else the last ```json block that names an `outcome`, else a JSON object with an
/// `outcome` that the output ends with. `None` when there is none; an error when one is
/// there but is not a report (`{outcome, summary, blockers}` with a known outcome).
pub fn report_of(output: &str) -> Option<Result<Settlement, String>> {
    let text = tagged_blocks(output, "worker_report")
        .pop()
        .or_else(|| {
            tagged_blocks(output, "json").into_iter().rev().find(|b| b.contains("\"outcome\""))
        })
        .or_else(|| trailing_object(output))?;
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return Some(Err(format!("not JSON: {e}"))),
    };
    Some(read_report(&value))
}

/// Reads a worker report's fields.
pub fn read_report(value: &Value) -> Result<Settlement, String> {
    let Some(obj) = value.as_object() else {
        return Err("a worker report is a JSON object".to_owned());
    };
    let outcome = match obj.get("outcome") {
        Some(Value::String(s)) => WorkerOutcome::parse(s).ok_or_else(|| {
            format!(
                "unknown outcome `{}` (one of completed, partial, blocked, failed, cancelled)",
                cut(s, 64)
            )
        })?,
        Some(_) => return Err("`outcome` must be a string".to_owned()),
        None => return Err("it has no `outcome`".to_owned()),
    };
    let summary = match obj.get("summary") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => cut(s, SUMMARY_BYTES_MAX),
        Some(_) => return Err("`summary` must be a string".to_owned()),
    };
    let blockers = match obj.get("blockers") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => {
            let mut out = Vec::new();
            for item in items.iter().take(BLOCKERS_MAX) {
                match item {
                    Value::String(s) => out.push(cut(s, BLOCKER_BYTES_MAX)),
                    _ => return Err("`blockers` must be a list of strings".to_owned()),
                }
            }
            out
        }
        Some(_) => return Err("`blockers` must be a list of strings".to_owned()),
    };
    Ok(Settlement { outcome, summary, blockers, by: None, reason: None })
}

/// The bodies of the fenced blocks whose info string is `tag`, in order.
fn tagged_blocks<'a>(text: &'a str, tag: &str) -> Vec<&'a str> {
    let opening = format!("```{tag}");
    let mut found = Vec::new();
    let mut rest = text;
    let mut offset = 0;
    while let Some(i) = rest.find(&opening) {
        let start = offset + i;
        let at_line_start = start == 0 || text[..start].ends_with('\n');
        let after = &text[start + opening.len()..];
        let Some(nl) = after.find('\n') else { break };
        let body_start = start + opening.len() + nl + 1;
        if at_line_start && after[..nl].trim().is_empty() {
            let body = &text[body_start..];
            let end = body.find("\n```").map_or(body.len(), |e| e + 1);
            found.push(&body[..end]);
        }
        offset = body_start;
        rest = &text[body_start..];
    }
    found
}

/// The JSON object the text ends with, from the last line that opens one, when it has an
/// `outcome`.
fn trailing_object(text: &str) -> Option<&str> {
    let trimmed = text.trim_end();
    if !trimmed.ends_with('}') {
        return None;
    }
    let mut starts: Vec<usize> = trimmed.match_indices('{').map(|(i, _)| i).collect();
    starts.reverse();
    for start in starts {
        if start != 0 && !trimmed[..start].ends_with('\n') {
            continue;
        }
        let candidate = &trimmed[start..];
        if serde_json::from_str::<Value>(candidate).is_ok_and(|v| v.get("outcome").is_some()) {
            return Some(candidate);
        }
    }
    None
}

/// `text` cut to `max` bytes at a character's edge.
pub(crate) fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// What a worker's child run starts from: its assignment as text, and its ids as metadata
/// (`wave_assignment_id`, `wave_task_id`, `wave_level`).
pub fn worker_input(wave: &WaveState, a: &Assignment) -> (String, Map<String, Value>) {
    let mut input = format!("# Assignment {}: {}\n", a.id, a.title);
    if let Some(d) = &a.description {
        input.push('\n');
        input.push_str(d);
        input.push('\n');
    }
    if let Some(p) = &a.priority {
        input.push_str(&format!("\nPriority: {p}\n"));
    }
    if let Some(c) = &wave.plan.context {
        input.push_str("\n## Context\n\n");
        input.push_str(c);
        input.push('\n');
    }
    input.push_str(
        "\nEnd your final answer with a worker report: a ```worker_report fenced block holding {\"outcome\": \"completed|partial|blocked|failed\", \"summary\": \"…\", \"blockers\": [\"…\"]}.\n",
    );
    let mut metadata = Map::new();
    metadata.insert("wave_assignment_id".to_owned(), Value::String(a.id.clone()));
    metadata.insert("wave_task_id".to_owned(), Value::String(a.task_id.clone()));
    metadata.insert("wave_level".to_owned(), Value::String(wave.level_id.clone()));
    (input, metadata)
}

/// Checks a wave's parallelism given by a person or a setting: 1 through 10.
pub fn check_parallel(value: i64, whence: &str) -> Result<u32, String> {
    u32::try_from(value)
        .ok()
        .filter(|v| (1..=WAVE_PARALLEL_MAX).contains(v))
        .ok_or_else(|| {
            format!("{whence}: `max_parallel` must be an integer from 1 through {WAVE_PARALLEL_MAX}, not {value}")
        })
}

/// Checks an outside worker's run id: not empty, at most [`WORKER_RUN_CHARS_MAX`]
/// characters, no control characters.
pub fn check_worker_run(id: &str) -> Result<(), String> {
    if id.trim().is_empty()
        || id.chars().count() > WORKER_RUN_CHARS_MAX
        || id.chars().any(char::is_control)
    {
        return Err(format!(
            "a worker run id is 1 to {WORKER_RUN_CHARS_MAX} characters without control characters"
        ));
    }
    Ok(())
}

/// How waves are dispatched by an engine: the configured parallelism, a one-drive
/// override, and whether manual waves are dispatched actively (`baton wave run`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaveSettings {
    /// `[waves] max_parallel` in baton.toml: for waves that set none (default 3).
    pub max_parallel: u32,
    /// This drive's override (`baton wave run --max-parallel N`); never stored.
    pub drive_max_parallel: Option<u32>,
    /// Dispatch manual waves too (the active dispatcher of `baton wave run`).
    pub active: bool,
}

impl Default for WaveSettings {
    fn default() -> Self {
        WaveSettings {
            max_parallel: WAVE_PARALLEL_DEFAULT,
            drive_max_parallel: None,
            active: false,
        }
    }
}

impl WaveSettings {
    /// The parallelism a wave runs under in this drive: the override, else the wave's own,
    /// else the configured default.
    pub fn parallel_for(&self, wave: &WaveState) -> u32 {
        self.drive_max_parallel.or(wave.plan.max_parallel).unwrap_or(self.max_parallel)
    }

    /// Writes the configured parallelism on every `wave_planned` among `events` that sets
    /// none of its own, so that the wave runs under it in every process from then on
    /// (waves planned before read the configuration in force when they are driven).
    pub fn record_on(&self, events: &mut [crate::event::NewEvent]) {
        for event in events {
            if let crate::event::EventData::WavePlanned(planned) = &mut event.data
                && planned.max_parallel.is_none()
            {
                planned.max_parallel = Some(self.max_parallel);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wave(n: usize) -> WaveState {
        let assignments = (1..=n)
            .map(|i| Assignment {
                id: format!("assign-{i:03}"),
                task_id: format!("t{i}"),
                title: format!("task {i}"),
                description: None,
                priority: None,
            })
            .collect();
        let plan = WavePlanned {
            assignments,
            context: None,
            max_parallel: Some(2),
            timeout_ms: 1000,
            worker: Some("w".to_owned()),
            command: None,
            dispatch: "auto".to_owned(),
            reports_required: true,
            order: WaveOrder::Plan,
        };
        WaveState::new("wave", 1, plan)
    }

    fn dispatch(w: &mut WaveState, id: &str) {
        let d = WaveDispatched {
            assignment_id: id.to_owned(),
            worker_run: format!("run-{id}"),
            child_run_id: None,
            by: None,
        };
        w.apply_dispatched(&d, Utc::now());
    }

    fn record(w: &mut WaveState, id: &str, outcome: WorkerOutcome) {
        w.apply_recorded(&WaveRecorded {
            assignment_id: id.to_owned(),
            outcome,
            summary: String::new(),
            blockers: Vec::new(),
            by: None,
            reason: None,
        });
    }

    #[test]
    fn the_window_admits_up_to_max_parallel_and_slides() {
        let mut w = wave(4);
        let first: Vec<String> = w.admissible(2).iter().map(|a| a.id.clone()).collect();
        assert_eq!(first, ["assign-001", "assign-002"]);
        dispatch(&mut w, "assign-001");
        dispatch(&mut w, "assign-002");
        assert_eq!(w.decide(false, 2), WaveDecision::Wait);
        assert!(w.admissible(2).is_empty());
        record(&mut w, "assign-001", WorkerOutcome::Completed);
        assert_eq!(w.decide(false, 2), WaveDecision::Dispatch);
        let next: Vec<String> = w.admissible(2).iter().map(|a| a.id.clone()).collect();
        assert_eq!(next, ["assign-003"]);
    }

    #[test]
    fn the_priority_order_admits_high_before_medium_before_low_and_the_plan_among_equals() {
        let mut w = wave(6);
        let priorities = [Some("low"), None, Some("high"), Some("medium"), Some("high"), None];
        for (a, p) in w.assignments.iter_mut().zip(priorities) {
            a.assignment.priority = p.map(str::to_owned);
        }
        let ids = |w: &WaveState, n: u32| -> Vec<String> {
            w.admissible(n).iter().map(|a| a.id.clone()).collect()
        };
        // The plan's order, recorded or not, takes them as planned.
        assert_eq!(ids(&w, 3), ["assign-001", "assign-002", "assign-003"]);
        w.plan.order = WaveOrder::Priority;
        assert_eq!(
            ids(&w, 6),
            ["assign-003", "assign-005", "assign-004", "assign-001", "assign-002", "assign-006"]
        );
        // The window slides in that order.
        dispatch(&mut w, "assign-003");
        dispatch(&mut w, "assign-005");
        assert_eq!(ids(&w, 3), ["assign-004"]);
        // The order is a recorded setting: absent from a plan written before it existed.
        let mut planned = serde_json::to_value(&w.plan).expect("a plan serializes");
        assert_eq!(planned["order"], "priority");
        planned.as_object_mut().expect("a plan is an object").remove("order");
        let old: WavePlanned = serde_json::from_value(planned).expect("an older plan reads");
        assert_eq!(old.order, WaveOrder::Plan);
    }

    #[test]
    fn a_failure_stops_admission_and_waits_for_the_flight_before_replanning() {
        let mut w = wave(4);
        dispatch(&mut w, "assign-001");
        dispatch(&mut w, "assign-002");
        record(&mut w, "assign-001", WorkerOutcome::Failed);
        assert_eq!(w.decide(false, 2), WaveDecision::Wait);
        assert!(w.admissible(2).is_empty());
        record(&mut w, "assign-002", WorkerOutcome::Completed);
        assert_eq!(w.decide(false, 2), WaveDecision::Replan);
        assert_eq!(w.counts().planned, 2);
    }

    #[test]
    fn blocked_outranks_failed_and_cancel_outranks_everything() {
        let mut w = wave(3);
        for id in ["assign-001", "assign-002", "assign-003"] {
            dispatch(&mut w, id);
        }
        record(&mut w, "assign-001", WorkerOutcome::Failed);
        record(&mut w, "assign-002", WorkerOutcome::Blocked);
        assert_eq!(w.decide(false, 3), WaveDecision::Wait);
        record(&mut w, "assign-003", WorkerOutcome::Partial);
        assert_eq!(w.decide(false, 3), WaveDecision::Escalate);
        assert_eq!(w.decide(true, 3), WaveDecision::Cancelled);
    }

    #[test]
    fn all_completed_or_partial_completes_and_a_record_counts_once() {
        let mut w = wave(2);
        dispatch(&mut w, "assign-001");
        dispatch(&mut w, "assign-002");
        record(&mut w, "assign-001", WorkerOutcome::Completed);
        record(&mut w, "assign-001", WorkerOutcome::Failed);
        record(&mut w, "assign-002", WorkerOutcome::Partial);
        assert_eq!(w.decide(false, 2), WaveDecision::Complete);
        let c = w.counts();
        assert_eq!((c.completed, c.partial, c.failed), (1, 1, 0));
    }

    #[test]
    fn a_report_is_read_from_a_tagged_block_or_a_trailing_object() {
        let fenced = "done\n```worker_report\n{\"outcome\": \"blocked\", \"summary\": \"s\", \"blockers\": [\"no key\"]}\n```\n```control\n{\"verdict\": \"PASS\"}\n```\n";
        let r = report_of(fenced).expect("a report").expect("it reads");
        assert_eq!((r.outcome, r.blockers.len()), (WorkerOutcome::Blocked, 1));
        let trailing = "All good.\n{\"outcome\": \"partial\", \"summary\": \"half\"}\n";
        assert_eq!(
            report_of(trailing).expect("a report").expect("reads").outcome,
            WorkerOutcome::Partial
        );
        assert!(report_of("no report here").is_none());
        let bad = "```worker_report\n{\"outcome\": \"finished\"}\n```";
        assert!(report_of(bad).expect("a report").is_err());
        let broken = "```worker_report\n{\"outcome\": \n```";
        assert!(report_of(broken).expect("a report").is_err());
    }

    #[test]
    fn a_report_is_also_read_from_a_json_block_that_names_an_outcome() {
        let text = "```json\n{\"files\": 2}\n```\nDone.\n```json\n{\"outcome\": \"failed\", \"summary\": \"no tests\"}\n```\n```json\n[1]\n```\n";
        let r = report_of(text).expect("a report").expect("it reads");
        assert_eq!((r.outcome, r.summary.as_str()), (WorkerOutcome::Failed, "no tests"));
        let broken = "```json\n{\"outcome\": \"completed\",\n```\n";
        assert!(report_of(broken).expect("a report").is_err());
        assert!(report_of("```json\n{\"files\": 2}\n```\n").is_none());
    }

    fn settled(status: FinalStatus, output: &str) -> ChildRunSettled {
        ChildRunSettled {
            child_run_id: "c".to_owned(),
            link: "l".to_owned(),
            status,
            aborted_reason: None,
            final_output: Some(output.to_owned()),
            totals: crate::event::Totals::default(),
            tree_totals: crate::event::Totals::default(),
        }
    }

    #[test]
    fn an_assignment_takes_the_stricter_of_its_run_status_and_its_report() {
        let report = |o: WorkerOutcome| {
            format!(
                "```worker_report\n{{\"outcome\": \"{}\", \"summary\": \"s\"}}\n```\n",
                o.as_str()
            )
        };
        let statuses = [
            (FinalStatus::Completed, WorkerOutcome::Completed),
            (FinalStatus::Failed, WorkerOutcome::Failed),
            (FinalStatus::Aborted, WorkerOutcome::Failed),
            (FinalStatus::Cancelled, WorkerOutcome::Cancelled),
        ];
        for (status, floor) in statuses {
            for said in WorkerOutcome::ALL {
                let got = settlement_of(&settled(status, &report(said)), true).outcome;
                assert_eq!(
                    got,
                    said.max(floor),
                    "{} with a report of {}",
                    status.as_str(),
                    said.as_str()
                );
            }
            let missing = settlement_of(&settled(status, "plain text"), true);
            assert_eq!(
                missing.outcome,
                if floor == WorkerOutcome::Completed { WorkerOutcome::Failed } else { floor }
            );
            let broken = settlement_of(&settled(status, "```worker_report\nnot json\n```"), true);
            assert_eq!(broken.outcome, floor.max(WorkerOutcome::Failed));
            assert_eq!(broken.reason.as_deref(), Some("report"));
        }
        let missing = settlement_of(&settled(FinalStatus::Completed, "done"), true);
        assert!(missing.summary.starts_with("report missing"), "{}", missing.summary);
        assert_eq!(missing.reason.as_deref(), Some("report"));
    }

    #[test]
    fn a_worker_aborted_by_a_result_after_its_cancel_counts_cancelled_not_failed() {
        let mut c = settled(FinalStatus::Aborted, "");
        c.final_output = None;
        c.aborted_reason = Some(crate::event::LATE_RESULT_AFTER_CANCEL.to_owned());
        for required in [true, false] {
            let s = settlement_of(&c, required);
            assert_eq!(s.outcome, WorkerOutcome::Cancelled, "reports required: {required}");
            assert!(s.summary.contains(crate::event::LATE_RESULT_AFTER_CANCEL), "{}", s.summary);
        }
        // Any other abort (a budget, a limit) still fails the assignment.
        c.aborted_reason = Some("budget_exceeded:cost".to_owned());
        assert_eq!(settlement_of(&c, true).outcome, WorkerOutcome::Failed);
    }

    #[test]
    fn a_wave_planned_before_reports_were_required_reads_as_it_did() {
        let mut c = settled(FinalStatus::Aborted, "{\"outcome\": \"completed\"}");
        c.aborted_reason = Some("cost".to_owned());
        assert_eq!(settlement_of(&c, false).outcome, WorkerOutcome::Failed);
        c.status = FinalStatus::Cancelled;
        assert_eq!(settlement_of(&c, false).outcome, WorkerOutcome::Cancelled);
        c.status = FinalStatus::Completed;
        c.final_output = Some("plain text".to_owned());
        assert_eq!(settlement_of(&c, false).outcome, WorkerOutcome::Completed);
        c.final_output = Some("```worker_report\nnot json\n```".to_owned());
        assert_eq!(settlement_of(&c, false).outcome, WorkerOutcome::Failed);
    }
}
