//! The `semgrep` and `gitleaks` verifiers against the real tools, in real temporary
//! workspaces.
//!
//! The tools are the pinned ones `scripts/install-scanners` puts under `.peers/` in the
//! checkout; a test whose tool is missing fails and says to run that script. The
//! verifiers find their tool through `BATON_SEMGREP` / `BATON_GITLEAKS`, and a test cannot
//! set a variable in its own process without unsafe code, so each test runs its body
//! again in a child process of this test binary with the variables set (see `child`).

use std::path::{Path, PathBuf};
use std::process::Command;

use baton_engine::cancel::CancelToken;
use baton_engine::event::VerifierFinished;
use baton_engine::verifier::VerifyContext;
use baton_jail::Jail;
use baton_scenario::model::{OnFail, Uses, VerifierSpec};
use baton_verifiers::Confined;
use baton_verifiers::scanners::{Gitleaks, Semgrep};
use serde_json::{Value, json};

/// Set in the child process that runs a test's body.
const CHILD: &str = "BATON_SCANNERS_TEST_CHILD";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The installed tool at `relative` (from the repository root), or a failure that says how
/// to install it.
fn installed(tool: &str, relative: &str) -> String {
    let path = repo_root().join(relative);
    assert!(
        path.is_file(),
        "{tool} is not installed at {}: run scripts/install-scanners (from the repository root) first",
        path.display()
    );
    path.to_string_lossy().into_owned()
}

fn semgrep_bin() -> String {
    installed("semgrep", ".peers/semgrep/bin/semgrep")
}

fn gitleaks_bin() -> String {
    installed("gitleaks", ".peers/gitleaks/usr/bin/gitleaks")
}

