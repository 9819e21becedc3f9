//! Use cases on runs that exist: where a run of a tree is continued from, the tree below a
//! run, resuming a job (on the version it started with, or moved to the current one; a
//! replay going on as it began) and cancelling one.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use baton_engine::cassette;
use baton_engine::exec::Error;
use baton_engine::model::{ModelProvider, ScriptedModel};
use baton_engine::pinning::Upgrade;
use baton_engine::replay::Tree;
use baton_engine::store::{EventStore, RunRecord};
use baton_engine::{Engine, Status};
use baton_scenario::{Registry, Scenario};

use crate::engines::{
    WaveDrive, engine, engine_trusting, jobs, probe_engine, redactor, reloading_jobs,
    workspace_setup,
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
        replay = Some(Box::new(recorded));
        engine_trusting(
            store,
            Arc::new(cassette::Replayer::new(cassette)),
            &registry,
            workspace_setup(place, None, None),
            redactor(place),
            jail(place),
            Some(Arc::new(jobs)),
            trusted,
        )
    } else {
        let model = match crate::models::recorded_model(
            root_state.model_source.as_deref(),
            script,
            place.config.as_deref(),
        ) {
            // A run of manual waves calls no model; `baton wave run` needs one for its
            // workers.
            Err(_) if baton_engine::exec::calls_no_model(&root_scenario) && !waves.active => {
                Arc::new(ScriptedModel::default()) as Arc<dyn ModelProvider>
            }
            other => other?,
        };
        let jobs = reloading_jobs(
            place,
            store.as_ref(),
            Arc::clone(&registry),
            None,
            root_state.tenant.as_deref(),
            waves,
        )
        .await?;
        engine(
            store,
            model,
            &registry,
            workspace_setup(place, None, None),
            redactor(place),
            jail(place),
            Some(jobs),
        )
    };
    Ok(Resumed { engine, root, root_scenario, scenario, upgrade: upgraded, replay, jail_warning })
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
