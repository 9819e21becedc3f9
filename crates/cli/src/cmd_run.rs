//! `baton run`, `resume`, `approve`, `answer`, `cancel`, `runs` and `events`.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use baton_engine::cassette;
use baton_engine::clock::SystemClock;
use baton_engine::model::{ModelProvider, ScriptedModel};
use baton_engine::runner::Runtime;
use baton_engine::store::EventStore;
use baton_engine::verifier::Verifiers;
use baton_engine::workspace::WorkspaceSetup;
use baton_engine::{Engine, Outcome, Status};
use baton_providers::client::Providers;
use baton_providers::config::Config;
use baton_scenario::{Registry, Scenario};
use baton_store::SqliteStore;
use baton_workspace::LocalWorkspaces;
use serde_json::{Map, Value, json};

use crate::timeline;

/// Where runs live and where scenarios are read from.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    pub db: PathBuf,
    pub scenarios: PathBuf,
    /// The provider configuration given with `--config`.
    pub config: Option<PathBuf>,
    /// Where snapshot repositories live (`--snapshots`; default `snapshots/` beside the
    /// database).
    pub snapshots: Option<PathBuf>,
}

fn open_store(place: &Place) -> anyhow::Result<Arc<dyn EventStore>> {
    let store = SqliteStore::open(&place.db)
        .with_context(|| format!("cannot open the run database {}", place.db.display()))?;
    Ok(Arc::new(store))
}

/// The model answering a run: the scripted model with `--script`, else the providers of the
/// configuration (`--config`, ./baton.toml, or the environment). The second value says where
/// it came from, recorded on the run so that a later process resumes with the same.
fn load_model(
    script: Option<&Path>,
    config: Option<&Path>,
) -> anyhow::Result<(Arc<dyn ModelProvider>, Option<String>)> {
    if let Some(path) = script
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter(|p| cassette::Cassette::load(p).is_ok())
    {
        // A cassette given where a script is expected: replay it.
        return replay(path);
    }
    if let Some(path) = script {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the script {}", path.display()))?;
        let model =
            ScriptedModel::parse(&text, &path.display().to_string()).map_err(anyhow::Error::msg)?;
        let absolute = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        return Ok((Arc::new(model), Some(format!("script:{}", absolute.display()))));
    }
    let file = config.map(Path::to_path_buf).or_else(|| {
        let default = PathBuf::from("baton.toml");
        default.is_file().then_some(default)
    });
    let (config, source) = match &file {
        Some(path) => {
            let absolute = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
            (Config::from_file(path)?, format!("config:{}", absolute.display()))
        }
        None => (Config::from_env(|k| std::env::var(k).ok()), "env".to_owned()),
    };
    if config.providers.is_empty() {
        bail!(
            "no model to call: pass --script FILE for the scripted model, or configure providers in baton.toml (--config) or with ANTHROPIC_API_KEY, OPENAI_API_KEY or OPENAI_BASE_URL"
        );
    }
    let providers = Providers::new(config).map_err(anyhow::Error::msg)?;
    Ok((Arc::new(providers), Some(source)))
}

/// A model that answers from a cassette only.
fn replay(path: &Path) -> anyhow::Result<(Arc<dyn ModelProvider>, Option<String>)> {
    let cassette = cassette::Cassette::load(path).map_err(anyhow::Error::msg)?;
    let absolute = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    Ok((
        Arc::new(cassette::Replayer::new(cassette)),
        Some(format!("cassette:{}", absolute.display())),
    ))
}

/// The model a run uses, given the run's options: a cassette to replay, or a model (scripted
/// or configured), optionally recorded into a cassette.
fn choose_model(
    script: Option<&Path>,
    config: Option<&Path>,
    replay_from: Option<&Path>,
    record_to: Option<&Path>,
) -> anyhow::Result<(Arc<dyn ModelProvider>, Option<String>)> {
    if let Some(path) = replay_from {
        return replay(path);
    }
    let (model, source) = load_model(script, config)?;
    match record_to {
        Some(path) => Ok((Arc::new(cassette::Recorder::new(model, path.to_path_buf())), source)),
        None => Ok((model, source)),
    }
}

