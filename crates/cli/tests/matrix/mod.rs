//! One matrix of job-start cases, run against every surface that starts jobs: `baton run`,
//! `baton run --queue` with `baton worker`, `POST /runs` of `baton serve`, and MCP's
//! `run_start` on `baton mcp`. Each case must come out the same everywhere — started with
//! the same selection (the `scenario_selected` a run records, compared whole), or refused
//! with the same kind (the application layer's table: the CLI's exit code, the HTTP status
//! and problem type, the problem type MCP's error result carries) and the same words —
//! because every surface starts jobs through the same code. Once every run has ended, each
//! job's tree — its runs, their scenarios and statuses, and every event with times, ids and
//! writers masked — must be the same on all four. Later start rules add their cases here,
//! not as tests of one surface.
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
    /// A run of `scenario`, chosen `how`, with a warning that says `warning` (or none); the
    /// job then goes as `then` says.
    Started { scenario: &'static str, how: &'static str, warning: Option<&'static str>, then: Then },
    /// Refused with the problem type `kind` (the URI's last segment), saying `says`.
    Refused { kind: &'static str, says: &'static str },
    /// The same run both times (an idempotency key used twice): no second run.
    SameRun,
}

/// Who starts a job: every surface acts for tenant `acme` (a `--tenant` flag, an operator
/// token of the tenant, a `baton mcp --tenant`), and for `globex` where a case says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    Acme,
    Globex,
}

impl Who {
    fn tenant(self) -> &'static str {
        match self {
            Who::Acme => "acme",
            Who::Globex => "globex",
        }
    }
}

/// One job start: who asks, its request in the API's words (the CLI's flags are derived
/// from it), how it must come out.
struct Case {
    name: &'static str,
    who: Who,
    request: Value,
    expect: Expect,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "an unknown explicit scenario",
            who: Who::Acme,
            request: json!({"scenario": "ecoh", "input": "x"}),
            expect: Expect::Refused {
                kind: "not-found",
                says: "no scenario `ecoh`; did you mean `echo`? (known: builder, echo, hop, relay, waver, worker)",
            },
        },
        Case {
            name: "a scenario named by a path",
            who: Who::Acme,
            request: json!({"scenario": "../../etc/passwd", "input": "x"}),
            expect: Expect::Refused {
                kind: "invalid",
                says: "scenario \"../../etc/passwd\" is a path; name a scenario by its id",
            },
        },
        Case {
            name: "an empty scenario",
            who: Who::Acme,
            request: json!({"scenario": "", "input": "x"}),
            expect: Expect::Refused { kind: "invalid", says: "scenario is empty" },
        },
        Case {
            name: "a metadata pin that names nothing",
            who: Who::Acme,
            request: json!({"metadata": {"scenario_id": "nope"}, "input": "x"}),
            expect: Expect::Started {
                scenario: "echo",
                how: "default",
                warning: Some("no scenario `nope`; the job runs the default"),
                then: Then::Ends,
            },
        },
        Case {
            name: "a metadata pin",
            who: Who::Acme,
            request: json!({"metadata": {"scenario_id": "hop"}, "input": "x"}),
            expect: Expect::Started {
                scenario: "hop",
                how: "pin",
                warning: None,
                then: Then::Ends,
            },
        },
        Case {
            name: "an intent route nobody serves",
            who: Who::Acme,
            request: json!({"intent": "astrology", "input": "x"}),
            expect: Expect::Started {
                scenario: "echo",
                how: "default",
                warning: Some("no scenario serves intent route `astrology`"),
                then: Then::Ends,
            },
        },
        Case {
            name: "a kind the classifier takes",
            who: Who::Acme,
            request: json!({"kind": "task", "input": "x"}),
            expect: Expect::Started {
                scenario: "hop",
                how: "classifier",
                warning: None,
                then: Then::Chains("echo", "the classifier ended completed without a usable route"),
            },
        },
        Case {
            name: "a classifier that fails",
            who: Who::Acme,
            request: json!({"kind": "task", "input": "broken"}),
            expect: Expect::Started {
                scenario: "hop",
                how: "classifier",
                warning: None,
                then: Then::Chains(
                    "echo",
                    "the classifier ended failed without a usable route (model call failed (scripted): the classifier's provider refused the call",
                ),
            },
        },
        Case {
            name: "a wave whose workers start programs, without a jail",
            who: Who::Acme,
            request: json!({"scenario": "waver", "input": "{\"tasks\": [{\"id\": \"a\", \"title\": \"A\"}]}"}),
            expect: Expect::Refused {
                kind: "unavailable",
                says: "scenario `waver` starts workers of scenario `worker`, which runs programs, and the jail cannot be set up",
            },
        },
        Case {
            name: "a chain to a scenario that starts programs, without a jail",
            who: Who::Acme,
            request: json!({"scenario": "relay", "input": "x"}),
            expect: Expect::Started {
                scenario: "relay",
                how: "pin",
                warning: None,
                then: Then::ChainRefused(
                    "the chain to scenario `builder` was refused: scenario `builder` runs programs, and the jail cannot be set up",
                ),
            },
        },
        Case {
            name: "a scenario that starts programs, without a jail",
            who: Who::Acme,
            request: json!({"scenario": "builder", "input": "x"}),
            expect: Expect::Refused {
                kind: "unavailable",
                says: "scenario `builder` runs programs, and the jail cannot be set up",
            },
        },
        Case {
            name: "a cost cap that is no amount",
            who: Who::Acme,
            request: json!({"scenario": "echo", "input": "x", "max_cost_usd": -1.0}),
            expect: Expect::Refused {
                kind: "invalid",
                says: "max_cost_usd must be a positive amount of US dollars, not -1",
            },
        },
        Case {
            name: "an idempotency key used twice",
            who: Who::Acme,
            request: json!({"scenario": "echo", "input": "x", "idempotency_key": "job-7"}),
            expect: Expect::SameRun,
        },
        Case {
            name: "the same idempotency key with another body",
            who: Who::Acme,
            request: json!({"scenario": "echo", "input": "y", "idempotency_key": "job-7"}),
            expect: Expect::Refused {
                kind: "key-reused",
                says: "started with another request; send that request again to get its run",
            },
        },
        Case {
            name: "the same idempotency key from another tenant",
            who: Who::Globex,
            request: json!({"scenario": "echo", "input": "x", "idempotency_key": "job-7"}),
            expect: Expect::Started {
                scenario: "echo",
                how: "pin",
                warning: None,
                then: Then::Ends,
            },
        },
        Case {
            name: "a new idempotency key while the tenant holds its most",
            who: Who::Acme,
            request: json!({"scenario": "echo", "input": "x", "idempotency_key": "job-8"}),
            expect: Expect::Refused {
                kind: "over-limit",
                says: "this tenant's jobs hold 1 idempotency keys, the most `[jobs] idempotency_keys_max` allows",
            },
        },
        Case {
            name: "an input larger than a job takes",
            who: Who::Acme,
            request: json!({"scenario": "echo", "input": "x".repeat(4 * 1024 * 1024 + 1)}),
            expect: Expect::Refused { kind: "invalid", says: "larger than 4 MiB" },
        },
    ]
}

