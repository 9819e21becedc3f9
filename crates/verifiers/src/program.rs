//! Running a program the way every verifier does: in the jail, no shell, a scrubbed
//! environment (no API keys), its own process group killed whole at the timeout, on cancel
//! or when it adds more files than the jail allows, and its output read with byte caps.
//! The command verifier, the presets, the scanners and the MCP client all start their
//! programs here; the engine starts none.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_engine::cancel::CancelToken;
use baton_engine::limits;
use baton_jail::Jail;
use tokio::io::{AsyncRead, AsyncReadExt};

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
pub fn jailed_command(jail: &Jail, program: &Program) -> Result<baton_jail::Jailed, String> {
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
    jail: &Jail,
    cancel: &CancelToken,
) -> Result<Ran, String> {
    run_program_with_input(program, None, jail, cancel).await
}

/// [`run_program`], with `input` written to the program's stdin (then closed; a program
/// that does not read it all is not waited for).
pub async fn run_program_with_input(
    program: &Program,
    input: Option<Vec<u8>>,
    jail: &Jail,
    cancel: &CancelToken,
) -> Result<Ran, String> {
    let Some(name) = program.argv.first() else {
        return Err("no program to run".to_owned());
    };
    let started = Instant::now();
    let jailed = jailed_command(jail, program)?;
    let (mut command, watch) = (jailed.command, jailed.watch.map(Arc::new));
    command
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start `{name}` in {}: {e}", program.cwd.display()))?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        // A program that exits without reading its input closes the pipe: nothing to report.
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt as _;
            let _ = stdin.write_all(&input).await;
        });
    }
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
