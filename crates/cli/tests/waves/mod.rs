//! Waves through the binary and the real SQLite store: a sliding window of worker runs
//! under `max_parallel` (asserted from the logs' timestamps), replan and escalate, outside
//! agents dispatching and recording from other processes (exactly once, behind a barrier,
//! within the worker timeout), invalid settings refused before any worker starts, the
//! active dispatcher's assignments closed to outside records, and a SIGKILL after every
//! event of a wave resumed without running any assignment twice.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::trees::roots;
use super::{baton_command, baton_in, bwrap, scratch, text};

const WORKER: &str = "id: worker\nversion: 1\nlevels:\n  - id: work\n    kind: prompt\n    prompt: {inline: \"Work on {{ input }}\"}\n    terminal: true\n";

/// A wave of `worker`s from the run's input, at most two at once; its decision routes.
fn waver(extra: &str) -> String {
    waver_with(&format!("max_parallel: 2{extra}"))
}

/// `waver` with these wave settings beside its worker.
fn waver_with(settings: &str) -> String {
    format!(
        "id: waver\nversion: 1\nlevels:\n  - id: build\n    kind: wave\n    terminal: true\n    wave: {{worker: worker, {settings}}}\nedges:\n  - {{from: build, to: __end__, when: \"wave.decision == 'complete'\"}}\n  - {{from: build, to: __fail__}}\n"
    )
}

/// A test's directory with `worker` and `waver` scenarios, and its database.
fn setup(name: &str, wave_extra: &str) -> (PathBuf, PathBuf) {
    let dir = scratch(name);
    std::fs::create_dir_all(dir.join("scenarios")).unwrap();
    std::fs::write(dir.join("scenarios/worker.yaml"), WORKER).unwrap();
    std::fs::write(dir.join("scenarios/waver.yaml"), waver(wave_extra)).unwrap();
    let db = dir.join("runs.db");
    (dir, db)
}

/// A script: every worker answers a completed report after `delay_ms`; the workers whose
/// prompt holds a `when` text answer with that case's outcome instead.
fn script(dir: &Path, delay_ms: u64, cases: &[(&str, &str, u64)]) -> PathBuf {
    let report = |outcome: &str| {
        format!(
            "```worker_report\n{{\"outcome\": \"{outcome}\", \"summary\": \"{outcome} here\", \"blockers\": [\"b1\"]}}\n```\n"
        )
    };
    let mut yaml = format!(
        "scenarios:\n  worker:\n    levels:\n      work: [{{text: {:?}, delay_ms: {delay_ms}, cost_usd: 0.01}}]\n    cases:",
        report("completed")
    );
    if cases.is_empty() {
        yaml.push_str(" []\n");
    }
    for (when, outcome, delay) in cases {
        yaml.push_str(&format!(
            "\n      - when: {when:?}\n        levels:\n          work: [{{text: {:?}, delay_ms: {delay}}}]\n",
            report(outcome)
        ));
    }
    let path = dir.join(format!("script-{}.yaml", unique()));
    std::fs::write(&path, yaml).unwrap();
    path
}

/// A number no other call in this process got, for file names.
fn unique() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
}

fn tasks(n: usize) -> String {
    let tasks: Vec<String> =
        (1..=n).map(|i| format!("{{\"id\": \"t{i}\", \"title\": \"task {i}\"}}")).collect();
    format!("{{\"tasks\": [{}], \"context\": \"Goal: a todo API\"}}", tasks.join(", "))
}

fn baton(dir: &Path, db: &Path, args: &[&str]) -> Output {
    baton_in(dir, db).args(args).output().unwrap()
}

/// `run waver --input INPUT --script SCRIPT --json`.
fn run_waver(dir: &Path, db: &Path, input: &str, script: &Path) -> (Option<i32>, Value) {
    let out = baton(
        dir,
        db,
        &["run", "waver", "--input", input, "--script", script.to_str().unwrap(), "--json"],
    );
    let result = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("not JSON: {}{}", text(&out.stdout), text(&out.stderr)));
    (out.status.code(), result)
}

