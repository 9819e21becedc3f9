//! `baton bench --store postgres --processes N`: the fleet as it runs. The bench fills a
//! queue with `--runs` jobs of the workload (each queued as `baton run --queue` queues
//! one: created, durable, its model the script the bench wrote), then starts N real
//! `baton worker` processes of this binary, each with `--concurrency` slots, and waits
//! until every job has ended. Figures come from what the workers wrote and said: runs and
//! levels per second from the first level's start to the last run's end in the log, each
//! claim's own duration from the workers' `claimed run … in MS ms` lines, and the
//! database's transactions per level from `pg_stat_database`. With `--model-latency-ms` every
//! model call takes that long (`default.delay_ms` of the script).

use std::io::BufRead as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use baton_engine::Engine;
use baton_engine::job::Start;
use baton_scenario::Scenario;
use baton_store::postgres::PostgresStore;
use serde_json::json;

use crate::probe::percentile;

/// How often the bench looks whether every job has ended.
const POLL: Duration = Duration::from_millis(20);

/// The longest the workers may take over the whole queue.
const DEADLINE: Duration = Duration::from_secs(600);

/// What a fleet measurement works with, made by the bench.
pub(crate) struct Fleet {
    /// The bench's schema.
    pub url: String,
    pub workload: String,
    pub processes: usize,
    pub concurrency: usize,
    pub runs: usize,
    pub model_latency_ms: u64,
    pub levels_per_run: u64,
    /// The model's answer to every call.
    pub answer: String,
    /// Where `scenarios/` holds the workload (the workers read it) and the script goes.
    pub tmp: PathBuf,
    pub scenario: Arc<Scenario>,
    /// Queues the jobs (its model is never called).
    pub filler: Engine,
    pub store: Arc<PostgresStore>,
}

/// A connection of the bench's own to the schema, for its counts.
async fn connect(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .context("the bench could not connect to its schema")?;
    tokio::spawn(connection);
    Ok(client)
}

