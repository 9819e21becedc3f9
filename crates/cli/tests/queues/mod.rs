//! Queues, priorities and limits on PostgreSQL, with real worker processes: a start names a
//! queue that exists, a worker takes the queues it names highest priority first, a limit on
//! a queue holds across three workers, a tenant at its limit lets another tenant's run
//! through, a run bound to one data dir is driven only there, and a run whose log holds
//! events newer than a worker reads is never claimed by it.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::postgres::{
    Heard, SlowModel, baton_pg, finish, listed_runs, own_scenario, scratch, signal, temp,
};
use super::text;

const THREE: &str = "id: three\nversion: 1\nlevels:\n  - {id: a, kind: prompt, prompt: {inline: 'A {{ input }}'}}\n  - {id: b, kind: prompt, prompt: {inline: 'B {{ input }}'}}\n  - {id: c, kind: prompt, prompt: {inline: 'C {{ input }}'}, terminal: true}\nedges:\n  - {from: a, to: b}\n  - {from: b, to: c}\n";

/// A configuration whose one model is `model`'s server.
fn slow_config(dir: &Path, model: &SlowModel) -> PathBuf {
    let config = dir.join("baton.toml");
    std::fs::write(
        &config,
        format!(
            "[routing]\ndefault = \"free:local/m\"\n\n[[providers]]\nname = \"local\"\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:{}/v1\"\ntier = \"free\"\nstream = false\n\n[[providers.models]]\nname = \"m\"\n",
            model.port
        ),
    )
    .unwrap();
    config
}

/// Runs `sql` in the test's schema (its URL sets the search path).
fn sql(url: &str, statement: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let (client, connection) =
            tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
        let connected = tokio::spawn(connection);
        client.batch_execute(statement).await.unwrap();
        drop(client);
        let _ = connected.await;
    });
}

/// `baton run SCENARIO --queue… --input INPUT` with `answers`; the new run's id.
fn queue_one(
    baton: &impl Fn() -> std::process::Command,
    scenario: &str,
    input: &str,
    how: &[&str],
    answers: [&std::ffi::OsStr; 2],
) -> String {
    let out = baton()
        .args(["run", scenario, "--input", input, "--json"])
        .args(how)
        .args(answers)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let said: Value = serde_json::from_slice(&out.stdout).unwrap();
    said["run_id"].as_str().unwrap().to_owned()
}

