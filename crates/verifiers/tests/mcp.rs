//! The `mcp` verifier against real MCP servers: server-everything and server-filesystem
//! (TypeScript, npm) and mcp-server-time (Python, PyPI), installed by `scripts/test`.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use baton_engine::cancel::CancelToken;
use baton_engine::event::VerifierFinished;
use baton_engine::verifier::VerifyContext;
use baton_scenario::model::{OnFail, Uses, VerifierSpec};
use baton_verifiers::Confined;
use baton_verifiers::mcp::McpVerifier;
use serde_json::{Value, json};

fn peer(path: &str) -> String {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(path);
    assert!(full.exists(), "{} is missing: run scripts/test, which installs it", full.display());
    full.display().to_string()
}

fn everything() -> Vec<String> {
    vec![peer(".peers/npm/node_modules/.bin/mcp-server-everything"), "stdio".to_owned()]
}

fn spec(server: &[String], tool: &str, arguments: Value, extra: &Value) -> VerifierSpec {
    let mut params = json!({"server": server, "tool": tool});
    params["arguments"] = arguments;
    for (k, v) in extra.as_object().unwrap() {
        params[k] = v.clone();
    }
    VerifierSpec {
        name: "mcp".to_owned(),
        uses: Uses::Mcp,
        params: params.as_object().unwrap().clone(),
        weight: 1.0,
        on_fail: OnFail::Fail,
        max_retries: 0,
        timeout_s: Some(30.0),
        rubric: None,
        schema: None,
        config_text: None,
    }
}

fn ctx(workspace: PathBuf, input: &str) -> VerifyContext {
    VerifyContext {
        workspace,
        input: input.to_owned(),
        output: String::new(),
        parsed: None,
        scratchpad: serde_json::Map::new(),
    }
}

async fn verify(v: &McpVerifier, spec: &VerifierSpec, ctx: &VerifyContext) -> VerifierFinished {
    v.verify(spec, ctx, &baton_jail::Jail::off(), &CancelToken::new()).await
}

fn running(marker: &str) -> bool {
    std::process::Command::new("pgrep")
        .args(["-f", marker])
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false)
}

#[tokio::test]
async fn a_condition_on_structured_content_decides_the_outcome() {
    let v = McpVerifier::default();
    let dir = tempfile::tempdir().unwrap();
    let c = ctx(dir.path().to_path_buf(), "Chicago");
    let args = json!({"location": "{{ input }}"});
    let ok = spec(
        &everything(),
        "get-structured-content",
        args.clone(),
        &json!({"condition": "result.humidity >= 0 && result.conditions != ''"}),
    );
    let out = verify(&v, &ok, &c).await;
    assert!(out.passed, "{out:?}");
    assert!(out.details["structured"]["temperature"].is_number(), "{out:?}");
    // server-everything announces a tools/list_changed before it answers initialize.
    assert!(out.details["notifications"].as_u64().unwrap() >= 1, "{out:?}");
    let hot = spec(
        &everything(),
        "get-structured-content",
        args,
        &json!({"condition": "result.temperature > 1000"}),
    );
    let out = verify(&v, &hot, &c).await;
    assert!(!out.passed);
    assert!(out.reasons[0].contains("does not hold (read result.temperature = "), "{out:?}");
}

#[tokio::test]
async fn both_error_styles_fail_the_check() {
    let v = McpVerifier::default();
    let dir = tempfile::tempdir().unwrap();
    let c = ctx(dir.path().to_path_buf(), "");
    // TypeScript servers answer an unknown tool with a result that is an error...
    let out = verify(&v, &spec(&everything(), "no-such-tool", json!({}), &json!({})), &c).await;
    assert!(!out.passed && out.score == Some(0.0), "{out:?}");
    assert!(out.reasons[0].contains("`no-such-tool` reported an error"), "{out:?}");
    // ...Python ones with a JSON-RPC error.
    let time = vec![peer(".peers/venv/bin/mcp-server-time")];
    let out = verify(&v, &spec(&time, "no-such-tool", json!({}), &json!({})), &c).await;
    assert!(!out.passed, "{out:?}");
    assert!(out.reasons[0].contains("JSON-RPC error -32602"), "{out:?}");
    let ok = spec(
        &time,
        "get_current_time",
        json!({"timezone": "Europe/Paris"}),
        &json!({"condition": "result.timezone == 'Europe/Paris'"}),
    );
    let out = verify(&v, &ok, &c).await;
    assert!(out.passed, "{out:?}");
}

