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
use baton_scenario::model::{LevelKind, Uses};
use baton_scenario::schema::JsonSchema;
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use crate::cancel::CancelToken;
use crate::clock::Clock;
use crate::event::{
    ApprovalDecided, BudgetConsumed, CancelRequested, Event, EventData, NewEvent, ScenarioStarted,
    UserAnswered, WorkspaceInfo,
};
use crate::plan::{Step, plan};
use crate::render::Renderer;
use crate::runner::{LevelRun, Runtime};
use crate::state::{PendingApproval, RunState, Status, fold};
use crate::store::{self, EventStore, RunRecord};
use crate::workspace::{Workspace, WorkspaceError, WorkspaceRequest, off_thread};

/// How often a running step checks the store for a cancel request.
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

/// Why the engine could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error("run {run_id} belongs to scenario `{expected}`, not `{found}`")]
    WrongScenario { run_id: String, expected: String, found: String },
    #[error(
        "run {run_id} was started from scenario `{scenario}` with checksum {recorded}, but the loaded one has {loaded}; resume it with the scenario files it started with"
    )]
    ChecksumChanged { run_id: String, scenario: String, recorded: String, loaded: String },
    #[error("run {run_id}: {message}")]
    Refused { run_id: String, message: String },
    /// The approver's data was refused; nothing was recorded.
    #[error("run {run_id}, approval request {request_id}: {message}; nothing was recorded")]
    Data { run_id: String, request_id: String, message: String },
    #[error("template: {0}")]
    Template(String),
    #[error(transparent)]
    Workspace(#[from] WorkspaceError),
    #[error(
        "scenario `{scenario}` has tool_loop levels, which need a workspace, and this engine was set up without one; give the engine a `WorkspaceSetup`"
    )]
    NoWorkspaces { scenario: String },
}

/// Where a call to [`Engine::drive`] left the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The run ended; its status says how.
    Finished(Status),
    /// The run waits for a person.
    Paused,
    /// The run stopped without ending (`run_interrupted`: every model unavailable, or the
    /// driver was stopped); `baton resume` continues it.
    Interrupted(String),
    /// The run waits for its child runs ([`Engine::drive_tree`] drives them).
    Waiting,
}

/// The kernel wired to a store, a runtime and a clock.
#[derive(Debug, Clone)]
pub struct Engine {
    pub store: Arc<dyn EventStore>,
    pub runtime: Arc<Runtime>,
    pub clock: Arc<dyn Clock>,
    /// Stops every drive of this engine (SIGINT, SIGTERM): the step running is cut and
    /// awaited, its processes killed, and the run recorded as interrupted, to be resumed.
    pub stop: CancelToken,
    /// The scenario versions this engine has kept in its store (`keep_texts` writes each
    /// once per engine).
    kept: Arc<Mutex<std::collections::HashSet<String>>>,
    /// Where the text of model answers goes as it streams in (`baton serve`'s streams,
    /// `baton run --stream`); none: nowhere.
    pub live: Option<crate::cancel::LiveSink>,
    /// How this engine dispatches waves, in place of its jobs' settings (a drive that is a
    /// wave's active dispatcher, with its own parallelism); none: the jobs' settings.
    pub wave_drive: Option<crate::wave_drive::WaveSettings>,
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
            kept: Arc::default(),
            live: None,
            wave_drive: None,
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

