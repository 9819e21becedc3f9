//! The projection: `RunState = fold(events)`.
//!
//! Folding is pure and total: any sequence of events gives a state, and folding a log
//! in pieces gives the same state as folding it at once (a property test holds this).
//! The state is never stored as truth; it is rebuilt from the log whenever it is needed.

use std::collections::BTreeMap;

use baton_scenario::expr::Semantics;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::event::{
    ApprovalDecided, ApprovalRequested, AskUser, BudgetCaps, BudgetExceeded, CancelRequested,
    ChildRunSettled, ChildRunStarted, ChildRunUnsettled, Event, EventData, ParentLink,
    ScenarioChained, ScenarioFinished, ScenarioSelected, Totals, VerifierFinished, WorkspaceInfo,
};

/// Where a run stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// No event yet.
    New,
    Running,
    /// Waiting for a person (an approval or an answer).
    Paused,
    /// Waiting for child runs to end: it holds no driver meanwhile (the driver of its tree
    /// drives the children, and comes back to it once they have settled).
    Waiting,
    /// Stopped without ending (`run_interrupted`: a transient outage, a signal); `baton
    /// resume` continues it. A run whose driver died is listed so too, from its lock.
    Interrupted,
    Completed,
    Aborted,
    Cancelled,
    Failed,
}

impl Status {
    /// The status as written.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::New => "new",
            Status::Running => "running",
            Status::Paused => "paused",
            Status::Waiting => "waiting",
            Status::Interrupted => "interrupted",
            Status::Completed => "completed",
            Status::Aborted => "aborted",
            Status::Cancelled => "cancelled",
            Status::Failed => "failed",
        }
    }

    /// The status written as `name`, if it is one.
    pub fn from_name(name: &str) -> Option<Status> {
        [
            Status::New,
            Status::Running,
            Status::Paused,
            Status::Waiting,
            Status::Interrupted,
            Status::Completed,
            Status::Aborted,
            Status::Cancelled,
            Status::Failed,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }

    /// Whether the run has ended.
    pub fn is_final(self) -> bool {
        matches!(self, Status::Completed | Status::Aborted | Status::Cancelled | Status::Failed)
    }
}

/// What the run does after its current level: the target of the last gate decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Next {
    Level(String),
    End,
    /// `__fail__`, reached from this level: the run ends failed.
    Fail(String),
}

/// The state of one level in a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LevelState {
    /// The level's kind, as its `level_started` said (`prompt`, `tool_loop`, …).
    pub kind: String,
    /// Attempts started so far.
    pub attempts: u32,
    /// Started and not yet finished.
    pub running: bool,
    pub ok: Option<bool>,
    pub skipped: bool,
    pub output: String,
    pub parsed: Option<Value>,
    pub verdict: Option<String>,
    pub confidence: Option<f64>,
    pub error: Option<String>,
    /// How the last finished attempt failed, when it did.
    pub error_kind: Option<crate::event::ErrorKind>,
    /// Outcomes of the current attempt's verifiers, by name.
    pub verifiers: BTreeMap<String, VerifierFinished>,
    /// Model calls made by the current attempt.
    pub calls: u32,
    /// Model calls made by every attempt of this level.
    pub calls_total: u32,
    pub cost_usd: f64,
    pub tokens: u64,
    pub duration_ms: u64,
    pub approved: Option<bool>,
    pub comment: Option<String>,
    pub parent: Option<String>,
    /// Workspace paths the last attempt's write tools changed (tool-loop levels).
    pub touched_paths: Vec<String>,
    /// The `seq` of this level's last `level_started`: a fan-out's children started during
    /// its current attempt are those started after it.
    pub started_seq: u64,
    /// Cost and tokens of the last finished attempt (`cost_usd` and `tokens` count every
    /// attempt).
    pub attempt_cost_usd: f64,
    pub attempt_tokens: u64,
    /// What the last finished attempt was told to fix: the failures of its own checks (the
    /// `feedback` or `build_feedback` it wrote), else its error; none when it passed.
    pub feedback: Option<String>,
    /// The current attempt was cut at the level's `timeout_s` (`level_timed_out`).
    pub timed_out: bool,
}

