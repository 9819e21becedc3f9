//! The gate DSL, driven by `tests/dsl_cases.yaml`.

use baton_scenario::de::from_node;
use baton_scenario::expr::{self, JsonContext, Scope, Semantics, Val};
use baton_scenario::node::Node;
use baton_scenario::source::SourceId;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    expr: String,
    #[serde(default)]
    state: Option<serde_json::Value>,
    #[serde(default)]
    value: Option<serde_json::Value>,
    #[serde(default)]
    fires: Option<bool>,
    #[serde(default)]
    two_valued: Option<serde_json::Value>,
    #[serde(default)]
    fires_two_valued: Option<bool>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    phase: Option<String>,
}

fn scope() -> Scope<'static> {
    Scope {
        levels: Some(vec!["l1_brief", "l3_accept", "l4_execute", "classify"]),
        verifiers: Some(vec!["build", "lint", "judge"]),
        source_level: Some("l3_accept"),
        result: false,
        args: false,
        wave: None,
    }
}

fn val_json(v: Val<'_>) -> serde_json::Value {
    match v {
        Val::Undefined => serde_json::Value::String("UNDEFINED".to_owned()),
        Val::Bool(b) => b.into(),
        Val::Num(n) => n.into(),
        Val::Str(s) => s.into(),
    }
}

fn same(value: &serde_json::Value, expected: &serde_json::Value) -> bool {
    match (value, expected) {
        (serde_json::Value::Number(a), serde_json::Value::Number(b)) => a.as_f64() == b.as_f64(),
        _ => value == expected,
    }
}

