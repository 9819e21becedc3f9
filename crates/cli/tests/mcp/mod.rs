//! Baton as an MCP server, through real MCP clients: the official Python SDK's client
//! (PyPI `mcp`, `client.py` beside this file) over stdio (`baton mcp`) and over Streamable
//! HTTP (`/mcp` of `baton serve`, with tokens and tenants), and the npm MCP Inspector's CLI.
//! A tour of every kind of tool, a resource and the prompts; a wave of three planned, run
//! with progress notifications, one outcome recorded by hand, decided, completed and
//! summarised; calls abandoned with and without `cancel_with_call`; a subscription told of
//! a run another process decides; tenant scoping and roles over HTTP.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use super::serve::{bearer, http, serve, start, token, wait_for};
use super::{baton_in, repo, scratch, text};

/// A worker that answers a report, and a scenario whose one level takes seconds.
const WORKER: &str = "id: worker\nversion: 1\nlevels:\n  - id: work\n    kind: prompt\n    prompt: {inline: \"Work on {{ input }}\"}\n    terminal: true\n";
const SLOW: &str = "id: slow\nversion: 1\nlevels:\n  - id: think\n    kind: prompt\n    prompt: {inline: \"Think about {{ input }}\"}\n    terminal: true\n";

/// A test's directory: the bundled scenarios, `worker` and `slow`, a script for all of
/// them, and a database.
fn setup(name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let dir = scratch(name);
    super::replay::copy_scenarios(&dir);
    std::fs::write(dir.join("scenarios/worker.yaml"), WORKER).unwrap();
    std::fs::write(dir.join("scenarios/slow.yaml"), SLOW).unwrap();
    let indented = |file: &str| {
        let text = std::fs::read_to_string(repo().join("scenarios/scripts").join(file)).unwrap();
        text.lines().map(|l| format!("    {l}\n")).collect::<String>()
    };
    let report =
        "```worker_report\n{\"outcome\": \"completed\", \"summary\": \"done here\"}\n```\n";
    let script = format!(
        "scenarios:\n  release_notes:\n{}  quick_qa:\n{}  worker:\n    levels:\n      work: [{{text: {report:?}, delay_ms: 300, cost_usd: 0.01}}]\n  slow:\n    levels:\n      think: [{{text: \"slow answer\", delay_ms: 8000}}]\n",
        indented("release_notes.yaml"),
        indented("quick_qa.yaml"),
    );
    let script_path = dir.join("script.yaml");
    std::fs::write(&script_path, script).unwrap();
    let db = dir.join("runs.db");
    (dir, db, script_path)
}