impl LevelState {
    /// Whether the last finished attempt failed — an error, a timeout, a failed check — as
    /// `level.X.failed` reads it; `None` while no attempt has finished.
    pub fn failed(&self) -> Option<bool> {
        self.ok.map(|ok| !ok || self.error_kind.is_some())
    }
}

/// An approval request whose level has not finished yet.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PendingApproval {
    /// The `human_approval` level that asked (a top-level level or a fan-out's child).
    pub level_id: String,
    pub attempt: u32,
    pub request: ApprovalRequested,
}

/// A child run as its parent's log tells it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChildRun {
    pub started: ChildRunStarted,
    /// The seq of its `child_run_started` in the parent's log.
    pub started_seq: u64,
    /// Its result, once the parent took it.
    pub settled: Option<ChildRunSettled>,
    /// The parent stopped waiting for it before it ended.
    pub unsettled: Option<ChildRunUnsettled>,
}

impl ChildRun {
    /// Whether the parent still waits for this child.
    pub fn open(&self) -> bool {
        self.settled.is_none() && self.unsettled.is_none()
    }
}

/// A run's session: what it works on and with — its input and metadata, the notes its
/// levels leave (the scratchpad), the answers people gave, its outputs and the steering
/// messages waiting. Prompts and gates read it; the orchestration state beside it in
/// [`RunState`] (status, the level in flight, what comes next, waits, counters) is what
/// the planner decides on. Both are folds of the one log.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SessionState {
    pub input: String,
    /// The input read as JSON, when it is JSON (gates read `input.<path>` from it).
    pub input_json: Option<Value>,
    pub metadata: Map<String, Value>,
    pub scratchpad: Map<String, Value>,
    /// Answers to `ask_user` requests, by call id, in order.
    pub answers: Vec<(String, Value)>,
    pub final_output: Option<String>,
    /// The output of the last top-level level that finished with one.
    pub last_output: Option<String>,
    /// Steering messages recorded and not yet delivered to a model call, oldest first.
    pub steering: Vec<crate::event::SteeringReceived>,
    /// Steering messages recorded, delivered or not (the next one is `steer-N+1`).
    pub steering_received: u32,
}

