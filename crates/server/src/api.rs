//! The HTTP API's router: every route with its handler (scenarios, runs, their events, fork
//! and replay, waves, tenants' overrides, sessions, the UI, `/mcp`), and its layers — the
//! count of answers by route, `check_host` (Host and Origin) and `authenticate` — with the
//! server's own small handlers (`/healthz`, `/readyz`, `/openapi.json`, `/metrics`). The handlers of
//! each resource are in their own modules; every one that names a run answers 404 for a run
//! of another tenant, exactly as for a run that does not exist.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use baton_app::Role;
use serde_json::Value;

use crate::app::App;
use crate::auth::Caller;
use crate::body::BodyLimit;
use crate::peers::Client;
use crate::problem::Problem;
use crate::{
    events, feed, fork_and_replay, mcp, overrides, runs, scenarios, session, ui, waves, webhooks,
};

pub(crate) fn router(app: Arc<App>) -> Router {
    let (mcp_service, mcp_sessions) = mcp::http_service(&app);
    tokio::spawn(Arc::clone(&mcp_sessions).sweep());
    let mcp = Router::new()
        .nest_service("/mcp", mcp_service)
        .route_layer(middleware::from_fn_with_state(mcp_sessions, mcp::sessions::gate));
    let authed = Router::new()
        .route("/scenarios", get(scenarios::list_scenarios))
        .route("/scenarios/validate", post(scenarios::validate_scenario))
        .route("/scenarios/{id}", get(scenarios::get_scenario))
        .route("/scenarios/{id}/graph", get(scenarios::scenario_graph))
        .route("/runs", get(runs::list_runs).post(runs::start_run))
        .route("/runs/{id}", get(runs::get_run))
        .route("/runs/{id}/events", get(events::run_events))
        .route("/events", get(feed::feed_events))
        .route("/runs/{id}/approve", post(runs::approve_run))
        .route("/runs/{id}/reject", post(runs::reject_run))
        .route("/runs/{id}/answer", post(runs::answer_run))
        .route("/runs/{id}/cancel", post(runs::cancel_run))
        .route("/runs/{id}/steer", post(runs::steer_run))
        .route("/webhooks", get(webhooks::list_webhooks).post(webhooks::add_webhook))
        .route("/webhooks/{id}", axum::routing::delete(webhooks::remove_webhook))
        .route("/webhooks/{id}/rotate", post(webhooks::rotate_webhook))
        .route("/webhooks/{id}/deliveries", get(webhooks::webhook_deliveries))
        .route("/runs/{id}/fork-points", get(fork_and_replay::fork_points))
        .route("/runs/{id}/fork", post(fork_and_replay::fork_run))
        .route("/runs/{id}/replay", post(fork_and_replay::replay_run))
        .route("/runs/{id}/wave", get(waves::get_wave))
        .route("/runs/{id}/wave/{action}", post(waves::act_on_wave))
        .route("/tenant/overrides", get(overrides::list_overrides))
        .route(
            "/tenant/overrides/{scenario}",
            axum::routing::put(overrides::put_override).delete(overrides::delete_override),
        )
        .route("/metrics", get(metrics))
        .merge(mcp)
        .route_layer(middleware::from_fn_with_state(Arc::clone(&app), authenticate));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/openapi.json", get(openapi))
        .route(
            "/session",
            get(session::get_session).post(session::open_session).delete(session::close_session),
        )
        .route("/", get(ui::index))
        .route("/ui/{file}", get(ui::asset))
        .merge(authed)
        .layer(DefaultBodyLimit::max(app.settings.body_bytes_max))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), check_host))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), count_answers))
        .with_state(app)
}

/// A worker's own endpoints (`baton worker --listen`): `/healthz`, `/readyz` (503 while it
/// drains) and `/metrics`, under the server's access rule (a metrics token).
pub(crate) fn worker_router(app: Arc<App>) -> Router {
    let authed = Router::new()
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&app), authenticate));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .merge(authed)
        .layer(DefaultBodyLimit::max(app.settings.body_bytes_max))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), check_host))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), count_answers))
        .with_state(app)
}

/// Marks an answer to a request that did not authenticate.
#[derive(Clone, Copy, Debug)]
struct Unauthenticated;

