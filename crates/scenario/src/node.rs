//! A YAML document as a tree of nodes that remember where they came from.
//!
//! The loader reads every YAML text (scenario, tenant override, rubric front matter) into
//! a [`Node`] tree first; typed structs are then read from the tree by [`crate::de`]. The
//! tree is what makes three things possible: tenant overrides deep-merged over a base
//! while each value keeps its own file and line; a checksum stable across key order and
//! formatting ([`Node::write_canonical`]); and errors that always point at a place.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

use crate::diag::Diagnostic;
use crate::limits;
use crate::source::{Pos, SourceId, pos_in_text, saturate};

/// One YAML value with its position.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub value: Value,
    pub pos: Pos,
}

/// A mapping key with its position.
#[derive(Clone, Debug, PartialEq)]
pub struct Key {
    pub name: String,
    pub pos: Pos,
}

/// The value of a node. Mappings keep the order of their keys.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Key, Node)>),
}

impl Value {
    /// A short name of the value's type for messages ("a string", "a mapping" …).
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }
}

impl Node {
    /// Parses one YAML document.
    ///
    /// The text must be a single document; size, depth, node count and alias expansion are
    /// bounded (see [`crate::limits`]), so a YAML bomb is refused instead of exhausting memory.
    pub fn parse(text: &str, source: SourceId) -> Result<Node, Diagnostic> {
        if text.len() > limits::SOURCE_BYTES_MAX {
            return Err(Diagnostic::error(
                "file-too-large",
                Pos { source, ..Pos::UNKNOWN },
                format!(
                    "the file is {} bytes; a scenario file may be at most {} bytes",
                    text.len(),
                    limits::SOURCE_BYTES_MAX
                ),
            )
            .with_help("split the scenario or move long prompts into prompts/ templates"));
        }
        if is_blank(text) {
            return Err(Diagnostic::error(
                "empty-file",
                Pos { source, ..Pos::UNKNOWN },
                "the file holds no YAML document",
            )
            .with_help("a scenario file starts with `id:`, `version:` and `levels:`"));
        }
        let spanned: Spanned<RawNode> = serde_saphyr::from_str_with_options(text, yaml_options())
            .map_err(|e| {
            let d = yaml_error(&e, text, source);
            if d.code == DEPTH_CODE && d.pos().is_known() {
                // The parser's own recursion guard fired before the depth budget (flow
                // brackets are matched before any value is built). The text up to that
                // point, its open brackets closed, trips the budget at the bracket that
                // went too deep, as a shallower file would.
                let prefix = close_flow(text.get(..d.pos().byte as usize).unwrap_or(""));
                if let Err(e) =
                    serde_saphyr::from_str_with_options::<Spanned<RawNode>>(&prefix, yaml_options())
                {
                    let earlier = yaml_error(&e, &prefix, source);
                    if earlier.code == DEPTH_CODE && earlier.message == d.message {
                        return earlier;
                    }
                }
            }
            d
        })?;
        Ok(spanned_into_node(spanned, source))
    }

    /// The node's entries, when it is a mapping.
    pub fn as_map(&self) -> Option<&[(Key, Node)]> {
        match &self.value {
            Value::Map(entries) => Some(entries),
            _ => None,
        }
    }

