//! The scenario file as written: serde structs that mirror the YAML one to one.
//!
//! Every struct refuses unknown fields. Values that later checks must point at are
//! wrapped in [`Located`]. These types are also the source of `baton schema` (the JSON
//! Schema editors use), so their doc comments are the reference documentation of the
//! format. Nothing here is checked beyond its shape: that is [`crate::check`]'s job.

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use crate::de::Located;

/// A free-form mapping (metadata, verifier parameters, inline JSON Schemas).
pub type Map = serde_json::Map<String, serde_json::Value>;

/// One scenario: a graph of levels joined by guarded edges.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawScenario {
    /// Unique id: lower-case letters, digits and `_`, starting with a letter.
    pub id: Located<String>,
    /// Version of this scenario, an integer ≥ 1; recorded on every run.
    pub version: Located<u32>,
    /// Human-readable name.
    #[serde(default)]
    pub display_name: Option<String>,
    /// What the scenario does; shown to the intent classifier.
    #[serde(default)]
    pub description: Option<String>,
    /// Example requests. A scenario with examples is eligible for the intent classifier.
    #[serde(default)]
    pub examples: Vec<Located<String>>,
    /// Intent routes this scenario serves (matched case-insensitively; each route may be
    /// claimed by one scenario only).
    #[serde(default)]
    pub intent_routes: Vec<Located<String>>,
    /// Caps for one run; crossing one aborts the run.
    #[serde(default)]
    pub budget: Option<Located<RawBudget>>,
    /// Defaults applied to every level that does not set its own.
    #[serde(default)]
    pub defaults: Option<Located<RawDefaults>>,
    /// The levels. The first one that is not a fan-out child is the entry.
    pub levels: Located<Vec<Located<RawLevel>>>,
    /// Edges between levels, tried in order: the first whose `when` is true wins.
    #[serde(default)]
    pub edges: Vec<Located<RawEdge>>,
    /// How much worse a replay may score before the regression gate fails.
    #[serde(default)]
    pub regression_thresholds: Option<Located<RawRegressionThresholds>>,
    /// Free-form data, readable by gates as `metadata.<key>`.
    #[serde(default)]
    pub metadata: Option<Located<Map>>,
    /// The workspace a run's `tool_loop` levels edit.
    #[serde(default)]
    pub workspace: Option<Located<RawWorkspace>>,
    /// Named sets of the user's own tools, by name (an id); a `tool_loop` level gives its
    /// model the sets its `tools:` lists, beside the file tools.
    #[serde(default)]
    pub toolsets: Option<Located<BTreeMap<String, Located<RawToolset>>>>,
}

/// A set of the user's own tools, all from one source.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawToolset {
    /// Where its tools come from: `command` — each tool a program of the user's, run in the
    /// jail in the level's workspace with no network, its arguments as JSON on stdin; `http`
    /// — each tool a request to an HTTP API (`request:`), through the egress guard; `mcp` —
    /// the tools of an MCP server (`server:`) that `allow` lets through.
    pub source: Located<RawToolSource>,
    /// The tools, in the order the model is shown them. For an `mcp` toolset, the settings
    /// of tools it allows (their name, schema and description come from the server).
    #[serde(default)]
    pub tools: Option<Located<Vec<Located<RawTool>>>>,
    /// `mcp`: the server, a command and its arguments (no shell), run in the jail in the
    /// level's workspace with no network; started when an attempt of a level that lists the
    /// toolset begins and stopped when it ends.
    #[serde(default)]
    pub server: Option<Located<Vec<String>>>,
    /// `mcp`: a server over Streamable HTTP instead, at this URL (through the egress guard:
    /// loopback and private addresses only when `[egress]` allows them).
    #[serde(default)]
    pub url: Option<Located<String>>,
    /// `mcp`: the variables the server gets on top of `PATH`, `HOME`, `LANG` and `TMPDIR`.
    #[serde(default)]
    pub env: Option<Located<BTreeMap<String, String>>>,
    /// `mcp`: the server's tools the model may call; none without it.
    #[serde(default)]
    pub allow: Vec<Located<String>>,
    /// `mcp`: the allowed tools that only read (called again freely on resume, no key);
    /// every other is a write, whatever the server's annotations say.
    #[serde(default)]
    pub read: Vec<Located<String>>,
}

