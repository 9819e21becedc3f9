//! Driving jobs at the terminal: `baton run` (a job planned by the application layer,
//! driven here or queued for a worker), `baton resume` and every command that continues a
//! job, following its tree of runs as a timeline and reporting how it ended — the exit
//! codes, the signals that stop a drive, and what the run waits for.

#![allow(clippy::print_stderr)]

use std::ops::ControlFlow;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use baton_app::engines::WaveDrive;
use baton_app::follow::{Followed, Follower};
use baton_app::place::Place;
use baton_app::start::{JobStart, Ready, Setup};
use baton_engine::event::Event;
use baton_engine::pinning::Upgrade;
use baton_engine::store::EventStore;
use baton_engine::{Engine, Outcome, Status};
use baton_scenario::{Registry, Scenario};
use serde_json::{Value, json};

use crate::escape;
use crate::out::{self, outln};
use crate::timeline;

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
    /// The job as every surface takes it.
    pub request: JobStart,
    /// Its model, files and guards.
    pub setup: Setup,
    pub json: bool,
    /// Show the text of model answers as it streams in.
    pub stream: bool,
    /// Create the job's first run and leave it to a worker, waiting here.
    pub queue: Option<baton_engine::store::Placement>,
    /// With `queue`: more jobs like the first, one per input (`--input-lines`).
    pub more_inputs: Vec<String>,
}

pub(crate) async fn run(place: &Place, args: RunArgs) -> anyhow::Result<ExitCode> {
    let RunArgs { request, mut setup, json, .. } = args;
    // The job's rules (the pin policy, the jail over every scenario it can reach) are the
    // application layer's; its warnings are said before anything else can fail.
    let key = request.idempotency_key.clone().unwrap_or_default();
    let (planned, registry) = baton_app::start::plan_job(place, request, &mut setup).await?;
    for warning in &planned.warnings {
        eprintln!("baton: warning: {}", escape::one_line(warning));
    }
    let scenario = Arc::clone(&planned.scenario);
    let (mut engine, first) =
        match baton_app::start::ready(place, planned, &registry, setup).await? {
            Ready::New { engine, first } => (engine, first),
            Ready::Taken { store, run_id } => {
                return existing_run(place, store, &run_id, &key, json).await;
            }
        };
    if args.stream {
        engine.live = Some(timeline::live_sink());
    }
    // The id is printed by the timeline once the store holds the run (see `drive`): a run
    // that fails before its first commit (its workspace cannot be opened, say) was never
    // created, and its id would name nothing.
    let run_id = Engine::new_run_id();
    if let Some(placement) = &args.queue {
        let code =
            queue(place, &engine, &run_id, &scenario, (*first).clone(), placement, json).await?;
        for input in args.more_inputs {
            let start = baton_engine::job::Start { input, ..(*first).clone() };
            queue(place, &engine, &Engine::new_run_id(), &scenario, start, placement, json).await?;
        }
        return Ok(code);
    }
    let follow = vec![Followed::new(&run_id, 0, 0)];
    let keyed = first.idempotency.is_some().then(|| (*first).clone());
    match (drive(&engine, &run_id, &scenario, json, follow, Driving::Start(first)).await, keyed) {
        // Another process started a job with this key between the look above and here.
        (Err(e), Some(start)) => {
            let store = Arc::clone(&engine.store);
            let run_id = baton_app::start::taken_meanwhile(e, store.as_ref(), &start).await?;
            existing_run(place, store, &run_id, &key, json).await
        }
        (done, _) => done,
    }
}

