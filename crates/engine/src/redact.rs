//! Taking secrets out of outside text before it is recorded, as the kernel sees it: the
//! [`Redact`] its embedder gives it. The kernel passes every outside text it records — a
//! provider's error, a verifier's outcome, an MCP result — through it; what counts as a
//! secret (the keys the process knows, key-shaped tokens) is the embedder's to say
//! (`baton-app`'s `Redactor`).

use std::borrow::Cow;

/// What a secret is replaced by.
pub const REDACTED: &str = "[redacted]";

/// Replaces the secrets in outside text.
pub trait Redact: Send + Sync + std::fmt::Debug {
    /// The text with every secret replaced by [`REDACTED`]; borrowed when none was found.
    fn redact<'t>(&self, text: &'t str) -> Cow<'t, str>;

    /// Redacts a string in place.
    fn redact_in_place(&self, text: &mut String) {
        if let Cow::Owned(redacted) = self.redact(text) {
            *text = redacted;
        }
    }

    /// Redacts every string of a JSON value in place, object keys included.
    fn redact_value(&self, value: &mut serde_json::Value) {
        use serde_json::Value;
        match value {
            Value::String(s) => self.redact_in_place(s),
            Value::Array(items) => items.iter_mut().for_each(|v| self.redact_value(v)),
            Value::Object(map) => {
                let entries = std::mem::take(map);
                for (mut key, mut v) in entries {
                    self.redact_in_place(&mut key);
                    self.redact_value(&mut v);
                    map.insert(key, v);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }

    /// A verifier's outcome with its name, reasons and details redacted.
    fn redact_outcome(&self, outcome: &mut crate::event::VerifierFinished) {
        self.redact_in_place(&mut outcome.name);
        outcome.reasons.iter_mut().for_each(|r| self.redact_in_place(r));
        self.redact_value(&mut outcome.details);
    }
}

/// Records outside text as it comes: for an embedder whose process holds no secrets.
#[derive(Clone, Copy, Debug, Default)]
pub struct Verbatim;

impl Redact for Verbatim {
    fn redact<'t>(&self, text: &'t str) -> Cow<'t, str> {
        Cow::Borrowed(text)
    }
}
