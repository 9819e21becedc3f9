//! The API's wave actions and tenants' overrides: the same typed actions the CLI's `baton
//! wave …` and `baton tenant …` take (`Engine::wave_act`, the store's overrides checked by
//! merging them over the current scenarios), scoped to the caller's tenant like every run
//! operation.

use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use baton_engine::event::WorkerOutcome;
use baton_engine::store::TenantOverride;
use baton_engine::wave_actions::{Target, WaveAction, WaveReply};
use baton_scenario::registry::Override;
use baton_store::Role;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::api::{App, Body};
use crate::auth::Caller;
use crate::problem::Problem;

/// What a wave action did.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WaveDone {
    pub run_id: String,
    pub level_id: String,
    pub assignment_id: Option<String>,
    /// The controller's decision after the action (`dispatch`, `wait`, `complete` …).
    pub decision: String,
    #[schema(value_type = Object)]
    pub counts: Value,
    pub max_parallel: u32,
}

impl From<WaveReply> for WaveDone {
    fn from(r: WaveReply) -> Self {
        WaveDone {
            decision: r.decision.as_str().to_owned(),
            counts: serde_json::to_value(r.counts).unwrap_or(Value::Null),
            run_id: r.run_id,
            level_id: r.level_id,
            assignment_id: r.assignment_id,
            max_parallel: r.max_parallel,
        }
    }
}

/// Which assignment, by its id or its task's.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WaveTarget {
    pub assignment: Option<String>,
    pub task: Option<String>,
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
    match (&t.assignment, &t.task) {
        (Some(a), None) => Ok(Target::Assignment(a.clone())),
        (None, Some(task)) => Ok(Target::Task(task.clone())),
        _ => Err(Problem::bad_request(
            "name the assignment with exactly one of `assignment` and `task`",
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
    let by = Some(caller.name.clone());
    let action = match action.as_str() {
        "dispatch" => WaveAction::Dispatch {
            target: target(&t)?,
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
                target: target(&t)?,
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
    let reply = app.deciding()?.wave_act(&id, action).await?;
    if ends {
        // The run goes on to the wave's end in the server.
        app.workers.drive(&app, &id);
    }
    Ok(Json(reply.into()))
}

/// One of the tenant's overrides.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OverrideView {
    pub scenario_id: String,
    /// The partial YAML merged over the scenario.
    pub yaml: String,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

fn tenant_of(caller: &Caller) -> Result<&str, Problem> {
    caller.tenant.as_deref().ok_or_else(|| {
        Problem::bad_request("runs of no tenant have no overrides; use a tenant's token")
    })
}

/// The caller's tenant's overrides.
#[utoipa::path(get, path = "/tenant/overrides", responses((status = 200, body = [OverrideView]), (status = 400, body = Problem)))]
pub(crate) async fn list_overrides(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<OverrideView>>, Problem> {
    let tenant = tenant_of(&caller)?;
    let list = app.store.tenant_overrides(Some(tenant)).await?;
    Ok(Json(
        list.into_iter()
            .map(|o| OverrideView {
                scenario_id: o.scenario_id,
                yaml: o.yaml,
                updated_at: o.updated_at,
            })
            .collect(),
    ))
}

/// Stores the tenant's override of a scenario (the body: partial YAML), checked first by
/// merging it with the tenant's others over the current scenarios; refused with every
/// diagnostic when it does not load.
#[utoipa::path(put, path = "/tenant/overrides/{scenario}", params(("scenario" = String, Path, description = "The scenario id")), request_body(content = String, content_type = "application/yaml"), responses(
    (status = 200, body = OverrideView), (status = 403, body = Problem), (status = 422, body = Problem)))]
pub(crate) async fn put_override(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(scenario): Path<String>,
    body: Body,
) -> Result<Json<OverrideView>, Problem> {
    caller.require(Role::Admin)?;
    let tenant = tenant_of(&caller)?.to_owned();
    let yaml = body.text()?;
    let base = app.registry.current();
    if base.get(&scenario).is_none() {
        return Err(Problem::not_found(format!("no scenario `{scenario}` to override")));
    }
    let mut all: Vec<Override> = app
        .store
        .tenant_overrides(Some(&tenant))
        .await?
        .into_iter()
        .filter(|o| o.scenario_id != scenario)
        .map(|o| Override {
            name: format!("tenant {} override of {} (stored)", o.tenant, o.scenario_id),
            scenario_id: o.scenario_id,
            yaml: o.yaml,
        })
        .collect();
    all.push(Override {
        scenario_id: scenario.clone(),
        name: format!("tenant {tenant} override of {scenario} (posted)"),
        yaml: yaml.clone(),
    });
    if let Err(e) = base.with_overrides(&tenant, &all) {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "the override does not load over the current scenarios:\n{}",
                e.diagnostics.render()
            ),
        ));
    }
    let stored =
        TenantOverride { tenant, scenario_id: scenario, yaml, updated_at: chrono::Utc::now() };
    app.store.put_tenant_override(&stored).await?;
    Ok(Json(OverrideView {
        scenario_id: stored.scenario_id,
        yaml: stored.yaml,
        updated_at: stored.updated_at,
    }))
}

/// Removes the tenant's override of a scenario.
#[utoipa::path(delete, path = "/tenant/overrides/{scenario}", params(("scenario" = String, Path, description = "The scenario id")), responses(
    (status = 204), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub(crate) async fn delete_override(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(scenario): Path<String>,
) -> Result<StatusCode, Problem> {
    caller.require(Role::Admin)?;
    let tenant = tenant_of(&caller)?;
    if app.store.remove_tenant_override(tenant, &scenario).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(Problem::not_found(format!("tenant {tenant} has no override of `{scenario}`")))
    }
}
