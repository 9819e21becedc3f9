//! The `semgrep` and `gitleaks` scanners: each runs its tool over the workspace (or the
//! verifier's `paths` in it) and passes when the tool finds nothing.
//!
//! **Finding the tool.** `BATON_SEMGREP` / `BATON_GITLEAKS` name the program; without the
//! variable it is looked up on `PATH` as `semgrep` / `gitleaks`. A tool that cannot be
//! found gives an `unavailable` outcome that says how to install it.
//!
//! **Configuration.** The scenario loader reads the semgrep `rules` file and the gitleaks
//! `config` file into `VerifierSpec::config_text`; the verifier writes that text into a
//! private temporary directory (outside the workspace, removed afterwards) and passes it
//! to the tool. No path from the parameters is read at run time, and the workspace's own
//! `.gitleaks.toml` is never used: gitleaks always gets an explicit `--config`.
//!
//! **Running.** Through [`run_program`]: no shell, a scrubbed environment, the process
//! group killed at the timeout (`timeout_s`, default 600 s) or on cancel. Reports are
//! written to files and read back with a size cap. `.baton/` (Baton's own repository
//! inside a workspace) is never scanned: semgrep gets `--exclude /.baton` (anchored: a
//! `.baton` directory deeper in the tree is the model's and is scanned), gitleaks' copy
//! leaves it out (with `allow_suppressions`, the default gitleaks configuration allowlists
//! `^\.baton/`), and findings under it are dropped in any case.
//!
//! **Suppressions.** The workspace is written by the model these scanners check, so nothing
//! in it may silence them unless the scenario opts in with `allow_suppressions: true`
//! (recorded as `details.allow_suppressions` on every outcome). Without it, semgrep runs
//! with `--disable-nosem` (no `# nosemgrep` comments), `--x-ignore-semgrepignore-files` (no
//! `.semgrepignore` anywhere in the tree, and none of semgrep's built-in default ignores
//! either: `tests/` is scanned too) and `--no-git-ignore` (no `.gitignore`). gitleaks 8.16
//! has no switch for its inline `gitleaks:allow` comments nor for the `.gitleaksignore` it
//! reads from the scanned root (newer versions also from the working directory), so it
//! scans a private copy of the targets instead: see [`mirror`].
//!
//! **Secrets.** A gitleaks outcome names the file, line and rule of a leak and nothing of
//! the leak itself: the report's `Secret`, `Match` and `Line` fields are never read, and
//! gitleaks runs with `--redact` so that its own logs hide them too.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::time::Instant;

use baton_engine::cancel::CancelToken;
use baton_engine::clock::elapsed_ms;
use baton_engine::event::VerifierFinished;
use baton_engine::model::BoxFuture;
use baton_engine::verifier::{VerifyContext, checked, unavailable};
use baton_jail::Jail;
use baton_scenario::model::VerifierSpec;
use serde_json::{Map, Value, json};

mod tool;

use crate::confined::Confined;
use crate::program::{Program, Ran, run_program};

use tool::{
    BATON_DIR, Scratch, Unavailable, allow_suppressions, clean_tail, first_line, locate, not_run,
    one_line, read_report, relative_report_path, target_paths, timeout, under_baton,
    workspace_root,
};

/// Findings listed in an outcome (as reasons and in details); the rest are counted.
const FINDINGS_SHOWN_MAX: usize = 50;
/// Scanner errors listed in details.
const ERRORS_SHOWN_MAX: usize = 20;
/// The exit code gitleaks is told to use when it finds leaks, so that a leak can be told
/// apart from a fatal error (gitleaks 8.16 exits 1 on both by default).
const GITLEAKS_LEAKS_EXIT: i32 = 10;
/// The comment that makes gitleaks skip a finding on its line.
const GITLEAKS_ALLOW: &[u8] = b"gitleaks:allow";
/// What a `gitleaks:allow` becomes in gitleaks' copy of the workspace: as long, so that
/// lines and columns stay where they were, and no longer an allow.
const GITLEAKS_ALLOW_NEUTRALISED: &[u8] = b"gitleaks-allow";
/// The file of finding fingerprints gitleaks skips.
const GITLEAKS_IGNORE_FILE: &str = ".gitleaksignore";

