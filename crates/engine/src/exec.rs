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
use baton_scenario::model::{LevelKind, Uses};
use serde_json::{Map, Value};

use crate::cancel::CancelToken;
use crate::clock::Clock;
use crate::event::{
    ApprovalDecided, BudgetCaps, BudgetConsumed, CancelRequested, Event, EventData, NewEvent,
    ScenarioStarted, UserAnswered, WorkspaceInfo,
};
use crate::plan::{Step, plan};
use crate::render::Renderer;
use crate::runner::{LevelRun, Runtime};
use crate::state::{RunState, Status, fold};
use crate::store::{self, EventStore, RunRecord};
use crate::workspace::{Workspace, WorkspaceError, WorkspaceRequest, off_thread};

/// How often a running step checks the store for a cancel request.
const CANCEL_POLL: Duration = Duration::from_millis(100);

/// How often a long step writes a heartbeat.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(2);

/// How long a step may run before the events staged ahead of it are committed.
pub const FLUSH_AFTER: Duration = Duration::from_millis(50);

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
}

/// The kernel wired to a store, a runtime and a clock.
#[derive(Debug, Clone)]
pub struct Engine {
    pub store: Arc<dyn EventStore>,
    pub runtime: Arc<Runtime>,
    pub clock: Arc<dyn Clock>,
}

/// Compiled templates by scenario checksum, for the whole process: a checksum covers every
/// template a scenario reads, so its compiled form never changes.
static RENDERERS: std::sync::OnceLock<Mutex<HashMap<String, Arc<Renderer>>>> =
    std::sync::OnceLock::new();

impl Engine {
    /// An engine over a store, with a runtime and a clock.
    pub fn new(store: Arc<dyn EventStore>, runtime: Arc<Runtime>, clock: Arc<dyn Clock>) -> Self {
        Engine { store, runtime, clock }
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
        let (_, info) = self.new_workspace(scenario, &run_id).await?.unzip();
        let (record, started) =
            self.new_run(scenario, &run_id, input, metadata, model_source, info);
        self.store.create_run(&record, vec![started]).await?;
        Ok(record.run_id)
    }

