//! The embedded workers: they drive jobs, at most [`crate::settings::Settings::workers`] at once.
//!
//! A job is driven from its first run that has not ended (the tree's root, as `baton
//! resume` does) until it ends, waits for a person or for outside agents, or stops. A job
//! asked to be driven while it is being driven is driven once more after (an approval that
//! arrived during the drive is not missed). A drive stopped by a transient failure
//! (`provider_unavailable`, `workspace`) is tried again after a wait that doubles, at most
//! [`crate::settings::Settings::retries_max`] times; each stop is a `run_interrupted` in the run's log
//! and a line on the server's stderr, and past the bound the run stays interrupted with its
//! reason. A run that pauses for an approval with a deadline is driven again when the
//! deadline passes, which records the timeout.
//!
//! When the server starts, every run left `running` that no process holds, every waiting
//! job nobody drives, and every paused run's approval deadline are taken up again; when it
//! stops, the drives are cut through the engines' stop token, which records each run as
//! interrupted (cause `signal`), to be taken up by the next start.
//!
//! The workers' state (slots, the jobs entered, timers) is [`Workers`] in `worker_pool`,
//! which the application state holds; this module drives, through that state.

#![allow(clippy::print_stderr)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use baton_app::Answers;
use baton_app::runs::root_of;
use baton_engine::exec::Error;
use baton_engine::{Outcome, Status};

use crate::app::App;
use crate::worker_pool::Workers;

impl Workers {
    /// Drives the job a run of it belongs to, by its root (so that a decision on a child
    /// run during a drive of its job is driven again after, never lost to a second driver
    /// refused as busy).
    pub(crate) async fn drive_job(&self, app: &Arc<App>, run_id: &str) {
        match root_of(app.store.as_ref(), run_id).await {
            Ok(root) => self.drive(app, &root),
            Err(e) => eprintln!("{}: run {run_id} was not driven: {e}", self.name()),
        }
    }

    /// Drives the job whose root is `run_id`, now or once a worker is free.
    pub(crate) fn drive(&self, app: &Arc<App>, run_id: &str) {
        // A draining server starts no drive: the run waits for the next driver.
        if app.stop.is_cancelled() || app.drain.is_cancelled() || !self.enter(run_id) {
            return;
        }
        self.queue_one();
        let app = Arc::clone(app);
        let run_id = run_id.to_owned();
        tokio::spawn(async move {
            let permit = app.workers.slot().await;
            app.workers.dequeue_one();
            if permit.is_ok() {
                Workers::drive_entered(&app, &run_id).await;
            } else {
                app.workers.leave(&run_id);
            }
        });
    }

    /// Drives a job [`Workers::enter`]ed, again while it was asked again meanwhile.
    async fn drive_entered(app: &Arc<App>, run_id: &str) {
        loop {
            drive_with_retries(app, run_id).await;
            if !app.workers.drive_again(run_id, &app.stop) {
                break;
            }
        }
    }

    /// Takes up what the last server left: runs `running` that nobody holds (unless
    /// `running_by_claims`: a worker claims those one per free slot, under leases), jobs
    /// stopped interrupted or waiting that nobody drives, paused runs' approval deadlines.
    pub(crate) async fn recover(&self, app: &Arc<App>, running_by_claims: bool) {
        let store = &app.store;
        let mut roots = HashSet::new();
        for status in [Status::Running, Status::Interrupted, Status::Waiting, Status::Paused] {
            if status == Status::Running && running_by_claims {
                continue;
            }
            let runs = match store.runs(Some(status.as_str())).await {
                Ok(runs) => runs,
                Err(e) => {
                    eprintln!(
                        "{}: cannot list {} runs to take up: {e}",
                        self.name(),
                        status.as_str()
                    );
                    continue;
                }
            };
            for r in runs {
                if status == Status::Paused {
                    if let Ok(state) = app.state(&r.run_id).await {
                        self.watch_deadlines(app, &r.run_id, &state);
                    }
                    continue;
                }
                if store.is_held(&r.run_id).await.unwrap_or(true) {
                    continue;
                }
                match root_of(store.as_ref(), &r.run_id).await {
                    Ok(root) if roots.insert(root.clone()) => self.drive(app, &root),
                    Ok(_) => {}
                    Err(e) => eprintln!("{}: run {}: {e}", self.name(), r.run_id),
                }
            }
        }
        if !roots.is_empty() {
            eprintln!("{}: taking up {} job(s) the last server left", self.name(), roots.len());
        }
    }