/// The model a run recorded as its source, for resuming it.
fn recorded_model(
    source: Option<&str>,
    script: Option<&Path>,
    config: Option<&Path>,
) -> anyhow::Result<Arc<dyn ModelProvider>> {
    if script.is_some() || config.is_some() {
        return Ok(load_model(script, config)?.0);
    }
    match source {
        Some(s) if s.starts_with("cassette:") => Ok(replay(Path::new(&s["cassette:".len()..]))?.0),
        Some(s) if s.starts_with("script:") => {
            Ok(load_model(Some(Path::new(&s["script:".len()..])), None)?.0)
        }
        Some(s) if s.starts_with("config:") => {
            Ok(load_model(None, Some(Path::new(&s["config:".len()..])))?.0)
        }
        _ => Ok(load_model(None, None)?.0),
    }
}

/// Where runs get their workspaces: `DIR` from `--workspace`, else one directory per run
/// under `workspaces/` beside the database; their snapshots under `--snapshots`, else
/// `snapshots/` beside the database.
fn workspace_setup(place: &Place, dir: Option<PathBuf>, branch: Option<String>) -> WorkspaceSetup {
    let data = place.db.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let absolute = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
    let root = absolute(data.join("workspaces"));
    let snapshots = absolute(place.snapshots.clone().unwrap_or_else(|| data.join("snapshots")));
    let dir = dir.map(absolute);
    WorkspaceSetup { opener: Arc::new(LocalWorkspaces::new(root, snapshots)), dir, branch }
}

/// An engine for reading, deciding and finishing runs: its model answers nothing (a run
/// resumes with the model it recorded), its workspaces are the run's own.
fn probe_engine(place: &Place, store: &Arc<dyn EventStore>, registry: &Registry) -> Engine {
    engine(
        Arc::clone(store),
        Arc::new(ScriptedModel::default()),
        registry,
        workspace_setup(place, None, None),
    )
}

fn engine(
    store: Arc<dyn EventStore>,
    model: Arc<dyn ModelProvider>,
    registry: &Registry,
    workspaces: WorkspaceSetup,
) -> Engine {
    let catalog: Vec<Value> = registry
        .scenarios()
        .filter(|s| s.classifier_eligible())
        .map(|s| json!({"id": s.id, "display_name": s.display_name, "description": s.description, "examples": s.examples}))
        .collect();
    let mut verifiers = Verifiers::builtin();
    baton_verifiers::register(&mut verifiers);
    Engine::new(
        store,
        Arc::new(Runtime {
            model,
            verifiers,
            workspace: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
            workspaces: Some(workspaces),
            catalog: Arc::new(Value::Array(catalog)),
        }),
        Arc::new(SystemClock),
    )
}

fn registry(place: &Place) -> anyhow::Result<Registry> {
    match Registry::load(&[&place.scenarios]) {
        Ok(loaded) => Ok(loaded.registry),
        Err(e) => {
            eprint!("{}", e.diagnostics.render());
            bail!("the scenarios in {} do not load", place.scenarios.display())
        }
    }
}

fn find_scenario(registry: &Registry, which: &str, place: &Place) -> anyhow::Result<Arc<Scenario>> {
    if let Some(s) = registry.get(which) {
        return Ok(Arc::clone(s));
    }
    let known: Vec<&str> = registry.scenarios().map(|s| s.id.as_str()).collect();
    bail!("no scenario `{which}` in {} (known: {})", place.scenarios.display(), known.join(", "))
}

/// Options of `baton run`.
#[derive(Debug)]
pub(crate) struct RunArgs {
    pub scenario: String,
    pub input: String,
    pub meta: Vec<(String, String)>,
    pub script: Option<PathBuf>,
    pub json: bool,
    /// Replay model answers from this cassette instead of calling any model.
    pub cassette: Option<PathBuf>,
    /// Record every model answer into this cassette.
    pub record: Option<PathBuf>,
    /// The workspace directory, instead of a new one under the data directory.
    pub workspace: Option<PathBuf>,
    /// Name the completed run's result with this branch of the workspace repository.
    pub branch: Option<String>,
}

