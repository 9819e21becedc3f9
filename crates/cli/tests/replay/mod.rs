//! Replays, fixtures, forks, diffs and forecasts through the binary: every bundled fixture
//! replays to its own log event by event (with and without `--trust-validation`);
//! `baton test` fails naming the level when a bundled prompt, gate or rubric threshold is
//! edited, and re-records against fakellm with `--live`; a fork at every level boundary of
//! `code_build` finishes with the files the original had there; a forecast's figures are
//! the recorded runs' own.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use super::{baton_command, baton_in, fakellm, repo, scratch, text};

/// `baton ARGS` on the repository's scenarios with the test venv first on PATH (mypy and
/// pyflakes for code_build_strict).
fn baton_repo(db: &Path, args: &[&str]) -> Output {
    let venv = repo().join(".peers/venv/bin");
    let path = format!("{}:{}", venv.display(), std::env::var("PATH").unwrap_or_default());
    baton_command().env("PATH", path).arg("--db").arg(db).args(args).output().unwrap()
}

/// A copy of the bundled scenarios (fixtures included) in `dir/scenarios`, to edit.
pub(super) fn copy_scenarios(dir: &Path) {
    let status = std::process::Command::new("cp")
        .arg("-r")
        .arg(repo().join("scenarios"))
        .arg(dir.join("scenarios"))
        .status()
        .unwrap();
    assert!(status.success());
}

fn run(dir: &Path, db: &Path, args: &[&str]) -> Output {
    let venv = repo().join(".peers/venv/bin");
    let path = format!("{}:{}", venv.display(), std::env::var("PATH").unwrap_or_default());
    baton_in(dir, db).env("PATH", path).args(args).output().unwrap()
}

/// `baton run SCENARIO --script SCRIPT --input INPUT --json`.
fn start(dir: &Path, db: &Path, scenario: &str, script: &Path, input: &str) -> Output {
    let script = script.to_str().unwrap();
    run(dir, db, &["run", scenario, "--script", script, "--input", input, "--json"])
}

/// [`start`], which must exit 0, with its result.
fn start_json(dir: &Path, db: &Path, scenario: &str, script: &Path, input: &str) -> Value {
    let out = start(dir, db, scenario, script, input);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", both(&out)))
}

/// `run`, which must exit 0, with its JSON output.
fn run_json(dir: &Path, db: &Path, args: &[&str]) -> Value {
    let out = run(dir, db, args);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", both(&out)))
}

fn both(out: &Output) -> String {
    text(&out.stdout) + &text(&out.stderr)
}

fn fixture_dirs() -> Vec<PathBuf> {
    let root = repo().join("scenarios/fixtures");
    let mut dirs = Vec::new();
    for scenario in std::fs::read_dir(&root).unwrap() {
        for case in std::fs::read_dir(scenario.unwrap().path()).unwrap() {
            dirs.push(case.unwrap().path());
        }
    }
    dirs.sort();
    dirs
}

