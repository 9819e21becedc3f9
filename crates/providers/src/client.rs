//! The HTTP clients: one streamed call to an OpenAI-compatible or Anthropic endpoint, with
//! retries, and [`Providers`], the engine's `ModelProvider` over the configured providers.
//!
//! Faults: 401/403 is an authentication error naming the provider and the key's variable,
//! never retried; 429, 5xx, connect and read timeouts, dropped streams and in-stream `error`
//! events (`overloaded_error`) are retried with exponential backoff and jitter, honouring
//! `Retry-After`, within bounded attempts and time, and each retry is reported to the engine;
//! a malformed stream is an error naming the provider, the model and the request id, and so
//! are wrong answers (no choices, a refusal, a body over the cap), which are never retried;
//! a whole JSON body answering a streaming request is read as the response it is. API keys
//! go into headers only — never into errors, logs or events. A cancel aborts a stream at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use baton_engine::cancel::{CancelToken, Progress};
use baton_engine::event::{ModelCallCut, ProviderFailover, ProviderRetry, Usage as EngineUsage};
use baton_engine::model::{
    BoxFuture, ModelError, ModelProvider, ModelReply, ModelRequest, STOP_MAX_TOKENS, ToolCall, Turn,
};
use serde_json::{Value, json};

use crate::config::{Config, Kind, Model, Provider};
use crate::egress::EgressPolicy;
use crate::resolve::{Choice, chain};
use crate::{Reply, Stop, StreamError, anthropic, openai, sse};

/// Attempts of one call to one provider (the first and its retries).
pub const ATTEMPTS_MAX: u32 = 4;
/// Longest time spent retrying one provider.
pub const RETRY_TIME_MAX: Duration = Duration::from_secs(60);
/// First backoff; it doubles with each retry.
pub const BACKOFF_BASE: Duration = Duration::from_millis(250);
/// Longest wait between two attempts, unless a level's `retry.backoff_max_s` says
/// otherwise; a `Retry-After` is honoured up to it too.
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(30);
/// Time to connect.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest silence while reading a response.
pub const READ_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a call whose deadline passed waits for its driver to cut it before it fails on
/// its own.
pub const DEADLINE_GRACE: Duration = Duration::from_secs(1);
/// Largest response body read from a provider.
pub const RESPONSE_BYTES_MAX: usize = 16 * 1024 * 1024;

/// Why a call to one provider failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CallError {
    #[error("{provider}: authentication failed (HTTP {status}); {}", if *sent { format!("check the key in ${env}") } else { format!("no key was sent: set ${env} (or name the key's variable with `api_key_env` in baton.toml)") })]
    Auth {
        provider: String,
        status: u16,
        /// The variable the key is read from (the kind's usual one when none is configured).
        env: String,
        /// Whether a key was sent at all.
        sent: bool,
    },
    #[error("{provider} ({model}): HTTP {status}{}: {message}", request_id.as_ref().map(|r| format!(", request {r}")).unwrap_or_default())]
    Http {
        provider: String,
        model: String,
        status: u16,
        message: String,
        request_id: Option<String>,
        retry_after: Option<Duration>,
    },
    #[error("{provider} ({model}): {message}")]
    Transport { provider: String, model: String, message: String },
    #[error("{provider} ({model}){}: {source}", request_id.as_ref().map(|r| format!(", request {r}")).unwrap_or_default())]
    Stream { provider: String, model: String, request_id: Option<String>, source: StreamError },
    #[error("{provider} ({model}): the model refused{}", reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default())]
    Refused { provider: String, model: String, reason: Option<String> },
    /// The attempt's deadline came before the answer: the level is out of time, which its
    /// driver records; not an outage, and never retried.
    #[error(
        "{provider} ({model}): no answer before the level's deadline ({waited_ms} ms of silence)"
    )]
    OutOfTime { provider: String, model: String, waited_ms: u64 },
    /// The egress guard refused the provider's URL (see `[egress]`); never retried.
    #[error("{provider}: not called: {why}")]
    Egress { provider: String, why: String },
    #[error("cancelled")]
    Cancelled,
}