    /// Drives the run again when an open approval's deadline passes.
    pub(crate) fn watch_deadlines(
        &self,
        app: &Arc<App>,
        run_id: &str,
        state: &baton_engine::RunState,
    ) {
        for open in state.open_approvals() {
            let Some(deadline) = open.request.deadline else { continue };
            let key = (run_id.to_owned(), open.request.request_id.clone());
            if !self.start_timer(key.clone()) {
                continue;
            }
            let app = Arc::clone(app);
            let run_id = run_id.to_owned();
            tokio::spawn(async move {
                let wait = (deadline - chrono::Utc::now()).to_std().unwrap_or_default();
                // A moment past it, so the driver's clock reads it past too.
                let wait = wait + Duration::from_millis(50);
                tokio::select! {
                    () = tokio::time::sleep(wait) => {
                        app.workers.end_timer(&key);
                        if let Ok(root) = root_of(app.store.as_ref(), &run_id).await {
                            app.workers.drive(&app, &root);
                        }
                    }
                    () = app.stop.cancelled() => {}
                }
            });
        }
    }
}

/// How often `baton serve` looks for runs nobody drives ([`take_up_undriven`]).
const UNDRIVEN_EVERY: Duration = Duration::from_secs(2);

/// How long a run nobody drives is left to workers before `baton serve` takes it up.
const UNDRIVEN_AFTER: Duration = Duration::from_secs(5);

/// `baton serve`'s own queue: every [`UNDRIVEN_EVERY`], while it has a free slot, it drives
/// the jobs of `running` runs nobody holds and nothing was written to for
/// [`UNDRIVEN_AFTER`] (workers, which claim at once, come first) — runs queued with `baton
/// run --queue` after it started, and runs whose driver died — one page of [`HEAL_PAGE`]
/// at a time. Of two processes that take one up, one drives it (the run's hold); a
/// worker's claimed run is held, so it is left alone.
pub(crate) async fn take_up_undriven(app: Arc<App>) {
    let mut after: Option<String> = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(UNDRIVEN_EVERY) => {}
            () = app.stop.cancelled() => return,
            () = app.drain.cancelled() => return,
        }
        if app.workers.free() == 0 {
            continue;
        }
        let query = baton_engine::store::RunQuery {
            status: Some(Status::Running.as_str().to_owned()),
            after_run: after.take(),
            limit: HEAL_PAGE,
            ..baton_engine::store::RunQuery::default()
        };
        let Ok(page) = app.store.runs_page(&query).await else { continue };
        if page.len() == HEAL_PAGE {
            after = page.last().map(|r| r.run_id.clone());
        }
        let quiet_since = chrono::Utc::now()
            - chrono::Duration::from_std(UNDRIVEN_AFTER).unwrap_or(chrono::Duration::zero());
        for record in page {
            if app.workers.free() == 0 || app.drain.is_cancelled() {
                break;
            }
            if record.updated_at > quiet_since
                || app.store.is_held(&record.run_id).await.unwrap_or(true)
            {
                continue;
            }
            app.workers.drive_job(&app, &record.run_id).await;
        }
    }
}

/// How long a worker that found nothing to claim waits before it looks again.
const CLAIM_IDLE: Duration = Duration::from_millis(200);

/// How often an idle worker looks for interrupted runs to take up again ([`heal`]).
const HEAL_EVERY: Duration = Duration::from_secs(2);

/// Interrupted runs one look reads, at most (the next look goes on after the last).
const HEAL_PAGE: usize = 50;

/// The longest wait before a run interrupted again is taken up again.
const HEAL_WAIT_MAX: Duration = Duration::from_secs(3600);

/// Where [`heal`] looks next, and which runs it said it gives up on.
#[derive(Debug, Default)]
struct Healing {
    after: Option<String>,
    given_up: HashSet<String>,
}

