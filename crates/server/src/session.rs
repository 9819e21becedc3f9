//! The browser's session (`/session`): who the request's token or cookie is, a bearer token
//! traded for an HttpOnly, SameSite=Strict cookie, and signing out.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Serialize;
use utoipa::ToSchema;

use crate::app::App;
use crate::auth::Caller;
use crate::peers::Client;
use crate::problem::Problem;

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
    client: Option<Extension<Client>>,
    headers: axum::http::HeaderMap,
) -> Json<Session> {
    if app.settings.no_auth {
        return Json(Session::of(Caller::local(), false));
    }
    match app.caller(&headers, client.map(|c| c.0)).await {
        Ok(c) => Json(Session::of(c, true)),
        Err(_) => {
            Json(Session { signed_in: false, tenant: None, role: None, name: None, auth: true })
        }
    }
}

/// Trades the bearer token of the request for a session: an HttpOnly, SameSite=Strict
/// cookie holding an opaque session id (never the token) — how the web UI authenticates (a
/// browser's EventSource cannot send headers, and a token never goes in a URL). The session
/// lasts `--session-max-age-s` at most and `--session-idle-s` unused, ends when signed out
/// of or when its token is revoked, and a token opening more than `--sessions-per-token`
/// signs its oldest out. Behind TLS (`--secure-cookies`) the cookie is `__Host-` and
/// `Secure`.
#[utoipa::path(post, path = "/session", responses(
    (status = 200, body = Session), (status = 401, body = Problem), (status = 429, body = Problem)))]
pub(crate) async fn open_session(
    State(app): State<Arc<App>>,
    client: Option<Extension<Client>>,
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
    let caller = app.caller(&headers, client.map(|c| c.0)).await?;
    let Some(bearer) = bearer else { return Ok(Json(Session::of(caller, true)).into_response()) };
    let (id, pushed_out) = app.tokens.open_session(&bearer, &caller).await?;
    for old in &pushed_out {
        app.streams.end(&caller.token_id, Some(old));
    }
    let rules = &app.tokens.sessions;
    let cookie = format!(
        "{}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{}",
        rules.cookie,
        rules.max_age.as_secs(),
        if rules.secure { "; Secure" } else { "" }
    );
    Ok(([(axum::http::header::SET_COOKIE, cookie)], Json(Session::of(caller, true)))
        .into_response())
}

/// Signs out: ends the session the cookie names (its event streams and MCP sessions end
/// with it) and clears the cookie.
#[utoipa::path(delete, path = "/session", responses((status = 204)))]
pub(crate) async fn close_session(
    State(app): State<Arc<App>>,
    headers: axum::http::HeaderMap,
) -> Result<Response, Problem> {
    if let Some(hash) = app.tokens.close_session(&headers).await? {
        for token in app.streams.tokens() {
            app.streams.end(&token, Some(&hash));
        }
    }
    let rules = &app.tokens.sessions;
    let cookie = format!(
        "{}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0{}",
        rules.cookie,
        if rules.secure { "; Secure" } else { "" }
    );
    Ok((StatusCode::NO_CONTENT, [(axum::http::header::SET_COOKIE, cookie)]).into_response())
}
