//! Workspaces that follow their run to another host: two workers on different data dirs
//! share PostgreSQL and moto's S3 server (`.peers/moto`). A `code_build` run whose worker is
//! killed inside its tool loop, after its file edits and before the level ends, completes on
//! the other with the same files and verdicts as a run never interrupted; `baton purge`
//! removes what it left in the store. Without the store the same takeover is refused and
//! the run completes on its first host.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::postgres::{Heard, baton_pg, scratch, temp};
use super::{baton_command, repo, text};

/// The bucket the tests hand workspaces off through.
const BUCKET: &str = "baton";

/// moto's S3 server on a free loopback port, stopped when dropped.
struct Moto {
    child: Child,
    port: u16,
}

impl Moto {
    fn start(dir: &Path) -> Moto {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = std::fs::File::create(dir.join("moto.log")).unwrap();
        let child = Command::new(repo().join(".peers/moto/bin/moto_server"))
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("moto's server is installed by scripts/test in .peers/moto");
        let moto = Moto { child, port };
        // The bucket, made by a plain S3 PUT once the server answers (moto checks no
        // signature).
        let started = Instant::now();
        loop {
            if let Ok(answer) = moto.http(&format!("PUT /{BUCKET} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
            {
                assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
                return moto;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "moto's server never answered");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends one raw HTTP request; the whole answer.
    fn http(&self, request: &str) -> std::io::Result<String> {
        use std::io::{Read as _, Write as _};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.write_all(request.as_bytes())?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        Ok(answer)
    }

    /// The object keys the bucket holds under `prefix`.
    fn keys(&self, prefix: &str) -> Vec<String> {
        let answer = self
            .http(&format!(
                "GET /{BUCKET}?list-type=2&prefix={prefix} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
                self.port
            ))
            .unwrap();
        answer
            .split("<Key>")
            .skip(1)
            .filter_map(|rest| rest.split_once("</Key>").map(|(key, _)| key.to_owned()))
            .collect()
    }

    /// `command` handing workspaces off through this server.
    fn on(&self, command: &mut Command) {
        command
            .arg("--object-store")
            .arg(format!("s3://{BUCKET}/hand-off"))
            .env("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{}", self.port))
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "test-key")
            .env("AWS_SECRET_ACCESS_KEY", "test-secret")
            .env("AWS_REGION", "us-east-1");
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// code_build's script with a 3 s wait before the executor finishes: a worker killed in
/// it has made its edits and not ended the level.
fn slow_script(dir: &Path) -> PathBuf {
    let script =
        std::fs::read_to_string(repo().join("scenarios/scripts/code_build.yaml")).unwrap().replace(
            "    - tool_calls:\n        - name: finish",
            "    - delay_ms: 3000\n      tool_calls:\n        - name: finish",
        );
    assert!(script.contains("delay_ms: 3000"));
    let path = dir.join("slow.yaml");
    std::fs::write(&path, script).unwrap();
    path
}

/// A workspace's files by path, and how each level of its run ended.
type Files = BTreeMap<String, Vec<u8>>;
type Verdicts = Vec<(String, Value, Value)>;

/// What a run's workspace holds: every file (build caches aside) and its bytes.
fn files(workspace: &Path) -> Files {
    let mut found = BTreeMap::new();
    let mut pending = vec![workspace.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name();
            if name == "__pycache__" || name == ".baton" {
                continue;
            }
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                pending.push(path);
            } else {
                let rel = path.strip_prefix(workspace).unwrap().display().to_string();
                found.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    found
}

/// How each level of a run ended: its id, whether it passed, and its verdict.
fn verdicts(events: &[Value]) -> Verdicts {
    events
        .iter()
        .filter(|e| e["kind"] == "level_finished")
        .map(|e| (e["level_id"].to_string(), e["data"]["ok"].clone(), e["data"]["verdict"].clone()))
        .collect()
}

fn events(db: &str, data: &Path, run: &str) -> Vec<Value> {
    let out = baton_pg(db, data, &["events", run, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The files and verdicts of a `code_build` run never interrupted (driven by `baton run` on
/// a SQLite database of its own).
fn uninterrupted(dir: &Path, script: &Path) -> (Files, Verdicts) {
    let db = dir.join("reference/runs.db");
    std::fs::create_dir_all(db.parent().unwrap()).unwrap();
    let out = baton_command()
        .arg("--db")
        .arg(&db)
        .args(["run", "code_build", "--input", "a greet CLI", "--json", "--script"])
        .arg(script)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let run = serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let log =
        baton_command().arg("--db").arg(&db).args(["events", &run, "--json"]).output().unwrap();
    let events: Vec<Value> =
        text(&log.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    (files(&db.parent().unwrap().join("workspaces").join(&run)), verdicts(&events))
}

/// `baton` on the test's database and `data` dir, through `moto` when given.
fn baton_on(db: &str, data: &Path, moto: Option<&Moto>) -> Command {
    let mut c = baton_command();
    c.arg("--db").arg(db).arg("--data-dir").arg(data);
    if let Some(moto) = moto {
        moto.on(&mut c);
    }
    c
}

/// Queues a code_build job from `data` (its base snapshot made there); the run's id.
fn queue(db: &str, data: &Path, moto: Option<&Moto>, script: &Path) -> String {
    let out = baton_on(db, data, moto)
        .args(["run", "code_build", "--input", "a greet CLI", "--queue", "--json", "--script"])
        .arg(script)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"].as_str().unwrap().to_owned()
}

/// A worker on `data` that claims the run, is killed once its edits are in its workspace
/// (inside the executor's tool loop, before the level ends), and leaves its lease to lapse.
fn killed_mid_loop(db: &str, data: &Path, moto: Option<&Moto>, run: &str) {
    let mut worker = baton_on(db, data, moto);
    worker
        .args(["worker", "--concurrency", "1", "--lease-s", "3"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let worker = Heard::new(worker.spawn().unwrap());
    worker.wait_for(&format!("claimed run {run}"), 1, 60);
    // Killed once its writes are in the workspace (the attempt commits at its end).
    let edited = data.join("workspaces").join(run).join("greet/__main__.py");
    let started = Instant::now();
    while !edited.is_file() {
        assert!(started.elapsed() < Duration::from_secs(60), "the executor never wrote its files");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut worker = worker;
    worker.child.kill().unwrap();
    let out = worker.finish(10);
    assert!(out.status.code().is_none(), "killed: {}", text(&out.stderr));
    let events = events(db, data, run);
    assert!(events.iter().all(|e| e["kind"] != "scenario_finished"), "the run did not end");
    assert!(
        events.iter().all(|e| e["kind"] != "level_finished" || e["level_id"] != "l4_execute"),
        "the executor's level did not end"
    );
    // The lease lapses.
    std::thread::sleep(Duration::from_millis(3_500));
}

/// A worker on `data` that drives what it can claim and exits once idle: what it said.
fn worker_until_idle(db: &str, data: &Path, moto: Option<&Moto>) -> String {
    let mut worker = baton_on(db, data, moto);
    worker.args(["worker", "--concurrency", "1", "--idle-exit-s", "3"]);
    super::queues::worker_said(worker)
}

#[test]
fn a_run_killed_in_its_tool_loop_moves_to_another_data_dir_through_the_object_store() {
    let schema = scratch("handoff");
    let db = schema.url.as_str();
    let dir = temp("handoff");
    let moto = Moto::start(&dir);
    let script = slow_script(&dir);
    let (here, there) = (dir.join("a"), dir.join("b"));
    let run = queue(db, &here, Some(&moto), &script);
    killed_mid_loop(db, &here, Some(&moto), &run);
    // Its host is gone with its disk: nothing of its data dir is seen from now on.
    std::fs::rename(&here, dir.join("lost")).unwrap();
    let pushed = moto.keys(&format!("hand-off/runs/{run}/"));
    assert!(!pushed.is_empty(), "the run's snapshots are in the store");

    let said = worker_until_idle(db, &there, Some(&moto));
    assert!(said.contains(&format!("claimed run {run}")), "{said}");
    let events = events(db, &there, &run);
    let ended: Vec<&Value> = events.iter().filter(|e| e["kind"] == "scenario_finished").collect();
    assert_eq!(ended.len(), 1, "{events:?}");
    assert_eq!(ended[0]["data"]["status"], "completed");
    // The takeover says where the executor's attempt went on from: the snapshot pushed
    // before it, fetched on the other data dir.
    let taken: Vec<&Value> = events.iter().filter(|e| e["kind"] == "run_taken_over").collect();
    assert_eq!(taken.len(), 1, "{events:?}");
    let from = taken[0]["data"]["restarts_from"].as_str().unwrap();
    assert!(pushed.iter().any(|k| k.ends_with(&format!("/{from}.bundle"))), "{from} in {pushed:?}");
    // Every commit names the process that wrote it: the one that queued the run, the
    // worker killed, and the one that took over (which also wrote the takeover).
    let out = baton_on(db, &there, None).args(["events", &run, "--json", "--writers"]).output();
    let out = out.unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let lines: Vec<Value> =
        text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[0]["writer"].as_str().map(|w| w.contains(':')), Some(true), "{:?}", lines[0]);
    let taker = lines.iter().find(|e| e["kind"] == "run_paused").unwrap()["writer"].clone();
    assert!(taker.is_string(), "the takeover's commit names its writer");
    let writers: std::collections::BTreeSet<&str> =
        lines.iter().filter_map(|e| e["writer"].as_str()).collect();
    assert_eq!(writers.len(), 3, "{writers:?}");
    let (files_then, verdicts_then) = uninterrupted(&dir, &script);
    let moved = files(&there.join("workspaces").join(&run));
    assert_eq!(moved.keys().collect::<Vec<_>>(), files_then.keys().collect::<Vec<_>>());
    assert_eq!(moved, files_then, "the same files as a run never interrupted");
    assert_eq!(verdicts(&events), verdicts_then, "the same verdicts");

    // The run's objects in the store go with it.
    let purged = baton_on(db, &there, Some(&moto)).args(["purge", "--job", &run]).output().unwrap();
    assert_eq!(purged.status.code(), Some(0), "{}", text(&purged.stderr));
    let said = text(&purged.stdout);
    assert!(said.contains(&format!("snapshot bundle(s) of run {run}")), "{said}");
    assert!(moto.keys(&format!("hand-off/runs/{run}/")).is_empty(), "{said}");
    drop(moto);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn without_an_object_store_the_takeover_is_refused_and_the_run_completes_on_its_first_host() {
    let schema = scratch("handoff-none");
    let db = schema.url.as_str();
    let dir = temp("handoff-none");
    let script = slow_script(&dir);
    let (here, there) = (dir.join("a"), dir.join("b"));
    let run = queue(db, &here, None, &script);
    killed_mid_loop(db, &here, None, &run);

    // Another data dir: its worker claims nothing, and driving the run from there by hand
    // is refused, the run left as it was.
    let said = worker_until_idle(db, &there, None);
    assert!(!said.contains(&format!("claimed run {run}")), "{said}");
    let refused = baton_on(db, &there, None).args(["resume", &run]).output().unwrap();
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused.stdout));
    let why = text(&refused.stderr);
    assert!(why.contains("its workspace is not here") && why.contains("--object-store"), "{why}");
    assert!(!there.join("workspaces").join(&run).exists(), "no empty workspace is made: {why}");
    let events_now = events(db, &here, &run);
    assert!(events_now.iter().all(|e| e["kind"] != "scenario_finished"));

    let said = worker_until_idle(db, &here, None);
    assert!(said.contains(&format!("claimed run {run}")), "{said}");
    let events = events(db, &here, &run);
    let ended: Vec<&Value> = events.iter().filter(|e| e["kind"] == "scenario_finished").collect();
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0]["data"]["status"], "completed");
    let (files_then, verdicts_then) = uninterrupted(&dir, &script);
    assert_eq!(files(&here.join("workspaces").join(&run)), files_then);
    assert_eq!(verdicts(&events), verdicts_then);
    let _ = std::fs::remove_dir_all(dir);
}
