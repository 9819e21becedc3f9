//! The house rules: module layers and circles per crate, long files named with a reason,
//! surfaces kept thin — each a function from what was read to the problems found.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::imports::Edge;
use crate::source::{ModPath, Module, show};

/// One layer of a crate: its modules (by name, or a prefix ending in `*`), and whether its
/// modules must not use each other.
#[derive(Debug, Clone)]
pub struct Layer {
    pub name: String,
    pub apart: bool,
    pub patterns: Vec<String>,
}

/// What ARCHITECTURE.md says the house looks like.
#[derive(Debug, Default)]
pub struct Plan {
    /// Per crate directory name, its layers from the bottom up.
    pub layers: BTreeMap<String, Vec<Layer>>,
    /// Files allowed over the line limit, with the reason given.
    pub long_files: Vec<(PathBuf, String)>,
}

/// The most lines (outside tests) a source file has without a reason in ARCHITECTURE.md.
pub const LONG_FILE: usize = 1000;
/// How many files may have such a reason.
pub const MOST_LONG_FILES: usize = 3;

/// Reads the `## Layers` section's block and the `### Files over 1 000 lines` list.
pub fn parse_plan(markdown: &str) -> Result<Plan, String> {
    let mut plan = Plan::default();
    let layers_at =
        markdown.find("\n## Layers").ok_or("ARCHITECTURE.md has no `## Layers` section")?;
    let section = &markdown[layers_at + 1..];
    let block_at = section.find("\n```").ok_or("the `## Layers` section has no fenced block")?;
    let block = &section[block_at + 4..];
    let block = &block[block.find('\n').map_or(0, |n| n + 1)..];
    let block = &block[..block.find("\n```").ok_or("the `## Layers` block is not closed")?];
    let mut current: Option<String> = None;
    for (n, line) in block.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if !line.starts_with(' ') {
            let name = line.trim().to_owned();
            plan.layers.entry(name.clone()).or_default();
            current = Some(name);
            continue;
        }
        let krate = current
            .clone()
            .ok_or(format!("layers line {}: a layer before any crate name", n + 1))?;
        let (head, modules) = line.split_once(':').ok_or(format!(
            "layers line {}: expected `name: modules…`, got `{}`",
            n + 1,
            line.trim()
        ))?;
        let head = head.trim();
        let apart = head.ends_with("(apart)");
        let name = head.trim_end_matches("(apart)").trim().to_owned();
        let patterns = modules.split_whitespace().map(str::to_owned).collect();
        plan.layers.entry(krate).or_default().push(Layer { name, apart, patterns });
    }
    if let Some(at) = markdown.find("\n### Files over 1 000 lines") {
        let list = &markdown[at + 1..];
        let list = &list[list.find('\n').map_or(list.len(), |n| n + 1)..];
        for line in list.lines().take_while(|l| !l.starts_with('#')) {
            if let Some(rest) = line.strip_prefix("- `")
                && let Some((path, reason)) = rest.split_once('`')
            {
                let reason = reason.trim_start_matches([' ', '—', '-', ':']).trim().to_owned();
                plan.long_files.push((PathBuf::from(path), reason));
            }
        }
    }
    Ok(plan)
}

fn matches(pattern: &str, module: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => module.starts_with(prefix),
        None => pattern == module,
    }
}

/// Places each module in its layer, then checks every edge goes down or sideways (and not
/// sideways in a layer kept apart).
pub fn layer_problems(
    krate: &str,
    modules: &[Module],
    edges: &[Edge],
    layers: &[Layer],
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut level: BTreeMap<ModPath, usize> = BTreeMap::new();
    for module in modules {
        let name = show(&module.path);
        let found: Vec<usize> = (0..layers.len())
            .filter(|&i| layers[i].patterns.iter().any(|p| matches(p, &name)))
            .collect();
        match found.as_slice() {
            [one] => {
                level.insert(module.path.clone(), *one);
            }
            [] => problems.push(format!(
                "{krate}: module `{name}` ({}) is in no layer: add it to the crate's list under `## Layers` in ARCHITECTURE.md",
                module.file.display()
            )),
            many => problems.push(format!(
                "{krate}: module `{name}` is in {} layers ({}): name it in one",
                many.len(),
                many.iter().map(|&i| layers[i].name.as_str()).collect::<Vec<_>>().join(", ")
            )),
        }
    }
    let file_of: BTreeMap<&ModPath, &Module> = modules.iter().map(|m| (&m.path, m)).collect();
    for edge in edges {
        let (Some(&from), Some(&to)) = (level.get(&edge.from), level.get(&edge.to)) else {
            continue;
        };
        let file =
            file_of.get(&edge.from).map_or_else(String::new, |m| m.file.display().to_string());
        if to > from {
            problems.push(format!(
                "{file}:{}: `{}` (layer `{}`) uses `{}` through `{}`, a module of the higher layer `{}`: \
                 move what it needs down, or the module up",
                edge.line,
                show(&edge.from),
                layers[from].name,
                show(&edge.to),
                edge.written,
                layers[to].name
            ));
        } else if to == from && layers[from].apart {
            problems.push(format!(
                "{file}:{}: `{}` uses `{}` through `{}`, but the modules of layer `{}` are kept apart: \
                 move the shared part to a lower layer",
                edge.line,
                show(&edge.from),
                show(&edge.to),
                edge.written,
                layers[from].name
            ));
        }
    }
    problems
}

