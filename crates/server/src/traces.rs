//! OpenTelemetry traces over OTLP/HTTP (protobuf), opt-in with `--otlp-endpoint`: a span per
//! run, level attempt, model call, tool call and verifier, read off the events this server
//! appends (like the metrics), with the run id and scenario as attributes.
//!
//! Spans are closed by their end events and take their start from the start event this
//! process saw (else from the duration the end event records). Ids are derived, not random:
//! a job's trace id from its first run's id, a span's id from what it is, so the spans of a
//! run driven by two servers in turn still form one trace. A child run's span hangs under
//! its parent run's.
//!
//! The exporter batches spans (at most [`BATCH_MAX`] per request, at least every
//! [`FLUSH_EVERY`]) from a bounded queue — a full queue drops spans and counts them — and
//! posts each batch at most [`ATTEMPTS_MAX`] times, waiting longer each time; a batch it
//! gives up on is dropped with a line on stderr. Only `http://` endpoints (a local
//! collector): the body is the protobuf of `ExportTraceServiceRequest`, encoded here by
//! hand from the official definitions (field numbers in the comments).

#![allow(clippy::print_stderr)]

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use baton_engine::event::{Event, EventData};
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Spans per export request.
pub(crate) const BATCH_MAX: usize = 512;
/// How long a span waits for its batch at most.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Posts of one batch before it is dropped.
pub(crate) const ATTEMPTS_MAX: u32 = 3;
/// Spans waiting to be exported before new ones are dropped.
const QUEUE_MAX: usize = 8_192;

/// An attribute value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

/// A finished span.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Span {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent: Option<[u8; 8]>,
    pub name: String,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub attributes: Vec<(String, Value)>,
    pub error: Option<String>,
}

fn digest(parts: &[&str]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    h.finalize().into()
}

fn trace_id(root: &str) -> [u8; 16] {
    let d = digest(&["trace", root]);
    let mut id = [0; 16];
    id.copy_from_slice(&d[..16]);
    id
}

fn span_id(parts: &[&str]) -> [u8; 8] {
    let d = digest(parts);
    let mut id = [0; 8];
    id.copy_from_slice(&d[..8]);
    id
}

/// What later events of a run need from earlier ones.
#[derive(Default)]
struct Open {
    /// Span starts by key.
    starts: HashMap<String, DateTime<Utc>>,
    /// A run's job root, scenario and parent run.
    runs: HashMap<String, RunInfo>,
}

#[derive(Clone, Debug, Default)]
struct RunInfo {
    root: String,
    scenario: String,
    parent: Option<String>,
}

/// Reads spans off events and hands them to the exporter.
pub(crate) struct Tracer {
    open: Mutex<Open>,
    queue: mpsc::Sender<Span>,
    pub(crate) dropped: AtomicU64,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tracer")
    }
}

impl Tracer {
    /// A tracer exporting to `endpoint` (`http://HOST:PORT`, the collector's OTLP/HTTP
    /// address; `/v1/traces` is added), and the exporter's task to spawn.
    pub(crate) fn new(
        endpoint: &str,
        stop: baton_engine::cancel::CancelToken,
    ) -> Result<(Self, impl Future<Output = ()> + Send + 'static), String> {
        let rest = endpoint.strip_prefix("http://").ok_or_else(|| {
            format!("--otlp-endpoint {endpoint:?}: only http:// endpoints (a local collector's OTLP/HTTP port, 4318) are supported")
        })?;
        let (authority, path) = match rest.split_once('/') {
            Some((a, p)) if !p.trim_matches('/').is_empty() => {
                (a.to_owned(), format!("/{}", p.trim_end_matches('/')))
            }
            Some((a, _)) => (a.to_owned(), "/v1/traces".to_owned()),
            None => (rest.to_owned(), "/v1/traces".to_owned()),
        };
        if authority.is_empty() {
            return Err(format!("--otlp-endpoint {endpoint:?} names no host"));
        }
        let (queue, spans) = mpsc::channel(QUEUE_MAX);
        let tracer = Tracer { open: Mutex::default(), queue, dropped: AtomicU64::new(0) };
        Ok((tracer, export(authority, path, spans, stop)))
    }

    /// Whether reading `events` needs the run's record (this process did not see it start).
    pub(crate) fn knows(&self, run_id: &str) -> bool {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .runs
            .contains_key(run_id)
    }

    /// Notes a run this process did not see start: its job's root and scenario.
    pub(crate) fn learn(&self, run_id: &str, root: &str, scenario: &str, parent: Option<&str>) {
        let info = RunInfo {
            root: root.to_owned(),
            scenario: scenario.to_owned(),
            parent: parent.map(str::to_owned),
        };
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .runs
            .insert(run_id.to_owned(), info);
    }

