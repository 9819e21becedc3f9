//! The bundled scenarios load cleanly, and the committed JSON Schema is current.

use baton_scenario::{LevelKind, Registry, graph};

#[test]
fn bundled_scenarios_validate_without_errors_or_warnings() {
    let loaded = match Registry::load(&[crate::bundled_dir()]) {
        Ok(l) => l,
        Err(e) => panic!("bundled scenarios fail to load:\n{}", e.diagnostics.render()),
    };
    assert!(loaded.warnings.is_empty(), "warnings:\n{}", loaded.warnings.render());
    let ids: Vec<&str> = loaded.registry.scenarios().map(|s| s.id.as_str()).collect();
    for expected in [
        "code_build",
        "code_build_strict",
        "document_writing",
        "research_brief",
        "quick_qa",
        "security_review",
        "parallel_review_demo",
        "intent_classifier",
    ] {
        assert!(ids.contains(&expected), "missing bundled scenario {expected}; have {ids:?}");
    }
    let r = &loaded.registry;
    for (route, id) in [
        ("project", "code_build"),
        ("document", "document_writing"),
        ("writing", "document_writing"),
        ("task", "quick_qa"),
        ("qa", "quick_qa"),
        ("research", "research_brief"),
        ("security_review", "security_review"),
    ] {
        assert_eq!(r.by_route(route).map(|s| s.id.as_str()), Some(id), "route {route}");
    }
    let classifier = r.get("intent_classifier").unwrap();
    assert!(classifier.intent_routes.is_empty() && !classifier.classifier_eligible());
    assert!(r.get("code_build").unwrap().classifier_eligible());
    // Each kind is exercised by some bundled scenario.
    let kinds: std::collections::BTreeSet<&str> =
        r.scenarios().flat_map(|s| s.levels.iter().map(baton_scenario::Level::kind_name)).collect();
    assert_eq!(kinds.len(), 6, "{kinds:?}");
    let research = r.get("research_brief").unwrap();
    assert!(research.levels.iter().any(|l| matches!(l.kind, LevelKind::FanOut { .. })));
}

#[test]
fn graphs_render_for_every_bundled_scenario() {
    let loaded = Registry::load(&[crate::bundled_dir()]).unwrap();
    for s in loaded.registry.scenarios() {
        let m = graph::mermaid(s);
        assert!(m.starts_with("flowchart TD\n"));
        for level in &s.levels {
            assert!(m.contains(&level.id), "{} missing from {}'s mermaid graph", level.id, s.id);
        }
        let d = graph::dot(s);
        assert!(d.starts_with("digraph") && d.trim_end().ends_with('}'));
    }
}

#[test]
fn committed_json_schema_is_current() {
    let path = crate::crate_dir().join("../../schema/scenario.schema.json");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let current = serde_json::to_string_pretty(&baton_scenario::raw::json_schema()).unwrap() + "\n";
    assert!(
        committed == current,
        "schema/scenario.schema.json is stale: run `baton schema > schema/scenario.schema.json`"
    );
}
