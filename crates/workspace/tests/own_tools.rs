//! The user's own tools in a tool loop, on the kernel with a real workspace and a tool host
//! of the test's own that counts what it is asked per idempotency key: the effect ledger
//! (a write call committed before it is made, its receipt after, a driver that takes the
//! attempt over answering from the log and making a call without a receipt again with its
//! key), read calls, the schema, `max_calls`, priced calls and the budget, `once_per_run`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use baton_engine::cancel::CancelToken;
use baton_engine::clock::SystemClock;
use baton_engine::event::{Event, EventData};
use baton_engine::future::BoxFuture;
use baton_engine::model::ScriptedModel;
use baton_engine::runner::Runtime;
use baton_engine::state::Status;
use baton_engine::store::{EventStore, MemoryStore};
use baton_engine::tools::{Listed, OwnCall, ToolHost, ToolSession};
use baton_engine::verifier::Verifiers;
use baton_engine::workspace::{ToolOutcome, WorkspaceSetup};
use baton_engine::{Engine, Outcome};
use baton_scenario::{Registry, Scenario};
use baton_workspace::LocalWorkspaces;
use serde_json::Value;

/// A receiver of effects: every call it is asked to make, and the effects it applied —
/// one per idempotency key, as a service that honours keys does.
#[derive(Debug, Default)]
struct Receiver {
    /// (tool, key, arguments) of every call, in order.
    asked: Mutex<Vec<(String, Option<String>, Value)>>,
    /// Effects applied, by key (a read call applies none).
    applied: Mutex<BTreeMap<String, Value>>,
    /// The call with this number (from 1) hangs, its effect applied, until the drive is
    /// dropped: a process killed before the answer came back.
    hang_at: AtomicUsize,
    hung: tokio::sync::Notify,
}

#[derive(Debug)]
struct Host(Arc<Receiver>);

impl ToolHost for Host {
    fn open<'a>(
        &'a self,
        _tools: &'a [Arc<baton_scenario::model::OwnTool>],
        _workspace: &'a Path,
        _cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Box<dyn ToolSession>> {
        Box::pin(async move { Box::new(Host(Arc::clone(&self.0))) as Box<dyn ToolSession> })
    }
}

/// Nothing listed: the test's tools are all its own.
static NOTHING_LISTED: std::sync::LazyLock<BTreeMap<String, Listed>> =
    std::sync::LazyLock::new(BTreeMap::new);

impl ToolSession for Host {
    fn listed(&self) -> &BTreeMap<String, Listed> {
        &NOTHING_LISTED
    }

    fn problems(&self) -> &[String] {
        &[]
    }

    fn call<'a>(
        &'a self,
        call: OwnCall<'a>,
        _cancel: &'a CancelToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(async move {
            let r = &self.0;
            let key = call.key.map(str::to_owned);
            let number = {
                let mut asked = r.asked.lock().unwrap();
                asked.push((call.tool.name.clone(), key.clone(), call.arguments.clone()));
                asked.len()
            };
            if r.hang_at.compare_exchange(number, 0, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                // The effect is applied, and the process dies before it answers.
                if let Some(key) = &key {
                    r.applied.lock().unwrap().insert(key.clone(), call.arguments.clone());
                }
                r.hung.notify_one();
                std::future::pending::<()>().await;
            }
            if let Some(key) = &key {
                r.applied
                    .lock()
                    .unwrap()
                    .entry(key.clone())
                    .or_insert_with(|| call.arguments.clone());
            }
            if call.tool.name == "dump" {
                // More than one result may hold: cut to RESULT_BYTES_MAX for the model.
                return ToolOutcome::ok("x".repeat(100_000));
            }
            ToolOutcome::ok(format!("{} done: {}", call.tool.name, call.arguments))
        })
    }
}

const TOOLSETS: &str = r"toolsets:
  desk:
    source: command
    tools:
      - name: post_note
        description: Post a note on the ticket.
        parameters:
          type: object
          properties: {text: {type: string}}
          required: [text]
          additionalProperties: false
        command: [unused]
        max_calls: 2
      - name: look_up
        effect: read
        command: [unused]
      - name: charge
        command: [unused]
        cost_usd: 0.6
      - name: refund
        command: [unused]
        once_per_run: true
      - name: dump
        effect: read
        command: [unused]
      - name: pay
        parameters: {type: object, properties: {amount: {type: number}}, required: [amount]}
        command: [unused]
        approval: args.amount > 100
        approver_role: finance
        approval_timeout_s: 3
