//! The executor: loop { fold → plan → perform the step → append what happened }.
//!
//! The executor keeps nothing between steps that the log does not hold: it folds the
//! events it appends into its copy of the state, and a fresh executor over the same store
//! continues any run exactly where it stopped. Cancel requests written by another process
//! reach a running step because the executor watches the store while the step runs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_scenario::Scenario;
use baton_scenario::expr::Semantics;
use serde_json::{Map, Value};

use crate::cancel::CancelToken;
use crate::clock::Clock;
use crate::event::{BudgetConsumed, Event, EventData, NewEvent, ScenarioStarted, WorkspaceInfo};
pub use crate::jobs::{calls_no_model, needs_workspace, owns_workspace, starts_programs};
pub use crate::outcome::{Error, Outcome};
use crate::plan::timed_out;
use crate::plan::{Step, plan};
use crate::render::Renderer;
use crate::runner::settled_channel;
use crate::runner::{LevelRun, Runtime};
use tokio::sync::mpsc;

mod late;
mod recorded;
mod resumed;
mod steered;
mod watch;
use crate::state::{RunState, Status, fold};
use crate::store::{self, EventStore, RunRecord};
use crate::workspace::{Workspace, WorkspaceRequest, off_thread, workspace_notices};

/// How often a running step checks the store for a cancel request, unless the store's
/// notice covers every process.
const CANCEL_POLL: Duration = Duration::from_millis(100);

/// How often a long step writes a heartbeat.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(2);

/// How long a step may run before the events staged ahead of it are committed.
pub const FLUSH_AFTER: Duration = Duration::from_millis(50);

/// Most appends in a row a driver may lose to another writer (re-reading the log after
/// each) before it gives up: a log that moves every time cannot be driven, and one whose
/// record disagrees with its events would otherwise be re-read forever.
pub const CONFLICTS_IN_A_ROW_MAX: u32 = 32;

/// Most tries to record an outside decision (approve, answer, cancel) while the log keeps
/// moving under it.
pub const EXTERNAL_APPEND_TRIES_MAX: u32 = 50;

/// The kernel wired to a store, a runtime and a clock.
#[derive(Debug, Clone)]
pub struct Engine {
    pub store: Arc<dyn EventStore>,
    pub runtime: Arc<Runtime>,
    pub clock: Arc<dyn Clock>,
    /// Stops every drive of this engine (SIGINT, SIGTERM): the step running is cut and
    /// awaited, its processes killed, and the run recorded as interrupted, to be resumed.
    pub stop: CancelToken,
    /// Lets every drive of this engine go between two steps (a worker draining): the step
    /// running finishes, what it did is committed, and the drive returns
    /// [`Outcome::Released`] before the next one starts — nothing cut, no interruption
    /// recorded, the run left `running` for another driver.
    pub drain: CancelToken,
    /// The scenario versions this engine has kept in its store (`keep_texts` writes each
    /// once per engine).
    kept: Arc<Mutex<std::collections::HashSet<String>>>,
    /// Where the text of model answers goes as it streams in (`baton serve`'s streams,
    /// `baton run --stream`); none: nowhere.
    pub live: Option<crate::cancel::LiveSink>,
    /// How this engine dispatches waves, in place of its jobs' settings (a drive that is a
    /// wave's active dispatcher, with its own parallelism); none: the jobs' settings.
    pub wave_drive: Option<crate::wave_drive::WaveSettings>,
    /// Who this engine's drives are, as `run_resumed.process` records it: `pid:PID` unless
    /// the embedder names it (Baton's own: `host:pid`, and `baton worker` and `baton
    /// serve` put their name first).
    pub process: Arc<str>,
    /// Where the answers of the child runs this engine starts come from, when not where
    /// their parent's came from (a drive given its own `--script`, such as `baton wave run
    /// --script`): recorded on each child, so that a later process answers it the same way.
    pub children_model_source: Option<String>,
    /// The steering a replay gives each call, by the replay's run id (set by
    /// [`Engine::replay`] from the recording).
    replayed_steering: Arc<Mutex<HashMap<String, Arc<crate::steering::Script>>>>,
}

/// This process as `run_resumed.process` names it unless the embedder names it: `pid:PID`,
/// worked out once.
fn default_process() -> Arc<str> {
    static PROCESS: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    Arc::clone(PROCESS.get_or_init(|| Arc::from(format!("pid:{}", std::process::id()).as_str())))
}

/// Compiled templates by scenario checksum, for the whole process: a checksum covers every
/// template a scenario reads, so its compiled form never changes.
static RENDERERS: std::sync::OnceLock<Mutex<HashMap<String, Arc<Renderer>>>> =
    std::sync::OnceLock::new();

