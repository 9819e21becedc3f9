//! The scenario as a graph: static warnings and drawings (Mermaid, Graphviz dot).
//!
//! A level without outgoing edges leads to the end. A fan-out's children run inside it,
//! so they are reachable exactly when their parent is.
//!
//! [`closed_loops`] finds loops a run can never leave: a strongly connected set of levels
//! from which no level that can end the run is reachable. A level can end the run when it
//! has an edge to `__end__`, no edge at all, or no unconditional edge (when no gate
//! holds, the run falls through to the end). [`constant_exit_warnings`] flags loops whose
//! every exit is a gate over values the loop cannot change.

use std::fmt::Write as _;

use crate::diag::Diagnostic;
use crate::expr::{Context, PathRef, Root, Semantics, Val};
use crate::model::{END, ErrorKind, FAIL, LevelIdx, LevelKind, Response, Scenario, Target};
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

/// The levels whose runs can lead the run to its end: those that can end it themselves
/// (an edge to `__end__` or `__fail__`, no edge, or no unconditional edge) and those with an edge to one.
fn can_end(scenario: &Scenario) -> Vec<bool> {
    let n = scenario.levels.len();
    let mut ends: Vec<bool> = (0..n)
        .map(|i| {
            let mut edges = taken(scenario, i).peekable();
            edges.peek().is_none()
                || taken(scenario, i).any(|e| matches!(e.to, Target::End | Target::Fail))
                || taken(scenario, i).all(|e| e.when.is_some())
        })
        .collect();
    // Backwards to a fixpoint: a level that has an edge to a level that can end can end.
    loop {
        let mut changed = false;
        for from in 0..n {
            if !ends[from]
                && taken(scenario, from).any(|e| matches!(e.to, Target::Level(t) if ends[t]))
            {
                ends[from] = true;
                changed = true;
            }
        }
        if !changed {
            return ends;
        }
    }
}

/// The edges of a level a run can take: in declared order, up to the first unconditional
/// one (the edges after it never fire).
fn taken(scenario: &Scenario, level: LevelIdx) -> impl Iterator<Item = &crate::model::Edge> {
    let mut open = true;
    scenario.edges_from(level).take_while(move |e| {
        let keep = open;
        open = open && e.when.is_some();
        keep
    })
}

/// Which top-level levels each level can reach through edges (itself only through a cycle).
fn reach(scenario: &Scenario) -> Vec<Vec<bool>> {
    let n = scenario.levels.len();
    (0..n)
        .map(|start| {
            let mut seen = vec![false; n];
            let mut stack: Vec<LevelIdx> = taken(scenario, start)
                .filter_map(|e| match e.to {
                    Target::Level(t) => Some(t),
                    Target::End | Target::Fail => None,
                })
                .collect();
            while let Some(i) = stack.pop() {
                if std::mem::replace(&mut seen[i], true) {
                    continue;
                }
                for edge in taken(scenario, i) {
                    if let Target::Level(t) = edge.to {
                        stack.push(t);
                    }
                }
            }
            seen
        })
        .collect()
}

/// The loops of the graph: strongly connected sets of top-level levels that hold a cycle
/// (two levels or more, or one with an edge to itself), each in file order.
fn loops(scenario: &Scenario) -> Vec<Vec<LevelIdx>> {
    let n = scenario.levels.len();
    let reach = reach(scenario);
    let mut placed = vec![false; n];
    let mut out = Vec::new();
    for i in 0..n {
        if placed[i] || scenario.levels[i].parent.is_some() || !reach[i][i] {
            continue;
        }
        let members: Vec<LevelIdx> =
            (0..n).filter(|&j| j == i || reach[i][j] && reach[j][i]).collect();
        for &j in &members {
            placed[j] = true;
        }
        out.push(members);
    }
    out
}

fn id_list(scenario: &Scenario, members: &[LevelIdx]) -> String {
    let ids: Vec<String> =
        members.iter().map(|&i| format!("`{}`", scenario.levels[i].id)).collect();
    ids.join(", ")
}

