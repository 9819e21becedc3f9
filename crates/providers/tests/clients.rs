//! The HTTP clients against fakellm (an independent implementation of both APIs, installed
//! by scripts/test into .peers/venv) and against a scripted TCP server for the faults
//! fakellm cannot produce (429 with Retry-After, 5xx, 401, a dropped connection, a slow
//! stream to cancel).

#![allow(clippy::unwrap_used)]

use std::net::TcpListener as StdListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use baton_engine::cancel::CancelToken;
use baton_engine::model::{ModelError, ModelProvider, ModelRequest, ToolCall, ToolReply, Turn};
use baton_providers::client::{CallError, Client, Providers};
use baton_providers::config::Config;
use baton_providers::egress::EgressPolicy;
use baton_scenario::model::ModelConstraint;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A peer server on a free port, killed when dropped.
struct Peer {
    child: Child,
    port: u16,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `bin` (installed by scripts/test under .peers/) with the arguments `args` gives
/// for a free port, and waits until it accepts connections.
fn start_peer(bin: &str, args: impl FnOnce(u16) -> Vec<String>) -> Peer {
    let bin = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(bin);
    assert!(
        bin.exists(),
        "{} is not installed: run scripts/test, which installs it",
        bin.display()
    );
    let port = StdListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(&bin)
        .args(args(port))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{} did not start on port {port}", bin.display());
        std::thread::sleep(Duration::from_millis(50));
    }
    Peer { child, port }
}

/// A file holding `text` in a fresh temporary directory.
fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("baton-peer-{}", uuid_like()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), text).unwrap();
    dir.join(name)
}

/// fakellm, an independent implementation of both APIs (PyPI).
fn fakellm(rules: &str) -> Peer {
    let rules = temp_file("rules.yaml", rules);
    start_peer(".peers/venv/bin/fakellm", |port| {
        vec![
            "serve".into(),
            "--host".into(),
            "127.0.0.1".into(),
            "--port".into(),
            port.to_string(),
            "--config".into(),
            rules.display().to_string(),
        ]
    })
}

fn uuid_like() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
    )
}

fn config(openai_base: &str, anthropic_base: &str) -> Config {
    Config::parse(
        &format!(
            r#"
[routing]
default = "free:local/fake-model"

[[providers]]
name = "local"
kind = "openai"
base_url = "{openai_base}"
tier = "free"
[[providers.models]]
name = "fake-model"

[[providers]]
name = "claude"
kind = "anthropic"
base_url = "{anthropic_base}"
api_key_env = "TEST_ANTHROPIC_KEY"
tier = "paid"
[[providers.models]]
name = "claude-test"
input_usd_per_mtok = 3.0
output_usd_per_mtok = 15.0
"#
        ),
        "test.toml",
    )
    .unwrap()
}

fn request(prompt: &str, allow: &str, json_mode: bool) -> ModelRequest {
    ModelRequest {
        scenario_id: "s".to_owned(),
        level_id: "l1".to_owned(),
        call_index: 0,
        system: None,
        prompt: prompt.to_owned(),
        json: json_mode,
        schema: None,
        max_tokens: 256,
        constraint: Some(ModelConstraint {
            tier: None,
            allow: vec![allow.to_owned()],
            fallback_outside_allow: false,
            fallback: Vec::new(),
            temperature: None,
            retry: Default::default(),
            source: "level",
        }),
        turns: Vec::new(),
        tools: Vec::new(),
        deadline: None,
    }
}

const RULES: &str = r#"
version: 1
defaults: {fallback: deterministic_echo}
rules:
  - name: weather
    when: {messages_contain: "weather"}
    respond:
      tool_calls: [{name: get_weather, arguments: {city: "Paris"}}]
  - name: parallel
    when: {messages_contain: "stocks"}
    respond:
      tool_calls: [{name: get_price, arguments: {ticker: "AAPL"}}, {name: get_price, arguments: {ticker: "MSFT"}}]
  - name: json
    when: {messages_contain: "as json"}
    respond: {content: '{"answer": 42}'}
  - name: hello
    when: {messages_contain: "hello"}
    respond: {content: "Hi there, this is a longer streamed answer."}
"#;