impl Engine {
    /// An engine over a store, with a runtime and a clock.
    pub fn new(store: Arc<dyn EventStore>, runtime: Arc<Runtime>, clock: Arc<dyn Clock>) -> Self {
        Engine {
            store,
            runtime,
            clock,
            stop: CancelToken::new(),
            drain: CancelToken::new(),
            kept: Arc::default(),
            live: None,
            wave_drive: None,
            process: default_process(),
            children_model_source: None,
            replayed_steering: Arc::default(),
        }
    }

    /// The scenario's compiled templates, compiled once per process.
    fn renderer(scenario: &Scenario) -> Result<Arc<Renderer>, Error> {
        let mut cache = match RENDERERS.get_or_init(Mutex::default).lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(r) = cache.get(&scenario.checksum) {
            return Ok(Arc::clone(r));
        }
        let r = Arc::new(Renderer::new(scenario).map_err(Error::Template)?);
        cache.insert(scenario.checksum.clone(), Arc::clone(&r));
        Ok(r)
    }

    /// Creates a run of `scenario` and records `scenario_started`.
    pub async fn start(
        &self,
        scenario: &Scenario,
        input: &str,
        metadata: Map<String, Value>,
    ) -> Result<String, Error> {
        self.start_with(scenario, input, metadata, None).await
    }

    /// Like [`Engine::start`], recording where model answers come from.
    pub async fn start_with(
        &self,
        scenario: &Scenario,
        input: &str,
        metadata: Map<String, Value>,
        model_source: Option<String>,
    ) -> Result<String, Error> {
        let run_id = Self::new_run_id();
        self.keep_texts(scenario).await?;
        let (_, info) = self.new_workspace(scenario, &run_id, false).await?.unzip();
        let start = crate::job::Start {
            input: input.to_owned(),
            metadata,
            model_source,
            ..crate::job::Start::default()
        };
        let (record, started) = self.new_run(scenario, &run_id, start, info);
        self.store.create_run(&record, vec![started]).await?;
        Ok(record.run_id)
    }

    /// Starts a run and drives it to its end or a pause. The run is created in the same
    /// transaction as its first level's results (or as soon as a step takes longer than
    /// [`FLUSH_AFTER`]), so a quick run costs one transaction per level.
    ///
    /// `run_id` comes from [`Engine::new_run_id`], so a caller can show it before the run
    /// exists in the store. A run that chains to another scenario stops at
    /// [`Outcome::Waiting`]; [`Engine::run_job`] drives the whole tree.
    pub async fn run(
        &self,
        run_id: &str,
        scenario: &Arc<Scenario>,
        input: &str,
        metadata: Map<String, Value>,
        model_source: Option<String>,
    ) -> Result<Outcome, Error> {
        let start = crate::job::Start {
            input: input.to_owned(),
            metadata,
            model_source,
            ..crate::job::Start::default()
        };
        self.run_from(run_id, scenario, start).await
    }

    /// Like [`Engine::run`], from everything a new run starts with (a job's selection and
    /// tree cap, a child's link and caps).
    pub(crate) async fn run_from(
        &self,
        run_id: &str,
        scenario: &Arc<Scenario>,
        start: crate::job::Start,
    ) -> Result<Outcome, Error> {
        // A new root's id is this process's alone until the run exists; a child's is known
        // to every driver of its parent.
        let _driving = if start.parent.is_none() {
            self.store.hold_new(run_id).await?
        } else {
            self.store.hold(run_id).await?
        };
        // A child is created by the first driver that finds it missing: another may have
        // created it between that look and this hold.
        if start.parent.is_some() && self.store.run(run_id).await?.is_some() {
            drop(_driving);
            return self.drive(run_id, scenario).await;
        }
        // Under the child's hold, the parent is asked again: a parent that is being
        // cancelled, has ended, or no longer waits for this child starts nothing (the end of
        // a parent takes this hold before it records a child as never created).
        if let Some(link) = &start.parent {
            let closed = match start.parent_seq {
                Some(seq) => self.closed_since(&link.parent_run_id, run_id, seq).await?,
                None => {
                    let parent = self.state(&link.parent_run_id).await?;
                    let open = parent.open_children().any(|c| c.started.child_run_id == run_id);
                    parent.cancel_requested.is_some() || parent.status.is_final() || !open
                }
            };
            if closed {
                return Ok(Outcome::Finished(Status::Cancelled));
            }
        }
        // A child's version was kept when its parent chained to it.
        if start.parent.is_none() {
            self.keep_texts(scenario).await?;
        }
        let child = start.parent.is_some();
        let (workspace, info) = self.new_workspace(scenario, run_id, child).await?.unzip();
        let workspace = crate::workspace::fenced(workspace, &_driving);
        let mut w = self.creating(scenario, run_id, start, info, workspace.as_ref());
        self.drive_writer(&mut w, scenario, workspace).await
    }