/// In the test process: runs the test `name` again in a child process with `vars` set,
/// fails when the child fails, and returns false (the test is done). In the child: returns
/// true, and the caller runs the test's body.
fn child(name: &str, vars: &[(&str, String)]) -> bool {
    if std::env::var_os(CHILD).is_some() {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(exe)
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env(CHILD, "1")
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("the test binary runs again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the test failed in its child process:\n{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "the child ran no test named {name}:\n{stdout}");
    false
}

/// Runs the test's body in a child with both installed scanners named by their variables.
fn with_scanners(name: &str) -> bool {
    let vars = [("BATON_SEMGREP", semgrep_bin()), ("BATON_GITLEAKS", gitleaks_bin())];
    child(name, &vars)
}

fn spec(uses: Uses, params: Value, config_text: Option<&str>) -> VerifierSpec {
    VerifierSpec {
        name: uses.as_str().to_owned(),
        uses,
        params: match params {
            Value::Object(map) => map,
            _ => serde_json::Map::new(),
        },
        weight: 1.0,
        on_fail: OnFail::Fail,
        max_retries: 0,
        timeout_s: Some(300.0),
        rubric: None,
        schema: None,
        config_text: config_text.map(Into::into),
    }
}

/// A workspace holding `files` (relative path, text).
fn workspace(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("the parent is made");
        std::fs::write(&path, text).expect("the file is written");
    }
    dir
}

async fn run(verifier: &dyn Confined, spec: &VerifierSpec, dir: &Path) -> VerifierFinished {
    let ctx = VerifyContext {
        workspace: dir.to_path_buf(),
        input: String::new(),
        output: String::new(),
        parsed: None,
        scratchpad: serde_json::Map::new(),
    };
    verifier.verify(spec, &ctx, &Jail::off(), &CancelToken::new()).await
}

/// The scenario's own rules file.
fn security_rules() -> String {
    std::fs::read_to_string(repo_root().join("scenarios/rules/security.yaml"))
        .expect("scenarios/rules/security.yaml is readable")
}

fn semgrep_spec(params: Value, rules: &str) -> VerifierSpec {
    spec(Uses::Semgrep, params, Some(rules))
}

const EVAL_APP: &str = "import sys\n\ndef run(user_input):\n    return eval(user_input)\n";
const CLEAN_APP: &str = "import json\n\ndef run(user_input):\n    return json.loads(user_input)\n";

// ---- semgrep ---------------------------------------------------------------------------

#[tokio::test]
async fn semgrep_finds_a_planted_eval_by_file_line_and_rule() {
    if !with_scanners("semgrep_finds_a_planted_eval_by_file_line_and_rule") {
        return;
    }
    let dir = workspace(&[
        ("app/main.py", EVAL_APP),
        // Baton's own directory is never scanned.
        (".baton/snapshot/main.py", EVAL_APP),
    ]);
    let spec = semgrep_spec(json!({"rules": "rules/security.yaml"}), &security_rules());
    let out = run(&Semgrep, &spec, dir.path()).await;

    assert!(!out.passed, "{out:?}");
    assert_eq!(out.score, Some(0.0));
    assert_eq!(
        out.reasons,
        vec![
            "app/main.py:4: [ERROR] python-eval-exec: eval/exec runs arbitrary code. If any \
             part of the argument can come from a user, this is code injection; parse the \
             input (ast.literal_eval, json.loads) instead."
        ],
    );
    assert_eq!(out.details["findings_total"], 1);
    assert_eq!(out.details["by_severity"], json!({"ERROR": 1}));
    assert_eq!(
        out.details["findings"],
        json!([{"path": "app/main.py", "line": 4, "rule": "python-eval-exec", "severity": "ERROR"}])
    );
    assert_eq!(out.details["threshold"], "INFO");
}

#[tokio::test]
async fn semgrep_passes_a_clean_file() {
    if !with_scanners("semgrep_passes_a_clean_file") {
        return;
    }
    let dir = workspace(&[("app/main.py", CLEAN_APP)]);
    let spec = semgrep_spec(json!({"rules": "rules/security.yaml"}), &security_rules());
    let out = run(&Semgrep, &spec, dir.path()).await;

    assert!(out.passed, "{out:?}");
    assert_eq!(out.score, Some(1.0));
    assert!(out.reasons.is_empty(), "{:?}", out.reasons);
    assert_eq!(out.details["findings_total"], 0);
    assert_eq!(out.details["scanned_files"], 1);
    assert_eq!(out.details["allow_suppressions"], false);
}

#[tokio::test]
async fn semgrep_severity_threshold_drops_findings_below_it() {
    if !with_scanners("semgrep_severity_threshold_drops_findings_below_it") {
        return;
    }
    let rules = "rules:\n  - id: no-print\n    languages: [python]\n    severity: WARNING\n    \
                 message: print writes to stdout\n    pattern: print(...)\n";
    let dir = workspace(&[("main.py", "print('hello')\n")]);

    let strict = semgrep_spec(json!({"rules": "r.yaml", "severity": "ERROR"}), rules);
    let out = run(&Semgrep, &strict, dir.path()).await;
    assert!(out.passed, "{out:?}");
    assert_eq!(out.details["findings_total"], 1, "the finding is still counted");
    assert_eq!(out.details["findings_counted"], 0);
    assert_eq!(out.details["by_severity"], json!({"WARNING": 1}));

    let warning = semgrep_spec(json!({"rules": "r.yaml", "severity": "WARNING"}), rules);
    let out = run(&Semgrep, &warning, dir.path()).await;
    assert!(!out.passed, "{out:?}");
    assert_eq!(out.reasons, vec!["main.py:1: [WARNING] no-print: print writes to stdout"]);
}

#[tokio::test]
async fn semgrep_scans_only_the_given_paths_and_refuses_paths_outside() {
    if !with_scanners("semgrep_scans_only_the_given_paths_and_refuses_paths_outside") {
        return;
    }
    let dir = workspace(&[("src/ok.py", CLEAN_APP), ("scripts/bad.py", EVAL_APP)]);
    let rules = security_rules();

    let out =
        run(&Semgrep, &semgrep_spec(json!({"rules": "r", "paths": ["src"]}), &rules), dir.path())
            .await;
    assert!(out.passed, "{out:?}");

    let out =
        run(&Semgrep, &semgrep_spec(json!({"rules": "r", "paths": ["../x"]}), &rules), dir.path())
            .await;
    assert!(!out.passed);
    assert_eq!(out.score, None, "bad input gives no verdict: {out:?}");
    assert!(
        out.reasons[0].contains("`../x`") && out.reasons[0].contains("not inside the workspace")
    );

    let out = run(
        &Semgrep,
        &semgrep_spec(json!({"rules": "r", "paths": [".baton"]}), &rules),
        dir.path(),
    )
    .await;
    assert_eq!(out.score, None);
    assert!(out.reasons[0].contains("Baton's own directory"), "{:?}", out.reasons);
}

#[tokio::test]
async fn semgrep_with_broken_rules_is_unavailable_with_semgreps_error() {
    if !with_scanners("semgrep_with_broken_rules_is_unavailable_with_semgreps_error") {
        return;
    }
    let rules = "rules:\n  - id: broken\n    languages: [python]\n    severity: ERROR\n    \
                 message: x\n    pattern: eval(\n";
    let dir = workspace(&[("main.py", EVAL_APP)]);
    let out = run(&Semgrep, &semgrep_spec(json!({"rules": "r.yaml"}), rules), dir.path()).await;

    assert!(!out.passed);
    assert_eq!(out.score, None, "{out:?}");
    assert!(out.reasons[0].starts_with("semgrep exited with 2: "), "{:?}", out.reasons);
    assert!(out.reasons[0].contains("Rule parse error"), "{:?}", out.reasons);
    assert_eq!(out.details["errors"][0]["level"], "error");
}

// ---- gitleaks --------------------------------------------------------------------------

// Made at run time, so that a scan of this repository finds no leak in this file.
fn aws_key() -> String {
    format!("AKIA{}", "Q3EGRTZB7XKPW4NM")
}

fn github_token() -> String {
    format!("ghp_{}", "R8f3kLmN2pQxV7yZ1aB4cD6eF9gH0iJ5kT2u")
}

#[tokio::test]
async fn gitleaks_finds_planted_keys_without_repeating_them() {
    if !with_scanners("gitleaks_finds_planted_keys_without_repeating_them") {
        return;
    }
    let (key, token) = (aws_key(), github_token());
    let settings = format!("aws_key = \"{key}\"\ntoken = \"{token}\"\n");
    let dir = workspace(&[
        ("README.md", "# a project\n"),
        ("src/settings.py", &settings),
        (".baton/git/objects/leak", &settings),
        // A workspace cannot turn the scan off with its own configuration.
        (".gitleaks.toml", "[allowlist]\npaths = ['''.*''']\n"),
    ]);
    let out = run(&Gitleaks, &spec(Uses::Gitleaks, json!({}), None), dir.path()).await;

    assert!(!out.passed, "{out:?}");
    assert_eq!(out.score, Some(0.0));
    assert_eq!(
        out.reasons,
        vec![
            "src/settings.py:1: aws-access-token (AWS)",
            "src/settings.py:2: github-pat (GitHub Personal Access Token)",
        ]
    );
    assert_eq!(out.details["findings_total"], 2);
    assert_eq!(out.details["config"], "default");
    let serialized = serde_json::to_string(&out).expect("the outcome serializes");
    for secret in [&key, &token, &key[4..], &token[4..]] {
        assert!(!serialized.contains(secret), "the secret leaked: {serialized}");
    }
}

#[tokio::test]
async fn gitleaks_passes_a_clean_directory() {
    if !with_scanners("gitleaks_passes_a_clean_directory") {
        return;
    }
    let dir = workspace(&[("README.md", "# a project\n"), ("src/main.py", CLEAN_APP)]);
    let out = run(&Gitleaks, &spec(Uses::Gitleaks, json!({}), None), dir.path()).await;

    assert!(out.passed, "{out:?}");
    assert_eq!(out.score, Some(1.0));
    assert!(out.reasons.is_empty());
    assert_eq!(out.details["findings_total"], 0);
    assert_eq!(out.details["allow_suppressions"], false);
    assert_eq!(out.details["neutralised"], json!({"inline_allows": 0, "ignore_files": 0}));
}

#[tokio::test]
async fn gitleaks_uses_the_scenarios_config_and_paths() {
    if !with_scanners("gitleaks_uses_the_scenarios_config_and_paths") {
        return;
    }
    let config = "title = \"test\"\n\n[[rules]]\nid = \"baton-test-token\"\n\
                  description = \"A Baton test token\"\nregex = '''BATONTEST_[A-Z0-9]{12}'''\n";
    let planted = format!("BATONTEST_{}", "Q7W3E9R1T5Y2");
    let dir = workspace(&[
        ("notes/todo.txt", &format!("remember {planted}\n")),
        // Not a leak for this configuration, which replaces gitleaks' own rules.
        ("notes/aws.txt", &format!("key = \"{}\"\n", aws_key())),
        ("other/also.txt", &format!("{planted}\n")),
        (".baton/leak.txt", &format!("{planted}\n")),
    ]);

    let whole = spec(Uses::Gitleaks, json!({"config": "c.toml"}), Some(config));
    let out = run(&Gitleaks, &whole, dir.path()).await;
    assert!(!out.passed, "{out:?}");
    assert_eq!(
        out.reasons,
        vec![
            "notes/todo.txt:1: baton-test-token (A Baton test token)",
            "other/also.txt:1: baton-test-token (A Baton test token)",
        ],
        "findings under .baton/ are dropped even with the scenario's own configuration"
    );
    assert_eq!(out.details["config"], "scenario");
    let serialized = serde_json::to_string(&out).expect("the outcome serializes");
    assert!(!serialized.contains(&planted), "the secret leaked: {serialized}");

    let only_notes =
        spec(Uses::Gitleaks, json!({"config": "c.toml", "paths": ["notes"]}), Some(config));
    let out = run(&Gitleaks, &only_notes, dir.path()).await;
    assert_eq!(out.reasons, vec!["notes/todo.txt:1: baton-test-token (A Baton test token)"]);

    let clean = spec(Uses::Gitleaks, json!({"paths": ["notes/todo.txt"]}), None);
    let out = run(&Gitleaks, &clean, dir.path()).await;
    assert!(out.passed, "the default rules know no BATONTEST token: {out:?}");
}

// ---- suppressions written by the model ---------------------------------------------------

#[tokio::test]
async fn gitleaks_reports_secrets_the_workspace_tries_to_silence_unless_allowed() {
    if !with_scanners("gitleaks_reports_secrets_the_workspace_tries_to_silence_unless_allowed") {
        return;
    }
    let (key, token) = (aws_key(), github_token());
    let dir = workspace(&[
        ("src/allowed.py", &format!("aws_key = \"{key}\"  # gitleaks:allow\n")),
        ("src/ignored.py", &format!("token = \"{token}\"\n")),
        // The fingerprint of the finding above; its second line hides a secret of its own.
        (".gitleaksignore", &format!("src/ignored.py:github-pat:1\n{token}\n")),
        // Only the workspace's own `.baton/` is Baton's; this one is the model's.
        ("src/.baton/hidden.py", &format!("aws_key = \"{key}\"\n")),
        (".baton/git/objects/leak", &format!("aws_key = \"{key}\"\n")),
    ]);

    let out = run(&Gitleaks, &spec(Uses::Gitleaks, json!({}), None), dir.path()).await;
    assert!(!out.passed, "{out:?}");
    assert_eq!(
        out.reasons,
        vec![
            ".gitleaksignore:2: github-pat (GitHub Personal Access Token)",
            "src/.baton/hidden.py:1: aws-access-token (AWS)",
            "src/allowed.py:1: aws-access-token (AWS)",
            "src/ignored.py:1: github-pat (GitHub Personal Access Token)",
        ]
    );
    assert_eq!(out.details["allow_suppressions"], false);
    assert_eq!(out.details["neutralised"], json!({"inline_allows": 1, "ignore_files": 1}));
    let serialized = serde_json::to_string(&out).expect("the outcome serializes");
    assert!(!serialized.contains(&key[4..]) && !serialized.contains(&token[4..]), "{serialized}");

    let allowing = spec(Uses::Gitleaks, json!({"allow_suppressions": true}), None);
    let out = run(&Gitleaks, &allowing, dir.path()).await;
    assert!(!out.passed, "{out:?}");
    assert_eq!(
        out.reasons,
        vec![
            ".gitleaksignore:2: github-pat (GitHub Personal Access Token)",
            "src/.baton/hidden.py:1: aws-access-token (AWS)",
        ],
        "with the opt-in, the comment and the ignore file suppress their findings"
    );
    assert_eq!(out.details["allow_suppressions"], true);
    assert!(out.details.get("neutralised").is_none(), "{:?}", out.details);
}

#[tokio::test]
async fn gitleaks_ignores_a_gitleaksignore_in_a_scanned_directory() {
    if !with_scanners("gitleaks_ignores_a_gitleaksignore_in_a_scanned_directory") {
        return;
    }
    let key = aws_key();
    let dir = workspace(&[
        ("src/app.py", &format!("aws_key = \"{key}\"\n")),
        // gitleaks reads the ignore file of the directory it scans.
        ("src/.gitleaksignore", "src/app.py:aws-access-token:1\n"),
    ]);
    let only_src = spec(Uses::Gitleaks, json!({"paths": ["src"]}), None);
    let out = run(&Gitleaks, &only_src, dir.path()).await;
    assert_eq!(out.reasons, vec!["src/app.py:1: aws-access-token (AWS)"], "{out:?}");

    let allowing =
        spec(Uses::Gitleaks, json!({"paths": ["src"], "allow_suppressions": true}), None);
    let out = run(&Gitleaks, &allowing, dir.path()).await;
    assert!(out.passed, "the opt-in lets the ignore file work: {out:?}");
}

#[tokio::test]
async fn semgrep_reports_findings_the_workspace_tries_to_silence_unless_allowed() {
    if !with_scanners("semgrep_reports_findings_the_workspace_tries_to_silence_unless_allowed") {
        return;
    }
    let dir = workspace(&[
        ("app/nosem.py", "def run(user_input):\n    return eval(user_input)  # nosemgrep\n"),
        ("app/listed.py", EVAL_APP),
        ("tests/helper.py", EVAL_APP),
        (".semgrepignore", "app/listed.py\ntests/\n"),
        ("app/untracked.py", EVAL_APP),
        (".gitignore", "app/untracked.py\n"),
        // Only the workspace's own `.baton/` is Baton's; this one is the model's.
        ("lib/.baton/x.py", EVAL_APP),
        (".baton/snapshot/main.py", EVAL_APP),
    ]);
    // A git repository, so that semgrep would honour the `.gitignore`.
    let git = Command::new("git").args(["init", "-q"]).current_dir(dir.path()).status();
    assert!(git.is_ok_and(|s| s.success()), "git init works");

    let params = json!({"rules": "rules/security.yaml"});
    let out = run(&Semgrep, &semgrep_spec(params, &security_rules()), dir.path()).await;
    assert!(!out.passed, "{out:?}");
    let mut paths: Vec<&str> = out.details["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter_map(|f| f["path"].as_str())
        .collect();
    paths.sort_unstable();
    assert_eq!(
        paths,
        vec![
            "app/listed.py",
            "app/nosem.py",
            "app/untracked.py",
            "lib/.baton/x.py",
            "tests/helper.py"
        ],
        "{out:?}"
    );
    assert_eq!(out.details["allow_suppressions"], false);

    let params = json!({"rules": "rules/security.yaml", "allow_suppressions": true});
    let out = run(&Semgrep, &semgrep_spec(params, &security_rules()), dir.path()).await;
    assert!(!out.passed, "{out:?}");
    let paths: Vec<&str> = out.details["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter_map(|f| f["path"].as_str())
        .collect();
    assert_eq!(
        paths,
        vec!["lib/.baton/x.py"],
        "with the opt-in, the comment and the ignore files suppress their findings: {out:?}"
    );
    assert_eq!(out.details["allow_suppressions"], true);
}

// ---- missing tools ---------------------------------------------------------------------

#[tokio::test]
async fn a_missing_semgrep_is_unavailable_with_an_install_hint() {
    let vars = [("BATON_SEMGREP", "/nonexistent/semgrep".to_owned())];
    if !child("a_missing_semgrep_is_unavailable_with_an_install_hint", &vars) {
        return;
    }
    let dir = workspace(&[("main.py", EVAL_APP)]);
    let out =
        run(&Semgrep, &semgrep_spec(json!({"rules": "r"}), &security_rules()), dir.path()).await;

    assert!(!out.passed);
    assert_eq!(out.score, None, "{out:?}");
    let reason = &out.reasons[0];
    assert!(reason.contains("BATON_SEMGREP is set to `/nonexistent/semgrep`"), "{reason}");
    assert!(reason.contains("pip install semgrep"), "{reason}");
    assert!(reason.contains("scripts/install-scanners"), "{reason}");
}

#[tokio::test]
async fn a_missing_gitleaks_is_unavailable_with_an_install_hint() {
    let vars = [("BATON_GITLEAKS", "/nonexistent/gitleaks".to_owned())];
    if !child("a_missing_gitleaks_is_unavailable_with_an_install_hint", &vars) {
        return;
    }
    let dir = workspace(&[("README.md", "# a project\n")]);
    let out = run(&Gitleaks, &spec(Uses::Gitleaks, json!({}), None), dir.path()).await;

    assert!(!out.passed);
    assert_eq!(out.score, None, "{out:?}");
    let reason = &out.reasons[0];
    assert!(reason.contains("BATON_GITLEAKS is set to `/nonexistent/gitleaks`"), "{reason}");
    assert!(reason.contains("apt-get install gitleaks"), "{reason}");
    assert!(reason.contains("scripts/install-scanners"), "{reason}");
}
