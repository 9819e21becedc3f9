//! Jobs in the kernel: selection, chains as child runs, one driver for a whole tree, and
//! settlement exactly once.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use baton_engine::event::{Event, EventData};
use baton_engine::job::{self, JobRequest, Jobs, Selection, Start};
use baton_engine::model::BoxFuture;
use baton_engine::store::{self, EventStore, MemoryStore, RunRecord};
use baton_engine::{Engine, Outcome, Status};
use baton_scenario::Registry;
use chrono::{DateTime, Utc};

use crate::script;

/// A registry of three scenarios: `ask` names a route in its JSON answer, `relay` too,
/// `answer` answers plainly and claims route `qa`.
fn registry() -> Arc<Registry> {
    let dir = std::env::temp_dir().join(format!(
        "baton-engine-trees-{}-{}",
        std::process::id(),
        uuid::Uuid::now_v7()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let routing = |id: &str, route: &str| {
        format!(
            "id: {id}\nversion: 1\nintent_routes: [{route}]\nexamples: [\"{id} something\"]\nlevels:\n  - id: route\n    kind: prompt\n    prompt: {{inline: \"{id} {{{{ input }}}}\"}}\n    response: json\n    terminal: true\n"
        )
    };
    std::fs::write(dir.join("ask.yaml"), routing("ask", "asking")).unwrap();
    std::fs::write(dir.join("relay.yaml"), routing("relay", "relaying")).unwrap();
    std::fs::write(
        dir.join("answer.yaml"),
        "id: answer\nversion: 1\nintent_routes: [qa]\nlevels:\n  - id: say\n    kind: prompt\n    prompt: {inline: \"Say {{ input }}\"}\n    terminal: true\n",
    )
    .unwrap();
    let loaded = Registry::load(&[&dir]).unwrap_or_else(|e| panic!("{}", e.diagnostics.render()));
    let _ = std::fs::remove_dir_all(&dir);
    Arc::new(loaded.registry)
}

fn selection() -> Selection {
    Selection {
        default: "answer".to_owned(),
        fallback: "answer".to_owned(),
        classifier: "ask".to_owned(),
        classify_kinds: vec!["task".to_owned()],
    }
}

fn engine_with_jobs(store: Arc<dyn EventStore>, script_yaml: &str) -> Engine {
    let jobs = Jobs::new(registry(), selection(), PathBuf::from("."), Duration::from_secs(5));
    crate::engine_with_jobs(store, script(script_yaml), Some(Arc::new(jobs)))
}

const CHAIN: &str = "scenarios:\n  ask:\n    levels:\n      route: [{text: '{\"chosen_intent_route\": \"relaying\"}'}]\n  relay:\n    levels:\n      route: [{text: '{\"chosen_intent_route\": \"qa\"}'}]\n  answer:\n    levels:\n      say: [{text: 'the answer', cost_usd: 0.25}]\n";

#[test]
fn selection_follows_pin_intent_kind_and_default_in_that_order() {
    let r = registry();
    let s = selection();
    let pick = |pin: Option<&str>, intent: Option<&str>, kind: Option<&str>, strict: bool| {
        let job = JobRequest {
            pin: pin.map(str::to_owned),
            intent: intent.map(str::to_owned),
            kind: kind.map(str::to_owned),
        };
        job::select(&r, &s, &job, strict).map(|(sc, sel)| (sc.id.clone(), sel.how, sel.warning))
    };
    assert_eq!(pick(Some("relay"), Some("qa"), Some("task"), true).unwrap().0, "relay");
    assert_eq!(pick(None, Some("QA"), Some("task"), true).unwrap().1, "intent");
    assert_eq!(pick(None, None, Some("TASK"), true).unwrap().0, "ask");
    assert_eq!(pick(None, None, Some("question"), true).unwrap().1, "default");
    let (id, how, warning) = pick(None, Some("nope"), None, true).unwrap();
    assert_eq!((id.as_str(), how.as_str()), ("answer", "default"));
    assert!(warning.unwrap().contains("no scenario serves intent route `nope`"));
    assert!(pick(Some("nope"), None, None, true).unwrap_err().contains("no scenario `nope`"));
    // A job from an API falls back instead, and says so.
    let (id, _, warning) = pick(Some("nope"), None, None, false).unwrap();
    assert_eq!(id, "answer");
    assert!(warning.is_some());
}

#[test]
fn a_chain_target_is_an_id_a_route_or_the_fallback_never_the_classifier() {
    let r = registry();
    let s = selection();
    let target = |route: &str| {
        let (sc, warning) = job::chain_target(&r, &s, route).unwrap();
        (sc.id.clone(), warning.is_some())
    };
    assert_eq!(target("relay"), ("relay".to_owned(), false));
    assert_eq!(target("Relaying"), ("relay".to_owned(), false));
    assert_eq!(target("astrology"), ("answer".to_owned(), true));
    assert_eq!(target(""), ("answer".to_owned(), true));
    assert_eq!(target("ask"), ("answer".to_owned(), true));
    assert_eq!(job::child_run_id("p", "chain"), job::child_run_id("p", "chain"));
    assert_ne!(job::child_run_id("p", "chain"), job::child_run_id("q", "chain"));
    assert!(job::settle_timeout(Some(0.0)).is_err());
    assert!(job::settle_timeout(Some(121.0)).is_err());
    assert!(job::settle_timeout(Some(f64::NAN)).is_err());
    assert_eq!(job::settle_timeout(None).unwrap().as_secs(), 15);
}

/// A store that lets one run be held at a time, as a single worker slot would, and says
/// how many were ever held at once.
#[derive(Debug, Default)]
struct OneSlot {
    inner: MemoryStore,
    held: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

/// A held slot: the count it lowers when dropped, and the inner store's hold.
struct Slot {
    count: Arc<AtomicUsize>,
    _guard: store::RunGuard,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}

impl EventStore for OneSlot {
    fn create_run<'a>(
        &'a self,
        run: &'a RunRecord,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<(), store::Error>> {
        self.inner.create_run(run, events)
    }
    fn append<'a>(
        &'a self,
        run_id: &'a str,
        expected: u64,
        events: Vec<Event>,
        status: &'a str,
    ) -> BoxFuture<'a, Result<(), store::Error>> {
        self.inner.append(run_id, expected, events, status)
    }
    fn hold<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<store::RunGuard, store::Error>> {
        Box::pin(async move {
            let guard = self.inner.hold(run_id).await?;
            let now = self.held.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            Ok(store::RunGuard::new(Slot { count: Arc::clone(&self.held), _guard: guard }))
        })
    }
    delegate_to_inner!();
}

