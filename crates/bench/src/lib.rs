//! `baton bench`: the kernel's speed and cost on fixed workloads. Each workload comes back
//! as a report (a JSON object of figures) for the CLI to print.
//!
//! The model is scripted with zero latency and answers every call with the same
//! 235-character text starting with `PASS:`, so what is measured is the engine and its
//! store. Workloads: `linear5` (5 prompt levels in a chain), `gate_loop` (brief → execute
//! → verify → accept, looping back until accept has run 3 times: 10 level executions),
//! `fanout8` (plan → a fan-out of 8 prompt children with majority_pass: 10), `approval`
//! (draft → human approval → finalize, decided and resumed by a fresh engine over the same
//! store, as a restart would), `resume` (runs paused and decided, then all continued by a
//! fresh store and engine over the same database, as a new process takes them up), `paused` (runs left waiting for an approval: how much
//! memory each paused run holds), `reopen` (a run of 10 000 events reopened from the
//! store and planned), `chain3` (a job of three runs, each a one-level scenario whose
//! JSON answer chains the job to the next, as child runs: what a hop costs beside a level),
//! `wave` (a wave of 8 assignments, at most 3 at once, each a one-level worker run: the
//! CPU and commits per assignment beyond what the same worker costs run alone), `takeover`
//! (PostgreSQL: how long after a driver dies another process holds its run), `jail`
//! (what the jail adds to each program a verifier starts), and `http` (`baton serve` from
//! outside: starts per second and event-stream delivery, in `http.rs`).
//!
//! Stores: `memory`, `sqlite`, and `postgres` (a schema of its own in `--bench-db URL`,
//! dropped after; `--workers N` stores, each with its own connections and `--concurrency`
//! runs in flight, share the runs).
//! Every durable figure is printed with the store's durability setting and the disk's
//! fsync floor measured in the same run. CPU is the process's CPU clock
//! (`CLOCK_PROCESS_CPUTIME_ID`, to the nanosecond): the measured loop's, and the whole
//! process's beside it, with the share spent in the kernel.

#![allow(clippy::cast_precision_loss)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use baton_engine::clock::SystemClock;
use baton_engine::job::{Jobs, Start};
use baton_engine::model::ScriptedModel;
use baton_engine::runner::Runtime;
use baton_engine::store::{EventStore, MemoryStore};
use baton_engine::verifier::Verifiers;
use baton_engine::{Engine, Outcome, Status};
use baton_scenario::{Registry, Scenario};
use baton_store::SqliteStore;
use baton_store::postgres::{PostgresStore, ScratchSchema};
use serde_json::{Map, json};

mod hash;
mod http;
mod probe;
mod processes;

use probe::{
    cpu_time, durability, fsync_floor, peak_rss_kib, percentile, rss_kib, system_share, uuid_like,
};

/// The model's fixed answer: 235 characters, starting with `PASS:`.
fn answer() -> String {
    let mut text = String::from(
        "PASS: the work matches the brief, every acceptance criterion holds and nothing else changed. ",
    );
    while text.len() < 235 {
        text.push_str("All good. ");
    }
    text.truncate(235);
    text
}

const LINEAR5: &str = "
id: linear5
version: 1
levels:
  - {id: l1, kind: prompt, prompt: {inline: 'One {{ input }}'}}
  - {id: l2, kind: prompt, prompt: {inline: 'Two {{ level.l1.output }}'}}
  - {id: l3, kind: prompt, prompt: {inline: 'Three'}}
  - {id: l4, kind: prompt, prompt: {inline: 'Four'}}
  - {id: l5, kind: prompt, prompt: {inline: 'Five'}, terminal: true}
edges:
  - {from: l1, to: l2}
  - {from: l2, to: l3}
  - {from: l3, to: l4}
  - {from: l4, to: l5}
";

const GATE_LOOP: &str = "
id: gate_loop
version: 1
levels:
  - {id: brief, kind: prompt, prompt: {inline: 'Brief {{ input }}'}}
  - {id: execute, kind: prompt, prompt: {inline: 'Execute'}}
  - {id: verify, kind: prompt, prompt: {inline: 'Verify'}, response: verdict}
  - {id: accept, kind: prompt, prompt: {inline: 'Accept'}, response: verdict, terminal: true}
edges:
  - {from: brief, to: execute}
  - {from: execute, to: verify}
  - {from: verify, to: accept}
  - {from: accept, to: execute, when: 'level.accept.attempts < 3'}
  - {from: accept, to: __end__}
";

const FANOUT8: &str = "
id: fanout8
version: 1
levels:
  - {id: plan, kind: prompt, prompt: {inline: 'Plan {{ input }}'}}
  - id: review
    kind: fan_out
    fan_out: [c1, c2, c3, c4, c5, c6, c7, c8]
    fan_in: {aggregator: majority_pass}
  - {id: c1, kind: prompt, prompt: {inline: C1}, response: verdict}
  - {id: c2, kind: prompt, prompt: {inline: C2}, response: verdict}
  - {id: c3, kind: prompt, prompt: {inline: C3}, response: verdict}
  - {id: c4, kind: prompt, prompt: {inline: C4}, response: verdict}
  - {id: c5, kind: prompt, prompt: {inline: C5}, response: verdict}
  - {id: c6, kind: prompt, prompt: {inline: C6}, response: verdict}
  - {id: c7, kind: prompt, prompt: {inline: C7}, response: verdict}
  - {id: c8, kind: prompt, prompt: {inline: C8}, response: verdict}
