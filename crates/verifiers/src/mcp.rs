//! The `mcp` verifier: calls one tool of an MCP server over stdio and checks the result.
//!
//! The server is a command (`server: [argv…]`) started in the workspace with a scrubbed
//! environment (plus the verifier's `env`), through [`crate::mcp_client`]; the call is
//! `tools/call` with the verifier's `arguments`, whose strings are templates (minijinja)
//! over `workspace`, `input`, `output`, `parsed` and `scratchpad`. The call fails when the
//! server answers a JSON-RPC error or a result with `isError: true` — the two styles
//! servers use — and, with a `condition` (the gate language over `result.<…>`, the tool's
//! structured content), when the condition does not hold. With `reuse: true` the server
//! stays up for the next call of the same verifier with the same command, workspace and
//! environment; otherwise it is stopped after the call.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::confined::Confined;
use crate::mcp_client::{Answer, McpServer};
use baton_engine::cancel::CancelToken;
use baton_engine::clock::elapsed_ms;
use baton_engine::event::VerifierFinished;
use baton_engine::model::BoxFuture;
use baton_engine::verifier::{VerifyContext, checked, tail, unavailable};
use baton_jail::Jail;
use baton_scenario::expr::{self, JsonContext, Scope};
use baton_scenario::model::VerifierSpec;
use serde_json::{Map, Value, json};
use tokio::sync::Mutex;

/// Default timeout of one verification (start, handshake and call), in seconds.
const TIMEOUT_S_DEFAULT: f64 = 120.0;
/// Text of a result kept in reasons and details, in bytes.
const RESULT_TEXT_BYTES_MAX: usize = 4 * 1024;

/// Calls a tool of an MCP server; keeps servers started with `reuse: true`.
#[derive(Debug, Default)]
pub struct McpVerifier {
    servers: Mutex<HashMap<String, Arc<Mutex<McpServer>>>>,
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

/// The variables of a verifier's `env` whose values are strings.
fn string_env(env: &Map<String, Value>) -> Vec<(String, String)> {
    env.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect()
}

/// The text items of a result's content, joined and bounded.
fn content_text(result: &Value) -> String {
    let joined = crate::mcp_client::content_text(result);
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
                Some(s) => s.lock().await.is_alive(),
                None => false,
            };
            if !alive {
                match McpServer::start(&argv, &ctx.workspace, jail, string_env(&env), network).await
                {
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
            match McpServer::start(&argv, &ctx.workspace, jail, string_env(&env), network).await {
                Ok(s) => Arc::new(Mutex::new(s)),
                Err(why) => return unavailable(spec, &why),
            }
        };
        let mut server = server.lock().await;
        let answer =
            server.request("tools/call", json!({"name": tool, "arguments": arguments})).await;
        let notifications = server.notifications();
        if !reuse {
            server.stop();
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
