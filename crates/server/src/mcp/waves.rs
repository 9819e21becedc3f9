//! The wave tools, under one prefix so a model never takes them for run tools: `wave_plan`
//! (a standalone wave from a task list), `wave_dispatch` and `wave_record` (outside agents
//! running workers themselves), `wave_decide`, `wave_complete`, `wave_cancel`, `wave_run`
//! (this server as the wave's active dispatcher, with progress notifications), `wave_get`,
//! `wave_list` and `wave_summary`. A wave is named by its run id, or `current`: the caller's
//! newest run with a wave under way. Every action is the engine's conditional append
//! (`Engine::wave_act`), as for `baton wave …` and the HTTP API.

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_engine::wave_actions;
use baton_engine::wave_drive::WaveSettings;
use baton_engine::{Outcome, Status};
use rmcp::ErrorData;
use rmcp::model::{CallToolResult, Tool, ToolAnnotations};
use rmcp::service::{RequestContext, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::calls::{LOOK_EVERY, NoArgs, args, caller_runs, object_schema, schema_of};
use super::reply::{Progress, answered, failed};
use crate::app::App;
use crate::auth::Caller;
use crate::problem::Problem;
use crate::runs::{self, StartRun};
use crate::waves::{WaveDone, WaveTarget, wave_act};

/// Most of the caller's runs `current`, `wave_list` and `wave_summary` look through.
const RUNS_SCANNED_MAX: usize = 500;
/// How long `wave_plan` waits for the server to plan the wave.
const PLAN_WAIT: Duration = Duration::from_secs(30);
/// The longest `wave_run` waits, in seconds (default 600).
const RUN_WAIT_S_MAX: f64 = 86_400.0;
const RUN_WAIT_S_DEFAULT: f64 = 600.0;

fn current() -> String {
    "current".to_owned()
}

/// One task of a wave's plan.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WaveTask {
    /// The task's id (unique in the wave).
    pub id: String,
    pub title: String,
    pub description: Option<String>,
    /// `high`, `medium` or `low`.
    pub priority: Option<String>,
}

/// A wave to plan.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PlanArgs {
    /// The tasks, one assignment each.
    pub tasks: Vec<WaveTask>,
    /// Text every worker receives beside its assignment.
    pub context: Option<String>,
    /// Most workers at once, 1 to 10 (default: the configured `[waves] max_parallel`, else
    /// 3).
    pub max_parallel: Option<i64>,
    /// Longest time one worker may take, in milliseconds (1 to 2147483647; default 600000).
    pub timeout_ms: Option<u64>,
    /// Most assignments the plan may hold (1 to 200; default 50).
    pub max_assignments: Option<u32>,
    /// The scenario each assignment runs as a child run of under wave_run; without one,
    /// only outside agents run the wave (wave_dispatch, wave_record).
    pub worker: Option<String>,
}

/// A wave by name.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WaveArgs {
    /// The wave's run id, or `current` (the default): the newest wave under way.
    #[serde(default = "current")]
    pub wave_id: String,
}

/// One dispatch to a worker the caller runs.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Link {
    /// The assignment (`assign-001`); or name it by `task_id`.
    pub assignment_id: Option<String>,
    pub task_id: Option<String>,
    /// The id of the worker's run the caller started (1 to 128 characters).
    pub worker_run_id: String,
}

/// Dispatches.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DispatchArgs {
    /// The wave's run id, or `current` (the default): the newest wave under way.
    #[serde(default = "current")]
    pub wave_id: String,
    /// The assignments given to the caller's workers, each within the wave's max_parallel.
    pub links: Vec<Link>,
}

/// An outcome to record.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecordArgs {
    /// The wave's run id, or `current` (the default): the newest wave under way.
    #[serde(default = "current")]
    pub wave_id: String,
    /// The assignment (`assign-001`); or name it by `task_id`.
    pub assignment_id: Option<String>,
    pub task_id: Option<String>,
    /// `completed`, `partial`, `blocked`, `failed` or `cancelled`.
    pub outcome: String,
    pub summary: Option<String>,
    /// What blocks the work.
    #[serde(default)]
    pub blockers: Vec<String>,
}

/// A wave cancel.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelArgs {
    /// The wave's run id, or `current` (the default): the newest wave under way.
    #[serde(default = "current")]
    pub wave_id: String,
    /// Why (recorded on the run).
    pub reason: Option<String>,
}

