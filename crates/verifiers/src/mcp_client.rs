//! A client of an MCP server over stdio, for the `mcp` verifier and the user's MCP tools.
//!
//! The server is a command started in the jail, in a workspace, with a scrubbed
//! environment (plus the caller's variables), in its own process group. The client speaks
//! newline-delimited JSON-RPC 2.0: `initialize`, `notifications/initialized`, then the
//! caller's requests. Notifications the server sends on its own are counted and skipped;
//! requests it makes of the client are answered "method not found" (or `ping` with an empty
//! result). Dropping the server kills its process group.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use crate::program::{Program, jailed_command, kill_group, over_limits};
use baton_engine::verifier::tail;
use baton_jail::Jail;
use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// The protocol revision the client asks for.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// Largest message a server may send, in bytes.
const MESSAGE_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Bytes of a server's stderr kept for error messages.
const STDERR_BYTES_MAX: usize = 8 * 1024;
/// A running server and its side of the conversation.
#[derive(Debug)]
pub struct McpServer {
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

impl Drop for McpServer {
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
#[derive(Debug)]
pub enum Answer {
    Result(Value),
    Error { code: i64, message: String },
}

impl McpServer {
    /// Starts the server `argv` in the jail, in `workspace` with `env` on top of the
    /// scrubbed environment, and goes through `initialize`.
    pub async fn start(
        argv: &[String],
        workspace: &Path,
        jail: &Jail,
        env: Vec<(String, String)>,
        network: bool,
    ) -> Result<McpServer, String> {
        let Some(program) = argv.first() else {
            return Err("`server` names no command".to_owned());
        };
        let jailed = jailed_command(
            jail,
            &Program {
                argv: argv.to_vec(),
                cwd: workspace.to_path_buf(),
                workspace: workspace.to_path_buf(),
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
        let mut server = McpServer {
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

    /// How many notifications the server sent on its own (skipped).
    pub fn notifications(&self) -> u64 {
        self.notifications
    }

    /// Whether the server is still running.
    pub fn is_alive(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }

    /// Stops the server (its process group goes when it is dropped).
    pub fn stop(&mut self) {
        let _ = self.child.start_kill();
    }

    /// The end of what the server wrote to stderr.
    pub fn stderr_tail(&self) -> String {
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
    pub async fn request(&mut self, method: &str, params: Value) -> Result<Answer, String> {
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
                    return Ok(answer_of(&message));
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

/// A JSON-RPC response as an [`Answer`]: its error, or its result.
pub fn answer_of(message: &Value) -> Answer {
    match message.get("error") {
        Some(error) => Answer::Error {
            code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("no message")
                .to_owned(),
        },
        None => Answer::Result(message.get("result").cloned().unwrap_or(Value::Null)),
    }
}

/// The text items of a result's content, joined.
pub fn content_text(result: &Value) -> String {
    let text: Vec<&str> = result
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("text").and_then(Value::as_str))
        .collect();
    text.join("\n")
}
