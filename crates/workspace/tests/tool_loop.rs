//! Tool-loop levels on the kernel with a real workspace: how a loop ends (finish, an empty
//! turn, `max_iterations`, the budget), and tool errors going back to the model.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use baton_engine::clock::SystemClock;
use baton_engine::event::EventData;
use baton_engine::model::{ScriptedModel, ScriptedResponse, ScriptedToolCall};
use baton_engine::runner::Runtime;
use baton_engine::state::Status;
use baton_engine::store::MemoryStore;
use baton_engine::verifier::Verifiers;
use baton_engine::workspace::{
    ToolOutcome, Workspace, WorkspaceError, WorkspaceRequest, WorkspaceSetup, Workspaces,
};
use baton_engine::{Engine, Outcome};
use baton_scenario::{Registry, Scenario};
use baton_workspace::LocalWorkspaces;

fn scenario(dir: &Path, level_extra: &str, budget: &str) -> Arc<Scenario> {
    let scenarios = dir.join("scenarios");
    std::fs::create_dir_all(&scenarios).unwrap();
    std::fs::write(
        scenarios.join("s.yaml"),
        format!(
            "id: loop\nversion: 1\n{budget}\nlevels:\n  - id: work\n    kind: tool_loop\n    prompt: {{inline: \"Do the task: {{{{ input }}}}\"}}\n    terminal: true\n{level_extra}"
        ),
    )
    .unwrap();
    let loaded =
        Registry::load(&[&scenarios]).unwrap_or_else(|e| panic!("{}", e.diagnostics.render()));
    Arc::clone(loaded.registry.scenarios().next().unwrap())
}

async fn run(dir: &Path, scenario: &Arc<Scenario>, script: &str) -> (Engine, String, Outcome) {
    run_model(dir, scenario, ScriptedModel::parse(script, "script.yaml").unwrap()).await
}

async fn run_model(
    dir: &Path,
    scenario: &Arc<Scenario>,
    model: ScriptedModel,
) -> (Engine, String, Outcome) {
    let opener = Arc::new(LocalWorkspaces::new(dir.join("workspaces"), dir.join("snapshots")));
    run_opened(dir, scenario, model, opener).await
}

async fn run_opened(
    dir: &Path,
    scenario: &Arc<Scenario>,
    model: ScriptedModel,
    opener: Arc<dyn Workspaces>,
) -> (Engine, String, Outcome) {
    let engine = Engine::new(
        Arc::new(MemoryStore::new()),
        Arc::new(Runtime {
            jobs: None,
            model: Arc::new(model),
            verifiers: Verifiers::builtin(),
            workspace: dir.to_path_buf(),
            workspaces: Some(WorkspaceSetup { opener, dir: None, branch: None }),
            catalog: Arc::new(serde_json::Value::Array(Vec::new())),
            redactor: std::sync::Arc::new(baton_engine::redact::Verbatim),
            runner: std::sync::Arc::new(baton_runners::Runners),
            tools: None,
        }),
        Arc::new(SystemClock),
    );
    let run_id = Engine::new_run_id();
    let outcome =
        engine.run(&run_id, scenario, "task", serde_json::Map::new(), None).await.unwrap();
    (engine, run_id, outcome)
}

async fn kinds(engine: &Engine, run_id: &str) -> Vec<EventData> {
    engine.store.load(run_id, 0).await.unwrap().into_iter().map(|e| e.data).collect()
}

#[tokio::test]
async fn a_loop_that_never_finishes_stops_at_max_iterations() {
    let dir = tempfile::tempdir().unwrap();
    let s = scenario(dir.path(), "    max_iterations: 3", "");
    let script = "levels:\n  work:\n    - tool_calls: [{name: list_dir}]\n";
    let (engine, run_id, outcome) = run(dir.path(), &s, script).await;
    assert_eq!(outcome, Outcome::Finished(Status::Completed));
    let events = kinds(&engine, &run_id).await;
    let calls = events.iter().filter(|e| matches!(e, EventData::ModelResponse(_))).count();
    assert_eq!(calls, 3);
    assert!(
        events.iter().any(
            |e| matches!(e, EventData::Warning(w) if w.message.contains("max_iterations (3)"))
        )
    );
    let state = engine.state(&run_id).await.unwrap();
    assert!(state.session.final_output.unwrap().starts_with("stopped after 3 turns"));
}

