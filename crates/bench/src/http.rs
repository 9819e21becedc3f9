//! `baton bench --workload http`: `baton serve` measured from outside, over TCP, on a
//! fresh SQLite database, with a zero-latency scripted model.
//!
//! The server is this binary, started as its own process (`serve --no-auth`). Two phases:
//! - starts: `--concurrency` keep-alive connections post `POST /runs` of a one-level
//!   scenario for `--runs` starts in all; reported as starts per second (each answered
//!   `201`, the run durable) and the start latency, then how long the workers took to end
//!   them all.
//! - streams: 100 runs of a five-level scenario whose levels each answer after 100 ms, each
//!   watched by 10 event streams opened before its first level answers (1 000 streams);
//!   reported as the delivery latency of every event committed after its stream opened —
//!   the time from the event's own timestamp (taken before its commit) to its arrival.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const QUICK: &str = "id: quick\nversion: 1\nlevels:\n  - id: answer\n    kind: prompt\n    prompt: {inline: \"Answer {{ input }}\"}\n    terminal: true\n";

const STEPS: &str = "id: steps\nversion: 1\nlevels:\n  - {id: s1, kind: prompt, prompt: {inline: \"1 {{ input }}\"}}\n  - {id: s2, kind: prompt, prompt: {inline: \"2 {{ input }}\"}}\n  - {id: s3, kind: prompt, prompt: {inline: \"3 {{ input }}\"}}\n  - {id: s4, kind: prompt, prompt: {inline: \"4 {{ input }}\"}}\n  - {id: s5, kind: prompt, prompt: {inline: \"5 {{ input }}\"}, terminal: true}\nedges:\n  - {from: s1, to: s2}\n  - {from: s2, to: s3}\n  - {from: s3, to: s4}\n  - {from: s4, to: s5}\n";

const SCRIPT: &str = "levels:\n  answer: [{text: 'PASS: the answer.'}]\n  s1: [{text: 'one', delay_ms: 1000}]\n  s2: [{text: 'two', delay_ms: 100}]\n  s3: [{text: 'three', delay_ms: 100}]\n  s4: [{text: 'four', delay_ms: 100}]\n  s5: [{text: 'five', delay_ms: 100}]\n";

/// Runs watched in the streams phase, and streams per run.
const WATCHED_RUNS: usize = 100;
const STREAMS_PER_RUN: usize = 10;

/// One keep-alive HTTP/1.1 connection.
struct Conn {
    io: BufReader<TcpStream>,
    host: String,
}

impl Conn {
    async fn open(addr: &str) -> anyhow::Result<Self> {
        let s = TcpStream::connect(addr).await.with_context(|| format!("connect to {addr}"))?;
        s.set_nodelay(true)?;
        Ok(Conn { io: BufReader::new(s), host: addr.to_owned() })
    }

