//! Approvals per branch: a fan-out whose children include `human_approval` levels pauses
//! for each branch's own decision, runs its other children meanwhile, and aggregates once
//! every branch is decided. Decisions are recorded once, with the approver's data checked
//! against the level's `output_schema` before anything is written.

use std::sync::Arc;

use baton_engine::event::{ApprovalDecided, Event, EventData};
use baton_engine::exec::Error;
use baton_engine::store::{EventStore, MemoryStore};
use baton_engine::{Decision, Engine, Outcome, Status};
use baton_scenario::Scenario;
use serde_json::{Map, Value, json};

use crate::{engine_on, kinds, route, scenario, script};

const FAN: &str = "
id: fanappr
version: 1
levels:
  - id: checks
    kind: fan_out
    fan_out: [legal, security, lint]
    fan_in: {aggregator: all_pass}
  - {id: legal, kind: human_approval, approver_role: counsel, prompt: {inline: 'Legal review of {{ input }}'}}
  - id: security
    kind: human_approval
    approver_role: security
    prompt: {inline: 'Security review'}
    output_schema:
      type: object
      properties:
        approved: {type: boolean}
        comment: {type: string}
        by: {type: string}
        risk: {enum: [low, high]}
      required: [approved, risk]
  - {id: lint, kind: prompt, prompt: {inline: Lint}, response: verdict}
  - {id: ship, kind: prompt, prompt: {inline: 'Ship at {{ level.security.parsed.risk }} risk'}, terminal: true}
  - {id: stop, kind: prompt, prompt: {inline: Stop}, terminal: true}
edges:
  - {from: checks, to: ship, when: \"verdict == 'PASS' && level.security.parsed.risk == 'low'\"}
  - {from: checks, to: stop}
";

const SCRIPT: &str = "
levels:
  lint: [{text: PASS}]
  ship: [{text: shipped}]
  stop: [{text: stopped}]
";

fn decision(request: &str, approved: bool, data: Option<Value>) -> Decision {
    Decision {
        request_id: Some(request.to_owned()),
        approved,
        comment: None,
        by: Some("ann".to_owned()),
        data,
    }
}

fn refusal(result: Result<ApprovalDecided, Error>) -> String {
    match result {
        Ok(d) => panic!("recorded {d:?}"),
        Err(e) => e.to_string(),
    }
}

async fn paused_run() -> (Engine, Arc<Scenario>, String) {
    let s = scenario(FAN);
    let e = engine_on(Arc::new(MemoryStore::new()), script(SCRIPT));
    let run = e.start(&s, "the contract", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Paused);
    (e, s, run)
}

#[tokio::test]
async fn each_approval_branch_waits_for_its_own_decision() {
    let (e, s, run) = paused_run().await;
    let st = e.state(&run).await.unwrap();
    assert_eq!(st.status, Status::Paused);
    assert_eq!(e.store.run(&run).await.unwrap().unwrap().status, "paused");
    let open: Vec<(&str, &str)> =
        st.open_approvals().map(|p| (p.request.request_id.as_str(), p.level_id.as_str())).collect();
    assert_eq!(open, vec![("legal#1", "legal"), ("security#1", "security")]);
    assert_eq!(st.pending_approvals[0].request.question, "Legal review of the contract");
    // The prompt branch ran while the approval branches wait.
    assert_eq!(st.level("lint").unwrap().verdict.as_deref(), Some("PASS"));
    assert!(st.level("checks").unwrap().running, "the fan-out waits for its branches");

    // Without --request, two open requests are an error naming both.
    let err = refusal(e.approve(&run, true, None, None).await);
    assert!(err.contains("2 approval requests are open; name one with --request ID"), "{err}");
    assert!(err.contains("legal#1 (level `legal`: Legal review of the contract)"), "{err}");
    assert!(err.contains("security#1 (level `security`: Security review)"), "{err}");

    let decided = e.decide(&run, decision("legal#1", true, None)).await.unwrap();
    assert_eq!(decided.request_id, "legal#1");
    let err = refusal(e.decide(&run, decision("legal#1", false, None)).await);
    assert!(err.contains("approval request legal#1 was already decided"), "{err}");
    assert!(err.contains("open requests: security#1"), "{err}");
    let err = refusal(e.decide(&run, decision("nosuch#1", true, None)).await);
    assert!(err.contains("no approval request nosuch#1; open requests: security#1"), "{err}");

    // Still waiting for the other branch.
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Paused);
    let st = e.state(&run).await.unwrap();
    assert_eq!(st.level("legal").unwrap().approved, Some(true));
    assert!(st.level("checks").unwrap().running);
    let open: Vec<&str> = st.open_approvals().map(|p| p.request.request_id.as_str()).collect();
    assert_eq!(open, vec!["security#1"]);

    // With one request open, it need not be named; its data is the level's output.
    let only =
        Decision { approved: true, data: Some(json!({"risk": "low"})), ..Decision::default() };
    assert_eq!(e.decide(&run, only.clone()).await.unwrap().request_id, "security#1");
    assert!(refusal(e.decide(&run, only).await).contains("the run is not waiting for an approval"));
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Completed));
    let log = e.store.load(&run, 0).await.unwrap();
    assert_eq!(route(&log), vec!["checks->ship", "ship->__end__"]);
    let st = e.state(&run).await.unwrap();
    assert_eq!(st.session.final_output.as_deref(), Some("shipped"));
    assert_eq!(st.level("checks").unwrap().output, "3 of 3 children passed (all_pass): PASS");
    assert_eq!(
        st.level("security").unwrap().parsed,
        Some(json!({"risk": "low", "approved": true, "comment": null, "by": null}))
    );
    let prompts: Vec<&str> = log
        .iter()
        .filter_map(|e| match &e.data {
            EventData::PromptSent(p) => Some(p.prompt.as_str()),
            _ => None,
        })
        .collect();
    assert!(prompts.contains(&"Ship at low risk"), "templates read the data: {prompts:?}");
    // The fan-out finishes after both of its approval children, in the order they asked.
    let tail: Vec<String> = kinds(&log)
        .into_iter()
        .filter(|k| k.starts_with("level_finished") || k.starts_with("approval_"))
        .collect();
    assert_eq!(
        tail,
        vec![
            "approval_requested:legal",
            "approval_requested:security",
            "level_finished:lint",
            "approval_decided",
            "level_finished:legal",
            "approval_decided",
            "level_finished:security",
            "level_finished:checks",
            "level_finished:ship",
        ]
    );
}