/// Counts every answer by method (one of HTTP's nine, else `other`: a stranger's made-up
/// methods add no series), route (its pattern, never a run id) and status. An answer to a
/// request that did not authenticate is counted by its status alone (method `any`, route
/// `unauthenticated`): what a stranger sends makes no series.
async fn count_answers(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let method = match *request.method() {
        axum::http::Method::GET => "GET",
        axum::http::Method::HEAD => "HEAD",
        axum::http::Method::POST => "POST",
        axum::http::Method::PUT => "PUT",
        axum::http::Method::DELETE => "DELETE",
        axum::http::Method::CONNECT => "CONNECT",
        axum::http::Method::OPTIONS => "OPTIONS",
        axum::http::Method::TRACE => "TRACE",
        axum::http::Method::PATCH => "PATCH",
        _ => "other",
    };
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let response = next.run(request).await;
    if response.extensions().get::<Unauthenticated>().is_some() {
        app.metrics.answered("any", "unauthenticated", response.status().as_u16());
    } else {
        app.metrics.answered(method, &route, response.status().as_u16());
    }
    response
}

/// How long a scrape waits for the database's queue figures.
const QUEUE_LOADS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The server's metrics — runs, levels, model calls, tokens and cost, retries and
/// failovers, verifiers, approval idle time, stops, the queue, the store's commit latency,
/// the HTTP answers and connections — as OpenMetrics text when `Accept` asks for it, else in
/// Prometheus' classic text format. They are the whole server's, every tenant's figures
/// together, so they take a metrics token (`baton token create --role metrics`), which
/// belongs to no tenant; a tenant's token, even an admin's, gets 403.
#[utoipa::path(get, path = "/metrics", responses(
    (status = 200, description = "OpenMetrics text, or the classic text format", content(
        (String = "application/openmetrics-text"), (String = "text/plain"))),
    (status = 403, body = Problem)))]
pub(crate) async fn metrics(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    headers: axum::http::HeaderMap,
) -> Result<Response, Problem> {
    if caller.role != Role::Metrics && caller != Caller::local() {
        return Err(Problem::forbidden(format!(
            "/metrics shows every tenant's figures, so it takes a metrics token, which belongs to no tenant (`baton token create --role metrics`); token {} is tenant {}'s",
            caller.token_id,
            caller.tenant.as_deref().unwrap_or("none")
        )));
    }
    let accept =
        headers.get(axum::http::header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    // The queues' figures are the database's, for the whole fleet: read at each scrape,
    // within a bound (past it, the last ones read stand).
    let loads =
        tokio::time::timeout(QUEUE_LOADS_TIMEOUT, app.queues.queue_loads(chrono::Utc::now()))
            .await
            .ok()
            .and_then(Result::ok);
    let (text, content_type) = app.metrics.render_for(
        accept,
        loads.as_deref(),
        app.workers.queue_depth(),
        app.workers.active(),
    );
    Ok(([(axum::http::header::CONTENT_TYPE, content_type)], text).into_response())
}

/// Refuses requests naming another host or coming from another origin's page, and a
/// body its `Content-Length` says is too large (413, before a byte of it is read).
async fn check_host(State(app): State<Arc<App>>, mut request: Request, next: Next) -> Response {
    let most = app.settings.body_bytes_max;
    request.extensions_mut().insert(BodyLimit(most));
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > most as u64) {
        return crate::body::too_large(most).into_response();
    }
    match app.hosts.check(request.method(), request.headers()) {
        Ok(()) => next.run(request).await,
        Err(p) => p.into_response(),
    }
}

/// Finds the caller (a token, or `local` without auth) and hands it to the handler.
async fn authenticate(State(app): State<Arc<App>>, mut request: Request, next: Next) -> Response {
    let caller = if app.settings.no_auth {
        Ok(Caller::local())
    } else {
        let client = request.extensions().get::<Client>().copied();
        app.caller(request.headers(), client).await
    };
    match caller {
        Ok(c) if c.role == Role::Metrics && request.uri().path() != "/metrics" => {
            Problem::forbidden(format!(
                "token {} is a metrics token: it reads /metrics and nothing of any tenant",
                c.token_id
            ))
            .into_response()
        }
        Ok(c) => {
            request.extensions_mut().insert(c);
            next.run(request).await
        }
        Err(p) => {
            let mut refused = p.into_response();
            refused.extensions_mut().insert(Unauthenticated);
            refused
        }
    }
}

/// Whether the server answers.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "The server answers", body = String)))]
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// Whether the server takes new runs: 503 while it drains or stops (a load balancer sends
/// new work elsewhere; `/healthz` stays 200 until it exits).
#[utoipa::path(get, path = "/readyz", responses(
    (status = 200, description = "The server takes new runs", body = String),
    (status = 503, description = "The server drains or stops: no new runs", body = String)))]
pub(crate) async fn readyz(State(app): State<Arc<App>>) -> (axum::http::StatusCode, &'static str) {
    if app.drain.is_cancelled() || app.stop.is_cancelled() {
        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "draining")
    } else {
        (axum::http::StatusCode::OK, "ready")
    }
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", responses((status = 200, description = "The OpenAPI 3.1 document of this API")))]
pub(crate) async fn openapi() -> Json<Value> {
    Json(crate::openapi::document())
}