#[tokio::test]
async fn streamed_text_and_tool_calls_from_fakellm_over_both_apis() {
    let server = fakellm(RULES);
    let base = format!("http://127.0.0.1:{}", server.port);
    let providers = Providers::with_env(config(&format!("{base}/v1"), &base), |k| {
        (k == "TEST_ANTHROPIC_KEY").then(|| "sk-test-secret".to_owned())
    })
    .unwrap();
    let cancel = CancelToken::new();
    for allow in ["free:local/*", "paid:claude/*"] {
        let reply = providers.call(&request("hello there", allow, false), &cancel).await.unwrap();
        assert_eq!(reply.text, "Hi there, this is a longer streamed answer.", "{allow}");
        let reply =
            providers.call(&request("what's the weather?", allow, false), &cancel).await.unwrap();
        assert_eq!(reply.tool_calls.len(), 1, "{allow}");
        assert_eq!(reply.tool_calls[0].name, "get_weather", "{allow}");
        assert_eq!(reply.tool_calls[0].arguments, json!({"city": "Paris"}), "{allow}");
        assert!(!reply.tool_calls[0].id.is_empty(), "{allow}");
        let reply =
            providers.call(&request("two stocks please", allow, false), &cancel).await.unwrap();
        let tickers: Vec<&str> =
            reply.tool_calls.iter().map(|c| c.arguments["ticker"].as_str().unwrap()).collect();
        assert_eq!(tickers, vec!["AAPL", "MSFT"], "{allow}");
        let reply = providers.call(&request("answer as json", allow, true), &cancel).await.unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&reply.text).unwrap(),
            json!({"answer": 42}),
            "{allow}"
        );
    }
    // The text comes to the step's live sink as it streams in, over both wire formats.
    for allow in ["free:local/*", "paid:claude/*"] {
        let pieces = Arc::new(std::sync::Mutex::new(Vec::new()));
        let live = CancelToken::new();
        let sink = Arc::clone(&pieces);
        live.progress().stream_to(
            Arc::from("run-1"),
            baton_engine::cancel::LiveSink(Arc::new(move |t| sink.lock().unwrap().push(t))),
        );
        let reply = providers.call(&request("hello there", allow, false), &live).await.unwrap();
        let pieces = pieces.lock().unwrap();
        let joined: String = pieces.iter().map(|t| t.text.as_str()).collect();
        assert_eq!(joined, reply.text, "{allow}");
        assert!(pieces.iter().all(|t| &*t.run_id == "run-1" && !t.text.is_empty()), "{allow}");
    }
    let reply = providers.call(&request("hello", "paid:claude/*", false), &cancel).await.unwrap();
    assert_eq!(reply.provider, "claude");
    assert_eq!(reply.model, "claude-test");
    let expected =
        (reply.usage.input_tokens as f64 * 3.0 + reply.usage.output_tokens as f64 * 15.0) / 1e6;
    assert!((reply.cost_usd - expected).abs() < 1e-12, "priced from the table");
}

/// A TCP server that answers each connection with the next canned response (or, for
/// `None`, hangs up after the headers, mid-stream).
async fn scripted_server(responses: Vec<Option<String>>, hits: Arc<AtomicUsize>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut responses = responses.into_iter();
        while let Ok((mut socket, _)) = listener.accept().await {
            hits.fetch_add(1, Ordering::SeqCst);
            let mut buf = vec![0u8; 65536];
            let _ = socket.read(&mut buf).await;
            match responses.next() {
                Some(Some(text)) => {
                    let _ = socket.write_all(text.as_bytes()).await;
                    let _ = socket.shutdown().await;
                }
                Some(None) => {
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                    let _ = socket.write_all(head.as_bytes()).await;
                    let piece =
                        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"par\"}}]}\n\n";
                    let _ = socket
                        .write_all(format!("{:x}\r\n{piece}\r\n", piece.len()).as_bytes())
                        .await;
                    drop(socket);
                }
                None => drop(socket),
            }
        }
    });
    port
}

fn ok_stream(text: &str) -> String {
    let body = format!(
        "data: {{\"id\":\"c1\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"finish_reason\":null}}]}}\n\ndata: {{\"id\":\"c1\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":2}}}}\n\ndata: [DONE]\n\n"
    );
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nx-request-id: req-ok\r\n\r\n{body}",
        body.len()
    )
}

fn status(code: u16, extra: &str) -> String {
    let body = format!("{{\"error\":{{\"message\":\"status {code}\"}}}}");
    format!(
        "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nx-request-id: req-{code}\r\n{extra}\r\n{body}",
        body.len()
    )
}

fn local(port: u16) -> Config {
    config(&format!("http://127.0.0.1:{port}/v1"), &format!("http://127.0.0.1:{port}"))
}

