//! Use cases on runs that exist: where a run of a tree is continued from, the tree below a
//! run and what a job came to, resuming a job (on the version it started with, or moved to
//! the current one; a replay going on as it began), deciding, cancelling one and exporting
//! its cassette.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use baton_engine::cassette;
use baton_engine::exec::Error;
use baton_engine::model::{ModelProvider, ScriptedModel};
use baton_engine::pinning::Upgrade;
use baton_engine::replay::Tree;
use baton_engine::store::{EventStore, RunRecord};
use baton_engine::{Engine, Outcome, RunState, Status};
use baton_scenario::{Registry, Scenario};
use serde_json::{Value, json};

use crate::engines::{
    WaveDrive, engine, jobs, probe_engine, redactor, reloading_jobs, workspace_setup,
};
use crate::jail::jail;
use crate::place::{Place, open_existing_store};
use crate::scenarios::{find_scenario, registry, run_scenario};

/// Where a run of a tree is continued from: its highest ancestor that has not ended (the
/// job's first run, unless that ended without waiting for this one), itself when none.
pub async fn root_of(store: &dyn EventStore, run_id: &str) -> Result<String, Error> {
    let mut top = run_id.to_owned();
    // Bounded by the chain's depth; the bound guards against a damaged record.
    for _ in 0..=baton_engine::limits::CHAIN_DEPTH_MAX + 1 {
        let Some(record) = store.run(&top).await? else {
            return Err(Error::Store(baton_engine::store::Error::NotFound(top)));
        };
        let Some(parent) = record.parent_run_id else { break };
        match store.run(&parent).await? {
            Some(p) if !Status::from_name(&p.status).is_some_and(Status::is_final) => top = parent,
            _ => break,
        }
    }
    Ok(top)
}

/// A run and every run below it that exists, parents before children, with their depth
/// under `root`; with `recorded`, also the children a parent recorded that do not exist
/// yet (a follower waits for them).
pub async fn tree_of(
    store: &dyn EventStore,
    root: &str,
    recorded: bool,
) -> Result<Vec<(String, usize)>, Error> {
    let mut out = Vec::new();
    let mut pending = vec![(root.to_owned(), 0usize)];
    while let Some((id, depth)) = pending.pop() {
        if store.run(&id).await?.is_none() {
            if recorded && depth > 0 {
                out.push((id, depth));
            }
            continue;
        }
        let state = baton_engine::fold(&store.load(&id, 0).await?);
        for child in state.children.iter().rev() {
            pending.push((child.started.child_run_id.clone(), depth + 1));
        }
        out.push((id, depth));
    }
    Ok(out)
}

/// A job ready to be driven on from its root.
pub struct Resumed {
    /// An engine with the model the job recorded (or a replay's recording), its jobs
    /// reloading the scenarios directory with the tenant's overrides.
    pub engine: Engine,
    /// The run the job is driven from, and its scenario version.
    pub root: String,
    pub root_scenario: Arc<Scenario>,
    /// The scenario of the run asked for.
    pub scenario: Arc<Scenario>,
    /// What `--upgrade` did, when asked.
    pub upgrade: Option<Upgrade>,
    /// A replay's recording, whose decisions are made again as the job reaches them.
    pub replay: Option<Box<Tree>>,
    /// Said before the job goes on: the jail is off.
    pub jail_warning: Option<String>,
}

impl std::fmt::Debug for Resumed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resumed").field("root", &self.root).finish_non_exhaustive()
    }
}