";

fn scenario(dir: &Path, budget: &str) -> Arc<Scenario> {
    scenario_with(dir, budget, "")
}

fn scenario_with(dir: &Path, budget: &str, edges: &str) -> Arc<Scenario> {
    let scenarios = dir.join("scenarios");
    std::fs::create_dir_all(&scenarios).unwrap();
    std::fs::write(
        scenarios.join("s.yaml"),
        format!(
            "id: desk\nversion: 1\n{budget}\n{TOOLSETS}levels:\n  - id: work\n    kind: tool_loop\n    prompt: {{inline: \"Handle: {{{{ input }}}}\"}}\n    tools: [desk]\n    terminal: true\n{edges}"
        ),
    )
    .unwrap();
    let loaded =
        Registry::load(&[&scenarios]).unwrap_or_else(|e| panic!("{}", e.diagnostics.render()));
    Arc::clone(loaded.registry.scenarios().next().unwrap())
}

fn engine(dir: &Path, store: &Arc<MemoryStore>, receiver: &Arc<Receiver>, script: &str) -> Engine {
    let opener = Arc::new(LocalWorkspaces::new(dir.join("workspaces"), dir.join("snapshots")));
    Engine::new(
        Arc::clone(store) as Arc<dyn EventStore>,
        Arc::new(Runtime {
            jobs: None,
            model: Arc::new(ScriptedModel::parse(script, "script.yaml").unwrap()),
            verifiers: Verifiers::builtin(),
            workspace: dir.to_path_buf(),
            workspaces: Some(WorkspaceSetup { opener, dir: None, branch: None }),
            catalog: Arc::new(Value::Array(Vec::new())),
            redactor: Arc::new(baton_engine::redact::Verbatim),
            runner: Arc::new(baton_runners::Runners),
            tools: Some(Arc::new(Host(Arc::clone(receiver)))),
        }),
        Arc::new(SystemClock),
    )
}

async fn log(store: &MemoryStore, run_id: &str) -> Vec<Event> {
    store.load(run_id, 0).await.unwrap()
}

fn count(events: &[Event], kind: &str) -> usize {
    events.iter().filter(|e| e.data.kind() == kind).count()
}

/// What a run's log says, event by event, but for what differs between two runs that did
/// the same (times, ids, keys, snapshots) and for a takeover and a reissue: each event's
/// kind, a model answer's call number and text, a tool result's content.
fn story(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter(|e| {
            !matches!(
                e.data.kind(),
                "run_interrupted"
                    | "run_paused"
                    | "run_taken_over"
                    | "run_resumed"
                    | "tool_call_reissued"
                    | "heartbeat"
            )
        })
        .map(|e| match &e.data {
            EventData::ModelResponse(r) => format!("model_response {} {:?}", r.call, r.tool_calls),
            EventData::ToolResult(r) => format!("tool_result {}", r.content),
            EventData::ToolCallFinished(r) => format!("tool_call_finished {}", r.content),
            other => other.kind().to_owned(),
        })
        .collect()
}

const TWO_NOTES: &str = r"levels:
  work:
    - tool_calls: [{name: post_note, arguments: {text: first}}]
    - tool_calls: [{name: look_up, arguments: {q: x}}, {name: post_note, arguments: {text: second}}]
    - tool_calls: [{name: finish, arguments: {summary: posted}}]
";

