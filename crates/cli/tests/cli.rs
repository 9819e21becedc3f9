//! The `baton` binary end to end: exit codes, output formats, error rendering.

#![allow(clippy::unwrap_used)]

mod cancels;
mod chain;
mod crashes;
mod faults;
mod handoff;
mod jail;
mod matrix;
mod mcp;
mod own_tools;
mod pinning;
mod postgres;
mod queues;
mod reads;
mod replay;
mod routing;
mod serve;
mod service;
mod steering;
mod timeouts;
mod trees;
mod untrusted;
mod waves;
mod webhooks;

use std::path::PathBuf;
use std::process::{Command, Output};

pub(crate) fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn baton(args: &[&str]) -> Output {
    baton_command().args(args).output().unwrap()
}

/// `baton`, run from the repository, with the machine's provider keys and configuration
/// out of its reach: they must not leak into the tests.
pub(crate) fn baton_command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_baton"));
    c.current_dir(repo())
        .env("BATON_BWRAP", bwrap())
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("BATON_CONFIG");
    c
}

/// [`baton_command`] on a test's own directory `dir`: its `scenarios/`, the database `db`,
/// run from `dir`.
fn baton_in(dir: &std::path::Path, db: &std::path::Path) -> Command {
    let mut c = baton_command();
    c.arg("--scenarios").arg(dir.join("scenarios")).arg("--db").arg(db).current_dir(dir);
    c
}