/// Readies the job of `run_id` to go on: on the scenario version the run started with (or
/// was last moved to), which the store keeps; with `upgrade`, moved to the scenario's
/// current version first. A run of a tree continues from its job's first run, so that every
/// parent takes the result of the run below it.
pub async fn resume(
    place: &Place,
    run_id: &str,
    script: Option<&Path>,
    upgrade: bool,
    waves: WaveDrive,
) -> anyhow::Result<Resumed> {
    let store = open_existing_store(place).await?;
    let probe = probe_engine(place, &store, &Registry::default());
    let state = probe.state(run_id).await.with_context(|| format!("cannot read run {run_id}"))?;
    let (scenario, registry, upgraded) = if upgrade {
        let registry = registry(place)?;
        let current = find_scenario(&registry, &state.scenario_id, place)?;
        let upgraded = probe.upgrade(run_id, &current).await?;
        (current, registry, Some(upgraded))
    } else {
        let scenario = run_scenario(place, &probe, &state, run_id).await?;
        // The catalog (what a classifier level may route to) and the scenarios a chain may
        // go to are the directory's when it loads; the run's own scenario never depends on it.
        let mut registry =
            Registry::load(&[&place.scenarios]).map(|l| l.registry).unwrap_or_default();
        if let Some(tenant) = &state.tenant {
            registry = crate::scenarios::merged(store.as_ref(), registry, tenant).await?;
        }
        (scenario, registry, None)
    };
    let jail_warning = crate::jail::check_jail(place, &registry, &scenario)?;
    let root = root_of(store.as_ref(), run_id).await?;
    let (root_scenario, root_state) = if root == run_id {
        (Arc::clone(&scenario), state)
    } else {
        let root_state = probe.state(&root).await?;
        (run_scenario(place, &probe, &root_state, &root).await?, root_state)
    };
    let registry = Arc::new(registry);
    // A replay goes on as it began: answers from its recording, verifiers as its strategy
    // says, children settled in the recording's order.
    let mut replay = None;
    let engine = if let Some(replayed) = &root_state.replay_of {
        if script.is_some() {
            bail!(
                "run {root} replays run {}: it takes its answers from that recording, not from --script",
                replayed.of_run_id
            );
        }
        let recorded = crate::replay::recording_of(place, &probe, replayed).await?;
        let trusted = (replayed.strategy == baton_engine::replay::Strategy::TrustValidation)
            .then(|| Arc::new(recorded.trusted(&root)));
        let jobs = jobs(place, Arc::clone(&registry), None, waves)?
            .settling_as(Arc::new(recorded.settle_order(&root)));
        let cassette = recorded.cassette();
        let tools = crate::engines::recorded_tools(&cassette);
        replay = Some(Box::new(recorded));
        engine(
            store,
            Arc::new(cassette::Replayer::new(cassette)),
            &registry,
            workspace_setup(place, None, None),
            redactor(place),
            &jail(place),
            Some(Arc::new(jobs)),
            trusted,
            Some(tools),
        )
    } else {
        // A job whose root calls no model (a wave) answers its workers as they recorded:
        // the script a `baton wave run --script` gave them.
        let source = match &root_state.model_source {
            Some(source) => Some(source.clone()),
            None if baton_engine::exec::calls_no_model(&root_scenario) => {
                workers_model_source(&probe, &root_state).await?
            }
            None => None,
        };
        let (model, children_source) =
            match crate::models::model_for(source.as_deref(), script, place.config.as_deref()) {
                // A run of manual waves calls no model; `baton wave run` needs one for its
                // workers.
                Err(_) if baton_engine::exec::calls_no_model(&root_scenario) && !waves.active => {
                    (Arc::new(ScriptedModel::default()) as Arc<dyn ModelProvider>, None)
                }
                other => other?,
            };
        // Its tools answer as its model does: from its cassette when it replays one, unless
        // a script or configuration given now answers instead.
        let answering = children_source.as_ref().or(source.as_ref());
        let tools = crate::engines::tools_for(place, answering.map(String::as_str), None)?;
        let jobs = reloading_jobs(
            place,
            store.as_ref(),
            Arc::clone(&registry),
            None,
            root_state.tenant.as_deref(),
            waves,
        )
        .await?;
        let mut engine = engine(
            store,
            model,
            &registry,
            workspace_setup(place, None, None),
            redactor(place),
            &jail(place),
            Some(jobs),
            None,
            Some(tools),
        );
        engine.children_model_source = children_source;
        engine
    };
    Ok(Resumed { engine, root, root_scenario, scenario, upgrade: upgraded, replay, jail_warning })
}