#[tokio::test]
async fn retry_after_is_honoured_and_5xx_and_drops_are_retried() {
    let hits = Arc::new(AtomicUsize::new(0));
    let port = scripted_server(
        vec![
            Some(status(429, "retry-after: 1\r\n")),
            Some(status(503, "")),
            None,
            Some(ok_stream("done")),
        ],
        Arc::clone(&hits),
    )
    .await;
    let providers = Providers::with_env(local(port), |_| None).unwrap();
    let t = Instant::now();
    let cancel = CancelToken::new();
    let reply = providers.call(&request("x", "free:local/*", false), &cancel).await.unwrap();
    assert_eq!(reply.text, "done");
    // Each retry is reported for the engine to record: attempt, reason, wait.
    let retries = cancel.progress().take_retries("l1", 0);
    assert_eq!(retries.iter().map(|r| r.attempt).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert!(retries[0].reason.contains("HTTP 429"), "{:?}", retries[0]);
    assert_eq!(retries[0].wait_ms, 1000, "Retry-After: 1");
    assert!(retries[1].reason.contains("HTTP 503"), "{:?}", retries[1]);
    assert!(retries[2].reason.contains("ended before"), "{:?}", retries[2]);
    assert!(cancel.progress().take_retries("l1", 0).is_empty(), "taken once");
    assert_eq!(hits.load(Ordering::SeqCst), 4, "429, 503 and the dropped stream were each retried");
    assert!(
        t.elapsed() >= Duration::from_secs(1),
        "Retry-After: 1 was waited for ({:?})",
        t.elapsed()
    );
    assert_eq!((reply.usage.input_tokens, reply.usage.output_tokens), (5, 2));
}

#[tokio::test]
async fn authentication_failures_name_the_variable_never_the_key_and_are_not_retried() {
    let hits = Arc::new(AtomicUsize::new(0));
    let port =
        scripted_server(vec![Some(status(401, "")), Some(ok_stream("never"))], Arc::clone(&hits))
            .await;
    let client = Client::new(&EgressPolicy::default()).unwrap();
    let config = local(port);
    let provider = &config.providers[1];
    let err = client
        .call(
            provider,
            &provider.models[0],
            &request("x", "paid:claude/*", false),
            Some("sk-very-secret"),
            &CancelToken::new(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, CallError::Auth { status: 401, .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains("$TEST_ANTHROPIC_KEY") && message.contains("claude"), "{message}");
    assert!(!message.contains("sk-very-secret"));
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_provider_that_keeps_failing_hands_over_along_the_chain() {
    let hits = Arc::new(AtomicUsize::new(0));
    let port = scripted_server(
        vec![Some(status(400, "")), Some(ok_stream("from the fallback"))],
        Arc::clone(&hits),
    )
    .await;
    let mut config = local(port);
    // The anthropic entry speaks the OpenAI protocol here so the scripted server can answer it.
    config.providers[1].kind = baton_providers::config::Kind::Openai;
    config.providers[1].base_url = format!("http://127.0.0.1:{port}/v1");
    let providers = Providers::with_env(config, |_| Some("k".to_owned())).unwrap();
    let mut req = request("x", "free:local/*", false);
    req.constraint.as_mut().unwrap().fallback = vec!["paid:claude/*".to_owned()];
    let reply = providers.call(&req, &CancelToken::new()).await.unwrap();
    assert_eq!(reply.text, "from the fallback");
    assert_eq!(reply.provider, "claude");
    let routing = reply.routing.unwrap();
    assert_eq!((routing.source.as_str(), routing.tier.as_str()), ("fallback", "paid"));
    assert_eq!(
        reply.failovers.len(),
        1,
        "one failover, reported on its own: {:?}",
        reply.failovers
    );
    assert_eq!(
        (reply.failovers[0].provider.as_str(), reply.failovers[0].model.as_str()),
        ("local", "fake-model")
    );
    assert!(
        reply.failovers[0].reason.starts_with("local (fake-model): HTTP 400"),
        "{:?}",
        reply.failovers
    );
}

#[tokio::test]
async fn a_cancel_aborts_a_slow_stream_at_once() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        if let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = vec![0u8; 65536];
            let _ = socket.read(&mut buf).await;
            let _ = socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n").await;
            loop {
                let piece =
                    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tick \"}}]}\n\n";
                if socket
                    .write_all(format!("{:x}\r\n{piece}\r\n", piece.len()).as_bytes())
                    .await
                    .is_err()
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    let providers = Providers::with_env(local(port), |_| None).unwrap();
    let cancel = CancelToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        c2.cancel();
    });
    let t = Instant::now();
    let err = providers.call(&request("x", "free:local/*", false), &cancel).await.unwrap_err();
    assert_eq!(err, ModelError::Cancelled);
    let late = t.elapsed().saturating_sub(Duration::from_millis(500));
    assert!(late < Duration::from_millis(250), "the stream stopped {late:?} after the cancel");
}

/// aimock (npm), a second independent implementation of both APIs.
fn aimock(fixtures: &str, extra: &[&str]) -> Peer {
    let fixtures = temp_file("fixtures.json", fixtures);
    start_peer(".peers/npm/node_modules/.bin/llmock", |port| {
        let mut args: Vec<String> =
            ["-p", &port.to_string(), "-h", "127.0.0.1", "--log-level", "silent", "-f"]
                .iter()
                .map(|a| (*a).to_owned())
                .collect();
        args.push(fixtures.display().to_string());
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        args
    })
}

const AIMOCK_FIXTURES: &str = r#"{"fixtures": [
  {"match": {"userMessage": "weather"}, "response": {"toolCalls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}},
  {"match": {"userMessage": "stocks"}, "response": {"toolCalls": [{"name": "get_price", "arguments": {"ticker": "AAPL"}}, {"name": "get_price", "arguments": {"ticker": "MSFT"}}]}},
  {"match": {"userMessage": "hello"}, "response": {"content": "Hello! A reply streamed in many small pieces."}}
]}"#;

#[tokio::test]
async fn streamed_text_and_tool_calls_from_aimock_over_both_apis() {
    let server = aimock(AIMOCK_FIXTURES, &["-c", "3"]);
    let base = format!("http://127.0.0.1:{}", server.port);
    let providers =
        Providers::with_env(config(&format!("{base}/v1"), &base), |_| Some("test-key".to_owned()))
            .unwrap();
    let cancel = CancelToken::new();
    for allow in ["free:local/*", "paid:claude/*"] {
        let reply = providers.call(&request("hello", allow, false), &cancel).await.unwrap();
        assert_eq!(reply.text, "Hello! A reply streamed in many small pieces.", "{allow}");
        let reply =
            providers.call(&request("weather please", allow, false), &cancel).await.unwrap();
        assert_eq!(reply.tool_calls.len(), 1, "{allow}");
        assert_eq!(reply.tool_calls[0].arguments, json!({"city": "Paris"}), "{allow}");
        let reply = providers.call(&request("stocks", allow, false), &cancel).await.unwrap();
        let tickers: Vec<&str> =
            reply.tool_calls.iter().map(|c| c.arguments["ticker"].as_str().unwrap()).collect();
        assert_eq!(tickers, vec!["AAPL", "MSFT"], "{allow}");
    }
}

#[tokio::test]
async fn a_cancel_cuts_an_aimock_stream_with_latency_short() {
    let server = aimock(AIMOCK_FIXTURES, &["-c", "2", "-l", "300"]);
    let base = format!("http://127.0.0.1:{}", server.port);
    let providers = Providers::with_env(config(&format!("{base}/v1"), &base), |_| None).unwrap();
    let cancel = CancelToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        c2.cancel();
    });
    let t = Instant::now();
    let err = providers.call(&request("hello", "free:local/*", false), &cancel).await.unwrap_err();
    assert_eq!(err, ModelError::Cancelled);
    let late = t.elapsed().saturating_sub(Duration::from_millis(700));
    assert!(late < Duration::from_millis(250), "the stream stopped {late:?} after the cancel");
}