/// The import circles of more than one module (strongly connected components), each with
/// the edges that close it.
pub fn circles(edges: &[Edge]) -> Vec<(Vec<ModPath>, Vec<Edge>)> {
    let mut next: BTreeMap<&ModPath, BTreeSet<&ModPath>> = BTreeMap::new();
    for edge in edges {
        next.entry(&edge.from).or_default().insert(&edge.to);
        next.entry(&edge.to).or_default();
    }
    // Kosaraju: order by finish time, then walk the reversed graph.
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for &start in next.keys() {
        if !seen.insert(start) {
            continue;
        }
        let mut stack = vec![(start, next[start].iter().copied().collect::<Vec<_>>())];
        while let Some((node, pending)) = stack.last_mut() {
            if let Some(child) = pending.pop() {
                if seen.insert(child) {
                    let children = next[child].iter().copied().collect();
                    stack.push((child, children));
                }
            } else {
                order.push(*node);
                stack.pop();
            }
        }
    }
    let mut back: BTreeMap<&ModPath, Vec<&ModPath>> = BTreeMap::new();
    for (&from, tos) in &next {
        for &to in tos {
            back.entry(to).or_default().push(from);
        }
    }
    let mut placed = BTreeSet::new();
    let mut out = Vec::new();
    for &start in order.iter().rev() {
        if !placed.insert(start) {
            continue;
        }
        let mut component = vec![start];
        let mut todo = vec![start];
        while let Some(node) = todo.pop() {
            for &prev in back.get(node).map(Vec::as_slice).unwrap_or_default() {
                if placed.insert(prev) {
                    component.push(prev);
                    todo.push(prev);
                }
            }
        }
        if component.len() > 1 {
            let members: BTreeSet<&ModPath> = component.iter().copied().collect();
            let inside = edges
                .iter()
                .filter(|e| members.contains(&e.from) && members.contains(&e.to))
                .cloned()
                .collect();
            out.push((members.into_iter().cloned().collect(), inside));
        }
    }
    out
}

/// Describes a circle for a failure message.
pub fn show_circle(krate: &str, members: &[ModPath], inside: &[Edge]) -> String {
    let names: Vec<String> = members.iter().map(|m| show(m)).collect();
    let mut text =
        format!("{krate}: an import circle of {} modules: {}", names.len(), names.join(", "));
    let mut pairs: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for edge in inside {
        pairs
            .entry((show(&edge.from), show(&edge.to)))
            .or_default()
            .push(format!("{}@{}", edge.written, edge.line));
    }
    for ((from, to), via) in pairs {
        text.push_str(&format!("\n    {from} -> {to}: {}", via.join(", ")));
    }
    text
}

/// Files over the limit must be named with a reason, and at most three may be; a named file
/// that is not long any more must leave the list.
pub fn long_file_problems(files: &[(PathBuf, usize)], listed: &[(PathBuf, String)]) -> Vec<String> {
    let mut problems = Vec::new();
    if listed.len() > MOST_LONG_FILES {
        problems.push(format!(
            "ARCHITECTURE.md names {} files over {LONG_FILE} lines; at most {MOST_LONG_FILES} may be: split the others",
            listed.len()
        ));
    }
    for (path, lines) in files {
        let named = listed.iter().find(|(p, _)| p == path);
        if *lines > LONG_FILE && named.is_none_or(|(_, reason)| reason.is_empty()) {
            problems.push(format!(
                "{}: {lines} lines outside tests (limit {LONG_FILE}): split it, or name it with its reason under \
                 `### Files over 1 000 lines` in ARCHITECTURE.md",
                path.display()
            ));
        }
    }
    for (path, _) in listed {
        match files.iter().find(|(p, _)| p == path) {
            None => problems.push(format!("ARCHITECTURE.md names `{}` as a long file, but there is no such file", path.display())),
            Some((_, lines)) if *lines <= LONG_FILE => problems.push(format!(
                "ARCHITECTURE.md names `{}` as a long file, but it has {lines} lines: take it off the list",
                path.display()
            )),
            Some(_) => {}
        }
    }
    problems
}

/// The adapter crates a surface may not depend on (only its tests may).
pub const ADAPTERS: [&str; 5] =
    ["baton-store", "baton-providers", "baton-jail", "baton-workspace", "baton-verifiers"];

/// A surface's `[dependencies]` list no adapter.
pub fn thin_problems(manifest_name: &str, manifest: &str) -> Vec<String> {
    let parsed: toml::Table = match manifest.parse() {
        Ok(table) => table,
        Err(e) => return vec![format!("{manifest_name}: cannot parse: {e}")],
    };
    let Some(deps) = parsed.get("dependencies").and_then(toml::Value::as_table) else {
        return Vec::new();
    };
    ADAPTERS
        .iter()
        .filter(|name| deps.contains_key(**name))
        .map(|name| {
            format!(
                "{manifest_name}: `{name}` is under [dependencies]: a surface reaches adapters through baton-app \
                 (a dev-dependency for tests is fine)"
            )
        })
        .collect()
}