/// Where the answers of a model-less root's open children come from, as the first of them
/// that recorded one says (the workers of a wave `baton wave run --script` dispatched).
async fn workers_model_source(
    probe: &Engine,
    root: &baton_engine::RunState,
) -> anyhow::Result<Option<String>> {
    for child in root.open_children() {
        let id = &child.started.child_run_id;
        match probe.state(id).await {
            Ok(state) if state.model_source.is_some() => return Ok(state.model_source),
            // A worker recorded but not yet created has nothing to say.
            Ok(_)
            | Err(baton_engine::exec::Error::Store(baton_engine::store::Error::NotFound(_))) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

/// How a cancel came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cancelled {
    /// The run and every run below it that nobody drives have ended `cancelled`.
    Ended,
    /// A process drives the run: it stops at its next check.
    Requested,
}

/// Cancels the run of `record` and every run below it that has not ended, recorded as
/// `by` with `reason`, and ends each one nobody drives; a child's parent takes its result
/// (whoever drives the parent continues it). Needs no scenario: the end of a cancelled run
/// reads nothing from it, so a broken or changed scenarios directory never keeps a run from
/// being stopped.
pub async fn cancel(
    engine: &Engine,
    record: &RunRecord,
    by: Option<String>,
    reason: Option<String>,
) -> Result<Cancelled, Error> {
    engine.cancel_tree(&record.run_id, by, reason).await?;
    let cancelled = match engine.end_cancelled_tree(&record.run_id).await {
        Ok(_) => Cancelled::Ended,
        Err(Error::Store(baton_engine::store::Error::Busy(_))) => Cancelled::Requested,
        Err(e) => return Err(e),
    };
    if let Some(parent) = &record.parent_run_id {
        engine.settle_children(parent).await?;
    }
    Ok(cancelled)
}

/// A job as it stands when it was started again with its idempotency key: an engine over
/// its store (that loads no scenario) and how its run of `run_id` is: ended, paused,
/// waiting, or interrupted — driven by another process or by none.
pub async fn standing(
    place: &Place,
    store: Arc<dyn EventStore>,
    run_id: &str,
) -> anyhow::Result<(Engine, Outcome)> {
    let engine = probe_engine(place, &store, &Registry::default());
    let state = engine.state(run_id).await?;
    let outcome = if state.status.is_final() {
        Outcome::Finished(state.status)
    } else if state.status == Status::Paused {
        Outcome::Paused
    } else if state.status == Status::Waiting {
        Outcome::Waiting
    } else if store.is_held(run_id).await? {
        Outcome::Interrupted("it is being driven by another process".to_owned())
    } else {
        Outcome::Interrupted("no process drives it".to_owned())
    };
    Ok((engine, outcome))
}

/// A run and every run below it, each with its depth and state.
#[derive(Debug)]
pub struct JobTree {
    /// The state of the run the tree is read from.
    pub state: RunState,
    /// Every run of the tree, itself first, parents before children.
    pub runs: Vec<(String, usize, RunState)>,
}

/// The tree of runs below `run_id`, with their states.
pub async fn job_tree(engine: &Engine, run_id: &str) -> Result<JobTree, Error> {
    let state = engine.state(run_id).await?;
    let mut runs = Vec::new();
    for (id, depth) in tree_of(engine.store.as_ref(), run_id, false).await? {
        let s = if id == run_id { state.clone() } else { engine.state(&id).await? };
        runs.push((id, depth, s));
    }
    Ok(JobTree { state, runs })
}

/// What a job came to, as JSON (`baton run --json` and every command that drives a job):
/// its result, totals and what it waits for, and each run of its tree.
pub fn result_json(run_id: &str, state: &RunState, runs: &[(String, usize, RunState)]) -> Value {
    let tree: Vec<Value> = runs
        .iter()
        .map(|(id, depth, s)| {
            json!({
                "run_id": id,
                "depth": depth,
                "scenario_id": s.scenario_id,
                "status": s.status.as_str(),
                "pending_approvals": open_approvals(s),
                "pending_question": s.pending_ask,
            })
        })
        .collect();
    json!({
        "run_id": run_id,
        "scenario_id": state.scenario_id,
        "status": state.status.as_str(),
        "final_output": state.session.final_output,
        "aborted_reason": state.finished.as_ref().and_then(|f| f.aborted_reason.clone()),
        "totals": state.totals,
        "tree_totals": state.tree_totals(),
        "checksum": state.checksum,
        "selected": state.selected,
        "pending_approvals": open_approvals(state),
        "pending_question": state.pending_ask,
        "tree": tree,
    })
}

/// The approval requests a run waits for, as JSON.
pub fn open_approvals(state: &baton_engine::RunState) -> Value {
    state
        .open_approvals()
        .map(|p| {
            json!({
                "request_id": p.request.request_id,
                "level_id": p.level_id,
                "approver_role": p.request.approver_role,
                "question": p.request.question,
                "schema": p.request.schema,
            })
        })
        .collect()
}

/// An engine that records decisions and answers: it needs no scenario, so it works from a
/// directory where the scenarios do not load.
pub async fn decision_engine(place: &Place) -> anyhow::Result<Engine> {
    let store = open_existing_store(place).await?;
    Ok(probe_engine(place, &store, &Registry::default()))
}

/// Largest approver's data file (`approve --data`), in bytes.
pub const DATA_BYTES_MAX: u64 = 1024 * 1024;

/// An approver's decision on a request a run waits for (`baton approve`).
#[derive(Debug)]
pub struct Decision {
    /// The request (none: the one the run waits for).
    pub request: Option<String>,
    pub reject: bool,
    pub comment: Option<String>,
    pub by: Option<String>,
    /// A file with the approver's data for the level's `output_schema`.
    pub data: Option<std::path::PathBuf>,
}

/// Records `decision` on run `run_id` (no scenario loaded); the decision as recorded.
pub async fn approve(
    place: &Place,
    run_id: &str,
    decision: Decision,
) -> anyhow::Result<baton_engine::event::ApprovalDecided> {
    let data = decision.data.as_deref().map(read_data).transpose()?;
    let engine = decision_engine(place).await?;
    let decision = baton_engine::Decision {
        request_id: decision.request,
        approved: !decision.reject,
        comment: decision.comment,
        by: decision.by,
        data,
    };
    Ok(engine.decide(run_id, decision).await?)
}

/// Reads the approver's data: a regular file of at most [`DATA_BYTES_MAX`] bytes holding JSON.
fn read_data(path: &Path) -> Result<Value, crate::error::Error> {
    let shown = path.display();
    let bytes = baton_scenario::capped::read_bytes(path, DATA_BYTES_MAX)
        .map_err(|e| crate::error::Error::invalid(format!("--data: {e}")))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        crate::error::Error::invalid(format!(
            "--data {shown}:{}:{}: not JSON: {e}",
            e.line(),
            e.column()
        ))
    })
}

