//! The MCP tools: their list (names, descriptions, input and output JSON Schemas derived
//! from the types below), the dispatch of a call, and the scenario and run tools. Each tool
//! runs the HTTP API's operation for the caller; a refusal is a tool error whose text says
//! what to do, a malformed call a protocol error naming the argument.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use baton_engine::Status;
use rmcp::ErrorData;
use rmcp::model::{CallToolResult, Tool, ToolAnnotations};
use rmcp::service::{RequestContext, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::calls::{LOOK_EVERY, NoArgs, args, schema_of};
use super::reply::{Progress, answered, failed};
use crate::app::App;
use crate::auth::Caller;
use crate::event_wire::event_json;
use crate::problem::Problem;
use crate::runs::{self, Decide, RunView, StartRun};
use crate::scenarios;

/// The longest `run_start` may wait for its run, in seconds.
pub(crate) const WAIT_S_MAX: f64 = 3_600.0;
/// The most events one `run_events` page holds.
const EVENTS_LIMIT_MAX: usize = 500;

// ---- arguments ----

/// A scenario by id.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScenarioArgs {
    /// The scenario's id (see scenarios_list).
    pub scenario: String,
}

/// A scenario file to check.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ValidateArgs {
    /// The scenario file's YAML text. Its templates and rubrics are read from the server's
    /// scenarios directory.
    pub yaml: String,
}

/// A job to start.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunStartArgs {
    /// Pin: run exactly this scenario (an unknown one falls back to the default, with a
    /// warning).
    pub scenario: Option<String>,
    /// An intent route, looked up case-insensitively.
    pub intent: Option<String>,
    /// The job's kind (`task`, `question`, …), for the classifier.
    pub kind: Option<String>,
    /// The tenant the run is for; must be the caller's own (the token's, or `baton mcp
    /// --tenant`). Leave it out to use the caller's.
    pub tenant: Option<String>,
    /// The job's input text.
    #[serde(default)]
    pub input: String,
    /// Metadata the scenario's gates and prompts read.
    #[serde(default)]
    pub metadata: Map<String, Value>,
    /// A second start with this key returns the first one's run instead of starting another.
    pub idempotency_key: Option<String>,
    /// The job's cost cap in US dollars, all its runs together.
    pub max_cost_usd: Option<f64>,
    /// Wait up to this many seconds (0 to 3600; default 0: return at once) for the run to
    /// end or to wait for a person; progress notifications follow it meanwhile.
    pub wait_s: Option<f64>,
    /// When true, cancelling this call (an MCP cancellation) while it waits cancels the run;
    /// by default the run goes on.
    #[serde(default)]
    pub cancel_with_call: bool,
}

/// A run by id.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunArgs {
    /// The run's id.
    pub run_id: String,
}

/// A page of a run's events.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventsArgs {
    /// The run's id.
    pub run_id: String,
    /// Only events after this seq (default 0: from the start).
    #[serde(default)]
    pub after: u64,
    /// At most this many events (1 to 500, default 100).
    pub limit: Option<usize>,
}

/// A cancel.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelArgs {
    /// The run's id; every run below it is cancelled too.
    pub run_id: String,
    /// Why (recorded on the run).
    pub reason: Option<String>,
}

/// A decision on an approval.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DecideArgs {
    /// The paused run's id.
    pub run_id: String,
    /// The request decided; may be left out when exactly one is open (run_get shows them
    /// under waiting_on).
    pub request_id: Option<String>,
    /// A comment, recorded with the decision.
    pub comment: Option<String>,
    /// The approver's data, when the level's output_schema asks for some.
    pub data: Option<Value>,
}

/// An answer to a run's question.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AnswerArgs {
    /// The waiting run's id.
    pub run_id: String,
    /// The answer, as JSON, checked against the question's schema (run_get shows it).
    pub answer: Value,
}

/// A steering message for a running run.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SteerArgs {
    /// The running run's id.
    pub run_id: String,
    /// The message (text, at most 8 KiB), given to the next model call of a steerable level.
    pub message: String,
}

// ---- results ----

/// The scenarios the caller may start.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ScenarioList {
    pub scenarios: Vec<scenarios::ScenarioSummary>,
}

/// A scenario: what it is for, what it takes, its levels and graph.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Described {
    #[serde(flatten)]
    pub detail: scenarios::ScenarioDetail,
    /// What a job's input is: free text every level's prompt reads as `input`.
    pub input: String,
    /// Example inputs the scenario's author gave.
    pub examples: Vec<String>,
    /// The scenario's budget: max_cost_usd, max_tokens, max_duration_s, max_level_runs.
    pub budget: Value,
}

