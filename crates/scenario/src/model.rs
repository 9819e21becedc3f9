//! A checked scenario: the types the engine runs.
//!
//! Everything here has passed [`crate::check`]: ids are unique and well formed, edges
//! point at levels, gates are compiled and typed, templates parsed, rubrics read, and
//! each [`LevelKind`] carries exactly the settings its kind uses.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Serialize;

pub use crate::expr::ErrorKind;
pub use crate::raw::WaveOrder;

use crate::expr::Gate;
use crate::rubric::Rubric;
use crate::schema::JsonSchema;

pub use crate::raw::{
    RawAggregator as Aggregator, RawEffect as Effect, RawMode as Mode, RawOnFail as OnFail,
    RawUses as Uses,
};

/// Index of a level in [`Scenario::levels`].
pub type LevelIdx = usize;

/// Default approver role of a `human_approval` level and of a tool's approvals.
pub const APPROVER_ROLE_DEFAULT: &str = "approver";

/// The target of edges that end the run.
pub const END: &str = "__end__";

/// The target of edges that end the run as failed (the path that must not report success).
pub const FAIL: &str = "__fail__";

/// The texts of one scenario version: its canonical form and every template, rubric,
/// schema and rules file it read (by path relative to the scenarios directory; a seed
/// directory's manifest under [`crate::files::SEED_PREFIX`]). Their checksum is the
/// scenario's.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Texts {
    pub canonical: String,
    pub files: std::collections::BTreeMap<String, String>,
}

/// A checked scenario.
#[derive(Debug)]
pub struct Scenario {
    pub id: String,
    pub version: u32,
    pub display_name: String,
    pub description: String,
    pub examples: Vec<String>,
    pub intent_routes: Vec<String>,
    pub budget: Budget,
    /// Failures of one kind before `escalate_now` turns true.
    pub max_attempts_per_conflict: u32,
    pub levels: Vec<Level>,
    pub edges: Vec<Edge>,
    /// The level a run starts at.
    pub entry: LevelIdx,
    pub regression: RegressionThresholds,
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// The directory copied into every new workspace (`workspace.seed`), resolved.
    pub workspace_seed: Option<std::path::PathBuf>,
    /// sha256 (hex) of the canonical scenario plus every template, rubric and schema it reads.
    pub checksum: String,
    /// The canonical scenario and every file it read, as read: what loads this exact
    /// version again without its directory ([`crate::Registry::load_texts`]).
    pub texts: std::sync::Arc<Texts>,
    /// The file it was loaded from.
    pub file: String,
    /// Outgoing edge indexes of each level, in declared order.
    pub outgoing: Vec<Vec<usize>>,
    pub(crate) index: HashMap<String, LevelIdx>,
}

impl Scenario {
    /// The level with this id.
    pub fn level(&self, id: &str) -> Option<&Level> {
        self.index.get(id).map(|&i| &self.levels[i])
    }

    /// The index of the level with this id.
    pub fn level_index(&self, id: &str) -> Option<LevelIdx> {
        self.index.get(id).copied()
    }

    /// The edges leaving a level, in declared order.
    pub fn edges_from(&self, level: LevelIdx) -> impl Iterator<Item = &Edge> {
        self.outgoing.get(level).into_iter().flatten().map(|&i| &self.edges[i])
    }

    /// Whether the intent classifier may offer this scenario (it has examples).
    pub fn classifier_eligible(&self) -> bool {
        !self.examples.is_empty()
    }
}

/// Caps on one run; `None` is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Budget {
    pub max_cost_usd: Option<f64>,
    pub max_tokens: Option<u64>,
    pub max_duration_s: Option<f64>,
    /// Most level executions a run may start; `None` is the default,
    /// [`crate::limits::LEVEL_RUNS_DEFAULT`].
    pub max_level_runs: Option<u32>,
}

/// Regression limits for replays of fixtures (`baton test`); a `None` limit is
/// unchecked, a change not allowed fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct RegressionThresholds {
    pub score_drop_max: Option<f64>,
    pub pass_rate_drop_max: Option<f64>,
    pub cost_increase_max: Option<f64>,
    pub token_increase_max: Option<f64>,
    pub path_changes_allowed: bool,
    pub verdict_changes_allowed: bool,
    pub output_changes_allowed: bool,
}