#[test]
fn dsl_cases() {
    let text = std::fs::read_to_string(crate::crate_dir().join("tests/dsl_cases.yaml"))
        .expect("read cases");
    let node = Node::parse(&text, SourceId(0)).expect("cases parse");
    let cases: Vec<Case> = from_node(&node).expect("cases deserialize");
    assert!(cases.len() >= 180, "at least 180 DSL cases, found {}", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let outcome = expr::parse(&case.expr)
            .map_err(|e| ("parse", format!("{} {}", e.message, e.help.unwrap_or_default())))
            .and_then(|e| {
                expr::resolve(&e, &scope()).map_err(|e| {
                    ("resolve", format!("{} {}", e.message, e.help.unwrap_or_default()))
                })
            });
        match (&case.error, outcome) {
            (Some(expected), Err((phase, message))) => {
                if !message.contains(expected.as_str())
                    || case.phase.as_deref().is_some_and(|p| p != phase)
                {
                    failures.push(format!("{:?}: expected {:?} error containing {expected:?}, got {phase} error {message:?}", case.expr, case.phase));
                }
            }
            (Some(expected), Ok(_)) => failures.push(format!(
                "{:?}: expected an error containing {expected:?}, it checked",
                case.expr
            )),
            (None, Err((phase, message))) => {
                failures.push(format!("{:?}: unexpected {phase} error {message:?}", case.expr));
            }
            (None, Ok(gate)) => {
                let state = case.state.clone().unwrap_or_else(|| serde_json::json!({}));
                let ctx = JsonContext(&state);
                let expected = case.value.clone().unwrap_or(serde_json::Value::Null);
                let expected_two = case.two_valued.clone().unwrap_or_else(|| expected.clone());
                let truly = serde_json::Value::Bool(true);
                let fires = case.fires.unwrap_or(expected == truly);
                let fires_two = case.fires_two_valued.unwrap_or(expected_two == truly);
                for (semantics, expected, fires) in [
                    (Semantics::ThreeValued, &expected, fires),
                    (Semantics::TwoValued, &expected_two, fires_two),
                ] {
                    let value = val_json(gate.value_under(semantics, &ctx));
                    if !same(&value, expected) {
                        failures.push(format!(
                            "{:?} with {state} ({}): expected value {expected}, got {value}",
                            case.expr,
                            semantics.as_str()
                        ));
                    }
                    if gate.fires_under(semantics, &ctx) != fires {
                        failures.push(format!(
                            "{:?} with {state} ({}): expected fires={fires}",
                            case.expr,
                            semantics.as_str()
                        ));
                    }
                }
                // The default rule is the three-valued one.
                if gate.fires(&ctx) != fires {
                    failures.push(format!("{:?} with {state}: expected fires={fires}", case.expr));
                }
                // Printing and re-parsing gives the same expression.
                let printed = gate.to_string();
                let reparsed = expr::parse(&printed).expect("printed expression parses");
                if &reparsed != gate.expr() {
                    failures.push(format!(
                        "{:?}: printed as {printed:?}, which parses differently",
                        case.expr
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn traced_evaluation_reports_every_path_read() {
    let gate = expr::resolve(&expr::parse("verdict == 'PASS' && !escalate_now").unwrap(), &scope())
        .unwrap();
    let state = serde_json::json!({"verdict": "PASS"});
    let (fired, readings) = gate.fires_traced(&JsonContext(&state));
    assert!(!fired);
    let shown: Vec<String> = readings.iter().map(|r| format!("{}={}", r.path, r.value)).collect();
    assert_eq!(shown, vec!["verdict=\"PASS\"", "escalate_now=\"UNDEFINED\""]);
}

#[test]
fn errors_carry_spans_of_the_offending_part() {
    let err = expr::parse("verdict == 'PASS' & x").unwrap_err();
    assert_eq!((err.span.start, err.span.end), (18, 19));
    let parsed = expr::parse("verdict == 'PASS' && verifier.biuld.passed").unwrap();
    let err = expr::resolve(&parsed, &scope()).unwrap_err();
    assert_eq!(
        &"verdict == 'PASS' && verifier.biuld.passed"
            [err.span.start as usize..err.span.end as usize],
        "verifier.biuld.passed"
    );
}

#[test]
fn open_scope_checks_roots_but_not_names() {
    let parsed = expr::parse("verifier.anything.passed && level.whatever.ok").unwrap();
    assert!(expr::resolve(&parsed, &Scope::open()).is_ok());
    let parsed = expr::parse("verifer.anything.passed").unwrap();
    assert!(expr::resolve(&parsed, &Scope::open()).is_err());
}

#[test]
fn a_number_f64_cannot_hold_is_refused_where_it_is_written() {
    for (text, literal) in [
        ("attempt < 3 && confidence >= 0.12345678901234567", "0.12345678901234567"),
        ("attempt < 9007199254740993 || escalate_now", "9007199254740993"),
        ("confidence >= 0.123456789012345678", "0.123456789012345678"),
        ("attempt > -1e400", "1e400"),
    ] {
        let err = expr::parse(text).unwrap_err();
        assert_eq!(&text[err.span.start as usize..err.span.end as usize], literal, "{text}");
        assert!(err.message.starts_with(&format!("`{literal}`")), "{}", err.message);
        assert!(err.help.is_some(), "{text}: the error says what to write instead");
    }
    assert!(expr::parse("confidence >= 0.7").is_ok());
}

#[test]
fn defined_errors_point_at_the_operand() {
    let text = "escalate_now || defined(3)";
    let err = expr::parse(text).unwrap_err();
    assert_eq!(&text[err.span.start as usize..err.span.end as usize], "3");
    let text = "defined(verifier.biuld.passed)";
    let err = expr::resolve(&expr::parse(text).unwrap(), &scope()).unwrap_err();
    assert_eq!(&text[err.span.start as usize..err.span.end as usize], "verifier.biuld.passed");
}

#[test]
fn traced_evaluation_reads_the_path_defined_asks_about() {
    let gate = expr::resolve(&expr::parse("!defined(confidence)").unwrap(), &scope()).unwrap();
    let state = serde_json::json!({});
    let (fired, readings) = gate.fires_traced(&JsonContext(&state));
    assert!(fired);
    assert_eq!(readings.len(), 1);
    assert_eq!(
        (readings[0].path.as_str(), &readings[0].value),
        ("confidence", &"UNDEFINED".into())
    );
}
