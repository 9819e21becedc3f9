//! Verifiers, as the kernel sees them: the [`Verifier`] trait and the `command` verifier.
//!
//! A verifier gets a [`VerifyContext`] and returns a [`VerifierFinished`] outcome. The
//! `command` verifier runs a program (no shell) in the workspace with a timeout and a
//! scrubbed environment, passes on exit code 0 (or `expect_exit`), and keeps the tail of
//! stderr for the next attempt's feedback. Output is read with a byte cap, so a verifier
//! printing gigabytes cannot exhaust memory.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_scenario::model::{Uses, VerifierSpec};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::cancel::CancelToken;
use crate::event::VerifierFinished;
use crate::future::BoxFuture;
use crate::limits;

/// What a verifier may look at.
#[derive(Clone, Debug)]
pub struct VerifyContext {
    pub workspace: PathBuf,
    /// What every program a verifier starts runs in.
    pub jail: Arc<baton_jail::Jail>,
    pub input: String,
    pub output: String,
    pub parsed: Option<Value>,
    pub scratchpad: serde_json::Map<String, Value>,
}

/// A check on a level's result.
pub trait Verifier: Send + Sync + std::fmt::Debug {
    /// Runs the check described by `spec`.
    fn verify<'a>(
        &'a self,
        spec: &'a VerifierSpec,
        ctx: &'a VerifyContext,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, VerifierFinished>;
}

/// The verifiers available to a run, by `uses`.
#[derive(Clone, Debug, Default)]
pub struct Verifiers {
    by_uses: BTreeMap<&'static str, Arc<dyn Verifier>>,
    /// A `trust_validation` replay's recorded outcomes, returned instead of running a
    /// verifier that has one.
    trusted: Option<Arc<crate::replay::Trusted>>,
}

impl Verifiers {
    /// The verifiers this crate ships: `command`, `schema`, and the project presets
    /// `build`, `typecheck`, `lint` and `unit_test`.
    pub fn builtin() -> Self {
        let mut v = Verifiers::default();
        v.register(Uses::Command, Arc::new(CommandVerifier));
        v.register(Uses::Schema, Arc::new(SchemaVerifier));
        for preset in [Uses::Build, Uses::Typecheck, Uses::Lint, Uses::UnitTest] {
            v.register(preset, Arc::new(PresetVerifier(preset)));
        }
        v
    }

    /// Registers (or replaces) the verifier for a `uses`.
    pub fn register(&mut self, uses: Uses, verifier: Arc<dyn Verifier>) {
        self.by_uses.insert(uses.as_str(), verifier);
    }

    /// Returns `trusted`'s recorded outcomes instead of running the verifiers that have one.
    pub fn trusting(mut self, trusted: Arc<crate::replay::Trusted>) -> Self {
        self.trusted = Some(trusted);
        self
    }

    /// The recorded outcome a trusting replay takes for this verifier, if any.
    pub fn trusted(
        &self,
        run_id: &str,
        level_id: &str,
        attempt: u32,
        name: &str,
    ) -> Option<VerifierFinished> {
        self.trusted.as_ref()?.take(run_id, level_id, attempt, name)
    }

    /// The verifier for a `uses`, if this build has one.
    pub fn get(&self, uses: Uses) -> Option<&Arc<dyn Verifier>> {
        self.by_uses.get(uses.as_str())
    }
}

/// The outcome of a check that ran for free: passed or not, with its reasons and details.
pub fn checked(
    spec: &VerifierSpec,
    passed: bool,
    reasons: Vec<String>,
    started: Instant,
    details: Value,
) -> VerifierFinished {
    VerifierFinished {
        name: spec.name.clone(),
        passed,
        score: Some(if passed { 1.0 } else { 0.0 }),
        reasons,
        cost_usd: 0.0,
        duration_ms: crate::clock::elapsed_ms(started),
        details,
    }
}

/// The outcome of a verifier left out because an earlier one failed (serial mode): it did
/// not pass, and it did not fail either — it is neither reported nor counted as a failure.
pub fn not_run(spec: &VerifierSpec, why: &str) -> VerifierFinished {
    let mut outcome = unavailable(spec, why);
    outcome.details = serde_json::json!({ "not_run": true });
    outcome
}

impl VerifierFinished {
    /// Whether the verifier was left out without running ([`not_run`]).
    pub fn not_run(&self) -> bool {
        self.details.get("not_run").and_then(Value::as_bool).unwrap_or(false)
    }
}

