//! A verifier level's modes against real processes: race and serial.

use std::time::{Duration, Instant};

fn running(marker: &str) -> bool {
    std::process::Command::new("pgrep")
        .args(["-f", marker])
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false)
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
