//! The user's own `command` tools through `baton run`, in the real jail: a program gets its
//! call's arguments on stdin and a write call's idempotency key in its environment, runs
//! in the run's workspace with no network and none of Baton's environment; and a run
//! killed after any of its events resumes to the log and the files an uninterrupted run
//! ends with (a call that has a receipt is never made again, one without is made again
//! with its key).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{baton_in, text};

/// A probe: says what it was given and what it can reach, as JSON.
const PROBE: &str = r#"
import json, os, socket, sys
args = json.load(sys.stdin)
out = {"args": args, "key": os.environ.get("BATON_IDEMPOTENCY_KEY"),
       "secret": os.environ.get("BATON_TEST_SECRET"), "seed": os.path.exists("seed.txt")}
try:
    socket.create_connection(("127.0.0.1", int(args["port"])), timeout=2)
    out["network"] = "reached"
except OSError as e:
    out["network"] = "refused"
open("probed.txt", "w").write("probed\n")
print(json.dumps(out))
"#;

/// A note taker: appends its argument to `notes.txt` in the workspace.
const NOTE: &str = r#"
import json, sys
args = json.load(sys.stdin)
with open("notes.txt", "a") as f:
    f.write(args["text"] + "\n")
print("noted " + args["text"])
"#;

fn lab(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("baton-own-tools-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("scenarios/seed")).unwrap();
    std::fs::write(dir.join("scenarios/seed/seed.txt"), "seeded\n").unwrap();
    let scenario = json!({
        "id": "desk",
        "version": 1,
        "workspace": {"seed": "seed"},
        "toolsets": {"desk": {"source": "command", "tools": [
            {"name": "probe", "effect": "read", "command": ["python3", "-c", PROBE],
             "parameters": {"type": "object", "properties": {"port": {"type": "integer"}}}},
            {"name": "note", "command": ["python3", "-c", NOTE], "timeout_s": 30,
             "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                            "required": ["text"]}},
        ]}},
        "levels": [{"id": "work", "kind": "tool_loop", "prompt": {"inline": "Handle {{ input }}"},
                    "tools": ["desk"], "terminal": true}],
    });
    std::fs::write(dir.join("scenarios/desk.yaml"), scenario.to_string()).unwrap();
    dir
}

fn script(dir: &Path, turns: &Value) -> PathBuf {
    let file = dir.join("script.yaml");
    std::fs::write(&file, json!({"levels": {"work": turns}}).to_string()).unwrap();
    file
}

fn events(dir: &Path, db: &Path, run: &str) -> Vec<Value> {
    let out = baton_in(dir, db).args(["events", run, "--json"]).output().unwrap();
    text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn run_of(stdout: &[u8]) -> String {
    text(stdout).lines().find_map(|l| l.strip_prefix("run ")).unwrap_or_default().to_owned()
}

#[test]
fn a_command_tool_runs_jailed_with_its_arguments_on_stdin_and_its_key_in_its_environment() {
    let dir = lab("probe");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let secret = format!("own-tools-canary-{}", std::process::id());
    let turns = json!([
        {"tool_calls": [{"name": "probe", "arguments": {"port": port}}]},
        {"tool_calls": [{"name": "note", "arguments": {"text": "first"}}]},
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "probed.txt"}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "done"}}]},
    ]);
    let file = script(&dir, &turns);
    let db = dir.join("runs.db");
    let out = baton_in(&dir, &db)
        .env("BATON_TEST_SECRET", &secret)
        .args(["run", "desk", "--input", "ticket 7", "--script"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let run = run_of(&out.stdout);
    let log = events(&dir, &db, &run);
    let results: Vec<&Value> =
        log.iter().filter(|e| e["kind"] == "tool_result").map(|e| &e["data"]).collect();
    let probe: Value = serde_json::from_str(results[0]["content"].as_str().unwrap()).unwrap();
    assert_eq!(probe["args"], json!({"port": port}), "the arguments came on stdin");
    assert_eq!(probe["key"], Value::Null, "a read call has no key");
    assert_eq!(probe["secret"], Value::Null, "none of Baton's environment reaches a tool");
    assert_eq!(probe["network"], "refused", "a command tool has no network");
    assert_eq!(probe["seed"], true, "it runs in the run's workspace");
    assert_eq!(results[1]["content"], "noted first\n");
    assert_eq!(results[2]["content"], "probed\n", "the program's files are the workspace's");
    let started: Vec<&Value> =
        log.iter().filter(|e| e["kind"] == "tool_call_started").map(|e| &e["data"]).collect();
    assert_eq!(started.len(), 1, "only the write call is started");
    assert_eq!(started[0]["tool"], "note");
    assert_eq!(started[0]["toolset"], "desk");
    let key = started[0]["key"].as_str().unwrap();
    let receipt =
        log.iter().find(|e| e["kind"] == "tool_call_finished" && e["data"]["key"] == key).unwrap();
    assert!(
        receipt["data"]["snapshot"].is_string(),
        "a program's write keeps the files: {receipt}"
    );
    let notes = dir.join("workspaces").join(&run).join("notes.txt");
    assert_eq!(std::fs::read_to_string(notes).unwrap(), "first\n");
    let everything = format!("{}{}{log:?}", text(&out.stdout), text(&out.stderr));
    assert!(!everything.contains(&secret));
    drop(listener);
    let _ = std::fs::remove_dir_all(dir);
}

/// A run's log without what differs between two runs that did the same: times, ids, keys
/// and snapshots, the takeovers and reissues a kill adds.
fn normalised(log: Vec<Value>) -> Vec<Value> {
    fn scrub(v: &mut Value) {
        match v {
            Value::Object(map) => {
                for key in
                    ["at", "duration_ms", "total_duration_ms", "dir", "base", "snapshot", "key"]
                {
                    map.remove(key);
                }
                map.values_mut().for_each(scrub);
            }
            Value::Array(items) => items.iter_mut().for_each(scrub),
            _ => {}
        }
    }
    super::without_takeovers(log)
        .into_iter()
        .filter(|e| e["kind"] != "tool_call_reissued")
        .map(|mut e| {
            scrub(&mut e);
            e
        })
        .collect()
}

#[test]
fn killed_after_any_event_a_run_with_write_tools_resumes_to_the_same_log_and_files() {
    let dir = lab("sweep");
    let turns = json!([
        {"tool_calls": [{"name": "note", "arguments": {"text": "first"}}]},
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}},
                        {"name": "note", "arguments": {"text": "second"}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "noted"}}]},
    ]);
    let file = script(&dir, &turns);
    let start = |db: &Path, abort_after: Option<usize>| {
        let mut c = baton_in(&dir, db);
        c.args(["run", "desk", "--input", "ticket 7", "--script"]).arg(&file);
        if let Some(n) = abort_after {
            c.env("BATON_FAILPOINT_ABORT_AFTER_EVENT", n.to_string());
        }
        c.output().unwrap()
    };
    let reference_db = dir.join("reference.db");
    let out = start(&reference_db, None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let reference_run = run_of(&out.stdout);
    let reference = normalised(events(&dir, &reference_db, &reference_run));
    let notes =
        |run: &str| std::fs::read_to_string(dir.join("workspaces").join(run).join("notes.txt"));
    assert_eq!(notes(&reference_run).unwrap(), "first\nsecond\n");
    let mut kills = 0;
    let mut reissues = 0;
    for n in 1..=reference.len() {
        let db = dir.join(format!("killed-{n}.db"));
        let out = start(&db, Some(n));
        kills += usize::from(out.status.code().is_none());
        let listed = baton_in(&dir, &db).args(["runs", "--json"]).output().unwrap();
        let runs: Value = serde_json::from_slice(&listed.stdout).unwrap();
        let run = runs[0]["run_id"].as_str().unwrap().to_owned();
        let resumed = baton_in(&dir, &db).args(["resume", &run]).output().unwrap();
        assert_eq!(resumed.status.code(), Some(0), "kill at {n}: {}", text(&resumed.stderr));
        let log = events(&dir, &db, &run);
        reissues += log.iter().filter(|e| e["kind"] == "tool_call_reissued").count();
        assert_eq!(normalised(log), reference, "killed after event {n}, the resumed log differs");
        assert_eq!(notes(&run).unwrap(), "first\nsecond\n", "killed after event {n}");
    }
    assert!(kills > 3, "the failpoint killed the first process only {kills} times");
    assert!(reissues > 0, "no kill fell between a call's start and its receipt");
    let _ = std::fs::remove_dir_all(dir);
}
