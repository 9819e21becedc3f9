//! The feed (`GET /events`): every run of the caller's tenant, its events in the order they
//! were committed — as JSON (a page after a cursor), or as a live stream of Server-Sent
//! Events when the request accepts `text/event-stream`. Each SSE event's id is its cursor,
//! so a client that reconnects with `Last-Event-ID` resumes exactly after the last event it
//! got; its type is the event's kind and its data the event as JSON with `run_id` and
//! `cursor`. Read through `baton_app::feed`, as `baton events --all` reads it. Streams hold
//! a place among the token's streams, end when the server stops, and quiet ones get a
//! keep-alive comment.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use baton_app::feed::{FeedEvent, PAGE_MAX};
use baton_engine::store::FeedCursor;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::app::App;
use crate::auth::Caller;
use crate::event_wire::event_json;
use crate::limits::StreamPlace;
use crate::problem::Problem;

/// How many events a stream reads from the store at once.
const STREAM_PAGE: usize = 200;
/// How long a stream waits for new events before it looks again (keep-alives go on).
const WAIT_EACH: std::time::Duration = std::time::Duration::from_secs(30);

/// Where the feed starts, and how much of it a JSON page holds.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct FeedQuery {
    /// Only events after this cursor (`MAJOR-MINOR`, as `cursor` and the stream's ids give
    /// it; a stream's `Last-Event-ID` wins over it).
    #[param(pattern = "^[0-9]{1,19}-[0-9]{1,19}$")]
    pub after: Option<String>,
    /// At most this many events in a JSON page.
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// A page of the feed.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FeedPage {
    /// Each event with its `run_id` and `cursor`.
    #[schema(value_type = Vec<Object>)]
    pub events: Vec<Value>,
    /// Where the next page starts (`after` again when this one is empty).
    pub next: String,
}

/// Every run's events in commit order, of the caller's tenant: JSON, or a live SSE stream
/// with `Accept: text/event-stream`.
#[utoipa::path(get, path = "/events", params(FeedQuery), responses(
    (status = 200, body = FeedPage, description = "JSON, or with Accept: text/event-stream a stream of events whose ids are their cursors"),
    (status = 400, body = Problem, description = "a Last-Event-ID that is no cursor"),
    (status = 429, body = Problem)))]
pub(crate) async fn feed_events(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    q: Result<Query<FeedQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let Query(q) = q.map_err(|e| Problem::bad_request(e.body_text()))?;
    let cursor = |text: &str, what: &str| {
        FeedCursor::parse(text.trim()).ok_or_else(|| {
            Problem::bad_request(format!(
                "{what} {text:?} is not a feed cursor: two numbers, `MAJOR-MINOR`"
            ))
        })
    };
    let after = q.after.as_deref().map(|a| cursor(a, "after")).transpose()?;
    if q.limit.is_some_and(|l| l == 0 || usize::try_from(l).map_or(true, |l| l > PAGE_MAX)) {
        return Err(Problem::bad_request(format!("limit is from 1 to {PAGE_MAX}")));
    }
    let tenant = Some(caller.tenant.clone());
    let wants_stream = headers
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("text/event-stream"));
    if !wants_stream {
        let limit = q.limit.map_or(PAGE_MAX, |l| usize::try_from(l).unwrap_or(PAGE_MAX));
        let page = baton_app::feed::page(
            app.store.as_ref(),
            &tenant,
            after.unwrap_or(FeedCursor::START),
            limit,
        )
        .await?;
        let events = page.events.iter().map(feed_json).collect();
        return Ok(Json(FeedPage { events, next: page.next.to_string() }).into_response());
    }
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(|v| cursor(v, "Last-Event-ID"))
        .transpose()?;
    let place = app.streams.open(&caller.token_id, caller.session.as_deref())?;
    let ended = place.ended();
    let follower = FeedFollower {
        app: Arc::clone(&app),
        tenant,
        at: last.or(after).unwrap_or(FeedCursor::START),
        buffer: VecDeque::new(),
        _place: place,
    };
    let stream = futures_util::stream::unfold(follower, FeedFollower::next)
        .take_until(ended.cancelled_owned());
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(app.settings.keep_alive))
        .into_response())
}

/// An event of the feed as JSON: the event with its `run_id` and `cursor`.
fn feed_json(e: &FeedEvent) -> Value {
    let mut v = event_json(&e.run_id, &e.event);
    if let Value::Object(map) = &mut v {
        map.insert("cursor".to_owned(), Value::String(e.cursor.to_string()));
    }
    v
}

/// One stream's place in the feed.
struct FeedFollower {
    app: Arc<App>,
    tenant: Option<Option<String>>,
    at: FeedCursor,
    buffer: VecDeque<FeedEvent>,
    _place: StreamPlace,
}

impl FeedFollower {
    async fn next(mut self) -> Option<(Result<SseEvent, Infallible>, Self)> {
        loop {
            if let Some(e) = self.buffer.pop_front() {
                let sse = SseEvent::default()
                    .id(e.cursor.to_string())
                    .event(e.event.data.kind())
                    .data(feed_json(&e).to_string());
                return Some((Ok(sse), self));
            }
            if self.app.stop.is_cancelled() {
                return None;
            }
            // The same wait as `baton events --all --follow`, cut short when the server stops.
            let waited = tokio::select! {
                page = baton_app::feed::next_page(
                    self.app.store.as_ref(),
                    &self.tenant,
                    self.at,
                    STREAM_PAGE,
                    WAIT_EACH,
                ) => page,
                () = self.app.stop.cancelled() => return None,
            };
            match waited {
                Ok(page) => {
                    self.at = page.next;
                    self.buffer.extend(page.events);
                }
                // A log that cannot be read ends the stream; the client sees why by asking
                // for the page.
                Err(_) => return None,
            }
        }
    }
}
