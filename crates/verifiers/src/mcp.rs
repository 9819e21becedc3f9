//! The `mcp` verifier: calls one tool of an MCP server over stdio and checks the result.
//!
//! The server is a command (`server: [argv…]`) started in the workspace with a scrubbed
//! environment (plus the verifier's `env`), in its own process group. The client speaks
//! newline-delimited JSON-RPC 2.0: `initialize`, `notifications/initialized`, then
//! `tools/call` with the verifier's `arguments`, whose strings are templates (minijinja)
//! over `workspace`, `input`, `output`, `parsed` and `scratchpad`. Notifications the
//! server sends on its own are counted and skipped; requests it makes of the client are
//! answered "method not found" (or `ping` with an empty result). The call fails when the
//! server answers a JSON-RPC error or a result with `isError: true` — the two styles
//! servers use — and, with a `condition` (the gate language over `result.<…>`, the tool's
//! structured content), when the condition does not hold. With `reuse: true` the server
//! stays up for the next call of the same verifier with the same command, workspace and
//! environment; otherwise it is stopped after the call.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::confined::Confined;
use crate::program::{Program, jailed_command, kill_group, over_limits};
use baton_engine::cancel::CancelToken;
use baton_engine::clock::elapsed_ms;
use baton_engine::event::VerifierFinished;
use baton_engine::model::BoxFuture;
use baton_engine::verifier::{VerifyContext, checked, tail, unavailable};
use baton_jail::Jail;
use baton_scenario::expr::{self, JsonContext, Scope};
use baton_scenario::model::VerifierSpec;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::Mutex;

/// The protocol revision the client asks for.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// Largest message a server may send, in bytes.
const MESSAGE_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Bytes of a server's stderr kept for error messages.
const STDERR_BYTES_MAX: usize = 8 * 1024;
/// Default timeout of one verification (start, handshake and call), in seconds.
const TIMEOUT_S_DEFAULT: f64 = 120.0;
/// Text of a result kept in reasons and details, in bytes.
const RESULT_TEXT_BYTES_MAX: usize = 4 * 1024;

/// Calls a tool of an MCP server; keeps servers started with `reuse: true`.
#[derive(Debug, Default)]
pub struct McpVerifier {
    servers: Mutex<HashMap<String, Arc<Mutex<Server>>>>,
}

/// A running server and its side of the conversation.
#[derive(Debug)]
struct Server {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr: Arc<std::sync::Mutex<Vec<u8>>>,
    /// The task collecting stderr; it ends when the server closes its stderr.
    stderr_task: Option<tokio::task::JoinHandle<()>>,
    next_id: u64,
    /// Notifications received and skipped.
    notifications: u64,
    /// The task that counts what the server adds to the disk (and the jail's private
    /// `/tmp` it keeps); past the jail's limits it stops the server and says why here.
    watch: Option<tokio::task::JoinHandle<()>>,
    over_limits: Arc<std::sync::Mutex<Option<String>>>,
}

