//! Driving jobs at the terminal: `baton run` (a job planned by the application layer,
//! driven here or queued for a worker), `baton resume` and every command that continues a
//! job, following its tree of runs as a timeline and reporting how it ended — the exit
//! codes, the signals that stop a drive, and what the run waits for.

#![allow(clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use baton_engine::event::{Event, EventData};
use baton_engine::job::JobRequest;
use baton_engine::model::{ModelProvider, ScriptedModel};
use baton_engine::pinning::Upgrade;
use baton_engine::store::EventStore;
use baton_engine::{Engine, Outcome, Status};
use baton_scenario::{Registry, Scenario};
use serde_json::{Map, Value, json};
use tokio::sync::oneshot;

use baton_app::engines::{
    WaveDrive, engine, job_settings, probe_engine, redactor, reloading_jobs, workspace_setup,
};
use baton_app::jail::jail;
use baton_app::models::choose_model;
use baton_app::place::{Place, open_existing_store, open_store};
use baton_app::scenarios::registry;

use crate::escape;
use crate::out::outln;
use crate::timeline;

/// Why `name` cannot be a branch (`refs/heads/NAME`), by the rules of `git
/// check-ref-format --branch`; the workspace checks again with git when it names the
/// result, this check only makes a bad name fail before the run instead of after it.
fn check_branch_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("it is empty".to_owned());
    }
    if name.starts_with('-') {
        return Err("it starts with '-'".to_owned());
    }
    if name == "@" {
        return Err("it is '@'".to_owned());
    }
    for bad in ["..", "@{", "//"] {
        if name.contains(bad) {
            return Err(format!("it contains {bad:?}"));
        }
    }
    if let Some(c) = name.chars().find(|c| {
        c.is_ascii_control() || matches!(c, ' ' | '~' | '^' | ':' | '?' | '*' | '[' | '\\')
    }) {
        return Err(format!("it contains {c:?}"));
    }
    if name.starts_with('/') || name.ends_with('/') {
        return Err("it starts or ends with '/'".to_owned());
    }
    if name.ends_with('.') {
        return Err("it ends with '.'".to_owned());
    }
    for part in name.split('/') {
        if part.starts_with('.') {
            return Err(format!("its part {part:?} starts with '.'"));
        }
        if part.ends_with(".lock") {
            return Err(format!("its part {part:?} ends with \".lock\""));
        }
    }
    Ok(())
}

/// Why a file cannot be written at `path` (its directory is missing, or takes no new
/// files), found before a run starts rather than at its first model call.
fn check_writable_file(path: &Path) -> Result<(), String> {
    if path.is_dir() {
        return Err("it is a directory; name a file".to_owned());
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    match std::fs::metadata(dir) {
        Err(e) => {
            return Err(format!(
                "its directory {} cannot be used ({e}); create it or choose another path",
                dir.display()
            ));
        }
        Ok(m) if !m.is_dir() => return Err(format!("{} is not a directory", dir.display())),
        Ok(_) => {}
    }
    // The file is written beside itself and renamed: the directory must take new files.
    let probe = dir.join(format!(".baton-probe-{}", std::process::id()));
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("cannot create files in {}: {e}", dir.display())),
    }
}

/// Before a job starts programs: refused when the jail cannot be set up (for its scenario
/// or the scenarios its waves start), and said out loud when it is off.
pub(crate) fn check_jail(
    place: &Place,
    registry: &Registry,
    scenario: &Arc<Scenario>,
) -> anyhow::Result<()> {
    if let Some(warning) = baton_app::jail::check_jail(place, registry, scenario)? {
        eprintln!("baton: warning: {warning}");
    }
    Ok(())
}

