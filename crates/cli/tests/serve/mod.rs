//! `baton serve` through its real binary, over real TCP, on a real SQLite file: a job
//! started through the API, watched as a live event stream (resumed with `Last-Event-ID`),
//! approved with a token whose principal is recorded, and completed by the server's workers;
//! tenant isolation over every run operation of `/openapi.json`; roles, revoked tokens,
//! Host and Origin; the limits (413, 429); approval deadlines recorded by the server;
//! bounded retries of transient stops; racing approvals recorded once; scenario files
//! reloaded while serving; and a server stopped or SIGKILLed with runs in flight whose
//! runs the next start completes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{baton_in, repo, scratch, text};

/// A running `baton serve`, killed when dropped.
pub(super) struct Served {
    child: Child,
    pub(super) addr: String,
}

impl Served {
    /// The server's process id.
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Copies the bundled scenarios into a test's directory.
fn with_scenarios(name: &str) -> (PathBuf, PathBuf) {
    let dir = scratch(name);
    super::replay::copy_scenarios(&dir);
    let db = dir.join("runs.db");
    (dir, db)
}

/// Starts `baton serve` on a free port of 127.0.0.1 and waits until it listens.
pub(super) fn serve(dir: &Path, db: &Path, extra: &[&str]) -> Served {
    serve_with(dir, db, extra, &[])
}

/// [`serve`] with more variables in the server's environment.
pub(super) fn serve_with(
    dir: &Path,
    db: &Path,
    extra: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> Served {
    let mut child = baton_in(dir, db)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(extra)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("serve.err")).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let Some(addr) = line.trim().strip_prefix("listening on http://") else {
        let _ = child.kill();
        panic!(
            "baton serve did not start: {line:?}\n{}",
            std::fs::read_to_string(dir.join("serve.err")).unwrap_or_default()
        );
    };
    Served { addr: addr.to_owned(), child }
}

/// A token made with `baton token create`.
pub(super) fn token(dir: &Path, db: &Path, tenant: &str, role: &str, name: &str) -> String {
    let out = baton_in(dir, db)
        .args(["token", "create", "--tenant", tenant, "--role", role, "--name", name])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let t = text(&out.stdout).trim().to_owned();
    assert!(t.starts_with("baton_") && t.len() == 70, "{t}");
    t
}

/// A metrics token (of no tenant) made with `baton token create --role metrics`.
pub(super) fn metrics_token(dir: &Path, db: &Path) -> String {
    let out = baton_in(dir, db).args(["token", "create", "--role", "metrics"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    text(&out.stdout).trim().to_owned()
}

pub(super) struct Reply {
    pub(super) status: u16,
    headers: Vec<(String, String)>,
    pub(super) body: String,
}

impl Reply {
    pub(super) fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.body)
    }
}

/// One HTTP/1.1 request on its own connection.
pub(super) fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-type")) {
            req.push_str("Content-Type: application/json\r\n");
        }
        req.push_str(&format!("Content-Length: {}\r\n", b.len()));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    if let Some(b) = body {
        // A server that refuses a body early may close before it is all sent.
        let _ = s.write_all(b.as_bytes());
    }
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let (head, rest) = split_head(&raw);
    let (status, headers) = parse_head(&head);
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    let body = if chunked { dechunk(rest).0 } else { rest.to_vec() };
    Reply { status, headers, body: String::from_utf8_lossy(&body).into_owned() }
}

fn split_head(raw: &[u8]) -> (String, &[u8]) {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete head");
    (String::from_utf8_lossy(&raw[..end]).into_owned(), &raw[end + 4..])
}

fn parse_head(head: &str) -> (u16, Vec<(String, String)>) {
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    (status, headers)
}

/// The chunks of a chunked body that are complete, and how many bytes they took.
fn dechunk(mut raw: &[u8]) -> (Vec<u8>, usize) {
    let mut out = Vec::new();
    let mut used = 0;
    while let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&raw[..eol]).trim(), 16).unwrap();
        if size == 0 || raw.len() < eol + 2 + size + 2 {
            break;
        }
        out.extend_from_slice(&raw[eol + 2..eol + 2 + size]);
        raw = &raw[eol + 2 + size + 2..];
        used += eol + 2 + size + 2;
    }
    (out, used)
}

/// A live event stream.
pub(super) struct Stream {
    socket: TcpStream,
    raw: Vec<u8>,
    text: String,
    closed: bool,
    /// The `model_delta` events seen (they carry no id).
    pub(super) deltas: Vec<Value>,
}

#[derive(Debug)]
pub(super) struct Sse {
    pub(super) id: u64,
    pub(super) kind: String,
    pub(super) data: Value,
}

/// Opens `GET path` as an event stream; the reply's status when it is not one.
pub(super) fn stream(addr: &str, path: &str, headers: &[(&str, &str)]) -> Result<Stream, Reply> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !raw.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the server closed before its head");
        raw.extend_from_slice(&buf[..n]);
    }
    let (head, rest) = split_head(&raw);
    let (status, headers) = parse_head(&head);
    let rest = rest.to_vec();
    if status != 200 {
        drop(s);
        let (body, _) = dechunk(&rest);
        return Err(Reply { status, headers, body: String::from_utf8_lossy(&body).into_owned() });
    }
    Ok(Stream { socket: s, raw: rest, text: String::new(), closed: false, deltas: Vec::new() })
}

impl Stream {
    /// The next event of the log (keep-alive comments skipped, `model_delta`s kept aside),
    /// or None once the server closed the stream.
    pub(super) fn next(&mut self) -> Option<Sse> {
        let (id, kind, data) = self.next_raw()?;
        Some(Sse { id: id.parse().unwrap(), kind, data })
    }

    /// Events until (and with) the first of `kind`.
    pub(super) fn until(&mut self, kind: &str) -> Vec<Sse> {
        let mut out = Vec::new();
        while let Some(e) = self.next() {
            let last = e.kind == kind;
            out.push(e);
            if last {
                return out;
            }
        }
        panic!("the stream ended before a {kind} event: {out:?}");
    }
}

