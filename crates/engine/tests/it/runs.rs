//! Whole runs on the scripted model over the in-memory store.

use std::time::{Duration, Instant};

use baton_engine::event::EventData;
use baton_engine::model::ScriptedModel;
use baton_engine::{Outcome, Status};
use serde_json::Map;

use crate::{engine, kinds, route, scenario, script};

const LOOP: &str = "
id: loop
version: 1
defaults: {max_attempts_per_conflict: 3}
levels:
  - {id: brief, kind: prompt, prompt: {inline: 'Brief for {{ input }}'}}
  - {id: execute, kind: prompt, prompt: {inline: 'Do it. {% if feedback %}Fix: {{ feedback }}{% endif %}'}}
  - {id: accept, kind: prompt, prompt: {inline: 'Review {{ level.execute.output }}'}, response: verdict, terminal: true}
  - {id: escalate, kind: prompt, prompt: {inline: 'Escalate'}, terminal: true}
edges:
  - {from: brief, to: execute}
  - {from: execute, to: accept}
  - {from: accept, to: __end__, when: \"verdict == 'PASS'\"}
  - {from: accept, to: escalate, when: escalate_now}
  - {from: accept, to: execute}
  - {from: escalate, to: __end__}
";

#[tokio::test]
async fn a_gate_loop_runs_until_the_verdict_passes() {
    let s = scenario(LOOP);
    let model = script(
        "
levels:
  brief: [{text: the brief}]
  execute: [{text: attempt one}, {text: attempt two}]
  accept:
    - {text: \"not yet\\n```control\\n{\\\"verdict\\\": \\\"FAIL\\\"}\\n```\"}
    - {text: \"PASS: good\"}
",
    );
    let e = engine(model);
    let run = e.start(&s, "a CLI", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Completed));
    let log = e.store.load(&run, 0).await.unwrap();
    assert_eq!(
        route(&log),
        vec![
            "brief->execute",
            "execute->accept",
            "accept->execute",
            "execute->accept",
            "accept->__end__"
        ]
    );
    let st = e.state(&run).await.unwrap();
    assert_eq!(st.session.final_output.as_deref(), Some("PASS: good"));
    assert_eq!(st.level("execute").unwrap().attempts, 2);
    let EventData::ScenarioFinished(f) = &log.last().unwrap().data else { panic!() };
    assert_eq!(f.checksum, s.checksum);
    assert_eq!(f.totals.levels_run, 5);
}

#[tokio::test]
async fn repeated_failures_escalate() {
    let s = scenario(LOOP);
    let model = script("levels:\n  accept: [{text: 'FAIL: no'}]\ndefault: {text: work}\n");
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    e.drive(&run, &s).await.unwrap();
    let log = e.store.load(&run, 0).await.unwrap();
    let r = route(&log);
    assert_eq!(r.iter().filter(|x| *x == "accept->execute").count(), 2, "{r:?}");
    assert!(r.contains(&"accept->escalate".to_owned()), "{r:?}");
    assert_eq!(e.state(&run).await.unwrap().session.final_output.as_deref(), Some("work"));
}

#[tokio::test]
async fn an_unreadable_verdict_gets_one_repair_call() {
    let s = scenario(LOOP);
    let model = script(
        "levels:\n  accept: [{text: 'hmm, fine I guess'}, {text: \"ok\\n```control\\n{\\\"verdict\\\": \\\"PASS\\\", \\\"confidence\\\": 0.8}\\n```\"}]\ndefault: {text: work}\n",
    );
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    e.drive(&run, &s).await.unwrap();
    let log = e.store.load(&run, 0).await.unwrap();
    let prompts: Vec<&str> = log
        .iter()
        .filter(|ev| ev.level_id.as_deref() == Some("accept"))
        .filter_map(|ev| match &ev.data {
            EventData::PromptSent(p) => Some(p.prompt.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(prompts.len(), 2);
    assert!(prompts[1].contains("```control"), "the repair spells out the contract");
    let st = e.state(&run).await.unwrap();
    assert_eq!(st.verdict.as_deref(), Some("PASS"));
    assert_eq!(st.confidence, Some(0.8));
}

#[tokio::test]
async fn verifier_failure_feeds_back_and_gates_route_on_it() {
    let dir = std::env::temp_dir().join(format!("baton-verify-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let s = scenario(
        "
id: build
version: 1
levels:
  - {id: work, kind: prompt, prompt: {inline: 'Work. {{ feedback }}'}}
  - id: check
    kind: verifier
    verifiers:
      - {name: build, uses: command, params: {argv: [sh, -c, 'test -f done || { echo missing done >&2; touch done; exit 3; }']}}
  - {id: finish, kind: prompt, prompt: {inline: 'Done'}, terminal: true}
edges:
  - {from: work, to: check}
  - {from: check, to: finish, when: verifier.build.passed}
  - {from: check, to: work}
",
    );
    let mut e = engine(ScriptedModel::constant("ok"));
    std::sync::Arc::get_mut(&mut e.runtime).unwrap().workspace = dir.clone();
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Completed));
    let log = e.store.load(&run, 0).await.unwrap();
    assert_eq!(
        route(&log),
        vec!["work->check", "check->work", "work->check", "check->finish", "finish->__end__"]
    );
    let second_prompt = log
        .iter()
        .filter_map(|ev| match &ev.data {
            EventData::PromptSent(p) if ev.level_id.as_deref() == Some("work") => {
                Some(p.prompt.clone())
            }
            _ => None,
        })
        .nth(1)
        .unwrap();
    assert!(
        second_prompt.contains("missing done"),
        "stderr reaches the next attempt: {second_prompt}"
    );
    let st = e.state(&run).await.unwrap();
    assert!(st.session.scratchpad.get("build_feedback").is_none(), "a pass clears the feedback");
    assert!(
        st.session.scratchpad["build_result_summary"]
            .as_str()
            .unwrap()
            .contains("all 1 verifiers passed")
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn fan_out_children_run_and_aggregate() {
    let s = scenario(
        "
id: fan
version: 1
levels:
  - id: review
    kind: fan_out
    fan_out: [a, b, c]
    fan_in: {aggregator: majority_pass}
    max_parallel: 2
  - {id: a, kind: prompt, prompt: {inline: A}, response: verdict}
  - {id: b, kind: prompt, prompt: {inline: B}, response: verdict}
  - {id: c, kind: prompt, prompt: {inline: C}, response: verdict}
  - {id: sum, kind: prompt, prompt: {inline: \"{{ level.a.verdict }}{{ level.b.verdict }}{{ level.c.verdict }}\"}, terminal: true}
edges:
  - {from: review, to: sum}
",
    );
    let model = script(
        "levels:\n  a: [{text: PASS, delay_ms: 30}]\n  b: [{text: FAIL}]\n  c: [{text: PASS}]\n  sum: [{text: summary}]\n",
    );
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Completed));
    let log = e.store.load(&run, 0).await.unwrap();
    let k = kinds(&log);
    let firsts: Vec<&String> = k.iter().filter(|x| x.starts_with("level_started:")).collect();
    // Each child is committed as it settles: `b` at once, `c` in the slot it freed, `a`
    // (the slowest, so the last) with the fan-out's result.
    assert_eq!(
        firsts,
        vec![
            "level_started:review",
            "level_started:b",
            "level_started:c",
            "level_started:a",
            "level_started:sum"
        ],
        "children commit in the order they settle"
    );
    let a_done = k.iter().position(|x| x == "level_finished:a").unwrap();
    assert_eq!(k[a_done + 1], "level_finished:review", "the last child ends with the fan-out");
    let st = e.state(&run).await.unwrap();
    assert_eq!(st.level("review").unwrap().verdict.as_deref(), Some("PASS"));
    assert_eq!(st.level("review").unwrap().output, "2 of 3 children passed (majority_pass): PASS");
}

const APPROVAL: &str = "
id: appr
version: 1
levels:
  - {id: draft, kind: prompt, prompt: {inline: 'Draft'}}
  - {id: approve, kind: human_approval, approver_role: lead, prompt: {inline: 'Ship {{ level.draft.output }}?'}}
  - {id: final, kind: prompt, prompt: {inline: 'Final'}, terminal: true}
edges:
  - {from: draft, to: approve}
  - {from: approve, to: final, when: level.approve.approved}
  - {from: approve, to: draft}
";

#[tokio::test]
async fn approval_pauses_resumes_and_is_decided_once() {
    let s = scenario(APPROVAL);
    let e = engine(ScriptedModel::constant("text"));
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Paused);
    assert_eq!(e.store.run(&run).await.unwrap().unwrap().status, "paused");
    let st = e.state(&run).await.unwrap();
    assert_eq!(st.pending_approvals[0].request.question, "Ship text?");

    // Rejected once: back to the draft, and a new request.
    e.approve(&run, false, Some("redo".into()), Some("ann".into())).await.unwrap();
    assert!(
        e.approve(&run, true, None, None).await.is_err(),
        "a second decision for one request is refused"
    );
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Paused);
    // A fresh engine over the same store continues, as a restart would.
    let e2 = crate::engine_on(std::sync::Arc::clone(&e.store), ScriptedModel::constant("text"));
    e2.approve(&run, true, None, Some("bob".into())).await.unwrap();
    assert_eq!(e2.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Completed));
    let log = e2.store.load(&run, 0).await.unwrap();
    assert_eq!(
        route(&log),
        vec![
            "draft->approve",
            "approve->draft",
            "draft->approve",
            "approve->final",
            "final->__end__"
        ]
    );
    assert_eq!(e2.state(&run).await.unwrap().tracker.get("human_approval:approve"), Some(&1));
    assert!(e2.approve(&run, true, None, None).await.is_err(), "nothing to approve after the end");
}

#[tokio::test]
async fn ask_user_pauses_until_answered() {
    let s = scenario(
        "
id: ask
version: 1
levels:
  - {id: pick, kind: prompt, prompt: {inline: 'Pick'}, response: json, terminal: true}
",
    );
    let model = script(
        "levels:\n  pick: [{text: '{\"ask_user\": {\"question\": \"which?\", \"enum\": [\"a\", \"b\"]}}'}, {text: '{\"choice\": \"b\"}'}]\n",
    );
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Paused);
    e.answer(&run, serde_json::json!("b")).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Completed));
    let st = e.state(&run).await.unwrap();
    assert_eq!(st.level("pick").unwrap().parsed, Some(serde_json::json!({"choice": "b"})));
    let log = e.store.load(&run, 0).await.unwrap();
    let last_prompt = log.iter().rev().find_map(|ev| match &ev.data {
        EventData::PromptSent(p) => Some(p.prompt.clone()),
        _ => None,
    });
    assert!(last_prompt.unwrap().contains("The user answered your questions: [\"b\"]"));
}