/// Where a toolset's tools come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RawToolSource {
    /// Programs run in the jail.
    Command,
    /// Requests to an HTTP API, through the egress guard.
    Http,
    /// The tools of an MCP server.
    Mcp,
}

/// The request an `http` tool makes.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawHttpRequest {
    /// `GET`, `POST`, `PUT`, `PATCH` or `DELETE` (default: `GET` for a read tool, `POST`
    /// for a write tool).
    #[serde(default)]
    pub method: Option<Located<String>>,
    /// The URL, http or https, on a host the egress policy allows; `{NAME}` in its path or
    /// query stands for the argument NAME (a string, number or boolean), percent-encoded.
    pub url: Located<String>,
    /// Headers sent with the request; `${secret:NAME}` in a value stands for the secret
    /// NAME of baton.toml (`[secrets.NAME]`), sent only to the hosts it lists and never
    /// shown to the model or written to the log.
    #[serde(default)]
    pub headers: Option<Located<BTreeMap<String, String>>>,
    /// Whether the call's arguments go as the JSON body (default: for `POST`, `PUT` and
    /// `PATCH`).
    #[serde(default)]
    pub body: Option<Located<bool>>,
}

/// One tool of a toolset.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTool {
    /// The name the model calls it by: a letter, then letters, digits, `_` or `-` (at most
    /// 64); unique among a level's tools and none of the built-in ones.
    pub name: Located<String>,
    /// What it does, for the model.
    #[serde(default)]
    pub description: Option<Located<String>>,
    /// JSON Schema of its arguments (an object; inline or a file path); default: an object
    /// with no required fields. A call whose arguments fail it is refused before it runs.
    #[serde(default)]
    pub parameters: Option<Located<RawSchema>>,
    /// `command` tools: the program and its arguments (no shell), run in the level's
    /// workspace. It reads the call's arguments as JSON on stdin; what it writes to stdout
    /// is the result; a non-zero exit is an error result with its stderr's tail.
    #[serde(default)]
    pub command: Option<Located<Vec<String>>>,
    /// `command` tools: the variables the program gets; nothing else of Baton's
    /// environment reaches it but `PATH`, `HOME`, `LANG` and `TMPDIR`.
    #[serde(default)]
    pub env: Option<Located<BTreeMap<String, String>>>,
    /// `http` tools: the request a call makes. A write call sends its idempotency key as
    /// `Idempotency-Key`; redirects to another host are not followed; the answer is read up
    /// to a bound.
    #[serde(default)]
    pub request: Option<Located<RawHttpRequest>>,
    /// `read` (it changes nothing: called again freely on resume) or `write` (the default:
    /// each call gets an idempotency key and a receipt in the log, and is never made again
    /// once its receipt is there).
    #[serde(default)]
    pub effect: Option<Located<RawEffect>>,
    /// Longest one call may take, in seconds (default 60, at most 3600).
    #[serde(default)]
    pub timeout_s: Option<Located<f64>>,
    /// Most calls per level attempt; past it a call is refused with a result that says so.
    #[serde(default)]
    pub max_calls: Option<Located<u32>>,
    /// What one call costs, in USD, counted against the run's `max_cost_usd` like a model
    /// call's.
    #[serde(default)]
    pub cost_usd: Option<Located<f64>>,
    /// A `write` tool whose key leaves out the attempt: a later attempt of the level that
    /// makes the same call (same arguments, same place) gets the first one's receipt.
    #[serde(default)]
    pub once_per_run: Option<Located<bool>>,
    /// When a call waits for a person's approval before it is made: `never` (the default),
    /// `always`, or a gate over the call's arguments (`args.amount > 100`). The run pauses
    /// with the tool, its arguments and `approver_role`; a rejection is the call's result
    /// (`rejected by NAME: COMMENT`) and the call is never made.
    #[serde(default)]
    pub approval: Option<Located<String>>,
    /// Who may approve a call (default `approver`).
    #[serde(default)]
    pub approver_role: Option<Located<String>>,
    /// How long a call waits for its approval, in seconds (at most 30 days); past it the
    /// request is decided as timed out and the model reads the refusal. None: until
    /// someone decides.
    #[serde(default)]
    pub approval_timeout_s: Option<Located<f64>>,
}