#[tokio::test]
async fn a_tree_completes_with_one_driver_and_each_child_is_settled_once() {
    let store = Arc::new(OneSlot::default());
    let e = engine_with_jobs(Arc::clone(&store) as Arc<dyn EventStore>, CHAIN);
    let r = registry();
    let root = Engine::new_run_id();
    let start = Start { input: "x".to_owned(), tree_max_cost_usd: Some(1.0), ..Start::default() };
    let outcome = e.run_job(&root, r.get("ask").unwrap(), start).await.unwrap();
    assert_eq!(outcome, Outcome::Finished(Status::Completed));
    assert_eq!(store.most.load(Ordering::SeqCst), 1, "one run held at a time");
    let st = e.state(&root).await.unwrap();
    assert_eq!(st.session.final_output.as_deref(), Some("the answer"));
    assert_eq!(st.tree_totals().cost_usd, 0.25);
    // ask → relay → answer, each child named from its parent, each settled once.
    let relay = job::child_run_id(&root, "chain");
    let answer = job::child_run_id(&relay, "chain");
    for (parent, child) in [(&root, &relay), (&relay, &answer)] {
        let log = e.store.load(parent, 0).await.unwrap();
        let settled: Vec<_> = log
            .iter()
            .filter(
                |ev| matches!(&ev.data, EventData::ChildRunSettled(c) if &c.child_run_id == child),
            )
            .collect();
        assert_eq!(settled.len(), 1);
    }
    let leaf = e.state(&answer).await.unwrap();
    assert_eq!(leaf.parent.as_ref().unwrap().root_run_id, root);
    assert_eq!(leaf.depth(), 2);
    // The leaf got what its parents left of the job's dollar.
    assert_eq!(leaf.budget.max_cost_usd, Some(1.0));
    // Settling again writes nothing.
    let before = e.store.load(&root, 0).await.unwrap().len();
    assert!(e.settle_children(&root).await.unwrap());
    assert_eq!(e.store.load(&root, 0).await.unwrap().len(), before);
}

#[tokio::test]
async fn an_engine_without_jobs_ends_a_run_that_names_a_route_with_its_own_result() {
    let e = crate::engine_on(Arc::new(MemoryStore::new()), script(CHAIN));
    let r = registry();
    let run = Engine::new_run_id();
    let outcome =
        e.run(&run, r.get("ask").unwrap(), "x", serde_json::Map::new(), None).await.unwrap();
    assert_eq!(outcome, Outcome::Finished(Status::Completed));
    let log = e.store.load(&run, 0).await.unwrap();
    assert!(log.iter().any(
        |ev| matches!(&ev.data, EventData::Warning(w) if w.message.contains("starts no child runs"))
    ));
    assert!(!log.iter().any(|ev| matches!(ev.data, EventData::ChildRunStarted(_))));
}

