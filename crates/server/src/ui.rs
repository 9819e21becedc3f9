//! The web UI: plain HTML, CSS and JavaScript files committed under `crates/server/ui/`
//! and built into the binary (no bundler, no network at build time). Served with a strict
//! Content-Security-Policy: scripts and styles only from this server, nothing inline, no
//! frames — what a run's text holds is shown as text, never as markup.

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("../ui/index.html");
const APP_JS: &str = include_str!("../ui/app.js");
const APP_CSS: &str = include_str!("../ui/app.css");

const POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

fn page(content_type: &'static str, body: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// The UI's one page (its views are routed in the browser).
pub(crate) async fn index() -> Response {
    page("text/html; charset=utf-8", INDEX)
}

/// The UI's script and style sheet.
pub(crate) async fn asset(Path(file): Path<String>) -> Response {
    match file.as_str() {
        "app.js" => page("text/javascript; charset=utf-8", APP_JS),
        "app.css" => page("text/css; charset=utf-8", APP_CSS),
        _ => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}