impl CallError {
    /// Whether the fault passes: a 429, a 5xx, a connection or read failure, an
    /// interrupted or overloaded stream. The rest (auth, 400, refusals, wrong answers) are
    /// permanent: the same request fails the same way.
    /// Those are the faults the client retries.
    pub fn transient(&self) -> bool {
        match self {
            CallError::Http { status, .. } => *status == 429 || (500..600).contains(status),
            CallError::Transport { .. } => true,
            // An `error` event in the stream (Anthropic's `overloaded_error`, an OpenAI
            // chunk's `error`) is the server failing mid-answer: as transient as a 5xx.
            CallError::Stream { source, .. } => {
                matches!(source, StreamError::Incomplete | StreamError::Provider(_))
            }
            _ => false,
        }
    }
}

static CRYPTO: Once = Once::new();

/// Installs the process's TLS crypto provider (ring), once, before any client is built.
pub(crate) fn install_crypto() {
    CRYPTO.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// An HTTP client for model providers, through the egress guard.
#[derive(Debug, Clone)]
pub struct Client {
    /// For providers on public hosts: the guard as `[egress]` says.
    public: reqwest::Client,
    /// For providers whose URL is on a loopback or private address (a local server):
    /// [`EgressPolicy::for_configured`].
    local: reqwest::Client,
    egress: EgressPolicy,
}

impl Client {
    /// A client with Baton's timeouts that calls only what `egress` allows (and a provider
    /// configured on a local address, there).
    pub fn new(egress: &EgressPolicy) -> Result<Self, String> {
        install_crypto();
        let build = |policy: &EgressPolicy| {
            policy
                .client(reqwest::Client::builder())
                .connect_timeout(CONNECT_TIMEOUT)
                .read_timeout(READ_TIMEOUT)
                .build()
                .map_err(|e| format!("cannot build the HTTP client: {e}"))
        };
        let local = EgressPolicy { allow_private: true, ..egress.clone() };
        Ok(Client { public: build(egress)?, local: build(&local)?, egress: egress.clone() })
    }

    /// The client that calls `provider`, or why its URL may not be called.
    fn http_for(&self, provider: &Provider) -> Result<&reqwest::Client, String> {
        let url = reqwest::Url::parse(&provider.base_url)
            .map_err(|e| format!("base_url {} is not a URL: {e}", provider.base_url))?;
        let policy = self.egress.for_configured(&url);
        policy.check_url(&url)?;
        Ok(if policy.allow_private { &self.local } else { &self.public })
    }

    /// One call to one provider and model, retried on transient faults within the level's
    /// retry budget (attempts, total time, longest wait) and never past the request's
    /// deadline. A call cut by a cancel after the server began to answer reports what it
    /// spent.
    pub async fn call(
        &self,
        provider: &Provider,
        model: &Model,
        request: &ModelRequest,
        key: Option<&str>,
        cancel: &CancelToken,
    ) -> Result<Reply, CallError> {
        let started = Instant::now();
        let budget = RetryBudget::of(request);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let received = Received::default();
            let result = tokio::select! {
                r = self.once(provider, model, request, key, cancel.progress(), &received) => r,
                () = cancel.cancelled() => {
                    report_cut(cancel, provider, model, request, &received);
                    return Err(CallError::Cancelled);
                }
            };
            match result {
                Ok(reply) => return Ok(reply),
                // The driver cuts the attempt at its deadline: give it a moment to, so the
                // cut is recorded as the timeout it is (with what the call spent).
                Err(e @ CallError::OutOfTime { .. }) => {
                    tokio::select! {
                        () = cancel.cancelled() => {
                            report_cut(cancel, provider, model, request, &received);
                            return Err(CallError::Cancelled);
                        }
                        () = tokio::time::sleep(DEADLINE_GRACE) => return Err(e),
                    }
                }
                Err(e)
                    if e.transient()
                        && attempt < budget.attempts
                        && started.elapsed() < budget.max_time =>
                {
                    let wait = match &e {
                        CallError::Http { retry_after: Some(after), .. } => *after,
                        _ => backoff(attempt),
                    }
                    .min(budget.backoff_max);
                    // No retry past the attempt's deadline: the level is out of time.
                    if request.deadline.is_some_and(|d| Instant::now() + wait >= d) {
                        return Err(e);
                    }
                    // No hidden retry: the engine records each one as `provider_retry`.
                    cancel.progress().retried(
                        &request.level_id,
                        request.call_index,
                        ProviderRetry {
                            provider: provider.name.clone(),
                            model: model.name.clone(),
                            attempt,
                            reason: e.to_string(),
                            wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                        },
                    );
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = cancel.cancelled() => return Err(CallError::Cancelled),
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn once(
        &self,
        provider: &Provider,
        model: &Model,
        request: &ModelRequest,
        key: Option<&str>,
        progress: &Progress,
        received: &Received,
    ) -> Result<Reply, CallError> {
        let max_tokens = request.max_tokens.min(model.max_tokens);
        let transport = |message: String| CallError::Transport {
            provider: provider.name.clone(),
            model: model.name.clone(),
            message,
        };
        let base = provider.base_url.trim_end_matches('/');
        let http = self
            .http_for(provider)
            .map_err(|why| CallError::Egress { provider: provider.name.clone(), why })?;
        let builder = match provider.kind {
            Kind::Openai => {
                let mut body = json!({
                    "model": model.name,
                    "messages": openai_messages(request),
                    "max_tokens": max_tokens,
                    "stream": provider.stream,
                });
                if let Some(t) = request.temperature() {
                    body["temperature"] = json!(t);
                }
                if !request.tools.is_empty() {
                    body["tools"] = request
                        .tools
                        .iter()
                        .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
                        .collect();
                }
                if provider.stream {
                    body["stream_options"] = json!({"include_usage": true});
                }
                if let Some(schema) = &request.schema {
                    body["response_format"] = json!({
                        "type": "json_schema",
                        "json_schema": {"name": "answer", "schema": schema, "strict": false},
                    });
                } else if request.json {
                    body["response_format"] = json!({"type": "json_object"});
                }
                let mut b = http.post(format!("{base}/chat/completions")).json_body(&body);
                if let Some(key) = key {
                    b = b.bearer_auth(key);
                }
                b
            }
            Kind::Anthropic => {
                let mut body = json!({
                    "model": model.name,
                    "max_tokens": max_tokens,
                    "messages": anthropic_messages(request),
                    "stream": provider.stream,
                });
                if let Some(system) = &request.system {
                    body["system"] = json!(system);
                }
                if let Some(t) = request.temperature() {
                    body["temperature"] = json!(t);
                }
                if !request.tools.is_empty() {
                    body["tools"] = request
                        .tools
                        .iter()
                        .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
                        .collect();
                }
                let mut b = http
                    .post(format!("{base}/v1/messages"))
                    .json_body(&body)
                    .header("anthropic-version", "2023-06-01");
                if let Some(key) = key {
                    b = b.header("x-api-key", key);
                }
                b
            }
        };
        // No wait for the server outlasts the attempt's deadline: the read timeout is the
        // level's remaining time when that is shorter.
        let silence = || {
            request.deadline.map_or(READ_TIMEOUT, |d| {
                READ_TIMEOUT.min(d.saturating_duration_since(Instant::now()))
            })
        };
        // Silence up to the read timeout is an outage (retried); silence cut by the deadline
        // is the level running out of time.
        let silent = |wait: Duration| {
            if wait < READ_TIMEOUT {
                CallError::OutOfTime {
                    provider: provider.name.clone(),
                    model: model.name.clone(),
                    waited_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                }
            } else {
                transport(format!("no data for {} s", READ_TIMEOUT.as_secs()))
            }
        };
        let wait = silence();
        let mut response = match tokio::time::timeout(wait, builder.send()).await {
            // A refused redirect is the guard's answer, the same on every try.
            Ok(sent) => sent.map_err(|e| {
                if e.is_redirect() {
                    CallError::Egress { provider: provider.name.clone(), why: describe(&e) }
                } else {
                    transport(describe(&e))
                }
            })?,
            Err(_) => return Err(silent(wait)),
        };
        let status = response.status().as_u16();
        let request_id = ["x-request-id", "request-id"]
            .iter()
            .find_map(|h| response.headers().get(*h))
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if status == 401 || status == 403 {
            return Err(CallError::Auth {
                provider: provider.name.clone(),
                status,
                env: provider.api_key_env.clone().unwrap_or_else(|| {
                    match provider.kind {
                        Kind::Openai => "OPENAI_API_KEY",
                        Kind::Anthropic => "ANTHROPIC_API_KEY",
                    }
                    .to_owned()
                }),
                sent: key.is_some(),
            });
        }
        if status >= 400 {
            let retry_after = response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(|s| Duration::from_secs_f64(s).min(RETRY_AFTER_MAX));
            let body = read_capped(&mut response, 64 * 1024).await.unwrap_or_default();
            let message = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v.get("error").map(crate::provider_message))
                .unwrap_or_else(|| String::from_utf8_lossy(&body).chars().take(300).collect());
            return Err(CallError::Http {
                provider: provider.name.clone(),
                model: model.name.clone(),
                status,
                message,
                request_id,
                retry_after,
            });
        }
        let stream_error = |source: StreamError| CallError::Stream {
            provider: provider.name.clone(),
            model: model.name.clone(),
            request_id: request_id.clone(),
            source,
        };
        // A server that ignores `stream: true` answers with one JSON body: read it whole,
        // as the non-streamed response it is, rather than find no events in it.
        let json_body =
            response.headers().get("content-type").and_then(|v| v.to_str().ok()).is_some_and(|v| {
                v.trim_start().to_ascii_lowercase().starts_with("application/json")
            });
        if !provider.stream || json_body {
            let body = read_capped(&mut response, RESPONSE_BYTES_MAX)
                .await
                .map_err(|_| stream_error(StreamError::Incomplete))?;
            if body.len() > RESPONSE_BYTES_MAX {
                return Err(stream_error(StreamError::Malformed(too_big())));
            }
            let value: Value = serde_json::from_slice(&body).map_err(|e| {
                stream_error(StreamError::Malformed(format!("the response is not JSON: {e}")))
            })?;
            let reply = match provider.kind {
                Kind::Openai => openai::from_response(&value),
                Kind::Anthropic => anthropic::from_response(&value),
            }
            .map_err(&stream_error)?;
            return refused_or(reply, provider, model);
        }
        let mut parser = sse::Parser::new();
        let mut events = Vec::new();
        let mut oa = openai::Assembler::new();
        let mut an = anthropic::Assembler::new();
        let mut read = 0usize;
        let mut shown = 0usize;
        loop {
            let wait = silence();
            let chunk = match tokio::time::timeout(wait, response.chunk()).await {
                Ok(Ok(Some(c))) => c,
                Ok(Ok(None)) => break,
                // A dropped connection mid-stream: the response is incomplete.
                Ok(Err(_)) => return Err(stream_error(StreamError::Incomplete)),
                Err(_) => return Err(silent(wait)),
            };
            read += chunk.len();
            progress.streamed(chunk.len());
            received.bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            if read > RESPONSE_BYTES_MAX {
                return Err(stream_error(StreamError::Malformed(too_big())));
            }
            parser.feed(&chunk, &mut events);
            for e in events.drain(..) {
                match provider.kind {
                    Kind::Openai => oa.push(&e).map_err(&stream_error)?,
                    Kind::Anthropic => an.push(&e).map_err(&stream_error)?,
                }
            }
            let text = match provider.kind {
                Kind::Openai => oa.text(),
                Kind::Anthropic => an.text(),
            };
            // What came since the last chunk, for embedders that show answers live.
            if let Some(new) = text.get(shown..) {
                progress.text(&request.level_id, request.call_index, new);
            }
            shown = text.len();
            received.chars.store(text.len() as u64, Ordering::Relaxed);
        }
        let reply = match provider.kind {
            Kind::Openai => oa.finish(),
            Kind::Anthropic => an.finish(),
        }
        .map_err(&stream_error)?;
        refused_or(reply, provider, model)
    }
}

/// A refusal is an error the caller can see as such; anything else is the reply.
/// A request's conversation as Chat Completions messages: tool calls on the assistant
/// message, each result as a `tool` message naming its call.
fn openai_messages(request: &ModelRequest) -> Vec<Value> {
    let mut messages = Vec::with_capacity(request.turns.len() + 2);
    if let Some(system) = &request.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.push(json!({"role": "user", "content": request.prompt}));
    for turn in &request.turns {
        match turn {
            Turn::Assistant { text, tool_calls } => {
                let mut m = json!({"role": "assistant", "content": text});
                if !tool_calls.is_empty() {
                    m["tool_calls"] = tool_calls
                        .iter()
                        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments.to_string()}}))
                        .collect();
                }
                messages.push(m);
            }
            Turn::Tools { results } => {
                messages.extend(results.iter().map(
                    |r| json!({"role": "tool", "tool_call_id": r.call_id, "content": r.content}),
                ));
            }
            Turn::User { text } => messages.push(json!({"role": "user", "content": text})),
        }
    }
    messages
}