#[tokio::test]
async fn aimock_server_errors_are_retried_a_bounded_number_of_times() {
    let server = aimock(AIMOCK_FIXTURES, &["--chaos-drop", "1"]);
    let base = format!("http://127.0.0.1:{}", server.port);
    let providers = Providers::with_env(config(&format!("{base}/v1"), &base), |_| None).unwrap();
    let t = Instant::now();
    let err = providers
        .call(&request("hello", "free:local/*", false), &CancelToken::new())
        .await
        .unwrap_err();
    // Every model failed with a fault that passes: an outage, not a wrong request.
    let ModelError::Unavailable { message, .. } = err else { panic!("expected an outage: {err}") };
    assert!(message.contains("HTTP 500"), "{message}");
    assert!(t.elapsed() < Duration::from_secs(20), "retries are bounded ({:?})", t.elapsed());
}

#[tokio::test]
async fn non_streamed_replies_from_both_peers_over_both_apis() {
    let fake = fakellm(RULES);
    let mock = aimock(AIMOCK_FIXTURES, &[]);
    for port in [fake.port, mock.port] {
        let base = format!("http://127.0.0.1:{port}");
        let mut config = config(&format!("{base}/v1"), &base);
        for p in &mut config.providers {
            p.stream = false;
        }
        let providers = Providers::with_env(config, |_| Some("test-key".to_owned())).unwrap();
        let cancel = CancelToken::new();
        for allow in ["free:local/*", "paid:claude/*"] {
            let reply = providers.call(&request("hello", allow, false), &cancel).await.unwrap();
            assert!(reply.text.starts_with("H"), "{port} {allow}: {}", reply.text);
            let reply = providers
                .call(&request("what's the weather?", allow, false), &cancel)
                .await
                .unwrap();
            assert_eq!(reply.tool_calls.len(), 1, "{port} {allow}");
            assert_eq!(reply.tool_calls[0].name, "get_weather");
            assert_eq!(reply.tool_calls[0].arguments["city"], "Paris", "{port} {allow}");
        }
    }
}

