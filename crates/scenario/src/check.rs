//! From a raw scenario to a checked [`Scenario`]: every rule of the format.
//!
//! The checker keeps going after a problem so that one run of `baton validate` shows an
//! author everything wrong with a file. It returns a scenario only when it found no error.
//! Warnings (unreachable levels, levels that can fall through to the end) never stop it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::de::{Located, from_node};
use crate::diag::{Diagnostic, Diagnostics};
pub use crate::digest::hex;
use crate::expr::{self, Scope};
use crate::files::{Files, check_template};
use crate::graph;
use crate::limits;
use crate::model::{
    Aggregator, Budget, END, Edge, FAIL, FanIn, Level, LevelIdx, LevelKind, Mode, ModelConstraint,
    OnFail, RegressionThresholds, Response, RetryPolicy, Scenario, Target, Template, Tier, Uses,
    VerifierSpec, WaveDispatch, WaveSource, WaveSpec,
};
use crate::node::Node;
use crate::raw::{
    RawKind, RawLevel, RawModel, RawPrompt, RawResponse, RawScenario, RawSchema, RawVerifier,
};
use crate::schema::JsonSchema;
use crate::source::{Pos, Sources, pos_in_text};
use crate::suggest;

/// Default failures of one kind before `escalate_now` (reference: three per conflict).
pub const ATTEMPTS_PER_CONFLICT_DEFAULT: u32 = 3;

/// Default approver role of a `human_approval` level.
pub const APPROVER_ROLE_DEFAULT: &str = "approver";

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

struct Checker<'a> {
    files: &'a mut Files,
    sources: &'a mut Sources,
    diags: &'a mut Diagnostics,
    /// Errors already in `diags` before this scenario: graph warnings are only worth
    /// giving about a scenario that has none of its own.
    errors_at_start: usize,
}

/// Whether `s` is a well-formed id: a lower-case letter, then lower-case letters, digits, `_`.
pub fn is_id(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && s.len() <= limits::ID_CHARS_MAX
}