impl RawTool {
    /// A tool with a name and no settings (an MCP tool `allow` lets through bare).
    pub fn named(name: Located<String>) -> RawTool {
        RawTool {
            name,
            description: None,
            parameters: None,
            command: None,
            env: None,
            request: None,
            effect: None,
            timeout_s: None,
            max_calls: None,
            cost_usd: None,
            once_per_run: None,
            approval: None,
            approver_role: None,
            approval_timeout_s: None,
        }
    }
}

/// What a tool call does to the world.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RawEffect {
    /// Changes nothing.
    Read,
    /// Changes something outside the run.
    Write,
}

/// How a run's workspace starts.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawWorkspace {
    /// A directory (relative to the scenarios directory) copied into every new workspace:
    /// the project the levels start from. Its files count in the scenario's checksum.
    #[serde(default)]
    pub seed: Option<Located<String>>,
}

/// Caps on one run. Absent caps are unlimited.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawBudget {
    /// Most money the run may spend on models and judges, in US dollars.
    #[serde(default)]
    pub max_cost_usd: Option<Located<f64>>,
    /// Most tokens (input + output) the run may use.
    #[serde(default)]
    pub max_tokens: Option<Located<u64>>,
    /// Longest time drivers may work on the run, in seconds (waits for a person do not
    /// count).
    #[serde(default)]
    pub max_duration_s: Option<Located<f64>>,
    /// Most level executions the run may start, all levels and attempts together (default
    /// 1000, at most 100000); the run is aborted with `level_run_limit` past it.
    #[serde(default)]
    pub max_level_runs: Option<Located<u32>>,
}

/// Defaults for every level.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawDefaults {
    /// Model constraint of levels that declare none.
    #[serde(default)]
    pub model: Option<Located<RawModel>>,
    /// Timeout of levels that declare none, in seconds.
    #[serde(default)]
    pub timeout_s: Option<Located<f64>>,
    /// `max_iterations` of tool-loop levels that declare none.
    #[serde(default)]
    pub max_iterations: Option<Located<u32>>,
    /// Failures of one kind (a build, a rejection …) before `escalate_now` turns true.
    #[serde(default)]
    pub max_attempts_per_conflict: Option<Located<u32>>,
}

/// What a level does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RawKind {
    /// Render a prompt, call a model, post-process its answer.
    Prompt,
    /// Let a model edit the workspace through sandboxed file tools.
    ToolLoop,
    /// Run the level's verifiers against the workspace.
    Verifier,
    /// Run child levels concurrently and aggregate their verdicts.
    FanOut,
    /// Pause until a person approves or rejects.
    HumanApproval,
    /// Run a batch of assignments, each as a child run of a worker scenario, with bounded
    /// parallelism, and decide what comes next (complete, replan, escalate).
    Wave,
}

impl RawKind {
    /// The name as written in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            RawKind::Prompt => "prompt",
            RawKind::ToolLoop => "tool_loop",
            RawKind::Verifier => "verifier",
            RawKind::FanOut => "fan_out",
            RawKind::HumanApproval => "human_approval",
            RawKind::Wave => "wave",
        }
    }
}