/// Takes up again the runs a driver stopped for a transient cause — every model
/// unavailable, the workspace busy, a signal that cut a drive — that nobody drives: a run
/// interrupted `n` times waits `retry_first` × 2^(n-1) (at most an hour) after its last
/// interruption, and past `retries_max` interruptions it stays interrupted for a person
/// (said once). Each taking-up is the `run_resumed` its driver records; of two workers that
/// take up one run, one drives it (the run's hold). One page of [`HEAL_PAGE`] runs per look.
async fn heal(app: &Arc<App>, healing: &mut Healing, what: &baton_engine::store::Claimable) {
    let query = baton_engine::store::RunQuery {
        status: Some(Status::Interrupted.as_str().to_owned()),
        after_run: healing.after.take(),
        limit: HEAL_PAGE,
        ..baton_engine::store::RunQuery::default()
    };
    let page = match app.store.runs_page(&query).await {
        Ok(page) => page,
        Err(e) => {
            eprintln!("{}: cannot list interrupted runs: {e}", app.workers.name());
            return;
        }
    };
    if page.len() == HEAL_PAGE {
        healing.after = page.last().map(|r| r.run_id.clone());
    }
    let now = chrono::Utc::now();
    for record in page {
        if app.drain.is_cancelled() || app.stop.is_cancelled() {
            return;
        }
        // Only what this worker would claim: its queues, its data dir's runs.
        if healing.given_up.contains(&record.run_id)
            || !what
                .admits(&record.placement.queue, record.placement.home.iter().map(String::as_str))
            || app.store.is_held(&record.run_id).await.unwrap_or(true)
        {
            continue;
        }
        let Ok(state) = app.state(&record.run_id).await else { continue };
        let Some(interrupted) = &state.interrupted else { continue };
        let transient = [
            baton_engine::event::CAUSE_UNAVAILABLE,
            baton_engine::event::CAUSE_WORKSPACE,
            baton_engine::event::CAUSE_SIGNAL,
        ]
        .contains(&interrupted.cause.as_str());
        if !transient {
            continue;
        }
        if state.interruptions > app.settings.retries_max {
            eprintln!(
                "{}: run {} was interrupted {} times ({}); it stays interrupted — continue it with `baton resume {}` once the cause is fixed",
                app.workers.name(),
                record.run_id,
                state.interruptions,
                interrupted.cause,
                record.run_id
            );
            healing.given_up.insert(record.run_id);
            continue;
        }
        let wait = app
            .settings
            .retry_first
            .saturating_mul(1 << state.interruptions.saturating_sub(1).min(20))
            .min(HEAL_WAIT_MAX);
        let due = state.interrupted_at.map_or(now, |at| {
            at + chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::MAX)
        });
        if due > now {
            continue;
        }
        eprintln!(
            "{}: taking up run {} again, interrupted {} time(s) ({})",
            app.workers.name(),
            record.run_id,
            state.interruptions,
            interrupted.cause
        );
        app.workers.drive_job(app, &record.run_id).await;
    }
}

/// The longest wait between tries of a worker whose claims fail (the store is away).
const CLAIM_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// `baton worker`: takes runs that nobody drives from the store, one per free slot, each
/// under a lease renewed every third of its length while its job is driven and given back
/// after — runs queued for workers (`baton run --queue`) and runs whose driver died, once
/// its lease ran out (a run its driver still holds is left to its lease). Returns when
/// `app.stop` is cancelled, or when nothing was claimed or driven for `idle_exit`.
pub(crate) async fn claim_runs(
    app: Arc<App>,
    worker: String,
    lease: Duration,
    idle_exit: Option<Duration>,
    what: baton_engine::store::Claimable,
) {
    let lease_for = chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::seconds(30));
    let mut failures = 0u32;
    let mut idle_since = tokio::time::Instant::now();
    let mut healing = Healing::default();
    let mut healed_at = tokio::time::Instant::now();
    loop {
        let permit = tokio::select! {
            p = app.workers.slot() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            () = app.stop.cancelled() => return,
            () = app.drain.cancelled() => return,
        };
        if app.drain.is_cancelled() {
            return;
        }
        let now = chrono::Utc::now();
        let claiming = std::time::Instant::now();
        let run = match app.store.claim(&worker, now, now + lease_for, &what).await {
            Ok(Some(run)) => {
                failures = 0;
                run
            }
            Ok(None) => {
                drop(permit);
                failures = 0;
                if healed_at.elapsed() >= HEAL_EVERY {
                    heal(&app, &mut healing, &what).await;
                    healed_at = tokio::time::Instant::now();
                }
                if app.workers.active() > 0 {
                    idle_since = tokio::time::Instant::now();
                } else if idle_exit.is_some_and(|idle| idle_since.elapsed() >= idle) {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep(CLAIM_IDLE) => {}
                    () = app.stop.cancelled() => return,
                    () = app.drain.cancelled() => return,
                }
                continue;
            }
            Err(e) => {
                drop(permit);
                failures = failures.saturating_add(1);
                let wait = CLAIM_IDLE.saturating_mul(1 << failures.min(6)).min(CLAIM_BACKOFF_MAX);
                eprintln!(
                    "{}: cannot claim runs ({e}); trying again in {} ms (failure {failures} in a row)",
                    app.workers.name(),
                    wait.as_millis()
                );
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = app.stop.cancelled() => return,
                }
                continue;
            }
        };
        idle_since = tokio::time::Instant::now();
        app.metrics.claimed((chrono::Utc::now() - run.updated_at).to_std().unwrap_or_default());
        eprintln!(
            "{}: claimed run {} ({}) in {:.2} ms",
            app.workers.name(),
            run.run_id,
            run.scenario_id,
            claiming.elapsed().as_secs_f64() * 1e3
        );
        let app = Arc::clone(&app);
        let worker = worker.clone();
        tokio::spawn(async move {
            let _slot = permit;
            drive_claimed(&app, &run.run_id, &worker, lease, lease_for).await;
        });
    }
}

