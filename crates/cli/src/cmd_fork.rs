//! `baton fork RUN --at SEQ`: a new run from another run's log up to an event, with edits,
//! driven on from there (see the engine's `fork` module).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::bail;
use baton_engine::Engine;
use baton_engine::fork::{ForkEdits, fork_points};
use serde_json::{Map, Value, json};

use baton_app::follow::Followed;

use crate::drive;
use crate::out::outln;
use baton_app::engines::WaveDrive;
use baton_app::place::Place;

/// Options of `baton fork`.
#[derive(Debug)]
pub(crate) struct ForkArgs {
    pub run: String,
    pub at: Option<u64>,
    pub input: Option<String>,
    pub scenario_file: Option<PathBuf>,
    /// `scratchpad.KEY=VALUE` (the value read as JSON, else as a string).
    pub set: Vec<String>,
    pub script: Option<PathBuf>,
    pub cassette: Option<PathBuf>,
    pub json: bool,
}

/// `KEY` and value of a `--set scratchpad.KEY=VALUE`.
fn parse_set(text: &str) -> anyhow::Result<(String, Value)> {
    let Some((path, value)) = text.split_once('=') else {
        bail!("--set {text:?}: expected scratchpad.KEY=VALUE");
    };
    let Some(key) = path.strip_prefix("scratchpad.") else {
        bail!("--set {text:?}: only scratchpad keys can be set (scratchpad.KEY=VALUE)");
    };
    let value = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_owned()));
    Ok((key.to_owned(), value))
}

pub(crate) async fn fork(place: &Place, args: ForkArgs) -> anyhow::Result<ExitCode> {
    let mut scratchpad = Map::new();
    for s in &args.set {
        let (k, v) = parse_set(s)?;
        scratchpad.insert(k, v);
    }
    let store = baton_app::place::open_existing_store(place).await?;
    let registry = Arc::new(baton_app::scenarios::registry(place)?);
    let jobs = Arc::new(baton_app::engines::jobs(
        place,
        Arc::clone(&registry),
        None,
        WaveDrive::default(),
    )?);
    let Some(at) = args.at else {
        // Without --at: where the run can be forked.
        let events = store.load(&args.run, 0).await?;
        let points = fork_points(&events);
        if args.json {
            outln!("{}", json!({"run_id": args.run, "fork_points": points}))?;
        } else {
            outln!("run {} can be forked at these events (`--at SEQ`):", args.run)?;
            for seq in &points {
                let e = &events[usize::try_from(*seq - 1).unwrap_or(0)];
                outln!(
                    "  {seq:>5}  {}{}",
                    e.data.kind(),
                    e.level_id.as_deref().map(|l| format!(" {l}")).unwrap_or_default()
                )?;
            }
        }
        return Ok(ExitCode::SUCCESS);
    };
    let probe = baton_app::engines::probe_engine(place, &store, &registry);
    let original = probe.state(&args.run).await?;
    let scenario = match &args.scenario_file {
        Some(file) => {
            baton_app::replay::scenario_file("--scenario-file", file, &original.scenario_id)?
        }
        None => probe.scenario_of(&original, &args.run).await?,
    };
    drive::check_jail(place, &registry, &scenario)?;
    let chosen = baton_app::models::choose_model(
        args.script.as_deref(),
        place.config.as_deref(),
        args.cassette.as_deref(),
        None,
        &scenario,
    )?;
    let tools = baton_app::engines::tools_for(place, chosen.source.as_deref(), None)?;
    let (model, source) = (chosen.model, chosen.source);
    let engine = baton_app::engines::engine(
        store,
        model,
        &registry,
        baton_app::engines::workspace_setup(place, None, None),
        baton_app::engines::redactor(place),
        &baton_app::jail::jail(place),
        Some(jobs),
        None,
        Some(tools),
    );
    let new_run = Engine::new_run_id();
    let edits = ForkEdits { input: args.input, scratchpad, model_source: source };
    engine.fork(&args.run, at, &new_run, &scenario, edits).await?;
    if !args.json {
        outln!("run {new_run}")?;
        outln!("fork of run {} at event {at}", args.run)?;
    }
    let follow = vec![Followed::new(&new_run, at + 1, 0)];
    drive::drive(&engine, &new_run, &scenario, args.json, follow, drive::Driving::Continue).await
}