#[tokio::test]
async fn the_cost_cap_is_checked_before_a_call() {
    let s = scenario(
        "
id: cap
version: 1
budget: {max_cost_usd: 0.05}
levels:
  - {id: a, kind: prompt, prompt: {inline: A}}
  - {id: b, kind: prompt, prompt: {inline: B}, terminal: true}
edges:
  - {from: a, to: b}
",
    );
    let model =
        script("levels:\n  a: [{text: x, cost_usd: 0.03}]\n  b: [{text: y, cost_usd: 0.03}]\n");
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Aborted));
    let log = e.store.load(&run, 0).await.unwrap();
    let refused = log.iter().find_map(|ev| match &ev.data {
        EventData::BudgetExceeded(b) => Some(b.clone()),
        _ => None,
    });
    let refused = refused.unwrap();
    assert!(refused.refused_before_call);
    assert!((refused.observed_value - 0.06).abs() < 1e-9);
    let st = e.state(&run).await.unwrap();
    assert!((st.totals.cost_usd - 0.03).abs() < 1e-9, "b was never called");
    assert!(st.level("b").unwrap().skipped);
}

#[tokio::test]
async fn the_token_cap_aborts_after_the_level_that_crossed_it() {
    let s = scenario(
        "
id: tok
version: 1
budget: {max_tokens: 100}
levels:
  - {id: a, kind: prompt, prompt: {inline: A}}
  - {id: b, kind: prompt, prompt: {inline: B}, terminal: true}
edges:
  - {from: a, to: b}
",
    );
    let model = script("default: {text: x, usage: {input_tokens: 90, output_tokens: 20}}\n");
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Aborted));
    let st = e.state(&run).await.unwrap();
    assert_eq!(st.aborted_reason.as_deref(), Some("budget_exceeded:tokens"));
    assert!(st.level("b").is_none(), "no level runs after the cap");
}