/// Options of `baton run`.
#[derive(Debug)]
pub(crate) struct RunArgs {
    /// What the job asks for: a pin, an intent route, a kind, or nothing (the default).
    pub job: JobRequest,
    /// The job's cost cap, all its runs together.
    pub max_cost_usd: Option<f64>,
    /// Refuse to start when the scenario's forecast p90 cost is over this.
    pub max_forecast_usd: Option<f64>,
    pub settle_timeout_s: Option<f64>,
    pub idempotency_key: Option<String>,
    /// Run the scenarios with this tenant's overrides merged in.
    pub tenant: Option<String>,
    pub input: String,
    pub meta: Vec<(String, String)>,
    pub script: Option<PathBuf>,
    pub json: bool,
    /// Show the text of model answers as it streams in.
    pub stream: bool,
    /// Create the job's first run and leave it to a worker.
    pub queue: bool,
    /// With `queue`: more jobs like the first, one per input (`--input-lines`).
    pub more_inputs: Vec<String>,
    /// Replay model answers from this cassette instead of calling any model.
    pub cassette: Option<PathBuf>,
    /// Record every model answer into this cassette.
    pub record: Option<PathBuf>,
    /// The workspace directory, instead of a new one under the data directory.
    pub workspace: Option<PathBuf>,
    /// Name the completed run's result with this branch of the workspace repository.
    pub branch: Option<String>,
    /// Run this scenario instead of selecting one (a standalone wave's, made by `baton
    /// wave plan`).
    pub given: Option<Arc<Scenario>>,
}

pub(crate) async fn run(place: &Place, args: RunArgs) -> anyhow::Result<ExitCode> {
    // Arguments are checked before anything is created: a bad one never leaves a run.
    if let Some(branch) = &args.branch {
        check_branch_name(branch).map_err(|why| {
            anyhow::anyhow!(
                "--branch {branch:?} is not a valid branch name: {why}; use letters, digits, '-', '_' and '/' (see git check-ref-format)"
            )
        })?;
    }
    if let Some(path) = &args.record {
        check_writable_file(path).map_err(|why| {
            anyhow::anyhow!("cannot record the cassette to {}: {why}", path.display())
        })?;
    }
    let mut metadata = Map::new();
    for (k, v) in args.meta {
        metadata.insert(k, Value::String(v));
    }
    // The job as every surface takes it; its rules (the pin policy, the jail over every
    // scenario it can reach) are the application layer's.
    let request = baton_app::start::JobStart {
        job: args.job,
        input: args.input,
        metadata,
        max_cost_usd: args.max_cost_usd,
        idempotency_key: args.idempotency_key.clone(),
        tenant: args.tenant.clone(),
    };
    baton_app::start::check(&request)?;
    // A tenant's overrides are in the database; with no database yet it has none. Nothing
    // is created before every argument and file has been checked.
    let registry = match &args.tenant {
        Some(tenant) if place.db_exists() => {
            let store = open_existing_store(place).await?;
            baton_app::scenarios::merged(store.as_ref(), registry(place)?, tenant).await?
        }
        _ => registry(place)?,
    };
    let registry = Arc::new(registry);
    let (selection, _, _) = job_settings(place)?;
    let planned = baton_app::start::plan(place, &registry, &selection, request, args.given)?;
    for warning in &planned.warnings {
        eprintln!("baton: warning: {}", escape::one_line(warning));
    }
    let scenario = Arc::clone(&planned.scenario);
    if args.branch.is_some() && !baton_engine::exec::owns_workspace(&scenario) {
        bail!(
            "--branch names the result in the run's workspace, and scenario `{}` has no tool_loop level (no workspace); leave --branch out",
            scenario.id
        );
    }
    if let Some(dir) = &args.workspace
        && !baton_engine::exec::needs_workspace(&scenario)
    {
        bail!(
            "--workspace {}: scenario `{}` reads no files (no tool_loop level, no verifier that runs in a workspace), so the directory would not be used; drop --workspace",
            dir.display(),
            scenario.id
        );
    }
    if let Some(max) = args.max_forecast_usd {
        baton_app::forecast::guard(place, &scenario, max).await?;
    }
    let chosen = choose_model(
        args.script.as_deref(),
        place.config.as_deref(),
        args.cassette.as_deref(),
        args.record.as_deref(),
        &scenario,
    );
    let (model, source) = match chosen {
        // A standalone wave calls no model until `baton wave run` runs its workers, with
        // the model that command is given.
        Err(_)
            if baton_engine::exec::calls_no_model(&scenario)
                && args.script.is_none()
                && args.cassette.is_none() =>
        {
            (Arc::new(ScriptedModel::default()) as Arc<dyn ModelProvider>, None)
        }
        other => other?,
    };
    let store = open_store(place).await?;
    if let Some(key) = &args.idempotency_key
        && let Some(existing) = store.run_by_key(key).await?
    {
        return existing_run(place, store, &existing.run_id, key, args.json).await;
    }
    let jobs = reloading_jobs(
        place,
        store.as_ref(),
        Arc::clone(&registry),
        args.settle_timeout_s,
        args.tenant.as_deref(),
        WaveDrive::default(),
    )
    .await?;
    let mut engine = engine(
        store,
        model,
        &registry,
        workspace_setup(place, args.workspace, args.branch),
        redactor(place),
        jail(place),
        Some(jobs),
    );
    if args.stream {
        engine.live = Some(timeline::live_sink());
    }
    // The id is printed by the timeline once the store holds the run (see `drive`): a run
    // that fails before its first commit (its workspace cannot be opened, say) was never
    // created, and its id would name nothing.
    let run_id = Engine::new_run_id();
    let first = baton_engine::job::Start { model_source: source, ..planned.start };
    if args.queue {
        let code = queue(place, &engine, &run_id, &scenario, first.clone(), args.json).await?;
        for input in args.more_inputs {
            let start = baton_engine::job::Start { input, ..first.clone() };
            queue(place, &engine, &Engine::new_run_id(), &scenario, start, args.json).await?;
        }
        return Ok(code);
    }
    let follow = vec![Followed::new(&run_id, 0, 0)];
    match drive(&engine, &run_id, &scenario, args.json, follow, Driving::Start(Box::new(first)))
        .await
    {
        // Another process started a job with this key between the look above and here.
        Err(e) => match (e.downcast_ref::<baton_engine::exec::Error>(), &args.idempotency_key) {
            (
                Some(baton_engine::exec::Error::Store(baton_engine::store::Error::KeyTaken {
                    run_id,
                    ..
                })),
                Some(key),
            ) => {
                let run_id = run_id.clone();
                existing_run(place, Arc::clone(&engine.store), &run_id, key, args.json).await
            }
            _ => Err(e),
        },
        done => done,
    }
}

