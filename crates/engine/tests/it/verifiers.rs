//! The command verifier against real processes: hangs, forked stragglers, floods, secrets.

use std::time::{Duration, Instant};

use baton_engine::cancel::CancelToken;
use baton_engine::verifier::{CommandVerifier, Verifier, VerifyContext};
use baton_scenario::model::{OnFail, Uses, VerifierSpec};
use serde_json::json;

fn spec(argv: &[&str], timeout_s: f64) -> VerifierSpec {
    VerifierSpec {
        name: "check".to_owned(),
        uses: Uses::Command,
        params: json!({"argv": argv}).as_object().unwrap().clone(),
        weight: 1.0,
        on_fail: OnFail::Fail,
        max_retries: 0,
        timeout_s: Some(timeout_s),
        rubric: None,
        schema: None,
        config_text: None,
    }
}

fn ctx() -> VerifyContext {
    VerifyContext {
        jail: std::sync::Arc::new(baton_jail::Jail::off()),
        workspace: std::env::temp_dir(),
        input: String::new(),
        output: String::new(),
        parsed: None,
        scratchpad: serde_json::Map::new(),
    }
}

fn running(marker: &str) -> bool {
    std::process::Command::new("pgrep")
        .args(["-f", marker])
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false)
}

#[tokio::test]
async fn a_hanging_command_is_killed_at_its_timeout() {
    let t = Instant::now();
    let out =
        CommandVerifier.verify(&spec(&["sleep", "30"], 0.5), &ctx(), &CancelToken::new()).await;
    assert!(!out.passed);
    assert!(out.reasons[0].contains("timed out"), "{:?}", out.reasons);
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
}

#[tokio::test]
async fn a_forked_child_that_hangs_dies_with_its_parent() {
    let marker = format!("sleep 3{}", std::process::id() % 1000);
    let script = format!("({marker} &) ; echo forked; exit 2");
    let t = Instant::now();
    let out = CommandVerifier
        .verify(&spec(&["sh", "-c", &script], 20.0), &ctx(), &CancelToken::new())
        .await;
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "the straggler held the pipes for {:?}",
        t.elapsed()
    );
    assert!(!out.passed);
    assert_eq!(out.details["exit_code"], 2);
    assert_eq!(out.details["stdout_tail"], "forked\n");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!running(&marker), "the forked child is still running");
}

#[tokio::test]
async fn a_flood_of_output_is_capped() {
    let t = Instant::now();
    let out = CommandVerifier
        .verify(
            &spec(
                &["sh", "-c", "head -c 50000000 /dev/zero | tr '\\0' x; echo tail-marker >&2"],
                60.0,
            ),
            &ctx(),
            &CancelToken::new(),
        )
        .await;
    assert!(out.passed, "{:?}", out.reasons);
    assert!(out.details["stdout_tail"].as_str().unwrap().len() <= 4096);
    assert!(out.details["stderr_tail"].as_str().unwrap().contains("tail-marker"));
    assert!(t.elapsed() < Duration::from_secs(30));
}

#[tokio::test]
async fn the_environment_is_scrubbed_of_secrets() {
    // The test runner sets CARGO_MANIFEST_DIR in this process's environment; the
    // verifier's child must not inherit it (nor any API key), but keeps PATH.
    assert!(std::env::var("CARGO_MANIFEST_DIR").is_ok(), "the probe variable must be set here");
    let probe = spec(&["sh", "-c", "test -z \"$CARGO_MANIFEST_DIR\" && test -n \"$PATH\""], 10.0);
    let out = CommandVerifier.verify(&probe, &ctx(), &CancelToken::new()).await;
    assert!(out.passed, "{:?} {}", out.reasons, out.details);
}

#[tokio::test]
async fn a_cancel_stops_the_command() {
    let cancel = CancelToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        c2.cancel();
    });
    let t = Instant::now();
    let out = CommandVerifier.verify(&spec(&["sleep", "30"], 60.0), &ctx(), &cancel).await;
    assert!(!out.passed && out.reasons[0] == "cancelled");
    assert!(t.elapsed() < Duration::from_secs(3));
}

fn preset(uses: Uses) -> VerifierSpec {
    let mut s = spec(&[], 300.0);
    s.uses = uses;
    s.params = serde_json::Map::new();
    s
}

fn workspace(files: &[(&str, &str)]) -> VerifyContext {
    let dir = std::env::temp_dir().join(format!("baton-preset-{}", uuid::Uuid::now_v7()));
    for (path, text) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    VerifyContext { workspace: dir, ..ctx() }
}

const CARGO_TOML: &str = "[package]\nname = \"probe\"\nversion = \"0.1.0\"\nedition = \"2021\"\n";

#[tokio::test]
async fn the_build_preset_builds_a_cargo_project_and_reports_a_broken_one() {
    use baton_engine::verifier::PresetVerifier;
    let good = workspace(&[
        ("Cargo.toml", CARGO_TOML),
        ("src/main.rs", "fn main() { println!(\"hi\"); }\n"),
    ]);
    let out =
        PresetVerifier(Uses::Build).verify(&preset(Uses::Build), &good, &CancelToken::new()).await;
    assert!(out.passed, "{:?} {}", out.reasons, out.details);
    assert_eq!(out.details["project"], "cargo");
    let bad = workspace(&[
        ("Cargo.toml", CARGO_TOML),
        ("src/main.rs", "fn main() { let x: u8 = \"no\"; }\n"),
    ]);
    let out =
        PresetVerifier(Uses::Build).verify(&preset(Uses::Build), &bad, &CancelToken::new()).await;
    assert!(!out.passed);
    assert!(
        out.details["stderr_tail"].as_str().unwrap().contains("mismatched types"),
        "{}",
        out.details
    );
    let _ = std::fs::remove_dir_all(&good.workspace);
    let _ = std::fs::remove_dir_all(&bad.workspace);
}

