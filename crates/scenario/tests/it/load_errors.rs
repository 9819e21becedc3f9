//! Load errors a user needs to see instead of silence or a parser's internals: deep
//! nesting, symlinks in the scenarios directory that lead nowhere, and an overrides
//! directory holding a file where a tenant directory belongs.

use baton_scenario::Registry;
use baton_scenario::registry::read_overrides;

use crate::TempDir;

const QA: &str = "\
id: qa
version: 1
levels:
  - id: answer
    kind: prompt
    prompt: {inline: 'Answer: {{ input }}'}
";

/// The diagnostics of loading `path`, rendered (empty when it loads without any).
fn load(path: &std::path::Path) -> String {
    match Registry::load(&[path]) {
        Ok(loaded) => loaded.warnings.render(),
        Err(e) => e.diagnostics.render(),
    }
}

fn nested(depth: usize) -> String {
    format!("id: deep\nversion: 1\nmetadata:\n  x: {}{}\n", "[".repeat(depth), "]".repeat(depth))
}

#[test]
fn any_nesting_too_deep_says_the_same_clear_thing() {
    let dir = TempDir::new("load-errors-nesting");
    let shallow = load(&dir.write("shallow.yaml", &nested(100)));
    let deep = load(&dir.write("deep.yaml", &nested(10_000)));
    for rendered in [&shallow, &deep] {
        assert!(
            rendered.contains("error[yaml-too-deep]: the YAML nests deeper than 48 levels"),
            "{rendered}"
        );
        assert!(!rendered.contains("recursion"), "{rendered}");
    }
    // Both point at the bracket that goes one level too deep.
    assert!(shallow.contains(":4:52"), "{shallow}");
    assert!(deep.contains(":4:52"), "{deep}");
}

#[cfg(unix)]
#[test]
fn a_dangling_symlink_or_a_symlink_loop_in_the_scenarios_directory_is_an_error() {
    let dir = TempDir::new("load-errors-symlinks");
    dir.write("qa.yaml", QA);
    std::os::unix::fs::symlink(dir.path().join("gone.yaml"), dir.path().join("dangling.yaml"))
        .unwrap();
    std::os::unix::fs::symlink(dir.path().join("loop_b.yaml"), dir.path().join("loop_a.yaml"))
        .unwrap();
    std::os::unix::fs::symlink(dir.path().join("loop_a.yaml"), dir.path().join("loop_b.yaml"))
        .unwrap();
    let err = Registry::load(&[dir.path()]).unwrap_err();
    let rendered = err.diagnostics.render();
    assert_eq!(err.diagnostics.error_count(), 3, "{rendered}");
    assert!(
        rendered.contains("error[broken-symlink]: `dangling.yaml` is a symlink to"),
        "{rendered}"
    );
    assert!(rendered.contains("which does not exist"), "{rendered}");
    assert!(rendered.contains("`loop_a.yaml` is a symlink loop"), "{rendered}");
    assert!(rendered.contains("`loop_b.yaml` is a symlink loop"), "{rendered}");
    for d in &err.diagnostics {
        assert!(d.file.ends_with(".yaml"), "names the link: {d}");
    }
}

#[test]
fn an_overrides_directory_holding_a_scenario_file_is_an_error() {
    let dir = TempDir::new("load-errors-overrides");
    dir.write("acme/qa.yaml", "budget: {max_cost_usd: 2.0}\n");
    dir.write("qa.yaml", "budget: {max_cost_usd: 3.0}\n");
    dir.write("README.md", "tenant overrides, one directory per tenant\n");
    let err = read_overrides(dir.path()).unwrap_err();
    let rendered = err.diagnostics.render();
    assert_eq!(err.diagnostics.error_count(), 1, "{rendered}");
    assert!(rendered.contains("error[override-not-in-tenant]"), "{rendered}");
    assert!(rendered.contains("qa.yaml"), "{rendered}");
    assert!(rendered.contains("move it to"), "{rendered}");

    let ok = TempDir::new("load-errors-overrides-ok");
    ok.write("acme/qa.yaml", "budget: {max_cost_usd: 2.0}\n");
    let tenants = read_overrides(ok.path()).unwrap();
    assert_eq!(tenants.len(), 1);
    assert_eq!(tenants[0].0, "acme");
    assert_eq!(tenants[0].1[0].scenario_id, "qa");
}

/// A scan level whose scanners take `allow_suppressions: {value}`.
fn scanners_allowing(value: &str) -> String {
    format!(
        "id: scan\nversion: 1\nlevels:\n  - id: check\n    kind: verifier\n    verifiers:\n      \
         - name: secrets\n        uses: gitleaks\n        params: {{allow_suppressions: {value}}}\n      \
         - name: code\n        uses: semgrep\n        params: {{rules: rules/r.yaml, allow_suppressions: {value}}}\n"
    )
}

#[test]
fn scanners_take_allow_suppressions_as_true_or_false_and_nothing_else() {
    let dir = TempDir::new("load-errors-suppressions");
    dir.write("rules/r.yaml", "rules: []\n");
    for value in ["true", "false"] {
        let path = dir.write("scan.yaml", &scanners_allowing(value));
        assert_eq!(load(&path), "", "allow_suppressions: {value}");
    }
    let path = dir.write("scan.yaml", &scanners_allowing("yes please"));
    let rendered = load(&path);
    for verifier in ["secrets", "code"] {
        assert!(
            rendered.contains(&format!(
                "error[wrong-type]: parameter `allow_suppressions` of verifier `{verifier}` must be true or false"
            )),
            "{rendered}"
        );
    }
}
