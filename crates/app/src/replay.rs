//! Replays: a new job started from a recording (a run in the store, or a fixture) on an
//! engine whose model answers from the recording's cassette (with a live provider, a
//! request the cassette does not hold goes there and is recorded) and whose verifiers run
//! again or return their recorded outcomes; and the report that compares the two logs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use baton_engine::cassette::{Cassette, Entry, Miss, Replayer};
use baton_engine::event::RunReplayed;
use baton_engine::exec::{Engine, Outcome};
use baton_engine::model::ModelProvider;
use baton_engine::replay::{self, Mismatch, Strategy, Tree};
use baton_scenario::{Registry, Scenario};
use serde_json::{Value, json};

use crate::engines::{self, WaveDrive};
use crate::fixture;
use crate::place::{self, Place};

/// What a replay came to.
pub struct Replayed {
    pub new_root: String,
    pub outcome: Outcome,
    pub tree: Tree,
    /// Requests the cassette did not hold.
    pub misses: Vec<Miss>,
    /// The live provider's answers to them (`--live`).
    pub live_entries: Vec<Entry>,
    /// What to say about the replay before its result (the jail is off).
    pub warnings: Vec<String>,
}

impl std::fmt::Debug for Replayed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replayed").field("new_root", &self.new_root).finish_non_exhaustive()
    }
}

/// Where a replay's answers come from and what it records about itself.
pub struct ReplaySource<'a> {
    pub recorded: &'a Tree,
    pub cassette: Cassette,
    pub strategy: Strategy,
    /// `store` or `fixture:DIR`.
    pub source: String,
    /// Requests the cassette does not hold go here (`--live`).
    pub live: Option<Arc<dyn ModelProvider>>,
}

impl std::fmt::Debug for ReplaySource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplaySource").field("source", &self.source).finish_non_exhaustive()
    }
}

/// Replays a recorded job on `scenario` into the store at `place`.
pub async fn replay_job(
    place: &Place,
    registry: Arc<Registry>,
    scenario: Arc<Scenario>,
    from: ReplaySource<'_>,
) -> anyhow::Result<Replayed> {
    let Some(root) = from.recorded.root() else { bail!("the recording holds no run") };
    // Verifiers that run again run in the jail: a replay that cannot set it up is refused
    // before it starts, as a run is.
    let mut warnings = Vec::new();
    if from.strategy == Strategy::RerunVerifiers {
        warnings.extend(crate::jail::check_jail(place, &registry, &scenario)?);
    }
    let tools = engines::recorded_tools(&from.cassette);
    let mut replayer = Replayer::new(from.cassette);
    if let Some(live) = from.live {
        replayer = replayer.live(live);
    }
    let replayer = Arc::new(replayer);
    let new_root = Engine::new_run_id();
    let trusted = (from.strategy == Strategy::TrustValidation)
        .then(|| Arc::new(from.recorded.trusted(&new_root)));
    let store = place::open_store(place).await?;
    let jobs = engines::jobs(place, Arc::clone(&registry), None, WaveDrive::default())?
        .settling_as(Arc::new(from.recorded.settle_order(&new_root)));
    let engine = engines::engine(
        store,
        Arc::clone(&replayer) as Arc<dyn ModelProvider>,
        &registry,
        engines::workspace_setup(place, None, None),
        engines::redactor(place),
        &crate::jail::jail(place),
        Some(Arc::new(jobs)),
        trusted,
        Some(tools),
    );
    let recorded_checksum = root.events.iter().find_map(|e| match &e.data {
        baton_engine::event::EventData::ScenarioStarted(s) => Some(s.checksum.clone()),
        _ => None,
    });
    let record = RunReplayed {
        of_run_id: root.run_id.clone(),
        strategy: from.strategy,
        source: from.source,
        recorded_checksum: recorded_checksum.filter(|c| *c != scenario.checksum),
    };
    let outcome = engine.replay(&new_root, &scenario, from.recorded, record).await?;
    let tree = engine.recorded_tree(&new_root).await?;
    Ok(Replayed {
        new_root,
        outcome,
        tree,
        misses: replayer.misses(),
        live_entries: replayer.recorded(),
        warnings,
    })
}

/// The recording a replay run replays, to resume it: its job in this store, or its
/// fixture's log.
pub async fn recording_of(
    place: &Place,
    probe: &Engine,
    replayed: &RunReplayed,
) -> anyhow::Result<Tree> {
    match replayed.source.strip_prefix("fixture:") {
        Some(dir) => Ok(fixture::read(Path::new(dir))
            .with_context(|| format!("the fixture run {} replays", replayed.of_run_id))?
            .tree),
        None if replayed.source == "store" => Ok(probe.recorded_tree(&replayed.of_run_id).await?),
        None => bail!(
            "the replay's recording is in {:?}, which this build cannot read (see {})",
            replayed.source,
            place.db_shown()
        ),
    }
}

pub fn strategy(trust_validation: bool) -> Strategy {
    if trust_validation { Strategy::TrustValidation } else { Strategy::RerunVerifiers }
}

/// The scenario a replay of `recorded` runs: `--from-scenario FILE` (a scenario with the
/// recording's id), else the version the recording ran, as the store keeps it.
async fn replay_scenario(
    place: &Place,
    registry: &Arc<Registry>,
    recorded: &Tree,
    from_scenario: Option<&Path>,
) -> anyhow::Result<Arc<Scenario>> {
    let Some(root) = recorded.root() else { bail!("the recording holds no run") };
    let store = place::open_existing_store(place).await?;
    let probe = engines::probe_engine(place, &store, registry);
    let state = probe.state(&root.run_id).await?;
    match from_scenario {
        Some(file) => scenario_file("--from-scenario", file, &state.scenario_id),
        None => Ok(probe.scenario_of(&state, &root.run_id).await?),
    }
}

