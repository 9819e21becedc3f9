//! The API's fork and replay, as `baton fork` and `baton replay` do them: the events a run
//! can be forked after, a fork (`Engine::fork`, then driven by the workers) and a replay of a
//! recorded job from its own log (`Baton::replay`).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use baton_app::Role;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::app::App;
use crate::auth::Caller;
use crate::body::Body;
use crate::problem::Problem;

/// Where a fork starts and what it changes.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkBody {
    /// The event the fork's log ends with, copied (a level boundary or a pause:
    /// `GET /runs/{id}/fork-points`).
    #[serde(deserialize_with = "integral")]
    #[schema(minimum = 0)]
    pub at: u64,
    /// A new input.
    pub input: Option<String>,
    /// Scratchpad notes to set (null removes one).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub scratchpad: serde_json::Map<String, Value>,
}

/// A seq as JSON writes it: a whole number from 0 through 2^63 - 1, however written (`12`
/// or `12.0`, as JSON Schema's `integer` counts them).
fn integral<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    let whole = n.as_u64().or_else(|| {
        let f = n.as_f64()?;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        (f.fract() == 0.0 && (0.0..9.223_372_036_854_776e18).contains(&f)).then_some(f as u64)
    });
    whole.filter(|w| i64::try_from(*w).is_ok()).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "{n} is not a seq: a whole number from 0 through 2^63 - 1"
        ))
    })
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
    (status = 200, description = "As `baton replay RUN --json` prints it"), (status = 404, body = Problem), (status = 409, body = Problem),
    (status = 429, body = Problem, description = "The token or the server holds as many streams as it may")))]
pub(crate) async fn replay_run(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Json<Value>, Problem> {
    caller.require(Role::Operator)?;
    app.visible_run(&caller, &id).await?;
    let body: ReplayBody = body.parse(true)?;
    // A replay answers when it is done: while it runs it holds a stream place, as a live
    // stream does.
    let _place = app.streams.open(&caller.token_id, caller.session.as_deref())?;
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
