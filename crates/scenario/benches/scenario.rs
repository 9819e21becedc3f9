//! Benchmarks: loading and validating the bundled scenarios, and evaluating a gate.
//!
//! Run with `cargo bench -p baton-scenario`. Targets (issue: scenario language): the whole
//! bundled directory loads and validates in under 10 ms; a compiled gate evaluates in
//! under 200 ns.

use std::hint::black_box;
use std::path::PathBuf;

use baton_scenario::Registry;
use baton_scenario::expr::{self, JsonContext, Scope};
use criterion::{Criterion, criterion_group, criterion_main};

fn bundled() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scenarios")
}

fn load(c: &mut Criterion) {
    let dir = bundled();
    assert!(Registry::load(&[&dir]).is_ok(), "the bundled scenarios must load");
    c.bench_function("load_and_validate_bundled_dir", |b| {
        b.iter(|| black_box(Registry::load(&[black_box(&dir)]).map(|l| l.registry.len()).ok()));
    });
}

fn gate(c: &mut Criterion) {
    let scope = Scope {
        levels: Some(vec!["l3_accept"]),
        verifiers: Some(vec!["build"]),
        source_level: Some("l3_build_verify"),
        result: false,
        args: false,
        wave: None,
    };
    let text = "verifier.build.passed && verdict == 'PASS' && !escalate_now && confidence >= 0.7";
    let gate = expr::resolve(&expr::parse(text).expect("parses"), &scope).expect("checks");
    let state = serde_json::json!({
        "verdict": "PASS",
        "escalate_now": false,
        "confidence": 0.9,
        "verifier": {"build": {"passed": true, "score": 1.0}},
        "level": {"l3_accept": {"verdict": "PASS"}},
        "scratchpad": {"build_result_summary": "ok"}
    });
    let ctx = JsonContext(&state);
    assert!(gate.fires(&ctx));
    c.bench_function("evaluate_compiled_gate", |b| {
        b.iter(|| black_box(gate.fires(black_box(&ctx))));
    });
    c.bench_function("parse_and_resolve_gate", |b| {
        b.iter(|| {
            black_box(expr::resolve(&expr::parse(black_box(text)).expect("parses"), &scope).is_ok())
        });
    });
}

criterion_group!(benches, load, gate);
criterion_main!(benches);
