//! The HTTP API: the application's state, the router with its checks (Host, Origin, auth),
//! and the handlers for scenarios and runs. Every handler that names a run answers 404 for a
//! run of another tenant, exactly as for a run that does not exist.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use baton_app::{Answers, Baton, Instance, Role};
use baton_engine::cancel::CancelToken;
use baton_engine::event::EventData;
use baton_engine::job::{JobRequest, Start};
use baton_engine::store::{EventStore, RunQuery, RunRecord};
use baton_engine::{Engine, RunState, Status};
use baton_scenario::registry::Override;
use baton_scenario::{Registry, RegistryHandle};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};

use crate::Settings;
use crate::auth::{Caller, Hosts, Tokens};
use crate::limits::{StartRate, Streams};
use crate::metrics::Metrics;
use crate::notify::Notifying;
use crate::problem::Problem;
use crate::workers::Workers;

/// The longest page of the run list.
pub(crate) const PAGE_MAX: usize = 500;

/// Tenants whose merged registries are kept at once.
const MERGED_TENANTS_MAX: usize = 1_024;

/// A tenant's merged registry: the base it was merged over, the overrides' versions, the
/// result.
type MergedRegistry = (Arc<Registry>, Vec<(String, chrono::DateTime<chrono::Utc>)>, Arc<Registry>);