/// The state of a run, as of its last event.
#[derive(Clone, Debug, Serialize)]
pub struct RunState {
    /// The session: the data the run works on and with, apart from this orchestration
    /// state (where the run stands in its graph, what it waits for, what comes next).
    #[serde(flatten)]
    pub session: SessionState,
    pub status: Status,
    pub last_seq: u64,
    pub scenario_id: String,
    pub scenario_version: u32,
    pub checksum: String,
    pub started_at: Option<DateTime<Utc>>,
    pub budget: BudgetCaps,
    pub max_attempts_per_conflict: u32,
    pub model_source: Option<String>,
    /// The run's workspace, when its scenario edits one.
    pub workspace: Option<WorkspaceInfo>,
    /// The rule the run's gates are evaluated under, as `scenario_started` recorded it.
    pub gate_semantics: Semantics,
    /// Whether a failed attempt is routed by its level's edges, as `scenario_started`
    /// recorded it (false for runs begun before that rule).
    pub failures_routed: bool,
    /// The workspace snapshot of the last finished tool-loop level (the base before any).
    pub workspace_head: Option<String>,
    pub levels: BTreeMap<String, LevelState>,
    /// The top-level (non-child) level started and not yet finished.
    pub in_flight: Option<String>,
    /// A level that finished and whose outgoing gates have not been decided yet.
    pub route_pending: Option<String>,
    pub next: Option<Next>,
    pub verdict: Option<String>,
    pub escalate_now: bool,
    pub confidence: Option<f64>,
    /// Failures counted per conflict.
    pub tracker: BTreeMap<String, u32>,
    pub totals: Totals,
    pub budget_exceeded: Option<BudgetExceeded>,
    pub aborted_reason: Option<String>,
    pub cancel_requested: Option<CancelRequested>,
    /// A level's result dropped because the cancel came first: the cancel then ends the
    /// run `aborted` (`late_result_after_cancel`).
    pub late_result: Option<crate::event::LateResultDiscarded>,
    /// The effect ledger: the key of every write call of a user's tool started in the run,
    /// with its receipt once it has one (a `once_per_run` tool's later attempts read it).
    pub ledger: BTreeMap<String, Option<crate::event::ToolCallFinished>>,
    /// Every approval request whose level has not finished, in the order they were made
    /// (a fan-out's approval children each ask their own). Decided ones stay here until the
    /// planner closes their level.
    pub pending_approvals: Vec<PendingApproval>,
    pub decisions: BTreeMap<String, ApprovalDecided>,
    pub pending_ask: Option<AskUser>,
    pub finished: Option<ScenarioFinished>,
    /// Level executions started, all levels together.
    pub level_runs: u32,
    /// Why the run stopped without ending, while it is interrupted (`run_interrupted`).
    pub interrupted: Option<crate::event::RunInterrupted>,
    /// Times the run was resumed (`run_resumed`) after an interruption, a wait for a
    /// person or a lost driver.
    pub resumes: u32,
    /// Why the run stopped being driven, from its `run_paused` until its `run_resumed`.
    pub paused: Option<crate::event::RunPaused>,
    /// How many times a driver stopped the run (`run_interrupted`), and when it last did.
    pub interruptions: u32,
    pub interrupted_at: Option<DateTime<Utc>>,
    /// The process the log last names as driving the run: its start's, a resumption's or
    /// a takeover's (`None` in logs that name none).
    pub driver: Option<String>,
    /// Model calls sent (`prompt_sent` committed) whose answer is not in the log yet, in
    /// the levels in flight: what a takeover finds the lost driver had in flight.
    pub unanswered: Vec<crate::event::CutCall>,
    /// The top-level level started last (the level before one being started).
    pub last_level: Option<String>,
    /// Who made the last decision a wait ended with: an approver's name (`approver` when
    /// the decision names nobody, `timeout` when nobody decided in time), `user` for an
    /// answer.
    pub last_decider: Option<String>,
    /// When the run last began to wait for a person, while it waits.
    pub waiting_since: Option<DateTime<Utc>>,
    /// How the job's scenario was chosen, on a job's first run.
    pub selected: Option<ScenarioSelected>,
    /// The recorded run this one replays, when it is a replay.
    pub replay_of: Option<crate::event::RunReplayed>,
    /// The run and event this one was forked from, when it is a fork.
    pub forked_from: Option<(String, u64)>,
    /// The run that started this one, for a child run.
    pub parent: Option<ParentLink>,
    /// The last top-level level whose parsed output named `chosen_intent_route`, with the
    /// route it named (empty when it was not a string).
    pub chosen_route: Option<(String, String)>,
    /// Where the run's result sent the job, once it did.
    pub chained: Option<ScenarioChained>,
    /// The child runs started, in the order they were.
    pub children: Vec<ChildRun>,
    /// The tenant whose overrides the run's scenario was merged with.
    pub tenant: Option<String>,
    /// Each wave level's current attempt, by level id.
    pub waves: BTreeMap<String, crate::wave::WaveState>,
}

impl Default for RunState {
    fn default() -> Self {
        RunState {
            session: SessionState::default(),
            status: Status::New,
            last_seq: 0,
            scenario_id: String::new(),
            scenario_version: 0,
            checksum: String::new(),
            started_at: None,
            budget: BudgetCaps::default(),
            max_attempts_per_conflict: 3,
            model_source: None,
            workspace: None,
            gate_semantics: Semantics::CURRENT,
            failures_routed: true,
            workspace_head: None,
            levels: BTreeMap::new(),
            in_flight: None,
            route_pending: None,
            next: None,
            verdict: None,
            escalate_now: false,
            confidence: None,
            tracker: BTreeMap::new(),
            totals: Totals::default(),
            budget_exceeded: None,
            aborted_reason: None,
            cancel_requested: None,
            late_result: None,
            ledger: BTreeMap::new(),
            pending_approvals: Vec::new(),
            decisions: BTreeMap::new(),
            pending_ask: None,
            finished: None,
            level_runs: 0,
            interrupted: None,
            resumes: 0,
            paused: None,
            last_level: None,
            last_decider: None,
            waiting_since: None,
            selected: None,
            replay_of: None,
            forked_from: None,
            parent: None,
            chosen_route: None,
            chained: None,
            children: Vec::new(),
            tenant: None,
            waves: BTreeMap::new(),
            interruptions: 0,
            interrupted_at: None,
            driver: None,
            unanswered: Vec::new(),
        }
    }
}