/// One node of the graph.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawLevel {
    /// Unique within the scenario: lower-case letters, digits and `_`.
    pub id: Located<String>,
    /// Who speaks at this level (team_lead, planner, executor, reviewer …); shown in events.
    #[serde(default)]
    pub role: Option<Located<String>>,
    /// What the level does.
    pub kind: Located<RawKind>,
    /// The prompt: a template path relative to the scenarios directory
    /// (`prompts/brief.j2`), or `{inline: "…"}`.
    #[serde(default)]
    pub prompt: Option<Located<RawPrompt>>,
    /// How to read the model's answer (prompt levels): `markdown` (default), `verdict`,
    /// `json`, or `{json: {schema: …}}`.
    #[serde(default)]
    pub response: Option<Located<RawResponse>>,
    /// Which models may serve this level.
    #[serde(default)]
    pub model: Option<Located<RawModel>>,
    /// Checks run on the level's result.
    #[serde(default)]
    pub verifiers: Vec<Located<RawVerifier>>,
    /// How the verifiers run: `serial` (default), `parallel` or `race`.
    #[serde(default)]
    pub mode: Option<Located<RawMode>>,
    /// In `serial` mode, keep running verifiers after the first failure.
    #[serde(default)]
    pub run_all: Option<Located<bool>>,
    /// Child level ids run by a `fan_out` level.
    #[serde(default)]
    pub fan_out: Option<Located<Vec<Located<String>>>>,
    /// How a `fan_out` level merges its children's verdicts.
    #[serde(default)]
    pub fan_in: Option<Located<RawFanIn>>,
    /// Most children (fan_out) running at once.
    #[serde(default)]
    pub max_parallel: Option<Located<u32>>,
    /// Most model turns of a `tool_loop` level (default 40).
    #[serde(default)]
    pub max_iterations: Option<Located<u32>>,
    /// The toolsets (names under `toolsets:`) a `tool_loop` level's model may call besides
    /// the file tools.
    #[serde(default)]
    pub tools: Vec<Located<String>>,
    /// Who may decide a `human_approval` level (default `approver`).
    #[serde(default)]
    pub approver_role: Option<Located<String>>,
    /// JSON Schema of the decision a `human_approval` level asks for (inline or a file path);
    /// the default is `{approved: boolean, comment: string}`.
    #[serde(default)]
    pub output_schema: Option<Located<RawSchema>>,
    /// What a `wave` level runs: its worker, where its assignments come from, its
    /// parallelism and per-worker timeout.
    #[serde(default)]
    pub wave: Option<Located<RawWave>>,
    /// This level's output is the run's final output.
    #[serde(default)]
    pub terminal: Option<Located<bool>>,
    /// Work passes to this level's role from the level before it: each run of the level
    /// (not a retry of itself) records `agent_handoff` after `level_started`.
    #[serde(default)]
    pub handoff: Option<Located<bool>>,
    /// A person may steer the level while the run goes on (`baton steer`): each message is
    /// given to the level's next model call, once. Prompt and tool_loop levels only.
    #[serde(default)]
    pub steerable: Option<Located<bool>>,
    /// Longest time one attempt of this level may take, in seconds.
    #[serde(default)]
    pub timeout_s: Option<Located<f64>>,
    /// Free-form data about the level.
    #[serde(default)]
    pub metadata: Option<Located<Map>>,
}

/// The settings of a `wave` level.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawWave {
    /// The scenario each assignment runs as a child run of (its own log, budget and, for a
    /// scenario that edits files, its own workspace). Required unless `dispatch: manual`.
    #[serde(default)]
    pub worker: Option<Located<String>>,
    /// A program each assignment runs as instead of a worker scenario: its argv (no shell),
    /// run in the jail in a workspace of its own, with the assignment as JSON for its last
    /// argument (`{id, task_id, title, description, priority, context}`). Its standard
    /// output must end with a worker report (`{"outcome", "summary", "blockers"}`); without
    /// one the assignment fails.
    #[serde(default)]
    pub command: Option<Located<Vec<String>>>,
    /// Where the assignments come from: `input` (the default: the run's input, as JSON) or
    /// the id of a `prompt` level with `response: json` whose answer holds them. Either is
    /// `{assignments: [...]}` or `{tasks: [...]}` (each `{id, title, description?,
    /// priority?}`), or a bare list of tasks, with an optional shared `context` and
    /// `max_parallel`.
    #[serde(default)]
    pub assignments_from: Option<Located<String>>,
    /// Most workers running at once, 1 to 10. Without it: the plan's own value, else
    /// `[waves] max_parallel` in baton.toml, else 3.
    #[serde(default)]
    pub max_parallel: Option<Located<i64>>,
    /// Longest time one worker may take, in seconds (0.001 to 2147483.647; default 600).
    /// A worker past it is cancelled and its assignment fails.
    #[serde(default)]
    pub timeout_s: Option<Located<f64>>,
    /// Most assignments one plan may hold (1 to 200; default 50): a longer plan fails the
    /// level before any worker starts.
    #[serde(default)]
    pub max_assignments: Option<Located<u32>>,
    /// `auto` (the default): the run's driver dispatches workers itself. `manual`: an
    /// outside agent dispatches assignments and records their outcomes (`baton wave
    /// dispatch|record`); `baton wave run` dispatches them actively.
    #[serde(default)]
    pub dispatch: Option<Located<RawDispatch>>,
    /// Text every worker receives beside its own assignment (the plan's `context` comes
    /// after it).
    #[serde(default)]
    pub context: Option<Located<String>>,
    /// The order planned assignments are admitted in: `plan` (the default) or `priority`
    /// (`high`, `medium`, `low`, then none; the plan's order among equals). Recorded on
    /// `wave_planned`.
    #[serde(default)]
    pub order: Option<Located<WaveOrder>>,
}

