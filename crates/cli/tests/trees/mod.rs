//! Jobs through the binary and the real SQLite store: scenario selection, the classifier's
//! chain into another scenario as a child run, the ask-user answer checked against the
//! routes offered, fallbacks, the depth limit, a SIGKILL after every event of a chained
//! job, and a cancel of a tree that settles every run below the root.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{baton_db, baton_in, bwrap, repo, scratch, text};

/// The first run of each job in the database (runs without a parent), newest first.
pub(super) fn roots(db: &Path) -> Vec<String> {
    let out = baton_db(db, &["runs", "--json"]);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    list.as_array()
        .map(|runs| {
            runs.iter()
                .filter(|r| r.get("parent_run_id").is_none())
                .map(|r| r["run_id"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// `events RUN --tree --json`: every event of the tree, each naming its run.
fn tree_events(db: &Path, run: &str) -> Vec<Value> {
    let out = baton_db(db, &["events", run, "--tree", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn kinds_of(events: &[Value]) -> Vec<String> {
    events.iter().map(|e| e["kind"].as_str().unwrap().to_owned()).collect()
}

/// `baton run --kind task --input INPUT --script SCRIPT [EXTRA…]` on `db`.
fn task_job(db: &Path, input: &str, script: &str, extra: &[&str]) -> Output {
    let mut args = vec!["run", "--kind", "task", "--input", input, "--script", script];
    args.extend_from_slice(extra);
    baton_db(db, &args)
}

/// The job's result (`run --json`).
fn result(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("not JSON: {}{}", text(&out.stdout), text(&out.stderr)))
}

#[test]
fn a_task_job_goes_through_the_classifier_and_chains_to_the_scenario_it_chose() {
    let dir = scratch("tree-task");
    let db = dir.join("runs.db");
    let out = task_job(
        &db,
        "What is the capital of France?",
        "scenarios/scripts/intent_classifier.yaml",
        &[],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    // The timeline shows the selection, the chain, and the chained run nested under it.
    for line in [
        "selected  intent_classifier (job kind task: the classifier picks)",
        "chained   intent_classifier → quick_qa (route `qa` from classify, hop 1)",
        "#1    started   quick_qa",
        "settled   chain",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
    // The job's output is the chained run's.
    assert!(
        stdout
            .ends_with("output:\n{\"answer\": \"Paris\", \"confidence\": 0.97, \"sources\": []}\n"),
        "{stdout}"
    );
    let root = roots(&db).pop().unwrap();
    let events = tree_events(&db, &root);
    let child: Vec<&Value> = events.iter().filter(|e| e["run_id"] != root.as_str()).collect();
    assert_eq!(child.first().unwrap()["kind"], "scenario_started");
    assert_eq!(child.first().unwrap()["data"]["parent"]["parent_run_id"], root.as_str());
    assert_eq!(child.first().unwrap()["data"]["parent"]["depth"], 1);
    // The child's id is recorded before the child exists, and derives from the root's.
    let started = events.iter().find(|e| e["kind"] == "child_run_started").unwrap();
    assert_eq!(started["data"]["child_run_id"], child[0]["run_id"]);
    let settled: Vec<&Value> = events.iter().filter(|e| e["kind"] == "child_run_settled").collect();
    assert_eq!(settled.len(), 1);
    assert_eq!(settled[0]["data"]["status"], "completed");
    // `runs --tree` shows the chained run under the job's first.
    let listed = baton_db(&db, &["runs", "--tree", "--json"]);
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let depths: Vec<(String, u64)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["scenario_id"].as_str().unwrap().to_owned(), r["depth"].as_u64().unwrap()))
        .collect();
    assert_eq!(depths, [("intent_classifier".to_owned(), 0), ("quick_qa".to_owned(), 1)]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A job's script in `dir` whose classifier routes to `project` (code_build): code_build's
/// answers at the top level, the classifier's under its scenario — a job's script answers
/// every scenario its runs go through.
pub(super) fn classifier_to_code_build(dir: &Path) -> PathBuf {
    let code_build =
        std::fs::read_to_string(repo().join("scenarios/scripts/code_build.yaml")).unwrap();
    let script = dir.join("job.yaml");
    std::fs::write(
        &script,
        format!(
            "{code_build}\nscenarios:\n  intent_classifier:\n    levels:\n      classify:\n        - text: '{{\"chosen_intent_route\": \"project\", \"confidence\": 0.9, \"reason\": \"wants a program\", \"candidates\": [{{\"intent_route\": \"project\", \"score\": 0.9}}]}}'\n"
        ),
    )
    .unwrap();
    script
}

#[test]
fn a_classified_task_chains_into_code_build_which_writes_and_builds_its_program() {
    let dir = scratch("tree-build");
    let db = dir.join("runs.db");
    let script = classifier_to_code_build(&dir);
    let out = task_job(&db, "a greet CLI", script.to_str().unwrap(), &["--json"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let job = result(&out);
    assert_eq!(job["scenario_id"], "intent_classifier");
    assert_eq!(job["selected"]["how"], "classifier");
    assert_eq!(job["status"], "completed");
    let tree = job["tree"].as_array().unwrap();
    assert_eq!(tree.len(), 2);
    assert_eq!(tree[1]["scenario_id"], "code_build");
    assert_eq!(tree[1]["status"], "completed");
    // The chained run's workspace holds the program its tool loop wrote and its verifier built.
    let child = tree[1]["run_id"].as_str().unwrap();
    let workspace = dir.join("workspaces").join(child);
    assert!(workspace.join("greet/__main__.py").is_file(), "{}", workspace.display());
    // The job's totals hold both runs: the tree's cost is more than the classifier's own.
    assert!(
        job["tree_totals"]["cost_usd"].as_f64().unwrap()
            > job["totals"]["cost_usd"].as_f64().unwrap()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unsure_classifier_asks_and_takes_only_an_offered_route() {
    let dir = scratch("tree-unsure");
    let db = dir.join("runs.db");
    let out =
        task_job(&db, "Plan the migration", "scenarios/scripts/intent_classifier_unsure.yaml", &[]);
    assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
    let root = roots(&db).pop().unwrap();
    // An answer that is not one of the routes offered is refused, and nothing is written.
    let before = tree_events(&db, &root).len();
    let wrong = baton_db(&db, &["answer", &root, "--answer", "\"quick_qa\"", "--no-resume"]);
    assert_eq!(wrong.status.code(), Some(1));
    let err = text(&wrong.stderr);
    assert!(err.contains("the answer does not fit question"), "{err}");
    assert!(err.contains("[\"research_brief\",\"document_writing\"]"), "{err}");
    assert_eq!(tree_events(&db, &root).len(), before);
    // One of them is taken, and the chain follows it.
    let right = baton_db(&db, &["answer", &root, "--answer", "\"research_brief\""]);
    assert_eq!(right.status.code(), Some(0), "{}{}", text(&right.stdout), text(&right.stderr));
    let stdout = text(&right.stdout);
    assert!(stdout.contains("intent_classifier → research_brief"), "{stdout}");
    assert!(stdout.contains("output:\nA brief that weighs the sources."), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A scenarios directory: `hop` answers with the route its script names, `echo` answers
/// plainly and claims route `echo`; `baton.toml` makes `echo` the default and the fallback.
fn hop_scenarios(dir: &Path) -> PathBuf {
    let scenarios = dir.join("scenarios");
    std::fs::create_dir_all(&scenarios).unwrap();
    std::fs::write(
        scenarios.join("hop.yaml"),
        "id: hop\nversion: 1\nintent_routes: [hop]\nlevels:\n  - id: route\n    kind: prompt\n    prompt: {inline: \"Route {{ input }}\"}\n    response: {json: {}}\n    terminal: true\n",
    )
    .unwrap();
    std::fs::write(
        scenarios.join("echo.yaml"),
        "id: echo\nversion: 1\nintent_routes: [echo]\nlevels:\n  - id: say\n    kind: prompt\n    prompt: {inline: \"Say {{ input }}\"}\n    terminal: true\n",
    )
    .unwrap();
    let config = dir.join("baton.toml");
    std::fs::write(&config, "[selection]\ndefault = \"echo\"\nfallback = \"echo\"\n").unwrap();
    config
}

fn hop_script(dir: &Path, route: &str) -> PathBuf {
    let script = dir.join(format!("{route}.yaml"));
    std::fs::write(
        &script,
        format!(
            "scenarios:\n  hop:\n    levels:\n      route: [{{text: '{{\"chosen_intent_route\": \"{route}\"}}'}}]\n  echo:\n    levels:\n      say: [{{text: 'echoed'}}]\n"
        ),
    )
    .unwrap();
    script
}

#[test]
fn selection_pins_routes_and_falls_back_with_a_warning() {
    let dir = scratch("tree-select");
    let db = dir.join("runs.db");
    let config = hop_scenarios(&dir);
    let script = hop_script(&dir, "echo");
    let run = |args: &[&str]| {
        baton_in(&dir, &db)
            .arg("--config")
            .arg(&config)
            .args(args)
            .args(["--input", "x", "--script", script.to_str().unwrap(), "--json"])
            .output()
            .unwrap()
    };
    // A pin that matches nothing is an error, and no run is made.
    let typo = run(&["run", "nope"]);
    assert_eq!(typo.status.code(), Some(1));
    let err = text(&typo.stderr);
    assert!(err.contains("no scenario `nope` (known: echo, hop)"), "{err}");
    assert!(!db.exists() || roots(&db).is_empty());
    // An intent route is looked up without regard to case.
    let routed = result(&run(&["run", "--intent", "ECHO"]));
    assert_eq!(routed["scenario_id"], "echo");
    assert_eq!(routed["selected"]["how"], "intent");
    // An unknown route runs the default, with the warning on the selection.
    let unknown = run(&["run", "--intent", "astrology"]);
    assert_eq!(unknown.status.code(), Some(0), "{}", text(&unknown.stderr));
    assert!(text(&unknown.stderr).contains("no scenario serves intent route `astrology`"));
    let unknown = result(&unknown);
    assert_eq!(unknown["selected"]["how"], "default");
    assert!(unknown["selected"]["warning"].as_str().unwrap().contains("astrology"));
    // The metadata names a route the way the reference's payloads do.
    let meta = result(&run(&["run", "--meta", "intent_route=hop"]));
    assert_eq!(meta["scenario_id"], "hop");
    // Nothing named: the configured default.
    let plain = result(&run(&["run"]));
    assert_eq!(
        (&plain["scenario_id"], &plain["selected"]["how"]),
        (&"echo".into(), &"default".into())
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_route_no_scenario_serves_chains_to_the_fallback_with_a_warning() {
    let dir = scratch("tree-fallback");
    let db = dir.join("runs.db");
    let config = hop_scenarios(&dir);
    let script = hop_script(&dir, "astrology");
    let out = baton_in(&dir, &db)
        .arg("--config")
        .arg(&config)
        .args(["run", "hop", "--input", "x", "--script", script.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("chained   hop → echo (route `astrology` from route, hop 1) — warning: route `astrology` names no scenario"),
        "{stdout}"
    );
    assert!(stdout.ends_with("output:\nechoed\n"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_chain_past_the_depth_limit_ends_the_job_with_a_clear_reason() {
    let dir = scratch("tree-depth");
    let db = dir.join("runs.db");
    let config = hop_scenarios(&dir);
    let script = hop_script(&dir, "hop");
    let out = baton_in(&dir, &db)
        .arg("--config")
        .arg(&config)
        .args(["run", "hop", "--input", "x", "--script", script.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}{}", text(&out.stdout), text(&out.stderr));
    let job = result(&out);
    // The root and three hops; the fourth is refused, and every run ends aborted with it.
    let tree = job["tree"].as_array().unwrap();
    assert_eq!(tree.len(), 4, "{job}");
    assert!(tree.iter().all(|r| r["status"] == "aborted"), "{job}");
    let reason = job["aborted_reason"].as_str().unwrap();
    assert!(reason.starts_with("chain_depth_limit: "), "{reason}");
    assert!(reason.contains("past the limit of 3 (this run is hop 3)"), "{reason}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A job's events as compared across processes: times, durations, workspace paths and the
/// run ids (each run's is new) left out.
fn normalised_tree(db: &Path, root: &str) -> Vec<Value> {
    fn scrub(v: &mut Value) {
        match v {
            Value::Object(map) => {
                for key in [
                    "at",
                    "duration_ms",
                    "total_duration_ms",
                    "waiting_ms",
                    "dir",
                    "base",
                    "snapshot",
                    "run_id",
                    "child_run_id",
                    "parent_run_id",
                    "root_run_id",
                    "waited_ms",
                ] {
                    map.remove(key);
                }
                map.values_mut().for_each(scrub);
            }
            Value::Array(items) => items.iter_mut().for_each(scrub),
            _ => {}
        }
    }
    let events = tree_events(db, root)
        .into_iter()
        .map(|mut e| {
            scrub(&mut e);
            e
        })
        .collect();
    crate::without_takeovers(events)
}

/// Resumes a job until it ends, answering its questions with `answer`.
fn job_to_end(db: &Path, root: &str, answer: &str) {
    for _ in 0..20 {
        let out = baton_db(db, &["resume", root]);
        match out.status.code() {
            Some(0 | 1 | 4 | 5) => return,
            Some(3) => {
                let paused = baton_db(db, &["runs", "--status", "paused", "--json"]);
                let list: Value = serde_json::from_slice(&paused.stdout).unwrap();
                let run = list[0]["run_id"].as_str().unwrap().to_owned();
                let a = baton_db(db, &["answer", &run, "--answer", answer, "--no-resume"]);
                assert_eq!(a.status.code(), Some(0), "{}", text(&a.stderr));
            }
            other => panic!("resume exited {other:?}: {}{}", text(&out.stdout), text(&out.stderr)),
        }
    }
    panic!("job {root} did not end");
}

/// Kill the process right after the N-th event it wrote, whichever run of the job it
/// belongs to, for every N; resume from a new process; the job's tree of logs equals one
/// never killed.
#[test]
fn killed_after_any_event_of_a_chained_job_it_resumes_to_the_same_tree_of_logs() {
    let base = scratch("tree-kill");
    for (script, answer) in
        [("intent_classifier", "\"quick_qa\""), ("intent_classifier_unsure", "\"research_brief\"")]
    {
        let script = format!("scenarios/scripts/{script}.yaml");
        let start = ["run", "--kind", "task", "--script", &script, "--input", "What is it?"];
        let reference_db = base.join(format!("{}-ref.db", script.len()));
        baton_db(&reference_db, &start);
        let root = roots(&reference_db).pop().unwrap();
        job_to_end(&reference_db, &root, answer);
        let reference = normalised_tree(&reference_db, &root);
        assert_eq!(reference.last().unwrap()["kind"], "scenario_finished");
        assert!(kinds_of(&reference).contains(&"child_run_settled".to_owned()));
        let mut kills = 0;
        for n in 1..=reference.len() {
            let db = base.join(format!("{}-{n}.db", script.len()));
            let killed = Command::new(env!("CARGO_BIN_EXE_baton"))
                .env("BATON_BWRAP", bwrap())
                .arg("--db")
                .arg(&db)
                .args(start)
                .env("BATON_FAILPOINT_ABORT_AFTER_WRITES", n.to_string())
                .current_dir(repo())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .unwrap();
            kills += usize::from(killed.code().is_none());
            let Some(root) = roots(&db).pop() else {
                panic!("{script}: no job after a kill at {n}");
            };
            job_to_end(&db, &root, answer);
            assert_eq!(
                normalised_tree(&db, &root),
                reference,
                "{script}: killed after the job's event {n}, the resumed tree differs"
            );
        }
        assert!(kills > 10, "{script}: the failpoint killed the first process only {kills} times");
    }
    let _ = std::fs::remove_dir_all(&base);
}

/// Starts a job in the background whose chained run's model answers slowly.
fn slow_tree(dir: &Path, db: &Path) -> (std::process::Child, PathBuf) {
    let config = hop_scenarios(dir);
    std::fs::write(
        dir.join("scenarios/relay.yaml"),
        "id: relay\nversion: 1\nintent_routes: [relay]\nlevels:\n  - id: route\n    kind: prompt\n    prompt: {inline: \"Relay {{ input }}\"}\n    response: json\n    terminal: true\n",
    )
    .unwrap();
    // hop → relay → echo, whose answer takes 30 s: the root and the middle run wait.
    let script = dir.join("slow.yaml");
    std::fs::write(
        &script,
        "scenarios:\n  hop:\n    levels:\n      route: [{text: '{\"chosen_intent_route\": \"relay\"}'}]\n  relay:\n    levels:\n      route: [{text: '{\"chosen_intent_route\": \"echo\"}'}]\n  echo:\n    levels:\n      say: [{text: 'late', delay_ms: 30000}]\n",
    )
    .unwrap();
    let child = baton_in(dir, db)
        .arg("--config")
        .arg(&config)
        .args(["run", "hop", "--input", "x", "--script", script.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (child, config)
}

/// Waits (at most 30 s) until a `slow_tree` job's third run is running: the root, the
/// middle run and the leaf.
fn third_run_running(db: &Path) -> [String; 3] {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "the tree never reached its third run");
        if db.exists() {
            let listed = baton_db(db, &["runs", "--tree", "--json"]);
            let list: Value = serde_json::from_slice(&listed.stdout).unwrap_or(Value::Null);
            if let Some(runs) = list.as_array()
                && runs.len() == 3
                && runs[2]["status"] == "running"
            {
                let id = |i: usize| runs[i]["run_id"].as_str().unwrap().to_owned();
                return [id(0), id(1), id(2)];
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn cancelling_the_root_of_a_running_tree_settles_every_run_below_it() {
    let dir = scratch("tree-cancel");
    let db = dir.join("runs.db");
    let (job, config) = slow_tree(&dir, &db);
    // Wait until the slowest run (two hops down) is running.
    let [root, _, _] = third_run_running(&db);
    let asked = Instant::now();
    let cancel = baton_in(&dir, &db)
        .arg("--config")
        .arg(&config)
        .args(["cancel", &root, "--reason", "changed my mind"])
        .output()
        .unwrap();
    assert_eq!(cancel.status.code(), Some(0), "{}", text(&cancel.stderr));
    let out = job.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(5), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(asked.elapsed() < Duration::from_secs(15), "took {:?}", asked.elapsed());
    // Every run ended cancelled, and each parent settled its child once.
    let events = tree_events(&db, &root);
    let finished: Vec<&Value> =
        events.iter().filter(|e| e["kind"] == "scenario_finished").collect();
    assert_eq!(finished.len(), 3);
    assert!(finished.iter().all(|e| e["data"]["status"] == "cancelled"), "{events:?}");
    let settled: Vec<&Value> = events.iter().filter(|e| e["kind"] == "child_run_settled").collect();
    assert_eq!(settled.len(), 2);
    assert!(settled.iter().all(|e| e["data"]["status"] == "cancelled"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A job's script: the classifier names route `changelog`, and release_notes's answers.
fn notes_job(dir: &Path) -> PathBuf {
    let notes =
        std::fs::read_to_string(repo().join("scenarios/scripts/release_notes.yaml")).unwrap();
    let script = dir.join("job.yaml");
    std::fs::write(
        &script,
        format!(
            "{notes}\nscenarios:\n  intent_classifier:\n    levels:\n      classify:\n        - text: '{{\"chosen_intent_route\": \"changelog\", \"confidence\": 0.9, \"reason\": \"notes\", \"candidates\": []}}'\n"
        ),
    )
    .unwrap();
    script
}

#[test]
fn approving_a_chained_runs_request_continues_the_whole_job() {
    let dir = scratch("tree-approve");
    let db = dir.join("runs.db");
    let script = notes_job(&dir);
    let args = ["run", "--kind", "task", "--script", script.to_str().unwrap(), "--input", "PR 1"];
    let out = baton_db(&db, &args);
    assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
    // The pause names the chained run, whose request it is.
    let listed = baton_db(&db, &["runs", "--tree", "--json"]);
    let list: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let (root, child) = (list[0]["run_id"].as_str().unwrap(), list[1]["run_id"].as_str().unwrap());
    assert!(text(&out.stdout).contains(&format!("paused: run {child} waits for a person")));
    let approved = baton_db(&db, &["approve", child, "--by", "rm"]);
    assert_eq!(
        approved.status.code(),
        Some(0),
        "{}{}",
        text(&approved.stdout),
        text(&approved.stderr)
    );
    let stdout = text(&approved.stdout);
    assert!(stdout.contains("settled   chain"), "{stdout}");
    let listed = baton_db(&db, &["runs", "--json"]);
    let list: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert!(list.as_array().unwrap().iter().all(|r| r["status"] == "completed"), "{list}");
    let events = tree_events(&db, root);
    let last = events.iter().rev().find(|e| e["run_id"] == root).unwrap();
    assert_eq!(last["kind"], "scenario_finished");
    assert!(last["data"]["final_output"].as_str().unwrap().contains("CSV"), "{last}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cancelling_a_tree_nobody_drives_ends_it_here_and_settles_each_run() {
    let dir = scratch("tree-cancel-idle");
    let db = dir.join("runs.db");
    // The classifier chains to release_notes, which pauses for its sign-off: the child
    // waits for a person, the root for the child.
    let script = notes_job(&dir);
    let args = ["run", "--kind", "task", "--script", script.to_str().unwrap(), "--input", "PR 1"];
    let out = baton_db(&db, &args);
    assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
    let listed = baton_db(&db, &["runs", "--tree", "--json"]);
    let list: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let statuses: Vec<&str> =
        list.as_array().unwrap().iter().map(|r| r["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["waiting", "paused"], "{list}");
    let root = list[0]["run_id"].as_str().unwrap().to_owned();
    let cancel = baton_db(&db, &["cancel", &root, "--by", "ops"]);
    assert_eq!(cancel.status.code(), Some(0), "{}", text(&cancel.stderr));
    let listed = baton_db(&db, &["runs", "--json"]);
    let list: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert!(list.as_array().unwrap().iter().all(|r| r["status"] == "cancelled"), "{list}");
    let events = tree_events(&db, &root);
    let settled: Vec<&Value> = events.iter().filter(|e| e["kind"] == "child_run_settled").collect();
    assert_eq!(settled.len(), 1, "{events:?}");
    assert_eq!(settled[0]["data"]["status"], "cancelled");
    // The child's cancel names who asked, through its parent.
    let cancels: Vec<&Value> = events.iter().filter(|e| e["kind"] == "cancel_requested").collect();
    assert_eq!(cancels.len(), 2);
    assert!(cancels.iter().all(|e| e["data"]["by"] == "ops"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_tenant_override_is_checked_stored_and_changes_the_scenario_its_runs_get() {
    let dir = scratch("tree-tenant");
    let db = dir.join("runs.db");
    let config = hop_scenarios(&dir);
    let script = hop_script(&dir, "echo");
    let baton = |args: &[&str]| {
        baton_in(&dir, &db).arg("--config").arg(&config).args(args).output().unwrap()
    };
    // A level restated with another prompt and another model (lists replace whole).
    let good = dir.join("echo-acme.yaml");
    std::fs::write(
        &good,
        "levels:\n  - id: say\n    kind: prompt\n    prompt: {inline: \"Say it for acme: {{ input }}\"}\n    model: {allow: [\"paid:*\"]}\n    terminal: true\n",
    )
    .unwrap();
    let set = baton(&["tenant", "set", "acme", "echo", good.to_str().unwrap()]);
    assert_eq!(set.status.code(), Some(0), "{}", text(&set.stderr));
    assert!(text(&set.stdout).contains("stored tenant acme's override of echo"));
    // An override that does not load is refused where it is wrong, and nothing is stored.
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "budget:\n  max_cost: 1\n").unwrap();
    let refused = baton(&["tenant", "set", "acme", "hop", bad.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(1));
    let err = text(&refused.stderr);
    assert!(err.contains("unknown field `max_cost`") && err.contains("bad.yaml:2:3"), "{err}");
    assert!(err.contains("nothing was stored"), "{err}");
    let listed = text(&baton(&["tenant", "list"]).stdout);
    assert!(
        listed.contains("acme") && listed.contains("echo") && !listed.contains("hop"),
        "{listed}"
    );
    // The tenant's run gets the merged scenario: its prompt, its checksum, its tenant.
    let run = |tenant: Option<&str>| {
        let mut args =
            vec!["run", "echo", "--input", "x", "--script", script.to_str().unwrap(), "--json"];
        if let Some(t) = tenant {
            args.extend(["--tenant", t]);
        }
        let out = baton(&args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let job = result(&out);
        let events = tree_events(&db, job["run_id"].as_str().unwrap());
        (job, events)
    };
    let (plain, plain_events) = run(None);
    let (acme, acme_events) = run(Some("acme"));
    assert_ne!(plain["checksum"], acme["checksum"]);
    let prompt = |events: &[Value]| {
        events.iter().find(|e| e["kind"] == "prompt_sent").unwrap()["data"]["prompt"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(prompt(&plain_events), "Say x");
    assert_eq!(prompt(&acme_events), "Say it for acme: x");
    assert_eq!(acme_events[0]["data"]["tenant"], "acme");
    assert!(plain_events[0]["data"].get("tenant").is_none());
    let listed = baton_db(&db, &["runs", "--json"]);
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed[0]["tenant"], "acme");
    // The merged level wants a paid model: a configuration with free models only runs the
    // base scenario's check and refuses the tenant's, naming the level.
    let free = dir.join("free.toml");
    std::fs::write(
        &free,
        "[selection]\ndefault = \"echo\"\n\n[[providers]]\nname = \"local\"\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\ntier = \"free\"\n\n[[providers.models]]\nname = \"m\"\n",
    )
    .unwrap();
    let refused = baton_in(&dir, &db)
        .arg("--config")
        .arg(&free)
        .args(["run", "echo", "--tenant", "acme", "--input", "x"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("level `say` wants allow [paid:*]"),
        "{}",
        text(&refused.stderr)
    );
    // show, rm, and an overrides tree imported for GitOps.
    let shown = text(&baton(&["tenant", "show", "acme", "echo"]).stdout);
    assert!(shown.contains("Say it for acme"), "{shown}");
    let tree = dir.join("overrides");
    std::fs::create_dir_all(tree.join("beta")).unwrap();
    std::fs::write(tree.join("beta/hop.yaml"), "budget:\n  max_cost_usd: 0.5\n").unwrap();
    let imported = baton(&["tenant", "import", tree.to_str().unwrap()]);
    assert_eq!(imported.status.code(), Some(0), "{}", text(&imported.stderr));
    assert!(text(&imported.stdout).contains("imported 1 overrides of 1 tenants"));
    let removed = baton(&["tenant", "rm", "acme", "echo"]);
    assert_eq!(removed.status.code(), Some(0));
    let listed = text(&baton(&["tenant", "list"]).stdout);
    assert!(listed.contains("beta") && !listed.contains("acme"), "{listed}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_job_started_again_with_its_idempotency_key_gets_the_first_run() {
    let dir = scratch("tree-idempotent");
    let db = dir.join("runs.db");
    let config = hop_scenarios(&dir);
    // A slow answer, so that two processes start the job at the same moment.
    let script = dir.join("slow.yaml");
    std::fs::write(&script, "levels:\n  say: [{text: 'once', delay_ms: 500}]\n").unwrap();
    let start = || {
        baton_in(&dir, &db)
            .arg("--config")
            .arg(&config)
            .args(["run", "echo", "--input", "x", "--idempotency-key", "order-42"])
            .args(["--script", script.to_str().unwrap(), "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let racers = [start(), start()];
    let outs: Vec<Output> = racers.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    let listed = baton_db(&db, &["runs", "--json"]);
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    let id = listed[0]["run_id"].as_str().unwrap();
    for out in &outs {
        assert!(matches!(out.status.code(), Some(0 | 6)), "{}", text(&out.stderr));
        assert_eq!(result(out)["run_id"], id);
    }
    assert!(
        outs.iter().any(|o| text(&o.stderr).contains("no new run was started")),
        "one of them found the other's run"
    );
    // Later, the same key gives the finished run's result.
    let again = start().wait_with_output().unwrap();
    assert_eq!(again.status.code(), Some(0));
    assert_eq!(result(&again)["final_output"], "once");
    assert_eq!(result(&again)["run_id"], id);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_job_cap_binds_the_whole_tree() {
    let dir = scratch("tree-cap");
    let db = dir.join("runs.db");
    // The classifier costs nothing here; quick_qa's answer costs $0.0001, past what the
    // job left it.
    let out = task_job(
        &db,
        "x",
        "scenarios/scripts/intent_classifier.yaml",
        &["--max-cost-usd", "0.00005", "--json"],
    );
    assert_eq!(out.status.code(), Some(4), "{}{}", text(&out.stdout), text(&out.stderr));
    let job = result(&out);
    let root = job["run_id"].as_str().unwrap();
    let events = tree_events(&db, root);
    let started = events.iter().find(|e| e["kind"] == "child_run_started").unwrap();
    assert_eq!(started["data"]["budget"]["max_cost_usd"], 0.00005);
    let exceeded = events.iter().find(|e| e["kind"] == "budget_exceeded").unwrap();
    assert_eq!(exceeded["data"]["refused_before_call"], true);
    assert_eq!(job["status"], "aborted");
    // Without the job's cap, the classifier's own small budget does not bind quick_qa.
    let free = task_job(&db, "x", "scenarios/scripts/intent_classifier.yaml", &[]);
    assert_eq!(free.status.code(), Some(0));
    assert!(
        baton_db(&db, &["run", "--max-cost-usd=-1", "--input", "x"]).status.code() == Some(1),
        "a negative cap is refused"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tool_loops_and_json_answers_write_the_scratchpad_which_gates_read() {
    let dir = scratch("tree-scratchpad");
    let db = dir.join("runs.db");
    let scenarios = dir.join("scenarios");
    std::fs::create_dir_all(&scenarios).unwrap();
    std::fs::write(
        scenarios.join("notes.yaml"),
        "id: notes\nversion: 1\nlevels:\n  - id: work\n    kind: tool_loop\n    prompt: {inline: \"Do {{ input }}\"}\n  - id: check\n    kind: prompt\n    prompt: {inline: \"Check {{ scratchpad.plan }}\"}\n    response: json\n    terminal: true\nedges:\n  - {from: work, to: check}\n  - {from: check, to: __end__, when: \"scratchpad.plan == 'small' && scratchpad.reviewed == true\"}\n  - {from: check, to: __fail__}\n",
    )
    .unwrap();
    let script = dir.join("script.yaml");
    std::fs::write(
        &script,
        "levels:\n  work:\n    - tool_calls:\n        - {name: scratchpad_put, arguments: {key: plan, value: small}}\n        - {name: scratchpad_get, arguments: {key: plan}}\n        - {name: scratchpad_put, arguments: {key: Bad Key, value: 1}}\n        - {name: scratchpad_list, arguments: {}}\n    - tool_calls:\n        - {name: finish, arguments: {summary: noted}}\n  check:\n    - text: '{\"ok\": true, \"scratchpad\": {\"reviewed\": true}}'\n",
    )
    .unwrap();
    let out = baton_in(&dir, &db)
        .args(["run", "notes", "--input", "it", "--script", script.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let root = result(&out)["run_id"].as_str().unwrap().to_owned();
    let events = tree_events(&db, &root);
    let writes: Vec<(&str, &Value)> = events
        .iter()
        .filter(|e| e["kind"] == "scratchpad_written")
        .map(|e| (e["data"]["key"].as_str().unwrap(), &e["data"]["value"]))
        .collect();
    assert_eq!(writes, [("plan", &json!("small")), ("reviewed", &json!(true))]);
    let results: Vec<&Value> = events.iter().filter(|e| e["kind"] == "tool_result").collect();
    assert_eq!(results[1]["data"]["content"], "\"small\"");
    assert_eq!(results[2]["data"]["is_error"], true);
    assert!(results[2]["data"]["content"].as_str().unwrap().contains("must be lower-case"));
    assert_eq!(results[3]["data"]["content"], "[\"plan\"]");
    // The template read the note, and the gate read both.
    let prompt = events.iter().rev().find(|e| e["kind"] == "prompt_sent").unwrap();
    assert_eq!(prompt["data"]["prompt"], "Check small");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_classified_job_runs_against_a_local_openai_compatible_server_and_replays_from_its_cassette() {
    let dir = scratch("tree-live");
    std::fs::write(
        dir.join("rules.yaml"),
        "version: 1\nrules:\n  - name: classify\n    when: {messages_contain: \"You route a user's request\"}\n    respond: {content: '{\"chosen_intent_route\": \"qa\", \"confidence\": 0.9, \"reason\": \"a question\", \"candidates\": [{\"intent_route\": \"qa\", \"score\": 0.9}]}'}\n  - name: capital\n    when: {messages_contain: \"capital of France\"}\n    respond: {content: '{\"answer\": \"Paris\", \"confidence\": 0.95, \"sources\": []}'}\n",
    )
    .unwrap();
    let server = super::fakellm(&dir.join("rules.yaml"));
    let config = dir.join("baton.toml");
    std::fs::write(
        &config,
        format!(
            "[routing]\ndefault = \"free:local/fake-model\"\n\n[[providers]]\nname = \"local\"\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:{}/v1\"\ntier = \"free\"\n[[providers.models]]\nname = \"fake-model\"\ninput_usd_per_mtok = 0.5\noutput_usd_per_mtok = 1.0\n",
            server.1
        ),
    )
    .unwrap();
    let db = dir.join("runs.db");
    let cassette = dir.join("job.json");
    let job = |extra: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_baton"));
        c.current_dir(repo())
            .env("BATON_BWRAP", bwrap())
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENAI_API_KEY")
            .arg("--db")
            .arg(&db)
            .args(["run", "--kind", "task", "--input", "What is the capital of France?", "--json"])
            .args(extra);
        c.output().unwrap()
    };
    let live = job(&["--config", config.to_str().unwrap(), "--record", cassette.to_str().unwrap()]);
    assert_eq!(live.status.code(), Some(0), "{}{}", text(&live.stdout), text(&live.stderr));
    let live = result(&live);
    assert_eq!(live["tree"][1]["scenario_id"], "quick_qa");
    let answer: Value = serde_json::from_str(live["final_output"].as_str().unwrap()).unwrap();
    assert_eq!(answer["answer"], "Paris");
    assert!(live["tree_totals"]["cost_usd"].as_f64().unwrap() > 0.0, "priced from baton.toml");
    // Both runs' answers are in the one cassette: the job replays with the server gone.
    drop(server);
    let replayed = job(&["--cassette", cassette.to_str().unwrap()]);
    assert_eq!(replayed.status.code(), Some(0), "{}", text(&replayed.stderr));
    let replayed = result(&replayed);
    assert_eq!(replayed["final_output"], live["final_output"]);
    assert_eq!(replayed["tree"][1]["scenario_id"], "quick_qa");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A running tree (`slow_tree`) whose leaf's driver is stopped (SIGSTOP) and then
/// cancelled from another process whose settle timeout is 1 s: the job process, the root,
/// the middle run and the leaf, and how long the cancel took.
fn a_cancel_past_a_stopped_driver(
    dir: &Path,
    db: &Path,
) -> (std::process::Child, [String; 3], Duration) {
    let (job, _) = slow_tree(dir, db);
    let settle = dir.join("settle.toml");
    std::fs::write(
        &settle,
        "[selection]\ndefault = \"echo\"\nfallback = \"echo\"\n\n[jobs]\nsettle_timeout_s = 1\n",
    )
    .unwrap();
    let runs = third_run_running(db);
    // The process driving the leaf stops answering: it holds the leaf, and ends nothing.
    let pid = job.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let asked = Instant::now();
    let cancel =
        baton_in(dir, db).arg("--config").arg(&settle).args(["cancel", &runs[0]]).output().unwrap();
    let waited = asked.elapsed();
    assert_eq!(cancel.status.code(), Some(0), "{}", text(&cancel.stderr));
    (job, runs, waited)
}

#[test]
fn a_child_that_does_not_end_within_the_settle_timeout_is_recorded_unsettled() {
    let dir = scratch("tree-unsettled");
    let db = dir.join("runs.db");
    let (job, [root, middle, leaf], waited) = a_cancel_past_a_stopped_driver(&dir, &db);
    let pid = job.id().to_string();
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    assert!(waited < Duration::from_secs(10), "the cancel waited {waited:?}");
    assert!(waited >= Duration::from_secs(1), "it waited the settle timeout: {waited:?}");
    // The middle run ended without its child's result and says so; the root settled it.
    let middle_log: Vec<Value> = text(&baton_db(&db, &["events", &middle, "--json"]).stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let unsettled: Vec<&Value> =
        middle_log.iter().filter(|e| e["kind"] == "child_run_unsettled").collect();
    assert_eq!(unsettled.len(), 1, "{middle_log:?}");
    assert_eq!(unsettled[0]["data"]["child_run_id"], leaf.as_str());
    assert_eq!(unsettled[0]["data"]["status"], "running");
    assert!(!middle_log.iter().any(|e| e["kind"] == "child_run_settled"));
    assert_eq!(middle_log.last().unwrap()["data"]["status"], "cancelled");
    // Woken, the leaf's driver finds the cancel and ends it; nothing is settled twice.
    let out = job.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(5), "{}{}", text(&out.stdout), text(&out.stderr));
    let listed = baton_db(&db, &["runs", "--json"]);
    let list: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert!(list.as_array().unwrap().iter().all(|r| r["status"] == "cancelled"), "{list}");
    let events = tree_events(&db, &root);
    assert_eq!(events.iter().filter(|e| e["kind"] == "child_run_settled").count(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_run_left_behind_by_its_ended_parents_resumes_on_its_own() {
    let dir = scratch("tree-orphan");
    let db = dir.join("runs.db");
    let (mut job, [_, _, leaf], _) = a_cancel_past_a_stopped_driver(&dir, &db);
    // Its driver dies instead: the leaf, cancelled, is left with nobody to end it.
    job.kill().unwrap();
    let _ = job.wait();
    let listed = text(&baton_db(&db, &["runs"]).stdout);
    assert!(listed.contains(&format!("continue it with `baton resume {leaf}`")), "{listed}");
    // Its parents have ended: it is continued from itself, and ends as it was asked.
    let resumed = baton_db(&db, &["resume", &leaf]);
    assert_eq!(
        resumed.status.code(),
        Some(5),
        "{}{}",
        text(&resumed.stdout),
        text(&resumed.stderr)
    );
    let listed = baton_db(&db, &["runs", "--json"]);
    let list: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert!(list.as_array().unwrap().iter().all(|r| r["status"] == "cancelled"), "{list}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_task_job_against_a_local_server_goes_classifier_chain_code_build_and_completes() {
    let dir = scratch("tree-live-build");
    let control = "```control\n{\"verdict\": \"PASS\", \"confidence\": 0.9, \"reason\": \"meets the brief\"}\n```";
    let write = |path: &str, content: &str| json!({"name": "write_file", "arguments": {"path": path, "content": content}});
    // JSON is YAML: fakellm reads the rules as they are written here. The first rule that
    // matches answers.
    let rules = json!({"version": 1, "rules": [
        {"name": "classify", "when": {"messages_contain": "You route a user's request"},
         "respond": {"content": "{\"chosen_intent_route\": \"code_build\", \"confidence\": 0.93, \"reason\": \"wants a program\", \"candidates\": [{\"intent_route\": \"code_build\", \"score\": 0.93}]}"}},
        {"name": "accept", "when": {"messages_contain": "You are the acceptance reviewer"},
         "respond": {"content": format!("The program does what the brief asks.\n{control}")}},
        {"name": "finish", "when": {"messages_contain": "You are the executor", "tool_result_contains": "wrote "},
         "respond": {"content": "", "tool_calls": [{"name": "finish", "arguments": {"summary": "wrote the greet package"}}]}},
        {"name": "write", "when": {"messages_contain": "You are the executor"},
         "respond": {"content": "", "tool_calls": [
            write("greet/__init__.py", "def greeting(name: str) -> str:\n    return f\"Hello, {name}!\"\n"),
            write("greet/__main__.py", "import sys\n\nfrom greet import greeting\n\nprint(greeting(sys.argv[1] if len(sys.argv) > 1 else \"world\"))\n")]}},
        {"name": "plan", "when": {"messages_contain": "You are the planner"},
         "respond": {"content": "## Files\n- greet/__init__.py\n- greet/__main__.py\n"}},
        {"name": "brief", "when": {"messages_contain": "You are the team lead opening a software task"},
         "respond": {"content": "## Goal\nA greet CLI.\n\n## Acceptance criteria\n1. `python3 -m greet Ada` prints `Hello, Ada!`.\n"}},
    ]});
    std::fs::write(dir.join("rules.yaml"), serde_json::to_string_pretty(&rules).unwrap()).unwrap();
    let server = super::fakellm(&dir.join("rules.yaml"));
    let config = dir.join("baton.toml");
    std::fs::write(
        &config,
        format!(
            "[routing]\ndefault = \"paid:anthropic/claude-sonnet-4-5\"\n\n[[providers]]\nname = \"anthropic\"\nkind = \"anthropic\"\nbase_url = \"http://127.0.0.1:{}\"\ntier = \"paid\"\n[[providers.models]]\nname = \"claude-sonnet-4-5\"\ninput_usd_per_mtok = 3.0\noutput_usd_per_mtok = 15.0\n",
            server.1
        ),
    )
    .unwrap();
    let db = dir.join("runs.db");
    let out = baton_db(
        &db,
        &[
            "--config",
            config.to_str().unwrap(),
            "run",
            "--kind",
            "task",
            "--input",
            "a greet CLI",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let job = result(&out);
    assert_eq!(job["selected"]["how"], "classifier");
    let tree = job["tree"].as_array().unwrap();
    assert_eq!((tree.len(), &tree[1]["scenario_id"]), (2, &json!("code_build")));
    assert_eq!(tree[1]["status"], "completed");
    assert!(job["tree_totals"]["cost_usd"].as_f64().unwrap() > 0.0);
    // The program the model wrote through the tools, built by the real interpreter in the
    // jail, runs.
    let workspace = dir.join("workspaces").join(tree[1]["run_id"].as_str().unwrap());
    let ran = Command::new("python3")
        .args(["-m", "greet", "Ada"])
        .current_dir(&workspace)
        .output()
        .unwrap();
    assert_eq!(text(&ran.stdout), "Hello, Ada!\n", "{}", text(&ran.stderr));
    let events = tree_events(&db, job["run_id"].as_str().unwrap());
    let verified = events.iter().find(|e| e["kind"] == "verifier_finished").unwrap();
    assert_eq!(verified["data"]["passed"], true, "{verified}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_chain_made_after_the_scenarios_changed_uses_them_and_a_broken_change_keeps_the_old() {
    for broken in [false, true] {
        let dir = scratch(&format!("tree-reload-{broken}"));
        let db = dir.join("runs.db");
        let config = hop_scenarios(&dir);
        let script = dir.join("slow.yaml");
        std::fs::write(
            &script,
            "scenarios:\n  hop:\n    levels:\n      route: [{text: '{\"chosen_intent_route\": \"echo\"}', delay_ms: 1500}]\n  echo:\n    levels:\n      say: [{text: 'echoed'}]\n",
        )
        .unwrap();
        let job = baton_in(&dir, &db)
            .arg("--config")
            .arg(&config)
            .args(["run", "hop", "--input", "x", "--script", script.to_str().unwrap(), "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !db.exists() || roots(&db).is_empty() {
            assert!(Instant::now() < deadline, "the job never started");
            std::thread::sleep(Duration::from_millis(20));
        }
        // While the first run works, the files change.
        if broken {
            std::fs::write(dir.join("scenarios/broken.yaml"), "id: broken\nversion: one\n")
                .unwrap();
        } else {
            let echo = std::fs::read_to_string(dir.join("scenarios/echo.yaml")).unwrap();
            std::fs::write(dir.join("scenarios/echo.yaml"), echo.replace("Say ", "Say v2 "))
                .unwrap();
        }
        let out = job.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
        let root = result(&out)["run_id"].as_str().unwrap().to_owned();
        let events = tree_events(&db, &root);
        let prompt = events
            .iter()
            .find(|e| e["kind"] == "prompt_sent" && e["run_id"] != root.as_str())
            .unwrap();
        let warnings: Vec<&str> = events
            .iter()
            .filter(|e| e["kind"] == "warning" && e["run_id"] == root.as_str())
            .map(|e| e["data"]["message"].as_str().unwrap())
            .collect();
        if broken {
            assert_eq!(prompt["data"]["prompt"], "Say x", "the last scenarios that loaded");
            assert_eq!(warnings.len(), 1, "{warnings:?}");
            assert!(
                warnings[0].contains("do not load") && warnings[0].contains("broken.yaml:2"),
                "{}",
                warnings[0]
            );
        } else {
            assert_eq!(prompt["data"]["prompt"], "Say v2 x", "the scenarios as they are now");
            assert!(warnings.is_empty(), "{warnings:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The model is an attacker: a review of the user's directory whose answer names a route
/// to a scenario that writes files must not get to write there.
#[test]
fn attack_a_chain_never_edits_the_directory_the_user_named_for_the_job() {
    let dir = scratch("tree-attack-workspace");
    let db = dir.join("runs.db");
    let scenarios = dir.join("scenarios");
    std::fs::create_dir_all(&scenarios).unwrap();
    std::fs::write(
        scenarios.join("review.yaml"),
        "id: review\nversion: 1\nlevels:\n  - id: look\n    kind: prompt\n    prompt: {inline: \"Review {{ input }}\"}\n    response: json\n    verifiers: [{name: present, uses: command, params: {argv: ['test', '-f', 'main.py']}}]\n    terminal: true\n",
    )
    .unwrap();
    std::fs::write(
        scenarios.join("writer.yaml"),
        "id: writer\nversion: 1\nintent_routes: [writer]\nlevels:\n  - id: edit\n    kind: tool_loop\n    prompt: {inline: \"Edit {{ input }}\"}\n",
    )
    .unwrap();
    let project = dir.join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("main.py"), "print('mine')\n").unwrap();
    let script = dir.join("script.yaml");
    std::fs::write(
        &script,
        "scenarios:\n  review:\n    levels:\n      look: [{text: '{\"ok\": true, \"chosen_intent_route\": \"writer\"}'}]\n  writer:\n    levels:\n      edit:\n        - tool_calls:\n            - {name: write_file, arguments: {path: main.py, content: \"print('pwned')\\n\"}}\n            - {name: write_file, arguments: {path: pwned.txt, content: gotcha}}\n        - tool_calls: [{name: finish, arguments: {summary: done}}]\n",
    )
    .unwrap();
    let out = baton_in(&dir, &db)
        .args(["run", "review", "--input", "the project", "--json"])
        .args(["--script", script.to_str().unwrap(), "--workspace", project.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let job = result(&out);
    // The control: the chain was made and the writer wrote — in a directory of its own.
    let tree = job["tree"].as_array().unwrap();
    assert_eq!(tree[1]["scenario_id"], "writer");
    let own = dir.join("workspaces").join(tree[1]["run_id"].as_str().unwrap());
    assert_eq!(std::fs::read_to_string(own.join("pwned.txt")).unwrap(), "gotcha");
    // The canary: the user's directory is as it was.
    assert_eq!(std::fs::read_to_string(project.join("main.py")).unwrap(), "print('mine')\n");
    assert!(!project.join("pwned.txt").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Copies a directory tree (the bundled scenarios, for a test that breaks them).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[test]
fn a_chain_with_no_scenarios_to_go_to_waits_for_them_instead_of_ending_the_job() {
    let dir = scratch("tree-no-scenarios");
    let db = dir.join("runs.db");
    copy_tree(&repo().join("scenarios"), &dir.join("scenarios"));
    let script = repo().join("scenarios/scripts/intent_classifier_unsure.yaml");
    let baton = |args: &[&str]| baton_in(&dir, &db).args(args).output().unwrap();
    let out =
        baton(&["run", "--kind", "task", "--input", "x", "--script", script.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
    let root = roots(&db).pop().unwrap();
    // The directory breaks while the job waits for its answer.
    std::fs::write(dir.join("scenarios/broken.yaml"), "id: broken\nversion: one\n").unwrap();
    let answered = baton(&["answer", &root, "--answer", "\"research_brief\""]);
    assert_eq!(
        answered.status.code(),
        Some(6),
        "{}{}",
        text(&answered.stdout),
        text(&answered.stderr)
    );
    assert!(
        text(&answered.stdout).contains("no scenario to chain to"),
        "{}",
        text(&answered.stdout)
    );
    // Nothing ended: fixed, the job chains as it would have.
    std::fs::remove_file(dir.join("scenarios/broken.yaml")).unwrap();
    let resumed = baton(&["resume", &root]);
    assert_eq!(
        resumed.status.code(),
        Some(0),
        "{}{}",
        text(&resumed.stdout),
        text(&resumed.stderr)
    );
    assert!(text(&resumed.stdout).contains("intent_classifier → research_brief"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_tree_whose_driver_died_is_listed_interrupted_from_its_first_run_down() {
    let dir = scratch("tree-driver-died");
    let db = dir.join("runs.db");
    let (mut job, _) = slow_tree(&dir, &db);
    third_run_running(&db);
    job.kill().unwrap();
    let _ = job.wait();
    let listed = baton_db(&db, &["runs", "--status", "interrupted", "--json"]);
    let list: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 3, "{list}");
    assert!(list.as_array().unwrap().iter().all(|r| r["continue_with"].is_string()), "{list}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_chain_to_a_scenario_that_starts_programs_fails_the_job_with_the_jails_reason_without_a_jail() {
    let dir = scratch("tree-chain-nojail");
    let db = dir.join("runs.db");
    let config = hop_scenarios(&dir);
    std::fs::write(
        dir.join("scenarios/builder.yaml"),
        "id: builder\nversion: 1\nintent_routes: [build]\nlevels:\n  - id: write\n    kind: prompt\n    prompt: {inline: \"Write {{ input }}\"}\n  - id: check\n    kind: verifier\n    terminal: true\n    verifiers:\n      - {name: ok, uses: command, params: {argv: [\"true\"]}}\nedges:\n  - {from: write, to: check}\n",
    )
    .unwrap();
    let script = hop_script(&dir, "build");
    let out = baton_in(&dir, &db)
        .env("BATON_BWRAP", dir.join("no-such-bwrap"))
        .arg("--config")
        .arg(&config)
        .args(["run", "hop", "--input", "x", "--script", script.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    // `hop` itself starts no program, so it runs; its chain is refused when it is decided.
    assert_eq!(out.status.code(), Some(1), "{}{}", text(&out.stdout), text(&out.stderr));
    let job = result(&out);
    assert_eq!(job["status"], "failed", "{job}");
    let reason = job["aborted_reason"].as_str().unwrap();
    assert!(
        reason.contains("the chain to scenario `builder` was refused: scenario `builder` runs programs, and the jail cannot be set up"),
        "{reason}"
    );
    // No child run exists, and no model was told of the refusal: hop made its one call.
    assert_eq!(job["tree"].as_array().map_or(1, Vec::len), 1, "{job}");
    let root = job["run_id"].as_str().unwrap();
    let events = tree_events(&db, root);
    let calls = events.iter().filter(|e| e["kind"] == "model_response").count();
    assert_eq!(calls, 1, "{events:?}");
    assert!(!kinds_of(&events).contains(&"child_run_started".to_owned()), "{events:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
