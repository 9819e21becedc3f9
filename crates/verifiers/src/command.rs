//! The `command` verifier and the project presets (`build`, `typecheck`, `lint`,
//! `unit_test`): a program run in the workspace through [`crate::program::run_program`],
//! passing on exit code 0 (or `expect_exit`), keeping the tails of its output for the next
//! attempt's feedback. A preset without an `argv` runs the project's usual command,
//! detected from its marker files.

use std::time::{Duration, Instant};

use baton_engine::cancel::CancelToken;
use baton_engine::event::VerifierFinished;
use baton_engine::limits;
use baton_engine::model::BoxFuture;
use baton_engine::verifier::{VerifyContext, checked, tail, unavailable};
use baton_jail::Jail;
use baton_scenario::model::{Uses, VerifierSpec};
use serde_json::{Value, json};

use crate::confined::Confined;
use crate::program::{Program, run_program};

/// Runs a program and checks its exit code.
#[derive(Clone, Copy, Debug, Default)]
pub struct CommandVerifier;

impl Confined for CommandVerifier {
    fn verify<'a>(
        &'a self,
        spec: &'a VerifierSpec,
        ctx: &'a VerifyContext,
        jail: &'a Jail,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, VerifierFinished> {
        Box::pin(async move { run_command(spec, ctx, jail, cancel).await })
    }
}

/// A project's usual build, type check, lint or test command, detected from the files in
/// the workspace (Cargo.toml, package.json, go.mod, pyproject.toml / requirements.txt /
/// setup.py) unless the verifier gives its own `argv`; then run like `command`.
#[derive(Clone, Copy, Debug)]
pub struct PresetVerifier(pub Uses);

/// The command a project of `kind` uses for `preset`.
fn preset_argv(kind: &str, preset: Uses) -> &'static [&'static str] {
    match (kind, preset) {
        ("cargo", Uses::Build) => &["cargo", "build", "--quiet"],
        ("cargo", Uses::Typecheck) => &["cargo", "check", "--quiet"],
        ("cargo", Uses::Lint) => &["cargo", "clippy", "--quiet", "--", "-D", "warnings"],
        ("cargo", _) => &["cargo", "test", "--quiet"],
        ("npm", Uses::Build) => &["npm", "run", "build", "--silent"],
        ("npm", Uses::Typecheck) => &["npx", "--no-install", "tsc", "--noEmit"],
        ("npm", Uses::Lint) => &["npm", "run", "lint", "--silent"],
        ("npm", _) => &["npm", "test", "--silent"],
        ("go", Uses::Build) => &["go", "build", "./..."],
        ("go", Uses::UnitTest) => &["go", "test", "./..."],
        ("go", _) => &["go", "vet", "./..."],
        (_, Uses::Build) => &["python3", "-m", "compileall", "-q", "."],
        (_, Uses::Typecheck) => &["python3", "-m", "mypy", "."],
        (_, Uses::Lint) => &["python3", "-m", "pyflakes", "."],
        (_, _) => &["python3", "-m", "pytest", "-q"],
    }
}

/// What kind of project lives in `dir`, by its marker files.
pub fn detect_project(dir: &std::path::Path) -> Option<&'static str> {
    let has = |f: &str| dir.join(f).is_file();
    if has("Cargo.toml") {
        Some("cargo")
    } else if has("package.json") {
        Some("npm")
    } else if has("go.mod") {
        Some("go")
    } else if has("pyproject.toml") || has("requirements.txt") || has("setup.py") {
        Some("python")
    } else {
        None
    }
}

impl Confined for PresetVerifier {
    fn verify<'a>(
        &'a self,
        spec: &'a VerifierSpec,
        ctx: &'a VerifyContext,
        jail: &'a Jail,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, VerifierFinished> {
        Box::pin(async move {
            if spec.params.contains_key("argv") {
                return run_command(spec, ctx, jail, cancel).await;
            }
            let dir = match spec.params.get("cwd").and_then(Value::as_str) {
                Some(d) => ctx.workspace.join(d),
                None => ctx.workspace.clone(),
            };
            let Some(kind) = detect_project(&dir) else {
                return unavailable(
                    spec,
                    &format!(
                        "no Cargo.toml, package.json, go.mod, pyproject.toml, requirements.txt or setup.py in {}; give the verifier an `argv`",
                        dir.display()
                    ),
                );
            };
            let mut with_argv = spec.clone();
            let argv: Vec<Value> =
                preset_argv(kind, self.0).iter().map(|a| Value::from(*a)).collect();
            with_argv.params.insert("argv".to_owned(), Value::Array(argv));
            let mut outcome = run_command(&with_argv, ctx, jail, cancel).await;
            if let Some(details) = outcome.details.as_object_mut() {
                details.insert("project".to_owned(), Value::from(kind));
            }
            outcome
        })
    }
}

async fn run_command(
    spec: &VerifierSpec,
    ctx: &VerifyContext,
    jail: &Jail,
    cancel: &CancelToken,
) -> VerifierFinished {
    let started = Instant::now();
    let fail = |reason: String| unavailable(spec, &reason);
    let mut argv: Vec<String> = spec
        .params
        .get("argv")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    // `shell: true` runs the words as one shell command line; otherwise there is no shell.
    if spec.params.get("shell").and_then(Value::as_bool) == Some(true) && !argv.is_empty() {
        argv = vec!["sh".to_owned(), "-c".to_owned(), argv.join(" ")];
    }
    if argv.is_empty() {
        return fail("no `argv` to run".to_owned());
    }
    let cwd = match spec.params.get("cwd").and_then(Value::as_str) {
        Some(dir) => ctx.workspace.join(dir),
        None => ctx.workspace.clone(),
    };
    let env = spec
        .params
        .get("env")
        .and_then(Value::as_object)
        .map(|env| {
            env.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect()
        })
        .unwrap_or_default();
    let timeout =
        Duration::from_secs_f64(spec.timeout_s.unwrap_or(limits::VERIFIER_TIMEOUT_S_DEFAULT));
    let network = spec.params.get("network").and_then(Value::as_bool) == Some(true);
    let program = Program {
        argv,
        cwd,
        workspace: ctx.workspace.clone(),
        also_writable: Vec::new(),
        env,
        timeout,
        network,
    };
    let ran = match run_program(&program, jail, cancel).await {
        Ok(ran) => ran,
        Err(reason) => {
            let mut f = fail(reason);
            f.duration_ms = baton_engine::clock::elapsed_ms(started);
            return f;
        }
    };
    let argv = &program.argv;
    let (code, err_total) = (ran.code, ran.stderr_bytes);
    let expected = spec.params.get("expect_exit").and_then(Value::as_i64).unwrap_or(0);
    let passed = code.is_some_and(|c| i64::from(c) == expected);
    let stderr_text = String::from_utf8_lossy(&ran.stderr).into_owned();
    let stdout_text = String::from_utf8_lossy(&ran.stdout).into_owned();
    let mut reasons = Vec::new();
    if !passed {
        reasons.push(match code {
            Some(c) => format!("`{}` exited with {c}", argv.join(" ")),
            None => format!("`{}` was killed by a signal", argv.join(" ")),
        });
    }
    checked(
        spec,
        passed,
        reasons,
        started,
        json!({
            "exit_code": code,
            "stderr_tail": tail(&stderr_text, limits::FEEDBACK_TAIL_BYTES),
            "stdout_tail": tail(&stdout_text, limits::FEEDBACK_TAIL_BYTES),
            "stderr_bytes": err_total,
        }),
    )
}
