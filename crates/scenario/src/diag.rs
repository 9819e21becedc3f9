//! Diagnostics: what is wrong with a scenario, where, and what to do about it.
//!
//! A [`Diagnostic`] names a stable code, a message, the file with line and column, the
//! line itself with the offending part underlined, and an optional hint. The loader
//! collects them instead of stopping at the first one, so an author sees every problem
//! of a file in one pass.

use std::fmt::{self, Write as _};

use serde::Serialize;

use crate::source::{Pos, Sources};

/// How bad a diagnostic is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The scenario cannot be loaded.
    Error,
    /// The scenario loads, but probably does not do what its author meant.
    Warning,
    /// Something worth knowing that may well be as meant (what an MCP server's
    /// annotations say of a tool, which the scenario is not bound by).
    Hint,
}

/// One problem found in a scenario, a template, a rubric or an override.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Diagnostic {
    pub severity: Severity,
    /// A stable, kebab-case name for the kind of problem (`unknown-field`, `dangling-edge` …).
    pub code: &'static str,
    pub message: String,
    /// The file it is in, as the user named it.
    pub file: String,
    /// 1-based; 0 when the problem concerns the file as a whole.
    pub line: u32,
    /// 1-based, in characters; 0 when unknown.
    pub column: u32,
    /// How many characters to underline (at least one when the line is known).
    pub width: u32,
    /// The text of the line, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snippet: Option<String>,
    /// What to do about it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub help: Option<String>,
    #[serde(skip)]
    pos: Pos,
}

impl Diagnostic {
    /// An error at `pos`.
    pub fn error(code: &'static str, pos: Pos, message: impl Into<String>) -> Self {
        Self::new(Severity::Error, code, pos, message.into())
    }

    /// A warning at `pos`.
    pub fn warning(code: &'static str, pos: Pos, message: impl Into<String>) -> Self {
        Self::new(Severity::Warning, code, pos, message.into())
    }

    /// A hint about the whole of a file (`in_file`), with no place in it.
    pub fn hint(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(Severity::Hint, code, Pos::UNKNOWN, message.into())
    }

    fn new(severity: Severity, code: &'static str, pos: Pos, message: String) -> Self {
        Self {
            severity,
            code,
            message,
            file: String::new(),
            line: pos.line,
            column: pos.col,
            width: 0,
            snippet: None,
            help: None,
            pos,
        }
    }

    /// Adds a hint saying what to do.
    #[must_use]
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Appends context to the message, such as where a broken file is used.
    #[must_use]
    pub fn with_context(mut self, context: &str) -> Self {
        self.message.push_str(context);
        self
    }

    /// Names the file explicitly (for problems that have no position in it).
    #[must_use]
    pub fn in_file(mut self, file: impl Into<String>) -> Self {
        self.file = file.into();
        self
    }

    /// Whether this is an error (as opposed to a warning).
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// The position this diagnostic points at.
    pub fn pos(&self) -> Pos {
        self.pos
    }

    /// Fills in the file name and the line's text from the table of sources.
    pub fn locate(&mut self, sources: &Sources) {
        if (self.pos.is_known() || self.file.is_empty())
            && let Some(source) = sources.get(self.pos.source)
        {
            self.file.clone_from(&source.name);
        }
        if !self.pos.is_known() {
            return;
        }
        let Some(line) = sources.line_text(self.pos.source, self.pos.line) else {
            return;
        };
        let line = line.trim_end_matches('\r');
        let start = self.pos.col.saturating_sub(1) as usize;
        let rest = line.chars().count().saturating_sub(start).max(1);
        let spanned = sources
            .get(self.pos.source)
            .and_then(|s| {
                s.text.get(self.pos.byte as usize..(self.pos.byte + self.pos.len) as usize)
            })
            .map_or(0, |t| t.split('\n').next().unwrap_or("").chars().count());
        self.width = crate::source::saturate(spanned.clamp(1, rest));
        self.snippet = Some(line.to_owned());
    }

    /// Renders the diagnostic the way a compiler would, for a terminal or a log.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let severity = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Hint => "hint",
        };
        let _ = writeln!(out, "{severity}[{}]: {}", self.code, self.message);
        let file = if self.file.is_empty() { "<input>" } else { self.file.as_str() };
        let number = self.line.to_string();
        let pad = " ".repeat(if self.snippet.is_some() { number.len() } else { 1 });
        if self.line > 0 {
            let _ = writeln!(out, "{pad}--> {file}:{}:{}", self.line, self.column);
        } else {
            let _ = writeln!(out, "{pad}--> {file}");
        }
        if let Some(snippet) = &self.snippet {
            let _ = writeln!(out, "{pad} |");
            let _ = writeln!(out, "{number} | {}", snippet.replace('\t', " "));
            let indent = " ".repeat(self.column.saturating_sub(1) as usize);
            let marks = "^".repeat(self.width.max(1) as usize);
            let _ = writeln!(out, "{pad} | {indent}{marks}");
        }
        if let Some(help) = &self.help {
            let _ = writeln!(out, "{pad} = help: {help}");
        }
        out
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}

/// Diagnostics collected during one load, in the order they were found.
#[derive(Clone, Debug, Default)]
pub struct Diagnostics {
    items: Vec<Diagnostic>,
}

impl Diagnostics {
    /// An empty collection.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one diagnostic.
    pub fn push(&mut self, diagnostic: Diagnostic) {
        self.items.push(diagnostic);
    }

    /// Adds an error.
    pub fn error(&mut self, code: &'static str, pos: Pos, message: impl Into<String>) {
        self.items.push(Diagnostic::error(code, pos, message));
    }

    /// Adds a warning.
    pub fn warning(&mut self, code: &'static str, pos: Pos, message: impl Into<String>) {
        self.items.push(Diagnostic::warning(code, pos, message));
    }

    /// Whether any diagnostic is an error.
    pub fn has_errors(&self) -> bool {
        self.items.iter().any(Diagnostic::is_error)
    }

    /// Rewrites every message (to add context, such as the tenant of an override).
    pub fn map_messages(&mut self, f: impl Fn(&str) -> String) {
        for d in &mut self.items {
            d.message = f(&d.message);
        }
    }

    /// The diagnostic added last.
    pub fn last_mut(&mut self) -> Option<&mut Diagnostic> {
        self.items.last_mut()
    }

    /// How many errors there are.
    pub fn error_count(&self) -> usize {
        self.items.iter().filter(|d| d.is_error()).count()
    }

    /// How many are warnings.
    pub fn warning_count(&self) -> usize {
        self.items.iter().filter(|d| d.severity == Severity::Warning).count()
    }

    /// Moves every diagnostic of `other` into this collection.
    pub fn extend(&mut self, other: Diagnostics) {
        self.items.extend(other.items);
    }

    /// Fills in file names and snippets of every diagnostic not yet located.
    pub fn locate(&mut self, sources: &Sources) {
        for d in &mut self.items {
            if d.snippet.is_none() {
                d.locate(sources);
            }
        }
    }

    /// The diagnostics, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Diagnostic> {
        self.items.iter()
    }

    /// The diagnostics as a vector.
    pub fn into_vec(self) -> Vec<Diagnostic> {
        self.items
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Renders every diagnostic, separated by blank lines.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (i, d) in self.items.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            out.push_str(&d.render());
        }
        out
    }
}

impl<'a> IntoIterator for &'a Diagnostics {
    type Item = &'a Diagnostic;
    type IntoIter = std::slice::Iter<'a, Diagnostic>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}