/// One checked level.
#[derive(Debug)]
pub struct Level {
    pub id: String,
    pub role: String,
    pub kind: LevelKind,
    /// The model constraint: the level's own, else the scenario default.
    pub model: Option<ModelConstraint>,
    pub verifiers: Vec<VerifierSpec>,
    pub mode: Mode,
    pub run_all: bool,
    pub terminal: bool,
    /// Whether starting the level records `agent_handoff` (`handoff: true`).
    pub handoff: bool,
    /// Whether steering messages reach the level's model calls (`steerable: true`).
    pub steerable: bool,
    pub timeout_s: Option<f64>,
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// The fan-out level that runs this one as a child.
    pub parent: Option<LevelIdx>,
}

impl Level {
    /// The kind's name as written in YAML.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            LevelKind::Prompt { .. } => "prompt",
            LevelKind::ToolLoop { .. } => "tool_loop",
            LevelKind::Verifier => "verifier",
            LevelKind::FanOut { .. } => "fan_out",
            LevelKind::HumanApproval { .. } => "human_approval",
            LevelKind::Wave(_) => "wave",
        }
    }

    /// The verifier with this name.
    pub fn verifier(&self, name: &str) -> Option<&VerifierSpec> {
        self.verifiers.iter().find(|v| v.name == name)
    }
}

/// What a level does, with the settings of that kind only.
#[derive(Debug)]
pub enum LevelKind {
    Prompt {
        prompt: Template,
        response: Response,
    },
    ToolLoop {
        prompt: Template,
        max_iterations: u32,
        /// The user's own tools its model may call, from the toolsets it lists, in order.
        tools: Vec<Arc<OwnTool>>,
    },
    Verifier,
    FanOut {
        children: Vec<LevelIdx>,
        fan_in: FanIn,
        max_parallel: u32,
    },
    HumanApproval {
        /// The question shown to the approver.
        prompt: Option<Template>,
        approver_role: String,
        output_schema: JsonSchema,
    },
    Wave(WaveSpec),
}

/// One of the user's own tools (a tool of a `toolsets:` entry), checked.
#[derive(Debug)]
pub struct OwnTool {
    /// The name the model calls it by.
    pub name: String,
    /// The toolset it belongs to.
    pub toolset: String,
    pub description: String,
    /// Its arguments' schema, compiled; its document is what the model is shown.
    pub parameters: JsonSchema,
    pub effect: Effect,
    pub timeout_s: f64,
    /// Most calls per level attempt.
    pub max_calls: Option<u32>,
    pub cost_usd: f64,
    /// Its key leaves out the attempt: a later attempt's same call reuses the receipt.
    pub once_per_run: bool,
    /// When a call waits for a person's approval before it is made.
    pub approval: ToolApproval,
    /// Who may approve its calls.
    pub approver_role: String,
    /// How long a call waits for its approval, in seconds (none: until decided).
    pub approval_timeout_s: Option<f64>,
    pub source: ToolSource,
}

/// When a call of a user's tool waits for a person's approval.
#[derive(Debug)]
pub enum ToolApproval {
    Never,
    Always,
    /// When the gate over `args.<…>` fires for the call's arguments.
    When(Gate),
}

impl ToolApproval {
    /// Whether a call with these arguments waits for approval.
    pub fn needed(&self, arguments: &serde_json::Value) -> bool {
        match self {
            ToolApproval::Never => false,
            ToolApproval::Always => true,
            ToolApproval::When(gate) => {
                let doc = serde_json::json!({ "args": arguments });
                gate.fires(&crate::expr::JsonContext(&doc))
            }
        }
    }
}

/// How a tool of the user's is called.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolSource {
    /// A program run in the jail, in the level's workspace, with no network; the call's
    /// arguments as JSON on its stdin.
    Command { argv: Vec<String>, env: Vec<(String, String)> },
    /// A request to an HTTP API, through the egress guard.
    Http(HttpRequest),
    /// A tool of an MCP server, called by its name.
    Mcp(Arc<McpServer>),
}

