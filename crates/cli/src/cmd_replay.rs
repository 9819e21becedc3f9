//! `baton replay`, `baton diff`, `baton fixture record|accept` and `baton test`: what a
//! change to a scenario or a prompt does to recorded jobs.
//!
//! Every replay goes through [`replay_job`]: a new job started from a recording (a run in
//! the store, or a fixture) on an engine whose model answers from the recording's cassette
//! (with `--live`, a request the cassette does not hold goes to the configured providers
//! and is recorded) and whose verifiers run again or, with `--trust-validation`, return
//! their recorded outcomes. `baton test` replays the fixtures into one scratch database
//! (removed when done) and judges each result against its fixture's expected summary
//! under the scenario's `regression_thresholds`; every text a model wrote is escaped
//! before it is printed.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use baton_engine::cassette::{Cassette, Entry, Miss, Replayer};
use baton_engine::event::RunReplayed;
use baton_engine::exec::{Decision as ApprovalDecision, Engine, Outcome};
use baton_engine::job::{JobRequest, Start};
use baton_engine::model::ModelProvider;
use baton_engine::replay::{self, Change, Mismatch, Strategy, Summary, Tree};
use baton_scenario::{Registry, Scenario};
use serde_json::{Value, json};

use crate::cmd_run::{self, Place, WaveDrive};
use crate::escape::{Layout, one_line, terminal_safe};
use crate::fixture::{self, Fixture};

/// What a replay came to.
pub(crate) struct Replayed {
    pub new_root: String,
    pub outcome: Outcome,
    pub tree: Tree,
    /// Requests the cassette did not hold.
    pub misses: Vec<Miss>,
    /// The live provider's answers to them (`--live`).
    pub live_entries: Vec<Entry>,
}

/// Where a replay's answers come from and what it records about itself.
pub(crate) struct ReplaySource<'a> {
    pub recorded: &'a Tree,
    pub cassette: Cassette,
    pub strategy: Strategy,
    /// `store` or `fixture:DIR`.
    pub source: String,
    /// Requests the cassette does not hold go here (`--live`).
    pub live: Option<Arc<dyn ModelProvider>>,
}

/// Replays a recorded job on `scenario` into the store at `place`.
pub(crate) async fn replay_job(
    place: &Place,
    registry: Arc<Registry>,
    scenario: Arc<Scenario>,
    from: ReplaySource<'_>,
) -> anyhow::Result<Replayed> {
    let Some(root) = from.recorded.root() else { bail!("the recording holds no run") };
    // Verifiers that run again run in the jail: a replay that cannot set it up is refused
    // before it starts, as a run is.
    if from.strategy == Strategy::RerunVerifiers {
        cmd_run::check_jail(place, &scenario)?;
    }
    let mut replayer = Replayer::new(from.cassette);
    if let Some(live) = from.live {
        replayer = replayer.live(live);
    }
    let replayer = Arc::new(replayer);
    let new_root = Engine::new_run_id();
    let trusted = (from.strategy == Strategy::TrustValidation)
        .then(|| Arc::new(from.recorded.trusted(&new_root)));
    let store = cmd_run::open_store(place).await?;
    let jobs = cmd_run::jobs(place, Arc::clone(&registry), None, WaveDrive::default())?
        .settling_as(Arc::new(from.recorded.settle_order(&new_root)));
    let engine = cmd_run::engine_trusting(
        store,
        Arc::clone(&replayer) as Arc<dyn ModelProvider>,
        &registry,
        cmd_run::workspace_setup(place, None, None),
        cmd_run::redactor(place),
        cmd_run::jail(place),
        Some(Arc::new(jobs)),
        trusted,
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
    })
}

