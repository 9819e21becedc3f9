//! Baton's house rules, checked over the source tree by `tests/house.rs`: each crate's
//! modules sit in the layers ARCHITECTURE.md lists and use only their own layer or lower
//! ones, no import circle spans more than one file, a file over 1 000 lines has its reason
//! written down, and the surfaces (`crates/cli`, `crates/server`) reach the adapters only
//! through the application layer.
//!
//! Every `crate::`, `super::` and `self::` path is read with `syn` — in `use` items, inline
//! in code and in macro calls — and followed through re-exports to the module that defines
//! what it names, so a root that re-exports everything is not a way around a layer.

pub mod imports;
pub mod rules;
pub mod source;

use std::fs;
use std::path::{Path, PathBuf};

pub use imports::{Edge, edges};
pub use rules::{
    Layer, Plan, circles, layer_problems, long_file_problems, parse_plan, show_circle,
    thin_problems,
};
pub use source::{ModPath, Module, parse_crate, read_crate, show};

/// One crate of the workspace, read.
#[derive(Debug)]
pub struct Crate {
    /// Its directory under `crates/`.
    pub name: String,
    pub modules: Vec<Module>,
    pub edges: Vec<Edge>,
}

/// Reads every crate under `root/crates`.
pub fn read_workspace(root: &Path) -> Result<Vec<Crate>, String> {
    let dir = root.join("crates");
    let entries = fs::read_dir(&dir).map_err(|e| format!("{}: cannot list: {e}", dir.display()))?;
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().join("src").is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let modules = read_crate(&dir.join(&name).join("src"), root)?;
            let edges = edges(&modules);
            Ok(Crate { name, modules, edges })
        })
        .collect()
}

/// Every problem with the layers and circles of the crates, against the plan.
pub fn layering(crates: &[Crate], plan: &Plan) -> Vec<String> {
    let mut problems = Vec::new();
    for krate in crates {
        match plan.layers.get(&krate.name) {
            Some(layers) => {
                problems.extend(layer_problems(&krate.name, &krate.modules, &krate.edges, layers));
            }
            None => problems.push(format!(
                "crates/{}: no layer list under `## Layers` in ARCHITECTURE.md: add one",
                krate.name
            )),
        }
    }
    for name in plan.layers.keys() {
        if !crates.iter().any(|c| &c.name == name) {
            problems.push(format!(
                "ARCHITECTURE.md lists layers for `{name}`, but there is no crates/{name}"
            ));
        }
    }
    problems
}

/// Every import circle of more than one file, described.
pub fn circle_problems(crates: &[Crate]) -> Vec<String> {
    crates
        .iter()
        .flat_map(|krate| {
            circles(&krate.edges)
                .into_iter()
                .map(|(members, inside)| show_circle(&krate.name, &members, &inside))
        })
        .collect()
}