/// A request's conversation as Messages API messages: `tool_use` blocks on the assistant
/// message, the results as `tool_result` blocks of the next user message.
fn anthropic_messages(request: &ModelRequest) -> Vec<Value> {
    let mut messages = vec![json!({"role": "user", "content": request.prompt})];
    for turn in &request.turns {
        match turn {
            Turn::Assistant { text, tool_calls } => {
                let mut blocks: Vec<Value> = Vec::new();
                if !text.trim().is_empty() {
                    blocks.push(json!({"type": "text", "text": text}));
                }
                blocks.extend(tool_calls.iter().map(|c| {
                    json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments})
                }));
                if blocks.is_empty() {
                    // The API refuses an empty message; an empty turn still took place.
                    blocks.push(json!({"type": "text", "text": "(no answer)"}));
                }
                messages.push(json!({"role": "assistant", "content": blocks}));
            }
            Turn::Tools { results } => {
                let blocks: Vec<Value> = results
                    .iter()
                    .map(|r| json!({"type": "tool_result", "tool_use_id": r.call_id, "content": r.content, "is_error": r.is_error}))
                    .collect();
                messages.push(json!({"role": "user", "content": blocks}));
            }
            Turn::User { text } => messages.push(json!({"role": "user", "content": text})),
        }
    }
    messages
}