/// A one-shot server that keeps the body of the request it receives and answers `answer`.
async fn capture_server(answer: String) -> (u16, tokio::sync::oneshot::Receiver<String>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::oneshot::channel::<String>();
    tokio::spawn(async move {
        let Ok((mut socket, _)) = listener.accept().await else { return };
        let mut received = Vec::new();
        let mut buf = vec![0u8; 65536];
        // Headers and body may arrive in separate segments: read until the body is whole.
        let body = loop {
            let n = socket.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                break String::new();
            }
            received.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&received).into_owned();
            let Some(end) = text.find("\r\n\r\n") else { continue };
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                })
                .unwrap_or(0);
            if text.len() >= end + 4 + length {
                break text[end + 4..].to_owned();
            }
        };
        let _ = tx.send(body);
        let _ = socket.write_all(answer.as_bytes()).await;
    });
    (port, rx)
}

#[tokio::test]
async fn a_declared_schema_is_sent_as_the_response_format() {
    let (port, rx) = capture_server(ok_stream("{}")).await;
    let providers = Providers::with_env(local(port), |_| None).unwrap();
    let mut req = request("x", "free:local/*", true);
    req.schema = Some(json!({"type": "object", "required": ["answer"]}));
    providers.call(&req, &CancelToken::new()).await.unwrap();
    let body: serde_json::Value = serde_json::from_str(&rx.await.unwrap()).unwrap();
    assert_eq!(body["response_format"]["type"], "json_schema");
    assert_eq!(body["response_format"]["json_schema"]["schema"]["required"], json!(["answer"]));
}

#[tokio::test]
async fn the_system_prompt_and_temperature_go_out_in_each_apis_shape() {
    for allow in ["free:local/*", "paid:claude/*"] {
        let (port, rx) = capture_server(ok_stream("ok")).await;
        let base = format!("http://127.0.0.1:{port}");
        let providers =
            Providers::with_env(config(&format!("{base}/v1"), &base), |_| Some("k".to_owned()))
                .unwrap();
        let mut req = request("hello", allow, false);
        req.system = Some("You are terse.".to_owned());
        req.constraint.as_mut().unwrap().temperature = Some(0.25);
        // The Anthropic client cannot read the OpenAI-shaped answer; only the request matters.
        let _ = providers.call(&req, &CancelToken::new()).await;
        let body: serde_json::Value = serde_json::from_str(&rx.await.unwrap()).unwrap();
        assert_eq!(body["temperature"], 0.25, "{allow}");
        if allow.starts_with("free") {
            assert_eq!(body["messages"][0], json!({"role": "system", "content": "You are terse."}));
            assert_eq!(body["messages"][1]["role"], "user");
        } else {
            assert_eq!(body["system"], "You are terse.");
            assert_eq!(body["messages"][0]["role"], "user");
        }
    }
}