/// The database's committed transactions so far (every session's, flushed).
async fn commits(url: &str) -> anyhow::Result<i64> {
    // A fresh session: what others flushed at their end is read, not a cached snapshot.
    let c = connect(url).await?;
    let row = c
        .query_one(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

pub(crate) async fn measure(fleet: Fleet) -> anyhow::Result<serde_json::Value> {
    let Fleet { url, tmp, scenario, filler, store, .. } = &fleet;
    let url = url.as_str();
    let script = tmp.join("script.yaml");
    std::fs::write(
        &script,
        format!(
            "default: {{text: {}, delay_ms: {}}}\n",
            serde_json::to_string(&fleet.answer)?,
            fleet.model_latency_ms
        ),
    )?;

    // The queue, filled as `baton run --queue` fills it.
    let source = format!("script:{}", script.display());
    for i in 0..fleet.runs {
        let start = Start {
            input: format!("job {i}"),
            model_source: Some(source.clone()),
            ..Start::default()
        };
        filler.create_job(&Engine::new_run_id(), scenario, start).await?;
    }
    let counter = connect(url).await?;
    let commits0 = commits(url).await?;
    let exe = std::env::current_exe().context("the bench cannot find its own binary")?;
    let processes = fleet.processes.max(1);
    let concurrency = fleet.concurrency.max(1);
    let wall = Instant::now();
    let mut workers = Vec::with_capacity(processes);
    for i in 0..processes {
        let child = Command::new(&exe)
            .arg("--db")
            .arg(url)
            .arg("--data-dir")
            .arg(tmp.join("data"))
            .arg("--scenarios")
            .arg(tmp.join("scenarios"))
            .args(["worker", "--concurrency", &concurrency.to_string(), "--idle-exit-s", "1"])
            .args(["--name", &format!("bench-w{i}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start `{} worker`", exe.display()))?;
        workers.push(child);
    }
    // Each worker's stderr, read as it comes (a full pipe would stall it).
    let readers: Vec<std::thread::JoinHandle<String>> = workers
        .iter_mut()
        .filter_map(|w| w.stderr.take())
        .map(|stderr| {
            std::thread::spawn(move || {
                let mut said = String::new();
                for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                    said.push_str(&line);
                    said.push('\n');
                }
                said
            })
        })
        .collect();
    let mut polls = 0i64;
    let total = i64::try_from(fleet.runs).unwrap_or(i64::MAX);
    loop {
        polls += 1;
        let ended: i64 = counter
            .query_one("SELECT count(*) FROM runs WHERE status <> 'running'", &[])
            .await?
            .get(0);
        if ended >= total {
            break;
        }
        if wall.elapsed() > DEADLINE {
            for w in &mut workers {
                let _ = w.kill();
            }
            bail!("the workers ended {ended} of {total} jobs in {} s", DEADLINE.as_secs());
        }
        tokio::time::sleep(POLL).await;
    }
    let all_ended = wall.elapsed();
    // Idle now, each exits within a second or so.
    for w in &mut workers {
        let status = loop {
            if let Some(status) = w.try_wait()? {
                break status;
            }
            if wall.elapsed() > DEADLINE {
                let _ = w.kill();
            }
            tokio::time::sleep(POLL).await;
        };
        if !status.success() {
            bail!("a worker exited {status}");
        }
    }
    let said: Vec<String> = readers.into_iter().filter_map(|r| r.join().ok()).collect();
    let mut claims: Vec<Duration> = said
        .iter()
        .flat_map(|s| s.lines())
        .filter(|l| l.contains(": claimed run "))
        .filter_map(|l| l.rsplit_once(" in ").map(|(_, ms)| ms))
        .filter_map(|ms| ms.strip_suffix(" ms").and_then(|ms| ms.parse::<f64>().ok()))
        .map(|ms| Duration::from_secs_f64(ms / 1e3))
        .collect();
    claims.sort_unstable();
    // Flushed at each worker session's end.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let committed = commits(url).await? - commits0 - polls;
    let row = counter
        .query_one(
            "SELECT min(at_us) FILTER (WHERE kind = 'level_started'),
                    max(at_us) FILTER (WHERE kind = 'scenario_finished'),
                    count(*) FILTER (WHERE kind = 'level_finished'),
                    count(*) FILTER (WHERE kind = 'scenario_finished')
               FROM events",
            &[],
        )
        .await?;
    let (first, last): (Option<i64>, Option<i64>) = (row.get(0), row.get(1));
    let (levels, finished): (i64, i64) = (row.get(2), row.get(3));
    let completed: i64 = counter
        .query_one("SELECT count(*) FROM runs WHERE status = 'completed'", &[])
        .await?
        .get(0);
    let expected = total * i64::try_from(fleet.levels_per_run).unwrap_or(0);
    if levels != expected || finished != total || completed != total {
        bail!(
            "the workers ran {levels} levels of {expected}, ended {finished} runs and completed {completed} of {total}"
        );
    }
    let span_s = (last.unwrap_or(0) - first.unwrap_or(0)) as f64 / 1e6;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok(json!({
        "workload": fleet.workload,
        "store": "postgres",
        "mode": "worker processes (claims, leases, a queue)",
        "processes": processes,
        "concurrency": concurrency,
        "runs": total,
        "levels": levels,
        "model_latency_ms": fleet.model_latency_ms,
        // From the first level's start to the last run's end, as the log has them.
        "span_s": span_s,
        "runs_per_s": total as f64 / span_s,
        "levels_per_s": levels as f64 / span_s,
        // From the first worker's start to the last job's end seen by the bench.
        "wall_s": all_ended.as_secs_f64(),
        "claims": claims.len(),
        "claim_p50_ms": ms(percentile(&claims, 50.0)),
        "claim_p99_ms": ms(percentile(&claims, 99.0)),
        // Every transaction the database committed while the workers ran (reads too: a
        // statement outside a transaction is one), per level.
        "transactions_per_level": committed as f64 / levels.max(1) as f64,
        "postgres_synchronous_commit": store.setting("synchronous_commit").await?,
    }))
}