/// The hint an `unavailable` semgrep outcome ends with.
const SEMGREP_INSTALL: &str = "install semgrep (`pip install semgrep`, ideally in its own \
    venv; in a Baton checkout `scripts/install-scanners` puts a pinned one in \
    .peers/semgrep/bin/semgrep) and put it on PATH or set BATON_SEMGREP to its path";
/// The hint an `unavailable` gitleaks outcome ends with.
const GITLEAKS_INSTALL: &str = "install gitleaks 8.16 or later (Debian 13: `apt-get install \
    gitleaks`; in a Baton checkout `scripts/install-scanners` puts a pinned one in \
    .peers/gitleaks/usr/bin/gitleaks) and put it on PATH or set BATON_GITLEAKS to its path";

/// Runs semgrep with the scenario's local rules.
///
/// Parameters: `severity` (`INFO`, `WARNING` or `ERROR`; findings below it are counted in
/// details but do not fail the check; default `INFO`, every finding counts) and `paths`
/// (workspace-relative files or directories to scan; default the whole workspace), and
/// `allow_suppressions` (default false: `# nosemgrep`, `.semgrepignore` and `.gitignore`
/// in the workspace are ignored).
#[derive(Clone, Copy, Debug, Default)]
pub struct Semgrep;

/// Runs gitleaks over the workspace.
///
/// Parameters: `paths` (workspace-relative files or directories to scan; default the whole
/// workspace) and `allow_suppressions` (default false: `gitleaks:allow` comments and
/// `.gitleaksignore` files in the workspace are ignored). The scenario's `config`, when it
/// has one, replaces gitleaks' default rules.
#[derive(Clone, Copy, Debug, Default)]
pub struct Gitleaks;

impl Confined for Semgrep {
    fn verify<'a>(
        &'a self,
        spec: &'a VerifierSpec,
        ctx: &'a VerifyContext,
        jail: &'a Jail,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, VerifierFinished> {
        Box::pin(async move {
            let started = Instant::now();
            let outcome = semgrep(spec, ctx, jail, cancel, started).await;
            settle(spec, outcome, started)
        })
    }
}

impl Confined for Gitleaks {
    fn verify<'a>(
        &'a self,
        spec: &'a VerifierSpec,
        ctx: &'a VerifyContext,
        jail: &'a Jail,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, VerifierFinished> {
        Box::pin(async move {
            let started = Instant::now();
            let outcome = gitleaks(spec, ctx, jail, cancel, started).await;
            settle(spec, outcome, started)
        })
    }
}

/// The outcome of a scan, or an `unavailable` one that took as long as the attempt did.
fn settle(
    spec: &VerifierSpec,
    outcome: Result<VerifierFinished, Unavailable>,
    started: Instant,
) -> VerifierFinished {
    match outcome {
        Ok(finished) => finished,
        Err(Unavailable { why, details }) => {
            let mut finished = unavailable(spec, &why);
            finished.details = details;
            finished.duration_ms = elapsed_ms(started);
            finished
        }
    }
}

// ---- semgrep ---------------------------------------------------------------------------

/// A semgrep severity threshold, lowest first.
fn threshold_rank(name: &str) -> Option<u8> {
    match name.to_ascii_uppercase().as_str() {
        "INFO" => Some(0),
        "WARNING" => Some(1),
        "ERROR" => Some(2),
        _ => None,
    }
}

/// The rank of a finding's severity. Semgrep also knows LOW…CRITICAL and, for rules that
/// are not about bugs, INVENTORY and EXPERIMENT; a severity it may add later ranks
/// highest, so that a new name never hides a finding.
fn severity_rank(severity: &str) -> u8 {
    match severity {
        "INFO" | "LOW" | "INVENTORY" | "EXPERIMENT" => 0,
        "WARNING" | "MEDIUM" => 1,
        _ => 2,
    }
}