/// The most jobs one `--input-lines` file queues.
const INPUT_LINES_MAX: usize = 100_000;

/// The inputs of `--input-lines`: each non-empty line of the file, at least one.
pub(crate) fn input_lines(path: &Path) -> anyhow::Result<Vec<String>> {
    let bytes_max = 64 * 1024 * 1024;
    let text = baton_scenario::capped::read_text(path, bytes_max)
        .map_err(|e| anyhow::anyhow!("--input-lines: {e}"))?;
    let lines: Vec<String> =
        text.lines().filter(|l| !l.trim().is_empty()).map(str::to_owned).collect();
    if lines.is_empty() {
        bail!(
            "--input-lines {}: no line holds an input; write one job's input per line",
            path.display()
        );
    }
    if lines.len() > INPUT_LINES_MAX {
        bail!(
            "--input-lines {}: {} jobs, more than {INPUT_LINES_MAX} at once; split the file",
            path.display(),
            lines.len()
        );
    }
    Ok(lines)
}

/// `baton run --queue`: the job's first run is created, durable and `running`, and left to
/// a worker.
async fn queue(
    place: &Place,
    engine: &Engine,
    run_id: &str,
    scenario: &Arc<Scenario>,
    first: baton_engine::job::Start,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let key = first.idempotency_key.clone();
    match engine.create_job(run_id, scenario, first).await {
        Ok(()) => {}
        Err(baton_engine::exec::Error::Store(baton_engine::store::Error::KeyTaken {
            run_id: taken,
            ..
        })) => {
            let key = key.unwrap_or_default();
            return existing_run(place, Arc::clone(&engine.store), &taken, &key, json).await;
        }
        Err(e) => return Err(e.into()),
    }
    if json {
        outln!("{}", json!({"run_id": run_id, "status": "running", "queued": true}))?;
    } else {
        outln!("run {run_id}")?;
        outln!(
            "queued: a `baton worker` on {} drives it (or `baton resume {run_id}`)",
            place.db_shown()
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A job started again with its idempotency key: the first one's run, as it stands — its
/// result, or what it waits for — and no new run.
async fn existing_run(
    place: &Place,
    store: Arc<dyn EventStore>,
    run_id: &str,
    key: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    eprintln!(
        "baton: run {run_id} was started with idempotency key {}; no new run was started",
        escape::one_line(&format!("{key:?}"))
    );
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
    if !json {
        outln!("run {run_id}")?;
    }
    report(&engine, run_id, &outcome, json).await?;
    Ok(exit_code(&outcome))
}

/// Continues a run on the scenario version it started with (or was last moved to), which
/// the store keeps; with `upgrade`, moves it to the scenario's current version first.
pub(crate) async fn resume(
    place: &Place,
    run_id: &str,
    script: Option<&Path>,
    json: bool,
    upgrade: bool,
    waves: WaveDrive,
) -> anyhow::Result<ExitCode> {
    let resumed = baton_app::runs::resume(place, run_id, script, upgrade, waves).await?;
    match &resumed.upgrade {
        Some(Upgrade::Moved(u)) if json => {
            eprintln!("run {run_id} moved from version {} to {}", u.from_version, u.version);
        }
        Some(Upgrade::Current) => eprintln!(
            "run {run_id} already is on the current version of scenario `{}`; nothing to upgrade",
            resumed.scenario.id
        ),
        _ => {}
    }
    if let Some(warning) = &resumed.jail_warning {
        eprintln!("baton: warning: {warning}");
    }
    let (engine, root) = (&resumed.engine, &resumed.root);
    // Show the decision or answer that led here, then what follows.
    let mut follow = Vec::new();
    for (id, depth) in baton_app::runs::tree_of(engine.store.as_ref(), root, true).await? {
        let last = engine.store.run(&id).await?.map_or(0, |r| r.last_seq);
        let after = if id == run_id { last.saturating_sub(1) } else { last };
        follow.push(Followed::new(&id, after, depth));
    }
    let how = match resumed.replay {
        Some(recorded) => Driving::Replay(recorded),
        None => Driving::Continue,
    };
    drive(engine, root, &resumed.root_scenario, json, follow, how).await
}

/// How [`drive`] drives a job.
#[derive(Debug)]
pub(crate) enum Driving {
    /// A new job, from what it starts with.
    Start(Box<baton_engine::job::Start>),
    /// A job that exists.
    Continue,
    /// A replay that exists: the recording's decisions it has not made yet are made.
    Replay(Box<baton_engine::replay::Tree>),
}

pub(crate) async fn drive(
    engine: &Engine,
    run_id: &str,
    scenario: &Arc<Scenario>,
    json: bool,
    follow: Vec<Followed>,
    how: Driving,
) -> anyhow::Result<ExitCode> {
    let start = match &how {
        Driving::Start(s) => Some(s),
        _ => None,
    };
    // Print events as they land — the runs the job starts too, nested under the event
    // that started each — from another task reading the store; a new run's id heads them,
    // so it is printed only once the store holds the run.
    let printer = (!json).then(|| {
        let mut unannounced = start.is_some().then(|| run_id.to_owned());
        Printer::spawn(Arc::clone(&engine.store), follow, move |id, depth, e| {
            if let Some(id) = unannounced.take() {
                outln!("run {id}")?;
            }
            print_timeline(e, depth, id)
        })
    });
    let signals = tokio::spawn(stop_on_signal(engine.stop.clone()));
    let outcome = match how {
        Driving::Start(s) => engine.run_job(run_id, scenario, *s).await,
        Driving::Continue => engine.drive_tree(run_id, scenario).await,
        Driving::Replay(recorded) => engine.resume_replay(run_id, scenario, &recorded).await,
    };
    signals.abort();
    // The engine has returned: everything it wrote is in the store, and the printer reads
    // it to the end before it stops.
    let printed = match printer {
        Some(printer) => printer.finish().await,
        None => Ok(()),
    };
    let outcome = outcome?;
    printed?;
    report(engine, run_id, &outcome, json).await?;
    Ok(exit_code(&outcome))
}

/// What a job came to: its JSON result, or what it waits for, why it stopped or its output.
pub(crate) async fn report(
    engine: &Engine,
    run_id: &str,
    outcome: &Outcome,
    json: bool,
) -> anyhow::Result<()> {
    let state = engine.state(run_id).await?;
    let mut runs = Vec::new();
    for (id, depth) in baton_app::runs::tree_of(engine.store.as_ref(), run_id, false).await? {
        let s = if id == run_id { state.clone() } else { engine.state(&id).await? };
        runs.push((id, depth, s));
    }
    if json {
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
        outln!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "run_id": run_id,
                "scenario_id": state.scenario_id,
                "status": state.status.as_str(),
                "final_output": state.final_output,
                "aborted_reason": state.finished.as_ref().and_then(|f| f.aborted_reason.clone()),
                "totals": state.totals,
                "tree_totals": state.tree_totals(),
                "checksum": state.checksum,
                "selected": state.selected,
                "pending_approvals": open_approvals(&state),
                "pending_question": state.pending_ask,
                "tree": tree,
            }))?
        )?;
    } else if *outcome == Outcome::Paused {
        let waiting: Vec<&(String, usize, baton_engine::RunState)> =
            runs.iter().filter(|(_, _, s)| s.awaiting_person()).collect();
        let who = waiting.first().map_or(run_id, |(id, _, _)| id.as_str());
        outln!(
            "paused: run {who} waits for a person; continue with `baton approve {who}` or `baton answer {who} --answer JSON`"
        )?;
        for (id, _, s) in waiting {
            for line in waiting_lines(s, id) {
                outln!("  {line}")?;
            }
        }
    } else if *outcome == Outcome::Waiting
        && let Some(w) = baton_engine::wave_actions::wave_under_way(&state)
        && state.open_children().next().is_none()
    {
        let c = w.counts();
        let decision = w.decide(false, engine.wave_settings().parallel_for(w));
        let next = if decision.is_final() {
            format!(
                "its decision is `{}`: end it with `baton wave complete {run_id}`",
                decision.as_str()
            )
        } else {
            format!(
                "dispatch with `baton wave dispatch {run_id}`, record with `baton wave record {run_id}`, or run its workers with `baton wave run {run_id}`"
            )
        };
        outln!(
            "waiting: wave {run_id} (level `{}`) waits for outside agents: {} planned, {} in flight, {} settled; {next}",
            escape::one_line(&w.level_id),
            c.planned,
            c.in_flight,
            c.assignments - c.planned - c.in_flight
        )?;
    } else if *outcome == Outcome::Waiting {
        let children: Vec<String> = state
            .open_children()
            .map(|c| format!("{} ({})", c.started.child_run_id, c.started.scenario_id))
            .collect();
        outln!(
            "waiting: run {run_id} waits for the runs it started: {}; see them with `baton runs --tree`, continue with `baton resume {run_id}`",
            escape::one_line(&children.join(", "))
        )?;
    } else if let Outcome::Interrupted(reason) = outcome {
        outln!(
            "interrupted: run {run_id} stopped without ending ({}); nothing is lost — continue it with `baton resume {run_id}`",
            escape::one_line(reason)
        )?;
    } else if let Some(output) = &state.final_output {
        outln!("output:\n{}", escape::terminal_safe(output, escape::Layout::Block))?;
    }
    Ok(())
}

