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

/// Each `tool_result` of a log: whether it is an error, and what the model read.
fn tool_results(log: &[Value]) -> Vec<(bool, String)> {
    log.iter()
        .filter(|e| e["kind"] == "tool_result")
        .map(|e| (e["data"]["is_error"] == true, e["data"]["content"].as_str().unwrap().to_owned()))
        .collect()
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
    super::without_takeovers(log)
        .into_iter()
        .filter(|e| e["kind"] != "tool_call_reissued")
        // The clock writes these (a step still running after 2 s), not a decision: whether
        // one lands depends on how loaded the machine is.
        .filter(|e| e["kind"] != "heartbeat")
        .map(|mut e| {
            super::scrub(&mut e);
            // A tool call's key derives from its run's id, new in each database.
            if e["kind"].as_str().is_some_and(|k| k.starts_with("tool_call_"))
                && let Some(data) = e["data"].as_object_mut()
            {
                data.remove("key");
            }
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

/// The bundled ticket service (`scenarios/services/tickets.py`) on a free port, stopped
/// when dropped: the receiver of the HTTP tools' requests, which counts them per
/// idempotency key and applies a key's effect once.
pub(super) struct Tickets {
    child: std::process::Child,
    port: u16,
}

impl Drop for Tickets {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Tickets {
    /// The service on 127.0.0.1:8765, where the bundled `ticket_triage` calls it.
    pub(super) fn start_bundled() -> Tickets {
        let child = std::process::Command::new("python3")
            .arg(super::repo().join("scenarios/services/tickets.py"))
            .args(["--port", "8765"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let tickets = Tickets { child, port: 8765 };
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", 8765)).is_err() {
            assert!(started.elapsed().as_secs() < 20, "the ticket service did not start");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        tickets
    }

    fn start(name: &str) -> Tickets {
        let dir = std::env::temp_dir().join(format!("baton-tickets-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let port_file = dir.join("tickets.port");
        let child = std::process::Command::new("python3")
            .arg(super::repo().join("scenarios/services/tickets.py"))
            .arg("--port-file")
            .arg(&port_file)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Stopped by its drop, whatever happens next.
        let mut tickets = Tickets { child, port: 0 };
        let started = std::time::Instant::now();
        loop {
            if let Ok(port) = std::fs::read_to_string(&port_file) {
                tickets.port = port.trim().parse().unwrap();
                return tickets;
            }
            assert!(started.elapsed().as_secs() < 20, "the ticket service did not start");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// What the service was asked: `seen` (requests per key), `applied`, `requests`.
    pub(super) fn effects(&self) -> Value {
        use std::io::{Read as _, Write as _};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(stream, "GET /effects HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let body = answer.split_once("\r\n\r\n").unwrap().1;
        serde_json::from_str(body).unwrap()
    }
}

/// A scenario whose level reads and answers tickets through the service at `port`, and a
/// configuration allowing loopback for 127.0.0.1 with the secret `tickets` sent there only.
fn http_lab(name: &str, port: u16, extra_tools: &Value) -> PathBuf {
    let dir = lab(name);
    let base = format!("http://127.0.0.1:{port}");
    let auth = json!({"Authorization": "Bearer ${secret:tickets}"});
    let mut tools = vec![
        json!({"name": "get_ticket", "effect": "read",
               "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
               "request": {"url": format!("{base}/tickets/{{id}}"), "headers": auth}}),
        json!({"name": "post_reply",
               "parameters": {"type": "object", "properties": {"id": {"type": "integer"}, "text": {"type": "string"}},
                              "required": ["id", "text"]},
               "request": {"url": format!("{base}/tickets/{{id}}/replies"), "headers": auth}}),
        json!({"name": "post_reply_slowly",
               "parameters": {"type": "object", "properties": {"id": {"type": "integer"}, "text": {"type": "string"}},
                              "required": ["id", "text"]},
               "request": {"method": "POST", "url": format!("{base}/tickets/{{id}}/replies?delay=4"), "headers": auth}}),
    ];
    tools.extend(extra_tools.as_array().unwrap().iter().cloned());
    let scenario = json!({
        "id": "desk", "version": 1,
        "toolsets": {"tickets": {"source": "http", "tools": tools}},
        "levels": [{"id": "work", "kind": "tool_loop", "prompt": {"inline": "Handle {{ input }}"},
                    "tools": ["tickets"], "terminal": true}],
    });
    std::fs::write(dir.join("scenarios/desk.yaml"), scenario.to_string()).unwrap();
    std::fs::write(
        dir.join("baton.toml"),
        "[egress]\nallow_hosts = [\"127.0.0.1\"]\nallow_private = true\n\n[secrets.tickets]\nenv = \"TICKETS_TOKEN\"\nhosts = [\"127.0.0.1\"]\n\n[secrets.elsewhere]\nenv = \"TICKETS_TOKEN\"\nhosts = [\"api.example.com\"]\n",
    )
    .unwrap();
    dir
}

fn http_baton(dir: &Path, db: &Path, secret: &str) -> std::process::Command {
    let mut c = baton_in(dir, db);
    c.env("TICKETS_TOKEN", secret).arg("--config").arg(dir.join("baton.toml"));
    c
}

#[test]
fn http_tools_read_and_write_through_the_egress_guard_with_their_key_and_secret() {
    let service = Tickets::start("http");
    let port = service.port;
    let base = format!("http://127.0.0.1:{port}");
    let extra = json!([
        {"name": "echo", "effect": "read", "request": {"url": format!("{base}/echo"),
         "headers": {"Authorization": "Bearer ${secret:tickets}"}}},
        {"name": "big", "effect": "read", "request": {"url": format!("{base}/big?bytes=10000000")}},
        {"name": "elsewhere", "effect": "read", "request": {"url": format!("http://localhost:{port}/echo")}},
        {"name": "wrong_host_secret", "effect": "read", "request": {"url": format!("{base}/echo"),
         "headers": {"Authorization": "Bearer ${secret:elsewhere}"}}},
        {"name": "metadata", "effect": "read", "request": {"url": "http://169.254.169.254/latest/meta-data"}},
        {"name": "moved_here", "effect": "read", "request": {"url": format!("{base}/moved/same"),
         "headers": {"Authorization": "Bearer ${secret:tickets}"}}},
        {"name": "moved_away", "effect": "read", "request": {"url": format!("{base}/moved/away"),
         "headers": {"Authorization": "Bearer ${secret:tickets}"}}},
    ]);
    let dir = http_lab("http", port, &extra);
    let secret = format!("tickets-secret-{}-a1b2c3", std::process::id());
    let turns = json!([
        {"tool_calls": [{"name": "get_ticket", "arguments": {"id": 7}}]},
        {"tool_calls": [{"name": "post_reply", "arguments": {"id": 7, "text": "On it."}},
                        {"name": "get_ticket", "arguments": {"id": 404}}]},
        {"tool_calls": [{"name": "echo", "arguments": {}}, {"name": "big", "arguments": {}}]},
        {"tool_calls": [{"name": "elsewhere", "arguments": {}}, {"name": "wrong_host_secret", "arguments": {}},
                        {"name": "metadata", "arguments": {}}]},
        {"tool_calls": [{"name": "moved_here", "arguments": {}}, {"name": "moved_away", "arguments": {}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "replied"}}]},
    ]);
    let file = script(&dir, &turns);
    let db = dir.join("runs.db");
    let cassette = dir.join("desk.cassette.json");
    let out = http_baton(&dir, &db, &secret)
        .args(["run", "desk", "--input", "ticket 7", "--script"])
        .arg(&file)
        .arg("--record")
        .arg(&cassette)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let run = run_of(&out.stdout);
    let log = events(&dir, &db, &run);
    let results = tool_results(&log);
    let ticket: Value =
        serde_json::from_str(&results[0].1).unwrap_or_else(|e| panic!("{e}: {results:?}"));
    assert_eq!(ticket["title"], "Checkout fails with a 500");
    let reply: Value = serde_json::from_str(&results[1].1).unwrap();
    assert_eq!(reply["ticket"], 7);
    assert!(results[2].0 && results[2].1.starts_with("HTTP 404"), "{:?}", results[2]);
    assert!(
        !results[3].1.contains(&secret) && results[3].1.contains("[redacted]"),
        "an echoed secret is redacted: {}",
        results[3].1
    );
    // The answer was cut at 64 KiB for the model; the event keeps its first 16 KiB.
    assert!(
        results[4].1.contains("more bytes went to the model"),
        "{}",
        &results[4].1[results[4].1.len() - 200..]
    );
    assert!(
        results[5].0 && results[5].1.contains("not in the egress allow-list"),
        "{:?}",
        results[5]
    );
    assert!(
        results[6].0 && results[6].1.contains("may not be sent to 127.0.0.1"),
        "{:?}",
        results[6]
    );
    assert!(
        results[7].0 && results[7].1.contains("not in the egress allow-list"),
        "{:?}",
        results[7]
    );
    // A redirect is followed on the request's host only: the secret never leaves it.
    let moved: Value =
        serde_json::from_str(&results[8].1).unwrap_or_else(|e| panic!("{e}: {results:?}"));
    assert_eq!(moved["id"], 7, "the same-host redirect was followed");
    assert!(
        results[9].0 && results[9].1.contains("a tool's request stays on its host"),
        "{:?}",
        results[9]
    );
    // The service got the secret with each request of a tool that sends it, and the write
    // call's key; the reply was applied once.
    let effects = service.effects();
    let key = log.iter().find(|e| e["kind"] == "tool_call_started").unwrap()["data"]["key"].clone();
    assert_eq!(effects["seen"][key.as_str().unwrap()], 1);
    let requests = effects["requests"].as_array().unwrap();
    let header = |r: &Value, name: &str| {
        r["headers"]
            .as_object()
            .unwrap()
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let mine: Vec<&Value> = requests
        .iter()
        .filter(|r| header(r, "authorization") == Some(json!(format!("Bearer {secret}"))))
        .collect();
    assert_eq!(
        mine.len(),
        7,
        "get, post, get, echo, both redirects and the one followed carried it: {requests:?}"
    );
    assert!(
        requests.iter().all(
            |r| header(r, "host").is_none_or(|h| !h.as_str().unwrap().starts_with("localhost"))
        ),
        "{requests:?}"
    );
    let post = requests.iter().find(|r| r["method"] == "POST").unwrap();
    assert_eq!(header(post, "idempotency-key"), Some(key.clone()));
    assert_eq!(
        serde_json::from_str::<Value>(post["body"].as_str().unwrap()).unwrap(),
        json!({"id": 7, "text": "On it."})
    );
    assert!(requests.iter().all(|r| r["path"] != "/latest/meta-data"));
    // The secret is nowhere Baton writes: its terminal, its log, its database.
    let everything = format!("{}{}{log:?}", text(&out.stdout), text(&out.stderr));
    assert!(!everything.contains(&secret), "the secret leaked");
    let database = std::fs::read(&db).unwrap();
    assert!(!database.windows(secret.len()).any(|w| w == secret.as_bytes()));
    // A replay answers every call from the recording and asks the service nothing.
    let sent = |effects: Value| {
        effects["requests"].as_array().unwrap().iter().filter(|r| r["path"] != "/effects").count()
    };
    let asked = sent(service.effects());
    let replayed =
        http_baton(&dir, &db, &secret).args(["replay", &run, "--json"]).output().unwrap();
    assert_eq!(
        replayed.status.code(),
        Some(0),
        "{}{}",
        text(&replayed.stdout),
        text(&replayed.stderr)
    );
    assert_eq!(sent(service.effects()), asked, "the replay sent a request");
    let summary: Value = serde_json::from_slice(&replayed.stdout).unwrap();
    assert_eq!(summary["matches"], true, "{summary}");
    let replay_run = summary["replay_run_id"].as_str().unwrap_or_default().to_owned();
    let replay_log = events(&dir, &db, &replay_run);
    let replay_results = tool_results(&replay_log);
    assert_eq!(
        replay_results, results,
        "the replay's tools answered as the recording's: {summary}"
    );
    // The cassette holds every answer of the tools as the model read it, the echoed secret
    // redacted; a run from it answers every call from there and asks the service nothing.
    let recorded = std::fs::read_to_string(&cassette).unwrap();
    assert!(!recorded.contains(&secret), "the secret reached the cassette");
    let recorded: Value = serde_json::from_str(&recorded).unwrap();
    let receipts = log.iter().filter(|e| e["kind"] == "tool_call_finished").count();
    assert_eq!(recorded["tools"].as_array().unwrap().len(), receipts, "{recorded}");
    let from_cassette = http_baton(&dir, &db, "another-token")
        .args(["run", "desk", "--input", "ticket 7", "--cassette"])
        .arg(&cassette)
        .output()
        .unwrap();
    assert_eq!(
        from_cassette.status.code(),
        Some(0),
        "{}{}",
        text(&from_cassette.stdout),
        text(&from_cassette.stderr)
    );
    assert_eq!(sent(service.effects()), asked, "the run from the cassette sent a request");
    let again = events(&dir, &db, &run_of(&from_cassette.stdout));
    let again = tool_results(&again);
    assert_eq!(again, results, "the cassette's tools answered as the recording's");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_driver_killed_while_its_write_request_is_in_flight_is_followed_by_one_that_sends_it_again_with_its_key()
 {
    let service = Tickets::start("kill");
    let dir = http_lab("http-kill", service.port, &json!([]));
    let secret = format!("tickets-secret-{}-kill", std::process::id());
    let turns = json!([
        {"tool_calls": [{"name": "post_reply_slowly", "arguments": {"id": 8, "text": "Fixed, thanks."}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "replied"}}]},
    ]);
    let file = script(&dir, &turns);
    let db = dir.join("runs.db");
    let mut first = http_baton(&dir, &db, &secret)
        .args(["run", "desk", "--input", "ticket 8", "--script"])
        .arg(&file)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed once the service has the request, before its answer (it answers 4 s late).
    let started = std::time::Instant::now();
    while service.effects()["seen"].as_object().unwrap().is_empty() {
        assert!(started.elapsed().as_secs() < 30, "the request never reached the service");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let listed = baton_in(&dir, &db).args(["runs", "--json"]).output().unwrap();
    let runs: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let run = runs[0]["run_id"].as_str().unwrap().to_owned();
    let resumed = http_baton(&dir, &db, &secret).args(["resume", &run]).output().unwrap();
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed.stderr));
    let log = events(&dir, &db, &run);
    let started_keys: Vec<&Value> = log
        .iter()
        .filter(|e| e["kind"] == "tool_call_started")
        .map(|e| &e["data"]["key"])
        .collect();
    let reissued: Vec<&Value> = log
        .iter()
        .filter(|e| e["kind"] == "tool_call_reissued")
        .map(|e| &e["data"]["key"])
        .collect();
    assert_eq!(started_keys.len(), 1);
    assert_eq!(reissued, started_keys, "the call without a receipt was sent again with its key");
    let effects = service.effects();
    let key = started_keys[0].as_str().unwrap();
    assert_eq!(effects["seen"][key], 2, "the service saw the key twice");
    let applied: Vec<&Value> =
        effects["applied"].as_array().unwrap().iter().filter(|a| a["key"] == key).collect();
    assert_eq!(applied.len(), 1, "and applied its effect once");
    assert_eq!(log.iter().filter(|e| e["kind"] == "tool_call_finished").count(), 1);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_approval_gated_request_waits_for_another_process_and_a_rejected_one_never_reaches_the_service()
 {
    let service = Tickets::start("approval");
    let base = format!("http://127.0.0.1:{}", service.port);
    let guarded = json!([urgent_replies(&base, Some("support_lead"))]);
    let dir = http_lab("approval", service.port, &guarded);
    let secret = format!("tickets-secret-{}-approval", std::process::id());
    let turns = two_replies("Routine.", "Escalated to on-call.");
    let file = script(&dir, &turns);
    let posts = |text: &str| {
        service.effects()["applied"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["text"] == text)
            .count()
    };
    for (decision, db) in [("approve", "approved.db"), ("reject", "rejected.db")] {
        let db = dir.join(db);
        let before = posts("Escalated to on-call.");
        let out = http_baton(&dir, &db, &secret)
            .args(["run", "desk", "--input", "tickets", "--script"])
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(3),
            "paused for approval: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        let run = run_of(&out.stdout);
        let waiting = events(&dir, &db, &run);
        let asked = waiting.iter().find(|e| e["kind"] == "approval_requested").unwrap();
        assert_eq!(asked["data"]["approver_role"], "support_lead");
        assert_eq!(asked["data"]["tool"]["arguments"]["id"], 7);
        assert_eq!(posts("Escalated to on-call."), before, "nothing is sent before the decision");
        // Two processes decide at once (a lead and a second lead): one decision stands.
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
        let deciders: Vec<_> = ["lead", "lead2"]
            .into_iter()
            .map(|by| {
                let mut approve = http_baton(&dir, &db, &secret);
                approve.args(["approve", &run, "--by", by]);
                if decision == "reject" {
                    approve.args(["--reject", "--comment", "not an outage"]);
                }
                let barrier = std::sync::Arc::clone(&barrier);
                std::thread::spawn(move || {
                    barrier.wait();
                    approve.output().unwrap()
                })
            })
            .collect();
        let outs: Vec<std::process::Output> =
            deciders.into_iter().map(|d| d.join().unwrap()).collect();
        let won: Vec<&std::process::Output> =
            outs.iter().filter(|o| o.status.code() == Some(0)).collect();
        assert_eq!(
            won.len(),
            1,
            "one decider wins: {:?}",
            outs.iter().map(|o| text(&o.stderr)).collect::<Vec<_>>()
        );
        // The other finds the request decided (or, once the winner's resumption has run
        // past it, no approval waited for).
        let lost = text(&outs.iter().find(|o| o.status.code() != Some(0)).unwrap().stderr);
        assert!(lost.contains("decided") || lost.contains("not waiting for an approval"), "{lost}");
        let log = events(&dir, &db, &run);
        assert_eq!(log.iter().filter(|e| e["kind"] == "approval_decided").count(), 1);
        let by = log.iter().find(|e| e["kind"] == "approval_decided").unwrap()["data"]["by"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(log.last().unwrap()["data"]["status"], "completed");
        let results: Vec<&str> = log
            .iter()
            .filter(|e| e["kind"] == "tool_result")
            .map(|e| e["data"]["content"].as_str().unwrap())
            .collect();
        if decision == "approve" {
            assert_eq!(posts("Escalated to on-call."), before + 1, "made once, after its approval");
        } else {
            assert_eq!(
                posts("Escalated to on-call."),
                before,
                "a rejected call never reaches the service"
            );
            let said = format!("rejected by {by}: not an outage");
            assert!(results.contains(&said.as_str()), "{results:?}");
        }
    }
    assert_eq!(posts("Routine."), 2, "the call its gate lets through is made at once, in each run");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_mcp_servers_tools_are_offered_as_it_lists_them_and_called_jailed_with_a_writes_key() {
    let dir = lab("mcp");
    std::fs::create_dir_all(dir.join("scenarios/seed/kb")).unwrap();
    std::fs::write(dir.join("scenarios/seed/kb/refunds.md"), "Refunds are paid within 5 days.\n")
        .unwrap();
    let server = super::repo().join(".peers/npm/node_modules/.bin/mcp-server-filesystem");
    assert!(
        server.exists(),
        "server-filesystem is not installed: run scripts/test, which installs it"
    );
    let scenario = json!({
        "id": "desk", "version": 1, "workspace": {"seed": "seed"},
        "toolsets": {"kb": {"source": "mcp", "server": [server, "."],
                            "allow": ["list_directory", "read_text_file", "create_directory"],
                            "read": ["list_directory", "read_text_file"],
                            "tools": [{"name": "create_directory", "max_calls": 1}]}},
        "levels": [{"id": "work", "kind": "tool_loop", "prompt": {"inline": "Handle {{ input }}"},
                    "tools": ["kb"], "terminal": true}],
    });
    std::fs::write(dir.join("scenarios/desk.yaml"), scenario.to_string()).unwrap();
    let turns = json!([
        {"tool_calls": [{"name": "list_directory", "arguments": {"path": "kb"}},
                        {"name": "read_text_file", "arguments": {"path": "kb/refunds.md"}},
                        {"name": "read_text_file", "arguments": {"file": "kb/refunds.md"}}]},
        {"tool_calls": [{"name": "create_directory", "arguments": {"path": "answers"}},
                        {"name": "create_directory", "arguments": {"path": "again"}},
                        {"name": "move_file", "arguments": {"source": "answers", "destination": "x"}},
                        {"name": "read_text_file", "arguments": {"path": "/etc/passwd"}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "answered"}}]},
    ]);
    let file = script(&dir, &turns);
    let db = dir.join("runs.db");
    let out = baton_in(&dir, &db)
        .args(["run", "desk", "--input", "a refund question", "--script"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let run = run_of(&out.stdout);
    let log = events(&dir, &db, &run);
    let warnings: Vec<&Value> = log.iter().filter(|e| e["kind"] == "warning").collect();
    assert!(warnings.is_empty(), "{warnings:?}");
    let results = tool_results(&log);
    assert!(!results[0].0 && results[0].1.contains("refunds.md"), "{:?}", results[0]);
    assert_eq!(results[1], (false, "Refunds are paid within 5 days.\n".to_owned()));
    // The server's own schema checks the arguments before anything is sent.
    assert!(
        results[2].0 && results[2].1.contains("\"path\" is a required property"),
        "{:?}",
        results[2]
    );
    assert!(!results[3].0, "{:?}", results[3]);
    assert!(results[4].0 && results[4].1.contains("at most 1 times"), "{:?}", results[4]);
    assert!(
        results[5].0 && results[5].1.contains("there is no tool `move_file`"),
        "{:?}",
        results[5]
    );
    assert!(results[6].0, "outside its directory: {:?}", results[6]);
    assert!(dir.join("workspaces").join(&run).join("answers").is_dir(), "the server made it");
    let started: Vec<&Value> = log.iter().filter(|e| e["kind"] == "tool_call_started").collect();
    assert_eq!(started.len(), 1, "only the allowed write is keyed");
    assert_eq!(started[0]["data"]["toolset"], "kb");
    let _ = std::fs::remove_dir_all(dir);
}

/// A write tool of the service at `base` whose calls for urgent tickets wait for approval
/// (by `role`, when given).
fn urgent_replies(base: &str, role: Option<&str>) -> Value {
    let mut tool = json!({
        "name": "post_urgent_reply",
        "parameters": {"type": "object",
                       "properties": {"id": {"type": "integer"}, "text": {"type": "string"}, "urgent": {"type": "boolean"}},
                       "required": ["id", "text", "urgent"]},
        "request": {"url": format!("{base}/tickets/{{id}}/replies"), "headers": {"Authorization": "Bearer ${secret:tickets}"}},
        "approval": "args.urgent == true",
    });
    if let Some(role) = role {
        tool["approver_role"] = json!(role);
    }
    tool
}

/// A model's turns: a routine reply to ticket 8 and an urgent one to ticket 7, then finish.
fn two_replies(routine: &str, urgent: &str) -> Value {
    json!([
        {"tool_calls": [{"name": "post_urgent_reply", "arguments": {"id": 8, "text": routine, "urgent": false}},
                        {"name": "post_urgent_reply", "arguments": {"id": 7, "text": urgent, "urgent": true}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "answered"}}]},
    ])
}

/// `baton` on the bundled scenarios, with the ticket service's configuration and token and
/// the MCP servers the suite installs on PATH.
fn bundled_triage(db: &Path) -> std::process::Command {
    let repo = super::repo();
    let path = format!(
        "{}:{}",
        repo.join(".peers/npm/node_modules/.bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = super::baton_command();
    c.env("PATH", path)
        .env("TICKETS_TOKEN", "sweep-token")
        .env("BATON_CONFIG", repo.join("scenarios/services/baton.toml"))
        .arg("--db")
        .arg(db);
    c
}

/// Drives a triage run to its end: resumed, and approved when it waits.
fn triage_to_end(db: &Path, run: &str) {
    for _ in 0..10 {
        let out = bundled_triage(db).args(["resume", run]).output().unwrap();
        match out.status.code() {
            Some(0 | 1) => return,
            Some(3) => {
                let approved =
                    bundled_triage(db).args(["approve", run, "--by", "lead"]).output().unwrap();
                if approved.status.code() == Some(0) {
                    return;
                }
            }
            other => panic!("resume exited {other:?}: {}{}", text(&out.stdout), text(&out.stderr)),
        }
    }
    panic!("run {run} did not end");
}

#[test]
fn the_bundled_ticket_triage_killed_after_any_event_resumes_to_the_same_log_and_replies_once() {
    let service = Tickets::start_bundled();
    let dir = std::env::temp_dir().join(format!("baton-triage-sweep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let start = [
        "run",
        "ticket_triage",
        "--script",
        "scenarios/scripts/ticket_triage.yaml",
        "--input",
        "the open tickets",
    ];
    let reference_db = dir.join("reference.db");
    let out = bundled_triage(&reference_db).args(start).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "it waits for the urgent reply's approval: {}",
        text(&out.stderr)
    );
    let reference_run = run_of(&out.stdout);
    triage_to_end(&reference_db, &reference_run);
    let reference = normalised(events(&dir, &reference_db, &reference_run));
    assert_eq!(reference.last().unwrap()["data"]["status"], "completed");
    let mut kills = 0;
    for n in 1..=reference.len() {
        let db = dir.join(format!("killed-{n}.db"));
        let killed = bundled_triage(&db)
            .args(start)
            .env("BATON_FAILPOINT_ABORT_AFTER_EVENT", n.to_string())
            .output()
            .unwrap();
        kills += usize::from(killed.status.code().is_none());
        let listed = bundled_triage(&db).args(["runs", "--json"]).output().unwrap();
        let runs: Value = serde_json::from_slice(&listed.stdout).unwrap();
        let run = runs[0]["run_id"].as_str().unwrap().to_owned();
        triage_to_end(&db, &run);
        let log = events(&dir, &db, &run);
        // Each reply this run posted reached the service at most twice and was applied once.
        let effects = service.effects();
        for e in log.iter().filter(|e| e["kind"] == "tool_call_started") {
            let key = e["data"]["key"].as_str().unwrap();
            let seen = effects["seen"][key].as_u64().unwrap_or(0);
            assert!((1..=2).contains(&seen), "killed after event {n}: key {key} seen {seen} times");
            let applied =
                effects["applied"].as_array().unwrap().iter().filter(|a| a["key"] == key).count();
            assert_eq!(applied, 1, "killed after event {n}: key {key} applied {applied} times");
        }
        assert_eq!(normalised(log), reference, "killed after event {n}, the resumed log differs");
    }
    assert!(kills > 3, "the failpoint killed the first process only {kills} times");
    // A replay of the run asks the service nothing.
    let asked = service.effects()["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["path"] != "/effects")
        .count();
    let replayed =
        bundled_triage(&reference_db).args(["replay", &reference_run, "--json"]).output().unwrap();
    let summary: Value = serde_json::from_slice(&replayed.stdout).unwrap_or(Value::Null);
    assert_eq!(summary["matches"], true, "{}{}", text(&replayed.stdout), text(&replayed.stderr));
    let after = service.effects()["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["path"] != "/effects")
        .count();
    assert_eq!(after, asked, "the replay sent a request");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_fork_keeps_the_receipts_before_its_point_and_makes_its_later_calls_with_keys_of_its_own() {
    let service = Tickets::start("fork");
    let base = format!("http://127.0.0.1:{}", service.port);
    let guarded = json!([urgent_replies(&base, None)]);
    let dir = http_lab("fork", service.port, &guarded);
    let secret = format!("tickets-secret-{}-fork", std::process::id());
    let turns = two_replies("Forked routine.", "Forked urgent.");
    let file = script(&dir, &turns);
    let db = dir.join("runs.db");
    let out = http_baton(&dir, &db, &secret)
        .args(["run", "desk", "--input", "tickets", "--script"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
    let run = run_of(&out.stdout);
    let original = events(&dir, &db, &run);
    let pause =
        original.iter().rev().find(|e| e["kind"] == "run_paused").unwrap()["seq"].as_u64().unwrap();
    let routine_key =
        original.iter().find(|e| e["kind"] == "tool_call_started").unwrap()["data"]["key"].clone();
    // The fork keeps everything to the pause, the routine reply's receipt among it.
    let forked = http_baton(&dir, &db, &secret)
        .args(["fork", &run, "--at", &pause.to_string(), "--script"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(
        forked.status.code(),
        Some(3),
        "the fork waits for its own decision: {}{}",
        text(&forked.stdout),
        text(&forked.stderr)
    );
    let fork = run_of(&forked.stdout);
    assert_ne!(fork, run);
    let approved =
        http_baton(&dir, &db, &secret).args(["approve", &fork, "--by", "lead"]).output().unwrap();
    assert_eq!(
        approved.status.code(),
        Some(0),
        "{}{}",
        text(&approved.stdout),
        text(&approved.stderr)
    );
    let applied = |text: &str| {
        service.effects()["applied"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["text"] == text)
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        applied("Forked routine.").len(),
        1,
        "the reply before the fork point is never sent again"
    );
    let urgent = applied("Forked urgent.");
    assert_eq!(urgent.len(), 1, "the fork's later call is live, once");
    let fork_log = events(&dir, &db, &fork);
    let keys: Vec<&Value> = fork_log
        .iter()
        .filter(|e| e["kind"] == "tool_call_started")
        .map(|e| &e["data"]["key"])
        .collect();
    assert_eq!(keys[0], &routine_key, "the copied receipt keeps the original's key");
    assert_eq!(keys.len(), 2);
    assert_ne!(keys[1], &routine_key);
    assert_eq!(&urgent[0]["key"], keys[1], "keyed by the fork");
    assert!(!original.iter().any(|e| e["data"]["key"] == *keys[1]), "a key of the fork's own");
    let _ = std::fs::remove_dir_all(dir);
}

/// server-everything over Streamable HTTP on a free port of 127.0.0.1, stopped when dropped.
struct Everything(std::process::Child, u16);

impl Drop for Everything {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn everything_over_http() -> Everything {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let bin = super::repo().join(".peers/npm/node_modules/.bin/mcp-server-everything");
    assert!(
        bin.exists(),
        "server-everything is not installed: run scripts/test, which installs it"
    );
    let child = std::process::Command::new(bin)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let server = Everything(child, port);
    let started = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(started.elapsed().as_secs() < 30, "server-everything did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    server
}

#[test]
fn an_mcp_server_over_streamable_http_is_reached_through_the_egress_guard_when_loopback_is_allowed()
{
    let server = everything_over_http();
    let dir = lab("mcp-http");
    let scenario = json!({
        "id": "desk", "version": 1,
        "toolsets": {"every": {"source": "mcp", "url": format!("http://127.0.0.1:{}/mcp", server.1),
                               "allow": ["echo", "get-sum"], "read": ["echo"]}},
        "levels": [{"id": "work", "kind": "tool_loop", "prompt": {"inline": "Handle {{ input }}"},
                    "tools": ["every"], "terminal": true}],
    });
    std::fs::write(dir.join("scenarios/desk.yaml"), scenario.to_string()).unwrap();
    let turns = json!([
        {"tool_calls": [{"name": "echo", "arguments": {"message": "hello"}},
                        {"name": "get-sum", "arguments": {"a": 2, "b": 3}},
                        {"name": "get-sum", "arguments": {"a": "two"}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "done"}}]},
    ]);
    let file = script(&dir, &turns);
    let allowed = dir.join("allowed.toml");
    std::fs::write(&allowed, "[egress]\nallow_hosts = [\"127.0.0.1\"]\nallow_private = true\n")
        .unwrap();
    let refused = dir.join("refused.toml");
    std::fs::write(&refused, "[egress]\nallow_hosts = [\"127.0.0.1\"]\n").unwrap();
    let run_with = |config: &Path, db: &str| {
        let db = dir.join(db);
        let out = baton_in(&dir, &db)
            .arg("--config")
            .arg(config)
            .args(["run", "desk", "--input", "x", "--script"])
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
        events(&dir, &db, &run_of(&out.stdout))
    };
    let log = run_with(&allowed, "allowed.db");
    let results = tool_results(&log);
    assert_eq!(results[0], (false, "Echo: hello".to_owned()));
    assert_eq!(results[1], (false, "The sum of 2 and 3 is 5.".to_owned()));
    assert!(
        results[2].0 && results[2].1.contains("/a"),
        "the server's schema checked it first: {:?}",
        results[2]
    );
    let listed = log.iter().find(|e| e["kind"] == "tools_listed").unwrap();
    assert_eq!(listed["data"]["tools"].as_array().unwrap().len(), 2, "{listed}");
    assert_eq!(
        log.iter().filter(|e| e["kind"] == "tool_call_started").count(),
        1,
        "get-sum is a write"
    );
    // Without loopback allowed, the server is not reached and its tools not offered.
    let log = run_with(&refused, "refused.db");
    let warning = log.iter().find(|e| e["kind"] == "warning").unwrap();
    assert!(warning["data"]["message"].as_str().unwrap().contains("loopback"), "{warning}");
    let results: Vec<&Value> = log.iter().filter(|e| e["kind"] == "tool_result").collect();
    assert!(
        results[0]["data"]["content"].as_str().unwrap().contains("there is no tool `echo`"),
        "{results:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_bundled_ticket_triage_demo_script_starts_its_service_and_ends_with_each_reply_applied_once()
{
    let dir = lab("demo-tickets");
    let db = dir.join("demo.db");
    let out = std::process::Command::new("bash")
        .arg(super::repo().join("scripts/demo-tickets"))
        .env("BATON_BIN", env!("CARGO_BIN_EXE_baton"))
        .env("BATON_BWRAP", super::bwrap())
        .env("BATON_DB", &db)
        .env_remove("BATON_CONFIG")
        .output()
        .unwrap();
    let printed = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{printed}");
    // It paused for the support lead, was approved by a second process, and the service
    // applied the two replies once each, each key seen once.
    assert!(printed.contains("waits on approval") || printed.contains("paused"), "{printed}");
    assert_eq!(printed.matches("applied: ").count(), 2, "{printed}");
    assert_eq!(printed.matches(": 1 request(s)").count(), 2, "{printed}");
    // The service is stopped with the script.
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", 8765)).is_err(),
        "the ticket service outlived its script"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn validate_with_tools_shows_what_mcp_servers_annotate_as_hints_and_a_server_that_fails_as_a_warning()
 {
    let dir = lab("probe-tools");
    let server = super::repo().join(".peers/npm/node_modules/.bin/mcp-server-filesystem");
    let scenario = json!({
        "id": "desk", "version": 1, "workspace": {"seed": "seed"},
        "toolsets": {
            // read_text_file: annotated read-only, treated as a write; create_directory:
            // listed as a read, not annotated read-only; nope: not offered.
            "kb": {"source": "mcp", "server": [server, "."],
                   "allow": ["list_directory", "read_text_file", "create_directory", "nope"],
                   "read": ["list_directory", "create_directory"]},
            "gone": {"source": "mcp", "server": ["no-such-mcp-server"], "allow": ["anything"]},
            // Without `allow`, no tool of the server is offered (and it is not started).
            "bare": {"source": "mcp", "server": [server, "."]},
        },
        "levels": [{"id": "work", "kind": "tool_loop", "prompt": {"inline": "Handle {{ input }}"},
                    "tools": ["kb", "gone", "bare"], "terminal": true}],
    });
    std::fs::write(dir.join("scenarios/desk.yaml"), scenario.to_string()).unwrap();
    let db = dir.join("runs.db");
    // Without --tools no server is started: nothing to say.
    let plain = baton_in(&dir, &db).args(["validate", "--format", "json"]).output().unwrap();
    let plain: Value = serde_json::from_slice(&plain.stdout).unwrap();
    assert_eq!((plain["ok"].clone(), plain["hints"].clone()), (json!(true), json!(0)), "{plain}");
    assert!(
        plain["diagnostics"].as_array().unwrap().iter().any(|d| d["code"] == "mcp-allows-nothing"
            && d["message"].as_str().unwrap().contains("`bare` allows none")),
        "{plain}"
    );
    let out = baton_in(&dir, &db)
        .args(["validate", "--tools", "--tools-timeout-s", "60", "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "hints and warnings fail nothing: {}",
        text(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let said = |severity: &str| -> Vec<String> {
        report["diagnostics"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["severity"] == severity)
            .map(|d| d["message"].as_str().unwrap().to_owned())
            .collect()
    };
    let hints = said("hint");
    assert_eq!(hints.len(), 2, "{report}");
    assert!(
        hints[0].contains("`read_text_file`") && hints[0].contains("annotates it read-only"),
        "{hints:?}"
    );
    assert!(
        hints[1].contains("`create_directory`")
            && hints[1].contains("does not annotate it read-only"),
        "{hints:?}"
    );
    let warnings = said("warning");
    assert!(warnings.iter().any(|w| w.contains("`nope` is not offered")), "{warnings:?}");
    assert!(
        warnings.iter().any(
            |w| w.contains("toolset `gone` is not offered") && w.contains("no-such-mcp-server")
        ),
        "{warnings:?}"
    );
    assert_eq!(report["hints"], 2);
    // In text, each is said with its file and a help line.
    let shown = baton_in(&dir, &db).args(["validate", "--tools"]).output().unwrap();
    let shown = text(&shown.stderr);
    assert!(shown.contains("hint[mcp-annotation]") && shown.contains("desk.yaml"), "{shown}");
    let _ = std::fs::remove_dir_all(dir);
}

/// An MCP server over stdio that lists one tool, `boom`, and exits when it is called.
const CRASHING_SERVER: &str = r#"
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    if m["method"] == "initialize":
        r = {"protocolVersion": m["params"]["protocolVersion"], "capabilities": {"tools": {}}, "serverInfo": {"name": "crashing", "version": "1"}}
    elif m["method"] == "tools/list":
        r = {"tools": [{"name": "boom", "description": "Fails hard.", "inputSchema": {"type": "object"}}]}
    else:
        sys.exit(3)
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": r}), flush=True)
"#;

#[test]
fn an_mcp_server_that_dies_during_a_call_is_a_tool_error_and_the_run_goes_on() {
    let dir = lab("mcp-crash");
    let scenario = json!({
        "id": "desk", "version": 1, "workspace": {"seed": "seed"},
        "toolsets": {"crashy": {"source": "mcp", "server": ["python3", "-c", CRASHING_SERVER],
                                "allow": ["boom"]}},
        "levels": [{"id": "work", "kind": "tool_loop", "prompt": {"inline": "Handle {{ input }}"},
                    "tools": ["crashy"], "terminal": true}],
    });
    std::fs::write(dir.join("scenarios/desk.yaml"), scenario.to_string()).unwrap();
    let turns = json!([
        {"tool_calls": [{"name": "boom", "arguments": {}}]},
        {"tool_calls": [{"name": "boom", "arguments": {}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "the tool is down"}}]},
    ]);
    let file = script(&dir, &turns);
    let db = dir.join("runs.db");
    let out = baton_in(&dir, &db)
        .args(["run", "desk", "--input", "x", "--script"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let log = events(&dir, &db, &run_of(&out.stdout));
    let results = tool_results(&log);
    // Both calls are errors the model reads (the server is gone after the first); each
    // write call has its receipt, and the run finishes.
    assert_eq!(results.len(), 3, "{results:?}");
    assert!(results[0].0 && results[1].0, "{results:?}");
    assert!(
        results[..2].iter().all(|r| r.1.contains("the MCP server exited (exit status: 3)")),
        "{results:?}"
    );
    let receipts = log.iter().filter(|e| e["kind"] == "tool_call_finished").count();
    assert_eq!(receipts, 2);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_process_that_does_not_see_a_runs_snapshots_refuses_to_go_on_and_the_run_goes_on_where_it_started()
 {
    let dir = lab("elsewhere");
    let scenario = json!({
        "id": "desk", "version": 1, "workspace": {"seed": "seed"},
        "levels": [
            {"id": "work", "kind": "tool_loop", "prompt": {"inline": "Handle {{ input }}"}},
            {"id": "sign", "kind": "human_approval", "approver_role": "lead", "terminal": true},
        ],
        "edges": [{"from": "work", "to": "sign"}],
    });
    std::fs::write(dir.join("scenarios/desk.yaml"), scenario.to_string()).unwrap();
    let turns = json!([
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "notes.txt", "content": "kept\n"}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "noted"}}]},
    ]);
    let file = script(&dir, &turns);
    let db = dir.join("runs.db");
    let out = baton_in(&dir, &db)
        .args(["run", "desk", "--input", "x", "--script"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
    let run = run_of(&out.stdout);
    let before = events(&dir, &db, &run);
    // Another process keeps its snapshots elsewhere (another host, another data directory):
    // it records the decision and refuses to drive on.
    let elsewhere = baton_in(&dir, &db)
        .arg("--snapshots")
        .arg(dir.join("other-snapshots"))
        .args(["approve", &run, "--by", "lead"])
        .output()
        .unwrap();
    let said = text(&elsewhere.stderr);
    assert_ne!(elsewhere.status.code(), Some(0), "{said}");
    assert!(said.contains("its workspace is not here") && said.contains("snapshot"), "{said}");
    let after = events(&dir, &db, &run);
    assert_eq!(
        after.iter().filter(|e| e["kind"] != "approval_decided").count(),
        before.len(),
        "nothing but the decision was written: {after:?}"
    );
    // Where it started, it goes on with its files.
    let resumed = baton_in(&dir, &db).args(["resume", &run]).output().unwrap();
    assert_eq!(
        resumed.status.code(),
        Some(0),
        "{}{}",
        text(&resumed.stdout),
        text(&resumed.stderr)
    );
    let log = events(&dir, &db, &run);
    assert_eq!(log.last().unwrap()["data"]["status"], "completed");
    let workspace = log[0]["data"]["workspace"]["dir"].as_str().unwrap();
    assert_eq!(std::fs::read_to_string(Path::new(workspace).join("notes.txt")).unwrap(), "kept\n");
    let _ = std::fs::remove_dir_all(dir);
}