/// Everything the handlers and workers share.
pub(crate) struct App {
    pub(crate) settings: Settings,
    pub(crate) store: Arc<dyn EventStore>,
    /// The same store, for what only the notifying decorator knows (the runs' recent tails).
    pub(crate) notifying: Arc<Notifying>,
    pub(crate) tokens: Tokens,
    pub(crate) registry: Arc<RegistryHandle>,
    pub(crate) scenarios_dir: PathBuf,
    pub(crate) baton: Arc<Baton>,
    pub(crate) workers: Workers,
    pub(crate) hosts: Hosts,
    pub(crate) starts: StartRate,
    pub(crate) streams: Streams,
    pub(crate) stop: CancelToken,
    pub(crate) metrics: Arc<Metrics>,
    /// Tenants' merged registries, with the directory's registry and the overrides'
    /// versions they were merged from.
    merged: std::sync::Mutex<HashMap<String, MergedRegistry>>,
    /// The text of model answers as it streams in, for the event streams open now (never
    /// stored: the whole answer is in the log).
    pub(crate) live: tokio::sync::broadcast::Sender<Arc<baton_engine::cancel::LiveText>>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl App {
    pub(crate) fn new(
        settings: Settings,
        parts: Instance,
        bound: std::net::SocketAddr,
        stop: CancelToken,
        tracer: Option<Arc<crate::traces::Tracer>>,
    ) -> Arc<Self> {
        let metrics = Arc::new(Metrics::new());
        let notifying = Arc::new(Notifying::new(parts.store, Arc::clone(&metrics), tracer));
        Arc::new(App {
            hosts: Hosts::new(bound, &settings.hosts),
            starts: StartRate::new(settings.starts_per_minute),
            streams: Streams::new(settings.streams_per_token),
            workers: Workers::new(settings.name, settings.workers),
            store: Arc::clone(&notifying) as Arc<dyn EventStore>,
            notifying,
            metrics,
            tokens: Tokens::new(parts.tokens),
            registry: Arc::new(parts.registry),
            scenarios_dir: parts.scenarios_dir,
            baton: parts.baton,
            settings,
            stop,
            live: tokio::sync::broadcast::channel(4096).0,
            merged: std::sync::Mutex::default(),
        })
    }

    /// Where this server's engines send the text of model answers as it streams in.
    pub(crate) fn live_sink(&self) -> baton_engine::cancel::LiveSink {
        let live = self.live.clone();
        baton_engine::cancel::LiveSink(Arc::new(move |t| {
            // Nobody listening is no error.
            let _ = live.send(Arc::new(t));
        }))
    }

    /// A run's events after `after` for a stream: what this process just appended when it
    /// holds them, else the store's (checked as they are loaded).
    pub(crate) async fn events_after(
        &self,
        run_id: &str,
        after: u64,
    ) -> Result<Vec<baton_engine::event::Event>, baton_engine::store::Error> {
        match self.notifying.recent(run_id, after) {
            Some(events) => Ok(events),
            None => self.store.load(run_id, after).await,
        }
    }

    /// A run's state, folded from its log (checked as it is loaded).
    pub(crate) async fn state(&self, run_id: &str) -> Result<RunState, baton_engine::exec::Error> {
        Ok(baton_engine::fold(&self.store.load(run_id, 0).await?))
    }

    /// The scenarios a tenant's runs see: the directory's, with its overrides merged in —
    /// merged once per version of the directory and of the tenant's overrides, not per
    /// request.
    pub(crate) async fn registry_for(
        &self,
        tenant: Option<&str>,
    ) -> Result<Arc<Registry>, Problem> {
        let base = self.registry.current();
        let Some(tenant) = tenant else { return Ok(base) };
        let stored = self.store.tenant_overrides(Some(tenant)).await?;
        if stored.is_empty() {
            return Ok(base);
        }
        let version: Vec<(String, chrono::DateTime<chrono::Utc>)> =
            stored.iter().map(|o| (o.scenario_id.clone(), o.updated_at)).collect();
        {
            let merged = self.merged.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some((b, v, registry)) = merged.get(tenant)
                && Arc::ptr_eq(b, &base)
                && *v == version
            {
                return Ok(Arc::clone(registry));
            }
        }
        let overrides: Vec<Override> = stored
            .into_iter()
            .map(|o| Override {
                name: format!("tenant {} override of {} (stored)", o.tenant, o.scenario_id),
                scenario_id: o.scenario_id,
                yaml: o.yaml,
            })
            .collect();
        match base.with_overrides(tenant, &overrides) {
            Ok(loaded) => {
                let registry = Arc::new(loaded.registry);
                let mut merged =
                    self.merged.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if merged.len() >= MERGED_TENANTS_MAX {
                    merged.clear();
                }
                merged.insert(tenant.to_owned(), (base, version, Arc::clone(&registry)));
                Ok(registry)
            }
            Err(e) => Err(Problem::conflict(format!(
                "tenant `{tenant}`'s overrides do not load over the current scenarios ({}); fix them with `baton tenant set {tenant} SCENARIO FILE` or remove one with `baton tenant rm`",
                e.diagnostics.render().trim()
            ))),
        }
    }

    /// Says `warning` on the server's log (stderr).
    #[allow(clippy::print_stderr)]
    pub(crate) fn warn(&self, warning: &str) {
        eprintln!("{}: warning: {warning}", self.settings.name);
    }

    /// An engine for decisions and cancels (no model is called).
    pub(crate) fn deciding(&self) -> Result<Engine, Problem> {
        self.baton
            .engine(Arc::clone(&self.store), Answers::Nothing, &self.registry.current())
            .map_err(Problem::internal)
    }

    /// A run the caller may see, or 404 as if it did not exist.
    pub(crate) async fn visible_run(
        &self,
        caller: &Caller,
        run_id: &str,
    ) -> Result<RunRecord, Problem> {
        match self.store.run(run_id).await? {
            Some(r) if caller.sees(r.tenant.as_deref()) => Ok(r),
            _ => Err(Problem::not_found(format!("no run {run_id}"))),
        }
    }
}

/// Looks at the scenarios directory for changes every `refresh_every`, keeping the last
/// registry that loaded when a change does not.
#[allow(clippy::print_stderr)]
pub(crate) async fn refresh_registry(app: Arc<App>) {
    loop {
        tokio::time::sleep(app.settings.refresh_every).await;
        let handle = Arc::clone(&app.registry);
        let refreshed = tokio::task::spawn_blocking(move || handle.refresh_if_changed()).await;
        if let Ok(Some(Err(e))) = refreshed {
            eprintln!(
                "{}: the scenarios changed and do not load; the last ones that did stay in use:\n{}",
                app.settings.name,
                e.diagnostics.render()
            );
        }
    }
}

pub(crate) fn router(app: Arc<App>) -> Router {
    let authed = Router::new()
        .route("/scenarios", get(list_scenarios))
        .route("/scenarios/validate", post(validate_scenario))
        .route("/scenarios/{id}", get(get_scenario))
        .route("/scenarios/{id}/graph", get(scenario_graph))
        .route("/runs", get(list_runs).post(start_run))
        .route("/runs/{id}", get(get_run))
        .route("/runs/{id}/events", get(crate::events::run_events))
        .route("/runs/{id}/approve", post(approve_run))
        .route("/runs/{id}/reject", post(reject_run))
        .route("/runs/{id}/answer", post(answer_run))
        .route("/runs/{id}/cancel", post(cancel_run))
        .route("/runs/{id}/fork-points", get(crate::api_more::fork_points))
        .route("/runs/{id}/fork", post(crate::api_more::fork_run))
        .route("/runs/{id}/replay", post(crate::api_more::replay_run))
        .route("/runs/{id}/wave", get(crate::api_more::get_wave))
        .route("/runs/{id}/wave/{action}", post(crate::api_more::act_on_wave))
        .route("/tenant/overrides", get(crate::api_more::list_overrides))
        .route(
            "/tenant/overrides/{scenario}",
            axum::routing::put(crate::api_more::put_override)
                .delete(crate::api_more::delete_override),
        )
        .route("/metrics", get(metrics))
        .nest_service("/mcp", crate::mcp::http_service(&app))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&app), authenticate));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/openapi.json", get(openapi))
        .route("/session", get(get_session).post(open_session).delete(close_session))
        .route("/", get(crate::ui::index))
        .route("/ui/{file}", get(crate::ui::asset))
        .merge(authed)
        .layer(DefaultBodyLimit::max(app.settings.body_bytes_max))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), check_host))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), count_answers))
        .with_state(app)
}

/// Counts every answer by method, route (its pattern, never a run id) and status.
async fn count_answers(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let method = request.method().as_str().to_owned();
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let response = next.run(request).await;
    app.metrics.answered(&method, &route, response.status().as_u16());
    response
}