    /// The value under `key`, when this node is a mapping that has it.
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.as_map()?.iter().find(|(k, _)| k.name == key).map(|(_, v)| v)
    }

    /// The node's text, when it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Writes the node as compact JSON with mapping keys sorted, so that two documents that
    /// mean the same thing produce the same bytes whatever their key order and formatting.
    pub fn write_canonical(&self, out: &mut String) {
        match &self.value {
            Value::Null => out.push_str("null"),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Int(i) => out.push_str(&i.to_string()),
            Value::Float(f) => write_float(*f, out),
            Value::Str(s) => write_json_string(s, out),
            Value::Seq(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write_canonical(out);
                }
                out.push(']');
            }
            Value::Map(entries) => {
                let mut sorted: Vec<&(Key, Node)> = entries.iter().collect();
                sorted.sort_by(|a, b| a.0.name.cmp(&b.0.name));
                out.push('{');
                for (i, (k, v)) in sorted.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_json_string(&k.name, out);
                    out.push(':');
                    v.write_canonical(out);
                }
                out.push('}');
            }
        }
    }

    /// The node as a JSON value (positions dropped). Non-finite floats become null.
    pub fn to_json(&self) -> serde_json::Value {
        match &self.value {
            Value::Null => serde_json::Value::Null,
            Value::Bool(b) => serde_json::Value::Bool(*b),
            Value::Int(i) => serde_json::Value::from(*i),
            Value::Float(f) => {
                serde_json::Number::from_f64(*f).map_or(serde_json::Value::Null, Into::into)
            }
            Value::Str(s) => serde_json::Value::String(s.clone()),
            Value::Seq(items) => items.iter().map(Node::to_json).collect(),
            Value::Map(entries) => {
                entries.iter().map(|(k, v)| (k.name.clone(), v.to_json())).collect()
            }
        }
    }

    /// Deep-merges `over` into this node: mappings merge key by key, recursively; lists and
    /// scalars replace; a null in `over` leaves the base value as it is (null never deletes).
    pub fn merge(&mut self, over: Node) {
        match (&mut self.value, over.value) {
            (_, Value::Null) => {}
            (Value::Map(base), Value::Map(entries)) => {
                for (key, value) in entries {
                    match base.iter_mut().find(|(k, _)| k.name == key.name) {
                        Some((_, slot)) => slot.merge(value),
                        None => base.push((key, value)),
                    }
                }
            }
            (slot, value) => {
                *slot = value;
                self.pos = over.pos;
            }
        }
    }
}

/// `text` with every flow collection it leaves open (`[`, `{`) closed at its end. Brackets
/// inside quoted scalars and comments do not count.
fn close_flow(text: &str) -> String {
    let mut open = Vec::new();
    let mut quote: Option<char> = None;
    let mut comment = false;
    let mut previous = '\n';
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            _ if comment => comment = c != '\n',
            (Some('"'), '\\') => {
                chars.next();
            }
            (Some(q), _) if c == q => quote = None,
            (None, '"' | '\'') => quote = Some(c),
            (None, '#') if previous.is_whitespace() => comment = true,
            (None, '[') => open.push(']'),
            (None, '{') => open.push('}'),
            (None, ']' | '}') => {
                open.pop();
            }
            // Inside quotes, and any other character outside them.
            _ => {}
        }
        previous = c;
    }
    let mut out = text.to_owned();
    out.extend(open.iter().rev());
    out
}

/// The code of the diagnostic for YAML nested too deeply, whichever guard caught it.
const DEPTH_CODE: &str = "yaml-too-deep";

/// The parser's options: bounded size, depth, nodes and aliases, one document, YAML 1.2
/// booleans only (`y`, `yes`, `on` and `no` stay strings: the "Norway problem").
fn yaml_options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = limits::YAML_DEPTH_MAX;
    budget.max_nodes = limits::YAML_NODES_MAX;
    budget.max_aliases = limits::YAML_ALIASES_MAX;
    budget.max_total_scalar_bytes = limits::SOURCE_BYTES_MAX;
    budget.max_documents = 1;
    serde_saphyr::options! {
        budget: Some(budget),
        with_snippet: false,
        strict_booleans: true,
    }
}

fn is_blank(text: &str) -> bool {
    text.trim_start_matches('\u{feff}').lines().all(|line| {
        let line = line.trim();
        line.is_empty() || line.starts_with('#') || line == "---" || line == "..."
    })
}

fn write_float(f: f64, out: &mut String) {
    if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e15 {
        // An integral float and the integer it equals mean the same number.
        #[allow(clippy::cast_possible_truncation)]
        out.push_str(&(f as i64).to_string());
    } else if f.is_finite() {
        out.push_str(&f.to_string());
    } else {
        out.push_str("null");
    }
}

fn write_json_string(s: &str, out: &mut String) {
    out.push_str(&serde_json::Value::String(s.to_owned()).to_string());
}