impl Drop for Server {
    /// Stops the server and everything it started (its process group).
    fn drop(&mut self) {
        if let Some(watch) = self.watch.take() {
            watch.abort();
        }
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Waits until a running server has added more than the jail allows, then records why
/// in `said` and kills its process group.
async fn watch_server(
    watch: Arc<baton_jail::Watch>,
    pid: u32,
    said: Arc<std::sync::Mutex<Option<String>>>,
) {
    let why = over_limits(Some(watch)).await;
    match said.lock() {
        Ok(mut g) => *g = Some(why),
        Err(p) => *p.into_inner() = Some(why),
    }
    kill_group(Some(pid)).await;
}

/// What the server answered to a request.
enum Answer {
    Result(Value),
    Error { code: i64, message: String },
}

impl Server {
    async fn start(
        argv: &[String],
        ctx: &VerifyContext,
        jail: &Jail,
        env: &Map<String, Value>,
        network: bool,
    ) -> Result<Server, String> {
        let Some(program) = argv.first() else {
            return Err("`server` names no command".to_owned());
        };
        let env: Vec<(String, String)> =
            env.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect();
        let jailed = jailed_command(
            jail,
            &Program {
                argv: argv.to_vec(),
                cwd: ctx.workspace.clone(),
                workspace: ctx.workspace.clone(),
                also_writable: Vec::new(),
                env,
                // A server runs for as long as it is reused; its calls have their timeouts.
                timeout: Duration::from_secs(24 * 3600),
                network,
            },
        )?;
        let (mut command, watch) = (jailed.command, jailed.watch);
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child =
            command.spawn().map_err(|e| format!("cannot start MCP server `{program}`: {e}"))?;
        let over_limits = Arc::new(std::sync::Mutex::new(None));
        let watch = watch.zip(child.id()).map(|(watch, pid)| {
            let said = Arc::clone(&over_limits);
            tokio::spawn(watch_server(Arc::new(watch), pid, said))
        });
        let (Some(stdin), Some(stdout), Some(mut stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(format!("MCP server `{program}` has no stdio"));
        };
        let kept = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = Arc::clone(&kept);
        let stderr_task = tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let mut kept = match sink.lock() {
                    Ok(g) => g,
                    Err(p) => p.into_inner(),
                };
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > STDERR_BYTES_MAX {
                    let cut = kept.len() - STDERR_BYTES_MAX;
                    kept.drain(..cut);
                }
            }
        });
        let mut server = Server {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            stderr: kept,
            stderr_task: Some(stderr_task),
            next_id: 1,
            notifications: 0,
            watch,
            over_limits,
        };
        let init = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "baton", "version": env!("CARGO_PKG_VERSION")},
        });
        match server.request("initialize", init).await? {
            Answer::Result(_) => {}
            Answer::Error { code, message } => {
                return Err(format!(
                    "the server refused `initialize`: JSON-RPC error {code}: {message}"
                ));
            }
        }
        server.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await?;
        Ok(server)
    }

    fn stderr_tail(&self) -> String {
        let kept = match self.stderr.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        };
        let text = String::from_utf8_lossy(&kept).into_owned();
        tail(text.trim(), 1024).to_owned()
    }

    async fn send(&mut self, message: &Value) -> Result<(), String> {
        let mut line = message.to_string();
        line.push('\n');
        let written = match self.stdin.write_all(line.as_bytes()).await {
            Ok(()) => self.stdin.flush().await,
            Err(e) => Err(e),
        };
        match written {
            Ok(()) => Ok(()),
            // A closed pipe: the server is gone; say how, with what it printed.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                let method = message.get("method").and_then(Value::as_str).unwrap_or("a message");
                Err(self.gone(&format!("reading `{method}`")).await)
            }
            Err(e) => Err(format!("cannot write to the MCP server: {e}")),
        }
    }

    /// Why the server stopped talking: its exit, after a moment for it to end and for the
    /// last of its stderr, which usually says why.
    async fn gone(&mut self, before: &str) -> String {
        let status = tokio::time::timeout(Duration::from_secs(1), self.child.wait())
            .await
            .ok()
            .and_then(Result::ok);
        if let Some(task) = self.stderr_task.take() {
            let _ = tokio::time::timeout(Duration::from_millis(500), task).await;
        }
        let stopped = match self.over_limits.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        };
        if let Some(why) = stopped {
            return format!("the MCP server was stopped before {before}: {why}");
        }
        let how = status.map_or("closed its output".to_owned(), |s| format!("exited ({s})"));
        let stderr = self.stderr_tail();
        let stderr =
            if stderr.is_empty() { String::new() } else { format!("; its stderr: {stderr}") };
        format!("the MCP server {how} before {before}{stderr}")
    }

    /// Sends a request and reads until its answer, handling what comes in between.
    async fn request(&mut self, method: &str, params: Value) -> Result<Answer, String> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await?;
        loop {
            let Some(line) = read_line(&mut self.stdout, MESSAGE_BYTES_MAX).await? else {
                return Err(self.gone(&format!("answering `{method}`")).await);
            };
            // A line that is not JSON (a stray log line) is not part of the conversation.
            let Ok(message) = serde_json::from_slice::<Value>(&line) else { continue };
            let incoming_method = message.get("method").and_then(Value::as_str);
            match (message.get("id"), incoming_method) {
                // The server asks something of the client.
                (Some(their_id), Some(asked)) => {
                    let reply = if asked == "ping" {
                        json!({"jsonrpc": "2.0", "id": their_id, "result": {}})
                    } else {
                        json!({"jsonrpc": "2.0", "id": their_id, "error": {"code": -32601, "message": format!("baton does not offer `{asked}`")}})
                    };
                    self.send(&reply).await?;
                }
                (None, Some(_)) => self.notifications += 1,
                (Some(answer_id), None) if answer_id.as_u64() == Some(id) => {
                    if let Some(error) = message.get("error") {
                        return Ok(Answer::Error {
                            code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
                            message: error
                                .get("message")
                                .and_then(Value::as_str)
                                .unwrap_or("no message")
                                .to_owned(),
                        });
                    }
                    return Ok(Answer::Result(
                        message.get("result").cloned().unwrap_or(Value::Null),
                    ));
                }
                // An answer to something else, or noise: not ours.
                _ => {}
            }
        }
    }
}

