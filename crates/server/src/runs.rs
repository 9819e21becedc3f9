//! The run handlers and the operations MCP's run tools share with them: start a job
//! (`baton_app::start`, then `Engine::create_job`, then the workers), list a page, get one
//! with its totals and what it waits on, approve or reject, answer, cancel — with the
//! request and view types. A run of another tenant is a 404 exactly like a missing run,
//! checked before a body is parsed.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use baton_app::{Answers, Role};
use baton_engine::job::{JobRequest, Start};
use baton_engine::store::{Error as StoreError, RunQuery, RunRecord};
use baton_engine::{Engine, RunState, Status};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};

use crate::app::App;
use crate::auth::Caller;
use crate::body::Body;
use crate::problem::Problem;

/// The longest page of the run list.
pub(crate) const PAGE_MAX: usize = 500;

/// A job to start: what it asks for (a pinned scenario, an intent route, a kind, or the
/// default), its input and metadata.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"scenario": "quick_qa", "input": "What is the capital of France?"}))]
pub(crate) struct StartRun {
    /// Run exactly this scenario (a name, never a path).
    #[schema(min_length = 1, pattern = r"^(?![\s\S]*\.\.)[^/\\]*$")]
    pub scenario: Option<String>,
    /// An intent route, looked up case-insensitively.
    #[schema(min_length = 1)]
    pub intent: Option<String>,
    /// The job's kind (`task`, `question`, …), for the classifier.
    #[schema(min_length = 1)]
    pub kind: Option<String>,
    #[serde(default)]
    pub input: String,
    #[serde(default)]
    #[schema(value_type = Object)]
    pub metadata: Map<String, Value>,
    /// A second start with this key gets the first one's run.
    #[schema(min_length = 1, max_length = 256)]
    pub idempotency_key: Option<String>,
    /// The job's cost cap, all its runs together: a positive amount of US dollars.
    #[schema(exclusive_minimum = 0.0)]
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
    /// `queued` (made for a worker, no level started yet, nobody drives it), `running`,
    /// `paused`, `waiting`, `interrupted`, `completed`, `aborted`, `cancelled` or `failed`;
    /// `damaged` when its log does not pass its checks (`reason` says where).
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
    let state = match app.state(&record.run_id).await {
        Ok(state) => state,
        // A damaged run is shown as damaged, saying where: one such run never hides the
        // others of a list.
        Err(baton_engine::exec::Error::Store(e @ StoreError::Damaged { .. })) => {
            let mut view = run_view_of(record, &RunState::default(), Vec::new());
            view.status = baton_app::listing::DAMAGED.to_owned();
            view.reason = Some(e.to_string());
            return Ok(view);
        }
        Err(e) => return Err(e.into()),
    };
    let mut status = record.status.clone();
    if status == Status::Running.as_str() && !app.store.is_held(&record.run_id).await? {
        status = baton_app::listing::undriven(&state).to_owned();
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
    let mut view = run_view_of(record, &state, waiting_on);
    view.status = status;
    Ok(view)
}

/// A run's view from its record and its state, its status as stored.
fn run_view_of(record: RunRecord, state: &RunState, waiting_on: Vec<Waiting>) -> RunView {
    RunView {
        run_id: record.run_id,
        scenario_id: record.scenario_id,
        status: record.status,
        tenant: record.tenant,
        parent_run_id: record.parent_run_id,
        root_run_id: record.root_run_id,
        idempotency_key: record.idempotency.map(|c| c.key),
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
        output: state.session.final_output.clone(),
        reason: state
            .aborted_reason
            .clone()
            .or_else(|| state.interrupted.as_ref().map(|i| i.reason.clone())),
    }
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
    (status = 400, body = Problem),
    (status = 404, body = Problem, description = "`scenario` names no scenario (the closest are named)"),
    (status = 409, body = Problem), (status = 413, body = Problem),
    (status = 422, body = Problem, description = "The idempotency key was used with another request"),
    (status = 429, body = Problem, description = "Past the tenant's start rate or its idempotency keys"),
    (status = 503, body = Problem, description = "The server drains: no new runs")))]
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
    if app.drain.is_cancelled() {
        return Err(Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this server is draining and starts no new runs; start it on another (its /readyz answers 503)",
        ));
    }
    let request = baton_app::start::JobStart {
        job: JobRequest { pin: body.scenario, intent: body.intent, kind: body.kind },
        input: body.input,
        metadata: body.metadata,
        max_cost_usd: body.max_cost_usd,
        idempotency_key: body.idempotency_key,
        tenant: caller.tenant.clone(),
    };
    baton_app::start::check(&request)?;
    let claim = baton_app::start::key_claim(&request, app.baton.jobs().key_hold);
    let tenant = caller.tenant.as_deref();
    let keys_max = app.baton.jobs().keys_max;
    if let Some(run_id) =
        baton_app::start::key_standing(app.store.as_ref(), tenant, claim.as_ref(), keys_max).await?
    {
        return existing_run(app, caller, &run_id).await;
    }
    let tenant_key = caller.tenant.as_deref().unwrap_or("local");
    app.starts.take(tenant_key).map_err(|wait| {
        Problem::too_many(
            format!(
                "tenant {tenant_key} may start {} runs a minute and has started them; try again in {wait} s",
                app.starts.per_minute()
            ),
            wait,
        )
    })?;
    let registry = app.registry_for(caller.tenant.as_deref()).await?;
    let planned =
        baton_app::start::plan(app.baton.place(), &registry, app.baton.jobs(), request, given)?;
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
            key, ..
        })) => {
            let holder =
                baton_app::start::key_holder(app.store.as_ref(), tenant, claim.as_ref()).await?;
            let Some(run_id) = holder else {
                return Err(Problem::conflict(format!(
                    "idempotency key {key:?} was taken and let go while this job started; send the request again"
                )));
            };
            return existing_run(app, caller, &run_id).await;
        }
        Err(e) => return Err(e.into()),
    }
    app.workers.drive(app, &run_id);
    Ok((true, started))
}