/// The recording a replay run replays, to resume it: its job in this store, or its
/// fixture's log.
pub(crate) async fn recording_of(
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

fn strategy(trust_validation: bool) -> Strategy {
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
    let store = cmd_run::open_existing_store(place).await?;
    let probe = cmd_run::probe_engine(place, &store, registry);
    let state = probe.state(&root.run_id).await?;
    match from_scenario {
        Some(file) => scenario_file("--from-scenario", file, &state.scenario_id),
        None => Ok(probe.scenario_of(&state, &root.run_id).await?),
    }
}

/// Scenario `id` from the file given with `flag`.
pub(crate) fn scenario_file(flag: &str, file: &Path, id: &str) -> anyhow::Result<Arc<Scenario>> {
    let loaded = Registry::load(&[file]).map_err(|e| {
        anyhow::anyhow!("{flag} {} does not load:\n{}", file.display(), e.diagnostics.render())
    })?;
    loaded.registry.get(id).cloned().with_context(|| {
        format!("{flag} {} holds no scenario `{id}`, the one the run ran", file.display())
    })
}

/// `baton replay RUN | --fixture DIR`.
pub(crate) async fn replay(
    place: &Place,
    run: Option<&str>,
    fixture_dir: Option<&Path>,
    trust_validation: bool,
    from_scenario: Option<&Path>,
    json: bool,
) -> anyhow::Result<std::process::ExitCode> {
    let done = replay_report(place, run, fixture_dir, trust_validation, from_scenario).await?;
    if json {
        outln!("{}", done.line)?;
    } else {
        outln!(
            "replay {} of {} ({}): {}",
            done.line["replay_run_id"].as_str().unwrap_or_default(),
            done.line["recorded_run_id"].as_str().unwrap_or("?"),
            strategy(trust_validation).as_str(),
            done.line["status"].as_str().unwrap_or_default()
        )?;
        if done.scratch {
            outln!("(replayed in a scratch database, removed when done)")?;
        }
        if done.mismatches.is_empty() {
            outln!(
                "the replay matches the recording event by event: {} run(s), {} events (times, durations, heartbeats and ids that come from time aside)",
                done.line["runs"],
                done.line["events"]
            )?;
        } else {
            outln!("the replay differs from the recording:")?;
            print_mismatches(&done.mismatches)?;
        }
        for miss in &done.misses {
            outln!("{}", terminal_safe(&miss.message(), Layout::Block))?;
        }
    }
    Ok(std::process::ExitCode::from(if done.mismatches.is_empty() { 0 } else { 1 }))
}

/// A replay done: what `replay --json` prints, and what its text says beside.
pub(crate) struct ReplayReport {
    pub line: Value,
    mismatches: Vec<Mismatch>,
    misses: Vec<Miss>,
    scratch: bool,
}

/// Replays a stored job (`run`) or a fixture, on the scenario version it recorded or
/// `from_scenario`, and compares the two logs.
pub(crate) async fn replay_report(
    place: &Place,
    run: Option<&str>,
    fixture_dir: Option<&Path>,
    trust_validation: bool,
    from_scenario: Option<&Path>,
) -> anyhow::Result<ReplayReport> {
    let registry = Arc::new(cmd_run::registry(place)?);
    let (recorded, source, scenario, scratch) = match (run, fixture_dir) {
        (Some(run), None) => {
            let store = cmd_run::open_existing_store(place).await?;
            let probe = cmd_run::probe_engine(place, &store, &registry);
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
                None => cmd_run::find_scenario(&registry, &f.job.scenario, place)?,
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
    Ok(ReplayReport { line, mismatches, misses: done.misses, scratch: scratch.is_some() })
}

fn first_state(run: &replay::TreeRun) -> Option<baton_engine::state::RunState> {
    let first = run.events.first()?;
    let mut state = baton_engine::state::RunState::default();
    state.apply(first);
    Some(state)
}

fn print_mismatches(mismatches: &[Mismatch]) -> std::io::Result<()> {
    for m in mismatches {
        let at = match (m.seq, m.replay_seq) {
            (Some(a), Some(b)) if a == b => format!("event {a}"),
            (Some(a), Some(b)) => format!("event {a} (replay's {b})"),
            (Some(a), None) => format!("event {a}"),
            (None, Some(b)) => format!("replay's event {b}"),
            (None, None) => "the run".to_owned(),
        };
        outln!("  {} at {at}: {}", one_line(&m.run), one_line(&m.message))?;
    }
    Ok(())
}

fn status_of(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Finished(s) => s.as_str().to_owned(),
        Outcome::Paused => "paused".to_owned(),
        Outcome::Waiting => "waiting".to_owned(),
        Outcome::Interrupted(why) => format!("interrupted ({why})"),
    }
}

/// `baton diff RUN_A RUN_B`: where two jobs' paths, verdicts, outputs and costs diverge.
pub(crate) async fn diff(
    place: &Place,
    a: &str,
    b: &str,
    json: bool,
) -> anyhow::Result<std::process::ExitCode> {
    let store = cmd_run::open_existing_store(place).await?;
    let probe = cmd_run::probe_engine(place, &store, &Registry::default());
    let (ta, tb) = (probe.recorded_tree(a).await?, probe.recorded_tree(b).await?);
    let (sa, sb) = (Summary::of(&ta), Summary::of(&tb));
    // Every difference, none of them judged: a diff is a report, not a gate.
    let lenient = baton_scenario::model::RegressionThresholds {
        path_changes_allowed: true,
        verdict_changes_allowed: true,
        output_changes_allowed: true,
        ..Default::default()
    };
    let changes = sa.changes(&sb, &lenient);
    let levels = level_costs(&ta, &tb);
    let mismatches = replay::compare(&ta, &tb);
    if json {
        outln!(
            "{}",
            json!({
                "a": a, "b": b,
                "same": changes.is_empty(),
                "changes": changes,
                "levels": levels.iter().map(|(l, x, y)| json!({"level": l, "a": x, "b": y})).collect::<Vec<_>>(),
                "first_divergence": mismatches,
                "a_summary": sa, "b_summary": sb,
            })
        )?;
        return Ok(std::process::ExitCode::SUCCESS);
    }
    outln!("a: {a} ({}, ${:.6}, {} tokens)", sa.status, sa.cost_usd, sa.tokens)?;
    outln!("b: {b} ({}, ${:.6}, {} tokens)", sb.status, sb.cost_usd, sb.tokens)?;
    if changes.is_empty() {
        outln!("the two jobs took the same path to the same verdicts, output, cost and tokens")?;
    }
    for c in &changes {
        print_change(c, false)?;
    }
    if !levels.is_empty() {
        outln!("cost per level (a → b):")?;
        for (level, x, y) in &levels {
            let show = |v: &Option<(f64, u64)>| {
                v.map_or("—".to_owned(), |(c, t)| format!("${c:.6} {t} tok"))
            };
            outln!("  {:<32} {} → {}", one_line(level), show(x), show(y))?;
        }
    }
    if !mismatches.is_empty() {
        outln!("where the logs first diverge:")?;
        print_mismatches(&mismatches)?;
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Each level's cost and tokens in two jobs (summed over attempts), where they differ.
#[allow(clippy::type_complexity)]
fn level_costs(a: &Tree, b: &Tree) -> Vec<(String, Option<(f64, u64)>, Option<(f64, u64)>)> {
    let costs = |t: &Tree| {
        let mut by: std::collections::BTreeMap<String, (f64, u64)> = Default::default();
        for run in &t.runs {
            for e in &run.events {
                if let baton_engine::event::EventData::LevelFinished(f) = &e.data {
                    let level = e.level_id.clone().unwrap_or_default();
                    let key = if run.links.is_empty() {
                        level
                    } else {
                        format!("{} > {level}", run.place())
                    };
                    let slot = by.entry(key).or_default();
                    slot.0 += f.cost_usd;
                    slot.1 += f.tokens;
                }
            }
        }
        by
    };
    let (ca, cb) = (costs(a), costs(b));
    let mut keys: Vec<&String> = ca.keys().chain(cb.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| ca.get(*k) != cb.get(*k))
        .map(|k| (k.clone(), ca.get(k).copied(), cb.get(k).copied()))
        .collect()
}

fn print_change(c: &Change, judged: bool) -> std::io::Result<()> {
    let mark = if !judged {
        ""
    } else if c.fails {
        "FAIL "
    } else {
        "ok   "
    };
    let level = c.level.as_deref().map(|l| format!(" {}", one_line(l))).unwrap_or_default();
    if c.detail.contains('\n') {
        outln!("  {mark}{}{level}:", c.what)?;
        for line in c.detail.lines() {
            outln!("      {}", terminal_safe(line, Layout::OneLine))?;
        }
        Ok(())
    } else {
        outln!("  {mark}{}{level}: {}", c.what, one_line(&c.detail))
    }
}

/// A scratch directory for a replay's database and workspaces, removed when dropped.
pub(crate) struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    pub(crate) fn new(what: &str) -> anyhow::Result<Scratch> {
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
    pub(crate) fn place(&self, place: &Place) -> Place {
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

/// What `baton fixture record` runs when it records a new job.
#[derive(Debug)]
pub(crate) struct RecordArgs {
    pub scenario: String,
    pub case: String,
    pub from_run: Option<String>,
    pub script: Option<PathBuf>,
    pub input: Option<String>,
    pub meta: Vec<(String, String)>,
    pub tenant: Option<String>,
    /// The decisions its pauses get, in order: `approve`, `reject[:COMMENT]`,
    /// `answer:JSON`.
    pub decide: Vec<String>,
    pub force: bool,
}

/// `baton fixture record SCENARIO CASE (--from-run RUN | --script F | live providers)`.
pub(crate) async fn record(
    place: &Place,
    args: RecordArgs,
) -> anyhow::Result<std::process::ExitCode> {
    fixture::check_name("scenario", &args.scenario)?;
    fixture::check_name("case", &args.case)?;
    let dir = fixture::root(&place.scenarios).join(&args.scenario).join(&args.case);
    if dir.exists() && !args.force {
        bail!(
            "fixture {} exists; `baton fixture accept {} {}` records it again from a replay, or pass --force to record it anew",
            dir.display(),
            args.scenario,
            args.case
        );
    }
    let registry = Arc::new(cmd_run::registry(place)?);
    let scenario = cmd_run::find_scenario(&registry, &args.scenario, place)?;
    let run_id = match &args.from_run {
        Some(run) => {
            if args.script.is_some() || args.input.is_some() || !args.decide.is_empty() {
                bail!(
                    "--from-run takes the run as it is: leave out --script, --input and --decide"
                );
            }
            run.clone()
        }
        None => record_new(place, &registry, &scenario, &args).await?,
    };
    let store = cmd_run::open_existing_store(place).await?;
    let probe = cmd_run::probe_engine(place, &store, &registry);
    let tree = probe.recorded_tree(&run_id).await?;
    let state = probe.state(&run_id).await?;
    if state.scenario_id != args.scenario {
        bail!("run {run_id} ran scenario `{}`, not `{}`", state.scenario_id, args.scenario);
    }
    if state.parent.is_some() {
        bail!("run {run_id} is a child run; record its job's root");
    }
    if !state.status.is_final() {
        bail!(
            "run {run_id} has not ended ({}): a fixture records a whole job; decide or resume it first",
            state.status.as_str()
        );
    }
    if let Some(why) = tree.unreplayable() {
        bail!("run {run_id} cannot be a fixture: {why}");
    }
    let job = fixture::Job {
        format: fixture::FORMAT,
        scenario: args.scenario.clone(),
        case: args.case.clone(),
        input: state.input.clone(),
        metadata: state.metadata.clone(),
        tenant: state.tenant.clone(),
        recorded_run: run_id.clone(),
        recorded_checksum: state.checksum.clone(),
        event_schema: baton_engine::event::VERSION,
    };
    let summary = Summary::of(&tree);
    fixture::write(&dir, &job, &tree.cassette(), &tree, &summary)?;
    outln!(
        "fixture {}/{} recorded from run {run_id}: {}, {} levels, ${:.6}, {} tokens → {}",
        args.scenario,
        args.case,
        summary.status,
        summary.path.len(),
        summary.cost_usd,
        summary.tokens,
        dir.display()
    )?;
    Ok(std::process::ExitCode::SUCCESS)
}

/// Runs a new job of `scenario` for a fixture, making the given decisions at its pauses;
/// returns its root's id.
async fn record_new(
    place: &Place,
    registry: &Arc<Registry>,
    scenario: &Arc<Scenario>,
    args: &RecordArgs,
) -> anyhow::Result<String> {
    let Some(input) = &args.input else {
        bail!("--input is required to record a new job (or take an existing one with --from-run)");
    };
    let decisions: Vec<Decide> =
        args.decide.iter().map(|d| Decide::parse(d)).collect::<Result<_, _>>()?;
    cmd_run::check_jail(place, scenario)?;
    let (model, source) =
        cmd_run::load_model(args.script.as_deref(), place.config.as_deref(), Some(scenario))?;
    let store = cmd_run::open_store(place).await?;
    let jobs = cmd_run::jobs(place, Arc::clone(registry), None, WaveDrive::default())?;
    let engine = cmd_run::engine_trusting(
        store,
        model,
        registry,
        cmd_run::workspace_setup(place, None, None),
        cmd_run::redactor(place),
        cmd_run::jail(place),
        Some(Arc::new(jobs)),
        None,
    );
    let (_, selected) = baton_engine::job::select(
        registry,
        &Default::default(),
        &JobRequest { pin: Some(scenario.id.clone()), intent: None, kind: None },
        true,
    )
    .map_err(anyhow::Error::msg)?;
    let metadata = args.meta.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
    let run_id = Engine::new_run_id();
    let start = Start {
        input: input.clone(),
        metadata,
        model_source: source,
        selected: Some(selected),
        tenant: args.tenant.clone(),
        ..Start::default()
    };
    let mut outcome = engine.run_job(&run_id, scenario, start).await?;
    let mut decisions = decisions.into_iter();
    while outcome == Outcome::Paused {
        let Some(decision) = decisions.next() else {
            bail!(
                "run {run_id} paused for a person and no --decide is left; give one more (`approve`, `reject:COMMENT`, `answer:JSON`), or decide it and record it with --from-run"
            );
        };
        let waiting = paused_run(&engine, &run_id).await?;
        match decision {
            Decide::Approve(approved, comment) => {
                engine
                    .decide(
                        &waiting,
                        ApprovalDecision {
                            request_id: None,
                            approved,
                            comment,
                            by: Some("fixture".to_owned()),
                            data: None,
                        },
                    )
                    .await?;
            }
            Decide::Answer(answer) => engine.answer(&waiting, answer).await?,
        }
        outcome = engine.drive_tree(&run_id, scenario).await?;
    }
    if decisions.next().is_some() {
        bail!("run {run_id} ended ({}) with --decide left over", status_of(&outcome));
    }
    Ok(run_id)
}

/// The run of a job that waits for a person: the root, or the first of its runs that does.
async fn paused_run(engine: &Engine, root: &str) -> anyhow::Result<String> {
    let tree = engine.recorded_tree(root).await?;
    for run in &tree.runs {
        if engine.state(&run.run_id).await?.awaiting_person() {
            return Ok(run.run_id.clone());
        }
    }
    bail!("job {root} is paused but none of its runs waits for a person")
}

enum Decide {
    Approve(bool, Option<String>),
    Answer(Value),
}

impl Decide {
    fn parse(text: &str) -> anyhow::Result<Decide> {
        let (verb, rest) = text.split_once(':').map_or((text, None), |(v, r)| (v, Some(r)));
        match (verb, rest) {
            ("approve", None) => Ok(Decide::Approve(true, None)),
            ("approve", Some(c)) => Ok(Decide::Approve(true, Some(c.to_owned()))),
            ("reject", c) => Ok(Decide::Approve(false, c.map(str::to_owned))),
            ("answer", Some(json)) => serde_json::from_str(json)
                .map(Decide::Answer)
                .with_context(|| format!("--decide {text:?}: the answer is not JSON")),
            _ => bail!(
                "--decide {text:?}: use `approve`, `approve:COMMENT`, `reject`, `reject:COMMENT` or `answer:JSON`"
            ),
        }
    }
}

/// Output formats of `baton test`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TestFormat {
    Text,
    Json,
    Junit,
}

/// Options of `baton test` and `baton fixture accept`.
#[derive(Debug)]
pub(crate) struct TestArgs {
    pub scenarios: Vec<String>,
    pub case: Option<String>,
    pub format: TestFormat,
    pub live: bool,
    pub trust_validation: bool,
}

/// One fixture's result.
struct CaseResult {
    name: String,
    scenario: String,
    case: String,
    seconds: f64,
    /// Why the case could not be replayed at all.
    error: Option<String>,
    changes: Vec<Change>,
    misses: Vec<Miss>,
    /// Calls `--live` answered and added to the cassette.
    rerecorded: usize,
    replayed: Option<Replayed>,
}

impl CaseResult {
    fn passed(&self) -> bool {
        self.error.is_none()
            && !self.changes.iter().any(|c| c.fails)
            && (self.misses.is_empty() || self.rerecorded == self.misses.len())
    }
}

/// Replays one fixture into `target` (a scratch database) and judges it.
async fn test_case(
    place: &Place,
    target: &Place,
    registry: &Arc<Registry>,
    f: &Fixture,
    args: &TestArgs,
    live: Option<Arc<dyn ModelProvider>>,
) -> CaseResult {
    let started = Instant::now();
    let mut result = CaseResult {
        name: f.name(),
        scenario: f.job.scenario.clone(),
        case: f.job.case.clone(),
        seconds: 0.0,
        error: None,
        changes: Vec::new(),
        misses: Vec::new(),
        rerecorded: 0,
        replayed: None,
    };
    let Some(scenario) = registry.get(&f.job.scenario).cloned() else {
        result.error = Some(format!(
            "no scenario `{}` in {}: the fixture's scenario was removed or renamed",
            f.job.scenario,
            place.scenarios.display()
        ));
        return result;
    };
    let replayed = replay_job(
        target,
        Arc::clone(registry),
        Arc::clone(&scenario),
        ReplaySource {
            recorded: &f.tree,
            cassette: f.cassette.clone(),
            strategy: strategy(args.trust_validation),
            source: format!("fixture:{}", f.dir.display()),
            live,
        },
    )
    .await;
    result.seconds = started.elapsed().as_secs_f64();
    match replayed {
        Err(e) => result.error = Some(format!("{e:#}")),
        Ok(r) => {
            let summary = Summary::of(&r.tree);
            result.changes = f.expected.changes(&summary, &scenario.regression);
            result.misses.clone_from(&r.misses);
            result.rerecorded = r.live_entries.len();
            result.replayed = Some(r);
        }
    }
    result
}

/// `baton test [SCENARIO…]`.
pub(crate) async fn test(place: &Place, args: TestArgs) -> anyhow::Result<std::process::ExitCode> {
    let (results, started) = run_cases(place, &args, false).await?;
    let passed = results.iter().filter(|r| r.passed()).count();
    let failed = results.len() - passed;
    match args.format {
        TestFormat::Text => {
            for r in &results {
                print_case(r)?;
            }
            outln!(
                "{} fixture(s): {passed} passed, {failed} failed ({:.1} s)",
                results.len(),
                started.elapsed().as_secs_f64()
            )?;
        }
        TestFormat::Json => outln!("{}", json_report(&results))?,
        TestFormat::Junit => out::write(format_args!("{}", junit(&results)))?,
    }
    Ok(std::process::ExitCode::from(if failed == 0 { 0 } else { 1 }))
}

/// `baton fixture accept [SCENARIO [CASE]]`: records each fixture again from its replay.
pub(crate) async fn accept(
    place: &Place,
    args: TestArgs,
) -> anyhow::Result<std::process::ExitCode> {
    let (results, _) = run_cases(place, &args, true).await?;
    let mut refused = 0;
    for r in results {
        let dir = fixture::root(&place.scenarios).join(&r.scenario).join(&r.case);
        let unanswered = r.misses.len() - r.rerecorded.min(r.misses.len());
        match (&r.error, &r.replayed) {
            (None, Some(replayed)) if unanswered == 0 => {
                let f = fixture::read(&dir)?;
                let summary = Summary::of(&replayed.tree);
                let job = fixture::Job {
                    recorded_run: replayed.new_root.clone(),
                    recorded_checksum: replayed
                        .tree
                        .root()
                        .and_then(|root| first_state(root).map(|s| s.checksum))
                        .unwrap_or_default(),
                    event_schema: baton_engine::event::VERSION,
                    ..f.job
                };
                fixture::write(&dir, &job, &replayed.tree.cassette(), &replayed.tree, &summary)?;
                let changed = r.changes.len();
                outln!(
                    "accepted {}: {} ({changed} change(s) from what it expected{})",
                    r.name,
                    summary.status,
                    if r.rerecorded > 0 {
                        format!(", {} call(s) recorded live", r.rerecorded)
                    } else {
                        String::new()
                    }
                )?;
            }
            _ => {
                refused += 1;
                print_case(&r)?;
                outln!(
                    "not accepted {}: the replay did not run to a result{}",
                    r.name,
                    if unanswered > 0 {
                        "; its cassette misses requests: accept with --live to record them"
                    } else {
                        ""
                    }
                )?;
            }
        }
    }
    Ok(std::process::ExitCode::from(if refused == 0 { 0 } else { 1 }))
}

async fn run_cases(
    place: &Place,
    args: &TestArgs,
    accepting: bool,
) -> anyhow::Result<(Vec<CaseResult>, Instant)> {
    let started = Instant::now();
    let registry = Arc::new(cmd_run::registry(place)?);
    for s in &args.scenarios {
        if registry.get(s).is_none() {
            cmd_run::find_scenario(&registry, s, place)?;
        }
    }
    let mut dirs = fixture::find(&fixture::root(&place.scenarios), &args.scenarios)?;
    if let Some(case) = &args.case {
        dirs.retain(|d| d.file_name().is_some_and(|n| n.to_string_lossy() == case.as_str()));
    }
    if dirs.is_empty() {
        bail!(
            "no fixtures under {}{}; record one with `baton fixture record SCENARIO CASE`",
            fixture::root(&place.scenarios).display(),
            if args.scenarios.is_empty() {
                String::new()
            } else {
                format!(" for {}", args.scenarios.join(", "))
            }
        );
    }
    let live = if args.live {
        Some(cmd_run::load_model(None, place.config.as_deref(), None)?.0)
    } else {
        None
    };
    // One scratch database for every case: the jail is set up once per process, for the
    // database it first serves, and hides that database's directory from what it runs.
    let scratch = Scratch::new("test")?;
    let target = scratch.place(place);
    let mut results = Vec::new();
    for dir in dirs {
        let f = match fixture::read(&dir) {
            Ok(f) => f,
            Err(e) => {
                results.push(CaseResult {
                    name: dir.display().to_string(),
                    scenario: String::new(),
                    case: String::new(),
                    seconds: 0.0,
                    error: Some(format!("{e:#}")),
                    changes: Vec::new(),
                    misses: Vec::new(),
                    rerecorded: 0,
                    replayed: None,
                });
                continue;
            }
        };
        let r = test_case(place, &target, &registry, &f, args, live.clone()).await;
        // `--live` keeps what it recorded in the fixture's cassette (accept rewrites it
        // whole).
        if !accepting
            && let Some(replayed) = &r.replayed
            && !replayed.live_entries.is_empty()
        {
            let mut cassette = f.cassette.clone();
            cassette.entries.extend(replayed.live_entries.iter().cloned());
            cassette.save(&dir.join("cassette.json")).map_err(anyhow::Error::msg)?;
        }
        results.push(r);
    }
    Ok((results, started))
}

fn print_case(r: &CaseResult) -> std::io::Result<()> {
    let verdict = if r.passed() { "ok" } else { "FAIL" };
    outln!("{} … {verdict} ({:.1} s)", one_line(&r.name), r.seconds)?;
    if let Some(e) = &r.error {
        outln!("  error: {}", terminal_safe(e, Layout::OneLine))?;
    }
    // A request the cassette lacks comes first: the changes follow from it.
    for m in &r.misses {
        outln!(
            "  {} request of level {} (call {}) is not in the cassette{}",
            if r.rerecorded > 0 { "recorded live: the" } else { "FAIL the" },
            one_line(&m.level_id),
            m.call_index,
            if m.nearest.is_some() {
                "; how it differs from the recording (- recorded, + asked):"
            } else {
                ", which holds no call of that level"
            }
        )?;
        for line in m.diff.lines() {
            outln!("      {}", terminal_safe(line, Layout::OneLine))?;
        }
    }
    for c in &r.changes {
        print_change(c, true)?;
    }
    Ok(())
}

fn case_json(r: &CaseResult) -> Value {
    json!({
        "fixture": r.name,
        "scenario": r.scenario,
        "case": r.case,
        "passed": r.passed(),
        "seconds": r.seconds,
        "error": r.error,
        "changes": r.changes,
        "misses": r.misses,
        "rerecorded": r.rerecorded,
        "status": r.replayed.as_ref().map(|x| status_of(&x.outcome)),
    })
}

fn json_report(results: &[CaseResult]) -> Value {
    let passed = results.iter().filter(|r| r.passed()).count();
    json!({
        "fixtures": results.len(),
        "passed": passed,
        "failed": results.len() - passed,
        "cases": results.iter().map(case_json).collect::<Vec<_>>(),
    })
}

/// The results as JUnit XML: one test suite per scenario, one test case per fixture.
fn junit(results: &[CaseResult]) -> String {
    let mut by: std::collections::BTreeMap<&str, Vec<&CaseResult>> = Default::default();
    for r in results {
        by.entry(r.scenario.as_str()).or_default().push(r);
    }
    let failures = results.iter().filter(|r| !r.passed()).count();
    let total: f64 = results.iter().map(|r| r.seconds).sum();
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        x,
        "<testsuites name=\"baton test\" tests=\"{}\" failures=\"{failures}\" time=\"{total:.3}\">",
        results.len()
    );
    for (scenario, cases) in by {
        let failed = cases.iter().filter(|r| !r.passed()).count();
        let time: f64 = cases.iter().map(|r| r.seconds).sum();
        let _ = writeln!(
            x,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failed}\" time=\"{time:.3}\">",
            xml(scenario),
            cases.len()
        );
        for r in cases {
            let _ = write!(
                x,
                "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3}\"",
                xml(scenario),
                xml(&r.case),
                r.seconds
            );
            if r.passed() {
                x.push_str("/>\n");
                continue;
            }
            let mut details = String::new();
            if let Some(e) = &r.error {
                let _ = writeln!(details, "error: {e}");
            }
            // A request the cassette lacks comes first: the changes follow from it.
            for m in &r.misses {
                let _ = writeln!(details, "{}", m.message());
            }
            for c in r.changes.iter().filter(|c| c.fails) {
                let _ = writeln!(
                    details,
                    "{}{}: {}",
                    c.what,
                    c.level.as_deref().map(|l| format!(" {l}")).unwrap_or_default(),
                    c.detail
                );
            }
            let first = details.lines().next().unwrap_or("failed").to_owned();
            let _ = writeln!(
                x,
                ">\n      <failure message=\"{}\">{}</failure>\n    </testcase>",
                xml(&first),
                xml(&details)
            );
        }
        x.push_str("  </testsuite>\n");
    }
    x.push_str("</testsuites>\n");
    x
}

/// Text as XML character data or an attribute value: markup characters escaped, and the
/// characters XML 1.0 cannot hold at all (most C0 controls) written as `\u{..}`.
fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' | '\t' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

use crate::out::{self, outln};
