//! The `baton` binary on PostgreSQL (`--db postgres://…`), against the server this machine
//! runs, each test in a schema of its own: a job pauses and another process approves it,
//! its log the same as on SQLite; deciders racing from several processes decide once; a
//! server that is not there is named with what to check.

use std::path::{Path, PathBuf};

use baton_store::postgres::ScratchSchema;
use serde_json::Value;

use super::{baton_command, baton_db, text};

/// The server tests use: `BATON_TEST_POSTGRES`, else the machine's own.
fn base() -> String {
    std::env::var("BATON_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A schema of its own for one test, dropped with it.
fn scratch(label: &str) -> ScratchSchema {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(ScratchSchema::create(&base(), label)).unwrap()
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("baton-cli-pg-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `baton --db DB --data-dir DATA ARGS…` for a PostgreSQL `db`.
fn baton_pg(db: &str, data: &Path, args: &[&str]) -> std::process::Output {
    baton_command().arg("--db").arg(db).arg("--data-dir").arg(data).args(args).output().unwrap()
}

/// What a log says, times and ids aside: each event's kind, level and attempt.
fn shape(events_json: &str) -> Vec<(String, String, String)> {
    events_json
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|e| (e["kind"].to_string(), e["level_id"].to_string(), e["attempt"].to_string()))
        .collect()
}

fn run_id(stdout: &[u8]) -> String {
    text(stdout).lines().find_map(|l| l.strip_prefix("run ")).unwrap().to_owned()
}

const RELEASE_NOTES: [&str; 6] = [
    "run",
    "release_notes",
    "--script",
    "scenarios/scripts/release_notes.yaml",
    "--input",
    "PR 101: CSV export; PR 102: faster search; PR 103: login loop fixed",
];

#[test]
fn a_job_paused_on_postgres_is_approved_by_another_process_with_the_log_sqlite_keeps() {
    let schema = scratch("approve");
    let dir = temp("approve");
    let data = dir.join("data");
    let run = baton_pg(&schema.url, &data, &RELEASE_NOTES);
    assert_eq!(run.status.code(), Some(3), "{}{}", text(&run.stdout), text(&run.stderr));
    let id = run_id(&run.stdout);
    let approved =
        baton_pg(&schema.url, &data, &["approve", &id, "--by", "rm", "--comment", "ship it"]);
    assert_eq!(approved.status.code(), Some(0), "{}", text(&approved.stderr));
    let listed = text(&baton_pg(&schema.url, &data, &["runs"]).stdout);
    assert!(listed.contains(&id) && listed.contains("completed"), "{listed}");
    let verified = baton_pg(&schema.url, &data, &["verify"]);
    assert_eq!(verified.status.code(), Some(0), "{}", text(&verified.stderr));
    assert!(text(&verified.stdout).contains("ok: 1 runs intact"), "{}", text(&verified.stdout));
    let on_pg = text(&baton_pg(&schema.url, &data, &["events", &id, "--json"]).stdout);

    // The same job on SQLite writes the same log, event for event.
    let db = dir.join("runs.db");
    let run = baton_db(&db, &RELEASE_NOTES);
    assert_eq!(run.status.code(), Some(3), "{}", text(&run.stderr));
    let sqlite_id = run_id(&run.stdout);
    let approved = baton_db(&db, &["approve", &sqlite_id, "--by", "rm", "--comment", "ship it"]);
    assert_eq!(approved.status.code(), Some(0), "{}", text(&approved.stderr));
    let on_sqlite = text(&baton_db(&db, &["events", &sqlite_id, "--json"]).stdout);
    assert!(shape(&on_pg).len() > 20, "{on_pg}");
    assert_eq!(shape(&on_pg), shape(&on_sqlite), "the two stores keep the same log");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn racing_deciders_on_postgres_decide_once() {
    let schema = scratch("race");
    let dir = temp("race");
    super::deciders_race(Path::new(&schema.url), &dir, 8);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_postgres_server_that_is_not_there_is_named_with_what_to_check() {
    let dir = temp("absent");
    let out = baton_pg("postgres://nobody:hunter2@127.0.0.1:1/none", &dir, &["runs"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("127.0.0.1:1") && err.contains("check that the server runs"), "{err}");
    assert!(!err.contains("hunter2"), "the password is never shown: {err}");
    let _ = std::fs::remove_dir_all(dir);
}