edges:
  - {from: plan, to: review}
";

/// `reopen`'s run: two levels in a loop of 850 rounds, about 10 000 events of the kinds
/// every run writes (levels, prompts, answers, verdicts, budgets, gates).
const LONG_LOOP: &str = "
id: long_loop
version: 1
budget: {max_level_runs: 2000}
levels:
  - {id: work, kind: prompt, prompt: {inline: 'Work {{ input }}'}}
  - {id: check, kind: prompt, prompt: {inline: 'Check'}, response: verdict, terminal: true}
edges:
  - {from: work, to: check}
  - {from: check, to: work, when: 'level.check.attempts < 850'}
  - {from: check, to: __end__}
";

const APPROVAL: &str = "
id: approval
version: 1
levels:
  - {id: draft, kind: prompt, prompt: {inline: 'Draft {{ input }}'}}
  - {id: approve, kind: human_approval}
  - {id: finalize, kind: prompt, prompt: {inline: 'Final'}, terminal: true}
edges:
  - {from: draft, to: approve}
  - {from: approve, to: finalize}
";

/// `chain3`: three one-level scenarios, each answering with the route of the next.
const CHAIN3: [(&str, &str); 3] = [
    (
        "c1",
        "id: c1\nversion: 1\nlevels:\n  - {id: route, kind: prompt, prompt: {inline: 'Route {{ input }}'}, response: json, terminal: true}\n",
    ),
    (
        "c2",
        "id: c2\nversion: 1\nlevels:\n  - {id: route, kind: prompt, prompt: {inline: 'Route {{ input }}'}, response: json, terminal: true}\n",
    ),
    (
        "c3",
        "id: c3\nversion: 1\nlevels:\n  - {id: say, kind: prompt, prompt: {inline: 'Say {{ input }}'}, terminal: true}\n",
    ),
];

/// `chain3`'s model: c1 routes to c2, c2 to c3, c3 answers.
const CHAIN3_SCRIPT: &str = "scenarios:\n  c1:\n    levels:\n      route: [{text: '{\"chosen_intent_route\": \"c2\"}'}]\n  c2:\n    levels:\n      route: [{text: '{\"chosen_intent_route\": \"c3\"}'}]\n";

/// Options of `baton bench`.
#[derive(Clone, Debug)]
pub struct BenchArgs {
    pub workload: String,
    pub store: String,
    pub runs: usize,
    pub concurrency: usize,
    pub db: Option<PathBuf>,
    /// Measure this many times and report medians.
    pub repeat: usize,
    /// Stores sharing the runs (PostgreSQL: each with connections of its own, as the
    /// worker processes of a deployment have).
    pub workers: usize,
    /// With --store postgres: this many `baton worker` processes drive a queue the bench
    /// fills (0: the runs are driven in this process).
    pub processes: usize,
    /// With `processes`: how long each model call takes.
    pub model_latency_ms: u64,
    /// Where the `jail` workload sets its jail up (its data directory is a fresh one).
    pub place: baton_app::place::Place,
}

fn scenario(yaml: &str, dir: &Path) -> anyhow::Result<Arc<Scenario>> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("workload.yaml"), yaml)?;
    let loaded =
        Registry::load(&[dir]).map_err(|e| anyhow::anyhow!("{}", e.diagnostics.render()))?;
    loaded.registry.scenarios().next().cloned().context("the workload scenario did not load")
}

fn engine(store: Arc<dyn EventStore>) -> Engine {
    engine_with(store, None)
}

/// An engine for the workloads; with `jobs`, it starts child runs (`chain3`).
fn engine_with(store: Arc<dyn EventStore>, jobs: Option<Arc<Jobs>>) -> Engine {
    let model = match &jobs {
        Some(_) => ScriptedModel::parse(CHAIN3_SCRIPT, "chain3")
            .unwrap_or_else(|_| ScriptedModel::constant(answer())),
        None => ScriptedModel::constant(answer()),
    };
    // The last hop answers with the fixed text, like every other workload's levels.
    let model = model.with_level(
        "say",
        vec![baton_engine::model::ScriptedResponse {
            text: Some(answer()),
            ..baton_engine::model::ScriptedResponse::default()
        }],
    );
    Engine::new(
        store,
        Arc::new(Runtime {
            jobs,
            model: Arc::new(model),
            verifiers: Verifiers::builtin(),
            workspace: PathBuf::from("."),
            workspaces: None,
            catalog: Arc::new(serde_json::Value::Array(Vec::new())),
            redactor: std::sync::Arc::new(baton_engine::redact::Verbatim),
            runner: std::sync::Arc::new(baton_runners::Runners),
            tools: None,
        }),
        Arc::new(SystemClock),
    )
}

async fn one_run(
    e: &Engine,
    scenario: Arc<Scenario>,
    approval: bool,
    levels: u32,
) -> anyhow::Result<(Duration, u32)> {
    let started = Instant::now();
    let store = Arc::clone(&e.store);
    let run = Engine::new_run_id();
    let mut outcome = if e.runtime.jobs.is_some() {
        let start = Start { input: "bench".to_owned(), ..Start::default() };
        e.run_job(&run, &scenario, start).await?
    } else {
        e.run(&run, &scenario, "bench", Map::new(), None).await?
    };
    if approval {
        if outcome != Outcome::Paused {
            bail!("the approval workload did not pause");
        }
        // A fresh engine over the same store decides and resumes, as a restart would.
        let fresh = engine_with(store, e.runtime.jobs.clone());
        fresh.approve(&run, true, None, Some("bench".to_owned())).await?;
        outcome = fresh.drive(&run, &scenario).await?;
    }
    if outcome != Outcome::Finished(Status::Completed) {
        let reason = e.state(&run).await?.finished.and_then(|f| f.aborted_reason);
        bail!("a bench run ended {outcome:?}: {}", reason.unwrap_or_default());
    }
    Ok((started.elapsed(), levels))
}