/// The server's metrics in the Prometheus (OpenMetrics) text format: runs, levels, model
/// calls, tokens and cost, retries and failovers, verifiers, approval idle time, stops,
/// the queue, the store's commit latency and the HTTP answers. Server-wide, so it takes an
/// admin token.
#[utoipa::path(get, path = "/metrics", responses(
    (status = 200, description = "OpenMetrics text", content_type = "application/openmetrics-text", body = String),
    (status = 403, body = Problem)))]
pub(crate) async fn metrics(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, Problem> {
    caller.require(Role::Admin)?;
    let text = app.metrics.render(app.workers.queue_depth(), app.workers.active());
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

/// A request body, read (within the size limit) but parsed only once the handler has
/// checked the caller may act on what it names: another tenant's run is a 404 whatever the
/// body holds. Every refusal is a problem+json.
pub(crate) struct Body(axum::body::Bytes);

impl<S: Send + Sync> axum::extract::FromRequest<S> for Body {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        let limit = req.extensions().get::<BodyLimit>().map(|l| l.0);
        match axum::body::Bytes::from_request(req, state).await {
            Ok(bytes) => Ok(Body(bytes)),
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(Problem::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                match limit {
                    Some(n) => format!(
                        "the request body is larger than {n} bytes, the most this server takes (--body-max-bytes)"
                    ),
                    None => "the request body is larger than this server takes (--body-max-bytes)"
                        .to_owned(),
                },
            )),
            Err(e) => Err(Problem::new(e.status(), e.body_text())),
        }
    }
}

impl Body {
    /// The body as JSON of `T`; an empty body is `T::default()` when `optional`.
    pub(crate) fn parse<T: serde::de::DeserializeOwned + Default>(
        &self,
        optional: bool,
    ) -> Result<T, Problem> {
        if optional && self.0.iter().all(u8::is_ascii_whitespace) {
            return Ok(T::default());
        }
        serde_json::from_slice(&self.0).map_err(|e| {
            Problem::bad_request(format!(
                "the request body is not what this takes: {e} (line {}, column {}); /openapi.json describes it",
                e.line(),
                e.column()
            ))
        })
    }

    /// The body as text.
    pub(crate) fn text(&self) -> Result<String, Problem> {
        String::from_utf8(self.0.to_vec())
            .map_err(|_| Problem::bad_request("the request body is not UTF-8 text"))
    }
}

/// The body size limit, for the 413's message.
#[derive(Clone, Copy, Debug)]
struct BodyLimit(usize);

/// Refuses requests naming another host or coming from another origin's page.
async fn check_host(State(app): State<Arc<App>>, mut request: Request, next: Next) -> Response {
    request.extensions_mut().insert(BodyLimit(app.settings.body_bytes_max));
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
        app.tokens.caller(request.headers()).await
    };
    match caller {
        Ok(c) => {
            request.extensions_mut().insert(c);
            next.run(request).await
        }
        Err(p) => p.into_response(),
    }
}

/// Who the session is.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Session {
    /// False when the request carries no valid token or session cookie.
    pub signed_in: bool,
    pub tenant: Option<String>,
    pub role: Option<String>,
    pub name: Option<String>,
    /// False when the server runs without auth (no cookie is needed).
    pub auth: bool,
}

impl Session {
    fn of(caller: Caller, auth: bool) -> Self {
        Session {
            signed_in: true,
            tenant: caller.tenant,
            role: Some(caller.role.as_str().to_owned()),
            name: Some(caller.name),
            auth,
        }
    }
}

/// Who the request's token or session cookie is (never a 401: the UI asks this first).
#[utoipa::path(get, path = "/session", responses((status = 200, body = Session)))]
pub(crate) async fn get_session(
    State(app): State<Arc<App>>,
    headers: axum::http::HeaderMap,
) -> Json<Session> {
    if app.settings.no_auth {
        return Json(Session::of(Caller::local(), false));
    }
    match app.tokens.caller(&headers).await {
        Ok(c) => Json(Session::of(c, true)),
        Err(_) => {
            Json(Session { signed_in: false, tenant: None, role: None, name: None, auth: true })
        }
    }
}

/// Trades the bearer token of the request for an HttpOnly, SameSite=Strict session cookie:
/// how the web UI authenticates (a browser's EventSource cannot send headers, and a token
/// never goes in a URL).
#[utoipa::path(post, path = "/session", responses(
    (status = 200, body = Session), (status = 401, body = Problem)))]
pub(crate) async fn open_session(
    State(app): State<Arc<App>>,
    headers: axum::http::HeaderMap,
) -> Result<Response, Problem> {
    if app.settings.no_auth {
        return Ok(Json(Session::of(Caller::local(), false)).into_response());
    }
    let bearer = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().strip_prefix("Bearer "))
        .map(|t| t.trim().to_owned());
    // Without a bearer token, the session cookie's holder is told who they are.
    let body = Session::of(app.tokens.caller(&headers).await?, true);
    let Some(bearer) = bearer else { return Ok(Json(body).into_response()) };
    let cookie = format!(
        "{}={bearer}; HttpOnly; SameSite=Strict; Path=/; Max-Age=43200",
        crate::auth::SESSION_COOKIE
    );
    Ok(([(axum::http::header::SET_COOKIE, cookie)], Json(body)).into_response())
}