#[tokio::test]
async fn write_calls_are_keyed_and_receipted_and_read_calls_are_not_keyed() {
    let dir = tempfile::tempdir().unwrap();
    let s = scenario(dir.path(), "");
    let store = Arc::new(MemoryStore::new());
    let receiver = Arc::new(Receiver::default());
    let e = engine(dir.path(), &store, &receiver, TWO_NOTES);
    let run_id = Engine::new_run_id();
    let outcome = e.run(&run_id, &s, "ticket 7", serde_json::Map::new(), None).await.unwrap();
    assert_eq!(outcome, Outcome::Finished(Status::Completed));
    let asked = receiver.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 3, "{asked:?}");
    let (first, read, second) = (&asked[0], &asked[1], &asked[2]);
    assert_eq!(
        (first.0.as_str(), read.0.as_str(), second.0.as_str()),
        ("post_note", "look_up", "post_note")
    );
    assert!(read.1.is_none(), "a read call has no key");
    let (k1, k2) = (first.1.clone().unwrap(), second.1.clone().unwrap());
    assert_ne!(k1, k2, "each write call has its own key");
    let events = log(&store, &run_id).await;
    assert_eq!(count(&events, "tool_call_started"), 2, "only write calls are started");
    assert_eq!(count(&events, "tool_call_finished"), 3, "every call has a receipt");
    // The start is before the receipt, with the same key; the receipt holds the result.
    let started_at = events
        .iter()
        .position(|e| matches!(&e.data, EventData::ToolCallStarted(s) if s.key == k1))
        .unwrap();
    let finished_at = events
        .iter()
        .position(|e| matches!(&e.data, EventData::ToolCallFinished(f) if f.key.as_deref() == Some(k1.as_str())))
        .unwrap();
    assert!(started_at < finished_at);
    let EventData::ToolCallFinished(receipt) = &events[finished_at].data else { unreachable!() };
    assert_eq!(receipt.content, r#"post_note done: {"text":"first"}"#);
    // The model read the receipt's result.
    assert!(
        events
            .iter()
            .any(|e| matches!(&e.data, EventData::ToolResult(r) if r.content == receipt.content))
    );
}