/// Runs the bench `args` asks for and gives its report: one measurement, or with
/// `repeat` the median of each figure over that many (each on a fresh store).
pub async fn bench(args: BenchArgs) -> anyhow::Result<serde_json::Value> {
    if args.workload == "http" {
        return http::bench(args.runs, args.concurrency).await;
    }
    if args.workload == "takeover" {
        return takeover(&args).await;
    }
    if args.workload == "jail" {
        return jail_cost(&args).await;
    }
    if args.workload == "hash" {
        return Ok(hash::hash_cost());
    }
    if args.processes > 0 {
        return fleet(&args).await;
    }
    if matches!(args.workload.as_str(), "reopen" | "paused" | "resume") || args.repeat <= 1 {
        return measure(&args).await;
    }
    // Each repetition on a fresh store; the report gives every figure's median.
    let mut reports = Vec::with_capacity(args.repeat);
    for _ in 0..args.repeat {
        reports.push(measure(&args).await?);
    }
    let mut median = reports[0].clone();
    if let Some(map) = median.as_object_mut() {
        for (key, value) in map.iter_mut() {
            if value.is_f64() {
                let mut xs: Vec<f64> =
                    reports.iter().filter_map(|r| r[key.as_str()].as_f64()).collect();
                xs.sort_by(f64::total_cmp);
                *value = json!(xs[xs.len() / 2]);
            }
        }
        map.insert("repeats".to_owned(), json!(args.repeat));
    }
    Ok(median)
}

/// `--processes N`: the workload's jobs queued on a PostgreSQL schema of the bench's own,
/// driven by N `baton worker` processes (see `processes`).
async fn fleet(args: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    let (yaml, levels_per_run) = match args.workload.as_str() {
        "linear5" => (LINEAR5, 5),
        "gate_loop" => (GATE_LOOP, 10),
        "fanout8" => (FANOUT8, 10),
        other => bail!(
            "--processes measures linear5, gate_loop or fanout8 (no approval, no child runs), not `{other}`"
        ),
    };
    let url = args
        .db
        .as_ref()
        .and_then(|p| p.to_str())
        .filter(|u| args.store == "postgres" && baton_store::postgres::is_url(u))
        .context("--processes starts `baton worker` processes on PostgreSQL: give --store postgres --bench-db postgres://USER@HOST:PORT/DATABASE")?;
    let schema = ScratchSchema::create(url, "procs").await?;
    let tmp = std::env::temp_dir().join(format!("baton-bench-{}", uuid_like()));
    let scenario = scenario(yaml, &tmp.join("scenarios"))?;
    let store = Arc::new(PostgresStore::connect(&schema.url).await?);
    let fleet = processes::Fleet {
        url: schema.url.clone(),
        workload: args.workload.clone(),
        processes: args.processes,
        concurrency: args.concurrency,
        runs: args.runs,
        model_latency_ms: args.model_latency_ms,
        levels_per_run,
        answer: answer(),
        tmp: tmp.clone(),
        scenario,
        filler: engine(Arc::clone(&store) as Arc<dyn EventStore>),
        store,
    };
    let report = processes::measure(fleet).await;
    let _ = std::fs::remove_dir_all(&tmp);
    drop(schema);
    report
}