/// Ends the browser's session (clears its cookie).
#[utoipa::path(delete, path = "/session", responses((status = 204)))]
pub(crate) async fn close_session() -> Response {
    let cookie =
        format!("{}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0", crate::auth::SESSION_COOKIE);
    (StatusCode::NO_CONTENT, [(axum::http::header::SET_COOKIE, cookie)]).into_response()
}

/// Whether the server answers.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "The server answers", body = String)))]
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", responses((status = 200, description = "The OpenAPI 3.1 document of this API")))]
pub(crate) async fn openapi() -> Json<Value> {
    Json(crate::openapi::document())
}

// ---- scenarios ----

/// A scenario as the list shows it.
#[derive(Debug, Serialize, ToSchema, schemars::JsonSchema)]
pub(crate) struct ScenarioSummary {
    pub id: String,
    pub version: u32,
    pub display_name: String,
    pub description: String,
    /// The sha256 of the scenario and every file it reads.
    pub checksum: String,
    pub intent_routes: Vec<String>,
    pub levels: usize,
}

/// One level of a scenario.
#[derive(Debug, Serialize, ToSchema, schemars::JsonSchema)]
pub(crate) struct LevelSummary {
    pub id: String,
    pub kind: String,
}

/// A scenario with its levels and graph.
#[derive(Debug, Serialize, ToSchema, schemars::JsonSchema)]
pub(crate) struct ScenarioDetail {
    #[serde(flatten)]
    pub summary: ScenarioSummary,
    pub levels_in_order: Vec<LevelSummary>,
    /// The level a run starts at.
    pub entry: String,
    /// Every edge, in the order they are tried: `to` is a level, `__end__` or `__fail__`.
    pub edges: Vec<EdgeSummary>,
    pub graph: Graph,
}

/// One edge of a scenario.
#[derive(Debug, Serialize, ToSchema, schemars::JsonSchema)]
pub(crate) struct EdgeSummary {
    pub from: String,
    pub to: String,
    /// Its gate, as written (none: always taken).
    pub when: Option<String>,
}

/// A scenario's graph, as Mermaid and as Graphviz dot.
#[derive(Debug, Serialize, ToSchema, schemars::JsonSchema)]
pub(crate) struct Graph {
    pub mermaid: String,
    pub dot: String,
}

impl Graph {
    fn of(s: &baton_scenario::Scenario) -> Self {
        Graph { mermaid: baton_scenario::graph::mermaid(s), dot: baton_scenario::graph::dot(s) }
    }
}

pub(crate) fn summary(s: &baton_scenario::Scenario) -> ScenarioSummary {
    ScenarioSummary {
        id: s.id.clone(),
        version: s.version,
        display_name: s.display_name.clone(),
        description: s.description.clone(),
        checksum: s.checksum.clone(),
        intent_routes: s.intent_routes.clone(),
        levels: s.levels.len(),
    }
}

/// The scenarios the caller's runs may start, with the tenant's overrides merged in.
#[utoipa::path(get, path = "/scenarios", responses(
    (status = 200, body = [ScenarioSummary]),
    (status = 401, body = Problem)))]
pub(crate) async fn list_scenarios(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<ScenarioSummary>>, Problem> {
    let registry = app.registry_for(caller.tenant.as_deref()).await?;
    Ok(Json(registry.scenarios().map(|s| summary(s)).collect()))
}

fn find(registry: &Registry, id: &str) -> Result<Arc<baton_scenario::Scenario>, Problem> {
    registry.get(id).cloned().ok_or_else(|| Problem::not_found(format!("no scenario `{id}`")))
}

/// One scenario: its levels and graph.
#[utoipa::path(get, path = "/scenarios/{id}", params(("id" = String, Path, description = "The scenario id")), responses(
    (status = 200, body = ScenarioDetail),
    (status = 404, body = Problem)))]
pub(crate) async fn get_scenario(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<ScenarioDetail>, Problem> {
    let registry = app.registry_for(caller.tenant.as_deref()).await?;
    Ok(Json(detail(&*find(&registry, &id)?)))
}

/// A scenario's summary, levels, edges and graph.
pub(crate) fn detail(s: &baton_scenario::Scenario) -> ScenarioDetail {
    ScenarioDetail {
        summary: summary(s),
        levels_in_order: s
            .levels
            .iter()
            .map(|l| LevelSummary { id: l.id.clone(), kind: l.kind_name().to_owned() })
            .collect(),
        entry: s.levels.get(s.entry).map(|l| l.id.clone()).unwrap_or_default(),
        edges: s
            .edges
            .iter()
            .map(|e| EdgeSummary {
                from: s.levels.get(e.from).map(|l| l.id.clone()).unwrap_or_default(),
                to: match e.to {
                    baton_scenario::model::Target::Level(i) => {
                        s.levels.get(i).map(|l| l.id.clone()).unwrap_or_default()
                    }
                    baton_scenario::model::Target::End => "__end__".to_owned(),
                    baton_scenario::model::Target::Fail => "__fail__".to_owned(),
                },
                when: e.when.as_ref().map(ToString::to_string),
            })
            .collect(),
        graph: Graph::of(s),
    }
}

/// A scenario's graph.
#[utoipa::path(get, path = "/scenarios/{id}/graph", params(("id" = String, Path, description = "The scenario id")), responses(
    (status = 200, body = Graph),
    (status = 404, body = Problem)))]