/// One semgrep result, as an outcome shows it.
#[derive(Debug)]
struct SemgrepFinding {
    path: String,
    line: u64,
    rule: String,
    severity: String,
    message: String,
}

async fn semgrep(
    spec: &VerifierSpec,
    ctx: &VerifyContext,
    jail: &Jail,
    cancel: &CancelToken,
    started: Instant,
) -> Result<VerifierFinished, Unavailable> {
    let program = locate("semgrep", "BATON_SEMGREP", SEMGREP_INSTALL)?;
    let threshold_name = match spec.params.get("severity") {
        None | Some(Value::Null) => "INFO".to_owned(),
        Some(Value::String(s)) => s.to_ascii_uppercase(),
        Some(other) => {
            return Err(format!(
                "semgrep: `severity` of verifier `{}` is {other}, not a string; use INFO, WARNING or ERROR",
                spec.name
            )
            .into());
        }
    };
    let Some(threshold) = threshold_rank(&threshold_name) else {
        return Err(format!(
            "semgrep: `severity` of verifier `{}` is `{threshold_name}`; use INFO, WARNING or ERROR",
            spec.name
        )
        .into());
    };
    let Some(rules) = spec.config_text.as_deref() else {
        return Err(format!(
            "semgrep: verifier `{}` has no rules text; its `rules` must name a local rules file, which is read when the scenario loads",
            spec.name
        )
        .into());
    };
    let allow_suppressions = allow_suppressions(spec, "semgrep")?;
    let workspace = workspace_root(&ctx.workspace, "semgrep")?;
    let targets = target_paths(spec, &workspace, "semgrep")?;
    let scratch = Scratch::new("semgrep")?;
    let rules_file = scratch.write("rules.yaml", rules)?;
    let report = scratch.path().join("report.json");

    let mut argv = vec![
        program.display().to_string(),
        "scan".to_owned(),
        "--config".to_owned(),
        rules_file.display().to_string(),
        "--metrics=off".to_owned(),
        "--disable-version-check".to_owned(),
        // Rule ids as the rules file spells them, not prefixed with its dotted directory.
        "--no-rewrite-rule-ids".to_owned(),
        "--json".to_owned(),
        "--output".to_owned(),
        report.display().to_string(),
        "--quiet".to_owned(),
        "--exclude".to_owned(),
        format!("/{BATON_DIR}"),
    ];
    if !allow_suppressions {
        // The workspace is the model's: none of its comments or ignore files count.
        argv.extend(
            ["--disable-nosem", "--x-ignore-semgrepignore-files", "--no-git-ignore"]
                .map(str::to_owned),
        );
    }
    argv.extend(targets.iter().cloned());
    let env = vec![
        ("SEMGREP_SEND_METRICS".to_owned(), "off".to_owned()),
        ("SEMGREP_ENABLE_VERSION_CHECK".to_owned(), "0".to_owned()),
    ];
    let program = Program {
        argv,
        cwd: workspace.clone(),
        workspace,
        also_writable: vec![scratch.path().to_path_buf()],
        env,
        timeout: timeout(spec),
        network: false,
    };
    let ran = run_program(&program, jail, cancel).await.map_err(|e| not_run("semgrep", &e))?;
    let stderr = clean_tail(&ran.stderr);
    let parsed = read_report(&report);

    let Some(code) = ran.code else {
        return Err(Unavailable {
            why: format!("semgrep was killed by a signal; its stderr ends: {stderr}"),
            details: json!({"stderr_tail": stderr}),
        });
    };
    let report = match parsed {
        Ok(report) => report,
        Err(why) => {
            return Err(Unavailable {
                why: format!("semgrep exited with {code} and {why}; its stderr ends: {stderr}"),
                details: json!({"exit_code": code, "stderr_tail": stderr}),
            });
        }
    };

    let mut findings = semgrep_findings(&report);
    let total = findings.len();
    let mut by_severity: BTreeMap<String, u64> = BTreeMap::new();
    for f in &findings {
        *by_severity.entry(f.severity.clone()).or_default() += 1;
    }
    findings.retain(|f| severity_rank(&f.severity) >= threshold);
    let errors = semgrep_errors(&report);
    let scanned_files =
        report.pointer("/paths/scanned").and_then(Value::as_array).map_or(0, Vec::len);
    let mut details = json!({
        "exit_code": code,
        "allow_suppressions": allow_suppressions,
        "threshold": threshold_name,
        "paths": targets,
        "scanned_files": scanned_files,
        "findings_total": total,
        "findings_counted": findings.len(),
        "by_severity": by_severity,
        "findings": findings.iter().take(FINDINGS_SHOWN_MAX).map(|f| json!({
            "path": f.path,
            "line": f.line,
            "rule": f.rule,
            "severity": f.severity,
        })).collect::<Vec<_>>(),
        "findings_truncated": findings.len() > FINDINGS_SHOWN_MAX,
        "errors": errors,
    });

    // 0: ran (findings or not); 1: findings with `--error`. Anything else is a fatal error
    // (bad rules, a missing target…): without findings that is no verdict at all.
    let clean_exit = matches!(code, 0 | 1);
    if !clean_exit && findings.is_empty() {
        let first = first_error_message(&report).unwrap_or_else(|| stderr.clone());
        if let Some(map) = details.as_object_mut() {
            map.insert("stderr_tail".to_owned(), Value::from(stderr));
        }
        return Err(Unavailable {
            why: format!("semgrep exited with {code}: {first}; check the verifier's rules"),
            details,
        });
    }
    let mut reasons: Vec<String> = findings
        .iter()
        .take(FINDINGS_SHOWN_MAX)
        .map(|f| format!("{}:{}: [{}] {}: {}", f.path, f.line, f.severity, f.rule, f.message))
        .collect();
    if findings.len() > FINDINGS_SHOWN_MAX {
        reasons.push(format!(
            "… and {} more findings at or above {threshold_name}",
            findings.len() - FINDINGS_SHOWN_MAX
        ));
    }
    if !clean_exit {
        let first = first_error_message(&report).unwrap_or_else(|| stderr.clone());
        reasons.push(format!("semgrep exited with {code}: {first}"));
    }
    let passed = clean_exit && findings.is_empty();
    Ok(checked(spec, passed, reasons, started, details))
}

