//! `mcp` tools: the tools of an MCP server, over stdio or Streamable HTTP. The server of
//! each toolset a level lists is started in the jail, in the level's workspace and with no
//! network (or, at a URL, a session opened through the egress guard) when an attempt
//! begins, asked for its tools (`tools/list`, every page), and stopped (the session ended)
//! when the attempt ends; a call is `tools/call` with the write call's idempotency key in
//! `_meta`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use baton_engine::cancel::CancelToken;
use baton_engine::tools::{Listed, OwnCall};
use baton_engine::workspace::ToolOutcome;
use baton_jail::Jail;
use baton_scenario::model::{McpServer as ServerSpec, McpTransport};
use baton_verifiers::mcp_client::{Answer, McpServer, content_text};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::http::HttpTools;
use crate::mcp_http::HttpServer;

/// The `_meta` key a write call's idempotency key goes in.
pub const KEY_META: &str = "baton/idempotency-key";

/// Longest a server may take to start and list its tools.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Most pages of `tools/list` read from one server.
const LIST_PAGES_MAX: usize = 20;

/// Most tools one server may list.
const LISTED_MAX: usize = 1_000;

/// A toolset's running server, or its session over HTTP.
#[derive(Debug)]
pub(crate) enum Running {
    Stdio(Box<Mutex<McpServer>>),
    Http(HttpServer),
}

impl Running {
    async fn request(&self, method: &str, params: Value) -> Result<Answer, String> {
        match self {
            Running::Stdio(server) => server.lock().await.request(method, params).await,
            Running::Http(server) => server.request(method, params).await,
        }
    }

    /// Ends an HTTP session (a stdio server stops when dropped).
    pub(crate) async fn end(&self) {
        if let Running::Http(server) = self {
            server.end().await;
        }
    }
}

/// Starts the server of `spec` and lists its tools: what it says of each, and the server.
pub(crate) async fn start(
    spec: &ServerSpec,
    workspace: &Path,
    jail: &Jail,
    http: &HttpTools,
    cancel: &CancelToken,
) -> Result<(Running, BTreeMap<String, Listed>), String> {
    let started = async {
        let server = match &spec.transport {
            McpTransport::Stdio { argv, env } => Running::Stdio(Box::new(Mutex::new(
                McpServer::start(argv, workspace, jail, env.clone(), false).await?,
            ))),
            McpTransport::Http { url } => {
                let url =
                    reqwest::Url::parse(url).map_err(|e| format!("`{url}` is not a URL: {e}"))?;
                http.egress().check_url(&url)?;
                Running::Http(HttpServer::start(http.client()?.clone(), url).await?)
            }
        };
        let mut listed = BTreeMap::new();
        let mut cursor: Option<String> = None;
        for _ in 0..LIST_PAGES_MAX {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let page = match server.request("tools/list", params).await? {
                Answer::Result(page) => page,
                Answer::Error { code, message } => {
                    return Err(format!("`tools/list` failed: JSON-RPC error {code}: {message}"));
                }
            };
            for tool in page.get("tools").and_then(Value::as_array).into_iter().flatten() {
                let Some(name) = tool.get("name").and_then(Value::as_str) else { continue };
                if listed.len() >= LISTED_MAX {
                    return Err(format!("the server lists more than {LISTED_MAX} tools"));
                }
                listed.insert(
                    name.to_owned(),
                    Listed {
                        description: tool
                            .get("description")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                        schema: tool
                            .get("inputSchema")
                            .cloned()
                            .unwrap_or_else(|| json!({"type": "object"})),
                        read_only_hint: tool
                            .pointer("/annotations/readOnlyHint")
                            .and_then(Value::as_bool)
                            .unwrap_or(false),
                    },
                );
            }
            cursor = page.get("nextCursor").and_then(Value::as_str).map(str::to_owned);
            if cursor.is_none() {
                break;
            }
        }
        Ok((server, listed))
    };
    tokio::select! {
        r = started => r,
        () = tokio::time::sleep(START_TIMEOUT) => Err(format!(
            "it did not start and list its tools within {} s", START_TIMEOUT.as_secs()
        )),
        () = cancel.cancelled() => Err("cancelled".to_owned()),
    }
}

impl Running {
    /// One `tools/call`, within the call's deadline.
    pub(crate) async fn call(&self, call: OwnCall<'_>, cancel: &CancelToken) -> ToolOutcome {
        let name = &call.tool.name;
        let mut params = json!({"name": name, "arguments": call.arguments});
        if let Some(key) = call.key {
            params["_meta"] = json!({ KEY_META: key });
        }
        let left = call.deadline.saturating_duration_since(Instant::now());
        let answered = self.request("tools/call", params);
        let answer = tokio::select! {
            a = answered => a,
            () = tokio::time::sleep(left) => Err(format!("no answer within {:.0} s", left.as_secs_f64())),
            () = cancel.cancelled() => Err("cancelled".to_owned()),
        };
        match answer {
            Err(why) => ToolOutcome::error(format!("`{name}` did not answer: {why}")),
            Ok(Answer::Error { code, message }) => {
                ToolOutcome::error(format!("`{name}` failed: JSON-RPC error {code}: {message}"))
            }
            Ok(Answer::Result(result)) => {
                let mut text = content_text(&result);
                if text.is_empty()
                    && let Some(structured) = result.get("structuredContent")
                {
                    text = structured.to_string();
                }
                if result.get("isError").and_then(Value::as_bool) == Some(true) {
                    ToolOutcome::error(text)
                } else {
                    ToolOutcome::ok(text)
                }
            }
        }
    }
}