pub(crate) async fn scenario_graph(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Graph>, Problem> {
    let registry = app.registry_for(caller.tenant.as_deref()).await?;
    let s = find(&registry, &id)?;
    Ok(Json(Graph::of(&s)))
}

/// What `validate` found in a posted scenario file.
#[derive(Debug, Serialize, ToSchema, schemars::JsonSchema)]
pub(crate) struct Validation {
    /// True when the file has no error (it may have warnings).
    pub ok: bool,
    pub scenario_id: Option<String>,
    /// Every problem, with file, line, column, the line's text and a hint.
    #[schema(value_type = Vec<Object>)]
    pub diagnostics: Vec<Value>,
}

/// Checks a scenario file (the request body, YAML) as if it were in the scenarios
/// directory: its templates and rubrics are read from there.
#[utoipa::path(post, path = "/scenarios/validate", request_body(content = String, content_type = "application/yaml"), responses(
    (status = 200, body = Validation),
    (status = 413, body = Problem)))]
pub(crate) async fn validate_scenario(
    State(app): State<Arc<App>>,
    Extension(_caller): Extension<Caller>,
    body: Body,
) -> Result<Json<Validation>, Problem> {
    Ok(Json(validate(&app, body.text()?).await?))
}

/// Checks a scenario file's text as if it were in the scenarios directory.
pub(crate) async fn validate(app: &App, body: String) -> Result<Validation, Problem> {
    let dir = app.scenarios_dir.clone();
    let checked =
        tokio::task::spawn_blocking(move || Registry::check_text("posted.yaml", &dir, &body))
            .await
            .map_err(|e| Problem::internal(format!("the check stopped: {e}")))?;
    let (ok, scenario_id, diagnostics) = match checked {
        Ok((s, warnings)) => (true, Some(s.id.clone()), warnings),
        Err(e) => (false, None, e.diagnostics),
    };
    let diagnostics = diagnostics.iter().filter_map(|d| serde_json::to_value(d).ok()).collect();
    Ok(Validation { ok, scenario_id, diagnostics })
}

// ---- runs ----

/// A job to start: what it asks for (a pinned scenario, an intent route, a kind, or the
/// default), its input and metadata.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct StartRun {
    /// Run exactly this scenario.
    pub scenario: Option<String>,
    /// An intent route, looked up case-insensitively.
    pub intent: Option<String>,
    /// The job's kind (`task`, `question`, …), for the classifier.
    pub kind: Option<String>,
    #[serde(default)]
    pub input: String,
    #[serde(default)]
    #[schema(value_type = Object)]
    pub metadata: Map<String, Value>,
    /// A second start with this key gets the first one's run.
    pub idempotency_key: Option<String>,
    /// The job's cost cap, all its runs together.
    pub max_cost_usd: Option<f64>,
}

/// A level a run waits on, and for what.
#[derive(Debug, Serialize, ToSchema, schemars::JsonSchema)]
pub(crate) struct Waiting {
    pub level_id: String,
    /// `approval`, `answer` or `child run`.
    #[serde(rename = "for")]
    pub wants: String,
    /// The approval request or question id.
    pub request_id: Option<String>,
    /// What the person is asked.
    #[schema(value_type = Object)]
    pub question: Value,
    /// The JSON Schema an answer or an approver's data must meet.
    #[schema(value_type = Object)]
    pub schema: Value,
    pub deadline: Option<chrono::DateTime<chrono::Utc>>,
}

/// A run with its totals and what it waits on.
#[derive(Debug, Serialize, ToSchema, schemars::JsonSchema)]
pub(crate) struct RunView {
    pub run_id: String,
    pub scenario_id: String,
    /// `running`, `paused`, `waiting`, `interrupted`, `completed`, `aborted`, `cancelled`
    /// or `failed`.
    pub status: String,
    pub tenant: Option<String>,
    pub parent_run_id: Option<String>,
    pub root_run_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
    /// The seq of its last event.
    pub last_seq: u64,
    pub cost_usd: f64,
    pub tokens: u64,
    pub duration_ms: u64,
    /// The level running now, if any.
    pub level: Option<String>,
    pub verdict: Option<String>,
    pub waiting_on: Vec<Waiting>,
    /// The runs it started, in the order it started them.
    pub children: Vec<String>,
    /// Its final output, once it ended.
    pub output: Option<String>,
    pub reason: Option<String>,
}

