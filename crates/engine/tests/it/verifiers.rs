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
    }
}

fn ctx() -> VerifyContext {
    VerifyContext {
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