/// A tool loop's second turn: the tool definitions, the model's call and its result, in
/// each API's own shape, understood by an independent server.
fn tool_turn(prompt: &str, allow: &str, call_id: &str, result: &str) -> ModelRequest {
    let mut r = request(prompt, allow, false);
    r.tools = baton_runners::tool_loop::tool_specs();
    r.turns = vec![
        Turn::Assistant {
            text: String::new(),
            tool_calls: vec![ToolCall {
                id: call_id.to_owned(),
                name: "list_dir".to_owned(),
                arguments: json!({}),
            }],
        },
        Turn::Tools {
            results: vec![ToolReply {
                call_id: call_id.to_owned(),
                name: "list_dir".to_owned(),
                content: result.to_owned(),
                is_error: false,
            }],
        },
    ];
    r
}

#[tokio::test]
async fn tool_definitions_and_results_go_to_both_peers_over_both_apis() {
    let mock = aimock(
        r#"{"fixtures": [
  {"match": {"toolCallId": "toolu_list_1"}, "response": {"content": "The workspace holds notes.txt."}},
  {"match": {"toolName": "edit_file", "userMessage": "look around"}, "response": {"toolCalls": [{"name": "list_dir", "arguments": {}}]}}
]}"#,
        &[],
    );
    let fake = fakellm(
        r#"
version: 1
defaults: {fallback: deterministic_echo}
rules:
  - name: after_the_tool
    when: {messages_contain: "notes.txt"}
    respond: {content: "The workspace holds notes.txt."}
  - name: first_turn
    when: {messages_contain: "look around"}
    respond:
      tool_calls: [{name: list_dir, arguments: {}}]
"#,
    );
    for port in [mock.port, fake.port] {
        let base = format!("http://127.0.0.1:{port}");
        let providers = Providers::with_env(config(&format!("{base}/v1"), &base), |_| {
            Some("test-key".to_owned())
        })
        .unwrap();
        let cancel = CancelToken::new();
        for allow in ["free:local/*", "paid:claude/*"] {
            let mut first = request("look around", allow, false);
            first.tools = baton_runners::tool_loop::tool_specs();
            let reply = providers.call(&first, &cancel).await.unwrap();
            assert_eq!(reply.tool_calls.len(), 1, "{port} {allow}: {reply:?}");
            assert_eq!(reply.tool_calls[0].name, "list_dir", "{port} {allow}");
            let second = tool_turn("look around", allow, "toolu_list_1", "notes.txt\n");
            let reply = providers.call(&second, &cancel).await.unwrap();
            assert_eq!(reply.text, "The workspace holds notes.txt.", "{port} {allow}");
            assert!(reply.tool_calls.is_empty(), "{port} {allow}");
        }
    }
}

#[tokio::test]
async fn heartbeats_of_a_slow_stream_report_the_bytes_received() {
    use baton_engine::event::EventData;
    use baton_engine::store::MemoryStore;
    let server = aimock(AIMOCK_FIXTURES, &["-c", "2", "-l", "150"]);
    let base = format!("http://127.0.0.1:{}", server.port);
    let providers = Providers::with_env(config(&format!("{base}/v1"), &base), |_| None).unwrap();
    let scenarios = temp_file(
        "hb.yaml",
        "id: hb\nversion: 1\nlevels:\n  - id: answer\n    kind: prompt\n    prompt: {inline: \"hello {{ input }}\"}\n    model: {allow: [\"free:local/*\"]}\n    terminal: true\n",
    );
    let loaded = baton_scenario::Registry::load(&[scenarios.parent().unwrap()]).unwrap();
    let scenario = Arc::clone(loaded.registry.scenarios().next().unwrap());
    let engine = baton_engine::Engine::new(
        Arc::new(MemoryStore::new()),
        Arc::new(baton_engine::runner::Runtime {
            jobs: None,
            model: Arc::new(providers),
            verifiers: baton_engine::verifier::Verifiers::builtin(),
            workspace: PathBuf::from("."),
            workspaces: None,
            catalog: Arc::new(json!([])),
            redactor: std::sync::Arc::new(baton_engine::redact::Verbatim),
            runner: std::sync::Arc::new(baton_runners::Runners),
            tools: None,
        }),
        Arc::new(baton_engine::clock::SystemClock),
    );
    let run_id = baton_engine::Engine::new_run_id();
    engine.run(&run_id, &scenario, "there", serde_json::Map::new(), None).await.unwrap();
    let state = engine.state(&run_id).await.unwrap();
    assert_eq!(
        state.session.final_output.as_deref(),
        Some("Hello! A reply streamed in many small pieces.")
    );
    let streamed: Vec<u64> = engine
        .store
        .load(&run_id, 0)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.data {
            EventData::Heartbeat(h) => Some(h.streamed_bytes),
            _ => None,
        })
        .collect();
    assert!(!streamed.is_empty(), "a stream of over 3 s writes a heartbeat");
    assert!(streamed.iter().all(|b| *b > 0), "{streamed:?}");
    assert!(streamed.windows(2).all(|w| w[0] <= w[1]), "{streamed:?}");
}