/// The MCP server of an `mcp` toolset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpServer {
    /// The toolset's name: one server (or session) per toolset per level attempt.
    pub toolset: String,
    pub transport: McpTransport,
}

/// How an MCP server is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum McpTransport {
    /// A command, over its stdio, run in the jail in the level's workspace.
    Stdio { argv: Vec<String>, env: Vec<(String, String)> },
    /// Streamable HTTP at a URL, through the egress guard.
    Http { url: String },
}

impl McpServer {
    /// How it is named in messages: its program, or its URL.
    pub fn shown(&self) -> &str {
        match &self.transport {
            McpTransport::Stdio { argv, .. } => argv.first().map_or("", String::as_str),
            McpTransport::Http { url } => url,
        }
    }
}

/// The request of an `http` tool, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpRequest {
    /// `GET`, `POST`, `PUT`, `PATCH` or `DELETE`.
    pub method: String,
    /// The URL, its `{NAME}` placeholders (in the path and query only) standing for
    /// arguments.
    pub url: String,
    /// Header names and values, `${secret:NAME}` standing for secrets.
    pub headers: Vec<(String, String)>,
    /// Whether the arguments go as the JSON body.
    pub body: bool,
}

/// The prefix of a secret's reference in a header value: `${secret:NAME}`.
pub const SECRET_REFERENCE: &str = "${secret:";

/// The `{NAME}` placeholders of an `http` tool's URL, in order, with their byte ranges
/// (the braces included); a `{` without its `}` is an error.
pub fn url_placeholders(url: &str) -> Result<Vec<(std::ops::Range<usize>, &str)>, String> {
    let mut found = Vec::new();
    let mut rest = 0;
    while let Some(open) = url[rest..].find('{').map(|i| rest + i) {
        let Some(close) = url[open..].find('}').map(|i| open + i) else {
            return Err(format!("a `{{` at byte {open} of the URL is not closed"));
        };
        found.push((open..close + 1, &url[open + 1..close]));
        rest = close + 1;
    }
    Ok(found)
}

/// The secrets a header value refers to (`${secret:NAME}`), in order; an unclosed
/// reference is an error.
pub fn secret_references(value: &str) -> Result<Vec<(std::ops::Range<usize>, &str)>, String> {
    let mut found = Vec::new();
    let mut rest = 0;
    while let Some(open) = value[rest..].find(SECRET_REFERENCE).map(|i| rest + i) {
        let start = open + SECRET_REFERENCE.len();
        let Some(close) = value[start..].find('}').map(|i| start + i) else {
            return Err("a `${secret:` reference is not closed with `}`".to_owned());
        };
        found.push((open..close + 1, &value[start..close]));
        rest = close + 1;
    }
    Ok(found)
}

/// A checked `wave` level.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WaveSpec {
    /// The scenario each assignment runs as a child run of; none for a manual wave whose
    /// workers are run outside.
    pub worker: Option<String>,
    /// The program each assignment runs as instead, its argv.
    pub command: Option<Vec<String>>,
    pub source: WaveSource,
    /// The wave's own parallelism, when the level sets it.
    pub max_parallel: Option<u32>,
    /// Longest time one worker may take.
    pub timeout_ms: u64,
    pub max_assignments: u32,
    pub dispatch: WaveDispatch,
    pub context: Option<String>,
    /// The order planned assignments are admitted in.
    pub order: WaveOrder,
}

/// Where a wave's assignments come from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaveSource {
    /// The run's input, read as JSON.
    Input,
    /// The parsed JSON answer of this level.
    Level(String),
}

/// Who dispatches a wave's assignments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaveDispatch {
    Auto,
    Manual,
}

/// A prompt template, parsed at load time.
#[derive(Clone, Debug)]
pub struct Template {
    /// The file (relative to the scenarios directory), or `inline:<level id>` for an inline
    /// template: never a machine path, so logs and caches do not depend on where it lives.
    pub name: String,
    pub text: Arc<str>,
}