/// Errors for loops a run can enter and never leave: no level of the loop can reach a
/// level that ends the run, so the run would only stop at its step limit.
pub fn closed_loops(scenario: &Scenario, level_pos: &[Pos]) -> Vec<Diagnostic> {
    let ends = can_end(scenario);
    loops(scenario)
        .into_iter()
        .filter(|members| members.iter().all(|&i| !ends[i]))
        .map(|members| {
            let first = members[0];
            let pos = level_pos.get(first).copied().unwrap_or(Pos::UNKNOWN);
            let message = if members.len() == 1 {
                format!(
                    "level `{}` loops to itself and the run can never leave it: no path leads to `{END}`",
                    scenario.levels[first].id
                )
            } else {
                format!(
                    "levels {} form a loop the run can never leave: no path leads to `{END}`",
                    id_list(scenario, &members)
                )
            };
            Diagnostic::error("closed-loop", pos, message).with_help(format!(
                "add an edge from one of them to `{END}` (or to a level that reaches it), or give the looping edge a `when`"
            ))
        })
        .collect()
}

/// Warnings for loops whose only exits are gates that read nothing the loop changes: such
/// a gate is as true or false on the tenth pass as on the first, so the loop either never
/// repeats or never ends.
///
/// A value counts as unchanged only when it certainly is: `input` and `metadata` (fixed
/// for the run) and `level.<id>` of a level outside the loop (and not a fan-out child of
/// one inside it). `verdict`, `confidence`, `attempt`, `escalate_now`, `verifier.*` and
/// `scratchpad` may change on every pass, so a gate reading any of them is never flagged.
pub fn constant_exit_warnings(scenario: &Scenario, edge_pos: &[Pos]) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for members in loops(scenario) {
        let inside = |i: LevelIdx| {
            members.contains(&i) || scenario.levels[i].parent.is_some_and(|p| members.contains(&p))
        };
        let exits: Vec<usize> = scenario
            .edges
            .iter()
            .enumerate()
            .filter(|(_, e)| members.contains(&e.from))
            .filter(|(_, e)| match e.to {
                Target::End | Target::Fail => true,
                Target::Level(t) => !members.contains(&t),
            })
            .map(|(k, _)| k)
            .collect();
        // A level of the loop without an unconditional edge falls through to the end:
        // that exit needs no gate, so the loop is not stuck on one.
        let falls_through =
            members.iter().any(|&i| scenario.edges_from(i).all(|e| e.when.is_some()));
        if exits.is_empty() || falls_through {
            continue;
        }
        let constant = exits.iter().all(|&k| {
            scenario.edges[k].when.as_ref().is_some_and(|gate| {
                gate.paths().iter().all(|p| match p.root {
                    Root::Input | Root::Metadata => true,
                    Root::Level => p
                        .segments
                        .get(1)
                        .and_then(|id| scenario.level_index(id))
                        .is_some_and(|i| !inside(i)),
                    _ => false,
                })
            })
        });
        if !constant {
            continue;
        }
        let k = exits[0];
        let pos = edge_pos.get(k).copied().unwrap_or(Pos::UNKNOWN);
        out.push(
            Diagnostic::warning(
                "constant-exit",
                pos,
                format!(
                    "the loop through {} leaves only through gates that read nothing the loop changes; if they are false on the first pass they stay false",
                    id_list(scenario, &members)
                ),
            )
            .with_help(
                "make the exit read what the loop produces (`verdict`, `attempt`, `level.<id>` of a level in the loop), or add an unconditional exit",
            ),
        );
    }
    out
}

/// The ways an attempt of `level` can fail, as `level.X.error.kind` names them.
pub fn failure_kinds(scenario: &Scenario, level: LevelIdx) -> Vec<ErrorKind> {
    let l = &scenario.levels[level];
    let mut kinds = Vec::new();
    match &l.kind {
        LevelKind::Prompt { response, .. } => {
            kinds.extend([ErrorKind::Provider, ErrorKind::Truncated, ErrorKind::Refused]);
            if !matches!(response, Response::Markdown) {
                kinds.push(ErrorKind::Invalid);
            }
        }
        LevelKind::ToolLoop { .. } => {
            kinds.extend([
                ErrorKind::Provider,
                ErrorKind::Truncated,
                ErrorKind::Refused,
                ErrorKind::Tool,
            ]);
        }
        LevelKind::Verifier => kinds.push(ErrorKind::Verifier),
        LevelKind::FanOut { children, .. } => {
            for &child in children {
                for kind in failure_kinds(scenario, child) {
                    if !kinds.contains(&kind) {
                        kinds.push(kind);
                    }
                }
            }
        }
        LevelKind::HumanApproval { .. } | LevelKind::Wave(_) => {}
    }
    if !l.verifiers.is_empty() && !kinds.contains(&ErrorKind::Verifier) {
        kinds.push(ErrorKind::Verifier);
    }
    if l.timeout_s.is_some() && !kinds.contains(&ErrorKind::Timeout) {
        kinds.push(ErrorKind::Timeout);
    }
    kinds
}