/// Scenario `id` from the file given with `flag`.
pub fn scenario_file(flag: &str, file: &Path, id: &str) -> anyhow::Result<Arc<Scenario>> {
    let loaded = Registry::load(&[file]).map_err(|e| {
        anyhow::anyhow!("{flag} {} does not load:\n{}", file.display(), e.diagnostics.render())
    })?;
    loaded.registry.get(id).cloned().with_context(|| {
        format!("{flag} {} holds no scenario `{id}`, the one the run ran", file.display())
    })
}

/// A replay done: what `replay --json` prints, and what its text says beside.
#[derive(Debug)]
pub struct ReplayReport {
    pub line: Value,
    pub mismatches: Vec<Mismatch>,
    pub misses: Vec<Miss>,
    /// Whether it ran in a scratch database (a fixture's), removed when done.
    pub scratch: bool,
    /// What to say before the result (the jail is off).
    pub warnings: Vec<String>,
}

/// Replays a stored job (`run`) or a fixture, on the scenario version it recorded or
/// `from_scenario`, and compares the two logs.
pub async fn replay_report(
    place: &Place,
    run: Option<&str>,
    fixture_dir: Option<&Path>,
    trust_validation: bool,
    from_scenario: Option<&Path>,
) -> anyhow::Result<ReplayReport> {
    let registry = Arc::new(crate::scenarios::registry(place)?);
    let (recorded, source, scenario, scratch) = match (run, fixture_dir) {
        (Some(run), None) => {
            let store = place::open_existing_store(place).await?;
            let probe = engines::probe_engine(place, &store, &registry);
            let recorded = probe.recorded_tree(run).await?;
            if let Some(parent) =
                recorded.root().and_then(|r| first_state(r).and_then(|s| s.parent.clone()))
            {
                bail!(
                    "run {run} is a child of run {}; replay the job's root, {}",
                    parent.parent_run_id,
                    parent.root_run_id
                );
            }
            let scenario = replay_scenario(place, &registry, &recorded, from_scenario).await?;
            (recorded, "store".to_owned(), scenario, None)
        }
        (None, Some(dir)) => {
            let f = fixture::read(dir)?;
            let scenario = match from_scenario {
                Some(file) => scenario_file("--from-scenario", file, &f.job.scenario)?,
                None => crate::scenarios::find_scenario(&registry, &f.job.scenario, place)?,
            };
            let scratch = Scratch::new("replay")?;
            (f.tree, format!("fixture:{}", dir.display()), scenario, Some(scratch))
        }
        _ => bail!("give a run id or --fixture DIR, not both"),
    };
    let target = match &scratch {
        Some(s) => s.place(place),
        None => place.clone(),
    };
    let cassette = recorded.cassette();
    let started = Instant::now();
    let done = replay_job(
        &target,
        registry,
        scenario,
        ReplaySource {
            recorded: &recorded,
            cassette,
            strategy: strategy(trust_validation),
            source,
            live: None,
        },
    )
    .await?;
    let mismatches = replay::compare(&recorded, &done.tree);
    let events: usize = done.tree.runs.iter().map(|r| r.events.len()).sum();
    let line = json!({
        "replay_run_id": done.new_root,
        "recorded_run_id": recorded.root().map(|r| r.run_id.clone()),
        "strategy": strategy(trust_validation).as_str(),
        "status": status_of(&done.outcome),
        "matches": mismatches.is_empty(),
        "runs": done.tree.runs.len(),
        "events": events,
        "mismatches": mismatches,
        "misses": done.misses,
        "ignored": {"kinds": replay::IGNORED_KINDS, "keys": replay::IGNORED_KEYS},
        "seconds": started.elapsed().as_secs_f64(),
    });
    Ok(ReplayReport {
        line,
        mismatches,
        misses: done.misses,
        scratch: scratch.is_some(),
        warnings: done.warnings,
    })
}

pub fn first_state(run: &replay::TreeRun) -> Option<baton_engine::state::RunState> {
    let first = run.events.first()?;
    let mut state = baton_engine::state::RunState::default();
    state.apply(first);
    Some(state)
}

pub fn status_of(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Finished(s) => s.as_str().to_owned(),
        Outcome::Paused => "paused".to_owned(),
        Outcome::Waiting => "waiting".to_owned(),
        Outcome::Interrupted(why) => format!("interrupted ({why})"),
        Outcome::Released => "running (let go between two steps)".to_owned(),
    }
}

/// A scratch directory for a replay's database and workspaces, removed when dropped.
#[derive(Debug)]
pub struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    pub fn new(what: &str) -> anyhow::Result<Scratch> {
        let dir = std::env::temp_dir().join(format!(
            "baton-{what}-{}-{}",
            std::process::id(),
            Engine::new_run_id()
        ));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create a scratch directory {}", dir.display()))?;
        Ok(Scratch { dir })
    }

    /// `place` with its database (and so its workspaces and snapshots) in the scratch
    /// directory.
    pub fn place(&self, place: &Place) -> Place {
        Place {
            db: self.dir.join("baton.db"),
            postgres: None,
            hold_for: None,
            snapshots: None,
            ..place.clone()
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