/// An outcome for a verifier that could not run.
pub fn unavailable(spec: &VerifierSpec, why: &str) -> VerifierFinished {
    VerifierFinished {
        name: spec.name.clone(),
        passed: false,
        score: None,
        reasons: vec![why.to_owned()],
        cost_usd: 0.0,
        duration_ms: 0,
        details: Value::Null,
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

impl Verifier for PresetVerifier {
    fn verify<'a>(
        &'a self,
        spec: &'a VerifierSpec,
        ctx: &'a VerifyContext,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, VerifierFinished> {
        Box::pin(async move {
            if spec.params.contains_key("argv") {
                return run_command(spec, ctx, cancel).await;
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
            let mut outcome = run_command(&with_argv, ctx, cancel).await;
            if let Some(details) = outcome.details.as_object_mut() {
                details.insert("project".to_owned(), Value::from(kind));
            }
            outcome
        })
    }
}

/// Validates the level's parsed JSON against the verifier's schema.
#[derive(Clone, Copy, Debug, Default)]
pub struct SchemaVerifier;

impl Verifier for SchemaVerifier {
    fn verify<'a>(
        &'a self,
        spec: &'a VerifierSpec,
        ctx: &'a VerifyContext,
        _cancel: &'a CancelToken,
    ) -> BoxFuture<'a, VerifierFinished> {
        Box::pin(async move {
            let started = Instant::now();
            let reasons = match (&spec.schema, &ctx.parsed) {
                (None, _) => vec!["the verifier has no schema".to_owned()],
                (Some(_), None) => vec!["the level's answer is not JSON".to_owned()],
                (Some(schema), Some(value)) => schema.violations(value),
            };
            checked(spec, reasons.is_empty(), reasons, started, Value::Null)
        })
    }
}

/// Runs a program and checks its exit code.
#[derive(Clone, Copy, Debug, Default)]
pub struct CommandVerifier;

impl Verifier for CommandVerifier {
    fn verify<'a>(
        &'a self,
        spec: &'a VerifierSpec,
        ctx: &'a VerifyContext,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, VerifierFinished> {
        Box::pin(async move { run_command(spec, ctx, cancel).await })
    }
}

async fn read_capped<R: AsyncRead + Unpin>(mut reader: R) -> (Vec<u8>, u64) {
    // Keep the last bytes: the end of a build log says what failed.
    let mut kept: Vec<u8> = Vec::new();
    let mut total = 0u64;
    let mut buf = [0u8; 8192];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                total += n as u64;
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > 2 * limits::VERIFIER_OUTPUT_BYTES_MAX {
                    let cut = kept.len() - limits::VERIFIER_OUTPUT_BYTES_MAX;
                    kept.drain(..cut);
                }
            }
        }
    }
    if kept.len() > limits::VERIFIER_OUTPUT_BYTES_MAX {
        let cut = kept.len() - limits::VERIFIER_OUTPUT_BYTES_MAX;
        kept.drain(..cut);
    }
    (kept, total)
}

/// Kills every process of a process group (the verifier's), without unsafe code: through
/// the system's `kill` program.
pub async fn kill_group(group: Option<u32>) {
    let Some(pgid) = group else { return };
    let _ = tokio::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
}