/// An active dispatch.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunArgs {
    /// The wave's run id, or `current` (the default): the newest wave under way.
    #[serde(default = "current")]
    pub wave_id: String,
    /// Most workers at once for this call only, 1 to 10 (the wave's stored value is
    /// unchanged).
    pub max_parallel: Option<i64>,
    /// How long this call waits for the wave to end, in seconds (default 600); the wave goes
    /// on after, and wave_get follows it.
    pub wait_s: Option<f64>,
    /// When true, cancelling this call (an MCP cancellation) cancels the wave and its
    /// workers; by default the wave goes on.
    #[serde(default)]
    pub cancel_with_call: bool,
}

/// How many waves to list.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListArgs {
    /// At most this many, newest first (1 to 500, default 50).
    pub limit: Option<usize>,
}

/// What each dispatch did.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Dispatched {
    pub dispatched: Vec<WaveDone>,
}

/// Waves, newest first.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct WaveList {
    /// Each wave as wave_get shows it.
    pub waves: Vec<Value>,
}

/// What wave_run did.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct WaveRan {
    /// The wave as wave_get shows it when the call returns.
    pub wave: Value,
    /// True when the call returned before the wave's drive stopped (it goes on).
    pub still_running: bool,
    /// Why the drive stopped: `ended`, `waiting for outside agents`, `paused for a person`,
    /// `interrupted: …`, or none while it goes on.
    pub stopped: Option<String>,
    pub waited_s: f64,
    /// What an MCP cancellation of this call does to the wave.
    pub on_call_cancelled: String,
}

fn tool<A: JsonSchema + 'static>(
    name: &'static str,
    description: &'static str,
    output: Arc<rmcp::model::JsonObject>,
    read_only: bool,
) -> Tool {
    Tool::new(name, description, schema_of::<A>())
        .with_raw_output_schema(output)
        .with_annotations(ToolAnnotations::new().read_only(read_only).destructive(false))
}

const VIEW: &str = "The wave: run_id, run_status, level_id, decision (dispatch, wait, complete, replan, escalate_to_amygdala, cancelled), ended, worker, max_parallel, timeout_ms, counts, cost_usd, tokens and assignments (id, task_id, title, stage, outcome, summary, blockers, worker_run, cost_usd).";

/// The wave tools.
pub(crate) fn list() -> Vec<Tool> {
    vec![
        tool::<PlanArgs>(
            "wave_plan",
            "Plan a wave: one assignment per task, run later by wave_run (with a worker scenario) or by outside agents (wave_dispatch, wave_record). Returns the wave; its wave_id is its run_id.",
            object_schema(VIEW),
            false,
        ),
        tool::<DispatchArgs>(
            "wave_dispatch",
            "Mark planned assignments dispatched to workers you run yourself (each link an assignment and your worker's run id), within the wave's max_parallel. Record each outcome with wave_record before the wave's timeout.",
            schema_of::<Dispatched>(),
            false,
        ),
        tool::<RecordArgs>(
            "wave_record",
            "Record the outcome of an assignment you dispatched, exactly once: completed, partial, blocked (with blockers), failed or cancelled. Refused for one already settled, one a wave_run worker owns, and one past its timeout (recorded failed instead).",
            schema_of::<WaveDone>(),
            false,
        ),
        tool::<WaveArgs>(
            "wave_decide",
            "The controller's decision now: dispatch (more can start), wait, complete (all completed or partial), replan (one failed), escalate_to_amygdala (one blocked) or cancelled. Assignments past their timeout are recorded failed first.",
            schema_of::<WaveDone>(),
            false,
        ),
        tool::<WaveArgs>(
            "wave_complete",
            "End a wave whose decision is an end (complete, replan or escalate); its run then goes on to its end.",
            schema_of::<WaveDone>(),
            false,
        ),
        tool::<CancelArgs>(
            "wave_cancel",
            "Cancel a wave: every worker that has not settled is cancelled and waited for (up to the settle timeout), then the wave ends cancelled with what settled.",
            schema_of::<WaveDone>(),
            false,
        ),
        tool::<RunArgs>(
            "wave_run",
            "Run a planned wave here: its planned assignments go to its worker scenario as child runs, at most max_parallel at once, until the wave ends or waits for outside agents. Progress notifications follow each dispatch and settlement. An MCP cancellation of the call cancels the wave only with cancel_with_call: true.",
            schema_of::<WaveRan>(),
            false,
        ),
        tool::<WaveArgs>("wave_get", "One wave with every assignment.", object_schema(VIEW), true),
        tool::<ListArgs>(
            "wave_list",
            "Waves, newest first, each as wave_get shows it.",
            schema_of::<WaveList>(),
            true,
        ),
        tool::<NoArgs>(
            "wave_summary",
            "The orchestration state: how many waves, how many under way, their assignments counted by stage and outcome, and what they spent.",
            object_schema("waves, under_way, assignments (by stage and outcome), cost_usd"),
            true,
        ),
    ]
}