#[tokio::test]
async fn cancel_while_paused_ends_the_run() {
    let s = scenario(APPROVAL);
    let e = engine(ScriptedModel::constant("text"));
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Paused);
    e.cancel(&run, Some("ann".into()), None).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Cancelled));
    assert!(e.cancel(&run, None, None).await.is_err(), "a finished run cannot be cancelled");
}

#[tokio::test]
async fn cancel_before_the_first_level() {
    let s = scenario(LOOP);
    let e = engine(ScriptedModel::constant("x"));
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    e.cancel(&run, None, Some("changed my mind".into())).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Cancelled));
    assert_eq!(e.state(&run).await.unwrap().level_runs, 0);
}

#[tokio::test]
async fn cancel_mid_model_call_stops_within_the_poll() {
    let s = scenario(LOOP);
    let model = script("levels:\n  brief: [{text: slow, delay_ms: 20000}]\n");
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    let driver = {
        let (e, s, run) = (e.clone(), std::sync::Arc::clone(&s), run.clone());
        tokio::spawn(async move { e.drive(&run, &s).await })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let t = Instant::now();
    e.cancel(&run, None, None).await.unwrap();
    let outcome =
        tokio::time::timeout(Duration::from_secs(5), driver).await.unwrap().unwrap().unwrap();
    assert_eq!(outcome, Outcome::Finished(Status::Cancelled));
    assert!(t.elapsed() < Duration::from_millis(1000), "stopped in {:?}", t.elapsed());
    let log = e.store.load(&run, 0).await.unwrap();
    assert!(
        !log.iter().any(|ev| matches!(ev.data, EventData::ModelResponse(_))),
        "the cut call left no response"
    );
}

/// A run whose first level waits 20 s on its model, being driven over [`crate::Noticing`]:
/// the store, the engine, the run and its driver.
async fn driving_a_slow_call_over_a_noticing_store() -> (
    std::sync::Arc<crate::Noticing>,
    baton_engine::Engine,
    String,
    tokio::task::JoinHandle<Result<Outcome, baton_engine::exec::Error>>,
) {
    let s = scenario(LOOP);
    let model = script("levels:\n  brief: [{text: slow, delay_ms: 20000}]\n");
    let store = std::sync::Arc::new(crate::Noticing::default());
    let e = crate::engine_on(store.clone(), model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    let driver = {
        let (e, run) = (e.clone(), run.clone());
        tokio::spawn(async move { e.drive(&run, &s).await })
    };
    (store, e, run, driver)
}

/// A step waiting on a long model call, over a store whose notice covers every process,
/// reads the store only when notified (its own `prompt_sent` and heartbeat), not ten times
/// a second, and a cancel reaches it at once, by the notice.
#[tokio::test]
async fn a_step_over_a_store_that_notices_every_process_reads_it_when_notified() {
    let (store, e, run, driver) = driving_a_slow_call_over_a_noticing_store().await;
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let looks = store.looks.load(std::sync::atomic::Ordering::Relaxed);
    assert!(looks <= 3, "{looks} reads in 3.1 s of a waiting step");
    let t = Instant::now();
    e.cancel(&run, None, None).await.unwrap();
    let outcome =
        tokio::time::timeout(Duration::from_secs(5), driver).await.unwrap().unwrap().unwrap();
    assert_eq!(outcome, Outcome::Finished(Status::Cancelled));
    assert!(t.elapsed() < Duration::from_millis(500), "stopped in {:?}", t.elapsed());
}

/// When the notices are lost (a broken listen connection), the step's next heartbeat — an
/// append conditional on the log's end — finds the cancel: the run stops within a
/// heartbeat period, and nothing polls meanwhile.
#[tokio::test]
async fn a_cancel_whose_notice_was_lost_is_found_by_the_next_heartbeat() {
    let (store, e, run, driver) = driving_a_slow_call_over_a_noticing_store().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    store.lost.store(true, std::sync::atomic::Ordering::Relaxed);
    let t = Instant::now();
    e.cancel(&run, None, None).await.unwrap();
    let outcome =
        tokio::time::timeout(Duration::from_secs(10), driver).await.unwrap().unwrap().unwrap();
    assert_eq!(outcome, Outcome::Finished(Status::Cancelled));
    let every = baton_engine::exec::HEARTBEAT_EVERY;
    assert!(t.elapsed() < every * 3 / 2, "stopped in {:?}", t.elapsed());
    assert!(store.looks.load(std::sync::atomic::Ordering::Relaxed) <= 1);
}

#[tokio::test]
async fn cancel_mid_fan_out() {
    let s = scenario(
        "
id: fan
version: 1
levels:
  - {id: f, kind: fan_out, fan_out: [a, b], fan_in: {aggregator: all_pass}}
  - {id: a, kind: prompt, prompt: {inline: A}}
  - {id: b, kind: prompt, prompt: {inline: B}}
",
    );
    let model = script("levels:\n  a: [{text: x}]\n  b: [{text: y, delay_ms: 20000}]\n");
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    let driver = {
        let (e, s, run) = (e.clone(), std::sync::Arc::clone(&s), run.clone());
        tokio::spawn(async move { e.drive(&run, &s).await })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    e.cancel(&run, None, None).await.unwrap();
    let outcome =
        tokio::time::timeout(Duration::from_secs(5), driver).await.unwrap().unwrap().unwrap();
    assert_eq!(outcome, Outcome::Finished(Status::Cancelled));
    // The child that finished before the cancel stays in the log; the one cut does not.
    let k = kinds(&e.store.load(&run, 0).await.unwrap());
    for kept in ["level_started:a", "model_response:a", "level_finished:a"] {
        assert!(k.iter().any(|x| x == kept), "{kept} missing: {k:?}");
    }
    assert!(!k.iter().any(|x| x.ends_with(":b")), "{k:?}");
    let st = e.state(&run).await.unwrap();
    assert_eq!(st.level("a").unwrap().output, "x");
    assert!(st.level("f").unwrap().skipped);
}

#[tokio::test]
async fn a_model_failure_fails_the_run_with_the_reason() {
    let s = scenario(LOOP);
    let model = script("levels:\n  brief: [{error: upstream said 500}]\n");
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Failed));
    let st = e.state(&run).await.unwrap();
    let reason = st.finished.unwrap().aborted_reason.unwrap();
    assert!(reason.contains("upstream said 500"), "{reason}");
}

#[tokio::test]
async fn an_answer_cut_at_the_output_limit_is_recorded_and_never_a_success() {
    let s = scenario(LOOP);
    // Every level answers, but the brief was cut at max_tokens mid-JSON.
    let model = script(
        "levels:\n  brief: [{text: '{\"answer\": \"Par', stop_reason: max_tokens}]\n  accept: [{text: PASS}]\ndefault: {text: work}\n",
    );
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Failed));
    let log = e.store.load(&run, 0).await.unwrap();
    let stopped: Vec<_> = log
        .iter()
        .filter_map(|ev| match &ev.data {
            EventData::ModelStopped(m) => {
                Some((ev.level_id.clone(), m.call, m.stop_reason.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(stopped, vec![(Some("brief".to_owned()), 0, "max_tokens".to_owned())]);
    let k = kinds(&log);
    let at = k.iter().position(|k| k == "model_stopped:brief").unwrap();
    assert_eq!(k[at - 1], "model_response:brief", "recorded right after the response: {k:?}");
    let reason = e.state(&run).await.unwrap().finished.unwrap().aborted_reason.unwrap();
    assert!(reason.contains("cut at the output limit"), "{reason}");
    assert!(!k.contains(&"level_started:execute".to_owned()), "the cut brief did not pass: {k:?}");
}

/// A model that reports one HTTP-level retry before each answer, as the real client does.
#[derive(Debug)]
struct RetryingModel(ScriptedModel);

impl baton_engine::model::ModelProvider for RetryingModel {
    fn call<'a>(
        &'a self,
        request: &'a baton_engine::model::ModelRequest,
        cancel: &'a baton_engine::cancel::CancelToken,
    ) -> baton_engine::model::BoxFuture<
        'a,
        Result<baton_engine::model::ModelReply, baton_engine::model::ModelError>,
    > {
        cancel.progress().retried(
            &request.level_id,
            request.call_index,
            baton_engine::event::ProviderRetry {
                provider: "p".to_owned(),
                model: "m".to_owned(),
                attempt: 1,
                reason: "p (m): HTTP 503: busy".to_owned(),
                wait_ms: 250,
            },
        );
        self.0.call(request, cancel)
    }

    fn worst_case_cost_usd(&self, request: &baton_engine::model::ModelRequest) -> f64 {
        self.0.worst_case_cost_usd(request)
    }
}

#[tokio::test]
async fn every_http_level_retry_is_an_event_of_its_level() {
    let s = scenario(LOOP);
    let model = script("levels:\n  accept: [{text: PASS}]\ndefault: {text: work}\n");
    let e = engine(RetryingModel(model));
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Completed));
    let log = e.store.load(&run, 0).await.unwrap();
    let k = kinds(&log);
    for level in ["brief", "execute", "accept"] {
        let retry = k.iter().position(|k| *k == format!("provider_retry:{level}")).unwrap();
        assert_eq!(k[retry + 1], format!("model_response:{level}"), "{k:?}");
    }
    let retry = log.iter().find_map(|ev| match &ev.data {
        EventData::ProviderRetry(r) => Some(r.clone()),
        _ => None,
    });
    assert_eq!(retry.map(|r| (r.attempt, r.wait_ms)), Some((1, 250)));
}

#[tokio::test]
async fn a_run_resumed_with_changed_scenario_files_is_refused() {
    let s = scenario(LOOP);
    let e = engine(ScriptedModel::constant("x"));
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    let changed = scenario(&LOOP.replace("Escalate", "Escalate now"));
    let err = e.drive(&run, &changed).await.unwrap_err();
    assert!(err.to_string().contains("checksum"), "{err}");
}

#[tokio::test]
async fn a_quick_run_costs_one_transaction_per_level() {
    use baton_engine::Engine;
    let s = scenario(LOOP);
    let model = script("levels:\n  accept: [{text: 'PASS'}]\ndefault: {text: work}\n");
    let store = std::sync::Arc::new(crate::Observed::default());
    let e = crate::engine_on(store.clone(), model);
    let run = Engine::new_run_id();
    assert_eq!(
        e.run(&run, &s, "x", Map::new(), None).await.unwrap(),
        Outcome::Finished(Status::Completed)
    );
    let levels = e.state(&run).await.unwrap().totals.levels_run;
    assert_eq!(levels, 3);
    assert_eq!(
        store.writes(),
        3,
        "brief, execute, accept: one transaction each, the run's creation and end included"
    );
}

#[tokio::test]
async fn a_slow_first_level_is_visible_before_it_ends() {
    use baton_engine::Engine;
    let s = scenario(LOOP);
    let model = script(
        "levels:\n  brief: [{text: slow, delay_ms: 300}]\n  accept: [{text: PASS}]\ndefault: {text: work}\n",
    );
    let e = engine(model);
    let run = Engine::new_run_id();
    let driver = {
        let (e, s, run) = (e.clone(), std::sync::Arc::clone(&s), run.clone());
        tokio::spawn(async move { e.run(&run, &s, "x", Map::new(), None).await })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let seen = e.store.load(&run, 0).await.unwrap();
    assert_eq!(kinds(&seen), vec!["scenario_started", "level_started:brief"]);
    assert_eq!(driver.await.unwrap().unwrap(), Outcome::Finished(Status::Completed));
}

#[tokio::test]
async fn a_json_answer_is_checked_against_its_schema_with_one_repair() {
    let s = scenario(
        "
id: js
version: 1
levels:
  - id: answer
    kind: prompt
    prompt: {inline: 'Answer'}
    response: {json: {schema: {type: object, required: [answer], properties: {answer: {type: string}}}}}
    verifiers:
      - {name: shape, uses: schema, params: {schema: {type: object, required: [sources]}}, on_fail: ignore}
    terminal: true
",
    );
    let model = script(
        "levels:\n  answer: [{text: '{\"answr\": 1}'}, {text: '{\"answer\": \"Paris\"}'}]\n",
    );
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Completed));
    let log = e.store.load(&run, 0).await.unwrap();
    let prompts: Vec<String> = log
        .iter()
        .filter_map(|ev| match &ev.data {
            EventData::PromptSent(p) => Some(p.prompt.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(prompts.len(), 2);
    assert!(prompts[1].contains("\"answer\" is a required property"), "{}", prompts[1]);
    let st = e.state(&run).await.unwrap();
    assert_eq!(st.level("answer").unwrap().parsed, Some(serde_json::json!({"answer": "Paris"})));
    let shape = &st.level("answer").unwrap().verifiers["shape"];
    assert!(!shape.passed && shape.reasons[0].contains("sources"), "{:?}", shape.reasons);
    assert_eq!(st.verdict, None, "an ignored verifier does not change the verdict");
}

#[tokio::test]
async fn a_json_answer_that_stays_wrong_fails_the_level() {
    let s = scenario(
        "
id: js2
version: 1
levels:
  - {id: answer, kind: prompt, prompt: {inline: A}, response: {json: {schema: {type: object, required: [answer]}}}, terminal: true}
",
    );
    let e = engine(ScriptedModel::constant("not json at all"));
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    e.drive(&run, &s).await.unwrap();
    let st = e.state(&run).await.unwrap();
    assert_eq!(st.verdict.as_deref(), Some("FAIL"));
    assert!(st.session.scratchpad["feedback"].as_str().unwrap().contains("not valid JSON"));
}

#[tokio::test]
async fn the_duration_cap_stops_the_step_that_crosses_it() {
    let s = scenario(
        "
id: slow
version: 1
budget: {max_duration_s: 0.2}
levels:
  - {id: a, kind: prompt, prompt: {inline: A}}
  - {id: b, kind: prompt, prompt: {inline: B}, terminal: true}
edges:
  - {from: a, to: b}
",
    );
    let model = script("levels:\n  a: [{text: x, delay_ms: 350}]\n  b: [{text: y}]\n");
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Aborted));
    let st = e.state(&run).await.unwrap();
    assert_eq!(st.aborted_reason.as_deref(), Some("budget_exceeded:duration"));
    assert!(st.level("b").is_none());
    let log = e.store.load(&run, 0).await.unwrap();
    let consumed = log.iter().find_map(|ev| match &ev.data {
        EventData::BudgetConsumed(b) => Some(b.total_duration_ms),
        _ => None,
    });
    let consumed = consumed.unwrap();
    assert!((200..350).contains(&consumed), "cut at the cap, not at the answer: {consumed} ms");
    assert!(
        !log.iter().any(|ev| matches!(ev.data, EventData::ModelResponse(_))),
        "the cut call answered"
    );
}

#[tokio::test]
async fn a_retry_verifier_asks_again_and_says_so() {
    let s = scenario(
        "
id: retry
version: 1
levels:
  - id: answer
    kind: prompt
    prompt: {inline: 'Answer'}
    response: json
    verifiers:
      - {name: shape, uses: schema, params: {schema: {type: object, required: [answer]}}, on_fail: retry, max_retries: 2}
    terminal: true
",
    );
    let model = script(
        "levels:\n  answer: [{text: '{}'}, {text: '{\"nope\": 1}'}, {text: '{\"answer\": 42}'}]\n",
    );
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    e.drive(&run, &s).await.unwrap();
    let log = e.store.load(&run, 0).await.unwrap();
    let retries: Vec<(u32, u32)> = log
        .iter()
        .filter_map(|ev| match &ev.data {
            EventData::RetryScheduled(r) => Some((r.retry, r.retries_max)),
            _ => None,
        })
        .collect();
    assert_eq!(retries, vec![(1, 2), (2, 2)]);
    let st = e.state(&run).await.unwrap();
    assert!(st.level("answer").unwrap().verifiers["shape"].passed);
    assert_eq!(st.verdict, None);
}

#[tokio::test]
async fn one_scenario_loaded_from_two_directories_runs_from_either() {
    // Compiled templates are cached by checksum, which ignores where the files live.
    let first = scenario(LOOP);
    let second = scenario(LOOP);
    assert_eq!(first.checksum, second.checksum);
    let model = script("levels:\n  accept: [{text: PASS}]\ndefault: {text: work}\n");
    let e = engine(model);
    for s in [&first, &second] {
        let run = e.start(s, "x", Map::new()).await.unwrap();
        assert_eq!(e.drive(&run, s).await.unwrap(), Outcome::Finished(Status::Completed));
    }
}

const RESERVED: &str = "
id: reserved
version: 1
budget: {max_cost_usd: 0.01}
levels:
  - {id: f, kind: fan_out, fan_out: [a, b, c], fan_in: {aggregator: all_pass}, max_parallel: PARALLEL}
  - {id: a, kind: prompt, prompt: {inline: A}}
  - {id: b, kind: prompt, prompt: {inline: B}}
  - {id: c, kind: prompt, prompt: {inline: C}}
  - {id: after, kind: prompt, prompt: {inline: Z}, terminal: true}
edges:
  - {from: f, to: after}
";

/// The model calls a log holds, by level.
fn responses(log: &[baton_engine::event::Event]) -> Vec<String> {
    log.iter()
        .filter(|ev| matches!(ev.data, EventData::ModelResponse(_)))
        .filter_map(|ev| ev.level_id.clone())
        .collect()
}

#[tokio::test]
async fn fan_out_children_reserve_their_worst_case_against_the_shared_budget() {
    let s = scenario(&RESERVED.replace("PARALLEL", "3"));
    // Each child alone fits the cap, and all three start at once: each reserves its worst
    // case before calling, so the third is refused before its call.
    let model = script(
        "levels:\n  a: [{text: x, cost_usd: 0.004, worst_case_usd: 0.004, delay_ms: 20}]\n  b: [{text: y, cost_usd: 0.004, worst_case_usd: 0.004, delay_ms: 20}]\n  c: [{text: z, cost_usd: 0.004, worst_case_usd: 0.004, delay_ms: 20}]\n  after: [{text: never}]\n",
    );
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Aborted));
    let log = e.store.load(&run, 0).await.unwrap();
    assert_eq!(responses(&log), ["a", "b"], "exactly two children were called");
    let st = e.state(&run).await.unwrap();
    assert!(st.totals.cost_usd <= 0.01, "{}", st.totals.cost_usd);
    assert!((st.totals.cost_usd - 0.008).abs() < 1e-9);
    assert_eq!(st.aborted_reason.as_deref(), Some("budget_exceeded:cost"));
    let refused: Vec<_> = log
        .iter()
        .filter_map(|ev| match &ev.data {
            EventData::BudgetExceeded(b) => Some((ev.level_id.clone(), b.clone())),
            _ => None,
        })
        .collect();
    let [(Some(level), exceeded)] = &refused[..] else { panic!("{refused:?}") };
    assert_eq!(level, "c");
    assert!(exceeded.refused_before_call);
    assert!((exceeded.observed_value - 0.012).abs() < 1e-9, "{exceeded:?}");
    assert!(st.level("after").is_none());
}