/// One measurement of a workload.
async fn measure(args: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    if args.workload == "wave" {
        return wave_overhead(args).await;
    }
    let yaml = match args.workload.as_str() {
        "linear5" => LINEAR5,
        "gate_loop" => GATE_LOOP,
        "fanout8" => FANOUT8,
        "approval" | "paused" | "resume" => APPROVAL,
        "reopen" => LONG_LOOP,
        "chain3" => CHAIN3[0].1,
        other => {
            bail!(
                "unknown workload `{other}`: use linear5, gate_loop, fanout8, approval, paused, resume, reopen, chain3, wave, takeover, jail, hash or http"
            )
        }
    };
    // The whole measurement's CPU, every thread, from here to the end of its loop.
    let measurement0 = cpu_time();
    let tmp = std::env::temp_dir().join(format!("baton-bench-{}", uuid_like()));
    let scenario = scenario(yaml, &tmp.join("scenarios"))?;
    // The runs a `chain3` job chains to, from their own registry.
    let jobs = if args.workload == "chain3" {
        let dir = tmp.join("chain3");
        std::fs::create_dir_all(&dir)?;
        for (id, yaml) in CHAIN3 {
            std::fs::write(dir.join(format!("{id}.yaml")), yaml)?;
        }
        let loaded =
            Registry::load(&[&dir]).map_err(|e| anyhow::anyhow!("{}", e.diagnostics.render()))?;
        let selection = baton_engine::job::Selection {
            default: "c1".to_owned(),
            fallback: "c3".to_owned(),
            classifier: "c1".to_owned(),
            classify_kinds: Vec::new(),
        };
        Some(Arc::new(Jobs::new(
            Arc::new(loaded.registry),
            selection,
            dir,
            Duration::from_secs(15),
        )))
    } else {
        None
    };
    let stores = bench_stores(args, &tmp).await?;
    let (store, sqlite) = (Arc::clone(&stores.stores[0]), stores.sqlite.clone());
    if args.workload == "reopen" {
        return reopen(store, &scenario).await;
    }
    if args.workload == "paused" {
        let report = paused(&stores, &scenario, args.runs).await;
        drop(stores);
        let _ = std::fs::remove_dir_all(&tmp);
        return report;
    }
    if args.workload == "resume" {
        let report = resume(args, &stores, &scenario).await;
        drop(stores);
        let _ = std::fs::remove_dir_all(&tmp);
        return report;
    }
    let approval = args.workload == "approval";
    // Level executions per run of each workload.
    let levels_per_run = match args.workload.as_str() {
        "linear5" => 5,
        "approval" | "chain3" => 3,
        _ => 10,
    };
    // Check the count once, from the log of a first run (a job's whole tree).
    {
        let e = engine_with(Arc::new(MemoryStore::new()), jobs.clone());
        one_run(&e, Arc::clone(&scenario), approval, 0).await?;
        let runs = e.store.runs(None).await?;
        let run =
            runs.iter().find(|r| r.parent_run_id.is_none()).context("the check run is missing")?;
        let counted = e.state(&run.run_id).await?.tree_totals().levels_run;
        if counted != levels_per_run {
            bail!("workload {} ran {counted} levels, expected {levels_per_run}", args.workload);
        }
    }
    // One run on the bench's own store, then the process's resident memory, idle.
    let first = engine_with(Arc::clone(&stores.stores[0]), jobs.clone());
    one_run(&first, Arc::clone(&scenario), approval, levels_per_run).await?;
    drop(first);
    let rss_one_run = rss_kib();
    // What the store holds before the measured runs (its tables, that run): the figure per
    // run is what the runs add.
    let bytes0 = store_size(&stores).await?;
    let cpu0 = cpu_time();
    let commits0 = stores.commits();
    let syncs0 = sqlite.as_ref().map_or(0, SqliteStore::syncs);
    let frames0 = sqlite.as_ref().map_or(0, SqliteStore::wal_frames);
    let wall = Instant::now();
    // Each store drives `--concurrency` runs at once, as a `baton worker --concurrency N`
    // process does: `--workers 4 --concurrency 25` has 100 runs in flight.
    let concurrency = args.concurrency.max(1);
    let in_flight = concurrency * stores.stores.len();
    let per_worker = args.runs.div_ceil(in_flight);
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..in_flight {
        let n = per_worker.min(args.runs.saturating_sub(w * per_worker));
        let e = engine_with(Arc::clone(&stores.stores[w % stores.stores.len()]), jobs.clone());
        let scenario = Arc::clone(&scenario);
        tasks.spawn(async move {
            let mut results = Vec::with_capacity(n);
            for _ in 0..n {
                results.push(one_run(&e, Arc::clone(&scenario), approval, levels_per_run).await?);
            }
            anyhow::Ok(results)
        });
    }
    let mut latencies = Vec::with_capacity(args.runs);
    let mut levels = 0u64;
    while let Some(joined) = tasks.join_next().await {
        for (latency, l) in joined.context("a bench task panicked")?? {
            latencies.push(latency);
            levels += u64::from(l);
        }
    }
    let wall = wall.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    let measurement = cpu_time().saturating_sub(measurement0);
    latencies.sort_unstable();
    let runs = latencies.len();
    let store_bytes = store_size(&stores).await?.saturating_sub(bytes0);
    let commits = stores.commits() - commits0;
    let syncs = sqlite.as_ref().map_or(0, SqliteStore::syncs) - syncs0;
    let frames = sqlite.as_ref().map_or(0, SqliteStore::wal_frames) - frames0;
    let durable = sqlite.is_some() || !stores.postgres.is_empty();
    let mut report = json!({
        "workload": args.workload,
        "store": args.store,
        "runs": runs,
        "concurrency": concurrency,
        "in_flight": in_flight,
        "levels": levels,
        "wall_s": wall.as_secs_f64(),
        "runs_per_s": runs as f64 / wall.as_secs_f64(),
        "levels_per_s": levels as f64 / wall.as_secs_f64(),
        "run_latency_p50_ms": percentile(&latencies, 50.0).as_secs_f64() * 1e3,
        "run_latency_p99_ms": percentile(&latencies, 99.0).as_secs_f64() * 1e3,
        "wall_us_per_level": wall.as_secs_f64() * 1e6 / levels.max(1) as f64,
        "cpu_us_per_level": cpu.as_secs_f64() * 1e6 / levels.max(1) as f64,
        // The whole measurement (the store opened, the check run, every thread of the
        // store), beside the loop's own figure above.
        "process_cpu_s": measurement.as_secs_f64(),
        "process_cpu_us_per_level": measurement.as_secs_f64() * 1e6 / levels.max(1) as f64,
        "process_system_share": system_share(),
        // Resident memory after one run on the store, idle; and the most it reached.
        "rss_after_one_run_mib": rss_one_run as f64 / 1024.0,
        "peak_rss_mib": peak_rss_kib() as f64 / 1024.0,
        // The store's growth over the measured runs, per run (SQLite: the database file
        // and its WAL after a checkpoint; PostgreSQL: the schema's relations).
        "store_bytes_per_run": store_bytes as f64 / runs.max(1) as f64,
        // Stores in this one process, each with connections of its own, sharing the runs
        // with no queue, claim or lease (`--processes` measures worker processes).
        "workers": stores.stores.len(),
        "mode": "in-process stores",
        "commits_per_level": durable.then(|| commits as f64 / levels.max(1) as f64),
        "fsyncs_per_level": (sqlite.is_some()).then(|| syncs as f64 / levels.max(1) as f64),
        // Pages written to SQLite's WAL per level (each a page of the database).
        "wal_pages_per_level": (sqlite.is_some()).then(|| frames as f64 / levels.max(1) as f64),
    });
    durability(&mut report, sqlite.as_ref())?;
    if let Some(pg) = stores.postgres.first() {
        postgres_durability(&mut report, pg, &tmp).await?;
    }
    drop(stores);
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(report)
}