async fn view(app: &App, record: RunRecord) -> Result<RunView, Problem> {
    let state = app.state(&record.run_id).await?;
    let mut status = record.status.clone();
    if status == Status::Running.as_str() && !app.store.is_held(&record.run_id).await? {
        status = Status::Interrupted.as_str().to_owned();
    }
    let mut waiting_on: Vec<Waiting> = state
        .open_approvals()
        .map(|p| Waiting {
            level_id: p.level_id.clone(),
            wants: "approval".to_owned(),
            request_id: Some(p.request.request_id.clone()),
            question: Value::String(p.request.question.clone()),
            schema: p.request.schema.clone(),
            deadline: p.request.deadline,
        })
        .collect();
    if let Some(ask) = &state.pending_ask {
        waiting_on.push(Waiting {
            level_id: state.in_flight.clone().unwrap_or_default(),
            wants: "answer".to_owned(),
            request_id: Some(ask.call_id.clone()),
            question: ask.question.clone(),
            // A question may say what shape its answer takes.
            schema: ask.question.get("schema").cloned().unwrap_or(Value::Null),
            deadline: None,
        });
    }
    for child in state.open_children() {
        waiting_on.push(Waiting {
            level_id: child.started.child_run_id.clone(),
            wants: "child run".to_owned(),
            request_id: None,
            question: Value::Null,
            schema: Value::Null,
            deadline: None,
        });
    }
    Ok(RunView {
        run_id: record.run_id,
        scenario_id: record.scenario_id,
        status,
        tenant: record.tenant,
        parent_run_id: record.parent_run_id,
        root_run_id: record.root_run_id,
        idempotency_key: record.idempotency_key,
        created_at: record.created_at,
        updated_at: record.updated_at,
        last_seq: record.last_seq,
        cost_usd: state.totals.cost_usd,
        tokens: state.totals.tokens,
        duration_ms: state.totals.duration_ms,
        level: state.in_flight.clone(),
        verdict: state.verdict.clone(),
        waiting_on,
        children: state.children.iter().map(|c| c.started.child_run_id.clone()).collect(),
        output: state.final_output.clone(),
        reason: state
            .aborted_reason
            .clone()
            .or_else(|| state.interrupted.as_ref().map(|i| i.reason.clone())),
    })
}

/// The run a start made (or found under its idempotency key).
#[derive(Debug, Serialize, ToSchema, schemars::JsonSchema)]
pub(crate) struct Started {
    pub run_id: String,
    pub scenario_id: String,
    /// How the scenario was chosen: `pin`, `intent`, `classifier`, `default`, `fallback`.
    pub selected_by: Option<String>,
    /// Said when the job fell back to another scenario than it asked for.
    pub warning: Option<String>,
    /// True when the idempotency key named a run started before: no new run was started.
    pub existing: bool,
}

/// Starts a job: the run is in the store when this answers, and the server's workers drive
/// it. The scenario is chosen like `baton run` chooses it; an unknown scenario falls back
/// with a warning, as for every program that starts jobs.
#[utoipa::path(post, path = "/runs", request_body = StartRun, responses(
    (status = 201, body = Started, description = "The run was created and is being driven"),
    (status = 200, body = Started, description = "The idempotency key named an earlier run"),
    (status = 400, body = Problem), (status = 409, body = Problem), (status = 413, body = Problem),
    (status = 429, body = Problem)))]
pub(crate) async fn start_run(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    body: Body,
) -> Result<(StatusCode, Json<Started>), Problem> {
    let body: StartRun = body.parse(false)?;
    let (created, started) = start(&app, &caller, body, None).await?;
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, Json(started)))
}

/// Starts a job for `caller` (or finds the run its idempotency key names: `false`). The
/// run is in the store when this returns, and the server's workers drive it. `given`
/// runs that scenario instead of choosing one (a standalone wave).
pub(crate) async fn start(
    app: &Arc<App>,
    caller: &Caller,
    body: StartRun,
    given: Option<Arc<baton_scenario::Scenario>>,
) -> Result<(bool, Started), Problem> {
    caller.require(Role::Operator)?;
    let request = baton_app::start::JobStart {
        job: JobRequest { pin: body.scenario, intent: body.intent, kind: body.kind },
        input: body.input,
        metadata: body.metadata,
        max_cost_usd: body.max_cost_usd,
        idempotency_key: body.idempotency_key,
        tenant: caller.tenant.clone(),
    };
    baton_app::start::check(&request)?;
    if let Some(key) = &request.idempotency_key
        && let Some(existing) = app.store.run_by_key(key).await?
    {
        return existing_run(caller, existing, key);
    }
    app.starts.take(caller.tenant.as_deref().unwrap_or("local"))?;
    let registry = app.registry_for(caller.tenant.as_deref()).await?;
    let planned = baton_app::start::plan(
        app.baton.place(),
        &registry,
        app.baton.selection(),
        request,
        given,
    )?;
    let (scenario, selected) = (planned.scenario, planned.selected);
    for warning in &planned.warnings {
        app.warn(warning);
    }
    app.baton.check_model(&scenario)?;
    let model_source = app.baton.model_source();
    // A scenario that calls no model (a wave of outside agents) starts without one.
    let answers = if baton_engine::exec::calls_no_model(&scenario) {
        Answers::Nothing
    } else {
        Answers::Recorded(model_source.as_deref())
    };
    let engine =
        app.baton.engine(Arc::clone(&app.store), answers, &registry).map_err(Problem::internal)?;
    let run_id = Engine::new_run_id();
    let started = Started {
        run_id: run_id.clone(),
        scenario_id: scenario.id.clone(),
        selected_by: selected.as_ref().map(|s| s.how.clone()),
        warning: selected.as_ref().and_then(|s| s.warning.clone()),
        existing: false,
    };
    let start = Start { model_source, ..planned.start };
    match engine.create_job(&run_id, &scenario, start).await {
        Ok(()) => {}
        // Another start with this key got in between the look above and here.
        Err(baton_engine::exec::Error::Store(baton_engine::store::Error::KeyTaken {
            run_id: first,
            key,
        })) => {
            let Some(existing) = app.store.run(&first).await? else {
                return Err(Problem::conflict(format!("idempotency key {key:?} is taken")));
            };
            return existing_run(caller, existing, &key);
        }
        Err(e) => return Err(e.into()),
    }
    app.workers.drive(app, &run_id);
    Ok((true, started))
}