/// A streamed OpenAI answer that ends with `finish_reason` `reason`.
fn stream_ending(text: &str, reason: &str) -> String {
    ok_stream(text)
        .replace("\"finish_reason\":\"stop\"", &format!("\"finish_reason\":\"{reason}\""))
}

#[tokio::test]
async fn an_answer_cut_at_the_output_limit_reports_its_stop_reason() {
    let hits = Arc::new(AtomicUsize::new(0));
    let port = scripted_server(
        vec![Some(stream_ending("{\\\"answer\\\": \\\"Par", "length")), Some(ok_stream("whole"))],
        Arc::clone(&hits),
    )
    .await;
    let providers = Providers::with_env(local(port), |_| None).unwrap();
    let cut =
        providers.call(&request("x", "free:local/*", false), &CancelToken::new()).await.unwrap();
    assert_eq!(cut.stop_reason.as_deref(), Some("max_tokens"), "OpenAI's `length` is a cut");
    assert_eq!(cut.text, "{\"answer\": \"Par");
    let whole =
        providers.call(&request("x", "free:local/*", false), &CancelToken::new()).await.unwrap();
    assert_eq!(whole.stop_reason, None, "a normal end reports no stop reason");
}

#[tokio::test]
async fn every_provider_an_allow_pattern_matches_is_tried_in_order() {
    let hits = Arc::new(AtomicUsize::new(0));
    let port = scripted_server(
        vec![Some(status(400, "")), Some(ok_stream("from the second free provider"))],
        Arc::clone(&hits),
    )
    .await;
    let mut config = local(port);
    // A second free provider, after the first in the configuration.
    config.providers[1].kind = baton_providers::config::Kind::Openai;
    config.providers[1].tier = baton_scenario::model::Tier::Free;
    config.providers[1].base_url = format!("http://127.0.0.1:{port}/v1");
    let providers = Providers::with_env(config, |_| Some("k".to_owned())).unwrap();
    let reply = providers.call(&request("x", "free:*", false), &CancelToken::new()).await.unwrap();
    assert_eq!(reply.text, "from the second free provider");
    assert_eq!(reply.provider, "claude");
    assert_eq!(reply.routing.unwrap().source, "allow");
    assert_eq!(reply.failovers.len(), 1, "{:?}", reply.failovers);
    assert_eq!(reply.failovers[0].provider, "local");
    assert_eq!(hits.load(Ordering::SeqCst), 2);
}