#[tokio::test]
async fn a_turn_without_tool_calls_ends_the_loop_with_its_text() {
    let dir = tempfile::tempdir().unwrap();
    let s = scenario(dir.path(), "", "");
    let (engine, run_id, outcome) =
        run(dir.path(), &s, "levels:\n  work:\n    - text: All done.\n").await;
    assert_eq!(outcome, Outcome::Finished(Status::Completed));
    assert_eq!(
        engine.state(&run_id).await.unwrap().session.final_output.as_deref(),
        Some("All done.")
    );
}

#[tokio::test]
async fn the_budget_stops_a_loop_between_turns() {
    let dir = tempfile::tempdir().unwrap();
    let s = scenario(dir.path(), "", "budget: {max_tokens: 100}");
    let script = r#"levels:
  work:
    - tool_calls: [{name: write_file, arguments: {path: half.txt, content: "x"}}]
      usage: {input_tokens: 50, output_tokens: 10}
    - tool_calls: [{name: list_dir}]
      usage: {input_tokens: 50, output_tokens: 10}
"#;
    let (engine, run_id, outcome) = run(dir.path(), &s, script).await;
    assert_eq!(outcome, Outcome::Finished(Status::Aborted));
    let workspace = dir.path().join("workspaces").join(&run_id);
    assert!(!workspace.join("half.txt").exists(), "an attempt cut short keeps none of its edits");
    let events = kinds(&engine, &run_id).await;
    let calls = events.iter().filter(|e| matches!(e, EventData::ModelResponse(_))).count();
    assert_eq!(calls, 2, "the second turn crossed the cap; no third call");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, EventData::BudgetExceeded(b) if b.limit_kind == "tokens"))
    );
}

#[tokio::test]
async fn tool_errors_go_back_to_the_model_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let s = scenario(dir.path(), "", "");
    let script = r#"levels:
  work:
    - tool_calls:
        - {name: format_disk, arguments: {}}
        - {name: read_file, arguments: {path: 7}}
        - {name: edit_file, arguments: {path: missing.txt, old_string: a, new_string: b}}
        - {name: finish, arguments: {}}
    - tool_calls:
        - {name: write_file, arguments: {path: notes/a.txt, content: "one\n"}}
        - {name: finish, arguments: {summary: wrote notes/a.txt}}
"#;
    let (engine, run_id, outcome) = run(dir.path(), &s, script).await;
    assert_eq!(outcome, Outcome::Finished(Status::Completed));
    let events = kinds(&engine, &run_id).await;
    let results: Vec<(String, bool)> = events
        .iter()
        .filter_map(|e| match e {
            EventData::ToolResult(r) => Some((r.content.clone(), r.is_error)),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 6, "{results:?}");
    assert!(results[..4].iter().all(|(_, error)| *error), "{results:?}");
    assert!(results[0].0.contains("there is no tool `format_disk`"), "{results:?}");
    assert!(results[3].0.contains("finish needs a string argument `summary`"), "{results:?}");
    assert!(!results[4].1 && !results[5].1, "{results:?}");
    let state = engine.state(&run_id).await.unwrap();
    assert_eq!(state.session.final_output.as_deref(), Some("wrote notes/a.txt"));
    assert_eq!(state.levels["work"].touched_paths, ["notes/a.txt"]);
    let workspace = dir.path().join("workspaces").join(&run_id);
    assert_eq!(std::fs::read_to_string(workspace.join("notes/a.txt")).unwrap(), "one\n");
}

#[tokio::test]
async fn a_model_failure_mid_loop_leaves_no_half_applied_edits() {
    let dir = tempfile::tempdir().unwrap();
    let s = scenario(dir.path(), "", "");
    let script = r#"levels:
  work:
    - tool_calls: [{name: write_file, arguments: {path: half.txt, content: "x"}}]
    - error: the provider went away
"#;
    let (engine, run_id, outcome) = run(dir.path(), &s, script).await;
    assert_eq!(outcome, Outcome::Finished(Status::Failed));
    let state = engine.state(&run_id).await.unwrap();
    assert!(state.levels["work"].error.as_deref().unwrap().contains("the provider went away"));
    let workspace = dir.path().join("workspaces").join(&run_id);
    assert!(!workspace.join("half.txt").exists());
}

fn turn(calls: Vec<(&str, serde_json::Value)>) -> ScriptedResponse {
    ScriptedResponse {
        tool_calls: calls
            .into_iter()
            .map(|(name, arguments)| ScriptedToolCall {
                id: None,
                name: name.to_owned(),
                arguments: Some(arguments),
            })
            .collect(),
        ..ScriptedResponse::default()
    }
}

