//! One matrix of job-start cases, run against every surface that starts jobs: `baton run`,
//! `baton run --queue` with `baton worker`, `POST /runs` of `baton serve`, and MCP's
//! `run_start` on `baton mcp`. Each case must come out the same everywhere — started with
//! the same selection (the `scenario_selected` a run records, compared whole), or refused
//! with the same kind (the application layer's table: the CLI's exit code, the HTTP status
//! and problem type, the problem type MCP's error result carries) and the same words —
//! because every surface starts jobs through the same code. Later start rules add their
//! cases here, not as tests of one surface.
//!
//! Every process runs where no jail can be set up (`BATON_BWRAP` names nothing): a job that
//! can reach a scenario starting programs must be refused before its first call, and the
//! others run as usual.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use super::serve::{Served, http};
use super::{baton_command, scratch, text};

/// How a case must come out.
#[derive(Clone, Debug)]
enum Expect {
    /// A run of `scenario`, chosen `how`, with a warning that says `warning` (or none).
    Started { scenario: &'static str, how: &'static str, warning: Option<&'static str> },
    /// Refused with the problem type `kind` (the URI's last segment), saying `says`.
    Refused { kind: &'static str, says: &'static str },
    /// The same run both times (an idempotency key used twice): no second run.
    SameRun,
}

/// One job start: its request in the API's words (the CLI's flags are derived from it).
struct Case {
    name: &'static str,
    request: Value,
    expect: Expect,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "an unknown explicit scenario",
            request: json!({"scenario": "ecoh", "input": "x"}),
            expect: Expect::Refused {
                kind: "invalid",
                says: "no scenario `ecoh`; did you mean `echo`? (known: builder, echo, hop, waver, worker)",
            },
        },
        Case {
            name: "an empty scenario",
            request: json!({"scenario": " ", "input": "x"}),
            expect: Expect::Refused { kind: "invalid", says: "scenario is empty" },
        },
        Case {
            name: "a metadata pin that names nothing",
            request: json!({"metadata": {"scenario_id": "nope"}, "input": "x"}),
            expect: Expect::Started {
                scenario: "echo",
                how: "default",
                warning: Some("no scenario `nope`; the job runs the default"),
            },
        },
        Case {
            name: "a metadata pin",
            request: json!({"metadata": {"scenario_id": "hop"}, "input": "x"}),
            expect: Expect::Started { scenario: "hop", how: "pin", warning: None },
        },
        Case {
            name: "an intent route nobody serves",
            request: json!({"intent": "astrology", "input": "x"}),
            expect: Expect::Started {
                scenario: "echo",
                how: "default",
                warning: Some("no scenario serves intent route `astrology`"),
            },
        },
        Case {
            name: "a kind the classifier takes",
            request: json!({"kind": "task", "input": "x"}),
            expect: Expect::Started { scenario: "hop", how: "classifier", warning: None },
        },
        Case {
            name: "a wave whose workers start programs, without a jail",
            request: json!({"scenario": "waver", "input": "{\"tasks\": [{\"id\": \"a\", \"title\": \"A\"}]}"}),
            expect: Expect::Refused {
                kind: "unavailable",
                says: "scenario `waver` starts workers of scenario `worker`, which runs programs, and the jail cannot be set up",
            },
        },
        Case {
            name: "a scenario that starts programs, without a jail",
            request: json!({"scenario": "builder", "input": "x"}),
            expect: Expect::Refused {
                kind: "unavailable",
                says: "scenario `builder` runs programs, and the jail cannot be set up",
            },
        },
        Case {
            name: "a cost cap that is no amount",
            request: json!({"scenario": "echo", "input": "x", "max_cost_usd": -1.0}),
            expect: Expect::Refused {
                kind: "invalid",
                says: "max_cost_usd must be a positive amount of US dollars, not -1",
            },
        },
        Case {
            name: "an idempotency key used twice",
            request: json!({"scenario": "echo", "input": "x", "idempotency_key": "job-7"}),
            expect: Expect::SameRun,
        },
    ]
}

/// What one start came to on one surface.
#[derive(Debug)]
enum Got {
    Run(String),
    Refused { kind: String, message: String },
}

/// A test directory: the scenarios, the configuration (`echo` is the default and the
/// fallback, `hop` the classifier of `task` jobs) and the script every model answers from.
struct Lab {
    dir: PathBuf,
    config: PathBuf,
    script: PathBuf,
}

