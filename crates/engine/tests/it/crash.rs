//! Crash anywhere, resume anywhere: stopping after any append and resuming in a fresh
//! engine gives the same log as a run that never stopped (timestamps, ids and durations
//! aside), and no model call in the log is made again (a fan-out's children that finished
//! before the stop included). Also: folding a log in pieces equals folding it at once, and
//! the orchestration state and the session fold apart.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use baton_engine::cancel::CancelToken;
use baton_engine::event::{Event, EventData};
use baton_engine::model::{
    BoxFuture, ModelError, ModelProvider, ModelReply, ModelRequest, ScriptedModel,
};
use baton_engine::store::{EventStore, MemoryStore};
use baton_engine::{Engine, Outcome, fold};
use baton_scenario::Scenario;
use proptest::prelude::*;
use serde_json::{Map, Value};

use crate::{engine_on, scenario, script};

/// Drives a run to its end, approving every approval — two deciders at once, of which
/// exactly one is recorded — and answering every question.
async fn to_the_end(e: &Engine, run: &str, s: &Arc<Scenario>) {
    for _ in 0..20 {
        match e.drive(run, s).await.unwrap() {
            Outcome::Finished(_) => return,
            Outcome::Interrupted(why) => panic!("interrupted: {why}"),
            Outcome::Waiting => panic!("no run here starts children"),
            Outcome::Released => panic!("no engine here drains"),
            Outcome::Paused => {
                let st = e.state(run).await.unwrap();
                if st.pending_ask.is_some() {
                    e.answer(run, Value::String("yes".into())).await.unwrap();
                } else {
                    let (a, b) = tokio::join!(
                        e.approve(run, true, None, Some("tester".into())),
                        e.approve(run, true, None, Some("tester".into())),
                    );
                    assert!(a.is_ok() != b.is_ok(), "one decision of two: {a:?} {b:?}");
                    let refused = a.err().or(b.err()).unwrap().to_string();
                    assert!(
                        refused.contains("already decided")
                            || refused.contains("not waiting for an approval"),
                        "{refused}"
                    );
                }
            }
        }
    }
    panic!("the run did not end");
}

/// The log without what may differ between runs: times, ids and durations.
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

/// [`normalised`] without the pause and resumption a takeover records, nor the numbers
/// they shift (`seq`, `resumes`) or the process that resumed; and how many takeovers.
fn without_takeovers(events: &[Event]) -> (Vec<Value>, usize) {
    let takeover = |e: &Event| match &e.data {
        EventData::RunPaused(p) => p.reason == "driver_lost",
        EventData::RunResumed(r) => r.by.as_deref() == Some("takeover"),
        EventData::RunTakenOver(_) => true,
        _ => false,
    };
    let kept: Vec<Event> = events.iter().filter(|e| !takeover(e)).cloned().collect();
    let mut values = normalised(&kept);
    for v in &mut values {
        if let Some(map) = v.as_object_mut() {
            map.remove("seq");
        }
        if let Some(data) = v.get_mut("data").and_then(Value::as_object_mut) {
            data.remove("resumes");
            data.remove("process");
        }
    }
    let pairs = events.iter().filter(|e| matches!(e.data, EventData::RunTakenOver(_))).count();
    (values, pairs)
}

const SCENARIO: &str = "
id: crashy
version: 1
levels:
  - {id: brief, kind: prompt, prompt: {inline: 'Brief {{ input }}'}}
  - id: fan
    kind: fan_out
    fan_out: [r1, r2]
    fan_in: {aggregator: all_pass}
  - {id: r1, kind: prompt, prompt: {inline: R1}, response: verdict}
  - {id: r2, kind: prompt, prompt: {inline: R2}, response: verdict}
  - {id: accept, kind: prompt, prompt: {inline: 'Accept {{ level.brief.output }}'}, response: verdict}
  - {id: ok, kind: human_approval}
  - {id: ask, kind: prompt, prompt: {inline: Ask}, response: json, terminal: true}