#[test]
fn every_bundled_fixture_replays_to_its_own_log_with_and_without_trusted_validation() {
    let dir = scratch("replay-fixtures");
    let db = dir.join("runs.db");
    let dirs = fixture_dirs();
    // Every bundled scenario has fixtures.
    let scenarios: std::collections::BTreeSet<String> = std::fs::read_dir(repo().join("scenarios"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".yaml").map(str::to_owned)
        })
        .collect();
    for s in &scenarios {
        assert!(
            dirs.iter().any(|d| d.parent().unwrap().ends_with(s)),
            "scenario {s} has no fixture under scenarios/fixtures/{s}"
        );
    }
    for fixture in &dirs {
        for trust in [false, true] {
            let mut args = vec!["replay", "--fixture", fixture.to_str().unwrap(), "--json"];
            if trust {
                args.push("--trust-validation");
            }
            let out = baton_repo(&db, &args);
            let result: Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{}: {e}: {}", fixture.display(), both(&out)));
            assert_eq!(
                (out.status.code(), &result["matches"]),
                (Some(0), &Value::Bool(true)),
                "{} (trust {trust}): {result:#}",
                fixture.display()
            );
            assert_eq!(
                result["strategy"],
                if trust { "trust_validation" } else { "rerun_verifiers" }
            );
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn trusted_validation_runs_no_verifier_program() {
    // A fixture whose verifier passed; then the verifier's program is swapped for one that
    // fails (same name, same kind): trusting the recorded outcomes runs it never and
    // replays to the same log; running the verifiers again runs it, and the log differs
    // where its outcome does.
    let dir = scratch("replay-trusted");
    std::fs::create_dir_all(dir.join("scenarios")).unwrap();
    let scenario = |code: u8| {
        format!(
            "id: checked\nversion: 1\nlevels:\n  - id: write\n    kind: prompt\n    prompt: {{inline: \"Write about {{{{ input }}}}\"}}\n    verifiers:\n      - {{name: gate, uses: command, params: {{argv: [sh, -c, 'exit {code}']}}}}\n    terminal: true\n"
        )
    };
    std::fs::write(dir.join("scenarios/checked.yaml"), scenario(0)).unwrap();
    std::fs::write(
        dir.join("script.yaml"),
        "levels:\n  write:\n    - text: a paragraph\n      cost_usd: 0.001\n",
    )
    .unwrap();
    let db = dir.join("runs.db");
    let script = dir.join("script.yaml");
    let out = run(
        &dir,
        &db,
        &[
            "fixture",
            "record",
            "checked",
            "passes",
            "--script",
            script.to_str().unwrap(),
            "--input",
            "x",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    std::fs::write(dir.join("scenarios/checked.yaml"), scenario(3)).unwrap();
    let fixture = dir.join("scenarios/fixtures/checked/passes");
    let trusted =
        run(&dir, &db, &["replay", "--fixture", fixture.to_str().unwrap(), "--trust-validation"]);
    assert_eq!(trusted.status.code(), Some(0), "{}", both(&trusted));
    assert!(
        text(&trusted.stdout).contains("matches the recording event by event"),
        "{}",
        both(&trusted)
    );
    let rerun = run(&dir, &db, &["replay", "--fixture", fixture.to_str().unwrap()]);
    assert_eq!(rerun.status.code(), Some(1), "{}", both(&rerun));
    assert!(
        text(&rerun.stdout).contains("`verifier_finished` differs at /data/passed"),
        "{}",
        both(&rerun)
    );
    // And `baton test` with trusted outcomes passes, without them fails.
    let out = run(&dir, &db, &["test", "--trust-validation"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    let out = run(&dir, &db, &["test"]);
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_edited_prompt_fails_baton_test_naming_the_level_with_a_diff_of_the_request() {
    let dir = scratch("replay-prompt");
    copy_scenarios(&dir);
    let db = dir.join("runs.db");
    let draft = dir.join("scenarios/prompts/release_notes/draft.j2");
    let mut prompt = std::fs::read_to_string(&draft).unwrap();
    prompt.push_str("\nKeep every entry under twelve words.\n");
    std::fs::write(&draft, prompt).unwrap();
    let out = run(&dir, &db, &["test", "release_notes"]);
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    let o = text(&out.stdout);
    assert!(o.contains("release_notes/approved … FAIL"), "{o}");
    assert!(o.contains("request of level draft (call 0) is not in the cassette"), "{o}");
    assert!(o.contains("+Keep every entry under twelve words."), "{o}");
    // The scenarios nobody edited still pass.
    let out = run(&dir, &db, &["test", "quick_qa", "research_brief"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    // JSON and JUnit say the same.
    let out = run(&dir, &db, &["test", "release_notes", "--format", "json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["failed"], 3, "{report:#}");
    let miss = &report["cases"][0]["misses"][0];
    assert_eq!(miss["level_id"], "draft", "{report:#}");
    assert!(miss["diff"].as_str().unwrap().contains("+Keep every entry"), "{report:#}");
    let out = run(&dir, &db, &["test", "release_notes", "--format", "junit"]);
    let xml = text(&out.stdout);
    assert!(xml.contains("<testsuite name=\"release_notes\" tests=\"3\" failures=\"3\""), "{xml}");
    assert!(xml.contains("<failure message=\"no recording for level `draft`"), "{xml}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_flipped_gate_or_rubric_threshold_fails_baton_test_naming_the_level() {
    let dir = scratch("replay-gate");
    copy_scenarios(&dir);
    let db = dir.join("runs.db");
    // A rubric threshold no answer reaches: the judged level's verdict flips.
    let rubric = dir.join("scenarios/rubrics/fact_check_v1.md");
    let text_before = std::fs::read_to_string(&rubric).unwrap();
    std::fs::write(&rubric, text_before.replace("pass_threshold: 0.75", "pass_threshold: 0.99"))
        .unwrap();
    let out = run(&dir, &db, &["test", "document_writing", "--case", "complete"]);
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    let o = text(&out.stdout);
    assert!(o.contains("FAIL verdict fact_check#1: verdict FAIL, expected PASS"), "{o}");
    std::fs::write(&rubric, text_before).unwrap();
    // A gate that sends a failed review straight to the sign-off: the path changes there.
    let scenario = dir.join("scenarios/release_notes.yaml");
    let yaml = std::fs::read_to_string(&scenario).unwrap();
    std::fs::write(
        &scenario,
        yaml.replace("when: \"verdict == 'PASS'\"", "when: \"verdict == 'FAIL'\""),
    )
    .unwrap();
    let out = run(&dir, &db, &["test", "release_notes", "--case", "approved"]);
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    let o = text(&out.stdout);
    assert!(o.contains("FAIL path draft#2") && o.contains("replayed sign_off#1"), "{o}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn live_rerecords_a_changed_request_against_fakellm_and_accept_makes_it_the_expectation() {
    let dir = scratch("replay-live");
    copy_scenarios(&dir);
    let db = dir.join("runs.db");
    let prompt = dir.join("scenarios/prompts/quick_qa/answer.j2");
    let mut t = std::fs::read_to_string(&prompt).unwrap();
    t.push_str("\nAnswer in one sentence.\n");
    std::fs::write(&prompt, t).unwrap();
    std::fs::write(
        dir.join("rules.yaml"),
        "version: 1\nrules:\n  - name: any\n    when: {messages_contain: \"one sentence\"}\n    respond: {content: '{\"answer\": \"A short answer.\", \"confidence\": 0.9, \"sources\": []}'}\n",
    )
    .unwrap();
    let server = fakellm(&dir.join("rules.yaml"));
    std::fs::write(dir.join("baton.toml"), server.config()).unwrap();
    let offline = run(&dir, &db, &["test", "quick_qa", "--case", "complete"]);
    assert_eq!(offline.status.code(), Some(1), "{}", both(&offline));
    let cassette = dir.join("scenarios/fixtures/quick_qa/complete/cassette.json");
    let entries = |p: &Path| -> usize {
        let c: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        c["entries"].as_array().unwrap().len()
    };
    let before = entries(&cassette);
    let config = dir.join("baton.toml");
    let live = run(
        &dir,
        &db,
        &["--config", config.to_str().unwrap(), "test", "quick_qa", "--case", "complete", "--live"],
    );
    let o = text(&live.stdout);
    assert!(o.contains("recorded live: the request of level answer"), "{}", both(&live));
    assert_eq!(entries(&cassette), before + 1, "the live answer is in the fixture's cassette");
    // The answer changed: the output differs from what the fixture expected.
    assert!(o.contains("FAIL output"), "{o}");
    // Offline now: the cassette holds the request; accepting makes the new result the
    // expectation, and the fixture passes.
    drop(server);
    let accept = run(&dir, &db, &["fixture", "accept", "quick_qa", "complete"]);
    assert_eq!(accept.status.code(), Some(0), "{}", both(&accept));
    let again = run(&dir, &db, &["test", "quick_qa", "--case", "complete"]);
    assert_eq!(again.status.code(), Some(0), "{}", both(&again));
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("scenarios/fixtures/quick_qa/complete/expected.json"))
            .unwrap(),
    )
    .unwrap();
    assert!(expected["output"].as_str().unwrap().contains("A short answer."), "{expected:#}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The files of a directory (relative path → contents), Baton's excludes left out.
fn files(root: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            if [".baton", "__pycache__", ".mypy_cache"].contains(&name.as_str()) {
                continue;
            }
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

fn events(dir: &Path, db: &Path, run_id: &str) -> Vec<Value> {
    let out = run(dir, db, &["events", run_id, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn a_fork_at_every_level_boundary_of_code_build_finishes_with_the_right_workspace() {
    let dir = scratch("replay-fork");
    copy_scenarios(&dir);
    let db = dir.join("runs.db");
    let script = dir.join("scenarios/scripts/code_build_fix.yaml");
    let original = start_json(&dir, &db, "code_build", &script, "a request");
    let original_id = original["run_id"].as_str().unwrap().to_owned();
    let original_events = events(&dir, &db, &original_id);
    let workspace_of = |events: &[Value]| -> PathBuf {
        let dir = events
            .iter()
            .rev()
            .find_map(|e| match e["kind"].as_str() {
                Some("run_forked") => e["data"]["workspace"]["dir"].as_str().map(str::to_owned),
                Some("scenario_started") => {
                    e["data"]["workspace"]["dir"].as_str().map(str::to_owned)
                }
                _ => None,
            })
            .unwrap();
        PathBuf::from(dir)
    };
    let final_files = files(&workspace_of(&original_events));
    assert!(final_files.keys().any(|k| k.ends_with(".py")), "{:?}", final_files.keys());
    let out = run(&dir, &db, &["fork", &original_id, "--json"]);
    let points: Value = serde_json::from_slice(&out.stdout).unwrap();
    let points: Vec<u64> =
        points["fork_points"].as_array().unwrap().iter().map(|p| p.as_u64().unwrap()).collect();
    // The start, and the boundary after each level the run ran.
    let boundaries = original_events.iter().filter(|e| e["kind"] == "level_finished").count();
    assert!(points.len() > boundaries, "{points:?}");
    let completed_levels: Vec<&Value> =
        original_events.iter().filter(|e| e["kind"] == "level_finished").collect();
    for at in points {
        let out = run(
            &dir,
            &db,
            &[
                "fork",
                &original_id,
                "--at",
                &at.to_string(),
                "--script",
                script.to_str().unwrap(),
                "--json",
            ],
        );
        assert_eq!(out.status.code(), Some(0), "fork at {at}: {}", both(&out));
        let result: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(result["status"], "completed", "fork at {at}: {result:#}");
        let fork_id = result["run_id"].as_str().unwrap();
        let fork_events = events(&dir, &db, fork_id);
        // The copied prefix is the original's, and the fork's first own event says so.
        for (a, b) in original_events.iter().zip(&fork_events).take(usize::try_from(at).unwrap()) {
            assert_eq!((&a["kind"], &a["data"]), (&b["kind"], &b["data"]), "fork at {at}");
        }
        let forked = &fork_events[usize::try_from(at).unwrap()];
        assert_eq!(forked["kind"], "run_forked", "fork at {at}");
        assert_eq!(forked["data"]["at_seq"], at);
        let own = workspace_of(&fork_events);
        assert_ne!(own, workspace_of(&original_events), "the fork has its own workspace");
        // Restored to the snapshot of the last level before the fork point.
        let expected_snapshot = completed_levels
            .iter()
            .filter(|e| e["seq"].as_u64().unwrap() <= at)
            .filter_map(|e| e["data"]["snapshot"].as_str())
            .next_back()
            .map(str::to_owned)
            .unwrap_or_else(|| {
                original_events[0]["data"]["workspace"]["base"].as_str().unwrap().to_owned()
            });
        assert_eq!(forked["data"]["restored"], expected_snapshot.as_str(), "fork at {at}");
        // It ends with the files the original ended with (the script writes the same).
        assert_eq!(files(&own), final_files, "fork at {at}");
        // Its levels after the fork point ran on the restored files: the same verdicts.
        let verdicts = |events: &[Value], from: u64| -> Vec<String> {
            events
                .iter()
                .filter(|e| e["seq"].as_u64().unwrap() > from && e["kind"] == "level_finished")
                .map(|e| format!("{}:{}", e["level_id"], e["data"]["verdict"]))
                .collect()
        };
        assert_eq!(verdicts(&fork_events, at + 1), verdicts(&original_events, at), "fork at {at}");
    }
    // A point inside a level is refused, naming the nearest boundaries.
    let inside = original_events.iter().find(|e| e["kind"] == "prompt_sent").unwrap()["seq"]
        .as_u64()
        .unwrap();
    let out = run(
        &dir,
        &db,
        &["fork", &original_id, "--at", &inside.to_string(), "--script", script.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    assert!(text(&out.stderr).contains("is inside a level's attempt"), "{}", both(&out));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_fork_with_a_new_input_and_a_scratchpad_note_records_them_first() {
    let dir = scratch("replay-fork-edits");
    copy_scenarios(&dir);
    let db = dir.join("runs.db");
    let script = dir.join("scenarios/scripts/quick_qa.yaml");
    let out = start(&dir, &db, "quick_qa", &script, "first");
    let original: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = original["run_id"].as_str().unwrap();
    let fork = run_json(
        &dir,
        &db,
        &[
            "fork",
            id,
            "--at",
            "2",
            "--input",
            "second",
            "--set",
            "scratchpad.tone=\"dry\"",
            "--script",
            script.to_str().unwrap(),
            "--json",
        ],
    );
    let fork_events = events(&dir, &db, fork["run_id"].as_str().unwrap());
    let forked = &fork_events[2];
    assert_eq!(forked["kind"], "run_forked");
    assert_eq!(forked["data"]["input"], "second");
    assert_eq!(forked["data"]["scratchpad"]["tone"], "dry");
    let prompt = fork_events.iter().find(|e| e["kind"] == "prompt_sent").unwrap();
    assert!(prompt["data"]["prompt"].as_str().unwrap().contains("second"), "{prompt:#}");
    // A bad key is refused before anything is created.
    let out = run(
        &dir,
        &db,
        &[
            "fork",
            id,
            "--at",
            "2",
            "--set",
            "scratchpad.bad key=1",
            "--script",
            script.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    // Past the run's end there is no fork point.
    let last = events(&dir, &db, id).len();
    let out = run(
        &dir,
        &db,
        &["fork", id, "--at", &last.to_string(), "--script", script.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("had ended by event"), "{}", both(&out));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn diff_says_where_two_jobs_diverge() {
    let dir = scratch("replay-diff");
    copy_scenarios(&dir);
    let db = dir.join("runs.db");
    let script = dir.join("scenarios/scripts/release_notes.yaml");
    let start = || {
        let out = start(&dir, &db, "release_notes", &script, "a request");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["run_id"].as_str().unwrap().to_owned()
    };
    let (a, b) = (start(), start());
    let out = run(&dir, &db, &["approve", &a, "--by", "tester"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    let out = run(&dir, &db, &["approve", &b, "--reject", "--comment", "again", "--by", "tester"]);
    assert!(out.status.code().is_some());
    let d = run_json(&dir, &db, &["diff", &a, &b, "--json"]);
    assert_eq!(d["same"], false);
    let whats: Vec<&str> =
        d["changes"].as_array().unwrap().iter().map(|c| c["what"].as_str().unwrap()).collect();
    assert!(whats.contains(&"path") && whats.contains(&"cost"), "{d:#}");
    let path = d["changes"].as_array().unwrap().iter().find(|c| c["what"] == "path").unwrap();
    assert_eq!(path["level"], "publish#1", "{d:#}");
    let out = run(&dir, &db, &["diff", &a, &a]);
    assert!(text(&out.stdout).contains("took the same path"), "{}", both(&out));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_store_run_replays_in_place_and_a_changed_scenario_is_reported_where_it_diverges() {
    let dir = scratch("replay-store");
    copy_scenarios(&dir);
    let db = dir.join("runs.db");
    let script = dir.join("scenarios/scripts/research_brief.yaml");
    let v = start_json(&dir, &db, "research_brief", &script, "a request");
    let id = v["run_id"].as_str().unwrap();
    let r = run_json(&dir, &db, &["replay", id, "--json"]);
    assert_eq!(r["matches"], true, "{r:#}");
    // The replay is a run of the database, and says what it replays.
    let replay_events = events(&dir, &db, r["replay_run_id"].as_str().unwrap());
    let replayed = replay_events.iter().find(|e| e["kind"] == "run_replayed").unwrap();
    assert_eq!(replayed["data"]["of_run_id"], id);
    assert_eq!(replayed["data"]["strategy"], "rerun_verifiers");
    // Another version of the scenario, with a stricter threshold on its judge (beside its
    // prompts, in a directory of its own).
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    copy_scenarios(&other);
    let edited = other.join("scenarios/research_brief.yaml");
    let yaml = std::fs::read_to_string(&edited).unwrap();
    let stricter = yaml.replace(
        "          rubric: rigor_v1\n",
        "          rubric: rigor_v1\n          threshold: 0.95\n",
    );
    assert_ne!(stricter, yaml);
    std::fs::write(&edited, stricter).unwrap();
    let out = run(&dir, &db, &["replay", id, "--from-scenario", edited.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    assert!(text(&out.stdout).contains("the replay differs from the recording"), "{}", both(&out));
    // A child run is not a job: its root is named.
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_forecast_gives_the_recorded_runs_own_figures_and_guards_a_run() {
    let dir = scratch("replay-forecast");
    std::fs::create_dir_all(dir.join("scenarios")).unwrap();
    std::fs::write(
        dir.join("scenarios/priced.yaml"),
        "id: priced\nversion: 1\nbudget: {max_cost_usd: 0.0105}\nlevels:\n  - id: one\n    kind: prompt\n    prompt: {inline: \"First {{ input }}\"}\n  - id: two\n    kind: prompt\n    prompt: {inline: \"Second {{ input }}\"}\n    terminal: true\n",
    )
    .unwrap();
    let db = dir.join("runs.db");
    let mut costs = Vec::new();
    let mut first_runs = Vec::new();
    for i in 1..=12u32 {
        let (one, two) = (f64::from(i) * 0.0004, f64::from(13 - i) * 0.0001 + 0.005);
        let script = dir.join(format!("s{i}.yaml"));
        std::fs::write(
            &script,
            format!(
                "levels:\n  one:\n    - text: a\n      usage: {{input_tokens: {i}0, output_tokens: 5}}\n      cost_usd: {one}\n  two:\n    - text: b\n      usage: {{input_tokens: 7, output_tokens: {i}}}\n      cost_usd: {two}\n"
            ),
        )
        .unwrap();
        let v = start_json(&dir, &db, "priced", &script, &format!("job {i}"));
        costs.push(v["totals"]["cost_usd"].as_f64().unwrap());
        if i <= 2 {
            first_runs.push(v["run_id"].as_str().unwrap().to_owned());
        }
        if i == 9 {
            // Nine runs: no p90, and it says how many it has.
            let out = run(&dir, &db, &["forecast", "priced"]);
            assert_eq!(out.status.code(), Some(0), "{}", both(&out));
            assert!(
                text(&out.stdout).contains("a p90 needs 10 jobs and there are 9"),
                "{}",
                both(&out)
            );
            let out = run(
                &dir,
                &db,
                &[
                    "run",
                    "priced",
                    "--max-forecast-usd",
                    "1",
                    "--script",
                    script.to_str().unwrap(),
                    "--input",
                    "x",
                ],
            );
            assert_eq!(out.status.code(), Some(1));
            assert!(text(&out.stderr).contains("has 9 recorded job(s)"), "{}", both(&out));
        }
    }
    // Replays spend nothing and are no jobs: the forecast leaves them out and says so.
    for original in &first_runs {
        let out = run(&dir, &db, &["replay", original]);
        assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    }
    let out = run(&dir, &db, &["forecast", "priced"]);
    assert!(text(&out.stdout).contains("(2 replay(s) left out)"), "{}", both(&out));
    let f = run_json(&dir, &db, &["forecast", "priced", "--json"]);
    let mut sorted = costs.clone();
    sorted.sort_by(f64::total_cmp);
    let rank = |p: usize| sorted[(p * sorted.len()).div_ceil(100) - 1];
    let total = &f["total"]["cost_usd"];
    assert_eq!(f["sample"], 12);
    let close = |a: &Value, b: f64| (a.as_f64().unwrap() - b).abs() < 1e-12;
    assert!(close(&total["p50"], rank(50)), "{total} vs {sorted:?}");
    assert!(close(&total["p90"], rank(90)), "{total} vs {sorted:?}");
    assert!(close(&total["max"], sorted[11]), "{total} vs {sorted:?}");
    // Per level: level `one` cost i × 0.0004.
    let one = f["levels"].as_array().unwrap().iter().find(|l| l["level"] == "one").unwrap();
    assert!(close(&one["spread"]["cost_usd"]["max"], 12.0 * 0.0004), "{one}");
    assert!(close(&one["spread"]["tokens"]["p50"], 65.0), "{one}");
    // The budget: jobs at or over $0.0105.
    let over = costs.iter().filter(|c| **c >= 0.0105).count();
    let cap =
        f["crossings"].as_array().unwrap().iter().find(|c| c["cap"] == "max_cost_usd").unwrap();
    assert_eq!(cap["crossed"], over, "{cap}");
    // The guard: under the p90 refused, over it started.
    let script = dir.join("s1.yaml");
    let guarded = |limit: f64| {
        let limit = limit.to_string();
        let script = script.to_str().unwrap();
        run(
            &dir,
            &db,
            &["run", "priced", "--max-forecast-usd", &limit, "--script", script, "--input", "x"],
        )
    };
    let out = guarded(rank(90) / 2.0);
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    assert!(text(&out.stderr).contains("at p90"), "{}", both(&out));
    let out = guarded(rank(90) * 2.0);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_replay_killed_after_any_event_resumes_and_makes_the_rest_of_the_recorded_decisions() {
    let dir = scratch("replay-kill");
    copy_scenarios(&dir);
    let db = dir.join("runs.db");
    let script = dir.join("scenarios/scripts/release_notes.yaml");
    let out = start(&dir, &db, "release_notes", &script, "a request");
    let recorded: Value = serde_json::from_slice(&out.stdout).unwrap();
    let original = recorded["run_id"].as_str().unwrap().to_owned();
    for d in [&["--reject", "--comment", "name the CSV export first"][..], &[][..]] {
        let mut args = vec!["approve", original.as_str(), "--by", "tester"];
        args.extend_from_slice(d);
        let out = run(&dir, &db, &args);
        assert!(out.status.code().is_some_and(|c| c == 0 || c == 3), "{}", both(&out));
    }
    let log = events(&dir, &db, &original);
    // The replay's events are the recording's with `run_replayed` after the first two: a
    // kill after the first event of each kind, and after every fourth.
    let mut kills: Vec<usize> = (2..=log.len() + 1).filter(|n| n % 4 == 0).collect();
    let mut seen = std::collections::BTreeSet::new();
    for (i, e) in log.iter().enumerate() {
        if seen.insert(e["kind"].as_str().unwrap().to_owned()) {
            kills.push(if i < 2 { i + 1 } else { i + 2 });
        }
    }
    kills.push(3);
    kills.sort_unstable();
    kills.dedup();
    for n in kills.into_iter().filter(|n| *n >= 2) {
        let killed = run_env(
            &dir,
            &db,
            &["replay", &original],
            ("BATON_FAILPOINT_ABORT_AFTER_EVENT", &n.to_string()),
        );
        let list = run(&dir, &db, &["runs", "--json"]);
        let runs: Value = serde_json::from_slice(&list.stdout).unwrap();
        let replay = runs
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["run_id"] != original.as_str())
            .map(|r| r["run_id"].as_str().unwrap().to_owned())
            .max()
            .unwrap_or_else(|| panic!("no replay after a kill at {n}: {}", both(&killed)));
        if killed.status.code() != Some(0) {
            let out = run(&dir, &db, &["resume", &replay]);
            assert_eq!(out.status.code(), Some(0), "kill at {n}: {}", both(&out));
        }
        let diff = run(&dir, &db, &["diff", &original, &replay, "--json"]);
        let d: Value = serde_json::from_slice(&diff.stdout).unwrap();
        assert_eq!(d["first_divergence"], Value::Array(Vec::new()), "kill at {n}: {d:#}");
        assert_eq!(d["same"], true, "kill at {n}: {d:#}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

fn run_env(dir: &Path, db: &Path, args: &[&str], env: (&str, &str)) -> Output {
    let venv = repo().join(".peers/venv/bin");
    let path = format!("{}:{}", venv.display(), std::env::var("PATH").unwrap_or_default());
    baton_in(dir, db).env("PATH", path).env(env.0, env.1).args(args).output().unwrap()
}
