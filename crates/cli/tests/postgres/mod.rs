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
pub(crate) fn scratch(label: &str) -> ScratchSchema {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(ScratchSchema::create(&base(), label)).unwrap()
}

pub(crate) fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("baton-cli-pg-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A test's own scenario `NAME` (`yaml`) and its script in `dir`: the script's path, and
/// `baton` on that scenarios directory, the PostgreSQL `db` and the data dir `dir/data`.
pub(crate) fn own_scenario(
    dir: &Path,
    db: &str,
    (name, yaml): (&str, &str),
    script: &str,
) -> (PathBuf, impl Fn() -> std::process::Command + use<>) {
    let scenarios = dir.join("scenarios");
    std::fs::create_dir_all(&scenarios).unwrap();
    std::fs::write(scenarios.join(format!("{name}.yaml")), yaml).unwrap();
    let script_path = dir.join("script.yaml");
    std::fs::write(&script_path, script).unwrap();
    let (db, data) = (db.to_owned(), dir.join("data"));
    let baton = move || {
        let mut c = baton_command();
        c.arg("--scenarios").arg(&scenarios).arg("--db").arg(&db).arg("--data-dir").arg(&data);
        c
    };
    (script_path, baton)
}

/// Queues one job of `scenario` per line of `lines` with `baton` (`run --queue
/// --input-lines`, and `answers`: `--script F` or `--config F`).
fn queue_lines(
    baton: &impl Fn() -> std::process::Command,
    dir: &Path,
    scenario: &str,
    lines: &str,
    answers: [&std::ffi::OsStr; 2],
) {
    let file = dir.join("inputs.txt");
    std::fs::write(&file, lines).unwrap();
    let queued = baton()
        .args(["run", scenario, "--queue", "--input-lines"])
        .arg(&file)
        .args(answers)
        .output()
        .unwrap();
    assert_eq!(queued.status.code(), Some(0), "{}", text(&queued.stderr));
}

/// The runs `baton runs --json` lists: their ids and statuses.
pub(crate) fn listed_runs(db: &str, data: &Path) -> Vec<(String, String)> {
    let listed: Value =
        serde_json::from_slice(&baton_pg(db, data, &["runs", "--json"]).stdout).unwrap();
    listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (r["run_id"].as_str().unwrap().to_owned(), r["status"].as_str().unwrap().to_owned())
        })
        .collect()
}

