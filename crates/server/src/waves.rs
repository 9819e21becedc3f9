//! The API's wave handlers: a run's wave (`Engine::wave_view`) and the actions on it
//! (`Engine::wave_act`: dispatch, record, decide, complete, cancel), as `baton wave …` takes
//! them, recorded by the caller; `wave_act` is the operation MCP's wave tools share.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::{Extension, Json};
use baton_app::Role;
use baton_engine::event::WorkerOutcome;
use baton_engine::wave_actions::{Target, WaveAction, WaveReply};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::app::App;
use crate::auth::Caller;
use crate::body::Body;
use crate::problem::Problem;

/// What a wave action did.
#[derive(Debug, Serialize, ToSchema, schemars::JsonSchema)]
pub(crate) struct WaveDone {
    pub run_id: String,
    pub level_id: String,
    pub assignment_id: Option<String>,
    /// The controller's decision after the action (`dispatch`, `wait`, `complete` …).
    pub decision: String,
    pub counts: Counts,
    pub max_parallel: u32,
}

/// A wave's assignments, counted by stage and outcome.
#[derive(Debug, Serialize, ToSchema, schemars::JsonSchema)]
pub(crate) struct Counts {
    pub assignments: u32,
    pub planned: u32,
    pub in_flight: u32,
    pub completed: u32,
    pub partial: u32,
    pub blocked: u32,
    pub failed: u32,
    pub cancelled: u32,
}

impl From<baton_engine::event::WaveCounts> for Counts {
    fn from(c: baton_engine::event::WaveCounts) -> Self {
        Counts {
            assignments: c.assignments,
            planned: c.planned,
            in_flight: c.in_flight,
            completed: c.completed,
            partial: c.partial,
            blocked: c.blocked,
            failed: c.failed,
            cancelled: c.cancelled,
        }
    }
}

impl From<WaveReply> for WaveDone {
    fn from(r: WaveReply) -> Self {
        WaveDone {
            decision: r.decision.as_str().to_owned(),
            counts: r.counts.into(),
            run_id: r.run_id,
            level_id: r.level_id,
            assignment_id: r.assignment_id,
            max_parallel: r.max_parallel,
        }
    }
}

/// Which assignment, by its id or its task's — named as MCP's wave tools name them
/// (`assignment` and `task`, the names of earlier versions, are still taken).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WaveTarget {
    /// The assignment (`assign-001`); or name it by `task_id`.
    #[serde(alias = "assignment")]
    pub assignment_id: Option<String>,
    #[serde(alias = "task")]
    pub task_id: Option<String>,
    /// For `dispatch`: the outside agent's run the assignment goes to.
    pub worker_run: Option<String>,
    /// For `record`: `completed`, `partial`, `blocked`, `failed` or `cancelled`.
    pub outcome: Option<String>,
    pub summary: Option<String>,
    #[serde(default)]
    pub blockers: Vec<String>,
    /// For `cancel`.
    pub reason: Option<String>,
}

fn target(t: &WaveTarget) -> Result<Target, Problem> {
    match (&t.assignment_id, &t.task_id) {
        (Some(a), None) => Ok(Target::Assignment(a.clone())),
        (None, Some(task)) => Ok(Target::Task(task.clone())),
        _ => Err(Problem::bad_request(
            "name the assignment with exactly one of `assignment_id` and `task_id`",
        )),
    }
}

/// The wave a run ran last: its assignments, their outcomes and the decision.
#[utoipa::path(get, path = "/runs/{id}/wave", params(("id" = String, Path, description = "The run id")), responses(
    (status = 200, description = "The wave, as `baton wave get --json` prints it"), (status = 404, body = Problem)))]
pub(crate) async fn get_wave(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, Problem> {
    app.visible_run(&caller, &id).await?;
    match app.deciding()?.wave_view(&id).await? {
        Some(v) => Ok(Json(v)),
        None => Err(Problem::not_found(format!("run {id} has run no wave"))),
    }
}

/// An action on the wave a run is at: `dispatch` an assignment to an outside agent's run,
/// `record` its outcome (exactly once), `decide`, `complete` the wave, or `cancel` it.
#[utoipa::path(post, path = "/runs/{id}/wave/{action}", params(("id" = String, Path, description = "The run id"), ("action" = String, Path, description = "dispatch, record, decide, complete or cancel")), request_body = Option<WaveTarget>, responses(
    (status = 200, body = WaveDone), (status = 400, body = Problem), (status = 404, body = Problem), (status = 409, body = Problem)))]
pub(crate) async fn act_on_wave(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path((id, action)): Path<(String, String)>,
    body: Body,
) -> Result<Json<WaveDone>, Problem> {
    caller.require(Role::Operator)?;
    app.visible_run(&caller, &id).await?;
    let t: WaveTarget = body.parse(true)?;
    Ok(Json(wave_act(&app, &caller, &id, &action, &t).await?))
}

/// Takes the wave action named `action` on the wave run `id` is at, recorded by the caller;
/// a completed wave's run is driven on to its end.
pub(crate) async fn wave_act(
    app: &Arc<App>,
    caller: &Caller,
    id: &str,
    action: &str,
    t: &WaveTarget,
) -> Result<WaveDone, Problem> {
    caller.require(Role::Operator)?;
    app.visible_run(caller, id).await?;
    let by = Some(caller.name.clone());
    let action = match action {
        "dispatch" => WaveAction::Dispatch {
            target: target(t)?,
            worker_run: t.worker_run.clone().ok_or_else(|| {
                Problem::bad_request("dispatch needs `worker_run`: the outside agent's run")
            })?,
            by,
        },
        "record" => {
            let name = t.outcome.as_deref().unwrap_or_default();
            let outcome = WorkerOutcome::parse(name).ok_or_else(|| {
                Problem::bad_request(format!(
                    "`outcome` must be one of completed, partial, blocked, failed, cancelled, not {name:?}"
                ))
            })?;
            WaveAction::Record {
                target: target(t)?,
                outcome,
                summary: t.summary.clone().unwrap_or_default(),
                blockers: t.blockers.clone(),
                by,
            }
        }
        "decide" => WaveAction::Decide,
        "complete" => WaveAction::Complete { by },
        "cancel" => WaveAction::Cancel { by, reason: t.reason.clone() },
        other => {
            return Err(Problem::not_found(format!(
                "no wave action `{other}`: dispatch, record, decide, complete or cancel"
            )));
        }
    };
    let ends = matches!(action, WaveAction::Complete { .. });
    let reply = app.deciding()?.wave_act(id, action).await?;
    if ends {
        // The run goes on to the wave's end in the server.
        app.workers.drive_job(app, id).await;
    }
    Ok(reply.into())
}