pub(crate) async fn run(place: &Place, args: RunArgs) -> anyhow::Result<ExitCode> {
    let registry = registry(place)?;
    let scenario = find_scenario(&registry, &args.scenario, place)?;
    let (model, source) = choose_model(
        args.script.as_deref(),
        place.config.as_deref(),
        args.cassette.as_deref(),
        args.record.as_deref(),
    )?;
    let store = open_store(place)?;
    let engine =
        engine(store, model, &registry, workspace_setup(place, args.workspace, args.branch));
    let mut metadata = Map::new();
    for (k, v) in args.meta {
        metadata.insert(k, Value::String(v));
    }
    let run_id = Engine::new_run_id();
    if !args.json {
        println!("run {run_id}");
    }
    let first = Start { input: args.input, metadata, source };
    drive(&engine, &run_id, &scenario, args.json, 0, Some(first)).await
}

pub(crate) async fn resume(
    place: &Place,
    run_id: &str,
    script: Option<&Path>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let registry = registry(place)?;
    let store = open_store(place)?;
    let probe = probe_engine(place, &store, &registry);
    let state = probe.state(run_id).await.with_context(|| format!("cannot read run {run_id}"))?;
    let scenario = find_scenario(&registry, &state.scenario_id, place)?;
    let model = recorded_model(state.model_source.as_deref(), script, place.config.as_deref())?;
    let engine = engine(store, model, &registry, workspace_setup(place, None, None));
    // Show the decision or answer that led here, then what follows.
    let from = state.last_seq.saturating_sub(1);
    drive(&engine, run_id, &scenario, json, from, None).await
}

async fn drive(
    engine: &Engine,
    run_id: &str,
    scenario: &Arc<Scenario>,
    json: bool,
    from: u64,
    start: Option<Start>,
) -> anyhow::Result<ExitCode> {
    // Print events as they land, from another task reading the store.
    let printer = (!json).then(|| {
        let (store, run_id) = (Arc::clone(&engine.store), run_id.to_owned());
        tokio::spawn(async move { follow(store.as_ref(), &run_id, from, false).await })
    });
    let outcome = match start {
        Some(s) => engine.run(run_id, scenario, &s.input, s.metadata, s.source).await,
        None => engine.drive(run_id, scenario).await,
    };
    if let Some(printer) = printer {
        tokio::time::sleep(Duration::from_millis(60)).await;
        printer.abort();
        let _ = printer.await;
        // Print whatever the follower had not reached yet.
        let seen = LAST_PRINTED.load(std::sync::atomic::Ordering::SeqCst).max(from);
        // A run that failed before it was written has nothing to print.
        for e in engine.store.load(run_id, seen).await.unwrap_or_default() {
            if let Some(line) = timeline::line(&e) {
                println!("{}", timeline::styled(&line));
            }
        }
    }
    let outcome = outcome?;
    let state = engine.state(run_id).await?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "run_id": run_id,
                "scenario_id": state.scenario_id,
                "status": state.status.as_str(),
                "final_output": state.final_output,
                "aborted_reason": state.finished.as_ref().and_then(|f| f.aborted_reason.clone()),
                "totals": state.totals,
                "checksum": state.checksum,
                "pending_approval": state.pending_approval,
                "pending_question": state.pending_ask,
            }))?
        );
    } else if outcome == Outcome::Paused {
        println!(
            "paused: run {run_id} waits for a person; continue with `baton approve {run_id}` or `baton answer {run_id} --answer JSON`"
        );
    } else if let Some(output) = &state.final_output {
        println!("output:\n{output}");
    }
    Ok(exit_code(&outcome))
}

/// What a new run starts with.
struct Start {
    input: String,
    metadata: Map<String, Value>,
    source: Option<String>,
}