/// A whole JSON body with status 200 and `content_type`.
fn json_answer(body: &str, content_type: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test]
async fn wrong_answers_get_clear_messages_not_retries() {
    let hits = Arc::new(AtomicUsize::new(0));
    let whole = r#"{"id":"c1","choices":[{"index":0,"message":{"content":"whole"},"finish_reason":"stop"}]}"#;
    let port = scripted_server(
        vec![
            // A whole JSON body answering a streaming request is read as the response it is.
            Some(json_answer(whole, "application/json; charset=utf-8")),
            // An empty `choices` array is a wrong answer: said once, never retried.
            Some(json_answer(r#"{"id":"c2","choices":[]}"#, "application/json")),
            Some(ok_stream("never")),
        ],
        Arc::clone(&hits),
    )
    .await;
    let providers = Providers::with_env(local(port), |_| None).unwrap();
    let reply =
        providers.call(&request("x", "free:local/*", false), &CancelToken::new()).await.unwrap();
    assert_eq!(reply.text, "whole");
    let err = providers
        .call(&request("x", "free:local/*", false), &CancelToken::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no choices"), "{err}");
    assert_eq!(hits.load(Ordering::SeqCst), 2, "neither was retried");
}

#[tokio::test]
async fn an_over_cap_whole_body_says_it_exceeds_the_cap() {
    let big = format!(
        r#"{{"choices":[{{"index":0,"message":{{"content":"{}"}},"finish_reason":"stop"}}]}}"#,
        "x".repeat(baton_providers::client::RESPONSE_BYTES_MAX + 10)
    );
    let hits = Arc::new(AtomicUsize::new(0));
    let port =
        scripted_server(vec![Some(json_answer(&big, "application/json"))], Arc::clone(&hits)).await;
    let mut config = local(port);
    config.providers[0].stream = false;
    let providers = Providers::with_env(config, |_| None).unwrap();
    let err = providers
        .call(&request("x", "free:local/*", false), &CancelToken::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("exceeds 16 MiB"), "{err}");
    assert!(!err.contains("not JSON"), "{err}");
}

#[tokio::test]
async fn without_a_configured_key_variable_the_auth_error_names_the_one_to_set() {
    let hits = Arc::new(AtomicUsize::new(0));
    let port = scripted_server(vec![Some(status(401, ""))], Arc::clone(&hits)).await;
    // The environment-only setup: OPENAI_BASE_URL without OPENAI_API_KEY.
    let base = format!("http://127.0.0.1:{port}/v1");
    let config = Config::from_env(|k| (k == "OPENAI_BASE_URL").then(|| base.clone()));
    let provider = &config.providers[0];
    let err = Client::new(&EgressPolicy::default())
        .unwrap()
        .call(
            provider,
            &provider.models[0],
            &request("x", "free:*", false),
            None,
            &CancelToken::new(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("$OPENAI_API_KEY"), "{err}");
    assert!(!err.contains("no api_key_env configured"), "{err}");
}

#[tokio::test]
async fn an_error_event_in_the_stream_is_retried_and_reported() {
    let body = "data: {\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let overloaded = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let hits = Arc::new(AtomicUsize::new(0));
    let port =
        scripted_server(vec![Some(overloaded), Some(ok_stream("after"))], Arc::clone(&hits)).await;
    let providers = Providers::with_env(local(port), |_| None).unwrap();
    let cancel = CancelToken::new();
    let reply = providers.call(&request("x", "free:local/*", false), &cancel).await.unwrap();
    assert_eq!(reply.text, "after");
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    let retries = cancel.progress().take_retries("l1", 0);
    assert_eq!(retries.len(), 1);
    assert!(retries[0].reason.contains("Overloaded"), "{:?}", retries[0]);
}

#[tokio::test]
async fn provider_urls_pass_the_egress_guard_a_local_server_is_called_and_a_redirect_to_the_metadata_address_is_not()
 {
    // The metadata address, and a host the allow-list leaves out, do not load.
    let metadata = Config::parse(
        "[[providers]]\nname = \"m\"\nkind = \"openai\"\nbase_url = \"http://169.254.169.254/v1\"\ntier = \"free\"\n[[providers.models]]\nname = \"x\"\n",
        "baton.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(metadata.contains("provider `m`") && metadata.contains("metadata"), "{metadata}");
    let listed = Config::parse(
        "[egress]\nallow_hosts = [\"api.example.com\"]\n\n[[providers]]\nname = \"l\"\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\ntier = \"free\"\n[[providers.models]]\nname = \"x\"\n",
        "baton.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(listed.contains("not in the egress allow-list"), "{listed}");
    // A local server written as an address is called there; its redirect to the metadata
    // address is refused and never followed.
    let hits = Arc::new(AtomicUsize::new(0));
    let redirect = "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://169.254.169.254/latest/meta-data\r\ncontent-length: 0\r\n\r\n".to_owned();
    let port =
        scripted_server(vec![Some(ok_stream("here")), Some(redirect)], Arc::clone(&hits)).await;
    let config = local(port);
    let provider = &config.providers[0];
    let client = Client::new(&config.egress).unwrap();
    let called = client
        .call(
            provider,
            &provider.models[0],
            &request("x", "free:*", false),
            None,
            &CancelToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(called.text, "here");
    let err = client
        .call(
            provider,
            &provider.models[0],
            &request("x", "free:*", false),
            None,
            &CancelToken::new(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("a redirect was refused") && err.contains("metadata"), "{err}");
    // A provider whose URL is changed past the check is refused at the call, not sent.
    let mut moved = provider.clone();
    moved.base_url = "http://169.254.169.254/v1".to_owned();
    let err = client
        .call(&moved, &moved.models[0], &request("x", "free:*", false), None, &CancelToken::new())
        .await
        .unwrap_err();
    assert!(matches!(err, CallError::Egress { .. }) && !err.transient(), "{err}");
    assert_eq!(hits.load(Ordering::SeqCst), 2);
}