    /// Creates a job's first run — its start, how its scenario was chosen, its workspace's
    /// notices — in one transaction, without driving it; [`Engine::drive_tree`] drives it
    /// (a server answers a start once the run is durable, and its workers drive it).
    pub async fn create_job(
        &self,
        run_id: &str,
        scenario: &Arc<Scenario>,
        start: crate::job::Start,
    ) -> Result<(), Error> {
        if start.parent.is_some() {
            return Err(Error::Refused {
                run_id: run_id.to_owned(),
                message: "a child run is created by its parent's driver".to_owned(),
            });
        }
        let _holding = self.store.hold(run_id).await?;
        self.keep_texts(scenario).await?;
        let (workspace, info) = self.new_workspace(scenario, run_id, false).await?.unzip();
        let mut w = self.creating(scenario, run_id, start, info, workspace.as_ref());
        w.flush().await?;
        Ok(())
    }

    /// A writer that creates a new run with its first events.
    fn creating<'a>(
        &'a self,
        scenario: &Scenario,
        run_id: &'a str,
        start: crate::job::Start,
        info: Option<WorkspaceInfo>,
        workspace: Option<&Arc<dyn Workspace>>,
    ) -> Writer<'a> {
        let selected = start.selected.clone();
        let replay = start.replay.clone();
        let (record, started) = self.new_run(scenario, run_id, start, info);
        let mut state = RunState::default();
        state.apply(&started);
        let mut w = Writer {
            engine: self,
            run_id,
            stored_seq: 0,
            state: Arc::new(state),
            pending: vec![started],
            create: Some(record),
            has_results: false,
            conflicts: 0,
            steering: None,
        };
        if let Some(selected) = selected {
            w.stage(vec![NewEvent::run(EventData::ScenarioSelected(selected))]);
        }
        if let Some(replay) = replay {
            w.stage(vec![NewEvent::run(EventData::RunReplayed(replay))]);
        }
        w.stage(workspace_notices(workspace));
        w
    }

    /// Whether this engine kept the texts of the version `checksum` in its store already.
    pub(crate) fn kept_here(&self, checksum: &str) -> bool {
        match self.kept.lock() {
            Ok(g) => g.contains(checksum),
            Err(poisoned) => poisoned.into_inner().contains(checksum),
        }
    }

    /// Notes that the texts of `checksum` are in this engine's store.
    pub(crate) fn mark_kept(&self, checksum: &str) {
        match self.kept.lock() {
            Ok(mut g) => g.insert(checksum.to_owned()),
            Err(poisoned) => poisoned.into_inner().insert(checksum.to_owned()),
        };
    }

    /// Whether a parent stopped wanting its child since the child's `child_run_started` at
    /// `seq`: it ended, was cancelled, or closed the child. Reads only the parent's events
    /// after `seq` (checked from that event's hash on).
    async fn closed_since(
        &self,
        parent_run_id: &str,
        child: &str,
        seq: u64,
    ) -> Result<bool, Error> {
        // Its end, if it ended, is among them: it was open when it started the child.
        let after = self.store.load(parent_run_id, seq).await?;
        Ok(after.iter().any(|e| match &e.data {
            EventData::CancelRequested(_) | EventData::ScenarioFinished(_) => true,
            EventData::ChildRunSettled(c) => c.child_run_id == child,
            EventData::ChildRunUnsettled(c) => c.child_run_id == child,
            _ => false,
        }))
    }

    /// A fresh run id (UUID v7: sortable by creation time).
    pub fn new_run_id() -> String {
        uuid::Uuid::now_v7().to_string()
    }

    /// Opens a new run's workspace when its scenario edits or reads one, and snapshots it
    /// as the run's base. An engine set up without workspaces runs a scenario that only
    /// reads files (its verifiers) in the runtime's directory, which its embedder chose.
    ///
    /// A child run always gets a directory of its own, never the one the user named for the
    /// job: a run's result (a model's answer) chooses which scenario a chain goes to, and it
    /// must not turn a job that reads the user's directory into one that edits it.
    pub(crate) async fn new_workspace(
        &self,
        scenario: &Scenario,
        run_id: &str,
        child: bool,
    ) -> Result<Option<(Arc<dyn Workspace>, WorkspaceInfo)>, Error> {
        if !needs_workspace(scenario) {
            return Ok(None);
        }
        let Some(setup) = &self.runtime.workspaces else {
            if owns_workspace(scenario) {
                return Err(no_workspaces(scenario));
            }
            return Ok(None);
        };
        let request = WorkspaceRequest {
            run_id: run_id.to_owned(),
            dir: if child { None } else { setup.dir.clone() },
            seed: scenario.workspace_seed.clone(),
        };
        let opener = Arc::clone(&setup.opener);
        let message = format!("baton: run {run_id} starts");
        let (workspace, base) = off_thread(move || {
            let workspace = opener.open(&request)?;
            let base = workspace.snapshot(&message)?;
            Ok((workspace, base))
        })
        .await?;
        let info = WorkspaceInfo {
            dir: workspace.root().display().to_string(),
            base,
            branch: setup.branch.clone(),
        };
        Ok(Some((workspace, info)))
    }

    fn new_run(
        &self,
        scenario: &Scenario,
        run_id: &str,
        start: crate::job::Start,
        workspace: Option<WorkspaceInfo>,
    ) -> (RunRecord, Event) {
        let now = self.clock.now();
        let record = RunRecord {
            parent_run_id: start.parent.as_ref().map(|p| p.parent_run_id.clone()),
            root_run_id: start.parent.as_ref().map(|p| p.root_run_id.clone()),
            idempotency: start.idempotency.clone(),
            tenant: start.tenant.clone(),
            placement: crate::store::Placement {
                home: workspace
                    .as_ref()
                    .and(self.runtime.workspaces.as_ref())
                    .and_then(|w| w.opener.home()),
                ..start.placement.clone()
            },
            ..RunRecord::new(run_id, &scenario.id, Status::Running.as_str(), now)
        };
        let budget =
            start.budget.unwrap_or_else(|| crate::job::caps(scenario, start.tree_max_cost_usd));
        let started = NewEvent::run(EventData::ScenarioStarted(Box::new(ScenarioStarted {
            scenario_id: scenario.id.clone(),
            scenario_version: scenario.version,
            checksum: scenario.checksum.clone(),
            input: start.input,
            metadata: start.metadata,
            budget,
            max_attempts_per_conflict: scenario.max_attempts_per_conflict,
            model_source: start.model_source,
            workspace,
            gate_semantics: Semantics::CURRENT,
            failures_routed: !start.failures_unrouted,
            parent: start.parent,
            tenant: start.tenant,
            process: Some(self.process.to_string()),
        })));
        (record, started.at(1, now))
    }

    /// The run's state, folded from its log.
    pub async fn state(&self, run_id: &str) -> Result<RunState, Error> {
        // A run that does not exist is `NotFound` from the load (every store's conformance).
        Ok(fold(&self.store.load(run_id, 0).await?))
    }

    /// Runs until the run ends or pauses.
    ///
    /// A level's results are staged with the events the planner derives after them (its
    /// gate decision, the next level's start, the end of the run) and committed in one
    /// transaction before the next level runs: a quick level costs one transaction. A
    /// step that runs longer than [`FLUSH_AFTER`] commits what is staged first, so
    /// watchers see it start. Either way the log is the same.
    ///
    /// One process drives a run at a time: another driver gets [`store::Error::Busy`].
    pub async fn drive(&self, run_id: &str, scenario: &Arc<Scenario>) -> Result<Outcome, Error> {
        self.drive_to_state(run_id, scenario, None).await.map(|(outcome, _)| outcome)
    }

    /// [`Engine::drive`], also giving the run's state as the drive left it. With `known`
    /// (a state this process folded from the run's checked log, as a wave's dispatcher
    /// keeps it), only the events after it are loaded — checked from its last event's
    /// hash on — and folded onto it.
    pub(crate) async fn drive_to_state(
        &self,
        run_id: &str,
        scenario: &Arc<Scenario>,
        known: Option<&RunState>,
    ) -> Result<(Outcome, Arc<RunState>), Error> {
        let _driving = self.store.hold(run_id).await?;
        let state = match known {
            Some(known) if known.last_seq > 0 => {
                let mut state = known.clone();
                for e in self.store.load(run_id, known.last_seq).await? {
                    state.apply(&e);
                }
                state
            }
            _ => self.state(run_id).await?,
        };
        if state.scenario_id != scenario.id {
            return Err(Error::WrongScenario {
                run_id: run_id.to_owned(),
                expected: state.scenario_id,
                found: scenario.id.clone(),
            });
        }
        if state.checksum != scenario.checksum {
            return Err(Error::ChecksumChanged {
                run_id: run_id.to_owned(),
                scenario: scenario.id.clone(),
                recorded: state.checksum,
                loaded: scenario.checksum.clone(),
            });
        }
        let workspace = self.recorded_workspace(run_id, &state).await?;
        let workspace = crate::workspace::fenced(workspace, &_driving);
        // A run whose level was in flight when its driver was lost (killed, its lease
        // run out) is taken over: the pause nobody could record, then who goes on.
        let lost = crate::plan::driver_lost(scenario, &state);
        let mut w = Writer::over_stored(self, run_id, state);
        if lost {
            w.stage(crate::plan::taken_over(&w.state, &self.process));
        }
        w.stage(workspace_notices(workspace.as_ref()));
        let outcome = self.drive_writer(&mut w, scenario, workspace).await?;
        Ok((outcome, Arc::clone(&w.state)))
    }

    async fn drive_writer(
        &self,
        w: &mut Writer<'_>,
        scenario: &Arc<Scenario>,
        workspace: Option<Arc<dyn Workspace>>,
    ) -> Result<Outcome, Error> {
        let renderer = Self::renderer(scenario)?;
        let run_id = w.run_id;
        let run_id_arc: Arc<str> = Arc::from(run_id);
        // A wave's workers are asked whether they ended once per drive: its dispatcher
        // drives it again whenever one does.
        let mut workers_asked = false;
        loop {
            if let Some(reason) = stopped(self, &w.state) {
                return w.interrupt(reason).await;
            }
            match plan(scenario, &w.state) {
                // A flush that lost to another writer re-read the state: plan again from it.
                Step::Done => {
                    if !w.flush().await? {
                        continue;
                    }
                    if let Some(workspace) = &workspace {
                        settle_workspace(Arc::clone(workspace), owns_workspace(scenario), &w.state)
                            .await?;
                    }
                    return Ok(Outcome::Finished(w.state.status));
                }
                Step::Pause => {
                    if !w.flush().await? {
                        continue;
                    }
                    // The first driver that sees a request past its deadline decides it as
                    // timed out, conditional on the log like any decision: of it and a
                    // late approver, one is recorded.
                    let now = self.clock.now();
                    let expired: Vec<NewEvent> = w
                        .state
                        .open_approvals()
                        .filter(|p| p.request.deadline.is_some_and(|d| d <= now))
                        .map(|p| NewEvent::run(EventData::ApprovalDecided(timed_out(p))))
                        .collect();
                    if !expired.is_empty() {
                        w.stage(expired);
                        w.flush().await?;
                        continue;
                    }
                    if let Some(record) = self.store.run(run_id).await?
                        && record.status != Status::Paused.as_str()
                        // Record the pause in the run list; nothing changes in the log.
                        && !w.write(Vec::new()).await?
                    {
                        continue;
                    }
                    return Ok(Outcome::Paused);
                }
                Step::Append(mut events) => {
                    // Draining: what the last step did is committed, and the run let go
                    // before the next level starts.
                    let starts_a_level = || {
                        events.first().is_some_and(
                            |e| matches!(&e.data, EventData::LevelStarted(s) if s.parent.is_none()),
                        )
                    };
                    if self.drain.is_cancelled() && w.create.is_none() && starts_a_level() {
                        if !w.flush().await? {
                            continue;
                        }
                        return Ok(Outcome::Released);
                    }
                    // What configuration decides about a wave is written on the
                    // `wave_planned` that plans it: every process that drives the wave
                    // later reads it from the log, whatever its own configuration says.
                    self.wave_settings().record_on(&mut events);
                    crate::plan::name_driver(&mut events, &w.state, &self.process);
                    w.stage(events);
                }
                Step::Chain { level_id, route, reason } => {
                    let events = self.chain(run_id, &w.state, &level_id, &route, reason).await?;
                    w.stage(events);
                    // No scenario to chain to was loaded: the run waits for its next driver.
                    if let Some(interrupted) = &w.state.interrupted {
                        let reason = interrupted.reason.clone();
                        if w.flush().await? {
                            return Ok(Outcome::Interrupted(reason));
                        }
                    }
                }
                Step::Children { .. } => {
                    // Children that have ended are settled here, in the same commit as
                    // what the parent does next; the flush is conditional on the log, so
                    // of two settlers one writes.
                    let ended = self.ended_children(&w.state).await?;
                    if !ended.is_empty() {
                        w.stage(
                            ended
                                .into_iter()
                                .map(|c| NewEvent::run(EventData::ChildRunSettled(Box::new(c))))
                                .collect(),
                        );
                        continue;
                    }
                    if !w.flush().await? {
                        continue;
                    }
                    if let Some(record) = self.store.run(run_id).await?
                        && record.status != Status::Waiting.as_str()
                        // Record the wait in the run list; nothing changes in the log.
                        && !w.write(Vec::new()).await?
                    {
                        continue;
                    }
                    return Ok(Outcome::Waiting);
                }
                Step::Wave { level } => {
                    // Workers that ended are settled first, in the same commit as what
                    // the wave does next (the flush is conditional on the log).
                    if !workers_asked {
                        workers_asked = true;
                        let ended = self.ended_children(&w.state).await?;
                        if !ended.is_empty() {
                            let settled = self.wave_settlements(&w.state, ended).await?;
                            w.stage(settled);
                            continue;
                        }
                    }
                    let level_id = scenario.levels[level].id.clone();
                    let dispatch = self.wave_dispatch(run_id, &w.state, &level_id).await?;
                    if !dispatch.is_empty() {
                        w.stage(dispatch);
                        continue;
                    }
                    let stored = w.stored_seq;
                    if !w.flush().await? {
                        continue;
                    }
                    // A flush that wrote recorded the status with its events.
                    if w.stored_seq == stored
                        && let Some(record) = self.store.run(run_id).await?
                        && record.status != Status::Waiting.as_str()
                        && !w.write(Vec::new()).await?
                    {
                        continue;
                    }
                    return Ok(Outcome::Waiting);
                }
                Step::Run { level, attempt } => {
                    // The previous level's results, and the start of this one, become
                    // durable before this level does anything.
                    if w.has_results && !w.flush().await? {
                        continue;
                    }
                    let cancel = CancelToken::new();
                    if let Some(live) = &self.live {
                        cancel.progress().stream_to(Arc::clone(&run_id_arc), live.clone());
                    }
                    // The step stops when the run's working time would cross
                    // `max_duration_s`; a cancel of the run stops it too.
                    let over_time = cancel.child();
                    let worked_ms = w.state.totals.duration_ms;
                    let time_left = w.state.budget.max_duration_s.map(|max| {
                        Duration::from_secs_f64(max)
                            .saturating_sub(Duration::from_millis(worked_ms))
                    });
                    let step_started = std::time::Instant::now();
                    let (settled, mut settled_rx) = settled_channel(scenario, level);
                    let (sent, mut sent_rx) = tokio::sync::mpsc::channel(1);
                    let steering = self.mailbox(run_id, &w.state);
                    w.steering = Some(steering.clone());
                    let run = LevelRun {
                        scenario: Arc::clone(scenario),
                        renderer: Arc::clone(&renderer),
                        state: Arc::clone(&w.state),
                        runtime: Arc::clone(&self.runtime),
                        run_id: Arc::clone(&run_id_arc),
                        level,
                        attempt,
                        cancel: over_time.clone(),
                        workspace: workspace.clone(),
                        deadline: time_left.map(|left| step_started + left),
                        clock: Arc::clone(&self.clock),
                        reservations: crate::reservation::Reservations::default(),
                        settled,
                        sent: Some(sent),
                        steering,
                        resumed: w.resumed_attempt(scenario, level, attempt).await?,
                    };
                    let channels =
                        StepChannels { settled: settled_rx.as_mut(), sent: &mut sent_rx };
                    let events =
                        w.run_watching(run, &cancel, &over_time, time_left, channels).await;
                    w.steering = None;
                    let events = events?;
                    if cancel.is_cancelled() {
                        // The step was cut short: keep none of its work, only what its model
                        // calls spent; the cancel is in the log (or the driver is stopping).
                        // A run not yet in the store has no other writer: nothing to re-read.
                        // A result the step reached anyway is dropped, and said so.
                        let late = Writer::late_result(
                            events.iter().map(|e| (e.level_id.as_deref(), e.attempt, &e.data)),
                        );
                        let spent = spend_of(events);
                        if w.create.is_none() {
                            w.reload().await?;
                        }
                        w.stage(spent);
                        w.stage_late_result(late);
                        continue;
                    }
                    if let Some(reason) = cancel.progress().take_interruption() {
                        // Keep what came before the step (the run's creation included) and
                        // what its model calls spent, none of its work, and leave the run to
                        // its next driver.
                        w.stage(spend_of(events));
                        let reason = reason.to_string();
                        let event = crate::runner::interrupted(
                            crate::event::CAUSE_WORKSPACE,
                            reason.clone(),
                        );
                        w.stage(vec![NewEvent::run(EventData::RunInterrupted(event))]);
                        if w.flush().await? {
                            return Ok(Outcome::Interrupted(reason));
                        }
                        continue;
                    }
                    // Duration counts the time a driver worked on the run: its steps, not
                    // the waits for a person nor the time no process drove it.
                    let step_ms = crate::clock::elapsed_ms(step_started);
                    let worked_ms = worked_ms.saturating_add(step_ms);
                    if over_time.is_cancelled() {
                        w.stage(crate::runner::kept_when_cut(events));
                        #[allow(clippy::cast_precision_loss)]
                        let exceeded = crate::event::BudgetExceeded {
                            limit_kind: "duration".to_owned(),
                            limit_value: w.state.budget.max_duration_s.unwrap_or_default(),
                            observed_value: worked_ms as f64 / 1000.0,
                            refused_before_call: false,
                        };
                        w.stage(vec![NewEvent::run(EventData::BudgetExceeded(exceeded))]);
                    } else {
                        w.stage(events);
                    }
                    let consumed = BudgetConsumed {
                        total_cost_usd: w.state.totals.cost_usd,
                        total_tokens: w.state.totals.tokens,
                        total_duration_ms: worked_ms,
                    };
                    w.stage(vec![NewEvent::run(EventData::BudgetConsumed(consumed))]);
                    w.has_results = true;
                    // A transient outage stops this driver; a later one continues the run.
                    if let Some(interrupted) = &w.state.interrupted {
                        let reason = interrupted.reason.clone();
                        if w.flush().await? {
                            return Ok(Outcome::Interrupted(reason));
                        }
                    }
                }
            }
        }
    }
}