    /// Starts a run and drives it to its end or a pause. The run is created in the same
    /// transaction as its first level's results (or as soon as a step takes longer than
    /// [`FLUSH_AFTER`]), so a quick run costs one transaction per level.
    ///
    /// `run_id` comes from [`Engine::new_run_id`], so a caller can show it before the run
    /// exists in the store.
    pub async fn run(
        &self,
        run_id: &str,
        scenario: &Arc<Scenario>,
        input: &str,
        metadata: Map<String, Value>,
        model_source: Option<String>,
    ) -> Result<Outcome, Error> {
        let _driving = self.store.hold(run_id).await?;
        let (workspace, info) = self.new_workspace(scenario, run_id).await?.unzip();
        let (record, started) = self.new_run(scenario, run_id, input, metadata, model_source, info);
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
        };
        self.drive_writer(&mut w, scenario, workspace).await
    }

    /// A fresh run id (UUID v7: sortable by creation time).
    pub fn new_run_id() -> String {
        uuid::Uuid::now_v7().to_string()
    }

    /// Opens a new run's workspace when its scenario edits or reads one, and snapshots it
    /// as the run's base. An engine set up without workspaces runs a scenario that only
    /// reads files (its verifiers) in the runtime's directory, which its embedder chose.
    async fn new_workspace(
        &self,
        scenario: &Scenario,
        run_id: &str,
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
            dir: setup.dir.clone(),
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
        input: &str,
        metadata: Map<String, Value>,
        model_source: Option<String>,
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
        };
        let started = NewEvent::run(EventData::ScenarioStarted(ScenarioStarted {
            scenario_id: scenario.id.clone(),
            scenario_version: scenario.version,
            checksum: scenario.checksum.clone(),
            input: input.to_owned(),
            metadata,
            budget: BudgetCaps {
                max_cost_usd: scenario.budget.max_cost_usd,
                max_tokens: scenario.budget.max_tokens,
                max_duration_s: scenario.budget.max_duration_s,
            },
            max_attempts_per_conflict: scenario.max_attempts_per_conflict,
            model_source,
            workspace,
        }));
        (record, started.at(1, now))
    }

    /// The run's state, folded from its log.
    pub async fn state(&self, run_id: &str) -> Result<RunState, Error> {
        if self.store.run(run_id).await?.is_none() {
            return Err(store::Error::NotFound(run_id.to_owned()).into());
        }
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
        let _driving = self.store.hold(run_id).await?;
        let state = self.state(run_id).await?;
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
        let mut w = Writer {
            engine: self,
            run_id,
            stored_seq: state.last_seq,
            state: Arc::new(state),
            pending: Vec::new(),
            create: None,
            has_results: false,
        };
        self.drive_writer(&mut w, scenario, workspace).await
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
        loop {
            match plan(scenario, &w.state) {
                Step::Done => {
                    w.flush().await?;
                    if let Some(workspace) = &workspace {
                        settle_workspace(Arc::clone(workspace), scenario, &w.state).await?;
                    }
                    return Ok(Outcome::Finished(w.state.status));
                }
                Step::Pause => {
                    w.flush().await?;
                    if let Some(record) = self.store.run(run_id).await?
                        && record.status != Status::Paused.as_str()
                    {
                        // Record the pause in the run list; nothing changes in the log.
                        w.write(Vec::new()).await?;
                    }
                    return Ok(Outcome::Paused);
                }
                Step::Append(events) => w.stage(events),
                Step::Run { level, attempt } => {
                    // The previous level's results, and the start of this one, become
                    // durable before this level does anything.
                    if w.has_results {
                        w.flush().await?;
                    }
                    let cancel = CancelToken::new();
                    let run = LevelRun {
                        scenario: Arc::clone(scenario),
                        renderer: Arc::clone(&renderer),
                        state: Arc::clone(&w.state),
                        runtime: Arc::clone(&self.runtime),
                        run_id: Arc::clone(&run_id_arc),
                        level,
                        attempt,
                        cancel: cancel.clone(),
                        workspace: workspace.clone(),
                    };
                    let events = w.run_watching(run, &cancel).await?;
                    if cancel.is_cancelled() {
                        // The step was cut short: keep none of it; the cancel is in the log.
                        w.reload().await?;
                        continue;
                    }
                    w.stage(events);
                    let elapsed = w.state.started_at.map_or(0, |s| {
                        u64::try_from((self.clock.now() - s).num_milliseconds().max(0)).unwrap_or(0)
                    });
                    let consumed = BudgetConsumed {
                        total_cost_usd: w.state.totals.cost_usd,
                        total_tokens: w.state.totals.tokens,
                        total_duration_ms: elapsed,
                    };
                    w.stage(vec![NewEvent::run(EventData::BudgetConsumed(consumed))]);
                    w.has_results = true;
                }
            }
        }
    }

    /// Records an approval decision, exactly once per request.
    pub async fn approve(
        &self,
        run_id: &str,
        approved: bool,
        comment: Option<String>,
        by: Option<String>,
    ) -> Result<(), Error> {
        let state = self.state(run_id).await?;
        let refuse = |message: &str| Error::Refused {
            run_id: run_id.to_owned(),
            message: message.to_owned(),
        };
        if state.status.is_final() {
            return Err(refuse(&format!(
                "the run has ended ({}); there is nothing to approve",
                state.status.as_str()
            )));
        }
        let Some(request) = &state.pending_approval else {
            return Err(refuse("the run is not waiting for an approval"));
        };
        if state.decisions.contains_key(&request.request_id) {
            return Err(refuse(&format!(
                "approval request {} was already decided",
                request.request_id
            )));
        }
        let event = NewEvent::run(EventData::ApprovalDecided(ApprovalDecided {
            request_id: request.request_id.clone(),
            approved,
            comment,
            by,
        }));
        self.append_external(run_id, &state, event).await
    }

    /// Records the answer to the pending `ask_user` request.
    pub async fn answer(&self, run_id: &str, answer: Value) -> Result<(), Error> {
        let state = self.state(run_id).await?;
        let refuse = |message: &str| Error::Refused {
            run_id: run_id.to_owned(),
            message: message.to_owned(),
        };
        if state.status.is_final() {
            return Err(refuse(&format!("the run has ended ({})", state.status.as_str())));
        }
        let Some(ask) = &state.pending_ask else {
            return Err(refuse("the run is not waiting for an answer"));
        };
        if state.answers.iter().any(|(id, _)| id == &ask.call_id) {
            return Err(refuse(&format!("question {} was already answered", ask.call_id)));
        }
        let event = NewEvent::run(EventData::UserAnswered(UserAnswered {
            call_id: ask.call_id.clone(),
            answer,
        }));
        self.append_external(run_id, &state, event).await
    }

    /// Records a cancel request; a running executor stops at its next check.
    pub async fn cancel(
        &self,
        run_id: &str,
        by: Option<String>,
        reason: Option<String>,
    ) -> Result<(), Error> {
        let state = self.state(run_id).await?;
        if state.status.is_final() {
            return Err(Error::Refused {
                run_id: run_id.to_owned(),
                message: format!("the run has already ended ({})", state.status.as_str()),
            });
        }
        if state.cancel_requested.is_some() {
            return Ok(());
        }
        let event = NewEvent::run(EventData::CancelRequested(CancelRequested { by, reason }));
        self.append_external(run_id, &state, event).await
    }

    /// Appends one event from outside the executor, retrying when the log moved.
    async fn append_external(
        &self,
        run_id: &str,
        state: &RunState,
        event: NewEvent,
    ) -> Result<(), Error> {
        let mut state = state.clone();
        for _ in 0..50 {
            let seq = state.last_seq + 1;
            let stamped = event.clone().at(seq, self.clock.now());
            let mut next = state.clone();
            next.apply(&stamped);
            let status = if next.awaiting_person() { Status::Paused } else { next.status };
            match self.store.append(run_id, seq, vec![stamped], status.as_str()).await {
                Ok(()) => return Ok(()),
                Err(store::Error::Conflict { .. }) => state = self.state(run_id).await?,
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Refused {
            run_id: run_id.to_owned(),
            message: "the log kept moving; try again".to_owned(),
        })
    }
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
    scenario: &Scenario,
    state: &RunState,
) -> Result<(), Error> {
    let Some(info) = state.workspace.clone() else { return Ok(()) };
    let head = state.workspace_head.clone().unwrap_or_else(|| info.base.clone());
    match state.status {
        Status::Cancelled if owns_workspace(scenario) => {
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
}

impl Writer<'_> {
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

    /// Commits the staged events in one transaction.
    async fn flush(&mut self) -> Result<(), Error> {
        self.has_results = false;
        if self.pending.is_empty() {
            return Ok(());
        }
        let events = std::mem::take(&mut self.pending);
        if let Some(mut record) = self.create.take() {
            record.status = self.status().as_str().to_owned();
            let count = events.len() as u64;
            self.engine.store.create_run(&record, events).await?;
            self.stored_seq = count;
            return Ok(());
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

    async fn write(&mut self, events: Vec<Event>) -> Result<(), Error> {
        let status = self.status();
        let first = self.stored_seq + 1;
        let count = events.len() as u64;
        match self.engine.store.append(self.run_id, first, events, status.as_str()).await {
            Ok(()) => {
                self.stored_seq += count;
                Ok(())
            }
            // Another writer (a cancel, an approval) got in first: drop what was staged,
            // re-read and re-plan.
            Err(store::Error::Conflict { .. }) => self.reload().await,
            Err(e) => Err(e.into()),
        }
    }

    async fn reload(&mut self) -> Result<(), Error> {
        self.pending.clear();
        self.state = Arc::new(self.engine.state(self.run_id).await?);
        self.stored_seq = self.state.last_seq;
        Ok(())
    }

    /// Runs a step; commits the staged events if it is slow, and watches the store for a
    /// cancel request while it runs.
    async fn run_watching(
        &mut self,
        run: LevelRun,
        cancel: &CancelToken,
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
            return Ok(events);
        }
        let flush_at = tokio::time::sleep(FLUSH_AFTER);
        tokio::pin!(flush_at);
        let mut flushed = false;
        let mut poll = tokio::time::interval(CANCEL_POLL);
        poll.tick().await;
        let started = tokio::time::Instant::now();
        let mut heartbeat = tokio::time::interval_at(started + HEARTBEAT_EVERY, HEARTBEAT_EVERY);
        loop {
            tokio::select! {
                events = &mut work => return Ok(events),
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
}