fn yaml_error(e: &serde_saphyr::Error, text: &str, source: SourceId) -> Diagnostic {
    let inner = e.without_snippet();
    let message = strip_location(&inner.to_string());
    let pos = match inner.location() {
        Some(loc) if loc.line() > 0 => match loc.span().byte_offset() {
            Some(byte) => pos_in_text(
                text,
                usize::try_from(byte).unwrap_or(0),
                usize::try_from(loc.span().byte_len().unwrap_or(1)).unwrap_or(1),
                source,
            ),
            // Without a byte offset, the line and column (in characters) give it.
            None => {
                let line = usize::try_from(loc.line()).unwrap_or(0);
                let col = usize::try_from(loc.column()).unwrap_or(0);
                let line_start: usize =
                    text.split_inclusive('\n').take(line.saturating_sub(1)).map(str::len).sum();
                let within = text
                    .get(line_start..)
                    .and_then(|rest| rest.char_indices().nth(col.saturating_sub(1)))
                    .map_or(0, |(i, _)| i);
                pos_in_text(text, line_start + within, 1, source)
            }
        },
        _ => Pos { source, ..Pos::UNKNOWN },
    };
    let about_a_tab =
        message.split(|c: char| !c.is_alphanumeric()).any(|w| w == "tab" || w == "tabs");
    let pos = if about_a_tab { tab_pos(text, pos) } else { pos };
    let (code, message, help) = describe_yaml_error(&message);
    Diagnostic::error(code, pos, message).with_help(help)
}

/// Where the tab a parser complains about really is. The parser reports a tab that starts
/// a continuation line at the scalar it was reading, a line or more above, and a tab
/// that indents a line one column after it; the offending tab is the first one in the
/// indentation of the reported line or a later one. Without such a tab the parser's
/// position stands.
fn tab_pos(text: &str, reported: Pos) -> Pos {
    if !reported.is_known() {
        return reported;
    }
    let from = text.get(..reported.byte as usize).and_then(|t| t.rfind('\n')).map_or(0, |i| i + 1);
    let mut at = from;
    for line in text.get(from..).unwrap_or("").split_inclusive('\n') {
        let indent = line.len() - line.trim_start_matches([' ', '\t']).len();
        if let Some(tab) = line[..indent].find('\t') {
            return pos_in_text(text, at + tab, 1, reported.source);
        }
        at += line.len();
    }
    reported
}

/// Turns a parser message into an author's: a stable code, a sentence, and what to do.
fn describe_yaml_error(message: &str) -> (&'static str, String, &'static str) {
    let lower = message.to_lowercase();
    if lower.contains("documents") {
        return (
            "multiple-documents",
            "the file holds more than one YAML document".to_owned(),
            "a scenario file holds exactly one document; remove the extra `---`",
        );
    }
    if lower.contains("recursion limit") || lower.contains("budget") && lower.contains("depth") {
        return (
            DEPTH_CODE,
            format!("the YAML nests deeper than {} levels", limits::YAML_DEPTH_MAX),
            "flatten the structure: a scenario never needs lists or mappings nested this deep",
        );
    }
    if lower.contains("budget") {
        let what = if lower.contains("alias") {
            format!("the YAML uses more than {} aliases", limits::YAML_ALIASES_MAX)
        } else if lower.contains("scalar") {
            "the YAML holds too much text".to_owned()
        } else {
            format!(
                "the YAML expands to more than {} values (aliases count each time they are used)",
                limits::YAML_NODES_MAX
            )
        };
        return (
            "yaml-too-complex",
            what,
            "aliases, nesting or size exceed what a scenario may use; write the values out plainly",
        );
    }
    if lower.contains("duplicate") {
        let cut = message.find(", set ").unwrap_or(message.len());
        return (
            "duplicate-key",
            format!("invalid YAML: {}", &message[..cut]),
            "each key may appear once in a mapping; remove one of them",
        );
    }
    (
        "yaml-syntax",
        format!("invalid YAML: {message}"),
        "check the indentation and quoting of this line and the one before it",
    )
}

/// Drops a trailing "at line X column Y" from a parser message: the diagnostic shows it.
fn strip_location(message: &str) -> String {
    let message = message.trim();
    let cut = message.find(" at line ").unwrap_or(message.len());
    message[..cut].trim_end_matches(['.', ',', ':']).to_owned()
}

/// A node read straight from the YAML parser, before positions are converted.
struct RawNode(RawValue);

enum RawValue {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Spanned<RawNode>>),
    Map(Vec<(Spanned<RawKey>, Spanned<RawNode>)>),
}

struct RawKey(String);

