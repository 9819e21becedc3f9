//! A request body (`Body`), read within the size limit and parsed only once the handler has
//! checked the caller may act on what it names, and the limit itself (`BodyLimit`), which
//! the router's host check hands on for the 413's message.

use axum::extract::Request;
use axum::http::StatusCode;

use crate::problem::Problem;

/// A request body, read (within the size limit) but parsed only once the handler has
/// checked the caller may act on what it names: another tenant's run is a 404 whatever the
/// body holds. Every refusal is a problem+json.
pub(crate) struct Body(axum::body::Bytes);

impl<S: Send + Sync> axum::extract::FromRequest<S> for Body {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        let limit = req.extensions().get::<BodyLimit>().map(|l| l.0);
        match axum::body::Bytes::from_request(req, state).await {
            Ok(bytes) => Ok(Body(bytes)),
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(match limit {
                Some(n) => too_large(n),
                None => Problem::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "the request body is larger than this server takes (--body-max-bytes)",
                ),
            }),
            Err(e) => Err(Problem::new(e.status(), e.body_text())),
        }
    }
}

impl Body {
    /// The body as a JSON object read as `T`; when `optional`, an empty body or `null` is
    /// `T::default()`. Anything else — an array, a number, a string — is refused, whatever
    /// `T`'s deserializer would make of it.
    pub(crate) fn parse<T: serde::de::DeserializeOwned + Default>(
        &self,
        optional: bool,
    ) -> Result<T, Problem> {
        if optional && self.0.iter().all(u8::is_ascii_whitespace) {
            return Ok(T::default());
        }
        let value: serde_json::Value = serde_json::from_slice(&self.0).map_err(|e| {
            Problem::bad_request(format!(
                "the request body is not JSON: {e} (line {}, column {}); /openapi.json describes it",
                e.line(),
                e.column()
            ))
        })?;
        match value {
            serde_json::Value::Null if optional => Ok(T::default()),
            serde_json::Value::Object(_) => serde_json::from_value(value).map_err(|e| {
                Problem::bad_request(format!(
                    "the request body is not what this takes: {e}; /openapi.json describes it"
                ))
            }),
            _ => Err(Problem::bad_request(if optional {
                "the request body must be a JSON object, null or nothing; /openapi.json describes it"
            } else {
                "the request body must be a JSON object; /openapi.json describes it"
            })),
        }
    }

    /// The body as text.
    pub(crate) fn text(&self) -> Result<String, Problem> {
        String::from_utf8(self.0.to_vec())
            .map_err(|_| Problem::bad_request("the request body is not UTF-8 text"))
    }
}

/// The 413 of a body over `most` bytes.
pub(crate) fn too_large(most: usize) -> Problem {
    Problem::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "the request body is larger than {most} bytes, the most this server takes (--body-max-bytes)"
        ),
    )
}

/// The body size limit, for the 413's message.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BodyLimit(pub(crate) usize);