/// Drives the job of a claimed run while renewing the run's lease, then gives the lease
/// back — unless another process drives the job, whose run is left to its lease.
async fn drive_claimed(
    app: &Arc<App>,
    run_id: &str,
    worker: &str,
    lease: Duration,
    lease_for: chrono::Duration,
) {
    let root = match root_of(app.store.as_ref(), run_id).await {
        Ok(root) => root,
        Err(e) => {
            eprintln!("{}: claimed run {run_id} was not driven: {e}", app.workers.name());
            return;
        }
    };
    if app.store.is_held(&root).await.unwrap_or(true) || !app.workers.enter(&root) {
        // Driven by another process (or by this one), which finishes it. The lease is left
        // to run out: given back, the run would be claimed again at once, and again, while
        // that drive lasts (a SQLite store's claim cannot see holds).
        eprintln!(
            "{}: run {run_id} is driven by another process (its job {root}); its lease is left to run out",
            app.workers.name()
        );
        return;
    }
    let renew = async {
        let mut every = tokio::time::interval(lease / 3);
        every.tick().await;
        loop {
            every.tick().await;
            let now = chrono::Utc::now();
            match app.store.renew(run_id, worker, now, now + lease_for).await {
                Ok(true) => {}
                Ok(false) => eprintln!(
                    "{}: the lease on run {run_id} was lost (another worker took it after it ran out); the drive goes on under the run's lock",
                    app.workers.name()
                ),
                Err(e) => {
                    eprintln!(
                        "{}: cannot renew the lease on run {run_id}: {e}",
                        app.workers.name()
                    );
                }
            }
        }
    };
    let started = std::time::Instant::now();
    tokio::select! {
        () = Workers::drive_entered(app, &root) => {}
        () = renew => {}
    }
    let status = match app.store.run(run_id).await {
        Ok(Some(record)) => record.status,
        Ok(None) => "gone".to_owned(),
        Err(e) => format!("unknown ({e})"),
    };
    match app.store.release(run_id, worker).await {
        Ok(()) => eprintln!(
            "{}: run {run_id} is {status} after {} ms of driving; its lease is given back",
            app.workers.name(),
            started.elapsed().as_millis()
        ),
        Err(e) => eprintln!(
            "{}: run {run_id} is {status}; cannot give back its lease: {e}",
            app.workers.name()
        ),
    }
}

