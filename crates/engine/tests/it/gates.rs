//! Gate semantics recorded per run: a run keeps the rule it started under. A log written
//! by schema version 1 (two-valued gates) resumes under the two-valued rule; a new run
//! routes under the three-valued rule.

use std::sync::Arc;

use baton_engine::event::{EventData, LevelFinished, LevelStarted, NewEvent, VERSION};
use baton_engine::store::{EventStore, MemoryStore, RunRecord};
use baton_engine::{Outcome, Status};
use baton_scenario::expr::Semantics;
use chrono::Utc;
use serde_json::{Map, json};

use crate::{engine, engine_on, route, scenario, script};

/// `classify` answers without a confidence: `!(confidence >= 0.7)` fires under the
/// two-valued rule (to `review`) and not under the three-valued one (on to `done`).
const CONFIDENCE: &str = "
id: confidence
version: 1
levels:
  - {id: classify, kind: prompt, prompt: {inline: 'Classify {{ input }}'}}
  - {id: review, kind: prompt, prompt: {inline: 'Review'}, terminal: true}
  - {id: done, kind: prompt, prompt: {inline: 'Done'}, terminal: true}
edges:
  - {from: classify, to: review, when: '!(confidence >= 0.7)'}
  - {from: classify, to: done}
  - {from: review, to: __end__}
  - {from: done, to: __end__}
";

const ANSWERS: &str = "levels:\n  review: [{text: reviewed}]\n  done: [{text: finished}]\n  classify: [{text: billing}]\n";

/// `scenario_started` as schema version 1 wrote it: no `gate_semantics`.
fn started_v1(checksum: &str) -> String {
    json!({
        "scenario_id": "confidence",
        "scenario_version": 1,
        "checksum": checksum,
        "input": "a ticket",
        "metadata": {},
        "budget": {"max_cost_usd": null, "max_tokens": null, "max_duration_s": null},
        "max_attempts_per_conflict": 3,
        "model_source": null
    })
    .to_string()
}

/// A stored event of schema version 1, decoded as a store decodes it.
fn stored_v1(seq: u64, new: NewEvent) -> baton_engine::event::Event {
    let kind = new.data.kind();
    let payload = new.data.payload().to_string();
    let data = EventData::decode_str(kind, 1, &payload).unwrap();
    NewEvent { data, ..new }.at(seq, Utc::now())
}

#[tokio::test]
async fn a_log_of_schema_version_1_resumes_under_the_two_valued_rule() {
    let s = scenario(CONFIDENCE);
    let started = EventData::decode_str("scenario_started", 1, &started_v1(&s.checksum)).unwrap();
    let EventData::ScenarioStarted(upgraded) = &started else { panic!("{started:?}") };
    assert_eq!(upgraded.gate_semantics, Semantics::TwoValued);
    let classify_started = NewEvent::level(
        "classify",
        1,
        EventData::LevelStarted(LevelStarted {
            role: "classify".into(),
            kind: "prompt".into(),
            parent: None,
            model_constraint_allow: None,
            process: None,
        }),
    );
    let classify_finished = NewEvent::level(
        "classify",
        1,
        EventData::LevelFinished(Box::new(LevelFinished {
            ok: true,
            skipped: false,
            verdict: None,
            output: "billing".into(),
            parsed: None,
            confidence: None,
            scratchpad: Map::new(),
            conflict: None,
            error: None,
            error_kind: None,
            cost_usd: 0.0,
            tokens: 0,
            duration_ms: 0,
            terminal: false,
            touched_paths: Vec::new(),
            snapshot: None,
        })),
    );
    let log = vec![
        NewEvent::run(started).at(1, Utc::now()),
        stored_v1(2, classify_started),
        stored_v1(3, classify_finished),
    ];
    let store = Arc::new(MemoryStore::new());
    let now = Utc::now();
    let record = RunRecord::new("old-run", "confidence", "running", now);
    store.create_run(&record, log).await.unwrap();
    let e = engine_on(store, script(ANSWERS));
    assert_eq!(e.state("old-run").await.unwrap().gate_semantics, Semantics::TwoValued);
    assert_eq!(e.drive("old-run", &s).await.unwrap(), Outcome::Finished(Status::Completed));
    let events = e.store.load("old-run", 0).await.unwrap();
    assert_eq!(route(&events), vec!["classify->review", "review->__end__"]);
    assert_eq!(e.state("old-run").await.unwrap().session.final_output.as_deref(), Some("reviewed"));
}

#[tokio::test]
async fn a_new_run_records_and_routes_under_the_three_valued_rule() {
    let s = scenario(CONFIDENCE);
    let e = engine(script(ANSWERS));
    let run = e.start(&s, "a ticket", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Completed));
    let events = e.store.load(&run, 0).await.unwrap();
    let EventData::ScenarioStarted(started) = &events[0].data else { panic!("{events:?}") };
    assert_eq!(started.gate_semantics, Semantics::ThreeValued);
    assert_eq!(events[0].data.payload()["gate_semantics"], "three_valued");
    assert_eq!(route(&events), vec!["classify->done", "done->__end__"]);
}

#[test]
fn a_current_payload_without_gate_semantics_is_refused_not_defaulted() {
    let err = EventData::decode_str("scenario_started", VERSION, &started_v1("x")).unwrap_err();
    assert!(err.message.contains("gate_semantics"), "{err}");
    let err = EventData::decode_str("scenario_started", VERSION + 1, &started_v1("x")).unwrap_err();
    assert!(err.message.contains("schema version 3 is not known"), "{err}");
}

#[test]
fn the_recorded_semantics_round_trips_through_the_current_version() {
    let mut payload: serde_json::Value = serde_json::from_str(&started_v1("x")).unwrap();
    payload["gate_semantics"] = "two_valued".into();
    let decoded = EventData::decode_str("scenario_started", VERSION, &payload.to_string()).unwrap();
    let EventData::ScenarioStarted(s) = decoded else { panic!() };
    assert_eq!(s.gate_semantics, Semantics::TwoValued);
    payload["gate_semantics"] = "kleene".into();
    assert!(EventData::decode_str("scenario_started", VERSION, &payload.to_string()).is_err());
}