fn logged_bytes(events: &[EventData]) -> usize {
    events.iter().map(|e| serde_json::to_string(e).unwrap().len()).sum()
}

#[tokio::test]
async fn an_oversized_argument_is_refused_and_not_logged() {
    let dir = tempfile::tempdir().unwrap();
    let s = scenario(dir.path(), "", "");
    let huge = "x".repeat(15 * 1024 * 1024);
    let fine = "y".repeat(100 * 1024);
    let model = ScriptedModel::default().with_level(
        "work",
        vec![
            turn(vec![
                ("write_file", serde_json::json!({"path": "huge.txt", "content": huge})),
                ("write_file", serde_json::json!({"path": "fine.txt", "content": fine})),
            ]),
            turn(vec![("finish", serde_json::json!({"summary": "done"}))]),
        ],
    );
    let (engine, run_id, outcome) = run_model(dir.path(), &s, model).await;
    assert_eq!(outcome, Outcome::Finished(Status::Completed));
    let events = kinds(&engine, &run_id).await;
    let refusal = events
        .iter()
        .find_map(|e| match e {
            EventData::ToolResult(r) if r.is_error => Some(r.content.clone()),
            _ => None,
        })
        .expect("the oversized call is refused");
    assert!(refusal.contains("15728672 bytes") && refusal.contains("at most"), "{refusal}");
    // Canary: the huge file was not written; control: the ordinary one was.
    let root = dir.path().join("workspaces").join(&run_id);
    assert!(!root.join("huge.txt").exists());
    assert_eq!(std::fs::read(root.join("fine.txt")).unwrap().len(), 100 * 1024);
    // The whole run's log holds the ordinary call (twice: response and call), not 31 MB.
    let bytes = logged_bytes(&events);
    assert!(bytes < 400 * 1024, "the run logged {bytes} bytes");
}

#[tokio::test]
async fn many_calls_in_one_turn_are_capped_together() {
    let dir = tempfile::tempdir().unwrap();
    let s = scenario(dir.path(), "", "");
    let part = "z".repeat(900 * 1024);
    let calls = (0..8)
        .map(|n| ("write_file", serde_json::json!({"path": format!("p{n}.txt"), "content": part})))
        .collect();
    let model = ScriptedModel::default().with_level(
        "work",
        vec![turn(calls), turn(vec![("finish", serde_json::json!({"summary": "done"}))])],
    );
    let (engine, run_id, outcome) = run_model(dir.path(), &s, model).await;
    assert_eq!(outcome, Outcome::Finished(Status::Completed));
    let events = kinds(&engine, &run_id).await;
    let root = dir.path().join("workspaces").join(&run_id);
    let written = (0..8).filter(|n| root.join(format!("p{n}.txt")).exists()).count();
    assert_eq!(written, 4, "the turn's first 4 MiB of arguments run, the rest is refused");
    let bytes = logged_bytes(&events);
    assert!(bytes < 2 * 4 * 1024 * 1024 + 512 * 1024, "the turn logged {bytes} bytes");
}

#[tokio::test]
async fn edit_file_with_a_long_repetitive_needle_is_fast() {
    let dir = tempfile::tempdir().unwrap();
    let s = scenario(dir.path(), "", "");
    let content = "a".repeat(1_048_000);
    let needle = "a".repeat(1_000_000);
    let model = ScriptedModel::default().with_level(
        "work",
        vec![
            turn(vec![("write_file", serde_json::json!({"path": "big.txt", "content": content}))]),
            turn(vec![
                (
                    "edit_file",
                    serde_json::json!({"path": "big.txt", "old_string": needle, "new_string": "b"}),
                ),
                ("write_file", serde_json::json!({"path": "small.txt", "content": "one two\n"})),
                (
                    "edit_file",
                    serde_json::json!({"path": "small.txt", "old_string": "two", "new_string": "2"}),
                ),
            ]),
            turn(vec![("finish", serde_json::json!({"summary": "done"}))]),
        ],
    );
    let started = std::time::Instant::now();
    let (engine, run_id, outcome) = run_model(dir.path(), &s, model).await;
    let took = started.elapsed();
    assert_eq!(outcome, Outcome::Finished(Status::Completed));
    assert!(took < std::time::Duration::from_secs(20), "the run took {took:?}");
    let events = kinds(&engine, &run_id).await;
    assert!(
        events.iter().any(|e| matches!(e, EventData::ToolResult(r)
            if r.is_error && r.content.contains("occurs 48001 times"))),
        "the repetitive needle is counted, not applied"
    );
    // Control: an ordinary edit in the same turn works.
    let root = dir.path().join("workspaces").join(&run_id);
    assert_eq!(std::fs::read_to_string(root.join("small.txt")).unwrap(), "one 2\n");
}

