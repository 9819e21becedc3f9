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

/// The kernel coordinates and reaches the world only through the traits it defines: its
/// crate depends on no other Baton crate but the scenario language, and no line of it
/// starts a program, opens a file or a socket, or reads the environment — the verifiers,
/// the jail, the stores, the providers and the application layer do, handed in by the
/// embedder.
#[test]
fn the_kernel_starts_no_program_touches_no_file_and_names_no_adapter() {
    let root = root();
    let manifest = fs::read_to_string(root.join("crates/engine/Cargo.toml")).expect("the manifest");
    let dependencies = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("a [dependencies] table");
    let mut problems: Vec<String> = dependencies
        .lines()
        .filter(|l| {
            l.trim_start().starts_with("baton-") && !l.trim_start().starts_with("baton-scenario")
        })
        .map(|l| format!("crates/engine/Cargo.toml: the kernel depends on `{}`", l.trim()))
        .collect();
    const REACHING_OUT: [&str; 7] = [
        "std::fs",
        "tokio::fs",
        "File::open",
        "process::Command",
        "tokio::process",
        "std::net",
        "std::env::",
    ];
    let mut pending = vec![root.join("crates/engine/src")];
    let mut files = 0;
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).expect("the kernel's sources") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            files += 1;
            let text = fs::read_to_string(&path).expect("a source file");
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                if let Some(what) = REACHING_OUT.iter().find(|w| code.contains(*w)) {
                    let shown = path.strip_prefix(&root).unwrap_or(&path).display().to_string();
                    problems.push(format!("{shown}:{}: the kernel uses `{what}`", n + 1));
                }
            }
        }
    }
    assert!(files > 40, "read only {files} of the kernel's files");
    assert_none("the kernel reaching out", &problems);
}