/// The runs `baton runs --json` lists, as JSON.
fn listed(db: &str, data: &Path) -> Vec<Value> {
    let out = baton_pg(db, data, &["runs", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    serde_json::from_slice::<Value>(&out.stdout).unwrap().as_array().unwrap().clone()
}

/// The ids of the runs a worker said it claimed, in order.
fn claimed(said: &str) -> Vec<String> {
    said.lines()
        .filter_map(|l| l.split_once(": claimed run ").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Runs `worker` (a `baton worker` command with `--idle-exit-s`) to its end: what it said.
pub(crate) fn worker_said(mut worker: std::process::Command) -> String {
    let child = worker
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let out = finish(child, 60);
    let said = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{said}");
    said
}

#[test]
fn a_start_names_a_queue_that_exists_and_a_worker_takes_its_queues_highest_priority_first() {
    let schema = scratch("queues");
    let db = schema.url.as_str();
    let dir = temp("queues");
    let data = dir.join("data");
    let one = "id: one\nversion: 1\nlevels:\n  - {id: a, kind: prompt, prompt: {inline: 'A {{ input }}'}, terminal: true}\n";
    let (script, pg) = own_scenario(&dir, db, ("one", one), "levels:\n  a: [{text: 'ok'}]\n");
    let answers = ["--script".as_ref(), script.as_os_str()];
    // A queue that does not exist: refused, saying how to make it; nothing is created.
    let refused =
        pg().args(["run", "one", "--input", "x", "--queue=gpu"]).args(answers).output().unwrap();
    let said = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(
        said.contains("there is no queue \"gpu\"") && said.contains("baton queue create gpu"),
        "{said}"
    );
    assert!(listed(db, &data).is_empty(), "a refused start leaves no run");
    // Names are a closed alphabet.
    let bad = pg().args(["queue", "create", "GPU"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad.stderr).contains("lowercase letters"), "{}", text(&bad.stderr));
    let made = pg().args(["queue", "create", "gpu", "--aging-s", "90"]).output().unwrap();
    assert_eq!(made.status.code(), Some(0), "{}", text(&made.stderr));
    let again = pg().args(["queue", "create", "gpu"]).output().unwrap();
    assert!(text(&again.stderr).contains("exists already"), "{}", text(&again.stderr));
    // Three runs in gpu, queued lowest priority first, and one in the default queue.
    let low = queue_one(&pg, "one", "low", &["--queue=gpu"], answers);
    let mid = queue_one(&pg, "one", "mid", &["--queue=gpu", "--priority", "4"], answers);
    let high = queue_one(&pg, "one", "high", &["--queue=gpu", "--priority", "9"], answers);
    let other = queue_one(&pg, "one", "other", &["--queue"], answers);
    let runs = listed(db, &data);
    let high_row = runs.iter().find(|r| r["run_id"] == high.as_str()).unwrap();
    assert_eq!((high_row["queue"].as_str(), high_row["priority"].as_i64()), (Some("gpu"), Some(9)));
    let list = pg().args(["queue", "list", "--json"]).output().unwrap();
    let loads: Value = serde_json::from_slice(&list.stdout).unwrap();
    let waiting = |name: &str| {
        loads.as_array().unwrap().iter().find(|q| q["name"] == name).map(|q| q["waiting"].clone())
    };
    assert_eq!((waiting("gpu"), waiting("default")), (Some(3.into()), Some(1.into())), "{loads}");
    let shown = text(&pg().args(["runs"]).output().unwrap().stdout);
    assert!(shown.contains("waits in queue gpu at priority 9"), "{shown}");
    // A worker naming a queue that does not exist is refused before it claims anything.
    let nope =
        pg().args(["worker", "--queues", "gpu,nope", "--idle-exit-s", "1"]).output().unwrap();
    assert_eq!(nope.status.code(), Some(1));
    assert!(text(&nope.stderr).contains("there is no queue nope"), "{}", text(&nope.stderr));
    // One slot: the gpu runs are claimed highest priority first; the default one is left.
    let mut worker = pg();
    worker.args(["worker", "--queues", "gpu", "--concurrency", "1", "--idle-exit-s", "2"]);
    let said = worker_said(worker);
    assert_eq!(claimed(&said), [high, mid, low], "{said}");
    let statuses = listed_runs(db, &data);
    let status_of = |id: &str| statuses.iter().find(|(r, _)| r == id).map(|(_, s)| s.clone());
    assert_eq!(status_of(&other).as_deref(), Some("queued"), "{statuses:?}");
    // A log holding events newer than this build reads is never claimed: another build
    // wrote them (a rolling deploy); this worker leaves the run to it.
    sql(db, &format!("UPDATE runs SET events_version = 99 WHERE run_id = '{other}'"));
    let one = || {
        let mut worker = pg();
        worker.args(["worker", "--concurrency", "1", "--idle-exit-s", "2"]);
        worker_said(worker)
    };
    let said = one();
    assert!(claimed(&said).is_empty(), "{said}");
    sql(db, &format!("UPDATE runs SET events_version = 2 WHERE run_id = '{other}'"));
    let said = one();
    assert_eq!(claimed(&said), std::slice::from_ref(&other), "{said}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Three workers, each with four slots, share a queue limited to two runs at once: the
/// model server never sees more than two calls at once (each run makes one at a time), and
/// sees two; every run completes.
#[test]
fn three_workers_under_a_queue_limit_of_two_never_drive_three_runs_at_once() {
    let schema = scratch("limit");
    let db = schema.url.as_str();
    let dir = temp("limit");
    let data = dir.join("data");
    let model = SlowModel::start();
    let (_, pg) = own_scenario(&dir, db, ("three", THREE), "levels: {}\n");
    let config = slow_config(&dir, &model);
    let made = pg().args(["queue", "create", "narrow", "--max-running", "2"]).output().unwrap();
    assert_eq!(made.status.code(), Some(0), "{}", text(&made.stderr));
    let inputs: Vec<String> = (0..12).map(|i| format!("q{i}")).collect();
    std::fs::write(dir.join("inputs.txt"), inputs.join("\n")).unwrap();
    let queued = pg()
        .args(["run", "three", "--queue=narrow", "--input-lines"])
        .arg(dir.join("inputs.txt"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(queued.status.code(), Some(0), "{}", text(&queued.stderr));
    let workers: Vec<std::process::Child> = (1..=3)
        .map(|i| {
            pg().arg("--config")
                .arg(&config)
                .args(["worker", "--queues", "narrow", "--concurrency", "4", "--idle-exit-s", "3"])
                .args(["--name", &format!("w{i}")])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (i, out) in workers.into_iter().map(|w| finish(w, 120)).enumerate() {
        assert_eq!(out.status.code(), Some(0), "worker {}: {}", i + 1, text(&out.stderr));
    }
    let peak = model.peak.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(peak, 2, "at most two runs of the queue are driven at once, and two are");
    let statuses = listed_runs(db, &data);
    assert_eq!(statuses.len(), 12);
    assert!(statuses.iter().all(|(_, s)| s == "completed"), "{statuses:?}");
    assert_eq!(model.asked.lock().unwrap().len(), 36, "each run's three calls, once");
    let _ = std::fs::remove_dir_all(dir);
}

/// Tenant acme, limited to two runs at once, has a hundred runs queued before globex's
/// one: a worker with eight slots claims globex's while acme's still wait.
#[test]
fn a_tenant_at_its_limit_lets_another_tenants_run_through_its_hundred_queued() {
    let schema = scratch("tenants");
    let db = schema.url.as_str();
    let dir = temp("tenants");
    let data = dir.join("data");
    let model = SlowModel::start();
    let (_, pg) = own_scenario(&dir, db, ("three", THREE), "levels: {}\n");
    let config = slow_config(&dir, &model);
    let limited = pg().args(["tenant", "limit", "acme", "2"]).output().unwrap();
    assert_eq!(limited.status.code(), Some(0), "{}", text(&limited.stderr));
    let shown = text(&pg().args(["tenant", "limit"]).output().unwrap().stdout);
    assert!(shown.contains("acme") && shown.contains('2'), "{shown}");
    let inputs: Vec<String> = (0..100).map(|i| format!("a{i}")).collect();
    std::fs::write(dir.join("inputs.txt"), inputs.join("\n")).unwrap();
    let queued = pg()
        .args(["run", "three", "--queue", "--tenant", "acme", "--input-lines"])
        .arg(dir.join("inputs.txt"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(queued.status.code(), Some(0), "{}", text(&queued.stderr));
    let answers = ["--config".as_ref(), config.as_os_str()];
    let globex = queue_one(&pg, "three", "g", &["--queue", "--tenant", "globex"], answers);
    let worker = Heard::new(
        pg().arg("--config")
            .arg(&config)
            .args(["worker", "--concurrency", "8", "--idle-exit-s", "30"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    worker.wait_for(&format!("claimed run {globex}"), 1, 60);
    signal(worker.child.id(), "TERM");
    let out = worker.finish(60);
    let said = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{said}");
    let acme_claimed = claimed(&said).iter().filter(|id| **id != globex).count();
    assert!(acme_claimed <= 4, "acme's runs were claimed past its limit: {said}");
    let statuses = listed_runs(db, &data);
    let waiting = statuses.iter().filter(|(_, s)| s == "queued").count();
    assert!(waiting >= 95, "acme's runs still wait: {statuses:?}");
    // Its limit removed, it is listed no more.
    let removed = pg().args(["tenant", "limit", "acme", "--none"]).output().unwrap();
    assert!(text(&removed.stdout).contains("its limit is removed"), "{}", text(&removed.stdout));
    let _ = std::fs::remove_dir_all(dir);
}

/// A run with a workspace is bound to the data dir it was queued from: a worker on another
/// data dir never claims it (and `baton runs` says where it is bound); a worker on its data
/// dir drives it to the end.
#[test]
fn a_run_bound_to_one_data_dir_is_driven_only_by_a_worker_there() {
    let schema = scratch("homes");
    let db = schema.url.as_str();
    let dir = temp("homes");
    let edit = "id: edit\nversion: 1\nlevels:\n  - id: work\n    kind: tool_loop\n    prompt: {inline: \"Do {{ input }}\"}\n    terminal: true\n";
    let script = "levels:\n  work:\n    - tool_calls:\n        - name: finish\n          arguments: {summary: done}\n";
    let (script, pg) = own_scenario(&dir, db, ("edit", edit), script);
    let (here, there) = (dir.join("data"), dir.join("elsewhere"));
    let answers = ["--script".as_ref(), script.as_os_str()];
    let run = queue_one(&pg, "edit", "it", &["--queue"], answers);
    let bound = text(&baton_pg(db, &here, &["runs"]).stdout);
    assert!(
        bound.contains("bound to the data dir") && bound.contains(&*here.to_string_lossy()),
        "{bound}"
    );
    let scenarios = dir.join("scenarios");
    let worker_on = |data: &Path| {
        let mut c = super::baton_command();
        c.arg("--scenarios").arg(&scenarios).arg("--db").arg(db).arg("--data-dir").arg(data);
        c.args(["worker", "--concurrency", "1", "--idle-exit-s", "2"]);
        worker_said(c)
    };
    let away = worker_on(&there);
    assert!(claimed(&away).is_empty(), "{away}");
    assert_eq!(listed_runs(db, &here), [(run.clone(), "queued".to_owned())]);
    let home = worker_on(&here);
    assert_eq!(claimed(&home), std::slice::from_ref(&run), "{home}");
    assert_eq!(listed_runs(db, &here), [(run, "completed".to_owned())]);
    let _ = std::fs::remove_dir_all(dir);
}
