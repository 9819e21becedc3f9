//! The `baton` binary end to end: exit codes, output formats, error rendering.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn baton(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(args)
        .current_dir(repo())
        // Provider keys of the machine must not leak into the tests.
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("BATON_CONFIG")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn validate_accepts_the_bundled_scenarios() {
    let out = baton(&["validate"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        text(&out.stdout).contains("ok: 9 scenarios valid, 0 warnings"),
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
    assert_eq!(report["scenarios"].as_array().unwrap().len(), 9);
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

/// A run's log as JSON lines, without times and durations.
fn normalised_log(db: &std::path::Path, run: &str) -> Vec<serde_json::Value> {
    fn scrub(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                // Workspace paths and snapshot ids (git commits, which carry their time)
                // differ between runs that did the same thing.
                for key in ["at", "duration_ms", "total_duration_ms", "dir", "base", "snapshot"] {
                    map.remove(key);
                }
                map.values_mut().for_each(scrub);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(scrub),
            _ => {}
        }
    }
    let out = baton_db(db, &["events", run, "--json"]);
    text(&out.stdout)
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            scrub(&mut v);
            v
        })
        .collect()
}

fn only_run(db: &std::path::Path) -> Option<String> {
    let out = baton_db(db, &["runs", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    list.as_array()?.first()?["run_id"].as_str().map(str::to_owned)
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
        }
        assert!(kills > 3, "{scenario}: the failpoint killed the first process only {kills} times");
    }
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
struct Fakellm(std::process::Child, u16);

impl Drop for Fakellm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn fakellm(rules: &std::path::Path) -> Fakellm {
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
    std::fs::write(
        dir.join("baton.toml"),
        format!(
            "[routing]\ndefault = \"free:local/fake-model\"\n\n[[providers]]\nname = \"local\"\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:{}/v1\"\ntier = \"free\"\n[[providers.models]]\nname = \"fake-model\"\ninput_usd_per_mtok = 0.5\noutput_usd_per_mtok = 1.0\n",
            server.1
        ),
    )
    .unwrap();
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
    // A different request has no recording: a hard error that says where it differs.
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
        o.contains("no recording for level `answer`") && o.contains("differs at character"),
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
            .args(["--db", db.to_str().unwrap(), "--scenarios", scenarios.to_str().unwrap()])
            .args(args)
            .env("BATON_SEMGREP", &semgrep)
            .env("BATON_GITLEAKS", &gitleaks)
            .current_dir(&project)
            .output()
            .unwrap()
    };
    let script = scenarios.join("scripts/security_review.yaml");
    let out = baton_in_project(&[
        "run",
        "security_review",
        "--input",
        "review this service",
        "--script",
        script.to_str().unwrap(),
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