#[tokio::test]
async fn a_rejected_branch_fails_the_fan_in() {
    let (e, s, run) = paused_run().await;
    e.decide(&run, decision("security#1", false, None)).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Paused);
    e.decide(&run, decision("legal#1", true, None)).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Completed));
    let log = e.store.load(&run, 0).await.unwrap();
    assert_eq!(route(&log), vec!["checks->stop", "stop->__end__"]);
    let st = e.state(&run).await.unwrap();
    assert_eq!(st.level("checks").unwrap().verdict.as_deref(), Some("FAIL"));
    assert_eq!(st.level("security").unwrap().verdict.as_deref(), Some("FAIL"));
    assert_eq!(st.tracker.get("human_approval:security"), Some(&1));
    assert_eq!(st.session.final_output.as_deref(), Some("stopped"));
}

#[tokio::test]
async fn the_approvers_data_is_checked_before_anything_is_recorded() {
    let (e, _s, run) = paused_run().await;
    let before = e.state(&run).await.unwrap().last_seq;
    let err = refusal(e.decide(&run, decision("security#1", true, None)).await);
    assert!(err.contains("does not match the output_schema of level `security`"), "{err}");
    assert!(err.contains("\"risk\" is a required property"), "{err}");
    assert!(err.contains("give the approver's data with --data FILE.json"), "{err}");
    assert!(err.contains("nothing was recorded"), "{err}");
    let err =
        refusal(e.decide(&run, decision("security#1", true, Some(json!({"risk": "huge"})))).await);
    assert!(err.contains("/risk: "), "violations are named by JSON pointer: {err}");
    let err = refusal(e.decide(&run, decision("security#1", true, Some(json!([1])))).await);
    assert!(err.contains("the approver's data must be a JSON object"), "{err}");
    let err = refusal(
        e.decide(
            &run,
            decision("security#1", true, Some(json!({"risk": "low", "approved": false}))),
        )
        .await,
    );
    assert!(err.contains("must not set `approved`"), "{err}");
    let mut blank = decision("legal#1", true, None);
    blank.by = Some(" \t".to_owned());
    let err = refusal(e.decide(&run, blank).await);
    assert!(err.contains("the approver (`by`) must not be empty"), "{err}");
    assert_eq!(e.state(&run).await.unwrap().last_seq, before, "nothing was written");
    // A rejection needs no data; one that gives data has it checked too.
    let err =
        refusal(e.decide(&run, decision("security#1", false, Some(json!({"risk": 3})))).await);
    assert!(err.contains("/risk: "), "{err}");
    e.decide(&run, decision("security#1", false, None)).await.unwrap();
    let st = e.state(&run).await.unwrap();
    assert_eq!(st.decisions["security#1"].data, None);
}

