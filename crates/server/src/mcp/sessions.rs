//! The MCP sessions of `/mcp`, held to the server's limits: each takes a stream place of its
//! token (so it counts toward the per-token and server-wide stream caps, and a session past
//! them is refused 429 at `initialize`), belongs to the token that opened it (another token
//! naming its id is told there is no such session), and ends after `mcp_session_idle`
//! without a request, or within a second of its token being revoked.
//!
//! rmcp keeps the sessions themselves; this gate sits in front of it, after the auth layer,
//! and closes a session through rmcp's own session manager.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

use crate::app::App;
use crate::auth::Caller;
use crate::connections::{Guard, Guarded};
use crate::limits::StreamPlace;
use crate::problem::Problem;

/// The header naming a request's session.
const SESSION_HEADER: &str = "mcp-session-id";

/// The sessions open, by id.
pub(crate) struct Sessions {
    app: Arc<App>,
    pub(crate) manager: Arc<LocalSessionManager>,
    open: Mutex<HashMap<String, Held>>,
}

struct Held {
    token: String,
    last: Instant,
    /// Answers of the session still being sent (an open one keeps it from being idle).
    answering: Arc<AtomicUsize>,
    _place: StreamPlace,
    ended: tokio_util::sync::CancellationToken,
}

impl Sessions {
    pub(crate) fn new(app: Arc<App>, manager: Arc<LocalSessionManager>) -> Arc<Self> {
        Arc::new(Sessions { app, manager, open: Mutex::default() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes every session idle past the limit or whose token was revoked, four times a
    /// second.
    pub(crate) async fn sweep(self: Arc<Self>) {
        let idle = self.app.settings.mcp_session_idle;
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let over: Vec<String> = {
                let mut open = self.lock();
                let over: Vec<String> = open
                    .iter()
                    .filter(|(_, h)| {
                        let quiet = h.answering.load(Ordering::Relaxed) == 0;
                        (quiet && h.last.elapsed() > idle) || h.ended.is_cancelled()
                    })
                    .map(|(id, _)| id.clone())
                    .collect();
                for id in &over {
                    if let Some(held) = open.remove(id) {
                        // Its answers still streaming end with it.
                        held.ended.cancel();
                    }
                }
                over
            };
            for id in over {
                let _ = self.manager.close_session(&id.into()).await;
            }
        }
    }
}

/// In front of rmcp: a new session takes a stream place; a request in a session must come
/// from the token that opened it and keeps it alive; a deleted session frees its place.
pub(crate) async fn gate(
    State(sessions): State<Arc<Sessions>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(caller) = request.extensions().get::<Caller>().cloned() else {
        return Problem::unauthorized("the request carries no authenticated caller")
            .into_response();
    };
    let named =
        request.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
    if let Some(id) = named {
        let held = {
            let mut open = sessions.lock();
            match open.get_mut(&id) {
                Some(held) if held.token == caller.token_id => {
                    held.last = Instant::now();
                    held.answering.fetch_add(1, Ordering::Relaxed);
                    Some((Answering(Arc::clone(&held.answering)), held.ended.clone()))
                }
                // Another token's session is as unknown as one that never was.
                Some(_) => {
                    return Problem::not_found(format!("no MCP session {id}")).into_response();
                }
                None => None,
            }
        };
        let closing = request.method() == Method::DELETE;
        let response = next.run(request).await;
        if closing && response.status().is_success() {
            sessions.lock().remove(&id);
        }
        return match held {
            Some((answering, ended)) => holding(response, answering, ended),
            None => response,
        };
    }
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let place = match sessions.app.streams.open(&caller.token_id, caller.session.as_deref()) {
        Ok(p) => p,
        Err(p) => return p.into_response(),
    };
    let response = next.run(request).await;
    if let Some(id) = response.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()) {
        let ended = place.ended();
        let held = Held {
            token: caller.token_id,
            last: Instant::now(),
            answering: Arc::default(),
            _place: place,
            ended,
        };
        sessions.lock().insert(id.to_owned(), held);
        return response;
    }
    // A request outside any session (the stateless protocol) holds its place while its
    // answer streams, and ends with its token.
    let ended = place.ended();
    holding(response, place, ended)
}

/// One answer of a session being sent.
struct Answering(Arc<AtomicUsize>);

impl Guard for Answering {}
impl Guard for StreamPlace {}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `response`, holding `guard` while its body is sent and cut when `ended` is cancelled.
fn holding<G: Guard>(
    response: Response,
    guard: G,
    ended: tokio_util::sync::CancellationToken,
) -> Response {
    response.map(|body| {
        let body = Guarded { body, guard };
        axum::body::Body::from_stream(futures_util::StreamExt::take_until(
            axum::body::Body::new(body).into_data_stream(),
            ended.cancelled_owned(),
        ))
    })
}