/// The order a wave admits its planned assignments in: the scheduling strategy, chosen
/// by the scenario (`wave.order`) and recorded on `wave_planned`, so every driver of the
/// wave and every replay of it admits the same assignments in the same order.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum WaveOrder {
    /// The plan's order.
    #[default]
    Plan,
    /// `high` before `medium` before `low` before no priority; the plan's order among
    /// equals.
    Priority,
}

impl WaveOrder {
    pub const ALL: [WaveOrder; 2] = [WaveOrder::Plan, WaveOrder::Priority];

    /// The order as written.
    pub const fn as_str(self) -> &'static str {
        match self {
            WaveOrder::Plan => "plan",
            WaveOrder::Priority => "priority",
        }
    }

    /// Whether it is the plan's order (the default, left out of the log).
    #[allow(clippy::trivially_copy_pass_by_ref)]
    pub fn is_plan(&self) -> bool {
        *self == WaveOrder::Plan
    }
}

/// Who dispatches a wave's assignments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RawDispatch {
    /// The run's driver.
    Auto,
    /// An outside agent, or `baton wave run`.
    Manual,
}

/// Where a level's prompt comes from.
#[derive(Debug, Clone, PartialEq, JsonSchema)]
#[schemars(untagged)]
pub enum RawPrompt {
    /// A template file, relative to the scenarios directory.
    Template(String),
    /// The template text itself.
    Inline {
        /// The template text (minijinja).
        // Located: errors inside it are traced back through its YAML string.
        inline: Located<String>,
    },
}