#[tokio::test]
async fn the_build_preset_compiles_a_python_project() {
    use baton_engine::verifier::PresetVerifier;
    let good = workspace(&[("requirements.txt", ""), ("app.py", "print('hi')\n")]);
    let out =
        PresetVerifier(Uses::Build).verify(&preset(Uses::Build), &good, &CancelToken::new()).await;
    assert!(out.passed, "{:?} {}", out.reasons, out.details);
    let bad =
        workspace(&[("pyproject.toml", "[project]\nname = 'x'\n"), ("app.py", "def broken(:\n")]);
    let out =
        PresetVerifier(Uses::Build).verify(&preset(Uses::Build), &bad, &CancelToken::new()).await;
    assert!(!out.passed);
    assert_eq!(out.details["project"], "python");
    let none = workspace(&[("notes.txt", "")]);
    let out =
        PresetVerifier(Uses::Build).verify(&preset(Uses::Build), &none, &CancelToken::new()).await;
    assert!(
        !out.passed && out.reasons[0].contains("give the verifier an `argv`"),
        "{:?}",
        out.reasons
    );
    for w in [good, bad, none] {
        let _ = std::fs::remove_dir_all(&w.workspace);
    }
}

#[tokio::test]
async fn shell_true_runs_one_command_line() {
    let mut s = spec(&["test", "1", "-eq", "1", "&&", "echo", "ok"], 10.0);
    s.params.insert("shell".to_owned(), json!(true));
    let out = CommandVerifier.verify(&s, &ctx(), &CancelToken::new()).await;
    assert!(out.passed, "{:?}", out.reasons);
    assert_eq!(out.details["stdout_tail"], "ok\n");
}

#[tokio::test]
async fn race_mode_takes_the_first_conclusive_result_and_kills_the_rest() {
    let marker = format!("sleep 4{}.5", std::process::id() % 1000);
    let yaml = format!(
        r#"id: racing
version: 1
levels:
  - id: checks
    kind: verifier
    mode: race
    terminal: true
    verifiers:
      - name: slow
        uses: command
        params: {{argv: ["sh", "-c", "({marker} &); {marker}"]}}
      - name: fast
        uses: command
        params: {{argv: ["true"]}}
"#
    );
    let scenario = crate::scenario(&yaml);
    let engine = crate::engine(baton_engine::model::ScriptedModel::default());
    let run_id = baton_engine::Engine::new_run_id();
    let t = Instant::now();
    let outcome = engine.run(&run_id, &scenario, "x", serde_json::Map::new(), None).await.unwrap();
    assert_eq!(outcome, baton_engine::Outcome::Finished(baton_engine::Status::Completed));
    assert!(t.elapsed() < Duration::from_secs(10), "the race waited for the slow one");
    let state = engine.state(&run_id).await.unwrap();
    let checks = &state.levels["checks"];
    assert_eq!(checks.verdict.as_deref(), Some("PASS"));
    assert!(checks.verifiers["fast"].passed);
    let slow = &checks.verifiers["slow"];
    assert_eq!(slow.details["race_lost_to"], "fast", "{slow:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!running(&marker), "the losing verifier's processes were killed");
}

#[tokio::test]
async fn serial_mode_leaves_the_rest_out_after_a_failure_neither_passed_nor_failed() {
    let scenario = crate::scenario(
        r#"id: serially
version: 1
levels:
  - id: checks
    kind: verifier
    mode: serial
    terminal: true
    verifiers:
      - {name: first, uses: command, params: {argv: ["true"]}}
      - {name: broken, uses: command, params: {argv: ["false"]}}
      - {name: lint, uses: command, params: {argv: ["true"]}}
      - {name: types, uses: command, params: {argv: ["true"]}}
"#,
    );
    let engine = crate::engine(baton_engine::model::ScriptedModel::default());
    let run_id = baton_engine::Engine::new_run_id();
    engine.run(&run_id, &scenario, "x", serde_json::Map::new(), None).await.unwrap();
    let state = engine.state(&run_id).await.unwrap();
    let checks = &state.levels["checks"];
    assert_eq!(checks.verdict.as_deref(), Some("FAIL"));
    let v = &checks.verifiers;
    assert!(v["first"].passed && !v["first"].not_run());
    assert!(!v["broken"].passed && !v["broken"].not_run());
    for name in ["lint", "types"] {
        assert!(!v[name].passed && v[name].not_run(), "{name}: {:?}", v[name]);
    }
    // One failed of the two that ran; the two left out are named as not run, not failed.
    let output = &checks.output;
    assert!(
        output.starts_with("1 of 2 verifiers failed (broken); 2 not run after it (lint, types)"),
        "{output}"
    );
    assert!(!output.contains("- lint"), "no feedback for a verifier that did not run: {output}");
}