/// The results of a semgrep report, outside `.baton/`, in report order.
fn semgrep_findings(report: &Value) -> Vec<SemgrepFinding> {
    let Some(results) = report.get("results").and_then(Value::as_array) else {
        return Vec::new();
    };
    results
        .iter()
        .filter_map(|r| {
            let path = relative_report_path(r.get("path").and_then(Value::as_str)?, None);
            if under_baton(&path) {
                return None;
            }
            let line = r.pointer("/start/line").and_then(Value::as_u64).unwrap_or(0);
            let check_id = r.get("check_id").and_then(Value::as_str).unwrap_or("?");
            let severity = r
                .pointer("/extra/severity")
                .and_then(Value::as_str)
                .unwrap_or("UNKNOWN")
                .to_ascii_uppercase();
            let message = r.pointer("/extra/message").and_then(Value::as_str).unwrap_or("");
            Some(SemgrepFinding {
                path,
                line,
                rule: check_id.to_owned(),
                severity,
                message: first_line(message),
            })
        })
        .collect()
}

/// The errors of a semgrep report, shortened, for details.
fn semgrep_errors(report: &Value) -> Vec<Value> {
    let Some(errors) = report.get("errors").and_then(Value::as_array) else {
        return Vec::new();
    };
    errors
        .iter()
        .take(ERRORS_SHOWN_MAX)
        .map(|e| {
            // `type` is a name, or a list whose first item is the name.
            let kind = match e.get("type") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => {
                    parts.first().and_then(Value::as_str).unwrap_or("").to_owned()
                }
                _ => String::new(),
            };
            let mut error = Map::new();
            error.insert("level".to_owned(), e.get("level").cloned().unwrap_or(Value::Null));
            error.insert("type".to_owned(), Value::from(kind));
            let message = e.get("message").and_then(Value::as_str).unwrap_or("");
            error.insert("message".to_owned(), Value::from(one_line(message)));
            if let Some(path) = e.get("path").and_then(Value::as_str) {
                error.insert("path".to_owned(), Value::from(relative_report_path(path, None)));
            }
            Value::Object(error)
        })
        .collect()
}