static LAST_PRINTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Prints events after `after` as they arrive; with `until_end`, stops at the end of the run.
async fn follow(
    store: &dyn EventStore,
    run_id: &str,
    mut after: u64,
    as_json: bool,
) -> anyhow::Result<()> {
    loop {
        let events = match store.load(run_id, after).await {
            Ok(events) => events,
            // A new run is written with its first level's results: wait for it.
            Err(baton_engine::store::Error::NotFound(_)) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        for e in &events {
            if as_json {
                println!("{}", timeline::json_line(e));
            } else if let Some(line) = timeline::line(e) {
                println!("{}", timeline::styled(&line));
            }
            after = e.seq;
            LAST_PRINTED.store(after, std::sync::atomic::Ordering::SeqCst);
            if matches!(e.data, baton_engine::event::EventData::ScenarioFinished(_)) {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn exit_code(outcome: &Outcome) -> ExitCode {
    match outcome {
        Outcome::Paused => ExitCode::from(3),
        Outcome::Finished(Status::Completed) => ExitCode::SUCCESS,
        Outcome::Finished(Status::Aborted) => ExitCode::from(4),
        Outcome::Finished(Status::Cancelled) => ExitCode::from(5),
        Outcome::Finished(_) => ExitCode::from(1),
    }
}

/// Options of `baton approve`.
#[derive(Debug)]
pub(crate) struct Decision {
    pub reject: bool,
    pub comment: Option<String>,
    pub by: Option<String>,
    pub script: Option<PathBuf>,
    pub no_resume: bool,
}

pub(crate) async fn approve(place: &Place, run_id: &str, d: Decision) -> anyhow::Result<ExitCode> {
    let registry = registry(place)?;
    let store = open_store(place)?;
    let probe = probe_engine(place, &store, &registry);
    probe.approve(run_id, !d.reject, d.comment, d.by).await?;
    println!("{} run {run_id}", if d.reject { "rejected" } else { "approved" });
    if d.no_resume {
        return Ok(ExitCode::SUCCESS);
    }
    resume(place, run_id, d.script.as_deref(), false).await
}

pub(crate) async fn answer(
    place: &Place,
    run_id: &str,
    answer: &str,
    script: Option<&Path>,
    no_resume: bool,
) -> anyhow::Result<ExitCode> {
    let value: Value = serde_json::from_str(answer).with_context(|| {
        format!("--answer must be JSON (a string needs quotes: '\"yes\"'), got {answer}")
    })?;
    let registry = registry(place)?;
    let store = open_store(place)?;
    let probe = probe_engine(place, &store, &registry);
    probe.answer(run_id, value).await?;
    println!("answered run {run_id}");
    if no_resume {
        return Ok(ExitCode::SUCCESS);
    }
    resume(place, run_id, script, false).await
}

pub(crate) async fn cancel(
    place: &Place,
    run_id: &str,
    by: Option<String>,
) -> anyhow::Result<ExitCode> {
    let registry = registry(place)?;
    let store = open_store(place)?;
    let probe = probe_engine(place, &store, &registry);
    probe.cancel(run_id, by, None).await?;
    let state = probe.state(run_id).await?;
    if state.status == Status::Paused {
        // Nobody is driving a paused run: finish it here.
        let scenario = find_scenario(&registry, &state.scenario_id, place)?;
        probe.drive(run_id, &scenario).await?;
        println!("cancelled run {run_id}");
    } else {
        println!(
            "cancel requested for run {run_id}: the process driving it stops at its next check (a run nobody drives stops when resumed)"
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn runs(
    place: &Place,
    status: Option<&str>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let store = open_store(place)?;
    let list = store.runs(status).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(ExitCode::SUCCESS);
    }
    if list.is_empty() {
        println!("no runs");
    }
    for r in list {
        println!(
            "{}  {:<10} {:<22} {:>5} events  {}",
            r.run_id,
            r.status,
            r.scenario_id,
            r.last_seq,
            r.updated_at.format("%Y-%m-%d %H:%M:%S")
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn export_cassette(
    place: &Place,
    run_id: &str,
    out: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let store = open_store(place)?;
    if store.run(run_id).await?.is_none() {
        bail!("no run {run_id} in {}", place.db.display());
    }
    let cassette = cassette::from_events(&store.load(run_id, 0).await?);
    match out {
        Some(path) => {
            cassette.save(path).map_err(anyhow::Error::msg)?;
            println!("wrote {} recorded answers to {}", cassette.entries.len(), path.display());
        }
        None => println!("{}", serde_json::to_string_pretty(&cassette)?),
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn events(
    place: &Place,
    run_id: &str,
    follow_on: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let store = open_store(place)?;
    if store.run(run_id).await?.is_none() {
        bail!("no run {run_id} in {}", place.db.display());
    }
    if follow_on {
        follow(store.as_ref(), run_id, 0, json).await?;
        return Ok(ExitCode::SUCCESS);
    }
    for e in store.load(run_id, 0).await? {
        if json {
            println!("{}", timeline::json_line(&e));
        } else if let Some(line) = timeline::line(&e) {
            println!("{}", timeline::styled(&line));
        }
    }
    Ok(ExitCode::SUCCESS)
}
