//! The scenario as a graph: static warnings and drawings (Mermaid, Graphviz dot).
//!
//! A level without outgoing edges leads to the end. A fan-out's children run inside it,
//! so they are reachable exactly when their parent is.

use std::fmt::Write as _;

use crate::diag::Diagnostic;
use crate::model::{END, FAIL, LevelKind, Scenario, Target};
use crate::source::Pos;

/// Warnings about the graph's shape: unreachable levels, and levels whose outgoing edges
/// are all conditional (when no gate holds, the run falls through to the end).
pub fn warnings(scenario: &Scenario, level_pos: &[Pos]) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let reachable = reachable(scenario);
    for (i, level) in scenario.levels.iter().enumerate() {
        let pos = level_pos.get(i).copied().unwrap_or(Pos::UNKNOWN);
        if !reachable[i] {
            out.push(
                Diagnostic::warning(
                    "unreachable-level",
                    pos,
                    format!("level `{}` can never run: no edge leads to it", level.id),
                )
                .with_help(format!("add an edge to `{}` or remove the level", level.id)),
            );
        }
        let edges: Vec<_> = scenario.edges_from(i).collect();
        if !edges.is_empty() && edges.iter().all(|e| e.when.is_some()) {
            out.push(
                Diagnostic::warning(
                    "no-default-edge",
                    pos,
                    format!(
                        "every edge leaving `{}` has a `when`; when none holds, the run ends here",
                        level.id
                    ),
                )
                .with_help(format!(
                    "add a last edge from `{}` without `when` (to `{END}` if the run should end)",
                    level.id
                )),
            );
        }
    }
    out
}

/// Which levels a run can reach from the entry.
pub fn reachable(scenario: &Scenario) -> Vec<bool> {
    let mut seen = vec![false; scenario.levels.len()];
    let mut stack = vec![scenario.entry];
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut seen[i], true) {
            continue;
        }
        for edge in scenario.edges_from(i) {
            if let Target::Level(t) = edge.to {
                stack.push(t);
            }
        }
        if let LevelKind::FanOut { children, .. } = &scenario.levels[i].kind {
            stack.extend(children.iter().copied());
        }
    }
    seen
}

/// The graph in Mermaid flowchart syntax.
pub fn mermaid(scenario: &Scenario) -> String {
    let mut out = String::from("flowchart TD\n");
    let _ = writeln!(out, "  __start__([start]) --> {}", scenario.levels[scenario.entry].id);
    for level in &scenario.levels {
        let terminal = if level.terminal { "<br/>terminal" } else { "" };
        let label = format!("{}<br/><i>{}</i>{terminal}", level.id, level.kind_name());
        let (open, close) = match level.kind {
            LevelKind::HumanApproval { .. } => ("{{", "}}"),
            LevelKind::Verifier => ("[/", "/]"),
            LevelKind::FanOut { .. } => ("[[", "]]"),
            _ => ("[", "]"),
        };
        let _ = writeln!(out, "  {}{open}\"{}\"{close}", level.id, mermaid_escape(&label));
    }
    let mut ends = false;
    let mut fails = false;
    for edge in &scenario.edges {
        let from = &scenario.levels[edge.from].id;
        let to = match edge.to {
            Target::Level(t) => scenario.levels[t].id.as_str(),
            Target::End => {
                ends = true;
                END
            }
            Target::Fail => {
                fails = true;
                FAIL
            }
        };
        match &edge.when {
            Some(gate) => {
                let _ =
                    writeln!(out, "  {from} -->|\"{}\"| {to}", mermaid_escape(&gate.to_string()));
            }
            None => {
                let _ = writeln!(out, "  {from} --> {to}");
            }
        }
    }
    for (i, level) in scenario.levels.iter().enumerate() {
        if let LevelKind::FanOut { children, .. } = &level.kind {
            for &c in children {
                let _ = writeln!(out, "  {} -.-> {}", level.id, scenario.levels[c].id);
            }
        }
        if level.parent.is_none() && scenario.edges_from(i).next().is_none() {
            ends = true;
            let _ = writeln!(out, "  {} --> {END}", level.id);
        }
    }
    if ends {
        let _ = writeln!(out, "  {END}([end])");
    }
    if fails {
        let _ = writeln!(out, "  {FAIL}([fail])");
    }
    out
}

fn mermaid_escape(s: &str) -> String {
    s.replace('"', "#quot;").replace('|', "#124;")
}

/// The graph in Graphviz dot syntax.
pub fn dot(scenario: &Scenario) -> String {
    let mut out = format!(
        "digraph {} {{\n  rankdir=TB;\n  node [shape=box, fontname=\"Helvetica\"];\n",
        dot_id(&scenario.id)
    );
    let _ = writeln!(out, "  __start__ [shape=circle, label=\"start\"];");
    let _ = writeln!(out, "  __start__ -> {};", dot_id(&scenario.levels[scenario.entry].id));
    for level in &scenario.levels {
        let shape = match level.kind {
            LevelKind::HumanApproval { .. } => "hexagon",
            LevelKind::Verifier => "parallelogram",
            LevelKind::FanOut { .. } => "box3d",
            _ => "box",
        };
        let peripheries = if level.terminal { 2 } else { 1 };
        let _ = writeln!(
            out,
            "  {} [shape={shape}, peripheries={peripheries}, label=\"{}\\n({})\"];",
            dot_id(&level.id),
            dot_escape(&level.id),
            level.kind_name()
        );
    }
    let mut ends = false;
    let mut fails = false;
    let edge_line = |out: &mut String, from: &str, to: &str, label: Option<String>, style: &str| {
        let label = label.map_or(String::new(), |l| format!("label=\"{}\", ", dot_escape(&l)));
        let _ = writeln!(out, "  {} -> {} [{label}style={style}];", dot_id(from), dot_id(to));
    };
    for edge in &scenario.edges {
        let from = &scenario.levels[edge.from].id;
        let to = match edge.to {
            Target::Level(t) => scenario.levels[t].id.as_str(),
            Target::End => {
                ends = true;
                END
            }
            Target::Fail => {
                fails = true;
                FAIL
            }
        };
        edge_line(&mut out, from, to, edge.when.as_ref().map(ToString::to_string), "solid");
    }
    for (i, level) in scenario.levels.iter().enumerate() {
        if let LevelKind::FanOut { children, .. } = &level.kind {
            for &c in children {
                edge_line(&mut out, &level.id, &scenario.levels[c].id, None, "dashed");
            }
        }
        if level.parent.is_none() && scenario.edges_from(i).next().is_none() {
            ends = true;
            edge_line(&mut out, &level.id, END, None, "solid");
        }
    }
    if ends {
        let _ = writeln!(out, "  {} [shape=doublecircle, label=\"end\"];", dot_id(END));
    }
    if fails {
        let _ = writeln!(out, "  {} [shape=doubleoctagon, label=\"fail\"];", dot_id(FAIL));
    }
    out.push_str("}\n");
    out
}

fn dot_id(s: &str) -> String {
    format!("\"{}\"", dot_escape(s))
}

fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}
