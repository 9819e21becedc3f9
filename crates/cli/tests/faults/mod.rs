//! Faults through the binary and the real SQLite store, against a model server of the
//! test's own on 127.0.0.1: an outage that outlasts the retries interrupts a run (exit 6)
//! and `baton resume` continues it; a call cut by a timeout or a cancel counts what it
//! spent; SIGINT stops a drive as interrupted with nothing left running; an approval past
//! its deadline is decided once, as timed out.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::text;

/// How the server answers its `n`-th request (from 0).
pub(super) type Behaviour = fn(usize, &mut TcpStream);

/// A model server speaking OpenAI's Chat Completions on 127.0.0.1.
pub(super) struct Server {
    pub(super) port: u16,
    requests: Arc<AtomicUsize>,
}

impl Server {
    pub(super) fn start(behaviour: Behaviour) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&requests);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let n = counter.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    if read_request(&mut stream).is_some() {
                        behaviour(n, &mut stream);
                    }
                });
            }
        });
        Server { port, requests }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// Reads one HTTP request (headers and a `content-length` body).
fn read_request(stream: &mut TcpStream) -> Option<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().ok()?;
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(())
}

pub(super) fn respond(stream: &mut TcpStream, status: &str, body: &str) {
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
}

const ANSWER: &str = r#"{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"the answer"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}"#;