/// Why the driver stops here without ending the run: the engine was told to stop (a
/// signal), while the run goes on.
fn stopped(engine: &Engine, state: &RunState) -> Option<String> {
    (engine.stop.is_cancelled() && !state.status.is_final() && state.status != Status::New)
        .then(|| "the driver was stopped (SIGINT or SIGTERM)".to_owned())
}

/// What a step cut short keeps: its model calls' spend (answers and cut calls), which
/// counts in the totals whatever happens to the step.
fn spend_of(events: Vec<NewEvent>) -> Vec<NewEvent> {
    events.into_iter().filter(|e| e.data.spend().is_some()).collect()
}

fn no_workspaces(scenario: &Scenario) -> Error {
    Error::NoWorkspaces { scenario: scenario.id.clone() }
}

/// What an ended run leaves in its workspace: a cancelled run's work is discarded back to
/// the base (only a run that edits its workspace: a run that only read it leaves the
/// files as they are, whoever changed them meanwhile); a completed run's result is named
/// by its branch, when it asked for one. Both are idempotent, so a run that ends again
/// after a crash settles the same way.
pub(crate) async fn settle_workspace(
    workspace: Arc<dyn Workspace>,
    edits: bool,
    state: &RunState,
) -> Result<(), Error> {
    let Some(info) = state.workspace.clone() else { return Ok(()) };
    let head = state.workspace_head.clone().unwrap_or_else(|| info.base.clone());
    match state.status {
        _ if edits && state.ended_by_cancel() => {
            off_thread(move || workspace.restore(&info.base)).await?;
        }
        Status::Completed => {
            if let Some(branch) = info.branch {
                off_thread(move || workspace.branch(&branch, &head)).await?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// The executor's view of one run: the state including staged events, and the events
/// staged but not yet committed.
pub(crate) struct Writer<'a> {
    engine: &'a Engine,
    run_id: &'a str,
    /// Shared with the runner of the current step; copied only if still shared on write.
    pub(crate) state: Arc<RunState>,
    /// The last `seq` known to be in the store.
    stored_seq: u64,
    pending: Vec<Event>,
    /// The run's record, while the run is not yet in the store.
    create: Option<RunRecord>,
    /// Whether `pending` holds a runner's results.
    has_results: bool,
    /// Appends lost to another writer since the last one that went in.
    conflicts: u32,
    /// The mailbox of the step running, which steering messages that arrive go to.
    pub(crate) steering: Option<crate::steering::Mailbox>,
}

impl<'a> Writer<'a> {
    /// A writer over a run already in the store, as of `state`.
    pub(crate) fn over_stored(engine: &'a Engine, run_id: &'a str, state: RunState) -> Self {
        Writer {
            engine,
            run_id,
            stored_seq: state.last_seq,
            state: Arc::new(state),
            pending: Vec::new(),
            create: None,
            has_results: false,
            conflicts: 0,
            steering: None,
        }
    }

    /// Folds events into the state and stages them for the next commit.
    /// Stages `events`. An interruption (`run_interrupted`) is followed by the pause it
    /// is (`run_paused`, reason `interrupted`), wherever it came from.
    pub(crate) fn stage(&mut self, events: Vec<NewEvent>) {
        let now = self.engine.clock.now();
        let state = Arc::make_mut(&mut self.state);
        for e in events {
            let paused = match &e.data {
                EventData::RunInterrupted(i) => {
                    Some(NewEvent::run(EventData::RunPaused(crate::event::RunPaused {
                        reason: crate::event::PAUSE_INTERRUPTED.to_owned(),
                        detail: Some(format!("{}: {}", i.cause, i.reason)),
                    })))
                }
                _ => None,
            };
            for e in std::iter::once(e).chain(paused) {
                let event = e.at(state.last_seq + 1, now);
                state.apply(&event);
                self.pending.push(event);
            }
        }
    }

    /// Commits the staged events in one transaction; false when another writer got in
    /// first and the state was re-read instead (what was staged is dropped: plan again).
    pub(crate) async fn flush(&mut self) -> Result<bool, Error> {
        self.has_results = false;
        if self.pending.is_empty() {
            return Ok(true);
        }
        let events = std::mem::take(&mut self.pending);
        if let Some(mut record) = self.create.take() {
            record.status = self.status().as_str().to_owned();
            let count = events.len() as u64;
            self.engine.store.create_run(&record, events).await?;
            self.stored_seq = count;
            return Ok(true);
        }
        self.write(events).await
    }

    pub(crate) fn status(&self) -> Status {
        self.state.recorded_status()
    }

    /// Appends `events` after the stored ones; false when another writer got in first and
    /// the state was re-read instead.
    pub(crate) async fn write(&mut self, mut events: Vec<Event>) -> Result<bool, Error> {
        loop {
            let status = self.status();
            let first = self.stored_seq + 1;
            let count = events.len() as u64;
            let written = events.clone();
            match self.engine.store.append(self.run_id, first, written, status.as_str()).await {
                Ok(()) => {
                    self.stored_seq += count;
                    self.conflicts = 0;
                    return Ok(true);
                }
                // Another writer (a cancel, an approval) got in first: drop what was staged,
                // re-read and re-plan — a bounded number of times in a row. Steering
                // messages alone change nothing that was staged: they are taken in and
                // the same events written after them.
                Err(store::Error::Conflict { expected, actual, .. }) => {
                    self.conflicts += 1;
                    if self.conflicts >= CONFLICTS_IN_A_ROW_MAX {
                        return Err(Error::Refused {
                            run_id: self.run_id.to_owned(),
                            message: format!(
                                "gave up driving after {CONFLICTS_IN_A_ROW_MAX} appends in a row were refused (the last wrote event {expected}, the store expected {actual}): another writer keeps advancing the log, or the run's record disagrees with its events; check it with `baton verify {}`",
                                self.run_id
                            ),
                        });
                    }
                    // A level's result that a cancel got in ahead of is dropped with the
                    // rest, and said so; what its calls spent is kept.
                    let lost = || {
                        events
                            .iter()
                            .chain(&self.pending)
                            .map(|e| (e.level_id.as_deref(), e.attempt, &e.data))
                    };
                    let late = Self::late_result(lost());
                    let spent: Vec<NewEvent> = lost()
                        .filter(|(_, _, data)| data.spend().is_some())
                        .map(|(level_id, attempt, data)| NewEvent {
                            level_id: level_id.map(str::to_owned),
                            attempt,
                            data: data.clone(),
                        })
                        .collect();
                    match self.after_steering(events).await? {
                        Some(renumbered) => events = renumbered,
                        None => {
                            self.reload().await?;
                            self.stage_after_cancel(spent, late);
                            return Ok(false);
                        }
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Records that the run stopped without ending (unless it waits for a person, which
    /// needs no driver), commits, and reports it.
    pub(crate) async fn interrupt(&mut self, reason: String) -> Result<Outcome, Error> {
        for _ in 0..CONFLICTS_IN_A_ROW_MAX {
            if self.state.status.is_final() {
                break;
            }
            if self.status() == Status::Paused {
                if self.flush().await? {
                    return Ok(Outcome::Paused);
                }
                continue;
            }
            // A run waiting for its children has nothing of its own in flight: the child
            // being driven is the one the stop interrupts.
            if self.state.open_children().next().is_some() {
                if self.flush().await? {
                    return Ok(Outcome::Interrupted(reason));
                }
                continue;
            }
            let event = crate::runner::interrupted(crate::event::CAUSE_SIGNAL, reason.clone());
            self.stage(vec![NewEvent::run(EventData::RunInterrupted(event))]);
            if self.flush().await? {
                return Ok(Outcome::Interrupted(reason));
            }
        }
        Ok(Outcome::Finished(self.state.status))
    }

    pub(crate) async fn reload(&mut self) -> Result<(), Error> {
        self.pending.clear();
        self.state = Arc::new(self.engine.state(self.run_id).await?);
        self.stored_seq = self.state.last_seq;
        Ok(())
    }
}

/// What a step sends its executor while it runs: its fan-out's settled children, and the
/// `prompt_sent` of each call that reaches out.
pub(crate) struct StepChannels<'a> {
    pub(crate) settled: Option<&'a mut mpsc::Receiver<Vec<NewEvent>>>,
    pub(crate) sent: &'a mut mpsc::Receiver<(Vec<NewEvent>, tokio::sync::oneshot::Sender<()>)>,
}