fn existing_run(
    caller: &Caller,
    existing: RunRecord,
    key: &str,
) -> Result<(bool, Started), Problem> {
    if !caller.sees(existing.tenant.as_deref()) {
        return Err(Problem::conflict(format!("idempotency key {key:?} is taken; choose another")));
    }
    Ok((
        false,
        Started {
            run_id: existing.run_id,
            scenario_id: existing.scenario_id,
            selected_by: None,
            warning: None,
            existing: true,
        },
    ))
}

/// Filters and the cursor of the run list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListRuns {
    /// Only runs with this status.
    pub status: Option<String>,
    /// Only runs of this scenario.
    pub scenario: Option<String>,
    /// Only the first runs of jobs.
    #[serde(default)]
    pub roots: bool,
    /// The `next` of the previous page.
    pub after: Option<String>,
    /// At most this many (default 50, at most 500).
    pub limit: Option<usize>,
}

/// A page of runs, newest first.
#[derive(Debug, Serialize, ToSchema, schemars::JsonSchema)]
pub(crate) struct RunPage {
    pub runs: Vec<RunView>,
    /// The cursor of the next page (`after=`), when there may be one.
    pub next: Option<String>,
}

/// The caller's runs, newest first, a page at a time.
#[utoipa::path(get, path = "/runs", params(ListRuns), responses(
    (status = 200, body = RunPage), (status = 400, body = Problem)))]
pub(crate) async fn list_runs(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    q: Result<Query<ListRuns>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<RunPage>, Problem> {
    let Query(q) = q.map_err(|e| Problem::bad_request(e.body_text()))?;
    let limit = q.limit.unwrap_or(50);
    if limit == 0 || limit > PAGE_MAX {
        return Err(Problem::bad_request(format!("limit must be 1 to {PAGE_MAX}, not {limit}")));
    }
    if let Some(s) = &q.status
        && Status::from_name(s).is_none()
    {
        return Err(Problem::bad_request(format!(
            "status {s:?} is none of running, paused, waiting, interrupted, completed, aborted, cancelled, failed"
        )));
    }
    // A run is listed interrupted when it recorded so, or when it is running and nobody
    // holds it: the page is read by whatever status is stored, and filtered as shown (a page
    // may then hold fewer runs than its limit; `next` goes on after it).
    let shown_only = [Status::Interrupted.as_str(), Status::Running.as_str()];
    let stored = q.status.clone().filter(|s| !shown_only.contains(&s.as_str()));
    let query = RunQuery {
        tenant: Some(caller.tenant.clone()),
        status: stored,
        scenario_id: q.scenario.clone(),
        roots_only: q.roots,
        after_run: q.after.clone(),
        limit,
    };
    let page = app.store.runs_page(&query).await?;
    let next = (page.len() == limit).then(|| page.last().map(|r| r.run_id.clone())).flatten();
    let mut runs = Vec::with_capacity(page.len());
    for record in page {
        let v = view(&app, record).await?;
        if q.status.as_deref().is_none_or(|s| s == v.status) {
            runs.push(v);
        }
    }
    Ok(Json(RunPage { runs, next }))
}

/// One run, with its totals, what it waits on and its output.
#[utoipa::path(get, path = "/runs/{id}", params(("id" = String, Path, description = "The run id")), responses(
    (status = 200, body = RunView), (status = 404, body = Problem)))]
pub(crate) async fn get_run(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<RunView>, Problem> {
    Ok(Json(run_view(&app, &caller, &id).await?))
}

/// A run the caller may see, as the API shows it.
pub(crate) async fn run_view(app: &App, caller: &Caller, id: &str) -> Result<RunView, Problem> {
    let record = app.visible_run(caller, id).await?;
    view(app, record).await
}

/// An approval or a rejection.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Decide {
    /// The request decided; may be left out when exactly one is open.
    pub request_id: Option<String>,
    pub comment: Option<String>,
    /// The approver's data for the level's `output_schema`.
    #[schema(value_type = Option<Object>)]
    pub data: Option<Value>,
}

/// What was recorded.
#[derive(Debug, Serialize, ToSchema, schemars::JsonSchema)]
pub(crate) struct Decided {
    pub run_id: String,
    pub request_id: String,
    pub approved: bool,
    /// The principal it was recorded by (the token's name).
    pub by: String,
}

async fn decide_http(
    app: Arc<App>,
    caller: Caller,
    run_id: String,
    body: Body,
    approved: bool,
) -> Result<Json<Decided>, Problem> {
    // Who may, and whose run, before the body is read: another tenant's run is a 404
    // whatever the body holds.
    caller.require(Role::Operator)?;
    app.visible_run(&caller, &run_id).await?;
    let body: Decide = body.parse(true)?;
    Ok(Json(decide(&app, &caller, &run_id, body, approved).await?))
}