/// What a PostgreSQL figure stood on: the server's `synchronous_commit` and the fsync floor
/// of this machine's disk, measured now in the bench's temporary directory (the server's
/// data directory is its own).
async fn postgres_durability(
    report: &mut serde_json::Value,
    pg: &PostgresStore,
    tmp: &Path,
) -> anyhow::Result<()> {
    let setting = pg.setting("synchronous_commit").await?;
    std::fs::create_dir_all(tmp)?;
    let (p50, p99) = fsync_floor(tmp)?;
    if let Some(map) = report.as_object_mut() {
        map.insert("postgres_synchronous_commit".to_owned(), json!(setting));
        map.insert("fsync_floor_p50_ms".to_owned(), json!(p50));
        map.insert("fsync_floor_p99_ms".to_owned(), json!(p99));
        map.insert("fsync_floor_dir".to_owned(), json!(tmp.display().to_string()));
    }
    Ok(())
}

/// The stores a measurement runs on (`--store`, `--workers` of them for PostgreSQL), with
/// the concrete ones for their counters.
struct BenchStores {
    stores: Vec<Arc<dyn EventStore>>,
    sqlite: Option<SqliteStore>,
    postgres: Vec<Arc<PostgresStore>>,
    /// The PostgreSQL schema the measurement runs in, dropped with it.
    _schema: Option<ScratchSchema>,
}

impl BenchStores {
    /// Write transactions committed so far, every store together.
    fn commits(&self) -> u64 {
        self.sqlite.as_ref().map_or(0, SqliteStore::commits)
            + self.postgres.iter().map(|p| p.commits()).sum::<u64>()
    }
}

/// The bytes the bench's store takes now: SQLite's database file and WAL after a
/// checkpoint, PostgreSQL's relations, or the memory store's events as JSON.
async fn store_size(stores: &BenchStores) -> anyhow::Result<u64> {
    Ok(match (&stores.sqlite, stores.postgres.first()) {
        (_, Some(pg)) => pg.bytes().await?,
        (Some(s), _) => {
            s.checkpoint().await?;
            let p = s.path();
            let size = |suffix: &str| {
                std::fs::metadata(format!("{}{suffix}", p.display())).map_or(0, |m| m.len())
            };
            size("") + size("-wal")
        }
        (None, None) => {
            let store = &stores.stores[0];
            let mut bytes = 0u64;
            for r in store.runs(None).await? {
                for e in store.load(&r.run_id, 0).await? {
                    bytes += serde_json::to_vec(&e).map_or(0, |v| v.len() as u64);
                }
            }
            bytes
        }
    })
}

async fn bench_stores(args: &BenchArgs, tmp: &Path) -> anyhow::Result<BenchStores> {
    let workers = args.workers.max(1);
    if workers > 1 && args.store != "postgres" {
        bail!(
            "--workers is for --store postgres (each worker a store with connections of its own)"
        );
    }
    Ok(match args.store.as_str() {
        "memory" => BenchStores {
            stores: vec![Arc::new(MemoryStore::new())],
            sqlite: None,
            postgres: Vec::new(),
            _schema: None,
        },
        "sqlite" => {
            let path = args.db.clone().unwrap_or_else(|| tmp.join("bench.db"));
            let s = SqliteStore::open(&path)?;
            BenchStores {
                stores: vec![Arc::new(s.clone())],
                sqlite: Some(s),
                postgres: Vec::new(),
                _schema: None,
            }
        }
        "postgres" => {
            let url = args
                .db
                .as_ref()
                .and_then(|p| p.to_str())
                .filter(|u| baton_store::postgres::is_url(u))
                .context(
                    "--store postgres needs --bench-db postgres://USER@HOST:PORT/DATABASE (the bench works in a schema of its own there and drops it after)",
                )?;
            let schema = ScratchSchema::create(url, "bench").await?;
            let mut postgres = Vec::with_capacity(workers);
            for _ in 0..workers {
                postgres.push(Arc::new(PostgresStore::connect(&schema.url).await?));
            }
            BenchStores {
                stores: postgres.iter().map(|p| Arc::clone(p) as Arc<dyn EventStore>).collect(),
                sqlite: None,
                postgres,
                _schema: Some(schema),
            }
        }
        other => bail!("unknown store `{other}`: use memory, sqlite or postgres"),
    })
}