fn refused_or(reply: Reply, provider: &Provider, model: &Model) -> Result<Reply, CallError> {
    if let Stop::Refusal(reason) = &reply.stop {
        return Err(CallError::Refused {
            provider: provider.name.clone(),
            model: model.name.clone(),
            reason: reason.clone(),
        });
    }
    Ok(reply)
}

/// A small trait so both request kinds set a JSON body the same way.
trait JsonBody {
    fn json_body(self, body: &Value) -> Self;
}

impl JsonBody for reqwest::RequestBuilder {
    fn json_body(self, body: &Value) -> Self {
        self.header("content-type", "application/json").body(body.to_string())
    }
}

/// Why a response over [`RESPONSE_BYTES_MAX`] was refused.
fn too_big() -> String {
    format!(
        "the response exceeds {} MiB, the most Baton reads from a provider; ask for a shorter answer",
        RESPONSE_BYTES_MAX / (1024 * 1024)
    )
}

/// A response body, read up to `limit` bytes (one chunk more shows it was over).
async fn read_capped(
    response: &mut reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        body.extend_from_slice(&chunk);
        if body.len() > limit {
            break;
        }
    }
    Ok(body)
}

/// What went wrong with a request, without its URL's query or any header.
fn describe(e: &reqwest::Error) -> String {
    // The innermost cause says why (the egress guard's refusal among them).
    let mut cause: Option<&dyn std::error::Error> = None;
    let mut next = std::error::Error::source(e);
    while let Some(inner) = next {
        cause = Some(inner);
        next = inner.source();
    }
    let why = cause.map(|c| format!(": {c}")).unwrap_or_default();
    if e.is_timeout() {
        "the request timed out".to_owned()
    } else if e.is_connect() {
        format!("cannot connect{why}")
    } else {
        let mut message = e.to_string();
        if let Some(url) = e.url() {
            message = message.replace(url.as_str(), url.path());
        }
        if e.is_redirect() {
            message.push_str(&why);
        }
        message
    }
}