/// Approves or rejects a paused run's request, exactly once, recorded by the caller, and
/// drives its job on.
pub(crate) async fn decide(
    app: &Arc<App>,
    caller: &Caller,
    run_id: &str,
    body: Decide,
    approved: bool,
) -> Result<Decided, Problem> {
    caller.require(Role::Operator)?;
    app.visible_run(caller, run_id).await?;
    let engine = app.deciding()?;
    let decided = engine
        .decide(
            run_id,
            baton_engine::Decision {
                request_id: body.request_id,
                approved,
                comment: body.comment,
                by: Some(caller.name.clone()),
                data: body.data,
            },
        )
        .await?;
    app.workers.drive_job(app, run_id).await;
    Ok(Decided {
        run_id: run_id.to_owned(),
        request_id: decided.request_id,
        approved,
        by: caller.name.clone(),
    })
}

/// Approves a paused run's request (exactly once: a second decision is refused) and
/// continues the run.
#[utoipa::path(post, path = "/runs/{id}/approve", params(("id" = String, Path, description = "The run id")), request_body = Option<Decide>, responses(
    (status = 200, body = Decided), (status = 404, body = Problem), (status = 409, body = Problem),
    (status = 422, body = Problem)))]
pub(crate) async fn approve_run(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Json<Decided>, Problem> {
    decide_http(app, caller, id, body, true).await
}

/// Rejects a paused run's request and continues the run.
#[utoipa::path(post, path = "/runs/{id}/reject", params(("id" = String, Path, description = "The run id")), request_body = Option<Decide>, responses(
    (status = 200, body = Decided), (status = 404, body = Problem), (status = 409, body = Problem)))]
pub(crate) async fn reject_run(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Json<Decided>, Problem> {
    decide_http(app, caller, id, body, false).await
}

/// An answer to a run's question.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AnswerBody {
    /// The answer, as JSON (checked against the question's schema).
    #[schema(value_type = Object)]
    pub answer: Option<Value>,
}

/// Answers a run's question (exactly once) and continues the run.
#[utoipa::path(post, path = "/runs/{id}/answer", params(("id" = String, Path, description = "The run id")), request_body = AnswerBody, responses(
    (status = 200, body = RunView), (status = 404, body = Problem), (status = 409, body = Problem)))]
pub(crate) async fn answer_run(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Json<RunView>, Problem> {
    caller.require(Role::Operator)?;
    app.visible_run(&caller, &id).await?;
    let body: AnswerBody = body.parse(false)?;
    let Some(answer) = body.answer else {
        return Err(Problem::bad_request("the body needs `answer`: the answer as JSON"));
    };
    Ok(Json(answer_run_with(&app, &caller, &id, answer).await?))
}

/// Answers a run's question (exactly once) and drives its job on.
pub(crate) async fn answer_run_with(
    app: &Arc<App>,
    caller: &Caller,
    id: &str,
    answer: Value,
) -> Result<RunView, Problem> {
    caller.require(Role::Operator)?;
    app.visible_run(caller, id).await?;
    app.deciding()?.answer(id, answer).await?;
    app.workers.drive_job(app, id).await;
    run_view(app, caller, id).await
}

/// A cancel.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelBody {
    pub reason: Option<String>,
}

/// Cancels a run and every run below it: recorded at once; a run this server or another
/// process drives stops at its next check, one nobody drives is ended here.
#[utoipa::path(post, path = "/runs/{id}/cancel", params(("id" = String, Path, description = "The run id")), request_body = Option<CancelBody>, responses(
    (status = 200, body = RunView), (status = 404, body = Problem), (status = 409, body = Problem)))]
pub(crate) async fn cancel_run(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Json<RunView>, Problem> {
    caller.require(Role::Operator)?;
    app.visible_run(&caller, &id).await?;
    let reason = body.parse::<CancelBody>(true)?.reason;
    Ok(Json(cancel(&app, &caller, &id, reason).await?))
}

/// Cancels a run and every run below it, recorded by the caller.
pub(crate) async fn cancel(
    app: &Arc<App>,
    caller: &Caller,
    id: &str,
    reason: Option<String>,
) -> Result<RunView, Problem> {
    caller.require(Role::Operator)?;
    let record = app.visible_run(caller, id).await?;
    if reason.as_deref().is_some_and(|r| r.trim().is_empty()) {
        return Err(Problem::bad_request("reason is empty; give one or leave it out"));
    }
    let engine = app.deciding()?;
    baton_app::runs::cancel(&engine, &record, Some(caller.name.clone()), reason).await?;
    if let Some(parent) = &record.parent_run_id {
        app.workers.drive_job(app, parent).await;
    }
    run_view(app, caller, id).await
}

/// The events of a log as JSON values, with the run they belong to.
pub(crate) fn event_json(run_id: &str, e: &baton_engine::event::Event) -> Value {
    let mut v = serde_json::to_value(e).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut v {
        map.insert("run_id".to_owned(), Value::String(run_id.to_owned()));
    }
    v
}

/// Whether an event ends its run's log.
pub(crate) fn ends(e: &baton_engine::event::Event) -> bool {
    matches!(e.data, EventData::ScenarioFinished(_))
}
