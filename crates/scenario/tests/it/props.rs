//! Property tests: print ∘ parse round-trips, and neither the DSL parser nor the YAML
//! loader panics on arbitrary input.

use baton_scenario::expr::{self, CmpOp, Expr, ExprKind, Literal, Span};
use baton_scenario::node::Node;
use baton_scenario::source::SourceId;
use proptest::prelude::*;

fn leaf() -> impl Strategy<Value = Expr> {
    let segment = "[a-z_][a-z0-9_]{0,6}".prop_filter("not a keyword", |s| {
        !["true", "false", "and", "or", "not"].contains(&s.as_str())
    });
    prop_oneof![
        prop::collection::vec(segment, 1..4).prop_map(ExprKind::Path),
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

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