/// Records `answer` (JSON) to the question run `run_id` waits on (no scenario loaded).
pub async fn answer(place: &Place, run_id: &str, answer: &str) -> anyhow::Result<()> {
    let value: Value = serde_json::from_str(answer).with_context(|| {
        format!("--answer must be JSON (a string needs quotes: '\"yes\"'), got {answer}")
    })?;
    let engine = decision_engine(place).await?;
    Ok(engine.answer(run_id, value).await?)
}

/// Sends `message` from `by` to run `run_id`, whoever asks (`baton steer`, `POST
/// /runs/{id}/steer`, MCP `run_steer`): recorded once as `steering_received`, for the next
/// model call of a steerable level of the scenario version the run is pinned to. Refused
/// with nothing written when the run has ended, has no steerable level running or ahead,
/// or holds 16 messages no call has taken; a message is at most 8 KiB of text.
pub async fn steer(
    place: &Place,
    engine: &Engine,
    run_id: &str,
    message: &str,
    by: &str,
) -> Result<baton_engine::event::SteeringReceived, crate::error::Error> {
    use crate::error::Error as AppError;
    let typed = |e: anyhow::Error| AppError::new(AppError::kind_of(&e), format!("{e:#}"));
    let state = engine.state(run_id).await.map_err(|e| typed(e.into()))?;
    if state.status.is_final() {
        return Err(AppError::refused(format!(
            "run {run_id} has ended ({}); nothing was recorded",
            state.status.as_str()
        )));
    }
    let scenario = run_scenario(place, engine, &state, run_id).await.map_err(typed)?;
    engine.steer(run_id, &scenario, message, by).await.map_err(|e| typed(e.into()))
}