/// Drives to the end, deciding the first open request each time it pauses.
async fn decide_to_the_end(e: &Engine, run: &str, s: &Arc<Scenario>) {
    for _ in 0..10 {
        match e.drive(run, s).await.unwrap() {
            Outcome::Finished(_) => return,
            Outcome::Interrupted(why) => panic!("interrupted: {why}"),
            Outcome::Waiting => panic!("no run here starts children"),
            Outcome::Released => panic!("no engine here drains"),
            Outcome::Paused => {
                let st = e.state(run).await.unwrap();
                let first = st.open_approvals().next().unwrap();
                let data = (first.level_id == "security").then(|| json!({"risk": "low"}));
                let id = first.request.request_id.clone();
                e.decide(run, decision(&id, true, data)).await.unwrap();
            }
        }
    }
    panic!("the run did not end");
}

/// The log without what may differ between runs: times and durations.
fn normalised(events: &[Event]) -> Vec<Value> {
    fn scrub(v: &mut Value) {
        match v {
            Value::Object(map) => {
                for key in ["duration_ms", "total_duration_ms", "waiting_ms", "at"] {
                    map.remove(key);
                }
                map.values_mut().for_each(scrub);
            }
            Value::Array(items) => items.iter_mut().for_each(scrub),
            _ => {}
        }
    }
    events
        .iter()
        .map(|e| {
            let mut v = serde_json::to_value(e).unwrap();
            scrub(&mut v);
            v
        })
        .collect()
}

#[tokio::test]
async fn a_crash_between_decisions_resumes_to_the_same_log() {
    let s = scenario(FAN);
    let recording = Arc::new(crate::Observed::default());
    let e = engine_on(recording.clone(), script(SCRIPT));
    let run = Engine::new_run_id();
    e.run(&run, &s, "x", Map::new(), None).await.unwrap();
    decide_to_the_end(&e, &run, &s).await;
    let full = e.store.load(&run, 0).await.unwrap();
    assert!(matches!(full.last().unwrap().data, EventData::ScenarioFinished(_)));
    let boundaries = recording.boundaries();
    assert!(boundaries.len() >= 5, "{boundaries:?}");
    for &n in &boundaries {
        let store = Arc::new(MemoryStore::new());
        let prefix: Vec<Event> = full[..usize::try_from(n).unwrap()].to_vec();
        store.create_run(&e.store.run(&run).await.unwrap().unwrap(), prefix).await.unwrap();
        let fresh = engine_on(store, script(SCRIPT));
        decide_to_the_end(&fresh, &run, &s).await;
        let resumed = fresh.store.load(&run, 0).await.unwrap();
        assert_eq!(normalised(&resumed), normalised(&full), "stopped after event {n}");
    }
}

#[test]
fn a_version_1_decision_reads_without_data_and_a_version_2_one_must_say() {
    let v1 = r#"{"request_id": "ok#1", "approved": true, "comment": null, "by": "ann"}"#;
    let EventData::ApprovalDecided(d) = EventData::decode_str("approval_decided", 1, v1).unwrap()
    else {
        panic!("not a decision")
    };
    assert_eq!((d.request_id.as_str(), d.approved, d.data), ("ok#1", true, None));
    let err = EventData::decode_str("approval_decided", 2, v1).unwrap_err();
    assert!(err.message.contains("missing field `data`"), "{err}");
    let v2 = r#"{"request_id": "ok#1", "approved": true, "comment": null, "by": null, "data": {"risk": "low"}}"#;
    let EventData::ApprovalDecided(d) = EventData::decode_str("approval_decided", 2, v2).unwrap()
    else {
        panic!("not a decision")
    };
    assert_eq!(d.data, Some(json!({"risk": "low"})));
    // Other kinds read the same in both versions; unknown versions are refused.
    assert!(EventData::decode_str("warning", 1, r#"{"message": "m"}"#).is_ok());
    assert!(EventData::decode_str("warning", 3, r#"{"message": "m"}"#).is_err());
}