impl<'de> Deserialize<'de> for RawPrompt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PromptVisitor;
        impl<'de> Visitor<'de> for PromptVisitor {
            type Value = RawPrompt;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a template path or a mapping `{inline: \"…\"}`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawPrompt, E> {
                Ok(RawPrompt::Template(v.to_owned()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawPrompt, A::Error> {
                let mut inline = None;
                while let Some(key) = map.next_key::<PromptKey>()? {
                    match key {
                        PromptKey::Inline if inline.is_some() => {
                            return Err(de::Error::duplicate_field("inline"));
                        }
                        PromptKey::Inline => inline = Some(map.next_value::<Located<String>>()?),
                    }
                }
                inline
                    .map(|inline| RawPrompt::Inline { inline })
                    .ok_or_else(|| de::Error::missing_field("inline"))
            }
        }
        deserializer.deserialize_any(PromptVisitor)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum PromptKey {
    Inline,
}

/// How a prompt level's answer is read.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RawResponse {
    /// Free text (the default).
    Markdown,
    /// A PASS/FAIL verdict: a trailing ```control fence, else lenient JSON, else one repair retry.
    Verdict,
    /// A JSON object, checked against `schema` when one is given.
    Json {
        /// JSON Schema: inline, or a path relative to the scenarios directory.
        #[serde(default)]
        schema: Option<Located<RawSchema>>,
    },
}

// Written by hand: the loader accepts a bare `json` as well as `{json: {schema: …}}`, which
// a derived schema would not say.
impl JsonSchema for RawResponse {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Response".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let schema = generator.subschema_for::<RawSchema>();
        schemars::json_schema!({
            "description": "How the answer is read: `markdown` (default), `verdict` (PASS/FAIL from a trailing ```control fence, lenient JSON, or one repair retry), `json`, or `{json: {schema: …}}` to check the JSON against a schema.",
            "oneOf": [
                {"type": "string", "enum": ["markdown", "verdict", "json"]},
                {
                    "type": "object",
                    "properties": {
                        "json": {
                            "type": ["object", "null"],
                            "properties": {"schema": schema},
                            "additionalProperties": false
                        }
                    },
                    "required": ["json"],
                    "additionalProperties": false
                }
            ]
        })
    }
}

/// A JSON Schema, inline or in a file.
#[derive(Debug, Clone, PartialEq, JsonSchema)]
#[schemars(untagged)]
pub enum RawSchema {
    /// A `.json` file, relative to the scenarios directory.
    File(String),
    /// The schema itself.
    Inline(Map),
}

impl<'de> Deserialize<'de> for RawSchema {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SchemaVisitor;
        impl<'de> Visitor<'de> for SchemaVisitor {
            type Value = RawSchema;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON Schema (a mapping) or the path of a .json file")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawSchema, E> {
                Ok(RawSchema::File(v.to_owned()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawSchema, A::Error> {
                let value = Map::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(RawSchema::Inline(value))
            }
        }
        deserializer.deserialize_any(SchemaVisitor)
    }
}

/// Which models may serve a level.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    /// Globs over `tier:provider/model`, for example `free:*` or `paid:anthropic/*`; all of
    /// one tier.
    #[serde(default)]
    pub allow: Vec<Located<String>>,
    /// When nothing allowed is available, use the routing default instead of failing.
    #[serde(default)]
    pub fallback_outside_allow: Option<Located<bool>>,
    /// Ordered list of `tier:provider/model` to try when the chosen one fails.
    #[serde(default)]
    pub fallback: Vec<Located<String>>,
    /// Sampling temperature sent with every call (0 to 2); the provider's default when
    /// absent. With neither `allow` nor `fallback`, the routing default serves the level.
    #[serde(default)]
    pub temperature: Option<Located<f64>>,
    /// How the model client retries one provider after a transient fault (429, 5xx, a
    /// timeout, a dropped stream) before it fails over to the next model of the chain.
    #[serde(default)]
    pub retry: Option<Located<RawRetry>>,
}

/// The retry budget of one call to one provider. Absent fields keep the defaults.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawRetry {
    /// Requests to one provider, the first included (default 4, at most 20).
    #[serde(default)]
    pub attempts: Option<Located<u32>>,
    /// Longest time spent retrying one provider, in seconds (default 60).
    #[serde(default)]
    pub max_time_s: Option<Located<f64>>,
    /// Longest wait between two requests, in seconds (default 30); the backoff doubles from
    /// 250 ms up to it.
    #[serde(default)]
    pub backoff_max_s: Option<Located<f64>>,
}

/// How verifiers run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RawMode {
    /// One after another; stop at the first failure unless `run_all`.
    Serial,
    /// All at once.
    Parallel,
    /// All at once; the first conclusive result wins and the rest are cancelled.
    Race,
}

/// The built-in verifiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RawUses {
    /// Run a command (`argv`); pass on exit code 0.
    Command,
    /// Build the workspace's project (detected, or `argv`).
    Build,
    /// Type-check the workspace's project.
    Typecheck,
    /// Lint the workspace's project.
    Lint,
    /// Run the workspace's unit tests.
    UnitTest,
    /// Validate the level's parsed JSON against a JSON Schema.
    Schema,
    /// Score the level's output with a model against a rubric.
    LlmJudge,
    /// Scan the workspace with semgrep and a local rules file.
    Semgrep,
    /// Scan the workspace for secrets with gitleaks.
    Gitleaks,
    /// Call a tool of an MCP server.
    Mcp,
}

impl RawUses {
    /// The name as written in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            RawUses::Command => "command",
            RawUses::Build => "build",
            RawUses::Typecheck => "typecheck",
            RawUses::Lint => "lint",
            RawUses::UnitTest => "unit_test",
            RawUses::Schema => "schema",
            RawUses::LlmJudge => "llm_judge",
            RawUses::Semgrep => "semgrep",
            RawUses::Gitleaks => "gitleaks",
            RawUses::Mcp => "mcp",
        }
    }
}