/// Drives a job, again after transient stops, within the retry bound.
async fn drive_with_retries(app: &Arc<App>, run_id: &str) {
    let settings = &app.settings;
    let mut wait = settings.retry_first;
    for attempt in 0..=settings.retries_max {
        let outcome = drive_once(app, run_id).await;
        let reason = match outcome {
            Ok(Outcome::Interrupted(reason)) if !app.stop.is_cancelled() => reason,
            Ok(Outcome::Paused) => {
                if let Ok(state) = app.state(run_id).await {
                    app.workers.watch_deadlines(app, run_id, &state);
                }
                // A child that pauses pauses the job: its deadlines are watched too.
                watch_tree_deadlines(app, run_id).await;
                return;
            }
            // Ended, waits for outside agents, or another process drives it (that one
            // finishes it).
            Ok(_) | Err(Error::Store(baton_engine::store::Error::Busy(_))) => return,
            Err(e) => {
                eprintln!("{}: run {run_id} was not driven: {e}", app.workers.name());
                return;
            }
        };
        if attempt == settings.retries_max {
            eprintln!(
                "{}: run {run_id} stopped again ({reason}); it was driven {} times and stays interrupted — continue it with `baton resume {run_id}` once the cause is fixed",
                app.workers.name(),
                attempt + 1
            );
            return;
        }
        eprintln!(
            "{}: run {run_id} stopped ({reason}); trying again in {} ms ({} of {})",
            app.workers.name(),
            wait.as_millis(),
            attempt + 1,
            settings.retries_max
        );
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = app.stop.cancelled() => return,
        }
        wait = wait.saturating_mul(2);
    }
}

/// Watches the approval deadlines of every paused run of a job.
async fn watch_tree_deadlines(app: &Arc<App>, root: &str) {
    let mut pending = vec![root.to_owned()];
    let mut looked = 0;
    while let Some(id) = pending.pop() {
        looked += 1;
        if looked > baton_engine::limits::TREE_RUNS_MAX {
            return;
        }
        let Ok(state) = app.state(&id).await else { continue };
        if state.status == Status::Paused {
            app.workers.watch_deadlines(app, &id, &state);
        }
        pending.extend(state.open_children().map(|c| c.started.child_run_id.clone()));
    }
}

/// One drive of the job `run_id` belongs to.
async fn drive_once(app: &Arc<App>, run_id: &str) -> Result<Outcome, Error> {
    drive_root(app, run_id, None).await
}

/// A drive of the job `run_id` belongs to that is the active dispatcher of its manual
/// waves, under `waves` (a `wave_run` call); `Busy` when another drive holds the job.
pub(crate) async fn drive_waves(
    app: &Arc<App>,
    run_id: &str,
    waves: baton_engine::wave_drive::WaveSettings,
) -> Result<Outcome, Error> {
    drive_root(app, run_id, Some(waves)).await
}

async fn drive_root(
    app: &Arc<App>,
    run_id: &str,
    waves: Option<baton_engine::wave_drive::WaveSettings>,
) -> Result<Outcome, Error> {
    let root = root_of(app.store.as_ref(), run_id).await?;
    let state = app.state(&root).await?;
    if state.status.is_final() {
        return Ok(Outcome::Finished(state.status));
    }
    if state.replay_of.is_some() {
        return Err(Error::Refused {
            run_id: root,
            message: "it replays a recording; continue it with `baton resume`".to_owned(),
        });
    }
    let registry = app
        .registry_for(state.tenant.as_deref())
        .await
        .map_err(|p| Error::Refused { run_id: root.clone(), message: p.detail })?;
    let refused = |message: String| Error::Refused { run_id: root.clone(), message };
    let answers = Answers::Recorded(state.model_source.as_deref());
    let mut engine = match app.baton.engine(Arc::clone(&app.store), answers, &registry) {
        Ok(engine) => engine,
        // A run that calls no model (a wave of outside agents or programs) needs none.
        Err(why) => {
            let engine = app
                .baton
                .engine(Arc::clone(&app.store), Answers::Nothing, &registry)
                .map_err(refused)?;
            let scenario = engine.scenario_of(&state, &root).await?;
            if !baton_engine::exec::calls_no_model(&scenario) {
                return Err(refused(why));
            }
            engine
        }
    };
    engine.stop = app.stop.clone();
    engine.drain = app.drain.clone();
    engine.live = Some(app.live_sink());
    engine.wave_drive = waves;
    engine.process = Arc::from(match &app.settings.driver_name {
        Some(name) => format!("{} {name} ({})", app.settings.name, engine.process),
        None => format!("{} {}", app.settings.name, engine.process),
    });
    let scenario = engine.scenario_of(&state, &root).await?;
    match app.baton.check(&registry, &scenario) {
        Ok(Some(warning)) => app.warn(&warning),
        Ok(None) => {}
        Err(e) => return Err(refused(e.message)),
    }
    engine.drive_tree(&root, &scenario).await
}