/// Two requests fail with 503 (one call's whole retry budget), then every one answers.
fn outage_then_answer(n: usize, stream: &mut TcpStream) {
    if n < 2 {
        respond(stream, "503 Service Unavailable", r#"{"error":{"message":"overloaded"}}"#);
    } else {
        respond(stream, "200 OK", ANSWER);
    }
}

/// Streams an answer one word every 100 ms, for a minute.
fn trickle(_: usize, stream: &mut TcpStream) {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
    if stream.write_all(head.as_bytes()).is_err() {
        return;
    }
    for _ in 0..600 {
        let chunk = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"word word word word \"}}]}\n\n";
        if stream.write_all(chunk.as_bytes()).and_then(|()| stream.flush()).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A name no other test of this process uses.
fn unique() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

/// A scenario directory, a provider configuration and a database of their own.
struct Case {
    dir: PathBuf,
}

impl Case {
    fn new(name: &str, scenario: &str, port: u16, stream: bool) -> Case {
        let dir = std::env::temp_dir().join(format!(
            "baton-faults-{name}-{}-{}",
            std::process::id(),
            unique()
        ));
        std::fs::create_dir_all(dir.join("scenarios")).unwrap();
        std::fs::write(dir.join("scenarios/s.yaml"), scenario).unwrap();
        std::fs::write(
            dir.join("baton.toml"),
            format!(
                "[routing]\ndefault = \"free:local/m\"\n\n[[providers]]\nname = \"local\"\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\ntier = \"free\"\nstream = {stream}\n\n[[providers.models]]\nname = \"m\"\ninput_usd_per_mtok = 1000.0\noutput_usd_per_mtok = 2000.0\n"
            ),
        )
        .unwrap();
        Case { dir }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = super::baton_in(&self.dir, &self.dir.join("runs.db"));
        c.arg("--config").arg(self.dir.join("baton.toml")).args(args);
        c
    }

    fn baton(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// Starts `baton run t` in the background, its output captured.
    fn spawn_run(&self) -> std::process::Child {
        self.command(&["run", "t", "--input", "x"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn run(&self) -> (Output, String) {
        let out = self.baton(&["run", "t", "--input", "x"]);
        let run = run_id(&out);
        (out, run)
    }

    fn events(&self, run: &str) -> Vec<serde_json::Value> {
        let out = self.baton(&["events", run, "--json"]);
        text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    fn finished(&self, run: &str) -> serde_json::Value {
        let events = self.events(run);
        events.iter().rev().find(|e| e["kind"] == "scenario_finished").cloned().unwrap_or_default()
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run_id(out: &Output) -> String {
    text(&out.stdout).lines().find_map(|l| l.strip_prefix("run ")).unwrap_or_default().to_owned()
}

fn count(events: &[serde_json::Value], kind: &str) -> usize {
    events.iter().filter(|e| e["kind"] == kind).count()
}

fn said(out: &Output) -> String {
    format!("{}{}", text(&out.stdout), text(&out.stderr))
}

/// One prompt level, served by the test's server with a retry budget of two requests.
fn one_level(extra: &str) -> String {
    format!(
        "id: t\nversion: 1\nlevels:\n  - id: answer\n    kind: prompt\n    prompt: {{inline: 'Answer {{{{ input }}}}'}}\n    model: {{allow: ['free:*'], retry: {{attempts: 2, backoff_max_s: 0.05}}}}\n    terminal: true\n{extra}"
    )
}

#[test]
fn an_outage_past_the_retries_interrupts_the_run_and_resume_continues_it() {
    let server = Server::start(outage_then_answer);
    let case = Case::new("outage", &one_level(""), server.port, false);
    let (out, run) = case.run();
    assert_eq!(out.status.code(), Some(6), "{}", said(&out));
    assert!(said(&out).contains(&format!("baton resume {run}")), "{}", said(&out));
    assert_eq!(server.requests(), 2, "the level's retry budget is two requests");
    let events = case.events(&run);
    assert_eq!(count(&events, "provider_retry"), 1, "the retry is visible");
    let interrupted = events.iter().find(|e| e["kind"] == "run_interrupted").unwrap();
    assert_eq!(interrupted["data"]["cause"], "provider_unavailable");
    assert!(interrupted["data"]["reason"].as_str().unwrap().contains("503"), "{interrupted}");
    assert_eq!(count(&events, "scenario_finished"), 0, "an interrupted run has not ended");
    let runs = case.baton(&["runs", "--json"]);
    assert!(text(&runs.stdout).contains("\"interrupted\""), "{}", said(&runs));

    let resumed = case.baton(&["resume", &run]);
    assert_eq!(resumed.status.code(), Some(0), "{}", said(&resumed));
    assert_eq!(server.requests(), 3, "the resume called the model again");
    let events = case.events(&run);
    let resumed_event = events.iter().find(|e| e["kind"] == "run_resumed").unwrap();
    assert_eq!(resumed_event["data"]["resumes"], 1);
    // The same attempt ran again: an outage is not the level's failure.
    let starts: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["kind"] == "level_started").collect();
    assert_eq!(starts.len(), 1, "{starts:?}");
    assert_eq!(case.finished(&run)["data"]["status"], "completed");
}

#[test]
fn a_permanent_failure_fails_the_run() {
    fn refuse(_: usize, stream: &mut TcpStream) {
        respond(stream, "400 Bad Request", r#"{"error":{"message":"bad model"}}"#);
    }
    let server = Server::start(refuse);
    let case = Case::new("permanent", &one_level(""), server.port, false);
    let (out, run) = case.run();
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert_eq!(server.requests(), 1, "a 400 is not retried");
    assert_eq!(count(&case.events(&run), "run_interrupted"), 0);
    assert_eq!(case.finished(&run)["data"]["status"], "failed");
}

#[test]
fn a_call_cut_by_the_level_timeout_counts_what_it_spent() {
    let server = Server::start(trickle);
    let scenario = one_level("").replace("    terminal: true\n", "    timeout_s: 1\n");
    let case = Case::new("cut", &scenario, server.port, true);
    let started = Instant::now();
    let (out, run) = case.run();
    assert!(started.elapsed() < Duration::from_secs(20), "the trickle held the run");
    assert!(out.status.code().is_some(), "{}", said(&out));
    let events = case.events(&run);
    assert_eq!(count(&events, "level_timed_out"), 1, "{events:?}");
    let cut = events.iter().find(|e| e["kind"] == "model_call_cut").expect("the cut is recorded");
    assert!(cut["data"]["streamed_bytes"].as_u64().unwrap() > 0, "{cut}");
    assert!(cut["data"]["usage"]["output_tokens"].as_u64().unwrap() > 0, "{cut}");
    let totals = &case.finished(&run)["data"]["totals"];
    assert!(totals["tokens"].as_u64().unwrap() > 0, "{totals}");
    assert!(totals["cost_usd"].as_f64().unwrap() > 0.0, "{totals}");
}

#[test]
fn a_call_cut_by_a_cancel_counts_what_it_spent() {
    let server = Server::start(trickle);
    let case = Case::new("cancel", &one_level(""), server.port, true);
    let child = case.spawn_run();
    // Wait for the run to stream.
    let started = Instant::now();
    let mut run = String::new();
    while started.elapsed() < Duration::from_secs(20) {
        let runs = case.baton(&["runs", "--json"]);
        if let Some(r) = serde_json::from_str::<serde_json::Value>(&text(&runs.stdout))
            .ok()
            .and_then(|v| v.as_array().and_then(|a| a.first().cloned()))
        {
            run = r["run_id"].as_str().unwrap_or_default().to_owned();
            if case.events(&run).iter().any(|e| e["kind"] == "heartbeat") {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!run.is_empty(), "the run never streamed");
    let cancel = case.baton(&["cancel", &run]);
    assert_eq!(cancel.status.code(), Some(0), "{}", said(&cancel));
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(5), "{}", said(&out));
    let finished = case.finished(&run);
    assert_eq!(finished["data"]["status"], "cancelled");
    assert!(finished["data"]["totals"]["tokens"].as_u64().unwrap() > 0, "{finished}");
    assert!(finished["data"]["totals"]["cost_usd"].as_f64().unwrap() > 0.0, "{finished}");
}

/// Whether a process whose command line holds `marker` is alive.
fn alive(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
        std::fs::read(p.path().join("cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).replace('\0', " ").contains(marker))
    })
}

#[test]
fn sigint_stops_a_drive_as_interrupted_and_kills_what_it_started() {
    let marker = format!("baton-faults-sigint-{}", unique());
    // The first check sleeps (its process group is killed by the stop); once the file it
    // leaves exists, the check passes at once.
    let scenario = format!(
        "id: t\nversion: 1\nlevels:\n  - id: check\n    kind: verifier\n    verifiers:\n      - {{name: slow, uses: command, params: {{argv: [sh, -c, 'test -f seen && exit 0; touch seen; sleep 30; echo {marker}']}}}}\n    terminal: true\n"
    );
    let case = Case::new("sigint", &scenario, 9, false);
    let child = case.spawn_run();
    let started = Instant::now();
    while !alive(&marker) && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(alive(&marker), "the verifier never started");
    let stopping = Instant::now();
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    assert!(stopping.elapsed() < Duration::from_secs(10), "the stop took {:?}", stopping.elapsed());
    assert_eq!(out.status.code(), Some(6), "{}", said(&out));
    assert!(!alive(&marker), "the verifier outlived the stop");
    let run = run_id(&out);
    let events = case.events(&run);
    let interrupted = events.iter().find(|e| e["kind"] == "run_interrupted").unwrap();
    assert_eq!(interrupted["data"]["cause"], "signal");
    assert_eq!(count(&events, "verifier_finished"), 0, "none of the cut step is kept");

    let resumed = case.baton(&["resume", &run]);
    assert_eq!(resumed.status.code(), Some(0), "{}", said(&resumed));
    assert_eq!(case.finished(&run)["data"]["status"], "completed");
}

/// An approval that waits at most 1 s, and a level a timeout routes to.
const APPROVAL: &str = "id: t
version: 1
levels:
  - {id: ok, kind: human_approval, timeout_s: 1}
  - {id: handled, kind: verifier, verifiers: [{name: yes, uses: command, params: {argv: ['true']}}], terminal: true}
edges:
  - {from: ok, to: handled, when: level.ok.timed_out}
  - {from: ok, to: __end__}
  - {from: handled, to: __end__}
";

#[test]
fn an_approval_past_its_deadline_is_refused_and_recorded_once_as_timed_out() {
    let case = Case::new("deadline", APPROVAL, 9, false);
    let (out, run) = case.run();
    assert_eq!(out.status.code(), Some(3), "{}", said(&out));
    assert!(text(&out.stdout).contains("or it times out"), "the pause says when: {}", said(&out));
    let events = case.events(&run);
    let request = events.iter().find(|e| e["kind"] == "approval_requested").unwrap();
    assert!(request["data"]["deadline"].is_string(), "{request}");
    std::thread::sleep(Duration::from_millis(1300));

    // A late approver is refused, with nothing written; the next driver records the
    // timeout, once.
    let approved = case.baton(&["approve", &run, "--by", "ann", "--no-resume"]);
    assert_eq!(approved.status.code(), Some(1), "{}", said(&approved));
    assert!(said(&approved).contains("timed out"), "{}", said(&approved));
    assert_eq!(case.events(&run).len(), events.len(), "the refusal wrote nothing");
    let resumed = case.baton(&["resume", &run]);
    assert_eq!(resumed.status.code(), Some(0), "{}", said(&resumed));
    let events = case.events(&run);
    let decisions: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["kind"] == "approval_decided").collect();
    assert_eq!(decisions.len(), 1, "{decisions:?}");
    assert_eq!(decisions[0]["data"]["timed_out"], true);
    assert_eq!(count(&events, "level_timed_out"), 1);
    let gates: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "gate_decision")
        .map(|e| e["data"]["target"].as_str().unwrap())
        .collect();
    assert_eq!(gates, ["handled", "__end__"], "a gate routes on level.ok.timed_out");
    let totals = &case.finished(&run)["data"]["totals"];
    assert!(totals["waiting_ms"].as_u64().unwrap() >= 1000, "the wait is recorded: {totals}");
}

#[test]
fn an_approval_within_its_deadline_is_taken() {
    let case = Case::new("in-time", &APPROVAL.replace("timeout_s: 1", "timeout_s: 600"), 9, false);
    let (out, run) = case.run();
    assert_eq!(out.status.code(), Some(3), "{}", said(&out));
    let approved = case.baton(&["approve", &run, "--by", "ann"]);
    assert_eq!(approved.status.code(), Some(0), "{}", said(&approved));
    let events = case.events(&run);
    assert_eq!(count(&events, "level_timed_out"), 0);
    assert_eq!(case.finished(&run)["data"]["status"], "completed");
}

#[test]
fn an_interrupted_run_is_cancelled_at_once() {
    let server = Server::start(outage_then_answer);
    let case = Case::new("cancel-interrupted", &one_level(""), server.port, false);
    let (out, run) = case.run();
    assert_eq!(out.status.code(), Some(6), "{}", said(&out));
    let cancelled = case.baton(&["cancel", &run, "--reason", "not needed"]);
    assert_eq!(cancelled.status.code(), Some(0), "{}", said(&cancelled));
    assert!(text(&cancelled.stdout).contains("cancelled run"), "{}", said(&cancelled));
    assert_eq!(case.finished(&run)["data"]["status"], "cancelled");
    assert_eq!(server.requests(), 2, "nothing called the model again");
}

/// The first request hangs (its driver is killed meanwhile); every later one answers.
fn hang_then_answer(n: usize, stream: &mut TcpStream) {
    if n == 0 {
        std::thread::sleep(Duration::from_secs(60));
    } else {
        respond(stream, "200 OK", ANSWER);
    }
}

/// Runs `case` until its model call is sent, kills the driver, and resumes the run: its id
/// and the resumption's output.
fn killed_mid_call(case: &Case, server: &Server) -> (String, Output) {
    let mut child = case.spawn_run();
    // Killed once the call's prompt is committed and the server holds the request.
    let started = Instant::now();
    let run = loop {
        assert!(started.elapsed() < Duration::from_secs(20), "the call was never sent");
        let runs = case.baton(&["runs", "--json"]);
        if let Some(r) = serde_json::from_str::<serde_json::Value>(&text(&runs.stdout))
            .ok()
            .and_then(|v| v.as_array().and_then(|a| a.first().cloned()))
        {
            let run = r["run_id"].as_str().unwrap_or_default().to_owned();
            if server.requests() == 1 && count(&case.events(&run), "prompt_sent") == 1 {
                break run;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    child.kill().unwrap();
    let _ = child.wait();
    let resumed = case.baton(&["resume", &run]);
    (run, resumed)
}

#[test]
fn a_call_in_flight_when_its_driver_is_killed_is_charged_once_by_the_takeover() {
    let server = Server::start(hang_then_answer);
    let case = Case::new("killed-mid-call", &one_level(""), server.port, false);
    let (run, resumed) = killed_mid_call(&case, &server);
    assert_eq!(resumed.status.code(), Some(0), "{}", said(&resumed));
    let events = case.events(&run);
    let sent = events.iter().find(|e| e["kind"] == "prompt_sent").unwrap();
    let worst = sent["data"]["worst_case_usd"].as_f64().expect("the call's worst case");
    assert!(worst > 0.0);
    // The takeover names the call it found unanswered and charges its worst case, once.
    let taken: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["kind"] == "run_taken_over").collect();
    assert_eq!(taken.len(), 1, "{events:?}");
    assert_eq!(taken[0]["data"]["cut"].as_array().unwrap().len(), 1, "{}", taken[0]);
    assert_eq!(taken[0]["data"]["charged_usd"].as_f64(), Some(worst));
    assert!(taken[0]["data"]["previous"].as_str().is_some_and(|p| !p.is_empty()));
    // The run's totals hold the answer of the call made again and the lost one's charge.
    let answered: f64 = events
        .iter()
        .filter(|e| e["kind"] == "model_response")
        .map(|e| e["data"]["cost_usd"].as_f64().unwrap())
        .sum();
    let totals = &case.finished(&run)["data"]["totals"];
    let cost = totals["cost_usd"].as_f64().unwrap();
    assert!((cost - (answered + worst)).abs() < 1e-9, "{totals}: {answered} + {worst}");
    assert_eq!(server.requests(), 2, "the lost call was made again once");
    // With a budget the charge leaves no room for the call again: it is refused, not made.
    let server = Server::start(hang_then_answer);
    let budget = format!("budget: {{max_cost_usd: {}}}\n", worst * 1.5);
    let case = Case::new("killed-mid-call-budget", &one_level(&budget), server.port, false);
    let (run, resumed) = killed_mid_call(&case, &server);
    assert_ne!(resumed.status.code(), Some(0), "{}", said(&resumed));
    let events = case.events(&run);
    assert_eq!(count(&events, "budget_exceeded"), 1, "{events:?}");
    assert_eq!(count(&events, "model_response"), 0, "{events:?}");
    assert_eq!(server.requests(), 1, "the call past the budget was never sent");
}