/// The first error message of a semgrep report, on one line.
fn first_error_message(report: &Value) -> Option<String> {
    let message = report.pointer("/errors/0/message").and_then(Value::as_str)?;
    let line = one_line(message);
    (!line.is_empty()).then_some(line)
}

// ---- gitleaks --------------------------------------------------------------------------

/// The configuration used when the scenario gives none: gitleaks' own rules, with Baton's
/// directory allowlisted.
const GITLEAKS_DEFAULT_CONFIG: &str = r#"# Written by Baton's gitleaks verifier.
title = "baton default"

[extend]
useDefault = true

[allowlist]
description = "Baton's own files inside the workspace"
paths = ['''^\.baton/''']
"#;

/// One leak, without the leak.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Leak {
    path: String,
    line: u64,
    rule: String,
    description: String,
}

async fn gitleaks(
    spec: &VerifierSpec,
    ctx: &VerifyContext,
    jail: &Jail,
    cancel: &CancelToken,
    started: Instant,
) -> Result<VerifierFinished, Unavailable> {
    let program = locate("gitleaks", "BATON_GITLEAKS", GITLEAKS_INSTALL)?;
    let allow_suppressions = allow_suppressions(spec, "gitleaks")?;
    let workspace = workspace_root(&ctx.workspace, "gitleaks")?;
    let targets = target_paths(spec, &workspace, "gitleaks")?;
    let scratch = Scratch::new("gitleaks")?;
    let (config_text, config_kind) = match spec.config_text.as_deref() {
        Some(text) => (text, "scenario"),
        None => (GITLEAKS_DEFAULT_CONFIG, "default"),
    };
    let config = scratch.write("gitleaks.toml", config_text)?;
    let deadline = Instant::now() + timeout(spec);

    // Where gitleaks runs: the workspace itself when the scenario lets it suppress findings,
    // else a copy with every suppression neutralised.
    let (scan_root, neutralised) = if allow_suppressions {
        (workspace.clone(), None)
    } else {
        let tree = scratch.path().join("tree");
        let (from, into, targets_copy) = (workspace.clone(), tree.clone(), targets.clone());
        let stop = cancel.clone();
        let copied = tokio::task::spawn_blocking(move || {
            mirror(&from, &targets_copy, &into, deadline, &stop)
        })
        .await
        .unwrap_or_else(|e| Err(format!("gitleaks: copying the workspace failed: {e}").into()))?;
        (tree, Some(copied))
    };

    // gitleaks 8.16 scans one source per run: one run for each target, all within the
    // verifier's timeout.
    let mut leaks: BTreeSet<Leak> = BTreeSet::new();
    for (i, target) in targets.iter().enumerate() {
        let report = scratch.path().join(format!("report-{i}.json"));
        let argv = vec![
            program.display().to_string(),
            "detect".to_owned(),
            "--source".to_owned(),
            target.clone(),
            "--no-git".to_owned(),
            "--no-banner".to_owned(),
            "--redact".to_owned(),
            "--report-format".to_owned(),
            "json".to_owned(),
            "--report-path".to_owned(),
            report.display().to_string(),
            "--config".to_owned(),
            config.display().to_string(),
            "--exit-code".to_owned(),
            GITLEAKS_LEAKS_EXIT.to_string(),
            "--log-level".to_owned(),
            "error".to_owned(),
        ];
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "gitleaks: timed out after {:.0} s before scanning `{target}`; raise the verifier's `timeout_s` or narrow `paths`",
                timeout(spec).as_secs_f64()
            )
            .into());
        }
        let program = Program {
            argv,
            cwd: scan_root.clone(),
            workspace: scan_root.clone(),
            also_writable: vec![scratch.path().to_path_buf()],
            env: Vec::new(),
            timeout: left,
            network: false,
        };
        let ran: Ran =
            run_program(&program, jail, cancel).await.map_err(|e| not_run("gitleaks", &e))?;
        let stderr = clean_tail(&ran.stderr);
        match ran.code {
            Some(0 | GITLEAKS_LEAKS_EXIT) => {}
            Some(code) => {
                return Err(Unavailable {
                    why: format!(
                        "gitleaks exited with {code} scanning `{target}`; its stderr ends: {stderr}"
                    ),
                    details: json!({"exit_code": code, "stderr_tail": stderr}),
                });
            }
            None => {
                return Err(Unavailable {
                    why: format!(
                        "gitleaks was killed by a signal scanning `{target}`; its stderr ends: {stderr}"
                    ),
                    details: json!({"stderr_tail": stderr}),
                });
            }
        }
        let parsed = read_report(&report).map_err(|why| {
            format!("gitleaks scanned `{target}` but {why}; its stderr ends: {stderr}")
        })?;
        let Some(entries) = parsed.as_array() else {
            return Err(format!(
                "gitleaks scanned `{target}` but its report is not a JSON list; is this gitleaks 8.x?"
            )
            .into());
        };
        leaks.extend(entries.iter().filter_map(|e| leak(e, &workspace)));
    }

    let mut by_rule: BTreeMap<&str, u64> = BTreeMap::new();
    for l in &leaks {
        *by_rule.entry(l.rule.as_str()).or_default() += 1;
    }
    let mut reasons: Vec<String> = leaks
        .iter()
        .take(FINDINGS_SHOWN_MAX)
        .map(|l| {
            if l.description.is_empty() {
                format!("{}:{}: {}", l.path, l.line, l.rule)
            } else {
                format!("{}:{}: {} ({})", l.path, l.line, l.rule, l.description)
            }
        })
        .collect();
    if leaks.len() > FINDINGS_SHOWN_MAX {
        reasons.push(format!("… and {} more leaks", leaks.len() - FINDINGS_SHOWN_MAX));
    }
    let mut details = json!({
        "config": config_kind,
        "allow_suppressions": allow_suppressions,
        "paths": targets,
        "findings_total": leaks.len(),
        "by_rule": by_rule,
        "findings": leaks.iter().take(FINDINGS_SHOWN_MAX).map(|l| json!({
            "path": l.path,
            "line": l.line,
            "rule": l.rule,
            "description": l.description,
        })).collect::<Vec<_>>(),
        "findings_truncated": leaks.len() > FINDINGS_SHOWN_MAX,
    });
    if let (Some(copied), Some(map)) = (neutralised, details.as_object_mut()) {
        map.insert(
            "neutralised".to_owned(),
            json!({
                "inline_allows": copied.inline_allows,
                "ignore_files": copied.ignore_files,
            }),
        );
    }
    Ok(checked(spec, leaks.is_empty(), reasons, started, details))
}