/// Answers `answer`'s level after 30 s: a child that runs until it is stopped.
const SLOW: &str =
    "scenarios:\n  answer:\n    levels:\n      say: [{text: 'late', delay_ms: 30000}]\n";

#[tokio::test]
async fn cancelling_a_parent_with_two_running_children_settles_both_within_the_timeout() {
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let e = engine_with_jobs(Arc::clone(&store), CHAIN);
    let r = registry();
    let answer = Arc::clone(r.get("answer").unwrap());
    e.keep_texts(&answer).await.unwrap();
    // A parent whose log started two children, each driven by a driver of its own.
    let root = e.start(r.get("ask").unwrap(), "x", serde_json::Map::new()).await.unwrap();
    let mut started = Vec::new();
    for (n, link) in ["a", "b"].into_iter().enumerate() {
        let child = job::child_run_id(&root, link);
        let event = baton_engine::event::NewEvent::run(EventData::ChildRunStarted(Box::new(
            baton_engine::event::ChildRunStarted {
                child_run_id: child.clone(),
                link: link.to_owned(),
                scenario_id: answer.id.clone(),
                scenario_version: answer.version,
                checksum: answer.checksum.clone(),
                input: "x".to_owned(),
                metadata: serde_json::Map::new(),
                budget: job::caps(&answer, None),
                depth: 1,
            },
        )))
        .at(2 + n as u64, Utc::now());
        store.append(&root, 2 + n as u64, vec![event], "waiting").await.unwrap();
        let driver = engine_with_jobs(Arc::clone(&store), SLOW);
        let (scenario, root) = (Arc::clone(&answer), root.clone());
        let start = Start {
            input: "x".to_owned(),
            budget: Some(job::caps(&answer, None)),
            parent: Some(baton_engine::event::ParentLink {
                parent_run_id: root.clone(),
                root_run_id: root,
                level_id: None,
                link: link.to_owned(),
                depth: 1,
            }),
            ..Start::default()
        };
        started.push((
            child.clone(),
            tokio::spawn(async move { driver.run_job(&child, &scenario, start).await }),
        ));
    }
    // Both children exist and are being driven.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    for (child, _) in &started {
        while store.run(child).await.unwrap().is_none() || !store.is_held(child).await.unwrap() {
            assert!(tokio::time::Instant::now() < deadline, "child {child} never ran");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let asked = std::time::Instant::now();
    e.cancel_tree(&root, Some("ops".to_owned()), None).await.unwrap();
    let ended = e.end_cancelled_tree(&root).await.unwrap();
    assert_eq!(ended, Outcome::Finished(Status::Cancelled));
    assert!(asked.elapsed() < Duration::from_secs(5), "took {:?}", asked.elapsed());
    for (child, task) in started {
        assert_eq!(task.await.unwrap().unwrap(), Outcome::Finished(Status::Cancelled), "{child}");
    }
    let log = store.load(&root, 0).await.unwrap();
    let settled: Vec<_> = log
        .iter()
        .filter_map(|ev| match &ev.data {
            EventData::ChildRunSettled(c) => Some(c.status),
            _ => None,
        })
        .collect();
    assert_eq!(settled, [baton_engine::event::FinalStatus::Cancelled; 2]);
}

#[tokio::test]
async fn a_route_longer_than_any_id_is_cut_before_it_is_recorded_and_goes_to_the_fallback() {
    let long = "x".repeat(10_000);
    let script_yaml = format!(
        "scenarios:\n  ask:\n    levels:\n      route: [{{text: '{{\"chosen_intent_route\": \"{long}\"}}'}}]\n  answer:\n    levels:\n      say: [{{text: 'fallback'}}]\n"
    );
    let e = engine_with_jobs(Arc::new(MemoryStore::new()), &script_yaml);
    let r = registry();
    let root = Engine::new_run_id();
    let start = Start { input: "x".to_owned(), ..Start::default() };
    let outcome = e.run_job(&root, r.get("ask").unwrap(), start).await.unwrap();
    assert_eq!(outcome, Outcome::Finished(Status::Completed));
    let log = e.store.load(&root, 0).await.unwrap();
    let chained = log
        .iter()
        .find_map(|ev| match &ev.data {
            EventData::ScenarioChained(c) => Some(c.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(chained.to, "answer");
    assert!(chained.route.chars().count() <= baton_engine::limits::ROUTE_CHARS_MAX + 1);
    assert!(chained.warning.unwrap().len() < 2_000);
    assert_eq!(e.state(&root).await.unwrap().session.final_output.as_deref(), Some("fallback"));
}