#[tokio::test]
async fn a_driver_killed_during_a_write_call_is_replaced_by_one_that_reissues_it_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let s = scenario(dir.path(), "");
    // The uninterrupted run, for comparison.
    let reference_store = Arc::new(MemoryStore::new());
    let reference_receiver = Arc::new(Receiver::default());
    let reference = engine(dir.path(), &reference_store, &reference_receiver, TWO_NOTES);
    let reference_id = Engine::new_run_id();
    reference.run(&reference_id, &s, "ticket 7", serde_json::Map::new(), None).await.unwrap();
    let reference_log = log(&reference_store, &reference_id).await;

    let store = Arc::new(MemoryStore::new());
    let receiver = Arc::new(Receiver::default());
    // The third call — the second write — hangs: the first driver dies in it.
    let first = engine(dir.path(), &store, &receiver, TWO_NOTES);
    let run_id = Engine::new_run_id();
    receiver.hang_at.store(3, Ordering::SeqCst);
    let driving = {
        let (run_id, s) = (run_id.clone(), Arc::clone(&s));
        tokio::spawn(async move {
            first.run(&run_id, &s, "ticket 7", serde_json::Map::new(), None).await
        })
    };
    receiver.hung.notified().await;
    driving.abort();
    assert!(driving.await.unwrap_err().is_cancelled());
    let killed = log(&store, &run_id).await;
    let started: Vec<String> = killed
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolCallStarted(s) => Some(s.key.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(started.len(), 2, "the call in flight was committed before it was made");
    assert_eq!(
        count(&killed, "tool_call_finished"),
        2,
        "the first write and the read have receipts"
    );

    let second = engine(dir.path(), &store, &receiver, TWO_NOTES);
    let outcome = second.drive(&run_id, &s).await.unwrap();
    assert_eq!(outcome, Outcome::Finished(Status::Completed));
    let resumed = log(&store, &run_id).await;
    // The call without a receipt was made again with its key, said so first; none other.
    let reissued: Vec<&str> = resumed
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolCallReissued(r) => Some(r.key.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(reissued, [started[1].as_str()]);
    let asked = receiver.asked.lock().unwrap().clone();
    let per_key = |key: &str| asked.iter().filter(|a| a.1.as_deref() == Some(key)).count();
    assert_eq!(per_key(&started[0]), 1, "a call with a receipt is never made again");
    assert_eq!(per_key(&started[1]), 2, "the call without one is made again, once");
    assert_eq!(receiver.applied.lock().unwrap().len(), 2, "each effect was applied once");
    // Nothing was asked of the model again, and nothing written twice: the log is the
    // uninterrupted one but for the takeover and the reissue.
    assert_eq!(count(&resumed, "model_response"), 3);
    assert_eq!(story(&resumed), story(&reference_log));
    assert_eq!(
        second.state(&run_id).await.unwrap().session.final_output.as_deref(),
        Some("posted")
    );
}

#[tokio::test]
async fn arguments_off_the_schema_and_calls_past_max_calls_are_refused_without_a_call() {
    let dir = tempfile::tempdir().unwrap();
    let s = scenario(dir.path(), "");
    let store = Arc::new(MemoryStore::new());
    let receiver = Arc::new(Receiver::default());
    let script = r"levels:
  work:
    - tool_calls: [{name: post_note, arguments: {text: 7}}, {name: post_note, arguments: {text: a, extra: 1}}]
    - tool_calls: [{name: post_note, arguments: {text: a}}, {name: post_note, arguments: {text: b}}, {name: post_note, arguments: {text: c}}]
    - tool_calls: [{name: nothing_like_it}]
    - tool_calls: [{name: finish, arguments: {summary: done}}]
";
    let e = engine(dir.path(), &store, &receiver, script);
    let run_id = Engine::new_run_id();
    e.run(&run_id, &s, "t", serde_json::Map::new(), None).await.unwrap();
    assert_eq!(receiver.asked.lock().unwrap().len(), 2, "two calls passed their checks");
    let results: Vec<(bool, String)> = log(&store, &run_id)
        .await
        .into_iter()
        .filter_map(|e| match e.data {
            EventData::ToolResult(r) => Some((r.is_error, r.content)),
            _ => None,
        })
        .collect();
    assert!(
        results[0].0 && results[0].1.contains("/text: 7 is not of type \"string\""),
        "{results:?}"
    );
    assert!(results[1].0 && results[1].1.contains("extra"), "{results:?}");
    assert!(!results[2].0 && !results[3].0, "{results:?}");
    assert!(
        results[4].0 && results[4].1.contains("`post_note` may be called at most 2 times"),
        "{results:?}"
    );
    assert!(
        results[5].0 && results[5].1.contains("post_note, look_up, charge"),
        "an unknown tool's result names the user's tools too: {results:?}"
    );
}

#[tokio::test]
async fn a_priced_call_counts_against_the_budget_and_one_past_it_is_never_made() {
    let dir = tempfile::tempdir().unwrap();
    let s = scenario(dir.path(), "budget: {max_cost_usd: 1.0}");
    let store = Arc::new(MemoryStore::new());
    let receiver = Arc::new(Receiver::default());
    let script = r"levels:
  work:
    - tool_calls: [{name: charge, arguments: {amount: 1}}]
    - tool_calls: [{name: charge, arguments: {amount: 2}}]
    - tool_calls: [{name: finish, arguments: {summary: done}}]
";
    let e = engine(dir.path(), &store, &receiver, script);
    let run_id = Engine::new_run_id();
    let outcome = e.run(&run_id, &s, "t", serde_json::Map::new(), None).await.unwrap();
    assert_eq!(outcome, Outcome::Finished(Status::Aborted));
    assert_eq!(receiver.asked.lock().unwrap().len(), 1, "the second charge would cross the cap");
    let events = log(&store, &run_id).await;
    assert!(events.iter().any(|e| matches!(&e.data,
        EventData::BudgetExceeded(b) if b.limit_kind == "cost" && b.refused_before_call)));
    let state = e.state(&run_id).await.unwrap();
    assert!((state.totals.cost_usd - 0.6).abs() < 1e-9, "{}", state.totals.cost_usd);
}

#[tokio::test]
async fn a_once_per_run_call_made_again_by_a_later_attempt_gets_the_first_receipt() {
    let dir = tempfile::tempdir().unwrap();
    let edges = "edges:\n  - {from: work, to: work, when: \"attempt < 2\"}\n  - {from: work, to: __end__}\n";
    let s = scenario_with(dir.path(), "", edges);
    let store = Arc::new(MemoryStore::new());
    let receiver = Arc::new(Receiver::default());
    // Each attempt refunds the same ticket and posts a note (a new decision each time).
    let script = r"levels:
  work:
    - tool_calls: [{name: refund, arguments: {ticket: 7}}, {name: post_note, arguments: {text: a}}]
    - tool_calls: [{name: finish, arguments: {summary: done}}]
    - tool_calls: [{name: refund, arguments: {ticket: 7}}, {name: post_note, arguments: {text: a}}]
    - tool_calls: [{name: finish, arguments: {summary: done}}]
";
    let e = engine(dir.path(), &store, &receiver, script);
    let run_id = Engine::new_run_id();
    let outcome = e.run(&run_id, &s, "t", serde_json::Map::new(), None).await.unwrap();
    assert_eq!(outcome, Outcome::Finished(Status::Completed));
    let asked = receiver.asked.lock().unwrap().clone();
    let tools: Vec<&str> = asked.iter().map(|a| a.0.as_str()).collect();
    assert_eq!(tools, ["refund", "post_note", "post_note"], "the refund is made once per run");
    assert_ne!(asked[1].1, asked[2].1, "a write call of another attempt gets a new key");
    let events = log(&store, &run_id).await;
    let refunds: Vec<(Option<u32>, Option<String>, f64)> = events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolCallFinished(f) if f.tool == "refund" => {
                Some((e.attempt, f.key.clone(), f.cost_usd))
            }
            _ => None,
        })
        .collect();
    assert_eq!(refunds.len(), 2, "{refunds:?}");
    assert_eq!((refunds[0].0, refunds[1].0), (Some(1), Some(2)));
    assert_eq!(refunds[0].1, refunds[1].1, "the second attempt reads the first receipt");
    assert_eq!(count(&events, "tool_call_started"), 3);
}