/// The arguments that start `baton mcp` for this test.
fn mcp_args(dir: &Path, db: &Path, script: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        env!("CARGO_BIN_EXE_baton").to_owned(),
        "--scenarios".to_owned(),
        dir.join("scenarios").display().to_string(),
        "--db".to_owned(),
        db.display().to_string(),
        "mcp".to_owned(),
        "--script".to_owned(),
        script.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

fn python() -> Command {
    let mut c = Command::new(repo().join(".peers/venv/bin/python"));
    c.arg(repo().join("crates/cli/tests/mcp/client.py"))
        .env("BATON_BWRAP", super::bwrap())
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("BATON_CONFIG");
    c
}

/// Runs a step of `client.py` and returns the JSON it printed last.
fn client(step: &str, transport: &[String], dir: &Path) -> Value {
    let out = python().arg(step).args(transport).current_dir(dir).output().unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "client.py {step} failed:\n{stdout}\n{}", text(&out.stderr));
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn stdio(dir: &Path, db: &Path, script: &Path) -> Vec<String> {
    let mut t = vec!["stdio".to_owned()];
    t.extend(mcp_args(dir, db, script, &[]));
    t
}

const TOOLS: [&str; 21] = [
    "scenarios_list",
    "scenario_describe",
    "scenario_validate",
    "run_start",
    "run_get",
    "run_events",
    "run_cancel",
    "run_approve",
    "run_reject",
    "run_steer",
    "run_answer",
    "wave_plan",
    "wave_dispatch",
    "wave_record",
    "wave_decide",
    "wave_complete",
    "wave_cancel",
    "wave_run",
    "wave_get",
    "wave_list",
    "wave_summary",
];

#[test]
fn the_python_client_over_stdio_starts_follows_and_approves_a_run_and_reads_resources_and_prompts()
{
    let (dir, db, script) = setup("mcp-tour");
    let v = client("tour", &stdio(&dir, &db, &script), &dir);
    // Every structured result conformed to its tool's declared output schema (jsonschema).
    assert!(v["validated"].as_u64().unwrap() >= 8, "{}", v["validated"]);

    // Every tool, each with an object input schema and an object output schema.
    let tools = v["tools"].as_object().unwrap();
    for name in TOOLS {
        let t = &tools[name];
        assert_eq!(t["input"]["type"], "object", "{name}: {t}");
        assert_eq!(t["output"]["type"], "object", "{name}: {t}");
    }
    assert_eq!(tools.len(), TOOLS.len(), "{:?}", tools.keys());
    // No schema holds a boolean subschema (some SDKs refuse the whole list over one), and
    // the wave tools' results type their counts.
    for (name, t) in tools {
        for side in ["input", "output"] {
            let found = boolean_subschemas(&t[side], &format!("{name}.{side}"));
            assert!(found.is_empty(), "boolean subschemas: {found:?}");
        }
    }
    let counts = &tools["wave_record"]["output"]["properties"]["counts"];
    let counts = match counts.get("$ref").and_then(Value::as_str) {
        Some(r) => &tools["wave_record"]["output"]["$defs"][r.rsplit('/').next().unwrap()],
        None => counts,
    };
    assert_eq!(counts["properties"]["in_flight"]["type"], "integer", "{counts}");
    // run_start's input schema names its arguments, and refuses others.
    let start = &tools["run_start"]["input"];
    for arg in
        ["scenario", "intent", "kind", "tenant", "input", "metadata", "wait_s", "cancel_with_call"]
    {
        assert!(start["properties"].get(arg).is_some(), "{arg}: {start}");
    }
    assert_eq!(start["additionalProperties"], json!({"not": {}}), "refuses other arguments");

    let ids: Vec<&str> = v["scenarios"]["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"release_notes") && ids.contains(&"worker"), "{ids:?}");
    let d = &v["describe"];
    assert_eq!(d["id"], "release_notes");
    assert!(d["levels_in_order"].as_array().unwrap().len() >= 3, "{d}");
    assert!(d["edges"].as_array().unwrap().iter().any(|e| e["when"].is_string()), "{d}");
    assert!(d["graph"]["mermaid"].as_str().unwrap().contains("draft"), "{d}");
    assert!(d["input"].as_str().unwrap().contains("input"), "{d}");
    assert!(v["describe_unknown"]["error"].as_str().unwrap().contains("no scenario `nope`"));
    // A broken file: diagnostics with line and column.
    let bad = &v["validate_bad"];
    assert_eq!(bad["ok"], false, "{bad}");
    let diag = &bad["diagnostics"][0];
    assert!(diag["line"].as_u64().unwrap() >= 1 && diag["column"].as_u64().is_some(), "{bad}");

    // Started with a wait: it paused for the sign-off, with progress on the way.
    let started = &v["started"];
    assert_eq!(started["scenario_id"], "release_notes");
    assert_eq!(started["run"]["status"], "paused", "{started}");
    assert_eq!(started["still_running"], false);
    assert!(started["on_call_cancelled"].as_str().unwrap().contains("goes on"));
    let progress = v["start_progress"].as_array().unwrap();
    assert!(!progress.is_empty(), "no progress notifications");
    let values: Vec<f64> = progress.iter().map(|p| p["progress"].as_f64().unwrap()).collect();
    assert!(values.windows(2).all(|w| w[0] < w[1]), "progress must increase: {values:?}");
    let paused = &v["get_paused"];
    assert_eq!(paused["waiting_on"][0]["for"], "approval", "{paused}");
    // Approved once, by the stdio caller; a second approval is refused.
    assert_eq!(v["approve"]["approved"], true, "{}", v["approve"]);
    assert_eq!(v["approve"]["by"], "mcp");
    let again = v["approve_again"]["error"].as_str().unwrap_or_default();
    assert!(!again.is_empty(), "a second approval must be refused: {}", v["approve_again"]);
    assert_eq!(v["get_done"]["status"], "completed", "{}", v["get_done"]);
    assert!(v["get_done"]["output"].is_string());

    // Events page by page: the first page says where the next begins.
    let first = v["events"]["events"].as_array().unwrap();
    assert_eq!(first.len(), 5);
    assert_eq!(first[0]["seq"], 1);
    assert_eq!(v["events"]["next_after"], 5);
    let rest = v["events_rest"]["events"].as_array().unwrap();
    assert_eq!(rest[0]["seq"], 6);
    assert_eq!(rest.last().unwrap()["kind"], "scenario_finished");
    assert!(v["events_rest"]["next_after"].is_null());

    // Protocol errors for a malformed call and an unknown tool, naming what is wrong.
    assert!(v["bad_args"].as_str().unwrap().contains("run_id"), "{}", v["bad_args"]);
    assert!(v["unknown_tool"].as_str().unwrap().contains("no_such_tool"), "{}", v["unknown_tool"]);

    let run_id = started["run_id"].as_str().unwrap();
    let uris: Vec<&str> =
        v["resources"].as_array().unwrap().iter().map(|u| u.as_str().unwrap()).collect();
    assert!(uris.contains(&"baton://guide"));
    assert!(uris.contains(&format!("baton://runs/{run_id}/timeline").as_str()), "{uris:?}");
    assert_eq!(v["templates"][0], "baton://runs/{run_id}/timeline");
    let timeline = v["timeline"].as_str().unwrap();
    assert!(timeline.contains("completed") && timeline.contains("approval_decided"), "{timeline}");
    assert!(v["guide"].as_str().unwrap().contains("wave_dispatch"));
    assert_eq!(v["prompts"], serde_json::json!(["baton", "baton:waves"]));
    assert!(
        v["prompt_baton"].as_str().unwrap().contains("Recently ended"),
        "{}",
        v["prompt_baton"]
    );
    assert!(v["prompt_waves"].as_str().unwrap().contains("waves"));

    // The approval is in the log, by the stdio caller's name.
    let out = baton_in(&dir, &db).args(["events", run_id, "--json"]).output().unwrap();
    assert!(text(&out.stdout).contains("\"mcp\""), "{}", text(&out.stdout));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_wave_of_three_is_planned_run_with_progress_recorded_by_hand_decided_completed_and_summarised()
{
    let (dir, db, script) = setup("mcp-wave");
    let v = client("wave", &stdio(&dir, &db, &script), &dir);
    assert!(v["validated"].as_u64().unwrap() >= 5, "{}", v["validated"]);

    let plan = &v["plan"];
    let wave_id = plan["run_id"].as_str().unwrap();
    assert_eq!(plan["counts"]["assignments"], 3, "{plan}");
    assert_eq!(plan["max_parallel"], 2);
    assert_eq!(v["current"]["run_id"], wave_id, "`current` names the planned wave");
    assert_eq!(v["dispatch"]["dispatched"][0]["assignment_id"], "assign-001", "{}", v["dispatch"]);

    // wave_run ran the two planned assignments and stopped waiting for the outside one.
    let ran = &v["run"];
    assert_eq!(ran["stopped"], "waiting for outside agents", "{ran}");
    assert_eq!(ran["still_running"], false);
    assert_eq!(ran["wave"]["counts"]["completed"], 2, "{ran}");
    assert_eq!(ran["wave"]["counts"]["in_flight"], 1, "{ran}");
    let progress = v["run_progress"].as_array().unwrap();
    assert!(progress.len() >= 2, "{progress:?}");
    let values: Vec<f64> = progress.iter().map(|p| p["progress"].as_f64().unwrap()).collect();
    assert!(values.windows(2).all(|w| w[0] < w[1]), "{values:?}");
    assert!(progress.iter().all(|p| p["total"] == 6.0), "{progress:?}");
    assert!(
        progress.last().unwrap()["message"].as_str().unwrap().starts_with("2 of 3 settled"),
        "{progress:?}"
    );

    assert_eq!(v["decide_before"]["decision"], "wait", "{}", v["decide_before"]);
    assert_eq!(v["record"]["assignment_id"], "assign-001");
    assert!(v["record_again"]["error"].is_string(), "recorded once: {}", v["record_again"]);
    assert_eq!(v["decide"]["decision"], "complete");
    assert_eq!(v["complete"]["decision"], "complete");
    assert_eq!(v["wave_run_status"], "completed");
    let got = &v["get"];
    assert_eq!(got["ended"], true);
    let outside =
        got["assignments"].as_array().unwrap().iter().find(|a| a["task_id"] == "t1").unwrap();
    assert_eq!(outside["worker_run"], "outside-1");
    assert_eq!(outside["summary"], "changelog written");
    assert_eq!(v["list"]["waves"][0]["run_id"], wave_id);
    let s = &v["summary"];
    assert_eq!(s["waves"], 1);
    assert_eq!(s["under_way"], 0);
    assert_eq!(s["assignments"]["completed"], 3, "{s}");
    assert!(v["current_after"]["error"].as_str().unwrap().contains("no wave is under way"));
    assert!(v["prompt_waves"].as_str().unwrap().contains(wave_id));

    // The CLI sees the same wave, recorded by the MCP caller.
    let out = baton_in(&dir, &db).args(["wave", "get", wave_id, "--json"]).output().unwrap();
    let cli: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(cli["counts"]["completed"], 3);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_abandoned_call_cancels_its_run_only_when_started_with_cancel_with_call() {
    let (dir, db, script) = setup("mcp-cancel");
    let v = client("cancel", &stdio(&dir, &db, &script), &dir);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{runs:?}");
    let log = |id: &str| {
        let out = baton_in(&dir, &db).args(["events", id, "--json"]).output().unwrap();
        text(&out.stdout)
    };
    let of = |flag: &str| {
        runs.iter()
            .find(|r| log(r["run_id"].as_str().unwrap()).contains(&format!("flag {flag}")))
            .unwrap()
    };
    let with = of("True");
    assert_eq!(with["status"], "cancelled", "{with}");
    assert!(log(with["run_id"].as_str().unwrap()).contains("cancel_with_call"), "{with}");
    assert!(!v["progress_True"].as_array().unwrap().is_empty(), "progress before the cancel: {v}");
    // The other was left to run: it finished (its one level takes 8 s) or is still going.
    let without = of("False");
    assert_ne!(without["status"], "cancelled", "{without}");
    // wave_run abandoned with cancel_with_call: the wave and its worker are cancelled.
    let wave = &v["wave"];
    assert_eq!(wave["run_status"], "cancelled", "{wave}");
    assert_eq!(wave["decision"], "cancelled", "{wave}");
    assert!(!v["wave_progress"].as_array().unwrap().is_empty(), "{v}");
    let worker = wave["assignments"][0]["worker_run"].as_str().unwrap();
    assert!(log(worker).contains("cancel_requested"), "the worker was cancelled too");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_subscribed_timeline_is_told_of_a_decision_another_process_makes() {
    let (last, run_id) = approved_while_subscribed("subscribe", "mcp-subscribe");
    let uri = format!("baton://runs/{run_id}/timeline");
    let updates = last["updates"].as_array().unwrap();
    assert!(!updates.is_empty(), "{last}");
    assert!(updates.iter().all(|u| u == uri.as_str()), "{last}");
    assert_eq!(last["status"], "completed", "{last}");
    let timeline = last["timeline"].as_str().unwrap();
    assert!(
        timeline.contains("release-manager") && timeline.contains("scenario_finished"),
        "{timeline}"
    );
}

/// Runs a `client.py` step that prints `{"subscribed": RUN}` once the run is paused and
/// subscribed to, approves the run from another process, and returns the step's last line.
fn approved_while_subscribed(step: &str, name: &str) -> (Value, String) {
    let (dir, db, script) = setup(name);
    let mut child = python()
        .arg(step)
        .args(stdio(&dir, &db, &script))
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("client.err")).unwrap())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let err = || std::fs::read_to_string(dir.join("client.err")).unwrap_or_default();
    let first = lines.next().unwrap().unwrap_or_default();
    let first: Value =
        serde_json::from_str(&first).unwrap_or_else(|e| panic!("{e}: {first} {}", err()));
    let run_id = first["subscribed"].as_str().unwrap().to_owned();
    // Another process approves the paused run and drives it to its end.
    let out =
        baton_in(&dir, &db).args(["approve", &run_id, "--by", "release-manager"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let last = lines.next().unwrap().unwrap_or_default();
    assert!(child.wait().unwrap().success(), "{}", err());
    let last: Value =
        serde_json::from_str(&last).unwrap_or_else(|e| panic!("{e}: {last} {}", err()));
    let _ = std::fs::remove_dir_all(dir);
    (last, run_id)
}

#[test]
fn the_2026_protocol_client_hears_a_timeline_through_subscriptions_listen() {
    let (v, run_id) = approved_while_subscribed("modern", "mcp-modern");
    assert_eq!(v["protocol"], "2026-07-28", "{v}");
    assert_eq!(v["tools"], TOOLS.len());
    assert_eq!(v["paused"], "paused");
    let uri = format!("baton://runs/{run_id}/timeline");
    assert_eq!(v["honored"], serde_json::json!([uri]), "{v}");
    let heard = v["heard"].as_array().unwrap();
    assert!(!heard.is_empty() && heard.iter().all(|h| h == uri.as_str()), "{v}");
    assert_eq!(v["status"], "completed", "{v}");
}

#[test]
fn over_streamable_http_each_call_acts_as_its_tokens_tenant_and_role() {
    let (dir, db, script) = setup("mcp-http");
    let a = token(&dir, &db, "acme", "operator", "alice");
    let b = token(&dir, &db, "globex", "operator", "bob");
    let viewer = token(&dir, &db, "acme", "viewer", "vera");
    let served = serve(&dir, &db, &["--script", script.to_str().unwrap()]);
    let url = format!("http://{}/mcp", served.addr);

    // No token: the HTTP layer refuses before MCP.
    let r = http(
        &served.addr,
        "POST",
        "/mcp",
        &[("Accept", "application/json, text/event-stream")],
        Some(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        ),
    );
    assert_eq!(r.status, 401, "{}", r.body);

    let mine = client("tenants", &["http".to_owned(), url.clone(), a], &dir);
    let run_id = mine["start"]["run_id"].as_str().unwrap().to_owned();
    assert_eq!(mine["start"]["run"]["tenant"], "acme", "{}", mine["start"]);
    assert_eq!(mine["start"]["run"]["status"], "completed", "{}", mine["start"]);

    // The 2026-07-28 protocol, stateless: each request is its token's too.
    let modern =
        client("modern_http", &["http".to_owned(), url.clone(), b.clone(), run_id.clone()], &dir);
    assert_eq!(modern["protocol"], "2026-07-28", "{modern}");
    assert_eq!(modern["start"]["run"]["tenant"], "globex", "{modern}");
    assert_eq!(modern["start"]["run"]["status"], "completed", "{modern}");
    assert!(modern["other_get"]["error"].as_str().unwrap().contains("no run"), "{modern}");
    // Listening to another tenant's timeline ends, as listening to a missing run's does,
    // instead of going on silently (the client shows the end, not the server's words).
    let listened = |key: &str, run: &str| {
        let said = modern[key].as_str().unwrap_or_default().replace(run, "RUN");
        let said: String = said.chars().filter(|c| !c.is_ascii_digit()).collect();
        assert!(said.starts_with("error: "), "{key}: {said}");
        said
    };
    assert_eq!(listened("other_listen", &run_id), listened("missing_listen", "no-such-run"));

    let theirs = client("tenants", &["http".to_owned(), url.clone(), b, run_id.clone()], &dir);
    for key in ["other_get", "other_events", "other_cancel", "other_wave"] {
        let e = theirs[key]["error"].as_str().unwrap_or_default();
        assert!(e.contains("no run") || e.contains("no wave"), "{key}: {}", theirs[key]);
    }
    assert!(
        theirs["other_timeline"].as_str().unwrap().contains("no resource"),
        "{}",
        theirs["other_timeline"]
    );
    let listed = theirs["resources"].as_array().unwrap();
    assert!(!listed.iter().any(|u| u.as_str().unwrap().contains(&run_id)), "{listed:?}");
    assert!(theirs["tenant_arg"]["error"].as_str().unwrap().contains("not this caller's"));

    // A viewer reads but does not start.
    let v = client("tenants", &["http".to_owned(), url, viewer], &dir);
    assert!(v["scenarios"]["scenarios"].is_array());
    assert!(v["start"]["error"].as_str().unwrap().contains("role viewer"), "{}", v["start"]);
    // The run the other tenant tried to cancel is untouched.
    let out = baton_in(&dir, &db).args(["runs", "--json"]).output().unwrap();
    assert!(!text(&out.stdout).contains("cancelled"), "{}", text(&out.stdout));
    drop(served);
    let _ = std::fs::remove_dir_all(dir);
}

/// Where `schema` (at `path`) holds `true` or `false` other than as a keyword's value that
/// is a flag or data (`default`, `const`, `enum`, `examples`, `readOnly` …): every other
/// boolean in a schema stands where a schema goes.
fn boolean_subschemas(schema: &Value, path: &str) -> Vec<String> {
    const DATA: [&str; 4] = ["default", "const", "enum", "examples"];
    const FLAGS: [&str; 4] = ["readOnly", "writeOnly", "deprecated", "uniqueItems"];
    match schema {
        Value::Bool(_) => vec![path.to_owned()],
        Value::Array(items) => items
            .iter()
            .enumerate()
            .flat_map(|(i, v)| boolean_subschemas(v, &format!("{path}[{i}]")))
            .collect(),
        Value::Object(object) => object
            .iter()
            .filter(|(k, v)| {
                let flag = FLAGS.contains(&k.as_str()) && v.is_boolean();
                !(DATA.contains(&k.as_str()) || flag)
            })
            .flat_map(|(k, v)| boolean_subschemas(v, &format!("{path}.{k}")))
            .collect(),
        _ => Vec::new(),
    }
}

/// What the Inspector's CLI did, whether it succeeded or not.
fn inspector_output(args: &[String]) -> std::process::Output {
    let bin = repo().join(".peers/npm/node_modules/.bin/mcp-inspector");
    Command::new(&bin).arg("--cli").args(args).output().unwrap()
}

/// The Inspector's CLI (`mcp-inspector --cli`), a client written independently of both
/// Baton and the Python SDK.
fn inspector(args: &[String]) -> Value {
    let out = inspector_output(args);
    assert!(
        out.status.success(),
        "inspector {args:?}:\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    serde_json::from_str(&text(&out.stdout))
        .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

#[test]
fn the_mcp_inspector_cli_lists_and_calls_the_tools_over_stdio_and_http() {
    let (dir, db, script) = setup("mcp-inspector");
    let server = mcp_args(&dir, &db, &script, &[]);
    let mut list = server.clone();
    list.extend(["--method".to_owned(), "tools/list".to_owned()]);
    let tools = inspector(&list);
    let names: Vec<&str> =
        tools["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, TOOLS);
    assert!(names.contains(&"wave_run"));
    let mut call = server;
    call.extend(
        [
            "--method",
            "tools/call",
            "--tool-name",
            "scenario_describe",
            "--tool-arg",
            "scenario=quick_qa",
        ]
        .map(str::to_owned),
    );
    let described = inspector(&call);
    assert_eq!(described["structuredContent"]["id"], "quick_qa", "{described}");

    let a = token(&dir, &db, "acme", "operator", "alice");
    let served = serve(&dir, &db, &["--script", script.to_str().unwrap()]);
    let url = format!("http://{}/mcp", served.addr);
    let auth = format!("Authorization: Bearer {a}");
    let started = inspector(
        &[
            url.as_str(),
            "--transport",
            "http",
            "--header",
            auth.as_str(),
            "--method",
            "tools/call",
            "--tool-name",
            "run_start",
            "--tool-arg",
            "scenario=quick_qa",
            "input=What is the capital of France?",
            "wait_s=30",
        ]
        .map(str::to_owned),
    );
    let sc = &started["structuredContent"];
    assert_eq!(sc["run"]["status"], "completed", "{started}");
    assert_eq!(sc["run"]["tenant"], "acme");
    drop(served);
    let _ = std::fs::remove_dir_all(dir);
}

/// The run a `baton run` or `baton wave plan` printed (`run ID`).
fn printed_run(out: &std::process::Output) -> String {
    text(&out.stdout).lines().find_map(|l| l.strip_prefix("run ")).unwrap().trim().to_owned()
}

/// Starts `racers` MCP clients (each with its own `baton mcp` process on the database) and
/// one CLI process for the same decision, lets them all go at once, and returns what each
/// MCP client got and the CLI's output.
fn race(
    dir: &Path,
    db: &Path,
    script: &Path,
    what: &str,
    cli: &[&str],
) -> (Vec<Value>, std::process::Output) {
    let go = dir.join(format!("go-{}", what.replace(' ', "-")));
    let mut racers = Vec::new();
    for i in 0..3 {
        let mut child = python()
            .arg("race")
            .args(stdio(dir, db, script))
            .env("RACE", what)
            .env("RACE_GO", &go)
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join(format!("racer-{i}.err"))).unwrap())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = lines.next().unwrap().unwrap();
        assert!(ready.contains("ready"), "{ready}");
        racers.push((child, lines));
    }
    let mut cli_racer = baton_in(dir, db);
    cli_racer.args(cli);
    std::fs::write(&go, "").unwrap();
    let cli_out = cli_racer.output().unwrap();
    let mut got = Vec::new();
    for (mut child, mut lines) in racers {
        let last = lines.next().unwrap().unwrap();
        assert!(child.wait().unwrap().success());
        got.push(serde_json::from_str::<Value>(&last).unwrap()["result"].clone());
    }
    (got, cli_out)
}

#[test]
fn racing_mcp_processes_and_the_cli_make_one_approval_and_one_wave_record() {
    let (dir, db, script) = setup("mcp-race");
    // A run paused for its sign-off, started by the CLI.
    let out = baton_in(&dir, &db)
        .args(["run", "release_notes", "--input", "v3", "--script", script.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let run_id = printed_run(&out);
    let (got, cli) = race(
        &dir,
        &db,
        &script,
        &format!("approve {run_id}"),
        &["approve", &run_id, "--by", "cli"],
    );
    let won =
        got.iter().filter(|g| g["approved"] == true).count() + usize::from(cli.status.success());
    assert_eq!(won, 1, "exactly one approval wins: {got:?} / {}", text(&cli.stderr));
    let log =
        text(&baton_in(&dir, &db).args(["events", &run_id, "--json"]).output().unwrap().stdout);
    assert_eq!(log.matches("\"approval_decided\"").count(), 1, "{log}");

    // A manual wave's assignment, recorded by racers.
    let tasks = dir.join("tasks.json");
    std::fs::write(&tasks, r#"{"tasks": [{"id": "t1", "title": "one"}]}"#).unwrap();
    let out = baton_in(&dir, &db)
        .args(["wave", "plan", "--tasks", tasks.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
    let wave_id = printed_run(&out);
    let out = baton_in(&dir, &db)
        .args(["wave", "dispatch", &wave_id, "--task", "t1", "--worker-run", "ext-1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let (got, cli) = race(
        &dir,
        &db,
        &script,
        &format!("record {wave_id} t1"),
        &["wave", "record", &wave_id, "--task", "t1", "--outcome", "failed"],
    );
    let won = got.iter().filter(|g| g["assignment_id"] == "assign-001").count()
        + usize::from(cli.status.success());
    assert_eq!(won, 1, "exactly one record wins: {got:?} / {}", text(&cli.stderr));
    let log =
        text(&baton_in(&dir, &db).args(["events", &wave_id, "--json"]).output().unwrap().stdout);
    assert_eq!(log.matches("\"wave_recorded\"").count(), 1, "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

/// An approval, then a level that takes steering.
const GATED: &str = "id: gated\nversion: 1\nlevels:\n  - {id: ask, kind: human_approval, prompt: {inline: 'Go?'}}\n  - {id: write, kind: prompt, steerable: true, prompt: {inline: 'Write it.'}, terminal: true}\nedges:\n  - {from: ask, to: write}\n  - {from: write, to: __end__}\n";

#[test]
fn a_run_is_steered_over_http_and_mcp_by_operators_of_its_tenant_and_by_no_one_else() {
    let (dir, db, script) = setup("mcp-steer");
    std::fs::write(dir.join("scenarios/gated.yaml"), GATED).unwrap();
    let mut answers = std::fs::read_to_string(&script).unwrap();
    answers.push_str("  gated:\n    levels:\n      write: [{text: written}]\n");
    std::fs::write(&script, answers).unwrap();
    let alice = bearer(&token(&dir, &db, "acme", "operator", "alice"));
    let vera = bearer(&token(&dir, &db, "acme", "viewer", "vera"));
    let bob = bearer(&token(&dir, &db, "globex", "operator", "bob"));
    let served = serve(&dir, &db, &["--script", script.to_str().unwrap()]);
    let addr = served.addr.as_str();
    let run = start(addr, &alice, &json!({"scenario": "gated", "input": "x"})).json()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    wait_for(addr, &alice, &run, "paused", |v| v["status"] == "paused");
    let steer = |auth: &str, body: &Value| {
        http(
            addr,
            "POST",
            &format!("/runs/{run}/steer"),
            &[("Authorization", auth)],
            Some(&body.to_string()),
        )
    };
    let by_viewer = steer(&vera, &json!({"message": "M-VIEWER"}));
    assert_eq!(by_viewer.status, 403, "{by_viewer:?}");
    let by_stranger = steer(&bob, &json!({"message": "M-STRANGER"}));
    assert_eq!(by_stranger.status, 404, "another tenant's run is not there: {by_stranger:?}");
    let empty = steer(&alice, &json!({"message": " "}));
    assert_eq!(empty.status, 400, "{empty:?}");
    let sent = steer(&alice, &json!({"message": "M-HTTP"}));
    assert_eq!(sent.status, 200, "{sent:?}");
    assert_eq!(
        (sent.json()["id"].clone(), sent.json()["by"].clone()),
        (json!("steer-1"), json!("alice"))
    );

    // The same use case as an MCP tool, as the token's holder.
    let url = format!("http://{addr}/mcp");
    let auth = format!("Authorization: {alice}");
    let call = |args: &[&str]| {
        let mut all: Vec<String> = [
            url.as_str(),
            "--transport",
            "http",
            "--header",
            auth.as_str(),
            "--method",
            "tools/call",
            "--tool-name",
            "run_steer",
            "--tool-arg",
        ]
        .map(str::to_owned)
        .to_vec();
        all.extend(args.iter().map(|a| (*a).to_owned()));
        inspector_output(&all)
    };
    let by_mcp = call(&[&format!("run_id={run}"), "message=M-MCP"]);
    assert!(by_mcp.status.success(), "{}{}", text(&by_mcp.stdout), text(&by_mcp.stderr));
    let by_mcp: Value = serde_json::from_slice(&by_mcp.stdout).unwrap();
    assert_eq!(by_mcp["structuredContent"]["id"], "steer-2", "{by_mcp}");
    assert_eq!(by_mcp["structuredContent"]["by"], "alice", "{by_mcp}");

    // Approved: the steerable level's one call takes both, in order.
    let approved =
        http(addr, "POST", &format!("/runs/{run}/approve"), &[("Authorization", &alice)], None);
    assert_eq!(approved.status, 200, "{approved:?}");
    wait_for(addr, &alice, &run, "completed", |v| v["status"] == "completed");
    let events = baton_in(&dir, &db).args(["events", &run, "--json"]).output().unwrap();
    let log: Vec<Value> =
        text(&events.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let delivered: Vec<&Value> = log.iter().filter(|e| e["kind"] == "steering_delivered").collect();
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0]["data"]["ids"], json!(["steer-1", "steer-2"]));
    let prompt = log.iter().find(|e| e["kind"] == "prompt_sent").unwrap()["data"]["prompt"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(prompt.find("M-HTTP").unwrap() < prompt.find("M-MCP").unwrap(), "{prompt}");

    // Once the run has ended: 409 over HTTP, an error result over MCP; nothing written.
    let late = steer(&alice, &json!({"message": "M-LATE"}));
    assert_eq!(late.status, 409, "{late:?}");
    assert!(late.body.contains("has ended"), "{}", late.body);
    let late_mcp = call(&[&format!("run_id={run}"), "message=M-LATE"]);
    assert!(!late_mcp.status.success());
    assert!(text(&late_mcp.stdout).contains("isError"), "{}", text(&late_mcp.stdout));
    let after = baton_in(&dir, &db).args(["events", &run, "--json"]).output().unwrap();
    assert_eq!(text(&after.stdout).lines().count(), log.len());
    drop(served);
    let _ = std::fs::remove_dir_all(dir);
}