/// Folds a whole log.
pub fn fold(events: &[Event]) -> RunState {
    let mut state = RunState::default();
    for e in events {
        state.apply(e);
    }
    state
}

impl RunState {
    /// The state of a level (default when it has not run).
    pub fn level(&self, id: &str) -> Option<&LevelState> {
        self.levels.get(id)
    }

    /// The approval requests that wait for a decision, in the order they were made.
    pub fn open_approvals(&self) -> impl Iterator<Item = &PendingApproval> {
        self.pending_approvals
            .iter()
            .filter(|p| !self.decisions.contains_key(&p.request.request_id))
    }

    /// Whether the run waits for an approval decision or an answer that has not arrived.
    pub fn awaiting_person(&self) -> bool {
        let approval = self.open_approvals().next().is_some();
        let ask = self
            .pending_ask
            .as_ref()
            .is_some_and(|a| !self.session.answers.iter().any(|(id, _)| id == &a.call_id));
        approval || ask
    }

    /// Chain hops from the job's root to this run.
    pub fn depth(&self) -> u32 {
        self.parent.as_ref().map_or(0, |p| p.depth)
    }

    /// Whether the run is at a manual wave that has not ended: it waits for outside agents.
    pub fn waits_for_outside(&self) -> bool {
        self.in_flight
            .as_ref()
            .and_then(|id| self.waves.get(id))
            .is_some_and(|w| w.plan.is_manual() && w.closed.is_none())
    }

    /// The child runs the run still waits for.
    pub fn open_children(&self) -> impl Iterator<Item = &ChildRun> {
        self.children.iter().filter(|c| c.open())
    }

    /// What the run and every child it settled spent together.
    pub fn tree_totals(&self) -> Totals {
        self.children
            .iter()
            .filter_map(|c| c.settled.as_ref())
            .fold(self.totals, |sum, c| sum.plus(c.tree_totals))
    }

    /// What may still be spent under the tree's cost cap, with what open children hold
    /// reserved; `None` without a cap.
    pub fn tree_cost_left(&self) -> Option<f64> {
        let cap = self.budget.tree_max_cost_usd?;
        let reserved: f64 =
            self.open_children().filter_map(|c| c.started.budget.tree_max_cost_usd).sum();
        Some((cap - self.tree_totals().cost_usd - reserved).max(0.0))
    }

    /// Applies one event. Total: an event that does not fit the state is absorbed.
    /// The status the run's record in the store keeps for it, a cache of the log: `paused`
    /// while it waits for a person and has not ended, else the folded status. Every writer
    /// records it with its append, and `baton verify` checks the record against it.
    pub fn recorded_status(&self) -> Status {
        if self.awaiting_person() && !self.status.is_final() { Status::Paused } else { self.status }
    }

    /// Whether the run is a wave's worker (a child a wave started for an assignment).
    pub fn is_wave_worker(&self) -> bool {
        self.parent.as_ref().is_some_and(|p| p.link.starts_with(crate::wave::LINK_PREFIX))
    }

    /// Whether the run ended by its cancel: `cancelled`, or `aborted` because a level's
    /// result came after the cancel. Either way its work is discarded.
    pub fn ended_by_cancel(&self) -> bool {
        self.status == Status::Cancelled
            || (self.status == Status::Aborted && self.late_result.is_some())
    }