/// Stops the engine's drives at the first SIGINT or SIGTERM: the running step is cut and
/// awaited (its processes killed), and the run is recorded as interrupted, to be resumed.
async fn stop_on_signal(stop: baton_engine::cancel::CancelToken) {
    stop_on_signals(
        stop,
        "baton: stopping — the running step is cut and the run recorded as interrupted (press Ctrl-C again to exit at once)",
        "baton: exiting at once; the run stays resumable",
    )
    .await;
}

/// Cancels `stop` at the first SIGINT or SIGTERM, saying `stopping`; a second exits at once,
/// saying `exiting` — the jails die with this process (their first process is tied to
/// it), and runs are left as they are, resumable.
pub(crate) async fn stop_on_signals(
    stop: baton_engine::cancel::CancelToken,
    stopping: &str,
    exiting: &str,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) =
        (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    else {
        return;
    };
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    eprintln!("{stopping}");
    stop.cancel();
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    eprintln!("{exiting}");
    std::process::exit(130);
}

/// The approval requests a run waits for, as JSON.
pub(crate) fn open_approvals(state: &baton_engine::RunState) -> Value {
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

/// One line per approval request a run waits for: id, level, prompt summary, command.
pub(crate) fn waiting_lines(state: &baton_engine::RunState, run_id: &str) -> Vec<String> {
    state
        .open_approvals()
        .map(|p| {
            let deadline = p.request.deadline.map_or(String::new(), |d| {
                format!(" (decide by {}, or it times out)", d.format("%Y-%m-%d %H:%M:%S UTC"))
            });
            escape::one_line(&format!(
                "approval {} (level `{}`, role {}): {} — `baton approve {run_id} --request {}`{deadline}",
                p.request.request_id,
                p.level_id,
                p.request.approver_role,
                baton_engine::decide::summary(&p.request.question),
                p.request.request_id
            ))
        })
        .collect()
}

/// How often a follower looks for new events.
const FOLLOW_POLL: Duration = Duration::from_millis(50);

pub(crate) fn print_event(e: &Event, as_json: bool) -> std::io::Result<()> {
    if as_json {
        outln!("{}", timeline::json_line(e))?;
    } else if let Some(line) = timeline::line(e) {
        outln!("{}", timeline::styled(&line))?;
    }
    Ok(())
}

/// An event of a run `depth` levels below the job's first: a timeline line indented by
/// its depth, or — with `run_id` — a JSON line naming its run.
/// A timeline line at its depth in the tree; a nested run's lines begin with the start of
/// its id, since the runs of a wave print side by side.
pub(crate) fn print_timeline(e: &Event, depth: usize, run_id: &str) -> std::io::Result<()> {
    let Some(line) = timeline::line(e) else { return Ok(()) };
    if depth == 0 {
        return outln!("{}", timeline::styled(&line));
    }
    let short: String = run_id.chars().take(8).collect();
    outln!("{}{short} {}", "    ".repeat(depth), timeline::styled(&line))
}

/// An event as a JSON line naming its run.
pub(crate) fn print_json_line(e: &Event, run_id: &str) -> std::io::Result<()> {
    let mut line: Value = serde_json::from_str(&timeline::json_line(e)).unwrap_or_default();
    if let Value::Object(map) = &mut line {
        map.insert("run_id".to_owned(), json!(run_id));
    }
    outln!("{line}")
}

/// A run whose events a follower emits, from `after` on.
pub(crate) struct Followed {
    run_id: String,
    after: u64,
    depth: usize,
    /// Its end has been emitted.
    done: bool,
}

impl Followed {
    pub(crate) fn new(run_id: &str, after: u64, depth: usize) -> Self {
        Followed { run_id: run_id.to_owned(), after, depth, done: false }
    }
}

/// Emits the events of a run and of the runs it starts, after each one's `after`, as
/// they arrive, until the first run ends or — with `stop` — until told to stop; then it
/// reads the logs once more, so every event written before the stop is emitted, once and
/// in order. A child's events come right after the event that started it, and all of them
/// before its parent's `child_run_settled`. It stops early, quietly, once standard
/// output's reader has gone (nothing it emits could be read).
pub(crate) async fn follow(
    store: &dyn EventStore,
    mut runs: Vec<Followed>,
    nested: bool,
    mut stop: Option<oneshot::Receiver<()>>,
    mut emit: impl FnMut(&str, usize, &Event) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    let mut stopping = false;
    loop {
        // Whether a parent's log stopped at a child's settlement that must come first.
        let mut held_back = false;
        let mut emitted = 0;
        let mut i = 0;
        while i < runs.len() {
            if runs[i].done {
                i += 1;
                continue;
            }
            let events = match store.load(&runs[i].run_id, runs[i].after).await {
                Ok(events) => events,
                // A new run is written with its first level's results: wait for it (and a
                // run that failed before it was written has nothing to show).
                Err(baton_engine::store::Error::NotFound(_)) => Vec::new(),
                Err(e) => return Err(e.into()),
            };
            // A run followed from its end (it had ended before) has no end left to emit —
            // once the record says it ended with nothing past what was read (it may have
            // ended between the read above and this look).
            if events.is_empty()
                && let Some(record) = store.run(&runs[i].run_id).await?
                && is_final(&record.status)
                && record.last_seq <= runs[i].after
            {
                runs[i].done = true;
            }
            emitted += events.len();
            for e in &events {
                if let EventData::ChildRunSettled(c) = &e.data
                    && runs.iter().any(|r| r.run_id == c.child_run_id && !r.done)
                {
                    held_back = true;
                    break;
                }
                emit(&runs[i].run_id, runs[i].depth, e)?;
                if crate::out::closed() {
                    return Ok(());
                }
                runs[i].after = e.seq;
                if let EventData::ChildRunStarted(c) = &e.data
                    && nested
                    && !runs.iter().any(|r| r.run_id == c.child_run_id)
                {
                    let depth = runs[i].depth + 1;
                    runs.push(Followed::new(&c.child_run_id, 0, depth));
                }
                if matches!(e.data, EventData::ScenarioFinished(_)) {
                    runs[i].done = true;
                }
            }
            i += 1;
        }
        if runs.first().is_none_or(|r| r.done) {
            return Ok(());
        }
        if held_back && emitted > 0 {
            continue;
        }
        if stopping {
            if !held_back {
                return Ok(());
            }
            tokio::time::sleep(FOLLOW_POLL).await;
            continue;
        }
        match stop.as_mut() {
            // A sent stop and a dropped sender both mean: read to the end, then stop.
            Some(rx) => tokio::select! {
                _ = rx => stopping = true,
                () = tokio::time::sleep(FOLLOW_POLL) => {}
            },
            None => tokio::time::sleep(FOLLOW_POLL).await,
        }
    }
}

/// Whether a listed status is a run's end.
pub(crate) fn is_final(status: &str) -> bool {
    [Status::Completed, Status::Aborted, Status::Cancelled, Status::Failed]
        .iter()
        .any(|s| s.as_str() == status)
}

/// A task printing a tree's events while another drives it.
struct Printer {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Printer {
    fn spawn(
        store: Arc<dyn EventStore>,
        runs: Vec<Followed>,
        emit: impl FnMut(&str, usize, &Event) -> std::io::Result<()> + Send + 'static,
    ) -> Printer {
        let (stop, stopped) = oneshot::channel();
        let task =
            tokio::spawn(
                async move { follow(store.as_ref(), runs, true, Some(stopped), emit).await },
            );
        Printer { stop, task }
    }

    /// Stops the printer once it has emitted every event in the store, and waits for it.
    async fn finish(self) -> anyhow::Result<()> {
        // The task may have ended already (at the end of the run): nobody to tell then.
        let _ = self.stop.send(());
        self.task.await.map_err(|e| anyhow::anyhow!("the event printer stopped: {e}"))?
    }
}

pub(crate) fn exit_code(outcome: &Outcome) -> ExitCode {
    match outcome {
        // A job whose tree waits on a child some other process drives is, here, paused.
        Outcome::Paused | Outcome::Waiting => ExitCode::from(3),
        Outcome::Interrupted(_) => ExitCode::from(6),
        Outcome::Finished(Status::Completed) => ExitCode::SUCCESS,
        Outcome::Finished(Status::Aborted) => ExitCode::from(4),
        Outcome::Finished(Status::Cancelled) => ExitCode::from(5),
        Outcome::Finished(_) => ExitCode::from(1),
    }
}

/// Refuses a `--by` or `--reason` given empty.
pub(crate) fn check_who_and_why(by: Option<&str>, reason: Option<&str>) -> anyhow::Result<()> {
    for (flag, value) in [("--by", by), ("--reason", reason)] {
        if value.is_some_and(|v| v.trim().is_empty()) {
            bail!("{flag} is empty; give a value or leave the flag out");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Mutex;

    use baton_engine::event::{NewEvent, Warning};
    use baton_engine::store::{MemoryStore, RunRecord};
    use chrono::Utc;

    use super::*;

    fn warning(seq: u64) -> Event {
        NewEvent::run(EventData::Warning(Warning { message: format!("w{seq}") }))
            .at(seq, Utc::now())
    }

    #[tokio::test]
    async fn the_printer_emits_every_event_written_before_it_is_stopped_once_and_in_order() {
        let store: Arc<dyn EventStore> = Arc::new(MemoryStore::default());
        let now = Utc::now();
        let record = RunRecord {
            run_id: "r".to_owned(),
            scenario_id: "s".to_owned(),
            status: "running".to_owned(),
            created_at: now,
            updated_at: now,
            last_seq: 0,
            parent_run_id: None,
            root_run_id: None,
            idempotency_key: None,
            tenant: None,
        };
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        // Started before the run exists, as `baton run` does.
        let printer =
            Printer::spawn(Arc::clone(&store), vec![Followed::new("r", 0, 0)], move |_, _, e| {
                sink.lock().unwrap().push(e.seq);
                Ok(())
            });
        store.create_run(&record, vec![warning(1)]).await.unwrap();
        while seen.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        // Written while the printer sleeps between polls, then stopped at once.
        store.append("r", 2, vec![warning(2), warning(3)], "running").await.unwrap();
        store.append("r", 4, vec![warning(4)], "paused").await.unwrap();
        printer.finish().await.unwrap();
        assert_eq!(*seen.lock().unwrap(), [1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn a_printer_stopped_before_its_run_was_written_emits_nothing() {
        let store: Arc<dyn EventStore> = Arc::new(MemoryStore::default());
        let runs = vec![Followed::new("never", 0, 0)];
        let printer = Printer::spawn(store, runs, |_, _, _| panic!("nothing to print"));
        printer.finish().await.unwrap();
    }

    #[test]
    fn branch_names_follow_git_check_ref_format() {
        for ok in ["main", "feature/x", "v1.2", "a-b_c", "result@home", "ü"] {
            assert_eq!(check_branch_name(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("", "it is empty"),
            ("bad..name", "it contains \"..\""),
            ("-x", "it starts with '-'"),
            ("@", "it is '@'"),
            ("a@{1}", "it contains \"@{\""),
            ("a//b", "it contains \"//\""),
            ("a b", "it contains ' '"),
            ("a~1", "it contains '~'"),
            ("a^", "it contains '^'"),
            ("a:b", "it contains ':'"),
            ("a?", "it contains '?'"),
            ("a*", "it contains '*'"),
            ("a[b", "it contains '['"),
            ("a\\b", "it contains '\\\\'"),
            ("a\tb", "it contains '\\t'"),
            ("/a", "it starts or ends with '/'"),
            ("a/", "it starts or ends with '/'"),
            ("a.", "it ends with '.'"),
            ("x/.hidden", "its part \".hidden\" starts with '.'"),
            ("a.lock/b", "its part \"a.lock\" ends with \".lock\""),
        ] {
            assert_eq!(check_branch_name(bad), Err(why.to_owned()), "{bad:?}");
        }
    }
}
