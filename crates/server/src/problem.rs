//! Errors as RFC 9457 problem details (`application/problem+json`), with the texts the CLI
//! prints for the same failures.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// A request that did not do what it asked: its HTTP status and what to do about it.
#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
pub struct Problem {
    /// `about:blank` where the status and title say the kind; for a failure of the
    /// application layer, its kind's URI from the one table every surface shares
    /// (`baton_app::Kind::surfaces`).
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub title: String,
    pub status: u16,
    /// What went wrong and what to do, as the CLI says it.
    pub detail: String,
    /// When a retry may succeed (for 429 and 503).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u64>,
}

impl Problem {
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Problem {
            kind: "about:blank",
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            detail: detail.into(),
            retry_after_s: None,
        }
    }

    pub fn bad_request(detail: impl Into<String>) -> Self {
        Problem::new(StatusCode::BAD_REQUEST, detail)
    }

    pub fn not_found(detail: impl Into<String>) -> Self {
        Problem::new(StatusCode::NOT_FOUND, detail)
    }

    pub fn conflict(detail: impl Into<String>) -> Self {
        Problem::new(StatusCode::CONFLICT, detail)
    }

    pub fn forbidden(detail: impl Into<String>) -> Self {
        Problem::new(StatusCode::FORBIDDEN, detail)
    }

    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Problem::new(StatusCode::UNAUTHORIZED, detail)
    }

    pub fn internal(detail: impl Into<String>) -> Self {
        Problem::new(StatusCode::INTERNAL_SERVER_ERROR, detail)
    }

    pub fn too_many(detail: impl Into<String>, retry_after_s: u64) -> Self {
        Problem {
            retry_after_s: Some(retry_after_s),
            ..Problem::new(StatusCode::TOO_MANY_REQUESTS, detail)
        }
    }

    /// An engine error: refusals and conflicts are the caller's to fix, the rest the
    /// server's.
    pub fn engine(e: &baton_engine::exec::Error) -> Self {
        use baton_engine::exec::Error as E;
        use baton_engine::store::Error as S;
        match e {
            E::Store(S::NotFound(_)) => Problem::not_found(e.to_string()),
            E::Store(S::Busy(_) | S::Conflict { .. } | S::KeyTaken { .. })
            | E::Refused { .. }
            | E::WrongScenario { .. }
            | E::ChecksumChanged { .. } => Problem::conflict(e.to_string()),
            E::Data { .. } | E::Invalid { .. } => {
                Problem::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
            }
            _ => Problem::internal(e.to_string()),
        }
    }

    pub fn store(e: &baton_engine::store::Error) -> Self {
        match e {
            baton_engine::store::Error::NotFound(_) => Problem::not_found(e.to_string()),
            _ => Problem::internal(e.to_string()),
        }
    }
}

impl From<baton_app::Error> for Problem {
    fn from(e: baton_app::Error) -> Self {
        let shown = e.kind.surfaces();
        let status =
            StatusCode::from_u16(shown.http_status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let detail = match &e.diagnostics {
            Some(d) => format!("{}:\n{}", e.message, d.trim_end()),
            None => e.message,
        };
        Problem { kind: shown.problem_type, ..Problem::new(status, detail) }
    }
}

impl From<baton_engine::exec::Error> for Problem {
    fn from(e: baton_engine::exec::Error) -> Self {
        Problem::engine(&e)
    }
}

impl From<baton_engine::store::Error> for Problem {
    fn from(e: baton_engine::store::Error) -> Self {
        Problem::store(&e)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let retry = self.retry_after_s;
        let mut response = (status, axum::Json(self)).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if let Some(s) = retry {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}