    /// The spans a stored batch of a run's events closes, sent to the exporter.
    pub(crate) fn record(&self, run_id: &str, events: &[Event]) {
        for span in self.read(run_id, events) {
            if self.queue.try_send(span).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn read(&self, run_id: &str, events: &[Event]) -> Vec<Span> {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = Vec::new();
        for e in events {
            let level = e.level_id.clone().unwrap_or_default();
            let attempt = e.attempt.unwrap_or(0).to_string();
            if let EventData::ScenarioStarted(s) = &e.data {
                let (root, parent) = match &s.parent {
                    Some(p) => (p.root_run_id.clone(), Some(p.parent_run_id.clone())),
                    None => (run_id.to_owned(), None),
                };
                open.runs.insert(
                    run_id.to_owned(),
                    RunInfo { root, scenario: s.scenario_id.clone(), parent },
                );
                open.starts.insert(format!("run|{run_id}"), e.at);
                continue;
            }
            let info = open
                .runs
                .get(run_id)
                .cloned()
                .unwrap_or_else(|| RunInfo { root: run_id.to_owned(), ..RunInfo::default() });
            let trace = trace_id(&info.root);
            let run_span = span_id(&["run", run_id]);
            let level_span = span_id(&["level", run_id, &level, &attempt]);
            let common = |extra: Vec<(String, Value)>| {
                let mut a = vec![
                    ("baton.run_id".to_owned(), Value::Str(run_id.to_owned())),
                    ("baton.scenario".to_owned(), Value::Str(info.scenario.clone())),
                ];
                a.extend(extra);
                a
            };
            let mut started =
                |key: String, fallback: DateTime<Utc>| open.starts.remove(&key).unwrap_or(fallback);
            match &e.data {
                EventData::LevelStarted(_) => {
                    open.starts.insert(format!("level|{run_id}|{level}|{attempt}"), e.at);
                }
                EventData::LevelFinished(f) => {
                    let fallback = e.at
                        - chrono::Duration::milliseconds(i64::try_from(f.duration_ms).unwrap_or(0));
                    out.push(Span {
                        trace_id: trace,
                        span_id: level_span,
                        parent: Some(run_span),
                        name: format!("level {level}"),
                        start: started(format!("level|{run_id}|{level}|{attempt}"), fallback),
                        end: e.at,
                        attributes: common(vec![
                            ("baton.level".to_owned(), Value::Str(level.clone())),
                            (
                                "baton.attempt".to_owned(),
                                Value::Int(i64::from(e.attempt.unwrap_or(0))),
                            ),
                            ("baton.ok".to_owned(), Value::Bool(f.ok)),
                            ("baton.cost_usd".to_owned(), Value::Float(f.cost_usd)),
                            (
                                "baton.tokens".to_owned(),
                                Value::Int(i64::try_from(f.tokens).unwrap_or(i64::MAX)),
                            ),
                        ]),
                        error: (!f.ok).then(|| {
                            f.error.clone().unwrap_or_else(|| "the level failed".to_owned())
                        }),
                    });
                }
                EventData::PromptSent(p) => {
                    open.starts
                        .insert(format!("model|{run_id}|{level}|{attempt}|{}", p.call), e.at);
                }
                EventData::ModelResponse(r) => {
                    let call = r.call.to_string();
                    out.push(Span {
                        trace_id: trace,
                        span_id: span_id(&["model", run_id, &level, &attempt, &call]),
                        parent: Some(level_span),
                        name: format!("model {}", r.model),
                        start: started(format!("model|{run_id}|{level}|{attempt}|{call}"), e.at),
                        end: e.at,
                        attributes: common(vec![
                            ("baton.level".to_owned(), Value::Str(level.clone())),
                            ("gen_ai.system".to_owned(), Value::Str(r.provider.clone())),
                            ("gen_ai.request.model".to_owned(), Value::Str(r.model.clone())),
                            (
                                "gen_ai.usage.input_tokens".to_owned(),
                                Value::Int(i64::try_from(r.usage.input_tokens).unwrap_or(i64::MAX)),
                            ),
                            (
                                "gen_ai.usage.output_tokens".to_owned(),
                                Value::Int(
                                    i64::try_from(r.usage.output_tokens).unwrap_or(i64::MAX),
                                ),
                            ),
                            ("baton.cost_usd".to_owned(), Value::Float(r.cost_usd)),
                        ]),
                        error: None,
                    });
                }
                EventData::ToolCall(t) => {
                    open.starts.insert(format!("tool|{run_id}|{}", t.call_id), e.at);
                }
                EventData::ToolResult(t) => {
                    out.push(Span {
                        trace_id: trace,
                        span_id: span_id(&["tool", run_id, &t.call_id]),
                        parent: Some(level_span),
                        name: format!("tool {}", t.tool),
                        start: started(format!("tool|{run_id}|{}", t.call_id), e.at),
                        end: e.at,
                        attributes: common(vec![
                            ("baton.level".to_owned(), Value::Str(level.clone())),
                            ("baton.tool".to_owned(), Value::Str(t.tool.clone())),
                        ]),
                        error: t.is_error.then(|| "the tool call failed".to_owned()),
                    });
                }
                EventData::VerifierStarted(v) => {
                    open.starts
                        .insert(format!("verifier|{run_id}|{level}|{attempt}|{}", v.name), e.at);
                }
                EventData::VerifierFinished(v) => {
                    let fallback = e.at
                        - chrono::Duration::milliseconds(i64::try_from(v.duration_ms).unwrap_or(0));
                    out.push(Span {
                        trace_id: trace,
                        span_id: span_id(&["verifier", run_id, &level, &attempt, &v.name]),
                        parent: Some(level_span),
                        name: format!("verifier {}", v.name),
                        start: started(
                            format!("verifier|{run_id}|{level}|{attempt}|{}", v.name),
                            fallback,
                        ),
                        end: e.at,
                        attributes: common(vec![
                            ("baton.level".to_owned(), Value::Str(level.clone())),
                            ("baton.verifier".to_owned(), Value::Str(v.name.clone())),
                            ("baton.passed".to_owned(), Value::Bool(v.passed)),
                        ]),
                        error: (!v.passed && !v.not_run()).then(|| v.reasons.join("; ")),
                    });
                }
                EventData::ScenarioFinished(f) => {
                    let status = serde_json::to_value(f.status)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default();
                    let fallback = e.at;
                    let start = started(format!("run|{run_id}"), fallback);
                    out.push(Span {
                        trace_id: trace,
                        span_id: run_span,
                        parent: info.parent.as_deref().map(|p| span_id(&["run", p])),
                        name: format!("run {}", info.scenario),
                        start,
                        end: e.at,
                        attributes: common(vec![
                            ("baton.status".to_owned(), Value::Str(status.clone())),
                            ("baton.cost_usd".to_owned(), Value::Float(f.totals.cost_usd)),
                            (
                                "baton.tokens".to_owned(),
                                Value::Int(i64::try_from(f.totals.tokens).unwrap_or(i64::MAX)),
                            ),
                        ]),
                        error: (status != "completed")
                            .then(|| f.aborted_reason.clone().unwrap_or(status)),
                    });
                    open.runs.remove(run_id);
                }
                _ => {}
            }
        }
        out
    }
}

// ---- protobuf, by hand (opentelemetry/proto/collector/trace/v1, trace/v1, common/v1) ----

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

fn bytes_field(out: &mut Vec<u8>, field: u32, data: &[u8]) {
    key(out, field, 2);
    varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

fn fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
    key(out, field, 1);
    out.extend_from_slice(&v.to_le_bytes());
}

fn nanos(t: DateTime<Utc>) -> u64 {
    t.timestamp_nanos_opt().and_then(|n| u64::try_from(n).ok()).unwrap_or(0)
}

/// `KeyValue { string key = 1; AnyValue value = 2 }`, `AnyValue { string_value = 1;
/// bool_value = 2; int_value = 3; double_value = 4 }`.
fn key_value(k: &str, v: &Value) -> Vec<u8> {
    let mut any = Vec::new();
    match v {
        Value::Str(s) => bytes_field(&mut any, 1, s.as_bytes()),
        Value::Bool(b) => {
            key(&mut any, 2, 0);
            varint(&mut any, u64::from(*b));
        }
        Value::Int(i) => {
            key(&mut any, 3, 0);
            varint(&mut any, *i as u64);
        }
        Value::Float(f) => fixed64(&mut any, 4, f.to_bits()),
    }
    let mut kv = Vec::new();
    bytes_field(&mut kv, 1, k.as_bytes());
    bytes_field(&mut kv, 2, &any);
    kv
}

/// `Span { trace_id = 1; span_id = 2; parent_span_id = 4; name = 5; kind = 6;
/// start_time_unix_nano = 7; end_time_unix_nano = 8; attributes = 9; status = 15 }`,
/// `Status { message = 2; code = 3 }` (2: error).
fn span(s: &Span) -> Vec<u8> {
    let mut out = Vec::new();
    bytes_field(&mut out, 1, &s.trace_id);
    bytes_field(&mut out, 2, &s.span_id);
    if let Some(p) = &s.parent {
        bytes_field(&mut out, 4, p);
    }
    bytes_field(&mut out, 5, s.name.as_bytes());
    key(&mut out, 6, 0);
    varint(&mut out, 1); // SPAN_KIND_INTERNAL
    fixed64(&mut out, 7, nanos(s.start));
    fixed64(&mut out, 8, nanos(s.end.max(s.start)));
    for (k, v) in &s.attributes {
        bytes_field(&mut out, 9, &key_value(k, v));
    }
    if let Some(message) = &s.error {
        let mut status = Vec::new();
        bytes_field(&mut status, 2, message.as_bytes());
        key(&mut status, 3, 0);
        varint(&mut status, 2);
        bytes_field(&mut out, 15, &status);
    }
    out
}

/// `ExportTraceServiceRequest { resource_spans = 1 }`, `ResourceSpans { resource = 1;
/// scope_spans = 2 }`, `Resource { attributes = 1 }`, `ScopeSpans { scope = 1; spans = 2 }`,
/// `InstrumentationScope { name = 1; version = 2 }`.
pub(crate) fn encode(spans: &[Span]) -> Vec<u8> {
    let mut resource = Vec::new();
    bytes_field(&mut resource, 1, &key_value("service.name", &Value::Str("baton".to_owned())));
    let mut scope = Vec::new();
    bytes_field(&mut scope, 1, b"baton");
    bytes_field(&mut scope, 2, env!("CARGO_PKG_VERSION").as_bytes());
    let mut scope_spans = Vec::new();
    bytes_field(&mut scope_spans, 1, &scope);
    for s in spans {
        bytes_field(&mut scope_spans, 2, &span(s));
    }
    let mut resource_spans = Vec::new();
    bytes_field(&mut resource_spans, 1, &resource);
    bytes_field(&mut resource_spans, 2, &scope_spans);
    let mut request = Vec::new();
    bytes_field(&mut request, 1, &resource_spans);
    request
}

/// The exporter: batches from the queue, posted until the server stops (then what is
/// queued is posted once more).
async fn export(
    authority: String,
    path: String,
    mut spans: mpsc::Receiver<Span>,
    stop: baton_engine::cancel::CancelToken,
) {
    let mut batch = Vec::new();
    loop {
        let deadline = tokio::time::sleep(FLUSH_EVERY);
        tokio::pin!(deadline);
        let stopping = loop {
            tokio::select! {
                got = spans.recv() => match got {
                    Some(s) => {
                        batch.push(s);
                        if batch.len() >= BATCH_MAX { break false; }
                    }
                    None => break true,
                },
                () = &mut deadline => break false,
                () = stop.cancelled() => break true,
            }
        };
        if stopping {
            while let Ok(s) = spans.try_recv() {
                batch.push(s);
            }
        }
        for chunk in batch.chunks(BATCH_MAX) {
            post(&authority, &path, &encode(chunk)).await;
        }
        batch.clear();
        if stopping {
            return;
        }
    }
}

/// Posts one batch, at most [`ATTEMPTS_MAX`] times.
async fn post(authority: &str, path: &str, body: &[u8]) {
    let mut wait = Duration::from_millis(200);
    for attempt in 1..=ATTEMPTS_MAX {
        match post_once(authority, path, body).await {
            Ok(()) => return,
            Err(why) if attempt == ATTEMPTS_MAX => {
                eprintln!(
                    "baton serve: traces to http://{authority}{path} dropped after {attempt} attempts: {why}"
                );
            }
            Err(_) => {
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
        }
    }
}

async fn post_once(authority: &str, path: &str, body: &[u8]) -> Result<(), String> {
    let connect = tokio::net::TcpStream::connect(authority);
    let mut s = tokio::time::timeout(Duration::from_secs(5), connect)
        .await
        .map_err(|_| "connecting timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let exchange = async {
        s.write_all(head.as_bytes()).await?;
        s.write_all(body).await?;
        let mut answer = Vec::new();
        (&mut s).take(64 * 1024).read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| "the collector did not answer within 10 s".to_owned())?
        .map_err(|e| e.to_string())?;
    let status = String::from_utf8_lossy(&answer);
    let code = status.split(' ').nth(1).unwrap_or("");
    if code.starts_with('2') {
        Ok(())
    } else {
        Err(format!("the collector answered {}", status.lines().next().unwrap_or("nothing")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_fields_are_the_wire_format() {
        let mut out = Vec::new();
        varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
        let mut f = Vec::new();
        bytes_field(&mut f, 5, b"ab");
        assert_eq!(f, [0x2a, 2, b'a', b'b']);
        assert_eq!(trace_id("r"), trace_id("r"));
        assert_ne!(span_id(&["run", "a"]), span_id(&["run", "b"]));
    }
}
