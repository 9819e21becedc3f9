//! The scenario handlers: the list (with the tenant's overrides merged in), one scenario
//! with its levels, edges and graph, its graph alone, and `validate` of a posted file
//! (`Registry::check_text`) — with the views they answer, which MCP's scenario tools answer
//! too.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::{Extension, Json};
use baton_scenario::Registry;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::app::App;
use crate::auth::Caller;
use crate::body::Body;
use crate::problem::Problem;

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
#[utoipa::path(post, path = "/scenarios/validate", request_body(content = serde_json::Value, content_type = "application/yaml", description = "A scenario file: any YAML document (not empty), whose problems the answer lists"), responses(
    (status = 200, body = Validation),
    (status = 400, body = Problem, description = "The body is empty or not UTF-8"),
    (status = 413, body = Problem)))]
pub(crate) async fn validate_scenario(
    State(app): State<Arc<App>>,
    Extension(_caller): Extension<Caller>,
    body: Body,
) -> Result<Json<Validation>, Problem> {
    let text = body.text()?;
    if text.trim().is_empty() {
        return Err(Problem::bad_request("the body is empty: post a scenario file's YAML"));
    }
    Ok(Json(validate(&app, text).await?))
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