/// The run an idempotency key named for this caller's tenant: answered as existing.
async fn existing_run(
    app: &Arc<App>,
    caller: &Caller,
    run_id: &str,
) -> Result<(bool, Started), Problem> {
    let existing = app.store.run(run_id).await?;
    let Some(existing) = existing.filter(|r| caller.sees(r.tenant.as_deref())) else {
        return Err(Problem::not_found(format!("run {run_id} is gone")));
    };
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
    #[param(
        pattern = "^(queued|running|paused|waiting|interrupted|completed|aborted|cancelled|failed)$"
    )]
    pub status: Option<String>,
    /// Only runs of this scenario.
    pub scenario: Option<String>,
    /// Only the first runs of jobs.
    #[serde(default)]
    pub roots: bool,
    /// The `next` of the previous page.
    pub after: Option<String>,
    /// At most this many (default 50, at most 500).
    #[param(minimum = 1, maximum = 500)]
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
        && s != baton_app::listing::QUEUED
    {
        return Err(Problem::bad_request(format!(
            "status {s:?} is none of queued, running, paused, waiting, interrupted, completed, aborted, cancelled, failed"
        )));
    }
    // A run is listed interrupted when it recorded so, or when it is running and nobody
    // holds it (queued, when no level of it started yet): the page is read by whatever
    // status is stored, and filtered as shown (a page may then hold fewer runs than its
    // limit; `next` goes on after it).
    let shown_only =
        [baton_app::listing::QUEUED, Status::Interrupted.as_str(), Status::Running.as_str()];
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

/// A steering message.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SteerBody {
    /// The message: text with something other than white space, no NUL, at most 8 KiB
    /// (2 048 characters always fit).
    #[schema(min_length = 1, max_length = 2048, pattern = "^[^\\u0000]*\\S[^\\u0000]*$")]
    pub message: String,
}

/// A steering message as recorded.
#[derive(Debug, Serialize, ToSchema, schemars::JsonSchema)]
pub(crate) struct Steered {
    pub run_id: String,
    /// The message's id in the run (`steer-N`).
    pub id: String,
    /// Who sent it: the caller's token holder.
    pub by: String,
}

/// Sends a message to a running run: recorded once, and given to the next model call of a
/// level that declares `steerable: true`. 409 when the run has ended, no steerable level
/// is running or ahead, or 16 messages wait already.
#[utoipa::path(post, path = "/runs/{id}/steer", params(("id" = String, Path, description = "The run id")), request_body = SteerBody, responses(
    (status = 200, body = Steered), (status = 400, body = Problem), (status = 404, body = Problem),
    (status = 409, body = Problem)))]
pub(crate) async fn steer_run(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Json<Steered>, Problem> {
    caller.require(Role::Operator)?;
    app.visible_run(&caller, &id).await?;
    let body: SteerBody = body.parse(false)?;
    Ok(Json(steer(&app, &caller, &id, &body.message).await?))
}

/// Records a steering message from the caller (the operator role in the run's tenant).
pub(crate) async fn steer(
    app: &Arc<App>,
    caller: &Caller,
    id: &str,
    message: &str,
) -> Result<Steered, Problem> {
    caller.require(Role::Operator)?;
    app.visible_run(caller, id).await?;
    let engine = app.deciding()?;
    let sent =
        baton_app::runs::steer(app.baton.place(), &engine, id, message, &caller.name).await?;
    Ok(Steered { run_id: id.to_owned(), id: sent.id, by: sent.by })
}

/// A cancel.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelBody {
    /// Why (not empty).
    #[schema(min_length = 1)]
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