edges:
  - {from: brief, to: fan}
  - {from: fan, to: accept}
  - {from: accept, to: ok, when: \"verdict == 'PASS'\"}
  - {from: accept, to: brief}
  - {from: ok, to: ask}
";

const SCRIPT: &str = "
levels:
  brief: [{text: b1}, {text: b2}]
  r1: [{text: PASS}]
  r2: [{text: PASS, delay_ms: 60}]
  accept: [{text: 'FAIL: again'}, {text: 'PASS'}]
  ask: [{text: '{\"ask_user\": {\"q\": \"sure?\"}}'}, {text: '{\"done\": true}'}]
";

/// A model that counts the calls it answers, by level.
#[derive(Debug)]
struct Counting {
    inner: ScriptedModel,
    calls: Arc<Mutex<BTreeMap<String, u32>>>,
}

impl ModelProvider for Counting {
    fn call<'a>(
        &'a self,
        request: &'a ModelRequest,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<ModelReply, ModelError>> {
        *self.calls.lock().unwrap().entry(request.level_id.clone()).or_default() += 1;
        self.inner.call(request, cancel)
    }

    fn worst_case_cost_usd(&self, request: &ModelRequest) -> f64 {
        self.inner.worst_case_cost_usd(request)
    }
}

/// The model answers a log holds, by level.
fn answers(events: &[Event]) -> BTreeMap<String, u32> {
    let mut by_level = BTreeMap::new();
    for e in events {
        if let (EventData::ModelResponse(_), Some(level)) = (&e.data, &e.level_id) {
            *by_level.entry(level.clone()).or_default() += 1;
        }
    }
    by_level
}

#[tokio::test]
async fn resuming_after_any_append_gives_the_same_log() {
    let s = scenario(SCENARIO);
    let recording = Arc::new(crate::Observed::default());
    let e = engine_on(recording.clone(), script(SCRIPT));
    let run = Engine::new_run_id();
    e.run(&run, &s, "go", Map::new(), None).await.unwrap();
    to_the_end(&e, &run, &s).await;
    let full = e.store.load(&run, 0).await.unwrap();
    assert!(matches!(full.last().unwrap().data, EventData::ScenarioFinished(_)));
    let boundaries = recording.boundaries();
    assert!(boundaries.len() > 10, "{boundaries:?}");
    // `r1` answers at once and `r2` later: the fan-out commits `r1` when it finishes, so
    // the run can stop with one child finished and the other not yet run.
    let child_finished = |n: u64| {
        let last = &full[usize::try_from(n).unwrap() - 1];
        matches!(last.data, EventData::LevelFinished(_)) && last.level_id.as_deref() == Some("r1")
    };
    assert!(boundaries.iter().any(|&n| child_finished(n)), "{boundaries:?}");
    for &n in &boundaries {
        let store = Arc::new(MemoryStore::new());
        let cut = usize::try_from(n).unwrap();
        let prefix: Vec<Event> = full[..cut].to_vec();
        store.create_run(&e.store.run(&run).await.unwrap().unwrap(), prefix).await.unwrap();
        let calls = Arc::<Mutex<BTreeMap<String, u32>>>::default();
        let fresh = engine_on(store, Counting { inner: script(SCRIPT), calls: Arc::clone(&calls) });
        to_the_end(&fresh, &run, &s).await;
        let resumed = fresh.store.load(&run, 0).await.unwrap();
        // A stop with a level in flight is a lost driver: the next one records the pause
        // nobody could and its takeover, once; otherwise the log is the same.
        let lost = baton_engine::plan::driver_lost(&s, &fold(&full[..cut]));
        let (resumed, takeovers) = without_takeovers(&resumed);
        assert_eq!(takeovers, usize::from(lost), "stopped after event {n}");
        assert_eq!(resumed, without_takeovers(&full).0, "stopped after event {n}");
        // Nothing in the log is done again: a child that finished before the stop is not
        // called again, whatever its siblings were doing.
        assert_eq!(*calls.lock().unwrap(), answers(&full[cut..]), "stopped after event {n}");
    }
}

