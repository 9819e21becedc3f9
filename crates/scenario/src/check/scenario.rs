//! A scenario as a whole: [`check`], its own settings (budget, defaults, regression
//! thresholds, routes), its level ids, the graph checks over the result, and its checksum.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

use super::checker::Checker;
use super::levels::LevelDefaults;
use crate::de::from_node;
use crate::diag::Diagnostics;
use crate::digest::hex;
use crate::files::Files;
use crate::graph;
use crate::limits;
use crate::model::{Budget, END, FAIL, LevelIdx, RegressionThresholds, Scenario};
use crate::node::Node;
use crate::raw::RawScenario;
use crate::source::{Pos, Sources};

/// Default failures of one kind before `escalate_now` (reference: three per conflict).
pub const ATTEMPTS_PER_CONFLICT_DEFAULT: u32 = 3;

/// Checks one scenario document. Diagnostics go to `diags`; the scenario is returned only
/// when none of them is an error.
pub fn check(
    node: &Node,
    file: &str,
    files: &mut Files,
    sources: &mut Sources,
    diags: &mut Diagnostics,
) -> Option<Scenario> {
    let raw: RawScenario = match from_node(node) {
        Ok(raw) => raw,
        Err(e) => {
            diags.push(e.into_diagnostic());
            return None;
        }
    };
    let errors_before = diags.error_count();
    files.take_touched();
    let mut checker = Checker { files, sources, diags, errors_at_start: errors_before };
    let scenario = checker.scenario(&raw, node, file);
    if diags.error_count() > errors_before { None } else { scenario }
}

