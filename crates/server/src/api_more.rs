//! The API's fork and replay, wave actions and tenants' overrides: what `baton fork`,
//! `baton replay`, `baton wave …` and `baton tenant …` do (`Engine::fork`, the embedder's
//! replay, `Engine::wave_act`, the store's overrides checked by merging them over the
//! current scenarios), scoped to the caller's tenant like every run operation.

use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use baton_app::Role;
use baton_engine::event::WorkerOutcome;
use baton_engine::store::TenantOverride;
use baton_engine::wave_actions::{Target, WaveAction, WaveReply};
use baton_scenario::registry::Override;
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

/// Where a fork starts and what it changes.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkBody {
    /// The event the fork's log ends with, copied (a level boundary or a pause:
    /// `GET /runs/{id}/fork-points`).
    pub at: u64,
    /// A new input.
    pub input: Option<String>,
    /// Scratchpad notes to set (null removes one).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub scratchpad: serde_json::Map<String, Value>,
}

/// The new run.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Forked {
    pub run_id: String,
    pub from_run_id: String,
    pub at: u64,
}

/// The events a run can be forked after.
#[utoipa::path(get, path = "/runs/{id}/fork-points", params(("id" = String, Path, description = "The run id")), responses(
    (status = 200, description = "`fork_points`: the seqs a fork may start after"), (status = 404, body = Problem)))]
pub(crate) async fn fork_points(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, Problem> {
    app.visible_run(&caller, &id).await?;
    let events = app.store.load(&id, 0).await?;
    Ok(Json(
        serde_json::json!({"run_id": id, "fork_points": baton_engine::fork::fork_points(&events)}),
    ))
}

/// Forks a run: a new run whose log is the original's up to `at`, then the edits, with
/// the workspace the original had there; the server drives it, its answers from the
/// server's model.
#[utoipa::path(post, path = "/runs/{id}/fork", params(("id" = String, Path, description = "The run id")), request_body = ForkBody, responses(
    (status = 201, body = Forked), (status = 404, body = Problem), (status = 409, body = Problem)))]
pub(crate) async fn fork_run(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Body,
) -> Result<(StatusCode, Json<Forked>), Problem> {
    caller.require(Role::Operator)?;
    app.visible_run(&caller, &id).await?;
    let body: ForkBody = body.parse(false)?;
    let original = app.state(&id).await?;
    let registry = app.registry_for(caller.tenant.as_deref()).await?;
    let model_source = app.baton.model_source();
    let engine = app
        .baton
        .engine(
            Arc::clone(&app.store),
            baton_app::Answers::Recorded(model_source.as_deref()),
            &registry,
        )
        .map_err(Problem::internal)?;
    let scenario = engine.scenario_of(&original, &id).await?;
    if let Some(warning) = app.baton.check_start(&registry, &scenario)? {
        app.warn(&warning);
    }
    let new_run = baton_engine::Engine::new_run_id();
    let edits = baton_engine::fork::ForkEdits {
        input: body.input,
        scratchpad: body.scratchpad,
        model_source,
    };
    engine.fork(&id, body.at, &new_run, &scenario, edits).await?;
    app.workers.drive(&app, &new_run);
    Ok((StatusCode::CREATED, Json(Forked { run_id: new_run, from_run_id: id, at: body.at })))
}

/// How a replay treats verifiers.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplayBody {
    /// Take the verifiers' recorded outcomes instead of running them again.
    #[serde(default)]
    pub trust_validation: bool,
}

/// Replays a recorded job from its own log (no model is called) and answers once it is
/// done: the new job's id, and whether its log matches the recording event by event.
#[utoipa::path(post, path = "/runs/{id}/replay", params(("id" = String, Path, description = "The run id")), request_body = Option<ReplayBody>, responses(
    (status = 200, description = "As `baton replay RUN --json` prints it"), (status = 404, body = Problem), (status = 409, body = Problem)))]
pub(crate) async fn replay_run(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Json<Value>, Problem> {
    caller.require(Role::Operator)?;
    app.visible_run(&caller, &id).await?;
    let body: ReplayBody = body.parse(true)?;
    let report = app.baton.replay(&id, body.trust_validation).await.map_err(|e| {
        match e.downcast::<baton_app::Error>() {
            Ok(own) => Problem::from(own),
            Err(other) => Problem::conflict(format!("{other:#}")),
        }
    })?;
    for warning in &report.warnings {
        app.warn(warning);
    }
    Ok(Json(report.line))
}
