//! A run's events: as JSON (a page after a seq), or as a live stream of Server-Sent Events
//! when the request accepts `text/event-stream`. Each SSE event's id is the event's seq, so
//! a client that reconnects with `Last-Event-ID` resumes exactly after the last event it
//! got; its type is the event's kind and its data the event as JSON (with `run_id`). The
//! stream ends after the run's `scenario_finished`, and when the server stops; quiet
//! streams get a keep-alive comment. Between the log's events, a stream carries the text of
//! model answers as it arrives (`model_delta`, with no id: it is not in the log).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use baton_engine::Status;
use baton_engine::cancel::LiveText;
use baton_engine::event::Event;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::app::App;
use crate::auth::Caller;
use crate::event_wire::{Woke, ends, event_json, live_event};
use crate::limits::StreamPlace;
use crate::problem::Problem;
use futures_util::StreamExt;

/// The most events one JSON answer holds.
pub(crate) const EVENTS_PAGE_MAX: usize = 5_000;
/// How long a stream waits for the store before it looks again.
const WAIT_EACH: Duration = Duration::from_secs(30);

/// Where to start.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct After {
    /// Only events after this seq (a stream's `Last-Event-ID` wins over it).
    #[param(minimum = 0, maximum = 9_223_372_036_854_775_807_i64)]
    pub after: Option<u64>,
    /// A stream of the run and every run below it (a job's tree); its event ids are
    /// places in every run of the tree (`12(5,3(2))`).
    #[serde(default)]
    pub tree: bool,
}

/// A page of a run's events.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EventPage {
    #[schema(value_type = Vec<Object>)]
    pub events: Vec<Value>,
    /// The `after` of the next page, when this one is full.
    pub next_after: Option<u64>,
}

/// A run's events after a seq: JSON, or a live SSE stream with `Accept: text/event-stream`.
#[utoipa::path(get, path = "/runs/{id}/events", params(("id" = String, Path, description = "The run id"), After), responses(
    (status = 200, body = EventPage, description = "JSON, or with Accept: text/event-stream a stream of events whose ids are their seqs"),
    (status = 404, body = Problem),
    (status = 406, body = Problem, description = "`tree=true` without `Accept: text/event-stream`: the tree is a live stream only"),
    (status = 429, body = Problem)))]
pub(crate) async fn run_events(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    q: Result<Query<After>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    app.visible_run(&caller, &id).await?;
    let Query(q) = q.map_err(|e| Problem::bad_request(e.body_text()))?;
    if q.after.is_some_and(|a| i64::try_from(a).is_err()) {
        return Err(Problem::bad_request("after is past any seq (at most 2^63 - 1)"));
    }
    let wants_stream = headers
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("text/event-stream"));
    if q.tree {
        if !wants_stream {
            return Err(Problem::new(
                axum::http::StatusCode::NOT_ACCEPTABLE,
                "tree=true is a live stream: ask for it with Accept: text/event-stream",
            ));
        }
        let from = headers
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                crate::tree_events::Place::decode(v, baton_engine::limits::TREE_RUNS_MAX).map_err(
                    |why| {
                        Problem::bad_request(format!(
                            "Last-Event-ID {v:?} is no place in a tree: {why}"
                        ))
                    },
                )
            })
            .transpose()?;
        let place = app.streams.open(&caller.token_id, caller.session.as_deref())?;
        let ended = place.ended();
        let follower =
            crate::tree_events::TreeFollower::new(Arc::clone(&app), &id, from, place).await?;
        let stream = futures_util::stream::unfold(follower, crate::tree_events::TreeFollower::next)
            .take_until(ended.cancelled_owned());
        return Ok(Sse::new(stream)
            .keep_alive(KeepAlive::new().interval(app.settings.keep_alive))
            .into_response());
    }
    if !wants_stream {
        let events = app.store.load(&id, q.after.unwrap_or(0)).await?;
        let full = events.len() > EVENTS_PAGE_MAX;
        let page: Vec<&Event> = events.iter().take(EVENTS_PAGE_MAX).collect();
        let next_after = full.then(|| page.last().map(|e| e.seq)).flatten();
        let events = page.into_iter().map(|e| event_json(&id, e)).collect();
        return Ok(Json(EventPage { events, next_after }).into_response());
    }
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.trim().parse::<u64>().map_err(|_| {
                Problem::bad_request(format!("Last-Event-ID {v:?} is not an event seq"))
            })
        })
        .transpose()?;
    let place = app.streams.open(&caller.token_id, caller.session.as_deref())?;
    let ended = place.ended();
    let follower = Follower {
        live: app.live.subscribe(),
        app: Arc::clone(&app),
        run_id: id,
        after: last.or(q.after).unwrap_or(0),
        buffer: VecDeque::new(),
        done: false,
        _place: place,
    };
    let stream =
        futures_util::stream::unfold(follower, Follower::next).take_until(ended.cancelled_owned());
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(app.settings.keep_alive))
        .into_response())
}

/// One stream's place in a run's log.
struct Follower {
    live: tokio::sync::broadcast::Receiver<Arc<LiveText>>,
    app: Arc<App>,
    run_id: String,
    after: u64,
    buffer: VecDeque<Event>,
    done: bool,
    _place: StreamPlace,
}

impl Follower {
    async fn next(mut self) -> Option<(Result<SseEvent, Infallible>, Self)> {
        loop {
            if let Some(e) = self.buffer.pop_front() {
                self.after = e.seq;
                if ends(&e) {
                    self.done = true;
                }
                let data = event_json(&self.run_id, &e).to_string();
                let sse = SseEvent::default().id(e.seq.to_string()).event(e.data.kind()).data(data);
                return Some((Ok(sse), self));
            }
            if self.done || self.app.stop.is_cancelled() {
                return None;
            }
            match self.app.events_after(&self.run_id, self.after).await {
                Ok(events) if !events.is_empty() => {
                    self.buffer.extend(events);
                    continue;
                }
                Ok(_) => {}
                // A log that cannot be read ends the stream; the client sees why by asking
                // for the run.
                Err(_) => return None,
            }
            // A run that ended without a `scenario_finished` after `after` has nothing more.
            if let Ok(Some(r)) = self.app.store.run(&self.run_id).await
                && Status::from_name(&r.status).is_some_and(Status::is_final)
                && r.last_seq <= self.after
            {
                return None;
            }
            let (store, run_id, after) =
                (Arc::clone(&self.app.store), self.run_id.clone(), self.after);
            let stop = self.app.stop.clone();
            let wait = async move { store.wait_for_events(&run_id, after, WAIT_EACH).await };
            tokio::pin!(wait);
            // Other runs' text wakes this stream without a look at the store.
            let woke = loop {
                tokio::select! {
                    _ = &mut wait => break Woke::Events,
                    got = self.live.recv() => match got {
                        Ok(t) if *t.run_id == *self.run_id => break Woke::Text(t),
                        // Another run's text; or pieces missed by a slow stream, which are
                        // only missed live: the answer is in the log.
                        Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => break Woke::Events,
                    },
                    () = stop.cancelled() => break Woke::Stop,
                }
            };
            match woke {
                Woke::Text(t) => return Some((Ok(live_event(&t)), self)),
                Woke::Stop => return None,
                Woke::Events => {}
            }
        }
    }
}
