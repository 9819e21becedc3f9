//! Fuzz target: the gate DSL never panics, and what parses prints back to itself.
#![no_main]

use baton_scenario::expr::{self, JsonContext, Scope};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(parsed) = expr::parse(text) else { return };
    let printed = parsed.to_string();
    // Printing normalises spacing and can grow a text past the length bound; such a text
    // is refused as source, so the round trip is only owed below the bound.
    if printed.len() > baton_scenario::limits::EXPR_BYTES_MAX {
        return;
    }
    let reparsed = expr::parse(&printed).expect("a printed expression parses");
    assert_eq!(reparsed, parsed, "print/parse round trip of {text:?}");
    if let Ok(gate) = expr::resolve(&parsed, &Scope::open()) {
        let state = serde_json::json!({"verdict": "PASS", "scratchpad": {"a": 1}});
        let _ = gate.fires(&JsonContext(&state));
    }
});