/// `takeover` (PostgreSQL): how long after a driver dies another process holds its run. A
/// driver with connections of its own takes a run's hold, then dies (its runtime is shut
/// down, its connections closed, as a killed process's are); the other store tries the
/// hold every millisecond until it has it.
async fn takeover(args: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    if args.store != "postgres" {
        bail!("the takeover workload measures PostgreSQL: give --store postgres --bench-db URL");
    }
    let tmp = std::env::temp_dir().join(format!("baton-bench-{}", uuid_like()));
    let stores = bench_stores(&BenchArgs { workers: 1, ..args.clone() }, &tmp).await?;
    let survivor = Arc::clone(&stores.postgres[0]);
    let url = stores._schema.as_ref().map(|s| s.url.clone()).context("no schema")?;
    let mut took = Vec::with_capacity(args.runs);
    for i in 0..args.runs.clamp(1, 1000) {
        let run = format!("takeover-{i}");
        let (url, id) = (url.clone(), run.clone());
        // The dying driver: a runtime of its own, shut down with the hold taken.
        let died = tokio::task::spawn_blocking(move || -> anyhow::Result<Instant> {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                let store = PostgresStore::connect(&url).await?;
                let guard = store.hold(&id).await?;
                std::mem::forget((guard, store));
                anyhow::Ok(())
            })?;
            runtime.shutdown_background();
            Ok(Instant::now())
        })
        .await??;
        loop {
            match survivor.hold(&run).await {
                Ok(_) => break,
                Err(baton_engine::store::Error::Busy(_)) => {
                    if died.elapsed() > Duration::from_secs(60) {
                        bail!("run {run} was not taken over within 60 s");
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
        took.push(died.elapsed());
    }
    took.sort_unstable();
    drop(stores);
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(json!({
        "workload": "takeover",
        "store": "postgres",
        "takeovers": took.len(),
        "takeover_p50_ms": percentile(&took, 50.0).as_secs_f64() * 1e3,
        "takeover_p99_ms": percentile(&took, 99.0).as_secs_f64() * 1e3,
        "takeover_max_ms": took.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
    }))
}

/// The `wave` workload's worker: one prompt level.
const WAVE_WORKER: &str = "id: w1\nversion: 1\nlevels:\n  - {id: say, kind: prompt, prompt: {inline: 'Say {{ input }}'}, terminal: true}\n";
/// The `wave` workload's wave: its assignments from the input, at most 3 workers at once.
const WAVE: &str = "id: wv\nversion: 1\nlevels:\n  - {id: build, kind: wave, terminal: true, wave: {worker: w1, max_parallel: 3}}\nedges:\n  - {from: build, to: __end__, when: \"wave.decision == 'complete'\"}\n  - {from: build, to: __fail__}\n";
/// Assignments in each `wave` job.
const WAVE_ASSIGNMENTS: usize = 8;

/// `wave`: what a wave adds to each assignment beyond its worker's own run. The same
/// worker scenario runs `runs` times alone, then `runs / 8` waves of 8 run it as child runs;
/// the difference per assignment, in CPU and in commits, is the orchestration's overhead.
async fn wave_overhead(args: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    let tmp = std::env::temp_dir().join(format!("baton-bench-{}", uuid_like()));
    let dir = tmp.join("scenarios");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("w1.yaml"), WAVE_WORKER)?;
    std::fs::write(dir.join("wv.yaml"), WAVE)?;
    let loaded =
        Registry::load(&[&dir]).map_err(|e| anyhow::anyhow!("{}", e.diagnostics.render()))?;
    let registry = Arc::new(loaded.registry);
    let (worker, wave) = match (registry.get("w1"), registry.get("wv")) {
        (Some(w), Some(v)) => (Arc::clone(w), Arc::clone(v)),
        _ => bail!("the wave workload's scenarios did not load"),
    };
    let selection = baton_engine::job::Selection {
        default: "wv".to_owned(),
        fallback: "w1".to_owned(),
        classifier: "wv".to_owned(),
        classify_kinds: Vec::new(),
    };
    let jobs = Arc::new(Jobs::new(Arc::clone(&registry), selection, dir, Duration::from_secs(15)));
    let stores = bench_stores(args, &tmp).await?;
    let (store, sqlite) = (Arc::clone(&stores.stores[0]), stores.sqlite.clone());
    let e = engine_with(Arc::clone(&store), Some(jobs));
    let tasks: Vec<String> = (1..=WAVE_ASSIGNMENTS)
        .map(|i| format!("{{\"id\": \"t{i}\", \"title\": \"task {i}\"}}"))
        .collect();
    let input = format!("{{\"tasks\": [{}]}}", tasks.join(", "));
    let commits = || stores.commits();
    let durable = sqlite.is_some() || !stores.postgres.is_empty();
    // The worker alone.
    let workers = args.runs.max(1);
    let (cpu0, commits0) = (cpu_time(), commits());
    for _ in 0..workers {
        let run = Engine::new_run_id();
        let outcome = e.run(&run, &worker, &input, Map::new(), None).await?;
        if outcome != Outcome::Finished(Status::Completed) {
            bail!("a worker run ended {outcome:?}");
        }
    }
    let alone_cpu = cpu_time().saturating_sub(cpu0).as_secs_f64() / workers as f64;
    let alone_commits = (commits() - commits0) as f64 / workers as f64;
    // The same worker, as the assignments of waves.
    let waves = workers.div_ceil(WAVE_ASSIGNMENTS).max(1);
    let (cpu0, commits0) = (cpu_time(), commits());
    let wall = Instant::now();
    let mut latencies = Vec::with_capacity(waves);
    for _ in 0..waves {
        let started = Instant::now();
        let run = Engine::new_run_id();
        let start = Start { input: input.clone(), ..Start::default() };
        let outcome = e.run_job(&run, &wave, start).await?;
        if outcome != Outcome::Finished(Status::Completed) {
            let reason = e.state(&run).await?.finished.and_then(|f| f.aborted_reason);
            bail!("a bench wave ended {outcome:?}: {}", reason.unwrap_or_default());
        }
        let done = e.state(&run).await?.waves.get("build").map_or(0, |w| w.counts().completed);
        if done as usize != WAVE_ASSIGNMENTS {
            bail!("a bench wave completed {done} assignments, not {WAVE_ASSIGNMENTS}");
        }
        latencies.push(started.elapsed());
    }
    let wall = wall.elapsed();
    let assignments = (waves * WAVE_ASSIGNMENTS) as f64;
    let wave_cpu = cpu_time().saturating_sub(cpu0).as_secs_f64() / assignments;
    let wave_commits = (commits() - commits0) as f64 / assignments;
    latencies.sort_unstable();
    let mut report = json!({
        "workload": "wave",
        "store": args.store,
        "runs": waves,
        "assignments_per_wave": WAVE_ASSIGNMENTS,
        "max_parallel": 3,
        "worker_runs_alone": workers,
        "wall_s": wall.as_secs_f64(),
        "wave_latency_p50_ms": percentile(&latencies, 50.0).as_secs_f64() * 1e3,
        "wave_latency_p99_ms": percentile(&latencies, 99.0).as_secs_f64() * 1e3,
        "cpu_us_per_assignment": wave_cpu * 1e6,
        "cpu_us_per_worker_alone": alone_cpu * 1e6,
        "overhead_cpu_us_per_assignment": (wave_cpu - alone_cpu) * 1e6,
        "commits_per_assignment": durable.then_some(wave_commits),
        "commits_per_worker_alone": durable.then_some(alone_commits),
        "overhead_commits_per_assignment": durable.then_some(wave_commits - alone_commits),
        "peak_rss_mib": peak_rss_kib() as f64 / 1024.0,
    });
    durability(&mut report, sqlite.as_ref())?;
    if let Some(pg) = stores.postgres.first() {
        postgres_durability(&mut report, pg, &tmp).await?;
    }
    drop(stores);
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(report)
}

/// Runs left waiting for an approval: the process keeps nothing of them (they live in
/// the store), so its memory does not grow with their number.
async fn paused(
    stores: &BenchStores,
    scenario: &Arc<Scenario>,
    runs: usize,
) -> anyhow::Result<serde_json::Value> {
    let e = engine(Arc::clone(&stores.stores[0]));
    let bytes0 = store_size(stores).await?;
    let warm = (runs / 10).max(1);
    let mut rss_warm = 0;
    for i in 0..runs {
        let run = Engine::new_run_id();
        if e.run(&run, scenario, "bench", Map::new(), None).await? != Outcome::Paused {
            bail!("the approval workload did not pause");
        }
        if i + 1 == warm {
            rss_warm = rss_kib();
        }
    }
    let rss_end = rss_kib();
    let growth = rss_end.saturating_sub(rss_warm) as f64 * 1024.0 / (runs - warm).max(1) as f64;
    let bytes = store_size(stores).await?.saturating_sub(bytes0);
    let report = json!({
        "workload": "paused",
        "paused_runs": runs,
        "store_bytes_per_paused_run": bytes as f64 / runs.max(1) as f64,
        "rss_after_warmup_mib": rss_warm as f64 / 1024.0,
        "rss_at_end_mib": rss_end as f64 / 1024.0,
        "rss_growth_bytes_per_paused_run": growth,
    });
    Ok(report)
}

/// `resume`: `runs` approval runs are started, paused and decided (as approvals recorded
/// by another process leave them), then a fresh store over the same database — a new
/// process's view — and a fresh engine continue them all to their end, `concurrency` at
/// once: how fast a process takes up work it did not start.
async fn resume(
    args: &BenchArgs,
    stores: &BenchStores,
    scenario: &Arc<Scenario>,
) -> anyhow::Result<serde_json::Value> {
    let e = engine(Arc::clone(&stores.stores[0]));
    let mut decided = Vec::with_capacity(args.runs);
    for _ in 0..args.runs {
        let run = Engine::new_run_id();
        if e.run(&run, scenario, "bench", Map::new(), None).await? != Outcome::Paused {
            bail!("the resume workload's run did not pause");
        }
        e.approve(&run, true, None, Some("bench".to_owned())).await?;
        decided.push(run);
    }
    drop(e);
    // A fresh view of the same database, as a new process opens it.
    let fresh: Arc<dyn EventStore> = match (&stores.sqlite, stores._schema.as_ref()) {
        (Some(s), _) => Arc::new(SqliteStore::open_existing(s.path())?),
        (None, Some(schema)) => Arc::new(PostgresStore::connect(&schema.url).await?),
        (None, None) => Arc::clone(&stores.stores[0]),
    };
    let cpu0 = cpu_time();
    let wall = Instant::now();
    let concurrency = args.concurrency.max(1);
    let queue = Arc::new(std::sync::Mutex::new(decided));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let e = engine(Arc::clone(&fresh));
        let (queue, scenario) = (Arc::clone(&queue), Arc::clone(scenario));
        tasks.spawn(async move {
            loop {
                let next = queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner).pop();
                let Some(run) = next else { return anyhow::Ok(()) };
                let outcome = e.drive(&run, &scenario).await?;
                if outcome != Outcome::Finished(Status::Completed) {
                    bail!("a resumed run ended {outcome:?}");
                }
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.context("a bench task panicked")??;
    }
    let wall = wall.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    Ok(json!({
        "workload": "resume",
        "store": args.store,
        "runs": args.runs,
        "concurrency": concurrency,
        "wall_s": wall.as_secs_f64(),
        "resumed_runs_per_s": args.runs as f64 / wall.as_secs_f64(),
        "cpu_us_per_resumed_run": cpu.as_secs_f64() * 1e6 / args.runs.max(1) as f64,
    }))
}

/// A run of 10 000 events, reopened from the store and planned.
async fn reopen(
    store: Arc<dyn EventStore>,
    scenario: &Arc<Scenario>,
) -> anyhow::Result<serde_json::Value> {
    // A real run's log: the loop driven to its end, one level's events per append.
    let e = engine(Arc::clone(&store));
    let run = Engine::new_run_id();
    let outcome = e.run(&run, scenario, "bench", Map::new(), None).await?;
    if outcome != Outcome::Finished(Status::Completed) {
        bail!("the reopen workload's run ended {outcome:?}");
    }
    let events = store.load(&run, 0).await?.len();
    let mut times = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let fresh = engine(Arc::clone(&store));
        let state = fresh.state(&run).await?;
        let step = baton_engine::plan::plan(scenario, &state);
        std::hint::black_box(step);
        times.push(t.elapsed());
    }
    times.sort_unstable();
    let report = json!({
        "workload": "reopen",
        "events": events,
        "reopen_and_plan_p50_ms": percentile(&times, 50.0).as_secs_f64() * 1e3,
        "reopen_and_plan_max_ms": times.last().map_or(0.0, |t| t.as_secs_f64() * 1e3),
        "peak_rss_mib": peak_rss_kib() as f64 / 1024.0,
    });
    Ok(report)
}

/// The `jail` workload: what the jail costs each program a verifier starts. The same
/// program (`true`, then `python3 -c pass`) runs `runs` times through `run_program` in
/// the jail and as many times without it (`--no-jail`), alternating; the report gives the
/// medians and 95th percentiles of the wall time of each, in milliseconds, and what the
/// first program paid to set the jail up (finding bubblewrap, its probe).
async fn jail_cost(args: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    use baton_engine::cancel::CancelToken;
    use baton_verifiers::program::{Program, run_program};
    let tmp = std::env::temp_dir().join(format!("baton-bench-jail-{}", uuid_like()));
    let workspace = tmp.join("workspace");
    std::fs::create_dir_all(&workspace)?;
    let place = baton_app::place::Place { db: tmp.join("bench.db"), ..args.place.clone() };
    let started = Instant::now();
    let jail = baton_app::jail::jail(&place);
    if let Some(why) = jail.refusal() {
        bail!("{why}");
    }
    if !jail.is_on() {
        bail!("the jail is off (--no-jail): there is nothing to measure");
    }
    let setup_ms = started.elapsed().as_secs_f64() * 1000.0;
    let off = baton_jail::Jail::off();
    let cancel = CancelToken::new();
    let mut report = Map::new();
    report.insert("workload".to_owned(), json!("jail"));
    report.insert("runs".to_owned(), json!(args.runs));
    report.insert("jail".to_owned(), json!(jail.describe()));
    report.insert("setup_ms".to_owned(), json!(setup_ms));
    for (name, argv) in [("true", vec!["true"]), ("python", vec!["python3", "-c", "pass"])] {
        let program = Program {
            argv: argv.iter().map(|a| (*a).to_owned()).collect(),
            cwd: workspace.clone(),
            workspace: workspace.clone(),
            also_writable: Vec::new(),
            env: Vec::new(),
            timeout: Duration::from_secs(60),
            network: false,
        };
        let (mut jailed, mut bare) = (Vec::new(), Vec::new());
        for _ in 0..args.runs.max(1) {
            for (times, which) in [(&mut jailed, &*jail), (&mut bare, &off)] {
                let t = Instant::now();
                let ran = run_program(&program, which, &cancel)
                    .await
                    .map_err(|e| anyhow::anyhow!("`{}`: {e}", argv.join(" ")))?;
                if ran.code != Some(0) {
                    bail!(
                        "`{}` exited with {:?}: {}",
                        argv.join(" "),
                        ran.code,
                        String::from_utf8_lossy(&ran.stderr)
                    );
                }
                times.push(t.elapsed());
            }
        }
        jailed.sort();
        bare.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let (j50, j95) = (ms(percentile(&jailed, 50.0)), ms(percentile(&jailed, 95.0)));
        let (b50, b95) = (ms(percentile(&bare, 50.0)), ms(percentile(&bare, 95.0)));
        report.insert(format!("{name}_jailed_ms_p50"), json!(j50));
        report.insert(format!("{name}_jailed_ms_p95"), json!(j95));
        report.insert(format!("{name}_unjailed_ms_p50"), json!(b50));
        report.insert(format!("{name}_unjailed_ms_p95"), json!(b95));
        report.insert(format!("{name}_overhead_ms_p50"), json!(j50 - b50));
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(serde_json::Value::Object(report))
}