#[tokio::test]
async fn the_filesystem_server_reads_the_workspace_through_templated_arguments() {
    let v = McpVerifier::default();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README.md"), "# hello\n").unwrap();
    let c = ctx(dir.path().to_path_buf(), "");
    let server = vec![
        peer(".peers/npm/node_modules/.bin/mcp-server-filesystem"),
        dir.path().display().to_string(),
    ];
    let read =
        spec(&server, "read_text_file", json!({"path": "{{ workspace }}/README.md"}), &json!({}));
    let out = verify(&v, &read, &c).await;
    assert!(out.passed, "{out:?}");
    assert_eq!(out.details["content"], "# hello\n");
    let missing =
        spec(&server, "read_text_file", json!({"path": "{{ workspace }}/missing.md"}), &json!({}));
    let out = verify(&v, &missing, &c).await;
    assert!(!out.passed && out.reasons[0].contains("ENOENT"), "{out:?}");
    let bad = spec(&server, "read_text_file", json!({"path": "{{ nowhere }}"}), &json!({}));
    let out = verify(&v, &bad, &c).await;
    assert!(!out.passed && out.reasons[0].contains("cannot render argument"), "{out:?}");
}

#[tokio::test]
async fn the_server_gets_a_scrubbed_environment_plus_the_verifiers_own() {
    let v = McpVerifier::default();
    let dir = tempfile::tempdir().unwrap();
    let c = ctx(dir.path().to_path_buf(), "");
    let s = spec(&everything(), "get-env", json!({}), &json!({"env": {"BATON_MARKER": "present"}}));
    let out = verify(&v, &s, &c).await;
    assert!(out.passed, "{out:?}");
    let content = out.details["content"].as_str().unwrap();
    assert!(content.contains("BATON_MARKER"), "{content}");
    // The test process runs with cargo's variables; the server must not see them.
    assert!(!content.contains("CARGO_MANIFEST_DIR"), "{content}");
}

#[tokio::test]
async fn a_reused_server_stays_up_until_the_verifier_goes() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().display().to_string();
    let server = vec![peer(".peers/npm/node_modules/.bin/mcp-server-filesystem"), marker.clone()];
    let c = ctx(dir.path().to_path_buf(), "");
    let once = spec(&server, "list_allowed_directories", json!({}), &json!({}));
    let v = McpVerifier::default();
    assert!(verify(&v, &once, &c).await.passed);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!running(&marker), "a server that is not reused is stopped after its call");
    let reused = spec(&server, "list_allowed_directories", json!({}), &json!({"reuse": true}));
    assert!(verify(&v, &reused, &c).await.passed);
    assert!(running(&marker));
    assert!(verify(&v, &reused, &c).await.passed);
    drop(v);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!running(&marker), "the reused server stops with its verifier");
}

#[tokio::test]
async fn a_server_that_never_answers_is_killed_at_the_timeout() {
    let v = McpVerifier::default();
    let dir = tempfile::tempdir().unwrap();
    let marker = format!("sleep 5{}.25", std::process::id() % 1000);
    let server = vec!["sh".to_owned(), "-c".to_owned(), format!("({marker} &); {marker}")];
    let mut s = spec(&server, "anything", json!({}), &json!({}));
    s.timeout_s = Some(1.0);
    let t = Instant::now();
    let out = verify(&v, &s, &ctx(dir.path().to_path_buf(), "")).await;
    assert!(!out.passed && out.reasons[0].contains("did not answer within 1 s"), "{out:?}");
    assert!(t.elapsed() < Duration::from_secs(5));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!running(&marker), "the server and what it started were killed");
}

#[tokio::test]
async fn a_server_that_exits_says_so_with_its_stderr() {
    let v = McpVerifier::default();
    let dir = tempfile::tempdir().unwrap();
    let server = vec!["sh".to_owned(), "-c".to_owned(), "echo 'no config' >&2; exit 3".to_owned()];
    let out =
        verify(&v, &spec(&server, "x", json!({}), &json!({})), &ctx(dir.path().to_path_buf(), ""))
            .await;
    assert!(!out.passed);
    assert!(
        out.reasons[0].contains("exited (exit status: 3) before")
            && out.reasons[0].contains("no config"),
        "{out:?}"
    );
}