/// Reads one line (without its newline); `None` at the end of the stream. A line longer
/// than `max` is an error.
async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> Result<Option<Vec<u8>>, String> {
    let mut line = Vec::new();
    loop {
        let buf =
            reader.fill_buf().await.map_err(|e| format!("cannot read from the MCP server: {e}"))?;
        if buf.is_empty() {
            return Ok((!line.is_empty()).then_some(line));
        }
        let (take, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(at) => (at + 1, true),
            None => (buf.len(), false),
        };
        line.extend_from_slice(&buf[..take]);
        reader.consume(take);
        if line.len() > max {
            return Err(format!("the MCP server sent a message over {max} bytes"));
        }
        if done {
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(Some(line));
        }
    }
}

/// The verifier's `arguments` with every string rendered as a template.
fn render_arguments(arguments: &Value, ctx: &VerifyContext) -> Result<Value, String> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.set_fuel(Some(100_000));
    let values = json!({
        "workspace": ctx.workspace.display().to_string(),
        "input": ctx.input,
        "output": ctx.output,
        "parsed": ctx.parsed,
        "scratchpad": ctx.scratchpad,
    });
    fn walk(v: &Value, env: &minijinja::Environment<'_>, values: &Value) -> Result<Value, String> {
        Ok(match v {
            Value::String(s) if s.contains("{{") || s.contains("{%") => Value::String(
                env.render_str(s, minijinja::Value::from(minijinja::value::Serde(values)))
                    .map_err(|e| format!("cannot render argument `{s}`: {e}"))?,
            ),
            Value::Array(items) => {
                Value::Array(items.iter().map(|i| walk(i, env, values)).collect::<Result<_, _>>()?)
            }
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, i)| Ok((k.clone(), walk(i, env, values)?)))
                    .collect::<Result<_, String>>()?,
            ),
            other => other.clone(),
        })
    }
    walk(arguments, &env, &values)
}

/// The text items of a result's content, joined and bounded.
fn content_text(result: &Value) -> String {
    let text: Vec<&str> = result
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("text").and_then(Value::as_str))
        .collect();
    let joined = text.join("\n");
    let mut cut = joined.len().min(RESULT_TEXT_BYTES_MAX);
    while !joined.is_char_boundary(cut) {
        cut -= 1;
    }
    joined[..cut].to_owned()
}