#[tokio::test]
async fn a_reservation_shrinks_to_what_the_call_cost() {
    let s = scenario(&RESERVED.replace("PARALLEL", "1"));
    // The worst case of each call is 0.006, but each costs 0.001: one after another, each
    // child's reservation is released down to its cost, so all three fit under 0.01.
    let model = script(
        "levels:\n  a: [{text: x, cost_usd: 0.001, worst_case_usd: 0.006}]\n  b: [{text: y, cost_usd: 0.001, worst_case_usd: 0.006}]\n  c: [{text: z, cost_usd: 0.001, worst_case_usd: 0.006}]\n  after: [{text: done}]\n",
    );
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Completed));
    let log = e.store.load(&run, 0).await.unwrap();
    assert_eq!(responses(&log), ["a", "b", "c", "after"]);
}

const RUBRIC: &str = "---\nid: clarity_v1\npass_threshold: 0.7\ncriteria:\n  - {id: accuracy, weight: 2, description: every claim holds}\n  - {id: tone, weight: 1, description: plain words}\n---\nJudge the answer for a general reader.\n";

const JUDGED: &str = "
id: judged
version: 1
budget: {max_cost_usd: 1.0}
levels:
  - id: answer
    kind: prompt
    prompt: {inline: 'Answer {{ input }}'}
    verifiers:
      - {name: clarity, uses: llm_judge, params: {rubric: clarity_v1}, on_fail: retry, max_retries: 1}
    terminal: true