/// What one request has received so far, for the spend of a call cut short.
#[derive(Debug, Default)]
struct Received {
    bytes: AtomicU64,
    /// Characters of answer text assembled.
    chars: AtomicU64,
}

/// Reports what a call cut by a cancel spent once the server had begun to answer: the
/// prompt (estimated at four characters a token) and the answer received so far, at the
/// model's prices. A request that received nothing reports nothing.
fn report_cut(
    cancel: &CancelToken,
    provider: &Provider,
    model: &Model,
    request: &ModelRequest,
    received: &Received,
) {
    let bytes = received.bytes.load(Ordering::Relaxed);
    if bytes == 0 {
        return;
    }
    let input_tokens = (request.input_chars() / 4 + 1) as u64;
    let output_tokens = received.chars.load(Ordering::Relaxed).div_ceil(4);
    cancel.progress().cut(
        &request.level_id,
        request.call_index,
        ModelCallCut {
            provider: provider.name.clone(),
            model: model.name.clone(),
            streamed_bytes: bytes,
            usage: EngineUsage { input_tokens, output_tokens },
            cost_usd: model.cost_usd(input_tokens, output_tokens, 0),
        },
    );
}

/// The retry budget of one call to one provider: the level's `model.retry`, else the
/// defaults.
#[derive(Clone, Copy, Debug)]
struct RetryBudget {
    attempts: u32,
    max_time: Duration,
    backoff_max: Duration,
}

