//! The API's tenant overrides (`/tenant/overrides`), as `baton tenant …` keeps them: the
//! caller's tenant's list, one stored (checked first by merging it with the tenant's others
//! over the current scenarios), one removed.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use baton_app::Role;
use baton_engine::store::TenantOverride;
use baton_scenario::registry::Override;
use serde::Serialize;
use utoipa::ToSchema;

use crate::app::App;
use crate::auth::Caller;
use crate::body::Body;
use crate::problem::Problem;

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
