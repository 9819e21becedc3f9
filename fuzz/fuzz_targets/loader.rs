//! Fuzz target: the YAML loader and every scenario check never panic or hang, and every
//! diagnostic renders.
#![no_main]

use baton_scenario::files::Files;
use baton_scenario::node::Node;
use baton_scenario::{Diagnostics, Sources, check};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut sources = Sources::new();
    let id = sources.add("fuzz.yaml", text);
    let mut diags = Diagnostics::new();
    match Node::parse(text, id) {
        Ok(node) => {
            let mut canonical = String::new();
            node.write_canonical(&mut canonical);
            let mut files = Files::new("/nonexistent/baton-fuzz");
            let _ = check::check(&node, "fuzz.yaml", &mut files, &mut sources, &mut diags);
        }
        Err(d) => diags.push(d),
    }
    diags.locate(&sources);
    let _ = diags.render();
});
