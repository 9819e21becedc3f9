//! The API's webhooks (`/webhooks`), the application layer's use cases for the caller's
//! tenant, by its admins: add one (its secret in the answer, once), list, remove, rotate
//! (the new secret, once), and the deliveries of one with every attempt.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use baton_app::Role;
use baton_app::webhooks;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::app::App;
use crate::auth::Caller;
use crate::body::Body;
use crate::problem::Problem;

/// A webhook to add.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewWebhook {
    /// The receiver: an http or https URL the egress policy allows.
    #[schema(max_length = 2048, pattern = "^https?://")]
    pub url: String,
    /// The event types it is sent (all when left out or empty).
    #[serde(default)]
    #[schema(value_type = Vec<EventType>)]
    pub events: Vec<String>,
}

/// An event type a webhook may be sent.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[allow(dead_code)]
pub(crate) enum EventType {
    #[serde(rename = "approval.requested")]
    ApprovalRequested,
    #[serde(rename = "question.asked")]
    QuestionAsked,
    #[serde(rename = "run.completed")]
    RunCompleted,
    #[serde(rename = "run.failed")]
    RunFailed,
    #[serde(rename = "run.cancelled")]
    RunCancelled,
    #[serde(rename = "run.aborted")]
    RunAborted,
    #[serde(rename = "wave.decided")]
    WaveDecided,
}

/// A webhook (never its secret but right after it is made or rotated).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WebhookView {
    pub id: String,
    pub url: String,
    pub types: Vec<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// The signing secret: only in the answer that made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Until when the secret a rotation replaced signs too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_until: Option<chrono::DateTime<chrono::Utc>>,
}

impl WebhookView {
    fn of(w: &baton_app::webhooks::WithSecret) -> Self {
        WebhookView { secret: Some(w.secret.clone()), ..Self::listed(&w.webhook) }
    }

    fn listed(w: &baton_app::WebhookRecord) -> Self {
        WebhookView {
            id: w.id.clone(),
            url: w.url.clone(),
            types: w.types.clone(),
            created_at: w.created_at,
            secret: None,
            previous_until: w.previous_until,
        }
    }
}

/// The caller's tenant's webhooks.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WebhookList {
    pub webhooks: Vec<WebhookView>,
}

/// One delivery, with every attempt.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DeliveryView {
    /// The message id (`webhook-id`), the same on every attempt.
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub run_id: String,
    pub seq: u64,
    /// `pending`, `delivered` or `failed`.
    pub state: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub next_at: chrono::DateTime<chrono::Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[schema(value_type = Vec<Object>)]
    pub attempts: Vec<serde_json::Value>,
}

/// A webhook's newest deliveries.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DeliveryList {
    pub deliveries: Vec<DeliveryView>,
}

/// Adds a webhook for the caller's tenant; the answer holds its signing secret, once.
#[utoipa::path(post, path = "/webhooks", request_body = NewWebhook, responses(
    (status = 201, body = WebhookView), (status = 400, body = Problem), (status = 403, body = Problem),
    (status = 409, body = Problem), (status = 429, body = Problem)))]
pub(crate) async fn add_webhook(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    body: Body,
) -> Result<(StatusCode, Json<WebhookView>), Problem> {
    caller.require(Role::Admin)?;
    let body: NewWebhook = body.parse(false)?;
    let added = webhooks::add(
        app.webhooks.as_ref(),
        &app.webhook_settings,
        caller.tenant.as_deref(),
        &body.url,
        &body.events,
        chrono::Utc::now(),
    )
    .await?;
    Ok((StatusCode::CREATED, Json(WebhookView::of(&added))))
}

/// The caller's tenant's webhooks (never their secrets).
#[utoipa::path(get, path = "/webhooks", responses((status = 200, body = WebhookList), (status = 403, body = Problem)))]
pub(crate) async fn list_webhooks(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<WebhookList>, Problem> {
    caller.require(Role::Admin)?;
    let list = webhooks::list(app.webhooks.as_ref(), caller.tenant.as_deref()).await?;
    Ok(Json(WebhookList { webhooks: list.iter().map(WebhookView::listed).collect() }))
}

/// Removes one of the caller's tenant's webhooks.
#[utoipa::path(delete, path = "/webhooks/{id}", params(("id" = String, Path, description = "The webhook id")), responses(
    (status = 204), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub(crate) async fn remove_webhook(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, Problem> {
    caller.require(Role::Admin)?;
    webhooks::remove(app.webhooks.as_ref(), caller.tenant.as_deref(), &id, chrono::Utc::now())
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Gives a webhook a new secret (in the answer, once); the old one signs for 24 hours more.
#[utoipa::path(post, path = "/webhooks/{id}/rotate", params(("id" = String, Path, description = "The webhook id")), responses(
    (status = 200, body = WebhookView), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub(crate) async fn rotate_webhook(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<WebhookView>, Problem> {
    caller.require(Role::Admin)?;
    let rotated =
        webhooks::rotate(app.webhooks.as_ref(), caller.tenant.as_deref(), &id, chrono::Utc::now())
            .await?;
    Ok(Json(WebhookView::of(&rotated)))
}

/// A webhook's newest deliveries, each with every attempt.
#[utoipa::path(get, path = "/webhooks/{id}/deliveries", params(("id" = String, Path, description = "The webhook id")), responses(
    (status = 200, body = DeliveryList), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub(crate) async fn webhook_deliveries(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<DeliveryList>, Problem> {
    caller.require(Role::Admin)?;
    let found = webhooks::deliveries(app.webhooks.as_ref(), caller.tenant.as_deref(), &id).await?;
    let deliveries = found
        .into_iter()
        .map(|(d, attempts)| DeliveryView {
            id: d.id,
            kind: d.kind,
            run_id: d.run_id,
            seq: d.seq,
            state: d.state.as_str().to_owned(),
            created_at: d.created_at,
            next_at: d.next_at,
            last_error: d.last_error,
            attempts: attempts
                .iter()
                .map(|a| serde_json::to_value(a).unwrap_or_default())
                .collect(),
        })
        .collect();
    Ok(Json(DeliveryList { deliveries }))
}
