//! Every malformed scenario under `tests/malformed/` yields the diagnostics in its snapshot.
//!
//! A `*.yaml` file is loaded on its own (its root is `tests/malformed/`, which holds the
//! shared `prompts/`, `rubrics/` and `schemas/`); a subdirectory is loaded as a scenarios
//! directory of its own.

use std::path::{Path, PathBuf};

use baton_scenario::Registry;

const SHARED: &[&str] = &["prompts", "rubrics", "schemas", "snapshots"];

fn cases() -> Vec<PathBuf> {
    let dir = Path::new("tests/malformed");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("tests/malformed exists")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if p.is_dir() {
                !SHARED.contains(&name)
            } else {
                matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
            }
        })
        .collect();
    cases.sort();
    cases
}

fn render(path: &Path) -> String {
    match Registry::load(&[path]) {
        Ok(loaded) => {
            let mut out = String::from("loaded with warnings:\n");
            out.push_str(&loaded.warnings.render());
            out
        }
        Err(e) => e.diagnostics.render(),
    }
}

#[test]
fn malformed_scenarios_match_their_snapshots() {
    let cases = cases();
    assert!(cases.len() >= 30, "at least 30 malformed cases, found {}", cases.len());
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../malformed/snapshots");
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| {
        for case in &cases {
            let rendered = render(case);
            assert!(
                rendered.contains("error[") || rendered.contains("warning["),
                "{} produced no diagnostic:\n{rendered}",
                case.display()
            );
            let name = case.file_stem().and_then(|n| n.to_str()).unwrap_or("case").to_owned();
            insta::assert_snapshot!(name, rendered);
        }
    });
}

#[test]
fn every_error_names_a_file_and_says_what_to_do() {
    for case in cases() {
        let Err(e) = Registry::load(&[&case]) else { continue };
        for d in &e.diagnostics {
            assert!(!d.file.is_empty(), "{}: a diagnostic names no file: {d}", case.display());
            assert!(!d.message.is_empty(), "{}: empty message", case.display());
            if d.line > 0 {
                assert!(
                    d.snippet.is_some(),
                    "{}: a positioned diagnostic shows no line: {d}",
                    case.display()
                );
            }
        }
    }
}