impl Checker<'_> {
    fn error(
        &mut self,
        code: &'static str,
        pos: Pos,
        message: impl Into<String>,
    ) -> &mut Diagnostic {
        self.diags.push(Diagnostic::error(code, pos, message));
        self.last()
    }

    fn warning(
        &mut self,
        code: &'static str,
        pos: Pos,
        message: impl Into<String>,
    ) -> &mut Diagnostic {
        self.diags.push(Diagnostic::warning(code, pos, message));
        self.last()
    }

    fn last(&mut self) -> &mut Diagnostic {
        self.diags.last_mut().expect("a diagnostic was pushed just before")
    }

    fn id(&mut self, id: &Located<String>, what: &str) {
        if !is_id(&id.value) {
            self.error("bad-id", id.pos, format!("`{}` is not a valid {what} id", id.value)).help =
                Some(format!(
                    "ids start with a lower-case letter and hold lower-case letters, digits and `_` (at most {} characters)",
                    limits::ID_CHARS_MAX
                ));
        }
    }

    /// The value when `holds` is true of it (and it is finite); else an error saying it
    /// must be `expected`.
    fn number(
        &mut self,
        value: Option<&Located<f64>>,
        what: &str,
        expected: &str,
        holds: impl Fn(f64) -> bool,
    ) -> Option<f64> {
        let v = value?;
        if !(v.value.is_finite() && holds(v.value)) {
            self.error(
                "out-of-range",
                v.pos,
                format!("`{what}` must be {expected}, found {}", v.value),
            );
            return None;
        }
        Some(v.value)
    }

    fn positive(&mut self, value: Option<&Located<f64>>, what: &str, max: f64) -> Option<f64> {
        self.number(value, what, &format!("a number in (0, {max}]"), |v| v > 0.0 && v <= max)
    }

    fn non_negative(&mut self, value: Option<&Located<f64>>, what: &str) -> Option<f64> {
        self.number(value, what, "zero or more", |v| v >= 0.0)
    }

    fn fraction(&mut self, value: Option<&Located<f64>>, what: &str) -> Option<f64> {
        self.number(value, what, "between 0 and 1", |v| (0.0..=1.0).contains(&v))
    }

    fn bounded(&mut self, value: Option<&Located<u32>>, what: &str, max: u32) -> Option<u32> {
        let v = value?;
        if v.value == 0 || v.value > max {
            self.error(
                "out-of-range",
                v.pos,
                format!("`{what}` must be between 1 and {max}, found {}", v.value),
            );
            return None;
        }
        Some(v.value)
    }

    fn scenario(&mut self, raw: &RawScenario, node: &Node, file: &str) -> Option<Scenario> {
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

        let parents = self.fan_out_parents(raw_levels, &index);
        let mut levels = Vec::with_capacity(raw_levels.len());
        for (i, level) in raw_levels.iter().enumerate() {
            let ctx = LevelDefaults {
                model: default_model.as_ref(),
                timeout_s: default_timeout,
                max_iterations: default_iterations,
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
        let (sum, texts) = checksum(node, self.files);
        scenario.checksum = sum;
        scenario.texts = std::sync::Arc::new(texts);
        Some(scenario)
    }

    /// Maps each fan-out child to its parent, reporting children that do not exist,
    /// that are their own parent, fan-outs themselves, or claimed twice.
    fn fan_out_parents(
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

    fn level(
        &mut self,
        raw: &Located<RawLevel>,
        index: &HashMap<String, LevelIdx>,
        parent: Option<LevelIdx>,
        defaults: &LevelDefaults<'_>,
    ) -> Option<Level> {
        let errors_before = self.diags.error_count();
        let kind = raw.kind.value;
        self.fields_for_kind(raw, kind);
        let model = match &raw.model {
            Some(m) => self.model(m, "level"),
            None => defaults.model.cloned(),
        };
        let verifiers = self.verifiers(raw);
        // The default timeout bounds work (model calls, tool loops, verifiers), not the wait
        // for a person or the span of a fan-out.
        let default_timeout = match kind {
            RawKind::Prompt | RawKind::ToolLoop | RawKind::Verifier => defaults.timeout_s,
            RawKind::FanOut | RawKind::HumanApproval | RawKind::Wave => None,
        };
        let timeout_s = self
            .positive(raw.timeout_s.as_ref(), "timeout_s", limits::TIMEOUT_S_MAX)
            .or(default_timeout);
        let level_kind = match kind {
            RawKind::Prompt => {
                let prompt = self.required_prompt(raw);
                let response = match raw.response.as_ref().map(|r| &r.value) {
                    None | Some(RawResponse::Markdown) => Response::Markdown,
                    Some(RawResponse::Verdict) => Response::Verdict,
                    Some(RawResponse::Json { schema }) => {
                        Response::Json { schema: schema.as_ref().and_then(|s| self.schema(s)) }
                    }
                };
                for v in &verifiers {
                    if v.uses == Uses::Schema && !matches!(response, Response::Json { .. }) {
                        let pos = raw
                            .verifiers
                            .iter()
                            .find(|r| r.name.value == v.name)
                            .map_or(raw.pos, |r| r.uses.pos);
                        self.error("schema-needs-json", pos, format!("verifier `{}` checks parsed JSON, but the level's response is not json", v.name)).help =
                            Some("set `response: json` on this level".to_owned());
                    }
                }
                prompt.map(|prompt| LevelKind::Prompt { prompt, response })
            }
            RawKind::ToolLoop => {
                let prompt = self.required_prompt(raw);
                let max_iterations = self
                    .bounded(raw.max_iterations.as_ref(), "max_iterations", limits::ITERATIONS_MAX)
                    .or(defaults.max_iterations)
                    .unwrap_or(limits::ITERATIONS_DEFAULT);
                prompt.map(|prompt| LevelKind::ToolLoop { prompt, max_iterations })
            }
            RawKind::Verifier => {
                if raw.verifiers.is_empty() {
                    self.error(
                        "no-verifiers",
                        raw.kind.pos,
                        format!("verifier level `{}` declares no verifiers", raw.id.value),
                    )
                    .help = Some("add a `verifiers:` list".to_owned());
                }
                Some(LevelKind::Verifier)
            }
            RawKind::FanOut => self.fan_out(raw, index),
            RawKind::Wave => self.wave(raw, index),
            RawKind::HumanApproval => {
                let prompt = raw.prompt.as_ref().and_then(|p| self.prompt(p, &raw.id.value));
                let approver_role = raw.approver_role.as_ref().map_or_else(
                    || APPROVER_ROLE_DEFAULT.to_owned(),
                    |r| r.value.trim().to_owned(),
                );
                if approver_role.is_empty() {
                    let pos = raw.approver_role.as_ref().map_or(raw.pos, |r| r.pos);
                    self.error("empty-value", pos, "`approver_role` must not be empty");
                }
                let output_schema = match &raw.output_schema {
                    Some(s) => self.schema(s),
                    None => Some(
                        JsonSchema::compile(crate::schema::approval_default())
                            .expect("the default approval schema is a valid JSON Schema"),
                    ),
                };
                output_schema.map(|output_schema| LevelKind::HumanApproval {
                    prompt,
                    approver_role,
                    output_schema,
                })
            }
        };
        if raw.mode.is_some() && raw.verifiers.is_empty() {
            let pos = raw.mode.as_ref().map_or(raw.pos, |m| m.pos);
            self.error(
                "mode-without-verifiers",
                pos,
                "`mode` sets how verifiers run, but the level has none",
            );
        }
        if raw.run_all.is_some()
            && !matches!(raw.mode.as_ref().map(|m| m.value), None | Some(Mode::Serial))
        {
            let pos = raw.run_all.as_ref().map_or(raw.pos, |r| r.pos);
            self.error("field-not-for-kind", pos, "`run_all` applies to `serial` mode only");
        }
        if self.diags.error_count() > errors_before {
            return None;
        }
        Some(Level {
            id: raw.id.value.clone(),
            role: raw.role.as_ref().map_or_else(|| raw.id.value.clone(), |r| r.value.clone()),
            kind: level_kind?,
            model,
            verifiers,
            mode: raw.mode.as_ref().map_or(Mode::Serial, |m| m.value),
            run_all: raw.run_all.as_ref().is_some_and(|r| r.value),
            terminal: raw.terminal.as_ref().is_some_and(|t| t.value),
            timeout_s,
            metadata: raw.metadata.as_ref().map(|m| m.value.clone()).unwrap_or_default(),
            parent,
        })
    }

    /// Refuses settings that the level's kind does not use.
    fn fields_for_kind(&mut self, raw: &Located<RawLevel>, kind: RawKind) {
        use RawKind::{FanOut, HumanApproval, Prompt, ToolLoop, Verifier, Wave};
        let present: [(&str, Option<Pos>, &[RawKind]); 12] = [
            ("prompt", raw.prompt.as_ref().map(|v| v.pos), &[Prompt, ToolLoop, HumanApproval]),
            ("response", raw.response.as_ref().map(|v| v.pos), &[Prompt]),
            ("model", raw.model.as_ref().map(|v| v.pos), &[Prompt, ToolLoop, Verifier]),
            ("verifiers", raw.verifiers.first().map(|v| v.pos), &[Prompt, ToolLoop, Verifier]),
            ("fan_out", raw.fan_out.as_ref().map(|v| v.pos), &[FanOut]),
            ("fan_in", raw.fan_in.as_ref().map(|v| v.pos), &[FanOut]),
            ("max_parallel", raw.max_parallel.as_ref().map(|v| v.pos), &[FanOut]),
            ("max_iterations", raw.max_iterations.as_ref().map(|v| v.pos), &[ToolLoop]),
            ("approver_role", raw.approver_role.as_ref().map(|v| v.pos), &[HumanApproval]),
            ("output_schema", raw.output_schema.as_ref().map(|v| v.pos), &[HumanApproval]),
            ("wave", raw.wave.as_ref().map(|v| v.pos), &[Wave]),
            (
                "timeout_s",
                raw.timeout_s.as_ref().map(|v| v.pos),
                &[Prompt, ToolLoop, Verifier, FanOut, HumanApproval],
            ),
        ];
        for (field, pos, kinds) in present {
            let Some(pos) = pos else { continue };
            if !kinds.contains(&kind) {
                let names: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
                self.error(
                    "field-not-for-kind",
                    pos,
                    format!("`{field}` does not apply to a `{}` level", kind.as_str()),
                )
                .help = Some(format!("`{field}` applies to: {}", names.join(", ")));
            }
        }
    }

    fn required_prompt(&mut self, raw: &Located<RawLevel>) -> Option<Template> {
        match &raw.prompt {
            Some(p) => self.prompt(p, &raw.id.value),
            None => {
                self.error(
                    "missing-field",
                    raw.pos,
                    format!("a `{}` level needs a `prompt`", raw.kind.value.as_str()),
                )
                .help =
                    Some("add `prompt: prompts/<name>.j2` or `prompt: {inline: \"…\"}`".to_owned());
                None
            }
        }
    }

    fn prompt(&mut self, p: &Located<RawPrompt>, level: &str) -> Option<Template> {
        match &p.value {
            RawPrompt::Template(path) => {
                let text = self.files.template(path, p.pos, self.sources, self.diags)?;
                Some(Template { name: path.clone(), text })
            }
            RawPrompt::Inline { inline } => {
                let name = format!("inline:{level}");
                let errors = check_template(
                    &name,
                    inline,
                    inline.pos.source,
                    self.sources,
                    Some(inline.pos),
                );
                if !errors.is_empty() {
                    for e in errors {
                        self.diags.push(e);
                    }
                    return None;
                }
                Some(Template { name, text: Arc::from(inline.value.as_str()) })
            }
        }
    }

    fn schema(&mut self, s: &Located<RawSchema>) -> Option<JsonSchema> {
        let value = self.schema_value(s)?;
        self.compile_schema(value, s.pos)
    }

    /// Compiles a schema document, reporting at `pos` when it is not a valid JSON Schema.
    fn compile_schema(&mut self, value: serde_json::Value, pos: Pos) -> Option<JsonSchema> {
        match JsonSchema::compile(value) {
            Ok(schema) => Some(schema),
            Err(e) => {
                self.error("bad-schema", pos, format!("invalid JSON Schema: {e}"));
                None
            }
        }
    }

    fn schema_value(&mut self, s: &Located<RawSchema>) -> Option<serde_json::Value> {
        match &s.value {
            RawSchema::Inline(map) => {
                if map.is_empty() {
                    self.error("bad-schema", s.pos, "the schema is empty").help =
                        Some("give at least a `type`, for example `{type: object}`".to_owned());
                    return None;
                }
                Some(serde_json::Value::Object(map.clone()))
            }
            RawSchema::File(path) => self.files.schema(path, s.pos, self.sources, self.diags),
        }
    }

    fn model(&mut self, m: &Located<RawModel>, source: &'static str) -> Option<ModelConstraint> {
        let mut tier: Option<(Tier, Pos)> = None;
        let mut ok = true;
        let mut allow = Vec::new();
        for pattern in &m.value.allow {
            match parse_model_pattern(&pattern.value) {
                Ok(t) => {
                    if let Some((first, first_pos)) = tier {
                        if first != t {
                            let line = first_pos.line;
                            self.error("mixed-tiers", pattern.pos, format!(
                                "`{}` is {} tier but the allow list started with {} (line {line})",
                                pattern.value, t.as_str(), first.as_str()
                            ))
                            .help = Some("an allow list names one tier; use `fallback` or `fallback_outside_allow` to reach the other".to_owned());
                            ok = false;
                        }
                    } else {
                        tier = Some((t, pattern.pos));
                    }
                    allow.push(pattern.value.clone());
                }
                Err(why) => {
                    self.error("bad-model", pattern.pos, format!("`{}` is not a model pattern: {why}", pattern.value)).help =
                        Some("write `tier:provider/model` with tier `free` or `paid`; `*` matches anything, e.g. `free:*`, `paid:anthropic/*`".to_owned());
                    ok = false;
                }
            }
        }
        let mut fallback = Vec::new();
        for entry in &m.value.fallback {
            if let Err(why) = parse_model_pattern(&entry.value) {
                self.error(
                    "bad-model",
                    entry.pos,
                    format!("`{}` is not a model pattern: {why}", entry.value),
                );
                ok = false;
            }
            fallback.push(entry.value.clone());
        }
        let temperature = m.value.temperature.as_ref().map(|t| t.value);
        if let Some(t) = &m.value.temperature
            && !(0.0..=2.0).contains(&t.value)
        {
            self.error(
                "out-of-range",
                t.pos,
                format!("temperature {} is outside 0..=2", t.value),
            )
            .help = Some("use 0 for the most deterministic answers, up to 2".to_owned());
            ok = false;
        }
        let names_models = !m.value.allow.is_empty() || !m.value.fallback.is_empty();
        // A constraint that only sets the temperature or the retry budget leaves the choice
        // to the default.
        let fallback_outside_allow =
            m.value.fallback_outside_allow.as_ref().is_some_and(|f| f.value)
                || (!names_models && (temperature.is_some() || m.value.retry.is_some()));
        if !names_models && !fallback_outside_allow {
            self.error("empty-model", m.pos, "the model constraint allows nothing").help = Some(
                "add `allow:` patterns, or leave `model:` out to use the routing default"
                    .to_owned(),
            );
            ok = false;
        }
        let retry = match &m.value.retry {
            Some(r) => {
                let errors = self.diags.error_count();
                let policy = RetryPolicy {
                    attempts: self.bounded(
                        r.value.attempts.as_ref(),
                        "retry.attempts",
                        limits::RETRY_ATTEMPTS_MAX,
                    ),
                    max_time_s: self.positive(
                        r.value.max_time_s.as_ref(),
                        "retry.max_time_s",
                        limits::RETRY_TIME_S_MAX,
                    ),
                    backoff_max_s: self.positive(
                        r.value.backoff_max_s.as_ref(),
                        "retry.backoff_max_s",
                        limits::RETRY_BACKOFF_S_MAX,
                    ),
                };
                ok &= self.diags.error_count() == errors;
                policy
            }
            None => RetryPolicy::default(),
        };
        ok.then(|| ModelConstraint {
            tier: tier.map(|t| t.0),
            allow,
            fallback_outside_allow,
            fallback,
            temperature,
            retry,
            source,
        })
    }

    fn verifiers(&mut self, raw: &Located<RawLevel>) -> Vec<VerifierSpec> {
        if raw.verifiers.len() > limits::VERIFIERS_PER_LEVEL_MAX {
            self.error(
                "too-many",
                raw.verifiers[0].pos,
                format!(
                    "a level may declare at most {} verifiers",
                    limits::VERIFIERS_PER_LEVEL_MAX
                ),
            );
            return Vec::new();
        }
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for v in &raw.verifiers {
            self.id(&v.name, "verifier");
            if !seen.insert(v.name.value.clone()) {
                self.error(
                    "duplicate-id",
                    v.name.pos,
                    format!("verifier `{}` is declared twice on this level", v.name.value),
                );
                continue;
            }
            if let Some(spec) = self.verifier(v) {
                out.push(spec);
            }
        }
        out
    }

    fn verifier(&mut self, v: &Located<RawVerifier>) -> Option<VerifierSpec> {
        let uses = v.uses.value;
        let params: serde_json::Map<String, serde_json::Value> = v
            .params
            .iter()
            .flat_map(|p| p.value.iter())
            .map(|(k, val)| (k.clone(), val.value.clone()))
            .collect();
        let params_pos = v.params.as_ref().map_or(v.pos, |p| p.pos);
        // Where each parameter's value is, for pointing at the one that is wrong.
        let at = |key: &str| -> Pos {
            v.params.as_ref().and_then(|p| p.value.get(key)).map_or(params_pos, |val| val.pos)
        };
        let spec = params_of(uses);
        let mut ok = true;
        for key in params.keys() {
            if !spec.iter().any(|p| p.name == key) {
                let names: Vec<&str> = spec.iter().map(|p| p.name).collect();
                let near = suggest::closest(key, names.iter().copied());
                let help = match (near, names.is_empty()) {
                    (Some(n), _) => format!(
                        "did you mean `{n}`? `{}` takes: {}",
                        uses.as_str(),
                        names.join(", ")
                    ),
                    (None, true) => format!("`{}` takes no parameters", uses.as_str()),
                    (None, false) => format!("`{}` takes: {}", uses.as_str(), names.join(", ")),
                };
                self.error(
                    "unknown-param",
                    at(key),
                    format!("verifier `{}` has an unknown parameter `{key}`", v.name.value),
                )
                .help = Some(help);
                ok = false;
            }
        }
        for p in spec {
            match params.get(p.name) {
                None if p.required => {
                    self.error(
                        "missing-param",
                        params_pos,
                        format!(
                            "verifier `{}` (`{}`) needs the parameter `{}`",
                            v.name.value,
                            uses.as_str(),
                            p.name
                        ),
                    )
                    .help = Some(format!("add `params: {{{}: …}}`", p.name));
                    ok = false;
                }
                Some(value) if !p.kind.accepts(value) => {
                    self.error(
                        "wrong-type",
                        at(p.name),
                        format!(
                            "parameter `{}` of verifier `{}` must be {}",
                            p.name,
                            v.name.value,
                            p.kind.describe()
                        ),
                    );
                    ok = false;
                }
                _ => {}
            }
        }
        let weight = match &v.weight {
            Some(w) if !(w.value.is_finite() && w.value >= 0.0) => {
                self.error(
                    "out-of-range",
                    w.pos,
                    format!("`weight` must be zero or more, found {}", w.value),
                );
                ok = false;
                1.0
            }
            Some(w) => w.value,
            None => 1.0,
        };
        let on_fail = v.on_fail.as_ref().map_or(OnFail::Fail, |o| o.value);
        let max_retries = match (&v.max_retries, on_fail) {
            (Some(r), OnFail::Retry) if r.value == 0 || r.value > limits::RETRIES_MAX => {
                self.error(
                    "out-of-range",
                    r.pos,
                    format!("`max_retries` must be between 1 and {}", limits::RETRIES_MAX),
                );
                ok = false;
                0
            }
            (Some(r), OnFail::Retry) => r.value,
            (Some(r), _) => {
                self.error(
                    "field-not-for-kind",
                    r.pos,
                    "`max_retries` applies only with `on_fail: retry`",
                );
                ok = false;
                0
            }
            (None, OnFail::Retry) => 1,
            (None, _) => 0,
        };
        let timeout_s = self.positive(v.timeout_s.as_ref(), "timeout_s", limits::TIMEOUT_S_MAX);
        if !ok {
            return None;
        }
        let mut rubric = None;
        let mut schema = None;
        let mut config_text = None;
        match uses {
            Uses::LlmJudge => {
                let name = params.get("rubric").and_then(|r| r.as_str()).unwrap_or_default();
                rubric = Some(self.files.rubric(name, at("rubric"), self.sources, self.diags)?);
                if let Some(t) = params.get("threshold").and_then(serde_json::Value::as_f64)
                    && !(0.0..=1.0).contains(&t)
                {
                    self.error(
                        "out-of-range",
                        at("threshold"),
                        format!("judge threshold must be between 0 and 1, found {t}"),
                    );
                    return None;
                }
            }
            Uses::Schema => {
                let value = match params.get("schema") {
                    Some(serde_json::Value::String(path)) => {
                        Some(self.files.schema(path, at("schema"), self.sources, self.diags)?)
                    }
                    Some(inline) => Some(inline.clone()),
                    None => None,
                };
                if let Some(value) = value {
                    schema = Some(self.compile_schema(value, at("schema"))?);
                }
            }
            Uses::Semgrep => {
                let rules = params.get("rules").and_then(|r| r.as_str()).unwrap_or_default();
                if is_registry_config(rules) {
                    self.error("semgrep-registry", at("rules"), format!("semgrep config `{rules}` is a registry rule set")).help =
                        Some("registry configs need the network and hang offline; point `rules` at a local YAML rules file under the scenarios directory".to_owned());
                    return None;
                }
                config_text =
                    Some(self.files.plain(rules, at("rules"), self.sources, self.diags)?);
                if let Some(s) = params.get("severity").and_then(|s| s.as_str())
                    && !["INFO", "WARNING", "ERROR"].contains(&s)
                {
                    self.error(
                        "invalid-value",
                        at("severity"),
                        format!("semgrep severity `{s}` is not INFO, WARNING or ERROR"),
                    );
                    return None;
                }
            }
            Uses::Gitleaks => {
                if let Some(config) = params.get("config").and_then(|c| c.as_str()) {
                    config_text =
                        Some(self.files.plain(config, at("config"), self.sources, self.diags)?);
                }
            }
            Uses::Mcp => {
                let empty =
                    params.get("server").and_then(|s| s.as_array()).is_some_and(Vec::is_empty);
                if empty {
                    self.error(
                        "invalid-value",
                        at("server"),
                        "`server` must name the command that starts the MCP server",
                    );
                    return None;
                }
                if let Some(condition) = params.get("condition").and_then(|c| c.as_str()) {
                    let scope = Scope { result: true, ..Scope::default() };
                    let checked = expr::parse(condition)
                        .map_err(|e| (e.message, e.help))
                        .and_then(|e| expr::resolve(&e, &scope).map_err(|e| (e.message, e.help)));
                    if let Err((message, help)) = checked {
                        self.error(
                            "invalid-value",
                            at("condition"),
                            format!("invalid condition `{condition}`: {message}"),
                        )
                        .help = help.or_else(|| {
                            Some("a condition reads the tool's structured result, e.g. `result.count >= 1`".to_owned())
                        });
                        return None;
                    }
                }
            }
            Uses::Command => {
                let empty =
                    params.get("argv").and_then(|s| s.as_array()).is_some_and(Vec::is_empty);
                if empty {
                    self.error("invalid-value", at("argv"), "`argv` must name the program to run");
                    return None;
                }
            }
            _ => {}
        }
        Some(VerifierSpec {
            name: v.name.value.clone(),
            uses,
            params,
            weight,
            on_fail,
            max_retries,
            timeout_s,
            rubric,
            schema,
            config_text,
        })
    }

    fn fan_out(
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

    fn wave(
        &mut self,
        raw: &Located<RawLevel>,
        index: &HashMap<String, LevelIdx>,
    ) -> Option<LevelKind> {
        let Some(wave) = &raw.wave else {
            self.error(
                "missing-field",
                raw.pos,
                format!("wave level `{}` needs a `wave:` mapping", raw.id.value),
            )
            .help =
                Some("for example `wave: {worker: code_build, assignments_from: plan}`".to_owned());
            return None;
        };
        let w = &wave.value;
        let errors_before = self.diags.error_count();
        let dispatch = match w.dispatch.as_ref().map(|d| d.value) {
            Some(crate::raw::RawDispatch::Manual) => WaveDispatch::Manual,
            None | Some(crate::raw::RawDispatch::Auto) => WaveDispatch::Auto,
        };
        let worker = w.worker.as_ref().map(|id| {
            self.id(id, "worker scenario");
            id.value.clone()
        });
        let command = w.command.as_ref().map(|c| {
            if c.value.is_empty() || c.value[0].trim().is_empty() {
                self.error(
                    "invalid-value",
                    c.pos,
                    "`command` must name the program to run (its argv)",
                );
            }
            c.value.clone()
        });
        if let (Some(_), Some(c)) = (&worker, &w.command) {
            self.error(
                "invalid-value",
                c.pos,
                format!(
                    "wave level `{}` names both a `worker` scenario and a `command`; keep one",
                    raw.id.value
                ),
            );
        }
        if worker.is_none() && command.is_none() && dispatch == WaveDispatch::Auto {
            self.error(
                "missing-field",
                wave.pos,
                format!("wave level `{}` names no `worker` scenario (or `command`) to run its assignments", raw.id.value),
            )
            .help = Some("add `worker: <scenario id>` or `command: [program, args…]`, or `dispatch: manual` for workers run outside Baton".to_owned());
        }
        let source = match &w.assignments_from {
            None => WaveSource::Input,
            Some(from) if from.value == "input" => WaveSource::Input,
            Some(from) => {
                if from.value == raw.id.value {
                    self.error(
                        "invalid-value",
                        from.pos,
                        "a wave cannot take its assignments from itself",
                    );
                } else if !index.contains_key(&from.value) {
                    let help =
                        crate::suggest::closest(&from.value, index.keys().map(String::as_str))
                            .map(|near| format!("did you mean `{near}`?"))
                            .unwrap_or_else(|| {
                                "name `input` or a level of this scenario".to_owned()
                            });
                    self.error(
                        "unknown-level",
                        from.pos,
                        format!("`assignments_from` names no level `{}`", from.value),
                    )
                    .help = Some(help);
                }
                WaveSource::Level(from.value.clone())
            }
        };
        let max_parallel = w.max_parallel.as_ref().and_then(|m| {
            let max = limits::WAVE_PARALLEL_MAX;
            match u32::try_from(m.value) {
                Ok(v) if (1..=max).contains(&v) => Some(v),
                _ => {
                    self.error(
                        "out-of-range",
                        m.pos,
                        format!("`max_parallel` of a wave must be an integer from 1 through {max}, found {}", m.value),
                    );
                    None
                }
            }
        });
        let timeout_ms = match &w.timeout_s {
            None => limits::WAVE_TIMEOUT_MS_DEFAULT,
            Some(t) => match wave_timeout_ms(t.value) {
                Some(ms) => ms,
                None => {
                    self.error(
                        "out-of-range",
                        t.pos,
                        format!(
                            "`timeout_s` of a wave worker must be from 0.001 through {} seconds (1 to {} ms), found {}",
                            limits::WAVE_TIMEOUT_MS_MAX as f64 / 1000.0,
                            limits::WAVE_TIMEOUT_MS_MAX,
                            t.value
                        ),
                    );
                    0
                }
            },
        };
        let max_assignments = self
            .bounded(w.max_assignments.as_ref(), "max_assignments", limits::WAVE_ASSIGNMENTS_MAX)
            .unwrap_or(limits::WAVE_ASSIGNMENTS_DEFAULT);
        if self.diags.error_count() > errors_before {
            return None;
        }
        Some(LevelKind::Wave(WaveSpec {
            worker,
            command,
            source,
            max_parallel,
            timeout_ms,
            max_assignments,
            dispatch,
            context: w.context.as_ref().map(|c| c.value.clone()),
        }))
    }

    fn edges(
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

    fn edge_end(
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

    fn gate(&mut self, when: &Located<String>, scope: &Scope<'_>) -> Option<expr::Gate> {
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
    fn span_pos(&self, when: &Located<String>, span: expr::Span) -> Pos {
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

struct LevelDefaults<'a> {
    model: Option<&'a ModelConstraint>,
    timeout_s: Option<f64>,
    max_iterations: Option<u32>,
}

/// Parses `tier:provider[/model]`, returning the tier.
pub fn parse_model_pattern(pattern: &str) -> Result<Tier, &'static str> {
    let Some((tier, rest)) = pattern.split_once(':') else {
        return Err("it has no tier (`free:` or `paid:`)");
    };
    let tier = match tier {
        "free" => Tier::Free,
        "paid" => Tier::Paid,
        _ => return Err("the tier must be `free` or `paid`"),
    };
    if rest.is_empty() {
        return Err("it names no provider (use `*` for any)");
    }
    let (provider, model) = rest.split_once('/').map_or((rest, None), |(p, m)| (p, Some(m)));
    let provider_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '*');
    if provider.is_empty() || !provider.chars().all(provider_ok) {
        return Err("the provider may hold letters, digits, `_`, `-`, `.` and `*`");
    }
    if let Some(model) = model {
        let model_ok = |c: char| {
            c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '*' | ':' | '@' | '/')
        };
        if model.is_empty() || !model.chars().all(model_ok) {
            return Err("the model may hold letters, digits and `_ - . * : @ /`");
        }
    }
    Ok(tier)
}

fn is_registry_config(rules: &str) -> bool {
    rules == "auto"
        || rules.starts_with("p/")
        || rules.starts_with("r/")
        || rules.starts_with("s/")
        || rules.starts_with("http://")
        || rules.starts_with("https://")
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

/// What a verifier parameter must be.
#[derive(Clone, Copy, Debug)]
enum ParamKind {
    Str,
    StrList,
    Num,
    Bool,
    Map,
    /// A JSON Schema: a mapping, or the path of a `.json` file.
    Schema,
}

impl ParamKind {
    fn accepts(self, v: &serde_json::Value) -> bool {
        match self {
            ParamKind::Str => v.is_string(),
            ParamKind::StrList => {
                v.as_array().is_some_and(|a| a.iter().all(serde_json::Value::is_string))
            }
            ParamKind::Num => v.as_f64().is_some_and(f64::is_finite),
            ParamKind::Bool => v.is_boolean(),
            ParamKind::Map => v.is_object(),
            ParamKind::Schema => v.is_object() || v.is_string(),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            ParamKind::Str => "a string",
            ParamKind::StrList => "a list of strings",
            ParamKind::Num => "a number",
            ParamKind::Bool => "true or false",
            ParamKind::Map => "a mapping",
            ParamKind::Schema => "a JSON Schema or the path of a .json file",
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Param {
    name: &'static str,
    kind: ParamKind,
    required: bool,
}

const fn opt(name: &'static str, kind: ParamKind) -> Param {
    Param { name, kind, required: false }
}

const fn req(name: &'static str, kind: ParamKind) -> Param {
    Param { name, kind, required: true }
}

/// The parameters each verifier takes.
fn params_of(uses: Uses) -> &'static [Param] {
    use ParamKind::{Bool, Map, Num, Schema, Str, StrList};
    // `network: true`: the program may reach the network (the jail cuts it off otherwise).
    const PRESET: &[Param] = &[
        opt("argv", StrList),
        opt("cwd", Str),
        opt("env", Map),
        opt("shell", Bool),
        opt("network", Bool),
    ];
    const COMMAND: &[Param] = &[
        req("argv", StrList),
        opt("cwd", Str),
        opt("env", Map),
        opt("shell", Bool),
        opt("expect_exit", Num),
        opt("network", Bool),
    ];
    const SCHEMA: &[Param] = &[req("schema", Schema)];
    const JUDGE: &[Param] = &[req("rubric", Str), opt("threshold", Num), opt("model", Str)];
    // `allow_suppressions`: the workspace's own suppression comments and ignore files
    // count (they do not by default: the model writes the workspace).
    const SEMGREP: &[Param] = &[
        req("rules", Str),
        opt("severity", Str),
        opt("paths", StrList),
        opt("allow_suppressions", Bool),
    ];
    const GITLEAKS: &[Param] =
        &[opt("config", Str), opt("paths", StrList), opt("allow_suppressions", Bool)];
    const MCP: &[Param] = &[
        req("server", StrList),
        req("tool", Str),
        opt("arguments", Map),
        opt("condition", Str),
        opt("env", Map),
        opt("reuse", Bool),
        opt("network", Bool),
    ];
    match uses {
        Uses::Command => COMMAND,
        Uses::Build | Uses::Typecheck | Uses::Lint | Uses::UnitTest => PRESET,
        Uses::Schema => SCHEMA,
        Uses::LlmJudge => JUDGE,
        Uses::Semgrep => SEMGREP,
        Uses::Gitleaks => GITLEAKS,
        Uses::Mcp => MCP,
    }
}

/// A wave worker's timeout given in seconds, as whole milliseconds: `None` unless it is
/// 1 ms to [`limits::WAVE_TIMEOUT_MS_MAX`] ms once rounded.
pub fn wave_timeout_ms(seconds: f64) -> Option<u64> {
    if !seconds.is_finite() {
        return None;
    }
    let ms = (seconds * 1000.0).round();
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    ((1.0..=limits::WAVE_TIMEOUT_MS_MAX as f64).contains(&ms)).then_some(ms as u64)
}