";

#[tokio::test]
async fn an_llm_judge_scores_against_its_rubric_and_its_call_is_in_the_log() {
    let s = crate::scenario_with(JUDGED, &[("rubrics/clarity_v1.md", RUBRIC)]);
    let model = script(
        "levels:\n  answer:\n    - {text: 'first answer', cost_usd: 0.01}\n    - {text: '{\"scores\": {\"accuracy\": 0.5, \"tone\": 1.0}, \"reasons\": {\"accuracy\": \"one claim is wrong\"}}', cost_usd: 0.002}\n    - {text: 'second answer', cost_usd: 0.01}\n    - {text: '{\"scores\": {\"accuracy\": 0.9, \"tone\": 0.9}}', cost_usd: 0.002}\n",
    );
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Completed));
    let log = e.store.load(&run, 0).await.unwrap();
    let outcomes: Vec<(bool, f64, Vec<String>)> = log
        .iter()
        .filter_map(|ev| match &ev.data {
            EventData::VerifierFinished(v) => Some((v.passed, v.score.unwrap(), v.reasons.clone())),
            _ => None,
        })
        .collect();
    // (2 × 0.5 + 1 × 1.0) / 3 = 0.667 < 0.7: fails and says why; the retry passes.
    assert!(!outcomes[0].0 && (outcomes[0].1 - 2.0 / 3.0).abs() < 1e-9, "{outcomes:?}");
    assert_eq!(outcomes[0].2, vec!["accuracy 0.50: one claim is wrong"]);
    assert!(outcomes[1].0 && (outcomes[1].1 - 0.9).abs() < 1e-9);
    let judge_prompts = log
        .iter()
        .filter(
            |ev| matches!(&ev.data, EventData::PromptSent(p) if p.template == "judge:clarity_v1"),
        )
        .count();
    assert_eq!(judge_prompts, 2, "each judge call is a recorded model call");
    let st = e.state(&run).await.unwrap();
    assert!(
        (st.totals.cost_usd - 0.024).abs() < 1e-9,
        "judge costs count once: {}",
        st.totals.cost_usd
    );
    assert_eq!(st.session.final_output.as_deref(), Some("second answer"));
}