#[tokio::test]
async fn folding_in_pieces_equals_folding_at_once() {
    let s = scenario(SCENARIO);
    let e = engine_on(Arc::new(MemoryStore::new()), script(SCRIPT));
    let run = e.start(&s, "go", Map::new()).await.unwrap();
    to_the_end(&e, &run, &s).await;
    let full = e.store.load(&run, 0).await.unwrap();
    let at_once = serde_json::to_value(fold(&full)).unwrap();
    let mut runner = proptest::test_runner::TestRunner::default();
    runner
        .run(&prop::collection::vec(0..full.len(), 0..6), |mut cuts| {
            cuts.sort_unstable();
            let mut state = fold(&full[..cuts.first().copied().unwrap_or(0)]);
            let mut from = cuts.first().copied().unwrap_or(0);
            for &cut in cuts.iter().skip(1).chain(std::iter::once(&full.len())) {
                for e in &full[from..cut.max(from)] {
                    state.apply(e);
                }
                from = cut.max(from);
            }
            prop_assert_eq!(serde_json::to_value(&state).unwrap(), at_once.clone());
            Ok(())
        })
        .unwrap();
}

#[tokio::test]
async fn the_orchestration_state_and_the_session_are_folded_apart() {
    let s = scenario(SCENARIO);
    let e = engine_on(Arc::new(MemoryStore::new()), script(SCRIPT));
    let run = e.start(&s, "go", Map::new()).await.unwrap();
    to_the_end(&e, &run, &s).await;
    let mut log = e.store.load(&run, 0).await.unwrap();
    // A note and a steering message mid-run: events of the session alone.
    let at = log[2].at;
    let note = EventData::ScratchpadWritten(baton_engine::event::ScratchpadWritten {
        key: "seen".to_owned(),
        value: Value::Bool(true),
    });
    let steer = EventData::SteeringReceived(baton_engine::event::SteeringReceived {
        id: "steer-1".to_owned(),
        by: "tester".to_owned(),
        message: "shorter, please".to_owned(),
    });
    for data in [note, steer] {
        log.insert(3, Event { seq: 0, at, level_id: None, attempt: None, data });
    }
    for (n, e) in log.iter_mut().enumerate() {
        e.seq = n as u64 + 1;
    }
    // The state in two parts: the orchestration's (without the count of events) and the
    // session's.
    let parts = |st: &baton_engine::state::RunState| {
        let mut all = serde_json::to_value(st).unwrap();
        let session = serde_json::to_value(&st.session).unwrap();
        let all_map = all.as_object_mut().unwrap();
        for key in session.as_object().unwrap().keys() {
            all_map.remove(key);
        }
        all_map.remove("last_seq");
        (all, session)
    };
    let mut state = baton_engine::state::RunState::default();
    let (mut orchestration_moved, mut session_moved) = (0, 0);
    for ev in &log {
        let before = parts(&state);
        state.apply(ev);
        let after = parts(&state);
        let kind = ev.data.kind();
        match kind {
            "scratchpad_written" | "steering_received" => {
                assert_eq!(before.0, after.0, "{kind} moved the orchestration state");
                assert_ne!(before.1, after.1, "{kind} left the session as it was");
                session_moved += 1;
            }
            "level_started" | "gate_decision" | "prompt_sent" | "routing_decision"
            | "budget_consumed" | "approval_requested" | "approval_decided" | "run_paused"
            | "run_resumed" | "scenario_finished" => {
                assert_eq!(before.1, after.1, "{kind} moved the session");
                orchestration_moved += usize::from(before.0 != after.0);
            }
            _ => {}
        }
    }
    assert_eq!(session_moved, 2);
    assert!(orchestration_moved > 3, "{orchestration_moved}");
    // Folded at once, the same two parts.
    assert_eq!(parts(&fold(&log)), parts(&state));
}

#[tokio::test]
async fn a_scripted_constant_model_runs_a_scenario_end_to_end() {
    let s = scenario(SCENARIO);
    let e =
        engine_on(Arc::new(MemoryStore::new()), ScriptedModel::constant("PASS: fine {\"x\": 1}"));
    let run = e.start(&s, "go", Map::new()).await.unwrap();
    to_the_end(&e, &run, &s).await;
    assert!(e.state(&run).await.unwrap().status.is_final());
}