    /// Opens the workspace a run recorded, to resume it.
    async fn recorded_workspace(
        &self,
        scenario: &Scenario,
        run_id: &str,
        state: &RunState,
    ) -> Result<Option<Arc<dyn Workspace>>, Error> {
        let Some(info) = &state.workspace else { return Ok(None) };
        let Some(setup) = &self.runtime.workspaces else {
            return Err(no_workspaces(scenario));
        };
        let request = WorkspaceRequest {
            run_id: run_id.to_owned(),
            dir: Some(std::path::PathBuf::from(&info.dir)),
            seed: None,
        };
        let opener = Arc::clone(&setup.opener);
        Ok(Some(off_thread(move || opener.open(&request)).await?))
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
            run_id: run_id.to_owned(),
            scenario_id: scenario.id.clone(),
            status: Status::Running.as_str().to_owned(),
            created_at: now,
            updated_at: now,
            last_seq: 0,
            parent_run_id: start.parent.as_ref().map(|p| p.parent_run_id.clone()),
            root_run_id: start.parent.as_ref().map(|p| p.root_run_id.clone()),
            idempotency_key: start.idempotency_key.clone(),
            tenant: start.tenant.clone(),
        };
        let budget =
            start.budget.unwrap_or_else(|| crate::job::caps(scenario, start.tree_max_cost_usd));
        let started = NewEvent::run(EventData::ScenarioStarted(ScenarioStarted {
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
            parent: start.parent,
            tenant: start.tenant,
        }));
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
        let workspace = self.recorded_workspace(scenario, run_id, &state).await?;
        let workspace = crate::workspace::fenced(workspace, &_driving);
        let mut w = Writer::over_stored(self, run_id, state);
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
                Step::Append(events) => w.stage(events),
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
                                .map(|c| NewEvent::run(EventData::ChildRunSettled(c)))
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
                    };
                    let events = w
                        .run_watching(run, &cancel, &over_time, time_left, settled_rx.as_mut())
                        .await?;
                    if cancel.is_cancelled() {
                        // The step was cut short: keep none of its work, only what its model
                        // calls spent; the cancel is in the log (or the driver is stopping).
                        // A run not yet in the store has no other writer: nothing to re-read.
                        let spent = spend_of(events);
                        if w.create.is_none() {
                            w.reload().await?;
                        }
                        w.stage(spent);
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

    /// Records an approval decision for the only open request, exactly once.
    pub async fn approve(
        &self,
        run_id: &str,
        approved: bool,
        comment: Option<String>,
        by: Option<String>,
    ) -> Result<ApprovalDecided, Error> {
        self.decide(run_id, Decision { request_id: None, approved, comment, by, data: None }).await
    }

    /// Records a decision on one approval request, exactly once per request.
    ///
    /// `request_id` may be left out when exactly one request is open. The approver's data is
    /// validated against the schema recorded on the request before anything is written; an
    /// approval whose decision does not satisfy the schema without data is refused, so that
    /// the level's output always matches its `output_schema` (a rejection needs no data).
    pub async fn decide(&self, run_id: &str, d: Decision) -> Result<ApprovalDecided, Error> {
        // Checked again on the log as it is before each try: of two deciders racing for one
        // request, the store takes one append per sequence number, and the loser re-reads
        // the log, finds the request decided and writes nothing.
        // The request a person decided is the one open when they decided: a retry decides
        // that request, not whichever is open by then.
        let mut chosen = d.request_id.clone();
        let decided = self
            .append_external(run_id, |state, log, now| {
                let on = Decision { request_id: chosen.clone(), ..d.clone() };
                let decided = decision(run_id, state, log, &on, now)?;
                chosen = Some(decided.request_id.clone());
                let event = NewEvent::run(EventData::ApprovalDecided(decided.clone()));
                Ok(Some((event, decided)))
            })
            .await?;
        decided.ok_or_else(|| Error::Refused {
            run_id: run_id.to_owned(),
            message: "the decision was not recorded".to_owned(),
        })
    }

    /// Records the answer to the pending `ask_user` request, exactly once.
    pub async fn answer(&self, run_id: &str, answer: Value) -> Result<(), Error> {
        self.append_external(run_id, |state, log, _| {
            let refuse = |message: String| Error::Refused { run_id: run_id.to_owned(), message };
            if state.status.is_final() {
                return Err(refuse(format!("the run has ended ({})", state.status.as_str())));
            }
            let Some(ask) = &state.pending_ask else {
                return Err(refuse("the run is not waiting for an answer".to_owned()));
            };
            if state.answers.iter().any(|(id, _)| id == &ask.call_id) {
                let at = log.iter().rev().find_map(|e| match &e.data {
                    EventData::UserAnswered(a) if a.call_id == ask.call_id => Some(e.at),
                    _ => None,
                });
                return Err(refuse(format!(
                    "question {} was already answered{}",
                    ask.call_id,
                    at.map(|t| format!(" at {}", t.to_rfc3339())).unwrap_or_default()
                )));
            }
            // A question that says what answers it takes (a JSON Schema, such as the routes a
            // disambiguation offers) gets one of those or nothing.
            if let Some(schema) = ask.question.get("schema").filter(|s| s.is_object()) {
                let problems = match JsonSchema::compile(schema.clone()) {
                    Ok(compiled) => compiled.violations(&answer),
                    Err(e) => vec![format!("the question's schema does not compile: {e}")],
                };
                if !problems.is_empty() {
                    let offered = schema
                        .get("enum")
                        .map(|e| format!("; the answers it takes: {e}"))
                        .unwrap_or_default();
                    return Err(refuse(format!(
                        "the answer does not fit question {}: {}{offered}; nothing was recorded",
                        ask.call_id,
                        problems.join("; ")
                    )));
                }
            }
            let event = NewEvent::run(EventData::UserAnswered(UserAnswered {
                call_id: ask.call_id.clone(),
                answer: answer.clone(),
            }));
            Ok(Some((event, ())))
        })
        .await?;
        Ok(())
    }

    /// Records a cancel request; a running executor stops at its next check. A cancel
    /// already requested is left as it is (nothing is written).
    pub async fn cancel(
        &self,
        run_id: &str,
        by: Option<String>,
        reason: Option<String>,
    ) -> Result<(), Error> {
        self.append_external(run_id, |state, _, _| {
            if state.status.is_final() {
                return Err(Error::Refused {
                    run_id: run_id.to_owned(),
                    message: format!("the run has already ended ({})", state.status.as_str()),
                });
            }
            if state.cancel_requested.is_some() {
                return Ok(None);
            }
            let event = NewEvent::run(EventData::CancelRequested(CancelRequested {
                by: by.clone(),
                reason: reason.clone(),
            }));
            Ok(Some((event, ())))
        })
        .await?;
        Ok(())
    }

    /// Ends a run whose cancel was requested and that no process drives (a paused run, or
    /// one whose driver died), without its scenario: the end of a cancelled run reads
    /// nothing from it (the log holds the totals and the workspace's base), so a run can be
    /// stopped after its scenario files changed or went away. The workspace goes back to
    /// its base, as when [`Engine::drive`] ends a cancelled run. A run being driven is
    /// [`store::Error::Busy`]: its driver stops at its next check.
    pub async fn end_cancelled(&self, run_id: &str) -> Result<Outcome, Error> {
        let _driving = self.store.hold(run_id).await?;
        for _ in 0..EXTERNAL_APPEND_TRIES_MAX {
            let state = self.state(run_id).await?;
            if state.cancel_requested.is_none() && !state.status.is_final() {
                return Err(Error::Refused {
                    run_id: run_id.to_owned(),
                    message: "no cancel was requested; request one with `baton cancel`".to_owned(),
                });
            }
            let mut w = Writer::over_stored(self, run_id, state);
            if !w.state.status.is_final() {
                let events = crate::plan::cancelled(&w.state);
                w.stage(events);
                w.flush().await?;
            }
            // A conflicting writer (an approval recorded meanwhile) makes the flush re-read
            // the log: try again on it.
            if !w.state.status.is_final() {
                continue;
            }
            if let Some(info) = &w.state.workspace {
                let Some(setup) = &self.runtime.workspaces else {
                    return Err(Error::NoWorkspaces { scenario: w.state.scenario_id.clone() });
                };
                let request = WorkspaceRequest {
                    run_id: run_id.to_owned(),
                    dir: Some(std::path::PathBuf::from(&info.dir)),
                    seed: None,
                };
                let opener = Arc::clone(&setup.opener);
                let workspace = off_thread(move || opener.open(&request)).await?;
                // Without the scenario, the log says whether the run edited its workspace:
                // only a tool loop does.
                let edits = w.state.levels.values().any(|l| l.kind == "tool_loop");
                settle_workspace(workspace, edits, &w.state).await?;
            }
            return Ok(Outcome::Finished(w.state.status));
        }
        Err(Error::Refused {
            run_id: run_id.to_owned(),
            message: format!(
                "gave up ending the cancelled run after {EXTERNAL_APPEND_TRIES_MAX} tries: another writer advanced the log before each; try again"
            ),
        })
    }

    /// Appends one event from outside the executor, conditional on the log it was decided
    /// on: `check` looks at the run as it is (its state and its log) and gives the event to
    /// append with what to return, nothing when there is nothing to write, or a refusal.
    /// The store appends only at the next sequence number, inside its transaction; when
    /// another writer got there first, the log is read again and `check` runs again on it,
    /// so a request decided meanwhile is refused and nothing is written.
    ///
    /// `check` is also given the time the event will be recorded with: a deadline is
    /// checked against the very time the decision carries.
    pub(crate) async fn append_external<T>(
        &self,
        run_id: &str,
        mut check: impl FnMut(
            &RunState,
            &[Event],
            chrono::DateTime<chrono::Utc>,
        ) -> Result<Option<(NewEvent, T)>, Error>,
    ) -> Result<Option<T>, Error> {
        let mut kind = "the decision";
        for tries in 0..EXTERNAL_APPEND_TRIES_MAX {
            // A run that does not exist is `NotFound` from the load (every store's
            // conformance), so the log is the one read a try makes.
            let log = self.store.load(run_id, 0).await?;
            let state = fold(&log);
            let now = self.clock.now();
            let Some((event, out)) = check(&state, &log, now)? else {
                return Ok(None);
            };
            kind = event.data.kind();
            if tries == 0 {
                decision_barrier().await;
            }
            let seq = state.last_seq + 1;
            let stamped = event.at(seq, now);
            let mut next = state;
            next.apply(&stamped);
            let status = if next.awaiting_person() { Status::Paused } else { next.status };
            match self.store.append(run_id, seq, vec![stamped], status.as_str()).await {
                Ok(()) => return Ok(Some(out)),
                Err(store::Error::Conflict { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Refused {
            run_id: run_id.to_owned(),
            message: format!(
                "gave up recording {kind} after {EXTERNAL_APPEND_TRIES_MAX} tries: another writer advanced the log before each; nothing was recorded, try again"
            ),
        })
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

/// Test hook: with `BATON_TEST_DECISION_BARRIER=DIR` in the environment, an outside
/// decision that found its request open creates `DIR/loaded.PID` and waits (at most
/// [`DECISION_BARRIER_WAIT`]) until `DIR/go` exists before it appends, so a test can show
/// that racing deciders all read the log before any of them wrote.
async fn decision_barrier() {
    let Some(dir) = std::env::var_os("BATON_TEST_DECISION_BARRIER") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let _ = std::fs::write(dir.join(format!("loaded.{}", std::process::id())), b"");
    let go = dir.join("go");
    let started = std::time::Instant::now();
    while !go.exists() && started.elapsed() < DECISION_BARRIER_WAIT {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Longest a decision waits at the test barrier of [`decision_barrier`].
const DECISION_BARRIER_WAIT: Duration = Duration::from_secs(60);

/// The decision on a request nobody decided before its deadline: a rejection, marked
/// timed out.
fn timed_out(pending: &PendingApproval) -> ApprovalDecided {
    let at = pending.request.deadline.map(|d| d.to_rfc3339()).unwrap_or_default();
    ApprovalDecided {
        request_id: pending.request.request_id.clone(),
        approved: false,
        comment: Some(format!("nobody decided before the deadline ({at})")),
        by: None,
        data: None,
        timed_out: true,
    }
}

/// ` by NAME at TIME` for a decided request, from the log.
fn decided_by(log: &[Event], request_id: &str) -> String {
    log.iter()
        .rev()
        .find_map(|e| match &e.data {
            EventData::ApprovalDecided(d) if d.request_id == request_id => Some(format!(
                " by {} at {}",
                d.by.as_deref().unwrap_or("an unnamed approver"),
                e.at.to_rfc3339()
            )),
            _ => None,
        })
        .unwrap_or_default()
}

/// The decision `d` on the run as `state` and `log` have it, or why it is refused.
fn decision(
    run_id: &str,
    state: &RunState,
    log: &[Event],
    d: &Decision,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<ApprovalDecided, Error> {
    let refuse = |message: String| Error::Refused { run_id: run_id.to_owned(), message };
    if state.status.is_final() {
        return Err(refuse(format!(
            "the run has ended ({}); there is nothing to approve",
            state.status.as_str()
        )));
    }
    if d.by.as_deref().is_some_and(|b| b.trim().is_empty()) {
        return Err(refuse("the approver (`by`) must not be empty".to_owned()));
    }
    let open: Vec<&PendingApproval> = state.open_approvals().collect();
    let pending = match &d.request_id {
        Some(id) => match state.pending_approvals.iter().find(|p| &p.request.request_id == id) {
            _ if state.decisions.contains_key(id) => {
                return Err(refuse(format!(
                    "approval request {id} was already decided{}{}",
                    decided_by(log, id),
                    open_list(&open)
                )));
            }
            Some(p) => p,
            None => {
                return Err(refuse(format!(
                    "no approval request {id}{}",
                    if open.is_empty() {
                        "; the run is not waiting for an approval".to_owned()
                    } else {
                        open_list(&open)
                    }
                )));
            }
        },
        None => match open.as_slice() {
            [] => return Err(refuse("the run is not waiting for an approval".to_owned())),
            [one] => *one,
            several => {
                return Err(refuse(format!(
                    "{} approval requests are open; name one with --request ID{}",
                    several.len(),
                    open_list(several)
                )));
            }
        },
    };
    let request_id = pending.request.request_id.clone();
    if let Some(deadline) = pending.request.deadline
        && deadline <= now
    {
        return Err(refuse(format!(
            "approval request {request_id} timed out at {} (level `{}` waits at most its timeout_s); nothing was recorded — `baton resume {run_id}` records the timeout and goes on",
            deadline.to_rfc3339(),
            pending.level_id
        )));
    }
    if let Some(data) = &d.data
        && !data.is_object()
    {
        return Err(Error::Data {
            run_id: run_id.to_owned(),
            request_id,
            message: "the approver's data must be a JSON object".to_owned(),
        });
    }
    if let Some(key) = d.data.as_ref().and_then(|v| {
        v.as_object().and_then(|m| DECISION_KEYS.iter().find(|k| m.contains_key(**k)))
    }) {
        return Err(Error::Data {
            run_id: run_id.to_owned(),
            request_id,
            message: format!(
                "the approver's data must not set `{key}`: the decision itself sets it (--reject, --comment, --by)"
            ),
        });
    }
    if d.approved || d.data.is_some() {
        let violations = decision_violations(&pending.request.schema, d);
        if !violations.is_empty() {
            let hint = if d.data.is_none() {
                "; level `{level}` declares an output_schema: give the approver's data with --data FILE.json".replace("{level}", &pending.level_id)
            } else {
                String::new()
            };
            return Err(Error::Data {
                run_id: run_id.to_owned(),
                request_id,
                message: format!(
                    "the decision does not match the output_schema of level `{}`: {}{hint}",
                    pending.level_id,
                    violations.join("; ")
                ),
            });
        }
    }
    Ok(ApprovalDecided {
        request_id,
        approved: d.approved,
        comment: d.comment.clone(),
        by: d.by.clone(),
        data: d.data.clone(),
        timed_out: false,
    })
}

/// A decision on an approval request, as a person gives it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// The request decided; may be left out when exactly one is open.
    pub request_id: Option<String>,
    pub approved: bool,
    pub comment: Option<String>,
    pub by: Option<String>,
    /// The approver's data for the level's `output_schema` (a JSON object).
    pub data: Option<Value>,
}

/// The keys of an approval level's output that the decision sets, not the approver's data.
const DECISION_KEYS: &[&str] = &["approved", "comment", "by"];

/// The level's output a decision gives (the approver's data with the decision's fields),
/// checked against the schema recorded on the request: violations by JSON pointer.
fn decision_violations(schema: &Value, d: &Decision) -> Vec<String> {
    let compiled = match JsonSchema::compile(schema.clone()) {
        Ok(c) => c,
        Err(e) => return vec![format!("the recorded schema does not compile: {e}")],
    };
    let mut output = match &d.data {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    output.insert("approved".to_owned(), Value::Bool(d.approved));
    // Absent fields are left out rather than null, as a schema's optional fields expect.
    if let Some(comment) = &d.comment {
        output.insert("comment".to_owned(), Value::String(comment.clone()));
    }
    if let Some(by) = &d.by {
        output.insert("by".to_owned(), Value::String(by.clone()));
    }
    compiled.violations(&Value::Object(output))
}

/// `; open: ID (level `L`: prompt…), …`, or nothing when no request is open.
fn open_list(open: &[&PendingApproval]) -> String {
    if open.is_empty() {
        return String::new();
    }
    let items: Vec<String> = open
        .iter()
        .map(|p| {
            format!(
                "{} (level `{}`: {})",
                p.request.request_id,
                p.level_id,
                summary(&p.request.question)
            )
        })
        .collect();
    format!("; open requests: {}", items.join(", "))
}

/// The first line of a question, cut at [`crate::limits::PROMPT_SUMMARY_CHARS`] characters.
pub fn summary(question: &str) -> String {
    let line = question.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
    let max = crate::limits::PROMPT_SUMMARY_CHARS;
    if line.chars().count() > max {
        format!("{}…", line.chars().take(max).collect::<String>())
    } else {
        line.to_owned()
    }
}

/// What opening a workspace had to repair (a stale lock removed), as run warnings.
fn workspace_notices(workspace: Option<&Arc<dyn Workspace>>) -> Vec<NewEvent> {
    let Some(workspace) = workspace else { return Vec::new() };
    workspace
        .take_notices()
        .into_iter()
        .map(|message| NewEvent::run(EventData::Warning(crate::event::Warning { message })))
        .collect()
}

/// Whether a run of `scenario` never calls a model: its levels are all waves whose
/// assignments outside agents dispatch (a standalone wave's) or programs run.
pub fn calls_no_model(scenario: &Scenario) -> bool {
    scenario.levels.iter().all(|l| {
        matches!(&l.kind, LevelKind::Wave(w)
            if w.dispatch == baton_scenario::model::WaveDispatch::Manual || w.command.is_some())
    })
}

/// Whether runs of the scenario start programs themselves (which then run in the jail): a
/// verifier that runs one (a build, a scanner, an MCP server) or a wave level's command.
pub fn starts_programs(scenario: &Scenario) -> bool {
    scenario
        .levels
        .iter()
        .flat_map(|l| &l.verifiers)
        .any(|v| crate::verifier::runs_programs(v.uses))
        || scenario
            .levels
            .iter()
            .any(|l| matches!(&l.kind, LevelKind::Wave(w) if w.command.is_some()))
}

/// Whether runs of the scenario edit a workspace of their own: it has a tool-loop level.
pub fn owns_workspace(scenario: &Scenario) -> bool {
    scenario.levels.iter().any(|l| matches!(l.kind, LevelKind::ToolLoop { .. }))
}

/// Whether runs of the scenario need a workspace: they edit one (a tool loop), or a
/// verifier runs a program or a scanner on the run's files. Such a run gets the directory
/// the user named or one of its own, recorded in `scenario_started` — never whatever
/// directory the process happens to run in.
pub fn needs_workspace(scenario: &Scenario) -> bool {
    owns_workspace(scenario)
        || scenario.levels.iter().flat_map(|l| &l.verifiers).any(|v| reads_files(v.uses))
}

/// Whether a verifier reads the workspace: every kind but the schema check and the judge,
/// which read the level's answer only.
fn reads_files(uses: Uses) -> bool {
    !matches!(uses, Uses::Schema | Uses::LlmJudge)
}

fn no_workspaces(scenario: &Scenario) -> Error {
    Error::NoWorkspaces { scenario: scenario.id.clone() }
}

/// What an ended run leaves in its workspace: a cancelled run's work is discarded back to
/// the base (only a run that edits its workspace: a run that only read it leaves the
/// files as they are, whoever changed them meanwhile); a completed run's result is named
/// by its branch, when it asked for one. Both are idempotent, so a run that ends again
/// after a crash settles the same way.
async fn settle_workspace(
    workspace: Arc<dyn Workspace>,
    edits: bool,
    state: &RunState,
) -> Result<(), Error> {
    let Some(info) = state.workspace.clone() else { return Ok(()) };
    let head = state.workspace_head.clone().unwrap_or_else(|| info.base.clone());
    match state.status {
        Status::Cancelled if edits => {
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
struct Writer<'a> {
    engine: &'a Engine,
    run_id: &'a str,
    /// Shared with the runner of the current step; copied only if still shared on write.
    state: Arc<RunState>,
    /// The last `seq` known to be in the store.
    stored_seq: u64,
    pending: Vec<Event>,
    /// The run's record, while the run is not yet in the store.
    create: Option<RunRecord>,
    /// Whether `pending` holds a runner's results.
    has_results: bool,
    /// Appends lost to another writer since the last one that went in.
    conflicts: u32,
}

impl<'a> Writer<'a> {
    /// A writer over a run already in the store, as of `state`.
    fn over_stored(engine: &'a Engine, run_id: &'a str, state: RunState) -> Self {
        Writer {
            engine,
            run_id,
            stored_seq: state.last_seq,
            state: Arc::new(state),
            pending: Vec::new(),
            create: None,
            has_results: false,
            conflicts: 0,
        }
    }

    /// Folds events into the state and stages them for the next commit.
    fn stage(&mut self, events: Vec<NewEvent>) {
        let now = self.engine.clock.now();
        let state = Arc::make_mut(&mut self.state);
        for e in events {
            let event = e.at(state.last_seq + 1, now);
            state.apply(&event);
            self.pending.push(event);
        }
    }

    /// Commits the staged events in one transaction; false when another writer got in
    /// first and the state was re-read instead (what was staged is dropped: plan again).
    async fn flush(&mut self) -> Result<bool, Error> {
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

    fn status(&self) -> Status {
        if self.state.awaiting_person() && !self.state.status.is_final() {
            Status::Paused
        } else {
            self.state.status
        }
    }

    /// Appends `events` after the stored ones; false when another writer got in first and
    /// the state was re-read instead.
    async fn write(&mut self, events: Vec<Event>) -> Result<bool, Error> {
        let status = self.status();
        let first = self.stored_seq + 1;
        let count = events.len() as u64;
        match self.engine.store.append(self.run_id, first, events, status.as_str()).await {
            Ok(()) => {
                self.stored_seq += count;
                self.conflicts = 0;
                Ok(true)
            }
            // Another writer (a cancel, an approval) got in first: drop what was staged,
            // re-read and re-plan — a bounded number of times in a row.
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
                self.reload().await?;
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Records that the run stopped without ending (unless it waits for a person, which
    /// needs no driver), commits, and reports it.
    async fn interrupt(&mut self, reason: String) -> Result<Outcome, Error> {
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

    async fn reload(&mut self) -> Result<(), Error> {
        self.pending.clear();
        self.state = Arc::new(self.engine.state(self.run_id).await?);
        self.stored_seq = self.state.last_seq;
        Ok(())
    }

    /// Runs a step; commits the staged events if it is slow, and watches the store for a
    /// cancel request while it runs.
    ///
    /// When `time_left` runs out, `over_time` is cancelled and the step awaited until it
    /// has stopped (its processes killed), so nothing it started outlives it.
    ///
    /// A fan-out's children that finish while it runs arrive on `settled`, one batch per
    /// child: each is staged and committed as it arrives (one transaction per child), so a
    /// crash or a cancel keeps them. Once the step has stopped, the batches still queued
    /// are staged ahead of its own events; after a cancel they are dropped with the step.
    async fn run_watching(
        &mut self,
        run: LevelRun,
        cancel: &CancelToken,
        over_time: &CancelToken,
        time_left: Option<Duration>,
        mut settled: Option<&mut mpsc::Receiver<Vec<NewEvent>>>,
    ) -> Result<Vec<NewEvent>, Error> {
        let work = run.run();
        tokio::pin!(work);
        // Most steps finish without waiting for anything: try once before arming timers.
        let ready = std::future::poll_fn(|cx| match work.as_mut().poll(cx) {
            std::task::Poll::Ready(events) => std::task::Poll::Ready(Some(events)),
            std::task::Poll::Pending => std::task::Poll::Ready(None),
        })
        .await;
        if let Some(events) = ready {
            self.stage_queued(settled.as_deref_mut(), cancel);
            return Ok(events);
        }
        let flush_at = tokio::time::sleep(FLUSH_AFTER);
        tokio::pin!(flush_at);
        let mut flushed = false;
        let mut poll = tokio::time::interval(CANCEL_POLL);
        poll.tick().await;
        let started = tokio::time::Instant::now();
        let mut heartbeat = tokio::time::interval_at(started + HEARTBEAT_EVERY, HEARTBEAT_EVERY);
        let out_of_time = tokio::time::sleep(time_left.unwrap_or(Duration::MAX / 4));
        tokio::pin!(out_of_time);
        loop {
            tokio::select! {
                events = &mut work => {
                    self.stage_queued(settled.as_deref_mut(), cancel);
                    return Ok(events);
                }
                batch = next_settled(settled.as_deref_mut()), if !cancel.is_cancelled() => {
                    let expected = self.stored_seq + (self.pending.len() + batch.len()) as u64;
                    self.stage(batch);
                    self.flush().await?;
                    if self.stored_seq != expected {
                        // The log moved under us and the state was re-read: stop the step.
                        cancel.cancel();
                    }
                }
                () = self.engine.stop.cancelled(), if !cancel.is_cancelled() => {
                    // The driver is stopping: cut the step; the drive records the stop.
                    cancel.cancel();
                }
                () = &mut out_of_time, if time_left.is_some() && !over_time.is_cancelled() => {
                    over_time.cancel();
                }
                () = &mut flush_at, if !flushed => {
                    flushed = true;
                    let staged = self.pending.len() as u64;
                    let expected = self.stored_seq + staged;
                    self.flush().await?;
                    if self.stored_seq != expected {
                        // The log moved under us and the state was re-read: stop the step.
                        cancel.cancel();
                    }
                }
                _ = heartbeat.tick() => {
                    let elapsed_ms = crate::clock::elapsed_ms(started.into_std());
                    let progress = cancel.progress();
                    let beat = EventData::Heartbeat(crate::event::Heartbeat {
                        elapsed_ms,
                        streamed_bytes: progress.streamed_bytes(),
                        tool_calls: progress.tool_calls(),
                    });
                    let level_id = run.scenario.levels[run.level].id.as_str();
                    let event = NewEvent::level(level_id, run.attempt, beat);
                    let expected = self.stored_seq + self.pending.len() as u64 + 1;
                    self.stage(vec![event]);
                    self.flush().await?;
                    if self.stored_seq != expected {
                        // The log moved under us and the state was re-read: stop the step.
                        cancel.cancel();
                    }
                }
                _ = poll.tick(), if self.create.is_none() => {
                    let newer = self.engine.store.load(self.run_id, self.stored_seq).await?;
                    if newer.iter().any(|e| matches!(e.data, EventData::CancelRequested(_))) {
                        cancel.cancel();
                    }
                }
            }
        }
    }

    /// Stages the children's batches still queued when a step stopped, unless it was
    /// cancelled (then the step is dropped whole).
    fn stage_queued(
        &mut self,
        settled: Option<&mut mpsc::Receiver<Vec<NewEvent>>>,
        cancel: &CancelToken,
    ) {
        let Some(settled) = settled else { return };
        while let Ok(batch) = settled.try_recv() {
            if !cancel.is_cancelled() {
                self.stage(batch);
            }
        }
    }
}

/// The channel a fan-out step sends its finished children through, with room for one
/// batch per child; none for other levels.
fn settled_channel(
    scenario: &Scenario,
    level: baton_scenario::model::LevelIdx,
) -> (Option<crate::runner::Settled>, Option<mpsc::Receiver<Vec<NewEvent>>>) {
    match &scenario.levels[level].kind {
        LevelKind::FanOut { children, .. } => {
            let (sender, receiver) = mpsc::channel(children.len().max(1));
            (Some(sender), Some(receiver))
        }
        _ => (None, None),
    }
}

/// The next batch a fan-out's child sent; never resolves without a channel or once it is
/// closed.
async fn next_settled(settled: Option<&mut mpsc::Receiver<Vec<NewEvent>>>) -> Vec<NewEvent> {
    if let Some(settled) = settled
        && let Some(batch) = settled.recv().await
    {
        return batch;
    }
    std::future::pending().await
}
