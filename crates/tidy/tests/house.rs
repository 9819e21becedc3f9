//! The house rules over Baton's own source tree (see the crate's documentation): a failure
//! lists every problem with its file and line and what to do.

use std::fs;
use std::path::{Path, PathBuf};

use baton_tidy::{
    Crate, Plan, circle_problems, file_lengths, layering, long_file_problems, parse_plan,
    read_workspace, thin_problems,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn house() -> (Vec<Crate>, Plan) {
    let markdown = fs::read_to_string(root().join("ARCHITECTURE.md"))
        .unwrap_or_else(|e| panic!("ARCHITECTURE.md: {e}"));
    let plan = parse_plan(&markdown).unwrap_or_else(|e| panic!("{e}"));
    (crates(), plan)
}

fn crates() -> Vec<Crate> {
    read_workspace(&root()).unwrap_or_else(|e| panic!("{e}"))
}

fn assert_none(what: &str, problems: &[String]) {
    assert!(problems.is_empty(), "{what}: {} problems\n\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn every_module_uses_only_its_own_layer_or_lower_ones() {
    let (crates, plan) = house();
    assert!(crates.len() >= 10, "read only {} crates", crates.len());
    assert_none("layers", &layering(&crates, &plan));
}

#[test]
fn no_import_circle_spans_more_than_one_file() {
    assert_none("import circles", &circle_problems(&crates()));
}

#[test]
fn a_file_over_a_thousand_lines_has_its_reason_written_down() {
    let (crates, plan) = house();
    assert_none("long files", &long_file_problems(&file_lengths(&crates), &plan.long_files));
}

#[test]
fn the_surfaces_reach_the_adapters_only_through_the_application_layer() {
    let root = root();
    let mut problems = Vec::new();
    for surface in ["crates/cli/Cargo.toml", "crates/server/Cargo.toml"] {
        let text =
            fs::read_to_string(root.join(surface)).unwrap_or_else(|e| panic!("{surface}: {e}"));
        problems.extend(thin_problems(surface, &text));
    }
    assert_none("thin surfaces", &problems);
}