/// Calls the wave tool `name`.
pub(crate) async fn call(
    app: &Arc<App>,
    caller: &Caller,
    name: &str,
    arguments: Value,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResult, ErrorData> {
    let done = match name {
        "wave_plan" => plan(app, caller, args(name, arguments)?).await,
        "wave_dispatch" => dispatch(app, caller, args(name, arguments)?).await,
        "wave_record" => {
            let a: RecordArgs = args(name, arguments)?;
            let t = WaveTarget {
                assignment_id: a.assignment_id,
                task_id: a.task_id,
                outcome: Some(a.outcome),
                summary: a.summary,
                blockers: a.blockers,
                ..WaveTarget::default()
            };
            act(app, caller, &a.wave_id, "record", &t).await
        }
        "wave_decide" | "wave_complete" => {
            let a: WaveArgs = args(name, arguments)?;
            let action = name.trim_start_matches("wave_");
            act(app, caller, &a.wave_id, action, &WaveTarget::default()).await
        }
        "wave_cancel" => {
            let a: CancelArgs = args(name, arguments)?;
            let t = WaveTarget { reason: a.reason, ..WaveTarget::default() };
            act(app, caller, &a.wave_id, "cancel", &t).await
        }
        "wave_run" => run(app, caller, args(name, arguments)?, context).await,
        "wave_get" => {
            let a: WaveArgs = args(name, arguments)?;
            get(app, caller, &a.wave_id).await.map(|v| answered(&v))
        }
        "wave_list" => {
            let a: ListArgs = args(name, arguments)?;
            waves(app, caller, a.limit.unwrap_or(50))
                .await
                .map(|waves| answered(&WaveList { waves }))
        }
        "wave_summary" => {
            args::<NoArgs>(name, arguments)?;
            waves(app, caller, RUNS_SCANNED_MAX)
                .await
                .map(|w| CallToolResult::structured(wave_actions::summarize(&w)))
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

/// The run a wave name stands for, if the caller may see it.
async fn resolve(app: &Arc<App>, caller: &Caller, wave_id: &str) -> Result<String, Problem> {
    if wave_id != "current" {
        app.visible_run(caller, wave_id).await.map_err(|_| {
            Problem::not_found(format!(
                "no wave {wave_id}; name a wave by its run id (wave_list shows them) or say `current`"
            ))
        })?;
        return Ok(wave_id.to_owned());
    }
    let recent = caller_runs(app, caller, RUNS_SCANNED_MAX).await?;
    app.deciding()?.current_wave(&recent).await?.ok_or_else(|| {
        Problem::not_found(
            "no wave is under way (`current` names the newest run whose wave has not ended); plan one with wave_plan",
        )
    })
}

async fn act(
    app: &Arc<App>,
    caller: &Caller,
    wave_id: &str,
    action: &str,
    t: &WaveTarget,
) -> Result<CallToolResult, Problem> {
    let run_id = resolve(app, caller, wave_id).await?;
    wave_act(app, caller, &run_id, action, t).await.map(|d| answered(&d))
}

async fn get(app: &Arc<App>, caller: &Caller, wave_id: &str) -> Result<Value, Problem> {
    let run_id = resolve(app, caller, wave_id).await?;
    app.deciding()?
        .wave_view(&run_id)
        .await?
        .ok_or_else(|| Problem::not_found(format!("run {run_id} has run no wave")))
}

async fn waves(app: &Arc<App>, caller: &Caller, limit: usize) -> Result<Vec<Value>, Problem> {
    if limit == 0 || limit > RUNS_SCANNED_MAX {
        return Err(Problem::bad_request(format!(
            "limit must be 1 to {RUNS_SCANNED_MAX}, not {limit}"
        )));
    }
    let recent = caller_runs(app, caller, RUNS_SCANNED_MAX).await?;
    let mut views = app.deciding()?.wave_views(&recent).await?;
    views.truncate(limit);
    Ok(views)
}

async fn plan(app: &Arc<App>, caller: &Caller, a: PlanArgs) -> Result<CallToolResult, Problem> {
    let max_parallel = a
        .max_parallel
        .map(|n| baton_engine::wave::check_parallel(n, "max_parallel"))
        .transpose()
        .map_err(Problem::bad_request)?;
    if let Some(ms) = a.timeout_ms
        && !(1..=2_147_483_647).contains(&ms)
    {
        return Err(Problem::bad_request(format!("timeout_ms must be 1 to 2147483647, not {ms}")));
    }
    if let Some(worker) = &a.worker {
        let registry = app.registry_for(caller.tenant.as_deref()).await?;
        if registry.get(worker).is_none() {
            let known: Vec<&str> = registry.scenarios().map(|s| s.id.as_str()).collect();
            return Err(Problem::not_found(format!(
                "worker: no scenario `{worker}` (the caller's scenarios: {})",
                known.join(", ")
            )));
        }
    }
    let settings = wave_actions::Standalone {
        worker: a.worker,
        max_parallel,
        timeout_ms: a.timeout_ms,
        max_assignments: a.max_assignments,
        context: a.context.clone(),
    };
    let scenario = wave_actions::standalone_scenario(&settings, &app.scenarios_dir)
        .map_err(Problem::bad_request)?;
    let input = json!({ "tasks": a.tasks, "context": a.context });
    let body = StartRun { input: input.to_string(), ..StartRun::default() };
    let (_, started) = runs::start(app, caller, body, Some(scenario)).await?;
    // The server's workers plan it (or refuse the plan, which fails the run), then leave it
    // waiting for outside agents or for a wave_run, which may then drive it at once.
    let run_id = started.run_id;
    let deadline = Instant::now() + PLAN_WAIT;
    loop {
        if let Some(view) = app.deciding()?.wave_view(&run_id).await?
            && !app.store.is_held(&run_id).await?
        {
            return Ok(CallToolResult::structured(view));
        }
        let state = app.state(&run_id).await?;
        if state.status.is_final() {
            return Err(Problem::bad_request(format!(
                "the wave was not planned: {}",
                state
                    .aborted_reason
                    .unwrap_or_else(|| format!("its run {run_id} ended {}", state.status.as_str()))
            )));
        }
        if Instant::now() > deadline {
            return Err(Problem::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the wave's run {run_id} was started but not planned within {} s (the server's workers are busy); wave_get {run_id} shows it once it is",
                    PLAN_WAIT.as_secs()
                ),
            ));
        }
        let _ = app.store.wait_for_events(&run_id, state.last_seq, LOOK_EVERY).await;
    }
}

async fn dispatch(
    app: &Arc<App>,
    caller: &Caller,
    a: DispatchArgs,
) -> Result<CallToolResult, Problem> {
    if a.links.is_empty() {
        return Err(Problem::bad_request(
            "links is empty; give at least one assignment and worker run",
        ));
    }
    let run_id = resolve(app, caller, &a.wave_id).await?;
    let mut dispatched = Vec::with_capacity(a.links.len());
    for link in a.links {
        let t = WaveTarget {
            assignment_id: link.assignment_id,
            task_id: link.task_id,
            worker_run: Some(link.worker_run_id),
            ..WaveTarget::default()
        };
        match wave_act(app, caller, &run_id, "dispatch", &t).await {
            Ok(done) => dispatched.push(done),
            Err(p) if dispatched.is_empty() => return Err(p),
            Err(p) => {
                let ids: Vec<String> =
                    dispatched.iter().filter_map(|d| d.assignment_id.clone()).collect();
                return Err(Problem {
                    detail: format!("{} (dispatched before it: {})", p.detail, ids.join(", ")),
                    ..p
                });
            }
        }
    }
    Ok(answered(&Dispatched { dispatched }))
}

/// How far a wave is, as a monotonic count: each dispatch adds one, each settlement one more.
fn progress_of(view: &Value) -> (f64, f64, String) {
    let c = wave_actions::counts_of(view);
    let settled = c.completed + c.partial + c.blocked + c.failed + c.cancelled;
    let message = format!(
        "{settled} of {} settled ({c}); decision {}",
        c.assignments,
        view["decision"].as_str().unwrap_or("?")
    );
    (f64::from(2 * settled + c.in_flight), f64::from(2 * c.assignments), message)
}

async fn run(
    app: &Arc<App>,
    caller: &Caller,
    a: RunArgs,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResult, Problem> {
    use baton_app::Role;
    caller.require(Role::Operator)?;
    let drive_max_parallel = a
        .max_parallel
        .map(|n| baton_engine::wave::check_parallel(n, "max_parallel"))
        .transpose()
        .map_err(Problem::bad_request)?;
    let wait_s = a.wait_s.unwrap_or(RUN_WAIT_S_DEFAULT);
    if !wait_s.is_finite() || !(0.0..=RUN_WAIT_S_MAX).contains(&wait_s) {
        return Err(Problem::bad_request(format!(
            "wait_s must be 0 to {RUN_WAIT_S_MAX} seconds, not {wait_s}"
        )));
    }
    let run_id = resolve(app, caller, &a.wave_id).await?;
    let engine = app.deciding()?;
    let state = engine.state(&run_id).await?;
    let Some(w) = wave_actions::wave_under_way(&state) else {
        return Err(Problem::conflict(format!(
            "run {run_id} has no wave under way (wave_get shows how its last one ended)"
        )));
    };
    if w.plan.worker.is_none() && w.plan.command.is_none() {
        return Err(Problem::conflict(format!(
            "wave {run_id} names no worker scenario, so only outside agents can run it (wave_dispatch, wave_record); plan a wave with `worker` to run it here"
        )));
    }
    let settings = WaveSettings { active: true, drive_max_parallel, ..engine.wave_settings() };
    let drive = {
        let (app, run_id) = (Arc::clone(app), run_id.clone());
        tokio::spawn(async move { crate::workers::drive_waves(&app, &run_id, settings).await })
    };
    tokio::pin!(drive);
    let began = Instant::now();
    let deadline = began + Duration::from_secs_f64(wait_s);
    let mut progress = Progress::of(context);
    let mut after = 0;
    let mut stopped = None;
    let mut cancelled = false;
    loop {
        if let Some(view) = engine.wave_view(&run_id).await? {
            let (done, total, message) = progress_of(&view);
            progress.say(done, Some(total), message).await;
        }
        if stopped.is_some() || cancelled || Instant::now() >= deadline {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now()).min(LOOK_EVERY);
        tokio::select! {
            ended = &mut drive => {
                stopped = Some(match ended {
                    Ok(Ok(Outcome::Finished(_))) => "ended".to_owned(),
                    Ok(Ok(Outcome::Paused)) => "paused for a person".to_owned(),
                    Ok(Ok(Outcome::Interrupted(reason))) => format!("interrupted: {reason}"),
                    Ok(Ok(_)) => "waiting for outside agents".to_owned(),
                    Ok(Err(baton_engine::exec::Error::Store(baton_engine::store::Error::Busy(_)))) => {
                        return Err(Problem::conflict(format!(
                            "run {run_id} is being driven (by this server or another process), and that drive dispatches the wave under its own settings; wait for it (wave_get), or run the wave where it is driven"
                        )));
                    }
                    Ok(Err(e)) => return Err(e.into()),
                    Err(e) => return Err(Problem::internal(format!("the wave's drive stopped: {e}"))),
                });
            }
            _ = app.store.wait_for_events(&run_id, after, left) => {}
            () = context.ct.cancelled() => cancelled = true,
            () = app.stop.cancelled() => break,
        }
        after = app.store.run(&run_id).await?.map_or(after, |r| r.last_seq);
    }
    if cancelled && a.cancel_with_call {
        let t = WaveTarget {
            reason: Some("the MCP call wave_run was cancelled (cancel_with_call)".to_owned()),
            ..WaveTarget::default()
        };
        wave_act(app, caller, &run_id, "cancel", &t).await?;
    }
    let wave = engine
        .wave_view(&run_id)
        .await?
        .ok_or_else(|| Problem::not_found(format!("run {run_id} has run no wave")))?;
    let ended = Status::from_name(wave["run_status"].as_str().unwrap_or_default())
        .is_some_and(Status::is_final);
    Ok(answered(&WaveRan {
        wave,
        still_running: stopped.is_none() && !ended,
        stopped,
        waited_s: began.elapsed().as_secs_f64(),
        on_call_cancelled: if a.cancel_with_call {
            "cancels the wave and its workers (cancel_with_call: true)".to_owned()
        } else {
            "nothing: the wave goes on (cancel_with_call was not set)".to_owned()
        },
    }))
}