/// A leak of a gitleaks report, outside `.baton/`. Reads only where it is and which rule
/// found it: never `Secret`, `Match` or `Line`.
fn leak(entry: &Value, workspace: &Path) -> Option<Leak> {
    let path = relative_report_path(entry.get("File").and_then(Value::as_str)?, Some(workspace));
    if under_baton(&path) {
        return None;
    }
    let rule = entry.get("RuleID").and_then(Value::as_str).unwrap_or("?").to_owned();
    let description = entry.get("Description").and_then(Value::as_str).unwrap_or("");
    Some(Leak {
        path,
        line: entry.get("StartLine").and_then(Value::as_u64).unwrap_or(0),
        rule,
        description: first_line(description),
    })
}

/// What [`mirror`] neutralised on the way.
#[derive(Debug, Default)]
struct Mirrored {
    /// `gitleaks:allow` comments made inert.
    inline_allows: u64,
    /// `.gitleaksignore` files made inert.
    ignore_files: u64,
}

/// Copies the `targets` of `workspace` into `tree`, for gitleaks to scan there instead of in
/// the workspace, with every way the workspace has to silence gitleaks made inert.
///
/// Why a copy: gitleaks 8.16 has no switch for either suppression. A `gitleaks:allow`
/// anywhere on a finding's lines drops the finding before it is reported, so no filter of
/// the report can bring it back; and `.gitleaksignore` is read from the scanned root
/// whatever the flags (newer versions also read one from the working directory, which here
/// is `tree`). Changing the text gitleaks reads is the one way that works on every 8.x:
///
/// - every `gitleaks:allow` becomes `gitleaks-allow` (as long, so lines and columns keep);
/// - every `.gitleaksignore` is copied with `/` before each line: gitleaks' fingerprints
///   here start with a relative path (`src/a.py:rule:3`), so no line can match one any
///   more, while a secret hidden in the file is still found on its own line;
/// - `.baton/` at the workspace's root is left out; symbolic links, pipes, sockets and
///   devices too, as gitleaks skips them in place (a target that is itself a link inside
///   the workspace is followed: `target_paths` checked where it leads).
///
/// Every file is copied from the bytes that were checked, never hard-linked, so a process
/// still writing to the workspace cannot slip a comment in after the check. Stops at the
/// `deadline` or on cancel.
fn mirror(
    workspace: &Path,
    targets: &[String],
    tree: &Path,
    deadline: Instant,
    cancel: &CancelToken,
) -> Result<Mirrored, Unavailable> {
    let mut copied = Mirrored::default();
    let io = |what: &str, path: &Path, e: std::io::Error| -> Unavailable {
        format!("gitleaks: cannot {what} {} to scan it: {e}", path.display()).into()
    };
    for target in targets {
        let from = workspace.join(target);
        // Without `.` parts, which `create_dir_all` cannot make.
        let inside: PathBuf =
            Path::new(target).components().filter(|c| matches!(c, Component::Normal(_))).collect();
        let into = tree.join(inside);
        let meta = std::fs::metadata(&from).map_err(|e| io("open", &from, e))?;
        if meta.is_file() {
            if let Some(parent) = into.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io("copy", parent, e))?;
            }
            copy_neutralised(&from, &into, &mut copied)?;
            continue;
        }
        // Directories still to copy: (from, into, whether it is the workspace's root).
        let at_root = from.canonicalize().is_ok_and(|p| p == workspace);
        let mut pending = vec![(from, into, at_root)];
        while let Some((dir, into, at_root)) = pending.pop() {
            if cancel.is_cancelled() {
                return Err("gitleaks: cancelled while copying the workspace to scan it"
                    .to_owned()
                    .into());
            }
            if Instant::now() >= deadline {
                return Err("gitleaks: timed out while copying the workspace to scan it; \
                     raise the verifier's `timeout_s` or narrow `paths`"
                    .to_owned()
                    .into());
            }
            std::fs::create_dir_all(&into).map_err(|e| io("copy", &into, e))?;
            let entries = std::fs::read_dir(&dir).map_err(|e| io("read", &dir, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| io("read", &dir, e))?;
                let name = entry.file_name();
                if at_root && name == BATON_DIR {
                    continue;
                }
                // The entry itself, not where a link leads.
                let kind = entry.file_type().map_err(|e| io("read", &entry.path(), e))?;
                if kind.is_dir() {
                    pending.push((entry.path(), into.join(&name), false));
                } else if kind.is_file() {
                    copy_neutralised(&entry.path(), &into.join(&name), &mut copied)?;
                }
            }
        }
    }
    Ok(copied)
}