impl McpVerifier {
    async fn check(
        &self,
        spec: &VerifierSpec,
        ctx: &VerifyContext,
        jail: &Jail,
        started: Instant,
    ) -> VerifierFinished {
        let argv: Vec<String> = spec
            .params
            .get("server")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        let Some(tool) = spec.params.get("tool").and_then(Value::as_str) else {
            return unavailable(spec, "the verifier names no `tool`");
        };
        let env = spec.params.get("env").and_then(Value::as_object).cloned().unwrap_or_default();
        let reuse = spec.params.get("reuse").and_then(Value::as_bool) == Some(true);
        let arguments = match render_arguments(
            spec.params.get("arguments").unwrap_or(&Value::Object(Map::new())),
            ctx,
        ) {
            Ok(a) => a,
            Err(why) => return unavailable(spec, &why),
        };
        let network = spec.params.get("network").and_then(Value::as_bool) == Some(true);
        let key = json!([argv, ctx.workspace.display().to_string(), env, network]).to_string();
        let server = if reuse {
            let mut servers = self.servers.lock().await;
            let alive = match servers.get(&key) {
                Some(s) => s.lock().await.child.try_wait().ok().flatten().is_none(),
                None => false,
            };
            if !alive {
                match Server::start(&argv, ctx, jail, &env, network).await {
                    Ok(s) => {
                        servers.insert(key.clone(), Arc::new(Mutex::new(s)));
                    }
                    Err(why) => return unavailable(spec, &why),
                }
            }
            match servers.get(&key) {
                Some(s) => Arc::clone(s),
                None => return unavailable(spec, "the MCP server is gone"),
            }
        } else {
            match Server::start(&argv, ctx, jail, &env, network).await {
                Ok(s) => Arc::new(Mutex::new(s)),
                Err(why) => return unavailable(spec, &why),
            }
        };
        let mut server = server.lock().await;
        let answer =
            server.request("tools/call", json!({"name": tool, "arguments": arguments})).await;
        let notifications = server.notifications;
        if !reuse {
            let _ = server.child.start_kill();
        }
        drop(server);
        let answer = match answer {
            Ok(a) => a,
            Err(why) => {
                if reuse {
                    // A server that broke is not kept for the next call.
                    self.servers.lock().await.remove(&key);
                }
                return unavailable(spec, &why);
            }
        };
        let mut details = json!({"tool": tool, "notifications": notifications});
        let mut reasons = Vec::new();
        let passed = match answer {
            Answer::Error { code, message } => {
                reasons.push(format!("`{tool}` failed: JSON-RPC error {code}: {message}"));
                details["error"] = json!({"code": code, "message": message});
                false
            }
            Answer::Result(result) => {
                let text = content_text(&result);
                details["content"] = Value::String(text.clone());
                let structured = result.get("structuredContent").cloned().or_else(|| {
                    // Servers without structured output often answer JSON as text.
                    serde_json::from_str::<Value>(&text).ok().filter(Value::is_object)
                });
                if let Some(s) = &structured {
                    details["structured"] = s.clone();
                }
                if result.get("isError").and_then(Value::as_bool) == Some(true) {
                    reasons.push(format!("`{tool}` reported an error: {}", tail(&text, 500)));
                    false
                } else if let Some(condition) = spec.params.get("condition").and_then(Value::as_str)
                {
                    match condition_holds(condition, structured.as_ref()) {
                        Ok((true, _)) => true,
                        Ok((false, read)) => {
                            reasons.push(format!("condition `{condition}` does not hold ({read})"));
                            false
                        }
                        Err(why) => {
                            reasons.push(why);
                            false
                        }
                    }
                } else {
                    true
                }
            }
        };
        checked(spec, passed, reasons, started, details)
    }
}

/// Evaluates a condition over the structured result; says what it read.
fn condition_holds(condition: &str, structured: Option<&Value>) -> Result<(bool, String), String> {
    let scope = Scope { result: true, ..Scope::default() };
    let gate = expr::parse(condition)
        .map_err(|e| format!("condition `{condition}`: {}", e.message))
        .and_then(|e| {
            expr::resolve(&e, &scope).map_err(|e| format!("condition `{condition}`: {}", e.message))
        })?;
    let doc = json!({"result": structured.cloned().unwrap_or(Value::Null)});
    let (fires, readings) = gate.fires_traced(&JsonContext(&doc));
    let read: Vec<String> = readings.iter().map(|r| format!("{} = {}", r.path, r.value)).collect();
    Ok((
        fires,
        if read.is_empty() {
            "no values read".to_owned()
        } else {
            format!("read {}", read.join(", "))
        },
    ))
}

impl Confined for McpVerifier {
    fn verify<'a>(
        &'a self,
        spec: &'a VerifierSpec,
        ctx: &'a VerifyContext,
        jail: &'a Jail,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, VerifierFinished> {
        Box::pin(async move {
            let started = Instant::now();
            let timeout = Duration::from_secs_f64(spec.timeout_s.unwrap_or(TIMEOUT_S_DEFAULT));
            let mut outcome = tokio::select! {
                outcome = self.check(spec, ctx, jail, started) => outcome,
                () = tokio::time::sleep(timeout) => unavailable(
                    spec,
                    &format!("the MCP server did not answer within {:.0} s", timeout.as_secs_f64()),
                ),
                () = cancel.cancelled() => unavailable(spec, "cancelled"),
            };
            outcome.duration_ms = elapsed_ms(started);
            outcome
        })
    }
}