impl Lab {
    fn new(name: &str) -> Lab {
        let dir = scratch(&format!("matrix-{name}"));
        let scenarios = dir.join("scenarios");
        std::fs::create_dir_all(&scenarios).unwrap();
        let files = [
            (
                "echo",
                "id: echo\nversion: 1\nintent_routes: [echo]\nlevels:\n  - id: say\n    kind: prompt\n    prompt: {inline: \"Say {{ input }}\"}\n    terminal: true\n",
            ),
            (
                "hop",
                "id: hop\nversion: 1\nintent_routes: [hop]\nlevels:\n  - id: route\n    kind: prompt\n    prompt: {inline: \"Route {{ input }}\"}\n    terminal: true\n",
            ),
            (
                "builder",
                "id: builder\nversion: 1\nlevels:\n  - id: write\n    kind: prompt\n    prompt: {inline: \"Write {{ input }}\"}\n  - id: check\n    kind: verifier\n    terminal: true\n    verifiers:\n      - {name: ok, uses: command, params: {argv: [\"true\"]}}\nedges:\n  - {from: write, to: check}\n",
            ),
            (
                "worker",
                "id: worker\nversion: 1\nlevels:\n  - id: work\n    kind: prompt\n    prompt: {inline: \"Work on {{ input }}\"}\n  - id: check\n    kind: verifier\n    terminal: true\n    verifiers:\n      - {name: ok, uses: command, params: {argv: [\"true\"]}}\nedges:\n  - {from: work, to: check}\n",
            ),
            (
                "waver",
                "id: waver\nversion: 1\nlevels:\n  - id: build\n    kind: wave\n    terminal: true\n    wave: {worker: worker, max_parallel: 1}\nedges:\n  - {from: build, to: __end__, when: \"wave.decision == 'complete'\"}\n  - {from: build, to: __fail__}\n",
            ),
        ];
        for (id, yaml) in files {
            std::fs::write(scenarios.join(format!("{id}.yaml")), yaml).unwrap();
        }
        let config = dir.join("baton.toml");
        std::fs::write(
            &config,
            "[selection]\ndefault = \"echo\"\nfallback = \"echo\"\nclassifier = \"hop\"\nclassify_kinds = [\"task\"]\n",
        )
        .unwrap();
        let script = dir.join("script.yaml");
        std::fs::write(
            &script,
            "scenarios:\n  echo:\n    levels:\n      say: [{text: 'echoed'}]\n  hop:\n    levels:\n      route: [{text: 'hopped'}]\n",
        )
        .unwrap();
        Lab { dir, config, script }
    }

    /// `baton` on this lab's scenarios, configuration and database `db`, without a jail.
    fn baton(&self, db: &Path) -> Command {
        let mut c = baton_command();
        c.arg("--scenarios")
            .arg(self.dir.join("scenarios"))
            .arg("--db")
            .arg(db)
            .arg("--config")
            .arg(&self.config)
            .current_dir(&self.dir)
            .env("BATON_BWRAP", self.dir.join("no-such-bwrap"));
        c
    }

    /// The `scenario_selected` and the start of run `run_id` in `db`, with its times, ids
    /// and the recorder left out: what every surface must record alike.
    fn selection(&self, db: &Path, run_id: &str) -> Value {
        let out = self.baton(db).args(["events", run_id, "--json"]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let events: Vec<Value> =
            text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let of = |kind: &str| events.iter().find(|e| e["kind"] == kind).map(|e| e["data"].clone());
        let started = of("scenario_started").expect("a run starts with scenario_started");
        json!({
            "scenario_id": started["scenario_id"],
            "input": started["input"],
            "metadata": started["metadata"],
            "selected": of("scenario_selected"),
        })
    }

    /// The jobs in `db` (their first runs).
    fn roots(&self, db: &Path) -> usize {
        if !db.exists() {
            return 0;
        }
        let out = self.baton(db).args(["runs", "--json"]).output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        v.as_array().map_or(0, |runs| runs.iter().filter(|r| r["parent_run_id"].is_null()).count())
    }
}

/// The CLI's flags for a request.
fn flags(request: &Value) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(s) = request["scenario"].as_str() {
        args.push(format!("--scenario={s}"));
    }
    if let Some(s) = request["intent"].as_str() {
        args.extend(["--intent".to_owned(), s.to_owned()]);
    }
    if let Some(s) = request["kind"].as_str() {
        args.extend(["--kind".to_owned(), s.to_owned()]);
    }
    for (k, v) in request["metadata"].as_object().into_iter().flatten() {
        args.extend(["--meta".to_owned(), format!("{k}={}", v.as_str().unwrap())]);
    }
    if let Some(usd) = request["max_cost_usd"].as_f64() {
        args.push(format!("--max-cost-usd={usd}"));
    }
    if let Some(key) = request["idempotency_key"].as_str() {
        args.extend(["--idempotency-key".to_owned(), key.to_owned()]);
    }
    args.extend(["--input".to_owned(), request["input"].as_str().unwrap().to_owned()]);
    args
}

