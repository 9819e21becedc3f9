//! The planner, pure: given these events, the next step is this.

use baton_engine::event::*;
use baton_engine::plan::{Step, plan};
use baton_engine::{Status, fold};
use chrono::Utc;

use crate::scenario;

const TWO: &str = "
id: two
version: 1
budget: {max_cost_usd: 1.0}
levels:
  - {id: a, kind: prompt, prompt: {inline: 'A {{ input }}'}, response: verdict}
  - {id: b, kind: prompt, prompt: {inline: 'B'}, terminal: true}
edges:
  - {from: a, to: b, when: \"verdict == 'PASS'\"}
  - {from: a, to: a}
";

fn log(events: Vec<NewEvent>) -> Vec<Event> {
    events.into_iter().enumerate().map(|(i, e)| e.at(i as u64 + 1, Utc::now())).collect()
}

fn started() -> NewEvent {
    NewEvent::run(EventData::ScenarioStarted(Box::new(ScenarioStarted {
        scenario_id: "two".into(),
        scenario_version: 1,
        checksum: "x".into(),
        input: "hi".into(),
        metadata: serde_json::Map::new(),
        budget: BudgetCaps {
            max_cost_usd: Some(1.0),
            max_tokens: None,
            max_duration_s: None,
            max_level_runs: None,
            tree_max_cost_usd: None,
        },
        max_attempts_per_conflict: 3,
        model_source: None,
        workspace: None,
        gate_semantics: baton_scenario::expr::Semantics::CURRENT,
        failures_routed: true,
        parent: None,
        tenant: None,
        process: None,
    })))
}

fn level_started(id: &str, attempt: u32) -> NewEvent {
    NewEvent::level(
        id,
        attempt,
        EventData::LevelStarted(LevelStarted {
            role: id.into(),
            kind: "prompt".into(),
            parent: None,
            model_constraint_allow: None,
            process: None,
        }),
    )
}

fn finished(id: &str, attempt: u32, verdict: Option<&str>, cost: f64) -> NewEvent {
    NewEvent::level(
        id,
        attempt,
        EventData::LevelFinished(Box::new(LevelFinished {
            ok: true,
            skipped: false,
            verdict: verdict.map(str::to_owned),
            output: format!("{id} out"),
            parsed: None,
            confidence: None,
            scratchpad: serde_json::Map::new(),
            conflict: (verdict == Some("FAIL")).then(|| id.to_owned()),
            error: None,
            error_kind: None,
            cost_usd: cost,
            tokens: 0,
            duration_ms: 0,
            terminal: id == "b",
            touched_paths: Vec::new(),
            snapshot: None,
        })),
    )
}

fn model_response(id: &str, attempt: u32, cost: f64) -> NewEvent {
    NewEvent::level(
        id,
        attempt,
        EventData::ModelResponse(ModelResponse {
            provider: "scripted".into(),
            model: "script".into(),
            request_hash: String::new(),
            call: 0,
            text: "PASS".into(),
            tool_calls: Vec::new(),
            usage: Usage { input_tokens: 1, output_tokens: 1 },
            cost_usd: cost,
        }),
    )
}

fn gate(source: &str, target: &str) -> NewEvent {
    NewEvent::run(EventData::GateDecision(GateDecision {
        source: source.into(),
        target: target.into(),
        expression: None,
        readings: Vec::new(),
        fallthrough: false,
    }))
}

fn appended(step: Step) -> Vec<EventData> {
    match step {
        Step::Append(events) => events.into_iter().map(|e| e.data).collect(),
        other => panic!("expected events to append, got {other:?}"),
    }
}

#[test]
fn a_new_run_starts_at_the_entry() {
    let s = scenario(TWO);
    let step = plan(&s, &fold(&log(vec![started()])));
    let events = appended(step);
    assert!(matches!(&events[..], [EventData::LevelStarted(_)]));
}

#[test]
fn a_started_level_is_run() {
    let s = scenario(TWO);
    let step = plan(&s, &fold(&log(vec![started(), level_started("a", 1)])));
    assert_eq!(step, Step::Run { level: 0, attempt: 1 });
}

#[test]
fn a_pass_verdict_takes_the_first_edge_and_records_what_it_read() {
    let s = scenario(TWO);
    let events = appended(plan(
        &s,
        &fold(&log(vec![started(), level_started("a", 1), finished("a", 1, Some("PASS"), 0.0)])),
    ));
    let [EventData::GateDecision(g)] = &events[..] else { panic!("{events:?}") };
    assert_eq!((g.source.as_str(), g.target.as_str()), ("a", "b"));
    assert_eq!(g.expression.as_deref(), Some("verdict == 'PASS'"));
    assert_eq!(g.readings[0].path, "verdict");
    assert_eq!(g.readings[0].value, serde_json::json!("PASS"));
}

#[test]
fn a_fail_verdict_falls_to_the_default_edge() {
    let s = scenario(TWO);
    let events = appended(plan(
        &s,
        &fold(&log(vec![started(), level_started("a", 1), finished("a", 1, Some("FAIL"), 0.0)])),
    ));
    let [EventData::GateDecision(g), EventData::RetryAttempted(r)] = &events[..] else {
        panic!("{events:?}")
    };
    assert_eq!(g.target, "a");
    // The default edge sends `a` back to itself: a retry, with why.
    assert_eq!((r.level.as_str(), r.attempt, r.reason.as_str()), ("a", 2, "verdict FAIL"));
}

#[test]
fn a_gate_target_is_started_with_the_next_attempt() {
    let s = scenario(TWO);
    let st = fold(&log(vec![
        started(),
        level_started("a", 1),
        finished("a", 1, Some("FAIL"), 0.0),
        gate("a", "a"),
    ]));
    let events = plan(&s, &st);
    let Step::Append(events) = events else { panic!() };
    assert_eq!(events[0].attempt, Some(2));
}

#[test]
fn the_end_finishes_the_run_with_the_terminal_output() {
    let s = scenario(TWO);
    let st = fold(&log(vec![
        started(),
        level_started("a", 1),
        finished("a", 1, Some("PASS"), 0.0),
        gate("a", "b"),
        level_started("b", 1),
        finished("b", 1, None, 0.0),
        gate("b", "__end__"),
    ]));
    let events = appended(plan(&s, &st));
    let [EventData::ScenarioFinished(f)] = &events[..] else { panic!("{events:?}") };
    assert_eq!(f.status, FinalStatus::Completed);
    assert_eq!(f.final_output.as_deref(), Some("b out"));
}

#[test]
fn a_run_whose_last_allowed_level_routes_to_the_end_completes() {
    let s = scenario(TWO);
    let mut st = fold(&log(vec![
        started(),
        level_started("a", 1),
        finished("a", 1, Some("PASS"), 0.0),
        gate("a", "b"),
        level_started("b", 1),
        finished("b", 1, None, 0.0),
        gate("b", "__end__"),
    ]));
    st.level_runs = baton_engine::limits::LEVEL_RUNS_MAX;
    let events = appended(plan(&s, &st));
    let [EventData::ScenarioFinished(f)] = &events[..] else { panic!("{events:?}") };
    assert_eq!(f.status, FinalStatus::Completed);

    // One more level to start is over the limit.
    let mut st = fold(&log(vec![
        started(),
        level_started("a", 1),
        finished("a", 1, Some("FAIL"), 0.0),
        gate("a", "a"),
    ]));
    st.level_runs = baton_engine::limits::LEVEL_RUNS_MAX;
    let events = appended(plan(&s, &st));
    let [EventData::ScenarioFinished(f)] = &events[..] else { panic!("{events:?}") };
    assert_eq!(f.status, FinalStatus::Aborted);
    assert_eq!(f.aborted_reason.as_deref(), Some("level_run_limit"));
}

#[test]
fn an_edge_to_fail_ends_the_run_failed_naming_the_level() {
    let s = scenario(
        "
id: two
version: 1
levels:
  - {id: a, kind: prompt, prompt: {inline: 'A'}, response: verdict, terminal: true}
edges:
  - {from: a, to: __end__, when: \"verdict == 'PASS'\"}
  - {from: a, to: __fail__}
",
    );
    let st =
        fold(&log(vec![started(), level_started("a", 1), finished("a", 1, Some("FAIL"), 0.0)]));
    let events = appended(plan(&s, &st));
    let [EventData::GateDecision(g)] = &events[..] else { panic!("{events:?}") };
    assert_eq!((g.target.as_str(), g.fallthrough), ("__fail__", false));
    let st = fold(&log(vec![
        started(),
        level_started("a", 1),
        finished("a", 1, Some("FAIL"), 0.0),
        gate("a", "__fail__"),
    ]));
    let events = appended(plan(&s, &st));
    let [EventData::ScenarioFinished(f)] = &events[..] else { panic!("{events:?}") };
    assert_eq!(f.status, FinalStatus::Failed);
    assert_eq!(f.aborted_reason.as_deref(), Some("routed_to_fail:a"));
}

#[test]
fn crossing_the_cost_cap_aborts() {
    let s = scenario(TWO);
    let st = fold(&log(vec![
        started(),
        level_started("a", 1),
        model_response("a", 1, 2.0),
        finished("a", 1, Some("PASS"), 2.0),
    ]));
    let events = appended(plan(&s, &st));
    let [EventData::BudgetExceeded(b)] = &events[..] else { panic!("{events:?}") };
    assert_eq!(b.limit_kind, "cost");
    let mut all = log(vec![
        started(),
        level_started("a", 1),
        model_response("a", 1, 2.0),
        finished("a", 1, Some("PASS"), 2.0),
    ]);
    all.push(NewEvent::run(events[0].clone()).at(5, Utc::now()));
    let events = appended(plan(&s, &fold(&all)));
    let [EventData::ScenarioFinished(f)] = &events[..] else { panic!("{events:?}") };
    assert_eq!(f.status, FinalStatus::Aborted);
    assert_eq!(f.aborted_reason.as_deref(), Some("budget_exceeded:cost"));
}

#[test]
fn a_cancel_ends_the_run_and_closes_the_level_in_flight() {
    let s = scenario(TWO);
    let cancel =
        NewEvent::run(EventData::CancelRequested(CancelRequested { by: None, reason: None }));
    let events = appended(plan(&s, &fold(&log(vec![started(), level_started("a", 1), cancel]))));
    let [EventData::LevelFinished(l), EventData::ScenarioFinished(f)] = &events[..] else {
        panic!("{events:?}")
    };
    assert!(l.skipped);
    assert_eq!(f.status, FinalStatus::Cancelled);
}

#[test]
fn three_failures_of_one_conflict_set_escalate_now() {
    let mut events = vec![started()];
    for attempt in 1..=3 {
        events.push(level_started("a", attempt));
        events.push(finished("a", attempt, Some("FAIL"), 0.0));
        events.push(gate("a", "a"));
    }
    let st = fold(&log(events));
    assert!(st.escalate_now);
    assert_eq!(st.tracker.get("a"), Some(&3));
}

#[test]
fn a_finished_run_has_nothing_to_do() {
    let s = scenario(TWO);
    let done = NewEvent::run(EventData::ScenarioFinished(Box::new(ScenarioFinished {
        status: FinalStatus::Completed,
        aborted_reason: None,
        totals: Totals::default(),
        checksum: "x".into(),
        final_output: None,
        tree_totals: None,
    })));
    let st = fold(&log(vec![started(), done]));
    assert_eq!(st.status, Status::Completed);
    assert_eq!(plan(&s, &st), Step::Done);
}

#[test]
fn an_approval_pauses_until_decided_then_finishes_the_level() {
    let s = scenario(
        "
id: appr
version: 1
levels:
  - {id: ok, kind: human_approval}
",
    );
    let request = NewEvent::level(
        "ok",
        1,
        EventData::ApprovalRequested(ApprovalRequested {
            request_id: "ok#1".into(),
            approver_role: "approver".into(),
            question: "?".into(),
            schema: serde_json::Value::Null,
            deadline: None,
            tool: None,
        }),
    );
    let mut events = vec![started(), level_started("ok", 1), request];
    let st = fold(&log(events.clone()));
    assert_eq!(st.status, Status::Paused);
    // The pause is recorded once, saying what it waits for; then the driver stops.
    let paused = appended(plan(&s, &st));
    let [EventData::RunPaused(p)] = &paused[..] else { panic!("{paused:?}") };
    assert_eq!(p.reason, "approval");
    assert!(p.detail.as_deref().unwrap().contains("ok#1"), "{p:?}");
    events.push(NewEvent::run(paused[0].clone()));
    assert_eq!(plan(&s, &fold(&log(events.clone()))), Step::Pause);
    events.push(NewEvent::run(EventData::ApprovalDecided(ApprovalDecided {
        request_id: "ok#1".into(),
        approved: false,
        comment: Some("no".into()),
        by: Some("ann".into()),
        data: None,
        timed_out: false,
    })));
    // The decision ends the pause before it has any effect: who made it resumes the run.
    let resumed = appended(plan(&s, &fold(&log(events.clone()))));
    let [EventData::RunResumed(r)] = &resumed[..] else { panic!("{resumed:?}") };
    assert_eq!((r.after.as_str(), r.by.as_deref(), r.resumes), ("approval", Some("ann"), 1));
    events.push(NewEvent::run(resumed[0].clone()));
    let st = fold(&log(events));
    assert!(st.paused.is_none());
    let decided = appended(plan(&s, &st));
    let [EventData::LevelFinished(f)] = &decided[..] else { panic!("{decided:?}") };
    assert_eq!(f.verdict.as_deref(), Some("FAIL"));
    assert_eq!(f.conflict.as_deref(), Some("human_approval:ok"));
}

#[test]
fn a_fan_out_with_approval_children_finishes_once_every_branch_is_decided() {
    let s = scenario(
        "
id: fan
version: 1
levels:
  - {id: fan, kind: fan_out, fan_out: [a1, a2, p], fan_in: {aggregator: majority_pass}}
  - {id: a1, kind: human_approval}
  - {id: a2, kind: human_approval}
  - {id: p, kind: prompt, prompt: {inline: P}, response: verdict}
",
    );
    let child = |id: &str, kind: &str| {
        NewEvent::level(
            id,
            1,
            EventData::LevelStarted(LevelStarted {
                role: id.into(),
                kind: kind.into(),
                parent: Some("fan".into()),
                model_constraint_allow: None,
                process: None,
            }),
        )
    };
    let request = |id: &str| {
        NewEvent::level(
            id,
            1,
            EventData::ApprovalRequested(ApprovalRequested {
                request_id: format!("{id}#1"),
                approver_role: "approver".into(),
                question: "?".into(),
                schema: serde_json::Value::Null,
                deadline: None,
                tool: None,
            }),
        )
    };
    let decision = |id: &str, approved: bool| {
        NewEvent::run(EventData::ApprovalDecided(ApprovalDecided {
            request_id: format!("{id}#1"),
            approved,
            comment: None,
            by: None,
            data: Some(serde_json::json!({"note": id})),
            timed_out: false,
        }))
    };
    let mut events = vec![
        started(),
        level_started("fan", 1),
        child("a1", "human_approval"),
        request("a1"),
        child("a2", "human_approval"),
        request("a2"),
        child("p", "prompt"),
        finished("p", 1, Some("FAIL"), 0.0),
    ];
    let st = fold(&log(events.clone()));
    assert_eq!(st.status, Status::Paused);
    assert_eq!(st.open_approvals().count(), 2);
    let paused = appended(plan(&s, &st));
    assert!(matches!(&paused[..], [EventData::RunPaused(_)]), "{paused:?}");
    events.push(NewEvent::run(paused[0].clone()));
    assert_eq!(plan(&s, &fold(&log(events.clone()))), Step::Pause);

    // The second branch is decided first: it finishes, the first still waits.
    events.push(decision("a2", true));
    let closed = appended(plan(&s, &fold(&log(events.clone()))));
    let [EventData::LevelFinished(f)] = &closed[..] else { panic!("{closed:?}") };
    assert_eq!(f.verdict.as_deref(), Some("PASS"));
    assert_eq!(f.parsed.as_ref().unwrap()["note"], "a2");
    events.push(NewEvent::level("a2", 1, closed[0].clone()));
    let st = fold(&log(events.clone()));
    assert_eq!(st.status, Status::Paused);
    assert_eq!(plan(&s, &st), Step::Pause);

    events.push(decision("a1", false));
    // Nobody is waited for any more: the run resumes (once), then the branch closes.
    let resumed = appended(plan(&s, &fold(&log(events.clone()))));
    let [EventData::RunResumed(r)] = &resumed[..] else { panic!("{resumed:?}") };
    assert_eq!(r.by.as_deref(), Some("approver"));
    events.push(NewEvent::run(resumed[0].clone()));
    let closed = appended(plan(&s, &fold(&log(events.clone()))));
    events.push(NewEvent::level("a1", 1, closed[0].clone()));
    let st = fold(&log(events.clone()));
    assert_eq!(st.status, Status::Running);
    assert!(st.pending_approvals.is_empty());
    let aggregated = appended(plan(&s, &st));
    let [EventData::LevelFinished(f)] = &aggregated[..] else { panic!("{aggregated:?}") };
    assert_eq!(f.output, "1 of 3 children passed (majority_pass): FAIL");
    assert_eq!(f.parsed.as_ref().unwrap()["children"]["a1"], "FAIL");
}

#[test]
fn a_fan_out_stopped_part_way_runs_again_for_its_children_not_started_only() {
    let s = scenario(
        "
id: fan
version: 1
levels:
  - {id: fan, kind: fan_out, fan_out: [a, b, c], fan_in: {aggregator: all_pass}}
  - {id: a, kind: prompt, prompt: {inline: A}, response: verdict}
  - {id: b, kind: prompt, prompt: {inline: B}, response: verdict}
  - {id: c, kind: prompt, prompt: {inline: C}, response: verdict}
",
    );
    let child = |id: &str, attempt: u32| {
        NewEvent::level(
            id,
            attempt,
            EventData::LevelStarted(LevelStarted {
                role: id.into(),
                kind: "prompt".into(),
                parent: Some("fan".into()),
                model_constraint_allow: None,
                process: None,
            }),
        )
    };
    // The step committed `a` and `c` as they finished, then stopped before `b` did.
    let events = vec![
        started(),
        level_started("fan", 1),
        child("c", 1),
        finished("c", 1, Some("PASS"), 0.0),
        child("a", 1),
        finished("a", 1, Some("PASS"), 0.0),
    ];
    assert_eq!(plan(&s, &fold(&log(events.clone()))), Step::Run { level: 0, attempt: 1 });
    let st = fold(&log(events.clone()));
    let states = baton_engine::fan_in::children_in_attempt(&s, &st, 0);
    let kinds: Vec<&str> = states
        .iter()
        .map(|(_, c)| match c {
            baton_engine::fan_in::ChildState::NotStarted => "not_started",
            baton_engine::fan_in::ChildState::Unsettled => "unsettled",
            baton_engine::fan_in::ChildState::Finished(_) => "finished",
        })
        .collect();
    assert_eq!(kinds, ["finished", "not_started", "finished"]);

    // Children of an earlier attempt of the fan-out do not count for this one.
    let mut again = events.clone();
    again.push(child("b", 1));
    again.push(finished("b", 1, Some("PASS"), 0.0));
    again.push(finished("fan", 1, None, 0.0));
    again.push(level_started("fan", 2));
    again.push(child("a", 2));
    again.push(finished("a", 2, Some("PASS"), 0.0));
    assert_eq!(plan(&s, &fold(&log(again))), Step::Run { level: 0, attempt: 2 });
}

#[test]
fn a_template_reads_its_own_levels_previous_attempt_only_on_a_retry() {
    use baton_engine::render::{Renderer, context};
    use baton_scenario::model::LevelKind;
    let s = scenario(
        "
id: two
version: 1
levels:
  - id: a
    kind: prompt
    prompt: {inline: \"{% if previous is defined %}retry of {{ previous.attempt }}: {{ previous.output }} / {{ previous.verdict }} / {{ previous.feedback }}{% else %}first{% endif %}\"}
    response: verdict
edges:
  - {from: a, to: __end__, when: \"verdict == 'PASS'\"}
  - {from: a, to: a}
",
    );
    let LevelKind::Prompt { prompt, .. } = &s.levels[0].kind else { panic!() };
    let renderer = Renderer::new(&s).unwrap();
    let catalog = std::sync::Arc::new(serde_json::json!([]));
    let render = |events: Vec<NewEvent>| {
        let state = std::sync::Arc::new(fold(&log(events)));
        renderer.render(prompt, &context(&state, "r", "a", &catalog)).unwrap()
    };
    assert_eq!(render(vec![started(), level_started("a", 1)]), "first");
    let mut failed = finished("a", 1, Some("FAIL"), 0.0);
    if let EventData::LevelFinished(f) = &mut failed.data {
        f.scratchpad.insert("feedback".into(), "- judge: too vague".into());
    }
    let retry = render(vec![
        started(),
        level_started("a", 1),
        failed,
        gate("a", "a"),
        level_started("a", 2),
    ]);
    assert_eq!(retry, "retry of 1: a out / FAIL / - judge: too vague");
}

#[test]
fn a_level_records_its_model_constraint_and_a_declared_handoff_but_not_on_a_retry() {
    let s = scenario(
        "
id: hand
version: 1
levels:
  - {id: a, kind: prompt, role: writer, prompt: {inline: A}, handoff: true, model: {allow: ['free:local/*']}}
  - {id: b, kind: prompt, role: editor, prompt: {inline: B}, response: verdict, handoff: true}
  - {id: c, kind: prompt, role: closer, prompt: {inline: C}, terminal: true}
edges:
  - {from: a, to: b}
  - {from: b, to: b, when: \"verdict == 'FAIL'\"}
  - {from: b, to: c}
",
    );
    let step = |events: &[NewEvent]| match plan(&s, &fold(&log(events.to_vec()))) {
        Step::Append(new) => new,
        other => panic!("expected events to append, got {other:?}"),
    };
    let mut events = vec![started()];
    let first = step(&events);
    let [
        NewEvent { data: EventData::LevelStarted(a), .. },
        NewEvent { data: EventData::AgentHandoff(h), .. },
    ] = &first[..]
    else {
        panic!("{first:?}")
    };
    assert_eq!(a.model_constraint_allow.as_deref(), Some(&["free:local/*".to_owned()][..]));
    assert_eq!((h.from_role.as_str(), h.to_role.as_str(), h.attempt), ("user", "writer", 1));
    events.extend(first);
    events.extend([finished("a", 1, None, 0.0), gate("a", "b")]);
    let second = step(&events);
    let [
        NewEvent { data: EventData::LevelStarted(b), .. },
        NewEvent { data: EventData::AgentHandoff(h), level_id, .. },
    ] = &second[..]
    else {
        panic!("{second:?}")
    };
    // A level without a constraint of its own or the scenario's may use any model.
    assert_eq!(b.model_constraint_allow.as_deref(), Some(&[][..]));
    assert_eq!((h.from_role.as_str(), h.to_role.as_str()), ("writer", "editor"));
    assert_eq!((h.level_id.as_str(), level_id.as_deref()), ("b", Some("b")));
    events.extend(second);
    events.extend([finished("b", 1, Some("FAIL"), 0.0), gate("b", "b")]);
    // The retry is the same role's work going on: no handoff.
    let retry = step(&events);
    let [NewEvent { data: EventData::LevelStarted(_), attempt: Some(2), .. }] = &retry[..] else {
        panic!("{retry:?}")
    };
    events.extend(retry);
    events.extend([finished("b", 2, Some("PASS"), 0.0), gate("b", "c")]);
    // A level that declares none records none.
    let last = step(&events);
    assert!(matches!(&last[..], [NewEvent { data: EventData::LevelStarted(_), .. }]), "{last:?}");
}

fn prompt_sent(id: &str, attempt: u32, call: u32, worst: Option<f64>) -> NewEvent {
    NewEvent::level(
        id,
        attempt,
        EventData::PromptSent(PromptSent {
            template: "t".into(),
            system: None,
            prompt: "p".into(),
            call,
            request_hash: None,
            worst_case_usd: worst,
        }),
    )
}

#[test]
fn a_takeover_names_who_held_the_run_and_charges_the_calls_it_sent_unanswered_once() {
    let s = scenario(TWO);
    let mut first = started();
    if let EventData::ScenarioStarted(st) = &mut first.data {
        st.process = Some("queuer".into());
    }
    let mut level = level_started("a", 1);
    if let EventData::LevelStarted(l) = &mut level.data {
        l.process = Some("worker-1".into());
    }
    // Two calls were sent; the first was answered, the second (worst case $0.75) was in
    // flight when its driver died.
    let mut events = vec![
        first,
        level,
        prompt_sent("a", 1, 0, Some(0.25)),
        model_response("a", 1, 0.1),
        prompt_sent("a", 1, 1, Some(0.75)),
    ];
    let state = fold(&log(events.clone()));
    assert!(baton_engine::plan::driver_lost(&s, &state));
    assert_eq!(state.driver.as_deref(), Some("worker-1"), "the worker that started the level");
    assert_eq!(state.unanswered.len(), 1);
    let takeover = baton_engine::plan::taken_over(&state, "worker-2");
    let Some(EventData::RunTakenOver(t)) = takeover.get(1).map(|e| &e.data) else {
        panic!("{takeover:?}")
    };
    assert_eq!((t.previous.as_deref(), t.by.as_str()), (Some("worker-1"), "worker-2"));
    assert_eq!((t.level_id.as_str(), t.attempt, t.cut.len()), ("a", 1, 1));
    assert!((t.charged_usd - 0.75).abs() < 1e-9);
    events.extend(takeover);
    let state = fold(&log(events.clone()));
    // The charge is the run's and the level's spend, once; nothing is left in flight.
    assert!((state.totals.cost_usd - 0.85).abs() < 1e-9, "{}", state.totals.cost_usd);
    assert!((state.level("a").unwrap().cost_usd - 0.85).abs() < 1e-9);
    assert!(state.unanswered.is_empty());
    assert_eq!(state.driver.as_deref(), Some("worker-2"));
    // A second takeover of the same attempt finds nothing more to charge.
    let again = baton_engine::plan::taken_over(&state, "worker-3");
    let Some(EventData::RunTakenOver(t)) = again.get(1).map(|e| &e.data) else { panic!() };
    assert!(t.cut.is_empty() && t.charged_usd == 0.0);
}