/// Workspaces whose `list_dir` takes three seconds and notes the thread it ran on.
#[derive(Debug)]
struct SlowWorkspaces {
    inner: LocalWorkspaces,
    threads: Arc<Mutex<Vec<ThreadId>>>,
}

#[derive(Debug)]
struct SlowWorkspace {
    inner: Arc<dyn Workspace>,
    threads: Arc<Mutex<Vec<ThreadId>>>,
}

impl Workspaces for SlowWorkspaces {
    fn open(&self, request: &WorkspaceRequest) -> Result<Arc<dyn Workspace>, WorkspaceError> {
        let inner = self.inner.open(request)?;
        Ok(Arc::new(SlowWorkspace { inner, threads: Arc::clone(&self.threads) }))
    }
}

impl Workspace for SlowWorkspace {
    fn root(&self) -> &Path {
        self.inner.root()
    }

    fn execute(
        &self,
        tool: &str,
        arguments: &serde_json::Value,
        touched: &mut BTreeSet<String>,
        max_touched: usize,
    ) -> ToolOutcome {
        if tool == "list_dir" {
            self.threads.lock().unwrap().push(std::thread::current().id());
            std::thread::sleep(std::time::Duration::from_secs(3));
        }
        self.inner.execute(tool, arguments, touched, max_touched)
    }

    fn snapshot(&self, message: &str) -> Result<String, WorkspaceError> {
        self.inner.snapshot(message)
    }

    fn restore(&self, snapshot: &str) -> Result<(), WorkspaceError> {
        self.inner.restore(snapshot)
    }

    fn branch(&self, name: &str, snapshot: &str) -> Result<(), WorkspaceError> {
        self.inner.branch(name, snapshot)
    }
}

// One runtime thread: a tool run on it would stop the heartbeats until it returned.
#[tokio::test(flavor = "current_thread")]
async fn a_long_tool_call_runs_off_the_async_thread_and_heartbeats_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let s = scenario(dir.path(), "", "");
    let threads = Arc::new(Mutex::new(Vec::new()));
    let opener = Arc::new(SlowWorkspaces {
        inner: LocalWorkspaces::new(dir.path().join("workspaces"), dir.path().join("snapshots")),
        threads: Arc::clone(&threads),
    });
    let model = ScriptedModel::default().with_level(
        "work",
        vec![
            turn(vec![("list_dir", serde_json::json!({}))]),
            turn(vec![("finish", serde_json::json!({"summary": "done"}))]),
        ],
    );
    let (engine, run_id, outcome) = run_opened(dir.path(), &s, model, opener).await;
    assert_eq!(outcome, Outcome::Finished(Status::Completed));
    let ran_on = threads.lock().unwrap().clone();
    assert_eq!(ran_on.len(), 1);
    assert_ne!(ran_on[0], std::thread::current().id(), "the tool ran on the async thread");
    let events = kinds(&engine, &run_id).await;
    let beats: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            EventData::Heartbeat(h) => Some(h.tool_calls),
            _ => None,
        })
        .collect();
    assert!(!beats.is_empty() && beats.iter().all(|&calls| calls == 1), "{beats:?}");
}

/// Workspaces whose snapshot repository gets an `index.lock` just before the first
/// restore, as if another git held the repository while the level started.
#[derive(Debug)]
struct LockedOnceWorkspaces {
    inner: LocalWorkspaces,
    planted: Arc<Mutex<bool>>,
}

#[derive(Debug)]
struct LockedOnceWorkspace {
    inner: Arc<dyn Workspace>,
    lock: std::path::PathBuf,
    planted: Arc<Mutex<bool>>,
}

impl Workspaces for LockedOnceWorkspaces {
    fn open(&self, request: &WorkspaceRequest) -> Result<Arc<dyn Workspace>, WorkspaceError> {
        let inner = self.inner.open(request)?;
        let key = baton_workspace::snapshot_key(inner.root());
        let lock = self.inner.snapshots().join(key).join("git/index.lock");
        Ok(Arc::new(LockedOnceWorkspace { inner, lock, planted: Arc::clone(&self.planted) }))
    }
}

impl Workspace for LockedOnceWorkspace {
    fn root(&self) -> &Path {
        self.inner.root()
    }

