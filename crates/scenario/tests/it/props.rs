//! Property tests: print ∘ parse round-trips, neither the DSL parser nor the YAML loader
//! panics on arbitrary input, and three-valued gates are monotone — a value decided while
//! some paths are UNDEFINED stays decided whatever those paths turn out to hold.

use baton_scenario::expr::{self, CmpOp, Expr, ExprKind, JsonContext, Literal, Scope, Span, Val};
use baton_scenario::node::Node;
use baton_scenario::source::SourceId;
use proptest::prelude::*;

fn leaf() -> impl Strategy<Value = Expr> {
    let segment = "[a-z_][a-z0-9_]{0,6}".prop_filter("not a keyword", |s| {
        !["true", "false", "and", "or", "not", "defined"].contains(&s.as_str())
    });
    let path = || prop::collection::vec(segment.clone(), 1..4);
    prop_oneof![
        path().prop_map(ExprKind::Path),
        path().prop_map(|p| ExprKind::Defined(Box::new(Expr {
            kind: ExprKind::Path(p),
            span: Span::default()
        }))),
        any::<bool>().prop_map(|b| ExprKind::Literal(Literal::Bool(b))),
        (-1e6f64..1e6).prop_map(|n| ExprKind::Literal(Literal::Num(n))),
        "[ -~]{0,8}".prop_map(|s| ExprKind::Literal(Literal::Str(s))),
    ]
    .prop_map(|kind| Expr { kind, span: Span::default() })
}

fn op() -> impl Strategy<Value = CmpOp> {
    prop_oneof![
        Just(CmpOp::Eq),
        Just(CmpOp::Ne),
        Just(CmpOp::Lt),
        Just(CmpOp::Le),
        Just(CmpOp::Gt),
        Just(CmpOp::Ge)
    ]
}

fn expr_tree() -> impl Strategy<Value = Expr> {
    leaf().prop_recursive(5, 24, 2, |inner| {
        let b = |kind| Expr { kind, span: Span::default() };
        prop_oneof![
            (inner.clone(), inner.clone())
                .prop_map(move |(l, r)| b(ExprKind::Or(Box::new(l), Box::new(r)))),
            (inner.clone(), inner.clone())
                .prop_map(move |(l, r)| b(ExprKind::And(Box::new(l), Box::new(r)))),
            inner.clone().prop_map(move |e| b(ExprKind::Not(Box::new(e)))),
            (op(), leaf(), leaf()).prop_map(move |(o, l, r)| b(ExprKind::Compare(
                o,
                Box::new(l),
                Box::new(r)
            ))),
        ]
    })
}

/// The paths the monotonicity property reads; all dynamic, so any comparison checks.
const PATHS: [&str; 4] = ["scratchpad.a", "scratchpad.b", "scratchpad.c", "scratchpad.d"];

fn node(kind: ExprKind) -> Expr {
    Expr { kind, span: Span::default() }
}

fn path(i: usize) -> Expr {
    node(ExprKind::Path(PATHS[i].split('.').map(str::to_owned).collect()))
}

/// An operand of a comparison that is not a path: a number, a string or a boolean.
fn scalar() -> impl Strategy<Value = Literal> {
    prop_oneof![
        (0u8..4).prop_map(|n| Literal::Num(f64::from(n))),
        prop_oneof![Just("a"), Just("b")].prop_map(|s| Literal::Str(s.to_owned())),
        any::<bool>().prop_map(Literal::Bool),
    ]
}

/// A condition that checks in an open scope, built without `defined`.
fn condition() -> impl Strategy<Value = Expr> {
    let atom = prop_oneof![
        (0..PATHS.len()).prop_map(path),
        any::<bool>().prop_map(|b| node(ExprKind::Literal(Literal::Bool(b)))),
        (op(), 0..PATHS.len(), 0..PATHS.len()).prop_map(|(o, l, r)| node(ExprKind::Compare(
            o,
            Box::new(path(l)),
            Box::new(path(r))
        ))),
        (op(), 0..PATHS.len(), scalar()).prop_map(|(o, l, lit)| {
            // Booleans have no order: an ordering against `true` would not check.
            let o = if matches!(lit, Literal::Bool(_)) && o.is_ordering() { CmpOp::Eq } else { o };
            node(ExprKind::Compare(o, Box::new(path(l)), Box::new(node(ExprKind::Literal(lit)))))
        }),
    ];
    atom.prop_recursive(5, 32, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone())
                .prop_map(|(l, r)| node(ExprKind::Or(Box::new(l), Box::new(r)))),
            (inner.clone(), inner.clone())
                .prop_map(|(l, r)| node(ExprKind::And(Box::new(l), Box::new(r)))),
            inner.prop_map(|e| node(ExprKind::Not(Box::new(e)))),
        ]
    })
}