/// Why a run decided or answered is not continued here: its scenario version does not load
/// (continued with `baton resume` once that is fixed); `None` when it can go on.
pub async fn not_continued(place: &Place, run_id: &str) -> anyhow::Result<Option<anyhow::Error>> {
    let probe = decision_engine(place).await?;
    let state = probe.state(run_id).await?;
    Ok(run_scenario(place, &probe, &state, run_id).await.err())
}

/// Refuses a `--by` or `--reason` given empty.
pub fn check_who_and_why(
    by: Option<&str>,
    reason: Option<&str>,
) -> Result<(), crate::error::Error> {
    for (flag, value) in [("--by", by), ("--reason", reason)] {
        if value.is_some_and(|v| v.trim().is_empty()) {
            return Err(crate::error::Error::invalid(format!(
                "{flag} is empty; give a value or leave the flag out"
            )));
        }
    }
    Ok(())
}

/// A run's record, or why there is none.
pub async fn existing_run(
    place: &Place,
    store: &dyn EventStore,
    run_id: &str,
) -> anyhow::Result<RunRecord> {
    match store.run(run_id).await? {
        Some(record) => Ok(record),
        None => {
            Err(crate::error::Error::not_found(format!("no run {run_id} in {}", place.db_shown()))
                .into())
        }
    }
}

/// Cancels the run `run_id` of the database (see [`cancel`]), recorded as `by` with
/// `reason`: a terminal's cancel, with the settle timeout of the configuration when it
/// loads — a broken configuration never keeps a run from being stopped.
pub async fn cancel_run(
    place: &Place,
    run_id: &str,
    by: Option<String>,
    reason: Option<String>,
) -> anyhow::Result<Cancelled> {
    check_who_and_why(by.as_deref(), reason.as_deref())?;
    let store = open_existing_store(place).await?;
    let probe = engine(
        Arc::clone(&store),
        Arc::new(ScriptedModel::default()),
        &Registry::default(),
        workspace_setup(place, None, None),
        redactor(place),
        &jail(place),
        jobs(place, Arc::new(Registry::default()), None, WaveDrive::default()).ok().map(Arc::new),
        None,
        None,
    );
    let record = existing_run(place, store.as_ref(), run_id).await?;
    Ok(cancel(&probe, &record, by, reason).await?)
}

/// The model answers a run recorded, as a cassette (`baton cassette export`).
pub async fn cassette_of(place: &Place, run_id: &str) -> anyhow::Result<cassette::Cassette> {
    let store = open_existing_store(place).await?;
    existing_run(place, store.as_ref(), run_id).await?;
    Ok(cassette::from_events(&store.load(run_id, 0).await?))
}
