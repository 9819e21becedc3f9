//! The command verifier and the presets against real processes: hangs, forked stragglers,
//! floods, secrets, real projects. Unconfined here (the jail's own tests confine them).

use std::time::{Duration, Instant};

use baton_engine::cancel::CancelToken;
use baton_engine::verifier::VerifyContext;
use baton_jail::Jail;
use baton_scenario::model::{OnFail, Uses, VerifierSpec};
use baton_verifiers::Confined;
use baton_verifiers::command::{CommandVerifier, PresetVerifier};
use serde_json::json;

fn spec(argv: &[&str], timeout_s: f64) -> VerifierSpec {
    VerifierSpec {
        name: "check".to_owned(),
        uses: Uses::Command,
        params: json!({"argv": argv}).as_object().expect("an object").clone(),
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
    let out = CommandVerifier
        .verify(&spec(&["sleep", "30"], 0.5), &ctx(), &Jail::off(), &CancelToken::new())
        .await;
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
        .verify(&spec(&["sh", "-c", &script], 20.0), &ctx(), &Jail::off(), &CancelToken::new())
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
            &Jail::off(),
            &CancelToken::new(),
        )
        .await;
    assert!(out.passed, "{:?}", out.reasons);
    assert!(out.details["stdout_tail"].as_str().expect("a tail").len() <= 4096);
    assert!(out.details["stderr_tail"].as_str().expect("a tail").contains("tail-marker"));
    assert!(t.elapsed() < Duration::from_secs(30));
}

#[tokio::test]
async fn the_environment_is_scrubbed_of_secrets() {
    // The test runner sets CARGO_MANIFEST_DIR in this process's environment; the
    // verifier's child must not inherit it (nor any API key), but keeps PATH.
    assert!(std::env::var("CARGO_MANIFEST_DIR").is_ok(), "the probe variable must be set here");
    let probe = spec(&["sh", "-c", "test -z \"$CARGO_MANIFEST_DIR\" && test -n \"$PATH\""], 10.0);
    let out = CommandVerifier.verify(&probe, &ctx(), &Jail::off(), &CancelToken::new()).await;
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
    let out =
        CommandVerifier.verify(&spec(&["sleep", "30"], 60.0), &ctx(), &Jail::off(), &cancel).await;
    assert!(!out.passed && out.reasons[0] == "cancelled");
    assert!(t.elapsed() < Duration::from_secs(3));
}

fn preset(uses: Uses) -> VerifierSpec {
    let mut s = spec(&[], 300.0);
    s.uses = uses;
    s.params = serde_json::Map::new();
    s
}

static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn workspace(files: &[(&str, &str)]) -> VerifyContext {
    let dir = std::env::temp_dir().join(format!(
        "baton-preset-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    for (path, text) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().expect("a parent")).expect("the directory is made");
        std::fs::write(p, text).expect("the file is written");
    }
    VerifyContext { workspace: dir, ..ctx() }
}

const CARGO_TOML: &str = "[package]\nname = \"probe\"\nversion = \"0.1.0\"\nedition = \"2021\"\n";

#[tokio::test]
async fn the_build_preset_builds_a_cargo_project_and_reports_a_broken_one() {
    let good = workspace(&[
        ("Cargo.toml", CARGO_TOML),
        ("src/main.rs", "fn main() { println!(\"hi\"); }\n"),
    ]);
    let out = PresetVerifier(Uses::Build)
        .verify(&preset(Uses::Build), &good, &Jail::off(), &CancelToken::new())
        .await;
    assert!(out.passed, "{:?} {}", out.reasons, out.details);
    assert_eq!(out.details["project"], "cargo");
    let bad = workspace(&[
        ("Cargo.toml", CARGO_TOML),
        ("src/main.rs", "fn main() { let x: u8 = \"no\"; }\n"),
    ]);
    let out = PresetVerifier(Uses::Build)
        .verify(&preset(Uses::Build), &bad, &Jail::off(), &CancelToken::new())
        .await;
    assert!(!out.passed);
    assert!(
        out.details["stderr_tail"].as_str().expect("a tail").contains("mismatched types"),
        "{}",
        out.details
    );
    let _ = std::fs::remove_dir_all(&good.workspace);
    let _ = std::fs::remove_dir_all(&bad.workspace);
}

#[tokio::test]
async fn the_build_preset_compiles_a_python_project() {
    let good = workspace(&[("requirements.txt", ""), ("app.py", "print('hi')\n")]);
    let out = PresetVerifier(Uses::Build)
        .verify(&preset(Uses::Build), &good, &Jail::off(), &CancelToken::new())
        .await;
    assert!(out.passed, "{:?} {}", out.reasons, out.details);
    let bad =
        workspace(&[("pyproject.toml", "[project]\nname = 'x'\n"), ("app.py", "def broken(:\n")]);
    let out = PresetVerifier(Uses::Build)
        .verify(&preset(Uses::Build), &bad, &Jail::off(), &CancelToken::new())
        .await;
    assert!(!out.passed);
    assert_eq!(out.details["project"], "python");
    let none = workspace(&[("notes.txt", "")]);
    let out = PresetVerifier(Uses::Build)
        .verify(&preset(Uses::Build), &none, &Jail::off(), &CancelToken::new())
        .await;
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
    let out = CommandVerifier.verify(&s, &ctx(), &Jail::off(), &CancelToken::new()).await;
    assert!(out.passed, "{:?}", out.reasons);
    assert_eq!(out.details["stdout_tail"], "ok\n");
}

#[tokio::test]
async fn a_verifier_in_the_jail_says_why_it_cannot_run_and_marks_what_ran_unconfined() {
    use baton_engine::verifier::Verifier;
    use baton_verifiers::InJail;
    let scratch = std::env::temp_dir().join(format!("baton-broken-jail-{}", std::process::id()));
    let broken = Jail::lazy(baton_jail::Settings {
        bwrap: Some("/nonexistent/bwrap".into()),
        init: "/nonexistent/baton".into(),
        run_as: (65534, 65534),
        read_only: Vec::new(),
        path: None,
        hidden: Vec::new(),
        data: None,
        protected: Vec::new(),
        scratch,
        limits: baton_jail::Limits::default(),
    });
    let refused = InJail::new(std::sync::Arc::new(broken), CommandVerifier);
    let why = refused.refusal().expect("a jail without bwrap cannot be set up");
    assert!(why.contains("/nonexistent/bwrap"), "{why}");
    let off = InJail::new(std::sync::Arc::new(Jail::off()), CommandVerifier);
    assert_eq!(off.refusal(), None, "--no-jail runs, unconfined");
    let out = Verifier::verify(&off, &spec(&["true"], 10.0), &ctx(), &CancelToken::new()).await;
    assert!(out.passed, "{:?}", out.reasons);
    assert_eq!(out.details["jail"], "off", "{}", out.details);
    assert_eq!(out.details["exit_code"], 0, "{}", out.details);
}