impl Checker<'_> {
    pub(super) fn scenario(
        &mut self,
        raw: &RawScenario,
        node: &Node,
        file: &str,
    ) -> Option<Scenario> {
        self.id(&raw.id, "scenario");
        if raw.version.value == 0 {
            self.error("out-of-range", raw.version.pos, "`version` starts at 1");
        }
        let mut examples = Vec::new();
        for e in &raw.examples {
            if e.value.trim().is_empty() {
                self.error("empty-value", e.pos, "an example must not be empty");
            }
            examples.push(e.value.clone());
        }
        let mut routes = Vec::new();
        let mut seen_routes: HashMap<String, Pos> = HashMap::new();
        for r in &raw.intent_routes {
            let key = r.value.trim().to_lowercase();
            if key.is_empty() {
                self.error("empty-value", r.pos, "an intent route must not be empty");
                continue;
            }
            if seen_routes.insert(key, r.pos).is_some() {
                self.error(
                    "duplicate-route",
                    r.pos,
                    format!("intent route `{}` is listed twice", r.value),
                );
                continue;
            }
            routes.push(r.value.trim().to_owned());
        }

        let budget = match &raw.budget {
            Some(b) => Budget {
                max_cost_usd: self.positive(b.max_cost_usd.as_ref(), "budget.max_cost_usd", 1e6),
                max_tokens: b.max_tokens.as_ref().and_then(|t| {
                    if t.value == 0 {
                        self.error("out-of-range", t.pos, "`budget.max_tokens` must be at least 1");
                        None
                    } else {
                        Some(t.value)
                    }
                }),
                max_duration_s: self.positive(
                    b.max_duration_s.as_ref(),
                    "budget.max_duration_s",
                    limits::TIMEOUT_S_MAX,
                ),
                max_level_runs: self.bounded(
                    b.max_level_runs.as_ref(),
                    "budget.max_level_runs",
                    limits::LEVEL_RUNS_MAX,
                ),
            },
            None => Budget::default(),
        };

        let defaults = raw.defaults.as_ref();
        let default_model =
            defaults.and_then(|d| d.model.as_ref()).and_then(|m| self.model(m, "defaults"));
        let default_timeout = defaults.and_then(|d| {
            self.positive(d.timeout_s.as_ref(), "defaults.timeout_s", limits::TIMEOUT_S_MAX)
        });
        let default_iterations = defaults.and_then(|d| {
            self.bounded(
                d.max_iterations.as_ref(),
                "defaults.max_iterations",
                limits::ITERATIONS_MAX,
            )
        });
        let attempts = defaults
            .and_then(|d| {
                self.bounded(
                    d.max_attempts_per_conflict.as_ref(),
                    "defaults.max_attempts_per_conflict",
                    100,
                )
            })
            .unwrap_or(ATTEMPTS_PER_CONFLICT_DEFAULT);

        let regression = match &raw.regression_thresholds {
            Some(r) => RegressionThresholds {
                score_drop_max: self
                    .fraction(r.score_drop_max.as_ref(), "regression_thresholds.score_drop_max"),
                pass_rate_drop_max: self.fraction(
                    r.pass_rate_drop_max.as_ref(),
                    "regression_thresholds.pass_rate_drop_max",
                ),
                cost_increase_max: self.non_negative(
                    r.cost_increase_max.as_ref(),
                    "regression_thresholds.cost_increase_max",
                ),
                token_increase_max: self.non_negative(
                    r.token_increase_max.as_ref(),
                    "regression_thresholds.token_increase_max",
                ),
                path_changes_allowed: r.path_changes_allowed.as_ref().is_some_and(|b| b.value),
                verdict_changes_allowed: r
                    .verdict_changes_allowed
                    .as_ref()
                    .is_some_and(|b| b.value),
                output_changes_allowed: r.output_changes_allowed.as_ref().is_some_and(|b| b.value),
            },
            None => RegressionThresholds::default(),
        };

        // Level ids first: edges, fan-outs and gates refer to them.
        let raw_levels = &raw.levels.value;
        if raw_levels.is_empty() {
            self.error("no-levels", raw.levels.pos, "the scenario has no levels").help =
                Some("add at least one level under `levels:`".to_owned());
            return None;
        }
        if raw_levels.len() > limits::LEVELS_MAX {
            self.error(
                "too-many",
                raw.levels.pos,
                format!("a scenario may have at most {} levels", limits::LEVELS_MAX),
            );
            return None;
        }
        let mut index: HashMap<String, LevelIdx> = HashMap::new();
        for (i, level) in raw_levels.iter().enumerate() {
            if level.id.value == END || level.id.value == FAIL {
                self.error(
                    "reserved-id",
                    level.id.pos,
                    if level.id.value == END {
                        format!("`{END}` is reserved for the end of the run")
                    } else {
                        format!("`{FAIL}` is reserved for the end of a failed run")
                    },
                );
                continue;
            }
            self.id(&level.id, "level");
            if index.contains_key(&level.id.value) {
                self.error(
                    "duplicate-id",
                    level.id.pos,
                    format!("level id `{}` is used twice", level.id.value),
                )
                .help = Some("level ids must be unique within a scenario".to_owned());
                continue;
            }
            index.insert(level.id.value.clone(), i);
        }

        let toolsets = self.toolsets(raw);
        let parents = self.fan_out_parents(raw_levels, &index);
        let mut levels = Vec::with_capacity(raw_levels.len());
        for (i, level) in raw_levels.iter().enumerate() {
            let ctx = LevelDefaults {
                model: default_model.as_ref(),
                timeout_s: default_timeout,
                max_iterations: default_iterations,
                toolsets: &toolsets,
            };
            if let Some(checked) = self.level(level, &index, parents.get(&i).copied(), &ctx) {
                levels.push(checked);
            }
        }

        let edges = self.edges(raw, &index, &parents);
        if levels.len() != raw_levels.len() || self.diags.has_errors() && edges.is_none() {
            return None;
        }
        let edges = edges?;
        let mut outgoing = vec![Vec::new(); levels.len()];
        for (i, edge) in edges.iter().enumerate() {
            outgoing[edge.from].push(i);
        }
        let Some(entry) = (0..levels.len()).find(|&i| levels[i].parent.is_none()) else {
            self.error(
                "no-entry",
                raw.levels.pos,
                "every level is a fan-out child; no level can start the run",
            );
            return None;
        };

        let workspace_seed = match raw.workspace.as_ref().and_then(|w| w.value.seed.as_ref()) {
            Some(seed) => Some(self.files.seed(&seed.value, seed.pos, self.diags)?),
            None => None,
        };
        let mut scenario = Scenario {
            id: raw.id.value.clone(),
            version: raw.version.value,
            display_name: raw.display_name.clone().unwrap_or_else(|| raw.id.value.clone()),
            description: raw.description.clone().unwrap_or_default().trim().to_owned(),
            examples,
            intent_routes: routes,
            budget,
            max_attempts_per_conflict: attempts,
            levels,
            edges,
            entry,
            regression,
            metadata: raw.metadata.as_ref().map(|m| m.value.clone()).unwrap_or_default(),
            workspace_seed,
            checksum: String::new(),
            texts: Default::default(),
            file: file.to_owned(),
            outgoing,
            index,
        };
        if self.diags.error_count() > self.errors_at_start {
            return None;
        }
        let level_pos: Vec<Pos> = raw_levels.iter().map(|l| l.id.pos).collect();
        let closed = graph::closed_loops(&scenario, &level_pos);
        if !closed.is_empty() {
            for e in closed {
                self.diags.push(e);
            }
            return None;
        }
        // Every edge was checked without error, so the raw edges match the checked ones.
        let edge_pos: Vec<Pos> =
            raw.edges.iter().map(|e| e.when.as_ref().map_or(e.pos, |w| w.pos)).collect();
        for w in graph::warnings(&scenario, &level_pos) {
            self.diags.push(w);
        }
        for w in graph::constant_exit_warnings(&scenario, &edge_pos) {
            self.diags.push(w);
        }
        for w in graph::uncovered_failure_warnings(&scenario, &level_pos) {
            self.diags.push(w);
        }
        let (sum, texts) = checksum(node, self.files);
        scenario.checksum = sum;
        scenario.texts = std::sync::Arc::new(texts);
        Some(scenario)
    }
}

/// The sha256 of the canonical scenario and of every file it read, and those texts.
fn checksum(node: &Node, files: &mut Files) -> (String, crate::model::Texts) {
    let mut canonical = String::new();
    node.write_canonical(&mut canonical);
    let read = files.touched_texts();
    let mut hasher = Sha256::new();
    hasher.update(canonical.as_bytes());
    for (name, text) in files.take_touched() {
        hasher.update(b"\n");
        hasher.update(name.as_bytes());
        hasher.update(b"\0");
        hasher.update(text.as_bytes());
    }
    let sum = hex(&hasher.finalize());
    (sum, crate::model::Texts { canonical, files: read })
}