/// Copies one regular file for [`mirror`], its suppressions made inert.
fn copy_neutralised(from: &Path, into: &Path, copied: &mut Mirrored) -> Result<(), Unavailable> {
    let bytes = read_regular(from)
        .map_err(|e| format!("gitleaks: cannot read {} to scan it: {e}", from.display()))?;
    let (mut text, allows) = replace_all(&bytes, GITLEAKS_ALLOW, GITLEAKS_ALLOW_NEUTRALISED);
    copied.inline_allows += allows;
    if from.file_name() == Some(GITLEAKS_IGNORE_FILE.as_ref()) {
        copied.ignore_files += 1;
        let mut inert = Vec::with_capacity(text.len() + text.len() / 16 + 1);
        for line in text.split_inclusive(|b| *b == b'\n') {
            inert.push(b'/');
            inert.extend_from_slice(line);
        }
        text = inert;
    }
    std::fs::write(into, &text)
        .map_err(|e| format!("gitleaks: cannot copy {} to scan it: {e}", into.display()).into())
}

/// The bytes of a regular file, opened without waiting on a pipe that took its place.
fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    if O_NONBLOCK != 0 {
        options.custom_flags(O_NONBLOCK);
    }
    let mut file = options.open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("it is no longer a regular file"));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// `O_NONBLOCK` where its value is known, 0 elsewhere (the directory entry was checked to