fn location_pos(loc: &serde_saphyr::Location, source: SourceId) -> Pos {
    let span = loc.span();
    Pos {
        source,
        line: saturate(usize::try_from(loc.line()).unwrap_or(0)),
        col: saturate(usize::try_from(loc.column()).unwrap_or(0)),
        byte: saturate(usize::try_from(span.byte_offset().unwrap_or(0)).unwrap_or(0)),
        len: saturate(usize::try_from(span.byte_len().unwrap_or(0)).unwrap_or(0)),
    }
}

fn spanned_into_node(spanned: Spanned<RawNode>, source: SourceId) -> Node {
    let pos = location_pos(&spanned.referenced, source);
    let value = match spanned.value.0 {
        RawValue::Null => Value::Null,
        RawValue::Bool(b) => Value::Bool(b),
        RawValue::Int(i) => Value::Int(i),
        RawValue::Float(f) => Value::Float(f),
        RawValue::Str(s) => Value::Str(s),
        RawValue::Seq(items) => {
            Value::Seq(items.into_iter().map(|n| spanned_into_node(n, source)).collect())
        }
        RawValue::Map(entries) => Value::Map(
            entries
                .into_iter()
                .map(|(k, v)| {
                    let key = Key { pos: location_pos(&k.referenced, source), name: k.value.0 };
                    (key, spanned_into_node(v, source))
                })
                .collect(),
        ),
    };
    Node { value, pos }
}

impl<'de> Deserialize<'de> for RawNode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(RawNodeVisitor)
    }
}

struct RawNodeVisitor;

impl<'de> Visitor<'de> for RawNodeVisitor {
    type Value = RawNode;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_unit<E>(self) -> Result<RawNode, E> {
        Ok(RawNode(RawValue::Null))
    }
    fn visit_none<E>(self) -> Result<RawNode, E> {
        Ok(RawNode(RawValue::Null))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<RawNode, D::Error> {
        RawNode::deserialize(d)
    }
    fn visit_bool<E>(self, v: bool) -> Result<RawNode, E> {
        Ok(RawNode(RawValue::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<RawNode, E> {
        Ok(RawNode(RawValue::Int(v)))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<RawNode, E> {
        #[allow(clippy::cast_precision_loss)]
        Ok(RawNode(i64::try_from(v).map_or(RawValue::Float(v as f64), RawValue::Int)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<RawNode, E> {
        #[allow(clippy::cast_precision_loss)]
        Ok(RawNode(i64::try_from(v).map_or(RawValue::Float(v as f64), RawValue::Int)))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<RawNode, E> {
        #[allow(clippy::cast_precision_loss)]
        Ok(RawNode(i64::try_from(v).map_or(RawValue::Float(v as f64), RawValue::Int)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<RawNode, E> {
        Ok(RawNode(RawValue::Float(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<RawNode, E> {
        Ok(RawNode(RawValue::Str(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> Result<RawNode, E> {
        Ok(RawNode(RawValue::Str(v)))
    }
    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<RawNode, E> {
        Err(E::custom("binary values are not supported in scenarios"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawNode, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<RawNode>>()? {
            items.push(item);
        }
        Ok(RawNode(RawValue::Seq(items)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawNode, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<RawKey>>()? {
            let value = map.next_value::<Spanned<RawNode>>()?;
            entries.push((key, value));
        }
        Ok(RawNode(RawValue::Map(entries)))
    }
}

impl<'de> Deserialize<'de> for RawKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(RawKeyVisitor)
    }
}

struct RawKeyVisitor;

impl Visitor<'_> for RawKeyVisitor {
    type Value = RawKey;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a plain mapping key")
    }
    fn visit_str<E>(self, v: &str) -> Result<RawKey, E> {
        Ok(RawKey(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<RawKey, E> {
        Ok(RawKey(v))
    }
    fn visit_bool<E>(self, v: bool) -> Result<RawKey, E> {
        Ok(RawKey(v.to_string()))
    }
    fn visit_i64<E>(self, v: i64) -> Result<RawKey, E> {
        Ok(RawKey(v.to_string()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<RawKey, E> {
        Ok(RawKey(v.to_string()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<RawKey, E> {
        Ok(RawKey(v.to_string()))
    }
    fn visit_unit<E>(self) -> Result<RawKey, E> {
        Ok(RawKey("null".to_owned()))
    }
}