#[tokio::test]
async fn a_judge_that_does_not_answer_with_scores_fails_closed() {
    let s = crate::scenario_with(
        &JUDGED.replace(", on_fail: retry, max_retries: 1", ""),
        &[("rubrics/clarity_v1.md", RUBRIC)],
    );
    let model = script("levels:\n  answer: [{text: 'an answer'}, {text: 'looks fine to me'}]\n");
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    e.drive(&run, &s).await.unwrap();
    let st = e.state(&run).await.unwrap();
    let clarity = &st.level("answer").unwrap().verifiers["clarity"];
    assert!(
        !clarity.passed && clarity.reasons[0].contains("did not answer"),
        "{:?}",
        clarity.reasons
    );
    assert_eq!(st.verdict.as_deref(), Some("FAIL"));
}

#[tokio::test]
async fn a_long_step_writes_heartbeats_while_it_runs() {
    let s = scenario(LOOP);
    let model = script(
        "levels:\n  brief: [{text: slow, delay_ms: 2300}]\n  accept: [{text: PASS}]\ndefault: {text: work}\n",
    );
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Completed));
    let log = e.store.load(&run, 0).await.unwrap();
    let k = kinds(&log);
    let beat = k.iter().position(|x| x == "heartbeat:brief").expect("a heartbeat while brief ran");
    let done = k.iter().position(|x| x == "level_finished:brief").unwrap();
    assert!(beat < done, "{k:?}");
    assert_eq!(e.state(&run).await.unwrap().session.final_output.as_deref(), Some("PASS"));
}