const PAYMENTS: &str = r"levels:
  work:
    - tool_calls: [{name: pay, arguments: {amount: 50}}, {name: pay, arguments: {amount: 500}}, {name: post_note, arguments: {text: paid}}]
    - tool_calls: [{name: finish, arguments: {summary: paid}}]
";

async fn paused_on_the_large_payment(
    dir: &Path,
) -> (Arc<MemoryStore>, Arc<Receiver>, String, Arc<Scenario>) {
    let s = scenario(dir, "");
    let store = Arc::new(MemoryStore::new());
    let receiver = Arc::new(Receiver::default());
    let e = engine(dir, &store, &receiver, PAYMENTS);
    let run_id = Engine::new_run_id();
    let outcome = e.run(&run_id, &s, "t", serde_json::Map::new(), None).await.unwrap();
    assert_eq!(outcome, Outcome::Paused, "the large payment waits for a person");
    let asked: Vec<Value> = receiver.asked.lock().unwrap().iter().map(|a| a.2.clone()).collect();
    assert_eq!(
        asked,
        [serde_json::json!({"amount": 50})],
        "the small one was made, the large one not yet"
    );
    let state = e.state(&run_id).await.unwrap();
    let open: Vec<_> = state.open_approvals().collect();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].request.approver_role, "finance");
    let tool = open[0].request.tool.as_ref().unwrap();
    assert_eq!((tool.tool.as_str(), &tool.arguments), ("pay", &serde_json::json!({"amount": 500})));
    (store, receiver, run_id, s)
}

#[tokio::test]
async fn a_call_its_approval_gate_holds_waits_for_a_person_and_is_made_once_approved() {
    let dir = tempfile::tempdir().unwrap();
    let (store, receiver, run_id, s) = paused_on_the_large_payment(dir.path()).await;
    // Another driver (a new engine over the same store) takes the decision and goes on.
    let e = engine(dir.path(), &store, &receiver, PAYMENTS);
    let decision = baton_engine::decide::Decision {
        request_id: None,
        approved: true,
        comment: None,
        by: Some("alice".to_owned()),
        data: None,
    };
    e.decide(&run_id, decision).await.unwrap();
    assert_eq!(e.drive(&run_id, &s).await.unwrap(), Outcome::Finished(Status::Completed));
    let asked: Vec<Value> = receiver.asked.lock().unwrap().iter().map(|a| a.2.clone()).collect();
    assert_eq!(
        asked,
        [
            serde_json::json!({"amount": 50}),
            serde_json::json!({"amount": 500}),
            serde_json::json!({"text": "paid"})
        ],
        "each call made once, the approved one after its decision"
    );
    let events = log(&store, &run_id).await;
    assert_eq!(count(&events, "model_response"), 2, "the model was not asked again");
    assert_eq!(count(&events, "tool_call_started"), 3);
    assert_eq!(count(&events, "approval_requested"), 1);
}

