//! Waves in the kernel: a sliding window of worker child runs under `max_parallel`,
//! decisions from outcomes, timeouts, and plans refused before any worker starts.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use baton_engine::event::{EventData, WaveDecision, WorkerOutcome};
use baton_engine::job::{Jobs, Selection, Start};
use baton_engine::store::{EventStore, MemoryStore};
use baton_engine::wave_drive::WaveSettings;
use baton_engine::{Engine, Outcome, Status};
use baton_scenario::Registry;
use chrono::{DateTime, Utc};

use crate::script;

/// `worker` answers in one prompt level; `waver` runs a wave of `worker`s from its input
/// and ends on its decision.
fn registry(wave_extra: &str) -> Arc<Registry> {
    registry_with(&format!("max_parallel: 2{wave_extra}"))
}

/// [`registry`] with these settings beside the wave's worker.
fn registry_with(settings: &str) -> Arc<Registry> {
    let dir = std::env::temp_dir().join(format!(
        "baton-engine-waves-{}-{}",
        std::process::id(),
        uuid::Uuid::now_v7()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("worker.yaml"),
        "id: worker\nversion: 1\nlevels:\n  - id: work\n    kind: prompt\n    prompt: {inline: \"Work on {{ input }}\"}\n    terminal: true\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("waver.yaml"),
        format!(
            "id: waver\nversion: 1\nlevels:\n  - id: build\n    kind: wave\n    wave: {{worker: worker, {settings}}}\nedges:\n  - {{from: build, to: __end__, when: \"wave.decision == 'complete'\"}}\n  - {{from: build, to: __fail__}}\n"
        ),
    )
    .unwrap();
    let loaded = Registry::load(&[&dir]).unwrap_or_else(|e| panic!("{}", e.diagnostics.render()));
    let _ = std::fs::remove_dir_all(&dir);
    Arc::new(loaded.registry)
}

const REPORT: &str =
    "done\n```worker_report\n{\"outcome\": \"completed\", \"summary\": \"ok\"}\n```\n";

fn script_with(cases: &str) -> String {
    let cases = if cases.is_empty() { " []\n" } else { cases };
    format!(
        "scenarios:\n  worker:\n    levels:\n      work: [{{text: {REPORT:?}, delay_ms: 150, cost_usd: 0.01}}]\n    cases:{cases}"
    )
}

fn case(when: &str, outcome: &str, delay_ms: u64) -> String {
    let text = format!(
        "```worker_report\n{{\"outcome\": \"{outcome}\", \"summary\": \"{when} {outcome}\", \"blockers\": [\"b\"]}}\n```\n"
    );
    format!(
        "\n      - when: {when:?}\n        levels:\n          work: [{{text: {text:?}, delay_ms: {delay_ms}}}]\n"
    )
}

fn engine(registry: &Arc<Registry>, script_yaml: &str, waves: WaveSettings) -> Engine {
    let jobs = Jobs::new(
        Arc::clone(registry),
        Selection::default(),
        PathBuf::from("."),
        Duration::from_secs(5),
    )
    .with_waves(waves);
    crate::engine_with_jobs(
        Arc::new(MemoryStore::new()) as Arc<dyn EventStore>,
        script(script_yaml),
        Some(Arc::new(jobs)),
    )
}

fn tasks(n: usize) -> String {
    let tasks: Vec<String> =
        (1..=n).map(|i| format!("{{\"id\": \"t{i}\", \"title\": \"task number {i}\"}}")).collect();
    format!("{{\"tasks\": [{}], \"context\": \"Goal: a todo API\"}}", tasks.join(", "))
}

async fn run_wave(e: &Engine, registry: &Arc<Registry>, input: String) -> (String, Outcome) {
    let run = Engine::new_run_id();
    let start = Start { input, ..Start::default() };
    let outcome = e.run_job(&run, registry.get("waver").unwrap(), start).await.unwrap();
    (run, outcome)
}

/// Each worker's span, from its first event to its last.
async fn spans(e: &Engine, run: &str) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
    let st = e.state(run).await.unwrap();
    let mut out = Vec::new();
    for child in &st.children {
        let log = e.store.load(&child.started.child_run_id, 0).await.unwrap();
        out.push((log.first().unwrap().at, log.last().unwrap().at));
    }
    out
}