pub(super) fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Polls a run until `done` says so (at most 60 s).
pub(super) fn wait_for(
    addr: &str,
    auth: &str,
    run: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = http(addr, "GET", &format!("/runs/{run}"), &[("Authorization", auth)], None);
        assert_eq!(r.status, 200, "{r:?}");
        let v = r.json();
        if done(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "run {run} never got {what}: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(super) fn start(addr: &str, auth: &str, body: &Value) -> Reply {
    http(addr, "POST", "/runs", &[("Authorization", auth)], Some(&body.to_string()))
}

fn release_notes_script() -> String {
    repo().join("scenarios/scripts/release_notes.yaml").display().to_string()
}

#[test]
fn a_job_started_through_the_api_is_watched_live_approved_with_a_token_and_completed() {
    let (dir, db) = with_scenarios("serve-job");
    let ann = bearer(&token(&dir, &db, "acme", "operator", "ann"));
    let server = serve(&dir, &db, &["--script", &release_notes_script()]);
    let addr = server.addr.as_str();
    let started = start(addr, &ann, &json!({"scenario": "release_notes", "input": "x"}));
    assert_eq!(started.status, 201, "{started:?}");
    let run = started.json()["run_id"].as_str().unwrap().to_owned();
    // The run is in the store when the start answers: it is listed at once.
    let listed = http(addr, "GET", "/runs", &[("Authorization", &ann)], None).json();
    assert!(listed["runs"].as_array().unwrap().iter().any(|r| r["run_id"] == run.as_str()));

    let mut live =
        stream(addr, &format!("/runs/{run}/events"), &[("Authorization", &ann)]).unwrap();
    let first = live.until("approval_requested");
    assert_eq!(first[0].id, 1, "a stream with no Last-Event-ID starts at the first event");
    assert!(first.windows(2).all(|w| w[1].id == w[0].id + 1), "in order, none missing");
    let paused = wait_for(addr, &ann, &run, "paused", |v| v["status"] == "paused");
    let request = paused["waiting_on"][0]["request_id"].as_str().unwrap().to_owned();
    assert_eq!(paused["waiting_on"][0]["for"], "approval");

    let approved = http(
        addr,
        "POST",
        &format!("/runs/{run}/approve"),
        &[("Authorization", &ann)],
        Some(&json!({"request_id": request, "comment": "ship it"}).to_string()),
    );
    assert_eq!(approved.status, 200, "{approved:?}");
    assert_eq!(approved.json()["by"], "ann", "the token's principal is recorded");
    // The same stream goes on with the decision and everything after it, to the end.
    let rest = live.until("scenario_finished");
    assert_eq!(rest[0].id, first.last().unwrap().id + 1, "none missing across the wait");
    assert!(rest.windows(2).all(|w| w[1].id == w[0].id + 1));
    let decided = rest.iter().find(|e| e.kind == "approval_decided").expect("the decision");
    assert_eq!(decided.data["data"]["by"], "ann");
    assert!(live.next().is_none(), "the stream ends with the run");
    // The publish level answered while the stream was open: its text came live, piece by
    // piece, before the logged answer, and the pieces make the answer.
    let published: String = live
        .deltas
        .iter()
        .filter(|d| d["level_id"] == "publish")
        .map(|d| d["text"].as_str().unwrap())
        .collect();
    let logged =
        rest.iter().find(|e| e.kind == "model_response" && e.data["level_id"] == "publish");
    assert_eq!(Some(published.as_str()), logged.and_then(|e| e.data["data"]["text"].as_str()));
    let done = wait_for(addr, &ann, &run, "completed", |v| v["status"] == "completed");
    assert!(done["output"].as_str().is_some_and(|o| !o.is_empty()), "{done}");

    // A reconnect with Last-Event-ID resumes exactly after that event.
    let mut again = stream(
        addr,
        &format!("/runs/{run}/events"),
        &[("Authorization", &ann), ("Last-Event-ID", "5")],
    )
    .unwrap();
    let resumed = again.until("scenario_finished");
    assert_eq!(resumed[0].id, 6);
    assert_eq!(resumed.last().unwrap().id, done["last_seq"].as_u64().unwrap());
    // The JSON form pages the same log.
    let page =
        http(addr, "GET", &format!("/runs/{run}/events?after=5"), &[("Authorization", &ann)], None);
    assert_eq!(page.json()["events"][0]["seq"], 6);
    // The CLI reads the same database: the decision is there, by ann.
    let events = baton_in(&dir, &db).args(["events", &run, "--json"]).output().unwrap();
    assert!(text(&events.stdout).contains("\"by\":\"ann\""), "{}", text(&events.stdout));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn another_tenants_run_is_a_404_on_every_operation_of_the_document() {
    let (dir, db) = with_scenarios("serve-tenants");
    let a = bearer(&token(&dir, &db, "tenant-a", "admin", "alice"));
    let b = bearer(&token(&dir, &db, "tenant-b", "admin", "bob"));
    let b_viewer = bearer(&token(&dir, &db, "tenant-b", "viewer", "vic"));
    let server = serve(&dir, &db, &["--script", &release_notes_script()]);
    let addr = server.addr.as_str();
    let run = start(addr, &a, &json!({"scenario": "release_notes", "input": "x"})).json()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    wait_for(addr, &a, &run, "paused", |v| v["status"] == "paused");

    let doc = http(addr, "GET", "/openapi.json", &[], None).json();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "{}", doc["openapi"]);
    let mut checked = 0;
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, _) in ops.as_object().unwrap() {
            if !path.contains("{id}") || !path.starts_with("/runs") {
                continue;
            }
            let concrete = path.replace("{id}", &run);
            let body = (method == "post").then_some("{}");
            let r = http(addr, &method.to_uppercase(), &concrete, &[("Authorization", &b)], body);
            assert_eq!(r.status, 404, "{method} {path} as tenant-b: {r:?}");
            assert_eq!(r.header("content-type"), Some("application/problem+json"));
            assert!(!r.body.contains("release_notes"), "nothing of the run leaks: {r:?}");
            checked += 1;
        }
    }
    assert!(checked >= 6, "every run operation was tried ({checked})");
    let b_runs = http(addr, "GET", "/runs", &[("Authorization", &b)], None).json();
    assert_eq!(b_runs["runs"], json!([]), "tenant-b lists none of tenant-a's runs");
    // Still paused: nothing tenant-b did reached it.
    let still = wait_for(addr, &a, &run, "paused", |v| v["status"] == "paused");
    assert_eq!(still["tenant"], "tenant-a");

    // Roles: a viewer reads but does not start.
    let refused = start(addr, &b_viewer, &json!({"scenario": "release_notes", "input": "x"}));
    assert_eq!(refused.status, 403, "{refused:?}");
    assert!(refused.json()["detail"].as_str().unwrap().contains("role viewer"));
    // No token, an unknown one, a revoked one.
    assert_eq!(http(addr, "GET", "/runs", &[], None).status, 401);
    assert_eq!(
        http(addr, "GET", "/runs", &[("Authorization", "Bearer baton_nope")], None).status,
        401
    );
    let list = baton_in(&dir, &db).args(["token", "list", "--json"]).output().unwrap();
    let tokens: Value = serde_json::from_slice(&list.stdout).unwrap();
    assert!(!text(&list.stdout).contains("baton_"), "a listing never shows a token");
    let vic = tokens.as_array().unwrap().iter().find(|t| t["name"] == "vic").unwrap();
    let revoke = baton_in(&dir, &db)
        .args(["token", "revoke", vic["id"].as_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(revoke.status.code(), Some(0), "{}", text(&revoke.stderr));
    std::thread::sleep(Duration::from_millis(2100));
    let r = http(addr, "GET", "/runs", &[("Authorization", &b_viewer)], None);
    assert_eq!(r.status, 401, "{r:?}");
    assert!(r.json()["detail"].as_str().unwrap().contains("revoked"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn other_hosts_other_origins_large_bodies_and_fast_starts_are_refused() {
    let (dir, db) = with_scenarios("serve-limits");
    let t = token(&dir, &db, "acme", "operator", "ann");
    let auth = bearer(&t);
    // Runs that take a while: a stream on one stays open.
    std::fs::write(dir.join("slow.yaml"), SLOW).unwrap();
    let quick = dir.join("slow.yaml").display().to_string();
    let server = serve(
        &dir,
        &db,
        &[
            "--script",
            &quick,
            "--body-max-bytes",
            "2048",
            "--starts-per-minute",
            "2",
            "--streams-per-token",
            "1",
        ],
    );
    let addr = server.addr.as_str();
    // DNS rebinding: a name that points at 127.0.0.1 is not this server's name.
    let rebound = http(
        addr,
        "GET",
        "/runs",
        &[("Host", "attacker.example:80"), ("Authorization", &auth)],
        None,
    );
    assert_eq!(rebound.status, 403, "{rebound:?}");
    // CSRF: a page of another origin cannot start runs, whatever it holds.
    let body = json!({"scenario": "quick_qa", "input": "q"}).to_string();
    let csrf = http(
        addr,
        "POST",
        "/runs",
        &[("Origin", "http://attacker.example"), ("Authorization", &auth)],
        Some(&body),
    );
    assert_eq!(csrf.status, 403, "{csrf:?}");
    let own = format!("http://{addr}");
    let same =
        http(addr, "POST", "/runs", &[("Origin", &own), ("Authorization", &auth)], Some(&body));
    assert_eq!(same.status, 201, "the server's own pages may: {same:?}");
    // 413 with a problem body.
    let big = json!({"scenario": "quick_qa", "input": "x".repeat(4096)}).to_string();
    let r = http(addr, "POST", "/runs", &[("Authorization", &auth)], Some(&big));
    assert_eq!(r.status, 413, "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert!(r.json()["detail"].as_str().unwrap().contains("2048 bytes"), "{r:?}");
    // 429 past the start rate, with Retry-After.
    assert_eq!(start(addr, &auth, &json!({"scenario": "quick_qa", "input": "q"})).status, 201);
    let r = start(addr, &auth, &json!({"scenario": "quick_qa", "input": "q"}));
    assert_eq!(r.status, 429, "{r:?}");
    assert!(r.header("retry-after").is_some_and(|s| s.parse::<u64>().unwrap() >= 1));
    assert!(r.json()["detail"].as_str().unwrap().contains("2 runs a minute"));
    // Malformed and unknown fields are the caller's error, said as such.
    let r = http(addr, "POST", "/runs", &[("Authorization", &auth)], Some("{\"scenaro\": 1}"));
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.json()["detail"].as_str().unwrap().contains("unknown field `scenaro`"), "{r:?}");
    let r = http(addr, "GET", "/runs?limit=9999", &[("Authorization", &auth)], None);
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    // 429 past the streams a token may hold.
    let run = same.json()["run_id"].as_str().unwrap().to_owned();
    let path = format!("/runs/{run}/events");
    let held = stream(addr, &path, &[("Authorization", &auth), ("Last-Event-ID", "1000000")]);
    assert!(held.is_ok());
    let second = stream(addr, &path, &[("Authorization", &auth)]).err().expect("a second stream");
    assert_eq!(second.status, 429, "{second:?}");
    drop(held);
    // --no-auth only on loopback.
    let out =
        baton_in(&dir, &db).args(["serve", "--listen", "0.0.0.0:0", "--no-auth"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("loopback"), "{}", text(&out.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn racing_approvals_through_the_api_and_the_cli_record_one() {
    let (dir, db) = with_scenarios("serve-race");
    let auth = bearer(&token(&dir, &db, "acme", "operator", "ann"));
    let server = serve(&dir, &db, &["--script", &release_notes_script()]);
    let addr = server.addr.clone();
    for round in 0..3 {
        let run = start(&addr, &auth, &json!({"scenario": "release_notes", "input": "x"})).json()
            ["run_id"]
            .as_str()
            .unwrap()
            .to_owned();
        wait_for(&addr, &auth, &run, "paused", |v| v["status"] == "paused");
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(3));
        let mut api = Vec::new();
        for _ in 0..2 {
            let (addr, auth, run, barrier) =
                (addr.clone(), auth.clone(), run.clone(), std::sync::Arc::clone(&barrier));
            api.push(std::thread::spawn(move || {
                barrier.wait();
                http(
                    &addr,
                    "POST",
                    &format!("/runs/{run}/approve"),
                    &[("Authorization", &auth)],
                    None,
                )
                .status
            }));
        }
        let cli = {
            let (dir, db, run, barrier) =
                (dir.clone(), db.clone(), run.clone(), std::sync::Arc::clone(&barrier));
            std::thread::spawn(move || {
                let mut c = baton_in(&dir, &db);
                c.args(["approve", &run, "--by", "cli", "--no-resume"]);
                barrier.wait();
                c.output().unwrap().status.code()
            })
        };
        let statuses: Vec<u16> = api.into_iter().map(|h| h.join().unwrap()).collect();
        let cli_ok = cli.join().unwrap() == Some(0);
        let wins = statuses.iter().filter(|s| **s == 200).count() + usize::from(cli_ok);
        assert_eq!(wins, 1, "round {round}: api {statuses:?}, cli ok {cli_ok}");
        assert!(statuses.iter().all(|s| *s == 200 || *s == 409), "{statuses:?}");
        let done = wait_for(&addr, &auth, &run, "completed", |v| v["status"] == "completed");
        let events =
            http(&addr, "GET", &format!("/runs/{run}/events"), &[("Authorization", &auth)], None)
                .json();
        let decided = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "approval_decided")
            .count();
        assert_eq!(decided, 1, "{done}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

const TIMED: &str = "id: timed\nversion: 1\nlevels:\n  - id: ask\n    kind: human_approval\n    approver_role: lead\n    timeout_s: 1\n    prompt: {inline: \"Go on with {{ input }}?\"}\n  - id: after\n    kind: prompt\n    prompt: {inline: \"Finish {{ input }}\"}\n    terminal: true\nedges:\n  - {from: ask, to: after, when: \"level.ask.approved\"}\n  - {from: ask, to: __fail__}\n";

const FLAKY: &str = "levels:\n  answer:\n    - unavailable: every provider is down\n";

#[test]
fn deadlines_pass_retries_stop_at_their_bound_and_new_scenario_files_are_served() {
    let (dir, db) = with_scenarios("serve-workers");
    std::fs::write(dir.join("flaky.yaml"), FLAKY).unwrap();
    let auth = bearer(&token(&dir, &db, "acme", "operator", "ann"));
    let server = serve(
        &dir,
        &db,
        &[
            "--script",
            dir.join("flaky.yaml").to_str().unwrap(),
            "--retries-max",
            "2",
            "--retry-first-ms",
            "100",
        ],
    );
    let addr = server.addr.as_str();
    // A scenario file added while serving is served within the refresh.
    std::fs::write(dir.join("scenarios/timed.yaml"), TIMED).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !http(addr, "GET", "/scenarios", &[("Authorization", &auth)], None)
        .body
        .contains("\"timed\"")
    {
        assert!(Instant::now() < deadline, "the new scenario file was never served");
        std::thread::sleep(Duration::from_millis(100));
    }
    // A broken file keeps the last scenarios that loaded.
    std::fs::write(dir.join("scenarios/broken.yaml"), "id: [").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        http(addr, "GET", "/scenarios", &[("Authorization", &auth)], None)
            .body
            .contains("\"timed\"")
    );
    std::fs::remove_file(dir.join("scenarios/broken.yaml")).unwrap();

    // Nobody decides: the server records the timeout when the deadline passes.
    let run = start(addr, &auth, &json!({"scenario": "timed", "input": "x"})).json()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let failed = wait_for(addr, &auth, &run, "its timeout", |v| v["status"] == "failed");
    let events =
        http(addr, "GET", &format!("/runs/{run}/events"), &[("Authorization", &auth)], None).json();
    assert!(
        events["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "approval_decided" && e["data"]["timed_out"] == true),
        "{failed}"
    );

    // Every model down: driven again twice after waits, then left interrupted.
    let run = start(addr, &auth, &json!({"scenario": "quick_qa", "input": "q"})).json()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events =
            http(addr, "GET", &format!("/runs/{run}/events"), &[("Authorization", &auth)], None)
                .json();
        let stops = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "run_interrupted")
            .count();
        if stops == 3 {
            break;
        }
        assert!(stops < 3 && Instant::now() < deadline, "{stops} stops");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1000));
    let v = wait_for(addr, &auth, &run, "interrupted", |v| v["status"] == "interrupted");
    assert!(v["reason"].as_str().unwrap().contains("every provider is down"), "{v}");
    let events =
        http(addr, "GET", &format!("/runs/{run}/events"), &[("Authorization", &auth)], None).json();
    let stops = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "run_interrupted")
        .count();
    assert_eq!(stops, 3, "no drive past the bound");
    let err = std::fs::read_to_string(dir.join("serve.err")).unwrap();
    assert!(err.contains("stays interrupted"), "{err}");
    let listed =
        http(addr, "GET", "/runs?status=interrupted", &[("Authorization", &auth)], None).json();
    let ids: Vec<&str> =
        listed["runs"].as_array().unwrap().iter().filter_map(|r| r["run_id"].as_str()).collect();
    assert_eq!(ids, [run.as_str()], "listed as interrupted, and only it");
    let running =
        http(addr, "GET", "/runs?status=running", &[("Authorization", &auth)], None).json();
    assert_eq!(running["runs"], json!([]), "{running}");
    let _ = std::fs::remove_dir_all(dir);
}

const SLOW: &str = "levels:\n  answer:\n    - text: '{\"answer\": \"Paris\", \"confidence\": 0.97, \"sources\": []}'\n      delay_ms: 3000\n";

#[test]
fn a_server_killed_or_stopped_with_runs_in_flight_loses_none() {
    let (dir, db) = with_scenarios("serve-kill");
    std::fs::write(dir.join("slow.yaml"), SLOW).unwrap();
    let auth = bearer(&token(&dir, &db, "acme", "operator", "ann"));
    let slow = dir.join("slow.yaml").display().to_string();
    let mut runs = Vec::new();
    // A hundred runs in flight when the server is killed; a dozen when it is stopped.
    for (how, count) in [("SIGKILL", 100), ("SIGTERM", 12)] {
        let mut server = serve(&dir, &db, &["--script", &slow, "--workers", "32"]);
        let addr = server.addr.clone();
        let mut these = Vec::new();
        for i in 0..count {
            let r = start(&addr, &auth, &json!({"scenario": "quick_qa", "input": format!("q{i}")}));
            assert_eq!(r.status, 201, "{r:?}");
            these.push(r.json()["run_id"].as_str().unwrap().to_owned());
        }
        std::thread::sleep(Duration::from_millis(500));
        if how == "SIGKILL" {
            server.child.kill().unwrap();
        } else {
            let pid = server.child.id().to_string();
            assert!(
                std::process::Command::new("kill")
                    .args(["-TERM", &pid])
                    .status()
                    .unwrap()
                    .success()
            );
        }
        let status = server.child.wait().unwrap();
        assert!(how == "SIGKILL" || status.success(), "{how}: {status:?}");
        runs.extend(these);
    }
    // Every run is in the store, none ended: the next server takes them all up.
    let server = serve(&dir, &db, &["--script", &slow, "--workers", "64"]);
    assert_eq!(runs.len(), 112);
    for run in &runs {
        let v = wait_for(&server.addr, &auth, run, "completed", |v| v["status"] == "completed");
        assert_eq!(v["output"].as_str().map(|o| o.contains("Paris")), Some(true), "{v}");
    }
    let err = std::fs::read_to_string(dir.join("serve.err")).unwrap();
    assert!(err.contains("taking up"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A Prometheus server (Debian's, from scripts/install-prometheus), killed when dropped.
struct Prometheus {
    child: Child,
    addr: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts Prometheus scraping `target`'s `/metrics` every second with `token`.
fn prometheus(dir: &Path, target: &str, token: &str) -> Prometheus {
    let config = format!(
        "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nscrape_configs:\n  - job_name: baton\n    scrape_interval: 1s\n    authorization: {{type: Bearer, credentials: {token}}}\n    static_configs: [{{targets: ['{target}']}}]\n"
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let child = std::process::Command::new(repo().join(".peers/prometheus/usr/bin/prometheus"))
        .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
        .arg(format!("--web.listen-address={addr}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.err")).unwrap())
        .spawn()
        .expect("Prometheus (scripts/install-prometheus)");
    Prometheus { child, addr }
}

/// The value of the one sample `query` selects in Prometheus, once it has one.
fn scraped(p: &Prometheus, dir: &Path, query: &str, done: impl Fn(f64) -> bool) -> f64 {
    let path = format!(
        "/api/v1/query?query={}",
        query
            .replace('{', "%7B")
            .replace('}', "%7D")
            .replace('"', "%22")
            .replace('=', "%3D")
            .replace(',', "%2C")
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(s) = TcpStream::connect(&p.addr) {
            drop(s);
            let r = http(&p.addr, "GET", &path, &[], None);
            if r.status == 200 {
                let v = r.json();
                let value =
                    v["data"]["result"][0]["value"][1].as_str().and_then(|s| s.parse::<f64>().ok());
                if let Some(x) = value.filter(|x| done(*x)) {
                    return x;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never had {query}:\n{}",
            std::fs::read_to_string(dir.join("prometheus.err")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn a_real_prometheus_scrapes_what_the_runs_did() {
    let (dir, db) = with_scenarios("serve-metrics");
    let admin = metrics_token(&dir, &db);
    let tenant_admin = bearer(&token(&dir, &db, "acme", "admin", "ops"));
    let ann = bearer(&token(&dir, &db, "acme", "operator", "ann"));
    let server = serve(&dir, &db, &["--script", &release_notes_script()]);
    let addr = server.addr.as_str();
    for tenants in [&ann, &tenant_admin] {
        let refused = http(addr, "GET", "/metrics", &[("Authorization", tenants)], None);
        assert_eq!(refused.status, 403, "every tenant's figures take a metrics token: {refused:?}");
        assert!(refused.body.contains("--role metrics"), "{refused:?}");
    }
    // A metrics token reads nothing of any tenant.
    let runs = http(addr, "GET", "/runs", &[("Authorization", &bearer(&admin))], None);
    assert_eq!(runs.status, 403, "{runs:?}");
    let run =
        start(addr, &ann, &json!({"scenario": "release_notes", "input": "x"})).json()["run_id"]
            .as_str()
            .unwrap()
            .to_owned();
    wait_for(addr, &ann, &run, "paused", |v| v["status"] == "paused");
    let approve =
        http(addr, "POST", &format!("/runs/{run}/approve"), &[("Authorization", &ann)], None);
    assert_eq!(approve.status, 200);
    let done = wait_for(addr, &ann, &run, "completed", |v| v["status"] == "completed");
    let admin_auth = bearer(&admin);
    let open_metrics = [
        ("Authorization", admin_auth.as_str()),
        ("Accept", "application/openmetrics-text; version=1.0.0"),
    ];
    let open = http(addr, "GET", "/metrics", &open_metrics, None);
    assert!(open.header("content-type").unwrap().starts_with("application/openmetrics-text"));
    assert!(open.body.ends_with("# EOF\n"), "{}", open.body);
    // Asked for nothing in particular, the classic text format, which promtool passes.
    let classic = http(addr, "GET", "/metrics", &[("Authorization", &admin_auth)], None);
    assert!(classic.header("content-type").unwrap().starts_with("text/plain; version=0.0.4"));
    assert!(classic.body.contains("# HELP baton_runs_started_total "), "{}", classic.body);
    assert!(!classic.body.contains("# EOF") && !classic.body.contains("# UNIT"));
    let promtool = repo().join(".peers/prometheus/usr/bin/promtool");
    let mut check = std::process::Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", promtool.display()));
    check.stdin.take().unwrap().write_all(classic.body.as_bytes()).unwrap();
    let checked = check.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}\n{}",
        text(&checked.stdout),
        text(&checked.stderr),
        classic.body
    );
    // Made-up methods and paths, with a token and without, add no series: the method is
    // `other`, the route `unmatched`.
    let series =
        |body: &str| body.lines().filter(|l| l.starts_with("baton_http_requests_total{")).count();
    let before = series(&open.body);
    for i in 0..500 {
        let auth: &[(&str, &str)] = if i % 2 == 0 { &[("Authorization", &ann)] } else { &[] };
        http(addr, &format!("M{i}X"), &format!("/nowhere/{i}"), auth, None);
    }
    let after = http(addr, "GET", "/metrics", &[("Authorization", &bearer(&admin))], None).body;
    assert!(series(&after) <= before + 4, "{} series after, {before} before", series(&after));

    let p = prometheus(&dir, addr, &admin);
    let finished = scraped(
        &p,
        &dir,
        r#"baton_runs_finished_total{scenario="release_notes",status="completed"}"#,
        |x| x >= 1.0,
    );
    assert_eq!(finished, 1.0);
    let started =
        scraped(&p, &dir, r#"baton_runs_started_total{scenario="release_notes"}"#, |_| true);
    assert_eq!(started, 1.0);
    // The run made five model calls (two drafts, two reviews, the publish): so do the
    // metrics, with their tokens and cost.
    let calls = scraped(&p, &dir, "sum(baton_model_calls_total)", |_| true);
    let logged =
        http(addr, "GET", &format!("/runs/{run}/events"), &[("Authorization", &ann)], None).json();
    let responses = logged["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "model_response")
        .count();
    assert_eq!(calls, responses as f64);
    let tokens = scraped(&p, &dir, "sum(baton_model_tokens_total)", |_| true);
    assert_eq!(tokens, done["tokens"].as_f64().unwrap());
    let cost = scraped(&p, &dir, "sum(baton_model_cost_usd_total)", |_| true);
    assert!((cost - done["cost_usd"].as_f64().unwrap()).abs() < 1e-9, "{cost} vs {done}");
    assert!(
        scraped(&p, &dir, r#"baton_level_duration_seconds_count{kind="prompt"}"#, |_| true) >= 5.0
    );
    assert_eq!(scraped(&p, &dir, "baton_approval_idle_seconds_count", |_| true), 1.0);
    assert!(scraped(&p, &dir, "baton_store_commit_seconds_count", |_| true) >= 2.0);
    assert!(
        scraped(
            &p,
            &dir,
            r#"baton_http_requests_total{route="/runs",method="POST",status="201"}"#,
            |_| true
        ) >= 1.0
    );
    assert_eq!(scraped(&p, &dir, "baton_queue_depth", |_| true), 0.0);
    let _ = std::fs::remove_dir_all(dir);
}

/// Every event of a tree stream as (run, seq, id).
fn tree_stream(
    addr: &str,
    auth: &str,
    root: &str,
    last: Option<&str>,
) -> Vec<(String, u64, String)> {
    let mut headers = vec![("Authorization", auth)];
    if let Some(l) = last {
        headers.push(("Last-Event-ID", l));
    }
    let mut s = stream_ids(addr, &format!("/runs/{root}/events?tree=true"), &headers);
    let mut out = Vec::new();
    while let Some((id, _, data)) = s.next_raw() {
        out.push((data["run_id"].as_str().unwrap().to_owned(), data["seq"].as_u64().unwrap(), id));
    }
    out
}

/// [`stream`] for ids that are not numbers.
fn stream_ids(addr: &str, path: &str, headers: &[(&str, &str)]) -> Stream {
    stream(addr, path, headers).unwrap_or_else(|r| panic!("{path}: {r:?}"))
}

impl Stream {
    /// The next event with an id — its id (whatever it looks like), type and data — or
    /// None once the server closed the stream; `model_delta`s (no id) are kept aside.
    fn next_raw(&mut self) -> Option<(String, String, Value)> {
        loop {
            if let Some(end) = self.text.find("\n\n") {
                let block: String = self.text.drain(..end + 2).collect();
                let field = |name: &str| {
                    block.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().to_owned())
                };
                let data: String = block
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim_start)
                    .collect();
                let kind = field("event:").unwrap_or_default();
                match field("id:") {
                    Some(id) => return Some((id, kind, serde_json::from_str(&data).unwrap())),
                    None if kind == "model_delta" => {
                        self.deltas.push(serde_json::from_str(&data).unwrap());
                    }
                    None => {}
                }
                continue;
            }
            if self.closed {
                return None;
            }
            let (decoded, used) = dechunk(&self.raw);
            self.raw.drain(..used);
            self.text.push_str(&String::from_utf8_lossy(&decoded));
            if !decoded.is_empty() {
                continue;
            }
            if self.raw.starts_with(b"0\r\n") {
                self.closed = true;
                continue;
            }
            let mut buf = [0u8; 8192];
            match self.socket.read(&mut buf) {
                Ok(0) | Err(_) => self.closed = true,
                Ok(n) => self.raw.extend_from_slice(&buf[..n]),
            }
        }
    }
}

#[test]
fn a_jobs_tree_is_one_stream_that_resumes_exactly_from_any_of_its_ids() {
    let (dir, db) = with_scenarios("serve-tree");
    let auth = bearer(&token(&dir, &db, "acme", "operator", "ann"));
    let script = repo().join("scenarios/scripts/intent_classifier.yaml").display().to_string();
    let server = serve(&dir, &db, &["--script", &script]);
    let addr = server.addr.as_str();
    let started =
        start(addr, &auth, &json!({"kind": "task", "input": "What is the capital of France?"}));
    assert_eq!(started.status, 201, "{started:?}");
    let root = started.json()["run_id"].as_str().unwrap().to_owned();
    let all = tree_stream(addr, &auth, &root, None);
    // Both runs, each whole and in order, the child's first event after its parent
    // recorded starting it.
    let runs: Vec<String> = {
        let mut r: Vec<String> = all.iter().map(|(run, ..)| run.clone()).collect();
        r.dedup();
        let mut seen = std::collections::BTreeSet::new();
        r.into_iter().filter(|x| seen.insert(x.clone())).collect()
    };
    assert_eq!(runs.len(), 2, "the classifier's run and the one it chained to: {all:?}");
    for run in &runs {
        let seqs: Vec<u64> = all.iter().filter(|(r, ..)| r == run).map(|(_, s, _)| *s).collect();
        let v = wait_for(addr, &auth, run, "its end", |v| v["status"] == "completed");
        assert_eq!(seqs, (1..=v["last_seq"].as_u64().unwrap()).collect::<Vec<_>>(), "run {run}");
    }
    let child_first = all.iter().position(|(r, ..)| *r != root).unwrap();
    let root_log =
        http(addr, "GET", &format!("/runs/{root}/events"), &[("Authorization", &auth)], None)
            .json();
    let started_at = root_log["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "child_run_started")
        .unwrap()["seq"]
        .as_u64()
        .unwrap();
    let parent_before: Vec<u64> =
        all[..child_first].iter().filter(|(r, ..)| *r == root).map(|(_, s, _)| *s).collect();
    assert!(parent_before.contains(&started_at), "{all:?}");
    // A reconnect from any id gets exactly what followed it.
    for cut in [0, child_first - 1, child_first, child_first + 1, all.len() - 2] {
        let resumed = tree_stream(addr, &auth, &root, Some(&all[cut].2));
        // What followed the id in each run (runs interleave as they were committed).
        let mut expected: Vec<(String, u64)> =
            all[cut + 1..].iter().map(|(r, s, _)| (r.clone(), *s)).collect();
        let mut got: Vec<(String, u64)> = resumed.iter().map(|(r, s, _)| (r.clone(), *s)).collect();
        assert!(got.windows(2).all(|w| w[0].0 != w[1].0 || w[1].1 == w[0].1 + 1), "{got:?}");
        expected.sort();
        got.sort();
        assert_eq!(got, expected, "resumed from {}", all[cut].2);
    }
    // A place the tree never had is refused, not guessed.
    let bad = stream(
        addr,
        &format!("/runs/{root}/events?tree=true"),
        &[("Authorization", &auth), ("Last-Event-ID", "3(1,1,1)")],
    );
    assert_eq!(bad.err().map(|r| r.status), Some(400));
    let _ = std::fs::remove_dir_all(dir);
}

const ASKER: &str = "id: asker\nversion: 1\nlevels:\n  - id: ask\n    kind: prompt\n    prompt: {inline: \"Paint {{ input }}\"}\n    terminal: true\n";

const ASKER_SCRIPT: &str = "scenarios:\n  asker:\n    levels:\n      ask:\n        - text: '{\"ask_user\": {\"question\": \"Which colour?\", \"schema\": {\"type\": \"object\", \"properties\": {\"colour\": {\"type\": \"string\", \"enum\": [\"red\", \"blue\"]}}, \"required\": [\"colour\"]}}}'\n        - text: 'PASS: painted it.'\n";

#[test]
fn the_web_ui_in_chromium_watches_a_run_live_and_approves_it_from_the_inbox() {
    let (dir, db) = with_scenarios("serve-ui");
    // A scenario whose model asks the user a question with the answer's schema.
    std::fs::write(dir.join("scenarios/asker.yaml"), ASKER).unwrap();
    let script = dir.join("ui.yaml");
    let notes = std::fs::read_to_string(release_notes_script()).unwrap();
    std::fs::write(&script, format!("{notes}\n{ASKER_SCRIPT}")).unwrap();
    let t = token(&dir, &db, "acme", "operator", "ann");
    let server = serve(&dir, &db, &["--script", script.to_str().unwrap()]);
    // Kept as the test's artifacts: a screenshot of each page.
    let shots = repo().join("target/ui-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let out = std::process::Command::new("node")
        .arg(repo().join("crates/cli/tests/ui/browser.mjs"))
        .arg(format!("http://{}", server.addr))
        .arg(&t)
        .arg(&shots)
        .arg(repo().join(".peers/npm"))
        .output()
        .expect("node (and scripts/test's Chromium and playwright-core)");
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    let seen: Value = serde_json::from_str(text(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(seen["errors"], json!([]), "the page logged no error: {seen}");
    assert!(seen["bad_login"].as_str().unwrap().contains("not known"), "{seen}");
    assert_eq!(seen["cookie_visible_to_scripts"], false, "the session cookie is HttpOnly");
    assert_eq!(seen["cookie"], json!({"httpOnly": true, "sameSite": "Strict"}));
    assert_eq!(seen["graph_current"], "sign_off", "{seen}");
    let visited: Vec<&str> =
        seen["visited"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(["draft", "review", "sign_off"].iter().all(|l| visited.contains(l)), "{seen}");
    assert!(seen["after"].as_u64() > seen["before"].as_u64(), "the timeline grew: {seen}");
    assert_eq!(seen["reloaded"], false, "without a reload");
    assert!(seen["deltas"].as_u64() >= Some(1), "model text streamed to the page: {seen}");
    let decision = seen["decision"].as_str().unwrap();
    assert!(decision.contains("approved by ann") && decision.contains("ship it"), "{decision}");
    assert_eq!(seen["output_headings"], json!(["New", "Improved", "Fixed"]), "{seen}");
    assert!(seen["cost_rows"].as_u64().unwrap() >= 4, "{seen}");
    let diagnostics = seen["diagnostics"].to_string();
    assert!(diagnostics.contains("bogus"), "{diagnostics}");
    assert!(seen["scenario_levels"].as_u64().unwrap() >= 5, "{seen}");
    // The question's form came from its schema, and its answer continued the run.
    assert_eq!(seen["question"], "Which colour?", "{seen}");
    let asked = seen["asker"].as_str().unwrap();
    let answered =
        wait_for(&server.addr, &bearer(&t), asked, "completed", |v| v["status"] == "completed");
    let events = http(
        &server.addr,
        "GET",
        &format!("/runs/{asked}/events"),
        &[("Authorization", &bearer(&t))],
        None,
    )
    .json();
    let answer =
        events["events"].as_array().unwrap().iter().find(|e| e["kind"] == "user_answered").unwrap();
    assert_eq!(answer["data"]["answer"], json!({"colour": "blue"}), "{answered}");
    for page in ["runs", "run-paused", "inbox", "run-completed", "scenarios", "scenario"] {
        let shot = shots.join(format!("{page}.png"));
        assert!(std::fs::metadata(&shot).is_ok_and(|m| m.len() > 1000), "{}", shot.display());
    }
    // The UI's pages carry a policy that runs no inline script and loads nothing from elsewhere.
    let index = http(&server.addr, "GET", "/", &[], None);
    let policy = index.header("content-security-policy").unwrap();
    assert!(policy.contains("script-src 'self'") && !policy.contains("unsafe-inline"), "{policy}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The OTLP receiver (`otlp_receiver.py`, on the official protobuf definitions), killed
/// when dropped; its spans are written to `spans`.
struct Receiver {
    child: Child,
    port: String,
    spans: PathBuf,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn receiver(dir: &Path) -> Receiver {
    let spans = dir.join("spans.jsonl");
    let mut child = std::process::Command::new(repo().join(".peers/venv/bin/python"))
        .arg(repo().join("crates/cli/tests/serve/otlp_receiver.py"))
        .arg(&spans)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("receiver.err")).unwrap())
        .spawn()
        .expect("python with opentelemetry-proto (scripts/test)");
    let mut port = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut port).unwrap();
    Receiver { child, port: port.trim().to_owned(), spans }
}

#[test]
fn traces_of_a_chained_job_reach_an_otlp_receiver_as_one_trace() {
    let (dir, db) = with_scenarios("serve-traces");
    let auth = bearer(&token(&dir, &db, "acme", "operator", "ann"));
    // The classifier chains to code_build, whose tool loop writes a program its verifier builds.
    let script = super::trees::classifier_to_code_build(&dir);
    let r = receiver(&dir);
    let endpoint = format!("http://127.0.0.1:{}", r.port);
    let server =
        serve(&dir, &db, &["--script", script.to_str().unwrap(), "--otlp-endpoint", &endpoint]);
    let addr = server.addr.as_str();
    let root =
        start(addr, &auth, &json!({"kind": "task", "input": "a greet CLI"})).json()["run_id"]
            .as_str()
            .unwrap()
            .to_owned();
    let done = wait_for(addr, &auth, &root, "completed", |v| v["status"] == "completed");
    let child = done["children"][0].as_str().unwrap().to_owned();
    // Spans are posted at least every second.
    let deadline = Instant::now() + Duration::from_secs(30);
    let spans: Vec<Value> = loop {
        let text = std::fs::read_to_string(&r.spans).unwrap_or_default();
        let spans: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        if spans
            .iter()
            .filter(|s| s["name"].as_str().is_some_and(|n| n.starts_with("run ")))
            .count()
            == 2
        {
            break spans;
        }
        assert!(
            Instant::now() < deadline,
            "the runs' spans never arrived: {text}\n{}",
            std::fs::read_to_string(dir.join("receiver.err")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let by_name = |prefix: &str| -> Vec<&Value> {
        spans.iter().filter(|s| s["name"].as_str().is_some_and(|n| n.starts_with(prefix))).collect()
    };
    // One trace for the whole job, from Baton.
    let trace = spans[0]["trace_id"].as_str().unwrap();
    assert!(
        spans
            .iter()
            .all(|s| s["trace_id"] == trace && s["service"] == "baton" && s["scope"] == "baton")
    );
    let run_span = |run: &str| {
        by_name("run ").into_iter().find(|s| s["attributes"]["baton.run_id"] == run).unwrap()
    };
    let (root_span, child_span) = (run_span(&root), run_span(&child));
    assert_eq!(root_span["parent"], "", "the job's first run is the trace's root");
    assert_eq!(
        child_span["parent"], root_span["span_id"],
        "the chained run hangs under its parent"
    );
    assert_eq!(child_span["attributes"]["baton.scenario"], "code_build");
    assert_eq!(child_span["attributes"]["baton.status"], "completed");
    // Levels under their run, model calls, tool calls and verifiers under their level.
    let levels = by_name("level ");
    let ids: std::collections::HashSet<&str> =
        levels.iter().map(|s| s["span_id"].as_str().unwrap()).collect();
    assert!(
        levels
            .iter()
            .all(|l| l["parent"] == root_span["span_id"] || l["parent"] == child_span["span_id"])
    );
    for kind in ["model ", "tool ", "verifier "] {
        let found = by_name(kind);
        assert!(!found.is_empty(), "no {kind}span in {spans:?}");
        assert!(
            found.iter().all(|s| ids.contains(s["parent"].as_str().unwrap())),
            "{kind}spans hang under levels"
        );
    }
    let model_calls = by_name("model ").len();
    let logged: usize = [&root, &child]
        .iter()
        .map(|run| {
            let events = http(
                addr,
                "GET",
                &format!("/runs/{run}/events"),
                &[("Authorization", &auth)],
                None,
            )
            .json();
            events["events"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["kind"] == "model_response")
                .count()
        })
        .sum();
    assert_eq!(model_calls, logged, "a span per model call");
    let build = by_name("verifier build");
    assert!(build.iter().any(|v| v["attributes"]["baton.passed"] == true), "{build:?}");
    assert!(
        spans
            .iter()
            .all(|s| s["end"].as_u64() >= s["start"].as_u64() && s["start"].as_u64() > Some(0))
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn outside_agents_run_a_manual_wave_through_the_api() {
    let (dir, db) = with_scenarios("serve-wave");
    std::fs::write(
        dir.join("tasks.json"),
        r#"{"tasks": [{"id": "t1", "title": "task 1"}, {"id": "t2", "title": "task 2"}], "context": "Goal: a todo API"}"#,
    )
    .unwrap();
    let planned = baton_in(&dir, &db)
        .args([
            "wave",
            "plan",
            "--tasks",
            dir.join("tasks.json").to_str().unwrap(),
            "--max-parallel",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(
        planned.status.code(),
        Some(3),
        "{}{}",
        text(&planned.stdout),
        text(&planned.stderr)
    );
    let run =
        text(&planned.stdout).lines().find_map(|l| l.strip_prefix("run ")).unwrap().to_owned();
    // Without auth, every caller acts on runs of no tenant, as `local`.
    let server = serve(&dir, &db, &["--no-auth"]);
    let addr = server.addr.as_str();
    let act = |action: &str, body: Value| {
        http(addr, "POST", &format!("/runs/{run}/wave/{action}"), &[], Some(&body.to_string()))
    };
    let wave = http(addr, "GET", &format!("/runs/{run}/wave"), &[], None);
    assert_eq!(wave.status, 200, "{wave:?}");
    for (i, task) in ["t1", "t2"].iter().enumerate() {
        let d = act("dispatch", json!({"task_id": task, "worker_run": format!("agent-{i}")}));
        assert_eq!(d.status, 200, "{d:?}");
        let assignment = d.json()["assignment_id"].as_str().unwrap().to_owned();
        // One at a time: the other cannot be dispatched while this one is out.
        if i == 0 {
            let busy = act("dispatch", json!({"task": "t2", "worker_run": "agent-x"}));
            assert_eq!(busy.status, 409, "{busy:?}");
        }
        let r = act(
            "record",
            json!({"assignment_id": assignment, "outcome": "completed", "summary": format!("{task} done")}),
        );
        assert_eq!(r.status, 200, "{r:?}");
        // `assignment` and `task`, the names of earlier versions, are still taken.
        let again = act("record", json!({"assignment": assignment, "outcome": "failed"}));
        assert_eq!(again.status, 409, "an assignment is settled once: {again:?}");
    }
    let bad = act("record", json!({"task": "t1", "outcome": "splendid"}));
    assert_eq!(bad.status, 400, "{bad:?}");
    let both = act("record", json!({"assignment_id": "a", "task_id": "t1", "outcome": "failed"}));
    assert_eq!(both.status, 400, "{both:?}");
    assert!(both.body.contains("exactly one of `assignment_id` and `task_id`"), "{both:?}");
    assert_eq!(act("explode", json!({})).status, 404);
    let decided = act("decide", json!({}));
    assert_eq!(decided.json()["decision"], "complete", "{decided:?}");
    assert_eq!(act("complete", json!({})).status, 200);
    let done = wait_for(addr, "", &run, "completed", |v| v["status"] == "completed");
    let events = http(addr, "GET", &format!("/runs/{run}/events"), &[], None).json();
    let recorded: Vec<&Value> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "wave_recorded")
        .collect();
    assert_eq!(recorded.len(), 2, "{done}");
    assert!(recorded.iter().all(|e| e["data"]["by"] == "local"), "{recorded:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_tenants_overrides_are_checked_stored_and_seen_by_that_tenant_only() {
    let (dir, db) = with_scenarios("serve-overrides");
    let admin = bearer(&token(&dir, &db, "acme", "admin", "ada"));
    let operator = bearer(&token(&dir, &db, "acme", "operator", "ann"));
    let other = bearer(&token(&dir, &db, "globex", "admin", "gus"));
    let server = serve(&dir, &db, &[]);
    let addr = server.addr.as_str();
    let put = |auth: &str, yaml: &str| {
        http(
            addr,
            "PUT",
            "/tenant/overrides/release_notes",
            &[("Authorization", auth), ("Content-Type", "application/yaml")],
            Some(yaml),
        )
    };
    assert_eq!(put(&operator, "display_name: Acme notes\n").status, 403, "an admin's change");
    let broken = put(&admin, "levels: 7\n");
    assert_eq!(broken.status, 422, "{broken:?}");
    assert!(broken.json()["detail"].as_str().unwrap().contains("does not load"), "{broken:?}");
    let stored = put(&admin, "display_name: Acme notes\n");
    assert_eq!(stored.status, 200, "{stored:?}");
    let listed =
        http(addr, "GET", "/tenant/overrides", &[("Authorization", &operator)], None).json();
    assert_eq!(listed[0]["scenario_id"], "release_notes");
    let name = |auth: &str| {
        http(addr, "GET", "/scenarios/release_notes", &[("Authorization", auth)], None).json()["display_name"].clone()
    };
    assert_eq!(name(&operator), "Acme notes", "the tenant's runs see its override");
    assert_ne!(name(&other), "Acme notes", "another tenant's do not");
    assert_eq!(
        http(addr, "GET", "/tenant/overrides", &[("Authorization", &other)], None).json(),
        json!([])
    );
    let path = "/tenant/overrides/release_notes";
    assert_eq!(http(addr, "DELETE", path, &[("Authorization", &other)], None).status, 404);
    assert_eq!(http(addr, "DELETE", path, &[("Authorization", &admin)], None).status, 204);
    assert_eq!(http(addr, "DELETE", path, &[("Authorization", &admin)], None).status, 404);
    assert_ne!(name(&operator), "Acme notes");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_tenants_override_may_take_tools_away_and_never_add_a_tool_a_host_a_secret_or_a_program() {
    let (dir, db) = with_scenarios("serve-override-tools");
    let admin = bearer(&token(&dir, &db, "acme", "admin", "ada"));
    let server = serve(&dir, &db, &[]);
    let addr = server.addr.as_str();
    let put = |yaml: &str| {
        http(
            addr,
            "PUT",
            "/tenant/overrides/ticket_triage",
            &[("Authorization", &admin), ("Content-Type", "application/yaml")],
            Some(yaml),
        )
    };
    let auth = "headers: {Authorization: \"Bearer ${secret:tickets}\"}";
    let list = format!(
        "      - name: list_tickets\n        effect: read\n        request: {{url: \"http://127.0.0.1:8765/tickets\", {auth}}}\n"
    );
    let widening = [
        ("a new tool", format!("toolsets:\n  tickets:\n    tools:\n{list}      - name: exfil\n        effect: read\n        request: {{url: \"https://evil.example/x\"}}\n")),
        ("another host", format!("toolsets:\n  tickets:\n    tools:\n      - name: list_tickets\n        effect: read\n        request: {{url: \"http://10.0.0.9:8765/tickets\", {auth}}}\n")),
        ("another secret", "toolsets:\n  tickets:\n    tools:\n      - name: list_tickets\n        effect: read\n        request: {url: \"http://127.0.0.1:8765/tickets\", headers: {Authorization: \"Bearer ${secret:payroll}\"}}\n".to_owned()),
        ("a program", "toolsets:\n  tickets:\n    source: command\n    tools:\n      - name: list_tickets\n        command: [sh, -c, env]\n".to_owned()),
        ("an approval dropped", format!("toolsets:\n  tickets:\n    tools:\n{list}      - name: post_reply\n        parameters: {{type: object, properties: {{id: {{type: integer}}, text: {{type: string}}, urgent: {{type: boolean}}}}}}\n        request: {{url: \"http://127.0.0.1:8765/tickets/{{id}}/replies\", {auth}}}\n")),
        ("another MCP server", "toolsets:\n  kb:\n    server: [sh, -c, env]\n".to_owned()),
    ];
    for (what, yaml) in &widening {
        let r = put(yaml);
        assert_eq!(r.status, 422, "{what}: {r:?}");
        assert!(r.body.contains("may remove tools, not add to them"), "{what}: {r:?}");
    }
    // Taking tools away — the replies, one of the knowledge base's tools — is the tenant's.
    let narrowed = format!(
        "toolsets:\n  tickets:\n    tools:\n{list}  kb:\n    allow: [read_text_file]\n    read: [read_text_file]\n"
    );
    let r = put(&narrowed);
    assert_eq!(r.status, 200, "{r:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_ticket_triage_through_the_api_sends_its_secret_to_the_service_and_shows_it_nowhere() {
    let (dir, db) = with_scenarios("serve-triage");
    let tickets = super::own_tools::Tickets::start_bundled();
    let ann = bearer(&token(&dir, &db, "acme", "operator", "ann"));
    let secret = format!("triage-secret-{}-9f8e7d", std::process::id());
    let path = format!(
        "{}:{}",
        repo().join(".peers/npm/node_modules/.bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = dir.join("scenarios/scripts/ticket_triage.yaml");
    let config = dir.join("scenarios/services/baton.toml");
    let traces = receiver(&dir);
    let endpoint = format!("http://127.0.0.1:{}", traces.port);
    let server = serve_with(
        &dir,
        &db,
        &[
            "--script",
            script.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--otlp-endpoint",
            &endpoint,
        ],
        &[("TICKETS_TOKEN", secret.as_ref()), ("PATH", path.as_ref())],
    );
    let addr = server.addr.as_str();
    let started =
        start(addr, &ann, &json!({"scenario": "ticket_triage", "input": "the open tickets"}));
    assert_eq!(started.status, 201, "{started:?}");
    let run = started.json()["run_id"].as_str().unwrap().to_owned();
    let mut live =
        stream(addr, &format!("/runs/{run}/events"), &[("Authorization", &ann)]).unwrap();
    let mut seen: Vec<String> =
        live.until("approval_requested").iter().map(|e| e.data.to_string()).collect();
    let paused = wait_for(addr, &ann, &run, "paused", |v| v["status"] == "paused");
    assert_eq!(paused["waiting_on"][0]["for"], "approval", "{paused}");
    let approved =
        http(addr, "POST", &format!("/runs/{run}/approve"), &[("Authorization", &ann)], None);
    assert_eq!(approved.status, 200, "{approved:?}");
    seen.extend(live.until("scenario_finished").iter().map(|e| e.data.to_string()));
    seen.extend(live.deltas.iter().map(ToString::to_string));
    let done = wait_for(addr, &ann, &run, "completed", |v| v["status"] == "completed");
    seen.push(done.to_string());
    seen.push(
        http(addr, "GET", &format!("/runs/{run}/events"), &[("Authorization", &ann)], None).body,
    );
    seen.push(http(addr, "GET", "/runs", &[("Authorization", &ann)], None).body);
    // The traces of the run, its tool calls' spans among them, once they are exported.
    let deadline = Instant::now() + Duration::from_secs(30);
    let spans = loop {
        let spans = std::fs::read_to_string(&traces.spans).unwrap_or_default();
        if spans.contains("\"tool post_reply") && spans.contains("\"run ") {
            break spans;
        }
        assert!(Instant::now() < deadline, "the run's spans never arrived: {spans}");
        std::thread::sleep(Duration::from_millis(200));
    };
    seen.push(spans);
    for text in &seen {
        assert!(!text.contains(&secret), "the secret reached the API or the traces: {text}");
    }
    let log = std::fs::read(&db).unwrap();
    assert!(
        !log.windows(secret.len()).any(|w| w == secret.as_bytes()),
        "the secret reached the database"
    );
    // It was sent, to the service it is for.
    let effects = tickets.effects();
    let carried = effects["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["headers"].as_object().unwrap().iter().any(|(k, v)| {
                k.eq_ignore_ascii_case("authorization") && *v == json!(format!("Bearer {secret}"))
            })
        })
        .count();
    assert!(carried >= 3, "{effects}");
    assert_eq!(effects["applied"].as_array().unwrap().len(), 2, "{effects}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_run_is_replayed_and_forked_through_the_api() {
    let (dir, db) = with_scenarios("serve-fork");
    let auth = bearer(&token(&dir, &db, "acme", "operator", "ann"));
    let server = serve(&dir, &db, &["--script", &release_notes_script()]);
    let addr = server.addr.as_str();
    let run =
        start(addr, &auth, &json!({"scenario": "release_notes", "input": "x"})).json()["run_id"]
            .as_str()
            .unwrap()
            .to_owned();
    let paused = wait_for(addr, &auth, &run, "paused", |v| v["status"] == "paused");
    let pause_seq = paused["last_seq"].as_u64().unwrap();
    let approve =
        http(addr, "POST", &format!("/runs/{run}/approve"), &[("Authorization", &auth)], None);
    assert_eq!(approve.status, 200);
    wait_for(addr, &auth, &run, "completed", |v| v["status"] == "completed");
    // A replay makes no model call and matches the recording, the approval made again.
    let mut replays = Vec::new();
    for trust in [false, true] {
        let r = http(
            addr,
            "POST",
            &format!("/runs/{run}/replay"),
            &[("Authorization", &auth)],
            Some(&json!({"trust_validation": trust}).to_string()),
        );
        assert_eq!(r.status, 200, "{r:?}");
        let report = r.json();
        assert_eq!(report["matches"], true, "{report}");
        assert_eq!(report["status"], "completed", "{report}");
        let replayed = report["replay_run_id"].as_str().unwrap();
        assert_eq!(wait_for(addr, &auth, replayed, "its end", |_| true)["tenant"], "acme");
        replays.push(replayed.to_owned());
    }
    // A fork at the pause goes on in the server and waits for its own approval.
    let points =
        http(addr, "GET", &format!("/runs/{run}/fork-points"), &[("Authorization", &auth)], None)
            .json();
    assert!(
        points["fork_points"].as_array().unwrap().iter().any(|p| p.as_u64() == Some(pause_seq)),
        "{points}"
    );
    let log =
        http(addr, "GET", &format!("/runs/{run}/events"), &[("Authorization", &auth)], None).json();
    let mid_level = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "prompt_sent")
        .unwrap()["seq"]
        .clone();
    let inside = http(
        addr,
        "POST",
        &format!("/runs/{run}/fork"),
        &[("Authorization", &auth)],
        Some(&json!({"at": mid_level}).to_string()),
    );
    assert_eq!(inside.status, 409, "not a fork point: {inside:?}");
    let forked = http(
        addr,
        "POST",
        &format!("/runs/{run}/fork"),
        &[("Authorization", &auth)],
        Some(&json!({"at": pause_seq, "scratchpad": {"note": "forked"}}).to_string()),
    );
    assert_eq!(forked.status, 201, "{forked:?}");
    let fork = forked.json()["run_id"].as_str().unwrap().to_owned();
    let waiting = wait_for(addr, &auth, &fork, "paused", |v| v["status"] == "paused");
    assert_eq!(waiting["tenant"], "acme");
    let approve =
        http(addr, "POST", &format!("/runs/{fork}/approve"), &[("Authorization", &auth)], None);
    assert_eq!(approve.status, 200, "{approve:?}");
    let done = wait_for(addr, &auth, &fork, "completed", |v| v["status"] == "completed");
    assert!(done["output"].as_str().unwrap().contains("## New"), "{done}");
    // A fork of a replay is driven as any fork is (O-s4): it reaches the pause and, once
    // approved, its end.
    let replay_pause = http(
        addr,
        "GET",
        &format!("/runs/{}/fork-points", replays[0]),
        &[("Authorization", &auth)],
        None,
    )
    .json()["fork_points"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_u64)
        .find(|p| *p == pause_seq)
        .unwrap_or_else(|| panic!("the replay has the pause at {pause_seq} as a fork point"));
    let forked = http(
        addr,
        "POST",
        &format!("/runs/{}/fork", replays[0]),
        &[("Authorization", &auth)],
        Some(&json!({"at": replay_pause}).to_string()),
    );
    assert_eq!(forked.status, 201, "{forked:?}");
    let fork = forked.json()["run_id"].as_str().unwrap().to_owned();
    wait_for(addr, &auth, &fork, "paused", |v| v["status"] == "paused");
    let approve =
        http(addr, "POST", &format!("/runs/{fork}/approve"), &[("Authorization", &auth)], None);
    assert_eq!(approve.status, 200, "{approve:?}");
    let done = wait_for(addr, &auth, &fork, "completed", |v| v["status"] == "completed");
    assert!(done["output"].as_str().unwrap().contains("## New"), "{done}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn approving_a_chained_runs_request_through_the_api_completes_the_whole_job() {
    let (dir, db) = with_scenarios("serve-chained-approval");
    let auth = bearer(&token(&dir, &db, "acme", "operator", "ann"));
    // The classifier routes to release_notes, whose sign-off pauses the chained run.
    let notes = std::fs::read_to_string(release_notes_script()).unwrap();
    let script = dir.join("job.yaml");
    std::fs::write(
        &script,
        format!(
            "{notes}\nscenarios:\n  intent_classifier:\n    levels:\n      classify:\n        - text: '{{\"chosen_intent_route\": \"release_notes\", \"confidence\": 0.9, \"reason\": \"notes\", \"candidates\": [{{\"intent_route\": \"release_notes\", \"score\": 0.9}}]}}'\n"
        ),
    )
    .unwrap();
    let server = serve(&dir, &db, &["--script", script.to_str().unwrap()]);
    let addr = server.addr.as_str();
    let root = start(addr, &auth, &json!({"kind": "task", "input": "notes for this week"})).json()
        ["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let waiting = wait_for(addr, &auth, &root, "its child", |v| {
        !v["children"].as_array().unwrap().is_empty()
    });
    let child = waiting["children"][0].as_str().unwrap().to_owned();
    // The parent names its child (`child_run_started`) in the transaction before the one
    // that creates it: for a moment the child is listed and not yet there.
    let deadline = Instant::now() + Duration::from_secs(60);
    while http(addr, "GET", &format!("/runs/{child}"), &[("Authorization", &auth)], None).status
        == 404
    {
        assert!(Instant::now() < deadline, "the child {child} was never created");
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_for(addr, &auth, &child, "paused", |v| v["status"] == "paused");
    let approve =
        http(addr, "POST", &format!("/runs/{child}/approve"), &[("Authorization", &auth)], None);
    assert_eq!(approve.status, 200, "{approve:?}");
    // The decision on the child continues the job from its root: both end.
    wait_for(addr, &auth, &child, "completed", |v| v["status"] == "completed");
    let done = wait_for(addr, &auth, &root, "completed", |v| v["status"] == "completed");
    assert!(done["output"].as_str().unwrap().contains("## New"), "{done}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A cursor of the feed as a pair, to compare.
fn feed_cursor(text: &str) -> (u64, u64) {
    let (a, b) = text.split_once('-').unwrap();
    (a.parse().unwrap(), b.parse().unwrap())
}

#[test]
fn the_feed_is_every_run_of_a_tenant_in_commit_order_and_resumes_exactly_from_any_cursor() {
    let (dir, db) = with_scenarios("serve-feed");
    let acme = bearer(&token(&dir, &db, "acme", "operator", "ann"));
    let globex = bearer(&token(&dir, &db, "globex", "viewer", "gus"));
    let globex_op = bearer(&token(&dir, &db, "globex", "operator", "gil"));
    let script = repo().join("scenarios/scripts/intent_classifier.yaml").display().to_string();
    let server = serve(&dir, &db, &["--script", &script]);
    let addr = server.addr.as_str();
    let job = json!({"kind": "task", "input": "What is the capital of France?"});
    let mut roots = Vec::new();
    for auth in [&acme, &globex_op, &acme] {
        let started = start(addr, auth, &job);
        assert_eq!(started.status, 201, "{started:?}");
        let root = started.json()["run_id"].as_str().unwrap().to_owned();
        wait_for(addr, auth, &root, "its end", |v| v["status"] == "completed");
        roots.push(root);
    }
    let page = |auth: &str, query: &str| {
        let r = http(addr, "GET", &format!("/events{query}"), &[("Authorization", auth)], None);
        assert_eq!(r.status, 200, "{r:?}");
        r.json()
    };
    let whole = page(&acme, "")["events"].as_array().unwrap().clone();
    let cursors: Vec<(u64, u64)> =
        whole.iter().map(|e| feed_cursor(e["cursor"].as_str().unwrap())).collect();
    assert!(cursors.windows(2).all(|w| w[0] < w[1]), "cursors grow: {cursors:?}");
    // Every run acme's feed names is acme's, whole and in order; globex's job is not in it.
    let mut runs: Vec<String> =
        whole.iter().map(|e| e["run_id"].as_str().unwrap().to_owned()).collect();
    runs.sort();
    runs.dedup();
    assert!(runs.len() >= 4, "two jobs of two runs each: {runs:?}");
    assert!(!runs.contains(&roots[1]), "another tenant's run is not in the feed");
    for run in &runs {
        let v = wait_for(addr, &acme, run, "its end", |v| v["status"] == "completed");
        let seqs: Vec<u64> = whole
            .iter()
            .filter(|e| e["run_id"] == run.as_str())
            .map(|e| e["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, (1..=v["last_seq"].as_u64().unwrap()).collect::<Vec<_>>(), "run {run}");
        let theirs =
            http(addr, "GET", &format!("/runs/{run}"), &[("Authorization", &globex)], None);
        assert_eq!(theirs.status, 404, "acme's run is not globex's");
    }
    // Pages of 7 following `next` are the same feed.
    let mut paged = Vec::new();
    let mut query = "?limit=7".to_owned();
    loop {
        let p = page(&acme, &query);
        let events = p["events"].as_array().unwrap();
        assert!(events.len() <= 7);
        if events.is_empty() {
            break;
        }
        paged.extend(events.iter().cloned());
        query = format!("?limit=7&after={}", p["next"].as_str().unwrap());
    }
    assert_eq!(paged, whole, "paged");
    // globex sees its own job only.
    let theirs = page(&globex, "")["events"].as_array().unwrap().clone();
    assert!(theirs.iter().any(|e| e["run_id"] == roots[1].as_str()));
    assert!(theirs.iter().all(|e| !runs.contains(&e["run_id"].as_str().unwrap().to_owned())));
    // The stream gives the same events, its ids the cursors; a reconnect from any id gets
    // exactly what followed it.
    let streamed = |last: Option<&str>, count: usize| {
        let mut headers = vec![("Authorization", acme.as_str())];
        if let Some(l) = last {
            headers.push(("Last-Event-ID", l));
        }
        let mut s = stream_ids(addr, "/events", &headers);
        (0..count)
            .map(|_| {
                let (id, kind, data) = s.next_raw().expect("an event of the feed");
                assert_eq!(data["cursor"], id.as_str());
                assert_eq!(data["kind"], kind.as_str());
                data
            })
            .collect::<Vec<Value>>()
    };
    assert_eq!(streamed(None, whole.len()), whole, "the stream from the start");
    for cut in [0, whole.len() / 2, whole.len() - 2] {
        let from = whole[cut]["cursor"].as_str().unwrap();
        assert_eq!(streamed(Some(from), whole.len() - cut - 1), whole[cut + 1..], "from {from}");
    }
    let bad = stream(addr, "/events", &[("Authorization", &acme), ("Last-Event-ID", "7")]);
    assert_eq!(bad.err().map(|r| r.status), Some(400));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_draining_server_says_so_on_readyz_refuses_new_runs_and_gives_its_runs_back_between_two_steps()
{
    let (dir, db) = with_scenarios("serve-drain");
    std::fs::write(
        dir.join("scenarios/three.yaml"),
        "id: three\nversion: 1\nlevels:\n  - {id: a, kind: prompt, prompt: {inline: 'A {{ input }}'}}\n  - {id: b, kind: prompt, prompt: {inline: 'B'}}\n  - {id: c, kind: prompt, prompt: {inline: 'C'}, terminal: true}\nedges:\n  - {from: a, to: b}\n  - {from: b, to: c}\n",
    )
    .unwrap();
    let script = dir.join("three.script.yaml");
    std::fs::write(
        &script,
        "levels:\n  a: [{text: 'one', delay_ms: 1500}]\n  b: [{text: 'two', delay_ms: 100}]\n  c: [{text: 'three', delay_ms: 100}]\n",
    )
    .unwrap();
    let script = script.to_str().unwrap();
    let auth = bearer(&token(&dir, &db, "acme", "operator", "ann"));
    let mut server = serve(&dir, &db, &["--script", script, "--drain-grace-s", "20"]);
    let addr = server.addr.clone();
    assert_eq!(http(&addr, "GET", "/readyz", &[], None).status, 200);
    let runs: Vec<String> = (0..3)
        .map(|i| {
            let r = start(&addr, &auth, &json!({"scenario": "three", "input": format!("r{i}")}));
            assert_eq!(r.status, 201, "{r:?}");
            r.json()["run_id"].as_str().unwrap().to_owned()
        })
        .collect();
    // Each run is inside its first level (1.5 s) when the server gets SIGTERM.
    let level_started = |run: &str| {
        let events =
            http(&addr, "GET", &format!("/runs/{run}/events"), &[("Authorization", &auth)], None);
        events.body.contains("\"level_started\"")
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !runs.iter().all(|r| level_started(r)) {
        assert!(Instant::now() < deadline, "the runs never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let signalled = Instant::now();
    let pid = server.pid().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    // While it drains it still answers: not ready, alive, and no new run.
    let deadline = Instant::now() + Duration::from_secs(5);
    while http(&addr, "GET", "/readyz", &[], None).status != 503 {
        assert!(Instant::now() < deadline, "/readyz never said the server drains");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(http(&addr, "GET", "/healthz", &[], None).status, 200);
    let refused = start(&addr, &auth, &json!({"scenario": "three", "input": "late"}));
    assert_eq!(refused.status, 503, "{refused:?}");
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let drained_in = signalled.elapsed();
    assert!(drained_in < Duration::from_secs(15), "drained in {drained_in:?}");
    // Each run finished its first level and was given back before the next: running,
    // never interrupted. The next server finishes them, no call made twice.
    let next = serve(&dir, &db, &["--script", script]);
    for run in &runs {
        let done = wait_for(&next.addr, &auth, run, "completed", |v| v["status"] == "completed");
        assert_eq!(done["output"], "three", "{done}");
        let events = http(
            &next.addr,
            "GET",
            &format!("/runs/{run}/events"),
            &[("Authorization", &auth)],
            None,
        )
        .json();
        let kinds: Vec<&str> = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds.iter().filter(|k| **k == "model_response").count(), 3, "{kinds:?}");
        assert_eq!(kinds.iter().filter(|k| **k == "level_started").count(), 3, "{kinds:?}");
        assert!(
            !kinds.contains(&"run_interrupted") && !kinds.contains(&"run_taken_over"),
            "{kinds:?}"
        );
    }
    drop(next);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_worker_answers_health_readiness_and_metrics_and_is_not_ready_while_it_drains() {
    let (dir, db) = with_scenarios("worker-endpoints");
    std::fs::write(dir.join("slow.yaml"), SLOW).unwrap();
    let slow = dir.join("slow.yaml");
    let queued = baton_in(&dir, &db)
        .args(["run", "quick_qa", "--queue", "--input", "the capital of France?", "--script"])
        .arg(&slow)
        .output()
        .unwrap();
    assert_eq!(queued.status.code(), Some(0), "{}", text(&queued.stderr));
    let metrics = bearer(&metrics_token(&dir, &db));
    let mut worker = baton_in(&dir, &db)
        .args(["worker", "--listen", "127.0.0.1:0", "--idle-exit-s", "30", "--script"])
        .arg(&slow)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("worker.err")).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(worker.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("listening on http://").unwrap_or_else(|| {
        panic!("{line:?}: {}", std::fs::read_to_string(dir.join("worker.err")).unwrap_or_default())
    });
    assert_eq!(http(addr, "GET", "/healthz", &[], None).status, 200);
    assert_eq!(http(addr, "GET", "/readyz", &[], None).status, 200);
    assert_eq!(http(addr, "GET", "/metrics", &[], None).status, 401);
    let scraped = http(addr, "GET", "/metrics", &[("Authorization", &metrics)], None);
    assert_eq!(scraped.status, 200, "{scraped:?}");
    assert!(scraped.body.contains("baton_"), "{}", scraped.body);
    // Nothing but its own endpoints.
    assert_eq!(http(addr, "GET", "/runs", &[("Authorization", &metrics)], None).status, 404);
    // Once it claimed the run (a 3 s answer), SIGTERM drains it: not ready, still alive.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(dir.join("worker.err"))
        .unwrap_or_default()
        .contains("claimed run")
    {
        assert!(Instant::now() < deadline, "the worker never claimed the run");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The claim is measured: how long the run waited for a worker.
    let scraped = http(addr, "GET", "/metrics", &[("Authorization", &metrics)], None);
    assert!(scraped.body.contains("baton_claim_wait_seconds_count 1"), "{}", scraped.body);
    let pid = worker.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(5);
    while http(addr, "GET", "/readyz", &[], None).status != 503 {
        assert!(Instant::now() < deadline, "/readyz never said the worker drains");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(http(addr, "GET", "/healthz", &[], None).status, 200);
    let status = worker.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_server_drives_the_runs_queued_after_it_started() {
    let (dir, db) = with_scenarios("serve-queued");
    let auth = bearer(&token(&dir, &db, "acme", "operator", "ann"));
    let script = repo().join("scenarios/scripts/quick_qa.yaml");
    let server = serve(&dir, &db, &["--script", script.to_str().unwrap()]);
    // Queued by another process, for whoever drives: the server has free slots.
    let queued = baton_in(&dir, &db)
        .args(["run", "quick_qa", "--queue", "--tenant", "acme", "--input", "the capital?"])
        .arg("--script")
        .arg(&script)
        .output()
        .unwrap();
    assert_eq!(queued.status.code(), Some(0), "{}", text(&queued.stderr));
    let run = text(&queued.stdout).lines().find_map(|l| l.strip_prefix("run ")).unwrap().to_owned();
    let done = wait_for(&server.addr, &auth, &run, "completed", |v| v["status"] == "completed");
    assert!(done["output"].as_str().is_some_and(|o| !o.is_empty()), "{done}");
    let _ = std::fs::remove_dir_all(dir);
}
