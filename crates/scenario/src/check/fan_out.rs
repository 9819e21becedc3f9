//! Fan-out levels: which level is whose child, and each fan-out's children and `fan_in`.

use std::collections::{BTreeMap, HashMap};

use super::checker::Checker;
use crate::de::Located;
use crate::limits;
use crate::model::{Aggregator, FanIn, LevelIdx, LevelKind};
use crate::raw::{RawKind, RawLevel};
use crate::suggest;

impl Checker<'_> {
    /// Maps each fan-out child to its parent, reporting children that do not exist,
    /// that are their own parent, fan-outs themselves, or claimed twice.
    pub(super) fn fan_out_parents(
        &mut self,
        levels: &[Located<RawLevel>],
        index: &HashMap<String, LevelIdx>,
    ) -> HashMap<LevelIdx, LevelIdx> {
        let mut parents: HashMap<LevelIdx, LevelIdx> = HashMap::new();
        for (i, level) in levels.iter().enumerate() {
            let Some(children) = &level.fan_out else { continue };
            for child in &children.value {
                let Some(&c) = index.get(&child.value) else {
                    let help = suggest::closest(&child.value, index.keys().map(String::as_str))
                        .map(|n| format!("did you mean `{n}`?"));
                    self.error(
                        "unknown-level",
                        child.pos,
                        format!("fan-out child `{}` is not a level of this scenario", child.value),
                    )
                    .help = help;
                    continue;
                };
                if c == i {
                    self.error(
                        "fan-out-self",
                        child.pos,
                        format!("level `{}` lists itself as a fan-out child", child.value),
                    );
                    continue;
                }
                if levels[c].kind.value == RawKind::FanOut {
                    self.error("nested-fan-out", child.pos, format!("fan-out child `{}` is itself a fan_out", child.value)).help =
                        Some("a child runs one level; list the inner children on the outer fan-out instead".to_owned());
                    continue;
                }
                if levels[c].kind.value == RawKind::ToolLoop {
                    self.error(
                        "fan-out-tool-loop",
                        child.pos,
                        format!(
                            "fan-out child `{}` is a tool_loop; tool loops cannot run inside a fan-out yet",
                            child.value
                        ),
                    )
                    .help = Some(format!(
                        "branches would share one workspace; run `{}` as a level of its own, before or after fan-out `{}`",
                        child.value, level.id.value
                    ));
                    continue;
                }
                if let Some(&other) = parents.get(&c) {
                    if other != i {
                        let other_id = &levels[other].id.value;
                        self.error(
                            "shared-child",
                            child.pos,
                            format!(
                                "level `{}` is already a child of fan-out `{other_id}`",
                                child.value
                            ),
                        );
                    } else {
                        self.error(
                            "duplicate-id",
                            child.pos,
                            format!("child `{}` is listed twice", child.value),
                        );
                    }
                    continue;
                }
                parents.insert(c, i);
            }
        }
        parents
    }

    pub(super) fn fan_out(
        &mut self,
        raw: &Located<RawLevel>,
        index: &HashMap<String, LevelIdx>,
    ) -> Option<LevelKind> {
        let Some(children) = &raw.fan_out else {
            self.error(
                "missing-field",
                raw.pos,
                format!("fan_out level `{}` needs a `fan_out` list of child levels", raw.id.value),
            );
            return None;
        };
        if children.value.is_empty() {
            self.error("empty-value", children.pos, "the `fan_out` list is empty");
            return None;
        }
        let Some(fan_in) = &raw.fan_in else {
            self.error(
                "missing-field",
                raw.pos,
                format!("fan_out level `{}` needs `fan_in` with an aggregator", raw.id.value),
            )
            .help = Some("for example `fan_in: {aggregator: majority_pass}`".to_owned());
            return None;
        };
        let child_ids: Vec<&str> = children.value.iter().map(|c| c.value.as_str()).collect();
        let aggregator = fan_in.aggregator.value;
        let threshold = match (&fan_in.threshold, aggregator) {
            (Some(t), Aggregator::WeightedScore) => self.fraction(Some(t), "fan_in.threshold")?,
            (Some(t), _) => {
                self.error(
                    "field-not-for-kind",
                    t.pos,
                    "`threshold` applies to the `weighted_score` aggregator only",
                );
                return None;
            }
            (None, _) => 0.5,
        };
        let mut weights = BTreeMap::new();
        if let Some(w) = &fan_in.weights {
            if aggregator != Aggregator::WeightedScore {
                self.error(
                    "field-not-for-kind",
                    w.pos,
                    "`weights` applies to the `weighted_score` aggregator only",
                );
                return None;
            }
            for (child, weight) in &w.value {
                if !child_ids.contains(&child.as_str()) {
                    self.error(
                        "unknown-level",
                        weight.pos,
                        format!("`{child}` has a weight but is not a child of this fan-out"),
                    );
                    return None;
                }
                if !(weight.value.is_finite() && weight.value >= 0.0) {
                    self.error(
                        "out-of-range",
                        weight.pos,
                        format!("a weight must be zero or more, found {}", weight.value),
                    );
                    return None;
                }
                weights.insert(child.clone(), weight.value);
            }
        }
        let max_parallel = self
            .bounded(raw.max_parallel.as_ref(), "max_parallel", limits::PARALLEL_MAX)
            .unwrap_or_else(|| {
                u32::try_from(children.value.len())
                    .unwrap_or(limits::PARALLEL_MAX)
                    .min(limits::PARALLEL_MAX)
            });
        let children: Vec<LevelIdx> =
            children.value.iter().filter_map(|c| index.get(&c.value).copied()).collect();
        Some(LevelKind::FanOut {
            children,
            fan_in: FanIn { aggregator, threshold, weights },
            max_parallel,
        })
    }
}
