//! Load-time graph and fan-out checks: what they refuse, and what they must leave alone.

use baton_scenario::Registry;

use crate::TempDir;

const HEAD: &str = "id: g\nversion: 1\nlevels:\n  - {id: a, kind: prompt, prompt: {inline: 'A {{ input }}'}, response: verdict}\n  - {id: b, kind: prompt, prompt: {inline: 'B {{ input }}'}, response: verdict}\n";

/// Loads one scenario made of levels `a` and `b` and the given edges; returns the codes of
/// its diagnostics (errors and warnings).
fn codes(name: &str, edges: &str) -> Vec<&'static str> {
    let dir = TempDir::new(name);
    let path = dir.write("g.yaml", &format!("{HEAD}edges:\n{edges}"));
    match Registry::load(&[path]) {
        Ok(loaded) => loaded.warnings.iter().map(|d| d.code).collect(),
        Err(e) => e.diagnostics.iter().map(|d| d.code).collect(),
    }
}

#[test]
fn loops_with_a_way_out_load_without_a_word() {
    // A retry loop on a gate, the run falling through otherwise (the old warning stays).
    assert_eq!(
        codes("graph-retry", "  - {from: a, to: a, when: \"verdict == 'FAIL'\"}\n"),
        vec!["no-default-edge", "unreachable-level"]
    );
    // A review loop with a gated exit that reads what the loop produces.
    let review = "  - {from: a, to: b}\n  - {from: b, to: __end__, when: \"verdict == 'PASS'\"}\n  - {from: b, to: a}\n";
    assert_eq!(codes("graph-review", review), Vec::<&str>::new());
    let attempts = "  - {from: a, to: b}\n  - {from: b, to: __end__, when: 'attempt >= 3'}\n  - {from: b, to: a}\n";
    assert_eq!(codes("graph-attempts", attempts), Vec::<&str>::new());
    let level_inside = "  - {from: a, to: b}\n  - {from: b, to: __end__, when: \"level.a.verdict == 'PASS'\"}\n  - {from: b, to: a}\n";
    assert_eq!(codes("graph-level-inside", level_inside), Vec::<&str>::new());
}

#[test]
fn a_loop_whose_only_exit_reads_the_input_is_flagged() {
    let edges = "  - {from: a, to: b}\n  - {from: b, to: __end__, when: \"input.kind == 'short'\"}\n  - {from: b, to: a}\n";
    assert_eq!(codes("graph-constant", edges), vec!["constant-exit"]);
}

#[test]
fn an_exit_after_an_unconditional_self_edge_is_no_way_out() {
    let edges = "  - {from: a, to: b}\n  - {from: b, to: b}\n  - {from: b, to: __end__}\n";
    assert_eq!(codes("graph-shadowed-exit", edges), vec!["unreachable-edge", "closed-loop"]);
}

#[test]
fn a_human_approval_fan_out_child_is_not_refused() {
    let dir = TempDir::new("graph-approval-child");
    let path = dir.write(
        "g.yaml",
        "id: g\nversion: 1\nlevels:\n  - {id: panel, kind: fan_out, fan_out: [legal, security], fan_in: {aggregator: all_pass}}\n  - {id: legal, kind: human_approval}\n  - {id: security, kind: human_approval}\n",
    );
    let loaded = Registry::load(&[path]).unwrap();
    assert!(loaded.warnings.is_empty(), "{}", loaded.warnings.render());
}
