//! The application's errors, typed by kind, and the one table that says what each kind is
//! on every surface: the CLI's exit code, and the HTTP status with its problem `type` —
//! which an MCP tool call that fails carries too, in its error result's `_meta` (under
//! `baton/problem`). A surface never chooses a status of its own for an error of this
//! layer.

/// What kind of failure an [`Error`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The request itself is wrong: a value out of range, an empty field, a file that does
    /// not read, a scenario pin that names nothing.
    Invalid,
    /// What the request is addressed to is not there (a run, for the caller).
    NotFound,
    /// The request is well formed but refused as things stand: a tenant's overrides that
    /// do not load, a decision already made.
    Refused,
    /// The request repeats an earlier one's idempotency key with another body: the key
    /// names that request's run, and this one is not it.
    KeyReused,
    /// A limit of the caller's is reached (the idempotency keys a tenant holds): the same
    /// request succeeds once what holds the limit expires.
    OverLimit,
    /// This instance cannot do it here: no usable jail for a job that starts programs, no
    /// model for a job that calls one.
    Unavailable,
    /// Something failed on the instance's side (the store, a file it keeps).
    Internal,
}

/// The table: each kind on each surface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Surfaces {
    /// The CLI's exit code.
    pub exit_code: u8,
    /// The HTTP status.
    pub http_status: u16,
    /// The problem `type` URI of an HTTP answer (RFC 9457) and of an MCP error result.
    pub problem_type: &'static str,
}

impl Kind {
    /// How every surface shows this kind.
    pub fn surfaces(self) -> Surfaces {
        let (exit_code, http_status, problem_type) = match self {
            Kind::Invalid => (1, 400, "https://baton.dev/problems/invalid"),
            Kind::NotFound => (1, 404, "https://baton.dev/problems/not-found"),
            Kind::Refused => (1, 409, "https://baton.dev/problems/refused"),
            Kind::KeyReused => (1, 422, "https://baton.dev/problems/key-reused"),
            Kind::OverLimit => (1, 429, "https://baton.dev/problems/over-limit"),
            Kind::Unavailable => (1, 409, "https://baton.dev/problems/unavailable"),
            Kind::Internal => (1, 500, "https://baton.dev/problems/internal"),
        };
        Surfaces { exit_code, http_status, problem_type }
    }
}

/// A failure of a use case: its kind, what went wrong and what to do, and the loader's
/// rendered diagnostics when files did not load (a surface shows them before the message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: Kind,
    pub message: String,
    pub diagnostics: Option<String>,
}

impl Error {
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into(), diagnostics: None }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Error::new(Kind::Invalid, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Error::new(Kind::NotFound, message)
    }

    pub fn refused(message: impl Into<String>) -> Self {
        Error::new(Kind::Refused, message)
    }

    pub fn over_limit(message: impl Into<String>) -> Self {
        Error::new(Kind::OverLimit, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Error::new(Kind::Internal, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::new(Kind::Unavailable, message)
    }

    /// With the loader's rendered diagnostics.
    #[must_use]
    pub fn with_diagnostics(mut self, rendered: String) -> Self {
        self.diagnostics = Some(rendered);
        self
    }

    /// The kind of `e` when it is (or wraps) an error of this layer, the engine's or the
    /// store's; else internal.
    pub fn kind_of(e: &anyhow::Error) -> Kind {
        use baton_engine::exec::Error as E;
        use baton_engine::store::Error as S;
        if let Some(own) = e.downcast_ref::<Error>() {
            return own.kind;
        }
        let store = |s: &S| match s {
            S::NotFound(_) => Kind::NotFound,
            S::Busy(_) | S::Conflict { .. } | S::KeyTaken { .. } => Kind::Refused,
            _ => Kind::Internal,
        };
        if let Some(s) = e.downcast_ref::<S>() {
            return store(s);
        }
        match e.downcast_ref::<E>() {
            Some(E::Store(s)) => store(s),
            Some(E::Refused { .. } | E::WrongScenario { .. } | E::ChecksumChanged { .. }) => {
                Kind::Refused
            }
            Some(E::Data { .. } | E::Invalid { .. }) => Kind::Invalid,
            _ => Kind::Internal,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<baton_engine::store::Error> for Error {
    fn from(e: baton_engine::store::Error) -> Self {
        let kind = Error::kind_of(&anyhow::Error::from(e.clone()));
        Error::new(kind, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_problem_type() {
        let kinds = [
            Kind::Invalid,
            Kind::NotFound,
            Kind::Refused,
            Kind::KeyReused,
            Kind::OverLimit,
            Kind::Unavailable,
            Kind::Internal,
        ];
        let mut types: Vec<&str> = kinds.iter().map(|k| k.surfaces().problem_type).collect();
        types.sort_unstable();
        types.dedup();
        assert_eq!(types.len(), kinds.len());
    }

    #[test]
    fn an_engine_refusal_inside_anyhow_is_refused() {
        let e = anyhow::Error::from(baton_engine::exec::Error::Refused {
            run_id: "r".to_owned(),
            message: "already decided".to_owned(),
        });
        assert_eq!(Error::kind_of(&e), Kind::Refused);
        let own = anyhow::Error::from(Error::not_found("no scenario `x`"));
        assert_eq!(Error::kind_of(&own), Kind::NotFound);
    }
}