/// Every source file with its lines outside tests.
pub fn file_lengths(crates: &[Crate]) -> Vec<(PathBuf, usize)> {
    crates.iter().flat_map(|c| c.modules.iter().map(|m| (m.file.clone(), m.code_lines))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAN: &str = "# A\n\n## Layers\n\n```text\ndemo\n  bottom: lower\n  middle (apart): left right\n  top: upper crate\n```\n";

    fn check(files: &[(&str, &str)]) -> Vec<String> {
        let files: Vec<(PathBuf, String)> =
            files.iter().map(|(p, t)| (PathBuf::from(p), (*t).to_owned())).collect();
        let modules = parse_crate(&files).expect("parses");
        let edges = edges(&modules);
        let plan = parse_plan(PLAN).expect("plan");
        let mut problems = layer_problems("demo", &modules, &edges, &plan.layers["demo"]);
        problems.extend(circles(&edges).iter().map(|(m, e)| show_circle("demo", m, e)));
        problems
    }

    /// [`check`] of the demo crate with `lower.rs` as given and the other modules empty.
    fn check_lower(lower: &str) -> Vec<String> {
        check(&[
            ("lib.rs", LIB),
            ("lower.rs", lower),
            ("left.rs", ""),
            ("right.rs", ""),
            ("upper.rs", UPPER),
        ])
    }

    const LIB: &str =
        "pub mod left;\npub mod lower;\npub mod right;\npub mod upper;\npub use upper::Up;\n";
    const UPPER: &str =
        "use crate::lower::Low;\npub struct Up(pub Low);\npub const NAME: &str = \"up\";\n";

    #[test]
    fn a_house_that_keeps_its_layers_passes() {
        let problems = check(&[
            ("lib.rs", LIB),
            ("lower.rs", "pub struct Low;\n"),
            ("left.rs", "pub fn l() -> crate::lower::Low { crate::lower::Low }\n"),
            ("right.rs", "pub fn r() {}\n"),
            ("upper.rs", UPPER),
        ]);
        assert_eq!(problems, Vec::<String>::new());
    }

    #[test]
    fn a_use_of_a_higher_layer_fails() {
        let problems = check_lower("use crate::upper::Up;\npub struct Low;\npub fn f(_: Up) {}\n");
        assert!(
            problems
                .iter()
                .any(|p| p.contains("lower.rs:1: `lower` (layer `bottom`) uses `upper`")),
            "{problems:#?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("an import circle of 2 modules: lower, upper")),
            "{problems:#?}"
        );
    }

    #[test]
    fn an_inline_path_to_a_higher_layer_fails() {
        let problems = check_lower(
            "pub struct Low;\n\npub fn f() -> usize {\n    crate::upper::NAME.len()\n}\n",
        );
        assert!(
            problems
                .iter()
                .any(|p| p.contains("lower.rs:4:") && p.contains("`crate::upper::NAME`")),
            "{problems:#?}"
        );
    }

    #[test]
    fn a_re_export_or_a_macro_call_does_not_hide_a_higher_layer() {
        let through_root = check_lower("pub struct Low;\npub fn f(_: &crate::Up) {}\n");
        assert!(
            through_root.iter().any(|p| p.contains("uses `upper` through `crate::Up`")),
            "{through_root:#?}"
        );
        let in_macro = check_lower(
            "pub struct Low;\npub fn f() -> String {\n    format!(\"{}\", super::upper::NAME)\n}\n",
        );
        assert!(
            in_macro.iter().any(|p| p.contains("lower.rs:3:") && p.contains("super::upper::NAME")),
            "{in_macro:#?}"
        );
    }

    #[test]
    fn modules_kept_apart_may_not_use_each_other_and_tests_may_use_anything() {
        let problems = check(&[
            ("lib.rs", LIB),
            (
                "lower.rs",
                "pub struct Low;\n#[cfg(test)]\nmod tests {\n    use crate::upper::Up;\n}\n",
            ),
            ("left.rs", "use crate::right::r;\npub fn l() { r() }\n"),
            ("right.rs", "pub fn r() {}\n"),
            ("upper.rs", UPPER),
        ]);
        assert_eq!(problems.len(), 1, "{problems:#?}");
        assert!(
            problems[0].contains("the modules of layer `middle` are kept apart"),
            "{problems:#?}"
        );
    }

    #[test]
    fn a_module_in_no_layer_is_named() {
        let problems = check(&[
            ("lib.rs", LIB),
            ("lower.rs", ""),
            ("left.rs", ""),
            ("right.rs", ""),
            ("upper.rs", ""),
            ("stray.rs", ""),
        ]);
        assert!(
            problems.iter().any(|p| p.contains("module `stray` (stray.rs) is in no layer")),
            "{problems:#?}"
        );
    }

    #[test]
    fn long_files_need_a_reason_and_at_most_three_may_have_one() {
        let files = vec![(PathBuf::from("a.rs"), 1200), (PathBuf::from("b.rs"), 300)];
        let none = long_file_problems(&files, &[]);
        assert!(none[0].contains("a.rs: 1200 lines outside tests"), "{none:#?}");
        let named = long_file_problems(&files, &[(PathBuf::from("a.rs"), "SQL".to_owned())]);
        assert_eq!(named, Vec::<String>::new());
        let stale = long_file_problems(&files, &[(PathBuf::from("b.rs"), "SQL".to_owned())]);
        assert!(stale.iter().any(|p| p.contains("take it off the list")), "{stale:#?}");
        let four: Vec<(PathBuf, String)> =
            (0..4).map(|i| (PathBuf::from(format!("{i}.rs")), "x".to_owned())).collect();
        assert!(long_file_problems(&[], &four)[0].contains("at most 3"));
    }

    #[test]
    fn a_surface_that_lists_an_adapter_fails() {
        let manifest = "[package]\nname = \"x\"\n[dependencies]\nbaton-app = { path = \"a\" }\nbaton-store.workspace = true\n[dev-dependencies]\nbaton-jail.workspace = true\n";
        let problems = thin_problems("crates/x/Cargo.toml", manifest);
        assert_eq!(problems.len(), 1, "{problems:#?}");
        assert!(problems[0].contains("`baton-store` is under [dependencies]"));
    }
}