/// The bubblewrap `scripts/install-jail` puts beside the checkout: the jail of every run.
fn bwrap() -> PathBuf {
    repo().join(".peers/bubblewrap/usr/bin/bwrap")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn validate_accepts_the_bundled_scenarios() {
    let out = baton(&["validate"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        text(&out.stdout).contains("ok: 11 scenarios valid, 0 warnings"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn validate_rejects_a_malformed_file_naming_file_line_and_column() {
    let out =
        baton(&["validate", "crates/scenario/tests/malformed/unknown_level_field_promt.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("error[unknown-field]: unknown field `promt`"), "{err}");
    assert!(err.contains("unknown_level_field_promt.yaml:"), "{err}");
    assert!(err.contains("did you mean `prompt`?"), "{err}");
}

#[test]
fn validate_prints_json_for_machines() {
    let out = baton(&[
        "validate",
        "--format",
        "json",
        "crates/scenario/tests/malformed/edge_dangling_to.yaml",
        "scenarios",
    ]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(out.status.code(), Some(1));
    let first = &report["diagnostics"][0];
    assert_eq!(first["severity"], "error");
    assert!(first["line"].as_u64().unwrap() > 0);

    let out = baton(&["validate", "--format", "json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], true);
    assert_eq!(report["scenarios"].as_array().unwrap().len(), 11);
    assert_eq!(report["scenarios"][0]["checksum"].as_str().unwrap().len(), 64);
}

#[test]
fn validate_checks_tenant_overrides() {
    let dir = std::env::temp_dir().join(format!("baton-cli-overrides-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("acme")).unwrap();
    std::fs::write(dir.join("acme/quick_qa.yaml"), "budget:\n  max_cost_usd: 0.01\n").unwrap();
    let ok = baton(&["validate", "--overrides", dir.to_str().unwrap()]);
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stderr));
    std::fs::write(dir.join("acme/quick_qa.yaml"), "budget:\n  max_cost: 0.01\n").unwrap();
    let bad = baton(&["validate", "--overrides", dir.to_str().unwrap()]);
    assert_eq!(bad.status.code(), Some(1));
    let err = text(&bad.stderr);
    assert!(err.contains("tenant `acme`") && err.contains("unknown field `max_cost`"), "{err}");
    assert!(err.contains("acme/quick_qa.yaml:2:3"), "{err}");
    // An override directly in DIR has no tenant: an error, not silence.
    std::fs::write(dir.join("acme/quick_qa.yaml"), "budget:\n  max_cost_usd: 0.01\n").unwrap();
    std::fs::write(dir.join("quick_qa.yaml"), "budget:\n  max_cost_usd: 0.01\n").unwrap();
    let stray = baton(&["validate", "--overrides", dir.to_str().unwrap()]);
    assert_eq!(stray.status.code(), Some(1), "{}", text(&stray.stderr));
    let err = text(&stray.stderr);
    assert!(
        err.contains("error[override-not-in-tenant]") && err.contains("quick_qa.yaml"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn graph_draws_mermaid_and_dot() {
    let out = baton(&["graph", "code_build"]);
    assert_eq!(out.status.code(), Some(0));
    let m = text(&out.stdout);
    assert!(
        m.starts_with("flowchart TD")
            && m.contains("l3_build_verify -->|\"verifier.build.passed\"| l3_accept"),
        "{m}"
    );
    let out = baton(&["graph", "scenarios/quick_qa.yaml", "--format", "dot"]);
    assert!(text(&out.stdout).starts_with("digraph \"quick_qa\""));
    let out = baton(&["graph", "no_such_scenario"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no scenario `no_such_scenario`"));
}

#[test]
fn schema_is_json_schema() {
    let out = baton(&["schema"]);
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(schema["title"], "Baton scenario");
    assert!(schema["properties"]["levels"].is_object());
}

#[test]
fn expr_evaluates_and_explains() {
    let state = std::env::temp_dir().join(format!("baton-cli-state-{}.json", std::process::id()));
    std::fs::write(&state, r#"{"verdict": "PASS", "escalate_now": false}"#).unwrap();
    let out =
        baton(&["expr", "verdict == 'PASS' && !escalate_now", "--state", state.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let o = text(&out.stdout);
    assert!(
        o.contains("value: true") && o.contains("fires: yes") && o.contains("verdict = \"PASS\""),
        "{o}"
    );

    let out = baton(&[
        "expr",
        "verifier.biuld.passed",
        "--scenario",
        "code_build",
        "--from",
        "l3_build_verify",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let e = text(&out.stderr);
    assert!(
        e.contains("no verifier `biuld`")
            && e.contains("did you mean `build`?")
            && e.contains("^^^^"),
        "{e}"
    );

    let out = baton(&["expr", "verdict = 'PASS'"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("`=` is not an operator"));
    let _ = std::fs::remove_file(state);
}

fn baton_db(db: &std::path::Path, args: &[&str]) -> Output {
    let mut all = vec!["--db", db.to_str().unwrap()];
    all.extend_from_slice(args);
    baton(&all)
}

#[test]
fn run_pauses_for_approval_and_a_second_process_resumes_it() {
    let db = std::env::temp_dir().join(format!("baton-cli-run-{}/runs.db", std::process::id()));
    let out = baton_db(
        &db,
        &[
            "run",
            "release_notes",
            "--script",
            "scenarios/scripts/release_notes.yaml",
            "--input",
            "PR 1: CSV export",
        ],
    );
    assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
    let o = text(&out.stdout);
    assert!(o.contains("gate      review → draft") && o.contains("approval  sign_off"), "{o}");
    let run = o.lines().find_map(|l| l.strip_prefix("run ")).unwrap().to_owned();

    let runs = baton_db(&db, &["runs", "--status", "paused", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&runs.stdout).unwrap();
    assert_eq!(list[0]["run_id"], run.as_str());

    let out = baton_db(&db, &["approve", &run, "--by", "ann"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("finished  completed"));
    let again = baton_db(&db, &["approve", &run]);
    assert_eq!(again.status.code(), Some(1));
    assert!(text(&again.stderr).contains("the run has ended (completed)"));

    let events = baton_db(&db, &["events", &run, "--json"]);
    let lines: Vec<serde_json::Value> =
        text(&events.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[0]["seq"], 1);
    assert_eq!(lines[0]["kind"], "scenario_started");
    assert_eq!(lines.last().unwrap()["kind"], "scenario_finished");
    // Following a finished run prints its whole log and stops at its end.
    let followed = baton_db(&db, &["events", &run, "--follow"]);
    assert_eq!(followed.status.code(), Some(0));
    let f = text(&followed.stdout);
    assert!(f.starts_with("#1 ") && f.trim_end().ends_with("levels"), "{f}");
    assert!(!f.contains("\x1b["), "no colour when stdout is not a terminal");
    let _ = std::fs::remove_dir_all(db.parent().unwrap());
}

#[test]
fn rejection_and_cancel_of_a_paused_run() {
    let db = std::env::temp_dir().join(format!("baton-cli-cancel-{}/runs.db", std::process::id()));
    let out = baton_db(
        &db,
        &[
            "run",
            "release_notes",
            "--script",
            "scenarios/scripts/release_notes.yaml",
            "--input",
            "x",
        ],
    );
    let run = text(&out.stdout).lines().find_map(|l| l.strip_prefix("run ")).unwrap().to_owned();
    let out = baton_db(&db, &["approve", &run, "--reject", "--comment", "tone it down"]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "a rejection sends the run back to the draft and to a new sign-off"
    );
    let out = baton_db(&db, &["cancel", &run]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = baton_db(&db, &["resume", &run, "--json"]);
    assert_eq!(out.status.code(), Some(5));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "cancelled");
    let _ = std::fs::remove_dir_all(db.parent().unwrap());
}

#[test]
fn run_without_a_model_says_what_to_do() {
    let db = std::env::temp_dir().join(format!("baton-cli-nomodel-{}/runs.db", std::process::id()));
    let out = baton_db(&db, &["run", "release_notes", "--input", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("pass --script FILE"), "{}", text(&out.stderr));
    let out = baton_db(
        &db,
        &["run", "code_build", "--input", "x", "--script", "scenarios/scripts/release_notes.yaml"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains("the script has no response for level `l1_brief`"),
        "{}",
        text(&out.stdout)
    );
    let _ = std::fs::remove_dir_all(db.parent().unwrap());
}

/// Drives a run to its end from new processes, approving approvals and answering questions.
fn drive_to_end(db: &std::path::Path, run: &str) {
    for _ in 0..30 {
        let out = baton_db(db, &["resume", run]);
        match out.status.code() {
            Some(0 | 1 | 4 | 5) => return,
            Some(3) => {
                let approved = baton_db(db, &["approve", run, "--by", "tester", "--no-resume"]);
                if approved.status.code() != Some(0) {
                    let answered =
                        baton_db(db, &["answer", run, "--answer", "\"yes\"", "--no-resume"]);
                    assert_eq!(answered.status.code(), Some(0), "{}", text(&answered.stderr));
                }
            }
            other => panic!("resume exited {other:?}: {}{}", text(&out.stdout), text(&out.stderr)),
        }
    }
    panic!("run {run} did not end");
}

/// Takes out of an event (as `baton events --json` prints it) what differs between two runs
/// that did the same thing: times and durations, workspace paths and snapshot ids (git
/// commits, which carry their time) and a chained run's id (derived from its parent's, new
/// in each database).
pub(crate) fn scrub(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            for key in [
                "at",
                "duration_ms",
                "total_duration_ms",
                "waiting_ms",
                "dir",
                "base",
                "snapshot",
                "child_run_id",
            ] {
                map.remove(key);
            }
            map.values_mut().for_each(scrub);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(scrub),
        _ => {}
    }
}

/// A run's log as JSON lines, without times and durations.
fn normalised_log(db: &std::path::Path, run: &str) -> Vec<serde_json::Value> {
    let out = baton_db(db, &["events", run, "--json"]);
    let log = text(&out.stdout)
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            scrub(&mut v);
            v
        })
        .collect();
    without_takeovers(log)
}

/// Whether an event (as `baton events --json` prints it) records a takeover: the pause of
/// a lost driver, the resumption by the process that took the run over, or the stale lock
/// of the lost driver's git that it removed.
pub(crate) fn is_takeover(e: &serde_json::Value) -> bool {
    (e["kind"] == "run_paused" && e["data"]["reason"] == "driver_lost")
        || e["kind"] == "run_taken_over"
        || (e["kind"] == "run_resumed" && e["data"]["by"] == "takeover")
        // The lost driver's git died with it, holding the snapshot repository's lock.
        || (e["kind"] == "warning"
            && e["data"]["message"].as_str().is_some_and(|m| m.starts_with("removed the stale lock")))
}

/// A log without its takeovers (what a kill adds to it), nor the numbers they shift
/// (`seq`, `resumes`) or the process that resumed.
pub(crate) fn without_takeovers(log: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    log.into_iter()
        .filter(|e| !is_takeover(e))
        .map(|mut e| {
            if let Some(map) = e.as_object_mut() {
                map.remove("seq");
            }
            if let Some(data) = e.get_mut("data").and_then(serde_json::Value::as_object_mut) {
                data.remove("resumes");
                data.remove("process");
            }
            e
        })
        .collect()
}

/// How many times a run was taken over from a lost driver.
fn takeovers(db: &std::path::Path, run: &str) -> usize {
    let out = baton_db(db, &["events", run, "--json"]);
    text(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["kind"] == "run_resumed" && e["data"]["by"] == "takeover")
        .count()
}

/// The database's one job: its first run (a chained job's children hang below it).
fn only_run(db: &std::path::Path) -> Option<String> {
    let out = baton_db(db, &["runs", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let root = list.as_array()?.iter().find(|r| r.get("parent_run_id").is_none())?;
    root["run_id"].as_str().map(str::to_owned)
}

/// Kill the process right after event N is durable, for every N, resume from a new
/// process, and compare the final log with one from a run that was never killed.
#[test]
fn killed_after_any_event_a_run_resumes_to_the_same_log() {
    let scenarios = [
        "release_notes",
        "security_review",
        "document_writing",
        "research_brief",
        "parallel_review_demo",
        "quick_qa",
        "intent_classifier",
        "code_build",
    ];
    let base = std::env::temp_dir().join(format!("baton-cli-crash-{}", std::process::id()));
    let mut takeovers_seen = 0;
    for scenario in scenarios {
        let script = format!("scenarios/scripts/{scenario}.yaml");
        let start = [
            "run",
            scenario,
            "--script",
            script.as_str(),
            "--input",
            "What is the capital of France?",
        ];
        let reference_db = base.join(format!("{scenario}-ref.db"));
        baton_db(&reference_db, &start);
        let run = only_run(&reference_db).unwrap();
        drive_to_end(&reference_db, &run);
        let reference = normalised_log(&reference_db, &run);
        assert_eq!(reference.last().unwrap()["kind"], "scenario_finished", "{scenario}");
        let mut kills = 0;
        for n in 1..=reference.len() {
            let db = base.join(format!("{scenario}-{n}.db"));
            let mut all = vec!["--db", db.to_str().unwrap()];
            all.extend_from_slice(&start);
            let killed = Command::new(env!("CARGO_BIN_EXE_baton"))
                .env("BATON_BWRAP", bwrap())
                .args(&all)
                .env("BATON_FAILPOINT_ABORT_AFTER_EVENT", n.to_string())
                .current_dir(repo())
                .output()
                .unwrap();
            // Killed by the failpoint: no exit code, only a signal.
            kills += usize::from(killed.status.code().is_none());
            let Some(run) = only_run(&db) else {
                panic!("{scenario}: no run after a kill at {n}: {}", text(&killed.stderr));
            };
            drive_to_end(&db, &run);
            let log = normalised_log(&db, &run);
            assert_eq!(
                log, reference,
                "{scenario}: killed after event {n}, the resumed log differs"
            );
            // A kill is one lost driver at most, and a takeover only after a kill.
            let taken = takeovers(&db, &run);
            assert!(taken <= usize::from(killed.status.code().is_none()), "{scenario}: {n}");
            takeovers_seen += taken;
        }
        assert!(kills > 3, "{scenario}: the failpoint killed the first process only {kills} times");
    }
    // A level commits with its results when it is quick: only the slower steps (a tool
    // loop, a fan-out, a verifier) leave one in flight at a kill.
    assert!(takeovers_seen > 0, "no kill left a level in flight");
    let _ = std::fs::remove_dir_all(base);
}

#[test]
fn validate_checks_model_constraints_against_the_configured_providers() {
    let dir = std::env::temp_dir().join(format!("baton-cli-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let paid_only = "[routing]\ndefault = \"paid:anthropic/claude-sonnet-4-5\"\n\n[[providers]]\nname = \"anthropic\"\nkind = \"anthropic\"\nbase_url = \"https://api.anthropic.com\"\napi_key_env = \"ANTHROPIC_API_KEY\"\ntier = \"paid\"\n[[providers.models]]\nname = \"claude-sonnet-4-5\"\ninput_usd_per_mtok = 3.0\noutput_usd_per_mtok = 15.0\n";
    let both = format!(
        "{paid_only}\n[[providers]]\nname = \"ollama\"\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:11434/v1\"\ntier = \"free\"\n[[providers.models]]\nname = \"llama3.1\"\n"
    );
    std::fs::write(dir.join("paid.toml"), paid_only).unwrap();
    std::fs::write(dir.join("both.toml"), both).unwrap();
    let out = baton(&["validate", "--config", dir.join("paid.toml").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(
            "error[unsatisfiable-model]: level `answer` of `quick_qa` wants allow [free:*]"
        ),
        "{err}"
    );
    let out = baton(&["validate", "--config", dir.join("both.toml").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    std::fs::write(dir.join("bad.toml"), "[[providers]]\nname = 1\n").unwrap();
    let out = baton(&["validate", "--config", dir.join("bad.toml").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("bad.toml"), "{}", text(&out.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

/// fakellm (installed by scripts/test) on a free port, killed when dropped.
struct Fakellm(std::process::Child, pub(crate) u16);

impl Drop for Fakellm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Fakellm {
    /// A `baton.toml` whose default model is this server's `fake-model` (priced).
    fn config(&self) -> String {
        format!(
            "[routing]\ndefault = \"free:local/fake-model\"\n\n[[providers]]\nname = \"local\"\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:{}/v1\"\ntier = \"free\"\n[[providers.models]]\nname = \"fake-model\"\ninput_usd_per_mtok = 0.5\noutput_usd_per_mtok = 1.0\n",
            self.1
        )
    }
}

pub(crate) fn fakellm(rules: &std::path::Path) -> Fakellm {
    let bin = repo().join(".peers/venv/bin/fakellm");
    assert!(
        bin.exists(),
        "fakellm is not installed at {}: run scripts/test, which installs it",
        bin.display()
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(bin)
        .args(["serve", "--host", "127.0.0.1", "--port", &port.to_string(), "--config"])
        .arg(rules)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "fakellm did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Fakellm(child, port)
}

#[test]
fn a_bundled_scenario_runs_against_a_local_openai_compatible_server_through_baton_toml() {
    let dir = std::env::temp_dir().join(format!("baton-cli-live-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("rules.yaml"),
        "version: 1\nrules:\n  - name: capital\n    when: {messages_contain: \"capital of France\"}\n    respond: {content: '{\"answer\": \"Paris\", \"confidence\": 0.95, \"sources\": []}'}\n",
    )
    .unwrap();
    let server = fakellm(&dir.join("rules.yaml"));
    std::fs::write(dir.join("baton.toml"), server.config()).unwrap();
    let db = dir.join("runs.db");
    let config = dir.join("baton.toml");
    let cassette = dir.join("live.json");
    let out = baton(&[
        "--db",
        db.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "run",
        "quick_qa",
        "--input",
        "What is the capital of France?",
        "--record",
        cassette.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "completed");
    let answer: serde_json::Value =
        serde_json::from_str(result["final_output"].as_str().unwrap()).unwrap();
    assert_eq!(answer["answer"], "Paris");
    assert!(result["totals"]["cost_usd"].as_f64().unwrap() > 0.0, "priced from baton.toml");
    let events = baton(&[
        "--db",
        db.to_str().unwrap(),
        "events",
        result["run_id"].as_str().unwrap(),
        "--json",
    ]);
    let response = text(&events.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["kind"] == "model_response")
        .unwrap();
    assert_eq!(
        (response["data"]["provider"].as_str(), response["data"]["model"].as_str()),
        (Some("local"), Some("fake-model"))
    );
    let routing = text(&events.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["kind"] == "routing_decision")
        .unwrap();
    assert_eq!(routing["data"], json_routing());
    // The same run replayed from its cassette, with the server gone: the same result.
    drop(server);
    let replayed = baton(&[
        "--db",
        db.to_str().unwrap(),
        "run",
        "quick_qa",
        "--input",
        "What is the capital of France?",
        "--cassette",
        cassette.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(replayed.status.code(), Some(0), "{}", text(&replayed.stderr));
    let replayed: serde_json::Value = serde_json::from_slice(&replayed.stdout).unwrap();
    for key in ["status", "final_output", "totals"] {
        assert_eq!(without_duration(&replayed[key]), without_duration(&result[key]), "{key}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_model_call_is_in_the_log_before_it_is_sent_with_its_hash_and_worst_case() {
    let dir = scratch("sent-first");
    // fakellm streams an answer a word every 10 ms: 200 words take two seconds.
    let words = vec!["very"; 200].join(" ");
    std::fs::write(
        dir.join("rules.yaml"),
        format!(
            "version: 1\nrules:\n  - name: capital\n    when: {{messages_contain: \"capital of France\"}}\n    respond: {{content: '{{\"answer\": \"Paris, {words} much\", \"confidence\": 0.95, \"sources\": []}}'}}\n"
        ),
    )
    .unwrap();
    let server = fakellm(&dir.join("rules.yaml"));
    std::fs::write(dir.join("baton.toml"), server.config()).unwrap();
    let db = dir.join("runs.db");
    let out = baton(&[
        "--db",
        db.to_str().unwrap(),
        "--config",
        dir.join("baton.toml").to_str().unwrap(),
        "run",
        "quick_qa",
        "--input",
        "What is the capital of France?",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let run = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let events = events_of(&db, &run);
    let of = |kind: &str| events.iter().find(|e| e["kind"] == kind).unwrap().clone();
    let (sent, answered) = (of("prompt_sent"), of("model_response"));
    let at = |e: &serde_json::Value| {
        chrono::DateTime::parse_from_rfc3339(e["at"].as_str().unwrap()).unwrap()
    };
    let took = at(&answered) - at(&sent);
    assert!(took.num_milliseconds() >= 1500, "sent at its send time, {took} before the answer");
    assert_eq!(sent["data"]["request_hash"], answered["data"]["request_hash"], "{sent}");
    let worst = sent["data"]["worst_case_usd"].as_f64().unwrap();
    assert!(worst >= answered["data"]["cost_usd"].as_f64().unwrap() && worst > 0.0, "{sent}");
    // And before the answer in the log.
    assert!(sent["seq"].as_u64() < answered["seq"].as_u64());
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_recorded_run_replays_from_its_cassette_and_any_run_exports_one() {
    let dir = std::env::temp_dir().join(format!("baton-cli-cassette-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (db, rec, exported) =
        (dir.join("runs.db"), dir.join("rec.json"), dir.join("exported.json"));
    let db = db.to_str().unwrap();
    let input = "What is the capital of France?";
    let first = baton(&[
        "--db",
        db,
        "run",
        "quick_qa",
        "--script",
        "scenarios/scripts/quick_qa.yaml",
        "--record",
        rec.to_str().unwrap(),
        "--input",
        input,
        "--json",
    ]);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    let first: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    let replay = |cassette: &std::path::Path| {
        let out = baton(&[
            "--db",
            db,
            "run",
            "quick_qa",
            "--cassette",
            cassette.to_str().unwrap(),
            "--input",
            input,
            "--json",
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let replayed = replay(&rec);
    for key in ["status", "final_output", "totals", "checksum"] {
        assert_eq!(without_duration(&replayed[key]), without_duration(&first[key]), "{key}");
    }
    let out = baton(&[
        "--db",
        db,
        "cassette",
        "export",
        first["run_id"].as_str().unwrap(),
        "--out",
        exported.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(replay(&exported)["final_output"], first["final_output"]);
    // A different request has no recording: a hard error with a diff of the request.
    let out = baton(&[
        "--db",
        db,
        "run",
        "quick_qa",
        "--cassette",
        rec.to_str().unwrap(),
        "--input",
        "What is the capital of Spain?",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let o = text(&out.stdout) + &text(&out.stderr);
    assert!(
        o.contains("no recording for level `answer`")
            && o.contains("-What is the capital of France?")
            && o.contains("+What is the capital of Spain?"),
        "{o}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A result's value with its wall-clock duration removed (it differs between runs).
fn without_duration(v: &serde_json::Value) -> serde_json::Value {
    let mut v = v.clone();
    if let Some(map) = v.as_object_mut() {
        map.remove("duration_ms");
    }
    v
}

fn json_routing() -> serde_json::Value {
    serde_json::json!({"tier": "free", "provider": "local", "model": "fake-model", "source": "allow", "failovers": []})
}

/// The snapshot repository of `workspace`, under `snapshots/` beside the database in `dir`.
fn snapshot_repo(dir: &std::path::Path, workspace: &std::path::Path) -> PathBuf {
    let canonical = std::fs::canonicalize(workspace).unwrap();
    dir.join("snapshots").join(baton_workspace::snapshot_key(&canonical)).join("git")
}

/// Runs code_build on a script; returns the run's JSON result and its workspace.
fn code_build(dir: &std::path::Path, script: &str, extra: &[&str]) -> (serde_json::Value, PathBuf) {
    let db = dir.join("runs.db");
    let script = format!("scenarios/scripts/{script}.yaml");
    let mut args =
        vec!["run", "code_build", "--script", &script, "--input", "a greet CLI", "--json"];
    args.extend_from_slice(extra);
    let out = baton_db(&db, &args);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let run = result["run_id"].as_str().unwrap();
    let workspace = dir.join("workspaces").join(run);
    (result, workspace)
}

fn events_of(db: &std::path::Path, run: &str) -> Vec<serde_json::Value> {
    let out = baton_db(db, &["events", run, "--json"]);
    text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn python_greet(workspace: &std::path::Path, name: &str) -> String {
    let out = Command::new("python3")
        .args(["-m", "greet", name])
        .current_dir(workspace)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

#[test]
fn code_build_writes_a_real_program_that_the_real_toolchain_builds() {
    let dir = std::env::temp_dir().join(format!("baton-cli-cb-ok-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (result, workspace) = code_build(&dir, "code_build", &["--branch", "greet-cli"]);
    assert_eq!(result["status"], "completed");
    assert_eq!(python_greet(&workspace, "Ada"), "Hello, Ada!\n");
    let events = events_of(&dir.join("runs.db"), result["run_id"].as_str().unwrap());
    let created: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "file_created")
        .map(|e| e["data"]["path"].as_str().unwrap())
        .collect();
    assert_eq!(created, ["pyproject.toml", "greet/__init__.py", "greet/__main__.py"]);
    let l4 = events
        .iter()
        .find(|e| e["kind"] == "level_finished" && e["level_id"] == "l4_execute")
        .unwrap();
    assert_eq!(
        l4["data"]["touched_paths"],
        serde_json::json!(["greet/__init__.py", "greet/__main__.py", "pyproject.toml"])
    );
    // The reviewer reads paths and the summary, not file bodies.
    let review =
        events.iter().find(|e| e["kind"] == "prompt_sent" && e["level_id"] == "l3_accept").unwrap();
    let prompt = review["data"]["prompt"].as_str().unwrap();
    assert!(prompt.contains("- greet/__main__.py") && !prompt.contains("sys.argv"), "{prompt}");
    // The completed run's result is on the branch it asked for.
    let log = Command::new("git")
        .arg("--git-dir")
        .arg(snapshot_repo(&dir, &workspace))
        .args(["log", "--format=%s", "greet-cli"])
        .current_dir(&workspace)
        .output()
        .unwrap();
    assert!(text(&log.stdout).starts_with("baton: l4_execute attempt 1"), "{}", text(&log.stdout));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_failed_build_feeds_its_errors_to_the_next_attempt_which_fixes_the_file() {
    let dir = std::env::temp_dir().join(format!("baton-cli-cb-fix-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (result, workspace) = code_build(&dir, "code_build_fix", &[]);
    assert_eq!(result["status"], "completed");
    assert_eq!(python_greet(&workspace, "Bo"), "Hello, Bo!\n");
    let events = events_of(&dir.join("runs.db"), result["run_id"].as_str().unwrap());
    let builds: Vec<bool> = events
        .iter()
        .filter(|e| e["kind"] == "verifier_finished")
        .map(|e| e["data"]["passed"].as_bool().unwrap())
        .collect();
    assert_eq!(builds, [false, true]);
    let second = events
        .iter()
        .find(|e| e["kind"] == "prompt_sent" && e["level_id"] == "l4_execute" && e["attempt"] == 2)
        .unwrap();
    let prompt = second["data"]["prompt"].as_str().unwrap();
    assert!(prompt.contains("SyntaxError") && prompt.contains("def broken(:"), "{prompt}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_build_that_keeps_failing_escalates_to_the_team_lead() {
    let dir = std::env::temp_dir().join(format!("baton-cli-cb-esc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (result, workspace) = code_build(&dir, "code_build_escalate", &[]);
    assert_eq!(result["status"], "completed");
    assert!(result["final_output"].as_str().unwrap().starts_with("Escalated:"), "{result}");
    assert_eq!(python_greet(&workspace, "Cy"), "Hello, Cy!\n");
    let events = events_of(&dir.join("runs.db"), result["run_id"].as_str().unwrap());
    let gates: Vec<String> = events
        .iter()
        .filter(|e| e["kind"] == "gate_decision" && e["data"]["source"] == "l3_build_verify")
        .map(|e| e["data"]["target"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(gates, ["l4_execute", "l4_execute", "l2_escalate"]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_recorded_code_build_replays_from_its_cassette_into_a_new_workspace() {
    let dir = std::env::temp_dir().join(format!("baton-cli-cb-tape-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let tape = dir.join("code_build.json");
    std::fs::create_dir_all(&dir).unwrap();
    let (first, _) = code_build(&dir, "code_build_fix", &["--record", tape.to_str().unwrap()]);
    let db = dir.join("runs.db");
    let out = baton_db(
        &db,
        &[
            "run",
            "code_build",
            "--cassette",
            tape.to_str().unwrap(),
            "--input",
            "a greet CLI",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let replayed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in ["status", "final_output", "totals"] {
        assert_eq!(without_duration(&replayed[key]), without_duration(&first[key]), "{key}");
    }
    let workspace = dir.join("workspaces").join(replayed["run_id"].as_str().unwrap());
    assert_eq!(python_greet(&workspace, "Di"), "Hello, Di!\n");
    let kinds = |run: &str| -> Vec<String> {
        events_of(&db, run).iter().map(|e| e["kind"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(
        kinds(replayed["run_id"].as_str().unwrap()),
        kinds(first["run_id"].as_str().unwrap())
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Starts code_build in the background on a script whose executor waits 20 s before it
/// calls `finish`, and returns once its files are in the workspace. The caller waits for
/// the child (after cancelling or killing it).
fn code_build_mid_level(dir: &std::path::Path) -> (std::process::Child, String, PathBuf) {
    code_build_mid_level_writing(dir, "")
}

/// [`code_build_mid_level`], the executor writing `extra` (tool calls, YAML) first.
#[allow(clippy::zombie_processes)]
fn code_build_mid_level_writing(
    dir: &std::path::Path,
    extra: &str,
) -> (std::process::Child, String, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let script = with_first_writes(
        &std::fs::read_to_string(repo().join("scenarios/scripts/code_build.yaml"))
            .unwrap()
            .replace(
                "    - tool_calls:\n        - name: finish",
                "    - delay_ms: 20000\n      tool_calls:\n        - name: finish",
            ),
        extra,
    );
    assert!(script.contains("delay_ms: 20000"));
    let script_path = dir.join("slow.yaml");
    std::fs::write(&script_path, script).unwrap();
    let db = dir.join("runs.db");
    let mut child = Command::new(env!("CARGO_BIN_EXE_baton"))
        .env("BATON_BWRAP", bwrap())
        .args(["--db", db.to_str().unwrap(), "run", "code_build", "--input", "a greet CLI"])
        .args(["--script", script_path.to_str().unwrap()])
        .current_dir(repo())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    loop {
        if let Some(run) = only_run(&db) {
            let workspace = dir.join("workspaces").join(&run);
            if workspace.join("greet/__main__.py").is_file() {
                return (child, run, workspace);
            }
        }
        if started.elapsed().as_secs() > 30 {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the executor never wrote its files");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_cancelled_run_discards_its_work_back_to_the_workspace_before_the_run() {
    let dir = std::env::temp_dir().join(format!("baton-cli-cb-cancel-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (mut child, run, workspace) = code_build_mid_level(&dir);
    // A second driver is refused while the first one drives the run.
    let out = baton_db(&dir.join("runs.db"), &["resume", &run]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("is being driven by another process"),
        "{}",
        text(&out.stderr)
    );
    let out = baton_db(&dir.join("runs.db"), &["cancel", &run]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(5), "a cancelled run exits 5");
    let left: Vec<String> = std::fs::read_dir(&workspace)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "the run's files are gone, and Baton left nothing: {left:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_run_killed_mid_level_resumes_from_the_last_snapshot_without_half_applied_edits() {
    let dir = std::env::temp_dir().join(format!("baton-cli-cb-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (mut child, run, workspace) = code_build_mid_level(&dir);
    child.kill().unwrap();
    child.wait().unwrap();
    // What the killed level left behind, and more of the same kind.
    std::fs::write(workspace.join("stray.txt"), "half-applied").unwrap();
    let db = dir.join("runs.db");
    let out = baton_db(&db, &["resume", &run, "--script", "scenarios/scripts/code_build.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!workspace.join("stray.txt").exists(), "the level restarted from its snapshot");
    assert_eq!(python_greet(&workspace, "Ed"), "Hello, Ed!\n");
    let events = events_of(&db, &run);
    let l4_finished = events
        .iter()
        .filter(|e| e["kind"] == "level_finished" && e["level_id"] == "l4_execute")
        .count();
    assert_eq!(l4_finished, 1);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_model_without_tool_calling_drives_the_tools_through_the_textual_protocol() {
    let dir = std::env::temp_dir().join(format!("baton-cli-textual-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let scenarios = dir.join("scenarios");
    std::fs::create_dir_all(scenarios.join("prompts")).unwrap();
    std::fs::create_dir_all(scenarios.join("seeds/hello")).unwrap();
    std::fs::write(scenarios.join("seeds/hello/hello.txt"), "Hello, world\n").unwrap();
    std::fs::write(scenarios.join("prompts/work.j2"), "Greet {{ input }} in hello.txt.\n").unwrap();
    std::fs::write(
        scenarios.join("seeded.yaml"),
        r#"id: seeded
version: 1
workspace: {seed: seeds/hello}
levels:
  - id: work
    kind: tool_loop
    prompt: prompts/work.j2
    model: {allow: ["paid:anthropic/*"], fallback_outside_allow: true}
    terminal: true
"#,
    )
    .unwrap();
    let block = |name: &str, arguments: serde_json::Value| {
        format!("```tool\n{}\n```\n", serde_json::json!({"name": name, "arguments": arguments}))
    };
    let turn1 = block("read_file", serde_json::json!({"path": "../../../../etc/passwd"}))
        + &block("read_file", serde_json::json!({"path": "hello.txt"}));
    let turn2 = "Changing it now.\n".to_owned()
        + &block(
            "edit_file",
            serde_json::json!({"path": "hello.txt", "old_string": "world", "new_string": "Baton"}),
        )
        + &block("finish", serde_json::json!({"summary": "greeting changed"}));
    let script = serde_json::json!({"levels": {"work": [
        {"error": "this model has no tool calling"},
        {"text": turn1},
        {"text": turn2},
    ]}});
    std::fs::write(dir.join("script.yaml"), script.to_string()).unwrap();
    let db = dir.join("runs.db");
    let out = baton(&[
        "--db",
        db.to_str().unwrap(),
        "--scenarios",
        scenarios.to_str().unwrap(),
        "run",
        "seeded",
        "--input",
        "Baton",
        "--script",
        dir.join("script.yaml").to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["final_output"], "greeting changed");
    let run = result["run_id"].as_str().unwrap();
    let workspace = dir.join("workspaces").join(run);
    assert_eq!(std::fs::read_to_string(workspace.join("hello.txt")).unwrap(), "Hello, Baton\n");
    let events = events_of(&db, run);
    assert!(events.iter().any(|e| e["kind"] == "warning"
        && e["data"]["message"].as_str().unwrap().contains("textual tool protocol")));
    let results: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["kind"] == "tool_result").map(|e| &e["data"]).collect();
    assert_eq!(results.len(), 4, "{results:?}");
    assert_eq!(results[0]["is_error"], true, "the escape is refused: {}", results[0]);
    assert!(!results[0]["content"].as_str().unwrap().contains("root:"));
    assert_eq!(results[1]["content"], "Hello, world\n");
    assert_eq!(results[2]["is_error"], false, "{}", results[2]);
    // The native call's prompt, then the textual protocol's.
    let prompt = events.iter().rfind(|e| e["kind"] == "prompt_sent").unwrap()["data"]["prompt"]
        .as_str()
        .unwrap();
    assert!(prompt.contains("```tool") && prompt.starts_with("Greet Baton"), "{prompt}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn code_build_strict_passes_the_real_type_checker_linter_and_the_architecture_judge() {
    let dir = std::env::temp_dir().join(format!("baton-cli-cb-strict-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let db = dir.join("runs.db");
    // The typecheck and lint presets run `python3 -m mypy` and `python3 -m pyflakes`:
    // the venv scripts/test installs them in comes first on PATH.
    let venv = repo().join(".peers/venv/bin");
    assert!(venv.join("mypy").exists(), "run scripts/test, which installs mypy and pyflakes");
    let path = format!("{}:{}", venv.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(env!("CARGO_BIN_EXE_baton"))
        .env("BATON_BWRAP", bwrap())
        .args(["--db", db.to_str().unwrap(), "run", "code_build_strict", "--json"])
        .args(["--script", "scenarios/scripts/code_build_strict.yaml", "--input", "a greet CLI"])
        .env("PATH", path)
        .current_dir(repo())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let events = events_of(&db, result["run_id"].as_str().unwrap());
    let verifiers: Vec<(String, bool)> = events
        .iter()
        .filter(|e| e["kind"] == "verifier_finished")
        .map(|e| (e["data"]["name"].as_str().unwrap().to_owned(), e["data"]["passed"] == true))
        .collect();
    let expected = [("build", true), ("typecheck", true), ("lint", true), ("architecture", true)];
    assert_eq!(verifiers, expected.map(|(n, p)| (n.to_owned(), p)));
    let judge = events
        .iter()
        .find(|e| e["kind"] == "verifier_finished" && e["data"]["name"] == "architecture")
        .unwrap();
    assert!(judge["data"]["score"].as_f64().unwrap() >= 0.7, "{judge}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn security_review_scans_a_project_with_the_real_scanners_and_never_repeats_a_secret() {
    let dir = std::env::temp_dir().join(format!("baton-cli-secrev-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let project = dir.join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(
        project.join("app.py"),
        "import sys\n\nuser_input = sys.argv[1]\nprint(eval(user_input))\n",
    )
    .unwrap();
    // Built at run time, so that no file of this repository holds a key-shaped string.
    let key = format!("AKIA{}", "Q3EGRTZB7XKPW4NM");
    std::fs::write(project.join("config.py"), format!("AWS_ACCESS_KEY_ID = \"{key}\"\n")).unwrap();
    let (semgrep, gitleaks) = (
        repo().join(".peers/semgrep/bin/semgrep"),
        repo().join(".peers/gitleaks/usr/bin/gitleaks"),
    );
    assert!(semgrep.exists() && gitleaks.exists(), "run scripts/install-scanners");
    let db = dir.join("runs.db");
    let scenarios = repo().join("scenarios");
    let baton_in_project = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_baton"))
            .env("BATON_BWRAP", bwrap())
            .args(["--db", db.to_str().unwrap(), "--scenarios", scenarios.to_str().unwrap()])
            .args(args)
            .env("BATON_SEMGREP", &semgrep)
            .env("BATON_GITLEAKS", &gitleaks)
            .current_dir(&project)
            .output()
            .unwrap()
    };
    let script = scenarios.join("scripts/security_review.yaml");
    // The scanners check the workspace the run names, not the directory baton runs in.
    let out = baton_in_project(&[
        "run",
        "security_review",
        "--input",
        "review this service",
        "--script",
        script.to_str().unwrap(),
        "--workspace",
        project.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
    let run = only_run(&db).unwrap();
    let out = baton_in_project(&["approve", &run, "--by", "lead"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let events = events_of(&db, &run);
    let reasons = |name: &str| -> String {
        events
            .iter()
            .find(|e| e["kind"] == "verifier_finished" && e["data"]["name"] == name)
            .map(|e| e["data"]["reasons"].to_string())
            .unwrap()
    };
    let semgrep_reasons = reasons("semgrep");
    assert!(semgrep_reasons.contains("app.py:4: [ERROR] python-eval-exec"), "{semgrep_reasons}");
    let gitleaks_reasons = reasons("gitleaks");
    assert!(gitleaks_reasons.contains("config.py:1"), "{gitleaks_reasons}");
    // The report's author reads the findings.
    let report =
        events.iter().find(|e| e["kind"] == "prompt_sent" && e["level_id"] == "report").unwrap();
    assert!(report["data"]["prompt"].as_str().unwrap().contains("python-eval-exec"));
    let whole_log = text(&baton_db(&db, &["events", &run, "--json"]).stdout);
    assert!(!whole_log.contains(&key) && !whole_log.contains("Q3EGRTZB7XKPW4NM"));
    let _ = std::fs::remove_dir_all(dir);
}

/// A durable bench figure comes with what it stood on: the store's durability setting and
/// the disk's fsync floor, measured in the same run beside the database.
/// `bench --workload resume`: decided runs are continued by a fresh store and engine
/// over the same database, every one to its end (the bench fails on any other end).
#[test]
fn the_resume_bench_continues_every_decided_run_from_a_fresh_store() {
    let dir = scratch("bench-resume");
    let db = dir.join("bench.db");
    let out = baton(&[
        "bench",
        "--workload",
        "resume",
        "--store",
        "sqlite",
        "--bench-db",
        db.to_str().unwrap(),
        "--runs",
        "12",
        "--concurrency",
        "4",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["runs"], 12, "{report}");
    assert!(report["resumed_runs_per_s"].as_f64().unwrap() > 0.0, "{report}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_sqlite_bench_prints_the_disks_fsync_floor_beside_its_figures() {
    let dir = scratch("bench-floor");
    let db = dir.join("bench.db");
    let out = baton(&[
        "bench",
        "--workload",
        "linear5",
        "--store",
        "sqlite",
        "--bench-db",
        db.to_str().unwrap(),
        "--runs",
        "20",
        "--concurrency",
        "4",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["sqlite_synchronous"], "FULL", "{report}");
    let (p50, p99) = (
        report["fsync_floor_p50_ms"].as_f64().unwrap(),
        report["fsync_floor_p99_ms"].as_f64().unwrap(),
    );
    assert!(p50 > 0.0 && p99 >= p50, "{report}");
    assert!(report["levels_per_s"].as_f64().unwrap() > 0.0);
    // CPU to the nanosecond, the loop's and the whole process's.
    let (in_loop, whole) = (
        report["cpu_us_per_level"].as_f64().unwrap(),
        report["process_cpu_us_per_level"].as_f64().unwrap(),
    );
    assert!(in_loop > 0.0 && whole >= in_loop, "{report}");
    assert!((0.0..=1.0).contains(&report["process_system_share"].as_f64().unwrap()));
    // The probe file is gone.
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("fsync-probe"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A fresh directory for one test, empty.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("baton-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Starts release_notes on its script; it pauses for the sign-off. Returns the run id.
fn paused_release_notes(db: &std::path::Path) -> String {
    let out = baton_db(
        db,
        &[
            "run",
            "release_notes",
            "--script",
            "scenarios/scripts/release_notes.yaml",
            "--input",
            "PR 1: CSV export",
        ],
    );
    assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout).lines().find_map(|l| l.strip_prefix("run ")).unwrap().to_owned()
}

#[test]
fn runs_shows_cost_tokens_duration_and_the_level_a_paused_run_waits_on() {
    let dir = scratch("runs-list");
    let db = dir.join("runs.db");
    let run = paused_release_notes(&db);
    let out = baton_db(&db, &["runs"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let o = text(&out.stdout);
    let header = o.lines().next().unwrap();
    for column in ["run", "status", "scenario", "cost", "tokens", "duration", "waits on"] {
        assert!(header.contains(column), "{o}");
    }
    let line = o.lines().find(|l| l.starts_with(&run)).unwrap();
    // Two drafts and two reviews: $0.0017 and 850 tokens, from the script.
    assert!(line.contains("paused") && line.contains("$0.0017") && line.contains(" 850 "), "{o}");
    assert!(line.trim_end().ends_with("sign_off (approval)"), "{o}");
    assert!(line.contains(" ms ") || line.contains(" s "), "a duration: {o}");

    let out = baton_db(&db, &["runs", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = &list[0];
    assert_eq!(row["run_id"], run.as_str());
    assert!((row["cost_usd"].as_f64().unwrap() - 0.0017).abs() < 1e-9, "{row}");
    assert_eq!(row["tokens"], 850);
    assert!(row["duration_ms"].is_u64(), "{row}");
    assert_eq!(row["waiting_on"], serde_json::json!([{"level_id": "sign_off", "for": "approval"}]));

    // Once decided, the run waits on nothing.
    let out = baton_db(&db, &["approve", &run, "--by", "ann"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = baton_db(&db, &["runs", "--json", "--status", "completed"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list[0]["waiting_on"], serde_json::json!([]));
    assert!(list[0]["tokens"].as_u64().unwrap() > 850);

    // A status that does not exist is an error naming the ones that do, not "no runs".
    let out = baton_db(&db, &["runs", "--status", "bogus"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("invalid value 'bogus'"), "{err}");
    assert!(
        err.contains(
            "running, paused, waiting, interrupted, completed, aborted, cancelled, failed"
        ),
        "{err}"
    );
    assert!(!text(&out.stdout).contains("no runs"));
    let out = baton_db(&db, &["runs", "--status", "failed"]);
    assert_eq!(text(&out.stdout).trim(), "no runs with status failed");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn cancel_records_its_reason_and_events_show_it() {
    let dir = scratch("cancel-reason");
    let db = dir.join("runs.db");
    let run = paused_release_notes(&db);
    let out = baton_db(&db, &["cancel", &run, "--reason", ""]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--reason is empty"), "{}", text(&out.stderr));
    let out = baton_db(&db, &["cancel", &run, "--by", "ann", "--reason", "wrong PR list"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&format!("cancelled run {run}")), "{}", text(&out.stdout));
    let events = events_of(&db, &run);
    let cancel = events.iter().find(|e| e["kind"] == "cancel_requested").unwrap();
    assert_eq!(cancel["data"], serde_json::json!({"by": "ann", "reason": "wrong PR list"}));
    assert_eq!(events.last().unwrap()["data"]["status"], "cancelled");
    let timeline = text(&baton_db(&db, &["events", &run]).stdout);
    assert!(timeline.contains("cancel    requested by ann: wrong PR list"), "{timeline}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn cancel_runs_and_events_work_without_the_scenarios_directory() {
    let dir = scratch("no-scenarios");
    let db = dir.join("runs.db");
    let run = paused_release_notes(&db);
    // A scenarios directory that does not load, and one that does not exist.
    let broken = dir.join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("bad.yaml"), "id: [unclosed\n").unwrap();
    for scenarios in [broken.clone(), dir.join("missing")] {
        let s = scenarios.to_str().unwrap();
        let out = baton_db(&db, &["--scenarios", s, "runs"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let out = baton_db(&db, &["--scenarios", s, "events", &run]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
    let out = baton_db(&db, &["--scenarios", broken.to_str().unwrap(), "cancel", &run]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&format!("cancelled run {run}")));
    let out =
        baton_db(&db, &["--scenarios", dir.join("missing").to_str().unwrap(), "runs", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list[0]["status"], "cancelled");
    let events = events_of(&db, &run);
    let ends: Vec<&str> =
        events.iter().rev().take(2).map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(ends, ["scenario_finished", "level_finished"], "the sign-off is closed as skipped");
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs baton with `--db DB` inside a mount namespace where DIR is a read-only bind mount,
/// or, where that is not possible, as an unprivileged user; `None` when neither can be
/// done on this machine. The tests run as root, which file modes do not stop.
fn baton_read_only(dir: &std::path::Path, args: &[&str]) -> Option<(Output, &'static str)> {
    let bin = env!("CARGO_BIN_EXE_baton");
    let mounted = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg("mount --bind -o ro \"$1\" \"$1\" && shift && exec \"$@\"")
        .arg("sh")
        .arg(dir)
        .arg(bin)
        .args(args)
        .current_dir(repo())
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .output();
    if let Ok(out) = mounted
        && !text(&out.stderr).contains("mount:")
        && !text(&out.stderr).contains("unshare:")
    {
        return Some((out, "Read-only file system"));
    }
    // A directory root owns and nobody else may write to, entered as `nobody`.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).ok()?;
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", bin])
        .args(args)
        .current_dir(repo())
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .output()
        .ok()?;
    (!text(&out.stderr).contains("setpriv:")).then_some((out, "Permission denied"))
}

#[test]
#[allow(clippy::print_stderr)]
fn read_only_commands_never_create_a_database_and_open_errors_say_why() {
    let dir = scratch("db-open");
    let typo = dir.join("typo/t.db");
    let t = typo.to_str().unwrap();
    for args in [
        vec!["runs"],
        vec!["events", "0190"],
        vec!["cassette", "export", "0190"],
        vec!["cancel", "0190"],
        vec!["resume", "0190"],
        vec!["approve", "0190"],
        vec!["answer", "0190", "--answer", "1"],
    ] {
        let out = baton_db(&typo, &args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!("no database at {t}; start a run first or pass --db")),
            "{args:?}: {err}"
        );
        assert!(!dir.join("typo").exists(), "{args:?} created {}", dir.join("typo").display());
    }
    let script = ["--script", "scenarios/scripts/quick_qa.yaml", "--input", "q"];
    // The database is a directory.
    let out = baton_db(&dir, &[&["run", "quick_qa"][..], &script].concat());
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("cannot open the database {}: it is a directory", dir.display())),
        "{err}"
    );
    // A parent that cannot be created: a file stands where a directory should be.
    std::fs::write(dir.join("file"), "").unwrap();
    let out = baton_db(&dir.join("file/sub/t.db"), &[&["run", "quick_qa"][..], &script].concat());
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains(&dir.join("file/sub").display().to_string()), "{err}");
    assert!(err.contains("Not a directory"), "{err}");
    // A read-only directory: for a new database, and for one that exists.
    let ro = dir.join("ro");
    std::fs::create_dir_all(&ro).unwrap();
    let existing = ro.join("existing.db");
    let out = baton_db(&existing, &[&["run", "quick_qa"][..], &script].concat());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for name in ["existing.db-wal", "existing.db-shm"] {
        let _ = std::fs::remove_file(ro.join(name));
    }
    let fresh = ro.join("new.db");
    let fresh_args = [&["--db", fresh.to_str().unwrap(), "run", "quick_qa"][..], &script].concat();
    let existing_args = ["--db", existing.to_str().unwrap(), "runs"];
    match baton_read_only(&ro, &fresh_args) {
        Some((out, reason)) => {
            assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
            let err = text(&out.stderr);
            assert!(
                err.contains(&format!("cannot open the database {}", fresh.display())),
                "{err}"
            );
            assert!(err.contains(&format!("cannot create files in {}", ro.display())), "{err}");
            assert!(err.contains(reason), "{err}");
            assert!(!err.contains("unable to open database file"), "{err}");
            let (out, reason) = baton_read_only(&ro, &existing_args).unwrap();
            assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
            let err = text(&out.stderr);
            assert!(
                err.contains(&format!("cannot open the database {}", existing.display()))
                    && err.contains(reason),
                "{err}"
            );
        }
        None => eprintln!("skipped: neither a read-only mount nor an unprivileged user here"),
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The lines of a timeline (`#SEQ …`) in some output.
fn timeline_lines(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| {
            l.strip_prefix('#').is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn run_and_approve_print_every_event_once() {
    let dir = scratch("printer");
    let db = dir.join("runs.db");
    let out = baton_db(
        &db,
        &[
            "run",
            "release_notes",
            "--script",
            "scenarios/scripts/release_notes.yaml",
            "--input",
            "x",
        ],
    );
    assert_eq!(out.status.code(), Some(3));
    let run = text(&out.stdout).lines().find_map(|l| l.strip_prefix("run ")).unwrap().to_owned();
    let printed = timeline_lines(&text(&out.stdout));
    let logged = timeline_lines(&text(&baton_db(&db, &["events", &run]).stdout));
    assert_eq!(printed, logged, "the run printed its whole log, once and in order");
    let out = baton_db(&db, &["approve", &run, "--by", "ann"]);
    assert_eq!(out.status.code(), Some(0));
    let printed = timeline_lines(&text(&out.stdout));
    let logged = timeline_lines(&text(&baton_db(&db, &["events", &run]).stdout));
    let tail = &logged[logged.len() - printed.len()..];
    assert_eq!(printed, tail, "approve printed the decision and everything after it");
    assert!(printed[0].contains("approved by ann"), "{printed:?}");
    assert!(printed.last().unwrap().contains("finished  completed"), "{printed:?}");

    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn run_stream_shows_model_text_as_it_arrives_and_escaped() {
    let dir = scratch("stream");
    let db = dir.join("runs.db");
    let args = ["run", "release_notes", "--script", "scenarios/scripts/release_notes.yaml"];
    let out = baton_db(&db, &[&args[..], &["--input", "x", "--stream"]].concat());
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let live: Vec<&str> = stdout.lines().filter(|l| l.trim_start().starts_with("⋯ ")).collect();
    assert!(live.iter().any(|l| l.contains("⋯ draft New: export to CSV.")), "{stdout}");
    // A newline of the model's text is shown as an escape, never as a raw line break.
    assert!(live.iter().any(|l| l.contains("⋯ review") && l.contains("\\n")), "{stdout}");
    let quiet = baton_db(&db, &[&args[..], &["--input", "x"]].concat());
    assert!(!text(&quiet.stdout).contains('⋯'), "without --stream, no live text");
    let _ = std::fs::remove_dir_all(dir);
}

/// The fenced ```toml blocks of a Markdown text.
fn toml_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_start()) {
            (None, l) if l.starts_with("```toml") => current = Some(String::new()),
            (Some(_), l) if l.starts_with("```") => blocks.extend(current.take()),
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn the_readme_documents_every_key_of_baton_toml_and_its_examples_parse() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let blocks = toml_blocks(&readme);
    assert!(blocks.len() >= 2, "a full example and a local server's: {blocks:?}");
    let mut local = false;
    for block in &blocks {
        let config = baton_providers::config::Config::parse(block, "README.md")
            .unwrap_or_else(|e| panic!("{e}\n{block}"));
        for p in &config.providers {
            if p.kind == baton_providers::config::Kind::Openai {
                assert!(p.base_url.trim_end_matches('/').ends_with("/v1"), "{}", p.base_url);
                local |= p.base_url.starts_with("http://127.0.0.1")
                    || p.base_url.starts_with("http://localhost");
            }
        }
    }
    assert!(local, "a worked example for a local server");
    let start = readme.find("## Configuring models").expect("a section on baton.toml");
    let section = &readme[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |n| n + 3)];
    for key in [
        "[routing]",
        "default",
        "[[providers]]",
        "name",
        "kind",
        "base_url",
        "api_key_env",
        "tier",
        "stream",
        "[[providers.models]]",
        "input_usd_per_mtok",
        "output_usd_per_mtok",
        "cached_input_usd_per_mtok",
        "max_tokens",
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "BATON_MODELS",
        "/v1",
        "Ollama",
        "llama.cpp",
        "vLLM",
        "[selection]",
        "fallback",
        "classifier",
        "classify_kinds",
        "[jobs]",
        "settle_timeout_s",
        "[waves]",
        "max_parallel",
        "[egress]",
        "allow_hosts",
        "allow_private",
        "[webhooks]",
        "first_backoff_s",
        "timeout_s",
    ] {
        assert!(section.contains(&format!("`{key}")) || section.contains(key), "{key}");
    }
    // What the README says the environment gives, the code gives.
    let env = baton_providers::config::Config::from_env(|k| match k {
        "OPENAI_BASE_URL" => Some("http://127.0.0.1:11434/v1".to_owned()),
        "BATON_MODELS" => Some("llama3.1, qwen2.5-coder".to_owned()),
        _ => None,
    });
    assert_eq!(env.routing.default.as_deref(), Some("free:local/llama3.1"));
    assert!(section.contains("free:local/llama3.1"), "the README names the default it gives");
}

#[test]
fn run_checks_every_levels_model_against_the_configuration_before_the_first_call() {
    let dir = scratch("run-models");
    let config = dir.join("local.toml");
    // Only a local OpenAI-compatible server (nothing listens there: no call may be made).
    std::fs::write(
        &config,
        "[routing]\ndefault = \"free:local/llama3.1\"\n\n[[providers]]\nname = \"local\"\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\ntier = \"free\"\n[[providers.models]]\nname = \"llama3.1\"\n",
    )
    .unwrap();
    let db = dir.join("runs.db");
    let c = config.to_str().unwrap();
    let out = baton_db(&db, &["--config", c, "run", "code_build", "--input", "a greet CLI"]);
    assert_eq!(out.status.code(), Some(1), "{}{}", text(&out.stdout), text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "scenario `code_build` cannot run with the models configured in {c}"
        )),
        "{err}"
    );
    assert!(err.contains("level `l4_execute` wants allow [paid:anthropic/*]"), "{err}");
    assert!(err.contains("level `l2_escalate` wants allow [paid:anthropic/*]"), "{err}");
    assert!(!err.contains("l1_brief") && !err.contains("l2_plan"), "{err}");
    assert!(!db.exists(), "no run was created");
    // The same from the environment alone.
    let out = Command::new(env!("CARGO_BIN_EXE_baton"))
        .env("BATON_BWRAP", bwrap())
        .args(["--db", db.to_str().unwrap(), "run", "code_build", "--input", "a greet CLI"])
        .current_dir(repo())
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("BATON_CONFIG")
        .env("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("configured in the environment") && err.contains("l4_execute"), "{err}");
    assert!(!db.exists(), "no run was created");
    // A script or a cassette answers every level: no provider is needed or checked.
    let out = baton_db(
        &db,
        &[
            "--config",
            c,
            "run",
            "release_notes",
            "--input",
            "x",
            "--script",
            "scenarios/scripts/release_notes.yaml",
        ],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bad_branch_and_record_arguments_are_refused_before_a_run_starts() {
    let dir = scratch("run-args");
    let db = dir.join("runs.db");
    let script = ["--script", "scenarios/scripts/code_build.yaml", "--input", "a greet CLI"];
    let out =
        baton_db(&db, &[&["run", "code_build", "--branch", "bad..name"][..], &script].concat());
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("--branch \"bad..name\" is not a valid branch name: it contains \"..\""),
        "{err}"
    );
    assert!(!db.exists() && !dir.join("workspaces").exists(), "no run was created");
    for bad in ["-x", "a b", "a.lock", "x/.hidden", "end.", "a@{1}", "@", "a//b", "/a"] {
        let flag = format!("--branch={bad}");
        let out = baton_db(&db, &[&["run", "code_build", flag.as_str()][..], &script].concat());
        assert_eq!(out.status.code(), Some(1), "{bad}");
        assert!(text(&out.stderr).contains("is not a valid branch name"), "{bad}");
    }
    // A scenario without a workspace has no result to name.
    let out = baton_db(
        &db,
        &[
            "run",
            "quick_qa",
            "--branch",
            "ok",
            "--script",
            "scenarios/scripts/quick_qa.yaml",
            "--input",
            "q",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("scenario `quick_qa` has no tool_loop level"));
    let missing = dir.join("missing/dir/c.json");
    let out = baton_db(
        &db,
        &[
            "run",
            "quick_qa",
            "--record",
            missing.to_str().unwrap(),
            "--script",
            "scenarios/scripts/quick_qa.yaml",
            "--input",
            "q",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "cannot record the cassette to {}: its directory {} cannot be used",
            missing.display(),
            dir.join("missing/dir").display()
        )),
        "{err}"
    );
    assert!(err.contains("No such file or directory") && !err.contains("c.tmp"), "{err}");
    assert!(!db.exists(), "no run was created");
    let out = baton_db(
        &db,
        &[
            "run",
            "quick_qa",
            "--record",
            dir.to_str().unwrap(),
            "--script",
            "scenarios/scripts/quick_qa.yaml",
            "--input",
            "q",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("it is a directory"), "{}", text(&out.stderr));
    assert!(!db.exists(), "no run was created");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_script_with_a_negative_or_non_finite_cost_or_negative_tokens_is_refused() {
    let dir = scratch("bad-script");
    let db = dir.join("runs.db");
    let cases = [
        (
            "levels:\n  answer:\n    - text: ok\n    - text: '{}'\n      cost_usd: -100\n",
            ":4:7: level `answer`, response 2: cost_usd must be a finite number of zero or more, not -100",
        ),
        (
            "default:\n  cost_usd: -0.5\n",
            ":2:3: the default response: cost_usd must be a finite number of zero or more, not -0.5",
        ),
        (
            "levels:\n  answer:\n    - text: ok\n      cost_usd: .inf\n",
            ":4:17: invalid YAML: non-finite float `.inf`",
        ),
        (
            "levels:\n  answer:\n    - text: ok\n      cost_usd: 1e999\n",
            ":4:17: invalid YAML: non-finite float `1e999`",
        ),
        (
            "levels:\n  answer:\n    - text: ok\n      usage: {input_tokens: -5, output_tokens: 1}\n",
            ":4:29: expected a whole number of zero or more, found the number -5",
        ),
    ];
    for (n, (script, expected)) in cases.iter().enumerate() {
        let file = dir.join(format!("script{n}.yaml"));
        std::fs::write(&file, script).unwrap();
        let out =
            baton_db(&db, &["run", "quick_qa", "--input", "q", "--script", file.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{script}");
        let err = text(&out.stderr);
        assert!(err.contains(&format!("{}{expected}", file.display())), "{script}\n{err}");
        assert!(!db.exists(), "no run was created");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn cancelling_a_run_whose_driver_died_ends_it_and_restores_its_workspace() {
    let dir = std::env::temp_dir().join(format!("baton-cli-cb-orphan-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (mut child, run, workspace) = code_build_mid_level(&dir);
    child.kill().unwrap();
    child.wait().unwrap();
    let db = dir.join("runs.db");
    let missing = dir.join("no-scenarios");
    let out = baton_db(
        &db,
        &["--scenarios", missing.to_str().unwrap(), "cancel", &run, "--reason", "driver died"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&format!("cancelled run {run}")), "{}", text(&out.stdout));
    let left: Vec<String> = std::fs::read_dir(&workspace)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "the run's files are gone: {left:?}");
    let events = events_of(&db, &run);
    assert_eq!(events.last().unwrap()["data"]["status"], "cancelled");
    let _ = std::fs::remove_dir_all(dir);
}

/// The test scenarios beside this file (not the bundled ones).
const TEST_SCENARIOS: &str = "crates/cli/tests/scenarios";

/// Starts a run of the fan-out with two approval branches; it pauses for both.
fn paused_fan_approvals(db: &std::path::Path) -> String {
    let out = baton_db(
        db,
        &[
            "--scenarios",
            TEST_SCENARIOS,
            "run",
            "fan_approvals",
            "--script",
            "crates/cli/tests/scenarios/scripts/fan_approvals.yaml",
            "--input",
            "v2",
        ],
    );
    assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
    let o = text(&out.stdout);
    assert!(
        o.contains("approval legal#1 (level `legal`, role counsel): Legal review of v2"),
        "{o}"
    );
    assert!(o.contains("--request security#1`"), "{o}");
    assert!(o.contains("done      lint PASS"), "the prompt branch ran: {o}");
    o.lines().find_map(|l| l.strip_prefix("run ")).unwrap().to_owned()
}

#[test]
fn approvals_per_branch_are_decided_by_request() {
    let dir = std::env::temp_dir().join(format!("baton-cli-branches-{}", std::process::id()));
    let db = dir.join("runs.db");
    let run = paused_fan_approvals(&db);
    let with = |args: &[&str]| {
        let mut all = vec!["--scenarios", TEST_SCENARIOS];
        all.extend_from_slice(args);
        baton_db(&db, &all)
    };

    let runs = text(&with(&["runs"]).stdout);
    assert!(runs.contains("waits for approval: legal#1, security#1"), "{runs}");
    let list: serde_json::Value =
        serde_json::from_slice(&with(&["runs", "--json"]).stdout).unwrap();
    assert_eq!(list[0]["pending_requests"], serde_json::json!(["legal#1", "security#1"]));

    // Two open requests and no --request: an error listing both; nothing is recorded.
    let out = with(&["approve", &run, "--by", "ann"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("2 approval requests are open; name one with --request ID"), "{err}");
    assert!(err.contains("legal#1 (level `legal`: Legal review of v2)"), "{err}");
    assert!(err.contains("security#1 (level `security`: Security review of v2: rate"), "{err}");
    let out = with(&["approve", &run, "--request", "nosuch#1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no approval request nosuch#1; open requests: legal#1"));

    let out = with(&["approve", &run, "--request", "legal#1", "--by", "ann"]);
    assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("approved request legal#1 of run"));
    let out = with(&["approve", &run, "--request", "legal#1", "--reject"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("approval request legal#1 was already decided"));
    let events = text(&with(&["events", &run]).stdout);
    assert!(events.contains("decided   legal#1 approved by ann"), "{events}");
    assert!(events.contains("waiting   approval security#1 (level `security`"), "{events}");
    assert!(!events.contains("waiting   approval legal#1"), "{events}");

    // One request left: the flag may be omitted, but its schema needs the approver's data.
    let out = with(&["approve", &run, "--by", "bob"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("\"risk\" is a required property"), "{err}");
    assert!(err.contains("give the approver's data with --data FILE.json"), "{err}");
    assert!(err.contains("nothing was recorded"), "{err}");

    // The data file: a directory, a device and a pipe are refused; so is data the schema
    // refuses, by JSON pointer; nothing is recorded for any of them.
    let fifo = dir.join("fifo.json");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    for bad in [dir.to_str().unwrap(), "/dev/null", fifo.to_str().unwrap()] {
        let out = with(&["approve", &run, "--data", bad]);
        assert_eq!(out.status.code(), Some(1), "{bad}");
        assert!(text(&out.stderr).contains("not a regular file"), "{}", text(&out.stderr));
    }
    let invalid = dir.join("invalid.json");
    std::fs::write(&invalid, r#"{"risk": "huge"}"#).unwrap();
    let out = with(&["approve", &run, "--data", invalid.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("/risk: \"huge\" is not one of"), "{err}");
    std::fs::write(&invalid, "{\"risk\": ").unwrap();
    let out = with(&["approve", &run, "--data", invalid.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("invalid.json:1:9: not JSON"), "{}", text(&out.stderr));
    let before = text(&with(&["events", &run, "--json"]).stdout).lines().count();

    let valid = dir.join("valid.json");
    std::fs::write(&valid, r#"{"risk": "low"}"#).unwrap();
    let out = with(&["approve", &run, "--data", valid.to_str().unwrap(), "--by", "bob"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let o = text(&out.stdout);
    assert!(o.contains("approved request security#1 of run"), "{o}");
    assert!(o.contains("gate      checks → ship"), "the gate read the data: {o}");
    assert!(o.contains("finished  completed"), "{o}");
    let log: Vec<serde_json::Value> = text(&with(&["events", &run, "--json"]).stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let decided = &log[before];
    assert_eq!(decided["kind"], "approval_decided", "the refusals recorded nothing");
    assert_eq!(decided["data"]["data"], serde_json::json!({"risk": "low"}));
    let ship = log.iter().find(|e| e["kind"] == "prompt_sent" && e["level_id"] == "ship").unwrap();
    assert_eq!(ship["data"]["prompt"], "Ship v2 at low risk");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_empty_approver_is_refused() {
    let dir = std::env::temp_dir().join(format!("baton-cli-emptyby-{}", std::process::id()));
    let db = dir.join("runs.db");
    let run = paused_fan_approvals(&db);
    for by in ["", "  \t"] {
        for command in ["approve", "cancel"] {
            let out = baton_db(&db, &[command, &run, "--by", by]);
            assert_eq!(out.status.code(), Some(2), "{command} --by {by:?}");
            let err = text(&out.stderr);
            assert!(err.contains("--by names who decides and must not be empty"), "{err}");
        }
    }
    let events = text(&baton_db(&db, &["events", &run, "--json"]).stdout);
    assert!(!events.contains("approval_decided") && !events.contains("cancel_requested"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_decision_is_recorded_where_the_scenarios_do_not_load() {
    let dir = std::env::temp_dir().join(format!("baton-cli-elsewhere-{}", std::process::id()));
    let db = dir.join("runs.db");
    let run = paused_fan_approvals(&db);
    // The default scenarios directory (the bundled one) has no `fan_approvals`; a missing
    // one does not load at all. Either way the decision is recorded, and the run continues
    // on the scenario version the store keeps for it: the first decision leaves it waiting
    // for the second (exit 3), the second ends it.
    let missing = dir.join("no-scenarios");
    for (scenarios, request, code) in
        [(missing.to_str().unwrap(), "legal#1", 3), ("scenarios", "security#1", 0)]
    {
        let data = dir.join("data.json");
        std::fs::write(&data, r#"{"risk": "high"}"#).unwrap();
        let out = baton_db(
            &db,
            &[
                "--scenarios",
                scenarios,
                "approve",
                &run,
                "--request",
                request,
                "--data",
                data.to_str().unwrap(),
            ],
        );
        assert_eq!(out.status.code(), Some(code), "{}{}", text(&out.stdout), text(&out.stderr));
        assert!(text(&out.stdout).contains(&format!("approved request {request} of run")));
        let err = text(&out.stderr);
        assert!(!err.contains("the run is not continued here"), "{err}");
    }
    let out = baton_db(&db, &["--scenarios", TEST_SCENARIOS, "resume", &run, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["final_output"], "stopped", "high risk takes the other edge");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_answer_is_recorded_where_the_scenarios_do_not_load() {
    let dir = std::env::temp_dir().join(format!("baton-cli-answer-{}", std::process::id()));
    let db = dir.join("runs.db");
    let out = baton_db(
        &db,
        &[
            "--scenarios",
            TEST_SCENARIOS,
            "run",
            "ask_once",
            "--script",
            "crates/cli/tests/scenarios/scripts/ask_once.yaml",
            "--input",
            "x",
        ],
    );
    assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
    let run = text(&out.stdout).lines().find_map(|l| l.strip_prefix("run ")).unwrap().to_owned();
    let missing = dir.join("no-scenarios");
    let out = baton_db(
        &db,
        &["--scenarios", missing.to_str().unwrap(), "answer", &run, "--answer", "\"b\""],
    );
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains(&format!("answered run {run}")));
    // The run continued on the scenario version the store keeps for it, and ended.
    assert!(text(&out.stdout).contains("finished  completed"), "{}", text(&out.stdout));
    assert!(!text(&out.stderr).contains("the run is not continued here"));
    let out = baton_db(&db, &["--scenarios", TEST_SCENARIOS, "resume", &run, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["final_output"], "{\"choice\": \"b\"}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The code_build script with `extra` (tool calls, YAML list items) run before the
/// executor's writes.
fn with_first_writes(script: &str, extra: &str) -> String {
    let first =
        "        - name: write_file\n          arguments:\n            path: pyproject.toml";
    assert!(script.contains(first));
    script.replacen(first, &format!("{extra}{first}"), 1)
}

/// A tool call writing `content` to `path`, as a script's list item.
fn write_call(path: &str, content: &str) -> String {
    format!(
        "        - name: write_file\n          arguments:\n            path: {path:?}\n            content: {content:?}\n"
    )
}

#[test]
fn attack_a_hostile_git_config_through_a_link_into_baton_is_refused() {
    let dir = std::env::temp_dir().join(format!("baton-cli-attack-git-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let workspace = dir.join("ws");
    // A user-supplied workspace already holding what an older Baton left and a link to it.
    std::fs::create_dir_all(workspace.join(".baton/git")).unwrap();
    std::fs::write(workspace.join(".baton/git/config"), "[core]\n").unwrap();
    std::os::unix::fs::symlink(".baton", workspace.join("b")).unwrap();
    let canary = dir.join("canary");
    let hostile = format!("[core]\n\tfsmonitor = touch {} #\n", canary.display());
    let extra = [
        write_call(".baton/git/config", &hostile),
        write_call("b/git/config", &hostile),
        write_call("b/git/hooks/post-checkout", "#!/bin/sh\ntouch /tmp/x\n"),
        // Control: the same content at an ordinary path is written.
        write_call("notes/config", &hostile),
    ]
    .concat();
    let script = with_first_writes(
        &std::fs::read_to_string(repo().join("scenarios/scripts/code_build.yaml")).unwrap(),
        &extra,
    );
    let script_path = dir.join("hostile.yaml");
    std::fs::write(&script_path, script).unwrap();
    let db = dir.join("runs.db");
    let out = baton_db(
        &db,
        &["run", "code_build", "--input", "x", "--json", "--branch", "result"]
            .into_iter()
            .chain(["--script", script_path.to_str().unwrap()])
            .chain(["--workspace", workspace.to_str().unwrap()])
            .collect::<Vec<_>>(),
    );
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "completed");
    let events = events_of(&db, result["run_id"].as_str().unwrap());
    let refused: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "tool_result" && e["data"]["is_error"] == true)
        .map(|e| e["data"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(refused.len(), 3, "{refused:?}");
    assert!(refused.iter().all(|r| r.contains(".baton")), "{refused:?}");
    // Canaries: the old repository is untouched, no hook exists, nothing ran.
    assert_eq!(std::fs::read_to_string(workspace.join(".baton/git/config")).unwrap(), "[core]\n");
    assert!(!workspace.join(".baton/git/hooks").exists());
    assert!(!canary.exists(), "the hostile config ran");
    // Control: the run's own work is done and the ordinary write happened.
    assert_eq!(std::fs::read_to_string(workspace.join("notes/config")).unwrap(), hostile);
    assert_eq!(python_greet(&workspace, "Ada"), "Hello, Ada!\n");
    // The snapshots are outside the workspace, in Baton's data directory.
    let log = Command::new("git")
        .arg("--git-dir")
        .arg(snapshot_repo(&dir, &workspace))
        .args(["log", "--format=%s", "result"])
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    assert!(text(&log.stdout).starts_with("baton: l4_execute"), "{}", text(&log.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn attack_a_gitignore_of_everything_does_not_survive_a_cancel() {
    let dir = std::env::temp_dir().join(format!("baton-cli-attack-ignore-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let extra = [
        write_call(".gitignore", "*\n"),
        write_call("planted/.gitignore", "*\n!.gitignore\n"),
        write_call("planted/payload.py", "print('still here')\n"),
    ]
    .concat();
    let (mut child, run, workspace) = code_build_mid_level_writing(&dir, &extra);
    assert!(workspace.join("planted/payload.py").is_file());
    let out = baton_db(&dir.join("runs.db"), &["cancel", &run]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(child.wait().unwrap().code(), Some(5), "a cancelled run exits 5");
    // Canary: nothing the model wrote is left, its ignore files included. The control is
    // a_cancelled_run_discards_its_work_back_to_the_workspace_before_the_run (same run
    // without the ignore files).
    let left: Vec<String> = std::fs::read_dir(&workspace)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "left after the cancel: {left:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Pairs of deciders raced on one request each in [`racing_deciders_decide_once`].
const RACING_PAIRS: usize = 20;

/// Starts a `baton` process that waits at the decision barrier in `barrier` once it has
/// read the run and found the request open.
fn racing_decider(
    db: &std::path::Path,
    barrier: &std::path::Path,
    args: &[&str],
) -> std::process::Child {
    baton_command()
        .arg("--db")
        .arg(db)
        .args(args)
        .env("BATON_TEST_DECISION_BARRIER", barrier)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn racing_deciders_decide_once() {
    let dir = std::env::temp_dir().join(format!("baton-cli-race-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    deciders_race(&dir.join("runs.db"), &dir, RACING_PAIRS);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Races `pairs` pairs of deciding processes on the store `db` (a SQLite file or a
/// PostgreSQL URL), one request each, their barriers in `dir`: each pair records one
/// decision, the winner's, and the loser is told who decided.
fn deciders_race(db: &std::path::Path, dir: &std::path::Path, pairs: usize) {
    let db = db.to_path_buf();
    for pair in 0..pairs {
        let out = baton_db(
            &db,
            &[
                "run",
                "release_notes",
                "--script",
                "scenarios/scripts/release_notes.yaml",
                "--input",
                "PR 1: CSV export",
            ],
        );
        assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
        let run =
            text(&out.stdout).lines().find_map(|l| l.strip_prefix("run ")).unwrap().to_owned();
        let barrier = dir.join(format!("barrier-{pair}"));
        std::fs::create_dir_all(&barrier).unwrap();
        let (first, second) = if pair % 2 == 0 { ("ann", "bob") } else { ("bob", "ann") };
        let approve = ["approve", &run, "--by", first, "--no-resume"];
        let reject = ["approve", &run, "--reject", "--by", second, "--no-resume"];
        let deciders =
            [racing_decider(&db, &barrier, &approve), racing_decider(&db, &barrier, &reject)];
        // Both read the log and found the request open before either may write.
        let started = std::time::Instant::now();
        loop {
            let loaded = std::fs::read_dir(&barrier)
                .unwrap()
                .filter(|e| {
                    e.as_ref().unwrap().file_name().to_string_lossy().starts_with("loaded.")
                })
                .count();
            if loaded == 2 {
                break;
            }
            assert!(
                started.elapsed().as_secs() < 60,
                "pair {pair}: {loaded} of 2 deciders loaded the run"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::fs::write(barrier.join("go"), b"").unwrap();
        let outs: Vec<Output> =
            deciders.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
        let codes: Vec<Option<i32>> = outs.iter().map(|o| o.status.code()).collect();
        let winner = match codes.as_slice() {
            [Some(0), Some(1)] => 0,
            [Some(1), Some(0)] => 1,
            _ => panic!(
                "pair {pair}: exactly one decider must win, exits {codes:?}: {}{}",
                text(&outs[0].stderr),
                text(&outs[1].stderr)
            ),
        };
        let name = if winner == 0 { first } else { second };
        let loser = text(&outs[1 - winner].stderr);
        assert!(
            loser.contains(&format!(
                "approval request sign_off#1 was already decided by {name} at "
            )),
            "pair {pair}: {loser}"
        );
        let events = text(&baton_db(&db, &["events", &run, "--json"]).stdout);
        let decided: Vec<serde_json::Value> = events
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|e| e["kind"] == "approval_decided")
            .collect();
        assert_eq!(decided.len(), 1, "pair {pair}: {events}");
        assert_eq!(
            decided[0]["data"]["by"], name,
            "pair {pair}: the winner's decision is the one recorded"
        );
    }
}

/// A fan-out killed after one child was committed resumes with only the other child: the
/// finished one is not run again, and the log ends as a run never killed.
#[test]
fn a_fan_out_killed_with_one_child_finished_resumes_the_other_only() {
    let dir = std::env::temp_dir().join(format!("baton-cli-fanout-{}", std::process::id()));
    let scenarios = dir.join("scenarios");
    std::fs::create_dir_all(&scenarios).unwrap();
    std::fs::write(
        scenarios.join("fanny.yaml"),
        "id: fanny\nversion: 1\nlevels:\n  - {id: fan, kind: fan_out, fan_out: [fast, slow], fan_in: {aggregator: all_pass}}\n  - {id: fast, kind: prompt, prompt: {inline: F}, response: verdict}\n  - {id: slow, kind: prompt, prompt: {inline: S}, response: verdict}\n  - {id: after, kind: prompt, prompt: {inline: A}, terminal: true}\nedges:\n  - {from: fan, to: after}\n",
    )
    .unwrap();
    let script = dir.join("fanny.script.yaml");
    std::fs::write(
        &script,
        "levels:\n  fast: [{text: PASS}]\n  slow: [{text: PASS, delay_ms: 300}]\n  after: [{text: done}]\n",
    )
    .unwrap();
    let start = |db: &std::path::Path, failpoint: Option<u64>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_baton"));
        command.env("BATON_BWRAP", bwrap());
        command
            .args(["--db", db.to_str().unwrap(), "--scenarios", scenarios.to_str().unwrap()])
            .args(["run", "fanny", "--script", script.to_str().unwrap(), "--input", "x"]);
        if let Some(n) = failpoint {
            command.env("BATON_FAILPOINT_ABORT_AFTER_EVENT", n.to_string());
        }
        command.output().unwrap()
    };
    let reference_db = dir.join("ref.db");
    assert_eq!(start(&reference_db, None).status.code(), Some(0));
    let run = only_run(&reference_db).unwrap();
    let reference = normalised_log(&reference_db, &run);
    let kind_of = |e: &serde_json::Value| {
        format!("{}:{}", e["kind"].as_str().unwrap(), e["level_id"].as_str().unwrap_or(""))
    };
    let fast_done = reference.iter().position(|e| kind_of(e) == "level_finished:fast").unwrap();
    let db = dir.join("killed.db");
    let killed = start(&db, Some(fast_done as u64 + 1));
    assert_eq!(killed.status.code(), None, "killed by the failpoint: {}", text(&killed.stderr));
    let run = only_run(&db).unwrap();
    let at_kill: Vec<String> = normalised_log(&db, &run).iter().map(kind_of).collect();
    assert!(at_kill.contains(&"level_finished:fast".to_owned()), "{at_kill:?}");
    assert!(!at_kill.iter().any(|k| k.ends_with(":slow")), "slow was still running: {at_kill:?}");
    drive_to_end(&db, &run);
    let log = normalised_log(&db, &run);
    assert_eq!(log, reference, "the resumed log differs from a run never killed");
    // The process that resumed recorded that it took the run over from a lost driver.
    assert_eq!(takeovers(&db, &run), 1);
    let fast_calls = log.iter().filter(|e| kind_of(e) == "model_response:fast").count();
    assert_eq!(fast_calls, 1, "the finished child was not called again");
    let _ = std::fs::remove_dir_all(dir);
}

/// A scenario `id` whose model writes code in `work` and whose `scan` level runs both
/// scanners, taking the workspace's own suppressions when `allow` says so.
fn scanning_scenario(id: &str, allow: bool) -> String {
    format!(
        r#"id: {id}
version: 1
levels:
  - id: work
    kind: tool_loop
    prompt: {{inline: "Write {{{{ input }}}}."}}
    model: {{allow: ["paid:anthropic/*"], fallback_outside_allow: true}}
  - id: scan
    kind: verifier
    mode: parallel
    verifiers:
      - name: semgrep
        uses: semgrep
        params: {{rules: rules/security.yaml, allow_suppressions: {allow}}}
      - name: gitleaks
        uses: gitleaks
        params: {{allow_suppressions: {allow}}}
    terminal: true
edges:
  - {{from: work, to: scan}}
"#
    )
}

#[test]
fn attack_a_model_cannot_silence_the_scanners_unless_the_scenario_allows_it() {
    let dir = scratch("attack-scanners");
    let scenarios = dir.join("scenarios");
    std::fs::create_dir_all(scenarios.join("rules")).unwrap();
    std::fs::copy(
        repo().join("scenarios/rules/security.yaml"),
        scenarios.join("rules/security.yaml"),
    )
    .unwrap();
    std::fs::write(scenarios.join("strict.yaml"), scanning_scenario("strict", false)).unwrap();
    std::fs::write(scenarios.join("lenient.yaml"), scanning_scenario("lenient", true)).unwrap();
    // Built at run time, so that no file of this repository holds a key-shaped string.
    let key = format!("AKIA{}", "Q3EGRTZB7XKPW4NM");
    let token = format!("ghp_{}", "R8f3kLmN2pQxV7yZ1aB4cD6eF9gH0iJ5kT2u");
    let eval = "import sys\nprint(eval(sys.argv[1]))";
    let writes = [
        write_call("app.py", &format!("{eval}  # nosemgrep\n")),
        write_call("hidden.py", &format!("{eval}\n")),
        write_call(".semgrepignore", "hidden.py\n"),
        write_call("config.py", &format!("AWS_ACCESS_KEY_ID = \"{key}\"  # gitleaks:allow\n")),
        write_call("creds.py", &format!("TOKEN = \"{token}\"\n")),
        write_call(".gitleaksignore", "creds.py:github-pat:1\n"),
    ]
    .concat();
    let script = format!(
        "levels:\n  work:\n    - tool_calls:\n{writes}    - tool_calls:\n        - name: finish\n          arguments: {{summary: done}}\n"
    );
    std::fs::write(dir.join("hostile.yaml"), script).unwrap();
    let (semgrep, gitleaks) = (
        repo().join(".peers/semgrep/bin/semgrep"),
        repo().join(".peers/gitleaks/usr/bin/gitleaks"),
    );
    assert!(semgrep.exists() && gitleaks.exists(), "run scripts/install-scanners");
    let db = dir.join("runs.db");
    let scanned = |scenario: &str| -> Vec<serde_json::Value> {
        let out = Command::new(env!("CARGO_BIN_EXE_baton"))
            .env("BATON_BWRAP", bwrap())
            .args(["--db", db.to_str().unwrap(), "--scenarios", scenarios.to_str().unwrap()])
            .args(["run", scenario, "--input", "a calculator", "--json", "--script"])
            .arg(dir.join("hostile.yaml"))
            .env("BATON_SEMGREP", &semgrep)
            .env("BATON_GITLEAKS", &gitleaks)
            .output()
            .unwrap();
        let result: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("{}{}", text(&out.stdout), text(&out.stderr)));
        let events = events_of(&db, result["run_id"].as_str().unwrap());
        events
            .into_iter()
            .filter(|e| e["kind"] == "verifier_finished")
            .map(|e| e["data"].clone())
            .collect()
    };

    let strict = scanned("strict");
    assert_eq!(strict.len(), 2, "{strict:?}");
    let named = |name: &str| strict.iter().find(|v| v["name"] == name).unwrap();
    let (semgrep_out, gitleaks_out) = (named("semgrep"), named("gitleaks"));
    assert_eq!(semgrep_out["passed"], false, "{semgrep_out}");
    let reasons = semgrep_out["reasons"].to_string();
    assert!(reasons.contains("app.py:2:") && reasons.contains("hidden.py:2:"), "{reasons}");
    assert_eq!(semgrep_out["details"]["allow_suppressions"], false);
    assert_eq!(gitleaks_out["passed"], false, "{gitleaks_out}");
    let reasons = gitleaks_out["reasons"].to_string();
    assert!(reasons.contains("config.py:1: aws-access-token"), "{reasons}");
    assert!(reasons.contains("creds.py:1: github-pat"), "{reasons}");
    assert_eq!(gitleaks_out["details"]["allow_suppressions"], false);
    assert_eq!(
        gitleaks_out["details"]["neutralised"],
        serde_json::json!({"inline_allows": 1, "ignore_files": 1})
    );

    // Control: a scenario that opts in lets the same suppressions work, and says so.
    let lenient = scanned("lenient");
    assert_eq!(lenient.len(), 2, "{lenient:?}");
    for out in &lenient {
        assert_eq!(out["passed"], true, "{out}");
        assert_eq!(out["details"]["allow_suppressions"], true, "{out}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn events_all_is_every_runs_log_in_commit_order_by_tenant_resumable_and_followed() {
    let dir = scratch("feed");
    let db = dir.join("runs.db");
    let start = |tenant: &str| {
        let out = baton_db(
            &db,
            &[
                "run",
                "release_notes",
                "--script",
                "scenarios/scripts/release_notes.yaml",
                "--input",
                "PR 1: CSV export",
                "--tenant",
                tenant,
            ],
        );
        assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
        text(&out.stdout).lines().find_map(|l| l.strip_prefix("run ")).unwrap().to_owned()
    };
    let (a, b) = (start("acme"), start("globex"));
    let out = baton_db(&db, &["approve", &a, "--by", "ann"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let lines = |args: &[&str]| -> Vec<serde_json::Value> {
        let mut all = vec!["events", "--all", "--json"];
        all.extend_from_slice(args);
        let out = baton_db(&db, &all);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let cursor = |v: &serde_json::Value| -> (u64, u64) {
        let (x, y) = v["cursor"].as_str().unwrap().split_once('-').unwrap();
        (x.parse().unwrap(), y.parse().unwrap())
    };
    let whole = lines(&[]);
    assert!(whole.windows(2).all(|w| cursor(&w[0]) < cursor(&w[1])), "cursors grow");
    for run in [&a, &b] {
        let seqs: Vec<u64> = whole
            .iter()
            .filter(|e| e["run_id"] == run.as_str())
            .map(|e| e["seq"].as_u64().unwrap())
            .collect();
        let log = text(&baton_db(&db, &["events", run, "--json"]).stdout).lines().count() as u64;
        assert_eq!(seqs, (1..=log).collect::<Vec<_>>(), "run {run}, whole and in order");
    }
    // a's approval and what followed were committed after b started: they come after b's.
    let b_first = whole.iter().position(|e| e["run_id"] == b.as_str()).unwrap();
    let approved = whole.iter().position(|e| e["kind"] == "approval_decided").unwrap();
    assert!(b_first < approved, "commit order across runs");
    let acme = lines(&["--tenant", "acme"]);
    assert!(!acme.is_empty() && acme.iter().all(|e| e["run_id"] == a.as_str()), "acme's only");
    let cut = whole.len() / 2;
    let from = whole[cut]["cursor"].as_str().unwrap().to_owned();
    assert_eq!(lines(&["--after", &from]), whole[cut + 1..], "exactly the rest after {from}");
    let shown = text(&baton_db(&db, &["events", "--all"]).stdout);
    let last = whole.last().unwrap()["cursor"].as_str().unwrap();
    assert!(shown.trim_end().ends_with(&format!("next      --after {last}")), "{shown}");
    let bad = baton_db(&db, &["events", "--all", "--after", "7"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad.stderr).contains("is not a feed cursor"), "{}", text(&bad.stderr));
    // A follower from the end prints what is committed next: b's approval and its end.
    let mut follower = baton_command()
        .args([
            "--db",
            db.to_str().unwrap(),
            "events",
            "--all",
            "--follow",
            "--json",
            "--after",
            last,
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = follower.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let out = baton_db(&db, &["approve", &b, "--by", "gus"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let mut followed = Vec::new();
    while !followed.iter().any(|e: &serde_json::Value| e["kind"] == "scenario_finished") {
        let line = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the follower prints b's end");
        followed.push(serde_json::from_str(&line).unwrap());
    }
    let _ = follower.kill();
    let _ = follower.wait();
    assert!(followed.iter().all(|e| e["run_id"] == b.as_str()), "{followed:?}");
    assert_eq!(followed[0]["kind"], "approval_decided");
    let _ = std::fs::remove_dir_all(dir);
}