/// A started run, and how it stands after the wait.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct RunStarted {
    #[serde(flatten)]
    pub started: runs::Started,
    /// The run as it stands when the call returns.
    pub run: RunView,
    /// How long the call waited, in seconds.
    pub waited_s: f64,
    /// True when the wait ended before the run did (it goes on; follow it with run_get).
    pub still_running: bool,
    /// What an MCP cancellation of this call does to the run.
    pub on_call_cancelled: String,
}

/// A page of a run's events.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct EventPage {
    pub run_id: String,
    /// The events, oldest first: seq, at, kind, level_id, attempt and the kind's fields.
    pub events: Vec<Value>,
    /// The `after` of the next page, when there are more events.
    pub next_after: Option<u64>,
}

// ---- the list ----

/// A tool with the input and output schemas of its argument and result types.
fn tool<A: JsonSchema + 'static, R: JsonSchema + 'static>(
    name: &'static str,
    description: &'static str,
    read_only: bool,
) -> Tool {
    let annotations = ToolAnnotations::new().read_only(read_only).destructive(false);
    Tool::new(name, description, schema_of::<A>())
        .with_raw_output_schema(schema_of::<R>())
        .with_annotations(annotations)
}

/// Every tool, built once.
pub(crate) fn list() -> &'static [Tool] {
    static TOOLS: OnceLock<Vec<Tool>> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let mut tools = vec![
            tool::<NoArgs, ScenarioList>(
                "scenarios_list",
                "The scenarios this caller may start: id, version, description, intent routes, number of levels.",
                true,
            ),
            tool::<ScenarioArgs, Described>(
                "scenario_describe",
                "One scenario: what it is for, the input it expects, its example inputs, budget, levels, edges (with their gates) and graph (Mermaid and dot).",
                true,
            ),
            tool::<ValidateArgs, scenarios::Validation>(
                "scenario_validate",
                "Check a scenario file (YAML text) as if it were in the scenarios directory: ok, and every diagnostic with file, line, column, the line's text and a hint. Nothing is stored.",
                true,
            ),
            tool::<RunStartArgs, RunStarted>(
                "run_start",
                "Start a job: a pinned scenario, an intent route, a kind for the classifier, or the default. Returns at once with the run id, or with wait_s waits (progress notifications meanwhile) until the run ends or waits for a person. An MCP cancellation of the call cancels the run only with cancel_with_call: true.",
                false,
            ),
            tool::<RunArgs, RunView>(
                "run_get",
                "A run: status (queued, running, paused, waiting, interrupted, completed, aborted, cancelled, failed), cost, tokens, the level running, what it waits on (approvals and questions with their request ids and schemas, child runs), its children and its output.",
                true,
            ),
            tool::<EventsArgs, EventPage>(
                "run_events",
                "A page of a run's event log after a seq (at most 500 events; next_after continues). Subscribe to baton://runs/{run_id}/timeline to hear when it grows.",
                true,
            ),
            tool::<CancelArgs, RunView>(
                "run_cancel",
                "Cancel a run and every run below it (recorded once, with the reason and who). A run being driven stops at its next check.",
                false,
            ),
            tool::<DecideArgs, runs::Decided>(
                "run_approve",
                "Approve a paused run's approval request (exactly once: a second decision is refused) and continue the run.",
                false,
            ),
            tool::<DecideArgs, runs::Decided>(
                "run_reject",
                "Reject a paused run's approval request (exactly once) and continue the run down its rejection path.",
                false,
            ),
            tool::<SteerArgs, runs::Steered>(
                "run_steer",
                "Send a message to a running run: recorded once (by you) and given to the next model call of a level that declares `steerable: true`. Refused when the run has ended or no steerable level is running or ahead.",
                false,
            ),
            tool::<AnswerArgs, RunView>(
                "run_answer",
                "Answer the question a waiting run asked (exactly once; checked against the question's schema) and continue the run.",
                false,
            ),
        ];
        tools.extend(super::waves::list());
        tools
    })
}

// ---- the dispatch ----