/// `baton run --queue`: the job's first run is created, durable and `running`, and left to
/// a worker.
async fn queue(
    place: &Place,
    engine: &Engine,
    run_id: &str,
    scenario: &Arc<Scenario>,
    first: baton_engine::job::Start,
    placement: &baton_engine::store::Placement,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let key = first.idempotency.as_ref().map(|c| c.key.clone()).unwrap_or_default();
    if let baton_app::start::Queued::Taken(taken) =
        baton_app::start::queue(engine, run_id, scenario, first, placement).await?
    {
        return existing_run(place, Arc::clone(&engine.store), &taken, &key, json).await;
    }
    if json {
        outln!(
            "{}",
            json!({"run_id": run_id, "status": "running", "queued": true, "queue": placement.queue, "priority": placement.priority})
        )?;
    } else {
        outln!("run {run_id}")?;
        outln!(
            "queued: a `baton worker` on {} taking queue {} drives it (or `baton resume {run_id}`)",
            place.db_shown(),
            placement.queue
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
    let (engine, outcome) = baton_app::runs::standing(place, store, run_id).await?;
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
    let follow = baton_app::follow::resumed(engine.store.as_ref(), root, run_id).await?;
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
        Follower::spawn(Arc::clone(&engine.store), follow, move |id, depth, e| {
            if let Some(id) = unannounced.take() {
                outln!("run {id}")?;
            }
            going_on(print_timeline(e, depth, id))
        })
    });
    let signals = stop_on_signal(engine.stop.clone());
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
    let baton_app::runs::JobTree { state, runs } =
        baton_app::runs::job_tree(engine, run_id).await?;
    if json {
        let result = baton_app::runs::result_json(run_id, &state, &runs);
        outln!("{}", serde_json::to_string_pretty(&result)?)?;
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
    } else if let Some(output) = &state.session.final_output {
        outln!("output:\n{}", escape::terminal_safe(output, escape::Layout::Block))?;
    }
    Ok(())
}

/// Stops the engine's drives at the first SIGINT or SIGTERM: the running step is cut and
/// awaited (its processes killed), and the run is recorded as interrupted, to be resumed.
/// The signals are listened for from this call on.
fn stop_on_signal(stop: baton_engine::cancel::CancelToken) -> tokio::task::JoinHandle<()> {
    spawn_stop_on_signals(
        stop,
        "baton: stopping — the running step is cut and the run recorded as interrupted (press Ctrl-C again to exit at once)",
        "baton: exiting at once; the run stays resumable",
    )
}

/// Listens for SIGINT and SIGTERM from this call on, and cancels `stop` at the first,
/// saying `stopping`; a second exits at once, saying `exiting` — the jails die with this
/// process (their first process is tied to it), and runs are left as they are, resumable.
pub(crate) fn spawn_stop_on_signals(
    stop: baton_engine::cancel::CancelToken,
    stopping: &str,
    exiting: &str,
) -> tokio::task::JoinHandle<()> {
    let signals = Signals::listen();
    let (stopping, exiting) = (stopping.to_owned(), exiting.to_owned());
    tokio::spawn(async move {
        let Some(mut signals) = signals else { return };
        signals.next().await;
        stop_on_signals_after_one(stop, &stopping, &exiting, signals).await;
    })
}

/// This process's interrupt and terminate signals, listened for from the moment this is
/// made: one that comes before anything awaits it is kept — not lost, and not left to end
/// the process the default way, as it would while a worker is still starting.
pub(crate) struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    /// The listeners (none when they cannot be set up; the signals then act as they would
    /// without Baton).
    pub(crate) fn listen() -> Option<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(interrupt), Ok(terminate)) =
            (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
        else {
            return None;
        };
        Some(Self { interrupt, terminate })
    }

    /// Waits for the next interrupt or terminate signal.
    pub(crate) async fn next(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// Once a first signal came: cancels `stop`, saying `stopping`; the next signal exits at
/// once, saying `exiting`.
pub(crate) async fn stop_on_signals_after_one(
    stop: baton_engine::cancel::CancelToken,
    stopping: &str,
    exiting: &str,
    mut signals: Signals,
) {
    eprintln!("{stopping}");
    stop.cancel();
    signals.next().await;
    eprintln!("{exiting}");
    std::process::exit(130);
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

/// Whether a follower goes on after `printed`: not once standard output's reader has gone
/// (nothing it prints could be read).
pub(crate) fn going_on(printed: std::io::Result<()>) -> std::io::Result<ControlFlow<()>> {
    printed.map(|()| if out::closed() { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
}

pub(crate) fn exit_code(outcome: &Outcome) -> ExitCode {
    match outcome {
        // A job whose tree waits on a child some other process drives is, here, paused.
        Outcome::Paused | Outcome::Waiting => ExitCode::from(3),
        Outcome::Interrupted(_) | Outcome::Released => ExitCode::from(6),
        Outcome::Finished(Status::Completed) => ExitCode::SUCCESS,
        Outcome::Finished(Status::Aborted) => ExitCode::from(4),
        Outcome::Finished(Status::Cancelled) => ExitCode::from(5),
        Outcome::Finished(_) => ExitCode::from(1),
    }
}
