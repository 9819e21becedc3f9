//! Edges between levels: their ends, their order, and each `when:` gate parsed and typed.

use std::collections::HashMap;

use super::checker::Checker;
use crate::de::Located;
use crate::expr::{self, Scope};
use crate::limits;
use crate::model::{END, Edge, FAIL, LevelIdx, Target};
use crate::raw::{RawKind, RawScenario};
use crate::source::{Pos, pos_in_text};
use crate::suggest;

impl Checker<'_> {
    pub(super) fn edges(
        &mut self,
        raw: &RawScenario,
        index: &HashMap<String, LevelIdx>,
        parents: &HashMap<LevelIdx, LevelIdx>,
    ) -> Option<Vec<Edge>> {
        if raw.edges.len() > limits::EDGES_MAX {
            self.error(
                "too-many",
                raw.edges[0].pos,
                format!("a scenario may have at most {} edges", limits::EDGES_MAX),
            );
            return None;
        }
        let level_ids: Vec<&str> = raw.levels.value.iter().map(|l| l.id.value.as_str()).collect();
        let mut edges = Vec::new();
        let mut ok = true;
        let mut unconditional_from: HashMap<LevelIdx, Pos> = HashMap::new();
        for e in &raw.edges {
            let from = self.edge_end(&e.from, index, false);
            let to = self.edge_end(&e.to, index, true);
            let (Some(Target::Level(from)), Some(to)) = (from, to) else {
                ok = false;
                continue;
            };
            let source = &raw.levels.value[from];
            let when = match &e.when {
                None => None,
                Some(w) => {
                    let verifiers: Vec<&str> =
                        source.verifiers.iter().map(|v| v.name.value.as_str()).collect();
                    let scope = Scope {
                        levels: Some(level_ids.clone()),
                        verifiers: Some(verifiers),
                        source_level: Some(&source.id.value),
                        result: false,
                        args: false,
                        wave: Some(source.kind.value == RawKind::Wave),
                    };
                    match self.gate(w, &scope) {
                        Some(g) => Some(g),
                        None => {
                            ok = false;
                            continue;
                        }
                    }
                }
            };
            if let Some(first) = unconditional_from.get(&from) {
                self.warning("unreachable-edge", e.pos, format!(
                    "this edge is never taken: the unconditional edge from `{}` on line {} always wins",
                    source.id.value, first.line
                ))
                .help = Some("edges are tried in order; move the unconditional one last".to_owned());
            } else if when.is_none() {
                unconditional_from.insert(from, e.pos);
            }
            edges.push(Edge { from, to, when });
        }
        // Edges from fan-out children are never taken: the parent routes.
        let levels = &raw.levels.value;
        for e in &raw.edges {
            if index.get(&e.from.value).is_some_and(|i| parents.contains_key(i)) {
                self.error(
                    "edge-from-child",
                    e.from.pos,
                    format!(
                        "`{}` is a fan-out child; its parent decides where the run goes next",
                        e.from.value
                    ),
                )
                .help = Some("put the edge on the fan_out level instead".to_owned());
                ok = false;
            }
            if let Some(parent) = index.get(&e.to.value).and_then(|i| parents.get(i)) {
                let parent = &levels[*parent].id.value;
                self.error(
                    "edge-to-child",
                    e.to.pos,
                    format!(
                        "`{}` is a child of fan-out `{parent}`; it runs only as part of it",
                        e.to.value
                    ),
                )
                .help = Some(format!("point the edge at `{parent}`"));
                ok = false;
            }
        }
        ok.then_some(edges)
    }

    pub(super) fn edge_end(
        &mut self,
        end: &Located<String>,
        index: &HashMap<String, LevelIdx>,
        may_end: bool,
    ) -> Option<Target> {
        if end.value == END || end.value == FAIL {
            if may_end {
                return Some(if end.value == END { Target::End } else { Target::Fail });
            }
            self.error("dangling-edge", end.pos, format!("an edge cannot leave `{}`", end.value));
            return None;
        }
        if let Some(&i) = index.get(&end.value) {
            return Some(Target::Level(i));
        }
        let near = suggest::closest(&end.value, index.keys().map(String::as_str));
        let help = match near {
            Some(n) => format!("did you mean `{n}`?"),
            None if may_end => {
                format!("name a level of this scenario, `{END}` or `{FAIL}`")
            }
            None => "name a level of this scenario".to_owned(),
        };
        self.error(
            "dangling-edge",
            end.pos,
            format!("the edge refers to `{}`, which is not a level of this scenario", end.value),
        )
        .help = Some(help);
        None
    }

    pub(super) fn gate(&mut self, when: &Located<String>, scope: &Scope<'_>) -> Option<expr::Gate> {
        let parsed = match expr::parse(&when.value) {
            Ok(e) => e,
            Err(e) => {
                let pos = self.span_pos(when, e.span);
                self.error("gate-syntax", pos, format!("invalid gate: {}", e.message)).help =
                    e.help;
                return None;
            }
        };
        match expr::resolve(&parsed, scope) {
            Ok(g) => Some(g),
            Err(e) => {
                let pos = self.span_pos(when, e.span);
                self.error("gate-check", pos, format!("invalid gate: {}", e.message)).help = e.help;
                None
            }
        }
    }

    /// The file position of a span inside a `when:` string, exact in every YAML scalar
    /// style (see [`crate::scalar`]); the whole value when the value cannot be traced.
    pub(super) fn span_pos(&self, when: &Located<String>, span: expr::Span) -> Pos {
        let Some(source) = self.sources.get(when.pos.source) else { return when.pos };
        let start = when.pos.byte as usize;
        let end = start + when.pos.len as usize;
        let Some(map) = crate::scalar::offsets(&source.text, start, end, &when.value) else {
            return when.pos;
        };
        let (from, to) = (span.start as usize, span.end as usize);
        match (map.get(from), map.get(to.max(from))) {
            (Some(&a), Some(&b)) => {
                // A token is on one line; its width in the file is the source it spans.
                let len = if to > from { b.saturating_sub(a).max(1) } else { 1 };
                pos_in_text(&source.text, a, len, when.pos.source)
            }
            _ => when.pos,
        }
    }
}