    fn execute(
        &self,
        tool: &str,
        arguments: &serde_json::Value,
        touched: &mut BTreeSet<String>,
        max_touched: usize,
    ) -> ToolOutcome {
        self.inner.execute(tool, arguments, touched, max_touched)
    }

    fn snapshot(&self, message: &str) -> Result<String, WorkspaceError> {
        self.inner.snapshot(message)
    }

    fn restore(&self, snapshot: &str) -> Result<(), WorkspaceError> {
        let mut planted = self.planted.lock().unwrap();
        if !*planted {
            *planted = true;
            std::fs::write(&self.lock, "").unwrap();
        }
        drop(planted);
        self.inner.restore(snapshot)
    }

    fn branch(&self, name: &str, snapshot: &str) -> Result<(), WorkspaceError> {
        self.inner.branch(name, snapshot)
    }
}

#[tokio::test]
async fn a_workspace_lock_held_by_another_git_leaves_the_run_resumable_not_failed() {
    let dir = tempfile::tempdir().unwrap();
    let s = scenario(dir.path(), "", "");
    let opener = Arc::new(LockedOnceWorkspaces {
        inner: LocalWorkspaces::new(dir.path().join("workspaces"), dir.path().join("snapshots")),
        planted: Arc::new(Mutex::new(false)),
    });
    let model = || {
        ScriptedModel::default().with_level(
            "work",
            vec![
                turn(vec![("write_file", serde_json::json!({"path": "a.txt", "content": "a\n"}))]),
                turn(vec![("finish", serde_json::json!({"summary": "done"}))]),
            ],
        )
    };
    let engine = Engine::new(
        Arc::new(MemoryStore::new()),
        Arc::new(Runtime {
            jobs: None,
            model: Arc::new(model()),
            verifiers: Verifiers::builtin(),
            workspace: dir.path().to_path_buf(),
            workspaces: Some(WorkspaceSetup { opener, dir: None, branch: None }),
            catalog: Arc::new(serde_json::Value::Array(Vec::new())),
            redactor: std::sync::Arc::new(baton_engine::redact::Verbatim),
            runner: std::sync::Arc::new(baton_runners::Runners),
            tools: None,
        }),
        Arc::new(SystemClock),
    );
    let run_id = Engine::new_run_id();
    // The level's first restore meets the lock: the driver stops, recording nothing of the
    // step but that the run was interrupted.
    let outcome = engine.run(&run_id, &s, "task", serde_json::Map::new(), None).await.unwrap();
    let baton_engine::Outcome::Interrupted(message) = outcome else { panic!("{outcome:?}") };
    assert!(message.contains("index.lock"), "{message}");
    let state = engine.state(&run_id).await.unwrap();
    assert_eq!(state.status, Status::Interrupted, "the run is not failed");
    assert_eq!(state.interrupted.as_ref().unwrap().cause, "workspace");
    let events = kinds(&engine, &run_id).await;
    assert!(!events.iter().any(|e| matches!(e, EventData::LevelFinished(_))), "{events:?}");
    // The next driver holds the workspace, finds the lock stale (no process uses the
    // repository), removes it, says so, and the run completes.
    let resumed = Engine::new(
        Arc::clone(&engine.store),
        Arc::new(Runtime {
            jobs: None,
            model: Arc::new(model()),
            verifiers: Verifiers::builtin(),
            workspace: dir.path().to_path_buf(),
            workspaces: Some(WorkspaceSetup {
                opener: Arc::new(LocalWorkspaces::new(
                    dir.path().join("workspaces"),
                    dir.path().join("snapshots"),
                )),
                dir: None,
                branch: None,
            }),
            catalog: Arc::new(serde_json::Value::Array(Vec::new())),
            redactor: std::sync::Arc::new(baton_engine::redact::Verbatim),
            runner: std::sync::Arc::new(baton_runners::Runners),
            tools: None,
        }),
        Arc::new(SystemClock),
    );
    assert_eq!(resumed.drive(&run_id, &s).await.unwrap(), Outcome::Finished(Status::Completed));
    let events = kinds(&resumed, &run_id).await;
    assert!(
        events.iter().any(|e| matches!(e, EventData::Warning(w)
            if w.message.contains("removed the stale lock") && w.message.contains("index.lock"))),
        "{events:?}"
    );
    let root = dir.path().join("workspaces").join(&run_id);
    assert_eq!(std::fs::read_to_string(root.join("a.txt")).unwrap(), "a\n");
}