/// How a prompt level's answer is read.
#[derive(Clone, Debug, PartialEq)]
pub enum Response {
    Markdown,
    Verdict,
    Json { schema: Option<JsonSchema> },
}

/// Pricing tier of a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    Free,
    Paid,
}

impl Tier {
    /// The tier as written in a model pattern.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Free => "free",
            Tier::Paid => "paid",
        }
    }
}

/// Which models may serve a level.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelConstraint {
    /// The one tier of every `allow` pattern; `None` when `allow` is empty.
    pub tier: Option<Tier>,
    /// Globs over `tier:provider/model`.
    pub allow: Vec<String>,
    pub fallback_outside_allow: bool,
    pub fallback: Vec<String>,
    /// Sampling temperature, when the constraint sets one.
    pub temperature: Option<f64>,
    /// The retry budget of one call to one provider; absent fields keep the client's
    /// defaults.
    pub retry: RetryPolicy,
    /// `level` or `defaults`: where the constraint was declared.
    pub source: &'static str,
}

/// How a model client retries one provider after transient faults; `None` keeps the
/// client's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct RetryPolicy {
    /// Requests to one provider, the first included.
    pub attempts: Option<u32>,
    /// Longest time spent retrying one provider, in seconds.
    pub max_time_s: Option<f64>,
    /// Longest wait between two requests, in seconds.
    pub backoff_max_s: Option<f64>,
}

/// A verifier declared on a level.
#[derive(Clone, Debug)]
pub struct VerifierSpec {
    pub name: String,
    pub uses: Uses,
    pub params: serde_json::Map<String, serde_json::Value>,
    pub weight: f64,
    pub on_fail: OnFail,
    pub max_retries: u32,
    pub timeout_s: Option<f64>,
    /// The rubric of an `llm_judge`.
    pub rubric: Option<Arc<Rubric>>,
    /// The schema of a `schema` verifier, read from its file when it named one.
    pub schema: Option<JsonSchema>,
    /// The text of a scanner's configuration file (`rules` of `semgrep`, `config` of
    /// `gitleaks`), read at load so that it counts in the checksum.
    pub config_text: Option<Arc<str>>,
}

/// How a fan-out merges its children.
#[derive(Clone, Debug, PartialEq)]
pub struct FanIn {
    pub aggregator: Aggregator,
    /// `weighted_score` threshold (0..1).
    pub threshold: f64,
    /// Weight per child id; absent children weigh 1.
    pub weights: BTreeMap<String, f64>,
}

/// What a fan-in decided from its children's outcomes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FanInDecision {
    /// Whether the fan-out passes.
    pub pass: bool,
    /// How many children passed.
    pub passed: usize,
    /// The passing children's share of the weight, 0 to 1.
    pub score: f64,
}

impl FanIn {
    /// What the aggregator decides of a fan-out of `count` children from those with a
    /// result, given as (child id, passed); a child without one counts as not passed.
    /// `majority_pass`: more than half pass; `all_pass`: every one does; `weighted_score`:
    /// the passing children's share of the weight (a child not in `weights` weighs 1)
    /// reaches `threshold`.
    pub fn decide(&self, results: &[(&str, bool)], count: usize) -> FanInDecision {
        let (mut weight_all, mut weight_pass, mut passed) = (0.0, 0.0, 0usize);
        for &(id, pass) in results {
            let w = self.weights.get(id).copied().unwrap_or(1.0);
            weight_all += w;
            if pass {
                passed += 1;
                weight_pass += w;
            }
        }
        let score = if weight_all > 0.0 { weight_pass / weight_all } else { 0.0 };
        let pass = match self.aggregator {
            Aggregator::MajorityPass => passed * 2 > count,
            Aggregator::AllPass => passed == count,
            Aggregator::WeightedScore => score >= self.threshold,
        };
        FanInDecision { pass, passed, score }
    }
}

/// A checked edge.
#[derive(Debug)]
pub struct Edge {
    pub from: LevelIdx,
    pub to: Target,
    pub when: Option<Gate>,
}

/// Where an edge leads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Level(LevelIdx),
    End,
    /// `__fail__`: the run ends `failed`.
    Fail,
}