#[tokio::test]
async fn a_rejected_call_is_never_made_and_the_model_reads_who_rejected_it_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let (store, receiver, run_id, s) = paused_on_the_large_payment(dir.path()).await;
    let e = engine(dir.path(), &store, &receiver, PAYMENTS);
    let decision = baton_engine::decide::Decision {
        request_id: None,
        approved: false,
        comment: Some("over the monthly limit".to_owned()),
        by: Some("bob".to_owned()),
        data: None,
    };
    e.decide(&run_id, decision).await.unwrap();
    assert_eq!(e.drive(&run_id, &s).await.unwrap(), Outcome::Finished(Status::Completed));
    let asked: Vec<Value> = receiver.asked.lock().unwrap().iter().map(|a| a.2.clone()).collect();
    assert_eq!(asked, [serde_json::json!({"amount": 50}), serde_json::json!({"text": "paid"})]);
    let events = log(&store, &run_id).await;
    let rejected = events.iter().find_map(|e| match &e.data {
        EventData::ToolResult(r) if r.content.starts_with("rejected") => Some(r.content.clone()),
        _ => None,
    });
    assert_eq!(rejected.as_deref(), Some("rejected by bob: over the monthly limit"));
    assert_eq!(count(&events, "tool_call_started"), 2, "the rejected call was never started");
}

#[tokio::test]
async fn the_results_of_one_attempt_add_up_to_a_bound_past_which_calls_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = scenario(dir.path(), "");
    let store = Arc::new(MemoryStore::new());
    let receiver = Arc::new(Receiver::default());
    // Three turns of 30 calls at once (a turn runs at most 32), each call answered with
    // more than a result may hold.
    let turn = |n: usize| -> String {
        let calls: Vec<String> = (0..30)
            .map(|i| format!("{{name: dump, arguments: {{page: {}}}}}", n * 30 + i))
            .collect();
        format!("    - tool_calls: [{}]\n", calls.join(", "))
    };
    let script = format!(
        "levels:\n  work:\n{}{}{}    - tool_calls: [{{name: finish, arguments: {{summary: done}}}}]\n",
        turn(0),
        turn(1),
        turn(2)
    );
    let e = engine(dir.path(), &store, &receiver, &script);
    let run_id = Engine::new_run_id();
    let outcome = e.run(&run_id, &s, "t", serde_json::Map::new(), None).await.unwrap();
    assert_eq!(outcome, Outcome::Finished(Status::Completed));
    let made = receiver.asked.lock().unwrap().len();
    let per_result = baton_engine::tools::RESULT_BYTES_MAX;
    let total = baton_engine::tools::RESULTS_PER_ATTEMPT_BYTES_MAX;
    // Calls are made until the results reach the bound: at most one result past it.
    let events = log(&store, &run_id).await;
    assert!(made >= total / (per_result + 1024) && made <= total / per_result + 1, "{made} made");
    let refused: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolResult(r) if r.is_error => Some(r.content.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(made + refused.len(), 90, "every call was made or refused");
    assert!(refused.iter().all(|r| r.contains("the most one attempt may take in")), "{refused:?}");
}

#[tokio::test]
async fn a_call_whose_approval_times_out_is_never_made_and_the_model_reads_why() {
    let dir = tempfile::tempdir().unwrap();
    let (store, receiver, run_id, s) = paused_on_the_large_payment(dir.path()).await;
    let state = baton_engine::fold(&log(&store, &run_id).await);
    let deadline = state.open_approvals().next().unwrap().request.deadline;
    assert!(deadline.is_some(), "the request carries its deadline");
    // Past it, the next driver decides it as timed out, once, and the loop goes on.
    tokio::time::sleep(std::time::Duration::from_millis(3100)).await;
    let e = engine(dir.path(), &store, &receiver, PAYMENTS);
    assert_eq!(e.drive(&run_id, &s).await.unwrap(), Outcome::Finished(Status::Completed));
    let asked: Vec<Value> = receiver.asked.lock().unwrap().iter().map(|a| a.2.clone()).collect();
    assert_eq!(
        asked,
        [serde_json::json!({"amount": 50}), serde_json::json!({"text": "paid"})],
        "the call past its approval's deadline is never made"
    );
    let events = log(&store, &run_id).await;
    let decided: Vec<&EventData> =
        events.iter().map(|e| &e.data).filter(|d| d.kind() == "approval_decided").collect();
    assert_eq!(decided.len(), 1);
    let results: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolResult(r) if r.is_error => Some(r.content.clone()),
            _ => None,
        })
        .collect();
    assert!(
        results.iter().any(|r| r.starts_with("not made: its approval timed out")),
        "{results:?}"
    );
}