/// Calls the tool `name` for `caller`.
pub(crate) async fn call(
    app: &Arc<App>,
    caller: &Caller,
    name: &str,
    arguments: Value,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResult, ErrorData> {
    let done: Result<CallToolResult, Problem> = match name {
        "scenarios_list" => {
            args::<NoArgs>(name, arguments)?;
            scenarios(app, caller).await
        }
        "scenario_describe" => describe(app, caller, args(name, arguments)?).await,
        "scenario_validate" => {
            let a: ValidateArgs = args(name, arguments)?;
            scenarios::validate(app, a.yaml).await.map(|v| answered(&v))
        }
        "run_start" => start(app, caller, args(name, arguments)?, context).await,
        "run_get" => {
            let a: RunArgs = args(name, arguments)?;
            runs::run_view(app, caller, &a.run_id).await.map(|v| answered(&v))
        }
        "run_events" => events(app, caller, args(name, arguments)?).await,
        "run_cancel" => {
            let a: CancelArgs = args(name, arguments)?;
            runs::cancel(app, caller, &a.run_id, a.reason).await.map(|v| answered(&v))
        }
        "run_approve" | "run_reject" => {
            let a: DecideArgs = args(name, arguments)?;
            let decide = Decide { request_id: a.request_id, comment: a.comment, data: a.data };
            runs::decide(app, caller, &a.run_id, decide, name == "run_approve")
                .await
                .map(|v| answered(&v))
        }
        "run_steer" => {
            let a: SteerArgs = args(name, arguments)?;
            runs::steer(app, caller, &a.run_id, &a.message).await.map(|v| answered(&v))
        }
        "run_answer" => {
            let a: AnswerArgs = args(name, arguments)?;
            runs::answer_run_with(app, caller, &a.run_id, a.answer).await.map(|v| answered(&v))
        }
        wave if wave.starts_with("wave_") => {
            return super::waves::call(app, caller, name, arguments, context).await;
        }
        other => {
            return Err(ErrorData::invalid_params(
                format!("no tool `{other}`; tools/list shows Baton's tools"),
                None,
            ));
        }
    };
    Ok(done.unwrap_or_else(|p| failed(&p)))
}

async fn scenarios(app: &Arc<App>, caller: &Caller) -> Result<CallToolResult, Problem> {
    let registry = app.registry_for(caller.tenant.as_deref()).await?;
    let scenarios = registry.scenarios().map(|s| scenarios::summary(s)).collect();
    Ok(answered(&ScenarioList { scenarios }))
}

async fn describe(
    app: &Arc<App>,
    caller: &Caller,
    a: ScenarioArgs,
) -> Result<CallToolResult, Problem> {
    let registry = app.registry_for(caller.tenant.as_deref()).await?;
    let Some(s) = registry.get(&a.scenario) else {
        let known: Vec<&str> = registry.scenarios().map(|s| s.id.as_str()).collect();
        return Err(Problem::not_found(format!(
            "no scenario `{}`; the caller's scenarios are: {}",
            a.scenario,
            known.join(", ")
        )));
    };
    let budget = serde_json::json!({
        "max_cost_usd": s.budget.max_cost_usd,
        "max_tokens": s.budget.max_tokens,
        "max_duration_s": s.budget.max_duration_s,
        "max_level_runs": s.budget.max_level_runs,
    });
    Ok(answered(&Described {
        detail: scenarios::detail(s),
        input: "free text, given to every level's prompt as `input`; metadata (an object) is read by gates and prompts as `metadata`".to_owned(),
        examples: s.examples.clone(),
        budget,
    }))
}

/// Whether a job has gone as far as it goes without a person or an outside agent: its run
/// ended, or it (or a run below it that it waits for) is paused for an approval or waits for
/// an answer or for outside agents.
pub(crate) async fn settled(app: &App, caller: &Caller, view: &RunView) -> Result<bool, Problem> {
    let mut pending = vec![(
        view.status.clone(),
        view.waiting_on.iter().map(|w| (w.wants.clone(), w.level_id.clone())).collect::<Vec<_>>(),
    )];
    let mut looked = 0;
    while let Some((status, waits)) = pending.pop() {
        looked += 1;
        if looked > baton_engine::limits::TREE_RUNS_MAX {
            return Ok(false);
        }
        match Status::from_name(&status) {
            // A child that ended is settled in its parent by the next drive.
            Some(s) if s.is_final() && looked == 1 => return Ok(true),
            Some(Status::Paused) => return Ok(true),
            Some(Status::Waiting) => {
                let children: Vec<&String> = waits
                    .iter()
                    .filter(|(wants, _)| wants == "child run")
                    .map(|(_, id)| id)
                    .collect();
                if children.len() < waits.len() || waits.is_empty() {
                    return Ok(true);
                }
                for child in children {
                    let v = runs::run_view(app, caller, child).await?;
                    pending.push((
                        v.status,
                        v.waiting_on.into_iter().map(|w| (w.wants, w.level_id)).collect(),
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(false)
}

async fn start(
    app: &Arc<App>,
    caller: &Caller,
    a: RunStartArgs,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResult, Problem> {
    if let Some(tenant) = &a.tenant
        && caller.tenant.as_deref() != Some(tenant.as_str())
    {
        return Err(Problem::forbidden(format!(
            "tenant `{tenant}` is not this caller's (the caller's tenant is {}); leave tenant out, or connect with a token of that tenant",
            caller.tenant.as_deref().map_or_else(|| "none".to_owned(), |t| format!("`{t}`"))
        )));
    }
    let wait_s = a.wait_s.unwrap_or(0.0);
    if !wait_s.is_finite() || !(0.0..=WAIT_S_MAX).contains(&wait_s) {
        return Err(Problem::bad_request(format!(
            "wait_s must be 0 to {WAIT_S_MAX} seconds, not {wait_s}"
        )));
    }
    let body = StartRun {
        scenario: a.scenario,
        intent: a.intent,
        kind: a.kind,
        input: a.input,
        metadata: a.metadata,
        idempotency_key: a.idempotency_key,
        max_cost_usd: a.max_cost_usd,
    };
    let (_, started) = runs::start(app, caller, body, None).await?;
    let run_id = started.run_id.clone();
    let began = std::time::Instant::now();
    let deadline = began + Duration::from_secs_f64(wait_s);
    let mut progress = Progress::of(context);
    let mut after = 0;
    let mut view = runs::run_view(app, caller, &run_id).await?;
    let mut cancelled = false;
    while !settled(app, caller, &view).await? && std::time::Instant::now() < deadline {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        tokio::select! {
            _ = app.store.wait_for_events(&run_id, after, left.min(LOOK_EVERY)) => {}
            () = context.ct.cancelled() => { cancelled = true; break; }
            () = app.stop.cancelled() => break,
        }
        let events = app.events_after(&run_id, after).await?;
        if let Some(last) = events.last() {
            after = last.seq;
            #[allow(clippy::cast_precision_loss)]
            progress.say(after as f64, None, describe_event(last)).await;
        }
        view = runs::run_view(app, caller, &run_id).await?;
    }
    if cancelled && a.cancel_with_call {
        let reason = "the MCP call run_start that started it was cancelled (cancel_with_call)";
        view = runs::cancel(app, caller, &run_id, Some(reason.to_owned())).await?;
    }
    let on_call_cancelled = if a.cancel_with_call {
        "cancels the run (cancel_with_call: true)"
    } else {
        "nothing: the run goes on (cancel_with_call was not set)"
    };
    Ok(answered(&RunStarted {
        still_running: !settled(app, caller, &view).await?,
        run: view,
        started,
        waited_s: began.elapsed().as_secs_f64(),
        on_call_cancelled: on_call_cancelled.to_owned(),
    }))
}

/// One line on what an event says, for a progress notification.
pub(crate) fn describe_event(e: &baton_engine::event::Event) -> String {
    format!("#{} {}{}", e.seq, e.data.kind(), level_of(e))
}

/// ` `level`` for an event of a level, else nothing.
pub(crate) fn level_of(e: &baton_engine::event::Event) -> String {
    e.level_id.as_deref().map(|l| format!(" `{l}`")).unwrap_or_default()
}

async fn events(app: &Arc<App>, caller: &Caller, a: EventsArgs) -> Result<CallToolResult, Problem> {
    let limit = a.limit.unwrap_or(100);
    if limit == 0 || limit > EVENTS_LIMIT_MAX {
        return Err(Problem::bad_request(format!(
            "limit must be 1 to {EVENTS_LIMIT_MAX}, not {limit}"
        )));
    }
    app.visible_run(caller, &a.run_id).await?;
    let events = app.store.load(&a.run_id, a.after).await?;
    let more = events.len() > limit;
    let page: Vec<Value> = events.iter().take(limit).map(|e| event_json(&a.run_id, e)).collect();
    let next_after = more.then(|| events.get(limit - 1).map(|e| e.seq)).flatten();
    Ok(answered(&EventPage { run_id: a.run_id, events: page, next_after }))
}
