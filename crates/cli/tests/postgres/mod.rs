//! The `baton` binary on PostgreSQL (`--db postgres://…`), against the server this machine
//! runs, each test in a schema of its own: a job pauses and another process approves it,
//! its log the same as on SQLite; deciders racing from several processes decide once; a
//! server that is not there is named with what to check.

use std::path::{Path, PathBuf};

use baton_store::postgres::ScratchSchema;
use serde_json::Value;

use super::{baton_command, baton_db, text};

/// The server tests use: `BATON_TEST_POSTGRES`, else the machine's own.
fn base() -> String {
    std::env::var("BATON_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A schema of its own for one test, dropped with it.
fn scratch(label: &str) -> ScratchSchema {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(ScratchSchema::create(&base(), label)).unwrap()
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("baton-cli-pg-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `baton --db DB --data-dir DATA ARGS…` for a PostgreSQL `db`.
fn baton_pg(db: &str, data: &Path, args: &[&str]) -> std::process::Output {
    baton_command().arg("--db").arg(db).arg("--data-dir").arg(data).args(args).output().unwrap()
}

/// What a log says, times and ids aside: each event's kind, level and attempt.
fn shape(events_json: &str) -> Vec<(String, String, String)> {
    events_json
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|e| (e["kind"].to_string(), e["level_id"].to_string(), e["attempt"].to_string()))
        .collect()
}

fn run_id(stdout: &[u8]) -> String {
    text(stdout).lines().find_map(|l| l.strip_prefix("run ")).unwrap().to_owned()
}

const RELEASE_NOTES: [&str; 6] = [
    "run",
    "release_notes",
    "--script",
    "scenarios/scripts/release_notes.yaml",
    "--input",
    "PR 101: CSV export; PR 102: faster search; PR 103: login loop fixed",
];

#[test]
fn a_job_paused_on_postgres_is_approved_by_another_process_with_the_log_sqlite_keeps() {
    let schema = scratch("approve");
    let dir = temp("approve");
    let data = dir.join("data");
    let run = baton_pg(&schema.url, &data, &RELEASE_NOTES);
    assert_eq!(run.status.code(), Some(3), "{}{}", text(&run.stdout), text(&run.stderr));
    let id = run_id(&run.stdout);
    let approved =
        baton_pg(&schema.url, &data, &["approve", &id, "--by", "rm", "--comment", "ship it"]);
    assert_eq!(approved.status.code(), Some(0), "{}", text(&approved.stderr));
    let listed = text(&baton_pg(&schema.url, &data, &["runs"]).stdout);
    assert!(listed.contains(&id) && listed.contains("completed"), "{listed}");
    let verified = baton_pg(&schema.url, &data, &["verify"]);
    assert_eq!(verified.status.code(), Some(0), "{}", text(&verified.stderr));
    assert!(text(&verified.stdout).contains("ok: 1 runs intact"), "{}", text(&verified.stdout));
    let on_pg = text(&baton_pg(&schema.url, &data, &["events", &id, "--json"]).stdout);

    // The same job on SQLite writes the same log, event for event.
    let db = dir.join("runs.db");
    let run = baton_db(&db, &RELEASE_NOTES);
    assert_eq!(run.status.code(), Some(3), "{}", text(&run.stderr));
    let sqlite_id = run_id(&run.stdout);
    let approved = baton_db(&db, &["approve", &sqlite_id, "--by", "rm", "--comment", "ship it"]);
    assert_eq!(approved.status.code(), Some(0), "{}", text(&approved.stderr));
    let on_sqlite = text(&baton_db(&db, &["events", &sqlite_id, "--json"]).stdout);
    assert!(shape(&on_pg).len() > 20, "{on_pg}");
    assert_eq!(shape(&on_pg), shape(&on_sqlite), "the two stores keep the same log");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn racing_deciders_on_postgres_decide_once() {
    let schema = scratch("race");
    let dir = temp("race");
    super::deciders_race(Path::new(&schema.url), &dir, 8);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_postgres_server_that_is_not_there_is_named_with_what_to_check() {
    let dir = temp("absent");
    let out = baton_pg("postgres://nobody:hunter2@127.0.0.1:1/none", &dir, &["runs"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("127.0.0.1:1") && err.contains("check that the server runs"), "{err}");
    assert!(!err.contains("hunter2"), "the password is never shown: {err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Starts `baton worker` on `db` with `args`, its output kept.
fn worker(db: &str, data: &Path, args: &[&str]) -> std::process::Child {
    baton_command()
        .arg("--db")
        .arg(db)
        .arg("--data-dir")
        .arg(data)
        .arg("worker")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Queues a quick_qa job answered by `script`; its run id.
fn queue(db: &str, data: &Path, script: &Path, input: &str) -> String {
    let out = baton_command()
        .arg("--db")
        .arg(db)
        .arg("--data-dir")
        .arg(data)
        .args(["run", "quick_qa", "--queue", "--input", input, "--script"])
        .arg(script)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("queued: a `baton worker`"), "{}", text(&out.stdout));
    run_id(&out.stdout)
}

/// The events of a run, parsed.
fn events(db: &str, data: &Path, run: &str) -> Vec<Value> {
    let out = baton_pg(db, data, &["events", run, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// How a run's log says it ended, once per end.
fn finished_as(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["kind"] == "scenario_finished")
        .map(|e| e["data"]["status"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn count(events: &[Value], kind: &str) -> usize {
    events.iter().filter(|e| e["kind"] == kind).count()
}

/// Waits for a child to exit, at most `secs`; its output.
fn finish(child: std::process::Child, secs: u64) -> std::process::Output {
    let pid = child.id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    while !waiter.is_finished() {
        if std::time::Instant::now() > deadline {
            let _ = std::process::Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("the worker did not exit within {secs} s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    waiter.join().unwrap()
}

/// Jobs queued on PostgreSQL are driven by three workers sharing it, each job once: every
/// run completes, each level is started and finished once, every log verifies.
#[test]
fn queued_jobs_are_driven_by_several_workers_each_once() {
    let schema = scratch("workers");
    let dir = temp("workers");
    let data = dir.join("data");
    let script = super::repo().join("scenarios/scripts/quick_qa.yaml");
    let runs: Vec<String> =
        (0..12).map(|i| queue(&schema.url, &data, &script, &format!("question {i}"))).collect();
    let script_arg = script.to_str().unwrap();
    let workers: Vec<_> = (0..3)
        .map(|i| {
            let name = format!("w{i}");
            worker(
                &schema.url,
                &data,
                &[
                    "--script",
                    script_arg,
                    "--concurrency",
                    "2",
                    "--idle-exit-s",
                    "2",
                    "--name",
                    &name,
                ],
            )
        })
        .collect();
    for w in workers {
        let out = finish(w, 120);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
    for run in &runs {
        let log = events(&schema.url, &data, run);
        assert_eq!(finished_as(&log), ["completed"], "run {run}: {log:?}");
        assert_eq!(count(&log, "level_started"), 1, "run {run}: one level, started once");
        assert_eq!(count(&log, "level_finished"), 1, "run {run}: finished once");
    }
    let verified = baton_pg(&schema.url, &data, &["verify"]);
    assert_eq!(verified.status.code(), Some(0), "{}", text(&verified.stdout));
    let _ = std::fs::remove_dir_all(dir);
}

/// A worker killed in the middle of a job: another worker, already running, takes the run
/// over once the dead one's lease runs out, and drives it to its end with nothing done
/// twice.
#[test]
fn a_killed_workers_job_is_taken_over_by_another_after_its_lease() {
    let schema = scratch("takeover");
    let dir = temp("takeover");
    let data = dir.join("data");
    let script = dir.join("slow.yaml");
    std::fs::write(
        &script,
        "levels:\n  answer:\n    - {text: '{\"answer\": \"Paris\", \"confidence\": 0.9, \"sources\": []}', delay_ms: 4000}\n    - {text: '{\"answer\": \"Paris\", \"confidence\": 0.9, \"sources\": []}', delay_ms: 500}\n",
    )
    .unwrap();
    let run = queue(&schema.url, &data, &script, "the capital of France?");
    let script_arg = script.to_str().unwrap();
    let mut first = worker(&schema.url, &data, &["--script", script_arg, "--lease-s", "3"]);
    // The first worker is in the model call (delayed 4 s) once the level has started.
    let started = std::time::Instant::now();
    while count(&events(&schema.url, &data, &run), "level_started") == 0 {
        assert!(started.elapsed().as_secs() < 30, "the first worker never started the level");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let second = worker(
        &schema.url,
        &data,
        &["--script", script_arg, "--lease-s", "3", "--idle-exit-s", "6"],
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    first.kill().unwrap();
    let killed = std::time::Instant::now();
    let _ = first.wait();
    let out = finish(second, 60);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let log = events(&schema.url, &data, &run);
    assert_eq!(finished_as(&log), ["completed"], "{log:?}");
    assert_eq!(count(&log, "level_finished"), 1, "the level is finished once: {log:?}");
    assert_eq!(count(&log, "model_response"), 1, "one answer is recorded: {log:?}");
    assert!(killed.elapsed().as_secs() < 40, "taken over and finished in {:?}", killed.elapsed());
    let _ = std::fs::remove_dir_all(dir);
}