/// The largest request the server and MCP take here: past the largest input a job takes,
/// so that the job's own limit is what refuses a larger one on every surface.
const BODY_BYTES_MAX: usize = 16 * 1024 * 1024;

/// What a started job comes to.
#[derive(Clone, Copy, Debug)]
enum Then {
    /// Its first run is the whole job.
    Ends,
    /// It goes on in scenario `.0`, with a chain warning that says `.1`.
    Chains(&'static str, &'static str),
    /// Its chain is refused when decided: the first run alone, failed with a reason that
    /// says `.0`, and no child run.
    ChainRefused(&'static str),
}

/// What one start came to on one surface.
#[derive(Debug)]
enum Got {
    Run(String),
    Refused { kind: String, message: String },
}

/// A test directory: the scenarios, the configuration (`echo` is the default and the
/// fallback, `hop` the classifier of `task` jobs, one idempotency key a tenant) and the
/// script every model answers from.
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
                "relay",
                "id: relay\nversion: 1\nlevels:\n  - id: pass\n    kind: prompt\n    prompt: {inline: \"Pass {{ input }} on\"}\n    response: {json: {}}\n    terminal: true\n",
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
            "[selection]\ndefault = \"echo\"\nfallback = \"echo\"\nclassifier = \"hop\"\nclassify_kinds = [\"task\"]\n\n[jobs]\nidempotency_keys_max = 1\n",
        )
        .unwrap();
        let script = dir.join("script.yaml");
        std::fs::write(
            &script,
            "scenarios:\n  echo:\n    levels:\n      say: [{text: 'echoed'}]\n  relay:\n    levels:\n      pass: [{text: '{\"chosen_intent_route\": \"builder\"}'}]\n  hop:\n    cases:\n      - when: 'Route broken'\n        levels:\n          route: [{error: \"the classifier's provider refused the call\"}]\n    levels:\n      route: [{text: 'hopped'}]\n",
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

    /// The runs in `db`, once none is still going (waiting up to two minutes).
    fn settle(&self, db: &Path) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let out = self.baton(db).args(["runs", "--json"]).output().unwrap();
            let runs: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let going: Vec<&Value> = runs
                .iter()
                .filter(|r| {
                    !matches!(
                        r["status"].as_str(),
                        Some("completed" | "failed" | "aborted" | "cancelled")
                    )
                })
                .collect();
            if going.is_empty() {
                return runs;
            }
            assert!(Instant::now() < deadline, "{}: runs still going: {going:?}", db.display());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The runs of the job whose first run is `root`, in the order they were created, each
    /// with its scenario, status and events, [`masked`].
    fn job(&self, db: &Path, root: &str) -> Value {
        let mut tree: Vec<Value> = self
            .settle(db)
            .into_iter()
            .filter(|r| r["run_id"] == root || r["root_run_id"] == root)
            .collect();
        tree.sort_by_key(|r| (r["run_id"] != root, r["created_at"].as_str().map(str::to_owned)));
        let ids: Vec<(String, String)> = tree
            .iter()
            .enumerate()
            .map(|(i, r)| (r["run_id"].as_str().unwrap().to_owned(), format!("<run {i}>")))
            .collect();
        let runs = tree.iter().map(|r| {
            let run = r["run_id"].as_str().unwrap();
            let out = self.baton(db).args(["events", run, "--json"]).output().unwrap();
            assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
            let events: Vec<Value> =
                text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
            json!({
                "scenario_id": r["scenario_id"],
                "status": r["status"],
                "events": masked(&Value::Array(events), &ids),
            })
        });
        Value::Array(runs.collect())
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

/// The first run of a job started on each surface.
fn runs(got: &[Got]) -> Vec<String> {
    got.iter()
        .map(|g| match g {
            Got::Run(run) => run.clone(),
            Got::Refused { .. } => panic!("refused: {g:?}"),
        })
        .collect()
}

/// `value` with what differs between equal runs taken out: times and durations (`at`,
/// `…_at`, `…_ms`), who wrote an event (`by`), and run ids, named by their place in the
/// tree instead.
fn masked(value: &Value, ids: &[(String, String)]) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| {
                    !(*k == "at"
                        || *k == "by"
                        || *k == "process"
                        || k.ends_with("_at")
                        || k.ends_with("_ms"))
                })
                .map(|(k, v)| (k.clone(), masked(v, ids)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(|v| masked(v, ids)).collect()),
        Value::String(s) => Value::String(
            ids.iter().fold(s.clone(), |s, (id, label)| s.replace(id.as_str(), label)),
        ),
        other => other.clone(),
    }
}