/// The most spans open at one moment.
fn most_at_once(spans: &[(DateTime<Utc>, DateTime<Utc>)]) -> usize {
    spans
        .iter()
        .map(|(s, _)| spans.iter().filter(|(a, b)| a <= s && s < b).count())
        .max()
        .unwrap_or(0)
}

#[tokio::test]
async fn six_assignments_run_at_most_two_at_once_and_complete() {
    let r = registry("");
    let e = engine(&r, &script_with(""), WaveSettings::default());
    let (run, outcome) = run_wave(&e, &r, tasks(6)).await;
    assert_eq!(outcome, Outcome::Finished(Status::Completed));
    let st = e.state(&run).await.unwrap();
    let wave = &st.waves["build"];
    assert_eq!(wave.counts().completed, 6);
    assert_eq!(wave.closed.as_ref().unwrap().decision, WaveDecision::Complete);
    let s = spans(&e, &run).await;
    assert_eq!(s.len(), 6, "each assignment ran once");
    assert_eq!(most_at_once(&s), 2, "two workers overlapped, never three: {s:?}");
    // Each worker got its assignment and the shared context.
    let child = e.state(&st.children[0].started.child_run_id).await.unwrap();
    assert!(
        child.session.input.contains("assign-001")
            && child.session.input.contains("Goal: a todo API")
    );
    assert_eq!(child.session.metadata["wave_task_id"], "t1");
    assert!((st.tree_totals().cost_usd - 0.06).abs() < 1e-9);
    // The parent's commits per assignment: a dispatch and a settlement at most.
    let log = e.store.load(&run, 0).await.unwrap();
    let settled = log.iter().filter(|ev| matches!(ev.data, EventData::ChildRunSettled(_))).count();
    assert_eq!(settled, 6);
}

#[tokio::test]
async fn a_failure_stops_admissions_and_the_wave_replans() {
    let r = registry("");
    let e = engine(&r, &script_with(&case("assign-003", "failed", 10)), WaveSettings::default());
    let (run, outcome) = run_wave(&e, &r, tasks(6)).await;
    assert_eq!(outcome, Outcome::Finished(Status::Failed));
    let st = e.state(&run).await.unwrap();
    let wave = &st.waves["build"];
    assert_eq!(wave.closed.as_ref().unwrap().decision, WaveDecision::Replan);
    let c = wave.counts();
    assert_eq!(c.failed, 1);
    assert!(c.planned >= 1, "nothing was admitted after the failure: {c:?}");
    assert_eq!(st.children.len() as u32, c.assignments - c.planned);
    assert!(st.children.iter().all(|ch| ch.settled.is_some()), "every admitted worker settled");
}

#[tokio::test]
async fn a_blocked_report_escalates() {
    let r = registry("");
    let e = engine(&r, &script_with(&case("assign-002", "blocked", 10)), WaveSettings::default());
    let (run, _) = run_wave(&e, &r, tasks(3)).await;
    let st = e.state(&run).await.unwrap();
    let log = e.store.load(&run, 0).await.unwrap();
    let wave = st.waves.get("build").unwrap_or_else(|| panic!("{:?}", crate::kinds(&log)));
    assert_eq!(wave.closed.as_ref().unwrap().decision, WaveDecision::Escalate);
    let blocked = wave.assignment("assign-002").unwrap().settled.clone().unwrap();
    assert_eq!(blocked.outcome, WorkerOutcome::Blocked);
    assert_eq!(blocked.blockers, ["b"]);
}