/// Whether a failure of this kind comes with an error: such an attempt is routed only by
/// the edges whose gates read how it ended ([`crate::expr::Gate::reads_outcome_of`]); the
/// others (a timeout, an answer that did not read, a failed check) by every edge.
pub fn is_error(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::Provider | ErrorKind::Truncated | ErrorKind::Refused | ErrorKind::Tool
    )
}

/// A level's last attempt as a gate sees it when it failed with `kind` and nothing else is
/// known.
struct FailedAs<'a> {
    level: &'a str,
    kind: ErrorKind,
}

impl Context for FailedAs<'_> {
    fn lookup(&self, path: &PathRef) -> Val<'_> {
        let s = &path.segments;
        if path.root != Root::Level || s.get(1).map(String::as_str) != Some(self.level) {
            return Val::Undefined;
        }
        match (s.get(2).map(String::as_str), s.get(3).map(String::as_str)) {
            (Some("failed"), _) => Val::Bool(true),
            (Some("ok"), _) => Val::Bool(!is_error(self.kind)),
            (Some("timed_out"), _) => Val::Bool(self.kind == ErrorKind::Timeout),
            (Some("error"), Some("kind")) => Val::Str(self.kind.as_str()),
            _ => Val::Undefined,
        }
    }
}

/// Warnings for levels whose edges route failures by `level.X.failed` or
/// `level.X.error.…` and leave a way the level can fail to no edge: such a failure ends
/// the run. A gate counts as covering a kind unless it is certainly false for it, all else
/// unknown.
pub fn uncovered_failure_warnings(scenario: &Scenario, level_pos: &[Pos]) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for (i, level) in scenario.levels.iter().enumerate() {
        let reads_failure = |p: &PathRef| {
            p.root == Root::Level
                && p.segments.get(1).is_some_and(|l| *l == level.id)
                && p.segments.get(2).is_some_and(|f| f == "failed" || f == "error")
        };
        let guarded = scenario
            .edges_from(i)
            .any(|e| e.when.as_ref().is_some_and(|g| g.paths().iter().any(reads_failure)));
        if !guarded {
            continue;
        }
        let uncovered: Vec<&str> = failure_kinds(scenario, i)
            .into_iter()
            .filter(|&kind| {
                let ctx = FailedAs { level: &level.id, kind };
                !scenario.edges_from(i).any(|e| match &e.when {
                    None => !is_error(kind),
                    Some(gate) => {
                        (!is_error(kind) || gate.reads_outcome_of(&level.id))
                            && gate.value_under(Semantics::CURRENT, &ctx) != Val::Bool(false)
                    }
                })
            })
            .map(ErrorKind::as_str)
            .collect();
        if uncovered.is_empty() {
            continue;
        }
        let pos = level_pos.get(i).copied().unwrap_or(Pos::UNKNOWN);
        out.push(
            Diagnostic::warning(
                "uncovered-failure",
                pos,
                format!(
                    "level `{}` routes its failures by gates, but no edge takes a `{}` failure: such an attempt ends the run failed",
                    level.id,
                    uncovered.join("`, `")
                ),
            )
            .with_help(format!(
                "add an edge for it (e.g. `when: level.{}.failed`) or to `__fail__` to make the end explicit",
                level.id
            )),
        );
    }
    out
}

/// Which levels a run can reach from the entry.
pub fn reachable(scenario: &Scenario) -> Vec<bool> {
    reachable_from(scenario, &[scenario.entry])
}

/// Which levels a run can reach from `start` (each of which counts as reached), by edges and
/// fan-outs' children.
pub fn reachable_from(scenario: &Scenario, start: &[LevelIdx]) -> Vec<bool> {
    let mut seen = vec![false; scenario.levels.len()];
    let mut stack = start.to_vec();
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