/// One check on a level's result.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawVerifier {
    /// Unique on the level; gates read it as `verifier.<name>.<field>`.
    pub name: Located<String>,
    /// Which built-in verifier runs.
    pub uses: Located<RawUses>,
    /// Settings of the verifier; which ones depend on `uses` (an unknown one is an error).
    #[serde(default)]
    pub params: Option<Located<BTreeMap<String, Located<serde_json::Value>>>>,
    /// Weight in a weighted score (default 1).
    #[serde(default)]
    pub weight: Option<Located<f64>>,
    /// What a failure does: `retry` the level with feedback, `fail` it (default), or `ignore`.
    #[serde(default)]
    pub on_fail: Option<Located<RawOnFail>>,
    /// How often `retry` re-runs the level (default 1).
    #[serde(default)]
    pub max_retries: Option<Located<u32>>,
    /// Longest time the verifier may run, in seconds.
    #[serde(default)]
    pub timeout_s: Option<Located<f64>>,
}

/// What a verifier failure does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RawOnFail {
    /// Re-run the level with the failure as feedback, up to `max_retries` times.
    Retry,
    /// The level fails; its verdict is FAIL.
    Fail,
    /// Record the outcome; it does not change the verdict.
    Ignore,
}

/// How a fan-out merges its children.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawFanIn {
    /// The aggregator.
    pub aggregator: Located<RawAggregator>,
    /// `weighted_score`: the score (0..1) at or above which the verdict is PASS.
    #[serde(default)]
    pub threshold: Option<Located<f64>>,
    /// `weighted_score`: weight per child id (default 1).
    #[serde(default)]
    pub weights: Option<Located<BTreeMap<String, Located<f64>>>>,
}

/// The aggregators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RawAggregator {
    /// PASS when more than half of the children pass.
    MajorityPass,
    /// PASS when the weighted share of passing children reaches `threshold`.
    WeightedScore,
    /// PASS when every child passes.
    AllPass,
}

impl RawAggregator {
    /// The name as written in YAML.
    pub const fn as_str(self) -> &'static str {
        match self {
            RawAggregator::MajorityPass => "majority_pass",
            RawAggregator::WeightedScore => "weighted_score",
            RawAggregator::AllPass => "all_pass",
        }
    }
}

/// A guarded edge.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawEdge {
    /// The level the edge leaves.
    pub from: Located<String>,
    /// The level it enters, `__end__` (the run completes) or `__fail__` (the run ends
    /// failed).
    pub to: Located<String>,
    /// A gate expression; the edge is taken only when it is true. Absent: always taken.
    #[serde(default)]
    pub when: Option<Located<String>>,
}

/// Limits for the regression gate: how far a replay of one of the scenario's fixtures
/// (`baton test`) may move from what the fixture expects before the case fails. A change
/// of the job's final status always fails; a limit left out is not checked, and a change
/// not allowed fails.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawRegressionThresholds {
    /// Largest allowed drop of any verifier or rubric score (0..1).
    #[serde(default)]
    pub score_drop_max: Option<Located<f64>>,
    /// Largest allowed drop of the share of passing verifiers (0..1).
    #[serde(default)]
    pub pass_rate_drop_max: Option<Located<f64>>,
    /// Largest allowed cost increase, as a fraction (0.25 = 25 %).
    #[serde(default)]
    pub cost_increase_max: Option<Located<f64>>,
    /// Largest allowed token increase, as a fraction (0.25 = 25 %).
    #[serde(default)]
    pub token_increase_max: Option<Located<f64>>,
    /// Whether the levels run (in order, with their attempts) may differ. Default false.
    #[serde(default)]
    pub path_changes_allowed: Option<Located<bool>>,
    /// Whether a level's verdict may differ. Default false.
    #[serde(default)]
    pub verdict_changes_allowed: Option<Located<bool>>,
    /// Whether the job's final output may differ. Default false.
    #[serde(default)]
    pub output_changes_allowed: Option<Located<bool>>,
}

/// The JSON Schema of the scenario format, for editors (`baton schema`).
pub fn json_schema() -> serde_json::Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(RawScenario)).unwrap_or_default();
    if let Some(object) = schema.as_object_mut() {
        object.insert("title".to_owned(), "Baton scenario".into());
        object.insert(
            "description".to_owned(),
            "A Baton scenario: levels joined by guarded edges. Generated by `baton schema`.".into(),
        );
    }
    schema
}