#[tokio::test]
async fn a_worker_past_its_timeout_is_cancelled_and_its_assignment_fails() {
    let r = registry(", timeout_s: 0.3");
    let e =
        engine(&r, &script_with(&case("assign-001", "completed", 5_000)), WaveSettings::default());
    let started = std::time::Instant::now();
    let (run, _) = run_wave(&e, &r, tasks(2)).await;
    assert!(started.elapsed() < Duration::from_secs(4), "the timeout cut the slow worker");
    let st = e.state(&run).await.unwrap();
    let wave = &st.waves["build"];
    let a = wave.assignment("assign-001").unwrap().settled.clone().unwrap();
    assert_eq!((a.outcome, a.reason.as_deref()), (WorkerOutcome::Failed, Some("timeout")));
    assert_eq!(wave.closed.as_ref().unwrap().decision, WaveDecision::Replan);
    let child = e.state(&st.children[0].started.child_run_id).await.unwrap();
    assert_eq!(child.status, Status::Cancelled);
}

#[tokio::test]
async fn a_plan_that_does_not_read_fails_before_any_worker() {
    let r = registry("");
    let e = engine(&r, &script_with(""), WaveSettings::default());
    for (input, says) in [
        ("{\"tasks\": [], \"context\": \"c\"}".to_owned(), "at least one assignment"),
        (
            "{\"tasks\": [{\"id\": \"a\", \"title\": \"x\"}], \"max_parallel\": 11}".to_owned(),
            "1 through 10",
        ),
        ("{\"tasks\": [{\"id\": \"a\"}]}".to_owned(), "/tasks/0/title"),
        (
            "{\"tasks\": [{\"id\": \"a\", \"title\": \"x\"}, {\"id\": \"a\", \"title\": \"y\"}]}"
                .to_owned(),
            "given twice",
        ),
        ("not json".to_owned(), "not JSON"),
        (tasks(51), "max_assignments"),
    ] {
        let (run, outcome) = run_wave(&e, &r, input).await;
        assert_eq!(outcome, Outcome::Finished(Status::Failed));
        let st = e.state(&run).await.unwrap();
        assert!(st.children.is_empty());
        let reason = st.finished.unwrap().aborted_reason.unwrap();
        assert!(reason.contains(says), "{reason}");
    }
}

#[tokio::test]
async fn a_drive_override_of_max_parallel_is_not_stored() {
    let r = registry("");
    let settings = WaveSettings { drive_max_parallel: Some(1), ..WaveSettings::default() };
    let e = engine(&r, &script_with(""), settings);
    let (run, outcome) = run_wave(&e, &r, tasks(3)).await;
    assert_eq!(outcome, Outcome::Finished(Status::Completed));
    assert_eq!(most_at_once(&spans(&e, &run).await), 1);
    let st = e.state(&run).await.unwrap();
    assert_eq!(st.waves["build"].plan.max_parallel, Some(2));
}

#[tokio::test]
async fn a_wave_plans_from_assignments_or_a_bare_list_with_the_defaults_of_3_at_once_and_600_s() {
    // No parallelism or timeout on the level, in the plan or in the configuration.
    let r = registry_with("max_assignments: 12");
    let r_bare = registry_with("dispatch: auto");
    for (registry, input) in [
        (
            &r,
            "{\"assignments\": [{\"id\": \"a\", \"title\": \"A\"}, {\"id\": \"b\", \"title\": \"B\"}]}",
        ),
        (&r_bare, "[{\"id\": \"a\", \"title\": \"A\"}, {\"id\": \"b\", \"title\": \"B\"}]"),
    ] {
        let e = engine(registry, &script_with(""), WaveSettings::default());
        let (run, outcome) = run_wave(&e, registry, input.to_owned()).await;
        assert_eq!(outcome, Outcome::Finished(Status::Completed), "{input}");
        let log = e.store.load(&run, 0).await.unwrap();
        let planned = log
            .iter()
            .find_map(|ev| match &ev.data {
                EventData::WavePlanned(p) => Some(p.clone()),
                _ => None,
            })
            .unwrap();
        let ids: Vec<&str> = planned.assignments.iter().map(|a| a.task_id.as_str()).collect();
        assert_eq!(ids, ["a", "b"], "{input}");
        assert_eq!(planned.max_parallel, Some(3), "the default when nothing sets one: {input}");
        assert_eq!(planned.timeout_ms, 600_000, "{input}");
    }
}