/// The last `max` bytes of a text, on a character boundary.
pub fn tail(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// The environment of a verifier's program: only `PATH`, `HOME`, `LANG`, `TMPDIR` and the
/// Rust toolchain's homes from Baton's, then `env` — a verifier never sees API keys. (In
/// the jail, `HOME` and `TMPDIR` are the program's private `/tmp`.)
pub fn scrubbed_env(env: &[(String, String)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> =
        ["PATH", "HOME", "LANG", "TMPDIR", "CARGO_HOME", "RUSTUP_HOME"]
            .iter()
            .filter_map(|key| Some(((*key).to_owned(), std::env::var(key).ok()?)))
            .collect();
    out.extend(env.iter().cloned());
    out
}

/// A command for a verifier's program, in the jail: in `cwd` (inside `workspace`), with a
/// [`scrubbed_env`], in its own process group so that everything it starts can be stopped
/// with it, and killed if dropped. Its `watch` counts what it adds to the disk.
pub fn jailed_command(
    jail: &baton_jail::Jail,
    program: &Program,
) -> Result<baton_jail::Jailed, String> {
    let env = scrubbed_env(&program.env);
    let mut jailed = jail.command(&baton_jail::Program {
        argv: &program.argv,
        env: &env,
        cwd: &program.cwd,
        workspace: &program.workspace,
        also_writable: &program.also_writable,
        network: program.network,
        timeout: program.timeout,
        counted: true,
    })?;
    jailed.command.kill_on_drop(true).process_group(0);
    Ok(jailed)
}

/// A program to run for a verifier.
#[derive(Clone, Debug)]
pub struct Program {
    pub argv: Vec<String>,
    /// Where it starts: `workspace` or a directory below it.
    pub cwd: PathBuf,
    /// What it may write.
    pub workspace: PathBuf,
    /// Baton's own directories it may write too (a scanner's report).
    pub also_writable: Vec<PathBuf>,
    /// Variables set on top of the scrubbed environment.
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
    /// Whether it may reach the network (the verifier's `network: true`).
    pub network: bool,
}

/// What a program did: its exit code (`None` when a signal stopped it) and the tails of
/// its output, with how many bytes it wrote in all.
#[derive(Clone, Debug)]
pub struct Ran {
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stderr_bytes: u64,
}

/// Whether a verifier of this kind starts programs (which then run in the jail).
pub fn runs_programs(uses: Uses) -> bool {
    !matches!(uses, Uses::Schema | Uses::LlmJudge)
}

/// How often the files a jailed program adds are counted.
const WATCH_EVERY: Duration = Duration::from_millis(500);

/// Resolves when a running jailed program has added more than the jail allows (never
/// without a watch), with why.
pub async fn over_limits(watch: Option<Arc<baton_jail::Watch>>) -> String {
    let Some(watch) = watch else { return std::future::pending().await };
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        let counted = Arc::clone(&watch);
        if let Ok(Some(reason)) = tokio::task::spawn_blocking(move || counted.over_limits()).await {
            return reason;
        }
    }
}

/// Runs a program the way every verifier does: in the jail, no shell, a scrubbed
/// environment (no API keys), its own process group — killed whole at the timeout, on
/// cancel, when it adds more files than the jail allows, and when the program exits, so
/// nothing it started lingers — and its output read with byte caps. An error says why it
/// did not run to an exit.
pub async fn run_program(
    program: &Program,
    jail: &baton_jail::Jail,
    cancel: &CancelToken,
) -> Result<Ran, String> {
    let Some(name) = program.argv.first() else {
        return Err("no program to run".to_owned());
    };
    let started = Instant::now();
    let jailed = jailed_command(jail, program)?;
    let (mut command, watch) = (jailed.command, jailed.watch.map(Arc::new));
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start `{name}` in {}: {e}", program.cwd.display()))?;
    let group = child.id();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let out_task = tokio::spawn(async move {
        match stdout {
            Some(s) => read_capped(s).await,
            None => (Vec::new(), 0),
        }
    });
    let err_task = tokio::spawn(async move {
        match stderr {
            Some(s) => read_capped(s).await,
            None => (Vec::new(), 0),
        }
    });
    let stopped = {
        let wait = child.wait();
        tokio::select! {
            s = wait => Ok(s.ok()),
            () = tokio::time::sleep(program.timeout) => {
                Err(format!("`{name}` timed out after {:.0} s and was killed", program.timeout.as_secs_f64()))
            }
            () = cancel.cancelled() => Err("cancelled".to_owned()),
            reason = over_limits(watch.clone()) => Err(reason),
        }
    };
    // Whatever the program left running in its group (a hung child, a daemon) goes with it;
    // that also closes the pipes the readers wait on.
    kill_group(group).await;
    let status = match stopped {
        Ok(status) => status,
        Err(reason) => {
            let _ = child.kill().await;
            return Err(reason);
        }
    };
    // A process the program started outside its group (`setsid`, a double fork) may hold
    // its output open: the readers end with the timeout or a cancel, never only with EOF.
    let aborts = [out_task.abort_handle(), err_task.abort_handle()];
    let readers = async {
        let (stdout, _) = out_task.await.unwrap_or_default();
        let (stderr, stderr_bytes) = err_task.await.unwrap_or_default();
        (stdout, stderr, stderr_bytes)
    };
    let left = program.timeout.saturating_sub(started.elapsed());
    let ended = tokio::select! {
        read = readers => Ok(read),
        () = tokio::time::sleep(left) => Err(format!(
            "`{name}` exited, but a process it started kept its output open past the timeout of {:.0} s",
            program.timeout.as_secs_f64()
        )),
        () = cancel.cancelled() => Err("cancelled".to_owned()),
    };
    let (stdout, stderr, stderr_bytes) =
        ended.inspect_err(|_| aborts.iter().for_each(tokio::task::AbortHandle::abort))?;
    if let Some(watch) = watch {
        let last = tokio::task::spawn_blocking(move || watch.over_limits()).await;
        if let Ok(Some(reason)) = last {
            return Err(reason);
        }
    }
    Ok(Ran { code: status.and_then(|s| s.code()), stdout, stderr, stderr_bytes })
}

async fn run_command(
    spec: &VerifierSpec,
    ctx: &VerifyContext,
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
    let ran = match run_program(&program, &ctx.jail, cancel).await {
        Ok(ran) => ran,
        Err(reason) => {
            let mut f = fail(reason);
            f.duration_ms = crate::clock::elapsed_ms(started);
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

/// A verifier's place in a tree: run, level, attempt, name.
pub(crate) type VerifierKey = (String, String, u32, String);

/// Recorded verifier outcomes a `trust_validation` replay returns instead of running the
/// verifiers; each is taken once, in the order it was recorded.
#[derive(Debug, Default)]
pub struct Trusted {
    pub(crate) by: Mutex<BTreeMap<VerifierKey, VecDeque<VerifierFinished>>>,
}

impl Trusted {
    /// The next recorded outcome of verifier `name` in this attempt of the level, if any.
    pub fn take(
        &self,
        run_id: &str,
        level_id: &str,
        attempt: u32,
        name: &str,
    ) -> Option<VerifierFinished> {
        let mut by = self.by.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = (run_id.to_owned(), level_id.to_owned(), attempt, name.to_owned());
        by.get_mut(&key).and_then(VecDeque::pop_front)
    }
}
