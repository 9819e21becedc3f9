//! The bundled scenarios on every path: each script of `scenarios/scripts/` runs through
//! the real `baton` binary on SQLite, with the approvals and answers it pauses for, and
//! ends as its row of [`RUNS`] expects; together the runs take every edge of every bundled
//! scenario (computed from their `gate_decision` events). Also the regressions of the
//! bundled scenarios' paths: a rejected security review, the document editor's retry
//! prompt, a quick answer that never validates, and where verifiers run.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use baton_scenario::Registry;
use baton_scenario::model::{END, FAIL, Target};
use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("baton-bundled-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `baton --db DB ARGS` from `cwd`, with no provider key of the machine and the test
/// venv (mypy, pyflakes for `code_build_strict`) first on PATH.
fn baton_in(cwd: &Path, db: &Path, args: &[&str]) -> Output {
    baton_cmd(cwd, db).args(args).output().unwrap()
}

/// The command [`baton_in`] runs, before its arguments: with the configuration of the
/// bundled ticket service (loopback for 127.0.0.1, its token) and the MCP servers the
/// suite installs on PATH, which only `ticket_triage` uses.
fn baton_cmd(cwd: &Path, db: &Path) -> Command {
    let venv = repo().join(".peers/venv/bin");
    let npm = repo().join(".peers/npm/node_modules/.bin");
    let path = format!(
        "{}:{}:{}",
        venv.display(),
        npm.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = Command::new(env!("CARGO_BIN_EXE_baton"));
    c.env("BATON_BWRAP", repo().join(".peers/bubblewrap/usr/bin/bwrap"))
        .args(["--db", db.to_str().unwrap(), "--scenarios"])
        .arg(repo().join("scenarios"))
        .current_dir(cwd)
        .env("PATH", path)
        .env("TICKETS_TOKEN", "bundled-token")
        .env("BATON_CONFIG", repo().join("scenarios/services/baton.toml"))
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL");
    c
}

/// The bundled ticket service on 127.0.0.1:8765, where `ticket_triage` calls it; stopped
/// when dropped. (Its tests run one at a time: the `tickets` group of nextest.toml.)
pub(crate) struct TicketService(std::process::Child);

impl TicketService {
    pub(crate) fn start() -> TicketService {
        let child = Command::new("python3")
            .arg(repo().join("scenarios/services/tickets.py"))
            .args(["--port", "8765"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let service = TicketService(child);
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", 8765)).is_err() {
            assert!(started.elapsed().as_secs() < 20, "the ticket service did not start");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        service
    }
}

impl Drop for TicketService {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn events_of(cwd: &Path, db: &Path, run: &str) -> Vec<Value> {
    let out = baton_in(cwd, db, &["events", run, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// What a test does when a run pauses.
#[derive(Clone, Copy, Debug)]
enum Decide {
    Approve,
    Reject(&'static str),
    /// The answer to an `ask_user` question, as JSON.
    Answer(&'static str),
    /// Cancel the wave once two of its workers run (the run is started in the background).
    CancelWave,
}

/// One run of a bundled scenario on a script, the decisions its pauses get in order, and
/// how it must end.
struct Run {
    scenario: &'static str,
    script: &'static str,
    decisions: &'static [Decide],
    status: &'static str,
}

const fn run(
    scenario: &'static str,
    script: &'static str,
    decisions: &'static [Decide],
    status: &'static str,
) -> Run {
    Run { scenario, script, decisions, status }
}

/// Every script of `scenarios/scripts/`, at least once.
const RUNS: &[Run] = &[
    run("code_build", "code_build", &[], "completed"),
    run("code_build", "code_build_fix", &[], "completed"),
    run("code_build", "code_build_escalate", &[], "completed"),
    run("code_build", "code_build_rework", &[], "completed"),
    run("code_build_strict", "code_build_strict", &[], "completed"),
    run("code_build_strict", "code_build_strict_rework", &[], "completed"),
    run("code_build_strict", "code_build_strict_escalate", &[], "completed"),
    run("document_writing", "document_writing", &[], "completed"),
    run("document_writing", "document_writing_fix", &[], "completed"),
    run("document_writing", "document_writing_unverified", &[], "completed"),
    run("feature_wave", "feature_wave", &[], "completed"),
    run("feature_wave", "feature_wave_replan", &[], "completed"),
    run("feature_wave", "feature_wave_failing", &[], "failed"),
    run("feature_wave", "feature_wave_escalate", &[Decide::Approve], "completed"),
    run(
        "feature_wave",
        "feature_wave_escalate",
        &[Decide::Reject("no secret this week")],
        "failed",
    ),
    run("feature_wave", "feature_wave_cancel", &[Decide::CancelWave], "cancelled"),
    run("intent_classifier", "intent_classifier", &[], "completed"),
    run(
        "intent_classifier",
        "intent_classifier_unsure",
        &[Decide::Answer("\"research_brief\"")],
        "completed",
    ),
    run("parallel_review_demo", "parallel_review_demo", &[], "completed"),
    run("parallel_review_demo", "parallel_review_demo_reject", &[], "completed"),
    run("quick_qa", "quick_qa", &[], "completed"),
    run("quick_qa", "quick_qa_invalid", &[], "failed"),
    run("release_notes", "release_notes", &[Decide::Approve], "completed"),
    run(
        "release_notes",
        "release_notes",
        &[Decide::Reject("name the CSV export first"), Decide::Approve],
        "completed",
    ),
    run("release_notes", "release_notes_rejected", &[Decide::Reject("not this release")], "failed"),
    run("research_brief", "research_brief", &[], "completed"),
    run("research_brief", "research_brief_pass", &[], "completed"),
    run("security_review", "security_review", &[Decide::Approve], "completed"),
    run(
        "security_review",
        "security_review_rejected",
        &[
            Decide::Reject("rank the eval finding higher"),
            Decide::Reject("add remediation"),
            Decide::Reject("still missing the secrets"),
        ],
        "failed",
    ),
    run("ticket_triage", "ticket_triage", &[Decide::Approve], "completed"),
    run("ticket_triage", "ticket_triage", &[Decide::Reject("not before the review")], "completed"),
    run("ticket_triage", "ticket_triage_down", &[], "failed"),
];

fn exit_status(code: Option<i32>) -> &'static str {
    match code {
        Some(0) => "completed",
        Some(1) => "failed",
        Some(3) => "paused",
        Some(4) => "aborted",
        Some(5) => "cancelled",
        _ => "crashed",
    }
}

/// Runs one row of [`RUNS`] to its end; returns the run id.
fn drive(dir: &Path, db: &Path, r: &Run) -> String {
    let script = repo().join(format!("scenarios/scripts/{}.yaml", r.script));
    let what = format!("{} on {}", r.scenario, r.script);
    if matches!(r.decisions, [Decide::CancelWave]) {
        return cancel_mid_wave(dir, db, r, &script, &what);
    }
    let out = baton_in(
        dir,
        db,
        &[
            "run",
            r.scenario,
            "--script",
            script.to_str().unwrap(),
            "--input",
            "a request",
            "--json",
        ],
    );
    let result: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{what}: {e}: {}{}", text(&out.stdout), text(&out.stderr)));
    let run = result["run_id"].as_str().unwrap().to_owned();
    let mut status = exit_status(out.status.code());
    for decision in r.decisions {
        assert_eq!(status, "paused", "{what}: expected a pause for {decision:?}");
        let out = match decision {
            Decide::Approve => baton_in(dir, db, &["approve", &run, "--by", "tester"]),
            Decide::Reject(comment) => baton_in(
                dir,
                db,
                &["approve", &run, "--reject", "--comment", comment, "--by", "tester"],
            ),
            Decide::Answer(answer) => baton_in(dir, db, &["answer", &run, "--answer", answer]),
            Decide::CancelWave => unreachable!("a cancelled wave is driven by cancel_mid_wave"),
        };
        status = exit_status(out.status.code());
        assert_ne!(status, "crashed", "{what}: {}{}", text(&out.stdout), text(&out.stderr));
    }
    assert_eq!(status, r.status, "{what}: the run ended {status}, not {}", r.status);
    let events = events_of(dir, db, &run);
    let last = events.last().unwrap();
    assert_eq!(last["kind"], "scenario_finished", "{what}");
    assert_eq!(last["data"]["status"], r.status, "{what}");
    run
}

/// Starts the run in the background, cancels its wave once two workers run, and checks
/// that every worker settled cancelled within the settle timeout.
fn cancel_mid_wave(dir: &Path, db: &Path, r: &Run, script: &Path, what: &str) -> String {
    let child = baton_cmd(dir, db)
        .args([
            "run",
            r.scenario,
            "--script",
            script.to_str().unwrap(),
            "--input",
            "a request",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let run = loop {
        assert!(std::time::Instant::now() < deadline, "{what}: two workers never ran");
        let out = baton_in(dir, db, &["wave", "get", "current", "--json"]);
        if let Ok(view) = serde_json::from_slice::<Value>(&out.stdout)
            && view["counts"]["in_flight"] == 2
            && view["assignments"][1]["worker_run"].is_string()
        {
            break view["run_id"].as_str().unwrap().to_owned();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let asked = std::time::Instant::now();
    let cancel = baton_in(dir, db, &["wave", "cancel", &run, "--by", "tester"]);
    assert_eq!(cancel.status.code(), Some(0), "{what}: {}", text(&cancel.stderr));
    let out = child.wait_with_output().unwrap();
    assert_eq!(exit_status(out.status.code()), "cancelled", "{what}: {}", text(&out.stderr));
    assert!(
        asked.elapsed() < std::time::Duration::from_secs(15),
        "{what}: took {:?}",
        asked.elapsed()
    );
    let view: Value =
        serde_json::from_slice(&baton_in(dir, db, &["wave", "get", &run, "--json"]).stdout)
            .unwrap();
    assert_eq!(view["decision"], "cancelled", "{what}: {view}");
    assert_eq!(
        view["counts"]["cancelled"], 2,
        "{what}: both running workers settled cancelled: {view}"
    );
    assert_eq!(view["counts"]["planned"], 1, "{what}: {view}");
    run
}

/// An edge as a gate decision names it: source, target and gate text (none when the edge
/// has no `when`).
type EdgeKey = (String, String, Option<String>);

#[test]
fn the_bundled_scripts_take_every_edge_and_end_as_expected() {
    let _tickets = TicketService::start();
    let dir = scratch("coverage");
    let db = dir.join("runs.db");
    let loaded = Registry::load(&[repo().join("scenarios")]).unwrap();

    // Every script is run, and every scenario has runs.
    let scripts: BTreeSet<String> = std::fs::read_dir(repo().join("scenarios/scripts"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    let used: BTreeSet<String> = RUNS.iter().map(|r| r.script.to_owned()).collect();
    assert_eq!(scripts, used, "every script in scenarios/scripts/ has a row in RUNS");

    let mut taken: BTreeMap<&str, BTreeSet<EdgeKey>> = BTreeMap::new();
    for r in RUNS {
        let run = drive(&dir, &db, r);
        for e in events_of(&dir, &db, &run).iter().filter(|e| e["kind"] == "gate_decision") {
            let d = &e["data"];
            assert_ne!(
                d["fallthrough"], true,
                "{} on {}: a run fell through to the end: {d}",
                r.scenario, r.script
            );
            taken.entry(r.scenario).or_default().insert((
                d["source"].as_str().unwrap().to_owned(),
                d["target"].as_str().unwrap().to_owned(),
                d["expression"].as_str().map(str::to_owned),
            ));
        }
    }

    let mut uncovered = Vec::new();
    let (mut edges_total, mut edges_taken) = (0, 0);
    for scenario in loaded.registry.scenarios() {
        assert!(
            RUNS.iter().any(|r| r.scenario == scenario.id),
            "bundled scenario `{}` has no script in RUNS",
            scenario.id
        );
        let seen = taken.get(scenario.id.as_str()).cloned().unwrap_or_default();
        for edge in &scenario.edges {
            let to = match edge.to {
                Target::Level(t) => scenario.levels[t].id.clone(),
                Target::End => END.to_owned(),
                Target::Fail => FAIL.to_owned(),
            };
            let key = (
                scenario.levels[edge.from].id.clone(),
                to,
                edge.when.as_ref().map(ToString::to_string),
            );
            edges_total += 1;
            if seen.contains(&key) {
                edges_taken += 1;
            } else {
                let when = key.2.as_deref().map_or(String::new(), |w| format!(" when {w}"));
                uncovered.push(format!("{}: {} -> {}{when}", scenario.id, key.0, key.1));
            }
        }
    }
    assert!(
        uncovered.is_empty(),
        "edge coverage {edges_taken}/{edges_total}; never taken:\n{}",
        uncovered.join("\n")
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The prompts a level was sent, in order: (attempt, prompt).
fn prompts(events: &[Value], level: &str) -> Vec<(u64, String)> {
    events
        .iter()
        .filter(|e| e["kind"] == "prompt_sent" && e["level_id"] == level)
        .map(|e| (e["attempt"].as_u64().unwrap(), e["data"]["prompt"].as_str().unwrap().to_owned()))
        .collect()
}

#[test]
fn a_rejected_security_review_goes_back_to_the_analyst_with_the_comment_and_the_report() {
    let dir = scratch("secrev-reject");
    let db = dir.join("runs.db");
    let script = repo().join("scenarios/scripts/security_review_rejected.yaml");
    let out = baton_in(
        &dir,
        &db,
        &["run", "security_review", "--script", script.to_str().unwrap(), "--input", "x", "--json"],
    );
    assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let run = result["run_id"].as_str().unwrap();
    let out = baton_in(&dir, &db, &["approve", run, "--reject", "--comment", "rank eval higher"]);
    assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
    let events = events_of(&dir, &db, run);
    let reports = prompts(&events, "report");
    assert_eq!(reports.len(), 2, "the report is written again after the rejection");
    assert!(!reports[0].1.contains("rejected the previous report"), "{}", reports[0].1);
    let again = &reports[1].1;
    assert_eq!(reports[1].0, 2);
    assert!(again.contains("The security lead rejected the previous report"), "{again}");
    assert!(again.contains("rank eval higher"), "{again}");
    assert!(again.contains("Your previous report:\nReport v1: no critical findings."), "{again}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_editors_retry_prompt_holds_its_previous_version_and_the_fact_check_findings() {
    let dir = scratch("docwrite-retry");
    let db = dir.join("runs.db");
    let script = repo().join("scenarios/scripts/document_writing_fix.yaml");
    let out = baton_in(
        &dir,
        &db,
        &[
            "run",
            "document_writing",
            "--script",
            script.to_str().unwrap(),
            "--input",
            "x",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let events = events_of(&dir, &db, result["run_id"].as_str().unwrap());
    let edits = prompts(&events, "edit");
    assert_eq!(edits.iter().map(|(a, _)| *a).collect::<Vec<_>>(), [1, 2]);
    let first = &edits[0].1;
    assert!(first.contains("## Draft") && !first.contains("## Your previous version"), "{first}");
    let retry = &edits[1].1;
    assert!(
        retry.contains(
            "## Your previous version\nEdited v1: PostgreSQL was first released in 1989."
        ),
        "{retry}"
    );
    assert!(retry.contains("## Fact-check findings to resolve"), "{retry}");
    assert!(retry.contains("the first PostgreSQL release was in 1996"), "{retry}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_quick_answer_that_never_validates_fails_the_run() {
    let dir = scratch("quickqa-invalid");
    let db = dir.join("runs.db");
    let script = repo().join("scenarios/scripts/quick_qa_invalid.yaml");
    let out = baton_in(
        &dir,
        &db,
        &["run", "quick_qa", "--script", script.to_str().unwrap(), "--input", "x", "--json"],
    );
    assert_eq!(out.status.code(), Some(1), "{}{}", text(&out.stdout), text(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "failed");
    assert_eq!(result["aborted_reason"], "routed_to_fail:answer");
    let events = events_of(&dir, &db, result["run_id"].as_str().unwrap());
    let schema: Vec<bool> = events
        .iter()
        .filter(|e| e["kind"] == "verifier_finished")
        .map(|e| e["data"]["passed"].as_bool().unwrap())
        .collect();
    assert_eq!(schema, [false, false], "the schema verifier failed on the answer and its retry");
    let _ = std::fs::remove_dir_all(dir);
}

/// A scenarios directory with one scenario, `scan`, whose verifier lists the directory it
/// runs in (a command verifier: no outside scanner needed), and `DIR/script.yaml` for it.
fn scan_scenario(dir: &Path) -> PathBuf {
    let scenarios = dir.join("scenarios");
    std::fs::create_dir_all(scenarios.join("prompts")).unwrap();
    std::fs::write(scenarios.join("prompts/note.j2"), "Summarise: {{ input }}\n").unwrap();
    // `ls` lists the directory it runs in: its output says where the verifier ran.
    let scan = r#"id: scan
version: 1
display_name: Scan
description: lists the files of the run's workspace
levels:
  - id: note
    role: writer
    kind: prompt
    prompt: prompts/note.j2
  - id: check
    role: checker
    kind: verifier
    verifiers:
      - name: files
        uses: command
        params:
          argv: [ls, -a]
edges:
  - {from: note, to: check}
  - {from: check, to: __end__}
"#;
    std::fs::write(scenarios.join("scan.yaml"), scan).unwrap();
    std::fs::write(dir.join("script.yaml"), "levels:\n  note: [{text: done}]\n").unwrap();
    scenarios
}

fn baton_with(cwd: &Path, scenarios: &Path, db: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_baton"))
        .env("BATON_BWRAP", repo().join(".peers/bubblewrap/usr/bin/bwrap"))
        .args(["--db", db.to_str().unwrap(), "--scenarios", scenarios.to_str().unwrap()])
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

/// The `stdout_tail` of the `files` verifier's outcome.
fn listing(cwd: &Path, scenarios: &Path, db: &Path, run: &str) -> String {
    let out = baton_with(cwd, scenarios, db, &["events", run, "--json"]);
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["kind"] == "verifier_finished")
        .map(|e| e["data"]["details"]["stdout_tail"].as_str().unwrap_or_default().to_owned())
        .unwrap()
}

#[test]
fn verifiers_run_in_the_named_workspace_or_the_runs_own_never_the_current_directory() {
    let dir = scratch("verifier-workspace");
    let scenarios = scan_scenario(&dir);
    let script = dir.join("script.yaml");
    let (cwd, project) = (dir.join("elsewhere"), dir.join("project"));
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(cwd.join("cwd-marker.txt"), "").unwrap();
    std::fs::write(project.join("project-marker.txt"), "").unwrap();
    let db = dir.join("data/runs.db");
    let start = |extra: &[&str]| {
        let mut args = vec!["run", "scan", "--script", script.to_str().unwrap(), "--input", "x"];
        args.extend_from_slice(extra);
        args.push("--json");
        let out = baton_with(&cwd, &scenarios, &db, &args);
        assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
        let result: Value = serde_json::from_slice(&out.stdout).unwrap();
        result["run_id"].as_str().unwrap().to_owned()
    };

    // `--workspace PROJECT`: the verifier lists the project, from any directory.
    let run = start(&["--workspace", project.to_str().unwrap()]);
    let listed = listing(&cwd, &scenarios, &db, &run);
    assert!(listed.contains("project-marker.txt") && !listed.contains("cwd-marker"), "{listed}");

    // Without it: the run's own directory under workspaces/, recorded in its log.
    let run = start(&[]);
    let listed = listing(&cwd, &scenarios, &db, &run);
    assert!(!listed.contains("cwd-marker") && !listed.contains("project-marker"), "{listed}");
    let out = baton_with(&cwd, &scenarios, &db, &["events", &run, "--json"]);
    let first: Value = serde_json::from_str(text(&out.stdout).lines().next().unwrap()).unwrap();
    let own = dir.join("data/workspaces").join(&run);
    assert_eq!(
        first["data"]["workspace"]["dir"].as_str().map(PathBuf::from),
        Some(std::fs::canonicalize(&own).unwrap()),
        "{first}"
    );

    // A scenario that reads no files refuses `--workspace` instead of ignoring it.
    let out = baton_with(
        &cwd,
        &repo().join("scenarios"),
        &db,
        &[
            "run",
            "quick_qa",
            "--script",
            repo().join("scenarios/scripts/quick_qa.yaml").to_str().unwrap(),
            "--input",
            "x",
            "--workspace",
            project.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("scenario `quick_qa` reads no files") && err.contains("drop --workspace"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The fixtures of the bundled ticket triage were recorded with a token of the ticket
/// service (`scripts/record-fixtures`): no file of theirs holds it.
#[test]
fn the_ticket_triage_fixtures_hold_no_secret() {
    let dir = repo().join("scenarios/fixtures/ticket_triage");
    let mut files = 0;
    for case in std::fs::read_dir(&dir).unwrap() {
        for file in std::fs::read_dir(case.unwrap().path()).unwrap() {
            let path = file.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(!text.contains("fixture-token"), "{} holds the token", path.display());
            files += 1;
        }
    }
    assert!(files >= 12, "the three cases' files: {files}");
}