/// A refusal on the CLI: the table gives every kind exit code 1, so the kind is not read
/// from the exit code; the words are the error line.
fn cli_outcome(out: &Output) -> Got {
    let stdout = text(&out.stdout);
    if out.status.code() == Some(1) && !stdout.contains("\"run_id\"") {
        let stderr = text(&out.stderr);
        let message = stderr
            .lines()
            .find_map(|l| l.strip_prefix("error: "))
            .unwrap_or_else(|| panic!("no error line: {stderr}"))
            .to_owned();
        return Got::Refused { kind: String::new(), message };
    }
    let v: Value = serde_json::Deserializer::from_str(&stdout)
        .into_iter::<Value>()
        .next()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("not JSON: {stdout}{}", text(&out.stderr)));
    Got::Run(v["run_id"].as_str().unwrap().to_owned())
}

/// `baton run … --json`, driven to its end by the command itself.
fn through_cli(lab: &Lab, db: &Path, request: &Value) -> Got {
    let out = lab
        .baton(db)
        .arg("run")
        .args(flags(request))
        .args(["--script", lab.script.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    cli_outcome(&out)
}

/// `baton run --queue … --json`; the runs it queued are driven by a `baton worker` after.
fn through_queue(lab: &Lab, db: &Path, request: &Value) -> Got {
    let out = lab
        .baton(db)
        .arg("run")
        .args(flags(request))
        .args(["--queue", "--script", lab.script.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    cli_outcome(&out)
}

/// `POST /runs` of a `baton serve` on this lab.
fn through_rest(served: &Served, request: &Value) -> Got {
    let r = http(&served.addr, "POST", "/runs", &[], Some(&request.to_string()));
    let v: Value = serde_json::from_str(&r.body).unwrap_or_else(|_| panic!("{r:?}"));
    if r.status == 201 || r.status == 200 {
        return Got::Run(v["run_id"].as_str().unwrap().to_owned());
    }
    let kind = v["type"].as_str().unwrap_or_default().rsplit('/').next().unwrap().to_owned();
    assert_eq!(u64::from(r.status), v["status"].as_u64().unwrap(), "{r:?}");
    Got::Refused { kind, message: v["detail"].as_str().unwrap().to_owned() }
}

/// A `baton mcp` on stdio, initialized.
struct Mcp {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    next_id: u64,
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Mcp {
    fn start(lab: &Lab, db: &Path) -> Mcp {
        let mut child = lab
            .baton(db)
            .args(["mcp", "--script", lab.script.to_str().unwrap()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(lab.dir.join("mcp.err")).unwrap())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut mcp = Mcp { child, stdin, lines, next_id: 1 };
        mcp.call(
            "initialize",
            &json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "matrix", "version": "1"}}),
        );
        mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        mcp
    }

    fn send(&mut self, message: &Value) {
        writeln!(self.stdin, "{message}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// A request's result (or its error), waiting up to a minute.
    fn call(&mut self, method: &str, params: &Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line =
                self.lines.recv_timeout(left).unwrap_or_else(|_| panic!("no answer to {method}"));
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("{line}"));
            if v["id"] == json!(id) {
                return v;
            }
        }
    }
}

/// MCP's `run_start` (not waiting for the run).
fn through_mcp(mcp: &mut Mcp, request: &Value) -> Got {
    let mut arguments: Map<String, Value> = request.as_object().unwrap().clone();
    arguments.insert("wait_s".to_owned(), json!(0));
    let v = mcp.call("tools/call", &json!({"name": "run_start", "arguments": arguments}));
    let result = &v["result"];
    assert!(v["error"].is_null(), "{v}");
    if result["isError"] == json!(true) {
        let problem = &result["_meta"]["baton/problem"];
        let kind = problem["type"].as_str().unwrap_or_default().rsplit('/').next().unwrap();
        let message = result["content"][0]["text"].as_str().unwrap().to_owned();
        return Got::Refused { kind: kind.to_owned(), message };
    }
    let run = result["structuredContent"]["run_id"].as_str();
    Got::Run(run.unwrap_or_else(|| panic!("no run in {v}")).to_owned())
}

#[test]
fn every_surface_starts_or_refuses_each_job_alike() {
    let lab = Lab::new("starts");
    let dbs: Vec<PathBuf> =
        ["cli", "queue", "rest", "mcp"].iter().map(|s| lab.dir.join(format!("{s}.db"))).collect();
    let served = super::serve::serve_with(
        &lab.dir,
        &dbs[2],
        &[
            "--no-auth",
            "--script",
            lab.script.to_str().unwrap(),
            "--config",
            lab.config.to_str().unwrap(),
        ],
        &[("BATON_BWRAP", lab.dir.join("no-such-bwrap").as_os_str())],
    );
    let mut mcp = Mcp::start(&lab, &dbs[3]);
    let mut queued = Vec::new();
    for case in cases() {
        let name = case.name;
        let mut got = vec![
            through_cli(&lab, &dbs[0], &case.request),
            through_queue(&lab, &dbs[1], &case.request),
            through_rest(&served, &case.request),
            through_mcp(&mut mcp, &case.request),
        ];
        match case.expect {
            Expect::Refused { kind, says } => {
                for (surface, g) in ["cli", "queue", "rest", "mcp"].iter().zip(&got) {
                    let Got::Refused { kind: k, message } = g else {
                        panic!("{name}: {surface} started a run: {g:?}");
                    };
                    assert!(message.contains(says), "{name}: {surface} says {message:?}");
                    // The CLI shows the kind by its exit code, which is 1 for every kind.
                    if !k.is_empty() {
                        assert_eq!(k, kind, "{name}: {surface}");
                    }
                }
                for (surface, db) in ["cli", "queue", "rest", "mcp"].iter().zip(&dbs) {
                    let made = queued.iter().filter(|(d, _)| d == db).count();
                    assert_eq!(lab.roots(db), made, "{name}: {surface} made a run");
                }
            }
            Expect::Started { scenario, how, warning } => {
                let selections: Vec<Value> = dbs
                    .iter()
                    .zip(&got)
                    .map(|(db, g)| {
                        let Got::Run(run) = g else { panic!("{name}: refused: {g:?}") };
                        queued.push((db.clone(), run.clone()));
                        lab.selection(db, run)
                    })
                    .collect();
                let first = &selections[0];
                assert_eq!(first["scenario_id"], scenario, "{name}: {first}");
                assert_eq!(first["selected"]["how"], how, "{name}: {first}");
                match warning {
                    Some(w) => assert!(
                        first["selected"]["warning"].as_str().is_some_and(|s| s.contains(w)),
                        "{name}: {first}"
                    ),
                    None => assert!(first["selected"]["warning"].is_null(), "{name}: {first}"),
                }
                for (surface, s) in ["queue", "rest", "mcp"].iter().zip(&selections[1..]) {
                    assert_eq!(s, first, "{name}: {surface} recorded another start");
                }
            }
            Expect::SameRun => {
                let again = [
                    through_cli(&lab, &dbs[0], &case.request),
                    through_queue(&lab, &dbs[1], &case.request),
                    through_rest(&served, &case.request),
                    through_mcp(&mut mcp, &case.request),
                ];
                for (surface, (first, second)) in
                    ["cli", "queue", "rest", "mcp"].iter().zip(got.iter().zip(&again))
                {
                    let (Got::Run(a), Got::Run(b)) = (first, second) else {
                        panic!("{name}: {surface}: {first:?} then {second:?}");
                    };
                    assert_eq!(a, b, "{name}: {surface} started a second run");
                }
                for (db, g) in dbs.iter().zip(got.drain(..)) {
                    if let Got::Run(run) = g {
                        queued.push((db.clone(), run));
                    }
                }
            }
        }
    }
    // The queued runs are driven by a worker to the same ends as the others.
    let out = lab
        .baton(&dbs[1])
        .args(["worker", "--idle-exit-s", "1", "--script", lab.script.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let status = |db: &Path| -> Vec<String> {
        let out = lab.baton(db).args(["runs", "--json"]).output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut s: Vec<String> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                format!("{} {}", r["scenario_id"].as_str().unwrap(), r["status"].as_str().unwrap())
            })
            .collect();
        s.sort();
        s
    };
    assert_eq!(status(&dbs[1]), status(&dbs[0]), "the worker drove the queued runs alike");
    drop(mcp);
    drop(served);
    let _ = std::fs::remove_dir_all(&lab.dir);
}