/// be a regular file just before, so only a swap in between could still block).
const O_NONBLOCK: i32 = if cfg!(any(target_os = "macos", target_os = "freebsd")) {
    0x0004
} else if cfg!(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64", target_arch = "riscv64")
)) {
    0o4000
} else {
    0
};

/// `haystack` with every `needle` replaced by `with` (of the same length), and how many.
fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> (Vec<u8>, u64) {
    let mut out = Vec::with_capacity(haystack.len());
    let mut count = 0;
    let mut rest = haystack;
    while let Some(at) = rest.windows(needle.len()).position(|w| w == needle) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(with);
        rest = &rest[at + needle.len()..];
        count += 1;
    }
    out.extend_from_slice(rest);
    (out, count)
}

// ---- shared ----------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn allows_are_neutralised_in_place_and_counted() {
        let (text, n) = replace_all(
            b"a gitleaks:allow b gitleaks:allowgitleaks:allow",
            GITLEAKS_ALLOW,
            GITLEAKS_ALLOW_NEUTRALISED,
        );
        assert_eq!(text, b"a gitleaks-allow b gitleaks-allowgitleaks-allow");
        assert_eq!(n, 3);
        assert_eq!(replace_all(b"gitleaks:allo", GITLEAKS_ALLOW, GITLEAKS_ALLOW_NEUTRALISED).1, 0);
    }

    #[test]
    fn the_mirror_copies_regular_files_only_and_leaves_out_batons_own_directory() {
        let base = std::env::temp_dir().join(format!("baton-mirror-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (ws, tree) = (base.join("ws"), base.join("tree"));
        for dir in ["src/.baton", ".baton/git"] {
            std::fs::create_dir_all(ws.join(dir)).expect("test setup");
        }
        std::fs::write(ws.join("src/a.py"), "x = 1  # gitleaks:allow\n").expect("test setup");
        std::fs::write(ws.join("src/.baton/b.py"), "y\n").expect("test setup");
        std::fs::write(ws.join(".baton/git/config"), "[core]\n").expect("test setup");
        std::fs::write(ws.join(".gitleaksignore"), "src/a.py:r:1\nsrc/b.py:r:2")
            .expect("test setup");
        std::os::unix::fs::symlink("/etc/hostname", ws.join("src/link")).expect("test setup");
        let ws = ws.canonicalize().expect("test setup");

        let copied = mirror(
            &ws,
            &[".".to_owned()],
            &tree,
            Instant::now() + Duration::from_secs(60),
            &CancelToken::new(),
        )
        .expect("test setup");
        assert_eq!((copied.inline_allows, copied.ignore_files), (1, 1));
        let read = |p: &str| std::fs::read_to_string(tree.join(p)).expect("test setup");
        assert_eq!(read("src/a.py"), "x = 1  # gitleaks-allow\n");
        assert_eq!(read("src/.baton/b.py"), "y\n");
        assert_eq!(read(".gitleaksignore"), "/src/a.py:r:1\n/src/b.py:r:2");
        assert!(!tree.join(".baton").exists());
        assert!(std::fs::symlink_metadata(tree.join("src/link")).is_err());

        let cancelled = CancelToken::new();
        cancelled.cancel();
        let late = mirror(&ws, &[".".to_owned()], &base.join("t2"), Instant::now(), &cancelled);
        assert!(late.expect_err("cancelled").why.contains("cancelled"));
        let _ = std::fs::remove_dir_all(&base);
    }
}
