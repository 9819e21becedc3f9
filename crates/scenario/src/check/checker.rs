//! The checker's state and its small shared steps: reporting an error or warning, and
//! checking ids and numbers against their ranges.

use crate::de::Located;
use crate::diag::{Diagnostic, Diagnostics};
use crate::files::Files;
use crate::limits;
use crate::source::{Pos, Sources};

pub(super) struct Checker<'a> {
    pub(super) files: &'a mut Files,
    pub(super) sources: &'a mut Sources,
    pub(super) diags: &'a mut Diagnostics,
    /// Errors already in `diags` before this scenario: graph warnings are only worth
    /// giving about a scenario that has none of its own.
    pub(super) errors_at_start: usize,
}

/// Whether `s` is a well-formed id: a lower-case letter, then lower-case letters, digits, `_`.
pub fn is_id(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && s.len() <= limits::ID_CHARS_MAX
}

impl Checker<'_> {
    pub(super) fn error(
        &mut self,
        code: &'static str,
        pos: Pos,
        message: impl Into<String>,
    ) -> &mut Diagnostic {
        self.diags.push(Diagnostic::error(code, pos, message));
        self.last()
    }

    pub(super) fn warning(
        &mut self,
        code: &'static str,
        pos: Pos,
        message: impl Into<String>,
    ) -> &mut Diagnostic {
        self.diags.push(Diagnostic::warning(code, pos, message));
        self.last()
    }

    pub(super) fn last(&mut self) -> &mut Diagnostic {
        self.diags.last_mut().expect("a diagnostic was pushed just before")
    }

    pub(super) fn id(&mut self, id: &Located<String>, what: &str) {
        if !is_id(&id.value) {
            self.error("bad-id", id.pos, format!("`{}` is not a valid {what} id", id.value)).help =
                Some(format!(
                    "ids start with a lower-case letter and hold lower-case letters, digits and `_` (at most {} characters)",
                    limits::ID_CHARS_MAX
                ));
        }
    }

    /// The value when `holds` is true of it (and it is finite); else an error saying it
    /// must be `expected`.
    pub(super) fn number(
        &mut self,
        value: Option<&Located<f64>>,
        what: &str,
        expected: &str,
        holds: impl Fn(f64) -> bool,
    ) -> Option<f64> {
        let v = value?;
        if !(v.value.is_finite() && holds(v.value)) {
            self.error(
                "out-of-range",
                v.pos,
                format!("`{what}` must be {expected}, found {}", v.value),
            );
            return None;
        }
        Some(v.value)
    }

    pub(super) fn positive(
        &mut self,
        value: Option<&Located<f64>>,
        what: &str,
        max: f64,
    ) -> Option<f64> {
        self.number(value, what, &format!("a number in (0, {max}]"), |v| v > 0.0 && v <= max)
    }

    pub(super) fn non_negative(&mut self, value: Option<&Located<f64>>, what: &str) -> Option<f64> {
        self.number(value, what, "zero or more", |v| v >= 0.0)
    }

    pub(super) fn fraction(&mut self, value: Option<&Located<f64>>, what: &str) -> Option<f64> {
        self.number(value, what, "between 0 and 1", |v| (0.0..=1.0).contains(&v))
    }

    pub(super) fn bounded(
        &mut self,
        value: Option<&Located<u32>>,
        what: &str,
        max: u32,
    ) -> Option<u32> {
        let v = value?;
        if v.value == 0 || v.value > max {
            self.error(
                "out-of-range",
                v.pos,
                format!("`{what}` must be between 1 and {max}, found {}", v.value),
            );
            return None;
        }
        Some(v.value)
    }
}
