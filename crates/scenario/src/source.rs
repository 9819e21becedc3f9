//! Source files and positions inside them.
//!
//! Every node the loader reads carries a [`Pos`]: which source it came from (a scenario
//! file, a tenant override, a template) and where in it. A [`Sources`] table owns the
//! texts so that a diagnostic can show the offending line long after parsing.

use std::fmt;
use std::sync::Arc;

/// Index of a source in a [`Sources`] table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct SourceId(pub u32);

/// A place in a source: 1-based line and column (in characters), byte offset and length.
///
/// Line 0 means the position is unknown (a value that did not come from a file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Pos {
    pub source: SourceId,
    pub line: u32,
    pub col: u32,
    pub byte: u32,
    pub len: u32,
}

impl Pos {
    /// A position that names no place.
    pub const UNKNOWN: Pos = Pos { source: SourceId(0), line: 0, col: 0, byte: 0, len: 0 };

    /// Whether this position names a real place.
    pub fn is_known(&self) -> bool {
        self.line > 0
    }
}

/// One named text: a file's path (as the user gave it) and its contents.
#[derive(Debug)]
pub struct Source {
    pub name: String,
    pub text: String,
}

/// The table of every text a load read, addressed by [`SourceId`].
#[derive(Debug, Default, Clone)]
pub struct Sources {
    items: Vec<Arc<Source>>,
}

impl Sources {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a text and returns its id.
    pub fn add(&mut self, name: impl Into<String>, text: impl Into<String>) -> SourceId {
        let id = u32::try_from(self.items.len()).unwrap_or(u32::MAX);
        self.items.push(Arc::new(Source { name: name.into(), text: text.into() }));
        SourceId(id)
    }

    /// The source with this id, if the table has it.
    pub fn get(&self, id: SourceId) -> Option<&Source> {
        self.items.get(id.0 as usize).map(AsRef::as_ref)
    }

    /// The name of a source, or `<unknown>`.
    pub fn name(&self, id: SourceId) -> &str {
        self.get(id).map_or("<unknown>", |s| s.name.as_str())
    }

    /// The text of line `line` (1-based) of a source, without its line break.
    pub fn line_text(&self, id: SourceId, line: u32) -> Option<&str> {
        let source = self.get(id)?;
        let index = usize::try_from(line).ok()?.checked_sub(1)?;
        source.text.lines().nth(index)
    }

    /// Finds the position of byte `offset` in a source's text.
    pub fn pos_at_byte(&self, id: SourceId, offset: usize, len: usize) -> Pos {
        let Some(source) = self.get(id) else {
            return Pos::UNKNOWN;
        };
        pos_in_text(&source.text, offset, len, id)
    }
}

/// Finds the line and column of byte `offset` in `text`.
pub fn pos_in_text(text: &str, offset: usize, len: usize, source: SourceId) -> Pos {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or("");
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = text.get(line_start..offset).map_or(0, |s| s.chars().count()) + 1;
    Pos {
        source,
        line: saturate(line),
        col: saturate(col),
        byte: saturate(offset),
        len: saturate(len),
    }
}

/// Converts a size to `u32`, saturating; positions beyond 4 GiB are not meaningful here.
pub(crate) fn saturate(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}