#[tokio::test]
async fn max_level_runs_is_a_scenario_setting() {
    let s = scenario(
        "
id: spin
version: 1
budget: {max_level_runs: 3}
levels:
  - {id: a, kind: prompt, prompt: {inline: 'again'}, response: verdict}
edges:
  - {from: a, to: __end__, when: \"verdict == 'PASS'\"}
  - {from: a, to: a}
",
    );
    let model =
        script("levels:\n  a: [{text: 'FAIL: no'}, {text: 'FAIL: no'}, {text: 'PASS: yes'}]\n");
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    // The third run of `a` passes and routes to the end: within the limit, completed.
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Completed));
    assert_eq!(e.state(&run).await.unwrap().level_runs, 3);

    let model = script("levels:\n  a: [{text: 'FAIL: no'}]\n");
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Finished(Status::Aborted));
    let st = e.state(&run).await.unwrap();
    assert_eq!(st.level_runs, 3, "the fourth run of `a` is not started");
    assert_eq!(st.finished.unwrap().aborted_reason.as_deref(), Some("level_run_limit"));
}

#[tokio::test]
async fn a_judge_whose_models_are_unavailable_interrupts_its_level_instead_of_failing_it() {
    let s = crate::scenario_with(JUDGED, &[("rubrics/clarity_v1.md", RUBRIC)]);
    let model = script(
        "levels:\n  answer:\n    - {text: 'first answer', cost_usd: 0.01}\n    - {unavailable: 'HTTP 503 from every provider'}\n",
    );
    let e = engine(model);
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    let Outcome::Interrupted(reason) = e.drive(&run, &s).await.unwrap() else {
        panic!("the run should be interrupted")
    };
    assert!(reason.contains("HTTP 503"), "{reason}");
    let st = e.state(&run).await.unwrap();
    assert_eq!(st.status, Status::Interrupted);
    assert_eq!(st.interrupted.as_ref().unwrap().cause, "provider_unavailable");
    let log = e.store.load(&run, 0).await.unwrap();
    assert!(
        !log.iter().any(|ev| matches!(ev.data, EventData::LevelFinished(_))),
        "an outage neither fails nor passes the level: {:?}",
        kinds(&log)
    );
    assert!((st.totals.cost_usd - 0.01).abs() < 1e-9, "the answer's spend is kept");
}
