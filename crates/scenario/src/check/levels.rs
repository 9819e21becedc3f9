//! One level: the settings its kind allows, its defaults, and its kind's own checks.

use std::collections::HashMap;

use super::checker::Checker;
use crate::de::Located;
use crate::limits;
use crate::model::{Level, LevelIdx, LevelKind, Mode, ModelConstraint, Response, Uses};
use crate::raw::{RawKind, RawLevel, RawResponse};
use crate::schema::JsonSchema;
use crate::source::Pos;

pub use crate::model::APPROVER_ROLE_DEFAULT;

pub(super) struct LevelDefaults<'a> {
    pub(super) model: Option<&'a ModelConstraint>,
    pub(super) timeout_s: Option<f64>,
    pub(super) max_iterations: Option<u32>,
    pub(super) toolsets: &'a super::tools::Toolsets,
}

impl Checker<'_> {
    pub(super) fn level(
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
                let tools = self.level_tools(raw, defaults.toolsets);
                prompt.map(|prompt| LevelKind::ToolLoop { prompt, max_iterations, tools })
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
            handoff: raw.handoff.as_ref().is_some_and(|t| t.value),
            steerable: raw.steerable.as_ref().is_some_and(|t| t.value),
            timeout_s,
            metadata: raw.metadata.as_ref().map(|m| m.value.clone()).unwrap_or_default(),
            parent,
        })
    }

    /// Refuses settings that the level's kind does not use.
    pub(super) fn fields_for_kind(&mut self, raw: &Located<RawLevel>, kind: RawKind) {
        use RawKind::{FanOut, HumanApproval, Prompt, ToolLoop, Verifier, Wave};
        let present: [(&str, Option<Pos>, &[RawKind]); 14] = [
            ("prompt", raw.prompt.as_ref().map(|v| v.pos), &[Prompt, ToolLoop, HumanApproval]),
            ("response", raw.response.as_ref().map(|v| v.pos), &[Prompt]),
            ("model", raw.model.as_ref().map(|v| v.pos), &[Prompt, ToolLoop, Verifier]),
            ("verifiers", raw.verifiers.first().map(|v| v.pos), &[Prompt, ToolLoop, Verifier]),
            ("fan_out", raw.fan_out.as_ref().map(|v| v.pos), &[FanOut]),
            ("fan_in", raw.fan_in.as_ref().map(|v| v.pos), &[FanOut]),
            ("max_parallel", raw.max_parallel.as_ref().map(|v| v.pos), &[FanOut]),
            ("max_iterations", raw.max_iterations.as_ref().map(|v| v.pos), &[ToolLoop]),
            ("tools", raw.tools.first().map(|v| v.pos), &[ToolLoop]),
            ("approver_role", raw.approver_role.as_ref().map(|v| v.pos), &[HumanApproval]),
            ("output_schema", raw.output_schema.as_ref().map(|v| v.pos), &[HumanApproval]),
            ("wave", raw.wave.as_ref().map(|v| v.pos), &[Wave]),
            ("steerable", raw.steerable.as_ref().map(|v| v.pos), &[Prompt, ToolLoop]),
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
}