    /// Sends a request and reads the whole answer (its body has a Content-Length).
    async fn call(
        &mut self,
        method: &str,
        path: &str,
        body: &str,
    ) -> anyhow::Result<(u16, String)> {
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.host,
            body.len()
        );
        self.io.get_mut().write_all(req.as_bytes()).await?;
        let (status, length) = self.head().await?;
        let mut buf = vec![0; length];
        self.io.read_exact(&mut buf).await?;
        Ok((status, String::from_utf8_lossy(&buf).into_owned()))
    }

    /// Reads an answer's head: its status and Content-Length (0 when absent).
    async fn head(&mut self) -> anyhow::Result<(u16, usize)> {
        let mut line = String::new();
        self.io.read_line(&mut line).await?;
        let status =
            line.split(' ').nth(1).and_then(|s| s.parse().ok()).context("no status line")?;
        let mut length = 0;
        loop {
            line.clear();
            if self.io.read_line(&mut line).await? == 0 {
                bail!("the server closed the connection");
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        Ok((status, length))
    }
}

/// Follows one run's stream to its end; the delivery latency of each event committed
/// after `opened`.
async fn watch(addr: String, run: String) -> anyhow::Result<Vec<Duration>> {
    let mut c = Conn::open(&addr).await?;
    let req = format!(
        "GET /runs/{run}/events HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n"
    );
    c.io.get_mut().write_all(req.as_bytes()).await?;
    let opened = chrono::Utc::now();
    let (status, _) = c.head().await?;
    if status != 200 {
        bail!("the stream of run {run} answered {status}");
    }
    let mut latencies = Vec::new();
    let mut line = String::new();
    loop {
        // Chunked: a size line, the chunk (whole SSE events as the server writes them).
        line.clear();
        if c.io.read_line(&mut line).await? == 0 {
            break;
        }
        let size = usize::from_str_radix(line.trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let mut chunk = vec![0; size + 2];
        c.io.read_exact(&mut chunk).await?;
        let arrived = chrono::Utc::now();
        let text = String::from_utf8_lossy(&chunk[..size]).into_owned();
        for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
            let Ok(event) = serde_json::from_str::<Value>(data) else { continue };
            let at =
                event["at"].as_str().and_then(|a| a.parse::<chrono::DateTime<chrono::Utc>>().ok());
            if let Some(at) = at.filter(|at| *at > opened) {
                latencies.push((arrived - at).to_std().unwrap_or_default());
            }
            if event["kind"] == "scenario_finished" {
                return Ok(latencies);
            }
        }
    }
    Ok(latencies)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

pub(crate) async fn bench(starts: usize, concurrency: usize) -> anyhow::Result<Value> {
    let tmp = std::env::temp_dir().join(format!("baton-bench-http-{}", uuid_like()));
    std::fs::create_dir_all(tmp.join("scenarios"))?;
    std::fs::write(tmp.join("scenarios/quick.yaml"), QUICK)?;
    std::fs::write(tmp.join("scenarios/steps.yaml"), STEPS)?;
    std::fs::write(tmp.join("script.yaml"), SCRIPT)?;
    let report = measure(&tmp, starts, concurrency.max(1)).await;
    let _ = std::fs::remove_dir_all(&tmp);
    report
}

fn uuid_like() -> String {
    format!("{}-{}", std::process::id(), chrono::Utc::now().timestamp_micros())
}

/// The server, killed when dropped.
struct Server(tokio::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.start_kill();
    }
}

async fn measure(tmp: &Path, starts: usize, concurrency: usize) -> anyhow::Result<Value> {
    let exe = std::env::current_exe()?;
    let mut child = tokio::process::Command::new(exe)
        .arg("--db")
        .arg(tmp.join("bench.db"))
        .arg("--scenarios")
        .arg(tmp.join("scenarios"))
        .args(["serve", "--listen", "127.0.0.1:0", "--no-auth", "--workers", "64"])
        .args(["--streams-per-token", "2000", "--script"])
        .arg(tmp.join("script.yaml"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let mut first = String::new();
    BufReader::new(child.stdout.take().context("the server's output")?)
        .read_line(&mut first)
        .await?;
    let server = Server(child);
    let addr = first
        .trim()
        .strip_prefix("listening on http://")
        .context("the server did not start")?
        .to_owned();

    // Phase 1: starts.
    let began = Instant::now();
    let per = starts.div_ceil(concurrency);
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let addr = addr.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::open(&addr).await?;
            let mut latencies = Vec::with_capacity(per);
            for _ in 0..per {
                let t = Instant::now();
                let (status, body) =
                    c.call("POST", "/runs", "{\"scenario\": \"quick\", \"input\": \"q\"}").await?;
                if status != 201 {
                    bail!("a start answered {status}: {body}");
                }
                latencies.push(t.elapsed());
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await??);
    }
    let started_in = began.elapsed();
    latencies.sort();
    // Until the workers have ended every run.
    let mut c = Conn::open(&addr).await?;
    let drained = loop {
        let (_, body) = c.call("GET", "/runs?status=running&limit=1", "").await?;
        let (_, interrupted) = c.call("GET", "/runs?status=interrupted&limit=1", "").await?;
        if body.contains("\"runs\":[]") && interrupted.contains("\"runs\":[]") {
            break began.elapsed();
        }
        if began.elapsed() > Duration::from_secs(600) {
            bail!("the runs did not end within 600 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    // Phase 2: streams.
    let mut runs = Vec::new();
    for i in 0..WATCHED_RUNS {
        let (status, body) = c
            .call("POST", "/runs", &format!("{{\"scenario\": \"steps\", \"input\": \"{i}\"}}"))
            .await?;
        if status != 201 {
            bail!("a start answered {status}: {body}");
        }
        let v: Value = serde_json::from_str(&body)?;
        runs.push(v["run_id"].as_str().context("a run id")?.to_owned());
    }
    let mut watchers = Vec::new();
    for run in &runs {
        for _ in 0..STREAMS_PER_RUN {
            watchers.push(tokio::spawn(watch(addr.clone(), run.clone())));
        }
    }
    let mut delivered = Vec::new();
    for w in watchers {
        delivered.extend(w.await??);
    }
    delivered.sort();
    drop(server);
    let n = latencies.len();
    Ok(json!({
        "workload": "http",
        "store": "sqlite",
        "starts": n,
        "concurrency": concurrency,
        "starts_per_s": n as f64 / started_in.as_secs_f64(),
        "start_latency_p50_ms": ms(percentile(&latencies, 50.0)),
        "start_latency_p99_ms": ms(percentile(&latencies, 99.0)),
        "all_ended_s": drained.as_secs_f64(),
        "runs_ended_per_s": n as f64 / drained.as_secs_f64(),
        "streams": WATCHED_RUNS * STREAMS_PER_RUN,
        "streamed_runs": WATCHED_RUNS,
        "events_measured": delivered.len(),
        "delivery_p50_ms": ms(percentile(&delivered, 50.0)),
        "delivery_p99_ms": ms(percentile(&delivered, 99.0)),
        "delivery_max_ms": ms(delivered.last().copied().unwrap_or_default()),
    }))
}