impl RetryBudget {
    fn of(request: &ModelRequest) -> Self {
        let policy = request.constraint.as_ref().map(|c| c.retry).unwrap_or_default();
        let seconds = |s: Option<f64>, default: Duration| {
            s.and_then(|s| Duration::try_from_secs_f64(s).ok()).unwrap_or(default)
        };
        RetryBudget {
            attempts: policy.attempts.unwrap_or(ATTEMPTS_MAX),
            max_time: seconds(policy.max_time_s, RETRY_TIME_MAX),
            backoff_max: seconds(policy.backoff_max_s, RETRY_AFTER_MAX),
        }
    }
}

/// Exponential backoff with jitter: base × 2^(attempt-1), plus up to half of that again.
pub fn backoff(attempt: u32) -> Duration {
    let exp = BACKOFF_BASE * 2u32.saturating_pow(attempt.saturating_sub(1).min(8));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let jitter = exp.mul_f64(f64::from(nanos % 1000) / 2000.0);
    exp + jitter
}

/// The engine's model provider over the configured providers: a level's constraint picks a
/// chain of models; a provider that fails after its retries hands over to the next.
#[derive(Clone)]
pub struct Providers {
    config: Arc<Config>,
    client: Client,
    /// API keys by variable name, read once; never printed.
    keys: Arc<std::collections::BTreeMap<String, String>>,
}

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Key names only: the values are secrets.
        f.debug_struct("Providers")
            .field("config", &self.config)
            .field("keys", &self.keys.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Providers {
    /// Providers from a configuration; keys are read from the process environment.
    pub fn new(config: Config) -> Result<Self, String> {
        Self::with_env(config, |k| std::env::var(k).ok())
    }

    /// Providers reading keys through `env` (tests pass their own).
    pub fn with_env(config: Config, env: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let keys = config
            .providers
            .iter()
            .filter_map(|p| p.api_key_env.as_deref())
            .filter_map(|name| env(name).map(|v| (name.to_owned(), v)))
            .collect();
        let client = Client::new(&config.egress)?;
        Ok(Providers { config: Arc::new(config), client, keys: Arc::new(keys) })
    }

    fn key(&self, provider: &Provider) -> Option<String> {
        provider.api_key_env.as_deref().and_then(|name| self.keys.get(name).cloned())
    }

    async fn call_chain(
        &self,
        request: &ModelRequest,
        cancel: &CancelToken,
    ) -> Result<ModelReply, ModelError> {
        let choices: Vec<Choice<'_>> = chain(&self.config, request.constraint.as_ref());
        if choices.is_empty() {
            return Err(ModelError::Failed {
                refused: false,
                provider: "policy".to_owned(),
                message: format!(
                    "no configured model satisfies the constraint of level `{}`",
                    request.level_id
                ),
            });
        }
        let mut failures = Vec::new();
        // Whether every model failed for a reason that passes (an outage), not a wrong
        // request or configuration.
        let mut all_transient = true;
        // Whether every model refused to answer.
        let mut all_refused = true;
        for choice in choices {
            let key = self.key(choice.provider);
            if choice.provider.api_key_env.is_some() && key.is_none() {
                let reason = format!(
                    "{}: ${} is not set",
                    choice.provider.name,
                    choice.provider.api_key_env.as_deref().unwrap_or_default()
                );
                failures.push(failover(&choice, reason));
                all_transient = false;
                all_refused = false;
                continue;
            }
            match self
                .client
                .call(choice.provider, choice.model, request, key.as_deref(), cancel)
                .await
            {
                Ok(mut reply) => {
                    if reply.usage.input_tokens == 0 && reply.usage.output_tokens == 0 {
                        // Some servers report no usage: estimate it, so budgets still hold.
                        let out_chars = reply.text.len()
                            + reply
                                .tool_calls
                                .iter()
                                .map(|c| c.arguments.to_string().len() + c.name.len())
                                .sum::<usize>();
                        reply.usage.input_tokens = (request.input_chars() / 4 + 1) as u64;
                        reply.usage.output_tokens = (out_chars / 4 + 1) as u64;
                    }
                    let usage = EngineUsage {
                        input_tokens: reply.usage.input_tokens,
                        output_tokens: reply.usage.output_tokens,
                    };
                    let cost_usd = choice.model.cost_usd(
                        reply.usage.input_tokens,
                        reply.usage.output_tokens,
                        reply.usage.cached_input_tokens,
                    );
                    let tool_calls = reply
                        .tool_calls
                        .into_iter()
                        .map(|c| ToolCall { id: c.id, name: c.name, arguments: c.arguments })
                        .collect();
                    let routing = baton_engine::event::RoutingDecision {
                        tier: choice.tier.as_str().to_owned(),
                        provider: choice.provider.name.clone(),
                        model: choice.model.name.clone(),
                        source: choice.source.to_owned(),
                        // Each failover is its own `provider_failover` event now.
                        failovers: Vec::new(),
                    };
                    let stop_reason = match reply.stop {
                        Stop::EndTurn | Stop::ToolUse | Stop::StopSequence => None,
                        Stop::MaxTokens => Some(STOP_MAX_TOKENS.to_owned()),
                        Stop::Refusal(_) => Some("refusal".to_owned()),
                        Stop::Other(other) => Some(other),
                    };
                    return Ok(ModelReply {
                        routing: Some(routing),
                        provider: choice.provider.name.clone(),
                        model: choice.model.name.clone(),
                        text: reply.text,
                        tool_calls,
                        usage,
                        cost_usd,
                        stop_reason,
                        failovers: std::mem::take(&mut failures),
                    });
                }
                Err(CallError::Cancelled) => return Err(ModelError::Cancelled),
                Err(e) => {
                    all_transient &= e.transient();
                    all_refused &= matches!(e, CallError::Refused { .. });
                    failures.push(failover(&choice, e.to_string()));
                }
            }
        }
        let reasons: Vec<&str> = failures.iter().map(|f| f.reason.as_str()).collect();
        let (provider, message) = ("providers".to_owned(), reasons.join("; "));
        if all_transient {
            // The failovers are not recorded on this path; their reasons are the message.
            return Err(ModelError::Unavailable { provider, message });
        }
        Err(ModelError::Failed { provider, message, refused: all_refused })
    }
}

/// A provider of the chain that failed, for its `provider_failover` event.
fn failover(choice: &Choice<'_>, reason: String) -> ProviderFailover {
    ProviderFailover {
        provider: choice.provider.name.clone(),
        model: choice.model.name.clone(),
        reason,
    }
}

impl ModelProvider for Providers {
    fn call<'a>(
        &'a self,
        request: &'a ModelRequest,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<ModelReply, ModelError>> {
        Box::pin(self.call_chain(request, cancel))
    }

    fn worst_case_cost_usd(&self, request: &ModelRequest) -> f64 {
        let Some(first) = chain(&self.config, request.constraint.as_ref()).into_iter().next()
        else {
            return 0.0;
        };
        let input = (request.input_chars() / 4 + 1) as u64;
        let output = u64::from(request.max_tokens.min(first.model.max_tokens));
        first.model.cost_usd(input, output, 0)
    }
}