/// `baton --db DB --data-dir DATA ARGS…` for a PostgreSQL `db`.
pub(crate) fn baton_pg(db: &str, data: &Path, args: &[&str]) -> std::process::Output {
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
pub(crate) fn finish(child: std::process::Child, secs: u64) -> std::process::Output {
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

/// A worker whose stderr is read as it comes, so that a test can wait for what it says
/// (that it claimed its runs) before it signals it.
pub(crate) struct Heard {
    pub(crate) child: std::process::Child,
    said: std::sync::Arc<std::sync::Mutex<String>>,
    reader: std::thread::JoinHandle<()>,
}

impl Heard {
    pub(crate) fn new(mut child: std::process::Child) -> Self {
        use std::io::BufRead;
        let stderr = child.stderr.take().expect("the worker's stderr is piped");
        let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let into = std::sync::Arc::clone(&said);
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut said = into.lock().unwrap();
                said.push_str(&line);
                said.push('\n');
            }
        });
        Self { child, said, reader }
    }

    /// Waits until the worker has said `needle` at least `times` times.
    pub(crate) fn wait_for(&self, needle: &str, times: usize, secs: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        while self.said.lock().unwrap().matches(needle).count() < times {
            assert!(
                std::time::Instant::now() < deadline,
                "the worker did not say `{needle}` {times} times within {secs} s: {}",
                self.said.lock().unwrap()
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// [`finish`] for a heard worker: its exit and all it said.
    pub(crate) fn finish(self, secs: u64) -> std::process::Output {
        let Self { child, said, reader } = self;
        let out = finish(child, secs);
        reader.join().unwrap();
        let stderr = said.lock().unwrap().clone().into_bytes();
        std::process::Output { stderr, ..out }
    }
}

/// Jobs queued on PostgreSQL are driven by three workers sharing it, each job once: every
/// run completes, each level is started and finished once, every log verifies, and the
/// workers say which runs they claimed and how they left them.
#[test]
fn queued_jobs_are_driven_by_several_workers_each_once() {
    let schema = scratch("workers");
    let dir = temp("workers");
    let data = dir.join("data");
    let script = super::repo().join("scenarios/scripts/quick_qa.yaml");
    let runs: Vec<String> =
        (0..12).map(|i| queue(&schema.url, &data, &script, &format!("question {i}"))).collect();
    // Until a worker takes them up, the runs are listed queued — not interrupted — and say
    // what takes them up.
    let listed = |status: &str| -> Vec<Value> {
        let out = baton_pg(&schema.url, &data, &["runs", "--json", "--status", status]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let queued = listed("queued");
    assert_eq!(queued.len(), runs.len(), "{queued:?}");
    assert!(queued.iter().all(|r| r["status"] == "queued" && r["continue_with"] == "baton worker"));
    assert!(listed("interrupted").is_empty());
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
    let mut said = String::new();
    for w in workers {
        let out = finish(w, 120);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        said.push_str(&text(&out.stderr));
    }
    for run in &runs {
        // Each worker says, one line each, which run it claimed and how it left it.
        assert_eq!(said.matches(&format!("claimed run {run} (quick_qa)")).count(), 1, "{said}");
        let left = format!("run {run} is completed after ");
        assert_eq!(said.matches(&left).count(), 1, "{said}");
        assert!(said.lines().any(|l| l.contains(&left) && l.ends_with("its lease is given back")));
        let log = events(&schema.url, &data, run);
        assert_eq!(finished_as(&log), ["completed"], "run {run}: {log:?}");
        assert_eq!(count(&log, "level_started"), 1, "run {run}: one level, started once");
        assert_eq!(count(&log, "level_finished"), 1, "run {run}: finished once");
    }
    assert!(listed("queued").is_empty());
    assert_eq!(listed("completed").len(), runs.len());
    let verified = baton_pg(&schema.url, &data, &["verify"]);
    assert_eq!(verified.status.code(), Some(0), "{}", text(&verified.stdout));
    let _ = std::fs::remove_dir_all(dir);
}

/// SIGTERM drains a worker: it claims no more runs, the steps it has in flight finish, and
/// it gives their runs back between two steps and exits; another worker takes them up at
/// once and completes them. No level is started twice (no model call is made again), no
/// run is recorded interrupted, and the drained worker exits 0 long before its grace period
/// ends.
#[test]
fn a_drained_worker_gives_its_runs_back_between_two_steps_for_another_to_finish() {
    let schema = scratch("drain");
    let db = schema.url.as_str();
    let dir = temp("drain");
    let data = dir.join("data");
    let (script, pg) = own_scenario(
        &dir,
        db,
        (
            "three",
            "id: three\nversion: 1\nlevels:\n  - {id: a, kind: prompt, prompt: {inline: 'A {{ input }}'}}\n  - {id: b, kind: prompt, prompt: {inline: 'B'}}\n  - {id: c, kind: prompt, prompt: {inline: 'C'}, terminal: true}\nedges:\n  - {from: a, to: b}\n  - {from: b, to: c}\n",
        ),
        "levels:\n  a: [{text: 'one', delay_ms: 1500}]\n  b: [{text: 'two', delay_ms: 300}]\n  c: [{text: 'three', delay_ms: 300}]\n",
    );
    queue_lines(&pg, &dir, "three", "w\nx\ny\nz\n", ["--script".as_ref(), script.as_ref()]);
    let worker = |name: &str, idle: &str| {
        pg().args(["worker", "--concurrency", "4", "--idle-exit-s", idle, "--name", name])
            .args(["--drain-grace-s", "60"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let first = Heard::new(worker("first", "60"));
    // The first worker claims the four runs and is inside their first level (1.5 s).
    first.wait_for("claimed run ", 4, 60);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let signalled = std::time::Instant::now();
    signal(first.child.id(), "TERM");
    let second = worker("second", "3");
    let first = first.finish(30);
    let drained_in = signalled.elapsed();
    let first_said = text(&first.stderr);
    assert_eq!(first.status.code(), Some(0), "{first_said}");
    assert!(first_said.contains("draining"), "{first_said}");
    assert!(drained_in < std::time::Duration::from_secs(10), "drained in {drained_in:?}");
    let second = finish(second, 60);
    let second_said = text(&second.stderr);
    assert_eq!(second.status.code(), Some(0), "{second_said}");
    let runs: Vec<String> = listed_runs(db, &data).into_iter().map(|(id, _)| id).collect();
    assert_eq!(runs.len(), 4);
    for run in &runs {
        // Given back running, after its first level, by the drained worker…
        assert!(
            first_said.contains(&format!("run {run} is running after ")),
            "{run}: {first_said}"
        );
        // …and taken up and completed by the other.
        assert!(second_said.contains(&format!("claimed run {run} (three)")), "{second_said}");
        let log = events(db, &data, run);
        assert_eq!(finished_as(&log), ["completed"], "run {run}: {log:?}");
        assert_eq!(count(&log, "level_started"), 3, "run {run}: each level started once");
        assert_eq!(count(&log, "model_response"), 3, "run {run}: each call made once");
        assert_eq!(count(&log, "run_interrupted"), 0, "run {run}: {log:?}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A worker cut by its drain's end (grace 0) leaves its runs interrupted by the signal; two
/// workers already running race to take them up again on their own, after the retry wait:
/// each run is taken up once (one `run_resumed`), nothing in it done twice.
#[test]
fn runs_a_cut_worker_left_interrupted_are_taken_up_again_by_an_idle_one() {
    let schema = scratch("heal");
    let db = schema.url.as_str();
    let dir = temp("heal");
    let data = dir.join("data");
    let (script, pg) = own_scenario(
        &dir,
        db,
        (
            "two",
            "id: two\nversion: 1\nlevels:\n  - {id: a, kind: prompt, prompt: {inline: 'A {{ input }}'}}\n  - {id: b, kind: prompt, prompt: {inline: 'B'}, terminal: true}\nedges:\n  - {from: a, to: b}\n",
        ),
        "levels:\n  a: [{text: 'one', delay_ms: 3000}]\n  b: [{text: 'two', delay_ms: 100}]\n",
    );
    queue_lines(&pg, &dir, "two", "x\ny\n", ["--script".as_ref(), script.as_ref()]);
    let worker = |name: &str, idle: &str, grace: &str| {
        pg().args(["worker", "--concurrency", "4", "--idle-exit-s", idle, "--name", name])
            .args(["--drain-grace-s", grace, "--retry-first-ms", "200"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let first = worker("first", "60", "0");
    std::thread::sleep(std::time::Duration::from_millis(800));
    // Two more workers run beside it, idle (the first holds both runs), and race to heal:
    // each says where it listens once it has taken up what was left at its start, which
    // was nothing.
    let idle = |name: &str| {
        let mut worker = pg()
            .args(["worker", "--concurrency", "4", "--idle-exit-s", "8", "--name", name])
            .args(["--drain-grace-s", "30", "--retry-first-ms", "200", "--listen", "127.0.0.1:0"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut listening = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(worker.stdout.take().unwrap()),
            &mut listening,
        )
        .unwrap();
        assert!(listening.starts_with("listening on http://"), "{listening:?}");
        worker
    };
    let (second, third) = (idle("second"), idle("third"));
    signal(first.id(), "TERM");
    let first = finish(first, 30);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    let runs: Vec<String> = listed_runs(db, &data).into_iter().map(|(id, _)| id).collect();
    assert_eq!(runs.len(), 2);
    for run in &runs {
        assert_eq!(count(&events(db, &data, run), "run_interrupted"), 1, "cut: {run}");
    }
    // The idle workers take them up, after the retry wait: each run once, by one of them.
    let healed_at = std::time::Instant::now();
    let (second, third) = (finish(second, 60), finish(third, 60));
    let said = format!("{}{}", text(&second.stderr), text(&third.stderr));
    assert_eq!((second.status.code(), third.status.code()), (Some(0), Some(0)), "{said}");
    for run in &runs {
        let log = events(db, &data, run);
        assert_eq!(finished_as(&log), ["completed"], "run {run}: {log:?}\n{said}");
        let resumed: Vec<&Value> = log.iter().filter(|e| e["kind"] == "run_resumed").collect();
        assert_eq!(resumed.len(), 1, "{log:?}");
        assert_eq!(resumed[0]["data"]["by"], "driver");
        assert_eq!(count(&log, "model_response"), 2, "run {run}: {log:?}");
        assert_eq!(count(&log, "level_finished"), 2, "run {run}: {log:?}");
        assert!(said.contains(&format!("taking up run {run} again")), "{said}");
    }
    assert!(healed_at.elapsed() < std::time::Duration::from_secs(40));
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
    let second_pid = second.id();
    let first_pid = first.id();
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
    // The takeover is in the log: the pause the dead worker could not record, then the
    // second worker's resumption, before the level runs again.
    let paused: Vec<&Value> = log.iter().filter(|e| e["kind"] == "run_paused").collect();
    assert_eq!(paused.len(), 1, "{log:?}");
    assert_eq!(paused[0]["data"]["reason"], "driver_lost");
    let resumed: Vec<&Value> = log.iter().filter(|e| e["kind"] == "run_resumed").collect();
    assert_eq!(resumed.len(), 1, "{log:?}");
    assert_eq!(resumed[0]["data"]["by"], "takeover");
    let process = resumed[0]["data"]["process"].as_str().unwrap();
    // The second worker, by its name (by default its host and process id) and its process.
    assert!(process.starts_with("baton worker baton-worker-"), "{process}");
    assert!(process.ends_with(&format!(":{second_pid})")), "the second worker: {process}");
    // Between them, the takeover itself: who held the run (the first worker, which
    // started the level of a run another process queued) and who takes it.
    let taken: Vec<&Value> = log.iter().filter(|e| e["kind"] == "run_taken_over").collect();
    assert_eq!(taken.len(), 1, "{log:?}");
    let previous = taken[0]["data"]["previous"].as_str().unwrap();
    assert!(previous.ends_with(&format!(":{first_pid})")), "the first worker: {previous}");
    assert_eq!(taken[0]["data"]["by"].as_str(), Some(process));
    assert_eq!(taken[0]["level_id"], "answer");
    assert!(killed.elapsed().as_secs() < 40, "taken over and finished in {:?}", killed.elapsed());
    let _ = std::fs::remove_dir_all(dir);
}

/// How many jobs of each kind the chaos test queues: (scenario, count, input).
const CHAOS_JOBS: [(&str, usize, &str); 4] = [
    ("quick_qa", 700, "the capital of France?"),
    ("parallel_review_demo", 200, "a patch to review"),
    ("release_notes", 97, "PR 1: CSV export; PR 2: faster search"),
    ("code_build", 3, "a greet CLI"),
];

/// One script for every job of the chaos test: each scenario's bundled answers (level ids
/// do not collide), the quick ones slowed down so that kills and stops land mid-job.
fn chaos_script(dir: &Path) -> PathBuf {
    let read = |name: &str| {
        std::fs::read_to_string(super::repo().join("scenarios/scripts").join(name)).unwrap()
    };
    let after_levels = |text: String| text.split_once("levels:\n").unwrap().1.to_owned();
    let mut script = String::from("levels:\n");
    script.push_str(&after_levels(read("code_build.yaml")));
    script.push_str(&after_levels(read("release_notes.yaml")));
    script.push_str(
        "  answer: [{text: '{\"answer\": \"Paris\", \"confidence\": 0.97, \"sources\": []}', delay_ms: 400}]\n\
         \x20 reviewer_a: [{text: 'PASS: clear and correct', delay_ms: 150}]\n\
         \x20 reviewer_b: [{text: 'FAIL: misses an edge case', delay_ms: 150}]\n\
         \x20 reviewer_c: [{text: 'PASS: fine', delay_ms: 150}]\n\
         \x20 summary: [{text: 'Two of three reviewers approve.', delay_ms: 150}]\n",
    );
    let path = dir.join("chaos.yaml");
    std::fs::write(&path, script).unwrap();
    path
}

/// Queues `count` jobs of `scenario` with one `baton run --queue --input-lines`; their run
/// ids.
fn queue_many(
    db: &str,
    data: &Path,
    script: &Path,
    scenario: &str,
    count: usize,
    input: &str,
) -> Vec<String> {
    let lines = data.with_extension(format!("{scenario}.lines"));
    let inputs: String = (0..count).map(|i| format!("{input} #{i}\n")).collect();
    std::fs::write(&lines, inputs).unwrap();
    let out = baton_command()
        .arg("--db")
        .arg(db)
        .arg("--data-dir")
        .arg(data)
        .args(["run", scenario, "--queue", "--input-lines"])
        .arg(&lines)
        .arg("--script")
        .arg(script)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let ids: Vec<String> = text(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("run "))
        .map(str::to_owned)
        .collect();
    assert_eq!(ids.len(), count, "{}", text(&out.stdout));
    ids
}

/// Children killed when dropped: a failing test leaves no process behind.
struct Reaped(Vec<std::process::Child>);

impl Drop for Reaped {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A signal to a process, by its pid.
pub(crate) fn signal(pid: u32, name: &str) {
    let sent =
        std::process::Command::new("kill").arg(format!("-{name}")).arg(pid.to_string()).status();
    assert!(sent.is_ok_and(|s| s.success()), "kill -{name} {pid}");
}

/// The chaos test's worker slot that is stopped (and never killed).
const STALLED: usize = 0;

/// Four workers drive a thousand jobs of bundled scenarios (and a few code_build jobs in
/// the jail) while workers are killed and restarted at random and one is stopped past its
/// lease and continued: every job ends, none is lost, no level is finished twice, no
/// approval is decided twice (two deciders race on each), every log verifies, and the
/// stopped worker's late writes are refused as fenced.
#[test]
fn chaos_four_workers_killed_and_stopped_lose_nothing_and_do_nothing_twice() {
    use baton_engine::store::EventStore;
    let schema = scratch("chaos");
    let dir = temp("chaos");
    let data = dir.join("data");
    let script = chaos_script(&dir);
    let script_arg = script.to_str().unwrap().to_owned();
    // A few jobs answer slowly (3 s a call): the worker that is stopped is stopped in the
    // middle of them, so that it has writes to make when it is continued.
    let slow = dir.join("chaos-slow.yaml");
    let slowed =
        std::fs::read_to_string(&script).unwrap().replace("delay_ms: 400", "delay_ms: 3000");
    std::fs::write(&slow, slowed).unwrap();
    let lease = "3";
    // Each worker's notes go to a file of its own (a pipe nobody reads would fill up).
    let start_worker = |i: usize, generation: usize| {
        let name = format!("w{i}-{generation}");
        let notes = std::fs::File::create(dir.join(format!("{name}.err"))).unwrap();
        baton_command()
            .arg("--db")
            .arg(&schema.url)
            .arg("--data-dir")
            .arg(&data)
            .arg("worker")
            .args(["--script", &script_arg, "--concurrency", "6", "--lease-s", lease])
            .args(["--retry-first-ms", "100", "--name", &name])
            .stdout(std::process::Stdio::null())
            .stderr(notes)
            .spawn()
            .unwrap()
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let store =
        runtime.block_on(baton_store::postgres::PostgresStore::connect(&schema.url)).unwrap();
    // How many runs the worker process `pid` holds now (a store's holder id starts with
    // its process id): each one a drive of its, until another process takes it over.
    let config: tokio_postgres::Config = schema.url.parse().unwrap();
    let (client, connection) = runtime.block_on(config.connect(tokio_postgres::NoTls)).unwrap();
    runtime.spawn(connection);
    let holds_of = |pid: u32| -> i64 {
        runtime
            .block_on(client.query_one(
                "SELECT count(*) FROM holds WHERE holder LIKE $1",
                &[&format!("{pid}-%")],
            ))
            .unwrap()
            .get(0)
    };
    // The runs the worker process `pid` holds that are still running: runs it is in the
    // middle of driving.
    let driving = |pid: u32| -> Vec<String> {
        runtime
            .block_on(client.query(
                "SELECT h.run_id FROM holds h JOIN runs r ON r.run_id = h.run_id
                  WHERE h.holder LIKE $1 AND r.status = 'running' ORDER BY h.run_id",
                &[&format!("{pid}-%")],
            ))
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    // The slow jobs are queued and the worker to be stopped started alone: once it drives
    // them all (each in its 3 s model call) it is stopped, then the others start and the
    // rest of the jobs are queued.
    let mut all = queue_many(&schema.url, &data, &slow, "quick_qa", 6, "slowly");
    let mut workers = Reaped(vec![start_worker(STALLED, 0)]);
    let pid = workers.0[STALLED].id();
    let waited = std::time::Instant::now();
    while driving(pid).len() < 6 {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(60),
            "the first worker took up {:?} of the 6 slow jobs in 60 s",
            driving(pid)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    signal(pid, "STOP");
    let mut stopped = Some((STALLED, std::time::Instant::now()));
    std::thread::sleep(std::time::Duration::from_millis(200));
    let held = driving(pid);
    assert!(!held.is_empty(), "the stopped worker drives none of the slow jobs any more");
    workers.0.extend((1..4).map(|i| start_worker(i, 0)));
    // Each slot's worker's name (its notes are `NAME.err`).
    let mut names: Vec<String> = (0..4).map(|i| format!("w{i}-0")).collect();
    let mut generation = 1;
    for (scenario, count, input) in CHAOS_JOBS {
        all.extend(queue_many(&schema.url, &data, &script, scenario, count, input));
    }
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut decided = std::collections::BTreeMap::new();
    let mut redecided = 0;
    let mut deciders = Reaped(Vec::new());
    // How long the stopped worker was stopped, and the holds it still had when continued.
    let mut continued = None;
    let mut kills = 0;
    // Time runs from here: every job is queued (the workers started before).
    let started = std::time::Instant::now();
    let deadline = std::time::Duration::from_secs(360);
    loop {
        let runs = runtime.block_on(store.runs(None)).unwrap();
        let open: Vec<_> = runs
            .iter()
            .filter(|r| {
                !matches!(r.status.as_str(), "completed" | "failed" | "aborted" | "cancelled")
            })
            .collect();
        if runs.len() >= all.len() && open.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < deadline,
            "{} of {} jobs still open after {:?}: {:?}",
            open.len(),
            all.len(),
            started.elapsed(),
            open.iter().take(5).map(|r| (&r.run_id, &r.status)).collect::<Vec<_>>()
        );
        // Two deciders race on every approval that waits (at most 8 at once); one still
        // waiting long after is decided again.
        deciders.0.retain_mut(|d| d.try_wait().unwrap().is_none());
        for r in runs.iter().filter(|r| r.status == "paused") {
            if deciders.0.len() >= 8 {
                break;
            }
            let again = decided.get(&r.run_id).is_some_and(|at: &std::time::Instant| {
                at.elapsed() > std::time::Duration::from_secs(15)
            });
            if decided.contains_key(&r.run_id) && !again {
                continue;
            }
            if again {
                redecided += 1;
            }
            decided.insert(r.run_id.clone(), std::time::Instant::now());
            for who in ["ann", "bob"] {
                deciders.0.push(
                    baton_command()
                        .arg("--db")
                        .arg(&schema.url)
                        .arg("--data-dir")
                        .arg(&data)
                        .args(["approve", &r.run_id, "--no-resume", "--by", who])
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .spawn()
                        .unwrap(),
                );
            }
        }
        let elapsed = started.elapsed().as_secs();
        // The stopped worker is continued once its holds have run out (6 s) and every run
        // it held has been taken over by another (its hold rows name the other now), so
        // that it comes back to runs it no longer holds, however slowly a loaded machine
        // takes them over (bounded).
        if let Some((i, at)) = stopped
            && ((at.elapsed() > std::time::Duration::from_secs(6)
                && holds_of(workers.0[i].id()) == 0)
                || at.elapsed() > std::time::Duration::from_secs(90))
        {
            continued = Some((at.elapsed(), holds_of(workers.0[i].id())));
            signal(workers.0[i].id(), "CONT");
            stopped = None;
        }
        // About twice a second, a worker that is not the stopped one is killed and
        // another started in its place.
        if elapsed > 2 && next() % 4 == 0 && kills < 12 {
            let i = usize::try_from(next() % 4).unwrap();
            if i != STALLED {
                workers.0[i].kill().unwrap();
                let _ = workers.0[i].wait();
                workers.0[i] = start_worker(i, generation);
                names[i] = format!("w{i}-{generation}");
                generation += 1;
                kills += 1;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    for d in &mut deciders.0 {
        let _ = d.wait();
    }
    // Every job is there and ended; each log verifies; nothing happened twice.
    let runs = runtime.block_on(store.runs(None)).unwrap();
    let roots: std::collections::BTreeSet<_> =
        runs.iter().filter(|r| r.parent_run_id.is_none()).map(|r| r.run_id.clone()).collect();
    for id in &all {
        assert!(roots.contains(id), "job {id} was lost");
    }
    let mut statuses = std::collections::BTreeMap::new();
    for r in &runs {
        *statuses.entry(r.status.clone()).or_insert(0) += 1;
        let log = runtime.block_on(store.load(&r.run_id, 0)).unwrap_or_else(|e| panic!("{e}"));
        let mut finished = std::collections::BTreeMap::new();
        let mut decisions = std::collections::BTreeMap::new();
        for e in &log {
            let json = serde_json::to_value(e).unwrap();
            match json["kind"].as_str() {
                Some("level_finished") => {
                    *finished.entry((e.level_id.clone(), e.attempt)).or_insert(0) += 1;
                }
                Some("approval_decided") => {
                    *decisions.entry(json["data"]["request_id"].to_string()).or_insert(0) += 1;
                }
                _ => {}
            }
        }
        assert!(
            finished.values().all(|n| *n == 1),
            "run {}: a level finished twice: {finished:?}",
            r.run_id
        );
        assert!(
            decisions.values().all(|n| *n == 1),
            "run {}: an approval decided twice: {decisions:?}",
            r.run_id
        );
    }
    assert_eq!(statuses.get("completed").copied().unwrap_or(0), runs.len(), "{statuses:?}");
    // The stopped worker came back to runs others had taken over: its writes were refused.
    let i = STALLED;
    // Its runs were taken over and ended while it was stopped; continued now (if the loop
    // has not already), it comes back to them and is refused: wait for that, bounded.
    if let Some((s, _)) = stopped {
        signal(workers.0[s].id(), "CONT");
    }
    let notes = dir.join(format!("{}.err", names[i]));
    let waited = std::time::Instant::now();
    let mut stopped_out = String::new();
    // Refused as an append under a hold that changed hands, or as a lease renewal.
    let refused = |out: &str| {
        out.contains("was taken over by another process")
            || (out.contains("the lease on run") && out.contains("was lost"))
    };
    while waited.elapsed() < std::time::Duration::from_secs(60) {
        stopped_out = std::fs::read_to_string(&notes).unwrap_or_default();
        if refused(&stopped_out) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        refused(&stopped_out),
        "the stopped worker's late writes were not refused (it was driving {held:?}; stopped for, holds left: {continued:?}): {stopped_out}"
    );
    drop(workers);
    // The figures, for a reader of the test's output (`--no-capture`).
    #[allow(clippy::print_stderr)]
    {
        eprintln!(
            "chaos: {} jobs ({} runs) in {:?}, {kills} kills, one stop past the lease, {redecided} approvals decided again after both deciders failed",
            all.len(),
            runs.len(),
            started.elapsed()
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A database left at an older schema version is refused by every command with what to
/// do, and `baton migrate` moves it forward keeping its runs.
#[test]
fn an_older_database_is_refused_until_baton_migrate_moves_it_forward() {
    let schema = scratch("migrate");
    let dir = temp("migrate");
    let data = dir.join("data");
    let run = baton_pg(&schema.url, &data, &RELEASE_NOTES);
    assert_eq!(run.status.code(), Some(3), "{}", text(&run.stderr));
    // Back to version 1, as a database made by the binary before holds and per-tenant keys
    // existed.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let config: tokio_postgres::Config = schema.url.parse().unwrap();
        let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        client
            .batch_execute(
                "DROP INDEX events_feed; ALTER TABLE events DROP COLUMN tx, DROP COLUMN pos;
                 DROP TRIGGER events_webhook_outbox ON events; DROP FUNCTION baton_webhook_outbox();
                 DROP TABLE webhooks, webhook_deliveries, webhook_attempts;
                 DROP TABLE sessions; DROP TABLE holds; DROP INDEX runs_by_idempotency_key;
                 CREATE UNIQUE INDEX runs_by_idempotency_key ON runs (idempotency_key)
                     WHERE idempotency_key IS NOT NULL;
                 ALTER TABLE runs DROP COLUMN key_request, DROP COLUMN key_expires_us,
                     DROP COLUMN chain;
                 DROP TABLE queues, tenant_limits;
                 ALTER TABLE runs DROP COLUMN queue, DROP COLUMN priority, DROP COLUMN due_us,
                     DROP COLUMN home, DROP COLUMN events_version;
                 ALTER TABLE events DROP COLUMN writer; DROP TABLE live_listeners;
                 DELETE FROM schema_version WHERE version > 1",
            )
            .await
            .unwrap();
        // Its events hashed as that binary hashed them: canonical JSON of each payload.
        use baton_engine::chain::{self, Fields, GENESIS, Payload};
        let rows = client
            .query(
                "SELECT run_id, seq, at_us, kind, version, level_id, attempt, data FROM events ORDER BY run_id, seq",
                &[],
            )
            .await
            .unwrap();
        let mut heads: Vec<(String, chain::Hash)> = Vec::new();
        for r in rows {
            let run: String = r.get(0);
            if heads.last().is_none_or(|(id, _)| *id != run) {
                heads.push((run.clone(), GENESIS));
            }
            let payload: Value = serde_json::from_str(r.get::<_, &str>(7)).unwrap();
            let (seq, attempt): (i64, Option<i64>) = (r.get(1), r.get(6));
            let fields = Fields {
                seq: u64::try_from(seq).unwrap(),
                at_us: r.get(2),
                kind: r.get(3),
                version: u16::try_from(r.get::<_, i32>(4)).unwrap(),
                level_id: r.get(5),
                attempt: attempt.map(|a| u32::try_from(a).unwrap()),
                payload: Payload::Json(&payload),
            };
            let head = &mut heads.last_mut().unwrap().1;
            *head = chain::link(head, &fields);
            client
                .execute(
                    "UPDATE events SET hash = $3 WHERE run_id = $1 AND seq = $2",
                    &[&run, &seq, &head.as_slice()],
                )
                .await
                .unwrap();
        }
        for (run, head) in heads {
            client
                .execute(
                    "UPDATE runs SET head_hash = $2 WHERE run_id = $1",
                    &[&run, &head.as_slice()],
                )
                .await
                .unwrap();
        }
    });
    let refused = baton_pg(&schema.url, &data, &["runs"]);
    assert_eq!(refused.status.code(), Some(1));
    let err = text(&refused.stderr);
    assert!(
        err.contains("is at schema version 1, this binary needs 9: run `baton migrate"),
        "{err}"
    );
    let migrated = baton_pg(&schema.url, &data, &["migrate"]);
    assert_eq!(migrated.status.code(), Some(0), "{}", text(&migrated.stderr));
    assert!(text(&migrated.stdout).contains("schema version 1 → 9"), "{}", text(&migrated.stdout));
    let again = baton_pg(&schema.url, &data, &["migrate"]);
    assert!(text(&again.stdout).contains("nothing to do"), "{}", text(&again.stdout));
    let id = run_id(&run.stdout);
    let listed = text(&baton_pg(&schema.url, &data, &["runs"]).stdout);
    assert!(listed.contains(&id) && listed.contains("paused"), "{listed}");
    // The older run verifies in the form it was hashed in, and goes on in it.
    let verified = baton_pg(&schema.url, &data, &["verify", "--json"]);
    assert_eq!(verified.status.code(), Some(0), "{}", text(&verified.stdout));
    let report: Value = serde_json::from_slice(&verified.stdout).unwrap();
    assert_eq!(report["runs"][0]["chain"], "sha256-canonical-json", "{report}");
    let approved = baton_pg(&schema.url, &data, &["approve", &id, "--by", "rm"]);
    assert_eq!(approved.status.code(), Some(0), "{}", text(&approved.stderr));
    let verified = baton_pg(&schema.url, &data, &["verify", "--json"]);
    assert_eq!(verified.status.code(), Some(0), "{}", text(&verified.stdout));
    let report: Value = serde_json::from_slice(&verified.stdout).unwrap();
    assert_eq!(report["runs"][0]["chain"], "sha256-canonical-json", "{report}");
    let listed = text(&baton_pg(&schema.url, &data, &["runs"]).stdout);
    assert!(listed.contains(&id) && listed.contains("completed"), "{listed}");
    // A run started now takes today's form beside it.
    let fresh = baton_pg(&schema.url, &data, &RELEASE_NOTES);
    assert_eq!(fresh.status.code(), Some(3), "{}", text(&fresh.stderr));
    let verified = baton_pg(&schema.url, &data, &["verify", &run_id(&fresh.stdout), "--json"]);
    let report: Value = serde_json::from_slice(&verified.stdout).unwrap();
    assert_eq!(report["runs"][0]["chain"], "sha256-encoded", "{report}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Where a retention test keeps its runs: a SQLite file, or a PostgreSQL schema with a
/// data directory.
enum Db<'a> {
    Sqlite(PathBuf),
    Postgres(&'a str, PathBuf),
}

impl Db<'_> {
    /// `baton ARGS` on this database, not started yet.
    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut c = baton_command();
        match self {
            Db::Sqlite(db) => c.arg("--db").arg(db),
            Db::Postgres(url, data) => c.arg("--db").arg(url).arg("--data-dir").arg(data),
        };
        c.args(args);
        c
    }

    fn baton(&self, args: &[&str]) -> std::process::Output {
        self.command(args).output().unwrap()
    }

    fn data(&self) -> PathBuf {
        match self {
            Db::Sqlite(db) => db.parent().unwrap().to_path_buf(),
            Db::Postgres(_, data) => data.clone(),
        }
    }
}

/// `baton purge` removes whole ended jobs — runs, logs, the workspaces they made and their
/// snapshots — and keeps a job that waits; the purged log is gone from the database.
fn purge_removes_ended_jobs_and_everything_they_left(db: &Db<'_>, marker: &str) {
    let input = format!("a greet CLI {marker}");
    let built = db.baton(&[
        "run",
        "code_build",
        "--script",
        "scenarios/scripts/code_build.yaml",
        "--input",
        &input,
    ]);
    assert_eq!(built.status.code(), Some(0), "{}{}", text(&built.stdout), text(&built.stderr));
    let built = run_id(&built.stdout);
    let workspace = db.data().join("workspaces").join(&built);
    assert!(workspace.is_dir(), "{} holds the run's files", workspace.display());
    let asked = db.baton(&[
        "run",
        "quick_qa",
        "--script",
        "scenarios/scripts/quick_qa.yaml",
        "--input",
        &input,
    ]);
    assert_eq!(asked.status.code(), Some(0), "{}", text(&asked.stderr));
    let asked = run_id(&asked.stdout);
    let waiting = db.baton(&RELEASE_NOTES);
    assert_eq!(waiting.status.code(), Some(3), "{}", text(&waiting.stderr));
    let waiting = run_id(&waiting.stdout);

    let dry = db.baton(&["purge", "--finished-before", "0s", "--dry-run"]);
    assert_eq!(dry.status.code(), Some(0), "{}", text(&dry.stderr));
    let said = text(&dry.stdout);
    assert!(
        said.contains(&format!("would purge job {built}"))
            && said.contains(&format!("would purge job {asked}")),
        "{said}"
    );
    assert!(!said.contains(&waiting), "a paused job stays: {said}");
    assert!(workspace.is_dir(), "a dry run removes nothing");

    let kept = db.baton(&["purge", "--finished-before", "1d"]);
    assert!(text(&kept.stdout).contains("nothing ended before"), "{}", text(&kept.stdout));
    let purged = db.baton(&["purge", "--finished-before", "0s"]);
    assert_eq!(purged.status.code(), Some(0), "{}", text(&purged.stderr));
    let said = text(&purged.stdout);
    assert!(said.contains("purged 2 job(s), 2 run(s)"), "{said}");
    assert!(said.contains(&format!("removed {}", workspace.display())), "{said}");
    assert!(!workspace.exists(), "the workspace is gone");
    let listed = text(&db.baton(&["runs"]).stdout);
    assert!(
        listed.contains(&waiting) && !listed.contains(&built) && !listed.contains(&asked),
        "{listed}"
    );
    let gone = db.baton(&["events", &built]);
    assert_eq!(gone.status.code(), Some(1), "{}", text(&gone.stdout));
    let verified = db.baton(&["verify"]);
    assert_eq!(verified.status.code(), Some(0), "{}", text(&verified.stdout));

    // A job a process is driving is not removed, even when told to remove an unended one.
    let slow = db.data().join("slow-quick-qa.yaml");
    std::fs::write(
        &slow,
        "levels:\n  answer:\n    - text: '{\"answer\": \"Paris\", \"confidence\": 0.9, \"sources\": []}'\n      delay_ms: 20000\n",
    )
    .unwrap();
    let mut driver =
        db.command(&["run", "quick_qa", "--script", slow.to_str().unwrap(), "--input", "slow"]);
    let mut driver = driver
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let driven = loop {
        let listed: serde_json::Value =
            serde_json::from_slice(&db.baton(&["runs", "--json"]).stdout).unwrap_or_default();
        let found = listed
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["scenario_id"] == "quick_qa" && r["status"] == "running");
        if let Some(r) = found {
            break r["run_id"].as_str().unwrap().to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "the slow run never started");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let held = db.baton(&["purge", "--job", &driven, "--unended"]);
    let said = text(&held.stderr);
    assert_eq!(held.status.code(), Some(1), "{said}");
    assert!(said.contains("is being driven by a process"), "{said}");
    assert!(text(&db.baton(&["runs"]).stdout).contains(&driven), "the driven job stays");
    let _ = driver.kill();
    let _ = driver.wait();
    let removed = db.baton(&["purge", "--job", &driven, "--unended"]);
    assert_eq!(removed.status.code(), Some(0), "{}", text(&removed.stderr));

    // An operator removes one job by name: an unended one only when told so.
    let refused = db.baton(&["purge", "--job", &waiting]);
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused.stdout));
    let said = text(&refused.stderr);
    assert!(said.contains("has runs that have not ended") && said.contains("--unended"), "{said}");
    let removed = db.baton(&["purge", "--job", &waiting, "--unended"]);
    assert_eq!(removed.status.code(), Some(0), "{}", text(&removed.stderr));
    assert!(text(&removed.stdout).contains(&format!("purged job {waiting}")));
    assert!(!text(&db.baton(&["runs"]).stdout).contains(&waiting));
    let missing = db.baton(&["purge", "--job", "no-such-run"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing.stderr).contains("no run no-such-run"), "{}", text(&missing.stderr));
}

#[test]
fn purge_on_sqlite_leaves_nothing_of_a_purged_log_in_the_files() {
    let dir = temp("purge-sqlite");
    let db = dir.join("runs.db");
    let marker = "MARKER-7f3a9c1e";
    purge_removes_ended_jobs_and_everything_they_left(&Db::Sqlite(db.clone()), marker);
    for file in ["runs.db", "runs.db-wal"] {
        let bytes = std::fs::read(dir.join(file)).unwrap_or_default();
        let found = bytes.windows(marker.len()).any(|w| w == marker.as_bytes());
        assert!(!found, "{file} still holds the purged input");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn purge_on_postgres_leaves_nothing_of_a_purged_log_in_the_tables() {
    let schema = scratch("purge");
    let dir = temp("purge-pg");
    let marker = "MARKER-51d0b2aa";
    purge_removes_ended_jobs_and_everything_they_left(
        &Db::Postgres(&schema.url, dir.join("data")),
        marker,
    );
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let left: i64 = runtime.block_on(async {
        let config: tokio_postgres::Config = schema.url.parse().unwrap();
        let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let like = format!("%{marker}%");
        client
            .query_one("SELECT count(*) FROM events WHERE data LIKE $1", &[&like])
            .await
            .unwrap()
            .get(0)
    });
    assert_eq!(left, 0, "no event of a purged run is left");
    let _ = std::fs::remove_dir_all(dir);
}

/// `baton bench --store postgres`: runs spread over several stores in a schema of its own
/// (dropped after), at most one write transaction per level, the server's durability setting and
/// the disk's fsync floor beside the figures; `takeover` times how soon a dead driver's run
/// is held again.
#[test]
fn the_postgres_bench_reports_its_figures_with_what_they_stood_on() {
    let out = baton_command()
        .args(["bench", "--workload", "linear5", "--store", "postgres", "--bench-db", &base()])
        .args(["--workers", "2", "--concurrency", "10", "--runs", "40", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["workers"], 2, "{report}");
    assert_eq!(report["mode"], "in-process stores", "{report}");
    assert_eq!(report["levels"], 200, "{report}");
    // At most one commit a level: a run's creation and its levels' appends, several runs'
    // sharing one commit when they come together, and its hold's taking and giving back
    // (about two thirds of a commit a level with ten runs in flight per store).
    let commits = report["commits_per_level"].as_f64().unwrap();
    assert!(commits > 0.0 && commits <= 1.0, "{report}");
    assert_eq!(report["postgres_synchronous_commit"], "on", "{report}");
    assert!(report["fsync_floor_p50_ms"].as_f64().unwrap() > 0.0, "{report}");
    assert!(report["store_bytes_per_run"].as_f64().unwrap() > 0.0, "{report}");
    let out = baton_command()
        .args(["bench", "--workload", "takeover", "--store", "postgres", "--bench-db", &base()])
        .args(["--runs", "5", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["takeovers"], 5, "{report}");
    let p50 = report["takeover_p50_ms"].as_f64().unwrap();
    assert!(p50 > 0.0 && p50 < 5_000.0, "a dead driver's run is held again at once: {report}");
    // Real worker processes on a queue the bench fills: every run claimed once, each
    // claim timed by the worker that made it.
    let out = baton_command()
        .args(["bench", "--workload", "linear5", "--store", "postgres", "--bench-db", &base()])
        .args(["--processes", "2", "--concurrency", "4", "--runs", "30", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["mode"], "worker processes (claims, leases, a queue)", "{report}");
    assert_eq!((report["processes"].as_u64(), report["claims"].as_u64()), (Some(2), Some(30)));
    assert_eq!(report["levels"], 150, "{report}");
    let claim = report["claim_p50_ms"].as_f64().unwrap();
    assert!(claim > 0.0 && claim <= report["claim_p99_ms"].as_f64().unwrap(), "{report}");
    assert!(report["levels_per_s"].as_f64().unwrap() > 0.0, "{report}");
    assert!(report["transactions_per_level"].as_f64().unwrap() > 0.0, "{report}");
    let refused = baton_command()
        .args(["bench", "--workload", "approval", "--store", "postgres", "--bench-db", &base()])
        .args(["--processes", "2"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("linear5, gate_loop or fanout8"),
        "{}",
        text(&refused.stderr)
    );
    let refused = baton_command()
        .args(["bench", "--workload", "linear5", "--store", "postgres"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(text(&refused.stderr).contains("--bench-db postgres://"), "{}", text(&refused.stderr));
}

/// The text of a model answer streaming in on a worker reaches the event streams of
/// `baton serve` — another process — piece by piece while the run goes on, as it does for
/// a run the server drives: the worker shares it through PostgreSQL (`pg_notify`, never
/// stored) and the server's listen connection hands it to the run's streams. The log's
/// events arrive as the worker commits them, woken by the notice of each append.
#[test]
fn a_worker_driven_runs_answer_streams_live_to_a_servers_followers() {
    let schema = scratch("live");
    let db = schema.url.as_str();
    let dir = temp("live");
    let (script, pg) = own_scenario(
        &dir,
        db,
        (
            "two",
            "id: two\nversion: 1\nlevels:\n  - {id: first, kind: prompt, prompt: {inline: 'One {{ input }}'}}\n  - {id: second, kind: prompt, prompt: {inline: 'Two'}, terminal: true}\nedges:\n  - {from: first, to: second}\n",
        ),
        "levels:\n  first: [{text: 'streamed across processes', delay_ms: 1500}]\n  second: [{text: 'done', delay_ms: 1500}]\n",
    );
    let mut server = pg()
        .args(["serve", "--no-auth", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(dir.join("serve.err")).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let addr = line.trim().strip_prefix("listening on http://").unwrap_or_else(|| {
        panic!("{line:?} {}", std::fs::read_to_string(dir.join("serve.err")).unwrap())
    });
    // Queued after the server started: the server leaves a queued run to workers for
    // seconds before it takes it up itself, so the worker drives this run.
    let queued = pg()
        .args(["run", "two", "--queue", "--input", "x", "--script", script.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(queued.status.code(), Some(0), "{}", text(&queued.stderr));
    let run = run_id(&queued.stdout);
    let page = super::serve::http(addr, "GET", "/runs?status=queued", &[], None).json();
    assert_eq!(page["runs"][0]["run_id"], run.as_str(), "{page}");
    assert_eq!(page["runs"][0]["status"], "queued");
    let mut live = super::serve::stream(addr, &format!("/runs/{run}/events"), &[]).unwrap();
    let mut worker = pg()
        .args(["worker", "--idle-exit-s", "2"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("worker.err")).unwrap())
        .spawn()
        .unwrap();
    // Each event of the log arrives as soon as the worker commits it: the server's stream
    // is woken by the notice of the worker's append, not by its next look (every 250 ms).
    let opened = chrono::Utc::now();
    let mut events = Vec::new();
    let mut slowest = chrono::TimeDelta::zero();
    while let Some(e) = live.next() {
        let arrived = chrono::Utc::now();
        let at: chrono::DateTime<chrono::Utc> = e.data["at"].as_str().unwrap().parse().unwrap();
        if at > opened {
            slowest = slowest.max(arrived - at);
        }
        let last = e.kind == "scenario_finished";
        events.push(e);
        if last {
            break;
        }
    }
    let _ = worker.wait();
    let _ = server.kill();
    let _ = server.wait();
    let logged = events
        .iter()
        .find(|e| e.kind == "model_response" && e.data["level_id"] == "first")
        .and_then(|e| e.data["data"]["text"].as_str())
        .expect("the first level's answer");
    let streamed: String = live
        .deltas
        .iter()
        .filter(|d| d["run_id"] == run.as_str() && d["level_id"] == "first")
        .map(|d| d["text"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, logged, "deltas seen: {:?}", live.deltas);
    assert!(
        slowest < chrono::TimeDelta::milliseconds(150),
        "an event reached the stream {slowest} after it was committed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Workers publish pieces of answers only while a listener that relays them lives: a
/// connection that listens on the channel without naming itself hears nothing of a
/// worker's run; once it is named in `live_listeners`, the next run's pieces reach it.
#[test]
fn workers_publish_pieces_of_answers_only_while_a_relaying_listener_lives() {
    let schema = scratch("live-gate");
    let db = schema.url.as_str();
    let dir = temp("live-gate");
    let data = dir.join("data");
    let script = super::repo().join("scenarios/scripts/quick_qa.yaml");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (client, heard) = runtime.block_on(async {
        let (client, mut connection) =
            tokio_postgres::connect(db, tokio_postgres::NoTls).await.unwrap();
        let heard = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = std::sync::Arc::clone(&heard);
        tokio::spawn(async move {
            while let Some(Ok(message)) =
                std::future::poll_fn(|cx| connection.poll_message(cx)).await
            {
                if let tokio_postgres::AsyncMessage::Notification(n) = message
                    && n.channel() == "baton_live"
                {
                    counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        client.batch_execute("LISTEN baton_live").await.unwrap();
        (client, heard)
    });
    let drive = |input: &str| {
        let run = queue(db, &data, &script, input);
        let worker = baton_command()
            .arg("--db")
            .arg(db)
            .arg("--data-dir")
            .arg(&data)
            .args(["worker", "--idle-exit-s", "2"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let out = finish(worker, 60);
        assert_eq!(out.status.code(), Some(0));
        assert_eq!(listed_runs(db, &data).iter().find(|(r, _)| *r == run).unwrap().1, "completed");
    };
    let settle = |runtime: &tokio::runtime::Runtime| {
        runtime.block_on(async { tokio::time::sleep(std::time::Duration::from_millis(300)).await });
    };
    drive("nobody listens");
    settle(&runtime);
    assert_eq!(heard.load(std::sync::atomic::Ordering::Relaxed), 0, "published to no one");
    runtime.block_on(async {
        client
            .batch_execute(
                "INSERT INTO live_listeners (listener_pid, listener_since)
                   SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()",
            )
            .await
            .unwrap();
    });
    drive("a listener lives");
    settle(&runtime);
    assert!(heard.load(std::sync::atomic::Ordering::Relaxed) > 0, "published once listened to");
    drop(client);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A model server speaking OpenAI's Chat Completions (no streaming) on 127.0.0.1 that
/// answers each request 100 ms late and logs its prompt: which calls were made, how often,
/// and which were in flight at a moment.
pub(crate) struct SlowModel {
    pub(crate) port: u16,
    /// Every request's last message, in the order they came.
    pub(crate) asked: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// The requests not answered yet.
    pub(crate) in_flight: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The most requests unanswered at once.
    pub(crate) peak: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl SlowModel {
    pub(crate) fn start() -> SlowModel {
        use std::io::{BufRead, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let in_flight = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let peak = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (log, busy) = (std::sync::Arc::clone(&asked), std::sync::Arc::clone(&in_flight));
        let most = std::sync::Arc::clone(&peak);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let (log, busy) = (std::sync::Arc::clone(&log), std::sync::Arc::clone(&busy));
                let most = std::sync::Arc::clone(&most);
                std::thread::spawn(move || {
                    let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
                    let mut length = 0usize;
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let request: Value = serde_json::from_slice(&body).unwrap_or_default();
                    let prompt = request["messages"]
                        .as_array()
                        .and_then(|m| m.last())
                        .and_then(|m| m["content"].as_str())
                        .unwrap_or_default()
                        .to_owned();
                    let now = busy.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                    log.lock().unwrap().push(prompt);
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    let answer = r#"{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
                    // Counted out before it is answered: a call the caller has the answer
                    // to is never still counted in flight.
                    busy.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                        answer.len()
                    );
                });
            }
        });
        SlowModel { port, asked, in_flight, peak }
    }
}

/// Four workers share 200 queued runs; two of them are sent SIGTERM while their calls are
/// in flight. The drained ones finish their steps and give their runs back; every run
/// completes, none is ever interrupted, and the model server never sees a call twice.
#[test]
fn four_workers_two_drained_mid_flight_complete_two_hundred_runs_with_no_call_made_twice() {
    let schema = scratch("fleet");
    let db = schema.url.as_str();
    let dir = temp("fleet");
    let data = dir.join("data");
    let model = SlowModel::start();
    let (_, pg) = own_scenario(
        &dir,
        db,
        (
            "three",
            "id: three\nversion: 1\nlevels:\n  - {id: a, kind: prompt, prompt: {inline: 'A {{ input }}'}}\n  - {id: b, kind: prompt, prompt: {inline: 'B {{ input }}'}}\n  - {id: c, kind: prompt, prompt: {inline: 'C {{ input }}'}, terminal: true}\nedges:\n  - {from: a, to: b}\n  - {from: b, to: c}\n",
        ),
        "levels: {}\n",
    );
    let config = dir.join("baton.toml");
    std::fs::write(
        &config,
        format!(
            "[routing]\ndefault = \"free:local/m\"\n\n[[providers]]\nname = \"local\"\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:{}/v1\"\ntier = \"free\"\nstream = false\n\n[[providers.models]]\nname = \"m\"\n",
            model.port
        ),
    )
    .unwrap();
    let inputs: Vec<String> = (0..200).map(|i| format!("q{i}")).collect();
    queue_lines(&pg, &dir, "three", &inputs.join("\n"), ["--config".as_ref(), config.as_ref()]);
    let worker = |name: &str| {
        pg().arg("--config")
            .arg(&config)
            .args(["worker", "--concurrency", "25", "--lease-s", "5", "--name", name])
            .args(["--idle-exit-s", "4", "--drain-grace-s", "30"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let workers: Vec<Heard> =
        ["w1", "w2", "w3", "w4"].iter().map(|n| Heard::new(worker(n))).collect();
    // Mid-flight: the first two have claimed runs, and calls are being answered, when they
    // get SIGTERM.
    workers[0].wait_for("claimed run ", 1, 60);
    workers[1].wait_for("claimed run ", 1, 60);
    let started = std::time::Instant::now();
    while model.asked.lock().unwrap().len() < 150 {
        assert!(started.elapsed().as_secs() < 60, "the workers never got going");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let busy = model.in_flight.load(std::sync::atomic::Ordering::SeqCst);
    signal(workers[0].child.id(), "TERM");
    signal(workers[1].child.id(), "TERM");
    assert!(busy > 0, "calls were in flight when the workers were signalled");
    let outs: Vec<std::process::Output> = workers.into_iter().map(|w| w.finish(180)).collect();
    for (i, out) in outs.iter().enumerate() {
        assert_eq!(out.status.code(), Some(0), "worker {}: {}", i + 1, text(&out.stderr));
    }
    // Each drained worker gave runs back in flight (between two of their steps).
    for out in &outs[..2] {
        let said = text(&out.stderr);
        assert!(said.contains("draining"), "{said}");
        assert!(said.contains(" is running after "), "no run was given back: {said}");
    }
    let statuses: Vec<String> = listed_runs(db, &data).into_iter().map(|(_, s)| s).collect();
    assert_eq!(statuses.len(), 200, "{statuses:?}");
    assert!(statuses.iter().all(|s| s == "completed"), "{statuses:?}");
    // Every call was made once: 600 prompts, none twice.
    let asked = model.asked.lock().unwrap().clone();
    let unique: std::collections::HashSet<&String> = asked.iter().collect();
    assert_eq!(unique.len(), 600, "{} calls for 600 prompts", asked.len());
    assert_eq!(asked.len(), 600, "a call was made twice");
    let _ = std::fs::remove_dir_all(dir);
}