/// Every event of a run's tree, each naming its run.
fn tree_events(dir: &Path, db: &Path, run: &str) -> Vec<Value> {
    let out = baton(dir, db, &["events", run, "--tree", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Each worker run's span, from its first event to its last.
fn spans(events: &[Value], root: &str) -> BTreeMap<String, (DateTime<Utc>, DateTime<Utc>)> {
    let mut out: BTreeMap<String, (DateTime<Utc>, DateTime<Utc>)> = BTreeMap::new();
    for e in events {
        let run = e["run_id"].as_str().unwrap();
        if run == root {
            continue;
        }
        let at: DateTime<Utc> = e["at"].as_str().unwrap().parse().unwrap();
        let span = out.entry(run.to_owned()).or_insert((at, at));
        span.0 = span.0.min(at);
        span.1 = span.1.max(at);
    }
    out
}

/// The most spans open at one moment.
fn most_at_once(spans: &BTreeMap<String, (DateTime<Utc>, DateTime<Utc>)>) -> usize {
    spans
        .values()
        .map(|(s, _)| spans.values().filter(|(a, b)| a <= s && s < b).count())
        .max()
        .unwrap_or(0)
}

/// `wave get WAVE --json`.
fn view(dir: &Path, db: &Path, wave: &str) -> Value {
    let out = baton(dir, db, &["wave", "get", wave, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn six_assignments_run_two_at_a_time_and_outcomes_lead_to_replan_and_escalate() {
    let (dir, db) = setup("wave-window", "");
    // All six complete: never more than two workers at once, and two at once at some point.
    let all_done = script(&dir, 300, &[]);
    let (code, result) = run_waver(&dir, &db, &tasks(6), &all_done);
    assert_eq!(code, Some(0), "{result}");
    let root = result["run_id"].as_str().unwrap();
    let events = tree_events(&dir, &db, root);
    let s = spans(&events, root);
    assert_eq!(s.len(), 6, "each assignment ran once");
    assert_eq!(most_at_once(&s), 2, "{s:?}");
    let v = view(&dir, &db, root);
    assert_eq!(
        (v["decision"].as_str(), v["counts"]["completed"].as_u64()),
        (Some("complete"), Some(6))
    );
    assert!((v["cost_usd"].as_f64().unwrap() - 0.06).abs() < 1e-9, "{v}");
    // The second fails fast while the first still runs: nothing is admitted after it, the
    // first settles, and the wave replans.
    let failing = script(&dir, 600, &[("assign-002", "failed", 10)]);
    let (code, result) = run_waver(&dir, &db, &tasks(6), &failing);
    assert_eq!(code, Some(1), "{result}");
    let v = view(&dir, &db, result["run_id"].as_str().unwrap());
    assert_eq!(v["decision"], "replan", "{v}");
    let c = &v["counts"];
    assert_eq!(
        (c["failed"].as_u64(), c["completed"].as_u64(), c["planned"].as_u64()),
        (Some(1), Some(1), Some(4)),
        "{v}"
    );
    // A blocked report escalates, with its blockers.
    let blocked = script(&dir, 10, &[("assign-001", "blocked", 10)]);
    let (_, result) = run_waver(&dir, &db, &tasks(2), &blocked);
    let v = view(&dir, &db, result["run_id"].as_str().unwrap());
    assert_eq!(v["decision"], "escalate", "{v}");
    assert_eq!(v["assignments"][0]["blockers"][0], "b1");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The wave a `wave plan` printed (`run ID`), with its exit code.
fn plan(dir: &Path, db: &Path, tasks_json: &str, extra: &[&str]) -> (Option<i32>, String, String) {
    let file = dir.join(format!("tasks-{}.json", unique()));
    std::fs::write(&file, tasks_json).unwrap();
    let mut args = vec!["wave", "plan", "--tasks", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = baton(dir, db, &args);
    let stdout = text(&out.stdout);
    let run = stdout.lines().find_map(|l| l.strip_prefix("run ")).unwrap_or_default().to_owned();
    (out.status.code(), run, format!("{stdout}{}", text(&out.stderr)))
}

#[test]
fn outside_agents_dispatch_and_record_a_manual_wave_from_other_processes() {
    let (dir, db) = setup("wave-manual", "");
    let (code, wave, out) = plan(&dir, &db, &tasks(3), &["--max-parallel", "2"]);
    assert_eq!(code, Some(3), "a planned wave waits for its agents: {out}");
    assert!(out.contains("waits for outside agents"), "{out}");
    // Listed as waiting for outside agents, not as a run whose driver died.
    let listed = baton(&dir, &db, &["runs", "--json"]);
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed[0]["status"], "waiting", "{listed}");
    assert!(listed[0].to_string().contains("outside agents"), "{listed}");
    let ok = |args: &[&str]| {
        let out = baton(&dir, &db, args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    };
    let refused = |args: &[&str], says: &str| {
        let out = baton(&dir, &db, args);
        assert_eq!(out.status.code(), Some(1), "{args:?} was not refused: {}", text(&out.stdout));
        assert!(text(&out.stderr).contains(says), "{args:?}: {}", text(&out.stderr));
    };
    ok(&[
        "wave",
        "dispatch",
        "current",
        "--assignment",
        "assign-001",
        "--worker-run",
        "ext-1",
        "--by",
        "agent-a",
    ]);
    ok(&["wave", "dispatch", &wave, "--task", "t2", "--worker-run", "ext-2"]);
    // Two in flight of at most two: the third waits for a slot.
    refused(
        &["wave", "dispatch", &wave, "--assignment", "assign-003", "--worker-run", "ext-3"],
        "cannot be dispatched now",
    );
    refused(
        &["wave", "record", &wave, "--assignment", "assign-003", "--outcome", "completed"],
        "has not been dispatched",
    );
    refused(&["wave", "complete", &wave], "cannot end yet");
    ok(&[
        "wave",
        "record",
        &wave,
        "--task",
        "t1",
        "--outcome",
        "completed",
        "--summary",
        "listed",
        "--by",
        "agent-b",
    ]);
    refused(
        &["wave", "record", &wave, "--assignment", "assign-001", "--outcome", "failed"],
        "already settled (completed, by agent-b)",
    );
    refused(
        &["wave", "record", &wave, "--assignment", "assign-002", "--outcome", "done"],
        "--outcome must be one of",
    );
    assert!(ok(&["wave", "decide", &wave]).contains("decision dispatch"));
    ok(&["wave", "dispatch", &wave, "--assignment", "assign-003", "--worker-run", "ext-3"]);
    ok(&["wave", "record", &wave, "--assignment", "assign-002", "--outcome", "partial"]);
    assert!(ok(&["wave", "decide", &wave]).contains("decision wait"));
    ok(&["wave", "record", &wave, "--assignment", "assign-003", "--outcome", "completed"]);
    assert!(ok(&["wave", "decide", &wave, "--json"]).contains("\"decision\": \"complete\""));
    let listed = ok(&["wave", "list"]);
    assert!(listed.contains(&wave) && listed.contains("complete"), "{listed}");
    // Completing ends the wave and its run.
    let out = baton(&dir, &db, &["wave", "complete", &wave, "--by", "agent-a"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let v = view(&dir, &db, &wave);
    assert_eq!(
        (v["ended"].as_bool(), v["run_status"].as_str()),
        (Some(true), Some("completed")),
        "{v}"
    );
    assert_eq!(v["assignments"][0]["worker_run"], "ext-1");
    refused(
        &["wave", "record", &wave, "--assignment", "assign-001", "--outcome", "failed"],
        "has ended",
    );
    let summary = ok(&["wave", "summary", "--json"]);
    let summary: Value = serde_json::from_str(&summary).unwrap();
    assert_eq!(summary["assignments"]["completed"], 2);
    assert_eq!(summary["assignments"]["partial"], 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn racing_records_settle_an_assignment_once() {
    let (dir, db) = setup("wave-race", "");
    let (_, wave, out) = plan(&dir, &db, &tasks(5), &["--max-parallel", "5"]);
    assert!(!wave.is_empty(), "{out}");
    // Every assignment is out before the first record: a failure stops dispatches.
    for n in 1..=5 {
        let id = format!("assign-{n:03}");
        let d = baton(
            &dir,
            &db,
            &["wave", "dispatch", &wave, "--assignment", &id, "--worker-run", &format!("w{n}")],
        );
        assert_eq!(d.status.code(), Some(0), "{}", text(&d.stderr));
    }
    for n in 1..=5 {
        let id = format!("assign-{n:03}");
        let barrier = dir.join(format!("barrier-{n}"));
        std::fs::create_dir_all(&barrier).unwrap();
        let racer = |outcome: &str, by: &str| {
            baton_in(&dir, &db)
                .args([
                    "wave",
                    "record",
                    &wave,
                    "--assignment",
                    &id,
                    "--outcome",
                    outcome,
                    "--by",
                    by,
                ])
                .env("BATON_TEST_DECISION_BARRIER", &barrier)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let racers = [racer("completed", "ann"), racer("failed", "bob")];
        // Both read the log and found the assignment open before either may write.
        let started = Instant::now();
        while std::fs::read_dir(&barrier).unwrap().count() < 2 {
            assert!(started.elapsed() < Duration::from_secs(30), "the racers never met");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::fs::write(barrier.join("go"), b"").unwrap();
        let outs: Vec<Output> = racers.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
        let won: Vec<usize> = (0..2).filter(|i| outs[*i].status.code() == Some(0)).collect();
        assert_eq!(
            won.len(),
            1,
            "exactly one record wins: {:?}",
            outs.iter().map(|o| text(&o.stderr)).collect::<Vec<_>>()
        );
        let lost = &outs[1 - won[0]];
        assert!(text(&lost.stderr).contains("already settled"), "{}", text(&lost.stderr));
        let v = view(&dir, &db, &wave);
        let expected = if won[0] == 0 { "completed" } else { "failed" };
        assert_eq!(v["assignments"][n - 1]["outcome"], expected, "{v}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_record_after_the_worker_timeout_is_refused_and_the_assignment_fails() {
    let (dir, db) = setup("wave-deadline", "");
    let (_, wave, out) = plan(&dir, &db, &tasks(2), &["--timeout-s", "0.4"]);
    assert!(!wave.is_empty(), "{out}");
    let d = baton(
        &dir,
        &db,
        &["wave", "dispatch", &wave, "--assignment", "assign-001", "--worker-run", "slow"],
    );
    assert_eq!(d.status.code(), Some(0), "{}", text(&d.stderr));
    std::thread::sleep(Duration::from_millis(800));
    let late = baton(
        &dir,
        &db,
        &["wave", "record", &wave, "--assignment", "assign-001", "--outcome", "completed"],
    );
    assert_eq!(late.status.code(), Some(1));
    assert!(text(&late.stderr).contains("past its deadline"), "{}", text(&late.stderr));
    let v = view(&dir, &db, &wave);
    assert_eq!(v["assignments"][0]["outcome"], "failed", "{v}");
    assert!(v["assignments"][0]["summary"].as_str().unwrap().contains("400 ms"), "{v}");
    // The failure stops admissions: the decision is replan.
    let decided = baton(&dir, &db, &["wave", "decide", &wave, "--json"]);
    assert!(
        text(&decided.stdout).contains("\"decision\": \"replan\""),
        "{}",
        text(&decided.stdout)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn invalid_parallelism_and_timeouts_are_refused_before_any_worker_starts() {
    let (dir, db) = setup("wave-invalid", "");
    let no_runs = |db: &Path| {
        !db.exists() || {
            let out = Command::new(env!("CARGO_BIN_EXE_baton"))
                .arg("--db")
                .arg(db)
                .args(["runs", "--json"])
                .output()
                .unwrap();
            serde_json::from_slice::<Value>(&out.stdout).unwrap().as_array().unwrap().is_empty()
        }
    };
    for (flag, value, says) in [
        ("--max-parallel", "0", "from 1 through 10, not 0"),
        ("--max-parallel", "11", "from 1 through 10, not 11"),
        ("--timeout-s", "0", "1 to 2147483647 ms"),
        ("--timeout-s", "2147483.648", "1 to 2147483647 ms"),
    ] {
        let (code, _, out) = plan(&dir, &db, &tasks(2), &[flag, value]);
        assert_eq!(code, Some(1), "{flag} {value}: {out}");
        assert!(out.contains(says), "{flag} {value}: {out}");
        assert!(no_runs(&db), "{flag} {value} left a run");
    }
    // In a scenario, the same values are load errors.
    for (extra, says) in [
        ("max_parallel: 0", "from 1 through 10, found 0"),
        ("max_parallel: 11", "from 1 through 10, found 11"),
        ("timeout_s: 0", "found 0"),
        ("timeout_s: 2147483.648", "found 2147483.648"),
    ] {
        std::fs::write(dir.join("scenarios/waver.yaml"), waver_with(extra)).unwrap();
        let out = baton(&dir, &db, &["validate"]);
        assert_eq!(out.status.code(), Some(1), "{extra}");
        assert!(text(&out.stderr).contains(says), "{extra}: {}", text(&out.stderr));
    }
    std::fs::write(dir.join("scenarios/waver.yaml"), waver("")).unwrap();
    // In baton.toml, an error before anything is created.
    let config = dir.join("baton.toml");
    std::fs::write(&config, "[waves]\nmax_parallel = 11\n").unwrap();
    let slow = script(&dir, 10, &[]);
    let out = baton_in(&dir, &db)
        .arg("--config")
        .arg(&config)
        .args(["run", "waver", "--input", &tasks(2), "--script", slow.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr)
            .contains("[waves] max_parallel must be an integer from 1 through 10, not 11"),
        "{}",
        text(&out.stderr)
    );
    assert!(no_runs(&db));
    std::fs::remove_file(&config).unwrap();
    // In the plan's own data: the wave's level fails before any worker starts.
    let (code, result) = run_waver(
        &dir,
        &db,
        "{\"tasks\": [{\"id\": \"a\", \"title\": \"x\"}], \"max_parallel\": 0}",
        &slow,
    );
    assert_eq!(code, Some(1), "{result}");
    assert!(result["aborted_reason"].as_str().unwrap().contains("/max_parallel"), "{result}");
    assert_eq!(result["tree"].as_array().unwrap().len(), 1, "no worker run: {result}");
    // A one-drive override out of range, likewise.
    let (_, wave, _) = plan(&dir, &db, &tasks(2), &["--worker", "worker"]);
    for n in ["0", "11"] {
        let out = baton(&dir, &db, &["wave", "run", &wave, "--max-parallel", n]);
        assert_eq!(out.status.code(), Some(1));
        assert!(text(&out.stderr).contains("from 1 through 10"), "{}", text(&out.stderr));
    }
    assert_eq!(view(&dir, &db, &wave)["counts"]["planned"], 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_active_dispatcher_runs_a_planned_wave_and_outside_records_of_its_workers_are_refused() {
    let (dir, db) = setup("wave-active", "");
    let (_, wave, out) = plan(&dir, &db, &tasks(3), &["--worker", "worker", "--max-parallel", "2"]);
    assert!(!wave.is_empty(), "{out}");
    let slow = script(&dir, 1500, &[]);
    // One worker at a time in this drive, whatever the wave stores.
    let mut runner = baton_in(&dir, &db)
        .args(["wave", "run", &wave, "--max-parallel", "1", "--script", slow.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The table, live: printed again as the wave moves, until its run ends.
    let watcher = baton_in(&dir, &db)
        .args(["wave", "get", &wave, "--watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        assert!(started.elapsed() < Duration::from_secs(30), "no worker ever ran");
        let v = view(&dir, &db, &wave);
        if v["counts"]["in_flight"] == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = baton(
        &dir,
        &db,
        &["wave", "record", &wave, "--assignment", "assign-001", "--outcome", "completed"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("owned by the active dispatcher"), "{}", text(&out.stderr));
    let status = runner.wait().unwrap();
    let stdout = text(
        &runner
            .stdout
            .take()
            .map(|mut s| {
                let mut b = Vec::new();
                std::io::Read::read_to_end(&mut s, &mut b).unwrap();
                b
            })
            .unwrap_or_default(),
    );
    assert_eq!(status.code(), Some(0), "{stdout}");
    let v = view(&dir, &db, &wave);
    assert_eq!(
        (v["decision"].as_str(), v["counts"]["completed"].as_u64()),
        (Some("complete"), Some(3)),
        "{v}"
    );
    assert_eq!(v["max_parallel"], 2, "the override is not stored");
    let watched = watcher.wait_with_output().unwrap();
    assert_eq!(watched.status.code(), Some(0), "{}", text(&watched.stderr));
    let tables: Vec<String> = text(&watched.stdout)
        .lines()
        .filter(|l| l.starts_with("wave "))
        .map(str::to_owned)
        .collect();
    assert!(tables.len() >= 3, "the table was printed as the wave moved: {tables:?}");
    assert!(tables.last().unwrap().contains("decision complete (ended)"), "{tables:?}");
    let events = tree_events(&dir, &db, &wave);
    assert_eq!(most_at_once(&spans(&events, &wave)), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The tree's logs with what differs between equal runs taken out, per run: the root's
/// events sorted (its workers settle in either order), each worker's in order, by link.
fn normalised(dir: &Path, db: &Path, root: &str) -> (Vec<String>, BTreeMap<String, Vec<String>>) {
    let events = tree_events(dir, db, root);
    let mut links: BTreeMap<String, String> = BTreeMap::new();
    for e in &events {
        if e["kind"] == "child_run_started" {
            links.insert(
                e["data"]["child_run_id"].as_str().unwrap().to_owned(),
                e["data"]["link"].as_str().unwrap().to_owned(),
            );
        }
    }
    let describe = |e: &Value| {
        let kind = e["kind"].as_str().unwrap();
        match kind {
            "wave_decided" => format!("{kind}:{}:{}", e["data"]["decision"], e["data"]["closes"]),
            "wave_dispatched" | "wave_recorded" => format!("{kind}:{}", e["data"]["assignment_id"]),
            "child_run_started" | "child_run_settled" => {
                format!("{kind}:{}:{}", e["data"]["link"], e["data"]["status"])
            }
            "level_started" | "level_finished" => format!("{kind}:{}", e["level_id"]),
            _ => kind.to_owned(),
        }
    };
    let mut root_kinds = Vec::new();
    let mut workers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in &events {
        let run = e["run_id"].as_str().unwrap();
        // Interruptions depend on where the kill landed; what they lead to does not.
        if matches!(e["kind"].as_str(), Some("run_interrupted" | "run_resumed" | "warning")) {
            continue;
        }
        if run == root {
            // How many dispatch decisions it took depends on when workers ended.
            if e["kind"] == "wave_decided" && e["data"]["decision"] == "dispatch" {
                continue;
            }
            root_kinds.push(describe(e));
        } else {
            workers.entry(links[run].clone()).or_default().push(describe(e));
        }
    }
    root_kinds.sort();
    (root_kinds, workers)
}

/// Runs `args` in `dir` on `db`, the process killed right after its `n`-th write.
fn killed_after_writes(dir: &Path, db: &Path, args: &[&str], n: usize) -> std::process::ExitStatus {
    baton_command()
        .arg("--scenarios")
        .arg(dir.join("scenarios"))
        .arg("--db")
        .arg(db)
        .current_dir(dir)
        .args(args)
        .env("BATON_BWRAP", bwrap())
        .env("BATON_FAILPOINT_ABORT_AFTER_WRITES", n.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
}

/// Kill the process right after the N-th event it wrote, whichever run of the wave it
/// belongs to, for every N; resume from a new process; the wave ends as one never killed,
/// each assignment started and settled once and each worker run begun once.
#[test]
fn killed_after_any_event_of_a_wave_it_resumes_without_running_an_assignment_twice() {
    let (dir, _) = setup("wave-kill", "");
    let fast = script(&dir, 0, &[]);
    let input = tasks(3);
    let start = ["run", "waver", "--input", input.as_str(), "--script", fast.to_str().unwrap()];
    let reference_db = dir.join("ref.db");
    let out = baton(&dir, &reference_db, &start);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let root = roots(&reference_db).pop().unwrap();
    let reference = normalised(&dir, &reference_db, &root);
    let total = tree_events(&dir, &reference_db, &root).len();
    let mut kills = 0;
    for n in 1..=total {
        let db = dir.join(format!("kill-{n}.db"));
        let killed = killed_after_writes(&dir, &db, &start, n);
        kills += usize::from(killed.code().is_none());
        let Some(root) = roots(&db).pop() else { panic!("no wave after a kill at {n}") };
        let resumed = baton(&dir, &db, &["resume", &root]);
        assert_eq!(
            resumed.status.code(),
            Some(0),
            "kill at {n}: {}{}",
            text(&resumed.stdout),
            text(&resumed.stderr)
        );
        let got = normalised(&dir, &db, &root);
        assert_eq!(got, reference, "killed after the wave's event {n}, the resumed tree differs");
        let events = tree_events(&dir, &db, &root);
        let begun = events.iter().filter(|e| e["kind"] == "scenario_started").count();
        assert_eq!(begun, 4, "kill at {n}: the wave and three workers, each begun once");
    }
    assert!(kills > 10, "the failpoint killed the first process only {kills} times");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn command_workers_run_jailed_programs_whose_reports_settle_their_assignments() {
    let (dir, db) = setup("wave-command", "");
    // The program gets its assignment as JSON for its last argument (`$0` of `sh -c`).
    let program = r#"case "$0" in *quiet*) echo "no report here";; *blocked*) printf '%s\n' '{"outcome": "blocked", "summary": "no key", "blockers": ["the signing key"]}';; *) echo "built"; printf '%s\n' '{"outcome": "completed", "summary": "done"}';; esac"#;
    let argv = serde_json::to_string(&["sh", "-c", program]).unwrap();
    std::fs::write(
        dir.join("scenarios/cmdwave.yaml"),
        format!(
            "id: cmdwave\nversion: 1\nlevels:\n  - id: build\n    kind: wave\n    terminal: true\n    wave: {{command: {argv}, max_parallel: 3, timeout_s: 60}}\nedges:\n  - {{from: build, to: __end__, when: \"wave.decision == 'complete'\"}}\n  - {{from: build, to: __fail__}}\n"
        ),
    )
    .unwrap();
    let input = "{\"tasks\": [{\"id\": \"a\", \"title\": \"fine work\"}, {\"id\": \"b\", \"title\": \"quiet work\"}, {\"id\": \"c\", \"title\": \"blocked work\"}]}";
    let out = baton(&dir, &db, &["run", "cmdwave", "--input", input, "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}{}", text(&out.stdout), text(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let wave = result["run_id"].as_str().unwrap();
    let v = view(&dir, &db, wave);
    let outcome = |i: usize| v["assignments"][i]["outcome"].as_str().unwrap().to_owned();
    assert_eq!([outcome(0), outcome(1), outcome(2)], ["completed", "failed", "blocked"], "{v}");
    assert!(
        v["assignments"][1]["summary"].as_str().unwrap().contains("printed no worker report"),
        "{v}"
    );
    assert_eq!(v["assignments"][2]["blockers"][0], "the signing key");
    assert_eq!(v["decision"], "escalate", "blocked outranks failed: {v}");
    // Each program ran through the jail, in its worker run's own workspace.
    let events = tree_events(&dir, &db, wave);
    let ran: Vec<&Value> = events.iter().filter(|e| e["kind"] == "verifier_finished").collect();
    assert_eq!(ran.len(), 3);
    for e in ran {
        assert_ne!(e["data"]["details"]["jail"], "off", "{e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cancelling_a_manual_wave_nobody_drives_ends_it_with_what_settled() {
    let (dir, db) = setup("wave-cancel-manual", "");
    let (_, wave, out) = plan(&dir, &db, &tasks(3), &[]);
    assert!(!wave.is_empty(), "{out}");
    for (args, code) in [
        (vec!["wave", "dispatch", &wave, "--assignment", "assign-001", "--worker-run", "w1"], 0),
        (vec!["wave", "record", &wave, "--assignment", "assign-001", "--outcome", "completed"], 0),
        (vec!["wave", "dispatch", &wave, "--assignment", "assign-002", "--worker-run", "w2"], 0),
        (vec!["wave", "cancel", "current", "--by", "ops", "--reason", "changed plans"], 0),
    ] {
        let out = baton(&dir, &db, &args);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", text(&out.stderr));
    }
    let v = view(&dir, &db, &wave);
    assert_eq!(
        (v["decision"].as_str(), v["run_status"].as_str()),
        (Some("cancelled"), Some("cancelled")),
        "{v}"
    );
    let c = &v["counts"];
    assert_eq!((c["completed"].as_u64(), c["planned"].as_u64()), (Some(1), Some(1)), "{v}");
    // Nothing more is taken once it has ended.
    let out = baton(
        &dir,
        &db,
        &["wave", "record", &wave, "--assignment", "assign-002", "--outcome", "completed"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("has ended"), "{}", text(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A worker still running past the settle timeout of its wave's cancel stays linked,
/// recorded unsettled; once it has ended, the wave's view shows the outcome its run gave.
#[test]
fn a_worker_that_outlives_the_cancels_settle_timeout_is_reconciled_once_it_ends() {
    let (dir, db) = setup("wave-unsettled", "");
    let slow = script(&dir, 30_000, &[]);
    let job = baton_in(&dir, &db)
        .args(["run", "waver", "--input", &tasks(2), "--script", slow.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let wave = loop {
        assert!(started.elapsed() < Duration::from_secs(30), "the workers never ran");
        if db.exists() {
            let out = baton(&dir, &db, &["wave", "get", "current", "--json"]);
            // Both workers in flight, and stored (a new run is stored with its first
            // commit): a cancel reaches them.
            let listed = baton(&dir, &db, &["runs", "--json"]);
            let stored = serde_json::from_slice::<Value>(&listed.stdout)
                .ok()
                .and_then(|l| l.as_array().map(Vec::len))
                .unwrap_or(0);
            if let Ok(v) = serde_json::from_slice::<Value>(&out.stdout)
                && v["counts"]["in_flight"] == 2
                && stored == 3
            {
                break v["run_id"].as_str().unwrap().to_owned();
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // The process driving the workers stops answering: it holds them and ends nothing.
    let pid = job.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let settle = dir.join("settle.toml");
    std::fs::write(&settle, "[jobs]\nsettle_timeout_s = 1\n").unwrap();
    let cancel = baton_in(&dir, &db)
        .arg("--config")
        .arg(&settle)
        .args(["wave", "cancel", &wave])
        .output()
        .unwrap();
    assert_eq!(cancel.status.code(), Some(0), "{}", text(&cancel.stderr));
    let v = view(&dir, &db, &wave);
    assert_eq!(
        (v["decision"].as_str(), v["run_status"].as_str()),
        (Some("cancelled"), Some("cancelled")),
        "{v}"
    );
    assert_eq!(v["assignments"][0]["stage"], "unsettled", "{v}");
    assert!(v["assignments"][0]["outcome"].is_null(), "{v}");
    // Woken, the workers' driver finds the cancel and ends them.
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    let out = job.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(5), "{}{}", text(&out.stdout), text(&out.stderr));
    let v = view(&dir, &db, &wave);
    for a in v["assignments"].as_array().unwrap() {
        assert_eq!(
            (a["outcome"].as_str(), a["reconciled"].as_bool()),
            (Some("cancelled"), Some(true)),
            "{v}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_wave_whose_workers_start_programs_is_refused_before_its_first_call_without_a_jail() {
    let (dir, db) = setup("wave-nojail", "");
    // The worker checks its answer with a program: a job of the wave reaches it before any
    // model is asked anything.
    std::fs::write(
        dir.join("scenarios/worker.yaml"),
        "id: worker\nversion: 1\nlevels:\n  - id: work\n    kind: prompt\n    prompt: {inline: \"Work on {{ input }}\"}\n  - id: check\n    kind: verifier\n    terminal: true\n    verifiers:\n      - {name: ok, uses: command, params: {argv: [\"true\"]}}\nedges:\n  - {from: work, to: check}\n",
    )
    .unwrap();
    let all_done = script(&dir, 0, &[]);
    let input = tasks(2);
    let out = baton_in(&dir, &db)
        .env("BATON_BWRAP", dir.join("no-such-bwrap"))
        .args(["run", "waver", "--input", &input, "--script", all_done.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}{stderr}", text(&out.stdout));
    assert!(
        stderr
            .contains("scenario `waver` starts workers of scenario `worker`, which runs programs"),
        "{stderr}"
    );
    assert!(stderr.contains("the jail cannot be set up"), "{stderr}");
    assert!(!db.exists() || roots(&db).is_empty(), "a run was created");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_configured_parallelism_is_recorded_when_the_wave_is_planned_and_read_from_the_log() {
    let (dir, db) = setup("wave-configured", "");
    let config = |n: u32| {
        let path = dir.join(format!("baton-{n}.toml"));
        std::fs::write(&path, format!("[waves]\nmax_parallel = {n}\n")).unwrap();
        path
    };
    let (three, six) = (config(3), config(6));
    let file = dir.join("tasks.json");
    std::fs::write(&file, tasks(6)).unwrap();
    // Planned under a configuration of 3, with no parallelism of its own…
    let out = baton_in(&dir, &db)
        .arg("--config")
        .arg(&three)
        .args(["wave", "plan", "--tasks", file.to_str().unwrap(), "--worker", "worker"])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    let wave = stdout.lines().find_map(|l| l.strip_prefix("run ")).unwrap_or_default().to_owned();
    assert!(!wave.is_empty(), "{stdout}{}", text(&out.stderr));
    let planned = tree_events(&dir, &db, &wave)
        .into_iter()
        .find(|e| e["kind"] == "wave_planned")
        .expect("wave_planned");
    assert_eq!(planned["data"]["max_parallel"], 3, "{planned}");
    // …and driven by a process configured for 6: it runs at 3.
    let slow = script(&dir, 400, &[]);
    let out = baton_in(&dir, &db)
        .arg("--config")
        .arg(&six)
        .args(["wave", "run", &wave, "--script", slow.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    // It points to where the wave can be followed.
    assert!(
        text(&out.stdout).contains(&format!("`baton wave get {wave}` (`--watch`")),
        "{}",
        text(&out.stdout)
    );
    let v = view(&dir, &db, &wave);
    assert_eq!(
        (v["max_parallel"].as_u64(), v["counts"]["completed"].as_u64()),
        (Some(3), Some(6)),
        "{v}"
    );
    let at_once = most_at_once(&spans(&tree_events(&dir, &db, &wave), &wave));
    assert!((2..=3).contains(&at_once), "at most the recorded 3 at once, found {at_once}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn worker_reports_fail_closed_a_json_report_of_failed_and_no_report_both_fail_and_the_wave_replans()
{
    let (dir, db) = setup("wave-reports", "");
    std::fs::write(dir.join("scenarios/waver.yaml"), waver_with("max_parallel: 3")).unwrap();
    let block = |outcome: &str| {
        format!(
            "All done.\n```json\n{{\"outcome\": \"{outcome}\", \"summary\": \"{outcome} here\"}}\n```\n"
        )
    };
    let yaml = format!(
        "scenarios:\n  worker:\n    levels:\n      work: [{{text: {:?}}}]\n    cases:\n      - when: \"quiet\"\n        levels:\n          work: [{{text: \"finished, nothing to report\"}}]\n      - when: \"broken\"\n        levels:\n          work: [{{text: {:?}}}]\n",
        block("completed"),
        block("failed")
    );
    let script = dir.join("reports.yaml");
    std::fs::write(&script, yaml).unwrap();
    let input = "{\"tasks\": [{\"id\": \"a\", \"title\": \"plain work\"}, {\"id\": \"b\", \"title\": \"quiet work\"}, {\"id\": \"c\", \"title\": \"broken work\"}]}";
    let (code, result) = run_waver(&dir, &db, input, &script);
    assert_eq!(code, Some(1), "{result}");
    let v = view(&dir, &db, result["run_id"].as_str().unwrap());
    let outcome = |i: usize| v["assignments"][i]["outcome"].as_str().unwrap().to_owned();
    // Every worker run completed; what their reports say decides, the stricter way.
    assert_eq!([outcome(0), outcome(1), outcome(2)], ["completed", "failed", "failed"], "{v}");
    assert!(v["assignments"][1]["summary"].as_str().unwrap().starts_with("report missing"), "{v}");
    assert_eq!(v["assignments"][2]["summary"], "failed here", "{v}");
    assert_eq!(v["decision"], "replan", "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn workers_a_wave_run_script_dispatched_record_it_and_a_resume_after_a_kill_answers_them_from_it() {
    let (dir, db) = setup("wave-run-kill", "");
    let file = dir.join("tasks.json");
    std::fs::write(&file, tasks(2)).unwrap();
    let out = baton(
        &dir,
        &db,
        &["wave", "plan", "--tasks", file.to_str().unwrap(), "--worker", "worker"],
    );
    let stdout = text(&out.stdout);
    let wave = stdout.lines().find_map(|l| l.strip_prefix("run ")).unwrap_or_default().to_owned();
    assert!(!wave.is_empty(), "{stdout}{}", text(&out.stderr));
    let slow = script(&dir, 3000, &[]);
    let mut running = baton_in(&dir, &db)
        .args(["wave", "run", &wave, "--script", slow.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed while both workers wait for their (slow) answers.
    let started = std::time::Instant::now();
    while tree_events(&dir, &db, &wave).iter().filter(|e| e["kind"] == "prompt_sent").count() < 2 {
        assert!(started.elapsed().as_secs() < 30, "the workers never asked their model");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    running.kill().unwrap();
    let _ = running.wait();
    // Each worker recorded where its answers come from.
    let events = tree_events(&dir, &db, &wave);
    let sources: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "scenario_started" && e["run_id"] != wave.as_str())
        .map(|e| &e["data"]["model_source"])
        .collect();
    assert_eq!(sources.len(), 2, "{events:?}");
    for source in sources {
        assert!(source.as_str().is_some_and(|s| s.starts_with("script:")), "{source}");
    }
    // A resume without --script answers them from it, and the wave completes.
    let out = baton(&dir, &db, &["resume", &wave]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let v = view(&dir, &db, &wave);
    assert_eq!(v["counts"]["completed"], 2, "{v}");
    assert_eq!(v["decision"], "complete", "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A worker the wave recorded (`child_run_started`) but never created — its driver was
/// killed between the two — is released by a cancel of the wave: recorded
/// `child_run_unsettled` `not created`, never created afterwards, and the wave ends
/// cancelled.
#[test]
fn a_cancel_releases_a_worker_that_was_recorded_but_never_created() {
    let (dir, _) = setup("wave-never-created", "");
    let fast = script(&dir, 0, &[]);
    let input = tasks(2);
    let start = ["run", "waver", "--input", input.as_str(), "--script", fast.to_str().unwrap()];
    // The first kill after which the wave has recorded a worker that does not exist.
    let found = (1..=12).find_map(|n| {
        let db = dir.join(format!("kill-{n}.db"));
        killed_after_writes(&dir, &db, &start, n);
        let root = roots(&db).pop()?;
        let events = tree_events(&dir, &db, &root);
        let recorded: Vec<String> = events
            .iter()
            .filter(|e| e["kind"] == "child_run_started")
            .map(|e| e["data"]["child_run_id"].as_str().unwrap().to_owned())
            .collect();
        let missing: Vec<String> = recorded
            .into_iter()
            .filter(|id| !events.iter().any(|e| e["run_id"] == id.as_str()))
            .collect();
        (!missing.is_empty()).then_some((db, root, missing))
    });
    let (db, root, missing) = found.expect("a kill between recording a worker and creating it");
    let out = baton(&dir, &db, &["cancel", &root, "--by", "ops"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let events = tree_events(&dir, &db, &root);
    for id in &missing {
        let released = events.iter().find(|e| {
            e["kind"] == "child_run_unsettled" && e["data"]["child_run_id"] == id.as_str()
        });
        let released = released.unwrap_or_else(|| panic!("{id} was not released: {events:?}"));
        assert_eq!(released["data"]["status"], "not created", "{released}");
        assert!(!events.iter().any(|e| e["run_id"] == id.as_str()), "{id} was created after all");
    }
    let ended = events
        .iter()
        .rev()
        .find(|e| e["kind"] == "scenario_finished" && e["run_id"] == root.as_str());
    assert_eq!(ended.unwrap()["data"]["status"], "cancelled");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A worker whose two levels take steering; its first answer takes two seconds.
const STEERED_WORKER: &str = "id: worker\nversion: 1\nlevels:\n  - {id: draft, kind: prompt, steerable: true, prompt: {inline: 'Draft {{ input }}'}}\n  - {id: work, kind: prompt, steerable: true, prompt: {inline: 'Work on {{ input }}'}, terminal: true}\nedges:\n  - {from: draft, to: work}\n  - {from: work, to: __end__}\n";

#[test]
fn a_wave_s_worker_is_steered_by_its_run_id_while_the_wave_runs() {
    let (dir, db) = setup("wave-steered", "");
    std::fs::write(dir.join("scenarios/worker.yaml"), STEERED_WORKER).unwrap();
    let report = "```worker_report\n{\"outcome\": \"completed\", \"summary\": \"done\"}\n```\n";
    let script = dir.join("script.yaml");
    std::fs::write(
        &script,
        format!(
            "scenarios:\n  worker:\n    levels:\n      draft: [{{text: drafted, delay_ms: 2000}}]\n      work: [{{text: {report:?}}}]\n"
        ),
    )
    .unwrap();
    let wave = baton_in(&dir, &db)
        .args([
            "run",
            "waver",
            "--input",
            &tasks(1),
            "--script",
            script.to_str().unwrap(),
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The worker's run, once the wave has started it.
    let deadline = Instant::now() + Duration::from_secs(60);
    let worker = loop {
        let out = baton(&dir, &db, &["runs", "--json"]);
        let listed: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let found = listed.as_array().and_then(|runs| {
            runs.iter()
                .find(|r| r["scenario_id"] == "worker")
                .and_then(|r| r["run_id"].as_str().map(str::to_owned))
        });
        if let Some(id) = found {
            break id;
        }
        assert!(Instant::now() < deadline, "no worker run: {}", text(&out.stdout));
        std::thread::sleep(Duration::from_millis(50));
    };
    let steered =
        baton(&dir, &db, &["steer", &worker, "--message", "M-WORKER use SQLite", "--by", "lead"]);
    assert_eq!(steered.status.code(), Some(0), "{}", text(&steered.stderr));
    let out = wave.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "completed", "{result}");
    let log = baton(&dir, &db, &["events", &worker, "--json"]);
    let log: Vec<Value> =
        text(&log.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let delivered: Vec<&Value> = log.iter().filter(|e| e["kind"] == "steering_delivered").collect();
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    let level = delivered[0]["level_id"].as_str().unwrap();
    let prompts: Vec<&str> = log
        .iter()
        .filter(|e| e["kind"] == "prompt_sent")
        .filter(|e| e["data"]["prompt"].as_str().unwrap().contains("M-WORKER use SQLite"))
        .map(|e| e["level_id"].as_str().unwrap())
        .collect();
    assert_eq!(prompts, [level], "the one call that took it carried it");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_priority_ordered_wave_admits_high_before_medium_before_low_as_recorded_on_its_plan() {
    let dir = scratch("wave-priority");
    std::fs::create_dir_all(dir.join("scenarios")).unwrap();
    std::fs::write(dir.join("scenarios/worker.yaml"), WORKER).unwrap();
    std::fs::write(
        dir.join("scenarios/waver.yaml"),
        waver_with("max_parallel: 1, order: priority"),
    )
    .unwrap();
    let db = dir.join("runs.db");
    let input = r#"{"tasks": [
        {"id": "t1", "title": "one", "priority": "low"},
        {"id": "t2", "title": "two"},
        {"id": "t3", "title": "three", "priority": "high"},
        {"id": "t4", "title": "four", "priority": "medium"}]}"#;
    // A wave run to its end: its recorded order, and its dispatches (one at a time, so
    // they are the admission order).
    let waved = |known: &[String]| -> (Value, Vec<String>) {
        let (code, result) = run_waver(&dir, &db, input, &script(&dir, 0, &[]));
        assert_eq!(code, Some(0), "{result}");
        let root = roots(&db).into_iter().find(|r| !known.contains(r)).unwrap();
        let events = tree_events(&dir, &db, &root);
        let planned = events.iter().find(|e| e["kind"] == "wave_planned").unwrap();
        let dispatched = events
            .iter()
            .filter(|e| e["kind"] == "wave_dispatched" && e["run_id"] == root.as_str())
            .map(|e| e["data"]["assignment_id"].as_str().unwrap().to_owned())
            .collect();
        (planned["data"].get("order").cloned().unwrap_or(Value::Null), dispatched)
    };
    let (order, dispatched) = waved(&[]);
    assert_eq!(order, "priority");
    assert_eq!(dispatched, ["assign-003", "assign-004", "assign-001", "assign-002"]);
    // The plan's order stays the default, and is not written.
    std::fs::write(dir.join("scenarios/waver.yaml"), waver_with("max_parallel: 1")).unwrap();
    let (order, dispatched) = waved(&roots(&db));
    assert_eq!(order, Value::Null);
    assert_eq!(dispatched, ["assign-001", "assign-002", "assign-003", "assign-004"]);
    let _ = std::fs::remove_dir_all(&dir);
}