    pub fn apply(&mut self, event: &Event) {
        self.apply_data(event);
        // The time waited for a person, from the events' own times: from the first event
        // that left the run waiting to the one after which nobody is waited for.
        let waiting = self.awaiting_person() && !self.status.is_final();
        match (self.waiting_since, waiting) {
            (None, true) => self.waiting_since = Some(event.at),
            (Some(since), false) => {
                let waited = (event.at - since).num_milliseconds();
                self.totals.waiting_ms += u64::try_from(waited).unwrap_or(0);
                self.waiting_since = None;
            }
            _ => {}
        }
    }

    fn apply_data(&mut self, event: &Event) {
        self.last_seq = event.seq;
        let level_id = event.level_id.as_deref().unwrap_or_default();
        match &event.data {
            EventData::ScenarioStarted(s) => {
                self.status = Status::Running;
                self.scenario_id.clone_from(&s.scenario_id);
                self.scenario_version = s.scenario_version;
                self.checksum.clone_from(&s.checksum);
                self.session.input.clone_from(&s.input);
                self.session.input_json = serde_json::from_str(&s.input).ok();
                self.session.metadata.clone_from(&s.metadata);
                self.started_at = Some(event.at);
                self.budget = s.budget;
                self.max_attempts_per_conflict = s.max_attempts_per_conflict;
                self.model_source.clone_from(&s.model_source);
                self.workspace.clone_from(&s.workspace);
                self.gate_semantics = s.gate_semantics;
                self.failures_routed = s.failures_routed;
                self.workspace_head = s.workspace.as_ref().map(|w| w.base.clone());
                self.parent.clone_from(&s.parent);
                self.tenant.clone_from(&s.tenant);
                self.driver.clone_from(&s.process);
            }
            EventData::ScenarioSelected(s) => self.selected = Some(s.clone()),
            EventData::RunReplayed(r) => self.replay_of = Some(r.clone()),
            EventData::RunForked(f) => {
                if let Some(input) = &f.input {
                    self.session.input.clone_from(input);
                    self.session.input_json = serde_json::from_str(input).ok();
                }
                for (key, value) in &f.scratchpad {
                    crate::scratchpad::apply(&mut self.session.scratchpad, key, value);
                }
                if let Some(u) = &f.scenario {
                    self.scenario_version = u.version;
                    self.checksum.clone_from(&u.checksum);
                }
                if let Some(w) = &f.workspace {
                    self.workspace = Some(w.clone());
                    self.workspace_head.clone_from(&f.restored);
                }
                self.model_source.clone_from(&f.model_source);
                // A fork answers from its own model source, whatever the run it was
                // forked from replayed: it is no replay.
                self.replay_of = None;
                self.forked_from = Some((f.from_run_id.clone(), f.at_seq));
            }
            EventData::WavePlanned(p) => {
                let attempt = event.attempt.unwrap_or(1);
                self.waves.insert(
                    level_id.to_owned(),
                    crate::wave::WaveState::new(level_id, attempt, p.clone()),
                );
                // A manual wave waits for outside agents from its start.
                if p.is_manual() {
                    self.status = Status::Waiting;
                }
            }
            EventData::WaveDispatched(d) => {
                if let Some(wave) = self.waves.get_mut(level_id) {
                    wave.apply_dispatched(d, event.at);
                }
            }
            EventData::WaveRecorded(r) => {
                if let Some(wave) = self.waves.get_mut(level_id) {
                    wave.apply_recorded(r);
                }
            }
            EventData::WaveDecided(d) => {
                if let Some(wave) = self.waves.get_mut(level_id) {
                    if d.closes && wave.closed.is_none() {
                        wave.closed = Some(d.clone());
                    }
                    wave.decided = Some(d.clone());
                }
                if d.closes
                    && self.status == Status::Waiting
                    && self.open_children().next().is_none()
                {
                    self.status = Status::Running;
                }
            }
            EventData::ScratchpadWritten(w) => {
                crate::scratchpad::apply(&mut self.session.scratchpad, &w.key, &w.value);
            }
            EventData::ScenarioChained(c) => self.chained = Some(c.clone()),
            EventData::ChildRunStarted(c) => {
                self.children.push(ChildRun {
                    started: c.as_ref().clone(),
                    started_seq: event.seq,
                    settled: None,
                    unsettled: None,
                });
                self.status = Status::Waiting;
            }
            EventData::ChildRunSettled(c) => {
                if let Some(child) =
                    self.children.iter_mut().find(|k| k.started.child_run_id == c.child_run_id)
                {
                    child.settled = Some(c.as_ref().clone());
                }
                if c.link.starts_with(crate::wave::LINK_PREFIX) {
                    for wave in self.waves.values_mut() {
                        wave.apply_child_settled(c);
                    }
                }
                if self.status == Status::Waiting
                    && self.open_children().next().is_none()
                    && !self.waits_for_outside()
                {
                    self.status = Status::Running;
                }
            }
            EventData::ChildRunUnsettled(c) => {
                if let Some(child) =
                    self.children.iter_mut().find(|k| k.started.child_run_id == c.child_run_id)
                {
                    child.unsettled = Some(c.clone());
                }
                if c.link.starts_with(crate::wave::LINK_PREFIX) {
                    for wave in self.waves.values_mut() {
                        wave.apply_child_unsettled(&c.child_run_id);
                    }
                }
                if self.status == Status::Waiting && self.open_children().next().is_none() {
                    self.status = Status::Running;
                }
            }
            EventData::LevelStarted(s) => {
                self.unanswered.retain(|c| c.level_id != level_id);
                if s.process.is_some() {
                    self.driver.clone_from(&s.process);
                }
                let level = self.levels.entry(level_id.to_owned()).or_default();
                level.attempts = event.attempt.unwrap_or(level.attempts + 1);
                level.running = true;
                level.ok = None;
                level.skipped = false;
                level.error = None;
                level.error_kind = None;
                level.timed_out = false;
                level.verifiers.clear();
                level.calls = 0;
                level.parent.clone_from(&s.parent);
                level.kind.clone_from(&s.kind);
                level.started_seq = event.seq;
                if s.kind == "wave" {
                    self.waves.remove(level_id);
                }
                if s.parent.is_none() {
                    self.in_flight = Some(level_id.to_owned());
                    self.last_level = Some(level_id.to_owned());
                    self.next = None;
                }
                self.level_runs += 1;
            }
            // An answer, a call cut short and a priced tool call all spent money; only an
            // answer is a model call.
            EventData::ToolCallStarted(s) => {
                self.ledger.entry(s.key.clone()).or_insert(None);
            }
            EventData::PromptSent(p) => self.unanswered.push(crate::event::CutCall {
                level_id: level_id.to_owned(),
                attempt: event.attempt.unwrap_or(0),
                call: p.call,
                worst_case_usd: p.worst_case_usd,
            }),
            EventData::ModelCallFailed(f) => {
                let attempt = event.attempt.unwrap_or(0);
                self.unanswered.retain(|c| {
                    !(c.level_id == level_id && c.attempt == attempt && c.call == f.call)
                });
            }
            EventData::ModelResponse(_)
            | EventData::ModelCallCut(_)
            | EventData::ToolCallFinished(_)
            | EventData::RunTakenOver(_) => {
                match &event.data {
                    EventData::ModelResponse(r) => {
                        let attempt = event.attempt.unwrap_or(0);
                        self.unanswered.retain(|c| {
                            !(c.level_id == level_id && c.attempt == attempt && c.call == r.call)
                        });
                    }
                    // A call cut short by its own driver said what it spent.
                    EventData::ModelCallCut(_) => {
                        self.unanswered.retain(|c| c.level_id != level_id);
                    }
                    EventData::RunTakenOver(t) => {
                        self.unanswered.clear();
                        self.driver = Some(t.by.clone());
                    }
                    _ => {}
                }
                if let EventData::ToolCallFinished(f) = &event.data
                    && let Some(key) = &f.key
                {
                    self.ledger.insert(key.clone(), Some(f.clone()));
                }
                let (cost_usd, tokens) = event.data.spend().unwrap_or_default();
                let level = self.levels.entry(level_id.to_owned()).or_default();
                if matches!(event.data, EventData::ModelResponse(_)) {
                    level.calls += 1;
                    level.calls_total += 1;
                }
                level.cost_usd += cost_usd;
                level.tokens += tokens;
                self.totals.cost_usd += cost_usd;
                self.totals.tokens += tokens;
            }
            EventData::RunInterrupted(i) => {
                self.status = Status::Interrupted;
                self.interrupted = Some(i.clone());
                self.interruptions += 1;
                self.interrupted_at = Some(event.at);
                // Its driver stopped its calls and recorded what they spent.
                self.unanswered.clear();
            }
            EventData::RunResumed(r) => {
                self.status = Status::Running;
                self.interrupted = None;
                self.paused = None;
                self.resumes = r.resumes;
                if r.process.is_some() {
                    self.driver.clone_from(&r.process);
                }
            }
            EventData::RunPaused(p) => self.paused = Some(p.clone()),
            // Money is spent only by model calls, each a `model_response`: a verifier's
            // cost (a judge's call) is reported here but counted there.
            EventData::VerifierFinished(v) => {
                let level = self.levels.entry(level_id.to_owned()).or_default();
                level.verifiers.insert(v.name.clone(), v.clone());
            }
            EventData::AskUser(a) => {
                self.pending_ask = Some(a.clone());
                self.status = Status::Paused;
            }
            EventData::UserAnswered(a) => {
                self.last_decider = Some("user".to_owned());
                self.session.answers.push((a.call_id.clone(), a.answer.clone()));
                if self.pending_ask.as_ref().is_some_and(|p| p.call_id == a.call_id) {
                    self.status = Status::Running;
                }
            }
            EventData::ApprovalRequested(a) => {
                self.pending_approvals.push(PendingApproval {
                    level_id: level_id.to_owned(),
                    attempt: event.attempt.unwrap_or(0),
                    request: a.clone(),
                });
                self.status = Status::Paused;
            }
            EventData::ApprovalDecided(d) => {
                let was_pending =
                    self.pending_approvals.iter().any(|p| p.request.request_id == d.request_id);
                self.last_decider = Some(if d.timed_out {
                    "timeout".to_owned()
                } else {
                    d.by.clone().unwrap_or_else(|| "approver".to_owned())
                });
                self.decisions.insert(d.request_id.clone(), d.clone());
                // The run goes on once nobody is waited for any more.
                if was_pending && self.status == Status::Paused && !self.awaiting_person() {
                    self.status = Status::Running;
                }
            }
            EventData::LevelFinished(f) => {
                self.unanswered.retain(|c| c.level_id != level_id);
                let is_top;
                {
                    let level = self.levels.entry(level_id.to_owned()).or_default();
                    level.running = false;
                    level.ok = Some(f.ok);
                    level.skipped = f.skipped;
                    level.output.clone_from(&f.output);
                    level.parsed.clone_from(&f.parsed);
                    level.verdict.clone_from(&f.verdict);
                    level.confidence = f.confidence;
                    level.error.clone_from(&f.error);
                    level.error_kind = f.error_kind;
                    level.duration_ms += f.duration_ms;
                    level.touched_paths.clone_from(&f.touched_paths);
                    level.attempt_cost_usd = f.cost_usd;
                    level.attempt_tokens = f.tokens;
                    level.feedback = ["feedback", "build_feedback"]
                        .iter()
                        .find_map(|k| f.scratchpad.get(*k).and_then(Value::as_str))
                        .map(str::to_owned)
                        .or_else(|| f.error.clone());
                    is_top = level.parent.is_none();
                    if let Some(parsed) = &f.parsed {
                        if let Some(approved) = parsed.get("approved").and_then(Value::as_bool) {
                            level.approved = Some(approved);
                        }
                        if let Some(comment) = parsed.get("comment").and_then(Value::as_str) {
                            level.comment = Some(comment.to_owned());
                        }
                    }
                }
                if !f.skipped {
                    self.totals.levels_run += 1;
                }
                if is_top {
                    if f.verdict.is_some() {
                        self.verdict.clone_from(&f.verdict);
                    }
                    if f.confidence.is_some() {
                        self.confidence = f.confidence;
                    }
                    self.in_flight = None;
                    self.route_pending = Some(level_id.to_owned());
                    if f.ok && !f.skipped && !f.output.is_empty() {
                        self.session.last_output = Some(f.output.clone());
                    }
                    if f.ok
                        && !f.skipped
                        && let Some(route) =
                            f.parsed.as_ref().and_then(|p| p.get("chosen_intent_route"))
                    {
                        let route = route.as_str().unwrap_or_default().to_owned();
                        self.chosen_route = Some((level_id.to_owned(), route));
                    }
                    self.pending_approvals.clear();
                    self.pending_ask = None;
                }
                // A level that finished asks nothing any more.
                self.pending_approvals.retain(|p| p.level_id != level_id);
                for (key, value) in &f.scratchpad {
                    if value.is_null() {
                        self.session.scratchpad.remove(key);
                    } else {
                        self.session.scratchpad.insert(key.clone(), value.clone());
                    }
                }
                if let Some(conflict) = &f.conflict {
                    let count = self.tracker.entry(conflict.clone()).or_insert(0);
                    *count += 1;
                    if *count >= self.max_attempts_per_conflict {
                        self.escalate_now = true;
                    }
                }
                if f.snapshot.is_some() {
                    self.workspace_head.clone_from(&f.snapshot);
                }
                if f.terminal && f.ok && !f.skipped {
                    self.session.final_output = Some(f.output.clone());
                }
            }
            EventData::GateDecision(g) => {
                self.route_pending = None;
                self.next = Some(match g.target.as_str() {
                    baton_scenario::model::END => Next::End,
                    baton_scenario::model::FAIL => Next::Fail(g.source.clone()),
                    _ => Next::Level(g.target.clone()),
                });
            }
            EventData::LevelTimedOut(_) => {
                self.levels.entry(level_id.to_owned()).or_default().timed_out = true;
            }
            EventData::BudgetConsumed(b) => {
                self.totals.duration_ms = b.total_duration_ms;
            }
            EventData::BudgetExceeded(b) => {
                self.budget_exceeded = Some(b.clone());
                self.aborted_reason = Some(format!("budget_exceeded:{}", b.limit_kind));
            }
            EventData::CancelRequested(c) => {
                self.cancel_requested = Some(c.clone());
            }
            EventData::LateResultDiscarded(l) => {
                self.late_result = Some(l.clone());
            }
            EventData::SteeringReceived(m) => {
                self.session.steering_received += 1;
                self.session.steering.push(m.clone());
            }
            EventData::SteeringDelivered(d) => {
                self.session.steering.retain(|m| !d.ids.contains(&m.id));
            }
            EventData::AgentHandoff(_)
            | EventData::RoutingDecision(_)
            | EventData::ModelStopped(_)
            | EventData::ProviderFailover(_)
            | EventData::ProviderRetry(_)
            | EventData::VerifierStarted(_)
            | EventData::RetryScheduled(_)
            | EventData::RetryAttempted(_)
            | EventData::Heartbeat(_)
            | EventData::ToolCall(_)
            | EventData::ToolResult(_)
            | EventData::ToolCallReissued(_)
            | EventData::ToolsListed(_)
            | EventData::FileCreated(_)
            | EventData::Warning(_) => {}
            EventData::ScenarioUpgraded(u) => {
                self.scenario_version = u.version;
                self.checksum.clone_from(&u.checksum);
            }
            EventData::ScenarioFinished(f) => {
                self.status = match f.status {
                    crate::event::FinalStatus::Completed => Status::Completed,
                    crate::event::FinalStatus::Aborted => Status::Aborted,
                    crate::event::FinalStatus::Cancelled => Status::Cancelled,
                    crate::event::FinalStatus::Failed => Status::Failed,
                };
                // The run's output as it ended: a chained job's is the chained run's.
                if f.final_output.is_some() {
                    self.session.final_output.clone_from(&f.final_output);
                }
                self.finished = Some(f.as_ref().clone());
                self.in_flight = None;
            }
        }
    }
}