/// The CLI's flags for a request: an input longer than a command line takes goes in a file.
fn flags(lab: &Lab, request: &Value) -> Vec<String> {
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
    let input = request["input"].as_str().unwrap();
    if input.len() > 64 * 1024 {
        let file = lab.dir.join("input.txt");
        std::fs::write(&file, input).unwrap();
        args.extend(["--input-file".to_owned(), file.display().to_string()]);
    } else {
        args.extend(["--input".to_owned(), input.to_owned()]);
    }
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
fn through_cli(lab: &Lab, db: &Path, who: Who, request: &Value) -> Got {
    let out = lab
        .baton(db)
        .arg("run")
        .args(["--tenant", who.tenant()])
        .args(flags(lab, request))
        .args(["--script", lab.script.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    cli_outcome(&out)
}

/// `baton run --queue … --json`; the runs it queued are driven by a `baton worker` after.
fn through_queue(lab: &Lab, db: &Path, who: Who, request: &Value) -> Got {
    let out = lab
        .baton(db)
        .arg("run")
        .args(["--tenant", who.tenant()])
        .args(flags(lab, request))
        .args(["--queue", "--script", lab.script.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    cli_outcome(&out)
}

/// `POST /runs` of a `baton serve` on this lab, with the operator token of its tenant.
fn through_rest(served: &Served, token: &str, request: &Value) -> Got {
    let bearer = format!("Bearer {token}");
    let auth = [("authorization", bearer.as_str())];
    let r = http(&served.addr, "POST", "/runs", &auth, Some(&request.to_string()));
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
    fn start(lab: &Lab, db: &Path, who: Who) -> Mcp {
        let mut child = lab
            .baton(db)
            .args(["mcp", "--tenant", who.tenant(), "--script", lab.script.to_str().unwrap()])
            .args(["--message-max-bytes", &BODY_BYTES_MAX.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(
                std::fs::File::create(lab.dir.join(format!("mcp-{}.err", who.tenant()))).unwrap(),
            )
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
    let token = |who: Who| {
        let out = lab
            .baton(&dbs[2])
            .args(["token", "create", "--tenant", who.tenant(), "--role", "operator"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        text(&out.stdout).trim().to_owned()
    };
    let tokens = [token(Who::Acme), token(Who::Globex)];
    let served = super::serve::serve_with(
        &lab.dir,
        &dbs[2],
        &[
            "--script",
            lab.script.to_str().unwrap(),
            "--config",
            lab.config.to_str().unwrap(),
            "--body-max-bytes",
            &BODY_BYTES_MAX.to_string(),
        ],
        &[("BATON_BWRAP", lab.dir.join("no-such-bwrap").as_os_str())],
    );
    let mut mcps = [Mcp::start(&lab, &dbs[3], Who::Acme), Mcp::start(&lab, &dbs[3], Who::Globex)];
    let mut queued = Vec::new();
    // Each job started, with the chain it must make, by its first run on each surface.
    let mut jobs: Vec<(&str, Then, Vec<String>)> = Vec::new();
    for case in cases() {
        let (name, who) = (case.name, case.who);
        let n = usize::from(who == Who::Globex);
        let mut start = |request: &Value| {
            vec![
                through_cli(&lab, &dbs[0], who, request),
                through_queue(&lab, &dbs[1], who, request),
                through_rest(&served, &tokens[n], request),
                through_mcp(&mut mcps[n], request),
            ]
        };
        let mut got = start(&case.request);
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
            Expect::Started { scenario, how, warning, then } => {
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
                jobs.push((name, then, runs(&got)));
            }
            Expect::SameRun => {
                let again = start(&case.request);
                for (surface, (first, second)) in
                    ["cli", "queue", "rest", "mcp"].iter().zip(got.iter().zip(&again))
                {
                    let (Got::Run(a), Got::Run(b)) = (first, second) else {
                        panic!("{name}: {surface}: {first:?} then {second:?}");
                    };
                    assert_eq!(a, b, "{name}: {surface} started a second run");
                }
                jobs.push((name, Then::Ends, runs(&got)));
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
    // Every job, driven by whichever process drove it, came to the same end with the same
    // events on every surface: the runs of its tree, their scenarios and statuses, and each
    // run's events with times, ids and who wrote them masked.
    for db in &dbs {
        lab.settle(db);
    }
    for (name, then, roots) in &jobs {
        let trees: Vec<Value> = dbs.iter().zip(roots).map(|(db, root)| lab.job(db, root)).collect();
        for (surface, tree) in ["queue", "rest", "mcp"].iter().zip(&trees[1..]) {
            assert_eq!(tree, &trees[0], "{name}: {surface} came to another end");
        }
        let runs = trees[0].as_array().unwrap();
        match then {
            Then::Chains(scenario, says) => {
                assert_eq!(runs.len(), 2, "{name}: {}", trees[0]);
                assert_eq!(runs[1]["scenario_id"], *scenario, "{name}");
                let chained = runs[0]["events"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|e| e["kind"] == "scenario_chained")
                    .unwrap_or_else(|| panic!("{name}: no scenario_chained"));
                let warning = chained["data"]["warning"].as_str().unwrap_or_default();
                assert!(warning.contains(says), "{name}: {warning}");
            }
            Then::Ends => assert_eq!(runs.len(), 1, "{name}: {}", trees[0]),
            Then::ChainRefused(says) => {
                assert_eq!(runs.len(), 1, "{name}: no child run: {}", trees[0]);
                assert_eq!(runs[0]["status"], "failed", "{name}");
                let events = runs[0]["events"].as_array().unwrap();
                let end = events.iter().find(|e| e["kind"] == "scenario_finished").unwrap();
                let reason = end["data"]["aborted_reason"].as_str().unwrap_or_default();
                assert!(reason.contains(says), "{name}: {reason}");
                let calls = events.iter().filter(|e| e["kind"] == "model_response").count();
                assert_eq!(calls, 1, "{name}: no model is told of the refusal");
            }
        }
    }
    drop(mcps);
    drop(served);
    let _ = std::fs::remove_dir_all(&lab.dir);
}
