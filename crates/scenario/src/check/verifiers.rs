//! A level's verifiers: their ids, the parameters each kind takes, and the files they read.

use std::collections::HashSet;

use super::checker::Checker;
use crate::de::Located;
use crate::expr::{self, Scope};
use crate::limits;
use crate::model::{OnFail, Uses, VerifierSpec};
use crate::raw::{RawLevel, RawVerifier};
use crate::source::Pos;
use crate::suggest;

impl Checker<'_> {
    pub(super) fn verifiers(&mut self, raw: &Located<RawLevel>) -> Vec<VerifierSpec> {
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

    pub(super) fn verifier(&mut self, v: &Located<RawVerifier>) -> Option<VerifierSpec> {
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
}

fn is_registry_config(rules: &str) -> bool {
    rules == "auto"
        || rules.starts_with("p/")
        || rules.starts_with("r/")
        || rules.starts_with("s/")
        || rules.starts_with("http://")
        || rules.starts_with("https://")
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