/// What a path may hold: nothing at all (`None`: UNDEFINED), or a JSON value — null and
/// lists are UNDEFINED too.
fn held() -> impl Strategy<Value = Option<serde_json::Value>> {
    prop_oneof![
        Just(None),
        Just(Some(serde_json::Value::Null)),
        any::<bool>().prop_map(|b| Some(b.into())),
        (0u8..4).prop_map(|n| Some(n.into())),
        prop_oneof![Just("a"), Just("b")].prop_map(|s| Some(s.into())),
        Just(Some(serde_json::json!([1]))),
    ]
}

/// A state holding `values[i]` at `PATHS[i]`, leaving out the paths that hold nothing.
fn state(values: &[Option<serde_json::Value>]) -> serde_json::Value {
    let mut scratchpad = serde_json::Map::new();
    for (p, v) in PATHS.iter().zip(values) {
        if let Some(v) = v {
            scratchpad.insert(p.trim_start_matches("scratchpad.").to_owned(), v.clone());
        }
    }
    serde_json::json!({ "scratchpad": scratchpad })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Kleene monotonicity: if an expression is true (or false) while some paths are
    /// UNDEFINED, it keeps that value for any values those paths might take. So missing
    /// data never fires an edge unless the expression is true regardless of it.
    #[test]
    fn three_valued_gates_are_monotone(
        e in condition(),
        known in prop::collection::vec(held(), PATHS.len()),
        missing in prop::collection::vec(any::<bool>(), PATHS.len()),
        later in prop::collection::vec(held(), PATHS.len()),
    ) {
        let gate = expr::resolve(&e, &Scope::open());
        prop_assert!(gate.is_ok(), "{e} does not check: {gate:?}");
        let gate = gate.unwrap();
        let partial: Vec<_> =
            known.iter().zip(&missing).map(|(v, m)| if *m { None } else { v.clone() }).collect();
        let completed: Vec<_> = partial
            .iter()
            .zip(&later)
            .map(|(v, l)| v.clone().or_else(|| l.clone()))
            .collect();
        let (before, after) = (state(&partial), state(&completed));
        let (ctx_before, ctx_after) = (JsonContext(&before), JsonContext(&after));
        if let Val::Bool(b) = gate.value(&ctx_before) {
            prop_assert_eq!(
                gate.value(&ctx_after),
                Val::Bool(b),
                "{} was {} with {} but not with {}", e, b, before, after
            );
        }
        if gate.fires(&JsonContext(&before)) {
            prop_assert!(gate.fires(&JsonContext(&after)), "{e} fired on {before} only");
        }
    }

    #[test]
    fn print_then_parse_round_trips(e in expr_tree()) {
        let printed = e.to_string();
        let reparsed = expr::parse(&printed);
        prop_assert!(reparsed.is_ok(), "{printed:?} does not parse: {reparsed:?}");
        prop_assert_eq!(reparsed.unwrap(), e, "printed as {:?}", printed);
    }

    #[test]
    fn parser_never_panics(text in "\\PC{0,200}") {
        let _ = expr::parse(&text);
    }

    #[test]
    fn parser_never_panics_on_dsl_like_text(text in "[a-z_.'\"()!&|=<> 0-9-]{0,120}") {
        if let Ok(e) = expr::parse(&text) {
            let printed = e.to_string();
            prop_assert_eq!(expr::parse(&printed).ok(), Some(e));
            let _ = expr::resolve(&expr::parse(&printed).unwrap(), &expr::Scope::open());
        }
    }

    #[test]
    fn yaml_loader_never_panics(text in "\\PC{0,300}") {
        if let Ok(node) = Node::parse(&text, SourceId(0)) {
            let _ = baton_scenario::de::from_node::<baton_scenario::raw::RawScenario>(&node);
        }
    }

    #[test]
    fn yaml_loader_never_panics_on_yaml_like_text(text in "[a-z:_\\-\\[\\]{}&*!|>'\"#\n ]{0,300}") {
        if let Ok(node) = Node::parse(&text, SourceId(0)) {
            let _ = baton_scenario::de::from_node::<baton_scenario::raw::RawScenario>(&node);
        }
    }
}
